#!/bin/bash
# Session 4: the model after the attention changes: bf16 grid (every size x context), 2.7B bf16 ctx512 fwd+bwd,
# same-call torch.compile for xl bf16 1024 (the closest bf16 margin), alternating llmhpc / PyTorch / llmhpc.
set -u
C=carry/flash
export LD_LIBRARY_PATH=$PWD/$C/fallback OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
R=/tmp/s4m; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 200 $C/llmhpc --mode bench --device cuda --model small,medium,large,xl,2.7B --context-length 128,256,512,1024 --precision bf16 --attention flash --out $R/grid_bf16 > $R/grid_bf16.log 2>&1; echo "bf16 grid rc $? $(el)"; sed -n '/bench summary/,$p' $R/grid_bf16.log
timeout 60 $C/llmhpc --mode bench --device cuda --model 2.7B --context-length 512 --precision bf16 --attention flash --phase forward-backward --out $R/m27_fb > $R/m27_fb.log 2>&1; echo "2.7B fwd+bwd rc $? $(el)"; sed -n '/bench summary/,$p' $R/m27_fb.log
tar xzf $C/indcache.tgz -C /tmp && export TORCHINDUCTOR_CACHE_DIR=/tmp/indcache
L() { timeout 60 $C/llmhpc --mode bench --device cuda --model xl --context-length 1024 --precision bf16 --attention flash --out $R/llmhpc_xl_$1 > $R/l.log 2>&1; echo "llmhpc xl bf16 run $1 rc $? $(el)"; grep -E "^xl " $R/l.log; }
L 1
timeout 150 python3 analysis/torch_baseline.py --model xl --context-length 1024 --precision bf16 --setup compiled --out $OUT/torch.jsonl > $R/t.log 2>&1; echo "torch xl bf16 rc $? $(el)"; tail -2 $R/t.log
L 2
tar czf $OUT/runs.tgz -C $R . ; echo "done $(el)"
