#!/usr/bin/env bash
# Prepare, on this (networked, CPU) machine, what scripts/gpu_check.sh needs on the bare CUDA machine:
#   .whl/                      the wheels of scripts/gpu_wheels.txt for CPython 3.12 manylinux x86_64
#                              (git-ignored; pip download --no-deps: the list is the whole closure)
#   .whl/gsplat-next/          gsplat 1.5.3's pure-Python wheel, for gpu_check.sh's last step (its own site
#                              beside 1.4.0's; apart from .whl/*.whl, which must hold one version a project)
#   .gpu_data/lund_door_x2/    the benchmark scene: ../shared/data/lund_door downscaled 2x (648x968),
#                              made with scripts/make_shipped_scene.py (../shared does not travel)
#   .gpu_data/bird/            ../shared/data/bird as it is (5 MB): bench_time_to_quality.py's scene
# and check that the working tree plus these stays under the device call's 64 MiB.
#
# Usage: bash scripts/prepare_gpu_wheels.sh [--factor N] [--source DIR] [--no-data] [--verify]
#   --factor N    downscale factor of the benchmark scene [2]
#   --verify      then run scripts/gpu_simulate.py: the machine's packages + the carried releases,
#                 rebuilt here on CPU, must import, collect the cuda tests and train (minutes)
#   --source DIR  the full-resolution lund_door COLMAP scene [../shared/data/lund_door]
#   --no-data     wheels only
# Re-running it downloads only what is missing and removes wheels that are no longer listed
# (two versions of one project in .whl stop the whole install there).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
FACTOR=2
SOURCE="$ROOT/../shared/data/lund_door"
WANT_DATA=1
VERIFY=0
while (($#)); do
  case "$1" in
    --factor) FACTOR="$2"; shift 2 ;;
    --source) SOURCE="$2"; shift 2 ;;
    --no-data) WANT_DATA=0; shift ;;
    --verify) VERIFY=1; shift ;;
    *) echo "usage: bash scripts/prepare_gpu_wheels.sh [--factor N] [--source DIR] [--no-data] [--verify]" >&2; exit 2 ;;
  esac
done
LIMIT_MIB=64
PY="${PYTHON:-}"
if [[ -z "$PY" ]]; then
  if [[ -x .venv/bin/python ]]; then PY=.venv/bin/python; else PY=python3; fi
fi

# Keep the prepared folders out of git (they are carried with the device call, never committed).
EXCLUDE="$(git rev-parse --git-path info/exclude 2>/dev/null || true)"
if [[ -n "$EXCLUDE" ]]; then
  mkdir -p "$(dirname "$EXCLUDE")"
  touch "$EXCLUDE"
  for pattern in /.whl/ /.gpu_data/ /.gpu_cache/ /.gpu_prebuilt/; do
    grep -qxF "$pattern" "$EXCLUDE" || echo "$pattern" >> "$EXCLUDE"
  done
fi

