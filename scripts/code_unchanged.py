"""Check that only docstrings and comments changed in Python files between a revision and the work tree.

    python scripts/code_unchanged.py REV [FILE...]   # default: the .py files changed since REV
    python scripts/code_unchanged.py $(git merge-base main HEAD)   # a branch's own changes

Each file is parsed with `ast`; docstrings (first-statement string constants of modules, classes and
functions) and other bare string statements (attribute docstrings) are removed; the dumps of both
sides must be equal. Comments never reach the AST. Exit status 1 on any difference.
"""

from __future__ import annotations

import ast
import subprocess
import sys


def _strip(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list):
            kept = [
                s
                for s in body
                if not (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                )
            ]
            node.body = kept or [ast.Pass()]
    return ast.dump(tree, include_attributes=False)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    rev, files = argv[0], argv[1:]
    if not files:
        out = subprocess.run(
            ["git", "diff", "--name-only", "--diff-filter=M", rev, "--", "*.py"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        files = [f for f in out.split() if f]
    bad = 0
    for path in files:
        old = subprocess.run(["git", "show", f"{rev}:{path}"], check=False, capture_output=True, text=True)
        if old.returncode != 0:
            print(f"NEW  {path} (not in {rev})")
            bad += 1
            continue
        with open(path, encoding="utf-8") as f:
            new = f.read()
        same = _strip(old.stdout) == _strip(new)
        print(f"{'same' if same else 'DIFF'} {path}")
        bad += not same
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
