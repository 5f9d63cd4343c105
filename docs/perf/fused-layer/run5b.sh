#!/bin/bash
# fused5.cuh with chunks asked of L2 ahead of the ring (AHEAD), and without attention or
# barriers, beside production (output5b.txt).
set -e
cd "$(dirname "$0")"
python3 gen.py
build() { out=$1; shift; nvcc -O3 -arch=sm_90 -std=c++17 -lineinfo "$@" -o "$out" main.cu 2>"$out.log" || { echo "build $out failed"; grep -m5 error "$out.log"; }; }
build v5-r6-f1 -DV5 -DRING=6 -DINFLIGHT=1 & build v5-r6-f1-a4 -DV5 -DRING=6 -DINFLIGHT=1 -DAHEAD=4 &
build v5-r6-f1-a8 -DV5 -DRING=6 -DINFLIGHT=1 -DAHEAD=8 & build v5-r6-f1-a16 -DV5 -DRING=6 -DINFLIGHT=1 -DAHEAD=16 &
build v5-r6-f2-a8 -DV5 -DRING=6 -DINFLIGHT=2 -DAHEAD=8 & build v5-r6-f1-a8-timing -DV5 -DRING=6 -DINFLIGHT=1 -DAHEAD=8 -DTIMING &
build v5-r6-f1-stream -DV5 -DRING=6 -DINFLIGHT=1 -DNOATT -DNOBAR -DNOSTAGE & build v5-r6-f6-stream -DV5 -DRING=6 -DNOATT -DNOBAR -DNOSTAGE &
build v5-r6-f1-a8-stream -DV5 -DRING=6 -DINFLIGHT=1 -DAHEAD=8 -DNOATT -DNOBAR -DNOSTAGE & build v5-r6-f1-timing -DV5 -DRING=6 -DINFLIGHT=1 -DTIMING & wait
for v in v5-r6-f1 v5-r6-f1-a4 v5-r6-f1-a8 v5-r6-f1-a16 v5-r6-f2-a8 v5-r6-f1-timing v5-r6-f1-a8-timing v5-r6-f1-stream v5-r6-f6-stream v5-r6-f1-a8-stream; do
  echo "== $v, context 128"; timeout 60 ./$v 4160 127 | grep -v "^production\\|plain" || echo "exit $?"
done
for v in v5-r6-f1 v5-r6-f1-a8 v5-r6-f1-a16; do echo "== $v, context 4096"; timeout 60 ./$v 4160 4095 | grep -v plain || echo "exit $?"; done
