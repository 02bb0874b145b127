"""One run, several launches: which checkpoint a launch resumes from, and the record of every attempt.

A torchrun restart (``TORCHELASTIC_RESTART_COUNT > 0``) or a user's re-run of the same command
resumes from the run folder's latest complete checkpoint, so no launch writes a step at or below one
an earlier attempt left (:func:`choose_checkpoint`). Rank 0 records every attempt in
``distsplat_attempts.json`` (:class:`AttemptLog`); a killed attempt is marked "ended without a
record" by the next. Pure file and environment logic: no collective here (docs/distributed.md,
"Faults", Restarts).
"""

from __future__ import annotations

import datetime
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distsplat_ns.utils.errors import UserError

ATTEMPTS_FILENAME = "distsplat_attempts.json"
#: A checkpoint's final name (``checkpoint.py`` writes under a temporary name first, then renames):
#: nerfstudio's single file ``.ckpt``, or a sharded run's DCP folder ``.dcp`` (every rank's part).
_CHECKPOINT_NAME = re.compile(r"^step-(\d{9})\.(ckpt|dcp)$")
#: The file DCP writes last into a ``.dcp`` folder (its metadata): the folder is complete with it.
DCP_METADATA_FILE = ".metadata"
#: The cause written for an attempt that never recorded its end.
UNRECORDED_END = "ended without a record (killed, or its host lost)"


def restart_count() -> int:
    """torchrun's restart count of this launch's workers (0 on the first attempt or without torchrun)."""
    value = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    try:
        return int(value) if value else 0
    except ValueError as err:
        raise UserError(f"environment variable TORCHELASTIC_RESTART_COUNT must be an integer, got {value!r}") from err


def elastic_run_id() -> str | None:
    """torchrun's ``--rdzv-id`` (the same in every restart of one torchrun job), or None."""
    return os.environ.get("TORCHELASTIC_RUN_ID") or None


def is_complete_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a complete checkpoint of either format: a non-empty final-named file,
    or a final-named folder holding DCP's metadata."""
    path = Path(path)
    match = _CHECKPOINT_NAME.match(path.name)
    if match is None:
        return False
    if match.group(2) == "dcp":
        return path.is_dir() and (path / DCP_METADATA_FILE).is_file()
    return path.is_file() and path.stat().st_size > 0


