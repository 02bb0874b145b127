"""Pose refinement on a real scene (issue 29): does ``--pipeline.model.camera-optimizer.mode SO3xR3``
recover the eval PSNR lost to noisy training poses, and how close do the adjusted poses come to the
true ones?

Three runs of ``ns-train distsplat`` on the same images, one process, CPU (reference rasterizer),
B = 1, the same seed (same image order, backgrounds, draws):

* ``clean_off``: the scene's own COLMAP poses, pose optimisation off (the reference PSNR);
* ``noisy_off``: every *training* pose perturbed with known noise (each camera rotated by exactly
  ``--rot-deg`` about a random axis through its centre and moved by exactly ``--trans-frac`` of the
  scene extent in a random direction), optimisation off;
* ``noisy_so3xr3``: the same noisy poses, ``SO3xR3`` on.

The eval images keep their true poses in every run, so the eval PSNR (the trainer's own final
evaluation over every held-out image, ``final_eval_psnr`` of distsplat_stats.json) measures how
well each model matches the real scene. The remaining pose error compares each run's training
poses (``noisy_so3xr3``: the noisy poses with the learned adjustments applied as training applies
them, ``model/camera_adjust.py``) with the true ones: rotation angle (degrees) and centre distance
(fraction of the scene extent), mean and max over the training cameras.

Frame: nerfstudio's colmap dataparser normalises poses with a transform computed *from the poses*,
which the noise would change; here every run uses ``--orientation-method none --center-method none
--auto-scale-poses False --scale-factor S`` with S from the true poses (the largest camera distance
from the cameras' mean centre becomes 1: the "scene extent" of the translation noise). So all runs
and the true poses share one frame.

The camera optimizer's learning rate: splatfacto's default (1e-4, reached after a 1000-step warm-up
from 0) does nothing in a run this short; ``--camera-opt-lr`` (default 1e-3, no warm-up, decaying to
splatfacto's final 5e-7 over 30000 steps) is used instead, and recorded in the JSON.

Scene: /work/shared/data/lund_door (real DSLR capture, 12 photos 1296x1936 with COLMAP ground truth
poses and 11384 points; BSD-3 gtsfm repository, images from the Lund datasets, academic use: see its
PROVENANCE.txt), decoded at 1/``--downscale`` (1/16: 81x121 px). nerfstudio's colmap dataparser holds
out every 8th image (images 0 and 8: 2 eval images, 10 training cameras). The smallest of the
shared scenes to train: with 10 training cameras each pose is seen every 10 images.

Writes one JSON file to benchmarks/results/ and prints it.

Usage: ``nice -n 10 python benchmarks/bench_pose_refinement.py [--images 300] [--rot-deg 2] [--trans-frac 0.02]``
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
SCENE = REPO.parent / "shared" / "data" / "lund_door"
RUNS = ("clean_off", "noisy_off", "noisy_so3xr3")


def parser_config(scene: Path, downscale: int, scale: float):
    from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig

    return ColmapDataParserConfig(
        data=scene,
        colmap_path=Path("sparse/0"),
        downscale_factor=downscale,
        orientation_method="none",
        center_method="none",
        auto_scale_poses=False,
        scale_factor=scale,
        load_3D_points=False,
    )


def train_poses(scene: Path, downscale: int, scale: float) -> tuple[list[str], torch.Tensor]:
    """The training images' names and camera-to-world poses `[N, 3, 4]` (OpenGL) as the run parses them."""
    # Poses do not depend on the decode size: parsed at factor 1 (no images_N folder, no prompt).
    outputs = parser_config(scene, 1, scale).setup().get_dataparser_outputs(split="train")
    return [p.name for p in outputs.image_filenames], outputs.cameras.camera_to_worlds.double()


def extent_scale(scene: Path, downscale: int) -> float:
    """S: 1 / the largest distance of a camera centre from the mean centre (true poses, every image)."""
    _, c2w = train_poses(scene, downscale, 1.0)
    centres = c2w[:, :3, 3]
    return float(1.0 / (centres - centres.mean(dim=0)).norm(dim=1).max())


def random_rotation(angle_rad: float, rng: np.random.Generator) -> np.ndarray:
    axis = rng.normal(size=3)
    axis /= np.linalg.norm(axis)
    k = np.array([[0, -axis[2], axis[1]], [axis[2], 0, -axis[0]], [-axis[1], axis[0], 0]])
    return np.eye(3) + math.sin(angle_rad) * k + (1 - math.cos(angle_rad)) * k @ k


