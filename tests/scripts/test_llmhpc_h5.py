"""The loader on files written here with h5py: plain records as every llmhpc so far wrote them,
and streamed records laid out as src/io/recorder.cpp writes them (docs/hdf5-schema.md).

Checks that Record.arrays still behaves as the dict of arrays scripts use, that it reads a
dataset only when it is first indexed (a value changed in the file after open_run is seen;
one changed after the first read is not) and keeps no file open, that a streamed record's
columns are cut at stream_rows, and that read() and iter_chunks() return exactly the rows
asked for, in batches no larger than asked. And that the loader refuses a folder whose rank
files are of different runs, and says once, on stderr, which ranks have no file; that the bench
summary has each phase's min and max, and that tables name models and order rows as sweeps do.
"""
import contextlib
import io
import os
import sys

import h5py
import numpy as np

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
sys.path.insert(0, os.path.join(ROOT, "analysis"))
import llmhpc_h5  # noqa: E402
from script_env import scratch_dir  # noqa: E402

FORWARD_MS = np.array([1.5, 2.5, 4.0])
STEP_MS = np.array([3.0, 5.0, 8.0])
TAGS = ["a", "", "größe" * 1000]
STREAM_ROWS, STREAM_CHUNK = 200_003, 1 << 16


def rank_file(directory, mode, rank=0, world_size=1, **attrs):
    """An empty rank file with the root attributes of schema_version 1 (attrs: others, or changed;
    None: left out)."""
    f = h5py.File(os.path.join(directory, f"rank{rank:05d}.h5"), "w")
    root = dict(schema_version=np.int64(1), mode=mode, rank=np.int64(rank), world_size=np.int64(world_size),
                local_rank=np.int64(rank), hostname="node0", device_name="cpu", backend="mpi", git_sha="x",
                argv="llmhpc", config_json="{}", start_time="2026-01-01T00:00:00Z", status="complete",
                end_time="2026-01-01T00:01:00Z")
    root.update(attrs)
    for key, value in root.items():
        if value is not None:
            f.attrs[key] = value
    return f


def write_plain_run(directory):
    """One bench record as llmhpc has always written it: contiguous datasets, written whole."""
    with rank_file(directory, "bench") as f:
        g = f.create_group("bench/small_T16")
        g.attrs["status"] = "ok"
        g.attrs["context_length"] = np.int64(16)
        g.create_dataset("forward_ms", data=FORWARD_MS)
        g.create_dataset("step_ms", data=STEP_MS)
        g.create_dataset("warmup_step_ms", data=np.array([9.0]))
        g.create_dataset("tags", data=TAGS, dtype=h5py.string_dtype())
        assert g["forward_ms"].chunks is None, "the plain record must be contiguous, as the recorder writes it"


def stream_values(start, stop):
    i = np.arange(start, stop)
    names = np.array([f"k{j % 13}" if j % 5 else "" for j in i], dtype=object)
    return {"t_ms": i * 0.25, "start_ns": i * 1_000_003 - 7, "name": names}


def write_stream_run(directory):
    """Streamed records as the recorder writes them: columns created empty, chunked and unlimited,
    extended batch by batch, stream_rows after each batch. `trace` was cut by a crash in its last
    batch (t_ms got 5 rows more than stream_rows); `empty` never got a row."""
    with rank_file(directory, "trace") as f:
        for name, status, rows in (("trace", "running", STREAM_ROWS), ("empty", "interrupted", 0)):
            g = f.create_group(f"trace/{name}")
            g.attrs["status"] = status
            for column, dtype in (("t_ms", "f8"), ("start_ns", "i8"), ("name", h5py.string_dtype())):
                g.create_dataset(column, shape=(0,), maxshape=(None,), chunks=(STREAM_CHUNK,), dtype=dtype)
            for start in range(0, rows, STREAM_CHUNK):
                stop = min(start + STREAM_CHUNK, rows)
                for column, values in stream_values(start, stop).items():
                    g[column].resize((stop,))
                    g[column][start:stop] = values
                g.attrs["stream_rows"] = np.int64(stop)
            g.attrs["stream_rows"] = np.int64(rows)
        crashed = f["trace/trace/t_ms"]
        crashed.resize((STREAM_ROWS + 5,))
        crashed[STREAM_ROWS:] = -1.0


