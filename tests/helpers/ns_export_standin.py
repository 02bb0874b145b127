"""ns-export with "the device" a CPU stand-in for CUDA (tests/helpers/device_standin.py), and the
saved model's image on its own backend against the reference's.

Usage: ``ns_export_standin.py [--render-parity OUT.json] <ns-export arguments>``. nerfstudio's
``eval_setup`` puts the pipeline on ``cuda`` when ``torch.cuda.is_available()``, as on a user's GPU:
under the stand-in it does, so a run trained on the gsplat backend is read back on the device it
trained on (on the plain CPU the package refuses ``rendering_backend="gsplat"``). With
``--render-parity``, the same process then renders the first training camera of ``--load-config``'s
run with the run's backend and with the reference backend, and writes both images' largest
difference to ``OUT.json``: a call into gsplat that runs but computes the wrong thing shows there.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if "tests.helpers" not in sys.modules:  # run as a script: the repository it is in, after PYTHONPATH
    sys.path.append(str(Path(__file__).resolve().parents[2]))


def render_parity(config: Path) -> dict:
    """The first training camera of ``config``'s run, rendered from its latest checkpoint by the run's
    backend and by the reference: the backend each resolved to and the largest absolute difference of
    the colours and of the alphas (``accumulation``)."""
    import torch
    from nerfstudio.utils.eval_utils import eval_setup

    from distsplat_ns.rendering import resolve_backend

    _, pipeline, _, _ = eval_setup(config, test_mode="inference")
    model = pipeline.model
    camera = pipeline.datamanager.train_dataparser_outputs.cameras[0:1].to(model.device)
    backends, images = [], []
    for backend in (model.config.rendering_backend, "reference"):
        model.config.rendering_backend = backend
        with torch.no_grad():
            outputs = model.get_outputs_for_camera(camera)
        backends.append(resolve_backend(backend, model.device))
        images.append((outputs["rgb"].cpu(), outputs["accumulation"].cpu()))
    (rgb, alpha), (ref_rgb, ref_alpha) = images
    return {
        "backends": backends,
        "num_gaussians": int(model.num_points),
        "max_abs_rgb": float((rgb - ref_rgb).abs().max()),
        "max_abs_alpha": float((alpha - ref_alpha).abs().max()),
    }


def main() -> None:
    from tests.helpers import device_standin

    parity_out = None
    if sys.argv[1:2] == ["--render-parity"]:
        parity_out = Path(sys.argv[2])
        del sys.argv[1:3]
    with device_standin.installed():
        from nerfstudio.scripts.exporter import entrypoint

        entrypoint()
        if parity_out is not None:
            config = Path(sys.argv[sys.argv.index("--load-config") + 1])
            parity_out.write_text(json.dumps(render_parity(config)))


if __name__ == "__main__":
    main()
