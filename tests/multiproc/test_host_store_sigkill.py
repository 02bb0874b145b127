"""SIGKILL and the host store (issue 27): killing the rank that fills the host's store, mid-fill,
or any other rank leaves no segment, file or semaphore behind, and a rank that outlives the filler
still reads every file exactly (entries not filled come from their files)."""

from __future__ import annotations

import json
import os
import queue as queue_module
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as mp

from tests.helpers import host_store_fns
from tests.helpers.data_fixtures import write_images
from tests.helpers.multiproc import _worker, free_port

NUM_FILES = 40


def _abstract_sockets_of(pids: set[int]) -> list[str]:
    names = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 8 and fields[7].startswith("@distsplat-") and any(f"-{pid}-" in fields[7] for pid in pids):
            names.append(fields[7])
    return names


def _holders_of(inode: int) -> list[int]:
    """Processes on this machine holding or mapping a distsplat store memfd with ``inode``."""
    holders = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and inode in host_store_fns.memfd_inodes(entry.name):
            holders.append(int(entry.name))
    return holders


def _shm_entries_of(pids: set[int]) -> list[str]:
    try:
        names = [p.name for p in Path("/dev/shm").iterdir()]
    except OSError:
        return []
    return [n for n in names if "distsplat" in n or any(f"-{pid}-" in n for pid in pids)]


def _rank_errors(queue: Any) -> list[str]:
    """What the ranks put on ``queue`` so far (a rank that raised puts its traceback there)."""
    said = []
    while True:
        try:
            said.append(str(queue.get(timeout=1.0)))
        except queue_module.Empty:
            return said


@pytest.mark.parametrize("victim", ["filler", "other"])
def test_sigkilled_rank_leaves_nothing_behind_and_the_others_read_on(tmp_path: Path, victim: str) -> None:
    paths = [str(p) for p in write_images(tmp_path / "images", [(64, 96)] * NUM_FILES, seed=5)]
    report = str(tmp_path / "report")
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, 3, port, host_store_fns.slow_fill_rank, (paths, report, 0.1), queue, 60.0),
            kwargs={"device_type": "cpu", "backend": "auto", "environ": dict(os.environ)},
        )
        for r in range(3)
    ]
    for p in procs:
        p.start()
    pids = {p.pid for p in procs}
    try:
        deadline = time.time() + 120
        while time.time() < deadline and not all(Path(f"{report}.{r}").exists() for r in range(3)):
            time.sleep(0.1)
        reports = [json.loads(Path(f"{report}.{r}").read_text()) for r in range(3)]
        assert [r["is_filler"] for r in reports] == [True, False, False]
        (inode,) = set(reports[0]["inodes"])
        assert all(r["inodes"] == [inode] for r in reports)
        killed = 0 if victim == "filler" else 1
        os.kill(procs[killed].pid, signal.SIGKILL)
        if victim == "filler":  # the others see the filler gone, read every entry exactly, and exit
            for r in (1, 2):
                while time.time() < deadline and not Path(f"{report}.{r}.done").exists():
                    time.sleep(0.1)
                if not Path(f"{report}.{r}.done").exists():
                    pytest.fail(
                        f"rank {r} wrote no report after the filler was killed; the ranks said: {_rank_errors(queue)}"
                    )
                done = json.loads(Path(f"{report}.{r}.done").read_text())
                assert done["exact"] and done["num_filled"] < NUM_FILES, done  # killed mid-fill
        else:
            time.sleep(1.0)
            assert _holders_of(inode), "the other ranks still hold the store"
            for p in procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.join(timeout=30)
        assert not any(p.is_alive() for p in procs)
        time.sleep(0.5)
        assert _holders_of(inode) == [], "a process still holds the store's memfd"
        assert _abstract_sockets_of(pids) == []
        assert _shm_entries_of(pids) == []
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
