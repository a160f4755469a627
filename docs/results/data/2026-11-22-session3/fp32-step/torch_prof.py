"""torch.compile (analysis/torch_baseline.py's compiled setup), fp32, one profiled train step:
every CUDA kernel in order with its duration, and phase boundaries."""
import json, sys, time
import torch
sys.path.insert(0, "analysis")
from torch_baseline import TransformerLM, PRESETS
from torch.profiler import profile, ProfilerActivity, record_function

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
size, ctx, layers, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
d, dff, L, H = PRESETS[size]
L = layers or L
model = TransformerLM(10000, d, dff, L, H, fused=True).cuda()
for b in model.layers:
    b.compile()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
tok = torch.randint(0, 10000, (4, ctx), device="cuda")
tgt = torch.randint(0, 10000, (4, ctx), device="cuda")
ev = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
def step():
    ev[0].record()
    with record_function("PH_forward"):
        loss = model(tok, tgt)
    ev[1].record()
    with record_function("PH_backward"):
        opt.zero_grad(set_to_none=True)
        loss.backward()
    ev[2].record()
    with record_function("PH_optimizer"):
        opt.step()
    ev[3].record()
    torch.cuda.synchronize()
    return [ev[0].elapsed_time(ev[1]), ev[1].elapsed_time(ev[2]), ev[2].elapsed_time(ev[3]), ev[0].elapsed_time(ev[3])]
t0 = time.time()
step()
print("compile s", time.time() - t0, flush=True)
import os
while not os.path.exists("/tmp/gpu_free"):
    time.sleep(1)
for _ in range(2):
    step()
times = [step() for _ in range(5)]
print("steps (fwd, bwd, opt, total) ms:", [round(sum(t[i] for t in times) / len(times), 2) for i in range(4)], flush=True)
with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
    step()
prof.export_chrome_trace(out + ".trace.json")
tr = json.load(open(out + ".trace.json"))
ker = [e for e in tr["traceEvents"] if e.get("cat") == "kernel"]
ann = [e for e in tr["traceEvents"] if e.get("cat") == "gpu_user_annotation" and e.get("name", "").startswith("PH_")]
ker.sort(key=lambda e: e["ts"])
with open(out + ".kernels.tsv", "w") as f:
    for a in ann:
        f.write(f"#phase\t{a['name']}\t{a['ts']}\t{a['dur']}\n")
    for e in ker:
        f.write(f"{e['ts']}\t{e['dur']}\t{e['name']}\n")
print("kernels", len(ker), "sum us", sum(e["dur"] for e in ker))
