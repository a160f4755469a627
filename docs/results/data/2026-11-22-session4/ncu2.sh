#!/bin/bash
# Stall reasons (cycles per issued instruction) of PyTorch FA2 backward and llmhpc split dkdv/dq, T=65536 causal B1H1.
set -u
C=carry/s4; B=/tmp/s4b; [ -d $B ] || { mkdir -p $B; tar xJf $C/bins.txz -C $B; }
export LD_LIBRARY_PATH=$PWD/$C/fallback PYTHONUNBUFFERED=1
exec > >(tee -a "$OUT/log.txt") 2>&1
R="barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait lg_throttle not_selected selected membar dispatch_stall no_instruction drain sleeping branch_resolving imc_miss tex_throttle misc"
M=gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,sm__cycles_elapsed.avg,smsp__warps_active.avg.per_cycle_active
for r in $R; do M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio; done
for d in 128 64; do
  timeout 150 ncu --metrics $M -k regex:seqk_parallel --launch-count 1 python3 $C/torch_one.py 65536 $d > $OUT/stall_torch_d$d.txt 2>&1; echo "torch d$d rc $?"
  timeout 150 ncu --metrics $M -k regex:"dkdv|dq_mma" --launch-count 2 $B/main/llmhpc --mode attention --device cuda --batch 1 --heads 1 --head-dim $d --seq 65536 --causal on --impl flash --precision bf16 --warmup 0 --iters 1 --out /tmp/st$d > $OUT/stall_split_d$d.txt 2>&1; echo "split d$d rc $?"
done
for f in $OUT/stall_*.txt; do echo "#### $f"; grep -E "^  [a-z_].*\(|  (gpu__|smsp__|sm__|l1tex__)" $f | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' | awk '{ if ($0 ~ /\(/) print substr($0,1,90); else if ($NF+0 > 0.05 || $0 ~ /gpu__|inst_exec|hmma|wavefronts|elapsed|warps_active/) print }'; done
