#!/usr/bin/env python3
"""The table of one or more comm runs (llmhpc --mode comm) as markdown, like nccl-tests prints it.

    python3 analysis/comm.py results/comm-20261122-103000 [more run directories ...] \
        [--nccl-tests all_reduce_perf.txt ...]

One row per run, collective, dtype and size; out-of-place and in-place side by side. As in
the binary's own summary: time is nccl-tests' time, the mean per operation of `back_to_back_iters`
operations issued back to back (time_us_back_to_back) averaged over ranks (files written
before that dataset existed: the mean of the slowest rank's per-iteration times), algbw = bytes / time,
busbw = algbw * bus_factor (nccl-tests' definitions, GB/s = 1e9 B/s), #wrong the sum over
ranks of wrong elements (N/A without --check); after those, per placement, the median and sample
std (n-1) of the per-iteration times (time_us) of the slowest rank (time_us_max_over_ranks: an
iteration ends when every rank is done), the spread the back-to-back mean hides. A configuration
cut short (a signal, a kill after a --flush-s write) counts the iterations every rank kept, its
status column saying how many; it ran neither the back-to-back loop nor the check, so its time is
the mean of the slowest rank's per-iteration times and #wrong is '-'. report_section
(analysis/report.py) adds the reference communication study's layout (backend, device, procs,
size, mean, median, std, bandwidth) and a plot of bus bandwidth against message size per rank
count. --nccl-tests adds llmhpc's bus bandwidth beside nccl-tests' from its printed output, per
collective, rank count, dtype and size both measured. Files are read through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import markdown_table  # noqa: E402
from llmhpc_h5 import SchemaError, on_cpu, open_run, pooled_status, run_directories, slowest_of_ranks  # noqa: E402
from plotting import ticks_at  # noqa: E402

PLACEMENTS = (("outofplace", "oop"), ("inplace", "ip"))
COLLECTIVES = ("allreduce", "reducescatter", "allgather", "broadcast")  # the order llmhpc runs them in


def human_bytes(n: int) -> str:
    """A size as llmhpc's --sizes wrote it (src/core/units.cpp format_size): the largest unit that divides it."""
    for scale, unit in ((1 << 40, "TiB"), (10**12, "TB"), (1 << 30, "GiB"), (10**9, "GB"), (1 << 20, "MiB"),
                        (10**6, "MB"), (1 << 10, "KiB"), (10**3, "KB")):
        if n >= scale and n % scale == 0:
            return f"{n // scale}{unit}"
    return f"{n}B"


def format_us(us: float) -> str:
    """nccl-tests' time format: fewer decimals for longer times."""
    return f"{us:.0f}" if us >= 10000 else f"{us:.1f}" if us >= 100 else f"{us:.2f}"


def iteration_times_us(records: list) -> np.ndarray:
    """The slowest rank's time of each timed iteration (time_us_max_over_ranks) from every rank's
    record of a configuration (Record.measured); from their time_us where the records lack it
    (files from before it, and records cut short, each rank with its own count: the iterations
    every rank kept)."""
    if "time_us_max_over_ranks" in records[0].arrays:
        return np.asarray(records[0].arrays["time_us_max_over_ranks"], dtype=float)
    return slowest_of_ranks([r.arrays["time_us"] for r in records])


def operation_time_us(records: list) -> float:
    """nccl-tests' time of one operation from every rank's record of a configuration
    (Record.measured): the back-to-back mean averaged over ranks, or for records without it (files
    from before it, records cut short) the mean of the slowest rank's per-iteration times."""
    if all("time_us_back_to_back" in r.arrays for r in records):
        return float(np.mean([r.arrays["time_us_back_to_back"][0] for r in records]))
    return float(iteration_times_us(records).mean())


