#!/usr/bin/env bash
# Tensor parallelism on the GPUs of one host, beside PyTorch's own in the same run: the numbers
# behind docs/results/tensor-parallel.md.
#   scripts/gpu/tp_check.sh [BIN_DIR [OUT_DIR]]
# BIN_DIR (default build) holds llmhpc and, for the tests part, test_tensor_parallel and
# test_cuda_ops and test_cuda_model (or tests/...). NP (default 2) GPUs; PARTS (default "tests equal bench torch")
# picks what runs, in this order:
#   tests  test_tensor_parallel under mpirun -np NP (nccl, fp32: the one-rank model's losses and
#          weights; checkpoints; TEST_FILTER, a --gtest_filter, default *nccl*:*Layout*, narrows
#          them); test_cuda_ops (the vocabulary-parallel kernels) and test_cuda_model
#   equal  mode train on a small model, fp32 and bf16: --tp NP with and without
#          --sequence-parallel against one GPU on the same batches (the losses side by side)
#   bench  mode train on BENCH_MODEL (default 2.7B) bf16, context 1024, global batch BENCH_BATCH
#          (default 8), flash attention, BENCH_STEPS (default 12) steps: one GPU, then --tp NP
#          without and with --sequence-parallel, each also with --tp-overlap K for K in
#          BENCH_OVERLAP (default "2 4": forward's products in K chunks), and data parallelism
#          (zero1) on the same GPUs
#   sweep  mode ddp at the bench point: --tp 1,NP x --ddp none,bucketed x --shard-optimizer
#          zero1,zero3 in one sweep (tensor against data parallelism on the same GPUs), and mode
#          memory's trace of one rank's step at --tp NP with and without --sequence-parallel
#   torch  analysis/torch_tp.py at the bench point: PyTorch's tensor parallel
#          (ColwiseParallel/RowwiseParallel, SequenceParallel on and off), in the setups of
#          TORCH_SETUPS (default eager,compiled)
#   mesh   NP >= 4: the bench point on every GPU, global batch BENCH_BATCH x NP / 2 (each
#          tensor-parallel pair as loaded as in bench): --tp 2 x dp NP/2 (zero1 across the
#          pairs), --tp NP at BENCH_BATCH, data parallelism (zero1) alone; and the collectives'
#          sweeps of 2 and NP GPUs (mode comm) that analysis/accounting.py tp fits its model to
# MPIRUN (default mpirun --bind-to none) launches the ranks.
# Files in OUT_DIR: log.txt, <part>*/ (rank files), torch_tp.jsonl.
set -uo pipefail
source "$(dirname "$0")/setup.sh" tp-check "${1:-}" "${2:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
PARTS=${PARTS:-tests equal bench torch}
NP=${NP:-2}
BENCH_MODEL=${BENCH_MODEL:-2.7B}
BENCH_BATCH=${BENCH_BATCH:-8}
BENCH_STEPS=${BENCH_STEPS:-12}
TORCH_SETUPS=${TORCH_SETUPS:-eager,compiled}
read -ra mpi <<<"${MPIRUN:-mpirun --bind-to none} -np $NP -x NCCL_NVLS_ENABLE"
exec > >(tee -a "$out/log.txt") 2>&1

# Random tokens (uint16) for mode train: the timing does not depend on what they are.
tokens=$out/tokens.bin
python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 10000, 4 << 20, dtype=np.uint16).tofile('$tokens')"

if has tests; then
  step "test_tensor_parallel, $NP ranks"
  check timeout 300 "${mpi[@]}" "$(find_exe test_tensor_parallel)" --gtest_filter="${TEST_FILTER:-*nccl*:*Layout*}"
  step "test_cuda_ops (the vocabulary-parallel kernels among them) and test_cuda_model"
  check timeout 300 "$(find_exe test_cuda_ops)"
  check timeout 300 "$(find_exe test_cuda_model)"
fi
if has equal; then
  small=(--mode train --data "$tokens" --model small --context-length 256 --batch-size 8 --attention flash --steps 20
         --log-every 5 --lr 1e-3)
  for precision in fp32 bf16; do
    step "train, one GPU, $precision"
    check timeout 180 "$bin/llmhpc" "${small[@]}" --precision "$precision" --out "$out/equal_${precision}_tp1"
    for sp in "" --sequence-parallel; do
      step "train, --tp $NP $sp, $precision"
      check timeout 180 "${mpi[@]}" "$bin/llmhpc" "${small[@]}" --precision "$precision" --tp "$NP" $sp \
        --out "$out/equal_${precision}_tp$NP${sp:+_sp}"
    done
  done
