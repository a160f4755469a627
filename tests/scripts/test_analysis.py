"""End to end: a 2-rank bench run on the CPU, read back through the schema loader and report.py.

Checks that the files the binary writes follow docs/hdf5-schema.md (root attributes, one
record per configuration with raw arrays of length --steps, status ok), that
analysis/llmhpc_h5.py sees both ranks, that analysis/report.py prints one markdown row per
configuration whose numbers are the means and standard deviations of the raw arrays (read
here with h5py directly, not through the loader), that out-of-memory configurations are rows
marked oom, that the table of each pass gives its min, max, mean and std of the raw arrays,
that plot_bench.py writes a PNG, and that the loader refuses an empty directory
and an unknown schema_version with a clear message. And, on a sweep where fp32 runs out of
memory and bf16 fits: rows in sweep order (fp32 first, contexts numerically), the custom shape
named by its shape, the oom's peak marked, the fp32-vs-bf16 table keeping the oom row, AdamW
inside backward labelled Bwd+AdamW, the CPU's bf16 caveat, and the plot's title of the
configurations that did not run kept within the figure.
"""
import os
import shutil
import sys

import h5py
import numpy as np

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "analysis"))
import bench  # noqa: E402
import llmhpc_h5  # noqa: E402
from script_env import llmhpc_binary, mpiexec, parse_markdown_tables, run, scratch_dir  # noqa: E402

BIN = llmhpc_binary()
REPORT = os.path.join(ROOT, "analysis", "report.py")
PLOT = os.path.join(ROOT, "analysis", "plot_bench.py")
MODEL = ["--d-model", "64", "--d-ff", "128", "--num-layers", "2", "--num-heads", "4"]
CONTEXTS, WARMUP, STEPS = (16, 32), 1, 3
PHASES_MS = ("forward_ms", "backward_ms", "optimizer_ms", "step_ms")
ROOT_ATTRS = {"schema_version": int, "mode": str, "rank": int, "world_size": int, "local_rank": int, "hostname": str,
              "device_name": str, "backend": str, "git_sha": str, "argv": str, "config_json": str, "start_time": str,
              "run_id": str, "status": str, "end_time": str}


def report(*args):
    proc = run([sys.executable, REPORT, *args])
    tables = [t for t in parse_markdown_tables(proc.stdout) if "Fwd Mean (ms)" in t[0]]
    assert len(tables) == 1, f"report.py {' '.join(args)} printed {len(tables)} benchmark tables, expected 1:\n{proc.stdout}"
    return tables[0], proc.stdout


def raw_arrays(directory, ranks):
    """{(context_length, array name): concatenated values over `ranks`}, read with h5py alone."""
    out = {}
    for rank in ranks:
        with h5py.File(os.path.join(directory, f"rank{rank:05d}.h5"), "r") as f:
            for group in f["bench"].values():
                for name in PHASES_MS:
                    key = (int(group.attrs["context_length"]), name)
                    out[key] = np.concatenate([out.get(key, np.array([])), group[name][()]])
    return out


