"""Semaphores of SIGKILLed ranks are removed from /dev/shm (utils/shm.py); live processes' stay."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from distsplat_ns.utils.shm import remove_orphan_semaphores


def test_removes_only_the_semaphores_of_processes_that_are_gone(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"sem.loky-{dead.pid}-abc").write_bytes(b"")
    (tmp_path / f"sem.loky-{os.getpid()}-def").write_bytes(b"")
    (tmp_path / "sem.mp-xyz").write_bytes(b"")
    assert remove_orphan_semaphores(tmp_path) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"sem.loky-{os.getpid()}-def", "sem.mp-xyz"]


def test_a_killed_process_not_yet_reaped_counts_as_gone(tmp_path: Path) -> None:
    """A SIGKILLed rank is a zombie until torchrun waits for it; its files must go all the same."""
    zombie = subprocess.Popen(["sleep", "60"])
    zombie.kill()
    deadline = time.time() + 10
    while _state(zombie.pid) != "Z" and time.time() < deadline:
        time.sleep(0.01)
    assert _state(zombie.pid) == "Z", "the child never became a zombie: nothing to test"
    (tmp_path / f"sem.loky-{zombie.pid}-abc").write_bytes(b"")
    try:
        assert remove_orphan_semaphores(tmp_path) == 1
    finally:
        zombie.wait()


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2 :][:1]
