"""MCMC wired into the model: the flag, its validation, the strategy object the pipeline calls,
the regularizers' shares and the checkpoint state (tests/multiproc/test_mcmc_training.py trains)."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.gaussians.densifier import gather_local
from distsplat_ns.gaussians.mcmc import MCMCDensifier
from distsplat_ns.gaussians.strategy import DefaultDensifier
from distsplat_ns.model.band_render import RegularizerShare
from distsplat_ns.model.distsplat_model import DistSplatModelConfig
from tests.helpers.model_factory import make_model


def regularizers(model, share: RegularizerShare):
    """The model's batch-independent terms at step 1 (``BandTerms.regularizers``, as ``forward_bands`` calls it)."""
    return model.band_terms.regularizers(
        1, share, model.opacities, model.scales, model.training, None, model.camera_optimizer
    )


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"strategy": "mcmc2"}, ValueError),
        ({"strategy": "mcmc", "max_gs_num": 0}, ValueError),
        ({"strategy": "mcmc", "noise_lr": -1.0}, ValueError),
        ({"strategy": "mcmc", "mcmc_opacity_reg": float("nan")}, ValueError),
        ({"strategy": "mcmc", "cull_alpha_thresh": 1.0}, ValueError),
        ({"strategy": "mcmc", "max_gs_num": 1.5}, TypeError),
    ],
)
def test_bad_mcmc_fields_are_refused_at_construction(fields: dict, error: type) -> None:
    with pytest.raises(error):
        DistSplatModelConfig(**fields)


def test_default_strategy_is_default_and_mcmc_reads_no_statistics() -> None:
    default = make_model(2, num_points=50)
    assert isinstance(default.densifier, DefaultDensifier) and default.mcmc is None
    assert default.densifier.needs_statistics(0)
    mcmc = make_model(2, num_points=50, strategy="mcmc", warmup_length=4, refine_every=4, stop_split_at=20)
    assert isinstance(mcmc.densifier, MCMCDensifier)
    assert set(mcmc.strategy_state) == {"gauss_ids"}
    assert not any(mcmc.densifier.needs_statistics(s) for s in range(30))
    # In images at B = 2: start 2 steps, every 2, stop 10 (gsplat's strict bounds).
    assert [s for s in range(30) if mcmc.densifier.changes_shards_at(s)] == [4, 6, 8]


def _optimizers(model) -> dict:
    return {k: torch.optim.Adam([p], lr=1e-3) for k, p in model.gauss_params.items()}


def test_mcmc_densify_moves_only_transparent_gaussians_and_numbers_new_ones() -> None:
    model = make_model(
        1, num_points=60, strategy="mcmc", warmup_length=1, refine_every=2, stop_split_at=100, max_gs_num=62
    )
    with torch.no_grad():
        model.gauss_params["opacities"][:5] = -10.0  # dead: relocated at the event
        model.gauss_params["opacities"][5:] = 3.0  # opaque: the noise's gate leaves them where they are
    before = model.means.detach().clone()
    optimizers = _optimizers(model)
    model.densifier.after_optimizer(model.rows.bound(optimizers), 1, None, gather_local)  # not an event: noise only
    assert model.num_points == 60 and model.densifier.next_id == 60
    moved = (model.means.detach() - before).abs().amax(dim=-1) > 0
    assert moved[:5].all() and not moved[5:].any()
    model.densifier.after_optimizer(
        model.rows.bound(optimizers), 2, None, gather_local
    )  # event: 5 relocated, 2 added (cap 62)
    assert model.num_points == 62 and model.densifier.next_id == 60 + 5 + 2
    ids = model.gauss_ids
    assert sorted(ids.tolist()) == sorted(set(range(5, 60)) | set(range(60, 67)))
    assert all(optimizers[k].param_groups[0]["params"][0] is p for k, p in model.gauss_params.items())
    state = model.get_extra_state()
    assert set(state["strategy_state"]) == {"gauss_ids"} and state["next_gauss_id"] == 67
    other = make_model(1, num_points=62, strategy="mcmc")
    other.set_extra_state(state)
    assert torch.equal(other.gauss_ids, ids) and other.densifier.next_id == 67


