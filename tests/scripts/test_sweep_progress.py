"""The steps of a sweep's configuration while they run (src/modes/sweep.h, SweepSteps), end to end
on the CPU: modes bench, attention, profile, ddp, comm and precision, each one configuration far
longer than the test (a million steps of a tiny shape; comm 100 s; precision billions of additions).

With --progress-s 0.2 rank 0 prints "  <seconds> s: <done> of <total> <what>" while it runs: the
total its warm-up and timed steps (profile: untraced and traced; precision: the additions), the
count rising. Then SIGINT (as Ctrl-C sends it) ends the run by the signal (a shell says 130), and the record of the
configuration keeps the steps it measured: status "interrupted: SIGINT" (the root "interrupted:
SIGINT while measuring <it>"), its time arrays of steps_timed elements, at least as many as the
last progress line had counted, of steps_asked, the warm-up's whole. Precision keeps its sums after
additions_done additions, which a run of that many additions gives bitwise. Under mpirun -np 2
SIGINT to mpirun reaches the ranks as SIGTERM, a second before Open MPI kills them: both rank
files keep their steps. Killed outright (SIGKILL) with --flush-s 0.5, bench, ddp and train keep
the steps of their last rewrite: a record "running" that the readers take as interrupted. Without
--progress-s a configuration shorter than 10 s prints no line.
"""
import os
import re
import signal
import subprocess
import sys
import time

import h5py
import numpy as np

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from script_env import llmhpc_binary, mpiexec, run, scratch_dir, test_env  # noqa: E402

BIN = llmhpc_binary()
TINY = ["--d-model", "16", "--d-ff", "32", "--num-layers", "1", "--num-heads", "2", "--vocab-size", "64",
        "--context-length", "8", "--batch-size", "2"]
STEPS = 1000000
WARMUP = 2
ADDITIONS = 10**12
PART = 1 << 24  # the additions of one part of the precision experiment (src/modes/precision.cpp)
LINE = re.compile(r"^  ([0-9.]+) s: ([0-9]+) of ([0-9]+) ([a-z]+)$")


def interrupted_run(cmd, lines=3, timeout=60, copies=1, sig=signal.SIGINT):
    """Starts `cmd`, sends `sig` once rank 0 has printed `lines` progress lines (`copies` times,
    20 ms apart: one stop delivered more than once); returns (exit status, stdout, stderr, the
    progress lines as (seconds, done, total, what))."""
    print("$", " ".join(map(str, cmd)), flush=True)
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=test_env())
    out, seen, deadline = [], [], time.monotonic() + timeout  # stderr: a few lines, read at the end
    while len(seen) < lines:
        line = proc.stdout.readline()
        if not line or time.monotonic() > deadline:
            proc.kill()
            rest, err = proc.communicate()
            sys.exit(f"FAIL: {len(seen)} progress lines before the run ended or {timeout} s passed:\n{''.join(out)}"
                     f"{rest}{err}")
        out.append(line)
        if m := LINE.match(line.rstrip("\n")):
            seen.append((float(m[1]), int(m[2]), int(m[3]), m[4]))
    for k in range(copies):
        if k:
            time.sleep(0.02)
        proc.send_signal(sig)
    try:
        rest, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        sys.exit(f"FAIL: still running 30 s after {signal.Signals(sig).name}: {' '.join(map(str, cmd))}")
    stdout = "".join(out) + rest
    print(stdout, err, sep="\n")
    for m in map(LINE.match, rest.splitlines()):
        if m:
            seen.append((float(m[1]), int(m[2]), int(m[3]), m[4]))
    return proc.returncode, stdout, err, seen


def check_lines(seen, total, what):
    assert all(t == total and w == what for _, _, t, w in seen), f"not '... of {total} {what}': {seen}"
    done = [d for _, d, _, _ in seen]
    seconds = [s for s, _, _, _ in seen]
    assert all(b > a for a, b in zip(done, done[1:])) and done[0] > 0, f"the counts do not rise: {done}"
    assert all(b > a for a, b in zip(seconds, seconds[1:])), f"the times do not rise: {seconds}"
    return done[-1]


