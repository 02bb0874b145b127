"""Load-balance benchmark (docs/balance_results.md): how evenly each way of splitting a batch spreads the work.

For every scene (``--scene``; defaults: fox, lund_door, bird) the script

1. makes a downscaled copy of the scene when asked (``images_N`` folder of resized JPEGs next to
   symlinks of the originals; nerfstudio's dataparsers rescale the intrinsics themselves: the
   nerfstudio-data parser reads ``images_N/<name>`` for ``--downscale-factor N``, the colmap
   parser ``images_N/<name>``, both flooring ``size / N``);
2. trains ``ns-train distsplat`` on it (one CPU process, batch size 1, a checkpoint every
   ``--save-every`` steps), cached in ``--out`` so reruns skip training;
3. loads the final checkpoint and an EARLIER one (``--lag-epochs`` epochs before it: at steady
   state the balancer cuts with the costs measured when the camera was last rendered, about one
   epoch earlier) and measures, for every training camera, the renderer's work per 16-px tile
   row: Gaussian-tile intersections (``tile_counts`` summed over the tile columns), at the
   resolution training ended with and at full resolution;
4. for each ``(B, W)`` draws ``--num-batches`` random batches of B distinct training cameras and
   reports the imbalance (max / mean per-rank work, measured with the FINAL model's costs) of
   (a) whole images per rank (gsplat), (b) equal row counts per rank (Grendel-GS's cold start),
   (c) this balancer cutting with the earlier checkpoint's costs, (c_history) the balancer
   cutting with the cost history stored in the final checkpoint (what the run's planner would use
   for its next step; training resolution only), (c_oracle) the balancer cutting with the final
   costs themselves (only row granularity left); plus the prediction error of (c): per rank,
   |predicted share - measured share| / measured share, max over ranks (as the planner logs it);
5. optionally (``--wallclock``) runs ``torchrun --nproc_per_node W ns-train distsplat`` on CPU/gloo
   for each partition mode and batch size and reads ``balance.*`` from ``distsplat_stats.json``.

Prints one JSON object on stdout (and writes it to ``--json`` when given).

Usage (the figures in docs/balance_results.md)::

    python -m benchmarks.bench_balance --out /tmp/balance_runs --json benchmarks/results/balance_DATE.json

Shape letters: B images in a batch, W (``world_size``) ranks, T tile rows of one image.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.common import (
    SHARED_DATA,
    child_env,
    finish_machine_record,
    machine_record,
    run_command,
    train_command,
    unattended_args,
)

if TYPE_CHECKING:
    import numpy as np

SHARED = SHARED_DATA.resolve()
TILE = 16

DEFAULT_SCENES = [
    # name, dataparser, data folder, downscale of the copy, images to train, dataparser args
    # fox has no point cloud: splatfacto's 50k random Gaussians cost ~30 s per 67x120 image here
    f"name=fox parser=nerfstudio-data data={SHARED / 'fox'} downscale=16 images=2000 train='--pipeline.model.num-random 5000'",
    (
        f"name=lund_door parser=colmap data={SHARED / 'lund_door'} downscale=16 images=2000 args='--colmap-path sparse/0 --load-3D-points True'"
    ),
    (
        f"name=bird parser=colmap data={SHARED / 'bird'} downscale=8 images=2000 args='--colmap-path sparse/0 --load-3D-points True'"
    ),
]
DEFAULT_CONFIGS = "1x2,1x4,2x2,3x2,4x2,8x4"


# ------------------------------------------------------------------------------------ scenes
def parse_scene(spec: str) -> dict[str, Any]:
    """``name=.. parser=.. data=.. [downscale=N] [images=N] [args='...'] [train='...']`` -> dict.

    ``args`` go to the dataparser, ``train`` to ns-train (before the dataparser) for this scene.
    """
    scene: dict[str, Any] = {"downscale": 1, "images": 2000, "args": "", "train": ""}
    for token in shlex.split(spec):
        if "=" not in token:
            raise ValueError(f"--scene: expected key=value tokens, got {token!r} in {spec!r}")
        key, value = token.split("=", 1)
        scene[key] = value
    for key in ("name", "parser", "data"):
        if key not in scene:
            raise ValueError(f"--scene: missing {key}= in {spec!r}")
    scene["downscale"] = int(scene["downscale"])
    scene["images"] = int(scene["images"])
    scene["data"] = str(Path(scene["data"]).expanduser().resolve())
    return scene


def prepare_scene(scene: dict[str, Any], out: Path) -> Path:
    """The data folder to train on: the original, or a copy with an ``images_N`` folder."""
    factor = scene["downscale"]
    src = Path(scene["data"])
    if factor == 1:
        return src
    dst = out / "scenes" / f"{scene['name']}_ds{factor}"
    marker = dst / ".complete"
    if marker.exists():
        return dst
    from PIL import Image

    dst.mkdir(parents=True, exist_ok=True)
    for entry in src.iterdir():
        link = dst / entry.name
        if not link.exists():
            link.symlink_to(entry)
    image_dir = src / "images"
    down_dir = dst / f"images_{factor}"
    down_dir.mkdir(exist_ok=True)
    for path in sorted(image_dir.iterdir()):
        if path.suffix.lower() not in (".jpg", ".jpeg", ".png"):
            continue
        with Image.open(path) as img:
            w, h = img.size
            small = img.convert("RGB").resize((w // factor, h // factor), Image.BICUBIC)
            small.save(down_dir / path.name, quality=95)
    marker.write_text("ok\n")
    return dst


def scene_train_args(scene: dict[str, Any], data: Path, out: Path, save_every: int, extra: str) -> list[str]:
    """The ns-train arguments of a scene's cached 1-process training run."""
    return [
        "distsplat",
        "--output-dir", str(out / "runs"), "--experiment-name", scene["name"], "--timestamp", "bench",
        "--machine.device-type", "cpu", "--max-num-iterations", str(scene["images"]),
        *unattended_args(save_every=save_every),
        *shlex.split(extra), *shlex.split(scene["train"]),
        scene["parser"], "--data", str(data), "--downscale-factor", str(scene["downscale"]),
        *shlex.split(scene["args"]),
    ]  # fmt: skip


