"""Open each viewer client at a training camera (ns-train's live viewer and ns-viewer alike).

viser's default camera sits at a fixed point that often sees nothing of a capture (a forward-facing
scene is empty from there). nerfstudio's viewer hands every ``ViewerControl`` it finds on the
pipeline a reference to itself (``_setup``) when the scene is built; this one uses it to register a
connect handler that moves each new client to the first training camera -- the same pose
conversion as nerfstudio's click-to-jump on a training frustum.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from nerfstudio.viewer.viewer_elements import ViewerControl


class StartAtTrainingView(ViewerControl):
    """A viewer control that puts new clients at a training camera.

    Args:
        c2w: The training camera's pose, OpenGL camera-to-world. `[3, 4]`, numpy float.
    """

    def __init__(self, c2w: np.ndarray) -> None:
        self._c2w = np.asarray(c2w, dtype=np.float64)

    def _setup(self, viewer: Any) -> None:
        super()._setup(viewer)
        import viser.transforms as vtf
        from nerfstudio.viewer.viewer import VISER_NERFSTUDIO_SCALE_RATIO

        wxyz = (vtf.SO3.from_matrix(self._c2w[:3, :3]) @ vtf.SO3.from_x_radians(np.pi)).wxyz
        position = self._c2w[:3, 3] * VISER_NERFSTUDIO_SCALE_RATIO

        def _on_connect(client: Any) -> None:
            with client.atomic():
                client.camera.wxyz = wxyz
                client.camera.position = position

        self.viser_server.on_client_connect(_on_connect)
