"""One rank's per-Gaussian rows: their declared schema and the only implementation of every row
operation (select, append, grow, update, export), each parameter's Adam moments carried along.

A Gaussian is one row of every per-Gaussian tensor (:func:`parameter_fields`, the strategy's
statistics and :data:`ID_FIELD`, put together by :func:`gaussian_schema`):

* its trained parameters (``gauss_params``: ``means``, ``scales``, ...), each with the moments of
  its own ``torch.optim.Adam`` (nerfstudio's ``Optimizers``: one optimizer per parameter name);
* the strategy's running statistics (the default strategy's ``grad2d``, ``count``, ``radii``;
  MCMC has none), kept in the strategy state as gsplat's strategies read them;
* its global id (``gauss_ids``, also in the strategy state), the same whatever the number of ranks.

:class:`GaussianRows` is a view over those three places (the model's ``ParameterDict``, its
strategy-state dict and, when bound, the optimizers). Every function that adds, removes, moves or
reorders Gaussians -- densification (``gaussians/strategy.py``, ``gaussians/mcmc.py``), shard moves
(``parallel/shard_moves.py``), gathers, checkpoints (``gaussians/checkpoint_keys.py``) -- goes through it.

Two rules keep every holder of a parameter right without a patch: a row operation never creates a
new ``nn.Parameter``. It gives the existing one new data (``param.data = ...``, gradient dropped, as
a new parameter would have none) and swaps the moments inside the optimizer's existing state, so
the model's ``ParameterDict``, the optimizer's param group, nerfstudio's ``Optimizers.parameters``
(gradient clipping) and Adam's state key stay the same object for the whole run. Rows are named by
a flat key (:meth:`RowSchema.keys`): ``param.<name>``, ``opt.<name>.<adam key>`` and
``state.<name>``; the checkpoints store them under these keys (docs/sharded.md).

One optimizer step over all parameter groups (a fused or foreach Adam over every Gaussian
parameter) can be built on :meth:`GaussianRows.parameters` and :meth:`GaussianRows.moments`: the
parameters are stable objects, so a fused optimizer may hold them (and their moments) for the whole
run; the row operations then reach its moments through :meth:`GaussianRows.adam_state`, the one
place that knows where moments live (docs/architecture.md, "Rows").

Shape letters: N Gaussians on this rank, M rows selected or added.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

RowIndex = slice | torch.Tensor
"""Rows of a tensor: a slice, int64 indices `[M]` or a bool mask `[N]`."""
Optimizers = Mapping[str, torch.optim.Optimizer] | None

#: The strategy-state entry holding the global ids.
IDS = "gauss_ids"
PARAM_PREFIX, OPT_PREFIX, STATE_PREFIX = "param.", "opt.", "state."


@dataclass(frozen=True)
class RowField:
    """One per-Gaussian tensor.

    Attributes:
        name: Its name (``gauss_params`` key for a parameter, strategy-state key otherwise).
        role: ``"parameter"``: trained, an ``nn.Parameter`` with Adam moments, saved, in the
            params-only file; ``"statistic"``: the strategy's running statistic, saved with the
            model's extra state, None until first accumulated; ``"id"``: the global id, saved
            everywhere.
        row_shape: Shape of one row (``()`` for a scalar per Gaussian).
        dtype: ``"compute"`` (the Gaussians' dtype: float32, or float64 in the float64 mode) or
            ``"int64"``.
        saved: Whether checkpoints hold it.
        on_new_rows: What rows a strategy adds get: ``"parent"`` (a copy of the parent's row:
            gsplat's duplicate and split) unless the operation says otherwise (MCMC zeroes
            statistics); a parameter's Adam moments always start at zero, ids are always given.

    How a row moves: every operation here takes every field's row together (shard moves, gathers
    in id order, checkpoint cuts); nothing is reduced over ranks once it is in a row (the
    statistics are summed over ranks before they are accumulated: ``parallel/mode.py``).
    """

    name: str
    role: Literal["parameter", "statistic", "id"]
    row_shape: tuple[int, ...] = ()
    dtype: Literal["compute", "int64"] = "compute"
    saved: bool = True
    on_new_rows: Literal["parent", "zero"] = "parent"

    @property
    def key(self) -> str:
        """Its flat row key: ``param.<name>`` or ``state.<name>``."""
        return (PARAM_PREFIX if self.role == "parameter" else STATE_PREFIX) + self.name

    def torch_dtype(self, compute: torch.dtype) -> torch.dtype:
        return torch.int64 if self.dtype == "int64" else compute


def parameter_fields(sh_degree: int = 3) -> tuple[RowField, ...]:
    """splatfacto's six trained parameters at ``sh_degree`` (raw: logs of the scales, logits of the
    opacities). A new per-Gaussian parameter is declared here (with its initial value in
    ``gaussians/initial.py`` and its optimizer in ``registry.py``; docs/architecture.md, "What a
    change touches", names the rest): every row operation, shard move, checkpoint format and the
    float64 rule then carry it."""
    num_rest = (sh_degree + 1) ** 2 - 1
    return (
        RowField("means", "parameter", (3,)),
        RowField("scales", "parameter", (3,)),
        RowField("quats", "parameter", (4,)),
        RowField("features_dc", "parameter", (3,)),
        RowField("features_rest", "parameter", (num_rest, 3)),
        RowField("opacities", "parameter", (1,)),
    )


#: The global id of every Gaussian (``gaussians/strategy.py:allocate_child_ids``, ``gaussians/mcmc.py``).
ID_FIELD = RowField(IDS, "id", dtype="int64")
#: The default strategy's running statistics (``gaussians/strategy.py:update_batch_statistics``).
DEFAULT_STATISTICS = (RowField("grad2d", "statistic"), RowField("count", "statistic"), RowField("radii", "statistic"))
#: The names of splatfacto's optimizer groups of Gaussian parameters (one per parameter field).
GAUSSIAN_PARAMETER_NAMES = tuple(f.name for f in parameter_fields())


@dataclass(frozen=True)
class RowSchema:
    """Every per-Gaussian tensor a model holds: its parameters, its strategy's statistics, the ids."""

    fields: tuple[RowField, ...]

    @property
    def parameters(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields if f.role == "parameter")

    @property
    def state_fields(self) -> tuple[RowField, ...]:
        """Statistics and the ids: the rows kept in the strategy state."""
        return tuple(f for f in self.fields if f.role != "parameter")

    def field(self, name: str) -> RowField:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"no per-Gaussian field {name!r} in the schema ({[f.name for f in self.fields]})")


