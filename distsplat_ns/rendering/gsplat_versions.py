"""gsplat's API differences between 1.4.0 and 1.5.3 that this package meets, in one table.

``rendering/gsplat_backend.py`` calls gsplat through a :class:`GsplatApi` built from gsplat's
``__version__`` (read once there), so the package's own contract (``ProjectedGaussians.radii``
`[C, N]`, the packed meta's ``radii`` `[nnz]`) is the same on every supported gsplat.

The differences, each with the release that made it (compare ``gsplat/cuda/_wrapper.py``):

- gsplat 1.5.0: ``radii`` is per axis, `[C, N, 2]` / `[nnz, 2]` (x, y) where 1.4.0 had one radius
  `[C, N]` / `[nnz]`, both out of ``fully_fused_projection`` and into ``isect_tiles``.
- gsplat 1.5.3 (batch dimensions): ``isect_tiles``' ``n_cameras=``/``camera_ids=`` are renamed
  ``n_images=``/``image_ids=``, the packed ``fully_fused_projection`` returns ``batch_ids``
  ahead of ``camera_ids`` (8 outputs, not 7), and the packed ``rasterize_to_pixels`` asserts
  ``backgrounds`` `[D]` where 1.5.2 and older assert `[C, D]`.

gsplat 1.5.0, 1.5.1 and 1.5.2 have none of 1.5.3's changes: their ``_wrapper.py`` differ only in
functions the package does not call (1.5.2 adds the unscented-transform projection and from-world
rasterization, and fixes the 2DGS packed backward).

Not a call difference, so not here: gsplat 1.5's radii are 3.33 sigma per axis (and tightened by
opacity when ``opacities=`` is given) where 1.4.0's are 3 sigma of the major axis; the package's
reference projection keeps 1.4.0's rule (docs/gsplat_on_cpu.md).

The version is read from ``gsplat.__version__`` rather than from a signature: the radii's shape
appears in no signature, and the two differences came in different releases.

Shape legend: ``C`` cameras, ``N`` Gaussians, ``nnz`` visible (camera, Gaussian) pairs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import Tensor

__all__ = ["NEWEST_TESTED", "OLDEST", "GsplatApi", "gsplat_api", "parse_version"]

#: The tested range (pyproject's ``gsplat>=1.4.0,<=1.5.3``; scripts/test_gsplat_next.sh runs 1.5.0 to 1.5.3).
OLDEST = (1, 4, 0)
NEWEST_TESTED = (1, 5, 3)
#: The releases that made each difference.
_RADII_PER_AXIS = (1, 5, 0)
_IMAGE_IDS = (1, 5, 3)
_PACKED_BACKGROUNDS_OURS = (1, 5, 3)


def parse_version(text: str) -> tuple[int, int, int]:
    """``"1.5.3"`` (or ``"1.5.3+cu124"``, ``"1.5.3.dev0"``) -> ``(1, 5, 3)``.

    Raises:
        ValueError: ``text`` does not start with ``major.minor.patch``.
    """
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    if match is None:
        raise ValueError(f"gsplat version: expected 'major.minor.patch', got {text!r}")
    return int(match[1]), int(match[2]), int(match[3])


@dataclass(frozen=True)
class GsplatApi:
    """How to call one gsplat release; built by :func:`gsplat_api`.

    **Invariants:** ``radii_to_contract(radii_to_gsplat(r)) == r`` for every contract radius ``r``.
    """

    version: tuple[int, int, int]

    @property
    def radii_per_axis(self) -> bool:
        """gsplat >= 1.5.0: radii carry a trailing (x, y) axis."""
        return self.version >= _RADII_PER_AXIS

    @property
    def packed_backgrounds_ours(self) -> bool:
        """gsplat >= 1.5.3: ``rasterize_to_pixels(packed=True)`` asserts ``backgrounds`` of shape ``[D]``
        (the batch dims of packed ``means2d`` `[nnz, 2]` are empty), so gsplat's own packed
        ``rasterization`` refuses ``[C, D]`` backgrounds; the caller composites them itself."""
        return self.version >= _PACKED_BACKGROUNDS_OURS

    @property
    def image_ids(self) -> bool:
        """gsplat >= 1.5.3: ``isect_tiles`` takes ``n_images``/``image_ids``; packed projection returns ``batch_ids``."""
        return self.version >= _IMAGE_IDS

    def radii_to_contract(self, radii: Tensor) -> Tensor:
        """gsplat's radii -> the package's one radius per entry (`[C, N]` or `[nnz]`, int32, px).

        Per-axis radii become their larger axis: its square covers gsplat's (x, y) box, so the
        package's tile and halo footprints never miss a pixel gsplat would render.
        """
        return radii.amax(dim=-1) if self.radii_per_axis else radii

    def radii_to_gsplat(self, radii: Tensor) -> Tensor:
        """The package's radii (`[C, N]` or `[nnz]`) -> what this gsplat's ``isect_tiles`` takes."""
        return radii[..., None].expand(*radii.shape, 2) if self.radii_per_axis else radii

    def isect_ids_kwargs(self, num_cameras: int, camera_ids: Tensor | None = None) -> dict[str, object]:
        """``isect_tiles``' camera-count (and packed camera-id) keywords under this release's names."""
        if self.image_ids:
            # Without batch dimensions gsplat's image index is the camera index (gsplat 1.5.3's
            # rendering.py: image_ids = batch_ids * C + camera_ids, batch_ids all 0).
            kwargs: dict[str, object] = {"n_images": num_cameras}
            if camera_ids is not None:
                kwargs["image_ids"] = camera_ids
            return kwargs
        kwargs = {"n_cameras": num_cameras}
        if camera_ids is not None:
            kwargs["camera_ids"] = camera_ids
        return kwargs

    def split_packed_projection(self, outputs: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Packed ``fully_fused_projection``'s outputs -> gsplat 1.4.0's 7: ``(camera_ids, gaussian_ids, radii, ...)``.

        ``radii`` stays in this release's shape (for ``isect_tiles``); ``batch_ids`` (all 0 without
        batch dimensions) is dropped.

        Raises:
            ValueError: the number of outputs is not this release's.
        """
        expected = 8 if self.image_ids else 7
        if len(outputs) != expected:
            raise ValueError(
                f"gsplat {self.version}: packed projection gave {len(outputs)} outputs, expected {expected}"
            )
        return tuple(outputs[1:]) if self.image_ids else tuple(outputs)


def gsplat_api(version: str) -> GsplatApi:
    """The calling table for gsplat ``version`` (``gsplat.__version__``).

    Raises:
        ValueError: ``version`` is older than 1.4.0 (the package was never written for it).
    """
    parsed = parse_version(version)
    if parsed < OLDEST:
        raise ValueError(f"gsplat version: expected >= {'.'.join(map(str, OLDEST))}, got {version!r}")
    return GsplatApi(parsed)
