"""The received rows per batch position, ordered by global id (parallel/exchange.py:
_rows_by_position): one rendered position takes one sort of every row, several take their
(source, position) blocks; both must give each position its rows in ascending id."""

from __future__ import annotations

import torch

from distsplat_ns.parallel.exchange import _rows_by_position


def _expected(recv_by_source: list[list[int]], recv_ids: torch.Tensor, rendered: set[int]) -> dict[int, list[int]]:
    """Row indices per position, by a loop over every row (source-major, then position-major)."""
    out: dict[int, list[int]] = {p: [] for p in rendered}
    row = 0
    for counts in recv_by_source:
        for position, n in enumerate(counts):
            if n:
                out[position].extend(range(row, row + n))
            row += n
    return {p: sorted(rows, key=lambda r: int(recv_ids[r])) for p, rows in out.items()}


def _as_lists(got: dict[int, torch.Tensor]) -> dict[int, list[int]]:
    assert all(t.dtype == torch.int64 and t.ndim == 1 for t in got.values())
    return {p: t.tolist() for p, t in got.items()}


def test_one_rendered_position_sorts_every_row_by_id():
    recv_by_source = [[0, 3], [0, 0], [0, 2], [0, 1]]  # rows for position 1 only, from three of four ranks
    recv_ids = torch.tensor([7, 2, 40, 5, 1, 30])
    got = _rows_by_position(recv_by_source, recv_ids, {1})
    assert _as_lists(got) == _expected(recv_by_source, recv_ids, {1}) == {1: [4, 1, 3, 0, 5, 2]}


def test_several_rendered_positions_each_get_their_own_rows_by_id():
    recv_by_source = [[2, 1, 0], [1, 0, 2]]  # positions 0 and 1 and 2 from two ranks
    recv_ids = torch.tensor([9, 3, 8, 4, 6, 5])
    got = _rows_by_position(recv_by_source, recv_ids, {0, 1, 2})
    assert _as_lists(got) == _expected(recv_by_source, recv_ids, {0, 1, 2}) == {0: [1, 3, 0], 1: [2], 2: [5, 4]}


def test_positions_that_receive_nothing_have_empty_entries():
    assert _as_lists(_rows_by_position([[0], [0]], torch.zeros(0, dtype=torch.int64), {0})) == {0: []}
    got = _rows_by_position([[0, 2]], torch.tensor([5, 1]), {0, 1})
    assert _as_lists(got) == {0: [], 1: [1, 0]}
