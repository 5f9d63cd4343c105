#!/bin/bash
# Builds and runs the whole-stack kernel (fused5.cuh) beside the per-layer one (fused3.cuh) and
# the production kernels (needs nvcc and an sm_90 GPU); prints what README.md quotes
# (output5.txt).
set -e
cd "$(dirname "$0")"
python3 gen.py
build() { out=$1; shift; nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo "$@" -o "$out" main.cu; }
build v3-ring4 -DV3 -DRING=4 & build v3-gate1 -DV3 -DRING=4 -DGATE=1 &
build v5-r6-f6 -DV5 -DRING=6 & build v5-r6-f1 -DV5 -DRING=6 -DINFLIGHT=1 &
build v5-r6-f2 -DV5 -DRING=6 -DINFLIGHT=2 & build v5-r6-f3 -DV5 -DRING=6 -DINFLIGHT=3 &
build v5-r6-f2-noatt -DV5 -DRING=6 -DINFLIGHT=2 -DNOATT & build v5-r6-f2-timing -DV5 -DRING=6 -DINFLIGHT=2 -DTIMING &
build v5-r4-f4 -DV5 -DRING=4 & wait
for v in v3-ring4 v3-gate1 v5-r4-f4 v5-r6-f6 v5-r6-f1 v5-r6-f2 v5-r6-f3 v5-r6-f2-noatt v5-r6-f2-timing; do
  echo "== $v, context 128"; timeout 60 ./$v 4160 127 || echo "exit $?"
done
for v in v3-gate1 v5-r6-f6 v5-r6-f2; do echo "== $v, context 4096"; timeout 60 ./$v 4160 4095 || echo "exit $?"; done