def run_dir(scene: dict[str, Any], out: Path) -> Path:
    return out / "runs" / scene["name"] / "distsplat" / "bench"


def ensure_trained(scene: dict[str, Any], out: Path, save_every: int, extra: str, log) -> dict[str, Any]:
    """Train (unless cached) and return the run's facts."""
    data = prepare_scene(scene, out)
    rdir = run_dir(scene, out)
    stats = rdir / "distsplat_stats.json"
    cmd = train_command(scene_train_args(scene, data, out, save_every, extra))
    if not stats.exists():
        if rdir.exists():
            shutil.rmtree(rdir)  # an interrupted run: start again
        log(f"[{scene['name']}] training: {' '.join(shlex.quote(c) for c in cmd)}")
        t0 = time.perf_counter()
        run_command(
            cmd,
            name=f"training {scene['name']}",
            env=child_env(threads=None),
            cwd=out,
            log=out / f"train_{scene['name']}.log",
        )
        log(f"[{scene['name']}] trained in {time.perf_counter() - t0:.0f} s")
    else:
        log(f"[{scene['name']}] cached run: {rdir}")
    return {"run_dir": str(rdir), "data": str(data), "command": cmd, "stats": json.loads(stats.read_text())}


# ------------------------------------------------------------------------------------ costs
def checkpoint_steps(rdir: Path) -> list[tuple[int, Path]]:
    ckpts = sorted((rdir / "nerfstudio_models").glob("step-*.ckpt"))
    return [(int(p.stem.split("-")[1]), p) for p in ckpts]


def load_pipeline(rdir: Path):
    """The run's pipeline (nerfstudio's eval_setup, CPU), with its latest checkpoint loaded."""
    from nerfstudio.utils.eval_utils import eval_setup

    def to_cpu(config):
        config.machine.device_type = "cpu"
        return config

    _config, pipeline, _path, _step = eval_setup(rdir / "config.yml", test_mode="test", update_config_callback=to_cpu)
    return pipeline


def load_step(pipeline, path: Path) -> int:
    from distsplat_ns.checkpoint import load_checkpoint_file

    state = load_checkpoint_file(path)
    pipeline.load_pipeline(state["pipeline"], state["step"])
    return int(state["step"])


