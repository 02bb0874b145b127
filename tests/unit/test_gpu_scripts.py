"""The CPU-checkable parts of the CUDA check (docs/gpu.md): scripts/gpu_check.sh, prepare_gpu_wheels.sh,
gpu_bench.py and gpu_launch.py. The GPU run itself cannot happen here; docs/gpu.md says how to do
the dry run (`bash scripts/gpu_check.sh OUT --dry-run`, a few minutes on 2 cores)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "scripts"


bench = load_script("gpu_bench")
launch = load_script("gpu_launch")


def _run(name: str, method: str = "distsplat", batch_size: int = 1, num_images: int = 8, num_procs: int = 1):
    return bench.RunSpec(name, method, batch_size, num_images, num_procs)


# ------------------------------------------------------------------------------------------ shells
@pytest.mark.parametrize("script", ["gpu_check.sh", "prepare_gpu_wheels.sh"])
def test_shell_script_parses(script: str) -> None:
    result = subprocess.run(["bash", "-n", str(SCRIPTS / script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def test_gpu_check_without_outdir_prints_usage_and_exits_2() -> None:
    result = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh")], capture_output=True, text=True, cwd=ROOT, check=False
    )
    assert result.returncode == 2 and "usage" in result.stderr


def _fake_python(tmp_path: Path, calls: Path) -> Path:
    """A PYTHON for gpu_check.sh that logs each call (with PYTHONPATH), pretends pip and the import
    check succeed and the machine has no CUDA, skips the environment record (it imports torch) and
    hands everything else (gpu_bench.py's small commands) to this interpreter."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env bash\n"
        f"printf 'PYTHONPATH=%s ARGS=%s\\n' \"${{PYTHONPATH:-}}\" \"$*\" >> '{calls}'\n"
        'if [[ "$1" == -m && "$2" == pip ]]; then exit 0; fi\n'
        'if [[ "$1" == -c && "$2" == *cuda.is_available* ]]; then exit 1; fi\n'
        'if [[ "$1" == -c && "$2" == "import nerfstudio"* ]]; then exit 0; fi\n'
        'if [[ "$1" == scripts/gpu_bench.py && "$2" == env ]]; then exit 0; fi\n'
        f"exec '{sys.executable}' \"$@\"\n"
    )
    fake.chmod(0o755)
    return fake


@pytest.mark.parametrize("install", [False, True])
def test_dry_run_installs_like_the_real_run_only_with_gpu_check_install(tmp_path: Path, install: bool) -> None:
    wheels = tmp_path / "whl"
    wheels.mkdir()
    for name, version in bench.parse_wheel_list((SCRIPTS / "gpu_wheels.txt").read_text()):
        (wheels / f"{name.replace('-', '_')}-{version}-py3-none-any.whl").write_bytes(b"")
    calls = tmp_path / "calls.txt"
    cache = tmp_path / "cache"
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PYTHON": str(_fake_python(tmp_path, calls)),
        "GPU_CHECK_CACHE": str(cache),
        "GPU_CHECK_WHEEL_DIR": str(wheels),
        "GPU_CHECK_COMMIT": "test",
        "GPU_CHECK_SKIP_TESTS": "1",
        "GPU_CHECK_SKIP_BENCH": "1",
        "GPU_CHECK_SKIP_MEMORY": "1",
    }
    if install:
        env["GPU_CHECK_INSTALL"] = "1"
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(SCRIPTS / "gpu_check.sh"), str(out), "--dry-run"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    steps = json.loads((out / "summary.json").read_text())["steps"]
    assert steps["gsplat_build"]["status"] == "skipped"
    assert steps["time_to_quality"]["status"] == "skipped" and "dry run" in steps["time_to_quality"]["detail"]
    assert steps["cost_unit"]["status"] == "skipped" and "dry run" in steps["cost_unit"]["detail"]
    assert steps["memory"] == {"status": "skipped", "seconds": 0.0, "detail": "GPU_CHECK_SKIP_MEMORY=1"}
    assert steps["gsplat_next_build"]["status"] == "skipped" and "dry run" in steps["gsplat_next_build"]["detail"]
    assert list(steps)[-1] == "gsplat_next_build"  # gsplat 1.5.3 is the last step
    log = calls.read_text().splitlines()
    pip_calls = [line for line in log if "ARGS=-m pip install" in line]
    if not install:
        assert steps["install"]["status"] == "skipped" and pip_calls == []
        return
    assert steps["install"]["status"] == "ok", steps["install"]
    site = cache / "site"
    wheel_call, project_call = pip_calls
    for flag in ("--no-index", "--no-deps", f"--target {site}"):
        assert flag in wheel_call and flag in project_call
    assert all(str(w) in wheel_call for w in wheels.glob("*.whl"))
    assert "--no-build-isolation" in project_call and project_call.endswith(" .")
    import_check = next(line for line in log if "ARGS=-c import nerfstudio" in line)
    assert import_check.startswith(f"PYTHONPATH={site}")
    assert (site / ".wheels-stamp").is_file()


