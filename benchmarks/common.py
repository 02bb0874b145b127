"""What every benchmark shares: the one way to launch a training run, pick a port and record the machine.

Run a benchmark from the repository root as a module (``python -m benchmarks.NAME``); the index is
benchmarks/README.md. A new benchmark builds on these functions and on nothing private of another:

- :func:`train_command`: the command line of one training run on ``world_size`` ranks --
  ``ns-train ARGS`` (or ``python -m MODULE ARGS`` where a benchmark wraps ns-train) on one rank,
  ``python -m torch.distributed.run`` of the same on several (its port from :func:`free_port`),
  optionally pinned to the first cores with ``taskset``.
- :func:`unattended_args`: the ns-train flags of a run nobody watches (no viewer, quit at the end,
  no eval or save during the run unless asked).
- :func:`child_env`: the environment of every child process: this tree first on ``PYTHONPATH``
  (the venv's editable install may point at another worktree), unbuffered output, one intra-op
  thread unless told otherwise.
- :func:`run_command`: run a command, capture its output (or write it to a log file), raise with
  the tails when it fails.
- :func:`free_port`: a TCP port free on 127.0.0.1 now (the OS picks it).
- :func:`machine_record` at the start and :func:`finish_machine_record` at the end: the one record
  of the machine a result carries, under ``"machine"``, with the fields of :data:`MACHINE_FIELDS`.
- :func:`result_path` and :func:`write_json`: ``benchmarks/results/<stem>_<date>.json``.
- :func:`load_script`: a module of ``scripts/`` (the GPU check's launcher and argument builder),
  loaded by path: ``scripts/`` is not a package.

Example (a new benchmark)::

    from benchmarks.common import child_env, finish_machine_record, machine_record, result_path
    from benchmarks.common import run_command, train_command, unattended_args, write_json

    machine = machine_record()
    cmd = train_command(["distsplat", "--max-num-iterations", "8", *unattended_args(), "colmap", "--data", str(scene)], world_size=2)
    proc = run_command(cmd, name="w2", env=child_env(), timeout=600)
    write_json(result_path("capacity"), {"machine": finish_machine_record(machine), "command": cmd})
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
SHARED_DATA = REPO.parent / "shared" / "data"
"""The real scenes (bird, fox, lund_door at full size) beside the repository."""
BIN = Path(sys.executable).parent

MACHINE_FIELDS = (
    "cpu_count",
    "load_average_1min_start",
    "load_average_1min_end",
    "torch",
    "python",
    "git_commit",
    "started_utc",
)
"""The keys of every result's ``"machine"`` record (older result files used other names:
``loadavg_start``, ``load_average_1min_at_start``, ``loadavg_before``, ``host.cpus``)."""


# ----------------------------------------------------------------------------- processes
def ns_train_executable() -> str:
    """``ns-train`` next to this interpreter (a venv), else on PATH (gpu_check.sh's ``--target`` site/bin).

    Raises:
        SystemExit: Neither exists.
    """
    beside = BIN / "ns-train"
    found = str(beside) if beside.exists() else shutil.which("ns-train")
    if found is None:
        raise SystemExit("error: ns-train is neither next to this Python nor on PATH")
    return found


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (bound with port 0, the OS's choice).

    The port is released before it is returned; the launch that uses it binds it within a second,
    and the OS hands out ports in turn, so another caller's next port 0 is a different one.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def train_command(
    args: Sequence[str],
    *,
    world_size: int = 1,
    module: str | None = None,
    cores: Sequence[int] | None = None,
) -> list[str]:
    """The command line of one training run: the only way the benchmarks start ns-train or torchrun.

    Args:
        args: The ns-train arguments (method first, e.g. ``["distsplat", "--max-num-iterations", "8", ...]``).
        world_size: Ranks. 1 runs the program itself; more run it under ``python -m
            torch.distributed.run`` (gloo or NCCL as the config picks) on 127.0.0.1 and a
            :func:`free_port`.
        module: Run ``python -m MODULE ARGS`` instead of ``ns-train ARGS`` (a benchmark's own
            wrapper of ns-train's entry point, e.g. ``benchmarks.bench_shard_balance``).
        cores: Pin the run (every rank and its DataLoader workers) to these cores with
            ``taskset`` (e.g. ``range(world_size)``: one core per rank); None leaves it unpinned.

    Returns:
        The argument list for :func:`run_command` or ``subprocess``.

    Raises:
        ValueError: ``world_size`` below 1, or ``cores`` empty.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if cores is not None and not list(cores):
        raise ValueError("cores must name at least one core, or be None")
    program = ["-m", module] if module is not None else [ns_train_executable()]
    if world_size == 1:
        cmd = [sys.executable, *program] if module is not None else program
    else:
        launcher = [
            "--nproc_per_node",
            str(world_size),
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(free_port()),
        ]
        cmd = [sys.executable, "-m", "torch.distributed.run", *launcher, *program]
    cmd = [*cmd, *args]
    if cores is not None:
        cmd = ["taskset", "-c", ",".join(str(c) for c in cores), *cmd]
    return cmd


ONCE = 1_000_000_000
"""A period no benchmark run reaches: as ``--steps-per-eval-all-images``, evaluate after step 0 only."""


def colmap_args(data: Path, downscale: int = 1) -> list[str]:
    """ns-train's dataparser arguments for a COLMAP capture at ``data`` (``sparse/0``; its 3D points
    seed the Gaussians), its images at 1/``downscale`` of their size."""
    return [
        "colmap",
        "--data",
        str(data),
        "--colmap-path",
        "sparse/0",
        "--load-3D-points",
        "True",
        "--downscale-factor",
        str(downscale),
    ]


def unattended_args(*, save_every: int = 0, eval_at_step_0: bool = False) -> list[str]:
    """The ns-train flags of a run nobody watches: no viewer, quit at the end, no eval or save during the run unless asked.

    ``--vis tensorboard``, not the viewer (which waits for a browser): a writer keeps the trainer's
    evals on (nerfstudio's ``check_eval_enabled``) and holds the step times some benchmarks read.
    ``--viewer.quit-on-train-completion True`` ends the process after the last step, and
    ``--logging.local-writer.enable False`` drops the console table. Each period is 0, which
    ``step_check`` reads as never (``--steps-per-eval-batch``: distsplat's trainer never reads it;
    nerfstudio's, e.g. splatfacto's, does). Whatever they say, distsplat's trainer saves after the
    last step and evaluates every held-out image then (``final_eval_psnr``).

    Args:
        save_every: Save every this many steps and keep each checkpoint (``--save-only-latest-checkpoint
            False``: the benchmarks that save load every one); 0: only the end-of-run save.
        eval_at_step_0: Also evaluate every held-out image after step 0 (the initial model's PSNR).
            distsplat's trainer does so whenever ``--steps-per-eval-all-images`` is non-zero
            (``run_at_zero``), so this passes :data:`ONCE`; False passes 0: never.

    Returns:
        Flags for between the method and the dataparser subcommand.

    Raises:
        ValueError: ``save_every`` below 0.
    """
    if save_every < 0:
        raise ValueError(f"save_every must be >= 0 (0: only the end-of-run save), got {save_every}")
    saves = ["--steps-per-save", str(save_every), *(["--save-only-latest-checkpoint", "False"] if save_every else [])]
    return [
        "--vis", "tensorboard", "--viewer.quit-on-train-completion", "True", "--logging.local-writer.enable", "False",
        "--steps-per-eval-batch", "0", "--steps-per-eval-image", "0",
        "--steps-per-eval-all-images", str(ONCE if eval_at_step_0 else 0),
        *saves,
    ]  # fmt: skip


def child_env(threads: int | None = 1, **extra: str) -> dict[str, str]:
    """This process's environment for a child: this tree first on ``PYTHONPATH``, unbuffered output.

    Args:
        threads: ``OMP_NUM_THREADS`` (one intra-op thread per rank, as every CPU benchmark runs);
            None keeps the caller's.
        extra: More variables, e.g. ``DISTSPLAT_SHARD_BOUND="1.1"``.
    """
    env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO]
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), *paths])
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def run_command(
    cmd: Sequence[str],
    *,
    name: str,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
    cwd: Path = REPO,
    log: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` to its end with its output captured (or written to ``log``); fail loudly with the output's tails.

    Args:
        cmd: From :func:`train_command` or any argument list.
        name: The run's name for the error message.
        env: The child's environment (default :func:`child_env`).
        timeout: Seconds before the run is killed (``subprocess.TimeoutExpired`` propagates).
        cwd: The child's working folder (default the repository root).
        log: Write stdout and stderr together to this file instead of capturing them (a long
            run's progress, readable while it runs); the returned process then has no output.

    Raises:
        RuntimeError: The command exited non-zero; the message holds its last stdout and stderr.
    """
    run_env = dict(env) if env is not None else child_env()
    if log is None:
        proc = subprocess.run(
            list(cmd),
            capture_output=True,
            text=True,
            env=run_env,
            cwd=cwd,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        tails = f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    else:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as fh:
            proc = subprocess.run(
                list(cmd),
                stdout=fh,
                stderr=subprocess.STDOUT,
                text=True,
                env=run_env,
                cwd=cwd,
                timeout=timeout,
                stdin=subprocess.DEVNULL,
                check=False,
            )
        tails = f"(log {log})\n{log.read_text(errors='replace')[-4000:]}"
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}): {' '.join(cmd)}\n{tails}")
    return proc


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as module ``name`` (registered in ``sys.modules``: dataclasses look their module up by name).

    Raises:
        ValueError: No such script.
    """
    if name in sys.modules:
        return sys.modules[name]
    path = REPO / "scripts" / f"{name}.py"
    if not path.is_file():
        raise ValueError(f"load_script: no {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------- the machine
def load_average_1min() -> float | None:
    """The 1-minute load average, or None where the OS has none."""
    try:
        return float(os.getloadavg()[0])
    except OSError:
        return None


def git_commit() -> str:
    """``HEAD`` of this tree, with ``+dirty`` when tracked files differ from it; ``"unknown"`` outside git."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return ""

    head = git("rev-parse", "HEAD")
    if not head:
        return "unknown"
    return head + ("+dirty" if git("status", "--porcelain", "--untracked-files=no") else "")


def machine_record() -> dict[str, Any]:
    """The machine at a benchmark's start (``load_average_1min_end`` None until :func:`finish_machine_record`).

    Returns:
        A dict with exactly the keys of :data:`MACHINE_FIELDS`.
    """
    try:
        import torch

        torch_version = str(torch.__version__)
    except ImportError:
        torch_version = "not installed"
    return {
        "cpu_count": os.cpu_count(),
        "load_average_1min_start": load_average_1min(),
        "load_average_1min_end": None,
        "torch": torch_version,
        "python": platform.python_version(),
        "git_commit": git_commit(),
        "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
    }


def finish_machine_record(machine: dict[str, Any]) -> dict[str, Any]:
    """``machine`` with the load average at the end filled in (the same dict, returned for chaining)."""
    machine["load_average_1min_end"] = load_average_1min()
    return machine


# ----------------------------------------------------------------------------- results
def result_path(stem: str, suffix: str = ".json") -> Path:
    """``benchmarks/results/<stem>_<UTC date><suffix>``, the default place of a benchmark's result."""
    return RESULTS / f"{stem}_{dt.datetime.now(dt.timezone.utc).date().isoformat()}{suffix}"


def write_json(path: Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON (parent folders made); return ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")
    return path