def open_files():
    return len(h5py.h5f.get_obj_ids(types=h5py.h5f.OBJ_FILE))


def check_kept_steps(directory):
    """A configuration cut short with its steps (a signal, or a kill after a --flush-s rewrite, whose
    'running' reads as interrupted): the summary counts them and its status says how many, per rank
    and pooled; one cut short with none stays empty."""
    os.makedirs(directory)
    for rank, (status, kept) in enumerate((("interrupted: SIGTERM", 3), ("running", 2))):
        with rank_file(directory, "bench", rank, 2, status="running") as f:
            g = f.create_group("bench/small_T16")
            g.attrs.update(status=status, steps_timed=np.int64(kept), steps_asked=np.int64(1000))
            g.create_dataset("step_ms", data=STEP_MS[:kept])
            e = f.create_group("bench/small_T32")  # marked before its first step, killed: nothing kept
            e.attrs["status"] = "running"
    run = llmhpc_h5.open_run(directory)
    pooled = run.bench_summary(rank=None).set_index("name")
    assert pooled.loc["small_T16", "step_n"] == 5, pooled
    assert pooled.loc["small_T16", "status"] == ("interrupted (2 of 1000 steps kept); "
                                                 "interrupted: SIGTERM (3 of 1000 steps kept)"), pooled["status"]
    assert pooled.loc["small_T32", "status"] == "interrupted" and pooled.loc["small_T32", "step_n"] == 0, pooled
    assert llmhpc_h5.status_word(pooled.loc["small_T16", "status"]) == "interrupted"
    one = run.bench_summary(rank=0).set_index("name")
    assert one.loc["small_T16", "status"] == "interrupted: SIGTERM (3 of 1000 steps kept)", one["status"]
    assert abs(one.loc["small_T16", "step_mean"] - STEP_MS[:3].mean()) < 1e-12, one



def check_kept_ddp_steps(directory):
    """A ddp configuration the watchdog ended (root 'aborted by the watchdog: ...', the record left
    'running' with the steps of the rank's last snapshot): it counts as cut short with its steps, in
    the pooled status and the phases; its slowest rank's steps are the ranks' maxima over the steps
    both kept, as step_ms_max_over_ranks would have been."""
    os.makedirs(directory)
    steps = (np.array([10.0, 12.0, 11.0]), np.array([11.0, 10.5]))
    for rank, kept in enumerate(steps):
        with rank_file(directory, "ddp", rank, 2, status=f"{llmhpc_h5.ABORTED}: no progress within --comm-timeout") as f:
            g = f.create_group("ddp/d16_flat")
            g.attrs.update(status="running", steps_timed=np.int64(len(kept)), steps_asked=np.int64(10), ddp="flat",
                           world_size=np.int64(2), batch_size=np.int64(4), precision="fp32")
            for phase in llmhpc_h5.DDP_PHASES:
                g.create_dataset(f"{phase}_ms", data=kept if phase == "step" else kept / 2)
    run = llmhpc_h5.open_run(directory)
    assert all(r.kept_steps and r.measured for r in run.records("ddp", rank=None)), run.records("ddp", rank=None)
    (row,) = run.ddp_summary().to_dict("records")
    assert row["status"] == f"{llmhpc_h5.ABORTED} (2-3 of 10 steps kept)", row["status"]
    assert row["step_n"] == 5 and abs(row["step_mean"] - np.concatenate(steps).mean()) < 1e-12, row
    assert row["slowest_step_n"] == 2 and abs(row["slowest_step_mean"] - np.mean([11.0, 12.0])) < 1e-12, row
    (one,) = run.ddp_summary(rank=0).to_dict("records")
    assert one["slowest_step_n"] == 0, "one rank's file alone cannot tell the slowest rank's steps"