def summarize(records: list) -> dict:
    """One configuration from every rank's record of it: time per operation, the per-iteration
    times' median and std, bandwidths, #wrong, status. One cut short (a signal, a kill after a
    --flush-s write) counts the iterations every rank kept, its status says how many, and it was
    not checked (#wrong '-'); one that did not run has its status in place of the time."""
    first = records[0]
    status = pooled_status(records)
    if not all(r.measured for r in records):
        return dict(time=status, median="-", std="-", algbw="-", busbw="-", wrong="-", busbw_value=None, status=status)
    time_us = operation_time_us(records)
    each = iteration_times_us(records)
    algbw = first.attrs["bytes"] / (time_us * 1e3)
    busbw = algbw * first.attrs["bus_factor"]
    wrongs = [int(r.arrays["wrong"][0]) for r in records if "wrong" in r.arrays]
    wrong = "-" if len(wrongs) < len(records) else "N/A" if any(w < 0 for w in wrongs) else str(sum(wrongs))
    return dict(time=format_us(time_us), median=format_us(float(np.median(each))),
                std=format_us(float(each.std(ddof=1)) if len(each) > 1 else 0.0), algbw=f"{algbw:.2f}",
                busbw=f"{busbw:.2f}", wrong=wrong, busbw_value=busbw, status=status)


def comm_rows(run) -> list:
    """One dict per collective, dtype and size of a run, with both placements' results."""
    if run.mode != "comm":
        raise SchemaError(f"{run.directory}: a '{run.mode}' run, not a comm run")
    rows = {}
    for records in run.records_by_name("comm", rank=None).values():
        a = records[0].attrs
        key = (a["collective"], a["dtype"], a["requested_bytes"])
        row = rows.setdefault(key, dict(backend=a["backend"], ranks=run.world_size, collective=a["collective"],
                                         size=a["bytes"], count=a["count"], type=a["dtype"], redop=a["redop"],
                                         root=a["root"]))
        for placement, short in PLACEMENTS:
            if a["placement"] == placement:
                for k, v in summarize(records).items():
                    row[f"{short} {k}"] = v
    # The files list groups alphabetically; the table follows the binary's order.
    order = lambda key: (COLLECTIVES.index(key[0]) if key[0] in COLLECTIVES else len(COLLECTIVES), key[1], key[2])
    return [rows[key] for key in sorted(rows, key=order)]


def markdown(rows: list) -> str:
    present = [short for _, short in PLACEMENTS if any(f"{short} time" in r for r in rows)]
    columns = [("backend", "backend"), ("ranks", "ranks"), ("collective", "collective"), ("size", "size (B)"),
               ("count", "count"), ("type", "type"), ("redop", "redop"), ("root", "root")]
    for short in present:
        columns += [(f"{short} time", f"{short} time (us)"), (f"{short} algbw", f"{short} algbw (GB/s)"),
                    (f"{short} busbw", f"{short} busbw (GB/s)"), (f"{short} wrong", f"{short} #wrong")]
    for short in present:  # after nccl-tests' columns, which keep their places
        columns += [(f"{short} median", f"{short} median (us)"), (f"{short} std", f"{short} std (us)")]
    # A status column where a configuration was cut short with its iterations (one that did not
    # run has its status in place of the time).
    for short in present:
        if any(r.get(f"{short} status", "ok") != "ok" and r.get(f"{short} busbw_value") is not None for r in rows):
            columns.append((f"{short} status", f"{short} status"))
    text = lambda key: key in ("backend", "collective", "type", "redop") or key.endswith(" status")  # noqa: E731
    lines = ["| " + " | ".join(title for _, title in columns) + " |",
             "|" + "|".join("---" if text(key) else "---:" for key, _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(key, "-")) for key, _ in columns) + " |")
    return "\n".join(lines)


MB = 1e6  # the reference communication study's table is in decimal megabytes; busbw and algbw in GB = 1e9 bytes


