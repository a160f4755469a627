#!/usr/bin/env python3
"""One markdown report, with its plots beside it, from any llmhpc results folders.

    python3 analysis/report.py results/ddp_bucketed-1234                # -> results/ddp_bucketed-1234/report.md
    python3 analysis/report.py results/bench-* results/comm-* -o study/report.md
    python3 analysis/report.py DIR --rank 1 | --all-ranks                # which rank's samples (bench, train)

Each DIR is a run directory (llmhpc --out: rank00000.h5, ...) or a folder holding run
directories at any depth (a job's results folder). The runs are grouped by their mode and
each mode gets the section its module writes: analysis/<mode>.py with a function
report_section(runs, out_dir) -> markdown, which draws its PNGs into out_dir (the report's
folder). A new mode needs only its module: bench (benchmark tables by warm-up and context, fp32
against bf16, peak memory), attention, comm (the reference communication study's table, bandwidth plots), ddp
(strategies, bucket sweep and model, sharding, strong/weak scaling), train, and whatever
analysis/<mode>.py exists; runs timed with --duration-s (comm, ddp) also get analysis/soak.py's
section (time drift and memory growth), and records whose GPU slowed its clock while measured
analysis/device_clocks.py's (the clocks, the slowdown reasons, power and temperature), and runs of
several ranks analysis/stragglers.py's (the rank last to arrive at each step's collectives, and the
ranks consistently late); ddp runs on the nccl backend analysis/timeline.py's (where each configuration's
collectives ran beside the compute stream's phases, and a plot of its last steps); runs the watchdog ended, a Hangs section (what each rank's watchdog found:
the stuck collective, the ranks that had and had not issued it, with their hosts; a rank whose watchdog
fired late, stopped, marked, and the run's line taken from an on-time report). The report is written to --output (default DIR/report.md of the
first DIR) and printed. Files are read only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import importlib.util
import inspect
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import SchemaError, open_run, rank_list, run_directories  # noqa: E402
from outputs import unwritable  # noqa: E402
import bench  # noqa: E402
import device_clocks  # noqa: E402
import soak  # noqa: E402
import stragglers  # noqa: E402
import timeline  # noqa: E402

ANALYSIS_DIR = os.path.dirname(os.path.abspath(__file__))
MODE_ORDER = ("bench", "attention", "comm", "ddp", "train")  # the reference reports' order; other modes follow by name


# Modes whose analysis module has another name: analysis/profile.py would shadow Python's own
# profile module (which torch.compile imports) for every script run from analysis/.
SECTION_MODULES = {"profile": "kernel_profile"}


def section_function(mode: str):
    """report_section of analysis/<mode>.py (SECTION_MODULES names the exceptions), or None when
    there is no such module or function."""
    path = os.path.join(ANALYSIS_DIR, f"{SECTION_MODULES.get(mode, mode)}.py")
    if not os.path.isfile(path) or mode in ("report", "llmhpc_h5"):
        return None
    spec = importlib.util.spec_from_file_location(f"llmhpc_section_{mode}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, "report_section", None)


def call_section(function, runs: list, out_dir: str, options: dict) -> str:
    """function(runs, out_dir), plus those of `options` it takes: rank (None: every rank pooled),
    decimals, all_runs (the runs of every mode in the report, e.g. ddp's all-reduce runs)."""
    accepted = inspect.signature(function).parameters
    return function(runs, out_dir, **{k: v for k, v in options.items() if k in accepted})


def hang_summary(h: dict, fired: dict) -> str:
    """'collective #34 not reached by rank 1 on node1; no answer from ...' from a Run.hang_reports() entry;
    fired: every rank's own report, by rank."""
    c = f"collective #{h['collective']}"
    if h.get("group"):  # a collective of some ranks: the ones of them it waits for are the ones to look at
        waits = f"rank(s) {h['waited_for']}" if h.get("waited_for") else "none (every rank of it issued it)"
        c += f" among ranks {h['group']} waits for {waits};"
    parts = [f"{c} not reached by rank(s) {h['not_reached']} on {h['not_reached_hosts']}"
             if h["not_reached"] else f"{c} reached by every rank that answered"]
    if h["no_answer"]:
        parts.append(f"no answer from rank(s) {no_answer_cell(h, fired)}")
    if h.get("mismatched"):
        parts.append(f"rank(s) {h['mismatched']} issued it as another collective: the ranks' calls no longer match")
    return "; ".join(parts)


STOPPED = "no reply within"  # a watchdog's reason for a rank that accepted the connection and never answered


def no_answer_cell(h: dict, fired: dict) -> str:
    """'3 (node2)', and what the ranks among them whose own watchdog fired say. Where each names the
    other as not answering, the two were cut off from each other (a network partition), unless this
    rank found the other stopped (it accepted the connection and never answered: woken as the job
    ended, a stopped process fires late and finds this rank gone), which was held up, not cut off;
    where the other does not name this rank, it was aborting the job when this rank asked (a
    waiting rank, not one to look at). Where this rank's own watchdog fired late (late_s: stopped
    or starved), the others had reported and ended, and the cell says so; a rank among them whose
    report is late is named as the rank to look at."""
    if fired_late(h):  # this rank was the one held up: the others had reported and ended
        return (f"{h['no_answer']} ({h['no_answer_hosts']}); this rank's watchdog fired {h['late_s']:.1f} s late "
                "(stopped or starved): they had reported and ended meanwhile")
    theirs = [r for r in rank_list(h["no_answer"]) if r in fired]
    late = [r for r in theirs if fired_late(fired[r])]
    theirs = [r for r in theirs if r not in late]
    named_us = [r for r in theirs if h["rank"] in rank_list(fired[r]["no_answer"])]
    stopped = STOPPED in h["report"]
    notes = [f"rank(s) {','.join(map(str, ranks))} {text}" for ranks, text in (
        (late, "fired late, its watchdog not run for seconds: stopped or starved, the rank to look at"),
        ([] if stopped else named_us, "could not reach this rank either: cut off from each other"),
        (named_us if stopped else [], "fired after this rank had ended: held up (stopped or slow), not cut off"),
        ([r for r in theirs if r not in named_us], "had fired too: aborting, not stopped")) if ranks]
    return "; ".join([f"{h['no_answer']} ({h['no_answer_hosts']})"] + notes)


def fired_late(h: dict) -> bool:
    """Whether a Run.hang_reports() entry's watchdog fired late (stopped or starved: its report came
    after the others had reported and ended)."""
    return h.get("late_s", 0) > 0


def noted(h: dict) -> bool:
    """Whether a Run.hang_reports() entry is a rank's note of another rank's watchdog (it had not issued
    the stuck collective and was inside none: the rank that held the others up), not its own firing."""
    return h.get("fired_on", h["rank"]) != h["rank"]


def leading_report(hangs: list) -> dict:
    """The report that speaks for the run: the first of a rank whose own watchdog fired on time (a
    late one, from a stopped rank, was made after the others had ended)."""
    return next((h for h in hangs if not fired_late(h) and not noted(h)),
                next((h for h in hangs if not noted(h)), hangs[0]))


def describe(run) -> str:
    a = run.attrs
    stopped = sorted({rf.status for rf in run.files if rf.status.startswith("interrupted")})
    hangs = run.hang_reports()
    lead = leading_report(hangs) if hangs else None
    state = ("" if run.finished else
             f" (ABORTED by the watchdog of rank {lead['fired_on']}: "
             f"{hang_summary(lead, {h['rank']: h for h in hangs if not noted(h)})})" if hangs else
             f" (INTERRUPTED: {stopped[0][len('interrupted: '):]})" if stopped
             else " (INCOMPLETE: a rank's file says the run did not finish)")
    settings = ", ".join(str(a.get("environment_variables", "")).split("\n")).strip(", ")
    settings = f"; launch settings {settings}" if settings else ""
    return (f"`{run.directory}`: llmhpc {a['mode']} on {a['device_name']} ({a['hostname']}), {run.describe_ranks()}, "
            f"backend {a['backend']}; git {a['git_sha']}; started {a['start_time']}{settings}{state}")


def stuck_collective(what: str) -> str:
    """'collective #30 allreduce (mpi, 4000 bytes) ...' from the watchdog's status sentence, without
    its 'no progress within --comm-timeout 3.0 s: ' (the section's introduction says it); from a
    noting rank's ('rank 0's, on node0, found no progress in collective #30 ...; this rank had not
    issued it (...)'), the collective and where this rank was."""
    if what.startswith("no progress within") and ": " in what:
        return what.split(": ", 1)[1]
    found = re.match(r"rank \d+'s, on [^,]*, found no progress in (.*?); this rank had not issued it \((.*)\)$", what)
    return f"{found.group(1)}; this rank: {found.group(2)}" if found else what


def hang_section(runs: list) -> str:
    """Runs the watchdog ended: what each rank's watchdog found, as its rank file keeps it."""
    rows = []
    for run in runs:
        hangs = run.hang_reports()
        fired = {h["rank"]: h for h in hangs if not noted(h)}
        rows += [[f"`{run.directory}`", f"{h['rank']} ({h['host']})" + (", fired late" if fired_late(h) else "") +
                  (f", had not issued it: rank {h['fired_on']}'s watchdog fired" if noted(h) else ""),
                  stuck_collective(h["what"]), h["reached"] or "-",
                  f"{h['not_reached']} ({h['not_reached_hosts']})" if h["not_reached"] else "-",
                  no_answer_cell(h, fired) if h["no_answer"] else "-", h.get("mismatched") or "-"] for h in hangs]
    if not rows:
        return ""
    return ("The watchdog ended these runs: no progress within --comm-timeout. Each rank whose watchdog fired "
            "asked every other rank how far it got and kept the answers in its file (ranks with their hosts; "
            "a rank that never issued the collective is the one to look at; one that gave no answer was "
            "stopped or unreachable; one that issued it as another collective took another path through the "
            "run; a row marked fired late is a rank whose watchdog went seconds without running, stopped or "
            "starved: its report came after the others had ended, and it is the rank to look at; a row "
            "marked had not issued it is that rank's own account, kept when the firing ranks asked it).\n\n"
            + bench.markdown_table(["run", "rank (host)", "stuck collective", "reached", "not reached (hosts)",
                                    "no answer (hosts)", "issued differently"], rows))


def build_report(dirs: list, out_dir: str, options: dict, table_only: bool = False) -> str:
    runs = [open_run(d) for d in run_directories(*dirs)]
    by_mode = {}
    for run in runs:
        by_mode.setdefault(run.mode, []).append(run)
    modes = sorted(by_mode, key=lambda m: (MODE_ORDER.index(m) if m in MODE_ORDER else len(MODE_ORDER), m))
    sections = []  # (title, body)
    for mode in modes:
        function = section_function(mode)
        if function is None:
            body = f"no analysis/{mode}.py with report_section(runs, out_dir): runs listed above only"
        else:
            body = call_section(function, by_mode[mode], out_dir, dict(options, all_runs=runs))
        sections.append((mode, body))
    soaks = [run for run in runs if soak.is_soak(run)]
    if soaks:
        sections.append(("soak", soak.report_section(soaks, out_dir)))
    sections += [(title, body) for title, body in (("device clocks", device_clocks.report_section(runs, out_dir)),
                                                   ("Hangs", hang_section(runs)),
                                                   ("Stragglers", stragglers.report_section(runs, out_dir, every=False)),
                                                   ("Step timeline", timeline.report_section(runs, out_dir))) if body]
    if table_only:
        return "\n\n".join(body for _, body in sections) + "\n"
    # The sections as links (GitHub's and most viewers' heading anchors): a long report's study is
    # one click away from the top.
    parts = ["# llmhpc report", "\n".join(f"- {describe(run)}" for run in runs)]
    if len(sections) > 1:
        links = [f"[{title}](#{title.lower().replace(' ', '-')})" for title, _ in sections]
        if any("\n### Scaling study: in short\n" in f"\n{body}" for _, body in sections):  # a scaling job's answer
            links.insert(0, "[scaling study, in short](#scaling-study-in-short)")
        parts.append("Sections: " + " · ".join(links))
    parts += [f"## {title}\n\n{body}" for title, body in sections]
    return "\n\n".join(parts) + "\n"


def decimals(text: str) -> int:
    """--decimals: a whole number from 0 (argparse's type)."""
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"'{text}': give a whole number of decimals, 0 or more")
    return int(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directory (llmhpc --out) or a folder of them")
    parser.add_argument("-o", "--output", help="the markdown file; its PNGs go beside it (default: DIR/report.md)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0, help="report this rank's samples (default 0)")
    which.add_argument("--all-ranks", action="store_true", help="pool the samples of every rank")
    parser.add_argument("--decimals", type=decimals, default=2, help="decimals of the benchmark times (default 2)")
    parser.add_argument("--table-only", action="store_true", help="the sections only, without the title and runs")
    args = parser.parse_args(argv)

    if args.output is not None and (not args.output or os.path.isdir(args.output) or args.output.endswith(os.sep)):
        what = "is a folder" if args.output else "names no file"
        print(f"report.py: error: -o '{args.output}' {what}: give the markdown file to write (e.g. "
              f"{os.path.join(args.output or 'study', 'report.md')}); its plots go beside it", file=sys.stderr)
        return 2
    missing = [d for d in args.dirs if not os.path.isdir(d)]
    if missing:
        what = "not a folder" if os.path.exists(missing[0]) else "no such folder"
        print(f"report.py: error: {missing[0]}: {what} (give llmhpc --out folders, or folders holding them)",
              file=sys.stderr)
        return 2
    # Absolute, so that the report names its runs the same from any working directory.
    args.dirs = [os.path.abspath(d) for d in args.dirs]
    output = args.output or os.path.join(args.dirs[0], "report.md")
    out_dir = os.path.dirname(os.path.abspath(output))
    options = dict(rank=None if args.all_ranks else args.rank, decimals=args.decimals)
    created = not os.path.isdir(out_dir)
    why = unwritable(out_dir)  # -o reports/new/report.md: the folder is made for it, before any work
    if why:
        print(f"report.py: error: {why}: write the report elsewhere with -o FILE.md (its plots go beside it)",
              file=sys.stderr)
        return 2
    try:
        text = build_report(args.dirs, out_dir, options, args.table_only)  # all built first: no half-written file
    except SchemaError as e:
        print(f"report.py: error: {e}", file=sys.stderr)
        if created and not os.listdir(out_dir):
            os.rmdir(out_dir)  # nothing left behind by a failed report
        return 2
    with open(output + ".tmp", "w") as f:
        f.write(text)
    os.replace(output + ".tmp", output)
    print(text)
    print(f"report.py: wrote {output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