def check_table(table, raw, decimals, label):
    header, rows = table
    for column in ("Model size", "d_model", "d_ff", "num_layers", "num_heads", "Context", "Fwd Mean (ms)",
                   "Fwd Std (ms)", "Bwd Mean (ms)", "Bwd Std (ms)", "Opt Mean (ms)", "Opt Std (ms)", "Total (ms)"):
        assert column in header, f"{label}: column '{column}' missing from the header {header}"
    assert len(rows) == len(CONTEXTS), f"{label}: {len(rows)} rows, expected one per context length {CONTEXTS}"
    col = {name: header.index(name) for name in header}
    tolerance = 0.5 * 10 ** -decimals + 1e-9
    seen = []
    for row in rows:
        assert (row[col["d_model"]], row[col["d_ff"]], row[col["num_layers"]], row[col["num_heads"]]) == \
            ("64", "128", "2", "4"), f"{label}: model shape columns wrong in row {row}"
        assert row[col["Model size"]] == "d64_ff128_L2_H4", f"{label}: a custom shape is named by its shape: {row}"
        context = int(row[col["Context"]])
        seen.append(context)
        for title, array, stat in (("Fwd Mean (ms)", "forward_ms", "mean"), ("Fwd Std (ms)", "forward_ms", "std"),
                                   ("Bwd Mean (ms)", "backward_ms", "mean"), ("Bwd Std (ms)", "backward_ms", "std"),
                                   ("Opt Mean (ms)", "optimizer_ms", "mean"), ("Opt Std (ms)", "optimizer_ms", "std"),
                                   ("Total (ms)", "step_ms", "mean"), ("Total Min (ms)", "step_ms", "min"),
                                   ("Total Max (ms)", "step_ms", "max")):
            values = raw[(context, array)]
            want = {"mean": values.mean, "std": lambda: values.std(ddof=1), "min": values.min, "max": values.max}[stat]()
            got = float(row[col[title]])
            assert abs(got - want) <= tolerance, \
                f"{label}: T={context} '{title}' is {got}, the raw {array} give {want:.6f} ({len(values)} samples)"
    assert sorted(seen) == sorted(CONTEXTS), f"{label}: rows are for contexts {seen}, expected {CONTEXTS}"


def check_pass_table(text, raw, decimals, label):
    """The table of each pass (the reference warm-up study's Table 1): one row per context and pass
    (Forward, Backward, Optimizer), whose min, max, mean and std are the raw arrays'."""
    (table,) = [t for t in parse_markdown_tables(text) if "Pass" in t[0] and "Min (ms)" in t[0]]
    header, rows = table
    col = {name: header.index(name) for name in header}
    tolerance = 0.5 * 10 ** -decimals + 1e-9
    seen = []
    for row in rows:
        context, name = int(row[col["Context"]]), row[col["Pass"]]
        seen.append((context, name))
        values = raw[(context, {"Forward": "forward_ms", "Backward": "backward_ms", "Optimizer": "optimizer_ms"}[name])]
        for title, want in (("Min (ms)", values.min()), ("Max (ms)", values.max()), ("Mean (ms)", values.mean()),
                            ("Std (ms)", values.std(ddof=1))):
            got = float(row[col[title]])
            assert abs(got - want) <= tolerance, f"{label}: T={context} {name} '{title}' is {got}, the raw give {want:.6f}"
    want = [(c, p) for c in sorted(CONTEXTS) for p in ("Forward", "Backward", "Optimizer")]
    assert seen == want, f"{label}: pass rows {seen}, expected {want}"


SENSOR_KEYS = {"device_time_ms", "device_sm_clock_mhz", "device_power_w", "device_temperature_c",
               "device_clock_reasons", "device_busy_samples", "device_slowdowns", "device_sm_clock_mhz_min",
               "device_sm_clock_mhz_median", "device_sm_clock_mhz_max"}


