"""Quality against batch size: eval PSNR of ``ns-train distsplat`` at B = 1, 4, 8, 16 images per
step, the same number of images, over several seeds (issue 28, item 4).

Each run: one process, CPU (reference rasterizer), ``OMP_NUM_THREADS=1``, ``--pipeline.batch-size
B`` at W = 1 (the model B images per step trains does not depend on W: docs/distributed.md, "Batch
size"; 1 = W is tested in float64). Every schedule counts images, and the optimizer takes
Grendel-GS's sqrt(B) rule, so only B differs between the runs of one seed. The eval PSNR is the
trainer's own final evaluation over every held-out image (``final_eval_psnr`` in
distsplat_stats.json, nerfstudio's ``get_average_eval_image_metrics``). At most ``--jobs`` runs
at a time, one thread each.

Reported per B: eval PSNR mean and sample standard deviation over the seeds, the gap of the means
to B = 1, and the per-seed paired gaps (B minus B = 1 of the same seed) with their mean and s.d.;
the final Gaussian count, since densification is where B can change the model most.

Scene: ../shared/data/bird (real capture, 184 phone-video frames 544x960 with COLMAP poses and
points; MIT license of github.com/Michael-Yi-Rong/NeRF-Pytorch, see its PROVENANCE.txt), decoded
at 1/``--downscale-factor``; nerfstudio's colmap dataparser holds out every 8th image (23 eval
images, 161 training). The schedule is splatfacto's (warm-up 500 images, refine every 100, opacity
reset every 3000) unless ``--warmup`` / ``--refine-every`` / ``--reset-alpha-every`` change it.

Usage: ``nice -n 10 python -m benchmarks.bench_batch_quality [--images 3000] [--batch-sizes 1 4 8 16] [--seeds 0 1 2]``
Writes benchmarks/results/batch_quality_<scene>_<date>.json after every finished run ("complete"
false until the last), and at the end prints its summary as a table. ``--resume FILE`` continues a
study cut short: it keeps FILE's finished runs (its settings must be the same), trains only the
missing (B, seed) pairs and rewrites FILE, recording every invocation in ``"commands"``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
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
)


def train_args(batch_size: int, seed: int, args: argparse.Namespace, out: Path) -> list[str]:
    """The ns-train arguments of one run (method first)."""
    return [
        "distsplat",
        "--output-dir",
        str(out),
        "--experiment-name",
        "b",
        "--timestamp",
        f"b{batch_size}-s{seed}",
        "--machine.device-type",
        "cpu",
        "--machine.seed",
        str(seed),
        "--max-num-iterations",
        str(args.images),
        "--pipeline.batch-size",
        str(batch_size),
        "--pipeline.model.num-downscales",
        "0",
        *unattended_args(eval_at_step_0=True),
        "--pipeline.model.warmup-length",
        str(args.warmup),
        "--pipeline.model.refine-every",
        str(args.refine_every),
        "--pipeline.model.reset-alpha-every",
        str(args.reset_alpha_every),
        *colmap_args(args.scene, args.downscale_factor),
    ]


def train(batch_size: int, seed: int, args: argparse.Namespace, out: Path) -> dict:
    """One run of ``ns-train distsplat``; its final eval PSNR and Gaussian count."""
    cmd = train_command(train_args(batch_size, seed, args, out))
    start = time.perf_counter()
    run_command(cmd, name=f"B = {batch_size} seed {seed}", env=child_env())
    stats = json.loads((out / "b" / "distsplat" / f"b{batch_size}-s{seed}" / "distsplat_stats.json").read_text())
    return {
        "batch_size": batch_size,
        "seed": seed,
        "final_eval_psnr": stats["final_eval_psnr"],
        "final_gaussian_count": stats["final_gaussian_count"],
        "images_trained": stats.get("images_trained"),
        "train_wall_s": stats.get("wall_time_s"),
        "command_wall_s": round(time.perf_counter() - start, 1),
        "command": " ".join(cmd[1:]),
    }


def train_all(
    args: argparse.Namespace, out: Path, on_run: Callable[[list[dict]], None], finished: Sequence[dict] = ()
) -> list[dict]:
    """Every (B, seed) run not in ``finished``, seed by seed (so that a study cut short still holds
    whole seeds to pair), largest B first within a seed, ``--jobs`` at a time. ``on_run`` gets the
    runs finished so far (``finished`` included) after each one, so that the result file is
    rewritten as runs end and nothing finished is lost."""
    have = {(r["batch_size"], r["seed"]) for r in finished}
    jobs = sorted(
        ((b, s) for b in args.batch_sizes for s in args.seeds if (b, s) not in have), key=lambda job: (job[1], -job[0])
    )
    lock = threading.Lock()
    done: list[dict] = list(finished)

    def one(job: tuple[int, int]) -> dict:
        result = train(*job, args, out)
        with lock:
            print(json.dumps({k: v for k, v in result.items() if k != "command"}), file=sys.stderr, flush=True)
            done.append(result)
            on_run(sorted(done, key=lambda r: (r["batch_size"], r["seed"])))
        return result

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(one, jobs))
    return sorted(done, key=lambda r: (r["batch_size"], r["seed"]))


SETTINGS = (
    "scene",
    "downscale_factor",
    "images",
    "batch_sizes",
    "seeds",
    "warmup_images",
    "refine_every_images",
    "reset_alpha_every_refines",
)
"""The header fields a resumed study must share with the file it continues."""


def resumable_runs(previous: dict, header: dict, path: Path) -> list[dict]:
    """The finished runs of ``previous`` (a result file of this script), if its settings are
    ``header``'s; a one-line error naming the file and the first setting that differs otherwise."""
    for key in SETTINGS:
        if previous.get(key) != header[key]:
            raise SystemExit(f"--resume {path}: its {key} is {previous.get(key)!r}, this run's is {header[key]!r}")
    return list(previous["runs"])


