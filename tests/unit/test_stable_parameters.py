"""Row operations keep every parameter object (gaussians/rows.py): nerfstudio's per-group parameter
lists, the optimizers' param groups and Adam's state keys stay right after densification and
shard moves without a patch, and the old rows' gradients are dropped."""

from __future__ import annotations

import pytest
import torch
from nerfstudio.engine.optimizers import AdamOptimizerConfig, Optimizers

from distsplat_ns.gaussians.rows import DEFAULT_STATISTICS, GaussianRows, gaussian_schema


def _setup() -> tuple[GaussianRows, Optimizers]:
    params = torch.nn.ParameterDict(
        {"means": torch.nn.Parameter(torch.randn(6, 3)), "opacities": torch.nn.Parameter(torch.randn(6, 1))}
    )
    config = {name: {"optimizer": AdamOptimizerConfig(lr=1e-3), "scheduler": None} for name in params}
    optimizers = Optimizers(config, {name: [p] for name, p in params.items()})
    for p in params.values():
        p.grad = torch.ones_like(p)
    optimizers.optimizer_step_all()
    state = {"grad2d": torch.rand(6), "count": torch.rand(6), "gauss_ids": torch.arange(6), "scene_scale": 1.0}
    return GaussianRows(
        gaussian_schema(list(params), DEFAULT_STATISTICS), params, state, optimizers.optimizers
    ), optimizers


OPERATIONS = {
    "select": lambda rows: rows.select_(torch.tensor([True, False, False, True, True, True])),
    "grow": lambda rows: rows.grow_(torch.tensor([1, 1, 4]), torch.tensor([6, 7, 8])),
    "update": lambda rows: rows.update_(
        torch.tensor([2]), {"opacities": torch.zeros(1, 1)}, zero_moments=("opacities",)
    ),
    "append": lambda rows: rows.append_(rows.export(torch.tensor([0, 5]))),
}


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_nerfstudio_lists_hold_the_model_parameters_after_a_row_operation(operation: str) -> None:
    rows, optimizers = _setup()
    before = {name: p for name, p in rows.parameters()}
    OPERATIONS[operation](rows)
    for name, param in rows.parameters():
        assert param is before[name], name
        assert optimizers.parameters[name] == [param] and optimizers.optimizers[name].param_groups[0]["params"] == [
            param
        ], name
        assert list(optimizers.optimizers[name].state) == [param] and param.grad is None, name
        for key in ("exp_avg", "exp_avg_sq"):
            assert optimizers.optimizers[name].state[param][key].shape == param.shape, (name, key)
    assert all(v.shape[0] == len(rows) for k, v in rows.tensors().items()), operation
    for p in rows.params.values():
        p.grad = torch.ones_like(p)
    optimizers.optimizer_step_all()  # Adam runs on the new rows
