"""Time to quality: the same training on 1 rank and on W ranks, eval PSNR against wall time.

Five runs of `ns-train distsplat` with the same configuration, scene, seed and number of images:
1 rank at B = 1, and W ranks (torchrun, gloo) replicated and sharded at B = 1 and B = W. Each run
saves a checkpoint every ``--every`` images; afterwards every checkpoint is evaluated on the
held-out (eval split) images with nerfstudio's own metric (``pipeline.get_average_eval_image_metrics``
after ``eval_setup``, which is what ``ns-eval`` computes). Output: a JSON file (every point, every
run's summary, the ratios) and a PNG plot (PSNR vs wall time, PSNR vs images).

How wall time excludes evaluation (and checkpoint writes):
  * The point of a checkpoint at step s is at the sum of the run's own step times for steps 0..s:
    nerfstudio's ``TimeWriter(ITER_TRAIN_TIME)`` around each iteration in distsplat's trainer (the
    data wait, forward, backward, collectives, optimizer and densification callbacks), written to
    tensorboard as "Train Iter (time)". ``--logging.max-buffer-size 1`` makes that scalar each
    step's own duration rather than nerfstudio's running mean over 20 steps. Rank 0 writes it;
    since every step ends in collectives, rank 0's step time is the job's.
  * Checkpoint saves and the trainer's evals (at step 0 and after the last step) happen outside
    that timer; periodic evals are switched off. The run's whole training-loop time
    (``wall_time_s`` in distsplat_stats.json) is reported next to the sum of step times.
  * Evaluation runs after all training, in a separate process per run (2 threads, unpinned), and
    its time is reported per point (``eval_s``), never added to the wall time.

Same hardware per rank: on CPU each rank gets one core -- ``OMP_NUM_THREADS=1`` and the run
(ns-train, or torchrun with all its ranks and their DataLoader workers) is pinned with ``taskset``
to cores 0..W-1; the 1-rank run to core 0. On CUDA nothing is pinned, all ranks share GPU 0 (gloo),
and step times are not CUDA-synchronised (nerfstudio's timer does not sync), so they are indicative.

Ratio: for each W-rank run, the wall time at which its PSNR-vs-time curve (linear between
points) first reaches the 1-rank run's final PSNR, over the 1-rank run's wall time at its last
point (the target: <= 0.6 at W = 2, issue 21). A run that never reaches it is "not reached", with
its final PSNR gap.

Scene: /work/shared/data/bird (real capture, 184 phone-video frames 544x960 with COLMAP poses and
points; MIT license of github.com/Michael-Yi-Rong/NeRF-Pytorch, see its PROVENANCE.txt), decoded
at 1/6 (90x160 px) for the full size and 1/8 (68x120) for --quick. nerfstudio's colmap
dataparser holds out every 8th image (eval split: 23 images).

Usage:
  python -m benchmarks.bench_time_to_quality --quick            # validation, a few minutes
  python -m benchmarks.bench_time_to_quality                    # full size, <= 15 min on 2 idle cores
  python -m benchmarks.bench_time_to_quality --replot RESULT.json --plot docs/time_to_quality.png

Other benchmarks reuse its run (same command, scene, size and seed): ``RunSpec``, ``SIZES``,
``train_run_command``, ``train_run`` and ``step_times``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from benchmarks.common import (
    REPO,
    SHARED_DATA,
    child_env,
    colmap_args,
    finish_machine_record,
    load_average_1min,
    machine_record,
    result_path,
    run_command,
    train_command,
    unattended_args,
    write_json,
)

STEP_TIME_TAG = "Train Iter (time)"  # nerfstudio EventName.ITER_TRAIN_TIME


@dataclass(frozen=True)
class Size:
    """One benchmark size: the scene, its resolution and the schedule, the same for every run."""

    downscale: int
    """colmap --downscale-factor: 6 = 90x160 px for bird."""
    images: int
    """Training images per run (--max-num-iterations counts images in distsplat)."""
    every: int
    """Images between checkpoints (points); a multiple of every batch size."""
    warmup: int
    """--pipeline.model.warmup-length (images before the first densification)."""
    refine_every: int
    """--pipeline.model.refine-every (images)."""


SIZES = {
    # ~3 min of training on 2 cores + eval: checks the whole path, figures too short to mean much.
    "quick": Size(downscale=8, images=120, every=40, warmup=40, refine_every=40),
    # Budgeted for <= 15 min total on 2 idle cores, 5 runs + eval: a 1/6-resolution run here cost
    # ~0.25 s of CPU per image on one core (150 images, 2026-12-01), so ~150 s for the 1-rank run,
    # ~400 s for the four 2-rank runs, ~100 s of start-up, ~150 s of eval. 600 images = ~3.7 epochs
    # of bird's 161 training views; refinement at 200, 300, 400 and 500 images.
    "full": Size(downscale=6, images=600, every=100, warmup=100, refine_every=100),
}


@dataclass(frozen=True)
class RunSpec:
    """One configuration: processes, parallel mode and global batch size."""

    name: str
    world_size: int
    parallel: str
    batch_size: int


def run_specs(world_size: int) -> list[RunSpec]:
    """The 1-rank reference and the W-rank runs (replicated and sharded at B = 1 and B = W)."""
    specs = [RunSpec("w1_b1", 1, "replicated", 1)]
    for parallel in ("replicated", "sharded"):
        for batch in sorted({1, world_size}):
            specs.append(RunSpec(f"w{world_size}_{parallel}_b{batch}", world_size, parallel, batch))
    return specs


# ----------------------------------------------------------------------------- pure parts
def cumulative_step_times(step_times: dict[int, float], steps: Sequence[int]) -> list[float]:
    """Wall time at the end of each of ``steps``: the sum of the step durations up to and including it.

    Args:
        step_times: Each step's duration, s, keyed by its 0-based index; must hold every step up
            to ``max(steps)``.
        steps: Steps to report, any order.

    Returns:
        One cumulative time per entry of ``steps``, s.

    Raises:
        ValueError: A step below ``max(steps)`` has no duration.
    """
    if not steps:
        return []
    last = max(steps)
    missing = [s for s in range(last + 1) if s not in step_times]
    if missing:
        raise ValueError(f"step_times lacks {len(missing)} steps up to {last} (first: {missing[0]})")
    running, total = {}, 0.0
    for s in range(last + 1):
        total += step_times[s]
        running[s] = total
    return [running[s] for s in steps]


def time_to_reach(times: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """First time a piecewise-linear curve reaches ``target`` (from below), or None if it never does.

    Args:
        times: Increasing times of the points, s.
        values: The curve's value at each time (e.g. PSNR, dB).
        target: The level to reach.

    Returns:
        The time of the first point at or above ``target`` when it is the first point; otherwise
        the linear interpolation between the last point below and the first point at or above it.

    Raises:
        ValueError: Lengths differ, or times do not increase.
    """
    if len(times) != len(values):
        raise ValueError(f"times and values must have the same length, got {len(times)} and {len(values)}")
    if any(b <= a for a, b in itertools.pairwise(times)):
        raise ValueError(f"times must increase, got {list(times)}")
    for i, (t, v) in enumerate(zip(times, values, strict=False)):
        if v >= target:
            if i == 0:
                return float(t)
            t0, v0 = times[i - 1], values[i - 1]
            return float(t0 + (target - v0) * (t - t0) / (v - v0))
    return None


def ratios_to_reference(curves: dict[str, dict[str, list[float]]], reference: str) -> dict[str, dict]:
    """For each curve but ``reference``: time to reach the reference's final value, over its last time.

    Args:
        curves: ``name -> {"wall_s": [...], "psnr": [...]}``.
        reference: The 1-rank run's name.

    Returns:
        ``name -> {"target_psnr", "time_to_target_s", "reference_wall_s", "ratio", "reached",
        "final_psnr_gap_db"}`` (``ratio`` and ``time_to_target_s`` None when not reached).
    """
    ref = curves[reference]
    target, ref_wall = ref["psnr"][-1], ref["wall_s"][-1]
    out = {}
    for name, curve in curves.items():
        if name == reference:
            continue
        reach = time_to_reach(curve["wall_s"], curve["psnr"], target)
        out[name] = {
            "target_psnr": target,
            "time_to_target_s": reach,
            "reference_wall_s": ref_wall,
            "ratio": None if reach is None else reach / ref_wall,
            "reached": reach is not None,
            "final_psnr_gap_db": curve["psnr"][-1] - target,
        }
    return out


def time_per_image_ratios(curves: dict[str, dict[str, list[float]]], reference: str) -> dict[str, float]:
    """For each curve but ``reference``: its wall time per image at its last point over the
    reference's (issue 28's figure: <= 0.57 at W = 2, B = 2, the better mode).

    Args:
        curves: ``name -> {"wall_s": [...], "images": [...]}``.
        reference: The 1-rank run's name.
    """

    def per_image(curve: dict[str, list[float]]) -> float:
        return curve["wall_s"][-1] / curve["images"][-1]

    ref = per_image(curves[reference])
    return {name: per_image(curve) / ref for name, curve in curves.items() if name != reference}


# ----------------------------------------------------------------------------- training
def train_args(spec: RunSpec, size: Size, out: Path, data: Path, device: str, seed: int) -> list[str]:
    """The ns-train arguments of one configuration (method first).

    Raises:
        ValueError: ``size.every`` is not a multiple of the batch size.
    """
    if size.every % spec.batch_size:
        raise ValueError(f"--every {size.every} must be a multiple of the batch size {spec.batch_size}")
    return [
        "distsplat",
        "--output-dir",
        str(out),
        "--experiment-name",
        "ttq",
        "--timestamp",
        spec.name,
        "--machine.device-type",
        device,
        "--machine.seed",
        str(seed),
        "--max-num-iterations",
        str(size.images),
        "--pipeline.batch-size",
        str(spec.batch_size),
        "--pipeline.parallel",
        spec.parallel,
        *unattended_args(save_every=size.every // spec.batch_size, eval_at_step_0=True),
        "--logging.max-buffer-size",
        "1",
        "--pipeline.model.num-downscales",
        "0",
        "--pipeline.model.warmup-length",
        str(size.warmup),
        "--pipeline.model.refine-every",
        str(size.refine_every),
        *colmap_args(data, size.downscale),
    ]


def train_run_command(
    spec: RunSpec,
    size: Size,
    out: Path,
    data: Path,
    device: str,
    seed: int,
    *,
    module: str | None = None,
    cores: Sequence[int] | None = None,
) -> list[str]:
    """The command of one configuration (``common.train_command``): on CPU pinned one core per rank
    (cores ``0..W-1``, or ``cores``); ``module`` runs a benchmark's ns-train wrapper instead of ns-train."""
    pinned = (cores if cores is not None else range(spec.world_size)) if device == "cpu" else None
    return train_command(
        train_args(spec, size, out, data, device, seed), world_size=spec.world_size, module=module, cores=pinned
    )


