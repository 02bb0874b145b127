"""ns-train distsplat --pipeline.model.camera-optimizer.mode SO3xR3 (issue 29) on 1, 2 and 3 CPU
processes, replicated and sharded (float64): the same Gaussians by global id, the same Gaussian
parameters and the same pose adjustments (within the 1-vs-W tolerance of
tests/helpers/equivalence.py) through two refine events; a sharded checkpoint holds the
adjustments and resumes on one process to the uninterrupted run's end; ns-export reads it.

Tiny on purpose: 24 images at B = 2 (12 steps) at a quarter of lund_door's resolution, 3000
random initial Gaussians; refines every 6 images after a 6-image warm-up (steps 6 and 9). The
camera optimizer's learning rate is 1e-3 without its 1000-step warm-up, so the adjustments move
(~1e-3) in 12 steps and a wrong sum over ranks shows.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from tests.helpers.equivalence import assert_same_model
from tests.helpers.nsrun import latest_checkpoint, ns_bin, read_scalars, read_stats, run_dir, run_ns_train, train_runs
from tests.helpers.rows_by_id import checkpoint_by_id

pytestmark = [pytest.mark.slow, pytest.mark.long]

NUM_RANDOM = 3000
POSE_EXTRA = [
    "--pipeline.model.camera-optimizer.mode",
    "SO3xR3",
    "--optimizers.camera-opt.optimizer.lr",
    "1e-3",
    "--optimizers.camera-opt.scheduler.warmup-steps",
    "0",
    "--pipeline.model.param-dtype",
    "float64",
    "--pipeline.model.random-init",
    "True",
    "--pipeline.model.num-random",
    str(NUM_RANDOM),
    "--pipeline.model.num-downscales",
    "2",
    "--pipeline.batch-size",
    "2",
    "--pipeline.model.warmup-length",
    "6",
    "--pipeline.model.refine-every",
    "6",
    "--pipeline.replica-check-every",
    "1",
    "--steps-per-eval-all-images",
    "1000",
]
NUM_IMAGES = 24
NUM_STEPS = 12
RESUME_STEP = 7
"""sh2's kept checkpoint: after the refine at step 6, before the one at step 9."""
RUNS = {
    "one": (1, "replicated"),
    "rep2": (2, "replicated"),
    "rep3": (3, "replicated"),
    "sh2": (2, "sharded"),
    "sh3": (3, "sharded"),
}
SAVES = {"sh2": ["--steps-per-save", str(RESUME_STEP), "--save-only-latest-checkpoint", "False"]}
NO_SAVES = ["--steps-per-save", "1000"]
ADJUSTMENT = "_model.camera_optimizer.pose_adjustment"


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return train_runs(tmp_path_factory, RUNS, NUM_IMAGES, POSE_EXTRA, SAVES, NO_SAVES)


@pytest.fixture(scope="module")
def resumed(runs: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sh2's step-7 checkpoint (2 sharded ranks) resumed on one replicated process, to the same end."""
    path = tmp_path_factory.mktemp("resumed")
    load = ["--load-dir", str(run_dir(runs["sh2"], "sh2") / "nerfstudio_models"), "--load-step", str(RESUME_STEP)]
    run_ns_train(
        path, "resumed", NUM_IMAGES, extra=[*POSE_EXTRA, *NO_SAVES, "--pipeline.parallel", "replicated", *load]
    )
    return path


def _state(ckpt: Path) -> dict:
    """A checkpoint's Gaussians by global id (under "ids"), its pose adjustments under "pose"."""
    state, rows = checkpoint_by_id(ckpt)
    rows["pose"] = state[ADJUSTMENT]
    return rows


def _assert_same(a: dict, b: dict) -> None:
    assert torch.equal(a["ids"], b["ids"])
    assert_same_model({k: v for k, v in a.items() if k != "ids"}, {k: v for k, v in b.items() if k != "ids"})


def test_one_process_refines_and_learns_pose_adjustments(runs: dict) -> None:
    one = _state(latest_checkpoint(runs["one"], "one"))
    assert one["pose"].dtype == torch.float64 and one["pose"].shape[1] == 6
    # Every training camera was in some batch: each moved; by about lr x steps seen (not noise).
    assert (one["pose"].abs().amax(dim=1) > 1e-4).all()
    assert one["means"].shape[0] != NUM_RANDOM and int(one["ids"].max()) >= NUM_RANDOM, "no refine event grew or pruned"
    # Splatfacto's camera-optimizer metrics and loss term are logged (steps 0 and 10).
    assert sorted(read_scalars(runs["one"], "one", "Train Metrics Dict/camera_opt_translation_max")) == [0, 10]
    assert read_scalars(runs["one"], "one", "Train Loss Dict/camera_opt_regularizer")[10] > 0


@pytest.mark.parametrize("name", ["rep2", "rep3", "sh2", "sh3"])
def test_w_ranks_train_the_model_and_poses_of_one_process(runs: dict, name: str) -> None:
    """assert_same_model's 1e-6 on every Gaussian parameter and on the adjustments (~1e-3 here:
    a sum that missed a rank's or an owner's share would be off by its share, ~1e-4 and more)."""
    _assert_same(_state(latest_checkpoint(runs["one"], "one")), _state(latest_checkpoint(runs[name], name)))
    stats = read_stats(runs[name], name)
    assert (stats["world_size"], stats["parallel"]) == RUNS[name]


@pytest.mark.parametrize("name", ["rep3", "sh3"])
def test_regulariser_is_logged_once_per_step(runs: dict, name: str) -> None:
    """The logged camera_opt_regularizer is one process's (added by one rank, not per rank or
    band). rel 1e-5: stored as float32; the adjustments agree to 1e-6 of ~1e-3."""
    one = read_scalars(runs["one"], "one", "Train Loss Dict/camera_opt_regularizer")
    other = read_scalars(runs[name], name, "Train Loss Dict/camera_opt_regularizer")
    assert sorted(other) == sorted(one) == [0, 10]
    assert other[10] == pytest.approx(one[10], rel=1e-5)


def test_sharded_checkpoint_holds_the_adjustments_and_resumes_on_one_process(runs: dict, resumed: Path) -> None:
    at_save = _state(run_dir(runs["sh2"], "sh2") / "nerfstudio_models" / f"step-{RESUME_STEP:09d}.dcp")
    assert at_save["pose"].abs().max() > 0
    assert read_stats(resumed, "resumed")["steps"] == NUM_STEPS - RESUME_STEP - 1
    _assert_same(_state(latest_checkpoint(runs["sh2"], "sh2")), _state(latest_checkpoint(resumed, "resumed")))


def test_ns_export_reads_a_sharded_pose_run(tmp_path: Path, runs: dict) -> None:
    from plyfile import PlyData

    config = run_dir(runs["sh2"], "sh2") / "config.yml"
    subprocess.run(
        [ns_bin("ns-export"), "gaussian-splat", "--load-config", str(config), "--output-dir", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert (
        PlyData.read(str(tmp_path / "splat.ply"))["vertex"].count
        == _state(latest_checkpoint(runs["sh2"], "sh2"))["means"].shape[0]
    )
