"""Helpers of scripts/gpu_check.sh (docs/gpu.md): wheel checks, environment, test and benchmark JSON.

Standard library only at import time: it runs on the bare CUDA machine before anything is installed,
and on CPU for the dry run. Subcommands (``python scripts/gpu_bench.py SUBCOMMAND --help``):

* ``check-wheels``: every ``name==version`` of scripts/gpu_wheels.txt has exactly one wheel in the
  folder, and nothing else is there; prints and optionally writes the result as JSON.
* ``step``: add or replace one step's record (status, seconds, detail) in the summary JSON.
* ``env``: the machine, Python, torch, CUDA, GPU and package versions as JSON.
* ``junit``: pytest's JUnit XML as JSON, with the tests grouped by what docs/gpu.md asks them to cover
  (``--section NAME``: into that key of the file, the rest kept: gsplat 1.5.3's run beside 1.4.0's).
* ``junit-section``: copy one such section from another tests JSON (a resumed call's previous one).
* ``bench``: the training runs (distsplat B=1 and B=4, splatfacto, 2 processes on one GPU), each
  through scripts/gpu_launch.py, and their measurements as JSON.
* ``summary``: the targets of docs/gpu.md checked against the measured numbers, written into the summary.

Every JSON file written here carries ``"dry_run"``; numbers from a dry run (CPU, reference
rasterizer, a handful of images) say nothing about speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = ROOT / "scripts" / "gpu_launch.py"

#: The GPU targets (docs/gpu.md), checked by ``summary``.
TARGET_B1_STEP_TIME_RATIO_MAX = 1.05
TARGET_B4_IMAGES_PER_S_RATIO_MIN = 1.5
#: Steps dropped from the front of each run before averaging step times: CUDA context creation,
#: cuDNN/cuBLAS handles, the first gsplat kernel launches and the allocator warming up.
WARMUP_FRACTION = 0.1
WARMUP_MIN_STEPS = 5
#: A value larger than any run's step count: periodic evaluation and checkpoints are switched off
#: during the timed runs (the final evaluation and checkpoint still happen, outside the step timer).
NEVER = 1_000_000_000


#: Why splatfacto can run in the CPU dry run at all.
CPU_SPLATFACTO_NOTE = (
    "CPU proxy, not gsplat: gsplat has no CPU rasterizer, so scripts/gpu_launch.py "
    "--cpu-reference-renderer renders splatfacto with distsplat's reference rasterizer"
)

#: How the 2-process run shares the one GPU (docs/gpu.md).
TWO_PROCS_NOTE = (
    "2 torchrun ranks on one GPU, unpatched: distsplat's --dist-backend auto picks gloo when a host "
    "runs more ranks than it has GPUs (NCCL refuses two ranks on one device), and the ranks share "
    "cuda:0 round-robin (distsplat_ns/distributed/context.py)."
)


# --------------------------------------------------------------------------------------------- JSON
def sanitize(value: Any) -> Any:
    """JSON-safe copy of ``value``: NaN and infinities become None, paths and others become str."""
    if isinstance(value, dict):
        return {str(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [sanitize(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` as strict JSON (no NaN), atomically (temporary file, then rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(sanitize(data), indent=2, allow_nan=False) + "\n")
    os.replace(tmp, path)


def read_json(path: Path, default: Any = None) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def tail(text: str, num_chars: int = 3000) -> str:
    return text if len(text) <= num_chars else "..." + text[-num_chars:]


# ------------------------------------------------------------------------------------------- wheels
def canonical_name(name: str) -> str:
    """PEP 503 normalised project name (``Foo_Bar.baz`` -> ``foo-bar-baz``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_list(text: str) -> list[tuple[str, str]]:
    """``(name, version)`` pairs of a wheel list: one ``name==version`` a line, ``#`` comments.

    Raises:
        ValueError: a line that is not ``name==version``, or a project listed twice.
    """
    pins: list[tuple[str, str]] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)", line)
        if match is None:
            raise ValueError(f"wheel list line {number}: expected 'name==version', got {raw.strip()!r}")
        name = canonical_name(match.group(1))
        if name in seen:
            raise ValueError(f"wheel list line {number}: {name} already listed on line {seen[name]}")
        seen[name] = number
        pins.append((name, match.group(2)))
    return pins


