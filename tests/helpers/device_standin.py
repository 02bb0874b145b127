"""A CPU stand-in for a CUDA device (issue 53, docs/device_standin.md): tensors "on the GPU" are
told apart from host tensors while the arithmetic runs on the CPU, and what CUDA refuses fails.

How it works:
  * :class:`DeviceTensor` wraps a CPU tensor (``.host``) in a tensor subclass whose Python-visible
    device is ``cuda:<index>`` and whose C++ device is ``meta`` (autograd needs a device it can run
    without a driver; ``meta`` is one). Every ATen operator on it reaches ``__torch_dispatch__``,
    which checks CUDA's device rules (:func:`_check_devices`), runs the operator on the wrapped CPU
    tensors and wraps the results again. Autograd's own operators go the same way, so gradients of
    device tensors are device tensors.
  * :class:`StandinMode`, a ``TorchFunctionMode``, turns what Python asks of the ``cuda`` device
    into device tensors: factories with ``device=cuda``, ``Tensor.to``/``cuda``/``cpu``, pinning.
  * :func:`install` fakes the ``torch.cuda`` calls the package makes (one GPU per rank, streams,
    memory figures), runs NCCL's work on gloo after refusing a host tensor the way NCCL does, and
    counts the host-to-device copies that would block (:class:`CopyCounter`).

Test-only: nothing in ``distsplat_ns`` knows about it.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from tests.helpers import device_memory, gsplat_cpu

SAME_DEVICE_MESSAGE = "Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!"
"""CUDA's refusal of a kernel that mixes a device tensor with a non-scalar host tensor
(TensorIterator's device check; torch 2.1 to 2.14 word it so)."""
INDEX_MESSAGE = "indices should be either on cpu or on the same device as the indexed tensor (cpu)"
"""CUDA's refusal of a host tensor indexed by device indices or a device mask (ATen's index)."""
NCCL_MESSAGE = "Tensors must be CUDA and dense"
"""ProcessGroupNCCL's refusal of a host tensor handed to a collective."""
NUMPY_MESSAGE = (
    "can't convert {device} device type tensor to numpy. Use Tensor.cpu() to copy the tensor to host memory first."
)

_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
_TRANSFERS = {"copy_", "_to_copy", "_copy_from", "_copy_from_and_resize"}
_INDEXING = {"index", "index_put_", "index_put", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"}
_PINNED: set[int] = set()  # id() of host tensors this stand-in pinned (CUDA's page-locked memory)
_LOCK = threading.Lock()
_CURRENT = [0]  # torch.cuda.current_device() under the stand-in


class StandinDeviceError(RuntimeError):
    """What CUDA would have raised, with the place in the project's code that asked for it."""


def _place() -> str:
    """The innermost frame outside torch and this file: where the project's code asked."""
    for frame in reversed(traceback.extract_stack()):
        path = os.path.abspath(frame.filename)
        if not path.startswith((_HERE + os.sep + "device_standin", _TORCH_DIR)):
            return f"{frame.filename}:{frame.lineno} in {frame.name}"
    return "?"


def _refuse(message: str) -> None:
    raise StandinDeviceError(f"{message}\n  [device stand-in] at {_place()}")


class DeviceTensor(torch.Tensor):
    """A tensor "on the GPU": its values live in ``host`` (a CPU tensor), its device says cuda.

    Args:
        host: The values, a CPU tensor (kept as it is: views and in-place writes go through).
        index: The CUDA device index it claims.
    """

    host: torch.Tensor
    index: int

    @staticmethod
    def __new__(cls, host: torch.Tensor, index: int = 0) -> DeviceTensor:  # noqa: PYI034 (a staticmethod, as torch wants)
        out = torch.Tensor._make_wrapper_subclass(
            cls,
            host.size(),
            strides=host.stride(),
            storage_offset=host.storage_offset(),
            dtype=host.dtype,
            device="meta",
            requires_grad=host.requires_grad,
        )
        out.host = host
        out.index = index
        device_memory.register(out, host, index)
        return out

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return torch.device("cuda", self.index)

    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False

    @property
    def data(self) -> torch.Tensor:  # type: ignore[override]
        return DeviceTensor(self.host.detach(), self.index)

    @data.setter
    def data(self, value: torch.Tensor) -> None:
        if not isinstance(value, DeviceTensor):
            _refuse(
                f"Attempted to call `variable.set_data(tensor)`, but `variable` and `tensor` have incompatible tensor type (cuda, {value.device})"
            )
        torch.Tensor.data.__set__(self, value)
        self.host = value.host

    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        _refuse(NUMPY_MESSAGE.format(device=self.device))

    def tolist(self) -> Any:  # type: ignore[override]
        COUNTER.sync("tolist")
        return self.host.tolist()

    def data_ptr(self) -> int:  # type: ignore[override]
        return self.host.data_ptr()

    def untyped_storage(self) -> Any:  # type: ignore[override]
        return self.host.untyped_storage()

    def is_pinned(self, *args: Any) -> bool:  # type: ignore[override]
        return False

    def record_stream(self, stream: Any) -> None:  # type: ignore[override]
        return None  # one stream on the stand-in: nothing to record

    def __repr__(self, *args: Any, **kwargs: Any) -> str:  # type: ignore[override]
        return f"DeviceTensor({self.host!r}, device='{self.device}')"

    def __reduce_ex__(self, proto: int) -> Any:
        # Saved as its values: what torch.load(map_location="cpu") gives back from a CUDA tensor.
        return self.host.detach().__reduce_ex__(proto)

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in ("is_pinned", "_pin_memory"):
            return (
                False
                if name == "is_pinned"
                else _refuse("cannot pin 'CUDA' memory: only dense CPU tensors can be pinned")
            )
        flat, _ = tree_flatten((args, kwargs))
        devices = [t for t in flat if isinstance(t, DeviceTensor)]
        index = devices[0].index if devices else 0
        valueless = [
            t
            for t in flat
            if isinstance(t, torch.Tensor) and not isinstance(t, DeviceTensor) and t.device.type == "meta"
        ]
        if valueless:
            _refuse(
                f"stand-in limit: C++ made a tensor without values for {func} (a number on the device?): add it to _NUMBER_WRAPPING"
            )
        if name in _TRANSFERS:
            return _transfer(name, func, args, kwargs, index)
        _check_devices(name, args, flat, devices)
        wrapped = {id(t.host): t for t in devices}
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, _meta_to_cpu(kwargs)))
        if name == "_local_scalar_dense":
            COUNTER.sync("item")
            return out
        return tree_map(lambda t: _rewrap(t, wrapped, index), out)


