#!/usr/bin/env bash
# Question mode on more wordings: from runs/smollm2-135m-rs (round 1), 40 updates where
# half the examples are kept conversations of rounds 1 (line writer) and 3 (rewrite
# writer), which anchor the general writers, and half are the generator's question-mode
# trajectories only (`--generated-general-share 0`), variable tracking now with six
# assignment and six copy wordings. Free-running validation and the chat-fact test after.
#
#   runs/smollm2-135m-vt/run.sh      # from the repository root; resumes where it stopped
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source runs/readings.sh
dir=runs/smollm2-135m-vt
start=runs/smollm2-135m-rs/adapter.safetensors

if [ ! -s "$dir/adapter.json" ]; then
  cpu "$dir/cpu-train.txt" "$memctl" -q train --out "$dir" --steps 40 --batch 4 --lr 3e-4 \
    --warmup 5 --checkpoint-every 10 --eval-every 0 --init-from "$start" --writer lines \
    --general-share 0.7 --generated-general-share 0 --data-seed 25 \
    $( [ -s "$dir/checkpoint.safetensors" ] && echo --resume ) \
    --examples runs/smollm2-135m-rs/round1.jsonl --examples runs/smollm2-135m-rs-3/round3.jsonl \
    --examples-share 0.5 --json > /dev/null
fi
validate "$dir" --mode both --count 16 --writer lines
chat_fact "$dir"