def wheel_name_version(filename: str) -> tuple[str, str]:
    """``(canonical name, version)`` from a wheel file name (PEP 427).

    Raises:
        ValueError: not a ``.whl`` file name.
    """
    if not filename.endswith(".whl"):
        raise ValueError(f"not a wheel file name: {filename!r}")
    parts = filename[: -len(".whl")].split("-")
    if len(parts) not in (5, 6):
        raise ValueError(f"not a wheel file name (expected 5 or 6 dash-separated fields): {filename!r}")
    return canonical_name(parts[0]), parts[1]


def check_wheels(pins: Sequence[tuple[str, str]], wheel_dir: Path) -> dict[str, Any]:
    """Compare a wheel folder with the pins: missing, wrong version, duplicated, unlisted.

    ``ok`` is True when every pin has exactly one wheel of its version and nothing else is there
    (two versions of one project stop pip's whole install).
    """
    files = sorted(p.name for p in Path(wheel_dir).glob("*.whl")) if Path(wheel_dir).is_dir() else []
    found: dict[str, list[tuple[str, str]]] = {}
    unparsable = []
    for name in files:
        try:
            project, version = wheel_name_version(name)
        except ValueError:
            unparsable.append(name)
            continue
        found.setdefault(project, []).append((version, name))
    wanted = dict(pins)
    missing = [f"{n}=={v}" for n, v in pins if n not in found]
    wrong_version = [
        f"{n}: want {v}, have {', '.join(ver for ver, _ in found[n])}"
        for n, v in pins
        if n in found and all(ver != v for ver, _ in found[n])
    ]
    duplicated = sorted(n for n, entries in found.items() if len(entries) > 1)
    unlisted = sorted(entries[0][1] for n, entries in found.items() if n not in wanted)
    total = sum((Path(wheel_dir) / name).stat().st_size for name in files)
    return {
        "ok": not (missing or wrong_version or duplicated or unlisted or unparsable),
        "wheel_dir": str(wheel_dir),
        "num_pins": len(pins),
        "num_wheels": len(files),
        "total_bytes": total,
        "total_mib": round(total / 2**20, 2),
        "missing": missing,
        "wrong_version": wrong_version,
        "duplicated": duplicated,
        "unlisted": unlisted + unparsable,
        "wheels": files,
    }


# -------------------------------------------------------------------------------------- summary file
def record_step(summary_path: Path, name: str, status: str, seconds: float | None, detail: Any, dry_run: bool) -> None:
    """Add or replace step ``name`` in the summary JSON (created if absent)."""
    summary = read_json(summary_path, default=None) or {"dry_run": dry_run, "steps": {}}
    summary["dry_run"] = bool(summary.get("dry_run", False) or dry_run)
    summary.setdefault("steps", {})[name] = {"status": status, "seconds": seconds, "detail": detail}
    write_json(summary_path, summary)


# ---------------------------------------------------------------------------------------------- env
def _run_text(cmd: Sequence[str], timeout: float = 30.0) -> str | None:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout + out.stderr).strip() or None


