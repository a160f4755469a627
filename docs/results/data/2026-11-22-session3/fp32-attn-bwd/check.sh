#!/bin/bash
# Call 2: GPU tests of v4 (final, fused and split); fp32 attention main / v2 / v4 (hd 64, and hd 80 in 128);
# ncu kernel times of v4 at T=1024; models main / v4 / v2 alternated (medium fp32), small,large fp32 T1024
# and medium bf16 T1024 main / v4.
C=carry/fp32b
export LD_LIBRARY_PATH=$PWD/$C/fallback:$LD_LIBRARY_PATH
S=$(date +%s); LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv >> $LOG
t() { echo "$1 rc $2 $(( $(date +%s) - S )) s" >> $LOG; }
timeout 60 $C/test_flash_attn_v4 > $OUT/test_v4.txt 2>&1; t test_v4 $?
LLMHPC_FLASH_BWD=split timeout 60 $C/test_flash_attn_v4 > $OUT/test_v4_split.txt 2>&1; t test_v4_split $?
A="--mode attention --device cuda --batch 4 --heads 16 --head-dim 64 --seq 512,1024,4096 --causal on --impl flash --precision fp32 --warmup 3 --iters 10"
A80="--mode attention --device cuda --batch 4 --heads 32 --head-dim 80 --seq 1024 --causal on --impl flash --precision fp32 --warmup 3 --iters 10"
for v in main v2 v4 main v2 v4; do
  echo "== $v" >> $OUT/att.txt; timeout 60 $C/llmhpc_$v $A --out /tmp/a_$RANDOM >> $OUT/att.txt 2>&1; t att_$v $?
done
for v in main v4; do
  echo "== $v d80" >> $OUT/att.txt; timeout 60 $C/llmhpc_$v $A80 --out /tmp/a_$RANDOM >> $OUT/att.txt 2>&1; t att80_$v $?
done
N="--mode attention --device cuda --batch 4 --heads 16 --head-dim 64 --seq 1024 --causal on --impl flash --precision fp32 --warmup 1 --iters 1"
timeout 60 ncu --clock-control none -k regex:flash --metrics gpu__time_duration.sum $C/llmhpc_v4 $N --out /tmp/n_$RANDOM > $OUT/ncu_v4.txt 2>&1; t ncu_v4 $?
B="--mode bench --device cuda --model medium --context-length 512,1024 --precision fp32 --attention flash"
for v in main v4 v2 main v4 v2; do
  echo "== $v medium" >> $OUT/bench.txt; timeout 80 $C/llmhpc_$v $B --out /tmp/b_$RANDOM >> $OUT/bench.txt 2>&1; t bench_$v $?
done
O="--mode bench --device cuda --model small,large --context-length 1024 --precision fp32 --attention flash"
Q="--mode bench --device cuda --model medium --context-length 1024 --precision bf16 --attention flash"
for v in main v4; do
  echo "== $v small,large" >> $OUT/bench.txt; timeout 80 $C/llmhpc_$v $O --out /tmp/b_$RANDOM >> $OUT/bench.txt 2>&1; t other_$v $?
done
for v in main v4; do
  echo "== $v bf16" >> $OUT/bench.txt; timeout 80 $C/llmhpc_$v $Q --out /tmp/b_$RANDOM >> $OUT/bench.txt 2>&1; t bf16_$v $?
done
cat $LOG; grep -hE "PASSED|FAILED|tests ran" $OUT/test_v4*.txt
grep -E "^== |^flash" $OUT/att.txt
grep -E "flash_|duration" $OUT/ncu_v4.txt | grep -v PROF | sed -E 's/\(FlashParams\).*//; s/llmhpc::flash:://g; s/\s+/ /g' | paste - - | cut -c1-120
grep -E "^== |ms/step" $OUT/bench.txt
