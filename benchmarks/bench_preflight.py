"""Cost of the start-up checks (``data/preflight.py``) on a ~2000-image scene, with and without the JPEG end check.

The fox frames (``../shared/data/fox``, 1080x1920 JPEG) repeated to ``--frames`` files, twice: as
symlinks to fox's 67 files (``tests.helpers.data_fixtures.make_repeated_fox``, as
``bench_anchor_disk.py``) and as copies (every file its own inode, as a real capture). In one
process, the passes alternate ``--repeats`` times over the same files:

- ``headers_s``: ``check_image_headers`` with the end check switched off (what start-up ran before);
- ``headers_and_end_s``: ``check_image_headers`` as it runs now (header, size, end-of-image marker);
- ``end_check_s``: ``jpeg_is_complete`` alone over every file (its two-byte read);
- ``end_check_slow_path_s``: the fallback for a file that does not end with ``FF D9`` (the whole file
  read and its segments walked, ``jpeg_end_offset``) over every file: the worst case, a scene whose
  every file is padded.

The files are in the page cache (just written, or read by the previous pass), as they are at
start-up in RAM mode, where the datamanager has read every byte into its store before the checks
run; in disk mode the end check reads one more page per file (the last). ``end_overhead_ratio``:
median ``headers_and_end_s`` / median ``headers_s``, per layout, taken in one run.

For scale, ``datamanager_setup_s``: building ``ParallelFullImageDatamanager`` on the symlinked scene
(nerfstudio-data parser, every frame a training frame, no workers), once untimed, then with the end
check and without, alternating (``--setup-repeats``; 0 skips it): parsing, camera preparation, reading
the files into the store and the checks.

Usage: ``python benchmarks/bench_preflight.py [--frames 2010] [--repeats 5] [--setup-repeats 1] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

FOX = (REPO / ".." / "shared" / "data" / "fox").resolve()


def _scene(kind: str, root: Path, num_frames: int) -> list[Path]:
    from tests.helpers.data_fixtures import make_repeated_fox

    scene = make_repeated_fox(FOX, root / kind, num_frames)
    paths = sorted((scene / "images").iterdir())
    if kind == "copies":
        for path in paths:
            source = path.resolve()
            path.unlink()
            shutil.copyfile(source, path)
    return paths


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def measure(paths: list[Path], repeats: int) -> dict:
    from distsplat_ns.data import preflight
    from distsplat_ns.data.image_loader import ImageSpec

    width, height = preflight.header_size_wh(paths[0])
    specs = [ImageSpec(height=height, width=width)] * len(paths)
    end_check = preflight.jpeg_is_complete

    def headers() -> None:
        preflight.jpeg_is_complete = lambda path: True  # type: ignore[assignment]
        try:
            preflight.check_image_headers(paths, specs, what="train image")
        finally:
            preflight.jpeg_is_complete = end_check

    def headers_and_end() -> None:
        preflight.check_image_headers(paths, specs, what="train image")

    def end_only() -> None:
        assert all(end_check(p) for p in paths)

    def slow_path() -> None:
        for path in paths:
            with open(path, "rb") as fh:
                assert preflight.jpeg_end_offset(fh.read()) is not None

    passes = {"headers_s": headers, "headers_and_end_s": headers_and_end, "end_check_s": end_only, "end_check_slow_path_s": slow_path}
    headers_and_end()  # warm the page cache and the imports
    times: dict[str, list[float]] = {name: [] for name in passes}
    for _ in range(repeats):
        for name, fn in passes.items():
            times[name].append(_time(fn))
    median = {name: statistics.median(values) for name, values in times.items()}
    return {
        "num_files": len(paths),
        "total_file_bytes": sum(p.stat().st_size for p in paths),
        "times_s": times,
        "median_s": median,
        "end_check_us_per_file": 1e6 * median["end_check_s"] / len(paths),
        "end_check_slow_path_us_per_file": 1e6 * median["end_check_slow_path_s"] / len(paths),
        "end_overhead_ratio": median["headers_and_end_s"] / median["headers_s"],
    }


def measure_setup(scene: Path, repeats: int) -> dict:
    from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig

    from distsplat_ns.data import preflight
    from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig

    end_check = preflight.jpeg_is_complete
    config = ParallelFullImageDatamanagerConfig(dataparser=NerfstudioDataParserConfig(data=scene, downscale_factor=1, eval_mode="all"), num_workers=0)
    config.setup(device="cpu").close()  # imports, OpenCV's first call, the page cache
    times: dict[str, list[float]] = {"with_end_check_s": [], "without_end_check_s": []}
    disk_mode = None
    for _ in range(repeats):
        for name, samples in times.items():
            if name == "without_end_check_s":
                preflight.jpeg_is_complete = lambda path: True  # type: ignore[assignment]
            try:
                start = time.perf_counter()
                manager = config.setup(device="cpu")
                samples.append(time.perf_counter() - start)
            finally:
                preflight.jpeg_is_complete = end_check
            disk_mode = manager.stats()["disk_mode"]
            manager.close()
            del manager
    return {"times_s": times, "median_s": {k: statistics.median(v) for k, v in times.items()}, "disk_mode": disk_mode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2010, help="files in the scene (fox has 67 frames: 2010 = 30 x 67)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--setup-repeats", type=int, default=1, help="datamanager builds per variant (0: none)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file to write (default: print only)")
    args = parser.parse_args()
    if not FOX.is_dir():
        raise SystemExit(f"{FOX} is absent: this benchmark needs ../shared/data/fox")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
    result = {
        "command": " ".join(["benchmarks/bench_preflight.py", *sys.argv[1:]]),
        "commit": commit,
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "loadavg_before": os.getloadavg(),
        "layouts": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench_preflight_") as tmp:
        for kind in ("symlinks", "copies"):
            paths = _scene(kind, Path(tmp), args.frames)
            result["layouts"][kind] = measure(paths, args.repeats)
            if kind == "symlinks" and args.setup_repeats > 0:
                result["datamanager_setup_s"] = measure_setup(Path(tmp) / kind, args.setup_repeats)
            shutil.rmtree(Path(tmp) / kind)
    result["loadavg_after"] = os.getloadavg()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
