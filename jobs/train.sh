#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-train
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=04:00:00
# Training on a token file: DATA=path/to/tokens.bin sbatch jobs/train.sh
set -euo pipefail
source "$(dirname "$0")/env.sh"
DATA=${DATA:?set DATA to a .bin (uint16) or .npy token file}
MODEL=${MODEL:-small}
STEPS=${STEPS:-1000}
OUT=${OUT:-$OUT_ROOT/train-$(stamp)}
$LAUNCH "$LLMHPC_BIN" --mode train --data "$DATA" --model "$MODEL" --steps "$STEPS" --out "$OUT" \
  --save "$OUT/final.h5" ${EXTRA_ARGS:-}
