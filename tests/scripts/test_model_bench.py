"""analysis/model_bench.py on a real llmhpc bench run (CPU, tiny, two contexts) and hand-written
PyTorch records in two JSON-lines files.

Checks that the step table shows llmhpc's mean step time read from the rank file with h5py,
each PyTorch setup's mean, `oom`/`not run` where PyTorch has no number, and the speed-up
over the fastest PyTorch setup that ran; that the first record of a configuration counts
when files repeat it; and that the peak-memory table shows llmhpc's peak and its ratio to the
lowest PyTorch peak that ran. With --heat-s, every configuration ran untimed steps after its
warm-up, not only the first. The rank file's model_flops_fwd_bwd is the FLOPs model_bench.py and
analysis/scaling.py's MFU count (one definition).
"""
import json
import os
import sys

import h5py

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "analysis"))
import model_bench  # noqa: E402
import scaling  # noqa: E402
from script_env import llmhpc_binary, parse_markdown_tables, run, scratch_dir  # noqa: E402

BIN = llmhpc_binary()
MODEL_BENCH = os.path.join(ROOT, "analysis", "model_bench.py")
GiB = 2**30


def torch_record(ctx, setup, step_ms, peak_gib, status="ok"):
    return {"tool": "pytorch", "model": "tiny", "context_length": ctx, "precision": "fp32", "setup": setup,
            "status": status, "step_ms": [step_ms, step_ms], "peak_memory_bytes": int(peak_gib * GiB)}


def main():
    tmp = scratch_dir("llmhpc-model-bench-")
    out = os.path.join(tmp, "run")
    run([BIN, "--mode", "bench", "--device", "cpu", "--model", "tiny", "--context-length", "16,32", "--batch-size", "2",
         "--warmup", "1", "--steps", "2", "--heat-s", "0.05", "--out", out])
    ours = {}
    with h5py.File(os.path.join(out, "rank00000.h5"), "r") as f:
        heat = {int(g.attrs["context_length"]): int(g.attrs.get("heat_steps", 0)) for g in f["bench"].values()}
        assert sorted(heat) == [16, 32] and min(heat.values()) >= 1, f"every configuration heats: {heat}"
        for g in f["bench"].values():
            ours[int(g.attrs["context_length"])] = (float(g["step_ms"][()].mean()), g.attrs["peak_memory_bytes"] / GiB)
            # One definition of the model's FLOPs: the rank file's, model_bench.py's and the MFU's.
            a = dict(g.attrs)
            tokens = a["batch_size"] * a["context_length"]
            counted = (model_bench.model_flops_fwd_bwd(a["d_model"], a["d_ff"], a["num_layers"], a["vocab_size"],
                                                       a["context_length"], a["batch_size"]),
                       scaling.flops_per_token(a) * tokens)
            assert all(abs(c - a["model_flops_fwd_bwd"]) <= 1e-9 * c for c in counted), (a["model_flops_fwd_bwd"], counted)

    # Context 16: both setups ran (compiled is the faster and the smaller); context 32: compiled
    # ran out of memory, eager was not run. The second file repeats context 16 with other
    # numbers, which must not count.
    first, second = os.path.join(tmp, "a.jsonl"), os.path.join(tmp, "b.jsonl")
    with open(first, "w") as f:
        for r in (torch_record(16, "compiled", 2.0, 0.5), torch_record(16, "eager", 3.0, 0.75),
                  torch_record(32, "compiled", 0.0, 9.0, "oom")):
            f.write(json.dumps(r) + "\n")
    with open(second, "w") as f:
        f.write(json.dumps(torch_record(16, "compiled", 100.0, 100.0)) + "\n")
    proc = run([sys.executable, MODEL_BENCH, out, first, second])
    tables = parse_markdown_tables(proc.stdout)
    steps = next(r for h, r in tables if h[:3] == ["Model", "Context", "llmhpc"])
    peaks = next(r for h, r in tables if h[:4] == ["Model", "Context", "Precision", "llmhpc"])

    rows = {int(r[1]): r for r in steps}
    assert set(rows) == {16, 32}, f"step table rows {sorted(rows)}, expected contexts 16 and 32:\n{proc.stdout}"
    for ctx, (step, _) in ours.items():
        assert abs(float(rows[ctx][2]) - step) <= 0.006, (rows[ctx], step)
    assert rows[16][3:5] == ["2.00", "3.00"], f"PyTorch columns {rows[16][3:5]}, expected the first file's 2.00, 3.00"
    assert abs(float(rows[16][5].rstrip("x")) - 2.0 / ours[16][0]) <= 0.006, (rows[16], ours[16])
    assert rows[32][3:] == ["oom", "not run", "-"], rows[32]

    prow = {int(r[1]): r for r in peaks}
    assert abs(float(prow[16][3]) - ours[16][1]) <= 0.006, (prow[16], ours[16])
    assert prow[16][4:6] == ["0.50", "0.75"], prow[16]
    assert abs(float(prow[16][6]) - ours[16][1] / 0.5) <= 0.006, (prow[16], ours[16])
    assert prow[32][4:] == ["oom", "not run", "-"], prow[32]
    print("PASS")


if __name__ == "__main__":
    main()
