"""The one conversion between nerfstudio's camera poses and gsplat's view matrices, the one
rule for image sizes at a downscale, and a batch's cameras taken by position (``cameras_at``, or
on demand: ``BatchCameras``).

nerfstudio's ``c2w`` is camera-to-world in OpenGL axes (x right, y up, looking down -z); gsplat's
``w2c`` (``viewmats``) is world-to-camera in OpenCV axes (x right, y down, looking down +z).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

import torch

#: nerfstudio's ``Cameras`` (or any tensor dataclass indexed by a long tensor); not imported:
#: this module is below nerfstudio (tests/unit/test_layers.py).
CamerasT = TypeVar("CamerasT")


def c2w_to_viewmat(c2w: torch.Tensor) -> torch.Tensor:
    """OpenCV world-to-camera matrices from OpenGL camera-to-world poses.

    Args:
        c2w: Camera-to-world poses. `[C, 3, 4]` (or `[C, 4, 4]`), float.

    Returns:
        World-to-camera matrices. `[C, 4, 4]`, same dtype and device.

    **Differentiable:** with respect to ``c2w`` (camera optimisation).
    """
    if c2w.dim() != 3 or c2w.shape[-2] not in (3, 4) or c2w.shape[-1] != 4:
        raise ValueError(f"c2w must be [C, 3, 4] or [C, 4, 4], got {tuple(c2w.shape)}")
    rot = torch.cat([c2w[:, :3, :1], -c2w[:, :3, 1:3]], dim=-1)  # OpenGL -> OpenCV camera axes (y, z flipped)
    trans = c2w[:, :3, 3:4]
    rot_inv = rot.transpose(1, 2)
    viewmat = torch.zeros(c2w.shape[0], 4, 4, dtype=c2w.dtype, device=c2w.device)
    viewmat[:, 3, 3] = 1.0
    viewmat[:, :3, :3] = rot_inv
    viewmat[:, :3, 3:4] = -torch.bmm(rot_inv, trans)
    return viewmat


def downscaled_px(px: int, downscale: int) -> int:
    """An image side (px) rendered at ``1 / downscale`` resolution: truncated, as nerfstudio's
    ``Cameras.rescale_output_resolution`` and splatfacto's resolution schedule do."""
    return int(px / downscale)


class ResolutionSchedule:
    """Splatfacto's resolution schedule counted in images: step ``t`` renders at
    ``1 / 2 ** max(num_downscales - t * batch_size // resolution_schedule, 0)``.

    The one copy of the rule, for the model and the datamanager's workers (a small picklable callable,
    where a bound method of the model would pickle the whole model).

    Args:
        num_downscales: Halvings at the start (splatfacto's ``num_downscales``).
        resolution_schedule: Images per halving undone (splatfacto's ``resolution_schedule``).
        batch_size: Images per step.
    """

    def __init__(self, num_downscales: int, resolution_schedule: int, batch_size: int) -> None:
        if resolution_schedule < 1 or batch_size < 1 or num_downscales < 0:
            raise ValueError(
                f"ResolutionSchedule needs num_downscales >= 0, resolution_schedule >= 1 and batch_size >= 1, got "
                f"{num_downscales}, {resolution_schedule}, {batch_size}"
            )
        self.num_downscales = num_downscales
        self.resolution_schedule = resolution_schedule
        self.batch_size = batch_size

    def __call__(self, step: int) -> int:
        return 2 ** max(self.num_downscales - step * self.batch_size // self.resolution_schedule, 0)


def cameras_at(cameras: CamerasT, indices: Sequence[int]) -> CamerasT:
    """``cameras[indices]``, or ``cameras`` itself when ``indices`` are all of them in order: an
    index of nerfstudio's ``Cameras`` costs an operator per field (about 20 a call), and one
    rank, or one camera group, often takes the whole batch."""
    if list(indices) == list(range(len(cameras))):
        return cameras
    return cameras[torch.tensor(list(indices), dtype=torch.long)]


class BatchCameras(Generic[CamerasT]):
    """A step's cameras by batch position, indexed on demand and once per set of positions, and
    their rendered sizes without any index (docs/host_cost.md).

    Args:
        camera_ids: The training-camera index at each batch position.
        take: The cameras of the given training-camera indices, in that order.
        image_sizes_px: Full ``(width, height)`` of the camera at each batch position.
    """

    def __init__(
        self,
        camera_ids: Sequence[int],
        take: Callable[[list[int]], CamerasT],
        image_sizes_px: Sequence[tuple[int, int]],
    ) -> None:
        self.camera_ids = list(camera_ids)
        if len(image_sizes_px) != len(self.camera_ids):
            raise ValueError(f"BatchCameras: {len(image_sizes_px)} image sizes for a batch of {len(self.camera_ids)}")
        self._image_sizes_px = [(int(w), int(h)) for w, h in image_sizes_px]
        self._take = take
        self._taken: dict[tuple[int, ...], CamerasT] = {}

    @classmethod
    def of(cls, cameras: CamerasT) -> BatchCameras[CamerasT]:
        """Cameras already taken, one per batch position in order (``cameras_at`` picks from them).

        **Host sync:** their sizes, for device-side cameras.
        """
        sizes = zip(cameras.width.reshape(-1).tolist(), cameras.height.reshape(-1).tolist(), strict=True)  # type: ignore[attr-defined]
        return cls(range(len(cameras)), lambda positions: cameras_at(cameras, positions), list(sizes))  # type: ignore[arg-type]

    def __len__(self) -> int:
        return len(self.camera_ids)

    def _check(self, positions: tuple[int, ...]) -> None:
        if not all(0 <= p < len(self.camera_ids) for p in positions):
            raise IndexError(f"BatchCameras: positions {list(positions)} outside a batch of {len(self.camera_ids)}")

    def at(self, positions: Sequence[int]) -> CamerasT:
        """The cameras at ``positions``, in that order."""
        key = tuple(positions)
        self._check(key)
        if key not in self._taken:
            self._taken[key] = self._take([self.camera_ids[p] for p in key])
        return self._taken[key]

    def sizes_px(self, positions: Sequence[int], downscale: int) -> list[tuple[int, int]]:
        """The rendered ``(width, height)`` at ``downscale`` of the cameras at ``positions`` (cameras
        of one batch may differ in size: a multi-camera capture)."""
        key = tuple(positions)
        self._check(key)
        return [
            (downscaled_px(w, downscale), downscaled_px(h, downscale))
            for w, h in (self._image_sizes_px[p] for p in key)
        ]
