"""Memory of a sharded resume: a rank that loads a whole-model checkpoint memory-mapped and keeps
its owned block holds about 1/W of the model in anonymous memory (parallel/full_state.py).

Writes a synthetic checkpoint (N Gaussians at SH degree 3, both Adam moments, strategy state),
then, in a fresh process per case, loads it whole (replicated) or mmap'd and sliced for rank 0 of
W, and prints the process's anonymous and file-backed resident memory before and after (MB).
File-backed pages are the clean, reclaimable page cache of the mapping.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/bench_shard_resume_memory.py --num 1000000
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

SHAPES = {"means": (3,), "scales": (3,), "quats": (4,), "features_dc": (3,), "features_rest": (15, 3), "opacities": (1,)}


def _memory_mb() -> dict:
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
    return {k: int(fields[k].split()[0]) // 1024 for k in ("RssAnon", "RssFile")}


def _write(path: Path, num: int) -> None:
    pipeline = {f"_model.gauss_params.{n}": torch.randn(num, *s) for n, s in SHAPES.items()}
    state = {"grad2d": torch.rand(num), "count": torch.rand(num), "radii": torch.rand(num), "gauss_ids": torch.arange(num)}
    pipeline["_model._extra_state"] = {"strategy_state": state, "step": 0, "next_gauss_id": num}
    optimizers = {
        n: {
            "state": {0: {"step": torch.tensor(5.0), "exp_avg": torch.randn(num, *s), "exp_avg_sq": torch.rand(num, *s)}},
            "param_groups": [{"lr": 1e-3, "params": [0]}],
        }
        for n, s in SHAPES.items()
    }
    torch.save({"step": 5, "pipeline": pipeline, "optimizers": optimizers}, path)


def _load(path: Path, world: int) -> dict:
    from distsplat_ns.checkpoint import load_checkpoint_file
    from distsplat_ns.parallel.full_state import shard_loaded_checkpoint_

    before = _memory_mb()
    loaded = load_checkpoint_file(path, mmap=world > 0)
    if world > 0:
        shard_loaded_checkpoint_(loaded, 0, world)
    gc.collect()
    return {"world": world or "whole (replicated)", "before_mb": before, "after_mb": _memory_mb()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--num", type=int, default=1_000_000)
    parser.add_argument("--load", nargs=2, metavar=("PATH", "WORLD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.load:
        print(json.dumps(_load(Path(args.load[0]), int(args.load[1]))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "whole.ckpt"
        _write(path, args.num)
        print(f"checkpoint of {args.num} Gaussians: {path.stat().st_size / 2**20:.0f} MB")
        for world in (0, 2, 4):
            out = subprocess.run([sys.executable, __file__, "--load", str(path), str(world)], check=True, capture_output=True, text=True)
            print(out.stdout.strip())


if __name__ == "__main__":
    main()
