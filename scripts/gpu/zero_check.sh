#!/usr/bin/env bash
# ZeRO-2 and ZeRO-3 on two GPUs of one host, beside PyTorch FSDP2 in the same run: the numbers
# behind docs/results/sharding.md ("ZeRO-2 and ZeRO-3").
#   scripts/gpu/zero_check.sh [BIN_DIR [OUT_DIR]]
# BIN_DIR (default build) holds llmhpc and, for the tests part, test_shard (or tests/test_shard).
# PARTS (default "tests stages big torch") picks what runs, in this order:
#   tests   test_shard's ZeRO-2/3 cases and ZeRO-1's under mpirun -np 2 (nccl on the GPUs;
#           TEST_FILTER, a --gtest_filter, narrows them)
#   stages  llmhpc --mode ddp, --shard-optimizer none,zero1,zero2,zero3 (bucketed 25 MiB): xl bf16
#           context 1024 global batch 8, and context 128 global batch 16 (communication-bound);
#           and one GPU alone at the local batch (--ddp none)
#   big     a model whose training state does not fit one GPU: BIG_SHAPE (default the 13B of
#           LLaMA-2: d_model 5120, d_ff 13824, 40 layers, 40 heads, about 13.0B parameters, 208 GB
#           of fp32 state), bf16, context 1024, global batch BIG_BATCH (default 4): none and zero1
#           on 2 GPUs (expected: oom), zero3 on 2 GPUs (BIG_STAGES); and one GPU (oom)
#   torch   PyTorch FSDP2 (fully_shard per block and root, bf16 parameters, fp32 reduction;
#           reshard_after_forward True and False) and DDP, eager and compiled, at the stages'
#           two points (analysis/torch_ddp.py; TORCH_SETUPS and TORCH_SHARDINGS narrow it)
# MPIRUN (default mpirun --bind-to none) launches the ranks.
# Files in OUT_DIR: log.txt, <part>*/ (rank files), torch.jsonl.
set -uo pipefail
source "$(dirname "$0")/setup.sh" zero-check "${1:-}" "${2:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
PARTS=${PARTS:-tests stages big torch}
BIG_SHAPE=${BIG_SHAPE:---d-model 5120 --d-ff 13824 --num-layers 40 --num-heads 40}
BIG_BATCH=${BIG_BATCH:-4}
BIG_STAGES=${BIG_STAGES:-none,zero1,zero3}
TORCH_SETUPS=${TORCH_SETUPS:-eager,compiled}
TORCH_SHARDINGS=${TORCH_SHARDINGS:-none,fsdp2,fsdp2-noreshard}
read -ra mpi <<<"${MPIRUN:-mpirun --bind-to none} -np 2 -x NCCL_NVLS_ENABLE"
read -ra big_shape <<<"$BIG_SHAPE"
exec > >(tee -a "$out/log.txt") 2>&1
point1024=(--model xl --context-length 1024 --batch-size 8 --precision bf16)
point128=(--model xl --context-length 128 --batch-size 16 --precision bf16)
timing=(--warmup 3 --steps 10)

if has tests; then
  step "test_shard, 2 ranks"
  check timeout 300 "${mpi[@]}" "$(find_exe test_shard)" --gtest_filter="${TEST_FILTER:-*UnitShard*:*ShardTest.TenSteps*}"
fi
if has stages; then
  for point in 1024 128; do
    ref="point$point[@]"
    step "llmhpc ddp stages, context $point"
    check timeout 240 "${mpi[@]}" "$bin/llmhpc" --mode ddp "${!ref}" --attention flash "${timing[@]}" \
      --ddp bucketed --shard-optimizer none,zero1,zero2,zero3 --out "$out/stages$point"
    step "llmhpc one GPU at the local batch, context $point"
    local_batch=$(( $(sed -E 's/.*--batch-size ([0-9]+).*/\1/' <<<"${!ref}") / 2 ))
    check timeout 120 "$bin/llmhpc" --mode ddp "${!ref}" --batch-size "$local_batch" --attention flash "${timing[@]}" \
      --ddp none --out "$out/single$point"
  done
fi
if has big; then
  step "llmhpc ddp, a model past one GPU: ${big_shape[*]}"
  check timeout 420 "${mpi[@]}" "$bin/llmhpc" --mode ddp "${big_shape[@]}" --context-length 1024 \
    --batch-size "$BIG_BATCH" --precision bf16 --attention flash --warmup 2 --steps 5 --ddp bucketed \
    --shard-optimizer "$BIG_STAGES" --out "$out/big"
  check timeout 120 "$bin/llmhpc" --mode ddp "${big_shape[@]}" --context-length 1024 --batch-size $((BIG_BATCH / 2)) \
    --precision bf16 --attention flash --warmup 1 --steps 2 --ddp none --out "$out/big_single"
fi
if has torch; then
  for point in 1024 128; do
    ref="point$point[@]"
    step "PyTorch FSDP2 ($TORCH_SHARDINGS), context $point"
    check timeout 420 torchrun --standalone --nproc_per_node 2 "$root/analysis/torch_ddp.py" "${!ref}" "${timing[@]}" \
      --setup "$TORCH_SETUPS" --shard-optimizer "$TORCH_SHARDINGS" --out "$out/torch.jsonl"
  done
fi

step "done"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
