"""analysis/timeline.py on mode ddp's step timeline.

A 2-rank ddp run on the CPU (mpi backend, zero1) records no timeline, and timeline.py says so
with exit 2. Then every rank's record is given a timeline written here, as the nccl backend
writes it (docs/hdf5-schema.md): 4 steps of 100 ms, forward 0-30, backward 30-70, gradient wait
70-75, optimizer 75-85; an all-reduce 40-60, a reduce-scatter 65-80 and an all-gather 90-110 that
runs into the next step's forward; a tensor-parallel all-reduce 10-12, which the table (the
data-parallel collectives') leaves out. The table's split of the collectives' 55 ms a step must be
what those spans give (forward 10, backward 25, optimizer 5, exposed 5, between steps 10, 72.7%
beside compute), the Chrome trace must hold each span once with its stream and step, and the plot must
be written; analysis/report.py gives the table and the plot as its "Step timeline" section. A
2-rank train run's /train record is read the same way, with --grad-accum's one phase for the
micro-batches' forwards and backwards.
"""
import json
import os
import sys

import h5py
import numpy as np

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from script_env import llmhpc_binary, mpiexec, parse_markdown_tables, run, scratch_dir  # noqa: E402

TIMELINE = os.path.join(ROOT, "analysis", "timeline.py")
PHASES = [("forward", 0, 30), ("backward", 30, 70), ("gradient wait", 70, 75), ("optimizer", 75, 85)]
COLLECTIVES = [("allreduce", 4096, 40, 60), ("reducescatter", 8192, 65, 80), ("allgather x2", 2048, 90, 110)]
STEPS, PERIOD = 4, 100.0


def write_timeline(path: str, group: str, phases=PHASES) -> None:
    rows = []
    for s in range(STEPS):
        rows += [(s, "compute", name, 0, s * PERIOD + a, s * PERIOD + b) for name, a, b in phases]
        rows += [(s, "communication", name, n, s * PERIOD + a, s * PERIOD + b) for name, n, a, b in COLLECTIVES]
        rows += [(s, "tensor parallel", "allreduce", 512, s * PERIOD + 10, s * PERIOD + 12)]
    with h5py.File(path, "a") as f:
        g = f[group]
        columns = list(zip(*rows))
        g["timeline_step"] = np.array(columns[0], dtype=np.int64)
        g["timeline_stream"] = np.array(columns[1], dtype=h5py.string_dtype())
        g["timeline_name"] = np.array(columns[2], dtype=h5py.string_dtype())
        g["timeline_bytes"] = np.array(columns[3], dtype=np.int64)
        g["timeline_start_ms"] = np.array(columns[4], dtype=np.float64)
        g["timeline_end_ms"] = np.array(columns[5], dtype=np.float64)


