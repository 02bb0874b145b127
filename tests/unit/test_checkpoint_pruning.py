"""--save-only-latest-checkpoint deletes only older steps, and only after the newer file is durable."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from distsplat_ns import checkpoint
from distsplat_ns.checkpoint import (
    load_checkpoint_file,
    probe_writable,
    save_checkpoint_atomic,
)

NO_OPTIMIZERS = SimpleNamespace(optimizers={}, schedulers={})


def _save(directory: Path, step: int, keep_only_latest: bool = True) -> Path:
    return save_checkpoint_atomic(
        directory, step, {"w": torch.full((2,), float(step))}, NO_OPTIMIZERS, {}, {}, keep_only_latest=keep_only_latest
    )


def test_saving_an_older_step_deletes_nothing(tmp_path: Path) -> None:
    _save(tmp_path, 39)
    _save(tmp_path, 0)
    assert sorted(p.name for p in tmp_path.glob("step-*.ckpt")) == ["step-000000000.ckpt", "step-000000039.ckpt"]
    assert load_checkpoint_file(tmp_path / "step-000000039.ckpt")["step"] == 39


def test_saving_a_newer_step_deletes_the_older_ones(tmp_path: Path) -> None:
    _save(tmp_path, 10)
    _save(tmp_path, 20)
    assert [p.name for p in tmp_path.glob("step-*.ckpt")] == ["step-000000020.ckpt"]


def test_older_checkpoint_is_deleted_only_after_file_and_folder_are_fsynced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save(tmp_path, 10)
    events: list[str] = []
    real_fsync, real_unlink = os.fsync, Path.unlink

    def fsync(fd: int) -> None:
        events.append("fsync dir" if os.path.isdir(os.readlink(f"/proc/self/fd/{fd}")) else "fsync file")
        real_fsync(fd)

    def unlink(self: Path, missing_ok: bool = False) -> None:
        events.append(f"unlink {self.name}")
        real_unlink(self, missing_ok=missing_ok)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(Path, "unlink", unlink)
    _save(tmp_path, 20)
    deletion = events.index("unlink step-000000010.ckpt")
    assert "fsync file" in events[:deletion] and "fsync dir" in events[:deletion], events


def test_probe_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "run" / "nerfstudio_models"
    probe_writable(target)
    assert list(tmp_path.iterdir()) == []


def test_probe_names_a_checkpoint_folder_that_cannot_be_created(tmp_path: Path) -> None:
    (tmp_path / "nerfstudio_models").write_text("a file where the folder should be")
    with pytest.raises(OSError) as info:
        probe_writable(tmp_path / "nerfstudio_models")
    assert "nerfstudio_models" in str(info.value)
