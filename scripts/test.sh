#!/usr/bin/env bash
# Run the test suite on a fresh machine: sets up .venv (and test-only system packages) first.
# Usage: bash scripts/test.sh [pytest args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh --test
# Lint and format check first (pyproject's [tool.ruff]: ruff's defaults + pyupgrade, isort, bugbear;
# the formatter's style at line-length 120, as nerfstudio): seconds.
.venv/bin/python -m ruff check .
.venv/bin/python -m ruff format --check .
exec .venv/bin/python -m pytest "$@"
