"""The memory budget's arithmetic (gaussians/budget_caps.py): the flag, the bytes per Gaussian, the caps
and the set-up refusal."""

from __future__ import annotations

import math

import pytest
import torch

from distsplat_ns.gaussians.budget_caps import (
    GIB,
    LIVE_ITEMS_PER_CAMERA_GAUSSIAN,
    GaussianBytes,
    MemoryBudget,
    caps_from_budget,
    check_initial_fit,
    gaussian_bytes,
    held_bytes,
    parse_memory_budget,
    resolve_memory_budget,
    smallest_sharded_world_size,
)
from distsplat_ns.gaussians.rows import DEFAULT_STATISTICS, gaussian_schema, parameter_fields
from distsplat_ns.pipeline.distsplat_pipeline import DistSplatPipelineConfig
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.units import format_bytes


@pytest.mark.parametrize("value", ["0", "-1", "-0.5", "nan", "inf", "twelve", "", "12GiB"])
def test_a_budget_of_zero_or_less_or_a_non_number_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(UserError, match="--pipeline.memory-budget"):
        DistSplatPipelineConfig(memory_budget=value)


@pytest.mark.parametrize(
    ("value", "gib"), [("12", 12.0), ("0.25", 0.25), ("auto", None), ("off", None), (" OFF ", None)]
)
def test_budget_values_parse(value: str, gib: float | None) -> None:
    assert parse_memory_budget(value) == gib


def test_auto_on_the_cpu_and_off_give_no_budget_and_a_number_gives_its_bytes() -> None:
    cpu = torch.device("cpu")
    assert resolve_memory_budget("auto", cpu).bytes is None
    assert resolve_memory_budget("off", cpu).bytes is None
    assert resolve_memory_budget("1.5", cpu).bytes == int(1.5 * GIB)


def test_held_bytes_at_sh_degree_3_are_the_readmes_964() -> None:
    # 59 floats x 4 B x (value, gradient, exp_avg, exp_avg_sq) + 3 statistics x 4 B + an int64 id.
    schema = gaussian_schema(parameter_fields(3), DEFAULT_STATISTICS)
    assert held_bytes(schema, 4) == 59 * 4 * 4 + 3 * 4 + 8 == 964
    assert held_bytes(gaussian_schema(parameter_fields(0), ()), 8) == 14 * 8 * 4 + 8


def test_working_bytes_follow_the_cameras_a_rank_projects_at_once() -> None:
    schema = gaussian_schema(parameter_fields(3), DEFAULT_STATISTICS)
    live = LIVE_ITEMS_PER_CAMERA_GAUSSIAN * 4
    # Replicated: ceil(B / W) cameras of the rank's own, and the statistics' reduction at W > 1.
    assert (
        gaussian_bytes(schema, 4, sharded=False, batch_size=4, world_size=1, reads_statistics=True).working == 4 * live
    )
    assert (
        gaussian_bytes(schema, 4, sharded=False, batch_size=4, world_size=2, reads_statistics=True).working
        == 2 * live + 5 * 4 * 4
    )
    assert (
        gaussian_bytes(schema, 4, sharded=False, batch_size=4, world_size=3, reads_statistics=False).working == 2 * live
    )
    # Sharded: one camera at the smallest group; no all-reduced statistics.
    assert gaussian_bytes(schema, 4, sharded=True, batch_size=8, world_size=4, reads_statistics=True).working == live


def test_caps_replicated_are_one_ranks_and_sharded_about_w_ranks_less_the_headroom() -> None:
    assert caps_from_budget(10_000, 0, 100, world_size=4, sharded=False, headroom=1.1).total == 100
    sharded = caps_from_budget(10_000, 1_000, 100, world_size=4, sharded=True, headroom=1.1)
    assert sharded.held == 90 and sharded.total == math.floor(4 * 90 / 1.1) == 327
    assert caps_from_budget(10_000, 1_000, 100, world_size=1, sharded=True, headroom=1.1).total == 90
    assert caps_from_budget(500, 1_000, 100, world_size=2, sharded=True, headroom=1.1).held == 0


def test_the_smallest_world_size_is_the_first_whose_caps_hold_the_gaussians() -> None:
    for num in (1, 90, 91, 500, 10_000):
        w = smallest_sharded_world_size(num, 10_000, 1_000, 100, 1.1)
        assert caps_from_budget(10_000, 1_000, 100, world_size=w, sharded=True, headroom=1.1).total >= num
        if w > 1:
            assert caps_from_budget(10_000, 1_000, 100, world_size=w - 1, sharded=True, headroom=1.1).total < num
    assert smallest_sharded_world_size(5, 100, 1_000, 100, 1.1) is None


def test_initial_gaussians_past_the_budget_are_refused_at_set_up_with_the_numbers() -> None:
    per = GaussianBytes(held=964, working=2112)
    budget = MemoryBudget(int(0.01 * GIB), "--pipeline.memory-budget 0.01")
    with pytest.raises(UserError) as refused:
        check_initial_fit(10_000, budget, 0, per, GaussianBytes(964, 1056), world_size=1, sharded=False, headroom=1.1)
    message = str(refused.value)
    assert "\n" not in message
    assert "--pipeline.memory-budget" in message and "10,000 initial Gaussians" in message
    assert (
        f"{format_bytes(10_000 * per.total)} per rank" in message
        and f"budget of {format_bytes(budget.bytes)}" in message
    )
    smallest = smallest_sharded_world_size(10_000, budget.bytes, 0, 964 + 1056, 1.1)
    assert f"on {smallest} or more ranks" in message


def test_sizes_read_in_the_largest_unit_below_them() -> None:
    assert format_bytes(3 * GIB // 2) == "1.50 GiB"
    assert format_bytes(107_374) == "104.86 KiB"
    assert format_bytes(1023) == "1023 B"


def test_initial_gaussians_within_the_budget_give_the_caps() -> None:
    per = GaussianBytes(held=964, working=1056)
    budget = MemoryBudget(GIB, "--pipeline.memory-budget 1")
    caps = check_initial_fit(1000, budget, 0, per, per, world_size=2, sharded=True, headroom=1.1)
    assert caps is not None and caps.held == GIB // per.total
    assert (
        check_initial_fit(10**9, MemoryBudget(None, "off"), 0, per, per, world_size=1, sharded=False, headroom=1.1)
        is None
    )
