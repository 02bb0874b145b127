"""gsplat's packed layout for the reference backend: ``[nnz, ...]`` tensors of the visible pairs.

gsplat's ``packed=True`` keeps only the (camera, Gaussian) pairs with ``radii > 0``, camera-major
and Gaussian-ascending within a camera (its projection kernel's block scan writes them in that
order), and names them by ``camera_ids`` / ``gaussian_ids``. The reference rasterizer works on
``[C, N, ...]``, so here the packed tensors are scattered back to that layout (zeros where culled,
which the rasterizer never reads) for rasterization. The packed tensors are thus in the autograd
graph -- ``means2d.grad`` and ``.absgrad`` are ``[nnz, 2]`` as in gsplat -- while every pixel and
every input gradient is computed by the same arithmetic as with ``packed=False`` (a gather and a
scatter with distinct indices move values without adding them).

Shape legend: ``C`` cameras, ``N`` Gaussians, ``D`` channels, ``nnz`` visible pairs.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["PackedGaussians", "forward_absgrad", "pack", "unpack"]


@dataclass
class PackedGaussians:
    """The visible (camera, Gaussian) pairs of a projection, gsplat's packed layout.

    Attributes:
        camera_ids: Camera of each pair. `[nnz]`, int64.
        gaussian_ids: Gaussian of each pair. `[nnz]`, int64.
        radii: `[nnz]`, int32, px, all > 0.
        means2d: `[nnz, 2]`, px; retains its gradient when it requires one.
        depths: `[nnz]`, world units.
        conics: `[nnz, 3]`, 1/px^2.
        opacities: `[nnz]` (times the compensation in antialiased mode).
        colors: `[nnz, D]` (depth appended for ``RGB+ED``).
    """

    camera_ids: Tensor
    gaussian_ids: Tensor
    radii: Tensor
    means2d: Tensor
    depths: Tensor
    conics: Tensor
    opacities: Tensor
    colors: Tensor


def pack(
    radii: Tensor, means2d: Tensor, depths: Tensor, conics: Tensor, opacities: Tensor, colors: Tensor
) -> PackedGaussians:
    """Keep the pairs with ``radii > 0`` of `[C, N, ...]` tensors, in gsplat's packed order.

    **Host sync:** once (``nonzero`` sizes its output).

    **Differentiable:** with respect to every float input (a gather).
    """
    camera_ids, gaussian_ids = torch.nonzero(radii > 0, as_tuple=True)  # row-major: camera, then Gaussian
    packed_means2d = means2d[camera_ids, gaussian_ids]
    if packed_means2d.requires_grad:
        packed_means2d.retain_grad()
    return PackedGaussians(
        camera_ids=camera_ids,
        gaussian_ids=gaussian_ids,
        radii=radii[camera_ids, gaussian_ids],
        means2d=packed_means2d,
        depths=depths[camera_ids, gaussian_ids],
        conics=conics[camera_ids, gaussian_ids],
        opacities=opacities[camera_ids, gaussian_ids],
        colors=colors[camera_ids, gaussian_ids],
    )


def _scatter(values: Tensor, packed: PackedGaussians, num_cameras: int, num_gaussians: int) -> Tensor:
    dense = values.new_zeros((num_cameras, num_gaussians, *values.shape[1:]))
    return dense.index_put((packed.camera_ids, packed.gaussian_ids), values)


def unpack(packed: PackedGaussians, num_cameras: int, num_gaussians: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(means2d, conics, opacities, colors)`` back as `[C, N, ...]`, zeros where culled.

    **Differentiable:** with respect to the packed tensors (the gradient is gathered back).
    """
    return tuple(
        _scatter(t, packed, num_cameras, num_gaussians)
        for t in (packed.means2d, packed.conics, packed.opacities, packed.colors)
    )  # type: ignore[return-value]


def forward_absgrad(packed: PackedGaussians, dense_sink: Tensor) -> None:
    """After each backward, set ``packed.means2d.absgrad`` to the packed view of ``dense_sink``.

    ``dense_sink`` `[C, N, 2]` is filled by the rasterizer's backward, which runs before the
    gradient reaches the packed ``means2d`` (the scatter of ``unpack`` lies between them).
    """
    means2d = packed.means2d
    if not means2d.requires_grad:
        return
    means2d_ref = weakref.ref(means2d)  # the hook is stored on the tensor: no cycle through it
    camera_ids, gaussian_ids = packed.camera_ids, packed.gaussian_ids

    def hook(grad: Tensor) -> None:
        target = means2d_ref()
        if target is not None:
            target.absgrad = dense_sink[camera_ids, gaussian_ids]  # type: ignore[attr-defined]

    means2d.register_hook(hook)
