"""The counters of ``python -m benchmarks.bench_host_cost``, installed in each training process it starts.

See bench_host_cost.py's docstring for what is counted and why; this module holds the dispatch
mode, the host-read and collective patches, the renderer's exclusion and the worker entry point.
"""

from __future__ import annotations

import atexit
import collections
import json
import os
import pickle
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import REPO, load_script

SYNC_OPS = frozenset(
    {
        "_local_scalar_dense",
        "nonzero",
        "masked_select",
        "_unique",
        "_unique2",
        "unique_dim",
        "unique_consecutive",
        "equal",
        "bincount",
        "is_nonzero",
    }
)
"""Operators that are a device-to-host synchronisation on CUDA whatever their arguments."""

VIEW_OPS = frozenset(
    {
        "view",
        "_unsafe_view",
        "slice",
        "select",
        "expand",
        "detach",
        "alias",
        "unsqueeze",
        "squeeze",
        "permute",
        "transpose",
        "t",
        "as_strided",
        "unbind",
        "split",
        "split_with_sizes",
        "chunk",
        "narrow",
        "diagonal",
        "unfold",
        "lift_fresh",
        "view_as_real",
        "view_as_complex",
        "_reshape_alias",
    }
)
"""Operators that only make a view (shape and strides, no data): no kernel on a GPU."""


class _Counter:
    """Per-step counts of one process, filled by the dispatch mode and the patches."""

    def __init__(self) -> None:
        self.excluded_depth = 0
        self.in_step = False
        self.steps: list[dict[str, Any]] = []
        self.current: dict[str, Any] = {}
        self.host_side_reasons: dict[str, str] = {}

    def open_step(self) -> None:
        self.current = {
            "ops": collections.Counter(),
            "syncs": collections.Counter(),
            "host_side": collections.Counter(),
            "other_ops": collections.Counter(),
            "ops_by_site": collections.Counter(),
            "view_ops_by_site": collections.Counter(),
            "host_side_ops": collections.Counter(),
            "collectives": collections.Counter(),
            "collective_bytes": collections.Counter(),
            "excluded_ops": 0,
        }
        self.in_step = True

    def close_step(self) -> None:
        self.in_step = False
        self.steps.append(self.current)

    @property
    def counting(self) -> bool:
        return self.in_step and self.excluded_depth == 0 and not _in_excluded_backward()


COUNTER = _Counter()


def _is_mask_index(args: tuple) -> bool:
    import torch

    indices = args[1] if len(args) > 1 else None
    return isinstance(indices, (list, tuple)) and any(
        isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices
    )


def _install_dispatch_counter() -> Any:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if COUNTER.in_step:
                if COUNTER.excluded_depth or _in_excluded_backward():
                    COUNTER.current["excluded_ops"] += 1
                else:
                    short = func.overloadpacket.__name__
                    if func.namespace != "aten":  # profiler record_function markers, c10d: no kernel
                        COUNTER.current["other_ops"][f"{func.namespace}::{short}"] += 1
                        return func(*args, **(kwargs or {}))
                    COUNTER.current["ops"][f"aten::{short}"] += 1
                    if short not in VIEW_OPS:
                        site = f"{short} @ {_call_sites()[0]}"
                        COUNTER.current["ops_by_site"][site] += 1
                        if _host_side_op(args):
                            COUNTER.current["host_side_ops"][site] += 1
                    else:
                        COUNTER.current["view_ops_by_site"][f"{short} @ {_call_sites()[0]}"] += 1
                    if (
                        short in SYNC_OPS
                        or (short in ("index", "index_put", "index_put_") and _is_mask_index(args))
                        or (
                            short == "repeat_interleave"
                            and isinstance(args[0], torch.Tensor)
                            and len(args) > 1
                            and isinstance(args[1], torch.Tensor)
                            and (kwargs or {}).get("output_size") is None
                        )
                    ):
                        _record_sync(short, args[0] if args else None)
            return func(*args, **(kwargs or {}))

    return CountOps


