"""End to end: --duration-s on modes comm and ddp (CPU, mpirun -np 2), the memory samples they
record, and analysis/soak.py's numbers and verdicts.

A comm run (all-reduce 64 KB, --duration-s 3) and a ddp run (a tiny model, bucketed,
--duration-s 3), read with h5py alone: every rank ran the same number of timed iterations, more
than the fixed default, and the recorded count attribute says so; their summed time is of the
order of the duration (the count is calibrated on the warm-up); the memory arrays (one sample
per chunk of comm's timed loop, one per ddp step) line up with the iterations, and the device
allocator's live bytes do not move while the loop runs. On one rank, 3 s of no-op all-reduces
(millions on an idle core) leave the host's resident set within soak.py's 16 MiB, and past 10
million of them 1 in time_us_every is recorded, the fewest that fit. A fixed-count comm run records one
sample and duration_s 0. analysis/soak.py's --jsonl numbers are those computed here from the raw
arrays (median of the first and last tenth, drift, live and RSS growth), its verdict agrees
with its bounds, and its exit status with its verdicts. Then copies of the rank files with
arrays rewritten (h5py): a time series exactly linear in the elapsed time (drift and slope
known), a comm series thinned to 1 in 2 (soak.py's iterations and summed time doubled), a device
allocation growing each step, an RSS growth above and one below the bound, and a clean series:
each flagged, or held, as it should be, with exit status 1 or 0.
"""
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from script_env import llmhpc_binary, mpiexec, parse_markdown_tables, run, scratch_dir  # noqa: E402

BIN = llmhpc_binary()
SOAK_PY = os.path.join(ROOT, "analysis", "soak.py")
REPORT_PY = os.path.join(ROOT, "analysis", "report.py")
DURATION = 3.0
MODEL = ["--d-model", 32, "--d-ff", 64, "--num-layers", 2, "--num-heads", 4, "--vocab-size", 64,
         "--context-length", 16, "--batch-size", 4]
MEMORY = ("memory_iteration", "device_live_bytes", "device_used_bytes", "host_rss_bytes", "records_bytes")
MIB = float(1 << 20)


def records(path):
    """{group path: (attrs, {dataset: array})} of one rank file."""
    out = {}
    with h5py.File(path, "r") as f:
        def visit(name, obj):
            if isinstance(obj, h5py.Group) and "status" in obj.attrs:
                out[name] = (dict(obj.attrs), {k: obj[k][()] for k in obj if isinstance(obj[k], h5py.Dataset)})
        f.visititems(visit)
    return out


def check_duration_run(out, key, count_attr, unit_s, per_step):
    """The rank files of a --duration-s run; returns {(record, rank): (attrs, arrays)}."""
    found = {}
    for rank in (0, 1):
        for name, (attrs, arrays) in records(os.path.join(out, f"rank{rank:05d}.h5")).items():
            where = f"{out} rank {rank} {name}"
            assert attrs["status"] == "ok", f"{where}: status {attrs['status']}"
            assert attrs["duration_s"] == DURATION, f"{where}: duration_s {attrs['duration_s']}"
            t = arrays[key]
            assert attrs[count_attr] == len(t), f"{where}: {count_attr} {attrs[count_attr]} but {len(t)} times"
            assert len(t) > 20, f"{where}: {len(t)} timed iterations in {DURATION} s: not more than the fixed default"
            total = t.sum() * unit_s
            assert 0.25 * DURATION < total < 20 * DURATION, f"{where}: timed iterations add up to {total:.2f} s"
            for m in MEMORY:
                assert m in arrays, f"{where}: no {m} (has {sorted(arrays)})"
                assert arrays[m].dtype == np.int64 and len(arrays[m]) == len(arrays["memory_iteration"]), f"{where}/{m}"
            it = arrays["memory_iteration"]
            if per_step:
                assert np.array_equal(it, np.arange(len(t))), f"{where}: memory_iteration {it[:5]}..., not every step"
            else:
                assert np.all(np.diff(it) > 0) and it[-1] == len(t) - 1, f"{where}: memory_iteration {it}"
            live = arrays["device_live_bytes"]
            assert live[0] > 0 and np.all(live == live[0]), f"{where}: device live bytes moved: {np.unique(live)}"
            assert np.all(arrays["device_used_bytes"] == -1), f"{where}: device_used_bytes on the CPU should be -1"
            assert np.all(arrays["host_rss_bytes"] > 1 << 20), f"{where}: host_rss_bytes {arrays['host_rss_bytes'][:3]}"
            held = arrays["records_bytes"]  # the arrays of times, sized before the loop: at least their length
            assert np.all(np.diff(held) >= 0) and held[-1] >= 8 * len(t), f"{where}: records_bytes {held[[0, -1]]}"
            found[(name, rank)] = (attrs, arrays)
    for name in {n for n, _ in found}:
        counts = {found[(name, r)][0][count_attr] for r in (0, 1)}
        assert len(counts) == 1, f"{out} {name}: the ranks ran different counts {counts}"
    return found


