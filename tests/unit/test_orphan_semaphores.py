"""Semaphores of SIGKILLed ranks are removed from /dev/shm (utils/shm.py); live processes' stay."""

from __future__ import annotations

import os
import subprocess
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
