"""Rank functions for the lifecycle tests (module level: they are pickled into spawned ranks)."""

from __future__ import annotations

import errno
import time

from distsplat_ns.distributed.torch_compat import store_has_key, store_set
from distsplat_ns.utils.errors import RunFailure


def agreed_failed_save(ctx) -> str:
    """Rank 0's "save" fails with a full disk; every rank returns what it raised."""
    from distsplat_ns.distributed.lifecycle import agree_outcome

    def save() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", "/ckpt/step-000000010.ckpt")

    try:
        agree_outcome(ctx, "writing checkpoint step-000000010.ckpt", save)
    except RunFailure as err:
        return f"RunFailure: {err}"
    return "no error"


def agreed_successful_save(ctx) -> object:
    from distsplat_ns.distributed.lifecycle import agree_outcome

    return agree_outcome(ctx, "writing", lambda: "written")


def stuck_in_phase(ctx, phase: str, sleep_s: float, timeout_s: float) -> tuple:
    """Rank 1 sleeps inside ``phase`` past ``timeout_s``; returns (what this rank raised, seconds)."""
    from distsplat_ns.distributed.lifecycle import startup_phase

    t0 = time.monotonic()
    try:
        with startup_phase(ctx, phase, timeout_s=timeout_s):
            if ctx.rank == 1:
                time.sleep(sleep_s)
    except RunFailure as err:
        return f"RunFailure: {err}", time.monotonic() - t0
    except RuntimeError as err:  # rank 1 wakes after rank 0, which hosts the store, has gone
        return f"{type(err).__name__}", time.monotonic() - t0
    return "no error", time.monotonic() - t0


def collective_timeout_in_phase(ctx) -> str:
    """Rank 0 enters a collective (3 s gloo timeout) inside the phase; rank 1 stays out of it until
    that timeout has ended it (rank 0 then sets a store key), up to 60 s."""
    import datetime

    import torch
    import torch.distributed as dist

    from distsplat_ns.distributed.lifecycle import startup_phase

    store = dist.distributed_c10d._get_default_store()
    short = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=3))
    try:
        with startup_phase(ctx, "pipeline setup"):
            if ctx.rank == 1:
                deadline = time.monotonic() + 60
                while not store_has_key(store, "test/rank0-gave-up") and time.monotonic() < deadline:
                    time.sleep(0.1)
                return "waited"
            dist.all_reduce(torch.zeros(1), group=short)
    except RunFailure as err:
        store_set(store, "test/rank0-gave-up", "1")
        time.sleep(1.0)  # rank 0 hosts the store: let rank 1 see the key
        return f"RunFailure: {err}"
    except RuntimeError as err:  # rank 1 after rank 0 (which hosts the store) has gone
        return f"{type(err).__name__}"
    return "no error"


def stop_flag_agreement(ctx, stopping_rank: int) -> bool:
    from distsplat_ns.distributed.lifecycle import any_rank_true

    return any_rank_true(ctx, ctx.rank == stopping_rank)


def trainer_identity(ctx, out: str) -> dict:
    """Build a DistSplatTrainer from a config with this rank's own timestamp and seed."""
    from nerfstudio.configs.base_config import MachineConfig

    from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainer, DistSplatTrainerConfig

    config = DistSplatTrainerConfig(
        method_name="distsplat",
        output_dir=out,
        experiment_name="it",
        timestamp=f"t{ctx.rank}",
        machine=MachineConfig(device_type="cpu", seed=100 + ctx.rank),
    )
    trainer = DistSplatTrainer(config)
    return {
        "config_timestamp": config.timestamp,
        "config_seed": config.machine.seed,
        "seed": trainer.seed,
        "base_dir": trainer.base_dir.name,
        "checkpoint_dir": str(trainer.checkpoint_dir.relative_to(trainer.base_dir)),
    }


def working_outside_collectives(ctx) -> str:
    """Rank 1 stays busy (polling the store, never in a collective) inside a watched phase whose
    threshold is 1 s (half of 2 s); rank 0 waits in an all_reduce until its 4 s gloo timeout."""
    import datetime

    import torch
    import torch.distributed as dist

    from distsplat_ns.distributed.lifecycle import enter_phase

    store = dist.distributed_c10d._get_default_store()
    short = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=4))
    enter_phase(ctx, "pipeline setup", timeout_s=2.0)
    if ctx.rank == 1:
        deadline = time.monotonic() + 60
        while not store_has_key(store, "test/rank0-gave-up") and time.monotonic() < deadline:
            time.sleep(0.1)
        return "waited"
    try:
        dist.all_reduce(torch.zeros(1), group=short)
    except RuntimeError:
        where = store.get("distsplat/where/1").decode() + " | " + store.get("distsplat/where/0").decode()
        store_set(store, "test/rank0-gave-up", "1")
        time.sleep(1.0)  # rank 0 hosts the store: let rank 1 see the key
        return where
    return "no error"


def slow_rank0_work(ctx, work_s: float) -> tuple:
    """Rank 0 works ``work_s`` (longer than the collective timeout) alone; then every rank joins an
    all-reduce. Returns (the sum, seconds this rank waited)."""
    import torch
    import torch.distributed as dist

    from distsplat_ns.distributed.rank0_work import rank0_work

    t0 = time.monotonic()
    with rank0_work(ctx, "evaluating after step 0"):
        if ctx.rank == 0:
            time.sleep(work_s)
    value = torch.ones(1)
    dist.all_reduce(value)
    return float(value.item()), time.monotonic() - t0


def rank0_dies_in_its_work(ctx, out: str) -> str:
    """Rank 0 (which hosts the store here) exits in the middle of its own work; rank 1 writes what
    it raised and how long it waited to ``out`` (rank 0 never reports: run_ranks then fails)."""
    import os
    from pathlib import Path

    from distsplat_ns.distributed.rank0_work import rank0_work

    t0 = time.monotonic()
    try:
        with rank0_work(ctx, "writing checkpoint step-000000005.ckpt"):
            if ctx.rank == 0:
                time.sleep(1.0)
                os._exit(0)
        result = "no error"
    except RunFailure as err:
        result = f"RunFailure: {err}"
    Path(out).write_text(f"{time.monotonic() - t0:.2f}\n{result}")
    return result


def repeated_init_and_shutdown(ctx, root: str, cycles: int) -> int:
    """Shut the group down, then ``cycles`` times: a new gloo group (file store under ``root``),
    collectives whose tensors are temporaries, :func:`shutdown_distributed`. Returns the cycles done."""
    import torch
    import torch.distributed as dist

    from distsplat_ns.distributed.context import shutdown_distributed

    shutdown_distributed()
    for cycle in range(cycles):
        dist.init_process_group(
            "gloo", init_method=f"file://{root}/cycle{cycle}", rank=ctx.rank, world_size=ctx.world_size
        )
        for _ in range(3):
            dist.all_reduce(torch.ones(4))
            dist.all_gather_object([None] * ctx.world_size, {"rank": ctx.rank})
        shutdown_distributed()
    return cycles
