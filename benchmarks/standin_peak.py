"""The device stand-in's peak device bytes of the GPU check's memory run, for the next lease to compare
with the real allocator's (docs/gpu.md, "Device memory: the allocator beside the stand-in").

Trains ``scripts/gpu_memory.py``'s ``STANDIN_RUN`` (distsplat B=1, 17 images of the shipped lund_door,
a refinement at step 15, the final eval and save; the reference backend) with the very ns-train
arguments ``scripts/gpu_check.sh`` gives it on the GPU, under tests/helpers/ns_train_standin.py on
the CPU, and writes each rank's ``device_peak_bytes`` (the stand-in allocator's peak over the whole
run: tests/helpers/device_memory.py) with the command to ``results/standin_peak_<date>.json``. The
GPU check reads the newest such file and compares only when its command is the one it ran.

    python -m benchmarks.standin_peak          # about 1 minute here
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    REPO,
    child_env,
    finish_machine_record,
    load_script,
    machine_record,
    result_path,
    run_command,
    write_json,
)

LAUNCHER = REPO / "tests" / "helpers" / "ns_train_standin.py"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="result file (default: results/standin_peak_<date>.json)")
    parser.add_argument("--timeout", type=float, default=1200.0, help="seconds before the run is killed")
    args = parser.parse_args(argv)
    gpu_memory = load_script("gpu_memory")
    run = gpu_memory.STANDIN_RUN
    template = gpu_memory.command_template(run)
    machine = machine_record()
    with tempfile.TemporaryDirectory(prefix="standin_peak_") as tmp:
        out = Path(tmp)
        ns_args = [str(out / "runs") if a == str(gpu_memory.OUTPUT_PLACEHOLDER) else a for a in template]
        report = out / "standin"
        cmd = [sys.executable, str(LAUNCHER), *ns_args]
        t0 = time.time()
        run_command(cmd, name=run.name, env=child_env(DISTSPLAT_STANDIN_REPORT=str(report)), timeout=args.timeout)
        wall_s = time.time() - t0
        reports = {int(p.name.rsplit("rank", 1)[1]): json.loads(p.read_text()) for p in out.glob("standin.rank*")}
        stats = json.loads(next((out / "runs").rglob("distsplat_stats.json")).read_text())
    rank0 = reports[0]  # one process: its device is cuda:0
    result = {
        "question": "the device stand-in's peak device bytes of the GPU check's memory run (scripts/gpu_memory.py)",
        "machine": finish_machine_record(machine),
        "run": run.name,
        "ns_train_args": template,
        "command": ["python", str(LAUNCHER.relative_to(REPO)), *template],
        "wall_s": wall_s,
        "device_peak_bytes": rank0["device_peak_bytes"],
        "budget_events": rank0.get("budget_events"),
        "run_summary_peak_memory_bytes": [r.get("peak_memory_bytes") for r in stats.get("per_rank", [])],
        "final_gaussian_count": stats.get("final_gaussian_count"),
        "steps": stats.get("steps"),
        "final_eval_psnr": stats.get("final_eval_psnr"),
        "backend": stats.get("backend"),
        "memory_budget": stats.get("memory_budget"),
    }
    path = args.out or result_path("standin_peak")
    write_json(path, result)
    print(f"{path}: device_peak_bytes {result['device_peak_bytes']} after {result['steps']} steps, {wall_s:.0f} s")


if __name__ == "__main__":
    main()
