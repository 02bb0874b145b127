"""The sharded exchange sends each row's global id inside its payload (parallel/exchange.py:
_ScreenTermExchange): ids whose bytes read as NaN, infinity, -0.0 or denormals arrive bit for bit."""

from __future__ import annotations

import pytest
import torch

from tests.helpers import exchange_fns
from tests.helpers.multiproc import run_ranks


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_ids_ride_in_the_payload_bit_for_bit_and_order_the_rows(dtype: str) -> None:
    (ids0, dtype0), (ids1, dtype1) = run_ranks(exchange_fns.exchanged_ids, 2, dtype)
    assert ids0.shape == (0,)  # rank 0's rows see no Gaussian
    # Rank 1 renders every Gaussian of both shards, in ascending global id.
    assert torch.equal(ids1, torch.tensor(sorted(exchange_fns.ODD_IDS[0] + exchange_fns.ODD_IDS[1])))
    assert dtype0 == dtype1 == getattr(torch, dtype)
