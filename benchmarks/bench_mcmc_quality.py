"""Quality of MCMC densification: eval PSNR of ``distsplat-mcmc`` vs ``distsplat`` at B = 1, the
same images and flags, over several seeds (issue 19), and whether the MCMC run ever held more
Gaussians than its cap.

Each run: one process, CPU (reference rasterizer), ``OMP_NUM_THREADS=1``, ``ns-train <method>``
on a COLMAP scene at B = 1; the two methods of one seed see the same images in the same order
(``--machine.seed``) and get the same shortened densification schedule (``--warmup-length``,
``--refine-every``, in images) so that a short run has several events. At most ``--jobs`` runs at
a time. The eval PSNR is the trainer's own final evaluation over every held-out image
(``final_eval_psnr`` in distsplat_stats.json, nerfstudio's ``get_average_eval_image_metrics``).

The cap: ``--cap``, by default 1.2 x the scene's seed points: MCMC starts from the seed points,
never removes a Gaussian and adds 5% per event, so the four events of the default schedule
(1.05^4 = 1.2155) are stopped by the cap at the last one: the cap binds. (A cap equal to the
default strategy's final count, the same budget for both, cannot be honoured at this length: the
default strategy prunes below the seed points, bird's 6271 -> ~4800, measured 2026-12-01.)
The MCMC runs' counts after every event are read from their log lines ("MCMC
relocated ..., added ...: N Gaussians over all ranks (cap C)"; the count changes only at events).

Scene: /work/shared/data/bird (real capture, 184 phone-video frames 544x960 with COLMAP poses and
6271 points; MIT license of github.com/Michael-Yi-Rong/NeRF-Pytorch, see its PROVENANCE.txt),
decoded at 1/6 (90x160 px); nerfstudio's colmap dataparser holds out every 8th image (23 eval
images, 161 training). Writes one JSON file to benchmarks/results/ and prints it.

Usage: ``nice -n 10 python -m benchmarks.bench_mcmc_quality [--images 600] [--seeds 0 1 2] [--jobs 2]``
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import struct
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from benchmarks.common import (
    SHARED_DATA,
    child_env,
    colmap_args,
    finish_machine_record,
    machine_record,
    result_path,
    run_command,
    train_command,
    unattended_args,
    write_json,
)

EVENT = re.compile(r"MCMC relocated (\d+), added (\d+): (\d+) Gaussians over all ranks \(cap (\d+)\)")
VARIANTS = "distsplat-mcmc=distsplat_ns.registry:distsplat_mcmc,distsplat-big=distsplat_ns.registry:distsplat_big"
METHODS = ("distsplat", "distsplat-mcmc")


def train_args(method: str, seed: int, args: argparse.Namespace, out: Path, cap: int | None) -> list[str]:
    """The ns-train arguments of one run (method first)."""
    return [
        method,
        "--output-dir",
        str(out),
        "--experiment-name",
        "q",
        "--timestamp",
        f"{method}-{seed}",
        "--machine.device-type",
        "cpu",
        "--machine.seed",
        str(seed),
        "--max-num-iterations",
        str(args.images),
        "--pipeline.batch-size",
        "1",
        "--pipeline.model.num-downscales",
        "0",
        *unattended_args(eval_at_step_0=True),
        "--pipeline.model.warmup-length",
        str(args.warmup),
        "--pipeline.model.refine-every",
        str(args.refine_every),
        *(["--pipeline.model.max-gs-num", str(cap)] if cap is not None else []),
        *colmap_args(args.scene, args.downscale_factor),
    ]


def run(method: str, seed: int, args: argparse.Namespace, out: Path, cap: int | None) -> dict:
    cmd = train_command(train_args(method, seed, args, out, cap))
    start = time.perf_counter()
    proc = run_command(cmd, name=f"{method} seed {seed}", env=child_env(NERFSTUDIO_METHOD_CONFIGS=VARIANTS))
    stats = json.loads((out / "q" / method / f"{method}-{seed}" / "distsplat_stats.json").read_text())
    events = [[int(g) for g in m.groups()] for m in EVENT.finditer(proc.stdout + proc.stderr)]
    return {
        "method": method,
        "seed": seed,
        "cap": cap,
        "final_eval_psnr": stats["final_eval_psnr"],
        "final_gaussian_count": stats["final_gaussian_count"],
        "mcmc_events": [{"relocated": r, "added": a, "num_gaussians": n} for r, a, n, _ in events],
        "images_trained": stats.get("images_trained"),
        "train_wall_s": stats.get("wall_time_s"),
        "command_wall_s": round(time.perf_counter() - start, 1),
        "command": " ".join(cmd[1:]),
    }


def num_seed_points(scene: Path) -> int:
    """The COLMAP model's point count (``points3D.bin`` starts with it, uint64 little-endian)."""
    with open(scene / "sparse" / "0" / "points3D.bin", "rb") as f:
        return struct.unpack("<Q", f.read(8))[0]


