#!/usr/bin/env bash
# The line writer on more wordings of each fact: from runs/smollm2-135m-rs (round 1),
# 60 updates where half the examples are the generator's line-writer and question-mode
# trajectories with the training split's 14 new fact wordings (general share 0.7) and
# half are kept conversations of rounds 1 (line writer) and 3 (rewrite writer), which
# anchor both writers to readings that kept their facts. Free-running validation and the
# chat-fact test after.
#
#   runs/smollm2-135m-patterns/run.sh      # from the repository root; resumes where it stopped
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
source runs/readings.sh
dir=runs/smollm2-135m-patterns
start=runs/smollm2-135m-rs/adapter.safetensors

if [ ! -s "$dir/adapter.safetensors" ]; then
  cpu "$dir/cpu-train.txt" "$memctl" -q train --out "$dir" --steps 60 --batch 4 --lr 3e-4 \
    --warmup 5 --checkpoint-every 10 --eval-every 0 --init-from "$start" --writer lines \
    --general-share 0.7 --data-seed 24 $( [ -s "$dir/checkpoint.safetensors" ] && echo --resume ) \
    --examples runs/smollm2-135m-rs/round1.jsonl --examples runs/smollm2-135m-rs-3/round3.jsonl \
    --examples-share 0.5 --json > /dev/null
fi
validate "$dir" --mode both --count 16 --writer lines
chat_fact "$dir"
validate_as eval-train "$dir" --mode general --split train --count 16 --writer lines
