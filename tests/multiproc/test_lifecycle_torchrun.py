"""ns-train distsplat's lifecycle on 2 CPU processes under torchrun: resume with nothing left,
SIGINT/SIGTERM, a killed launcher, a checkpoint that cannot be written."""

from __future__ import annotations

import signal
from pathlib import Path

import psutil
import pytest

from tests.helpers.lifecycle import kill_session, start_training, wait_until_training
from tests.helpers.nsrun import run_dir, run_torchrun
from tests.integration.test_lifecycle import (
    SHORT,
    _snapshot,
    _stop,
    assert_stopped_with_its_checkpoint,
)

pytestmark = [pytest.mark.slow, pytest.mark.long]


def test_resume_with_nothing_left_to_train_exits_0_and_leaves_the_checkpoints(tmp_path: Path) -> None:
    run_torchrun(tmp_path, "done", 4, 2, extra=SHORT)
    models = run_dir(tmp_path, "done") / "nerfstudio_models"
    before = _snapshot(models)
    assert list(before) == ["step-000000003.ckpt"]
    proc = run_torchrun(tmp_path, "done", 4, 2, extra=[*SHORT, "--load-dir", str(models)], check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Nothing left to train" in proc.stdout
    assert _snapshot(models) == before


# torchrun signals each rank's whole process group, fork server and DataLoader workers included:
# they ignore it (data/worker_server.py, data/stream.py) and end with their rank.
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_torchrun_stops_both_ranks_after_the_same_step(tmp_path: Path, sig: signal.Signals) -> None:
    # torchrun forwards the signal to each rank's process group (Ctrl-C reaches only torchrun:
    # it starts every rank in a session of its own) and exits 1 once the ranks are gone.
    proc, output = _stop(tmp_path, sig, 2)
    assert proc.returncode == 1, output[-3000:]
    assert_stopped_with_its_checkpoint(tmp_path, output)
    assert "[rank0]: Traceback" not in output and "[rank1]: Traceback" not in output, output[-4000:]


def _ranks(root: psutil.Process) -> list[psutil.Process]:
    found = []
    for child in root.children(recursive=True):
        try:
            if child.ppid() == root.pid and "RANK" in child.environ():
                found.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


def test_ranks_exit_when_torchrun_is_killed(tmp_path: Path) -> None:
    proc = start_training(tmp_path, "orphan", 2)
    ranks: list[psutil.Process] = []
    try:
        wait_until_training(proc, tmp_path, "orphan", settle_s=5.0)
        ranks = _ranks(psutil.Process(proc.pid))
        assert len(ranks) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        # The kernel sends SIGTERM to each rank: it finishes its step (about a second here) and
        # saves it. 30 s: a loaded 2-core machine; the ranks never stop without the signal.
        _, alive = psutil.wait_procs(ranks, timeout=30)
        assert not alive, f"ranks still running after their launcher died: {alive}"
    finally:
        for rank in ranks:  # orphans are no longer our children: kill them by pid
            try:
                rank.kill()
            except psutil.Error:
                pass
        kill_session(proc)


def test_checkpoint_that_cannot_be_written_is_one_clear_error_on_every_rank(tmp_path: Path) -> None:
    proc = start_training(tmp_path, "full", 2, extra=["--steps-per-save", "5"])
    try:
        wait_until_training(proc, tmp_path, "full", settle_s=0.0)
        models = run_dir(tmp_path, "full") / "nerfstudio_models"
        # Stands for a disk that filled up or went read-only after the start: the folder cannot be written.
        for ckpt in models.glob("*"):
            ckpt.unlink()
        if models.exists():
            models.rmdir()
        models.write_text("not a folder")
        output, _ = proc.communicate(timeout=300)
    finally:
        kill_session(proc)
    assert proc.returncode != 0
    assert "writing checkpoint step-" in output and str(models) in output, output[-4000:]
    assert output.count("distsplat error") == 1, output[-4000:]
    ranks_output = output.split("torch/distributed/elastic")[0]  # torchrun's own report follows
    assert "Traceback" not in ranks_output, output[-4000:]
    # Before: rank 0's traceback, then rank 1 failing in the barrier with a gloo transport error.
    assert "gloo/transport" not in output and "Connection closed" not in output, output[-4000:]