def check_kept_iterations(directory):
    """Mode comm's and attention's records cut short with what they measured, as bench's: comm
    counts the iterations every rank kept (each rank its own count), in the nccl-tests table with
    a status column, in the study's table and in the soak verdict, which judges the iterations kept
    and does not hold; attention's tables and plots take the iterations kept."""
    import attention
    import comm
    import soak
    os.makedirs(directory)
    times = np.array([10.0, 12.0, 11.0, 13.0])
    for rank, kept in enumerate((4, 3)):
        with rank_file(directory, "comm", rank, 2, status="interrupted: SIGINT") as f:
            g = f.create_group("comm/allreduce_float_1MB_outofplace")
            g.attrs.update(status="interrupted: SIGINT", steps_timed=np.int64(kept), steps_asked=np.int64(1000),
                           collective="allreduce", dtype="float", requested_bytes=np.int64(1 << 20),
                           bytes=np.int64(1 << 20), count=np.int64(1 << 18), redop="sum", root=np.int64(-1),
                           placement="outofplace", bus_factor=1.0, world_size=np.int64(2), backend="mpi",
                           duration_s=60.0)
            g.create_dataset("time_us", data=times[:kept] + rank)
            for name in soak.MEMORY:
                g.create_dataset(name, data=np.arange(kept, dtype=np.int64))
    run = llmhpc_h5.open_run(directory)
    status = "interrupted: SIGINT (3-4 of 1000 iterations kept)"
    (row,) = comm.comm_rows(run)
    slowest = np.maximum(times[:3], times[:3] + 1)
    assert row["oop time"] == comm.format_us(slowest.mean()) and row["oop wrong"] == "-", row
    assert row["oop status"] == status, row
    table = comm.markdown([row])
    assert "| oop status |" in table and status in table and table.splitlines()[1].endswith("|---|"), table
    (study,) = comm.study_rows(run)
    assert study["measured"] and study["status"] == status and study["n"] == 3, study
    assert status in comm.study_markdown([study]) and "| - |" not in comm.study_markdown([study]), study
    verdicts = {r["rank"]: r for r in soak.soak_rows(run)}
    assert verdicts[0]["iterations"] == 4 and not verdicts[0]["held"], verdicts[0]
    assert verdicts[0]["verdict"].startswith("cut short: interrupted: SIGINT (4 of 1000 iterations kept)"), verdicts[0]
    assert verdicts[1]["iterations"] == 3, verdicts[1]

    folder = os.path.join(directory, "attention")
    os.makedirs(folder)
    with rank_file(folder, "attention") as f:
        for name, status, steps in (("flash_T16", "interrupted: SIGTERM", 2), ("flash_T32", "running", 0)):
            g = f.create_group(f"attention/{name}")
            g.attrs.update(status=status, steps_timed=np.int64(steps), steps_asked=np.int64(10), impl="flash",
                           precision="fp32", batch=np.int64(1), heads=np.int64(2), head_dim=np.int64(16),
                           seq=np.int64(16 if name.endswith("16") else 32), causal=np.int64(1))
            for phase in ("forward", "backward", "total"):
                g.create_dataset(f"{phase}_ms", data=FORWARD_MS[:steps])
    frame = attention.attention_frame([folder]).set_index("name")
    assert frame.loc["flash_T16", "measured"] and not frame.loc["flash_T32", "measured"], frame
    assert frame.loc["flash_T16", "status"] == "interrupted: SIGTERM (2 of 10 iterations kept)", frame["status"]
    tables = attention.per_implementation_tables(frame.reset_index())
    kept_row = next(line for line in tables.splitlines() if line.startswith("| 16 | 16 |"))
    assert f"{FORWARD_MS[:2].mean():.3f} ± " in kept_row, tables


