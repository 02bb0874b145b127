#!/usr/bin/env bash
# CI job: the gsplat tests on a gsplat 1.5 release (default 1.5.3), installed over the development
# environment as a user of nerfstudio main or of a Blackwell GPU has it (nerfstudio 1.1.5 itself pins
# 1.4.0; README, "gsplat versions"). gsplat 1.5's wheels are pure Python, so the release goes into
# .gsplat-$VERSION (ignored by git) and is put first on PYTHONPATH; .venv keeps 1.4.0 for scripts/test.sh.
# Usage: [GSPLAT_VERSION=1.5.x] [GSPLAT_NEXT_E2E=0] bash scripts/test_gsplat_next.sh [extra pytest args]
#   (after scripts/test.sh built .venv)
#   GSPLAT_VERSION   the gsplat release: 1.5.0, 1.5.1, 1.5.2 or 1.5.3 (the CPU shim's tables,
#                    tests/helpers/gsplat_cpu.py); default 1.5.3.
#   GSPLAT_NEXT_E2E  1 (default): also the ns-train case end to end; 0: leave it out.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
DEFAULT_VERSION=1.5.3
VERSION="${GSPLAT_VERSION:-$DEFAULT_VERSION}"
E2E="${GSPLAT_NEXT_E2E:-1}"
case "$VERSION" in
  1.5.0 | 1.5.1 | 1.5.2 | 1.5.3) ;;
  *) echo "[gsplat-next] GSPLAT_VERSION: expected 1.5.0, 1.5.1, 1.5.2 or 1.5.3, got '$VERSION'" >&2; exit 2 ;;
esac
case "$E2E" in
  0 | 1) ;;
  *) echo "[gsplat-next] GSPLAT_NEXT_E2E: expected 0 or 1, got '$E2E'" >&2; exit 2 ;;
esac
DIR="$ROOT/.gsplat-$VERSION"
PY="${DISTSPLAT_VENV:-$ROOT/.venv}/bin/python"
[[ -x "$PY" ]] || { echo "[gsplat-next] no $PY: run scripts/test.sh (or scripts/setup_env.sh --test) first" >&2; exit 2; }

if [[ ! -f "$DIR/.ready" ]]; then
  echo "[gsplat-next] installing gsplat==$VERSION into $DIR"
  rm -rf "$DIR"
  "$PY" -m pip install -q --no-deps --target "$DIR" "gsplat==$VERSION"
  # gsplat 1.5.0 to 1.5.3's requirements (their METADATA): ninja, numpy, jaxtyping, rich>=12, torch. .venv
  # has them today (nerfstudio 1.1.5 and gsplat 1.4.0 bring them); one it lacks goes beside gsplat.
  # torch is never installed here: gsplat runs on the environment's own torch.
  for req in ninja numpy jaxtyping "rich>=12"; do
    module="${req%%[<>=]*}"
    "$PY" -c "import $module" 2>/dev/null || "$PY" -m pip install -q --no-deps --target "$DIR" "$req"
  done
  touch "$DIR/.ready"
fi

export PYTHONPATH="$DIR:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Checked twice: here, and inside the pytest run by tests/unit/test_gsplat_versions.py.
export DISTSPLAT_EXPECT_GSPLAT="$VERSION"
"$PY" -c "import gsplat, sys; v = gsplat.__version__; sys.exit(0 if v == '$VERSION' else f'[gsplat-next] imported gsplat {v} from {gsplat.__file__}, expected $VERSION')"
# tests/gpu's parity tests run on gsplat's own Python with its CUDA entry points on the CPU shim
# (tests/gpu/conftest.py), and one ns-train case end to end on the gsplat backend: the sharded MCMC one
# (docs/gsplat_on_cpu.md, "End to end"), left out with GSPLAT_NEXT_E2E=0.
TESTS=(
  tests/unit/test_gsplat_versions.py tests/reference/test_gsplat_glue.py tests/reference/test_gsplat_packed_glue.py
  tests/reference/test_projection.py tests/unit/test_strategy.py tests/unit/test_gsplat_cpu.py
  tests/unit/test_gsplat_backend_on_shim.py
  tests/gpu/test_gsplat_parity.py tests/gpu/test_gsplat_packed.py tests/gpu/test_mcmc_cuda.py tests/gpu/test_cuda_training.py
)
if [[ "$E2E" == 1 ]]; then
  TESTS+=("tests/multiproc/test_standin_training.py::test_training_on_gsplat_on_the_device_standin_refines_evaluates_saves_resumes_and_exports[2-sharded-mcmc]")
fi
exec "$PY" -m pytest "${TESTS[@]}" "$@"
