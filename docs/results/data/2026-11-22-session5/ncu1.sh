#!/bin/bash
# ncu (H100): fused tensor-core backward vs split dK/dV and dQ vs PyTorch FA2, causal B1 H1 T 32768 d 128.
set -u
C=carry/flash
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1
R="barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait lg_throttle not_selected selected membar dispatch_stall no_instruction drain branch_resolving"
M=gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__cycles_elapsed.avg,smsp__warps_active.avg.per_cycle_active,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,launch__registers_per_thread,smsp__inst_executed_op_ldsm.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
for r in $R; do M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio; done
A="$C/llmhpc --mode attention --device cuda --batch 1 --heads 1 --head-dim 128 --seq 32768 --causal on --impl flash --precision bf16 --warmup 0 --iters 1"
LLMHPC_FLASH_BWD=fused timeout 150 ncu --metrics $M -k regex:"dkdv|convert" --launch-count 2 $A --out /tmp/n1 > $OUT/ncu_fused.txt 2>&1; echo "fused rc $?"
LLMHPC_FLASH_BWD=split timeout 150 ncu --metrics $M -k regex:"dkdv|dq_mma" --launch-count 2 $A --out /tmp/n2 > $OUT/ncu_split.txt 2>&1; echo "split rc $?"
timeout 150 ncu --metrics $M -k regex:seqk_parallel --launch-count 1 python3 $C/torch_one.py 32768 128 > $OUT/ncu_torch.txt 2>&1; echo "torch rc $?"
for f in $OUT/ncu_*.txt; do echo "#### $f"; grep -E "^  [a-z_].*\(|  (gpu__|smsp__|sm__|l1tex__|lts__|launch__)" $f | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | awk '{ if ($0 ~ /\(/) print substr($0,1,90); else if ($NF+0 > 0.05 || $0 ~ /gpu__|inst_exec|hmma|wavefronts|elapsed|warps_active|lts__|regis/) print }'; done
