"""ns-train distsplat's lifecycle on one process: resume with nothing left, SIGINT/SIGTERM, early checks."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest

from distsplat_ns.checkpoint import load_checkpoint_file
from tests.helpers.lifecycle import kill_session, start_training, wait_until_training
from tests.helpers.ns_train_patched import patched_ns_train
from tests.helpers.nsrun import cpu_env, ns_bin, run_dir, run_ns_train, train_args

pytestmark = [pytest.mark.slow, pytest.mark.long]

SHORT = ["--steps-per-eval-all-images", "1000", "--save-only-latest-checkpoint", "True"]


def _snapshot(folder: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_resume_with_nothing_left_to_train_exits_0_and_leaves_the_checkpoints(tmp_path: Path) -> None:
    run_ns_train(tmp_path, "done", 4, extra=SHORT)
    models = run_dir(tmp_path, "done") / "nerfstudio_models"
    before = _snapshot(models)
    assert list(before) == ["step-000000003.ckpt"]
    # Resumed in place, as a user re-running the same command would.
    proc = run_ns_train(tmp_path, "done", 4, extra=[*SHORT, "--load-dir", str(models)], check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Nothing left to train" in proc.stdout
    assert _snapshot(models) == before


def _stop(tmp_path: Path, sig: signal.Signals, nproc: int) -> tuple[subprocess.Popen, str]:
    proc = start_training(tmp_path, "stop", nproc, extra=["--steps-per-save", "5"])
    try:
        wait_until_training(proc, tmp_path, "stop")
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=180)
    finally:
        kill_session(proc)
    return proc, output


def assert_stopped_with_its_checkpoint(tmp_path: Path, output: str) -> None:
    """The run reports the step it stopped after, and that step's checkpoint -- the only one
    (latest-only) -- loads."""
    marker = "distsplat stopped after step "
    assert marker in output, output[-4000:]
    step = int(output.split(marker)[1].split(":")[0])
    found = sorted((run_dir(tmp_path, "stop") / "nerfstudio_models").glob("*"))
    assert [p.name for p in found] == [f"step-{step:09d}.ckpt"], (found, output[-3000:])
    assert load_checkpoint_file(found[0])["step"] == step


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_after_a_step_and_keeps_its_checkpoint(tmp_path: Path, sig: signal.Signals) -> None:
    proc, output = _stop(tmp_path, sig, 1)
    assert proc.returncode == 128 + sig, output[-3000:]
    assert_stopped_with_its_checkpoint(tmp_path, output)
    assert "Traceback" not in output


def test_unwritable_checkpoint_folder_fails_before_the_first_step(tmp_path: Path) -> None:
    run = run_dir(tmp_path, "ro")
    run.mkdir(parents=True)
    (run / "nerfstudio_models").write_text("a file where the checkpoint folder should be")
    proc = run_ns_train(tmp_path, "ro", 4, extra=SHORT, check=False)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert f"{run / 'nerfstudio_models'}" in text and "Traceback" not in text, text[-3000:]
    assert not list(run.glob("events.out.tfevents.*")), "training started before the output folder was checked"


def test_missing_data_leaves_no_run_folder(tmp_path: Path) -> None:
    proc = run_ns_train(
        tmp_path,
        "nodata",
        4,
        check=False,
        data_args=["colmap", "--data", str(tmp_path / "nope"), "--colmap-path", "sparse/0", "--downscale-factor", "1"],
    )
    assert proc.returncode != 0
    assert not run_dir(tmp_path, "nodata").exists()


def test_internal_error_mid_training_ends_the_process_with_its_traceback(tmp_path: Path) -> None:
    # The DataLoader workers ignore SIGTERM; the failed run's iterator is still referenced at exit,
    # and multiprocessing's exit handler waited for them for ever (data/stream.py:_kill_workers_at_exit).
    cmd = [
        ns_bin("python"),
        *patched_ns_train("fault=3,0"),
        *train_args(tmp_path, "boom", 20, extra=[*SHORT, "--pipeline.datamanager.num-workers", "2"]),
    ]
    env = dict(cpu_env(), DISTSPLAT_TEST_FAULT="raise")
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=300, env=env, stdin=subprocess.DEVNULL, check=False
        )
    except subprocess.TimeoutExpired as err:
        pytest.fail(f"the failed run did not exit within 300 s: {err}")
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "RuntimeError: injected internal error at step 3" in proc.stderr, proc.stderr[-3000:]  # traceback kept
