"""Checkpoints written by b53ba80 (tests/fixtures/b53ba80: a replicated ``step-N.ckpt``, a 2-rank
sharded ``step-N.dcp/`` and its params-only consolidation) load through today's row code: cut to
any rank's block, read whole or in blocks, and, through the trainer built from their config.yml on
1 and 2 ranks in either mode, saved again with the same Gaussians, ids and Adam moments."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from distsplat_ns.checkpoint import load_checkpoint_file
from distsplat_ns.gaussians.checkpoint_keys import checkpoint_rows
from distsplat_ns.gaussians.ownership import owned_block
from distsplat_ns.parallel.full_state import shard_loaded_checkpoint_
from distsplat_ns.parallel.shard_checkpoint import read_shard_checkpoint
from tests.helpers.multiproc import run_ranks
from tests.helpers.old_checkpoints import STEP, fixture_path, load_and_save
from tests.helpers.rows_by_id import id_order, in_id_order
from tests.helpers.shard_fns import assert_same, saved_model_state


def _in_id_order(rows: dict) -> dict:
    return in_id_order(rows, rows["state.gauss_ids"])


def test_fixtures_hold_every_row_kind_and_a_refine() -> None:
    rows = checkpoint_rows(load_checkpoint_file(fixture_path("replicated-ckpt")))
    assert {
        "param.means",
        "opt.means.exp_avg",
        "opt.means.exp_avg_sq",
        "state.grad2d",
        "state.count",
        "state.radii",
        "state.gauss_ids",
    } <= set(rows)
    assert int(rows["state.gauss_ids"].max()) >= 96, "the fixture's refine created no Gaussian"
    assert fixture_path("sharded-dcp").is_dir() and fixture_path("consolidated-ckpt").is_file()


@pytest.mark.parametrize("world", [1, 2, 3])
def test_old_file_cut_to_blocks_is_its_rows_in_id_order(world: int) -> None:
    loaded = load_checkpoint_file(fixture_path("replicated-ckpt"))
    want = _in_id_order(checkpoint_rows(loaded))
    num = want["param.means"].shape[0]
    parts = []
    for rank in range(world):
        shard = copy.deepcopy(loaded)
        shard_loaded_checkpoint_(shard, rank, world)
        parts.append(checkpoint_rows(shard))
        lo, hi = owned_block(num, rank, world)
        assert torch.equal(parts[-1]["state.gauss_ids"], want["state.gauss_ids"][lo:hi])
    assert set(parts[0]) == set(want)
    for key, value in want.items():
        assert torch.equal(torch.cat([p[key] for p in parts]), value), key


def test_old_dcp_read_whole_holds_the_consolidated_parameters_and_ids() -> None:
    whole = checkpoint_rows(read_shard_checkpoint(None, fixture_path("sharded-dcp"), 0, 1, sharded=False))
    consolidated = load_checkpoint_file(fixture_path("consolidated-ckpt"))
    params_only = checkpoint_rows(consolidated)
    assert consolidated["distsplat"]["params_only"] and consolidated["optimizers"] == {}
    assert set(params_only) == {k for k in whole if k.startswith("param.")} | {"state.gauss_ids"}
    for key, value in params_only.items():
        assert torch.equal(whole[key], value), key
    assert any(k.startswith("opt.") for k in whole) and "state.grad2d" in whole


@pytest.mark.parametrize("world", [2, 3])
def test_old_dcp_read_in_blocks_is_the_whole_read(world: int) -> None:
    folder = fixture_path("sharded-dcp")
    whole = checkpoint_rows(read_shard_checkpoint(None, folder, 0, 1, sharded=False))
    blocks = [checkpoint_rows(read_shard_checkpoint(None, folder, r, world, sharded=True)) for r in range(world)]
    joined = _in_id_order({k: torch.cat([b[k] for b in blocks]) for k in whole})
    for key, value in whole.items():
        assert torch.equal(joined[key], value), key


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("old_checkpoints")


def _state_by_id(state: dict) -> dict:
    """``saved_model_state``'s rows (parameters, statistics, ids, Adam moments) in id order."""
    order = id_order(state["strategy_state"]["gauss_ids"])
    out = {
        **state,
        "params": {k: v[order] for k, v in state["params"].items()},
        "strategy_state": {k: v[order] for k, v in state["strategy_state"].items()},
        "optimizers": copy.deepcopy(state["optimizers"]),
    }
    for opt in out["optimizers"].values():
        for param_state in opt["state"].values():
            param_state.update({k: v[order] for k, v in param_state.items() if k != "step"})
    return out


@pytest.mark.parametrize(
    ("source", "world", "parallel"),
    [
        ("replicated-ckpt", 1, "replicated"),
        ("replicated-ckpt", 2, "sharded"),
        ("sharded-dcp", 2, "sharded"),
        ("sharded-dcp", 1, "replicated"),
        ("consolidated-ckpt", 2, "sharded"),
    ],
)
def test_old_checkpoint_loads_in_either_mode_and_saves_the_same_rows(
    root: Path, source: str, world: int, parallel: str
) -> None:
    result = run_ranks(load_and_save, world, str(root / f"{source}-{world}-{parallel}"), source, parallel, STEP + 1)
    saved = Path(result[0]["checkpoint_dir"]) / f"step-{STEP + 1:09d}{'.dcp' if parallel == 'sharded' else '.ckpt'}"
    got = _state_by_id(saved_model_state(saved))
    old = _in_id_order(
        checkpoint_rows(
            load_checkpoint_file(fixture_path(source))
            if source != "sharded-dcp"
            else read_shard_checkpoint(None, fixture_path(source), 0, 1, sharded=False)
        )
    )
    ids = old["state.gauss_ids"]
    for rank, r in enumerate(result):
        lo, hi = owned_block(len(ids), rank, world) if parallel == "sharded" else (0, len(ids))
        assert sorted(r["ids"]) == ids[lo:hi].tolist()
    if source == "consolidated-ckpt":  # parameters and ids only: no Adam state or statistics were saved
        assert torch.equal(got["strategy_state"]["gauss_ids"], ids)
        for key, value in old.items():
            if key.startswith("param."):
                assert torch.equal(got["params"][key[len("param.") :]], value), key
    else:
        assert_same(got, _state_by_id(saved_model_state(fixture_path(source))))