def interrupted_record(path, kind, sig):
    """The one record of `kind` in the rank file at `path`, which `sig` interrupted: (attrs, arrays)."""
    with h5py.File(path, "r") as f:
        root = f.attrs["status"]
        (name, g), = f[kind].items()
        assert root == f"interrupted: {sig} while measuring {kind}/{name}", f"{path}: root status {root!r}"
        attrs = dict(g.attrs)
        arrays = {k: g[k][()] for k in g}
    assert attrs["status"] == f"interrupted: {sig}", f"{path} {kind}/{name}: status {attrs['status']!r}"
    return attrs, arrays


def check_steps(where, attrs, arrays, timed, warmup_names, asked, printed, counted=("step_ms",)):
    """The arrays of the timed steps (`timed`: of one length within each kind, traced_ or not; the
    `counted` ones together steps_timed) and of the warm-up (`WARMUP` each) as kept; at least the
    `printed` steps the last progress line counted."""
    lengths = {k: len(arrays[k]) for k in list(timed) + list(warmup_names) if k in arrays}
    assert set(lengths) == set(timed) | set(warmup_names), f"{where}: arrays {sorted(arrays)}"
    assert all(lengths[k] == WARMUP for k in warmup_names), f"{where}: warm-up arrays {lengths}"
    for traced in (False, True):
        assert len({n for k, n in lengths.items() if k in timed and k.startswith("traced_") == traced}) <= 1, \
            f"{where}: timed arrays of one kind with different lengths {lengths}"
    assert attrs["steps_asked"] == asked, f"{where}: steps_asked {attrs['steps_asked']}, not {asked}"
    kept = attrs["steps_timed"]
    assert sum(lengths[k] for k in counted) == kept, f"{where}: {lengths} against steps_timed {kept}"
    assert printed - WARMUP <= kept < asked, f"{where}: {kept} steps kept, the last progress line counted {printed}"
    values = np.concatenate([arrays[k] for k in lengths])
    assert np.all(values > 0) and np.all(np.isfinite(values)), f"{where}: times {values[:8]}..."