def test_gpu_check_install_is_documented() -> None:
    assert "GPU_CHECK_INSTALL=1" in (SCRIPTS / "gpu_check.sh").read_text()
    assert "GPU_CHECK_INSTALL=1" in (ROOT / "docs" / "gpu.md").read_text()


# ------------------------------------------------------------------------------------------ wheels
def test_shipped_wheel_list_pins_nerfstudio_and_gsplat() -> None:
    pins = dict(bench.parse_wheel_list((SCRIPTS / "gpu_wheels.txt").read_text()))
    assert pins["nerfstudio"] == "1.1.5" and pins["gsplat"] == "1.4.0"


@pytest.mark.parametrize("already_on_machine", ["torch", "torchvision", "numpy", "open3d", "pymeshlab"])
def test_shipped_wheel_list_carries_nothing_the_machine_has_or_that_is_too_large(already_on_machine: str) -> None:
    pins = dict(bench.parse_wheel_list((SCRIPTS / "gpu_wheels.txt").read_text()))
    assert already_on_machine not in pins


def test_wheel_list_skips_comments_and_normalises_names() -> None:
    text = "# header\n\nFoo_Bar==1.0  # why\nbaz.qux==2.0rc1\n"
    assert bench.parse_wheel_list(text) == [("foo-bar", "1.0"), ("baz-qux", "2.0rc1")]


@pytest.mark.parametrize("line", ["foo", "foo>=1.0", "foo==", "==1.0"])
def test_wheel_list_rejects_a_line_without_exact_pin(line: str) -> None:
    with pytest.raises(ValueError, match="line 1"):
        bench.parse_wheel_list(line)


def test_wheel_list_rejects_a_project_listed_twice() -> None:
    with pytest.raises(ValueError, match="already listed on line 1"):
        bench.parse_wheel_list("foo==1.0\nFoo==2.0\n")


@pytest.mark.parametrize(
    "filename, expected",
    [
        ("gsplat-1.4.0-py3-none-any.whl", ("gsplat", "1.4.0")),
        ("docstring_parser-0.18.0-py3-none-any.whl", ("docstring-parser", "0.18.0")),
        ("msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl", ("msgspec", "0.23.0")),
        ("foo-1.0-1build-py3-none-any.whl", ("foo", "1.0")),
    ],
)
def test_wheel_file_name_gives_project_and_version(filename: str, expected: tuple) -> None:
    assert bench.wheel_name_version(filename) == expected


@pytest.mark.parametrize("filename", ["foo-1.0.tar.gz", "foo-1.0-py3.whl"])
def test_wheel_file_name_rejects_non_wheels(filename: str) -> None:
    with pytest.raises(ValueError):
        bench.wheel_name_version(filename)


def _wheel_dir(tmp_path: Path, names: list) -> Path:
    for name in names:
        (tmp_path / name).write_bytes(b"x" * 10)
    return tmp_path


PINS = [("foo", "1.0"), ("bar-baz", "2.0")]


def test_complete_wheel_folder_is_ok_and_sized(tmp_path: Path) -> None:
    result = bench.check_wheels(
        PINS, _wheel_dir(tmp_path, ["foo-1.0-py3-none-any.whl", "bar_baz-2.0-py3-none-any.whl"])
    )
    assert result["ok"] and result["total_bytes"] == 20


def test_wheel_folder_missing_a_pin_is_not_ok(tmp_path: Path) -> None:
    result = bench.check_wheels(PINS, _wheel_dir(tmp_path, ["foo-1.0-py3-none-any.whl"]))
    assert not result["ok"] and result["missing"] == ["bar-baz==2.0"]


