"""bench (and profile and memory): a configuration that does not fit is recorded as status
"oom", what it held is freed, and the sweep goes on, under mpirun -np 2; the allocator never
exceeds --memory-limit; report.py shows the row. One beyond the host's memory is an oom too. A
sweep none of whose configurations fit exits 3, as a train run whose step does not fit does: on 2
ranks, one message from rank 0, no abort, every rank's record oom."""
import os
import subprocess
import sys
import tempfile

import h5py
import numpy as np

BIN, MPIEXEC, ROOT = os.environ["LLMHPC_BIN"], os.environ.get("MPIEXEC", "mpirun"), os.environ["LLMHPC_ROOT"]
LIMIT = 64 * 1000 * 1000  # 64MB: context 2048 needs ~270MB of attention probabilities per layer

with tempfile.TemporaryDirectory() as work:
    out = os.path.join(work, "run")
    cmd = [MPIEXEC, "--oversubscribe", "-np", "2", BIN, "--mode", "bench", "--device", "cpu",
           "--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "4",
           "--context-length", "16,2048,32", "--warmup", "0", "--steps", "2", "--memory-limit", "64MB", "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    print(proc.stdout)
    assert proc.returncode == 0, f"bench failed ({proc.returncode}): {proc.stderr}"
    for rank in (0, 1):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            assert f.attrs["status"] == "complete", f.attrs["status"]
            status = {name: g.attrs["status"] for name, g in f["bench"].items()}
            t = {int(g.attrs["context_length"]): g for g in f["bench"].values()}
            assert sorted(t) == [16, 32, 2048], status
            assert t[16].attrs["status"] == "ok" and t[32].attrs["status"] == "ok", status
            assert t[2048].attrs["status"] == "oom", status
            assert "forward_ms" not in t[2048], "an oom configuration must not hold timings"
            assert "exceeds the limit" in t[2048].attrs["error"], t[2048].attrs["error"]
            assert len(t[32]["step_ms"]) == 2, "the configuration after the oom must run"
            for g in t.values():
                assert 0 < g.attrs["peak_memory_bytes"] <= LIMIT, g.attrs["peak_memory_bytes"]
    report = subprocess.run([sys.executable, os.path.join(ROOT, "analysis", "report.py"), out],
                            capture_output=True, text=True, check=True).stdout
    print(report)
    assert any("oom" in line and "2048" in line for line in report.splitlines()), "report lacks the oom row"

    # profile and memory too: the oom is recorded, what it held is freed before the next
    # configuration (the sweep says so on stderr where it is not), and the next one runs.
    for mode, extra in (("profile", ["--steps", "2"]), ("memory", ["--phase", "train-step"])):
        out = os.path.join(work, mode)
        cmd = [MPIEXEC, "--oversubscribe", "-np", "2", BIN, "--mode", mode, "--device", "cpu",
               "--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "4",
               "--context-length", "16,2048,32", "--warmup", "0", *extra, "--memory-limit", "64MB", "--out", out]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{mode} failed ({proc.returncode}): {proc.stderr}"
        assert "still held" not in proc.stderr, f"{mode}: the oom's memory was not freed:\n{proc.stderr}"
        for rank in (0, 1):
            with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
                t = {int(g.attrs["context_length"]): g for g in f[mode].values()}
                status = {T: g.attrs["status"] for T, g in t.items()}
                assert status == {16: "ok", 2048: "oom", 32: "ok"}, f"{mode} rank {rank}: {status}"
                oom = t[2048].attrs
                # Freed: nothing more held than before it (profile may also free then what the
                # configuration before it left: 10 MB before, 0 after).
                assert oom["live_bytes_after_recovery"] <= oom["live_bytes_before"], \
                    f"{mode} rank {rank}: {oom['live_bytes_after_recovery']} bytes live after the oom, " \
                    f"{oom['live_bytes_before']} before"

    # comm: a size whose buffers do not fit is an oom record, with the live bytes every sweep's
    # failed configuration carries, and the next size runs.
    out = os.path.join(work, "comm")
    cmd = [MPIEXEC, "--oversubscribe", "-np", "2", BIN, "--mode", "comm", "--device", "cpu", "--collective",
           "allreduce", "--size", "4KB,4MB,8KB", "--inplace", "no", "--warmup", "0", "--steps", "2",
           "--memory-limit", "1MB", "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"comm failed ({proc.returncode}): {proc.stderr}"
    for rank in (0, 1):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            t = {int(g.attrs["requested_bytes"]): g.attrs for g in f["comm"].values()}
            status = {size: a["status"] for size, a in t.items()}
            assert status == {4000: "ok", 4000000: "oom", 8000: "ok"}, f"comm rank {rank}: {status}"
            oom = t[4000000]
            assert 0 <= oom["live_bytes_after_recovery"] <= oom["live_bytes_before"], dict(oom)

    # A size beyond the host's memory (no --memory-limit): std::bad_alloc is an oom record too,
    # not a crash, and the next configuration runs.
    out = os.path.join(work, "huge")
    cmd = [MPIEXEC, "--oversubscribe", "-np", "2", BIN, "--mode", "bench", "--device", "cpu",
           "--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "4",
           "--context-length", "99999999999,16", "--warmup", "0", "--steps", "2", "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"bench with a huge context failed ({proc.returncode}): {proc.stderr}"
    for rank in (0, 1):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            status = {int(g.attrs["context_length"]): g.attrs["status"] for g in f["bench"].values()}
            assert status == {99999999999: "oom", 16: "ok"}, f"rank {rank}: {status}"

    # train: a step that does not fit ends the run with an oom record that says why; the
    # steps done before it are kept (none here: the first step runs out).
    tokens = os.path.join(work, "tokens.bin")
    np.random.default_rng(0).integers(0, 64, 20000, dtype=np.uint16).tofile(tokens)
    out = os.path.join(work, "train")
    cmd = [MPIEXEC, "--oversubscribe", "-np", "2", BIN, "--mode", "train", "--device", "cpu", "--data", tokens,
           "--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "4", "--vocab-size", "64",
           "--context-length", "1024", "--batch-size", "4", "--steps", "2", "--memory-limit", "8MB", "--out", out]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, f"train out of memory: exit {proc.returncode}, not 3:\n{proc.stdout}"
    # The ranks agree on it at the step's loss reduction: every rank records its oom, rank 0 alone
    # says it, and no rank aborts the job.
    for rank in (0, 1):
        with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
            g = f["train"]
            assert g.attrs["status"] == "oom", f"train rank {rank}: {g.attrs['status']}"
            assert "exceeds the limit" in g.attrs["error"], f"train rank {rank}: {g.attrs.get('error')}"
            assert f.attrs["status"].startswith("error: out of memory: "), f.attrs["status"]
    errors = [l for l in proc.stderr.splitlines() if "llmhpc: error" in l]
    assert len(errors) == 1 and errors[0].startswith("llmhpc: error: out of memory: every rank ran out; rank 0: ") and \
        "a step fits with a smaller --batch-size" in errors[0] and "MPI_ABORT" not in proc.stderr, \
        f"train out of memory: not one message from rank 0 saying what would fit:\n{proc.stderr}"
    # One rank: nothing waits for it, so the job ends as a plain error (exit code 3), not an abort.
    out = os.path.join(work, "train1")
    proc = subprocess.run([BIN] + cmd[cmd.index("--mode"):-1] + [out], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 3, f"one-rank train out of memory: exit {proc.returncode}, not 3:\n{proc.stderr}"
    lines = [l for l in proc.stderr.splitlines() if l.strip()]
    assert len(lines) == 1 and lines[0].startswith("llmhpc: error: out of memory: ") and "--memory-limit" in lines[0], \
        f"one-rank train out of memory: not one line that says so:\n{proc.stderr}"
    assert "--shard-optimizer" not in lines[0], f"one rank has no model state to share:\n{proc.stderr}"
    with h5py.File(os.path.join(out, "rank00000.h5"), "r") as f:
        assert f["train"].attrs["status"] == "oom" and "exceeds the limit" in f.attrs["status"], \
            (f["train"].attrs["status"], f.attrs["status"])
    # The model itself does not fit: exit 3 as well (out of memory, not bad input), on every rank,
    # and no folder left behind.
    for launch in ([], [MPIEXEC, "--oversubscribe", "-np", "2"]):
        out = os.path.join(work, f"train_build{len(launch)}")
        args = cmd[cmd.index("--mode"):-1] + [out]
        args[args.index("--memory-limit") + 1] = "50KB"
        proc = subprocess.run(launch + [BIN] + args, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 3 and "out of memory: " in proc.stderr, \
            f"{' '.join(launch)} train whose model does not fit: exit {proc.returncode}, not 3:\n{proc.stderr}"
        assert not os.path.exists(out), f"{out} left behind"
    # A sweep none of whose configurations fit: exit 3 (nothing was measured), one message, the
    # records oom and the root status saying so; on one rank and on two.
    for mode, extra in (("bench", ["--batch-size", "100000000", "--steps", "1", "--warmup", "0"]),
                        ("memory", ["--memory-limit", "1KB"])):
        for launch in ([], [MPIEXEC, "--oversubscribe", "-np", "2"]):
            out = os.path.join(work, f"none_{mode}{len(launch)}")
            proc = subprocess.run(launch + [BIN, "--mode", mode, "--device", "cpu", "--model", "tiny", *extra, "--out", out],
                                  capture_output=True, text=True, timeout=300)
            errors = [l for l in proc.stderr.splitlines() if "llmhpc: error" in l]
            assert proc.returncode == 3 and len(errors) == 1 and "configuration" in errors[0] and \
                errors[0].startswith("llmhpc: error: out of memory: ") and "--memory-limit" in errors[0], \
                f"{' '.join(launch)} {mode} in which nothing fits: exit {proc.returncode}, not 3:\n{proc.stderr}"
            for rank in range(2 if launch else 1):
                with h5py.File(os.path.join(out, f"rank{rank:05d}.h5"), "r") as f:
                    assert f.attrs["status"].startswith("error: out of memory: "), f.attrs["status"]
                    assert {g.attrs["status"] for g in f[mode].values()} == {"oom"}, f"{mode} rank {rank}"
print("bench, profile, memory and train oom: ok")
