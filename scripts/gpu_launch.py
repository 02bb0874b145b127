"""`ns-train` with benchmark instrumentation, for scripts/gpu_bench.py (docs/gpu.md).

Runs nerfstudio's own `ns-train` entry point (`nerfstudio.scripts.train.entrypoint`) unchanged,
after applying a few clearly labelled run-time patches that make `splatfacto` and `distsplat` runs
measurable in the same way on the bare, offline CUDA machine. Nothing here changes what either
method computes.

Usage (the options before `--` are this launcher's, the rest go to ns-train)::

    python scripts/gpu_launch.py --report R.json [--final-eval] -- \
        splatfacto --max-num-iterations 100 ... colmap --data DIR ...
    torchrun --nproc_per_node 2 scripts/gpu_launch.py --report R.json -- distsplat ...

Patches (each one recorded under "patches" in the report):

* ``timing``: the `TimeWriter` around each training iteration (`EventName.ITER_TRAIN_TIME`; both
  nerfstudio's `Trainer.train` and `DistSplatTrainer.train` time their step with it, including the
  before/after-iteration callbacks where splatfacto densifies) synchronises CUDA when it opens and
  closes, and every duration is kept. Without the synchronisation a step's time would be the time
  to *enqueue* its kernels, and the two methods sync at different places.
* ``lpips_offline_stub`` (only when AlexNet's weights are not in the torch hub cache): splatfacto
  builds torchmetrics' LPIPS in `populate_modules`, which downloads AlexNet's weights and fails with
  no network (docs/gpu.md). The class is replaced by a stub that returns NaN;
  PSNR and SSIM are unaffected and LPIPS is reported as not computed.
* ``final_eval`` (with ``--final-eval``): after nerfstudio's `Trainer.train` returns, the average
  metrics over all eval images are computed with the pipeline's own
  `get_average_eval_image_metrics` -- what `ns-eval` computes -- so splatfacto gets a final PSNR
  without a second process. distsplat writes its own (``final_eval_psnr`` in its stats JSON).
* ``count_ops`` (with ``--count-ops``): the ATen operators dispatched in each step are counted
  (``ops_per_step``, ``sync_ops_per_step``, ``ops_by_name``); a launch-overhead proxy that does not
  depend on the machine's load. It slows the steps: such a run is not timed for comparison.
* ``whole_run_peak``: ``torch.cuda.reset_peak_memory_stats`` first folds the allocator's peaks into
  the report's, so the peaks written at exit cover the whole run. distsplat's memory budget resets
  them at each densification event (distsplat_ns/gaussians/budget_measured.py), and without this
  ``max_memory_allocated`` at exit would cover only the time since the last event.
* ``cpu_reference_renderer`` (with ``--cpu-reference-renderer``, CPU only): splatfacto renders
  with distsplat's pure-PyTorch reference rasterizer and ``Tensor.cuda()`` is a no-op, so both
  methods run on a machine without CUDA through the same renderer (the CPU proxy of
  benchmarks/bench_step_overhead.py and of the dry run).

Two processes on one GPU need no patch: under torchrun, distsplat's ``--dist-backend auto`` picks
gloo when a host runs more ranks than it has GPUs, and ranks share GPUs round-robin
(``distsplat_ns/distributed/context.py``).

The report (JSON, one per process: ``{rank}`` in ``--report`` is replaced by the rank) holds the
per-step times, peak CUDA memory, final metrics and the patches applied. It is written at exit, also
when the run fails or is stopped with SIGTERM (then ``"completed": false``).
"""

from __future__ import annotations