def check_sensors(out, work):
    """The CPU has no sensors: no device_* datasets or attributes. With a GPU's readings written in
    (rank 0 slowed by its power cap, rank 1 not), the summary takes the lowest clocks and every
    reason, and the report's table gains the clock columns; without slowdowns it has none."""
    for rank in (0, 1):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            for group in f["bench"].values():
                stray = [k for k in list(group) + list(group.attrs) if k in SENSOR_KEYS]
                assert not stray, f"the CPU backend has no sensors, but {group.name} has {stray}"
    sensed = os.path.join(work, "sensed")
    shutil.copytree(out, sensed)
    for rank, (low, mid, reasons) in enumerate(((1365.0, 1650.0, "sw power cap"), (1755.0, 1980.0, "none"))):
        with h5py.File(os.path.join(sensed, f"rank{rank:05d}.h5"), "a") as f:
            for group in f["bench"].values():
                group.attrs["device_sm_clock_mhz_min"] = low
                group.attrs["device_sm_clock_mhz_median"] = mid
                group.attrs["device_slowdowns"] = reasons if group.attrs["context_length"] == 16 else "none"
    summary = llmhpc_h5.open_run(sensed).bench_summary(rank=None)
    by_context = {int(r["context_length"]): r for _, r in summary.iterrows()}
    assert by_context[16]["sm_clock_mhz_min"] == 1365.0 and by_context[16]["sm_clock_mhz_median"] == 1650.0, summary
    assert by_context[16]["slowdowns"] == "sw power cap" and by_context[32]["slowdowns"] == "none", summary
    (header, rows), text = report(sensed, "--all-ranks")
    assert "SM clock min / median (MHz)" in header and "Slowdowns" in header, f"no clock columns:\n{text}"
    rows = {row[header.index("Context")]: row for row in rows}
    assert rows["16"][header.index("SM clock min / median (MHz)")] == "1365 / 1650", text
    assert rows["16"][header.index("Slowdowns")] == "sw power cap" and rows["32"][header.index("Slowdowns")] == "none"
    assert "## device clocks" in text and "| 0 | 1365 / 1650 / - | sw power cap |" in text, \
        f"the report's device clocks section should list rank 0's slowed record:\n{text}"
    assert "| 1 | 1755" not in text, f"rank 1 did not slow, so it is not listed:\n{text}"
    (header, _), text = report(out)
    assert "Slowdowns" not in header, f"clock columns without any slowdown:\n{text}"
    assert "## device clocks" not in text, f"a device clocks section without any slowdown:\n{text}"


def check_precision_oom(work):
    """fp32 out of memory at context 128 where bf16 fits (the reference mixed-precision study's point),
    AdamW inside backward (no --separate-optimizer), on the CPU."""
    out = os.path.join(work, "precision_oom")
    run([BIN, "--mode", "bench", "--device", "cpu", *MODEL, "--vocab-size", "256", "--context-length", "128,32",
         "--precision", "bf16,fp32", "--memory-limit", "8MB", "--warmup", "0", "--steps", "2", "--out", out])
    (header, rows), text = report(out)
    col = {name: header.index(name) for name in header}
    order = [(row[col["Precision"]], row[col["Context"]]) for row in rows]
    assert order == [("fp32", "32"), ("fp32", "128"), ("bf16", "32"), ("bf16", "128")], \
        f"rows in sweep order (fp32 first, contexts numerically): {order}\n{text}"
    assert "Bwd+AdamW Mean (ms)" in header and "Opt Mean (ms)" not in header, f"AdamW ran inside backward:\n{text}"
    assert "Bwd+AdamW: without --separate-optimizer" in text, f"no note on AdamW inside backward:\n{text}"
    # The table of each pass: backward with AdamW inside it, no optimizer, the oom left out.
    (passes,) = [t for t in parse_markdown_tables(text) if "Pass" in t[0] and "Min (ms)" in t[0]]
    named = [(r[passes[0].index("Precision")], r[passes[0].index("Context")], r[passes[0].index("Pass")])
             for r in passes[1]]
    assert named == [("fp32", "32", "Forward"), ("fp32", "32", "Backward+AdamW"), ("bf16", "32", "Forward"),
                     ("bf16", "32", "Backward+AdamW"), ("bf16", "128", "Forward"),
                     ("bf16", "128", "Backward+AdamW")], f"the table of each pass:\n{text}"
    oom = rows[order.index(("fp32", "128"))]
    assert oom[col["Status"]] == "oom" and oom[col["Peak (MiB)"]].startswith("oom (>"), \
        f"the oom's peak is a lower bound, marked: {oom}\n{text}"
    (speed,) = [t for t in parse_markdown_tables(text) if "Total Speedup" in t[0]]
    header, rows = speed
    by_context = {row[header.index("Context")]: row for row in rows}
    assert set(by_context) == {"32", "128"}, f"fp32 out of memory where bf16 fits is a row:\n{text}"
    row = by_context["128"]
    assert row[header.index("Total FP32 (ms)")] == "oom" and row[header.index("Total Speedup")] == "-", row
    float(row[header.index("Total BF16 (ms)")])  # bf16 ran: a number
    assert "Bwd+AdamW Speedup" in header, f"the speed-up table labels backward with AdamW too:\n{text}"
    section = text[text.index("### Mixed precision"):text.index("### Peak memory")]
    assert bench.CPU_BF16_NOTE in section, f"the speed-ups of a CPU run come with bf16's caveat:\n{section}"
    # The plot's title: the configurations that did not run, counted, wrapped within the figure.
    failed = bench.summaries([llmhpc_h5.open_run(out)], 0).query("status != 'ok'")
    title = bench.not_run_title(failed, 40)
    assert " ".join(title.split()) == "1 configuration out of memory: d64_ff128_L2_H4 T=128 B=4 fp32", title
    assert max(len(line) for line in title.splitlines()) <= 40, title


