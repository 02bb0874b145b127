"""Per-rank figures of a log step travel in the loss all-reduce: every rank learns every rank's
phase timings, bytes, shard size and peak memory (issue 21 item 4; issue 18 item 5)."""

from __future__ import annotations

from tests.helpers.dcp_fns import log_figures
from tests.helpers.multiproc import run_ranks


def test_log_step_gives_every_rank_the_summed_losses_and_each_ranks_figures() -> None:
    results = run_ranks(log_figures, 2)
    assert results[0] == results[1]
    losses, per_rank = results[0]
    assert losses == [2.0, 1.0, 0.5]
    assert [r["time_forward_s"] for r in per_rank] == [1.0, 2.0]
    assert [r["bytes_communicated"] for r in per_rank] == [1000.0, 2000.0]
    assert [r["local_gaussian_count"] for r in per_rank] == [3.0, 4.0]
    assert all(r["peak_memory_bytes"] > 0 for r in per_rank)
