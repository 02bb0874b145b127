"""The pure data modules import neither nerfstudio nor torch.distributed (tests/unit/test_layers.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "distsplat_ns" / "data"
PURE = ["order.py", "stream.py", "store.py", "decode.py", "resize.py", "preflight.py", "worker_server.py",
        "undistort.py", "image_loader.py", "slots.py", "workers.py", "reader.py", "upload.py"]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("name", PURE)
def test_pure_data_module_does_not_import_nerfstudio(name: str) -> None:
    assert not any(n.split(".")[0] == "nerfstudio" for n in _imports(DATA / name))


@pytest.mark.parametrize("name", PURE + ["datamanager.py", "eval_split.py", "image_specs.py"])
def test_data_module_does_not_import_torch_distributed(name: str) -> None:
    assert not any(n.startswith("torch.distributed") for n in _imports(DATA / name))
