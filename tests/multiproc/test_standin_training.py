"""ns-train distsplat with "the device" a CPU stand-in for CUDA (issue 53, docs/device_standin.md):
one process and 2 ranks, both parallel modes, float32, through a refinement, an eval, a save and a
resume, with the MCMC, camera-optimizer and bilateral-grid options, on the shipped scene.

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

from tests.helpers.nsrun import REPO, cpu_env, latest_checkpoint, ns_bin, read_stats, run_dir, train_args

pytestmark = pytest.mark.slow

LAUNCHER = str(REPO / "tests" / "helpers" / "ns_train_standin.py")
NUM_IMAGES = 17
"""Images of a first run: gsplat's strategy refines at step 15 (warmup 5, every 5, and not within
the 10 train images + 5 after the opacity reset at step 0: gaussians/strategy.py:schedule_in_steps)."""
RESUMED_IMAGES = 20
# Saved and evaluated at step 16 (the last of the first run), after the refinement.
SCHEDULE = [
    "--machine.device-type",
    "cuda",
    "--pipeline.model.rendering-backend",
    "reference",
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
    out: Path, timestamp: str, num_images: int, nproc: int, extra: Sequence[str], method: str = "distsplat"
) -> subprocess.CompletedProcess:
    """``ns-train`` under the stand-in (torchrun with ``nproc`` ranks when > 1), each rank's report
    written to ``out/standin-<timestamp>.rank<R>`` (tests/helpers/ns_train_standin.py)."""
    args = train_args(out, timestamp, num_images, [*SCHEDULE, *extra], method=method)
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
    out: Path, timestamp: str, num_images: int, nproc: int, extra: Sequence[str], method: str = "distsplat"
) -> dict[int, dict]:
    """:func:`standin_run` that must succeed; returns each rank's report (copy counts:
    tests/helpers/device_standin.py:CopyCounter.report; the allocator's figures)."""
    proc = standin_run(out, timestamp, num_images, nproc, extra, method)
    assert proc.returncode == 0, (
        f"ns-train under the device stand-in failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-6000:]}"
    )
    return {r: json.loads((out / f"standin-{timestamp}.rank{r}").read_text()) for r in range(nproc)}


ALLOWED_BLOCKING_COPIES = {
    "rendering/reference.py": "the reference rasterizer stands in for gsplat's kernels, which a GPU run uses",
    "trainer/run_record.py:": "the logged figures, on logging steps only (STYLE.md: host syncs on steps that log)",
    "collectives.py:": "all_gather_counts / all_gather_object of the logging and refining steps' host values",
    "utils/keyed_random.py:": "the keyed normal draws of a refine step (docs/gpu.md: refine steps only)",
    "gaussians/": "the refine step's bookkeeping (docs/gpu.md: MCMC-event and refine paths)",
}
"""Where a step may still copy host memory to the device the blocking way, and why; any other place
fails the test (docs/gpu.md: each blocking copy waits for the GPU's queue)."""


def _assert_no_blocking_copies_but_the_allowed(reports: dict[int, dict]) -> None:
    for rank, report in reports.items():
        assert report["steps"], f"rank {rank}: no step was counted"
        others = {
            place: n
            for place, n in report["blocking_copies_in_steps"].items()
            if not any(site in place for site in ALLOWED_BLOCKING_COPIES)
        }
        assert others == {}, f"rank {rank}: blocking host-to-device copies in steps: {others}"


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
        pytest.param(2, "sharded", [], "distsplat", id="2-sharded"),
        pytest.param(
            2,
            "replicated",
            ["--pipeline.model.use-bilateral-grid", "True"],
            "distsplat-mcmc",
            id="2-replicated-mcmc-grid",
        ),
    ],
)
def test_training_on_the_device_standin_refines_evaluates_saves_and_resumes(
    tmp_path: Path, nproc: int, parallel: str, extra: list[str], method: str
) -> None:
    options = ["--pipeline.parallel", parallel, *extra]
    first = _standin_train(tmp_path, "first", NUM_IMAGES, nproc, options, method)
    stats = read_stats(tmp_path, "first", method)
    assert stats["device"].startswith("cuda"), stats["device"]
    assert stats["final_eval_psnr"] is not None and stats["final_eval_psnr"] > 0
    assert latest_checkpoint(tmp_path, "first", method).name == "step-000000016.ckpt"
    if method == "distsplat":  # the default strategy grew or pruned at step 15; MCMC keeps its count
        assert stats["final_gaussian_count"] != 11384, "no refinement changed the Gaussians (11,384 seed points)"
    _assert_no_blocking_copies_but_the_allowed(first)
    models = run_dir(tmp_path, "first", method) / "nerfstudio_models"
    resumed = _standin_train(tmp_path, "resumed", RESUMED_IMAGES, nproc, [*options, "--load-dir", str(models)], method)
    assert latest_checkpoint(tmp_path, "resumed", method).name == "step-000000019.ckpt"
    assert resumed[0]["steps"][0] == NUM_IMAGES, "the resumed run did not start after the saved step"