def gaussian_schema(
    parameters: Sequence[str] | Sequence[RowField] = GAUSSIAN_PARAMETER_NAMES, statistics: Sequence[RowField] = ()
) -> RowSchema:
    """The schema of a model's rows: its parameters (fields, or names with shapes taken from the
    tensors), the strategy's ``statistics`` (``Densifier.statistics``), then the ids."""
    fields = tuple(p if isinstance(p, RowField) else RowField(p, "parameter") for p in parameters)
    return RowSchema((*fields, *statistics, ID_FIELD))


def _take(t: torch.Tensor, index: RowIndex) -> torch.Tensor:
    """Rows ``index`` of ``t`` in their own storage (a slice view would keep the whole tensor alive)."""
    out = t[index]
    return out.clone() if isinstance(index, slice) else out


def is_moment(key: str, value: Any) -> bool:
    """Whether an Adam state entry has one row per Gaussian (the moments; not ``step``)."""
    return key != "step" and isinstance(value, torch.Tensor) and value.dim() > 0


def _cat(own: torch.Tensor | None, incoming: torch.Tensor | None, num_own: int, num_new: int) -> torch.Tensor | None:
    """``own`` then ``incoming``; a missing side counts as zeros (a moment or statistic not yet
    accumulated is zero); None when both are missing."""
    if own is None and incoming is None:
        return None
    like = own if own is not None else incoming
    assert like is not None
    if own is None:
        own = like.new_zeros((num_own, *like.shape[1:]))
    if incoming is None:
        incoming = like.new_zeros((num_new, *like.shape[1:]))
    return torch.cat([own, incoming.to(own.device, own.dtype)])


RowFn = Callable[[RowField, torch.Tensor], torch.Tensor]
MomentFn = Callable[[str, str, torch.Tensor], torch.Tensor]


