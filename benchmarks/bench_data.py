"""Benchmark of ParallelFullImageDatamanager on the fox scene repeated to ~1900 frames (docs/data.md).

One run prints one JSON object on stdout with:
- the raw one-core decode rate of the fox JPEG bytes for PIL, simplejpeg and torchvision (and
  decode + undistortion with the chosen decoder), measured in this run;
- for our datamanager at 67 frames, at ``--mid-frames`` and at ``--large-frames`` (symlinks and a
  generated transforms.json in a temporary folder, ``eval_mode="all"`` so every frame is a
  training frame): time to first batch, steady-state images/s (total and per worker, and their
  ratio to the one-core rates), data wait as a share of step time with a simulated training step,
  peak memory of the process tree, and marginal memory per image vs the mean file size;
- nerfstudio 1.1.5's FullImageDatamanager (uint8 cache, device cpu) on the same data, each size in
  a subprocess under a timeout and a memory guard;
- decode at the training scale (``--only decode-scale``): one-core rates of the fox JPEGs for a full
  decode, a full decode + box resize to 1/2 and 1/4 (what the model's resize did), and
  libjpeg-turbo's DCT-scaled decode at 1/2 and 1/4 (+ the box to the exact rendered size), per
  decoder; and the datamanager's worker throughput with the resolution schedule at 1/1 vs 1/4;
- the nerfstudio-interface path (``--only next-train``): ``next_train`` images/s and the training
  process's CPU per image, handing uint8 (now) vs converting to float32 / 255 on the host first
  (the previous ``_to_float_data``), interleaved runs in one invocation.

Memory: ``tree_pss`` sums the proportional set size over the process and its workers (a shared
page counts once in total); ``tree_rss`` sums RSS (a shared page counts once per process that
touched it, so the shared buffer is counted up to 1 + num_workers times); ``main_rss`` is the
training process alone.

Usage: ``python -m benchmarks.bench_data [--quick] [--only all|decode-scale|next-train]`` (needs
../shared/data/fox).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from typing_extensions import Self

from benchmarks.common import SHARED_DATA, child_env, finish_machine_record, machine_record

FOX = (SHARED_DATA / "fox").resolve()
MIB = float(1 << 20)


# ---------------------------------------------------------------------------------- helpers
class TreeMemorySampler:
    """Samples the memory of this process and its children in a thread; keeps the peaks."""

    def __init__(self, interval_s: float = 0.05, pss_every: int = 10) -> None:
        import psutil

        self._psutil = psutil
        self.interval_s = interval_s
        self.pss_every = pss_every
        self.peaks = {"tree_rss": 0, "tree_pss": 0, "main_rss": 0, "workers_uss": 0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self, with_pss: bool) -> None:
        root = self._psutil.Process()
        procs = [root] + root.children(recursive=True)
        rss = pss = workers_uss = 0
        for proc in procs:
            try:
                if with_pss:
                    info = proc.memory_full_info()
                    pss += info.pss
                    if proc.pid != root.pid:
                        workers_uss += info.uss
                else:
                    info = proc.memory_info()
                rss += info.rss
                if proc.pid == root.pid:
                    self.peaks["main_rss"] = max(self.peaks["main_rss"], info.rss)
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                continue
        self.peaks["tree_rss"] = max(self.peaks["tree_rss"], rss)
        if with_pss:
            self.peaks["tree_pss"] = max(self.peaks["tree_pss"], pss)
            self.peaks["workers_uss"] = max(self.peaks["workers_uss"], workers_uss)

    def _run(self) -> None:
        count = 0
        while not self._stop.is_set():
            self.sample(with_pss=count % self.pss_every == 0)
            count += 1
            self._stop.wait(self.interval_s)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sample(with_pss=True)
        self._stop.set()
        self._thread.join()


def fox_scene(out: Path, num_frames: int, undistorted: bool = False) -> Path:
    from tests.helpers.data_fixtures import make_repeated_fox

    make_repeated_fox(FOX, out, num_frames)
    if undistorted:
        meta = json.loads((out / "transforms.json").read_text())
        for key in ("k1", "k2", "k3", "k4", "p1", "p2"):
            meta.pop(key, None)
        (out / "transforms.json").write_text(json.dumps(meta))
    return out


def mean_file_bytes(scene: Path) -> float:
    meta = json.loads((scene / "transforms.json").read_text())
    sizes = [(scene / f["file_path"]).resolve().stat().st_size for f in meta["frames"]]
    return sum(sizes) / len(sizes)


def decode_rates(seconds: float) -> dict:
    """One-core decode rates of the fox JPEG bytes, per decoder, and decode + undistortion."""
    import cv2
    import torch
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
    from distsplat_ns.data.decode import DECODERS, decode_bytes, default_decoder
    from distsplat_ns.data.undistort import MapCache, undistort

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    files = sorted((FOX / "images").glob("*.jpg"))
    blobs = [f.read_bytes() for f in files]

    cpu: dict[str, float] = {}

    def rate(fn, name: str) -> float:
        fn(blobs[0])
        count, start, cpu_start = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            fn(blobs[count % len(blobs)])
            count += 1
        cpu[name] = count / (time.process_time() - cpu_start)
        return count / (time.perf_counter() - start)

    out: dict = {name: rate(lambda b, n=name: decode_bytes(b, n), name) for name in DECODERS}
    chosen = default_decoder()
    manager = ParallelFullImageDatamanagerConfig(
        dataparser=NerfstudioDataParserConfig(data=FOX, downscale_factor=1), num_workers=0
    ).setup(device="cpu")
    spec = manager._train_specs[0].undistort
    cache = MapCache()
    out[f"{chosen}+undistort"] = rate(
        lambda b: undistort(decode_bytes(b, chosen), None, spec, cache), f"{chosen}+undistort"
    )
    out["per_cpu_second"] = cpu
    out["chosen"] = chosen
    out["mean_file_bytes"] = sum(map(len, blobs)) / len(blobs)
    return out


def decode_scale_rates(seconds: float) -> dict:
    """One-core images/s (wall and per CPU second) of the fox JPEGs decoded at the training scale."""
    import cv2
    import torch

    from distsplat_ns.data.decode import decode_bytes
    from distsplat_ns.data.resize import box_downscale, fit_to_size

    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    blobs = [f.read_bytes() for f in sorted((FOX / "images").glob("*.jpg"))]
    height, width = decode_bytes(blobs[0], "simplejpeg").shape[:2]

    def full_then_box(decoder: str, d: int):
        return lambda b: box_downscale(decode_bytes(b, decoder), d, (height // d, width // d))

    def dct(decoder: str, d: int):
        return lambda b: fit_to_size(decode_bytes(b, decoder, scale=d), 1, (height // d, width // d))

    cases = {"full_decode": lambda b: decode_bytes(b, "simplejpeg")}
    for d in (2, 4):
        cases[f"full_decode+box_1/{d}"] = full_then_box("simplejpeg", d)
        cases[f"dct_1/{d}"] = dct("simplejpeg", d)
        cases[f"pil_draft_1/{d}"] = dct("pil", d)
    cases["pil_full_decode"] = lambda b: decode_bytes(b, "pil")
    wall, cpu = {}, {}
    for name, fn in cases.items():
        fn(blobs[0])
        count, start, cpu_start = 0, time.perf_counter(), time.process_time()
        while time.perf_counter() - start < seconds:
            fn(blobs[count % len(blobs)])
            count += 1
        wall[name] = count / (time.perf_counter() - start)
        cpu[name] = count / (time.process_time() - cpu_start)
    return {
        "image_hw": [height, width],
        "images_per_s": wall,
        "images_per_cpu_s": cpu,
        "dct_1/4_vs_full_decode+box_1/4_cpu": cpu["dct_1/4"] / cpu["full_decode+box_1/4"],
        "dct_1/2_vs_full_decode+box_1/2_cpu": cpu["dct_1/2"] / cpu["full_decode+box_1/2"],
    }


def _constant_downscale(step: int, value: int) -> int:
    del step
    return value


def child_next_train(scene: Path, num_workers: int, drain_s: float, host_float: bool, out: Path) -> None:
    """nerfstudio's interface: one image per ``next_train`` call, optionally converted on the host."""
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig

    manager = ParallelFullImageDatamanagerConfig(
        dataparser=NerfstudioDataParserConfig(data=scene, downscale_factor=1, eval_mode="all"),
        num_workers=num_workers,
        prefetch_batches=4,
    ).setup(device="cpu")
    for step in range(8):
        manager.next_train(step)
    images, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < drain_s:
        _, data = manager.next_train(8 + images)
        if host_float:  # what _to_float_data did before images were handed over as uint8
            data["image"] = data["image"].float() / 255.0
        images += 1
    elapsed = time.perf_counter() - start
    manager.close()
    out.write_text(
        json.dumps(
            {
                "host_float": host_float,
                "images_per_s": images / elapsed,
                "main_process_cpu_ms_per_image": 1000 * (time.process_time() - cpu_start) / images,
                "load_average_1min": os.getloadavg()[0],
            }
        )
    )


