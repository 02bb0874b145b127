"""Every difference between the torch (and numpy) versions the package supports, in one place.

torch 2.1.2 through the newest release, numpy 1.26 and 2.x; the rest of the package calls these
names and never tests a version itself. Each shim says which release made it unnecessary. The list
of shims and the versions that need them: docs/distributed.md, "Torch and numpy versions".
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

#: The error types torch.distributed raises for failed collectives and store operations. torch 2.2
#: added ``DistError`` (the base of ``DistBackendError``, ``DistStoreError``, ``DistNetworkError``);
#: torch 2.1 raises ``DistBackendError`` (NCCL) or a plain ``RuntimeError`` (gloo, stores).
_DIST_ERROR = getattr(dist, "DistError", None) or dist.DistBackendError  # unnecessary from torch 2.2
DIST_ERRORS: tuple[type[BaseException], ...] = (RuntimeError, _DIST_ERROR)


def is_dist_error(err: BaseException) -> bool:
    """Whether ``err`` is of torch.distributed's own error type (gloo also raises plain RuntimeErrors)."""
    return isinstance(err, _DIST_ERROR)


#: Suffix of the counter beside each key :func:`store_set` writes before torch 2.3: how many times
#: the key was set. A probe reads it with ``add(counter, 0)``, never touching the key itself.
_WRITTEN = "#written"
#: Suffix of the counter :func:`store_set_first` draws from: the call that draws 1 writes.
_WRITERS = "#writers"


def store_set(store: dist.Store, key: str, value: str) -> None:
    """``store.set(key, value)`` for a key that :func:`store_has_key` may probe: every key the
    package probes is written through this function.

    **Host sync:** none (store requests; callers bound them with ``store_access.bounded``).
    """
    store.set(key, value)
    if not hasattr(dist.Store, "check"):  # unnecessary from torch 2.3
        store.add(key + _WRITTEN, 1)


def store_has_key(store: dist.Store, key: str) -> bool:
    """Whether ``key`` is set in ``store`` (by :func:`store_set`), without waiting for it and
    without creating it: one round trip.

    Before torch 2.3 ``Store.check`` is not bound in Python, and ``compare_set``, the other
    non-blocking read, builds its result without the GIL in torch 2.1.2 (heap corruption: ranks
    crashed in ``_Py_Dealloc``; docs/distributed.md, "Store reads from threads"). So the key's
    counter is read with ``add``, whose binding converts its result with the GIL held.

    **Host sync:** none (a store request; callers bound it with ``store_access.bounded``).
    """
    if hasattr(dist.Store, "check"):  # unnecessary from torch 2.3
        return bool(store.check([key]))
    return _has_key_by_counter(store, key)


def _has_key_by_counter(store: dist.Store, key: str) -> bool:
    """:func:`store_has_key` before torch 2.3 (tested on every version)."""
    return store.add(key + _WRITTEN, 0) > 0


def store_set_first(store: dist.Store, key: str, value: str) -> bool:
    """Set ``key`` to ``value`` unless another call of this function set it first; True for the
    call that set it. A counter decides (``add`` is atomic in every store), on every version:
    ``compare_set`` is not safe from a thread in torch 2.1.2 (:func:`store_has_key`).

    **Host sync:** none (store requests).
    """
    if store.add(key + _WRITERS, 1) != 1:
        return False
    store_set(store, key, value)
    return True


def dcp_save(state: dict, storage_writer: Any, planner: Any, no_dist: bool) -> None:
    """``torch.distributed.checkpoint.save`` (torch 2.2's name; 2.1's ``save_state_dict``).

    **Collective:** as DCP's save: the default group, every rank, unless ``no_dist``.
    """
    if hasattr(dcp, "save"):  # unnecessary from torch 2.2
        dcp.save(state, storage_writer=storage_writer, planner=planner, no_dist=no_dist)
    else:
        dcp.save_state_dict(state, storage_writer=storage_writer, planner=planner, no_dist=no_dist)


def dcp_load(state: dict, storage_reader: Any, planner: Any, no_dist: bool) -> None:
    """``torch.distributed.checkpoint.load`` (torch 2.2's name; 2.1's ``load_state_dict``), in place.

    **Collective:** as DCP's load: the default group, every rank, unless ``no_dist``.
    """
    if hasattr(dcp, "load"):  # unnecessary from torch 2.2
        dcp.load(state, storage_reader=storage_reader, planner=planner, no_dist=no_dist)
    else:
        dcp.load_state_dict(state, storage_reader=storage_reader, planner=planner, no_dist=no_dist)


#: Planner keywords the package sets that older planners lack, with the value that is their older
#: behaviour: 2.1's save planner deduplicates replicated items (the package writes none, so the
#: switch changes nothing), and 2.1's load planner is given only keys the checkpoint holds (the
#: package's planners plan every item themselves and skip absent keys, tests/multiproc/test_dcp_commit.py).
_PLANNER_KEYWORDS_SINCE = {"dedup_save_to_lowest_rank": "2.4", "allow_partial_load": "2.4"}


