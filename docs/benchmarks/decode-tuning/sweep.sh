#!/bin/bash
# tg128 at each prefetch distance, each model, two rounds interleaved; then the tuner's choices.
cd /work/main
M=${MEMCTL:-target/release/memctl}
export XDG_CACHE_HOME=${XDG_CACHE_HOME:-/tmp/decode-tuning-cache}
for round in 1 2; do
  for model in SmolLM2-135M-Instruct.Q4_1.gguf Qwen2.5-Coder-0.5B-Instruct.gguf gemma-3-270m-q4_k_m.gguf; do
    for d in 0 1024 2048 3072 4096 6144; do
      tps=$(MEMAGENT_PREFETCH_AHEAD=$d $M --model models/$model --adapter none bench engine --prefill 0 --decode 128 --rewrite --batch 1 --repeats 3 --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(round([r for r in d['results'] if r['test'].startswith('tg')][0]['tokens_per_second'],1))")
      echo "round=$round model=$model ahead=$d tg128=$tps"
    done
  done
done
for model in SmolLM2-135M-Instruct.Q4_1.gguf Qwen2.5-Coder-0.5B-Instruct.gguf gemma-3-270m-q4_k_m.gguf; do
  for i in 1 2 3 4 5; do
    rm -rf "$XDG_CACHE_HOME"
    $M --model models/$model --adapter none model info --json 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin)['decode_tuning']; print('tuner model=$model', d['prefetch_ahead'], d['source'], round(d['ms'],1), ' '.join(f\"{c['ahead']}:{c['block_ms']:.3f}/{c['samples']}\" for c in d['candidates']))"
  done
done

