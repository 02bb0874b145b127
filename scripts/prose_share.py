"""The share of package lines that are docstrings or comments, per package and in total.

    python scripts/prose_share.py                 # distsplat_ns/, per package and in total
    python scripts/prose_share.py PATH [PATH...]  # any other files or trees, e.g. nerfstudio's splatfacto.py
    python scripts/prose_share.py --json OUT.json # also write the figures as JSON

How a line is counted (each physical line once, in this order):
- docstring: inside the docstring of a module, class or function (the first statement, a str
  constant, as `ast.get_docstring` reads it). Blank lines inside it count as docstring lines.
- field docstring: inside any other string literal that is a statement of its own, i.e. the
  attribute docstrings under config fields that tyro reads as help.
- comment: a line whose only token is a comment (`tokenize.COMMENT`). A comment after code on the
  same line leaves the line a code line.
- blank: nothing but whitespace (outside a docstring).
- code: every other line, including the lines of a multi-line expression and strings that are not
  docstrings.
The share is (docstring + field docstring + comment) / all lines, blank lines included in all lines (as `wc -l`
counts a file); the share over non-blank lines is printed beside it.
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import sys
import tokenize
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


@dataclass
class LineCounts:
    """Lines of one file or a group of files, by kind."""

    docstring: int = 0
    field_docstring: int = 0
    comment: int = 0
    blank: int = 0
    code: int = 0

    @property
    def total(self) -> int:
        return self.docstring + self.field_docstring + self.comment + self.blank + self.code

    @property
    def prose(self) -> int:
        return self.docstring + self.field_docstring + self.comment

    def add(self, other: LineCounts) -> None:
        self.docstring += other.docstring
        self.field_docstring += other.field_docstring
        self.comment += other.comment
        self.blank += other.blank
        self.code += other.code


def _is_string_statement(node: ast.AST) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _docstring_lines(tree: ast.AST) -> tuple[set[int], set[int]]:
    """1-based line numbers of docstrings proper, and of the other string statements (field docstrings)."""
    proper: set[int] = set()
    other: set[int] = set()
    owners = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        if isinstance(node, owners) and node.body and _is_string_statement(node.body[0]):
            proper.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
        elif _is_string_statement(node):
            other.update(range(node.lineno, node.end_lineno + 1))
    return proper, other - proper


def count_lines(source: str) -> LineCounts:
    """Classify each physical line of one Python source (rules in the module docstring)."""
    docstring, field_docstring = _docstring_lines(ast.parse(source))
    comment_only: set[int] = set()
    code: set[int] = set()
    skip = {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
        tokenize.ENCODING,
    }
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comment_only.add(token.start[0])
        elif token.type not in skip:
            code.update(range(token.start[0], token.end[0] + 1))
    counts = LineCounts()
    for number, text in enumerate(source.splitlines(), start=1):
        if number in docstring:
            counts.docstring += 1
        elif number in field_docstring:
            counts.field_docstring += 1
        elif number in code:
            counts.code += 1
        elif number in comment_only:
            counts.comment += 1
        elif not text.strip():
            counts.blank += 1
        else:  # a backslash continuation line alone, for instance
            counts.code += 1
    return counts


def _python_files(path: Path) -> list[Path]:
    return [path] if path.is_file() else sorted(p for p in path.rglob("*.py") if "__pycache__" not in p.parts)


def _group(path: Path, root: Path) -> str:
    """The package a file of distsplat_ns/ belongs to: its first folder, or '(top level)'."""
    parts = path.relative_to(root).parts
    return f"{parts[0]}/" if len(parts) > 1 else "(top level)"


def _row(name: str, counts: LineCounts) -> str:
    non_blank = counts.total - counts.blank
    share = counts.prose / counts.total if counts.total else 0.0
    share_non_blank = counts.prose / non_blank if non_blank else 0.0
    return (
        f"{name:<28} {counts.total:>7} {counts.docstring:>7} {counts.field_docstring:>7} {counts.comment:>7} {counts.blank:>7} {counts.code:>7}"
        f" {100 * share:>6.1f}% {100 * share_non_blank:>6.1f}%"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "paths",
        nargs="*",
        type=Path,
        help="files or trees to count instead of distsplat_ns/ (each counted as one group)",
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    groups: dict[str, LineCounts] = {}
    if args.paths:
        for path in args.paths:
            group = groups.setdefault(str(path), LineCounts())
            for file in _python_files(path):
                group.add(count_lines(file.read_text(encoding="utf-8")))
    else:
        root = REPO / "distsplat_ns"
        for file in _python_files(root):
            groups.setdefault(_group(file, root), LineCounts()).add(count_lines(file.read_text(encoding="utf-8")))

    total = LineCounts()
    print(
        f"{'group':<28} {'lines':>7} {'docstr':>7} {'field':>7} {'comment':>7} {'blank':>7} {'code':>7} {'share':>7} {'nonblank':>7}"
    )
    for name in sorted(groups):
        total.add(groups[name])
        print(_row(name, groups[name]))
    print(_row("total", total))
    if args.json:
        figures = {
            name: {**asdict(c), "total": c.total, "share": c.prose / c.total if c.total else 0.0}
            for name, c in {**groups, "total": total}.items()
        }
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
