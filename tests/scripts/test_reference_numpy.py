"""llmhpc's model against an independent float64 numpy implementation of it (tests/reference/numpy_model.py).

(i)   llmhpc's seeded initialisation follows its rule (norm gains 1, embedding std 1 within +-3,
      linears std sqrt(2/(in+out)) within +-3 sigma), and the numpy loss of the first
      sequential batch at llmhpc's initial checkpoint equals llmhpc's recorded first-step
      loss of a real training run (rel 1e-5).
(ii)  The other way: numpy writes a random checkpoint; llmhpc --init it with lr 0 and weight
      decay 0 records, for every step, the loss numpy computes on that sequential batch (rel 1e-5).
      Embedding rows of token ids that never occur in the data get no gradient, so AdamW only
      decays them: after the run they are exactly init * (1 - lr * weight_decay)^steps
      (decoupled decay, applied to every parameter).
(iii) A checkpoint with a misshapen, an extra or a missing tensor is refused with a non-zero
      exit and a message that names the tensor, within seconds.
"""
import os
import shutil
import sys

import h5py
import numpy as np

ROOT = os.environ.get("LLMHPC_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "reference"))
import numpy_model as ref  # noqa: E402
from script_env import llmhpc_binary, rel_err, run, scratch_dir  # noqa: E402

BIN = llmhpc_binary()
CONFIG = ref.ModelConfig(vocab_size=97, context_length=16, d_model=32, d_ff=80, num_layers=2, num_heads=4)
BATCH, STEPS = 3, 4
UNSEEN_TOKENS = 7  # the highest ids never occur in the data
LR, WEIGHT_DECAY = 1e-3, 0.01  # llmhpc's defaults, passed explicitly
TOLERANCE = 1e-5
SHAPE_ARGS = ["--d-model", str(CONFIG.d_model), "--d-ff", str(CONFIG.d_ff), "--num-layers", str(CONFIG.num_layers),
              "--num-heads", str(CONFIG.num_heads), "--vocab-size", str(CONFIG.vocab_size)]
DATA_ARGS = ["--context-length", str(CONFIG.context_length), "--batch-size", str(BATCH), "--data-order", "sequential"]


def recorded_losses(out_dir):
    with h5py.File(os.path.join(out_dir, "rank00000.h5"), "r") as f:
        assert f["train"].attrs["status"] == "ok", f"train status {f['train'].attrs['status']!r}"
        return f["train/loss"][()]


def check_spec_init(path):
    _, params, _ = ref.load_checkpoint(path)
    for name, value in params.items():
        value = value.astype(np.float64)
        if value.ndim == 1:
            assert np.all(value == 1.0), f"{name}: SPEC initialises norm gains to 1, got {value[:4]}..."
            continue
        std = 1.0 if name == "token_embeddings.weight" else np.sqrt(2.0 / sum(value.shape))
        # A normal truncated at +-3 sigma has standard deviation 0.9866 sigma.
        assert np.max(np.abs(value)) <= 3 * std * (1 + 1e-6), f"{name}: values beyond 3 sigma ({np.abs(value).max()})"
        assert abs(value.std() / (0.9866 * std) - 1) < 0.1, f"{name}: std {value.std():.4f}, SPEC says ~{0.9866 * std:.4f}"
        assert abs(value.mean()) < 0.1 * std, f"{name}: mean {value.mean():.4f} is not ~0"


def check_decay_only_rows(initial, final):
    """Unseen token ids: decoupled weight decay alone, (1 - lr*wd) per step; seen ones move by ~lr per step."""
    name = "token_embeddings.weight"
    start, end = initial[name].astype(np.float64), final[name].astype(np.float64)
    unseen = slice(CONFIG.vocab_size - UNSEEN_TOKENS, None)
    want = start[unseen] * (1 - LR * WEIGHT_DECAY) ** STEPS
    err = np.max(np.abs(end[unseen] - want) / np.abs(want))
    print(f"(i) unseen embedding rows vs init*(1-lr*wd)^{STEPS}: max rel err {err:.1e}")
    assert err <= 1e-6, (f"embedding rows of unseen tokens should only decay by (1-lr*wd)^steps; max rel err {err:.2e} "
                         f"(decay missing, coupled to the gradient, or applied to the wrong rows?)")
    moved = np.max(np.abs(end[:unseen.start] - start[:unseen.start]))
    assert moved > 0.5 * LR, f"embedding rows of seen tokens barely moved ({moved:.1e}): was the optimizer run?"


def expect_refused(work, ckpt, edit, tensor, what):
    """Copies `ckpt`, applies `edit` to it, and expects llmhpc --init to refuse it naming `tensor`."""
    slug = what.replace(" ", "_")
    bad = os.path.join(work, f"bad_{slug}.h5")
    shutil.copy(ckpt, bad)
    with h5py.File(bad, "a") as f:
        edit(f)
    proc = run([BIN, "--mode", "train", "--device", "cpu", "--data", os.path.join(work, "tokens.bin"), "--init", bad,
                *DATA_ARGS, "--steps", "1", "--out", os.path.join(work, f"out_{slug}")], expect_ok=False, timeout=60)
    message = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"a checkpoint with {what} was accepted:\n{message}"
    assert tensor in message, f"the error for {what} should name '{tensor}':\n{message}"
    print(f"refused ({what}): {message.strip().splitlines()[-1]}")


def main():
    work = scratch_dir("llmhpc-refnumpy-")
    rng = np.random.default_rng(1234)
    data_path = os.path.join(work, "tokens.bin")
    tokens = rng.integers(0, CONFIG.vocab_size - UNSEEN_TOKENS, size=2000, dtype=np.uint16)
    tokens.astype("<u2").tofile(data_path)
    common = ["--mode", "train", "--device", "cpu", "--data", data_path, *DATA_ARGS]

    # ---- (i) llmhpc's init and first loss ----
    init_ckpt = os.path.join(work, "llmhpc_init.h5")
    run([BIN, *common, *SHAPE_ARGS, "--seed", "7", "--steps", "1", "--lr", "0", "--weight-decay", "0",
         "--save", init_ckpt, "--out", os.path.join(work, "init_run")])
    final_ckpt = os.path.join(work, "final.h5")
    run([BIN, *common, *SHAPE_ARGS, "--seed", "7", "--steps", str(STEPS), "--lr", str(LR), "--weight-decay",
         str(WEIGHT_DECAY), "--save", final_ckpt, "--out", os.path.join(work, "train_run")])
    check_spec_init(init_ckpt)
    config, params, _ = ref.load_checkpoint(init_ckpt)
    assert config == CONFIG, f"checkpoint config {config}, expected {CONFIG}"
    trained = recorded_losses(os.path.join(work, "train_run"))
    assert trained.shape == (STEPS,), f"/train/loss has shape {trained.shape}, expected ({STEPS},)"
    inputs, targets = ref.sequential_batch(tokens, 0, BATCH, CONFIG.context_length)
    numpy_first = ref.loss(params, config, inputs, targets)
    print(f"(i) first-step loss: llmhpc {trained[0]:.8f}  numpy {numpy_first:.8f}  rel {rel_err(trained[0], numpy_first):.2e}")
    assert rel_err(trained[0], numpy_first) <= TOLERANCE, \
        f"llmhpc's first loss {trained[0]} differs from numpy's {numpy_first} by more than {TOLERANCE}"
    assert not np.allclose(trained[1:], numpy_first), "later steps should see other batches and updated weights"
    check_decay_only_rows(params, ref.load_checkpoint(final_ckpt)[1])

    # ---- (ii) numpy's checkpoint, llmhpc's losses ----
    numpy_ckpt = os.path.join(work, "numpy_init.h5")
    ref.save_checkpoint(numpy_ckpt, CONFIG, ref.init_parameters(CONFIG, seed=99))
    out = os.path.join(work, "from_numpy")
    run([BIN, *common, "--init", numpy_ckpt, "--lr", "0", "--weight-decay", "0", "--steps", str(STEPS), "--out", out])
    losses = recorded_losses(out)
    _, numpy_params, _ = ref.load_checkpoint(numpy_ckpt)
    print("(ii) step  llmhpc        numpy         rel")
    worst = 0.0
    for step in range(STEPS):
        inputs, targets = ref.sequential_batch(tokens, step, BATCH, CONFIG.context_length)
        expected = ref.loss(numpy_params, CONFIG, inputs, targets)
        worst = max(worst, rel_err(losses[step], expected))
        print(f"     {step:4d}  {losses[step]:.8f}  {expected:.8f}  {rel_err(losses[step], expected):.2e}")
        assert rel_err(losses[step], expected) <= TOLERANCE, \
            f"step {step}: llmhpc loss {losses[step]} vs numpy {expected} (rel {rel_err(losses[step], expected):.2e})"
    assert len(set(np.round(losses, 6))) == STEPS, f"each step should see a different batch: {losses}"

    # ---- (iii) checkpoints that do not fit the model ----
    def misshapen(f):
        del f["params/layers.1.ffn.w2.weight"]
        f["params/layers.1.ffn.w2.weight"] = np.zeros((CONFIG.d_model, CONFIG.d_ff + 1), dtype=np.float32)

    def extra(f):
        f["params/layers.2.ln1.weight"] = np.ones(CONFIG.d_model, dtype=np.float32)

    def missing(f):
        del f["params/layers.0.attn.k_proj.weight"]

    expect_refused(work, numpy_ckpt, misshapen, "layers.1.ffn.w2.weight", "a wrong shape")
    expect_refused(work, numpy_ckpt, extra, "layers.2.ln1.weight", "an extra tensor")
    expect_refused(work, numpy_ckpt, missing, "layers.0.attn.k_proj.weight", "a missing tensor")

    print(f"test_reference_numpy: OK (worst relative loss error {worst:.2e})")


if __name__ == "__main__":
    main()
