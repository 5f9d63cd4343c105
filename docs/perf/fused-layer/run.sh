#!/bin/bash
# Builds and runs the fused-layer harness and the bandwidth probe (needs nvcc and an sm_90 GPU);
# prints what README.md quotes (output.txt).
set -e
cd "$(dirname "$0")"
python3 gen.py
build() { out=$1; shift; nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo "$@" -o "$out" main.cu; }
build v1-ring2 -DRING=2 & build v1-ring4 -DRING=4 & build v1-ring6 -DRING=6 & wait
build v1-noatt -DRING=4 -DNOATT & build v1-noatt-nobar -DRING=4 -DNOATT -DNOBAR &
build v1-stream -DRING=4 -DNOATT -DNOBAR -DNOSTAGE & wait
build v2-ring4 -DV2 -DRING=4 & build v2-stream -DV2 -DRING=4 -DNOATT -DNOBAR -DNOSTAGE & wait
build v3-ring4 -DV3 -DRING=4 & build v3-noatt -DV3 -DRING=4 -DNOATT &
build v3-noatt-nobar -DV3 -DRING=4 -DNOATT -DNOBAR & wait
build v3-stream -DV3 -DRING=4 -DNOATT -DNOBAR -DNOSTAGE & build v3-gate1 -DV3 -DRING=4 -DGATE=1 &
build v3-gate2 -DV3 -DRING=4 -DGATE=2 & wait
build v3-timing -DV3 -DRING=4 -DTIMING & build v3-gate1-timing -DV3 -DRING=4 -DGATE=1 -DTIMING &
build v4-ring4 -DV4 -DRING=4 & build v4-stream -DV4 -DRING=4 -DNOATT -DNOBAR -DNOSTAGE & wait
nvcc -O3 -arch=sm_90 -std=c++17 -o bw bw.cu
for v in v1-ring2 v1-ring4 v1-ring6 v1-noatt v1-noatt-nobar v1-stream v2-ring4 v2-stream \
         v3-ring4 v3-noatt v3-noatt-nobar v3-stream v3-gate1 v3-gate2 v3-timing v3-gate1-timing \
         v4-ring4 v4-stream; do
  echo "== $v, context 128"; ./$v 4160 127
done
for v in v1-ring4 v3-ring4 v3-gate1; do echo "== $v, context 4096"; ./$v 4160 4095; done
./bw
