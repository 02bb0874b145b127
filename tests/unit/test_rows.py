"""The per-Gaussian schema and rows (gaussians/rows.py): what a model declares, and that every operation
keeps row ``i`` of every field and moment the same Gaussian, for any declared field."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.gaussians.rows import (
    DEFAULT_STATISTICS,
    GAUSSIAN_PARAMETER_NAMES,
    IDS,
    GaussianRows,
    RowField,
    gaussian_schema,
)
from tests.helpers.model_factory import make_model
from tests.helpers.shard_fns import make_state_model

N = 12


def test_a_default_model_declares_its_parameters_statistics_and_ids_with_shapes() -> None:
    model, _ = make_state_model()
    schema = model.rows.schema
    assert schema.parameters == GAUSSIAN_PARAMETER_NAMES
    assert [f.name for f in schema.state_fields] == ["grad2d", "count", "radii", IDS]
    assert schema.field("features_rest").row_shape == (3, 3)  # sh_degree 1
    model.rows.check(model.compute_dtype)
    assert list(model.get_gaussian_param_groups()) == list(GAUSSIAN_PARAMETER_NAMES)


def test_an_mcmc_model_declares_no_statistics_and_loads_none() -> None:
    model = make_model(batch_size=1, num_points=N, strategy="mcmc")
    assert [f.name for f in model.rows.schema.state_fields] == [IDS]
    model.rows.load_saved_state({"grad2d": torch.ones(N), IDS: torch.arange(N) + 5}, "cpu")
    assert set(model.strategy_state) == {IDS} and model.gauss_ids.tolist() == list(range(5, N + 5))


def test_a_row_of_the_wrong_shape_is_refused_by_check() -> None:
    model = make_model(batch_size=1, num_points=N)
    model.strategy_state["grad2d"] = torch.zeros(N, 2)
    with pytest.raises(ValueError, match="grad2d"):
        model.rows.check(model.compute_dtype)


def test_the_ids_and_statistics_follow_the_model_to_another_device() -> None:
    # The first CUDA run (benchmarks/results/gpu_check_2026-12-04) crashed at the first refinement:
    # the ids, made on the CPU in populate_modules, stayed there after model.to("cuda"). "meta"
    # stands in for the second device a CPU machine lacks.
    model = make_model(batch_size=1, num_points=N)
    model.strategy_state["grad2d"] = torch.zeros(N)  # a statistic as the strategy accumulates it
    model.rows.check(model.compute_dtype)
    model.to("meta")
    assert model.gauss_params["means"].device.type == "meta"
    placed = {key: value.device.type for key, value in model.rows.tensors().items() if value is not None}
    assert placed == dict.fromkeys(placed, "meta") and f"state.{IDS}" in placed and "state.grad2d" in placed
    model.rows.check(model.compute_dtype)


def test_a_row_on_another_device_than_the_parameters_is_refused_by_check() -> None:
    model = make_model(batch_size=1, num_points=N)
    model.strategy_state[IDS] = model.strategy_state[IDS].to("meta")
    with pytest.raises(ValueError, match=f"state.{IDS}: on meta"):
        model.rows.check(model.compute_dtype)


def _rows_with_an_extra_parameter() -> GaussianRows:
    """Rows with a declared seventh parameter ("appearance", `[N, 4]`) and Adam moments on all."""
    gen = torch.Generator().manual_seed(0)
    params = {name: torch.nn.Parameter(torch.randn(N, 3, generator=gen)) for name in ("means", "scales", "opacities")}
    params["appearance"] = torch.nn.Parameter(torch.randn(N, 4, generator=gen))
    optimizers = {name: torch.optim.Adam([p], lr=1e-2) for name, p in params.items()}
    for name, p in params.items():
        p.grad = torch.randn(p.shape, generator=gen)
        optimizers[name].step()
    state = {"grad2d": torch.rand(N, generator=gen), "count": torch.rand(N, generator=gen), IDS: torch.arange(N)}
    fields = [RowField(n, "parameter", (3,)) for n in ("means", "scales", "opacities")] + [
        RowField("appearance", "parameter", (4,))
    ]
    return GaussianRows(gaussian_schema(fields, DEFAULT_STATISTICS[:2]), params, state, optimizers)


def _by_id(rows: GaussianRows) -> dict[int, dict[str, torch.Tensor]]:
    flat = rows.tensors()
    return {int(i): {k: v[r] for k, v in flat.items()} for r, i in enumerate(rows.ids)}


def test_every_operation_carries_a_declared_parameter_and_its_moments_with_its_gaussian() -> None:
    rows = _rows_with_an_extra_parameter()
    before = _by_id(rows)
    assert "opt.appearance.exp_avg" in before[0]
    rows.select_(torch.tensor([5, 0, 3, 9, 1, 2, 11]))  # a cut and a permutation
    rows.grow_(
        torch.tensor([1, 1, 4]), torch.tensor([20, 21, 22]), keep=torch.tensor([0, 1, 2, 4, 5, 6])
    )  # id 9 dropped, 3 copies
    moved = rows.export(torch.tensor([0, 1]))
    rows.select_(slice(2, None))
    rows.append_(moved)
    after = _by_id(rows)
    assert sorted(after) == [0, 1, 2, 3, 5, 11, 20, 21, 22]
    for gid in (0, 1, 2, 3, 5, 11):
        for key, value in before[gid].items():
            assert torch.equal(after[gid][key], value), (gid, key)
    for gid, parent in ((20, 0), (21, 0), (22, 1)):  # copies: the parent's parameters and statistics, zero moments
        assert torch.equal(after[gid]["param.appearance"], before[parent]["param.appearance"])
        assert torch.equal(after[gid]["state.count"], before[parent]["state.count"])
        assert not after[gid]["opt.appearance.exp_avg"].any()
    rows.check(torch.float32)
