"""ns-train distsplat --pipeline.parallel sharded on 2 and 3 CPU processes: the decisions one
process makes, nerfstudio's checkpoint format, resume on any number of ranks in either mode."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from distsplat_ns.checkpoint import checkpoint_steps
from distsplat_ns.parallel.shard_moves import SHARD_BOUND
from tests.helpers.equivalence import EQUIV_EXTRA, assert_same_model
from tests.helpers.ns_train_patched import patched_ns_train
from tests.helpers.nsrun import latest_checkpoint, ns_bin, read_stats, run_dir, run_ns_train, run_torchrun
from tests.helpers.rows_by_id import checkpoint_rows_by_id

pytestmark = pytest.mark.slow

SHARDED = [*EQUIV_EXTRA, "--pipeline.parallel", "sharded"]


@pytest.fixture(scope="module")
def sharded_two_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sh2")
    run_torchrun(out, "sh2", 100, 2, extra=SHARDED)
    return out


@pytest.fixture(scope="module")
def sharded_three_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sh3")
    run_torchrun(out, "sh3", 100, 3, extra=SHARDED)
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_sharded_ranks_make_the_decisions_of_one_process(
    one_process_run: Path, world: int, request: pytest.FixtureRequest
) -> None:
    """float64, three refine events: the same Gaussians (by global id) as one replicated process,
    parameters within the 1-vs-2 tolerance of tests/helpers/equivalence.py."""
    one = checkpoint_rows_by_id(latest_checkpoint(one_process_run, "one"))
    # Only the run of this world size (the compat job runs [2] alone).
    name, fixture = {2: ("sh2", "sharded_two_run"), 3: ("sh3", "sharded_three_run")}[world]
    run = request.getfixturevalue(fixture)
    sharded = checkpoint_rows_by_id(latest_checkpoint(run, name))
    stats = read_stats(run, name)
    assert stats["steps"] == 50 and stats["world_size"] == world and stats["parallel"] == "sharded"
    assert one["means"].shape[0] != 11384, "no refine event changed the Gaussian count: the test lost its point"
    assert torch.equal(one["ids"], sharded["ids"])
    assert_same_model({k: v for k, v in one.items() if k != "ids"}, {k: v for k, v in sharded.items() if k != "ids"})
    # Every rank held a shard, and the shards add up to the model.
    local = [r["local_gaussian_count"] for r in stats["per_rank"]]
    assert sum(local) == one["means"].shape[0] and min(local) > 0
    assert max(local) <= SHARD_BOUND * sum(local) / world + 1


def test_sharded_equals_replicated_on_two_ranks(two_process_run: Path, sharded_two_run: Path) -> None:
    replicated = checkpoint_rows_by_id(latest_checkpoint(two_process_run, "two"))
    sharded = checkpoint_rows_by_id(latest_checkpoint(sharded_two_run, "sh2"))
    assert torch.equal(replicated["ids"], sharded["ids"])
    assert_same_model(
        {k: v for k, v in replicated.items() if k != "ids"}, {k: v for k, v in sharded.items() if k != "ids"}
    )


def test_sharded_rank_holds_half_the_model_and_moves_less_than_the_all_reduce(
    two_process_run: Path, sharded_two_run: Path
) -> None:
    replicated, sharded = read_stats(two_process_run, "two"), read_stats(sharded_two_run, "sh2")
    for rank in sharded["per_rank"]:
        assert rank["parameter_bytes"] < 0.6 * replicated["per_rank"][0]["parameter_bytes"]
        assert 0 < rank["bytes_communicated_mean_per_step"]


def test_resume_sharded_checkpoint_on_one_and_three_ranks_and_replicated(tmp_path: Path, sharded_two_run: Path) -> None:
    """Resumed at step 50 (a refine step) for 5 steps: sharded on 1 and 3 processes and replicated
    on 2 end with the same Gaussians (the refine at step 50 is W-independent)."""
    ckpt_dir = run_dir(sharded_two_run, "sh2") / "nerfstudio_models"
    resume = ["--load-dir", str(ckpt_dir)]
    run_ns_train(tmp_path, "sh-one", 110, extra=[*SHARDED, *resume])
    run_torchrun(tmp_path, "sh-three", 110, 3, extra=[*SHARDED, *resume])
    run_torchrun(tmp_path, "rep-two", 110, 2, extra=[*EQUIV_EXTRA, *resume])
    results = {
        name: checkpoint_rows_by_id(latest_checkpoint(tmp_path, name)) for name in ("sh-one", "sh-three", "rep-two")
    }
    for name in results:
        assert read_stats(tmp_path, name)["steps"] == 5
    assert torch.equal(results["sh-one"]["ids"], results["sh-three"]["ids"])
    assert torch.equal(results["sh-one"]["ids"], results["rep-two"]["ids"])
    start = checkpoint_rows_by_id(latest_checkpoint(sharded_two_run, "sh2"))
    assert results["sh-one"]["means"].shape[0] != start["means"].shape[0], "step 50 refined nothing"


def test_ns_export_and_ns_eval_read_a_sharded_checkpoint(tmp_path: Path, sharded_two_run: Path) -> None:
    from plyfile import PlyData

    config = run_dir(sharded_two_run, "sh2") / "config.yml"
    subprocess.run(
        [ns_bin("ns-export"), "gaussian-splat", "--load-config", str(config), "--output-dir", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    vertex = PlyData.read(str(tmp_path / "splat.ply"))["vertex"]
    assert vertex.count == checkpoint_rows_by_id(latest_checkpoint(sharded_two_run, "sh2"))["means"].shape[0]
    target = tmp_path / "eval.json"
    subprocess.run(
        [ns_bin("ns-eval"), "--load-config", str(config), "--output-path", str(target)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    assert target.exists()
    stats = read_stats(sharded_two_run, "sh2")
    for rank, figures in enumerate(stats["per_rank"]):
        assert figures["rank"] == rank and figures["checkpoint_bytes_written"] > 0 and figures["peak_memory_bytes"] > 0


@pytest.mark.long
def test_nonfinite_gradient_on_one_shard_stops_every_rank_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    """Only rank 1 holds the NaN (no all-reduce spreads it in sharded mode): the ranks agree on the
    verdict and stop at the same step; the last gathered checkpoint stays."""
    proc = run_torchrun(
        tmp_path,
        "nan",
        40,
        2,
        check=False,
        program=patched_ns_train("fault=12,1"),
        extra=["--pipeline.parallel", "sharded", "--steps-per-save", "5", "--steps-per-eval-all-images", "1000"],
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "non-finite gradient at step 12 (parameters means)" in text
    assert "non-finite gradient at step 12 (on another rank)" in text
    # A failed run writes no consolidation: its last checkpoint is the shards' folder.
    assert checkpoint_steps(run_dir(tmp_path, "nan") / "nerfstudio_models")[-1] == 10
