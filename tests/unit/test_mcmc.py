"""MCMC densification independent of the number of processes (gaussians/mcmc.py, gaussians/mcmc_draws.py).

The same Gaussians run the same sequence -- events, position noise, kills and Adam moments keyed by
id in between -- in one process and split into shards (threads whose gathers meet at a barrier,
tests/helpers/mcmc_shards.py). The union of the shards, ordered by global id, must equal the one
process bit for bit: ids, parameters and both Adam moments.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from distsplat_ns.gaussians.densifier import gather_local
from distsplat_ns.gaussians.mcmc import (
    MCMCConfig,
    inject_keyed_position_noise,
    mcmc_event,
    mcmc_regularizers,
    mcmc_schedule_in_steps,
    mcmc_step_post_backward,
)
from distsplat_ns.gaussians.mcmc_draws import (
    STREAM_ADD,
    STREAM_RELOCATE,
    draw_by_weight,
    gather_weight_table,
    opacity_weights,
)
from distsplat_ns.gaussians.mcmc_relocation import relocation_opacity_scale
from distsplat_ns.utils.keyed_random import keyed_normal_device
from tests.helpers.mcmc_shards import (
    FIRST_ID,
    PARTITIONS,
    gaussians_by_id,
    mcmc_gaussians,
    mcmc_sequence,
    run_ranks,
    shards_of,
)
from tests.helpers.strategy_shards import SEED, N, as_rows

MIN_OPACITY = 0.005


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("partition", sorted(PARTITIONS))
def test_sharded_mcmc_equals_one_process_bitwise(dtype: torch.dtype, partition: str) -> None:
    """Three events (relocate + add 5%; relocate + add up to the cap; relocate only), with keyed
    kills, Adam moments and two noise steps before each (tests/helpers/mcmc_shards.py:mcmc_sequence)."""
    full = mcmc_gaussians(dtype)
    shards = shards_of(full, partition)
    expected = mcmc_sequence(full, gather_local)
    assert all(e.num_relocated > 0 for e in expected), "every event must relocate"
    assert [e.num_added > 0 for e in expected] == [True, True, False]
    results, calls = run_ranks(len(shards), lambda rank, gather: mcmc_sequence(shards[rank], gather))
    assert all(r == expected for r in results), "every rank sees the one process's global counts and ids"
    assert len(set(calls)) == 1, "every rank gathers the same number of times"
    want, got = gaussians_by_id([full]), gaussians_by_id(shards)
    assert want.keys() == got.keys()
    for key in want:
        assert want[key].dtype == got[key].dtype and torch.equal(want[key], got[key]), key


def test_the_cap_holds_over_all_ranks() -> None:
    shards = shards_of(mcmc_gaussians(torch.float64), "empty_rank3")
    sizes_before = [len(s[0]["means"]) for s in shards]
    results, _ = run_ranks(3, lambda rank, gather: mcmc_sequence(shards[rank], gather))
    assert [e.num_gaussians for e in results[0]] == [420, 430, 430]
    assert sum(len(s[0]["means"]) for s in shards) == 430
    # The cap is global: the ranks grew unevenly (by where the draws fell), none to a per-rank cap.
    growth = [len(s[0]["means"]) - b for s, b in zip(shards, sizes_before, strict=False)]
    assert growth[1] == 0 and growth[0] != growth[2]


def test_relocation_removes_the_dead_and_numbers_copies_by_draw() -> None:
    params, optimizers, state = mcmc_gaussians(torch.float64)
    ids = state["gauss_ids"].clone()
    dead = (1.0 / (1.0 + torch.exp(-params["opacities"].detach().flatten()))) <= MIN_OPACITY
    table = gather_weight_table(ids, opacity_weights(params["opacities"]), dead, gather_local)
    draws = draw_by_weight(
        table.ids,
        torch.where(table.dead, 0, table.weights),
        int(dead.sum()),
        seed=SEED,
        step=600,
        stream=STREAM_RELOCATE,
    )
    event = mcmc_event(
        as_rows(params, optimizers, state, ()),
        step=600,
        seed=SEED,
        next_id=FIRST_ID,
        cap_max=N,
        min_opacity=MIN_OPACITY,
        gather=gather_local,
    )
    assert event.num_relocated == int(dead.sum()) > 0 and event.num_added == 0 and event.num_gaussians == N
    after = state["gauss_ids"]
    assert not bool(torch.isin(ids[dead], after).any()), "the dead leave"
    copies = FIRST_ID + torch.arange(event.num_relocated)
    assert torch.equal(after[-event.num_relocated :], copies)
    assert not bool(torch.isin(draws.source_ids, ids[dead]).any()), "a dead Gaussian is never a source"
    rows = {int(i): r for r, i in enumerate(after.tolist())}
    for j, source in enumerate(draws.source_ids.tolist()):  # a copy is its (updated) source
        for k, p in params.items():
            assert torch.equal(p[rows[FIRST_ID + j]], p[rows[source]]), (j, k)
            assert not bool(optimizers[k].state[p]["exp_avg"][rows[source]].any()), (
                "relocation zeroes a source's moments"
            )
            assert not bool(optimizers[k].state[p]["exp_avg"][rows[FIRST_ID + j]].any())


def _patched_gsplat_op(monkeypatch, rows: torch.Tensor, op: str, params, optimizers, **kwargs):
    """gsplat 1.4.0's ``relocate`` / ``sample_add`` made to draw ``rows`` and run Eq. 9 on CPU."""
    from gsplat.strategy import ops

    monkeypatch.setattr(ops, "_multinomial_sample", lambda weights, n, replacement=True: rows)

    def on_cpu(opacities, scales, ratios, binoms):
        new_opacities, new_scales = relocation_opacity_scale(opacities.flatten(), scales, ratios)
        return new_opacities.reshape(opacities.shape), new_scales

    monkeypatch.setattr(ops, "compute_relocation", on_cpu)
    getattr(ops, op)(params=params, optimizers=optimizers, state={}, binoms=None, min_opacity=MIN_OPACITY, **kwargs)