def test_wheel_folder_with_two_versions_of_a_project_is_not_ok(tmp_path: Path) -> None:
    names = ["foo-1.0-py3-none-any.whl", "foo-1.1-py3-none-any.whl", "bar_baz-2.0-py3-none-any.whl"]
    result = bench.check_wheels(PINS, _wheel_dir(tmp_path, names))
    assert not result["ok"] and result["duplicated"] == ["foo"]


def test_wheel_folder_with_wrong_version_is_not_ok(tmp_path: Path) -> None:
    result = bench.check_wheels(
        PINS, _wheel_dir(tmp_path, ["foo-0.9-py3-none-any.whl", "bar_baz-2.0-py3-none-any.whl"])
    )
    assert not result["ok"] and result["wrong_version"] == ["foo: want 1.0, have 0.9"]


def test_wheel_folder_with_an_unlisted_wheel_is_not_ok(tmp_path: Path) -> None:
    names = ["foo-1.0-py3-none-any.whl", "bar_baz-2.0-py3-none-any.whl", "extra-3.0-py3-none-any.whl"]
    result = bench.check_wheels(PINS, _wheel_dir(tmp_path, names))
    assert not result["ok"] and result["unlisted"] == ["extra-3.0-py3-none-any.whl"]


# --------------------------------------------------------------------------------------------- JSON
def test_write_json_turns_non_finite_numbers_into_null(tmp_path: Path) -> None:
    path = tmp_path / "a" / "x.json"
    bench.write_json(path, {"nan": math.nan, "inf": [math.inf], "ok": 1.5, "path": Path("/p")})
    assert json.loads(path.read_text()) == {"nan": None, "inf": [None], "ok": 1.5, "path": "/p"}


def test_record_step_replaces_a_step_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    bench.record_step(path, "install", "failed", 1.0, "x", dry_run=False)
    bench.record_step(path, "tests", "ok", 2.0, "y", dry_run=False)
    bench.record_step(path, "install", "ok", 3.0, "z", dry_run=False)
    steps = json.loads(path.read_text())["steps"]
    assert steps == {
        "install": {"status": "ok", "seconds": 3.0, "detail": "z"},
        "tests": {"status": "ok", "seconds": 2.0, "detail": "y"},
    }


