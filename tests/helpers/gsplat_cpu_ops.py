"""The gsplat CPU shim's entry points other than the compositor (tests/helpers/gsplat_cpu.py):
projection (unpacked and packed), tile intersection, offsets, spherical harmonics and the MCMC
relocation, on torch ops, in gsplat 1.4.0's signatures, and the adapters for 1.5.3's and for 1.5.0 to
1.5.2's where theirs differ (the tables: gsplat_cpu.py).

Forwards call the installed gsplat's own references (``gsplat/cuda/_torch_impl.py``:
``_fully_fused_projection``, ``_isect_offset_encode``, ``_spherical_harmonics``) where they are
vectorised; ``_isect_tiles`` loops in Python per (camera, Gaussian), so ``isect_tiles`` is
vectorised here (tests/unit/test_gsplat_cpu.py holds it to ``_isect_tiles``). Where a kernel
leaves an output uninitialised (a culled entry's projection, a masked SH entry) it is 0 here.
Backwards recompute the forward under ``torch.enable_grad()`` on detached inputs and return
``torch.autograd.grad`` in the order gsplat's wrapper unpacks.

Shape legend: ``C`` cameras, ``N`` Gaussians, ``nnz`` kept (camera, Gaussian) pairs, ``I``
intersections, ``K`` SH bases.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

CAMERA_MODELS = {"PINHOLE": "pinhole", "ORTHO": "ortho", "FISHEYE": "fisheye"}
"""gsplat's ``CameraModelType`` values (the extension's enum; here its reference's strings)."""


def torch_impl():
    """The installed gsplat's PyTorch references (imported at call time: the version may change)."""
    from gsplat.cuda import _torch_impl

    return _torch_impl


def full_covars(covars: Tensor | None, quats: Tensor | None, scales: Tensor | None) -> Tensor:
    """World covariances `[N, 3, 3]` from the packed upper triangle `[N, 6]` or quats and scales."""
    if covars is not None:
        xx, xy, xz, yy, yz, zz = covars.unbind(-1)
        return torch.stack([xx, xy, xz, xy, yy, yz, xz, yz, zz], dim=-1).reshape(*covars.shape[:-1], 3, 3)
    covar, _ = torch_impl()._quat_scale_to_covar_preci(quats, scales, compute_covar=True, compute_preci=False)
    return covar


def _zero_culled(keep: Tensor, *tensors: Tensor | None) -> list[Tensor | None]:
    return [
        None if t is None else torch.where(keep.reshape(*keep.shape, *[1] * (t.dim() - keep.dim())), t, 0)
        for t in tensors
    ]