def check_timings_to_doubt():
    """comm.py names a size whose median time is more than twice a larger size's (a loaded host, ranks
    spinning on shared cores), and nothing in a series whose time grows with the size."""
    import comm
    base = dict(status="ok", measured=True, backend="mpi", device="cpu", procs=2, collective="allreduce", dtype="float",
                placement="inplace")
    rows = [dict(base, bytes=b, median=m) for b, m in ((4000, 8.0), (64000, 0.02), (1000000, 0.233))]
    doubts = comm.timings_to_doubt(rows)
    assert len(doubts) == 1 and doubts[0].startswith("- mpi allreduce float inplace on 2 ranks: 4KB took a median"), doubts
    rows = [dict(base, bytes=b, median=m) for b, m in ((4000, 0.01), (64000, 0.018), (1000000, 0.233))]
    assert comm.timings_to_doubt(rows) == [], comm.timings_to_doubt(rows)
    print("ok   comm.py names the sizes whose times cannot be the collective's")


NCCL_TESTS_OUTPUT = """# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809
# Collective test starting: ./build/all_gather_perf
# nThread 1 nGpus 1 minBytes 1000000 maxBytes 10000000 step: 10(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 0 graph: 0 unalign: 0
#
# Using devices
#  Rank  0 Group  0 Pid   4711 on      gpu01 device  0 [0000:19:00] NVIDIA H200
#  Rank  1 Group  0 Pid   4712 on      gpu01 device  1 [0000:3b:00] NVIDIA H200
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)
     1000000        125000     float    none      -1    20.00   50.00   25.00     N/A    25.00   40.00   20.00     N/A
    10000000       1250000     float    none      -1    50.00  200.00  100.00     N/A    40.00  250.00  125.00     N/A
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 67.5
#
# Collective test concluded: ./build/all_gather_perf
"""


def check_nccl_tests_table():
    """comm.py reads nccl-tests' printed table (the ranks from its '#  Rank' lines) and sets llmhpc's
    bus bandwidth beside it where both measured the same collective, ranks, dtype and size."""
    import comm
    theirs = comm.nccl_tests_rows(NCCL_TESTS_OUTPUT)
    assert [(r["collective"], r["ranks"], r["bytes"], r["placement"], r["busbw"]) for r in theirs] == [
        ("allgather", 2, 1000000, "outofplace", 25.0), ("allgather", 2, 1000000, "inplace", 20.0),
        ("allgather", 2, 10000000, "outofplace", 100.0), ("allgather", 2, 10000000, "inplace", 125.0)], theirs
    ours = [dict(backend="nccl", ranks=2, collective="allgather", size=1000000, type="float",
                 **{"oop busbw_value": 30.0, "ip busbw_value": 19.0}),
            dict(backend="nccl", ranks=2, collective="allgather", size=1000000, type="float",
                 **{"oop busbw_value": 20.0, "ip busbw_value": 21.0}),  # a second run: the mean, 25 / 20
            dict(backend="nccl", ranks=4, collective="allgather", size=1000000, type="float",
                 **{"oop busbw_value": 9.0, "ip busbw_value": 9.0})]  # no nccl-tests run at 4 ranks
    table = comm.against_nccl_tests(ours, theirs).splitlines()
    assert table[2:] == ["| allgather | 2 | float | 1MB | 25.00 / 20.00 | 25.00 / 20.00 | 100.0% / 100.0% | 1 / 2 |"], table
    assert comm.against_nccl_tests(ours[2:], theirs).startswith("No collective"), "nothing in common"
    print("ok   comm.py sets llmhpc's bus bandwidth beside nccl-tests' printed table")


