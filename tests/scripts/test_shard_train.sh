#!/usr/bin/env bash
# Optimizer state sharding end to end: mode train on 2 ranks with --shard-optimizer none,
# broadcast and zero1 writes bitwise the same losses and checkpoints (parameters and the
# whole optimizer state, in the unsharded layout), each rank keeping 1/n of m and v (its
# records' memory attributes), under bf16 too (the masters travelling, or the bf16 copy:
# --share-weights bf16, the default, whose checkpoint gathers the masters); a checkpoint saved under zero1 on 2 ranks goes
# on under any sharding on 1, 3 and 4 ranks; mode ddp sweeps the shardings and prints the
# memory table.
# ZeRO-2 and ZeRO-3 (src/dist/unit_shards.h): --shard-optimizer zero2 and zero3 write bitwise the
# unsharded run's losses and checkpoint (gathered into the unsharded layout), in fp32 and bf16; a
# zero3 checkpoint of 2 ranks goes on on 3 ranks under zero3 exactly as under no sharding, and that
# one on 1 rank likewise; each rank keeps 1/n of the masters, gradients and optimizer state; mode
# ddp sweeps the stages; hybrid sharding (--shard-group, zero1 and zero3) on 4 ranks trains as
# unsharded DDP; bad
# combinations are refused on every rank.
source "$(dirname "$0")/mpi_script.sh"

${LLMHPC_PYTHON:-python3} -c "import numpy as np; np.random.default_rng(0).integers(0, 100, 20000, dtype=np.uint16).tofile('tokens.bin')" ||
  { echo "FAIL: could not write the token file (numpy)"; exit 1; }
TINY="--d-model 32 --d-ff 64 --num-layers 2 --num-heads 4 --vocab-size 100 --context-length 16 --batch-size 12"
TRAIN="--mode train --device cpu --data tokens.bin $TINY --data-order sequential --lr 3e-3"

for sharding in none broadcast zero1; do
  run 2 $TRAIN --steps 10 --ddp bucketed --bucket-mb 0.02 --shard-optimizer $sharding --save $sharding.h5 \
    --out train_$sharding
done
for sharding in none zero1; do
  run 2 $TRAIN --precision bf16 --steps 10 --ddp bucketed --bucket-mb 0.02 --shard-optimizer $sharding \
    --share-weights master --save bf16_$sharding.h5 --out bf16_train_$sharding
done
# --share-weights left at auto: the bf16 copy travels.
run 2 $TRAIN --precision bf16 --steps 10 --ddp bucketed --bucket-mb 0.02 --shard-optimizer zero1 \
  --save bf16_zero1_copy.h5 --save-every 4 --out bf16_train_zero1_copy
# Resume the zero1 checkpoint elsewhere: other world sizes and shardings.
run 1 $TRAIN --steps 2 --init zero1.h5 --shard-optimizer none --save resumed_1.h5 --out resumed_1
run 3 $TRAIN --steps 2 --init zero1.h5 --ddp flat --shard-optimizer broadcast --save resumed_3.h5 --out resumed_3
run 4 $TRAIN --steps 2 --init zero1.h5 --ddp overlap --shard-optimizer zero1 --save resumed_4.h5 --out resumed_4
run 2 --mode ddp --device cpu $TINY --steps 2 --warmup 1 --ddp none,bucketed --shard-optimizer none,broadcast,zero1 \
  --out ddp
cp "$WORK/log" ddp.log

# ZeRO-2 and ZeRO-3.
for stage in none zero2 zero3; do
  run 2 $TRAIN --ddp bucketed --steps 10 --shard-optimizer $stage --save zero_$stage.h5 --out zero_train_$stage
  run 2 $TRAIN --ddp bucketed --steps 6 --precision bf16 --shard-optimizer $stage --save zero_bf16_$stage.h5 --out zero_bf16_$stage
done
# 2 ranks -> 3 ranks -> 1 rank: the sharded resume against the unsharded one, from the same file.
for stage in none zero3; do
  run 3 $TRAIN --ddp bucketed --steps 3 --init zero_zero3.h5 --shard-optimizer $stage --save on3_$stage.h5 --out on3_$stage
done
for stage in none zero3; do
  run 1 $TRAIN --ddp bucketed --steps 2 --init on3_zero3.h5 --shard-optimizer $stage --save on1_$stage.h5 --out on1_$stage
