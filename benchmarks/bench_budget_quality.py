"""Does a model W ranks hold train better than the one a single process can hold? (issue 51, item 5)

Under one per-rank memory budget (``--pipeline.memory-budget``) that caps one process at N1
Gaussians, the same training on W sharded ranks may grow to about W x N1 (less the shard
headroom). For each seed this trains both on a real scene (bird, COLMAP points, the same images,
batch and schedule), reads each run's summary (final Gaussians, the caps' refusals) and evaluates
its final checkpoint with ``ns-eval`` (PSNR over the eval split). The budget is chosen from N1 and
the one-process bytes per Gaussian (``gaussians/budget_caps.py``), so the caps follow from the code, not
from this script.

    python -m benchmarks.bench_budget_quality --seeds 42 43 --n1 2500 --num-random 2000 --images 600

Writes ``benchmarks/results/budget_quality_<date>.json``; docs/densification.md discusses it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    SHARED_DATA,
    child_env,
    colmap_args,
    finish_machine_record,
    machine_record,
    ns_train_executable,
    result_path,
    run_command,
    train_command,
    unattended_args,
    write_json,
)
from distsplat_ns.gaussians.budget_caps import GIB, gaussian_bytes


def one_process_bytes_per_gaussian(batch_size: int) -> int:
    """Bytes per Gaussian of one float32 process at SH degree 3 with the default strategy."""
    from distsplat_ns.gaussians.rows import DEFAULT_STATISTICS, gaussian_schema, parameter_fields

    schema = gaussian_schema(parameter_fields(3), DEFAULT_STATISTICS)
    return gaussian_bytes(schema, 4, sharded=False, batch_size=batch_size, world_size=1, reads_statistics=True).total


def budget_gib(n1: int, batch_size: int) -> str:
    """The budget (GiB, as the flag takes it) whose one-process cap is ``n1`` Gaussians: ``n1`` times
    the bytes per Gaussian, rounded up in the eighth decimal and one more step (10.7 B, less than one
    Gaussian: the cap, the floor of the quotient, is ``n1`` whatever the float rounding)."""
    return f"{(math.ceil(n1 * one_process_bytes_per_gaussian(batch_size) / GIB * 1e8) + 1) / 1e8:.8f}"


def train_args(out: Path, name: str, seed: int, args: argparse.Namespace, parallel: str) -> list[str]:
    return [
        "distsplat", "--output-dir", str(out), "--experiment-name", "budget", "--timestamp", name,
        "--machine.device-type", "cpu", "--machine.seed", str(seed), "--max-num-iterations", str(args.images),
        "--pipeline.batch-size", str(args.batch_size), "--pipeline.parallel", parallel,
        "--pipeline.memory-budget", budget_gib(args.n1, args.batch_size), *unattended_args(eval_at_step_0=True),
        "--pipeline.model.num-downscales", "0", "--pipeline.model.warmup-length", "100", "--pipeline.model.refine-every", "100",
        "--pipeline.model.densify-grad-thresh", str(args.densify_grad_thresh),
        *(["--pipeline.model.random-init", "True", "--pipeline.model.num-random", str(args.num_random)] if args.num_random else []),
        *colmap_args(args.data, args.downscale),
    ]  # fmt: skip


def evaluate(run_dir: Path) -> dict[str, Any]:
    """``ns-eval`` of the run's final checkpoint: its PSNR, SSIM over the eval split."""
    out = run_dir / "eval.json"
    ns_eval = str(Path(ns_train_executable()).with_name("ns-eval"))
    run_command(
        [ns_eval, "--load-config", str(run_dir / "config.yml"), "--output-path", str(out)],
        name=f"ns-eval {run_dir.name}",
        env=child_env(threads=2),
    )
    return json.loads(out.read_text())["results"]


def run_one(
    out: Path, name: str, seed: int, world_size: int, parallel: str, args: argparse.Namespace
) -> dict[str, Any]:
    cmd = train_command(train_args(out, name, seed, args, parallel), world_size=world_size)
    print(f"[budget] {name}: {' '.join(cmd)}", flush=True)
    t0 = time.perf_counter()
    run_command(cmd, name=name, env=child_env(), log=out / f"{name}.log", timeout=args.timeout)
    wall = time.perf_counter() - t0
    run_dir = out / "budget" / "distsplat" / name
    stats = json.loads((run_dir / "distsplat_stats.json").read_text())
    results = evaluate(run_dir)
    row = {
        "name": name, "seed": seed, "world_size": world_size, "parallel": parallel, "command": cmd, "wall_s": wall,
        "final_gaussians": stats["final_gaussian_count"], "memory_budget": stats.get("memory_budget"),
        "psnr": results["psnr"], "ssim": results.get("ssim"),
    }  # fmt: skip
    print(f"[budget] {name}: {row['final_gaussians']} Gaussians, PSNR {row['psnr']:.3f}, {wall:.0f} s", flush=True)
    return row


