#!/usr/bin/env bash
# The CUDA check (docs/gpu.md), in one go, on the bare CUDA machine (run from the repository root):
#   1. install the carried wheels (.whl/, made by scripts/prepare_gpu_wheels.sh) and this project
#      into .gpu_cache/site; compile gsplat 1.4.0's CUDA extension (or load a carried build);
#   2. train distsplat B=1 and B=4 to their end, through refinement, with final PSNR: the runs that
#      crashed on 2026-12-04 (docs/gpu.md), first, so that one call says whether the fixes hold;
#   3. pytest -m cuda (parity with the reference, training step, NCCL/gloo collectives);
#   4. the timing: splatfacto and distsplat on 2 processes on one GPU over gloo on the same scene
#      for the same number of images (step 2's runs kept), recording step time, images/s, peak GPU
#      memory, final PSNR;
#   4m. memory: distsplat B=1 on scenes/lund_door (17 images, one refinement) through scripts/gpu_memory.py: the
#      real allocator's whole-run peaks per rank beside the device stand-in's count of the same command
#      (benchmarks/results/standin_peak_*.json), on the reference backend and on gsplat;
#   4a. python -m benchmarks.bench_cost_unit --device cuda: gsplat's time per intersection and fixed cost per
#      band (what rendering/api.py:BAND_COST_FRACTIONS["gsplat"] should hold);
#   4b. with the time left: python -m benchmarks.bench_time_to_quality --quick (1 vs 2 ranks, PSNR vs wall time);
#   4n. last, with the time left: gsplat 1.5.3 (carried in .whl/gsplat-next/) installed beside 1.4.0, its CUDA
#      extension compiled (or a carried build loaded), and pytest -m cuda again with it first on the path;
#   5. write summary.json, env.json, tests.json (gsplat 1.5.3's tests under "gsplat_1.5.3"), bench.json (the
#      memory runs too, and "memory"), cost_unit.json, time_to_quality.json (+ gpu_check.log,
#      gsplat_cuda.so.gz, and gsplat_cuda_1.5.3.so.gz while fewer than 8 files are there) to OUTDIR.
#
# Usage: bash scripts/gpu_check.sh OUTDIR [--dry-run]
#   --dry-run (implied when torch sees no CUDA device): use the current Python environment instead of
#   installing, skip the gsplat build, run the cuda tests (they skip) and tiny CPU runs on
#   scenes/lund_door (distsplat; splatfacto through the reference rasterizer). Everything it writes
#   says "dry_run": true.
# Environment knobs (defaults in brackets):
#   GPU_CHECK_BUDGET_S [480]   wall-clock budget (8 min: issue 53); later steps are skipped (and say so) when it runs out
#   GPU_BENCH_IMAGES [1500]    images per single-process run (CUDA); GPU_BENCH_IMAGES_2PROC [400]
#   GPU_BENCH_DATA [.gpu_data/lund_door_x2]   scene for the CUDA runs (made by prepare_gpu_wheels.sh)
#   GPU_CHECK_SKIP_TESTS=1, GPU_CHECK_SKIP_BENCH=1   leave a step out (recorded as skipped)
#   GPU_CHECK_RESUME=1         a second call on the same (warm) machine, or with .gpu_prebuilt/previous/
#                              carried: reuse the previous call's tests.json and its finished runs,
#                              run only what is missing (each call saves its results in .gpu_cache/previous)
#   GPU_CHECK_SKIP_COST_UNIT=1 leave out the cost-unit step (4a); GPU_COST_UNIT_IMAGES [300] its training images
#   GPU_CHECK_SKIP_TTQ=1       leave out the time-to-quality step (4b); GPU_TTQ_DATA [.gpu_data/bird] its scene
#                              (and step 4a's)
#   GPU_CHECK_SKIP_MEMORY=1    leave out the memory runs (4m)
#   GPU_CHECK_SKIP_NEXT=1      leave out gsplat 1.5.3 (4n); a resumed call continues its interrupted build
#   GPU_BENCH_ONLY ["" = all]  space-separated run names: distsplat_b1 splatfacto distsplat_b4 distsplat_2proc_gloo
#   GPU_CHECK_INSTALL=1        with --dry-run: install as the real run does (the wheels of .whl with pip
#                              --no-index --no-deps --target, the project, PYTHONPATH, the import check)
#                              instead of using the current environment; only the gsplat build is
#                              skipped. Needs a Python 3.12 PYTHON (the wheels are cp312), e.g.
#                              PYTHON=/tmp/venv312/bin/python (docs/gpu.md). Ignored without --dry-run.
#   GPU_CHECK_CACHE [.gpu_cache]   installed site, compiled extension, work files, previous results
#   GPU_CHECK_WHEEL_DIR [.whl]     the carried wheels
#   PYTHON [python3]
# docs/gpu.md has the device call, what is measured and what is known not to work.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [[ $# -lt 1 || "$1" == -* ]]; then
  echo "usage: bash scripts/gpu_check.sh OUTDIR [--dry-run]" >&2
  exit 2
fi
OUTDIR="$1"
shift
DRY=0
for arg in "$@"; do
  case "$arg" in
    --dry-run) DRY=1 ;;
    *) echo "error: unknown option $arg (expected --dry-run)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUTDIR"
