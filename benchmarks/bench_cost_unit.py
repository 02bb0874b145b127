"""Which count predicts a backend's render time, and what a band costs beyond its rows.

The balancer cuts each batch by the renderer's measured work per tile row (``RowRender.tile_work``,
docs/balance.md). This script checks the unit with a trained model of a real scene: it trains the
time-to-quality benchmark's 1-rank run (same scene, size, schedule and seed; ``--images`` of them)
on ``--device`` (cpu: the reference backend; cuda: gsplat), loads its last checkpoint, and for
every training camera times a whole image's forward (projection + ``rasterize_rows``) and backward,
in ``--repeats`` passes over the cameras, one thread on one core (on cuda, from a device sync to a
device sync). Each camera's time is the median of its repeats; ``noise_ms`` is the median absolute
difference of a repeat from its camera's median (what no count can predict).

Reported for each count (intersections; on the reference backend also composited pairs, the
count its ``tile_work`` is), and for both together: the least-squares fit ``time = a * count + b``
over the cameras, its R^2 and the residual standard deviation in ms. A count whose residual is near the noise predicts
the time; the balancer can then cut the ranks' times equal.

In the same passes each camera is also rendered as two bands (the top and the rest, cut at the middle
tile row), each with its own projection and render call, as two ranks render a cut image. Their
work is the whole image's, so the extra time is the fixed cost of a band: ``band_overhead_ms``
(median over the cameras), and ``band_cost_fraction``, that cost in the backend's unit (divided by
the slope of its count's fit) over the mean image's count -- what ``rendering/api.py:
BAND_COST_FRACTIONS`` holds per backend (docs/balance.md, "With a fixed cost per band").

Usage: ``python -m benchmarks.bench_cost_unit [--images 300] [--repeats 3] [--device cpu|cuda]``
(about 6 min on 2 idle cores; scripts/gpu_check.sh runs it on cuda). Writes
benchmarks/results/cost_unit_<date>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from benchmarks import bench_time_to_quality as ttq  # its run command, scene and sizes
from benchmarks.common import (
    SHARED_DATA,
    child_env,
    finish_machine_record,
    machine_record,
    result_path,
    run_command,
    write_json,
)

COUNTS = ("intersections", "composited_pairs")
"""The counts a camera can carry, in this order; the last one a camera has is its backend's
``tile_work`` (gsplat counts intersections only)."""


def fit_linear(columns: Sequence[Sequence[float]], y: Sequence[float]) -> dict:
    """Least squares ``y = sum_k coefficients[k] * columns[k] + intercept``; its R^2 and the
    residual s.d. (population)."""
    ys = np.asarray(y, dtype=np.float64)
    xs = np.asarray(columns, dtype=np.float64).reshape(len(columns), -1)
    if xs.shape[1] != ys.shape[0] or ys.shape[0] < xs.shape[0] + 2:
        raise ValueError(
            f"fit_linear: expected columns of {ys.shape[0]} values and more values than columns + 1, got {xs.shape}"
        )
    design = np.concatenate([xs.T, np.ones((ys.shape[0], 1))], axis=1)
    solution = np.linalg.lstsq(design, ys, rcond=None)[0]
    residual = ys - design @ solution
    total = float(np.sum((ys - ys.mean()) ** 2))
    return {
        "coefficients": solution[:-1].tolist(),
        "intercept": float(solution[-1]),
        "r2": 1.0 - float(np.sum(residual**2)) / total if total > 0 else 1.0,
        "residual_sd": float(residual.std()),
    }


def summarise(cameras: list[dict]) -> dict:
    """The lines fitted to the cameras' median times (ms) on each count they carry (and on both,
    where they carry two), the timing noise (ms) and, where the cameras were also timed as two
    bands, a band's fixed cost in the unit of their backend's work (``work_count``)."""
    times_ms = [1000 * statistics.median(c["times_s"]) for c in cameras]
    noise = statistics.median(abs(1000 * t - m) for c, m in zip(cameras, times_ms, strict=True) for t in c["times_s"])
    counts = [name for name in COUNTS if name in cameras[0]]
    fits = {name: fit_linear([[c[name] for c in cameras]], times_ms) for name in counts}
    if len(counts) > 1:
        fits["both"] = fit_linear([[c[name] for c in cameras] for name in counts], times_ms)
    for fit in fits.values():
        fit["residual_sd_ms"] = fit.pop("residual_sd")
    summary = {
        "cameras": len(cameras),
        "mean_time_ms": statistics.fmean(times_ms),
        "noise_ms": noise,
        "fits": fits,
        "work_count": counts[-1],
    }
    if all(c.get("two_band_times_s") for c in cameras):
        overhead_ms = statistics.median(
            1000 * statistics.median(c["two_band_times_s"]) - m for c, m in zip(cameras, times_ms, strict=True)
        )
        slope = fits[counts[-1]]["coefficients"][0]  # ms per unit of work
        mean_work = statistics.fmean(c[counts[-1]] for c in cameras)
        summary["band_overhead_ms"] = overhead_ms
        summary["band_cost_fraction"] = overhead_ms / slope / mean_work if slope > 0 and mean_work > 0 else None
    return summary


def time_cameras(run_dir: Path, repeats: int) -> tuple[list[dict], dict]:
    """Every training camera's render times and counts with the run's last checkpoint."""
    import torch
    from nerfstudio.utils.eval_utils import eval_setup

    from distsplat_ns.balance.bands import TILE_SIZE, num_tile_rows
    from distsplat_ns.rendering.api import RowRender, rasterize_rows, resolve_backend
    from distsplat_ns.utils.cameras import cameras_at
    from distsplat_ns.utils.host_allocator import keep_freed_host_memory

    torch.set_num_threads(1)
    keep_freed_host_memory()  # as the trainer does: no page faults on the step's fresh memory
    _, pipeline, _, step = eval_setup(run_dir / "config.yml", test_mode="test")
    model = pipeline.model
    cameras = pipeline.datamanager.train_dataset.cameras
    backend = resolve_backend(model.config.rendering_backend, model.device)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)

    def render(camera, split: bool = False) -> tuple[float, RowRender]:
        """The whole image, or (``split``) its two bands, each projected and rendered on its own;
        one backward of the summed loss, as a rank's step."""
        model.zero_grad(set_to_none=True)
        sync()
        start = time.perf_counter()
        height = int(camera.height[0])
        cut = TILE_SIZE * (num_tile_rows(height) // 2) if split else height
        loss, out = 0.0, None
        for first, rows in ((0, cut), (cut, height - cut)) if split else ((0, height),):
            ((_, proj),) = model.project_cameras(camera, step)
            out = rasterize_rows(proj, [first], rows, tile_size=TILE_SIZE)
            loss = loss + out.colors.square().mean()
        loss.backward()
        sync()
        return time.perf_counter() - start, out

    for _ in range(3):  # warm-up: the allocator's pools, the first calls' dispatch
        render(cameras_at(cameras, [0]))
        render(cameras_at(cameras, [0]), split=True)
    rows = [{"camera": index, "times_s": [], "two_band_times_s": []} for index in range(len(cameras))]
    for _ in range(repeats):  # whole passes: a slow spell of the machine falls on one repeat of many cameras
        for row in rows:
            seconds, out = render(cameras_at(cameras, [row["camera"]]))
            row["times_s"].append(seconds)
            row["intersections"] = int(out.tile_counts.sum())
            if backend == "reference":  # its tile_work counts composited pairs; gsplat's is the intersections
                row["composited_pairs"] = int(out.tile_work.sum())
            row["two_band_times_s"].append(render(cameras_at(cameras, [row["camera"]]), split=True)[0])
    return rows, {
        "step": step,
        "num_gaussians": int(model.num_points),
        "backend": backend,
        "size_px": list(out.colors.shape[1:3][::-1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=300, help="training images of the 1-rank run")
    parser.add_argument("--repeats", type=int, default=3, help="timings per camera")
    parser.add_argument("--data", type=Path, default=SHARED_DATA / "bird")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--device", choices=["cpu", "cuda"], default="cpu", help="cpu: the reference backend; cuda: gsplat"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="result JSON (default benchmarks/results/cost_unit_<date>.json)"
    )
    parser.add_argument("--time-run", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--time-out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.time_run is not None:
        rows, model = time_cameras(args.time_run, args.repeats)
        args.time_out.write_text(json.dumps({"rows": rows, "model": model}))
        return
    if args.repeats < 2:
        raise SystemExit(f"error: --repeats {args.repeats}: at least 2 are needed to measure the noise")
    size = replace(ttq.SIZES["full"], images=args.images, every=args.images)
    machine = machine_record()
    with tempfile.TemporaryDirectory(prefix="cost_unit_") as tmp:
        work = Path(tmp)
        run = ttq.train_run(ttq.RunSpec("w1_b1", 1, "replicated", 1), size, work, args.data, args.device, args.seed)
        times_path = work / "times.json"
        timing = [
            sys.executable,
            "-m",
            "benchmarks.bench_cost_unit",
            "--time-run",
            run["run_dir"],
            "--time-out",
            str(times_path),
            "--repeats",
            str(args.repeats),
        ]
        if args.device == "cpu":
            timing = ["taskset", "-c", "0", *timing]
        print("[cost_unit] timing every training camera", flush=True)
        run_command(timing, name="timing", env=child_env())
        measured = json.loads(times_path.read_text())
    result = {
        "benchmark": "bench_cost_unit",
        "command": " ".join(["python -m benchmarks.bench_cost_unit", *sys.argv[1:]]),
        "machine": finish_machine_record(machine),
        "train_command": run["command"],
        "scene": str(args.data.name),
        "device": args.device,
        "images": args.images,
        "seed": args.seed,
        "repeats": args.repeats,
        "model": measured["model"],
        "summary": summarise(measured["rows"]),
        "cameras": measured["rows"],
    }
    out = write_json(args.out or result_path("cost_unit"), result)
    print(json.dumps({k: result[k] for k in ("model", "summary")}, indent=1))
    print(f"[cost_unit] wrote {out}")


if __name__ == "__main__":
    main()
