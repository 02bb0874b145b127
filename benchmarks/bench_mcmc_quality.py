"""Quality of MCMC densification: eval PSNR of ``distsplat-mcmc`` vs ``distsplat`` at B = 1, the
same images and flags, over several seeds (issue 19), and whether the MCMC run ever held more
Gaussians than its cap.

Each run: one process, CPU (reference rasterizer), ``ns-train <method>`` on a COLMAP scene; both
methods get the same shortened densification schedule (``--warmup-length``, ``--refine-every``)
so that a short run has events. The MCMC runs' counts after every event are read from their log
lines ("MCMC relocated ..., added ...: N Gaussians over all ranks (cap C)"). Writes one JSON file
to benchmarks/results/ and prints it.

Usage: ``python benchmarks/bench_mcmc_quality.py [--scene ../shared/data/lund_door] [--images 300]
[--seeds 0 1 2] [--cap 20000]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EVENT = re.compile(r"MCMC relocated (\d+), added (\d+): (\d+) Gaussians over all ranks \(cap (\d+)\)")
VARIANTS = "distsplat-mcmc=distsplat_ns.registry:distsplat_mcmc,distsplat-big=distsplat_ns.registry:distsplat_big"


def run(method: str, seed: int, scene: Path, out: Path, images: int, warmup: int, refine_every: int, cap: int) -> dict:
    cmd = [
        str(Path(sys.executable).parent / "ns-train"), method,
        "--output-dir", str(out), "--experiment-name", "q", "--timestamp", f"{method}-{seed}",
        "--machine.device-type", "cpu", "--machine.seed", str(seed), "--max-num-iterations", str(images),
        "--vis", "tensorboard", "--viewer.quit-on-train-completion", "True", "--logging.local-writer.enable", "False",
        "--steps-per-eval-all-images", str(images), "--steps-per-save", str(images),
        "--pipeline.model.warmup-length", str(warmup), "--pipeline.model.refine-every", str(refine_every),
        *(["--pipeline.model.max-gs-num", str(cap)] if method == "distsplat-mcmc" else []),
        "colmap", "--data", str(scene), "--colmap-path", "sparse/0", "--load-3D-points", "True", "--downscale-factor", "1",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="2", PYTHONUNBUFFERED="1", NERFSTUDIO_METHOD_CONFIGS=VARIANTS)
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{method} seed {seed} failed:\n{proc.stderr[-4000:]}")
    stats = json.loads((out / "q" / method / f"{method}-{seed}" / "distsplat_stats.json").read_text())
    counts = [int(m.group(3)) for m in EVENT.finditer(proc.stdout + proc.stderr)]
    return {
        "method": method, "seed": seed, "final_eval_psnr": stats["final_eval_psnr"],
        "final_gaussian_count": stats["final_gaussian_count"], "event_counts": counts,
        "wall_s": round(time.perf_counter() - start, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scene", type=Path, default=REPO.parent / "shared" / "data" / "lund_door")
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--refine-every", type=int, default=50)
    parser.add_argument("--cap", type=int, default=13000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            for method in ("distsplat", "distsplat-mcmc"):
                runs.append(run(method, seed, args.scene, Path(tmp), args.images, args.warmup, args.refine_every, args.cap))
                print(json.dumps(runs[-1]), file=sys.stderr)
    summary = {}
    for method in ("distsplat", "distsplat-mcmc"):
        psnrs = [r["final_eval_psnr"] for r in runs if r["method"] == method]
        summary[method] = {"psnr_mean": statistics.mean(psnrs), "psnr_stdev": statistics.stdev(psnrs) if len(psnrs) > 1 else 0.0,
                           "psnr_min": min(psnrs), "psnr_max": max(psnrs)}
    mcmc_counts = [c for r in runs if r["method"] == "distsplat-mcmc" for c in [*r["event_counts"], r["final_gaussian_count"]]]
    summary["distsplat-mcmc"]["max_gaussians_seen"] = max(mcmc_counts)
    summary["distsplat-mcmc"]["cap"] = args.cap
    summary["distsplat-mcmc"]["cap_held"] = max(mcmc_counts) <= args.cap
    result = {
        "scene": args.scene.name, "images": args.images, "batch_size": 1, "warmup_images": args.warmup,
        "refine_every_images": args.refine_every, "seeds": args.seeds, "machine": "CPU, reference rasterizer, shared 2-core host",
        "summary": summary, "runs": runs,
    }
    target = REPO / "benchmarks" / "results" / f"mcmc_quality_{args.scene.name}_{datetime.date.today().isoformat()}.json"
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
