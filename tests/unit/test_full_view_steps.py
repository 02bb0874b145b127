"""Which steps of a sharded run gather the full view to rank 0 (DistSplatTrainer._needs_full_view):
a pure function of the config and the step, so every rank joins the same gathers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from distsplat_ns.registry import distsplat_trainer_config
from distsplat_ns.trainer import DistSplatTrainer


def _trainer(vis: str, start_step: int = 0, has_eval_images: bool = True) -> DistSplatTrainer:
    trainer = object.__new__(DistSplatTrainer)  # no process group, pipeline or writers: only the step rule
    trainer.config = distsplat_trainer_config()
    trainer.config.vis = vis  # steps_per_eval_image 100, steps_per_eval_all_images 1000
    trainer.pipeline = SimpleNamespace(datamanager=SimpleNamespace(eval_dataset=[0] if has_eval_images else []))
    trainer.viewer_refresh_every = 100
    trainer._start_step = start_step
    return trainer


@pytest.mark.parametrize(("step", "expected"), [(0, True), (37, False), (100, True), (1000, True), (1001, False)])
def test_eval_steps_gather_the_full_view(step: int, expected: bool) -> None:
    assert _trainer("tensorboard")._needs_full_view(step) is expected


def test_no_eval_images_and_no_viewer_never_gather() -> None:
    trainer = _trainer("tensorboard", has_eval_images=False)
    assert not any(trainer._needs_full_view(s) for s in range(2001))


@pytest.mark.parametrize(("step", "expected"), [(37, True), (38, False), (100, True), (150, False), (200, True)])
def test_the_viewer_gathers_at_the_first_step_and_every_refresh_interval(step: int, expected: bool) -> None:
    # The viewer alone enables no eval writer, so only the viewer's rule applies.
    assert _trainer("viewer", start_step=37)._needs_full_view(step) is expected