def test_record_step_keeps_dry_run_once_set(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    bench.record_step(path, "a", "ok", 0.0, "", dry_run=True)
    bench.record_step(path, "b", "ok", 0.0, "", dry_run=False)
    assert json.loads(path.read_text())["dry_run"] is True


# -------------------------------------------------------------------------------------------- junit
JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="tests.gpu.test_gsplat_parity" name="test_forward_parity[seed0]" time="1.5"/>
<testcase classname="tests.gpu.test_gsplat_parity" name="test_backward_parity" time="0.1">
  <failure message="max abs diff 2e-3">trace</failure></testcase>
<testcase classname="tests.gpu.test_collectives" name="test_nccl_all_reduce" time="0.0">
  <skipped message="no CUDA"/></testcase>
<testcase classname="tests.gpu.test_model" name="test_train_step_lowers_loss" time="2.0"/>
</testsuite></testsuites>"""


def test_junit_counts_outcomes() -> None:
    assert bench.parse_junit(JUNIT)["counts"] == {"passed": 2, "failed": 1, "skipped": 1}


def test_junit_keeps_the_failure_message() -> None:
    tests = {t["id"]: t for t in bench.parse_junit(JUNIT)["tests"]}
    assert "max abs diff 2e-3" in tests["tests/gpu/test_gsplat_parity.py::test_backward_parity"]["message"]


def test_junit_coverage_flags_a_missing_area() -> None:
    coverage = bench.parse_junit(JUNIT)["coverage"]
    assert coverage["gloo_collectives"] == [] and len(coverage["rasterization_parity"]) == 2


# -------------------------------------------------------------------------------------------- bench
def test_splatfacto_args_match_distsplat_args_except_batch_size(tmp_path: Path) -> None:
    d = bench.ns_train_args(_run("same", "distsplat", 1, 100), tmp_path, Path("scene"), "cuda")
    s = bench.ns_train_args(_run("same", "splatfacto", 1, 100), tmp_path, Path("scene"), "cuda")
    i = d.index("--pipeline.batch-size")
    assert d[1:i] + d[i + 2 :] == s[1:]


def test_both_methods_train_the_same_number_of_images(tmp_path: Path) -> None:
    args = bench.ns_train_args(_run("d", "distsplat", 4, 2000), tmp_path, Path("scene"), "cuda")
    assert (
        args[args.index("--max-num-iterations") + 1] == "2000" and args[args.index("--pipeline.batch-size") + 1] == "4"
    )


def test_splatfacto_with_a_batch_size_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="one image per step"):
        bench.ns_train_args(_run("s", "splatfacto", 4), tmp_path, Path("scene"), "cuda")


def test_two_process_run_goes_through_torchrun_unpatched(tmp_path: Path) -> None:
    # The GPU sharing is distsplat's own (--dist-backend auto -> gloo), not a launcher patch.
    cmd = bench.launch_command(
        _run("two", num_procs=2), tmp_path / "r.json", tmp_path, Path("scene"), "cuda", python="py"
    )
    assert cmd[:5] == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    assert "--dist-backend" not in cmd


def test_single_process_run_is_not_under_torchrun(tmp_path: Path) -> None:
    cmd = bench.launch_command(_run("one"), tmp_path / "r.json", tmp_path, Path("scene"), "cuda", python="py")
    assert cmd[0] == "py" and "torch.distributed.run" not in cmd


def test_step_stats_drop_warmup_steps() -> None:
    stats = bench.step_time_stats([9.0] * 5 + [0.5] * 95, batch_size=4)
    assert stats["warmup_dropped"] == 10 and stats["step_time_s_mean"] == 0.5 and stats["images_per_s"] == 8.0


def test_step_stats_use_every_step_when_there_are_too_few() -> None:
    stats = bench.step_time_stats([2.0, 4.0], batch_size=1)
    assert stats["warmup_dropped"] == 0 and stats["step_time_s_mean"] == 3.0


def test_step_stats_of_no_steps_say_so() -> None:
    assert bench.step_time_stats([], batch_size=1) == {"num_steps_timed": 0}


def _ok(step_s: float, batch: int) -> dict:
    return {
        "status": "ok",
        "measurements": {"step_time_s_mean": step_s, "images_per_s": batch / step_s, "final_psnr": 20.0},
    }


def test_comparison_passes_when_targets_are_met() -> None:
    runs = {"distsplat_b1": _ok(0.0102, 1), "splatfacto": _ok(0.010, 1), "distsplat_b4": _ok(0.020, 4)}
    out = bench.compare(runs, dry_run=False)
    assert out["b1_step_time"]["verdict"] == "pass" and out["b4_images_per_s"]["verdict"] == "pass"
    assert out["b4_images_per_s"]["ratio"] == pytest.approx(2.0)


def test_comparison_fails_a_slow_b1_step() -> None:
    runs = {"distsplat_b1": _ok(0.0110, 1), "splatfacto": _ok(0.010, 1)}
    assert bench.compare(runs, dry_run=False)["b1_step_time"]["verdict"] == "fail"


def test_comparison_without_splatfacto_is_not_measured() -> None:
    runs = {"distsplat_b1": _ok(0.01, 1), "splatfacto": {"status": "not run", "reason": "no CUDA"}}
    assert bench.compare(runs, dry_run=False)["b1_step_time"]["verdict"].startswith("not measured")


def test_comparison_of_a_dry_run_is_never_a_verdict() -> None:
    runs = {"distsplat_b1": _ok(0.01, 1), "splatfacto": _ok(0.02, 1), "distsplat_b4": _ok(0.01, 4)}
    out = bench.compare(runs, dry_run=True)
    assert {out["b1_step_time"]["verdict"], out["b4_images_per_s"]["verdict"]} == {"not measured (dry run)"}


def test_splatfacto_on_cpu_renders_with_the_reference_rasterizer(tmp_path: Path) -> None:
    cmd = bench.launch_command(
        _run("s", "splatfacto"), tmp_path / "r.json", tmp_path, Path("scene"), "cpu", python="py"
    )
    assert "--cpu-reference-renderer" in cmd[: cmd.index("--")]
    on_gpu = bench.launch_command(
        _run("s", "splatfacto"), tmp_path / "r.json", tmp_path, Path("scene"), "cuda", python="py"
    )
    assert "--cpu-reference-renderer" not in on_gpu
    distsplat = bench.launch_command(_run("d"), tmp_path / "r.json", tmp_path, Path("scene"), "cpu", python="py")
    assert "--cpu-reference-renderer" not in distsplat


def test_run_past_the_deadline_is_not_started(tmp_path: Path) -> None:
    cfg = bench.BenchConfig(
        out=tmp_path / "b.json",
        workdir=tmp_path,
        data=tmp_path,
        device="cpu",
        num_images=2,
        num_images_b4=4,
        num_images_two_procs=2,
        two_procs_batch_size=1,
        deadline=0.0,
        dry_run=True,
    )
    record = bench.execute_run(_run("distsplat_b1"), cfg)
    assert record["status"] == "not run" and record["reason"].startswith("time budget")


def test_summary_fails_parity_when_a_parity_test_failed(tmp_path: Path) -> None:
    summary = bench.summarize(tmp_path / "s.json", bench.parse_junit(JUNIT), None, dry_run=False)
    assert summary["targets"]["gsplat_parity"]["verdict"] == "fail"


def test_summary_without_parity_tests_says_not_measured(tmp_path: Path) -> None:
    summary = bench.summarize(tmp_path / "s.json", {"tests": [], "coverage": {}}, None, dry_run=True)
    assert summary["targets"]["gsplat_parity"]["verdict"].startswith("not measured") and summary["dry_run"]


# ------------------------------------------------------------------------------------------- launch
def test_launcher_splits_its_options_from_ns_train_arguments() -> None:
    args, rest = launch.parse_args(["--report", "r.json", "--final-eval", "--", "splatfacto", "--x", "1"])
    assert args.report == "r.json" and args.final_eval and not args.cpu_reference_renderer
    assert rest == ["splatfacto", "--x", "1"]


def test_launcher_requires_the_separator() -> None:
    with pytest.raises(SystemExit):
        launch.parse_args(["--report", "r.json", "splatfacto"])


def test_launcher_report_is_strict_json() -> None:
    assert launch.sanitize({"a": [math.nan, 1.0], "b": (1, "x")}) == {"a": [None, 1.0], "b": [1, "x"]}


def _cfg(tmp_path: Path, previous: dict) -> bench.BenchConfig:
    return bench.BenchConfig(
        out=tmp_path / "b.json",
        workdir=tmp_path,
        data=Path("scene"),
        device="cuda",
        num_images=8,
        num_images_b4=8,
        num_images_two_procs=2,
        two_procs_batch_size=1,
        deadline=0.0,
        dry_run=False,
        previous=previous,
    )


def _previous(status: str, num_images: int = 8) -> dict:
    record = {
        "name": "distsplat_b1",
        "method": "distsplat",
        "batch_size": 1,
        "num_images": num_images,
        "num_procs": 1,
        "status": status,
    }
    return {"dry_run": False, "device": "cuda", "data": "scene", "runs": {"distsplat_b1": record}}


def test_finished_run_of_a_previous_call_is_reused(tmp_path: Path) -> None:
    record = bench.reusable_record(_run("distsplat_b1"), _cfg(tmp_path, _previous("ok")))
    assert record is not None and record["reused_from_previous_call"]


@pytest.mark.parametrize("previous", [_previous("failed"), _previous("ok", num_images=4), None])
def test_failed_or_different_previous_run_is_not_reused(tmp_path: Path, previous) -> None:
    assert bench.reusable_record(_run("distsplat_b1"), _cfg(tmp_path, previous)) is None


# ------------------------------------------------------------------------- whole-run peak (launcher)
class _FakeCudaAllocator:
    """torch.cuda's peak functions over a peak the test sets (no CUDA here)."""

    def __init__(self) -> None:
        self.allocated = self.reserved = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import torch

        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "fake")
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: self.allocated)
        monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: self.reserved)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)

    def reset(self, device=None) -> None:
        self.allocated = self.reserved = 0


