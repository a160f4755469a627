#!/bin/bash
# Session 4: chunked tensor-core backward. Tests; grid with LLMHPC_FLASH_BWD_CHUNK off/auto/N; PyTorch same call; 2.7B step.
set -u
C=carry/s4; B=/tmp/s4b; mkdir -p $B/ch; tar xJf $C/ch.txz -C $B/ch
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1 OMP_NUM_THREADS=16
R=/tmp/s4d; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name --format=csv,noheader; date -u
timeout 200 $B/ch/test_flash_attn --gtest_repeat=2 > $R/t_flash.log 2>&1; echo "test_flash_attn x2 rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)|FAILED|OK \]" $R/t_flash.log | head -20
for t in test_cuda_device test_cuda_ops test_cuda_model; do timeout 120 $B/ch/$t > $R/t_$t.log 2>&1; echo "$t rc $? $(el)"; grep -E "^\[  (PASSED|FAILED)|FAILED" $R/t_$t.log | head -5; done
L=$B/ch/llmhpc
for v in off auto; do
  LLMHPC_FLASH_BWD_CHUNK=$v timeout 100 $L --mode attention --device cuda --batch 1 --heads 1 --head-dim 16,32,64,128 --seq 1024,4096,8192,16384,32768,65536 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/c_$v > $R/c_$v.log 2>&1; echo "causal $v rc $? $(el)"
  LLMHPC_FLASH_BWD_CHUNK=$v timeout 60 $L --mode attention --device cuda --batch 8 --heads 1 --head-dim 64,128 --seq 4096,16384 --causal off --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/n_$v > $R/n_$v.log 2>&1
  LLMHPC_FLASH_BWD_CHUNK=$v timeout 60 $L --mode attention --device cuda --batch 1 --heads 1 --head-dim 64,128 --seq 16384 --causal off --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/n1_$v > $R/n1_$v.log 2>&1
  for hd in "16 64" "32 80"; do read -r h d <<<"$hd"; LLMHPC_FLASH_BWD_CHUNK=$v timeout 30 $L --mode attention --device cuda --batch 4 --heads $h --head-dim $d --seq 1024 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/m${h}_$v >> $R/m_$v.log 2>&1; done
done
for n in 32 64 128 256; do LLMHPC_FLASH_BWD_CHUNK=$n timeout 60 $L --mode attention --device cuda --batch 1 --heads 1 --head-dim 64,128 --seq 16384,32768 --causal on --impl flash --precision bf16 --warmup 3 --iters 10 --out $R/f_$n > $R/f_$n.log 2>&1; done; echo "forced chunks $(el)"
timeout 90 python3 analysis/torch_attention.py --batch 1 --heads 1 --head-dim 16,32,64,128 --seq 1024,4096,8192,16384,32768,65536 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/torch_c.json > $R/torch.log 2>&1; echo "torch causal rc $? $(el)"
timeout 60 python3 analysis/torch_attention.py --batch 8 --heads 1 --head-dim 64,128 --seq 4096,16384 --precision bf16 --impl fused --warmup 3 --iters 10 --out $R/torch_n.json >> $R/torch.log 2>&1
timeout 60 python3 analysis/torch_attention.py --batch 1 --heads 1 --head-dim 64,128 --seq 16384 --precision bf16 --impl fused --warmup 3 --iters 10 --out $R/torch_n1.json >> $R/torch.log 2>&1
for hd in "16 64" "32 80"; do read -r h d <<<"$hd"; timeout 30 python3 analysis/torch_attention.py --batch 4 --heads $h --head-dim $d --seq 1024 --precision bf16 --causal --impl fused --warmup 3 --iters 10 --out $R/torch_m$h.json >> $R/torch.log 2>&1; done
for v in off auto; do
  echo "== $v"; python3 analysis/attention.py $R/c_$v --torch $R/torch_c.json 2>&1 | grep -A 30 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f6-13
  python3 analysis/attention.py $R/n_$v --torch $R/torch_n.json 2>&1 | grep -A 10 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f3-13
  python3 analysis/attention.py $R/n1_$v --torch $R/torch_n1.json 2>&1 | grep -A 10 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f3-13
  for h in 16 32; do python3 analysis/attention.py $R/m${h}_$v --torch $R/torch_m$h.json 2>&1 | grep -A 5 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f4-13; done
done
for n in 32 64 128 256; do echo "== forced $n"; python3 analysis/attention.py $R/f_$n --torch $R/torch_c.json 2>&1 | grep -A 10 "vs PyTorch" | grep "^| bf16" | cut -d'|' -f6-13; done
for lm in "" "--low-memory"; do
  timeout 120 $L --mode bench --device cuda --model 2.7B --context-length 1024 --batch-size 4 --precision bf16 --attention flash --phase train-step --warmup 2 --steps 5 $lm --out $R/m27$lm > $R/m27.log 2>&1
  echo "2.7B ctx1024 $lm rc $? $(el)"; sed -n '/bench summary/,$p' $R/m27.log | tail -1 | cut -c1-170
  python3 -c "
import sys; sys.path.insert(0, 'analysis')
from llmhpc_h5 import open_run
for r in open_run('$R/m27$lm').records('bench'): print('  peak %.2f GiB' % (r.attrs['peak_memory_bytes'] / 2**30))"
done
tar czf $OUT/runs.tgz -C $R . ; echo "done $(el)"