def test_mcmc_regularizers_sum_over_shares_to_one_process() -> None:
    """Replicated: one rank adds the terms for all N; sharded: each rank its rows over the global N."""
    model = make_model(1, num_points=40, strategy="mcmc", use_scale_regularization=False)
    whole, _ = regularizers(model, RegularizerShare(camera_penalty=False, scale_term=True, num_gaussians_total=40))
    expected = 0.01 * torch.sigmoid(model.opacities).mean() + 0.01 * torch.exp(model.scales).mean()
    torch.testing.assert_close(whole, expected, rtol=1e-6, atol=0)
    off, _ = regularizers(model, RegularizerShare(camera_penalty=False, scale_term=False, num_gaussians_total=40))
    assert off.item() == 0.0
    default = make_model(1, num_points=40, use_scale_regularization=False)
    assert (
        regularizers(default, RegularizerShare(camera_penalty=False, scale_term=True, num_gaussians_total=40))[0].item()
        == 0.0
    )


def test_mcmc_terms_are_named_as_main_s_loss_dict_and_sum_to_the_total() -> None:
    """main's keys, each term's share detached, zero on a rank that adds none; a zero weight has
    no entry (main adds an entry only for a positive weight). rtol 1e-6: float32 means of 40."""
    model = make_model(1, num_points=40, strategy="mcmc", use_scale_regularization=False, mcmc_scale_reg=0.02)
    total, named = regularizers(model, RegularizerShare(camera_penalty=False, scale_term=True, num_gaussians_total=40))
    assert list(named) == ["mcmc_opacity_reg", "mcmc_scale_reg"] and not any(v.requires_grad for v in named.values())
    torch.testing.assert_close(
        named["mcmc_opacity_reg"], 0.01 * torch.sigmoid(model.opacities).mean().detach(), rtol=1e-6, atol=0
    )
    torch.testing.assert_close(
        named["mcmc_scale_reg"], 0.02 * torch.exp(model.scales).mean().detach(), rtol=1e-6, atol=0
    )
    assert total.item() == (named["mcmc_opacity_reg"] + named["mcmc_scale_reg"]).item()
    _, off = regularizers(model, RegularizerShare(camera_penalty=False, scale_term=False, num_gaussians_total=40))
    assert {k: v.item() for k, v in off.items()} == {"mcmc_opacity_reg": 0.0, "mcmc_scale_reg": 0.0}
    no_opacity = make_model(1, num_points=40, strategy="mcmc", mcmc_opacity_reg=0.0)
    assert list(
        regularizers(no_opacity, RegularizerShare(camera_penalty=False, scale_term=True, num_gaussians_total=40))[1]
    ) == ["mcmc_scale_reg"]
    default = make_model(1, num_points=40)
    assert (
        regularizers(default, RegularizerShare(camera_penalty=False, scale_term=True, num_gaussians_total=40))[1] == {}
    )


def test_splatfacto_field_it_ignores_itself_is_refused_by_name() -> None:
    """docs/parity.md: the one refused field is one splatfacto ignores too (gsplat splits in two)."""
    with pytest.raises(ValueError, match="--pipeline.model.n-split-samples"):
        DistSplatModelConfig(n_split_samples=3)


def test_options_refused_before_issue_29_are_accepted_float64_adjustments_included() -> None:
    from nerfstudio.cameras.camera_optimizers import CameraOptimizerConfig

    DistSplatModelConfig(output_depth_during_training=True, color_corrected_metrics=True)
    for mode in ("off", "SO3xR3", "SE3"):
        DistSplatModelConfig(camera_optimizer=CameraOptimizerConfig(mode=mode))
    model = make_model(1, num_points=40, param_dtype="float64", camera_optimizer=CameraOptimizerConfig(mode="SO3xR3"))
    assert (
        model.camera_optimizer.pose_adjustment.dtype == torch.float64
        and model.camera_optimizer.pose_adjustment.shape == (8, 6)
    )


def test_bilateral_grid_is_a_model_parameter_in_the_float64_mode() -> None:
    model = make_model(1, num_points=20, use_bilateral_grid=True, grid_shape=(4, 4, 2), param_dtype="float64")
    assert model.bil_grids.grids.shape[0] == 8 and model.bil_grids.grids.dtype == torch.float64
    assert "bilateral_grid" in model.get_param_groups()
    assert "bil_grids.grids" in model.state_dict()
