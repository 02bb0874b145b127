#!/usr/bin/env bash
# Idempotent environment set-up for a fresh Linux x86_64 machine with Python 3.11:
#   * a local virtual environment in .venv with torch, nerfstudio 1.1.5, gsplat 1.4.0 and this package;
#   * system libraries: libusb-1.0-0 (open3d, imported by ns-export);
#   * with --test: pytest and Debian's chromium (headless viewer screenshot test).
# Re-running it installs only what is missing.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
WANT_TEST=0
[[ "${1:-}" == "--test" ]] && WANT_TEST=1
SYSTEM_ONLY=0
[[ "${1:-}" == "--system-only" ]] && SYSTEM_ONLY=1  # the system libraries alone (scripts/test_compat.sh)

PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
"$PY" - <<'PYCHECK' || { echo "error: Python >= 3.10 is required (found $($PY --version 2>&1))" >&2; exit 2; }
import sys
sys.exit(0 if sys.version_info >= (3, 10) else 1)
PYCHECK

apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  if ((${#missing[@]})); then
    local sudo=""
    [[ "$(id -u)" != 0 ]] && sudo="sudo"
    echo "[setup] installing system packages: ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

apt_install libusb-1.0-0
((SYSTEM_ONLY)) && exit 0
if ((WANT_TEST)); then
  apt_install chromium
fi

if [[ ! -x .venv/bin/python ]]; then
  echo "[setup] creating .venv"
  "$PY" -m venv .venv
fi
VPY=.venv/bin/python
STAMP=.venv/.distsplat-installed
SRC_HASH="$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)"
HASH="$SRC_HASH-$WANT_TEST"
HAVE="$(cat "$STAMP" 2>/dev/null || true)"
# An install with the test extras (-1) also serves a plain one: run_demo.sh after test.sh reinstalls nothing.
if [[ "$HAVE" != "$HASH" && "$HAVE" != "$SRC_HASH-1" ]]; then
  echo "[setup] installing Python packages into .venv (first run: a few minutes)"
  "$VPY" -m pip install -q --upgrade pip
  # torch 2.14.1 / torchvision 0.29.1: the builds nerfstudio 1.1.5 and gsplat 1.4.0 run on here.
  "$VPY" -m pip install -q "torch==2.14.1" "torchvision==0.29.1"
  if ((WANT_TEST)); then
    "$VPY" -m pip install -q -e ".[test]"
  else
    "$VPY" -m pip install -q -e .
  fi
  echo "$HASH" > "$STAMP"
fi
echo "[setup] environment ready: $ROOT/.venv"
