#!/usr/bin/env bash
# A reader adapter for answers from chat passages: 60 updates on generated chat
# exchanges (a few dated turns of two people, the fact said in a reply), then LoCoMo's
# development half read with it. Under a minute of training on 2 cores; the shipped
# reader (adapters/SmolLM2-135M-Instruct.Q4_1/reader.safetensors) is this run's.
#   runs/smollm2-135m-reader/run.sh [OUT]
set -euo pipefail
out="${1:-runs/smollm2-135m-reader/out}"
memctl --adapter none train --out "$out" --steps 60 --batch 2 --lr 2e-3 --warmup 4 \
    --evidence-share 1 --dialogue-share 1 --general-share 0 --eval-every 0
# The passages of named speakers' chats are read with it (--no-memory: no memory steps).
memctl --reader "$out/adapter.safetensors" bench qa \
    --data ../shared/data/locomo-dev/locomo-dev.json --every 4 --no-memory --out "$out/qa"
