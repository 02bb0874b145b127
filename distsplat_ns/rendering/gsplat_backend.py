"""The CUDA backend: gsplat's fused kernels (1.4.0 to 1.5.3) behind this package's contract.

gsplat is imported inside the functions only: importing it may JIT-compile its CUDA extension,
and importing ``distsplat_ns.rendering`` must stay light (STYLE: layers). Every call whose form
differs between gsplat releases goes through ``_api()`` (rendering/gsplat_versions.py).

Bands: gsplat has no pixel-origin argument, so a band is rendered by shifting ``means2d`` up by
the band's (tile-aligned) first row and rasterizing an image of the band's height.

Packed: ``rasterize_packed`` is gsplat's ``rasterization(packed=True)`` pipeline (projection,
colours, tile intersection and rasterization on ``[nnz, ...]`` tensors of the visible pairs).

Shape legend: ``C`` cameras, ``N`` Gaussians, ``D`` channels, ``K`` SH bases, ``nnz`` visible
(camera, Gaussian) pairs.
"""

from __future__ import annotations

import functools
import math
import weakref

import torch
from torch import Tensor

from distsplat_ns.rendering.gsplat_versions import GsplatApi, gsplat_api
from distsplat_ns.rendering.projection import ProjectedGaussians
from distsplat_ns.utils.host_to_device import host_tensor

__all__ = ["evaluate_sh", "project_gaussians", "rasterize_band", "rasterize_packed"]


@functools.cache
def _api() -> GsplatApi:
    """The installed gsplat's calling table, read once from ``gsplat.__version__``."""
    import gsplat

    return gsplat_api(gsplat.__version__)


def project_gaussians(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    *,
    eps2d: float,
    near_plane: float,
    far_plane: float,
    radius_clip: float,
    calc_compensations: bool,
) -> ProjectedGaussians:
    """gsplat's ``fully_fused_projection`` (pinhole, not packed); same contract as the reference."""
    from gsplat import fully_fused_projection

    radii, means2d, depths, conics, compensations = fully_fused_projection(
        means,
        None,
        quats,
        scales,
        viewmats,
        Ks,
        width,
        height,
        eps2d=eps2d,
        packed=False,
        near_plane=near_plane,
        far_plane=far_plane,
        radius_clip=radius_clip,
        calc_compensations=calc_compensations,
    )
    radii = _api().radii_to_contract(radii)
    return ProjectedGaussians(radii=radii, means2d=means2d, depths=depths, conics=conics, compensations=compensations)


def evaluate_sh(degree: int, dirs: Tensor, coeffs: Tensor, masks: Tensor) -> Tensor:
    """gsplat's ``spherical_harmonics``; masked-out entries give 0 (as gsplat)."""
    from gsplat import spherical_harmonics

    return spherical_harmonics(degree, dirs, coeffs, masks=masks)


def _absgrad_forwarder(band_ref: weakref.ReferenceType[Tensor], sink: Tensor):
    def hook(grad: Tensor) -> None:
        # Runs once gsplat's backward has produced this band's gradient, after it set `.absgrad`.
        band = band_ref()
        absgrad = getattr(band, "absgrad", None) if band is not None else None
        if absgrad is not None:
            sink.add_(absgrad.to(sink.dtype))
            band.absgrad = None  # type: ignore[union-attr]  # consumed: a second backward re-sets it

    return hook


