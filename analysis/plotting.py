"""Helpers shared by the report's plots (bench, attention, comm, ddp): ticks where the sweep
measured, log axes labelled 2, 5, 20 rather than 2x10^0, and one legend above many panels."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")  # files only: no display on cluster nodes
import matplotlib.ticker  # noqa: E402


def ticks_at(ax, values, labels=None) -> None:
    """x ticks at the measured values (a sweep rarely spans the decades a log axis labels)."""
    values = sorted(set(values))
    ax.set_xticks(values, labels or [str(v) for v in values])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def legend_above(fig, axes, fontsize=None) -> None:
    """One legend for every panel, in a row above them (inside a panel it hides what it names):
    each label once, from whichever panel has it; then lays the figure out below it."""
    handles, names = [], []
    for ax in getattr(axes, "flat", axes):
        for handle, name in zip(*ax.get_legend_handles_labels()):
            if name not in names:
                handles.append(handle)
                names.append(name)
    fig.legend(handles, names, loc="upper center", ncol=len(names), fontsize=fontsize, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.4 / fig.get_figheight()))


def plain_log_y(ax) -> None:
    """Plain numbers on a log y axis, as many labelled ticks as its span leaves room for: every
    tick within 3x, 1-2-5 within 30x, the decades beyond."""
    def label(y, _):
        if y <= 0:
            return ""
        low, high = ax.get_ylim()  # at drawing time: the limits may still change after this call
        keep = None if high / low < 3 else (1, 2, 5) if high / low < 30 else (1,)
        mantissa = round(y / 10 ** math.floor(math.log10(y)), 6)
        return f"{y:g}" if keep is None or mantissa in keep else ""
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(label))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.FuncFormatter(label))


if __name__ == "__main__":  # a module the scripts import, not a script
    import sys
    print("analysis/plotting.py is a module of analysis/, imported by its scripts (python3 analysis/report.py DIR... makes "
          "the report)", file=sys.stderr)
    sys.exit(2)
