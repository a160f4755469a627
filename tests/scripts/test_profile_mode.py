"""End to end: llmhpc --mode profile under mpirun -np 2 on the CPU, its trace, and analysis/kernel_profile.py.

A tiny custom model, two context lengths, train steps, --trace. Checks, reading the files with
h5py alone: every rank file has both records ok, with the untraced and traced step arrays of
--steps elements; its activity stream has `activities` rows, every row's name, phase, range
and step inside the tables (the phase ids in the phase table, each activity's phase that of its
range, steps 0..steps-1), starts before ends, inside its range's times; the ops per layer phase
are the model's (4 linear_forward per layer forward, 5 linear_backward per layer backward).
The trace of each rank parses as JSON: every event has ph, ts, dur, pid, tid and name, one
complete event per activity on the ops track, every phase range on the phase tracks.
Rank 0's report prints each configuration's drift (its untraced steps after the traced ones
against those before), as its rank file's step times give it.
analysis/kernel_profile.py prints kernel tables whose Time column sums to 100% when every name is
listed, an overview with a matmul share equal to the raw activities' and the drift of the raw
steps, and writes the markdown and the PNG into --out (never the working directory);
report_section gives the same. With --tp 1,2 --sequence-parallel each rank profiles its part too
(records labelled _tp2sp, with tp, tp_rank and sequence_parallel). --no-cupti records phases only; --trace=FILE.json writes that file. Bad options (--top 0, --steps 0,
--trace=x.txt, --trace in a missing directory, --phase bogus) exit 2 at once with a message
naming the option, and leave no files. jobs/profile.sh runs a tiny model end to end.
"""
import importlib.util
import json
import os
import re
import sys

import h5py
import numpy as np

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from script_env import llmhpc_binary, mpiexec, parse_markdown_tables, run, scratch_dir  # noqa: E402

BIN = llmhpc_binary()
PROFILE_PY = os.path.join(ROOT, "analysis", "kernel_profile.py")
LAYERS, STEPS, WARMUP, CONTEXTS = 2, 2, 1, (8, 16)
MODEL = ["--d-model", "32", "--d-ff", "64", "--num-layers", str(LAYERS), "--num-heads", "4", "--vocab-size", "64",
         "--batch-size", "2", "--context-length", ",".join(map(str, CONTEXTS))]


def profile(np_, out, *extra, expect_ok=True):
    return run(mpiexec() + ["-np", str(np_), BIN, "--mode", "profile", "--device", "cpu", *MODEL, "--warmup",
                            str(WARMUP), "--steps", str(STEPS), *extra, "--out", out], expect_ok=expect_ok)


def drift_pct(step_ms):
    """The untraced steps run after the traced ones (the last floor(n/2)) against those run before
    (the first ceil(n/2)), medians, %."""
    u, k = np.asarray(step_ms), (len(step_ms) + 1) // 2
    return 100.0 * (np.median(u[k:]) / np.median(u[:k]) - 1.0)


