#!/usr/bin/env bash
# Round 4 from runs/smollm2-135m-rs (round 1): new wordings through the model's own
# readings. The rs adapter reads 40 training documents (indices 200..239) that the
# generator now writes with its 14 new fact wordings, 4 times each with the line writer,
# keeping the best reading that kept every fact (or answered right); then 40 updates on
# the kept conversations of rounds 1 (line writer), 3 (rewrite writer) and 4, drawn per
# mode. Supervised targets with the new wordings cost the writer 8 validation facts
# (runs/smollm2-135m-patterns); its own readings of them should not.
#
#   runs/smollm2-135m-rs-4/run.sh      # from the repository root; resumes where it stopped
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source runs/readings.sh
dir=runs/smollm2-135m-rs-4
start=runs/smollm2-135m-rs/adapter.safetensors

if [ ! -s "$dir/cpu-sample.txt" ]; then
  cpu "$dir/cpu-sample.txt" "$memctl" -q --adapter "$start" train sample --out "$dir/round4.jsonl" \
    --start 200 --count 40 --samples 4 --min-reward 1 --writer lines --general-share 0.7 \
    --data-seed 21 --json > "$dir/round4-summary.json"
fi
if [ ! -s "$dir/adapter.json" ]; then
  cpu "$dir/cpu-train.txt" "$memctl" -q train --out "$dir" --steps 40 --batch 4 --lr 3e-4 \
    --warmup 5 --checkpoint-every 10 --eval-every 0 --init-from "$start" --writer lines \
    --general-share 0.7 --data-seed 26 $( [ -s "$dir/checkpoint.safetensors" ] && echo --resume ) \
    --examples runs/smollm2-135m-rs/round1.jsonl --examples runs/smollm2-135m-rs-3/round3.jsonl \
    --examples "$dir/round4.jsonl" --examples-share 1 --json > /dev/null
fi
validate "$dir" --mode both --count 16 --writer lines
chat_fact "$dir"
