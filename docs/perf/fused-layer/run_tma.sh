#!/bin/bash
# Builds and runs tma_gemv.cu (needs nvcc and an sm_90 GPU); prints output-tma.txt.
set -e
cd "$(dirname "$0")"
python3 gen.py
nvcc -O3 -arch=sm_90 -std=c++17 -DRING=4 -o tma4 tma_gemv.cu 2>tma4.log || { grep -m10 error tma4.log; exit 1; } &
wait
./tma4