def _unwrap(t: Any) -> Any:
    return t.host if isinstance(t, DeviceTensor) else t


def _meta_to_cpu(kwargs: dict) -> dict:
    """``device=meta`` (what C++ sees of a device tensor, e.g. in ``empty_like``) made ``cpu``."""
    if isinstance(kwargs.get("device"), torch.device) and kwargs["device"].type == "meta":
        return {**kwargs, "device": torch.device("cpu")}
    return kwargs


def _rewrap(t: Any, wrapped: dict[int, DeviceTensor], index: int) -> Any:
    if not isinstance(t, torch.Tensor) or isinstance(t, DeviceTensor):
        return t
    same = wrapped.get(id(t))  # an in-place operator returns its device input itself
    return DeviceTensor(t, index) if same is None else same


def _check_devices(name: str, args: tuple, flat: list, devices: list[DeviceTensor]) -> None:
    """Refuse, as CUDA does, an operator that mixes host and device tensors.

    CUDA lets a device tensor be indexed by host indices and lets a 0-dim host tensor be a
    kernel's scalar; it refuses a host tensor indexed by device indices (INDEX_MESSAGE) and any
    other mix (SAME_DEVICE_MESSAGE)."""
    hosts = [
        t for t in flat if isinstance(t, torch.Tensor) and not isinstance(t, DeviceTensor) and t.device.type == "cpu"
    ]
    if len({t.index for t in devices}) > 1:
        a, b = sorted({str(t.device) for t in devices})[:2]
        _refuse(SAME_DEVICE_MESSAGE.format(a=a, b=b))
    if not devices or not hosts:
        return
    if name in _INDEXING:
        if not isinstance(args[0], DeviceTensor):
            _refuse(INDEX_MESSAGE)
        return  # host indices into a device tensor: CUDA copies them over
    if any(t.dim() > 0 for t in hosts):
        _refuse(SAME_DEVICE_MESSAGE.format(a=devices[0].device, b="cpu"))


