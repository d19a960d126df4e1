#!/bin/bash
set -u
M=/root/m; mkdir -p $M
cat $M/part0 .gpu/part1 > $M/SmolLM2-135M-Instruct.Q4_1.gguf
sha256sum $M/SmolLM2-135M-Instruct.Q4_1.gguf | tee $OUT/log.txt
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.safetensors $M/SmolLM2-135M-Instruct.Q4_1.adapter.safetensors
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.json $M/SmolLM2-135M-Instruct.Q4_1.adapter.json
xz -dc .gpu/memctl.xz > $M/memctl && chmod +x $M/memctl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $OUT/log.txt
B="$M/memctl --model $M/SmolLM2-135M-Instruct.Q4_1.gguf --embedder none"
R=$OUT/cuda.txt
for A in "" "--adapter none"; do
  echo "-- adapter: ${A:-default}" >> $R
  $B --device cuda $A generate --max-tokens 48 -p "List the three primary colours, then name one fruit of each colour." >> $R 2>>$OUT/log.txt
  $B --device cuda $A ask --file examples/harbour-notes.md "When does the new harbour office open?" >> $R 2>>$OUT/log.txt
  timeout 120 $B --device cuda $A bench engine --prefill 512,2048 --decode 128 --rewrite 128,256 --batch 4 --repeats 2 >> $OUT/bench.txt 2>&1; echo "bench ${A:-default} rc=$?" >> $OUT/log.txt
done
cat $OUT/log.txt $R $OUT/bench.txt
