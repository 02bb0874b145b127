"""Time per image at W ranks against 1 rank, in alternated rounds (issue 28's figure: <= 0.57 at W = 2, B = 2).

``bench_time_to_quality.py`` trains each configuration once, one after the other, and this
machine's speed shifts whole runs by 20% (docs/time_to_quality.md): one run's ratio can land
anywhere in that band. This benchmark trains the same configurations (same command, scene, size
and seed: ``bench_time_to_quality.train_run``) in ``--rounds`` rounds, each round the 1-rank run
next to the W-rank runs at B = W in both modes, the order reversed every other round so that
neither side always runs first. Each W-rank run's time per image (the sum of rank 0's step times
over the images trained) is divided by its own round's 1-rank run's (``per_round``, and their
median), and the median time over rounds by the 1-rank median (``of_medians``). No eval: the time
per image needs none, and ``bench_time_to_quality.py`` gives the PSNRs.

``python -m benchmarks.bench_time_per_image [--rounds 3] --out benchmarks/results/time_per_image_<date>.json``
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_time_to_quality import SIZES, RunSpec, train_run
from benchmarks.common import SHARED_DATA, finish_machine_record, machine_record, write_json

REFERENCE = "w1_b1"


def round_specs(world_size: int, rounds: int) -> list[list[RunSpec]]:
    """Per round, the 1-rank run and the W-rank runs at B = W (replicated, sharded), in running
    order: the 1-rank run first in even rounds, last in odd ones."""
    if rounds < 1 or world_size < 2:
        raise ValueError(f"round_specs: needs rounds >= 1 and world_size >= 2, got {rounds} and {world_size}")
    specs = [RunSpec(REFERENCE, 1, "replicated", 1)]
    specs += [
        RunSpec(f"w{world_size}_{parallel}_b{world_size}", world_size, parallel, world_size)
        for parallel in ("replicated", "sharded")
    ]
    return [specs if r % 2 == 0 else specs[::-1] for r in range(rounds)]


def per_image_ratios(rounds: list[dict[str, float]]) -> dict[str, dict]:
    """Each W-rank configuration's time per image over the 1-rank run's.

    Args:
        rounds: Per round, ``name -> seconds per image``, each with ``REFERENCE``.

    Returns:
        ``name -> {"per_round", "median", "min", "max", "of_medians"}``: ``per_round`` divides
        by the time of the 1-rank run of the same round (the one run beside it); ``of_medians`` is
        the median time over rounds divided by the 1-rank median.
    """
    if not rounds or any(REFERENCE not in r for r in rounds):
        raise ValueError(f"per_image_ratios: every round needs its {REFERENCE} run")
    reference = statistics.median(r[REFERENCE] for r in rounds)
    out = {}
    for name in sorted({n for r in rounds for n in r} - {REFERENCE}):
        ratios = [r[name] / r[REFERENCE] for r in rounds if name in r]
        out[name] = {
            "per_round": ratios,
            "median": statistics.median(ratios),
            "min": min(ratios),
            "max": max(ratios),
            "of_medians": statistics.median(r[name] for r in rounds if name in r) / reference,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the 1-rank and W-rank runs, alternated")
    parser.add_argument("--world-size", type=int, default=2, help="W")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "bird")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < args.world_size:
        raise SystemExit(f"error: --world-size {args.world_size} needs {args.world_size} cores (one per rank)")
    if not (args.data / "sparse" / "0").is_dir():
        raise SystemExit(f"error: --data {args.data} has no sparse/0 (a COLMAP scene is expected)")
    size = SIZES["full"]
    t_start, machine = time.perf_counter(), machine_record()
    runs, per_image = [], []
    with tempfile.TemporaryDirectory(prefix="tpi_") as tmp:
        for r, specs in enumerate(round_specs(args.world_size, args.rounds)):
            seconds = {}
            for spec in specs:
                run = train_run(spec, size, Path(tmp) / f"round{r}", args.data, "cpu", args.seed)
                images = run["stats"]["images_trained"]
                seconds[spec.name] = run["sum_step_times_s"] / images
                runs.append(
                    {
                        "round": r,
                        **{
                            k: run[k]
                            for k in (
                                "spec",
                                "command",
                                "command_wall_s",
                                "load_average_1min_before",
                                "load_average_1min_after",
                                "sum_step_times_s",
                                "steps_timed",
                            )
                        },
                        "images_trained": images,
                        "seconds_per_image": seconds[spec.name],
                    }
                )
            per_image.append(seconds)
            print(
                f"[tpi] round {r}: " + ", ".join(f"{n} {s * 1e3:.1f} ms/image" for n, s in seconds.items()), flush=True
            )
    ratios = per_image_ratios(per_image)
    result = {
        "benchmark": "bench_time_per_image",
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.bench_time_per_image", *sys.argv[1:]]),
        "size_settings": {"downscale": size.downscale, "images": size.images, "every": size.every},
        "scene": args.data.name,
        "pinning": "OMP_NUM_THREADS=1; taskset -c 0..W-1: one core per rank (bench_time_to_quality.train_run)",
        "machine": finish_machine_record(machine),
        "target": f"time per image at W = {args.world_size}, B = {args.world_size} <= 0.57x that of W = 1, B = 1, "
        "the better of the two modes (issue 28)",
        "seconds_per_image_by_round": per_image,
        "ratios": ratios,
        "runs": runs,
        "total_benchmark_s": time.perf_counter() - t_start,
    }
    write_json(args.out, result)
    for name, r in ratios.items():
        print(
            f"[tpi] {name}: per round {', '.join(f'{x:.3f}' for x in r['per_round'])}; median {r['median']:.3f}, of medians {r['of_medians']:.3f}"
        )
    print(f"[tpi] result: {args.out} ({result['total_benchmark_s']:.0f} s)")


if __name__ == "__main__":
    main()
