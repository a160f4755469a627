#!/bin/bash
# Session 3 final check, part B (H100): the model grid, bf16 every size x context, fp32 where
# the comparison is close; 2.7B bf16 ctx512 forward+backward (the MFU target).
set -u
C=carry/final3
export LD_LIBRARY_PATH=$PWD/$C/fallback OMP_NUM_THREADS=16 PYTHONUNBUFFERED=1
R=/tmp/final3b; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log_b.txt") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s]"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 200 $C/llmhpc --mode bench --device cuda --model small,medium,large,xl,2.7B --context-length 128,256,512,1024 --precision bf16 --attention flash --out $R/grid_bf16 > $R/grid_bf16.log 2>&1; echo "bf16 grid rc $? $(el)"; sed -n '/bench summary/,$p' $R/grid_bf16.log
timeout 60 $C/llmhpc --mode bench --device cuda --model 2.7B --context-length 512 --precision bf16 --attention flash --phase forward-backward --out $R/m27_fb > $R/m27_fb.log 2>&1; echo "2.7B fwd+bwd rc $? $(el)"; sed -n '/bench summary/,$p' $R/m27_fb.log
timeout 200 $C/llmhpc --mode bench --device cuda --model small,medium --context-length 512,1024 --precision fp32 --attention flash --out $R/fp32_a > $R/fp32_a.log 2>&1; echo "fp32 a rc $? $(el)"; sed -n '/bench summary/,$p' $R/fp32_a.log
timeout 100 $C/llmhpc --mode bench --device cuda --model medium --context-length 512,1024 --precision fp32 --attention flash --out $R/fp32_b > $R/fp32_b.log 2>&1; echo "fp32 b rc $? $(el)"; sed -n '/bench summary/,$p' $R/fp32_b.log
tar czf $OUT/runs_b.tgz -C $R . ; echo "done $(el)"
