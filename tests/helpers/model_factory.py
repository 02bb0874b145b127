"""A small DistSplatModel on a synthetic but well-posed scene, built without a dataset."""

from __future__ import annotations

import math

import torch
from nerfstudio.cameras.cameras import Cameras, CameraType
from nerfstudio.data.scene_box import SceneBox

from distsplat_ns.gaussians.ownership import owned_block
from distsplat_ns.model.distsplat_model import DistSplatModel, DistSplatModelConfig

HEIGHT, WIDTH = 48, 40


def make_model(batch_size: int, num_points: int = 400, seed: int = 0, **config_overrides) -> DistSplatModel:
    """Gaussians on a noisy sphere of radius 1 around the origin, colours from a fixed generator."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    xyz = torch.randn(num_points, 3, generator=gen)
    xyz = xyz / xyz.norm(dim=-1, keepdim=True) * (0.8 + 0.4 * torch.rand(num_points, 1, generator=gen))
    rgb = (torch.rand(num_points, 3, generator=gen) * 255).to(torch.uint8)
    defaults = {"num_downscales": 0, "background_color": "black", "sh_degree": 1, "sh_degree_interval": 1}
    defaults.update(config_overrides)
    config = DistSplatModelConfig(**defaults)
    model = config.setup(
        scene_box=SceneBox(aabb=torch.tensor([[-2.0, -2.0, -2.0], [2.0, 2.0, 2.0]])),
        num_train_data=8,
        metadata={},
        device="cpu",
        seed_points=(xyz, rgb),
        batch_size=batch_size,
    )
    # Anisotropic scales, so that rotations matter and quaternion gradients are not numerical noise.
    with torch.no_grad():
        model.gauss_params["scales"] += 0.4 * torch.randn(model.gauss_params["scales"].shape, generator=gen)
    model.train()
    return model


def keep_to_top_rows_(model: DistSplatModel) -> None:
    """Lift the Gaussians above the sphere and shrink them so that, in ``make_cameras``' views,
    none reaches pixel row 32 (measured: the lowest footprint ends at row 17): the bands of rows
    ``[32, HEIGHT)`` see no Gaussian."""
    with torch.no_grad():
        means = model.gauss_params["means"]
        means[:, 1] = 1.4 + 0.1 * means[:, 1]
        model.gauss_params["scales"] -= 1.0


def take_initial_shard_(model: DistSplatModel, rank: int, world: int) -> None:
    """Keep rank's ``owned_block`` of a whole model built in this process (ids ``0..N-1``), before
    any optimizer exists: the whole-then-partitioned set-up of the tests that compare a shard with
    the whole model after changing it (the trainer builds only the block: ``gaussians/initial.py``)."""
    num = int(model.gauss_params["means"].shape[0])
    lo, hi = owned_block(num, rank, world)
    if (lo, hi) != (0, num):
        model.rows.select_(slice(lo, hi))


def make_cameras(num: int) -> Cameras:
    """``num`` OpenGL cameras on a circle of radius 4 looking at the origin."""
    c2ws = []
    for i in range(num):
        angle = 2 * math.pi * i / num
        eye = torch.tensor([4 * math.cos(angle), 0.5, 4 * math.sin(angle)])
        forward = -eye / eye.norm()  # camera looks down -z in OpenGL
        right = torch.linalg.cross(forward, torch.tensor([0.0, 1.0, 0.0]))
        right = right / right.norm()
        up = torch.linalg.cross(right, forward)
        rot = torch.stack([right, up, -forward], dim=1)
        c2ws.append(torch.cat([rot, eye[:, None]], dim=1))
    return Cameras(
        camera_to_worlds=torch.stack(c2ws),
        fx=60.0,
        fy=60.0,
        cx=WIDTH / 2,
        cy=HEIGHT / 2,
        width=WIDTH,
        height=HEIGHT,
        camera_type=CameraType.PERSPECTIVE,
    )


def make_images(num: int, seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.rand(HEIGHT, WIDTH, 3, generator=gen) * 255).to(torch.uint8) for _ in range(num)]


#: Rendered (width, height) of the two cameras of ``make_mixed_cameras``: a multi-camera capture.
MIXED_SIZES = [(WIDTH, HEIGHT), (32, 40)]


def make_mixed_cameras() -> Cameras:
    """Two cameras of ``make_cameras(2)``'s poses whose images differ in size (``MIXED_SIZES``)."""
    poses = make_cameras(2).camera_to_worlds
    widths = torch.tensor([[w] for w, _ in MIXED_SIZES])
    heights = torch.tensor([[h] for _, h in MIXED_SIZES])
    return Cameras(
        camera_to_worlds=poses,
        fx=60.0,
        fy=60.0,
        cx=widths / 2.0,
        cy=heights / 2.0,
        width=widths,
        height=heights,
        camera_type=CameraType.PERSPECTIVE,
    )


def make_mixed_images(seed: int = 1) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.rand(h, w, 3, generator=gen) * 255).to(torch.uint8) for w, h in MIXED_SIZES]
