"""The trainer and its checkpoints ask the pipeline, never its parallel mode or planner (issue 52
item 3): what the trainer logs of a step comes in the step's ``StepReport``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "distsplat_ns"


def _reaches(path: Path) -> list[str]:
    """Every ``<...>.pipeline.mode`` / ``<...>.pipeline.planner`` in ``path``, with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("mode", "planner"):
            inner = node.value
            if isinstance(inner, ast.Attribute) and inner.attr == "pipeline":
                found.append(f"{path.name}:{node.lineno} .pipeline.{node.attr}")
    return found


@pytest.mark.parametrize("module", ["trainer/distsplat_trainer.py", "trainer/checkpoints.py"])
def test_the_trainer_reads_no_attribute_of_the_mode_or_the_planner(module: str) -> None:
    assert _reaches(PKG / module) == []


def test_the_check_finds_a_reach_through_the_pipeline(tmp_path: Path) -> None:
    reaching = tmp_path / "reaching.py"
    reaching.write_text("def f(self):\n    return self.pipeline.mode.evaluates_here, self.pipeline.planner.log\n")
    assert _reaches(reaching) == ["reaching.py:2 .pipeline.mode", "reaching.py:2 .pipeline.planner"]
