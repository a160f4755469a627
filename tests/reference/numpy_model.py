"""A float64 numpy reference of llmhpc's TransformerLM: forward pass and mean cross-entropy.

Written from the model's definition (the arithmetic below; the checkpoint format of
docs/hdf5-schema.md, "Checkpoints"; the batch order of src/io/token_data.h), not from the C++:
it is the independent check that llmhpc computes that model. It also reads and writes llmhpc's
checkpoint format (HDF5 through h5py) and draws batches in the sequential data order, so a
test can feed llmhpc and this model the same weights and tokens.

Used by tests/scripts/test_reference_numpy.py; torch_model.py (the PyTorch twin) imports
the format and data helpers from here so both references share one reading of the formats.

    python3 tests/reference/numpy_model.py CKPT DATA --batch-size 2 --context-length 16 --steps 3
prints the loss of each sequential batch at the checkpoint's weights.
"""
from __future__ import annotations

import argparse
import dataclasses
from collections import OrderedDict

import h5py
import numpy as np

RMSNORM_EPS = 1e-5
# Root attributes of a checkpoint that hold the model shape (docs/hdf5-schema.md, "Checkpoints").
CONFIG_ATTRIBUTES = ("vocab_size", "context_length", "d_model", "d_ff", "num_layers", "num_heads")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    context_length: int
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.d_model // self.num_heads


# ---- parameter names and shapes (docs/hdf5-schema.md, "Checkpoints") ---------------------

def parameter_shapes(config: ModelConfig) -> "OrderedDict[str, tuple]":
    """Every tensor of the model, named as the reference PyTorch model names it, (out, in) for linears."""
    d, f, v = config.d_model, config.d_ff, config.vocab_size
    shapes = OrderedDict()
    shapes["token_embeddings.weight"] = (v, d)
    for i in range(config.num_layers):
        p = f"layers.{i}."
        shapes[p + "ln1.weight"] = (d,)
        for proj in ("q_proj", "k_proj", "v_proj", "output_proj"):
            shapes[p + f"attn.{proj}.weight"] = (d, d)
        shapes[p + "ln2.weight"] = (d,)
        shapes[p + "ffn.w1.weight"] = (f, d)
        shapes[p + "ffn.w2.weight"] = (d, f)
        shapes[p + "ffn.w3.weight"] = (f, d)
    shapes["ln_final.weight"] = (d,)
    shapes["lm_head.weight"] = (v, d)
    return shapes


def truncated_normal(rng: np.random.Generator, shape, std: float, bound_in_std: float = 3.0) -> np.ndarray:
    """Normal(0, std) redrawn until inside +-bound_in_std*std (what torch.nn.init.trunc_normal_ gives)."""
    out = rng.standard_normal(shape)
    bad = np.abs(out) > bound_in_std
    while bad.any():
        out[bad] = rng.standard_normal(int(bad.sum()))
        bad = np.abs(out) > bound_in_std
    return out * std


def init_parameters(config: ModelConfig, seed: int) -> "OrderedDict[str, np.ndarray]":
    """llmhpc's initialisation, stored as float32 (the checkpoint's type): linears truncated normal
    std sqrt(2/(in+out)) at +-3 sigma, embedding std 1 at +-3, norm gains 1."""
    rng = np.random.default_rng(seed)
    params = OrderedDict()
    for name, shape in parameter_shapes(config).items():
        if len(shape) == 1:
            value = np.ones(shape)
        elif name == "token_embeddings.weight":
            value = truncated_normal(rng, shape, 1.0)
        else:
            out_features, in_features = shape
            value = truncated_normal(rng, shape, np.sqrt(2.0 / (in_features + out_features)))
        params[name] = value.astype(np.float32)
    return params


# ---- checkpoint I/O ---------------------------------------------------------------------

@dataclasses.dataclass
class OptimizerState:
    step: int
    m: "dict[str, np.ndarray]"
    v: "dict[str, np.ndarray]"


def save_checkpoint(path: str, config: ModelConfig, params: dict, optimizer: OptimizerState | None = None) -> None:
    """/params/<name> fp32; /optimizer/{step, m/<name>, v/<name>} when given; config as root attributes."""
    with h5py.File(path, "w") as f:
        for key in CONFIG_ATTRIBUTES:
            f.attrs[key] = np.int64(getattr(config, key))
        f.attrs["rope_theta"] = np.float64(config.rope_theta)
        group = f.create_group("params")
        for name, value in params.items():
            group.create_dataset(name, data=np.asarray(value, dtype=np.float32))
        if optimizer is not None:
            opt = f.create_group("optimizer")
            opt.create_dataset("step", data=np.int64(optimizer.step))
            for which, state in (("m", optimizer.m), ("v", optimizer.v)):
                g = opt.create_group(which)
                for name, value in state.items():
                    g.create_dataset(name, data=np.asarray(value, dtype=np.float32))


def read_config(f: h5py.File) -> ModelConfig:
    missing = [key for key in CONFIG_ATTRIBUTES if key not in f.attrs]
    if missing:
        raise ValueError(f"checkpoint {f.filename} lacks the config attributes {missing}")
    values = {key: int(f.attrs[key]) for key in CONFIG_ATTRIBUTES}
    theta = float(f.attrs["rope_theta"]) if "rope_theta" in f.attrs else 10000.0
    return ModelConfig(rope_theta=theta, **values)


