"""End to end: llmhpc --mode ddp under mpirun -np 2 and -np 3 on the CPU, and analysis/ddp.py.

A tiny custom model, every strategy and two bucket sizes (one smaller than any parameter
tensor, one larger than all of them). Checks, reading the files with h5py alone: every rank
file has every record with status ok; the per-step arrays have --steps elements (warm-up ones
--warmup); the global and local batch and world size; one bucket for the huge bucket size and
one per parameter tensor (3 + 9 per layer, counted here from the model) for the tiny one, and
the same number of collectives for naive; comm_bytes_per_step is 4 bytes x the parameters
(counted here) for every all-reducing strategy and 0 for none; step_ms_max_over_ranks is the
element-wise maximum of the ranks' step_ms. Then: Run.ddp_summary pools the ranks;
analysis/ddp.py prints every strategy, its step means are the raw arrays' means, the bucket
model's fit recovers o and w from exact data, --torch puts PyTorch records beside the right
rows, --comm takes o and w from an all-reduce run, out-of-memory rows are shown, not fatal, table
(h) puts the model state each ZeRO stage keeps per rank (none, zero1, zero2, zero3, fp32 and
bf16) beside analysis/accounting.py's state_bytes_per_rank within what padding adds; table (i)
and the scaling projections give each stage's collectives by the ring model, written out here for
synthetic rows, and on those runs and a hybrid one (--shard-group 2 on 4 ranks) a finite prediction
for every sharded stage beside its measured exposed communication; --tp 1,2
on 4 ranks records each rank's place in the tp x dp layout and its part of the state, with the
collectives inside the layers train makes at that layout; bad input to the binary (--ddp bogus,
--bucket-mb 0, a global batch the ranks do not divide, a --tp the heads or the ranks do not
divide, sequence parallelism over too few tokens) exits non-zero within seconds with a clear
message and leaves no files. analysis/torch_ddp.py is
compiled, and run on the CPU (gloo, 2 ranks under mpirun) only where PyTorch is installed:
--single, and DDP at two bucket sizes beside FSDP2 (fsdp2, fsdp2-noreshard), whose final losses
must equal DDP's within 1e-5 relative (fp32: the same arithmetic, sharded).
"""
import json
import math
import os
import py_compile
import shutil
import subprocess
import sys
import time
import types

import h5py
import numpy as np

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "analysis"))
import accounting  # noqa: E402
import ddp  # noqa: E402
import llmhpc_h5  # noqa: E402
import scaling  # noqa: E402
from script_env import llmhpc_binary, mpiexec, parse_markdown_tables, run, scratch_dir, test_env  # noqa: E402

BIN = llmhpc_binary()
DDP_PY = os.path.join(ROOT, "analysis", "ddp.py")
TORCH_DDP_PY = os.path.join(ROOT, "analysis", "torch_ddp.py")
D, FF, LAYERS, HEADS, VOCAB, T = 32, 64, 2, 4, 64, 16
MODEL = ["--d-model", D, "--d-ff", FF, "--num-layers", LAYERS, "--num-heads", HEADS, "--vocab-size", VOCAB]
TINY_MB, HUGE_MB = 0.0001, 1000  # 104 bytes: less than any tensor (the smallest, a norm gain, is 4 x 32 bytes)
STRATEGIES = ("none", "naive", "flat", "overlap", "bucketed")
WARMUP, STEPS, BATCH = 1, 3, 6
PHASES = ("forward_ms", "backward_ms", "comm_ms", "optimizer_ms", "step_ms")
TENSORS = 3 + 9 * LAYERS  # embedding, final norm, LM head; per layer 2 norms, q k v o, w1 w2 w3
PARAMS = VOCAB * D * 2 + D + LAYERS * (4 * D * D + 3 * D * FF + 2 * D)


def ddp_run(np_, out, *extra, expect_ok=True):
    return run(mpiexec() + ["-np", str(np_), BIN, "--mode", "ddp", "--device", "cpu", *MODEL, *extra, "--out", out],
               expect_ok=expect_ok)