# ---------------------------------------------------------------------------------- child runs
def child_ours(
    scene: Path,
    num_workers: int,
    batch_size: int,
    drain_s: float,
    consume_rate_fraction: float,
    out: Path,
    train_downscale: int = 1,
) -> None:
    import functools

    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig

    result: dict = {}
    with TreeMemorySampler() as sampler:
        start = time.perf_counter()
        manager = ParallelFullImageDatamanagerConfig(
            dataparser=NerfstudioDataParserConfig(data=scene, downscale_factor=1, eval_mode="all"),
            num_workers=num_workers,
            prefetch_batches=4,
        ).setup(device="cpu")
        result["setup_s"] = time.perf_counter() - start
        schedule = functools.partial(_constant_downscale, value=train_downscale) if train_downscale > 1 else None
        manager.configure_training(batch_size, 0, 1, downscale_at=schedule)
        manager.next_train_batch(0)
        result["time_to_first_batch_s"] = time.perf_counter() - start
        # Warm-up: fill the prefetch queue, then drain as fast as possible (data-bound loop).
        step = 1
        for _ in range(4):
            manager.next_train_batch(step)
            step += 1
        import psutil

        workers = psutil.Process().children()
        cpu_before = sum(sum(w.cpu_times()[:2]) for w in workers)
        main_cpu_before = time.process_time()
        load_before = os.getloadavg()[0]
        images, drain_start = 0, time.perf_counter()
        while time.perf_counter() - drain_start < drain_s:
            images += len(manager.next_train_batch(step).images)
            step += 1
        elapsed = time.perf_counter() - drain_start
        worker_cpu_s = sum(sum(w.cpu_times()[:2]) for w in workers) - cpu_before
        rate = images / elapsed
        result["images_per_s_total"] = rate
        result["images_per_s_per_worker"] = rate / max(num_workers, 1)
        result["images_per_worker_cpu_s"] = images / worker_cpu_s if worker_cpu_s > 0 else None
        result["main_process_cpu_s_per_image"] = (time.process_time() - main_cpu_before) / images
        result["load_average_1min"] = [load_before, os.getloadavg()[0]]
        # Steady state with a simulated training step (sleep: the GPU does the work, the CPU is
        # free), consuming at consume_rate_fraction of the measured decode capacity.
        step_s = batch_size / (consume_rate_fraction * rate)
        for _ in range(8):  # let the queue refill after the drain
            time.sleep(step_s)
            manager.next_train_batch(step)
            step += 1
        wait, loop_start, num_steps = 0.0, time.perf_counter(), 0
        while time.perf_counter() - loop_start < drain_s:
            batch = manager.next_train_batch(step)
            wait += batch.wait_s
            time.sleep(step_s)
            step += 1
            num_steps += 1
        loop_s = time.perf_counter() - loop_start
        result["simulated_step_ms"] = 1000 * step_s
        result["steady_state_steps"] = num_steps
        result["data_wait_fraction"] = wait / loop_s
        stats = manager.stats()
        result["store_bytes"] = stats["store_bytes"]
        result["disk_mode"] = stats["disk_mode"]
        result["num_train_images"] = stats["num_train_images"]
        manager.close()
    result.update(sampler.peaks)
    out.write_text(json.dumps(result))


