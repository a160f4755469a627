#!/bin/bash
# Fused tensor-core backward (five products, dQ by atomics) vs split, with PyTorch in the same call (H100).
set -u
C=carry/flash
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1
R=/tmp/f1; rm -rf $R; mkdir -p $R
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/log.txt; date -u | tee -a $OUT/log.txt
timeout 150 $C/test_flash_attn > $OUT/tests.log 2>&1; echo "test_flash_attn rc $?" | tee -a $OUT/log.txt; grep -E "PASSED|FAILED|OK \]" $OUT/tests.log | tee -a $OUT/log.txt
A="$C/llmhpc --mode attention --device cuda --impl flash --precision bf16 --warmup 3 --iters 10"
for v in split fused auto; do
  LLMHPC_FLASH_BWD=$v timeout 90 $A --batch 1 --heads 1 --head-dim 64,128 --seq 4096,8192,16384,32768,65536 --causal on --out $R/c_$v > $R/c_$v.log 2>&1; echo "causal $v rc $?" | tee -a $OUT/log.txt
  LLMHPC_FLASH_BWD=$v timeout 60 $A --batch 8 --heads 1 --head-dim 64,128 --seq 4096,8192,16384 --causal off --out $R/n_$v > $R/n_$v.log 2>&1; echo "noncausal $v rc $?" | tee -a $OUT/log.txt
  LLMHPC_FLASH_BWD=$v timeout 60 $A --batch 4 --heads 16 --head-dim 64 --seq 1024,2048 --causal on --out $R/m_$v > $R/m_$v.log 2>&1; echo "model-ish $v rc $?" | tee -a $OUT/log.txt
  LLMHPC_FLASH_BWD=$v timeout 60 $A --batch 4 --heads 8 --head-dim 128 --seq 1024,2048 --causal on --out $R/m128_$v > $R/m128_$v.log 2>&1; echo "model-ish d128 $v rc $?" | tee -a $OUT/log.txt
done
timeout 90 python3 analysis/torch_attention.py --batch 1 --heads 1 --head-dim 64,128 --seq 4096,8192,16384,32768,65536 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/tc.json > $R/tc.log 2>&1; echo "torch c rc $?" | tee -a $OUT/log.txt
timeout 60 python3 analysis/torch_attention.py --batch 8 --heads 1 --head-dim 64,128 --seq 4096,8192,16384 --precision bf16 --impl fused --warmup 3 --iters 10 --out $R/tn.json > $R/tn.log 2>&1; echo "torch n rc $?" | tee -a $OUT/log.txt
timeout 60 python3 analysis/torch_attention.py --batch 4 --heads 16 --head-dim 64 --seq 1024,2048 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/tm.json > $R/tm.log 2>&1
timeout 60 python3 analysis/torch_attention.py --batch 4 --heads 8 --head-dim 128 --seq 1024,2048 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/tm128.json > $R/tm128.log 2>&1
for v in split fused auto; do
  for g in c:tc n:tn m:tm m128:tm128; do
    echo "== $v ${g%%:*}" >> $OUT/timing.txt
    python3 analysis/attention.py $R/${g%%:*}_$v --torch $R/${g##*:}.json 2>&1 | grep -A 14 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f3-13 >> $OUT/timing.txt
  done
done
cat $OUT/timing.txt
cd /tmp && tar czf $OUT/runs.tgz f1