def verdicts(rows: list[dict[str, Any]], n1: int, world_size: int) -> dict[str, Any]:
    """Per seed: W ranks' Gaussians over N1 (target >= 3) and the PSNR gain (target > 0)."""
    out: dict[str, Any] = {}
    for seed in sorted({r["seed"] for r in rows}):
        one = next(r for r in rows if r["seed"] == seed and r["world_size"] == 1)
        many = next(r for r in rows if r["seed"] == seed and r["world_size"] == world_size)
        out[str(seed)] = {
            "n1_cap": n1,
            "gaussians_1": one["final_gaussians"],
            f"gaussians_{world_size}": many["final_gaussians"],
            "ratio_to_n1": many["final_gaussians"] / n1,
            "grew_to_3x_n1": many["final_gaussians"] >= 3 * n1,
            "psnr_1": one["psnr"],
            f"psnr_{world_size}": many["psnr"],
            "psnr_gain_db": many["psnr"] - one["psnr"],
            "higher_psnr": many["psnr"] > one["psnr"],
        }
    return out


def plot(result: dict[str, Any], path: Path) -> None:
    """Per seed, the final Gaussians (against N1 and 3 x N1) and the eval PSNR of one process and of W ranks."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    seeds = sorted(result["verdicts"])
    world = result["settings"]["world_size"]
    fig, (ax_n, ax_p) = plt.subplots(1, 2, figsize=(9, 3.6))
    xs = range(len(seeds))
    for offset, key, label in ((-0.2, "1", "1 process"), (0.2, str(world), f"{world} sharded ranks")):
        v = [result["verdicts"][s] for s in seeds]
        ax_n.bar([x + offset for x in xs], [r[f"gaussians_{key}"] for r in v], width=0.4, label=label)
        ax_p.bar([x + offset for x in xs], [r[f"psnr_{key}"] for r in v], width=0.4, label=label)
    n1 = result["n1"]
    ax_n.axhline(n1, color="k", lw=1, ls="--", label="N1 (one process's cap)")
    ax_n.axhline(3 * n1, color="r", lw=1, ls=":", label="3 x N1")
    for ax, title in ((ax_n, "final Gaussians"), (ax_p, "eval PSNR (dB)")):
        ax.set_xticks(list(xs), [f"seed {s}" for s in seeds])
        ax.set_title(title)
    low = min(min(r["psnr_1"], r[f"psnr_{world}"]) for r in result["verdicts"].values())
    ax_p.set_ylim(low - 0.5, None)
    ax_n.legend(fontsize=7)
    fig.suptitle(
        f"One per-rank budget ({float(result['budget_gib']) * 1024:.1f} MiB): 1 process vs {world} sharded ranks, bird, {result['settings']['images']} images"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43])
    parser.add_argument(
        "--n1",
        type=int,
        default=6600,
        help="the one-process cap the budget implies (above the initial Gaussians: bird has 6,271 points)",
    )
    parser.add_argument("--world-size", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--downscale", type=int, default=6)
    parser.add_argument("--densify-grad-thresh", type=float, default=0.0002)
    parser.add_argument(
        "--num-random", type=int, default=0, help="random initial Gaussians (0: the scene's COLMAP points)"
    )
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "bird")
    parser.add_argument("--out", type=Path, default=Path("/tmp/bench_budget_quality"))
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--plot", type=Path, help="draw the result's plot here (PNG)")
    parser.add_argument("--replot", type=Path, help="only draw --plot from this result JSON")
    parser.add_argument(
        "--previous",
        type=Path,
        help="an earlier result of the same settings: its runs are kept, the seeds it holds not run again",
    )
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.plot)
        return
    machine = machine_record()
    rows = json.loads(args.previous.read_text())["runs"] if args.previous else []
    args.seeds = [s for s in args.seeds if s not in {r["seed"] for r in rows}]
    for seed in args.seeds:
        rows.append(run_one(args.out, f"w1_seed{seed}", seed, 1, "replicated", args))
        rows.append(run_one(args.out, f"w{args.world_size}_sharded_seed{seed}", seed, args.world_size, "sharded", args))
    result = {
        "question": "Under one per-rank budget that caps one process at N1 Gaussians, do W sharded ranks grow to >= 3 x N1 and reach a higher eval PSNR?",
        "scene": str(args.data), "n1": args.n1, "budget_gib": budget_gib(args.n1, args.batch_size),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": rows, "verdicts": verdicts(rows, args.n1, args.world_size), "machine": finish_machine_record(machine),
        "previous": str(args.previous) if args.previous else None,
    }  # fmt: skip
    print(json.dumps(result["verdicts"], indent=1), flush=True)
    print(f"[budget] wrote {write_json(result_path('budget_quality'), result)}", flush=True)
    if args.plot:
        plot(result, args.plot)


if __name__ == "__main__":
    main()
