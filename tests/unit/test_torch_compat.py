"""distributed/torch_compat.py: each shim's old-torch branch is tested on every torch, against the
new API where this torch has it, and no other module tests torch's version by itself."""

from __future__ import annotations

import ast
import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner

from distsplat_ns.distributed import torch_compat
from distsplat_ns.distributed.torch_compat import (
    _WRITTEN,
    _has_key_by_counter,
    _inf_norm_per_tensor,
    grads_inf_norm,
    nonzero_of_size,
    planner_kwargs,
    post_accumulate_grad_hook,
    store_has_key,
    store_set,
    store_set_first,
)

PKG = Path(__file__).resolve().parents[2] / "distsplat_ns"


def _stores(tmp_path: Path) -> list[dist.Store]:
    tcp = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    return [tcp, dist.PrefixStore("distsplat/", tcp), dist.HashStore(), dist.FileStore(str(tmp_path / "store"), 1)]


@pytest.fixture(params=["installed", "before-2.3"])
def old_store_api(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test on this torch's store API, and on the one before torch 2.3 (no ``Store.check``)."""
    if request.param == "before-2.3" and hasattr(dist.Store, "check"):
        monkeypatch.delattr(dist.Store, "check")
    return request.param


def test_store_has_key_sees_keys_store_set_wrote_and_never_creates_them(tmp_path: Path, old_store_api: str) -> None:
    for store in _stores(tmp_path):
        assert not store_has_key(store, "phase/0")
        with pytest.raises(RuntimeError):  # the probe did not create the key a wait would return on
            store.wait(["phase/0"], datetime.timedelta(milliseconds=50))
        store_set(store, "phase/0", "started")
        assert store_has_key(store, "phase/0")
        store_set(store, "empty", "")
        assert store_has_key(store, "empty")
        assert store.get("phase/0") == b"started"


def test_store_has_key_agrees_with_store_check_where_torch_has_it(tmp_path: Path) -> None:
    if not hasattr(dist.Store, "check"):
        pytest.skip(
            f"torch {torch.__version__} has no Store.check (added in torch 2.3): the other tests cover the fallback"
        )
    for store in _stores(tmp_path):
        store.set("a", "1")
        store.add("a" + _WRITTEN, 1)  # what store_set writes before torch 2.3
        for key in ("a", "b"):
            assert _has_key_by_counter(store, key) == store.check([key])


def test_store_set_first_lets_only_the_first_writer_set(tmp_path: Path, old_store_api: str) -> None:
    for store in _stores(tmp_path):
        assert store_set_first(store, "abort", "rank 1: out of memory")
        assert not store_set_first(store, "abort", "rank 0: lost rank 1")
        assert store.get("abort") == b"rank 1: out of memory" and store_has_key(store, "abort")


GIL_PROBE = """
import sys, threading, time
import torch.distributed as dist
if sys.argv[1] == "before-2.3" and hasattr(dist.Store, "check"):
    del dist.Store.check
from distsplat_ns.distributed.torch_compat import store_has_key, store_set, store_set_first
store = dist.TCPStore("127.0.0.1", 0, 1, True)
stop = []
def poll():
    while not stop:
        store_set(store, "where/0", "in 'first step'")
        store_has_key(store, "where/0"), store_has_key(store, "absent"), store_set_first(store, "abort", "x")
thread = threading.Thread(target=poll, daemon=True)
thread.start()
end = time.monotonic() + 2
while time.monotonic() < end:
    garbage = [str(i) * 3 for i in range(1000)]
stop.append(1)
thread.join()
print("clean")
"""


@pytest.mark.parametrize("api", ["installed", "before-2.3"])
def test_store_calls_from_a_thread_hold_the_gil(api: str) -> None:
    # Python's debug allocator aborts a process that allocates without the GIL: torch 2.1.2's
    # compare_set did, from the abort watch's thread, and corrupted ranks' heaps (CI, 2026-12-02).
    env = {**os.environ, "PYTHONMALLOC": "debug"}
    proc = subprocess.run(
        [sys.executable, "-c", GIL_PROBE, api], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert proc.returncode == 0 and "clean" in proc.stdout, proc.stderr[-3000:]


@pytest.mark.parametrize("norm", [grads_inf_norm, _inf_norm_per_tensor], ids=["installed", "before-2.6"])
def test_inf_norm_is_the_largest_magnitude_and_propagates_nan_and_inf(norm) -> None:
    grads = [torch.tensor([0.5, -3.0]), torch.tensor([[2.0]]), torch.tensor([1e300, -2e300], dtype=torch.float64)]
    assert norm(grads).item() == 2e300  # a finite float64 norm stays finite (no float32 overflow)
    assert norm(grads[:2]).item() == 3.0
    assert torch.isnan(norm([torch.tensor([1.0, float("nan")]), torch.tensor([2.0])]))
    assert not torch.isfinite(norm([torch.tensor([1.0]), torch.tensor([-float("inf")])]))


def test_planner_kwargs_drops_only_the_keywords_an_older_planner_lacks() -> None:
    save = planner_kwargs(DefaultSavePlanner, flatten_state_dict=False, dedup_save_to_lowest_rank=False)
    load = planner_kwargs(DefaultLoadPlanner, flatten_state_dict=False, allow_partial_load=True)
    DefaultSavePlanner(**save)
    DefaultLoadPlanner(**load)
    assert save["flatten_state_dict"] is False and load["flatten_state_dict"] is False
    newer = "allow_partial_load" in DefaultLoadPlanner.__init__.__code__.co_varnames
    assert ("allow_partial_load" in load) == newer
    with pytest.raises(TypeError):  # a keyword no torch knows is passed on, so a typo fails loudly
        DefaultLoadPlanner(**planner_kwargs(DefaultLoadPlanner, alow_partial_load=True))


def _version_tests(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("hasattr", "getattr")
            and node.args
        ):
            target = ast.unparse(node.args[0])
            if target.split(".")[0] in ("torch", "dist", "dcp") and not (
                node.func.id == "getattr" and target == "torch"
            ):
                found.append(f"{path.relative_to(PKG)}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Attribute) and node.attr == "__version__" and ast.unparse(node.value) == "torch":
            found.append(f"{path.relative_to(PKG)}:{node.lineno}: torch.__version__")
    return found


def test_only_torch_compat_tests_torch_versions() -> None:
    """``getattr(torch, name)`` of a dtype name is allowed; a probe of an API is not."""
    found = [
        hit for path in sorted(PKG.rglob("*.py")) if path.name != "torch_compat.py" for hit in _version_tests(path)
    ]
    assert not found, "version probes outside distributed/torch_compat.py:\n" + "\n".join(found)
    assert _version_tests(PKG / "distributed" / "torch_compat.py"), (
        "the scan finds nothing even in torch_compat.py: it is broken"
    )


def test_post_accumulate_grad_hook_fires_once_per_backward_after_the_accumulation() -> None:
    p = torch.nn.Parameter(torch.ones(3))
    seen = []
    handle = post_accumulate_grad_hook(p, lambda q: seen.append(q.grad.clone()))
    assert handle is not None, f"torch {torch.__version__} has Tensor.register_post_accumulate_grad_hook (since 2.1)"
    (p * 2 + p * 3).sum().backward()  # two uses, one accumulation
    (p * 4).sum().backward()
    handle.remove()
    (p * 4).sum().backward()
    assert [g.tolist() for g in seen] == [[5.0] * 3, [9.0] * 3]


def test_post_accumulate_grad_hook_is_none_where_torch_lacks_it() -> None:
    class OldTensor:  # what a torch without the hook offers
        pass

    assert post_accumulate_grad_hook(OldTensor(), lambda q: None) is None


@pytest.mark.parametrize("static", ["installed", "missing", "not-on-this-device"])
def test_nonzero_of_size_is_nonzero_with_or_without_nonzero_static(
    static: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where torch lacks ``nonzero_static`` (or has no kernel for the device: CUDA before 2.6) the
    shim falls back to ``nonzero`` and remembers; either way the rows are ``nonzero``'s, in order."""
    monkeypatch.setattr(torch_compat, "_NO_NONZERO_STATIC", set())
    if static == "missing":
        monkeypatch.delattr(torch, "nonzero_static", raising=False)
    elif static == "not-on-this-device":

        def no_kernel(mask, size):
            raise NotImplementedError("Could not run 'aten::nonzero_static' with arguments from the 'CUDA' backend")

        monkeypatch.setattr(torch, "nonzero_static", no_kernel)
    gen = torch.Generator().manual_seed(0)
    masks = [
        torch.rand(5, 300, generator=gen) < 0.3,
        torch.zeros(3, 7, dtype=torch.bool),
        torch.ones(4, dtype=torch.bool),
    ]
    for mask in masks:
        got = nonzero_of_size(mask, int(mask.sum()))
        assert got.dtype == torch.int64 and torch.equal(got, torch.nonzero(mask))
    assert torch_compat._NO_NONZERO_STATIC == (set() if static == "installed" else {"cpu"})
    if static != "installed":
        with pytest.raises(ValueError, match="holds 4 nonzero elements, not 3"):
            nonzero_of_size(masks[2], 3)
