"""Where do runs on 1 and 2 processes part? A per-step trace of ns-train, and its comparison.

Usage::

    # trace: run ns-train (plain, or under torchrun) and record every step
    python benchmarks/float64_divergence.py trace --trace-dir T1 -- distsplat ... colmap ...
    torchrun --nproc_per_node 2 benchmarks/float64_divergence.py trace --trace-dir T2 -- distsplat ...
    # compare: first differing step of each recorded quantity, per-step figures as JSON
    python benchmarks/float64_divergence.py compare T1 T2

``trace`` wraps three pipeline/model methods (nothing else changes):

- ``BandTerms.gt_image``: a digest of every ground-truth image a rank composites, per
  (step, position) -- the data each run trains on;
- the replicated mode's gradient sum (``distributed/gradient_sum.py:BucketedGradientSum.finish``) and the modes'
  ``batch_info`` (``parallel/mode.py``): a digest of the summed gradients and of the reduced
  densification statistics;
- ``DistSplatPipeline.train_step``: the parameters after the optimizer step and the refinement; rank 0 saves them whole (float64, ``params/step-XXXXXX.pt``), plus the strategy's
  running statistics right before a refinement (``refine/step-XXXXXX.pt``);
- ``DistSplatTrainer._eval_all`` becomes a no-op (evaluation does not touch training).

``compare`` reports, per step: whether each digest matches, the Gaussian counts, the largest
parameter difference (while the counts agree) and, at the first step whose counts differ, which
densification decision flipped and how far its statistic was from the threshold in each run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha1()
    for t in tensors:
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _install_dedup_seed_points() -> None:
    """Diagnostic: drop repeated COLMAP points (identical xyz) before the Gaussians are seeded."""
    from nerfstudio.data.dataparsers.colmap_dataparser import ColmapDataParser

    from distsplat_ns.gaussians.initial import first_occurrences

    original = ColmapDataParser._load_3D_points

    def load(self, colmap_path, transform_matrix, scale_factor):
        out = original(self, colmap_path, transform_matrix, scale_factor)
        xyz = out["points3D_xyz"]
        keep = first_occurrences(xyz)
        return {k: (v[keep] if isinstance(v, torch.Tensor) and v.shape[:1] == xyz.shape[:1] else v) for k, v in out.items()}

    ColmapDataParser._load_3D_points = load


def _install_trace(trace_dir: Path, save_grads: bool = False) -> None:
    from distsplat_ns.model.band_terms import BandTerms
    from distsplat_ns.pipeline import DistSplatPipeline

    rank = int(os.environ.get("RANK", "0"))
    (trace_dir / "params").mkdir(parents=True, exist_ok=True)
    (trace_dir / "refine").mkdir(parents=True, exist_ok=True)
    if rank == 0:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        (trace_dir / "command.json").write_text(json.dumps({"argv": sys.argv, "world_size": world_size}))
    log = open(trace_dir / f"rank{rank}.jsonl", "a", buffering=1)  # noqa: SIM115 - lives as long as the run
    current: dict[str, Any] = {}

    original_gt = BandTerms.gt_image

    def gt_image(self, image, background, downscale, size_px):
        out = original_gt(self, image, background, downscale, size_px)
        current.setdefault("gt", []).append(_digest([out]))
        return out

    import distsplat_ns.parallel.mode as mode_module
    from distsplat_ns.distributed.gradient_sum import BucketedGradientSum
    from distsplat_ns.gaussians.strategy import DefaultDensifier, grows_at

    original_finish = BucketedGradientSum.finish

    def finish(self):
        out = original_finish(self)
        params = self._params
        current["grad"] = _digest([p.grad if p.grad is not None else torch.zeros(0) for p in params])
        if save_grads and rank == 0:
            current["grad_tensors"] = [p.grad.detach().clone() if p.grad is not None else None for p in params]
        return out

    original_batch_info = mode_module.batch_info

    def batch_info(grads2d, absgrads2d, radii, width, height):
        current["stats"] = _digest([grads2d, absgrads2d, radii])
        return original_batch_info(grads2d, absgrads2d, radii, width, height)

    original_after_optimizer = DefaultDensifier.after_optimizer

    def after_optimizer(self, rows, step, info, gather):
        thresholds = self.thresholds
        if info is not None and grows_at(self.schedule, step):
            # The decision statistics right before the densifier grows/prunes: replay the state
            # update on a copy, save, then run the real refinement.
            state = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in rows.state.items()}
            self.update_statistics(state, info, len(rows))
            if rank == 0:
                torch.save(
                    {
                        "grad2d": state["grad2d"], "count": state["count"], "radii": state.get("radii"),
                        "opacities": rows.params["opacities"].detach().clone(), "scales": rows.params["scales"].detach().clone(),
                        "grow_grad2d": thresholds.grow_grad2d, "grow_scale3d": thresholds.grow_scale3d,
                        "prune_opa": thresholds.prune_opa,
                    },
                    trace_dir / "refine" / f"step-{step:06d}.pt",
                )  # fmt: skip
        original_after_optimizer(self, rows, step, info, gather)

    original_train_step = DistSplatPipeline.train_step

    def train_step(self, step, optimizers):
        report = original_train_step(self, step, optimizers)
        params = {n: p.detach() for n, p in self.model.gauss_params.items()}
        record = {
            "step": step,
            "num_points": self.model.num_points,
            "params": _digest(list(params.values())),
            "gt": current.pop("gt", []),
            "grad": current.pop("grad", None),
            "stats": current.pop("stats", None),
            "batch": list(self.datamanager.batch_camera_ids(step)),
        }
        log.write(json.dumps(record) + "\n")
        if rank == 0:
            torch.save({n: p.clone() for n, p in params.items()}, trace_dir / "params" / f"step-{step:06d}.pt")
        grads = current.pop("grad_tensors", None)
        if grads is not None:
            names = [n for n, _ in self._named_trainable_parameters()]
            torch.save(dict(zip(names, grads, strict=False)), trace_dir / "params" / f"grad-{step:06d}.pt")
        return report

    from distsplat_ns.trainer import DistSplatTrainer

    # The end-of-run evaluation (rank 0, full resolution) costs more than the training here and
    # changes nothing the trace compares.
    DistSplatTrainer._eval_all = lambda self, step: None
    BandTerms.gt_image = gt_image
    DefaultDensifier.after_optimizer = after_optimizer
    BucketedGradientSum.finish = finish
    mode_module.batch_info = batch_info
    DistSplatPipeline.train_step = train_step


def _trace(args: argparse.Namespace) -> None:
    if args.dedup_seed_points:
        _install_dedup_seed_points()
    _install_trace(Path(args.trace_dir), save_grads=args.save_grads)
    from nerfstudio.scripts.train import entrypoint

    sys.argv = ["ns-train", *args.ns_train_args]
    entrypoint()


def _read(trace_dir: Path) -> dict[int, dict[str, Any]]:
    """Per step: rank 0's record, with the ground-truth digests of every rank merged (as a set)."""
    steps: dict[int, dict[str, Any]] = {}
    for path in sorted(trace_dir.glob("rank*.jsonl")):
        for line in path.read_text().splitlines():
            rec = json.loads(line)
            entry = steps.setdefault(rec["step"], {"gt": set()})
            entry["gt"] |= set(rec["gt"])
            if path.name == "rank0.jsonl":
                entry.update({k: v for k, v in rec.items() if k != "gt"})
    return steps


