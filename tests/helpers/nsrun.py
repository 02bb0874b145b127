"""Run nerfstudio commands (ns-train distsplat, ns-export, ns-eval) as a user would, in subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCENE = REPO / "scenes" / "lund_door"
SHARED_DATA = REPO.parent / "shared" / "data"
BIN = Path(sys.executable).parent

COLMAP_ARGS = [
    "colmap",
    "--data",
    str(SCENE),
    "--colmap-path",
    "sparse/0",
    "--load-3D-points",
    "True",
    "--downscale-factor",
    "1",
]


def ns_bin(name: str) -> str:
    path = BIN / name
    return str(path) if path.exists() else name


VARIANT_METHODS = (
    "distsplat-mcmc=distsplat_ns.registry:distsplat_mcmc,distsplat-big=distsplat_ns.registry:distsplat_big"
)
"""The method variants, named to nerfstudio by environment, so the tests run them from the working
tree even where the installed package metadata predates their entry points (pyproject declares
them; nerfstudio lets the variable override an installed entry point of the same name)."""


def cpu_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "2")
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("NERFSTUDIO_METHOD_CONFIGS", VARIANT_METHODS)
    return env


def train_args(
    out: Path,
    timestamp: str,
    num_images: int,
    extra: Sequence[str] = (),
    data_args: Sequence[str] = COLMAP_ARGS,
    method: str = "distsplat",
) -> list[str]:
    return [
        method,
        "--output-dir",
        str(out),
        "--experiment-name",
        "it",
        "--timestamp",
        timestamp,
        "--machine.device-type",
        "cpu",
        "--max-num-iterations",
        str(num_images),
        "--vis",
        "tensorboard",
        "--viewer.quit-on-train-completion",
        "True",
        "--logging.local-writer.enable",
        "False",
        *extra,
        *data_args,
    ]


def run_ns_train(
    out: Path,
    timestamp: str,
    num_images: int,
    extra: Sequence[str] = (),
    timeout: float = 900,
    check: bool = True,
    data_args: Sequence[str] = COLMAP_ARGS,
    method: str = "distsplat",
) -> subprocess.CompletedProcess:
    cmd = [ns_bin("ns-train"), *train_args(out, timestamp, num_images, extra, data_args, method)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=cpu_env(), check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"ns-train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def run_torchrun(
    out: Path,
    timestamp: str,
    num_images: int,
    nproc: int,
    extra: Sequence[str] = (),
    timeout: float = 900,
    check: bool = True,
    torchrun_args: Sequence[str] = (),
    program: Sequence[str] = (),
) -> subprocess.CompletedProcess:
    """``torchrun ... ns-train <args>``; ``program`` replaces ``ns-train`` (a script and its own
    leading arguments, e.g. tests/helpers/ns_train_patched.py)."""
    cmd = [
        ns_bin("torchrun"),
        "--nproc_per_node",
        str(nproc),
        *torchrun_args,
        *(program or [ns_bin("ns-train")]),
        *train_args(out, timestamp, num_images, extra),
    ]
    env = cpu_env()
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    if check and proc.returncode != 0:
        raise AssertionError(f"torchrun failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def run_dir(out: Path, timestamp: str, method: str = "distsplat") -> Path:
    """A run's folder: ``method`` is the method's name (each variant has its own folder)."""
    return out / "it" / method / timestamp


def read_stats(out: Path, timestamp: str, method: str = "distsplat") -> dict:
    return json.loads((run_dir(out, timestamp, method) / "distsplat_stats.json").read_text())


def latest_checkpoint(out: Path, timestamp: str, method: str = "distsplat") -> Path:
    found = sorted((run_dir(out, timestamp, method) / "nerfstudio_models").glob("step-*.ckpt"))
    assert found, f"no checkpoint in {run_dir(out, timestamp, method)}"
    return found[-1]


def load_gauss_params(ckpt: Path) -> dict:
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=True)["pipeline"]
    prefix = "_model.gauss_params."
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def load_gauss_ids(ckpt: Path):
    """The Gaussians' global ids in parameter order (the model's extra state). `[N]` int64."""
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=True)["pipeline"]
    return state["_model._extra_state"]["strategy_state"]["gauss_ids"]


def read_scalars(out: Path, timestamp: str, tag: str, method: str = "distsplat") -> dict[int, float]:
    """A run's tensorboard scalar ``tag`` (e.g. ``Train Loss Dict/main_loss``) by step, from
    every event file in its folder (rank 0 writes them)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    values: dict[int, float] = {}
    for path in sorted(run_dir(out, timestamp, method).glob("events.out.tfevents.*")):
        events = EventAccumulator(str(path), size_guidance={"scalars": 0})
        events.Reload()
        if tag in events.Tags()["scalars"]:
            values.update({e.step: e.value for e in events.Scalars(tag)})
    return values


def train_runs(
    root_factory,
    runs: dict[str, tuple[int, str]],
    num_images: int,
    extra: Sequence[str],
    saves: dict[str, list[str]],
    no_saves: Sequence[str],
) -> dict[str, Path]:
    """Each named run trained in its own folder: ``runs`` maps a name to ``(world size, parallel
    mode)`` (1: ns-train, more: torchrun); ``saves`` gives a run its save flags (``no_saves``
    otherwise). Returns each run's output folder by name."""
    out = {}
    for name, (world, parallel) in runs.items():
        path = root_factory.mktemp(name)
        args = [*extra, *saves.get(name, no_saves), "--pipeline.parallel", parallel]
        if world == 1:
            run_ns_train(path, name, num_images, extra=args)
        else:
            run_torchrun(path, name, num_images, world, extra=args)
        out[name] = path
    return out