@dataclass(eq=False)
class GaussianRows:
    """One rank's per-Gaussian rows (see the module docstring).

    Args:
        schema: What the rows are.
        params: The trained parameters by name (the model's ``gauss_params``; a plain dict in tests).
        state: The strategy state (``Densifier.initial_state`` and the ids; its row entries are
            the schema's statistics and ids, any other entry is left alone).
        optimizers: One optimizer per parameter name (nerfstudio's ``Optimizers.optimizers``), or
            None (no moments: before the optimizers exist, or where none are used).

    **Invariants:** after every operation each parameter is the same ``nn.Parameter`` object as
    before (new data, no gradient) and its optimizer's only parameter; row ``i`` of every field
    and moment is the same Gaussian.
    """

    schema: RowSchema
    params: MutableMapping[str, torch.nn.Parameter]
    state: MutableMapping[str, Any]
    optimizers: Optimizers = field(default=None)

    def bound(self, optimizers: Optimizers) -> GaussianRows:
        """These rows with ``optimizers``' moments."""
        return GaussianRows(self.schema, self.params, self.state, optimizers)

    # ------------------------------------------------------------------ reading
    def __len__(self) -> int:
        return int(self.params[self.schema.parameters[0]].shape[0])

    @property
    def device(self) -> torch.device:
        return self.params[self.schema.parameters[0]].device

    @property
    def ids(self) -> torch.Tensor:
        """Global ids. `[N]`, int64."""
        return self.state[IDS]

    def parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The trained parameters, in schema order (stable objects: see the module docstring)."""
        return ((name, self.params[name]) for name in self.schema.parameters)

    def optimizer(self, name: str) -> torch.optim.Optimizer | None:
        """The optimizer of parameter ``name`` (None when there are none)."""
        if self.optimizers is None or name not in self.optimizers:
            return None
        opt = self.optimizers[name]
        groups = opt.param_groups
        if len(groups) != 1 or len(groups[0]["params"]) != 1 or groups[0]["params"][0] is not self.params[name]:
            raise ValueError(
                f"optimizer {name!r} must hold exactly the model's gauss_params[{name!r}] (one group, one parameter)"
            )
        return opt

    def adam_state(self, name: str) -> dict[str, Any]:
        """Parameter ``name``'s optimizer state (``step`` and moments; empty before its first step)."""
        opt = self.optimizer(name)
        return {} if opt is None else opt.state.get(self.params[name], {})

    def moments(self, name: str) -> dict[str, torch.Tensor]:
        """Parameter ``name``'s Adam moments (one row per Gaussian each), by Adam key."""
        return {k: v for k, v in self.adam_state(name).items() if is_moment(k, v)}

    def adam_step(self, name: str) -> torch.Tensor | None:
        return self.adam_state(name).get("step")

    def tensors(self) -> dict[str, torch.Tensor | None]:
        """Every per-Gaussian tensor by flat row key, as references (no copy). Moments are absent
        before the parameter's first step; statistics not yet accumulated are None; a declared
        field the state lacks (the default strategy's ``radii`` when the screen-size rule is off)
        is absent."""
        rows: dict[str, torch.Tensor | None] = {}
        for name, p in self.parameters():
            rows[PARAM_PREFIX + name] = p.detach()
            for key, value in self.moments(name).items():
                rows[f"{OPT_PREFIX}{name}.{key}"] = value
        for f in self.schema.state_fields:
            if f.name in self.state:
                value = self.state[f.name]
                rows[f.key] = None if value is None else value.detach()
        return dict(sorted(rows.items()))

    def export(self, index: RowIndex) -> dict[str, torch.Tensor | None]:
        """Copies of rows ``index`` of every per-Gaussian tensor, by row key (None where a
        statistic is None)."""
        return {k: None if v is None else _take(v, index) for k, v in self.tensors().items()}

    def describe(self) -> tuple[dict[str, tuple[torch.dtype, tuple[int, ...]]], dict[str, float]]:
        """What this rank holds: each row key's dtype and row shape, and Adam's ``step`` per
        parameter (where it has one). Ranks agree on it before rows move (``parallel/shard_moves.py``)."""
        keys = {k: (v.dtype, tuple(v.shape[1:])) for k, v in self.tensors().items() if v is not None}
        steps = {name: float(s) for name, _ in self.parameters() if (s := self.adam_step(name)) is not None}
        return keys, steps

    def check(self, compute_dtype: torch.dtype) -> None:
        """Raise ``ValueError`` where a row tensor's length, row shape or dtype is not the schema's
        (a declared ``row_shape`` of ``()`` on a parameter means "any")."""
        num = len(self)
        for key, value in self.tensors().items():
            if value is not None and value.device != self.device:
                raise ValueError(f"{key}: on {value.device}, the parameters on {self.device}")
            if value is None or key.startswith(OPT_PREFIX):
                continue
            f = self.schema.field(key.split(".", 1)[1])
            if value.shape[0] != num or value.dtype != f.torch_dtype(compute_dtype):
                raise ValueError(
                    f"{key}: expected {num} rows of {f.torch_dtype(compute_dtype)}, got {tuple(value.shape)} {value.dtype}"
                )
            if (f.row_shape or f.role != "parameter") and tuple(value.shape[1:]) != f.row_shape:
                raise ValueError(f"{key}: expected rows of shape {f.row_shape}, got {tuple(value.shape[1:])}")

    # ------------------------------------------------------------------ saved with the model
    def saved_state(self) -> dict[str, torch.Tensor]:
        """The statistics and ids the model's extra state saves (host copies; statistics not yet
        accumulated are left out); the parameters are saved as ``gauss_params`` by nerfstudio."""
        saved = {}
        for f in self.schema.state_fields:
            value = self.state.get(f.name)
            if f.saved and isinstance(value, torch.Tensor):
                saved[f.name] = value.detach().cpu()
        return saved

    def load_saved_state(self, saved: Mapping[str, torch.Tensor], device: torch.device | str) -> None:
        """Take :meth:`saved_state`'s entries (after the parameters were loaded); entries the
        schema does not declare are ignored. Without ids (a checkpoint from before global ids, or
        splatfacto's) the rows are numbered in order."""
        for f in self.schema.state_fields:
            if f.name in saved:
                self.state[f.name] = saved[f.name].to(device)
        if IDS not in saved:
            self.state[IDS] = torch.arange(len(self), dtype=torch.int64, device=device)

    def follow_parameters_(self) -> None:
        """Move the statistics and ids to the parameters' device. The state is a plain dict, which
        ``nn.Module.to`` does not reach: the model calls this whenever it moves."""
        device = self.device
        for f in self.schema.state_fields:
            value = self.state.get(f.name)
            if isinstance(value, torch.Tensor) and value.device != device:
                self.state[f.name] = value.to(device)

    # ------------------------------------------------------------------ the one primitive
    def _rebuild_(self, param_fn: RowFn, moment_fn: MomentFn, state_fn: RowFn) -> None:
        """Give every row tensor new rows: each parameter ``param_fn(field, old)`` (the same
        ``Parameter``, new data, no gradient), each moment ``moment_fn(name, adam key, old)``
        (``step`` kept), each statistic and the ids ``state_fn(field, old)`` (None stays None)."""
        for name, p in self.parameters():
            moments = self.adam_state(name)
            for key, value in list(moments.items()):
                if is_moment(key, value):
                    moments[key] = moment_fn(name, key, value)
            p.data = param_fn(self.schema.field(name), p.detach())
            p.grad = None
        for f in self.schema.state_fields:
            value = self.state.get(f.name)
            if isinstance(value, torch.Tensor):
                self.state[f.name] = state_fn(f, value)

    # ------------------------------------------------------------------ operations
    @torch.no_grad()
    def select_(self, index: RowIndex) -> None:
        """Keep only rows ``index``, in that order: removal (a mask), a cut (a slice), a
        permutation (indices). Adam's ``step`` is kept."""
        self._rebuild_(lambda f, t: _take(t, index), lambda n, k, t: _take(t, index), lambda f, t: _take(t, index))

    @torch.no_grad()
    def grow_(
        self,
        parents: torch.Tensor,
        ids: torch.Tensor,
        *,
        keep: RowIndex | None = None,
        values: Mapping[str, torch.Tensor] | None = None,
        statistics: Literal["parent", "zero"] | None = None,
    ) -> None:
        """Rows ``keep`` (all when None), in order, then one new row per entry of ``parents``.

        Args:
            parents: Rows (before the operation) each new row is made from. `[M]`, int64.
            ids: Global ids of the new rows. `[M]`, int64.
            keep: Rows that stay (a mask, indices or a slice); all when None.
            values: New rows of some parameters, by name (`[M, ...]`); the others copy the parent's.
            statistics: ``"parent"`` or ``"zero"``: what the new rows' statistics are (None: each
                field's ``on_new_rows``).

        New rows' Adam moments are zero; ``step`` is kept (gsplat 1.4.0's ``duplicate``/``split``).
        """
        values = values or {}

        def kept(t: torch.Tensor) -> torch.Tensor:
            return t if keep is None else _take(t, keep)

        def param_fn(f: RowField, t: torch.Tensor) -> torch.Tensor:
            new = values[f.name].to(t.dtype) if f.name in values else t[parents]
            return torch.cat([kept(t), new])

        def moment_fn(name: str, key: str, t: torch.Tensor) -> torch.Tensor:
            return torch.cat([kept(t), t.new_zeros((len(parents), *t.shape[1:]))])

        def state_fn(f: RowField, t: torch.Tensor) -> torch.Tensor:
            if f.role == "id":
                new = ids.to(t.device)
            elif (statistics or f.on_new_rows) == "zero":
                new = t.new_zeros((len(parents), *t.shape[1:]))
            else:
                new = t[parents]
            return torch.cat([kept(t), new])

        self._rebuild_(param_fn, moment_fn, state_fn)

    @torch.no_grad()
    def update_(
        self,
        rows: torch.Tensor | None,
        values: Mapping[str, torch.Tensor],
        *,
        zero_moments: Sequence[str] = (),
        zero_statistics: bool = False,
    ) -> None:
        """Write parameter values in place of rows ``rows`` (all rows when None), row count unchanged.

        Args:
            rows: Rows written (repeats allowed with equal values), `[M]`; None: ``values`` are whole tensors.
            values: New values by parameter name: `[M, ...]` (or `[N, ...]` when ``rows`` is None).
            zero_moments: Parameters whose Adam moments are zeroed at ``rows`` (all rows when None).
            zero_statistics: Zero the statistics at ``rows`` too.
        """

        def param_fn(f: RowField, t: torch.Tensor) -> torch.Tensor:
            if f.name not in values:
                return t
            new = values[f.name].to(t.dtype)
            return new if rows is None else t.index_put((rows,), new.reshape(-1, *t.shape[1:]))

        def zeroed(t: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(t) if rows is None else t.index_fill(0, rows, 0)

        def moment_fn(name: str, key: str, t: torch.Tensor) -> torch.Tensor:
            return zeroed(t) if name in zero_moments else t

        def state_fn(f: RowField, t: torch.Tensor) -> torch.Tensor:
            return zeroed(t) if zero_statistics and f.role == "statistic" else t

        self._rebuild_(param_fn, moment_fn, state_fn)

    @torch.no_grad()
    def append_(
        self, rows: Mapping[str, torch.Tensor | None], adam_steps: Mapping[str, torch.Tensor] | None = None
    ) -> None:
        """Append Gaussians (rows as :meth:`export` returns them) after these, in place.

        Args:
            rows: Every ``param.<name>`` `[M, ...]`; Adam moments and statistics where they exist
                (missing ones count as zeros, here and on this side).
            adam_steps: Adam's ``step`` per parameter name, used only where this side's optimizer
                has no state yet but moments arrive (otherwise this side's ``step`` is kept).

        Raises:
            ValueError: a parameter is missing from ``rows`` or its row shape differs.
        """
        num_own = len(self)
        first = PARAM_PREFIX + self.schema.parameters[0]
        num_new = int(rows[first].shape[0]) if first in rows else 0
        for name, p in self.parameters():
            incoming = rows.get(PARAM_PREFIX + name)
            if incoming is None or incoming.shape[1:] != p.shape[1:] or incoming.shape[0] != num_new:
                raise ValueError(f"append_: param.{name} missing or not [{num_new}, {tuple(p.shape[1:])}]")
            self._append_moments(name, rows, num_own, num_new, adam_steps)
            p.data = torch.cat([p.detach(), incoming.to(p.device, p.dtype)])
            p.grad = None
        for f in self.schema.state_fields:
            if f.name in self.state:
                self.state[f.name] = _cat(self.state[f.name], rows.get(f.key), num_own, num_new)

    def _append_moments(
        self,
        name: str,
        rows: Mapping[str, torch.Tensor | None],
        num_own: int,
        num_new: int,
        adam_steps: Mapping[str, torch.Tensor] | None,
    ) -> None:
        """:meth:`append_`'s moments of parameter ``name`` (before its data grows)."""
        p = self.params[name]
        state = self.adam_state(name)
        prefix = f"{OPT_PREFIX}{name}."
        keys = {k for k, v in state.items() if is_moment(k, v)} | {
            k[len(prefix) :] for k, v in rows.items() if k.startswith(prefix) and v is not None
        }
        if keys and "step" not in state:
            if adam_steps is None or name not in adam_steps:
                raise ValueError(f"append_: Adam moments of {name} arrive where none exist, and no step was given")
            opt = self.optimizer(name)
            if opt is None:
                return  # no optimizer here to carry them
            state = opt.state[p]  # Adam's defaultdict: the state this parameter's steps will read
            state["step"] = adam_steps[name].clone()
        for key in keys:
            state[key] = _cat(state.get(key, torch.zeros_like(p.detach())), rows.get(prefix + key), num_own, num_new)
