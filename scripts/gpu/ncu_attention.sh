#!/usr/bin/env bash
# Nsight Compute on the bf16 flash-attention backward: llmhpc's kernels, once per
# LLMHPC_FLASH_BWD variant, against PyTorch's FlashAttention-2 backward at the same shape
# (causal, batch 1, one head), with the counters docs/results/attention.md quotes: time,
# instructions, tensor-pipe (hmma) cycles, shared-memory wavefronts and bank conflicts, L2
# red/atom sectors, registers, and stall reasons per issued instruction. From the repository
# root, on a GPU host with ncu (CUDA toolkit) and, for the PyTorch side, torch:
#   scripts/gpu/ncu_attention.sh [BIN_DIR [OUT_DIR]]
# BIN_DIR (default build) holds llmhpc; OUT_DIR defaults to results/ncu-attention-<time>
# (git-ignored). Environment: SEQ (32768), HEAD_DIM (128), VARIANTS ("split fused", values of
# LLMHPC_FLASH_BWD), TORCH=0 (skip PyTorch), NCU (ncu).
# Files in OUT_DIR: ncu_<variant>.txt, ncu_torch.txt (ncu's full output) and summary.txt (the
# counters above, one block per kernel).
set -uo pipefail
NCU=${NCU:-ncu}
# ncu first, before setup.sh makes OUT_DIR (--help needs none): every run below is one of its, and
# without it each would end in exit 127.
if [[ ${1:-} != -h && ${1:-} != --help ]] && ! command -v "$NCU" >/dev/null; then
  echo "$0: no $NCU here (Nsight Compute, in the CUDA toolkit's bin/): put it on PATH or set NCU to its path" >&2
  exit 2
fi
source "$(dirname "$0")/setup.sh" ncu-attention "${1:-}" "${2:-}"
SEQ=${SEQ:-32768}
HEAD_DIM=${HEAD_DIM:-128}
VARIANTS=${VARIANTS:-split fused}
export PYTHONUNBUFFERED=1
stalls="barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait lg_throttle not_selected selected
        membar dispatch_stall no_instruction drain branch_resolving"
metrics=gpu__time_duration.sum,smsp__inst_executed.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum
metrics+=,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum,smsp__inst_executed_op_ldsm.sum,sm__cycles_elapsed.avg
metrics+=,smsp__warps_active.avg.per_cycle_active,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum
metrics+=,lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active
metrics+=,launch__registers_per_thread
for s in $stalls; do metrics+=,smsp__average_warps_issue_stalled_${s}_per_issue_active.ratio; done

echo "== ncu_attention $(date -u +%Y-%m-%dT%H:%M:%SZ), git $(cd "$root" && git rev-parse --short=12 HEAD 2>/dev/null),"\
     "T $SEQ, head dim $HEAD_DIM" | tee "$out/summary.txt"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$out/summary.txt"
# One forward + backward; ncu profiles the backward's kernels (delta, dK/dV, dQ or the dQ conversion).
for v in $VARIANTS; do
  LLMHPC_FLASH_BWD=$v timeout 300 "$NCU" --metrics "$metrics" -k regex:flash_bwd --launch-count 4 \
    "$bin/llmhpc" --mode attention --device cuda --batch-size 1 --num-heads 1 --head-dim "$HEAD_DIM" \
    --context-length "$SEQ" --causal on --attention flash --precision bf16 --warmup 0 --steps 1 --out "$out/run_$v" >"$out/ncu_$v.txt" 2>&1
  echo "llmhpc LLMHPC_FLASH_BWD=$v: exit $?" | tee -a "$out/summary.txt"
done
if [ "${TORCH:-1}" != 0 ]; then
  # PyTorch's FlashAttention-2 backward kernel (flash_bwd_dq_dk_dv_loop_seqk_parallel) of the second iteration.
  cat >"$out/torch_one.py" <<'PY'
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
T, d = int(sys.argv[1]), int(sys.argv[2])
q, k, v = (torch.randn(1, 1, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(1, 1, T, d, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)
torch.cuda.synchronize()
PY
  timeout 300 "$NCU" --metrics "$metrics" -k regex:seqk_parallel --launch-skip 1 --launch-count 1 \
    python3 "$out/torch_one.py" "$SEQ" "$HEAD_DIM" >"$out/ncu_torch.txt" 2>&1
  echo "torch: exit $?" | tee -a "$out/summary.txt"
fi
for f in "$out"/ncu_*.txt; do
  echo "#### $(basename "$f")"
  grep -E "^  [a-z_].*\(|  (gpu__|smsp__|sm__|l1tex__|lts__|launch__)" "$f" |
    sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' |
    awk '{ if ($0 ~ /\(/) print substr($0, 1, 90); else if ($NF + 0 > 0.05 || $0 ~ /gpu__|inst_exec|hmma|wavefronts|elapsed|warps_active|lts__|regis/) print }'
done | tee -a "$out/summary.txt"
