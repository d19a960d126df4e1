#!/usr/bin/env bash
# A second round of corrected readings, larger. The round-5 adapter
# (runs/smollm2-135m-dagger) reads 200 new general-mode training documents (indices
# 364..563) twice each with the line writer, every document's best reading kept and
# corrected where it fell short (`train sample --correct`). The adapter trains from
# runs/smollm2-135m-rs (round 1) for 80 updates on the kept conversations of round 1
# (line writer), round 3 (rewrite writer) and this round, drawn per mode. Round 5 is left
# out: its documents used a name wording ("I'm {name}") the generator has since dropped
# because it taught the writer that "I'm a translator" names the user.
#
#   runs/smollm2-135m-dagger-2/run.sh    # from the repository root; resumes where it stopped
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source runs/readings.sh
dir=runs/smollm2-135m-dagger-2
reader=runs/smollm2-135m-dagger/adapter.safetensors
start=runs/smollm2-135m-rs/adapter.safetensors

[ -s "$reader" ] || runs/smollm2-135m-dagger/run.sh
if [ ! -s "$dir/cpu-sample.txt" ]; then
  cpu "$dir/cpu-sample.txt" "$memctl" -q --adapter "$reader" train sample --out "$dir/round6.jsonl" \
    --start 364 --count 200 --samples 2 --correct --writer lines --general-share 1 \
    --data-seed 21 --json > "$dir/round6-summary.json"
fi
if [ ! -s "$dir/adapter.json" ]; then
  cpu "$dir/cpu-train.txt" "$memctl" -q train --out "$dir" --steps 80 --batch 4 --lr 3e-4 \
    --warmup 5 --checkpoint-every 10 --eval-every 0 --init-from "$start" --writer lines \
    --general-share 0.7 --data-seed 28 $( [ -s "$dir/checkpoint.safetensors" ] && echo --resume ) \
    --examples runs/smollm2-135m-rs/round1.jsonl --examples runs/smollm2-135m-rs-3/round3.jsonl \
    --examples "$dir/round6.jsonl" --examples-share 1 --json > /dev/null
fi
validate "$dir" --mode general --count 16 --writer lines
