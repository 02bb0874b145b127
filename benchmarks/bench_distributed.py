"""Train the same scene for the same images on 1 and 2 CPU processes; print both runs side by side.

Reports, from each run's distsplat_stats.json (measured in the run, not here): images/s, the
per-rank time breakdown (data wait, forward, backward, all-reduce, optimizer, densify), and the
bytes all-reduced per step against the parameter bytes (parameter count x 4). On the 2-core
development machine the two processes share the cores, so wall-clock speed-up is not the point:
the communication volume and the time breakdown are.

Usage:
  python benchmarks/bench_distributed.py [--images 200] [--batch-size 2] [--out DIR]
      [--data scenes/lund_door] [--dataparser colmap] [-- extra ns-train args]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _dataparser_args(args: argparse.Namespace) -> list[str]:
    if args.dataparser == "colmap":
        return ["colmap", "--data", str(args.data), "--colmap-path", "sparse/0", "--load-3D-points", "True", "--downscale-factor", "1"]
    return [args.dataparser, "--data", str(args.data)]


def _train(out: Path, name: str, nproc: int, args: argparse.Namespace, extra: list[str]) -> dict:
    train = [
        str(BIN / "ns-train"),
        "distsplat",
        "--output-dir",
        str(out),
        "--experiment-name",
        "bench",
        "--timestamp",
        name,
        "--machine.device-type",
        "cpu",
        "--max-num-iterations",
        str(args.images),
        "--pipeline.batch-size",
        str(args.batch_size),
        "--steps-per-eval-all-images",
        "1000000",
        "--vis",
        "tensorboard",
        "--viewer.quit-on-train-completion",
        "True",
        "--logging.local-writer.enable",
        "False",
        *extra,
        *_dataparser_args(args),
    ]
    cmd = train if nproc == 1 else [str(BIN / "torchrun"), "--nproc_per_node", str(nproc), *train]
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"error: the {nproc}-process run failed:\n{proc.stderr[-4000:]}")
    stats = json.loads((out / "bench" / "distsplat" / name / "distsplat_stats.json").read_text())
    steps = max(stats["steps"], 1)
    return {
        "processes": nproc,
        "images": stats["images_trained"],
        "steps": stats["steps"],
        "images_per_s": stats["images_per_s"],
        "command_wall_s": wall,
        "train_wall_s": stats["wall_time_s"],
        "time_per_step_s_by_phase_rank0": {k: v / steps for k, v in stats["time_breakdown_s"].items()},
        "time_per_step_s_by_phase_per_rank": [{k: v / steps for k, v in r["time_breakdown_s"].items()} for r in stats["per_rank_time_breakdown_s"]],
        "bytes_all_reduced_per_step": stats["bytes_communicated_per_step"],
        "parameter_bytes": stats["parameter_bytes"],
        "all_reduce_bytes_over_parameter_bytes": stats["bytes_communicated_per_step"] / max(stats["parameter_bytes"], 1),
        "final_gaussian_count": stats["final_gaussian_count"],
        "balance": stats.get("balance"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200, help="training images per run (both runs)")
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--data", type=Path, default=REPO / "scenes" / "lund_door")
    parser.add_argument("--dataparser", default="colmap")
    parser.add_argument("--out", type=Path, default=None, help="keep the runs here (default: a temporary folder)")
    parser.add_argument("extra", nargs="*", help="extra ns-train arguments (after --)")
    args = parser.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="bench_distributed_"))
    try:
        one = _train(out, "one", 1, args, args.extra)
        two = _train(out, "two", 2, args, args.extra)
    finally:
        if args.out is None:
            shutil.rmtree(out, ignore_errors=True)
    result = {
        "benchmark": "bench_distributed",
        "scene": str(args.data),
        "batch_size": args.batch_size,
        "images": args.images,
        "cpu_count": os.cpu_count(),
        "runs": [one, two],
        "images_per_s_ratio_2_over_1": two["images_per_s"] / max(one["images_per_s"], 1e-12),
    }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