# ---------------------------------------------------------------------------------------- wheels
mkdir -p .whl
mapfile -t PINS < <("$PY" -c '
import sys
sys.path.insert(0, "scripts")
from gpu_bench import parse_wheel_list
for name, version in parse_wheel_list(open("scripts/gpu_wheels.txt").read()):
    print(f"{name}=={version}")
')
# Wheels of projects no longer listed, or of other versions, go (pip keeps a matching one).
"$PY" - <<'PYCLEAN'
import sys
from pathlib import Path
sys.path.insert(0, "scripts")
from gpu_bench import parse_wheel_list, wheel_name_version
pins = dict(parse_wheel_list(Path("scripts/gpu_wheels.txt").read_text()))
for whl in Path(".whl").glob("*.whl"):
    name, version = wheel_name_version(whl.name)
    if pins.get(name) != version:
        print(f"[prepare] removing {whl.name} (not in scripts/gpu_wheels.txt)")
        whl.unlink()
PYCLEAN
# The platforms the README of the device tool names, plus the manylinux levels wheels of this list
# use; pip matches each level exactly.
PLATFORMS=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 manylinux_2_31_x86_64 \
         manylinux_2_34_x86_64 manylinux_2_35_x86_64; do
  PLATFORMS+=(--platform "$p")
done
echo "[prepare] downloading ${#PINS[@]} wheels for CPython 3.12 into .whl/"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" --platform any -d .whl "${PINS[@]}"
"$PY" scripts/gpu_bench.py check-wheels --list scripts/gpu_wheels.txt --dir .whl > .whl-check.json \
  || { cat .whl-check.json; rm -f .whl-check.json; echo "[prepare] error: .whl does not match scripts/gpu_wheels.txt" >&2; exit 1; }
rm -f .whl-check.json
# gsplat 1.5.3 (scripts/gpu_check.sh, step 4n): its requirements (ninja, numpy, jaxtyping, rich, torch,
# packaging) are the machine's own (scripts/gpu_machine_packages.txt).
GSPLAT_NEXT_VERSION=1.5.3
mkdir -p .whl/gsplat-next
find .whl/gsplat-next -name '*.whl' ! -name "gsplat-$GSPLAT_NEXT_VERSION-*" -delete
if ! ls .whl/gsplat-next/gsplat-"$GSPLAT_NEXT_VERSION"-*.whl >/dev/null 2>&1; then
  echo "[prepare] downloading gsplat==$GSPLAT_NEXT_VERSION into .whl/gsplat-next/"
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --abi cp312 --abi abi3 --abi none --platform any -d .whl/gsplat-next "gsplat==$GSPLAT_NEXT_VERSION"
fi

# ---------------------------------------------------------------------------------------- scene
DATA_DIR=".gpu_data/lund_door_x$FACTOR"
if ((WANT_DATA)); then
  if [[ -f "$DATA_DIR/sparse/0/points3D.txt" ]]; then
    echo "[prepare] $DATA_DIR already there"
  elif [[ -f "$SOURCE/sparse/0/cameras.txt" ]]; then
    echo "[prepare] making $DATA_DIR from $SOURCE (downscaled ${FACTOR}x)"
    "$PY" scripts/make_shipped_scene.py --source "$SOURCE" --out "$DATA_DIR" --factor "$FACTOR"
  else
    echo "[prepare] error: $SOURCE is not the lund_door scene; pass --source DIR or --no-data" >&2
    exit 1
  fi
fi

# The time-to-quality benchmark's scene (gpu_check.sh step 3b): bird, copied as it is (5 MB, MIT;
# its PROVENANCE.txt and LICENSE.source_repo travel with it).
BIRD_SOURCE="$ROOT/../shared/data/bird"
if ((WANT_DATA)) && [[ ! -f .gpu_data/bird/PROVENANCE.txt ]]; then
  if [[ -d "$BIRD_SOURCE/sparse/0" ]]; then
    echo "[prepare] copying $BIRD_SOURCE to .gpu_data/bird"
    mkdir -p .gpu_data && cp -r "$BIRD_SOURCE" .gpu_data/bird
  else
    echo "[prepare] warning: $BIRD_SOURCE not found; gpu_check.sh's time-to-quality step will fail" >&2
  fi
fi

# ---------------------------------------------------------------------------------------- sizes
# What a device call sends: tracked files, untracked files git does not ignore, plus the carried
# paths (.whl, .gpu_data and, when present, .gpu_prebuilt).
TREE_BYTES=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
WHL_BYTES=$(du -sb .whl | cut -f1)
DATA_BYTES=0
[[ -d .gpu_data ]] && DATA_BYTES=$(du -sb .gpu_data | cut -f1)
PREBUILT_BYTES=0
[[ -d .gpu_prebuilt ]] && PREBUILT_BYTES=$(du -sb .gpu_prebuilt | cut -f1)
TOTAL=$((TREE_BYTES + WHL_BYTES + DATA_BYTES + PREBUILT_BYTES))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
echo "[prepare] sizes (MiB): working tree $(mib "$TREE_BYTES"), .whl $(mib "$WHL_BYTES") ($(ls .whl/*.whl | wc -l) wheels), .gpu_data $(mib "$DATA_BYTES"), .gpu_prebuilt $(mib "$PREBUILT_BYTES"); total $(mib "$TOTAL") of $LIMIT_MIB"
if ((TOTAL > LIMIT_MIB * 1048576)); then
  echo "[prepare] error: over the device call's $LIMIT_MIB MiB" >&2
  exit 1
fi
CARRY='".whl", ".gpu_data"'
[[ -d .gpu_prebuilt ]] && CARRY="$CARRY, \".gpu_prebuilt\""
echo "[prepare] ready: device run with carry [$CARRY] and command: bash scripts/gpu_check.sh \$OUT (docs/gpu.md)"
if ((VERIFY)); then
  "$PY" scripts/gpu_simulate.py
fi
