"""Start-up hang stress: launch ``torchrun --nproc_per_node 2 ns-train distsplat`` N times.

Each launch trains a few steps on CPU (gloo) with tensorboard on, 2 DataLoader workers per rank and
B=4 (the set-up of the reported hang: a DataLoader worker forked after gloo/tensorboard threads
existed deadlocked in ``PyOS_AfterFork_Child``, and its peer rank waited in a collective). A launch:
- ``ok``: exit 0 within the per-launch timeout;
- ``failed``: exited non-zero; ``report`` holds the log lines that name the stuck rank and phase
  (``distributed/lifecycle.py``'s "start-up phase '<name>': rank(s) [r] did not finish ..." and the
  whereabouts of each rank) or else the last error line;
- ``hung``: still running at ``--timeout-s``. Before its process tree is killed (SIGKILL, by pid),
  the script records every process of the tree (command, state, kernel wait channel) and the
  log lines as for ``failed``.
``--collective-timeout-s`` (passed to ns-train) is set below ``--timeout-s`` so that a rank stuck
at start-up is reported by the run itself, by rank and phase, before the launch is killed.

Run: ``python benchmarks/stress_launch.py [--launches 20] [--out results.json]``. Logs of launches
that were not ``ok`` are kept under ``--keep-logs`` (default: a temporary folder, named in the JSON).

Check of the detector itself: ``--stall setup`` makes rank ``--stall-rank`` sleep forever while
building the datamanager (start-up phase "pipeline setup"), ``--stall first-batch`` while waiting for
its first batch (as a rank whose DataLoader worker hung); every such launch must end ``failed`` with
the rank and phase named, not ``hung``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SCENE = REPO / "scenes" / "lund_door"

# Lines that name a stuck rank or phase (distributed/lifecycle.py, distributed/reporting.py).
_REPORT = re.compile(r"start-up phase|did not finish|last seen|rank\(s\)|Timed out|timed out|RunFailure|Error")


STALLS = ("none", "setup", "first-batch")


def train_command(out: Path, launch: int, args: argparse.Namespace) -> list[str]:
    program = [str(BIN / "ns-train")]
    if args.stall != "none":
        program = [str(Path(__file__).resolve()), "--as-ns-train", args.stall, str(args.stall_rank)]
    return [
        str(BIN / "torchrun"), "--standalone", "--nproc_per_node", "2", *program, "distsplat",
        "--output-dir", str(out), "--experiment-name", "stress", "--timestamp", f"launch{launch:03d}",
        "--machine.device-type", "cpu",
        "--max-num-iterations", str(4 * args.steps),
        "--pipeline.batch-size", "4",
        "--pipeline.datamanager.num-workers", "2",
        "--collective-timeout-s", str(args.collective_timeout_s),
        "--vis", "tensorboard",
        "--steps-per-eval-all-images", "100000",
        "--viewer.quit-on-train-completion", "True",
        "--logging.local-writer.enable", "False",
        "colmap", "--data", str(args.scene), "--colmap-path", "sparse/0", "--load-3D-points", "True",
        "--downscale-factor", "1",
    ]  # fmt: skip


def process_tree(root: psutil.Process) -> list[dict]:
    """Every process under ``root`` (itself first): pid, parent, state, kernel wait channel, command."""
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            wchan = Path(f"/proc/{proc.pid}/wchan").read_text().strip()
        except OSError:
            wchan = ""
        try:
            found.append(
                {
                    "pid": proc.pid,
                    "ppid": proc.ppid(),
                    "status": proc.status(),
                    "wchan": wchan,
                    "num_threads": proc.num_threads(),
                    "cmd": " ".join(proc.cmdline())[:200],
                }
            )
        except psutil.Error:
            continue
    return found


def kill_tree(root: psutil.Process) -> None:
    """SIGKILL ``root`` and every process under it, by pid (ranks run in sessions of their own)."""
    procs = [root, *root.children(recursive=True)]
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.Error:
            pass
    psutil.wait_procs(procs, timeout=10)


def report_lines(text: str, limit: int = 12) -> list[str]:
    """The log lines naming a stuck rank or phase (or an error), de-duplicated, in order."""
    seen: list[str] = []
    for line in text.splitlines():
        line = line.strip()
        if line and _REPORT.search(line) and line not in seen:
            seen.append(line[:400])
    return seen[-limit:]


def launch_once(launch: int, args: argparse.Namespace, work: Path, keep: Path) -> dict:
    out = work / f"launch{launch:03d}"
    log_path = out / "log.txt"
    out.mkdir(parents=True)
    # This checkout's distsplat_ns, not the one the virtual environment was installed from.
    pythonpath = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=pythonpath)
    start = time.perf_counter()
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            train_command(out, launch, args),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            start_new_session=True,
        )
        root = psutil.Process(proc.pid)
        result: dict = {"launch": launch}
        try:
            result["exit_code"] = proc.wait(timeout=args.timeout_s)
            result["outcome"] = "ok" if result["exit_code"] == 0 else "failed"
        except subprocess.TimeoutExpired:
            result["outcome"] = "hung"
            result["exit_code"] = None
            result["processes"] = process_tree(root)
            kill_tree(root)
            proc.wait()
    result["wall_s"] = time.perf_counter() - start
    text = log_path.read_text(errors="replace")
    if result["outcome"] != "ok":
        result["report"] = report_lines(text)
        kept = keep / f"launch{launch:03d}.log"
        shutil.copyfile(log_path, kept)
        result["log"] = str(kept)
    shutil.rmtree(out, ignore_errors=True)
    return result


def ns_train_with_stall(stall: str, stall_rank: int) -> None:
    """ns-train in this process, rank ``stall_rank`` sleeping forever at ``stall`` (detector check)."""
    sys.path.insert(0, str(REPO))
    from distsplat_ns.data import datamanager

    def sleep_forever(*args: object, **kwargs: object) -> None:
        del args, kwargs
        while True:
            time.sleep(60)

    if int(os.environ.get("RANK", "0")) == stall_rank:
        if stall == "setup":
            datamanager.ParallelFullImageDatamanager.setup_train = sleep_forever  # type: ignore[method-assign]
        else:
            datamanager.ParallelFullImageDatamanager.next_train_batch = sleep_forever  # type: ignore[method-assign]
    from nerfstudio.scripts.train import entrypoint

    entrypoint()


def _git_commit() -> str:
    """HEAD of the checkout the launches ran (with "+dirty" when files differ from it)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], check=False, capture_output=True, text=True, cwd=REPO).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"], check=False, capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    return head + ("+dirty" if dirty else "")