def study_rows(run) -> list:
    """The reference communication study's table (distributed_communication_single_node) for one comm run: one row per
    collective, dtype, size and placement with statistics of the per-iteration time of the
    slowest rank (time_us_max_over_ranks: an iteration ends when every rank is done),
    bw = bytes / mean time (algbw), busbw = bw x bus_factor."""
    if run.mode != "comm":
        raise SchemaError(f"{run.directory}: a '{run.mode}' run, not a comm run")
    device = "cpu" if on_cpu(run.attrs) else "cuda"
    rows = []
    for records in run.records_by_name("comm", rank=None).values():
        a = records[0].attrs
        row = dict(backend=a["backend"], device=device, procs=a["world_size"], collective=a["collective"],
                   dtype=a["dtype"], placement=a["placement"], bytes=a["bytes"],
                   status=pooled_status(records), measured=all(r.measured for r in records))
        if row["measured"]:
            t = iteration_times_us(records) / 1e3  # ms
            bw = a["bytes"] / (t.mean() * 1e-3) / 1e9
            row.update(mean=t.mean(), median=float(np.median(t)), std=t.std(ddof=1) if len(t) > 1 else 0.0, bw=bw,
                       busbw=bw * a["bus_factor"], n=len(t))
        rows.append(row)
    return rows


def number(x: float) -> str:
    """Three decimals as in the reference table, four significant digits below 0.1 (microsecond times on CPUs)."""
    return f"{x:.3f}" if abs(x) >= 0.1 or x == 0 else f"{x:.4g}"


def study_markdown(rows: list) -> str:
    order = lambda r: (r["backend"], r["collective"], r["dtype"], r["placement"] != "outofplace", r["procs"], r["bytes"])
    header = ["backend", "device", "procs", "collective", "dtype", "placement", "size (MB)", "mean (ms)",
              "median (ms)", "std (ms)", "bw (GB/s)", "busbw (GB/s)", "status"]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" if h in ("backend", "device", "collective",
                                                                           "dtype", "placement", "status") else "---:"
                                                             for h in header) + "|"]
    for r in sorted(rows, key=order):
        nums = [number(r[k]) for k in ("mean", "median", "std", "bw", "busbw")] if r["measured"] else ["-"] * 5
        lines.append("| " + " | ".join([r["backend"], r["device"], str(r["procs"]), r["collective"], r["dtype"],
                                        r["placement"], f"{r['bytes'] / MB:g}", *nums, r["status"]]) + " |")
    return "\n".join(lines)


def timings_to_doubt(rows: list) -> list:
    """Lines naming each measured size (study_rows' rows) whose median time is more than twice a
    larger size's of the same collective, dtype, placement and ranks: on a quiet host a smaller
    message never takes longer, so such a time measured something else (ranks sharing a core
    and spinning, a loaded host)."""
    series = {}
    for r in rows:
        if r["measured"]:
            key = (r["backend"], r["device"], r["procs"], r["collective"], r["dtype"], r["placement"])
            series.setdefault(key, []).append(r)
    lines = []
    for (backend, _, procs, collective, dtype, placement), mine in sorted(series.items()):
        for r in mine:
            faster = [b for b in mine if b["bytes"] > r["bytes"] and 2 * b["median"] < r["median"]]
            if faster:
                b = min(faster, key=lambda b: b["median"])
                lines.append(f"- {backend} {collective} {dtype} {placement} on {procs} ranks: "
                             f"{human_bytes(int(r['bytes']))} took a median {number(r['median'])} ms, more than "
                             f"twice the {number(b['median'])} ms of {human_bytes(int(b['bytes']))}")
    return lines


