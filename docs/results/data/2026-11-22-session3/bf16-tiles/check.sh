#!/bin/bash
# Final check of helper/bf16-tiles 8a1e645: GPU flash tests, then timings of main's build vs
# this commit (twice each), the dQ experiment (llmhpc_exp, LLMHPC_FLASH_DQ_EXP=1: two m tiles
# always, =2: on long sequences), and PyTorch, in one call.
set -u
B=$PWD/carry/bf16; O=$OUT/r; mkdir -p $O
export LD_LIBRARY_PATH=$B/fallback PYTHONUNBUFFERED=1
S=$OUT/summary.txt; start=$(date +%s); el() { echo "[$(( $(date +%s) - start ))s]"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,power.draw --format=csv,noheader > $S
timeout 120 $B/test_flash_attn > $O/test_flash_attn.log 2>&1
echo "test_flash_attn rc $? $(el)" >> $S; grep -E "^\[ *(OK|PASSED|FAILED)|FAILED  \]" $O/test_flash_attn.log >> $S
A=(--mode attention --device cuda --causal on --impl flash --precision bf16 --warmup 3 --iters 10)
SHAPES=("--batch 1 --heads 1 --head-dim 64,128 --seq 4096,16384,65536" "--batch 4 --heads 16 --head-dim 64 --seq 128,256,1024,8192"
        "--batch 4 --heads 32 --head-dim 80 --seq 128,256,1024" "--batch 1 --heads 8 --head-dim 128 --seq 16384")
time_one() {  # name binary env...
  local name=$1 bin=$2; shift 2
  : > $O/${name}.log
  for i in 0 1 2 3; do env "$@" timeout 60 $B/$bin "${A[@]}" ${SHAPES[$i]} --out $O/${name}_$i >> $O/${name}.log 2>&1; done
  echo "== $name [$*] $(el)" >> $S
  awk -v n=$name '$1 == "flash" {printf "%s b%s h%s d%s T%s fwd %s bwd %s %s\n", n, $3, $4, $5, $6, $8, $9, $NF}' $O/${name}.log >> $S
}
time_one main llmhpc_main
time_one new llmhpc
time_one exp1 llmhpc_exp LLMHPC_FLASH_DQ_EXP=1
time_one exp2 llmhpc_exp LLMHPC_FLASH_DQ_EXP=2
time_one main2 llmhpc_main
time_one new2 llmhpc
T=(--precision bf16 --causal --impl fused --warmup 3 --iters 10)
: > $O/torch.log
for i in 0 1 2 3; do timeout 60 python3 analysis/torch_attention.py ${SHAPES[$i]} "${T[@]}" --out $O/torch_$i.json >> $O/torch.log 2>&1; done
echo "== torch $(el)" >> $S
grep -E "^\|" $O/torch.log >> $S
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader >> $S
tar czf $OUT/runs.tgz -C $OUT r
cat $S