fi
if has bench; then
  point=(--mode train --data "$tokens" --model "$BENCH_MODEL" --context-length 1024 --batch-size "$BENCH_BATCH"
         --precision bf16 --attention flash --steps "$BENCH_STEPS" --log-every 1)
  step "bench: one GPU"
  check timeout 300 "$bin/llmhpc" "${point[@]}" --out "$out/bench_tp1"
  for sp in "" --sequence-parallel; do
    step "bench: --tp $NP $sp"
    check timeout 300 "${mpi[@]}" "$bin/llmhpc" "${point[@]}" --tp "$NP" $sp --out "$out/bench_tp$NP${sp:+_sp}"
    for k in ${BENCH_OVERLAP-2 4}; do
      step "bench: --tp $NP $sp --tp-overlap $k"
      check timeout 300 "${mpi[@]}" "$bin/llmhpc" "${point[@]}" --tp "$NP" $sp --tp-overlap "$k" \
        --out "$out/bench_tp$NP${sp:+_sp}_overlap$k"
    done
  done
  step "bench: data parallelism (zero1) on the same GPUs"
  check timeout 300 "${mpi[@]}" "$bin/llmhpc" "${point[@]}" --shard-optimizer zero1 --out "$out/bench_dp$NP"
fi
if has sweep; then
  point=(--model "$BENCH_MODEL" --context-length 1024 --batch-size "$BENCH_BATCH" --precision bf16 --attention flash)
  step "sweep: mode ddp, --tp 1,$NP"
  check timeout 540 "${mpi[@]}" "$bin/llmhpc" --mode ddp "${point[@]}" --tp "1,$NP" --ddp none,bucketed \
    --shard-optimizer zero1,zero3 --warmup 3 --steps 10 --out "$out/sweep_ddp"
  for sp in "" --sequence-parallel; do
    step "sweep: mode memory, --tp $NP $sp"
    check timeout 300 "${mpi[@]}" "$bin/llmhpc" --mode memory "${point[@]}" --phase train-step --tp "$NP" $sp \
      --out "$out/sweep_memory${sp:+_sp}"
  done
fi
if has mesh; then
  point=(--mode train --data "$tokens" --model "$BENCH_MODEL" --context-length 1024 --precision bf16 --attention flash
         --steps "$BENCH_STEPS" --log-every 1)
  step "mesh: --tp 2 x dp $((NP / 2))"
  check timeout 300 "${mpi[@]}" "$bin/llmhpc" "${point[@]}" --batch-size $((BENCH_BATCH * NP / 2)) --tp 2 \
    --out "$out/mesh_tp2_dp$((NP / 2))"
  step "mesh: --tp $NP"
  check timeout 300 "${mpi[@]}" "$bin/llmhpc" "${point[@]}" --batch-size "$BENCH_BATCH" --tp "$NP" --out "$out/mesh_tp$NP"
  step "mesh: data parallelism (zero1) on $NP GPUs"
  check timeout 300 "${mpi[@]}" "$bin/llmhpc" "${point[@]}" --batch-size $((BENCH_BATCH * NP / 2)) \
    --shard-optimizer zero1 --out "$out/mesh_dp$NP"
  for n in 2 "$NP"; do
    step "mesh: the collectives of $n GPUs (sequence parallelism's all-gathers and reduce-scatters too)"
    check timeout 180 ${MPIRUN:-mpirun --bind-to none} -np "$n" -x NCCL_NVLS_ENABLE "$bin/llmhpc" --mode comm \
      --collective allreduce,reducescatter,allgather --precision bf16 --size 1MB,4MB,16MB,42MB,64MB,256MB \
      --out "$out/mesh_comm$n"
  done
fi
if has torch; then
  step "PyTorch tensor parallel ($TORCH_SETUPS)"
  check timeout 540 torchrun --standalone --nproc_per_node "$NP" "$root/analysis/torch_tp.py" --model "$BENCH_MODEL" \
    --context-length 1024 --batch-size "$BENCH_BATCH" --precision bf16 --setup "$TORCH_SETUPS" \
    --sequence-parallel off,on --warmup 3 --steps 10 --out "$out/torch_tp.jsonl"
fi

step "done"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
