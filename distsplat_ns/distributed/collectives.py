"""Collectives used by training: gradient sums, statistics reductions, agreement and checks.

Every function here is a no-op (or the identity) at ``world_size == 1``, so the single-process path
runs the same code. Every function that communicates must be called by every rank, in the same
order, with tensors of the same shape and dtype (see each **Collective** paragraph).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.torch_compat import grads_inf_norm
from distsplat_ns.utils.logging import get_logger

LOGGER = get_logger(__name__)

#: Default gradient bucket size. 25 MiB is torch DDP's default bucket cap, a compromise between
#: per-call latency (fewer, larger calls) and peak extra memory (one flat copy per bucket).
DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024


class ReplicaDriftError(RuntimeError):
    """Raised on every rank when the ranks' parameters are no longer bitwise identical."""


class NonFiniteGradientError(RuntimeError):
    """Raised on every rank when the summed gradient holds NaN or Inf."""


def all_reduce_sum_(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks, in place.

    **Collective:** world group; every rank calls it with the same shape and dtype. At
    ``world_size == 1`` it returns the tensor unchanged. Rank 0 holding ``[1, 2]`` and rank 1
    holding ``[3, 4]`` both end with ``[4, 6]``.
    """
    if ctx.is_distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_reduce_max_(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """Element-wise maximum over ranks, in place. **Collective:** as :func:`all_reduce_sum_`."""
    if ctx.is_distributed:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def broadcast_object(ctx: DistContext, obj: Any, src: int = 0) -> Any:
    """Rank ``src``'s picklable ``obj`` on every rank. **Collective:** world group.

    **Host sync:** pickles through host memory; use only at start-up and step boundaries.
    """
    if not ctx.is_distributed:
        return obj
    holder = [obj if ctx.rank == src else None]
    dist.broadcast_object_list(holder, src=src, device=_collective_device(ctx))
    return holder[0]


def all_gather_object(ctx: DistContext, obj: Any) -> list[Any]:
    """Every rank's picklable ``obj``, indexed by rank.

    **Collective:** world group, two all-gathers (the pickled sizes, then the padded bytes); every
    rank must call it in the same order. At ``world_size == 1`` it returns ``[obj]`` and moves
    nothing. Rank 0 passing ``"a"`` and rank 1 ``{"b": 1}`` both get ``["a", {"b": 1}]``.

    **Host sync:** two device-to-host copies on NCCL (every rank's size, then every rank's bytes),
    whatever the world size. ``torch.distributed.all_gather_object`` reads each size and each
    rank's bytes separately, 3 W syncs per call (benchmarks/bench_host_cost.py, docs/host_cost.md).
    """
    if not ctx.is_distributed:
        return [obj]
    device = _collective_device(ctx)
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8).to(device)
    size = torch.tensor([payload.numel()], dtype=torch.int64, device=device)
    sizes = [torch.empty_like(size) for _ in range(ctx.world_size)]
    dist.all_gather(sizes, size)
    host_sizes = torch.cat(sizes).tolist()  # host sync: every rank's size, in one copy
    longest = max(host_sizes)
    padded = torch.zeros(longest, dtype=torch.uint8, device=device)
    padded[: payload.numel()] = payload
    gathered = [torch.empty_like(padded) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, padded)
    host = torch.stack(gathered).cpu()  # host sync: every rank's bytes, in one copy
    return [pickle.loads(host[r, :n].numpy().tobytes()) for r, n in enumerate(host_sizes)]


def broadcast_tensors_(ctx: DistContext, tensors: Sequence[torch.Tensor], src: int = 0) -> None:
    """Overwrite ``tensors`` with rank ``src``'s values, in place.

    **Collective:** world group; every rank passes tensors of the same shapes in the same order.
    No-op at ``world_size == 1``.
    """
    if not ctx.is_distributed:
        return
    for t in tensors:
        if ctx.backend == "nccl" or t.device.type == "cpu":
            dist.broadcast(t, src=src)
        else:
            staged = t.detach().cpu()
            dist.broadcast(staged, src=src)
            t.copy_(staged)


def barrier(ctx: DistContext) -> None:
    """Wait for every rank. **Collective:** world group; no-op at ``world_size == 1``."""
    if ctx.is_distributed:
        if ctx.backend == "nccl":
            dist.barrier(device_ids=[ctx.local_rank])
        else:
            dist.barrier()


def _collective_device(ctx: DistContext) -> torch.device:
    return ctx.device if ctx.backend == "nccl" else torch.device("cpu")


@dataclass
class GradSyncResult:
    """What one gradient synchronisation did.

    Attributes:
        bytes_reduced: Bytes of gradient summed by this rank (payload, not wire traffic).
    """

    bytes_reduced: int


def _buckets(params: Sequence[torch.Tensor], bucket_bytes: int) -> list[list[int]]:
    """Group parameter indices into runs of at most ``bucket_bytes`` with one dtype and device."""
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    key = None
    for i, p in enumerate(params):
        nbytes = p.numel() * p.element_size()
        pkey = (p.dtype, p.device)
        if current and (size + nbytes > bucket_bytes or pkey != key):
            buckets.append(current)
            current, size = [], 0
        current.append(i)
        size += nbytes
        key = pkey
    if current:
        buckets.append(current)
    return buckets


def sum_gradients_(
    ctx: DistContext, params: Sequence[torch.Tensor], bucket_bytes: int = DEFAULT_BUCKET_BYTES
) -> GradSyncResult:
    """Replace each parameter's ``.grad`` by its sum over ranks, in flat buckets.

    The buckets are rebuilt from ``params`` on every call, so parameters that densification added,
    split or pruned since the last step are synchronised exactly like the original ones -- the
    failure mode of wrapping the model in DDP once (docs/distributed.md). A parameter without a
    gradient on this rank (it rendered nothing this step) contributes zeros and receives the sum.

    Args:
        ctx: The process context.
        params: Parameters in the same order and with the same shapes on every rank.
        bucket_bytes: Upper bound of one all-reduce payload in bytes.

    Returns:
        How many bytes were reduced.

    **Collective:** world group; every rank passes the same parameter list (names, shapes, order).
    At ``world_size == 1`` gradients are left as they are. Rank 0 with grad ``g0`` and rank 1 with
    ``g1`` both end with ``g0 + g1``.
    """
    total_bytes = sum(p.numel() * p.element_size() for p in params)
    if not ctx.is_distributed:
        return GradSyncResult(bytes_reduced=0)
    buckets = _buckets(params, bucket_bytes)
    for bucket in buckets:
        grads = [
            params[i].grad.contiguous() if params[i].grad is not None else torch.zeros_like(params[i]) for i in bucket
        ]
        if len(grads) == 1:  # one gradient is summed where it lies, no flat view of it
            dist.all_reduce(grads[0], op=dist.ReduceOp.SUM)
            params[bucket[0]].grad = grads[0]
            continue
        flat = torch.cat([g.view(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        grads_from_bucket([params[i] for i in bucket], flat)
    return GradSyncResult(bytes_reduced=total_bytes)


def grads_from_bucket(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Make each parameter's ``.grad`` its part of the summed bucket ``flat`` (a view, no copy:
    ``flat`` is built afresh each step and owned by nobody else, as DDP's ``gradient_as_bucket_view``)."""
    for p, part in zip(params, flat.split([p.numel() for p in params]), strict=True):  # one split, not a slice each
        p.grad = part.view_as(p)


def gradients_finite(params: Iterable[torch.Tensor]) -> torch.Tensor:
    """A 0-d bool tensor: True when every gradient is finite. No host sync by itself.

    The largest |gradient| over all parameters (``torch_compat.grads_inf_norm``: torch's
    ``get_total_norm`` with the inf-norm, one fused multi-tensor kernel on CUDA) is NaN or Inf exactly when some element is, and, unlike a
    sum, cannot overflow on finite values.
    """
    grads = [
        p.grad for p in params if p.grad is not None and p.grad.numel() > 0
    ]  # the inf-norm of nothing is undefined
    if not grads:
        return torch.tensor(True)
    return torch.isfinite(grads_inf_norm(grads))


def nonfinite_verdict(named_params: Sequence[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """Whether one of this rank's gradients holds NaN or Inf, as a device-side flag: 1 or 0,
    `[1]` int32. Local: the flags of all ranks travel in the step's cost gather
    (``parallel/halo_cost_gathers.py``), where any rank's stops every rank.

    **Host sync:** none.
    """
    return (~gradients_finite(p for _, p in named_params)).to(torch.int32).reshape(1)


def raise_if_nonfinite(bad: bool, named_params: Sequence[tuple[str, torch.Tensor]], step: int) -> None:
    """Raise :class:`NonFiniteGradientError` when ``bad`` (the host value of :func:`nonfinite_verdict`),
    naming the step and this rank's parameters that hold NaN/Inf ("on another rank" when none).
    Local; host syncs only when raising."""
    if not bad:
        return
    names = [n for n, p in named_params if p.grad is not None and not bool(torch.isfinite(p.grad).all())]
    where = f"parameters {', '.join(names)}" if names else "on another rank"
    raise NonFiniteGradientError(
        f"non-finite gradient at step {step} ({where}); stopping before the optimizer step so the last checkpoint stays good"
    )


def tensor_digest(tensors: Iterable[torch.Tensor]) -> str:
    """A hex digest of the exact bytes of ``tensors`` (bitwise, not approximate).

    **Host sync:** copies every tensor to host memory; call it every K steps, not every step.
    """
    h = hashlib.blake2b(digest_size=16)
    for t in tensors:
        data = t.detach().contiguous().cpu()
        h.update(str(tuple(data.shape)).encode())
        h.update(str(data.dtype).encode())
        h.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return h.hexdigest()


def check_replicas(ctx: DistContext, tensors: Sequence[torch.Tensor], step: int) -> str:
    """Fail the run when any rank's ``tensors`` differ from rank 0's by a single bit.

    Returns:
        This rank's digest.

    Raises:
        ReplicaDriftError: on every rank, naming the drifting ranks and the step.

    **Collective:** world group (all-gather of a 32-character digest). At ``world_size == 1`` it
    only computes the digest.
    """
    digest = tensor_digest(tensors)
    digests = all_gather_object(ctx, digest)
    drifted = [r for r, d in enumerate(digests) if d != digests[0]]
    if drifted:
        raise ReplicaDriftError(
            f"replica drift at step {step}: ranks {drifted} hold parameters that differ from rank 0's"
        )
    return digest


# ---------------------------------------------------------------------- variable-length rows
# Rows of per-Gaussian tensors differ in number between ranks (shards, selections); each helper
# below exchanges the sizes first, then the payload in one call.


def _staged(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the device the backend communicates from: the rank's device for NCCL (rows
    read from a checkpoint start on the host), host memory for gloo."""
    return tensor.to(_collective_device(ctx))


def all_gather_counts(ctx: DistContext, count: int) -> list[int]:
    """Every rank's ``count``, indexed by rank. **Collective:** world group (one int each)."""
    if not ctx.is_distributed:
        return [int(count)]
    mine = torch.tensor([int(count)], dtype=torch.int64, device=_collective_device(ctx))
    out = [torch.empty_like(mine) for _ in range(ctx.world_size)]
    dist.all_gather(out, mine)
    return [
        int(n) for n in torch.cat(out).tolist()
    ]  # host sync, one for all ranks: the counts size what follows on the host


def all_gather_rows(ctx: DistContext, tensor: torch.Tensor, counts: Sequence[int] | None = None) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (any number of rows, same trailing shape and dtype), by rank.

    ``counts``: every rank's row count where every rank already knows them (from the step's plan:
    ``parallel/halo_cost_gathers.py``); then nothing is read on the host, and nothing moves when all are 0.

    **Collective:** world group: the row counts (unless given), then one all-gather padded to the
    longest. **Host sync:** the row counts, unless given.
    """
    if counts is not None and (len(counts) != ctx.world_size or tensor.shape[0] != counts[ctx.rank]):
        raise ValueError(
            f"all_gather_rows: rank {ctx.rank} holds {tensor.shape[0]} rows, the counts given say {list(counts)}"
        )
    if not ctx.is_distributed:
        return [tensor]
    if counts is None:
        counts = all_gather_counts(ctx, tensor.shape[0])
    if max(counts) == 0:
        return [tensor[:0] for _ in counts]
    longest = max(counts)
    if tensor.shape[0] == longest:
        padded = tensor
    else:
        padded = tensor.new_zeros((longest, *tensor.shape[1:]))
        padded[: tensor.shape[0]] = tensor
    parts = (
        all_gather_stacked(ctx, padded).to(tensor.device).unbind(0)
    )  # it stages (``_staged``); back to the caller's device
    return [part if c == longest else part[:c] for part, c in zip(parts, counts, strict=True)]


def all_gather_stacked(ctx: DistContext, tensor: torch.Tensor) -> torch.Tensor:
    """Every rank's ``tensor``, of one shape on every rank, stacked by rank: `[W, *shape]`, one
    buffer (the host reads it at once). Nothing moves when the shape is empty.

    **Collective:** world group, one all-gather (none at one rank, nor for an empty shape).
    """
    if not ctx.is_distributed:
        return tensor[None]
    staged = _staged(ctx, tensor.contiguous())
    # One receive buffer, every rank's rows a view of it: NCCL gathers into it directly (its
    # list form gathers into a flat buffer and copies each part out); gloo writes each view.
    received = staged.new_empty((ctx.world_size, *staged.shape))
    if staged.numel() == 0:
        return received
    if ctx.backend == "nccl":
        dist.all_gather_into_tensor(received, staged)
    else:
        dist.all_gather(list(received.unbind(0)), staged)
    return received


def all_to_all_counts(ctx: DistContext, counts: Sequence[int]) -> list[int]:
    """``received[s]`` = what rank ``s`` put at this rank's index in its ``counts``.

    **Collective:** world group (``world_size`` ints each way).
    """
    if not ctx.is_distributed:
        return [int(c) for c in counts]
    send = torch.tensor([int(c) for c in counts], dtype=torch.int64, device=_collective_device(ctx))
    recv = torch.empty_like(send)
    dist.all_to_all_single(recv, send)
    return [int(c) for c in recv.tolist()]


def all_to_all_rows(
    ctx: DistContext, send: torch.Tensor, send_counts: Sequence[int], recv_counts: Sequence[int] | None = None
) -> tuple[torch.Tensor, list[int]]:
    """Rows ``send[offset_d : offset_d + send_counts[d]]`` go to rank ``d``; returns the rows
    received, in source-rank order, and how many came from each rank.

    Args:
        ctx: The process context.
        send: Rows for every rank, grouped by destination rank in rank order. `[sum(send_counts), ...]`.
        send_counts: Rows for each destination rank. Length ``world_size``.
        recv_counts: Rows coming from each rank when already known (the reverse of an earlier
            exchange); exchanged first when None.

    **Collective:** world group: the counts (unless given), then one ``all_to_all_single``.
    At ``world_size == 1`` it returns ``send`` unchanged. Not differentiable (callers route the
    gradients back with a second call in the reverse direction).
    """
    if len(send_counts) != ctx.world_size or sum(send_counts) != send.shape[0]:
        raise ValueError(
            f"all_to_all_rows: counts {list(send_counts)} do not split {send.shape[0]} rows over {ctx.world_size} ranks"
        )
    if not ctx.is_distributed:
        return send, [int(send.shape[0])]
    if recv_counts is None:
        recv_counts = all_to_all_counts(ctx, send_counts)
    staged = _staged(
        ctx, (send.detach() if send.requires_grad else send).contiguous()
    )  # callers pass no graph: no detach to dispatch
    recv = staged.new_empty((sum(recv_counts), *staged.shape[1:]))
    dist.all_to_all_single(recv, staged, [int(c) for c in recv_counts], [int(c) for c in send_counts])
    return recv.to(send.device), [int(c) for c in recv_counts]


def gather_rows(ctx: DistContext, tensor: torch.Tensor, dst: int = 0) -> list[torch.Tensor] | None:
    """Every rank's ``tensor`` on rank ``dst`` (by rank; None elsewhere), for state gathered in
    chunks: call it once per tensor so that only one tensor's rows are in flight.

    **Collective:** world group: the row counts (all ranks), then one ``gather`` padded to the
    longest. **Host sync:** the row counts.
    """
    if not ctx.is_distributed:
        return [tensor]
    counts = all_gather_counts(ctx, tensor.shape[0])
    staged = _staged(ctx, tensor.detach().contiguous())
    padded = staged.new_zeros((max(counts), *staged.shape[1:]))
    padded[: staged.shape[0]] = staged
    out = [torch.empty_like(padded) for _ in range(ctx.world_size)] if ctx.rank == dst else None
    dist.gather(padded, out, dst=dst)
    if out is None:
        return None
    return [o[:c].to(tensor.device) for o, c in zip(out, counts, strict=False)]
