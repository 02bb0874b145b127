"""A run's config.yml written by an earlier version still loads: nerfstudio writes each config
dataclass and its ``_target`` class into config.yml by module and name (``!!python/object:``,
``!!python/name:``), and ``ns-eval``, ``ns-export``, ``ns-render`` and ``ns-viewer`` load it back
(``nerfstudio/utils/eval_utils.py:eval_setup``): moving or renaming one of those classes, or a
field, breaks every run folder written before.

``tests/fixtures/config_b53ba80.yml`` is the config.yml of ``ns-train distsplat --pipeline.parallel
sharded`` on the shipped scene, written by b53ba80 (output folder and data path as they were there).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from distsplat_ns.data.datamanager import ParallelFullImageDatamanager, ParallelFullImageDatamanagerConfig
from distsplat_ns.model.distsplat_model import DistSplatModel, DistSplatModelConfig
from distsplat_ns.pipeline import DistSplatPipeline, DistSplatPipelineConfig
from distsplat_ns.trainer import DistSplatTrainer, DistSplatTrainerConfig

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "config_b53ba80.yml"
SCENE = Path(__file__).resolve().parents[2] / "scenes" / "lund_door"


def _load() -> DistSplatTrainerConfig:
    return yaml.load(FIXTURE.read_text(), Loader=yaml.Loader)  # as eval_setup does


def test_b53ba80_config_names_the_current_classes() -> None:
    config = _load()
    pairs = [
        (config, DistSplatTrainerConfig, DistSplatTrainer),
        (config.pipeline, DistSplatPipelineConfig, DistSplatPipeline),
        (config.pipeline.model, DistSplatModelConfig, DistSplatModel),
        (config.pipeline.datamanager, ParallelFullImageDatamanagerConfig, ParallelFullImageDatamanager),
    ]
    for loaded, config_class, target in pairs:
        assert type(loaded) is config_class and loaded._target is target
        # A field added since reads its default from the class (a plain default is a class
        # attribute; a default_factory is not, so such a field would be missing on old configs).
        added = [f for f in dataclasses.fields(config_class) if f.name not in vars(loaded)]
        no_default = sorted(f.name for f in added if f.default is dataclasses.MISSING)
        assert not no_default, (
            f"{config_class.__name__}: fields the b53ba80 config.yml does not hold, with no plain default: {no_default}"
        )
        for f in added:
            assert getattr(loaded, f.name) == f.default, f.name


def test_b53ba80_config_sets_up_its_pipeline() -> None:
    config = _load()
    assert config.pipeline.parallel == "sharded"
    config.pipeline.datamanager.dataparser.data = SCENE
    pipeline = config.pipeline.setup(device="cpu", test_mode="inference")
    assert isinstance(pipeline, DistSplatPipeline) and isinstance(pipeline.model, DistSplatModel)
    assert pipeline.mode.name == "sharded" and pipeline.model.num_points > 0


#: config.yml of the float32 runs of scripts/train_compare_runs.sh written by 860afc4 (before the pipeline/ and
#: trainer/ packages): they name the pipeline and trainer classes at distsplat_ns.pipeline and distsplat_ns.trainer.
RUN_860AFC4 = FIXTURE.parent / "run_860afc4"


def test_860afc4_configs_name_the_current_classes_and_set_up() -> None:
    for run in ("replicated", "sharded"):
        config = yaml.load((RUN_860AFC4 / run / "config.yml").read_text(), Loader=yaml.Loader)
        assert type(config) is DistSplatTrainerConfig and config._target is DistSplatTrainer
        assert type(config.pipeline) is DistSplatPipelineConfig and config.pipeline._target is DistSplatPipeline
        assert config.pipeline.parallel == run
        config.pipeline.datamanager.dataparser.data = SCENE
        pipeline = config.pipeline.setup(device="cpu", test_mode="inference")
        assert pipeline.mode.name == run and pipeline.model.num_points > 0
