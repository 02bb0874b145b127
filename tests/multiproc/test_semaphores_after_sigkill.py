"""A rank SIGKILLed with its whole process group (its resource tracker too) leaves no named
semaphores in /dev/shm once the run has ended: the surviving rank removes them (utils/shm.py)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.lifecycle import kill_session, start_training, wait_until_training

pytestmark = [pytest.mark.slow, pytest.mark.long]


def _semaphores_of(pid: int) -> list:
    return sorted(p.name for p in Path("/dev/shm").glob(f"sem.loky-{pid}-*"))


def test_sigkilled_rank_leaves_no_semaphores(tmp_path: Path) -> None:
    if not Path("/dev/shm").is_dir():
        pytest.skip("no /dev/shm on this system")
    proc = start_training(tmp_path, "sem", 2)
    try:
        wait_until_training(proc, tmp_path, "sem", settle_s=3.0)
        ranks = [c for c in psutil.Process(proc.pid).children() if "RANK" in c.environ()]
        victim = next(c for c in ranks if c.environ().get("RANK") == "1")
        assert _semaphores_of(victim.pid), "the rank holds no loky-named semaphores: nothing to test"
        for process in [*victim.children(recursive=True), victim]:  # its resource tracker, fork server, workers, itself
            try:
                process.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        proc.communicate(timeout=180)
    finally:
        kill_session(proc)
    time.sleep(1.0)
    assert _semaphores_of(victim.pid) == []