def _transfer(name: str, func: Any, args: tuple, kwargs: dict, index: int) -> Any:
    """Copies between host and device (``copy_``, ``_to_copy``), counted when they would block."""
    if name == "_to_copy":
        source, target = args[0], kwargs.get("device")
        to_host = target is not None and target.type == "cpu"
        out = func(_unwrap(source), **_meta_to_cpu(kwargs))
        if isinstance(source, DeviceTensor) and to_host:
            COUNTER.sync("device-to-host copy")
            return out
        return DeviceTensor(out, index) if isinstance(source, DeviceTensor) or target is not None else out
    dst, src = args[0], args[1]
    non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
    if isinstance(dst, DeviceTensor) and not isinstance(src, DeviceTensor) and src.dim() > 0:
        COUNTER.upload(src, non_blocking)
    elif isinstance(src, DeviceTensor) and not isinstance(dst, DeviceTensor):
        COUNTER.sync("device-to-host copy")
    func(_unwrap(dst), _unwrap(src), *args[2:], **kwargs)
    return dst


@dataclass
class CopyCounter:
    """Host-to-device copies that would block the host on a GPU, and host syncs, by place.

    A copy blocks when it is not ``non_blocking`` or comes from memory that is not pinned (CUDA
    then stages it through a pinned buffer and waits). Only copies inside a training step
    (:attr:`in_step`) are kept by place; ``total`` counts all."""

    in_step: bool = False
    step: int = -1
    blocking_in_steps: Counter = field(default_factory=Counter)
    blocking_total: int = 0
    blocking_by_step: dict = field(default_factory=dict)
    syncs_in_steps: Counter = field(default_factory=Counter)
    steps: list = field(default_factory=list)

    def upload(self, source: torch.Tensor, non_blocking: bool) -> None:
        if non_blocking and id(source) in _PINNED:
            return
        with _LOCK:
            self.blocking_total += 1
            if self.in_step:
                place = _place()
                self.blocking_in_steps[place] += 1
                self.blocking_by_step.setdefault(self.step, Counter())[place] += 1

    def sync(self, what: str) -> None:
        if self.in_step:
            with _LOCK:
                self.syncs_in_steps[f"{what} at {_place()}"] += 1

    def report(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "blocking_copies_total": self.blocking_total,
            "blocking_copies_in_steps": dict(self.blocking_in_steps),
            "blocking_copies_by_step": {str(step): dict(c) for step, c in sorted(self.blocking_by_step.items())},
            "host_syncs_in_steps": dict(self.syncs_in_steps),
        }


COUNTER = CopyCounter()


def _is_device(device: Any) -> bool:
    """``cuda`` as Python asks for it, or ``meta``: what C++ sees of a device tensor's device."""
    return isinstance(device, torch.device) and device.type in ("cuda", "meta")


