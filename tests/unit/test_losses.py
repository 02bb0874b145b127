"""The band loss: SSIM equal to pytorch_msssim's, and band shares summing to the whole-image loss."""

from __future__ import annotations

import itertools

import pytest
import torch
from pytorch_msssim import SSIM

from distsplat_ns.model.losses import band_loss, halo_end_row, ssim_map


def _images(seed: int, height: int = 45, width: int = 37) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    gt = torch.rand(height, width, 3, generator=gen, dtype=torch.float64)
    pred = (gt + 0.2 * torch.rand(height, width, 3, generator=gen, dtype=torch.float64)).clamp(0, 1)
    return gt, pred


def test_ssim_map_mean_equals_pytorch_msssim() -> None:
    gt, pred = _images(0)
    reference = SSIM(data_range=1.0, size_average=True, channel=3)(
        gt.permute(2, 0, 1)[None], pred.permute(2, 0, 1)[None]
    )
    # float64 on both sides: the only difference is summation order (1e-12 is far above float64 rounding).
    assert torch.allclose(ssim_map(gt, pred).mean(), reference, atol=1e-12)


@pytest.mark.parametrize(
    "cuts", [[0, 45], [0, 16, 45], [0, 16, 32, 45], [0, 7, 8, 40, 45], [0, 36, 45], [0, 1, 44, 45]]
)
def test_band_shares_sum_to_whole_image_loss(cuts: list[int]) -> None:
    gt, pred = _images(1)
    height = gt.shape[0]
    whole_l1, whole_ssim = band_loss(pred, gt, 0, height, height)
    l1_sum = torch.zeros((), dtype=torch.float64)
    ssim_sum = torch.zeros((), dtype=torch.float64)
    for first, end in itertools.pairwise(cuts):
        stop = halo_end_row(end, height)
        l1, dssim = band_loss(pred[first:stop], gt[first:stop], first, end, height)
        l1_sum, ssim_sum = l1_sum + l1, ssim_sum + dssim
    # float64: only summation order differs.
    assert torch.allclose(l1_sum, whole_l1, rtol=1e-12)
    assert torch.allclose(ssim_sum, whole_ssim, rtol=1e-12)


def test_whole_image_band_loss_is_splatfactos_loss_terms() -> None:
    gt, pred = _images(2)
    l1, dssim = band_loss(pred, gt, 0, gt.shape[0], gt.shape[0])
    reference_ssim = SSIM(data_range=1.0, size_average=True, channel=3)(
        gt.permute(2, 0, 1)[None], pred.permute(2, 0, 1)[None]
    )
    assert torch.allclose(l1, (gt - pred).abs().mean(), rtol=1e-12)
    assert torch.allclose(dssim, 1 - reference_ssim, rtol=1e-10)


def test_band_gradients_sum_to_whole_image_gradient() -> None:
    gt, pred = _images(3)
    height = gt.shape[0]
    whole = pred.clone().requires_grad_(True)
    l1, dssim = band_loss(whole, gt, 0, height, height)
    (0.8 * l1 + 0.2 * dssim).backward()
    banded = pred.clone().requires_grad_(True)
    total = torch.zeros((), dtype=torch.float64)
    for first, end in [(0, 16), (16, 30), (30, height)]:
        stop = halo_end_row(end, height)
        l1, dssim = band_loss(banded[first:stop], gt[first:stop], first, end, height)
        total = total + 0.8 * l1 + 0.2 * dssim
    total.backward()
    assert torch.allclose(banded.grad, whole.grad, rtol=1e-10, atol=1e-14)


def test_band_loss_rejects_missing_halo_rows() -> None:
    gt, pred = _images(4)
    with pytest.raises(ValueError, match="halo"):
        band_loss(pred[0:16], gt[0:16], 0, 16, gt.shape[0])


def _msssim_dssim(gt: torch.Tensor, pred: torch.Tensor) -> torch.Tensor:
    """splatfacto's ``1 - SSIM`` term, through pytorch_msssim exactly as splatfacto calls it (it
    warns that it skips the smoothing of a dimension under the window, and trains on)."""
    with pytest.warns(UserWarning, match="Skipping Gaussian Smoothing"):
        return 1 - SSIM(data_range=1.0, size_average=True, channel=3)(
            gt.permute(2, 0, 1)[None], pred.permute(2, 0, 1)[None]
        )


@pytest.mark.parametrize(("height", "width"), [(10, 15), (15, 10), (9, 14), (4, 4), (2, 30)])
def test_tiny_image_loss_is_splatfactos(height: int, width: int) -> None:
    """An image under the SSIM window (10 x 15: lund_door's 1/4 warm-up renders 14 x 9) gets
    pytorch_msssim's value, as splatfacto does, instead of an error (issue 25)."""
    gt, pred = _images(5, height, width)
    l1, dssim = band_loss(pred, gt, 0, height, height)
    # float64 on both sides: only summation order differs.
    assert torch.allclose(dssim, _msssim_dssim(gt, pred), rtol=1e-10)
    assert torch.allclose(l1, (gt - pred).abs().mean(), rtol=1e-12)


@pytest.mark.parametrize(
    ("height", "cuts"), [(10, [0, 3, 10]), (10, [0, 1, 2, 9, 10]), (9, [0, 4, 9]), (15, [0, 3, 15])]
)
def test_tiny_image_band_shares_sum_to_splatfactos_loss(height: int, cuts: list[int]) -> None:
    """Bands of an image under the window own their own map rows (no halo) and still sum to the
    whole image's loss, with gradients; 15 rows checks a short image that is filtered (halo 10)."""
    gt, pred = _images(6, height, 15)
    whole = pred.clone().requires_grad_(True)
    l1, dssim = band_loss(whole, gt, 0, height, height)
    (0.8 * l1 + 0.2 * dssim).backward()
    banded = pred.clone().requires_grad_(True)
    total_dssim = torch.zeros((), dtype=torch.float64)
    total = torch.zeros((), dtype=torch.float64)
    for first, end in itertools.pairwise(cuts):
        stop = halo_end_row(end, height)
        band_l1, band_dssim = band_loss(banded[first:stop], gt[first:stop], first, end, height)
        total_dssim = total_dssim + band_dssim
        total = total + 0.8 * band_l1 + 0.2 * band_dssim
    total.backward()
    # float64: only summation order differs.
    assert torch.allclose(total_dssim, dssim.detach(), rtol=1e-12)
    assert torch.allclose(banded.grad, whole.grad, rtol=1e-10, atol=1e-14)
    if height < 11:
        assert torch.allclose(dssim, _msssim_dssim(gt, pred), rtol=1e-10)
