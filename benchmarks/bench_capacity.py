"""Capacity with W: the largest rank's marginal device bytes (and host RSS) per Gaussian, sharded, W = 1, 2, 4, 8.

For each W in ``--worlds`` and each of two model sizes ``N_a < N_b`` (``--sizes``), one short
sharded run on one host (gloo): ``scenes/lund_door`` with splatfacto's random initialisation
of N Gaussians, densification off (every run holds the same N), ``--steps`` steps of B = 1, the
step-0 eval and the final eval over the held-out images, and the end-of-run save (every rank its
DCP shard, then rank 0's params-only consolidation). Each rank's peak is ``ru_maxrss`` of its own
process (VmHWM; ``trainer/run_record.py``, children -- the image decoders -- excluded), as
``bench_sharded.py --memory`` takes it; the worker (``--worker``, the ns-train entry point with
hooks) also records the peak after each phase (set-up, each eval, the steps, the save, the
consolidation) so the phase that sets the peak is known.

``--device standin`` (the default, issue 58): every rank trains on "cuda" under the device stand-in
(``tests/helpers/ns_train_standin.py``, the reference backend), whose allocator
(``tests/helpers/device_memory.py``) counts each rank's device bytes exactly: the run's peak, the peak
after each phase, and the live bytes per creating place at the peak (``DISTSPLAT_STANDIN_PEAK_SITES``),
so the slope is split by where its bytes were made (:func:`site_slopes`). The device tensors live in
host memory there, so the RSS beside it is what the host pays, not a GPU run's. ``--device cpu``:
the runs of issue 51 (CPU tensors, RSS only).

From the runs: per W, the largest process's peak at ``N_a`` and ``N_b``, its marginal bytes per
Gaussian ``(peak(N_b) - peak(N_a)) / (N_b - N_a)``, the ratio to W = 1's, and the verdict against
the target ``T / W``: T = 1.2 for the device bytes (issue 58), 1.5 for the RSS of ``--device cpu``
(issue 51); the JSON's ``target_numerator``.

Usage (repository root; runs W = 8 last, after checking the available memory):
    PYTHONPATH=$PWD nice -n 10 python -m benchmarks.bench_capacity [--sizes 100000 300000] [--device cpu]
Writes ``benchmarks/results/capacity_<date>.json`` (after every run, so a stopped set keeps what it
measured); ``--reanalyse FILE`` recomputes the table of a written JSON. docs/sharded.md, "Capacity
with W", reads it.

The launch goes through ``benchmarks/common.py`` (:func:`run_one`); the fit is
:func:`marginal_bytes_per_gaussian` and :func:`capacity_table` (pure; tests/unit/test_capacity_fit.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import (
    child_env,
    colmap_args,
    finish_machine_record,
    machine_record,
    run_command,
    train_command,
    unattended_args,
)

REPO = Path(__file__).resolve().parents[1]
SCENE = REPO / "scenes" / "lund_door"
WORLDS = (1, 2, 4, 8)
#: The target over W of the largest process's marginal bytes per Gaussian at W over W = 1's: issue 51's
#: for host RSS (``--device cpu``), issue 58's for device bytes under the stand-in.
TARGET_NUMERATOR = {"cpu": 1.5, "standin": 1.2}
#: The stand-in's extra host bytes per Gaussian for the launch check: its wrappers and the reference
#: backend's projections on "the device" (measured: W = 1 at 100,000 Gaussians peaked at 1.92 GiB RSS).
STANDIN_BYTES_PER_GAUSSIAN = 2_000
#: Creating places kept per rank in the JSON, largest first (the rest summed as "other").
SITES_KEPT = 48
#: Each rank's fixed base for the launch check: torch, nerfstudio and the dataset, 1.3-1.6 GB
#: (docs/sharded.md, "Memory at 2M Gaussians"), and what the first eval adds at any N (measured
#: here at 2,000 Gaussians: 0.3-0.55 GB per rank; every rank of W = 8 at 500,000 Gaussians peaked
#: at 1.47-1.67 GiB, docs/sharded.md "Capacity with W").
BASE_BYTES_PER_RANK = 1_600_000_000
#: Bytes per Gaussian, all ranks together, for the launch check: one process's peak above its
#: base (measured here at W = 1: 1,546 B) with a margin, plus the start-up draw's 76 B per
#: Gaussian of all N on every rank (README.md, "Memory per rank").
BYTES_PER_GAUSSIAN_W1 = 1_760
INIT_ALL_BYTES_PER_GAUSSIAN = 76
PHASES_FILE = "capacity_phases_rank{rank}.json"


# ----------------------------------------------------------------------------- the fit (pure)
def target_ratio(world: int, numerator: float = TARGET_NUMERATOR["cpu"]) -> float:
    """The target for the ratio at ``world`` ranks: ``numerator / W``.

    Raises:
        ValueError: ``world`` is below 1.
    """
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    return numerator / world


def marginal_bytes_per_gaussian(peak_a: float, peak_b: float, num_a: int, num_b: int) -> float:
    """The slope of a peak between two model sizes: ``(peak_b - peak_a) / (num_b - num_a)``.

    Args:
        peak_a: Peak bytes at ``num_a`` Gaussians.
        peak_b: Peak bytes at ``num_b`` Gaussians.
        num_a: The smaller model size (Gaussians over all ranks).
        num_b: The larger model size.

    Raises:
        ValueError: ``num_b <= num_a``.
    """
    if num_b <= num_a:
        raise ValueError(f"the two model sizes must grow: N_a = {num_a}, N_b = {num_b}")
    return (peak_b - peak_a) / (num_b - num_a)


def capacity_table(
    peaks: dict[tuple[int, int], Sequence[int]],
    num_a: int,
    num_b: int,
    numerator: float = TARGET_NUMERATOR["cpu"],
) -> list[dict[str, Any]]:
    """Per W (ascending), the largest process's marginal bytes per Gaussian, its ratio to W = 1's
    and the verdict against :func:`target_ratio`.

    Args:
        peaks: ``(world, num)`` -> every rank's peak bytes at that run; a W with only one of the
            two sizes is left out of the table.
        num_a: The smaller model size.
        num_b: The larger model size.
        numerator: The target's numerator (``target_ratio(W, numerator)``).

    Returns:
        One row per W measured at both sizes: ``world_size``, ``largest_peak_a_bytes``,
        ``largest_peak_b_bytes``, ``marginal_bytes_per_gaussian``, ``ratio_to_w1`` (None without
        W = 1), ``target_ratio``, ``reached`` (None without W = 1).

    Raises:
        ValueError: a run's per-rank list is empty or its length is not its W.
    """
    for (world, num), ranks in peaks.items():
        if len(ranks) != world:
            raise ValueError(f"run W = {world}, N = {num}: {len(ranks)} rank peaks, expected {world}")
    worlds = sorted({w for w, n in peaks if (w, num_a) in peaks and (w, num_b) in peaks})
    slopes = {
        w: marginal_bytes_per_gaussian(max(peaks[(w, num_a)]), max(peaks[(w, num_b)]), num_a, num_b) for w in worlds
    }
    one = slopes.get(1)
    rows = []
    for world in worlds:
        ratio = slopes[world] / one if one else None
        rows.append(
            {
                "world_size": world,
                "largest_peak_a_bytes": max(peaks[(world, num_a)]),
                "largest_peak_b_bytes": max(peaks[(world, num_b)]),
                "marginal_bytes_per_gaussian": slopes[world],
                "ratio_to_w1": ratio,
                "target_ratio": target_ratio(world, numerator),
                "reached": None if ratio is None else ratio <= target_ratio(world, numerator),
            }
        )
    return rows


def phase_slopes(
    runs: list[dict[str, Any]], num_a: int, num_b: int, key: str = "phase_peaks"
) -> dict[int, dict[str, float]]:
    """Per W, the largest process's marginal bytes per Gaussian after each recorded phase (the
    peak so far when the phase ended): where the slope first appears is the phase that sets it.
    ``key``: the runs' per-rank phase record (``phase_peaks``: RSS; ``phase_device_peaks``)."""
    by = {(r["world_size"], r["num_random"]): r for r in runs}
    out: dict[int, dict[str, float]] = {}
    for world in sorted({r["world_size"] for r in runs}):
        a, b = by.get((world, num_a)), by.get((world, num_b))
        if a is None or b is None or not a.get(key) or not b.get(key):
            continue
        # Rank 0 has every phase (it alone consolidates); each phase's peak is over the ranks that had it.
        names = [p for p in a[key][0] if p in b[key][0]]
        out[world] = {
            name: marginal_bytes_per_gaussian(
                max(rank[name] for rank in a[key] if name in rank),
                max(rank[name] for rank in b[key] if name in rank),
                num_a,
                num_b,
            )
            for name in names
        }
    return out