def camera_row_costs(pipeline, scale: float, check_renderer: bool = False) -> tuple[list[np.ndarray], dict[str, Any]]:
    """Per training camera, Gaussian-tile intersections per tile row at resolution x ``1/scale``.

    The counts come from ``reference.intersect_tiles``, the function whose ``tile_counts``
    ``rasterize_rows`` returns on CPU (no pixels are rasterized, so full resolution stays cheap);
    with ``check_renderer`` the first cameras are also rendered through ``rasterize_rows`` (whole
    image and a band) and the counts compared.
    """
    import torch

    from distsplat_ns.rendering import project, rasterize_rows
    from distsplat_ns.rendering.reference import intersect_tiles

    model = pipeline.model
    model.train()  # the training path of _cameras_to_render_inputs (camera optimizer applied)
    cameras = pipeline.datamanager.train_dataset.cameras
    out: list[np.ndarray] = []
    sizes = set()
    checks = []
    with torch.no_grad():
        params = model._activated()
        for index in range(len(cameras)):
            cam = cameras[torch.tensor([index])]
            viewmats, Ks, width, height = model._cameras_to_render_inputs(cam, scale)
            sizes.add((width, height))
            proj = project(
                **params, viewmats=viewmats, Ks=Ks, width=width, height=height, sh_degree=0,
                rasterize_mode=model.config.rasterize_mode, backend="reference",
            )  # fmt: skip
            rows, cols = -(-height // TILE), -(-width // TILE)
            counts = intersect_tiles(proj.means2d, proj.radii, proj.depths, TILE, rows, cols).tile_counts[0]
            out.append(counts.sum(dim=-1).to(torch.float64).numpy())
            if check_renderer and index < 3:
                whole = rasterize_rows(proj, [0], height, tile_size=TILE).tile_counts[0]
                first = rows // 2
                band = rasterize_rows(proj, [first * TILE], height - first * TILE, tile_size=TILE).tile_counts[0]
                checks.append(bool(torch.equal(whole, counts)) and bool(torch.equal(band, counts[first:])))
    info = {"sizes_px": sorted(sizes), "tile_rows": sorted({len(c) for c in out})}
    if check_renderer:
        info["renderer_counts_equal"] = all(checks)
    return out, info


# ------------------------------------------------------------------------------------ imbalance
def summarise(values: Sequence[float]) -> dict[str, float]:
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    return {"mean": float(arr.mean()), "p95": float(np.percentile(arr, 95)), "max": float(arr.max())}


def share_error(predicted: Sequence[float], measured: Sequence[float]) -> tuple[float, float]:
    """(max, mean) over ranks of |predicted share - measured share| / measured share.

    The max is what ``BandPlanner.observe`` logs as the prediction error; ranks with no work
    (B < W whole images, fewer rows than ranks) have share 0 in both and count as 0.
    """
    ptot, mtot = sum(predicted), sum(measured)
    if mtot <= 0 or ptot <= 0:
        return 0.0, 0.0
    errs = []
    for p, m in zip(predicted, measured, strict=False):
        ms, ps = m / mtot, p / ptot
        errs.append(0.0 if ms == 0 and ps == 0 else abs(ps - ms) / max(ms, 1e-12))
    return max(errs), sum(errs) / len(errs)


def evaluate_config(
    final: list[np.ndarray],
    earlier: list[np.ndarray],
    history: list[np.ndarray] | None,
    batch_size: int,
    world_size: int,
    num_batches: int,
    seed: int,
    snap_tolerance: float,
    min_band_rows: int,
) -> dict[str, Any]:
    import numpy as np

    from distsplat_ns.balance import equal_rows_partition, imbalance, partition_rows, rank_costs, whole_image_partition

    rng = np.random.default_rng(seed)
    num_cams = len(final)
    res: dict[str, list[float]] = {
        k: []
        for k in (
            "whole_images",
            "equal_rows",
            "balanced",
            "balanced_oracle",
            "err_max",
            "err_mean",
            "balanced_history",
            "hist_err_max",
            "hist_err_mean",
        )
    }
    worse = 0
    for _ in range(num_batches):
        batch = rng.choice(num_cams, size=min(batch_size, num_cams), replace=False).tolist()
        fin = [final[c] for c in batch]
        counts = [len(f) for f in fin]
        res["whole_images"].append(imbalance(whole_image_partition(counts, world_size), fin))
        res["equal_rows"].append(imbalance(equal_rows_partition(counts, world_size), fin))
        oracle = partition_rows(fin, world_size, min_band_rows=min_band_rows, snap_tolerance=snap_tolerance)
        res["balanced_oracle"].append(imbalance(oracle, fin))
        pred_costs = [earlier[c] for c in batch]
        cut = partition_rows(pred_costs, world_size, min_band_rows=min_band_rows, snap_tolerance=snap_tolerance)
        value = imbalance(cut, fin)
        res["balanced"].append(value)
        worse += int(value > res["whole_images"][-1] + 1e-9)
        e_max, e_mean = share_error(rank_costs(cut, pred_costs), rank_costs(cut, fin))
        res["err_max"].append(e_max)
        res["err_mean"].append(e_mean)
        if history is not None:
            hist_costs = [history[c] for c in batch]
            hcut = partition_rows(hist_costs, world_size, min_band_rows=min_band_rows, snap_tolerance=snap_tolerance)
            res["balanced_history"].append(imbalance(hcut, fin))
            h_max, h_mean = share_error(rank_costs(hcut, hist_costs), rank_costs(hcut, fin))
            res["hist_err_max"].append(h_max)
            res["hist_err_mean"].append(h_mean)
    summary: dict[str, Any] = {"B": batch_size, "W": world_size, "num_batches": num_batches}
    summary["imbalance"] = {
        "a_whole_images": summarise(res["whole_images"]),
        "b_equal_rows": summarise(res["equal_rows"]),
        "c_balanced": summarise(res["balanced"]),
        "c_oracle_final_costs": summarise(res["balanced_oracle"]),
    }
    summary["prediction_error_c"] = {
        "max_over_ranks": summarise(res["err_max"]),
        "mean_over_ranks": summarise(res["err_mean"]),
    }
    if history is not None:
        summary["imbalance"]["c_history_in_checkpoint"] = summarise(res["balanced_history"])
        summary["prediction_error_c_history"] = {
            "max_over_ranks": summarise(res["hist_err_max"]),
            "mean_over_ranks": summarise(res["hist_err_mean"]),
        }
    summary["batches_c_worse_than_a"] = worse
    a, b, c = (summary["imbalance"][k]["mean"] for k in ("a_whole_images", "b_equal_rows", "c_balanced"))
    summary["targets"] = {
        "c_le_1.10_where_a_or_b_gt_1.3": None if max(a, b) <= 1.3 else bool(c <= 1.10),
        "c_never_worse_than_a": worse == 0,
        "prediction_error_mean_le_0.10": bool(summary["prediction_error_c"]["max_over_ranks"]["mean"] <= 0.10),
    }
    return summary


def analyse_scene(
    scene: dict[str, Any], run: dict[str, Any], configs: list[tuple[int, int]], args, log
) -> dict[str, Any]:
    import numpy as np

    rdir = Path(run["run_dir"])
    steps = checkpoint_steps(rdir)
    if not steps:
        raise FileNotFoundError(f"no checkpoints in {rdir}")
    pipeline = load_pipeline(rdir)
    num_train = len(pipeline.datamanager.train_dataset)
    batch_train = int(pipeline.config.batch_size)
    final_step, final_path = steps[-1]
    epoch_steps = -(-num_train // batch_train)
    target = final_step - args.lag_epochs * epoch_steps
    earlier = [s for s in steps if s[0] < final_step]
    if not earlier:
        raise ValueError(f"{scene['name']}: only one checkpoint; train longer or save more often")
    early_step, early_path = min(earlier, key=lambda s: (abs(s[0] - target), -s[0]))
    train_downscale = int(pipeline.model.downscale_factor_at(final_step))
    result: dict[str, Any] = {
        "name": scene["name"],
        "data": run["data"],
        "dataparser": scene["parser"],
        "dataparser_downscale": scene["downscale"],
        "images_trained": run["stats"].get("images_trained"),
        "train_images_per_s": run["stats"].get("images_per_s"),
        "num_train_cameras": num_train,
        "train_batch_size": batch_train,
        "final_step": final_step,
        "earlier_step": early_step,
        "lag_images": (final_step - early_step) * batch_train,
        "lag_epochs": (final_step - early_step) * batch_train / num_train,
        "training_command": " ".join(shlex.quote(c) for c in run["command"]),
        "resolutions": {},
    }
    # Planner history stored in the final checkpoint (what the run's balancer knows next step).
    load_step(pipeline, final_path)
    result["num_gaussians_final"] = int(pipeline.model.num_points)
    history = None
    planner = getattr(pipeline, "planner", None)
    if planner is not None and train_downscale in planner._histories:
        hist = planner.history(train_downscale)
        measured = sum(hist.has_measurement(c) for c in range(num_train))
        history = [hist.get(c).numpy().astype(np.float64) for c in range(num_train)]
        result["history_cameras_measured"] = int(measured)
    resolutions = {"training": float(train_downscale), "full": 1.0 / scene["downscale"]}
    finals, earlies = {}, {}
    for label, scale in resolutions.items():
        finals[label], info = camera_row_costs(pipeline, scale, check_renderer=(label == "training"))
        result["resolutions"][label] = {"downscale_vs_dataparser": scale, **info}
    load_step(pipeline, early_path)
    result["num_gaussians_earlier"] = int(pipeline.model.num_points)
    for label, scale in resolutions.items():
        earlies[label], _ = camera_row_costs(pipeline, scale)
    for label in resolutions:
        fin, ear = finals[label], earlies[label]
        row_share = [f / max(f.sum(), 1e-12) for f in fin]
        peak = [float(s.max() * len(s)) for s in row_share]  # busiest row / mean row, per camera
        totals = np.array([f.sum() for f in fin])
        res = result["resolutions"][label]
        res["busiest_row_over_mean_row"] = summarise(peak)
        res["camera_cost_max_over_mean"] = float(totals.max() / totals.mean())
        res["camera_cost_change_earlier_to_final"] = summarise(
            [abs(f.sum() / max(e.sum(), 1e-12) - 1) for f, e in zip(fin, ear, strict=False)]
        )
        hist = history if label == "training" else None
        if hist is not None and any(len(h) != len(f) for h, f in zip(hist, fin, strict=False)):
            log(f"[{scene['name']}] history rows differ from measured rows; history not used")
            hist = None
        res["configs"] = []
        for b, w in configs:
            log(f"[{scene['name']}] {label} B={b} W={w}")
            res["configs"].append(
                evaluate_config(
                    fin, ear, hist, b, w, args.num_batches, args.seed, args.snap_tolerance, args.min_band_rows
                )
            )
    return result


# ------------------------------------------------------------------------------------ wall clock
def wallclock_runs(scene: dict[str, Any], data: Path, args, log) -> list[dict[str, Any]]:
    """``torchrun --nproc_per_node W ns-train distsplat`` (gloo, CPU) per partition mode and B."""
    runs = []
    for batch in [int(b) for b in args.wallclock_batch_sizes.split(",") if b]:
        for repeat in range(args.wallclock_repeats):
            for mode in ("whole-images", "equal-rows", "balanced"):
                name = f"{scene['name']}_{mode}_B{batch}_W{args.wallclock_world_size}_r{repeat}"
                out_dir = args.out / "wallclock"
                stats_path = out_dir / scene["name"] / "distsplat" / name / "distsplat_stats.json"
                # A cached run is reused whatever --wallclock-images was: "images" reports its own count.
                train = [
                    "distsplat",
                    "--output-dir", str(out_dir), "--experiment-name", scene["name"], "--timestamp", name,
                    "--machine.device-type", "cpu", "--max-num-iterations", str(args.wallclock_images),
                    "--pipeline.partition", mode, "--pipeline.batch-size", str(batch), *unattended_args(),
                    *shlex.split(args.train_extra),
                    scene["parser"], "--data", str(data), "--downscale-factor", str(scene["downscale"]),
                    *shlex.split(scene["args"]),
                ]  # fmt: skip
                cmd = train_command(train, world_size=args.wallclock_world_size)
                if not stats_path.exists():
                    log(f"[wallclock] {name}")
                    t0 = time.perf_counter()
                    run_command(cmd, name=name, env=child_env(threads=None), cwd=args.out, log=args.out / f"{name}.log")
                    log(f"[wallclock] {name}: {time.perf_counter() - t0:.0f} s")
                stats = json.loads(stats_path.read_text())
                bal = stats.get("balance", {})
                runs.append({
                    "scene": scene["name"], "partition": mode, "B": batch, "W": args.wallclock_world_size,
                    "repeat": repeat, "images": stats.get("images_trained"),
                    "time_imbalance_mean": bal.get("time_imbalance_mean"),
                    "time_imbalance_p95": bal.get("time_imbalance_p95"),
                    "measured_imbalance_mean": bal.get("measured_imbalance_mean"),
                    "measured_imbalance_p95": bal.get("measured_imbalance_p95"),
                    "prediction_error_mean": bal.get("prediction_error_mean"),
                    "steps_after_warmup": bal.get("num_steps"),
                    "images_per_s": stats.get("images_per_s"),
                    "command": " ".join(shlex.quote(c) for c in cmd),
                })  # fmt: skip
    return runs


# ------------------------------------------------------------------------------------ main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scene",
        action="append",
        default=None,
        help="key=value tokens: name= parser= data= [downscale=N] [images=N] [args='dataparser args'] [train='ns-train args']; repeatable (default: fox, lund_door, bird)",
    )
    parser.add_argument("--out", type=Path, required=True, help="cache folder for scene copies and trained runs")
    parser.add_argument(
        "--train-extra",
        default="--pipeline.model.num-downscales 0",
        help="extra ns-train arguments for the cached training runs",
    )
    parser.add_argument(
        "--save-every", type=int, default=10, help="checkpoint every this many steps (batch size 1: images)"
    )
    parser.add_argument("--train-only", action="store_true", help="prepare and train the scenes, then stop")
    parser.add_argument("--only", default="", help="comma-separated scene names to process (default: all)")
    parser.add_argument(
        "--configs", default=DEFAULT_CONFIGS, help="comma-separated BxW pairs (images per batch x ranks)"
    )
    parser.add_argument("--num-batches", type=int, default=200, help="random batches per (B, W)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random batches")
    parser.add_argument(
        "--lag-epochs", type=float, default=1.0, help="age of the costs the balancer cuts with, in epochs"
    )
    parser.add_argument(
        "--snap-tolerance", type=float, default=None, help="partition_rows snap tolerance (default: the package's)"
    )
    parser.add_argument(
        "--min-band-rows", type=int, default=1, help="partition_rows min_band_rows (the pipeline's default 1)"
    )
    parser.add_argument(
        "--wallclock", default="", help="scene name for the torchrun CPU/gloo timing runs (empty: skip)"
    )
    parser.add_argument("--wallclock-batch-sizes", default="1,3", help="comma-separated B for the timing runs")
    parser.add_argument("--wallclock-world-size", type=int, default=2, help="processes of the timing runs")
    parser.add_argument(
        "--wallclock-images",
        type=int,
        default=60,
        help="images per timing run (the first epoch is excluded from its balance figures)",
    )
    parser.add_argument("--wallclock-repeats", type=int, default=1, help="runs per (mode, B)")
    parser.add_argument("--json", type=Path, default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    scenes = [parse_scene(s) for s in (args.scene or DEFAULT_SCENES)]
    if args.only:
        keep = set(args.only.split(","))
        scenes = [s for s in scenes if s["name"] in keep]

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    with contextlib.redirect_stdout(sys.stderr):
        runs = {s["name"]: ensure_trained(s, args.out, args.save_every, args.train_extra, log) for s in scenes}
    if args.train_only:
        return 0
    from distsplat_ns.balance import DEFAULT_SNAP_TOLERANCE

    if args.snap_tolerance is None:
        args.snap_tolerance = DEFAULT_SNAP_TOLERANCE
    configs = []
    for item in args.configs.split(","):
        b, w = item.lower().split("x")
        configs.append((int(b), int(w)))
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "benchmark": "bench_balance",
        "command": " ".join(shlex.quote(a) for a in ["python", "-m", "benchmarks.bench_balance", *sys.argv[1:]]),
        "machine": machine_record(),
        "cost": "Gaussian-tile intersections per 16-px tile row (the renderer's tile_counts summed over columns)",
        "imbalance": "max / mean of per-rank cost over all W ranks, measured with the final checkpoint's costs",
        "settings": {
            "num_batches": args.num_batches, "seed": args.seed, "lag_epochs": args.lag_epochs,
            "snap_tolerance": args.snap_tolerance, "min_band_rows": args.min_band_rows, "configs": configs,
        },
        "scenes": [],
    }  # fmt: skip
    # nerfstudio prints progress on stdout; keep stdout for the JSON alone.
    with contextlib.redirect_stdout(sys.stderr):
        for scene in scenes:
            report["scenes"].append(analyse_scene(scene, runs[scene["name"]], configs, args, log))
        if args.wallclock:
            scene = next(s for s in scenes if s["name"] == args.wallclock)
            report["wallclock"] = wallclock_runs(scene, Path(runs[scene["name"]]["data"]), args, log)
    finish_machine_record(report["machine"])
    report["wall_s"] = time.perf_counter() - t0
    text = json.dumps(report, indent=1)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
