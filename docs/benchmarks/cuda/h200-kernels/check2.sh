#!/bin/bash
# Second call: the model's other half arrives; the engine benchmark on CUDA, both adapters.
set -u
M=/root/m
cat $M/part0 .gpu/part1 > $M/SmolLM2-135M-Instruct.Q4_1.gguf && rm $M/part0
sha256sum $M/SmolLM2-135M-Instruct.Q4_1.gguf | tee $OUT/log.txt
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.safetensors $M/SmolLM2-135M-Instruct.Q4_1.adapter.safetensors
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.json $M/SmolLM2-135M-Instruct.Q4_1.adapter.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $OUT/log.txt
B="$M/memctl --model $M/SmolLM2-135M-Instruct.Q4_1.gguf --embedder none"
for A in "" "--adapter none"; do
  echo "== bench cuda ${A:-default adapter}" >> $OUT/bench.txt
  timeout 150 $B --device cuda $A bench engine --prefill 512,2048 --decode 128 --rewrite 128,256 --batch 4 --repeats 2 >> $OUT/bench.txt 2>&1; echo "bench cuda ${A:-default} rc=$?" >> $OUT/log.txt
done
cat $OUT/log.txt $OUT/bench.txt