def project(
    means: Tensor,
    covars: Tensor | None,
    quats: Tensor | None,
    scales: Tensor | None,
    viewmats: Tensor,
    Ks: Tensor,
    width: int,
    height: int,
    eps2d: float,
    near_plane: float,
    far_plane: float,
    calc_compensations: bool,
    camera_model: str,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """gsplat's reference projection (``_fully_fused_projection``): radii as that release gives them."""
    return torch_impl()._fully_fused_projection(
        means,
        full_covars(covars, quats, scales),
        viewmats,
        Ks,
        width,
        height,
        eps2d=eps2d,
        near_plane=near_plane,
        far_plane=far_plane,
        calc_compensations=calc_compensations,
        camera_model=camera_model,
    )


def projection_fwd(
    means, covars, quats, scales, viewmats, Ks, width, height, eps2d, near_plane, far_plane, radius_clip,
    calc_compensations, camera_model,
):  # fmt: skip
    """1.4.0 ``fully_fused_projection_fwd``: ``(radii [C, N] int32, means2d, depths, conics, compensations)``."""
    radii, means2d, depths, conics, comps = project(
        means, covars, quats, scales, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
        calc_compensations, camera_model,
    )  # fmt: skip
    radii = torch.where(radii <= radius_clip, 0, radii).to(torch.int32)  # the kernel: radius <= radius_clip culls
    keep = radii > 0
    means2d, depths, conics, comps = _zero_culled(keep, means2d, depths, conics, comps)
    return radii.contiguous(), means2d.contiguous(), depths.contiguous(), conics.contiguous(), comps


def _grads(fn: Callable, inputs: list[Tensor | None], cotangents: list[Tensor | None]) -> list[Tensor | None]:
    """``torch.autograd.grad`` of ``fn(*leaves)`` (a tuple) with respect to the given inputs (None stays None)."""
    with torch.enable_grad():
        leaves = [None if t is None else t.detach().requires_grad_() for t in inputs]
        outputs = fn(*leaves)
        pairs = [(o, c) for o, c in zip(outputs, cotangents, strict=True) if o is not None and c is not None]
        wanted = [t for t in leaves if t is not None]
        got = torch.autograd.grad([o for o, _ in pairs], wanted, [c for _, c in pairs], allow_unused=True)
    found = iter(got)
    # An input an output does not depend on gets zeros (as the kernels' zero-initialised gradients).
    return [None if t is None else _or_zeros(next(found), t) for t in leaves]


def _or_zeros(grad: Tensor | None, like: Tensor) -> Tensor:
    return torch.zeros_like(like) if grad is None else grad


def projection_bwd(
    means, covars, quats, scales, viewmats, Ks, width, height, eps2d, camera_model, radii, conics, compensations,
    v_means2d, v_depths, v_conics, v_compensations, viewmats_requires_grad,
):  # fmt: skip
    """1.4.0 ``fully_fused_projection_bwd``: ``(v_means, v_covars, v_quats, v_scales, v_viewmats)``.

    Culled entries (``radii == 0``) pass no gradient, as the kernel skips them. Near and far planes are not
    handed to the backward: the recomputation keeps every depth, and the radii mask what was culled.
    1.5.3's ``projection_ewa_3dgs_fused_bwd`` has the same signature (per-axis radii, batch dims)."""
    keep = (radii > 0).all(dim=-1) if radii.dim() == v_depths.dim() + 1 else radii > 0

    def forward(means, covars, quats, scales, viewmats):
        _, means2d, depths, conics_, comps = project(
            means, covars, quats, scales, viewmats, Ks, width, height, eps2d, -math.inf, math.inf,
            v_compensations is not None, camera_model,
        )  # fmt: skip
        return _zero_culled(keep, means2d, depths, conics_, comps)

    v_means, v_covars, v_quats, v_scales, v_viewmats = _grads(
        forward, [means, covars, quats, scales, viewmats], [v_means2d, v_depths, v_conics, v_compensations]
    )
    return v_means, v_covars, v_quats, v_scales, v_viewmats if viewmats_requires_grad else None


def pack(radii: Tensor, outputs: list[Tensor | None]) -> tuple[Tensor, Tensor, Tensor, Tensor, list]:
    """The kept entries of an unpacked projection `[B, C, N, ...]` in gsplat's order (batch, camera, then
    Gaussian index): ``(indptr [B * C + 1] int32, batch_ids, camera_ids, gaussian_ids [nnz] int64, the
    outputs at them)``. Host sync: ``nnz``."""
    keep = (radii > 0).all(dim=-1) if radii.dim() == 4 else radii > 0
    batch_ids, camera_ids, gaussian_ids = keep.nonzero(as_tuple=True)  # row-major
    counts = keep.sum(dim=-1).reshape(-1)
    indptr = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
    picked = [None if t is None else t[batch_ids, camera_ids, gaussian_ids].contiguous() for t in outputs]
    return indptr, batch_ids, camera_ids, gaussian_ids, picked


def projection_packed_fwd(
    means, covars, quats, scales, viewmats, Ks, width, height, eps2d, near_plane, far_plane, radius_clip,
    calc_compensations, camera_model,
):  # fmt: skip
    """1.4.0 ``fully_fused_projection_packed_fwd``: the unpacked projection's kept entries (radii > 0), in
    gsplat's order (camera-major, then Gaussian index): ``(indptr [C + 1] int32, camera_ids, gaussian_ids
    [nnz] int64, radii, means2d, depths, conics, compensations)``. Host sync: ``nnz``."""
    outputs = projection_fwd(
        means, covars, quats, scales, viewmats, Ks, width, height, eps2d, near_plane, far_plane, radius_clip,
        calc_compensations, camera_model,
    )  # fmt: skip
    indptr, _, camera_ids, gaussian_ids, picked = pack(outputs[0][None], [t if t is None else t[None] for t in outputs])
    return indptr, camera_ids, gaussian_ids, *picked


def packed_bwd(
    means, covars, quats, scales, viewmats, Ks, width, height, eps2d, camera_model, batch_ids, camera_ids,
    gaussian_ids, v_means2d, v_depths, v_conics, v_compensations, viewmats_requires_grad, sparse_grad,
):  # fmt: skip
    """The packed projection's backward, batch dims ``B`` (1.5.3) or none (1.4.0, ``batch_ids`` None):
    ``(v_means, v_covars, v_quats, v_scales, v_viewmats)``; with ``sparse_grad`` the Gaussian gradients
    are per packed entry (``[nnz, ...]``, gsplat's wrapper makes COO tensors of them), else summed per
    Gaussian. Each (batch, camera)'s entries are recomputed as a one-camera projection of their Gaussians."""
    num_gaussians = means.shape[-2]
    if batch_ids is None:
        batch_ids = torch.zeros_like(camera_ids)
    gauss = [None if t is None else t.reshape(-1, num_gaussians, t.shape[-1]) for t in (means, covars, quats, scales)]
    flat_viewmats, flat_Ks = viewmats.reshape(-1, viewmats.shape[-3], 4, 4), Ks.reshape(-1, Ks.shape[-3], 3, 3)
    per_entry = [None if t is None else t[batch_ids, gaussian_ids] for t in gauss]
    entry_grads: list[Tensor | None] = [None if t is None else torch.zeros_like(t) for t in per_entry]
    v_viewmats = torch.zeros_like(flat_viewmats) if viewmats_requires_grad else None
    num_cameras = flat_viewmats.shape[1]
    for group in range(flat_viewmats.shape[0] * num_cameras):
        b, c = divmod(group, num_cameras)
        rows = ((batch_ids == b) & (camera_ids == c)).nonzero()[:, 0]  # this camera's packed entries
        if rows.numel() == 0:
            continue

        def forward(means, covars, quats, scales, viewmat, K=flat_Ks[b, c : c + 1]):
            _, means2d, depths, conics_, comps = project(
                means, covars, quats, scales, viewmat[None], K, width, height, eps2d, -math.inf,
                math.inf, v_compensations is not None, camera_model,
            )  # fmt: skip
            return means2d[0], depths[0], conics_[0], None if comps is None else comps[0]

        inputs = [None if t is None else t[rows] for t in per_entry] + [flat_viewmats[b, c]]
        cotangents = [v_means2d[rows], v_depths[rows], v_conics[rows]]
        cotangents.append(None if v_compensations is None else v_compensations[rows])
        got = _grads(forward, inputs, cotangents)
        for total, g in zip(entry_grads, got[:4], strict=True):
            if total is not None:
                total[rows] = g
        if v_viewmats is not None:
            v_viewmats[b, c] = got[4]
    if not sparse_grad:
        flat_index = batch_ids * num_gaussians + gaussian_ids
        entry_grads = [
            None if g is None else torch.zeros_like(t).reshape(-1, t.shape[-1]).index_add_(0, flat_index, g).reshape(t.shape)
            for g, t in zip(entry_grads, (means, covars, quats, scales), strict=True)
        ]  # fmt: skip
    return (*entry_grads, None if v_viewmats is None else v_viewmats.reshape(viewmats.shape))


def projection_packed_bwd(
    means, covars, quats, scales, viewmats, Ks, width, height, eps2d, camera_model, camera_ids, gaussian_ids,
    conics, compensations, v_means2d, v_depths, v_conics, v_compensations, viewmats_requires_grad, sparse_grad,
):  # fmt: skip
    """1.4.0 ``fully_fused_projection_packed_bwd``."""
    del conics, compensations  # recomputed
    return packed_bwd(
        means, covars, quats, scales, viewmats, Ks, width, height, eps2d, camera_model, None, camera_ids,
        gaussian_ids, v_means2d, v_depths, v_conics, v_compensations, viewmats_requires_grad, sparse_grad,
    )  # fmt: skip


def depth_bits(depths: Tensor) -> Tensor:
    """The kernel's depth key: the float32 bits read as int32, sign-extended to int64."""
    return depths.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)


