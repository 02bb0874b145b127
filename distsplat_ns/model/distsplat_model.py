"""DistSplatModel: splatfacto's Gaussians rendered as batches of image bands.

A subclass of nerfstudio's ``SplatfactoModel`` so that ``ns-export gaussian-splat``, ``ns-eval``
and the viewer accept it unchanged. What differs from splatfacto: a training step renders the bands
of B images (``forward_bands``) from a ``ProjectionSource`` the parallel mode hands it
(``model/band_render.py``); each band's loss is its exact share of the batch's
(``model/losses.py``, ``model/band_backward.py``); densification reads the whole batch's statistics
over every rank (``densifier``, from ``--pipeline.model.strategy``); schedules are counted in
images; no bare ``.cuda()``; LPIPS is built only when its weights can be had. See
docs/architecture.md.

Shape letters: N Gaussians, C cameras rendered by this rank, B images in the global batch,
H/W pixels, K SH bases.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import torch
import tyro
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.engine.callbacks import TrainingCallback, TrainingCallbackAttributes, TrainingCallbackLocation
from nerfstudio.model_components.lib_bilagrid import BilateralGrid
from nerfstudio.models.splatfacto import SplatfactoModel, SplatfactoModelConfig
from nerfstudio.utils.colors import get_color

from distsplat_ns.balance.bands import TILE_SIZE, Band
from distsplat_ns.gaussians.densifier import Densifier
from distsplat_ns.gaussians.initial import initial_gaussians, unique_seed_points
from distsplat_ns.gaussians.mcmc import MCMCConfig
from distsplat_ns.gaussians.rows import IDS, GaussianRows, gaussian_schema, parameter_fields
from distsplat_ns.gaussians.strategy_choices import STRATEGIES, StrategyName, build_densifier, strategy_help
from distsplat_ns.gaussians.strategy_schedule import PAUSE_RULES, PauseRule
from distsplat_ns.model.band_depth import band_depth, with_depth_channel
from distsplat_ns.model.band_render import (
    BandRenderResult,
    OwnProjections,
    ProjectionSource,
    RegularizerShare,
    RenderInputs,
    rendered_sizes_px,
)
from distsplat_ns.model.band_terms import BandTerms
from distsplat_ns.model.camera_adjust import adjusted_camera_to_worlds
from distsplat_ns.model.eval_outputs import EvalMetrics, LpipsSetting, render_view
from distsplat_ns.model.losses import halo_end_row
from distsplat_ns.rendering import RASTERIZE_MODES, Backend, Projection, project, rasterize_rows
from distsplat_ns.utils.cameras import BatchCameras, ResolutionSchedule, c2w_to_viewmat, cameras_at
from distsplat_ns.utils.dtype import default_dtype
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.host_to_device import to_device
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.validation import one_of

LOGGER = get_logger(__name__)


@dataclass
class DistSplatModelConfig(SplatfactoModelConfig):
    """Splatfacto's configuration, with every schedule counted in images (not steps).

    ``warmup_length``, ``refine_every``, ``resolution_schedule``, ``sh_degree_interval``,
    ``stop_split_at`` and ``stop_screen_size_at`` keep splatfacto's names and defaults but count
    training images, so a batch of B images per step changes neither what an epoch means nor when
    densification happens (Grendel-GS's convention; at B = 1 they equal splatfacto's steps).
    """

    _target: type = field(default_factory=lambda: DistSplatModel)
    rendering_backend: Backend = "auto"
    """Rasterizer: "auto" runs gsplat's CUDA kernels on CUDA tensors and the pure-PyTorch reference on CPU."""
    lpips: LpipsSetting = "auto"
    """LPIPS in eval metrics: "auto" builds it on first use when its weights load (offline machines get a one-line notice and no LPIPS)."""
    param_dtype: Literal["float32", "float64"] = "float32"
    """Precision of the Gaussians and of rendering. float64 (reference backend only) is for verification: runs on different numbers of processes stay within rounding of each other far longer than in float32 (not for ever: docs/float64_exactness.md). float64 also seeds from unique point positions and gives the Gaussians' parameters an Adam eps of at least 1e-8."""
    strategy: Annotated[StrategyName, tyro.conf.arg(help=strategy_help())] = "default"
    """Densification: its help is each strategy's own (``gaussians/strategy_choices.py:strategy_help``)."""
    pause_after_reset: PauseRule = "bounded"
    """Default strategy: how long growth pauses after each opacity reset. "bounded": splatfacto's pause (training images + refine_every) but at most warmup_length + refine_every images, so captures of any size densify after every reset (splatfacto's own pause stops captures of 2900+ images from ever growing: nerfstudio #2927, #3743; docs/densification.md); identical to splatfacto for captures of at most warmup_length images. "splatfacto": splatfacto's pause, for exact parity."""
    max_gs_num: int = MCMCConfig.max_gs_num
    """MCMC only: cap on the number of Gaussians over all ranks (main's default 1,000,000). Additions stop at it."""
    noise_lr: float = MCMCConfig.noise_lr
    """MCMC only: position-noise scale, multiplied by the means' current learning rate (main's and gsplat's 5e5)."""
    mcmc_opacity_reg: float = MCMCConfig.mcmc_opacity_reg
    """MCMC only: weight of the mean opacity in the loss (the paper's 0.01): pushes unused Gaussians towards death."""
    mcmc_scale_reg: float = MCMCConfig.mcmc_scale_reg
    """MCMC only: weight of the mean scale in the loss (the paper's 0.01)."""

    def mcmc_config(self) -> MCMCConfig:
        """The MCMC fields as ``gaussians/mcmc.py`` takes them (validated there).

        Raises:
            ValueError, TypeError: a field is out of range (``MCMCConfig``).
        """
        return MCMCConfig.from_config(self)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"--pipeline.model.strategy must be {one_of(STRATEGIES)}, got {self.strategy!r}")
        if self.strategy == "mcmc":
            self.mcmc_config()
        if self.pause_after_reset not in PAUSE_RULES:
            raise ValueError(
                f"--pipeline.model.pause-after-reset must be {one_of(PAUSE_RULES)}, got {self.pause_after_reset!r}"
            )
        # splatfacto fields distsplat does not honour are refused, never ignored (docs/parity.md).
        if self.n_split_samples != 2:
            # splatfacto 1.1.5 ignores the field too: gsplat's DefaultStrategy always splits in two.
            raise ValueError(
                f"distsplat: --pipeline.model.n-split-samples must be 2 (got {self.n_split_samples}): a split always makes two Gaussians (gsplat)"
            )
        if self.rasterize_mode not in RASTERIZE_MODES:
            raise ValueError(
                f"--pipeline.model.rasterize-mode must be {one_of(RASTERIZE_MODES)}, got {self.rasterize_mode!r}"
            )
        if self.param_dtype == "float64" and self.rendering_backend == "gsplat":
            raise ValueError(
                "--pipeline.model.param-dtype float64 needs the reference backend (gsplat renders float32)"
            )
        if self.background_color not in ("random", "black", "white"):
            raise ValueError(
                f"--pipeline.model.background-color must be random/black/white, got {self.background_color!r}"
            )