def child_first_batch(scene: Path, num_workers: int, batch_size: int, out: Path) -> None:
    """Time from constructing the datamanager to holding the first batch, nothing else."""
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig

    start = time.perf_counter()
    manager = ParallelFullImageDatamanagerConfig(
        dataparser=NerfstudioDataParserConfig(data=scene, downscale_factor=1, eval_mode="all"), num_workers=num_workers
    ).setup(device="cpu")
    manager.configure_training(batch_size, 0, 1)
    manager.next_train_batch(0)
    elapsed = time.perf_counter() - start
    manager.close()
    out.write_text(json.dumps({"time_to_first_batch_s": elapsed, "load_average_1min": os.getloadavg()[0]}))


def child_nerfstudio(scene: Path, steps: int, out: Path) -> None:
    from nerfstudio.data.datamanagers.full_images_datamanager import FullImageDatamanagerConfig
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    result: dict = {}
    with TreeMemorySampler(interval_s=0.1) as sampler:
        start = time.perf_counter()
        # cache_images="gpu" on device cpu = a plain CPU cache; nerfstudio switches to "cpu" (pinned
        # memory, which needs CUDA) above 500 images by itself.
        manager = FullImageDatamanagerConfig(
            dataparser=NerfstudioDataParserConfig(data=scene, downscale_factor=1, eval_mode="all"),
            cache_images="gpu",
            cache_images_type="uint8",
        ).setup(device="cpu")
        manager.next_train(0)
        result["time_to_first_batch_s"] = time.perf_counter() - start
        loop_start = time.perf_counter()
        for step in range(1, steps + 1):
            manager.next_train(step)
        result["images_per_s_total"] = steps / (time.perf_counter() - loop_start)
        result["num_train_images"] = len(manager.train_dataset)
    result.update(sampler.peaks)
    out.write_text(json.dumps(result))


