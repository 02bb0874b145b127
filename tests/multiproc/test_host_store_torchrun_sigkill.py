"""``torchrun --nproc_per_node 2 ns-train``: SIGKILL of the rank that filled the host's store (rank
0) or of the other rank, with its fork server and workers, ends the run as any rank's death does --
torchrun names the dead rank -- and leaves no store memfd held, no socket and no
semaphore of the dead rank behind (issue 27)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from distsplat_ns.utils.shm import remove_orphan_semaphores
from tests.helpers import host_store_fns
from tests.helpers.lifecycle import kill_session, start_training, wait_until_training

pytestmark = [pytest.mark.slow, pytest.mark.long]


def _store_holders(inode: int) -> list[int]:
    return [
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and inode in host_store_fns.memfd_inodes(p.name)
    ]


@pytest.mark.parametrize("victim_rank", ["0", "1"], ids=["filler", "other"])
def test_sigkilled_rank_ends_the_run_named_and_leaves_no_store_behind(tmp_path: Path, victim_rank: str) -> None:
    proc = start_training(tmp_path, "store", 2, extra=["--collective-timeout-s", "30"])
    try:
        wait_until_training(proc, tmp_path, "store", settle_s=3.0)
        ranks = [c for c in psutil.Process(proc.pid).children() if "RANK" in c.environ()]
        victim = next(c for c in ranks if c.environ().get("RANK") == victim_rank)
        survivor = next(c for c in ranks if c.environ().get("RANK") != victim_rank)
        inodes = host_store_fns.memfd_inodes(victim.pid) | host_store_fns.memfd_inodes(survivor.pid)
        assert len(inodes) == 1, f"the two ranks should map one store memfd, found {inodes}"
        (inode,) = inodes
        everything = [victim, *victim.children(recursive=True), survivor, *survivor.children(recursive=True)]
        for process in [*victim.children(recursive=True), victim]:  # its fork server, workers, resource tracker, itself
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        output, _ = proc.communicate(timeout=180)
    finally:
        kill_session(proc)
    assert proc.returncode != 0
    # As for any rank's death: torchrun names the SIGKILLed rank as the root cause (the survivor
    # fails with "a collective failed ...", or is stopped by torchrun first: rank 0's death).
    root_cause = output[output.index("Root Cause") :]
    assert f"rank      : {victim_rank} (local_rank: {victim_rank})" in root_cause and "(SIGKILL)" in root_cause, (
        root_cause
    )
    time.sleep(1.0)
    assert not [p for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert _store_holders(inode) == []
    unix = Path("/proc/net/unix").read_text()
    assert not any(f"@distsplat-store-{p.pid}-" in unix for p in everything)
    shm = Path("/dev/shm")
    if shm.is_dir():
        assert not list(shm.glob("*distsplat*"))  # the store has no named segment, file or semaphore
        # What the dead rank's DataLoader queues named (loky semaphores, utils/shm.py) is removed by
        # the survivor's stop or failure path -- or, when torchrun ends the survivor first (a race
        # that rank 0's death can lose), by the next start on this host, which this call stands for.
        if victim_rank == "0":
            remove_orphan_semaphores()
        assert not list(shm.glob(f"sem.*-{victim.pid}-*"))
