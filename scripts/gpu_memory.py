"""The real CUDA allocator's peak beside the device stand-in's count of the same run (docs/gpu.md,
"Device memory: the allocator beside the stand-in").

One short densifying run, distsplat B=1 on the shipped ``scenes/lund_door`` (17 images, a refinement at
step 15, the final eval and save), is defined here once: ``scripts/gpu_check.sh`` trains it on the GPU
through scripts/gpu_launch.py (whole-run ``max_memory_allocated`` and ``max_memory_reserved`` per rank),
and ``python -m benchmarks.standin_peak`` trains the same command on the CPU under the device stand-in
(tests/helpers/ns_train_standin.py), whose allocator counts the bytes of every tensor on the device
(``device_peak_bytes``) into ``benchmarks/results/standin_peak_<date>.json``. The GPU side puts the two
side by side, per rank, in bench.json's ``memory`` (and the summary's).

Two runs on the GPU: ``memory_reference``, the stand-in's very command (the reference backend: the
stand-in has no gsplat kernels), and ``memory_gsplat``, the same on the gsplat backend, what a user
trains (its ratio to the stand-in's count adds the two renderers' difference).

Standard library only at import, like scripts/gpu_bench.py. Subcommand: ``run`` (``--help``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_bench
from gpu_bench import ROOT, BenchConfig, RunSpec, read_json, write_json

SCENE = "scenes/lund_door"
"""In git, so it travels with every device call (162x242 px, 11,384 seed points)."""
NUM_IMAGES = 17
SCHEDULE = ("--pipeline.model.warmup-length", "5", "--pipeline.model.refine-every", "5")
"""gsplat's strategy refines at step 15 with these (not within 10 train images + 5 of the opacity
reset at step 0: distsplat_ns/gaussians/strategy.py:schedule_in_steps), as tests/multiproc/test_standin_training.py."""
STANDIN_GLOB = "standin_peak_*.json"
"""``python -m benchmarks.standin_peak``'s results under benchmarks/results/; the newest name is read."""
OUTPUT_PLACEHOLDER = Path("OUT")
"""The output folder in the command kept for comparison (each run has its own)."""


def memory_runs() -> list[RunSpec]:
    """The memory runs in order: the stand-in's own command (reference backend), then the same on gsplat."""
    return [
        RunSpec(
            f"memory_{backend}",
            "distsplat",
            1,
            NUM_IMAGES,
            extra_args=(*SCHEDULE, "--pipeline.model.rendering-backend", backend),
            scene=SCENE,
        )
        for backend in ("reference", "gsplat")
    ]


STANDIN_RUN = memory_runs()[0]
"""The run the stand-in trains (gsplat's kernels do not run on the CPU)."""


def command_template(run: RunSpec) -> list[str]:
    """``run``'s ns-train arguments with the output folder as :data:`OUTPUT_PLACEHOLDER`: the same for
    the GPU run and the stand-in's (``--machine.device-type cuda`` on both)."""
    return gpu_bench.ns_train_args(run, OUTPUT_PLACEHOLDER, Path(run.scene), "cuda")


def latest_standin(results: Path = ROOT / "benchmarks" / "results") -> tuple[Path, dict[str, Any]] | None:
    """The newest stand-in result (by its dated name) and its content, or None when there is none."""
    paths = sorted(results.glob(STANDIN_GLOB))
    if not paths:
        return None
    data = read_json(paths[-1])
    return (paths[-1], data) if isinstance(data, dict) else None


def _ratio(num: Any, den: Any) -> float | None:
    if isinstance(num, (int, float)) and isinstance(den, (int, float)) and den > 0:
        return num / den
    return None