def text(values):
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def check_record(f, label, backward_ops=5):
    rec, stream = f[f"profile/{label}"], f[f"profile_kernels/{label}"]
    assert rec.attrs["status"] == "ok" and stream.attrs["status"] == "ok", (dict(rec.attrs), dict(stream.attrs))
    assert rec.attrs["profiler"] == "host ops", rec.attrs["profiler"]
    for name in ("step_ms", "forward_ms", "backward_ms", "optimizer_ms", "traced_step_ms", "traced_forward_ms"):
        assert rec[name].shape == (STEPS,), (name, rec[name].shape)
    assert rec["warmup_step_ms"].shape == (WARMUP,)
    names, paths = text(rec["names"][()]), text(rec["phase_path"][()])
    assert len(text(rec["name_category"][()])) == len(names) == len(rec["name_kind"])
    cols = {k: stream[k][()] for k in stream}
    rows = int(stream.attrs["stream_rows"])
    assert rows == rec.attrs["activities"] > 0, (rows, rec.attrs["activities"])
    assert all(len(c) == rows for c in cols.values()), {k: len(c) for k, c in cols.items()}
    assert rec.attrs["dropped_records"] == 0 and rec.attrs["unattributed_activities"] == 0
    # Every id inside its table; each activity's phase and step those of its range, inside its times.
    assert ((cols["name"] >= 0) & (cols["name"] < len(names))).all()
    assert ((cols["phase"] >= 0) & (cols["phase"] < len(paths))).all(), "a phase id outside the phase table"
    range_phase, range_step = rec["range_phase"][()], rec["range_step"][()]
    assert ((range_phase >= 0) & (range_phase < len(paths))).all()
    assert ((cols["range"] >= 0) & (cols["range"] < len(range_phase))).all()
    assert (range_phase[cols["range"]] == cols["phase"]).all() and (range_step[cols["range"]] == cols["step"]).all()
    assert set(cols["step"]) == set(range(STEPS)), set(cols["step"])
    assert (cols["start_ns"] <= cols["end_ns"]).all()
    assert (rec["range_host_start_ns"][()][cols["range"]] <= cols["start_ns"]).all()
    assert (cols["end_ns"] <= rec["range_host_end_ns"][()][cols["range"]]).all()
    parents = rec["phase_parent"][()]
    for k, path in enumerate(paths):
        assert parents[k] == -1 or path.startswith(paths[parents[k]] + "/"), (path, parents[k])
    # The model's ops per layer (src/model/transformer.cpp); under tensor parallelism backward splits
    # q/k/v's and w1/w3's products in two, the input gradient's begun (and reduced) before the weights'.
    for layer in range(LAYERS):
        for phase, op, per_step in (("forward", "linear_forward", 4), ("backward", "linear_backward", backward_ops)):
            where = paths.index(f"step/{phase}/layer {layer}")
            n = int(((cols["phase"] == where) & (cols["name"] == names.index(op))).sum())
            assert n == per_step * STEPS, (phase, layer, op, n)
    return rows, len(range_phase)


def check_trace(path, activities, ranges):
    with open(path) as f:
        events = json.load(f)
    assert isinstance(events, list) and events, path
    complete = [e for e in events if e["ph"] == "X"]
    for e in complete:
        missing = {"ph", "ts", "dur", "pid", "tid", "name"} - set(e)
        assert not missing and e["dur"] >= 0, (missing, e)
    ops = [e for e in complete if e["tid"] >= 10]
    host, device = [e for e in complete if e["tid"] == 1], [e for e in complete if e["tid"] == 2]
    assert len(ops) == activities, (len(ops), activities)
    assert len(host) == len(device) == ranges, (len(host), len(device), ranges)
    assert all("phase" in e["args"] and "step" in e["args"] for e in ops)
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert all((e["pid"], e["tid"]) in names for e in complete), "a track without a name"


