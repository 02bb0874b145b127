"""A training step's host cost outside the rasterizer, the GPU proxy (issue 28, item 3).

Per training step and per rank, for distsplat at W = 1, 2, 4 processes in both parallel modes and
for nerfstudio's ``splatfacto`` at W = 1, all on distsplat's pure-PyTorch reference renderer:

* **ATen operators** dispatched outside the rasterizer: on a GPU nearly every one is a kernel
  launch. Counted with a ``TorchDispatchMode`` (forward, backward, optimizer, refinement, checks:
  everything between the opening and closing of nerfstudio's ``ITER_TRAIN_TIME`` timer, which both
  trainers open around a step, splatfacto's densification callbacks included). Only the ``aten``
  namespace (profiler markers and ``c10d`` ops are listed apart, ``other_ops_by_name``);
  ``non_view_ops`` also leaves out the operators that only make a view (``VIEW_OPS``), which
  launch nothing, and ``non_view_ops_by_site`` says which caller dispatched each.
* **Host syncs** outside the rasterizer: operators that return a host value or whose output size
  depends on the data, each a device-to-host synchronisation on CUDA:
  ``_local_scalar_dense`` (``.item()``, ``int()``/``float()``/``bool()`` of a tensor),
  ``nonzero``, ``masked_select``, the ``unique`` family, ``equal``, ``repeat_interleave`` with a
  tensor of repeats, ``bincount``, and ``index``/``index_put_`` with a boolean mask (a hidden
  ``nonzero``); plus the Python-level host reads that on a CPU tensor dispatch nothing:
  ``Tensor.tolist``, ``Tensor.numpy``, ``Tensor.cpu``. Not counted: ``.to("cpu")``, which on
  a CPU run cannot be told from ``.to(device)`` with the training device (nerfstudio passes the
  configured device string), a host-to-device copy on a GPU. On the CPU every tensor is a host tensor, so each of these is recorded with its caller, and those on
  tensors a GPU run keeps on the host are set apart (``host_side_reads_by_name``, not syncs):
  reads of a copy a counted ``.cpu()`` made, and the callers listed in ``HOST_SIDE_SITES``
  (Adam's CPU step counter, distsplat's CPU cost history and host cameras), each with its reason
  (``host_side_reasons``). Everything else counts as a sync (``syncs_by_name``).
* **Collectives**: every ``torch.distributed`` collective called in the step, by name, with the
  payload bytes this rank puts in (in-place tensors, the input tensor of gathers and all-to-alls,
  pickled objects).

**Excluded: the rasterizer.** On a GPU it is gsplat's fused kernels, whose launches do not depend
on distsplat. distsplat calls ``rendering.project`` and ``rendering.rasterize_rows``
(``model/distsplat_model.py``); splatfacto calls ``rasterization`` (gsplat's, replaced here by
``distsplat_ns.rendering.rasterization(backend="reference")``: ``scripts/gpu_launch.py``'s
``--cpu-reference-renderer`` patch, which also makes ``Tensor.cuda()`` a no-op), built from the
same two functions. This benchmark wraps those three names (in the modules that call them, inside
the benchmark process only): operators dispatched during the call are not counted, and neither are
those of its backward -- those dispatched while the autograd engine runs a node the call created
(``torch._C._current_autograd_node()``, its sequence number within the call's range), which
includes the engine's sums of the renderer's own gradients, or between such a node's pre-hook and
hook (a custom backward's own inner autograd graph) -- nor those of the tensor hooks the call
registers (absgrad). A sum of a gradient from the renderer with one from outside it (a
parameter also used by a regulariser) counts on the side of the node that finishes last: at
most one operator per such tensor.

Usage (one run at a time; ~10 minutes on 2 cores)::

    PYTHONPATH=$PWD python benchmarks/bench_host_cost.py [--steps 10] [--worlds 1 2 4] \
        [--data scenes/lund_door] [--out benchmarks/results/host_cost_lund_door_DATE.json]

Each distsplat run trains B = W images per step (one image per rank, the per-rank work of W = 1);
``--steps`` steps (23), refinement every 6 steps after 3 (one densification step, step 18, counted
apart). Steady state: the median over steps 13.. except the densification step.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import json
import os
import pickle
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

REFINE_EVERY_STEPS = 6
"""Refinement every 6 steps after a warm-up of 3 (both as images in distsplat: B per step)."""
REFINE_STEP = 18
"""The run's densification step, counted apart: the first multiple of 6 that gsplat's
``DefaultStrategy`` (and distsplat's same rule) does not skip as a pause after the opacity reset
(``step % reset_every >= num_train_images + refine_every``, 12 images here)."""
FIRST_STEADY_STEP = 13
"""The steps before are cold: distsplat's first epoch (a footprint prior for each camera not yet
measured: 12 steps at B = 1), logging at step 0."""

SYNC_OPS = frozenset({
    "_local_scalar_dense", "nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
    "unique_consecutive", "equal", "bincount", "is_nonzero",
})
"""Operators that are a device-to-host synchronisation on CUDA whatever their arguments."""

VIEW_OPS = frozenset({
    "view", "_unsafe_view", "slice", "select", "expand", "detach", "alias", "unsqueeze", "squeeze",
    "permute", "transpose", "t", "as_strided", "unbind", "split", "split_with_sizes", "chunk",
    "narrow", "diagonal", "unfold", "lift_fresh", "view_as_real", "view_as_complex", "_reshape_alias",
})
"""Operators that only make a view (shape and strides, no data): no kernel on a GPU."""


# ----------------------------------------------------------------------------- worker side


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
            "ops": collections.Counter(), "syncs": collections.Counter(), "host_side": collections.Counter(),
            "other_ops": collections.Counter(), "ops_by_site": collections.Counter(),
            "collectives": collections.Counter(), "collective_bytes": collections.Counter(), "excluded_ops": 0,
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
                        COUNTER.current["ops_by_site"][f"{short} @ {_call_sites()[0]}"] += 1
                    if (
                        short in SYNC_OPS
                        or (short in ("index", "index_put", "index_put_") and _is_mask_index(args))
                        or (short == "repeat_interleave" and isinstance(args[0], torch.Tensor) and len(args) > 1
                            and isinstance(args[1], torch.Tensor) and (kwargs or {}).get("output_size") is None)
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
    while frame is not None and (frame.f_code.co_filename == __file__ or any(
        part in frame.f_code.co_filename for part in ("/torch/_dynamo/", "/torch/utils/_python_dispatch", "/torch/_tensor.py")
    )):
        frame = frame.f_back
    inner = frame
    while frame is not None and "/torch/" in frame.f_code.co_filename:
        frame = frame.f_back
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
    "all_reduce": 0, "broadcast": 0, "reduce": 0, "all_gather": 1, "all_gather_into_tensor": 1,
    "all_to_all_single": 1, "all_to_all": 1, "gather": 0, "scatter": 0, "reduce_scatter": 1,
    "reduce_scatter_tensor": 1, "all_gather_object": 1, "broadcast_object_list": 0, "gather_object": 0,
    "barrier": None, "send": 0, "recv": None, "isend": 0, "irecv": None,
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
    import gpu_launch
    from nerfstudio.scripts.train import entrypoint

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


# ----------------------------------------------------------------------------- driver side


#: name -> (method, world size W, parallel mode or None)
def run_specs(worlds: list[int]) -> list[tuple[str, str, int, str | None]]:
    specs: list[tuple[str, str, int, str | None]] = [("splatfacto_w1", "splatfacto", 1, None)]
    for parallel in ("replicated", "sharded"):
        specs += [(f"distsplat_{parallel}_w{w}", "distsplat", w, parallel) for w in worlds]
    return specs


def ns_train_args(method: str, world_size: int, parallel: str | None, steps: int, data: Path, output_dir: Path) -> list[str]:
    """Both methods: the scene at its shipped size, no eval, no save, refinement at step 6 only."""
    import gpu_bench

    batch = world_size if method == "distsplat" else 1
    args = gpu_bench.ns_train_args(gpu_bench.RunSpec(method, method, batch, steps * batch), output_dir, data, "cpu")
    split = args.index("colmap")
    # Schedules count images in distsplat and steps in splatfacto: B images per step, so the same steps.
    extra = [
        "--pipeline.model.num-downscales", "0",
        "--pipeline.model.warmup-length", str(3 * batch),
        "--pipeline.model.refine-every", str(REFINE_EVERY_STEPS * batch),
    ]
    if parallel is not None:
        extra += ["--pipeline.parallel", parallel]
    return args[:split] + extra + args[split:]


def run_one(name: str, method: str, world_size: int, parallel: str | None, steps: int, data: Path, work: Path) -> list[dict[str, Any]]:
    report = work / f"{name}.rank{{rank}}.json"
    args = ns_train_args(method, world_size, parallel, steps, data, work / "runs")
    me = [str(Path(__file__).resolve()), "--worker", "--report", str(report), "--method", method, "--"]
    prefix = [sys.executable] if world_size == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={world_size}"
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.run(prefix + me + args, cwd=REPO, capture_output=True, text=True, timeout=3600, env=env, check=False)
    reports = []
    for rank in range(world_size):
        path = Path(str(report).replace("{rank}", str(rank)))
        reports.append(json.loads(path.read_text()) if path.exists() else {"completed": False})
    if proc.returncode != 0 or not all(r.get("completed") for r in reports):
        raise SystemExit(f"{name} failed (rc {proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return reports


def _total(counter: dict[str, int]) -> int:
    return int(sum(counter.values()))


def summarise_rank(report: dict[str, Any]) -> dict[str, Any]:
    steps = report["steps"]
    steady = [s for i, s in enumerate(steps) if i >= FIRST_STEADY_STEP and i != REFINE_STEP]

    def med(key: str, of: list[dict[str, Any]] = steady) -> float:
        return statistics.median(_total(s[key]) for s in of)

    def by_name(key: str) -> dict[str, float]:
        names = sorted({n for s in steady for n in s[key]})
        per = {n: statistics.median(s[key].get(n, 0) for s in steady) for n in names}
        return dict(sorted(((n, v) for n, v in per.items() if v), key=lambda kv: -kv[1]))

    refine = steps[REFINE_STEP] if len(steps) > REFINE_STEP else None
    return {
        "steady_steps": [i for i in range(len(steps)) if i >= FIRST_STEADY_STEP and i != REFINE_STEP],
        "ops": med("ops"),
        "non_view_ops": statistics.median(
            sum(v for k, v in s["ops"].items() if k.split("::", 1)[1] not in VIEW_OPS) for s in steady
        ),
        "syncs": med("syncs"),
        "host_side_reads": med("host_side"),
        "collectives": med("collectives"),
        "collective_bytes": med("collective_bytes"),
        "excluded_renderer_ops": statistics.median(s["excluded_ops"] for s in steady),
        "refine_step": None if refine is None else {
            "step": REFINE_STEP, "ops": _total(refine["ops"]), "syncs": _total(refine["syncs"]),
            "collectives": _total(refine["collectives"]), "collective_bytes": _total(refine["collective_bytes"]),
        },
        "ops_per_step_all": [_total(s["ops"]) for s in steps],
        "syncs_per_step_all": [_total(s["syncs"]) for s in steps],
        "ops_by_name": by_name("ops"),
        "non_view_ops_by_site": by_name("ops_by_site"),
        "other_ops_by_name": by_name("other_ops"),
        "syncs_by_name": by_name("syncs"),
        "host_side_reads_by_name": by_name("host_side"),
        "host_side_reasons": report.get("host_side_reasons", {}),
        "collectives_by_name": by_name("collectives"),
        "collective_bytes_by_name": by_name("collective_bytes"),
    }


def summarise_run(reports: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = [summarise_rank(r) for r in reports]
    keys = ("ops", "non_view_ops", "syncs", "collectives", "collective_bytes")
    return {
        "per_rank_max": {k: max(r[k] for r in ranks) for k in keys},
        "per_rank_mean": {k: statistics.fmean(r[k] for r in ranks) for k in keys},
        "ranks": ranks,
    }


def targets(runs: dict[str, Any]) -> dict[str, Any]:
    splat = runs["splatfacto_w1"]["per_rank_max"]
    out: dict[str, Any] = {}
    for parallel in ("replicated", "sharded"):
        w1 = runs.get(f"distsplat_{parallel}_w1", {}).get("per_rank_max")
        w4 = runs.get(f"distsplat_{parallel}_w4", {}).get("per_rank_max")
        if w1:
            out[f"{parallel}_w1_vs_splatfacto"] = {
                k: {"distsplat": w1[k], "splatfacto": splat[k], "reached": w1[k] <= splat[k]} for k in ("ops", "syncs")
            }
        if w1 and w4:
            out[f"{parallel}_w4_vs_w1"] = {
                k: {"w4": w4[k], "w1": w1[k], "ratio": (w4[k] / w1[k]) if w1[k] else None,
                    "reached": w4[k] <= 1.2 * w1[k]} for k in ("ops", "syncs")
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=23, help=f"training steps of every run (> {REFINE_STEP + 1})")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4], help="distsplat process counts")
    parser.add_argument("--data", type=Path, default=REPO / "scenes" / "lund_door")
    parser.add_argument("--only", nargs="*", default=None, help="run names to run (default: all)")
    parser.add_argument("--out", type=Path, default=None, help="JSON file (default: benchmarks/results/host_cost_<scene>_<date>.json)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.worker:
        worker(args.report, args.method, rest[1:] if rest[:1] == ["--"] else rest)
        return
    if args.steps <= REFINE_STEP + 1:
        raise SystemExit(f"--steps must be > {REFINE_STEP + 1} (the densification step is {REFINE_STEP}); got {args.steps}")
    out_path = args.out or REPO / "benchmarks" / "results" / f"host_cost_{args.data.name}_{time.strftime('%Y-%m-%d')}.json"
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="host_cost_") as tmp:
        for name, method, world_size, parallel in run_specs(args.worlds):
            if args.only and name not in args.only:
                continue
            t0 = time.perf_counter()
            runs[name] = summarise_run(run_one(name, method, world_size, parallel, args.steps, args.data, Path(tmp)))
            runs[name].update(method=method, world_size=world_size, parallel=parallel, batch_size=world_size if method == "distsplat" else 1)
            m = runs[name]["per_rank_max"]
            print(f"{name}: ops {m['ops']:.0f}, syncs {m['syncs']:.0f}, collectives {m['collectives']:.0f} "
                  f"({m['collective_bytes']:.0f} B) per step per rank (max over ranks; {time.perf_counter() - t0:.0f} s)", flush=True)
            shutil.rmtree(Path(tmp) / "runs", ignore_errors=True)
    out = {
        "benchmark": "bench_host_cost",
        "what": "per training step and rank: ATen ops and host syncs outside the rasterizer, collectives and bytes; CPU, reference renderer",
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join(["python", "benchmarks/bench_host_cost.py", *sys.argv[1:]]),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "scene": str(args.data),
        "steps": args.steps,
        "refine_step": REFINE_STEP,
        "sync_ops": sorted(SYNC_OPS) + ["index/index_put_ with a bool mask", "repeat_interleave(tensor repeats)",
                                        "Tensor.tolist/numpy/cpu"],
        "view_ops": sorted(VIEW_OPS),
        "targets": targets(runs) if "splatfacto_w1" in runs else {},
        "runs": runs,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out["targets"], indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
