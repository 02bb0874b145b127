"""The process-group context: who this process is and how to reach the others.

This package (``distributed/``) is the only code that imports ``torch.distributed``; everything else
receives a :class:`DistContext` and calls the collectives through it.

Three ways a process can start, all ending in the same context:
  * a single process (``ns-train distsplat``): ``world_size == 1``, no process group;
  * nerfstudio's launcher (``ns-train --machine.num-devices N``): the group already exists;
  * torchrun (``torchrun --nproc_per_node N $(which ns-train) distsplat``, also multi-node through
    its c10d rendezvous): ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` are set and we create the group.
"""

from __future__ import annotations

import ctypes
import datetime
import os
import signal
import sys
from dataclasses import dataclass, field
from typing import Literal, get_args

import torch
import torch.distributed as dist

from distsplat_ns.distributed.interfaces import choose_socket_interface, socket_variables
from distsplat_ns.distributed.restart import restart_count
from distsplat_ns.distributed.torch_compat import DIST_ERRORS, destroy_process_groups
from distsplat_ns.utils.errors import RunFailure, UserError
from distsplat_ns.utils.logging import get_logger, set_log_rank
from distsplat_ns.utils.shm import remove_orphan_semaphores
from distsplat_ns.utils.validation import one_of

LOGGER = get_logger(__name__)

DistBackend = Literal["auto", "nccl", "gloo"]
"""``--dist-backend``: the torch.distributed backend under torchrun ("auto": :func:`auto_backend`)."""
DIST_BACKENDS: tuple[DistBackend, ...] = get_args(DistBackend)


@dataclass(frozen=True)
class DistContext:
    """One validated description of this process in the job.

    Attributes:
        rank: Global process index in ``[0, world_size)``.
        local_rank: Index of this process's device on its host.
        world_size: Number of processes in the job.
        device: The device this process computes on (``cuda:<local_rank>`` or ``cpu``).
        backend: ``"nccl"``, ``"gloo"`` or ``None`` when ``world_size == 1``.
        timeout_s: Collective timeout in seconds: a rank that stops answering ends the run.
        rank0_work_timeout_s: How long the other ranks wait for rank 0's own work (evaluation,
            checkpoint writing) while its heartbeat says it is alive (``lifecycle.rank0_work``).
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    backend: str | None = None
    timeout_s: float = 600.0
    rank0_work_timeout_s: float = 3600.0

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank must be in [0, {self.world_size}), got {self.rank}")

    @property
    def is_main(self) -> bool:
        """True on global rank 0, the rank that owns viewer, writers and checkpoints."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    try:
        return int(value)
    except ValueError as err:
        raise UserError(f"environment variable {name} must be an integer, got {value!r}") from err


def init_distributed(
    device_type: str,
    timeout_s: float = 600.0,
    local_rank_hint: int = 0,
    backend: str = "auto",
    rank0_work_timeout_s: float = 3600.0,
) -> DistContext:
    """Create (or adopt) the process group and bind this process to its device.

    Args:
        device_type: ``"cuda"`` or ``"cpu"`` (nerfstudio's ``--machine.device-type``).
        timeout_s: Collective timeout in seconds. A dead or stuck rank makes every other rank fail
            with an error after at most this long, instead of hanging.
        local_rank_hint: The local rank nerfstudio's launcher passed, used when the group already
            exists and ``LOCAL_RANK`` is not set.
        backend: "auto" (see :func:`auto_backend`: NCCL on CUDA unless ranks share a GPU, gloo
            otherwise), "nccl" or "gloo". gloo on CUDA lets several ranks share one GPU (NCCL
            refuses two ranks on one device).

    Returns:
        The context for this process.

    Raises:
        UserError: ``device_type`` is not ``cuda``/``cpu``, CUDA is asked for but absent, or the
            launcher's environment is inconsistent.

    **Collective:** creating the group is itself a rendezvous of all ranks.
    """
    _check_launch_settings(device_type, timeout_s, backend)
    rank, world_size, local_rank, backend = _join_group(device_type, timeout_s, local_rank_hint, backend)
    device = _bind_device(device_type, local_rank, world_size)
    set_log_rank(rank)
    if local_rank == 0:
        removed = remove_orphan_semaphores()  # what ranks SIGKILLed earlier on this host left
        if removed:
            LOGGER.info("removed %d semaphore(s) of processes that are gone from /dev/shm", removed)
    if world_size > 1:
        exit_with_launcher()
    ctx = DistContext(
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        device=device,
        backend=backend,
        timeout_s=timeout_s,
        rank0_work_timeout_s=rank0_work_timeout_s,
    )
    if ctx.is_distributed:
        LOGGER.info(
            "joined process group: rank %d/%d, local rank %d, backend %s, device %s",
            rank,
            world_size,
            local_rank,
            backend,
            device,
        )
    return ctx


