"""Checkpoints and config.yml files written by b53ba80 (tests/fixtures/b53ba80) resume with
``ns-train --load-dir`` in the other mode and on another number of processes, and export with
``ns-export --load-config``, as a user's run folder from before gaussians/rows.py would."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from distsplat_ns.checkpoint import load_checkpoint_file
from tests.helpers.nsrun import latest_checkpoint, ns_bin, read_stats, run_ns_train, run_torchrun
from tests.helpers.old_checkpoints import STEP, fixture_path, models_folder, run_folder

pytestmark = [pytest.mark.slow, pytest.mark.long]

#: The fixture runs' settings (make_fixtures.sh), resumed for 2 more steps of B = 2.
SETTINGS = [
    "--machine.seed",
    "7",
    "--steps-per-eval-image",
    "1000",
    "--steps-per-eval-all-images",
    "1000",
    "--pipeline.batch-size",
    "2",
    "--pipeline.model.random-init",
    "True",
    "--pipeline.model.num-random",
    "96",
    "--pipeline.model.sh-degree",
    "1",
    "--pipeline.model.num-downscales",
    "2",
    "--pipeline.model.resolution-schedule",
    "100000",
    "--pipeline.model.warmup-length",
    "2",
    "--pipeline.model.refine-every",
    "4",
    "--pipeline.model.densify-grad-thresh",
    "0.00002",
]
IMAGES = 2 * (STEP + 3)


def _resumed_two_steps(out: Path, name: str) -> None:
    assert read_stats(out, name)["steps"] == 2
    assert latest_checkpoint(out, name).name == f"step-{STEP + 2:09d}.ckpt"


def test_old_replicated_checkpoint_resumes_sharded_on_two_processes(tmp_path: Path) -> None:
    resume = ["--load-dir", str(models_folder("replicated-ckpt", tmp_path)), "--pipeline.parallel", "sharded"]
    run_torchrun(tmp_path, "sharded", IMAGES, 2, extra=[*SETTINGS, *resume])
    _resumed_two_steps(tmp_path, "sharded")  # the consolidation of the last step-N.dcp


@pytest.mark.parametrize("source", ["sharded-dcp", "consolidated-ckpt"])
def test_old_sharded_checkpoints_resume_replicated_on_one_process(tmp_path: Path, source: str) -> None:
    run_ns_train(tmp_path, source, IMAGES, extra=[*SETTINGS, "--load-dir", str(models_folder(source, tmp_path))])
    _resumed_two_steps(tmp_path, source)


@pytest.mark.parametrize(("run", "source"), [("sharded", "consolidated-ckpt"), ("replicated", "replicated-ckpt")])
def test_old_config_and_checkpoint_export_every_gaussian(tmp_path: Path, run: str, source: str) -> None:
    from plyfile import PlyData

    config = run_folder(run, tmp_path)
    subprocess.run(
        [ns_bin("ns-export"), "gaussian-splat", "--load-config", str(config), "--output-dir", str(tmp_path / "ply")],
        check=True,
        capture_output=True,
        timeout=600,
        cwd=tmp_path,
    )
    vertex = PlyData.read(str(tmp_path / "ply" / "splat.ply"))["vertex"]
    assert vertex.count == load_checkpoint_file(fixture_path(source))["pipeline"]["_model.gauss_params.means"].shape[0]