def site_slopes(
    sites_a: dict[str, Sequence[int]], sites_b: dict[str, Sequence[int]], num_a: int, num_b: int
) -> list[tuple[str, float]]:
    """The peak's slope split by creating place: per place, ``(bytes_b - bytes_a) / (N_b - N_a)``
    of the live bytes it held at the peak (``[bytes, storages]`` per place; absent: 0), largest first.
    Their sum is the slope of the two peaks the places were read at."""
    places = sorted(set(sites_a) | set(sites_b))
    slopes = [
        (place, marginal_bytes_per_gaussian(sites_a.get(place, (0,))[0], sites_b.get(place, (0,))[0], num_a, num_b))
        for place in places
    ]
    return sorted(slopes, key=lambda item: (-item[1], item[0]))


def largest_rank(peaks: Sequence[int]) -> int:
    """The rank with the largest peak (the lowest such rank on a tie)."""
    return max(range(len(peaks)), key=lambda r: (peaks[r], -r))


def analyse(runs: list[dict[str, Any]], num_a: int, num_b: int, numerator: float) -> dict[str, Any]:
    """The tables and the phase slopes of a run set: device bytes (runs under the stand-in) and RSS;
    per W, the device slope of the largest rank split by creating place (at N_b's largest rank and
    the same rank at N_a)."""
    rss = {(r["world_size"], r["num_random"]): r["peak_rss_bytes_per_rank"] for r in runs}
    device = {
        (r["world_size"], r["num_random"]): r["peak_device_bytes_per_rank"]
        for r in runs
        if "peak_device_bytes_per_rank" in r
    }
    out: dict[str, Any] = {
        "rss_table": capacity_table(rss, num_a, num_b, numerator),
        "phase_slopes": phase_slopes(runs, num_a, num_b),
    }
    if device:
        out["table"] = capacity_table(device, num_a, num_b, numerator)
        out["device_phase_slopes"] = phase_slopes(runs, num_a, num_b, "phase_device_peaks")
        by = {(r["world_size"], r["num_random"]): r for r in runs}
        out["device_site_slopes"] = {}
        for world in sorted({w for w, _ in device if (w, num_a) in device and (w, num_b) in device}):
            a, b = by[(world, num_a)], by[(world, num_b)]
            rank = largest_rank(b["peak_device_bytes_per_rank"])
            if a.get("device_peak_sites_per_rank") and b.get("device_peak_sites_per_rank"):
                split = site_slopes(
                    a["device_peak_sites_per_rank"][rank], b["device_peak_sites_per_rank"][rank], num_a, num_b
                )
                out["device_site_slopes"][world] = {"rank": rank, "slopes": [[p, v] for p, v in split if abs(v) >= 0.5]}
    else:
        out["table"] = out["rss_table"]
    return out


