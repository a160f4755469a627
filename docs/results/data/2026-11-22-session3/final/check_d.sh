#!/bin/bash
# Session 3, same-call confirmation of the two closest margins: llmhpc (final main) and
# torch.compile + fused attention + fused AdamW, fp32 medium ctx1024 and bf16 xl ctx1024,
# alternating llmhpc / PyTorch / llmhpc.
set -u
C=carry/final3
export LD_LIBRARY_PATH=$PWD/$C/fallback OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
R=/tmp/final3d; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log_d.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
tar xzf $C/indcache.tgz -C /tmp && export TORCHINDUCTOR_CACHE_DIR=/tmp/indcache
L() { timeout 60 $C/llmhpc --mode bench --device cuda --model $1 --context-length 1024 --precision $2 --attention flash --out $R/llmhpc_$1_$2_$3 > $R/l.log 2>&1; echo "llmhpc $1 $2 run $3 rc $? $(el)"; grep -E "^(medium|xl) " $R/l.log; }
P() { timeout 150 python3 analysis/torch_baseline.py --model $1 --context-length 1024 --precision $2 --setup compiled --out $OUT/torch.jsonl > $R/t.log 2>&1; echo "torch $1 $2 rc $? $(el)"; tail -2 $R/t.log; }
L medium fp32 1; L xl bf16 1
P medium fp32
P xl bf16
L medium fp32 2; L xl bf16 2
tar czf $OUT/runs_d.tgz -C $R .