def _check_launch_settings(device_type: str, timeout_s: float, backend: str) -> None:
    """Refuse settings no launch can honour, before any rendezvous (one line naming the flag)."""
    if device_type not in ("cuda", "cpu"):
        raise UserError(f"--machine.device-type must be 'cuda' or 'cpu' for distsplat, got {device_type!r}")
    if device_type == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "--machine.device-type cuda was given but no CUDA device is available; use --machine.device-type cpu"
        )
    if timeout_s <= 0:
        raise UserError(f"collective timeout must be > 0 seconds, got {timeout_s}")
    if backend not in DIST_BACKENDS:
        raise UserError(f"--dist-backend must be {one_of(DIST_BACKENDS)}, got {backend!r}")
    if backend == "nccl" and device_type != "cuda":
        raise UserError("--dist-backend nccl needs --machine.device-type cuda")


def _join_group(
    device_type: str, timeout_s: float, local_rank_hint: int, backend: str
) -> tuple[int, int, int, str | None]:
    """Adopt the existing process group, create it from torchrun's environment, or run alone;
    returns ``(rank, world_size, local_rank, backend)`` (backend None alone).

    **Collective:** creating the group is a rendezvous of all ranks.
    """
    env_world = _env_int("WORLD_SIZE")
    env_rank = _env_int("RANK")
    env_local = _env_int("LOCAL_RANK")
    if dist.is_available() and dist.is_initialized():
        local_rank = env_local if env_local is not None else local_rank_hint
        return dist.get_rank(), dist.get_world_size(), local_rank, dist.get_backend()
    if env_world is None or env_world <= 1:
        return 0, 1, local_rank_hint, None
    if env_rank is None:
        raise UserError("WORLD_SIZE > 1 is set but RANK is not: launch with torchrun")
    rank, world_size = env_rank, env_world
    local_rank = env_local if env_local is not None else 0
    if backend == "auto":
        backend = auto_backend(device_type, _env_int("LOCAL_WORLD_SIZE"))
    if device_type == "cuda":
        torch.cuda.set_device(_device_index(local_rank))
    choose_socket_interface(backend)
    timeout = datetime.timedelta(seconds=timeout_s)
    try:
        store = attempt_store(world_size, timeout)
        dist.init_process_group(
            backend=backend,
            init_method=None if store is not None else "env://",
            store=store,
            world_size=world_size,
            rank=rank,
            timeout=timeout,
        )
    except DIST_ERRORS as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        ifnames = ", ".join(f"{v}={os.environ.get(v) or 'unset'}" for v in socket_variables(backend))
        raise RunFailure(
            f"rank {rank}: could not join the process group through "
            f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')} ({first}); "
            f"every host must reach that address, and its sockets use the interface {ifnames}"
        ) from err
    return rank, world_size, local_rank, backend


def _bind_device(device_type: str, local_rank: int, world_size: int) -> torch.device:
    """This rank's device: its GPU (made current), or the CPU with the host's cores shared out."""
    if device_type == "cuda":
        index = _device_index(local_rank)
        torch.cuda.set_device(index)
        return torch.device("cuda", index)
    local_world = _env_int("LOCAL_WORLD_SIZE") or (max(1, world_size))
    if local_world > 1:
        # CPU ranks on one host share its cores; torch's default of one thread per core in every
        # rank oversubscribes them (measured 10x slower renders on 2 busy cores, docs/rendering.md).
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // local_world))
    return torch.device("cpu")


