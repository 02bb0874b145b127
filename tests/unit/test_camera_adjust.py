"""Camera pose optimisation on batches of cameras (model/camera_adjust.py): each camera adjusted as
nerfstudio's ``apply_to_camera`` adjusts it alone, training renders only (as splatfacto)."""

from __future__ import annotations

import pytest
import torch
from nerfstudio.cameras.camera_optimizers import CameraOptimizerConfig

from distsplat_ns.model.camera_adjust import adjusted_camera_to_worlds, camera_loss_terms, with_train_camera_ids
from distsplat_ns.utils.cameras import c2w_to_viewmat
from tests.helpers.model_factory import make_cameras, make_model

IDS = [6, 1, 3]


def _model(mode: str):
    model = make_model(3, num_points=40, camera_optimizer=CameraOptimizerConfig(mode=mode))
    with torch.no_grad():
        adjustment = model.camera_optimizer.pose_adjustment
        adjustment += 0.05 * torch.randn(adjustment.shape, generator=torch.Generator().manual_seed(3))
    return model


@pytest.mark.parametrize("mode", ["SO3xR3", "SE3"])
def test_each_batch_camera_is_adjusted_as_nerfstudio_adjusts_it_alone(mode: str) -> None:
    model = _model(mode)
    cameras = with_train_camera_ids(make_cameras(3), IDS)
    got = adjusted_camera_to_worlds(model.camera_optimizer, cameras)
    for k, camera_id in enumerate(IDS):
        one = make_cameras(3)[k : k + 1]
        one.metadata = {"cam_idx": camera_id}  # splatfacto's single-camera key
        want = model.camera_optimizer.apply_to_camera(one)
        assert torch.equal(got[k : k + 1], want), k
        assert not torch.allclose(want, one.camera_to_worlds, atol=1e-3)  # the adjustment is not the identity
    # Sliced cameras keep their ids (the sharded mode slices the batch into camera groups).
    assert torch.equal(adjusted_camera_to_worlds(model.camera_optimizer, cameras[torch.tensor([2, 0])]), got[[2, 0]])


def test_training_renders_use_adjusted_poses_eval_and_viewer_the_given_ones() -> None:
    model = _model("SO3xR3")
    cameras = with_train_camera_ids(make_cameras(3), IDS)
    given = c2w_to_viewmat(cameras.camera_to_worlds)
    model.train()
    assert not torch.allclose(model.render_inputs(cameras, 1).viewmats, given, atol=1e-3)
    model.eval()
    assert torch.equal(model.render_inputs(cameras, 1).viewmats, given)
    model.train()  # a camera without an id (viser's) is used as given
    assert torch.equal(model.render_inputs(make_cameras(3), 1).viewmats, given)


def test_loss_terms_once_and_none_when_off() -> None:
    model = _model("SO3xR3")
    like = torch.zeros((), dtype=torch.float64)
    added = camera_loss_terms(model.camera_optimizer, True, like)
    assert set(added) == {"camera_opt_regularizer"} and added["camera_opt_regularizer"] > 0
    assert added["camera_opt_regularizer"].dtype == torch.float64 and added["camera_opt_regularizer"].requires_grad
    assert camera_loss_terms(model.camera_optimizer, False, like) == {"camera_opt_regularizer": like}
    assert camera_loss_terms(make_model(1, num_points=40).camera_optimizer, True, like) == {}
