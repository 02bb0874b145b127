"""Build the scene shipped in ``scenes/lund_door`` from ``../shared/data/lund_door``.

The Lund door capture (12 DSLR photos, COLMAP model; BSD-3 through gtsfm, see
scenes/lund_door/LICENSE and PROVENANCE.txt) is downscaled by an integer factor so that CPU
training finishes in minutes. Images are box-filtered (PIL ``reduce``) and re-encoded as JPEG; the
COLMAP camera intrinsics and 2D observations are divided by the same factor; 3D points unchanged.

Usage: python scripts/make_shipped_scene.py [--source DIR] [--out DIR] [--factor 8]
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from PIL import Image

ROOT = Path(__file__).resolve().parents[1]


def scale_cameras(text: str, factor: int) -> str:
    out = []
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            out.append(line)
            continue
        elems = line.split()
        cam_id, model, width, height = elems[:4]
        params = [float(p) for p in elems[4:]]
        if model not in ("SIMPLE_RADIAL", "SIMPLE_PINHOLE", "PINHOLE", "RADIAL", "OPENCV"):
            raise ValueError(f"camera model {model} not handled by this script")
        num_scaled = {"SIMPLE_RADIAL": 3, "SIMPLE_PINHOLE": 3, "PINHOLE": 4, "RADIAL": 3, "OPENCV": 4}[model]
        params = [p / factor for p in params[:num_scaled]] + params[num_scaled:]
        out.append(
            " ".join([cam_id, model, str(int(width) // factor), str(int(height) // factor)] + [repr(p) for p in params])
        )
    return "\n".join(out) + "\n"


def scale_images(text: str, factor: int) -> str:
    out = []
    lines = text.splitlines()
    data_idx = 0
    for line in lines:
        if line.startswith("#"):
            out.append(line)
            continue
        if data_idx % 2 == 1:  # POINTS2D line: x y point3d_id triples
            elems = line.split()
            scaled = []
            for i in range(0, len(elems), 3):
                scaled += [repr(float(elems[i]) / factor), repr(float(elems[i + 1]) / factor), elems[i + 2]]
            out.append(" ".join(scaled))
        else:
            out.append(line)
        data_idx += 1
    return "\n".join(out) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=ROOT.parent / "shared" / "data" / "lund_door")
    parser.add_argument("--out", type=Path, default=ROOT / "scenes" / "lund_door")
    parser.add_argument("--factor", type=int, default=8)
    args = parser.parse_args()
    if not (args.source / "sparse" / "0" / "cameras.txt").is_file():
        raise SystemExit(f"error: {args.source} is not the lund_door COLMAP scene (no sparse/0/cameras.txt)")
    (args.out / "images").mkdir(parents=True, exist_ok=True)
    (args.out / "sparse" / "0").mkdir(parents=True, exist_ok=True)
    for src in sorted((args.source / "images").iterdir()):
        with Image.open(src) as im:
            small = im.convert("RGB").reduce(args.factor)
            small.save(args.out / "images" / src.name, quality=95)
    sparse = args.source / "sparse" / "0"
    (args.out / "sparse" / "0" / "cameras.txt").write_text(
        scale_cameras((sparse / "cameras.txt").read_text(), args.factor)
    )
    (args.out / "sparse" / "0" / "images.txt").write_text(
        scale_images((sparse / "images.txt").read_text(), args.factor)
    )
    shutil.copyfile(sparse / "points3D.txt", args.out / "sparse" / "0" / "points3D.txt")
    shutil.copyfile(args.source / "LICENSE.source_repo", args.out / "LICENSE")


if __name__ == "__main__":
    main()