class StandinMode(TorchDispatchMode):
    """What is asked of the ``cuda`` device (or made by C++ on a device tensor's device) made a
    :class:`DeviceTensor`: factories, ``Tensor.to``/``cuda``, ``torch.tensor(..., device=)``;
    pinning of host memory recorded. Every ATen operator passes here first, in every thread the
    step runs in (autograd's backward included), before :meth:`DeviceTensor.__torch_dispatch__`."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name == "is_pinned":
            return id(args[0]) in _PINNED
        if name == "_pin_memory":
            pinned = args[0].clone()
            _PINNED.add(id(pinned))
            return pinned
        if kwargs.get("pin_memory"):
            out = func(*args, **{**kwargs, "pin_memory": False})
            _PINNED.add(id(out))
            return out
        if not _is_device(kwargs.get("device")):
            return func(*args, **kwargs)
        device = kwargs["device"]
        index = device.index if device.type == "cuda" and device.index is not None else _CURRENT[0]
        if name == "_to_copy" and not isinstance(args[0], DeviceTensor):
            host = args[0]
            if host.dim() > 0:
                COUNTER.upload(host, bool(kwargs.get("non_blocking", False)))
            out = func(host, **{**kwargs, "device": torch.device("cpu")})
            return DeviceTensor(out if out is not host else out.clone(), index)
        on_device = any(isinstance(t, DeviceTensor) for t in args)
        out = func(*args, **{**kwargs, "device": torch.device("meta" if on_device else "cpu")})
        return tree_map(
            lambda t: DeviceTensor(t, index) if isinstance(t, torch.Tensor) and not isinstance(t, DeviceTensor) else t,
            out,
        )


def _host_built(original: Callable) -> Callable:
    """``torch.tensor``-like ``original`` (which builds on the host below the dispatcher's Python
    key, out of any mode's sight) made on the host, then copied to the device as CUDA copies it:
    a blocking copy from pageable memory."""

    def build(*args: Any, **kwargs: Any) -> Any:
        device = kwargs.get("device")
        device = torch.device(device) if isinstance(device, str | int) and not isinstance(device, bool) else device
        if isinstance(args[0] if args else None, DeviceTensor) and original is _ORIGINAL_NEW_TENSOR and device is None:
            device = args[0].device
        if not isinstance(device, torch.device) or device.type != "cuda":
            return original(*args, **kwargs)
        out = original(*args, **{**kwargs, "device": torch.device("cpu")})
        if isinstance(out, DeviceTensor):
            return out
        if out.dim() > 0:
            COUNTER.upload(out, non_blocking=False)
        return DeviceTensor(out, device.index if device.index is not None else _CURRENT[0])

    return build


_ORIGINAL_NEW_TENSOR = torch.Tensor.new_tensor


_ORIGINAL_TO = torch.Tensor.to


def _indexed(device: Any) -> Any:
    """``cuda`` made ``cuda:<current>``: C++ asks the driver for the current device of a bare one."""
    if (
        isinstance(device, str)
        and device == "cuda"
        or isinstance(device, torch.device)
        and device.type == "cuda"
        and device.index is None
    ):
        return torch.device("cuda", _CURRENT[0])
    return device


def _to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``Tensor.to`` with a bare ``cuda`` given its index (:func:`_indexed`)."""
    return _ORIGINAL_TO(
        self, *(_indexed(a) for a in args), **{k: _indexed(v) if k == "device" else v for k, v in kwargs.items()}
    )


# ---------------------------------------------------------------- torch.cuda and NCCL, faked


class _Stream:
    """A CUDA stream that orders nothing (the stand-in runs everything in order on the host)."""

    def __init__(self, device: Any = None, *args: Any, **kwargs: Any) -> None:
        self.device = device

    def wait_stream(self, other: Any) -> None:
        return None

    def synchronize(self) -> None:
        return None

    def record_event(self, *args: Any) -> Any:
        return None

    def wait_event(self, *args: Any) -> None:
        return None

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False


_OBJECT_DEPTH = [0]  # > 0 inside torch's object collectives, which stage pickles on their own
_PROPERTIES = SimpleNamespace(
    name="CUDA device stand-in", major=9, minor=0, total_memory=80 << 30, multi_processor_count=132
)
"""What ``torch.cuda.get_device_properties`` says under the stand-in (an H100's figures)."""
_ORIGINALS: dict[str, Callable] = {}  # torch.distributed's own collectives, before the patches
_GLOO_GROUPS: list = []  # groups the package made gloo on purpose (host-side control): not checked


def _checked_collective(original: Callable) -> Callable:
    """``original`` (a ``torch.distributed`` collective) refusing host tensors as NCCL does, run
    by gloo on the wrapped CPU tensors (written in place, so the device tensors see the result)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("device_ids", None)
        flat, _ = tree_flatten((args, kwargs))
        on_gloo = any(g is group for g in _GLOO_GROUPS for group in flat)
        if not _OBJECT_DEPTH[0] and not on_gloo:
            for t in flat:
                if isinstance(t, torch.Tensor) and not isinstance(t, DeviceTensor):
                    _refuse(f"{NCCL_MESSAGE} (a host tensor handed to {original.__name__})")
        args, kwargs = tree_map(_unwrap, args), tree_map(_unwrap, kwargs)
        if (
            original.__name__ == "all_gather_into_tensor"
        ):  # NCCL takes any output of W x the input's size, gloo a flat one
            output, tensor = args[0], args[1]
            world = output.numel() // max(tensor.numel(), 1)
            return _ORIGINALS["all_gather"](
                list(output.view(world, *tensor.shape).unbind(0)), tensor, *args[2:], **kwargs
            )
        return original(*args, **kwargs)

    run.__name__ = original.__name__
    return run


def _object_collective(original: Callable) -> Callable:
    """``original`` (``broadcast_object_list`` and kin) with its pickles staged on the host: NCCL
    stages them on the current device itself, nothing of the caller's reaches it as a tensor."""

    def run(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("device", None)
        _OBJECT_DEPTH[0] += 1
        try:
            return original(*args, **kwargs)
        finally:
            _OBJECT_DEPTH[0] -= 1

    run.__name__ = original.__name__
    return run


_OBJECT_COLLECTIVES = (
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)
_COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "all_to_all_single",
    "all_to_all",
    "reduce_scatter_tensor",
    "reduce",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "barrier",
)


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Any) -> Iterator[None]:
    had = name in vars(target)  # its own attribute, not one inherited (put back as it was)
    old = vars(target).get(name)
    setattr(target, name, value)
    try:
        yield
    finally:
        if had:
            setattr(target, name, old)
        else:
            delattr(target, name)


