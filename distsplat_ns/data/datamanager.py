"""ParallelFullImageDatamanager: nerfstudio glue around the shared-byte image stream.

Unlike nerfstudio 1.1.5's FullImageDatamanager, which decodes every image up front, it keeps the
encoded files in one shared buffer per host (``store.py``) and lets DataLoader workers decode each
rank's share of every step (``stream.py``, ``reader.py``). Its datasets' ``cameras`` carry the
undistorted intrinsics (``image_specs.py``); the pipeline calls ``configure_training`` once, then
``step_batch(step)`` once per step; nerfstudio's own ``next_train`` / ``next_eval`` keep working;
bad data fails at construction on every rank alike (``preflight.py``). Interface and design:
docs/data.md.

Shape legend: ``H``, ``W``: pixels. ``C``: cameras.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from nerfstudio.cameras.cameras import Cameras
from nerfstudio.configs.dataparser_configs import AnnotatedDataParserUnion
from nerfstudio.data.datamanagers.base_datamanager import DataManager, DataManagerConfig
from nerfstudio.data.dataparsers.base_dataparser import DataparserOutputs
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from nerfstudio.data.datasets.base_dataset import InputDataset
from torch.nn import Parameter

from distsplat_ns.data import order, preflight
from distsplat_ns.data.dataparse import DownscaledParse
from distsplat_ns.data.decode import DECODER_CHOICES, DecoderChoice, default_decoder
from distsplat_ns.data.eval_split import EvalImages, EvalSplit
from distsplat_ns.data.image_loader import ImageLoader, ImageSpec
from distsplat_ns.data.image_specs import image_specs, undistort_cameras
from distsplat_ns.data.reader import TrainBatch, TrainBatchReader
from distsplat_ns.data.step_batch import StepBatch
from distsplat_ns.data.store import EncodedImageStore, HostShare, LocalHost
from distsplat_ns.data.stream import Assigner, ImageBatchStream
from distsplat_ns.data.upload import DeviceUploader
from distsplat_ns.data.workers import start_worker_server
from distsplat_ns.distributed.context import DistContext
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.logging import get_logger, log_rank0
from distsplat_ns.utils.units import format_bytes

_LOGGER = get_logger(__name__)

_FLAG_PREFIX = "--pipeline.datamanager."

_AUTO_RAM_FRACTION = 0.25
"""Share of the host's memory available at start-up that the encoded training files may take when
``ram_budget_bytes`` is 0: it leaves room for the models, optimizers and images in flight of every
local rank. The files are held once per host (docs/data.md, "One store per host"), so the share is not divided by the
number of local ranks."""


def flag(field_name: str) -> str:
    """The ``ns-train`` flag of a ``ParallelFullImageDatamanagerConfig`` field."""
    return _FLAG_PREFIX + field_name.replace("_", "-")


@dataclass
class ParallelFullImageDatamanagerConfig(DataManagerConfig):
    """Configuration of ``ParallelFullImageDatamanager``."""

    _target: type = field(default_factory=lambda: ParallelFullImageDatamanager)
    dataparser: AnnotatedDataParserUnion = field(default_factory=NerfstudioDataParserConfig)
    """Which dataparser reads the scene (nerfstudio-data, colmap, blender-data, ...)."""
    camera_res_scale_factor: float = 1.0
    """Resize factor applied to images, masks and intrinsics at decode time (as nerfstudio's
    FullImageDatamanager). 1.0 keeps the files' resolution."""
    num_workers: int = 2
    """DataLoader worker processes decoding training images, per rank. Each decodes about one
    core's worth of JPEGs (~180 1080p images/s with simplejpeg); 0 decodes in the training process."""
    prefetch_batches: int = 4
    """Steps decoded ahead of the training loop. A few steps absorb decode-time jitter; each
    costs B/world_size decoded images of RAM (6 MB per 1080p image)."""
    ram_budget_bytes: int = 0
    """Most bytes of encoded training files kept in RAM on one host, where its local ranks share
    one copy. 0: a quarter of the memory available at start-up on the host (as its lowest rank
    sees it). Above the budget, every local rank's workers read the files from disk (decided and
    logged once per host)."""
    decoder: DecoderChoice = "auto"
    """JPEG decoder. auto: the fastest measured (simplejpeg, then torchvision, then PIL; see
    docs/data.md). PNG and other formats always use PIL."""
    skip_corrupt_images: bool = False
    """Log and drop undecodable training images instead of failing (a truncated JPEG is then logged at
    start-up instead of refused, and dropped when drawn). Off by default: a corrupt file is a data
    problem the user should see."""
    eval_num_workers: int = 2
    """DataLoader workers decoding eval images for fixed_indices_eval_dataloader (0: in process)."""

    def __post_init__(self) -> None:
        checks = (
            ("camera_res_scale_factor", self.camera_res_scale_factor > 0, "> 0"),
            ("num_workers", self.num_workers >= 0, ">= 0"),
            ("eval_num_workers", self.eval_num_workers >= 0, ">= 0"),
            ("prefetch_batches", self.prefetch_batches >= 1, ">= 1"),
            ("ram_budget_bytes", self.ram_budget_bytes >= 0, ">= 0 (0: a quarter of the available memory)"),
            ("decoder", self.decoder in DECODER_CHOICES, f"one of {DECODER_CHOICES}"),
        )
        for name, ok, expected in checks:
            if not ok:
                raise UserError(f"{flag(name)} must be {expected}, got {getattr(self, name)!r}")


