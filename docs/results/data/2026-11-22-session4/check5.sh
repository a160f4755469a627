#!/bin/bash
# Head dim 64 backward with two m tiles per warp: base vs kv2 (dK/dV 128 keys x 32 queries) vs kv2q2 (+ dQ 128 queries x 32 keys).
set -u
C=carry/v5; B=/tmp/v5; rm -rf $B; mkdir -p $B; tar xJf $C/v.txz -C $B
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1 OMP_NUM_THREADS=16
R=/tmp/v5r; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
timeout 150 $B/test_flash_attn_kv2q2 > $R/t.log 2>&1; echo "kv2q2 test_flash_attn rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)|FAILED" $R/t.log | head
for v in base kv2 kv2q2; do
  timeout 60 $B/llmhpc_$v --mode attention --device cuda --batch 1 --heads 1 --head-dim 64 --seq 4096,8192,16384,32768,65536 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/c_$v > $R/c_$v.log 2>&1
  timeout 60 $B/llmhpc_$v --mode attention --device cuda --batch 8 --heads 1 --head-dim 64 --seq 4096,8192,16384 --causal off --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/n_$v > $R/n_$v.log 2>&1
  timeout 30 $B/llmhpc_$v --mode attention --device cuda --batch 4 --heads 16 --head-dim 64 --seq 1024,2048 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/m_$v > $R/m_$v.log 2>&1
  echo "$v $(el)"
done
timeout 60 python3 analysis/torch_attention.py --batch 1 --heads 1 --head-dim 64 --seq 4096,8192,16384,32768,65536 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/torch_c.json > $R/torch.log 2>&1
timeout 60 python3 analysis/torch_attention.py --batch 8 --heads 1 --head-dim 64 --seq 4096,8192,16384 --precision bf16 --impl fused --warmup 3 --iters 10 --out $R/torch_n.json >> $R/torch.log 2>&1
timeout 60 python3 analysis/torch_attention.py --batch 4 --heads 16 --head-dim 64 --seq 1024,2048 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/torch_m.json >> $R/torch.log 2>&1
for v in base kv2 kv2q2; do echo "== $v"; for g in c n m; do python3 analysis/attention.py $R/${g}_$v --torch $R/torch_$g.json 2>&1 | grep -A 12 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f3-13; done; done
tar czf $OUT/runs.tgz -C $R . ; echo "done $(el)"
