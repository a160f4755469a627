#!/usr/bin/env bash
# The multi-rank NCCL paths on one GPU: NP ranks (default 2) share it, each a host of its own for
# NCCL (scripts/fake_hosts.sh), which then connects them over its network transport (it refuses
# two ranks on one GPU of one host). Correctness only, for a machine with fewer GPUs than a check
# needs ranks: the times mean nothing.
#   scripts/gpu/shared_gpu_check.sh [BIN_DIR [OUT_DIR]]
# PARTS (default "tests train"):
#   tests  the NCCL cases of TESTS (default test_comm test_ddp test_shard test_tensor_parallel, in
#          BIN_DIR or BIN_DIR/tests) under mpirun -np NP, LLMHPC_TEST_GPU_SHARING=1
#   train  mode train on a small model in fp32: one rank, then NP ranks under tensor parallelism
#          (--tp NP, with --tp-overlap and --sequence-parallel) and data parallelism (bucketed
#          and zero1 on the copy engines in 0.5 MiB buckets, zero1 in bf16 on the wire, hybrid
#          zero1, zero2, zero3, hybrid zero3); every run's losses against one rank's: within 1e-5 relative
#          (1e-4 with bf16 on the wire)
#   timeline  mode ddp on NP ranks, bucketed under every sharding stage, and mode train (zero1, two
#          micro-batches a step, a checkpoint every 3 steps): each rank's step timeline
#          (the last 4 timed steps) agrees with its own record: every step's collectives' spans
#          sum to its comm_busy_ms and its phases to its step_ms (and, --tp NP, the tensor-parallel
#          ones to its tp_comm_busy_ms), the steps follow one another, and a zero1 or zero2 step's
#          last all-gathers end inside the next step (but where a checkpoint came between them);
#          analysis/timeline.py's table,
#          plot (timeline.png) and trace (timeline.json)
# MPIRUN (default mpirun --bind-to none) launches the ranks.
# Files in OUT_DIR: log.txt, train_*/ and timeline/ (rank files).
set -uo pipefail
source "$(dirname "$0")/setup.sh" shared-gpu-check "${1:-}" "${2:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
export LLMHPC_TEST_GPU_SHARING=1
PARTS=${PARTS:-tests train}
NP=${NP:-2}
read -ra mpi <<<"${MPIRUN:-mpirun --bind-to none} -np $NP -x NCCL_NVLS_ENABLE -x LLMHPC_TEST_GPU_SHARING"
mpi+=("$root/scripts/fake_hosts.sh")
exec > >(tee -a "$out/log.txt") 2>&1
step "host: $(hostname), git $(cd "$root" && git rev-parse --short=12 HEAD 2>/dev/null || echo unknown), $NP ranks"
nvidia-smi -L 2>&1

if has tests; then
  for t in ${TESTS:-test_comm test_ddp test_shard test_tensor_parallel}; do
    step "$t, nccl, $NP ranks on one GPU"
    check timeout 540 "${mpi[@]}" "$(find_exe "$t")" --gtest_filter='*nccl*:*Nccl*' --gtest_brief=1
  done
fi
if has train; then
  python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 1000, 1 << 20, dtype=np.uint16).tofile('$out/tokens.bin')"
  small=(--mode train --data "$out/tokens.bin" --d-model 256 --d-ff 1024 --num-layers 4 --num-heads 8 --vocab-size 1000
         --context-length 128 --batch-size 8 --steps 8 --log-every 8 --data-order sequential --allow-gpu-sharing)
  step "train: one rank"
  check timeout 120 "$bin/llmhpc" "${small[@]}" --out "$out/train_one"
  cases=("--tp $NP" "--tp $NP --tp-overlap 3" "--tp $NP --sequence-parallel --tp-overlap 2"
         "--collective-engine copy --bucket-mb 0.5" "--shard-optimizer zero1 --collective-engine copy --bucket-mb 0.5"
         "--shard-optimizer zero1 --grad-reduce-dtype bf16" "--shard-optimizer zero1 --shard-group 1"
         "--shard-optimizer zero2" "--shard-optimizer zero3" "--shard-optimizer zero3 --shard-group 1")
  for c in "${cases[@]}"; do
    name=train_$(echo "$c" | tr -cs 'a-z0-9' '_' | sed 's/^_//;s/_$//')
    step "train: $NP ranks, $c"
    read -ra extra <<<"$c"
    check timeout 180 "${mpi[@]}" "$bin/llmhpc" "${small[@]}" "${extra[@]}" --out "$out/$name"
  done
  step "train: the losses against one rank's"
  check python3 - "$out" <<'PY'
import glob, os, sys
import h5py
import numpy as np
out = sys.argv[1]
def losses(d):
    with h5py.File(os.path.join(d, "rank00000.h5"), "r") as f:
        return f["train/loss"][()], dict(f.attrs)
ref, _ = losses(os.path.join(out, "train_one"))
bad = 0
for d in sorted(glob.glob(os.path.join(out, "train_*"))):
    if d.endswith("train_one"):
        continue
    got, attrs = losses(d)
    err = float(np.max(np.abs(got - ref)) / np.max(np.abs(ref)))
    limit = 1e-4 if "bf16" in d else 1e-5
    bad += err > limit
    print(f"{'ok  ' if err <= limit else 'FAIL'} {os.path.basename(d)}: relative {err:.2g} (at most {limit:g}); "
          f"NCCL {attrs.get('nccl_transports', '?')}")
