#!/bin/bash
# Builds and runs the attention + output projection harness (needs nvcc and an sm_90 GPU);
# prints what output.txt holds. The production kernels' CUDA C comes from ../fused-layer/gen.py.
set -e
cd "$(dirname "$0")"
(cd ../fused-layer && python3 gen.py)
cp ../fused-layer/attention_gen.cuh ../fused-layer/gemv_gen.cuh .
b() { nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo -o ao-$1 -DRC=$1 ao.cu; }
b 16 & b 8 & b 32 & wait
for rc in 16 8 32; do ./ao-$rc 4160 127; done
./ao-16 4160 511
./ao-16 4160 2047