def test_launcher_peaks_cover_the_run_across_a_reset_of_the_peak(tmp_path: Path, monkeypatch) -> None:
    # distsplat's memory budget resets the peak at each event (gaussians/budget_measured.py).
    import torch

    fake = _FakeCudaAllocator()
    fake.install(monkeypatch)
    monkeypatch.setattr(launch, "REPORT", dict(launch.REPORT, patches=[], peak_resets=0))
    monkeypatch.setattr(launch, "_PEAKS_BEFORE_RESETS", {"allocated": 0, "reserved": 0})
    monkeypatch.setattr(launch, "_REPORT_PATH", tmp_path / "r.json")
    launch.patch_whole_run_peak()
    fake.allocated, fake.reserved = 300, 400
    torch.cuda.reset_peak_memory_stats(0)
    fake.allocated, fake.reserved = 100, 500
    launch.write_report()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["peak_cuda_memory_allocated_bytes"] == 300 and report["peak_cuda_memory_reserved_bytes"] == 500
    assert report["peak_resets"] == 1 and report["patches"][0].startswith("whole_run_peak")


# ---------------------------------------------------------------------------- memory runs (stand-in)
memory = load_script("gpu_memory")


def test_memory_runs_train_the_shipped_scene_through_a_refinement_on_two_backends(tmp_path: Path) -> None:
    reference, on_gsplat = (bench.ns_train_args(run, tmp_path, Path(run.scene), "cuda") for run in memory.memory_runs())
    backend = reference.index("--pipeline.model.rendering-backend")
    assert reference[backend + 1] == "reference" and on_gsplat[backend + 1] == "gsplat"
    # The same command but for the backend and the experiment's name (its output folder).
    assert [a for a in reference if a not in ("reference", "memory_reference")] == [
        a for a in on_gsplat if a not in ("gsplat", "memory_gsplat")
    ]
    assert reference[reference.index("--pipeline.model.refine-every") + 1] == "5"
    assert reference[reference.index("--data") + 1] == "scenes/lund_door" and (ROOT / "scenes/lund_door").is_dir()
    launched = bench.launch_command(
        memory.STANDIN_RUN, tmp_path / "r.json", tmp_path, ROOT / "scenes/lund_door", "cuda"
    )
    assert launched[launched.index("--") + 1 :] == bench.ns_train_args(
        memory.STANDIN_RUN, tmp_path, ROOT / "scenes/lund_door", "cuda"
    )


