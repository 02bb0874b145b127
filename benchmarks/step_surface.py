"""The size of the training step's surface: CLI flags our configs add, and lines of the step path.

Usage (from the repository root):
    PYTHONPATH=$PWD python benchmarks/step_surface.py flags
    PYTHONPATH=$PWD python benchmarks/step_surface.py lines 2b9b82d   # the step path before the refactor
    PYTHONPATH=$PWD python benchmarks/step_surface.py lines WORKTREE  # the files on disk

``flags`` counts the dataclass fields of our configs beyond those of the nerfstudio classes they
extend (each is one ``ns-train distsplat`` flag). ``lines`` sums, with ``ast``, the lines of every
function and class a training step runs through (trainer -> pipeline -> model); the lists below
name them per revision. Results are in docs/architecture.md.
"""

import ast
import dataclasses
import subprocess
import sys
from pathlib import Path


def count_flags() -> None:
    from nerfstudio.data.datamanagers.base_datamanager import DataManagerConfig
    from nerfstudio.engine.trainer import TrainerConfig
    from nerfstudio.models.splatfacto import SplatfactoModelConfig
    from nerfstudio.pipelines.base_pipeline import VanillaPipelineConfig

    from distsplat_ns.data.datamanager import ParallelFullImageDatamanagerConfig
    from distsplat_ns.model.distsplat_model import DistSplatModelConfig
    from distsplat_ns.pipeline import DistSplatPipelineConfig
    from distsplat_ns.trainer import DistSplatTrainerConfig

    total = 0
    for ours, base in [
        (DistSplatTrainerConfig, TrainerConfig),
        (DistSplatPipelineConfig, VanillaPipelineConfig),
        (DistSplatModelConfig, SplatfactoModelConfig),
        (ParallelFullImageDatamanagerConfig, DataManagerConfig),
    ]:
        added = sorted({f.name for f in dataclasses.fields(ours)} - {f.name for f in dataclasses.fields(base)} - {"_target"})
        total += len(added)
        print(f"{ours.__name__}: {len(added)} {added}")
    print("total", total)


PATHS = {
    "2b9b82d": {
        "distsplat_ns/trainer.py": ["DistSplatTrainer.train_iteration", "DistSplatTrainer._record_step"],
        "distsplat_ns/pipeline.py": [
            "StepTimings",
            "StepState",
            "DistSplatPipeline.get_train_loss_dict",
            "DistSplatPipeline.plan",
            "DistSplatPipeline._empty_result",
            "DistSplatPipeline.backward",
            "DistSplatPipeline.after_backward",
            "DistSplatPipeline._observe_costs",
            "DistSplatPipeline._reduce_statistics",
            "DistSplatPipeline._rendered_size",
            "DistSplatPipeline.after_optimizer_step",
        ],
        "distsplat_ns/model/distsplat_model.py": [
            "BandRenderResult",
            "PixelLink",
            "backward_bands",
            "DistSplatModel.forward_bands",
            "DistSplatModel._band_terms",
            "_owned_tile_counts",
        ],
    },
}
PATHS["WORKTREE"] = {
    "distsplat_ns/trainer.py": ["DistSplatTrainer.train_iteration"],
    "distsplat_ns/pipeline.py": [
        "StepTimings",
        "StepReport",
        "DistSplatPipeline.train_step",
        "DistSplatPipeline.plan",
        "DistSplatPipeline._fetch_images",
        "DistSplatPipeline._backward",
        "DistSplatPipeline._statistics",
        "DistSplatPipeline._finite_verdict",
        "DistSplatPipeline._costs_to_host",
        "DistSplatPipeline._observe_costs",
        "DistSplatPipeline._check_replicas",
    ],
    "distsplat_ns/model/distsplat_model.py": ["DistSplatModel.forward_bands"],
    "distsplat_ns/model/band_terms.py": ["BandTerms.band_terms"],
    "distsplat_ns/model/band_render.py": ["BandRenderResult", "OwnProjections", "render_calls"],
    "distsplat_ns/model/band_backward.py": ["PixelLink", "link_pixels", "backward_bands"],
    "distsplat_ns/parallel/replicated.py": ["ReplicatedMode"],
}


def _code_lines(node: ast.AST, lines: list) -> int:
    """Lines of ``node`` that are neither blank, comment-only nor a docstring."""
    doc = set()
    for sub in ast.walk(node):
        body = getattr(sub, "body", None)
        if not isinstance(sub, (ast.FunctionDef, ast.ClassDef)) or not body:
            continue
        for i, stmt in enumerate(body):  # the docstring, and attribute docstrings of dataclass fields
            if (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
                and (i == 0 or isinstance(sub, ast.ClassDef))
            ):
                doc.update(range(stmt.lineno, stmt.end_lineno + 1))
    return sum(
        1 for ln in range(node.lineno, node.end_lineno + 1) if ln not in doc and lines[ln - 1].strip() and not lines[ln - 1].strip().startswith("#")
    )


def count_lines(rev: str) -> None:
    total = total_code = 0
    for path, names in PATHS.get(rev, PATHS["WORKTREE"]).items():
        src = Path(path).read_text() if rev == "WORKTREE" else subprocess.check_output(["git", "show", f"{rev}:{path}"], text=True)
        tree = ast.parse(src)
        lines = src.splitlines()
        found = {}
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                found[node.name] = node
                if isinstance(node, ast.ClassDef):
                    found.update({f"{node.name}.{s.name}": s for s in node.body if isinstance(s, ast.FunctionDef)})
        for name in names:
            node = found[name]
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n, c = node.end_lineno - start + 1, _code_lines(node, lines)
            total, total_code = total + n, total_code + c
            print(f"{path}:{name} {n} lines, {c} code")
    print("total", total, "lines,", total_code, "code (no blank, comment or docstring lines)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["flags"]:
        count_flags()
    elif sys.argv[1:2] == ["lines"] and len(sys.argv) == 3:
        count_lines(sys.argv[2])
    else:
        raise SystemExit(__doc__)
