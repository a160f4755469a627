#!/usr/bin/env bash
#SBATCH --job-name=llmhpc-scaling
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-task=1
#SBATCH --time=01:00:00
# The scaling study: data-parallel training at 1, 2, 4, ... ranks up to the job's tasks (RANKS),
# strong (a fixed global batch, STRONG_BATCH, default 2 per rank at the most ranks) and weak (a
# fixed batch per GPU, WEAK_BATCH: a tensor-parallel group of tp ranks takes tp x WEAK_BATCH);
# one strategy (STRATEGY, BUCKET MiB) under each sharding stage (SHARDINGS: none,zero1,zero2,
# zero3 under bucketed, else none; at 1 rank none alone, where every series starts: sharding one
# rank shards nothing), each again under every tensor-parallel size of TP that divides the rank
# count (tp x dp ranks, the global batch shared by the dp groups). After each rank count's runs, a
# run of the collectives (COMM_COLLECTIVES) at that count (2 or more), which the launcher places as
# it placed those runs (the same nodes, the same links), gives the ring model its o and w at each
# size for them. $OUT/report.md's scaling section opens with the study in short and every
# configuration in one table (tokens/s per GPU against one GPU's, MFU and model TFLOP/s, peak
# memory per rank, exposed communication and the collectives' device time beside the model's, and
# the collectives' run it takes, with its ranks and nodes), then each series with projections to
# larger clusters (each labelled "projection"), and scaling.png (tokens/s per GPU and efficiency against ranks; per rank
# on CPUs). Each configuration runs once, in turn: the report says layouts are not told apart only
# within their timed steps' noise, not the host's drift between configurations, so a close choice is
# worth a second job. OUT (default results/llmhpc-scaling-<job id> under sbatch,
# results/scaling-<time> otherwise) holds $OUT/strong-np<N>, $OUT/weak-np<N> (none
# where its global batch is STRONG_BATCH: that configuration is strong-np<N>, which the weak series
# takes), $OUT/collectives-np<N>.
#
# Across nodes: sbatch --nodes=2 --ntasks-per-node=8 jobs/scaling.sh (mpirun places the ranks).
# NET=1 runs everything again with NCCL's network transport forced (NCCL_P2P_DISABLE=1
# NCCL_SHM_DISABLE=1: the path ranks on different nodes take), in folders ending in -net, which
# the report labels "network transport"; NET=only runs that alone. For ranks on other hosts the
# launcher must pass those variables (MPIRUN="mpirun -x NCCL_P2P_DISABLE -x NCCL_SHM_DISABLE";
# srun passes them by itself).
#
# Variables (defaults): RANKS (1,2,4,...,NP), MODELS (xl), SHAPE (a custom model's options, which
# override MODELS), CONTEXTS (128), PRECISIONS (fp32), STRONG_BATCH, WEAK_BATCH (2), STRATEGY
# (bucketed), SHARDINGS, TP (1; e.g. 1,2), BUCKET (25), WARMUP (5), STEPS (10), COMM_SIZES
# (1MB,4MB,16MB,64MB,256MB,1000MB: the model takes each collective's o and w from the two sizes
# around it), COMM_COLLECTIVES (allreduce,reducescatter,allgather), NET (0). Each rank count is
# a launch of its own, $MPIRUN $MPIRUN_ARGS $NP_OPTION N (LAUNCH, with its fixed count, does not
# apply; MPIRUN="srun --mpi=pmix" launches with srun -n N). EXTRA_ARGS go to the ddp runs, not to
# the collectives' runs (mode comm refuses model and ddp options).
# More ranks than cores (a CPU run on a small machine) need MPIRUN_ARGS="--bind-to none --oversubscribe".
# The settings are checked before the first run: the job's own (ranks, batches, TP), then llmhpc's
# options as the runs give them, by a launch of llmhpc that stops once they passed (each TP size
# at the fewest ranks it runs on, the strong batch; the collectives' options at the most ranks the
# job launches, so that a rank count the launcher cannot start, e.g. more ranks than slots, is
# found before the smaller counts ran; what a run checks only once it starts, such as the
# backend's own limits, is not), and the job exits 2 saying why.
#   sbatch jobs/scaling.sh            or   NP=4 bash jobs/scaling.sh
#   NP=2 DEVICE=cpu SHAPE="--d-model 64 --d-ff 128 --num-layers 2 --num-heads 4" CONTEXTS=32 \
#     COMM_SIZES=4KB,64KB,1MB,8MB OMPI_MCA_mpi_yield_when_idle=1 bash jobs/scaling.sh
# (a tiny model on CPUs, under a minute; ranks waiting in MPI yield their core, or on a small
# machine the other rank's time slices decide the collectives' times: a 4 KB all-reduce read 8 ms)
set -euo pipefail
# The repository, also from the copy of this script that sbatch runs (jobs/env.sh says how).
for r in "${LLMHPC_ROOT:-}" "${SLURM_SUBMIT_DIR:-}" "${SLURM_SUBMIT_DIR:-}/.." "$(dirname "$0")/.." ""; do [ -f "$r/jobs/env.sh" ] && break; done
[ -n "$r" ] || { echo "$0: cannot find the llmhpc repository: set LLMHPC_ROOT, or sbatch from it" >&2; exit 2; }
source "$r/jobs/env.sh"
RANKS=${RANKS:-$(rank_counts)}
MODELS=${MODELS:-xl}
SHAPE=${SHAPE:-}
CONTEXTS=${CONTEXTS:-128}
max_np=$(tr ',' '\n' <<<"$RANKS" | sort -n | tail -1)
STRONG_BATCH=${STRONG_BATCH:-$((2 * max_np))}
WEAK_BATCH=${WEAK_BATCH:-2}
PRECISIONS=${PRECISIONS:-fp32}
STRATEGY=${STRATEGY:-bucketed}
# Every sharding stage under bucketed (zero2 and zero3 run only there), none otherwise.
SHARDINGS=${SHARDINGS:-$([ "$STRATEGY" = bucketed ] && echo none,zero1,zero2,zero3 || echo none)}
TP=${TP:-1}
BUCKET=${BUCKET:-25}
WARMUP=${WARMUP:-5}
STEPS=${STEPS:-10}
COMM_SIZES=${COMM_SIZES:-1MB,4MB,16MB,64MB,256MB,1000MB}
COMM_COLLECTIVES=${COMM_COLLECTIVES:-allreduce,reducescatter,allgather}
case "${NET:-0}" in 0) transports=default ;; 1) transports="default net" ;; only) transports=net ;;
  *) echo "$0: NET must be 0, 1 or only, not '$NET'" >&2; exit 2 ;; esac
