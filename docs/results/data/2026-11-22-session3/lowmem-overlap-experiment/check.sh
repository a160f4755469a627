#!/bin/bash
# Session 3: --low-memory with the next layer's bf16 cast on a second stream (overlapped).
set -u
export LD_LIBRARY_PATH=$PWD/carry/lowmem/fallback OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=16
C=carry/lowmem
exec > >(tee -a "$OUT/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
for t in test_cuda_ops test_cuda_model; do timeout 150 $C/$t > $OUT/$t.log 2>&1; echo "$t rc $?"; grep -E "^\[  (PASSED|FAILED)|peak" $OUT/$t.log; done
for m in "xl 1024" "2.7B 1024" "2.7B 512"; do
  read -r model ctx <<<"$m"
  for lm in "" "--low-memory"; do
    timeout 150 $C/llmhpc --mode bench --device cuda --model $model --context-length $ctx --batch-size 4 --precision bf16 --attention flash --phase train-step --warmup 2 --steps 5 $lm --out $OUT/runs/$model-$ctx$lm > $OUT/run.log 2>&1
    echo "$model ctx$ctx $lm rc $?"; sed -n '/bench summary/,$p' $OUT/run.log | tail -1 | cut -c1-170
    python3 -c "
import sys; sys.path.insert(0, 'analysis')
from llmhpc_h5 import open_run
for r in open_run('$OUT/runs/$model-$ctx$lm').records('bench'): print('  peak %.2f GiB' % (r.attrs['peak_memory_bytes'] / 2**30))"
  done
done
tar czf $OUT/runs.tgz -C $OUT runs && rm -rf $OUT/runs $OUT/run.log