def intersect(
    means2d: Tensor,
    radius_x: Tensor,
    radius_y: Tensor,
    depths: Tensor,
    image_ids: Tensor,
    tile_size: int,
    tile_width: int,
    tile_height: int,
    sort: bool,
    zero_extend_depth: bool = False,
) -> tuple[Tensor, Tensor, Tensor]:
    """Tile intersection over flat entries ``[E]`` (``E`` = ``C * N`` or ``nnz``), vectorised.

    Each entry with radii > 0 lists the tiles of ``floor(m/ts - r/ts)`` (inclusive) to ``ceil(m/ts + r/ts)``
    (exclusive) per axis, clamped to the grid, rows outer, columns inner; its ids are
    ``image << (32 + tile_bits) | tile << 32 | depth bits`` and it is ``flatten_ids``' index. Sorted stably
    by id (the kernel's radix sort is stable). Returns ``(tiles_per_gauss [E] int32, isect_ids [I] int64,
    flatten_ids [I] int32)``. Host sync: the intersection count."""
    mean = means2d.reshape(-1, 2)
    tile_mean = mean / tile_size
    rx = radius_x.reshape(-1).to(mean.dtype) / tile_size
    ry = radius_y.reshape(-1).to(mean.dtype) / tile_size
    x0 = torch.floor(tile_mean[:, 0] - rx).to(torch.int64).clamp(0, tile_width)
    x1 = torch.ceil(tile_mean[:, 0] + rx).to(torch.int64).clamp(0, tile_width)
    y0 = torch.floor(tile_mean[:, 1] - ry).to(torch.int64).clamp(0, tile_height)
    y1 = torch.ceil(tile_mean[:, 1] + ry).to(torch.int64).clamp(0, tile_height)
    alive = (radius_x.reshape(-1) > 0) & (radius_y.reshape(-1) > 0)
    span_x = x1 - x0
    counts = torch.where(alive, (y1 - y0) * span_x, 0)
    entries = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)  # [I]
    first = torch.cumsum(counts, 0) - counts
    local = torch.arange(entries.numel(), device=counts.device) - first[entries]
    tile_x = x0[entries] + local % span_x[entries]
    tile_y = y0[entries] + local // span_x[entries]
    tile_bits = (tile_width * tile_height).bit_length()
    image = image_ids.reshape(-1).to(torch.int64)[entries]
    tile = tile_y * tile_width + tile_x
    depth_key = depth_bits(depths.reshape(-1))[entries]
    if zero_extend_depth:  # gsplat 1.5.3's kernel (1.4.0 sign-extends; equal for positive depths)
        depth_key = depth_key & 0xFFFFFFFF
    isect_ids = (image << (32 + tile_bits)) | (tile << 32) | depth_key
    flatten_ids = entries.to(torch.int32)
    if sort:
        isect_ids, order = torch.sort(isect_ids, stable=True)
        flatten_ids = flatten_ids[order]
    return counts.to(torch.int32), isect_ids.contiguous(), flatten_ids.contiguous()