def step_times(run_dir: Path) -> dict[int, float]:
    """Each step's duration from the run's tensorboard file (rank 0's ``ITER_TRAIN_TIME``)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    times: dict[int, float] = {}
    for path in sorted(run_dir.glob("events.out.tfevents.*")):
        acc = EventAccumulator(str(path), size_guidance={"scalars": 0})
        acc.Reload()
        if STEP_TIME_TAG in acc.Tags().get("scalars", []):
            times.update({int(e.step): float(e.value) for e in acc.Scalars(STEP_TIME_TAG)})
    return times


def params_checkpoints(checkpoint_dir: Path) -> list[int]:
    """Steps of every complete checkpoint in ``checkpoint_dir``, each with a ``step-N.ckpt`` the eval can load.

    A sharded run writes ``step-N.dcp/`` (every rank's shard) and consolidates only its last one
    into nerfstudio's single file; the others are consolidated here (after training, untimed) with
    the trainer's own ``shard_checkpoint.consolidate_params``.
    """
    from distsplat_ns.checkpoint import FILE_SUFFIX, SHARDED_SUFFIX
    from distsplat_ns.distributed.restart import checkpoint_path, checkpoint_steps
    from distsplat_ns.parallel.shard_checkpoint import consolidate_params

    steps = checkpoint_steps(checkpoint_dir)
    for step in steps:
        path = checkpoint_path(checkpoint_dir, step)
        if path.name.endswith(SHARDED_SUFFIX) and not (checkpoint_dir / f"step-{step:09d}{FILE_SUFFIX}").exists():
            consolidate_params(path, checkpoint_dir, step)
    return steps


def train_run(spec: RunSpec, size: Size, out: Path, data: Path, device: str, seed: int) -> dict:
    """Train one configuration; return its command, step times, checkpoints and summary."""
    cmd = train_run_command(spec, size, out, data, device, seed)
    print(f"[ttq] training {spec.name}: {' '.join(cmd)}", flush=True)
    load_before = load_average_1min()
    t0 = time.perf_counter()
    run_command(cmd, name=f"run {spec.name}", env=child_env())
    command_s = time.perf_counter() - t0
    run_dir = out / "ttq" / "distsplat" / spec.name
    stats = json.loads((run_dir / "distsplat_stats.json").read_text())
    times = step_times(run_dir)
    ckpts = params_checkpoints(run_dir / "nerfstudio_models")
    walls = cumulative_step_times(times, ckpts)
    load_after = load_average_1min()
    print(
        f"[ttq] {spec.name}: {command_s:.0f} s, {len(ckpts)} checkpoints, load {load_before} -> {load_after}",
        flush=True,
    )
    return {
        "spec": asdict(spec),
        "command": cmd,
        "command_wall_s": command_s,
        "load_average_1min_before": load_before,
        "load_average_1min_after": load_after,
        "run_dir": str(run_dir),
        "checkpoint_steps": ckpts,
        "points_images": [(s + 1) * spec.batch_size for s in ckpts],
        "points_wall_s": walls,
        "sum_step_times_s": sum(times.values()),
        "steps_timed": len(times),
        "stats": {
            k: stats.get(k)
            for k in (
                "images_trained",
                "steps",
                "wall_time_s",
                "images_per_s",
                "final_eval_psnr",
                "final_gaussian_count",
                "time_breakdown_s",
                "per_rank_time_breakdown_s",
                "bytes_communicated_per_step",
                "world_size",
                "backend",
                # The planner's predicted / measured (tile intersections) and time imbalance per step.
                "balance",
            )
        },
    }


# ----------------------------------------------------------------------------- evaluation
def evaluate_checkpoints(run_dir: Path, steps: Sequence[int], result_path: Path) -> None:
    """Child process: eval PSNR of each checkpoint of ``run_dir`` on the eval split (ns-eval's metric)."""
    import torch
    from nerfstudio.utils.eval_utils import eval_setup

    def first_step(config):
        config.load_step = steps[0]
        # Decode in this process: eval DataLoader workers start per pass, and on a loaded machine
        # their start-up varied 2-90 s per pass (validation run, load ~6).
        config.pipeline.datamanager.eval_num_workers = 0
        return config

    t0 = time.perf_counter()
    _, pipeline, _, _ = eval_setup(run_dir / "config.yml", update_config_callback=first_step, test_mode="test")
    setup_s = time.perf_counter() - t0
    points = []
    for i, step in enumerate(steps):
        t0 = time.perf_counter()
        if i:  # as eval_load_checkpoint does, into the same pipeline
            state = torch.load(run_dir / "nerfstudio_models" / f"step-{step:09d}.ckpt", map_location="cpu")
            pipeline.load_pipeline(state["pipeline"], state["step"])
        metrics = pipeline.get_average_eval_image_metrics(step=step)
        points.append(
            {
                "step": step,
                "psnr": float(metrics["psnr"]),
                "ssim": float(metrics["ssim"]),
                "eval_s": time.perf_counter() - t0,
            }
        )
    num_images = len(pipeline.datamanager.fixed_indices_eval_dataloader)
    result_path.write_text(json.dumps({"setup_s": setup_s, "num_eval_images": num_images, "points": points}))


def eval_run(run: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "eval.json"
        cmd = [
            sys.executable,
            "-m",
            "benchmarks.bench_time_to_quality",
            "--eval-run",
            run["run_dir"],
            "--eval-steps",
            ",".join(map(str, run["checkpoint_steps"])),
            "--eval-out",
            str(result),
        ]
        print(f"[ttq] evaluating {run['spec']['name']}: {len(run['checkpoint_steps'])} checkpoints", flush=True)
        t0 = time.perf_counter()
        run_command(cmd, name=f"eval of {run['run_dir']}", env=child_env(threads=2))
        out = json.loads(result.read_text())
        out["command_wall_s"] = time.perf_counter() - t0
        return out


# ----------------------------------------------------------------------------- plot
def _load_at_start(result: dict) -> object:
    """The load average at the start, from ``machine`` (or an older result's ``loadavg_start``)."""
    return result["machine"]["load_average_1min_start"] if "machine" in result else result.get("loadavg_start")


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_i) = plt.subplots(1, 2, figsize=(10, 4), dpi=90)
    for name, run in result["runs"].items():
        style = {"marker": "o", "ms": 3, "label": name, "ls": "--" if run["spec"]["parallel"] == "sharded" else "-"}
        ax_t.plot(run["points_wall_s"], run["points_psnr"], **style)
        ax_i.plot(run["points_images"], run["points_psnr"], **style)
    target = result["target_psnr"]
    for ax in (ax_t, ax_i):
        ax.axhline(target, color="grey", ls="--", lw=0.8)
        ax.set_ylabel("eval PSNR (dB)")
        ax.grid(alpha=0.3)
    ax_t.set_xlabel("training wall time (s, eval excluded)")
    ax_i.set_xlabel("images trained")
    ax_i.legend(fontsize=8)
    ratios = ", ".join(
        f"{n}: {'{:.2f}x'.format(r['ratio']) if r['ratio'] is not None else 'not reached'}"
        for n, r in result["ratios_to_1_rank_final_psnr"].items()
    )
    fig.suptitle(
        f"{result['scene_name']} {result['resolution_px']} px, {result['size']} size, {result['device']}, "
        f"{'one core per rank' if result['device'] == 'cpu' else 'one GPU'}, load average {_load_at_start(result)}\n"
        f"time to the 1-rank final PSNR (grey) / 1-rank wall time:\n{ratios}",
        fontsize=8,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)


def markdown_table(result: dict) -> str:
    """The result as a markdown table (one row per run), with the settings and load above it."""
    lines = [
        (
            f"`{result['command']}` ({result['date_utc']}, {result['device']}, {result['pinning']}; "
            f"1-min load average {result['machine']['load_average_1min_start']} at the start, {result['machine']['load_average_1min_end']} at the end)."
        ),
        (
            f"Scene {result['scene_name']} at {result['resolution_px']} px ({result['scene_license']}), "
            f"{result['size_settings']['images']} images per run, seed {result['seed']}; eval on "
            f"{next(iter(result['runs'].values()))['eval']['num_eval_images']} held-out images. "
            f"Target: {result['target']}."
        ),
        "",
        (
            "| run | ranks | mode | B | final PSNR (dB) | train wall at last point (s) | images/s | "
            f"time to {result['target_psnr']:.2f} dB (s) | ratio to 1 rank | time per image / 1 rank's | eval time (s) |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    ratios = result["ratios_to_1_rank_final_psnr"]
    per_image = result["time_per_image_ratios"]
    for name, run in result["runs"].items():
        spec, r = run["spec"], ratios.get(name)
        if r is None:
            reach, ratio = f"{run['points_wall_s'][-1]:.1f} (its final)", "1 (reference)"
        elif r["reached"]:
            reach, ratio = f"{r['time_to_target_s']:.1f}", f"{r['ratio']:.2f}"
        else:
            reach, ratio = "not reached", f"not reached ({r['final_psnr_gap_db']:+.2f} dB at the end)"
        per_image_ratio = f"{per_image[name]:.3f}" if name in per_image else "1 (reference)"
        lines.append(
            f"| {name} | {spec['world_size']} | {spec['parallel']} | {spec['batch_size']} | {run['points_psnr'][-1]:.2f} | "
            f"{run['points_wall_s'][-1]:.1f} | {run['points_images'][-1] / run['points_wall_s'][-1]:.2f} | {reach} | {ratio} | "
            f"{per_image_ratio} | {sum(run['points_eval_s']):.1f} |"
        )
    lines.append("")
    lines.append(
        "Wall time = the sum of the run's own step times (eval and checkpoint writes excluded); images/s = images at the last point / that time."
    )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the validation size (SIZES['quick'])")
    parser.add_argument("--world-size", type=int, default=2, help="W, the ranks of the multi-rank runs")
    parser.add_argument("--images", type=int, default=None, help="override the size's training images per run")
    parser.add_argument("--every", type=int, default=None, help="override the size's images between checkpoints")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "bird")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="result JSON (default benchmarks/results/time_to_quality_<size>_<date>.json)",
    )
    parser.add_argument("--plot", type=Path, default=None, help="plot PNG (default docs/time_to_quality[_quick].png)")
    parser.add_argument(
        "--keep-runs", type=Path, default=None, help="keep the run folders here (default: a temporary folder)"
    )
    parser.add_argument("--replot", type=Path, default=None, help="only redraw the plot of an existing result JSON")
    parser.add_argument("--eval-run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--eval-steps", help=argparse.SUPPRESS)
    parser.add_argument("--eval-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.eval_run is not None:
        evaluate_checkpoints(args.eval_run, [int(s) for s in args.eval_steps.split(",")], args.eval_out)
        return
    size_name = "quick" if args.quick else "full"
    plot_path = args.plot or REPO / "docs" / f"time_to_quality{'_quick' if args.quick else ''}.png"
    if args.replot is not None:
        plot(json.loads(args.replot.read_text()), plot_path)
        print(f"[ttq] plot: {plot_path}")
        return
    import torch

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cpu" and len(os.sched_getaffinity(0)) < args.world_size:
        raise SystemExit(
            f"error: --world-size {args.world_size} needs {args.world_size} cores (one per rank), this process may use {len(os.sched_getaffinity(0))}"
        )
    if not (args.data / "sparse" / "0").is_dir():
        raise SystemExit(f"error: --data {args.data} has no sparse/0 (a COLMAP scene is expected)")
    size = SIZES[size_name]
    if args.images is not None or args.every is not None:
        size = replace(size, images=args.images or size.images, every=args.every or size.every)
    if size.images < size.every or size.every % args.world_size:
        raise SystemExit(
            f"error: --images {size.images} must be >= --every {size.every}, a multiple of --world-size {args.world_size}"
        )
    out_json = args.out or result_path(f"time_to_quality_{size_name}")
    work = args.keep_runs or Path(tempfile.mkdtemp(prefix="ttq_"))
    t_start = time.perf_counter()
    machine = machine_record()
    runs: dict[str, dict] = {}
    try:
        for spec in run_specs(args.world_size):
            runs[spec.name] = train_run(spec, size, work, args.data, device, args.seed)
        for run in runs.values():
            ev = eval_run(run)
            run["eval"] = ev
            run["points_psnr"] = [p["psnr"] for p in ev["points"]]
            run["points_ssim"] = [p["ssim"] for p in ev["points"]]
            run["points_eval_s"] = [p["eval_s"] for p in ev["points"]]
    finally:
        if args.keep_runs is None:
            shutil.rmtree(work, ignore_errors=True)
    curves = {n: {"wall_s": r["points_wall_s"], "psnr": r["points_psnr"]} for n, r in runs.items()}
    ratios = ratios_to_reference(curves, "w1_b1")
    per_image = time_per_image_ratios(
        {n: {"wall_s": r["points_wall_s"], "images": r["points_images"]} for n, r in runs.items()}, "w1_b1"
    )
    provenance = args.data / "PROVENANCE.txt"
    result = {
        "benchmark": "bench_time_to_quality",
        "date_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join(["python -m benchmarks.bench_time_to_quality", *sys.argv[1:]]),
        "size": size_name,
        "size_settings": asdict(size),
        "scene": str(args.data),
        "scene_name": args.data.name,
        "scene_license": _provenance(provenance),
        "resolution_px": None,
        "device": device,
        "pinning": (
            "OMP_NUM_THREADS=1; taskset -c 0..W-1 on ns-train / torchrun: one core per rank, DataLoader workers on the same cores"
            if device == "cpu"
            else "OMP_NUM_THREADS=1; all ranks on GPU 0 (gloo); no pinning"
        ),
        "machine": finish_machine_record(machine),
        "seed": args.seed,
        "wall_time_method": "sum of rank 0's per-step ITER_TRAIN_TIME (tensorboard, --logging.max-buffer-size 1) "
        "through each checkpoint's step; eval and checkpoint writes excluded",
        "eval_method": "nerfstudio eval_setup + pipeline.get_average_eval_image_metrics per checkpoint (ns-eval's metric), "
        "separate process after all training",
        "target_psnr": curves["w1_b1"]["psnr"][-1],
        "target": "W = 2 reaches the 1-rank final PSNR in <= 0.6x the 1-rank wall time (issue 21)",
        "ratios_to_1_rank_final_psnr": ratios,
        "time_per_image_target": "time per image at W = 2, B = 2 <= 0.57x that of W = 1, B = 1, the better of the two modes (issue 28)",
        "time_per_image_ratios": per_image,
        "runs": runs,
        "total_benchmark_s": time.perf_counter() - t_start,
    }
    result["resolution_px"] = _resolution(args.data, size.downscale)
    write_json(out_json, result)
    plot(result, plot_path)
    table = out_json.with_suffix(".md")
    table.write_text(markdown_table(result))
    print(
        f"[ttq] result: {out_json}\n[ttq] table: {table}\n[ttq] plot: {plot_path}\n[ttq] total {result['total_benchmark_s']:.0f} s"
    )
    for name, r in ratios.items():
        verdict = f"{r['ratio']:.2f}x" if r["reached"] else f"not reached (final {r['final_psnr_gap_db']:+.2f} dB)"
        print(
            f"[ttq] {name}: time to {r['target_psnr']:.2f} dB / 1-rank time = {verdict}; time per image / 1-rank's = {per_image[name]:.3f}"
        )


def _provenance(path: Path) -> str:
    """The scene's license and source lines from its PROVENANCE.txt (shared/data's format)."""
    if not path.exists():
        return f"no {path.name}: see the scene's own license"
    keep = [
        ln.split(":", 1)[1].strip()
        for ln in path.read_text().splitlines()
        if ln.startswith(("License", "Source repository"))
    ]
    return "; ".join(keep)


def _resolution(data: Path, downscale: int) -> str:
    """``WxH`` of the first image at 1/``downscale``, truncated as nerfstudio's camera rescale does."""
    from PIL import Image

    first = min((data / "images").iterdir())
    with Image.open(first) as im:
        width, height = im.size
    return f"{int(width / downscale)}x{int(height / downscale)}"


if __name__ == "__main__":
    main()
