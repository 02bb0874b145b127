"""Replicated vs sharded training on a real scene densified to >= 100k Gaussians (CPU, gloo).

1. Densify: one replicated process trains the shipped scene (scenes/lund_door) with splatfacto's
   densification made eager (refine every 8 images, gradient threshold 1e-4, no opacity reset)
   until a checkpoint holds at least ``--min-gaussians``.
2. Measure: from that checkpoint, ``ns-train distsplat --load-dir`` runs ``--steps`` more steps
   with densification over (so every run holds the same Gaussians), in each mode on W = 1 and 2
   processes (torchrun, gloo) at B = W, and at B = 1 on 2 processes. Each run's
   ``distsplat_stats.json`` gives, per rank, the parameter and Adam-state bytes, the peak RSS and
   the bytes communicated per step (replicated: the gradient all-reduce payload; sharded: the
   screen-space rows and their gradients that left the rank), and the step time.
3. Ratios from the same run set, against the issue's targets: per-rank model bytes of sharded
   W = 2 over one process (<= 0.55) and bytes moved per step, sharded over replicated on 2
   processes at B <= W (<= 0.25).

Usage (repository root): python -m benchmarks.bench_sharded [--steps 4]
Writes benchmarks/results/bench_sharded.json.

``--memory`` (issue 18, "What must be shown"): memory, eval and save at scale instead. The shipped
scene with splatfacto's random initialisation of ``--num-random`` Gaussians (densification off:
every run holds the same N), B = ``--batch`` images a step, ``--steps`` steps, the final eval over
the held-out images and a save, run through ``python -m benchmarks.bench_sharded_memory ns-train``
(which times each save, and after the summary the gathered save on the same model): replicated W = 1 and
sharded W = 2 (``--with-replicated-w2``: replicated W = 2 too), and the same at ``--base-random``
Gaussians for each process's fixed base RSS. Peak RSS is ``ru_maxrss`` of each rank's process
(``trainer/run_record.py``; children, the image-decoding workers, excluded). Writes
benchmarks/results/bench_sharded_memory.json; docs/sharded.md reads it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    RESULTS,
    child_env,
    colmap_args,
    finish_machine_record,
    machine_record,
    run_command,
    train_command,
    unattended_args,
    write_json,
)

SCENE = REPO / "scenes" / "lund_door"
DATA = colmap_args(SCENE)
# Every run: the step-0 and final evals over the held-out images, and the end-of-run save only.
COMMON = ["--machine.device-type", "cpu", *unattended_args(eval_at_step_0=True)]
DENSIFY = [
    "--pipeline.model.warmup-length",
    "8",
    "--pipeline.model.refine-every",
    "8",
    "--pipeline.model.densify-grad-thresh",
    "0.0001",
    "--pipeline.model.reset-alpha-every",
    "1000",
    "--pipeline.model.num-downscales",
    "0",
]


def ns_train_run(
    out: Path, name: str, images: int, world: int, extra: list[str], timeout: float, module: str | None = None
) -> dict[str, Any]:
    """One ``ns-train distsplat`` run on ``world`` ranks (``module``: ``python -m MODULE ns-train
    ...``, a benchmark's wrapper of ns-train, in its place); returns its ``distsplat_stats.json``
    with ``command_wall_s``."""
    args = [
        "distsplat",
        "--output-dir",
        str(out),
        "--experiment-name",
        "bench",
        "--timestamp",
        name,
        "--max-num-iterations",
        str(images),
        *COMMON,
        *extra,
        *DATA,
    ]
    cmd = train_command(["ns-train", *args] if module is not None else args, world_size=world, module=module)
    t0 = time.perf_counter()
    run_command(cmd, name=name, env=child_env(), timeout=timeout)
    stats = json.loads((out / "bench" / "distsplat" / name / "distsplat_stats.json").read_text())
    stats["command_wall_s"] = time.perf_counter() - t0
    return stats


def _checkpoint_dir(out: Path, name: str) -> Path:
    return out / "bench" / "distsplat" / name / "nerfstudio_models"


def densify(out: Path, min_gaussians: int, max_images: int) -> dict[str, Any]:
    """Train replicated on one process until the final checkpoint holds >= ``min_gaussians``."""
    stats = ns_train_run(out, "densify", max_images, 1, DENSIFY, timeout=3600)
    if stats["final_gaussian_count"] < min_gaussians:
        raise RuntimeError(
            f"densification reached {stats['final_gaussian_count']} Gaussians < {min_gaussians}; raise --densify-images"
        )
    return stats


def measure(out: Path, ckpt: Path, start_step: int, mode: str, world: int, batch: int, steps: int) -> dict[str, Any]:
    name = f"{mode}_w{world}_b{batch}"
    # Resume at step start_step + 1; run `steps` steps of B images; densification is over
    # (--pipeline.model.stop-split-at 0), so no run changes the Gaussians it measures.
    images = (start_step + 1 + steps) * batch
    extra = [
        *DENSIFY,
        "--pipeline.parallel",
        mode,
        "--pipeline.batch-size",
        str(batch),
        "--load-dir",
        str(ckpt),
        "--pipeline.model.stop-split-at",
        "0",
        "--load-scheduler",
        "False",
    ]
    stats = ns_train_run(out, name, images, world, extra, timeout=3600)
    per_rank = stats["per_rank"]
    return {
        "mode": mode,
        "world_size": world,
        "batch_size": batch,
        "steps": stats["steps"],
        "gaussians": stats["final_gaussian_count"],
        "step_time_s": stats["wall_time_s"] / max(stats["steps"], 1),
        "model_bytes_per_rank": [r["parameter_bytes"] + r["optimizer_state_bytes"] for r in per_rank],
        "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in per_rank],
        "bytes_moved_per_step_per_rank": [r["bytes_communicated_mean_per_step"] for r in per_rank],
        "local_gaussians_per_rank": [r["local_gaussian_count"] for r in per_rank],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-gaussians", type=int, default=100_000)
    parser.add_argument("--densify-images", type=int, default=120)
    parser.add_argument("--steps", type=int, default=4, help="measured steps per run")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_sharded"))
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/bench_sharded[_memory].json")
    parser.add_argument(
        "--memory", action="store_true", help="memory, eval and save at --num-random Gaussians (see above)"
    )
    parser.add_argument("--num-random", type=int, default=2_000_000, help="--memory: Gaussians (random initialisation)")
    parser.add_argument("--base-random", type=int, default=1_000, help="--memory: Gaussians of the base-RSS runs")
    parser.add_argument("--batch", type=int, default=2, help="--memory: images per step, every run")
    parser.add_argument("--with-replicated-w2", action="store_true", help="--memory: replicated W = 2 too")
    parser.add_argument(
        "--reanalyse",
        type=Path,
        default=None,
        help="--memory's JSON: recompute its targets and formula check from its runs, rewrite it",
    )
    args = parser.parse_args()
    if args.reanalyse is not None:
        from benchmarks.bench_sharded_memory import reanalyse

        args.reanalyse.write_text(json.dumps(reanalyse(args.reanalyse), indent=2))
        return
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    if args.memory:
        from benchmarks.bench_sharded_memory import memory_benchmark

        result = memory_benchmark(args, ns_train_run)
        write_json(args.out or RESULTS / "bench_sharded_memory.json", result)
        print(json.dumps(result["targets"], indent=2))
        return
    args.out = args.out or RESULTS / "bench_sharded.json"
    machine = machine_record()
    dense = densify(args.work, args.min_gaussians, args.densify_images)
    ckpt = _checkpoint_dir(args.work, "densify")
    (found,) = sorted(ckpt.glob("step-*.ckpt"))[-1:]
    start_step = int(found.stem.split("-")[1])
    runs = [
        measure(args.work, ckpt, start_step, mode, world, batch, args.steps)
        for mode in ("replicated", "sharded")
        for world, batch in ((1, 1), (2, 2), (2, 1))
    ]
    by = {(r["mode"], r["world_size"], r["batch_size"]): r for r in runs}
    one = by[("replicated", 1, 1)]
    ratios = {
        "sharded_w2_model_bytes_max_rank_over_one_process": max(by[("sharded", 2, 2)]["model_bytes_per_rank"])
        / one["model_bytes_per_rank"][0],
        "target_model_bytes": 0.55,
    }
    for batch in (1, 2):
        rep, sh = by[("replicated", 2, batch)], by[("sharded", 2, batch)]
        ratios[f"w2_b{batch}_bytes_moved_sharded_over_replicated"] = max(sh["bytes_moved_per_step_per_rank"]) / max(
            rep["bytes_moved_per_step_per_rank"]
        )
        ratios[f"w2_b{batch}_step_time_sharded_over_replicated"] = sh["step_time_s"] / rep["step_time_s"]
    ratios["target_bytes_moved_at_b_le_w"] = 0.25
    result = {
        "command": "python -m benchmarks.bench_sharded " + " ".join(sys.argv[1:]),
        "scene": "scenes/lund_door",
        "densified_gaussians": dense["final_gaussian_count"],
        "densify_images": args.densify_images,
        "machine": finish_machine_record(machine),
        "runs": runs,
        "ratios": ratios,
    }
    write_json(args.out, result)
    print(json.dumps(ratios, indent=2))
    for r in runs:
        print(
            f"{r['mode']:>10} W={r['world_size']} B={r['batch_size']}: {r['gaussians']} Gaussians, "
            f"model bytes/rank {r['model_bytes_per_rank']}, moved/step/rank {[round(b) for b in r['bytes_moved_per_step_per_rank']]}, "
            f"step {r['step_time_s']:.2f} s"
        )


if __name__ == "__main__":
    main()
