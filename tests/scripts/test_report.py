"""analysis/report.py, its per-mode sections, plot_bench.py, scaling and accounting.py on files
the binary writes here (CPU backend, a tiny model): bench (fp32 and bf16, two contexts, two
warm-up settings), attention, comm at 2 and 3 ranks, ddp (every strategy, two bucket sizes,
sharding), ddp at 1 and 2 ranks (strong and weak), an all-reduce run, train.

Every number checked is recomputed here from the raw arrays read with h5py alone: the bench
tables' means and stds per warm-up setting (rows fp32 first), the fp32/bf16 speed-ups (the reference mixed-precision study's table), the comm table's mean,
median, std, bandwidth and busbw (and the nccl-tests table's median and std), the ddp step means and
slowest-rank steps (and zero1's exposed communication beside the
ring model's in table (i)), the scaling efficiencies and speed-ups (weak scaling's scaled, n T(1) / T(n)),
the collectives' run each prediction is fitted from (with its ranks and nodes, marked where they are
not the configuration's: the 2-rank runs set here as if on two nodes), memory to 3 significant digits
and ties for the least memory named as ties (and "the least memory" only for the least), "per rank" on CPUs,
scaling.png without an empty margin, the ring model flagged where measured / predicted exposed communication is
outside [0.67, 1.5] (the study table and the projections built on it, faint in scaling.png), the study in short
first, layouts within the steps' noise said not to be told apart, collectives beyond the measured sizes said to be, the batch
per data-parallel rank under tensor parallelism, efficiencies above 100% explained, ranks that shared cores warned of,
the one-rank runs' exposed communication said to have no peer, a tensor-parallel ddp run's TP wait beside
its exposed communication in every table and the breakdown plot, the attention means and bytes saved for backward,
the training losses, step means after the first step, tokens/s and peak per rank; every plot the report names is a
PNG of some size.
report.py refuses a folder that does not exist and one it cannot write into, in a line. A new mode is
picked up by its module alone (analysis/<mode>.py with report_section). accounting.py
reproduces the reference communication study's published numbers (communication_accounting), its b* is the
bucket model's with o and w from the raw all-reduce times (and, beside a bucket sweep, the one ddp.py's
table (e) prints), and its tensor-parallel step is one GPU's
median step / tp plus the run's recorded bus bytes at the given bandwidth.
"""
import math
import os
import re
import shutil
import sys
import types

import h5py
import numpy as np
import pandas as pd

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from script_env import llmhpc_binary, mpiexec, parse_markdown_tables, run, scratch_dir  # noqa: E402

