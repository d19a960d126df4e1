#!/usr/bin/env bash
# The engine against llama.cpp as both run on a CPU with AVX2 but no AVX-512: memctl
# built for x86-64-v3 with its integer products on the AVX2 kernel, llama.cpp built with
# AVX2 (no AVX-512, no AVX-VNNI), each model's two programs back to back, two rounds, 2
# threads.
#
#   RUSTFLAGS="-C target-cpu=x86-64-v3" cargo build -p memagent-cli --target-dir /work/target-v3
#   LLAMA_BIN=/path/to/avx2/llama.cpp/build/bin docs/benchmarks/avx2-vs-llama/run.sh /work/target-v3/debug/memctl
#
# llama.cpp's AVX2 build: cmake -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
# -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF -DGGML_BMI2=ON (../shared/tools/build-llama-cpp's
# source, llama-cpp-python 0.3.36).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
memctl=${1:?path to an x86-64-v3 memctl}
bin=${LLAMA_BIN:?folder of the AVX2 llama-bench}
models=../../../models
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(avx512_vnni\).*/Flags: ... avx512_vnni .../' > cpu.txt
"$bin/llama-bench" --help 2>&1 | head -1 >> cpu.txt || true
for round in 1 2; do
  mkdir -p "round-$round"
  for model in SmolLM2-135M-Instruct.Q4_1 Qwen2.5-Coder-0.5B-Instruct gemma-3-270m-q4_k_m; do
    out="round-$round/$model-memctl.json"
    [ -s "$out" ] || MEMAGENT_INTEGER_KERNEL=avx2 "$memctl" --model "$models/$model.gguf" --adapter none -q \
      bench engine --prefill 512,2048 --decode 128 --batch 4 --repeats 2 --json > "$out"
    out="round-$round/$model-llama.json"
    [ -s "$out" ] || "$bin/llama-bench" -m "$models/$model.gguf" -p 512,2048 -n 128 -t 2 -r 2 -o json > "$out"
  done
done
python3 table.py