def expected(arrays, key, every=1):
    """soak.py's numbers, computed here from the raw arrays (each time standing for `every` iterations)."""
    t = arrays[key].astype(float)
    n = len(t) * every
    k = max(1, len(t) // 10)
    first, last = np.median(t[:k]), np.median(t[-k:])
    it, live = arrays["memory_iteration"], arrays["device_live_bytes"]
    rss = arrays["host_rss_bytes"] - arrays["records_bytes"]  # less the run's own arrays of times
    start = next(i for i, v in enumerate(it) if v >= n // 10) if it[-1] >= n // 10 else len(it) - 1
    return dict(iterations=n, duration_s=t.sum() * every * {"time_us": 1e-6, "step_ms": 1e-3}[key],
                first=first, last=last, drift_pct=100 * (last / first - 1),
                live_growth_bytes=int(live[-1] - live[0]), live_max_growth_bytes=int(live.max() - live[0]),
                rss_growth_bytes=int(rss[-1] - rss[start]))


def soak(dirs, work, name):
    """soak.py on `dirs`: (exit status, {(record, rank): jsonl row}, markdown rows)."""
    jsonl = os.path.join(work, f"{name}.jsonl")
    proc = run([sys.executable, SOAK_PY, *dirs, "--jsonl", jsonl], expect_ok=False)
    assert proc.returncode in (0, 1), f"soak.py exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    with open(jsonl) as f:
        rows = {(r["record"], r["rank"]): r for r in map(json.loads, f)}
    tables = parse_markdown_tables(proc.stdout)
    assert len(tables) == 1 and len(tables[0][1]) == len(rows), f"soak.py's table:\n{proc.stdout}"
    held = [r["held"] for r in rows.values()]
    assert proc.returncode == (0 if all(held) else 1), f"exit {proc.returncode} with verdicts {held}"
    for r in rows.values():
        held_by_bounds = abs(r["drift_pct"]) <= 5 and r["live_growth_bytes"] <= 0 and r["rss_growth_bytes"] <= 16 * MIB
        assert r["held"] == held_by_bounds, f"verdict {r['verdict']!r} does not follow from the numbers: {r}"
        assert (r["verdict"] == "held") == r["held"], r
        if not r["held"]:
            assert f"rank {r['rank']}: {r['verdict']}" in proc.stderr, f"what failed is not on stderr:\n{proc.stderr}"
    return proc.returncode, rows, tables[0][1]


def check_numbers(found, rows, key):
    for where, (attrs, arrays) in found.items():
        got, want = rows[where], expected(arrays, key, int(attrs.get(f"{key}_every", 1)))
        for name, value in want.items():
            assert np.isclose(got[name], value, rtol=1e-9, atol=1e-9), f"{where}: soak.py {name} {got[name]}, raw {value}"
    print(f"soak.py: numbers of {len(found)} records equal the raw arrays'")


def rewrite(src_dir, dst_dir, group, **arrays):
    """A copy of the run in src_dir with the given datasets of `group` replaced (same lengths) on every rank."""
    shutil.copytree(src_dir, dst_dir)
    for rank in (0, 1):
        with h5py.File(os.path.join(dst_dir, f"rank{rank:05d}.h5"), "r+") as f:
            for name, make in arrays.items():
                old = f[group][name][()]
                f[group][name][...] = make(old).astype(old.dtype)
    return dst_dir


def thinned(src_dir, dst_dir, group):
    """A copy of the comm run in src_dir as if it had recorded 1 in 2 of its iterations: the
    per-iteration arrays of `group` halved, time_us_every 2, on every rank."""
    shutil.copytree(src_dir, dst_dir)
    for rank in (0, 1):
        with h5py.File(os.path.join(dst_dir, f"rank{rank:05d}.h5"), "r+") as f:
            g = f[group]
            for name in ("time_us", "time_us_max_over_ranks", "algbw", "busbw"):
                kept = g[name][()][::2]
                del g[name]
                g.create_dataset(name, data=kept)
            g.attrs["time_us_every"] = np.int64(2)
    return dst_dir


def linear_in_elapsed(n, c, b):
    """n times (seconds) with y_i = c + b * T_i exactly, T_i the elapsed time when iteration i ended."""
    y, elapsed = np.empty(n), 0.0
    for i in range(n):
        y[i] = (c + b * elapsed) / (1 - b)
        elapsed += y[i]
    return y


def check_synthetic(comm_dir, ddp_dir, comm_group, ddp_group, work):
    n = len(records(os.path.join(comm_dir, "rank00000.h5"))[comm_group][1]["time_us"])
    c = 100e-6
    b = 0.2 / n  # c * (1 + b * n) at the end: about +20% over the run
    drifting = linear_in_elapsed(n, c, b)
    d = rewrite(comm_dir, os.path.join(work, "drift"), comm_group, time_us=lambda old: drifting * 1e6)
    rc, rows, _ = soak([d], work, "drift")
    row = rows[(comm_group, 0)]
    first = np.median(drifting[:n // 10])
    slope = 60 * b / first * 100  # %/min of the first tenth's median
    assert rc == 1 and "time drift" in row["verdict"], f"a +{row['drift_pct']:.1f}% drift was not flagged: {row}"
    assert abs(row["slope_pct_per_min"] / slope - 1) < 0.02, f"slope {row['slope_pct_per_min']}, built as {slope}"
    print(f"synthetic drift {row['drift_pct']:+.1f}%, slope {row['slope_pct_per_min']:.1f} %/min: flagged")

    # Recorded 1 in 2: soak.py's iterations, summed time and tenths count what each time stands for.
    d = thinned(comm_dir, os.path.join(work, "thinned"), comm_group)
    _, rows, _ = soak([d], work, "thinned")
    for rank in (0, 1):
        attrs, arrays = records(os.path.join(d, f"rank{rank:05d}.h5"))[comm_group]
        assert attrs["time_us_every"] == 2
        check_numbers({(comm_group, rank): (attrs, arrays)}, rows, "time_us")
        assert rows[(comm_group, rank)]["iterations"] == 2 * len(arrays["time_us"]), rows[(comm_group, rank)]
    print("synthetic thinned 1 in 2: iterations and summed time doubled")

    flat = {"step_ms": lambda old: np.full(len(old), 10.0) + 0.01 * np.sin(np.arange(len(old))),
            "host_rss_bytes": lambda old: np.full(len(old), old[0])}
    cases = (("clean", {}, None),
             ("device_leak", {"device_live_bytes": lambda old: old + 4096 * np.arange(len(old))},
              "device live bytes grew"),
             ("rss_leak", {"host_rss_bytes": lambda old: old[0] + (np.arange(len(old)) * (32 * MIB / len(old)))},
              "host RSS grew"),
             ("rss_within_bound", {"host_rss_bytes": lambda old: old[0] + (np.arange(len(old)) * (8 * MIB / len(old)))},
              None),
             # 32 MiB more resident, all of it the run's arrays of times re-aimed upwards: no leak.
             ("records_grew", {"host_rss_bytes": lambda old: old[0] + (np.arange(len(old)) * (32 * MIB / len(old))),
                               "records_bytes": lambda old: old[0] + (np.arange(len(old)) * (32 * MIB / len(old)))},
              None))
    for name, changes, words in cases:
        d = rewrite(ddp_dir, os.path.join(work, name), ddp_group, **{**flat, **changes})
        rc, rows, _ = soak([d], work, name)
        verdicts = [r["verdict"] for r in rows.values()]
        if words:
            assert rc == 1 and all(words in v for v in verdicts), f"{name}: not flagged ({words}): {verdicts}"
        else:
            assert rc == 0 and verdicts == ["held", "held"], f"{name}: should hold: {verdicts}"
        print(f"synthetic {name}: {verdicts[0]}")


def main():
    work = scratch_dir("llmhpc-soak-")
    comm_dir, ddp_dir, fixed_dir = (os.path.join(work, n) for n in ("comm", "ddp", "fixed"))
    mpi = mpiexec() + ["-np", "2", BIN, "--device", "cpu"]
    out = run(mpi + ["--mode", "comm", "--size", "64KB", "--inplace", "no", "--duration-s", DURATION,
                     "--out", comm_dir]).stdout
    assert f"timed for ~{DURATION:.0f} s" in out, out
    comm = check_duration_run(comm_dir, "time_us", "iters", 1e-6, per_step=False)
    for attrs, _ in comm.values():
        assert attrs["back_to_back_iters"] == 20, attrs
    run(mpi + ["--mode", "ddp", *MODEL, "--ddp", "bucketed", "--bucket-mb", "0.01", "--warmup", 2,
               "--duration-s", DURATION, "--out", ddp_dir])
    ddp = check_duration_run(ddp_dir, "step_ms", "steps", 1e-3, per_step=True)
    print(f"comm and ddp ran {DURATION} s each: "
          + ", ".join(f"{name} rank {rank}: {len(arrays['memory_iteration'])} memory samples"
                      for (name, rank), (_, arrays) in sorted({**comm, **ddp}.items())))

    # One rank: every all-reduce a no-op of a fraction of a microsecond, millions of them, each
    # registered with the watchdog; its thread must keep up, or they pile up as host memory.
    one_dir = os.path.join(work, "one-rank")
    run(mpiexec() + ["-np", "1", BIN, "--device", "cpu", "--mode", "comm", "--size", "4KB", "--inplace", "yes",
                     "--duration-s", 3, "--out", one_dir])
    for name, (attrs, arrays) in records(os.path.join(one_dir, "rank00000.h5")).items():
        # The resident set less the arrays of times, which grow where the count is re-aimed upwards.
        it, rss = arrays["memory_iteration"], arrays["host_rss_bytes"] - arrays["records_bytes"]
        assert np.all(np.diff(arrays["records_bytes"]) >= 0) and arrays["records_bytes"][-1] >= 8 * len(
            arrays["time_us"]), f"{name}: records_bytes {arrays['records_bytes'][[0, -1]]}"
        k = int(np.searchsorted(it, len(arrays["time_us"]) // 10))
        growth = (rss[k:].max() - rss[k]) / MIB
        # How many ran is the host's speed, written down, not asserted; that they leave no memory
        # behind is the watchdog's keeping up (soak.py's own bound).
        assert growth <= 16, f"{name}: {attrs['iters']} all-reduces on one rank, host RSS grew {growth:.1f} MiB (bound 16)"
        # Past 10 million iterations 1 in time_us_every is recorded, the fewest that fit.
        every, kept = int(attrs["time_us_every"]), len(arrays["time_us"])
        assert kept == -(-attrs["iters"] // every) <= 10_000_000 and (every == 1 or 2 * kept > 10_000_000), \
            f"{name}: {kept} times recorded of {attrs['iters']} iterations, 1 in {every}"
        print(f"one rank: {attrs['iters']} all-reduces (1 in {every} recorded), host RSS +{growth:.2f} MiB")

    run(mpi + ["--mode", "comm", "--size", "4KB", "--inplace", "no", "--steps", 7, "--out", fixed_dir])
    for name, (attrs, arrays) in records(os.path.join(fixed_dir, "rank00001.h5")).items():
        assert attrs["duration_s"] == 0 and attrs["iters"] == 7 and len(arrays["time_us"]) == 7, attrs
        assert list(arrays["memory_iteration"]) == [6], f"{name}: {arrays['memory_iteration']}: one sample at the end"

    _, rows, _ = soak([comm_dir, ddp_dir], work, "real")
    check_numbers(comm, rows, "time_us")
    check_numbers(ddp, rows, "step_ms")
    report = run([sys.executable, REPORT_PY, comm_dir, ddp_dir, fixed_dir, "-o", os.path.join(work, "report.md")])
    assert "## soak" in report.stdout, report.stdout
    soak_part = report.stdout.split("## soak", 1)[1].split("\n## ", 1)[0]  # up to the next section
    assert "allreduce_float_64KB" in soak_part and "allreduce_float_4KB" not in soak_part, soak_part

    comm_group, ddp_group = sorted({n for n, _ in comm})[0], sorted({n for n, _ in ddp})[0]
    check_synthetic(comm_dir, ddp_dir, comm_group, ddp_group, work)
    print("test_soak: OK")


if __name__ == "__main__":
    main()