def isect_tiles(
    means2d, radii, depths, camera_ids, gaussian_ids, num_cameras, tile_size, tile_width, tile_height, sort,
    double_buffer,
):  # fmt: skip
    """1.4.0 ``isect_tiles``: ``(tiles_per_gauss [C, N] or [nnz], isect_ids, flatten_ids)``."""
    del gaussian_ids, double_buffer  # the kernel reads neither for the ids (double_buffer: sort memory)
    packed = means2d.dim() == 2
    if packed:
        image_ids = camera_ids
    else:
        num_gaussians = means2d.shape[1]
        image_ids = torch.arange(num_cameras, device=means2d.device).repeat_interleave(num_gaussians)
    counts, isect_ids, flatten_ids = intersect(
        means2d, radii, radii, depths, image_ids, tile_size, tile_width, tile_height, sort
    )
    return counts.reshape(radii.shape), isect_ids, flatten_ids


def isect_offset_encode(isect_ids: Tensor, num_cameras: int, tile_width: int, tile_height: int) -> Tensor:
    """1.4.0 ``isect_offset_encode``: gsplat's reference ``_isect_offset_encode``. `[C, th, tw]` int32."""
    return torch_impl()._isect_offset_encode(isect_ids, num_cameras, tile_width, tile_height).contiguous()


