"""Rendering: one contract (gsplat 1.4.0's), two backends (gsplat kernels on CUDA, pure PyTorch).

Public API:

- ``project(...) -> Projection``: project Gaussians into C full cameras (EWA, gsplat conventions).
- ``rasterize_rows(proj, row_starts, num_rows, ...) -> RowRender``: render a band of rows of each
  camera; bands reproduce the whole image exactly (pixels, gradients, absgrad).
- ``rasterization(...)``: drop-in for ``gsplat.rasterization`` (``packed`` True or False: same
  images and gradients, gsplat's layout of ``meta``).

Layer rule: this package imports torch only; gsplat is imported lazily inside
``gsplat_backend``'s functions; nerfstudio never. See docs/rendering.md.
"""

from distsplat_ns.rendering.api import (
    BACKENDS,
    RASTERIZE_MODES,
    Backend,
    Projection,
    RowRender,
    project,
    rasterize_rows,
    resolve_backend,
)
from distsplat_ns.rendering.gsplat_compat import rasterization
from distsplat_ns.rendering.reference import DEFAULT_CHUNK_ELEMENTS
from distsplat_ns.rendering.sh import evaluate_sh

__all__ = [
    "BACKENDS",
    "DEFAULT_CHUNK_ELEMENTS",
    "RASTERIZE_MODES",
    "Backend",
    "Projection",
    "RowRender",
    "evaluate_sh",
    "project",
    "rasterization",
    "rasterize_rows",
    "resolve_backend",
]