def main():
    work = scratch_dir("llmhpc-analysis-")
    out = os.path.join(work, "bench")
    run(mpiexec() + ["-np", "2", BIN, "--mode", "bench", "--device", "cpu", *MODEL,
                     "--context-length", ",".join(map(str, CONTEXTS)), "--warmup", str(WARMUP), "--steps", str(STEPS),
                     "--separate-optimizer", "--out", out])  # the optimizer timed as its own phase

    # ---- the files, through the loader ----
    run_ = llmhpc_h5.open_run(out)
    assert run_.ranks == [0, 1], f"loader sees ranks {run_.ranks}, expected [0, 1]"
    assert run_.world_size == 2 and run_.mode == "bench", f"world_size {run_.world_size}, mode {run_.mode}"
    assert run_.complete, "a finished run should have root status 'complete' on every rank"
    for rank_file in run_.files:
        for name, kind in ROOT_ATTRS.items():
            assert name in rank_file.attrs, f"{rank_file.path}: root attribute '{name}' missing"
            assert isinstance(rank_file.attrs[name], kind), \
                f"{rank_file.path}: root attribute '{name}' is {type(rank_file.attrs[name]).__name__}, expected {kind.__name__}"
        assert rank_file.attrs["schema_version"] in llmhpc_h5.KNOWN_SCHEMA_VERSIONS
        assert rank_file.attrs["run_id"] == run_.files[0].attrs["run_id"], "the ranks of one run share its run_id"
        assert run_.config["context-length"] == ",".join(map(str, CONTEXTS)), f"config_json: {run_.config}"
        records = run_.records("bench", rank=rank_file.rank)
        contexts = sorted(r.attrs["context_length"] for r in records)
        assert contexts == sorted(CONTEXTS), f"rank {rank_file.rank}: bench records for contexts {contexts}"
        for r in records:
            assert r.status == "ok", f"rank {r.rank} {r.path}: status {r.status!r}"
            assert (r.attrs["d_model"], r.attrs["d_ff"], r.attrs["num_layers"], r.attrs["num_heads"]) == (64, 128, 2, 4)
            assert (r.attrs["steps"], r.attrs["warmup"], r.attrs["phase"]) == (STEPS, WARMUP, "train-step"), r.attrs
            for name in PHASES_MS:
                values = r.arrays.get(name)
                assert values is not None and values.shape == (STEPS,), \
                    f"rank {r.rank} {r.path}/{name}: shape {None if values is None else values.shape}, expected ({STEPS},)"
                assert np.all(np.isfinite(values)) and np.all(values >= 0), f"{r.path}/{name}: {values}"
                warm = r.arrays.get("warmup_" + name)
                assert warm is not None and warm.shape == (WARMUP,), f"{r.path}/warmup_{name}: {warm}"
            parts = r.arrays["forward_ms"] + r.arrays["backward_ms"] + r.arrays["optimizer_ms"]
            assert np.allclose(parts, r.arrays["step_ms"], rtol=1e-6, atol=1e-6), \
                f"{r.path}: step_ms {r.arrays['step_ms']} is not forward+backward+optimizer {parts}"
            assert r.attrs["peak_memory_bytes"] > 0 and r.attrs["num_params"] > 0

    summary = run_.bench_summary(rank=None)
    assert list(summary["ranks"]) == [2, 2], f"pooled summary should pool 2 ranks per configuration: {summary}"
    assert list(summary["forward_n"]) == [2 * STEPS] * 2, f"pooled sample counts {list(summary['forward_n'])}"
    check_sensors(out, work)

    # ---- report.py: rank 0, rank 1, all ranks pooled ----
    table, text = report(out)
    check_table(table, raw_arrays(out, [0]), 2, "report.py DIR")
    check_pass_table(text, raw_arrays(out, [0]), 2, "report.py DIR")
    table, text = report(out, "--rank", "1", "--decimals", "4")
    check_table(table, raw_arrays(out, [1]), 4, "report.py --rank 1")
    check_pass_table(text, raw_arrays(out, [1]), 4, "report.py --rank 1")
    table, _ = report(out, "--all-ranks", "--decimals", "3", "--table-only")
    check_table(table, raw_arrays(out, [0, 1]), 3, "report.py --all-ranks")

    # ---- out-of-memory configurations are rows marked oom; forward-only has no Bwd/Opt numbers ----
    oom_dir = os.path.join(work, "oom")
    run([BIN, "--mode", "bench", "--device", "cpu", *MODEL, "--context-length", "16,1024", "--phase", "forward",
         "--warmup", "0", "--steps", "2", "--memory-limit", "30MB", "--out", oom_dir])
    (header, rows), text = report(oom_dir)
    assert "Status" in header, f"a run with an oom needs a Status column:\n{text}"
    by_context = {row[header.index("Context")]: row for row in rows}
    assert set(by_context) == {"16", "1024"}, f"rows for contexts {sorted(by_context)}:\n{text}"
    assert by_context["1024"][header.index("Status")] == "oom", f"T=1024 with 30MB should be oom:\n{text}"
    assert by_context["1024"][header.index("Fwd Mean (ms)")] == "-", f"an oom row has no times:\n{text}"
    assert by_context["16"][header.index("Status")] == "ok", f"T=16 fits in 30MB:\n{text}"
    assert by_context["16"][header.index("Bwd Mean (ms)")] == "-", f"phase forward times no backward:\n{text}"
    assert [row[header.index("Context")] for row in rows] == ["16", "1024"], f"contexts in numeric order:\n{text}"
    assert "Opt Mean (ms)" not in header, f"phase forward times no optimizer step:\n{text}"
    with h5py.File(os.path.join(oom_dir, "rank00000.h5"), "r") as f:
        oom_group = [g for g in f["bench"].values() if g.attrs["context_length"] == 1024][0]
        assert "error" in oom_group.attrs and len(oom_group) == 0, "an oom record has an error attribute, no arrays"

    check_precision_oom(work)
    check_timings_to_doubt()
    check_nccl_tests_table()

    # ---- plot ----
    png = os.path.join(work, "bench.png")
    run([sys.executable, PLOT, out, oom_dir, "-o", png])
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n", "plot_bench.py did not write a PNG"
    assert os.path.getsize(png) > 10_000, f"the PNG is suspiciously small ({os.path.getsize(png)} bytes)"

    # ---- runs that differ in size, precision, phase and attention: a panel nothing was measured
    # for is drawn empty, and naive and flash keep rows of their own ----
    tiny = ["--num-layers", "1", "--num-heads", "2", "--d-ff", "8", "--vocab-size", "11", "--context-length", "8",
            "--batch-size", "1", "--warmup", "0", "--steps", "2"]
    forward_only, both = os.path.join(work, "forward_only"), os.path.join(work, "both_attentions")
    run([BIN, "--mode", "bench", "--device", "cpu", "--d-model", "16", *tiny, "--precision", "fp64", "--phase",
         "forward", "--out", forward_only])
    run([BIN, "--mode", "bench", "--device", "cpu", "--d-model", "32", *tiny, "--precision", "fp32", "--attention",
         "naive,flash", "--out", both])
    _, text = report(forward_only, both, "-o", os.path.join(work, "mixed", "report.md"))
    assert os.path.getsize(os.path.join(work, "mixed", "bench.png")) > 10_000, "no plot of the mixed runs"
    memory = [t for t in parse_markdown_tables(text) if any("peak (" in h for h in t[0])]
    assert len(memory) == 1 and "Attention" in memory[0][0], f"a peak memory table with an Attention column:\n{text}"
    header, rows = memory[0]
    attentions = sorted(row[header.index("Attention")] for row in rows if row[header.index("d_model")] == "32")
    assert attentions == ["flash", "naive"], f"d_model 32's peaks per attention: {attentions}\n{text}"

    # ---- refusals: no rank files, unknown schema_version, an unfinished run is flagged ----
    empty = os.path.join(work, "empty")
    os.makedirs(empty)
    try:
        llmhpc_h5.open_run(empty)
        raise AssertionError("open_run on an empty directory should raise SchemaError")
    except llmhpc_h5.SchemaError as e:
        assert "no llmhpc rank files" in str(e), f"unclear message: {e}"
    proc = run([sys.executable, REPORT, empty], expect_ok=False)
    assert proc.returncode != 0 and "no llmhpc rank files" in proc.stderr, \
        f"report.py on an empty directory: exit {proc.returncode}, stderr {proc.stderr!r}"
    for script in ("memory.py", "plot_memory.py"):  # a clear message, not a traceback
        proc = run([sys.executable, os.path.join(ROOT, "analysis", script), empty], expect_ok=False)
        assert proc.returncode != 0 and "no llmhpc rank files" in proc.stderr and "Traceback" not in proc.stderr, \
            f"{script} on an empty directory: exit {proc.returncode}, stderr {proc.stderr!r}"
    for script in ("bench.py", "scaling.py", "train.py"):  # report sections: run alone, they say where to go
        proc = run([sys.executable, os.path.join(ROOT, "analysis", script), out], expect_ok=False)
        assert proc.returncode != 0 and "analysis/report.py" in proc.stderr, \
            f"{script} run alone: exit {proc.returncode}, stderr {proc.stderr!r}"
        proc = run([sys.executable, os.path.join(ROOT, "analysis", script), "--help"], expect_ok=False)
        assert proc.returncode == 0 and "analysis/report.py" in proc.stderr, \
            f"{script} --help: exit {proc.returncode}, stderr {proc.stderr!r}"

    future = os.path.join(work, "future")
    shutil.copytree(out, future)
    with h5py.File(os.path.join(future, "rank00001.h5"), "a") as f:
        f.attrs["schema_version"] = np.int64(99)
    try:
        llmhpc_h5.open_run(future)
        raise AssertionError("open_run should refuse schema_version 99")
    except llmhpc_h5.SchemaError as e:
        assert "schema_version 99" in str(e), f"unclear message: {e}"

    crashed = os.path.join(work, "crashed")
    shutil.copytree(out, crashed)
    with h5py.File(os.path.join(crashed, "rank00000.h5"), "a") as f:
        f.attrs["status"] = "running"  # what a killed run leaves behind
        del f.attrs["end_time"]
    assert not llmhpc_h5.open_run(crashed).complete, "root status 'running' means the run did not finish"
    _, text = report(crashed)
    assert "INCOMPLETE" in text, f"report.py should flag a run that did not finish:\n{text}"

    stopped = os.path.join(work, "stopped")
    shutil.copytree(out, stopped)
    with h5py.File(os.path.join(stopped, "rank00000.h5"), "a") as f:
        f.attrs["status"] = "interrupted: SIGTERM after step 3 of 10"  # what a signal's stop leaves (train)
    _, text = report(stopped)
    assert "INTERRUPTED: SIGTERM after step 3 of 10" in text and "INCOMPLETE" not in text, \
        f"report.py should say where a stopped run stopped:\n{text}"

    print("test_analysis: OK")


if __name__ == "__main__":
    main()