def test_relocation_equals_gsplats_relocate_given_the_same_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = mcmc_gaussians(torch.float64)
    theirs = copy.deepcopy(ours)
    ids = ours[2]["gauss_ids"].clone()
    dead = torch.sigmoid(ours[0]["opacities"].detach().flatten()) <= MIN_OPACITY
    table = gather_weight_table(ids, opacity_weights(ours[0]["opacities"]), dead, gather_local)
    draws = draw_by_weight(
        table.ids,
        torch.where(table.dead, 0, table.weights),
        int(dead.sum()),
        seed=SEED,
        step=600,
        stream=STREAM_RELOCATE,
    )
    source_rows = torch.tensor([int(torch.nonzero(ids == s)) for s in draws.source_ids.tolist()])
    alive = torch.nonzero(~dead).flatten()
    _patched_gsplat_op(monkeypatch, torch.searchsorted(alive, source_rows), "relocate", theirs[0], theirs[1], mask=dead)
    mcmc_event(
        as_rows(*ours, ()),
        step=600,
        seed=SEED,
        next_id=FIRST_ID,
        cap_max=N,
        min_opacity=MIN_OPACITY,
        gather=gather_local,
    )
    # gsplat overwrites dead row j with draw j's copy: there, id FIRST_ID + j is at dead row j.
    their_ids = ids.clone()
    their_ids[torch.nonzero(dead).flatten()] = FIRST_ID + torch.arange(int(dead.sum()))
    mine, ref = gaussians_by_id([ours]), gaussians_by_id([(theirs[0], theirs[1], {"gauss_ids": their_ids})])
    assert torch.equal(mine["gauss_ids"], ref["gauss_ids"])
    is_copy = mine["gauss_ids"] >= FIRST_ID
    for k in ours[0]:
        # gsplat's sigmoid vs 1 / (1 + exp(-x)): an ulp apart, through Eq. 9 a few ulp.
        assert torch.allclose(mine[k], ref[k], rtol=1e-13, atol=1e-13), k
        for m in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(mine[f"{k}.{m}"][~is_copy], ref[f"{k}.{m}"][~is_copy]), (k, m)
            # The deviation: gsplat's copies keep the overwritten dead rows' moments, ours start at 0.
            assert not bool(mine[f"{k}.{m}"][is_copy].any())


