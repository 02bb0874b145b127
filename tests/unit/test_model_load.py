"""Loading a checkpoint into the model: a Gaussian parameter it lacks is refused, naming it.

nerfstudio's ``VanillaPipeline.load_state_dict`` retries a failed strict load without ``strict``,
and splatfacto's load has already sized every Gaussian parameter with zeros: without the check a
missing parameter would train on from zeros, without a word."""

from __future__ import annotations

import pytest

from distsplat_ns.utils.errors import UserError
from tests.helpers.model_factory import make_model


def test_a_checkpoint_without_a_gaussian_parameter_is_refused_naming_it() -> None:
    state = make_model(1, num_points=40).state_dict()
    del state["gauss_params.opacities"]
    with pytest.raises(UserError, match=r"^the checkpoint has no Gaussian parameter opacities \(this model trains "):
        make_model(1, num_points=30).load_state_dict(state, strict=False)


def test_a_whole_checkpoint_loads_every_gaussian() -> None:
    saved = make_model(1, num_points=40)
    resumed = make_model(1, num_points=30)
    resumed.load_state_dict(saved.state_dict())
    assert resumed.num_points == 40
    assert all(bool((resumed.gauss_params[n] == saved.gauss_params[n]).all()) for n in saved.gauss_params)
