"""Small value types passed between layers.

Shape letters: N Gaussians, C cameras, H/W pixels, B images in a step's global batch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ImageBand:
    """Rows ``[first_row, end_row)`` (pixels, at the resolution rendered this step) of one image.

    Attributes:
        position: Index of the image in the step's global batch (``0 <= position < B``).
        first_row: First pixel row owned by this band.
        end_row: One past the last pixel row owned by this band.
    """

    position: int
    first_row: int
    end_row: int

    def __post_init__(self) -> None:
        if self.position < 0:
            raise ValueError(f"ImageBand.position must be >= 0, got {self.position}")
        if not 0 <= self.first_row < self.end_row:
            raise ValueError(f"ImageBand rows must satisfy 0 <= first_row < end_row, got [{self.first_row}, {self.end_row})")

    @property
    def num_rows(self) -> int:
        return self.end_row - self.first_row
