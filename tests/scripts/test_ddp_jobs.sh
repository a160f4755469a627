#!/usr/bin/env bash
# The job scripts on this machine, without Slurm: jobs/ddp_bucketed.sh with 2 ranks on the CPU
# and a tiny model (its results folder named after the job, both rank files, the all-reduce
# run, the report ddp.md with its tables next to them), and with EXTRA_ARGS overriding the job's
# own --warmup and --steps; the same script copied elsewhere and
# run as sbatch runs it (as slurm_script, with SLURM_SUBMIT_DIR, SLURM_JOB_ID and
# SLURM_JOB_NAME set and LLMHPC_ROOT unset), which must find the repository and name its
# folder <job name>-<job id>; the copy with no way to the repository, which must stop with a
# clear message; NP that is not a rank count (0, -2, two), refused with a message; scaling.sh
# refusing settings llmhpc refuses (a sharding stage, a collective) and a rank count its launcher
# cannot start before any run; scaling.sh
# with tensor parallelism (TP=1,2 on up to 4 ranks), a series per layout, the collectives measured
# at each rank count and each prediction taking those of its own; and bench.sh
# and comm.sh, which share jobs/env.sh, still running as before (comm.sh with DTYPE=float, its
# old setting for --precision fp32), bench.sh timing AdamW as its own phase unless
# ADAMW_IN_BACKWARD=1, and with PHASE=forward too.
set -euo pipefail
: "${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}"
LLMHPC_BIN=$(realpath -m "$LLMHPC_BIN")  # absolute: the test runs in folders of its own
ROOT=${LLMHPC_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
export PYTHON=${LLMHPC_PYTHON:-python3}
export MPIRUN="${MPIEXEC:-mpirun} --oversubscribe" LLMHPC_BIN
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
"$PYTHON" -c "import h5py, pandas" 2>/dev/null || { echo "SKIP: $PYTHON has no h5py or pandas"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
# A tiny model and short runs: seconds, not hours.
export NP=2 DEVICE=cpu CONTEXTS=16 WARMUP=1 STEPS=2 BUCKETS=0.0001,1000 COMM_SIZES=4KB,64KB
export SHAPE="--d-model 32 --d-ff 64 --num-layers 2 --num-heads 4 --vocab-size 64"

check_results() {  # check_results DIR LOG: what a finished ddp_bucketed job leaves
  local dir=$1 log=$2
  [ -f "$dir/rank00000.h5" ] && [ -f "$dir/rank00001.h5" ] || { cat "$log"; fail "$dir lacks the two rank files"; }
  [ -f "$dir/allreduce/rank00000.h5" ] || { cat "$log"; fail "$dir lacks the all-reduce run"; }
  [ -s "$dir/ddp.md" ] || { cat "$log"; fail "$dir lacks the report ddp.md"; }
  for section in "(a) DDP strategies" "(b) bucket sizes" "(c) overhead of data parallelism" "(e) bucket model" \
                 "from --comm $dir/allreduce"; do
    grep -qF -- "$section" "$dir/ddp.md" || { cat "$dir/ddp.md"; fail "ddp.md lacks '$section'"; }
  done
  for impl in none naive flat overlap bucketed; do
    grep -q "^| $impl |" "$dir/ddp.md" || { cat "$dir/ddp.md"; fail "ddp.md has no row for $impl"; }
  done
}

# 1. As a user runs it on a workstation: results/<script name>-<time> under OUT_ROOT; with
#    PyTorch DDP in the same job (TORCH=1) where PyTorch is installed.
torch=0
"$PYTHON" -c "import torch" 2>/dev/null && torch=1
OUT_ROOT=$tmp/results TORCH=$torch TORCH_SETUPS=eager TORCHRUN="$PYTHON -m torch.distributed.run --standalone --nproc_per_node 2" \
  bash "$ROOT/jobs/ddp_bucketed.sh" >"$tmp/job.log" 2>&1 || { cat "$tmp/job.log"; fail "bash jobs/ddp_bucketed.sh exited non-zero"; }
dirs=("$tmp"/results/ddp_bucketed-*)
[ ${#dirs[@]} -eq 1 ] && [ -d "${dirs[0]}" ] || { ls -R "$tmp/results"; fail "expected one folder results/ddp_bucketed-<time>"; }
check_results "${dirs[0]}" "$tmp/job.log"
if [ $torch = 1 ]; then
  [ "$(grep -c '^| eager | ' "${dirs[0]}/ddp.md")" -eq 3 ] || { cat "${dirs[0]}/ddp.md"; fail "ddp.md lacks PyTorch's 3 rows"; }
fi
echo "ok   bash jobs/ddp_bucketed.sh -> ${dirs[0]#$tmp/} (PyTorch: $([ $torch = 1 ] && echo ran || echo not installed))"

# 1b. EXTRA_ARGS override the job's own values (llmhpc takes an option given twice at its last
#     value; jobs/env.sh): the job passes --warmup 3 --steps 5, EXTRA_ARGS="--warmup 1 --steps 2",
#     and every configuration of both rank files ran 1 warm-up and 2 timed steps.
NP=2 DEVICE=cpu WARMUP=3 STEPS=5 EXTRA_ARGS="--warmup 1 --steps 2" OUT="$tmp/extra" \
  bash "$ROOT/jobs/ddp_bucketed.sh" >"$tmp/extra.log" 2>&1 ||
  { cat "$tmp/extra.log"; fail "EXTRA_ARGS='--warmup 1 --steps 2' bash jobs/ddp_bucketed.sh exited non-zero"; }
check_results "$tmp/extra" "$tmp/extra.log"
"$PYTHON" - "$tmp/extra" <<'EOF' || { cat "$tmp/extra.log"; fail "EXTRA_ARGS did not override the job's --warmup 3 --steps 5"; }
import sys
import h5py
for r in (0, 1):
    with h5py.File(f"{sys.argv[1]}/rank{r:05d}.h5") as f:
        recs = list(f["ddp"].values())
        assert recs and f.attrs["status"] == "complete", dict(f.attrs)
        for g in recs:
            assert g.attrs["steps"] == 2 and len(g["step_ms"]) == 2, (r, g.name, g.attrs["steps"], len(g["step_ms"]))
            assert g.attrs["warmup"] == 1, (r, g.name, g.attrs["warmup"])
print(f"    {len(recs)} configurations per rank, each 1 warm-up and 2 timed steps")
EOF
echo "ok   EXTRA_ARGS='--warmup 1 --steps 2' over the job's WARMUP=3 STEPS=5: 2 steps recorded"

# 2. As sbatch runs it: a copy named slurm_script in a spool directory, started elsewhere.
mkdir -p "$tmp/spool" "$tmp/elsewhere"
cp "$ROOT/jobs/ddp_bucketed.sh" "$tmp/spool/slurm_script"
(cd "$tmp/elsewhere" && env -u LLMHPC_ROOT -u NP SLURM_SUBMIT_DIR="$ROOT" SLURM_JOB_ID=123 SLURM_JOB_NAME=llmhpc-ddp-bucketed \
   LAUNCH="$MPIRUN -np 2" OUT_ROOT="$tmp/sbatch" bash "$tmp/spool/slurm_script") >"$tmp/sbatch.log" 2>&1 ||
  { cat "$tmp/sbatch.log"; fail "the copied script (simulated sbatch) exited non-zero"; }
check_results "$tmp/sbatch/llmhpc-ddp-bucketed-123" "$tmp/sbatch.log"
echo "ok   the copy sbatch runs found the repository -> sbatch/llmhpc-ddp-bucketed-123"

# 3. The copy with no way back to the repository: a clear message, exit 2, nothing written.
set +e
(cd "$tmp/elsewhere" && env -u LLMHPC_ROOT -u SLURM_SUBMIT_DIR OUT_ROOT="$tmp/lost" bash "$tmp/spool/slurm_script") \
  >"$tmp/lost.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] || { cat "$tmp/lost.log"; fail "the lost copy exited $rc, expected 2"; }
grep -q "cannot find the llmhpc repository" "$tmp/lost.log" || { cat "$tmp/lost.log"; fail "no clear message"; }
[ ! -e "$tmp/lost" ] || fail "the lost copy wrote $tmp/lost"
echo "ok   the lost copy: $(cat "$tmp/lost.log")"

# 3b. A rank count that is not one (mpirun -np 0 would start a rank per slot): exit 2, said, nothing written.
for bad in 0 -2 two; do
  set +e
  NP=$bad OUT_ROOT="$tmp/badnp" bash "$ROOT/jobs/bench.sh" >"$tmp/badnp.log" 2>&1
  rc=$?
  set -e
  [ $rc -eq 2 ] && grep -q "NP must be a whole number of ranks, at least 1, not '$bad'" "$tmp/badnp.log" ||
    { cat "$tmp/badnp.log"; fail "NP=$bad: exit $rc without the message"; }
  [ ! -e "$tmp/badnp" ] || fail "NP=$bad wrote $tmp/badnp"
done
echo "ok   NP=0, -2, two: refused"
# Settings are environment variables: --help prints the job's header, an argument is refused.
out=$(bash "$ROOT/jobs/scaling.sh" --help) && grep -q "^The scaling study: " <<<"$out" && grep -q "WEAK_BATCH" <<<"$out" &&
  ! grep -q "^#" <<<"$out" || fail "scaling.sh --help: $out"
set +e
OUT_ROOT="$tmp/argument" bash "$ROOT/jobs/comm.sh" 4 >"$tmp/argument.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "a job takes no arguments, not '4'" "$tmp/argument.log" && [ ! -e "$tmp/argument" ] ||
  { cat "$tmp/argument.log"; fail "comm.sh 4: exit $rc"; }
echo "ok   jobs/scaling.sh --help prints its header; jobs/comm.sh 4 refused before running"
# A launcher that cannot start the most ranks (here 2, as Open MPI without enough slots): the job
# says so before any run, not after the 1-rank runs.
printf '#!/usr/bin/env bash\n[ "$2" = 2 ] && { echo "There are not enough slots available"; exit 1; }\nexec ${MPIEXEC:-mpirun} --oversubscribe "$@"\n' >"$tmp/launcher"
chmod +x "$tmp/launcher"
set +e
MPIRUN="$tmp/launcher" RANKS=1,2 SHARDINGS=none OUT="$tmp/slots" bash "$ROOT/jobs/scaling.sh" >"$tmp/slots.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "could not start 2 rank(s) of llmhpc" "$tmp/slots.log" && grep -q "not enough slots" "$tmp/slots.log" &&
  [ ! -e "$tmp/slots" ] || { cat "$tmp/slots.log"; fail "scaling.sh with a launcher that cannot start 2 ranks: exit $rc"; }
echo "ok   a launcher that cannot start the most ranks: refused before any run"
# A launch that fails midway (here every 2-rank run, not the check before them): the job fails,
# keeps the 1-rank runs and says how to report them.
printf '#!/usr/bin/env bash\n[ "$2" = 2 ] && [[ "$*" == *" --out %s/half/"* ]] && exit 1\nexec ${MPIEXEC:-mpirun} --oversubscribe "$@"\n' \
  "$tmp" >"$tmp/launcher"
set +e
MPIRUN="$tmp/launcher" RANKS=1,2 SHARDINGS=none OUT="$tmp/half" bash "$ROOT/jobs/scaling.sh" >"$tmp/half.log" 2>&1
rc=$?
set -e
[ $rc -ne 0 ] && [ -f "$tmp/half/strong-np1/rank00000.h5" ] && grep -q "what finished is in $tmp/half: .*analysis/report.py" "$tmp/half.log" ||
  { cat "$tmp/half.log"; fail "scaling.sh with a failing 2-rank launch: exit $rc"; }
echo "ok   a launch that fails midway: the job fails, keeps the finished runs and says how to report them"

# 3c. A job whose llmhpc refuses its input exits non-zero and leaves no empty folder or file
# (attention.sh makes OUT before its runs).
for job in attention precision; do
  set +e
  MODELS=bogus HEAD_DIMS=bogus OUT_ROOT="$tmp/refused" bash "$ROOT/jobs/$job.sh" >"$tmp/refused.log" 2>&1
  rc=$?
  set -e
  [ $rc -ne 0 ] && grep -q "llmhpc: error: --" "$tmp/refused.log" || { cat "$tmp/refused.log"; fail "$job.sh: exit $rc"; }
  [ -z "$(find "$tmp/refused" -mindepth 1 2>/dev/null)" ] || { find "$tmp/refused"; fail "$job.sh left files behind"; }
done
echo "ok   refused input: attention.sh and precision.sh leave nothing"
# scaling.sh checks its batches against every rank count before the first run.
set +e
NP=2 STRONG_BATCH=3 OUT_ROOT="$tmp/refused-scaling" bash "$ROOT/jobs/scaling.sh" >"$tmp/refused.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "STRONG_BATCH=3 is the global batch at every rank count and must divide by each of RANKS=1,2" \
  "$tmp/refused.log" || { cat "$tmp/refused.log"; fail "scaling.sh STRONG_BATCH=3: exit $rc"; }
[ ! -e "$tmp/refused-scaling" ] || { find "$tmp/refused-scaling"; fail "scaling.sh STRONG_BATCH=3 wrote results"; }
set +e
NP=2 STRONG_BATCH=4,8 OUT_ROOT="$tmp/refused-scaling" bash "$ROOT/jobs/scaling.sh" >"$tmp/refused.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "STRONG_BATCH must be one whole number" "$tmp/refused.log" ||
  { cat "$tmp/refused.log"; fail "scaling.sh STRONG_BATCH=4,8: exit $rc"; }
[ ! -e "$tmp/refused-scaling" ] || { find "$tmp/refused-scaling"; fail "scaling.sh STRONG_BATCH=4,8 wrote results"; }
# A tensor-parallel size no rank count takes, the network transport on the mpi backend, and values
# llmhpc refuses, which it checks before the first run, not when the sweep reaches them: a sharding
# stage (used from 2 ranks on), a collective (used after the training runs).
for refusal in "TP=1,3|tensor-parallel size 3 divides none of RANKS=1,2" "NET=1|DEVICE=cpu runs the mpi backend" \
  "SHARDINGS=zero9|--shard-optimizer 'zero9': must be one of" "COMM_COLLECTIVES=allredue|--collective 'allredue'" \
  "COMM_SIZES=4KB|the communication model needs the collectives measured at two sizes or more"; do
  set +e
  env NP=2 DEVICE=cpu "${refusal%%|*}" OUT_ROOT="$tmp/refused-scaling" bash "$ROOT/jobs/scaling.sh" >"$tmp/refused.log" 2>&1
  rc=$?
  set -e
  [ $rc -eq 2 ] && grep -qF -- "${refusal#*|}" "$tmp/refused.log" || { cat "$tmp/refused.log"; fail "scaling.sh ${refusal%%|*}: exit $rc"; }
  [ ! -e "$tmp/refused-scaling" ] || { find "$tmp/refused-scaling"; fail "scaling.sh ${refusal%%|*} wrote results"; }
done
echo "ok   scaling.sh refuses STRONG_BATCH=3 on 1,2 ranks, a list of batches, TP=1,3, NET=1 on CPU, SHARDINGS=zero9,"
echo "     COMM_COLLECTIVES=allredue and COMM_SIZES of one size before running"
# scaling.sh with TP=1,2 over 2 and 4 ranks: a tensor-parallel series beside the data-parallel one,
# from the one-rank run (tp 2 at 1 rank skipped: 2 does not divide 1), with its projections from the
# all-reduce run; the collectives at 2 and 4 ranks, each prediction from those on its data-parallel
# ranks (one node here), so that the ddp tables (e) have theirs too.
NP=4 RANKS=1,2,4 TP=1,2 SHARDINGS=none STRONG_BATCH=8 OUT="$tmp/scaling" bash "$ROOT/jobs/scaling.sh" \
  >"$tmp/scaling.log" 2>&1 || { rc=$?; cat "$tmp/scaling.log"; fail "scaling.sh TP=1,2: exit $rc"; }
for table in "strong: .*, bucketed 25 MiB, tp 2" "strong: .*, bucketed 25 MiB" "weak: .*, bucketed 25 MiB, tp 2"; do
  grep -q "^### Scaling, $table\$" "$tmp/scaling/report.md" || { cat "$tmp/scaling/report.md"; fail "no table '$table'"; }
done
"$PYTHON" - "$tmp/scaling/report.md" <<'PY' || fail "scaling.sh TP=1,2: the tp 2 series is not at 2 and 4 ranks"
import re, sys
text = open(sys.argv[1]).read()
block = text.split("### Scaling, strong: ")[1:]
tp2 = next(b for b in block if b.splitlines()[0].endswith(", tp 2")).split("\n### ")[0]
measured = [line for line in tp2.splitlines() if line.startswith("|") and "| measured" in line]
projected = [line for line in tp2.splitlines() if "projection" in line]
assert [int(line.split("|")[1]) for line in measured] == [1, 2, 4] and projected, tp2
assert "(strong-np1; one rank: bucketed 25 MiB) |" in measured[0], tp2  # from one rank's run
assert "| measured (strong-np2) |" in measured[1], tp2
# Weak: 2 sequences per GPU at 1, 2 and 4 ranks, tp 2 too (its groups take 4), from the same one-rank
# run; at 4 ranks the strong run (global batch 8) is that configuration, and its Source says so.
weak = text.split("### Scaling, weak: ")[1:]
tp2 = next(b for b in weak if b.splitlines()[0].endswith(", tp 2")).split("\n### ")[0]
assert tp2.startswith("d32_L2, T=16, global batch 2 x ranks,"), tp2
assert [int(line.split("|")[1]) for line in tp2.splitlines() if "| measured" in line] == [1, 2, 4], tp2
assert [line.split("| measured (")[1].split(")")[0].split(";")[0] for line in tp2.splitlines()
        if "| measured" in line] == ["weak-np1", "weak-np2", "strong-np4"], tp2
# Each group's ranks take the same sequences: the batch per data-parallel rank is the global over n / 2.
assert [line.split("|")[3:5] for line in tp2.splitlines() if "| measured" in line] == \
    [[" 2 ", " 2 "], [" 4 ", " 4 "], [" 8 ", " 4 "]], tp2
study = text.split("### Scaling study: every configuration measured")[1].split("\n### ")[0]
header = [c.strip() for c in study.split("\n| Run")[1].split("\n")[0].split("|")]
rows = [dict(zip(["Run"] + header[1:], [c.strip() for c in l.strip("|").split("|")]))
        for l in study.splitlines() if l.startswith("| ") and not l.startswith(("| Run", "| ---"))]
for r in rows:
    ranks = r["Ranks (tp x dp)"]
    dp = int(ranks.split()[-1].rstrip(")")) if "x" in ranks else int(ranks)
    want = "-" if dp == 1 else f"collectives-np{dp}: {dp} ranks, 1 node"
    # (then, where the gradients' buffer is beyond COMM_SIZES, "; its all-reduce of ... beyond the measured sizes")
    assert r["Predicted from (collectives' run: ranks, nodes)"].split(";")[0] == want, r
assert "needs bucketed runs" not in text, "a ddp table without the collectives' run the job measured"
PY
[ ! -e "$tmp/scaling/weak-np4" ] || fail "scaling.sh ran weak-np4, the same configuration as strong-np4"
[ -f "$tmp/scaling/collectives-np2/rank00001.h5" ] && [ -f "$tmp/scaling/collectives-np4/rank00003.h5" ] &&
  [ ! -e "$tmp/scaling/collectives-np1" ] || fail "scaling.sh: not the collectives at 2 and 4 ranks alone: $(ls "$tmp/scaling")"
echo "ok   scaling.sh TP=1,2: a tensor-parallel series from one GPU to 2 and 4 ranks beside the data-parallel one,"
echo "     predictions from the collectives at 2 and 4 ranks"

# 3d. What env.sh checks before any run: an OUT that holds files (the report reads everything
# under it), a switch that is neither 0 nor 1, a HEAT_S that is not seconds, TORCH=1 where
# PyTorch is not; and two jobs of one
# name and Slurm job id (bash jobs inside one allocation) get folders of their own.
refused() {  # words, then the job's environment and script
  local words=$1; shift
  set +e
  env "$@" >"$tmp/refused.log" 2>&1
  local rc=$?
  set -e
  [ $rc -eq 2 ] && grep -qF -- "$words" "$tmp/refused.log" || { cat "$tmp/refused.log"; fail "$*: exit $rc"; }
}
mkdir -p "$tmp/taken" && touch "$tmp/taken/old.h5"
refused "OUT=$tmp/taken already holds files" OUT="$tmp/taken" bash "$ROOT/jobs/warmup.sh"
[ "$(ls "$tmp/taken")" = old.h5 ] || fail "a refused OUT was written to"
refused "TORCH must be 1 (on) or 0 (off), not 'yes'" TORCH=yes OUT_ROOT="$tmp/flags" bash "$ROOT/jobs/bench.sh"
refused "ADAMW_IN_BACKWARD must be 1 (on) or 0 (off), not 'yes'" ADAMW_IN_BACKWARD=yes OUT_ROOT="$tmp/flags" \
  bash "$ROOT/jobs/mixed_precision.sh"
refused "COMM must be 1 (on) or 0 (off), not 'true'" COMM=true OUT_ROOT="$tmp/flags" bash "$ROOT/jobs/ddp_bucketed.sh"
refused "HEAT_S must be a number of seconds >= 0, not '30s'" HEAT_S=30s OUT_ROOT="$tmp/flags" bash "$ROOT/jobs/scaling.sh"
# GPUs heat each configuration for 10 s by default, CPUs not; auto is the CPU where nvidia-smi
# lists no GPU, which the job says.
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU') || true
for device in auto cuda cpu; do
  heat=$(DEVICE=$device OUT_ROOT="$tmp/flags" bash -c "source '$ROOT/jobs/env.sh' && echo \$HEAT_S" 2>"$tmp/said")
  on_cpu=$([ $device = cpu ] || { [ $device = auto ] && [ "$gpus" = 0 ]; } && echo 1 || echo 0)
  [ "$heat" = "$([ "$on_cpu" = 1 ] && echo 0 || echo 10)" ] || fail "DEVICE=$device: HEAT_S defaults to '$heat'"
  if [ $device = auto ] && [ "$gpus" = 0 ]; then
    grep -q "no GPU here (nvidia-smi lists none): --device auto runs on the CPU" "$tmp/said" ||
      fail "DEVICE=auto without a GPU: the job does not say it runs on the CPU ($(cat "$tmp/said"))"
  elif [ -s "$tmp/said" ]; then
    fail "DEVICE=$device: env.sh said '$(cat "$tmp/said")'"
  fi
done
mkdir -p "$tmp/no-torch" && echo 'raise ImportError("not here")' >"$tmp/no-torch/torch.py"  # whether or not it is installed
refused "TORCH=1 needs PyTorch in" TORCH=1 PYTHONPATH="$tmp/no-torch" OUT_ROOT="$tmp/flags" bash "$ROOT/jobs/bench.sh"
[ ! -e "$tmp/flags" ] || { find "$tmp/flags"; fail "a refused switch wrote results"; }
# train.sh whose llmhpc refuses its data: llmhpc's exit code and message, no report of nothing.
refused "cannot open" DATA="$tmp/nope.bin" MODEL=tiny OUT_ROOT="$tmp/flags" bash "$ROOT/jobs/train.sh"
! grep -q "report.py" "$tmp/refused.log" || { cat "$tmp/refused.log"; fail "train.sh reported a run that did not start"; }
refused "trains one model: MODEL=tiny, not MODELS" DATA="$tmp/nope.bin" MODELS=tiny OUT_ROOT="$tmp/flags" \
  bash "$ROOT/jobs/train.sh"
for k in 1 2; do
  SLURM_JOB_ID=42 OUT_ROOT="$tmp/same-id" MODELS=tiny CONTEXTS=16 PRECISIONS=fp32 WARMUP=0 STEPS=1 EXTRA_ARGS="$SHAPE" \
    bash "$ROOT/jobs/bench.sh" >"$tmp/same-id.log" 2>&1 || { cat "$tmp/same-id.log"; fail "bench.sh with SLURM_JOB_ID=42 ($k)"; }
done
[ "$(ls "$tmp/same-id" | tr '\n' ' ')" = "bench-42 bench-42-1 " ] || { ls "$tmp/same-id"; fail "two jobs of one id shared a folder"; }
echo "ok   env.sh refuses an OUT with files, a switch not 0/1, HEAT_S not seconds, TORCH=1 without PyTorch; one id, two folders; train.sh's refusals"

# 4. The other jobs on the shared env.sh: bench.sh and comm.sh as before (folders bench-<time>, comm-<time>).
OUT_ROOT=$tmp/others MODELS=tiny PRECISIONS=fp32 EXTRA_ARGS="$SHAPE" bash "$ROOT/jobs/bench.sh" >"$tmp/bench.log" 2>&1 ||
  { cat "$tmp/bench.log"; fail "jobs/bench.sh exited non-zero"; }
ls "$tmp"/others/bench-*/rank00001.h5 >/dev/null 2>&1 || { ls -R "$tmp/others"; fail "bench.sh left no results/bench-<time> with 2 ranks"; }
grep -q "^| d32_ff64_L2_H4 | 32 | 64 | 2 | 4 |" "$tmp/bench.log" || { cat "$tmp/bench.log"; fail "bench.sh printed no table"; }
# AdamW timed apart by default (the reference tables' Bwd and Opt), inside backward with
# ADAMW_IN_BACKWARD=1, and no --separate-optimizer for a forward alone (llmhpc would refuse it).
grep -q "| Bwd Mean (ms) | Bwd Std (ms) | Opt Mean (ms) |" "$tmp/bench.log" && ! grep -q "Bwd+AdamW" "$tmp/bench.log" ||
  { cat "$tmp/bench.log"; fail "bench.sh does not time AdamW as its own phase by default"; }
OUT_ROOT=$tmp/others MODELS=tiny PRECISIONS=fp32 ADAMW_IN_BACKWARD=1 EXTRA_ARGS="$SHAPE" bash "$ROOT/jobs/bench.sh" \
  >"$tmp/bench-inside.log" 2>&1 || { cat "$tmp/bench-inside.log"; fail "bench.sh ADAMW_IN_BACKWARD=1 exited non-zero"; }
grep -q "| Bwd+AdamW Mean (ms) |" "$tmp/bench-inside.log" && ! grep -q "| Opt Mean (ms) |" "$tmp/bench-inside.log" ||
  { cat "$tmp/bench-inside.log"; fail "bench.sh ADAMW_IN_BACKWARD=1: AdamW not inside backward"; }
OUT_ROOT=$tmp/others MODELS=tiny PRECISIONS=fp32 PHASE=forward EXTRA_ARGS="$SHAPE" bash "$ROOT/jobs/bench.sh" \
  >"$tmp/bench-forward.log" 2>&1 || { cat "$tmp/bench-forward.log"; fail "bench.sh PHASE=forward exited non-zero"; }
OUT_ROOT=$tmp/others RANKS=2 BACKENDS=mpi SIZES=4KB DTYPE=float bash "$ROOT/jobs/comm.sh" >"$tmp/comm.log" 2>&1 ||
  { cat "$tmp/comm.log"; fail "jobs/comm.sh exited non-zero"; }
grep -q "^| mpi | 2 | allreduce | 4000 |" "$tmp"/others/comm-*/comm.md || { cat "$tmp/comm.log"; fail "comm.sh wrote no comm.md row"; }
echo "ok   bench.sh (AdamW apart by default, inside backward with ADAMW_IN_BACKWARD=1, PHASE=forward) and comm.sh"
echo "PASS"
