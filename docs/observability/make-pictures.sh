#!/usr/bin/env bash
# Draws the timelines shown in docs/observability.md: runs examples/08_timeline on the device
# CUFLOW_DEVICE names (host unless set) and renders each trace with `cuflow-bench trace-svg`
# into docs/observability/<device>-<trace>.svg. Pass --release for timings worth reading.
set -euo pipefail
cd "$(dirname "$0")/../.."
device="${CUFLOW_DEVICE:-host}"
label="${device%%:*}"
out="target/timeline-$label"
cargo_args=("$@")
CUFLOW_DEVICE="$device" cargo run -q "${cargo_args[@]}" --example 08_timeline -- "$out"
draw() {
    cargo run -q "${cargo_args[@]}" -p cuflow-bench -- trace-svg "$out/$1.json" \
        "docs/observability/$label-$1.svg" --title "$2 ($label backend)"
}
draw overlap "overlap: 8 single-block spin kernels, round-robin over 8 streams"
draw inference-eager "04_inference_loop model: one eager decode step"
draw inference-replay "04_inference_loop model: one replayed decode step (one graph launch)"
