"""trainer/optimizer_step.py: the multi-tensor Adam step over many groups equals torch's Adam group by group."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.trainer.optimizer_step import multi_tensor_adam_step_

#: (lr, eps) of each group: splatfacto's spread of learning rates, the float64 mode's two eps.
GROUPS = [(1.6e-4, 1e-8), (2.5e-3, 1e-8), (1.25e-4, 1e-15), (5e-2, 1e-8), (1e-4, 1e-15)]
SHAPES = [(50, 3), (50, 1, 3), (50, 15, 3), (50,), (7, 6)]
BETAS = (0.9**2, 0.999**2)  # the B = 2 betas of optimizer_rules.scaled_optimizer_configs


def _optimizers(dtype: torch.dtype, seed: int = 0) -> list[torch.optim.Adam]:
    generator = torch.Generator().manual_seed(seed)
    return [
        torch.optim.Adam(
            [torch.nn.Parameter(torch.randn(shape, generator=generator, dtype=dtype))], lr=lr, eps=eps, betas=BETAS
        )
        for (lr, eps), shape in zip(GROUPS, SHAPES, strict=True)
    ]


def _set_grads(optimizers: list[torch.optim.Adam], step: int) -> None:
    generator = torch.Generator().manual_seed(1000 + step)
    for k, optimizer in enumerate(optimizers):
        p = optimizer.param_groups[0]["params"][0]
        # Step 3 leaves one group without a gradient: torch's Adam skips it, counter included.
        p.grad = None if (step == 3 and k == 2) else torch.randn(p.shape, generator=generator, dtype=p.dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_multi_tensor_step_equals_torch_adam_per_group(dtype):
    torch_adam, fused = _optimizers(dtype), _optimizers(dtype)
    for step in range(6):
        _set_grads(torch_adam, step)
        _set_grads(fused, step)
        for optimizer in torch_adam:
            optimizer.step()
        for optimizer in multi_tensor_adam_step_(fused):
            optimizer.step()  # the first step: torch's own creates the state
        for a, b in zip(torch_adam, fused, strict=True):
            pa, pb = a.param_groups[0]["params"][0], b.param_groups[0]["params"][0]
            # sqrt(1 - beta2^t): torch 2.1 takes math.sqrt, newer torch ** 0.5 (<= 1 ulp apart).
            torch.testing.assert_close(pb, pa, rtol=4 * torch.finfo(dtype).eps, atol=0)
            assert float(b.state[pb]["step"]) == float(a.state[pa]["step"])
            torch.testing.assert_close(b.state[pb]["exp_avg"], a.state[pa]["exp_avg"], rtol=0, atol=0)
            torch.testing.assert_close(b.state[pb]["exp_avg_sq"], a.state[pa]["exp_avg_sq"], rtol=0, atol=0)


def test_scheduler_learning_rate_is_read_at_each_step():
    optimizers = _optimizers(torch.float64)
    _set_grads(optimizers, 0)
    for optimizer in multi_tensor_adam_step_(optimizers):
        optimizer.step()
    before = [o.param_groups[0]["params"][0].detach().clone() for o in optimizers]
    optimizers[0].param_groups[0]["lr"] = 0.0  # what a scheduler writes
    _set_grads(optimizers, 1)
    assert multi_tensor_adam_step_(optimizers) == []
    assert torch.equal(optimizers[0].param_groups[0]["params"][0], before[0])
    assert not torch.equal(optimizers[1].param_groups[0]["params"][0], before[1])


@pytest.mark.parametrize(
    "make",
    [
        lambda p: torch.optim.SGD([p], lr=0.1),
        lambda p: torch.optim.Adam([p], lr=0.1, amsgrad=True),
        lambda p: torch.optim.Adam([p], lr=0.1, weight_decay=0.01),
        lambda p: torch.optim.AdamW([p], lr=0.1),
    ],
    ids=["sgd", "amsgrad", "weight-decay", "adamw"],
)
def test_optimizer_it_cannot_take_is_returned_untouched(make):
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.float64))
    optimizer = make(p)
    p.grad = torch.ones_like(p)
    optimizer.step()  # state exists: only the options decide
    value = p.detach().clone()
    assert multi_tensor_adam_step_([optimizer]) == [optimizer]
    assert torch.equal(p, value)
