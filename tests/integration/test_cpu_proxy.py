"""The CPU proxy of the GPU comparison: nerfstudio's splatfacto trained on CPU through
scripts/gpu_launch.py --cpu-reference-renderer (the path of the dry run and of
benchmarks/bench_step_overhead.py)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.nsrun import SCENE
from tests.helpers.scripts import load_script

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def test_splatfacto_trains_on_cpu_with_the_reference_rasterizer(tmp_path: Path) -> None:
    bench = load_script("gpu_bench")
    run = bench.RunSpec("splatfacto", "splatfacto", 1, 3)
    report = tmp_path / "report.json"
    cmd = bench.launch_command(run, report, tmp_path / "runs", SCENE, "cpu", python=sys.executable)
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False)
    data = json.loads(report.read_text())
    assert proc.returncode == 0 and data["completed"], (data.get("error"), proc.stderr[-2000:])
    assert len(data["step_times_s"]) == 3
    assert any(p.startswith("cpu_reference_renderer") for p in data["patches"])
    # splatfacto's own eval ran on what it trained: a real PSNR, not a placeholder.
    psnr = data["final_eval"]["metrics"]["psnr"]
    assert math.isfinite(psnr) and psnr > 5.0


def test_the_proxy_is_refused_where_cuda_exists(monkeypatch: pytest.MonkeyPatch) -> None:
    launch = load_script("gpu_launch")
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit, match="without CUDA"):
        launch.patch_cpu_reference_renderer()
