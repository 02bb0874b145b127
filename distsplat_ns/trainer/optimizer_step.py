"""One multi-tensor Adam step over every parameter group (docs/overlap.md, "One optimizer step over every group").

nerfstudio builds one ``torch.optim.Adam`` per parameter name (``means``, ``scales``, ...,
``camera_opt``), each with its own learning rate and scheduler, and ``Optimizers.optimizer_step_all``
steps them one by one: about ten operators per group, each a kernel launch on a GPU. torch's own
``foreach`` Adam cannot fuse them, since it runs one multi-tensor update per param group and a
param group has one learning rate. :func:`multi_tensor_adam_step_` takes the groups of many Adam
optimizers at once and runs torch's multi-tensor update over all their tensors, with a learning
rate and an eps per tensor (``torch._foreach_*`` ops with a list of scalars, which torch's own
``_multi_tensor_adam`` already calls). Everything else stays where nerfstudio and the rows put it:

* each optimizer keeps its parameter, its param group (the scheduler writes ``lr`` there) and its
  state (``step``, ``exp_avg``, ``exp_avg_sq``), so checkpoints, ``load_optimizers`` and the row
  operations (``gaussians/rows.py:GaussianRows.adam_state``) see exactly what they saw before;
* the arithmetic is torch's non-capturable Adam, operation for operation (the order of
  ``torch/optim/adam.py:_multi_tensor_adam``), the same on every rank and any number of ranks: the
  replicas stay bitwise equal and the float64 1 = W equivalence is unchanged
  (tests/unit/test_optimizer_step.py compares it with ``torch.optim.Adam``).

An optimizer the update cannot take -- not a plain Adam, options the update does not implement
(amsgrad, maximize, weight decay, capturable, fused, differentiable), a parameter whose state is not
created yet (its first step) -- takes its own ``step()``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch
from nerfstudio.engine.optimizers import Optimizers

#: Adam options the multi-tensor update implements only at these values.
_PLAIN_ADAM = {"amsgrad": False, "maximize": False, "weight_decay": 0, "capturable": False, "differentiable": False}


def _fusable(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` is a plain Adam the multi-tensor update takes (see the module docstring).

    **Host sync:** none (the step counters of non-capturable Adam live on the host).
    """
    if type(optimizer) is not torch.optim.Adam:
        return False
    for group in optimizer.param_groups:
        if any(group.get(key, value) != value for key, value in _PLAIN_ADAM.items()):
            return False
        if group.get("fused") or group.get("decoupled_weight_decay") or isinstance(group["lr"], torch.Tensor):
            return False
        for p in group["params"]:
            state = optimizer.state.get(p)
            if p.grad is not None and (not state or "step" not in state or state["step"].device.type != "cpu"):
                return False  # its first step: torch's own creates the state in torch's format
    return True


def multi_tensor_adam_step_(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.optim.Optimizer]:
    """One Adam step of every parameter with a gradient in the plain Adam ``optimizers``, as a few
    multi-tensor updates (one per device, dtype and betas), in place.

    Args:
        optimizers: The optimizers to step, e.g. nerfstudio's ``Optimizers.optimizers.values()``.

    Returns:
        The optimizers it did not step (not plain Adam, or a first step); the caller steps them.

    **Host sync:** none: Adam's step counters are host tensors; their values give the bias corrections.
    """
    left = [o for o in optimizers if not _fusable(o)]
    buckets: dict[tuple[Any, ...], list[tuple[torch.Tensor, dict[str, Any], dict[str, Any]]]] = defaultdict(list)
    for optimizer in (o for o in optimizers if _fusable(o)):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    beta1, beta2 = group["betas"]
                    buckets[(p.device, p.dtype, float(beta1), float(beta2))].append((p, group, optimizer.state[p]))
    with torch.no_grad():
        for (_, _, beta1, beta2), entries in buckets.items():
            _adam_update_(entries, beta1, beta2)
    return left


def _adam_update_(
    entries: Sequence[tuple[torch.Tensor, dict[str, Any], dict[str, Any]]], beta1: float, beta2: float
) -> None:
    """torch's non-capturable multi-tensor Adam (``torch/optim/adam.py:_multi_tensor_adam``), with
    each tensor's own learning rate and eps."""
    params = [p for p, _, _ in entries]
    grads = [p.grad for p in params]
    exp_avgs = [state["exp_avg"] for _, _, state in entries]
    exp_avg_sqs = [state["exp_avg_sq"] for _, _, state in entries]
    steps = [state["step"] for _, _, state in entries]
    torch._foreach_add_(steps, 1)
    torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
    torch._foreach_mul_(exp_avg_sqs, beta2)
    torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
    counts = [float(s) for s in steps]  # host tensors (non-capturable Adam): no device sync
    step_sizes = [(group["lr"] / (1 - beta1**t)) * -1 for (_, group, _), t in zip(entries, counts, strict=True)]
    bias_correction2_sqrt = [(1 - beta2**t) ** 0.5 for t in counts]
    denoms = torch._foreach_sqrt(exp_avg_sqs)
    torch._foreach_div_(denoms, bias_correction2_sqrt)
    torch._foreach_add_(denoms, [group["eps"] for _, group, _ in entries])
    torch._foreach_addcdiv_(params, exp_avgs, denoms, step_sizes)


class FusedAdamOptimizers(Optimizers):
    """nerfstudio's ``Optimizers`` whose ``optimizer_step_all`` is one multi-tensor Adam step over
    every group (:func:`multi_tensor_adam_step_`); everything else (schedulers, checkpoints,
    ``zero_grad_all``, gradient clipping where a group sets ``max_norm``) is nerfstudio's."""

    def optimizer_step_all(self) -> None:
        """Clip the groups that set ``max_norm`` (as nerfstudio), then step every group.

        **Host sync:** none.
        """
        for name in self.optimizers:
            max_norm = self.config[name]["optimizer"].max_norm
            if max_norm is not None:
                torch.nn.utils.clip_grad_norm_(self.parameters[name], max_norm)
        for optimizer in multi_tensor_adam_step_(list(self.optimizers.values())):
            optimizer.step()
