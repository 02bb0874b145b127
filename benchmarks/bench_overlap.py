"""Issue 28 items 1 and 2 on CPU: step time at W = 2 before and after, and the optimizer step alone.

Two measurements, one JSON file:

* ``training``: the same ``ns-train distsplat`` run (W = 2 ranks, replicated, B = 2, one core per
  rank, the full size of ``bench_time_to_quality.py``'s bird scene at 1/6 resolution, refinement
  included) with the package of each given tree -- by default the commit before issue 28
  (``--before``), the fused optimizer step alone (``--middle``), and the working tree -- run
  interleaved ``--repeats`` times. Reported per tree: the median step time over steps after the
  first ``--skip`` (rank 0's nerfstudio ``ITER_TRAIN_TIME``, as in ``bench_time_to_quality.py``),
  each rank's phase totals per step and, for trees that measure it, each rank's exposed
  communication per step (``exposed_comm_mean_per_step_s`` of the run summary); and the ratio of
  each tree's median to the first tree's, repeat by repeat (the machine's load changes slowly, so
  a ratio within one repeat is steadier than either time).
* ``optimizer``: one optimizer step over splatfacto's Gaussian groups (``--gaussians`` rows, SH
  degree 3, float32) with nerfstudio's ``Optimizers`` (one ``torch.optim.Adam`` step per group)
  against ``optimizer_step.py:FusedAdamOptimizers`` in this process: the median time of a step
  and the ATen operators it dispatches (on a GPU each is about one kernel launch).

The trees other than the working tree are exported with ``git archive`` into a temporary folder
and put first on ``PYTHONPATH`` (the installed ``distsplat_ns`` is then not imported).

Usage:
  PYTHONPATH=$PWD python benchmarks/bench_overlap.py [--repeats 2] [--images 200]
      [--before c046a60 --middle f12badd] [--out benchmarks/results/overlap_<date>.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_time_to_quality as ttq


def export_tree(commit: str, into: Path) -> Path:
    """``commit``'s files in ``into/<commit>`` (``git archive``)."""
    folder = into / commit
    folder.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    return folder


def train_once(tree: Path, name: str, out: Path, data: Path, images: int, skip: int) -> dict[str, Any]:
    """One W = 2, B = 2 replicated run with ``tree``'s package; its step times and summary."""
    spec = ttq.RunSpec(name, 2, "replicated", 2)
    size = ttq.Size(downscale=6, images=images, every=images, warmup=images // 4, refine_every=images // 4)
    cmd = ttq._train_command(spec, size, out, data, "cpu", 42)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=str(tree))
    load_before = ttq._loadavg()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"error: run {name} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    run_dir = out / "ttq" / "distsplat" / name
    stats = json.loads((run_dir / "distsplat_stats.json").read_text())
    step_times = ttq._step_times(run_dir)
    timed = [t for s, t in sorted(step_times.items()) if s >= skip]
    steps = max(stats["steps"], 1)
    return {
        "median_step_s": statistics.median(timed),
        "mean_step_s": statistics.fmean(timed),
        "steps_timed": len(timed),
        "loadavg_before": load_before,
        "loadavg_after": ttq._loadavg(),
        "final_gaussian_count": stats.get("final_gaussian_count"),
        "per_rank_phase_s_per_step": [{k: v / steps for k, v in r["time_breakdown_s"].items()} for r in stats["per_rank_time_breakdown_s"]],
        "per_rank_exposed_comm_s_per_step": [r.get("exposed_comm_mean_per_step_s") for r in stats.get("per_rank", [])],
    }


def training(trees: dict[str, Path], repeats: int, images: int, skip: int, data: Path, work: Path) -> dict[str, Any]:
    """Every tree ``repeats`` times, interleaved; the ratios to the first tree per repeat."""
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
    for r in range(repeats):
        for label, tree in trees.items():
            print(f"[overlap] repeat {r}: {label}", flush=True)
            runs[label].append(train_once(tree, f"{label}_{r}", work / f"{label}_{r}", data, images, skip))
    first = next(iter(trees))
    ratios = {label: [b["median_step_s"] / a["median_step_s"] for a, b in zip(runs[first], runs[label], strict=True)] for label in trees}
    return {
        "runs": runs,
        "median_step_s": {label: statistics.median(x["median_step_s"] for x in runs[label]) for label in trees},
        "ratio_to_first_per_repeat": ratios,
        "ratio_to_first_median": {label: statistics.median(v) for label, v in ratios.items()},
    }