def sh_fwd(degree: int, dirs: Tensor, coeffs: Tensor, masks: Tensor | None) -> Tensor:
    """``compute_sh_fwd`` / 1.5.3 ``spherical_harmonics_fwd``: gsplat's ``_spherical_harmonics``."""
    colors = torch_impl()._spherical_harmonics(degree, dirs, coeffs)
    if masks is not None:
        colors = torch.where(masks[..., None], colors, 0.0)
    return colors.contiguous()


def sh_bwd(num_bases, degree, dirs, coeffs, masks, v_colors, compute_v_dirs):
    """``compute_sh_bwd`` / 1.5.3 ``spherical_harmonics_bwd``: ``(v_coeffs, v_dirs or None)``."""
    del num_bases  # the coefficients' own shape says it
    v_dirs, v_coeffs = _grads(lambda d, c: (sh_fwd(degree, d, c, masks),), [dirs, coeffs], [v_colors])
    return v_coeffs, v_dirs if compute_v_dirs else None


def relocation(opacities: Tensor, scales: Tensor, ratios: Tensor, binoms: Tensor, n_max: int) -> tuple[Tensor, Tensor]:
    """``compute_relocation`` / 1.5.3 ``relocation``: Eq. 9 of Kheradmand et al. 2024 (3DGS as MCMC).

    For ``n`` copies sharing one place: ``o' = 1 - (1 - o)^(1/n)`` and
    ``s' = o / (sum_{i=1..n} sum_{k=0..i-1} C(i-1, k) (-1)^k o'^(k+1) / sqrt(k+1)) * s``, the binomial
    coefficients read from ``binoms[i - 1, k]`` as the kernel reads them (gsplat's wrapper has clamped
    ``ratios`` to ``[1, n_max]``). Computed in the inputs' dtype."""
    n = ratios.reshape(-1).to(torch.int64)
    o = opacities.reshape(-1)
    new_o = 1.0 - torch.pow(1.0 - o, 1.0 / n.to(o.dtype))
    k = torch.arange(n_max, device=o.device).to(o.dtype)
    per_k = (-1.0) ** k / torch.sqrt(k + 1.0) * new_o[:, None] ** (k + 1.0)  # [J, n_max]
    table = binoms.to(o.dtype)
    denominator = torch.zeros_like(o)
    for i in range(1, n_max + 1):  # the outer sum; its inner sum runs over k <= i - 1
        inner = (table[i - 1, :i] * per_k[:, :i]).sum(dim=1)
        denominator = denominator + torch.where(i <= n, inner, 0.0)
    new_scales = (o / denominator)[:, None] * scales.reshape(-1, 3)
    return new_o.reshape(opacities.shape).contiguous(), new_scales.reshape(scales.shape).contiguous()


# ---------------------------------------------------------------------- gsplat 1.5.3's signatures
ALPHA_THRESHOLD = 1.0 / 255.0  # gsplat 1.5.3's include/Common.h


