#!/usr/bin/env bash
# Corrected readings (DAgger-style) from runs/smollm2-135m-rs (round 1). The rs adapter
# reads 64 general-mode training documents (indices 300..363), which the generator now
# writes with 29 more fact wordings, longer names and more places, 3 times each with
# the line writer; every document's best reading is kept, corrected where it fell short
# (`train sample --correct`: its fact lines kept, its other lines dropped, the oracle's
# line added for each fact it missed, at the step that states it). Then 40 updates on
# the kept conversations of round 1 (line writer), round 3 (rewrite writer) and this
# round, drawn per mode.
#
#   runs/smollm2-135m-dagger/run.sh      # from the repository root; resumes where it stopped
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source runs/readings.sh
dir=runs/smollm2-135m-dagger
start=runs/smollm2-135m-rs/adapter.safetensors

if [ ! -s "$dir/cpu-sample.txt" ]; then
  cpu "$dir/cpu-sample.txt" "$memctl" -q --adapter "$start" train sample --out "$dir/round5.jsonl" \
    --start 300 --count 64 --samples 3 --correct --writer lines --general-share 1 \
    --data-seed 21 --json > "$dir/round5-summary.json"
fi
if [ ! -s "$dir/adapter.json" ]; then
  cpu "$dir/cpu-train.txt" "$memctl" -q train --out "$dir" --steps 40 --batch 4 --lr 3e-4 \
    --warmup 5 --checkpoint-every 10 --eval-every 0 --init-from "$start" --writer lines \
    --general-share 0.7 --data-seed 27 $( [ -s "$dir/checkpoint.safetensors" ] && echo --resume ) \
    --examples runs/smollm2-135m-rs/round1.jsonl --examples runs/smollm2-135m-rs-3/round3.jsonl \
    --examples "$dir/round5.jsonl" --examples-share 1 --json > /dev/null
fi
validate "$dir" --mode general --count 16 --writer lines