def check_plain(directory):
    write_plain_run(directory)
    run = llmhpc_h5.open_run(directory)
    assert open_files() == 0, "open_run must not keep a file open"
    (rec,) = run.records("bench")
    arrays = rec.arrays
    names = {"forward_ms", "step_ms", "warmup_step_ms", "tags"}
    assert set(arrays) == names and set(arrays.keys()) == names and len(arrays) == 4, f"names: {list(arrays)}"
    assert "step_ms" in arrays and "backward_ms" not in arrays and arrays.get("backward_ms") is None

    # Lazy: a value changed in the file after open_run is what the first access reads ...
    path = os.path.join(directory, "rank00000.h5")
    with h5py.File(path, "a") as f:
        f["bench/small_T16/step_ms"][0] = 99.0
    assert arrays["step_ms"].tolist() == [99.0, 5.0, 8.0], f"step_ms read at open, not on access: {arrays['step_ms']}"
    # ... and the array read then is kept: the same object, not changed by a later write.
    with h5py.File(path, "a") as f:
        f["bench/small_T16/step_ms"][0] = 100.0
    assert arrays["step_ms"] is arrays["step_ms"] and arrays["step_ms"][0] == 99.0, "an array read once is kept"
    assert open_files() == 0, "an access must close the file again"
    with h5py.File(path, "a") as f:
        f["bench/small_T16/step_ms"][0] = STEP_MS[0]

    np.testing.assert_array_equal(arrays["forward_ms"], FORWARD_MS)
    assert arrays["forward_ms"].dtype == np.float64
    assert arrays["tags"].dtype == object and arrays["tags"].tolist() == TAGS, "strings come back as str"
    assert dict(arrays.items()).keys() == names, "items() reads every dataset"
    summary = run.bench_summary()
    assert summary["forward_n"][0] == 3 and abs(summary["forward_mean"][0] - FORWARD_MS.mean()) < 1e-12, summary
    check_kept_steps(os.path.join(os.path.dirname(directory), "kept"))
    check_kept_iterations(os.path.join(os.path.dirname(directory), "kept-iterations"))
    check_kept_ddp_steps(os.path.join(os.path.dirname(directory), "kept-ddp"))
    assert (summary["forward_min"][0], summary["forward_max"][0]) == (1.5, 4.0), summary
    assert arrays.read("forward_ms", 1).tolist() == [2.5, 4.0] and arrays.length("tags") == 3
    try:
        next(arrays.iter_chunks())
        raise AssertionError("iter_chunks over columns of different lengths should raise")
    except ValueError as e:
        assert "one length" in str(e), e
    try:
        arrays["backward_ms"]
        raise AssertionError("a missing dataset should raise KeyError")
    except KeyError as e:
        assert "backward_ms" in str(e) and "step_ms" in str(e), f"unclear message: {e}"
    # Only names were read at open: a dataset not read before the file went is an error, a kept one is not.
    (fresh,) = llmhpc_h5.open_run(directory).records("bench")
    os.remove(path)
    assert arrays["step_ms"][0] == 99.0
    try:
        fresh.arrays["step_ms"]
        raise AssertionError("reading from a removed file should raise SchemaError")
    except llmhpc_h5.SchemaError as e:
        assert "rank00000.h5" in str(e), e


