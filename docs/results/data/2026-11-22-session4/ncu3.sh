#!/bin/bash
# ncu per kernel (after the instruction diet and chunks): backward at T 65536 d128 causal B1H1, and B8 non-causal T16384 d64.
set -u
C=carry/flash
export LD_LIBRARY_PATH=$PWD/$C/fallback
M=gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected dispatch_stall no_instruction lg_throttle; do M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio; done
ncu --metrics $M -k regex:"dkdv|dq_mma" --launch-count 2 $C/llmhpc --mode attention --device cuda --batch 1 --heads 1 --head-dim 128 --seq 65536 --causal on --impl flash --precision bf16 --warmup 0 --iters 1 --out /tmp/n1 > $OUT/ncu_c128.txt 2>&1
ncu --metrics $M -k regex:"dkdv|dq_mma" --launch-count 2 $C/llmhpc --mode attention --device cuda --batch 8 --heads 1 --head-dim 64 --seq 16384 --causal off --impl flash --precision bf16 --warmup 0 --iters 1 --out /tmp/n2 > $OUT/ncu_n64.txt 2>&1
