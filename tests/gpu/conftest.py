"""Where tests/gpu's gsplat parity tests run: on a CUDA device, gsplat's kernels (scripts/gpu_check.sh,
``pytest -m cuda``); without one, the same tests and assertions on CPU tensors with gsplat's CUDA
entry points on its PyTorch references (tests/helpers/gsplat_cpu.py; docs/gsplat_on_cpu.md, "What
runs on both versions"). Tests that only mean something on CUDA (streams, pinned memory, NCCL, host
syncs) keep their own ``skipif``.

tests/gpu has no ``__init__.py`` (a lease's environment can shadow ``tests``: test_gsplat_parity.py),
so the CPU helpers are imported only where there is no CUDA device, where the suite's own ``tests``
package is on the path.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import torch


@contextlib.contextmanager
def gsplat_on_cpu() -> Iterator[None]:
    """gsplat's CUDA entry points on its PyTorch references, and ``backend="gsplat"`` allowed for CPU
    tensors: ``rendering/api.py:resolve_backend`` refuses it there because gsplat's kernels are
    CUDA's (``tests/integration/test_train.py`` holds that refusal for users), which under the shim
    they are not. Patched at each module that calls it by name."""
    from distsplat_ns.rendering import api, gsplat_compat
    from tests.helpers import gsplat_cpu

    original = api.resolve_backend

    def resolve_on_cpu(backend: str, device: torch.device) -> str:
        if backend == "gsplat" and device.type == "cpu":
            return "gsplat"
        return original(backend, device)

    with gsplat_cpu.installed(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(api, "resolve_backend", resolve_on_cpu)
        patch.setattr(gsplat_compat, "resolve_backend", resolve_on_cpu)
        yield


@pytest.fixture
def device() -> Iterator[str]:
    """``"cuda"`` on a GPU (gsplat's kernels, as on a lease); else ``"cpu"`` under :func:`gsplat_on_cpu`."""
    if torch.cuda.is_available():
        yield "cuda"
        return
    with gsplat_on_cpu():
        yield "cpu"


@pytest.fixture
def cuda_device() -> Iterator[str]:
    """``"cuda"``: the GPU, or without one the device stand-in (tests/helpers/device_standin.py, which
    turns the gsplat shim on), for code that takes gsplat's path only on a CUDA tensor
    (``gaussians/mcmc_relocation.py:relocation_opacity_scale``)."""
    if torch.cuda.is_available():
        yield "cuda"
        return
    from tests.helpers import device_standin

    with device_standin.installed():
        yield "cuda"
