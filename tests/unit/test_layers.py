"""The import layers (imports only go down, no cycles), and a light registry import."""

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


#: The package's layers, lowest first (docs/architecture.md). A module may import package modules of its own layer or below
#: (never up); the graph within a layer must be acyclic. A new module must be placed here.
LAYERS: dict[str, int] = {
    "__init__.py": 1,
    "utils/": 1,
    "types.py": 1,
    "config.py": 1,
    "distributed/": 2,
    "balance/": 3,
    "rendering/": 3,
    "data/__init__.py": 3,
    "data/order.py": 3,
    "data/stream.py": 3,
    "data/store.py": 3,
    "data/decode.py": 3,
    "data/resize.py": 3,
    "data/preflight.py": 3,
    "data/worker_server.py": 3,
    "data/undistort.py": 3,
    "data/image_loader.py": 3,
    "data/slots.py": 3,
    "data/workers.py": 3,
    "data/reader.py": 3,
    "data/upload.py": 3,
    "data/step_batch.py": 3,
    "data/dataparse.py": 4,
    "data/image_specs.py": 4,
    "model/": 4,
    "gaussians/": 4,
    "parallel/": 4,
    "data/datamanager.py": 4,
    "data/eval_split.py": 4,
    "pipeline/": 4,
    "trainer/": 4,
    "checkpoint.py": 4,
    "registry.py": 5,
}
#: The nerfstudio glue starts at this layer; nothing below it imports nerfstudio.
NERFSTUDIO_LAYER = 4
ALL_MODULES = sorted(PKG.rglob("*.py"))


def _layer(path: Path) -> int:
    rel = path.relative_to(PKG).as_posix()
    for prefix, layer in LAYERS.items():
        if rel == prefix or (prefix.endswith("/") and rel.startswith(prefix)):
            return layer
    raise AssertionError(f"{rel} is in no layer of tests/unit/test_layers.py: place it there")


def _module_path(name: str) -> Path | None:
    """The file of a ``distsplat_ns.x.y`` module (package ``__init__`` for a package)."""
    if name != "distsplat_ns" and not name.startswith("distsplat_ns."):
        return None
    base = PKG.parent / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    raise AssertionError(f"import of {name}, which does not exist")


def _package_imports(path: Path) -> set[Path]:
    """Package modules ``path`` imports (``from pkg import submodule`` counts the submodule only)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        assert not (isinstance(node, ast.ImportFrom) and node.level), f"{path.name}: relative import"
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                sub = PKG.parent / Path(*node.module.split("."), alias.name)
                is_module = sub.with_suffix(".py").exists() or (sub / "__init__.py").exists()
                names.add(f"{node.module}.{alias.name}" if is_module else node.module)
    return {m for m in (_module_path(n) for n in names) if m is not None and m != path}


@pytest.mark.parametrize("path", ALL_MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_imports_only_go_down_the_layers(path: Path) -> None:
    mine = _layer(path)
    up = [str(m.relative_to(PKG)) for m in _package_imports(path) if _layer(m) > mine]
    assert not up, f"{path.relative_to(PKG)} (layer {mine}) imports from a higher layer: {up}"


def test_no_import_cycles() -> None:
    graph = {p: _package_imports(p) for p in ALL_MODULES}
    state: dict[Path, int] = {}

    def visit(node: Path, trail: list[Path]) -> None:
        if state.get(node) == 2:
            return
        assert state.get(node) != 1, "import cycle: " + " -> ".join(str(p.relative_to(PKG)) for p in trail + [node])
        state[node] = 1
        for nxt in graph[node]:
            visit(nxt, trail + [node])
        state[node] = 2

    for node in ALL_MODULES:
        visit(node, [])


@pytest.mark.parametrize("path", ALL_MODULES, ids=lambda p: str(p.relative_to(PKG)))
def test_only_distributed_imports_torch_distributed(path: Path) -> None:
    if path.parent.name == "distributed":
        return
    assert not any(n == "torch.distributed" or n.startswith("torch.distributed.") for n in _imports(path))


#: Function-level nerfstudio imports allowed below the glue layer (never at module level):
#: undistort.py calls nerfstudio's FISHEYE624 projection functions only for such cameras (docs/data.md).
LAZY_NERFSTUDIO = {"data/undistort.py": {"nerfstudio.cameras.camera_utils"}}


@pytest.mark.parametrize("path", [p for p in ALL_MODULES if _layer(p) < NERFSTUDIO_LAYER], ids=lambda p: str(p.relative_to(PKG)))
def test_pure_layers_do_not_import_nerfstudio(path: Path) -> None:
    allowed = LAZY_NERFSTUDIO.get(path.relative_to(PKG).as_posix(), set())
    top = [n for n in ast.parse(path.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    top_names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names} | {n.module or "" for n in top if isinstance(n, ast.ImportFrom)}
    assert not any(n.split(".")[0] == "nerfstudio" for n in top_names)
    assert not any(n.split(".")[0] == "nerfstudio" and n not in allowed for n in _imports(path))


@pytest.mark.parametrize(
    "path", [p for p in PKG.rglob("*.py") if p.name not in ("gsplat_backend.py", "strategy.py")], ids=lambda p: str(p.relative_to(PKG))
)
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