@contextlib.contextmanager
def installed(devices_per_host: int = 8) -> Iterator[CopyCounter]:
    """The stand-in, on for this thread: ``torch.cuda`` says there are ``devices_per_host`` GPUs,
    ``torch.distributed`` runs NCCL's work over gloo, and device tensors behave as above.

    Yields:
        The copy counter (:data:`COUNTER`).
    """
    import torch.distributed as dist

    current = _CURRENT
    patches = [
        (torch.cuda, "is_available", lambda: True),
        (torch.cuda, "_lazy_init", lambda: None),  # what C++ calls before making a tensor on cuda
        (torch.cuda, "device_count", lambda: devices_per_host),
        (torch.cuda, "current_device", lambda: current[0]),
        (
            torch.cuda,
            "set_device",
            lambda d: current.__setitem__(0, torch.device(d).index if not isinstance(d, int) else d),
        ),
        (torch.cuda, "synchronize", lambda *a, **k: None),
        (torch.cuda, "empty_cache", lambda: None),
        (torch.cuda, "Stream", _Stream),
        (torch.cuda, "current_stream", lambda *a, **k: _Stream()),
        (torch.cuda, "stream", lambda s: contextlib.nullcontext()),
        (torch.cuda, "max_memory_allocated", device_memory.max_memory_allocated),
        (torch.cuda, "memory_allocated", device_memory.memory_allocated),
        (torch.cuda, "reset_peak_memory_stats", device_memory.reset_peak_memory_stats),
        (torch.cuda, "mem_get_info", device_memory.mem_get_info),
        (torch.cuda, "set_sync_debug_mode", lambda *a, **k: None),
        (
            torch.cuda,
            "get_device_properties",
            lambda *a, **k: SimpleNamespace(**{**vars(_PROPERTIES), "total_memory": device_memory.total_memory()}),
        ),  # torch 2.1's inductor asks at import
        (torch.cuda, "get_device_capability", lambda *a, **k: (_PROPERTIES.major, _PROPERTIES.minor)),
        (torch.cuda, "get_device_name", lambda *a, **k: _PROPERTIES.name),
    ]
    if hasattr(torch, "accelerator"):  # torch >= 2.6: the optimizers' CUDA-graph check asks it
        patches.append((torch.accelerator, "current_stream", lambda *a, **k: _Stream()))
    patches.append((torch.cuda, "is_current_stream_capturing", lambda: False))
    patches += [(torch, name, _host_built(getattr(torch, name))) for name in ("tensor", "as_tensor", "asarray")]
    patches.append((torch.Tensor, "new_tensor", _host_built(_ORIGINAL_NEW_TENSOR)))
    patches.append((torch.Tensor, "to", _to))
    patches.append(
        (
            torch.Tensor,
            "cuda",
            lambda self, device=None, non_blocking=False, **k: _to(
                self,
                _indexed(torch.device("cuda", device) if isinstance(device, int) else device or "cuda"),
                non_blocking=non_blocking,
            ),
        )
    )
    original_init = dist.init_process_group

    def init_process_group(*args: Any, **kwargs: Any) -> Any:
        backend = kwargs.get("backend", args[0] if args else None)
        if backend == "nccl":  # NCCL's rules are checked by the collectives below, gloo carries
            kwargs["backend"] = "gloo"
            args = args[1:]
        kwargs.pop("device_id", None)
        return original_init(*args, **kwargs)

    patches.append((dist, "init_process_group", init_process_group))
    original_new_group = dist.new_group

    def new_group(*args: Any, **kwargs: Any) -> Any:
        asked = kwargs.get("backend")
        if asked == "nccl":
            kwargs["backend"] = "gloo"
        group = original_new_group(*args, **kwargs)
        if asked == "gloo":
            _GLOO_GROUPS.append(group)
        return group

    original_get_backend = dist.get_backend

    def get_backend(group: Any = None) -> Any:
        """ "nccl" for the groups NCCL would carry: the package then hands them device tensors."""
        if any(g is group for g in _GLOO_GROUPS):
            return original_get_backend(group)
        return "nccl"

    patches += [(dist, "new_group", new_group), (dist, "get_backend", get_backend)]
    import torch.distributed.distributed_c10d as c10d

    _ORIGINALS.setdefault("all_gather", c10d.all_gather)
    for module in (dist, c10d):  # the package calls the first, torch's own functions the second
        patches += [
            (module, name, _checked_collective(getattr(c10d, name))) for name in _COLLECTIVES if hasattr(c10d, name)
        ]
        patches += [
            (module, name, _object_collective(getattr(c10d, name)))
            for name in _OBJECT_COLLECTIVES
            if hasattr(c10d, name)
        ]
    with contextlib.ExitStack() as stack:
        for target, name, value in patches:
            stack.enter_context(_patched(target, name, value))
        stack.enter_context(gsplat_cpu.installed())  # gsplat's kernels on torch ops (docs/gsplat_on_cpu.md)
        stack.enter_context(StandinMode())
        yield COUNTER


def write_report(path: str, **extra: Any) -> None:
    """The counter's report and ``extra`` as JSON (one file per rank: ``path`` gets ``.rank<R>`` appended)."""
    rank = os.environ.get("RANK", "0")
    with open(f"{path}.rank{rank}", "w") as f:
        json.dump({**COUNTER.report(), **extra}, f, indent=1)
