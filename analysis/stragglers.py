#!/usr/bin/env python3
"""Which rank arrived last at each step's collectives, and by how much: the straggler report.

    python3 analysis/stragglers.py results/ddp-1234 [more DIRs]        # one row per record
    python3 analysis/stragglers.py DIR --steps                         # and every step's last rank

Every rank records, for each step of a configuration that issued collectives, the host times of
the step's start and of its first and last collective's issue, on one clock across ranks (rank
0's, through the offset each rank measured at start-up): the arrival_* datasets
(docs/hdf5-schema.md, "Arrivals"; ddp, train, comm and every sweep mode). For each step common
to all ranks, a rank's lateness is how much later than the median of the other ranks it issued
the step's first collective, or its last, whichever is later (a blocking collective holds the
others at the first; an enqueued one lets them run on to the last). The step's last rank is the
latest; the step's time is the median over ranks of the time between their step starts.

A rank is named a straggler when it was the last to arrive in at least half of the steps, more
often than chance would have made one of equally fast ranks (less likely than 1 in 100: with 2
ranks, 7 of 7 steps, or 13 of 15), and its median lateness is at least 5% of the median step: a
rank whose computation is 10% slower than the others' arrives about 10% of that computation
late at every step. Differences smaller
than the clock offsets' uncertainty (clock_offset_uncertainty_s: a few microseconds on one
node where each rank has a core, milliseconds where ranks share cores) mean nothing. On several nodes each rank named is followed by its node's hostname.
report_section(runs, out_dir) gives the "Stragglers" section of
analysis/report.py (empty when no record of several ranks has arrival times). Files are read
only through analysis/llmhpc_h5.py.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import ABORTED, SchemaError, open_run, run_directories  # noqa: E402

LAST_SHARE = 0.5     # last to arrive in at least this share of the steps
LATE_SHARE = 0.05    # median lateness at least this share of the median step
CHANCE = 0.01        # and last that often by chance, among equally fast ranks, less likely than this


def chance_text(p: float) -> str:
    """'0.08', '3e-12', or '< 1e-300' where the tail underflows to 0."""
    return f"{p:.1g}" if p > 0 else "< 1e-300"


def chance_of_last(times: int, steps: int, ranks: int) -> float:
    """How likely one of `ranks` equally fast ranks is last in at least `times` of `steps` steps
    (each step's last rank drawn at random): the binomial tail, P(X >= times), X ~ B(steps, 1/ranks)."""
    p = 1.0 / ranks
    if times <= 0 or p >= 1.0:
        return 1.0
    if steps <= 1000:  # C(steps, j) still a float
        return float(sum(math.comb(steps, j) * p ** j * (1 - p) ** (steps - j) for j in range(times, steps + 1)))
    # A long run (a soak): each term in logarithms, or C(steps, j) overflows a float.
    log_p, log_q, log_n = math.log(p), math.log1p(-p), math.lgamma(steps + 1)
    return min(1.0, sum(math.exp(log_n - math.lgamma(j + 1) - math.lgamma(steps - j + 1) + j * log_p + (steps - j) * log_q)
                        for j in range(times, steps + 1)))



def _arrivals(rec) -> dict | None:
    """{step index: (step, start, first, last)} of one rank's record, or None without arrivals."""
    if "arrival_index" not in rec.arrays:
        return None
    a = rec.arrays
    return {int(i): (int(s), float(t0), float(f), float(la)) for i, s, t0, f, la in
            zip(a["arrival_index"], a["arrival_step"], a["arrival_start_s"], a["arrival_first_s"], a["arrival_last_s"])}


def record_steps(recs: list) -> list:
    """Per step common to the records `recs` (one per rank) that have arrival times: dict(index, step,
    last_rank, late_s, step_s, lateness) where lateness[rank] is that rank's lateness in seconds; none
    where fewer than two have them."""
    by_rank = {rec.rank: a for rec in recs if (a := _arrivals(rec)) is not None}
    if len(by_rank) < 2:
        return []
    ranks = sorted(by_rank)
    common = sorted(set.intersection(*(set(v) for v in by_rank.values())))
    steps = []
    for k, i in enumerate(common):
        first = np.array([by_rank[r][i][2] for r in ranks])
        last = np.array([by_rank[r][i][3] for r in ranks])
        lateness = {}
        for j, r in enumerate(ranks):
            others = np.delete(np.arange(len(ranks)), j)
            lateness[r] = max(first[j] - np.median(first[others]), last[j] - np.median(last[others]))
        nxt = common[k + 1] if k + 1 < len(common) and common[k + 1] == i + 1 else None
        step_s = float(np.median([by_rank[r][nxt][1] - by_rank[r][i][1] for r in ranks])) if nxt is not None else np.nan
        latest = max(ranks, key=lambda r: lateness[r])
        steps.append(dict(index=i, step=by_rank[ranks[0]][i][0], last_rank=latest, late_s=lateness[latest],
                          step_s=step_s, lateness=lateness))
    return steps


def summarize(run) -> list:
    """One dict per record of several ranks with arrival times: record, ranks (those with them),
    without (the ranks whose record has none: one ended before it wrote them, as the rank a hang
    stopped), steps, the rank last most often, its share of steps, its median lateness (s), the
    median step (s), the stragglers ([(rank, median lateness s, share last, chance of that share)])
    and the clock uncertainty (s)."""
    uncertainty = max(float(rf.attrs.get("clock_offset_uncertainty_s", 0.0)) for rf in run.files)
    groups = {}
    for rec in run.records(rank=None):
        if rec.ok or rec.status.startswith(("interrupted", ABORTED)):
            groups.setdefault(rec.path, []).append(rec)
    out = []
    for path, recs in groups.items():
        steps = record_steps(recs)
        if not steps:
            continue
        ranks = sorted(steps[0]["lateness"])
        median_step = float(np.nanmedian([s["step_s"] for s in steps])) if any(
            not np.isnan(s["step_s"]) for s in steps) else np.nan
        share = {r: sum(s["last_rank"] == r for s in steps) / len(steps) for r in ranks}
        late = {r: float(np.median([s["lateness"][r] for s in steps])) for r in ranks}
        most = max(ranks, key=lambda r: (share[r], late[r]))
        def late_enough(r):  # the rule's lateness, beside its share of the steps
            return not np.isnan(median_step) and late[r] >= LATE_SHARE * median_step and late[r] > 2 * uncertainty

        named = []
        for r in ranks:
            if not (share[r] >= LAST_SHARE and late_enough(r)):
                continue
            # The chance last: a soak's binomial tail sums thousands of terms, so only for the
            # ranks (two at most) last in half the steps or more.
            chance = chance_of_last(round(share[r] * len(steps)), len(steps), len(ranks))
            if chance < CHANCE:
                named.append((r, late[r], share[r], chance))
        # Also where the rank last most often is late enough but not named: how near chance its
        # share is says whether a longer run would tell (12 of 15 steps: 0.02).
        most_chance = chance_of_last(round(share[most] * len(steps)), len(steps), len(ranks)) \
            if share[most] >= LAST_SHARE and late_enough(most) else np.nan
        without = sorted(r.rank for r in recs if r.rank not in ranks)
        out.append(dict(record=path, ranks=len(ranks), without=without, steps=len(steps), most_last=most, share=share[most],
                        chance=most_chance, late_s=late[most], step_s=median_step, stragglers=named,
                        uncertainty_s=uncertainty, per_step=steps))
    return out


def _ms(seconds: float) -> str:
    return "-" if seconds is None or np.isnan(seconds) else f"{seconds * 1e3:.3f}"


def _pct(part: float, whole: float) -> str:
    return "-" if np.isnan(whole) or whole <= 0 else f"{100 * part / whole:.1f}%"


def node_of(run):
    """rank -> ' (its host)' where the run spans several nodes, '' on one: on a cluster the node
    is what a user looks at next (its network, its GPUs, its neighbours' jobs)."""
    nodes = run.nodes()
    host = {r: h for h, ranks in nodes for r in ranks}
    return (lambda r: f" ({host[r]})" if r in host else "") if len(nodes) > 1 else (lambda r: "")


def report_section(runs: list, out_dir: str = ".", steps: bool = False, every: bool = True) -> str:
    """The Stragglers section: the verdict (the ranks named, or none), then one row per record,
    and with steps=True every step's last rank. every=False (report.py) keeps only the rows worth
    reading, the records with a straggler or a rank late by the rule's share, and counts the rest.
    Empty when no record of several ranks has arrival times."""
    rows, named, per_step, quiet = [], [], [], 0
    for run in runs:
        where = node_of(run)
        for s in summarize(run):
            names = ", ".join(f"rank {r}{where(r)}" for r, _, _, _ in s["stragglers"]) or "none"
            # Within twice the clocks' uncertainty a lateness says nothing of who came last.
            blurred = s["late_s"] <= 2 * s["uncertainty_s"]
            blur = "; within the clocks' uncertainty" if blurred else ""
            chance = "" if np.isnan(s["chance"]) else f"; by chance: {chance_text(s['chance'])}"
            late = not blurred and s["late_s"] >= LATE_SHARE * s["step_s"]
            # A rank without arrival times (a hang's stopped rank) is not among those compared.
            without = s["without"]
            counted = f"{s['ranks']}" + (f" (rank{'s' if len(without) > 1 else ''} {', '.join(map(str, without))} "
                                         f"kept no arrival times)" if without else "")
            if every or s["stragglers"] or late or without:
                rows.append(f"| `{run.directory}` | {s['record']} | {counted} | {s['steps']} | rank {s['most_last']}"
                            f"{where(s['most_last'])} ({100 * s['share']:.0f}% of steps{chance}) | {_ms(s['late_s'])} "
                            f"({_pct(s['late_s'], s['step_s'])}{blur}) | {_ms(s['step_s'])} | "
                            f"{s['uncertainty_s'] * 1e6:.1f} | {names} |")
            else:
                quiet += 1
            for r, late_s, share, p in s["stragglers"]:
                named.append(f"- **rank {r}**{where(r)} in `{run.directory}` {s['record']}: last to arrive in "
                             f"{100 * share:.0f}% of {s['steps']} steps (by chance: {chance_text(p)}), a median "
                             f"{_ms(late_s)} ms late ({_pct(late_s, s['step_s'])} of the median step)"
                             + (f", among the {s['ranks']} ranks with arrival times" if without else ""))
            if steps:
                per_step += [f"| {s['record']} | {p['index']} | {p['step']} | rank {p['last_rank']}{where(p['last_rank'])} "
                             f"| {_ms(p['late_s'])} |"
                             for p in s["per_step"]]
    if not rows and not quiet:
        return ""
    on_cpu = any(str(run.files[0].attrs.get("device_name", "")).startswith("cpu") for run in runs)
    text = [f"Stragglers: {len(named)} named." if named else
            "Stragglers: none (no rank was consistently late; where the rank last most often shows a chance, "
            f"it was late enough and only its share fell short, and a longer run tells: the rule asks "
            f"below {CHANCE:g})."] + named
    if on_cpu:
        text += ["", "On CPUs whose ranks share cores, lateness comes in the scheduler's time slices (a few ms), "
                 "which can make any rank last."]
    text += ["", "Per step, the rank that issued the step's collectives last and how much later than the median "
             "of the others (the first or the last collective, whichever is later); a straggler is last in at "
             f"least {100 * LAST_SHARE:.0f}% of the steps, more often than one of equally fast ranks would be "
             f"with a chance of {CHANCE:g} (binomial), a median of at least {100 * LATE_SHARE:.0f}% of the "
             "step late, and more than twice the uncertainty of the clocks' offsets (analysis/stragglers.py)."]
    if rows:
        text += ["", "| run | record | ranks | steps | last most often | its median lateness ms (of the step) | "
                 "median step ms | clock uncertainty us | stragglers |",
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"] + rows
    if quiet:
        text += ["", f"{quiet} {'other ' if rows else ''}record{'s' if quiet != 1 else ''} of several ranks: no rank "
                 f"late by {100 * LATE_SHARE:.0f}% of the step or more beyond the clocks' uncertainty "
                 "(`python3 analysis/stragglers.py DIR` lists every record)."]
    if per_step:
        text += ["", "| record | step index | step | last rank | late ms |", "| --- | --- | --- | --- | --- |"] + per_step
    return "\n".join(text)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dirs", nargs="+", metavar="DIR", help="run directory (llmhpc --out)")
    parser.add_argument("--steps", action="store_true", help="also list every step's last rank")
    args = parser.parse_args(argv)
    try:
        runs = [open_run(d) for d in run_directories(*args.dirs)]
    except SchemaError as e:
        print(f"stragglers.py: error: {e}", file=sys.stderr)
        return 2
    text = report_section(runs, steps=args.steps)
    print(text or "no record of several ranks with arrival times (arrival_* datasets)")
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `stragglers.py DIR --steps | head` ends quietly
    sys.exit(main())
