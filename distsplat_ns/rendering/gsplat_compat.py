"""gsplat 1.4.0's ``rasterization`` signature over ``project`` + ``rasterize_rows``, packed or not.

``packed=True`` (gsplat's default) changes ``meta``'s per-pair entries to `[nnz, ...]` over the
visible (camera, Gaussian) pairs, named by ``camera_ids`` / ``gaussian_ids``. On the reference
backend ``packed.py`` re-lays the reference projection: images and input gradients are bitwise
those of ``packed=False``. On CUDA this is gsplat's packed pipeline
(``gsplat_backend.rasterize_packed``), whose projection floors ``b^2 - det`` at 0.1 px^4 where the
unpacked one floors it at 0.01 (gsplat 1.4.0): a radius can be a pixel larger, so there it keeps a
superset of the unpacked pairs, and its images are held to the reference tolerances, not bitwise
equality (tests/gpu/test_gsplat_packed.py).

Shape legend: ``C`` cameras, ``N`` Gaussians, ``D`` channels, ``H``, ``W`` pixels, ``nnz`` visible
(camera, Gaussian) pairs.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor

from distsplat_ns.rendering import packed as _packed
from distsplat_ns.rendering.api import (
    Projection,
    _check_shape,
    _validate_project_inputs,
    project,
    rasterize_rows,
    resolve_backend,
)

__all__ = ["rasterization"]


def rasterization(
    means: Tensor,
    quats: Tensor,
    scales: Tensor,
    opacities: Tensor,
    colors: Tensor,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    near_plane: float = 0.01,
    far_plane: float = 1e10,
    radius_clip: float = 0.0,
    eps2d: float = 0.3,
    sh_degree: int | None = None,
    packed: bool = True,
    tile_size: int = 16,
    backgrounds: Tensor | None = None,
    render_mode: str = "RGB",
    sparse_grad: bool = False,
    absgrad: bool = False,
    rasterize_mode: str = "classic",
    channel_chunk: int = 32,
    distributed: bool = False,
    camera_model: str = "pinhole",
    covars: Tensor | None = None,
    *,
    backend: str = "auto",
) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """gsplat 1.4.0's ``rasterization`` (the subset splatfacto uses), on either backend.

    Same positional signature and defaults as gsplat. Arguments are those of ``project`` and
    ``rasterize_rows``; the gsplat-only ones must keep their neutral values. ``packed`` changes
    the layout of ``meta`` (as in gsplat, a memory/speed trade-off; the module docstring says how
    gsplat's packed radii differ). On CUDA it runs gsplat's packed kernels; on the reference
    backend the packed tensors are gathered from, and scattered back to, the ``[C, N]`` layout
    (``distsplat_ns/rendering/packed.py``), which saves no memory.

    Returns:
        ``(render_colors [C, H, W, D], render_alphas [C, H, W, 1], meta)``; ``meta`` holds
        ``means2d`` (``.grad`` after backward, ``.absgrad`` when asked), ``radii``, ``depths``,
        ``conics``, ``opacities``, ``tile_width``, ``tile_height``, ``tile_size``, ``width``,
        ``height``, ``n_cameras``, ``camera_ids``, ``gaussian_ids``,
        ``tile_counts`` `[C, tile_height, tile_width]` int32, ``backend`` and ``projection``.
        With ``packed=False`` the per-pair entries are `[C, N, ...]`, ``camera_ids`` and
        ``gaussian_ids`` are None and ``projection`` is the ``Projection``; with ``packed=True``
        they are `[nnz, ...]` over the visible pairs (camera-major, then Gaussian index, as
        gsplat), ``camera_ids``/``gaussian_ids`` `[nnz]` int64 name them, ``projection`` is None.

    Raises:
        ValueError: ``sparse_grad=True``, ``distributed=True``, a camera model other than
            pinhole, ``covars``, or anything ``project``/``rasterize_rows`` reject.

    **Host sync:** ``packed=True`` sizes ``nnz`` on the host.
    """
    if sparse_grad:
        raise ValueError("sparse_grad=True is not supported; pass sparse_grad=False")
    if distributed:
        raise ValueError("distributed=True is not supported; distsplat_ns splits images, not Gaussians")
    if camera_model != "pinhole":
        raise ValueError(f"camera_model must be 'pinhole', got {camera_model!r}")
    if covars is not None:
        raise ValueError("covars is not supported; pass quats and scales")
    del channel_chunk  # gsplat's channel chunking is a speed knob, not a semantic one
    if tile_size < 1:
        raise ValueError(f"tile_size must be >= 1, got {tile_size}")
    options = {
        "near_plane": near_plane,
        "far_plane": far_plane,
        "radius_clip": radius_clip,
        "eps2d": eps2d,
        "sh_degree": sh_degree,
    }
    if packed and resolve_backend(backend, means.device) == "gsplat":
        _validate_project_inputs(
            means, quats, scales, opacities, colors, viewmats, Ks, width, height, sh_degree, rasterize_mode, render_mode
        )
        if backgrounds is not None:
            num_channels = 3 if sh_degree is not None else int(colors.shape[-1])
            _check_shape("backgrounds", backgrounds, (int(viewmats.shape[0]), num_channels))
        from distsplat_ns.rendering import gsplat_backend

        render_colors, render_alphas, pairs = gsplat_backend.rasterize_packed(
            means, quats, scales, opacities, colors, viewmats, Ks, width, height, **options, tile_size=tile_size,
            backgrounds=backgrounds, render_mode=render_mode, absgrad=absgrad, rasterize_mode=rasterize_mode,
        )  # fmt: skip
        return render_colors, render_alphas, _meta(pairs, tile_size, width, height, viewmats.shape[0], "gsplat", None)

    proj = project(
        means, quats, scales, opacities, colors, viewmats, Ks, width, height, **options,
        rasterize_mode=rasterize_mode, render_mode=render_mode, backend=backend,
    )  # fmt: skip
    if not packed:
        out = rasterize_rows(
            proj, [0] * proj.num_cameras, height, backgrounds=backgrounds, tile_size=tile_size, absgrad=absgrad
        )
        pairs = {
            "camera_ids": None, "gaussian_ids": None, "radii": proj.radii, "means2d": proj.means2d, "depths": proj.depths,
            "conics": proj.conics, "opacities": proj.opacities, "tile_counts": out.tile_counts,
        }  # fmt: skip
        return out.colors, out.alphas, _meta(pairs, tile_size, width, height, proj.num_cameras, proj.backend, proj)

    packed_pairs = _packed.pack(proj.radii, proj.means2d, proj.depths, proj.conics, proj.opacities, proj.colors)
    means2d, conics, cam_opacities, cam_colors = _packed.unpack(packed_pairs, proj.num_cameras, proj.num_gaussians)
    dense = Projection(
        means2d=means2d, conics=conics, depths=proj.depths, radii=proj.radii, opacities=cam_opacities,
        colors=cam_colors, width=proj.width, height=proj.height, backend=proj.backend,
        render_mode=proj.render_mode, num_cameras=proj.num_cameras, num_gaussians=proj.num_gaussians,
        compensations=proj.compensations,
    )  # fmt: skip
    out = rasterize_rows(
        dense, [0] * proj.num_cameras, height, backgrounds=backgrounds, tile_size=tile_size, absgrad=absgrad
    )
    if absgrad:
        _packed.forward_absgrad(packed_pairs, means2d.absgrad)
    pairs = {
        "camera_ids": packed_pairs.camera_ids, "gaussian_ids": packed_pairs.gaussian_ids, "radii": packed_pairs.radii,
        "means2d": packed_pairs.means2d, "depths": packed_pairs.depths, "conics": packed_pairs.conics,
        "opacities": packed_pairs.opacities, "tile_counts": out.tile_counts,
    }  # fmt: skip
    return out.colors, out.alphas, _meta(pairs, tile_size, width, height, proj.num_cameras, proj.backend, None)


def _meta(
    pairs: dict[str, Any], tile_size: int, width: int, height: int, num_cameras: int, backend: str,
    projection: Projection | None,
) -> dict[str, Any]:  # fmt: skip
    """``rasterization``'s ``meta``: gsplat's keys plus ``tile_counts``, ``backend``, ``projection``."""
    tile_counts = pairs["tile_counts"]
    return {
        **pairs,
        "tile_width": int(tile_counts.shape[2]),
        "tile_height": int(tile_counts.shape[1]),
        "tile_size": tile_size,
        "width": width,
        "height": height,
        "n_cameras": num_cameras,
        "backend": backend,
        "projection": projection,
    }