def attempt_store(world_size: int, timeout: datetime.timedelta) -> dist.Store | None:
    """Under torchrun, the agent's store with a prefix of this attempt's own: None elsewhere
    (``env://`` then creates the store).

    torchrun's workers are clients of the agent's store (``TORCHELASTIC_USE_AGENT_STORE``), and a
    restart (``--max-restarts``) reuses that store and its keys: ``env://`` adds no prefix per
    attempt, so the restarted ranks read the addresses gloo's full mesh published in the failed
    attempt (measured: "Gloo connectFullMesh failed ... Connection refused", or both ranks waiting
    in ``_create_gloo_process_group``; docs/distributed.md, "Faults across hosts"), and the lifecycle's barrier keys are already set.
    """
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    host, port = os.environ.get("MASTER_ADDR"), _env_int("MASTER_PORT")
    if not host or port is None:
        raise UserError("TORCHELASTIC_USE_AGENT_STORE is set but MASTER_ADDR/MASTER_PORT are not: launch with torchrun")
    client = dist.TCPStore(host, port, world_size, False, timeout=timeout)
    return dist.PrefixStore(f"distsplat/attempt-{restart_count()}", client)


def auto_backend(device_type: str, local_world_size: int | None) -> str:
    """The backend ``--dist-backend auto`` picks: NCCL on CUDA, unless this host runs more ranks
    than it has GPUs (NCCL refuses two ranks on one device; gloo's CUDA collectives do not), and
    gloo on CPU.

    Args:
        device_type: ``"cuda"`` or ``"cpu"``.
        local_world_size: Ranks on this host (torchrun's ``LOCAL_WORLD_SIZE``), None if unknown.
    """
    if device_type != "cuda":
        return "gloo"
    count = torch.cuda.device_count()
    if local_world_size is not None and local_world_size > count:
        LOGGER.warning(
            "%d ranks on this host share %d GPU(s): using gloo (NCCL needs one GPU per rank)", local_world_size, count
        )
        return "gloo"
    return "nccl"


def _device_index(local_rank: int) -> int:
    """The GPU of a local rank: ``local_rank`` itself, or shared round-robin when there are more
    ranks on the host than GPUs (then only gloo works: NCCL refuses two ranks on one device)."""
    count = torch.cuda.device_count()
    if local_rank >= count:
        LOGGER.warning(
            "local rank %d shares GPU %d with another rank (%d GPUs on this host)",
            local_rank,
            local_rank % count,
            count,
        )
    return local_rank % count


#: prctl option asking the kernel to signal this process when its parent dies (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def exit_with_launcher(sig: int = signal.SIGTERM) -> bool:
    """Have the kernel send ``sig`` to this rank when its launcher (torchrun, mp.spawn) dies.

    Without it, a rank whose launcher was killed (SIGKILL, out of memory) trains on in the
    background to the end. SIGTERM takes the ordinary stop path: with the trainer's handlers
    installed every rank stops after the same step and keeps a checkpoint (``trainer/distsplat_trainer.py``); before
    that, SIGTERM's default ends the process. Linux only (``prctl(PR_SET_PDEATHSIG)``); elsewhere
    nothing is set.

    Returns:
        True when the signal is armed.
    """
    if not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            LOGGER.warning(
                "prctl(PR_SET_PDEATHSIG) failed (errno %d): this rank will not follow its launcher's death",
                ctypes.get_errno(),
            )
            return False
    except (OSError, AttributeError):
        return False
    if parent == 1 or os.getppid() != parent:  # the launcher died before the signal was armed
        os.kill(os.getpid(), sig)
    return True


def shutdown_distributed() -> None:
    """Destroy the process group if this process created or joined one (the lifecycle's abort
    watch then stops by itself)."""
    if dist.is_available() and dist.is_initialized():
        destroy_process_groups()