done
run 2 --mode ddp --device cpu $TINY --steps 2 --warmup 1 --ddp bucketed --shard-optimizer none,zero1,zero2,zero3 \
  --out zero_ddp
# Hybrid sharding: zero3 within groups of 2 ranks, replicated across 2 groups; one rank per group
# (nothing sharded, every rank a replica) gives DDP's own reduction.
run 4 $TRAIN --ddp bucketed --steps 6 --shard-optimizer none --save hyb_none.h5 --out hyb_none
run 4 $TRAIN --ddp bucketed --steps 6 --shard-optimizer zero3 --shard-group 2 --save hyb_zero3.h5 --out hyb_zero3
run 2 $TRAIN --ddp bucketed --steps 6 --shard-optimizer zero2 --shard-group 1 --save hyb1_zero2.h5 --out hyb1_zero2
run 2 $TRAIN --ddp bucketed --steps 6 --shard-optimizer none --save hyb1_none.h5 --out hyb1_none
# zero1 likewise: within groups of 2, and in groups of one (every rank a replica).
run 4 $TRAIN --ddp bucketed --steps 6 --shard-optimizer zero1 --shard-group 2 --save hyb_zero1.h5 --out hyb_zero1
run 2 $TRAIN --ddp bucketed --steps 6 --shard-optimizer zero1 --shard-group 1 --save hyb1_zero1.h5 --out hyb1_zero1
# Micro-batches: each unit's gradients added up in a window of its own, reduced in the last one.
run 2 $TRAIN --ddp bucketed --steps 4 --grad-accum 2 --shard-optimizer none --save accum_none.h5 --out accum_none
run 2 $TRAIN --ddp bucketed --steps 4 --grad-accum 2 --shard-optimizer zero3 --save accum_zero3.h5 --out accum_zero3
refused 4 "does not divide the 4 data-parallel ranks" $TRAIN --ddp bucketed --steps 1 --shard-optimizer zero3 --shard-group 3
refused 2 "leave it out" $TRAIN --ddp bucketed --steps 1 --shard-optimizer none --shard-group 2
refused 4 "averages its parts over the groups in the gradients' own dtype" $TRAIN --ddp bucketed --steps 1 \
  --shard-optimizer zero1 --shard-group 2 --grad-reduce-dtype bf16

refused 2 "its buckets are the units" $TRAIN --ddp bucketed --steps 1 --shard-optimizer zero3 --ddp overlap
refused 2 "use --grad-dtype bf16" $TRAIN --ddp bucketed --steps 1 --shard-optimizer zero2 --grad-reduce-dtype bf16
refused 1 "applies to broadcast and zero1" $TRAIN --ddp bucketed --steps 1 --precision bf16 --shard-optimizer zero3 \
  --share-weights bf16

python3 - "$(cd "$(dirname "$0")" && pwd)" <<'PY'
import os
import sys
sys.path.insert(0, sys.argv[1])
import h5py
import numpy as np
from checks import check, datasets, finish

none = datasets("none.h5")
check("optimizer/m/lm_head.weight" in none and "optimizer/step" in none, "the unsharded checkpoint has optimizer state")
for sharding in ("broadcast", "zero1"):
    mine = datasets(f"{sharding}.h5")
    check(mine.keys() == none.keys(), f"{sharding}: the unsharded checkpoint's layout")
    check(all(np.array_equal(mine[k], none[k]) for k in none),
          f"{sharding}: parameters and m, v bitwise the unsharded run's")

bf16 = datasets("bf16_none.h5")
check(not np.array_equal(bf16["params/lm_head.weight"], none["params/lm_head.weight"]), "bf16 trains otherwise than fp32")
check(all(np.array_equal(datasets("bf16_zero1.h5")[k], bf16[k]) for k in bf16),
      "bf16 zero1: parameters and m, v bitwise the unsharded bf16 run's")
check(all(np.array_equal(datasets("bf16_zero1_copy.h5")[k], bf16[k]) for k in bf16),
      "bf16 zero1 with the bf16 copy shared (checkpoints every 4 steps): bitwise the unsharded bf16 run's")
with h5py.File("bf16_train_zero1_copy/rank00000.h5", "r") as f:
    check(f["train"].attrs["share_weights"] == "bf16", "--share-weights auto recorded as what it chose: bf16")
with h5py.File("bf16_train_zero1/rank00000.h5", "r") as f:
    check(f["train"].attrs["share_weights"] == "master", "--share-weights master recorded")

