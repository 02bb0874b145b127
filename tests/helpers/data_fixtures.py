"""Image files, stores and loaders for the data tests and benchmarks (seeded, CPU only).

The real scenes live in ``../shared/data`` next to the repository (read-only); helpers that need
them skip with a clear reason when that folder is absent.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from distsplat_ns.data.image_loader import ImageLoader

SHARED_DATA = (Path(__file__).resolve().parents[2] / ".." / "shared" / "data").resolve()

FISHEYE624_PARAMS = (0.39, -0.42, 0.05, 1.3, -1.8, 0.65, 1e-3, -6e-4, 4e-4, -2e-4, -3e-4, 1e-4)
"""Aria-like FISHEYE624 distortion (k0..k5, p0, p1, s0..s3): the radial terms of a ~150 degree lens,
small tangential and thin-prism terms, deliberately not symmetric under swapping x and y."""

__all__ = [
    "FISHEYE624_PARAMS",
    "SHARED_DATA",
    "START_LOCK",
    "hold_stream_workers",
    "lock_checking_loader",
    "make_loader",
    "make_repeated_fox",
    "process_tree_memory",
    "shared_scene",
    "stress_rank",
    "write_images",
]


def shared_scene(name: str) -> Path:
    """Path of a real scene under ``../shared/data``; skips the calling test when it is absent."""
    import pytest

    path = SHARED_DATA / name
    if not path.is_dir():
        pytest.skip(f"real scene {name!r} not found at {path} (the shared data folder is absent)")
    return path


def write_images(
    folder: Path,
    sizes_hw: Sequence[tuple[int, int]],
    seed: int = 0,
    fmt: str = "JPEG",
    noise: float = 20.0,
    channels: int = 3,
) -> list[Path]:
    """Write one seeded image per size: a colour gradient plus noise (noise makes files bigger).

    Args:
        folder: Where to write (created).
        sizes_hw: ``(H, W)`` per image.
        seed: RNG seed.
        fmt: ``"JPEG"`` or ``"PNG"``.
        noise: Standard deviation of the Gaussian noise, in grey levels.
        channels: 3 (RGB) or 4 (RGBA, PNG only).

    Returns:
        The written paths, in order.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    paths = []
    suffix = ".jpg" if fmt == "JPEG" else ".png"
    for i, (h, w) in enumerate(sizes_hw):
        yy, xx = np.mgrid[0:h, 0:w]
        base = np.stack([xx * 255.0 / max(w - 1, 1), yy * 255.0 / max(h - 1, 1), np.full((h, w), 40.0 * (i % 6))], -1)
        pixels = np.clip(base + rng.normal(0.0, noise, size=(h, w, 3)), 0, 255).astype(np.uint8)
        if channels == 4:
            alpha = (rng.random((h, w, 1)) * 255).astype(np.uint8)
            pixels = np.concatenate([pixels, alpha], -1)
        path = folder / f"img_{i:04d}{suffix}"
        Image.fromarray(pixels).save(path, format=fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        paths.append(path)
    return paths


def make_loader(
    paths: Sequence[Path],
    ram_budget_bytes: int = 1 << 30,
    decoder: str = "simplejpeg",
    masks: Sequence[Path] | None = None,
):
    """An ``ImageLoader`` over ``paths`` with sizes read from the files (no undistortion)."""
    from distsplat_ns.data.image_loader import ImageLoader, ImageSpec
    from distsplat_ns.data.store import EncodedImageStore

    specs = []
    for path in paths:
        with Image.open(path) as im:
            specs.append(ImageSpec(height=im.height, width=im.width))
    store = EncodedImageStore(paths, ram_budget_bytes, name="test images")
    mask_store = EncodedImageStore(masks, ram_budget_bytes, name="test masks") if masks is not None else None
    return ImageLoader(store, specs, mask_store, decoder=decoder)


def make_repeated_fox(fox: Path, out: Path, num_frames: int) -> Path:
    """A nerfstudio-data scene of ``num_frames`` frames cycling over fox's frames (symlinks).

    Args:
        fox: The fox scene folder (``transforms.json`` + ``images/``).
        out: Empty folder to create the scene in.
        num_frames: Frames wanted.

    Returns:
        ``out``, holding ``transforms.json`` and ``images/`` of symlinks.
    """
    meta = json.loads((fox / "transforms.json").read_text())
    frames = meta["frames"]
    (out / "images").mkdir(parents=True, exist_ok=True)
    new_frames = []
    for i in range(num_frames):
        frame = dict(frames[i % len(frames)])
        source = (fox / frame["file_path"]).resolve()
        link = out / "images" / f"{i:05d}{source.suffix}"
        if not link.exists():
            os.symlink(source, link)
        frame["file_path"] = f"images/{link.name}"
        new_frames.append(frame)
    meta["frames"] = new_frames
    (out / "transforms.json").write_text(json.dumps(meta))
    return out


def _own_pss(pid: int) -> int:
    """Pss_Anon + Pss_Shmem of ``pid`` in bytes (``/proc/PID/smaps_rollup``; 0 once it has exited)."""
    total_kib = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
                    total_kib += int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        return 0
    return total_kib << 10


def process_tree_memory(pid: int | None = None) -> dict[str, int]:
    """Memory of a process and all its descendants, in bytes.

    Returns:
        ``rss`` (sum of RSS: counts shared pages once per process), ``pss`` (proportional set
        size: shared pages split between their users, so the sum is the tree's real footprint),
        ``uss`` (pages private to each process, summed), ``own_pss`` (PSS of anonymous and shared
        memory only: unlike ``pss`` it does not fall when processes outside the tree map the same
        library files, so two trees measured at different times compare under load), ``num_processes``,
        and ``worker_uss`` (the largest USS among the descendants, 0 without any).
    """
    import psutil

    root = psutil.Process(pid if pid is not None else os.getpid())
    procs = [root] + root.children(recursive=True)
    totals = {"rss": 0, "pss": 0, "uss": 0, "own_pss": 0, "num_processes": 0, "worker_uss": 0}
    for proc in procs:
        try:
            info = proc.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        totals["rss"] += info.rss
        totals["pss"] += info.pss
        totals["uss"] += info.uss
        totals["own_pss"] += _own_pss(proc.pid)
        totals["num_processes"] += 1
        if proc.pid != root.pid:
            totals["worker_uss"] = max(totals["worker_uss"], info.uss)
    return totals


def write_nerfstudio_scene(
    folder: Path,
    num_frames: int = 6,
    size_hw: tuple[int, int] = (60, 80),
    k1: float = 0.0,
    with_masks: bool = False,
    seed: int = 0,
    camera_model: str = "OPENCV",
    fisheye_crop_radius: float | None = None,
) -> Path:
    """A small nerfstudio-data scene: seeded JPEGs on a circle of cameras, optional distortion and masks.

    Args:
        folder: Where to write (created).
        num_frames: Frames (cameras) to write.
        size_hw: ``(H, W)`` of every image.
        k1: First radial distortion coefficient (0: undistorted camera); ignored for FISHEYE624.
        with_masks: Also write one PNG mask per frame (a seeded blob, 0/255) as ``mask_path``.
        seed: RNG seed.
        camera_model: ``OPENCV``, ``OPENCV_FISHEYE`` or ``FISHEYE624`` (``FISHEYE624_PARAMS`` as
            ``distortion_params``, an Aria-like focal length of 0.45 W).
        fisheye_crop_radius: Written as transforms.json's ``fisheye_crop_radius`` when not None (pixels).

    Returns:
        ``folder``.
    """
    h, w = size_hw
    paths = write_images(folder / "images", [size_hw] * num_frames, seed=seed)
    rng = np.random.default_rng(seed + 1)
    frames = []
    for i, path in enumerate(paths):
        angle = 2 * np.pi * i / num_frames
        c2w = np.eye(4)
        c2w[:3, 3] = [3 * np.cos(angle), 3 * np.sin(angle), 0.5]
        forward = -c2w[:3, 3] / np.linalg.norm(c2w[:3, 3])
        right = np.cross(forward, [0.0, 0.0, 1.0])
        right /= np.linalg.norm(right)
        up = np.cross(right, forward)
        c2w[:3, :3] = np.stack([right, up, -forward], 1)  # OpenGL: camera looks down -z
        frame = {"file_path": f"images/{path.name}", "transform_matrix": c2w.tolist()}
        if with_masks:
            (folder / "masks").mkdir(exist_ok=True)
            yy, xx = np.mgrid[0:h, 0:w]
            cy, cx = rng.uniform(0.3, 0.7) * h, rng.uniform(0.3, 0.7) * w
            blob = ((yy - cy) ** 2 + (xx - cx) ** 2 < (0.3 * min(h, w)) ** 2).astype(np.uint8) * 255
            Image.fromarray(blob).save(folder / "masks" / f"{path.stem}.png")
            frame["mask_path"] = f"masks/{path.stem}.png"
        frames.append(frame)
    meta = {
        "camera_model": camera_model,
        "fl_x": 0.9 * w,
        "fl_y": 0.9 * w,
        "cx": w / 2 + 0.7,
        "cy": h / 2 - 0.4,
        "w": w,
        "h": h,
        "k1": k1,
        "k2": k1 / 4,
        "p1": 0.0 if camera_model == "OPENCV_FISHEYE" else 0.001,
        "p2": 0.0,
        "frames": frames,
    }
    if camera_model == "FISHEYE624":
        for key in ("k1", "k2", "p1", "p2"):
            del meta[key]
        meta["fl_x"] = meta["fl_y"] = 0.45 * w
        meta["distortion_params"] = list(FISHEYE624_PARAMS)
    if fisheye_crop_radius is not None:
        meta["fisheye_crop_radius"] = fisheye_crop_radius
    (folder / "transforms.json").write_text(json.dumps(meta))
    return folder


def measure_stream_memory(
    paths: Sequence[Path],
    batch_size: int,
    num_workers: int,
    num_steps: int,
    out_json: Path,
    ram_budget_bytes: int = 1 << 30,
) -> None:
    """Run ``num_steps`` steps of a stream over ``paths``; write the process tree's memory to ``out_json``.

    Meant to run in a fresh interpreter (``python -c``), so two dataset sizes compare cleanly.
    Memory is sampled after every step while the workers are alive; the JSON holds the peaks of
    ``process_tree_memory``'s fields plus ``store_bytes``.
    """
    from distsplat_ns.data.reader import TrainBatchReader
    from distsplat_ns.data.stream import ImageBatchStream

    loader = make_loader(paths, ram_budget_bytes=ram_budget_bytes)
    loader.images.wait_filled()
    reader = TrainBatchReader(ImageBatchStream(loader, batch_size, seed=0), num_workers, prefetch_batches=2)
    peaks: dict[str, int] = {}
    for step in range(num_steps):
        reader.next_batch(step)
        for key, value in process_tree_memory().items():
            peaks[key] = max(peaks.get(key, 0), value)
    reader.close()
    peaks["store_bytes"] = loader.images.num_bytes
    peaks["disk_mode"] = int(loader.images.disk_mode)
    out_json.write_text(json.dumps(peaks))


# ---------------------------------------------------------------------------------- worker start-up
START_LOCK = threading.Lock()
"""A lock a test holds in another thread while DataLoader workers start (``lock_checking_loader``)."""


class LockCheckingLoader(ImageLoader):
    """An ``ImageLoader`` that takes ``START_LOCK`` before each decode: a worker forked while another
    thread of its parent held the lock inherits it held, and fails here instead of decoding."""

    def load_array(
        self, index: int, out: np.ndarray | None = None, downscale: int = 1
    ) -> tuple[np.ndarray, np.ndarray | None]:
        if not START_LOCK.acquire(timeout=2.0):
            raise RuntimeError("this worker inherited START_LOCK held: it was forked while another thread held it")
        START_LOCK.release()
        return super().load_array(index, out, downscale)


def lock_checking_loader(paths: Sequence[Path]):
    """``make_loader(paths)`` whose decodes first take ``START_LOCK`` (picklable: a module-level class)."""
    loader = make_loader(paths)
    return LockCheckingLoader(loader.images, loader.specs, loader.masks, decoder=loader.decoder)


def hold_stream_workers(paths: Sequence[Path], num_workers: int) -> None:
    """Start a stream with ``num_workers`` workers, print their pids as one JSON line, then sleep.

    Meant for a child interpreter (``python -c``) that a test then kills.
    """
    from distsplat_ns.data.reader import TrainBatchReader
    from distsplat_ns.data.stream import ImageBatchStream

    reader = TrainBatchReader(ImageBatchStream(make_loader(paths), 4, seed=0), num_workers, prefetch_batches=2)
    reader.next_batch(0)
    print(json.dumps([worker.pid for worker in reader._iterator._workers]), flush=True)  # type: ignore[union-attr]
    time.sleep(600)


def stress_rank(ctx: Any, scene: str, num_steps: int) -> list[list[list[int]]]:
    """One rank of the worker start-up stress test: threads first, then the datamanager's workers.

    As in training, gloo's threads (the process group, set up by the caller) and a tensorboard
    writer's thread exist when the DataLoader workers start.

    Returns:
        Every rank's camera indices per step (``all_gather_object``).
    """
    import tempfile

    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
    from torch.utils.tensorboard import SummaryWriter

    from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
    from distsplat_ns.distributed.collectives import all_gather_object

    with tempfile.TemporaryDirectory() as log_dir:
        writer = SummaryWriter(log_dir)
        writer.add_scalar("start", 1.0, 0)
        config = ParallelFullImageDatamanagerConfig(
            dataparser=NerfstudioDataParserConfig(data=Path(scene), downscale_factor=1),
            num_workers=2,
            eval_num_workers=0,
        )
        manager = config.setup(device="cpu")
        manager.configure_training(4, ctx.rank, ctx.world_size)
        ids = [manager.next_train_batch(step).camera_indices for step in range(num_steps)]
        gathered = all_gather_object(ctx, ids)
        manager.close()
        writer.close()
    return gathered


class LogRecords(logging.Handler):
    """A logging handler that keeps every message, for tests that check what was logged."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())
