"""``parallel/streamed_file.py``: a file written with placeholders filled piece by piece loads with
``torch.load`` exactly as ``torch.save`` of the same payload, and a missing piece is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from distsplat_ns.parallel import streamed_file
from distsplat_ns.parallel.streamed_file import write_streamed


def _pieces(source: torch.Tensor, positions: torch.Tensor, size: int):
    """A fill writing ``source``'s rows to ``positions`` (a permutation), ``size`` rows at a time."""

    def fill(write) -> None:
        for start in range(0, positions.numel(), size):
            write(source[start : start + size], positions[start : start + size])

    return fill


@pytest.fixture(params=["layout", "filled"])
def save_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways of writing: the layout then the rows (torch >= 2.5), and the placeholders filled in
    memory then saved whole (torch < 2.5: no ``skip_data``, distributed/torch_compat.py)."""
    if request.param == "filled":
        monkeypatch.setattr(streamed_file, "save_layout_only", lambda: None)
    elif streamed_file.save_layout_only() is None:
        pytest.skip("this torch has no torch.serialization.skip_data (before 2.5)")
    return request.param


@pytest.mark.parametrize("piece_rows", [1, 5, 1000])
def test_streamed_file_loads_as_torch_save_of_the_whole(tmp_path: Path, piece_rows: int, save_path: str) -> None:
    gen = torch.Generator().manual_seed(0)
    num = 37
    rest = torch.randn(num, 15, 3, generator=gen)
    means = torch.randn(num, 3, generator=gen, dtype=torch.float64)
    saved_order = torch.randperm(num, generator=gen)  # row j of the source goes to row saved_order[j]
    ph_rest, ph_means = torch.empty(num, 15, 3), torch.empty(num, 3, dtype=torch.float64)
    ids = torch.arange(num)
    rng = torch.randint(0, 255, (16,), dtype=torch.uint8, generator=gen)
    payload = {
        "pipeline": {"_model.rest": ph_rest, "_model.means": ph_means, "ids": ids},
        "rng": rng,
        "step": 7,
        "opt": [torch.ones(2), {"lr": 0.1}],
    }
    fills = {
        id(ph_rest): _pieces(rest, torch.arange(num), piece_rows),  # in order: one write per piece
        id(ph_means): _pieces(means[saved_order], saved_order, piece_rows),
    }
    write_streamed(tmp_path / "f.ckpt", payload, fills)
    loaded = torch.load(tmp_path / "f.ckpt", map_location="cpu", weights_only=True)
    assert torch.equal(loaded["pipeline"]["_model.rest"], rest)
    # means[saved_order[j]] was written to row saved_order[j]: the file holds means itself.
    assert (
        torch.equal(loaded["pipeline"]["_model.means"], means)
        and loaded["pipeline"]["_model.means"].dtype == torch.float64
    )
    assert torch.equal(loaded["pipeline"]["ids"], ids) and torch.equal(loaded["rng"], rng)
    assert loaded["step"] == 7 and torch.equal(loaded["opt"][0], torch.ones(2)) and loaded["opt"][1] == {"lr": 0.1}


def test_a_fill_that_misses_rows_is_refused(tmp_path: Path, save_path: str) -> None:
    placeholder = torch.empty(10, 3)

    def short(write) -> None:
        write(torch.zeros(9, 3), torch.arange(9))

    with pytest.raises(RuntimeError, match="10 rows .* got 9"):
        write_streamed(tmp_path / "f.ckpt", {"x": placeholder}, {id(placeholder): short})


def test_a_placeholder_outside_the_payload_is_refused(tmp_path: Path) -> None:
    stray = torch.empty(4, 3)
    with pytest.raises(RuntimeError, match="1 placeholder"):
        write_streamed(tmp_path / "f.ckpt", {"x": torch.ones(2)}, {id(stray): lambda write: None})
