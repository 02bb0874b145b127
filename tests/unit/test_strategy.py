"""Schedules counted in images, and the batch-size scaling rule."""

from __future__ import annotations

import math

import pytest
import torch

from distsplat_ns.gaussians.strategy import batch_info, sqrt_batch_scaling
from distsplat_ns.gaussians.strategy_schedule import schedule_in_steps
from distsplat_ns.utils.steps import images_to_steps


@pytest.mark.parametrize("batch_size", [1, 2, 4])
def test_schedule_in_steps_counts_images(batch_size: int) -> None:
    s = schedule_in_steps(
        warmup_images=500,
        stop_split_images=15000,
        refine_every_images=100,
        reset_alpha_every_refines=30,
        stop_screen_size_images=4000,
        num_train_images=12,
        batch_size=batch_size,
    )
    assert s.refine_every * batch_size == 100
    assert s.refine_start_iter * batch_size == 500
    assert s.reset_every == 30 * s.refine_every


@pytest.mark.parametrize("batch_size", [3, 6, 8, 16, 32])
def test_opacity_reset_is_the_step_nearest_its_image_count(batch_size: int) -> None:
    # 100 images per refine is not a whole number of steps at these B (96 images at B = 8 and
    # 16); the reset must still come within half a step of splatfacto's 3000 images.
    s = schedule_in_steps(
        warmup_images=500,
        stop_split_images=15000,
        refine_every_images=100,
        reset_alpha_every_refines=30,
        stop_screen_size_images=4000,
        num_train_images=12,
        batch_size=batch_size,
    )
    assert abs(s.reset_every * batch_size - 3000) <= batch_size / 2


def test_images_to_steps_rejects_zero_batch() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        images_to_steps(100, 0)


def test_sqrt_scaling_rule() -> None:
    lr, eps, betas = sqrt_batch_scaling(1e-3, 1e-15, (0.9, 0.999), 4)
    assert math.isclose(lr, 2e-3) and math.isclose(eps, 0.5e-15)
    assert math.isclose(betas[0], 0.9**4) and math.isclose(betas[1], 0.999**4)


def test_batch_info_carries_grad_and_absgrad() -> None:
    g = torch.ones(2, 5, 2)
    info = batch_info(g, 2 * g, torch.ones(2, 5, dtype=torch.int32), 16, 8)
    assert torch.equal(info["means2d"].grad, g)
    assert torch.equal(info["means2d"].absgrad, 2 * g)
    assert info["n_cameras"] == 2 and info["width"] == 16 and info["height"] == 8


def test_c2w_to_viewmat_matches_nerfstudios_conversion() -> None:
    from nerfstudio.models.splatfacto import get_viewmat

    from distsplat_ns.utils.cameras import c2w_to_viewmat

    gen = torch.Generator().manual_seed(0)
    q, _ = torch.linalg.qr(torch.randn(3, 3, 3, generator=gen))
    c2w = torch.cat([q, torch.randn(3, 3, 1, generator=gen)], dim=-1)
    expected = get_viewmat.__wrapped__(c2w) if hasattr(get_viewmat, "__wrapped__") else get_viewmat(c2w)
    assert torch.allclose(c2w_to_viewmat(c2w), expected, atol=1e-6)


def _state() -> dict:
    return {"grad2d": None, "count": None, "radii": None}


def _gsplats_info(info: dict) -> dict:
    """``info`` as the installed gsplat's strategy reads it: per-axis radii ``[C, N, 2]`` from gsplat 1.5.0."""
    import gsplat

    from distsplat_ns.rendering.gsplat_versions import parse_version

    if parse_version(gsplat.__version__) < (1, 5, 0):
        return info
    return {**info, "radii": torch.stack([info["radii"], info["radii"]], dim=-1)}


def test_batch_statistics_match_gsplats_update_for_one_camera() -> None:
    from gsplat.strategy import DefaultStrategy

    from distsplat_ns.gaussians.strategy import update_batch_statistics

    gen = torch.Generator().manual_seed(0)
    n = 50
    params = {"means": torch.zeros(n, 3)}
    grads = torch.randn(1, n, 2, generator=gen)
    radii = (torch.rand(1, n, generator=gen) * 10).to(torch.int32) * (torch.rand(1, n, generator=gen) > 0.3)
    info = batch_info(grads, grads.abs(), radii, 40, 30)
    ours, theirs = _state(), _state()
    strategy = DefaultStrategy(absgrad=True, refine_scale2d_stop_iter=100)
    update_batch_statistics(ours, info, n, absgrad=True, keep_radii=True)
    strategy._update_state(params, theirs, _gsplats_info(info))
    for key in ours:
        assert torch.equal(ours[key], theirs[key]), key


def test_batch_statistics_of_several_cameras_sum_in_gsplats_order() -> None:
    """Two batches of four cameras: the gradient-norm sums and the counts equal gsplat's
    ``_update_state`` (``index_add_`` over (camera, Gaussian) pairs, camera after camera, onto the
    running sums) to the last bit, where adding the batch's sum over cameras to the running sums
    differs in some. The radii are compared in the test below (gsplat keeps the last camera's,
    not the largest)."""
    from gsplat.strategy import DefaultStrategy

    from distsplat_ns.gaussians.strategy import update_batch_statistics

    gen = torch.Generator().manual_seed(1)
    n = 2000
    params = {"means": torch.zeros(n, 3)}
    ours, theirs = _state(), _state()
    strategy = DefaultStrategy(absgrad=True, refine_scale2d_stop_iter=100)
    for _ in range(2):
        before = None if ours["grad2d"] is None else ours["grad2d"].clone()
        grads = torch.randn(4, n, 2, generator=gen) * torch.logspace(-3, 3, n)[:, None]
        radii = (torch.rand(4, n, generator=gen) * 10).to(torch.int32) * (torch.rand(4, n, generator=gen) > 0.3)
        info = batch_info(grads, grads.abs(), radii, 40, 30)
        update_batch_statistics(ours, info, n, absgrad=True, keep_radii=True)
        strategy._update_state(params, theirs, _gsplats_info(info))
        assert torch.equal(ours["grad2d"], theirs["grad2d"]) and torch.equal(ours["count"], theirs["count"])
    norms = torch.where(radii > 0, (grads.abs() * torch.tensor([20.0 * 4, 15.0 * 4])).norm(dim=-1), 0.0)
    assert not torch.equal(ours["grad2d"], before + norms.sum(dim=0))  # the order is what the test checks


def test_batch_statistics_take_the_largest_radius_over_cameras() -> None:
    from distsplat_ns.gaussians.strategy import update_batch_statistics

    radii = torch.tensor([[4, 0, 2], [8, 3, 1]], dtype=torch.int32)
    info = batch_info(torch.ones(2, 3, 2), torch.ones(2, 3, 2), radii, 16, 16)
    state = _state()
    update_batch_statistics(state, info, 3, absgrad=True, keep_radii=True)
    assert torch.equal(state["radii"], torch.tensor([8, 3, 2]) / 16.0)
    assert torch.equal(state["count"], torch.tensor([2.0, 1.0, 2.0]))
