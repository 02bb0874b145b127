"""Per-Gaussian tensors in global-id order: how a test compares the Gaussians of W ranks (each
holding a shard, or every one of them) with one process's, whatever order each holds its rows in.

Every function orders with ``id_order`` (a stable sort; the ids of one model are distinct, so
it is the one permutation that sorts them). Tensors are read, never written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import torch


def id_order(ids: torch.Tensor) -> torch.Tensor:
    """The permutation that puts ``ids`` (`[N]`) in ascending order."""
    return torch.sort(ids, stable=True).indices


def first_dim(name: str) -> int:
    """Where a row tensor holds its Gaussians: dimension 0."""
    return 0


def gaussian_dim(name: str) -> int:
    """Where a test's per-Gaussian tensor ``name`` holds its Gaussians: dimension 1 for the
    screen-space statistics (``means2d.*``, `[batch, N, 2]`), dimension 0 for the rest."""
    return 1 if name.startswith("means2d") else 0


def in_id_order(
    rows: Mapping[str, torch.Tensor], ids: torch.Tensor, dim_of: Callable[[str], int] = first_dim
) -> dict[str, torch.Tensor]:
    """Each tensor of ``rows`` (its Gaussians along ``dim_of(name)``, in the order of ``ids``)
    in id order."""
    order = id_order(ids)
    return {name: value.index_select(dim_of(name), order) for name, value in rows.items()}


def joined_by_id(
    parts: Sequence[Mapping[str, torch.Tensor]], ids: Sequence[torch.Tensor], dim_of: Callable[[str], int] = first_dim
) -> dict[str, torch.Tensor]:
    """The tensors of ``parts`` (one a rank, the names of the first), concatenated in part order
    and put in the id order of ``ids`` (each part's ids, in the same order)."""
    joined = {name: torch.cat([p[name] for p in parts], dim=dim_of(name)) for name in parts[0]}
    return in_id_order(joined, torch.cat(list(ids)), dim_of)


def one_copy(parts: Sequence[Mapping], ids_key: str = "ids") -> list:
    """``parts`` (each with its Gaussians' ids under ``ids_key``), or the first alone where the
    ids repeat across them (replicated: every rank holds every Gaussian)."""
    ids = torch.cat([p[ids_key] for p in parts])
    return list(parts[:1]) if len(torch.unique(ids)) < len(ids) else list(parts)


def grads_by_id(parts: Sequence[Mapping]) -> dict[str, torch.Tensor]:
    """The per-Gaussian tensors of rank results (each ``{"ids": [N], "grads": {name: tensor}}``,
    along ``gaussian_dim``) joined and in id order, under the names of the first part's grads."""
    return joined_by_id([p["grads"] for p in parts], [p["ids"] for p in parts], gaussian_dim)


def gaussians_by_id(parts: Sequence[tuple[dict, dict, dict]]) -> dict[str, torch.Tensor]:
    """Every parameter, Adam moment and densification statistic of the union of ``parts``
    (``(params, optimizers, strategy state)`` triples, each state with its ``gauss_ids``) in id
    order, the ids under "gauss_ids"; the moments under ``"<param>.exp_avg"`` and
    ``"<param>.exp_avg_sq"``. Asserts every part's Adam step count of a parameter is the same."""
    rows: dict[str, torch.Tensor] = {"gauss_ids": torch.cat([s["gauss_ids"] for _, _, s in parts])}
    for k in parts[0][0]:
        rows[k] = torch.cat([p[k].detach() for p, _, _ in parts])
        for m in ("exp_avg", "exp_avg_sq"):
            rows[f"{k}.{m}"] = torch.cat([o[k].state[p[k]][m] for p, o, _ in parts])
        steps = {float(o[k].state[p[k]]["step"]) for p, o, _ in parts}
        assert len(steps) == 1, k
    for key in ("grad2d", "count", "radii"):
        if key in parts[0][2]:  # the default strategy's statistics (MCMC keeps none)
            rows[key] = torch.cat([s[key] for _, _, s in parts])
    return in_id_order(rows, rows["gauss_ids"])


def checkpoint_by_id(ckpt: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """A checkpoint's pipeline state (a step-N.ckpt file, or a sharded run's step-N.dcp read whole
    in this process) and its Gaussian parameters in global-id order, the ids under "ids"."""
    from distsplat_ns.parallel.shard_checkpoint import read_shard_checkpoint

    if ckpt.is_dir():
        state = read_shard_checkpoint(None, ckpt, 0, 1, sharded=False)["pipeline"]
    else:
        state = torch.load(ckpt, map_location="cpu", weights_only=True)["pipeline"]
    prefix = "_model.gauss_params."
    rows = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    rows["ids"] = state["_model._extra_state"]["strategy_state"]["gauss_ids"]
    return state, in_id_order(rows, rows["ids"])


def checkpoint_rows_by_id(ckpt: Path) -> dict[str, torch.Tensor]:
    """``checkpoint_by_id``'s Gaussian parameters alone (the ids under "ids")."""
    return checkpoint_by_id(ckpt)[1]