def _opacity_radii(means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d, radii, means2d,
                   comps, camera_model):  # fmt: skip
    """gsplat 1.5.3's kernel with ``opacities``: an entry whose opacity (times its compensation) is below
    1/255 is culled, the others' extent shrinks to ``min(3.33, sqrt(2 ln(255 o)))`` sigma per axis
    (ProjectionEWA3DGSFused.cu) -- its reference ``_fully_fused_projection`` keeps 3.33. The same rule from
    1.5.0; 1.5.0 and 1.5.1 also cap each axis at ``extend sqrt(v1)``, ``v1`` the larger eigenvalue raised by
    their ``max(0.01, b^2 - det)`` clamp, which a diagonal entry never exceeds: not modelled (on 2M random
    float32 covariances the cap binds 28 times, by rounding, and never changes the ``ceil``'d radius)."""
    ref = torch_impl()
    means_c, covars_c = ref._world_to_cam(means, full_covars(covars, quats, scales), viewmats)
    proj = {"pinhole": ref._persp_proj, "ortho": ref._ortho_proj, "fisheye": ref._fisheye_proj}[camera_model]
    _, covars2d = proj(means_c, covars_c, Ks, width, height)  # the reference's own arithmetic, before the blur
    variance = torch.stack([covars2d[..., 0, 0], covars2d[..., 1, 1]], dim=-1) + eps2d  # [..., C, N, 2]
    opacity = opacities[..., None, :].expand(radii.shape[:-1])
    if comps is not None:
        opacity = opacity * comps
    extend = torch.sqrt(2.0 * torch.log(opacity.clamp_min(ALPHA_THRESHOLD) / ALPHA_THRESHOLD)).clamp(max=3.33)
    radius = torch.ceil(extend[..., None] * torch.sqrt(variance))
    inside = ((means2d + radius > 0) & (means2d - radius < torch.tensor([width, height]).to(means2d))).all(dim=-1)
    alive = (radii > 0).all(dim=-1) & (opacity >= ALPHA_THRESHOLD) & inside
    return torch.where(alive[..., None], radius, 0).to(torch.int32)


def projection_fwd_153(
    means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
    radius_clip, calc_compensations, camera_model,
):  # fmt: skip
    """1.5.3 ``projection_ewa_3dgs_fused_fwd``: radii per axis `[..., C, N, 2]` (its reference's 3.33 sigma,
    tightened by ``opacities`` when given); culled when both axes are ``<= radius_clip``."""
    radii, means2d, depths, conics, comps = project(
        means, covars, quats, scales, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
        calc_compensations, camera_model,
    )  # fmt: skip
    if opacities is not None:
        radii = _opacity_radii(means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d, radii,
                               means2d, comps, camera_model)  # fmt: skip
    radii = torch.where((radii <= radius_clip).all(dim=-1, keepdim=True), 0, radii).to(torch.int32)
    means2d, depths, conics, comps = _zero_culled((radii > 0).all(dim=-1), means2d, depths, conics, comps)
    return radii.contiguous(), means2d.contiguous(), depths.contiguous(), conics.contiguous(), comps


def projection_packed_fwd_153(
    means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
    radius_clip, calc_compensations, camera_model,
):  # fmt: skip
    """1.5.3 ``projection_ewa_3dgs_packed_fwd``: ``(indptr, batch_ids, camera_ids, gaussian_ids, radii [nnz, 2],
    means2d, depths, conics, compensations)``, batch-major."""
    outputs = projection_fwd_153(
        means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
        radius_clip, calc_compensations, camera_model,
    )  # fmt: skip
    num_cameras, num_gaussians = outputs[2].shape[-2:]

    def flat(t):
        return None if t is None else t.reshape(-1, num_cameras, num_gaussians, *t.shape[outputs[2].dim() :])

    indptr, batch_ids, camera_ids, gaussian_ids, picked = pack(flat(outputs[0]), [flat(t) for t in outputs])
    return indptr, batch_ids, camera_ids, gaussian_ids, *picked


def projection_packed_bwd_153(
    means, covars, quats, scales, viewmats, Ks, width, height, eps2d, camera_model, batch_ids, camera_ids,
    gaussian_ids, conics, compensations, v_means2d, v_depths, v_conics, v_compensations, viewmats_requires_grad,
    sparse_grad,
):  # fmt: skip
    """1.5.3 ``projection_ewa_3dgs_packed_bwd``."""
    del conics, compensations  # recomputed
    return packed_bwd(
        means, covars, quats, scales, viewmats, Ks, width, height, eps2d, camera_model, batch_ids, camera_ids,
        gaussian_ids, v_means2d, v_depths, v_conics, v_compensations, viewmats_requires_grad, sparse_grad,
    )  # fmt: skip


