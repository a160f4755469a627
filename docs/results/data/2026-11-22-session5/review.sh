#!/bin/bash
# Review commit check (H100): CUDA tests x2; bf16 backward, fused and split, with PyTorch in the same call.
set -u
C=carry/flash
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1
R=/tmp/rv; rm -rf $R; mkdir -p $R
TESTS_ONLY=1 bash $C/final.sh > /dev/null 2>&1; echo "tests rc $?"; grep -E "rc|PASSED|FAILED" $OUT/log.txt
A="$C/llmhpc --mode attention --device cuda --impl flash --precision bf16 --warmup 3 --iters 10"
timeout 60 $A --batch 1 --heads 1 --head-dim 64,128 --seq 16384,32768,65536 --causal on --out $R/c > /dev/null 2>&1
timeout 60 $A --batch 8 --heads 1 --head-dim 128 --seq 4096,16384 --causal off --out $R/n > /dev/null 2>&1
timeout 60 python3 analysis/torch_attention.py --batch 1 --heads 1 --head-dim 64,128 --seq 16384,32768,65536 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/tc.json > /dev/null 2>&1
timeout 60 python3 analysis/torch_attention.py --batch 8 --heads 1 --head-dim 128 --seq 4096,16384 --precision bf16 --impl fused --warmup 3 --iters 10 --out $R/tn.json > /dev/null 2>&1
python3 analysis/attention.py $R/c --torch $R/tc.json | grep -A 12 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f3-13 | tee $OUT/review_timing.txt
python3 analysis/attention.py $R/n --torch $R/tn.json | grep -A 12 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f3-13 | tee -a $OUT/review_timing.txt
