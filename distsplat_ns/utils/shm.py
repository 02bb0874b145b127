"""Named POSIX semaphores left in ``/dev/shm`` by ranks that were SIGKILLed.

joblib (imported through scikit-learn, which splatfacto's ``k_nearest_sklearn`` uses for the
initial scales) renames every multiprocessing semaphore of the process ``/loky-<pid>-<random>``
(``joblib/externals/loky/backend/__init__.py`` replaces ``SemLock._make_name``). Semaphores made
for spawn/forkserver children (DataLoader queues) are named, and only multiprocessing's exit
handler or its resource tracker unlinks them; a rank SIGKILLed with its process group (torchrun's
teardown, a scheduler) takes the tracker with it and leaves them (14 per rank; tests/unit/test_orphan_semaphores.py). The pid
in the name says whose they were: :func:`remove_orphan_semaphores` unlinks those whose process is
gone.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_SHM = Path("/dev/shm")
_LOKY_SEMAPHORE = re.compile(r"^sem\.loky-(\d+)-")


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process. A zombie is not: a SIGKILLed rank stays one until
    torchrun reaps it, which may come after the surviving rank's clean-up."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no procfs (or it just ended): the signal said it exists
        return True
    return stat[stat.rfind(")") + 2 :][:1] != "Z"  # the state field follows the command name's ')'


def remove_orphan_semaphores(shm: Path = _SHM) -> int:
    """Unlink ``sem.loky-<pid>-*`` files whose process no longer exists (this pid namespace's view:
    a pid that is alive, or reused, keeps its files). Returns how many were removed."""
    removed = 0
    try:
        entries = list(shm.iterdir())
    except OSError:
        return 0
    for entry in entries:
        match = _LOKY_SEMAPHORE.match(entry.name)
        if match and not _alive(int(match.group(1))):
            try:
                entry.unlink()
                removed += 1
            except OSError:
                pass
    return removed
