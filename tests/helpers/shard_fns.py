"""Models with optimizer and densification state, and the per-rank functions of the shard-state
tests (tests/unit/test_shard_state.py, tests/multiproc/test_shard_moves.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from distsplat_ns.distributed.collectives import all_gather_counts
from distsplat_ns.gaussians.checkpoint_keys import MODEL_EXTRA_KEY, MODEL_PREFIX
from distsplat_ns.parallel.full_state import gather_full_state, shard_loaded_checkpoint_
from distsplat_ns.parallel.shard_moves import rebalance_shards_
from tests.helpers.model_factory import take_initial_shard_

NUM_POINTS = 31  # odd, so no world size here splits it evenly
SEED = 3


def make_optimizers(model: Any) -> dict[str, torch.optim.Adam]:
    """One Adam per Gaussian parameter, as nerfstudio's ``Optimizers`` builds them."""
    return {name: torch.optim.Adam([p], lr=1e-3, eps=1e-15) for name, p in model.gauss_params.items()}


def adam_step(model: Any, optimizers: dict[str, torch.optim.Adam], num_total: int, step: int) -> None:
    """One optimizer step with gradients drawn per global id (the same whatever the sharding)."""
    for name, p in model.gauss_params.items():
        gen = torch.Generator().manual_seed(1000 * step + len(name))
        full = torch.randn((num_total, *p.shape[1:]), generator=gen, dtype=p.dtype)
        p.grad = full[model.gauss_ids.cpu()].to(p.device)
        optimizers[name].step()
        p.grad = None


def make_state_model(num_points: int = NUM_POINTS, with_optimizers: bool = True) -> tuple:
    """A model with two Adam steps taken and densification statistics filled (by global id).

    Returns:
        ``(model, optimizers)`` (optimizers None when ``with_optimizers`` is False).
    """
    from tests.helpers.model_factory import make_model

    model = make_model(batch_size=1, num_points=num_points, seed=SEED)
    if not with_optimizers:
        return model, None
    optimizers = make_optimizers(model)
    for step in range(2):
        adam_step(model, optimizers, num_points, step)
    gen = torch.Generator().manual_seed(SEED + 7)
    model.strategy_state["grad2d"] = torch.rand(num_points, generator=gen)
    model.strategy_state["count"] = torch.randint(0, 5, (num_points,), generator=gen).float()
    model.strategy_state["radii"] = torch.rand(num_points, generator=gen)
    return model, optimizers


def single_process_state(model: Any, optimizers: dict[str, torch.optim.Adam]) -> dict[str, Any]:
    """What one process holding the whole model saves: the Gaussians' pipeline entries, the
    model's extra state and every optimizer's state dict (copies: state dicts hold references)."""
    import copy

    pipeline = {f"{MODEL_PREFIX}{k}": v for k, v in model.state_dict().items() if k.startswith("gauss_params.")}
    pipeline[MODEL_EXTRA_KEY] = model.get_extra_state()
    return copy.deepcopy({"pipeline": pipeline, "optimizers": {k: o.state_dict() for k, o in optimizers.items()}})


def _shard_unevenly_(ctx: Any, model: Any, optimizers: Any) -> None:
    """Shuffle the rows (the same permutation on every rank), then keep an uneven share: rows
    whose shuffled position p has ``p % (W + 1) == r`` go to rank r, the last rank also taking
    ``p % (W + 1) == W`` (twice the others' share)."""
    num = int(model.gauss_params["means"].shape[0])
    perm = torch.randperm(num, generator=torch.Generator().manual_seed(11))
    rows = model.rows.bound(optimizers)
    rows.select_(perm)
    w = ctx.world_size
    owner = torch.clamp(torch.arange(num) % (w + 1), max=w - 1)
    rows.select_(torch.nonzero(owner == ctx.rank).squeeze(1))


def gather_rebalance_and_save(ctx: Any, checkpoint_dir: str | None) -> dict[str, Any]:
    """Shard unevenly, gather; rebalance, gather again; take one more Adam step and gather; on
    rank 0 write the rebalanced gathered state as a checkpoint (when ``checkpoint_dir`` is set)."""
    from distsplat_ns.checkpoint import save_checkpoint_atomic

    model, optimizers = make_state_model()
    _shard_unevenly_(ctx, model, optimizers)
    out: dict[str, Any] = {"sizes_before": int(model.gauss_params["means"].shape[0])}
    out["gathered"] = _comparable(gather_full_state(ctx, model, optimizers))
    out["moved"] = rebalance_shards_(ctx, model.rows.bound(optimizers))
    out["sizes_after"] = int(model.gauss_params["means"].shape[0])
    out["aligned"] = _optimizers_hold_params(model, optimizers)
    gathered = gather_full_state(ctx, model, optimizers)
    out["rebalanced"] = _comparable(gathered)
    if checkpoint_dir is not None and gathered is not None:
        pipeline = gathered.merged_into({f"{MODEL_PREFIX}{k}": v for k, v in model.state_dict().items()})
        save_checkpoint_atomic(
            Path(checkpoint_dir),
            7,
            pipeline,
            None,
            {},
            {"world_size": ctx.world_size},
            False,
            optimizer_states=gathered.optimizers,
        )
    adam_step(model, optimizers, NUM_POINTS, 2)
    out["stepped"] = _comparable(gather_full_state(ctx, model, optimizers))
    return out


