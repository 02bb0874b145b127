"""Shard balance and step time: how much slower a rank with a larger Gaussian shard renders.

Every rank of the sharded mode projects all of its Gaussians for every camera, so a rank holding
more Gaussians than the others does more per-Gaussian work; the balanced cut only evens out the
rows' tile work. This benchmark trains the time-to-quality full size (``bench_time_to_quality.py``,
W = 2, B = 2, sharded, one core per rank) once per rebalance bound, alternating the bounds, and
fits, over the steps after the first epoch, each step's relative render-time gap between rank 0
and rank 1 against their relative measured tile-work gap and band-count gap:

    (t0 - t1) / mean(t) = a * (w0 - w1) / mean(w) + b * (bands0 - bands1) + c

``c`` is rank 0's render-time excess at equal work and bands: what its larger or smaller shard
costs. Being a within-run difference between the two ranks, it does not move with the machine's
speed, which shifts whole runs by 20% here (docs/time_to_quality.md).

``python -m benchmarks.bench_shard_balance --out benchmarks/results/shard_balance_<date>.json``

Each run is ``python -m benchmarks.bench_shard_balance ns-train <ns-train arguments>`` under
torchrun (:func:`train_recording_step_costs`): ns-train that records, on rank 0, every step's
gathered balance figures. Its environment:

- ``DISTSPLAT_STEP_COSTS_OUT``: the JSON file rank 0 writes at exit: per step, each rank's render
  time (forward + backward, s), its measured tile work (the sum of its bands' row costs) and its
  number of bands, as every rank has them after the step's cost gather.
- ``DISTSPLAT_SHARD_BOUND`` (optional): the sharded mode's rebalance bound for this run
  (``parallel/shard_moves.py:SHARD_BOUND`` otherwise).
"""

from __future__ import annotations

import argparse
import atexit
import functools
import json
import os
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

from benchmarks.bench_time_to_quality import SIZES, RunSpec, train_args
from benchmarks.common import (
    SHARED_DATA,
    child_env,
    finish_machine_record,
    machine_record,
    run_command,
    train_command,
    write_json,
)
from distsplat_ns.parallel.shard_moves import SHARD_BOUND


def rank_gap_fit(steps: list[dict], skip: int) -> dict:
    """Least-squares fit of rank 0's relative render-time excess over rank 1 (two ranks) against
    the relative work gap, the band-count gap and a constant, over ``steps[skip:]``; the
    coefficients with their standard errors."""
    rows = steps[skip:]
    if len(rows) < 4 or any(len(s["render_s"]) != 2 for s in rows):
        raise ValueError(f"rank_gap_fit: need >= 4 steps of 2 ranks after {skip}, got {len(rows)}")
    t = np.array([s["render_s"] for s in rows], dtype=np.float64)
    w = np.array([s["work"] for s in rows], dtype=np.float64)
    b = np.array([s["bands"] for s in rows], dtype=np.float64)
    y = (t[:, 0] - t[:, 1]) / t.mean(1)
    x = np.stack([(w[:, 0] - w[:, 1]) / w.mean(1), b[:, 0] - b[:, 1], np.ones(len(rows))], axis=1)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    se = np.sqrt(resid @ resid / (len(rows) - 3) * np.diag(np.linalg.pinv(x.T @ x)))
    names = ("work_gap", "band_gap", "rank0_excess")
    return {
        **{n: float(c) for n, c in zip(names, coef, strict=True)},
        **{f"{n}_se": float(e) for n, e in zip(names, se, strict=True)},
        "steps_fitted": len(rows),
        "residual_sd": float(resid.std()),
        "render_s_mean": [float(v) for v in t.mean(0)],
    }


