#!/usr/bin/env python3
"""llmhpc next to PyTorch on the same GPU: the tables of docs/results/model-bench.md.

    python3 analysis/model_bench.py LLMHPC_RUN_DIR TORCH.jsonl [MORE.jsonl ...] [--rank 0]

LLMHPC_RUN_DIR is an `llmhpc --mode bench --phase train-step` run; TORCH.jsonl is what
analysis/torch_baseline.py wrote on the same GPU (its --ceilings record too, if measured);
several files are read in order, the first record of a configuration counting.
Prints, per precision, one row per model size and context length: the mean step time
(forward + backward + AdamW, ms) of llmhpc and of each PyTorch setup, and llmhpc's speed-up
over the best PyTorch setup; then, per precision, the reference end-to-end benchmark's eager
against torch.compile table: the mean forward and backward times of llmhpc and of each PyTorch
setup, and each other setup's speed-up over PyTorch eager (eager's time / its time) in forward,
backward and the whole step; then llmhpc's forward+backward model FLOP rate against the
measured bf16/fp32 GEMM rate, and its AdamW time against the bytes-over-bandwidth bound
(28 bytes per parameter: read p, g, m, v; write p, m, v; +2 for the bf16 weight copy); last,
peak memory of both tools (llmhpc's allocator peak, PyTorch's max_memory_allocated).
"""
from __future__ import annotations

import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llmhpc_h5 import GIB, SchemaError, open_run, peak_cell, read_json_lines  # noqa: E402

SIZES = ["tiny", "small", "medium", "large", "xl", "2.7B"]
TORCH_RECORD = "an analysis/torch_baseline.py record"


def model_flops_fwd_bwd(d, d_ff, layers, vocab, ctx, batch):
    """6 x matmul parameters x tokens + 6 x layers x d x T x tokens, causal attention's half of
    12 L d T (as llmhpc's model_flops_fwd_bwd and analysis/scaling.py's MFU count them)."""
    matmul_params = layers * (4 * d * d + 3 * d * d_ff) + vocab * d
    tokens = batch * ctx
    return 6 * matmul_params * tokens + 6 * layers * d * ctx * tokens


def mean(xs):
    return sum(xs) / len(xs) if xs else math.nan


def fmt(x, digits=1):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def adamw_in_backward(r) -> bool:
    """Whether an llmhpc bench row's backward time includes AdamW (a train step without
    --separate-optimizer updates each layer as backward finishes it)."""
    return r["phase"] == "train-step" and not r["separate_optimizer"]


