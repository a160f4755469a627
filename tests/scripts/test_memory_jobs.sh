#!/usr/bin/env bash
# jobs/memory.sh and jobs/precision.sh on this machine without Slurm (2 ranks, CPU, tiny
# model): memory writes the rank files, one memory_viz snapshot per configuration that
# Python's pickle reads, and a report.md with the memory section and its timeline PNGs; its
# train step has an optimizer phase unless ADAMW_IN_BACKWARD=1, and PHASES=forward runs;
# precision leaves a report.md with the reference accumulation numbers (the four cases) and,
# under its default bf16, the dtype table (analysis/precision.py, from the rank file).
set -euo pipefail
: "${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}"
LLMHPC_BIN=$(realpath -m "$LLMHPC_BIN")  # absolute: the test runs in folders of its own
export PYTHON=${LLMHPC_PYTHON:-python3}
export LAUNCH="${MPIEXEC:-mpirun} --oversubscribe -np 2" LLMHPC_BIN
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
"$PYTHON" -c "import h5py, pandas, matplotlib" 2>/dev/null || { echo "SKIP: $PYTHON lacks h5py, pandas or matplotlib"; exit 77; }
ROOT=${LLMHPC_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

NP=2 DEVICE=cpu MODELS=tiny CONTEXTS=16,32 PRECISIONS=fp32 SNAPSHOT=1 OUT=$tmp/memory \
  bash "$ROOT/jobs/memory.sh" >"$tmp/memory.log" 2>&1 || { cat "$tmp/memory.log"; fail "jobs/memory.sh failed"; }
for r in 0 1; do [ -f "$tmp/memory/rank0000$r.h5" ] || fail "no rank file $r"; done
snapshots=("$tmp"/memory/snapshot*.pickle)
[ ${#snapshots[@]} -eq 4 ] || fail "expected 4 snapshots (2 contexts x 2 phases), got ${#snapshots[@]}"
"$PYTHON" - "${snapshots[@]}" <<'PY' || fail "a snapshot does not load"
import pickle, sys
for path in sys.argv[1:]:
    with open(path, "rb") as f:
        s = pickle.load(f)
    assert s["segments"] and s["device_traces"][0], path
PY
grep -q "memory_tiny_T32_B4_fp32_naive_train-step.png" "$tmp/memory/report.md" || fail "report.md lacks the timeline"
[ -s "$tmp/memory/memory_tiny_T32_B4_fp32_naive_train-step.png" ] || fail "the timeline PNG is missing"
# The train step as PyTorch runs it by default (AdamW a phase of its own, every gradient kept);
# ADAMW_IN_BACKWARD=1 traces llmhpc's plan (AdamW inside backward, no optimizer phase); a forward
# alone runs without --separate-optimizer, which llmhpc would refuse.
NP=1 DEVICE=cpu MODELS=tiny CONTEXTS=16 PRECISIONS=fp32 PHASES=train-step ADAMW_IN_BACKWARD=1 OUT=$tmp/inside \
  bash "$ROOT/jobs/memory.sh" >"$tmp/inside.log" 2>&1 || { cat "$tmp/inside.log"; fail "memory.sh ADAMW_IN_BACKWARD=1 failed"; }
NP=1 DEVICE=cpu MODELS=tiny CONTEXTS=16 PRECISIONS=fp32 PHASES=forward OUT=$tmp/forward \
  bash "$ROOT/jobs/memory.sh" >"$tmp/forward.log" 2>&1 || { cat "$tmp/forward.log"; fail "memory.sh PHASES=forward failed"; }
"$PYTHON" - "$tmp/memory/rank00000.h5" "$tmp/inside/rank00000.h5" <<'PY' || fail "the train step's optimizer phase"
import sys, h5py
for path, separate in zip(sys.argv[1:], (1, 0)):
    with h5py.File(path, "r") as f:
        steps = [g for g in f["memory"].values() if g.attrs["phase"] == "train-step"]
        assert steps, path
        for g in steps:
            phases = list(g["phase_name"].asstr()[()])
            assert g.attrs["separate_optimizer"] == separate and ("optimizer" in phases) == bool(separate), \
                (path, g.name, phases)
PY
grep -q "| in backward |" "$tmp/inside/report.md" || fail "memory.sh ADAMW_IN_BACKWARD=1: the report does not say AdamW ran in backward"

NP=2 DEVICE=cpu MODELS=tiny OUT=$tmp/precision bash "$ROOT/jobs/precision.sh" >"$tmp/precision.log" 2>&1 ||
  { cat "$tmp/precision.log"; fail "jobs/precision.sh failed"; }
for v in 10.0001 9.9531 10.0021; do grep -q "| $v |" "$tmp/precision/report.md" || fail "report.md lacks $v"; done
grep -q "^| fp16 values cast to fp32, fp32 sum | 10.0021 |" "$tmp/precision/report.md" ||
  fail "report.md lacks the reference study's 4th case (fp16 values cast to fp32 before each addition)"
grep -q "^| logits (LM head output) | bf16 | bf16 | yes |" "$tmp/precision/report.md" ||
  fail "report.md lacks the bf16 dtype table (its default, on the CPU too)"
echo "memory and precision jobs: ok"