def main() -> None:
    if len(sys.argv) > 3 and sys.argv[1] == "--as-ns-train":
        stall, stall_rank = sys.argv[2], int(sys.argv[3])
        del sys.argv[1:4]
        ns_train_with_stall(stall, stall_rank)
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=20)
    parser.add_argument("--steps", type=int, default=5, help="training steps per launch (B=4)")
    parser.add_argument("--timeout-s", type=float, default=240.0, help="per launch; then its tree is killed")
    parser.add_argument("--collective-timeout-s", type=float, default=90.0, help="ns-train's --collective-timeout-s")
    parser.add_argument("--scene", type=Path, default=SCENE)
    parser.add_argument("--stall", choices=STALLS, default="none", help="detector check (module docstring)")
    parser.add_argument("--stall-rank", type=int, default=1)
    parser.add_argument("--keep-logs", type=Path)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if args.collective_timeout_s >= args.timeout_s:
        parser.error("--collective-timeout-s must be below --timeout-s (the run must report a stuck rank first)")
    work = Path(tempfile.mkdtemp(prefix="stress_launch_"))
    keep = args.keep_logs or work / "kept_logs"
    keep.mkdir(parents=True, exist_ok=True)
    launches = []
    for launch in range(args.launches):
        result = launch_once(launch, args, work, keep)
        launches.append(result)
        print(json.dumps({k: result[k] for k in ("launch", "outcome", "exit_code", "wall_s")}), flush=True)
    walls = [r["wall_s"] for r in launches if r["outcome"] == "ok"]
    report = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "train_command": " ".join(train_command(work / "launchNNN", 0, args)),
        "commit": _git_commit(),
        "cpu_count": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "launches": args.launches,
        "stall": args.stall,
        "counts": {o: sum(r["outcome"] == o for r in launches) for o in ("ok", "failed", "hung")},
        "wall_s_ok": {"min": min(walls), "median": statistics.median(walls), "max": max(walls)} if walls else None,
        "kept_logs": str(keep),
        "runs": launches,
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
