# One causal bf16 SDPA (flash backend) forward+backward at (T, d), B1 H1: for ncu.
import sys, torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
T, d = int(sys.argv[1]), int(sys.argv[2])
q, k, v = (torch.randn(1, 1, T, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
do = torch.randn(1, 1, T, d, device="cuda", dtype=torch.bfloat16)
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        o.backward(do)
torch.cuda.synchronize()
