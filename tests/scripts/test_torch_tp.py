"""analysis/torch_tp.py on the CPU (gloo) under mpirun: PyTorch's tensor parallelism against one
unsharded model.

The script is compiled; where PyTorch is importable (else exit 77), a tiny custom model runs
under 2 ranks (TP 2, sequence parallel off and on) and under 4 (--tp 2: TP 2 x FSDP2 2, sequence
parallel on), eager, fp32, with --check-against-single. Checks: exit 0; one JSON line per
configuration with status ok, tp and dp as launched, every rank's per-step arrays of --steps
elements, step_ms_max_over_ranks the element-wise maximum of the ranks' step_ms, step_ms_median
and tokens_per_s from it; the sharded run's per-step losses equal the unsharded model's within
1e-5 relative (fp32: the same arithmetic, summed in another order), and the final losses equal
across the runs. Bad input (heads that do not split over the ranks, a --tp that does not divide
the world, a context that sequence parallel cannot split) exits non-zero with a clear message
and writes no record.
"""
import json
import os
import py_compile
import statistics
import subprocess
import sys

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
from script_env import SKIP, mpiexec, rel_err, run, scratch_dir  # noqa: E402

TORCH_TP_PY = os.path.join(ROOT, "analysis", "torch_tp.py")
MODEL = ["--d-model", 32, "--d-ff", 64, "--num-layers", 2, "--num-heads", 4, "--vocab-size", 64]
T, BATCH, WARMUP, STEPS = 16, 4, 1, 3


def torch_tp(np_, out, *extra, expect_ok=True):
    return run(mpiexec() + ["-np", np_, "-x", "MASTER_PORT", sys.executable, TORCH_TP_PY, "--device", "cpu", *MODEL,
                            "--context-length", T, "--batch-size", BATCH, "--precision", "fp32", "--setup", "eager",
                            "--warmup", WARMUP, "--steps", STEPS, *extra, "--out", out], expect_ok=expect_ok)


def check_records(path, np_, tp, sequence_parallel):
    records = [json.loads(line) for line in open(path)]
    assert [r["sequence_parallel"] for r in records] == sequence_parallel, records
    for r in records:
        where = f"np {np_} tp {tp} sequence parallel {r['sequence_parallel']}"
        assert r["status"] == "ok", f"{where}: {r.get('error', r['status'])}"
        assert (r["tool"], r["tp"], r["dp"], r["world_size"]) == ("pytorch-tp", tp, np_ // tp, np_), r
        assert r["local_batch_size"] == BATCH // r["dp"] and len(r["ranks"]) == np_, r
        steps = [p["step_ms"] for p in r["ranks"]]
        assert all(len(s) == STEPS for s in steps), f"{where}: {steps}"
        assert r["step_ms_max_over_ranks"] == [max(s) for s in zip(*steps)], r
        assert r["step_ms_median"] == statistics.median(r["step_ms_max_over_ranks"]), r
        assert abs(r["tokens_per_s"] - BATCH * T / r["step_ms_median"] * 1e3) <= 1e-6 * r["tokens_per_s"], r
        check = r["check"]
        assert check["status"] == "ok" and len(check["losses"]) == WARMUP + STEPS, f"{where}: {check}"
        assert check["max_rel_loss_diff"] <= 1e-5, f"{where}: losses {check['losses']}, unsharded " \
                                                    f"{check['single_losses']}"
        print(f"{where}: max relative loss difference from one unsharded model {check['max_rel_loss_diff']:.2e}")
    return records


def check_bad_input(work):
    cases = [("does not split over --tp 2", ["--num-heads", "3", "--d-model", "33"]),
             ("whole number of tensor-parallel groups", ["--tp", "3"]),
             ("needs a multiple of 2", ["--context-length", "15", "--sequence-parallel", "on"])]
    for i, (words, args) in enumerate(cases):
        out = os.path.join(work, f"bad{i}.jsonl")
        proc = torch_tp(2, out, *args, expect_ok=False)
        assert proc.returncode != 0, f"{args}: exit 0"
        assert words in proc.stderr, f"{args}: message lacks '{words}': {proc.stderr[-600:]}"
        assert not os.path.exists(out), f"{args}: wrote {out}"


def main():
    work = scratch_dir("llmhpc-torch-tp-")
    py_compile.compile(TORCH_TP_PY, doraise=True, cfile=os.path.join(work, "torch_tp.pyc"))
    if subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode != 0:
        print("SKIP: torch_tp.py compiles; PyTorch is not importable here, so its CPU runs are skipped")
        sys.exit(SKIP)
    os.environ["MASTER_PORT"] = str(29500 + os.getpid() % 1000)
    path = os.path.join(work, "tp2.jsonl")
    torch_tp(2, path, "--sequence-parallel", "off,on", "--check-against-single")
    losses = [p["final_loss"] for r in check_records(path, 2, 2, [False, True]) for p in r["ranks"]]
    path = os.path.join(work, "tp2_dp2.jsonl")
    torch_tp(4, path, "--tp", "2", "--sequence-parallel", "on", "--check-against-single")
    dp_losses = [statistics.fmean(p["final_loss"] for p in r["ranks"]) for r in check_records(path, 4, 2, [True])]
    assert all(rel_err(a, losses[0]) <= 1e-5 for a in losses + dp_losses), (losses, dp_losses)
    check_bad_input(work)
    print("test_torch_tp: OK")


if __name__ == "__main__":
    main()
