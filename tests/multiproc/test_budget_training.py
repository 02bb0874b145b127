"""``--pipeline.memory-budget`` limits densification, and budgets that imply the same cap train
the same Gaussians on 1, 2 and 3 ranks, in both modes (float64, the 1-vs-W settings of
tests/helpers/equivalence.py: refines at steps 20, 30, 40 on lund_door).

Each run's budget is the one whose caps total CAP for its mode, ranks and batch
(tests/helpers/budget_runs.py): a replicated rank's working memory grows with the cameras it
projects, so W = 1 and W = 2 need different budgets for one cap. Uncapped, these refines grow the
11,3xx seed points past 14,000 (tests/helpers/equivalence.py), so the cap binds. MCMC under a
budget whose cap is below ``max_gs_num`` stops at the budget's cap. The default run trains one
process and 2 sharded ranks; the replicated pair, 3 ranks and MCMC on one process are ``long``.
"""

from __future__ import annotations

import pytest
import torch

from tests.helpers.budget_runs import budget_for_cap
from tests.helpers.equivalence import EQUIV_EXTRA, MCMC_EQUIV_EXTRA, assert_same_model
from tests.helpers.nsrun import latest_checkpoint, read_stats, run_ns_train, run_torchrun
from tests.helpers.rows_by_id import checkpoint_rows_by_id

pytestmark = pytest.mark.slow

CAP = 11999
"""A total that a per-rank cap gives exactly on 2 and on 3 sharded ranks (floor(W x held / 1.1))."""
NUM_IMAGES = 100
MCMC_CAP = 11601
"""Below max_gs_num, above the 11,384 seed points; a total a per-rank cap gives exactly on 2 sharded ranks."""
MCMC_EXTRA = [*MCMC_EQUIV_EXTRA, "--steps-per-save", "1000"]
MCMC_IMAGES = 40


def _train(
    tmp_path_factory: pytest.TempPathFactory,
    name: str,
    world: int,
    parallel: str,
    strategy_extra: list[str],
    cap: int,
    num_images: int,
):
    budget = budget_for_cap(
        cap,
        world_size=world,
        sharded=parallel == "sharded",
        batch_size=2,
        item_bytes=8,
        default_strategy="mcmc" not in strategy_extra,
    )
    path = tmp_path_factory.mktemp(name)
    extra = [*strategy_extra, "--pipeline.parallel", parallel, "--pipeline.memory-budget", budget]
    if world == 1:
        run_ns_train(path, name, num_images, extra=extra)
    else:
        run_torchrun(path, name, num_images, world, extra=extra)
    return path


def _rows(path, name: str) -> dict:
    return checkpoint_rows_by_id(latest_checkpoint(path, name))


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory):
    return _train(tmp_path_factory, "one", 1, "replicated", EQUIV_EXTRA, CAP, NUM_IMAGES)


def test_the_budget_stops_growth_at_its_cap_and_the_summary_says_so(one) -> None:
    rows = _rows(one, "one")
    stats = read_stats(one, "one")
    budget = stats["memory_budget"]
    assert budget["gaussians_refused"] > 0, "the cap never bound: pick a smaller CAP"
    assert budget["gaussians_refused_by_shard_cap"] == 0
    assert budget["budget_bytes"] > 0 and budget["peak_counted_bytes"] <= budget["budget_bytes"]
    # Growth stopped at the cap; pruning at the same events may leave fewer.
    assert CAP - 2000 < rows["ids"].numel() <= CAP


@pytest.mark.parametrize(
    ("name", "world", "parallel"),
    [pytest.param("rep2", 2, "replicated", marks=pytest.mark.long), ("sh2", 2, "sharded")],
)
def test_budgets_of_one_cap_train_the_same_gaussians_on_two_ranks(
    one, tmp_path_factory: pytest.TempPathFactory, name: str, world: int, parallel: str
) -> None:
    other_path = _train(tmp_path_factory, name, world, parallel, EQUIV_EXTRA, CAP, NUM_IMAGES)
    a, b = _rows(one, "one"), _rows(other_path, name)
    assert torch.equal(a["ids"], b["ids"])
    assert_same_model({k: v for k, v in a.items() if k != "ids"}, {k: v for k, v in b.items() if k != "ids"})
    assert (
        read_stats(other_path, name)["memory_budget"]["gaussians_refused"]
        == read_stats(one, "one")["memory_budget"]["gaussians_refused"]
    )


@pytest.mark.long
def test_budgets_of_one_cap_train_the_same_gaussians_on_three_sharded_ranks(
    one, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other_path = _train(tmp_path_factory, "sh3", 3, "sharded", EQUIV_EXTRA, CAP, NUM_IMAGES)
    a, b = _rows(one, "one"), _rows(other_path, "sh3")
    assert torch.equal(a["ids"], b["ids"])
    assert_same_model({k: v for k, v in a.items() if k != "ids"}, {k: v for k, v in b.items() if k != "ids"})


@pytest.mark.parametrize(("world", "parallel"), [pytest.param(1, "replicated", marks=pytest.mark.long), (2, "sharded")])
def test_mcmc_grows_to_the_budgets_cap_below_max_gs_num(
    tmp_path_factory: pytest.TempPathFactory, world: int, parallel: str
) -> None:
    name = f"mcmc{world}"
    path = _train(tmp_path_factory, name, world, parallel, MCMC_EXTRA, MCMC_CAP, MCMC_IMAGES)
    assert _rows(path, name)["ids"].numel() == MCMC_CAP
    assert read_stats(path, name)["memory_budget"]["gaussians_refused"] > 0
