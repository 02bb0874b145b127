"""Traffic model of the sharded mode against the replicated all-reduce (docs/sharded_traffic.md).

No training: Gaussians are built from a real COLMAP scene's sparse points, projected with the
reference backend into the scene's real cameras, and for batches of B cameras cut into W bands
by the balancer (``balance/partition.py:partition_rows`` on ``balance/cost.py:footprint_row_costs``)
the script counts, per band, the Gaussians whose footprint touches the band's rendered tile rows
(``balance/routing.py:footprint_tile_rows``, SSIM halo from ``model/losses.py:halo_end_row``) and
by which rank they are owned. From those counts, bytes per step per rank:

- replicated: a ring all-reduce of ``N x 59`` float32 gradients, plus while densifying the
  ``[B, N, 2]`` grads2d, ``[B, N, 2]`` absgrads (float32) and ``[B, N]`` radii (int32) that
  ``pipeline/distsplat_pipeline.py`` sums; a ring moves ``2 (W - 1) / W`` times the payload out of (and into) each rank;
- sharded: forward, every owner sends a band's rank the screen-space rows of its Gaussians that
  touch the band (``FORWARD_ROW_BYTES``), once per (camera, destination), none to itself;
  backward, the band's rank sends their gradients back (``BACKWARD_ROW_BYTES``).

The bytes and counting functions are in benchmarks/traffic_counts.py (unit-tested); this file
loads the scene, builds and projects the Gaussians, cuts the batches and prints the tables.

Gaussians: the sparse points upsampled to N by jittered copies; scales are splatfacto's initial
rule (mean distance to the 3 nearest sparse points), shrunk by ``(P / N) ** alpha`` (``P`` sparse
points): ``alpha = 1/2`` spreads N Gaussians over the same surfaces (spacing ~ N^-1/2), ``1/3``
fills a volume (larger footprints). Owners are drawn uniformly at random per Gaussian.

Usage (the figures in docs/sharded_traffic.md)::

    .venv/bin/python -m benchmarks.traffic_model \\
        --json benchmarks/results/traffic_model.json

Shape letters: C cameras sampled, N Gaussians, T tile rows of one image, R ranks (``world_size``).
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from benchmarks.common import SHARED_DATA, finish_machine_record, machine_record, write_json
from benchmarks.traffic_counts import (
    BACKWARD_ROW_BYTES,
    COUNT_BYTES,
    FLOAT_BYTES,
    FORWARD_ROW_BYTES,
    PARAM_FLOATS,
    STATE_COPIES,
    STATS_BYTES_PER_IMAGE,
    OwnerRowCounts,
    crossover,
    owner_histograms,
    replicated_payload_bytes,
    ring_all_reduce_bytes,
    step_rows,
)
from distsplat_ns.balance.bands import num_tile_rows
from distsplat_ns.balance.cost import footprint_row_costs
from distsplat_ns.balance.partition import equal_rows_partition, partition_rows
from distsplat_ns.balance.routing import footprint_tile_rows

SHARED = SHARED_DATA.resolve()

# --------------------------------------------------------------------------------------------
# The scene: COLMAP cameras and points, Gaussians upsampled from the points
# --------------------------------------------------------------------------------------------


@dataclass
class SceneCameras:
    """The scene's sparse points and pinhole cameras (distortion ignored: it moves footprints
    by a few pixels at the image edge, far below a tile row)."""

    points: Tensor  # [P, 3] float32, world units
    viewmats: Tensor  # [C, 4, 4] world-to-camera, OpenCV
    Ks: Tensor  # [C, 3, 3] px
    width: int
    height: int
    names: list[str]


def load_colmap(scene_dir: Path, downscale: int) -> SceneCameras:
    """Points and cameras of ``scene_dir/sparse/0`` (COLMAP text or binary), intrinsics / downscale."""
    from nerfstudio.data.utils import colmap_parsing_utils as colmap

    cams, images, points = colmap.read_model(str(scene_dir / "sparse" / "0"))
    sizes = {(c.width, c.height) for c in cams.values()}
    if len(sizes) != 1:
        raise SystemExit(f"{scene_dir}: cameras of different sizes {sizes}; the model needs one size")
    width, height = sizes.pop()
    viewmats, Ks, names = [], [], []
    for image in sorted(images.values(), key=lambda im: im.name):
        cam = cams[image.camera_id]
        if cam.model in ("SIMPLE_PINHOLE", "SIMPLE_RADIAL", "SIMPLE_RADIAL_FISHEYE", "RADIAL"):
            fx = fy = cam.params[0]
            cx, cy = cam.params[1], cam.params[2]
        else:  # PINHOLE, OPENCV, OPENCV_FISHEYE, FULL_OPENCV: fx fy cx cy first
            fx, fy, cx, cy = cam.params[:4]
        view = np.eye(4)
        view[:3, :3] = colmap.qvec2rotmat(image.qvec)
        view[:3, 3] = image.tvec
        viewmats.append(view)
        Ks.append([[fx / downscale, 0, cx / downscale], [0, fy / downscale, cy / downscale], [0, 0, 1]])
        names.append(image.name)
    xyz = np.stack([p.xyz for p in points.values()])
    return SceneCameras(
        points=torch.tensor(xyz, dtype=torch.float32),
        viewmats=torch.tensor(np.stack(viewmats), dtype=torch.float32),
        Ks=torch.tensor(Ks, dtype=torch.float32),
        width=width // downscale,
        height=height // downscale,
        names=names,
    )


def street_of_copies(scene: SceneCameras, copies: int) -> SceneCameras:
    """``copies`` side-by-side copies of the scene, points and cameras alike (a street of
    facades): each camera then sees about ``1 / copies`` of the model, as in a large capture.

    Copies are spaced along the points' widest axis by twice its 2-98 % extent; camera ``i`` of
    copy ``k`` is camera ``i`` moved by the same offset as the points.
    """
    if copies == 1:
        return scene
    lo, hi = np.percentile(scene.points.numpy(), [2, 98], axis=0)
    axis = int(np.argmax(hi - lo))
    step = torch.zeros(3)
    step[axis] = 2.0 * float(hi[axis] - lo[axis])
    points, viewmats, names = [], [], []
    for k in range(copies):
        points.append(scene.points + k * step)
        moved = scene.viewmats.clone()
        # x_cam = R (x - k step) + t: the camera moved with its copy.
        moved[:, :3, 3] -= moved[:, :3, :3] @ (k * step)
        viewmats.append(moved)
        names.extend(f"{name}@{k}" for name in scene.names)
    return SceneCameras(
        torch.cat(points), torch.cat(viewmats), scene.Ks.repeat(copies, 1, 1), scene.width, scene.height, names
    )


def splatfacto_init_scales(points: Tensor) -> Tensor:
    """Splatfacto's initial scale of each point: the mean distance to its 3 nearest neighbours. `[P]`."""
    from scipy.spatial import cKDTree

    xyz = points.double().numpy()
    distances, _ = cKDTree(xyz).query(xyz, k=4)
    return torch.tensor(distances[:, 1:].mean(axis=1), dtype=torch.float32)


