"""Rebuild, on this CPU machine, "the CUDA machine's packages + the carried wheels", and run in it.

scripts/gpu_check.sh installs only scripts/gpu_wheels.txt (with --no-deps) on top of what the bare
CUDA machine holds (scripts/gpu_machine_packages.txt). Whether that closure is complete can be
checked here, without the GPU, by running Python with exactly those packages on its path:

* the machine's packages: those of the listed names that this environment has, linked (same
  versions as here, not the machine's: torch 2.14.1 here, 2.11 there), numpy replaced by
  ``--numpy`` (default 2.4.6, the newest for CPython 3.11; the machine has 2.5.2);
* the carried wheels at the pinned versions, but built for this Python (3.11): the same releases as
  the 3.12 wheels in .whl;
* this project, installed from the working tree the way gpu_check.sh installs it.

Nothing else is importable (``python -S``: no site-packages), so an import that the carried set
misses fails here as it would there. Then it imports the entry points, collects
``pytest -m cuda tests`` (gpu_check.sh runs it there) and runs a 2-image CPU ``distsplat``
training through scripts/gpu_launch.py.

Usage: python scripts/gpu_simulate.py [--workdir /tmp/gpu-simulate] [--numpy 2.4.6] [--no-train]
Needs the network (pip download) the first time; a few minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from gpu_bench import canonical_name, parse_wheel_list, tail


def machine_package_names(path: Path) -> set[str]:
    return {
        canonical_name(line.strip())
        for line in path.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }


def top_level_entries(dist: md.Distribution) -> set[str]:
    """The site-packages entries (folders and modules) that a distribution installed."""
    entries = set()
    for file in dist.files or []:
        first = file.parts[0]
        if first in ("..", "bin", "__pycache__") or first.startswith(".."):
            continue
        entries.add(first)
    return entries


def link_machine_packages(dest: Path, names: set[str], skip: set[str]) -> dict[str, str]:
    """Symlink every installed distribution named in ``names`` (but not in ``skip``) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    linked: dict[str, str] = {}
    for dist in md.distributions():
        name = canonical_name(dist.metadata["Name"] or "")
        if name not in names or name in skip or name in linked:
            continue
        base = Path(str(dist.locate_file("")))
        for entry in top_level_entries(dist):
            source = base / entry
            target = dest / entry
            if source.exists() and not target.exists():
                target.symlink_to(source)
        linked[name] = dist.version
    return linked


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/gpu-simulate"))
    parser.add_argument("--numpy", default="2.4.6", help="numpy version standing in for the machine's 2.5.2")
    parser.add_argument("--no-train", action="store_true", help="imports only, no training run")
    args = parser.parse_args()
    work: Path = args.workdir
    shutil.rmtree(work / "machine", ignore_errors=True)
    shutil.rmtree(work / "carried", ignore_errors=True)
    shutil.rmtree(work / "project", ignore_errors=True)
    pins = parse_wheel_list((ROOT / "scripts" / "gpu_wheels.txt").read_text())
    names = machine_package_names(ROOT / "scripts" / "gpu_machine_packages.txt")
    report: dict[str, object] = {"python": sys.version.split()[0], "numpy_stand_in": args.numpy}

    linked = link_machine_packages(work / "machine", names, skip={"numpy"} | {n for n, _ in pins})
    report["machine_packages_linked"] = linked
    report["machine_packages_absent_here"] = sorted(names - set(linked) - {"numpy"})
    pip("install", "-q", "--no-deps", "--only-binary=:all:", "--target", str(work / "machine"), f"numpy=={args.numpy}")
    # The 3.12 wheels' releases, for this Python.
    pip(
        "install",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--no-compile",
        "--target",
        str(work / "carried"),
        *[f"{n}=={v}" for n, v in pins],
    )
    pip(
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-build-isolation",
        "--no-compile",
        "--target",
        str(work / "project"),
        str(ROOT),
    )

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PYTHONPATH"] = os.pathsep.join(str(work / p) for p in ("project", "carried", "machine"))
    env["PYTHONUNBUFFERED"] = "1"
    python = [sys.executable, "-S"]  # no site-packages: only PYTHONPATH above
    checks: list[dict[str, object]] = []

    def check(name: str, cmd: list[str], timeout_s: float) -> bool:
        t0 = time.time()
        result = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False)
        ok = result.returncode == 0
        checks.append(
            {
                "check": name,
                "ok": ok,
                "seconds": round(time.time() - t0, 1),
                "output_tail": tail(result.stdout + result.stderr, 2500 if not ok else 300),
            }
        )
        print(f"[gpu_simulate] {name}: {'ok' if ok else 'FAILED'} ({time.time() - t0:.0f} s)", flush=True)
        if not ok:
            print(tail(result.stdout + result.stderr, 2500))
        return ok

    imports = (
        "import numpy, torch; import nerfstudio.scripts.train, nerfstudio.scripts.eval, distsplat_ns.registry, gsplat; "
        "print('numpy', numpy.__version__, 'torch', torch.__version__)"
    )
    ok = check("imports", python + ["-c", imports], 600)
    ok = ok and check(
        "entry point found",
        python
        + [
            "-c",
            "from nerfstudio.plugins.registry import discover_methods; m, _ = discover_methods(); assert 'distsplat' in m, sorted(m)",
        ],
        600,
    )
    # gpu_check.sh runs `pytest -m cuda tests`: every test module must at least import there.
    ok = (
        check(
            "pytest -m cuda collection",
            python + ["-m", "pytest", "-m", "cuda", "tests", "--collect-only", "-q", "-p", "no:cacheprovider"],
            600,
        )
        and ok
    )
    if ok and not args.no_train:
        out = work / "train"
        shutil.rmtree(out, ignore_errors=True)
        wrapper = work / "python-S"
        wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} -S "$@"\n')
        wrapper.chmod(0o755)
        cmd = python + [
            str(ROOT / "scripts" / "gpu_bench.py"),
            "bench",
            "--out",
            str(out / "bench.json"),
            "--python",
            str(wrapper),
            "--workdir",
            str(out),
            "--data",
            str(ROOT / "scenes" / "lund_door"),
            "--device",
            "cpu",
            "--images",
            "2",
            "--images-two-procs",
            "2",
            "--deadline",
            str(time.time() + 900),
            "--only",
            "distsplat_b1",
            "--dry-run",
        ]
        ok = check("distsplat 2-image CPU run via gpu_launch.py", cmd, 900)
        bench = json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else {}
        run = (bench.get("runs") or {}).get("distsplat_b1", {})
        checks[-1]["run_status"] = run.get("status")
        checks[-1]["run_reason"] = run.get("reason")
        ok = ok and run.get("status") == "ok"
    report["checks"] = checks
    report["ok"] = ok
    (work / "report.json").write_text(json.dumps(report, indent=1))
    print(f"[gpu_simulate] {'ok' if ok else 'FAILED'}; report in {work / 'report.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