# ----------------------------------------------------------------------------- launching
def ns_train_args(out: Path, name: str, num: int, steps: int, device: str = "cpu") -> list[str]:
    """The ``ns-train distsplat`` arguments of one run (without the program): sharded, B = 1,
    ``steps`` steps, random initialisation of ``num`` Gaussians, densification off, no save
    before the end-of-run one, the step-0 and final evals over the held-out images; ``device``
    ``standin``: on "cuda" with the reference backend (the stand-in runs no gsplat kernel)."""
    standin = ["--pipeline.model.rendering-backend", "reference"] if device == "standin" else []
    return [
        "distsplat",
        *standin,
        "--output-dir",
        str(out),
        "--experiment-name",
        "capacity",
        "--timestamp",
        name,
        "--max-num-iterations",
        str(steps),
        "--machine.device-type",
        "cuda" if device == "standin" else "cpu",
        *unattended_args(eval_at_step_0=True),
        "--pipeline.parallel",
        "sharded",
        "--pipeline.batch-size",
        "1",
        "--pipeline.model.random-init",
        "True",
        "--pipeline.model.num-random",
        str(num),
        "--pipeline.model.stop-split-at",
        "0",
        "--pipeline.model.num-downscales",
        "0",
        *colmap_args(SCENE),
    ]


