#!/bin/bash
# Session 4 call 1 (H100): main's CUDA tests; helper/bwd-128key's tests; split vs fused128 bf16 backward timed with PyTorch.
set -u
C=carry/s4; B=/tmp/s4b; rm -rf $B; mkdir -p $B; tar xJf $C/bins.txz -C $B
export LD_LIBRARY_PATH=$PWD/$C/fallback OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
R=/tmp/s4r; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; date -u
for t in test_cuda_device test_cuda_ops test_cuda_model test_flash_attn; do timeout 200 $B/main/$t > $R/main_$t.log 2>&1; echo "main $t rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)" $R/main_$t.log; done
timeout 150 $B/f128/test_flash_attn --gtest_repeat=2 > $R/f128_test_flash_attn.log 2>&1; echo "f128 test_flash_attn x2 rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)|FAILED" $R/f128_test_flash_attn.log | head
SEQ=1024,2048,4096,8192,16384,32768,65536
for v in split fused128; do
  LLMHPC_FLASH_BWD_TC=$v timeout 90 $B/f128/llmhpc --mode attention --device cuda --batch 1 --heads 1 --head-dim 64,128 --seq $SEQ --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/c_$v > $R/c_$v.log 2>&1; echo "causal $v rc $? $(el)"
  LLMHPC_FLASH_BWD_TC=$v timeout 60 $B/f128/llmhpc --mode attention --device cuda --batch 8 --heads 1 --head-dim 64,128 --seq 4096,16384 --causal off --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/n_$v > $R/n_$v.log 2>&1; echo "noncausal $v rc $? $(el)"
  for hd in "16 64" "32 80"; do read -r h d <<<"$hd"; LLMHPC_FLASH_BWD_TC=$v timeout 30 $B/f128/llmhpc --mode attention --device cuda --batch 4 --heads $h --head-dim $d --seq 1024 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/m${h}_$v >> $R/m_$v.log 2>&1; done; echo "model shapes $v $(el)"
done
timeout 60 python3 analysis/torch_attention.py --batch 1 --heads 1 --head-dim 64,128 --seq $SEQ --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/torch_c.json > $R/torch.log 2>&1; echo "torch causal rc $? $(el)"
timeout 60 python3 analysis/torch_attention.py --batch 8 --heads 1 --head-dim 64,128 --seq 4096,16384 --precision bf16 --impl fused --warmup 3 --iters 10 --out $R/torch_n.json >> $R/torch.log 2>&1; echo "torch noncausal rc $? $(el)"
for hd in "16 64" "32 80"; do read -r h d <<<"$hd"; timeout 30 python3 analysis/torch_attention.py --batch 4 --heads $h --head-dim $d --seq 1024 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/torch_m$h.json >> $R/torch.log 2>&1; done
for v in split fused128; do
  echo "== $v causal"; python3 analysis/attention.py $R/c_$v --torch $R/torch_c.json 2>&1 | grep -A 20 "vs PyTorch"
  echo "== $v noncausal B8"; python3 analysis/attention.py $R/n_$v --torch $R/torch_n.json 2>&1 | grep -A 10 "vs PyTorch"
  for h in 16 32; do echo "== $v model H$h"; python3 analysis/attention.py $R/m${h}_$v --torch $R/torch_m$h.json 2>&1 | grep -A 5 "vs PyTorch"; done
done
timeout 120 compute-sanitizer --tool memcheck $B/f128/test_flash_attn --gtest_filter='*Fused128*' > $R/sanitizer.log 2>&1; echo "memcheck fused128 rc $? $(el)"; tail -3 $R/sanitizer.log
tar czf $OUT/runs.tgz -C $R . ; echo "done $(el)"
