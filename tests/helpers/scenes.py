"""Small Gaussian scenes and cameras for tests and benchmarks (seeded, device/dtype aware).

Conventions are the renderer's: ``viewmats`` are world-to-camera in OpenCV axes (x right, y down,
z forward), ``Ks`` are pinhole intrinsics in px, quaternions are ``(w, x, y, z)``, ``scales`` and
``opacities`` are activated.

Shape legend: ``C`` cameras, ``N`` Gaussians, ``K`` SH bases, ``D`` channels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "Scene",
    "look_at_viewmat",
    "pinhole_K",
    "random_scene",
    "single_gaussian_scene",
    "two_gaussian_scene",
]

_PARAM_NAMES = ("means", "quats", "scales", "opacities", "colors")


@dataclass
class Scene:
    """Gaussians plus the cameras to render them with.

    Attributes:
        means: `[N, 3]`. quats: `[N, 4]`. scales: `[N, 3]`. opacities: `[N]`.
        colors: `[N, D]` colours, or `[N, K, 3]` SH coefficients when ``sh_degree`` is set.
        viewmats: `[C, 4, 4]` world-to-camera. Ks: `[C, 3, 3]`.
        width, height: Image size, px.
        sh_degree: Degree to evaluate ``colors`` with, or None for plain colours.
    """

    means: Tensor
    quats: Tensor
    scales: Tensor
    opacities: Tensor
    colors: Tensor
    viewmats: Tensor
    Ks: Tensor
    width: int
    height: int
    sh_degree: int | None = None

    @property
    def num_cameras(self) -> int:
        return int(self.viewmats.shape[0])

    @property
    def num_gaussians(self) -> int:
        return int(self.means.shape[0])

    def params(self) -> dict[str, Tensor]:
        """The Gaussian tensors, keyed as ``project``/``rasterization`` name them."""
        return {name: getattr(self, name) for name in _PARAM_NAMES}

    def kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``project`` / ``rasterization`` (without backend/modes)."""
        return dict(
            **self.params(),
            viewmats=self.viewmats,
            Ks=self.Ks,
            width=self.width,
            height=self.height,
            sh_degree=self.sh_degree,
        )

    def to(self, device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> Scene:
        """A copy with every tensor moved/cast (fresh leaves, no grad)."""
        moved = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, Tensor):
                value = value.detach().to(device=device, dtype=dtype if value.is_floating_point() else None)
            moved[f.name] = value
        return replace(self, **moved)

    def with_grad(self) -> Scene:
        """A copy whose Gaussian tensors are fresh leaves requiring grad."""
        return replace(self, **{n: getattr(self, n).detach().clone().requires_grad_(True) for n in _PARAM_NAMES})

    def select_cameras(self, index: Sequence[int] | slice) -> Scene:
        """A copy with a subset of the cameras (Gaussian tensors are shared)."""
        return replace(self, viewmats=self.viewmats[index], Ks=self.Ks[index])


