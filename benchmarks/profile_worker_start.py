"""Where a forkserver worker's start-up seconds go: import costs, each in a fresh interpreter.

- ``interpreter_s``: ``python -c pass``;
- ``server_preload_s``: importing ``distsplat_ns.data.worker_server`` (what the fork server
  preloads: the stream, torch, numpy, the decoders), interpreter included;
- ``ns_train_main_s``: running ``ns-train``'s console script as ``__mp_main__`` once that preload
  is done -- what multiprocessing's start-up made each worker pay before the fork server skipped
  the main script (``data/worker_server.py``).
Medians of ``--repeats`` runs, interleaved. The rest of a first batch (the server's fork of each
worker, the worker's unpickling and its first decode) is in ``benchmarks/bench_worker_start.py``'s
``start_workers_s``/``first_wait_s``/``first_decode_s``. Run:
``python benchmarks/profile_worker_start.py [--repeats 3] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NS_TRAIN = Path(sys.executable).parent / "ns-train"

_TIMED_MAIN = (
    "import runpy, sys, time\n"
    "import distsplat_ns.data.worker_server\n"
    "start = time.perf_counter()\n"
    "runpy.run_path(sys.argv[1], run_name='__mp_main__')\n"
    "print(time.perf_counter() - start)\n"
)


def _wall_s(code: str, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, cwd=REPO, env=env)
    return time.perf_counter() - start


def _printed_s(code: str, *args: str) -> float:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", code, *args], check=True, capture_output=True, text=True, cwd=REPO, env=env)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"interpreter_s": [], "server_preload_s": [], "ns_train_main_s": []}
    for _ in range(args.repeats):
        runs["interpreter_s"].append(_wall_s("pass"))
        runs["server_preload_s"].append(_wall_s("import distsplat_ns.data.worker_server"))
        runs["ns_train_main_s"].append(_printed_s(_TIMED_MAIN, str(NS_TRAIN)))
    report = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "load_average_at_end": os.getloadavg(),
        "median": {key: statistics.median(values) for key, values in runs.items()},
        "runs": runs,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
