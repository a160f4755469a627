"""Where a script writes: its output folder made and tried before any work, so that a folder
that cannot take the files ends the script with one line, not a traceback after the work."""
from __future__ import annotations

import os
import tempfile


def unwritable(folder: str) -> str | None:
    """Makes `folder` where it is missing and writes a scratch file there; why that failed, or None.
    Trying says what os.access cannot (root on a read-only mount or /proc)."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as e:
        return f"cannot create {folder}: {e.strerror or e}"
    try:
        tempfile.TemporaryFile(dir=folder).close()
    except OSError as e:
        return f"{folder} is not writable ({e.strerror or e})"
    return None


if __name__ == "__main__":  # a module the scripts import, not a script
    import sys
    print("analysis/outputs.py is a module of analysis/, imported by its scripts (python3 analysis/report.py DIR... makes "
          "the report)", file=sys.stderr)
    sys.exit(2)
