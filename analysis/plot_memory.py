#!/usr/bin/env python3
"""The active-memory timeline of each configuration of an `llmhpc --mode memory` run as a PNG
(stacked by category, phases marked, the peak drawn), and the peaks table.

    python3 analysis/plot_memory.py DIR              # PNGs into DIR, the table on stdout
    python3 analysis/plot_memory.py DIR --out PLOTS  # PNGs into PLOTS
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import memory  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir", help="result directory of llmhpc --mode memory")
    p.add_argument("--out", help="directory for the PNGs (default: DIR)")
    a = p.parse_args()
    try:
        cs = memory.configs([a.dir])
        if not cs:
            raise memory.SchemaError(f"no memory records in {a.dir} (was it a --mode memory run?)")
        paths = memory.plot_timelines(cs, a.out or a.dir)
    except memory.SchemaError as e:
        print(f"plot_memory.py: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        print(f"plot_memory.py: --out {a.out or a.dir}: {e.strerror or e}", file=sys.stderr)
        return 2
    for path in paths:
        print(path)
    print()
    print(memory.phase_table(cs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