def run_child(args: list[str], timeout_s: float, memory_limit_bytes: int) -> dict:
    """Run this benchmark as a child (``python -m benchmarks.bench_data ARGS``); kill its tree on
    timeout or when its RSS passes the limit."""
    import psutil

    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        out = Path(tmp.name)
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.bench_data", *args, "--out", str(out)],
        env=child_env(threads=None),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    stderr_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: stderr_chunks.append(proc.stderr.read()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    start, reason = time.perf_counter(), None
    while proc.poll() is None:
        try:
            parent = psutil.Process(proc.pid)
            rss = sum(p.memory_info().rss for p in [parent] + parent.children(recursive=True))
        except psutil.NoSuchProcess:
            rss = 0
        if rss > memory_limit_bytes:
            reason = f"killed by the memory guard at {rss / MIB:.0f} MiB (limit {memory_limit_bytes / MIB:.0f} MiB)"
        elif time.perf_counter() - start > timeout_s:
            reason = f"killed after the {timeout_s:.0f} s timeout"
        if reason:
            os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.2)
    proc.wait()
    reader.join(timeout=5)
    if reason is None and proc.returncode == 0:
        result = json.loads(out.read_text())
    else:
        result = {"failed": reason or f"exit code {proc.returncode}"}
        if reason is None:
            lines = b"".join(stderr_chunks).decode(errors="replace").strip().splitlines()
            errors = [line for line in lines if "Error" in line]
            result["error"] = (errors or lines or [""])[-1][:300]
    result["wall_s"] = time.perf_counter() - start
    out.unlink(missing_ok=True)
    return result


# ---------------------------------------------------------------------------------- main
def run_part(args: argparse.Namespace, limit: int) -> dict:
    """``--only decode-scale`` or ``--only next-train``: interleaved comparisons in one run."""
    report: dict = {"machine": machine_record(), "part": args.only}
    with tempfile.TemporaryDirectory() as tmp:
        if args.only == "decode-scale":
            report["one_core"] = [decode_scale_rates(args.decode_s) for _ in range(args.repeats)]
            # Distortion removed: the worker decodes only, so the decode scale is what is measured.
            scene = fox_scene(Path(tmp) / "fox", args.small_frames, undistorted=True)
            runs: dict[str, list[dict]] = {"1": [], "4": []}
            for _ in range(args.repeats):
                for d, results in runs.items():
                    child_args = [
                        "--child",
                        "ours",
                        "--scene",
                        str(scene),
                        "--num-workers",
                        str(args.num_workers),
                        "--batch-size",
                        str(args.batch_size),
                        "--drain-s",
                        str(args.drain_s),
                        "--consume-fraction",
                        str(args.consume_fraction),
                        "--train-downscale",
                        d,
                    ]
                    results.append(run_child(child_args, args.timeout_s, limit))
            report["datamanager_train_downscale"] = runs
        else:
            scene = fox_scene(Path(tmp) / "fox", args.small_frames, undistorted=True)
            runs = {"uint8": [], "host_float": []}
            for _ in range(args.repeats):
                for mode in runs:
                    child_args = [
                        "--child",
                        "next-train",
                        "--scene",
                        str(scene),
                        "--num-workers",
                        str(args.num_workers),
                        "--drain-s",
                        str(args.drain_s),
                    ] + (["--host-float"] if mode == "host_float" else [])
                    runs[mode].append(run_child(child_args, args.timeout_s, limit))
            report["next_train"] = runs
    finish_machine_record(report["machine"])
    return report


