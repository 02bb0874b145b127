"""What a rank renders its bands from, and what its training forward returns.

``DistSplatModel.forward_bands`` rasterizes a rank's bands from a :class:`ProjectionSource`: the
projections of this rank's own Gaussians (:class:`OwnProjections`, one process or replicated mode)
or the screen-space terms other ranks sent (``parallel/exchange.py:ReceivedProjections``, sharded
mode). The model does not know which: the parallel mode (``parallel/``) hands it the source.

Shape letters: N Gaussians, C cameras rendered by this rank, B images in the global batch.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from distsplat_ns.balance.bands import Band, num_tile_rows
from distsplat_ns.model.band_backward import PixelLink
from distsplat_ns.model.band_depth import BandDepth
from distsplat_ns.model.losses import halo_end_row
from distsplat_ns.rendering import Projection
from distsplat_ns.utils.cameras import downscaled_px

if TYPE_CHECKING:
    from nerfstudio.cameras.cameras import Cameras

    from distsplat_ns.utils.cameras import BatchCameras

StatisticsProjection = tuple[list[int], torch.Tensor, torch.Tensor]
"""``(batch positions [C], means2d [C, N, 2], radii [C, N])`` of one projection call of this
rank's own Gaussians: after backward ``means2d.grad``/``.absgrad`` hold its screen-space gradients."""

RenderGroup = tuple[int, Projection, list[list[Band]]]
"""``(first, projection, raster_calls)``: the projection covers the cameras
``positions[first : first + projection.num_cameras]``; each raster call holds one band per camera."""


class Projector(Protocol):
    """What a source needs of the model: ``DistSplatModel.render_inputs`` and ``project_gaussians``."""

    def render_inputs(self, cameras: Cameras, downscale: int) -> RenderInputs: ...

    def project_gaussians(
        self, viewmats: torch.Tensor, Ks: torch.Tensor, width: int, height: int, step: int
    ) -> Projection: ...


@dataclass(frozen=True)
class RenderInputs:
    """The cameras a rank renders, on the model's device: view matrices `[C, 4, 4]` (OpenCV),
    intrinsics `[C, 3, 3]` at the rendered scale, and each camera's rendered ``(width, height)``
    (px; cameras of one batch may differ in size)."""

    viewmats: torch.Tensor
    Ks: torch.Tensor
    sizes_px: list[tuple[int, int]]

    @property
    def width(self) -> int:
        """The rendered width, where every camera shares one size (``ValueError`` otherwise)."""
        return self._shared_size()[0]

    @property
    def height(self) -> int:
        """The rendered height, where every camera shares one size (``ValueError`` otherwise)."""
        return self._shared_size()[1]

    def _shared_size(self) -> tuple[int, int]:
        if len(set(self.sizes_px)) != 1:
            raise ValueError(
                f"cameras rendered in one call must share width and height, got (width, height) {sorted(set(self.sizes_px))}"
            )
        return self.sizes_px[0]


class ProjectionSource(Protocol):
    """Where a rank's bands are rasterized from (see the module docstring).

    Attributes:
        calls: The projections of this rank's own Gaussians that ``render_groups`` made (empty
            for a source of received terms), for ``BandRenderResult.projections``.
        anchors: Tensors the band backward must reach on every rank (``backward_bands``): a
            source whose backward is a collective names its output here.
        statistics_projections: The projection calls of this rank's Gaussians whose ``means2d``
            hold, after the backward, what this rank sums into the densification statistics
            (``parallel/mode.py:batch_statistics``).
    """

    calls: list[StatisticsProjection]
    anchors: tuple[torch.Tensor, ...]

    @property
    def statistics_projections(self) -> list[StatisticsProjection]: ...

    def render_groups(
        self,
        model: Projector,
        positions: Sequence[int],
        bands: Sequence[Band],
        cameras: BatchCameras[Cameras],
        downscale: int,
        step: int,
    ) -> Iterator[RenderGroup]:
        """The projections and raster calls that render ``bands`` (each band exactly once) of the
        ``cameras`` at ``positions``, rendered at ``downscale``."""
        ...


@dataclass
class OwnProjections:
    """This rank's own Gaussians projected into the cameras it renders (``render_calls``'s
    grouping). ``calls`` collects the projections made, for the densification statistics."""

    calls: list[StatisticsProjection] = field(default_factory=list)
    anchors: tuple[torch.Tensor, ...] = ()

    @property
    def statistics_projections(self) -> list[StatisticsProjection]:
        """The projections this rank rendered from: the gradients of its bands only (the
        replicated mode sums them over ranks)."""
        return self.calls

    def render_groups(
        self,
        model: Projector,
        positions: Sequence[int],
        bands: Sequence[Band],
        cameras: BatchCameras[Cameras],
        downscale: int,
        step: int,
    ) -> Iterator[RenderGroup]:
        inputs = model.render_inputs(
            cameras.at(positions), downscale
        )  # only a source that projects indexes its cameras
        for first, stop, raster_calls in render_calls(bands, list(positions), inputs.sizes_px):
            width, height = inputs.sizes_px[first]
            proj = model.project_gaussians(inputs.viewmats[first:stop], inputs.Ks[first:stop], width, height, step)
            self.calls.append((list(positions[first:stop]), proj.means2d, proj.radii))
            yield first, proj, raster_calls


