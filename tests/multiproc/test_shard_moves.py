"""Shard state across gloo ranks: gathering to rank 0, rebalancing, and a gathered checkpoint
resumed on 1, 2 and 3 ranks in either mode -- each equal, bitwise, to the single-process state."""

from __future__ import annotations

from pathlib import Path

import pytest

from distsplat_ns.gaussians.ownership import owned_block
from distsplat_ns.parallel.shard_moves import SHARD_BOUND
from tests.helpers.multiproc import run_ranks
from tests.helpers.shard_fns import (
    NUM_POINTS,
    adam_step,
    assert_same,
    gather_rebalance_and_save,
    make_state_model,
    resume_and_gather,
    single_process_state,
)


@pytest.fixture(scope="module")
def reference() -> dict:
    model, optimizers = make_state_model()
    state = single_process_state(model, optimizers)
    adam_step(model, optimizers, NUM_POINTS, 2)
    return {"state": state, "stepped": single_process_state(model, optimizers)}


@pytest.fixture(scope="module")
def checkpoint_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("sharded_ckpt")


@pytest.fixture(scope="module")
def two_rank_run(checkpoint_dir: Path) -> list:
    # It also writes the checkpoint the resume tests read.
    return run_ranks(gather_rebalance_and_save, 2, str(checkpoint_dir))


@pytest.fixture(scope="module")
def three_rank_run() -> list:
    return run_ranks(gather_rebalance_and_save, 3, None)


@pytest.fixture(params=[2, 3])
def sharded_run(request: pytest.FixtureRequest) -> list:
    return request.getfixturevalue("two_rank_run" if request.param == 2 else "three_rank_run")


def test_gathered_shards_equal_the_single_process_state(sharded_run: list, reference: dict) -> None:
    assert all(r["gathered"] is None for r in sharded_run[1:])
    assert_same(sharded_run[0]["gathered"], reference["state"])


def test_rebalance_evens_out_the_shards(sharded_run: list) -> None:
    before = [r["sizes_before"] for r in sharded_run]
    after = [r["sizes_after"] for r in sharded_run]
    world = len(sharded_run)
    assert max(before) * world > SHARD_BOUND * NUM_POINTS, "the test's shards must start past the bound"
    assert sum(after) == NUM_POINTS and all(NUM_POINTS // world <= s <= -(-NUM_POINTS // world) for s in after)
    # The bytes a rank reports are those it sent: a whole number of equal-sized rows from a donor, none from a receiver.
    sent_rows = [b - a for b, a in zip(before, after, strict=False)]
    assert all(r["moved"] == 0 for r, n in zip(sharded_run, sent_rows, strict=False) if n <= 0)
    per_row = {r["moved"] / n for r, n in zip(sharded_run, sent_rows, strict=False) if n > 0}
    assert len(per_row) == 1 and per_row.pop() > 0
    assert all(r["aligned"] for r in sharded_run)


def test_rebalance_moves_rows_with_all_their_state(sharded_run: list, reference: dict) -> None:
    assert_same(sharded_run[0]["rebalanced"], reference["state"])


def test_adam_step_after_rebalance_equals_the_single_process_step(sharded_run: list, reference: dict) -> None:
    # Adam is element-wise: the same per-Gaussian inputs give the same bits wherever the row sits.
    assert_same(sharded_run[0]["stepped"], reference["stepped"])


@pytest.fixture(scope="module")
def checkpoint(two_rank_run: list, checkpoint_dir: Path) -> Path:
    found = sorted(checkpoint_dir.glob("step-*.ckpt"))
    assert found, "the 2-rank run wrote no checkpoint"
    return found[-1]


@pytest.fixture(scope="module")
def two_rank_resumes(checkpoint: Path) -> list:
    return run_ranks(resume_and_gather, 2, str(checkpoint), ["sharded", "replicated"])


@pytest.mark.parametrize("world", [1, 2, 3])
def test_sharded_resume_on_any_world_size_restores_the_whole_state(
    request: pytest.FixtureRequest, checkpoint: Path, reference: dict, world: int
) -> None:
    if world == 2:
        results = [r["sharded"] for r in request.getfixturevalue("two_rank_resumes")]
    else:
        results = [r["sharded"] for r in run_ranks(resume_and_gather, world, str(checkpoint), ["sharded"])]
    for rank, result in enumerate(results):
        lo, hi = owned_block(NUM_POINTS, rank, world)
        assert result["ids"] == list(range(lo, hi))
    assert all(r["state"] is None for r in results[1:])
    assert_same(results[0]["state"], reference["state"])


def test_replicated_resume_of_a_sharded_checkpoint_restores_the_whole_state(
    two_rank_resumes: list, reference: dict
) -> None:
    for result in two_rank_resumes:
        assert result["replicated"]["ids"] == list(range(NUM_POINTS))
        assert_same(result["replicated"]["state"], reference["state"])