def main():
    work = scratch_dir("llmhpc-sweep-progress-")
    fast = ["--progress-s", "0.2"]

    out = os.path.join(work, "bench")
    rc, _, err, seen = interrupted_run([BIN, "--mode", "bench", "--device", "cpu", *TINY, "--warmup", WARMUP,
                                        "--steps", STEPS, *fast, "--out", out])
    assert rc == -signal.SIGINT, f"bench: exit {rc} after SIGINT, not the signal's\n{err}"
    assert "SIGINT ends this run" in err, f"bench: rank 0's notice is not on stderr:\n{err}"
    printed = check_lines(seen, WARMUP + STEPS, "steps")
    attrs, arrays = interrupted_record(os.path.join(out, "rank00000.h5"), "bench", "SIGINT")
    check_steps("bench", attrs, arrays, ["forward_ms", "backward_ms", "step_ms"],
                ["warmup_forward_ms", "warmup_backward_ms", "warmup_step_ms"], STEPS, printed)
    print(f"ok   bench: {len(seen)} progress lines, {attrs['steps_timed']} steps kept")

    out = os.path.join(work, "attention")
    rc, _, err, seen = interrupted_run([BIN, "--mode", "attention", "--device", "cpu", "--batch-size", "1",
                                        "--num-heads", "1", "--head-dim", "8", "--context-length", "16",
                                        "--attention", "flash", "--warmup", WARMUP, "--steps", STEPS, *fast,
                                        "--out", out])
    assert rc == -signal.SIGINT, f"attention: exit {rc} after SIGINT, not the signal's\n{err}"
    printed = check_lines(seen, WARMUP + STEPS, "iterations")
    attrs, arrays = interrupted_record(os.path.join(out, "rank00000.h5"), "attention", "SIGINT")
    check_steps("attention", attrs, arrays, ["forward_ms", "backward_ms", "total_ms"],
                ["warmup_forward_ms", "warmup_backward_ms", "warmup_total_ms"], STEPS, printed, counted=("total_ms",))
    print(f"ok   attention: {len(seen)} progress lines, {attrs['steps_timed']} iterations kept")

    # profile: untraced steps first (half of them), then traced; a million of each.
    out = os.path.join(work, "profile")
    rc, _, err, seen = interrupted_run([BIN, "--mode", "profile", "--device", "cpu", *TINY, "--warmup", WARMUP,
                                        "--steps", STEPS, *fast, "--out", out])
    assert rc == -signal.SIGINT, f"profile: exit {rc} after SIGINT, not the signal's\n{err}"
    printed = check_lines(seen, WARMUP + 2 * STEPS, "steps")
    attrs, arrays = interrupted_record(os.path.join(out, "rank00000.h5"), "profile", "SIGINT")
    timed = ["forward_ms", "backward_ms", "optimizer_ms", "step_ms"]
    check_steps("profile", attrs, arrays, timed + ["traced_forward_ms", "traced_step_ms"],
                ["warmup_" + k for k in timed], 2 * STEPS, printed, counted=("step_ms", "traced_step_ms"))
    print(f"ok   profile: {len(seen)} progress lines, {attrs['steps_timed']} steps kept")

    # The same stop delivered twice (GNU timeout passes a signal to its command and to its process
    # group): the second SIGINT, 20 ms after the first and inside a step of ~50 ms, does not cut
    # the keeping short.
    out = os.path.join(work, "bench-twice")
    slow = ["--d-model", "128", "--d-ff", "256", "--num-layers", "2", "--num-heads", "2", "--vocab-size", "256",
            "--context-length", "64", "--batch-size", "8"]
    rc, _, err, seen = interrupted_run([BIN, "--mode", "bench", "--device", "cpu", *slow, "--warmup", WARMUP,
                                        "--steps", STEPS, *fast, "--out", out], copies=2)
    assert rc == -signal.SIGINT, f"bench, SIGINT twice: exit {rc}, not the signal's\n{err}"
    attrs, arrays = interrupted_record(os.path.join(out, "rank00000.h5"), "bench", "SIGINT")
    check_steps("bench, SIGINT twice", attrs, arrays, ["forward_ms", "backward_ms", "step_ms"],
                ["warmup_forward_ms", "warmup_backward_ms", "warmup_step_ms"], STEPS, check_lines(seen, WARMUP + STEPS,
                                                                                                "steps"))
    print(f"ok   bench, SIGINT twice within 20 ms: {attrs['steps_timed']} steps kept")

    # ddp: the timed steps counted (the warm-up before them), each with its memory sample.
    out = os.path.join(work, "ddp")
    rc, _, err, seen = interrupted_run([BIN, "--mode", "ddp", "--device", "cpu", *TINY, "--ddp", "bucketed",
                                        "--warmup", WARMUP, "--steps", STEPS // 10, *fast, "--out", out])
    assert rc == -signal.SIGINT, f"ddp: exit {rc} after SIGINT, not the signal's\n{err}"
    printed = check_lines(seen, STEPS // 10, "steps")
    attrs, arrays = interrupted_record(os.path.join(out, "rank00000.h5"), "ddp", "SIGINT")
    timed = ["forward_ms", "backward_ms", "comm_ms", "param_comm_ms", "optimizer_ms", "step_ms"]
    check_steps("ddp", attrs, arrays, timed, ["warmup_" + k for k in timed], STEPS // 10, printed + WARMUP)
    print(f"ok   ddp: {len(seen)} progress lines, {attrs['steps_timed']} steps kept")

    # comm --duration-s: iterations in chunks of about a second, the total re-aimed after each;
    # the iterations of the chunks done kept, with their bandwidths.
    out = os.path.join(work, "comm")
    comm = [BIN, "--mode", "comm", "--device", "cpu", "--backend", "mpi", "--size", "1MB", "--warmup", WARMUP,
            "--duration-s", 100]
    rc, _, err, seen = interrupted_run([*comm, *fast, "--out", out])
    assert rc == -signal.SIGINT, f"comm: exit {rc} after SIGINT, not the signal's\n{err}"
    attrs, arrays = interrupted_record(os.path.join(out, "rank00000.h5"), "comm", "SIGINT")
    kept = int(attrs["steps_timed"])
    lengths = {k: len(arrays[k]) for k in ("time_us", "algbw", "busbw")}
    assert set(lengths.values()) == {kept} and len(arrays["warmup_time_us"]) == WARMUP, f"comm: {lengths}, {attrs}"
    assert seen[-1][1] <= kept < attrs["steps_asked"] and seen[-1][3] == "iterations", \
        f"comm: {kept} iterations kept of {attrs['steps_asked']}, the last progress line {seen[-1]}"
    assert np.all(arrays["time_us"] > 0) and np.allclose(arrays["algbw"], 1e6 / arrays["time_us"] / 1e3), \
        f"comm: times {arrays['time_us'][:4]}, algbw {arrays['algbw'][:4]}"
    print(f"ok   comm --duration-s: {len(seen)} progress lines, {kept} iterations kept")

    # precision: the accumulation experiment in parts of 2^24 additions, the sums after each kept.
    out = os.path.join(work, "precision")
    precision = [BIN, "--mode", "precision", "--device", "cpu", "--model", "tiny"]
    rc, _, err, seen = interrupted_run([*precision, "--additions", ADDITIONS, *fast, "--out", out], lines=2)
    assert rc == -signal.SIGINT, f"precision: exit {rc} after SIGINT, not the signal's\n{err}"
    printed = check_lines(seen, ADDITIONS, "additions")
    with h5py.File(os.path.join(out, "rank00000.h5"), "r") as f:
        assert f.attrs["status"] == "interrupted: SIGINT while measuring precision/accumulation", f.attrs["status"]
        g = f["precision/accumulation"]
        assert g.attrs["status"] == "interrupted: SIGINT", g.attrs["status"]
        done, kept = int(g.attrs["additions_done"]), g["sum"][()]
    assert done % PART == 0 and printed <= done < ADDITIONS, f"precision: {done} additions kept, {printed} printed"
    whole = os.path.join(work, "precision-whole")
    run([*precision, "--additions", done, "--out", whole])
    with h5py.File(os.path.join(whole, "rank00000.h5"), "r") as f:
        assert np.array_equal(f["precision/accumulation/sum"][()], kept), \
            f"precision: the sums kept after {done} additions {kept}, a run of {done}: {f['precision/accumulation/sum'][()]}"
    print(f"ok   precision: {len(seen)} progress lines, the sums of {done} additions kept")

    # Under mpirun: Ctrl-C to mpirun reaches the ranks as SIGTERM; each rank keeps its own steps.
    out = os.path.join(work, "bench-np2")
    rc, _, err, seen = interrupted_run([*mpiexec(), "-np", "2", BIN, "--mode", "bench", "--device", "cpu", *TINY,
                                        "--warmup", WARMUP, "--steps", STEPS, *fast, "--out", out])
    assert rc != 0, "mpirun exit 0 after SIGINT"
    printed = check_lines(seen, WARMUP + STEPS, "steps")
    for rank in (0, 1):
        attrs, arrays = interrupted_record(os.path.join(out, f"rank{rank:05d}.h5"), "bench", "SIGTERM")
        check_steps(f"bench rank {rank}", attrs, arrays, ["forward_ms", "backward_ms", "step_ms"],
                    ["warmup_forward_ms", "warmup_backward_ms", "warmup_step_ms"], STEPS,
                    printed if rank == 0 else WARMUP)
    print(f"ok   bench -np 2: {len(seen)} progress lines from rank 0, both ranks kept their steps")

    # Killed with no time to clean up (SIGKILL): every --flush-s the record was rewritten with the
    # steps so far, on a thread of its own, so the file keeps them, status "running", which the
    # readers take as interrupted (analysis/llmhpc_h5.py).
    for mode, timed, extra in (("bench", ["forward_ms", "backward_ms", "step_ms"], []),
                               ("ddp", ["forward_ms", "backward_ms", "comm_ms", "param_comm_ms", "optimizer_ms",
                                        "step_ms"], ["--ddp", "bucketed"])):
        out = os.path.join(work, f"{mode}-killed")
        rc, _, err, seen = interrupted_run([BIN, "--mode", mode, "--device", "cpu", *TINY, *extra, "--warmup", WARMUP,
                                            "--steps", STEPS, *fast, "--flush-s", "0.5", "--out", out], lines=10,
                                           sig=signal.SIGKILL)
        assert rc == -signal.SIGKILL, f"{mode}: exit {rc} after SIGKILL"
        printed = check_lines(seen, (WARMUP if mode == "bench" else 0) + STEPS, "steps")
        with h5py.File(os.path.join(out, "rank00000.h5"), "r") as f:
            (name, g), = f[mode].items()
            attrs, arrays = dict(g.attrs), {k: g[k][()] for k in g}
        assert attrs["status"] == "running", f"{mode}: status {attrs['status']!r}"
        lengths = {k: len(arrays[k]) for k in timed}
        kept = int(attrs["steps_timed"])
        # Rewritten every 0.5 s over the 2 s of progress lines: at least a few, none past the last line.
        assert attrs["steps_asked"] == STEPS and set(lengths.values()) == {kept}, f"{mode}: {lengths}, {attrs}"
        assert 0 < kept <= printed, f"{mode}: {kept} steps kept, the last progress line counted {printed}"
        sys.path.insert(0, os.path.join(ROOT, "analysis"))
        import llmhpc_h5
        (rec,) = llmhpc_h5.open_run(out).records(mode, 0)
        assert rec.status == "interrupted" and len(rec.arrays["step_ms"]) == kept, f"{mode}: read as {rec.status}"
        print(f"ok   {mode} killed (SIGKILL) with --flush-s 0.5: {kept} of the {printed} steps printed kept, "
              "read as interrupted")

    # Train's snapshot every --flush-s, the same way.
    out = os.path.join(work, "train-killed")
    tokens = os.path.join(work, "tokens.bin")
    np.random.default_rng(0).integers(0, 64, 100000, dtype=np.uint16).tofile(tokens)
    cmd = [BIN, "--mode", "train", "--device", "cpu", "--data", tokens, *TINY, "--steps", STEPS, "--log-every", 1000,
           "--flush-s", "0.5", "--out", out]
    print("$", " ".join(map(str, cmd)), flush=True)
    proc = subprocess.Popen([str(c) for c in cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=test_env())
    logged = []  # the run's description, then "step  1000/1000000  loss ...", every 1000 steps
    while len(logged) < 200 and not logged[-1:] == [""] and not re.match(r"step +3000/", logged[-1] if logged else ""):
        logged.append(proc.stdout.readline())
    time.sleep(1.5)  # three rewrites or more after step 3000
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    with h5py.File(os.path.join(out, "rank00000.h5"), "r") as f:
        status, losses = f["train"].attrs["status"], len(f["train/loss"])
    assert status == "running" and losses >= 1000, f"train killed: status {status!r}, {losses} losses kept\n" + \
        "".join(logged)
    print(f"ok   train killed (SIGKILL) with --flush-s 0.5: {losses} steps' losses kept")

    # The default (10 s): nothing for a configuration of a second.
    proc = run([BIN, "--mode", "bench", "--device", "cpu", *TINY, "--warmup", WARMUP, "--steps", 200, "--out",
                os.path.join(work, "short")])
    lines = [line for line in proc.stdout.splitlines() if LINE.match(line)]
    assert not lines, f"progress lines for a short configuration: {lines}"
    print("ok   no progress line for a short configuration")


if __name__ == "__main__":
    main()
