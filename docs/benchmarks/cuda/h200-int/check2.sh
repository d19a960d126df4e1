#!/bin/bash
# Second call: the model's other half arrives; the default model on the CPU (integer
# prefill, and the f32 tiles) against CUDA, with and without the shipped adapter.
set -u
T() { /usr/bin/time -f "$1 %e s %M KB" "${@:2}"; }
M=/root/m
cat $M/part0 .gpu/part1 > $M/SmolLM2-135M-Instruct.Q4_1.gguf && rm $M/part0
sha256sum $M/SmolLM2-135M-Instruct.Q4_1.gguf | tee $OUT/log2.txt
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.safetensors $M/SmolLM2-135M-Instruct.Q4_1.adapter.safetensors
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.json $M/SmolLM2-135M-Instruct.Q4_1.adapter.json
B="$M/memctl --model $M/SmolLM2-135M-Instruct.Q4_1.gguf --embedder none"
$B model info 2>&1 | grep -i -E "prefill|adapter" >> $OUT/log2.txt
P="List the three primary colours, then name one fruit of each colour."
for run in cpu tiles cuda; do
  dev=$run; E=""; [ $run = tiles ] && { dev=cpu; E="MEMAGENT_PREFILL_WEIGHTS=tiles"; }
  R=$OUT/r-$run.txt
  for a in default none; do
    A=""; [ $a = none ] && A="--adapter none"
    echo "-- generate adapter=$a" >> $R
    T "gen-$a-$run" env $E timeout 60 $B --device $dev $A generate --max-tokens 48 -p "$P" >> $R 2>>$OUT/log2.txt
    echo "-- ask adapter=$a" >> $R
    for q in "When does the new harbour office open?" "Who will run the new harbour office?"; do
      T "ask-$a-$run" env $E timeout 60 $B --device $dev $A ask --file examples/harbour-notes.md "$q" >> $R 2>>$OUT/log2.txt
    done
    for w in lines rewrite; do
      rm -rf /tmp/d-$run-$a-$w
      T "ingest-$w-$a-$run" env $E timeout 60 $B --device $dev $A ingest --writer $w --data-dir /tmp/d-$run-$a-$w chat .gpu/chat.txt >/dev/null 2>>$OUT/log2.txt
      echo "-- memory writer=$w adapter=$a" >> $R
      $B memory show --data-dir /tmp/d-$run-$a-$w chat >> $R 2>&1
    done
  done
done
for a in cpu tiles; do cmp -s $OUT/r-$a.txt $OUT/r-cuda.txt && echo "$a and cuda outputs equal" >> $OUT/log2.txt || { echo "$a vs cuda:" >> $OUT/log2.txt; diff $OUT/r-$a.txt $OUT/r-cuda.txt >> $OUT/log2.txt; }; done
for A in "" "--adapter none"; do
  timeout 100 $B --device cuda $A bench engine --prefill 512,2048 --decode 128 --rewrite 128,256 --batch 4 --repeats 2 >> $OUT/bench2.txt 2>&1; echo "bench cuda ${A:-default} rc=$?" >> $OUT/log2.txt
done
cat $OUT/log2.txt; grep -E "pp|tg|rw|tok/s" $OUT/bench2.txt | head -30
