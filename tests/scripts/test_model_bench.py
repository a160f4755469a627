"""analysis/model_bench.py on a real llmhpc bench run (CPU, tiny, two contexts) and hand-written
PyTorch records in two JSON-lines files.

Checks that the step table shows llmhpc's mean step time read from the rank file with h5py,
each PyTorch setup's mean, `oom`/`not run` where PyTorch has no number, and the speed-up
over the fastest PyTorch setup that ran; that the first record of a configuration counts
when files repeat it; that the forward and backward table (the reference end-to-end
benchmark's eager against torch.compile table) shows llmhpc's forward and backward means
(backward named bwd+AdamW where AdamW ran inside it, bwd with --separate-optimizer), eager's and
compiled's, and compiled's speed-ups over eager in forward, backward and the step, `oom`/`not
run` and no speed-up where a setup has no number; and that the peak-memory table shows llmhpc's
peak and its ratio to the lowest PyTorch peak that ran. With --heat-s, every configuration ran
untimed steps after its warm-up, not only the first. The rank file's model_flops_fwd_bwd is the
FLOPs model_bench.py and analysis/scaling.py's MFU count (one definition).
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


def torch_record(ctx, setup, step_ms, peak_gib, status="ok", forward_ms=(), backward_ms=()):
    """A torch_baseline.py record; forward_ms and backward_ms per step where given."""
    record = {"tool": "pytorch", "model": "tiny", "context_length": ctx, "precision": "fp32", "setup": setup,
              "status": status, "step_ms": [step_ms, step_ms], "peak_memory_bytes": int(peak_gib * GiB)}
    if status == "ok" and forward_ms:
        record.update(forward_ms=list(forward_ms), backward_ms=list(backward_ms),
                      optimizer_ms=[s - f - b for s, f, b in zip(record["step_ms"], forward_ms, backward_ms)])
    return record


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
            ours[int(g.attrs["context_length"])] = (float(g["step_ms"][()].mean()), g.attrs["peak_memory_bytes"] / GiB,
                                                    float(g["forward_ms"][()].mean()), float(g["backward_ms"][()].mean()))
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
    # Forward and backward per step: compiled 0.5 and 1.0 ms (mean), eager 1.2 and 1.5 ms.
    with open(first, "w") as f:
        for r in (torch_record(16, "compiled", 2.0, 0.5, forward_ms=(0.4, 0.6), backward_ms=(1.1, 0.9)),
                  torch_record(16, "eager", 3.0, 0.75, forward_ms=(1.0, 1.4), backward_ms=(1.5, 1.5)),
                  torch_record(32, "compiled", 0.0, 9.0, "oom")):
            f.write(json.dumps(r) + "\n")
    with open(second, "w") as f:
        f.write(json.dumps(torch_record(16, "compiled", 100.0, 100.0, forward_ms=(50, 50), backward_ms=(40, 40))) + "\n")
    proc = run([sys.executable, MODEL_BENCH, out, first, second])
    tables = parse_markdown_tables(proc.stdout)
    steps = next(r for h, r in tables if h[:3] == ["Model", "Context", "llmhpc"])
    peaks = next(r for h, r in tables if h[:4] == ["Model", "Context", "Precision", "llmhpc"])
    phases = [(h, r) for h, r in tables if h[:3] == ["Model", "Context", "llmhpc fwd"]]
    assert len(phases) == 1, f"{len(phases)} forward and backward tables, expected one (fp32):\n{proc.stdout}"

    rows = {int(r[1]): r for r in steps}
    assert set(rows) == {16, 32}, f"step table rows {sorted(rows)}, expected contexts 16 and 32:\n{proc.stdout}"
    for ctx, (step, *_) in ours.items():
        assert abs(float(rows[ctx][2]) - step) <= 0.006, (rows[ctx], step)
    assert rows[16][3:5] == ["2.00", "3.00"], f"PyTorch columns {rows[16][3:5]}, expected the first file's 2.00, 3.00"
    assert abs(float(rows[16][5].rstrip("x")) - 2.0 / ours[16][0]) <= 0.006, (rows[16], ours[16])
    assert rows[32][3:] == ["oom", "not run", "-"], rows[32]

    # The forward and backward table: eager first, compiled beside it, compiled's speed-ups over eager.
    header, rows = phases[0]
    assert header == ["Model", "Context", "llmhpc fwd", "PyTorch eager fwd", "PyTorch compiled fwd",
                      "fwd speed-up compiled", "llmhpc bwd+AdamW", "PyTorch eager bwd", "PyTorch compiled bwd",
                      "bwd speed-up compiled", "step speed-up compiled"], header
    assert "llmhpc bwd+AdamW: without --separate-optimizer" in proc.stdout, proc.stdout
    rows = {int(r[1]): dict(zip(header, r)) for r in rows}
    assert set(rows) == {16, 32}, f"forward and backward rows {sorted(rows)}, expected contexts 16 and 32"
    for ctx, (_, _, forward, backward) in ours.items():
        assert abs(float(rows[ctx]["llmhpc fwd"]) - forward) <= 0.006, (rows[ctx], forward)
        assert abs(float(rows[ctx]["llmhpc bwd+AdamW"]) - backward) <= 0.006, (rows[ctx], backward)
    expected = {"PyTorch eager fwd": "1.20", "PyTorch compiled fwd": "0.50", "fwd speed-up compiled": "2.40x",
                "PyTorch eager bwd": "1.50", "PyTorch compiled bwd": "1.00", "bwd speed-up compiled": "1.50x",
                "step speed-up compiled": "1.50x"}
    assert {k: rows[16][k] for k in expected} == expected, f"context 16: {rows[16]}, expected {expected}"
    expected = {"PyTorch eager fwd": "not run", "PyTorch compiled fwd": "oom", "fwd speed-up compiled": "-",
                "PyTorch eager bwd": "not run", "PyTorch compiled bwd": "oom", "bwd speed-up compiled": "-",
                "step speed-up compiled": "-"}
    assert {k: rows[32][k] for k in expected} == expected, f"context 32: {rows[32]}, expected {expected}"

    # With --separate-optimizer llmhpc's backward is backward alone: its column says so, with no note.
    separate = os.path.join(tmp, "separate")
    run([BIN, "--mode", "bench", "--device", "cpu", "--model", "tiny", "--context-length", "16", "--batch-size", "2",
         "--warmup", "0", "--steps", "2", "--separate-optimizer", "--out", separate])
    with h5py.File(os.path.join(separate, "rank00000.h5"), "r") as f:
        backward = float(next(iter(f["bench"].values()))["backward_ms"][()].mean())
    text = run([sys.executable, MODEL_BENCH, separate, first]).stdout
    header, rows = next((h, r) for h, r in parse_markdown_tables(text) if h[:3] == ["Model", "Context", "llmhpc fwd"])
    assert "llmhpc bwd" in header and "llmhpc bwd+AdamW" not in header and "bwd+AdamW:" not in text, (header, text)
    assert abs(float(rows[0][header.index("llmhpc bwd")]) - backward) <= 0.006, (rows, backward)

    prow = {int(r[1]): r for r in peaks}
    assert abs(float(prow[16][3]) - ours[16][1]) <= 0.006, (prow[16], ours[16])
    assert prow[16][4:6] == ["0.50", "0.75"], prow[16]
    assert abs(float(prow[16][6]) - ours[16][1] / 0.5) <= 0.006, (prow[16], ours[16])
    assert prow[32][4:] == ["oom", "not run", "-"], prow[32]
    print("PASS")


if __name__ == "__main__":
    main()
