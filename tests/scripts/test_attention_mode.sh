#!/usr/bin/env bash
# End to end: llmhpc --mode attention --device cpu on tiny sizes. Checks exit 0, the summary
# table, one record per configuration (naive and flash, causal and not) with forward_ms,
# backward_ms, total_ms of length --steps and warm-up arrays of length --warmup, what each
# implementation saves (flash: L (B,H,T); naive: P (B,H,T,T)), and that flash's peak memory
# is below naive's. Then a sweep under --memory-limit where naive attention at T=2048 does
# not fit: recorded as "oom" while flash at the same T and the next configuration run.
# Then analysis/attention.py prints both kinds of tables, with OOM in the comparison. Last, its
# PyTorch tables from hand-written analysis/torch_attention.py files: the comparison with PyTorch's
# fused attention takes only the fused records (a record without `impl` is one), and the eager
# against torch.compile table pairs naive and compiled records of the same shape, one table per
# setting (bf16 first), with their medians, the speedup eager / compiled, OOM and N/A where one did
# not run, and both peaks; alone (no run directories) it prints only that table, and a file without
# such pairs is refused. Where PyTorch is importable, torch_attention.py --device cpu --impl
# naive,compiled runs tiny shapes (compiled once per shape, before its warm-up) into that table.
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

# 4. The PyTorch tables from hand-written torch_attention.py files.
"$PYTHON" - "$tmp" <<'EOF'
import json, os, sys
tmp = sys.argv[1]
MIB = 2**20
def rec(impl, precision, d, T, fwd=None, bwd=None, status="ok", peak_mib=1.0, batch=8, heads=1, causal=0):
    r = dict(precision=precision, batch=batch, heads=heads, head_dim=d, seq=T, causal=causal, impl=impl,
             backend=impl, status=status, peak_memory_bytes=int(peak_mib * MIB))
    if status == "ok":
        r.update(forward_ms=[fwd], backward_ms=[bwd], forward_ms_median=fwd, backward_ms_median=bwd)
    return r
results = [
    rec("naive", "bf16", 16, 256, 2.0, 6.0, peak_mib=100.0), rec("compiled", "bf16", 16, 256, 0.5, 2.0, peak_mib=60.0),
    rec("naive", "bf16", 16, 1024, status="oom", peak_mib=900.0), rec("compiled", "bf16", 16, 1024, 1.0, 2.0),
    rec("naive", "bf16", 32, 256, 1.5, 3.0), rec("compiled", "bf16", 32, 256, status="error: no kernel"),
    rec("naive", "bf16", 64, 256, 1.0, 1.0),  # no compiled record of its shape: no row
    rec("naive", "fp32", 16, 256, 3.0, 9.0), rec("compiled", "fp32", 16, 256, 1.0, 3.0),
    # fused records of the llmhpc run's shapes (fp32, B2, H2, D8, causal), one from before --impl
    rec("fused", "fp32", 8, 16, 0.1, 0.2, batch=2, heads=2, causal=1),
]
legacy = rec("fused", "fp32", 8, 37, 0.1, 0.2, batch=2, heads=2, causal=1)
del legacy["impl"]
results.append(legacy)
with open(os.path.join(tmp, "torch_compile.json"), "w") as f:
    json.dump(dict(device="test", torch="0", results=results), f)
with open(os.path.join(tmp, "torch_fused.json"), "w") as f:
    json.dump(dict(device="test", torch="0", results=[legacy]), f)
EOF
"$PYTHON" "$ROOT/analysis/attention.py" --torch "$tmp/torch_compile.json" >"$tmp/compile.md" ||
  { cat "$tmp/compile.md"; echo "FAIL: attention.py --torch alone exited non-zero"; exit 1; }
"$PYTHON" "$ROOT/analysis/attention.py" "$tmp/run" --torch "$tmp/torch_compile.json" >"$tmp/both.md" ||
  { echo "FAIL: attention.py with a run and --torch exited non-zero"; exit 1; }
cat "$tmp/compile.md"
"$PYTHON" - "$ROOT" "$tmp" <<'EOF'
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "reference"))
from script_env import parse_markdown_tables
tmp = sys.argv[2]
HEADER = ["head dim", "seq", "eager fwd", "compiled fwd", "fwd speedup", "eager bwd", "compiled bwd", "bwd speedup",
          "eager peak MiB", "compiled peak MiB"]
alone = open(os.path.join(tmp, "compile.md")).read()
titles = [line for line in alone.splitlines() if line.startswith("### ")]
assert [t.split(" (")[0] for t in titles] == [
    "### PyTorch naive attention, eager vs torch.compile, bf16, no mask, batch 8, 1 head(s)",
    "### PyTorch naive attention, eager vs torch.compile, fp32, no mask, batch 8, 1 head(s)"], titles
