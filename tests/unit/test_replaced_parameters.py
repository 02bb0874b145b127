"""nerfstudio's per-group parameter lists follow the parameters that densification puts in the
optimizers (optimizer_rules.py:track_replaced_parameters), so a replaced one is freed."""

from __future__ import annotations

import gc
import weakref

import torch
from gsplat.strategy.ops import remove
from nerfstudio.engine.optimizers import AdamOptimizerConfig, Optimizers

from distsplat_ns.optimizer_rules import track_replaced_parameters


def _setup() -> tuple[torch.nn.ParameterDict, Optimizers]:
    params = torch.nn.ParameterDict({"means": torch.nn.Parameter(torch.randn(6, 3)), "opacities": torch.nn.Parameter(torch.randn(6, 1))})
    config = {name: {"optimizer": AdamOptimizerConfig(lr=1e-3), "scheduler": None} for name in params}
    optimizers = Optimizers(config, {name: [p] for name, p in params.items()})
    for p in params.values():
        p.grad = torch.ones_like(p)
    optimizers.optimizer_step_all()
    return params, optimizers


def test_a_parameter_replaced_by_a_refine_is_freed_once_tracked() -> None:
    params, optimizers = _setup()
    old = weakref.ref(params["means"])
    remove(params, optimizers.optimizers, {}, torch.tensor([True, False, False, False, False, True]))  # gsplat's prune
    assert params["means"].shape[0] == 4
    gc.collect()
    assert old() is not None  # nerfstudio's list still holds the first parameter and its gradient
    track_replaced_parameters(optimizers)
    for name, param in params.items():
        assert len(optimizers.parameters[name]) == 1 and optimizers.parameters[name][0] is param, name
    gc.collect()
    assert old() is None


def test_tracking_unchanged_parameters_changes_nothing() -> None:
    _, optimizers = _setup()
    before = {name: list(ps) for name, ps in optimizers.parameters.items()}
    track_replaced_parameters(optimizers)
    assert all(a is b for name in before for a, b in zip(before[name], optimizers.parameters[name], strict=True))
