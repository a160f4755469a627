#!/bin/bash
# ncu: PyTorch FA2 backward vs llmhpc split (dkdv, dq) and fused128, bf16 causal B1 H1 T 16384, d 64 and 128.
set -u
C=carry/s4; B=/tmp/s4b; [ -d $B ] || { mkdir -p $B; tar xJf $C/bins.txz -C $B; }
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
S="--section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section SourceCounters"
M="--metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,smsp__inst_executed.sum,sm__warps_active.avg.pct_of_peak_sustained_active"
for d in 128 64; do
  timeout 120 ncu $S $M -k regex:bwd --launch-skip 0 --launch-count 4 python3 $C/torch_one.py 16384 $d > $OUT/ncu_torch_d$d.txt 2>&1; echo "torch d$d rc $?"
  for v in split fused128; do
    LLMHPC_FLASH_BWD_TC=$v timeout 120 ncu $S $M -k regex:bwd --launch-count 6 $B/f128/llmhpc --mode attention --device cuda --batch 1 --heads 1 --head-dim $d --seq 16384 --causal on --impl flash --precision bf16 --warmup 1 --iters 1 --out /tmp/ncu_$v$d > $OUT/ncu_${v}_d$d.txt 2>&1; echo "$v d$d rc $?"
  done
done
for f in $OUT/ncu_*.txt; do echo "#### $f"; grep -E "^  [a-z_].*\(|Duration|Registers Per|Shared Memory Configuration Size|Dynamic Shared|Block Size|Grid Size|hmma_cycles_active|Achieved Occupancy|Compute \(SM\) Throughput|wavefronts_mem_shared.sum|bank_conflicts" $f | cut -c1-150; done
