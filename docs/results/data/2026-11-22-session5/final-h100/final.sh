#!/bin/bash
# Session 5 final (H100): CUDA tests twice, attention_check (both grids, PyTorch for both, model, 2.7B), 2.7B --low-memory.
set -u
C=carry/flash
export LD_LIBRARY_PATH=$PWD/$C/fallback OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u
L=$OUT/tests; mkdir -p $L
for t in test_cuda_device test_cuda_ops test_cuda_model; do timeout 200 $C/$t > $L/$t.log 2>&1; echo "$t rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)" $L/$t.log; done
timeout 200 $C/test_flash_attn --gtest_repeat=2 > $L/test_flash_attn.log 2>&1; echo "test_flash_attn x2 rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)" $L/test_flash_attn.log
[ "${TESTS_ONLY:-0}" = 1 ] && { tar czf $OUT/tests.tgz -C $OUT tests; rm -rf $L; exit 0; }
MODEL_2P7B=1 bash scripts/gpu/attention_check.sh $C $OUT/ac > /dev/null 2>&1; echo "attention_check rc $? $(el)"
grep -E "exit|peak|2.7B" $OUT/ac/summary.txt | head -30
timeout 120 $C/llmhpc --mode bench --device cuda --model 2.7B --context-length 1024 --batch-size 4 --precision bf16 --attention flash --phase train-step --warmup 2 --steps 5 --low-memory --out /tmp/m27lm > /tmp/m27lm.log 2>&1
echo "2.7B --low-memory rc $? $(el)"; sed -n '/bench summary/,$p' /tmp/m27lm.log | tail -1 | cut -c1-170
python3 -c "
import sys; sys.path.insert(0, 'analysis')
from llmhpc_h5 import open_run
for r in open_run('/tmp/m27lm').records('bench'): print('  peak %.2f GiB' % (r.attrs['peak_memory_bytes'] / 2**30))"
cp $OUT/ac/attention.md $OUT/attention.md; tar czf $OUT/final.tgz -C $OUT tests ac; rm -rf $L $OUT/ac; echo "done $(el)"
