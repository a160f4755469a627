#!/usr/bin/env bash
# End to end: llmhpc --mode attention --device cpu on tiny sizes. Checks exit 0, the summary
# table, one record per configuration (naive and flash, causal and not) with forward_ms,
# backward_ms, total_ms of length --steps and warm-up arrays of length --warmup, what each
# implementation saves (flash: L (B,H,T); naive: P (B,H,T,T)), and that flash's peak memory
# is below naive's. Then a sweep under --memory-limit where naive attention at T=2048 does
# not fit: recorded as "oom" while flash at the same T and the next configuration run.
# Finally analysis/attention.py prints both kinds of tables, with OOM in the comparison.
set -euo pipefail
: "${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}"
LLMHPC_BIN=$(realpath -m "$LLMHPC_BIN")  # absolute: the test runs in folders of its own
ROOT=${LLMHPC_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${LLMHPC_PYTHON:-python3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
"$PYTHON" -c "import h5py, pandas" 2>/dev/null || { echo "SKIP: python3 has no h5py or pandas"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# 1. A small sweep: 2 sequence lengths (one not a multiple of the CPU tile of 32) x causal
#    on/off x naive/flash.
"$LLMHPC_BIN" --mode attention --device cpu --batch-size 2 --num-heads 2 --head-dim 8 --context-length 16,37 \
  --causal=on,off --attention naive,flash --warmup 1 --steps 3 --out "$tmp/run" >"$tmp/log" 2>&1 ||
  { cat "$tmp/log"; echo "FAIL: the attention run exited non-zero"; exit 1; }
cat "$tmp/log"
grep -q "attention summary" "$tmp/log" || { echo "FAIL: no summary table on stdout"; exit 1; }

"$PYTHON" - "$tmp/run" <<'EOF'
import os, sys
import h5py
run = sys.argv[1]
with h5py.File(os.path.join(run, "rank00000.h5"), "r") as f:
    assert f.attrs["mode"] == "attention" and f.attrs["status"] == "complete", dict(f.attrs)
    groups = f["attention"]
    assert len(groups) == 8, list(groups)
    peaks = {}
    for name, g in groups.items():
        a = g.attrs
        assert a["status"] == "ok", (name, a["status"])
        assert a["batch"] == 2 and a["heads"] == 2 and a["head_dim"] == 8 and a["precision"] == "fp32", (name, dict(a))
        assert a["impl"] in ("naive", "flash") and a["causal"] in (0, 1) and a["seq"] in (16, 37), (name, dict(a))
        expected = f"{a['impl']}_fp32_B2_H2_T{a['seq']}_D8_{'causal' if a['causal'] else 'full'}"
        assert name == expected, (name, expected)
        for ds in ("forward_ms", "backward_ms", "total_ms"):
            assert g[ds].shape == (3,), (name, ds, g[ds].shape)
            assert (g[ds][()] > 0).all(), (name, ds, g[ds][()])
            assert g["warmup_" + ds].shape == (1,), (name, ds)
        T = a["seq"]
        saved = 2 * 2 * T * 4 * (T if a["impl"] == "naive" else 1)
        assert a["saved_bytes"] == saved, (name, a["saved_bytes"], saved)
        assert a["peak_memory_bytes"] > 0 and a["flops_forward"] > 0 and a["flops_backward"] > 0, (name, dict(a))
        peaks[(a["impl"], T, a["causal"])] = a["peak_memory_bytes"]
    for (impl, T, causal), peak in peaks.items():
        if impl == "flash":
            assert peak < peaks[("naive", T, causal)], ("flash peak not below naive", T, causal, peaks)
print("records OK")
EOF

# 2. Out of memory: naive attention at T=2048 needs 16 MiB of probabilities; the limit is 8MB.
"$LLMHPC_BIN" --mode attention --device cpu --batch-size 1 --num-heads 1 --head-dim 8 --context-length 64,2048,32 \
  --causal --attention naive,flash --warmup 0 --steps 1 --memory-limit 8MB --out "$tmp/oom" >"$tmp/oom.log" 2>&1 ||
  { cat "$tmp/oom.log"; echo "FAIL: the sweep with an oom exited non-zero"; exit 1; }
cat "$tmp/oom.log"
"$PYTHON" - "$tmp/oom" <<'EOF'
import os, sys
import h5py
with h5py.File(os.path.join(sys.argv[1], "rank00000.h5"), "r") as f:
    assert f.attrs["status"] == "complete", f.attrs["status"]
    status = {name: g.attrs["status"] for name, g in f["attention"].items()}
    assert len(status) == 6, status
    oom = "naive_fp32_B1_H1_T2048_D8_causal"
    assert status[oom] == "oom", status
    assert "forward_ms" not in f["attention"][oom], "an oom record must not hold timings"
    assert f["attention"][oom].attrs["error"], "an oom record names the allocation"
    assert "saved_bytes" not in f["attention"][oom].attrs, "the probabilities never allocated have no size"
    assert f["attention"][oom].attrs["peak_memory_bytes"] <= 8_000_000
    for name, s in status.items():
        if name != oom:
            assert s == "ok", (name, s)
    assert len(f["attention"]["naive_fp32_B1_H1_T32_D8_causal"]["total_ms"]) == 1, "the sweep must go on after the oom"
print("oom OK")
EOF

# 3. The analysis tables.
"$PYTHON" "$ROOT/analysis/attention.py" "$tmp/run" "$tmp/oom" >"$tmp/tables.md"
cat "$tmp/tables.md"
grep -q "^### naive attention, fp32, causal, batch 2" "$tmp/tables.md" || { echo "FAIL: no per-implementation table"; exit 1; }
grep -q "^### naive vs flash, fp32, causal, batch 1" "$tmp/tables.md" || { echo "FAIL: no comparison table"; exit 1; }
grep -q "^| 2048 | 8 | OOM |" "$tmp/tables.md" || { echo "FAIL: the comparison lacks the OOM row"; exit 1; }
echo "PASS"