def _mean_sd(values: list[float]) -> tuple[float, float]:
    return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else float("nan"))


def summarise(runs: list[dict], reference_batch: int = 1) -> dict:
    """Per B: PSNR mean / sample s.d., the gap of the means to B = ``reference_batch`` (NaN while
    that B has no run), the per-seed paired gaps and the mean Gaussian count."""
    by_batch: dict[int, dict[int, dict]] = {}
    for run in runs:
        by_batch.setdefault(run["batch_size"], {})[run["seed"]] = run
    reference = by_batch.get(reference_batch, {})
    ref_mean = _mean_sd([r["final_eval_psnr"] for r in reference.values()])[0] if reference else float("nan")
    summary = {}
    for batch, seeds in sorted(by_batch.items()):
        mean, sd = _mean_sd([r["final_eval_psnr"] for r in seeds.values()])
        paired = [
            seeds[s]["final_eval_psnr"] - reference[s]["final_eval_psnr"] for s in sorted(seeds) if s in reference
        ]
        paired_mean, paired_sd = _mean_sd(paired) if paired else (float("nan"), float("nan"))
        summary[str(batch)] = {
            "seeds": sorted(seeds),
            "psnr_mean": mean,
            "psnr_sd": sd,
            "gap_to_b1_db": mean - ref_mean,
            "paired_gaps_db": paired,
            "paired_gap_mean_db": paired_mean,
            "paired_gap_sd_db": paired_sd,
            "final_gaussian_count_mean": statistics.mean(r["final_gaussian_count"] for r in seeds.values()),
            "train_wall_s_mean": statistics.mean(r["train_wall_s"] or 0.0 for r in seeds.values()),
        }
    return summary


