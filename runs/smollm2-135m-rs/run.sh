#!/usr/bin/env bash
# Rejection sampling against supervised training on oracle memories, at equal CPU time,
# both from the same adapter (runs/smollm2-135m-lines-2/best.safetensors, update 100).
#
#   runs/smollm2-135m-rs/run.sh        # from the repository root; logs beside this file
#
# 1. rs: the start adapter reads 48 training documents (data seed 21) 4 times each with
#    sampling; the best reading that earned the whole reward is kept; 40 updates on the
#    kept conversations alone.
# 2. sft: the same start, options and data seed, generated oracle examples (no evidence
#    answers, which rs has none of either), as many
#    updates as the CPU seconds rs spent on sampling and training allow.
# 3. both read the validation split free-running (scripts/eval-validation, 16 + 16).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
memctl=${MEMCTL:-target/debug/memctl}
dir=runs/smollm2-135m-rs
sft=runs/smollm2-135m-rs-sft
start=runs/smollm2-135m-lines-2/best.safetensors
data=(--writer lines --general-share 0.7 --data-seed 21)
train=(--batch 4 --lr 3e-4 --warmup 5 --checkpoint-every 10 --eval-every 0 --init-from "$start")
cpu() { /usr/bin/time -f "%U %S %e" -a -o "$1" "${@:2}"; }

if [ ! -s "$dir/cpu-sample.txt" ]; then
  cpu "$dir/cpu-sample.txt" "$memctl" -q --adapter "$start" train sample --out "$dir/round1.jsonl" \
    --count 48 --samples 4 --min-reward 1 "${data[@]}" --json > "$dir/round1-summary.json"
fi
if [ ! -s "$dir/cpu-train.txt" ]; then
  cpu "$dir/cpu-train.txt" "$memctl" -q train --out "$dir" --steps 40 "${train[@]}" "${data[@]}" \
    --examples "$dir/round1.jsonl" --examples-share 1 --json > /dev/null
fi
rs_cpu=$(cat "$dir"/cpu-sample.txt "$dir"/cpu-train.txt | awk '{s += $1 + $2} END {print s}')
per_update=$(awk '{print ($1 + $2) / 40}' "$dir/cpu-train.txt")
steps=$(awk -v t="$rs_cpu" -v u="$per_update" 'BEGIN {print int(t / u + 0.5)}')
echo "rs: $rs_cpu CPU seconds; sft gets $steps updates at $per_update CPU seconds each"
if [ ! -s "$sft/cpu-train.txt" ]; then
  mkdir -p "$sft"
  cpu "$sft/cpu-train.txt" "$memctl" -q train --out "$sft" --steps "$steps" "${train[@]}" "${data[@]}" \
    --json > /dev/null
fi
for run in "$dir" "$sft"; do
  if [ ! -s "$run/eval-validation.json" ]; then
    scripts/eval-validation --memctl "$memctl" --adapter "$run/adapter.safetensors" --mode both \
      --count 16 --writer lines --json > "$run/eval-validation.jsonl"
    tail -1 "$run/eval-validation.jsonl" > "$run/eval-validation.json"
  fi
done
