"""The reference PyTorch TransformerLM: llmhpc's model, its checkpoint format and a training loop.

Written from the model's definition, not from the C++. The parameter names are exactly the
checkpoint's (docs/hdf5-schema.md, "Checkpoints": token_embeddings.weight, layers.{i}.ln1.weight,
layers.{i}.attn.{q,k,v,output}_proj.weight, layers.{i}.ln2.weight, layers.{i}.ffn.w{1,2,3}.weight,
ln_final.weight, lm_head.weight), so model.state_dict() and the checkpoint's /params group hold
the same names and shapes.

Training uses torch.optim.AdamW(foreach=False) in fp32 on the CPU, on batches drawn in the
sequential order of src/io/token_data.h, and records the loss of every step (the loss at the
weights before that step's update, as llmhpc's /train/loss does).

Used by tests/scripts/test_reference_torch.py. Also a command line:
    python3 tests/reference/torch_model.py init   OUT.h5 --d-model 64 ... --seed 0
    python3 tests/reference/torch_model.py train  INIT.h5 DATA --steps 5 --save FINAL.h5
"""
from __future__ import annotations

import argparse
import math
import os
import sys

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# One reading of the checkpoint format and the data order, shared with the numpy reference.
from numpy_model import (ModelConfig, OptimizerState, load_checkpoint as load_checkpoint_arrays,  # noqa: E402
                         load_tokens, parameter_shapes, save_checkpoint as save_checkpoint_arrays,
                         sequential_batch)

RMSNORM_EPS = 1e-5


class RMSNorm(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        in_dtype = x.dtype
        x = x.float()  # RMSNorm is computed in fp32
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + RMSNORM_EPS)
        return (x / rms * self.weight).to(in_dtype)


def apply_rope(x, theta: float):
    """x (B, H, T, D): each interleaved pair (x[2i], x[2i+1]) at position t rotated by t * theta^(-2i/D)."""
    seq_len, head_dim = x.shape[-2], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angle = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class CausalSelfAttention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        d = config.d_model
        self.num_heads, self.theta = config.num_heads, config.rope_theta
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.output_proj = nn.Linear(d, d, bias=False)

    def forward(self, x):
        batch, seq_len, d = x.shape

        def heads(t):  # (B, T, d) -> (B, H, T, D)
            return t.view(batch, seq_len, self.num_heads, d // self.num_heads).transpose(1, 2)

        q = apply_rope(heads(self.q_proj(x)), self.theta)
        k = apply_rope(heads(self.k_proj(x)), self.theta)
        v = heads(self.v_proj(x))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        future = torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool), diagonal=1)
        probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
        out = (probs @ v).transpose(1, 2).reshape(batch, seq_len, d)
        return self.output_proj(out)


class SwiGLU(nn.Module):
    def __init__(self, d: int, d_ff: int):
        super().__init__()
        self.w1 = nn.Linear(d, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d, bias=False)
        self.w3 = nn.Linear(d, d_ff, bias=False)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln1 = RMSNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = RMSNorm(config.d_model)
        self.ffn = SwiGLU(config.d_model, config.d_ff)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.token_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)  # not tied

    def forward(self, tokens):
        x = self.token_embeddings(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.ln_final(x))

    def loss(self, inputs, targets):
        logits = self.forward(inputs)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """llmhpc's init: linears truncated normal std sqrt(2/(in+out)) at +-3 sigma, embedding std 1 at +-3, gains 1."""
        generator = torch.Generator().manual_seed(seed)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)
            else:
                std = 1.0 if name == "token_embeddings.weight" else math.sqrt(2.0 / (p.shape[0] + p.shape[1]))
                nn.init.trunc_normal_(p, mean=0.0, std=std, a=-3 * std, b=3 * std, generator=generator)


def check_names(model: TransformerLM) -> None:
    """The module tree must produce exactly the checkpoint's names and shapes (guards against refactors)."""
    got = {name: tuple(p.shape) for name, p in model.named_parameters()}
    want = dict(parameter_shapes(model.config))
    if got != want:
        raise AssertionError(f"parameter names differ from SPEC: missing {sorted(set(want) - set(got))}, "
                             f"extra {sorted(set(got) - set(want))}, "
                             f"shapes {[(n, got[n], want[n]) for n in got if n in want and got[n] != want[n]]}")


def make_optimizer(model: TransformerLM, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                             foreach=False, fused=False)


# ---- checkpoint I/O (format in numpy_model.py) ---------------------------------------------

def load_checkpoint(path: str, optimizer_kwargs: dict | None = None):
    """Returns (model, optimizer or None). The optimizer (AdamW, foreach=False) gets the checkpoint's
    step, m and v when it has them; `optimizer_kwargs` sets its hyper-parameters."""
    config, arrays, state = load_checkpoint_arrays(path)
    model = TransformerLM(config)
    check_names(model)
    model.load_state_dict({name: torch.from_numpy(np.array(a, dtype=np.float32)) for name, a in arrays.items()},
                          strict=True)
    optimizer = None
    if optimizer_kwargs is not None:
        optimizer = make_optimizer(model, **optimizer_kwargs)
        if state is not None and state.step > 0:
            for name, p in model.named_parameters():
                optimizer.state[p] = {
                    "step": torch.tensor(float(state.step)),
                    "exp_avg": torch.from_numpy(np.array(state.m[name], dtype=np.float32)),
                    "exp_avg_sq": torch.from_numpy(np.array(state.v[name], dtype=np.float32)),
                }
    return model, optimizer


