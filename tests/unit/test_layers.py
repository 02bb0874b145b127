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


#: The package's floors, lowest first, as the imports place them (docs/architecture.md): each entry is
#: (floor, package folder or top-level file, the files of it on that floor). A package is one floor unless
#: its files span two (data/: the pure image path below, the nerfstudio datamanager above). A module may
#: import package modules of its own floor or below (never up); the graph within a floor must be acyclic.
#: Every file is named here, and every name here must exist: a new, moved or removed module is placed here.
FLOORS: tuple[tuple[int, str, tuple[str, ...]], ...] = (
    (1, "__init__.py", ("__init__.py",)),
    (
        1,
        "utils/",
        (
            "__init__.py",
            "cameras.py",
            "dtype.py",
            "errors.py",
            "fd_passing.py",
            "host_allocator.py",
            "host_to_device.py",
            "keyed_random.py",
            "logging.py",
            "shm.py",
            "signals.py",
            "startup.py",
            "stats.py",
            "steps.py",
            "thread_stack.py",
            "timing.py",
            "units.py",
            "validation.py",
        ),
    ),
    (
        2,
        "balance/",
        (
            "__init__.py",
            "bands.py",
            "cost.py",
            "partition.py",
            "planner.py",
            "routing.py",
        ),
    ),
    (
        2,
        "data/",
        (
            "__init__.py",
            "decode.py",
            "image_loader.py",
            "order.py",
            "preflight.py",
            "reader.py",
            "resize.py",
            "slots.py",
            "step_batch.py",
            "store.py",
            "stream.py",
            "undistort.py",
            "upload.py",
            "worker_server.py",
            "workers.py",
        ),
    ),
    (
        2,
        "distributed/",
        (
            "__init__.py",
            "collectives.py",
            "context.py",
            "dcp_rows.py",
            "gradient_sum.py",
            "host_share.py",
            "interfaces.py",
            "lifecycle.py",
            "rank0_work.py",
            "reporting.py",
            "restart.py",
            "store_access.py",
            "torch_compat.py",
        ),
    ),
    (3, "checkpoint.py", ("checkpoint.py",)),
    (
        3,
        "data/",
        (
            "datamanager.py",
            "dataparse.py",
            "eval_split.py",
            "image_specs.py",
        ),
    ),
    (
        3,
        "gaussians/",
        (
            "__init__.py",
            "budget_caps.py",
            "budget_measured.py",
            "checkpoint_keys.py",
            "densifier.py",
            "growth_cap.py",
            "initial.py",
            "mcmc.py",
            "mcmc_draws.py",
            "mcmc_relocation.py",
            "ownership.py",
            "rows.py",
            "strategy.py",
            "strategy_choices.py",
            "strategy_schedule.py",
        ),
    ),
    (
        3,
        "rendering/",
        (
            "__init__.py",
            "api.py",
            "gsplat_backend.py",
            "gsplat_compat.py",
            "gsplat_versions.py",
            "packed.py",
            "projection.py",
            "reference.py",
            "sh.py",
        ),
    ),
    (
        4,
        "model/",
        (
            "__init__.py",
            "band_backward.py",
            "band_depth.py",
            "band_render.py",
            "band_terms.py",
            "camera_adjust.py",
            "colour_metrics.py",
            "distsplat_model.py",
            "eval_outputs.py",
            "losses.py",
        ),
    ),
    (
        5,
        "parallel/",
        (
            "__init__.py",
            "camera_groups.py",
            "exchange.py",
            "full_state.py",
            "halo_cost_gathers.py",
            "mode.py",
            "replicated.py",
            "shard_checkpoint.py",
            "shard_moves.py",
            "sharded.py",
            "streamed_file.py",
            "view_render.py",
            "view_requests.py",
        ),
    ),
    (
        6,
        "pipeline/",
        (
            "__init__.py",
            "band_pass.py",
            "distsplat_pipeline.py",
            "evaluation.py",
            "step_balance.py",
            "step_report.py",
            "viewer_start.py",
        ),
    ),
    (
        7,
        "trainer/",
        (
            "__init__.py",
            "checkpoints.py",
            "distsplat_trainer.py",
            "optimizer_rules.py",
            "optimizer_step.py",
            "run_record.py",
        ),
    ),
    (8, "registry.py", ("registry.py",)),
)
#: The entries that never import nerfstudio (the pure floors; undistort.py's lazy import is below).
NERFSTUDIO_FREE = {
    (1, "__init__.py"),
    (1, "utils/"),
    (2, "balance/"),
    (2, "data/"),
    (2, "distributed/"),
    (3, "rendering/"),
}
ALL_MODULES = sorted(PKG.rglob("*.py"))
_FLOOR_OF = {
    (folder if folder.endswith("/") else "") + name: (floor, folder)
    for floor, folder, names in FLOORS
    for name in names
}


def _layer(path: Path) -> int:
    rel = path.relative_to(PKG).as_posix()
    assert rel in _FLOOR_OF, f"{rel} is on no floor of tests/unit/test_layers.py: place it there"
    return _FLOOR_OF[rel][0]


def _nerfstudio_free(path: Path) -> bool:
    return _FLOOR_OF.get(path.relative_to(PKG).as_posix()) in NERFSTUDIO_FREE


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


def test_every_module_is_on_one_floor_and_every_name_exists() -> None:
    named = [(folder if folder.endswith("/") else "") + name for _, folder, names in FLOORS for name in names]
    assert len(named) == len(set(named)), "a file is on two floors"
    on_disk = {p.relative_to(PKG).as_posix() for p in ALL_MODULES}
    assert not sorted(set(named) - on_disk), f"named but not in distsplat_ns/: {sorted(set(named) - on_disk)}"
    assert not sorted(on_disk - set(named)), f"in distsplat_ns/ but on no floor: {sorted(on_disk - set(named))}"


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


@pytest.mark.parametrize("path", [p for p in ALL_MODULES if _nerfstudio_free(p)], ids=lambda p: str(p.relative_to(PKG)))
def test_pure_layers_do_not_import_nerfstudio(path: Path) -> None:
    allowed = LAZY_NERFSTUDIO.get(path.relative_to(PKG).as_posix(), set())
    top = [n for n in ast.parse(path.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    top_names = {a.name for n in top if isinstance(n, ast.Import) for a in n.names} | {
        n.module or "" for n in top if isinstance(n, ast.ImportFrom)
    }
    assert not any(n.split(".")[0] == "nerfstudio" for n in top_names)
    assert not any(n.split(".")[0] == "nerfstudio" and n not in allowed for n in _imports(path))


@pytest.mark.parametrize(
    "path",
    [p for p in PKG.rglob("*.py") if p.name not in ("gsplat_backend.py", "strategy.py")],
    ids=lambda p: str(p.relative_to(PKG)),
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
