"""The CPU stand-in for the CUDA device (tests/helpers/device_standin.py) refuses what CUDA refuses,
allows what CUDA allows, and counts the host-to-device copies that would block (issue 53)."""

from __future__ import annotations

import pytest
import torch

from tests.helpers.device_standin import INDEX_MESSAGE, DeviceTensor, StandinDeviceError, installed


@pytest.fixture
def standin():
    with installed() as counter:
        counter.in_step, counter.blocking_in_steps = True, type(counter.blocking_in_steps)()
        yield counter
        counter.in_step = False


def test_tensors_made_on_cuda_are_device_tensors_with_their_values(standin) -> None:
    made = [
        torch.zeros(3, device="cuda"),
        torch.arange(4, device=torch.device("cuda")),
        torch.tensor([1.0, 2.0], device="cuda"),
        torch.ones(2).to("cuda"),
    ]
    assert all(isinstance(t, DeviceTensor) and t.device == torch.device("cuda", 0) and t.is_cuda for t in made)
    assert made[2].cpu().tolist() == [1.0, 2.0] and not isinstance(made[2].cpu(), DeviceTensor)


def test_host_tensor_indexed_by_a_device_mask_fails_with_cudas_message_and_the_place(standin) -> None:
    ids = torch.arange(5)  # made on the host, as the Gaussians' ids were at e5e3934
    mask = torch.zeros(5, dtype=torch.bool, device="cuda")
    with pytest.raises(
        StandinDeviceError, match=r"indices should be either on cpu or on the same device as the indexed tensor \(cpu\)"
    ) as err:
        ids[mask]
    assert INDEX_MESSAGE in str(err.value) and "test_device_standin.py" in str(err.value)


def test_device_tensor_indexed_by_host_indices_is_allowed_as_on_cuda(standin) -> None:
    values = torch.arange(5, device="cuda") * 10
    picked = values[torch.tensor([1, 3])]
    assert isinstance(picked, DeviceTensor) and picked.tolist() == [10, 30]


def test_device_tensor_beside_a_non_scalar_host_tensor_fails(standin) -> None:
    with pytest.raises(StandinDeviceError, match="Expected all tensors to be on the same device"):
        torch.ones(3, device="cuda") + torch.ones(3)


def test_zero_dim_host_tensor_is_a_scalar_a_device_kernel_accepts(standin) -> None:
    out = torch.ones(3, device="cuda") * torch.tensor(2.0)
    assert isinstance(out, DeviceTensor) and out.tolist() == [2.0, 2.0, 2.0]


def test_gradients_of_device_parameters_are_device_tensors(standin) -> None:
    param = torch.nn.Parameter(torch.tensor([1.0, 2.0]).to("cuda"))
    loss = (torch.where(param > 1.5, param, 0.0) * 3.0).sum()
    loss.backward()
    assert isinstance(param.grad, DeviceTensor) and param.grad.tolist() == [0.0, 3.0]


def test_module_to_cuda_makes_its_parameters_device_tensors(standin) -> None:
    layer = torch.nn.Linear(2, 1).to(torch.device("cuda"))
    assert all(isinstance(p, DeviceTensor) for p in layer.parameters())
    assert isinstance(layer(torch.ones(1, 2, device="cuda")), DeviceTensor)


def test_copy_from_pageable_memory_is_counted_and_from_pinned_non_blocking_is_not(standin) -> None:
    torch.ones(4).to("cuda", non_blocking=True)  # pageable: CUDA stages it and waits
    torch.ones(4).pin_memory().to("cuda", non_blocking=True)
    torch.ones(4).pin_memory().to("cuda")  # pinned but blocking
    assert sum(standin.blocking_in_steps.values()) == 2


def test_device_tensor_to_numpy_fails_as_on_cuda(standin) -> None:
    with pytest.raises(StandinDeviceError, match="can't convert cuda:0 device type tensor to numpy"):
        torch.ones(2, device="cuda").numpy()


def test_nothing_is_left_patched_after_the_standin() -> None:
    with installed():
        assert torch.cuda.is_available()
    assert not isinstance(torch.zeros(1), DeviceTensor)
    assert torch.Tensor.to is torch._C.TensorBase.to if hasattr(torch._C, "TensorBase") else True
