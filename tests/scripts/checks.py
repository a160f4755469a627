"""What the end-to-end scripts' inline Python checks share (imported, not a test itself):
named checks that print ok/FAIL and are tallied, and a checkpoint's datasets by path.

    python3 - "$(dirname "$0")" <<'PY'
    import sys; sys.path.insert(0, sys.argv[1])
    from checks import check, datasets, finish
    check(a == b, "what a == b means")
    finish()        # exit 1 if any check failed
    PY
"""
import sys

import h5py

failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def datasets(path):
    """Every dataset of an HDF5 file (a checkpoint: params/..., optimizer/...) by its path, read whole."""
    out = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, d: out.__setitem__(name, d[()]) if isinstance(d, h5py.Dataset) else None)
    return out


def finish():
    sys.exit(1 if failures else 0)