def _site(frame: Any) -> str:
    path = frame.f_code.co_filename
    for root in (str(REPO) + "/", "site-packages/"):
        if root in path:
            path = path.split(root, 1)[1]
    return f"{path}:{frame.f_code.co_name}:{frame.f_lineno}"


def _call_sites() -> tuple[str, str]:
    """(caller outside torch, innermost caller): ``path:function:line`` each, this file skipped."""
    frame = sys._getframe(1)
    while frame is not None and (
        frame.f_code.co_filename == __file__
        or any(
            part in frame.f_code.co_filename
            for part in ("/torch/_dynamo/", "/torch/utils/_python_dispatch", "/torch/_tensor.py")
        )
    ):
        frame = frame.f_back
    inner = frame
    while frame is not None and ("/torch/" in frame.f_code.co_filename or frame.f_code.co_filename == __file__):
        frame = frame.f_back  # torch, and this file's collective wrappers: the caller is the site
    return (_site(frame) if frame else "?"), (_site(inner) if inner else "?")


HOST_TENSORS: Any = None
"""Tensors made by a counted ``.cpu()``: reading them again is no second sync."""

HOST_SIDE_SITES = {
    "torch/optim/": "Adam's step counter: state['step'] is a CPU tensor unless capturable or fused (torch.optim.Adam)",
    "distsplat_ns/balance/cost.py": "the cost history: float64 CPU tensors (CostHistory.get: '[T] float64 on CPU')",
    "distsplat_ns/balance/planner.py": "the planner reads the CPU cost history",
    "distsplat_ns/model/band_render.py:rendered_sizes_px": "training passes host-side cameras (pipeline._host_cameras)",
}
"""Callers whose tensors a GPU run keeps on the host: a read there is no device-to-host sync.
Each entry is a claim about the code, checked by reading it (the reason says where)."""


HOST_SIDE_OP_SITES = (
    "distsplat_ns/balance/cost.py:",
    "distsplat_ns/balance/planner.py:",
    "distsplat_ns/model/band_render.py:rendered_sizes_px",
    "distsplat_ns/pipeline/distsplat_pipeline.py:_host_cameras",
    "distsplat_ns/utils/cameras.py:cameras_at",
)
"""Callers (``path:function``) whose operators a GPU run performs on host tensors (the cost
history; the training cameras, indexed on the host: ``pipeline._host_cameras``, and a batch's
cameras taken from those by ``utils/cameras.cameras_at``, which training calls only on them):
CPU work, no kernel launch. For ``device_ops`` only; ``ops`` counts them."""


def _host_side_op(args: Any) -> bool:
    import torch

    for arg in args:
        if isinstance(arg, torch.Tensor):
            ref = HOST_TENSORS.get(id(arg)) if HOST_TENSORS is not None else None
            if ref is not None and ref() is arg:
                return True
    frame = sys._getframe(1)
    while frame is not None:
        site = _site(frame)
        if any(site.startswith(prefix) for prefix in HOST_SIDE_OP_SITES):
            return True
        frame = frame.f_back
    return False


def _host_side_reason(tensor: Any, outer: str, inner: str) -> str | None:
    ref = HOST_TENSORS.get(id(tensor)) if tensor is not None and HOST_TENSORS is not None else None
    if ref is not None and ref() is tensor:
        return "a copy a counted .cpu() already brought to the host"
    for prefix, reason in HOST_SIDE_SITES.items():
        if inner.startswith(prefix) or outer.startswith(prefix):
            return reason
    return None


def _record_sync(kind: str, tensor: Any) -> None:
    outer, inner = _call_sites()
    site = f"{kind} @ {outer}" + (f" via {inner}" if inner != outer else "")
    reason = _host_side_reason(tensor, outer, inner)
    if reason is None:
        COUNTER.current["syncs"][site] += 1
    else:
        COUNTER.current["host_side"][site] += 1
        COUNTER.host_side_reasons[site] = reason