def _flipped_decisions(ref_a: Path, ref_b: Path) -> dict[str, Any]:
    """At a refinement whose outcome differs: the Gaussians whose grow decision differs, and the
    relative distance of their statistic to the threshold in each run."""
    a, b = torch.load(ref_a), torch.load(ref_b)
    if a["grad2d"].shape != b["grad2d"].shape:
        return {"same_n_before_refine": False, "n": [int(a["grad2d"].numel()), int(b["grad2d"].numel())]}
    thr = a["grow_grad2d"]
    avg_a = a["grad2d"] / a["count"].clamp_min(1)
    avg_b = b["grad2d"] / b["count"].clamp_min(1)
    grow_a, grow_b = avg_a > thr, avg_b > thr
    flips = torch.nonzero(grow_a != grow_b).squeeze(1)
    prune_a = torch.sigmoid(a["opacities"]).squeeze(-1) < a["prune_opa"]
    prune_b = torch.sigmoid(b["opacities"]).squeeze(-1) < b["prune_opa"]
    rel = (avg_a - avg_b).abs() / avg_a.abs().clamp_min(1e-300)
    return {
        "same_n_before_refine": True,
        "grow_flips": int(flips.numel()),
        "grow_a": int(grow_a.sum()),
        "grow_b": int(grow_b.sum()),
        "prune_opacity_flips": int((prune_a != prune_b).sum()),
        "count_differs": int((a["count"] != b["count"]).sum()),
        "grad2d_rel_diff_median": float(rel.median()),
        "grad2d_rel_diff_max": float(rel.max()),
        "flipped_examples": [{"gaussian": int(i), "avg_grad_a": float(avg_a[i]), "avg_grad_b": float(avg_b[i]), "threshold": thr} for i in flips[:5]],
    }


