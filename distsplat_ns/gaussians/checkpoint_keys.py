"""Where the per-Gaussian rows live in nerfstudio's checkpoint dictionary: the one mapping between
flat row keys (``gaussians/rows.py``) and the three places a checkpoint holds them.

A checkpoint (``checkpoint.py:checkpoint_payload``; the replicated ``step-N.ckpt``, the sharded
``step-N.dcp``'s rest plus rows, and the params-only consolidation) holds a Gaussian's row in:

* ``pipeline["_model.gauss_params.<name>"]``: ``param.<name>``;
* ``pipeline["_model._extra_state"]["strategy_state"][<name>]``: ``state.<name>`` (statistics and
  ids; ``DistSplatModel.get_extra_state`` puts only rows there);
* ``optimizers[<name>]["state"][0][<adam key>]``: ``opt.<name>.<adam key>`` (every entry but ``step``).

Nothing else in a checkpoint is a row, whatever its shape. The format is b53ba80's, unchanged
(tests/unit/test_old_checkpoints.py loads files that code wrote).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from distsplat_ns.gaussians.rows import OPT_PREFIX, PARAM_PREFIX, STATE_PREFIX, is_moment

#: Prefix of the model's entries in the pipeline's state dict (nerfstudio's ``VanillaPipeline._model``).
MODEL_PREFIX = "_model."
#: The model's extra state (``DistSplatModel.get_extra_state``) in the pipeline's state dict.
MODEL_EXTRA_KEY = MODEL_PREFIX + "_extra_state"
_PARAMS = "gauss_params."
_STRATEGY = "strategy_state"


def _model_prefix(pipeline: Mapping[str, Any]) -> str:
    """``_model.``, or ``module._model.`` in a checkpoint of a DDP-wrapped pipeline."""
    return "module." + MODEL_PREFIX if "module." + MODEL_PREFIX + _PARAMS + "means" in pipeline else MODEL_PREFIX


def parameter_names(pipeline: Mapping[str, Any]) -> list[str]:
    """The Gaussian parameters a checkpoint's pipeline holds."""
    head = _model_prefix(pipeline) + _PARAMS
    return [k[len(head) :] for k in pipeline if k.startswith(head)]


def checkpoint_rows(loaded: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Every row a checkpoint holds, by flat row key (references, no copy)."""
    pipeline = loaded["pipeline"]
    prefix = _model_prefix(pipeline)
    rows = {PARAM_PREFIX + name: pipeline[prefix + _PARAMS + name] for name in parameter_names(pipeline)}
    extra = pipeline.get(prefix + "_extra_state")
    if isinstance(extra, dict):
        rows.update({STATE_PREFIX + k: v for k, v in extra.get(_STRATEGY, {}).items()})
    for name in parameter_names(pipeline):
        opt = loaded.get("optimizers", {}).get(name)
        for param_state in opt.get("state", {}).values() if isinstance(opt, dict) else ():
            rows.update({f"{OPT_PREFIX}{name}.{k}": v for k, v in param_state.items() if is_moment(k, v)})
    return rows


def put_rows_(loaded: dict[str, Any], rows: Mapping[str, torch.Tensor]) -> None:
    """Write ``rows`` (flat keys) where ``loaded`` holds them, in place: parameters, the whole
    ``strategy_state`` (statistics and ids: replaced by the ``state.`` rows), and the moments into
    the optimizer states that ``loaded["optimizers"]`` has for their parameter (state ``0``)."""
    pipeline = loaded["pipeline"]
    prefix = _model_prefix(pipeline)
    model_extra_state(loaded)[_STRATEGY] = {
        k[len(STATE_PREFIX) :]: v for k, v in rows.items() if k.startswith(STATE_PREFIX)
    }
    for key, value in rows.items():
        if key.startswith(PARAM_PREFIX):
            pipeline[prefix + _PARAMS + key[len(PARAM_PREFIX) :]] = value
        elif key.startswith(OPT_PREFIX):
            name, moment = key[len(OPT_PREFIX) :].split(".", 1)
            opt = loaded.get("optimizers", {}).get(name)
            if isinstance(opt, dict):
                states = opt.setdefault("state", {})
                states.setdefault(next(iter(states), 0), {})[moment] = value


def model_extra_state(loaded: dict[str, Any]) -> dict[str, Any]:
    """The model's extra state in ``loaded`` (created empty where there is none: splatfacto's)."""
    pipeline = loaded["pipeline"]
    key = _model_prefix(pipeline) + "_extra_state"
    if not isinstance(pipeline.get(key), dict):
        pipeline[key] = {}
    return pipeline[key]


def step_only_states(
    optimizer_states: Mapping[str, Any], names: Sequence[str], adam_steps: Mapping[str, torch.Tensor]
) -> dict[str, Any]:
    """``optimizer_states`` (optimizer ``state_dict()``s by name) with those of parameters ``names``
    reduced to Adam's ``step`` (``adam_steps[name]``; no state where it has none) and param groups."""
    out = dict(optimizer_states)
    for name in names:
        if name in out:
            state = {0: {"step": adam_steps[name]}} if name in adam_steps else {}
            out[name] = {"state": state, "param_groups": out[name]["param_groups"]}
    return out


def without_rows(payload: Mapping[str, Any], adam_steps: Mapping[str, torch.Tensor]) -> dict[str, Any]:
    """``payload`` (a checkpoint dictionary) with its rows taken out: no Gaussian parameters, the
    extra state without ``strategy_state``, and each Gaussian optimizer's state reduced to Adam's
    ``step`` (``adam_steps[name]``; no state where a parameter has none) and its param groups.
    :func:`put_rows_` puts rows back. ``payload`` itself is not changed."""
    pipeline = dict(payload["pipeline"])
    prefix = _model_prefix(pipeline)
    names = parameter_names(pipeline)
    for name in names:
        del pipeline[prefix + _PARAMS + name]
    extra = dict(pipeline.get(prefix + "_extra_state", {}))
    extra.pop(_STRATEGY, None)
    pipeline[prefix + "_extra_state"] = extra
    return {**payload, "pipeline": pipeline, "optimizers": step_only_states(payload["optimizers"], names, adam_steps)}


def cut_rows_(loaded: dict[str, Any], index: torch.Tensor) -> None:
    """Keep rows ``index`` (int64 `[M]`) of every row ``loaded`` holds, in that order, in place."""
    put_rows_(loaded, {key: value[index] for key, value in checkpoint_rows(loaded).items()})


def saved_ids(loaded: Mapping[str, Any]) -> torch.Tensor | None:
    """The global ids a checkpoint holds (None in one from before global ids, or splatfacto's)."""
    return checkpoint_rows(loaded).get(STATE_PREFIX + "gauss_ids")
