"""Splatfacto's L1 + SSIM loss, split exactly over image bands.

The SSIM equals pytorch_msssim's but returns the per-position map, so that a band owns a range of
SSIM rows (rendering 10 halo rows below its own); summed over the bands of an image, the band losses
equal the whole-image loss. The window, the halo rule and images under 11 px: docs/distributed.md,
"A step", item 4.

Shape letters: H, W pixels; D channels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SSIM_WINDOW = 11
SSIM_HALO_ROWS = SSIM_WINDOW - 1
_SSIM_SIGMA = 1.5
_K1, _K2 = 0.01, 0.03


_WINDOWS: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}


def _gauss_window(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """The 11-tap Gaussian window, built once per device and dtype (it is a constant)."""
    key = (torch.device(device), dtype)
    win = _WINDOWS.get(key)
    if win is None:
        coords = torch.arange(SSIM_WINDOW, dtype=dtype, device=device) - SSIM_WINDOW // 2
        g = torch.exp(-(coords**2) / (2 * _SSIM_SIGMA**2))
        win = _WINDOWS[key] = g / g.sum()
    return win


def ssim_halo(size_px: int) -> int:
    """Map positions an image dimension of ``size_px`` loses to "valid" filtering: 10, or 0 when
    the dimension is under the window and is not filtered (pytorch_msssim's rule)."""
    return SSIM_HALO_ROWS if size_px >= SSIM_WINDOW else 0


def _filter(x: torch.Tensor, win: torch.Tensor, filter_rows: bool) -> torch.Tensor:
    d = x.shape[1]
    out = x
    if filter_rows:
        out = F.conv2d(out, win.view(1, 1, SSIM_WINDOW, 1).expand(d, 1, SSIM_WINDOW, 1), groups=d)
    if ssim_halo(x.shape[3]):
        out = F.conv2d(out, win.view(1, 1, 1, SSIM_WINDOW).expand(d, 1, 1, SSIM_WINDOW), groups=d)
    return out


def ssim_map(
    x: torch.Tensor, y: torch.Tensor, data_range: float = 1.0, image_height: int | None = None
) -> torch.Tensor:
    """SSIM per position and channel, "valid" filtering.

    Args:
        x: Image, or a band of rows of one. `[H, W, D]`, float in [0, data_range].
        y: Image. `[H, W, D]`, same dtype.
        image_height: Height of the whole image ``x`` is a band of (default: ``x``'s). Under 11 px
            the rows are not filtered, as pytorch_msssim does; the columns likewise under 11 px wide.

    Returns:
        The SSIM map. `[D, H - ssim_halo(image_height), W - ssim_halo(W)]`.

    **Differentiable:** with respect to both inputs.
    """
    if x.shape != y.shape:
        raise ValueError(f"ssim_map: x and y must have the same shape, got {tuple(x.shape)} and {tuple(y.shape)}")
    filter_rows = ssim_halo(x.shape[0] if image_height is None else image_height) > 0
    if filter_rows and x.shape[0] < SSIM_WINDOW:
        raise ValueError(
            f"ssim_map: a band of an image {image_height} px high needs at least {SSIM_WINDOW} rows, got {x.shape[0]}"
        )
    xb = x.permute(2, 0, 1)[None]
    yb = y.permute(2, 0, 1)[None]
    win = _gauss_window(x.device, x.dtype)
    c1 = (_K1 * data_range) ** 2
    c2 = (_K2 * data_range) ** 2
    mu1, mu2 = _filter(xb, win, filter_rows), _filter(yb, win, filter_rows)
    mu1_sq, mu2_sq, mu1_mu2 = mu1.pow(2), mu2.pow(2), mu1 * mu2
    sigma1_sq = _filter(xb * xb, win, filter_rows) - mu1_sq
    sigma2_sq = _filter(yb * yb, win, filter_rows) - mu2_sq
    sigma12 = _filter(xb * yb, win, filter_rows) - mu1_mu2
    cs = (2 * sigma12 + c2) / (sigma1_sq + sigma2_sq + c2)
    return (((2 * mu1_mu2 + c1) / (mu1_sq + mu2_sq + c1)) * cs)[0]


def halo_end_row(end_row: int, height: int) -> int:
    """The last (exclusive) row a band owning rows ``[.., end_row)`` must render for exact SSIM."""
    return min(end_row + ssim_halo(height), height)


def band_loss(
    pred: torch.Tensor,
    gt: torch.Tensor,
    first_row: int,
    end_row: int,
    height: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One band's share of splatfacto's per-image loss ``(1 - l) L1 + l (1 - SSIM)``.

    Args:
        pred: Rendered rows ``[first_row, halo_end_row(end_row, height))``. `[h, W, 3]`.
        gt: Ground truth for the same rows. `[h, W, 3]`.
        first_row: First image row the band owns.
        end_row: One past the last image row the band owns.
        height: Image height H (at the resolution rendered).

    Returns:
        ``(l1_share, ssim_share)``: the band's shares of the mean absolute error and of
        ``1 - SSIM`` of the whole image. Summed over a partition of ``[0, H)`` into bands, they
        equal the whole image's L1 and ``1 - SSIM``.

    **Differentiable:** with respect to ``pred``.
    """
    h_total = halo_end_row(end_row, height) - first_row
    if pred.shape[0] != h_total or gt.shape != pred.shape:
        raise ValueError(
            f"band_loss: expected {h_total} rendered rows (band [{first_row}, {end_row}) plus SSIM halo), "
            f"got pred {tuple(pred.shape)} and gt {tuple(gt.shape)}"
        )
    width = pred.shape[1]
    channels = pred.shape[2]
    own = end_row - first_row
    l1 = (gt[:own] - pred[:own]).abs().sum() / (height * width * channels)
    own_ssim_rows = max(0, min(end_row, height - ssim_halo(height)) - first_row)
    if own_ssim_rows == 0:
        ssim_part = pred.new_zeros(())
    else:
        smap = ssim_map(gt, pred, image_height=height)
        count = channels * (height - ssim_halo(height)) * (width - ssim_halo(width))
        owned = smap[:, :own_ssim_rows]
        ssim_part = (owned.numel() - owned.sum()) / count
    return l1, ssim_part