def look_at_viewmat(
    eye: Sequence[float],
    target: Sequence[float] = (0.0, 0.0, 0.0),
    up: Sequence[float] = (0.0, -1.0, 0.0),
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """World-to-camera matrix (OpenCV) of a camera at ``eye`` looking at ``target``.

    Args:
        eye: Camera centre. target: Point on the optical axis. up: World direction that should
            appear upward in the image (OpenCV y points down, so the default is world -y).

    Returns:
        `[4, 4]` world-to-camera.
    """
    eye_t = torch.tensor(eye, dtype=torch.float64)
    forward = torch.tensor(target, dtype=torch.float64) - eye_t
    forward = forward / forward.norm()
    down = -torch.tensor(up, dtype=torch.float64)
    right = torch.linalg.cross(down, forward)
    right = right / right.norm()
    down = torch.linalg.cross(forward, right)
    rot = torch.stack([right, down, forward])  # rows: camera axes in world coordinates
    w2c = torch.eye(4, dtype=torch.float64)
    w2c[:3, :3] = rot
    w2c[:3, 3] = -rot @ eye_t
    return w2c.to(dtype)


def pinhole_K(
    width: int,
    height: int,
    fov_x_deg: float = 60.0,
    dtype: torch.dtype = torch.float32,
    principal: tuple[float, float] | None = None,
) -> Tensor:
    """Pinhole intrinsics with square pixels and the given horizontal field of view. `[3, 3]`."""
    focal = 0.5 * width / math.tan(math.radians(fov_x_deg) / 2)
    cx, cy = principal if principal is not None else (width / 2, height / 2)
    return torch.tensor([[focal, 0.0, cx], [0.0, focal, cy], [0.0, 0.0, 1.0]], dtype=dtype)


def _random_quats(n: int, gen: torch.Generator, dtype: torch.dtype) -> Tensor:
    return torch.randn(n, 4, generator=gen, dtype=torch.float64).to(dtype)


def random_scene(
    num_gaussians: int = 300,
    num_cameras: int = 1,
    width: int = 64,
    height: int = 48,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    extent: float = 1.0,
    camera_distance: float = 4.0,
    scale_range: tuple[float, float] = (0.02, 0.12),
    opacity_range: tuple[float, float] = (0.05, 0.95),
    num_channels: int = 3,
    sh_degree: int | None = None,
    fov_x_deg: float = 60.0,
) -> Scene:
    """Gaussians in a cube of half-side ``extent`` at the origin, seen by cameras on a small arc.

    Args:
        num_gaussians: N. num_cameras: C (camera ``c`` sits at azimuth ``0.15 c`` rad).
        width, height: Image size, px.
        seed: Everything random derives from it.
        dtype, device: Of every tensor.
        extent: Half-side of the cube, world units.
        camera_distance: Distance of the cameras from the origin, world units.
        scale_range: Log-uniform range of the scales, world units.
        opacity_range: Uniform range of the opacities.
        num_channels: D for plain colours (ignored with ``sh_degree``).
        sh_degree: If set, colours are SH coefficients `[N, (sh_degree + 1) ** 2, 3]`.
        fov_x_deg: Horizontal field of view of every camera.

    Returns:
        The scene.
    """
    gen = torch.Generator().manual_seed(seed)

    def uniform(*shape: int, low: float = 0.0, high: float = 1.0) -> Tensor:
        return (low + (high - low) * torch.rand(*shape, generator=gen, dtype=torch.float64)).to(dtype)

    means = uniform(num_gaussians, 3, low=-extent, high=extent)
    quats = _random_quats(num_gaussians, gen, dtype)
    log_lo, log_hi = math.log(scale_range[0]), math.log(scale_range[1])
    scales = torch.exp(uniform(num_gaussians, 3, low=log_lo, high=log_hi))
    opacities = uniform(num_gaussians, low=opacity_range[0], high=opacity_range[1])
    if sh_degree is None:
        colors = uniform(num_gaussians, num_channels)
    else:
        colors = 0.4 * torch.randn(num_gaussians, (sh_degree + 1) ** 2, 3, generator=gen, dtype=torch.float64).to(dtype)
    viewmats, Ks = [], []
    for c in range(num_cameras):
        azimuth = 0.15 * c
        eye = (camera_distance * math.sin(azimuth), 0.1 * c, -camera_distance * math.cos(azimuth))
        viewmats.append(look_at_viewmat(eye, dtype=dtype))
        Ks.append(pinhole_K(width, height, fov_x_deg, dtype=dtype))
    scene = Scene(
        means=means,
        quats=quats,
        scales=scales,
        opacities=opacities,
        colors=colors,
        viewmats=torch.stack(viewmats),
        Ks=torch.stack(Ks),
        width=width,
        height=height,
        sh_degree=sh_degree,
    )
    return scene.to(device=device)


def single_gaussian_scene(
    width: int = 32,
    height: int = 32,
    *,
    depth: float = 3.0,
    scale: float = 0.1,
    opacity: float = 0.8,
    color: Sequence[float] = (1.0, 0.5, 0.25),
    focal: float = 40.0,
    center_px: tuple[float, float] | None = None,
    dtype: torch.dtype = torch.float32,
) -> Scene:
    """One isotropic Gaussian on the optical axis of an identity camera.

    With the principal point at ``center_px`` (default the image centre) the Gaussian projects
    to that point with screen standard deviation ``focal * scale / depth`` px (before ``eps2d``).
    """
    cx, cy = center_px if center_px is not None else (width / 2, height / 2)
    return Scene(
        means=torch.tensor([[0.0, 0.0, depth]], dtype=dtype),
        quats=torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=dtype),
        scales=torch.full((1, 3), scale, dtype=dtype),
        opacities=torch.tensor([opacity], dtype=dtype),
        colors=torch.tensor([list(color)], dtype=dtype),
        viewmats=torch.eye(4, dtype=dtype)[None],
        Ks=torch.tensor([[[focal, 0.0, cx], [0.0, focal, cy], [0.0, 0.0, 1.0]]], dtype=dtype),
        width=width,
        height=height,
    )


def two_gaussian_scene(
    depths: tuple[float, float] = (2.0, 4.0),
    *,
    width: int = 32,
    height: int = 32,
    opacity: float = 0.9,
    dtype: torch.dtype = torch.float32,
) -> Scene:
    """Two large Gaussians on the optical axis, red then blue, at the given depths.

    Their screen sizes are made equal (scale proportional to depth) so only the order differs.
    """
    scene = single_gaussian_scene(width, height, dtype=dtype)
    d = torch.tensor(depths, dtype=dtype)
    return replace(
        scene,
        means=torch.stack([torch.zeros_like(d), torch.zeros_like(d), d], dim=-1),
        quats=torch.tensor([[1.0, 0.0, 0.0, 0.0]] * 2, dtype=dtype),
        scales=(0.1 * d)[:, None].expand(2, 3).contiguous(),
        opacities=torch.full((2,), opacity, dtype=dtype),
        colors=torch.tensor([[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]], dtype=dtype),
    )


def assert_grads_close(got: Tensor, want: Tensor, rel: float = 1e-5, name: str = "") -> None:
    """Elementwise ``|got - want| <= rel * (|want| + max|want|)``: relative to the tensor's scale.

    Why scale by ``max|want|``: a gradient entry is a sum over many pixels of terms of both signs;
    when they nearly cancel, its own magnitude says nothing about the rounding error, which is set
    by the size of the terms, of which ``max|want|`` is a fair proxy.
    """
    scale = float(want.abs().max()) if want.numel() else 0.0
    torch.testing.assert_close(got, want, rtol=rel, atol=rel * scale, msg=lambda m: f"{name}: {m}" if name else m)
