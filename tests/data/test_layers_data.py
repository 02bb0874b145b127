"""The pure data modules import neither nerfstudio nor torch.distributed (tests/unit/test_layers.py).

One exception: ``undistort.py`` imports nerfstudio's FISHEYE624 projection functions inside the
functions that use them (``LAZY_NERFSTUDIO``), so it still imports without nerfstudio.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).resolve().parents[2] / "distsplat_ns" / "data"
PURE = [
    "order.py",
    "stream.py",
    "store.py",
    "decode.py",
    "resize.py",
    "preflight.py",
    "worker_server.py",
    "undistort.py",
    "image_loader.py",
    "slots.py",
    "workers.py",
    "reader.py",
    "upload.py",
]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


#: Function-level nerfstudio imports a pure module may make (never at module level).
LAZY_NERFSTUDIO = {"undistort.py": {"nerfstudio.cameras.camera_utils"}}


def _top_level_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("name", PURE)
def test_pure_data_module_does_not_import_nerfstudio(name: str) -> None:
    allowed = LAZY_NERFSTUDIO.get(name, set())
    assert not any(n.split(".")[0] == "nerfstudio" for n in _top_level_imports(DATA / name))
    assert not any(n.split(".")[0] == "nerfstudio" and n not in allowed for n in _imports(DATA / name))


def test_undistort_imports_without_nerfstudio() -> None:
    code = "import sys; sys.modules['nerfstudio'] = None; import distsplat_ns.data.undistort"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, cwd=DATA.parents[1])


@pytest.mark.parametrize("name", PURE + ["datamanager.py", "eval_split.py", "image_specs.py"])
def test_data_module_does_not_import_torch_distributed(name: str) -> None:
    assert not any(n.startswith("torch.distributed") for n in _imports(DATA / name))