tables = parse_markdown_tables(alone)
assert [h for h, _ in tables] == [HEADER, HEADER], [h for h, _ in tables]
bf16 = {(r[0], r[1]): r for r in tables[0][1]}
assert sorted(bf16) == [("16", "1024"), ("16", "256"), ("32", "256")], f"rows {sorted(bf16)}: D64 has no compiled pair"
assert bf16[("16", "256")][2:] == ["2.000", "0.500", "4.00", "6.000", "2.000", "3.00", "100.0", "60.0"], bf16[("16", "256")]
assert bf16[("16", "1024")][2:8] == ["OOM", "1.000", "N/A", "OOM", "2.000", "N/A"], bf16[("16", "1024")]
assert bf16[("16", "1024")][8] == "oom (>900.0)", bf16[("16", "1024")]
assert bf16[("32", "256")][2:8] == ["1.500", "N/A", "N/A", "3.000", "N/A", "N/A"], bf16[("32", "256")]
assert tables[1][1] == [["16", "256", "3.000", "1.000", "3.00", "9.000", "3.000", "3.00", "1.0", "1.0"]], tables[1][1]
assert "llmhpc flash vs PyTorch" not in alone, "without a run there is no llmhpc to compare"
both = open(os.path.join(tmp, "both.md")).read()
fused = [rows for h, rows in parse_markdown_tables(both) if h[:1] == ["dtype"] and "torch fwd" in h]
assert len(fused) == 1 and sorted(r[4] for r in fused[0]) == ["16", "37"], f"fused records only: {fused}"
assert sum(h == HEADER for h, _ in parse_markdown_tables(both)) == 2, "the eager vs compiled tables beside a run"
print("PyTorch tables OK")
EOF
set +e
"$PYTHON" "$ROOT/analysis/attention.py" --torch "$tmp/torch_fused.json" >"$tmp/refused.md" 2>"$tmp/refused.err"
rc=$?
set -e
[ $rc -eq 2 ] && grep -q "no naive records with compiled ones" "$tmp/refused.err" ||
  { cat "$tmp/refused.md" "$tmp/refused.err"; echo "FAIL: a --torch file without naive and compiled pairs, alone: exit $rc"; exit 1; }

# 5. torch_attention.py --impl naive,compiled on the CPU, where PyTorch is importable.
if "$PYTHON" -c "import torch" 2>/dev/null; then
  "$PYTHON" "$ROOT/analysis/torch_attention.py" --device cpu --batch 2 --heads 1 --head-dim 8 --seq 16,24 \
    --precision fp32 --causal --impl naive,compiled --warmup 1 --iters 2 --out "$tmp/cpu_compile.json" >"$tmp/cpu.log" 2>&1 ||
    { cat "$tmp/cpu.log"; echo "FAIL: torch_attention.py --device cpu --impl naive,compiled exited non-zero"; exit 1; }
  "$PYTHON" - "$tmp/cpu_compile.json" <<'EOF'
import json, sys
results = json.load(open(sys.argv[1]))["results"]
assert [(r["impl"], r["seq"]) for r in results] == [("naive", 16), ("naive", 24), ("compiled", 16), ("compiled", 24)], results
for r in results:
    assert r["status"] == "ok", r
    assert len(r["forward_ms"]) == 2 and len(r["backward_ms"]) == 2 and min(r["forward_ms"] + r["backward_ms"]) > 0, r
    assert r["causal"] == 1 and r["peak_memory_bytes"] is None, r  # the CPU: no peak measured
    assert ("compile_s" in r) == (r["impl"] == "compiled") and r.get("compile_s", 1) > 0, r
print("torch_attention.py on the CPU OK")
EOF
  "$PYTHON" "$ROOT/analysis/attention.py" --torch "$tmp/cpu_compile.json" >"$tmp/cpu.md"
  cat "$tmp/cpu.md"
  grep -q "^### PyTorch naive attention, eager vs torch.compile, fp32, causal, batch 2, 1 head(s)" "$tmp/cpu.md" &&
    [ "$(grep -c '^| 8 | \(16\|24\) | [0-9.]* | [0-9.]* | [0-9.]* | ' "$tmp/cpu.md")" = 2 ] ||
    { echo "FAIL: no eager vs torch.compile table with both shapes from the CPU run"; exit 1; }
else
  echo "skipped: PyTorch is not importable here, so torch_attention.py's CPU run is not made"
fi
echo "PASS"
