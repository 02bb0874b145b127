"""The training image stream: an IterableDataset whose DataLoader workers decode each rank's share.

Pure: torch only (plus the sibling pure modules).

Who decodes what (docs/data.md):
- Step ``t``'s global batch is ``batch_camera_ids(seed, num_images, B, t)``, the same on every rank.
- The assigner says which positions of it this rank needs (contiguous split by default).
- Worker ``w`` of ``K`` takes the ``j``-th of those positions when ``(j + t) % K == w``: each image
  is decoded by one worker of one rank, and with fewer images than workers per step the work still
  rotates over all workers.
- Every worker yields exactly one ``StepPart`` per step (possibly empty), so the DataLoader's
  round-robin, in-order delivery hands over the ``K`` parts of step ``t`` before those of ``t + 1``;
  ``TrainBatchReader`` merges them into one ``TrainBatch``.

No collate: the DataLoader runs with ``batch_size=None`` and an identity ``collate_fn``; each image
is its own tensor (images may differ in size).

Shape legend: ``H``, ``W``: pixels. ``B``: images per step over all ranks.

Decode slots: handing a fresh 6 MB tensor from a worker to the trainer costs a new shared-memory
segment per image, whose page faults cost about as much as the JPEG decode itself (measured:
186 -> 101 images/s per core on fox). Instead, ``TrainBatchReader`` maps one ``DecodeSlots`` ring
(a ``store.SharedBuffer``, sent to the workers by handle); a worker decodes (or undistorts)
straight into its slot and sends only ``(offset, shape)``; the reader copies the pixels out into
an ordinary tensor when it hands the batch over, so the caller owns its images. A slot is reused
``num_parts`` parts later, by when the DataLoader's bounded prefetch guarantees the reader has
copied it; a stamp per slot turns any violation into an error instead of wrong pixels.

Worker processes (docs/data.md, "Workers and errors"):
- Started by ``forkserver``, never forked from the training process: by the time the loader starts,
  gloo and tensorboard threads exist there, and a child forked from a multi-threaded process can
  inherit a lock held by another thread (a worker once hung in ``PyOS_AfterFork_Child``). The fork
  server is a fresh single-threaded interpreter; it preloads this module (through
  ``worker_server.py``) and its workers skip re-running the training process's main script (under
  ``ns-train``, nerfstudio's whole CLI), so a worker starts in milliseconds once the server is up.
- Each worker exits within a fraction of a second when the process that owns the loader dies,
  even by SIGKILL: the fork server and its children die with their parent (``worker_server.py``,
  which also covers a worker still starting), and each worker watches its owner
  (``exit_with_owner``, which also covers the fork and spawn start methods).
- Workers ignore SIGINT/SIGTERM (a stop signal to the rank's process group must not kill them
  mid-step), so multiprocessing's exit handler, which stops daemonic children with SIGTERM and then
  waits for them, would wait for ever when a loader is still alive at interpreter exit (a failed
  run: its exception keeps the iterator referenced). ``_kill_workers_at_exit`` runs first and
  SIGKILLs them.
- A decode error (``ValueError`` from ``ImageLoader.load_array``: file, dataset index, decoder's
  reason) travels to the consumer as data (``WorkerFailure``) and is raised there with the worker's
  message unchanged; torch's own re-raise would put ``Caught ValueError in DataLoader worker
  process 0.`` first. Any other exception keeps torch's re-raise with the worker's traceback.
"""

from __future__ import annotations

import atexit
import functools
import itertools
import multiprocessing
import multiprocessing.util
import os
import select
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional, Protocol

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from distsplat_ns.data.decode import ImageLoader
from distsplat_ns.data.order import ContiguousAssigner, batch_camera_ids
from distsplat_ns.data.store import SharedBuffer
from distsplat_ns.utils.errors import UserError
from distsplat_ns.utils.logging import get_logger
from distsplat_ns.utils.signals import ignore_stop_signals

_LOGGER = get_logger(__name__)