BIN = llmhpc_binary()
ANALYSIS = os.path.join(ROOT, "analysis")
SHAPE = ["--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "4", "--vocab-size", "64"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def close(cell: str, value: float, label: str):
    """The printed cell equals `value` to the digits printed (half a unit of the last one, 1e-9 at least)."""
    text = cell.rstrip("x%").strip()
    decimals = len(text.split(".")[1]) if "." in text and "e" not in text else 0
    if "e" in text:  # four significant digits in exponent form
        assert abs(float(text) - value) <= abs(value) * 5e-4 + 1e-12, f"{label}: printed {cell}, raw {value}"
        return
    assert abs(float(text) - value) <= 0.5 * 10 ** -decimals + 1e-9, f"{label}: printed {cell}, raw {value}"


def table_with(tables, *columns):
    found = [t for t in tables if all(c in t[0] for c in columns)]
    assert found, f"no table with columns {columns}; headers: {[t[0] for t in tables]}"
    return found


def rows_of(table):
    header, rows = table
    return [dict(zip(header, r)) for r in rows]


def raw(directory, rank, kind):
    """{group name: (attrs, {dataset: array})} of one rank file, read with h5py alone."""
    out = {}
    with h5py.File(os.path.join(directory, f"rank{rank:05d}.h5"), "r") as f:
        for name, g in f[kind].items():
            out[name] = (dict(g.attrs), {k: g[k][()] for k in g})
    return out


def std(a):
    return float(np.std(a, ddof=1)) if len(a) > 1 else 0.0


def make_runs(work):
    mpi = mpiexec()
    runs = {}

    def go(name, cmd):
        runs[name] = os.path.join(work, "results", name)
        run(cmd + ["--out", runs[name]])

    go("bench", [*mpi, "-np", "2", BIN, "--mode", "bench", "--device", "cpu", *SHAPE, "--context-length", "16,32",
                 "--precision", "fp32,bf16", "--warmup", "1", "--steps", "3", "--phase", "train-step",
                 "--separate-optimizer"])  # AdamW timed as its own phase, as in the reference tables
    go("bench-w0", [*mpi, "-np", "2", BIN, "--mode", "bench", "--device", "cpu", *SHAPE, "--context-length", "16,32",
                    "--precision", "fp32,bf16", "--warmup", "0", "--steps", "3", "--phase", "train-step",
                    "--separate-optimizer"])
    go("attention", [BIN, "--mode", "attention", "--device", "cpu", "--batch-size", "1", "--num-heads", "1",
                     "--head-dim", "16", "--context-length", "32,64", "--attention", "naive,flash", "--warmup", "1",
                     "--steps", "3"])
    for n in (2, 3):
        go(f"comm-np{n}", [*mpi, "-np", str(n), BIN, "--mode", "comm", "--device", "cpu", "--size", "4KB,64KB,1MB",
                           "--warmup", "1", "--steps", "4"])
    go("ddp", [*mpi, "-np", "2", BIN, "--mode", "ddp", "--device", "cpu", *SHAPE, "--context-length", "16",
               "--batch-size", "4", "--ddp", "none,naive,flat,overlap,bucketed", "--bucket-mb", "0.001,1000",
               "--shard-optimizer", "none,zero1", "--warmup", "1", "--steps", "3"])
    for n in (1, 2):
        for kind, batch in (("strong", 4), ("weak", 2 * n)):
            go(f"scaling/{kind}-np{n}", [*mpi, "-np", str(n), BIN, "--mode", "ddp", "--device", "cpu", *SHAPE,
                                         "--context-length", "16", "--batch-size", str(batch), "--ddp", "bucketed",
                                         "--bucket-mb", "1", "--warmup", "1", "--steps", "3"])
    go("scaling/allreduce-np2", [*mpi, "-np", "2", BIN, "--mode", "comm", "--device", "cpu", "--size", "4KB,1MB",
                                 "--warmup", "1", "--steps", "3"])
    tokens = os.path.join(work, "tokens.bin")
    np.random.default_rng(0).integers(0, 64, 4096, dtype=np.uint16).tofile(tokens)
    go("train", [BIN, "--mode", "train", "--device", "cpu", *SHAPE, "--data", tokens, "--context-length", "16",
                 "--batch-size", "2", "--steps", "4", "--lr-schedule", "cosine", "--lr-warmup-steps", "1",
                 "--clip-grad-norm", "0.5", "--ddp", "bucketed", "--grad-reduce-dtype", "bf16"])
    with h5py.File(os.path.join(runs["train"], "rank00000.h5"), "a") as f:  # a GPU's readings: not one per step
        f["train"].create_dataset("device_time_ms", data=np.arange(7.0))
    # a tensor-parallel ddp run (tp 2 x dp 1), outside results/: its own report
    runs["tp-ddp"] = os.path.join(work, "tp-ddp", "run")
    run([*mpi, "-np", "2", BIN, "--mode", "ddp", "--device", "cpu", *SHAPE, "--context-length", "16", "--batch-size",
         "4", "--tp", "2", "--ddp", "none,bucketed", "--bucket-mb", "1", "--shard-optimizer", "none,zero1",
         "--warmup", "1", "--steps", "3", "--out", runs["tp-ddp"]])
    # accounting.py tp's inputs, outside results/ (the report's train section counts its runs)
    for name, np_, extra in (("single", 1, []), ("tp2", 2, ["--tp", "2"])):
        runs[f"tp/{name}"] = os.path.join(work, "tp", name)
        run([*mpi, "-np", str(np_), BIN, "--mode", "train", "--device", "cpu", *SHAPE, "--data", tokens,
             "--context-length", "16", "--batch-size", "2", "--steps", "5", *extra, "--out", runs[f"tp/{name}"]])
    return runs


def section_tables(text, heading):
    """The tables under the heading line `heading` (up to the next heading)."""
    start = text.index(heading + "\n")
    end = text.find("\n#", start + len(heading))
    return parse_markdown_tables(text[start:end if end >= 0 else len(text)])


def check_bench(tables, runs, text):
    for directory, warmup in ((runs["bench"], "1"), (runs["bench-w0"], "0")):
        (table,) = section_tables(text, f"### Benchmark (warm-up steps: {warmup})")
        order = [(r["Precision"], r["Context"]) for r in rows_of(table)]
        assert order == [("fp32", "16"), ("fp32", "32"), ("bf16", "16"), ("bf16", "32")], \
            f"warm-up {warmup}: rows in sweep order, fp32 first: {order}"
        rows = {(r["Context"], r["Precision"]): r for r in rows_of(table)}
        assert len(rows) == 4, f"warm-up {warmup}: {len(rows)} rows, expected 2 contexts x 2 precisions"
        for attrs, arrays in raw(directory, 0, "bench").values():
            key = (str(attrs["context_length"]), attrs["precision"])
            r = rows[key]
            for phase, col in (("forward", "Fwd"), ("backward", "Bwd"), ("optimizer", "Opt")):
                if f"{phase}_ms" not in arrays:  # AdamW inside backward (the default): no column, or "-"
                    assert r.get(f"{col} Mean (ms)", "-") == "-", f"warm-up {warmup} {key}: {col} without times"
                    continue
                close(r[f"{col} Mean (ms)"], arrays[f"{phase}_ms"].mean(), f"warm-up {warmup} {key} {col} mean")
                close(r[f"{col} Std (ms)"], std(arrays[f"{phase}_ms"]), f"warm-up {warmup} {key} {col} std")
            close(r["Total (ms)"], arrays["step_ms"].mean(), f"warm-up {warmup} {key} total")
    # One table of each pass over both warm-up settings (the reference warm-up study's Table 1):
    # a row per configuration and pass, its min, max, mean and std those of the raw arrays.
    passes = rows_of(table_with(tables, "Warm-up", "Pass", "Min (ms)", "Max (ms)")[0])
    assert len(passes) == 2 * 4 * 3, f"pass rows: 2 warm-ups x 4 configurations x 3 passes: {passes}"
    by_key = {(r["Warm-up"], r["Context"], r["Precision"], r["Pass"]): r for r in passes}
    for directory, warmup in ((runs["bench"], "1"), (runs["bench-w0"], "0")):
        for attrs, arrays in raw(directory, 0, "bench").values():
            for phase in ("forward", "backward", "optimizer"):
                key = (warmup, str(attrs["context_length"]), attrs["precision"], phase.capitalize())
                values, label = arrays[f"{phase}_ms"], f"pass table {key}"
                close(by_key[key]["Min (ms)"], values.min(), f"{label} min")
                close(by_key[key]["Max (ms)"], values.max(), f"{label} max")
                close(by_key[key]["Mean (ms)"], values.mean(), f"{label} mean")
                close(by_key[key]["Std (ms)"], std(values), f"{label} std")
    # speed-ups fp32 / bf16 of both runs pooled per configuration (the loader's order: warm-up 1 then 0)
    speed = rows_of(table_with(tables, "Total FP32 (ms)", "Total BF16 (ms)", "Total Speedup")[0])
    assert len(speed) == 4, f"speed-up rows: {speed}"
    for directory, warmup in ((runs["bench"], "1"), (runs["bench-w0"], "0")):
        groups = raw(directory, 0, "bench")
        for ctx in (16, 32):
            by_prec = {a["precision"]: arr for a, arr in groups.values() if a["context_length"] == ctx}
            (r,) = [r for r in speed if r["Context"] == str(ctx) and r["Warm-up"] == warmup]
            for phase, col in (("forward", "Fwd"), ("backward", "Bwd"), ("optimizer", "Opt"), ("step", "Total")):
                x, y = by_prec["fp32"][f"{phase}_ms"].mean(), by_prec["bf16"][f"{phase}_ms"].mean()
                close(r[f"{col} FP32 (ms)"], x, f"{col} fp32, context {ctx}, warm-up {warmup}")
                close(r[f"{col} BF16 (ms)"], y, f"{col} bf16, context {ctx}, warm-up {warmup}")
                close(r[f"{col} Speedup"], x / y, f"{col} speed-up, context {ctx}, warm-up {warmup}")


def check_comm(tables, runs):
    rows = rows_of(table_with(tables, "procs", "median (ms)", "busbw (GB/s)")[0])
    # comm-np2 and comm-np3: 3 sizes x 2 placements each; scaling/allreduce-np2: 2 sizes x 2 placements
    assert len(rows) == 2 * 3 * 2 + 2 * 2, f"comm rows: {len(rows)}"
    for n in (2, 3):
        for name, (attrs, arrays) in raw(runs[f"comm-np{n}"], 0, "comm").items():
            t = arrays["time_us_max_over_ranks"] / 1e3
            bw = attrs["bytes"] / (t.mean() * 1e-3) / 1e9
            expected = (("mean (ms)", t.mean()), ("median (ms)", np.median(t)), ("std (ms)", std(t)),
                        ("bw (GB/s)", bw), ("busbw (GB/s)", bw * attrs["bus_factor"]))
            candidates = [r for r in rows if r["procs"] == str(n) and r["placement"] == attrs["placement"]
                          and float(r["size (MB)"]) == attrs["bytes"] / 1e6 and r["backend"] == "mpi"
                          and r["device"] == "cpu"]
            errors = []
            for r in candidates:
                try:
                    for col, value in expected:
                        close(r[col], value, f"comm {name} np{n} {col}")
                    break
                except AssertionError as e:
                    errors.append(str(e))
            else:
                raise AssertionError(f"{name} at {n} ranks: no row with its numbers: {errors or 'no row'}")


def check_comm_nccl(tables, runs):
    """The nccl-tests table: beside the back-to-back time, the median and std of the slowest rank's
    per-iteration times."""
    rows = rows_of(table_with(tables, "oop time (us)", "oop median (us)", "oop std (us)")[0])
    for name, (attrs, arrays) in raw(runs["comm-np3"], 0, "comm").items():
        t = arrays["time_us_max_over_ranks"]
        short = "oop" if attrs["placement"] == "outofplace" else "ip"
        (r,) = [r for r in rows if r["ranks"] == "3" and r["collective"] == attrs["collective"]
                and r["size (B)"] == str(attrs["bytes"])]
        close(r[f"{short} median (us)"], float(np.median(t)), f"comm {name} median")
        close(r[f"{short} std (us)"], std(t), f"comm {name} std")


def check_ddp(tables, runs):
    groups = [raw(runs["ddp"], rank, "ddp") for rank in (0, 1)]
    strategy_tables = table_with(tables, "Impl", "Step Mean (ms)", "Comm Mean (ms)")
    for name, (attrs, arrays) in groups[0].items():
        if attrs["ddp"] == "none" or attrs["shard_optimizer"] != "none":
            continue
        pooled = np.concatenate([g[name][1]["step_ms"] for g in groups])
        comm = np.concatenate([g[name][1]["comm_ms"] for g in groups])
        bucket = "-" if attrs["ddp"] != "bucketed" else f"{attrs['bucket_mb']:g}"
        hits = [r for t in strategy_tables for r in rows_of(t) if r["Impl"] == attrs["ddp"] and r["Bucket (MiB)"] == bucket
                and abs(float(r["Step Mean (ms)"]) - pooled.mean()) <= 0.0051]
        assert len(hits) == 1, f"{name}: expected one (a) row with step mean {pooled.mean():.2f}"
        close(hits[0]["Step Std (ms)"], std(pooled), f"{name} step std")
        close(hits[0]["Comm Mean (ms)"], comm.mean(), f"{name} comm mean")
    # (b): the slowest rank's step, as its header says, not the pooled mean of (a)
    buckets = [r for t in table_with(tables, "Issued after bwd", "Slowest Step (ms)") for r in rows_of(t)]
    for name, (attrs, arrays) in groups[0].items():
        if attrs["ddp"] != "bucketed" or attrs["shard_optimizer"] != "none":
            continue
        (row,) = [r for r in buckets if r["Impl"] == "bucketed" and r["Bucket (MiB)"] == f"{attrs['bucket_mb']:g}"]
        close(row["Slowest Step (ms)"], arrays["step_ms_max_over_ranks"].mean(), f"{name} (b) slowest step")
    sharding = rows_of(table_with(tables, "Sharding", "Optimizer state (MiB)")[0])
    assert {r["Sharding"] for r in sharding} == {"none", "zero1"}, sharding
    for name, (attrs, _) in groups[0].items():
        if attrs["ddp"] == "none":
            continue
        opt = max(g[name][0]["memory_after_optimizer_optimizer_bytes"] for g in groups) / 2**20
        assert any(r["Sharding"] == attrs["shard_optimizer"] and abs(float(r["Optimizer state (MiB)"]) - opt) <= 0.0051
                   for r in sharding), f"{name}: no sharding row with optimizer state {opt:.2f} MiB"
    # (i): each zero1 configuration's exposed communication of the gradients (the exposed less what
    # waited after the optimizer) beside the ring model's, o and w from the 2-rank all-reduce run
    # among the results.
    model = rows_of(table_with(tables, "Sharding", "Grad Comm measured (ms)", "Grad Comm predicted (ms)")[0])
    for name, (attrs, _) in groups[0].items():
        if attrs["shard_optimizer"] != "zero1":
            continue
        comm = np.concatenate([g[name][1]["comm_ms"] - g[name][1]["param_comm_ms"] for g in groups])
        bucket = "-" if attrs["ddp"] != "bucketed" else f"{attrs['bucket_mb']:g}"
        (row,) = [r for r in model if r["Impl"] == attrs["ddp"] and r["Bucket (MiB)"] == bucket]
        close(row["Grad Comm measured (ms)"], comm.mean(), f"{name} (i) measured comm")
        assert float(row["Grad Comm predicted (ms)"]) > 0 and row["Ranks (group x groups)"] == "2", row


def check_scaling(tables, runs, text):
    # The study's summary is the first link at the top of a long report.
    (sections,) = [line for line in text.splitlines() if line.startswith("Sections: ")]
    assert sections.startswith("Sections: [scaling study, in short](#scaling-study-in-short) · "), sections
    assert "\n### Scaling study: in short\n" in text, "the link's heading"
    slowest = {}
    for kind in ("strong", "weak"):
        for n in (1, 2):
            (attrs, arrays), = raw(runs[f"scaling/{kind}-np{n}"], 0, "ddp").values()
            slowest[kind, n] = arrays["step_ms_max_over_ranks"].mean()
    # At 2 ranks strong (global 4) and weak (2 per rank) are the same configuration, measured twice:
    # a series may take either measurement.
    twos = (slowest["strong", 2], slowest["weak", 2])
    rows = [r for t in table_with(tables, "Ranks", "Efficiency", "Source") for r in rows_of(t)
            if r["Ranks"] == "2" and r["Source"].startswith("measured")]
    assert len(rows) == 2, f"expected a measured 2-rank row in the strong and in the weak table: {rows}"
    for kind, expected in (("strong", [slowest["strong", 1] / (2 * t) for t in twos]),
                           ("weak", [slowest["weak", 1] / t for t in twos])):
        assert any(abs(float(r["Efficiency"].rstrip("%")) - 100 * e) <= 0.051 for r in rows for e in expected), \
            f"{kind} efficiency at 2 ranks: expected one of {[f'{100 * e:.1f}%' for e in expected]}, rows {rows}"
    projections = [r for t in table_with(tables, "Ranks", "Efficiency", "Source") for r in rows_of(t)
                   if r["Source"].startswith("projection")]
    assert projections and all(int(r["Ranks"]) > 2 for r in projections), f"projections: {projections}"
    # A weak projection starts from the step measured at the most ranks and the collectives only grow
    # with the ring: never a step shorter, nor an efficiency higher, than the last measured.
    for block in text.split("### Scaling, weak: ")[1:]:
        (series,) = [rows_of(t) for t in parse_markdown_tables(block.split("\n### ")[0])]
        measured = [r for r in series if r["Source"].startswith("measured")]
        last = measured[-1]
        for r in series[len(measured):]:
            assert float(r["Step (ms)"]) >= float(last["Step (ms)"]) - 0.01 and \
                float(r["Efficiency"].rstrip("%")) <= float(last["Efficiency"].rstrip("%")) + 0.05, (last, r)
    # Speed-up: strong T(1) / T(n); weak the scaled n T(1) / T(n) (2 ranks do twice the work), each
    # table defining its own.
    for kind, expected in (("strong", [slowest["strong", 1] / t for t in twos]),
                           ("weak", [2 * slowest["weak", 1] / t for t in twos])):
        block = text.split(f"### Scaling, {kind}: ")[1].split("\n### ")[0]
        definition = "Speed-up: T(1) / T(n)" if kind == "strong" else "Speed-up: scaled, n T(1) / T(n)"
        assert definition in block, f"{kind}: no definition '{definition}' under the title:\n{block}"
        (row,) = [r for r in rows_of(parse_markdown_tables(block)[0])
                  if r["Ranks"] == "2" and r["Source"].startswith("measured")]
        assert any(abs(float(row["Speed-up"]) - e) <= 0.0051 for e in expected), (kind, row, expected)
        assert row["Nodes"] == "1", row
    # The study table: a row per run, its figures from the rank files; "of one rank's" against
    # strong-np1, the one-rank run at the same global batch (4). CPU runs: per rank, not per GPU.
    (study,) = table_with(tables, "Run", "Tokens/s per rank", "Of one rank's",
                          "Gradients' exposed comm, measured / predicted (ms)")
    # MFU's numerator, shown on CPUs too (no peak there: MFU '-'): tokens/s x one model's FLOPs per
    # token, so the same ratio in every row of a model (to the 3 digits printed).
    per_token = {}
    for r in rows_of(study):
        assert r["MFU"] == "-", r
        per_token.setdefault(r.get("Model", ""), []).append(
            float(r["Model GFLOP/s per rank"]) * 1e9 / float(r["Tokens/s per rank"].replace(",", "")))
    assert all(min(v) > 0 and max(v) / min(v) < 1.01 for v in per_token.values()), per_token
    # Which layout: at 2 ranks and global batch 4 (the ddp run's strategies and the scaling runs)
    # the fastest is the table's smallest step there.
    # (--ddp none, each rank training alone, is a baseline, not a layout to choose)
    twos = [r for r in rows_of(study) if r["Ranks (tp x dp)"] == "2" and r["Global batch"] == "4" and r["Layout"] != "none"]
    best = min(float(r["Step (ms)"]) for r in twos)
    (line,) = [l for l in text.splitlines() if l.startswith("- ") and ", 2 ranks, global batch 4: fastest" in l]
    # Steps equal to the digits printed tie: the one named is any of them; steps within the noise are
    # said not to be told apart, the fastest first.
    fastest = line.split(": fastest", 1)[1].split("; least memory")[0]
    if fastest.startswith(" not told apart"):
        fastest = re.split(r"standard error\): ", fastest, maxsplit=1)[1]
        assert re.match(r"\*\*[^*]+\*\* \([\d.]+ ± [\d.]+ ms", fastest), line  # each with its spread
    assert any(fastest.lstrip().startswith(f"**{r['Layout']}** ({r['Step (ms)']} ") for r in twos
               if float(r["Step (ms)"]) == best), (line, best)
    # The section opens with the study in short: each layout's efficiency and tokens/s at the most ranks.
    ddp_part = text.split("\n## ddp\n")[1]
    assert ddp_part.lstrip().startswith("### Scaling study: in short"), ddp_part[:300]
    short = ddp_part.split("### Scaling study: in short")[1].split("\n### ")[0]
    for kind in ("strong", "weak"):
        block = text.split(f"### Scaling, {kind}: ")[1].split("\n### ")[0]
        (last,) = [r for r in rows_of(parse_markdown_tables(block)[0]) if r["Ranks"] == "2" and r["Source"].startswith("measured")]
        assert f"{kind} (global batch {'4' if kind == 'strong' else '2 x ranks'}) efficiency {last['Efficiency']} at 2 ranks, " \
            f"{last['Tokens/s per rank']} tokens/s per rank" in short, (kind, last, short)
    assert "- At the most ranks measured (2):\n  - " in short and "fastest" in short, short
    # At one rank the collectives have no peer: the exposed comm there is said not to be a network's.
    assert "At one data-parallel rank (strong-np1, weak-np1) the gradients' collectives have no peer" in text or \
        "At one data-parallel rank (weak-np1, strong-np1) the gradients' collectives have no peer" in text, text
    # Which o is which: (e)'s at b*, of the line around it; (i)'s through the smallest and largest sizes; both
    # from the in-place back-to-back times.
    assert re.search(r"at b\*: o = [0-9.]+ us, w = [0-9.e+]+ GB/s \(the line through the all-reduce's [0-9.]+ MB and "
                     r"[0-9.]+ MB, around b\*", text), text
    assert "as one line, through the all-reduce's smallest and largest sizes (0.004 MB and 1 MB, a summary, not " \
        "what the predictions take), o = " in text, text
    assert "each the back-to-back time per operation averaged over ranks, fp32, in place;" in text, text
    study = {r["Run"]: r for r in rows_of(study) if r["Run"] != "ddp"}  # ddp: the strategies' run, 2 ranks
    assert sorted(study) == sorted(f"{k}-np{n}" for k in ("strong", "weak") for n in (1, 2)), sorted(study)
    one_gpu = 4 * 16 / (slowest["strong", 1] / 1e3)
    for kind in ("strong", "weak"):
        for n in (1, 2):
            files = [raw(runs[f"scaling/{kind}-np{n}"], rank, "ddp") for rank in range(n)]
            ((attrs, arrays),) = files[0].values()
            row = study[f"{kind}-np{n}"]
            tokens = attrs["batch_size"] * 16 / (slowest[kind, n] / 1e3) / n
            assert row["Ranks (tp x dp)"] == str(n) and row["Global batch"] == str(attrs["batch_size"]), row
            close(row["Tokens/s per rank"].replace(",", ""), tokens, f"{kind}-np{n} tokens/s per rank")
            if attrs["batch_size"] == 4:
                close(row["Of one rank's"], tokens / one_gpu, f"{kind}-np{n} of one rank's")
            else:  # weak-np1, the one-rank run at batch 2, against itself
                assert row["Of one rank's"] == "1.000", f"{kind}-np{n}: {row}"
            peak = max(a["peak_memory_bytes"] for f in files for a, _ in f.values())
            close(row["Peak per rank (GiB)"], peak / 2**30, f"{kind}-np{n} peak")
            digits = row["Peak per rank (GiB)"].lstrip("0.")  # a small model's MiB: 3 significant digits
            assert len(digits) >= 3, f"{kind}-np{n} peak {row['Peak per rank (GiB)']}: too few digits"
            fitted = row["Predicted from (collectives' run: ranks, nodes)"]  # the first 2-rank comm run's
            assert fitted == ("-" if n == 1 else "comm-np2: 2 ranks, 1 node"), row
            comm = np.concatenate([arr["comm_ms"] - arr["param_comm_ms"] for f in files for _, arr in f.values()])
            exposed, predicted = row["Gradients' exposed comm, measured / predicted (ms)"].split(" / ")
            close(exposed, comm.mean(), f"{kind}-np{n} exposed comm")
            assert (predicted == "-") == (n == 1) and (n == 1 or float(predicted) > 0), row
            # The collectives' device time: not measured by the mpi backend, predicted where they run.
            busy, predicted = row["Comm time, measured / predicted (ms)"].split(" / ")
            assert busy == "-" and not any("comm_busy_ms" in arr for f in files for _, arr in f.values()), row
            assert (predicted == "-") == (n == 1) and (n == 1 or float(predicted) > 0), row
            assert row["Comm time, ratio"] == "-", row


def check_scaling_nodes(runs, work):
    """Predictions where the collectives ran on other nodes than the configuration: the report says so.
    The 2-rank runs set as if on two nodes; the one all-reduce run measured on one."""
    sys.path.insert(0, ANALYSIS)
    import ddp
    import llmhpc_h5
    import scaling
    df, _ = ddp.load([runs[f"scaling/{k}-np{n}"] for k in ("strong", "weak") for n in (1, 2)], None)
    df.loc[df.world_size == 2, "nodes"] = 2
    models = ddp.comm_models([llmhpc_h5.open_run(runs["scaling/allreduce-np2"])])
    out = os.path.join(work, "two-nodes")
    os.makedirs(out)
    text = scaling.report(df, models, out)
    (study,) = [rows_of(t) for t in parse_markdown_tables(text) if "Nodes" in t[0] and "Run" in t[0]]
    for r in study:
        want = "-" if r["Ranks (tp x dp)"] == "1" else "allreduce-np2: 2 ranks, 1 node, **not this run's 2 nodes**"
        assert r["Nodes"] == ("1" if r["Ranks (tp x dp)"] == "1" else "2") and \
            r["Predicted from (collectives' run: ranks, nodes)"] == want, r
    sources = [l for l in text.splitlines() if "| projection" in l]
    assert sources and all("allreduce-np2: 2 ranks, 1 node, **not the 2-rank run's 2 nodes**" in l for l in sources), \
        sources
    # Which run a prediction takes: one on the configuration's nodes first, then on its ranks, then the most.
    one, three = dict(world_size=2, nodes=1), dict(world_size=4, nodes=3)
    pick = {(2, "default"): one, (4, "default"): three, (8, "network"): dict(world_size=8, nodes=2)}
    assert scaling.model_for(pick, 2, "default", 1) is one and scaling.model_for(pick, 2, "default", 3) is three
    assert scaling.model_for(pick, 4, "default", 1) is one and scaling.model_for(pick, 4, "default", 2) is three
    assert scaling.model_for(pick, 2, "default") is one and scaling.model_for(pick, 16, "default") is three
    assert scaling.model_for({(1, "default"): dict(world_size=1, nodes=1)}, 2, "default", 1) is None
    # Memory: 3 significant digits below a GiB; the least memory within 1% of two layouts a tie.
    assert [scaling.gib(b) for b in (26 * 2**20, 2**20, 3 * 2**30)] == ["0.0254", "0.000977", "3.000"]
    rows = scaling.ok_runs(df[(df.world_size == 2) & (df.batch_size == 4)]).iloc[[0, 0, 0]].reset_index(drop=True)
    rows = rows.assign(layout=["fast", "small", "twin"], slowest_step_mean=[10.0, 20.0, 30.0],
                       slowest_step_std=[0.1, 0.1, 0.1], peak_memory_bytes=[2_000_000, 1_000_000, 1_005_000])
    (line,) = scaling.choices(rows, "rank")
    assert "fastest **fast**" in line and "peak 0.00186 GiB" in line and \
        "least memory, a tie within 1%: **small** (0.000931 GiB, its step 2.00x the fastest's), **twin** " \
        "(0.000936 GiB, its step 3.00x the fastest's)" in line, line
    (line,) = scaling.choices(rows.assign(peak_memory_bytes=[1_000_000, 2_000_000, 3_000_000]), "rank")
    assert line.endswith("also the least memory") and "tokens/s per rank" in line, line
    # Equal peaks: a tie named as one, not "also the least memory".
    (line,) = scaling.choices(rows.assign(peak_memory_bytes=[1_000_000, 1_000_000, 2_000_000]), "rank")
    assert "also the least memory" not in line and line.endswith(
        "; least memory, a tie within 1%: **fast** (0.000931 GiB, the fastest), **small** (0.000931 GiB, its step "
        "2.00x the fastest's)"), line
    # The fastest within 1% of the least, but not the least: both named, the least first.
    (line,) = scaling.choices(rows.assign(peak_memory_bytes=[1_005_000, 1_000_000, 2_000_000]), "rank")
    assert "also the least memory" not in line and "; least memory, a tie within 1%: **small** (0.000931 GiB, its " \
        "step 2.00x the fastest's), **fast** (0.000936 GiB, the fastest)" in line, line
    # Steps within the noise (2 standard errors of the difference of the means, at least 1%) are not
    # told apart: no one layout is the fastest, each step with its standard error.
    tie = rows.assign(slowest_step_mean=[10.0, 10.05, 30.0], peak_memory_bytes=[1_000_000, 1_000_000, 2_000_000],
                      slowest_step_n=[10, 10, 10])
    (line,) = scaling.choices(tie, "rank")
    assert "fastest not told apart (the steps vary more than they differ: means within 2 standard errors" in line \
        and "**fast** (10.00 ± 0.03 ms" in line and "**small** (10.05 ± 0.03 ms" in line and "**twin**" not in line and "also the least memory" not in line and \
        "(0.000931 GiB, one of the fastest), **small** (0.000931 GiB, one of the fastest)" in line, line
    for apart in (tie.assign(slowest_step_mean=[10.0, 10.5, 30.0]),  # 5%: more than 1% and than the noise
                  tie.assign(slowest_step_mean=[10.0, 10.5, 30.0], slowest_step_std=[0.01, 0.01, 0.01]),
                  # 0.5 ms apart, steps varying by 0.6 ms: over 10 steps each mean is known to 0.19 ms, the
                  # difference to 0.2 ms; 0.5 is more than two such (a standard deviation would call it a tie)
                  tie.assign(slowest_step_mean=[10.0, 10.5, 30.0], slowest_step_std=[0.6, 0.1, 0.1])):
        (line,) = scaling.choices(apart, "rank")
        assert "fastest **fast**" in line and "not told apart" not in line, line
    for noisy in (tie.assign(slowest_step_mean=[10.0, 10.5, 30.0], slowest_step_std=[1.2, 0.1, 0.1]),
                  # 3 steps of 0.6 ms each: the means known to 0.35 ms, 0.5 ms apart is within two
                  tie.assign(slowest_step_mean=[10.0, 10.5, 30.0], slowest_step_std=[0.6, 0.1, 0.1],
                             slowest_step_n=[3, 3, 3])):
        (line,) = scaling.choices(noisy, "rank")
        assert "fastest not told apart" in line, line  # within the fastest's noise
    assert scaling.choices(rows, "rank", ranks=4) == [], "only the rank count asked for"
    # Ranks that shared cores, by what their files record: more threads on a node than the CPUs each may use.
    def node(count, allowed, threads=1):
        files = [types.SimpleNamespace(rank=r, attrs=dict(cpus_allowed=allowed, cpu_threads=threads))
                 for r in range(count)]
        return types.SimpleNamespace(files=files, nodes=lambda: [("vm", list(range(count)))])
    assert ddp.cores_shared(node(4, 2)) == "vm: 4 ranks, 4 threads on 2 CPUs"
    assert ddp.cores_shared(node(1, 2, 4)) == "vm: 1 rank, 4 threads on 2 CPUs"
    assert ddp.cores_shared(node(2, 2)) == "" and ddp.cores_shared(node(2, 1)) == ""  # 1 CPU each: bound, own cores
    old = node(2, 2)
    for f in old.files:
        del f.attrs["cpus_allowed"]
    assert ddp.cores_shared(old) == "", "files without cpus_allowed say nothing"
    # With the node's union of affinity masks recorded, no guess: 2 ranks bound to 1 CPU each share
    # one core where the union is 1, and 4 ranks on 4 CPUs of their own do not.
    def bound(count, threads, union):
        n = node(count, 1, threads)
        for f in n.files:
            f.attrs["node_cpus_allowed"] = union
        return n
    assert ddp.cores_shared(bound(2, 1, 1)) == "vm: 2 ranks, 2 threads on 1 CPUs"
    assert ddp.cores_shared(bound(4, 1, 4)) == "" and ddp.cores_shared(bound(2, 2, 4)) == ""
    shared = df.assign(cores_shared=["vm: 2 ranks, 2 threads on 1 CPUs" if n == 2 else "" for n in df.world_size])
    text = scaling.report(shared, models, out)
    short = text.split("### Scaling study: in short")[1].split("\n### ")[0]
    assert "**Ranks shared cores** in strong-np2 (vm: 2 ranks, 2 threads on 1 CPUs); weak-np2 (vm: 2 ranks, 2 threads " \
        "on 1 CPUs): those points measure the ranks' contention for the cores, not scaling" in short, short
    assert "shared cores" not in scaling.report(df, models, out), "no warning where no ranks shared cores"
    # ... and each such point is marked where it is measured, and no projection from it trusted.
    measured = [l for l in text.splitlines() if l.startswith("| 2 |") and "| measured (" in l]
    assert measured and all("; **ranks shared cores**) |" in l for l in measured), measured
    projected = [l for l in text.splitlines() if "| projection (" in l]
    assert projected and all(l.endswith("not to be trusted** |") for l in projected), projected
    assert "where ranks shared cores (vm: 2 ranks, 2 threads on 1 CPUs): that step measures the ranks' contention" \
        in text or all("model off" in l for l in projected), text
    check_twins(df, rows)
    check_group_batch(df)
    check_model_off(df, models, work)


def check_twins(df, rows):
    """Sharding over a data-parallel group of one rank (tp x dp 1) shards nothing: the choice of layout
    names the pair once, and a series of such runs is the unsharded one's and is left out."""
    import pandas as pd
    import scaling
    twin = rows.assign(layout=["tp", "tp zero1", "other"], tp=[2, 2, 1], shard_optimizer=["none", "zero1", "none"],
                       slowest_step_mean=[12.0, 10.0, 11.0], slowest_step_std=[0.01] * 3, slowest_step_n=[10] * 3,
                       peak_memory_bytes=[1_000_000, 1_000_000, 2_000_000])
    assert scaling.unsharded_twin(twin, twin.iloc[1]) == twin.index[0] and \
        scaling.unsharded_twin(twin, twin.iloc[0]) is None and scaling.unsharded_twin(twin, twin.iloc[2]) is None
    assert abs(scaling.twin_drift(twin) - 0.2) < 1e-12, scaling.twin_drift(twin)
    (line,) = scaling.choices(twin, "rank")
    assert "fastest **other** (11.00 ms" in line and "tp zero1" not in line, line
    (line,) = scaling.choices(twin.assign(shard_optimizer="none", layout=["tp", "tp again", "other"]), "rank")
    assert "fastest **tp again** (10.00 ms" in line, line
    # A sharded series whose every point is the unsharded one's twin is not a series of its own.
    ok = scaling.ok_runs(df)
    two = ok[(ok.world_size == 2) & (ok.shard_optimizer == "none")].iloc[[0]].assign(tp=2)
    one = ok[(ok.world_size == 1) & (ok.batch_size == int(two.batch_size.iloc[0]))].iloc[[0]]
    base = pd.concat([one, two]).reset_index(drop=True)
    found = [lay for _, _, lay, _ in scaling.series(base)]
    assert found and not any("zero1" in f for f in found), found
    both = pd.concat([base, two.assign(shard_optimizer="zero1")]).reset_index(drop=True)
    assert [lay for _, _, lay, _ in scaling.series(both)] == found, "the twin's series again"


def check_group_batch(df):
    """Weak scaling under tensor parallelism: a group steps tp times the sequences of the one-rank run
    it is measured against, which the note under the series says, with one rank at the group's batch."""
    import scaling
    ok = scaling.ok_runs(df)
    base = ok[(ok.world_size == 1) & (ok.batch_size == 2)].iloc[0]
    last = base.copy()
    last["world_size"], last["tp"], last["batch_size"] = 2, 2, 4
    note = scaling.group_batch_note(ok, base, last, "rank")
    assert "each tensor-parallel group of 2 ranks steps 4 sequences, where the one-rank run the series is measured " \
        "against stepped 2" in note and "One rank at global batch 4 (strong-np1) ran " in note, note
    last["tp"] = 1
    assert scaling.group_batch_note(ok, base, last, "rank") == "", "no tensor parallelism: nothing to say"


def check_model_off(df, models, work):
    """Measured / predicted exposed comm outside [0.67, 1.5]: the study table flags the configuration and
    says so under it, and the series projected from it say their projections are not to be trusted;
    measured as predicted, no flag and the projections as before."""
    import scaling
    # An exposed tail 10x off the model, but 4.5 ms of a 135 ms step, flags nothing; of a 50 ms step, it does.
    assert math.isnan(scaling.model_off(0.5, 5.0, 135.0)) and scaling.model_off(0.5, 5.0, 50.0) == 10.0
    ok = scaling.ok_runs(df)
    predicted = {i: scaling.stage_comm_ms(ok.loc[i], scaling.model_for(models, 2, "default", 1))["grad"]
                 for i in ok.index[ok.world_size == 2]}
    assert all(p > 0 for p in predicted.values()), predicted
    out = os.path.join(work, "model-off")
    os.makedirs(out)
    df = df.copy()
    for i, p in predicted.items():
        # The flag asks for a gap of 5% of the step or more: a step the machine slowed (shared
        # cores) must not hide the 7x gap below, so the step is at most ten times that gap; the
        # same step in every frame, so that their projections are the same.
        df.loc[i, "slowest_step_mean"] = min(float(df.loc[i, "slowest_step_mean"]), 10 * 6.0 * p)
    exact = df.copy()
    for i, p in predicted.items():
        exact.loc[i, ["comm_mean", "grad_comm_mean"]] = p  # nothing waits after the optimizer here
    text = scaling.report(exact, models, out)
    assert "not to be trusted" not in text and "**Model off**" not in text, text
    (study,) = [rows_of(t) for t in parse_markdown_tables(text) if "Gradients' exposed comm, ratio" in t[0]]
    assert {r["Gradients' exposed comm, ratio"] for r in study if r["Ranks (tp x dp)"] == "2"} == {"1.00"}, study
    projected = [l.split("| projection")[0] for l in text.splitlines() if "| projection" in l]
    off = df.copy()
    for i, p in predicted.items():
        off.loc[i, ["comm_mean", "grad_comm_mean"]] = 7.0 * p
    text = scaling.report(off, models, out)
    (study,) = [rows_of(t) for t in parse_markdown_tables(text) if "Gradients' exposed comm, ratio" in t[0]]
    assert {r["Gradients' exposed comm, ratio"] for r in study if r["Ranks (tp x dp)"] == "2"} == {"7.00 **model off**"}, study
    assert "the ring model is off by 7.0x here, so projections built on it are not to be trusted" in \
        text.split("### Scaling study: every configuration measured")[1].split("\n### ")[0], text
    for kind in ("strong", "weak"):
        block = text.split(f"### Scaling, {kind}: ")[1].split("\n### ")[0]
        assert "**The projections start from 2 ranks, where exposed comm measured" in block and \
            "off by 7.0x here, so projections built on it are not to be trusted.**" in block, block
        rows = [r for r in rows_of(parse_markdown_tables(block)[0]) if r["Source"].startswith("projection")]
        assert rows and all(r["Source"].endswith("**model off: not to be trusted**") for r in rows), rows
    # scaling.png draws them apart (faint and dotted), its caption naming the links every projection assumes.
    for frame, trusted in ((exact, True), (off, False)):
        for kind, _, _, rows in scaling.series(frame, "rank"):
            points = scaling.efficiency_rows(kind, rows, models)
            ahead = [p for p in points if p.source.startswith("projection")]
            assert ahead and all(p.trusted == trusted and p.origin.startswith("allreduce-np2: 2 ranks, 1 node")
                                 for p in ahead), points
    assert "Projections (dashed) assume at every rank count the links the collectives' run they take measured " \
        "(allreduce-np2: 2 ranks, 1 node, **not the 2-rank run's 2 nodes**); faint and dotted: at the most ranks measured the ring " \
        "model is off or nothing checked it: not to be trusted." in text, text
    assert "projections built on it are drawn faint and dotted in scaling.png" in text.split("### Scaling study: in short")[1] \
        .split("\n### ")[0], text
    # Otherwise as before: the same projected rows (ranks, steps, efficiencies), only flagged.
    assert [l.split("| projection")[0] for l in text.splitlines() if "| projection" in l] == projected, text
    # A series whose most ranks are one tensor-parallel group (tp 2 x dp 1) never ran the gradients'
    # collectives: its projections are unchecked, said so and drawn faint; the model is not "off".
    grouped = exact.copy()
    grouped.loc[grouped.world_size == 2, "tp"] = 2
    text = scaling.report(grouped, models, out)
    for kind in ("strong", "weak"):
        block = text.split(f"### Scaling, {kind}: ")[1].split("\n### ")[0]
        assert "**The projections start from 2 ranks, tp 2 x dp 1: no data-parallel collective ran there" in block, block
        rows = [r for r in rows_of(parse_markdown_tables(block)[0]) if r["Source"].startswith("projection")]
        assert rows and all(r["Source"].endswith("**model unchecked: not to be trusted**") for r in rows), rows
    short = text.split("### Scaling study: in short")[1].split("\n### ")[0]
    assert "start from one data-parallel rank" in short and "model is off for" not in short, short
    for kind, _, _, rows in scaling.series(grouped, "rank"):
        assert not any(p.trusted for p in scaling.efficiency_rows(kind, rows, models) if p.origin), kind
    # Efficiencies above 100% say what they are measured against, where they appear.
    fast = exact.copy()
    fast.loc[fast.world_size == 2, "slowest_step_mean"] = 0.4 * float(
        fast[(fast.world_size == 1) & (fast.batch_size == 4)].slowest_step_mean.iloc[0])
    text = scaling.report(fast, models, out)
    block = text.split("### Scaling, strong: ")[1].split("\n### ")[0]
    assert "| 125.0% |" in block and "Above 100% (above 1 of one rank's): measured against the one-rank run of the " \
        "same model, unsharded and without tensor parallelism." in block, block
    assert "Above 100%" in text.split("### Scaling study: in short")[1].split("\n### ")[0], text
    # A series without a one-rank run is measured against its first run, and says so.
    two = fast[fast.world_size == 2]
    four = two.assign(world_size=4, slowest_step_mean=0.2 * two.slowest_step_mean)
    text = scaling.report(pd.concat([two, four], ignore_index=True), models, out)
    assert "measured against the series' first run, at 2 ranks (no one-rank run of it ran)" in text, text
    slow = exact.copy()
    slow.loc[slow.world_size == 2, "slowest_step_mean"] = 3 * float(slow[slow.world_size == 1].slowest_step_mean.max())
    assert "Above 100%" not in scaling.report(slow, models, out), "no such note where no efficiency passes 100%"
    # The model's sizes: a collective outside those the collectives' run measured is said to be.
    model = dict(world_size=2, o=0.01, w=1e6, kinds={"allreduce": [(4096, 0.01), (65536, 0.02)]})
    assert scaling.beyond_measured(model, [("allreduce", 1e6)]) == \
        "its all-reduce of 1 MB beyond the measured sizes (largest 0.0655 MB)"
    assert scaling.beyond_measured(model, [("allreduce", 1000)]) == \
        "its all-reduce of 0.001 MB below the measured sizes (smallest 0.0041 MB)"
    assert scaling.beyond_measured(model, [("allreduce", 65536), ("allreduce", 4096), ("allgather", 60000)]) == ""
    # (an all-gather the run did not measure: the all-reduce moving as many bytes, half of them on 2 ranks)
    assert "its all-gather of 0.2 MB beyond" in scaling.beyond_measured(model, [("allgather", 200000)])
    big = exact.assign(comm_bytes_per_step=exact.comm_bytes_per_step * 1000)
    (study,) = [rows_of(t) for t in parse_markdown_tables(scaling.report(big, models, out))
                if "Gradients' exposed comm, ratio" in t[0]]
    for r in study:
        cell = r["Predicted from (collectives' run: ranks, nodes)"]
        assert cell == "-" if r["Ranks (tp x dp)"] == "1" else \
            re.fullmatch(r"allreduce-np2: 2 ranks, 1 node, \*\*not this run's 2 nodes\*\*; its all-reduce of [0-9.]+ "
                         r"MB beyond the measured sizes "
                         r"\(largest 1 MB\)", cell), r


def check_tp_ddp(runs, work):
    """A tensor-parallel ddp run: every table that shows a layout's communication (ddp (a), (b), (c),
    (f), (g), (i), the scaling study) has TP wait beside it, the pooled mean of tp_comm_ms, defined as
    inside forward and backward; the breakdown plot draws it (hatched)."""
    sys.path.insert(0, ANALYSIS)
    import ddp
    import llmhpc_h5
    import scaling
    files = [raw(runs["tp-ddp"], rank, "ddp") for rank in (0, 1)]
    waited = {(a["ddp"], a["shard_optimizer"]): np.concatenate([f[name][1]["tp_comm_ms"] for f in files])
              for name, (a, _) in files[0].items()}
    assert all(w.mean() > 0 for w in waited.values()), waited
    out = os.path.join(work, "tp-ddp", "report.md")
    text = run([sys.executable, os.path.join(ANALYSIS, "report.py"), runs["tp-ddp"], "-o", out]).stdout
    # One rank count, several layouts: the choice among them, zero1 at dp 1 (sharding nothing) not among them.
    (choice,) = [b for b in text.split("\n### ") if b.startswith("Which layout")]
    line = choice.split("\n\n")[1]
    assert line.startswith("- d32_L2 T=16 fp32, 2 ranks, global batch 4: fastest") and "tp 2" in line and \
        "zero1" not in line, choice
    for column, letter in (("TP wait Mean (ms)", "(a)"), ("TP wait (ms)", "(b)"), ("TP wait (ms)", "(c)"),
                           ("TP wait (ms)", "(f)"), ("TP wait (ms)", "(g)")):
        (block,) = [b for b in text.split("\n### ") if b.startswith(letter)]
        # the definitions, in the paragraph under the heading
        assert "inside Fwd and Bwd and so in the step, not added to them" in block.split("\n\n")[1], block
        header, rows = parse_markdown_tables("### " + block)[0]
        for r in (dict(zip(header, r)) for r in rows):
            key = (r["Impl"], r.get("Sharding", "none"))
            close(r[column], waited[key].mean(), f"{letter} {key}: TP wait")
    (block,) = [b for b in text.split("\n### ") if b.startswith("(c)")]
    assert "none: each tensor-parallel group alone at the local batch" in block, block  # not "each rank alone"
    (block,) = [b for b in text.split("\n### ") if b.startswith("(i)")]
    assert "TP wait" in block.split("\n\n")[1], block  # no all-reduce model here: the definition, no table
    assert "Hatched: what the layers waited for the tensor-parallel group's collectives" in text, text
    # The breakdown plot draws the wait: without it (0) the image differs.
    df, _ = ddp.load([runs["tp-ddp"]], None)
    drawn, without = (os.path.join(work, "tp-ddp", f"{n}.png") for n in ("drawn", "without"))
    ddp.plot_breakdown(df, drawn)
    ddp.plot_breakdown(df.assign(tp_comm_mean=0.0), without)
    assert open(drawn, "rb").read() != open(without, "rb").read(), "the breakdown plot does not draw the tp wait"
    # Only --ddp none (each rank alone): table (a) lists it rather than leaving the setup without a table.
    plain = df[df.shard_optimizer == "none"]
    alone = ddp.strategies_table(plain[plain.ddp == "none"], True, "t")
    assert alone.startswith("### (a) each rank alone (--ddp none)") and "\n| none |" in alone, alone
    both = ddp.strategies_table(plain, True, "t")
    assert both.startswith("### (a) DDP strategies") and "\n| none |" not in both, both
    # The scaling study: beside the one-rank run, TP wait for the tp run's rows, '-' for the other.
    df, _ = ddp.load([runs["tp-ddp"], runs["scaling/strong-np1"]], None)
    models = ddp.comm_models([llmhpc_h5.open_run(runs["scaling/allreduce-np2"])])
    text = scaling.report(df, models, os.path.join(work, "tp-ddp"))
    (study,) = [rows_of(t) for t in parse_markdown_tables(text) if "Run" in t[0] and "TP wait (ms)" in t[0]]
    for r in study:
        if r["Run"] == "strong-np1":
            assert r["TP wait (ms)"] == "-", r
        else:
            key = (r["Layout"].split()[0].rstrip(","), "zero1" if "zero1" in r["Layout"] else "none")
            close(r["TP wait (ms)"], waited[key].mean(), f"study {key}: TP wait")
    assert "TP wait: what the layers waited for the tensor-parallel group's collectives" in text and \
        "in none of these columns" not in text, text
    # A tensor-parallel group's ranks take the same sequences: tp 2 x dp 1 at global batch 4 takes 4 per rank.
    block = [b for b in text.split("### Scaling, strong: ")[1:] if b.splitlines()[0].endswith(", tp 2")][0]
    assert "a tensor-parallel group's 2 ranks take the same sequences" in block, block
    rows = rows_of(parse_markdown_tables(block.split("\n### ")[0])[0])
    assert [(r["Ranks"], r["Global batch"], r["Batch per data-parallel rank"]) for r in rows if
            r["Source"].startswith("measured")] == [("1", "4", "4"), ("2", "4", "4")], rows
    assert all(float(r["Batch per data-parallel rank"]) == int(r["Global batch"]) / (int(r["Ranks"]) // 2)
               for r in rows if r["Source"].startswith("projection")), rows


def check_scaling_png(path):
    """The panels fill the figure: its last quarter is not an empty band (the legend sits at its edge)."""
    import matplotlib.image
    image = matplotlib.image.imread(path)
    drawn = np.where((image[..., :3] < 0.9).any(axis=2).any(axis=0))[0]
    assert drawn[-1] >= 0.9 * image.shape[1], f"{path}: nothing drawn after column {drawn[-1]} of {image.shape[1]}"


def check_attention(tables, runs):
    rows = [r for t in table_with(tables, "head dim", "seq", "forward ms (mean ± std)") for r in rows_of(t)]
    for name, (attrs, arrays) in raw(runs["attention"], 0, "attention").items():
        cell = [r["forward ms (mean ± std)"] for r in rows if r["seq"] == str(attrs["seq"]) and r["status"] == "ok"]
        means = [float(c.split("±")[0]) for c in cell]
        assert any(abs(m - arrays["forward_ms"].mean()) <= 0.0005 + 1e-9 for m in means), \
            f"{name}: forward mean {arrays['forward_ms'].mean():.3f} not among {cell}"
        saved = [r["saved for backward MiB"] for r in rows if r["seq"] == str(attrs["seq"]) and r["status"] == "ok"]
        assert any(abs(float(c) - attrs["saved_bytes"] / 2**20) <= 0.0005 + 1e-9 for c in saved), \
            f"{name}: {attrs['saved_bytes']} bytes saved for backward not among {saved} MiB"
        kernels = {r["kernels"] for r in rows if r["seq"] == str(attrs["seq"])}
        assert attrs["attention_kernel"] in kernels, f"{name}: kernels {attrs['attention_kernel']!r} not among {kernels}"


def check_train(tables, runs, text):
    """The runs table: losses, and (as the terminal's) the means of the steps after the first, tokens/s
    from the wall time of those steps, global and per rank; the largest rank's peak; each column defined."""
    sys.path.insert(0, ANALYSIS)
    import llmhpc_h5
    import train
    # A run the watchdog ended at step 808 before its first write of steps: the record reads just
    # 'aborted by the watchdog', the file's status has the step, and the Steps cell says where it hung.
    hung = os.path.join(os.path.dirname(runs["train"]), "..", "hung-train")
    shutil.copytree(runs["train"], hung)
    with h5py.File(os.path.join(hung, "rank00000.h5"), "a") as f:
        f.attrs["status"] = (f"{llmhpc_h5.ABORTED}: no progress within --comm-timeout 3.0 s: collective #9 allreduce "
                             "(mpi, 4 bytes) in 'train' at step 808, issued 3.1 s ago")
        f["train"].attrs["status"] = "running"
        for name in list(f["train"].keys()):
            del f["train"][name]
    (row,) = rows_of(parse_markdown_tables(train.report_section([llmhpc_h5.open_run(hung)], hung))[0])
    assert row["Status"] == llmhpc_h5.ABORTED and row["Steps"] == "0 kept (hung at step 808)", row
    with h5py.File(os.path.join(runs["train"], "rank00000.h5"), "r") as f:
        loss = f["train/loss"][()]
        lr, grad_norm = f["train/lr"][()], f["train/grad_norm"][()]
        step, wall, sync = f["train/step_ms"][()], f["train/wall_ms"][()], f["train/sync_ms"][()]
        a = dict(f["train"].attrs)
    (row,) = rows_of(table_with(tables, "First loss", "Last loss")[0])
    assert row["DDP"] == "bucketed bf16", f"the gradients travelled as bf16: {row['DDP']}"
    close(row["First loss"], loss[0], "first loss")
    close(row["Last loss"], loss[-1], "last loss")
    assert row["Steps"] == str(len(loss)), row
    close(row["Step Mean (ms)"], step[1:].mean(), "step mean after the first step")
    close(row["Step Std (ms)"], std(step[1:]), "step std after the first step")
    close(row["Sync Mean (ms)"], sync[1:].mean(), "sync mean after the first step")
    tokens = a["batch_size"] * a["context_length"] / (wall[1:].mean() / 1e3)
    close(row["Tokens/s"].replace(",", ""), tokens, "tokens/s")
    close(row["Tokens/s per rank"].replace(",", ""), tokens / a["world_size"], "tokens/s per rank")
    close(row["Peak per rank (GiB)"], a["peak_memory_bytes"] / 2**30, "peak per rank")
    section = text.split("### Training runs")[1].split("\n### ")[0]
    for definition in ("- Means and Std: rank 0's steps after the first", "- Sync: ", "- Tokens/s: ",
                       "(wall_ms", "- Peak per rank: "):
        assert definition in section, f"no '{definition}' under the training runs' table:\n{section}"
    steps = rows_of(table_with(tables, "Step", "LR", "Grad norm")[0])
    assert len(steps) == len(loss), f"the loss table has {len(steps)} rows for {len(loss)} steps"
    for i, row in enumerate(steps):
        close(row["LR"], lr[i], f"lr of step {i + 1}")
        close(row["Grad norm"], grad_norm[i], f"gradient norm of step {i + 1}")
        close(row["Loss"], loss[i], f"loss of step {i + 1}")


def check_pngs(report_path):
    text = open(report_path).read()
    names = re.findall(r"!\[[^]]*\]\(([^)]+\.png)\)", text)
    for expected in ("bench.png", "bench_speedup_bf16.png", "attention_time.png", "attention_memory.png", "comm_busbw.png", "ddp_breakdown.png",
                     "scaling.png", "train_loss.png"):
        assert expected in names, f"the report does not show {expected} (it shows {names})"
    for name in names:
        path = os.path.join(os.path.dirname(report_path), name)
        with open(path, "rb") as f:
            assert f.read(8) == PNG_MAGIC, f"{path} is not a PNG"
        assert os.path.getsize(path) > 10_000, f"{path} is suspiciously small ({os.path.getsize(path)} bytes)"


def check_new_mode(work, runs):
    """A mode with a module of its own gets its section, with no edit to report.py."""
    analysis = os.path.join(work, "analysis")
    shutil.copytree(ANALYSIS, analysis, ignore=shutil.ignore_patterns("__pycache__"))
    with open(os.path.join(analysis, "newmode.py"), "w") as f:
        f.write("import os\n"
                "def report_section(runs, out_dir):\n"
                "    open(os.path.join(out_dir, 'newmode.png'), 'wb').write(b'\\x89PNG\\r\\n\\x1a\\n')\n"
                "    return 'NEWMODE SECTION of %d run(s)' % len(runs)\n")
    fake = os.path.join(work, "fake")
    shutil.copytree(runs["comm-np2"], fake)
    for n in ("rank00000.h5", "rank00001.h5"):
        with h5py.File(os.path.join(fake, n), "a") as f:
            f.attrs["mode"] = "newmode"
    proc = run([sys.executable, os.path.join(analysis, "report.py"), fake, runs["comm-np3"]])
    assert "## newmode" in proc.stdout and "NEWMODE SECTION of 1 run(s)" in proc.stdout, proc.stdout
    assert "## comm" in proc.stdout and os.path.exists(os.path.join(fake, "newmode.png")), proc.stdout


def check_accounting(runs):
    acc = [sys.executable, os.path.join(ANALYSIS, "accounting.py")]
    text = run(acc + ["memory"]).stdout
    assert "P = 219,848,638,464" in text and "| 16 P | 3517.58 |" in text and "-> 44 devices" in text, text
    text = run(acc + ["fsdp"]).stdout
    assert "N_FSDP >= 38" in text, text
    for args in (["tp-batch", "--w", "0"], ["memory", "--d-model", "-5"], ["fsdp", "--device-memory", "lots"]):
        bad = run(acc + args, expect_ok=False)  # a value the formulas cannot take: argparse's one line
        assert bad.returncode == 2 and "Traceback" not in bad.stderr and args[-1] in bad.stderr, bad.stderr
    (rows,) = [rows_of(t) for t in parse_markdown_tables(run(acc + ["tp-batch"]).stdout)]
    assert rows[0]["B* per device"] == "2798.81", rows[0]  # the reference communication study's 2798.81
    # b* from the raw all-reduce times (float, in place; back-to-back time averaged over ranks)
    comm = runs["scaling/allreduce-np2"]
    points = []
    for name, (attrs, arrays) in raw(comm, 0, "comm").items():
        if attrs["placement"] == "inplace":
            other = raw(comm, 1, "comm")[name][1]
            points.append((attrs["bytes"], (arrays["time_us_back_to_back"][0] + other["time_us_back_to_back"][0]) / 2))
    (small_b, small_us), (big_b, big_us) = sorted(points)  # o and w of the line through both
    w = (big_b - small_b) / (big_us - small_us) * 1e3 if big_us > small_us else big_b / big_us * 1e3  # bytes per ms
    o = max(small_us - small_b / (w / 1e3), 0) / 1e3   # ms
    s = 4 * 24736 * 1.0
    text = run(acc + ["bucket", "--comm", comm, "--grad-bytes", str(s)]).stdout
    if o > 0:
        found = re.search(r"b\* = sqrt\(s o w\) = ([0-9.e+-]+) MiB", text)
        assert found, f"o = {o} ms > 0 gives a finite b*:\n{text}"
        close(found.group(1), math.sqrt(s * o * w) / 2**20, "b* from the raw all-reduce times")
    else:  # a noisy CPU line through the origin or below it: no cost per bucket, no optimum
        assert "no finite optimum: o = 0" in text, f"o = 0 names no optimum:\n{text}"
    # Beside a bucket sweep: the b* of table (e) is the one the measured line names.
    text = run(acc + ["bucket", "--comm", comm, "--ddp", runs["ddp"]]).stdout
    optimum = r"b\* = sqrt\(s o w\) = ([0-9.e+-]+) MiB|no finite optimum"
    lines = text.splitlines()
    model = [m or "none" for line in lines if not line.startswith("Measured:") for m in re.findall(optimum, line)]
    named = [m or "none" for line in lines if line.startswith("Measured:") for m in re.findall(optimum, line)]
    assert model and named == model, f"one b* per setup, the same in (e) and beside the measured sweep:\n{text}"
    # measured memory beside the model: weights 4P, gradients 4P, state 8P (unsharded first configuration)
    text = run(acc + ["memory", "--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--vocab-size", "64", "--ddp",
                      runs["ddp"]]).stdout
    assert re.search(r"parameters \(0\.\d\d million\)", text), f"a small model's P in millions:\n{text}"
    rows = rows_of(parse_markdown_tables(text)[0])
    for r in rows[:3]:
        assert r["Measured / model"] == "1.00", f"measured memory should equal the model's: {r}"
    bad = run(acc + ["bucket", "--comm", runs["attention"]], expect_ok=False)
    assert bad.returncode == 2 and "not a comm run" in bad.stderr, bad.stderr
    # tp: one GPU's median step / tp + the run's bus bytes at --busbw, beside its measured median step
    (rows,) = [rows_of(t) for t in parse_markdown_tables(
        run(acc + ["tp", "--single", runs["tp/single"], "--train", runs["tp/tp2"], "--busbw", "1e9"]).stdout)]
    with h5py.File(os.path.join(runs["tp/single"], "rank00000.h5"), "r") as f:
        one = float(np.median(f["train/step_ms"][2:]))
    with h5py.File(os.path.join(runs["tp/tp2"], "rank00000.h5"), "r") as f:
        bus, measured = int(f["train"].attrs["tp_bus_bytes_per_step"]), float(np.median(f["train/step_ms"][2:]))
        waited = f["train/tp_comm_ms"][()]
        steps = f["train/step_ms"][()]
        assert "tp_comm_busy_ms" not in f["train"], "the mpi backend measures no device time"
    assert bus > 0, "a tp 2 run records the bytes its collectives moved"
    # What the layers waited for the group's collectives: some of every step, never all of it.
    assert len(waited) == len(steps) and np.all(waited > 0) and np.all(waited < steps), (waited, steps)
    close(rows[0]["Waited (ms)"], float(np.median(waited[2:])), "accounting tp: the measured waits")
    assert rows[0]["Collectives' time (ms)"] == "-" == rows[0]["Time measured / predicted"], rows[0]
    close(rows[0]["One GPU / tp (ms)"], one / 2, "accounting tp: one GPU's step / tp")
    close(rows[0]["Predicted step (ms)"], one / 2 + bus / 1e9 * 1e3, "accounting tp: the predicted step")
    close(rows[0]["Measured step (ms)"], measured, "accounting tp: the measured median step")
    bad = run(acc + ["tp", "--single", runs["tp/tp2"], "--train", runs["tp/tp2"], "--busbw", "1e9"], expect_ok=False)
    assert bad.returncode == 2 and "not one GPU" in bad.stderr, bad.stderr
    # The report's train section gives each run's tp x dp layout and its wait for the group.
    tp_report = os.path.join(os.path.dirname(runs["tp/tp2"]), "report.md")
    run([sys.executable, os.path.join(ANALYSIS, "report.py"), os.path.dirname(runs["tp/tp2"]), "-o", tp_report])
    trained = {r["Run"]: r for r in rows_of(table_with(parse_markdown_tables(open(tp_report).read()),
                                                       "Layout", "TP wait Mean (ms)")[0])}
    assert trained["tp2"]["Layout"] == "tp 2 x dp 1" and trained["single"]["Layout"] == "dp 1", trained
    close(trained["tp2"]["TP wait Mean (ms)"], waited[1:].mean(), "report: the tp run's wait for its group")
    assert trained["single"]["TP wait Mean (ms)"] == "-", trained["single"]
    assert "- TP wait: what the layers waited for the tensor-parallel group's collectives" in open(tp_report).read()
    # Two ranks: tokens/s per rank is half the run's, and the peak the larger rank's.
    peaks, walls = [], []
    for rank in (0, 1):
        with h5py.File(os.path.join(runs["tp/tp2"], f"rank{rank:05d}.h5"), "r") as f:
            peaks.append(f["train"].attrs["peak_memory_bytes"])
            walls.append(f["train/wall_ms"][()])
    tokens = 2 * 16 / (walls[0][1:].mean() / 1e3)  # rank 0's steps, as the terminal's
    close(trained["tp2"]["Tokens/s"].replace(",", ""), tokens, "tp2 tokens/s")
    close(trained["tp2"]["Tokens/s per rank"].replace(",", ""), tokens / 2, "tp2 tokens/s per rank")
    close(trained["tp2"]["Peak per rank (GiB)"], max(peaks) / 2**30, "tp2: the larger rank's peak")


def main():
    work = scratch_dir("llmhpc-report-")
    runs = make_runs(work)
    report_path = os.path.join(work, "report.md")
    proc = run([sys.executable, os.path.join(ANALYSIS, "report.py"), os.path.join(work, "results"), "-o", report_path])
    assert proc.stdout.startswith("# llmhpc report") and open(report_path).read() == proc.stdout[:-1], \
        "report.py should print what it wrote"
    tables = parse_markdown_tables(open(report_path).read())
    for mode in ("bench", "attention", "comm", "ddp", "train"):
        assert f"\n## {mode}\n" in open(report_path).read(), f"the report has no {mode} section"
    with h5py.File(os.path.join(runs["comm-np2"], "rank00001.h5"), "r") as f:  # the launch settings, per rank
        settings = f.attrs["environment_variables"]
        settings = settings.decode() if isinstance(settings, bytes) else settings
    assert "OMP_NUM_THREADS=1" in settings.splitlines(), f"environment_variables: {settings!r}"
    line = [l for l in open(report_path).read().splitlines() if runs["comm-np2"] in l]
    assert line and "OMP_NUM_THREADS=1" in line[0], f"the report does not name the launch settings: {line}"
    check_bench(tables, runs, open(report_path).read())
    check_comm(tables, runs)
    check_comm_nccl(tables, runs)
    check_ddp(tables, runs)
    check_scaling(tables, runs, open(report_path).read())
    check_scaling_nodes(runs, work)
    check_scaling_png(os.path.join(work, "scaling.png"))
    check_tp_ddp(runs, work)
    check_attention(tables, runs)
    check_train(tables, runs, open(report_path).read())
    check_pngs(report_path)
    check_new_mode(work, runs)
    check_accounting(runs)
    # plot_bench.py draws beside the results by default, not in the working directory
    cwd_before = set(os.listdir("."))
    run([sys.executable, os.path.join(ANALYSIS, "plot_bench.py"), runs["bench"]])
    assert os.path.getsize(os.path.join(runs["bench"], "bench.png")) > 10_000
    assert set(os.listdir(".")) == cwd_before, "plot_bench.py wrote into the working directory"
    # a folder without runs: a clear error, no report written
    empty = os.path.join(work, "empty")
    os.makedirs(empty)
    bad = run([sys.executable, os.path.join(ANALYSIS, "report.py"), empty], expect_ok=False)
    assert bad.returncode == 2 and "no llmhpc rank files" in bad.stderr and not os.listdir(empty), bad.stderr
    # -o into a folder that does not exist yet: made for the report; removed again when it fails
    fresh = os.path.join(work, "reports", "bench", "report.md")
    run([sys.executable, os.path.join(ANALYSIS, "report.py"), runs["bench"], "-o", fresh])
    assert os.path.getsize(fresh) > 0 and os.path.getsize(os.path.join(os.path.dirname(fresh), "bench.png")) > 10_000
    # The same report whatever the working directory and the run's path as given: runs are named
    # by their absolute paths.
    here = os.getcwd()
    os.chdir(os.path.dirname(runs["bench"]))
    try:
        relative = run([sys.executable, os.path.join(ANALYSIS, "report.py"), os.path.basename(runs["bench"]),
                        "-o", fresh]).stdout
    finally:
        os.chdir(here)
    assert relative == run([sys.executable, os.path.join(ANALYSIS, "report.py"), runs["bench"], "-o", fresh]).stdout
    failed = os.path.join(work, "reports", "none", "report.md")
    bad = run([sys.executable, os.path.join(ANALYSIS, "report.py"), empty, "-o", failed], expect_ok=False)
    assert bad.returncode == 2 and not os.path.exists(os.path.dirname(failed)), bad.stderr
    # a folder that does not exist (not made, not called empty), one that cannot be written (/proc,
    # for root too): a line each, exit 2
    gone = os.path.join(work, "gone")
    bad = run([sys.executable, os.path.join(ANALYSIS, "report.py"), gone], expect_ok=False)
    assert bad.returncode == 2 and "no such folder" in bad.stderr and not os.path.exists(gone), bad.stderr
    bad = run([sys.executable, os.path.join(ANALYSIS, "report.py"), runs["bench"], "-o", "/proc/report.md"],
              expect_ok=False)
    assert bad.returncode == 2 and "not writable" in bad.stderr and "-o" in bad.stderr, bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1, f"one line, no traceback: {bad.stderr}"
    # -o naming a folder, --decimals below 0: refused before any work, nothing left behind
    folder = os.path.join(work, "a_folder")
    os.makedirs(folder)
    for args, words in ((["-o", folder], "is a folder"), (["--decimals", "-1"], "0 or more")):
        bad = run([sys.executable, os.path.join(ANALYSIS, "report.py"), runs["bench"], *args], expect_ok=False)
        assert bad.returncode == 2 and words in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    assert os.listdir(folder) == [] and not os.path.exists(folder + ".tmp"), os.listdir(work)
    # A run given twice, or with the folder above it, is one run of the report; so for the other scripts.
    twice = run([sys.executable, os.path.join(ANALYSIS, "report.py"), runs["bench"], runs["bench"],
                 os.path.dirname(runs["bench"]), "-o", os.path.join(work, "twice.md")]).stdout
    assert sum(l.startswith(f"- `{runs['bench']}`") for l in twice.splitlines()) == 1, twice[:3000]
    # The other scripts' outputs: a folder that cannot take them is one line, not a traceback.
    bad = run([sys.executable, os.path.join(ANALYSIS, "plot_bench.py"), runs["bench"], "-o", "/proc/bench.png"],
              expect_ok=False)
    assert bad.returncode == 2 and "not writable" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    bad = run([sys.executable, os.path.join(ANALYSIS, "plot_bench.py"), runs["bench"], "-o", "plot.md"],
              expect_ok=False)
    assert bad.returncode == 2 and ".png, .pdf or .svg" in bad.stderr, bad.stderr
    print("test_report: OK")


if __name__ == "__main__":
    main()
