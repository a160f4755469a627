# Shared settings for the job scripts in jobs/, sourced by each. Every value can be
# overridden from the environment (LLMHPC_BIN=/path/llmhpc sbatch jobs/bench.sh):
#   LLMHPC_ROOT  the repository (found by the job: see below)
#   LLMHPC_BIN   the binary (default $LLMHPC_ROOT/build/llmhpc)
#   NP           ranks, at least 1 (default: Slurm's task count in an allocation, else the job's own default, else 1)
#   DEVICE       auto | cpu | cuda, passed as --device (auto where nvidia-smi lists no GPU: the
#                job says at its start that it runs on the CPU, where its default sizes, chosen
#                for GPUs, take long)
#   OUT_ROOT     where results go (default $LLMHPC_ROOT/results)
#   OUT          this job's results folder (default $OUT_ROOT/<job name>-<Slurm job id, or the time>,
#                with -1, -2, ... where that is taken); one that already holds files is refused,
#                since the job's report reads everything under its OUT
#   JOB_NAME     the job name in OUT (default Slurm's under sbatch, else the script's file name
#                without .sh)
#   EXTRA_ARGS   appended to the command line of the job's own llmhpc runs (e.g. a custom shape,
#                over one preset: MODELS=small EXTRA_ARGS="--d-model 64 ..."; shape options change
#                one model, so a list of presets refuses them); not to the all-reduce runs (--mode
#                comm) of ddp_bucketed.sh and scaling.sh, since mode comm refuses model and ddp
#                options. Being last, they override the job's own values: llmhpc takes an option
#                given twice at its last value (a list option's last list), so
#                EXTRA_ARGS="--warmup 1 --steps 2" runs 1 warm-up and 2 timed steps whatever the
#                job's WARMUP and STEPS
#   HEAT_S       seconds of untimed steps before each configuration that the bench and ddp
#                jobs time (llmhpc --heat-s): a power-capped GPU clocks lower as it warms, and its
#                clock swings for a few seconds after the pause in which a configuration is built,
#                which would favour the first configuration and blur the others (default 10; 0
#                on the CPU; it needs the job's WARMUP of 1 or more: with WARMUP=0 set
#                HEAT_S=0 too)
#   PYTHON       the Python that runs analysis/ (default python3)
#   MPIRUN       the MPI launcher (default mpirun; "srun --mpi=pmix" where Slurm has PMIx)
#   MPIRUN_ARGS  its options (default for mpirun: --bind-to none; Open MPI binds each of at most
#                2 ranks to one core, and a rank's host-side work, such as the CPU backend's
#                ops, then runs on that core alone)
#   LAUNCH       the whole launch prefix of llmhpc (default "$MPIRUN $MPIRUN_ARGS $NP_OPTION $NP",
#                NP_OPTION being srun's -n or mpirun's -np); comm.sh and scaling.sh start each rank
#                count N as $MPIRUN $MPIRUN_ARGS $NP_OPTION N instead
# What a job sweeps (MODELS, CONTEXTS, PRECISIONS, STEPS, ...) is the job's own: its header lists
# those variables and their defaults, and this file reads none of them.
# Nothing is written outside OUT; nothing in a home directory. A job that fails leaves no empty
# folder or file behind (tidy_failed_out, below).
#
# What a job calls (a new job, e.g. for a new mode, needs only these):
#   llmhpc_run ARGS...   $LAUNCH $LLMHPC_BIN --device $DEVICE ARGS... $EXTRA_ARGS
#   llmhpc_start ARGS... the same in the background, the launcher's pid in LLMHPC_PID
#   job_report           analysis/report.py over $OUT: $OUT/report.md and its PNGs beside the
#                        results (sections chosen by the modes found), printed to the job's log
#   rank_counts          1, 2, 4, ... up to NP, and NP: the default rank counts of sweeps
#   require_numbers N M  exit 2 unless $N is a list of whole numbers >= M (checked before any run)
#   require_flag N       exit 2 unless $N is 0 or 1 (the jobs' switches: TORCH, COMM, SNAPSHOT, ...)
#   require_torch [torchrun]  exit 2 unless $PYTHON imports torch (and, given, torchrun is there)
#
# GPUs: every job asks Slurm for one GPU per task (#SBATCH --gpus-per-task=1). On a cluster
# without GPUs: sbatch --gpus-per-task=0 jobs/X.sh (or SBATCH_GPUS_PER_TASK=0) with DEVICE=cpu.
#
# Finding the repository: under sbatch a job runs from a copy in Slurm's spool directory, so
# its own directory is not the repository. Each job therefore looks for jobs/env.sh in
# $LLMHPC_ROOT, then $SLURM_SUBMIT_DIR (and its parent, for a submission from jobs/), then
# beside itself, and sources the first it finds; that is this file, which takes the root from
# its own path.
# A job takes its settings from the environment, not from arguments: --help prints the job's
# header (what it runs, its variables and their defaults); any other argument is refused rather
# than ignored (the job would start its default sweep).
if [ $# -gt 0 ]; then
  case $1 in
    -h | --help)
      sed -n '2,/^[^#]/{/^#SBATCH/d;/^#/!d;s/^# \{0,1\}//;p}' "$0"
      echo "Every job also reads jobs/env.sh's variables (NP, DEVICE, OUT, EXTRA_ARGS, MPIRUN, ...): see its header."
      exit 0
      ;;
    *)
      echo "$0: a job takes no arguments, not '$*': its settings are environment variables (NP=2 bash $0; $0 --help lists them)" >&2
      exit 2
      ;;
  esac
