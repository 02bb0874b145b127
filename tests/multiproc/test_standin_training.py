"""ns-train distsplat with "the device" a CPU stand-in for CUDA (issue 53, docs/device_standin.md) on
the gsplat backend, the user's path: the default ``auto`` backend is gsplat on cuda, and gsplat's CUDA
entry points run on its PyTorch references (tests/helpers/gsplat_cpu.py, turned on by the stand-in).
One process with the camera optimizer and the bilateral grid, and 2 ranks sharded with MCMC (its
relocation is gsplat's ``compute_relocation``), float32, through a refinement, an eval, a save, a resume
and an ``ns-export gaussian-splat``, on the shipped scene (docs/gsplat_on_cpu.md, "End to end").

What CUDA refuses (a host tensor indexed by a device mask, a device tensor beside a host one, a host
tensor handed to NCCL) fails these runs with CUDA's message and the place
(tests/helpers/device_standin.py); the first CUDA run's crash at the first refinement did
(docs/device_standin.md, "What it sees").
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.helpers.nsrun import (
    REPO,
    cpu_env,
    latest_checkpoint,
    load_gauss_params,
    ns_bin,
    read_stats,
    run_dir,
    train_args,
)

pytestmark = pytest.mark.slow

LAUNCHER = str(REPO / "tests" / "helpers" / "ns_train_standin.py")
EXPORTER = str(REPO / "tests" / "helpers" / "ns_export_standin.py")
NUM_IMAGES = 17
"""Images of a first run: gsplat's strategy refines at step 15 (warmup 5, every 5, and not within
the 10 train images + 5 after the opacity reset at step 0: gaussians/strategy.py:schedule_in_steps)."""
RESUMED_IMAGES = 20
# Saved and evaluated at step 16 (the last of the first run), after the refinement.
SCHEDULE = [
    "--machine.device-type",
    "cuda",
    "--pipeline.model.warmup-length",
    "5",
    "--pipeline.model.refine-every",
    "5",
    "--steps-per-save",
    "16",
    "--steps-per-eval-all-images",
    "16",
]


def standin_run(
    out: Path,
    timestamp: str,
    num_images: int,
    nproc: int,
    extra: Sequence[str],
    method: str = "distsplat",
    backend: str = "reference",
) -> subprocess.CompletedProcess:
    """``ns-train`` under the stand-in (torchrun with ``nproc`` ranks when > 1) on rendering backend
    ``backend``, each rank's report written to ``out/standin-<timestamp>.rank<R>``
    (tests/helpers/ns_train_standin.py)."""
    schedule = [*SCHEDULE, "--pipeline.model.rendering-backend", backend]
    args = train_args(out, timestamp, num_images, [*schedule, *extra], method=method)
    args[args.index("--machine.device-type") + 1] = "cuda"  # train_args' own cpu, which SCHEDULE repeats
    env = cpu_env()
    env["DISTSPLAT_STANDIN_REPORT"] = str(out / f"standin-{timestamp}")
    if nproc == 1:
        cmd = [ns_bin("python"), LAUNCHER, *args]
    else:
        cmd = [ns_bin("torchrun"), "--nproc_per_node", str(nproc), LAUNCHER, *args]
        env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    return subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env, check=False)


def _standin_train(
    out: Path,
    timestamp: str,
    num_images: int,
    nproc: int,
    extra: Sequence[str],
    method: str = "distsplat",
    backend: str = "reference",
) -> dict[int, dict]:
    """:func:`standin_run` that must succeed; returns each rank's report (copy counts:
    tests/helpers/device_standin.py:CopyCounter.report; the allocator's figures)."""
    proc = standin_run(out, timestamp, num_images, nproc, extra, method, backend)
    assert proc.returncode == 0, (
        f"ns-train under the device stand-in failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    )
    return {r: json.loads((out / f"standin-{timestamp}.rank{r}").read_text()) for r in range(nproc)}


RENDER_ATOL = 1e-2
"""The saved model's first training image on gsplat against the reference's, per pixel and channel (colour
and alpha). Measured on gsplat 1.4.0 after the 1-process run's 19 steps: 8.8e-4 (colour), 2.0e-3 (alpha),
the trained model's many overlapping Gaussians each adding float32 rounding and the skip of contributions
below alpha 1/255 flipping on either side; tests/gpu/test_gsplat_parity.py holds the backends to 1e-4 on
random scenes. A call into gsplat that runs but is wrong (the image's width for its height) moves
pixels by 0.1 to 1."""

ALLOWED_BLOCKING_COPIES = {
    "rendering/reference.py": "the reference rasterizer stands in for gsplat's kernels, which a GPU run uses",
    "gsplat/": "gsplat's own Python and PyTorch references run where its kernels would (tests/helpers/gsplat_cpu.py)",
    "helpers/gsplat_cpu.py": "the shim that routes gsplat's CUDA entry points to those references",
    "trainer/run_record.py:": "the logged figures, on logging steps only (STYLE.md: host syncs on steps that log)",
    "collectives.py:": "all_gather_counts / all_gather_object of the logging and refining steps' host values",
    "utils/keyed_random.py:": "the keyed normal draws of a refine step (docs/gpu.md: refine steps only)",
    "gaussians/": "the refine step's bookkeeping (docs/gpu.md: MCMC-event and refine paths)",
}
"""Where a step may still copy host memory to the device the blocking way, and why; any other place
(``rendering/gsplat_backend.py``'s calls into gsplat included) fails the test (docs/gpu.md: each
blocking copy waits for the GPU's queue)."""


def _assert_no_blocking_copies_but_the_allowed(reports: dict[int, dict]) -> None:
    for rank, report in reports.items():
        assert report["steps"], f"rank {rank}: no step was counted"
        others = {
            place: n
            for place, n in report["blocking_copies_in_steps"].items()
            if not any(site in place for site in ALLOWED_BLOCKING_COPIES)
        }
        assert others == {}, f"rank {rank}: blocking host-to-device copies in steps: {others}"


def _standin_export(out: Path, timestamp: str, method: str) -> tuple[int, dict]:
    """``ns-export gaussian-splat`` of a run under the stand-in (tests/helpers/ns_export_standin.py):
    the number of Gaussians in the PLY file it writes, and its render parity report (the saved model's
    image on the run's backend against the reference's)."""
    from plyfile import PlyData

    config = run_dir(out, timestamp, method) / "config.yml"
    parity = out / "render-parity.json"
    cmd = [ns_bin("python"), EXPORTER, "--render-parity", str(parity), "gaussian-splat", "--load-config", str(config)]
    env = cpu_env()
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [*cmd, "--output-dir", str(out / "ply")], capture_output=True, text=True, timeout=600, env=env, check=False
    )
    assert proc.returncode == 0, (
        f"ns-export under the device stand-in failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
    )
    return PlyData.read(str(out / "ply" / "splat.ply"))["vertex"].count, json.loads(parity.read_text())