def check_stream(directory):
    write_stream_run(directory)
    # Still "running" in a run that has ended: the stream a killed rank left ("running" with live=True).
    live = {r.name: r for r in llmhpc_h5.open_run(directory, live=True).records("trace")}
    assert live["trace"].status == "running", live["trace"].status
    run = llmhpc_h5.open_run(directory)
    records = {r.name: r for r in run.records("trace")}
    rec, empty = records["trace"], records["empty"]
    assert (rec.status, rec.attrs["stream_rows"]) == ("interrupted", STREAM_ROWS), (rec.status, rec.attrs)
    want = stream_values(0, STREAM_ROWS)

    # Slices, read without keeping, cut at stream_rows.
    a = rec.arrays
    assert a.length("t_ms") == STREAM_ROWS, f"t_ms has {a.length('t_ms')} rows; stream_rows says {STREAM_ROWS}"
    np.testing.assert_array_equal(a.read("start_ns", 1000, 1010), want["start_ns"][1000:1010])
    assert a.read("name", -3).tolist() == want["name"][-3:].tolist()
    np.testing.assert_array_equal(a.read("t_ms", STREAM_ROWS - 2, STREAM_ROWS + 100), want["t_ms"][-2:])
    assert len(a.read("t_ms", 10, 5)) == 0

    # Batches: every row once, in order, none longer than asked; nothing kept.
    sizes, parts = [], {name: [] for name in want}
    for batch in a.iter_chunks(rows=STREAM_CHUNK):
        assert set(batch) == set(want), f"batch columns {sorted(batch)}"
        assert len({len(v) for v in batch.values()}) == 1, "the columns of a batch have equal lengths"
        sizes.append(len(batch["t_ms"]))
        for name, values in batch.items():
            parts[name].append(values)
    assert sizes == [STREAM_CHUNK] * 3 + [STREAM_ROWS - 3 * STREAM_CHUNK], f"batch sizes {sizes}"
    for name, values in want.items():
        got = np.concatenate(parts[name])
        assert got.tolist() == values.tolist(), f"{name}: the batches do not put the column back together"
    only_t = [len(b["t_ms"]) for b in a.iter_chunks(["t_ms"], rows=100_000)]
    assert only_t == [100_000, 100_000, 3], only_t
    with h5py.File(os.path.join(directory, "rank00000.h5"), "a") as f:
        f["trace/trace/t_ms"][0] = 42.0
    assert a["t_ms"][0] == 42.0, "iter_chunks and read must not fill the kept arrays"

    # Whole columns, cut at stream_rows: the crash's extra rows in t_ms are not seen.
    assert a["t_ms"].shape == (STREAM_ROWS,) and a["t_ms"][-1] == want["t_ms"][-1], a["t_ms"][-3:]
    assert a["name"].tolist() == want["name"].tolist() and "" in a["name"].tolist()

    assert empty.status == "interrupted" and empty.attrs["stream_rows"] == 0
    assert empty.arrays["t_ms"].shape == (0,) and empty.arrays["name"].shape == (0,)
    assert list(empty.arrays.iter_chunks()) == []


def refused(directory, words):
    try:
        llmhpc_h5.open_run(directory)
    except llmhpc_h5.SchemaError as e:
        assert all(w in str(e) for w in words), f"{directory}: the error should say {words}: {e}"
        return
    raise AssertionError(f"{directory}: files of different runs were read as one run")


