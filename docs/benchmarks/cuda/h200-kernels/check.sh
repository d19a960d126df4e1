#!/bin/bash
# Second call: the model's other half arrives; CPU vs CUDA on the default model.
set -u
T() { /usr/bin/time -f "$1 %e s %M KB" "${@:2}"; }
M=/root/m
cat $M/part0 .gpu/part1 > $M/SmolLM2-135M-Instruct.Q4_1.gguf && rm $M/part0
sha256sum $M/SmolLM2-135M-Instruct.Q4_1.gguf | tee $OUT/log.txt
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.safetensors $M/SmolLM2-135M-Instruct.Q4_1.adapter.safetensors
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.json $M/SmolLM2-135M-Instruct.Q4_1.adapter.json
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a $OUT/log.txt
B="$M/memctl --model $M/SmolLM2-135M-Instruct.Q4_1.gguf --embedder none"
P="List the three primary colours, then name one fruit of each colour."
for dev in cpu cuda; do
  R=$OUT/$dev.txt
  for a in default none; do
    A=""; [ $a = none ] && A="--adapter none"
    echo "-- generate adapter=$a" >> $R
    T "gen-$a-$dev" timeout 60 $B --device $dev $A generate --max-tokens 48 -p "$P" >> $R 2>>$OUT/log.txt
    echo "-- ask adapter=$a" >> $R
    for q in "When does the new harbour office open?" "Who will run the new harbour office?"; do
      T "ask-$a-$dev" timeout 60 $B --device $dev $A ask --file examples/harbour-notes.md "$q" >> $R 2>>$OUT/log.txt
    done
    for w in lines rewrite; do
      rm -rf /tmp/d-$dev-$a-$w
      T "ingest-$w-$a-$dev" timeout 60 $B --device $dev $A ingest --writer $w --data-dir /tmp/d-$dev-$a-$w chat .gpu/chat.txt >/dev/null 2>>$OUT/log.txt
      echo "-- memory writer=$w adapter=$a" >> $R
      $B memory show --data-dir /tmp/d-$dev-$a-$w chat >> $R 2>&1
    done
  done
done
cmp -s $OUT/cpu.txt $OUT/cuda.txt && echo "cpu and cuda outputs equal" >> $OUT/log.txt || diff $OUT/cpu.txt $OUT/cuda.txt >> $OUT/log.txt
for A in "" "--adapter none"; do
  timeout 100 $B --device cuda $A bench engine --prefill 512,2048 --decode 128 --rewrite 128,256 --batch 4 --repeats 2 >> $OUT/bench.txt 2>&1; echo "bench cuda ${A:-default} rc=$?" >> $OUT/log.txt
done
cat $OUT/log.txt $OUT/bench.txt