def check_analysis(out):
    plots = os.path.join(out, "plots")
    proc = run([sys.executable, PROFILE_PY, out, "--rank", "1", "--top", "1000", "--out", plots])
    with open(os.path.join(plots, "profile_rank1.md")) as f:
        assert f.read().strip() in proc.stdout, "the markdown file is what was printed"
    tables = parse_markdown_tables(proc.stdout)
    kernel_tables = [rows for header, rows in tables if header[:2] == ["Time", "Total Time"]]
    assert len(kernel_tables) == 4 * len(CONTEXTS), f"forward, backward, optimizer, step each:\n{proc.stdout}"
    for rows in kernel_tables:
        total = sum(float(r[0].rstrip("%")) for r in rows)
        assert abs(total - 100.0) < 0.05 * len(rows) + 1e-9, (total, rows)
    sys.path.insert(0, os.path.join(ROOT, "analysis"))
    import llmhpc_h5
    label = f"d32_ff64_L{LAYERS}_H4_T{CONTEXTS[0]}_B2_fp32_naive"
    section = next(part for part in proc.stdout.split("### ") if part.startswith(label + " "))
    shares = next(rows for header, rows in parse_markdown_tables(section) if header[-1] == "Matmul share")
    # What the share leaves out, said once, under the overview.
    assert proc.stdout.count("Matmul share: category matmul's time") == 1, proc.stdout
    assert "Not split into scores, softmax and value product: on the CPU" in section, section
    acts = llmhpc_h5.open_run(out).profile_activities(label, rank=1)
    matmul = acts.loc[acts["category"] == "matmul", "duration_ns"].sum() / acts["duration_ns"].sum()
    step_row = next(r for r in shares if r[0] == "step")
    assert abs(float(step_row[-1].rstrip("%")) - 100.0 * matmul) < 0.051, (step_row, matmul)
    overview = next(rows for header, rows in tables if header[:2] == ["Model", "Context"])
    assert sorted(r[1] for r in overview) == sorted(map(str, CONTEXTS)) and all(r[6] == "ok" for r in overview)
    first = next(r for r in overview if r[1] == str(CONTEXTS[0]))
    assert abs(float(first[12].rstrip("%")) - 100.0 * matmul) < 0.051, (first, matmul)
    rec = llmhpc_h5.open_run(out).profile_record(label, rank=1)
    drift = drift_pct(rec.arrays["step_ms"])
    assert abs(float(first[10].rstrip("%")) - drift) < 0.051, (first, drift)
    steps = len(rec.arrays["traced_step_ms"])
    busy = 100.0 * acts["duration_ns"].sum() / 1e6 / steps / float(np.median(rec.arrays["traced_step_ms"]))
    assert abs(float(first[14].rstrip("%")) - busy) < 0.051, (first, busy)
    assert os.path.getsize(os.path.join(plots, "profile_rank1.png")) > 1000
    assert not os.path.exists("profile_rank1.png"), "nothing is written into the working directory"

    # report_section, as analysis/report.py calls it: the same tables, the PNG into out_dir.
    # By path: the standard library has a module named profile too.
    spec = importlib.util.spec_from_file_location("llmhpc_profile", PROFILE_PY)
    profile_py = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(profile_py)
    section_dir = os.path.join(out, "section")
    os.makedirs(section_dir)
    text = profile_py.report_section([llmhpc_h5.open_run(out)], section_dir)
    assert text.startswith("Profile of ") and "(d) Time by category" in text, text[:300]  # report.py adds the "## profile" heading
    assert os.path.getsize(os.path.join(section_dir, "profile_rank0.png")) > 1000
    assert profile_py.report_section([], section_dir) == ""


