"""Quality of decode at the training scale: eval PSNR of the same short run with images decoded at the
rendered size (DCT scale + box) vs decoded at full size and resized by the model (previous path).

Both runs: one process, CPU, same seed and flags, ``ns-train distsplat`` on a real COLMAP scene; the
only difference is whether the datamanager gets the model's resolution schedule
(``configure_training(downscale_at=...)``). The schedule is shortened
(``--resolution-schedule``) so that a short run passes through 1/4, 1/2 and full resolution.
Undistorted cameras are needed for the DCT-scaled decode to be used (distorted images are undistorted
at full size, then box-averaged): ``--drop-distortion`` copies the scene with its SIMPLE_RADIAL
cameras rewritten as SIMPLE_PINHOLE (lund_door's radial term is -0.034; both runs see the same data).
Prints one JSON object: each run's eval PSNR history (``distsplat_stats.json``) and the difference.

Usage: ``python benchmarks/bench_decode_quality.py [--scene scenes/lund_door] [--steps 300]``
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Run in the child: ns-train, with the datamanager's schedule switched off for the "model_resize" run.
_CHILD = """
import sys
from distsplat_ns.data.datamanager import ParallelFullImageDatamanager
if sys.argv.pop(1) == "model_resize":
    _configure = ParallelFullImageDatamanager.configure_training
    def _full_size(self, *args, downscale_at=None, **kwargs):
        return _configure(self, *args, downscale_at=None, **kwargs)
    ParallelFullImageDatamanager.configure_training = _full_size
from nerfstudio.scripts.train import entrypoint
sys.argv[0] = "ns-train"
entrypoint()
"""


def run(variant: str, scene: Path, out: Path, steps: int, schedule_images: int, eval_every: int) -> dict:
    cmd = [
        sys.executable,
        "-c",
        _CHILD,
        variant,
        "distsplat",
        "--output-dir",
        str(out),
        "--experiment-name",
        "quality",
        "--timestamp",
        variant,
        "--machine.device-type",
        "cpu",
        "--max-num-iterations",
        str(steps),
        "--vis",
        "tensorboard",
        "--viewer.quit-on-train-completion",
        "True",
        "--logging.local-writer.enable",
        "False",
        "--steps-per-eval-all-images",
        str(eval_every),
        "--steps-per-save",
        str(steps),
        "--pipeline.model.resolution-schedule",
        str(schedule_images),
        "colmap",
        "--data",
        str(scene),
        "--colmap-path",
        "sparse/0",
        "--load-3D-points",
        "True",
        "--downscale-factor",
        "1",
    ]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{variant} run failed:\n{proc.stderr[-4000:]}")
    stats = json.loads((out / "quality" / "distsplat" / variant / "distsplat_stats.json").read_text())
    return {
        "wall_s": time.perf_counter() - start,
        "eval_psnr_history": stats["eval_psnr_history"],
        "final_gaussian_count": stats.get("final_gaussian_count"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scene", type=Path, default=REPO / "scenes" / "lund_door")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--resolution-schedule", type=int, default=100, help="images per resolution doubling")
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--drop-distortion", action="store_true", help="rewrite SIMPLE_RADIAL cameras as SIMPLE_PINHOLE (in a copy)")
    args = parser.parse_args()
    report: dict = {
        "scene": str(args.scene),
        "steps": args.steps,
        "resolution_schedule_images": args.resolution_schedule,
        "drop_distortion": args.drop_distortion,
    }
    with tempfile.TemporaryDirectory() as tmp:
        scene = args.scene
        if args.drop_distortion:
            scene = Path(tmp) / "scene"
            shutil.copytree(args.scene, scene)
            cameras = scene / "sparse" / "0" / "cameras.txt"
            lines = [
                " ".join([*line.split()[:1], "SIMPLE_PINHOLE", *line.split()[2:7]]) if " SIMPLE_RADIAL " in line else line
                for line in cameras.read_text().splitlines()
            ]
            cameras.write_text("\n".join(lines) + "\n")
        for variant in ("decode_at_scale", "model_resize"):
            report[variant] = run(variant, scene, Path(tmp), args.steps, args.resolution_schedule, args.eval_every)
    final = {v: report[v]["eval_psnr_history"][-1][1] for v in ("decode_at_scale", "model_resize")}
    report["final_eval_psnr"] = final
    report["difference_db"] = final["decode_at_scale"] - final["model_resize"]
    report["within_0.1_db"] = abs(report["difference_db"]) <= 0.1
    sys.stdout.write(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
