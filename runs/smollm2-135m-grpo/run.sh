#!/usr/bin/env bash
# GRPO of the line writer on a GPU, from the shipped round-1 adapter (runs/smollm2-135m-rs).
#
# 1. Here (any machine): the prompts, as the engine renders them, with the values of the
#    facts each chunk states. 256-token chunks, as the daemon and `memctl ingest` read logs.
# 2. On a machine with a CUDA GPU, PyTorch, safetensors and gguf: grpo.py from the shipped
#    adapter, adapters every 100 s (the run that made the shipped adapter: one H200, 470 s,
#    135 updates; the adapter shipped is the update-121 snapshot, chosen on the training
#    split's new documents; see eval.md).
# 3. Here: each adapter beside a copy of the shipped manifest, then the free-running scores.
#
#   runs/smollm2-135m-grpo/run.sh data          # writes $dir/steps.jsonl (not committed)
#   python3 runs/smollm2-135m-grpo/grpo.py --model models/SmolLM2-135M-Instruct.Q4_1.gguf \
#     --init adapters/SmolLM2-135M-Instruct.Q4_1/adapter.safetensors \
#     --steps runs/smollm2-135m-grpo/steps.jsonl --out OUT --seconds 470 --save-every 100 \
#     --prompts 16 --group 8 --lr 1e-4 --noise-unit line   # on the GPU machine (as run)
#   runs/smollm2-135m-grpo/run.sh eval OUT/adapter-u121.safetensors
#
# gpu1.sh and gpu2.sh are the two calls that ran it on a lent machine whose transfers
# are capped under the model's size: the first staged half the file and ran the loop on
# a tiny random-weight model, the second the other half and the run.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
dir=runs/smollm2-135m-grpo
memctl=${MEMCTL:-target/debug/memctl}
case "${1:-}" in
  data)
    "$memctl" -q train data --steps --writer lines --chunk-max 256 --general-share 1 \
      --count 2400 --data-seed 41 > "$dir/steps.jsonl" ;;
  eval)
    adapter=$2
    [ -f "${adapter%.safetensors}.json" ] || cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.json "${adapter%.safetensors}.json"
    for split in train validation; do
      count=16; [ $split = validation ] && count=32
      scripts/eval-validation --memctl "$memctl" --adapter "$adapter" --mode general \
        --count $count --writer lines --split $split --json > "$dir/eval/$(basename "${adapter%.safetensors}")-$split.jsonl"
    done ;;
  *) sed -n 2,22p "$0"; exit 1 ;;
esac