def main() -> int:
    work = scratch_dir("timeline")
    out = os.path.join(work, "ddp")
    run([*mpiexec(), "-np", "2", llmhpc_binary(), "--mode", "ddp", "--device", "cpu", "--d-model", "32", "--d-ff", "64",
         "--num-layers", "2", "--num-heads", "4", "--vocab-size", "64", "--context-length", "8", "--batch-size", "4",
         "--ddp", "bucketed", "--shard-optimizer", "zero1", "--warmup", "1", "--steps", "2", "--out", out])
    labels = []
    for rank in (0, 1):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            labels = list(f["ddp"])
            assert len(labels) == 1 and "timeline_step" not in f["ddp"][labels[0]], \
                f"the mpi backend measures no device time, so no timeline: {labels}"
    missing = run([sys.executable, TIMELINE, out], expect_ok=False)
    assert missing.returncode == 2 and "recorded on the nccl backend" in missing.stderr, \
        f"no timeline: exit 2 and what records one ({missing.returncode}):\n{missing.stderr}"

    for rank in (0, 1):
        write_timeline(os.path.join(out, f"rank{rank:05d}.h5"), "ddp/" + labels[0])
    trace, png = os.path.join(work, "timeline.json"), os.path.join(work, "timeline.png")
    text = run([sys.executable, TIMELINE, out, "--trace", trace, "--png", png]).stdout
    (table,) = [t for t in parse_markdown_tables(text) if "Beside compute %" in t[0]]
    header, rows = table
    assert [r[header.index("Rank")] for r in rows] == ["0", "1"], f"a row per rank:\n{text}"
    expected = {"Steps": 3, "Step (ms)": 100, "Collectives": 3, "Comm (ms)": 55, "Beside fwd (ms)": 10,
                "Beside bwd (ms)": 25, "Beside optimizer (ms)": 5, "Exposed (ms)": 5, "Between steps (ms)": 10,
                "Beside compute %": 100 * 40 / 55}
    for row in rows:
        for column, value in expected.items():
            got = float(row[header.index(column)])
            assert abs(got - value) <= 0.06, f"{column}: {got}, expected {value:.2f}:\n{text}"

    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert len(spans) == 2 * STEPS * (len(PHASES) + len(COLLECTIVES) + 1), f"each span once: {len(spans)}"
    gather = [e for e in spans if e["name"] == "allgather x2" and e["args"]["step"] == 1]
    assert len(gather) == 2 and all(e["ts"] == 190e3 and e["dur"] == 20e3 and e["cat"] == "communication"
                                    and e["args"]["bytes"] == 2048 for e in gather), gather
    assert {e["cat"] for e in spans} == {"compute", "communication", "tensor parallel"}, "a track per stream"
    assert len([e for e in spans if e["cat"] == "tensor parallel"]) == 2 * STEPS, "the tensor-parallel spans"
    assert os.path.getsize(png) > 10000, "the plot was not written"

    report_md = os.path.join(work, "report", "report.md")
    run([sys.executable, os.path.join(ROOT, "analysis", "report.py"), out, "-o", report_md])
    with open(report_md) as f:
        section = f.read().split("## Step timeline", 1)
    assert len(section) == 2 and "72.7" in section[1], "report.py's Step timeline section holds the table"
    assert any(n.startswith("timeline_") and n.endswith(".png") for n in os.listdir(os.path.dirname(report_md))), \
        "report.py draws the timeline beside the report"
    # Mode train records the same timeline in /train: read alike.
    train = os.path.join(work, "train")
    np.random.default_rng(0).integers(0, 64, 4000, dtype=np.uint16).tofile(os.path.join(work, "tokens.bin"))
    run([*mpiexec(), "-np", "2", llmhpc_binary(), "--mode", "train", "--device", "cpu", "--data",
         os.path.join(work, "tokens.bin"), "--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "4",
         "--vocab-size", "64", "--context-length", "8", "--batch-size", "4", "--steps", "3", "--out", train])
    missing = run([sys.executable, TIMELINE, train], expect_ok=False)
    assert missing.returncode == 2 and "no train record with a timeline" in missing.stderr, missing.stderr
    # --grad-accum: the micro-batches' forwards and backwards are one phase, and the table's column.
    merged = [("forward and backward", 0, 70)] + PHASES[2:]
    for rank in (0, 1):
        write_timeline(os.path.join(train, f"rank{rank:05d}.h5"), "train", merged)
    text = run([sys.executable, TIMELINE, train]).stdout
    (table,) = [t for t in parse_markdown_tables(text) if "Beside compute %" in t[0]]
    header, rows = table
    assert [r[0] for r in rows] == ["train", "train"], f"a row per rank of the train record:\n{text}"
    assert all(float(r[header.index("Beside fwd+bwd (ms)")]) == 35 for r in rows), f"10 + 25 ms beside it:\n{text}"

    sys.path.insert(0, os.path.join(ROOT, "analysis"))
    import timeline
    alone = timeline.overlap_summary([dict(step=0, stream="communication", name="allreduce", bytes=8, start=0.0, end=1.0)])
    assert alone["comm_ms"] == 1.0 and alone["idle"] == 1.0 and alone["step_ms"] != alone["step_ms"], alone
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