def make_scene(root: Path, names_to_perturb: list[str], rot_deg: float, trans_colmap: float, seed: int) -> Path:
    """A copy of the scene (images linked) whose COLMAP poses of ``names_to_perturb`` are perturbed:
    each camera rotated by ``rot_deg`` about a random axis through its centre and its centre moved by
    ``trans_colmap`` (COLMAP units) in a random direction. Nothing else changes."""
    from nerfstudio.data.utils.colmap_parsing_utils import qvec2rotmat, read_images_text, rotmat2qvec, write_images_text

    scene = root / "lund_door"
    (scene / "sparse" / "0").mkdir(parents=True)
    os.symlink(SCENE / "images", scene / "images")
    for name in ("cameras.txt", "points3D.txt"):
        shutil.copy(SCENE / "sparse" / "0" / name, scene / "sparse" / "0" / name)
    images = read_images_text(SCENE / "sparse" / "0" / "images.txt")
    rng = np.random.default_rng(seed)
    for key in sorted(images):
        image = images[key]
        if image.name not in names_to_perturb:
            continue
        w2c_rot = qvec2rotmat(image.qvec)
        centre = -w2c_rot.T @ image.tvec
        c2w_rot = w2c_rot.T @ random_rotation(math.radians(rot_deg), rng)  # rotated about its own centre
        direction = rng.normal(size=3)
        centre = centre + trans_colmap * direction / np.linalg.norm(direction)
        new_w2c = c2w_rot.T
        images[key] = image._replace(qvec=rotmat2qvec(new_w2c), tvec=-new_w2c @ centre)
    write_images_text(images, scene / "sparse" / "0" / "images.txt")
    return scene


def pose_errors(c2w: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """Rotation angle (degrees) and centre distance (scene extents) of each pose from the truth."""
    rel = c2w[:, :3, :3].transpose(1, 2) @ truth[:, :3, :3]
    # ||R - I||_F = 2 sqrt(2) sin(angle / 2): well conditioned near 0, unlike arccos of the trace.
    chord = torch.linalg.matrix_norm(rel - torch.eye(3, dtype=rel.dtype)) / (2 * math.sqrt(2))
    angles = torch.rad2deg(2 * torch.arcsin(chord.clamp(max=1.0)))
    dists = (c2w[:, :3, 3] - truth[:, :3, 3]).norm(dim=1)
    return {
        "rotation_deg_mean": float(angles.mean()),
        "rotation_deg_max": float(angles.max()),
        "translation_extent_mean": float(dists.mean()),
        "translation_extent_max": float(dists.max()),
    }


def adjusted_poses(ckpt: Path, c2w: torch.Tensor) -> torch.Tensor:
    """The noisy training poses with the run's learned adjustments (model/camera_adjust.py's formula)."""
    from nerfstudio.cameras.camera_optimizers import CameraOptimizerConfig
    from nerfstudio.cameras.cameras import Cameras

    from distsplat_ns.model.camera_adjust import adjusted_camera_to_worlds, with_train_camera_ids

    adjustment = torch.load(ckpt, map_location="cpu", weights_only=True)["pipeline"]["_model.camera_optimizer.pose_adjustment"]
    optimizer = CameraOptimizerConfig(mode="SO3xR3").setup(num_cameras=adjustment.shape[0], device="cpu")
    with torch.no_grad():
        optimizer.pose_adjustment.copy_(adjustment)
        cameras = Cameras(camera_to_worlds=c2w.float(), fx=1.0, fy=1.0, cx=1.0, cy=1.0, width=2, height=2)
        return adjusted_camera_to_worlds(optimizer, with_train_camera_ids(cameras, range(c2w.shape[0]))).double()


def train(run: str, scene: Path, out: Path, args: argparse.Namespace, scale: float) -> dict:
    cmd = [
        str(Path(sys.executable).parent / "ns-train"),
        "distsplat",
        "--output-dir",
        str(out),
        "--experiment-name",
        "pose",
        "--timestamp",
        run,
        "--machine.device-type",
        "cpu",
        "--machine.seed",
        str(args.seed),
        "--max-num-iterations",
        str(args.images),
        "--pipeline.batch-size",
        "1",
        "--pipeline.model.num-downscales",
        "0",
        "--vis",
        "tensorboard",
        "--viewer.quit-on-train-completion",
        "True",
        "--logging.local-writer.enable",
        "False",
        "--steps-per-eval-image",
        "1000000000",
        "--steps-per-eval-all-images",
        "1000000000",
        "--steps-per-save",
        "1000000000",
        "--pipeline.model.lpips",
        "off",
        "--pipeline.model.camera-optimizer.mode",
        "SO3xR3" if run.endswith("so3xr3") else "off",
        "--optimizers.camera-opt.optimizer.lr",
        str(args.camera_opt_lr),
        "--optimizers.camera-opt.scheduler.warmup-steps",
        "0",
        "colmap",
        "--data",
        str(scene),
        "--colmap-path",
        "sparse/0",
        "--load-3D-points",
        "True",
        "--downscale-factor",
        str(args.downscale),
        "--orientation-method",
        "none",
        "--center-method",
        "none",
        "--auto-scale-poses",
        "False",
        "--scale-factor",
        repr(scale),
    ]
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONPATH=str(REPO), PYTHONUNBUFFERED="1")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{run} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    folder = out / "pose" / "distsplat" / run
    stats = json.loads((folder / "distsplat_stats.json").read_text())
    ckpt = max((folder / "nerfstudio_models").glob("step-*.ckpt"))
    return {
        "final_eval_psnr": stats["final_eval_psnr"],
        "final_gaussian_count": stats["final_gaussian_count"],
        "train_wall_s": stats["wall_time_s"],
        "run_wall_s": time.perf_counter() - start,
        "checkpoint": ckpt,
    }