WORKER_START_METHOD = "forkserver"
"""How DataLoader workers are started (see the module docstring)."""

_OWNER_POLL_S = 0.2


def _kill_workers_at_exit() -> None:
    """At interpreter exit, SIGKILL this process's daemonic multiprocessing children (DataLoader
    workers, which ignore the SIGTERM that multiprocessing's own exit handler sends before it waits
    for them). Registered after ``multiprocessing.util`` and ``torch.utils.data`` are imported, so it
    runs before their exit handlers (``atexit`` is last in, first out)."""
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()


atexit.register(_kill_workers_at_exit)


class Assigner(Protocol):
    """Which positions of a step's global batch a rank must have decoded (see ``ContiguousAssigner``)."""

    def positions_for_rank(self, step: int, batch: list[int], rank: int, world_size: int) -> list[int]: ...


@dataclass
class TrainBatch:
    """One step's images for this rank.

    Attributes:
        step: 0-based training step.
        camera_indices: Dataset indices of this rank's images, in batch-position order.
        positions: Their positions in the global batch (increasing).
        images: Pixels, one tensor per image. `[H, W, 3]` (or `[H, W, 4]` RGBA), uint8, CPU.
        masks: Per image, a mask `[H, W, 1]` bool, or None.
        wait_s: Seconds the training loop blocked waiting for this batch.
        skipped_indices: Dataset indices dropped as corrupt (only with skip_corrupt_images).
    """

    step: int
    camera_indices: list[int]
    positions: list[int]
    images: list[torch.Tensor]
    masks: list[Optional[torch.Tensor]]
    wait_s: float = 0.0
    skipped_indices: list[int] = field(default_factory=list)


@dataclass
class StepPart:
    """What one worker decoded for one step (internal to the stream and its reader)."""

    step: int
    worker_id: int
    positions: list[int]
    camera_indices: list[int]
    images: list  # torch.Tensor, or SlotRef for pixels left in a decode slot
    masks: list[Optional[torch.Tensor]]
    skipped_indices: list[int]
    decode_s: float
    slot_index: int = -1
    failure: Optional[WorkerFailure] = None


@dataclass(frozen=True)
class WorkerFailure:
    """A decode error raised in a DataLoader worker, sent to the consumer as data.

    Attributes:
        message: The worker's ``ValueError`` message (file, dataset index, decoder's reason).
    """

    message: str

    def reraise(self) -> None:
        """Raise the worker's error in this process, with the worker's message unchanged."""
        raise UserError(self.message)


@dataclass(frozen=True)
class SlotRef:
    """Pixels a worker left in its decode slot: byte ``offset`` in the ring's data, and the shape."""

    offset: int
    shape: tuple[int, ...]


