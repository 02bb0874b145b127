"""ns-train distsplat --pipeline.model.strategy mcmc on 1, 2 and 3 CPU processes, replicated and
sharded (float64): the same Gaussians by global id and the same parameters (within the 1-vs-W
tolerance of tests/helpers/equivalence.py) through two relocation events, both with additions,
the second stopped by the global cap.

40 images at B = 2 (20 steps), events every 10 images after a 10-image warm-up: steps 10 and 15
(gsplat's strict bounds skip step 5). Dead below opacity 0.1 (splatfacto's initial opacity), so
thousands relocate at each event; the cap (11700 of lund_door's 11384 seed points) lets the first
event add 5% and the second only up to the cap.

The 2-rank sharded run also keeps its step-12 checkpoint (after the first event): resumed there,
a run goes through the second event and must end as the uninterrupted run. Every run's loss dict
carries main's two MCMC terms, which must be the whole model's on any number of ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers.equivalence import MCMC_EQUIV_EXTRA, assert_same_model
from tests.helpers.nsrun import latest_checkpoint, read_scalars, read_stats, run_dir, run_torchrun, train_runs
from tests.helpers.rows_by_id import checkpoint_by_id

pytestmark = [pytest.mark.slow, pytest.mark.long]

CAP = 11700
NUM_SEED_POINTS = 11384
MCMC_EXTRA = [*MCMC_EQUIV_EXTRA, "--pipeline.model.max-gs-num", str(CAP), "--pipeline.replica-check-every", "1"]
NUM_IMAGES = 40
NUM_STEPS = 20
RESUME_STEP = 12
"""sh2's kept checkpoint: after the event at step 10, before the one at step 15."""
RUNS = {
    "one": (1, "replicated"),
    "rep2": (2, "replicated"),
    "rep3": (3, "replicated"),
    "sh2": (2, "sharded"),
    "sh3": (3, "sharded"),
}
SAVES = {"sh2": ["--steps-per-save", str(RESUME_STEP), "--save-only-latest-checkpoint", "False"]}
NO_SAVES = ["--steps-per-save", "1000"]
MCMC_TERMS = ("mcmc_opacity_reg", "mcmc_scale_reg")


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return train_runs(tmp_path_factory, RUNS, NUM_IMAGES, MCMC_EXTRA, SAVES, NO_SAVES)