def _compare(args: argparse.Namespace) -> None:
    dir_a, dir_b = Path(args.trace_a), Path(args.trace_b)
    a, b = _read(dir_a), _read(dir_b)
    rows, first = [], {}
    for step in sorted(set(a) & set(b)):
        ra, rb = a[step], b[step]
        row: dict[str, Any] = {"step": step, "num_points": [ra["num_points"], rb["num_points"]]}
        for key in ("gt", "grad", "stats", "params", "batch"):
            same = ra.get(key) == rb.get(key)
            row[f"{key}_same"] = same
            if not same and key not in first:
                first[key] = step
        if ra["num_points"] != rb["num_points"] and "num_points" not in first:
            first["num_points"] = step
        pa, pb = dir_a / "params" / f"step-{step:06d}.pt", dir_b / "params" / f"step-{step:06d}.pt"
        if pa.exists() and pb.exists() and ra["num_points"] == rb["num_points"]:
            ta, tb = torch.load(pa), torch.load(pb)
            diffs = {n: (ta[n] - tb[n]).abs() for n in ta}
            row["max_abs_diff"] = max(float(d.max()) for d in diffs.values())
            row["max_abs_diff_by_param"] = {n: float(d.max()) for n, d in diffs.items()}
            row["entries_differing"] = sum(int((d > 0).sum()) for d in diffs.values())
            row["entries_over_1e-6"] = sum(int((d > 1e-6).sum()) for d in diffs.values())
        rows.append(row)
    commands = {}
    for name, d in (("a", dir_a), ("b", dir_b)):
        path = d / "command.json"
        commands[name] = json.loads(path.read_text()) if path.exists() else str(d)
    report: dict[str, Any] = {
        "command": " ".join(["python", *sys.argv]),
        "traces": commands,
        "first_step_differing": first,
        "steps": rows,
    }
    flip_step = first.get("num_points")
    if flip_step is not None:
        ref_a, ref_b = dir_a / "refine" / f"step-{flip_step:06d}.pt", dir_b / "refine" / f"step-{flip_step:06d}.pt"
        if ref_a.exists() and ref_b.exists():
            report["first_count_divergence"] = {"step": flip_step, **_flipped_decisions(ref_a, ref_b)}
    json.dump(report, sys.stdout, indent=1)
    sys.stdout.write("\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    trace = sub.add_parser("trace", help="run ns-train with a per-step trace")
    trace.add_argument("--trace-dir", required=True)
    trace.add_argument(
        "--dedup-seed-points",
        action="store_true",
        help="diagnostic: seed from unique COLMAP points (the float64 mode does so itself: gaussians/initial.py)",
    )
    trace.add_argument("--save-grads", action="store_true", help="rank 0 also saves the summed gradients of every step")
    trace.add_argument("ns_train_args", nargs=argparse.REMAINDER, help="-- then ns-train's arguments")
    comp = sub.add_parser("compare", help="compare two traces")
    comp.add_argument("trace_a")
    comp.add_argument("trace_b")
    args = parser.parse_args()
    if args.cmd == "trace":
        if args.ns_train_args[:1] == ["--"]:
            args.ns_train_args = args.ns_train_args[1:]
        _trace(args)
    else:
        _compare(args)


if __name__ == "__main__":
    main()