class ParallelFullImageDatamanager(DataManager):
    """Full-image datamanager decoding encoded files in DataLoader workers, sharded across ranks
    (its eval split: ``eval_split``, a ``data/eval_split.py:EvalSplit``).

    Args:
        config: The configuration.
        device: Where ``next_train`` / eval batches and cameras go.
        test_mode: ``"val"``, ``"test"`` or ``"inference"`` (no image is read in inference).
        world_size: Number of processes (informational; ``configure_training`` sets the split).
        local_rank: Device index on this host (informational).
        dist_ctx: The process context: the ranks of one host share one store of the training
            files (``distributed/host_share.HostGroup``). None or one process: a store of its own.

    Attributes:
        train_dataset: nerfstudio ``InputDataset``; ``cameras`` hold undistorted intrinsics.
        eval_dataset: Same for the eval split.
        train_dataparser_outputs: The dataparser's train outputs (original, distorted cameras).
    """

    config: ParallelFullImageDatamanagerConfig
    train_dataset: InputDataset
    eval_dataset: InputDataset

    def __init__(
        self,
        config: ParallelFullImageDatamanagerConfig,
        device: torch.device | str = "cpu",
        test_mode: Literal["test", "val", "inference"] = "val",
        world_size: int = 1,
        local_rank: int = 0,
        seed: int = 42,
        dist_ctx: DistContext | None = None,
        **kwargs,
    ) -> None:
        del kwargs
        if not isinstance(seed, int) or seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {seed!r}")
        self.config = config
        self.device = device
        self.world_size = world_size
        self.local_rank = local_rank
        self.seed = seed
        self.dist_ctx = dist_ctx
        self.sampler = None
        self.test_mode = test_mode
        self.test_split = "test" if test_mode in ["test", "inference"] else "val"
        # --data (the datamanager's) overrides the dataparser's own path. The configs stay as
        # built: the dataparser is set up from a copy holding the effective path.
        if config.data is not None:
            self.data_path = Path(config.data)
            self.dataparser_config = dataclasses.replace(config.dataparser, data=self.data_path)
            data_flag = "--data"
        else:
            self.data_path = Path(config.dataparser.data)
            self.dataparser_config = config.dataparser
            data_flag = "the dataparser's --data"
        preflight.check_data_path(self.data_path, data_flag)
        # Never prompts: a downscale factor without its images_N folder is decoded at 1/N (dataparse.py).
        self._parse = DownscaledParse(self.dataparser_config)
        self.dataparser = self._parse.dataparser
        if self._parse.source_downscale > 1:
            log_rank0(
                _LOGGER,
                "%s not found: decoding the images at 1/%d of their files' size on the fly (no folder is written)",
                self._parse.missing_folder,
                self._parse.source_downscale,
            )
        if test_mode == "inference":
            self.dataparser.downscale_factor = 1  # Avoid opening images (as nerfstudio).
        self.includes_time = self.dataparser.includes_time
        self.decoder = default_decoder() if config.decoder == "auto" else config.decoder
        # Pinned host memory and non-blocking copies on a CUDA device, plain tensors on CPU (upload.py).
        self._uploader = DeviceUploader(device)

        self.train_dataparser_outputs: DataparserOutputs = self._parse.get_dataparser_outputs(split="train")
        self.train_dataset = InputDataset(self.train_dataparser_outputs, scale_factor=config.camera_res_scale_factor)
        self.eval_dataset = InputDataset(
            self._parse.get_dataparser_outputs(split=self.test_split), scale_factor=config.camera_res_scale_factor
        )
        self._train_specs = self._prepare_cameras(self.train_dataset)
        self._eval_specs = self._prepare_cameras(self.eval_dataset)
        self.exclude_batch_keys_from_device = list(self.train_dataset.exclude_batch_keys_from_device)
        self.train_cameras = self.train_dataset.cameras

        self._train_loader: ImageLoader | None = None
        self._reader: TrainBatchReader | None = None
        self._training: tuple[int, int, int, Assigner | None, Callable[[int], int] | None] | None = None
        self._compat_mode = False
        self._logged_large_batch = False
        self.eval_split = EvalSplit(
            self.eval_dataset,
            functools.partial(self._build_loader, self.eval_dataset, self._eval_specs, 0, "eval images"),
            self._to_device_data,
            device,
            config.eval_num_workers,
            seed,
        )
        self._totals = {"num_images_delivered": 0, "decode_s": 0.0, "wait_s": 0.0, "num_batches": 0}
        self._skipped: list[int] = []
        super().__init__()

    # ------------------------------------------------------------------ setup
    def _prepare_cameras(self, dataset: InputDataset) -> list[ImageSpec]:
        heights = [int(h) for h in dataset.cameras.height[:, 0].tolist()]
        widths = [int(w) for w in dataset.cameras.width[:, 0].tolist()]
        undistort = undistort_cameras(dataset.cameras)
        return image_specs(dataset, undistort, heights, widths, self._parse.source_downscale)

    def _ram_budget_bytes(self) -> int:
        """This host's budget for the training files (only the host's leader's value counts)."""
        if self.config.ram_budget_bytes > 0:
            return self.config.ram_budget_bytes
        import psutil

        # One store per host (docs/data.md, "One store per host"): the host's share, not divided between its local ranks.
        return int(_AUTO_RAM_FRACTION * psutil.virtual_memory().available)

    def _host_share(self) -> HostShare:
        """The local ranks sharing this host's store. **Collective** in a process group (one
        all-gather of the host keys, in ``setup_train``, which every rank runs while the pipeline is built)."""
        if self.dist_ctx is None or not self.dist_ctx.is_distributed:
            return LocalHost()
        from distsplat_ns.distributed.host_share import HostGroup

        return HostGroup(self.dist_ctx)

    def _build_loader(
        self, dataset: InputDataset, specs: list[ImageSpec], budget: int, name: str, host: HostShare | None = None
    ) -> ImageLoader:
        """Check the files (all present, headers readable, sizes matching the cameras, JPEGs complete), then load them
        (into the host's shared store when ``budget`` > 0: **collective** with ``host``, the same calls on every rank)."""
        outputs: DataparserOutputs = dataset._dataparser_outputs
        images = EncodedImageStore(outputs.image_filenames, budget, name=name, host=host)
        masks = None
        if outputs.mask_filenames is not None:
            # The leader's budget and decision, the same on every local rank: so is this call.
            remaining = max(images.budget_bytes - images.num_bytes, 0) if not images.disk_mode else 0
            masks = EncodedImageStore(outputs.mask_filenames, remaining, name=f"{name} masks", host=host)
        # skip_corrupt_images drops undecodable training images when drawn: a truncated one is then logged, not refused.
        preflight.check_image_headers(
            images.paths,
            specs,
            masks.paths if masks is not None else None,
            what=name.removesuffix("s"),
            truncated_ok=self.config.skip_corrupt_images and name == "train images",
        )
        return ImageLoader(images, specs, masks, decoder=self.decoder)

    def setup_train(self) -> None:
        """Check the training files and read them into the shared buffer (or only check them, in disk mode).

        Raises:
            FileNotFoundError: Training files are missing (listed on one line).
            ValueError: A file's header is unreadable, its size does not match its camera, or a JPEG
                has no end-of-image marker (truncated; logged instead with ``skip_corrupt_images``), named.
        """
        if self._train_loader is not None:
            return
        if self.config.num_workers > 0:
            start_worker_server()
        self._train_loader = self._build_loader(
            self.train_dataset, self._train_specs, self._ram_budget_bytes(), "train images", host=self._host_share()
        )
        store = self._train_loader.images
        log_rank0(
            _LOGGER,
            "%d train images: %s encoded, %s (decoder %s, %d workers)",
            len(store),
            format_bytes(store.num_bytes),
            "read from disk"
            if store.disk_mode
            else f"in memory shared by the {store.num_local_ranks} local rank(s) of each host",
            self.decoder,
            self.config.num_workers,
        )

    def _require_train_loader(self) -> ImageLoader:
        if self._train_loader is None:
            self.setup_train()
        assert self._train_loader is not None
        return self._train_loader

    # ------------------------------------------------------------------ training stream
    def configure_training(
        self,
        batch_size: int,
        rank: int,
        world_size: int,
        start_step: int = 0,
        assigner: Assigner | None = None,
        downscale_at: Callable[[int], int] | None = None,
    ) -> None:
        """(Re)start the training stream: global batch size, this rank, the split, the first step.

        Args:
            batch_size: Global images per step, ``B`` (same on every rank).
            rank: Global index of this process.
            world_size: Number of processes.
            start_step: The first step ``next_train_batch`` will be asked for (resume point).
            assigner: Split of each batch across ranks (``positions_for_rank``, picklable);
                ``order.ContiguousAssigner()`` if None.
            downscale_at: The render downscale of a step (the model's resolution schedule, e.g.
                ``model.downscale_factor_at``): step ``t``'s images are decoded at
                ``1 / downscale_at(t)``, i.e. ``utils.cameras.downscaled_px`` of the cameras'
                sizes. Called in the workers (pickled for spawn/forkserver). None: always 1.

        Raises:
            ValueError: Bad batch size, rank, world size or start step.
            TypeError: ``downscale_at`` is not callable.
        """
        for name, value, minimum in (
            ("batch_size", batch_size, 1),
            ("world_size", world_size, 1),
            ("start_step", start_step, 0),
        ):
            if not isinstance(value, int) or value < minimum:
                raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
        if not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
        if downscale_at is not None and not callable(downscale_at):
            raise TypeError(f"downscale_at must be a callable step -> int or None, got {type(downscale_at).__name__}")
        num_images = len(self.train_dataset)
        if batch_size > num_images and not self._logged_large_batch:
            self._logged_large_batch = True
            log_rank0(
                _LOGGER,
                "batch size %d is larger than the %d training images: a step uses some images twice "
                "(from consecutive epochs; every image still once per epoch)",
                batch_size,
                num_images,
                level=logging.WARNING,
            )
        self._close_reader()
        stream = ImageBatchStream(
            self._require_train_loader(),
            batch_size=batch_size,
            seed=self.seed,
            rank=rank,
            world_size=world_size,
            start_step=start_step,
            assigner=assigner,
            skip_corrupt_images=self.config.skip_corrupt_images,
            downscale_at=downscale_at,
        )
        self._reader = TrainBatchReader(
            stream, self.config.num_workers, self.config.prefetch_batches, pin_memory=self._uploader.pin_memory
        )
        self._training = (batch_size, rank, world_size, assigner, downscale_at)
        self._compat_mode = False

    def step_batch(self, step: int) -> StepBatch:
        """The training step's data, asked for once (``step_batch.py``): the global batch's camera
        ids (``batch_camera_ids``) now; this rank's images and masks on the device
        (``StepBatch.on_device``) once the plan says which positions it renders -- the stream's
        (``next_train_batch``), any other decoded on demand (``get_images_and_masks``), uploaded
        without blocking (``to_device``).

        Raises:
            RuntimeError: ``configure_training`` was not called.
        """
        return StepBatch(
            step,
            self.batch_camera_ids(step),
            functools.partial(self.next_train_batch, step),
            functools.partial(self.get_images_and_masks, step=step),
            self.to_device,
        )

    def batch_camera_ids(self, step: int) -> list[int]:
        """The global batch of dataset indices for ``step`` (same on every rank).

        Raises:
            RuntimeError: ``configure_training`` was not called.
        """
        if self._training is None:
            raise RuntimeError("call configure_training(batch_size, rank, world_size) before batch_camera_ids")
        return order.batch_camera_ids(self.seed, len(self.train_dataset), self._training[0], step)

    def next_train_batch(self, step: int) -> TrainBatch:
        """This rank's decoded images of ``step``.

        Steps must be requested in increasing order from ``configure_training``'s ``start_step``;
        any other step restarts the stream there (logged as a warning: it costs a pipeline refill).

        Raises:
            RuntimeError: ``configure_training`` was not called, or a worker failed earlier.
            ValueError: A corrupt, truncated or wrongly-sized image (the message names the file),
                re-raised from the worker, unless ``skip_corrupt_images``.
        """
        if self._training is None or self._reader is None:
            raise RuntimeError(
                "call configure_training(batch_size, rank, world_size, start_step) before next_train_batch"
            )
        if step != self._reader.next_step:
            _LOGGER.warning(
                "next_train_batch(%d) but the stream is at step %d: restarting the stream at %d",
                step,
                self._reader.next_step,
                step,
            )
            batch_size, rank, world_size, assigner, downscale_at = self._training
            self.configure_training(
                batch_size, rank, world_size, start_step=step, assigner=assigner, downscale_at=downscale_at
            )
            assert self._reader is not None
        return self._reader.next_batch(step)

    def get_images(self, camera_indices: list[int], step: int | None = None) -> list[torch.Tensor]:
        """Decode training images in this process, without their masks (see ``get_images_and_masks``).

        Returns:
            One image per index. `[H, W, 3 or 4]`, uint8, CPU.
        """
        return [image for image, _ in self.get_images_and_masks(camera_indices, step)]

    def get_images_and_masks(
        self, camera_indices: list[int], step: int | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Decode training images and their masks in this process (fallback for images the stream
        did not deliver): exactly what the stream delivers for them, masks included.

        Args:
            camera_indices: Dataset indices.
            step: Decode at this step's render downscale (``configure_training``'s
                ``downscale_at``); None: at full training resolution.

        Returns:
            One ``(image, mask)`` per index: image `[H, W, 3 or 4]`, uint8, CPU; mask
            `[H, W, 1]` bool at full training resolution (as the stream's), or None without masks.
        """
        loader = self._require_train_loader()
        downscale = 1
        if step is not None and self._reader is not None:
            downscale = self._reader.stream.downscale(step)
        return [loader.load(int(i), downscale=downscale) for i in camera_indices]

    def to_device(
        self, images: list[torch.Tensor], masks: list[torch.Tensor | None]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Images and masks on the manager's device, byte for byte (``upload.DeviceUploader``): on
        CUDA through pinned host memory with non-blocking copies on a copy stream, ordered before
        their first use on the current stream; on CPU the tensors as they are.

        **Host sync:** none.
        """
        moved = self._uploader.upload([*images, *masks])
        return moved[: len(images)], moved[len(images) :]  # type: ignore[return-value]

    def _close_reader(self) -> None:
        if self._reader is None:
            return
        reader, self._reader = self._reader, None
        self._totals["num_images_delivered"] += reader.num_images_delivered
        self._totals["decode_s"] += reader.decode_s
        self._totals["wait_s"] += reader.wait_s
        self._totals["num_batches"] += reader.next_step - reader.stream.start_step
        self._skipped.extend(reader.skipped_indices)
        reader.close()

    def close(self) -> None:
        """Stop the training workers."""
        self._close_reader()
        self._training = None

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown, modules may already be gone
            self._close_reader()

    def stats(self) -> dict:
        """Counters: store bytes, disk mode, whether this rank filled the host's store and how many local
        ranks share it, images delivered, decode and wait seconds, skipped images."""
        totals = dict(self._totals)
        skipped = list(self._skipped)
        if self._reader is not None:
            totals["num_images_delivered"] += self._reader.num_images_delivered
            totals["decode_s"] += self._reader.decode_s
            totals["wait_s"] += self._reader.wait_s
            totals["num_batches"] += self._reader.next_step - self._reader.stream.start_step
            skipped += self._reader.skipped_indices
        store = self._train_loader.images if self._train_loader is not None else None
        return {
            "num_train_images": len(self.train_dataset),
            "store_bytes": store.num_bytes if store is not None else 0,
            "disk_mode": store.disk_mode if store is not None else None,
            "store_num_filled": store.num_filled() if store is not None else 0,
            "store_filler": store.is_filler if store is not None else False,
            "store_num_local_ranks": store.num_local_ranks if store is not None else 1,
            "decoder": self.decoder,
            "num_workers": self.config.num_workers,
            **totals,
            "skipped_indices": skipped,
        }

    # ------------------------------------------------------------------ nerfstudio interface
    def setup_eval(self) -> None:
        """Check the eval files as the training files (``EvalSplit.setup``)."""
        self.eval_split.setup()

    def next_eval(self, step: int) -> tuple[Cameras, dict]:
        """A random eval image (see ``next_eval_image``)."""
        return self.next_eval_image(step=step)

    def next_eval_image(self, step: int) -> tuple[Cameras, dict]:
        """A random eval image, each once before any repeats (``EvalSplit.next_image``)."""
        del step
        return self.eval_split.next_image()

    @property
    def fixed_indices_eval_dataloader(self) -> EvalImages:
        """Every eval image as ``(camera, data)``, decoded lazily (``EvalSplit.all_images``)."""
        return self.eval_split.all_images()

    def _to_device_data(self, index: int, image: torch.Tensor, mask: torch.Tensor | None) -> dict:
        # uint8 to the device: the model converts there (gt_image, splatfacto's get_gt_img), so the
        # host never runs a 1080p float conversion per image (it was 70% of the training process's CPU).
        (image,), (mask,) = self.to_device([image], [mask])
        data: dict = {"image_idx": index, "image": image}
        if mask is not None:
            data["mask"] = mask
        return data

    def next_train(self, step: int) -> tuple[Cameras, dict]:
        """One training image per call, nerfstudio style (batch size 1, every rank the same images).

        Returns:
            ``(camera, data)``: one camera on ``device`` (``metadata["cam_idx"]``), and
            ``{"image": [H, W, C] uint8 on device, "image_idx": int, ("mask")}``.
        """
        if not self._compat_mode or self._reader is None:
            self.configure_training(1, 0, 1, start_step=step)
            self._compat_mode = True
        assert self._reader is not None
        # nerfstudio's step only sets the start: the stream then runs on by itself, so that an
        # image skipped as corrupt is replaced by the next one rather than stalling the loop.
        batch = self._reader.next_batch(self._reader.next_step)
        while not batch.images:
            batch = self._reader.next_batch(self._reader.next_step)
        index = batch.camera_indices[0]
        camera = self.train_cameras[index : index + 1].to(self.device)
        if camera.metadata is None:
            camera.metadata = {}
        camera.metadata["cam_idx"] = index
        return camera, self._to_device_data(index, batch.images[0], batch.masks[0])

    def get_param_groups(self) -> dict[str, list[Parameter]]:
        """No trainable parameters."""
        return {}

    def get_train_rays_per_batch(self) -> int:
        """Pixels of one training image (the first camera's undistorted size)."""
        cameras = self.train_dataset.cameras
        return int(cameras.height[0, 0]) * int(cameras.width[0, 0])

    def get_datapath(self) -> Path:
        """The scene's data path (``--data`` when given, else the dataparser's)."""
        return self.data_path
