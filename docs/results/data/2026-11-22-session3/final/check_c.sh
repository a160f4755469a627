#!/bin/bash
# Session 3 final check, part C (H100): the fp32 model grid, every size x context.
set -u
C=carry/final3
export LD_LIBRARY_PATH=$PWD/$C/fallback OMP_NUM_THREADS=16
R=/tmp/final3c; rm -rf $R; mkdir -p $R
exec > >(tee -a "$OUT/log_c.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; date -u
timeout 420 $C/llmhpc --mode bench --device cuda --model small,medium,large,xl,2.7B --context-length 128,256,512,1024 --precision fp32 --attention flash --out $R/grid_fp32 > $R/grid_fp32.log 2>&1; echo "fp32 grid rc $?"; sed -n '/bench summary/,$p' $R/grid_fp32.log
tar czf $OUT/runs_c.tgz -C $R .
