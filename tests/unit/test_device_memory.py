"""The device stand-in's allocator (tests/helpers/device_memory.py) counts live device bytes per storage:
views and in-place results once, freed storage released, autograd's saved tensors while saved, and
torch.cuda's memory functions answer from it."""

from __future__ import annotations

import gc
import threading

import pytest
import torch

from tests.helpers import device_memory
from tests.helpers.device_standin import installed


@pytest.fixture
def standin(monkeypatch):
    monkeypatch.setenv(device_memory.TOTAL_MEMORY_ENV, str(1 << 30))
    with installed() as counter:
        gc.collect()
        torch.cuda.reset_peak_memory_stats()
        yield counter


def test_views_and_in_place_results_count_their_storage_once(standin) -> None:
    before = torch.cuda.memory_allocated()
    a = torch.zeros(1000, device="cuda")  # 4,000 B of float32
    views = [a[10:20], a.view(10, 100), a.add_(1.0), a.unsqueeze(0)]
    assert torch.cuda.memory_allocated() - before == 4000
    del views
    assert torch.cuda.memory_allocated() - before == 4000


def test_freed_storage_is_released_and_the_peak_stays_until_reset(standin) -> None:
    before = torch.cuda.memory_allocated()
    a = torch.ones(256, dtype=torch.float64, device="cuda")  # 2,048 B
    b = a * 2  # a new storage: 2,048 B more
    assert torch.cuda.memory_allocated() - before == 4096
    del a, b
    gc.collect()
    assert torch.cuda.memory_allocated() == before
    assert torch.cuda.max_memory_allocated() - before == 4096
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == before


def test_autograd_saved_tensors_count_while_saved(standin) -> None:
    x = torch.ones(500, device="cuda", requires_grad=True)
    before = torch.cuda.memory_allocated()
    y = (x.exp() * x).sum()  # exp's result is saved for the product's backward
    assert torch.cuda.memory_allocated() - before >= 2000
    y.backward()  # the graph is freed: only x's gradient (2,000 B) and y stay
    gc.collect()
    assert torch.cuda.memory_allocated() - before == 2000 + 4


def test_cuda_memory_functions_answer_from_it_per_device(standin) -> None:
    on_one = torch.zeros(128, device="cuda:1")  # 512 B on device 1
    assert torch.cuda.memory_allocated(1) == 512 and torch.cuda.memory_allocated(torch.device("cuda", 1)) == 512
    free, total = torch.cuda.mem_get_info(1)
    assert total == 1 << 30 == torch.cuda.get_device_properties(1).total_memory and free == total - 512
    del on_one


def _four_thousand_bytes(device: str) -> torch.Tensor:
    return torch.zeros(1000, device=device)


def _eight_thousand_bytes(device: str) -> torch.Tensor:
    return torch.ones(2000, device=device)


def test_peak_sites_are_the_places_that_held_the_run_peak(standin, monkeypatch) -> None:
    # cuda:7, which no other test uses: its run peak starts here.
    monkeypatch.setenv(device_memory.PEAK_SITES_ENV, "1")
    kept = _four_thousand_bytes("cuda:7")
    freed = _eight_thousand_bytes("cuda:7")  # the run peak: 12,000 B
    del freed
    gc.collect()
    after = torch.ones(500, device="cuda:7")  # 2,000 B: below the peak, no new snapshot
    sites = device_memory.peak_sites()[7]
    assert device_memory.run_peak_bytes()[7] == 12_000 == sum(v[0] for v in sites.values())
    assert {place.split(" in ")[1]: v for place, v in sites.items()} == {
        "_four_thousand_bytes": [4000, 1],
        "_eight_thousand_bytes": [8000, 1],
    }
    assert all(place.startswith("test_device_memory.py:") for place in sites), sites
    del kept, after


def test_peak_sites_name_the_package_frame_that_made_the_storage(standin, monkeypatch) -> None:
    from distsplat_ns.utils.keyed_random import keyed_bits_device

    ids = torch.arange(64, device="cuda:6")  # made before the places are on: in no snapshot
    monkeypatch.setenv(device_memory.PEAK_SITES_ENV, "1")
    bits = keyed_bits_device(1, 2, ids, 4)
    sites = device_memory.peak_sites()[6]
    assert sites and all(place.startswith("distsplat_ns/utils/keyed_random.py:") for place in sites), sites
    assert sum(v[0] for v in sites.values()) == device_memory.run_peak_bytes()[6] - 64 * 8  # all but the ids
    del ids, bits


def test_a_collection_inside_the_allocators_lock_frees_without_waiting_on_it(standin, monkeypatch) -> None:
    # A garbage collection can run a device tensor's release anywhere, inside the allocator's locked
    # section too (docs/device_standin.md, "Counting"): make one collect a cycle holding a device tensor
    # there, in a thread, and require it to finish and the bytes to come back.
    before = torch.cuda.memory_allocated()

    def cyclic_device_tensor() -> None:
        cycle: list = [torch.zeros(100, device="cuda")]  # 400 B
        cycle.append(cycle)

    cyclic_device_tensor()
    assert torch.cuda.memory_allocated() - before == 400
    sites_on = device_memory._sites_on
    monkeypatch.setattr(device_memory, "_sites_on", lambda: (gc.collect(), sites_on())[1])
    # The stand-in's dispatch mode is this thread's; the worker registers a storage directly.
    worker = threading.Thread(target=lambda: device_memory.register(torch.ones(10), torch.ones(10), 0), daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "a release inside the allocator's lock waited on the lock"
    monkeypatch.setattr(device_memory, "_sites_on", sites_on)
    assert torch.cuda.memory_allocated() - before == 0  # the cycle's 400 B released, the 40 B gone with the thread
