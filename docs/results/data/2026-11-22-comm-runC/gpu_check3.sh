#!/bin/bash
# Third GPU check of issue 5 (git-ignored carry/comm): the table's time now measured as
# nccl-tests does (operations back to back, marks at the ends, rank average); nccl-tests and
# llmhpc alternating, three times each, at 2 and 4 GPUs; NCCL tests; 8 ranks on 4 GPUs.
set -u
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
C=carry/comm
R=$OUT/runs
mkdir -p "$R"
exec > >(tee -a "$OUT/log.txt") 2>&1
step() { echo; echo "=== $(date -u +%H:%M:%S) $*"; }
step host; date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version --format=csv,noheader | head -1
BIN=$C/llmhpc NT=$C/all_reduce_perf
MPI="mpirun -x NCCL_NVLS_ENABLE=0"
SIZES=1MB,10MB,100MB,1000MB
for np in 2 4; do
  for rep in 1 2 3; do
    step "nccl-tests all_reduce_perf np $np rep $rep"
    timeout 40 $MPI -np $np $NT -b 1000000 -e 1000000000 -f 10 -g 1 -c 0 -w 5 -n 20 | grep -v "^#  Rank"
    step "llmhpc nccl np $np rep $rep"
    timeout 60 $MPI -np $np $BIN --mode comm --size $SIZES --check --out $R/nccl-np$np-r$rep | grep -v "^\["
  done
done
for np in 2 4; do
  step "test_comm np $np"
  timeout 60 $MPI -np $np $C/test_comm --gtest_brief=1 2>&1 | tail -4
done
step "mpirun -np 8 on 4 GPUs (expect a clean error, exit 2)"
timeout 60 mpirun --oversubscribe -np 8 $BIN --mode comm --size 1000MB --out $R/np8; echo "exit $?"
step "llmhpc mpi np 4"
timeout 60 $MPI -np 4 $BIN --mode comm --device cpu --backend mpi --size $SIZES --warmup 2 --iters 5 --check --out $R/mpi-np4 | grep -v "^\["
step tables
python3 analysis/comm.py $R/nccl-np2-r1 $R/nccl-np2-r2 $R/nccl-np2-r3 $R/nccl-np4-r1 $R/nccl-np4-r2 $R/nccl-np4-r3 $R/mpi-np4 > $OUT/comm.md 2>&1
cat $OUT/comm.md
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $R
step done
