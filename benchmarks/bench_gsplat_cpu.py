"""How fast is gsplat's own ``rasterization`` on the CPU shim (tests/helpers/gsplat_cpu.py) against the
package's reference backend, forward and backward, on a view the size of the CI scene's?

Both render the same seeded scene (one camera, ``--width`` x ``--height`` px, ``--gaussians``, SH
degree 3 as splatfacto trains) and run one backward of a random cotangent; the two alternate for
``--rounds`` rounds after one warm-up each, on one intra-op thread, timed by process CPU time (the
shared machine's other jobs move wall time more). Writes ``results/gsplat_cpu_speed_<date>.json``.

    python -m benchmarks.bench_gsplat_cpu                      # 242 x 162 px (scenes/lund_door), 11k Gaussians
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.common import finish_machine_record, machine_record, result_path, write_json


def _once(scene, backend: str) -> dict[str, float]:
    import gsplat

    from distsplat_ns.rendering import rasterization
    from tests.helpers import gsplat_cpu

    s = scene.with_grad()
    gen = torch.Generator().manual_seed(1)
    start = time.process_time()
    if backend == "gsplat-shim":
        with gsplat_cpu.installed():
            colors, alphas, _ = gsplat.rasterization(**s.kwargs(), packed=False)
            forward = time.process_time()
            (colors * torch.randn(colors.shape, generator=gen)).sum().backward()
    else:
        colors, alphas, _ = rasterization(**s.kwargs(), packed=False, backend="reference")
        forward = time.process_time()
        (colors * torch.randn(colors.shape, generator=gen)).sum().backward()
    end = time.process_time()
    return {"forward_s": forward - start, "backward_s": end - forward, "mean_alpha": float(alphas.detach().mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=162)
    parser.add_argument("--height", type=int, default=242)
    parser.add_argument("--gaussians", type=int, default=11000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from tests.helpers.scenes import random_scene

    machine = machine_record()
    scene = random_scene(num_gaussians=args.gaussians, num_cameras=1, width=args.width, height=args.height, seed=0,
                         sh_degree=3, scale_range=(0.005, 0.05))  # fmt: skip
    backends = ("reference", "gsplat-shim")
    for backend in backends:
        _once(scene, backend)  # warm-up: imports, first allocations
    runs: dict[str, list[dict[str, float]]] = {b: [] for b in backends}
    for _ in range(args.rounds):
        for backend in backends:
            runs[backend].append(_once(scene, backend))
    summary = {b: {k: statistics.median(r[k] for r in runs[b]) for k in ("forward_s", "backward_s")} for b in backends}
    for b in backends:
        summary[b]["total_s"] = summary[b]["forward_s"] + summary[b]["backward_s"]
    ratio = summary["gsplat-shim"]["total_s"] / summary["reference"]["total_s"]
    import gsplat

    path = write_json(
        result_path("gsplat_cpu_speed"),
        {
            "machine": finish_machine_record(machine),
            "question": "gsplat.rasterization on the CPU shim vs the reference backend, CPU s per view",
            "args": vars(args),
            "gsplat": gsplat.__version__,
            "median": summary,
            "shim_over_reference_total": ratio,
            "runs": runs,
        },
    )
    print(path, {b: round(summary[b]["total_s"], 3) for b in backends}, f"ratio {ratio:.2f}")


if __name__ == "__main__":
    main()
