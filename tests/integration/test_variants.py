"""ns-train distsplat-mcmc and distsplat-big end to end on the shipped scene (CPU): train, ns-export,
ns-eval; MCMC with the bilateral grid resumed from a checkpoint continues bit for bit (the grids,
the ids and next_gauss_id travel with it).

The variants are found through NERFSTUDIO_METHOD_CONFIGS (tests/helpers/nsrun.py:cpu_env), so the
tests need no reinstall of the package.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers.nsrun import (
    cpu_env,
    latest_checkpoint,
    load_gauss_ids,
    load_gauss_params,
    ns_bin,
    read_stats,
    run_dir,
    run_ns_train,
)

pytestmark = [pytest.mark.slow, pytest.mark.long]

NUM_IMAGES = 20
MCMC, BIG = "distsplat-mcmc", "distsplat-big"  # each variant's method name is its own (its output folder)
# Events every 5 images after 5 (steps 10 and 15); dead below 0.1 so the first event relocates.
MCMC_EXTRA = [
    "--steps-per-eval-all-images",
    "1000",
    "--steps-per-save",
    "10",
    "--pipeline.model.warmup-length",
    "5",
    "--pipeline.model.refine-every",
    "5",
    "--pipeline.model.cull-alpha-thresh",
    "0.1",
    "--pipeline.model.max-gs-num",
    "11600",
    "--pipeline.model.use-bilateral-grid",
    "True",
]
BIG_EXTRA = [
    "--steps-per-eval-all-images",
    "1000",
    "--steps-per-save",
    "1000",
    "--pipeline.model.warmup-length",
    "5",
    "--pipeline.model.refine-every",
    "5",
]


@pytest.fixture(scope="module")
def mcmc_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("mcmc")
    run_ns_train(out, "mcmc", NUM_IMAGES, extra=MCMC_EXTRA, method=MCMC)
    return out, "mcmc"


@pytest.fixture(scope="module")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("big")
    run_ns_train(out, "big", NUM_IMAGES, extra=BIG_EXTRA, method=BIG)
    return out, "big"


def _pipeline_state(ckpt: Path) -> dict:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["pipeline"]


def test_mcmc_trains_to_the_cap_with_the_grid_in_the_checkpoint(mcmc_run: tuple[Path, str]) -> None:
    out, ts = mcmc_run
    stats = read_stats(out, ts, MCMC)
    assert stats["steps"] == NUM_IMAGES
    state = _pipeline_state(latest_checkpoint(out, ts, MCMC))
    assert state["_model.gauss_params.means"].shape[0] == 11600 == stats["final_gaussian_count"]
    grids = state["_model.bil_grids.grids"]
    assert grids.shape[0] == 10  # one per training image: lund_door has 12, every 8th held out for eval
    config = (run_dir(out, ts, MCMC) / "config.yml").read_text()
    assert "strategy: mcmc" in config and "use_bilateral_grid: true" in config


def test_mcmc_resume_continues_exactly(tmp_path: Path, mcmc_run: tuple[Path, str]) -> None:
    out, ts = mcmc_run
    run_ns_train(tmp_path, "first", 10, extra=MCMC_EXTRA, method=MCMC)
    first = run_dir(tmp_path, "first", MCMC) / "nerfstudio_models"
    run_ns_train(tmp_path, "resumed", NUM_IMAGES, extra=[*MCMC_EXTRA, "--load-dir", str(first)], method=MCMC)
    resumed = _pipeline_state(latest_checkpoint(tmp_path, "resumed", MCMC))
    straight = _pipeline_state(latest_checkpoint(out, ts, MCMC))
    keys = [k for k in straight if k.startswith(("_model.gauss_params.", "_model.bil_grids."))]
    assert "_model.bil_grids.grids" in keys
    for key in keys:
        assert torch.equal(resumed[key], straight[key]), key
    assert torch.equal(
        load_gauss_ids(latest_checkpoint(tmp_path, "resumed", MCMC)), load_gauss_ids(latest_checkpoint(out, ts, MCMC))
    )
    assert resumed["_model._extra_state"]["next_gauss_id"] == straight["_model._extra_state"]["next_gauss_id"]


@pytest.mark.parametrize("which", ["mcmc", "big"])
def test_variant_exports_and_evaluates(
    tmp_path: Path, mcmc_run: tuple[Path, str], big_run: tuple[Path, str], which: str
) -> None:
    from plyfile import PlyData

    (out, ts), method = (mcmc_run, MCMC) if which == "mcmc" else (big_run, BIG)
    config = str(run_dir(out, ts, method) / "config.yml")
    subprocess.run(
        [ns_bin("ns-export"), "gaussian-splat", "--load-config", config, "--output-dir", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=600,
        env=cpu_env(),
    )
    vertex = PlyData.read(str(tmp_path / "splat.ply"))["vertex"]
    assert vertex.count == load_gauss_params(latest_checkpoint(out, ts, method))["means"].shape[0]
    target = tmp_path / "eval.json"
    subprocess.run(
        [ns_bin("ns-eval"), "--load-config", config, "--output-path", str(target)],
        check=True,
        capture_output=True,
        timeout=600,
        env=cpu_env(),
    )
    results = json.loads(target.read_text())["results"]
    # 20 images only prove the path end to end (measured: mcmc 10+, big 8.5 dB); quality is
    # benchmarks/bench_mcmc_quality.py's.
    assert results["psnr"] > 5 and "ssim" in results


def test_variants_are_listed_by_ns_train_help() -> None:
    proc = subprocess.run(
        [ns_bin("ns-train"), "--help"], capture_output=True, text=True, timeout=300, env=cpu_env(), check=False
    )
    assert "distsplat-mcmc" in proc.stdout and "distsplat-big" in proc.stdout
