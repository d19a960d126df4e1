#!/usr/bin/env bash
# Prefill of the three installable models on an AVX2 build (x86-64-v3: no AVX-512 in the
# compiled code), the 8-bit integer products on the AVX2 kernel against f32 tiles,
# alternated in two rounds. On a CPU with AVX-512 VNNI, MEMAGENT_INTEGER_KERNEL=avx2 makes
# the integer products take the AVX2 kernel, as on a CPU without it.
#
#   RUSTFLAGS="-C target-cpu=x86-64-v3" cargo build -p memagent-cli --target-dir /work/target-v3
#   docs/benchmarks/int-prefill-avx2/run.sh /work/target-v3/debug/memctl
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
memctl=${1:?path to an x86-64-v3 memctl}
models=../../../models
lscpu | grep -E "Model name|^CPU\(s\)" > cpu.txt
for round in 1 2; do
  for model in SmolLM2-135M-Instruct.Q4_1 Qwen2.5-Coder-0.5B-Instruct gemma-3-270m-q4_k_m; do
    for path in integer tiles; do
      out="round-$round/$model-$path.json"
      mkdir -p "round-$round"
      [ -s "$out" ] && continue
      MEMAGENT_INTEGER_KERNEL=avx2 MEMAGENT_PREFILL_WEIGHTS=$path "$memctl" \
        --model "$models/$model.gguf" --adapter none -q bench engine --prefill 512,2048 \
        --decode 16 --batch 1 --projections 512 --repeats 2 --json > "$out"
    done
  done
done
