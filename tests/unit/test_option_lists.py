"""Each option list is one ``Literal`` (docs/architecture.md, "Option lists"): what implements the
options matches it, and a value outside it is refused naming every choice."""

from __future__ import annotations

import pytest

from distsplat_ns.balance.planner import PARTITION_MODES, BandPlanner
from distsplat_ns.gaussians.strategy_choices import DENSIFIERS, STRATEGIES, strategy_help
from distsplat_ns.model.distsplat_model import DistSplatModelConfig
from distsplat_ns.parallel import MODES, PARALLEL_MODES
from distsplat_ns.pipeline.distsplat_pipeline import DistSplatPipelineConfig
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.validation import one_of


def test_every_parallel_mode_name_has_its_class_and_no_class_is_unnamed() -> None:
    assert sorted(MODES) == sorted(PARALLEL_MODES)
    assert all(MODES[name].name == name for name in PARALLEL_MODES)


@pytest.mark.parametrize("partition", PARTITION_MODES)
def test_every_partition_mode_plans(partition: str) -> None:
    plan = BandPlanner(partition, [64, 64]).plan([0, 1], 2, 1)
    assert len(plan.bands) == 2


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_is_accepted(strategy: str) -> None:
    assert DistSplatModelConfig(strategy=strategy).strategy == strategy


def test_the_strategy_flag_describes_every_choice_in_its_own_words() -> None:
    assert sorted(DENSIFIERS) == sorted(STRATEGIES)
    for name, densifier in DENSIFIERS.items():
        assert densifier.help, f"{densifier.__name__} has no help for --pipeline.model.strategy"
        assert f'"{name}" ({densifier.help})' in strategy_help()


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (
            lambda: DistSplatPipelineConfig(parallel="both"),
            UserError,
            "--pipeline.parallel must be replicated or sharded, got 'both'",
        ),
        (
            lambda: DistSplatPipelineConfig(partition="rows"),
            UserError,
            "--pipeline.partition must be balanced, whole-images or equal-rows, got 'rows'",
        ),
        # Every strategy DENSIFIERS lists, whatever their number (a new one touches no test).
        (
            lambda: DistSplatModelConfig(strategy="mcmc2"),
            ValueError,
            f"--pipeline.model.strategy must be {one_of(STRATEGIES)}, got 'mcmc2'",
        ),
    ],
)
def test_a_value_outside_the_list_is_refused_naming_every_choice(make, error: type, message: str) -> None:
    with pytest.raises(error) as caught:
        make()
    assert str(caught.value) == message


def test_one_of_writes_a_list_as_a_sentence() -> None:
    assert [one_of(()), one_of(("a",)), one_of(("a", "b")), one_of(("a", "b", "c"))] == ["", "a", "a or b", "a, b or c"]