def check_rank_files(out, np_):
    files = sorted(os.listdir(out))
    assert files == [f"rank{r:05d}.h5" for r in range(np_)], f"{out}: files {files}, expected one per rank"
    step_ms = {}
    for rank in range(np_):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            assert f.attrs["mode"] == "ddp" and f.attrs["status"] == "complete", dict(f.attrs)
            groups = {name: g for name, g in f["ddp"].items()}
            kinds = sorted((g.attrs["ddp"], float(g.attrs["bucket_mb"]) if g.attrs["ddp"] == "bucketed" else 0.0)
                           for g in groups.values())
            want = sorted([(s, 0.0) for s in STRATEGIES if s != "bucketed"] + [("bucketed", TINY_MB),
                                                                                ("bucketed", float(HUGE_MB))])
            assert kinds == want, f"rank {rank}: records {kinds}, expected {want}"
            for name, g in groups.items():
                a = g.attrs
                where = f"np={np_} rank {rank} {name}"
                assert a["status"] == "ok", f"{where}: status {a['status']!r}"
                assert (a["batch_size"], a["local_batch_size"], a["world_size"]) == (BATCH, BATCH // np_, np_), \
                    f"{where}: batch {a['batch_size']}, local {a['local_batch_size']}, world {a['world_size']}"
                assert a["num_params"] == PARAMS, f"{where}: num_params {a['num_params']}, counted {PARAMS}"
                for phase in PHASES:
                    assert g[phase].shape == (STEPS,), f"{where}/{phase}: shape {g[phase].shape}, expected ({STEPS},)"
                    assert np.all(np.isfinite(g[phase][()])) and np.all(g[phase][()] >= 0), f"{where}/{phase}"
                    assert g["warmup_" + phase].shape == (WARMUP,), f"{where}/warmup_{phase}"
                assert g["step_ms_max_over_ranks"].shape == (STEPS,), f"{where}: step_ms_max_over_ranks"
                strategy = a["ddp"]
                want_bytes = 0 if strategy == "none" else 4 * PARAMS
                assert a["comm_bytes_per_step"] == want_bytes, \
                    f"{where}: comm_bytes_per_step {a['comm_bytes_per_step']}, expected {want_bytes}"
                if strategy == "none":
                    assert np.all(g["comm_ms"][()] == 0), f"{where}: none communicates nothing: {g['comm_ms'][()]}"
                want_buckets = {"none": 0, "naive": TENSORS, "flat": 1, "overlap": TENSORS}.get(strategy)
                if strategy == "bucketed":
                    want_buckets = TENSORS if a["bucket_mb"] == TINY_MB else 1
                assert a["buckets"] == want_buckets, f"{where}: {a['buckets']} buckets, expected {want_buckets}"
                if strategy == "naive":
                    assert a["collectives_per_step"] == TENSORS, f"{where}: {a['collectives_per_step']} collectives"
                step_ms.setdefault(name, []).append((g["step_ms"][()], g["step_ms_max_over_ranks"][()]))
    for name, per_rank in step_ms.items():
        slowest = np.max(np.stack([s for s, _ in per_rank]), axis=0)
        for rank, (_, recorded) in enumerate(per_rank):
            assert np.array_equal(recorded, slowest), \
                f"np={np_} {name} rank {rank}: step_ms_max_over_ranks {recorded}, max of the ranks' step_ms {slowest}"
    return step_ms


def check_summary_and_report(out, np_, step_ms):
    summary = llmhpc_h5.open_run(out).ddp_summary()
    assert len(summary) == len(STRATEGIES) + 1, f"ddp_summary: {len(summary)} rows, expected {len(STRATEGIES) + 1}"
    assert set(summary.ranks) == {np_} and set(summary.step_n) == {np_ * STEPS}, summary[["name", "ranks", "step_n"]]
    for _, r in summary.iterrows():
        pooled = np.concatenate([s for s, _ in step_ms[r["name"]]])
        assert abs(r.step_mean - pooled.mean()) < 1e-12, f"{r['name']}: step_mean {r.step_mean} != {pooled.mean()}"
        assert abs(r.slowest_step_mean - step_ms[r["name"]][0][1].mean()) < 1e-12, r["name"]
        assert abs(r.comm_pct - 100 * r.comm_mean / r.step_mean) < 1e-9, r["name"]

    text = run([sys.executable, DDP_PY, out]).stdout
    for section in ("(a) DDP strategies", "(b) bucket sizes", "(c) overhead of data parallelism", "(e) bucket model"):
        assert section in text, f"ddp.py (text) lacks '{section}':\n{text}"
    assert "fitted to the measured exposed comm" in text, f"without --comm the bucket model is fitted:\n{text}"
    tables = parse_markdown_tables(run([sys.executable, DDP_PY, out, "--markdown"]).stdout)
    strategies_table, overhead_table = tables[0], tables[2]
    header, rows = strategies_table
    impl, bucket, mean = header.index("Impl"), header.index("Bucket (MiB)"), header.index("Step Mean (ms)")
    # The mpi backend measures no device time: the collectives' time is left out, not made up.
    assert all(row[header.index("Coll. Time (ms)")] == "-" for row in rows), rows
    assert summary.comm_busy_mean.isna().all(), summary.comm_busy_mean
    shown = sorted((row[impl], row[bucket]) for row in rows)
    assert shown == sorted([("naive", "-"), ("flat", "-"), ("overlap", "-"), ("bucketed", f"{TINY_MB:g}"),
                            ("bucketed", f"{HUGE_MB:g}")]), f"ddp.py table (a) rows: {shown}"
    by_label = {(r.ddp, f"{r.bucket_mb:g}" if r.ddp == "bucketed" else "-"): r["name"] for _, r in summary.iterrows()}
    for row in rows:
        pooled = np.concatenate([s for s, _ in step_ms[by_label[(row[impl], row[bucket])]]])
        assert abs(float(row[mean]) - pooled.mean()) <= 0.005 + 1e-9, \
            f"ddp.py (a) {row[impl]} {row[bucket]}: step mean {row[mean]}, the raw arrays give {pooled.mean():.4f}"
    assert sorted(r[0] for r in overhead_table[1]) == sorted(STRATEGIES + ("bucketed",)), \
        f"table (c) should have every strategy, none included: {overhead_table}"


def check_bucket_model():
    """The fit recovers o and w from data the model generates; b* = sqrt(s o w)."""
    s, o, w = 4.0e8, 0.05, 2.0e7  # bytes, ms, bytes per ms (20 GB/s)
    n = np.array([1, 4, 16, 40, 400], dtype=float)
    fit_o, fit_w = ddp.fit_model(n, n * o + s / (n * w), s)
    assert abs(fit_o - o) < 1e-9 and abs(fit_w / w - 1) < 1e-9, f"fit gave o={fit_o}, w={fit_w}; expected {o}, {w}"
    fit_o, fit_w = ddp.fit_model(n, s / (n * w), s)  # no overhead at all: o is 0, not negative
    assert fit_o == 0 and abs(fit_w / w - 1) < 1e-9, f"fit gave o={fit_o}, w={fit_w}; expected 0, {w}"
    # Scaling projections: overlapped buckets leave the last one's all-reduce after backward, but
    # never less than the whole gradient's reduction minus backward (a network slower than compute).
    row = types.SimpleNamespace(forward_mean=3.0, backward_mean=6.0, optimizer_mean=1.0, ddp="bucketed", buckets=10,
                                comm_bytes_per_step=s, tp=1)
    for bus_w, expected in ((10 * w, 10.0 + 10 * o + s / (100 * w)), (w / 100, 10.0 + 10 * o + 100 * s / w - 6.0)):
        model = {"world_size": 2, "w": bus_w, "o": o}  # at 2 ranks the bus factor is 1: w(2) = w
        got = scaling.projected_step(row, 2, 2, "weak", model)
        assert abs(got - expected) < 1e-9 * expected, f"projected step {got}, expected {expected} (w {bus_w})"
        # Under tensor parallelism the gradients' ring is the data-parallel ranks': tp 2 on 4 ranks
        # all-reduces over 2, and on 2 ranks over none.
        got = scaling.projected_step(types.SimpleNamespace(**{**vars(row), "tp": 2}), 4, 4, "weak", model)
        assert abs(got - expected) < 1e-9 * expected, f"tp 2 on 4 ranks: projected step {got}, expected {expected}"
        got = scaling.projected_step(types.SimpleNamespace(**{**vars(row), "tp": 2}), 2, 2, "weak", model)
        assert got == 10.0, f"tp 2 on 2 ranks: projected step {got}, expected the compute alone"
    # The model at each collective's size: the line through the two measured sizes around it, so
    # that on the measured ranks ring_ms gives each measured time back (a latency floor below 8 MB,
    # as NCCL's socket transport has), a reduce-scatter its own sizes' (its buffer is the whole),
    # a broadcast, not measured, the all-reduce moving as many bytes.
    allreduce = [(1e6, 4.5), (8e6, 5.3), (16e6, 9.2), (128e6, 72.6)]
    rs = [(1e6, 2.2), (16e6, 4.7), (128e6, 36.1)]
    o, w = scaling.line_through(allreduce[0], allreduce[-1])
    measured = {"world_size": 2, "o": o, "w": w, "kinds": {"allreduce": allreduce, "reducescatter": rs}}
    for kind, points in (("allreduce", allreduce), ("reducescatter", rs)):
        for b, t in points:
            got = scaling.ring_ms(kind, b, 2, measured)
            assert abs(got - t) <= 1e-9 * t, f"{kind} of {b:g} B: the model gives {got}, measured {t}"
    between = scaling.ring_ms("allreduce", 12e6, 2, measured)
    assert abs(between - (5.3 + 9.2) / 2) <= 1e-9, f"halfway between 8 and 16 MB: {between}"
    beyond = scaling.ring_ms("reducescatter", 256e6, 2, measured)
    slope = (36.1 - 4.7) / 112e6
    assert abs(beyond - (36.1 + 128e6 * slope)) <= 1e-9 * beyond, f"past the largest size, its line: {beyond}"
    # Unmeasured broadcast of 16 MB: bus bytes 16 MB, as an all-reduce of 16 MB (bus factor 1 at 2 ranks).
    assert abs(scaling.ring_ms("broadcast", 16e6, 2, measured) - 9.2) <= 1e-9
    # Two collectives' o and both buffers' bytes: twice one's time.
    assert abs(scaling.ring_ms("allreduce", 32e6, 2, measured, 2) - 2 * 9.2) <= 1e-9
    # MFU's peaks: the first name a device's contains, so an H200 is not taken for an H20.
    for device, precision, peak in (("NVIDIA H200", "bf16", 989.4e12), ("NVIDIA H20", "bf16", 148e12),
                                    ("NVIDIA H20", "fp32", 44e12), ("NVIDIA GB200", "bf16", 2.5e15),
                                    ("NVIDIA B200", "bf16", 2.25e15)):
        assert scaling.peak_flops(device, precision) == peak, (device, precision, scaling.peak_flops(device, precision))
    assert math.isnan(scaling.peak_flops("cpu", "bf16")), "a CPU has no peak in the table"
    # fp32 products under --tf32 run on the tensor cores: MFU against the tf32 peak, not fp32's.
    row = dict(d_model=64, d_ff=256, num_layers=2, vocab_size=1000, context_length=32, precision="fp32",
               device_name="NVIDIA H200", tf32=False)
    plain = scaling.throughput(row, 1, 4, 10.0)[1]
    tensor_cores = scaling.throughput({**row, "tf32": True}, 1, 4, 10.0)[1]
    assert abs(plain / tensor_cores - 494.7 / 66.9) <= 1e-9, (plain, tensor_cores)


def check_stage_model():
    """The ring model of each stage (scaling.stage_comm_ms), written out here from o and B: an
    all-reduce on k ranks o(k) + 2(k-1)/k S / B, a reduce-scatter or all-gather o(k) + (k-1)/k S / B,
    a broadcast o(k) + S / B, o(k) = o (k-1)/(n0-1); table (i) puts it beside comm_mean, and the
    scaling projections use it for the sharded stages."""
    import pandas as pd
    o, w, n0 = 0.02, 3.0e6, 4  # ms, bytes per ms of the all-reduce on n0 ranks
    bus = w * 2 * (n0 - 1) / n0
    model = {"o": o, "w": w, "world_size": n0, "source": "synthetic"}
    ok_k = lambda k: o * (k - 1) / (n0 - 1)
    d, ff, vocab, params = 64, 256, 1000, 400000
    emb = vocab * d  # zero2 and zero3's first unit, the last backward reduces
    last2 = emb + 4 * d * d + 3 * d * ff + 2 * d  # and the first layer's, the two gradient windows
    s, sp, fwd, bwd = 4.0e6, 4.0e6, 50.0, 80.0
    base = dict(ddp="bucketed", bucket_mb=1.0, world_size=4, tp=1, shard_group=4, buckets=8, comm_bytes_per_step=s,
                param_comm_bytes_per_step=sp, param_collectives_per_step=8, forward_mean=fwd, backward_mean=bwd,
                optimizer_mean=5.0, d_model=d, d_ff=ff, vocab_size=vocab, num_params=params, part_params=params,
                precision="fp32", collective_engine="sm", grad_reduce_dtype="fp32", status="ok", param_comm_mean=0.0)
    ag = lambda k, c, x: c * ok_k(k) + (k - 1) / k * x / bus  # c collectives' o, the bytes x
    cases = {  # sharding: (row changes, predicted comm, parameters end to end, parameters waited for)
        "broadcast": (dict(ddp="naive", buckets=21, param_collectives_per_step=4),
                      21 * o + 2 * 3 / 4 * s / bus, 4 * o + sp / bus, 4 * o + sp / bus),
        "zero1": (dict(), ag(4, 8, s / 8), ag(4, 8, sp), ag(4, 8, sp / 8)),
        "zero2": (dict(buckets=4, param_collectives_per_step=7), ag(4, 2, s * last2 / params), ag(4, 7, sp),
                  ag(4, 7, 4 * emb)),
        "zero3": (dict(buckets=4, param_collectives_per_step=9), ag(4, 2, s * last2 / params), ag(4, 9, sp),
                  ag(4, 9, 4 * emb)),
        # groups of 2 (x 2): the reduce-scatter within the group, each part's all-reduce across the groups
        # (comm_bytes_per_step counts both: s + s / 2)
        "zero1 hybrid": (dict(shard_group=2, comm_bytes_per_step=1.5 * s),
                         ag(2, 8, s / 8) + 8 * ok_k(2) + 2 * 1 / 2 * (s / 2 / 8) / bus, ag(2, 8, sp), ag(2, 8, sp / 8)),
        "zero3 hybrid": (dict(shard_group=2, comm_bytes_per_step=1.5 * s, buckets=4, param_collectives_per_step=9),
                         ag(2, 2, s * last2 / params) + 2 * ok_k(2) + (s * last2 / params / 2) / bus, ag(2, 9, sp),
                         ag(2, 9, 4 * emb)),
    }
    rows = []
    for label, (change, grad, params_all, waited) in cases.items():
        row = pd.Series(dict(base, shard_optimizer=label.split()[0], **change))
        got = scaling.stage_comm_ms(row, model)
        for key, want in (("grad", grad), ("params_all", params_all), ("params", waited)):
            assert abs(got[key] - want) <= 1e-9 * want, f"{label}: {key} {got[key]}, expected {want}"
        rows.append(dict(row, comm_mean=grad, grad_comm_mean=grad, name=label))
    # Where all of them take longer than backward, what backward cannot hide is left after it.
    slow = pd.Series(dict(base, shard_optimizer="zero1", backward_mean=0.01, forward_mean=0.01))
    got = scaling.stage_comm_ms(slow, model)
    assert abs(got["grad"] - (ag(4, 8, s) - 0.01)) <= 1e-9 and abs(got["params"] - (ag(4, 8, sp) - 0.01)) <= 1e-9, got
    # Table (i): a row per sharded configuration, its prediction beside comm_mean built from the model.
    frame = pd.DataFrame(rows)
    text = ddp.stage_model_table(frame, model, True, "synthetic")
    header, table = parse_markdown_tables(text)[0]
    col = {h: i for i, h in enumerate(header)}
    assert [r[col["Sharding"]] for r in table] == ["broadcast", "zero1", "zero2", "zero3", "zero1", "zero3"], text
    assert [r[col["Ranks (group x groups)"]] for r in table] == ["4", "4", "4", "4", "2 x 2", "2 x 2"], text
    for r, (_, (_, grad, params_all, waited)) in zip(table, cases.items()):
        assert r[col["Measured / Predicted"]] == "1.00" and float(r[col["Grad Comm predicted (ms)"]]) == round(grad, 3), r
        assert float(r[col["Params predicted (ms)"]]) == round(params_all, 3), r
        assert float(r[col["Of them waited, predicted (ms)"]]) == round(waited, 3), r
    assert f"B = w 2(n0-1)/n0 = {bus * 1e3 / 1e9:.3g} GB/s (n0 = 4), synthetic" in text, text
    # Projections: zero1 measured on 4 ranks, weak-scaled to 8: the passes without the parameters'
    # wait at 4, the optimizer on half the shard, the wait and the gradients' collectives at 8.
    row = pd.Series(dict(base, shard_optimizer="zero1"))
    want = (fwd + bwd - ag(4, 8, sp / 8)) + 5.0 / 2 + ag(8, 8, sp / 8) + ag(8, 8, s / 8)
    got = scaling.projected_step(row, 8, 4, "weak", model)
    assert abs(got - want) <= 1e-9 * want, f"zero1 projected to 8 ranks: {got}, expected {want}"
    # Hybrid groups of 2 keep their size: 8 ranks are 4 groups, whose all-reduce is over 4.
    row = pd.Series(dict(base, shard_optimizer="zero1", shard_group=2, comm_bytes_per_step=1.5 * s))
    want = (fwd + bwd + 5.0 - ag(2, 8, sp / 8)) + ag(2, 8, sp / 8) + ag(2, 8, s / 8) + 8 * ok_k(4) \
        + 2 * 3 / 4 * (s / 2 / 8) / bus
    got = scaling.projected_step(row, 8, 4, "weak", model)
    assert abs(got - want) <= 1e-9 * want, f"hybrid zero1 projected to 8 ranks: {got}, expected {want}"
    # Strong scaling: the passes and what hides behind them shrink by 4 / 8, and so does the
    # optimizer's shard, with what the step spends after it.
    row = pd.Series(dict(base, shard_optimizer="zero3", buckets=4, param_collectives_per_step=9, param_comm_mean=1.0))
    want = (fwd + bwd - ag(4, 9, 4 * emb)) / 2 + (5.0 + 1.0) / 2 + ag(8, 9, 4 * emb) + ag(8, 2, s * last2 / params)
    got = scaling.projected_step(row, 8, 4, "strong", model)
    assert abs(got - want) <= 1e-9 * want, f"zero3 projected to 8 ranks: {got}, expected {want}"
    # Unsharded, every rank updates the whole model: the optimizer is the same on 8 ranks as on 4.
    row = pd.Series(dict(base, shard_optimizer="none"))
    want = (fwd + bwd) / 2 + 5.0 + scaling.stage_comm_ms(row, model, 8, 0.5)["grad"]
    got = scaling.projected_step(row, 8, 4, "strong", model)
    assert abs(got - want) <= 1e-9 * want, f"unsharded projected to 8 ranks: {got}, expected {want}"


def check_engine_labels(out):
    """--collective-engine: the summary carries it (sm where nothing else ran, the CPU's only one);
    the tables name a strategy whose bytes went through the copy engines, bucket size kept."""
    summary = llmhpc_h5.open_run(out).ddp_summary()
    assert set(summary.collective_engine) == {"sm"}, f"collective_engine column: {set(summary.collective_engine)}"
    assert set(summary.grad_reduce_dtype) == {"fp32"}, f"grad_reduce_dtype column: {set(summary.grad_reduce_dtype)}"
    row = {"ddp": "bucketed", "bucket_mb": 25.0, "shard_optimizer": "zero1", "collective_engine": "copy"}
    assert ddp.strategy_label(row) == "bucketed 25 MiB (copy), zero1", ddp.strategy_label(row)
    assert ddp.impl(dict(row, ddp="flat")) == "flat (copy)" and ddp.impl(dict(row, collective_engine="sm")) == "bucketed"


def check_bf16_gradients(work):
    """--grad-reduce-dtype same,bf16: a row each for a strategy that communicates (none only once), the
    bf16 one's collectives moving half the bytes and labelled in the tables; a PyTorch record under
    bf16_compress_hook goes beside the bf16 row, a plain one beside the other."""
    out = os.path.join(work, "bf16grads")
    ddp_run(2, out, "--context-length", T, "--batch-size", BATCH, "--ddp", "none,bucketed", "--bucket-mb", HUGE_MB,
            "--grad-reduce-dtype", "same,bf16", "--warmup", WARMUP, "--steps", STEPS)
    summary = llmhpc_h5.open_run(out).ddp_summary()
    rows = sorted((r.ddp, r.grad_reduce_dtype) for _, r in summary.iterrows())
    assert rows == [("bucketed", "bf16"), ("bucketed", "fp32"), ("none", "fp32")], rows
    by = {r.grad_reduce_dtype: r for _, r in summary.iterrows() if r.ddp == "bucketed"}
    assert by["bf16"].comm_bytes_per_step * 2 == by["fp32"].comm_bytes_per_step > 0, \
        (by["bf16"].comm_bytes_per_step, by["fp32"].comm_bytes_per_step)
    assert ddp.impl(by["bf16"]) == "bucketed bf16" and ddp.impl(by["fp32"]) == "bucketed"
    base = dict(tool="pytorch-ddp", model="custom", d_model=D, d_ff=FF, num_layers=LAYERS, num_heads=HEADS,
                vocab_size=VOCAB, context_length=T, batch_size=BATCH, world_size=2, precision="fp32",
                setup="eager", status="ok", ddp="torch", bucket_mb=HUGE_MB)
    path = os.path.join(work, "torch_bf16.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps(dict(base, step_ms_max_over_ranks=[2.0])) + "\n")
        f.write(json.dumps(dict(base, grad_reduce_dtype="bf16", step_ms_max_over_ranks=[4.0])) + "\n")
    text = run([sys.executable, DDP_PY, out, "--torch", path, "--markdown"]).stdout
    header, table = next(t for t in parse_markdown_tables(text) if "PyTorch Step (ms)" in t[0])
    col = {h: i for i, h in enumerate(header)}
    for label, ours, theirs in (("DDP", by["fp32"], 2.0), ("DDP bf16", by["bf16"], 4.0)):
        row = next(r for r in table if r[col["PyTorch"]] == label)
        assert row[col["llmhpc"]] == ddp.impl(ours), f"{label} beside {row[col['llmhpc']]}:\n{text}"
        assert abs(float(row[col["Ratio"]]) - ours.slowest_step_mean / theirs) <= 0.005 + 1e-9, row


def check_gradients_made_in_bf16(work):
    """--grad-dtype bf16: the gradients held in bf16 (2 bytes each, against 4 in the plain bf16 run) and
    reduced as they are: one bucketed row where --grad-reduce-dtype same,bf16 would give two, recorded as
    travelling in bf16 with 2 bytes per parameter; the tables' titles say so. With --heat-s, every
    configuration ran untimed steps after its warm-up, as many on every rank."""
    grads, heat = {}, []
    for dtype in ("same", "bf16"):
        out = os.path.join(work, f"grad_dtype_{dtype}")
        ddp_run(2, out, "--context-length", T, "--batch-size", "4", "--ddp", "none,bucketed", "--bucket-mb", HUGE_MB,
                "--precision", "bf16", "--grad-dtype", dtype, "--grad-reduce-dtype", "same,bf16", "--warmup", "1",
                "--steps", "2", *(["--heat-s", "0.5"] if dtype == "same" else []))
        for rank in range(2):
            with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
                grads[dtype] = {g.attrs["ddp"]: g.attrs["memory_after_init_grads_bytes"] for g in f["ddp"].values()}
                if dtype == "same":
                    heat.append({g.attrs["ddp"]: int(g.attrs.get("heat_steps", 0)) for g in f["ddp"].values()})
        summary = llmhpc_h5.open_run(out).ddp_summary()
        if dtype == "bf16":
            rows = sorted((r.ddp, r.grad_dtype, r.grad_reduce_dtype) for _, r in summary.iterrows())
            assert rows == [("bucketed", "bf16", "bf16"), ("none", "bf16", "bf16")], rows
            bucketed = summary[summary.ddp == "bucketed"].iloc[0]
            assert bucketed.comm_bytes_per_step == 2 * PARAMS, (bucketed.comm_bytes_per_step, PARAMS)
            text = run([sys.executable, DDP_PY, out]).stdout
            assert "bf16, bf16 gradients" in text, text
        else:
            assert set(summary.grad_dtype) == {"fp32"}, set(summary.grad_dtype)
    for strategy in ("none", "bucketed"):
        assert 2 * PARAMS <= grads["bf16"][strategy] < 2 * PARAMS + 4096, (strategy, grads, PARAMS)
        assert 4 * PARAMS <= grads["same"][strategy] < 4 * PARAMS + 4096, (strategy, grads, PARAMS)
    assert heat[0] == heat[1] and heat[0]["none"] >= 1 and heat[0]["bucketed"] >= 1, heat


def check_repeated_runs(out, work):
    """Two runs of the same configurations: each run's tables apart, titled with its run, never one
    table pooling both (nor one run's strategies against the other's baseline)."""
    again = os.path.join(work, "np2_again")
    shutil.copytree(out, again)
    for rank in range(2):  # the second run's GPUs read their clocks: table (c) shows the lowest rank's median
        with h5py.File(os.path.join(again, f"rank{rank:05d}.h5"), "r+") as f:
            for g in f["ddp"].values():
                g.attrs["device_sm_clock_mhz_median"] = 1700.0 - 20 * rank
    once = run([sys.executable, DDP_PY, out, "--markdown"]).stdout
    twice = run([sys.executable, DDP_PY, out, again, "--markdown"]).stdout
    overhead = [t for t in twice.splitlines() if t.startswith("### (c) overhead")]
    assert len(overhead) == 2 * once.count("### (c) overhead") > 0, overhead
    assert sum("[run np2]" in t for t in overhead) == sum("[run np2_again]" in t for t in overhead) > 0, overhead
    assert "[run " not in once, "a single run's titles name no run"
    tables = [(header, rows) for header, rows in parse_markdown_tables(twice) if "SM MHz" in header]
    assert tables and len(tables) == len(overhead), (len(tables), len(overhead))
    clocks = [{r[header.index("SM MHz")] for r in rows} for header, rows in tables]
    assert sorted(map(sorted, clocks)) == [["-"]] * (len(tables) // 2) + [["1680"]] * (len(tables) // 2), clocks


def check_torch_table(out, work, np_):
    """--torch: a PyTorch DDP record (synthetic, as torch_ddp.py writes them) beside bucketed at its bucket
    size, a --single one beside none, one of another shape left unmatched."""
    summary = llmhpc_h5.open_run(out).ddp_summary()
    ours = {(r.ddp, r.bucket_mb): r.slowest_step_mean for _, r in summary.iterrows()}
    base = dict(tool="pytorch-ddp", model="custom", d_model=D, d_ff=FF, num_layers=LAYERS, num_heads=HEADS,
                vocab_size=VOCAB, context_length=T, batch_size=BATCH, world_size=np_, precision="fp32",
                setup="eager", status="ok")
    records = [dict(base, ddp="torch", bucket_mb=HUGE_MB, step_ms_max_over_ranks=[2.0, 2.0]),
               dict(base, ddp="none", bucket_mb=None, step_ms_max_over_ranks=[4.0, 4.0]),
               dict(base, ddp="torch", bucket_mb=25, status="oom"),
               dict(base, d_model=64, ddp="torch", bucket_mb=HUGE_MB, step_ms_max_over_ranks=[1.0])]
    path = os.path.join(work, "torch_ddp.jsonl")
    with open(path, "w") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
    text = run([sys.executable, DDP_PY, out, "--torch", path, "--markdown"]).stdout
    tables = [t for t in parse_markdown_tables(text) if "PyTorch Step (ms)" in t[0]]
    assert len(tables) == 1, f"expected one PyTorch table:\n{text}"
    header, rows = tables[0]
    col = {h: i for i, h in enumerate(header)}
    assert len(rows) == 3, f"three PyTorch records match this setup, the table has {len(rows)}:\n{text}"
    ddp_row = next(r for r in rows if r[col["PyTorch"]] == "DDP" and r[col["Bucket (MiB)"]] == f"{HUGE_MB:g}")
    want = ours[("bucketed", float(HUGE_MB))] / 2.0
    assert abs(float(ddp_row[col["Ratio"]]) - want) <= 0.005 + 1e-9, f"ratio {ddp_row}, expected {want:.3f}"
    single = next(r for r in rows if r[col["PyTorch"]] == "single")
    assert single[col["llmhpc"]] == "none" and abs(float(single[col["Ratio"]]) - ours[("none", 0.0)] / 4.0) <= 0.005, \
        f"--single compares with none: {single}"
    oom = next(r for r in rows if r[col["PyTorch Status"]] == "oom")
    assert oom[col["Ratio"]] == "-" and oom[col["llmhpc"]] == "not run", f"an oom PyTorch row has no ratio: {oom}"
    assert "1 of 4 PyTorch record(s) match no llmhpc setup" in text, f"the unmatched record is not reported:\n{text}"


def check_comm_source(out, work):
    comm = os.path.join(work, "allreduce")
    run(mpiexec() + ["-np", "2", BIN, "--mode", "comm", "--device", "cpu", "--backend", "mpi", "--size", "4KB,256KB",
                     "--warmup", "1", "--steps", "3", "--out", comm])
    text = run([sys.executable, DDP_PY, out, "--comm", comm]).stdout
    # The optimum, or where three timed iterations on a busy host make the 4 KB all-reduce's
    # overhead o come out at or below 0, the model's statement that there is none.
    optimum = "b* = sqrt(s o w) =" in text or "no finite optimum: o = 0" in text
    assert f"from --comm {comm}" in text and optimum, f"--comm not used:\n{text}"
    proc = run([sys.executable, DDP_PY, out, "--comm", out], expect_ok=False)
    assert proc.returncode == 2 and "not a comm run" in proc.stderr, f"--comm of a ddp run: {proc.stderr}"
    proc = run([sys.executable, DDP_PY, comm], expect_ok=False)
    assert proc.returncode == 2 and "not a ddp run" in proc.stderr and not proc.stdout, \
        f"ddp.py on a comm run: exit {proc.returncode}, {proc.stderr}"


def check_oom_rows(work):
    out = os.path.join(work, "oom")
    ddp_run(2, out, "--context-length", "16,1024", "--batch-size", "4", "--ddp", "none,bucketed", "--bucket-mb", "1",
            "--warmup", "0", "--steps", "2", "--memory-limit", "3MB")
    text = run([sys.executable, DDP_PY, out]).stdout
    big = text[text.index("context 1024"):]
    assert "oom" in big and "bucketed" in big, f"the context-1024 rows should be shown as oom:\n{text}"


def check_sharding_table(work):
    """(f): every strategy x --shard-optimizer with the largest rank's memory; the reference DDP
    study's tables (a)-(e) keep to unsharded runs. After the step, bf16 holds a copy of the
    weights (2 bytes each) unsharded, and none while a sharded optimizer's masters arrive (the
    next forward casts); when
    the copy travels (--share-weights bf16) it is held, and the pages of the masters a rank neither
    updates nor reads are given back. --share-weights auto is bf16 where the copy can travel (the
    sharded bf16 case), master elsewhere, each case once beside master."""
    out = os.path.join(work, "shard")
    proc = ddp_run(2, out, "--context-length", T, "--batch-size", "4", "--ddp", "none,bucketed", "--bucket-mb", "1",
                   "--shard-optimizer", "none,zero1", "--share-weights", "auto,master", "--precision", "fp32,bf16",
                   "--warmup", "0", "--steps", "2")
    # --ddp none x zero1, once per precision: said, not dropped in silence
    assert "combinations left out: 2 of --ddp none with a --shard-optimizer stage" in proc.stdout, proc.stdout[:2000]
    for rank in range(2):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            params = {(g.attrs["precision"], g.attrs["shard_optimizer"], g.attrs["share_weights"]):
                      g.attrs["memory_after_optimizer_params_bytes"]
                      for g in f["ddp"].values() if g.attrs["ddp"] == "bucketed"}
        assert sorted(params) == [("bf16", "none", "master"), ("bf16", "zero1", "bf16"), ("bf16", "zero1", "master"),
                                  ("fp32", "none", "master"), ("fp32", "zero1", "master")], sorted(params)
        fp32 = params[("fp32", "none", "master")]
        assert fp32 >= 4 * PARAMS and params[("fp32", "zero1", "master")] == fp32, params
        # The bf16 model's buffer is padded for the largest of its plans (page-aligned shards when
        # the copy travels), so its own sizes are compared: with the copy let go, the masters alone.
        masters = params[("bf16", "zero1", "master")]
        assert masters >= fp32, f"the bf16 copy let go while the parameters arrive: {params}"
        assert params[("bf16", "none", "master")] == masters * 6 // 4, f"fp32 weights and their bf16 copy: {params}"
        shared = params[("bf16", "zero1", "bf16")]
        assert masters <= shared < masters * 6 // 4, f"the copy held, the others' masters given back: {params}"
    def fp32_table(text, title):  # the fp32 setup's table of that title
        return next(b.strip("\n") for b in text.split("\n\n") if b.strip("\n").startswith(title) and ", fp32, " in b)

    text = run([sys.executable, DDP_PY, out]).stdout
    table = fp32_table(text, "(f) optimizer state sharding")
    rows = [line.split() for line in table.splitlines()[3:]]
    assert sorted((r[0], r[2]) for r in rows) == [("bucketed", "none"), ("bucketed", "zero1")], table
    state = {r[2]: float(r[8]) for r in rows}
    assert 0 < state["zero1"] < state["none"], f"zero1's optimizer state must be a share of the whole:\n{table}"
    # (g): each sharded step beside the unsharded one of the same strategy, by phase.
    phases = {r[2]: r for r in (line.split() for line in fp32_table(text, "(g) where a sharded step goes").splitlines()[3:])}
    assert sorted(phases) == ["none", "zero1"] and phases["none"][9] == "1.000x", phases
    zero1_step, none_step = float(phases["zero1"][8]), float(phases["none"][8])
    # The ratio is of the unrounded steps; the printed ones are rounded to 0.01 ms, each off by up to
    # 0.005, which moves a / b by up to 0.005 / b + a * 0.005 / b^2 (0.026 at 2.70 / 0.83 ms).
    low = none_step - 0.005
    assert abs(float(phases["zero1"][9].rstrip("x")) - zero1_step / none_step) <= \
        0.005 / low * (1 + (zero1_step + 0.005) / low) + 1e-3, f"zero1's step over the unsharded one: {phases}"
    assert all(float(phases["zero1"][i]) > 0 for i in (3, 4, 6)), f"forward, backward and optimizer timed: {phases}"
    assert zero1_step == float(next(r for r in rows if r[2] == "zero1")[3]), "(f) and (g) show the same step"
    strategies = fp32_table(text, "(a) DDP strategies")
    assert strategies.count("bucketed") == 1, f"(a) must show the unsharded run only:\n{strategies}"
    bf16 = next(b for b in text.split("\n\n") if b.strip("\n").startswith("(f) optimizer state sharding") and ", bf16, " in b)
    assert "zero1 bf16" in bf16 and bf16.count("zero1") == 2, f"(f) names what travelled:\n{bf16}"
    # PyTorch's ZeroRedundancyOptimizer (synthetic, as torch_ddp.py --shard-optimizer zero writes it) is a row
    # of (f) with the largest rank's live MiB at each point; it is not a DDP row of (d).
    zero = dict(tool="pytorch-ddp", model="custom", d_model=D, d_ff=FF, num_layers=LAYERS, num_heads=HEADS,
                vocab_size=VOCAB, context_length=T, batch_size=4, world_size=2, precision="fp32", setup="eager",
                status="ok", ddp="torch", bucket_mb=25, shard_optimizer="zero", step_ms_max_over_ranks=[3.0, 5.0],
                ranks=[{"memory_after_init_bytes": 2 * 2**20, "memory_before_optimizer_bytes": 4 * 2**20,
                        "memory_after_optimizer_bytes": 5 * 2**20, "peak_memory_bytes": 6 * 2**20},
                       {"memory_after_init_bytes": 2 * 2**20, "memory_before_optimizer_bytes": 4 * 2**20,
                        "memory_after_optimizer_bytes": 7 * 2**20, "peak_memory_bytes": 8 * 2**20}])
    # FSDP2 (as torch_ddp.py --shard-optimizer fsdp2 writes it: no bucket) is a row of its own, its sharding as given.
    fsdp2 = dict(zero, shard_optimizer="fsdp2", bucket_mb=None, gradient_as_bucket_view=False,
                 fsdp2=dict(reshard_after_forward=True, param_dtype="fp32", reduce_dtype="fp32"),
                 ranks=[dict(p, memory_after_init_bytes=2**20) for p in zero["ranks"]])
    path = os.path.join(work, "torch_zero.jsonl")
    with open(path, "w") as f:
        f.write(json.dumps(zero) + "\n" + json.dumps(fsdp2) + "\n")
    text = run([sys.executable, DDP_PY, out, "--torch", path]).stdout
    table = fp32_table(text, "(f) optimizer state sharding")
    row = next((line.split() for line in table.splitlines() if "ZeroRedundancyOptimizer" in line), None)
    assert row and row[0] == "torch-ddp-eager" and [float(x) for x in (row[3], row[5], row[6], row[7], row[9])] == \
        [4.0, 2.0, 4.0, 7.0, 8.0], f"PyTorch's ZeRO-1 row (step 4.00, MiB 2/4/7, peak 8):\n{table}"
    row = next((line.split() for line in table.splitlines() if line.startswith("torch-fsdp2-eager")), None)
    assert row and row[1:3] == ["-", "fsdp2"] and [float(x) for x in (row[3], row[5], row[6], row[7], row[9])] == \
        [4.0, 1.0, 4.0, 7.0, 8.0], f"PyTorch's FSDP2 row (no bucket, step 4.00, MiB 1/4/7, peak 8):\n{table}"
    assert "PyTorch Step (ms)" not in text and "match no llmhpc setup" not in text, f"ZeRO is not a (d) row:\n{text}"


def check_state_table(work):
    """(h): the model state a rank holds between steps under each ZeRO stage, measured, beside
    accounting.py's state_bytes_per_rank. A model large enough (P = 115,008) that the padding the
    model leaves out is small beside it, fp32 and bf16 (there zero1 shares the bf16 copy, auto):
    none, zero1, zero2 and zero3 on 2 ranks, one step. Measured is the largest rank's params +
    grads + optimizer after the optimizer, read here from the files."""
    d, ff, layers, vocab, ranks = 64, 128, 2, 256, 2
    p = vocab * d * 2 + d + layers * (4 * d * d + 3 * d * ff + 2 * d)
    f = vocab * d + (2 * layers + 1) * d  # the embedding and the norm gains, read in fp32 under bf16
    out = os.path.join(work, "stages")
    run(mpiexec() + ["-np", str(ranks), BIN, "--mode", "ddp", "--device", "cpu", "--d-model", d, "--d-ff", ff,
                     "--num-layers", layers, "--num-heads", 4, "--vocab-size", vocab, "--context-length", 16,
                     "--batch-size", 4, "--ddp", "bucketed", "--bucket-mb", 1, "--shard-optimizer",
                     "none,zero1,zero2,zero3", "--precision", "fp32,bf16", "--warmup", 0, "--steps", 1, "--out", out])
    measured = {}
    for rank in range(ranks):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as h:
            for g in h["ddp"].values():
                a = g.attrs
                assert a["num_params"] == p, f"num_params {a['num_params']}, counted {p}"
                key = (a["precision"], a["shard_optimizer"], a["share_weights"])
                state = sum(int(a[f"memory_after_optimizer_{c}_bytes"]) for c in ("params", "grads", "optimizer"))
                measured[key] = max(measured.get(key, 0), state)
    # zero2 and zero3 gather the weights as bf16 under bf16: recorded so, as mode train does.
    assert sorted(measured) == [("bf16", "none", "master"), ("bf16", "zero1", "bf16"), ("bf16", "zero2", "bf16"),
                                ("bf16", "zero3", "bf16"), ("fp32", "none", "master"), ("fp32", "zero1", "master"),
                                ("fp32", "zero2", "master"), ("fp32", "zero3", "master")], sorted(measured)
    text = run([sys.executable, DDP_PY, out, "--markdown"]).stdout
    blocks = {precision: b for b in text.split("### ") if b.startswith("(h) model state per rank")
              for precision in ("fp32", "bf16") if f", {precision}, " in b.splitlines()[0]}
    assert sorted(blocks) == ["bf16", "fp32"], f"one (h) table per precision:\n{text}"
    # The model leaves out padding, which only adds: each unit's lanes padded to ranks x 64 elements
    # (zero2, zero3: at most 64 elements x 12 bytes of shard and 64 x 4 bytes gathered, per lane of
    # 7 (the embedding has one, the layers and the head two): 7 KiB; unsharded and zero1 flat buffers:
    # under 128 elements x 16 bytes). Under bf16 the model's buffers are padded for the largest of
    # its plans, whole pages of the masters when the copy travels: masters, copy, gradients, m and v
    # each at most two pages more, and the masters given back in whole pages, two more at the edges
    # of a rank's range: 12 pages. The largest rank of zero1 bf16 may own a norm gain of F: a few
    # hundred bytes less than the model.
    page = os.sysconf("SC_PAGE_SIZE")
    for precision, block in blocks.items():
        header, rows = parse_markdown_tables(block)[0]
        col = {h: i for i, h in enumerate(header)}
        by_stage = {r[col["Sharding"]]: r for r in rows}
        want = ["none", "zero1", "zero2", "zero3"] if precision == "fp32" else ["none", "zero1 bf16", "zero2", "zero3"]
        assert sorted(by_stage) == want, f"{precision}: stages {sorted(by_stage)}:\n{block}"
        states = []
        for label, r in by_stage.items():
            stage = label.split()[0]
            share = "bf16" if label.endswith(" bf16") or (precision == "bf16" and stage in ("zero2", "zero3")) else "master"
            m = measured[(precision, stage, share)]
            predicted = accounting.state_bytes_per_rank(p, ranks, stage, precision, share, None, f)
            where = f"{precision} {label}: measured {m} B, predicted {predicted:.0f} B\n{block}"
            assert r[col["n"]] == str(ranks), f"{where}: every rank shares one copy of the state"
            assert abs(float(r[col["Measured (MiB)"]]) - m / 2**20) <= 0.0005 + 1e-9, where
            assert abs(float(r[col["Predicted (MiB)"]]) - predicted / 2**20) <= 0.0005 + 1e-9, where
            assert abs(float(r[col["Measured / Predicted"]]) - m / predicted) <= 0.0005 + 1e-9, where
            assert abs(float(r[col["FSDP 16P/N (MiB)"]]) - 16 * p / ranks / 2**20) <= 0.0005 + 1e-9, where
            slack = 7 * 1024 + (12 * page if precision == "bf16" else 2048)
            assert -1024 <= m - predicted <= slack, f"{where}\nbeyond the padding's {slack} B"
            states.append((want.index(label), m))
        # Each stage keeps less than the one before it.
        assert [m for _, m in sorted(states)] == sorted((m for _, m in states), reverse=True), f"{precision}:\n{block}"
        if precision == "bf16":  # the masters of the embedding and norm gains, which the copy leaves out
            assert "4F" in by_stage["zero1 bf16"][col["Model"]], block
    print("".join("### " + blocks[precision] for precision in ("fp32", "bf16")))
    return text


def check_stage_model_runs(work):
    """Table (i) on real runs, with o and w from the all-reduce run of check_comm_source: every sharded
    stage of check_state_table's run (2 ranks, fp32 and bf16) a row with a finite prediction, the one
    scaling.stage_comm_ms gives its configuration; hybrid zero1 and zero3 on 4 ranks in groups of 2,
    the 2-rank all-reduce extended to them, zero1's prediction written out here from the rank file."""
    comm = os.path.join(work, "allreduce")
    model = ddp.allreduce_model(comm)
    out = os.path.join(work, "stages")
    text = run([sys.executable, DDP_PY, out, "--comm", comm, "--markdown"]).stdout
    frame, _ = ddp.load([out], None)
    blocks = [b for b in text.split("### ") if b.startswith("(i) communication model by stage")]
    assert len(blocks) == 2, f"one (i) table per precision:\n{text}"
    for block in blocks:
        precision = "bf16" if ", bf16, " in block.splitlines()[0] else "fp32"
        header, rows = parse_markdown_tables(block)[0]
        col = {h: i for i, h in enumerate(header)}
        want = ["zero1 bf16" if precision == "bf16" else "zero1", "zero2", "zero3"]
        assert [r[col["Sharding"]] for r in rows] == want, f"{precision}: a row per sharded stage:\n{block}"
        for r in rows:
            (config,) = [c for _, c in frame.iterrows() if c.precision == precision and c.shard_optimizer ==
                         r[col["Sharding"]] and c.ddp == "bucketed"]
            predicted = scaling.stage_comm_ms(config, model)
            cell = float(r[col["Grad Comm predicted (ms)"]])
            assert math.isfinite(cell) and abs(cell - predicted["grad"]) <= 0.0005 + 1e-9, f"{r}: {predicted}"
            assert float(r[col["Params predicted (ms)"]]) > 0 and r[col["Ranks (group x groups)"]] == "2", r
            assert abs(float(r[col["Grad Comm measured (ms)"]]) - config.grad_comm_mean) <= 0.0005 + 1e-9, r
        assert "o(k) = o (k-1)/(n0-1)" in block and f"from --comm {comm}" in block, block
    hybrid = os.path.join(work, "hybrid")
    # --grad-reduce-dtype bf16 does not apply to hybrid zero1: its case is left out, and said to be.
    proc = run(mpiexec() + ["-np", "4", BIN, "--mode", "ddp", "--device", "cpu", *MODEL, "--context-length", T,
                            "--batch-size", 4, "--ddp", "bucketed", "--bucket-mb", 1, "--shard-optimizer", "zero1,zero3",
                            "--shard-group", 2, "--grad-reduce-dtype", "same,bf16", "--warmup", 0, "--steps", 1,
                            "--out", hybrid])
    assert "ddp: note: 1 configuration of zero1 in shard groups (--shard-group) left out" in proc.stdout, \
        proc.stdout[:1500]
    text = run([sys.executable, DDP_PY, hybrid, "--comm", comm, "--markdown"]).stdout
    (block,) = [b for b in text.split("### ") if b.startswith("(i) communication model by stage")]
    assert "that run had 2 ranks, these 4 data-parallel ranks: o and w extended" in block, block
    header, rows = parse_markdown_tables(block)[0]
    col = {h: i for i, h in enumerate(header)}
    assert [(r[col["Sharding"]], r[col["Ranks (group x groups)"]]) for r in rows] == [("zero1", "2 x 2"),
                                                                                      ("zero3", "2 x 2")], block
    with h5py.File(os.path.join(hybrid, "rank00000.h5"), "r") as f:
        (a,) = [dict(g.attrs) for g in f["ddp"].values() if g.attrs["shard_optimizer"] == "zero1"]
    c, grads = int(a["buckets"]), a["comm_bytes_per_step"] * 2 / 3  # the bytes count each part's all-reduce too
    bus = model["w"]  # on 2 ranks an all-reduce's bus factor is 1, o(2) = o
    want = c * model["o"] + grads / c / 2 / bus + c * model["o"] + grads / 2 / c / bus  # within, across the groups
    assert abs(float(rows[0][col["Grad Comm predicted (ms)"]]) - want) <= 0.0005 + 1e-9, f"expected {want:.4f}:\n{block}"
    assert all(math.isfinite(float(r[col["Grad Comm predicted (ms)"]])) for r in rows), block
    print(blocks[0])


def check_bad_input(work):
    cases = [(2, "must be one of", ["--ddp", "bogus"]), (2, "greater than 0", ["--bucket-mb", "0"]),
             (2, "must divide by the 2 data-parallel ranks", ["--batch-size", "5"]),
             (3, "must divide by the 3 data-parallel ranks", ["--batch-size", "4"]),
             (3, "--num-heads 4 does not divide among --tp 3 ranks", ["--tp", "3", "--batch-size", "6"]),
             (2, "--tp 3 does not divide the 2 ranks", ["--tp", "1,3"]),
             (2, "tokens among --tp 2 ranks", ["--tp", "2", "--sequence-parallel", "--batch-size", "1",
                                                "--context-length", "3"])]
    for i, (np_, words, args) in enumerate(cases):
        out = os.path.join(work, f"bad{i}")
        start = time.time()
        proc = ddp_run(np_, out, *args, expect_ok=False)
        took = time.time() - start
        assert proc.returncode != 0, f"np={np_} {args}: exit 0"
        assert words in proc.stderr, f"np={np_} {args}: message lacks '{words}': {proc.stderr[:400]}"
        assert took < 20, f"np={np_} {args}: took {took:.0f} s"
        assert not os.path.exists(out) or not os.listdir(out), f"np={np_} {args}: left {os.listdir(out)}"


def check_tp_overlap_sweep(work):
    """--tp-overlap 1,3 sweeps (each --tp above 1): on 2 ranks, tp 2 with forward's products unsplit
    and in 3 chunks, each a configuration of its own (label, record) whose group makes 2 more
    collectives per layer and row-parallel product chunk, the same bytes; tp 1 runs once."""
    out = os.path.join(work, "tp_overlap")
    ddp_run(2, out, "--context-length", T, "--batch-size", 2, "--tp", "1,2", "--tp-overlap", "1,3", "--ddp", "none",
            "--warmup", 1, "--steps", 2)
    with h5py.File(os.path.join(out, "rank00000.h5"), "r") as f:
        got = {name: dict(g.attrs) for name, g in f["ddp"].items()}
    by = {(int(a["tp"]), int(a["tp_overlap"])): (name, a) for name, a in got.items()}
    assert sorted(by) == [(1, 1), (2, 1), (2, 3)], sorted(got)
    assert "_tp2ov3_" in by[(2, 3)][0] and "ov" not in by[(2, 1)][0], sorted(got)
    plain, split = by[(2, 1)][1], by[(2, 3)][1]
    more = int(split["tp_collectives_per_step"]) - int(plain["tp_collectives_per_step"])
    assert more == 2 * LAYERS * (3 - 1), f"{more} more collectives, expected {2 * LAYERS * 2}"
    assert abs(int(split["tp_bus_bytes_per_step"]) - int(plain["tp_bus_bytes_per_step"])) <= 64, (plain, split)


def check_tensor_parallel(work):
    """--tp 1,2 on 4 ranks: every rank file records its place in the tp x dp layout and the local
    batch of its data-parallel rank; a rank holds its tensor-parallel part of the state (the params
    after init are its part's, in fp32); the collectives inside the layers are those train makes at
    the same tp, local batch and --tp-overlap (forward's products in 2 chunks); ddp.py gives each
    layout a setup of its own, with (h)'s model state measured as predicted from the part."""
    out = os.path.join(work, "tp")
    ddp_run(4, out, "--context-length", T, "--batch-size", 4, "--tp", "1,2", "--tp-overlap", 2, "--ddp",
            "none,bucketed", "--shard-optimizer", "none,zero3", "--warmup", 1, "--steps", 2)
    records = {}
    for rank in range(4):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            for name, g in f["ddp"].items():
                a = dict(g.attrs)
                tp = int(a["tp"])
                where = f"rank {rank} {name}"
                assert a["status"] == "ok", where
                assert (a["dp"], a["tp_rank"], a["dp_rank"]) == (4 // tp, rank % tp, rank // tp), f"{where}: {a}"
                assert a["local_batch_size"] == 4 // (4 // tp) and name.count("_tp2") == (tp == 2), f"{where}: {a}"
                assert ("tp_collectives_per_step" in a) == (tp > 1), f"{where}: {sorted(a)}"
                assert a["tp_overlap"] == (2 if tp > 1 else 1), f"{where}: --tp-overlap applies to tp above 1"
                if tp > 1:  # what the layers waited for the group's collectives, each timed step
                    waited, steps = g["tp_comm_ms"][()], g["step_ms"][()]
                    assert len(waited) == 2 and np.all(waited > 0) and np.all(waited < steps), f"{where}: {waited}"
                params = a["memory_after_init_params_bytes"]
                if not name.endswith("_zero3"):  # a rank's parameters: the part's, in fp32
                    assert params == 4 * a["part_params"], f"{where}: {a}"
                else:  # its shard of the part, padded to the shards' alignment
                    assert 4 * a["part_params"] / a["dp"] <= params < 4 * a["part_params"], f"{where}: {a}"
                records.setdefault(name, []).append(a)
    assert len(records) == 6, sorted(records)
    whole = next(r[0] for n, r in records.items() if n.endswith("_naive_none"))["part_params"]
    part = next(r[0] for n, r in records.items() if n.endswith("_tp2ov2_none"))["part_params"]
    assert whole == PARAMS and 0.45 * PARAMS < part < 0.55 * PARAMS, (whole, part, PARAMS)
    tp_case = next(r for n, r in records.items() if n.endswith("_tp2ov2_bucketed25MiB"))
    # Train at the same layout and local batch makes the same collectives inside the layers.
    tokens = os.path.join(work, "tp_tokens.bin")
    np.random.default_rng(0).integers(0, VOCAB, 4096, dtype=np.uint16).tofile(tokens)
    train_out = os.path.join(work, "tp_train")
    run(mpiexec() + ["-np", "4", BIN, "--mode", "train", "--device", "cpu", *MODEL, "--context-length", T,
                     "--batch-size", 4, "--tp", 2, "--tp-overlap", 2, "--steps", 2, "--data", tokens, "--out",
                     train_out])
    for rank in range(4):
        with h5py.File(os.path.join(train_out, f"rank{rank:05d}.h5"), "r") as f:
            a = f["train"].attrs
            for key in ("tp_collectives_per_step", "tp_bus_bytes_per_step"):
                assert a[key] > 0 and a[key] == tp_case[rank][key], f"rank {rank} {key}: train {a[key]}, ddp {tp_case[rank][key]}"
    text = run([sys.executable, DDP_PY, out, "--markdown"]).stdout
    state = [b for b in text.split("### ") if b.startswith("(h) model state per rank")]
    assert len(state) == 2 and "4 ranks (tp 2 x dp 2, products in 2 chunks)" in state[1] and "(tp" not in state[0], text
    header, rows = parse_markdown_tables(state[1])[0]
    col = {h: i for i, h in enumerate(header)}
    assert [r[col["Sharding"]] for r in rows] == ["none", "zero3"], state[1]
    for r in rows:  # the part's state, predicted from its parameters, padding aside (check_state_table)
        extra = float(r[col["Measured (MiB)"]]) - float(r[col["Predicted (MiB)"]])
        assert r[col["n"]] == "2" and -0.001 <= extra <= 7 / 1024 + 0.001, state[1]

def check_torch_ddp(out, work, np_):
    py_compile.compile(TORCH_DDP_PY, doraise=True, cfile=os.path.join(work, "torch_ddp.pyc"))
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        print("torch_ddp.py: compiled; PyTorch is not installed, so its CPU run is skipped")
        return
    env = dict(test_env(), MASTER_PORT=str(29500 + os.getpid() % 1000))

    def torch_ddp(name, steps, *extra):  # the records of one torch_ddp.py launch on np_ ranks
        path = os.path.join(work, name)
        cmd = mpiexec() + ["-np", str(np_), "-x", "MASTER_PORT", sys.executable, TORCH_DDP_PY, "--device", "cpu",
                           *map(str, MODEL), "--context-length", str(T), "--batch-size", str(BATCH), "--setup", "eager",
                           "--bucket-mb", f"{TINY_MB},{HUGE_MB}", "--warmup", "1", "--steps", str(steps), *extra,
                           "--out", path]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, f"torch_ddp.py {' '.join(extra)} failed: {proc.stdout}\n{proc.stderr}"
        records = [json.loads(line) for line in open(path)]
        for r in records:
            assert r["status"] == "ok" and len(r["ranks"]) == np_, r
            step_ms = np.array([p["step_ms"] for p in r["ranks"]])
            assert step_ms.shape == (np_, steps) and np.allclose(r["step_ms_max_over_ranks"], step_ms.max(axis=0)), r
        return path, records

    # One rank's model without DDP (--single), then DDP at both bucket sizes and FSDP2 beside it: no
    # bucket, once each whatever --bucket-mb lists, the same losses in fp32 (the gradients averaged as
    # DDP averages them, AdamW on each rank's shards).
    single, records = torch_ddp("torch_single.jsonl", 2, "--single")
    assert [(r["ddp"], r["bucket_mb"]) for r in records] == [("none", None)], records
    sharded, records = torch_ddp("torch_fsdp2.jsonl", 4, "--shard-optimizer", "none,fsdp2,fsdp2-noreshard")
    assert [(r["ddp"], r["shard_optimizer"], r["bucket_mb"]) for r in records] == [
        ("torch", "none", TINY_MB), ("torch", "fsdp2", None), ("torch", "fsdp2-noreshard", None),
        ("torch", "none", HUGE_MB)], records
    ddp_losses = [p["final_loss"] for p in records[0]["ranks"]]
    for r in records:
        losses = [p["final_loss"] for p in r["ranks"]]
        assert all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(losses, ddp_losses)), \
            f"{r['shard_optimizer']}: final losses {losses}, DDP's {ddp_losses}"
        assert all("memory_after_step_bytes" in p for p in r["ranks"]), r
        want = dict(reshard_after_forward=r["shard_optimizer"] == "fsdp2", param_dtype="fp32", reduce_dtype="fp32")
        assert r["fsdp2"] == (want if r["bucket_mb"] is None else None), r["fsdp2"]
    text = run([sys.executable, DDP_PY, out, "--torch", single, "--torch", sharded]).stdout
    assert "(d) llmhpc vs PyTorch" in text and "torch-fsdp2-eager" in text and "fsdp2-noreshard" in text and \
        "match no llmhpc setup" not in text, f"torch_ddp.py's records in tables (d) and (f):\n{text}"
    print("torch_ddp.py: ran on the CPU (gloo), DDP and FSDP2 to the same losses, and ddp.py put them beside llmhpc")


def main():
    work = scratch_dir("llmhpc-ddp-")
    check_bucket_model()
    check_stage_model()
    for np_ in (2, 3):
        out = os.path.join(work, f"np{np_}")
        ddp_run(np_, out, "--context-length", T, "--batch-size", BATCH, "--ddp", ",".join(STRATEGIES), "--bucket-mb", f"{TINY_MB},{HUGE_MB}",
                "--warmup", WARMUP, "--steps", STEPS)
        step_ms = check_rank_files(out, np_)
        check_summary_and_report(out, np_, step_ms)
    check_engine_labels(os.path.join(work, "np2"))
    check_bf16_gradients(work)
    check_gradients_made_in_bf16(work)
    check_repeated_runs(os.path.join(work, "np2"), work)
    check_torch_table(os.path.join(work, "np2"), work, 2)
    check_comm_source(os.path.join(work, "np2"), work)
    check_oom_rows(work)
    check_sharding_table(work)
    check_state_table(work)
    check_stage_model_runs(work)
    check_bad_input(work)
    check_tensor_parallel(work)
    check_tp_overlap_sweep(work)
    check_torch_ddp(os.path.join(work, "np2"), work, 2)
    print("test_ddp_mode: OK")


if __name__ == "__main__":
    main()
