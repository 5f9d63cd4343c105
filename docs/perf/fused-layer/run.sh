#!/bin/bash
# Builds and runs the fused-layer harness and the bandwidth probe (needs nvcc and an sm_90 GPU).
# Usage: run.sh            the variants quoted in README.md
set -e
cd "$(dirname "$0")"
python3 gen.py
build() { out=$1; shift; nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo "$@" -o "$out" main.cu; }
build v1-ring2 -DRING=2 & build v1-ring4 -DRING=4 & build v1-ring6 -DRING=6 & wait
build v1-noatt -DRING=4 -DNOATT & build v1-noatt-nobar -DRING=4 -DNOATT -DNOBAR &
build v1-stream -DRING=4 -DNOATT -DNOBAR -DNOSTAGE & wait
build v2-ring4 -DV2 -DRING=4 & build v2-stream -DV2 -DRING=4 -DNOATT -DNOBAR -DNOSTAGE & wait
nvcc -O3 -arch=sm_90 -std=c++17 -o bw bw.cu
for v in v1-ring2 v1-ring4 v1-ring6 v1-noatt v1-noatt-nobar v1-stream v2-ring4 v2-stream; do
  echo "== $v, context 128"; ./$v 4160 127
done
echo "== v1-ring4, context 4096"; ./v1-ring4 4160 4095
./bw