def marginal(large: dict, small: dict, key: str) -> float:
    return (large[key] - small[key]) / (large["num_train_images"] - small["num_train_images"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=["ours", "first", "nerfstudio", "next-train"], help=argparse.SUPPRESS)
    parser.add_argument("--train-downscale", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--host-float", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument(
        "--only", choices=["all", "decode-scale", "next-train"], default="all", help="run one part of the benchmark"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="interleaved repeats of the decode-scale and next-train comparisons"
    )
    parser.add_argument("--scene", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--small-frames", type=int, default=67)
    parser.add_argument(
        "--mid-frames",
        type=int,
        default=500,
        help="frames at which nerfstudio's manager is compared (<= 500: above, it pins memory, which needs CUDA)",
    )
    parser.add_argument("--large-frames", type=int, default=67 * 29, help="~1900 frames")
    parser.add_argument("--num-workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--drain-s", type=float, default=15.0, help="seconds of each throughput / steady-state phase")
    parser.add_argument(
        "--consume-fraction", type=float, default=0.8, help="simulated training consumes this share of decode capacity"
    )
    parser.add_argument("--decode-s", type=float, default=4.0, help="seconds per one-core decode-rate measurement")
    parser.add_argument(
        "--memory-limit-gib",
        type=float,
        default=8.0,
        help="a child whose process tree passes this RSS is killed (protects a shared machine)",
    )
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument(
        "--first-batch-repeats",
        type=int,
        default=5,
        help="alternating small/large start-ups; the minimum is reported (shared, noisy machines)",
    )
    parser.add_argument("--quick", action="store_true", help="short phases, for a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.first_batch_repeats = 1

    if args.child == "ours":
        child_ours(
            args.scene,
            args.num_workers,
            args.batch_size,
            args.drain_s,
            args.consume_fraction,
            args.out,
            args.train_downscale,
        )
        return
    if args.child == "next-train":
        child_next_train(args.scene, args.num_workers, args.drain_s, args.host_float, args.out)
        return
    if args.child == "first":
        child_first_batch(args.scene, args.num_workers, args.batch_size, args.out)
        return
    if args.child == "nerfstudio":
        child_nerfstudio(args.scene, 50, args.out)
        return
    if not FOX.is_dir():
        raise SystemExit(f"the fox scene is needed at {FOX}")
    if args.quick:
        args.drain_s, args.decode_s, args.large_frames, args.mid_frames = 3.0, 1.0, 200, 100

    limit = int(args.memory_limit_gib * (1 << 30))
    if args.only != "all":
        sys.stdout.write(json.dumps(run_part(args, limit), indent=1) + "\n")
        return
    common = [
        "--num-workers",
        str(args.num_workers),
        "--batch-size",
        str(args.batch_size),
        "--drain-s",
        str(args.drain_s),
        "--consume-fraction",
        str(args.consume_fraction),
    ]
    report: dict = {
        "machine": machine_record(),
        "note": "every figure below is from this one run",
        "config": {
            k: getattr(args, k)
            for k in (
                "small_frames",
                "mid_frames",
                "large_frames",
                "num_workers",
                "batch_size",
                "drain_s",
                "consume_fraction",
            )
        },
    }
    report["decode_one_core_images_per_s"] = decode_rates(args.decode_s)
    with tempfile.TemporaryDirectory() as tmp:
        scenes = {
            n: fox_scene(Path(tmp) / f"fox_{n}", n) for n in (args.small_frames, args.mid_frames, args.large_frames)
        }
        report["mean_file_bytes"] = mean_file_bytes(scenes[args.large_frames])
        ours = {
            n: run_child(["--child", "ours", "--scene", str(s), *common], args.timeout_s, limit)
            for n, s in scenes.items()
        }
        first: dict[int, list[dict]] = {args.small_frames: [], args.large_frames: []}
        for _ in range(args.first_batch_repeats):
            for n, results in first.items():
                first_args = [
                    "--child",
                    "first",
                    "--scene",
                    str(scenes[n]),
                    "--num-workers",
                    str(args.num_workers),
                    "--batch-size",
                    str(args.batch_size),
                ]
                results.append(run_child(first_args, args.timeout_s, limit))
        undistorted = fox_scene(Path(tmp) / "fox_undistorted", args.small_frames, undistorted=True)
        ours_no_undistort = run_child(["--child", "ours", "--scene", str(undistorted), *common], args.timeout_s, limit)
        theirs = {
            n: run_child(["--child", "nerfstudio", "--scene", str(s)], args.timeout_s, limit) for n, s in scenes.items()
        }
    report["ours"] = {str(n): r for n, r in ours.items()}
    report["ours_without_undistortion_67_frames"] = ours_no_undistort
    report["ours_time_to_first_batch_repeats_s"] = {
        str(n): [r.get("time_to_first_batch_s") for r in runs] for n, runs in first.items()
    }
    report["nerfstudio_full_image_uint8"] = {str(n): r for n, r in theirs.items()}

    decode = report["decode_one_core_images_per_s"]
    chosen = decode["chosen"]
    small, large = ours[args.small_frames], ours[args.large_frames]
    summary: dict = {}
    if "failed" not in small and "failed" not in large:
        per_worker = large["images_per_s_per_worker"]
        summary["per_worker_vs_raw_decode"] = per_worker / decode[chosen]
        cpu = decode["per_cpu_second"]
        summary["per_worker_cpu_vs_raw_decode_cpu"] = large["images_per_worker_cpu_s"] / cpu[chosen]
        summary["per_worker_cpu_vs_raw_decode_plus_undistort_cpu"] = (
            large["images_per_worker_cpu_s"] / cpu[f"{chosen}+undistort"]
        )
        if "failed" not in ours_no_undistort:
            summary["per_worker_cpu_vs_raw_decode_cpu_without_undistortion"] = (
                ours_no_undistort["images_per_worker_cpu_s"] / cpu[chosen]
            )
        summary["per_worker_vs_raw_decode_plus_undistort"] = per_worker / decode[f"{chosen}+undistort"]
        if "failed" not in ours_no_undistort:
            summary["per_worker_vs_raw_decode_without_undistortion"] = (
                ours_no_undistort["images_per_s_per_worker"] / decode[chosen]
            )
        for key in ("tree_pss", "tree_rss", "main_rss"):
            summary[f"marginal_{key}_per_image_bytes"] = marginal(large, small, key)
            summary[f"marginal_{key}_per_image_vs_file_size"] = marginal(large, small, key) / report["mean_file_bytes"]

        def best(n: int) -> float:
            return min(r["time_to_first_batch_s"] for r in first[n] if "time_to_first_batch_s" in r)

        summary["first_batch_min_small_s"] = best(args.small_frames)
        summary["first_batch_min_large_s"] = best(args.large_frames)
        summary["first_batch_large_vs_small"] = best(args.large_frames) / best(args.small_frames)
        summary["data_wait_fraction_large"] = large["data_wait_fraction"]
        summary["targets"] = {
            "per_worker_throughput >= 0.8 x one-core decode": summary["per_worker_vs_raw_decode"] >= 0.8,
            "marginal memory per image (tree PSS) <= 1.3 x file size": summary[
                "marginal_tree_pss_per_image_vs_file_size"
            ]
            <= 1.3,
            "first batch at large <= 2 x at small": summary["first_batch_large_vs_small"] <= 2.0,
            "data wait <= 5% of step time": summary["data_wait_fraction_large"] <= 0.05,
        }
    n_mid = theirs[args.mid_frames]
    if "failed" not in theirs[args.small_frames] and "failed" not in n_mid:
        summary["nerfstudio_marginal_tree_rss_per_image_bytes"] = marginal(n_mid, theirs[args.small_frames], "tree_rss")
        summary["nerfstudio_first_batch_mid_vs_small"] = (
            n_mid["time_to_first_batch_s"] / theirs[args.small_frames]["time_to_first_batch_s"]
        )
    report["summary"] = summary
    finish_machine_record(report["machine"])
    sys.stdout.write(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
