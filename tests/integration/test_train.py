"""ns-train distsplat end to end on the shipped real scene (CPU, reference rasterizer)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from distsplat_ns.rendering.api import BAND_COST_FRACTIONS, WORK_UNITS
from tests.helpers.nsrun import (
    latest_checkpoint,
    load_gauss_params,
    ns_bin,
    read_stats,
    run_dir,
    run_ns_train,
)

pytestmark = pytest.mark.slow


def test_training_completes_with_checkpoint_logs_and_summary(trained_run: tuple[Path, str]) -> None:
    out, ts = trained_run
    stats = read_stats(out, ts)
    assert stats["images_trained"] == 60 and stats["steps"] == 60
    assert stats["backend"] == "reference" and stats["world_size"] == 1
    # The planner was given the CPU renderer's measured fixed cost per band (rendering/api.py).
    assert stats["balance"]["band_cost_fraction"] == BAND_COST_FRACTIONS["reference"] > 0
    for key in (
        "wall_time_s",
        "images_per_s",
        "data_wait_fraction",
        "final_gaussian_count",
        "final_eval_psnr",
        "time_breakdown_s",
    ):
        assert key in stats
    assert latest_checkpoint(out, ts).name == "step-000000059.ckpt"
    assert list(run_dir(out, ts).glob("events.out.tfevents.*")), "no tensorboard event file"


def test_eval_psnr_rises_over_training(trained_run: tuple[Path, str]) -> None:
    out, ts = trained_run
    history = read_stats(out, ts)["eval_psnr_history"]
    assert history[0][0] == 0 and history[-1][0] == 59
    # The first eval is the initial point cloud; 60 images of training must improve it clearly.
    assert history[-1][1] > history[0][1] + 1.0, history


def test_summary_gaussian_count_matches_checkpoint(trained_run: tuple[Path, str]) -> None:
    out, ts = trained_run
    params = load_gauss_params(latest_checkpoint(out, ts))
    assert params["means"].shape[0] == read_stats(out, ts)["final_gaussian_count"]


def test_the_checkpoint_keeps_the_balancers_costs_in_the_cpu_renderers_unit(trained_run: tuple[Path, str]) -> None:
    # Measured in composited pairs on the reference backend; a resume on gsplat (intersections)
    # then measures again instead of mixing the units (balance/planner.py).
    out, ts = trained_run
    pipeline = torch.load(latest_checkpoint(out, ts), map_location="cpu", weights_only=True)["pipeline"]
    planner = pipeline["_extra_state"]["planner"]
    assert planner["cost_unit"] == WORK_UNITS["reference"]
    assert planner["histories"], "no cost was measured"


def test_resume_continues_exactly_as_an_uninterrupted_run(tmp_path: Path, trained_run: tuple[Path, str]) -> None:
    base_out, base_ts = trained_run
    extra = [
        "--steps-per-eval-all-images",
        "30",
        "--steps-per-save",
        "30",
        "--pipeline.model.warmup-length",
        "20",
        "--pipeline.model.refine-every",
        "20",
    ]
    run_ns_train(tmp_path, "first", 30, extra=extra)
    first = run_dir(tmp_path, "first") / "nerfstudio_models"
    run_ns_train(tmp_path, "resumed", 60, extra=[*extra, "--load-dir", str(first)])
    assert latest_checkpoint(tmp_path, "resumed").name == "step-000000059.ckpt"
    assert read_stats(tmp_path, "resumed")["steps"] == 30, "the resumed run must train only the remaining steps"
    resumed = load_gauss_params(latest_checkpoint(tmp_path, "resumed"))
    straight = load_gauss_params(latest_checkpoint(base_out, base_ts))
    assert resumed.keys() == straight.keys()
    for name in straight:
        assert resumed[name].shape == straight[name].shape, name
        # Same data order, backgrounds, densification seeds and optimizer state: bitwise equal.
        assert torch.equal(resumed[name], straight[name]), name


def test_existing_checkpoint_is_not_overwritten_by_a_failed_resume(
    tmp_path: Path, trained_run: tuple[Path, str]
) -> None:
    out, ts = trained_run
    ckpt = latest_checkpoint(out, ts)
    before = ckpt.read_bytes()
    proc = run_ns_train(tmp_path, "bad", 10, extra=["--load-dir", str(tmp_path / "missing")], check=False)
    assert proc.returncode != 0
    assert "--load-dir" in (proc.stdout + proc.stderr)
    assert ckpt.read_bytes() == before


def test_missing_data_directory_is_a_one_line_error(tmp_path: Path) -> None:
    proc = run_ns_train(
        tmp_path,
        "nodata",
        5,
        check=False,
        data_args=["colmap", "--data", str(tmp_path / "nope"), "--colmap-path", "sparse/0", "--downscale-factor", "1"],
    )
    assert proc.returncode != 0
    assert str(tmp_path / "nope") in (proc.stdout + proc.stderr)


def test_gsplat_backend_on_cpu_is_a_one_line_error(tmp_path: Path) -> None:
    proc = run_ns_train(tmp_path, "gs", 5, extra=["--pipeline.model.rendering-backend", "gsplat"], check=False)
    assert proc.returncode != 0
    text = proc.stdout + proc.stderr
    assert "gsplat" in text and "cpu" in text.lower()


def test_ns_export_writes_one_ply_with_every_gaussian(tmp_path: Path, trained_run: tuple[Path, str]) -> None:
    from plyfile import PlyData

    out, ts = trained_run
    subprocess.run(
        [
            ns_bin("ns-export"),
            "gaussian-splat",
            "--load-config",
            str(run_dir(out, ts) / "config.yml"),
            "--output-dir",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    vertex = PlyData.read(str(tmp_path / "splat.ply"))["vertex"]
    names = [p.name for p in vertex.properties]
    expected = (
        ["x", "y", "z", "nx", "ny", "nz", "f_dc_0", "f_dc_1", "f_dc_2"]
        + [f"f_rest_{i}" for i in range(45)]
        + ["opacity", "scale_0", "scale_1", "scale_2", "rot_0", "rot_1", "rot_2", "rot_3"]
    )
    assert names == expected
    params = load_gauss_params(latest_checkpoint(out, ts))
    assert vertex.count == params["means"].shape[0]


def test_ns_eval_writes_metrics_json(tmp_path: Path, trained_run: tuple[Path, str]) -> None:
    import json

    out, ts = trained_run
    target = tmp_path / "eval.json"
    subprocess.run(
        [ns_bin("ns-eval"), "--load-config", str(run_dir(out, ts) / "config.yml"), "--output-path", str(target)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    results = json.loads(target.read_text())["results"]
    assert results["psnr"] > 10 and "ssim" in results
