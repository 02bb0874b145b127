"""Our ``next_train`` beside nerfstudio main's disk-mode ``FullImageDatamanager``, interleaved in one run.

The anchor is nerfstudio's main-branch ``FullImageDatamanager`` with ``cache_images="disk"`` (a
DataLoader over its ``ImageBatchStream``, spawned workers). nerfstudio main is not installable here,
so ``--anchor-root`` names a folder holding a ``nerfstudio`` package with main's files (built outside
this repository; its ``PROVENANCE.txt`` beside that folder lists the files taken and is copied into
the result). Each run is a subprocess; the anchor's has ``--anchor-root`` first on ``PYTHONPATH``.

Both sides, same definitions: the fox scene repeated to ``--frames`` frames (distortion kept, every
frame a training frame), device cpu, ``--num-workers`` workers, ``next_train(step)`` one image per
call. ``time_to_first_image_s``: from building the manager to holding the first image.
``images_per_s``: ``--num-images`` further calls over their wall time. ``main_process_cpu_ms_per_image``
and ``workers_cpu_ms_per_image``: CPU time over those calls, of the training process and of its
child processes. Runs alternate ours, anchor, ours, anchor, ... (``--repeats`` pairs); the ratio is
ours / anchor images/s per pair, and its median.

Usage: ``python benchmarks/bench_anchor_disk.py [--quick] [--anchor-root DIR]`` (needs ../shared/data/fox).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.bench_data import FOX, fox_scene, run_child

DEFAULT_ANCHOR_ROOT = (REPO / ".." / "anchor" / "nerfstudio_main").resolve()
TARGET_RATIO = 1.2


def _children_cpu_s() -> float:
    import psutil

    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.NoSuchProcess:
            continue
    return total


def _build_manager(kind: str, scene: Path, num_workers: int, image_type: str):
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    dataparser = NerfstudioDataParserConfig(data=scene, downscale_factor=1, eval_mode="all")
    if kind == "anchor":
        from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig

        config = FullImageDatamanagerConfig(
            dataparser=dataparser, cache_images="disk", cache_images_type=image_type, dataloader_num_workers=num_workers
        )
    else:
        from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig

        config = ParallelFullImageDatamanagerConfig(dataparser=dataparser, num_workers=num_workers, prefetch_batches=4)
    return config.setup(device="cpu")


def child_next_train(kind: str, scene: Path, num_workers: int, num_images: int, image_type: str, out: Path) -> None:
    """One side's run: build, first image, then ``num_images`` timed ``next_train`` calls."""
    import nerfstudio

    load_start = os.getloadavg()[0]
    start = time.perf_counter()
    manager = _build_manager(kind, scene, num_workers, image_type)
    _, data = manager.next_train(0)
    first_s = time.perf_counter() - start
    cpu_start, workers_start, loop_start = time.process_time(), _children_cpu_s(), time.perf_counter()
    for step in range(1, num_images + 1):
        manager.next_train(step)
    elapsed = time.perf_counter() - loop_start
    main_cpu_s, workers_cpu_s = time.process_time() - cpu_start, _children_cpu_s() - workers_start
    out.write_text(
        json.dumps(
            {
                "kind": kind,
                "nerfstudio_package": str(Path(nerfstudio.__file__).parent),
                "distsplat_package": str(Path(sys.modules["distsplat_ns"].__file__).parent) if "distsplat_ns" in sys.modules else None,
                "image_dtype": str(data["image"].dtype),
                "image_shape": list(data["image"].shape),
                "num_train_images": len(manager.train_dataset),
                "num_images_timed": num_images,
                "time_to_first_image_s": first_s,
                "images_per_s": num_images / elapsed,
                "main_process_cpu_ms_per_image": 1000 * main_cpu_s / num_images,
                "workers_cpu_ms_per_image": 1000 * workers_cpu_s / num_images,
                "load_average_1min": [load_start, os.getloadavg()[0]],
            }
        )
    )
    if kind == "ours":
        manager.close()