def plot_bandwidth(rows: list, path: str) -> str:
    """Bus bandwidth against message size, one line per rank count; one panel per backend and
    collective (out-of-place; in-place where only it ran)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ok = [r for r in rows if r["measured"]]
    panels = sorted({(r["backend"], r["device"], r["collective"]) for r in ok})
    if not panels:
        return ""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4), squeeze=False)
    for ax, (backend, device, collective) in zip(axes[0], panels):
        mine = [r for r in ok if (r["backend"], r["device"], r["collective"]) == (backend, device, collective)]
        placement = "outofplace" if any(r["placement"] == "outofplace" for r in mine) else "inplace"
        for procs in sorted({r["procs"] for r in mine}):
            pts = sorted((r["bytes"], r["busbw"]) for r in mine if r["procs"] == procs and r["placement"] == placement
                         and r["dtype"] == mine[0]["dtype"])
            ax.plot([p[0] / MB for p in pts], [p[1] for p in pts], "o-", label=f"{procs} ranks")
        ax.set(xscale="log", xlabel="message size", ylabel="bus bandwidth (GB/s)",
               title=f"{collective}, {backend} on {device} ({placement})")
        sizes = sorted({r["bytes"] for r in mine})  # ticks at the sizes measured, named as they were asked for
        ticks_at(ax, [b / MB for b in sizes], [human_bytes(b) for b in sizes])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report_section(runs: list, out_dir: str) -> str:
    """report.py's comm section: the reference communication study's table of every run,
    nccl-tests' table, comm_busbw.png."""
    rows = [r for run in runs for r in study_rows(run)]
    nccl_rows = [r for run in runs for r in comm_rows(run)]
    parts = ["### All-reduce and friends (the reference communication study's layout; time: per iteration, "
             "the slowest rank's; bw = size / mean time; busbw = bw x bus factor)\n\n" + study_markdown(rows),
             "### As nccl-tests prints it (time: back-to-back mean per operation, averaged over ranks; median and "
             "std: of the slowest rank's per-iteration times)\n\n"
             + markdown(nccl_rows)]
    doubts = timings_to_doubt(rows)
    if doubts:
        parts.append("**Timings to doubt.** A smaller message took longer than a larger one, which on a quiet "
                     "host it does not: the time measured something else, such as ranks sharing a core (more "
                     "ranks than cores, waiting ranks spinning: Open MPI's OMPI_MCA_mpi_yield_when_idle=1 has "
                     "them yield) or a loaded host. Predictions fitted from these sizes inherit it.\n\n"
                     + "\n".join(doubts))
    if plot_bandwidth(rows, os.path.join(out_dir, "comm_busbw.png")):
        parts.append("![bus bandwidth vs message size](comm_busbw.png)")
    return "\n\n".join(parts)


NCCL_TESTS_BINARIES = {"all_reduce_perf": "allreduce", "reduce_scatter_perf": "reducescatter",
                       "all_gather_perf": "allgather", "broadcast_perf": "broadcast"}


def nccl_tests_rows(text: str) -> list:
    """nccl-tests' results as its *_perf binaries print them (the '#  Rank' lines kept: they count
    the ranks): one dict per collective, size, dtype and placement with `ranks`, `collective` (llmhpc's
    name), `bytes`, `dtype`, `placement`, `time_us` and `busbw` (GB/s), as its columns say."""
    rows, collective, ranks = [], None, 0
    for line in text.splitlines():
        if line.startswith("# Collective test starting:"):
            name = os.path.basename(line.split(":", 1)[1].strip())
            collective, ranks = NCCL_TESTS_BINARIES.get(name.split("_perf")[0] + "_perf"), 0
        elif line.startswith("#  Rank"):
            ranks += 1
        elif collective and not line.startswith("#"):
            parts = line.split()
            if len(parts) < 13 or not (parts[0].isdigit() and parts[1].isdigit()):
                continue  # a warning, an error: not a row of the table
            for placement, at in (("outofplace", 5), ("inplace", 9)):  # time, algbw, busbw, #wrong
                rows.append(dict(ranks=ranks, collective=collective, bytes=int(parts[0]), dtype=parts[2],
                                 placement=placement, time_us=float(parts[at]), busbw=float(parts[at + 2])))
    return rows


