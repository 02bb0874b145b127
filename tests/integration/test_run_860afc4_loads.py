"""A run folder written by 860afc4 (tests/fixtures/run_860afc4, from scripts/train_compare_runs.sh;
before the pipeline/ and trainer/ packages) resumes with ``ns-train --load-dir``, and exports and
evaluates with ``ns-export`` and ``ns-eval --load-config``, as a user's older run folder would."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers.nsrun import REPO, cpu_env, latest_checkpoint, ns_bin, read_stats, run_ns_train
from tests.integration.test_old_checkpoints_resume_export import SETTINGS

pytestmark = [pytest.mark.slow, pytest.mark.long]

FIXTURE = REPO / "tests" / "fixtures" / "run_860afc4"
STEP = 9


def _run_folder(run: str, base: Path) -> Path:
    """The fixture run as ns-train left it under ``base`` (its config.yml holds relative paths:
    ``out/cmp/distsplat/<run>``, ``scenes/lund_door``). Returns the config.yml path relative to ``base``."""
    folder = Path("out") / "cmp" / "distsplat" / run
    shutil.copytree(FIXTURE / run, base / folder)
    if not (base / "scenes").exists():
        (base / "scenes").symlink_to(REPO / "scenes")
    return folder / "config.yml"


@pytest.mark.parametrize("run", ["replicated", "sharded"])
def test_860afc4_run_resumes_exports_and_evaluates(tmp_path: Path, run: str) -> None:
    from plyfile import PlyData

    config = _run_folder(run, tmp_path)
    models = tmp_path / config.parent / "nerfstudio_models"
    run_ns_train(tmp_path / "resumed", run, 2 * (STEP + 3), extra=[*SETTINGS, "--load-dir", str(models)])
    assert read_stats(tmp_path / "resumed", run)["steps"] == 2
    assert latest_checkpoint(tmp_path / "resumed", run).name == f"step-{STEP + 2:09d}.ckpt"

    tools = {"cwd": tmp_path, "capture_output": True, "timeout": 600, "env": cpu_env()}
    subprocess.run(
        [ns_bin("ns-export"), "gaussian-splat", "--load-config", str(config), "--output-dir", "ply"],
        check=True,
        **tools,
    )
    saved = models / f"step-{STEP:09d}.ckpt"
    import torch

    num = torch.load(saved, map_location="cpu", weights_only=True)["pipeline"]["_model.gauss_params.means"].shape[0]
    assert PlyData.read(str(tmp_path / "ply" / "splat.ply"))["vertex"].count == num
    subprocess.run([ns_bin("ns-eval"), "--load-config", str(config), "--output-path", "eval.json"], check=True, **tools)
    assert "psnr" in json.loads((tmp_path / "eval.json").read_text())["results"]