@dataclass(frozen=True)
class RegularizerShare:
    """Which batch-independent loss terms a rank adds, so that the ranks' shares sum to one
    process's terms.

    Attributes:
        camera_penalty: This rank adds the camera optimizer's penalty (exactly one rank does).
        scale_term: This rank adds its Gaussians' part of the per-Gaussian means (the scale
            regulariser; under MCMC the opacity and scale terms).
        num_gaussians_total: Gaussians the scale regulariser's mean is taken over (all ranks').
    """

    camera_penalty: bool
    scale_term: bool
    num_gaussians_total: int


@dataclass
class BandRenderResult:
    """What one rank's training forward produced.

    Attributes:
        loss: This rank's share of the global batch loss (sum over ranks = whole-batch loss). 0-d.
        l1: This rank's share of the mean L1 (detached). 0-d.
        dssim: This rank's share of the mean ``1 - SSIM`` (detached). 0-d.
        projections: The projections of this rank's own Gaussians it rendered from
            (:class:`OwnProjections`; empty when it rendered received terms).
        band_tile_work: Per band, the renderer's work per tile of the tile rows it owns
            (``RowRender.tile_work``, the balancer's cost) `[tile_rows, tile_cols]`, int.
        pixel_links: Per band, its rendered pixels and their detached copy, for
            ``model/band_backward.py``'s ``backward_bands``.
        loss_terms: This rank's shares of the named batch-independent terms that are part of
            ``loss`` (splatfacto's loss-dict keys, e.g. ``mcmc_opacity_reg``), detached, 0-d each.
            Every rank has the same keys (zero where it adds no share), so the shares can be
            summed over ranks in one all-reduce.
    """

    loss: torch.Tensor
    l1: torch.Tensor
    dssim: torch.Tensor
    projections: list[StatisticsProjection] = field(default_factory=list)
    band_tile_work: list[tuple[Band, torch.Tensor]] = field(default_factory=list)
    pixel_links: list[PixelLink] = field(default_factory=list)
    loss_terms: dict[str, torch.Tensor] = field(default_factory=dict)
    band_depths: list[BandDepth] = field(default_factory=list)
    """With ``output_depth_during_training``: per band, its rows of the training depth
    (``model/band_depth.py``; the empty-pixel fill is the pipeline's, over every rank's bands)."""


def rendered_sizes_px(cameras: Cameras, downscale: int) -> list[tuple[int, int]]:
    """Each camera's rendered ``(width, height)`` at ``downscale`` (``utils/cameras.downscaled_px``).

    **Host sync:** only for device-side cameras (training passes host-side ones).
    """
    return [
        (downscaled_px(w, downscale), downscaled_px(h, downscale))
        for w, h in zip(cameras.width.reshape(-1).tolist(), cameras.height.reshape(-1).tolist(), strict=False)
    ]


def render_calls(
    bands: Sequence[Band], positions: list[int], sizes_px: Sequence[tuple[int, int]]
) -> list[tuple[int, int, list[list[Band]]]]:
    """How a rank's bands are rendered: ``(first, stop, raster_calls)`` per projection call.

    A projection call projects the cameras ``positions[first:stop]``; each of its raster calls
    holds one band per projected camera, all rendering the same number of rows (own rows plus SSIM
    halo). When every image has exactly one band of one common height and the cameras one size
    (one process, whole images on each rank, or a band of every image), the whole set is one
    projection and one raster call; otherwise each camera is projected alone and each of its
    bands rasterized alone. ``sizes_px`` is each camera's rendered ``(width, height)``.

    Raises:
        ValueError: A band of a position not in ``positions``, or one past the image's bottom.
    """
    local = {p: i for i, p in enumerate(positions)}
    by_camera: dict[int, list[Band]] = {}
    for band in bands:
        if band.position not in local:
            raise ValueError(f"band {band} refers to batch position {band.position}, which this rank was not given")
        height = sizes_px[local[band.position]][1]
        if band.end_row > num_tile_rows(height, band.tile_size):
            raise ValueError(f"band {band} ends past the image height {height}")
        by_camera.setdefault(local[band.position], []).append(band)
    heights = {
        halo_end_row(b[0].end_row_px(sizes_px[i][1]), sizes_px[i][1]) - b[0].first_row_px for i, b in by_camera.items()
    }
    one_size = len(set(sizes_px)) == 1
    if (
        one_size
        and len(by_camera) == len(positions)
        and all(len(b) == 1 for b in by_camera.values())
        and len(heights) == 1
    ):
        return [(0, len(positions), [[by_camera[i][0] for i in range(len(positions))]])]
    return [(i, i + 1, [[band] for band in camera_bands]) for i, camera_bands in sorted(by_camera.items())]