def check_runs(work):
    """Rank files of two runs in one folder are refused (run_id, or argv for files without one);
    a rank with no file is said once on stderr and leaves the run incomplete."""
    cases = {"two-ids": ({"run_id": "t0-a-1"}, {"run_id": "t0-a-2"}, "run_id"),
             "old-files": ({"argv": "llmhpc --mode bench"}, {"argv": "llmhpc --mode bench --steps 3"}, "argv"),
             "one-id": ({"run_id": "t0-a-1"}, {"run_id": None}, "run_id")}
    for name, (attrs0, attrs1, key) in cases.items():
        directory = os.path.join(work, name)
        os.makedirs(directory)
        rank_file(directory, "bench", 0, 2, **attrs0).close()
        rank_file(directory, "bench", 1, 2, **attrs1).close()
        refused(directory, ["different runs", key, "rank 1"])

    directory = os.path.join(work, "missing")
    os.makedirs(directory)
    rank_file(directory, "bench", 0, 3, run_id="t0-a-1").close()
    rank_file(directory, "bench", 2, 3, run_id="t0-a-1").close()
    said = io.StringIO()
    with contextlib.redirect_stderr(said):
        run = llmhpc_h5.open_run(directory)
        llmhpc_h5.open_run(directory)
    assert said.getvalue().count("\n") == 1 and "rank(s) [1] have no file" in said.getvalue(), said.getvalue()
    assert run.missing_ranks == [1] and not run.complete, "a run with a rank's file missing is not complete"
    assert run.describe_ranks() == "3 rank(s), rank 1's file missing", run.describe_ranks()

    # How NCCL connected the ranks (comm/nccl_log.h), each value once over the ranks.
    directory = os.path.join(work, "nccl")
    os.makedirs(directory)
    rank_file(directory, "bench", 0, 2, run_id="t0-a-1", nccl_transports="P2P/CUMEM/read", nccl_network="Socket",
              nccl_interfaces="eth0").close()
    rank_file(directory, "bench", 1, 2, run_id="t0-a-1", nccl_transports="P2P/CUMEM/read,NET/Socket",
              nccl_network="Socket", nccl_interfaces="eth0,eth1").close()
    said = llmhpc_h5.open_run(directory).describe_ranks()
    assert said == "2 rank(s); NCCL: P2P/CUMEM/read,NET/Socket; network Socket on eth0,eth1", said

    # How MPI reached the ranks' peers (comm/mpi_connections.h), said where NCCL said nothing.
    directory = os.path.join(work, "mpi")
    os.makedirs(directory)
    rank_file(directory, "bench", 0, 3, run_id="t0-a-1", mpi_transports="shared memory").close()
    rank_file(directory, "bench", 1, 3, run_id="t0-a-1", mpi_transports="shared memory,tcp",
              mpi_interfaces="eth0").close()
    rank_file(directory, "bench", 2, 3, run_id="t0-a-1", mpi_transports="tcp", mpi_interfaces="ib0").close()
    said = llmhpc_h5.open_run(directory).describe_ranks()
    assert said == "3 rank(s); MPI: shared memory,tcp on eth0,ib0", said


def check_labels():
    """The gradients' dtype of files from before --grad-dtype, the precision and the model as tables
    show them, and the sweep's order of rows."""
    assert llmhpc_h5.grad_dtype({"precision": "bf16"}) == "fp32"
    assert llmhpc_h5.grad_dtype({"precision": "fp64"}) == "fp64"
    assert llmhpc_h5.label_precision({"precision": "bf16", "grad_dtype": "bf16"}) == "bf16 bf16-grads"
    assert llmhpc_h5.label_precision({"precision": "bf16", "grad_dtype": "fp32"}) == "bf16"
    shape = dict(d_model=64, d_ff=128, num_layers=2, num_heads=4)
    assert llmhpc_h5.model_name(dict(shape, model="custom")) == "d64_ff128_L2_H4"
    assert llmhpc_h5.model_name(dict(shape, model="checkpoint")) == "d64_ff128_L2_H4"
    assert llmhpc_h5.model_name(dict(shape, model="small")) == "small"
    rows = [dict(precision=p, context_length=t, attention=a) for p in ("bf16", "fp64", "fp32", "bf16 bf16-grads")
            for t in (128, 32) for a in ("flash", "naive")]
    rows.append(dict(precision="fp32", context_length=None, attention="naive"))  # never measured: last of fp32
    keys = ("precision", "context_length", "attention")
    got = [tuple(r.values()) for r in sorted(rows, key=lambda r: llmhpc_h5.sweep_key(r, keys))]
    assert got[:5] == [("fp32", 32, "naive"), ("fp32", 32, "flash"), ("fp32", 128, "naive"), ("fp32", 128, "flash"),
                       ("fp32", None, "naive")], got
    assert [p for p, _, _ in got[5::4]] == ["bf16", "bf16 bf16-grads", "fp64"], got


