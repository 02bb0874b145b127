"""The CUDA path end to end at small scale: a training step on gsplat's kernels against the
reference on the same data, and collectives on CUDA tensors (NCCL, and gloo sharing one GPU).

The training step's parity runs without a GPU too, on CPU tensors with gsplat's CUDA entry points on
its PyTorch references (tests/gpu/conftest.py: ``device``); the rest checks what only CUDA has.
"""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.utils.cameras import BatchCameras
from tests.helpers import rank_fns
from tests.helpers.model_factory import HEIGHT, make_cameras, make_images, make_model
from tests.helpers.multiproc import run_ranks

pytestmark = pytest.mark.cuda
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _step_grads(backend: str, device: str) -> dict:
    from distsplat_ns.balance.bands import TILE_SIZE, Band
    from distsplat_ns.model.band_backward import backward_bands
    from distsplat_ns.model.band_render import RegularizerShare

    model = make_model(2, rendering_backend=backend).to(device)
    cameras = make_cameras(2)
    images = make_images(2)
    tile_rows = -(-HEIGHT // TILE_SIZE)
    bands = [Band(0, 0, tile_rows), Band(1, 0, 1), Band(1, 1, tile_rows)]  # tile rows: pixel rows 0-16-48
    result = model.forward_bands(
        BatchCameras.of(cameras.to(device)),
        [0, 1],
        images,
        [None, None],
        bands,
        step=5,
        regularizers=RegularizerShare(True, True, model.num_points),
    )
    backward_bands(result.loss, result.pixel_links, lambda msgs: [msgs])
    return {n: p.grad.detach().cpu() for n, p in model.named_parameters() if p.grad is not None and p.numel()}


def test_training_step_on_gsplat_matches_reference(device: str) -> None:
    gsplat = _step_grads("gsplat", device)
    reference = _step_grads("reference", "cpu")
    for name, ref in reference.items():
        # float32 on different kernels (sorting, atomics in gsplat's backward): 1e-3 relative to the
        # largest entry, the gradient tolerance for parity with gsplat.
        scale = ref.abs().max().clamp_min(1e-12)
        assert (gsplat[name] - ref).abs().max() / scale <= 1e-3, name


def _refined(device: str) -> dict[str, torch.Tensor]:
    """One refine event (duplicate, split, prune) of a model built on the CPU and moved to
    ``device``, as the trainer does; its rows back on the CPU."""
    from distsplat_ns.gaussians.densifier import gather_local
    from distsplat_ns.gaussians.strategy import batch_info
    from tests.helpers.model_factory import WIDTH

    model = make_model(batch_size=1, num_points=200).to(device)
    with torch.no_grad():
        model.gauss_params["scales"][:60] = -6.0  # small: duplicated; the rest split where the gradient is large
        model.gauss_params["opacities"][:20] = -5.0  # sigmoid(-5) < cull_alpha_thresh: pruned
    optimizers = {k: torch.optim.Adam([p], lr=1e-3) for k, p in model.gauss_params.items()}
    gen = torch.Generator().manual_seed(3)
    n = model.num_points
    grads = (2e-4 * torch.randn(1, n, 2, generator=gen)).to(device)
    radii = torch.randint(0, 4, (1, n), generator=gen, dtype=torch.int32).to(device)
    schedule = model.densifier.schedule
    step = schedule.refine_start_iter + schedule.refine_every
    step += -step % schedule.refine_every
    model.densifier.after_optimizer(
        model.rows.bound(optimizers), step, batch_info(grads, grads.abs(), radii, WIDTH, HEIGHT), gather_local
    )
    return {key: value.cpu() for key, value in model.rows.tensors().items() if value is not None}


@needs_cuda  # a model moved to CUDA (the stand-in's version: tests/multiproc/test_standin_training.py)
def test_refinement_of_a_model_moved_to_cuda_equals_the_cpus() -> None:
    # The first CUDA run (benchmarks/results/gpu_check_2026-12-04) crashed here: ids made on the CPU
    # stayed there after model.to("cuda"). Same decisions and ids on both; the children's offsets are
    # float32 element-wise on other hardware (FMA contraction): 1e-5 relative.
    cuda, cpu = _refined("cuda"), _refined("cpu")
    assert cuda.keys() == cpu.keys()
    assert torch.equal(cuda["state.gauss_ids"], cpu["state.gauss_ids"])
    assert cpu["state.gauss_ids"].numel() != 200, "the event must change the rows"
    for key, want in cpu.items():
        torch.testing.assert_close(cuda[key], want, rtol=1e-5, atol=1e-6, msg=lambda m, key=key: f"{key}: {m}")


@needs_cuda  # host syncs exist only on CUDA (set_sync_debug_mode)
def test_a_training_steps_cameras_and_backgrounds_reach_the_gpu_without_a_sync() -> None:
    # The audit after the first CUDA run: the cameras' fields, K and every background were blocking
    # copies, each waiting for the GPU's queue, on every step (utils/host_to_device.py).
    from distsplat_ns.model.camera_adjust import with_train_camera_ids

    model = make_model(2, background_color="random").to("cuda")
    cameras = with_train_camera_ids(make_cameras(2), [0, 1])  # host-side, as the training step passes them
    want = make_model(2, background_color="random").render_inputs(cameras, 2)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        inputs = model.render_inputs(cameras, 2)
        background = model.training_background(step=3, position=1)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert background.device.type == "cuda" and inputs.sizes_px == want.sizes_px
    # K is made on the host in both; the view matrices' 3x3 product runs on another BLAS (float32 ulps).
    torch.testing.assert_close(inputs.Ks.cpu(), want.Ks, rtol=0, atol=0)
    torch.testing.assert_close(inputs.viewmats.cpu(), want.viewmats, rtol=1e-6, atol=1e-6)


@needs_cuda  # NCCL
def test_nccl_sums_gradients_on_one_gpu() -> None:
    (grads,) = run_ranks(rank_fns.cuda_sum_gradients, 1, device_type="cuda", backend="nccl")
    assert torch.equal(grads[0], torch.full((7,), 1.0))


@needs_cuda  # gloo staging real CUDA tensors through host memory
def test_gloo_sums_cuda_gradients_of_two_ranks_sharing_one_gpu() -> None:
    results = run_ranks(rank_fns.cuda_sum_gradients, 2, device_type="cuda", backend="gloo")
    for grads in results:
        assert torch.equal(grads[0], torch.full((7,), 3.0))
        assert torch.equal(grads[1], torch.full((3, 5), 6.0))
