"""Time the CPU reference backend: forward and backward of ``rasterization`` on a random scene.

Usage::

    python benchmarks/bench_reference_rasterizer.py [--num-gaussians 20000] [--sizes 256 64]
        [--repeats 3] [--threads N]

Writes one JSON object to stdout: per image size, the median milliseconds of a forward
(projection + rasterization) and of a backward (random-cotangent loss), the number of
Gaussian-tile intersections, and the peak RSS of a fresh process that ran only that size (with
the RSS it had right after importing torch, for reference).
Each size runs in its own subprocess so the peak RSS is that size's alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distsplat_ns.rendering import rasterization
from tests.helpers.scenes import random_scene


def _measure(num_gaussians: int, size: int, repeats: int) -> dict:
    baseline_rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # python + torch
    # A plausible scene: 20k Gaussians of 0.5-5 cm in a 2 m cube, 4 m in front of a 60-degree camera.
    scene = random_scene(num_gaussians=num_gaussians, width=size, height=size, seed=0,
                         scale_range=(0.005, 0.05), opacity_range=(0.05, 0.95)).with_grad()  # fmt: skip
    params = list(scene.params().values())
    cot = torch.randn(1, size, size, 3, generator=torch.Generator().manual_seed(1))
    forward_ms, backward_ms = [], []
    num_isects = 0
    for _ in range(repeats + 1):  # the first run warms up allocators and is discarded
        t0 = time.perf_counter()
        colors, alphas, meta = rasterization(**scene.kwargs(), packed=False, backend="reference")
        t1 = time.perf_counter()
        torch.autograd.grad((colors * cot).sum() + alphas.sum(), params)
        t2 = time.perf_counter()
        forward_ms.append(1e3 * (t1 - t0))
        backward_ms.append(1e3 * (t2 - t1))
        num_isects = int(meta["tile_counts"].sum())
    return {
        "width": size,
        "height": size,
        "num_gaussians": num_gaussians,
        "num_intersections": num_isects,
        "forward_ms": round(statistics.median(forward_ms[1:]), 1),
        "backward_ms": round(statistics.median(backward_ms[1:]), 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "baseline_rss_mb": round(baseline_rss_mb, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-gaussians", type=int, default=20000)
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 64])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    parser.add_argument("--_one", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args._one is not None:
        sys.stdout.write(json.dumps(_measure(args.num_gaussians, args._one, args.repeats)) + "\n")
        return
    results = []
    for size in args.sizes:
        cmd = [sys.executable, __file__, "--num-gaussians", str(args.num_gaussians), "--repeats", str(args.repeats),
               "--_one", str(size)] + (["--threads", str(args.threads)] if args.threads else [])  # fmt: skip
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results.append(json.loads(out.strip().splitlines()[-1]))
    report = {
        "benchmark": "reference rasterizer, CPU, float32, forward + backward",
        "torch": torch.__version__,
        "threads": args.threads or torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": round(os.getloadavg()[0], 2),  # other processes competing for the cores
        "machine": platform.processor() or platform.machine(),
        "results": results,
    }
    sys.stdout.write(json.dumps(report) + "\n")


if __name__ == "__main__":
    main()