def test_committed_standin_figure_is_of_the_memory_run_the_gpu_check_trains() -> None:
    # A changed memory run needs `python -m benchmarks.standin_peak` again, or the lease compares nothing.
    found = memory.latest_standin()
    assert found is not None, "no benchmarks/results/standin_peak_*.json"
    path, data = found
    assert data["ns_train_args"] == memory.command_template(memory.STANDIN_RUN), path
    assert data["device_peak_bytes"]["0"] > 0 and data["backend"] == "reference"


def _memory_record(allocated: int, reserved: int, summary: int) -> dict:
    return {
        "status": "ok",
        "measurements": {
            "peak_cuda_memory_allocated_bytes": [allocated],
            "peak_cuda_memory_reserved_bytes": [reserved],
            "distsplat_stats": {"per_rank": [{"rank": 0, "peak_memory_bytes": summary}], "final_gaussian_count": 9},
        },
    }


def _standin(tmp_path: Path, args: list | None = None) -> tuple:
    data = {"ns_train_args": args or memory.command_template(memory.STANDIN_RUN), "device_peak_bytes": {"0": 200}}
    return tmp_path / "standin_peak_x.json", data


def test_memory_comparison_gives_per_rank_ratios_to_the_standin_count(tmp_path: Path) -> None:
    runs = {"memory_reference": _memory_record(250, 400, 250), "memory_gsplat": _memory_record(300, 500, 300)}
    out = memory.compare_memory(runs, _standin(tmp_path), dry_run=False)
    assert out["verdict"] == "measured" and out["standin"]["same_command"]
    rank0 = out["runs"]["memory_reference"]["per_rank"][0]
    assert rank0["allocated_over_standin"] == pytest.approx(1.25) and rank0["reserved_over_allocated"] == pytest.approx(
        1.6
    )
    assert rank0["run_summary_peak_bytes"] == 250 and rank0["run_summary_equals_allocated"]
    assert out["runs"]["memory_gsplat"]["per_rank"][0]["reserved_over_standin"] == pytest.approx(2.5)