fi
if [ -n "${LLMHPC_ROOT:-}" ] && [ ! -f "$LLMHPC_ROOT/jobs/env.sh" ]; then
  echo "jobs/env.sh: LLMHPC_ROOT=$LLMHPC_ROOT is not an llmhpc repository (no jobs/env.sh in it)" >&2
  exit 2
fi
LLMHPC_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LLMHPC_BIN=${LLMHPC_BIN:-$LLMHPC_ROOT/build/llmhpc}
if [ ! -f "$LLMHPC_BIN" ] || [ ! -x "$LLMHPC_BIN" ]; then
  echo "jobs/env.sh: no llmhpc binary at $LLMHPC_BIN: build it first (make build, in $LLMHPC_ROOT) or set LLMHPC_BIN" >&2
  exit 2
fi
stamp() { date +%Y%m%d-%H%M%S; }
# The job's name: Slurm's for the copy sbatch runs (slurm_script), else the script's own.
if [ "$(basename "$0")" = slurm_script ] && [ -n "${SLURM_JOB_NAME:-}" ]; then JOB_NAME=${JOB_NAME:-$SLURM_JOB_NAME}; fi
JOB_NAME=${JOB_NAME:-$(basename "$0" .sh)}
OUT_ROOT=${OUT_ROOT:-$LLMHPC_ROOT/results}
if [ -z "${OUT:-}" ]; then  # unique: two jobs in one second, or in one allocation, get their own
  OUT=$OUT_ROOT/$JOB_NAME-${SLURM_JOB_ID:-$(stamp)}
  out_base=$OUT taken=0
  while [ -e "$OUT" ]; do taken=$((taken + 1)) && OUT=$out_base-$taken; done
elif [ -e "$OUT" ] && [ -n "$(ls -A "$OUT" 2>/dev/null)" ]; then
  echo "jobs/env.sh: OUT=$OUT already holds files: give a new folder (the job's report reads everything under OUT)" >&2
  exit 2
fi
PYTHON=${PYTHON:-python3}
command -v "$PYTHON" >/dev/null || { echo "jobs/env.sh: PYTHON=$PYTHON: no such program (analysis/ needs Python 3)" >&2; exit 2; }
DEVICE=${DEVICE:-auto}
# auto on a host whose nvidia-smi lists no GPU is llmhpc on the CPU: said at the start, since the
# jobs' default sizes are a GPU's (bench.sh's reach 2.7B), and heating a CPU gains nothing.
on_cpu=$([ "$DEVICE" = cpu ] && echo 1 || echo 0)
if [ "$DEVICE" = auto ] && [ "$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')" = 0 ]; then
  on_cpu=1
  echo "$(basename "$0"): no GPU here (nvidia-smi lists none): --device auto runs on the CPU, where the default" \
    "sizes, chosen for GPUs, take long; give DEVICE=cpu and small sizes (the header's CPU example) to mean it" >&2