def against_nccl_tests(rows: list, theirs: list) -> str:
    """llmhpc's bus bandwidth (comm_rows of its NCCL runs) beside nccl-tests' (nccl_tests_rows) for
    every collective, rank count, dtype and size both measured: the mean over each tool's runs of
    it (repetitions), out of place / in place, and llmhpc's over nccl-tests'."""
    def pooled(items):  # {(collective, ranks, dtype, bytes): {placement: [busbw]}}
        out = {}
        for collective, ranks, dtype, size, placement, busbw in items:
            out.setdefault((collective, ranks, dtype, size), {}).setdefault(placement, []).append(busbw)
        return out
    ours = pooled((r["collective"], r["ranks"], r["type"], r["size"], placement, r[f"{short} busbw_value"])
                  for r in rows if r["backend"] == "nccl" for placement, short in PLACEMENTS
                  if r.get(f"{short} busbw_value") is not None)
    nccl = pooled((r["collective"], r["ranks"], r["dtype"], r["bytes"], r["placement"], r["busbw"]) for r in theirs)
    cells = []
    for key in sorted(set(ours) & set(nccl), key=lambda k: (COLLECTIVES.index(k[0]), k[1], k[2], k[3])):
        mine = {p: np.mean(v) for p, v in ours[key].items()}
        its = {p: np.mean(v) for p, v in nccl[key].items()}
        both = [p for p, _ in PLACEMENTS if p in mine and p in its]
        pair = lambda f: " / ".join(f(p) for p in both)
        cells.append([key[0], key[1], key[2], human_bytes(key[3]), pair(lambda p: f"{its[p]:.2f}"),
                      pair(lambda p: f"{mine[p]:.2f}"), pair(lambda p: f"{100 * mine[p] / its[p]:.1f}%"),
                      f"{len(nccl[key][both[0]])} / {len(ours[key][both[0]])}"])
    if not cells:
        return "No collective, rank count, dtype and size measured by both llmhpc (nccl) and nccl-tests."
    return markdown_table(["collective", "ranks", "type", "size", "nccl-tests busbw, oop / ip (GB/s)",
                           "llmhpc busbw, oop / ip (GB/s)", "llmhpc / nccl-tests", "runs (nccl-tests / llmhpc)"], cells)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", help="--out directories of llmhpc --mode comm runs")
    parser.add_argument("--nccl-tests", action="append", default=[], metavar="FILE",
                        help="a file of nccl-tests' output (its *_perf binaries, '#  Rank' lines kept): adds a "
                             "table of llmhpc's bus bandwidth against it; give it once per file")
    args = parser.parse_args()
    rows = []
    for directory in run_directories(*args.runs, mode="comm"):
        try:
            run = open_run(directory)
            rows += comm_rows(run)
        except SchemaError as e:
            print(f"comm.py: {e}", file=sys.stderr)
            return 2
        print(f"<!-- {directory}: {run.attrs['device_name']} on {run.attrs['hostname']}, {run.describe_ranks()}, "
              f"{run.attrs['start_time']}, git {run.attrs['git_sha']} -->")
    print(markdown(rows))
    if args.nccl_tests:
        theirs = []
        for path in args.nccl_tests:
            try:
                with open(path, errors="replace") as f:  # a binary file given by mistake has no results
                    found = nccl_tests_rows(f.read())
            except OSError as e:
                print(f"comm.py: --nccl-tests {path}: {e.strerror}", file=sys.stderr)
                return 2
            if not found:
                print(f"comm.py: --nccl-tests {path}: no nccl-tests results in it (the output of all_reduce_perf, "
                      "reduce_scatter_perf, all_gather_perf or broadcast_perf)", file=sys.stderr)
                return 2
            theirs += found
        print("\n### llmhpc against nccl-tests (bus bandwidth, mean over the runs)\n")
        print(against_nccl_tests(rows, theirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
