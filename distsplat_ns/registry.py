"""The ``distsplat`` methods for nerfstudio (entry point group ``nerfstudio.method_configs``).

``distsplat`` is splatfacto's settings, ``distsplat-big`` splatfacto-big's (nerfstudio 1.1.5's
``method_configs.py``) and ``distsplat-mcmc`` nerfstudio main's splatfacto-mcmc, each with the
distsplat pipeline and trainer.

Wiring only. Importing this module builds configuration objects and nothing else: no CUDA work, no
network, no dataset access (every ``ns-*`` command imports every plugin); it also fills
``inspect``'s cache for frozen modules (``utils/startup.py``: nerfstudio's start-up cost).
"""

from __future__ import annotations

from nerfstudio.configs.base_config import ViewerConfig
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from nerfstudio.engine.optimizers import AdamOptimizerConfig
from nerfstudio.engine.schedulers import ExponentialDecaySchedulerConfig
from nerfstudio.plugins.types import MethodSpecification

from distsplat_ns.checkpoint import register_numpy_safe_globals
from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from distsplat_ns.model.distsplat_model import DistSplatModelConfig
from distsplat_ns.pipeline.distsplat_pipeline import DistSplatPipelineConfig
from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainerConfig
from distsplat_ns.utils.startup import register_frozen_module_files

# nerfstudio's own checkpoints hold numpy scalars; let them load under weights_only=True.
register_numpy_safe_globals()
# nerfstudio lists its external methods right after importing this module: 2.6 s less CPU per process (docs/startup.md).
register_frozen_module_files()


def _adam(lr: float) -> AdamOptimizerConfig:
    return AdamOptimizerConfig(lr=lr, eps=1e-15)


def distsplat_trainer_config(
    model: DistSplatModelConfig | None = None, method_name: str = "distsplat", bilateral_grid_lr: float = 2e-3
) -> DistSplatTrainerConfig:
    """Splatfacto's schedule and learning rates, with the distsplat pipeline and trainer.

    ``max_num_iterations`` counts training images (at the default batch size of 1, steps).

    Args:
        model: The model's configuration; splatfacto's defaults when None.
        method_name: The CLI name and output folder. Each variant needs its own: nerfstudio 1.1.5
            keys plugin methods by ``method_name`` (``nerfstudio/plugins/registry.py``), so a
            variant sharing ``distsplat`` would replace it.
        bilateral_grid_lr: The "bilateral_grid" group's initial learning rate (splatfacto's 2e-3,
            splatfacto-big's 5e-3); the group is used only with ``--pipeline.model.use-bilateral-grid True``.
    """
    return DistSplatTrainerConfig(
        method_name=method_name,
        steps_per_eval_image=100,
        steps_per_eval_batch=0,
        steps_per_save=2000,
        steps_per_eval_all_images=1000,
        max_num_iterations=30000,
        mixed_precision=False,
        pipeline=DistSplatPipelineConfig(
            datamanager=ParallelFullImageDatamanagerConfig(
                dataparser=NerfstudioDataParserConfig(load_3D_points=True),
            ),
            model=DistSplatModelConfig() if model is None else model,
        ),
        optimizers={
            "means": {
                "optimizer": _adam(1.6e-4),
                "scheduler": ExponentialDecaySchedulerConfig(lr_final=1.6e-6, max_steps=30000),
            },
            "features_dc": {"optimizer": _adam(0.0025), "scheduler": None},
            "features_rest": {"optimizer": _adam(0.0025 / 20), "scheduler": None},
            "opacities": {"optimizer": _adam(0.05), "scheduler": None},
            "scales": {"optimizer": _adam(0.005), "scheduler": None},
            "quats": {"optimizer": _adam(0.001), "scheduler": None},
            "bilateral_grid": {
                "optimizer": _adam(bilateral_grid_lr),
                "scheduler": ExponentialDecaySchedulerConfig(
                    lr_final=1e-4, max_steps=30000, warmup_steps=1000, lr_pre_warmup=0
                ),
            },
            "camera_opt": {
                "optimizer": _adam(1e-4),
                "scheduler": ExponentialDecaySchedulerConfig(
                    lr_final=5e-7, max_steps=30000, warmup_steps=1000, lr_pre_warmup=0
                ),
            },
        },
        viewer=ViewerConfig(num_rays_per_chunk=1 << 15),
        vis="viewer",
    )


distsplat = MethodSpecification(
    config=distsplat_trainer_config(),
    description="Gaussian splatting (splatfacto's model) trained data-parallel on one or many processes "
    "(torch.distributed: NCCL on GPUs, gloo on CPUs), with streamed JPEG loading and load-balanced image bands.",
)


def distsplat_big_trainer_config() -> DistSplatTrainerConfig:
    """splatfacto-big's settings: more Gaussians kept (culled below opacity 0.005, not 0.1) and
    fewer grown (position-gradient threshold 0.0005, not 0.0002); everything else is ``distsplat``'s.

    Its method name (CLI name and output folder) is ``distsplat-big``: nerfstudio's built-in variants
    share ``splatfacto``, but a plugin's variant must not share ``distsplat`` (it would replace it).
    splatfacto-big's other difference is the bilateral grid's learning rate (5e-3, not 2e-3).
    """
    return distsplat_trainer_config(
        DistSplatModelConfig(cull_alpha_thresh=0.005, densify_grad_thresh=0.0005),
        "distsplat-big",
        bilateral_grid_lr=5e-3,
    )


distsplat_big = MethodSpecification(
    config=distsplat_big_trainer_config(),
    description="distsplat with splatfacto-big's settings (more Gaussians, for quality).",
)


def distsplat_mcmc_trainer_config() -> DistSplatTrainerConfig:
    """nerfstudio main's splatfacto-mcmc: MCMC densification (``--pipeline.model.strategy mcmc``,
    docs/mcmc.md) with Gaussians dead below opacity 0.005 and relocation and addition stopping after
    25000 images; everything else is ``distsplat``'s (main changes nothing else either). Method name
    ``distsplat-mcmc`` (its own, as ``distsplat-big``'s)."""
    return distsplat_trainer_config(
        DistSplatModelConfig(strategy="mcmc", cull_alpha_thresh=0.005, stop_split_at=25000), "distsplat-mcmc"
    )


distsplat_mcmc = MethodSpecification(
    config=distsplat_mcmc_trainer_config(),
    description="distsplat with MCMC densification (splatfacto-mcmc's settings): a hard cap on the Gaussians over all ranks, the same model on any number of processes.",
)
