#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-train
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-task=1
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@300
# Training on a token file: DATA=path/to/tokens.bin sbatch jobs/train.sh
# MODEL (default small), STEPS (1000), SAVE_EVERY (0: the checkpoint only at the end, or when
# stopped), INIT (a checkpoint to go on from: its model, its optimizer state, the batches after
# its step, and the training options it was saved under: the schedule, clipping, batch, seed). The
# schedule, clipping and micro-batches go in EXTRA_ARGS, e.g. EXTRA_ARGS="--lr 6e-4 --lr-schedule
# cosine --lr-warmup-steps 2000 --clip-grad-norm 1 --grad-accum 4" (decay ends at the run's last
# step, STEPS, or --lr-decay-steps; a checkpoint keeps that end, so the job's later parts need only
# INIT and STEPS).
# The checkpoint is $OUT/model.h5. Five minutes before the time limit Slurm sends
# SIGUSR1 to this script (--signal above), which hands it to the launcher (mpirun and srun pass
# it to every rank): the ranks stop together after their step and write model.h5, and the
# log says how to go on in llmhpc's options ("go on with --init F --steps N": INIT=F STEPS=N
# sbatch jobs/train.sh). The job then ends
# with llmhpc's exit code, 128 + 10 for SIGUSR1, after its report (none where llmhpc did not
# start: its message says why).
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
[ -n "${DATA:-}" ] || { echo "$0: set DATA to a .bin (uint16) or .npy token file" >&2; exit 2; }
[ -z "${MODELS:-}" ] || { echo "$0: a training job trains one model: MODEL=$MODELS, not MODELS" >&2; exit 2; }
STEPS=${STEPS:-1000}
SAVE_EVERY=${SAVE_EVERY:-0}
args=(--mode train --data "$DATA" --steps "$STEPS" --out "$OUT" --save "$OUT/model.h5" --save-every "$SAVE_EVERY")
if [ -n "${INIT:-}" ]; then  # the checkpoint's model, unless MODEL says otherwise
  args+=(--init "$INIT")
  [ -z "${MODEL:-}" ] || args+=(--model "$MODEL")
else
  args+=(--model "${MODEL:-small}")
fi
# In the background, so that the trap runs as soon as the signal comes (bash runs traps only
# between commands); wait returns early when it does, so wait again until the launcher ends.
llmhpc_start "${args[@]}"
# The launcher forwards it to every rank (mpirun: to remote ones through its daemons), and the
# ranks it started here get it directly too: an Open MPI 4.1.6 mpirun with OMPI_MCA_plm=isolated
# was seen not to forward it.
trap 'echo "$0: SIGUSR1: llmhpc stops after its step and saves $OUT/model.h5" >&2
      kill -USR1 $LLMHPC_PID; pkill -USR1 -P $LLMHPC_PID || true' USR1
rc=0
wait $LLMHPC_PID || rc=$?
while kill -0 $LLMHPC_PID 2>/dev/null; do rc=0; wait $LLMHPC_PID || rc=$?; done
# $OUT/report.md: loss and step times, train_loss.png; none where llmhpc did not start.
if [ -f "$OUT/rank00000.h5" ]; then job_report || { r=$?; [ $rc -ne 0 ] || rc=$r; }; fi
exit $rc
