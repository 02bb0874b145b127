"""``python -m benchmarks.bench_sharded --memory``: peak RSS, model bytes, eval and save time per rank at scale.

Runs (each through this module's :func:`train_timing_saves`, ``python -m
benchmarks.bench_sharded_memory ns-train <ns-train arguments>``, so every save is timed and, after
the run summary, the gathered save of the same model too): replicated W = 1 and sharded W = 2 (and
replicated W = 2 with ``--with-replicated-w2``) at ``--num-random`` Gaussians, and the same at
``--base-random`` Gaussians for the fixed base of each process. From them: the issue's targets
(issue 18, "What must be shown") and the memory formula of README.md ("Memory per rank"),
predicted against measured. Only called from ``bench_sharded.py``.

The timed ns-train (plain or under torchrun) writes ``save_timing_rank<R>.json`` into the run folder:

- ``save_s``: seconds in each ``save_checkpoint`` (sharded: every rank writing its DCP shard),
- ``consolidate_s``: seconds rank 0 spent writing the params-only ``step-N.ckpt`` (sharded),
- ``peak_rss_after_save_bytes`` / ``peak_rss_after_consolidate_bytes``: this rank's peak RSS so far
  after each save and each consolidation (where in the run's end the peak was reached),
- ``gathered_save_s``: after the summary (so its peak RSS is not in it), the save the sharded mode
  made before DCP -- the whole state gathered to rank 0 (``parallel/full_state.py:gather_full_state``)
  and written as one file (``checkpoint.save_checkpoint_atomic``) into ``<run>/gathered_save/`` --
  with ``peak_rss_after_gathered_save_bytes`` (``ru_maxrss`` of this rank's process, children
  excluded, after it).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from benchmarks.common import REPO, finish_machine_record, machine_record
from benchmarks.projection_live_bytes import live_bytes
from distsplat_ns.parallel.camera_groups import BUDGET_FRACTION, LIVE_ITEMS_PER_CAMERA_GAUSSIAN, group_size

SCENE = REPO / "scenes" / "lund_door"
MODULE = "benchmarks.bench_sharded_memory"
"""Run as ``python -m MODULE ns-train ...``: ns-train with every save timed."""
ITEM_BYTES = 4  # float32 parameters

#: Per Gaussian and SH degree 3 (16 bases), float32 unless said (README.md, "Memory per rank"):
#: parameters 3 means + 3 log-scales + 4 quats + 1 opacity logit + 3 DC + 45 SH rest = 59 items.
PARAM_ITEMS = 3 + 3 + 4 + 1 + 3 + 15 * 3
#: parameters, their gradients, Adam's two moments; densification statistics (grad2d, count,
#: radii: 3 x float32); the global id (int64).
STATE_BYTES_PER_GAUSSIAN = 4 * PARAM_ITEMS * ITEM_BYTES + 3 * 4 + 8
#: The initial draw's peak (``gaussians/initial.py``), measured by ``benchmarks/bench_initial_draw.py`` (git history, 891dfe8) at 2M
#: (benchmarks/results/initial_draw.json): per Gaussian drawn whole (one process, a replicated rank), and,
#: sharded, per Gaussian of all N (positions, random streams, the neighbour search) and of the rank's block.
INIT_WHOLE_BYTES_PER_GAUSSIAN = 328
INIT_ALL_BYTES_PER_GAUSSIAN = 76
INIT_BLOCK_BYTES_PER_GAUSSIAN = 277
#: Channels rank 0 holds per eval pixel: rgb 3, depth 1, accumulation 1, the ground truth 3.
EVAL_IMAGE_CHANNELS = 8


def _image_pixels() -> int:
    first = min((SCENE / "images").glob("*.JPG"))
    with Image.open(first) as image:
        width, height = image.size
    return width * height


def _available_bytes() -> int:
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def predicted_peak_rss_bytes(
    base: int, num: int, world: int, batch: int, group: int, mode: str, projection_bytes: float
) -> dict[str, int]:
    """README.md's formula, term by term: the base, the training state of the rank's Gaussians,
    the live projections (``projection_bytes`` per (camera, Gaussian); one group of cameras,
    sharded; the rank's B / W images, replicated), the gradients backward makes of them (as many
    bytes: each saved intermediate's gradient has its shape), and the initial draw (whole, or
    a sharded rank's block beside every position). ``peak`` is the base plus the larger of the training phase and the initial
    phase; Adam's temporaries, received rows and the rasterizer's intersection lists are not in
    it (README.md, "Memory per rank")."""
    local = -(-num // world) if mode == "sharded" else num
    cameras = group if mode == "sharded" else -(-batch // world)
    state = local * STATE_BYTES_PER_GAUSSIAN
    projections = int(local * cameras * projection_bytes)
    sharded = mode == "sharded" and world > 1
    init = (
        num * INIT_ALL_BYTES_PER_GAUSSIAN + local * INIT_BLOCK_BYTES_PER_GAUSSIAN
        if sharded
        else num * INIT_WHOLE_BYTES_PER_GAUSSIAN
    )
    return {
        "base": base,
        "state": state,
        "projections": projections,
        "backward_gradients": projections,
        "initial_draw": init,
        "peak": base + max(state + 2 * projections, init),
    }


def _run(args: Any, ns_train: Callable[..., dict[str, Any]], mode: str, world: int, num: int) -> dict[str, Any]:
    name = f"{mode}_w{world}_n{num}"
    extra = [
        "--pipeline.parallel",
        mode,
        "--pipeline.batch-size",
        str(args.batch),
        "--pipeline.model.random-init",
        "True",
        "--pipeline.model.num-random",
        str(num),
        "--pipeline.model.stop-split-at",
        "0",
        "--pipeline.model.num-downscales",
        "0",
    ]
    available = _available_bytes()
    stats = ns_train(args.work, name, args.steps * args.batch, world, extra, timeout=3 * 3600, module=MODULE)
    run_dir = args.work / "bench" / "distsplat" / name
    timing = [json.loads((run_dir / f"save_timing_rank{r}.json").read_text()) for r in range(world)]
    # The figures are read: the run's checkpoints go (a run set writes ~2.3 GB per 1M Gaussians), so one
    # at 4M does not fill the disk; the summary and timing files stay.
    for written in ("nerfstudio_models", "gathered_save"):
        shutil.rmtree(run_dir / written, ignore_errors=True)
    per_rank = stats["per_rank"]
    budget = int(BUDGET_FRACTION * available)
    return {
        "mode": mode,
        "world_size": world,
        "batch_size": args.batch,
        "steps": stats["steps"],
        "num_random": num,
        "gaussians": stats["final_gaussian_count"],
        "local_gaussians_per_rank": [r["local_gaussian_count"] for r in per_rank],
        "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in per_rank],
        "model_bytes_per_rank": [r["parameter_bytes"] + r["optimizer_state_bytes"] for r in per_rank],
        "evals": len(stats["eval_psnr_history"]),
        "eval_render_s_per_rank": [r["eval_render_s"] for r in per_rank],
        "checkpoint_bytes_written_per_rank": [r["checkpoint_bytes_written"] for r in per_rank],
        "save_s_per_rank": [t["save_s"] for t in timing],
        "consolidate_s_rank0": timing[0]["consolidate_s"],
        "peak_rss_after_save_bytes_per_rank": [t.get("peak_rss_after_save_bytes") for t in timing],
        "peak_rss_after_consolidate_bytes_rank0": timing[0].get("peak_rss_after_consolidate_bytes"),
        "gathered_save_s_per_rank": [t.get("gathered_save_s") for t in timing],
        "peak_rss_after_gathered_save_bytes_per_rank": [t.get("peak_rss_after_gathered_save_bytes") for t in timing],
        "available_bytes_at_launch": available,
        "camera_group": group_size(budget, num, world, ITEM_BYTES, args.batch) if mode == "sharded" else None,
        "step_time_s": stats["wall_time_s"] / max(stats["steps"], 1),
        "command_wall_s": stats["command_wall_s"],
    }


def _targets(by: dict[tuple[str, int, int], dict[str, Any]], num: int, base_num: int, pixels: int) -> dict[str, Any]:
    one, sh = by[("replicated", 1, num)], by[("sharded", 2, num)]
    base_one = by[("replicated", 1, base_num)]["peak_rss_bytes_per_rank"][0]
    base_two = max(by[("sharded", 2, base_num)]["peak_rss_bytes_per_rank"])
    rss_one, rss_two = one["peak_rss_bytes_per_rank"][0], sh["peak_rss_bytes_per_rank"]
    ratio = max(rss_two) / rss_one
    eval_image_bytes = pixels * EVAL_IMAGE_CHANNELS * 4
    others = max(rss_two[1:])
    allowed = eval_image_bytes + 0.10 * others
    dcp_s = max(s[-1] for s in sh["save_s_per_rank"])
    gathered_s = max(sh["gathered_save_s_per_rank"])
    return {
        "largest_rank_peak_rss_w2_over_w1": ratio,
        "target_rss_ratio": 0.65,
        "rss_ratio_reached": ratio <= 0.65,
        "base_rss_bytes_w1": base_one,
        "base_rss_bytes_w2_largest_rank": base_two,
        "above_base_w2_over_w1": (max(rss_two) - base_two) / max(rss_one - base_one, 1),
        "rank0_minus_largest_other_bytes": rss_two[0] - others,
        "rank0_allowed_excess_bytes": allowed,
        "eval_image_bytes": eval_image_bytes,
        "rank0_excess_reached": rss_two[0] - others <= allowed,
        "dcp_save_wall_s_w2": dcp_s,
        "gathered_save_wall_s_w2": gathered_s,
        "dcp_over_gathered_save": dcp_s / gathered_s,
        "consolidate_s_w2": sh["consolidate_s_rank0"][-1] if sh["consolidate_s_rank0"] else None,
    }


def _predictions(by: dict[tuple[str, int, int], dict[str, Any]], base_num: int, batch: int) -> list[dict[str, Any]]:
    # SH degree 0 throughout: the runs see fewer than sh_degree_interval (1000) images.
    live_bytes(1_000, 1, 0)  # a first projection in the process once counted 16 B more per (camera, Gaussian)
    counted = live_bytes(100_000, 2, 0) - live_bytes(100_000, 1, 0)
    projection_bytes = counted / 100_000
    out = []
    for (mode, world, num), run in sorted(by.items()):
        if num == base_num:
            continue
        base = max(by[(mode if world > 1 else "replicated", world, base_num)]["peak_rss_bytes_per_rank"])
        group = run["camera_group"] if mode == "sharded" else -(-batch // world)  # replicated: the rank's own images
        terms = predicted_peak_rss_bytes(base, num, world, batch, group, mode, projection_bytes)
        # The budget's items already count the backward's factor 2, which the formula applies itself.
        estimate = predicted_peak_rss_bytes(
            base, num, world, batch, group, mode, LIVE_ITEMS_PER_CAMERA_GAUSSIAN * ITEM_BYTES / 2
        )
        measured = max(run["peak_rss_bytes_per_rank"])
        local = max(run["local_gaussians_per_rank"])
        out.append(
            {
                "mode": mode,
                "world_size": world,
                "num_random": num,
                "batch_size": batch,
                "camera_group": group,
                "projection_bytes_counted": projection_bytes,
                "predicted": terms,
                "predicted_with_camera_groups_estimate": estimate["peak"],
                "measured_largest_rank": measured,
                "measured_over_predicted": measured / terms["peak"],
                "unexplained_bytes_per_local_gaussian": (measured - terms["peak"]) / local,
            }
        )
    return out


def analyse(runs: list[dict[str, Any]], base_num: int, num: int, batch: int) -> dict[str, Any]:
    """The targets and the formula check of a run set (``--reanalyse`` recomputes them from a
    written JSON's runs)."""
    by = {(r["mode"], r["world_size"], r["num_random"]): r for r in runs}
    pixels = _image_pixels()
    return {
        "image_pixels": pixels,
        "targets": _targets(by, num, base_num, pixels),
        "formula": _predictions(by, base_num, batch),
    }


def memory_benchmark(args: Any, ns_train: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    """All runs, then the targets and the formula check; the JSON ``bench_sharded.py`` writes."""
    plan = [("replicated", 1), ("sharded", 2)] + ([("replicated", 2)] if args.with_replicated_w2 else [])
    base_plan = [("replicated", 1), ("sharded", 2)] + ([("replicated", 2)] if args.with_replicated_w2 else [])
    machine = machine_record()
    runs = [_run(args, ns_train, mode, world, args.base_random) for mode, world in base_plan]
    runs += [_run(args, ns_train, mode, world, args.num_random) for mode, world in plan]
    return {
        "command": "nice -n 10 python -m benchmarks.bench_sharded " + " ".join(sys.argv[1:]),
        "scene": "scenes/lund_door (random initialisation)",
        "num_random": args.num_random,
        "base_random": args.base_random,
        "batch_size": args.batch,
        "machine": finish_machine_record(machine),
        "state_bytes_per_gaussian": STATE_BYTES_PER_GAUSSIAN,
        "runs": runs,
        **analyse(runs, args.base_random, args.num_random, args.batch),
    }


def reanalyse(path: Path) -> dict[str, Any]:
    """``path``'s JSON with its targets and formula check recomputed from its runs."""
    result = json.loads(path.read_text())
    if "num_random" not in result:  # written before these keys existed: the run set says them
        nums = sorted({r["num_random"] for r in result["runs"]})
        result.update(num_random=nums[-1], base_random=nums[0], batch_size=result["runs"][0]["batch_size"])
    result.pop("projection_bytes_per_camera_gaussian", None)
    result.update(analyse(result["runs"], result["base_random"], result["num_random"], result["batch_size"]))
    result["reanalysed"] = {
        "command": "python -m benchmarks.bench_sharded --reanalyse " + str(path.name),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    return result


# ----------------------------------------------------------------------------- the timed ns-train (one rank)
def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def _gathered_save(trainer, step: int) -> float:
    """The pre-DCP save of the whole state through rank 0; returns its wall seconds on this rank.

    **Collective:** world group: the gather (``gather_full_state``), one barrier before it (so the
    clocks start together) and the outcome broadcast (``agree_outcome``).
    """
    import torch.distributed as dist

    from distsplat_ns.checkpoint import save_checkpoint_atomic
    from distsplat_ns.distributed.lifecycle import agree_outcome

    ctx = trainer.ctx
    if ctx.is_distributed:
        dist.barrier()
    start = time.perf_counter()
    gathered = trainer.pipeline.mode.gather_full_state(trainer.optimizers.optimizers)

    def write() -> Path:
        state = trainer.pipeline.state_dict()
        if gathered is not None:
            state = gathered.merged_into(state)
        return save_checkpoint_atomic(
            checkpoint_dir=trainer.base_dir / "gathered_save",
            step=step,
            pipeline_state=state,
            optimizers=trainer.optimizers,
            scalers=trainer.grad_scaler.state_dict(),
            extra={"world_size": ctx.world_size},
            keep_only_latest=True,
            optimizer_states=None if gathered is None else gathered.optimizers,
        )

    agree_outcome(ctx, f"writing the gathered benchmark save of step {step}", write)
    return time.perf_counter() - start


def train_timing_saves(ns_train_args: list[str]) -> None:
    """One rank: ns-train with its saves timed (``save_timing_rank<R>.json``, see the module docstring)."""
    from distsplat_ns.parallel import shard_checkpoint

    timings: dict[str, list[float]] = {
        "save_s": [],
        "consolidate_s": [],
        "peak_rss_after_save_bytes": [],
        "peak_rss_after_consolidate_bytes": [],
    }
    original_consolidate = shard_checkpoint.consolidate_params

    def timed_consolidate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original_consolidate(*args, **kwargs)
        finally:
            timings["consolidate_s"].append(time.perf_counter() - start)
            timings["peak_rss_after_consolidate_bytes"].append(_peak_rss_bytes())

    shard_checkpoint.consolidate_params = timed_consolidate  # before any module imports the name
    from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainer

    original_save, original_write_stats = DistSplatTrainer.save_checkpoint, DistSplatTrainer._write_stats

    def timed_save(self, step: int) -> None:
        start = time.perf_counter()
        try:
            original_save(self, step)
        finally:
            timings["save_s"].append(time.perf_counter() - start)
            timings["peak_rss_after_save_bytes"].append(_peak_rss_bytes())

    def write_stats_then_gathered_save(self) -> None:
        original_write_stats(self)
        record = {**timings, "peak_rss_at_summary_bytes": _peak_rss_bytes()}
        if self.pipeline.mode.writes_shards:
            record["gathered_save_s"] = _gathered_save(self, self.step)
            record["peak_rss_after_gathered_save_bytes"] = _peak_rss_bytes()
        (self.base_dir / f"save_timing_rank{self.ctx.rank}.json").write_text(json.dumps(record, indent=2))

    DistSplatTrainer.save_checkpoint = timed_save
    DistSplatTrainer._write_stats = write_stats_then_gathered_save
    from nerfstudio.scripts.train import entrypoint

    sys.argv = ["ns-train", *ns_train_args]
    entrypoint()


def main() -> None:
    if sys.argv[1:2] != ["ns-train"]:
        raise SystemExit(
            "usage: python -m benchmarks.bench_sharded_memory ns-train <ns-train arguments> (the benchmark: python -m benchmarks.bench_sharded --memory)"
        )
    train_timing_saves(sys.argv[2:])


if __name__ == "__main__":
    main()
