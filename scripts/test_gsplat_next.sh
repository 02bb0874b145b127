#!/usr/bin/env bash
# CI job: the gsplat tests on gsplat 1.5.3, installed over the development environment as a user of
# nerfstudio main or of a Blackwell GPU has it (nerfstudio 1.1.5 itself pins 1.4.0; README,
# "gsplat versions"). gsplat 1.5.3's wheel is pure Python, so it goes into .gsplat-1.5.3 (ignored by
# git) and is put first on PYTHONPATH; .venv keeps 1.4.0 for scripts/test.sh.
# Usage: bash scripts/test_gsplat_next.sh [extra pytest args]   (after scripts/test.sh built .venv)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VERSION=1.5.3
DIR="$ROOT/.gsplat-$VERSION"
PY="${DISTSPLAT_VENV:-$ROOT/.venv}/bin/python"
[[ -x "$PY" ]] || { echo "[gsplat-next] no $PY: run scripts/test.sh (or scripts/setup_env.sh --test) first" >&2; exit 2; }

if [[ ! -f "$DIR/.ready" ]]; then
  echo "[gsplat-next] installing gsplat==$VERSION into $DIR"
  rm -rf "$DIR"
  "$PY" -m pip install -q --no-deps --target "$DIR" "gsplat==$VERSION"
  # gsplat 1.5.3's requirements (its METADATA): ninja, numpy, jaxtyping, rich>=12, torch. .venv has
  # them today (nerfstudio 1.1.5 and gsplat 1.4.0 bring them); one it lacks goes beside gsplat.
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
# tests/gpu's parity tests run on gsplat's PyTorch references without a GPU (tests/gpu/conftest.py), and
# one ns-train case end to end on the gsplat backend: the sharded MCMC one (docs/gsplat_on_cpu.md, "End to end").
exec "$PY" -m pytest tests/unit/test_gsplat_versions.py tests/reference/test_gsplat_glue.py tests/reference/test_gsplat_packed_glue.py \
  tests/reference/test_projection.py tests/unit/test_strategy.py tests/unit/test_gsplat_cpu.py \
  tests/unit/test_gsplat_backend_on_shim.py \
  tests/gpu/test_gsplat_parity.py tests/gpu/test_gsplat_packed.py tests/gpu/test_mcmc_cuda.py tests/gpu/test_cuda_training.py \
  "tests/multiproc/test_standin_training.py::test_training_on_gsplat_on_the_device_standin_refines_evaluates_saves_resumes_and_exports[2-sharded-mcmc]" \
  "$@"
