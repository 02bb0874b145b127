"""ImageBatchStream, its reader and the byte store: sharding, determinism, resume, errors (CPU)."""

from __future__ import annotations

import itertools
import logging
from pathlib import Path

import pytest
import torch

from distsplat_ns.data.order import batch_camera_ids
from distsplat_ns.data.reader import TrainBatchReader, make_stream_loader
from distsplat_ns.data.store import EncodedImageStore
from distsplat_ns.data.stream import ImageBatchStream, StepPart
from tests.helpers.data_fixtures import LogRecords, make_loader

SEED = 3


@pytest.fixture()
def records():
    handler = LogRecords()
    logger = logging.getLogger("distsplat_ns")
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)


def _parts(
    loader, batch_size: int, rank: int, world_size: int, num_workers: int, num_steps: int, start_step: int = 0
) -> list[StepPart]:
    stream = ImageBatchStream(loader, batch_size, SEED, rank, world_size, start_step=start_step)
    dataloader = make_stream_loader(stream, num_workers, prefetch_batches=2)
    return list(itertools.islice(iter(dataloader), num_steps * max(num_workers, 1)))


def _batches(
    loader, batch_size: int, rank: int, world_size: int, num_workers: int, num_steps: int, start_step: int = 0
):
    reader = TrainBatchReader(
        ImageBatchStream(loader, batch_size, SEED, rank, world_size, start_step=start_step), num_workers, 2
    )
    try:
        return [reader.next_batch(step) for step in range(start_step, start_step + num_steps)]
    finally:
        reader.close()