def phase_table(precision, keys, ours, theirs, setups) -> str:
    """Forward and backward of llmhpc and of each PyTorch setup, and each setup's speed-up over
    PyTorch eager (eager's mean / the setup's) in forward, backward and the step: the reference
    end-to-end benchmark's eager against torch.compile table. No speed-ups without eager records."""
    faster = [s for s in setups if s != "eager"] if "eager" in setups else []
    setups = ["eager"] + faster if faster else setups  # eager first, the setups it is compared with after
    mine = [ours[(m, c, precision)] for m, c in keys if (m, c, precision) in ours]
    inside = [adamw_in_backward(r) for r in mine if r["status"] == "ok" and r["phase"] != "forward"]
    all_inside = bool(inside) and all(inside)

    def pytorch(m, c, s, phase):
        """(cell, mean) of one setup's phase; mean NaN where it has no number."""
        t = theirs.get((m, c, precision, s))
        if t is None:
            return "not run", math.nan
        if t["status"] != "ok":
            return t["status"], math.nan
        value = mean(t.get(f"{phase}_ms", []))
        return fmt(value, 2), value

    def llmhpc(m, c, phase):
        r = ours.get((m, c, precision))
        if r is None:
            return "not run"
        if r["status"] != "ok":
            return r["status"]
        cell = fmt(r[f"{phase}_mean"], 2)
        if phase == "backward" and adamw_in_backward(r) and not all_inside:
            cell += " (+AdamW)"
        return cell

    def speedup(eager, other):
        return f"{eager / other:.2f}x" if eager > 0 and other > 0 else "-"  # False for NaN

    header = ["Model", "Context"]
    for phase in ("fwd", "bwd"):
        header += [f"llmhpc {phase}+AdamW" if phase == "bwd" and all_inside else f"llmhpc {phase}"]
        header += [f"PyTorch {s} {phase}" for s in setups] + [f"{phase} speed-up {s}" for s in faster]
    header += [f"step speed-up {s}" for s in faster]
    lines = [f"\n### {precision}: forward and backward, ms (mean of timed steps); speed-up = PyTorch eager / "
             "the setup\n", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for m, c in keys:
        row = [m, str(c)]
        for phase in ("forward", "backward"):
            cells = {s: pytorch(m, c, s, phase) for s in setups}
            row += [llmhpc(m, c, phase)] + [cells[s][0] for s in setups]
            row += [speedup(cells["eager"][1], cells[s][1]) for s in faster]
        row += [speedup(pytorch(m, c, "eager", "step")[1], pytorch(m, c, s, "step")[1]) for s in faster]
        lines.append("| " + " | ".join(row) + " |")
    notes = []
    if any(inside):
        which = "llmhpc bwd+AdamW" if all_inside else "llmhpc's (+AdamW) cells"
        notes.append(f"{which}: without --separate-optimizer llmhpc's AdamW updates each layer as backward "
                     "finishes it, so its backward time includes it.")
    if faster:
        notes.append(f"PyTorch eager runs naive attention and the default AdamW; {' and '.join(faster)} "
                     f"run{'s' if len(faster) == 1 else ''} torch.compile with fused attention and fused AdamW "
                     "(analysis/torch_baseline.py), so the speed-ups over eager include the fused kernels'.")
    return "\n".join(lines) + "".join(f"\n\n{n}" for n in notes)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("llmhpc_dir")
    p.add_argument("torch_jsonl", nargs="+")
    p.add_argument("--rank", type=int, default=0)
    a = p.parse_args()

    try:
        summary = open_run(a.llmhpc_dir).bench_summary(a.rank)
        records = [r for path in a.torch_jsonl for r in read_json_lines(path, ("tool",), TORCH_RECORD)]
        for r in records:
            missing = [k for k in ("model", "context_length", "precision", "setup", "status") if k not in r]
            if r["tool"] != "ceilings" and missing:
                raise SchemaError(f"a {r['tool']} record without {missing} in {a.torch_jsonl}: not {TORCH_RECORD}")
    except SchemaError as e:
        print(f"model_bench.py: {e}", file=sys.stderr)
        return 2
    ours = {}
    for _, r in summary.iterrows():
        ours[(r["model"], int(r["context_length"]), r["precision"])] = r
    theirs, ceil = {}, {}
    for r in records:
        if r["tool"] == "ceilings":
            ceil = ceil or r
        else:
            theirs.setdefault((r["model"], r["context_length"], r["precision"], r["setup"]), r)
    setups = sorted({k[3] for k in theirs})

    def torch_columns(m, c, precision, value):
        """The PyTorch setups' cells of one configuration, and the lowest value among those that ran."""
        cells, lowest = [], math.inf
        for s in setups:
            t = theirs.get((m, c, precision, s))
            if t is None:
                cells.append("not run")
            elif t["status"] != "ok":
                cells.append(t["status"])
            else:
                lowest = min(lowest, value(t))
                cells.append(fmt(value(t), 2))
        return cells, lowest

    def cell(key):
        r = ours.get(key)
        if r is None:
            return None, "not run"
        return (r["step_mean"], "ok") if r["status"] == "ok" else (None, r["status"])

    for precision in ("fp32", "bf16"):
        keys = sorted({(m, c) for (m, c, pr) in ours if pr == precision} |
                      {(m, c) for (m, c, pr, _) in theirs if pr == precision},
                      key=lambda k: (SIZES.index(k[0]) if k[0] in SIZES else 99, k[1]))
        if not keys:
            continue
        print(f"\n### {precision}: forward + backward + AdamW step, ms (mean of timed steps)\n")
        header = ["Model", "Context", "llmhpc"] + [f"PyTorch {s}" for s in setups] + ["Speed-up vs best PyTorch"]
        print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
        for m, c in keys:
            ms, status = cell((m, c, precision))
            cells, best = torch_columns(m, c, precision, lambda t: mean(t["step_ms"]))
            row = [m, str(c), fmt(ms, 2) if ms is not None else status] + cells
            row.append(f"{best / ms:.2f}x" if ms and best < math.inf else "-")
            print("| " + " | ".join(row) + " |")

    for precision in ("fp32", "bf16"):
        keys = sorted({(m, c) for (m, c, pr) in ours if pr == precision} |
                      {(m, c) for (m, c, pr, _) in theirs if pr == precision},
                      key=lambda k: (SIZES.index(k[0]) if k[0] in SIZES else 99, k[1]))
        if keys:
            print(phase_table(precision, keys, ours, theirs, setups))

    print("\n### llmhpc efficiency\n")
    print("| Model | Context | Precision | Fwd+Bwd ms | Model TFLOP/s | % of measured GEMM rate | AdamW ms | AdamW bound ms | AdamW / bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    copy_bw = ceil.get("copy_tb_per_s")
    for (m, c, precision), r in sorted(ours.items(), key=lambda kv: (SIZES.index(kv[0][0]) if kv[0][0] in SIZES else 99, kv[0][1])):
        if r["status"] != "ok":
            continue
        fb = r["forward_mean"] + r["backward_mean"]
        flops = model_flops_fwd_bwd(r["d_model"], r["d_ff"], r["num_layers"], r["vocab_size"], c, r["batch_size"])
        tflops = flops / (fb / 1e3) / 1e12
        gemm = ceil.get("gemm_bf16_tflops" if precision == "bf16" else "gemm_fp32_tflops")
        bytes_per_param = 30 if precision == "bf16" else 28
        opt_ms = r.get("optimizer_mean", math.nan)  # NaN: AdamW ran inside backward (the default plan)
        bound = r["num_params"] * bytes_per_param / (copy_bw * 1e12) * 1e3 if copy_bw else math.nan
        print(f"| {m} | {c} | {precision} | {fmt(fb, 2)} | {fmt(tflops)} | {fmt(100 * tflops / gemm if gemm else math.nan)} | "
              f"{fmt(opt_ms, 2)} | {fmt(bound, 2)} | {fmt(opt_ms / bound, 2)} |")
    print("\n### Peak memory, GiB (llmhpc's allocator peak; PyTorch's max_memory_allocated)\n")
    header = ["Model", "Context", "Precision", "llmhpc"] + [f"PyTorch {s}" for s in setups] + ["llmhpc / best PyTorch that ran"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for (m, c, precision), r in sorted(ours.items(), key=lambda kv: (kv[0][2], SIZES.index(kv[0][0]) if kv[0][0] in SIZES else 99, kv[0][1])):
        mine = r.get("peak_memory_bytes", 0) / GIB
        cells, lowest = torch_columns(m, c, precision, lambda t: t["peak_memory_bytes"] / GIB)
        row = [m, str(c), precision, peak_cell(r["status"], r.get("peak_memory_bytes", 0), GIB, 2)] + cells
        row.append(f"{mine / lowest:.2f}" if r["status"] == "ok" and lowest < math.inf else "-")
        print("| " + " | ".join(row) + " |")
    if ceil:
        print(f"\nMeasured on {ceil['device_name']}: bf16 GEMM {ceil['gemm_bf16_tflops']:.0f} TFLOP/s, "
              f"fp32 {ceil['gemm_fp32_tflops']:.1f}, tf32 {ceil['gemm_tf32_tflops']:.0f}; copy {ceil['copy_tb_per_s']:.2f} TB/s "
              "(8192^3 products on random data; 2 GiB device copy, bytes read + written).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
