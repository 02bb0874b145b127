#!/usr/bin/env bash
# Two small float32 runs with fixed seeds, for comparing checkpoints across a code change
# (scripts/compare_checkpoints.py): one replicated process and 2 sharded ranks (gloo) of `ns-train
# distsplat` on the shipped scene, 96 random Gaussians, 20 images (10 steps of B = 2), a refine at
# step 8 and a save at step 9 (the settings of tests/fixtures/b53ba80/make_fixtures.sh).
# Usage, from the repository root: bash scripts/train_compare_runs.sh COMMIT OUT_FOLDER
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
COMMIT="$1"
OUT="$(mkdir -p "$2" && cd "$2" && pwd)"
BIN="${BIN:-$ROOT/.venv/bin}"
git -C "$ROOT" worktree add --detach "$OUT/tree" "$COMMIT" >/dev/null
trap 'git -C "$ROOT" worktree remove --force "$OUT/tree"' EXIT
export PYTHONPATH="$OUT/tree" OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
cd "$OUT"
ln -sfn "$ROOT/scenes" scenes
ARGS=(--output-dir out --experiment-name cmp --machine.device-type cpu --machine.seed 7
      --max-num-iterations 20 --steps-per-save 1000 --steps-per-eval-image 1000 --steps-per-eval-all-images 1000
      --vis tensorboard --viewer.quit-on-train-completion True --logging.local-writer.enable False
      --pipeline.batch-size 2 --pipeline.model.random-init True --pipeline.model.num-random 96
      --pipeline.model.sh-degree 1 --pipeline.model.num-downscales 2 --pipeline.model.resolution-schedule 100000
      --pipeline.model.warmup-length 2 --pipeline.model.refine-every 4 --pipeline.model.densify-grad-thresh 0.00002
      --pipeline.model.param-dtype float32 --pipeline.model.rendering-backend reference)
DATA=(colmap --data scenes/lund_door --colmap-path sparse/0 --load-3D-points True --downscale-factor 1)
"$BIN/ns-train" distsplat "${ARGS[@]}" --timestamp replicated "${DATA[@]}" > replicated.log 2>&1
"$BIN/torchrun" --nproc_per_node 2 "$BIN/ns-train" distsplat "${ARGS[@]}" --timestamp sharded --pipeline.parallel sharded "${DATA[@]}" > sharded.log 2>&1
ls out/cmp/distsplat/*/nerfstudio_models