def optimizer(num_gaussians: int, repeats: int) -> dict[str, Any]:
    """nerfstudio's per-group Adam steps against the fused step: seconds and ATen operators per step."""
    import torch
    from nerfstudio.engine.optimizers import Optimizers
    from torch.utils._python_dispatch import TorchDispatchMode

    from distsplat_ns.optimizer_step import FusedAdamOptimizers
    from distsplat_ns.registry import distsplat_trainer_config

    torch.set_num_threads(1)
    shapes = {"means": (3,), "features_dc": (3,), "features_rest": (15, 3), "opacities": (1,), "scales": (3,), "quats": (4,)}
    configs = {k: v for k, v in distsplat_trainer_config().optimizers.items() if k in shapes}

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.count += 1
            return func(*args, **(kwargs or {}))

    def build(cls: type) -> Any:
        generator = torch.Generator().manual_seed(0)
        groups = {k: [torch.nn.Parameter(torch.randn(num_gaussians, *s, generator=generator))] for k, s in shapes.items()}
        optimizers = cls(configs, groups)
        for params in groups.values():
            params[0].grad = torch.randn(params[0].shape, generator=generator)
        optimizers.optimizer_step_all()  # creates Adam's state
        return optimizers

    result: dict[str, Any] = {"num_gaussians": num_gaussians, "groups": list(shapes)}
    built = {"per_group_adam": build(Optimizers), "fused": build(FusedAdamOptimizers)}
    times: dict[str, list[float]] = {k: [] for k in built}
    for _ in range(repeats):
        for label, optimizers in built.items():
            start = time.perf_counter()
            optimizers.optimizer_step_all()
            times[label].append(time.perf_counter() - start)
    for label, optimizers in built.items():
        counter = CountOps()
        with counter:
            optimizers.optimizer_step_all()
        result[label] = {"median_step_s": statistics.median(times[label]), "aten_ops_per_step": counter.count}
    result["fused_over_per_group_time"] = result["fused"]["median_step_s"] / result["per_group_adam"]["median_step_s"]
    a, b = built["per_group_adam"].optimizers, built["fused"].optimizers
    result["parameters_bitwise_equal_after_all_steps"] = all(
        torch.equal(a[k].param_groups[0]["params"][0], b[k].param_groups[0]["params"][0]) for k in shapes
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="interleaved repetitions of every training run")
    parser.add_argument("--images", type=int, default=200, help="training images per run (100 steps at B = 2)")
    parser.add_argument("--skip", type=int, default=5, help="first steps left out of the step times")
    parser.add_argument("--before", default="c046a60", help="the tree before issue 28 (a commit)")
    parser.add_argument("--middle", default="f12badd", help="the fused optimizer step alone (a commit; '' for none)")
    parser.add_argument("--data", type=Path, default=ttq.SHARED_DATA / "bird")
    parser.add_argument("--gaussians", type=int, default=200_000, help="rows of the optimizer measurement")
    parser.add_argument("--skip-training", action="store_true", help="only the optimizer measurement")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out = args.out or REPO / "benchmarks" / "results" / f"overlap_{datetime.date.today().isoformat()}.json"
    head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    dirty = bool(subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "distsplat_ns"], capture_output=True, text=True, check=True).stdout)
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "head": head,
        "working_tree_package_modified": dirty,
        "cpu_count": os.cpu_count(),
        "optimizer": optimizer(args.gaussians, 20),
    }
    print(json.dumps(result["optimizer"], indent=2), flush=True)
    if not args.skip_training:
        with tempfile.TemporaryDirectory(prefix="bench_overlap_") as tmp:
            work = Path(tmp)
            trees = {f"before_{args.before}": export_tree(args.before, work / "trees")}
            if args.middle:
                trees[f"fused_adam_{args.middle}"] = export_tree(args.middle, work / "trees")
            trees[f"worktree_{head}"] = REPO
            result["training"] = training(trees, args.repeats, args.images, args.skip, args.data, work / "runs")
            result["training"]["setup"] = {
                "world_size": 2,
                "parallel": "replicated",
                "batch_size": 2,
                "images": args.images,
                "scene": str(args.data),
                "downscale": 6,
                "cores": "one per rank (taskset 0,1; OMP_NUM_THREADS=1)",
            }
        print(json.dumps({k: result["training"][k] for k in ("median_step_s", "ratio_to_first_median")}, indent=2), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"[overlap] wrote {out}", flush=True)


if __name__ == "__main__":
    main()