def _intersect_per_axis(means2d, radii, depths, image_ids, num_images, tile_size, tile_width, tile_height, sort,
                        zero_extend_depth):  # fmt: skip
    """gsplat >= 1.5's ``intersect_tile`` on per-axis radii `[..., N, 2]` / `[nnz, 2]`."""
    if means2d.dim() != 2:  # unpacked [..., N, 2]: image = flat index // N
        image_ids = torch.arange(num_images, device=means2d.device).repeat_interleave(means2d.shape[-2])
    counts, isect_ids, flatten_ids = intersect(
        means2d, radii[..., 0], radii[..., 1], depths, image_ids, tile_size, tile_width, tile_height, sort,
        zero_extend_depth=zero_extend_depth,
    )  # fmt: skip
    return counts.reshape(radii.shape[:-1]), isect_ids, flatten_ids


def intersect_tile_153(
    means2d, radii, depths, image_ids, gaussian_ids, num_images, tile_size, tile_width, tile_height, sort, segmented
):  # fmt: skip
    """1.5.3 ``intersect_tile``: radii per axis, batch dims, ids with the depth bits zero-extended."""
    del gaussian_ids, segmented  # segmented: a sort strategy, same order
    return _intersect_per_axis(
        means2d, radii, depths, image_ids, num_images, tile_size, tile_width, tile_height, sort, True
    )  # fmt: skip


# ---------------------------------------------------------------------- gsplat 1.5.0 to 1.5.2's signatures
# 1.5.3's entry points before its batch dimensions: ``[C, N, ...]`` / ``[nnz, ...]`` only, no ``batch_ids``,
# and ``intersect_tile`` without ``segmented`` (gsplat/cuda/csrc/Intersect.cpp and Projection.cpp of each).


def intersect_tile_150(
    means2d, radii, depths, camera_ids, gaussian_ids, num_cameras, tile_size, tile_width, tile_height, sort
):  # fmt: skip
    """1.5.0 ``intersect_tile``: per-axis radii, no ``segmented``, the depth bits sign-extended as 1.4.0's
    (csrc/IntersectTile.cu: ``(int64_t) * (int32_t *)&(depths[idx])``)."""
    del gaussian_ids  # the kernel does not read it for the ids
    return _intersect_per_axis(
        means2d, radii, depths, camera_ids, num_cameras, tile_size, tile_width, tile_height, sort, False
    )  # fmt: skip


def intersect_tile_151(
    means2d, radii, depths, camera_ids, gaussian_ids, num_cameras, tile_size, tile_width, tile_height, sort
):  # fmt: skip
    """1.5.1 and 1.5.2 ``intersect_tile``: 1.5.0's, with the depth bits zero-extended (1.5.1's
    csrc/IntersectTile.cu: ``static_cast<uint32_t>(depth_i32)``, "tolerance for negative depth")."""
    del gaussian_ids
    return _intersect_per_axis(
        means2d, radii, depths, camera_ids, num_cameras, tile_size, tile_width, tile_height, sort, True
    )  # fmt: skip


def projection_packed_fwd_150(
    means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
    radius_clip, calc_compensations, camera_model,
):  # fmt: skip
    """1.5.0 to 1.5.2 ``projection_ewa_3dgs_packed_fwd``: 1.5.3's arguments (``opacities`` after ``scales``)
    and 8 outputs without ``batch_ids``: ``(indptr [C + 1], camera_ids, gaussian_ids, radii [nnz, 2], means2d,
    depths, conics, compensations)``, camera-major (csrc/Projection.cpp's ``std::make_tuple``)."""
    indptr, _, *rest = projection_packed_fwd_153(
        means, covars, quats, scales, opacities, viewmats, Ks, width, height, eps2d, near_plane, far_plane,
        radius_clip, calc_compensations, camera_model,
    )  # fmt: skip
    return indptr, *rest
