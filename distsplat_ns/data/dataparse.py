"""Parse a scene at a dataparser downscale factor without pre-made ``images_N`` folders, never prompting.

nerfstudio glue. nerfstudio 1.1.5's colmap dataparser asks on stdin whether to create ``images_N``
(every rank dies with ``EOFError`` without a terminal). When the folder is missing, the scene is
parsed at factor 1 (from a copy of the config), the cameras rescaled as the dataparser would, and
each file decoded at ``1 / N`` (``image_loader.ImageSpec.source_downscale``). Folders that exist are
used through the unchanged dataparser (docs/data.md, "A dataparser downscale without `images_N`").
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from nerfstudio.data.dataparsers.base_dataparser import DataParser, DataparserOutputs
from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParserConfig
from nerfstudio.data.dataparsers.nerfstudio_dataparser import NerfstudioDataParserConfig
from PIL import Image

# The largest side nerfstudio's automatic factor aims for (colmap_dataparser.MAX_AUTO_RESOLUTION).
_MAX_AUTO_RESOLUTION = 1600


def _auto_factor(first_image: Path) -> int:
    """nerfstudio's automatic downscale: the smallest power of 2 bringing the largest side to <= 1600 px."""
    with Image.open(first_image) as image:
        max_res = max(image.size)
    factor = 1
    while max_res / factor > _MAX_AUTO_RESOLUTION:
        factor *= 2
    return factor


def _colmap_folder_exists(config: ColmapDataParserConfig, factor: int, filenames: list[Path]) -> bool:
    # The colmap dataparser's own test (its _setup_downscale_factor): every file's images_N parent exists.
    parent = config.data / config.images_path
    base = parent.parent / f"{parent.name}_{factor}"
    return all((base / Path(fp).relative_to(parent)).parent.exists() for fp in filenames)


def _nerfstudio_files_exist(config: NerfstudioDataParserConfig, factor: int, filenames: list[Path]) -> bool:
    # The nerfstudio dataparser's own naming (its _get_fname): <data dir>/images_N/<file name>.
    data_dir = config.data if config.data.suffix != ".json" else config.data.parent
    return all((data_dir / f"images_{factor}" / Path(fp).name).exists() for fp in filenames)


class DownscaledParse:
    """A dataparser that serves ``get_dataparser_outputs`` at the config's downscale factor.

    Args:
        config: The user's dataparser config (not modified).

    Attributes:
        dataparser: The dataparser actually parsing (the user's, or one at factor 1).
        source_downscale: ``N`` when files are decoded at ``1 / N`` (no ``images_N`` folder), else 1.
        missing_folder: What was not found, for the log line, or None.
    """

    def __init__(self, config: Any) -> None:
        self.config = config
        self.source_downscale = 1
        self.missing_folder: str | None = None
        self.dataparser: DataParser = config.setup()
        if not isinstance(config, (ColmapDataParserConfig, NerfstudioDataParserConfig)):
            return
        requested = config.downscale_factor
        if requested is not None and requested <= 1:
            return
        if requested is None and not isinstance(config, ColmapDataParserConfig):
            return  # nerfstudio-data's automatic factor only picks folders that exist
        full = dataclasses.replace(config, downscale_factor=1).setup()
        full_train = full.get_dataparser_outputs(split="train")
        filenames = list(full_train.image_filenames)
        factor = requested if requested is not None else _auto_factor(Path(filenames[0]))
        if factor <= 1:
            self.dataparser = full
            return
        if isinstance(config, ColmapDataParserConfig):
            exists = _colmap_folder_exists(config, factor, filenames)
            folder = f"{config.images_path}_{factor}"
        else:
            exists = _nerfstudio_files_exist(config, factor, filenames)
            folder = f"images_{factor}"
        if exists:
            return
        self.dataparser = full
        self.source_downscale = factor
        self.missing_folder = folder
        self._train_outputs: DataparserOutputs | None = full_train

    @property
    def rounding_mode(self) -> str:
        """How the dataparser rounds downscaled sizes (colmap's option; nerfstudio-data floors)."""
        return getattr(self.config, "downscale_rounding_mode", "floor")

    def get_dataparser_outputs(self, split: str) -> DataparserOutputs:
        """The split's outputs, with cameras at ``1 / source_downscale`` of the parsed files."""
        if self.source_downscale == 1:
            return self.dataparser.get_dataparser_outputs(split=split)
        outputs = self._train_outputs if split == "train" and self._train_outputs is not None else None
        if outputs is None:
            outputs = self.dataparser.get_dataparser_outputs(split=split)
        else:
            self._train_outputs = None
        factor = self.source_downscale
        outputs.cameras.rescale_output_resolution(scaling_factor=1.0 / factor, scale_rounding_mode=self.rounding_mode)
        xy = outputs.metadata.get("points3D_points2D_xy")
        if xy is not None:  # pixel coordinates, divided by the factor in colmap's own parse
            outputs.metadata["points3D_points2D_xy"] = xy / factor
        return outputs


def parsed_size_hw(outputs: DataparserOutputs) -> list[tuple[int, int]]:
    """Each camera's ``(height, width)`` as the dataparser gives it (before ``camera_res_scale_factor``)."""
    heights = outputs.cameras.height.reshape(-1).tolist()
    widths = outputs.cameras.width.reshape(-1).tolist()
    return [(int(h), int(w)) for h, w in zip(heights, widths, strict=False)]
