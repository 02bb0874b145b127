"""STYLE.md's import layers, and a light registry import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "distsplat_ns"


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _modules(sub: str) -> list[Path]:
    return sorted((PKG / sub).rglob("*.py")) if (PKG / sub).is_dir() else [PKG / sub]


@pytest.mark.parametrize("path", [p for p in PKG.rglob("*.py") if p.parent.name != "dist"], ids=lambda p: str(p.relative_to(PKG)))
def test_only_dist_imports_torch_distributed(path: Path) -> None:
    assert not any(n == "torch.distributed" or n.startswith("torch.distributed.") for n in _imports(path))


@pytest.mark.parametrize("path", _modules("balance") + _modules("rendering") + _modules("utils") + _modules("dist") + [PKG / "types.py"], ids=lambda p: str(p.relative_to(PKG)))
def test_pure_layers_do_not_import_nerfstudio(path: Path) -> None:
    assert not any(n.split(".")[0] == "nerfstudio" for n in _imports(path))


@pytest.mark.parametrize("path", [p for p in PKG.rglob("*.py") if p.name not in ("gsplat_backend.py", "strategy.py")], ids=lambda p: str(p.relative_to(PKG)))
def test_gsplat_imported_only_in_its_two_modules(path: Path) -> None:
    # The module-level import is forbidden everywhere else; the two allowed modules import lazily.
    tree = ast.parse(path.read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    names = set()
    for node in top:
        names.update(a.name for a in node.names) if isinstance(node, ast.Import) else names.add(node.module or "")
    assert not any(n.split(".")[0] == "gsplat" for n in names)


@pytest.mark.parametrize("path", [p for p in PKG.rglob("*.py")], ids=lambda p: str(p.relative_to(PKG)))
def test_nothing_imports_the_registry(path: Path) -> None:
    if path.name == "registry.py":
        return
    assert "distsplat_ns.registry" not in _imports(path)


def test_registry_import_is_light() -> None:
    code = (
        "import sys, torch\n"
        "import distsplat_ns.registry as r\n"
        "assert r.distsplat.config.method_name == 'distsplat'\n"
        "assert not torch.cuda.is_initialized()\n"
        "assert 'gsplat.cuda._backend' not in sys.modules, 'gsplat CUDA backend imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
