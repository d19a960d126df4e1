#!/usr/bin/env bash
# Round 3 from runs/smollm2-135m-rs (round 1): keep both writers and teach question mode.
# The rs adapter reads 20 new general-mode training documents (indices 112..131) 4 times
# each with the rewrite writer (the daemon's and the published protocol's) and keeps the
# best reading that kept at least half the facts (the rewrite writer seldom keeps all), so that a
# round of line-writer readings no longer wears that writer down; then 40 updates on the
# kept conversations of round 1 (line writer), round 2 (line writer) and this round
# (rewrite writer), drawn per mode, with question-mode examples that no round earned
# filled in from the generator's oracle trajectories.
#
#   runs/smollm2-135m-rs-3/run.sh      # from the repository root; resumes where it stopped
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source runs/readings.sh
dir=runs/smollm2-135m-rs-3
start=runs/smollm2-135m-rs/adapter.safetensors

if [ ! -s "$dir/cpu-sample.txt" ]; then
  cpu "$dir/cpu-sample.txt" "$memctl" -q --adapter "$start" train sample --out "$dir/round3.jsonl" \
    --start 112 --count 20 --samples 4 --min-reward 0.5 --writer rewrite --general-share 1 \
    --data-seed 21 --json > "$dir/round3-summary.json"
fi
if [ ! -s "$dir/cpu-train.txt" ]; then
  cpu "$dir/cpu-train.txt" "$memctl" -q train --out "$dir" --steps 40 --batch 4 --lr 3e-4 \
    --warmup 5 --checkpoint-every 10 --eval-every 0 --init-from "$start" --writer lines \
    --general-share 0.7 --generated-general-share 0 --evidence-share 0.25 --data-seed 23 \
    --examples runs/smollm2-135m-rs/round1.jsonl --examples runs/smollm2-135m-rs-2/round2.jsonl \
    --examples "$dir/round3.jsonl" --examples-share 0.6 --json > /dev/null
fi
validate "$dir" --mode both --count 16 --writer lines
validate_as eval-validation-rewrite "$dir" --mode general --count 16 --writer rewrite
chat_fact "$dir"
