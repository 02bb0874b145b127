"""distributed/torch_compat.py: each shim's old-torch branch is tested on every torch, against the
new API where this torch has it, and no other module tests torch's version by itself."""

from __future__ import annotations

import ast
import datetime
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner, DefaultSavePlanner

from distsplat_ns.distributed.torch_compat import (
    _has_key_by_compare_set,
    _inf_norm_per_tensor,
    grads_inf_norm,
    planner_kwargs,
    post_accumulate_grad_hook,
    store_has_key,
)

PKG = Path(__file__).resolve().parents[2] / "distsplat_ns"


def _stores(tmp_path: Path) -> list[dist.Store]:
    tcp = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=10))
    return [tcp, dist.PrefixStore("distsplat/", tcp), dist.HashStore(), dist.FileStore(str(tmp_path / "store"), 1)]


@pytest.mark.parametrize("has_key", [store_has_key, _has_key_by_compare_set], ids=["installed", "before-2.3"])
def test_store_has_key_sees_set_keys_and_writes_nothing(tmp_path: Path, has_key) -> None:
    for store in _stores(tmp_path):
        before = store.num_keys()
        assert not has_key(store, "phase/0")
        assert store.num_keys() == before, f"{type(store).__name__}: the check wrote a key"
        store.set("phase/0", "started")
        assert has_key(store, "phase/0")
        store.set("empty", "")
        assert has_key(store, "empty")
        assert store.get("phase/0") == b"started"


def test_store_has_key_agrees_with_store_check_where_torch_has_it(tmp_path: Path) -> None:
    if not hasattr(dist.Store, "check"):
        pytest.skip(f"torch {torch.__version__} has no Store.check (added in torch 2.3): the other test covers the fallback")
    for store in _stores(tmp_path):
        store.set("a", "1")
        for key in ("a", "b"):
            assert _has_key_by_compare_set(store, key) == store.check([key])


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
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("hasattr", "getattr") and node.args:
            target = ast.unparse(node.args[0])
            if target.split(".")[0] in ("torch", "dist", "dcp") and not (node.func.id == "getattr" and target == "torch"):
                found.append(f"{path.relative_to(PKG)}:{node.lineno}: {ast.unparse(node)}")
        if isinstance(node, ast.Attribute) and node.attr == "__version__" and ast.unparse(node.value) == "torch":
            found.append(f"{path.relative_to(PKG)}:{node.lineno}: torch.__version__")
    return found


def test_only_torch_compat_tests_torch_versions() -> None:
    """``getattr(torch, name)`` of a dtype name is allowed; a probe of an API is not."""
    found = [hit for path in sorted(PKG.rglob("*.py")) if path.name != "torch_compat.py" for hit in _version_tests(path)]
    assert not found, "version probes outside distributed/torch_compat.py:\n" + "\n".join(found)
    assert _version_tests(PKG / "distributed" / "torch_compat.py"), "the scan finds nothing even in torch_compat.py: it is broken"


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
