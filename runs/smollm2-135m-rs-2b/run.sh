#!/usr/bin/env bash
# Round 2 again with its kept conversations drawn per mode: the same start
# (runs/smollm2-135m-rs) and samples files (rounds 1 and 2), 40 updates, general-mode
# conversations drawn with probability 0.7 (--general-share) whatever their count.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
memctl=${MEMCTL:-target/debug/memctl}
dir=runs/smollm2-135m-rs-2b
if [ ! -s "$dir/cpu-train.txt" ]; then
  /usr/bin/time -f "%U %S %e" -a -o "$dir/cpu-train.txt" "$memctl" -q train --out "$dir" \
    --steps 40 --batch 4 --lr 3e-4 --warmup 5 --checkpoint-every 10 --eval-every 0 \
    --init-from runs/smollm2-135m-rs/adapter.safetensors --writer lines --general-share 0.7 \
    --data-seed 22 --examples runs/smollm2-135m-rs/round1.jsonl \
    --examples runs/smollm2-135m-rs-2/round2.jsonl --examples-share 1 --json > /dev/null
fi
if [ ! -s "$dir/eval-validation.json" ]; then
  scripts/eval-validation --memctl "$memctl" --adapter "$dir/adapter.safetensors" --mode both \
    --count 16 --writer lines --json > "$dir/eval-validation.jsonl"
  tail -1 "$dir/eval-validation.jsonl" > "$dir/eval-validation.json"
fi
