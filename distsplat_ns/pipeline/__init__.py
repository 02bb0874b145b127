"""The pipeline and the phases of its step: the step's balance, the band pass (forward and backward),
evaluation, the step report and the viewer's start. Not here: the loop, checkpoints and optimizers
(``trainer/``), what differs between modes (``parallel/``).

The pipeline classes keep their import path from before this package (``distsplat_ns.pipeline``):
saved ``config.yml`` files name them there (tests/unit/test_old_config.py).
"""

from distsplat_ns.pipeline.distsplat_pipeline import DistSplatPipeline, DistSplatPipelineConfig

__all__ = ["DistSplatPipeline", "DistSplatPipelineConfig"]