def available_bytes() -> int:
    """MemAvailable from /proc/meminfo (what a new process may take without swapping out others)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/meminfo has no MemAvailable line")


def estimated_bytes(world: int, num: int, device: str = "cpu") -> int:
    """A run's memory, all ranks together, for the launch check (see the constants)."""
    per_gaussian = BYTES_PER_GAUSSIAN_W1 + world * INIT_ALL_BYTES_PER_GAUSSIAN
    if device == "standin":
        per_gaussian += STANDIN_BYTES_PER_GAUSSIAN
    return world * BASE_BYTES_PER_RANK + num * per_gaussian


def kept_sites(sites: dict[str, Sequence[int]], kept: int = SITES_KEPT) -> dict[str, list[int]]:
    """The ``kept`` places holding the most bytes, the rest summed under ``"other"``."""
    order = sorted(sites, key=lambda place: (-sites[place][0], place))
    out = {place: list(sites[place]) for place in order[:kept]}
    rest = order[kept:]
    if rest:
        out["other"] = [sum(sites[p][0] for p in rest), sum(sites[p][1] for p in rest)]
    return out


def run_one(work: Path, world: int, num: int, steps: int, timeout_s: float, device: str = "cpu") -> dict[str, Any]:
    """One run: launch, wait, read its summary and the phase peaks; its checkpoints are removed.

    Raises:
        RuntimeError: too little memory is available to launch it, or the run failed.
    """
    need, have = estimated_bytes(world, num, device), available_bytes()
    if need > have:
        raise RuntimeError(
            f"W = {world}, N = {num}: about {need / 2**30:.1f} GiB needed, {have / 2**30:.1f} GiB available; not launched"
        )
    name = f"sharded_w{world}_n{num}"
    # This module's --worker (the hooked ns-train) on one process, or under torchrun on ``world``.
    worker = "--worker-standin" if device == "standin" else "--worker"
    cmd = train_command(
        [worker, *ns_train_args(work, name, num, steps, device)], world_size=world, module="benchmarks.bench_capacity"
    )
    report = work / f"standin-{name}"
    env = child_env()
    if device == "standin":
        env.update(DISTSPLAT_STANDIN_REPORT=str(report), DISTSPLAT_STANDIN_PEAK_SITES="1")
    load_before = os.getloadavg()
    start = time.perf_counter()
    run_command(cmd, name=name, env=env, timeout=timeout_s)
    wall = time.perf_counter() - start
    run_dir = work / "capacity" / "distsplat" / name
    stats = json.loads((run_dir / "distsplat_stats.json").read_text())
    phases = [json.loads((run_dir / PHASES_FILE.format(rank=r)).read_text()) for r in range(world)]
    shutil.rmtree(run_dir / "nerfstudio_models", ignore_errors=True)  # ~2.3 GB per 1M Gaussians
    per_rank = stats["per_rank"]
    measured: dict[str, Any] = {}
    if device == "standin":
        # torchrun's rank r trains on cuda:r (one host); its report counts that device.
        reports = [json.loads(Path(f"{report}.rank{r}").read_text()) for r in range(world)]
        measured = {
            "peak_device_bytes_per_rank": [rep["device_peak_bytes"][str(r)] for r, rep in enumerate(reports)],
            "phase_device_peaks": [p["phase_device_peaks"] for p in phases],
            "device_peak_sites_per_rank": [
                kept_sites(rep["device_peak_sites"][str(r)]) for r, rep in enumerate(reports)
            ],
        }
    return {
        **measured,
        "world_size": world,
        "num_random": num,
        "steps": stats["steps"],
        "gaussians": stats["final_gaussian_count"],
        "evals": len(stats["eval_psnr_history"]),
        "local_gaussians_per_rank": [r["local_gaussian_count"] for r in per_rank],
        "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in per_rank],
        "final_peak_rss_bytes_per_rank": [p["final_peak_rss_bytes"] for p in phases],
        "phase_peaks": [p["phase_peaks"] for p in phases],
        "model_bytes_per_rank": [r["parameter_bytes"] + r["optimizer_state_bytes"] for r in per_rank],
        "available_bytes_at_launch": have,
        "load_average_at_launch": list(load_before),
        "command_wall_s": wall,
    }


