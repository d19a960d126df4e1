#!/usr/bin/env bash
# One sequence's decoding and four-sequence batches against llama.cpp, on both kinds of
# x86 build: native (AVX-512 where the CPU has it) against llama.cpp built with AVX-512,
# and x86-64-v3 (AVX2 alone, integer products forced onto the AVX2 kernel) against
# llama.cpp built for AVX2 alone. Each model's two programs back to back, two rounds,
# 2 threads.
#
#   cargo build -p memagent-cli                         # native (.cargo/config.toml)
#   RUSTFLAGS="-C target-cpu=x86-64-v3" cargo build -p memagent-cli --target-dir /work/target-v3
#   NATIVE_LLAMA=/path/to/avx512/llama.cpp/build/bin AVX2_LLAMA=/path/to/avx2/llama.cpp/build/bin \
#     docs/benchmarks/decode-prefetch/run.sh target/debug/memctl /work/target-v3/debug/memctl
#
# OUT=folder writes the rounds and cpu.txt there instead of beside this script (another
# machine's run: ../decode-zen4/); PREFILL=512 measures one prefill length instead of two.
#
# Both llama.cpp builds: ../shared/tools/build-llama-cpp's source (ggml 0.25.3) with
# -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON,
# then for AVX-512: -DGGML_AVX512=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_VBMI=ON
# -DGGML_AVX512_BF16=ON -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF
# -DGGML_AMX_BF16=OFF; for AVX2 alone: -DGGML_AVX512=OFF -DGGML_AVX_VNNI=OFF (see
# ../avx2-vs-llama/). The tool's own -DGGML_NATIVE=ON build compiles AMX in on this
# Xeon, and its prefill stops on an invalid instruction here (README).
set -euo pipefail
native=$(realpath "${1:?path to a native memctl}")
v3=$(realpath "${2:?path to an x86-64-v3 memctl}")
here=$(dirname "$(realpath "${BASH_SOURCE[0]}")")
mkdir -p "${OUT:=$here}"
OUT=$(realpath "$OUT")
cd "$OUT"
prefill=${PREFILL:-512,2048}
: "${NATIVE_LLAMA:?folder of the native llama-bench}" "${AVX2_LLAMA:?folder of the AVX2 llama-bench}"
models=$(realpath "$here/../../../models")
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/Flags:.*\(avx512_vnni\).*/Flags: ... avx512_vnni .../' > cpu.txt
grep -m3 -E "^(cpu family|model|stepping)\s*:" /proc/cpuinfo >> cpu.txt  # a VM names Zen 3 and Zen 4 alike
for round in 1 2; do
  for build in native avx2; do
    mkdir -p "round-$round/$build"
    for model in SmolLM2-135M-Instruct.Q4_1 Qwen2.5-Coder-0.5B-Instruct gemma-3-270m-q4_k_m; do
      out="round-$round/$build/$model-memctl.json"
      if [ ! -s "$out" ]; then
        if [ "$build" = native ]; then
          "$native" --model "$models/$model.gguf" --adapter none -q bench engine \
            --prefill "$prefill" --decode 128 --batch 4 --repeats 2 --json > "$out"
        else
          MEMAGENT_INTEGER_KERNEL=avx2 "$v3" --model "$models/$model.gguf" --adapter none -q \
            bench engine --prefill "$prefill" --decode 128 --batch 4 --repeats 2 --json > "$out"
        fi
      fi
      bin=$NATIVE_LLAMA
      [ "$build" = avx2 ] && bin=$AVX2_LLAMA
      out="round-$round/$build/$model-llama.json"
      [ -s "$out" ] || LD_LIBRARY_PATH="$bin" "$bin/llama-bench" -m "$models/$model.gguf" \
        -p "$prefill" -n 128 -t 2 -r 2 -o json > "$out"
    done
  done
done
python3 "$here/table.py" "$OUT"
