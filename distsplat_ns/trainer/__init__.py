"""The trainer: nerfstudio's loop around the pipeline's step, its checkpoints (save, resume, the
sharded consolidation), the run record and the optimizers' rules and step. Not here: the step itself
(``pipeline/``), reading checkpoint files (``checkpoint.py``), row layouts (``parallel/``).

The trainer classes keep their import path from before this package (``distsplat_ns.trainer``):
saved ``config.yml`` files name them there (tests/unit/test_old_config.py).
"""

from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainer, DistSplatTrainerConfig

__all__ = ["DistSplatTrainer", "DistSplatTrainerConfig"]
