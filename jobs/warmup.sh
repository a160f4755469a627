#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-warmup
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=00:30:00
# The seeds' warm-up study: the same sweep with 0, 1, 2 and 5 warm-up steps.
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
MODELS=${MODELS:-small,medium,large,xl,2.7B}
for w in 0 1 2 5; do
  OUT=$OUT_ROOT/warmup${w}-$(stamp)
  $LAUNCH "$LLMHPC_BIN" --mode bench --device "$DEVICE" --model "$MODELS" --phase forward-backward --warmup "$w" --steps 10 \
    --out "$OUT" ${EXTRA_ARGS:-}
  echo "## warm-up steps: $w"
  $PYTHON "$LLMHPC_ROOT/analysis/report.py" "$OUT"
done
