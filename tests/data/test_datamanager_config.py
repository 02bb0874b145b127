"""The datamanager's config surface: one RAM budget, no unused fields, seed from the caller, configs left as built."""

from __future__ import annotations

from pathlib import Path

import pytest
from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig

from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
from distsplat_ns.data.order import batch_camera_ids

SHIPPED_LUND_DOOR = Path(__file__).resolve().parents[2] / "scenes" / "lund_door"


def _colmap(data: Path) -> ColmapDataParserConfig:
    return ColmapDataParserConfig(data=data, colmap_path=Path("sparse/0"), load_3D_points=True, downscale_factor=1)


@pytest.mark.parametrize(
    "removed",
    [
        "ram_budget_fraction",
        "seed",
        "multiprocessing_context",
        "eval_num_images_to_sample_from",
        "eval_num_times_to_repeat_images",
        "eval_image_indices",
    ],
)
def test_removed_fields_are_not_config_fields(removed: str) -> None:
    assert removed not in ParallelFullImageDatamanagerConfig.__dataclass_fields__


def test_seed_is_a_constructor_argument() -> None:
    manager = ParallelFullImageDatamanagerConfig(dataparser=_colmap(SHIPPED_LUND_DOOR), num_workers=0).setup(
        device="cpu", seed=7
    )
    manager.configure_training(3, 0, 1)
    num_images = len(manager.train_dataset)
    assert (
        manager.batch_camera_ids(2) == batch_camera_ids(7, num_images, 3, 2) != batch_camera_ids(42, num_images, 3, 2)
    )
    assert manager.next_train_batch(0).camera_indices == batch_camera_ids(7, num_images, 3, 0)
    manager.close()


def test_negative_seed_is_rejected() -> None:
    with pytest.raises(ValueError, match="seed"):
        ParallelFullImageDatamanagerConfig(dataparser=_colmap(SHIPPED_LUND_DOOR), num_workers=0).setup(
            device="cpu", seed=-1
        )


@pytest.mark.parametrize("datamanager_data", [False, True])
def test_config_is_not_rewritten_by_construction(tmp_path: Path, datamanager_data: bool) -> None:
    # --data (the datamanager's) wins over the dataparser's path; the configs keep what was given.
    dataparser = _colmap(tmp_path / "elsewhere" if datamanager_data else SHIPPED_LUND_DOOR)
    config = ParallelFullImageDatamanagerConfig(
        dataparser=dataparser, data=SHIPPED_LUND_DOOR if datamanager_data else None, num_workers=0
    )
    before = repr(config)
    manager = config.setup(device="cpu")
    assert repr(config) == before
    assert manager.get_datapath() == SHIPPED_LUND_DOOR
    assert len(manager.train_dataset) > 0