def collect_env(dry_run: bool) -> dict[str, Any]:
    """What ran the check: host, Python, torch/CUDA/GPU, compiler and the packages that matter."""
    import importlib.metadata as md

    env: dict[str, Any] = {
        "dry_run": dry_run,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hostname": platform.node(),
        "machine": platform.machine(),
        "num_cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "python_executable": sys.executable,
        "commit": os.environ.get("GPU_CHECK_COMMIT") or _run_text(["git", "-C", str(ROOT), "rev-parse", "HEAD"]),
        "cuda_home": os.environ.get("CUDA_HOME"),
        "torch_cuda_arch_list": os.environ.get("TORCH_CUDA_ARCH_LIST"),
        "nvcc": _run_text(["nvcc", "--version"]),
        "nvidia_smi": _run_text(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
        ),
    }
    packages = {}
    for name in (
        "torch",
        "torchvision",
        "numpy",
        "nerfstudio",
        "gsplat",
        "distsplat_ns",
        "tyro",
        "viser",
        "torchmetrics",
        "pytest",
        "simplejpeg",
        "nerfacc",
    ):
        try:
            packages[name] = md.version(name)
        except md.PackageNotFoundError:
            packages[name] = None
    env["packages"] = packages
    try:
        import torch

        env["torch_cuda"] = torch.version.cuda
        env["cuda_available"] = torch.cuda.is_available()
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = {
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_bytes": props.total_memory,
                "multiprocessors": props.multi_processor_count,
                "device_count": torch.cuda.device_count(),
            }
            env["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version()) if hasattr(torch.cuda, "nccl") else None
    except Exception as err:  # noqa: BLE001 -- the environment record must not fail the check
        env["torch_error"] = repr(err)
    return env


# -------------------------------------------------------------------------------------------- junit
#: What the CUDA tests must cover (docs/gpu.md), and the words that identify such a test in its id.
COVERAGE_KEYWORDS: dict[str, tuple[str, ...]] = {
    "rasterization_parity": ("parity", "gsplat"),
    "training_step": ("train_step", "training_step", "train_iteration", "training"),
    "nccl_collectives": ("nccl",),
    "gloo_collectives": ("gloo",),
}


def parse_junit(xml_text: str) -> dict[str, Any]:
    """pytest's JUnit XML as ``{"counts": ..., "tests": [{id, outcome, seconds, message}]}``."""
    root = ET.fromstring(xml_text)
    tests = []
    for case in root.iter("testcase"):
        classname = case.get("classname", "")
        test_id = f"{classname.replace('.', '/')}.py::{case.get('name', '')}" if classname else case.get("name", "")
        outcome, message = "passed", None
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[child.tag]
                message = tail((child.get("message") or "") + "\n" + (child.text or ""), 2000).strip()
                break
        tests.append(
            {"id": test_id, "outcome": outcome, "seconds": float(case.get("time", 0) or 0), "message": message}
        )
    counts: dict[str, int] = {}
    for t in tests:
        counts[t["outcome"]] = counts.get(t["outcome"], 0) + 1
    coverage = {
        area: [t["id"] for t in tests if any(k in t["id"].lower() for k in words)]
        for area, words in COVERAGE_KEYWORDS.items()
    }
    return {"counts": counts, "tests": tests, "coverage": coverage}


def write_section(path: Path, key: str, value: Any, dry_run: bool) -> None:
    """Set ``key`` of the JSON file ``path`` to ``value``, keeping its other keys (created if absent)."""
    data = read_json(path, default=None) or {"dry_run": dry_run}
    data[key] = value
    write_json(path, data)


# -------------------------------------------------------------------------------------------- bench
@dataclass(frozen=True)
class RunSpec:
    """One timed training run."""

    name: str
    method: str
    """``distsplat`` or ``splatfacto``."""
    batch_size: int
    num_images: int
    num_procs: int = 1
    extra_args: tuple[str, ...] = ()
    """More ns-train arguments of the method (before the dataparser's), e.g. a shorter refinement schedule."""
    scene: str = ""
    """The scene, relative to the repository root; "" trains on the check's own (``BenchConfig.data``)."""


@dataclass
class BenchConfig:
    """Everything ``bench`` needs, from its command line."""

    out: Path
    workdir: Path
    data: Path
    device: str
    num_images: int
    num_images_b4: int
    """Images of the B=4 run: the same as ``num_images`` on CUDA (the comparison needs it)."""
    num_images_two_procs: int
    two_procs_batch_size: int
    deadline: float
    dry_run: bool
    run_timeout_s: float = 240.0
    min_run_s: float = 40.0
    only: tuple[str, ...] = ()
    python: str = sys.executable
    """Interpreter of the runs (scripts/gpu_simulate.py passes a wrapper that adds ``-S``)."""
    previous: dict[str, Any] | None = None
    """bench.json of an earlier call on the same machine: its finished runs are kept, not re-run."""


def plan_runs(cfg: BenchConfig) -> list[RunSpec]:
    """The runs in priority order: the B=1 comparison first, then B=4, then 2 processes."""
    runs = [
        RunSpec("distsplat_b1", "distsplat", 1, cfg.num_images),
        RunSpec("splatfacto", "splatfacto", 1, cfg.num_images),
        RunSpec("distsplat_b4", "distsplat", 4, cfg.num_images_b4),
        RunSpec("distsplat_2proc_gloo", "distsplat", cfg.two_procs_batch_size, cfg.num_images_two_procs, num_procs=2),
    ]
    if cfg.only:
        runs = [r for r in runs if r.name in cfg.only]
    return runs


def ns_train_args(run: RunSpec, output_dir: Path, data: Path, device: str) -> list[str]:
    """ns-train arguments for ``run``: same scene, schedule and logging for both methods.

    ``max_num_iterations`` counts images for distsplat (steps = images / B) and steps (= images,
    one camera per step) for splatfacto, so both see ``run.num_images`` images.
    """
    args = [
        run.method,
        "--output-dir",
        str(output_dir),
        "--experiment-name",
        run.name,
        "--timestamp",
        "bench",
        "--machine.device-type",
        device,
        "--max-num-iterations",
        str(run.num_images),
        "--steps-per-eval-image",
        str(NEVER),
        "--steps-per-eval-batch",
        "0",
        "--steps-per-eval-all-images",
        str(NEVER),
        "--steps-per-save",
        str(NEVER),
        "--vis",
        "tensorboard",
        "--viewer.quit-on-train-completion",
        "True",
        "--logging.local-writer.enable",
        "False",
    ]
    if run.method == "distsplat":
        args += ["--pipeline.batch-size", str(run.batch_size)]
    elif run.batch_size != 1:
        raise ValueError(f"splatfacto trains one image per step; got batch_size={run.batch_size} for run {run.name}")
    args += list(run.extra_args)
    args += [
        "colmap",
        "--data",
        str(data),
        "--colmap-path",
        "sparse/0",
        "--load-3D-points",
        "True",
        "--downscale-factor",
        "1",
    ]
    return args


def launch_command(
    run: RunSpec, report: Path, output_dir: Path, data: Path, device: str, python: str = sys.executable
) -> list[str]:
    """The full command of ``run``: scripts/gpu_launch.py, under torchrun for several processes."""
    launcher = [str(LAUNCHER), "--report", str(report), "--final-eval"]
    if run.method == "splatfacto" and device == "cpu":
        launcher.append("--cpu-reference-renderer")
    if run.num_procs > 1:
        prefix = [python, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={run.num_procs}"]
    else:
        prefix = [python]
    return prefix + launcher + ["--"] + ns_train_args(run, output_dir, data, device)


def step_time_stats(step_times: Sequence[float], batch_size: int) -> dict[str, Any]:
    """Steady-state step time and throughput: the first max(5, 10%) steps are dropped as warm-up.

    With too few steps to drop any (dry runs), every step is used and ``warmup_dropped`` is 0.
    """
    times = [float(t) for t in step_times]
    if not times:
        return {"num_steps_timed": 0}
    drop = max(WARMUP_MIN_STEPS, int(len(times) * WARMUP_FRACTION))
    steady = times[drop:] if len(times) > drop + 1 else times
    mean = statistics.fmean(steady)
    return {
        "num_steps_timed": len(times),
        "warmup_dropped": len(times) - len(steady),
        "step_time_s_mean": mean,
        "step_time_s_median": statistics.median(steady),
        "step_time_s_p90": sorted(steady)[min(len(steady) - 1, int(0.9 * len(steady)))],
        "images_per_s": batch_size / mean if mean > 0 else None,
        "all_steps_s": sum(times),
        "all_steps_images_per_s": batch_size * len(times) / sum(times) if sum(times) > 0 else None,
    }


def summarize_run(run: RunSpec, reports: list[dict[str, Any]], stats: dict[str, Any] | None) -> dict[str, Any]:
    """Measurements of one finished run from the launcher's per-rank reports and distsplat's stats."""
    by_rank = sorted(reports, key=lambda r: r.get("rank", 0))
    main = by_rank[0] if by_rank else {}
    result: dict[str, Any] = dict(step_time_stats(main.get("step_times_s", []), run.batch_size))
    result["peak_cuda_memory_allocated_bytes"] = [r.get("peak_cuda_memory_allocated_bytes") for r in by_rank]
    result["peak_cuda_memory_reserved_bytes"] = [r.get("peak_cuda_memory_reserved_bytes") for r in by_rank]
    result["patches"] = main.get("patches", [])
    psnr = None
    if run.method == "distsplat" and stats:
        psnr = stats.get("final_eval_psnr")
        result["distsplat_stats"] = stats
    final_eval = main.get("final_eval")
    if final_eval:
        result["final_eval"] = final_eval
        if psnr is None:
            psnr = (final_eval.get("metrics") or {}).get("psnr")
    result["final_psnr"] = psnr
    return result


def _kill_group(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the run's process group (the launcher writes its report), SIGKILL after ``grace_s``."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=grace_s)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


def execute_run(run: RunSpec, cfg: BenchConfig) -> dict[str, Any]:
    """Run one benchmark (or record why not) and return its JSON record."""
    record: dict[str, Any] = dataclasses.asdict(run)
    if run.num_procs > 1:
        record["note"] = TWO_PROCS_NOTE
    if run.method == "splatfacto" and cfg.device != "cuda":
        record["note"] = CPU_SPLATFACTO_NOTE
    remaining = cfg.deadline - time.time()
    if remaining < cfg.min_run_s:
        record.update(
            status="not run", reason=f"time budget: {remaining:.0f} s left, a run needs at least {cfg.min_run_s:.0f} s"
        )
        return record
    output_dir = cfg.workdir / "runs"
    run_dir = output_dir / run.name
    shutil.rmtree(run_dir, ignore_errors=True)
    report = cfg.workdir / "reports" / f"{run.name}.rank{{rank}}.json"
    for old in report.parent.glob(f"{run.name}.rank*.json"):
        old.unlink()
    data = ROOT / run.scene if run.scene else cfg.data
    cmd = launch_command(run, report, output_dir, data, cfg.device, python=cfg.python)
    record["command"] = " ".join(cmd)
    log_path = cfg.workdir / "logs" / f"{run.name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    timeout_s = min(cfg.run_timeout_s, remaining - 5.0)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            rc, timed_out = proc.returncode, True
    record["started_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))
    record["wall_s"] = time.time() - t0
    record["returncode"] = rc
    reports = [read_json(p, default={}) for p in sorted(report.parent.glob(f"{run.name}.rank*.json"))]
    stats_path = run_dir / run.method / "bench" / "distsplat_stats.json"
    stats = read_json(stats_path) if run.method == "distsplat" else None
    record["measurements"] = summarize_run(run, reports, stats)
    log_text = log_path.read_text(errors="replace")
    if timed_out:
        record.update(status="timeout", reason=f"stopped after {timeout_s:.0f} s (run limit or check budget)")
    elif rc != 0:
        errors = [r.get("error") for r in reports if r.get("error")]
        record.update(status="failed", reason=tail(errors[0], 1500) if errors else f"exit code {rc}")
    elif not reports or not all(r.get("completed") for r in reports):
        record.update(status="failed", reason="the launcher's report is missing or says the run did not complete")
    else:
        record.update(status="ok")
    record["log_tail"] = tail(log_text, 4000 if record["status"] != "ok" else 1200)
    return record


def compare(runs: dict[str, dict[str, Any]], dry_run: bool) -> dict[str, Any]:
    """The GPU speed targets (docs/gpu.md) from the runs: ratio, target and verdict (or why none)."""

    def measured(name: str, key: str) -> float | None:
        run = runs.get(name) or {}
        if run.get("status") != "ok":
            return None
        value = (run.get("measurements") or {}).get(key)
        return float(value) if isinstance(value, (int, float)) else None

    def verdict(ratio: float | None, ok: bool, why_missing: str) -> str:
        if dry_run:
            return "not measured (dry run)"
        if ratio is None:
            return f"not measured ({why_missing})"
        return "pass" if ok else "fail"

    out: dict[str, Any] = {}
    d1, s1 = measured("distsplat_b1", "step_time_s_mean"), measured("splatfacto", "step_time_s_mean")
    ratio = d1 / s1 if d1 is not None and s1 else None
    out["b1_step_time"] = {
        "distsplat_s": d1,
        "splatfacto_s": s1,
        "ratio": ratio,
        "target": f"<= {TARGET_B1_STEP_TIME_RATIO_MAX}",
        "verdict": verdict(
            ratio,
            ratio is not None and ratio <= TARGET_B1_STEP_TIME_RATIO_MAX,
            "distsplat_b1 or splatfacto did not finish",
        ),
    }
    d4, s_ips = measured("distsplat_b4", "images_per_s"), measured("splatfacto", "images_per_s")
    ratio4 = d4 / s_ips if d4 is not None and s_ips else None
    out["b4_images_per_s"] = {
        "distsplat_b4": d4,
        "splatfacto": s_ips,
        "ratio": ratio4,
        "target": f">= {TARGET_B4_IMAGES_PER_S_RATIO_MIN}",
        "verdict": verdict(
            ratio4,
            ratio4 is not None and ratio4 >= TARGET_B4_IMAGES_PER_S_RATIO_MIN,
            "distsplat_b4 or splatfacto did not finish",
        ),
    }
    out["final_psnr"] = {name: (r.get("measurements") or {}).get("final_psnr") for name, r in runs.items()}
    out["peak_cuda_memory_allocated_bytes"] = {
        name: (r.get("measurements") or {}).get("peak_cuda_memory_allocated_bytes") for name, r in runs.items()
    }
    return out


def reusable_record(run: RunSpec, cfg: BenchConfig) -> dict[str, Any] | None:
    """The finished record of the same run (same spec, data, device, dry-run flag) in ``cfg.previous``."""
    previous = cfg.previous or {}
    if previous.get("dry_run") != cfg.dry_run or previous.get("device") != cfg.device:
        return None
    if not run.scene and previous.get("data") != str(cfg.data):  # a run with its own scene names it in its spec
        return None
    record = (previous.get("runs") or {}).get(run.name)
    if not record or record.get("status") != "ok":
        return None
    # As JSON has it (a tuple reads back as a list); a field the record lacks is its default.
    defaults = dataclasses.asdict(RunSpec("", "", 0, 0))
    if any(sanitize(record.get(k, defaults[k])) != sanitize(v) for k, v in dataclasses.asdict(run).items()):
        return None
    return dict(record, reused_from_previous_call=True)


def run_bench(cfg: BenchConfig) -> dict[str, Any]:
    """All runs of :func:`plan_runs`, written to ``cfg.out`` after each one (a timeout keeps the rest)."""
    result: dict[str, Any] = {
        "dry_run": cfg.dry_run,
        "device": cfg.device,
        "data": str(cfg.data),
        "timing": "CUDA-synchronised ITER_TRAIN_TIME per step (scripts/gpu_launch.py); "
        f"first max({WARMUP_MIN_STEPS}, {int(WARMUP_FRACTION * 100)}%) steps dropped",
        "runs": {},
    }
    for run in plan_runs(cfg):
        print(
            f"[gpu_bench] {run.name}: {run.method} B={run.batch_size} images={run.num_images} procs={run.num_procs}",
            flush=True,
        )
        record = reusable_record(run, cfg)
        if record is None:
            record = execute_run(run, cfg)
        result["runs"][run.name] = record
        m = record.get("measurements") or {}
        print(
            f"[gpu_bench] {run.name}: {record['status']}"
            + (" (reused from the previous call)" if record.get("reused_from_previous_call") else "")
            + (f" ({record.get('reason')})" if record.get("reason") else "")
            + (
                f"; step {m['step_time_s_mean'] * 1e3:.1f} ms, {m['images_per_s']:.1f} img/s, PSNR {m.get('final_psnr')}"
                if m.get("step_time_s_mean")
                else ""
            ),
            flush=True,
        )
        result["comparison"] = compare(result["runs"], cfg.dry_run)
        write_json(cfg.out, result)
    result["comparison"] = compare(result["runs"], cfg.dry_run)
    write_json(cfg.out, result)
    return result


# ------------------------------------------------------------------------------------------ summary
def summarize(
    summary_path: Path, tests: dict[str, Any] | None, bench: dict[str, Any] | None, dry_run: bool
) -> dict[str, Any]:
    """Write the targets section of the summary JSON from the tests and bench results."""
    summary = read_json(summary_path, default=None) or {"dry_run": dry_run, "steps": {}}
    summary["dry_run"] = bool(summary.get("dry_run", False) or dry_run)
    targets: dict[str, Any] = {}
    if bench and bench.get("comparison"):
        targets.update({k: v for k, v in bench["comparison"].items() if k in ("b1_step_time", "b4_images_per_s")})
    parity_tests = [t for t in (tests or {}).get("tests", []) if "parity" in t["id"].lower()]
    outcomes = {t["outcome"] for t in parity_tests}
    if not parity_tests:
        parity_verdict = "not measured (no parity test ran)"
    elif outcomes & {"failed", "error"}:
        parity_verdict = "fail"
    elif outcomes == {"skipped"}:
        parity_verdict = "not measured (parity tests skipped" + (": dry run without CUDA)" if dry_run else ")")
    else:
        parity_verdict = "pass"
    targets["gsplat_parity"] = {
        "target": "max abs diff <= 1e-4 colours, <= 1e-3 relative gradients (asserted by the tests)",
        "tests": {t["id"]: t["outcome"] for t in parity_tests},
        "verdict": parity_verdict,
    }
    summary["targets"] = targets
    if bench and bench.get("memory"):
        # scripts/gpu_memory.py: the real allocator's whole-run peaks beside the stand-in's count.
        summary["memory"] = bench["memory"]
    if tests is not None:
        summary["tests_coverage"] = {
            area: (ids if ids else "MISSING: no CUDA test id mentions " + "/".join(COVERAGE_KEYWORDS[area]))
            for area, ids in tests.get("coverage", {}).items()
        }
    summary["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    write_json(summary_path, summary)
    return summary


# -------------------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("check-wheels", help="the wheel folder against scripts/gpu_wheels.txt")
    p.add_argument("--list", type=Path, default=ROOT / "scripts" / "gpu_wheels.txt")
    p.add_argument("--dir", type=Path, default=ROOT / ".whl")
    p.add_argument("--out", type=Path)

    p = sub.add_parser("step", help="record one step of the check in the summary JSON")
    p.add_argument("--summary", type=Path, required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--status", required=True)
    p.add_argument("--seconds", type=float)
    p.add_argument("--detail", default="")
    p.add_argument("--detail-json", type=Path, help="a JSON file whose content becomes the detail")
    p.add_argument("--dry-run", action="store_true")

    p = sub.add_parser("env", help="environment JSON")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--wheels-json", type=Path, help="check-wheels output, kept under 'wheel_check'")

    p = sub.add_parser("junit", help="pytest JUnit XML to JSON")
    p.add_argument("--xml", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--returncode", type=int, required=True)
    p.add_argument("--section", help="write into this key of --out, keeping the rest of the file")
    p.add_argument("--dry-run", action="store_true")

    p = sub.add_parser("junit-section", help="copy one section of a tests JSON into another")
    p.add_argument("--from", dest="source", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--section", required=True)

    p = sub.add_parser("bench", help="the timed training runs")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--data", type=Path, required=True)
    p.add_argument("--device", choices=("cuda", "cpu"), required=True)
    p.add_argument("--images", type=int, required=True, help="images per single-process run")
    p.add_argument("--images-b4", type=int, help="images of the B=4 run (default: --images)")
    p.add_argument("--images-two-procs", type=int, required=True, help="images of the 2-process run")
    p.add_argument(
        "--two-procs-batch-size", type=int, default=1, help="1: each image is split into bands across the 2 ranks"
    )
    p.add_argument("--deadline", type=float, required=True, help="Unix time by which every run must end")
    p.add_argument(
        "--run-timeout-s", type=float, default=240.0, help="longest one run may take (its steps so far are kept)"
    )
    p.add_argument("--only", nargs="*", default=[], help="run only these (names as in bench.json)")
    p.add_argument("--python", default=sys.executable, help="interpreter for the runs (default: this one)")
    p.add_argument("--previous", type=Path, help="bench.json of an earlier call: keep its finished runs")
    p.add_argument("--dry-run", action="store_true")

    p = sub.add_parser("summary", help="targets into the summary JSON")
    p.add_argument("--summary", type=Path, required=True)
    p.add_argument("--tests", type=Path)
    p.add_argument("--bench", type=Path)
    p.add_argument("--dry-run", action="store_true")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "check-wheels":
        result = check_wheels(parse_wheel_list(args.list.read_text()), args.dir)
        if args.out:
            write_json(args.out, result)
        print(json.dumps({k: v for k, v in result.items() if k != "wheels"}, indent=1))
        return 0 if result["ok"] else 1
    if args.command == "step":
        detail: Any = read_json(args.detail_json, default=args.detail) if args.detail_json else args.detail
        record_step(args.summary, args.name, args.status, args.seconds, detail, args.dry_run)
        return 0
    if args.command == "env":
        env = collect_env(args.dry_run)
        if args.wheels_json:
            env["wheel_check"] = read_json(args.wheels_json)
        write_json(args.out, env)
        return 0
    if args.command == "junit":
        try:
            parsed = parse_junit(args.xml.read_text())
        except (OSError, ET.ParseError) as err:
            parsed = {"counts": {}, "tests": [], "coverage": {k: [] for k in COVERAGE_KEYWORDS}, "error": repr(err)}
        parsed["pytest_returncode"] = args.returncode
        parsed["dry_run"] = args.dry_run
        if args.section:
            write_section(args.out, args.section, parsed, args.dry_run)
        else:
            write_json(args.out, parsed)
        return 0
    if args.command == "junit-section":
        section = (read_json(args.source, default={}) or {}).get(args.section)
        if section is None:
            print(f"{args.source} has no {args.section!r}", file=sys.stderr)
            return 1
        write_section(args.out, args.section, section, bool(section.get("dry_run")))
        return 0
    if args.command == "bench":
        cfg = BenchConfig(
            out=args.out,
            workdir=args.workdir,
            data=args.data,
            device=args.device,
            num_images=args.images,
            num_images_b4=args.images_b4 or args.images,
            num_images_two_procs=args.images_two_procs,
            two_procs_batch_size=args.two_procs_batch_size,
            deadline=args.deadline,
            dry_run=args.dry_run,
            run_timeout_s=args.run_timeout_s,
            only=tuple(args.only),
            python=args.python,
            previous=read_json(args.previous) if args.previous else None,
        )
        result = run_bench(cfg)
        return 0 if all(r["status"] in ("ok", "not run") for r in result["runs"].values()) else 1
    if args.command == "summary":
        tests = read_json(args.tests) if args.tests else None
        bench = read_json(args.bench) if args.bench else None
        summary = summarize(args.summary, tests, bench, args.dry_run)
        print(json.dumps(summary.get("targets", {}), indent=1))
        return 0
    raise AssertionError(args.command)


if __name__ == "__main__":
    sys.exit(main())
