"""One rendering contract, two backends: ``project``, ``rasterize_rows`` and ``rasterization``.

- ``project`` projects the Gaussians once per full camera (EWA, gsplat 1.4.0 conventions).
- ``rasterize_rows`` renders any band of rows of each camera's image from that projection; bands
  rendered separately (even on different processes) reproduce the whole image's pixels and, summed,
  its gradients and absgrad.
- ``rasterization`` (``gsplat_compat.py``) is gsplat's ``rasterization`` built from the two.

Backends: ``"gsplat"`` (CUDA tensors: gsplat's fused kernels), ``"reference"`` (pure PyTorch, any
device), ``"auto"`` (gsplat for CUDA tensors, otherwise the reference).

Shape legend: ``C`` cameras, ``N`` Gaussians, ``K`` SH bases, ``D`` channels, ``H``, ``W`` pixels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from distsplat_ns.balance.planner import INTERSECTIONS
from distsplat_ns.rendering import projection as _ref_projection
from distsplat_ns.rendering import reference as _ref_raster
from distsplat_ns.rendering.sh import evaluate_sh

__all__ = [
    "BACKENDS",
    "BAND_COST_FRACTIONS",
    "RASTERIZE_MODES",
    "WORK_UNITS",
    "Backend",
    "Projection",
    "RowRender",
    "project",
    "rasterize_rows",
    "resolve_backend",
]

Backend = Literal["auto", "gsplat", "reference"]
"""A rasterizer: ``--pipeline.model.rendering-backend`` (see the module docstring)."""
BACKENDS: tuple[Backend, ...] = get_args(Backend)
_RENDER_MODES = ("RGB", "RGB+ED")
RASTERIZE_MODES = ("classic", "antialiased")
"""The rasterize modes both backends render (splatfacto's ``rasterize_mode``)."""
WORK_UNITS = {"gsplat": INTERSECTIONS, "reference": "composited pixel-Gaussian pairs"}
"""What ``RowRender.tile_work`` counts on each backend: the unit of the balancer's costs (gsplat's
is the planner's legacy unit, the one a history saved without a unit was measured in)."""
BAND_COST_FRACTIONS = {"gsplat": 0.0, "reference": 0.056}
"""The fixed cost of rendering one more band (its camera's projection and render call), as a
fraction of a mean image's cost, per backend: the balancer's ``band_cost_fraction``. reference:
measured by ``benchmarks/bench_cost_unit.py`` (11.6 ms a band, 0.056 of a 231 ms image's pairs;
docs/balance.md, "With a fixed cost per band"). gsplat: not measured yet (no GPU was lent since
the band cost), so 0: the balancer snaps within its tolerance instead; scripts/gpu_check.sh
measures it (cost_unit.json, summary.band_cost_fraction)."""
_MIN_ALPHA_FOR_DEPTH = 1e-10  # gsplat divides accumulated depth by alpha.clamp(min=1e-10)
_KEEPALIVE_ATTR = "_distsplat_band_means2d"  # on proj.means2d: the gsplat bands' shifted means


@dataclass
class Projection:
    """Gaussians projected into C full cameras: the input of ``rasterize_rows``.

    Entries with ``radii == 0`` are culled (gsplat fills them with zeros).

    Attributes:
        means2d: Projected centres. `[C, N, 2]`, px. Retains its gradient: after backward,
            ``means2d.grad`` is d loss / d means2d and, if any ``rasterize_rows`` call asked for
            it, ``means2d.absgrad`` holds gsplat's absgrad summed over those calls.
        conics: Inverse 2D covariances ``(a, b, c)``. `[C, N, 3]`, 1/px^2.
        depths: Camera-space z. `[C, N]`, world units.
        radii: 3-sigma screen radius, 0 = culled. `[C, N]`, int32, px.
        opacities: Per-camera opacities (times the antialiasing compensation in antialiased mode).
            `[C, N]`, in [0, 1].
        colors: Per-camera colours to splat; for ``RGB+ED`` the last channel is the depth.
            `[C, N, D]`.
        width: Image width, px.
        height: Image height, px.
        backend: ``"gsplat"`` or ``"reference"``: which backend made it and will rasterize it.
        render_mode: ``"RGB"`` or ``"RGB+ED"``.
        num_cameras: C.
        num_gaussians: N.
        compensations: ``sqrt(det_orig / det_blur)`` in antialiased mode, else None. `[C, N]`.
    """

    means2d: Tensor
    conics: Tensor
    depths: Tensor
    radii: Tensor
    opacities: Tensor
    colors: Tensor
    width: int
    height: int
    backend: str
    render_mode: str
    num_cameras: int
    num_gaussians: int
    compensations: Tensor | None = None


@dataclass
class RowRender:
    """Rows ``[row_starts[c], row_starts[c] + num_rows)`` of every camera's image.

    Attributes:
        colors: Rendered colours (background applied); for ``RGB+ED`` the last channel is the
            expected depth (no background). `[C, num_rows, W, D]`.
        alphas: Accumulated opacity ``1 - T_final``. `[C, num_rows, W, 1]`.
        tile_counts: Gaussian-tile intersections per tile of the grid that was rasterized:
            entry ``[c, k, j]`` is whole-image tile row ``tile_row_starts[c] + k``, column ``j``.
            `[C, num_tile_rows, ceil(W / tile_size)]`, int32. When every ``row_starts[c]`` is a
            multiple of ``tile_size`` (always so for whole images), ``num_tile_rows`` is
            ``ceil(num_rows / tile_size)`` and row ``k`` covers band rows ``[k*ts, (k+1)*ts)``.
        tile_work: The backend's work per tile of the same grid, in ``WORK_UNITS[backend]``: the
            balancer's cost. gsplat: ``tile_counts`` (its kernels loop over a tile's
            intersections); reference: composited pairs, which its time follows where the
            intersections do not (docs/balance.md, "The reference backend's cost unit").
            `[C, num_tile_rows, ceil(W / tile_size)]`.
        row_starts: First image row of each camera's band. Length C.
        num_rows: Rows per band.
        tile_size: Tile side, px.
        tile_row_starts: ``row_starts[c] // tile_size``. Length C.
    """

    colors: Tensor
    alphas: Tensor
    tile_counts: Tensor
    tile_work: Tensor
    row_starts: list[int]
    num_rows: int
    tile_size: int
    tile_row_starts: list[int]


def resolve_backend(backend: str, device: torch.device) -> str:
    """The backend that will run for tensors on ``device``.

    Args:
        backend: ``"auto"``, ``"gsplat"`` or ``"reference"``.
        device: Where the Gaussians live.

    Returns:
        ``"gsplat"`` or ``"reference"``.

    Raises:
        ValueError: unknown backend, or ``"gsplat"`` for non-CUDA tensors.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "auto":
        return "gsplat" if device.type == "cuda" else "reference"
    if backend == "gsplat" and device.type != "cuda":
        raise ValueError(f"backend='gsplat' needs CUDA tensors, got tensors on device '{device}'")
    return backend


def _check_shape(name: str, tensor: Tensor, shape: tuple[int | None, ...]) -> None:
    ok = tensor.dim() == len(shape) and all(s is None or s == t for s, t in zip(shape, tensor.shape, strict=False))
    if not ok:
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{name} must have shape {want}, got {list(tensor.shape)}")


def _validate_project_inputs(
    means: Tensor, quats: Tensor, scales: Tensor, opacities: Tensor, colors: Tensor,
    viewmats: Tensor, Ks: Tensor, width: int, height: int, sh_degree: int | None,
    rasterize_mode: str, render_mode: str,
) -> None:  # fmt: skip
    num_gaussians = means.shape[0] if means.dim() == 2 else None
    _check_shape("means", means, (None, 3))
    _check_shape("quats", quats, (num_gaussians, 4))
    _check_shape("scales", scales, (num_gaussians, 3))
    _check_shape("opacities", opacities, (num_gaussians,))
    _check_shape("viewmats", viewmats, (None, 4, 4))
    num_cameras = viewmats.shape[0]
    _check_shape("Ks", Ks, (num_cameras, 3, 3))
    if sh_degree is None:
        if colors.dim() == 2:
            _check_shape("colors", colors, (num_gaussians, None))
        else:
            _check_shape("colors", colors, (num_cameras, num_gaussians, None))
    else:
        if colors.dim() == 3:
            _check_shape("colors (SH coefficients)", colors, (num_gaussians, None, 3))
        else:
            _check_shape("colors (SH coefficients)", colors, (num_cameras, num_gaussians, None, 3))
        if sh_degree < 0 or (sh_degree + 1) ** 2 > colors.shape[-2]:
            raise ValueError(
                f"sh_degree={sh_degree} needs (sh_degree + 1) ** 2 <= K SH bases, colors has K={colors.shape[-2]}"
            )
    if width <= 0 or height <= 0:
        raise ValueError(f"width and height must be positive, got width={width}, height={height}")
    if rasterize_mode not in RASTERIZE_MODES:
        raise ValueError(f"rasterize_mode must be one of {RASTERIZE_MODES}, got {rasterize_mode!r}")
    if render_mode not in _RENDER_MODES:
        raise ValueError(f"render_mode must be one of {_RENDER_MODES}, got {render_mode!r}")
    devices = {t.device for t in (means, quats, scales, opacities, colors, viewmats, Ks)}
    if len(devices) != 1:
        raise ValueError(f"all inputs must be on one device, got {sorted(str(d) for d in devices)}")


def project(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: int | None = None,
    rasterize_mode: str = "classic",
    render_mode: str = "RGB",
    backend: str = "auto",
) -> Projection:
    """Project Gaussians into C full cameras and evaluate their per-camera colours.

    Args:
        means: Centres. `[N, 3]`, world units.
        quats: Rotations ``(w, x, y, z)``, need not be normalised. `[N, 4]`.
        scales: Activated scales. `[N, 3]`, world units.
        opacities: Activated opacities. `[N]`, in [0, 1].
        colors: Post-activation colours `[N, D]` or `[C, N, D]`; or, with ``sh_degree``, SH
            coefficients `[N, K, 3]` or `[C, N, K, 3]`.
        viewmats: World-to-camera, OpenCV. `[C, 4, 4]`.
        Ks: Pinhole intrinsics. `[C, 3, 3]`, px.
        width: Image width, px.
        height: Image height, px.
        near_plane: Cull z below this, world units.
        far_plane: Cull z above this, world units.
        radius_clip: Cull Gaussians whose radius is <= this, px.
        eps2d: Screen-space blur added to the 2D covariance diagonal, px^2.
        sh_degree: SH degree to evaluate (``colors`` are then coefficients), or None.
        rasterize_mode: ``"classic"``, or ``"antialiased"`` (opacity times
            ``sqrt(det_orig / det_blur)``; Yu et al., "Mip-Splatting", 2024).
        render_mode: ``"RGB"``, or ``"RGB+ED"`` (depth appended as the last channel).
        backend: ``"auto"``, ``"gsplat"`` or ``"reference"``.

    Returns:
        The projection; ``means2d`` retains its gradient.

    Raises:
        ValueError: bad shapes, modes, backend, or ``backend="gsplat"`` on non-CUDA tensors.

    **Differentiable:** with respect to ``means``, ``quats``, ``scales``, ``opacities``, ``colors``.
    """
    _validate_project_inputs(
        means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree, rasterize_mode, render_mode
    )
    chosen = resolve_backend(backend, means.device)
    num_cameras, num_gaussians = viewmats.shape[0], means.shape[0]
    antialiased = rasterize_mode == "antialiased"
    kwargs = {
        "eps2d": eps2d,
        "near_plane": near_plane,
        "far_plane": far_plane,
        "radius_clip": radius_clip,
        "calc_compensations": antialiased,
    }
    if chosen == "gsplat":
        from distsplat_ns.rendering import gsplat_backend

        proj = gsplat_backend.project_gaussians(means, quats, scales, viewmats, Ks, width, height, **kwargs)
    else:
        proj = _ref_projection.project_gaussians(means, quats, scales, viewmats, Ks, width, height, **kwargs)

    cam_opacities = opacities[None, :].expand(num_cameras, num_gaussians)
    if antialiased:
        cam_opacities = cam_opacities * proj.compensations

    if sh_degree is None:
        cam_colors = colors if colors.dim() == 3 else colors[None].expand(num_cameras, -1, -1)
    else:
        coeffs = colors if colors.dim() == 4 else colors[None].expand(num_cameras, -1, -1, -1)
        cam_centres = torch.linalg.inv(viewmats)[:, :3, 3]  # as gsplat: inverse of w2c
        dirs = means[None, :, :] - cam_centres[:, None, :]  # [C, N, 3]
        visible = proj.radii > 0
        if chosen == "gsplat":
            from distsplat_ns.rendering import gsplat_backend

            sh_colors = gsplat_backend.evaluate_sh(sh_degree, dirs, coeffs, visible)
        else:
            sh_colors = torch.where(visible[..., None], evaluate_sh(sh_degree, dirs, coeffs), 0.0)
        # gsplat: "make it apple-to-apple with Inria's CUDA backend"
        cam_colors = torch.clamp_min(sh_colors + 0.5, 0.0)
    if render_mode == "RGB+ED":
        cam_colors = torch.cat([cam_colors, proj.depths[..., None]], dim=-1)

    means2d = proj.means2d
    if means2d.requires_grad:
        means2d.retain_grad()
    return Projection(
        means2d=means2d,
        conics=proj.conics,
        depths=proj.depths,
        radii=proj.radii,
        opacities=cam_opacities,
        colors=cam_colors,
        width=int(width),
        height=int(height),
        backend=chosen,
        render_mode=render_mode,
        num_cameras=num_cameras,
        num_gaussians=num_gaussians,
        compensations=proj.compensations,
    )


def _row_start_list(row_starts: Sequence[int] | Tensor, num_cameras: int) -> list[int]:
    if isinstance(row_starts, Tensor):
        if row_starts.dim() != 1:
            raise ValueError(f"row_starts must be 1-D, got shape {list(row_starts.shape)}")
        # host sync: band origins decide the tile grid, which is laid out on the host.
        starts = [int(r) for r in row_starts.tolist()]
    else:
        starts = [int(r) for r in row_starts]
    if len(starts) != num_cameras:
        raise ValueError(f"row_starts must have one entry per camera ({num_cameras}), got {len(starts)}")
    return starts


def rasterize_rows(
    proj: Projection,
    row_starts: Sequence[int] | Tensor,
    num_rows: int,
    *,
    backgrounds: Tensor | None = None,
    tile_size: int = 16,
    absgrad: bool = False,
    chunk_elements: int = _ref_raster.DEFAULT_CHUNK_ELEMENTS,
) -> RowRender:
    """Render rows ``[row_starts[c], row_starts[c] + num_rows)`` of each camera's full image.

    Rows past the image bottom are rendered too (the caller ignores them).

    Args:
        proj: From ``project`` (on the full cameras).
        row_starts: First row of each camera's band. Length C, ints (list or 1-D tensor).
        num_rows: Rows per band, >= 1.
        backgrounds: Colour behind the Gaussians, per camera, for the non-depth channels.
            `[C, D]` (``D`` without the depth channel).
        tile_size: Tile side, px.
        absgrad: Accumulate gsplat's absgrad of this call into ``proj.means2d.absgrad`` during
            backward (created as zeros here if absent).
        chunk_elements: Memory knob of the reference backend (see ``reference.rasterize_to_pixels``).

    Returns:
        The band images, the per-tile intersection counts and the per-tile work.

    Raises:
        ValueError: bad ``row_starts``, ``num_rows``, ``tile_size`` or ``backgrounds``.

    **Invariants:** the tile grid is the whole image's grid (rows start at
    ``(row_starts[c] // tile_size) * tile_size``; up to ``tile_size - 1`` extra rows are rasterized
    and dropped when a band starts mid-tile). Hence each pixel meets the same Gaussians in the
    same order as in the whole image: concatenating bands gives the whole image, and summing their
    gradients (and absgrads) gives the whole image's. (gsplat includes a Gaussian in every pixel
    of a tile its 3-sigma square touches, so a band-relative grid would change pixels.)

    **Differentiable:** with respect to everything in ``proj`` that requires grad, and
    ``backgrounds``.

    **Host sync:** ``row_starts`` as a CUDA tensor; the reference backend syncs once to plan.
    """
    num_cameras = proj.num_cameras
    starts = _row_start_list(row_starts, num_cameras)
    if num_rows < 1:
        raise ValueError(f"num_rows must be >= 1, got {num_rows}")
    if tile_size < 1:
        raise ValueError(f"tile_size must be >= 1, got {tile_size}")
    num_channels = proj.colors.shape[-1]
    with_depth = proj.render_mode == "RGB+ED"
    if backgrounds is not None:
        _check_shape("backgrounds", backgrounds, (num_cameras, num_channels - int(with_depth)))
        if with_depth:
            backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(num_cameras, 1)], dim=-1)

    tile_row_starts = [s // tile_size for s in starts]
    offsets = [s - t * tile_size for s, t in zip(starts, tile_row_starts, strict=False)]
    rows_rendered = num_rows + max(offsets)
    num_tile_rows = math.ceil(rows_rendered / tile_size)
    num_tile_cols = math.ceil(proj.width / tile_size)

    sink = None
    if absgrad:
        sink = getattr(proj.means2d, "absgrad", None)
        if sink is None:
            sink = torch.zeros_like(proj.means2d, requires_grad=False)
            proj.means2d.absgrad = sink  # type: ignore[attr-defined]
    keepalive = None
    if absgrad and proj.backend == "gsplat":
        # Lives exactly as long as the means2d whose .absgrad the caller will read.
        keepalive = getattr(proj.means2d, _KEEPALIVE_ATTR, None)
        if keepalive is None:
            keepalive = []
            setattr(proj.means2d, _KEEPALIVE_ATTR, keepalive)

    if proj.backend == "gsplat":
        from distsplat_ns.rendering import gsplat_backend

        colors, alphas, tile_counts = gsplat_backend.rasterize_band(
            proj.means2d, proj.conics, proj.colors, proj.opacities, proj.radii, proj.depths,
            proj.width, rows_rendered, tile_size, tile_row_starts,
            backgrounds=backgrounds, absgrad_sink=sink, keepalive=keepalive,
        )  # fmt: skip
        tile_work = tile_counts  # its kernels loop over a tile's intersections
    else:
        isects = _ref_raster.intersect_tiles(
            proj.means2d, proj.radii, proj.depths, tile_size, num_tile_rows, num_tile_cols, tile_row_starts
        )
        colors, alphas, tile_work = _ref_raster.rasterize_to_pixels(
            proj.means2d, proj.conics, proj.colors, proj.opacities, proj.width, rows_rendered, isects,
            backgrounds=backgrounds, absgrad_sink=sink, chunk_elements=chunk_elements,
        )  # fmt: skip
        tile_counts = isects.tile_counts

    if max(offsets) > 0:
        if len(set(offsets)) == 1:
            colors = colors[:, offsets[0] : offsets[0] + num_rows]
            alphas = alphas[:, offsets[0] : offsets[0] + num_rows]
        else:
            rows = torch.tensor(offsets, device=colors.device)[:, None] + torch.arange(num_rows, device=colors.device)
            cams = torch.arange(num_cameras, device=colors.device)[:, None]
            colors, alphas = colors[cams, rows], alphas[cams, rows]
    if with_depth:
        depth = colors[..., -1:] / alphas.clamp(min=_MIN_ALPHA_FOR_DEPTH)
        colors = torch.cat([colors[..., :-1], depth], dim=-1)
    return RowRender(
        colors=colors,
        alphas=alphas,
        tile_counts=tile_counts,
        tile_work=tile_work,
        row_starts=starts,
        num_rows=num_rows,
        tile_size=tile_size,
        tile_row_starts=tile_row_starts,
    )
