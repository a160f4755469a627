#!/bin/bash
# EXPERIMENT (branch exp/dkdv-split): head dim 128 dK/dV as two kernels with two m tiles (dV: S^T, P^T dO; dK: S^T, dP^T, dS^T Q).
set -u
C=carry/exp
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1
R=/tmp/exp; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log.txt") 2>&1
LLMHPC_EXP_SPLITKV=1 LLMHPC_FLASH_BWD_CHUNK=off timeout 120 $C/test_flash_attn --gtest_filter='-*Chunked*' > $R/t.log 2>&1; echo "tests (split dK/dV at d128, chunks off) rc $?"; grep -E "^\[  (PASSED|FAILED)|FAILED" $R/t.log | head
for v in base split; do
  E=""; [ $v = split ] && E="LLMHPC_EXP_SPLITKV=1"
  env $E timeout 60 $C/llmhpc --mode attention --device cuda --batch 1 --heads 1 --head-dim 128 --seq 32768,65536 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/c_$v > /dev/null 2>&1
  env $E LLMHPC_FLASH_BWD_CHUNK=off timeout 60 $C/llmhpc --mode attention --device cuda --batch 1 --heads 1 --head-dim 128 --seq 16384,32768 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/co_$v > /dev/null 2>&1
  env $E timeout 60 $C/llmhpc --mode attention --device cuda --batch 8 --heads 1 --head-dim 128 --seq 4096,16384 --causal off --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/n_$v > /dev/null 2>&1
  echo "== $v"; for g in c co n; do python3 analysis/attention.py $R/${g}_$v 2>&1 | grep -E "^\| 128 \|" | cut -d'|' -f2-5; done
done
