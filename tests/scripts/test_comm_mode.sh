#!/usr/bin/env bash
# End to end: llmhpc --mode comm --backend mpi --check under mpirun -np 2 on small sizes,
# including sizes that are not whole elements or do not divide by the rank count. Checks
# exit 0, one rank file per rank, a record per collective/dtype/size/placement with
# time_us, algbw, busbw of length --steps, busbw = algbw * bus factor, a positive
# back-to-back mean, #wrong 0 everywhere, that analysis/comm.py prints one markdown row per
# configuration whose time is the rank average of the back-to-back means, and that --backend nccl
# without a GPU is a clean usage error.
set -euo pipefail
: "${LLMHPC_BIN:?set LLMHPC_BIN to the llmhpc binary}"
LLMHPC_BIN=$(realpath -m "$LLMHPC_BIN")  # absolute: the test runs in folders of its own
ROOT=${LLMHPC_ROOT:-$(cd "$(dirname "$0")/../.." && pwd)}
PYTHON=${LLMHPC_PYTHON:-python3}
MPIEXEC=${MPIEXEC:-mpirun}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 NCCL_NVLS_ENABLE=0
"$PYTHON" -c "import h5py" 2>/dev/null || { echo "SKIP: python3 has no h5py"; exit 77; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/run
ITERS=3
$MPIEXEC --oversubscribe -np 2 "$LLMHPC_BIN" --mode comm --device cpu --backend mpi --check \
  --collective all --precision fp32,bf16 --size 1003B,4KiB,64KB --warmup 1 --steps $ITERS --out "$out" >"$tmp/log" 2>&1 ||
  { cat "$tmp/log"; echo "FAIL: the comm run exited non-zero"; exit 1; }
cat "$tmp/log"
grep -q "comm summary (mpi, 2 rank(s)" "$tmp/log" || { echo "FAIL: no summary table on stdout"; exit 1; }

"$PYTHON" - "$out" "$ITERS" <<'EOF'
import os, sys
import h5py, numpy as np
out, iters = sys.argv[1], int(sys.argv[2])
files = sorted(f for f in os.listdir(out) if f.endswith(".h5"))
assert files == ["rank00000.h5", "rank00001.h5"], f"expected two rank files, got {files}"
factor = {"allreduce": 1.0, "reducescatter": 0.5, "allgather": 0.5, "broadcast": 1.0}  # 2 ranks
for name in files:
    with h5py.File(os.path.join(out, name), "r") as f:
        assert f.attrs["mode"] == "comm" and f.attrs["status"] == "complete", dict(f.attrs)
        groups = list(f["comm"])
        # 4 collectives x 2 dtypes x 3 sizes x 2 placements
        assert len(groups) == 48, f"{name}: {len(groups)} records: {groups}"
        for g in groups:
            rec = f["comm"][g]
            a = rec.attrs
            assert a["status"] == "ok", (g, a["status"])
            for ds in ("time_us", "algbw", "busbw"):
                assert rec[ds].shape == (iters,), (g, ds, rec[ds].shape)
            assert int(rec["wrong"][0]) == 0, f"{name} {g}: {rec['wrong'][0]} wrong elements"
            assert np.all(rec["time_us"][()] > 0), (g, rec["time_us"][()])
            assert rec["time_us_back_to_back"].shape == (1,) and rec["time_us_back_to_back"][0] > 0, g
            algbw = a["bytes"] / (rec["time_us"][()] * 1e3)
            assert np.allclose(rec["algbw"][()], algbw), g
            assert np.allclose(rec["busbw"][()], algbw * factor[a["collective"]]), g
            assert a["bus_factor"] == factor[a["collective"]], g
            # sizes round down to whole elements and equal chunks: 1003 B of float -> 250
            # elements; reduce-scatter/all-gather on 2 ranks -> 125 each, 1000 B.
            if a["requested_bytes"] == 1003 and a["dtype"] == "float":
                assert a["bytes"] == 1000, (g, a["bytes"])
                assert a["count"] == (125 if a["collective"] in ("reducescatter", "allgather") else 250), (g, a["count"])
print("rank files OK")
EOF

"$PYTHON" "$ROOT/analysis/comm.py" "$out" >"$tmp/table.md"
cat "$tmp/table.md"
rows=$(grep -c '^| mpi | 2 |' "$tmp/table.md")
[ "$rows" -eq 24 ] || { echo "FAIL: analysis/comm.py printed $rows rows, expected 24"; exit 1; }
if grep '^| mpi' "$tmp/table.md" | awk -F'|' '{print $13, $17}' | grep -qv '^ 0   0 $'; then
  echo "FAIL: a #wrong column is not 0"; exit 1
fi
# The table's time: the back-to-back mean averaged over the two ranks (all-reduce, float, 64KB, out of place).
"$PYTHON" - "$out" "$tmp/table.md" <<'EOF'
import os, sys
import h5py, numpy as np
out, table = sys.argv[1:]
means = []
for name in ("rank00000.h5", "rank00001.h5"):
    with h5py.File(os.path.join(out, name), "r") as f:
        means.append(f["comm/allreduce_float_64KB_outofplace/time_us_back_to_back"][0])
row = next(l for l in open(table) if l.startswith("| mpi | 2 | allreduce | 64000 |") and "| float |" in l)
shown, m = float(row.split("|")[9]), float(np.mean(means))
assert abs(shown - m) <= (0.006 if m < 100 else 0.06 if m < 10000 else 0.6), (row, means)  # printed rounded
print("table time = rank average of the back-to-back means:", shown)
EOF

# --backend nccl on the CPU device: a usage error (exit 2) with a message, no hang.
set +e
$MPIEXEC --oversubscribe -np 2 "$LLMHPC_BIN" --mode comm --device cpu --backend nccl --size 1KB \
  --out "$tmp/nccl" >"$tmp/nccl.log" 2>&1
rc=$?
set -e
[ $rc -eq 2 ] || { cat "$tmp/nccl.log"; echo "FAIL: --backend nccl on cpu exited $rc, expected 2"; exit 1; }
grep -q "backend nccl" "$tmp/nccl.log" || { cat "$tmp/nccl.log"; echo "FAIL: no message about --backend nccl"; exit 1; }
echo "PASS"
