"""Compare two run folders' checkpoints tensor by tensor (``torch.equal``), for a code change that
must not change a number (scripts/train_compare_runs.sh writes the runs).

Every ``step-*.ckpt`` (a torch.save file) and every ``step-*.dcp`` folder (torch.distributed.checkpoint
rows, read whole on one process) under ``nerfstudio_models`` of each run of ``BEFORE`` is read with its
namesake under ``AFTER``; each tensor must be equal in dtype, shape and value and every other leaf
equal. Prints one JSON line per file and exits 1 on any difference.

Usage: python scripts/compare_checkpoints.py BEFORE/out AFTER/out
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flat(value, f"{prefix}{key}/"))
        return out
    if isinstance(tree, (list, tuple)):
        out = {}
        for i, value in enumerate(tree):
            out.update(_flat(value, f"{prefix}{i}/"))
        return out
    return {prefix.rstrip("/"): tree}


def _load(path: Path) -> dict[str, Any]:
    if path.is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        target = path.parent / f".{path.name}.compare.pt"
        dcp_to_torch_save(path, target)
        try:
            return _flat(torch.load(target, map_location="cpu", weights_only=False))
        finally:
            target.unlink()
    return _flat(torch.load(path, map_location="cpu", weights_only=False))


def _differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    found = [f"only before: {k}" for k in before.keys() - after.keys()] + [
        f"only after: {k}" for k in after.keys() - before.keys()
    ]
    for key in sorted(before.keys() & after.keys()):
        a, b = before[key], after[key]
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            same = (
                isinstance(a, torch.Tensor)
                and isinstance(b, torch.Tensor)
                and a.dtype == b.dtype
                and a.shape == b.shape
                and torch.equal(a, b)
            )
        else:
            same = a == b
        if not same:
            found.append(f"differs: {key}")
    return found


def main(before_root: Path, after_root: Path) -> int:
    failed = False
    files = sorted(p for p in before_root.rglob("nerfstudio_models/step-*") if p.suffix in (".ckpt", ".dcp"))
    if not files:
        print(f"no checkpoints under {before_root}", file=sys.stderr)
        return 1
    for path in files:
        rel = path.relative_to(before_root)
        before, after = _load(path), _load(after_root / rel)
        found = _differences(before, after)
        tensors = sum(isinstance(v, torch.Tensor) for v in before.values())
        print(
            json.dumps(
                {
                    "file": str(rel),
                    "tensors": tensors,
                    "leaves": len(before),
                    "equal": not found,
                    "differences": found[:20],
                }
            )
        )
        failed |= bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