sys.exit(1 if bad else 0)
PY
fi

if has timeline; then
  step "ddp timeline: $NP ranks, bucketed, none/zero1/zero2/zero3"
  check timeout 300 "${mpi[@]}" "$bin/llmhpc" --mode ddp --d-model 256 --d-ff 1024 --num-layers 4 --num-heads 8 \
    --vocab-size 1000 --context-length 128 --batch-size 8 --precision bf16 --ddp bucketed --bucket-mb 1 \
    --shard-optimizer none,zero1,zero2,zero3 --warmup 2 --steps 7 --allow-gpu-sharing --out "$out/timeline"
  step "ddp timeline: $NP ranks, --tp $NP"
  check timeout 300 "${mpi[@]}" "$bin/llmhpc" --mode ddp --d-model 256 --d-ff 1024 --num-layers 4 --num-heads 8 \
    --vocab-size 1000 --context-length 128 --batch-size 8 --precision bf16 --tp "$NP" --ddp none \
    --warmup 2 --steps 7 --allow-gpu-sharing --out "$out/timeline/tp"
  step "train timeline: $NP ranks, zero1, --grad-accum 2"
  python3 -c "import numpy as np; np.random.default_rng(0).integers(0, 1000, 1 << 20, dtype=np.uint16).tofile('$out/timeline_tokens.bin')"
  check timeout 180 "${mpi[@]}" "$bin/llmhpc" --mode train --data "$out/timeline_tokens.bin" --d-model 256 --d-ff 1024 \
    --num-layers 4 --num-heads 8 --vocab-size 1000 --context-length 128 --batch-size 8 --precision bf16 \
    --shard-optimizer zero1 --grad-accum 2 --steps 8 --log-every 8 --save-every 3 --save "$out/timeline_ckpt.h5" \
    --allow-gpu-sharing --out "$out/timeline/train"
  step "ddp timeline: each rank's against its record"
  check python3 - "$out/timeline" <<'PY'
import glob, sys
import h5py
import numpy as np
bad = 0
for path in sorted(glob.glob(sys.argv[1] + "/rank*.h5") + glob.glob(sys.argv[1] + "/*/rank*.h5")):
    with h5py.File(path, "r") as f:
        for label, g in (f["ddp"].items() if "ddp" in f else [("train_zero1", f["train"])]):
            steps, stream = g["timeline_step"][()], g["timeline_stream"].asstr()[()]
            start, end = g["timeline_start_ms"][()], g["timeline_end_ms"][()]
            kept = sorted(set(steps.tolist()))
            errs = []
            for s in kept:
                comm = (steps == s) & (stream != "compute") & (stream != "tensor parallel")
                tp = (steps == s) & (stream == "tensor parallel")
                compute = (steps == s) & (stream == "compute")
                errs.append(abs((end[comm] - start[comm]).sum() - g["comm_busy_ms"][s]))
                if "tp_comm_busy_ms" in g:
                    errs.append(abs((end[tp] - start[tp]).sum() - g["tp_comm_busy_ms"][s]))
                errs.append(abs(end[compute].max() - start[compute].min() - g["step_ms"][s]))
            dp = (stream == "communication") | (stream == "replicas")
            first = {s: start[(steps == s) & (stream == "compute")].min() for s in kept}
            last = {s: end[(steps == s) & (stream == "compute")].max() for s in kept}
            # In order: a step starts after the last one's compute, and its collectives after its start.
            ordered = all(first[b] >= last[a] - 1e-3 for a, b in zip(kept, kept[1:])) and all(
                start[(steps == s) & (stream != "compute")].min(initial=first[s]) >= first[s] - 1e-3 for s in kept)
            late = [float(end[(steps == s) & dp].max() - first[s + 1]) for s in kept[:-1] if ((steps == s) & dp).any()]
            # The regression this guards: a zero1 or zero2 step's last all-gathers run into the next
            # forward, not in a wait of the host between the steps (a checkpoint between two steps
            # does wait for them: train saves every 3 steps).
            overlapping = not ("_zero1" in label or "_zero2" in label) or (late and max(late) > 0)
            ok = kept == list(range(len(g["step_ms"]) - 4, len(g["step_ms"]))) and max(errs) < 1e-2 and ordered \
                and overlapping
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {path[-10:]} {label}: steps {kept}, {len(steps)} spans, "
                  f"largest difference {max(errs):.2g} ms, in order {ordered}; the data-parallel collectives' last "
                  f"end after the next step's start (ms): {', '.join(f'{x:.3f}' for x in late)}")
sys.exit(1 if bad else 0)
PY
  check python3 "$root/analysis/timeline.py" "$out/timeline" --png "$out/timeline.png" --trace "$out/timeline.json" \
    --label "$(python3 -c "import h5py,sys; print([k for k in h5py.File(sys.argv[1])['ddp'] if '_zero1' in k][0])" \
      "$out/timeline/rank00000.h5")"
fi

step "done"
if [ ${#failed[@]} -gt 0 ]; then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