OUTDIR="$(cd "$OUTDIR" && pwd)"
T_START=$(date +%s)
BUDGET_S="${GPU_CHECK_BUDGET_S:-480}"
DEADLINE=$((T_START + BUDGET_S))
PY="${PYTHON:-python3}"
CACHE="${GPU_CHECK_CACHE:-$ROOT/.gpu_cache}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
WHEEL_DIR="${GPU_CHECK_WHEEL_DIR:-.whl}"
WORK="$CACHE/work"
SUMMARY="$OUTDIR/summary.json"
LOG="$OUTDIR/gpu_check.log"
rm -rf "$WORK"
mkdir -p "$WORK"
rm -f "$SUMMARY"
exec > >(tee -a "$LOG") 2>&1

say() { echo "[gpu_check $(date +%H:%M:%S) +$(($(date +%s) - T_START))s] $*"; }
left() { echo $((DEADLINE - $(date +%s))); }
DRYFLAG=()
step() {  # step NAME STATUS SECONDS DETAIL
  "$PY" scripts/gpu_bench.py step --summary "$SUMMARY" --name "$1" --status "$2" --seconds "$3" --detail "$4" ${DRYFLAG[@]+"${DRYFLAG[@]}"} || true
}

if ((DRY == 0)) && ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  say "torch sees no CUDA device here: running the dry run instead (nothing measured)"
  DRY=1
fi
((DRY)) && DRYFLAG=(--dry-run)
# The real run always installs; a dry run only with GPU_CHECK_INSTALL=1.
INSTALL=1
((DRY)) && [[ "${GPU_CHECK_INSTALL:-0}" != 1 ]] && INSTALL=0
say "repo $ROOT, out $OUTDIR, budget ${BUDGET_S}s, dry run: $DRY, install: $INSTALL, python: $PY"
export GPU_CHECK_COMMIT="${GPU_CHECK_COMMIT:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}"
export PYTHONUNBUFFERED=1

# ------------------------------------------------------------------ 1a. install the carried wheels
t0=$(date +%s)
if "$PY" scripts/gpu_bench.py check-wheels --dir "$WHEEL_DIR" --out "$WORK/wheels.json" >/dev/null; then WHEELS_OK=yes; else WHEELS_OK=no; fi
if ((INSTALL == 0)); then
  step install skipped 0 "dry run: the current environment ($("$PY" -c 'import sys; print(sys.executable)')) is used; the wheels are for Python 3.12 (wheel folder $WHEEL_DIR complete: $WHEELS_OK; see wheel_check in env.json); GPU_CHECK_INSTALL=1 installs them as the real run does"