def check_hangs(work):
    """Two watchdogs fired, rank 0's finding rank 2 gone: report.py says rank 2 fired too (it was
    aborting, not stopped), and names rank 1 as the one that had not reached the collective."""
    import report
    assert llmhpc_h5.rank_list("0,2-5,9") == [0, 2, 3, 4, 5, 9] and llmhpc_h5.rank_list("") == []
    directory = os.path.join(work, "hang")
    os.makedirs(directory)
    for rank in range(3):
        if rank == 1:  # the stalled rank: killed, its file as it was
            rank_file(directory, "comm", rank, 3, status="running", end_time=None).close()
            continue
        no_answer = "2" if rank == 0 else ""  # rank 2 was already on its way out when rank 0 asked
        rank_file(directory, "comm", rank, 3, status=f"{llmhpc_h5.ABORTED}: no progress", hang_collective=np.int64(7),
                  hang_reached="0,2" if rank == 2 else "0", hang_not_reached="1", hang_not_reached_hosts="node0",
                  hang_no_answer=no_answer, hang_no_answer_hosts="node0" if no_answer else "",
                  hang_report="llmhpc: watchdog").close()
    section = report.hang_section([llmhpc_h5.open_run(directory)])
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert len(rows) == 2 and "rank(s) 2 had fired too: aborting, not stopped" in rows[0], section
    assert "fired too" not in rows[1] and "| 1 (node0) |" in rows[1], section
    # A partition: ranks 0 and 2 each name the other as not answering, neither could connect.
    def names_other(rank, other, why):
        with h5py.File(os.path.join(directory, f"rank{rank:05d}.h5"), "a") as f:
            f.attrs["hang_no_answer"], f.attrs["hang_no_answer_hosts"] = str(other), "node0"
            f.attrs["hang_report"] = f"llmhpc: watchdog ...\n    no answer: rank {other} on node0 (rank {other}: {why})\n"
    names_other(0, 2, "no connection within 2.0 s (its host is unreachable?)")
    names_other(2, 0, "no connection within 2.0 s (its host is unreachable?)")
    rows = [line for line in report.hang_section([llmhpc_h5.open_run(directory)]).splitlines() if line.startswith("| `")]
    assert "rank(s) 2 could not reach this rank either: cut off from each other" in rows[0] and \
        "fired too" not in rows[0], rows[0]
    # A stopped rank, woken as the job ended: rank 0 had no reply from it, and its own watchdog then
    # found rank 0 gone. Not a partition.
    names_other(0, 2, "no reply within 2.0 s (a stopped process accepts and never answers)")
    names_other(2, 0, "connection refused (the process has ended?)")
    rows = [line for line in report.hang_section([llmhpc_h5.open_run(directory)]).splitlines() if line.startswith("| `")]
    assert "rank(s) 2 fired after this rank had ended: held up (stopped or slow), not cut off" in rows[0] and \
        "cut off from each other" not in rows[0], rows[0]
    # Rank 0 stopped: its watchdog fires late (hang_late_s), after rank 2 had reported and ended. The
    # run line takes rank 2's report, and each row says which rank was held up.
    names_other(2, 0, "no reply within 2.0 s (a stopped process accepts and never answers)")
    names_other(0, 2, "connection refused (the process has ended?)")
    with h5py.File(os.path.join(directory, "rank00000.h5"), "a") as f:
        f.attrs["hang_late_s"] = 5.1
    run = llmhpc_h5.open_run(directory)
    assert [h["late_s"] for h in run.hang_reports()] == [5.1, 0.0], run.hang_reports()
    rows = [line for line in report.hang_section([run]).splitlines() if line.startswith("| `")]
    assert "| 0 (node0), fired late |" in rows[0] and "this rank's watchdog fired 5.1 s late (stopped or starved): " \
        "they had reported and ended meanwhile" in rows[0], rows[0]
    assert "rank(s) 0 fired late, its watchdog not run for seconds: stopped or starved, the rank to look at" in rows[1] \
        and "held up" not in rows[1] and "fired too" not in rows[1], rows[1]
    assert "(ABORTED by the watchdog of rank 2: collective #7 not reached by rank(s) 1" in report.describe(run), \
        report.describe(run)


def main():
    work = scratch_dir("llmhpc-h5-")
    check_runs(work)
    check_labels()
    check_hangs(work)
    for name, check in (("plain", check_plain), ("stream", check_stream)):
        directory = os.path.join(work, name)
        os.makedirs(directory)
        check(directory)
    print("test_llmhpc_h5: OK")


if __name__ == "__main__":
    main()