@pytest.mark.parametrize(
    ("nproc", "parallel", "extra", "method"),
    [
        pytest.param(
            1,
            "replicated",
            ["--pipeline.model.camera-optimizer.mode", "SO3xR3", "--pipeline.model.use-bilateral-grid", "True"],
            "distsplat",
            id="1-replicated-pose-grid",
        ),
        pytest.param(2, "sharded", [], "distsplat-mcmc", id="2-sharded-mcmc"),
    ],
)
def test_training_on_gsplat_on_the_device_standin_refines_evaluates_saves_resumes_and_exports(
    tmp_path: Path, nproc: int, parallel: str, extra: list[str], method: str
) -> None:
    options = ["--pipeline.parallel", parallel, *extra]
    first = _standin_train(tmp_path, "first", NUM_IMAGES, nproc, options, method, backend="auto")
    stats = read_stats(tmp_path, "first", method)
    assert stats["device"].startswith("cuda"), stats["device"]
    assert stats["backend"] == "gsplat", "auto on cuda must be gsplat's path"
    assert stats["final_eval_psnr"] is not None and stats["final_eval_psnr"] > 0
    assert latest_checkpoint(tmp_path, "first", method).name == "step-000000016.ckpt"
    # The default strategy grows or prunes at step 15, MCMC adds 5% (gaussians/mcmc.py: GROWTH).
    assert stats["final_gaussian_count"] != 11384, "no refinement changed the Gaussians (11,384 seed points)"
    _assert_no_blocking_copies_but_the_allowed(first)
    models = run_dir(tmp_path, "first", method) / "nerfstudio_models"
    resumed = _standin_train(
        tmp_path, "resumed", RESUMED_IMAGES, nproc, [*options, "--load-dir", str(models)], method, backend="auto"
    )
    assert latest_checkpoint(tmp_path, "resumed", method).name == "step-000000019.ckpt"
    assert resumed[0]["steps"][0] == NUM_IMAGES, "the resumed run did not start after the saved step"
    _assert_no_blocking_copies_but_the_allowed(resumed)
    saved = load_gauss_params(latest_checkpoint(tmp_path, "resumed", method))["means"].shape[0]
    exported, parity = _standin_export(tmp_path, "resumed", method)
    assert exported == saved
    assert parity["backends"] == ["gsplat", "reference"] and parity["num_gaussians"] == saved, parity
    assert parity["max_abs_rgb"] <= RENDER_ATOL and parity["max_abs_alpha"] <= RENDER_ATOL, parity