def resume_and_gather(ctx: Any, checkpoint: str, modes: list[str]) -> dict[str, Any]:
    """For each mode ("sharded" or "replicated"), load a whole-model checkpoint the way the trainer
    does (sharded: mmap, slice to the owned block, then nerfstudio's loads), then gather it back
    (sharded) or take the state as it is (replicated)."""
    from distsplat_ns.checkpoint import load_checkpoint_file

    out = {}
    for mode in modes:
        sharded = mode == "sharded"
        model, _ = make_state_model(with_optimizers=False)
        if sharded:
            take_initial_shard_(model, ctx.rank, ctx.world_size)
        loaded = load_checkpoint_file(Path(checkpoint), mmap=sharded)
        if sharded:
            shard_loaded_checkpoint_(loaded, ctx.rank, ctx.world_size)
        model.load_state_dict({k[len(MODEL_PREFIX) :]: v for k, v in loaded["pipeline"].items()})
        # splatfacto's load_state_dict sets step 30000; training sets the step (step_cb) before rendering.
        model.step = loaded["pipeline"][MODEL_EXTRA_KEY]["step"]
        optimizers = make_optimizers(model)
        for name, state in loaded["optimizers"].items():
            optimizers[name].load_state_dict(state)
        ids = model.gauss_ids.tolist()
        state = (
            _comparable(gather_full_state(ctx, model, optimizers))
            if sharded
            else single_process_state(model, optimizers)
        )
        out[mode] = {"ids": ids, "state": state}
    return out


def _optimizers_hold_params(model: Any, optimizers: dict[str, torch.optim.Adam]) -> bool:
    return all(
        o.param_groups[0]["params"][0] is model.gauss_params[n] and model.gauss_params[n] in o.state
        for n, o in optimizers.items()
    )


def _comparable(gathered: Any) -> dict[str, Any] | None:
    if gathered is None:
        return None
    return {"pipeline": gathered.pipeline_entries, "optimizers": gathered.optimizers}


def assert_same(got: Any, want: Any, path: str = "") -> None:
    """``got`` equals ``want`` bitwise (tensors: same dtype, shape and bytes), recursively."""
    if isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: not a tensor"
        assert got.dtype == want.dtype and got.shape == want.shape, (
            f"{path}: {got.dtype}{tuple(got.shape)} vs {want.dtype}{tuple(want.shape)}"
        )
        assert torch.equal(got.cpu(), want.cpu()), f"{path}: values differ"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), (
            f"{path}: keys {sorted(map(str, got))} vs {sorted(map(str, want))}"
        )
        for k in want:
            assert_same(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{path}: length"
        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            assert_same(g, w, f"{path}[{i}]")
    else:
        assert got == want, f"{path}: {got!r} vs {want!r}"


# ---------------------------------------------------------------------- through the trainer
LUND_DOOR = Path(__file__).resolve().parents[2] / "scenes" / "lund_door"


def trainer_save(ctx: Any, out: str, parallel: str, load_dir: str | None, step: int) -> dict[str, Any]:
    """Set up a DistSplatTrainer on the shipped scene (from ``load_dir`` when given), take one Adam
    step with gradients drawn by global id when starting fresh, save checkpoint ``step`` through
    ``DistSplatTrainer.save_checkpoint``. Returns this rank's ids, the checkpoint folder and how many
    Gaussians it holds (its shard: no rank gathers the model to render)."""
    from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig

    from distsplat_ns.registry import distsplat_trainer_config
    from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainer

    config = distsplat_trainer_config()
    config.output_dir = Path(out)
    config.experiment_name, config.timestamp, config.vis = "shard", "run", "tensorboard"
    config.machine.device_type = "cpu"
    config.load_dir = None if load_dir is None else Path(load_dir)
    config.pipeline.parallel = parallel
    config.pipeline.model.rendering_backend = "reference"
    manager = config.pipeline.datamanager
    manager.dataparser = ColmapDataParserConfig(
        data=LUND_DOOR, colmap_path=Path("sparse/0"), load_3D_points=True, downscale_factor=1
    )
    manager.num_workers, manager.eval_num_workers = 0, 0
    trainer = DistSplatTrainer(config)
    trainer.setup()
    model = trainer.pipeline.model
    if load_dir is None:
        num_total = sum(all_gather_counts(ctx, int(model.gauss_params["means"].shape[0])))
        adam_step(model, trainer.optimizers.optimizers, num_total, 0)
    trainer.save_checkpoint(step)
    # Eval and the viewer render from every shard (parallel/view_render.py): no rank holds more than its own.
    return {
        "ids": model.gauss_ids.tolist(),
        "checkpoint_dir": str(trainer.checkpoint_dir),
        "num_held": int(model.gauss_params["means"].shape[0]),
    }


def saved_model_state(path: Path) -> dict[str, Any]:
    """The per-Gaussian content of a checkpoint: Gaussian parameters, strategy state and ids,
    ``next_gauss_id``, and the Gaussian parameters' optimizer states."""
    if Path(path).is_dir():  # a sharded run's step-N.dcp, read whole in this process
        from distsplat_ns.parallel.shard_checkpoint import read_shard_checkpoint

        loaded = read_shard_checkpoint(None, Path(path), 0, 1, sharded=False)
    else:
        loaded = torch.load(path, map_location="cpu", weights_only=True)
    pipeline = loaded["pipeline"]
    extra = pipeline[MODEL_EXTRA_KEY]
    names = [k[len(MODEL_PREFIX + "gauss_params.") :] for k in pipeline if k.startswith(MODEL_PREFIX + "gauss_params.")]
    return {
        "params": {n: pipeline[MODEL_PREFIX + "gauss_params." + n] for n in names},
        "strategy_state": extra["strategy_state"],
        "next_gauss_id": extra["next_gauss_id"],
        "optimizers": {n: loaded["optimizers"][n] for n in names},
    }
