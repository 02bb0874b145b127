"""The step's gradient sum over ranks, started in buckets during the backward (docs/overlap.md, "What overlaps, and why only that").

DDP's pattern, adapted to the band backward (``model/band_backward.py``): flat buckets summed by
asynchronous all-reduces, each started once every gradient in it is final, and waited for before
the finite check and the optimizer. A step runs several autograd calls, so the hooks are armed only
inside :meth:`GradientSum.during_last_backward` (the last one); what it does not reach is taken by
:meth:`GradientSum.finish`. Buckets and their order come from the parameter order alone, never
from the order hooks fire, so every rank issues the same all-reduces in the same order and the sum
is :func:`collectives.sum_gradients_`'s, bitwise.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist

from distsplat_ns.distributed.collectives import DEFAULT_BUCKET_BYTES, grads_from_bucket
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.distributed.torch_compat import post_accumulate_grad_hook

#: A bucket closes once it holds this many bytes (torch DDP's first bucket, 1 MiB), so that the
#: Gaussians' fields -- each final at another point of the backward -- start separately; it never
#: exceeds ``bucket_bytes`` unless one parameter does.
CLOSE_BUCKET_BYTES = 1024 * 1024


class GradientSum:
    """A step's gradient reduction that happens entirely in :meth:`finish` (the base, and what a
    mode without overlap uses).

    Args:
        reduce: Makes every gradient the whole batch's and returns the bytes reduced
            (**Collective**, as the mode's ``reduce_gradients``).
    """

    def __init__(self, reduce: Callable[[], int]) -> None:
        self._reduce = reduce
        #: Seconds :meth:`finish` waited: the reduction the backward did not hide.
        self.exposed_s = 0.0

    @contextmanager
    def during_last_backward(self) -> Iterator[None]:
        """Entered around the step's last autograd call; nothing starts here."""
        yield

    def finish(self) -> int:
        """Reduce; returns the bytes reduced. **Collective:** as ``reduce``."""
        start = time.perf_counter()
        moved = self._reduce()
        self.exposed_s = time.perf_counter() - start
        return moved


def bucket_layout(
    params: Sequence[torch.Tensor], bucket_bytes: int, close_bytes: int = CLOSE_BUCKET_BYTES
) -> list[list[int]]:
    """Parameter indices per bucket, in reversed parameter order: a bucket holds one dtype and
    device, at most ``bucket_bytes`` (unless one parameter is larger) and closes at ``close_bytes``.
    A function of the parameters' order, shapes and dtypes only: the same on every rank."""
    buckets: list[list[int]] = []
    size, key = 0, None
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes = p.numel() * p.element_size()
        if (
            buckets
            and buckets[-1]
            and (size >= close_bytes or size + nbytes > bucket_bytes or (p.dtype, p.device) != key)
        ):
            buckets.append([])
            size = 0
        if not buckets:
            buckets.append([])
        buckets[-1].append(i)
        size += nbytes
        key = (p.dtype, p.device)
    return buckets


class BucketedGradientSum(GradientSum):
    """Every gradient summed over ranks in buckets started during the last backward (module docstring).

    Args:
        ctx: The process context.
        params: The parameters, in the same order and with the same shapes on every rank.
        bucket_bytes: Upper bound of one all-reduce payload in bytes.
        overlap: Start buckets from the backward's hooks; when False (or torch has no
            post-accumulate hooks) every bucket starts in :meth:`finish`.

    **Collective:** world group, one all-reduce per bucket, issued in bucket order on every rank,
    all of them by the end of :meth:`finish` (none at one rank). Rank 0 with grad ``g0`` and rank 1
    with ``g1`` both end with ``g0 + g1``; a parameter without a gradient counts as zeros.
    """

    def __init__(
        self,
        ctx: DistContext,
        params: Sequence[torch.Tensor],
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        overlap: bool = True,
    ) -> None:
        super().__init__(lambda: 0)
        self._ctx = ctx
        self._params = list(params)
        self._buckets = bucket_layout(self._params, bucket_bytes) if ctx.is_distributed else []
        self._bucket_of = {i: k for k, bucket in enumerate(self._buckets) for i in bucket}
        self._missing = [len(bucket) for bucket in self._buckets]
        self._final_ones: set[int] = set()
        self._started: list[tuple[torch.Tensor, dist.Work]] = []
        self._overlap = overlap
        self.bytes_reduced = sum(p.numel() * p.element_size() for p in self._params) if ctx.is_distributed else 0

    @contextmanager
    def during_last_backward(self) -> Iterator[None]:
        """Arm one hook per parameter for the step's last autograd call (module docstring)."""
        handles = []
        if self._overlap and self._buckets:
            handles = [post_accumulate_grad_hook(p, lambda _, i=i: self._final(i)) for i, p in enumerate(self._params)]
        try:
            yield
        finally:
            for handle in handles:
                if handle is not None:
                    handle.remove()

    @property
    def num_started(self) -> int:
        """Buckets whose all-reduce has started."""
        return len(self._started)

    def _final(self, index: int) -> None:
        """Parameter ``index``'s gradient is final: start every complete bucket, in order."""
        if index in self._final_ones:
            raise RuntimeError(
                f"parameter {index}'s gradient was accumulated twice in the last backward: its bucket's sum may miss a part"
            )
        self._final_ones.add(index)
        k = self._bucket_of[index]
        self._missing[k] -= 1
        while len(self._started) < len(self._buckets) and self._missing[len(self._started)] == 0:
            self._start(len(self._started))

    def _start(self, k: int) -> None:
        """Flatten bucket ``k``'s gradients (zeros for none) and start its all-reduce."""
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in (self._params[i] for i in self._buckets[k])
        ]
        flat = torch.cat(grads) if len(grads) > 1 else grads[0].clone()
        self._started.append((flat, dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)))

    def finish(self) -> int:
        """Start the buckets not started yet (in order), wait for every bucket and make each
        gradient its view of the summed bucket; returns the bytes reduced. Call it right after the backward, before any
        other collective. The time it takes is :attr:`exposed_s`.

        **Host sync:** waits for the all-reduces (gloo: on the host; NCCL: the stream waits).
        """
        start = time.perf_counter()
        while len(self._started) < len(self._buckets):
            self._start(len(self._started))
        for bucket, (flat, work) in zip(self._buckets, self._started, strict=True):
            work.wait()
            grads_from_bucket([self._params[i] for i in bucket], flat)
        self.exposed_s = time.perf_counter() - start
        return self.bytes_reduced