def check_anchor_root(root: Path) -> None:
    """Exit with one line unless ``root/nerfstudio`` has main's disk mode."""
    dataloaders = root / "nerfstudio" / "data" / "utils" / "dataloaders.py"
    if not dataloaders.is_file() or "class ImageBatchStream" not in dataloaders.read_text():
        raise SystemExit(f"--anchor-root {root}: no nerfstudio package with ImageBatchStream (main's disk mode) there")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=["ours", "anchor"], help=argparse.SUPPRESS)
    parser.add_argument("--scene", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument(
        "--anchor-root",
        type=Path,
        default=DEFAULT_ANCHOR_ROOT,
        help="folder holding main's nerfstudio package (put first on the anchor's PYTHONPATH)",
    )
    parser.add_argument(
        "--anchor-image-type",
        choices=["uint8", "float32"],
        default="uint8",
        help="the anchor's cache_images_type (uint8: splatfacto's setting; float32: the config class default)",
    )
    parser.add_argument("--frames", type=int, default=1910, help="fox repeated to this many frames")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--num-images", type=int, default=900, help="timed next_train calls after the first image")
    parser.add_argument("--repeats", type=int, default=3, help="ours/anchor pairs")
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--memory-limit-gib", type=float, default=8.0, help="a child whose process tree passes this RSS is killed")
    parser.add_argument("--quick", action="store_true", help="small scene, few images, one pair: a smoke run")
    args = parser.parse_args()

    if args.child:
        child_next_train(args.child, args.scene, args.num_workers, args.num_images, args.anchor_image_type, args.out)
        return
    if not FOX.is_dir():
        raise SystemExit(f"the fox scene is needed at {FOX}")
    anchor_root = args.anchor_root.resolve()
    check_anchor_root(anchor_root)
    if args.quick:
        args.frames, args.num_images, args.repeats = 100, 40, 1
    provenance = anchor_root.parent / "PROVENANCE.txt"
    report: dict = {
        "command": " ".join(["python", "benchmarks/bench_anchor_disk.py", *sys.argv[1:]]),
        "machine": {"cpus": os.cpu_count(), "load_average_1min_at_start": os.getloadavg()[0]},
        "config": {k: getattr(args, k) for k in ("frames", "num_workers", "num_images", "repeats", "anchor_image_type")},
        "anchor": {
            "root": str(anchor_root),
            "datamanager": "FullImageDatamanagerConfig(cache_images='disk', "
            f"cache_images_type='{args.anchor_image_type}', dataloader_num_workers={args.num_workers})",
            "provenance": provenance.read_text().splitlines() if provenance.is_file() else None,
        },
        "ours": {"datamanager": f"ParallelFullImageDatamanagerConfig(num_workers={args.num_workers}, prefetch_batches=4)"},
    }
    limit = int(args.memory_limit_gib * (1 << 30))
    pairs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        scene = fox_scene(Path(tmp) / "fox", args.frames)
        common = [
            "--scene",
            str(scene),
            "--num-workers",
            str(args.num_workers),
            "--num-images",
            str(args.num_images),
            "--anchor-image-type",
            args.anchor_image_type,
        ]
        script = Path(__file__)
        for _ in range(args.repeats):
            ours = run_child(["--child", "ours", *common], args.timeout_s, limit, script=script)
            anchor = run_child(["--child", "anchor", *common], args.timeout_s, limit, script=script, pythonpath_first=anchor_root)
            pair = {"ours": ours, "anchor": anchor}
            if "failed" not in ours and "failed" not in anchor:
                pair["ratio_images_per_s"] = ours["images_per_s"] / anchor["images_per_s"]
            pairs.append(pair)
    report["pairs"] = pairs
    ratios = [p["ratio_images_per_s"] for p in pairs if "ratio_images_per_s" in p]
    if ratios:
        report["summary"] = {
            "ours_images_per_s": [p["ours"]["images_per_s"] for p in pairs if "ratio_images_per_s" in p],
            "anchor_images_per_s": [p["anchor"]["images_per_s"] for p in pairs if "ratio_images_per_s" in p],
            "ratio_per_pair": ratios,
            "ratio_median": statistics.median(ratios),
            f"target: ours >= {TARGET_RATIO} x anchor images/s (median)": statistics.median(ratios) >= TARGET_RATIO,
        }
    report["machine"]["load_average_1min_at_end"] = os.getloadavg()[0]
    sys.stdout.write(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
