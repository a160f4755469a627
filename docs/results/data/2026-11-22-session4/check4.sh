#!/bin/bash
# Session 4: dQ kernel variants at head dim 128: ch2 (chunk heuristic), q64 (64-key tiles), qf (Q, dO fragments in registers).
set -u
C=carry/s4; B=/tmp/s4v; rm -rf $B; mkdir -p $B; tar xJf $C/v.txz -C $B
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1 OMP_NUM_THREADS=16
R=/tmp/s4e; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
timeout 150 $B/test_flash_attn_qf > $R/t_flash.log 2>&1; echo "qf test_flash_attn rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)|FAILED" $R/t_flash.log | head
for v in ch2 q64 qf; do
  timeout 100 $B/llmhpc_$v --mode attention --device cuda --batch 1 --heads 1 --head-dim 32,64,128 --seq 4096,8192,16384,32768,65536 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/c_$v > $R/c_$v.log 2>&1; echo "causal $v rc $? $(el)"
  timeout 60 $B/llmhpc_$v --mode attention --device cuda --batch 8 --heads 1 --head-dim 64,128 --seq 4096,16384 --causal off --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/n_$v > $R/n_$v.log 2>&1
  timeout 60 $B/llmhpc_$v --mode attention --device cuda --batch 1 --heads 1 --head-dim 64,128 --seq 16384 --causal off --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/n1_$v > $R/n1_$v.log 2>&1
  for hd in "16 64" "32 80"; do read -r h d <<<"$hd"; timeout 30 $B/llmhpc_$v --mode attention --device cuda --batch 4 --heads $h --head-dim $d --seq 1024 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/m${h}_$v >> $R/m_$v.log 2>&1; done
done
timeout 90 python3 analysis/torch_attention.py --batch 1 --heads 1 --head-dim 32,64,128 --seq 4096,8192,16384,32768,65536 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/torch_c.json > $R/torch.log 2>&1; echo "torch rc $? $(el)"
timeout 60 python3 analysis/torch_attention.py --batch 8 --heads 1 --head-dim 64,128 --seq 4096,16384 --precision bf16 --impl fused --warmup 3 --iters 10 --out $R/torch_n.json >> $R/torch.log 2>&1
timeout 60 python3 analysis/torch_attention.py --batch 1 --heads 1 --head-dim 64,128 --seq 16384 --precision bf16 --impl fused --warmup 3 --iters 10 --out $R/torch_n1.json >> $R/torch.log 2>&1
for hd in "16 64" "32 80"; do read -r h d <<<"$hd"; timeout 30 python3 analysis/torch_attention.py --batch 4 --heads $h --head-dim $d --seq 1024 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/torch_m$h.json >> $R/torch.log 2>&1; done
for v in ch2 q64 qf; do
  echo "== $v"; python3 analysis/attention.py $R/c_$v --torch $R/torch_c.json 2>&1 | grep -A 30 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f6-13
  python3 analysis/attention.py $R/n_$v --torch $R/torch_n.json 2>&1 | grep -A 10 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f3-13
  python3 analysis/attention.py $R/n1_$v --torch $R/torch_n1.json 2>&1 | grep -A 10 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f3-13
  for h in 16 32; do python3 analysis/attention.py $R/m${h}_$v --torch $R/torch_m$h.json 2>&1 | grep -A 5 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f4-13; done
done
tar czf $OUT/runs.tgz -C $R . ; echo "done $(el)"