def upsampled_chunk(
    points: Tensor,
    point_scales: Tensor,
    start: int,
    stop: int,
    num_gaussians: int,
    alpha: float,
    jitter: float,
    seed: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """Gaussians ``start .. stop`` of the N-Gaussian model (draws seeded by ``seed`` and ``start``:
    deterministic for a given chunk size).

    Gaussian ``i`` is a copy of point ``i mod P``, moved by an isotropic normal offset of
    ``jitter x`` the point's scale, with isotropic scale ``point_scale x (P / N) ** alpha``.

    Returns:
        ``(means [n, 3], scales [n, 3], u [n])``; ``u`` uniform in [0, 1) draws the owner.
    """
    num_points = points.shape[0]
    index = torch.arange(start, stop) % num_points
    gen = torch.Generator().manual_seed(seed * 1_000_003 + start)
    base = point_scales[index]
    offsets = torch.randn(stop - start, 3, generator=gen) * (jitter * base)[:, None]
    shrink = (num_points / num_gaussians) ** alpha if num_gaussians > num_points else 1.0
    scales = (base * shrink)[:, None].expand(-1, 3).contiguous()
    return points[index] + offsets, scales, torch.rand(stop - start, generator=gen)


# --------------------------------------------------------------------------------------------
# Projection and counting
# --------------------------------------------------------------------------------------------


@dataclass
class Footprints:
    """What one N-Gaussian model looks like from the sampled cameras.

    Attributes:
        counts: ``counts[R][c]``: camera c's footprints counted by owner, owners drawn for R ranks.
        owned: ``owned[R]``: Gaussians each rank owns. `[R]` int64.
        row_costs: Per camera, Gaussian-tile overlaps per tile row (the planner's cold-start
            cost) of the first ``cost_sample`` Gaussians. `[T]`.
        visible: Per camera, Gaussians whose footprint meets the image. `[C]` int64.
        mean_rows_spanned: Mean tile rows a visible footprint covers, over cameras.
        mean_radius_px: Mean 3-sigma radius of the visible Gaussians, px.
    """

    counts: dict[int, list[OwnerRowCounts]]
    owned: dict[int, np.ndarray]
    row_costs: list[np.ndarray]
    visible: np.ndarray
    mean_rows_spanned: float
    mean_radius_px: float


def measure_footprints(
    scene: SceneCameras,
    point_scales: Tensor,
    num_gaussians: int,
    alpha: float,
    jitter: float,
    seed: int,
    world_sizes: Sequence[int],
    chunk: int,
    cost_sample: int,
) -> Footprints:
    """Project the N-Gaussian model (in chunks) into every camera of ``scene`` and count footprints.

    The planner's row costs come from the first ``cost_sample`` Gaussians (rounded up to a
    chunk): Gaussian ``i`` copies point ``i mod P``, so any ``>= P`` of them spread like the whole
    model, and the partition depends only on the ratios of row costs.
    """
    from distsplat_ns.rendering.api import project

    num_cams, width, height = scene.viewmats.shape[0], scene.width, scene.height
    num_rows = num_tile_rows(height)
    first_hist = {r: np.zeros((num_cams, r, num_rows + 1), dtype=np.int64) for r in world_sizes}
    end_hist = {r: np.zeros((num_cams, r, num_rows + 1), dtype=np.int64) for r in world_sizes}
    owned = {r: np.zeros(r, dtype=np.int64) for r in world_sizes}
    row_costs = [np.zeros(num_rows) for _ in range(num_cams)]
    visible = np.zeros(num_cams, dtype=np.int64)
    rows_spanned, radius_sum = 0, 0.0
    for start in range(0, num_gaussians, chunk):
        stop = min(start + chunk, num_gaussians)
        means, scales, u = upsampled_chunk(scene.points, point_scales, start, stop, num_gaussians, alpha, jitter, seed)
        n = stop - start
        quats = torch.zeros(n, 4)
        quats[:, 0] = 1.0
        with torch.no_grad():
            proj = project(
                means,
                quats,
                scales,
                torch.ones(n),
                torch.zeros(n, 3),
                scene.viewmats,
                scene.Ks,
                width,
                height,
                backend="reference",
            )
        first, end = footprint_tile_rows(proj.means2d.reshape(-1, 2), proj.radii.reshape(-1), height)
        first, end = first.reshape(num_cams, n), end.reshape(num_cams, n)
        seen = end > first
        visible += seen.sum(dim=1).numpy()
        rows_spanned += int((end - first)[seen].sum())
        radius_sum += float(proj.radii[seen].double().sum())
        if start < cost_sample:
            for cam in range(num_cams):
                row_costs[cam] += footprint_row_costs(proj.means2d[cam], proj.radii[cam], height, width).numpy()
        owners = {r: torch.clamp((u * r).long(), max=r - 1) for r in world_sizes}
        for world_size, (fh, eh) in owner_histograms(first, end, owners, num_rows).items():
            owned[world_size] += np.bincount(owners[world_size].numpy(), minlength=world_size)
            first_hist[world_size] += fh
            end_hist[world_size] += eh
    counts = {
        r: [OwnerRowCounts.from_histograms(first_hist[r][c], end_hist[r][c]) for c in range(num_cams)]
        for r in world_sizes
    }
    total_visible = max(int(visible.sum()), 1)
    return Footprints(
        counts=counts,
        owned=owned,
        row_costs=row_costs,
        visible=visible,
        mean_rows_spanned=rows_spanned / total_visible,
        mean_radius_px=radius_sum / total_visible,
    )


def sample_batches(num_cameras: int, batch_size: int, num_batches: int, rng: np.random.Generator) -> list[list[int]]:
    """Random batches of camera indices; a camera repeats only once every camera is in the batch."""
    batches = []
    for _ in range(num_batches):
        order: list[int] = []
        while len(order) < batch_size:
            order.extend(rng.permutation(num_cameras).tolist())
        batches.append(order[:batch_size])
    return batches


def evaluate(
    fp: Footprints,
    num_gaussians: int,
    world_size: int,
    batch_size: int,
    batches: Sequence[Sequence[int]],
    height: int,
    partition: str,
) -> dict[str, float]:
    """Bytes per step per rank of both modes for one (N, R, B), averaged over ``batches``."""
    num_rows = num_tile_rows(height)
    per_step_max, per_step_mean, received_max, sharded_screen, replicated_screen = [], [], [], [], []
    for batch in batches:
        if partition == "balanced":
            plan = partition_rows([fp.row_costs[c] for c in batch], world_size)
        else:
            plan = equal_rows_partition([num_rows] * len(batch), world_size)
        counts = [fp.counts[world_size][c] for c in batch]
        rows = step_rows(plan, counts, [height] * len(batch))
        per_rank = rows.bytes_per_rank()
        per_step_max.append(float(per_rank.max()))
        per_step_mean.append(float(per_rank.mean()))
        received_max.append(int(rows.received.max()))
        # Screen-space rows held per rank (visible only, as a packed projection keeps them):
        # sharded, its own shard in every camera of the batch plus what it receives; replicated,
        # all N Gaussians in the cameras it has a band of.
        own_visible = sum(count.first_below[:, num_rows] for count in counts)  # [R]
        sharded_screen.append(
            float(
                (
                    own_visible * (FORWARD_ROW_BYTES + BACKWARD_ROW_BYTES - 8)
                    + rows.received * (FORWARD_ROW_BYTES + BACKWARD_ROW_BYTES)
                ).max()
            )
        )
        replicated_screen.append(
            max(
                sum(int(fp.visible[batch[band.position]]) for band in bands)
                * (FORWARD_ROW_BYTES + BACKWARD_ROW_BYTES - 8)
                for bands in plan
            )
        )
    replicated = {
        dens: ring_all_reduce_bytes(replicated_payload_bytes(num_gaussians, batch_size, dens), world_size)
        for dens in (True, False)
    }
    sharded_max = float(np.mean(per_step_max))
    return {
        "N": num_gaussians,
        "W": world_size,
        "B": batch_size,
        "replicated_bytes_densifying": replicated[True],
        "replicated_bytes": replicated[False],
        "sharded_bytes_max_rank": sharded_max,
        "sharded_bytes_max_rank_worst_batch": float(np.max(per_step_max)),
        "sharded_bytes_mean_rank": float(np.mean(per_step_mean)),
        "ratio_to_densifying": sharded_max / replicated[True],
        "ratio_to_replicated": sharded_max / replicated[False],
        "rows_received_max_rank": float(np.mean(received_max)),
        "count_exchange_bytes": 2 * COUNT_BYTES * (world_size - 1),
        "screen_bytes_sharded_max_rank": float(np.mean(sharded_screen)),
        "screen_bytes_replicated_max_rank": float(np.mean(replicated_screen)),
    }


# --------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------


def _mb(value: float) -> str:
    return f"{value / 1e6:,.1f}" if value >= 1e6 else f"{value / 1e6:.3f}"


def _b_star(b_star: float | None, crossing: dict) -> tuple[str, str]:
    """``(B*, B*/W)`` as text; ``> max B`` when there is no crossover in the grid."""
    if b_star is None:
        return f"> {crossing['max_B']}", "-"
    return f"{b_star:.1f}", f"{b_star / crossing['W']:.2f}"


def markdown_tables(result: dict) -> str:
    """The figures docs/sharded_traffic.md quotes, as markdown (primary alpha; crossovers for all)."""
    alpha = result["alphas"][0]
    rows = [r for r in result["rows"] if r["alpha"] == alpha]
    lines = [
        f"Bytes per step per rank, MB (alpha = {alpha}; sharded: max over ranks, mean over batches):",
        "",
        "| N | W | B | replicated, densifying | replicated | sharded max rank | sharded mean rank | sharded / densifying | sharded / replicated |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r["B"] in (1, r["W"], 2 * r["W"]):
            lines.append(
                f"| {r['N']:,} | {r['W']} | {r['B']} | {_mb(r['replicated_bytes_densifying'])} | {_mb(r['replicated_bytes'])} "
                f"| {_mb(r['sharded_bytes_max_rank'])} | {_mb(r['sharded_bytes_mean_rank'])} "
                f"| {r['ratio_to_densifying']:.3f} | {r['ratio_to_replicated']:.3f} |"
            )
    lines += [
        "",
        "Crossover batch size B* (sharded moves more than replicated for B > B*; '>' = not within the grid):",
        "",
        "| alpha | N | W | B* vs densifying | B*/W | B* vs replicated | B*/W | MB per extra image: sharded | replicated stats |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result["crossover"]:
        d, n = _b_star(c["B_star_densifying"], c), _b_star(c["B_star_replicated"], c)
        lines.append(
            f"| {c['alpha']} | {c['N']:,} | {c['W']} | {d[0]} | {d[1]} | {n[0]} | {n[1]} "
            f"| {_mb(c['sharded_bytes_per_image'])} | {_mb(c['replicated_stats_bytes_per_image'])} |"
        )
    lines += [
        "",
        f"Per-rank memory at B = W, MB (alpha = {alpha}):",
        "",
        "| N | W | replicated state | sharded state | replicated screen rows | sharded screen rows |",
        "|---|---|---|---|---|---|",
    ]
    for m in result["memory"]:
        lines.append(
            f"| {m['N']:,} | {m['W']} | {_mb(m['replicated_state_bytes'])} | {_mb(m['sharded_state_bytes'])} "
            f"| {_mb(m['replicated_screen_bytes'])} | {_mb(m['sharded_screen_bytes'])} |"
        )
    lines += [
        "",
        "Footprints:",
        "",
        "| alpha | N | visible per camera (fraction of N) | mean tile rows per footprint | mean radius px | seconds |",
        "|---|---|---|---|---|---|",
    ]
    for f in result["footprints"]:
        lines.append(
            f"| {f['alpha']} | {f['N']:,} | {f['visible_fraction_mean']:.3f} | {f['mean_rows_spanned']:.2f} "
            f"| {f['mean_radius_px']:.1f} | {f['seconds']:.0f} |"
        )
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(float(v)) for v in text.split(",") if v]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scene", default="lund_door", help="COLMAP scene folder under ../shared/data, or a path")
    parser.add_argument("--copies", type=int, default=1, help="side-by-side copies of the scene (street_of_copies)")
    parser.add_argument("--downscale", type=int, default=1, help="image downscale factor (1: full resolution)")
    parser.add_argument("--cameras", type=int, default=12, help="cameras sampled (evenly over the sorted names)")
    parser.add_argument("--sizes", default="100000,1000000,3000000,10000000", help="Gaussian counts N")
    parser.add_argument("--world-sizes", default="2,4,8,16,32", help="ranks W")
    parser.add_argument("--alphas", default="0.5,0.3333", help="footprint shrink exponents; the first is the headline")
    parser.add_argument("--sensitivity-sizes", default="1000000,10000000", help="N for the alphas after the first")
    parser.add_argument("--jitter", type=float, default=0.5, help="copy offset, in units of the point's scale")
    parser.add_argument("--batches", type=int, default=8, help="random batches per (N, W, B)")
    parser.add_argument("--max-batch-per-rank", type=int, default=8, help="B grid: powers of two up to this x W")
    parser.add_argument("--partition", choices=("balanced", "equal"), default="balanced", help="band plan")
    parser.add_argument("--chunk", type=int, default=200_000, help="Gaussians projected at once")
    parser.add_argument(
        "--cost-sample", type=int, default=1_000_000, help="Gaussians the planner's row costs are counted on"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    scene_dir = Path(args.scene) if "/" in args.scene else SHARED / args.scene
    scene = street_of_copies(load_colmap(scene_dir, args.downscale), args.copies)
    pick = np.unique(
        np.linspace(0, scene.viewmats.shape[0] - 1, min(args.cameras, scene.viewmats.shape[0])).round().astype(int)
    )
    scene = SceneCameras(
        scene.points, scene.viewmats[pick], scene.Ks[pick], scene.width, scene.height, [scene.names[i] for i in pick]
    )
    point_scales = splatfacto_init_scales(scene.points)
    world_sizes, sizes = _ints(args.world_sizes), _ints(args.sizes)
    alphas = [float(a) for a in args.alphas.split(",")]
    result: dict = {
        "benchmark": "traffic_model",
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "scene": str(scene_dir),
        "copies": args.copies,
        "width": scene.width,
        "height": scene.height,
        "cameras": scene.names,
        "sparse_points": int(scene.points.shape[0]),
        "alphas": alphas,
        "jitter": args.jitter,
        "partition": args.partition,
        "batches_per_config": args.batches,
        "seed": args.seed,
        "bytes": {
            "param_floats": PARAM_FLOATS,
            "stats_per_image_gaussian": STATS_BYTES_PER_IMAGE,
            "forward_row": FORWARD_ROW_BYTES,
            "backward_row": BACKWARD_ROW_BYTES,
            "state_copies": STATE_COPIES,
        },
        "machine": machine_record(),
        "threads": args.threads,
        "footprints": [],
        "rows": [],
        "crossover": [],
        "memory": [],
    }
    rng = np.random.default_rng(args.seed)
    for alpha in alphas:
        for num_gaussians in sizes if alpha == alphas[0] else _ints(args.sensitivity_sizes):
            t0 = time.perf_counter()
            fp = measure_footprints(
                scene,
                point_scales,
                num_gaussians,
                alpha,
                args.jitter,
                args.seed,
                world_sizes,
                args.chunk,
                args.cost_sample,
            )
            seconds = time.perf_counter() - t0
            result["footprints"].append(
                {
                    "alpha": alpha,
                    "N": num_gaussians,
                    "visible_fraction_mean": float(fp.visible.mean() / num_gaussians),
                    "visible_per_camera": fp.visible.tolist(),
                    "mean_rows_spanned": fp.mean_rows_spanned,
                    "mean_radius_px": fp.mean_radius_px,
                    "seconds": seconds,
                }
            )
            print(
                f"alpha={alpha} N={num_gaussians:,}: projected {len(pick)} cameras in {seconds:.0f} s", file=sys.stderr
            )
            for world_size in world_sizes:
                grid = [2**k for k in range(int(math.log2(args.max_batch_per_rank * world_size)) + 1)]
                rows = []
                for batch_size in grid:
                    batches = sample_batches(len(pick), batch_size, args.batches, rng)
                    row = evaluate(fp, num_gaussians, world_size, batch_size, batches, scene.height, args.partition)
                    rows.append({"alpha": alpha, **row})
                result["rows"].extend(rows)
                # Past B = W both modes grow linearly in B: what one more image adds to each.
                top, half = rows[-1], rows[-2]
                result["crossover"].append(
                    {
                        "alpha": alpha,
                        "N": num_gaussians,
                        "W": world_size,
                        "max_B": grid[-1],
                        "B_star_densifying": crossover(rows, "ratio_to_densifying"),
                        "B_star_replicated": crossover(rows, "ratio_to_replicated"),
                        "sharded_bytes_per_image": (top["sharded_bytes_max_rank"] - half["sharded_bytes_max_rank"])
                        / (top["B"] - half["B"]),
                        "replicated_stats_bytes_per_image": ring_all_reduce_bytes(
                            num_gaussians * STATS_BYTES_PER_IMAGE, world_size
                        ),
                    }
                )
                if alpha == alphas[0]:
                    at_w = next(r for r in rows if r["B"] == world_size)
                    state = PARAM_FLOATS * FLOAT_BYTES * STATE_COPIES
                    result["memory"].append(
                        {
                            "N": num_gaussians,
                            "W": world_size,
                            "B": world_size,
                            "replicated_state_bytes": num_gaussians * state,
                            "sharded_state_bytes": int(fp.owned[world_size].max()) * state,
                            "replicated_screen_bytes": at_w["screen_bytes_replicated_max_rank"],
                            "sharded_screen_bytes": at_w["screen_bytes_sharded_max_rank"],
                        }
                    )
    print(markdown_tables(result))
    finish_machine_record(result["machine"])
    if args.json is not None:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
