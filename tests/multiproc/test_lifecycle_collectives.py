"""Lifecycle agreement on 2 gloo ranks: rank-0 outcomes, named start-up phases, stop flag, run identity."""

from __future__ import annotations

import queue
from pathlib import Path

import pytest

from tests.helpers import lifecycle_rank_fns as fns
from tests.helpers.multiproc import run_ranks

pytestmark = pytest.mark.long  # bounded waits on purpose: timeouts of seconds, many ranks


def test_failed_rank0_save_is_the_same_clear_error_on_every_rank() -> None:
    results = run_ranks(fns.agreed_failed_save, 2)
    assert results[0] == results[1], results
    assert "No space left on device" in results[0] and "step-000000010.ckpt" in results[0], results[0]


def test_successful_rank0_work_returns_its_value_on_rank0_only() -> None:
    assert run_ranks(fns.agreed_successful_save, 2) == ["written", None]


def test_rank_stuck_in_a_startup_phase_is_named_within_the_timeout() -> None:
    # Rank 1 sleeps 8 s inside "model ready"; the phase timeout is 2 s.
    (message0, waited0), _ = run_ranks(fns.stuck_in_phase, 2, "model ready", 8.0, 2.0)
    assert message0.startswith("RunFailure: start-up phase 'model ready': rank(s) [1] did not finish within 2 s"), (
        message0
    )
    assert "rank 1 in 'model ready'" in message0, message0
    # 2 s timeout plus store polling; far below the 8 s the rank sleeps.
    assert waited0 < 6.0, waited0


def test_collective_timeout_inside_a_phase_names_the_phase_and_where_ranks_are() -> None:
    # A 3 s gloo timeout ends rank 0's all_reduce while rank 1 stays out of it.
    results = run_ranks(fns.collective_timeout_in_phase, 2)
    assert results[0].startswith("RunFailure: start-up phase 'pipeline setup' on rank 0: a collective failed"), results[
        0
    ]
    assert "rank 1 in 'pipeline setup'" in results[0], results[0]


@pytest.mark.parametrize("stopping_rank", [0, 1])
def test_a_stop_on_one_rank_stops_every_rank(stopping_rank: int) -> None:
    assert run_ranks(fns.stop_flag_agreement, 2, stopping_rank) == [True, True]


def test_no_stop_anywhere_continues_everywhere() -> None:
    assert run_ranks(fns.stop_flag_agreement, 2, -1) == [False, False]


def test_trainer_agrees_on_rank0_identity_without_rewriting_the_config(tmp_path: Path) -> None:
    results = run_ranks(fns.trainer_identity, 2, str(tmp_path), timeout_s=120.0)
    for rank, got in enumerate(results):
        assert got["config_timestamp"] == f"t{rank}" and got["config_seed"] == 100 + rank, got
        assert got["seed"] == 100 and got["base_dir"] == "t0", got
        assert got["checkpoint_dir"] == "nerfstudio_models", got


def test_a_rank_busy_outside_collectives_names_itself_in_its_record() -> None:
    # Rank 1 is busy for longer than half the phase's timeout; rank 0 is inside a collective.
    where1, where0 = run_ranks(fns.working_outside_collectives, 2)[0].split(" | ")
    assert where1.startswith("in 'pipeline setup', outside any collective for "), where1
    assert "lifecycle_rank_fns.py" in where1, where1  # where its main thread was
    assert where0 == "in 'pipeline setup'", where0  # waiting in a collective: not flagged


def test_rank0_work_longer_than_the_collective_timeout_does_not_fail_the_others() -> None:
    # 7 s of rank-0 work at a 2 s collective timeout: rank 1 waits it out, then the all-reduce works.
    (sum0, _), (sum1, waited1) = run_ranks(fns.slow_rank0_work, 2, 7.0, timeout_s=2.0, deadline_s=60.0)
    assert sum0 == sum1 == 2.0
    assert waited1 >= 6.5, waited1


def test_rank0_lost_during_its_own_work_is_found_within_the_timeout(tmp_path: Path) -> None:
    out = tmp_path / "rank1.txt"
    with pytest.raises((RuntimeError, queue.Empty)):  # rank 0 exited without a result
        run_ranks(fns.rank0_dies_in_its_work, 2, str(out), timeout_s=5.0, deadline_s=30.0)
    waited, result = out.read_text().split("\n", 1)
    assert result.startswith("RunFailure: rank 1: lost rank 0 while it was writing checkpoint step-000000005.ckpt"), (
        result
    )
    assert float(waited) < 5.0 + 3.0, waited  # the store's loss is seen at once; the heartbeat bound is 5 s