fi
HEAT_S=${HEAT_S:-$([ "$on_cpu" = 1 ] && echo 0 || echo 10)}
[[ "$HEAT_S" =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "jobs/env.sh: HEAT_S must be a number of seconds >= 0, not '$HEAT_S'" >&2; exit 2; }
NP=${NP:-${SLURM_NTASKS:-1}}
# (mpirun -np 0 would start a rank on every slot it finds)
[[ "$NP" =~ ^[1-9][0-9]*$ ]] || { echo "jobs/env.sh: NP must be a whole number of ranks, at least 1, not '$NP'" >&2; exit 2; }
# mpirun inside a Slurm allocation too: Open MPI reads the allocation, whereas srun starts MPI
# ranks as one job only where Slurm was built with PMIx (then MPIRUN="srun --mpi=pmix" works).
MPIRUN=${MPIRUN:-mpirun}
if [ -z "${MPIRUN_ARGS+set}" ]; then  # mpirun's own option; srun and others get none
  case $(basename "${MPIRUN%% *}") in mpirun | mpiexec | orterun) MPIRUN_ARGS="--bind-to none" ;; *) MPIRUN_ARGS="" ;; esac
fi
case $(basename "${MPIRUN%% *}") in srun) NP_OPTION=-n ;; *) NP_OPTION=-np ;; esac  # the rank count's option
LAUNCH=${LAUNCH:-$MPIRUN $MPIRUN_ARGS $NP_OPTION $NP}
# Never let NCCL use NVLink multicast (NVLS); it can take a shared host's GPUs down.
export NCCL_NVLS_ENABLE=0
export OMPI_ALLOW_RUN_AS_ROOT=${OMPI_ALLOW_RUN_AS_ROOT:-1} OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=${OMPI_ALLOW_RUN_AS_ROOT_CONFIRM:-1}

# A job that fails (bad input, a run that did not start) leaves no empty results folder and no
# empty file in it (tee's, of a run that printed nothing); what finished stays, to be looked at,
# and the job says how to report it. Only a folder this job made: one that was there before is
# left as it is.
if [ ! -e "$OUT" ]; then
  tidy_failed_out() {
    local rc=$?
    if [ "$rc" -ne 0 ] && [ -d "$OUT" ]; then
      find "$OUT" -type f -empty -delete
      find "$OUT" -depth -type d -empty -delete
      if [ -n "$(find "$OUT" -name 'rank*.h5' -print -quit 2>/dev/null)" ]; then
        echo "$0: failed (exit $rc); what finished is in $OUT: $PYTHON $LLMHPC_ROOT/analysis/report.py $OUT reports it" >&2
      fi
    fi
    return "$rc"
  }
  trap tidy_failed_out EXIT
fi

llmhpc_run() { $LAUNCH "$LLMHPC_BIN" --device "$DEVICE" "$@" ${EXTRA_ARGS:-}; }
# The same in the background, the launcher's own pid in LLMHPC_PID (a simple command, so no
# subshell stands between): for a job that hands signals to it (train.sh).
llmhpc_start() {
  $LAUNCH "$LLMHPC_BIN" --device "$DEVICE" "$@" ${EXTRA_ARGS:-} &
  LLMHPC_PID=$!
}
job_report() { "$PYTHON" "$LLMHPC_ROOT/analysis/report.py" "$OUT" -o "$OUT/report.md"; }
# Exits 2 with a message unless variable NAME is a comma-separated list of whole numbers of at
# least MIN: a job checks its loops' lists before the first run, not when a loop reaches the bad item.
require_numbers() {  # NAME MIN
  local name=$1 min=$2 value=${!1} ok=1 n
  [[ "$value" =~ ^[0-9]+(,[0-9]+)*$ ]] || ok=0
  if [ "$ok" = 1 ]; then for n in ${value//,/ }; do [ $((10#$n)) -ge "$min" ] || ok=0; done; fi
  [ "$ok" = 1 ] || { echo "$0: $name must be whole numbers of at least $min, comma-separated, not '$value'" >&2; exit 2; }
}
require_flag() {  # NAME
  [[ "${!1}" =~ ^[01]$ ]] || { echo "$0: $1 must be 1 (on) or 0 (off), not '${!1}'" >&2; exit 2; }
}
require_torch() {  # [TORCHRUN command]: PyTorch, and its launcher where the job uses one
  "$PYTHON" -c "import torch" 2>/dev/null ||
    { echo "$0: TORCH=1 needs PyTorch in $PYTHON (pip install torch), or TORCH=0" >&2; exit 2; }
  if [ -n "${1:-}" ] && ! command -v "${1%% *}" >/dev/null; then
    echo "$0: TORCH=1 runs PyTorch with '$1', which is not there (TORCHRUN=...), or TORCH=0" >&2
    exit 2
  fi
}
rank_counts() {
  local n=1 list=""
  while [ "$n" -lt "$NP" ]; do list+="$n,"; n=$((n * 2)); done
  echo "$list$NP"
}