def _install_host_read_patches() -> None:
    """Count ``tolist``, ``numpy`` and ``cpu``: on a CPU tensor they dispatch nothing.

    Where ``.cpu()`` returns the tensor itself (a CPU run) it returns a copy instead, as on a GPU,
    so that what is read from that copy is known to be on the host.
    """
    import weakref

    import torch

    global HOST_TENSORS
    HOST_TENSORS = {}  # id -> weakref (a WeakSet would compare tensors with ==)

    def wrap(name: str, is_host_read: Any = None, copies: bool = False) -> None:
        original = getattr(torch.Tensor, name)

        def patched(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            counted = COUNTER.counting and (is_host_read is None or is_host_read(*args, **kwargs))
            if counted:
                _record_sync(name, self)
            out = original(self, *args, **kwargs)
            if counted and copies:
                if out is self:
                    _enter()
                    try:
                        out = self.clone()
                    finally:
                        _leave()
                HOST_TENSORS[id(out)] = weakref.ref(out)
            return out

        setattr(torch.Tensor, name, patched)

    wrap("tolist")
    wrap("numpy")
    wrap("cpu", copies=True)


def _payload_bytes(value: Any) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
        return sum(_payload_bytes(v) for v in value)
    if value is None:
        return 0
    return len(pickle.dumps(value))


#: torch.distributed collective -> index of the argument this rank contributes (None: no payload).
COLLECTIVE_INPUT = {
    "all_reduce": 0,
    "broadcast": 0,
    "reduce": 0,
    "all_gather": 1,
    "all_gather_into_tensor": 1,
    "all_to_all_single": 1,
    "all_to_all": 1,
    "gather": 0,
    "scatter": 0,
    "reduce_scatter": 1,
    "reduce_scatter_tensor": 1,
    "all_gather_object": 1,
    "broadcast_object_list": 0,
    "gather_object": 0,
    "barrier": None,
    "send": 0,
    "recv": None,
    "isend": 0,
    "irecv": None,
}


def _install_collective_patches() -> None:
    import torch.distributed as dist

    for name, arg in COLLECTIVE_INPUT.items():
        original = getattr(dist, name, None)
        if original is None:
            continue

        def patched(*args: Any, _original: Any = original, _name: str = name, _arg: Any = arg, **kwargs: Any) -> Any:
            if COUNTER.in_step:
                COUNTER.current["collectives"][_name] += 1
                if _arg is not None and len(args) > _arg:
                    COUNTER.current["collective_bytes"][_name] += _payload_bytes(args[_arg])
            return _original(*args, **kwargs)

        setattr(dist, name, patched)


def _sequence_now() -> int:
    import torch

    with torch.enable_grad():
        probe = torch.zeros((), requires_grad=True) * 1.0
    return int(probe.grad_fn._sequence_nr())


EXCLUDED_NODES: collections.deque = collections.deque(maxlen=256)
"""``[first, end)`` autograd sequence numbers of the nodes each renderer call created."""


def _in_excluded_backward() -> bool:
    """Whether the backward node now running was created by a renderer call.

    The engine adds a gradient into the input buffer of the next node while the node that
    produced it is current, so sums of the renderer's own gradients count as the renderer's.
    """
    import torch

    node = torch._C._current_autograd_node()
    if node is None:
        return False
    seq = node._sequence_nr()
    return any(first <= seq < end for first, end in EXCLUDED_NODES)


def _enter() -> None:
    COUNTER.excluded_depth += 1


def _leave() -> None:
    COUNTER.excluded_depth -= 1


def _tensors_in(value: Any, out: list) -> list:
    import dataclasses

    import torch

    if isinstance(value, torch.Tensor):
        out.append(value)
    elif isinstance(value, dict):
        for v in value.values():
            _tensors_in(v, out)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _tensors_in(v, out)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            _tensors_in(getattr(value, field.name), out)
    return out


def _hook_backward(out: Any, first_seq: int, end_seq: int) -> None:
    """Count apart everything between the start and end of each node created in
    ``[first_seq, end_seq)`` reachable from ``out``: a custom backward that recomputes its forward
    and runs ``autograd.grad`` (the reference compositing) creates nodes outside the range."""
    seen: set[int] = set()
    stack = [t.grad_fn for t in _tensors_in(out, []) if t.grad_fn is not None]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if not first_seq <= node._sequence_nr() < end_seq:
            continue  # older than the call (its inputs' history), or AccumulateGrad
        node.register_prehook(lambda grads_out: _enter())
        node.register_hook(lambda grads_in, grads_out: _leave())
        stack.extend(next_node for next_node, _ in node.next_functions)


def excluded(fn: Any) -> Any:
    """``fn`` with its dispatched operators, those of its backward and its tensor hooks uncounted."""
    import functools

    import torch

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        original_register_hook = torch.Tensor.register_hook

        def register_hook(self: torch.Tensor, hook: Any) -> Any:
            def counted_apart(grad: torch.Tensor) -> Any:
                _enter()
                try:
                    return hook(grad)
                finally:
                    _leave()

            return original_register_hook(self, counted_apart)

        _enter()
        torch.Tensor.register_hook = register_hook  # type: ignore[method-assign]
        try:
            first = _sequence_now()
            out = fn(*args, **kwargs)
            end = _sequence_now()
            EXCLUDED_NODES.append((first, end))
            _hook_backward(out, first, end)
        finally:
            torch.Tensor.register_hook = original_register_hook  # type: ignore[method-assign]
            _leave()
        return out

    return wrapper


def _exclude_renderer(method: str) -> list[str]:
    if method == "splatfacto":
        import nerfstudio.models.splatfacto as splatfacto_module

        splatfacto_module.rasterization = excluded(splatfacto_module.rasterization)
        return ["nerfstudio.models.splatfacto.rasterization"]
    import distsplat_ns.model.distsplat_model as model_module

    model_module.project = excluded(model_module.project)
    model_module.rasterize_rows = excluded(model_module.rasterize_rows)
    return ["distsplat_ns.model.distsplat_model.project", "distsplat_ns.model.distsplat_model.rasterize_rows"]


def worker(report_path: str, method: str, ns_train_args: list[str]) -> None:
    """Run ns-train with the counters installed; write this rank's report at exit."""
    from nerfstudio.scripts.train import entrypoint

    gpu_launch = load_script("gpu_launch")

    rank = int(os.environ.get("RANK", "0"))
    report: dict[str, Any] = {"rank": rank, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "completed": False}

    def write() -> None:
        report["host_side_reasons"] = COUNTER.host_side_reasons
        report["steps"] = [
            {key: (dict(value) if isinstance(value, collections.Counter) else value) for key, value in step.items()}
            for step in COUNTER.steps
        ]
        Path(report_path.replace("{rank}", str(rank))).write_text(json.dumps(report))

    atexit.register(write)
    gpu_launch.patch_lpips_if_offline()
    if method == "splatfacto":
        gpu_launch.patch_cpu_reference_renderer()
    report["excluded"] = _exclude_renderer(method)
    _install_host_read_patches()
    _install_collective_patches()
    mode_class = _install_dispatch_counter()
    active: list[Any] = []

    def start() -> None:
        COUNTER.open_step()
        active.append(mode_class())
        active[-1].__enter__()

    def stop() -> None:
        active.pop().__exit__(None, None, None)
        COUNTER.close_step()

    gpu_launch.hook_step_timer(start, stop, lambda timer: None)
    sys.argv = ["ns-train", *ns_train_args]
    entrypoint()
    report["completed"] = True