def one_run(bound: float, name: str, out: Path, data: Path, seed: int) -> dict:
    spec = RunSpec(name, 2, "sharded", 2)
    args = ["ns-train", *train_args(spec, SIZES["full"], out, data, "cpu", seed)]
    command = train_command(
        args, world_size=spec.world_size, module="benchmarks.bench_shard_balance", cores=range(spec.world_size)
    )
    costs = out / f"{name}_steps.json"
    env = child_env(DISTSPLAT_STEP_COSTS_OUT=str(costs), DISTSPLAT_SHARD_BOUND=repr(bound))
    print(f"[shard-balance] {name}: bound {bound}", flush=True)
    start = time.perf_counter()
    run_command(command, name=name, env=env)
    wall = time.perf_counter() - start
    stats = json.loads((out / "ttq" / "distsplat" / name / "distsplat_stats.json").read_text())
    skip = stats["balance"]["num_warmup_steps_excluded"]
    fit = rank_gap_fit(json.loads(costs.read_text()), skip)
    return {
        "name": name,
        "bound": bound,
        "command_wall_s": wall,
        "fit": fit,
        "time_imbalance_mean": stats["balance"]["time_imbalance_mean"],  # the run summary's, over the same steps
        "local_gaussian_counts": [r["local_gaussian_count"] for r in stats["per_rank"]],
        "exposed_comm_s": [r["time_breakdown_s"]["exposed_comm"] for r in stats["per_rank_time_breakdown_s"]],
        "forward_backward_s": [
            r["time_breakdown_s"]["forward"] + r["time_breakdown_s"]["backward"]
            for r in stats["per_rank_time_breakdown_s"]
        ],
        "final_eval_psnr": stats["final_eval_psnr"],
        "train_wall_s": stats["wall_time_s"],
    }


def train_recording_step_costs(ns_train_args: list[str]) -> None:
    """One rank of a run: ns-train with the step's cost gather (``pipeline/step_balance.py``'s
    ``gather_step_costs``) recording each step's figures (written by rank 0 at exit to
    ``DISTSPLAT_STEP_COSTS_OUT``)."""
    out = os.environ.get("DISTSPLAT_STEP_COSTS_OUT")
    if not out:
        raise SystemExit("error: bench_shard_balance ns-train needs DISTSPLAT_STEP_COSTS_OUT, the JSON file to write")
    from nerfstudio.scripts.train import entrypoint

    from distsplat_ns import pipeline_balance
    from distsplat_ns.parallel import sharded

    bound = os.environ.get("DISTSPLAT_SHARD_BOUND")
    if bound is not None:
        sharded.rebalance_shards_ = functools.partial(sharded.rebalance_shards_, bound=float(bound))
    steps: list[dict] = []
    gather = pipeline_balance.gather_step_costs

    def recording(*args, **kwargs):
        costs = gather(*args, **kwargs)
        steps.append(
            {
                "render_s": list(costs.render_s),
                "work": [sum(sum(row_costs) for _, _, row_costs in bands) for bands in costs.measured],
                "bands": [len(bands) for bands in costs.measured],
            }
        )
        return costs

    pipeline_balance.gather_step_costs = recording

    def write() -> None:
        if os.environ.get("RANK", "0") == "0":
            Path(out).write_text(json.dumps(steps))

    atexit.register(write)
    sys.argv = ["ns-train", *ns_train_args]
    entrypoint()


def main() -> None:
    if sys.argv[1:2] == ["ns-train"]:
        train_recording_step_costs(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bounds", type=float, nargs="+", default=[SHARD_BOUND, 1.01])
    parser.add_argument("--repeats", type=int, default=1, help="runs per bound, alternated")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "bird")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    machine = machine_record()
    runs = []
    with TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for bound in args.bounds:
                runs.append(one_run(bound, f"bound{bound}_r{repeat}", Path(tmp), args.data, args.seed))
                print(json.dumps(runs[-1]["fit"]), flush=True)
    result = {
        "what": __doc__.splitlines()[0],
        "command": " ".join(["python -m benchmarks.bench_shard_balance", *sys.argv[1:]]),
        "size": SIZES["full"].__dict__,
        "data": str(args.data),
        "machine": finish_machine_record(machine),
        "runs": runs,
    }
    write_json(args.out, result)
    print(f"[shard-balance] wrote {args.out}")


if __name__ == "__main__":
    main()
