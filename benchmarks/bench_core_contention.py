"""The floor under ``bench_time_to_quality.py``'s time-per-image ratio on this machine: how much
slower one 1-rank training runs when a second, independent one runs on the other core.

W = 2 ranks on two cores can at best take 0.5x the 1-rank time per image only if the two cores do
not slow each other down. They share the L3 cache and the memory bus, so each runs at some
fraction of its solo speed even with no communication at all. This script measures that
fraction with the time-to-quality benchmark's own 1-rank run (same scene, size, schedule, seed,
``OMP_NUM_THREADS=1``, pinned with ``taskset``):

* **solo**: the run on core 0, the other core idle;
* **pair**: the same run on core 0 and a copy on core 1, started together (no process group, no
  shared data: only the hardware is shared).

Time per image is the sum of the run's own step times (nerfstudio's ``ITER_TRAIN_TIME``, as
``bench_time_to_quality.py`` reads it) over its images. Solo and pair alternate ``--repeats`` times
so that a drift of the machine's speed falls on both. Reported: each repeat's pair / solo ratio
(the pair's two runs averaged), their median, and ``0.5 x`` that median: the time per image, in
units of the 1-rank run's, that W = 2 would reach with no distributed overhead at all here.

Usage: ``python -m benchmarks.bench_core_contention [--images 300] [--repeats 2]`` (about 4 min a
repeat at the default size on 2 idle cores). Writes benchmarks/results/core_contention_<date>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
from dataclasses import replace
from pathlib import Path

from benchmarks import bench_time_to_quality as ttq
from benchmarks.common import SHARED_DATA, child_env, finish_machine_record, machine_record, result_path, write_json


def pinned_command(name: str, core: int, images: int, out: Path, data: Path, seed: int) -> list[str]:
    """The time-to-quality benchmark's 1-rank command at its full size, pinned to ``core``."""
    spec = ttq.RunSpec(name, 1, "replicated", 1)
    return ttq.train_run_command(spec, replace(ttq.SIZES["full"], images=images), out, data, "cpu", seed, cores=[core])


def time_per_image(out: Path, name: str) -> float:
    """Sum of the run's step times over its images (s)."""
    times = ttq.step_times(out / "ttq" / "distsplat" / name)
    stats = json.loads((out / "ttq" / "distsplat" / name / "distsplat_stats.json").read_text())
    if len(times) != stats["steps"]:
        raise SystemExit(f"error: run {name} logged {len(times)} step times for {stats['steps']} steps")
    return sum(times.values()) / stats["images_trained"]


def run_together(commands: dict[str, list[str]]) -> None:
    """Start every command at once and wait for all; a failure names its run."""
    env = child_env()
    procs = {
        name: subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for name, cmd in commands.items()
    }
    for name, proc in procs.items():
        output, _ = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"error: run {name} failed ({proc.returncode}):\n{output[-3000:]}")


def summarise(repeats: list[dict[str, float]]) -> dict:
    """Per repeat the pair / solo ratio (the pair's runs averaged); the median and the floor it sets."""
    ratios = [statistics.mean([r["pair_core0"], r["pair_core1"]]) / r["solo"] for r in repeats]
    median = statistics.median(ratios)
    return {"pair_over_solo": ratios, "pair_over_solo_median": median, "w2_floor_time_per_image": 0.5 * median}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="training images per run (the full size's schedule)")
    parser.add_argument("--repeats", type=int, default=2, help="solo/pair alternations")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "bird")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--out", type=Path, default=None, help="result JSON (default benchmarks/results/core_contention_<date>.json)"
    )
    args = parser.parse_args()
    if (os.cpu_count() or 1) < 2:
        raise SystemExit("error: needs two cores")
    target = args.out or result_path("core_contention")
    machine = machine_record()
    repeats: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for k in range(args.repeats):
            out = Path(tmp) / f"r{k}"
            solo = {"solo": pinned_command("solo", 0, args.images, out, args.data, args.seed)}
            pair = {
                f"pair_core{c}": pinned_command(f"pair_core{c}", c, args.images, out, args.data, args.seed)
                for c in (0, 1)
            }
            for commands in (solo, pair):
                run_together(commands)
            repeats.append({name: time_per_image(out, name) for name in (*solo, *pair)})
            print(
                f"[contention] repeat {k}: " + ", ".join(f"{n} {t:.4f} s/image" for n, t in repeats[-1].items()),
                flush=True,
            )
    result = {
        "benchmark": "core_contention",
        "command": "python -m benchmarks.bench_core_contention "
        + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if k != "out"),
        "scene": args.data.name,
        "size": "full",
        "images": args.images,
        "seed": args.seed,
        "pinning": "OMP_NUM_THREADS=1; solo: taskset -c 0; pair: one run on core 0 and one on core 1, started together",
        "machine": finish_machine_record(machine),
        "time_per_image_s": repeats,
        **summarise(repeats),
    }
    write_json(target, result)
    print(json.dumps({k: result[k] for k in ("pair_over_solo", "pair_over_solo_median", "w2_floor_time_per_image")}))
    print(f"written: {target}")


if __name__ == "__main__":
    main()
