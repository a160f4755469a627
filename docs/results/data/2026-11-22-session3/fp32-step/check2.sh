#!/bin/bash
# Call 2: llmhpc main / v1 (fused SwiGLU backward) / v3 (v1 + dQ stored by the last turn) vs
# torch.compile, medium fp32 T512/T1024 side by side; GPU tests of v3; other sizes main vs v3.
C=carry/fp32
export LD_LIBRARY_PATH=$PWD/$C/fallback:$LD_LIBRARY_PATH
S=$(date +%s); LOG=$OUT/log.txt
nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu --format=csv >> $LOG
mkdir -p /tmp/ic && tar xzf $C/indcache.tgz -C /tmp && export TORCHINDUCTOR_CACHE_DIR=/tmp/indcache
B="--mode bench --device cuda --model medium --context-length 512,1024 --precision fp32 --attention flash"
run() { v=$1; shift; echo "== $v $*" >> $OUT/bench.txt; timeout 100 $C/llmhpc_$v "$@" --out /tmp/b_$RANDOM >> $OUT/bench.txt 2>&1; echo "$v rc $? $(( $(date +%s) - S )) s" >> $LOG; }
run main $B; run v3 $B
PYTHONUNBUFFERED=1 timeout 150 python3 analysis/torch_baseline.py --model medium --context-length 512,1024 --precision fp32 --setup compiled --out $OUT/torch.jsonl > $OUT/torch.log 2>&1
echo "torch rc $? $(( $(date +%s) - S )) s" >> $LOG
run v1 $B; run v3 $B; run main $B
for t in test_flash_attn test_cuda_ops test_cuda_model; do
  timeout 100 $C/$t > /tmp/$t.log 2>&1; echo "$t rc $? $(( $(date +%s) - S )) s" >> $LOG
  grep -E "FAILED|PASSED|tests ran|Failure|error" /tmp/$t.log | head -20 >> $OUT/tests.txt
done
O="--mode bench --device cuda --model small,large --context-length 512,1024 --precision fp32 --attention flash"
run main $O; run v3 $O
Q="--mode bench --device cuda --model medium --context-length 512,1024 --precision bf16 --attention flash"
run main $Q; run v3 $Q
cat $LOG; cat $OUT/tests.txt
grep -E "^== |ms/step" $OUT/bench.txt
grep -h step $OUT/torch.log
