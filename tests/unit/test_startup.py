"""utils/startup.py: frozen frames answered from inspect's cache, with inspect.stack() unchanged."""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import pytest

import distsplat_ns.registry  # noqa: F401 -- registers at import, as nerfstudio's plugin discovery does
from distsplat_ns.utils.startup import register_frozen_module_files

FROZEN = "<frozen importlib._bootstrap>"


def _stack_inside_an_import(tmp_path: Path, name: str) -> list[tuple]:
    """inspect.stack() taken while a module is being imported: the import machinery's frozen frames are on it."""
    (tmp_path / f"{name}.py").write_text("import inspect\nSTACK = [tuple(f)[1:] for f in inspect.stack()]\n")
    sys.path.insert(0, str(tmp_path))
    try:
        return importlib.import_module(name).STACK
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop(name, None)


def test_registry_import_maps_the_import_machinery_to_its_module() -> None:
    assert inspect.modulesbyfile[FROZEN] in sys.modules
    assert sys.modules[inspect.modulesbyfile[FROZEN]] is sys.modules["importlib._bootstrap"]
    assert register_frozen_module_files() == 0  # already done: nothing added twice


def test_frozen_frame_is_answered_from_the_cache_without_scanning() -> None:
    frame = sys._getframe()
    bootstrap, modules = sys.modules["importlib._bootstrap"], sys.modules
    # A scan of these two modules finds no module whose file is FROZEN and returns None.
    sys.modules = {"importlib._bootstrap": bootstrap, "__main__": modules["__main__"]}
    try:
        found = inspect.getmodule(frame, FROZEN)
    finally:
        sys.modules = modules
    assert found is bootstrap


def test_stack_inside_an_import_is_unchanged_by_the_cache_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with_entries = _stack_inside_an_import(tmp_path, "distsplat_startup_probe_a")
    assert any(frame[0] == FROZEN for frame in with_entries), "no frozen frame on the stack: the test proves nothing"
    frozen = {key: value for key, value in inspect.modulesbyfile.items() if key.startswith("<frozen ")}
    for key in frozen:
        monkeypatch.delitem(inspect.modulesbyfile, key)
    without_entries = _stack_inside_an_import(tmp_path, "distsplat_startup_probe_b")

    # (filename, line, function, code context, index) of every frame but the probe's and this file's own
    def outside(stack: list[tuple]) -> list[tuple]:
        return [f for f in stack[1:] if f[0] != __file__]

    assert outside(with_entries) == outside(without_entries)
    assert len(outside(with_entries)) > 3