def load_checkpoint(path: str):
    """Returns (config, params, optimizer state or None); checks every name and shape against the config."""
    with h5py.File(path, "r") as f:
        config = read_config(f)
        expected = parameter_shapes(config)

        def read_group(group_path):
            group = f[group_path]
            names = set(group.keys())
            if names != set(expected):
                raise ValueError(f"{path}:{group_path}: missing {sorted(set(expected) - names)}, "
                                 f"extra {sorted(names - set(expected))}")
            out = OrderedDict()
            for name, shape in expected.items():
                value = group[name][()]
                if value.shape != shape:
                    raise ValueError(f"{path}:{group_path}/{name} has shape {value.shape}, expected {shape}")
                out[name] = value
            return out

        params = read_group("params")
        optimizer = None
        if "optimizer" in f:
            optimizer = OptimizerState(step=int(f["optimizer/step"][()]), m=read_group("optimizer/m"),
                                       v=read_group("optimizer/v"))
    return config, params, optimizer


# ---- token data and the sequential order (src/io/token_data.h) ------------------------------

def load_tokens(path: str) -> np.ndarray:
    """A .bin of little-endian uint16 token ids, or a 1-D .npy of uint16/int32."""
    if path.endswith(".npy"):
        return np.load(path, mmap_mode="r")
    return np.fromfile(path, dtype="<u2")


def sequential_batch(tokens: np.ndarray, step: int, batch_size: int, seq_len: int):
    """Sequence b of step s starts at o = ((s*B + b)*T) mod (N - T);
    inputs tokens[o, o+T), targets tokens[o+1, o+T+1). Returns two (B, T) int64 arrays."""
    n = len(tokens)
    inputs = np.empty((batch_size, seq_len), dtype=np.int64)
    targets = np.empty((batch_size, seq_len), dtype=np.int64)
    for b in range(batch_size):
        o = ((step * batch_size + b) * seq_len) % (n - seq_len)
        inputs[b] = tokens[o:o + seq_len]
        targets[b] = tokens[o + 1:o + seq_len + 1]
    return inputs, targets


# ---- the model, float64 -------------------------------------------------------------------

def rmsnorm(x: np.ndarray, gain: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + RMSNORM_EPS) * gain


def rope(x: np.ndarray, theta: float) -> np.ndarray:
    """x (B, T, H, D): each interleaved pair (x[2i], x[2i+1]) at position t is rotated by the
    angle t * theta^(-2i/D)."""
    _, seq_len, _, head_dim = x.shape
    positions = np.arange(seq_len, dtype=np.float64)[:, None]
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    angle = positions * inv_freq[None, :]                   # (T, D/2)
    cos, sin = np.cos(angle)[None, :, None, :], np.sin(angle)[None, :, None, :]
    even, odd = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = even * cos - odd * sin
    out[..., 1::2] = even * sin + odd * cos
    return out


def causal_attention(x: np.ndarray, p: dict, prefix: str, config: ModelConfig) -> np.ndarray:
    batch, seq_len, d = x.shape
    h, hd = config.num_heads, config.head_dim

    def heads(name):  # (B, T, d) -> (B, T, H, D)
        return (x @ p[prefix + name].T).reshape(batch, seq_len, h, hd)

    q = rope(heads("q_proj.weight"), config.rope_theta)
    k = rope(heads("k_proj.weight"), config.rope_theta)
    v = heads("v_proj.weight")
    scores = np.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(hd)
    future = np.triu(np.ones((seq_len, seq_len), dtype=bool), k=1)
    scores = np.where(future, -np.inf, scores)
    scores = scores - scores.max(axis=-1, keepdims=True)
    probs = np.exp(scores)
    probs /= probs.sum(axis=-1, keepdims=True)
    out = np.einsum("bhij,bjhd->bihd", probs, v).reshape(batch, seq_len, d)
    return out @ p[prefix + "output_proj.weight"].T


def swiglu(x: np.ndarray, p: dict, prefix: str) -> np.ndarray:
    a = x @ p[prefix + "w1.weight"].T
    gate = a / (1.0 + np.exp(-a))  # SiLU
    return (gate * (x @ p[prefix + "w3.weight"].T)) @ p[prefix + "w2.weight"].T


def forward(params: dict, config: ModelConfig, tokens: np.ndarray) -> np.ndarray:
    """tokens (B, T) int -> logits (B, T, vocab), all in float64."""
    p = {name: np.asarray(value, dtype=np.float64) for name, value in params.items()}
    x = p["token_embeddings.weight"][tokens]
    for i in range(config.num_layers):
        prefix = f"layers.{i}."
        x = x + causal_attention(rmsnorm(x, p[prefix + "ln1.weight"]), p, prefix + "attn.", config)
        x = x + swiglu(rmsnorm(x, p[prefix + "ln2.weight"]), p, prefix + "ffn.")
    return rmsnorm(x, p["ln_final.weight"]) @ p["lm_head.weight"].T


def mean_cross_entropy(logits: np.ndarray, targets: np.ndarray) -> float:
    flat = logits.reshape(-1, logits.shape[-1])
    shift = flat.max(axis=-1, keepdims=True)
    logsumexp = np.log(np.exp(flat - shift).sum(axis=-1)) + shift[:, 0]
    picked = flat[np.arange(flat.shape[0]), targets.reshape(-1)]
    return float(np.mean(logsumexp - picked))


def loss(params: dict, config: ModelConfig, inputs: np.ndarray, targets: np.ndarray) -> float:
    return mean_cross_entropy(forward(params, config, inputs), targets)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("data")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--context-length", type=int, default=None, help="default: the checkpoint's")
    parser.add_argument("--steps", type=int, default=1)
    args = parser.parse_args()
    config, params, _ = load_checkpoint(args.checkpoint)
    seq_len = args.context_length or config.context_length
    tokens = load_tokens(args.data)
    for step in range(args.steps):
        inputs, targets = sequential_batch(tokens, step, args.batch_size, seq_len)
        print(f"step {step}: loss {loss(params, config, inputs, targets):.10f}")


if __name__ == "__main__":
    main()
