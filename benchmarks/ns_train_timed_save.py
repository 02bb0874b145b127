"""ns-train that times its checkpoint writes and, after the run summary is written, the gathered
save on the same model (for ``bench_sharded.py --memory``).

Usage (plain or under torchrun): ``ns_train_timed_save.py <ns-train arguments>``. Each rank writes
``save_timing_rank<R>.json`` into the run folder:

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
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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


def main() -> None:
    from distsplat_ns.parallel import shard_checkpoint

    timings: dict[str, list[float]] = {"save_s": [], "consolidate_s": [], "peak_rss_after_save_bytes": [], "peak_rss_after_consolidate_bytes": []}
    original_consolidate = shard_checkpoint.consolidate_params

    def timed_consolidate(*args, **kwargs):
        start = time.perf_counter()
        try:
            return original_consolidate(*args, **kwargs)
        finally:
            timings["consolidate_s"].append(time.perf_counter() - start)
            timings["peak_rss_after_consolidate_bytes"].append(_peak_rss_bytes())

    shard_checkpoint.consolidate_params = timed_consolidate  # before any module imports the name
    from distsplat_ns.trainer import DistSplatTrainer

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

    entrypoint()


if __name__ == "__main__":
    main()
