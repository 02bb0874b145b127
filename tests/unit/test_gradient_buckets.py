"""distributed/gradient_sum.py's bucket layout and utils/timing.py's spans (the multi-rank sums:
tests/multiproc/test_collectives.py)."""

from __future__ import annotations

import time

import torch

from distsplat_ns.distributed.gradient_sum import bucket_layout
from distsplat_ns.utils.timing import PhaseClock


def test_buckets_follow_the_reversed_parameter_order_and_cover_each_parameter_once() -> None:
    params = [torch.zeros(n) for n in (10, 300_000, 20, 30, 300_000, 5)]
    layout = bucket_layout(params, bucket_bytes=25 * 1024 * 1024)
    assert [i for bucket in layout for i in bucket] == [5, 4, 3, 2, 1, 0]


def test_a_bucket_closes_at_one_mebibyte_and_never_passes_the_cap() -> None:
    mib = 1024 * 1024
    params = [torch.zeros(n) for n in (100, mib // 4, 100, mib // 8, mib // 8, 100)]
    assert bucket_layout(params, bucket_bytes=25 * mib) == [[5, 4, 3], [2, 1], [0]]
    assert bucket_layout(params, bucket_bytes=600 * 1024) == [[5, 4], [3, 2], [1], [0]]


def test_a_bucket_holds_one_dtype() -> None:
    params = [torch.zeros(3), torch.zeros(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64)]
    assert bucket_layout(params, bucket_bytes=1024) == [[2, 1], [0]]


def test_nested_spans_of_one_name_count_once_beside_the_phases() -> None:
    clock = PhaseClock()
    with clock.phase("forward"), clock.span("exposed_comm"), clock.phase("all_reduce"), clock.span("exposed_comm"):
        time.sleep(0.01)
    assert clock["exposed_comm"] >= 0.01
    assert clock["exposed_comm"] < clock["all_reduce"] + clock["forward"] + 1e-9
    assert abs(clock["exposed_comm"] - (clock["all_reduce"] + clock["forward"])) < 5e-3
