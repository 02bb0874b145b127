"""Backend and device choice of ``init_distributed`` (pure functions; CUDA counts faked)."""

from __future__ import annotations

import pytest
import torch

from distsplat_ns.distributed import context


@pytest.fixture
def one_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


def test_auto_picks_gloo_on_cpu() -> None:
    assert context.auto_backend("cpu", 4) == "gloo"


def test_auto_picks_nccl_with_a_gpu_per_rank(one_gpu: None) -> None:
    assert context.auto_backend("cuda", 1) == "nccl"
    assert context.auto_backend("cuda", None) == "nccl"


def test_auto_picks_gloo_when_ranks_share_a_gpu(one_gpu: None) -> None:
    # NCCL refuses two ranks on one device; torchrun --nproc_per_node 2 on one GPU must still run.
    assert context.auto_backend("cuda", 2) == "gloo"


def test_ranks_beyond_the_gpu_count_share_round_robin(one_gpu: None) -> None:
    assert [context._device_index(r) for r in range(3)] == [0, 0, 0]


def test_bad_backend_is_named() -> None:
    with pytest.raises(ValueError, match="--dist-backend"):
        context.init_distributed("cpu", backend="mpi")


def test_nccl_on_cpu_is_refused() -> None:
    with pytest.raises(ValueError, match="needs --machine.device-type cuda"):
        context.init_distributed("cpu", backend="nccl")