def main():
    tmp = scratch_dir("llmhpc-profile-")
    out = os.path.join(tmp, "run")
    proc = profile(2, out, "--trace", "--top", "3")
    for word in ("-- forward:", "-- backward:", "-- optimizer:", "Matmul %", "-- attention", "Span / events",
                 "-- overhead", "-- drift: the untraced steps after the traced ones", "-- device busy: kernels ran"):
        assert word in proc.stdout, f"'{word}' missing from rank 0's report:\n{proc.stdout}"
    assert sorted(os.listdir(out)) == ["rank00000.h5", "rank00001.h5", "trace_rank00000.json", "trace_rank00001.json"]
    for rank in range(2):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            assert f.attrs["mode"] == "profile" and f.attrs["status"] == "complete", dict(f.attrs)
            activities, ranges = 0, 0
            for ctx in CONTEXTS:
                a, r = check_record(f, f"d32_ff64_L{LAYERS}_H4_T{ctx}_B2_fp32_naive")
                activities, ranges = activities + a, ranges + r
        check_trace(os.path.join(out, f"trace_rank{rank:05d}.json"), activities, ranges)
    # Rank 0's drift, one line per configuration in order, from its own untraced steps.
    printed = [float(v) for v in re.findall(r"-- drift: the untraced steps after the traced ones against those "
                                            r"before: ([-+0-9.]+)%", proc.stdout)]
    with h5py.File(os.path.join(out, "rank00000.h5"), "r") as f:
        steps = [f[f"profile/d32_ff64_L{LAYERS}_H4_T{ctx}_B2_fp32_naive/step_ms"][()] for ctx in CONTEXTS]
    expected = [drift_pct(u) for u in steps]
    assert len(printed) == len(expected) and all(abs(p - e) < 0.051 for p, e in zip(printed, expected)), (printed,
                                                                                                         expected)
    check_analysis(out)

    # --tp 2 with sequence parallelism: each rank profiles its part of the model (half the heads and
    # d_ff, the same ops per layer), its records labelled and attributed with the layout.
    split = os.path.join(tmp, "tp")
    proc = profile(2, split, "--tp", "1,2", "--sequence-parallel")
    assert "custom_tp2sp" in proc.stdout, proc.stdout
    for rank in range(2):
        with h5py.File(os.path.join(split, f"rank{rank:05d}.h5"), "r") as f:
            for ctx in CONTEXTS:
                for suffix, tp in (("", 1), ("_tp2sp", 2)):
                    label = f"d32_ff64_L{LAYERS}_H4_T{ctx}_B2_fp32_naive{suffix}"
                    check_record(f, label, backward_ops=5 if tp == 1 else 7)
                    a = f[f"profile/{label}"].attrs
                    assert (a["tp"], a["tp_rank"], a["sequence_parallel"]) == (tp, rank if tp > 1 else 0, tp - 1), \
                        (label, dict(a))
    for bad, word in ((["--tp", "2", "--cuda-graph"], "--cuda-graph"), (["--tp", "3"], "does not divide")):
        target = os.path.join(tmp, "bad_tp")
        proc = profile(2, target, *bad, expect_ok=False)
        assert proc.returncode == 2 and word in proc.stderr, (bad, proc.returncode, proc.stderr)
        assert not os.path.exists(target), f"{bad}: a rejected run left {target}"

    # The fallback: phases timed, no activities.
    events = os.path.join(tmp, "events")
    trace = os.path.join(tmp, "named.json")
    proc = profile(1, events, "--no-cupti", f"--trace={trace}")
    assert "phase events" in proc.stdout and "--no-cupti" in proc.stdout, proc.stdout
    with open(trace) as f:
        phases = [e for e in json.load(f) if e["ph"] == "X"]
    assert phases and {e["tid"] for e in phases} == {1, 2}, "phase tracks only, without activities"
    assert sorted(os.listdir(events)) == ["rank00000.h5"], "--trace=FILE writes FILE, not into the output folder"
    with h5py.File(os.path.join(events, "rank00000.h5"), "r") as f:
        rec = f[f"profile/d32_ff64_L{LAYERS}_H4_T8_B2_fp32_naive"]
        assert rec.attrs["profiler"] == "phase events" and rec.attrs["activities"] == 0
        start, end = rec["range_device_start_ns"][()], rec["range_device_end_ns"][()]
        assert len(start) > 0 and (start >= 0).all() and (end >= start).all()

    # The job script, on one CPU rank.
    job = os.path.join(tmp, "job")
    os.environ.update(NP="1", DEVICE="cpu", MODELS="tiny", CONTEXTS="8", WARMUP="1", STEPS="1", TRACE="1", OUT=job)
    run(["bash", os.path.join(ROOT, "jobs", "profile.sh")])
    with open(os.path.join(job, "profile_rank0.md")) as f:
        assert "(d) Time by category" in f.read()
    assert os.path.exists(os.path.join(job, "trace_rank00000.json")) and os.path.exists(
        os.path.join(job, "profile_rank0.png")), sorted(os.listdir(job))

    for bad, word in ((["--top", "0"], "--top"), (["--steps", "0"], "--steps"), (["--trace=x.txt"], ".json"),
                      (["--trace=/nonexistent-dir/x.json"], "does not exist"), (["--phase", "bogus"], "phase")):
        target = os.path.join(tmp, "bad")
        proc = profile(2, target, *bad, expect_ok=False)
        assert proc.returncode == 2 and word in proc.stderr, (bad, proc.returncode, proc.stderr)
        assert not os.path.exists(target), f"{bad}: a rejected run left {target}"
    print("PASS")


if __name__ == "__main__":
    main()