# Checked before the first run, not when the sweep reaches the rank count that cannot take it.
require_numbers RANKS 1
require_numbers TP 1
for tp in ${TP//,/ }; do  # a size no rank count takes would silently never run
  for np in ${RANKS//,/ }; do [ $((np % tp)) -eq 0 ] && continue 2; done
  echo "$0: TP=$TP: tensor-parallel size $tp divides none of RANKS=$RANKS, so it would never run; give rank counts it divides" >&2
  exit 2
done
if [ "$transports" != default ] && [ "$DEVICE" = cpu ]; then
  echo "$0: NET=${NET} forces NCCL's network transport, but DEVICE=cpu runs the mpi backend, which has no other: NET=0 on CPU" >&2
  exit 2
fi
# The ring model takes each collective's o and w from the line through two measured sizes.
if [ "$(tr ',' '\n' <<<"$COMM_SIZES" | grep -c .)" -lt 2 ]; then
  echo "$0: COMM_SIZES=$COMM_SIZES: the communication model needs the collectives measured at two sizes or more, around the model's buckets and units (e.g. 1MB,16MB,128MB)" >&2
  exit 2
fi
for v in STRONG_BATCH WEAK_BATCH; do  # one batch each, not a list
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || { echo "$0: $v must be one whole number of sequences, at least 1, not '${!v}'" >&2; exit 2; }
done
for np in ${RANKS//,/ }; do
  [ $((STRONG_BATCH % np)) -eq 0 ] || {
    echo "$0: STRONG_BATCH=$STRONG_BATCH is the global batch at every rank count and must divide by each of RANKS=$RANKS (not by $np)" >&2
    exit 2
  }
done
# llmhpc checks the options itself (see above), with an --out it cannot make (/dev/null is no
# folder), where it stops once they passed: nothing runs and nothing is written.
unmade=/dev/null/scaling-check
check_options() {  # RANKS OPTIONS...: exit 2 with llmhpc's reason unless only the --out stopped it
  local said
  # (Open MPI's mpirun then waits 2 s, twice odls_base_sigkill_timeout, before it returns. Keep
  # the default: at 0 mpirun may kill rank 0 before its message is out, 1 run in 10 on fake
  # nodes under sbatch.)
  said=$($MPIRUN $MPIRUN_ARGS $NP_OPTION "$1" "$LLMHPC_BIN" --device "$DEVICE" "${@:2}" --out "$unmade" 2>&1) || true
  grep -qF -- "--out '$unmade': cannot create the directory" <<<"$said" && return
  if grep -q "llmhpc: error" <<<"$said"; then
    echo "$0: llmhpc refuses these settings (SHARDINGS is its --shard-optimizer, STRATEGY --ddp, PRECISIONS" \
      "--precision, MODELS --model, CONTEXTS --context-length, BUCKET --bucket-mb, COMM_COLLECTIVES --collective," \
      "COMM_SIZES --size; SHAPE and EXTRA_ARGS are its options):" >&2
    grep "llmhpc: error" <<<"$said" >&2
  elif grep -q "llmhpc: " <<<"$said"; then  # llmhpc started and failed (a fatal error: the device, the library)
    echo "$0: llmhpc failed while checking these settings:" >&2
    echo "$said" >&2
  else  # the launcher, not llmhpc: too few slots, a binary it cannot start, ...
    echo "$0: '$MPIRUN $MPIRUN_ARGS $NP_OPTION $1 $LLMHPC_BIN' could not start $1 rank(s) of llmhpc$(
      [[ "$MPIRUN" == *mpirun* ]] && echo " (more ranks than cores on one machine need MPIRUN_ARGS=\"--bind-to none --oversubscribe\")"
    ); it said:" >&2
    echo "$said" >&2
  fi
  exit 2
}
declare -A tps_from  # the fewest ranks each tensor-parallel size runs on: its sizes there
for tp in ${TP//,/ }; do
  for np in $(tr ',' '\n' <<<"$RANKS" | sort -n); do
    if [ $((np % tp)) -eq 0 ]; then tps_from[$np]+=${tps_from[$np]:+,}$tp && break; fi
  done
done
for np in "${!tps_from[@]}"; do
  check_options "$np" --mode ddp --model "$MODELS" $SHAPE --context-length "$CONTEXTS" --batch-size "$STRONG_BATCH" \
    --precision "$PRECISIONS" --ddp "$STRATEGY" --bucket-mb "$BUCKET" --shard-optimizer "$SHARDINGS" \
    --tp "${tps_from[$np]}" --warmup "$WARMUP" --steps "$STEPS" --heat-s "$HEAT_S" ${EXTRA_ARGS:-}
done
# The collectives' options at the most ranks any run takes (a count no TP divides runs nothing):
# the same launch as the largest runs, so a launcher that cannot start that many says so now.
most=$(tr ',' '\n' <<<"$RANKS" | awk -v tps="$TP" 'BEGIN { n = split(tps, tp, ",") }
  { for (i = 1; i <= n; i++) if ($1 % tp[i] == 0 && $1 > most) most = $1 } END { print most + 0 }')
if [ "$most" -gt 1 ]; then check_options "$most" --mode comm --collective "$COMM_COLLECTIVES" --size "$COMM_SIZES"; fi
if [ "$on_cpu" = 1 ] && [ -z "$SHAPE" ] && [ "$MODELS" != tiny ]; then  # xl's step on 2 cores: minutes
  echo "scaling: note: MODELS=$MODELS on CPUs takes minutes a step; for a quick study give SHAPE (a small model, as in the header's example) or MODELS=tiny"
fi
mkdir -p "$OUT"
echo "scaling: ranks $RANKS, strong global batch $STRONG_BATCH, weak per-rank batch $WEAK_BATCH; results in $OUT"
# A series of one point has nothing to scale: with one rank count the report has no scaling
# section; it opens with the choice of layout, then mode ddp's tables. A tensor-parallel series starts from the one-rank run where RANKS
# and TP both hold 1.
one_rank=$(tr ',' '\n' <<<"$RANKS" | grep -cx 1 || true)
tr ',' '\n' <<<"$TP" | grep -qx 1 || one_rank=0
for tp in ${TP//,/ }; do
  counts=$(tr ',' '\n' <<<"$RANKS" | awk -v tp="$tp" '$1 % tp == 0' | wc -l)
  [ "$tp" -gt 1 ] && counts=$((counts + one_rank))
  [ "$counts" = 1 ] && echo "scaling: tp $tp runs at one rank count of RANKS=$RANKS: a single point, no scaling series (give more rank counts it divides)"
done

for transport in $transports; do
  (
    suffix=""
    if [ "$transport" = net ]; then export NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1; suffix=-net; fi
    for np in ${RANKS//,/ }; do
      tps=$(tr ',' '\n' <<<"$TP" | awk -v np="$np" 'np % $1 == 0' | paste -sd, -)  # the sizes np can take
      kinds="strong weak"
      [ -n "$tps" ] || { echo "scaling: no TP in $TP divides $np ranks: no training runs at $np"; kinds=""; }
      for kind in $kinds; do
        if [ $kind = strong ]; then batch=$STRONG_BATCH; else batch=$((WEAK_BATCH * np)); fi
        if [ $kind = weak ] && [ "$batch" = "$STRONG_BATCH" ]; then  # the same run twice: the report takes strong's
          echo "scaling: weak at $np ranks is global batch $batch, the strong run: not run twice"
          continue
        fi
        echo "scaling: $kind scaling, $np rank(s), global batch $batch, tp $tps -> $OUT/$kind-np$np$suffix"
        $MPIRUN $MPIRUN_ARGS $NP_OPTION "$np" "$LLMHPC_BIN" --mode ddp --device "$DEVICE" --model "$MODELS" $SHAPE --context-length "$CONTEXTS" \
          --batch-size "$batch" --precision "$PRECISIONS" --ddp "$STRATEGY" --bucket-mb "$BUCKET" \
          --shard-optimizer "$([ "$np" = 1 ] && echo none || echo "$SHARDINGS")" --tp "$tps" --warmup "$WARMUP" \
          --steps "$STEPS" --heat-s "$HEAT_S" --out "$OUT/$kind-np$np$suffix" ${EXTRA_ARGS:-}
      done
      # The collectives on the ranks just trained on, placed as they were: the prediction for a run
      # within a node takes links within a node, one across nodes the links between them. Right
      # after the runs, so that a job stopped later keeps the predictions of the counts it finished.
      if [ "$np" -gt 1 ] && [ -n "$kinds" ]; then  # where runs took it
        echo "scaling: the collectives at $np ranks, for the model's o and w -> $OUT/collectives-np$np$suffix"
        $MPIRUN $MPIRUN_ARGS $NP_OPTION "$np" "$LLMHPC_BIN" --mode comm --device "$DEVICE" --collective "$COMM_COLLECTIVES" \
          --size "$COMM_SIZES" --out "$OUT/collectives-np$np$suffix"
      fi
    done
  )
done
job_report