import argparse
import atexit
import json
import math
import os
import signal
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPORT: dict[str, Any] = {
    "argv": [],
    "rank": 0,
    "world_size": 1,
    "completed": False,
    "patches": [],
    "step_times_s": [],
    "step_cpu_times_s": [],
    "final_eval": None,
    "peak_cuda_memory_allocated_bytes": None,
    "peak_cuda_memory_reserved_bytes": None,
    "peak_resets": 0,
    "cuda_device": None,
    "error": None,
    "process_wall_s": None,
}
_T0 = time.perf_counter()
_REPORT_PATH: Path | None = None
_PEAKS_BEFORE_RESETS = {"allocated": 0, "reserved": 0}
"""The largest peaks ``torch.cuda`` reported just before a ``reset_peak_memory_stats`` (``patch_whole_run_peak``)."""


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split ``argv`` into this launcher's options and the ns-train arguments after ``--``.

    Raises:
        SystemExit: no ``--`` separator or no ns-train arguments (argparse's usage error).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", required=True, help="JSON report path; '{rank}' is replaced by the rank")
    parser.add_argument(
        "--final-eval", action="store_true", help="average eval metrics after nerfstudio's Trainer.train"
    )
    parser.add_argument("--count-ops", action="store_true", help="count ATen operators per step (slows the steps)")
    parser.add_argument(
        "--cpu-reference-renderer",
        action="store_true",
        help="CPU proxy: splatfacto renders with the reference rasterizer",
    )
    if "--" not in argv:
        parser.error("separate the ns-train arguments with '--'")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    rest = argv[split + 1 :]
    if not rest:
        parser.error("no ns-train arguments after '--'")
    return args, rest


def sanitize(value: Any) -> Any:
    """JSON-safe copy: NaN/inf become None, tensors and numpy scalars become Python numbers."""
    if isinstance(value, dict):
        return {str(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    if hasattr(value, "item") and callable(value.item) and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def write_report() -> None:
    if _REPORT_PATH is None:
        return
    REPORT["process_wall_s"] = time.perf_counter() - _T0
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.is_initialized():
            device = torch.cuda.current_device()
            REPORT["cuda_device"] = f"cuda:{device} {torch.cuda.get_device_name(device)}"
            REPORT["peak_cuda_memory_allocated_bytes"] = max(
                _PEAKS_BEFORE_RESETS["allocated"], int(torch.cuda.max_memory_allocated(device))
            )
            REPORT["peak_cuda_memory_reserved_bytes"] = max(
                _PEAKS_BEFORE_RESETS["reserved"], int(torch.cuda.max_memory_reserved(device))
            )
    except Exception as err:  # noqa: BLE001 -- the report must still be written
        REPORT["error"] = (REPORT["error"] or "") + f"\nmemory query failed: {err!r}"
    _REPORT_PATH.parent.mkdir(parents=True, exist_ok=True)
    tmp = _REPORT_PATH.with_suffix(".tmp")
    tmp.write_text(json.dumps(sanitize(REPORT), indent=1))
    os.replace(tmp, _REPORT_PATH)


def _on_sigterm(signum: int, frame: Any) -> None:
    REPORT["error"] = f"stopped by signal {signum}"
    raise SystemExit(128 + signum)


def hook_step_timer(
    before_enter: Callable[[], None], before_exit: Callable[[], None], after_exit: Callable[[Any], None]
) -> None:
    """Run hooks around every training step: nerfstudio's ``TimeWriter(ITER_TRAIN_TIME)``, which
    both trainers open around each iteration. ``after_exit`` gets the timer (its ``duration`` set).
    Hooks installed later wrap those installed earlier."""
    from nerfstudio.utils import writer

    original_enter = writer.TimeWriter.__enter__
    original_exit = writer.TimeWriter.__exit__

    def is_step(timer: Any) -> bool:
        return timer.name in (writer.EventName.ITER_TRAIN_TIME, writer.EventName.ITER_TRAIN_TIME.value)

    def enter(self: Any) -> Any:
        if is_step(self):
            before_enter()
        return original_enter(self)

    def exit_(self: Any, *args: Any) -> Any:
        if is_step(self):
            before_exit()
        result = original_exit(self, *args)
        if is_step(self):
            after_exit(self)
        return result

    writer.TimeWriter.__enter__ = enter  # type: ignore[method-assign]
    writer.TimeWriter.__exit__ = exit_  # type: ignore[method-assign]


def patch_timing() -> None:
    """Synchronise CUDA around the ITER_TRAIN_TIME timer and keep every step's duration."""
    import torch

    def sync() -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()

    cpu_start: list[float] = []

    def start() -> None:
        sync()
        cpu_start.append(time.process_time())

    def record(timer: Any) -> None:
        REPORT["step_times_s"].append(float(timer.duration))
        # CPU seconds of this process (all its threads): unlike wall time, not stretched while
        # other jobs hold the cores -- the CPU proxy's steadier figure.
        REPORT["step_cpu_times_s"].append(time.process_time() - cpu_start.pop())

    hook_step_timer(start, sync, record)
    REPORT["patches"].append("timing: CUDA synchronised around each ITER_TRAIN_TIME step; every step's duration kept")


def patch_whole_run_peak() -> None:
    """Keep the allocator's peaks across ``torch.cuda.reset_peak_memory_stats``: each reset first adds
    the peaks so far to ``_PEAKS_BEFORE_RESETS``, which the report's peaks at exit include."""
    import torch

    original_reset = torch.cuda.reset_peak_memory_stats

    def reset_peak_memory_stats(device: Any = None) -> None:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            _PEAKS_BEFORE_RESETS["allocated"] = max(
                _PEAKS_BEFORE_RESETS["allocated"], int(torch.cuda.max_memory_allocated(device))
            )
            _PEAKS_BEFORE_RESETS["reserved"] = max(
                _PEAKS_BEFORE_RESETS["reserved"], int(torch.cuda.max_memory_reserved(device))
            )
        REPORT["peak_resets"] += 1
        original_reset(device)

    torch.cuda.reset_peak_memory_stats = reset_peak_memory_stats  # type: ignore[assignment]
    REPORT["patches"].append(
        "whole_run_peak: the peaks before each torch.cuda.reset_peak_memory_stats are kept; the report's cover the run"
    )


#: Operators whose output size depends on the data, or that read a value back: each one is a
#: host-device synchronisation on CUDA (on the CPU the proxy can only count them).
SYNC_OPS = ("_local_scalar_dense", "nonzero", "_unique2", "unique_dim", "unique_consecutive", "masked_select")


def patch_count_ops() -> None:
    """Count the ATen operators dispatched inside each ITER_TRAIN_TIME step (forward and backward).

    An operator is one kernel launch on a GPU (near enough), and the count does not depend on the
    machine's load: the CPU proxy of per-step launch overhead. Counting slows the step, so a run
    with ``--count-ops`` is not timed for comparison.
    """
    import collections

    from torch.utils._python_dispatch import TorchDispatchMode

    class CountOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts: collections.Counter = collections.Counter()

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            self.counts[func.overloadpacket.__name__] += 1
            return func(*args, **(kwargs or {}))

    totals: collections.Counter = collections.Counter()
    REPORT["ops_per_step"] = []
    REPORT["sync_ops_per_step"] = []
    REPORT["ops_by_name"] = {}
    active: list[CountOps] = []

    def start() -> None:
        active.append(CountOps())
        active[-1].__enter__()

    def stop() -> None:
        mode = active.pop()
        mode.__exit__(None, None, None)
        totals.update(mode.counts)
        REPORT["ops_per_step"].append(sum(mode.counts.values()))
        REPORT["sync_ops_per_step"].append(sum(mode.counts[name] for name in SYNC_OPS))
        REPORT["ops_by_name"] = dict(totals.most_common())

    hook_step_timer(start, stop, lambda timer: None)
    REPORT["patches"].append(
        "count_ops: ATen operators counted per ITER_TRAIN_TIME step (the run's times are not comparable)"
    )


def alexnet_weights_cached() -> bool:
    import torch

    checkpoints = Path(torch.hub.get_dir()) / "checkpoints"
    return any(checkpoints.glob("alexnet-*.pth"))


def patch_lpips_if_offline() -> None:
    """Replace torchmetrics' LPIPS by a NaN-returning stub when AlexNet's weights are not cached."""
    if alexnet_weights_cached():
        return
    import torch
    import torchmetrics.image.lpip as lpip_module

    class LpipsUnavailable(torch.nn.Module):
        """Stand-in for LearnedPerceptualImagePatchSimilarity on an offline machine: returns NaN."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()

        def forward(self, img1: torch.Tensor, img2: torch.Tensor) -> torch.Tensor:
            return torch.full((), float("nan"), device=img1.device)

    lpip_module.LearnedPerceptualImagePatchSimilarity = LpipsUnavailable  # type: ignore[misc,assignment]
    try:
        import torchmetrics.image as image_module

        image_module.LearnedPerceptualImagePatchSimilarity = LpipsUnavailable  # type: ignore[misc,assignment]
    except ImportError:
        pass
    REPORT["patches"].append(
        "lpips_offline_stub: torchmetrics LPIPS replaced by a NaN stub (AlexNet weights not cached, no network)"
    )


def patch_final_eval() -> None:
    """After nerfstudio's own Trainer.train returns, average the eval metrics over all eval images."""
    from nerfstudio.engine.trainer import Trainer

    original_train = Trainer.train

    def train(self: Any) -> None:
        original_train(self)
        t0 = time.perf_counter()
        metrics = self.pipeline.get_average_eval_image_metrics(step=self.step)
        REPORT["final_eval"] = {"step": int(self.step), "metrics": metrics, "eval_s": time.perf_counter() - t0}

    Trainer.train = train  # type: ignore[method-assign]
    REPORT["patches"].append("final_eval: average eval-image metrics after nerfstudio Trainer.train (as ns-eval)")


def patch_cpu_reference_renderer() -> None:
    """CPU proxy runs only: splatfacto renders with distsplat's pure-PyTorch reference rasterizer.

    splatfacto calls gsplat's CUDA-only ``rasterization`` and ``.cuda()`` (seed colours and the
    intrinsics, splatfacto.py in nerfstudio 1.1.5). With this patch both methods run on the CPU
    through the same renderer, so their step times differ only by what the methods do around it
    (benchmarks/bench_step_overhead.py). Refused when CUDA is available: GPU runs use gsplat.
    """
    import functools

    import torch

    if torch.cuda.is_available():
        raise SystemExit("--cpu-reference-renderer is for machines without CUDA; GPU runs use gsplat")
    import nerfstudio.models.splatfacto as splatfacto_module

    from distsplat_ns.rendering import rasterization

    splatfacto_module.rasterization = functools.partial(rasterization, backend="reference")

    def cuda_is_cpu(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self

    torch.Tensor.cuda = cuda_is_cpu  # type: ignore[method-assign,assignment]
    REPORT["patches"].append(
        "cpu_reference_renderer: splatfacto's rasterization is distsplat's reference renderer; Tensor.cuda() is a no-op (no CUDA here)"
    )


def main(argv: list[str] | None = None) -> None:
    global _REPORT_PATH
    args, ns_train_args = parse_args(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("RANK", "0"))
    REPORT["rank"] = rank
    REPORT["world_size"] = int(os.environ.get("WORLD_SIZE", "1"))
    REPORT["argv"] = ns_train_args
    _REPORT_PATH = Path(args.report.replace("{rank}", str(rank)))
    atexit.register(write_report)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        # nerfstudio's modules import each other in a cycle that only its entry point resolves:
        # import it first, patch after.
        from nerfstudio.scripts.train import entrypoint

        patch_timing()
        patch_whole_run_peak()
        patch_lpips_if_offline()
        if args.final_eval:
            patch_final_eval()
        if args.cpu_reference_renderer:
            patch_cpu_reference_renderer()
        if args.count_ops:
            patch_count_ops()
        sys.argv = ["ns-train", *ns_train_args]
        entrypoint()
        REPORT["completed"] = True
    except SystemExit as err:
        if err.code not in (0, None):
            REPORT["error"] = REPORT["error"] or f"SystemExit({err.code})"
            raise
        REPORT["completed"] = REPORT["error"] is None
    except BaseException as err:
        REPORT["error"] = f"{type(err).__name__}: {err}\n{traceback.format_exc()[-4000:]}"
        raise


if __name__ == "__main__":
    main()
