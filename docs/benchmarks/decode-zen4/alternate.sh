#!/usr/bin/env bash
# One sequence's decoding (tg128) of memctl and llama.cpp taken in turn, ROUNDS times per
# model, so that a noisy machine's slow minutes fall on both: the spread of `run.sh`'s two
# rounds on a shared 2-vCPU VM is larger than the difference measured.
#
#   NATIVE_LLAMA=~/.cache/memagent-ref/llama.cpp/src/build/bin \
#     docs/benchmarks/decode-zen4/alternate.sh target/release/memctl > alternate.txt
set -euo pipefail
memctl=$(realpath "${1:?path to a native memctl}")
bin=${NATIVE_LLAMA:?folder of the native llama-bench}
here=$(dirname "$(realpath "${BASH_SOURCE[0]}")")
models=$(realpath "$here/../../../models")
rounds=${ROUNDS:-4}
for model in Qwen2.5-Coder-0.5B-Instruct gemma-3-270m-q4_k_m SmolLM2-135M-Instruct.Q4_1; do
  for round in $(seq "$rounds"); do
    ours=$("$memctl" --model "$models/$model.gguf" --adapter none -q bench engine \
      --prefill 16 --decode 128 --repeats 2 --json |
      python3 -c 'import json,sys; print(next(r["tokens_per_second"] for r in json.load(sys.stdin)["results"] if r["test"] == "tg128"))')
    theirs=$(LD_LIBRARY_PATH="$bin" "$bin/llama-bench" -m "$models/$model.gguf" -p 0 -n 128 \
      -t 2 -r 2 -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0]["avg_ts"])')
    python3 -c "print(f'$model round $round: memctl {$ours:.1f} llama.cpp {$theirs:.1f} tok/s: {$ours / $theirs:.2f}x')"
  done
done
