"""A training step's host cost outside the rasterizer, the GPU proxy (issue 28, item 3).

Per training step and per rank, for distsplat at W = 1, 2, 4 processes in both parallel modes and
for nerfstudio's ``splatfacto`` at W = 1, all on distsplat's pure-PyTorch reference renderer:

* **ATen operators** dispatched outside the rasterizer: on a GPU nearly every one is a kernel
  launch. Counted with a ``TorchDispatchMode`` (forward, backward, optimizer, refinement, checks:
  everything between the opening and closing of nerfstudio's ``ITER_TRAIN_TIME`` timer, which both
  trainers open around a step, splatfacto's densification callbacks included). Only the ``aten``
  namespace (profiler markers and ``c10d`` ops are listed apart, ``other_ops_by_name``);
  ``non_view_ops`` also leaves out the operators that only make a view (``VIEW_OPS``), which
  launch nothing, and ``non_view_ops_by_site`` says which caller dispatched each (``view_ops_by_site``
  the same for the views);
  ``device_ops`` leaves out as well the non-view operators on tensors a GPU run keeps on the
  host (``HOST_SIDE_OP_SITES``; ``host_side_ops_by_site``): the kernel launches.
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

Usage (one run at a time; about 15 minutes on 2 cores)::

    python -m benchmarks.bench_host_cost [--steps 23] [--worlds 1 2 4] \
        [--data scenes/lund_door] [--out benchmarks/results/host_cost_lund_door_DATE.json]

Each distsplat run trains B = W images per step (one image per rank, the per-rank work of W = 1);
``--steps`` steps (23), refinement every 6 steps after 3 (one densification step, step 18, counted
apart). Steady state: the median over steps 13.. except the densification step.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    REPO,
    child_env,
    finish_machine_record,
    load_script,
    machine_record,
    result_path,
    run_command,
    train_command,
    write_json,
)
from benchmarks.host_cost_counters import SYNC_OPS, VIEW_OPS, worker

REFINE_EVERY_STEPS = 6
"""Refinement every 6 steps after a warm-up of 3 (both as images in distsplat: B per step)."""
REFINE_STEP = 18
"""The run's densification step, counted apart: the first multiple of 6 that gsplat's
``DefaultStrategy`` (and distsplat's same rule) does not skip as a pause after the opacity reset
(``step % reset_every >= num_train_images + refine_every``, 12 images here)."""
FIRST_STEADY_STEP = 13
"""The steps before are cold: distsplat's first epoch (a footprint prior for each camera not yet
measured: 12 steps at B = 1), logging at step 0."""


#: name -> (method, world size W, parallel mode or None)
def run_specs(worlds: list[int]) -> list[tuple[str, str, int, str | None]]:
    specs: list[tuple[str, str, int, str | None]] = [("splatfacto_w1", "splatfacto", 1, None)]
    for parallel in ("replicated", "sharded"):
        specs += [(f"distsplat_{parallel}_w{w}", "distsplat", w, parallel) for w in worlds]
    return specs


def ns_train_args(
    method: str, world_size: int, parallel: str | None, steps: int, data: Path, output_dir: Path
) -> list[str]:
    """Both methods: the scene at its shipped size, no eval, no save, refinement at step 6 only."""
    gpu_bench = load_script("gpu_bench")
    batch = world_size if method == "distsplat" else 1
    args = gpu_bench.ns_train_args(gpu_bench.RunSpec(method, method, batch, steps * batch), output_dir, data, "cpu")
    split = args.index("colmap")
    # Schedules count images in distsplat and steps in splatfacto: B images per step, so the same steps.
    extra = [
        "--pipeline.model.num-downscales",
        "0",
        "--pipeline.model.warmup-length",
        str(3 * batch),
        "--pipeline.model.refine-every",
        str(REFINE_EVERY_STEPS * batch),
    ]
    if parallel is not None:
        extra += ["--pipeline.parallel", parallel]
    return args[:split] + extra + args[split:]


def run_one(
    name: str, method: str, world_size: int, parallel: str | None, steps: int, data: Path, work: Path
) -> list[dict[str, Any]]:
    report = work / f"{name}.rank{{rank}}.json"
    args = ns_train_args(method, world_size, parallel, steps, data, work / "runs")
    cmd = train_command(
        ["--worker", "--report", str(report), "--method", method, "--", *args],
        world_size=world_size,
        module="benchmarks.bench_host_cost",
    )
    try:
        run_command(cmd, name=name, env=child_env(), timeout=3600)
        failure = None
    except RuntimeError as error:
        failure = str(error)
    reports = []
    for rank in range(world_size):
        path = Path(str(report).replace("{rank}", str(rank)))
        reports.append(json.loads(path.read_text()) if path.exists() else {"completed": False})
    if failure is not None or not all(r.get("completed") for r in reports):
        raise SystemExit(failure or f"{name}: a rank's report is missing or incomplete")
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
        "device_ops": statistics.median(
            sum(v for k, v in s["ops"].items() if k.split("::", 1)[1] not in VIEW_OPS) - _total(s["host_side_ops"])
            for s in steady
        ),
        "syncs": med("syncs"),
        "host_side_reads": med("host_side"),
        "collectives": med("collectives"),
        "collective_bytes": med("collective_bytes"),
        "excluded_renderer_ops": statistics.median(s["excluded_ops"] for s in steady),
        "refine_step": None
        if refine is None
        else {
            "step": REFINE_STEP,
            "ops": _total(refine["ops"]),
            "syncs": _total(refine["syncs"]),
            "collectives": _total(refine["collectives"]),
            "collective_bytes": _total(refine["collective_bytes"]),
        },
        "ops_per_step_all": [_total(s["ops"]) for s in steps],
        "syncs_per_step_all": [_total(s["syncs"]) for s in steps],
        "ops_by_name": by_name("ops"),
        "non_view_ops_by_site": by_name("ops_by_site"),
        "view_ops_by_site": by_name("view_ops_by_site"),
        "host_side_ops_by_site": by_name("host_side_ops"),
        "other_ops_by_name": by_name("other_ops"),
        "syncs_by_name": by_name("syncs"),
        "host_side_reads_by_name": by_name("host_side"),
        "host_side_reasons": report.get("host_side_reasons", {}),
        "collectives_by_name": by_name("collectives"),
        "collective_bytes_by_name": by_name("collective_bytes"),
    }


def summarise_run(reports: list[dict[str, Any]]) -> dict[str, Any]:
    ranks = [summarise_rank(r) for r in reports]
    keys = ("ops", "non_view_ops", "device_ops", "syncs", "collectives", "collective_bytes")
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
                k: {"distsplat": w1[k], "splatfacto": splat[k], "reached": w1[k] <= splat[k]}
                for k in ("ops", "device_ops", "syncs")
            }
        if w1 and w4:
            out[f"{parallel}_w4_vs_w1"] = {
                k: {
                    "w4": w4[k],
                    "w1": w1[k],
                    "ratio": (w4[k] / w1[k]) if w1[k] else None,
                    "reached": w4[k] <= 1.2 * w1[k],
                }
                for k in ("ops", "device_ops", "syncs")
            }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=23, help=f"training steps of every run (> {REFINE_STEP + 1})")
    parser.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4], help="distsplat process counts")
    parser.add_argument("--data", type=Path, default=REPO / "scenes" / "lund_door")
    parser.add_argument("--only", nargs="*", default=None, help="run names to run (default: all)")
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON file (default: benchmarks/results/host_cost_<scene>_<date>.json)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--report", help=argparse.SUPPRESS)
    parser.add_argument("--method", help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args()
    if args.worker:
        worker(args.report, args.method, rest[1:] if rest[:1] == ["--"] else rest)
        return
    if args.steps <= REFINE_STEP + 1:
        raise SystemExit(
            f"--steps must be > {REFINE_STEP + 1} (the densification step is {REFINE_STEP}); got {args.steps}"
        )
    out_path = args.out or result_path(f"host_cost_{args.data.name}")
    machine = machine_record()
    runs: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="host_cost_") as tmp:
        for name, method, world_size, parallel in run_specs(args.worlds):
            if args.only and name not in args.only:
                continue
            t0 = time.perf_counter()
            runs[name] = summarise_run(run_one(name, method, world_size, parallel, args.steps, args.data, Path(tmp)))
            runs[name].update(
                method=method,
                world_size=world_size,
                parallel=parallel,
                batch_size=world_size if method == "distsplat" else 1,
            )
            m = runs[name]["per_rank_max"]
            print(
                f"{name}: ops {m['ops']:.0f} (device {m['device_ops']:.0f}), syncs {m['syncs']:.0f}, collectives {m['collectives']:.0f} "
                f"({m['collective_bytes']:.0f} B) per step per rank (max over ranks; {time.perf_counter() - t0:.0f} s)",
                flush=True,
            )
            shutil.rmtree(Path(tmp) / "runs", ignore_errors=True)
    out = {
        "benchmark": "bench_host_cost",
        "what": "per training step and rank: ATen ops and host syncs outside the rasterizer, collectives and bytes; CPU, reference renderer",
        "command": " ".join(["python -m benchmarks.bench_host_cost", *sys.argv[1:]]),
        "machine": finish_machine_record(machine),
        "scene": str(args.data),
        "steps": args.steps,
        "refine_step": REFINE_STEP,
        "sync_ops": sorted(SYNC_OPS)
        + ["index/index_put_ with a bool mask", "repeat_interleave(tensor repeats)", "Tensor.tolist/numpy/cpu"],
        "view_ops": sorted(VIEW_OPS),
        "targets": targets(runs) if "splatfacto_w1" in runs else {},
        "runs": runs,
    }
    write_json(out_path, out)
    print(json.dumps(out["targets"], indent=1))
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
