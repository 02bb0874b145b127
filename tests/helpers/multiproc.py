"""Run a function on W gloo ranks in spawned processes and collect what each returns."""

from __future__ import annotations

import datetime
import os
import pickle
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Imported once by the fork server, so each rank starts with them loaded instead of spending
# ~10 s of a 2-core machine importing them again (docs/startup.md, "Test ranks").
PRELOAD = [
    "torch",
    "torchvision",
    "nerfstudio.models.splatfacto",
    "distsplat_ns.pipeline",
    "distsplat_ns.distributed.context",
]


def _context() -> Any:
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _worker(
    rank: int,
    world_size: int,
    port: int,
    fn: Callable,
    args: tuple,
    queue: Any,
    timeout_s: float,
    device_type: str,
    backend: str,
    environ: dict[str, str],
) -> None:
    os.environ.clear()  # the caller's environment at run_ranks, not the fork server's at its start
    os.environ.update(environ)
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
        }
    )
    torch.set_num_threads(1)
    try:
        from distsplat_ns.distributed.context import init_distributed, shutdown_distributed

        ctx = init_distributed(device_type, timeout_s=timeout_s, backend=backend)
        result = fn(ctx, *args)
        # Plain pickle bytes: tensors sent through a torch queue travel as shared-memory handles
        # that vanish when this process exits before the parent reads them.
        queue.put((rank, "ok", pickle.dumps(result)))
        shutdown_distributed()
    except BaseException as err:  # noqa: BLE001 -- report to the parent, which fails the test
        queue.put((rank, "error", f"{type(err).__name__}: {err}\n{traceback.format_exc()}"))


def run_ranks(
    fn: Callable,
    world_size: int,
    *args: Any,
    timeout_s: float = 120.0,
    device_type: str = "cpu",
    backend: str = "auto",
    deadline_s: float | None = None,
) -> list[Any]:
    """``[fn(ctx_rank0, *args), ..., fn(ctx_rankW-1, *args)]`` computed on W gloo processes.

    ``timeout_s`` is the ranks' collective timeout; the ranks must finish within ``deadline_s``
    (default twice that).

    ``fn`` must be a module-level function (it is pickled into spawned processes).

    Raises:
        RuntimeError: any rank raised; the message holds that rank's traceback.
    """
    ctx = _context()
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(
            target=_worker,
            args=(r, world_size, port, fn, args, queue, timeout_s, device_type, backend, dict(os.environ)),
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors = []
    deadline_s = timeout_s * 2 if deadline_s is None else deadline_s
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=deadline_s)
    try:
        while len(results) + len(errors) < world_size:
            remaining = (deadline - datetime.datetime.now()).total_seconds()
            if remaining <= 0:
                raise RuntimeError(f"ranks did not finish within {deadline_s:.0f}s")
            rank, status, value = queue.get(timeout=remaining)
            if status == "ok":
                results[rank] = pickle.loads(value)
            else:
                errors.append(f"rank {rank}: {value}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors:
        raise RuntimeError("\n".join(errors))
    return [results[r] for r in range(world_size)]
