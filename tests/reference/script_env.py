"""Small helpers shared by the Python script tests in tests/scripts/ (run by ctest).

ctest gives each script LLMHPC_BIN (the binary), LLMHPC_ROOT (the repository) and MPIEXEC;
a script exits 0 on success, 77 to skip, anything else on failure. No pytest: plain
assertions with messages that say what was expected and what came instead.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile

SKIP = 77
REFERENCE_DIR = os.path.dirname(os.path.abspath(__file__))


def repo_root() -> str:
    return os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(REFERENCE_DIR))


def llmhpc_binary() -> str:
    path = os.environ.get("LLMHPC_BIN") or os.path.join(repo_root(), "build", "llmhpc")
    if not os.access(path, os.X_OK):
        sys.exit(f"FAIL: the llmhpc binary '{path}' does not exist or is not executable (set LLMHPC_BIN)")
    return path


def mpiexec() -> list:
    """mpirun with what it needs to start 2 ranks anywhere (also as root, in CI containers)."""
    return [os.environ.get("MPIEXEC") or "mpirun", "--oversubscribe"]


def test_env() -> dict:
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env


def run(cmd: list, expect_ok: bool = True, timeout: int = 300) -> subprocess.CompletedProcess:
    """Runs `cmd`, echoing it; with expect_ok a non-zero exit fails the test with its output."""
    print("$", " ".join(shlex.quote(str(c)) for c in cmd), flush=True)
    try:
        proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, env=test_env())
    except subprocess.TimeoutExpired:
        sys.exit(f"FAIL: timed out after {timeout} s (a hang?): {' '.join(map(str, cmd))}")
    if expect_ok and proc.returncode != 0:
        sys.exit(f"FAIL: exit code {proc.returncode} from {' '.join(map(str, cmd))}\n"
                 f"--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}")
    return proc


def scratch_dir(prefix: str) -> str:
    """A fresh temporary directory; kept when LLMHPC_KEEP_TMP is set, for debugging."""
    path = tempfile.mkdtemp(prefix=prefix)
    if not os.environ.get("LLMHPC_KEEP_TMP"):
        import atexit
        import shutil
        atexit.register(shutil.rmtree, path, True)
    else:
        print(f"(keeping {path})")
    return path


def rel_err(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-30)


def parse_markdown_tables(text: str) -> list:
    """Every markdown table in `text` as (header cells, rows of cells)."""
    tables, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and set(lines[i + 1]) <= set("|-: "):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows, i = [], i + 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append([c.strip() for c in lines[i].strip("|").split("|")])
                i += 1
            tables.append((header, rows))
        else:
            i += 1
    return tables