def checkpoint_steps(folder: Path) -> list[int]:
    """Steps of the complete checkpoints in ``folder``, of both formats, ascending."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted({int(_CHECKPOINT_NAME.match(p.name).group(1)) for p in folder.iterdir() if is_complete_checkpoint(p)})


def checkpoint_path(folder: Path, step: int) -> Path:
    """Step ``step``'s checkpoint in ``folder``: its DCP folder where one is complete (it holds the
    Adam state; a ``.ckpt`` beside it is its params-only consolidation), else the single file."""
    sharded = Path(folder) / f"step-{step:09d}.dcp"
    return sharded if is_complete_checkpoint(sharded) else Path(folder) / f"step-{step:09d}.ckpt"


def _same_folder(a: Path, b: Path) -> bool:
    return os.path.abspath(a) == os.path.abspath(b)


@dataclass(frozen=True)
class ResumeChoice:
    """The checkpoint a launch loads (None: train from scratch) and one line saying why."""

    path: Path | None
    reason: str


def choose_checkpoint(
    run_checkpoint_dir: Path,
    load_dir: Path | None,
    load_step: int | None,
    load_checkpoint: Path | None,
    existing: str,
    restarts: int,
) -> ResumeChoice:
    """Decide what this launch resumes from.

    Args:
        run_checkpoint_dir: This run's own checkpoint folder (``<run folder>/nerfstudio_models``).
        load_dir, load_step, load_checkpoint: nerfstudio's ``--load-dir``, ``--load-step``,
            ``--load-checkpoint`` (None when not given). ``--load-dir`` naming the run's own
            folder before it exists is accepted: the first attempt of a run that is meant to be
            restarted trains from scratch.
        existing: ``--existing-checkpoints``: "resume" or "refuse" (a fresh launch into a run
            folder that already holds checkpoints, without a ``--load-*`` flag).
        restarts: :func:`restart_count`; a torchrun restart always resumes the run's latest.

    Returns:
        The choice; its path exists.

    Raises:
        UserError: a ``--load-*`` flag names something absent; the run folder holds checkpoints and
            ``existing`` is "refuse"; or the explicit checkpoint is older than one already in the
            run folder (training from it would write over the later steps), outside a restart.
    """
    own = checkpoint_steps(run_checkpoint_dir)
    latest = checkpoint_path(run_checkpoint_dir, own[-1]) if own else None
    if restarts > 0 and latest is not None:
        return ResumeChoice(latest, f"torchrun restart {restarts}: resuming from the run's latest checkpoint {latest}")
    explicit = _explicit_checkpoint(run_checkpoint_dir, load_dir, load_step, load_checkpoint)
    if explicit is None:
        if latest is None:
            return ResumeChoice(None, "no checkpoint to load, so training from scratch")
        if existing == "refuse":
            raise UserError(
                f"the run folder {Path(run_checkpoint_dir).parent} already holds checkpoints up to step {own[-1]}: "
                "--existing-checkpoints resume continues from the latest, or choose another --timestamp"
            )
        return ResumeChoice(latest, f"the run folder already holds checkpoints: resuming from the latest, {latest}")
    match = _CHECKPOINT_NAME.match(explicit.name)
    if latest is not None and match and int(match.group(1)) < own[-1] and not _same_folder(explicit, latest):
        raise UserError(
            f"{explicit} is older than step {own[-1]} already in {run_checkpoint_dir}: training from it would write "
            "over that run's later checkpoints; resume from the latest (no --load-step) or choose another --timestamp"
        )
    return ResumeChoice(explicit, f"resuming from {explicit}")


def _explicit_checkpoint(
    run_checkpoint_dir: Path, load_dir: Path | None, load_step: int | None, load_checkpoint: Path | None
) -> Path | None:
    if load_dir is not None:
        load_dir = Path(load_dir)
        own_folder = _same_folder(load_dir, run_checkpoint_dir)
        if own_folder and not checkpoint_steps(load_dir) and load_step is None:
            return None  # the run's own folder, not written yet: the first attempt of the run
        if not load_dir.is_dir():
            raise UserError(f"--load-dir {load_dir} is not a directory")
        if load_step is not None:
            path = checkpoint_path(load_dir, load_step)
            if not path.exists():
                raise UserError(f"checkpoint {path} does not exist (--load-dir/--load-step)")
            return path
        steps = checkpoint_steps(load_dir)
        if not steps:
            raise UserError(f"--load-dir {load_dir} holds no complete step-*.ckpt / step-*.dcp checkpoint")
        return checkpoint_path(load_dir, steps[-1])
    if load_checkpoint is not None:
        path = Path(load_checkpoint)
        if not path.exists():
            raise UserError(f"--load-checkpoint {path} does not exist")
        return path
    return None


def previous_timestamp(method_dir: Path, run_id: str | None) -> str | None:
    """The run folder name an earlier attempt of this torchrun job used, found by its run id in
    the folders' attempt logs (a restart keeps ``--rdzv-id`` but ns-train stamps a new timestamp
    unless ``--timestamp`` was given)."""
    if run_id is None or not Path(method_dir).is_dir():
        return None
    found = []
    for log in Path(method_dir).glob(f"*/{ATTEMPTS_FILENAME}"):
        try:
            attempts = json.loads(log.read_text())
        except (OSError, ValueError):
            continue
        if any(a.get("run_id") == run_id for a in attempts if isinstance(a, dict)):
            found.append((log.stat().st_mtime, log.parent.name))
    return max(found)[1] if found else None


class AttemptLog:
    """Rank 0's record of every attempt of a run, ``<run folder>/distsplat_attempts.json``.

    Written atomically (temporary file, then rename) when an attempt begins, after each checkpoint
    and when it ends; other ranks hold an empty log and write nothing.
    """

    def __init__(self, run_dir: Path, enabled: bool) -> None:
        self.path = Path(run_dir) / ATTEMPTS_FILENAME
        self.enabled = enabled
        self.attempts: list[dict[str, Any]] = []

    def begin(self, start_step: int, world_size: int) -> None:
        """Start this launch's record; an earlier attempt still marked running ended unrecorded."""
        if not self.enabled:
            return
        try:
            self.attempts = json.loads(self.path.read_text()) if self.path.exists() else []
        except (OSError, ValueError):
            self.attempts = []
        for attempt in self.attempts:
            if attempt.get("cause") == "running":
                attempt["cause"] = UNRECORDED_END
                attempt["end_step"] = attempt.get("last_saved_step")
        self.attempts.append(
            {
                "attempt": len(self.attempts),
                "restart_count": restart_count(),
                "run_id": elastic_run_id(),
                "world_size": world_size,
                "start_step": start_step,
                "last_saved_step": None,
                "end_step": None,
                "cause": "running",
                "started_at": _now(),
            }
        )
        self._write()

    def saved(self, step: int) -> None:
        if self.enabled and self.attempts:
            self.attempts[-1]["last_saved_step"] = step
            self._write()

    def end(self, end_step: int | None, cause: str) -> None:
        """Record how this attempt ended (once: a later call does nothing)."""
        if not (self.enabled and self.attempts) or self.attempts[-1]["cause"] != "running":
            return
        self.attempts[-1].update(end_step=end_step, cause=cause, ended_at=_now())
        try:
            self._write()
        except OSError:  # the failure being recorded may be the disk itself
            pass

    def _write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(self.attempts, indent=2))
        os.replace(tmp, self.path)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