def run_all(args: argparse.Namespace, out: Path, cap: int) -> list[dict]:
    """Every seed's two runs, at most ``--jobs`` at a time, a seed's pair queued together."""
    jobs = [(method, seed) for seed in args.seeds for method in METHODS]
    lock = threading.Lock()

    def one(method: str, seed: int) -> dict:
        result = run(method, seed, args, out, cap if method == "distsplat-mcmc" else None)
        with lock:
            print(json.dumps({k: v for k, v in result.items() if k != "command"}), file=sys.stderr, flush=True)
        return result

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        runs = list(pool.map(lambda job: one(*job), jobs))
    return sorted(runs, key=lambda r: (METHODS.index(r["method"]), r["seed"]))


def summarise(runs: list[dict]) -> dict:
    summary: dict = {}
    for method in METHODS:
        psnrs = [r["final_eval_psnr"] for r in runs if r["method"] == method]
        summary[method] = {
            "psnr_mean": statistics.mean(psnrs),
            "psnr_stdev": statistics.stdev(psnrs) if len(psnrs) > 1 else 0.0,
            "psnr_min": min(psnrs),
            "psnr_max": max(psnrs),
            "final_gaussian_count_mean": statistics.mean(
                r["final_gaussian_count"] for r in runs if r["method"] == method
            ),
        }
    mcmc = [r for r in runs if r["method"] == "distsplat-mcmc"]
    seen = [max([e["num_gaussians"] for e in r["mcmc_events"]] + [r["final_gaussian_count"]]) for r in mcmc]
    summary["distsplat-mcmc"]["max_gaussians_seen_per_seed"] = seen
    summary["distsplat-mcmc"]["cap_per_seed"] = [r["cap"] for r in mcmc]
    summary["distsplat-mcmc"]["cap_held"] = all(s <= r["cap"] for s, r in zip(seen, mcmc, strict=True))
    diffs = [
        m["final_eval_psnr"] - d["final_eval_psnr"]
        for d in runs
        if d["method"] == "distsplat"
        for m in mcmc
        if m["seed"] == d["seed"]
    ]
    summary["paired_difference_mcmc_minus_default_db"] = {
        "per_seed": diffs,
        "mean": statistics.mean(diffs),
        "stdev": statistics.stdev(diffs) if len(diffs) > 1 else 0.0,
    }
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", type=Path, default=SHARED_DATA / "bird")
    parser.add_argument(
        "--downscale-factor", type=int, default=6, help="colmap --downscale-factor: 6 = 90x160 px for bird"
    )
    parser.add_argument("--images", type=int, default=600, help="training images per run (B = 1: steps)")
    parser.add_argument("--warmup", type=int, default=100, help="images before the first densification event")
    parser.add_argument("--refine-every", type=int, default=100, help="images between events (both strategies)")
    parser.add_argument("--cap", type=int, default=None, help="MCMC max_gs_num; default: 1.2 x the seed points")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    args = parser.parse_args()
    machine = machine_record()
    start = time.perf_counter()
    num_seed = num_seed_points(args.scene)
    cap = args.cap if args.cap is not None else int(1.2 * num_seed)
    with tempfile.TemporaryDirectory() as tmp:
        runs = run_all(args, Path(tmp), cap)
    result = {
        "command": "python -m benchmarks.bench_mcmc_quality " + " ".join(sys.argv[1:]),
        "scene": args.scene.name,
        "downscale_factor": args.downscale_factor,
        "images": args.images,
        "batch_size": 1,
        "warmup_images": args.warmup,
        "refine_every_images": args.refine_every,
        "seeds": args.seeds,
        "num_seed_points": num_seed,
        "cap": cap,
        "cap_rule": "--cap"
        if args.cap is not None
        else "1.2 x the seed points (the default schedule's last event is clipped)",
        "runs_on": f"CPU, reference rasterizer, OMP_NUM_THREADS=1 per run, {args.jobs} runs at a time",
        "machine": finish_machine_record(machine),
        "total_wall_s": round(time.perf_counter() - start, 1),
        "summary": summarise(runs),
        "runs": runs,
    }
    write_json(result_path(f"mcmc_quality_{args.scene.name}"), result)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
