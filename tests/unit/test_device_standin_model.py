"""The viewer's renders of a model moved to the CUDA device stand-in (tests/helpers/device_standin.py)
stay on the device, an empty crop box's included (docs/gpu.md: it returned the host background)."""

from __future__ import annotations

import pytest
import torch
from nerfstudio.data.scene_box import OrientedBox

from tests.helpers.device_standin import DeviceTensor, installed
from tests.helpers.model_factory import make_cameras, make_model


@pytest.mark.parametrize("crop_centre", [0.0, 100.0], ids=["crop-with-gaussians", "empty-crop"])
def test_a_cropped_viewer_render_is_on_the_device(crop_centre: float) -> None:
    with installed():
        model = make_model(1, num_points=60, rendering_backend="reference").eval().to(torch.device("cuda", 0))
        model.crop_box = OrientedBox(R=torch.eye(3), T=torch.full((3,), crop_centre), S=torch.full((3,), 3.0))
        camera = make_cameras(1).to(torch.device("cuda", 0))
        with torch.no_grad():
            outputs = model.get_outputs(camera)
        assert isinstance(outputs["rgb"], DeviceTensor), f"rgb on the host: {type(outputs['rgb']).__name__}"
        assert outputs["rgb"].shape[-1] == 3