class DecodeSlots:
    """A ring of shared decode slots: per worker, ``num_parts`` parts of ``images_per_part`` images.

    One ``SharedBuffer`` made by the reader before the workers start and sent to them by handle. A
    stamp per (worker, part slot) holds the step whose pixels it holds.

    Args:
        num_workers: DataLoader workers.
        num_parts: Parts per worker kept before a slot is reused (> prefetch depth).
        images_per_part: Most images a worker decodes for one step.
        image_bytes: Most bytes of one image.
    """

    _ALIGN = 64

    def __init__(self, num_workers: int, num_parts: int, images_per_part: int, image_bytes: int) -> None:
        self.num_workers = num_workers
        self.num_parts = num_parts
        self.images_per_part = images_per_part
        self.image_bytes = -(-image_bytes // self._ALIGN) * self._ALIGN
        self._header = -(-(8 * num_workers * num_parts) // self._ALIGN) * self._ALIGN
        self.num_bytes = self._header + num_workers * num_parts * images_per_part * self.image_bytes
        self._buffer = SharedBuffer(self.num_bytes, "distsplat decode slots")
        self._make_views()
        self.stamps[:] = -1

    def _make_views(self) -> None:
        raw = self._buffer.array
        self.stamps = raw[: 8 * self.num_workers * self.num_parts].view(np.int64).reshape(self.num_workers, self.num_parts)
        self.data = raw[self._header :]

    def offset(self, worker_id: int, slot_index: int, image_index: int) -> int:
        """Byte offset in ``data`` of one image slot."""
        return ((worker_id * self.num_parts + slot_index) * self.images_per_part + image_index) * self.image_bytes

    def buffer(self, worker_id: int, slot_index: int, image_index: int) -> np.ndarray:
        """One image slot as a flat writable uint8 array. `[image_bytes]`."""
        start = self.offset(worker_id, slot_index, image_index)
        return self.data[start : start + self.image_bytes]

    def copy_out(self, ref: SlotRef) -> torch.Tensor:
        """A new tensor holding the pixels ``ref`` points at."""
        size = int(np.prod(ref.shape))
        return torch.from_numpy(self.data[ref.offset : ref.offset + size].reshape(ref.shape).copy())

    def __getstate__(self) -> dict:
        # The buffer travels as its file descriptor (SharedBuffer refuses any other pickling).
        state = self.__dict__.copy()
        del state["stamps"], state["data"]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._make_views()


def identity_collate(item: object) -> object:
    """The DataLoader ``collate_fn``: hands items over untouched (no stacking, no conversion)."""
    return item


def worker_positions(positions: list[int], step: int, worker_id: int, num_workers: int) -> list[int]:
    """The positions of ``positions`` that worker ``worker_id`` decodes at ``step`` (rotating split)."""
    return [p for j, p in enumerate(positions) if (j + step) % num_workers == worker_id]


class ImageBatchStream(IterableDataset):
    """Infinite stream of ``StepPart``s for one rank, starting at ``start_step``.

    Args:
        loader: Decodes one image (its stores are shared with every worker, never copied).
        batch_size: Global images per step, ``B``.
        seed: Sampling seed.
        rank: Global index of this process.
        world_size: Number of processes.
        start_step: First step to yield (resume point).
        assigner: Split of each batch across ranks; ``ContiguousAssigner()`` if None.
        skip_corrupt_images: Log and drop undecodable images instead of raising.
        num_steps: Stop after this many steps (None: never).
        downscale_at: Render downscale of a step (splatfacto's resolution schedule): step ``t``'s
            images are decoded at ``1 / downscale_at(t)`` of their training resolution. A pure
            function of the step, called in the workers (pickled for spawn/forkserver workers).
            None: always 1.

    Invariants:
        For fixed arguments and worker count the sequence is deterministic; starting at step
        ``t`` yields exactly what an uninterrupted stream yields from step ``t`` on.
    """

    def __init__(
        self,
        loader: ImageLoader,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        start_step: int = 0,
        assigner: Optional[Assigner] = None,
        skip_corrupt_images: bool = False,
        num_steps: Optional[int] = None,
        downscale_at: Optional[Callable[[int], int]] = None,
    ) -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        if start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {start_step}")
        self.loader = loader
        self.batch_size = batch_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.start_step = start_step
        self.assigner: Assigner = assigner if assigner is not None else ContiguousAssigner()
        self.skip_corrupt_images = skip_corrupt_images
        self.num_steps = num_steps
        self.downscale_at = downscale_at
        self.slots: Optional[DecodeSlots] = None

    def downscale(self, step: int) -> int:
        """The render downscale of ``step`` (1 without a schedule)."""
        if self.downscale_at is None:
            return 1
        value = self.downscale_at(step)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"downscale_at({step}) must return an int >= 1, got {value!r}")
        return int(value)

    def max_images_per_part(self, num_workers: int) -> int:
        """Most images one worker decodes for one step (its rotating share of a whole batch)."""
        return -(-self.batch_size // max(num_workers, 1))

    def rank_positions(self, step: int) -> tuple[list[int], list[int]]:
        """``(batch, positions)``: the global batch of ``step`` and this rank's positions in it."""
        batch = batch_camera_ids(self.seed, len(self.loader), self.batch_size, step)
        positions = sorted(self.assigner.positions_for_rank(step, batch, self.rank, self.world_size))
        for p in positions:
            if not 0 <= p < len(batch):
                raise ValueError(f"assigner returned position {p} outside the batch of {len(batch)} at step {step}")
        return batch, positions

    def parts(self, worker_id: int, num_workers: int) -> Iterator[StepPart]:
        """The parts worker ``worker_id`` of ``num_workers`` yields, one per step."""
        steps = itertools.count(self.start_step)
        if self.num_steps is not None:
            steps = iter(range(self.start_step, self.start_step + self.num_steps))
        slots = self.slots if num_workers > 0 and get_worker_info() is not None else None
        for part_number, step in enumerate(steps):
            batch, positions = self.rank_positions(step)
            downscale = self.downscale(step)
            mine = worker_positions(positions, step, worker_id, num_workers)
            part = StepPart(step, worker_id, [], [], [], [], [], 0.0)
            start = time.perf_counter()
            if slots is not None:
                part.slot_index = part_number % slots.num_parts
                slots.stamps[worker_id, part.slot_index] = -1
            for j, p in enumerate(mine):
                index = batch[p]
                out = slots.buffer(worker_id, part.slot_index, j) if slots is not None and j < slots.images_per_part else None
                try:
                    array, mask_array = self.loader.load_array(index, out=out, downscale=downscale)
                except ValueError as exc:
                    if not self.skip_corrupt_images:
                        if get_worker_info() is None:
                            raise
                        part.failure = WorkerFailure(str(exc))
                        yield part
                        return
                    _LOGGER.warning("skipping image (skip_corrupt_images=True): %s", exc)
                    part.skipped_indices.append(index)
                    continue
                part.positions.append(p)
                part.camera_indices.append(index)
                if out is not None and np.shares_memory(array, out):
                    part.images.append(SlotRef(slots.offset(worker_id, part.slot_index, j), tuple(array.shape)))  # type: ignore[union-attr]
                else:
                    part.images.append(torch.from_numpy(array))
                part.masks.append(torch.from_numpy(mask_array) if mask_array is not None else None)
            if slots is not None:
                slots.stamps[worker_id, part.slot_index] = step
            part.decode_s = time.perf_counter() - start
            yield part

    def __iter__(self) -> Iterator[StepPart]:
        info = get_worker_info()
        # OpenCV's thread count is deliberately left alone in workers: cv2.setNumThreads in a
        # forked child whose parent already ran an OpenCV parallel loop can deadlock (measured).
        if info is None:
            return self.parts(0, 1)
        return self.parts(info.id, info.num_workers)


def worker_context(start_method: str = WORKER_START_METHOD) -> multiprocessing.context.BaseContext:
    """The multiprocessing context DataLoader workers start from.

    For ``forkserver`` the server (started once per process, by ``start_worker_server`` or on
    first use) preloads ``worker_server`` (this module, death with the training process, no
    re-run of the main script in workers), so that workers fork from an interpreter that already
    imported torch and the decoders and import nothing more before their first decode.

    Args:
        start_method: ``"forkserver"`` (the default), ``"spawn"`` or ``"fork"``.
    """
    context = multiprocessing.get_context(start_method)
    if start_method == "forkserver":
        context.set_forkserver_preload(["distsplat_ns.data.worker_server"])  # type: ignore[attr-defined]
    return context


def start_worker_server(start_method: str = WORKER_START_METHOD) -> None:
    """Start the fork server now (no-op for other start methods), so that its imports overlap the
    rest of start-up instead of delaying the first batch. Safe with threads: it is fork + exec."""
    worker_context(start_method)
    if start_method == "forkserver":
        from multiprocessing import forkserver

        forkserver.ensure_running()


def exit_with_owner(owner_pid: int, worker_id: int = 0) -> None:
    """DataLoader ``worker_init_fn``: ignore SIGINT/SIGTERM, and end this worker as soon as process
    ``owner_pid`` has exited.

    A daemon thread waits on a pidfd of the owner (polls every 0.2 s where pidfds are missing) and
    then ends the worker with ``os._exit``. torch's own check polls the *parent* every 5 s, and with
    forkserver the parent is the fork server, not the owner.

    Args:
        owner_pid: The process that created the DataLoader (the training process).
        worker_id: The DataLoader's worker index (unused; ``worker_init_fn`` signature).
    """
    del worker_id
    ignore_stop_signals()  # the rank, not its workers, handles a stop (utils/signals.py)
    try:
        pidfd: Optional[int] = os.pidfd_open(owner_pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        pidfd = None

    def wait_then_exit() -> None:
        if pidfd is not None:
            select.select([pidfd], [], [])  # readable once the owner has exited
        else:
            while True:
                try:
                    os.kill(owner_pid, 0)
                except ProcessLookupError:
                    break
                except PermissionError:
                    pass
                time.sleep(_OWNER_POLL_S)
        os._exit(1)

    threading.Thread(target=wait_then_exit, name="exit with owner", daemon=True).start()


def make_stream_loader(
    stream: ImageBatchStream, num_workers: int, prefetch_batches: int, start_method: str = WORKER_START_METHOD
) -> DataLoader:
    """The DataLoader that runs ``stream`` in ``num_workers`` processes.

    Args:
        stream: The rank's stream.
        num_workers: Worker processes (0: decode in the calling process).
        prefetch_batches: Steps decoded ahead of the consumer (each worker holds this many parts).
        start_method: How workers start (``worker_context``); tests compare the three.

    Returns:
        A DataLoader yielding ``StepPart``s, ``num_workers`` (or 1) per step, in step order.
    """
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if prefetch_batches < 1:
        raise ValueError(f"prefetch_batches must be >= 1, got {prefetch_batches}")
    return DataLoader(stream, batch_size=None, collate_fn=identity_collate, num_workers=num_workers, **worker_kwargs(num_workers, start_method, prefetch_batches))


def worker_kwargs(num_workers: int, start_method: str = WORKER_START_METHOD, prefetch_batches: Optional[int] = None) -> dict:
    """DataLoader keyword arguments for ``num_workers`` workers: start method, owner watch, prefetch."""
    if num_workers == 0:
        return {}
    kwargs: dict = {
        "multiprocessing_context": worker_context(start_method),
        "worker_init_fn": functools.partial(exit_with_owner, os.getpid()),
    }
    if prefetch_batches is not None:
        kwargs["prefetch_factor"] = prefetch_batches
    return kwargs


def _copy_out_slots(part: StepPart, slots: Optional[DecodeSlots]) -> None:
    refs = [i for i, image in enumerate(part.images) if isinstance(image, SlotRef)]
    if not refs:
        return
    if slots is None:
        raise RuntimeError("a worker used decode slots that this reader does not have")

    def check() -> None:
        stamp = int(slots.stamps[part.worker_id, part.slot_index])
        if stamp != part.step:
            raise RuntimeError(
                f"decode slot {part.slot_index} of worker {part.worker_id} holds step {stamp}, expected {part.step}: "
                "it was reused before being read (internal error: ring shorter than the prefetch depth)"
            )

    check()
    for i in refs:
        part.images[i] = slots.copy_out(part.images[i])
    check()  # the pixels did not change while being copied


def merge_parts(step: int, parts: list[StepPart], slots: Optional[DecodeSlots] = None) -> TrainBatch:
    """Join the workers' parts of one step into a ``TrainBatch`` ordered by batch position.

    Pixels left in decode slots are copied out into tensors the caller owns.

    Raises:
        ValueError: A worker's decode error (``WorkerFailure``), with the worker's message.
    """
    for part in parts:
        if part.failure is not None:
            part.failure.reraise()
        if part.step != step:
            raise RuntimeError(f"data stream out of order: expected step {step}, a worker delivered step {part.step}")
        _copy_out_slots(part, slots)
    items = sorted(
        (
            (p, i, img, m)
            for part in parts
            for p, i, img, m in zip(part.positions, part.camera_indices, part.images, part.masks)
        ),
        key=lambda item: item[0],
    )
    skipped = [i for part in parts for i in part.skipped_indices]
    return TrainBatch(
        step=step,
        camera_indices=[item[1] for item in items],
        positions=[item[0] for item in items],
        images=[item[2] for item in items],
        masks=[item[3] for item in items],
        skipped_indices=skipped,
    )


class TrainBatchReader:
    """Pulls a stream's parts from its DataLoader and hands out one ``TrainBatch`` per step.

    Args:
        stream: The rank's stream (its ``start_step`` is the first step to request).
        num_workers: DataLoader workers.
        prefetch_batches: Steps decoded ahead.
        start_method: How workers start (``worker_context``).
    """

    def __init__(
        self,
        stream: ImageBatchStream,
        num_workers: int,
        prefetch_batches: int,
        start_method: str = WORKER_START_METHOD,
    ) -> None:
        self.stream = stream
        self.num_parts = max(num_workers, 1)
        self.next_step = stream.start_step
        self.num_images_delivered = 0
        self.decode_s = 0.0
        self.wait_s = 0.0
        self.skipped_indices: list[int] = []
        self.slots: Optional[DecodeSlots] = None
        if num_workers > 0:
            # More parts than the DataLoader can have in flight per worker (prefetch_batches),
            # plus the one being consumed and one of margin.
            self.slots = DecodeSlots(
                num_workers, prefetch_batches + 2, stream.max_images_per_part(num_workers), stream.loader.max_output_bytes()
            )
        stream.slots = self.slots
        self._dataloader = make_stream_loader(stream, num_workers, prefetch_batches, start_method)
        self._iterator: Optional[Iterator[StepPart]] = iter(self._dataloader)

    def next_batch(self, step: int) -> TrainBatch:
        """The batch of ``step``, which must be the reader's next step.

        Raises:
            ValueError: ``step`` is not the next step of this reader.
            RuntimeError: The reader was closed or a worker failed earlier.
            ValueError: A worker could not decode an image: the worker's message (file, dataset
                index, decoder's reason), unchanged.
            Exception: Any other worker exception, re-raised by the DataLoader with its traceback.
        """
        if step != self.next_step:
            raise ValueError(f"step {step} requested, but this stream's next step is {self.next_step}")
        if self._iterator is None:
            raise RuntimeError("this train stream is closed (a worker failed or close() was called)")
        start = time.perf_counter()
        try:
            parts = [next(self._iterator) for _ in range(self.num_parts)]
            wait_s = time.perf_counter() - start
            batch = merge_parts(step, parts, self.slots)
        except BaseException:
            self.close()
            raise
        batch.wait_s = wait_s
        self.next_step += 1
        self.wait_s += wait_s
        self.decode_s += sum(part.decode_s for part in parts)
        self.num_images_delivered += len(batch.images)
        self.skipped_indices.extend(batch.skipped_indices)
        return batch

    def close(self) -> None:
        """Stop the workers."""
        iterator, self._iterator = self._iterator, None
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()  # type: ignore[attr-defined]


class IndexedImageDataset(Dataset):
    """Map-style dataset over chosen dataset indices, for eval loaders with workers.

    Items are ``(index, image, mask)`` as ``ImageLoader.load`` returns them, or, in a worker, a
    ``WorkerFailure`` for an image that cannot be decoded (raise it with ``reraise``). Picklable.
    """

    def __init__(self, loader: ImageLoader, indices: list[int]) -> None:
        self.loader = loader
        self.indices = list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor, Optional[torch.Tensor]] | WorkerFailure:
        index = self.indices[i]
        try:
            image, mask = self.loader.load(index)
        except ValueError as exc:
            if get_worker_info() is None:
                raise
            return WorkerFailure(str(exc))
        return index, image, mask
