#!/bin/bash
# fused128 diagnostic: dQ hand-off ordered (0), unordered atomics (1), none (2); split for reference.
set -u
C=carry/s4
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
L=$C/diag/llmhpc
run() { # tag env...
  local tag=$1; shift
  env "$@" timeout 60 $L --mode attention --device cuda --batch 1 --heads 1 --head-dim 64,128 --seq 4096,16384,65536 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out /tmp/d_$tag > /tmp/d_$tag.log 2>&1
  env "$@" timeout 60 $L --mode attention --device cuda --batch 8 --heads 1 --head-dim 64,128 --seq 16384 --causal off --impl flash --precision bf16 --warmup 2 --iters 5 --out /tmp/dn_$tag > /tmp/dn_$tag.log 2>&1
  echo "== $tag"; python3 analysis/attention.py /tmp/d_$tag /tmp/dn_$tag 2>&1 | grep -E "^\| (64|128) \|" | cut -d'|' -f2,3,5,7
}
run split LLMHPC_FLASH_BWD_TC=split
for m in 0 1 2; do run f128_$m LLMHPC_FLASH_BWD_TC=fused128 LLMHPC_FLASH_DQ_DEBUG=$m; done