def planner_kwargs(planner_cls: type, **kwargs: Any) -> dict[str, Any]:
    """``kwargs`` less the keywords of :data:`_PLANNER_KEYWORDS_SINCE` that ``planner_cls.__init__``
    does not take (unnecessary from torch 2.4). Any other unknown keyword is kept, so a typo fails."""
    params = inspect.signature(planner_cls.__init__).parameters
    return {k: v for k, v in kwargs.items() if k in params or k not in _PLANNER_KEYWORDS_SINCE}


def grads_inf_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """The largest |element| over ``grads`` (NaN when any element is NaN), as a 0-d tensor.

    **Host sync:** none.
    """
    total_norm = getattr(torch.nn.utils, "get_total_norm", None)
    if total_norm is not None:  # unnecessary from torch 2.6
        return total_norm(grads, norm_type=float("inf"))
    return _inf_norm_per_tensor(grads)


def _inf_norm_per_tensor(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """:func:`grads_inf_norm` before torch 2.6 (tested on every version): one norm per tensor, then
    their max, in float64 so that no finite float64 norm overflows."""
    norms = [torch.linalg.vector_norm(g, float("inf")).to(torch.float64) for g in grads]
    return torch.stack([n.to(norms[0].device) for n in norms]).max()


#: Device types where ``torch.nonzero_static`` was found missing (its first call there raised).
_NO_NONZERO_STATIC: set[str] = set()


def nonzero_of_size(mask: torch.Tensor, size: int) -> torch.Tensor:
    """``torch.nonzero(mask)`` where its row count ``size`` is already known on the host:
    `[size, mask.dim()]` int64, in ``nonzero``'s row-major order.

    **Host sync:** none where torch has ``nonzero_static`` for the device (CPU from torch 2.1, CUDA
    from 2.6); else ``nonzero``'s (the result's size).
    """
    kind = mask.device.type
    if kind not in _NO_NONZERO_STATIC:
        try:
            return torch.nonzero_static(mask, size=size)
        except (AttributeError, NotImplementedError):  # unnecessary from torch 2.6
            _NO_NONZERO_STATIC.add(kind)
    found = torch.nonzero(mask)
    if found.shape[0] != size:
        raise ValueError(f"nonzero_of_size: the mask holds {found.shape[0]} nonzero elements, not {size}")
    return found


def post_accumulate_grad_hook(param: torch.Tensor, hook: Any) -> Any:
    """Register ``hook(param)`` to run after each accumulation into ``param.grad`` (a leaf); returns
    the handle (``.remove()``), or None where torch has no such hook (the caller then does the
    work after the backward: ``gradient_sum.py``).

    **Host sync:** none.
    """
    register = getattr(param, "register_post_accumulate_grad_hook", None)
    if register is None:  # torch 2.1.0 added it; kept for builds without it
        return None
    return register(hook)


def add_safe_globals(objects: Iterable[Any]) -> bool:
    """Allow ``objects`` in ``torch.load(..., weights_only=True)``; False where torch cannot
    (before torch 2.4, whose weights-only unpickler has its own fixed allow-list)."""
    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is None:  # unnecessary from torch 2.4
        return False
    add(list(objects))
    return True


def save_layout_only() -> Any:
    """A context in which ``torch.save`` writes a file's layout without its storages' bytes
    (``torch.serialization.skip_data``), or None where torch has none (before torch 2.5)."""
    skip = getattr(torch.serialization, "skip_data", None)  # unnecessary from torch 2.5
    return skip() if skip is not None else None


def numpy_scalar_reconstructor() -> Any:
    """numpy's scalar unpickling function (``numpy.core`` before numpy 2, ``numpy._core`` after)."""
    try:
        from numpy._core.multiarray import scalar  # numpy >= 2
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import scalar  # type: ignore[no-redef]
    return scalar


#: Seconds :func:`destroy_process_groups` lets go of the GIL first: gloo's worker threads need it for
#: microseconds each; 0.01 s sufficed in 100 of 100 cycles on 2 cores with 3 busy processes beside
#: (docs/distributed.md, "Shutdown: gloo and the GIL").
_GLOO_RELEASE_S = 0.1


def destroy_process_groups() -> None:
    """``dist.destroy_process_group()`` (every group) after gloo's worker threads have let go of
    the work they last ran.

    A gloo worker thread drops a finished collective while holding its process group's work lock;
    when a tensor of that collective has lost its last Python reference (a temporary inside
    ``all_gather_object``), the drop takes the GIL. Before pytorch PR 154976 the process group's
    destructor runs holding the GIL and waits for that lock: both wait for ever. On torch 2.1.2 an
    init, collectives, destroy loop hung within 7 cycles in 5 of 5 tries, and one ``ns-train`` of 4
    hung at exit. Sleeping first releases the GIL so those drops finish. Applied on every version:
    the first release with the fix was not verified here, and it costs 0.1 s once per process.

    **Collective:** none (each rank tears down its own groups).
    """
    time.sleep(_GLOO_RELEASE_S)
    dist.destroy_process_group()
