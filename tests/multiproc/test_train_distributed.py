"""ns-train distsplat on 2 CPU processes (torchrun, gloo): same result as one process, faults, resume."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import torch

from tests.helpers.equivalence import EQUIV_EXTRA, assert_same_model
from tests.helpers.multiproc import free_port
from tests.helpers.ns_train_patched import patched_ns_train
from tests.helpers.nsrun import (
    cpu_env,
    latest_checkpoint,
    load_gauss_ids,
    load_gauss_params,
    ns_bin,
    read_stats,
    run_dir,
    run_ns_train,
    run_torchrun,
    train_args,
)

pytestmark = pytest.mark.slow


def test_two_processes_densify_to_the_same_gaussian_count(one_process_run: Path, two_process_run: Path) -> None:
    one = load_gauss_params(latest_checkpoint(one_process_run, "one"))
    two = load_gauss_params(latest_checkpoint(two_process_run, "two"))
    start = read_stats(one_process_run, "one")
    assert start["steps"] == 50 and read_stats(two_process_run, "two")["world_size"] == 2
    assert one["means"].shape == two["means"].shape
    assert one["means"].shape[0] != 11384, "no refine event changed the Gaussian count: the test lost its point"
    # Same ids in the same order: every grow and prune decision of the 3 refine events was the
    # same (an id names the parent and the event that made it), not only their number.
    assert torch.equal(
        load_gauss_ids(latest_checkpoint(one_process_run, "one")),
        load_gauss_ids(latest_checkpoint(two_process_run, "two")),
    )


def test_two_processes_match_one_process_parameters(one_process_run: Path, two_process_run: Path) -> None:
    one = load_gauss_params(latest_checkpoint(one_process_run, "one"))
    two = load_gauss_params(latest_checkpoint(two_process_run, "two"))
    assert_same_model(one, two)


def test_two_process_run_kept_replicas_bitwise_identical(two_process_run: Path) -> None:
    # --pipeline.replica-check-every 1 fails the run on any bit of drift; it completed.
    stats = read_stats(two_process_run, "two")
    assert stats["steps"] == 50
    assert len(stats["per_rank_time_breakdown_s"]) == 2


def test_resume_on_a_different_world_size(tmp_path: Path, two_process_run: Path) -> None:
    ckpt_dir = run_dir(two_process_run, "two") / "nerfstudio_models"
    extra = [e for e in EQUIV_EXTRA]
    run_ns_train(tmp_path, "onto-one", 110, extra=[*extra, "--load-dir", str(ckpt_dir)])
    stats = read_stats(tmp_path, "onto-one")
    assert stats["steps"] == 5 and stats["world_size"] == 1
    assert latest_checkpoint(tmp_path, "onto-one").name == "step-000000054.ckpt"


def test_resume_on_the_same_world_size(tmp_path: Path, two_process_run: Path) -> None:
    ckpt_dir = run_dir(two_process_run, "two") / "nerfstudio_models"
    run_torchrun(tmp_path, "again", 110, 2, extra=[*EQUIV_EXTRA, "--load-dir", str(ckpt_dir)])
    assert read_stats(tmp_path, "again")["steps"] == 5


@pytest.mark.long
def test_nonfinite_gradient_on_one_rank_stops_every_rank_and_keeps_the_last_checkpoint(tmp_path: Path) -> None:
    # A NaN in rank 1's local gradient at step 12 (through the pipeline's test hook).
    proc = run_torchrun(
        tmp_path,
        "nan",
        40,
        2,
        check=False,
        program=patched_ns_train("fault=12,1"),
        extra=["--steps-per-save", "5", "--steps-per-eval-all-images", "1000"],
    )
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "non-finite gradient at step 12" in text
    assert "rank 0" in text and "rank 1" in text, "both ranks must report the same failure"
    assert latest_checkpoint(tmp_path, "nan").name == "step-000000010.ckpt"


def test_two_node_rendezvous_over_loopback(tmp_path: Path) -> None:
    port = free_port()
    common = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "it2node",
    ]
    env = cpu_env()
    env["OMP_NUM_THREADS"] = "1"
    args = train_args(tmp_path, "twonode", 6, extra=["--steps-per-eval-all-images", "1000"])
    nodes = [
        subprocess.Popen(
            [ns_bin("torchrun"), *common, "--node-rank", str(r), ns_bin("ns-train"), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
        )
        for r in (0, 1)
    ]
    outputs = [n.communicate(timeout=600)[0] for n in nodes]
    assert all(n.returncode == 0 for n in nodes), outputs[0][-3000:] + outputs[1][-3000:]
    assert read_stats(tmp_path, "twonode")["world_size"] == 2


def _worker_processes(root: psutil.Process) -> list[psutil.Process]:
    workers = []
    for child in root.children(recursive=True):
        try:
            env = child.environ()
            if "RANK" in env and "ns-train" in " ".join(child.cmdline()) and child.ppid() == root.pid:
                workers.append(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return workers


@pytest.mark.long
@pytest.mark.parametrize("parallel", ["replicated", "sharded"])
def test_killed_rank_ends_the_run_within_the_timeout_and_leaves_no_process(tmp_path: Path, parallel: str) -> None:
    env = cpu_env()
    env["OMP_NUM_THREADS"] = "1"
    extra = ["--collective-timeout-s", "30", "--steps-per-eval-all-images", "100000", "--pipeline.parallel", parallel]
    cmd = [
        ns_bin("torchrun"),
        "--nproc_per_node",
        "2",
        ns_bin("ns-train"),
        *train_args(tmp_path, "kill", 100000, extra=extra),
    ]
    root = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True
    )
    proc = psutil.Process(root.pid)
    try:
        deadline = time.time() + 300
        victims: list[psutil.Process] = []
        while time.time() < deadline:
            victims = [p for p in _worker_processes(proc) if p.environ().get("RANK") == "1"]
            if victims and (run_dir(tmp_path, "kill") / "config.yml").exists():
                time.sleep(20)  # let it train a few steps
                break
            time.sleep(1)
        assert victims, "rank 1 never started"
        everything = [proc, *proc.children(recursive=True)]
        victims[0].send_signal(signal.SIGKILL)
        t0 = time.time()
        root.communicate(timeout=120)
        assert root.returncode != 0
        assert time.time() - t0 < 60, (
            "the surviving rank must end well within the 30 s collective timeout plus teardown"
        )
        time.sleep(2)
        alive = [p for p in everything if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        assert not alive, f"processes left behind: {alive}"
    finally:
        if root.poll() is None:
            os.killpg(root.pid, signal.SIGKILL)


def test_balanced_and_whole_image_partitions_train_the_same_model(tmp_path: Path, two_process_run: Path) -> None:
    run_torchrun(tmp_path, "whole", 100, 2, extra=[*EQUIV_EXTRA, "--pipeline.partition", "whole-images"])
    balanced = load_gauss_params(latest_checkpoint(two_process_run, "two"))
    whole = load_gauss_params(latest_checkpoint(tmp_path, "whole"))
    assert read_stats(two_process_run, "two")["balance"]["partition"] == "balanced"
    assert balanced["means"].shape == whole["means"].shape
    assert_same_model(balanced, whole)