def markdown_table(summary: dict) -> str:
    lines = [
        "| B | seeds | eval PSNR (dB), mean ± s.d. | gap to B = 1 (dB) | paired gaps per seed (dB) | Gaussians (mean) | train wall (s, mean) |",
        "|---|---|---|---|---|---|---|",
    ]
    for batch, row in summary.items():
        paired = ", ".join(f"{g:+.2f}" for g in row["paired_gaps_db"])
        seeds = ", ".join(str(seed) for seed in row["seeds"])
        lines.append(
            f"| {batch} | {seeds} | {row['psnr_mean']:.2f} ± {row['psnr_sd']:.2f} | {row['gap_to_b1_db']:+.2f} | {paired} | "
            f"{row['final_gaussian_count_mean']:.0f} | {row['train_wall_s_mean']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", type=Path, default=SHARED_DATA / "bird")
    parser.add_argument(
        "--downscale-factor", type=int, default=8, help="colmap --downscale-factor: 8 = 68x120 px for bird"
    )
    parser.add_argument(
        "--images", type=int, default=3000, help="training images per run, every B (a multiple of each B)"
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument(
        "--warmup", type=int, default=500, help="images before the first densification event (splatfacto's 500)"
    )
    parser.add_argument(
        "--refine-every", type=int, default=100, help="images between densification events (splatfacto's 100)"
    )
    parser.add_argument(
        "--reset-alpha-every",
        type=int,
        default=30,
        help="refine events between opacity resets (splatfacto's 30 = every 3000 images); a reset shortly before "
        "the end measures the recovery from it, not the batch size",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time (one thread each)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default benchmarks/results/batch_quality_<scene>_<date>.json)",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        help="a result JSON of a study cut short: keep its runs, train the missing ones, rewrite it (unless --out)",
    )
    args = parser.parse_args()
    if 1 not in args.batch_sizes:
        parser.error("--batch-sizes must include 1, the reference")
    if any(args.images % b for b in args.batch_sizes):
        parser.error(
            f"--images {args.images} must be a multiple of every batch size {args.batch_sizes}: equal images per run"
        )
    machine = machine_record()
    start = time.perf_counter()
    target = args.out or args.resume or result_path(f"batch_quality_{args.scene.name}")
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    command = "python -m benchmarks.bench_batch_quality " + " ".join(sys.argv[1:])
    header = {
        "command": command,
        "date_utc": now,
        "scene": args.scene.name,
        "downscale_factor": args.downscale_factor,
        "images": args.images,
        "batch_sizes": args.batch_sizes,
        "seeds": args.seeds,
        "warmup_images": args.warmup,
        "refine_every_images": args.refine_every,
        "reset_alpha_every_refines": args.reset_alpha_every,
        "runs_on": f"CPU, reference rasterizer, OMP_NUM_THREADS=1 per run, {args.jobs} runs at a time",
        "machine": machine,
    }
    planned = len(args.batch_sizes) * len(args.seeds)
    finished: list[dict] = []
    header["commands"] = [{"command": command, "date_utc": now}]
    if args.resume is not None:
        previous = json.loads(args.resume.read_text())
        finished = resumable_runs(previous, header, args.resume)
        header["commands"] = (
            previous.get("commands", [{"command": previous["command"], "date_utc": previous["date_utc"]}])
            + header["commands"]
        )

    def write(runs: list[dict]) -> dict:
        summary = summarise(runs)
        result = dict(
            header,
            complete=len(runs) == planned,
            runs_finished=f"{len(runs)} of {planned}",
            machine=finish_machine_record(machine),
            total_wall_s=round(time.perf_counter() - start, 1),
            summary=summary,
            table=markdown_table(summary),
            runs=runs,
        )
        partial = target.with_suffix(".json.partial")
        partial.write_text(json.dumps(result, indent=2) + "\n")
        os.replace(partial, target)
        return result

    with tempfile.TemporaryDirectory() as tmp:
        runs = train_all(args, Path(tmp), write, finished)
    print(write(runs)["table"])
    print(f"written: {target}")


if __name__ == "__main__":
    main()