@pytest.fixture(scope="module")
def resumed(runs: dict, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """sh2 resumed from its step-12 checkpoint on 2 sharded ranks, to the same end."""
    path = tmp_path_factory.mktemp("resumed")
    load = ["--load-dir", str(run_dir(runs["sh2"], "sh2") / "nerfstudio_models"), "--load-step", str(RESUME_STEP)]
    run_torchrun(
        path, "resumed", NUM_IMAGES, 2, extra=[*MCMC_EXTRA, *NO_SAVES, "--pipeline.parallel", "sharded", *load]
    )
    return path


def _by_id(ckpt: Path) -> dict:
    state, rows = checkpoint_by_id(ckpt)
    extra = state["_model._extra_state"]
    rows["next_id"] = extra["next_gauss_id"]
    rows["state_keys"] = set(extra["strategy_state"])
    return rows


def test_one_process_relocates_twice_adds_and_stops_at_the_cap(runs: dict) -> None:
    one = _by_id(latest_checkpoint(runs["one"], "one"))
    num = one["means"].shape[0]
    assert num == CAP, "the second event should have grown the model exactly to the cap"
    # Two events' relocations and additions took ids past the seed points: more than the growth alone.
    num_added = CAP - NUM_SEED_POINTS
    assert one["next_id"] > NUM_SEED_POINTS + num_added, "no Gaussian was relocated"
    assert int((one["ids"] < NUM_SEED_POINTS).sum()) < NUM_SEED_POINTS - num_added, "relocations removed too few"
    assert one["state_keys"] == {"gauss_ids"}  # MCMC keeps no densification statistics


@pytest.mark.parametrize("name", ["rep2", "rep3", "sh2", "sh3"])
def test_mcmc_on_w_ranks_equals_one_process(runs: dict, name: str) -> None:
    one = _by_id(latest_checkpoint(runs["one"], "one"))
    other = _by_id(latest_checkpoint(runs[name], name))
    assert torch.equal(one["ids"], other["ids"]) and one["next_id"] == other["next_id"]
    params = [k for k in one if k not in ("ids", "next_id", "state_keys")]
    assert_same_model({k: one[k] for k in params}, {k: other[k] for k in params})
    stats = read_stats(runs[name], name)
    world, parallel = RUNS[name]
    assert stats["world_size"] == world and stats["parallel"] == parallel
    if parallel == "sharded":
        local = [r["local_gaussian_count"] for r in stats["per_rank"]]
        assert sum(local) == CAP and min(local) > 0


@pytest.mark.parametrize("name", ["rep2", "sh2"])
def test_sharded_mcmc_resumed_at_a_checkpoint_continues_as_the_uninterrupted_run(
    runs: dict, resumed: Path, name: str
) -> None:
    """Resumed at step 13 after sh2's step-12 checkpoint, through the capped event at step 15: the
    same ids and next id (the keyed draws neither repeat nor skip) and parameters as the
    uninterrupted 2-rank sharded run and as replicated 2 ranks."""
    at_save = _by_id(run_dir(runs["sh2"], "sh2") / "nerfstudio_models" / f"step-{RESUME_STEP:09d}.dcp")
    end = _by_id(latest_checkpoint(resumed, "resumed"))
    full = _by_id(latest_checkpoint(runs[name], name))
    assert read_stats(resumed, "resumed")["steps"] == NUM_STEPS - RESUME_STEP - 1
    # The event after the resume relocated and added: new ids, and the count went to the cap.
    assert end["next_id"] > at_save["next_id"] and at_save["means"].shape[0] < CAP == end["means"].shape[0]
    assert torch.equal(end["ids"], full["ids"]) and end["next_id"] == full["next_id"]
    params = [k for k in full if k not in ("ids", "next_id", "state_keys")]
    assert_same_model({k: full[k] for k in params}, {k: end[k] for k in params})


def test_one_process_loss_dict_reports_main_s_mcmc_terms(runs: dict) -> None:
    """Logged on the log steps (0 and 10) under main's keys. At step 0 every opacity is
    splatfacto's initial 0.1, so main's term is 0.01 x 0.1 (rel 1e-6: tensorboard stores float32,
    and the float32 logit of 0.1 is cast to the float64 mode)."""
    opacity, scale = (read_scalars(runs["one"], "one", f"Train Loss Dict/{key}") for key in MCMC_TERMS)
    assert sorted(opacity) == sorted(scale) == [0, 10]
    assert opacity[0] == pytest.approx(0.01 * 0.1, rel=1e-6)
    assert opacity[10] != opacity[0] and scale[10] > 0


@pytest.mark.parametrize("name", ["rep2", "rep3", "sh2", "sh3"])
@pytest.mark.parametrize("key", MCMC_TERMS)
def test_mcmc_loss_terms_on_w_ranks_equal_one_process(runs: dict, name: str, key: str) -> None:
    """The logged term is the whole model's, counted once (replicated: one replica's; sharded: the
    shards' shares summed). rel 1e-5: the values are stored as float32 (6e-8) and the parameters
    agree within assert_same_model's 1e-6; a term counted twice or a missing shard is off by ~2x."""
    one = read_scalars(runs["one"], "one", f"Train Loss Dict/{key}")
    other = read_scalars(runs[name], name, f"Train Loss Dict/{key}")
    assert sorted(other) == sorted(one) == [0, 10]
    for step, value in one.items():
        assert other[step] == pytest.approx(value, rel=1e-5), f"step {step}"
