"""Capacity with W (issue 51, item 4): the largest process's marginal bytes per Gaussian, sharded, W = 1, 2, 4, 8.

For each W in ``--worlds`` and each of two model sizes ``N_a < N_b`` (``--sizes``), one short
sharded run on one host (CPU, gloo): ``scenes/lund_door`` with splatfacto's random initialisation
of N Gaussians, densification off (every run holds the same N), ``--steps`` steps of B = 1, the
step-0 eval and the final eval over the held-out images, and the end-of-run save (every rank its
DCP shard, then rank 0's params-only consolidation). Each rank's peak is ``ru_maxrss`` of its own
process (VmHWM; ``trainer/run_record.py``, children -- the image decoders -- excluded), as
``bench_sharded.py --memory`` takes it; the worker (``--worker``, the ns-train entry point with
hooks) also records the peak after each phase (set-up, each eval, the steps, the save, the
consolidation) so the phase that sets the peak is known.

From the runs: per W, the largest process's peak at ``N_a`` and ``N_b``, its marginal bytes per
Gaussian ``(peak(N_b) - peak(N_a)) / (N_b - N_a)``, the ratio to W = 1's, and the verdict against
the target ``1.5 / W`` (issue 51: W = 2: 0.75, W = 4: 0.375, W = 8: 0.1875).

Usage (repository root; runs W = 8 last, after checking the available memory):
    PYTHONPATH=$PWD nice -n 10 python -m benchmarks.bench_capacity [--sizes 500000 1500000]
Writes ``benchmarks/results/capacity_<date>.json`` (after every run, so a stopped set keeps what it
measured); ``--reanalyse FILE`` recomputes the table of a written JSON. docs/sharded.md, "Capacity
with W", reads it.

The launch goes through ``benchmarks/common.py`` (:func:`run_one`); the fit is
:func:`marginal_bytes_per_gaussian` and :func:`capacity_table` (pure; tests/unit/test_capacity_fit.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    child_env,
    colmap_args,
    finish_machine_record,
    machine_record,
    run_command,
    train_command,
    unattended_args,
)

REPO = Path(__file__).resolve().parents[1]
SCENE = REPO / "scenes" / "lund_door"
WORLDS = (1, 2, 4, 8)
#: The issue's target: the largest process's marginal bytes per Gaussian at W over W = 1's.
TARGET_NUMERATOR = 1.5
#: Each rank's fixed base for the launch check: torch, nerfstudio and the dataset, 1.3-1.6 GB
#: (docs/sharded.md, "Memory at 2M Gaussians"), and what the first eval adds at any N (measured
#: here at 2,000 Gaussians: 0.3-0.55 GB per rank; every rank of W = 8 at 500,000 Gaussians peaked
#: at 1.47-1.67 GiB, docs/sharded.md "Capacity with W").
BASE_BYTES_PER_RANK = 1_600_000_000
#: Bytes per Gaussian, all ranks together, for the launch check: one process's peak above its
#: base (measured here at W = 1: 1,546 B) with a margin, plus the start-up draw's 76 B per
#: Gaussian of all N on every rank (README.md, "Memory per rank").
BYTES_PER_GAUSSIAN_W1 = 1_760
INIT_ALL_BYTES_PER_GAUSSIAN = 76
PHASES_FILE = "capacity_phases_rank{rank}.json"


# ----------------------------------------------------------------------------- the fit (pure)
def target_ratio(world: int) -> float:
    """The issue's target for the ratio at ``world`` ranks: ``1.5 / W``.

    Raises:
        ValueError: ``world`` is below 1.
    """
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    return TARGET_NUMERATOR / world


def marginal_bytes_per_gaussian(peak_a: float, peak_b: float, num_a: int, num_b: int) -> float:
    """The slope of a peak between two model sizes: ``(peak_b - peak_a) / (num_b - num_a)``.

    Args:
        peak_a: Peak bytes at ``num_a`` Gaussians.
        peak_b: Peak bytes at ``num_b`` Gaussians.
        num_a: The smaller model size (Gaussians over all ranks).
        num_b: The larger model size.

    Raises:
        ValueError: ``num_b <= num_a``.
    """
    if num_b <= num_a:
        raise ValueError(f"the two model sizes must grow: N_a = {num_a}, N_b = {num_b}")
    return (peak_b - peak_a) / (num_b - num_a)


def capacity_table(peaks: dict[tuple[int, int], Sequence[int]], num_a: int, num_b: int) -> list[dict[str, Any]]:
    """Per W (ascending), the largest process's marginal bytes per Gaussian, its ratio to W = 1's
    and the verdict against :func:`target_ratio`.

    Args:
        peaks: ``(world, num)`` -> every rank's peak bytes at that run; a W with only one of the
            two sizes is left out of the table.
        num_a: The smaller model size.
        num_b: The larger model size.

    Returns:
        One row per W measured at both sizes: ``world_size``, ``largest_peak_a_bytes``,
        ``largest_peak_b_bytes``, ``marginal_bytes_per_gaussian``, ``ratio_to_w1`` (None without
        W = 1), ``target_ratio``, ``reached`` (None without W = 1).

    Raises:
        ValueError: a run's per-rank list is empty or its length is not its W.
    """
    for (world, num), ranks in peaks.items():
        if len(ranks) != world:
            raise ValueError(f"run W = {world}, N = {num}: {len(ranks)} rank peaks, expected {world}")
    worlds = sorted({w for w, n in peaks if (w, num_a) in peaks and (w, num_b) in peaks})
    slopes = {
        w: marginal_bytes_per_gaussian(max(peaks[(w, num_a)]), max(peaks[(w, num_b)]), num_a, num_b) for w in worlds
    }
    one = slopes.get(1)
    rows = []
    for world in worlds:
        ratio = slopes[world] / one if one else None
        rows.append(
            {
                "world_size": world,
                "largest_peak_a_bytes": max(peaks[(world, num_a)]),
                "largest_peak_b_bytes": max(peaks[(world, num_b)]),
                "marginal_bytes_per_gaussian": slopes[world],
                "ratio_to_w1": ratio,
                "target_ratio": target_ratio(world),
                "reached": None if ratio is None else ratio <= target_ratio(world),
            }
        )
    return rows


def phase_slopes(runs: list[dict[str, Any]], num_a: int, num_b: int) -> dict[int, dict[str, float]]:
    """Per W, the largest process's marginal bytes per Gaussian after each recorded phase (the
    peak so far when the phase ended): where the slope first appears is the phase that sets it."""
    by = {(r["world_size"], r["num_random"]): r for r in runs}
    out: dict[int, dict[str, float]] = {}
    for world in sorted({r["world_size"] for r in runs}):
        a, b = by.get((world, num_a)), by.get((world, num_b))
        if a is None or b is None or not a.get("phase_peaks") or not b.get("phase_peaks"):
            continue
        # Rank 0 has every phase (it alone consolidates); each phase's peak is over the ranks that had it.
        names = [p for p in a["phase_peaks"][0] if p in b["phase_peaks"][0]]
        out[world] = {
            name: marginal_bytes_per_gaussian(
                max(rank[name] for rank in a["phase_peaks"] if name in rank),
                max(rank[name] for rank in b["phase_peaks"] if name in rank),
                num_a,
                num_b,
            )
            for name in names
        }
    return out


def analyse(runs: list[dict[str, Any]], num_a: int, num_b: int) -> dict[str, Any]:
    """The table and the phase slopes of a run set."""
    peaks = {(r["world_size"], r["num_random"]): r["peak_rss_bytes_per_rank"] for r in runs}
    return {"table": capacity_table(peaks, num_a, num_b), "phase_slopes": phase_slopes(runs, num_a, num_b)}


# ----------------------------------------------------------------------------- launching
def ns_train_args(out: Path, name: str, num: int, steps: int) -> list[str]:
    """The ``ns-train distsplat`` arguments of one run (without the program): sharded, B = 1,
    ``steps`` steps, random initialisation of ``num`` Gaussians, densification off, no save
    before the end-of-run one, the step-0 and final evals over the held-out images."""
    return [
        "distsplat",
        "--output-dir",
        str(out),
        "--experiment-name",
        "capacity",
        "--timestamp",
        name,
        "--max-num-iterations",
        str(steps),
        "--machine.device-type",
        "cpu",
        *unattended_args(eval_at_step_0=True),
        "--pipeline.parallel",
        "sharded",
        "--pipeline.batch-size",
        "1",
        "--pipeline.model.random-init",
        "True",
        "--pipeline.model.num-random",
        str(num),
        "--pipeline.model.stop-split-at",
        "0",
        "--pipeline.model.num-downscales",
        "0",
        *colmap_args(SCENE),
    ]


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (what a new process may take without swapping out others)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def estimated_bytes(world: int, num: int) -> int:
    """A run's memory, all ranks together, for the launch check (see the constants)."""
    return world * BASE_BYTES_PER_RANK + num * (BYTES_PER_GAUSSIAN_W1 + world * INIT_ALL_BYTES_PER_GAUSSIAN)