class DistSplatModel(SplatfactoModel):
    """Splatfacto trained on batches of image bands; see the module docstring. What a band's loss
    is made of is its ``band_terms`` (``model/band_terms.py:BandTerms``); an eval image's metrics
    its ``eval_metrics`` (``model/eval_outputs.py:EvalMetrics``)."""

    config: DistSplatModelConfig

    # ------------------------------------------------------------------ construction
    def populate_modules(self) -> None:
        self.batch_size: int = int(self.kwargs.get("batch_size", 1))
        if self.batch_size < 1:
            raise ValueError(f"--pipeline.batch-size must be >= 1, got {self.batch_size}")
        self.is_main_rank: bool = bool(self.kwargs.get("is_main_rank", True))
        self.resolution_schedule = ResolutionSchedule(
            self.config.num_downscales, self.config.resolution_schedule, self.batch_size
        )
        # Seed of the training backgrounds and densification samples: the trainer passes
        # --machine.seed (agreed by every rank); 42 (nerfstudio's default) where no trainer runs.
        self.seed: int = int(self.kwargs.get("seed", 42))
        seed_points = self.seed_points
        if self.config.param_dtype == "float64" and seed_points is not None:
            # Twins at one position swap depth order with rounding (gaussians/initial.py).
            seed_points = unique_seed_points(seed_points)
        initial = initial_gaussians(
            self.config, seed_points, shard=self.kwargs.get("gaussian_shard")
        )  # (rank, world): sharded
        self.gauss_params = initial.params
        if self.config.use_bilateral_grid:
            # One grid per training image (splatfacto's), held by every rank: a replicated
            # parameter, summed like the camera adjustments; "bilateral_grid" optimizer group.
            self.bil_grids = BilateralGrid(
                num=self.num_train_data,
                grid_X=self.config.grid_shape[0],
                grid_Y=self.config.grid_shape[1],
                grid_W=self.config.grid_shape[2],
            )
        self.camera_optimizer = self.config.camera_optimizer.setup(num_cameras=self.num_train_data, device="cpu")

        from pytorch_msssim import SSIM
        from torchmetrics.image import PeakSignalNoiseRatio

        self.psnr = PeakSignalNoiseRatio(data_range=1.0)
        self.ssim = SSIM(data_range=1.0, size_average=True, channel=3)
        self.eval_metrics = EvalMetrics(self.psnr, self.ssim, self.config.lpips, self.config.color_corrected_metrics)
        self.step = 0
        self.crop_box = None
        if self.config.background_color == "random":
            # viser's default background: what eval and the viewer show (splatfacto's choice).
            self.background_color = torch.tensor([0.1490, 0.1647, 0.2157])
        else:
            self.background_color = get_color(self.config.background_color)

        # The densification strategy (gaussians/strategy_choices.py), which owns the global id counter: the
        # pipeline calls it with this model's rows after each optimizer step.
        self.densifier: Densifier = build_densifier(
            self.config.strategy,
            self.config,
            batch_size=self.batch_size,
            num_train_images=self.num_train_data,
            seed=self.seed,
            next_id=initial.num_total,
            log_events=self.is_main_rank,
        )
        strategy_state = self.densifier.initial_state()
        # MCMC's loss terms (its regularisers), None under another strategy.
        self.mcmc: MCMCConfig | None = self.config.mcmc_config() if self.config.strategy == "mcmc" else None
        self.band_terms = BandTerms(self.config, self.mcmc, self.composite_with_background)
        # A global identity per Gaussian for its whole life (the same whatever the number of
        # processes): a row of the strategy state, carried by every row operation.
        strategy_state[IDS] = torch.arange(initial.first_id, initial.first_id + self.num_points, dtype=torch.int64)
        # Every per-Gaussian tensor, and every operation on them (gaussians/rows.py).
        self.rows = GaussianRows(
            gaussian_schema(parameter_fields(self.config.sh_degree), self.densifier.statistics),
            self.gauss_params,
            strategy_state,
        )
        # Set by a parallel mode whose views are collectives (parallel/sharded.py): get_outputs
        # renders through it; None renders this model's own Gaussians.
        self.view_renderer: Callable[[Cameras], dict[str, torch.Tensor] | None] | None = None
        if self.config.param_dtype == "float64":
            self.gauss_params.to(torch.float64)
            if self.config.use_bilateral_grid:
                self.bil_grids.to(torch.float64)
            self.camera_optimizer.to(torch.float64)  # the pose adjustments, as the Gaussians

    @property
    def strategy_state(self) -> dict[str, Any]:
        """The strategy state: the statistics and ids of :attr:`rows` (the same dict)."""
        return self.rows.state  # type: ignore[return-value]

    def get_gaussian_param_groups(self) -> dict[str, list[torch.nn.Parameter]]:
        """One optimizer group per trained per-Gaussian field of the schema (``gaussians/rows.py``)."""
        return {name: [p] for name, p in self.rows.parameters()}

    @property
    def gauss_ids(self) -> torch.Tensor:
        """Global identity of each Gaussian held here, in parameter order. `[N]`, int64, on the
        model's device (new Gaussians get ids from the densifier's ``next_id`` on; docs/sharded.md)."""
        return self.rows.ids

    def _apply(self, fn: Callable, *args: Any, **kwargs: Any) -> DistSplatModel:
        # nn.Module's to/cuda/cpu go through here. The row state (ids, statistics) is a plain dict,
        # not buffers, so it follows the parameters here: every reader finds it on their device.
        super()._apply(fn, *args, **kwargs)
        if "rows" in self.__dict__:
            self.rows.follow_parameters_()
        return self

    @property
    def compute_dtype(self) -> torch.dtype:
        """The dtype of the Gaussians, used for everything rendered and compared with them."""
        return self.means.dtype

    # ------------------------------------------------------------------ checkpoint state
    def get_extra_state(self) -> dict[str, Any]:
        """Densification statistics and ids (``GaussianRows.saved_state``) and the densifier's id
        counter (``next_gauss_id``), so a resumed run refines exactly as an uninterrupted one."""
        return {
            "strategy_state": self.rows.saved_state(),
            "step": int(self.step),
            "next_gauss_id": int(self.densifier.next_id),
        }

    def set_extra_state(self, state: Any) -> None:
        if not isinstance(state, dict):
            return
        self.rows.load_saved_state(state.get("strategy_state", {}), self.device)
        if "next_gauss_id" in state:
            self.densifier.next_id = int(state["next_gauss_id"])
        else:
            num = len(self.rows)
            self.densifier.next_id = int(self.strategy_state[IDS].max()) + 1 if num else 0

    def load_state_dict(self, dict, **kwargs):  # type: ignore[override]
        # Checkpoints of splatfacto carry LPIPS weights (and older distsplat ones, where eval built
        # it, under "_lpips."): this model's LPIPS is built lazily outside its state; drop them.
        dict = {k: v for k, v in dict.items() if not k.startswith(("lpips.", "_lpips."))}
        # A Gaussian parameter the checkpoint lacks would load as splatfacto's zeros without a word
        # (nerfstudio retries a failed strict load without strict): refuse it, naming what is missing.
        missing = [name for name in self.gauss_params if f"gauss_params.{name}" not in dict and name not in dict]
        if missing:
            raise UserError(
                f"the checkpoint has no Gaussian parameter {', '.join(missing)} (this model trains {', '.join(self.gauss_params)}): "
                "it was written by another model, or it is damaged"
            )
        # Splatfacto's load re-creates the Gaussian parameters with torch.zeros in the default
        # dtype before copying the checkpoint in: without this a float64-mode run resumed in
        # float32 (tests/multiproc/test_mcmc_training.py, the resumed run).
        with default_dtype(self.compute_dtype):
            return super().load_state_dict(dict, **kwargs)

    # ------------------------------------------------------------------ schedules (in images)
    def images_seen(self, step: int) -> int:
        """Training images consumed before ``step``."""
        return step * self.batch_size

    def downscale_factor_at(self, step: int) -> int:
        """Splatfacto's resolution schedule, counted in images (``resolution_schedule``)."""
        return self.resolution_schedule(step)

    def _get_downscale_factor(self) -> int:
        return self.downscale_factor_at(self.step) if self.training else 1

    def sh_degree_at(self, step: int) -> int | None:
        if self.config.sh_degree == 0:
            return None
        return min(self.images_seen(step) // self.config.sh_degree_interval, self.config.sh_degree)

    def get_training_callbacks(
        self, training_callback_attributes: TrainingCallbackAttributes
    ) -> list[TrainingCallback]:
        # Densification is driven by the pipeline after the gradient reduction (``densifier``), not
        # by a callback reading state a forward pass left on ``self``.
        return [
            TrainingCallback(
                [TrainingCallbackLocation.BEFORE_TRAIN_ITERATION],
                self.step_cb,
                args=[training_callback_attributes.optimizers],
            )
        ]

    # ------------------------------------------------------------------ rendering helpers
    def _activated(self, raw: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Rendering inputs from ``raw`` parameters (``gauss_params`` names; this model's own when None)."""
        raw = self.gauss_params if raw is None else raw
        colors = torch.cat((raw["features_dc"][:, None, :], raw["features_rest"]), dim=1)
        if self.config.sh_degree == 0:
            colors = torch.sigmoid(colors).squeeze(1)
        return {
            "means": raw["means"],
            "quats": raw["quats"],
            "scales": torch.exp(raw["scales"]),
            "opacities": torch.sigmoid(raw["opacities"]).squeeze(-1),
            "colors": colors,
        }

    def training_background(self, step: int, position: int) -> torch.Tensor:
        """Background colour of image ``position`` of the batch at ``step``: the same on every rank.

        Splatfacto draws a random background per step from the global generator; here it comes
        from a generator seeded by (seed, step, position), so every rank that renders a band of
        that image composites the same colour.
        """
        if self.config.background_color != "random":
            return to_device(get_color(self.config.background_color).to(self.compute_dtype), self.device)
        gen = torch.Generator(device="cpu")
        gen.manual_seed((self.seed * 1_000_003 + step) * 4099 + position)
        return to_device(torch.rand(3, generator=gen).to(self.compute_dtype), self.device)

    def render_inputs(self, cameras: Cameras, downscale: int) -> RenderInputs:
        """View matrices `[C, 4, 4]`, intrinsics `[C, 3, 3]` (on the model's device, scaled by
        ``downscale``) and each camera's rendered ``(width, height)``.

        Pass host-side cameras where possible (training does): their sizes and intrinsics are then
        made without a device sync, and only the poses and intrinsics are sent, without waiting.
        """
        sizes = rendered_sizes_px(cameras, downscale)  # a host sync only for device-side cameras (eval, viewer)
        Ks = cameras.get_intrinsics_matrices().to(self.compute_dtype)  # nerfstudio builds K on the host
        Ks[:, :2, :] /= downscale
        # Training renders use each camera's adjusted pose, eval and the viewer the given one (splatfacto's rule).
        c2w = adjusted_camera_to_worlds(self.camera_optimizer, cameras) if self.training else cameras.camera_to_worlds
        viewmats = c2w_to_viewmat(to_device(c2w, self.device).to(self.compute_dtype))
        return RenderInputs(viewmats, to_device(Ks, self.device), sizes)

    def project_cameras(self, cameras: Cameras, step: int) -> list[tuple[list[int], Projection]]:
        """This model's Gaussians projected into every camera of ``cameras`` at ``step``'s
        resolution, as ``(camera indices, projection)`` calls: one call when the cameras share a
        rendered size, otherwise one per camera. ``means2d`` retains its gradient.

        **Differentiable:** with respect to the Gaussian parameters (and camera adjustments).
        """
        downscale = self.downscale_factor_at(step)
        sizes = rendered_sizes_px(cameras, downscale)
        groups = [list(range(len(cameras)))] if len(set(sizes)) == 1 else [[i] for i in range(len(cameras))]
        calls = []
        for group in groups:
            inputs = self.render_inputs(cameras_at(cameras, group), downscale)
            calls.append((group, self.project_gaussians(inputs.viewmats, inputs.Ks, inputs.width, inputs.height, step)))
        return calls

    def project_gaussians(
        self, viewmats: torch.Tensor, Ks: torch.Tensor, width: int, height: int, step: int
    ) -> Projection:
        """This model's Gaussians projected into the cameras ``viewmats``/``Ks`` (``render_inputs``)
        at ``step``'s SH degree: the one projection call of training (bands, the sharded exchange,
        the balancer's footprint priors).

        **Differentiable:** with respect to the Gaussian parameters (and camera adjustments).
        """
        return project(
            **self._activated(),
            viewmats=viewmats,
            Ks=Ks,
            width=width,
            height=height,
            sh_degree=self.sh_degree_at(step),
            rasterize_mode=self.config.rasterize_mode,
            backend=self.config.rendering_backend,
        )

    # ------------------------------------------------------------------ training forward
    def forward_bands(
        self,
        cameras: BatchCameras[Cameras],
        positions: Sequence[int],
        images: Sequence[torch.Tensor],
        masks: Sequence[torch.Tensor | None],
        bands: Sequence[Band],
        step: int,
        regularizers: RegularizerShare,
        source: ProjectionSource | None = None,
        camera_ids: Sequence[int] | None = None,
    ) -> BandRenderResult:
        """Render this rank's bands of the step's batch and compute its share of the loss.

        Args:
            cameras: The batch's cameras (indexed only where the source projects them).
            positions: Batch positions of the images this rank renders (``0 <= p < B``).
            images: Their ground-truth images. Each `[H, W, 3 or 4]` uint8.
            masks: Their masks `[H, W, 1]` or None.
            bands: This rank's bands (rows at the resolution rendered this step); each band's
                ``position`` is one of ``positions``. May be empty: the rank renders nothing.
            step: The training step.
            regularizers: Which batch-independent loss terms this rank adds (``RegularizerShare``).
            source: What the bands are rasterized from; this rank's own Gaussians when None
                (``OwnProjections``).
            camera_ids: The training-camera index of each of ``positions`` (which bilateral grid
                corrects it); required with ``use_bilateral_grid``.

        Returns:
            The rank's loss share and what the pipeline reduces after backward.

        **Differentiable:** with respect to every Gaussian parameter (and camera adjustments), or
        to the source's terms.
        """
        if len(images) != len(positions) or len(masks) != len(positions):
            raise ValueError(f"forward_bands: {len(positions)} positions, {len(images)} images, {len(masks)} masks")
        if self.config.use_bilateral_grid and (camera_ids is None or len(camera_ids) != len(positions)):
            raise ValueError(f"forward_bands: the bilateral grid needs one camera id per position, got {camera_ids!r}")
        zero = self.means.new_zeros(())
        bil_grids = self.bil_grids if self.config.use_bilateral_grid else None
        regularizer_loss, loss_terms = self.band_terms.regularizers(
            step, regularizers, self.opacities, self.scales, self.training, bil_grids, self.camera_optimizer
        )
        if not bands:
            return BandRenderResult(loss=regularizer_loss, l1=zero, dssim=zero, loss_terms=loss_terms)
        source = OwnProjections() if source is None else source
        downscale = self.downscale_factor_at(step)
        sizes_px = cameras.sizes_px(positions, downscale)
        backgrounds = [self.training_background(step, p) for p in positions]
        gts, gt_masks = self.band_terms.ground_truths(images, masks, backgrounds, downscale, sizes_px)

        result = BandRenderResult(loss=zero, l1=zero, dssim=zero, projections=source.calls, loss_terms=loss_terms)
        l1_total, dssim_total = zero, zero
        for first, proj, raster_calls in source.render_groups(self, positions, bands, cameras, downscale, step):
            height = sizes_px[first][1]  # the cameras of one projection share one size
            if self.config.output_depth_during_training:
                proj = with_depth_channel(proj)  # splatfacto renders RGB+ED while training with the flag
            for call in raster_calls:  # one band per projected camera, all of the same rendered height
                rows = halo_end_row(call[0].end_row_px(height), height) - call[0].first_row_px
                out = rasterize_rows(
                    proj, [b.first_row_px for b in call], rows, tile_size=TILE_SIZE, absgrad=self.config.use_absgrad
                )
                for k, band in enumerate(call):
                    i = first + k
                    grid = None if camera_ids is None or not self.config.use_bilateral_grid else camera_ids[i]
                    l1, dssim = self.band_terms.band_terms(
                        out.colors[k],
                        out.alphas[k],
                        gts[i],
                        gt_masks[i],
                        backgrounds[i],
                        band,
                        height,
                        result.pixel_links,
                        bil_grids,
                        grid,
                    )
                    l1_total, dssim_total = l1_total + l1, dssim_total + dssim
                    if self.config.output_depth_during_training:
                        result.band_depths.append(band_depth(band, height, out.colors[k], out.alphas[k]))
                    result.band_tile_work.append((band, out.tile_work[k][: band.num_cost_rows(height)]))

        lam = self.config.ssim_lambda
        result.loss = ((1 - lam) * l1_total + lam * dssim_total) / self.batch_size + regularizer_loss
        result.l1 = (l1_total / self.batch_size).detach()
        result.dssim = (dssim_total / self.batch_size).detach()
        return result

    # ------------------------------------------------------------------ eval, export and viewer
    def get_outputs(self, camera: Cameras) -> dict[str, torch.Tensor | list] | None:
        """Render one whole camera for eval, export and the viewer (``model/eval_outputs.py:render_view``).

        Returns:
            nerfstudio's outputs; None on a rank other than 0 whose mode renders views as
            collectives (it took part, rank 0 holds the image).

        **Collective:** only through ``view_renderer`` (sharded training: on every rank in the
        same order from the training thread; a viewer thread's call posts the camera instead).
        Without one, local.
        """
        if not isinstance(camera, Cameras):
            raise TypeError(f"get_outputs expects nerfstudio Cameras, got {type(camera).__name__}")
        if camera.shape[0] != 1:
            raise ValueError(f"get_outputs renders one camera at a time, got {camera.shape[0]}")
        if self.view_renderer is not None:
            return self.view_renderer(camera)
        raw = self.gauss_params
        crop_ids = None
        if self.crop_box is not None and not self.training:
            crop_ids = self.crop_box.within(raw["means"]).squeeze()
            if crop_ids.sum() == 0:
                return self.get_empty_outputs(
                    int(camera.width.item()), int(camera.height.item()), self._get_background_color()
                )
        params = self._activated(raw)
        if crop_ids is not None:
            params = {k: v[crop_ids] for k, v in params.items()}
        inputs = self.render_inputs(camera, self._get_downscale_factor())
        return render_view(
            params, inputs, self._get_background_color(), self.sh_degree_at(self.step), self.training, self.config
        )

    def _get_background_color(self) -> torch.Tensor:
        if self.config.background_color == "random":
            # Only the eval/viewer path reaches here; training uses training_background().
            return self.background_color.to(self.device)
        return get_color(self.config.background_color).to(self.device)

    def get_image_metrics_and_images(
        self, outputs: dict[str, torch.Tensor], batch: dict[str, torch.Tensor]
    ) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        """An eval image's metrics and the side-by-side image (``EvalMetrics.measure``)."""
        gt_rgb = self.composite_with_background(self.get_gt_img(batch["image"]), outputs["background"])
        return self.eval_metrics.measure(gt_rgb, outputs["rgb"])
