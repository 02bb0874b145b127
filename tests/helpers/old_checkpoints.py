"""The checkpoints and config.yml files b53ba80 wrote (tests/fixtures/b53ba80/make_fixtures.sh):
where they are, a run folder the tools can read, and loading them through the trainer
(tests/multiproc/test_old_checkpoints.py, tests/integration/test_old_checkpoints_resume_export.py)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "b53ba80"
STEP = 9
"""The step of every fixture checkpoint (a refine grew and pruned at step 8)."""
#: The three formats: (run, file name) of the replicated file, the sharded DCP folder and its consolidation.
SOURCES = {
    "replicated-ckpt": ("replicated", f"step-{STEP:09d}.ckpt"),
    "sharded-dcp": ("sharded", f"step-{STEP:09d}.dcp"),
    "consolidated-ckpt": ("sharded", f"step-{STEP:09d}.ckpt"),
}


def fixture_path(source: str) -> Path:
    run, name = SOURCES[source]
    return FIXTURES / run / "nerfstudio_models" / name


def models_folder(source: str, dest: Path) -> Path:
    """A checkpoint folder holding only ``source``'s checkpoint (a copy), to resume from."""
    folder = Path(dest) / f"load-{source}"
    folder.mkdir(parents=True, exist_ok=True)
    path = fixture_path(source)
    (shutil.copytree if path.is_dir() else shutil.copy2)(path, folder / path.name)
    return folder


def run_folder(run: str, base: Path) -> Path:
    """The fixture run laid out under ``base`` as ns-train left it, for the tools that take
    ``--load-config``: its config.yml holds relative paths (``out/...``, ``scenes/lund_door``), so
    ``base`` gets a link to this checkout's ``scenes`` and the tools run in ``base``. Returns the
    config.yml's path relative to ``base``."""
    folder = Path("out") / "old" / "distsplat" / run
    shutil.copytree(FIXTURES / run / "nerfstudio_models", base / folder / "nerfstudio_models")
    shutil.copy2(FIXTURES / run / "config.yml", base / folder / "config.yml")
    if not (base / "scenes").exists():
        (base / "scenes").symlink_to(REPO / "scenes")
    return folder / "config.yml"


def load_and_save(ctx: Any, out: str, source: str, parallel: str, step: int) -> dict[str, Any]:
    """Set up a DistSplatTrainer from the fixture run's config.yml, resuming from ``source`` in
    ``parallel`` mode on ``ctx``'s ranks, and save checkpoint ``step`` straight away (nothing
    trained). Returns this rank's ids and the new checkpoint folder."""
    import yaml

    from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainer

    run = SOURCES[source][0]
    config = yaml.load((FIXTURES / run / "config.yml").read_text(), Loader=yaml.Loader)
    config.output_dir = Path(out)
    config.pipeline.datamanager.dataparser.data = REPO / "scenes" / "lund_door"
    config.timestamp = f"resumed-{parallel}-{ctx.world_size}"
    config.load_dir = models_folder(source, Path(out) / f"rank{ctx.rank}")
    config.pipeline.parallel = parallel
    config.max_num_iterations = 2 * (STEP + 3)  # images: steps left to train, so the trainer builds its optimizers
    config.pipeline.datamanager.num_workers, config.pipeline.datamanager.eval_num_workers = 0, 0
    trainer = DistSplatTrainer(config)
    trainer.setup()
    trainer.save_checkpoint(step)
    return {"ids": trainer.pipeline.model.gauss_ids.tolist(), "checkpoint_dir": str(trainer.checkpoint_dir)}
