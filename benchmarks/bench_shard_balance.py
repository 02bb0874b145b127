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

``python benchmarks/bench_shard_balance.py --out benchmarks/results/shard_balance_<date>.json``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_time_to_quality import SHARED_DATA, SIZES, RunSpec, _ns_train, _train_command
from distsplat_ns.parallel.shard_rows import SHARD_BOUND

WRAPPER = Path(__file__).resolve().parent / "ns_train_step_costs.py"


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
    command = _train_command(spec, SIZES["full"], out, data, "cpu", seed)
    command[command.index(_ns_train())] = str(WRAPPER)
    costs = out / f"{name}_steps.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DISTSPLAT_STEP_COSTS_OUT": str(costs), "DISTSPLAT_SHARD_BOUND": repr(bound)}
    print(f"[shard-balance] {name}: bound {bound}", flush=True)
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
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
        "forward_backward_s": [r["time_breakdown_s"]["forward"] + r["time_breakdown_s"]["backward"] for r in stats["per_rank_time_breakdown_s"]],
        "final_eval_psnr": stats["final_eval_psnr"],
        "train_wall_s": stats["wall_time_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bounds", type=float, nargs="+", default=[SHARD_BOUND, 1.01])
    parser.add_argument("--repeats", type=int, default=1, help="runs per bound, alternated")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "bird")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs = []
    with TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for bound in args.bounds:
                runs.append(one_run(bound, f"bound{bound}_r{repeat}", Path(tmp), args.data, args.seed))
                print(json.dumps(runs[-1]["fit"]), flush=True)
    result = {
        "what": __doc__.splitlines()[0],
        "command": " ".join(sys.argv),
        "size": SIZES["full"].__dict__,
        "data": str(args.data),
        "loadavg_at_end": os.getloadavg(),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"[shard-balance] wrote {args.out}")


if __name__ == "__main__":
    main()