def save_checkpoint(path: str, model: TransformerLM, optimizer=None) -> None:
    params = {name: p.detach().cpu().numpy() for name, p in model.named_parameters()}
    state = None
    if optimizer is not None and len(optimizer.state) > 0:
        named = dict(model.named_parameters())
        steps = {int(optimizer.state[p]["step"]) for p in named.values()}
        if len(steps) != 1:
            raise ValueError(f"parameters have taken different numbers of steps: {steps}")
        state = OptimizerState(step=steps.pop(),
                               m={n: optimizer.state[p]["exp_avg"].cpu().numpy() for n, p in named.items()},
                               v={n: optimizer.state[p]["exp_avg_sq"].cpu().numpy() for n, p in named.items()})
    save_checkpoint_arrays(path, model.config, params, state)


# ---- training -----------------------------------------------------------------------------

def lr_at(step: int, peak: float, schedule: str = "constant", warmup: int = 0, decay_steps: int = 0,
          min_lr: float = 0.0) -> float:
    """The learning rate of optimizer step `step` (from 1), as llmhpc's --lr-schedule documents it: linear warm-up
    from 0 over `warmup` steps, then `peak` held (constant) or decayed to `min_lr` at step `decay_steps`."""
    if step <= warmup:
        return peak * step / warmup
    if schedule == "constant":
        return peak
    if step >= decay_steps:
        return min_lr
    progress = (step - warmup) / (decay_steps - warmup)
    if schedule == "linear":
        return peak + (min_lr - peak) * progress
    return min_lr + (peak - min_lr) * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(model: TransformerLM, optimizer, tokens: np.ndarray, steps: int, batch_size: int, seq_len: int,
          first_step: int = 0, schedule: dict | None = None, max_grad_norm: float = 0.0,
          grad_norms: list | None = None) -> list:
    """`steps` AdamW steps on the sequential batches; returns the loss of each step (before its update).
    `schedule`: lr_at's keyword arguments, the rate set before each step; `max_grad_norm` > 0: the gradients
    clipped by torch.nn.utils.clip_grad_norm_, each step's norm appended to `grad_norms` if given."""
    losses = []
    for step in range(first_step, first_step + steps):
        if schedule is not None:
            for group in optimizer.param_groups:
                group["lr"] = lr_at(step + 1, **schedule)
        inputs, targets = sequential_batch(tokens, step, batch_size, seq_len)
        optimizer.zero_grad(set_to_none=True)
        loss = model.loss(torch.from_numpy(inputs), torch.from_numpy(targets))
        loss.backward()
        if max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm))
            if grad_norms is not None:
                grad_norms.append(norm)
        optimizer.step()
        losses.append(float(loss.item()))
    return losses


def main() -> None:
    torch.set_default_dtype(torch.float32)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    init = sub.add_parser("init", help="write a randomly initialised checkpoint")
    init.add_argument("out")
    for name, default in (("vocab-size", 10000), ("context-length", 128), ("d-model", 64), ("d-ff", 128),
                          ("num-layers", 2), ("num-heads", 4), ("seed", 0)):
        init.add_argument("--" + name, type=int, default=default)
    tr = sub.add_parser("train", help="train from a checkpoint and print per-step losses")
    tr.add_argument("init")
    tr.add_argument("data")
    tr.add_argument("--steps", type=int, default=5)
    tr.add_argument("--batch-size", type=int, default=4)
    tr.add_argument("--context-length", type=int, default=None, help="default: the checkpoint's")
    tr.add_argument("--lr", type=float, default=1e-3)
    tr.add_argument("--weight-decay", type=float, default=0.01)
    tr.add_argument("--save", default=None)
    args = parser.parse_args()
    if args.command == "init":
        config = ModelConfig(vocab_size=args.vocab_size, context_length=args.context_length, d_model=args.d_model,
                             d_ff=args.d_ff, num_layers=args.num_layers, num_heads=args.num_heads)
        model = TransformerLM(config)
        check_names(model)
        model.reset_parameters(args.seed)
        save_checkpoint(args.out, model)
        return
    model, optimizer = load_checkpoint(args.init, dict(lr=args.lr, weight_decay=args.weight_decay))
    seq_len = args.context_length or model.config.context_length
    for step, loss in enumerate(train(model, optimizer, load_tokens(args.data), args.steps, args.batch_size, seq_len)):
        print(f"step {step}: loss {loss:.8f}")
    if args.save:
        save_checkpoint(args.save, model, optimizer)


if __name__ == "__main__":
    main()
