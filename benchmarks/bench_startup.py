"""Start-up CPU of an ``ns-*`` command: importing nerfstudio's method list, with and without
``distsplat_ns.utils.startup.register_frozen_module_files`` (docs/startup.md).

Each sample is a fresh interpreter that imports ``nerfstudio.configs.method_configs`` (what
``ns-train``, ``ns-export`` and ``ns-eval`` import first; it discovers the plugins, distsplat's
registry among them, then lists nerfstudio's external methods) and prints the process CPU time of
that import and how many of ``inspect.getmodule``'s calls scanned ``sys.modules``. The "without"
samples replace the registration with a no-op before the registry is imported. Samples alternate
(with, without, with, ...) so that load on the machine falls on both; the result is the ratio of
the medians, taken in the same run.

Usage: ``python benchmarks/bench_startup.py [--repeats 5]``; writes
benchmarks/results/startup_<date>.json and prints it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

PROBE = r"""
import inspect, json, sys, time
if sys.argv[1] == "without":
    import distsplat_ns.utils.startup as startup
    startup.register_frozen_module_files = lambda: 0
scans = 0
getmodule = inspect.getmodule
def counting_getmodule(obj, _filename=None):
    global scans
    if not inspect.ismodule(obj) and not hasattr(obj, "__module__") and _filename not in inspect.modulesbyfile:
        try:
            scans += inspect.getabsfile(obj, _filename) not in inspect.modulesbyfile
        except TypeError:
            pass
    return getmodule(obj, _filename)
inspect.getmodule = counting_getmodule
start = time.process_time()
import nerfstudio.configs.method_configs as method_configs
cpu = time.process_time() - start
assert "distsplat" in method_configs.all_methods
print(json.dumps({"cpu_s": cpu, "getmodule_scans": scans, "modules": len(sys.modules)}))
"""


def sample(variant: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", PROBE, variant], capture_output=True, text=True, env=env, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _torch_version() -> str:
    return subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, check=True).stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="samples of each variant")
    args = parser.parse_args()
    samples: dict[str, list[dict]] = {"with": [], "without": []}
    for _ in range(args.repeats):
        for variant, runs in samples.items():
            runs.append(sample(variant))
    medians = {v: statistics.median(s["cpu_s"] for s in runs) for v, runs in samples.items()}
    result = {
        "command": "python benchmarks/bench_startup.py " + " ".join(sys.argv[1:]),
        "date_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "torch": _torch_version(),
        "loadavg_end": os.getloadavg(),
        "median_cpu_s": medians,
        "ratio_with_over_without": medians["with"] / medians["without"],
        "saved_cpu_s_per_process": medians["without"] - medians["with"],
        "samples": samples,
    }
    target = REPO / "benchmarks" / "results" / f"startup_{datetime.date.today().isoformat()}.json"
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
