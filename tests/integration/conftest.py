"""A trained run shared by the integration tests of one session (training is the slow part)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.nsrun import run_ns_train

TRAIN_IMAGES = 60


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("trained")
    run_ns_train(
        out,
        "base",
        TRAIN_IMAGES,
        extra=[
            "--steps-per-eval-all-images",
            "30",
            "--steps-per-save",
            "30",
            "--pipeline.model.warmup-length",
            "20",
            "--pipeline.model.refine-every",
            "20",
        ],
    )
    return out, "base"
