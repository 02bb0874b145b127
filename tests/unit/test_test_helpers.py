"""The shared test helpers the equivalence tests lean on: rows by id (tests/helpers/rows_by_id.py)
and the patched ns-train (tests/helpers/ns_train_patched.py)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.ns_train_patched import PATCHES, SCRIPT, patched_ns_train
from tests.helpers.rows_by_id import grads_by_id, in_id_order, joined_by_id, one_copy


def _shards() -> tuple[torch.Tensor, dict, list]:
    """10 Gaussians by id (row i has id i), cut into 3 shards of scrambled rows (one empty)."""
    whole = {"means": torch.arange(30.0).reshape(10, 3), "means2d.grad": torch.arange(40.0).reshape(2, 10, 2)}
    cuts = [torch.tensor([7, 2, 9]), torch.tensor([], dtype=torch.long), torch.tensor([4, 0, 8, 1, 3, 5, 6])]
    parts = [
        {"ids": c, "grads": {"means": whole["means"][c], "means2d.grad": whole["means2d.grad"][:, c]}} for c in cuts
    ]
    return torch.arange(10), whole, parts


def test_shards_joined_by_id_are_the_whole_on_each_gaussian_dimension() -> None:
    _, whole, parts = _shards()
    got = grads_by_id(parts)
    assert set(got) == set(whole)
    for name, value in whole.items():
        assert torch.equal(got[name], value), name


def test_joined_by_id_keeps_the_first_parts_names_and_orders_the_ids() -> None:
    ids, whole, parts = _shards()
    got = joined_by_id(
        [{**p["grads"], "gauss_ids": p["ids"]} for p in parts],
        [p["ids"] for p in parts],
        lambda n: 1 if n.startswith("means2d") else 0,
    )
    assert torch.equal(got["gauss_ids"], ids) and torch.equal(got["means"], whole["means"])


def test_one_copy_drops_replicas_and_keeps_shards() -> None:
    _, _, parts = _shards()
    assert one_copy(parts) == parts
    replicas = [{"ids": torch.arange(4)}, {"ids": torch.arange(4)}]
    assert one_copy(replicas) == replicas[:1]


def test_in_id_order_moves_every_row_with_its_id() -> None:
    ids = torch.tensor([30, 10, 20])
    got = in_id_order({"ids": ids, "x": torch.tensor([[3.0], [1.0], [2.0]])}, ids)
    assert torch.equal(got["ids"], torch.tensor([10, 20, 30])) and torch.equal(
        got["x"], torch.tensor([[1.0], [2.0], [3.0]])
    )


def test_patched_ns_train_names_its_patches_and_refuses_an_unknown_one() -> None:
    assert set(PATCHES) == {"fault", "slow-eval", "slow-consolidate"}
    assert patched_ns_train("fault=12,1", "slow-eval=5") == [str(SCRIPT), "fault=12,1", "slow-eval=5"]
    with pytest.raises(SystemExit, match="unknown patch 'slow'"):
        patched_ns_train("slow=5")
