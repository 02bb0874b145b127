"""Checkpoints through DistSplatTrainer in sharded mode: the DCP checkpoint 2 shards write (one
file set per rank) holds what the single process's file holds, and it resumes on 1, 2 and 3 ranks
sharded and on 1, 2 and 3 ranks replicated with the same ids and Adam moments."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distsplat_ns.gaussians.checkpoint_keys import MODEL_EXTRA_KEY, MODEL_PREFIX
from distsplat_ns.gaussians.ownership import owned_block
from distsplat_ns.parallel.shard_checkpoint import consolidate_params
from tests.helpers.multiproc import run_ranks
from tests.helpers.shard_fns import assert_same, saved_model_state, trainer_save


def _checkpoint(result: list, step: int, suffix: str = ".ckpt") -> Path:
    return Path(result[0]["checkpoint_dir"]) / f"step-{step:09d}{suffix}"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("trainer_checkpoints")


@pytest.fixture(scope="module")
def single_process(root: Path) -> dict:
    return saved_model_state(_checkpoint(run_ranks(trainer_save, 1, str(root / "one"), "replicated", None, 5), 5))


@pytest.fixture(scope="module")
def two_shards(root: Path) -> list:
    return run_ranks(trainer_save, 2, str(root / "two"), "sharded", None, 5)


def test_each_rank_starts_with_its_owned_block_of_the_initial_gaussians(two_shards: list, single_process: dict) -> None:
    num = single_process["params"]["means"].shape[0]
    for rank, result in enumerate(two_shards):
        lo, hi = owned_block(num, rank, 2)
        assert result["ids"] == list(range(lo, hi))


def test_two_shards_write_one_file_set_per_rank_and_dcp_metadata(two_shards: list) -> None:
    folder = _checkpoint(two_shards, 5, ".dcp")
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not _checkpoint(two_shards, 5).exists()  # only the run's last checkpoint is consolidated


def test_checkpoint_of_two_shards_equals_the_single_process_checkpoint(two_shards: list, single_process: dict) -> None:
    assert_same(saved_model_state(_checkpoint(two_shards, 5, ".dcp")), single_process)


@pytest.mark.parametrize(
    ("world", "parallel"),
    [(1, "sharded"), (2, "sharded"), (3, "sharded"), (1, "replicated"), (2, "replicated"), (3, "replicated")],
)
def test_sharded_checkpoint_resumes_on_other_world_sizes_and_modes(
    root: Path, two_shards: list, single_process: dict, world: int, parallel: str
) -> None:
    load_dir = _checkpoint(two_shards, 5, ".dcp").parent
    result = run_ranks(trainer_save, world, str(root / f"resume-{world}-{parallel}"), parallel, str(load_dir), 6)
    num = single_process["params"]["means"].shape[0]
    for rank, r in enumerate(result):
        lo, hi = owned_block(num, rank, world) if parallel == "sharded" else (0, num)
        assert r["ids"] == list(range(lo, hi))
    # Saved again straight after the resume: nothing trained, so the state is the one loaded.
    assert_same(saved_model_state(_checkpoint(result, 6, ".dcp" if parallel == "sharded" else ".ckpt")), single_process)


def test_no_rank_holds_more_than_its_shard_after_a_save(two_shards: list, single_process: dict) -> None:
    num = single_process["params"]["means"].shape[0]
    assert [r["num_held"] for r in two_shards] == [hi - lo for lo, hi in (owned_block(num, r, 2) for r in range(2))]


def test_consolidation_holds_the_single_process_parameters_and_ids_and_no_adam_state(
    two_shards: list, single_process: dict, tmp_path: Path
) -> None:
    loaded = torch.load(
        consolidate_params(_checkpoint(two_shards, 5, ".dcp"), tmp_path, 5), map_location="cpu", weights_only=True
    )
    pipeline = loaded["pipeline"]
    for name, value in single_process["params"].items():
        assert torch.equal(pipeline[MODEL_PREFIX + "gauss_params." + name], value), name
    ids = pipeline[MODEL_EXTRA_KEY]["strategy_state"]["gauss_ids"]
    assert torch.equal(ids, single_process["strategy_state"]["gauss_ids"])
    assert loaded["optimizers"] == {} and loaded["distsplat"]["params_only"]
