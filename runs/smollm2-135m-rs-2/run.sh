#!/usr/bin/env bash
# A second round of rejection sampling, from runs/smollm2-135m-rs's adapter: 64 new
# training documents (indices 48..111, half of them question mode) read 4 times each,
# then 40 updates on the kept conversations of both rounds; free-running validation
# after, and the training split's patterns for the gap. (Its training took every kept
# conversation alike; `memctl train --examples` now draws them per mode, which
# runs/smollm2-135m-rs-2b measures.)
#
#   runs/smollm2-135m-rs-2/run.sh      # from the repository root; resumes where it stopped
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
memctl=${MEMCTL:-target/debug/memctl}
dir=runs/smollm2-135m-rs-2
start=runs/smollm2-135m-rs/adapter.safetensors
cpu() { /usr/bin/time -f "%U %S %e" -a -o "$1" "${@:2}"; }

if [ ! -s "$dir/cpu-sample.txt" ]; then
  cpu "$dir/cpu-sample.txt" "$memctl" -q --adapter "$start" train sample --out "$dir/round2.jsonl" \
    --start 48 --count 64 --samples 4 --min-reward 1 --writer lines --general-share 0.5 \
    --data-seed 21 --json > "$dir/round2-summary.json"
fi
if [ ! -s "$dir/cpu-train.txt" ]; then
  cpu "$dir/cpu-train.txt" "$memctl" -q train --out "$dir" --steps 40 --batch 4 --lr 3e-4 \
    --warmup 5 --checkpoint-every 10 --eval-every 0 --init-from "$start" --writer lines \
    --general-share 0.7 --data-seed 22 --examples runs/smollm2-135m-rs/round1.jsonl \
    --examples "$dir/round2.jsonl" --examples-share 1 --json > /dev/null
fi
if [ ! -s "$dir/eval-validation.json" ]; then
  scripts/eval-validation --memctl "$memctl" --adapter "$dir/adapter.safetensors" --mode both \
    --count 16 --writer lines --json > "$dir/eval-validation.jsonl"
  tail -1 "$dir/eval-validation.jsonl" > "$dir/eval-validation.json"
fi
for run in runs/smollm2-135m-rs "$dir"; do
  if [ ! -s "$run/eval-train.json" ]; then
    scripts/eval-validation --memctl "$memctl" --adapter "$run/adapter.safetensors" --mode both \
      --count 16 --writer lines --split train --json > "$run/eval-train.jsonl"
    tail -1 "$run/eval-train.jsonl" > "$run/eval-train.json"
  fi
done
