"""Start-up cost of the DataLoader workers' start method: fork vs forkserver vs spawn.

For each start method a fresh interpreter (as a training rank: torch imported, a few threads alive)
times, on the shipped lund_door images with 2 workers and B=4:
- ``first_batch_s``: from creating the stream reader to holding step 0's batch, the first time
  (for forkserver this includes starting the fork server, which preloads ``__main__`` and
  ``distsplat_ns.data.stream``);
- ``restart_s``: the same for a second reader in the same process (a restart after eval or resume);
- ``batches_per_s``: steps per second over the next 20 steps (the steady state);
- ``server_uss_mib``: private memory of the fork server (forkserver only);
- ``first_batch_prestarted_s``: ``first_batch_s`` when the fork server was started 3 s earlier
  (``stream.start_worker_server``, as the datamanager does at construction, before the model is
  built), in a separate fresh interpreter.
Ratios to fork are taken within one run (same machine load). Run:
``python benchmarks/bench_worker_start.py [--repeats 3] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

METHODS = ("fork", "forkserver", "spawn")


def child(method: str, prestart: bool = False) -> dict:
    import threading

    from distsplat_ns.data.stream import ImageBatchStream, TrainBatchReader, start_worker_server
    from tests.helpers.data_fixtures import make_loader

    if prestart:
        start_worker_server(method)
        time.sleep(3.0)  # the model's construction, in training

    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait, daemon=True) for _ in range(4)]  # as gloo/tensorboard
    for thread in threads:
        thread.start()
    paths = sorted((REPO / "scenes" / "lund_door" / "images").glob("*.JPG"))
    loader = make_loader(paths)
    loader.images.wait_filled()
    result: dict = {"method": method}
    for key in ("first_batch_s", "restart_s"):
        start = time.perf_counter()
        reader = TrainBatchReader(ImageBatchStream(loader, 4, seed=0), 2, 2, method)
        reader.next_batch(0)
        result[key] = time.perf_counter() - start
        if key == "restart_s":
            start = time.perf_counter()
            for step in range(1, 21):
                reader.next_batch(step)
            result["batches_per_s"] = 20 / (time.perf_counter() - start)
        if key == "restart_s":
            result["server_uss_mib"] = _fork_server_uss_mib()
        reader.close()
    stop.set()
    return result


def _fork_server_uss_mib() -> float:
    """Private memory of this process's fork server (0 without one): the start method's memory cost."""
    import psutil

    for proc in psutil.Process().children():
        if "forkserver" in " ".join(proc.cmdline()):
            return proc.memory_full_info().uss / (1 << 20)
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=METHODS)
    parser.add_argument("--prestart", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.prestart)))
        return
    runs: dict[str, list[dict]] = {m: [] for m in METHODS}
    for _ in range(args.repeats):
        for method in METHODS:  # interleaved: the machine's load hits every method alike
            out = subprocess.run([sys.executable, __file__, "--child", method], capture_output=True, text=True, check=True, cwd=REPO)
            runs[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
        out = subprocess.run(
            [sys.executable, __file__, "--child", "forkserver", "--prestart"], capture_output=True, text=True, check=True, cwd=REPO
        )
        runs["forkserver"][-1]["first_batch_prestarted_s"] = json.loads(out.stdout.strip().splitlines()[-1])["first_batch_s"]
    summary = {}
    for method in METHODS:
        summary[method] = {k: statistics.median(r[k] for r in runs[method]) for k in ("first_batch_s", "restart_s", "batches_per_s")}
    for key in ("first_batch_prestarted_s", "server_uss_mib"):
        summary["forkserver"][key] = statistics.median(r[key] for r in runs["forkserver"])
    for method in METHODS:
        for key in ("first_batch_s", "restart_s", "batches_per_s"):
            summary[method][f"{key}_vs_fork"] = summary[method][key] / summary["fork"][key]
    report = {"command": " ".join(sys.argv), "repeats": args.repeats, "median": summary, "runs": runs}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