def rasterize_band(
    means2d: Tensor,
    conics: Tensor,
    colors: Tensor,
    opacities: Tensor,
    radii: Tensor,
    depths: Tensor,
    width: int,
    num_rows: int,
    tile_size: int,
    tile_row_starts: list[int],
    *,
    backgrounds: Tensor | None,
    absgrad_sink: Tensor | None,
    keepalive: list | None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Render rows ``tile_row_starts[c] * tile_size + [0, num_rows)`` of every camera with gsplat.

    Args:
        means2d, conics, colors, opacities, radii, depths: The projection, `[C, N, ...]`.
        width: Image width, px.
        num_rows: Rows to render, px.
        tile_size: Tile side, px.
        tile_row_starts: Whole-image tile row each camera's band starts at. Length C.
        backgrounds: `[C, D]` or None.
        absgrad_sink: If given, gsplat's absgrad of this call is added into it after backward.
            `[C, N, 2]`.
        keepalive: With ``absgrad_sink``: a list that lives as long as the sink's owner (the
            projection's ``means2d``); the shifted means are kept there so that gsplat's
            ``.absgrad`` lands on a Python object our hook can still reach at backward.

    Returns:
        ``(colors [C, num_rows, W, D], alphas [C, num_rows, W, 1], tile_counts [C, th, tw])``.

    **Differentiable:** as gsplat's ``rasterize_to_pixels``.
    """
    from gsplat import isect_tiles, rasterize_to_pixels

    num_cameras = means2d.shape[0]
    shift_px = host_tensor(tile_row_starts, means2d.dtype, means2d.device) * tile_size
    shift = torch.stack([torch.zeros_like(shift_px), shift_px], dim=-1)[:, None, :]  # [C, 1, 2]
    # Always a new tensor (even for a zero shift): gsplat writes `.absgrad` onto it.
    band_means2d = means2d - shift
    num_tile_rows = math.ceil(num_rows / tile_size)
    num_tile_cols = math.ceil(width / tile_size)
    api = _api()
    _, isect_ids, flatten_ids = isect_tiles(
        band_means2d,
        api.radii_to_gsplat(radii),
        depths,
        tile_size,
        num_tile_cols,
        num_tile_rows,
        packed=False,
        **api.isect_ids_kwargs(num_cameras),
    )
    isect_offsets = _encode_offsets(isect_ids, flatten_ids, num_cameras, num_tile_cols, num_tile_rows)
    render_colors, render_alphas = rasterize_to_pixels(
        band_means2d,
        conics,
        colors,
        opacities,
        width,
        num_rows,
        tile_size,
        isect_offsets,
        flatten_ids,
        backgrounds=backgrounds,
        packed=False,
        absgrad=absgrad_sink is not None,
    )
    if absgrad_sink is not None and band_means2d.requires_grad:
        if keepalive is None:
            raise ValueError("rasterize_band needs a keepalive list when absgrad_sink is given")
        keepalive.append(band_means2d)
        band_means2d.register_hook(_absgrad_forwarder(weakref.ref(band_means2d), absgrad_sink))
    return render_colors, render_alphas, _tile_counts(isect_offsets, flatten_ids.numel())


def _encode_offsets(
    isect_ids: Tensor, flatten_ids: Tensor, num_cameras: int, num_tile_cols: int, num_tile_rows: int
) -> Tensor:
    from gsplat import isect_offset_encode

    if flatten_ids.numel() == 0:
        # gsplat leaves the offsets uninitialised when nothing intersects (torch::empty).
        return torch.zeros(num_cameras, num_tile_rows, num_tile_cols, dtype=torch.int32, device=isect_ids.device)
    return isect_offset_encode(isect_ids, num_cameras, num_tile_cols, num_tile_rows)


def _tile_counts(isect_offsets: Tensor, num_isects: int) -> Tensor:
    flat = isect_offsets.reshape(-1).to(torch.int64)
    offsets = torch.cat([flat, flat.new_full((1,), num_isects)])
    return (offsets[1:] - offsets[:-1]).reshape(isect_offsets.shape).to(torch.int32)


def rasterize_packed(
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
    near_plane: float,
    far_plane: float,
    radius_clip: float,
    eps2d: float,
    sh_degree: int | None,
    tile_size: int,
    backgrounds: Tensor | None,
    render_mode: str,
    absgrad: bool,
    rasterize_mode: str,
) -> tuple[Tensor, Tensor, dict[str, object]]:
    """gsplat's ``rasterization`` with ``packed=True`` (pinhole, not distributed).

    Args: as ``distsplat_ns.rendering.rasterization`` (validated there).

    Returns:
        ``(colors [C, H, W, D], alphas [C, H, W, 1], meta)``; ``meta`` holds the packed
        ``camera_ids``, ``gaussian_ids`` `[nnz]` int64, ``radii`` `[nnz]`, ``means2d``
        `[nnz, 2]` (``.grad``/``.absgrad`` after backward), ``depths``, ``conics``, ``opacities``
        and ``tile_counts`` `[C, th, tw]` int32. ``RGB+ED``'s last channel is the expected depth.

    **Differentiable:** as gsplat's packed ``rasterization``.

    **Host sync:** gsplat's packed projection sizes ``nnz`` on the host.
    """
    from gsplat import fully_fused_projection, isect_tiles, rasterize_to_pixels, spherical_harmonics

    api = _api()
    num_cameras = viewmats.shape[0]
    camera_ids, gaussian_ids, radii, means2d, depths, conics, compensations = api.split_packed_projection(fully_fused_projection(
        means, None, quats, scales, viewmats, Ks, width, height, eps2d=eps2d, packed=True,
        near_plane=near_plane, far_plane=far_plane, radius_clip=radius_clip,
        calc_compensations=rasterize_mode == "antialiased",
    ))  # fmt: skip
    contract_radii = api.radii_to_contract(radii)  # [nnz]; gsplat's own shape stays for isect_tiles
    if means2d.requires_grad:
        means2d.retain_grad()  # meta's means2d.grad, as with packed=False
    pair_opacities = opacities[gaussian_ids]
    if compensations is not None:
        pair_opacities = pair_opacities * compensations
    if sh_degree is None:
        pair_colors = colors[gaussian_ids] if colors.dim() == 2 else colors[camera_ids, gaussian_ids]
    else:
        cam_centres = torch.linalg.inv(viewmats)[:, :3, 3]  # as gsplat: inverse of w2c
        dirs = means[gaussian_ids] - cam_centres[camera_ids]  # [nnz, 3]
        coeffs = colors[gaussian_ids] if colors.dim() == 3 else colors[camera_ids, gaussian_ids]
        sh_colors = spherical_harmonics(sh_degree, dirs, coeffs, masks=contract_radii > 0)
        pair_colors = torch.clamp_min(sh_colors + 0.5, 0.0)  # gsplat: as Inria's CUDA backend
    if render_mode == "RGB+ED":
        pair_colors = torch.cat([pair_colors, depths[..., None]], dim=-1)
        if backgrounds is not None:
            backgrounds = torch.cat([backgrounds, backgrounds.new_zeros(num_cameras, 1)], dim=-1)

    num_tile_rows = math.ceil(height / tile_size)
    num_tile_cols = math.ceil(width / tile_size)
    _, isect_ids, flatten_ids = isect_tiles(
        means2d, radii, depths, tile_size, num_tile_cols, num_tile_rows, packed=True,
        gaussian_ids=gaussian_ids, **api.isect_ids_kwargs(num_cameras, camera_ids),
    )  # fmt: skip
    isect_offsets = _encode_offsets(isect_ids, flatten_ids, num_cameras, num_tile_cols, num_tile_rows)
    ours = backgrounds is not None and api.packed_backgrounds_ours  # gsplat 1.5.3 refuses [C, D] here
    render_colors, render_alphas = rasterize_to_pixels(
        means2d, conics, pair_colors, pair_opacities, width, height, tile_size, isect_offsets, flatten_ids,
        backgrounds=None if ours else backgrounds, packed=True, absgrad=absgrad,
    )  # fmt: skip
    if ours:  # the kernel's own rule: colour + T background, T = 1 - alpha
        render_colors = render_colors + (1.0 - render_alphas) * backgrounds[:, None, None, :]
    if render_mode == "RGB+ED":
        depth = render_colors[..., -1:] / render_alphas.clamp(min=1e-10)  # as gsplat
        render_colors = torch.cat([render_colors[..., :-1], depth], dim=-1)
    meta: dict[str, object] = {
        "camera_ids": camera_ids,
        "gaussian_ids": gaussian_ids,
        "radii": contract_radii,
        "means2d": means2d,
        "depths": depths,
        "conics": conics,
        "opacities": pair_opacities,
        "tile_counts": _tile_counts(isect_offsets, flatten_ids.numel()),
    }
    return render_colors, render_alphas, meta