def main() -> None:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--images", type=int, default=300, help="training images (= steps at B = 1)")
    cli.add_argument("--rot-deg", type=float, default=2.0, help="rotation noise per training camera, degrees")
    cli.add_argument("--trans-frac", type=float, default=0.02, help="translation noise per camera, fraction of the scene extent")
    cli.add_argument("--downscale", type=int, default=16, help="decode the 1296x1936 images at 1/N")
    cli.add_argument("--camera-opt-lr", type=float, default=1e-3)
    cli.add_argument("--seed", type=int, default=0)
    cli.add_argument("--threads", type=int, default=1)
    cli.add_argument("--output", type=Path, default=None)
    args = cli.parse_args()
    sys.path.insert(0, str(REPO))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="pose_refine_") as tmp:
        tmp_path = Path(tmp)
        clean = make_scene(tmp_path / "clean", [], 0.0, 0.0, args.seed)
        scale = extent_scale(clean, args.downscale)
        names, truth = train_poses(clean, args.downscale, scale)
        noisy = make_scene(tmp_path / "noisy", names, args.rot_deg, args.trans_frac / scale, args.seed)
        noisy_names, noisy_c2w = train_poses(noisy, args.downscale, scale)
        assert noisy_names == names, "the two scenes must hold the same training images in the same order"
        results = {}
        for run in RUNS:
            results[run] = train(run, clean if run == "clean_off" else noisy, tmp_path / "out", args, scale)
        adjusted = adjusted_poses(results["noisy_so3xr3"].pop("checkpoint"), noisy_c2w)
        for run in RUNS[:2]:
            results[run].pop("checkpoint")
        results["clean_off"]["pose_error"] = pose_errors(truth, truth)
        results["noisy_off"]["pose_error"] = pose_errors(noisy_c2w, truth)
        results["noisy_so3xr3"]["pose_error"] = pose_errors(adjusted, truth)
    lost = results["clean_off"]["final_eval_psnr"] - results["noisy_off"]["final_eval_psnr"]
    recovered = results["noisy_so3xr3"]["final_eval_psnr"] - results["noisy_off"]["final_eval_psnr"]
    record = {
        "benchmark": "bench_pose_refinement",
        "date": datetime.date.today().isoformat(),
        "command": "python benchmarks/bench_pose_refinement.py " + " ".join(sys.argv[1:]),
        "scene": "lund_door (/work/shared/data, BSD-3 gtsfm)",
        "decoded_px": f"1/{args.downscale} of 1296x1936",
        "num_train_cameras": len(names),
        "images": args.images,
        "batch_size": 1,
        "seed": args.seed,
        "threads": args.threads,
        "noise": {"rotation_deg": args.rot_deg, "translation_extent": args.trans_frac, "scene_scale_S": scale},
        "camera_opt": {"mode": "SO3xR3", "lr": args.camera_opt_lr, "warmup_steps": 0},
        "runs": results,
        "psnr_lost_to_noise_db": lost,
        "psnr_recovered_by_so3xr3_db": recovered,
        "total_wall_s": time.perf_counter() - started,
    }
    text = json.dumps(record, indent=2)
    out = args.output or REPO / "benchmarks" / "results" / f"pose_refinement_lund_door_{record['date']}.json"
    out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