for sharding in ("none", "broadcast", "zero1"):
    ranks = []
    for r in range(2):
        with h5py.File(f"train_{sharding}/rank{r:05d}.h5", "r") as f:
            g = f["train"]
            ranks.append(({k: g.attrs[k] for k in g.attrs}, g["loss"][()]))
    with h5py.File("train_none/rank00000.h5", "r") as f:
        want_loss = f["train/loss"][()]
    attrs = ranks[0][0]
    check(np.array_equal(ranks[0][1], want_loss), f"{sharding}: losses bitwise the unsharded run's")
    check(attrs["shard_optimizer"] == sharding, f"{sharding}: recorded as such")
    params = int(attrs["memory_after_init_params_bytes"]) // 4
    for rank, (a, _) in enumerate(ranks):
        owned = int(a["optimizer_owned_elements"])
        opt_bytes = int(a["memory_after_optimizer_optimizer_bytes"])
        share = params if sharding == "none" else params / 2
        check(opt_bytes == 2 * 4 * owned and abs(owned - share) < 64,
              f"{sharding} rank {rank}: m and v of {owned} elements ({opt_bytes} bytes), {share:.0f} expected within 64")
        check(int(a["memory_before_optimizer_optimizer_bytes"]) == 0, f"{sharding}: no state before the first step")
        parts = [k for k in a if k.startswith("memory_after_optimizer_") and k.endswith("_bytes")
                 and k != "memory_after_optimizer_bytes"]
        check(sum(int(a[k]) for k in parts) == int(a["memory_after_optimizer_bytes"]), f"{sharding}: categories add up")

for np_, path in ((1, "resumed_1"), (3, "resumed_3"), (4, "resumed_4")):
    with h5py.File(f"{path}/rank00000.h5", "r") as f:
        g = f["train"]
        check(g.attrs["status"] == "ok" and g.attrs["first_step"] == 11, f"{path}: resumed at step 11 on {np_} rank(s)")
    check(int(datasets(f"{path}.h5")["optimizer/step"]) == 12, f"{path}: saved after step 12")

with h5py.File("ddp/rank00000.h5", "r") as f:
    recs = {name: dict(g.attrs) for name, g in f["ddp"].items()}
labels = sorted(recs)
check(len(recs) == 4 and any(l.endswith("_zero1") for l in labels) and any(l.endswith("_broadcast") for l in labels),
      f"ddp: none, and bucketed x 3 shardings ({labels})")
by = {r["shard_optimizer"]: r for r in recs.values() if r["ddp"] == "bucketed"}
padding = 2 * 64  # zero1 pads the buffer by less than ranks x 64 elements
state = {k: int(r["memory_after_optimizer_optimizer_bytes"]) for k, r in by.items()}
check(abs(2 * state["zero1"] - state["none"]) <= 8 * padding, f"ddp: zero1 keeps half the optimizer state ({state})")
bus = {k: int(r["comm_bus_bytes_per_step"]) for k, r in by.items()}
check(abs(bus["zero1"] - bus["none"]) <= 4 * padding and bus["broadcast"] > bus["none"],
      f"ddp: zero1 moves what DDP moves, broadcast more ({bus})")
log = open("ddp.log").read()
check("ddp memory of rank 0 by category" in log and "optimizer" in log, "ddp: the memory table is printed")

# ZeRO-2 and ZeRO-3.
def same(a, b):
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)

for prefix in ("", "bf16_"):
    none = datasets(f"zero_{prefix}none.h5")
    check("optimizer/m/lm_head.weight" in none, f"{prefix}none: a checkpoint with optimizer state")
    for stage in ("zero2", "zero3"):
        check(same(datasets(f"zero_{prefix}{stage}.h5"), none),
              f"{prefix or 'fp32 '}{stage}: parameters and m, v bitwise the unsharded run's")

check(same(datasets("on3_zero3.h5"), datasets("on3_none.h5")),
      "a zero3 checkpoint of 2 ranks goes on on 3 ranks under zero3 bitwise as unsharded")
check(same(datasets("on1_zero3.h5"), datasets("on1_none.h5")),
      "and that one on 1 rank under zero3 bitwise as unsharded")