def compare_memory(
    runs: dict[str, dict[str, Any]], standin: tuple[Path, dict[str, Any]] | None, dry_run: bool
) -> dict[str, Any]:
    """Per memory run and rank: the stand-in's count, the real allocator's whole-run peaks and the run
    summary's, and their ratios. ``verdict`` says whether the figures are comparable: the stand-in ran
    the same command, both finished, on a GPU."""
    out: dict[str, Any] = {"standin": None, "runs": {}}
    standin_peaks: dict[str, int] = {}
    same_command = False
    if standin is not None:
        path, data = standin
        same_command = data.get("ns_train_args") == command_template(STANDIN_RUN)
        standin_peaks = {str(k): v for k, v in (data.get("device_peak_bytes") or {}).items()}
        out["standin"] = {
            "file": str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path),
            "commit": (data.get("machine") or {}).get("git_commit"),
            "same_command": same_command,
            "device_peak_bytes": standin_peaks,
        }
    for run in memory_runs():
        record = runs.get(run.name) or {}
        m = record.get("measurements") or {}
        stats = m.get("distsplat_stats") or {}
        summary_peaks = [r.get("peak_memory_bytes") for r in stats.get("per_rank") or []] or [
            stats.get("peak_memory_bytes")
        ]
        allocated = m.get("peak_cuda_memory_allocated_bytes") or []
        reserved = m.get("peak_cuda_memory_reserved_bytes") or []
        per_rank = []
        for rank in range(max(len(allocated), 1)):
            s = standin_peaks.get(str(rank))  # rank r of the stand-in trains on cuda:r
            a = allocated[rank] if rank < len(allocated) else None
            r = reserved[rank] if rank < len(reserved) else None
            p = summary_peaks[rank] if rank < len(summary_peaks) else None
            per_rank.append(
                {
                    "rank": rank,
                    "standin_bytes": s,
                    "cuda_allocated_bytes": a,
                    "cuda_reserved_bytes": r,
                    "run_summary_peak_bytes": p,
                    # distsplat's own whole-run figure (RankBudget.run_peak_device_bytes), read after the
                    # end-of-run save and eval: the launcher's, at exit, may only be larger.
                    "run_summary_equals_allocated": p == a if a is not None and p is not None else None,
                    "allocated_over_standin": _ratio(a, s),
                    "reserved_over_standin": _ratio(r, s),
                    "reserved_over_allocated": _ratio(r, a),
                }
            )
        out["runs"][run.name] = {
            "status": record.get("status", "not run"),
            "backend": run.extra_args[-1],
            "final_gaussian_count": stats.get("final_gaussian_count"),
            "per_rank": per_rank,
        }
    reference = out["runs"][STANDIN_RUN.name]
    if dry_run:
        verdict = "not measured (dry run)"
    elif standin is None:
        verdict = f"not measured (no benchmarks/results/{STANDIN_GLOB}: run python -m benchmarks.standin_peak)"
    elif not same_command:
        verdict = (
            "not comparable (the stand-in's result is of another command: rerun python -m benchmarks.standin_peak)"
        )
    elif reference["status"] != "ok" or reference["per_rank"][0]["allocated_over_standin"] is None:
        verdict = f"not measured ({STANDIN_RUN.name}: {reference['status']})"
    else:
        verdict = "measured"
    out["verdict"] = verdict
    return out


def run_memory(cfg: BenchConfig, bench_path: Path, standin: tuple[Path, dict[str, Any]] | None) -> dict[str, Any]:
    """Train the memory runs (a finished one of ``cfg.previous`` is kept), add their records to the
    runs of ``bench_path`` (created if absent) and its ``memory`` comparison; returns the comparison."""
    bench = read_json(bench_path, default=None) or {
        "dry_run": cfg.dry_run,
        "device": cfg.device,
        "data": str(cfg.data),
        "runs": {},
    }
    for run in memory_runs():
        record = gpu_bench.reusable_record(run, cfg)
        if record is None and run.name == "memory_gsplat" and cfg.device != "cuda":
            record = dict(gpu_bench.dataclasses.asdict(run), status="not run", reason="gsplat has no CPU kernels")
        if record is None:
            print(f"[gpu_memory] {run.name}: distsplat B=1 on {run.scene}, {run.num_images} images", flush=True)
            record = gpu_bench.execute_run(run, cfg)
        bench.setdefault("runs", {})[run.name] = record
        m = record.get("measurements") or {}
        print(
            f"[gpu_memory] {run.name}: {record['status']}"
            + (f" ({record.get('reason')})" if record.get("reason") else "")
            + f"; peak allocated {m.get('peak_cuda_memory_allocated_bytes')}, reserved {m.get('peak_cuda_memory_reserved_bytes')}",
            flush=True,
        )
        bench["memory"] = compare_memory(bench["runs"], standin, cfg.dry_run)
        write_json(bench_path, bench)
    return bench["memory"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("run", help="the memory runs, into bench.json's runs and its 'memory' comparison")
    p.add_argument("--bench", type=Path, required=True, help="bench.json to add the runs and the comparison to")
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--deadline", type=float, required=True, help="Unix time by which every run must end")
    p.add_argument("--previous", type=Path, help="bench.json of an earlier call: keep its finished memory runs")
    p.add_argument("--standin", type=Path, help=f"the stand-in's result (default: the newest {STANDIN_GLOB})")
    p.add_argument("--python", default=sys.executable, help="interpreter for the runs (default: this one)")
    p.add_argument("--dry-run", action="store_true")
    args = parser.parse_args(argv)
    standin = (args.standin, read_json(args.standin)) if args.standin else latest_standin()
    existing = read_json(args.bench, default={}) or {}
    cfg = BenchConfig(
        out=args.bench,
        workdir=args.workdir,
        data=Path(existing.get("data") or ROOT / SCENE),
        device=args.device,
        num_images=NUM_IMAGES,
        num_images_b4=NUM_IMAGES,
        num_images_two_procs=NUM_IMAGES,
        two_procs_batch_size=1,
        deadline=args.deadline,
        dry_run=args.dry_run,
        python=args.python,
        previous=read_json(args.previous) if args.previous else None,
    )
    t0 = time.time()
    memory = run_memory(cfg, args.bench, standin)
    print(f"[gpu_memory] {memory['verdict']} in {time.time() - t0:.0f} s", flush=True)
    return 0 if memory["runs"][STANDIN_RUN.name]["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
