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
  (``workers.start_worker_server``, as the datamanager does at construction, before the model is
  built), in a separate fresh interpreter.
- ``forkserver_ns_train_main``: forkserver again, but the child's main script first imports what
  ``ns-train``'s console script imports (``nerfstudio.scripts.train``), as a training rank's does:
  a worker that re-runs the main script at start-up pays those imports.
Each first batch is split into ``start_workers_s`` (creating the reader: for forkserver, starting
the server, its imports and the forks) and ``first_wait_s`` (the workers' own start-up and their
first decode, of which ``first_decode_s`` is the workers' decode seconds, summed over the workers).
Ratios to fork are taken within one run (same machine load). Run:
``python benchmarks/bench_worker_start.py [--repeats 3] [--out results.json]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

METHODS = ("fork", "forkserver", "spawn")
NS_MAIN = "forkserver_ns_train_main"

# A main script like ns-train's console script (which imports nerfstudio's training CLI at its top),
# running this benchmark's child.
_NS_TRAIN_LIKE_MAIN = f"""import sys
from nerfstudio.scripts.train import entrypoint  # noqa: F401 - as ns-train's script
sys.path.insert(0, {str(REPO / "benchmarks")!r})
if __name__ == "__main__":
    import bench_worker_start
    bench_worker_start.main()
"""


def child(method: str, prestart: bool = False) -> dict:
    import threading

    from distsplat_ns.data.reader import TrainBatchReader
    from distsplat_ns.data.stream import ImageBatchStream
    from distsplat_ns.data.workers import start_worker_server
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
        started = time.perf_counter()
        reader.next_batch(0)
        result[key] = time.perf_counter() - start
        if key == "first_batch_s":
            result["start_workers_s"] = started - start
            result["first_wait_s"] = result[key] - result["start_workers_s"]
            result["first_decode_s"] = reader.decode_s
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


def _git_commit() -> str:
    """HEAD of this checkout (with "+dirty" when tracked files differ from it)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True, cwd=REPO).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], check=False, capture_output=True, text=True, cwd=REPO)
    return head + ("+dirty" if dirty.stdout.strip() else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", choices=METHODS)
    parser.add_argument("--ns-train-main", action="store_true", help="(internal) the child runs under an ns-train-like main")
    parser.add_argument("--prestart", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.prestart)))
        return
    runs: dict[str, list[dict]] = {m: [] for m in (*METHODS, NS_MAIN)}
    ns_main = Path(tempfile.mkdtemp(prefix="bench_worker_start_")) / "ns_train_like_main.py"
    ns_main.write_text(_NS_TRAIN_LIKE_MAIN)
    for _ in range(args.repeats):
        for method in METHODS:  # interleaved: the machine's load hits every method alike
            out = subprocess.run([sys.executable, __file__, "--child", method], capture_output=True, text=True, check=True, cwd=REPO)
            runs[method].append(json.loads(out.stdout.strip().splitlines()[-1]))
        out = subprocess.run([sys.executable, __file__, "--child", "forkserver", "--prestart"], capture_output=True, text=True, check=True, cwd=REPO)
        runs["forkserver"][-1]["first_batch_prestarted_s"] = json.loads(out.stdout.strip().splitlines()[-1])["first_batch_s"]
        out = subprocess.run(
            [sys.executable, str(ns_main), "--child", "forkserver", "--ns-train-main"], capture_output=True, text=True, check=True, cwd=REPO
        )
        runs[NS_MAIN].append(json.loads(out.stdout.strip().splitlines()[-1]))
    summary = {}
    keys = ("first_batch_s", "restart_s", "batches_per_s", "start_workers_s", "first_wait_s", "first_decode_s")
    for method in (*METHODS, NS_MAIN):
        summary[method] = {k: statistics.median(r[k] for r in runs[method]) for k in keys}
    for key in ("first_batch_prestarted_s", "server_uss_mib"):
        summary["forkserver"][key] = statistics.median(r[key] for r in runs["forkserver"])
    for method in (*METHODS, NS_MAIN):
        for key in ("first_batch_s", "restart_s", "batches_per_s"):
            summary[method][f"{key}_vs_fork"] = summary[method][key] / summary["fork"][key]
    report = {"command": " ".join(sys.argv), "commit": _git_commit(), "repeats": args.repeats, "median": summary, "runs": runs}
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
