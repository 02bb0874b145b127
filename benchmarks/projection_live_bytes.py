"""Bytes a projection keeps live per (camera, Gaussian) until its backward, counted, not estimated.

``parallel/camera_groups.py`` sizes camera groups with ``LIVE_ITEMS_PER_CAMERA_GAUSSIAN`` items per
(camera, Gaussian): twice this script's count at SH degree 3 (the backward's peak). This script projects N random Gaussians into C = 1 and 2 cameras with the
reference backend (``rendering/api.py:project``, the CPU backend) and counts every tensor autograd
saves for the backward (``torch.autograd.graph.saved_tensors_hooks``, each storage once, the
parameters themselves excluded) plus the projection's outputs; the per-camera part is the
difference between C = 2 and C = 1, divided by N. At SH degree 0 (the first
``sh_degree_interval`` images) and 3.

Usage (repository root): python -m benchmarks.projection_live_bytes [--num 100000]
Writes benchmarks/results/projection_live_bytes.json.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from benchmarks.common import RESULTS, finish_machine_record, machine_record, write_json
from distsplat_ns.parallel.camera_groups import LIVE_ITEMS_PER_CAMERA_GAUSSIAN
from distsplat_ns.rendering.api import project

OUTPUT_FIELDS = ("means2d", "conics", "colors", "opacities", "depths", "radii", "compensations")


def live_bytes(num: int, cameras: int, sh_degree: int) -> int:
    """Bytes autograd saves plus the outputs' bytes, for ``num`` Gaussians 3 units in front of
    ``cameras`` identical 242 x 162 cameras (every Gaussian in view: the worst case)."""
    gen = torch.Generator().manual_seed(0)
    means = (torch.rand(num, 3, generator=gen) * 2 - 1 + torch.tensor([0.0, 0.0, 3.0])).requires_grad_()
    quats = torch.randn(num, 4, generator=gen).requires_grad_()
    scales = torch.full((num, 3), 0.02).requires_grad_()
    opacities = torch.rand(num, generator=gen).requires_grad_()
    colors = torch.randn(num, (sh_degree + 1) ** 2, 3, generator=gen).requires_grad_()
    viewmats = torch.eye(4).repeat(cameras, 1, 1)
    Ks = torch.tensor([[200.0, 0.0, 121.0], [0.0, 200.0, 81.0], [0.0, 0.0, 1.0]]).repeat(cameras, 1, 1)
    params = {t.untyped_storage().data_ptr() for t in (means, quats, scales, opacities, colors)}
    saved: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        proj = project(
            means, quats, scales, opacities, colors, viewmats, Ks, 242, 162, sh_degree=sh_degree, backend="reference"
        )
    held = {k: v for k, v in saved.items() if k not in params}
    for name in OUTPUT_FIELDS:
        value = getattr(proj, name, None)
        if isinstance(value, torch.Tensor):
            held[value.untyped_storage().data_ptr()] = value.untyped_storage().nbytes()
    return sum(held.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num", type=int, default=100_000)
    parser.add_argument("--out", type=Path, default=RESULTS / "projection_live_bytes.json")
    args = parser.parse_args()
    machine = machine_record()
    rows = []
    for sh_degree in (0, 3):
        one, two = live_bytes(args.num, 1, sh_degree), live_bytes(args.num, 2, sh_degree)
        rows.append(
            {
                "sh_degree": sh_degree,
                "bytes_c1": one,
                "bytes_c2": two,
                "per_camera_gaussian_bytes": (two - one) / args.num,
                "per_gaussian_fixed_bytes": (2 * one - two) / args.num,
            }
        )
    result = {
        "command": "python -m benchmarks.projection_live_bytes",
        "num_gaussians": args.num,
        "camera_groups_estimate_bytes": LIVE_ITEMS_PER_CAMERA_GAUSSIAN * 4,
        "machine": finish_machine_record(machine),
        "rows": rows,
    }
    write_json(args.out, result)
    print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
