"""DataLoader workers: started without inheriting the training process's threads, gone with their rank (CPU)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from distsplat_ns.data.reader import TrainBatchReader
from distsplat_ns.data.stream import ImageBatchStream
from tests.helpers.data_fixtures import START_LOCK, lock_checking_loader, stress_rank, write_nerfstudio_scene
from tests.helpers.multiproc import run_ranks

REPO = Path(__file__).resolve().parents[2]
NUM_LAUNCHES = 20


def test_workers_do_not_inherit_a_lock_held_by_another_thread(jpeg_paths: list[Path]) -> None:
    # A forked child copies every lock in the state it had at fork; one held by another thread
    # (gloo, tensorboard, the store's fill thread) stays held forever in the child.
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with START_LOCK:
            held.set()
            release.wait(60)

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    held.wait(10)
    try:
        reader = TrainBatchReader(ImageBatchStream(lock_checking_loader(jpeg_paths), 4, seed=0), 2, 2)
        try:
            batch = reader.next_batch(0)
        finally:
            reader.close()
    finally:
        release.set()
        holder.join(10)
    assert len(batch.images) == 4


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_workers_exit_within_2s_when_their_process_is_killed(jpeg_paths: list[Path]) -> None:
    code = (
        "import sys, json; from pathlib import Path\n"
        "from tests.helpers.data_fixtures import hold_stream_workers\n"
        "hold_stream_workers([Path(p) for p in json.loads(sys.argv[1])], num_workers=2)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, json.dumps([str(p) for p in jpeg_paths])],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
    )
    workers: list[int] = []
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready, "the child did not start its workers within 120 s"
        workers = json.loads(proc.stdout.readline())  # type: ignore[union-attr]
        assert len(workers) == 2 and not any(_gone(pid) for pid in workers)
        proc.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        while not all(_gone(pid) for pid in workers) and time.monotonic() - killed_at < 10:
            time.sleep(0.02)
        elapsed = time.monotonic() - killed_at
        # The requirement: a killed rank's workers are gone within 2 s (measured: 0.26-0.43 s on a loaded machine).
        assert all(_gone(pid) for pid in workers) and elapsed < 2.0, f"workers alive {elapsed:.2f} s after SIGKILL"
    finally:
        proc.kill()
        proc.wait(10)
        for pid in workers:  # never leave them behind, whatever the outcome
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.long
def test_two_rank_start_up_never_hangs(tmp_path: Path) -> None:
    # The datamanager on 2 gloo ranks with a tensorboard writer, NUM_LAUNCHES fresh launches: the
    # path of training's start-up (threads exist, then the workers start) without the model.
    scene = write_nerfstudio_scene(tmp_path / "scene", num_frames=8)
    for launch in range(NUM_LAUNCHES):
        # run_ranks fails a launch that does not finish within 2 x timeout_s.
        ranks = run_ranks(stress_rank, 2, str(scene), 3, timeout_s=60.0)
        assert ranks[0] == ranks[1], f"launch {launch}: the ranks disagree"
        rank0_ids, rank1_ids = ranks[0]
        assert [len(a) + len(b) for a, b in zip(rank0_ids, rank1_ids, strict=False)] == [4, 4, 4]


# A main script that records each process running its top level (as ns-train's script imports all
# of nerfstudio there), then takes one batch from 2 forkserver workers.
MAIN_SCRIPT = """import os, sys
with open(sys.argv[1], "a") as marker:
    marker.write(f"{os.getpid()}\\n")
if __name__ == "__main__":
    import json
    from pathlib import Path
    from distsplat_ns.data.reader import TrainBatchReader
    from distsplat_ns.data.stream import ImageBatchStream
    from tests.helpers.data_fixtures import make_loader
    reader = TrainBatchReader(ImageBatchStream(make_loader([Path(p) for p in json.loads(sys.argv[2])]), 4, seed=0), 2, 2)
    assert len(reader.next_batch(0).images) == 4
    reader.close()
"""


def test_forkserver_workers_do_not_rerun_the_main_script(tmp_path: Path, jpeg_paths: list[Path]) -> None:
    # Under ns-train a re-run imported nerfstudio's whole CLI in every worker at every start (seconds each).
    script, marker = tmp_path / "main.py", tmp_path / "ran.txt"
    script.write_text(MAIN_SCRIPT)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(
        [sys.executable, str(script), str(marker), json.dumps([str(p) for p in jpeg_paths])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(marker.read_text().split()) == 1, (
        f"the main script ran in processes {marker.read_text().split()} (only the parent should)"
    )