check(int(datasets("on1_zero3.h5")["optimizer/step"]) == 15, "2 + 3 ranks' steps: saved after step 15")
flat4 = datasets("hyb_none.h5")
for stage in ("zero1", "zero3"):
    hyb = datasets(f"hyb_{stage}.h5")
    err = max(float(np.max(np.abs(hyb[k] - flat4[k])) / max(float(np.max(np.abs(flat4[k]))), 1e-30)) for k in flat4
              if k.startswith(("params/", "optimizer/m/", "optimizer/v/")))
    # A group's average then the groups' average adds the 4 ranks' gradients in another order than
    # one all-reduce of 4: the weights and the state agree to the rounding of the sums.
    check(hyb.keys() == flat4.keys() and err < 1e-5,
          f"hybrid {stage} (2 groups of 2) trains as unsharded DDP on 4 ranks, its checkpoint whole ({err:.1e})")
for stage in ("zero1", "zero2"):
    check(same(datasets(f"hyb1_{stage}.h5"), datasets("hyb1_none.h5")),
          f"{stage} in groups of one rank (replicated, the gradients averaged across) bitwise DDP on 2 ranks")
check(same(datasets("accum_zero3.h5"), datasets("accum_none.h5")),
      "zero3 with 2 micro-batches a step: bitwise the unsharded run's with them")
with h5py.File("hyb_zero3/rank00003.h5", "r") as f:
    check(int(f["train"].attrs["shard_group"]) == 2, "the group size recorded")
# The report's train table says the state was cut in groups (analysis/train.py).
sys.path.insert(0, os.path.join(sys.argv[1], "..", "..", "analysis"))
import train as train_report  # noqa: E402
from llmhpc_h5 import open_run  # noqa: E402
table = train_report.report_section([open_run("hyb_zero3"), open_run("hyb_none")], ".")
check("| zero3 in groups of 2 |" in table and "| none |" in table,
      "the report's train table names hybrid zero3's groups:\n" + table[:600])

def train_records(path, ranks):
    out = []
    for r in range(ranks):
        with h5py.File(f"{path}/rank{r:05d}.h5", "r") as f:
            g = f["train"]
            out.append(({k: g.attrs[k] for k in g.attrs}, g["loss"][()]))
    return out

want = train_records("zero_train_none", 1)[0][1]
for stage in ("zero2", "zero3"):
    recs = train_records(f"zero_train_{stage}", 2)
    for rank, (a, loss) in enumerate(recs):
        check(np.array_equal(loss, want), f"{stage} rank {rank}: losses bitwise the unsharded run's")
        check(a["shard_optimizer"] == stage, f"{stage}: recorded as such")
        params = int(train_records("zero_train_none", 1)[0][0]["memory_after_init_params_bytes"]) // 4
        owned = int(a["optimizer_owned_elements"])
        check(abs(owned - params / 2) < 8 * 64, f"{stage} rank {rank}: updates {owned} of {params} elements")
        opt = int(a["memory_after_optimizer_optimizer_bytes"])
        check(opt == 2 * 4 * owned, f"{stage} rank {rank}: m and v of its shard only ({opt} bytes)")

with h5py.File("zero_ddp/rank00000.h5", "r") as f:
    recs = {g.attrs["shard_optimizer"]: dict(g.attrs) for g in f["ddp"].values()}
check(sorted(recs) == ["none", "zero1", "zero2", "zero3"], f"ddp: one case per stage ({sorted(recs)})")
state = {k: int(r["memory_after_optimizer_optimizer_bytes"]) for k, r in recs.items()}
check(all(abs(2 * state[k] - state["none"]) <= 8 * 4 * 64 * 8 for k in ("zero1", "zero2", "zero3")),
      f"ddp: the stages keep half the optimizer state ({state})")
# Between steps a rank holds its shard of the masters and m and v: the gradients go after the
# optimizer; zero2 keeps every unit's weights gathered too, zero3 none.
for k in ("zero2", "zero3"):
    check(int(recs[k]["memory_after_optimizer_grads_bytes"]) == 0, f"ddp {k}: no gradients between steps")
params = {k: int(recs[k]["memory_after_optimizer_params_bytes"]) for k in ("zero2", "zero3")}
check(params["zero3"] == 4 * int(recs["zero3"]["optimizer_owned_elements"]) < params["zero2"],
      f"ddp: zero3 holds its shard of the masters only, zero2 the gathered weights too ({params})")
check(int(recs["zero3"]["param_comm_bytes_per_step"]) > int(recs["zero2"]["param_comm_bytes_per_step"]),
      "ddp: zero3 gathers the layers again for backward")
finish()
PY