def test_no_collate_happens(jpeg_paths: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils.data._utils import collate

    def _forbidden(*args, **kwargs):
        raise AssertionError("an image collate function was called")

    monkeypatch.setattr(collate, "default_collate", _forbidden)
    monkeypatch.setattr(collate, "default_convert", _forbidden)
    (batch,) = _batches(make_loader(jpeg_paths), batch_size=4, rank=0, world_size=1, num_workers=2, num_steps=1)
    for image in batch.images:
        # Each image is its own tensor, not a view into a stacked batch.
        assert image.untyped_storage().nbytes() == image.numel()


@pytest.mark.parametrize("world_size, num_workers", [(1, 2), (2, 2), (3, 1), (2, 0)])
def test_rank_by_worker_sharding_partitions_each_batch(
    jpeg_paths: list[Path], world_size: int, num_workers: int
) -> None:
    loader = make_loader(jpeg_paths)
    batch_size, num_steps = 5, 4
    owners: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for rank in range(world_size):
        for part in _parts(loader, batch_size, rank, world_size, num_workers, num_steps):
            for p in part.positions:
                owners.setdefault((part.step, p), []).append((rank, part.worker_id))
    assert sorted(owners) == [(s, p) for s in range(num_steps) for p in range(batch_size)]
    assert all(len(who) == 1 for who in owners.values())


def test_parts_carry_the_global_batch_images(jpeg_paths: list[Path]) -> None:
    loader = make_loader(jpeg_paths)
    for part in _parts(loader, 4, 1, 2, 2, 3):
        expected = batch_camera_ids(SEED, len(jpeg_paths), 4, part.step)
        assert part.camera_indices == [expected[p] for p in part.positions]


@pytest.mark.parametrize("batch_size", [1, 4])
def test_one_epoch_covers_every_image_once(jpeg_paths: list[Path], batch_size: int) -> None:
    loader = make_loader(jpeg_paths)
    num_steps = len(jpeg_paths) // batch_size
    seen = [
        i for rank in range(2) for b in _batches(loader, batch_size, rank, 2, 2, num_steps) for i in b.camera_indices
    ]
    assert sorted(seen) == list(range(len(jpeg_paths)))


def test_same_seed_same_sequence(jpeg_paths: list[Path]) -> None:
    loader = make_loader(jpeg_paths)
    first = _batches(loader, 3, 0, 1, 2, 6)
    second = _batches(loader, 3, 0, 1, 2, 6)
    assert [b.camera_indices for b in first] == [b.camera_indices for b in second]
    assert all(
        torch.equal(x, y) for a, b in zip(first, second, strict=False) for x, y in zip(a.images, b.images, strict=False)
    )


def test_resume_mid_epoch_matches_straight_run(jpeg_paths: list[Path]) -> None:
    loader = make_loader(jpeg_paths)
    straight = _batches(loader, 5, 1, 2, 2, 7)
    resumed = _batches(loader, 5, 1, 2, 2, 3, start_step=4)
    assert [b.camera_indices for b in resumed] == [b.camera_indices for b in straight[4:]]
    assert [b.positions for b in resumed] == [b.positions for b in straight[4:]]
    assert all(
        torch.equal(x, y)
        for a, b in zip(resumed, straight[4:], strict=False)
        for x, y in zip(a.images, b.images, strict=False)
    )


def test_images_of_different_sizes_in_one_batch(jpeg_paths: list[Path]) -> None:
    (batch,) = _batches(make_loader(jpeg_paths), len(jpeg_paths), 0, 1, 2, 1)
    assert len({tuple(image.shape) for image in batch.images}) > 1
    assert all(image.dtype == torch.uint8 and image.shape[-1] == 3 for image in batch.images)


def test_reader_rejects_out_of_order_step(jpeg_paths: list[Path]) -> None:
    reader = TrainBatchReader(ImageBatchStream(make_loader(jpeg_paths), 2, SEED), 0, 1)
    reader.next_batch(0)
    with pytest.raises(ValueError, match="next step is 1"):
        reader.next_batch(3)


def test_worker_exception_reaches_consumer_with_file_name(corrupt_copy: tuple[list[Path], int]) -> None:
    paths, bad = corrupt_copy
    loader = make_loader(paths)
    reader = TrainBatchReader(ImageBatchStream(loader, len(paths), SEED), 2, 2)
    with pytest.raises(ValueError, match=f"cannot decode image {paths[bad]}.*Premature end of JPEG file"):
        reader.next_batch(0)


@pytest.mark.parametrize("decoder", ["pil", "simplejpeg", "torchvision"])
def test_truncated_jpeg_error_names_the_file(corrupt_copy: tuple[list[Path], int], decoder: str) -> None:
    paths, bad = corrupt_copy
    with pytest.raises(ValueError, match=f"cannot decode image {paths[bad]}"):
        make_loader(paths, decoder=decoder).load(bad)


def test_skip_corrupt_images_logs_and_drops_them(corrupt_copy: tuple[list[Path], int], records: LogRecords) -> None:
    paths, bad = corrupt_copy
    stream = ImageBatchStream(make_loader(paths), len(paths), SEED, skip_corrupt_images=True)
    reader = TrainBatchReader(stream, 0, 1)
    batch = reader.next_batch(0)
    assert bad not in batch.camera_indices and batch.skipped_indices == [bad]
    assert len(batch.images) == len(paths) - 1
    assert any(str(paths[bad]) in m and "skipping" in m for m in records.messages)


def test_missing_files_reported_at_construction(tmp_path: Path, jpeg_paths: list[Path]) -> None:
    paths = list(jpeg_paths) + [tmp_path / "gone_1.jpg", tmp_path / "gone_2.jpg"]
    with pytest.raises(FileNotFoundError, match=r"2 of 14 image files are missing:(.|\n)*gone_1.jpg(.|\n)*gone_2.jpg"):
        EncodedImageStore(paths, 1 << 30)


def test_disk_mode_when_files_exceed_budget(jpeg_paths: list[Path], records: LogRecords) -> None:
    total = sum(p.stat().st_size for p in jpeg_paths)
    disk = make_loader(jpeg_paths, ram_budget_bytes=total - 1)
    ram = make_loader(jpeg_paths, ram_budget_bytes=total)
    assert disk.images.disk_mode and not ram.images.disk_mode
    assert sum("DISK MODE" in m for m in records.messages) == 1
    disk_batch = _batches(disk, 6, 0, 1, 2, 2)
    ram_batch = _batches(ram, 6, 0, 1, 2, 2)
    assert all(
        torch.equal(x, y)
        for a, b in zip(disk_batch, ram_batch, strict=False)
        for x, y in zip(a.images, b.images, strict=False)
    )


def test_store_view_is_read_only_and_exact(jpeg_paths: list[Path]) -> None:
    store = EncodedImageStore(jpeg_paths, 1 << 30)
    assert store.wait_filled() and store.shared
    assert isinstance(store.view(3), memoryview)
    assert bytes(store.view(3)) == jpeg_paths[3].read_bytes()
    with pytest.raises(TypeError):
        store.view(3)[0] = 0  # type: ignore[index]


def test_entries_not_yet_filled_are_read_from_their_files(jpeg_paths: list[Path]) -> None:
    store = EncodedImageStore(jpeg_paths, 1 << 30, background_fill=False)
    store._publish(4, 0)  # as if the background fill had reached entry 4
    store._all_filled = False
    assert isinstance(store.view(3), memoryview) and isinstance(store.view(4), bytes)
    assert all(bytes(store.view(i)) == p.read_bytes() for i, p in enumerate(jpeg_paths))


def _exit_with_view_check(store: EncodedImageStore, paths: list[Path]) -> None:
    import os

    os._exit(0 if all(bytes(store.view(i)) == p.read_bytes() for i, p in enumerate(paths)) else 1)


def test_a_child_forked_while_the_filler_publishes_can_read(jpeg_paths: list[Path]) -> None:
    # The filler's thread holds the count lock while it publishes each file; a worker forked at
    # that moment once inherited it locked and waited forever in its first view() (CI stop 31).
    import multiprocessing

    store = EncodedImageStore(jpeg_paths, 1 << 30, background_fill=False)
    store._publish(4, 0)  # mid-fill: views read the header under the lock
    store._all_filled = False
    with store._count_lock:  # as the filler's thread holds it in _publish
        child = multiprocessing.get_context("fork").Process(target=_exit_with_view_check, args=(store, jpeg_paths))
        child.start()
    child.join(30.0)  # tiny files: the child's reads take milliseconds; 30 s is for a loaded machine
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail("the forked child did not finish reading the store within 30 s (its count lock stayed held)")
    assert child.exitcode == 0


def test_fork_workers_never_pickle_the_store(jpeg_paths: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def _no_pickling(self):
        raise AssertionError("the store was pickled")

    monkeypatch.setattr(EncodedImageStore, "__getstate__", _no_pickling)
    reader = TrainBatchReader(ImageBatchStream(make_loader(jpeg_paths), 4, SEED), 2, 2, "fork")
    assert len(reader.next_batch(0).images) == 4
    reader.close()


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_started_workers_get_the_shared_buffer(jpeg_paths: list[Path], start_method: str) -> None:
    loader = make_loader(jpeg_paths)
    assert loader.images.wait_filled()
    expected = _batches(loader, 4, 0, 1, 0, 2)
    reader = TrainBatchReader(ImageBatchStream(loader, 4, SEED), 1, 1, start_method)
    try:
        got = [reader.next_batch(s) for s in range(2)]
    finally:
        reader.close()
    assert all(
        torch.equal(x, y) for a, b in zip(got, expected, strict=False) for x, y in zip(a.images, b.images, strict=False)
    )


def test_store_is_never_pickled_by_value(jpeg_paths: list[Path]) -> None:
    import pickle

    with pytest.raises(RuntimeError, match="only while that process is being started"):
        pickle.dumps(EncodedImageStore(jpeg_paths, 1 << 30))


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_decode_slots_deliver_the_same_pixels_as_in_process_decoding(jpeg_paths: list[Path], start_method: str) -> None:
    loader = make_loader(jpeg_paths)
    reader = TrainBatchReader(ImageBatchStream(loader, 5, SEED), 2, 2, start_method)
    assert reader.slots is not None
    try:
        via_slots = [reader.next_batch(s) for s in range(4)]
    finally:
        reader.close()
    in_process = _batches(loader, 5, 0, 1, 0, 4)
    assert [b.camera_indices for b in via_slots] == [b.camera_indices for b in in_process]
    assert all(
        torch.equal(x, y)
        for a, b in zip(via_slots, in_process, strict=False)
        for x, y in zip(a.images, b.images, strict=False)
    )


def test_reused_decode_slot_is_an_error_not_wrong_pixels() -> None:
    from distsplat_ns.data.reader import merge_parts
    from distsplat_ns.data.slots import DecodeSlots, SlotRef

    slots = DecodeSlots(num_workers=1, num_parts=2, images_per_part=1, image_bytes=12)
    slots.stamps[0, 1] = 9  # the slot already holds a later step
    part = StepPart(
        step=7,
        worker_id=0,
        positions=[0],
        camera_indices=[3],
        images=[SlotRef(slots.offset(0, 1, 0), (2, 2, 3))],
        masks=[None],
        skipped_indices=[],
        decode_s=0.0,
        slot_index=1,
    )
    with pytest.raises(RuntimeError, match="holds step 9, expected 7"):
        merge_parts(7, [part], slots)