# ----------------------------------------------------------------------------- the worker
def _peak_rss_bytes() -> int:
    from distsplat_ns.trainer.run_record import peak_memory_bytes

    return peak_memory_bytes(torch.device("cpu"))


def _peak_device_bytes() -> int:
    """This rank's run peak on its stand-in device (torchrun's local rank r trains on cuda:r)."""
    from tests.helpers import device_memory

    return device_memory.run_peak_bytes().get(int(os.environ.get("LOCAL_RANK", "0")), 0)


def worker_main(train_args: list[str], standin: bool = False) -> None:
    """``ns-train`` with the trainer's phases hooked: after set-up, each eval, the steps, the save
    and the consolidation this rank's peak so far is recorded (RSS and, ``standin``, the stand-in
    device's); the run folder gets ``capacity_phases_rank<R>.json`` after the summary (whose memory
    the summary's peak has). ``standin``: ns-train runs under ``tests/helpers/ns_train_standin.py``."""
    from distsplat_ns.parallel import shard_checkpoint

    phase_peaks: dict[str, int] = {}
    phase_device_peaks: dict[str, int] = {}
    counts: dict[str, int] = {}

    def mark(phase: str) -> None:
        counts[phase] = counts.get(phase, 0) + 1
        name = phase if counts[phase] == 1 else f"{phase}_{counts[phase]}"
        phase_peaks[name] = _peak_rss_bytes()
        if standin:
            phase_device_peaks[name] = _peak_device_bytes()

    def after(owner: Any, attr: str, phase: str) -> None:
        original = getattr(owner, attr)

        def hooked(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                mark(phase)

        setattr(owner, attr, hooked)

    after(shard_checkpoint, "consolidate_params", "consolidate")  # before trainer_checkpoints imports the name
    from distsplat_ns.trainer.distsplat_trainer import DistSplatTrainer

    after(DistSplatTrainer, "setup", "setup")
    after(DistSplatTrainer, "_eval_all", "eval")
    after(DistSplatTrainer, "_train_steps", "steps")
    after(DistSplatTrainer, "save_checkpoint", "save")
    original_write_stats = DistSplatTrainer._write_stats

    def write_stats(self: Any) -> None:
        original_write_stats(self)
        record = {
            "phase_peaks": phase_peaks,
            "phase_device_peaks": phase_device_peaks,
            "final_peak_rss_bytes": _peak_rss_bytes(),
        }
        (self.base_dir / PHASES_FILE.format(rank=self.ctx.rank)).write_text(json.dumps(record, indent=2))

    DistSplatTrainer._write_stats = write_stats
    sys.argv = [sys.argv[0], *train_args]
    if standin:
        from tests.helpers import ns_train_standin

        ns_train_standin.main()  # installs the stand-in, hooks the steps, writes the report
        return
    from nerfstudio.scripts.train import entrypoint

    entrypoint()


# ----------------------------------------------------------------------------- the result
def format_table(rows: list[dict[str, Any]], numerator: float = TARGET_NUMERATOR["cpu"]) -> str:
    """The table as docs/sharded.md prints it (MiB, bytes per Gaussian, ratio, target, verdict)."""
    lines = [
        f"| W | largest peak at N_a (MiB) | at N_b (MiB) | marginal B / Gaussian | ratio to W = 1 | target {numerator} / W | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = "-" if r["ratio_to_w1"] is None else f"{r['ratio_to_w1']:.3f}"
        verdict = "-" if r["reached"] is None else ("reached" if r["reached"] else "not reached")
        lines.append(
            f"| {r['world_size']} | {r['largest_peak_a_bytes'] / 2**20:.0f} | {r['largest_peak_b_bytes'] / 2**20:.0f} | "
            f"{r['marginal_bytes_per_gaussian']:.0f} | {ratio} | {r['target_ratio']:.3f} | {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] in ("--worker", "--worker-standin"):
        worker_main(sys.argv[2:], standin=sys.argv[1] == "--worker-standin")
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs=2, default=(500_000, 1_500_000), metavar=("N_A", "N_B"))
    parser.add_argument("--worlds", type=int, nargs="+", default=list(WORLDS))
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (B = 1)")
    parser.add_argument(
        "--device",
        choices=("standin", "cpu"),
        default="standin",
        help="standin: device bytes under the CUDA stand-in, RSS beside; cpu: CPU tensors, RSS only",
    )
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench_capacity"))
    parser.add_argument("--out", type=Path, default=None, help="default benchmarks/results/capacity_<date>.json")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per run")
    parser.add_argument(
        "--reanalyse", type=Path, default=None, help="a written JSON: recompute its table from its runs"
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        default=None,
        help="a written JSON at the same sizes: its runs of every W not in --worlds are kept (marked reused_from)",
    )
    args = parser.parse_args()
    if args.reanalyse is not None:
        result = json.loads(args.reanalyse.read_text())
        numerator = result.get("target_numerator", TARGET_NUMERATOR["cpu"])  # issue 51's files have none
        result.update(analyse(result["runs"], *result["sizes"], numerator))
        args.reanalyse.write_text(json.dumps(result, indent=2))
        print(format_table(result["table"], numerator))
        return
    num_a, num_b = args.sizes
    marginal_bytes_per_gaussian(0, 0, num_a, num_b)  # refuses sizes that do not grow, before any run
    if any(w < 1 for w in args.worlds):
        raise SystemExit(f"--worlds: every W must be >= 1, got {args.worlds}")
    out = args.out or REPO / "benchmarks" / "results" / f"capacity_{time.strftime('%Y-%m-%d', time.gmtime())}.json"
    shutil.rmtree(args.work, ignore_errors=True)
    args.work.mkdir(parents=True)
    result: dict[str, Any] = {
        "command": "PYTHONPATH=$PWD nice -n 10 python -m benchmarks.bench_capacity " + " ".join(sys.argv[1:]),
        "scene": "scenes/lund_door (random initialisation), sharded, B = 1",
        "device": args.device,
        "target_numerator": TARGET_NUMERATOR[args.device],
        "sizes": [num_a, num_b],
        "steps": args.steps,
        "machine": machine_record(),
        "runs": [],
    }
    if args.reuse is not None:
        reused = json.loads(args.reuse.read_text())
        if list(reused["sizes"]) != [num_a, num_b]:
            raise SystemExit(f"--reuse {args.reuse}: sizes {reused['sizes']}, not --sizes {num_a} {num_b}")
        kept = [r for r in reused["runs"] if r["world_size"] not in args.worlds]
        result["runs"] = [{**r, "reused_from": r.get("reused_from", args.reuse.name)} for r in kept]
    for world in sorted(args.worlds):  # W = 8 last: the largest run starts once the others are done
        for num in (num_a, num_b):
            run = run_one(args.work, world, num, args.steps, args.timeout_s, args.device)
            result["runs"].append(run)
            result.update(
                analyse(result["runs"], num_a, num_b, TARGET_NUMERATOR[args.device]),
                finished_utc=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            )
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=2))
            device = [round(p / 2**20) for p in run.get("peak_device_bytes_per_rank", [])]
            print(
                f"W = {world}, N = {num}: RSS peaks {[round(p / 2**20) for p in run['peak_rss_bytes_per_rank']]} MiB, "
                f"device peaks {device} MiB, {run['command_wall_s']:.0f} s",
                flush=True,
            )
    finish_machine_record(result["machine"])
    out.write_text(json.dumps(result, indent=2))
    print(format_table(result["table"], TARGET_NUMERATOR[args.device]))
    if args.device == "standin":
        print("RSS beside it:\n" + format_table(result["rss_table"], TARGET_NUMERATOR[args.device]))


if __name__ == "__main__":
    main()
