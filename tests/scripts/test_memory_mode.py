"""Modes memory and precision end to end on the CPU.

memory: the trace in the rank file is balanced (the running sum of the deltas is the live
column, every allocation is freed or still live at the end, the recorded peak is the running
maximum), tags name the tensors (layer 0's residual input is B*T*d_model*4 bytes, taken by each
step's forward and freed as its backward ends; the largest allocations name each tag once), the
phases are the traced step's; the --snapshot pickle uses only the opcodes memory_viz's
JavaScript unpickler reads, loads with pickle.load and has the fields the viewer needs; where
PyTorch is importable, torch.cuda._memory_viz's own functions read it. analysis/memory.py and
plot_memory.py make their tables and write PNGs where they are told. precision: the reference
mixed-precision study's four accumulation values and the bf16 one, and the dtype table agreeing with autocast
but for naive attention's probabilities, kept in bf16 (named, with what that does).
memory --tp 1,2 on 2 ranks: each rank traces its part, and --sequence-parallel halves its residual
stream. Bad --snapshot paths and phases are refused before anything runs.
"""
import os
import pickle
import pickletools
import shutil
import subprocess
import sys

import h5py
import numpy as np

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "analysis"))
from script_env import llmhpc_binary, mpiexec, parse_markdown_tables, run, scratch_dir  # noqa: E402

