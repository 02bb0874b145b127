"""The method variants: splatfacto's settings they carry, and their entry points."""

from __future__ import annotations

from pathlib import Path

import tomllib
from nerfstudio.configs.method_configs import method_configs
from nerfstudio.plugins.types import MethodSpecification

from distsplat_ns import registry

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def test_every_method_has_an_entry_point() -> None:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]["nerfstudio.method_configs"]
    specs = {name for name, value in vars(registry).items() if isinstance(value, MethodSpecification)}
    assert {v.split(":")[1] for v in declared.values()} == specs
    assert declared == {"distsplat": "distsplat_ns.registry:distsplat", "distsplat-big": "distsplat_ns.registry:distsplat_big"}


def test_big_carries_splatfacto_bigs_model_settings() -> None:
    big, base = registry.distsplat_big.config.pipeline.model, registry.distsplat.config.pipeline.model
    theirs, plain = method_configs["splatfacto-big"].pipeline.model, method_configs["splatfacto"].pipeline.model
    changed = {f for f in vars(plain) if getattr(plain, f) != getattr(theirs, f)}
    assert changed == {"cull_alpha_thresh", "densify_grad_thresh"}
    assert all(getattr(big, f) == getattr(theirs, f) for f in changed)
    assert {f for f in vars(base) if f != "_target" and getattr(base, f) != getattr(big, f)} == changed


def test_big_keeps_distsplats_trainer_and_optimizers() -> None:
    big, base = registry.distsplat_big.config, registry.distsplat.config
    assert big.method_name == base.method_name == "distsplat"  # nerfstudio's variants share the method name
    assert big.optimizers == base.optimizers and big.max_num_iterations == base.max_num_iterations
    assert type(big.pipeline) is type(base.pipeline) and type(big.pipeline.datamanager) is type(base.pipeline.datamanager)
