#!/bin/bash
# Session 3 final check, part A (H100 or H200): CUDA tests; bf16 attention vs PyTorch fused
# (grid 2 shapes + model-shaped); 2.7B bf16 ctx1024 memory run (default and --low-memory).
set -u
C=carry/final3
export LD_LIBRARY_PATH=$PWD/$C/fallback OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
R=/tmp/final3; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u; git log --oneline -1 2>/dev/null
for t in test_cuda_device test_cuda_ops test_cuda_model; do timeout 200 $C/$t > $OUT/tests_$t.log 2>&1; echo "$t rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)" $OUT/tests_$t.log; done
timeout 120 $C/test_flash_attn --gtest_repeat=2 > $OUT/tests_test_flash_attn.log 2>&1; echo "test_flash_attn x2 rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)" $OUT/tests_test_flash_attn.log
[ "${TESTS_ONLY:-0}" = 1 ] && exit 0
timeout 60 $C/llmhpc --mode attention --device cuda --batch 1 --heads 1 --head-dim 16,32,64,128 --seq 128,256,512,1024,2048,4096,8192,16384,32768,65536 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/grid2_bf16 > $R/attn.log 2>&1; echo "grid2 bf16 rc $? $(el)"
for hd in "16 64" "32 80"; do read -r h d <<<"$hd"; timeout 30 $C/llmhpc --mode attention --device cuda --batch 4 --heads $h --head-dim $d --seq 1024 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/model_h$h >> $R/attn2.log 2>&1; echo "model shape H$h d$d rc $? $(el)"; done
timeout 60 python3 analysis/torch_attention.py --batch 1 --heads 1 --head-dim 16,32,64,128 --seq 128,256,512,1024,2048,4096,8192,16384,32768,65536 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $OUT/torch_attention.json > $R/torch.log 2>&1; echo "torch rc $? $(el)"
for hd in "16 64" "32 80"; do read -r h d <<<"$hd"; timeout 30 python3 analysis/torch_attention.py --batch 4 --heads $h --head-dim $d --seq 1024 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/torch_model_h$h.json >> $R/torch.log 2>&1; done
python3 analysis/attention.py $R/grid2_bf16 --torch $OUT/torch_attention.json > $OUT/attention.md 2>&1; grep -A 30 "vs PyTorch" $OUT/attention.md | head -50
grep -A3 -i summary $R/attn2.log; tail -3 $R/torch.log
for lm in "" "--low-memory"; do
  timeout 120 $C/llmhpc --mode bench --device cuda --model 2.7B --context-length 1024 --batch-size 4 --precision bf16 --attention flash --phase train-step --warmup 2 --steps 5 $lm --out $R/m27$lm > $R/m27.log 2>&1
  echo "2.7B ctx1024 $lm rc $? $(el)"; sed -n '/bench summary/,$p' $R/m27.log | tail -1 | cut -c1-170
  python3 -c "
import sys; sys.path.insert(0, 'analysis')
from llmhpc_h5 import open_run
for r in open_run('$R/m27$lm').records('bench'): print('  peak %.2f GiB' % (r.attrs['peak_memory_bytes'] / 2**30))"
done
cp $R/*.log $R/ 2>/dev/null; tar czf $OUT/runs_a.tgz -C $R . ; echo "done $(el)"
