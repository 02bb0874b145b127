"""Fixtures of the data tests: small seeded image files written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.data_fixtures import write_images

# Mixed sizes on purpose: batches must never be stacked.
SIZES_HW = [
    (48, 64),
    (48, 64),
    (40, 56),
    (48, 64),
    (64, 48),
    (48, 64),
    (32, 32),
    (48, 64),
    (48, 64),
    (40, 56),
    (48, 64),
    (56, 40),
]


@pytest.fixture(scope="session")
def jpeg_paths(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """12 small JPEG files of mixed sizes (read-only by convention: copy before modifying)."""
    return write_images(tmp_path_factory.mktemp("jpegs"), SIZES_HW, seed=0)


@pytest.fixture()
def corrupt_copy(tmp_path: Path, jpeg_paths: list[Path]) -> tuple[list[Path], int]:
    """A copy of ``jpeg_paths`` whose image 5 is truncated to half its bytes; returns (paths, index)."""
    paths = []
    for path in jpeg_paths:
        target = tmp_path / path.name
        target.write_bytes(path.read_bytes())
        paths.append(target)
    bad = 5
    data = paths[bad].read_bytes()
    paths[bad].write_bytes(data[: len(data) // 2])
    return paths, bad
