#!/usr/bin/env bash
# The main job: train `distsplat` on the shipped real scene (scenes/lund_door), export the PLY and
# evaluate, then print where everything is. Usage: bash scripts/run_demo.sh [NUM_IMAGES] [extra ns-train args]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
source .venv/bin/activate
NUM_IMAGES="${1:-600}"
shift || true
OUT="${DISTSPLAT_OUT:-$ROOT/outputs}"
DEVICE=cpu
python -c "import torch,sys; sys.exit(0 if torch.cuda.is_available() else 1)" && DEVICE=cuda
ns-train distsplat \
  --output-dir "$OUT" --experiment-name lund_door --timestamp "demo-$(date +%Y%m%d-%H%M%S)" \
  --machine.device-type "$DEVICE" --max-num-iterations "$NUM_IMAGES" \
  --steps-per-eval-all-images 200 --steps-per-save 200 \
  --vis tensorboard --viewer.quit-on-train-completion True "$@" \
  colmap --data scenes/lund_door --colmap-path sparse/0 --load-3D-points True --downscale-factor 1
RUN_DIR="$(ls -td "$OUT"/lund_door/distsplat/*/ | head -1)"
RUN_DIR="${RUN_DIR%/}"
ns-export gaussian-splat --load-config "$RUN_DIR/config.yml" --output-dir "$RUN_DIR/export"
# --render-output-path: ns-eval also saves, for every held-out (eval-split) image, the model's
# ground truth beside its render (eval_img_NNNN.png); the first is the demo's picture.
ns-eval --load-config "$RUN_DIR/config.yml" --output-path "$RUN_DIR/eval.json" --render-output-path "$RUN_DIR/eval_images"
cp "$RUN_DIR/eval_images/eval_img_0000.png" "$RUN_DIR/demo_view.png"
echo
echo "== distsplat demo finished =="
echo "run directory : $RUN_DIR"
echo "run summary   : $RUN_DIR/distsplat_stats.json"
echo "checkpoints   : $RUN_DIR/nerfstudio_models/"
echo "PLY           : $RUN_DIR/export/splat.ply"
echo "eval metrics  : $RUN_DIR/eval.json"
echo "picture       : $RUN_DIR/demo_view.png (held-out view: ground truth left, render right)"
echo "view it       : ns-viewer --load-config $RUN_DIR/config.yml"