def run_one(work: Path, world: int, num: int, steps: int, timeout_s: float) -> dict[str, Any]:
    """One run: launch, wait, read its summary and the phase peaks; its checkpoints are removed.

    Raises:
        RuntimeError: too little memory is available to launch it, or the run failed.
    """
    need, have = estimated_bytes(world, num), available_bytes()
    if need > have:
        raise RuntimeError(
            f"W = {world}, N = {num}: about {need / 2**30:.1f} GiB needed, {have / 2**30:.1f} GiB available; not launched"
        )
    name = f"sharded_w{world}_n{num}"
    # This module's --worker (the hooked ns-train) on one process, or under torchrun on ``world``.
    cmd = train_command(
        ["--worker", *ns_train_args(work, name, num, steps)], world_size=world, module="benchmarks.bench_capacity"
    )
    load_before = os.getloadavg()
    start = time.perf_counter()
    run_command(cmd, name=name, env=child_env(), timeout=timeout_s)
    wall = time.perf_counter() - start
    run_dir = work / "capacity" / "distsplat" / name
    stats = json.loads((run_dir / "distsplat_stats.json").read_text())
    phases = [json.loads((run_dir / PHASES_FILE.format(rank=r)).read_text()) for r in range(world)]
    shutil.rmtree(run_dir / "nerfstudio_models", ignore_errors=True)  # ~2.3 GB per 1M Gaussians
    per_rank = stats["per_rank"]
    return {
        "world_size": world,
        "num_random": num,
        "steps": stats["steps"],
        "gaussians": stats["final_gaussian_count"],
        "evals": len(stats["eval_psnr_history"]),
        "local_gaussians_per_rank": [r["local_gaussian_count"] for r in per_rank],
        "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in per_rank],
        "final_peak_rss_bytes_per_rank": [p["final_peak_rss_bytes"] for p in phases],
        "phase_peaks": [p["phase_peaks"] for p in phases],
        "model_bytes_per_rank": [r["parameter_bytes"] + r["optimizer_state_bytes"] for r in per_rank],
        "available_bytes_at_launch": have,
        "load_average_at_launch": list(load_before),
        "command_wall_s": wall,
    }