BIN = llmhpc_binary()
MODEL = ["--d-model", "64", "--d-ff", "128", "--num-layers", "2", "--num-heads", "4", "--vocab-size", "300"]
# The opcodes of MemoryViz.js's unpickler (pytorch torch/utils/viz/MemoryViz.js).
VIEWER_OPCODES = {"PROTO", "FRAME", "EMPTY_DICT", "EMPTY_LIST", "EMPTY_TUPLE", "MARK", "SETITEMS", "SETITEM",
                  "APPENDS", "APPEND", "BININT", "BININT1", "BININT2", "LONG1", "SHORT_BINUNICODE", "BINUNICODE",
                  "BINFLOAT", "NONE", "NEWTRUE", "NEWFALSE", "MEMOIZE", "BINPUT", "BINGET", "LONG_BINGET",
                  "LONG_BINPUT", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3", "LIST", "DICT", "STOP"}


def check_trace(name, g):
    delta, live = g["event_delta_bytes"][()], g["event_live_bytes"][()]
    assert np.array_equal(np.cumsum(delta), live), f"{name}: the live column is not the running sum of the deltas"
    assert g.attrs["trace_balanced"] == 1, f"{name}: the mode says its trace is not balanced"
    assert live.max() == g.attrs["peak_memory_bytes"], \
        f"{name}: peak {g.attrs['peak_memory_bytes']} != running maximum {live.max()}"
    assert live[-1] == g.attrs["live_at_end_bytes"], f"{name}: live at the end {live[-1]} != the allocator's"
    open_ = {}
    for a, d, t in zip(g["event_address"][()], delta, g["event_tag"].asstr()[()]):
        if d >= 0:
            assert a not in open_, f"{name}: {t} allocated at {a:#x} while {open_.get(a)} is live there"
            open_[a] = (t, d)
        else:
            assert open_.get(a, (None, None)) == (t, -d), f"{name}: a free of {t} ({-d} B) that was never allocated"
            del open_[a]
    assert sum(d for _, d in open_.values()) == live[-1], f"{name}: the allocations left open are not the live bytes"
    tags = set(g["event_tag"].asstr()[()])
    for t in ("params", "activations.layers.0.resid", "activations.layers.1.attn.qkv", "activations.logits"):
        assert t in tags, f"{name}: no allocation tagged {t}; tags: {sorted(tags)}"
    # Activations live from a forward to the end of its backward: every step takes layer 0's
    # residual input in forward and gives it back in backward; a forward-only step gives it
    # back before the next one takes it again, so the traced forward's events are its own.
    resid = [(d, p) for t, d, p in zip(g["event_tag"].asstr()[()], delta, g["event_phase"].asstr()[()])
             if t == "activations.layers.0.resid"]
    want = g.attrs["residual_activation_bytes"]
    assert want == 2 * int(g.attrs["context_length"]) * 64 * 4, f"{name}: residual_activation_bytes {want}"
    steps = int(g.attrs["warmup"]) + 1
    expected = [(want, "warmup"), (-want, "warmup")] * (steps - 1) + [(want, "forward")]
    if g.attrs["phase"] != "forward":
        expected.append((-want, "backward"))
    assert resid == expected, f"{name}: layer 0's residual input {resid}, expected {expected}"
    assert g.attrs["peak_phase"] in ("forward", "backward"), f"{name}: the peak named in {g.attrs['peak_phase']}"
    phases = list(g["phase_name"].asstr()[()])
    expected = ["init", "warmup", "forward"] + (["backward"] if g.attrs["phase"] != "forward" else [])
    assert phases == expected, f"{name}: phases {phases}, expected {expected}"
    assert np.all(g["phase_peak_bytes"][()] <= g.attrs["peak_memory_bytes"]), f"{name}: a phase peak above the peak"
    cats = dict(zip(g["peak_category"].asstr()[()], g["peak_category_bytes"][()]))
    assert sum(cats.values()) == g.attrs["peak_memory_bytes"], f"{name}: the categories {cats} do not sum to the peak"
    sizes = g["largest_bytes"][()]
    assert len(sizes) == 3 and np.all(np.diff(sizes) <= 0), f"{name}: largest allocations {sizes}"
    assert g["largest_tag"].asstr()[0] == "params", f"{name}: the largest allocation is not the parameters"
    largest = list(g["largest_tag"].asstr()[()])
    assert len(set(largest)) == len(largest), f"{name}: a tag listed twice among the largest: {largest}"


def check_snapshot(path, g):
    data = open(path, "rb").read()
    used = {op.name for op, _, _ in pickletools.genops(data)}
    assert used <= VIEWER_OPCODES, f"{path}: opcodes memory_viz cannot read: {used - VIEWER_OPCODES}"
    snap = pickle.loads(data)
    assert set(snap) >= {"segments", "device_traces"}, f"{path}: keys {list(snap)}"
    trace = snap["device_traces"][0]
    actions = {e["action"] for e in trace}
    assert {"alloc", "free_requested", "free_completed"} <= actions or {"alloc"} <= actions, f"{path}: {actions}"
    for e in trace:
        assert {"action", "addr", "size", "stream", "frames"} <= set(e), f"{path}: event {e}"
        assert all(set(f) == {"filename", "line", "name"} for f in e["frames"]), f"{path}: frames {e['frames']}"
    allocs = [e for e in trace if e["action"] == "alloc"]
    n_allocs = int(np.sum(g["event_delta_bytes"][()] >= 0))
    assert len(allocs) == n_allocs, f"{path}: {len(allocs)} alloc events, the rank file has {n_allocs}"
    live = sum(b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "active_allocated")
    assert live == g.attrs["live_at_end_bytes"], f"{path}: live blocks {live} B, the rank file {g.attrs['live_at_end_bytes']}"
    assert any(e["frames"][0]["name"] == "activations.layers.0.resid" for e in allocs), f"{path}: no tag in frames"
    try:
        import torch  # noqa: F401
        from torch.cuda import _memory_viz
    except ImportError:
        print("(PyTorch not importable: torch.cuda._memory_viz not run over the snapshot)")
        return
    _memory_viz.segsum(snap)
    _memory_viz.trace(snap)
    html = _memory_viz.trace_plot(snap) + _memory_viz.segment_plot(snap)
    assert "snapshot.pickle" in html, "torch.cuda._memory_viz could not render the snapshot"
    print("torch.cuda._memory_viz read the snapshot")


def memory_mode(tmp):
    out, snap = os.path.join(tmp, "mem"), os.path.join(tmp, "snap.pickle")
    proc = run([BIN, "--mode", "memory", "--device", "cpu", *MODEL, "--context-length", "16,32", "--batch-size", "2",
                "--phase", "forward,train-step", "--top", "3", "--snapshot", snap, "--out", out])
    assert "peak memory by context length x precision" in proc.stdout, proc.stdout
    with h5py.File(os.path.join(out, "rank00000.h5"), "r") as f:
        groups = dict(f["memory"].items())
        assert len(groups) == 4, f"memory records {list(groups)}"
        for name, g in groups.items():
            assert g.attrs["status"] == "ok", f"{name}: {g.attrs['status']}"
            check_trace(name, g)
            check_snapshot(os.path.join(tmp, f"snap.{name}.pickle"), g)
        fwd, step = (next(g for g in groups.values() if g.attrs["context_length"] == 32 and g.attrs["phase"] == ph)
                     for ph in ("forward", "train-step"))
        assert fwd.attrs["peak_memory_bytes"] < step.attrs["peak_memory_bytes"], "forward's peak not below the step's"

    # One configuration: the detail tables, and a snapshot under its own name.
    one = os.path.join(tmp, "one.pickle")
    proc = run([BIN, "--mode", "memory", "--device", "cpu", *MODEL, "--phase", "train-step", "--snapshot", one,
                "--out", os.path.join(tmp, "one")])
    for text in ("memory by phase", "by category", "largest allocations"):
        assert text in proc.stdout, f"no '{text}' table for one configuration:\n{proc.stdout}"
    pickle.load(open(one, "rb"))

    # The analysis: tables and PNGs where asked, never in the working directory.
    png = os.path.join(tmp, "png")
    proc = run([sys.executable, os.path.join(ROOT, "analysis", "memory.py"), out, "--png", png])
    tables = parse_markdown_tables(proc.stdout)
    header, rows = tables[0]
    assert header[-2:] == ["forward fp32 (MiB)", "train-step fp32 (MiB)"] and len(rows) == 2, tables[0]
    assert [r[header.index("Context")] for r in rows] == ["16", "32"] and rows[0][0] == "d64_ff128_L2_H4", tables[0]
    largest = next(rows for header, rows in tables if header[:2] == ["Configuration", "tag"])
    assert len(largest) == 4 * 3 and sum(1 for r in largest if r[0]) == 4, largest  # --top 3: all the file holds
    assert len([p for p in os.listdir(png) if p.endswith(".png")]) == 4, os.listdir(png)
    here = os.path.join(tmp, "cwd")
    os.makedirs(here)
    subprocess.run([sys.executable, os.path.join(ROOT, "analysis", "plot_memory.py"), out], cwd=here, check=True)
    assert not os.listdir(here), f"plot_memory.py wrote into the working directory: {os.listdir(here)}"
    assert len([p for p in os.listdir(out) if p.endswith(".png")]) == 4, os.listdir(out)
    import memory
    sec_dir = os.path.join(tmp, "section")
    text = memory.report_section([out], sec_dir)
    assert "Peak memory" in text and len(os.listdir(sec_dir)) == 4, (text, os.listdir(sec_dir))

    # A run stopped in a configuration: the record it was measuring says so and holds no peak.
    stopped = os.path.join(tmp, "stopped")
    shutil.copytree(out, stopped)
    with h5py.File(os.path.join(stopped, "rank00000.h5"), "a") as f:
        cut = f["memory"][sorted(f["memory"])[-1]]
        cut.attrs["status"] = "interrupted"
        del cut.attrs["peak_memory_bytes"]
    proc = run([sys.executable, os.path.join(ROOT, "analysis", "memory.py"), stopped])
    header, rows = parse_markdown_tables(proc.stdout)[0]
    assert sum(r.count("interrupted") for r in rows) == 1, (header, rows)


def precision_mode(tmp):
    for prec, attention in (("bf16", "flash"), ("bf16", "naive"), ("fp32", "flash")):
        out = os.path.join(tmp, "prec-" + prec + "-" + attention)
        proc = run([BIN, "--mode", "precision", "--device", "cpu", *MODEL, "--precision", prec, "--attention", attention,
                    "--out", out])
        with h5py.File(os.path.join(out, "rank00000.h5"), "r") as f:
            sums = f["precision/accumulation/sum"][()]
            names = list(f["precision/accumulation/experiment"].asstr()[()])
            # The reference study's four cases in its order (the 4th: the fp16 values cast to fp32
            # before each add), then bf16.
            assert names == ["fp32 values, fp32 sum", "fp16 values, fp16 sum", "fp16 values, fp32 sum",
                             "fp16 values cast to fp32, fp32 sum", "bf16 values, bf16 sum"], names
            printed = [f"{v:.4f}" for v in sums[:4]]
            assert printed == ["10.0001", "9.9531", "10.0021", "10.0021"], f"accumulation {printed}"
            assert sums[4] == 4.0, f"bf16 sum {sums[4]}, expected 4 (bf16 stalls where 0.01 < half its spacing)"
            t = f["precision/dtypes"]
            rows = dict(zip(t["tensor"].asstr()[()], t["llmhpc_dtype"].asstr()[()]))
            # One difference on purpose: naive attention keeps its probabilities in bf16 (autocast: fp32).
            differ = {k for k, same in zip(rows, t["same_values"][()]) if not same}
            naive_bf16 = prec == "bf16" and attention == "naive"
            expected = {"attention probabilities (softmax output, kept for backward)"} if naive_bf16 else set()
            assert differ == expected, f"{prec}: rows that differ from autocast: {differ}"
            notes = dict(zip(rows, t["note"].asstr()[()]))
            assert all(notes[k].startswith("half the bytes") for k in differ), notes
            if prec == "fp32":
                assert set(rows.values()) == {"fp32"}, rows
            else:
                for k in ("parameters (master weights)", "embedding output, residual stream", "loss",
                          "parameter gradients"):
                    assert rows[k] == "fp32", f"{k}: {rows[k]}"
                for k in ("logits (LM head output)", "attention q, k, v projections", "FFN block output (W2)"):
                    assert rows[k] == "bf16", f"{k}: {rows[k]}"
        assert "9.9531" in proc.stdout and "autocast" in proc.stdout, proc.stdout
        # report.py's section (analysis/precision.py): the same tables from the rank file, the
        # sums printed as the binary prints them
        import precision
        text = precision.report_section([out], os.path.join(tmp, "prec-section"))
        tables = parse_markdown_tables(text)
        assert len(tables) == 2, text
        (acc_header, acc_rows), (dt_header, dt_rows) = tables
        printed = [row[acc_header.index("As PyTorch prints it")] for row in acc_rows]
        assert printed == ["10.0001", "9.9531", "10.0021", "10.0021", "4."], printed
        for shown in printed:
            assert f" {shown} " in proc.stdout, f"the binary does not print {shown}:\n{proc.stdout}"
        assert dict((r[0], r[1]) for r in dt_rows) == rows, f"{prec}: the section's dtypes differ from the file"
        assert [r[3].startswith("**no**: half the bytes") for r in dt_rows if r[3] != "yes"] == [True] * len(expected), \
            f"{prec} {attention}: the section names the difference: {dt_rows}"
    assert precision.torch_print(3e-05) == "3.0000e-05" and precision.torch_print(4.6e9) == "4.6000e+09"


def tensor_parallel(tmp):
    """--tp 1,2 on 2 ranks: each rank traces its part (its weights about half of one rank's, the
    vocabulary padded), the group stepping together; with --sequence-parallel each
    rank keeps half the residual stream (its allocated input of layer 0 and the attribute) and
    less activation memory at the peak. analysis/memory.py gives each layout a row."""
    def traced(out, *extra):
        run(mpiexec() + ["-np", "2", BIN, "--mode", "memory", "--device", "cpu", *MODEL, "--context-length", "16",
                         "--batch-size", "2", "--phase", "train-step", *extra, "--out", out])
        found = {}
        for rank in (0, 1):
            with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
                for name, g in f["memory"].items():
                    assert g.attrs["status"] == "ok" and g.attrs["tp_rank"] == rank % g.attrs["tp"], (name, dict(g.attrs))
                    assert g.attrs["trace_balanced"] == 1, name
                    phases = list(g["phase_name"].asstr()[()])  # AdamW after backward under --tp
                    assert phases == ["init", "warmup", "forward", "backward"] + (["optimizer"] if g.attrs["tp"] > 1 else []), phases
                    tags, deltas = g["event_tag"][()], g["event_delta_bytes"][()]
                    resid = next(int(d) for t, d in zip(tags, deltas) if t == b"activations.layers.0.resid" and d > 0)
                    cats = dict(zip(g["peak_category"][()], g["peak_category_bytes"][()]))
                    found[(name, rank)] = dict(g.attrs, resid=resid, activations=int(cats[b"saved activations"]),
                                               params=int(cats[b"parameters"]))
        return found
    plain = traced(os.path.join(tmp, "tp"), "--tp", "1,2")
    sp = traced(os.path.join(tmp, "tp-sp"), "--tp", "2", "--sequence-parallel")
    one = plain[("d64_ff128_L2_H4_T16_B2_fp32_naive_train-step", 0)]
    for rank in (0, 1):
        part = plain[("d64_ff128_L2_H4_T16_B2_fp32_naive_tp2_train-step", rank)]
        split = sp[("d64_ff128_L2_H4_T16_B2_fp32_naive_tp2sp_train-step", rank)]
        assert 0.45 * one["params"] < part["params"] < 0.55 * one["params"], (one["params"], part["params"])
        assert split["resid"] == part["resid"] // 2 == split["residual_activation_bytes"], (split, part)
        assert split["activations"] < part["activations"], (split["activations"], part["activations"])
    text = run([sys.executable, os.path.join(ROOT, "analysis", "memory.py"), os.path.join(tmp, "tp")]).stdout
    models = [r[0] for r in parse_markdown_tables(text)[0][1]]
    assert models == ["d64_ff128_L2_H4", "d64_ff128_L2_H4 tp2"], text


def bad_input(tmp):
    for args, words in ((["--snapshot", os.path.join(tmp, "no", "such", "dir", "s.pickle")], "--snapshot"),
                        (["--phase", "sideways"], "phase")):
        out = os.path.join(tmp, "bad")
        proc = run([BIN, "--mode", "memory", "--device", "cpu", *MODEL, *args, "--out", out], expect_ok=False,
                   timeout=60)
        assert proc.returncode != 0 and words in proc.stderr + proc.stdout, (args, proc.returncode, proc.stderr)
        assert not os.path.exists(os.path.join(out, "rank00000.h5")), f"{args}: a rank file was written"


def main():
    tmp = scratch_dir("llmhpc-memory-")
    memory_mode(tmp)
    precision_mode(tmp)
    tensor_parallel(tmp)
    bad_input(tmp)
    print("PASS")


if __name__ == "__main__":
    main()
