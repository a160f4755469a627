#!/usr/bin/env bash
# Mode profile on a GPU host, everything docs/results/profile.md needs in one run (~7 min on
# an H100). From the repository root:
#   scripts/gpu/profile_check.sh [BIN_DIR [OUT_DIR]]
# BIN_DIR holds llmhpc and test_cuda_profiler (build/ and build/tests/, or a folder made by
# scripts/gpu/pack_binaries.sh). Every part has a time limit and runs even when an earlier one
# failed; the exit status is non-zero if any failed. In OUT_DIR:
#   device.txt, cupti.txt          the GPU, and which libcupti llmhpc opens
#   tests.log                      test_cuda_profiler: exact kernel counts of a tiny model per
#                                  phase, flash's phases, 2.7B 10 train steps with no dropped record
#   <run>/ <run>.log               llmhpc --mode profile runs (rank file, printed report), and
#   <run>/profile_rank0.md, .png   analysis/kernel_profile.py's tables and plot of each:
#     seed001_forward, seed001_step   xl ctx 256 fp32 naive: forward kernel table, matmul share of a step
#     step_fp32, step_bf16            train step, small..2.7B x ctx 128/256/512 x naive/flash
#     forward_fp32, forward_bf16      forward only, the same grid
#     overhead                        small, xl, 2.7B at ctx 256, fp32 and bf16, 10 untraced vs 10 traced steps
#     dropped_2.7B                    2.7B ctx 128 fp32 train, 10 traced steps: dropped records must be 0
#     events                          --no-cupti: the fallback (phases timed with events)
#     trace                           small ctx 128 train, 2 steps, --trace: trace_rank00000.json
#   checks.log                     the checks on the files (dropped 0, trace JSON fields, fallback)
# RUNS (default: all of them, and "tests") names the parts to run, e.g. RUNS="tests seed001_forward trace".
# LLMHPC_CUPTI_LIBRARY: the path of the libcupti llmhpc opens; unset, where the loader knows no
# libcupti.so.13, the first one under /usr/local/cuda* (cupti.txt says which).
set -uo pipefail
source "$(dirname "$0")/setup.sh" profile-check "${1:-}" "${2:-}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NCCL_NVLS_ENABLE=0 OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
failed=()
fail() { failed+=("$1"); echo "FAILED: $1"; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader | tee "$out/device.txt"
date -u +%Y-%m-%dT%H:%MZ >>"$out/device.txt"

# libcupti: llmhpc finds it through the loader, beside cuBLASLt or via LLMHPC_CUPTI_LIBRARY.
{ ldconfig -p | grep libcupti; ls /usr/local/cuda*/extras/CUPTI/lib64/libcupti.so* /usr/local/cuda*/lib64/libcupti.so* \
    /usr/local/cuda*/targets/*/lib/libcupti.so* 2>/dev/null; } >"$out/cupti.txt" 2>&1
if ! ldconfig -p | grep -q "libcupti.so.13 " && [ -z "${LLMHPC_CUPTI_LIBRARY:-}" ]; then
  found=$(ls /usr/local/cuda*/extras/CUPTI/lib64/libcupti.so.13 /usr/local/cuda*/lib64/libcupti.so.13 2>/dev/null | head -1)
  [ -n "$found" ] && export LLMHPC_CUPTI_LIBRARY=$found
fi
echo "LLMHPC_CUPTI_LIBRARY=${LLMHPC_CUPTI_LIBRARY:-(unset)}" | tee -a "$out/cupti.txt"

# 1. The GPU tests (~1 min).
test=$bin/test_cuda_profiler; [ -x "$test" ] || test=$bin/tests/test_cuda_profiler
want() { [ -z "${RUNS:-}" ] || [[ " $RUNS " == *" $1 "* ]]; }
want tests && { timeout 300 "$test" >"$out/tests.log" 2>&1 || fail test_cuda_profiler; }
[ -f "$out/tests.log" ] && grep -E "^\[  (PASSED|FAILED|SKIPPED) |^\[  FAILED|Failure|Expected|Which is|Value of|actual" "$out/tests.log" | head -40

# 2. The profile runs: NAME TIMEOUT, then llmhpc's options; analysis/kernel_profile.py on each.
profile() {
  local name=$1 limit=$2; shift 2
  want "$name" || return 0
  timeout "$limit" "$bin/llmhpc" --mode profile --device cuda "$@" --out "$out/$name" >"$out/$name.log" 2>&1 || fail "$name"
  echo "== $name"; sed -n '/profile summary/,$p' "$out/$name.log" | cut -c1-200
  timeout 120 python3 "$root/analysis/kernel_profile.py" "$out/$name" --top 12 >/dev/null 2>"$out/$name.analysis.log" ||
    { fail "analysis of $name"; tail -5 "$out/$name.analysis.log"; }
}
sizes=small,medium,large,xl,2.7B
profile seed001_forward 120 --model xl --context-length 256 --phase forward --warmup 3 --steps 5
profile seed001_step 120 --model xl --context-length 256 --phase train-step --warmup 3 --steps 5
profile step_fp32 300 --model $sizes --context-length 128,256,512 --precision fp32 --attention naive,flash \
  --phase train-step --warmup 2 --steps 3
profile step_bf16 240 --model $sizes --context-length 128,256,512 --precision bf16 --attention naive,flash \
  --phase train-step --warmup 2 --steps 3
profile forward_fp32 240 --model $sizes --context-length 128,256,512 --precision fp32 --attention naive,flash \
  --phase forward --warmup 2 --steps 3
profile forward_bf16 180 --model $sizes --context-length 128,256,512 --precision bf16 --attention naive,flash \
  --phase forward --warmup 2 --steps 3
profile overhead 180 --model small,xl,2.7B --context-length 256 --precision fp32,bf16 --phase train-step --warmup 3 \
  --steps 10
profile dropped_2.7B 120 --model 2.7B --context-length 128 --phase train-step --warmup 2 --steps 10
profile events 120 --model xl --context-length 256 --phase train-step --warmup 2 --steps 3 --no-cupti
profile trace 60 --model small --context-length 128 --phase train-step --warmup 2 --steps 2 --trace

# 3. Checks on the files: every run's records ok with CUPTI and nothing dropped or unattributed,
# the fallback's, and the trace's fields.
RUNS=${RUNS:-} timeout 120 python3 - "$out" >"$out/checks.log" 2>&1 <<'EOF' || fail checks
import json, os, sys
import h5py
out, bad = sys.argv[1], []
wanted = lambda run: not os.environ["RUNS"] or run in os.environ["RUNS"].split()
for run in ("seed001_forward", "seed001_step", "step_fp32", "step_bf16", "forward_fp32", "forward_bf16", "overhead",
            "dropped_2.7B", "events", "trace"):
    if not wanted(run):
        continue
    path = os.path.join(out, run, "rank00000.h5")
    if not os.path.exists(path):
        bad.append(f"{run}: no rank file"); continue
    with h5py.File(path, "r") as f:
        for label, rec in f.get("profile", {}).items():
            a = dict(rec.attrs)
            line = (f"{run}/{label}: {a['status']}, profiler {a.get('profiler')}, activities {a.get('activities')}, "
                    f"dropped {a.get('dropped_records')}, unattributed {a.get('unattributed_activities')}")
            print(line)
            want = "phase events" if run == "events" else "cupti"
            if a["status"] != "ok":
                if a["status"] != "oom": bad.append(line)
            elif a["profiler"] != want or a["dropped_records"] != 0 or a["unattributed_activities"] != 0:
                bad.append(line)
            elif want == "cupti" and a["activities"] <= 0:
                bad.append(line)
trace = os.path.join(out, "trace", "trace_rank00000.json")
try:
    if not wanted("trace"):
        raise StopIteration
    with open(trace) as fh:
        events = json.load(fh)
    complete = [e for e in events if e.get("ph") == "X"]
    missing = [e for e in complete if not {"name", "ts", "dur", "pid", "tid", "args"} <= set(e)]
    tids = {e["tid"] for e in complete}
    print(f"trace: {len(events)} events, {len(complete)} complete, tracks {sorted(tids)}, {os.path.getsize(trace)} bytes")
    if not complete or missing or not {1, 2} <= tids or not any(t >= 10 for t in tids):
        bad.append(f"trace: {len(missing)} events lack fields, tracks {sorted(tids)}")
except StopIteration:
    pass
except Exception as e:  # noqa: BLE001
    bad.append(f"trace: {e}")
print("\n".join(["BAD: " + b for b in bad]) or "all checks passed")
sys.exit(1 if bad else 0)
EOF
cat "$out/checks.log" | grep -E "BAD|all checks|trace:|dropped_2.7B"
[ -f "$out/overhead.log" ] && grep -h "^-- overhead\|^== " "$out/overhead.log" | head -20

echo "results in $out"
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAILED parts: ${failed[*]}"
  exit 1
fi
echo "profile check: all parts passed"
