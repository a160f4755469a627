#!/usr/bin/env python3
"""llmhpc next to PyTorch on the same GPU: the tables of docs/results/model-bench.md.

    python3 analysis/model_bench.py LLMHPC_RUN_DIR TORCH.jsonl [MORE.jsonl ...] [--rank 0]

LLMHPC_RUN_DIR is an `llmhpc --mode bench --phase train-step` run; TORCH.jsonl is what
analysis/torch_baseline.py wrote on the same GPU (its --ceilings record too, if measured);
several files are read in order, the first record of a configuration counting.
Prints, per precision, one row per model size and context length: the mean step time
(forward + backward + AdamW, ms) of llmhpc and of each PyTorch setup, and llmhpc's speed-up
over the best PyTorch setup; then llmhpc's forward+backward model FLOP rate against the
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
