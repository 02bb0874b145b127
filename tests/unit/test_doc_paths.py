"""Every repository path and code name that README.md and docs/*.md cite exists, and docs/README.md lists every page.

What counts as a reference (so that prose never trips the test):
- a backticked code span that is, as a whole, a path (`balance/cost.py`, `tests/unit/`), a path
  with a name (`balance/cost.py:footprint_row_costs`, `pipeline.py:DistSplatPipeline.train_step`,
  `collectives.py all_gather_counts`), a dotted name whose head is one of our modules or classes
  (`collectives.all_gather_object`, `DistSplatModel.get_outputs`, `distsplat_ns.data.stream`), a
  `python -m benchmarks.NAME ...` command, or a pytest node id (`tests/...py::test_x`);
- inside any code span or fenced block, a token that starts at a repository root
  (`distsplat_ns/`, `tests/`, `scripts/`, `benchmarks/`, `docs/`, `scenes/`);
- in the prose, such a root-prefixed path and the target of a markdown link to a local file.
Paths relative to distsplat_ns/ (`model/losses.py`) and bare file names (`band_terms.py`) resolve
the way the docs write them: under distsplat_ns/ first, then at the root, a bare name anywhere in
the package, tests/, benchmarks/ or scripts/. Names resolve by parsing the files with `ast`
(nothing is imported): a module's top-level names (imports included), a class's methods, class
attributes and `self.` attributes (through its bases in the package). An object is often named
after its module (`densifier.set_cap`, `rows.bound`), so `module.name` also resolves to a member
of a class of that module. A dotted name with an uppercase head must name a class of the
package or one of EXTERNAL_CLASSES, so a removed class cannot pass for a library's.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "distsplat_ns"
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ROOTS = ("distsplat_ns", "tests", "scripts", "benchmarks", "docs", "scenes")
SEARCHED = ("distsplat_ns", "tests", "benchmarks", "scripts")

#: Classes of other libraries the docs name with a member; any other uppercase head must be ours.
EXTERNAL_CLASSES = {
    "Cameras",  # nerfstudio.cameras.cameras
    "Optimizers",  # nerfstudio.engine.optimizers
    "Trainer",  # nerfstudio.engine.trainer
    "VanillaPipeline",  # nerfstudio.pipelines.base_pipeline
    "Image",  # PIL
    "Store",  # torch.distributed
    "TCPStore",  # torch.distributed
    "Tensor",  # torch
}

#: (doc, reference) pairs that name something that is not there today, on purpose.
EXCEPTIONS: dict[tuple[str, str], str] = {
    # Dated history: the device stand-in's fault counts per commit name the lines as they were then.
    ("docs/device_standin.md", "cameras.to"): "nerfstudio's Cameras.to, named by its object",
    ("README.md", "benchmarks.NAME"): "a placeholder for any benchmark's name",
    ("docs/sharded.md", "benchmarks/ns_train_timed_save.py"): "history: the script until commit 26c8da5, named as such",
    (
        "docs/host_cost.md",
        "routing.py:footprint_touches_rows",
    ): "history: a dated result section (2026-12-05) names the function as it was",
    ("docs/host_cost.md", "StepPlan.cuts_an_image"): "history: how W = 4 exchanged halos before commit 1721777",
    (
        "docs/sharded.md",
        "benchmarks.bench_initial_draw",
    ): "history: the script is named with its `git show` commit on the same line",
    # nerfstudio's files, which docs/data.md compares against (its utils/ and datasets/, not ours).
    ("docs/data.md", "utils/dataloaders.py"): "nerfstudio's nerfstudio/data/utils/dataloaders.py",
    ("docs/data.md", "utils/data_utils.py"): "nerfstudio's nerfstudio/data/utils/data_utils.py",
    ("docs/data.md", "full_images_datamanager.py"): "nerfstudio's datamanager",
    ("docs/data.md", "base_dataset.py"): "nerfstudio's dataset",
    ("docs/data.md", "data_utils.py"): "nerfstudio's",
}

#: Documents and reference forms that are never checked, with the reason.
#: benchmarks/results/ names: the results of dated runs, some kept elsewhere (`/tmp/...` in the commands).
SKIPPED_PREFIXES = ("benchmarks/results/",)

_NAME = r"[A-Za-z_]\w*"
_FILE_SUFFIXES = {"py", "md", "sh", "txt", "json", "png", "yml", "toml", "ckpt", "ply", "jpg"}
_PATH_SPAN = re.compile(
    rf"(?P<path>(?:[\w.-]+/)+(?:[\w.-]+)?|[\w-]+\.(?:py|md|sh|txt|json|png|yml|toml))(?:(?::|:\d+ | )(?P<name>{_NAME}(?:\.{_NAME})*))?"
)
_DOTTED_SPAN = re.compile(rf"(?P<dotted>{_NAME}(?:\.{_NAME})+)(?:\(.*\))?(?:\[.*\])?")
_ROOT_TOKEN = re.compile(rf"(?<![\w/.~-])(?P<path>(?:{'|'.join(ROOTS)})/(?:[\w.-]+/)*[\w.-]*)")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
_PYTEST_NODE = re.compile(r"(?P<path>tests/[\w/]+\.py)::(?P<test>\w+)")
_BENCH_MODULE = re.compile(r"python -m (?P<module>benchmarks\.\w+)")
_GIT_SHOW = re.compile(r"git show \w+:\S+")


@functools.cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


@functools.cache
def _classes() -> dict[str, list[tuple[Path, ast.ClassDef]]]:
    """Every class of the package, tests and benchmarks by name."""
    found: dict[str, list[tuple[Path, ast.ClassDef]]] = {}
    for root in SEARCHED:
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(_tree(path)):
                if isinstance(node, ast.ClassDef):
                    found.setdefault(node.name, []).append((path, node))
    return found


@functools.cache
def _files_named(name: str) -> tuple[Path, ...]:
    return tuple(p for root in SEARCHED for p in (REPO / root).rglob(name) if "__pycache__" not in p.parts)


def _top_names(tree: ast.Module) -> dict[str, ast.AST]:
    names: dict[str, ast.AST] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = node
        elif isinstance(node, ast.Assign):
            names.update((t.id, node) for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names[node.target.id] = node
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update(((a.asname or a.name).split(".")[0], node) for a in node.names)
    return names


def _members(cls: ast.ClassDef, seen: frozenset[str] = frozenset()) -> set[str]:
    """Methods, class attributes and `self.` attributes of a class and of its bases in the repository."""
    names = set(_top_names(ast.Module(body=cls.body, type_ignores=[])))
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "self"
            and isinstance(node.ctx, ast.Store)
        ):
            names.add(node.attr)
    for base in cls.bases:
        base_name = base.id if isinstance(base, ast.Name) else getattr(base, "attr", None)
        for _, base_cls in _classes().get(base_name, []) if base_name not in seen else []:
            names |= _members(base_cls, seen | {cls.name})
    return names


def _resolve_in(node: ast.AST, rest: list[str]) -> bool:
    """Whether the chain `rest` of attribute names exists below a module or class node."""
    for i, name in enumerate(rest):
        if isinstance(node, ast.Module):
            found = _top_names(node).get(name)
            if found is None:
                return False
            node = found
        elif isinstance(node, ast.ClassDef):
            members = _members(node)
            if name not in members:
                return False
            # Descend into a nested class if there is one; a method or attribute ends the chain.
            nested = [n for n in node.body if isinstance(n, ast.ClassDef) and n.name == name]
            if not nested:
                return i == len(rest) - 1
            node = nested[0]
        else:  # a function or an assignment has no members to look into
            return False
    return True


def _resolve_path(path: str) -> list[Path]:
    """The files a path as the docs write it may mean (distsplat_ns/-relative, root-relative, or a bare name)."""
    path = path.rstrip("/")
    if "/" not in path:
        return list(_files_named(path)) or ([REPO / path] if (REPO / path).exists() else [])
    return [p for p in (PKG / path, REPO / path) if p.exists()]


def _module_files(dotted_head: list[str]) -> list[Path]:
    """The files a dotted module path may mean: `distsplat_ns.data.stream`, `utils.cameras`, `collectives`."""
    parts = dotted_head[1:] if dotted_head[0] == "distsplat_ns" else dotted_head
    if not parts:
        return [PKG / "__init__.py"]
    if dotted_head[0] == "benchmarks":
        candidates = [REPO.joinpath(*parts)]
    else:
        candidates = (
            [PKG.joinpath(*parts)] if len(parts) > 1 else [p.with_suffix("") for p in _files_named(f"{parts[0]}.py")]
        )
        candidates += [PKG.joinpath(*parts)]
    files = []
    for c in candidates:
        if c.with_suffix(".py").is_file():
            files.append(c.with_suffix(".py"))
        elif (c / "__init__.py").is_file() and dotted_head[0] in ("distsplat_ns", "benchmarks"):
            # A bare package name (`model.x`) is more often an object (the model) than the package.
            files.append(c / "__init__.py")
    return files


def _check_dotted(dotted: str) -> str | None:
    """None when a dotted name resolves or is not ours to check; otherwise what is missing."""
    parts = dotted.split(".")
    if parts[-1] in _FILE_SUFFIXES:
        return None  # a file name such as `PROVENANCE.txt`, not a dotted name
    if parts[0][0].isupper():
        if parts[0] in EXTERNAL_CLASSES:
            return None
        classes = _classes().get(parts[0])
        if not classes:
            return f"no class {parts[0]} in the repository"
        if any(_resolve_in(cls, parts[1:]) for _, cls in classes):
            return None
        return f"class {parts[0]} has no {'.'.join(parts[1:])}"
    # The longest head that is one of our modules, then the names inside it.
    if parts[-1] in _FILE_SUFFIXES:
        return None  # a file name such as `PROVENANCE.txt`, not a dotted name
    for cut in range(len(parts), 0, -1):
        files = _module_files(parts[:cut])
        if not files:
            continue
        rest = parts[cut:]
        if not rest:
            return None
        for file in files:
            tree = _tree(file)
            if _resolve_in(tree, rest):
                return None
            # An object named after its module: a member of one of the module's classes.
            if len(rest) == 1 and any(rest[0] in _members(n) for n in tree.body if isinstance(n, ast.ClassDef)):
                return None
        return f"{'.'.join(rest)} is not in {', '.join(str(f.relative_to(REPO)) for f in files)}"
    return None


def _check_path_span(path: str, name: str | None) -> str | None:
    """A path, and a name in it: top-level, or (as `trainer.py:setup_optimizers` is written) a member of one of its classes."""
    files = _resolve_path(path)
    if not files:
        return f"no file or folder {path}"
    if name is None:
        return None
    py_files = [f for f in files if f.suffix == ".py"]
    chain = name.split(".")
    for f in py_files:
        tree = _tree(f)
        if _resolve_in(tree, chain) or any(_resolve_in(n, chain) for n in tree.body if isinstance(n, ast.ClassDef)):
            return None
    return f"{name} is not in {', '.join(str(f.relative_to(REPO)) for f in files)}"


def _is_checked_path(path: str) -> bool:
    """A path the docs mean in this repository: at a root, under a package of distsplat_ns/, or a bare file name."""
    head = path.split("/")[0]
    if path.startswith(SKIPPED_PREFIXES):
        return False
    if "/" not in path.rstrip("/"):
        return path.endswith((".py", ".sh"))
    return head in ROOTS or (PKG / head).is_dir()


def references(text: str) -> list[tuple[int, str, str | None]]:
    """(line, reference, problem) for every reference found in one markdown text; problem None when it resolves."""
    found: list[tuple[int, str, str | None]] = []

    def line_of(offset: int) -> int:
        return text.count("\n", 0, offset) + 1

    history = {m.group(0) for m in _GIT_SHOW.finditer(text)}
    fences = [(m.start(), m.group(0)) for m in _FENCE.finditer(text)]
    prose = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    spans = [(m.start(1), m.group(1)) for m in _CODE_SPAN.finditer(prose)]

    for offset, span in spans:
        span = span.strip()
        if any(span in h or h in span for h in history) or any(c in span for c in "*{}<>…") or span.startswith("."):
            continue
        if node := _PYTEST_NODE.fullmatch(span.split("[")[0]):
            problem = _check_path_span(node["path"], node["test"])
            found.append((line_of(offset), span, problem))
            continue
        if m := _BENCH_MODULE.match(span):
            found.append((line_of(offset), m["module"], _missing_module(m["module"])))
        if (m := _PATH_SPAN.fullmatch(span)) and _is_checked_path(m["path"]):
            found.append((line_of(offset), span, _check_path_span(m["path"], m["name"])))
            continue
        if m := _DOTTED_SPAN.fullmatch(span):
            found.append((line_of(offset), span, _check_dotted(m["dotted"])))
    # Root-prefixed paths anywhere: in code spans and fences (commands), and in the prose.
    blocks = [(o, s) for o, s in spans] + fences + [(0, _CODE_SPAN.sub(lambda m: " " * len(m.group(0)), prose))]
    for offset, block in blocks:
        for m in _ROOT_TOKEN.finditer(block):
            path = m["path"].rstrip(".,;:")
            if not _is_checked_path(path) or any(path in h for h in history):
                continue
            found.append(
                (line_of(offset + m.start()), path, None if _resolve_path(path) else f"no file or folder {path}")
            )
    for m in _LINK.finditer(prose):
        target = m.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue
        found.append((line_of(m.start()), target, None))
    return found


def _missing_module(module: str) -> str | None:
    return None if (REPO / (module.replace(".", "/") + ".py")).is_file() else f"no module {module}"


def _link_problems(doc: Path) -> list[str]:
    problems = []
    prose = _FENCE.sub("", doc.read_text(encoding="utf-8"))
    for m in _LINK.finditer(prose):
        target = m.group(1)
        if "://" in target or target.startswith("mailto:"):
            continue
        if not (doc.parent / target).exists():
            problems.append(f"link to {target}: no such file")
    return problems


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_path_and_name_exists(doc: Path) -> None:
    rel = str(doc.relative_to(REPO))
    problems = [
        f"{rel}:{line}: `{ref}`: {problem}"
        for line, ref, problem in references(doc.read_text(encoding="utf-8"))
        if problem and (rel, ref) not in EXCEPTIONS
    ]
    problems += [f"{rel}: {p}" for p in _link_problems(doc)]
    assert not problems, "stale references:\n" + "\n".join(problems)


def test_docs_index_lists_every_page() -> None:
    index = (REPO / "docs" / "README.md").read_text(encoding="utf-8")
    listed = set(_LINK.findall(index))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"README.md"}
    assert not pages - listed, f"docs/README.md does not list {sorted(pages - listed)}"


def test_exceptions_are_still_needed() -> None:
    """An exception whose reference is gone from its doc (or now resolves) must be removed."""
    stale = []
    for rel, ref in EXCEPTIONS:
        hits = [p for line, r, p in references((REPO / rel).read_text(encoding="utf-8")) if r == ref]
        if not hits or not any(hits):
            stale.append(f"{rel}: `{ref}`")
    assert not stale, "exceptions no longer needed:\n" + "\n".join(stale)


def test_a_stale_path_is_found() -> None:
    """The checks themselves: stale paths, names and links are reported, live ones are not."""
    text = """See `model/shard_state.py`, `balance/cost.py:no_such_function`, `DistSplatPipeline.no_such_method`,
`collectives.no_such_name`, `NoSuchClass.method`, and docs/no_such_page.md in the prose.
Live: `balance/cost.py:footprint_row_costs`, `DistSplatPipeline.train_step`, `collectives.all_gather_object`,
`torch.cat`, `proj.means2d`, `Tensor.to`, docs/mcmc.md.
```bash
python scripts/no_such_script.py
```
"""
    problems = {ref for _, ref, problem in references(text) if problem}
    assert problems == {
        "model/shard_state.py",
        "balance/cost.py:no_such_function",
        "DistSplatPipeline.no_such_method",
        "collectives.no_such_name",
        "NoSuchClass.method",
        "docs/no_such_page.md",
        "scripts/no_such_script.py",
    }