@pytest.mark.parametrize("case", ["dry run", "no stand-in", "other command", "run failed"])
def test_memory_comparison_says_why_it_is_not_measured(tmp_path: Path, case: str) -> None:
    runs = {"memory_reference": _memory_record(250, 400, 250)}
    standin = None if case == "no stand-in" else _standin(tmp_path, ["other"] if case == "other command" else None)
    if case == "run failed":
        runs["memory_reference"]["status"] = "failed"
    verdict = memory.compare_memory(runs, standin, dry_run=case == "dry run")["verdict"]
    assert verdict.startswith("not"), verdict
    assert {"dry run": "dry run", "no stand-in": "standin_peak", "other command": "another command"}.get(
        case, "failed"
    ) in verdict


def test_memory_step_adds_its_runs_and_comparison_to_bench_json(tmp_path: Path) -> None:
    # Deadline 0: no run starts; the file keeps the timing runs and gets the memory runs' records.
    bench_json = tmp_path / "bench.json"
    bench.write_json(
        bench_json, {"dry_run": True, "device": "cpu", "data": "x", "runs": {"splatfacto": {"status": "ok"}}}
    )
    rc = memory.main(
        ["run", "--bench", str(bench_json), "--workdir", str(tmp_path), "--device", "cpu"]
        + ["--deadline", "0", "--dry-run"]
    )
    data = json.loads(bench_json.read_text())
    assert rc == 1 and set(data["runs"]) == {"splatfacto", "memory_reference", "memory_gsplat"}
    assert data["runs"]["memory_reference"]["status"] == "not run" and "CPU" in data["runs"]["memory_gsplat"]["reason"]
    assert data["memory"]["verdict"] == "not measured (dry run)"
    summary = bench.summarize(tmp_path / "s.json", None, data, dry_run=True)
    assert summary["memory"] == data["memory"]


def test_finished_memory_run_of_a_previous_call_is_reused(tmp_path: Path) -> None:
    run = memory.STANDIN_RUN
    record = dict(bench.sanitize(bench.dataclasses.asdict(run)), status="ok")
    previous = {"dry_run": False, "device": "cuda", "data": "other scene", "runs": {run.name: record}}
    assert bench.reusable_record(run, _cfg(tmp_path, previous)) is not None
    changed = bench.RunSpec(run.name, run.method, run.batch_size, run.num_images, extra_args=(), scene=run.scene)
    assert bench.reusable_record(changed, _cfg(tmp_path, previous)) is None


# ------------------------------------------------------------------------------------ gsplat 1.5.3
def test_junit_section_keeps_the_rest_of_the_file(tmp_path: Path) -> None:
    xml = tmp_path / "j.xml"
    xml.write_text(JUNIT)
    out = tmp_path / "tests.json"
    bench.main(["junit", "--xml", str(xml), "--out", str(out), "--returncode", "1"])
    bench.main(["junit", "--xml", str(xml), "--out", str(out), "--returncode", "0", "--section", "gsplat_1.5.3"])
    data = json.loads(out.read_text())
    assert data["pytest_returncode"] == 1 and data["gsplat_1.5.3"]["pytest_returncode"] == 0
    assert data["gsplat_1.5.3"]["counts"] == data["counts"]
    copy = tmp_path / "copy.json"
    assert bench.main(["junit-section", "--from", str(out), "--out", str(copy), "--section", "gsplat_1.5.3"]) == 0
    assert json.loads(copy.read_text())["gsplat_1.5.3"] == data["gsplat_1.5.3"]


def test_gsplat_next_version_is_the_same_in_the_three_scripts() -> None:
    import re

    found = {
        name: re.findall(rf"^{var}=(\S+)$", (SCRIPTS / name).read_text(), re.MULTILINE)
        for name, var in (
            ("gpu_check.sh", "NEXT_VERSION"),
            ("prepare_gpu_wheels.sh", "GSPLAT_NEXT_VERSION"),
            ("test_gsplat_next.sh", "DEFAULT_VERSION"),  # GSPLAT_VERSION may pick another there
        )
    }
    assert all(len(v) == 1 for v in found.values()) and len({v[0] for v in found.values()}) == 1, found