def test_addition_equals_gsplats_sample_add_given_the_same_draws(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = mcmc_gaussians(torch.float64)
    with torch.no_grad():
        ours[0]["opacities"].clamp_(min=-4.0)  # nothing dead: the event only adds
    theirs = copy.deepcopy(ours)
    ids = ours[2]["gauss_ids"].clone()
    table = gather_weight_table(
        ids, opacity_weights(ours[0]["opacities"]), torch.zeros(N, dtype=torch.bool), gather_local
    )
    num_added = int(1.05 * N) - N
    draws = draw_by_weight(table.ids, table.weights, num_added, seed=SEED, step=600, stream=STREAM_ADD)
    source_rows = torch.tensor([int(torch.nonzero(ids == s)) for s in draws.source_ids.tolist()])
    _patched_gsplat_op(monkeypatch, source_rows, "sample_add", theirs[0], theirs[1], n=num_added)
    event = mcmc_event(
        as_rows(*ours, ()),
        step=600,
        seed=SEED,
        next_id=FIRST_ID,
        cap_max=10_000,
        min_opacity=MIN_OPACITY,
        gather=gather_local,
    )
    assert (event.num_relocated, event.num_added) == (0, num_added)
    mine = gaussians_by_id([ours])
    ref = gaussians_by_id([(theirs[0], theirs[1], {"gauss_ids": torch.cat([ids, FIRST_ID + torch.arange(num_added)])})])
    assert torch.equal(mine["gauss_ids"], ref["gauss_ids"])
    for k in mine:
        assert torch.allclose(mine[k].double(), ref[k].double(), rtol=1e-13, atol=1e-13), k


def test_draws_follow_the_weights() -> None:
    ids = torch.arange(4) * 10
    weights = torch.tensor([1, 0, 3, 4]) << 20
    draws = draw_by_weight(ids, weights, 80_000, seed=1, step=2, stream=STREAM_ADD)
    freq = torch.stack([(draws.source_ids == i).double().mean() for i in ids])
    assert freq[1] == 0
    # 5 standard errors of a frequency p: sqrt(p (1 - p) / n) <= 0.5 / sqrt(80000) = 0.0018.
    assert torch.allclose(freq, torch.tensor([1, 0, 3, 4], dtype=torch.float64) / 8, atol=0.009)
    assert torch.equal(
        draws.ratios,
        torch.bincount(torch.searchsorted(ids, draws.source_ids))[torch.searchsorted(ids, draws.source_ids)] + 1,
    )


def test_overlapping_shards_are_refused() -> None:
    ids = torch.tensor([3, 5])
    w = torch.ones(2, dtype=torch.int64)
    with pytest.raises(RuntimeError, match="overlap"):
        gather_weight_table(ids, w, torch.zeros(2, dtype=torch.bool), lambda t: [t, t])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_eq9_equals_the_papers_double_sum(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(0)
    opacities = (0.006 + 0.99 * torch.rand(300, generator=gen, dtype=torch.float64)).to(dtype)
    scales = (torch.rand(300, 3, generator=gen, dtype=torch.float64) + 0.01).to(dtype)
    ratios = torch.randint(1, 60, (300,), generator=gen)
    new_o, new_s = relocation_opacity_scale(opacities, scales, ratios)
    for i in range(0, 300, 7):
        o, n = float(opacities[i]), min(int(ratios[i]), 51)
        want_o = 1.0 - (1.0 - o) ** (1.0 / n)
        denom = sum(
            math.comb(a - 1, k) * (-1) ** k / math.sqrt(k + 1) * want_o ** (k + 1)
            for a in range(1, n + 1)
            for k in range(a)
        )
        tol = 1e-12 if dtype == torch.float64 else 1e-6  # float32: the inputs' and outputs' rounding
        assert math.isclose(float(new_o[i]), want_o, rel_tol=tol), i
        assert torch.allclose(new_s[i].double(), o / denom * scales[i].double(), rtol=max(tol, 1e-10)), i
    alone = [relocation_opacity_scale(opacities[i : i + 3], scales[i : i + 3], ratios[i : i + 3]) for i in range(40)]
    assert all(torch.equal(a[0], new_o[i : i + 3]) and torch.equal(a[1], new_s[i : i + 3]) for i, a in enumerate(alone))


@pytest.mark.parametrize("partition", ["blocks2", "interleaved3"])
def test_noise_is_keyed_gaussians_by_id(partition: str) -> None:
    full = mcmc_gaussians(torch.float64)
    shards = shards_of(full, partition)
    for params, _, state in [full, *shards]:
        inject_keyed_position_noise(params, state["gauss_ids"], seed=SEED, step=11, scaler=1e2)
    assert torch.equal(gaussians_by_id([full])["means"], gaussians_by_id(shards)["means"])


def test_noise_equals_gsplats_formula() -> None:
    params, _, state = mcmc_gaussians(torch.float64)
    before = params["means"].detach().clone()
    with torch.no_grad():
        params["opacities"][:200] = -6.0  # nearly transparent: the gate is open, the noise shows
    inject_keyed_position_noise(params, state["gauss_ids"], seed=SEED, step=11, scaler=80.0)
    from gsplat.utils import normalized_quat_to_rotmat

    rot = normalized_quat_to_rotmat(torch.nn.functional.normalize(params["quats"].detach(), dim=-1))
    covars = rot @ torch.diag_embed(torch.exp(params["scales"].detach()) ** 2) @ rot.transpose(1, 2)
    gate = torch.sigmoid(100.0 * ((1.0 - torch.sigmoid(params["opacities"].detach().flatten())) - 0.995))
    z = keyed_normal_device(SEED, 11, state["gauss_ids"], 3, stream=1) * gate[:, None] * 80.0
    moved = params["means"].detach() - before
    assert torch.allclose(moved, torch.einsum("bij,bj->bi", covars, z), rtol=1e-9, atol=1e-15)
    assert moved[:200].abs().max() > 1e-6 and moved[200:].abs().max() < moved[:200].abs().max()


def test_noise_never_reads_a_value_back() -> None:
    """On the meta device every value read (``.item()``, ``.cpu()``, ``bool(t)``) raises: none is made."""
    params, _, state = mcmc_gaussians(torch.float32)
    meta = {k: torch.nn.Parameter(p.detach().to("meta")) for k, p in params.items()}
    inject_keyed_position_noise(meta, state["gauss_ids"].to("meta"), seed=SEED, step=3, scaler=1.0)


@pytest.mark.parametrize("partition", ["blocks2", "empty_rank3", "random3"])
def test_regularizers_sum_over_shards_with_one_process_gradients(partition: str) -> None:
    full = mcmc_gaussians(torch.float64)
    shards = shards_of(full, partition)
    kw = {"opacity_reg": 0.01, "scale_reg": 0.01}
    whole = mcmc_regularizers(full[0]["opacities"], full[0]["scales"], N, **kw)
    (whole.opacity + whole.scale).backward()
    parts = [mcmc_regularizers(p["opacities"], p["scales"], N, **kw) for p, _, _ in shards]
    sum(r.opacity + r.scale for r in parts).backward()
    main = (
        0.01 * torch.sigmoid(full[0]["opacities"].detach()).mean() + 0.01 * torch.exp(full[0]["scales"].detach()).mean()
    )
    assert math.isclose(float(whole.opacity + whole.scale), float(main), rel_tol=1e-14)
    assert math.isclose(float(sum(r.opacity + r.scale for r in parts)), float(main), rel_tol=1e-14)
    ids = torch.cat([s["gauss_ids"] for _, _, s in shards])
    order = torch.argsort(ids)
    for k in ("opacities", "scales"):
        got = torch.cat([p[k].grad for p, _, _ in shards])[order]
        assert torch.equal(got, full[0][k].grad[torch.argsort(full[2]["gauss_ids"])]), k


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_schedule_counts_images(batch_size: int) -> None:
    from gsplat.strategy import MCMCStrategy

    schedule = mcmc_schedule_in_steps(
        warmup_images=500, stop_split_images=25000, refine_every_images=100, batch_size=batch_size
    )
    reference = MCMCStrategy(refine_start_iter=500, refine_stop_iter=25000, refine_every=100)
    events = [s for s in range(30000 // batch_size) if schedule.is_event(s)]
    gsplat_events = [
        s
        for s in range(30000)
        if reference.refine_start_iter < s < reference.refine_stop_iter and s % reference.refine_every == 0
    ]
    assert [s * batch_size for s in events] == gsplat_events


def test_step_runs_the_event_then_the_noise() -> None:
    gaussians = mcmc_gaussians(torch.float64)
    config = MCMCConfig()
    schedule = mcmc_schedule_in_steps(
        warmup_images=500, stop_split_images=config.stop_split_at, refine_every_images=100, batch_size=1
    )
    quiet = mcmc_step_post_backward(
        as_rows(*gaussians, ()),
        step=601,
        seed=SEED,
        means_lr=1e-4,
        next_id=FIRST_ID,
        config=config,
        schedule=schedule,
        gather=gather_local,
    )
    assert quiet.event is None and quiet.next_id == FIRST_ID
    step = mcmc_step_post_backward(
        as_rows(*gaussians, ()),
        step=600,
        seed=SEED,
        means_lr=1e-4,
        next_id=FIRST_ID,
        config=config,
        schedule=schedule,
        gather=gather_local,
    )
    assert step.event is not None and step.event.num_added == int(1.05 * N) - N
    assert step.next_id == FIRST_ID + step.event.num_relocated + step.event.num_added == step.event.next_id


def test_defaults_are_mains_splatfacto_mcmc() -> None:
    c = MCMCConfig()
    assert (c.max_gs_num, c.noise_lr, c.mcmc_opacity_reg, c.mcmc_scale_reg, c.cull_alpha_thresh, c.stop_split_at) == (
        1_000_000,
        5e5,
        0.01,
        0.01,
        0.005,
        25000,
    )


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("max_gs_num", 0, ValueError),
        ("max_gs_num", 2.5, TypeError),
        ("max_gs_num", 1 << 40, ValueError),
        ("noise_lr", -1.0, ValueError),
        ("noise_lr", math.inf, ValueError),
        ("mcmc_opacity_reg", -0.1, ValueError),
        ("mcmc_scale_reg", math.nan, ValueError),
        ("mcmc_scale_reg", "0.1", TypeError),
        ("cull_alpha_thresh", 1.0, ValueError),
        ("cull_alpha_thresh", -0.01, ValueError),
        ("stop_split_at", -1, ValueError),
        ("stop_split_at", True, TypeError),
    ],
)
def test_bad_config_is_refused_naming_the_field(field: str, value: object, error: type) -> None:
    with pytest.raises(error, match=field):
        MCMCConfig(**{field: value})


def test_the_addition_draws_from_the_table_a_new_gather_would_give() -> None:
    """``reweighted_after_relocation`` (8 bytes per source) equals gathering every Gaussian again."""
    from distsplat_ns.gaussians.mcmc_draws import reweighted_after_relocation, rows_of

    params, optimizers, state = mcmc_gaussians(torch.float64)
    dead = (1.0 / (1.0 + torch.exp(-params["opacities"].detach().flatten()))) <= MIN_OPACITY
    table = gather_weight_table(state["gauss_ids"].clone(), opacity_weights(params["opacities"]), dead, gather_local)
    draws = draw_by_weight(
        table.ids,
        torch.where(table.dead, 0, table.weights),
        int(dead.sum()),
        seed=SEED,
        step=600,
        stream=STREAM_RELOCATE,
    )
    mcmc_event(
        as_rows(params, optimizers, state, ()),
        step=600,
        seed=SEED,
        next_id=FIRST_ID,
        cap_max=N,
        min_opacity=MIN_OPACITY,
        gather=gather_local,
    )
    sources = torch.unique(draws.source_ids)
    _, rows = rows_of(state["gauss_ids"], sources)
    got = reweighted_after_relocation(
        table, draws, FIRST_ID, sources, opacity_weights(params["opacities"].detach().flatten()[rows]), gather_local
    )
    now = torch.zeros(N, dtype=torch.bool)
    want = gather_weight_table(state["gauss_ids"], opacity_weights(params["opacities"]), now, gather_local)
    assert torch.equal(got.ids, want.ids) and torch.equal(got.weights, want.weights) and not bool(got.dead.any())


def test_ids_that_cannot_pack_are_refused() -> None:
    from distsplat_ns.gaussians.mcmc_draws import ID_LIMIT

    ids = torch.tensor([1, ID_LIMIT])
    with pytest.raises(ValueError, match="global ids"):
        gather_weight_table(ids, torch.ones(2, dtype=torch.int64), torch.zeros(2, dtype=torch.bool), gather_local)
    gaussians = mcmc_gaussians(torch.float64)
    with pytest.raises(ValueError, match="next_id"):
        mcmc_event(
            as_rows(*gaussians, ()),
            step=600,
            seed=SEED,
            next_id=ID_LIMIT - 10,
            cap_max=10_000,
            min_opacity=MIN_OPACITY,
            gather=gather_local,
        )


def test_an_event_needs_the_global_ids() -> None:
    params, optimizers, _ = mcmc_gaussians(torch.float64)
    with pytest.raises(ValueError, match="gauss_ids"):
        mcmc_event(
            as_rows(params, optimizers, {}, ()),
            step=600,
            seed=SEED,
            next_id=FIRST_ID,
            cap_max=N,
            min_opacity=MIN_OPACITY,
            gather=gather_local,
        )


def test_a_bad_id_on_one_rank_fails_every_rank_after_the_gather() -> None:
    from distsplat_ns.gaussians.mcmc_draws import ID_LIMIT

    ids = [torch.tensor([1, 2]), torch.tensor([ID_LIMIT + 5])]

    def table(rank: int, gather) -> str:
        n = len(ids[rank])
        try:
            gather_weight_table(ids[rank], torch.ones(n, dtype=torch.int64), torch.zeros(n, dtype=torch.bool), gather)
        except ValueError as e:
            return "refused" if "global ids" in str(e) else str(e)
        return "accepted"

    # A rank refusing before the gather would leave the other at the barrier (BrokenBarrierError).
    assert run_ranks(2, table)[0] == ["refused", "refused"]