else
  if [[ "$WHEELS_OK" != yes ]]; then
    say "the wheel folder $WHEEL_DIR does not match scripts/gpu_wheels.txt; run scripts/prepare_gpu_wheels.sh here and carry .whl"
    cat "$WORK/wheels.json"
    step install failed $(($(date +%s) - t0)) "wheel folder incomplete: $(tr -d '\n' < "$WORK/wheels.json" | head -c 1500)"
    "$PY" scripts/gpu_bench.py env --out "$OUTDIR/env.json" --wheels-json "$WORK/wheels.json" || true
    exit 1
  fi
  SITE="$CACHE/site"
  STAMP="$SITE/.wheels-stamp"
  # The wheels' names and the interpreter (a site installed for another Python is not reused).
  WANT_STAMP="$( (ls "$WHEEL_DIR"/*.whl | sort | xargs -n1 basename; "$PY" -c 'import sys; print(sys.executable, sys.version)') | sha256sum | cut -c1-16)"
  if [[ ! -f "$STAMP" || "$(cat "$STAMP")" != "$WANT_STAMP" ]]; then
    rm -rf "$SITE"
    say "installing $(ls "$WHEEL_DIR"/*.whl | wc -l) wheels into $SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEEL_DIR"/*.whl \
      || { step install failed $(($(date +%s) - t0)) "pip install of $WHEEL_DIR/*.whl failed (see gpu_check.log)"; exit 1; }
    mkdir -p "$SITE"
    echo "$WANT_STAMP" > "$STAMP"
  fi
  # The project itself, from this working tree, every time (others may have changed it). Needs the
  # machine's setuptools and wheel (no build isolation: nothing can be downloaded there).
  rm -rf "$SITE"/distsplat_ns "$SITE"/distsplat_ns-*.dist-info
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --no-cache-dir --target "$SITE" --upgrade . \
    || { step install failed $(($(date +%s) - t0)) "pip install of the project failed (see gpu_check.log)"; exit 1; }
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  export PATH="$SITE/bin:$PATH"
  # simplejpeg too: nothing above imports it, and without it the JPEG decoder falls back silently.
  if ! "$PY" -c "import nerfstudio.scripts.train, nerfstudio.scripts.eval, distsplat_ns.registry, gsplat, simplejpeg" 2> "$WORK/import.err"; then
    cat "$WORK/import.err"
    step install failed $(($(date +%s) - t0)) "import check failed: $(tail -c 1500 "$WORK/import.err")"
    "$PY" scripts/gpu_bench.py env --out "$OUTDIR/env.json" --wheels-json "$WORK/wheels.json" || true
    exit 1
  fi
  step install ok $(($(date +%s) - t0)) "$(ls "$WHEEL_DIR"/*.whl | wc -l) wheels ($(du -sm "$WHEEL_DIR" | cut -f1) MiB) and the project into $SITE with $("$PY" -c 'import sys; print(sys.executable, sys.version.split()[0])')$( ((DRY)) && echo " (dry run, GPU_CHECK_INSTALL=1)")"
fi

# write_csrc_shim GSPLAT_DIR LIBRARY: make gsplat load LIBRARY, a build returned (gzipped) by an earlier
# run of this script on the same machine image (same torch, same Python): gsplat imports `gsplat.csrc`
# before it tries to compile (1.4.0 and 1.5.3 alike), so a module of that name that loads the library
# skips the compile.
write_csrc_shim() {
  cat > "$1/csrc.py" <<PYSHIM
# Written by scripts/gpu_check.sh: loads the carried gsplat extension $2.
import importlib.util as _util
import torch as _torch  # noqa: F401  (the library links against libtorch)
_spec = _util.spec_from_file_location("gsplat_cuda", "$2")
_mod = _util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
globals().update({k: v for k, v in vars(_mod).items() if not k.startswith("__")})
PYSHIM
}

# ------------------------------------------------------------------ 1b. gsplat's CUDA extension
t0=$(date +%s)
GSPLAT_MISSING=0
export TORCH_EXTENSIONS_DIR="$CACHE/torch_extensions"
if ((DRY)); then
  step gsplat_build skipped 0 "dry run: no CUDA device (gsplat 1.4.0 compiles its extension with nvcc on first use)"
else
  # CUDA_HOME must be the toolkit folder that holds include/cuda_runtime.h (gsplat builds its kernels against it).
  if [[ -z "${CUDA_HOME:-}" || ! -f "${CUDA_HOME}/include/cuda_runtime.h" ]]; then
    CUDA_HOME=""
    NVCC="$(command -v nvcc || true)"
    for cand in ${NVCC:+"$(dirname "$(dirname "$(readlink -f "$NVCC")")")"} /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-13 /opt/cuda; do
      if [[ -f "$cand/include/cuda_runtime.h" ]]; then CUDA_HOME="$cand"; break; fi
    done
  fi
  export CUDA_HOME
  [[ -n "$CUDA_HOME" && -z "$(command -v nvcc)" ]] && export PATH="$CUDA_HOME/bin:$PATH"
  TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$("$PY" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability(0))')}"
  export TORCH_CUDA_ARCH_LIST
  export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
  GSPLAT_DIR="$("$PY" -c 'import gsplat, os; print(os.path.dirname(gsplat.__file__))')"
  BUILD_KIND=""
  rm -f "$GSPLAT_DIR/csrc.py"
  PREBUILT=""
  if [[ -f .gpu_prebuilt/gsplat_cuda.so.gz ]]; then
    mkdir -p "$CACHE/prebuilt"
    gunzip -c .gpu_prebuilt/gsplat_cuda.so.gz > "$CACHE/prebuilt/gsplat_cuda.so" && PREBUILT="$CACHE/prebuilt/gsplat_cuda.so"
  elif [[ -f .gpu_prebuilt/gsplat_cuda.so ]]; then
    PREBUILT="$ROOT/.gpu_prebuilt/gsplat_cuda.so"
  fi
  if [[ -n "$PREBUILT" ]]; then
    write_csrc_shim "$GSPLAT_DIR" "$PREBUILT"
    if "$PY" -c "from gsplat.cuda._backend import _C; assert _C is not None" 2> "$WORK/prebuilt.err"; then
      BUILD_KIND="carried build .gpu_prebuilt (no compile)"
    else
      say "the carried gsplat build does not load here; compiling instead: $(tail -c 400 "$WORK/prebuilt.err")"
      rm -f "$GSPLAT_DIR/csrc.py"
    fi
  fi
  if [[ -z "$BUILD_KIND" ]]; then
    say "compiling gsplat's CUDA extension: CUDA_HOME=$CUDA_HOME arch $TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
    BUILD_LIMIT=$(($(left) - 60))
    ((BUILD_LIMIT < 30)) && BUILD_LIMIT=30
    # The same torch cpp_extension `load` call as gsplat/cuda/_backend.py (same name, sources, flags
    # and build folder, so gsplat's own import afterwards finds it built), made here rather than
    # by importing gsplat: gsplat deletes a build folder without a finished library and starts
    # over, while this call lets ninja resume an interrupted build in a later call.
    if timeout -k 10 "$BUILD_LIMIT" "$PY" - <<'PYBUILD'; then
import glob, os, time
t = time.time()
import torch  # noqa: F401
from torch.utils.cpp_extension import _get_build_directory, load
import gsplat
path = os.path.join(os.path.dirname(gsplat.__file__), "cuda")
build_dir = _get_build_directory("gsplat_cuda", verbose=False)
os.makedirs(build_dir, exist_ok=True)
try:
    os.remove(os.path.join(build_dir, "lock"))
except OSError:
    pass
load(
    name="gsplat_cuda",
    sources=list(glob.glob(os.path.join(path, "csrc/*.cu"))) + list(glob.glob(os.path.join(path, "csrc/*.cpp"))),
    extra_cflags=["-O3"],
    extra_cuda_cflags=["-O3"] if os.getenv("NO_FAST_MATH", "0") == "1" else ["-O3", "--use_fast_math"],
    extra_ldflags=None,
    extra_include_paths=[os.path.join(path, "csrc/"), os.path.join(path, "csrc", "third_party", "glm")],
    build_directory=build_dir,
    verbose=True,
)
from gsplat.cuda._backend import _C
assert _C is not None, "gsplat's own import did not load the extension (no nvcc on PATH?)"
print("gsplat extension ready in %.0f s" % (time.time() - t), flush=True)
PYBUILD
      BUILD_KIND="JIT-compiled with $(nvcc --version | tail -1)"
    fi
  fi
  if [[ -n "$BUILD_KIND" ]]; then
    SO="$(find "$TORCH_EXTENSIONS_DIR" -name gsplat_cuda.so 2>/dev/null | head -1)"
    if [[ -n "$SO" && "$BUILD_KIND" != carried* ]]; then
      # Returned compressed (files of at most 16 MiB come back) so that a later run on a fresh
      # machine can carry it as .gpu_prebuilt/gsplat_cuda.so.gz and skip the compile.
      gzip -c "$SO" > "$WORK/gsplat_cuda.so.gz"
      GZ_BYTES=$(stat -c %s "$WORK/gsplat_cuda.so.gz")
      ((GZ_BYTES < 16 * 1048576)) && cp "$WORK/gsplat_cuda.so.gz" "$OUTDIR/"
      BUILD_KIND="$BUILD_KIND; library $(($(stat -c %s "$SO") / 1048576)) MiB, $((GZ_BYTES / 1048576)) MiB gzipped"
    fi
    step gsplat_build ok $(($(date +%s) - t0)) "gsplat $("$PY" -c 'import gsplat; print(gsplat.__version__)'): $BUILD_KIND; CUDA_HOME=$CUDA_HOME; TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST; MAX_JOBS=$MAX_JOBS"
  else
    GSPLAT_MISSING=1
    step gsplat_build failed $(($(date +%s) - t0)) "gsplat's extension did not build or load within the budget (see gpu_check.log; a call with GPU_CHECK_RESUME=1 on the warm machine continues the build); CUDA_HOME=$CUDA_HOME"
  fi
fi
"$PY" scripts/gpu_bench.py env --out "$OUTDIR/env.json" --wheels-json "$WORK/wheels.json" ${DRYFLAG[@]+"${DRYFLAG[@]}"} || true

# ------------------------------------------------------------------ 2. the trainings that crashed
# On 2026-12-04 distsplat B=1 and B=4 crashed at their first refinement (docs/gpu.md). They run
# first, to their end (through refinement, with final PSNR), before the tests and the timing, so
# that one call answers whether the fixes hold (issue 53).
t0=$(date +%s)
PREV=""
if [[ "${GPU_CHECK_RESUME:-0}" == 1 ]]; then
  for cand in "$CACHE/previous" "$ROOT/.gpu_prebuilt/previous"; do
    if [[ -f "$cand/bench.json" || -f "$cand/tests.json" ]]; then PREV="$cand"; break; fi
  done
  say "resuming from ${PREV:-nothing (no previous results found)}"
fi
if ((DRY)); then
  DATA="scenes/lund_door"; DEVICE=cpu; IMAGES=2; IMAGES_B4=4; IMAGES2=2
else
  DATA="${GPU_BENCH_DATA:-.gpu_data/lund_door_x2}"; DEVICE=cuda
  IMAGES="${GPU_BENCH_IMAGES:-1500}"; IMAGES_B4="$IMAGES"; IMAGES2="${GPU_BENCH_IMAGES_2PROC:-400}"
fi
CRASHED=""
for name in distsplat_b1 distsplat_b4; do
  [[ -z "${GPU_BENCH_ONLY:-}" || " $GPU_BENCH_ONLY " == *" $name "* ]] && CRASHED="$CRASHED $name"
done
if [[ -z "$CRASHED" ]]; then
  step refinement_runs skipped 0 "GPU_BENCH_ONLY leaves out distsplat_b1 and distsplat_b4"
elif [[ "${GPU_CHECK_SKIP_BENCH:-0}" == 1 ]]; then
  step refinement_runs skipped 0 "GPU_CHECK_SKIP_BENCH=1"
elif ((GSPLAT_MISSING)); then
  step refinement_runs skipped 0 "gsplat's extension is not built"
elif [[ ! -f "$DATA/sparse/0/cameras.txt" ]]; then
  step refinement_runs failed 0 "scene $DATA not found (make it with scripts/prepare_gpu_wheels.sh and carry .gpu_data)"
else
  say "the runs that crashed on 2026-12-04, to their end:$CRASHED on $DATA ($DEVICE), $IMAGES images each"
  "$PY" scripts/gpu_bench.py bench --out "$WORK/bench_first.json" --workdir "$WORK" --data "$DATA" --device "$DEVICE" \
    --images "$IMAGES" --images-b4 "$IMAGES_B4" --images-two-procs "$IMAGES2" --deadline $((DEADLINE - 20)) \
    --only $CRASHED ${PREV:+--previous "$PREV/bench.json"} ${DRYFLAG[@]+"${DRYFLAG[@]}"}
  RC=$?
  if ((RC == 0)); then STATUS=ok; else STATUS=failed; fi
  step refinement_runs "$STATUS" $(($(date +%s) - t0)) "${CRASHED# }: status, final PSNR and log tails in bench.json (kept by step 4)"
fi

# ------------------------------------------------------------------ 3. pytest -m cuda
t0=$(date +%s)
if [[ -n "$PREV" && -f "$PREV/tests.json" ]] && "$PY" -c "import json,sys; sys.exit(0 if json.load(open('$PREV/tests.json')).get('tests') else 1)"; then
  cp "$PREV/tests.json" "$OUTDIR/tests.json"
  step cuda_tests reused 0 "GPU_CHECK_RESUME=1: tests.json of the previous call ($PREV), not re-run"
elif [[ "${GPU_CHECK_SKIP_TESTS:-0}" == 1 ]]; then
  step cuda_tests skipped 0 "GPU_CHECK_SKIP_TESTS=1"
elif ((GSPLAT_MISSING)); then
  # Importing gsplat now would delete the partial build and compile from scratch inside pytest.
  step cuda_tests skipped 0 "gsplat's extension is not built"
elif (($(left) < 120)); then
  step cuda_tests skipped 0 "time budget: $(left) s left"
else
  TEST_LIMIT=$(($(left) * 2 / 5))
  ((TEST_LIMIT < 90)) && TEST_LIMIT=90
  ((TEST_LIMIT > 240)) && TEST_LIMIT=240
  say "pytest -m cuda (limit ${TEST_LIMIT}s)"
  # SIGINT on timeout: pytest stops like on Ctrl-C and still writes the JUnit file of what ran.
  timeout -s INT -k 20 "$TEST_LIMIT" "$PY" -m pytest -m cuda tests -q -p no:cacheprovider --continue-on-collection-errors \
    --junitxml "$WORK/junit.xml" -o junit_family=xunit1
  RC=$?
  "$PY" scripts/gpu_bench.py junit --xml "$WORK/junit.xml" --out "$OUTDIR/tests.json" --returncode "$RC" ${DRYFLAG[@]+"${DRYFLAG[@]}"}
  case "$RC" in
    0) STATUS=ok ;;
    5) STATUS="no tests" ;;
    124|137) STATUS=timeout ;;
    *) STATUS=failed ;;
  esac
  step cuda_tests "$STATUS" $(($(date +%s) - t0)) "pytest exit code $RC; per-test outcomes in tests.json"
fi

# ------------------------------------------------------------------ 4. training runs (the timing)
t0=$(date +%s)
# The runs of step 2 are kept (their bench.json is this one's --previous) and only the others run.
FIRST_BENCH=""
[[ -f "$WORK/bench_first.json" ]] && FIRST_BENCH="$WORK/bench_first.json"
[[ -z "$FIRST_BENCH" && -n "$PREV" ]] && FIRST_BENCH="$PREV/bench.json"
if [[ "${GPU_CHECK_SKIP_BENCH:-0}" == 1 ]]; then
  step bench skipped 0 "GPU_CHECK_SKIP_BENCH=1"
elif ((GSPLAT_MISSING)); then
  step bench skipped 0 "gsplat's extension is not built"
elif [[ ! -f "$DATA/sparse/0/cameras.txt" ]]; then
  step bench failed 0 "scene $DATA not found (make it with scripts/prepare_gpu_wheels.sh and carry .gpu_data)"
else
  say "training runs on $DATA ($DEVICE): $IMAGES images per run, $IMAGES2 for the 2-process run"
  # B=4 needs at least 4 images for one step: the dry run gives it 4.
  "$PY" scripts/gpu_bench.py bench --out "$OUTDIR/bench.json" --workdir "$WORK" --data "$DATA" --device "$DEVICE" \
    --images "$IMAGES" --images-b4 "$IMAGES_B4" --images-two-procs "$IMAGES2" --deadline $((DEADLINE - 20)) \
    ${GPU_BENCH_ONLY:+--only $GPU_BENCH_ONLY} ${FIRST_BENCH:+--previous "$FIRST_BENCH"} ${DRYFLAG[@]+"${DRYFLAG[@]}"}
  RC=$?
  if ((RC == 0)); then STATUS=ok; else STATUS=failed; fi
  step bench "$STATUS" $(($(date +%s) - t0)) "per-run status, measurements and log tails in bench.json"
fi

# ------------------------------------------------------------------ 4m. the allocator beside the stand-in
# One short densifying run (scripts/gpu_memory.py) whose device bytes the stand-in counted on the CPU
# (benchmarks/results/standin_peak_*.json): the real allocator's whole-run peaks per rank beside that
# count (issue 58), first on the stand-in's own reference backend, then on gsplat. Into bench.json.
t0=$(date +%s)
if [[ "${GPU_CHECK_SKIP_MEMORY:-0}" == 1 ]]; then
  step memory skipped 0 "GPU_CHECK_SKIP_MEMORY=1"
elif ((GSPLAT_MISSING)); then
  step memory skipped 0 "gsplat's extension is not built"
elif (($(left) < 80)); then
  step memory skipped 0 "time budget: $(left) s left (needs about 80 s)"
else
  say "memory runs: the allocator's peaks beside the stand-in's count (scripts/gpu_memory.py)"
  "$PY" scripts/gpu_memory.py run --bench "$OUTDIR/bench.json" --workdir "$WORK" --device "$DEVICE" \
    --deadline $((DEADLINE - 20)) ${PREV:+--previous "$PREV/bench.json"} ${DRYFLAG[@]+"${DRYFLAG[@]}"}
  RC=$?
  if ((RC == 0)); then STATUS=ok; else STATUS=failed; fi
  step memory "$STATUS" $(($(date +%s) - t0)) "$("$PY" -c "import json,sys; m=json.load(open(sys.argv[1])).get('memory') or {}; print(m.get('verdict'), json.dumps({n: r['per_rank'] for n, r in (m.get('runs') or {}).items()}))" "$OUTDIR/bench.json" 2>/dev/null | head -c 1500); bench.json: runs memory_* and memory"
fi

# ------------------------------------------------------------------ 4a, 4b. benchmarks on bird
TTQ_DATA="${GPU_TTQ_DATA:-.gpu_data/bird}"
# bird_step NAME SKIP_VAR NEEDS_S DRY_DETAIL OK_DETAIL CMD...: run a benchmark on gsplat with the
# scene TTQ_DATA when NEEDS_S of the budget are left; CMD writes $WORK/NAME.json, which comes back
# as $OUTDIR/NAME.json. A resumed call reuses the previous call's file; a dry run skips it.
bird_step() {
  local name="$1" skip_var="$2" needs="$3" dry_detail="$4" ok_detail="$5" t0 rc
  shift 5
  t0=$(date +%s)
  if [[ -n "$PREV" && -f "$PREV/$name.json" ]]; then
    cp "$PREV/$name.json" "$OUTDIR/$name.json"
    step "$name" reused 0 "GPU_CHECK_RESUME=1: $name.json of the previous call ($PREV)"
  elif ((DRY)); then
    step "$name" skipped 0 "dry run: $dry_detail"
  elif [[ "${!skip_var:-0}" == 1 ]]; then
    step "$name" skipped 0 "$skip_var=1"
  elif ((GSPLAT_MISSING)); then
    step "$name" skipped 0 "gsplat's extension is not built"
  elif [[ ! -d "$TTQ_DATA/sparse/0" ]]; then
    step "$name" failed 0 "scene $TTQ_DATA not found (scripts/prepare_gpu_wheels.sh copies ../shared/data/bird into .gpu_data/bird; carry .gpu_data)"
  elif (($(left) < needs)); then
    step "$name" skipped 0 "time budget: $(left) s left (needs about $needs s)"
  else
    say "$name on $TTQ_DATA, limit $(($(left) - 15)) s"
    timeout -k 10 $(($(left) - 15)) "$@"
    rc=$?
    if ((rc == 0)); then
      cp "$WORK/$name.json" "$OUTDIR/$name.json"
      step "$name" ok $(($(date +%s) - t0)) "$ok_detail"
    else
      step "$name" failed $(($(date +%s) - t0)) "exit code $rc (124: out of time); see gpu_check.log"
    fi
  fi
}

# 4a. Cost unit (issue 28): python -m benchmarks.bench_cost_unit on gsplat, each bird camera rendered whole
# and as two bands from a 1-rank run's checkpoint; summary.band_cost_fraction is the figure
# rendering/api.py:BAND_COST_FRACTIONS["gsplat"] waits for (docs/balance.md).
bird_step cost_unit GPU_CHECK_SKIP_COST_UNIT 120 \
  "its CPU path is python -m benchmarks.bench_cost_unit (the reference backend)" \
  "band_overhead_ms and band_cost_fraction in cost_unit.json's summary" \
  "$PY" -m benchmarks.bench_cost_unit --device cuda --data "$TTQ_DATA" --images "${GPU_COST_UNIT_IMAGES:-300}" \
  --out "$WORK/cost_unit.json"

# 4b. Time to quality (issue 21), last and only with the time left: python -m benchmarks.bench_time_to_quality
# --quick on the GPU, 1 rank vs 2 ranks (gloo, one GPU), replicated and sharded, B = 1 and 2, eval
# PSNR per checkpoint (`--replot` draws its plot from the JSON here).
bird_step time_to_quality GPU_CHECK_SKIP_TTQ 200 \
  "its CPU path is validated with python -m benchmarks.bench_time_to_quality --quick" \
  "ratios in time_to_quality.json (ratios_to_1_rank_final_psnr)" \
  "$PY" -m benchmarks.bench_time_to_quality --quick --device cuda --data "$TTQ_DATA" \
  --out "$WORK/time_to_quality.json" --plot "$WORK/time_to_quality.png"

# ------------------------------------------------------------------ 4n. gsplat 1.5.3, last
# The same CUDA tests on gsplat 1.5.3 (issue 57), with the time left: its wheel (pure Python; carried in
# .whl/gsplat-next/ by prepare_gpu_wheels.sh, apart from the list the install checks) goes into its own
# site ahead of 1.4.0's, its extension is compiled into its own TORCH_EXTENSIONS_DIR (both releases
# name it gsplat_cuda) or a carried .gpu_prebuilt/gsplat_cuda_1.5.3.so.gz is loaded, then pytest -m cuda.
NEXT_VERSION=1.5.3
NEXT_WHEEL="$(ls "$WHEEL_DIR"/gsplat-next/gsplat-"$NEXT_VERSION"-*.whl 2>/dev/null | head -1)"
NEXT_SITE="$CACHE/site-gsplat-$NEXT_VERSION"
NEXT_NEEDS_S=150  # the build resumes in a later call, so a start that cannot finish still counts; the tests need ~90 s
NEXT_KEY="gsplat_$NEXT_VERSION"
t0=$(date +%s)
if [[ -n "$PREV" && -f "$PREV/tests.json" ]] && "$PY" -c "import json,sys; sys.exit(0 if (json.load(open('$PREV/tests.json')).get('$NEXT_KEY') or {}).get('tests') else 1)" 2>/dev/null; then
  "$PY" scripts/gpu_bench.py junit-section --from "$PREV/tests.json" --out "$OUTDIR/tests.json" --section "$NEXT_KEY"
  step gsplat_next_build reused 0 "GPU_CHECK_RESUME=1: the previous call's build"
  step gsplat_next_tests reused 0 "GPU_CHECK_RESUME=1: tests.json's $NEXT_KEY of the previous call ($PREV), not re-run"
elif ((DRY)); then
  step gsplat_next_build skipped 0 "dry run: no CUDA device (gsplat $NEXT_VERSION compiles its extension on first CUDA use; wheel carried: ${NEXT_WHEEL:-no}); on the CPU scripts/test_gsplat_next.sh runs the gsplat tests on it"
elif [[ "${GPU_CHECK_SKIP_NEXT:-0}" == 1 ]]; then
  step gsplat_next_build skipped 0 "GPU_CHECK_SKIP_NEXT=1"
elif ((GSPLAT_MISSING)); then
  step gsplat_next_build skipped 0 "gsplat 1.4.0's extension is not built: the check did not get this far"
elif [[ -z "$NEXT_WHEEL" ]]; then
  step gsplat_next_build failed 0 "no $WHEEL_DIR/gsplat-next/gsplat-$NEXT_VERSION-*.whl (run scripts/prepare_gpu_wheels.sh here and carry .whl)"
elif (($(left) < NEXT_NEEDS_S)); then
  step gsplat_next_build skipped 0 "time budget: $(left) s left (needs about $NEXT_NEEDS_S s to start; a GPU_CHECK_RESUME=1 call with GPU_CHECK_SKIP_COST_UNIT=1 GPU_CHECK_SKIP_TTQ=1 gives it the time)"
else
  NEXT_OK=1
  if [[ ! -f "$NEXT_SITE/.installed-$NEXT_VERSION" ]]; then
    rm -rf "$NEXT_SITE"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$NEXT_SITE" "$NEXT_WHEEL" \
      && touch "$NEXT_SITE/.installed-$NEXT_VERSION" || NEXT_OK=0
  fi
  # Its requirements (ninja, numpy, jaxtyping, rich, torch, packaging) are the machine's own.
  NEXT_ENV=(env "PYTHONPATH=$NEXT_SITE${PYTHONPATH:+:$PYTHONPATH}" "TORCH_EXTENSIONS_DIR=$CACHE/torch_extensions_gsplat_$NEXT_VERSION" "DISTSPLAT_EXPECT_GSPLAT=$NEXT_VERSION")
  NEXT_DIR="$("${NEXT_ENV[@]}" "$PY" -c "import gsplat, os, sys; v = gsplat.__version__; sys.exit(f'imported gsplat {v}') if v != '$NEXT_VERSION' else print(os.path.dirname(gsplat.__file__))" 2> "$WORK/next_import.err")" || NEXT_OK=0
  if ((NEXT_OK == 0)); then
    step gsplat_next_build failed $(($(date +%s) - t0)) "install or import of $NEXT_WHEEL failed: $(tail -c 1000 "$WORK/next_import.err")"
  else
    NEXT_KIND=""
    rm -f "$NEXT_DIR/csrc.py"
    if [[ -f ".gpu_prebuilt/gsplat_cuda_$NEXT_VERSION.so.gz" ]]; then
      mkdir -p "$CACHE/prebuilt"
      gunzip -c ".gpu_prebuilt/gsplat_cuda_$NEXT_VERSION.so.gz" > "$CACHE/prebuilt/gsplat_cuda_$NEXT_VERSION.so"
      write_csrc_shim "$NEXT_DIR" "$CACHE/prebuilt/gsplat_cuda_$NEXT_VERSION.so"
      if "${NEXT_ENV[@]}" "$PY" -c "from gsplat.cuda._backend import _C; assert _C is not None" 2> "$WORK/next_prebuilt.err"; then
        NEXT_KIND="carried build .gpu_prebuilt (no compile)"
      else
        say "the carried gsplat $NEXT_VERSION build does not load here; compiling instead: $(tail -c 400 "$WORK/next_prebuilt.err")"
        rm -f "$NEXT_DIR/csrc.py"
      fi
    fi
    if [[ -z "$NEXT_KIND" ]]; then
      NEXT_LIMIT=$(($(left) - 30))
      say "compiling gsplat $NEXT_VERSION's CUDA extension (limit ${NEXT_LIMIT}s): arch $TORCH_CUDA_ARCH_LIST MAX_JOBS=$MAX_JOBS"
      # gsplat's own import compiles it, with its own sources and flags (so later imports find it
      # built); shutil.rmtree is held off meanwhile: gsplat deletes a build folder without a finished
      # library, and keeping it lets ninja resume an interrupted build in a later call.
      if "${NEXT_ENV[@]}" VERBOSE=1 timeout -k 10 "$NEXT_LIMIT" "$PY" - <<'PYBUILD'; then
import shutil
import time

t = time.time()
_rmtree, shutil.rmtree = shutil.rmtree, lambda *args, **kwargs: None
try:
    from gsplat.cuda._backend import _C
finally:
    shutil.rmtree = _rmtree
assert _C is not None, "gsplat did not load its extension (no nvcc found?)"
print("gsplat extension ready in %.0f s" % (time.time() - t), flush=True)
PYBUILD
        NEXT_KIND="JIT-compiled by gsplat's own import with $(nvcc --version | tail -1)"
      fi
    fi
    if [[ -z "$NEXT_KIND" ]]; then
      step gsplat_next_build failed $(($(date +%s) - t0)) "gsplat $NEXT_VERSION's extension did not build within ${NEXT_LIMIT:-0} s (see gpu_check.log; a GPU_CHECK_RESUME=1 call on the warm machine continues it)"
    else
      NEXT_SO="$(find "$CACHE/torch_extensions_gsplat_$NEXT_VERSION" -name 'gsplat_cuda*.so' 2>/dev/null | head -1)"
      if [[ -n "$NEXT_SO" && "$NEXT_KIND" != carried* ]]; then
        gzip -c "$NEXT_SO" > "$WORK/gsplat_cuda_$NEXT_VERSION.so.gz"
        GZ_BYTES=$(stat -c %s "$WORK/gsplat_cuda_$NEXT_VERSION.so.gz")
        # At most 8 files come back from a device call (docs/gpu.md, "What it writes"): this one only into a free place.
        if ((GZ_BYTES < 16 * 1048576 && $(ls "$OUTDIR" | wc -l) < 8)); then
          cp "$WORK/gsplat_cuda_$NEXT_VERSION.so.gz" "$OUTDIR/"
          NEXT_KIND="$NEXT_KIND; returned as gsplat_cuda_$NEXT_VERSION.so.gz"
        fi
        NEXT_KIND="$NEXT_KIND; library $(($(stat -c %s "$NEXT_SO") / 1048576)) MiB, $((GZ_BYTES / 1048576)) MiB gzipped"
      fi
      step gsplat_next_build ok $(($(date +%s) - t0)) "gsplat $NEXT_VERSION ($NEXT_DIR): $NEXT_KIND; TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST; MAX_JOBS=$MAX_JOBS"
      t0=$(date +%s)
      if (($(left) < 60)); then
        step gsplat_next_tests skipped 0 "time budget: $(left) s left after the build (a GPU_CHECK_RESUME=1 call runs them on the built extension)"
      else
        TEST_LIMIT=$(($(left) - 20))
        ((TEST_LIMIT > 240)) && TEST_LIMIT=240
        say "pytest -m cuda on gsplat $NEXT_VERSION (limit ${TEST_LIMIT}s)"
        "${NEXT_ENV[@]}" timeout -s INT -k 20 "$TEST_LIMIT" "$PY" -m pytest -m cuda tests -q -p no:cacheprovider \
          --continue-on-collection-errors --junitxml "$WORK/junit_next.xml" -o junit_family=xunit1
        RC=$?
        "$PY" scripts/gpu_bench.py junit --xml "$WORK/junit_next.xml" --out "$OUTDIR/tests.json" --section "$NEXT_KEY" \
          --returncode "$RC" ${DRYFLAG[@]+"${DRYFLAG[@]}"}
        case "$RC" in
          0) STATUS=ok ;;
          5) STATUS="no tests" ;;
          124|137) STATUS=timeout ;;
          *) STATUS=failed ;;
        esac
        step gsplat_next_tests "$STATUS" $(($(date +%s) - t0)) "pytest exit code $RC on gsplat $NEXT_VERSION; $("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['$NEXT_KEY']['counts'])" "$OUTDIR/tests.json" 2>/dev/null); per-test outcomes in tests.json's $NEXT_KEY"
      fi
    fi
  fi
fi

# ------------------------------------------------------------------ 5. summary
"$PY" scripts/gpu_bench.py summary --summary "$SUMMARY" --tests "$OUTDIR/tests.json" --bench "$OUTDIR/bench.json" ${DRYFLAG[@]+"${DRYFLAG[@]}"}
mkdir -p "$CACHE/previous"
for f in tests.json bench.json cost_unit.json time_to_quality.json; do [[ -f "$OUTDIR/$f" ]] && cp "$OUTDIR/$f" "$CACHE/previous/$f"; done
say "done in $(($(date +%s) - T_START)) s; results in $OUTDIR: $(ls "$OUTDIR" | tr '\n' ' ')"
sleep 1  # let tee finish writing gpu_check.log
