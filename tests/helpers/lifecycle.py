"""Start ns-train (1 process or torchrun) in the background and wait until it trains."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.helpers.nsrun import cpu_env, ns_bin, run_dir, train_args

#: Lifecycle runs are long (stopped by the test) and never evaluate or save on their own.
LONG_RUN_EXTRA = [
    "--steps-per-eval-all-images",
    "100000",
    "--steps-per-eval-image",
    "100000",
    "--steps-per-save",
    "100000",
    "--save-only-latest-checkpoint",
    "True",
]


def start_training(
    out: Path, timestamp: str, nproc: int, extra: Sequence[str] = (), num_images: int = 100000
) -> subprocess.Popen:
    """``ns-train`` (``nproc == 1``) or ``torchrun --nproc_per_node nproc ns-train``, in its own session."""
    env = cpu_env()
    args = train_args(out, timestamp, num_images, [*LONG_RUN_EXTRA, *extra])
    if nproc == 1:
        cmd = [ns_bin("ns-train"), *args]
    else:
        env["OMP_NUM_THREADS"] = "1"
        cmd = [ns_bin("torchrun"), "--nproc_per_node", str(nproc), ns_bin("ns-train"), *args]
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )


def wait_until_training(
    proc: subprocess.Popen, out: Path, timestamp: str, timeout_s: float = 300.0, settle_s: float = 20.0
) -> None:
    """Return once the run writes its tensorboard events (set up right before the first step) and
    ``settle_s`` more seconds passed, so a few steps ran."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ns-train exited early ({proc.returncode}):\n{proc.stdout.read()[-5000:]}")
        if list(run_dir(out, timestamp).glob("events.out.tfevents.*")):
            time.sleep(settle_s)
            return
        time.sleep(0.5)
    raise AssertionError("training never started")


def kill_session(proc: subprocess.Popen) -> None:
    """Clean-up: SIGKILL whatever is left of the run's session."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=30)