# ----------------------------------------------------------------------------- the worker
def _peak_rss_bytes() -> int:
    from distsplat_ns.trainer.run_record import peak_memory_bytes

    return peak_memory_bytes(torch.device("cpu"))


def worker_main(train_args: list[str]) -> None:
    """``ns-train`` with the trainer's phases hooked: after set-up, each eval, the steps, the save
    and the consolidation this rank's peak so far is recorded; the run folder gets
    ``capacity_phases_rank<R>.json`` after the summary (whose memory the summary's peak has)."""
    from distsplat_ns.parallel import shard_checkpoint

    phase_peaks: dict[str, int] = {}
    counts: dict[str, int] = {}

    def mark(phase: str) -> None:
        counts[phase] = counts.get(phase, 0) + 1
        phase_peaks[phase if counts[phase] == 1 else f"{phase}_{counts[phase]}"] = _peak_rss_bytes()

    def after(owner: Any, attr: str, phase: str) -> None:
        original = getattr(owner, attr)

        def hooked(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                mark(phase)

        setattr(owner, attr, hooked)

    after(shard_checkpoint, "consolidate_params", "consolidate")  # before trainer_checkpoints imports the name
    from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainer

    after(DistSplatTrainer, "setup", "setup")
    after(DistSplatTrainer, "_eval_all", "eval")
    after(DistSplatTrainer, "_train_steps", "steps")
    after(DistSplatTrainer, "save_checkpoint", "save")
    original_write_stats = DistSplatTrainer._write_stats

    def write_stats(self: Any) -> None:
        original_write_stats(self)
        record = {"phase_peaks": phase_peaks, "final_peak_rss_bytes": _peak_rss_bytes()}
        (self.base_dir / PHASES_FILE.format(rank=self.ctx.rank)).write_text(json.dumps(record, indent=2))

    DistSplatTrainer._write_stats = write_stats
    from nerfstudio.scripts.train import entrypoint

    sys.argv = [sys.argv[0], *train_args]
    entrypoint()


# ----------------------------------------------------------------------------- the result
def format_table(rows: list[dict[str, Any]]) -> str:
    """The table as docs/sharded.md prints it (MiB, bytes per Gaussian, ratio, target, verdict)."""
    lines = [
        "| W | largest peak at N_a (MiB) | at N_b (MiB) | marginal B / Gaussian | ratio to W = 1 | target 1.5 / W | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "-" if r["ratio_to_w1"] is None else f"{r['ratio_to_w1']:.3f}"
        verdict = "-" if r["reached"] is None else ("reached" if r["reached"] else "not reached")
        lines.append(
            f"| {r['world_size']} | {r['largest_peak_a_bytes'] / 2**20:.0f} | {r['largest_peak_b_bytes'] / 2**20:.0f} | "
            f"{r['marginal_bytes_per_gaussian']:.0f} | {ratio} | {r['target_ratio']:.3f} | {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=(500_000, 1_500_000), metavar=("N_A", "N_B"))
    parser.add_argument("--worlds", type=int, nargs="+", default=list(WORLDS))
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (B = 1)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_capacity"))
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/capacity_<date>.json")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    parser.add_argument(
        "--reanalyse", type=Path, default=None, help="a written JSON: recompute its table from its runs"
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        default=None,
        help="a written JSON at the same sizes: its runs of every W not in --worlds are kept (marked reused_from)",
    )
    args = parser.parse_args()
    if args.reanalyse is not None:
        result = json.loads(args.reanalyse.read_text())
        result.update(analyse(result["runs"], *result["sizes"]))
        args.reanalyse.write_text(json.dumps(result, indent=2))
        print(format_table(result["table"]))
        return
    num_a, num_b = args.sizes
    marginal_bytes_per_gaussian(0, 0, num_a, num_b)  # refuses sizes that do not grow, before any run
    if any(w < 1 for w in args.worlds):
        raise SystemExit(f"--worlds: every W must be >= 1, got {args.worlds}")
    out = args.out or REPO / "benchmarks" / "results" / f"capacity_{time.strftime('%Y-%m-%d', time.gmtime())}.json"
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    result: dict[str, Any] = {
        "command": "PYTHONPATH=$PWD nice -n 10 python -m benchmarks.bench_capacity " + " ".join(sys.argv[1:]),
        "scene": "scenes/lund_door (random initialisation), sharded, B = 1",
        "sizes": [num_a, num_b],
        "steps": args.steps,
        "machine": machine_record(),
        "runs": [],
    }
    if args.reuse is not None:
        reused = json.loads(args.reuse.read_text())
        if list(reused["sizes"]) != [num_a, num_b]:
            raise SystemExit(f"--reuse {args.reuse}: sizes {reused['sizes']}, not --sizes {num_a} {num_b}")
        kept = [r for r in reused["runs"] if r["world_size"] not in args.worlds]
        result["runs"] = [{**r, "reused_from": r.get("reused_from", args.reuse.name)} for r in kept]
    for world in sorted(args.worlds):  # W = 8 last: the largest run starts once the others are done
        for num in (num_a, num_b):
            run = run_one(args.work, world, num, args.steps, args.timeout_s)
            result["runs"].append(run)
            result.update(
                analyse(result["runs"], num_a, num_b), finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            )
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2))
            print(
                f"W = {world}, N = {num}: peaks {[round(p / 2**20) for p in run['peak_rss_bytes_per_rank']]} MiB, {run['command_wall_s']:.0f} s",
                flush=True,
            )
    finish_machine_record(result["machine"])
    out.write_text(json.dumps(result, indent=2))
    print(format_table(result["table"]))


if __name__ == "__main__":
    main()
