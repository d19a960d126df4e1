#!/bin/bash
# Third call: the default model's last part arrives; the default model with its shipped
# adapter and without, on the CPU against CUDA: a prompt continued, two questions about
# one document, a chat log's memory; then bench engine on the GPU.
set -u
T() { /usr/bin/time -f "$1 %e s %M KB" "${@:2}"; }
M=/root/m
cat $M/part0 $M/part1 .gpu3/part2 > $M/SmolLM2-135M-Instruct.Q4_1.gguf && rm -f $M/part0 $M/part1
sha256sum $M/SmolLM2-135M-Instruct.Q4_1.gguf | tee $OUT/log.txt
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.safetensors $M/SmolLM2-135M-Instruct.Q4_1.adapter.safetensors
cp adapters/SmolLM2-135M-Instruct.Q4_1/adapter.json $M/SmolLM2-135M-Instruct.Q4_1.adapter.json
if ldd $M/memctl | grep -q "not found"; then export LD_LIBRARY_PATH=$(find /usr /opt /lib -xdev \( -name libcuda.so.1 -o -name libcublas.so.13 -o -name libcurand.so.10 -o -name libcudart.so.13 \) -printf "%h\n" 2>/dev/null | sort -u | tr "\n" ":"); echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH" >> $OUT/log.txt; fi
ldd $M/memctl | grep -E "cu|not found" >> $OUT/log.txt
B="$M/memctl --model $M/SmolLM2-135M-Instruct.Q4_1.gguf --embedder none"
$B model info >> $OUT/log.txt 2>&1
P="List the three primary colours, then name one fruit of each colour."
for dev in cpu cuda; do
  R=$OUT/r-$dev.txt
  for a in default none; do
    A=""; [ $a = none ] && A="--adapter none"
    echo "-- generate adapter=$a" >> $R
    T "gen-$a-$dev" timeout 60 $B --device $dev $A generate --max-tokens 48 -p "$P" >> $R 2>>$OUT/log.txt
    echo "-- ask adapter=$a" >> $R
    for q in "When does the new harbour office open?" "Who will run the new harbour office?"; do
      T "ask-$a-$dev" timeout 60 $B --device $dev $A ask --file examples/harbour-notes.md "$q" >> $R 2>>$OUT/log.txt
    done
    rm -rf /tmp/d-$dev-$a
    T "ingest-$a-$dev" timeout 90 $B --device $dev $A --data-dir /tmp/d-$dev-$a ingest chat examples/chat.jsonl --format chat-jsonl >/dev/null 2>>$OUT/log.txt
    echo "-- memory adapter=$a" >> $R
    $B --data-dir /tmp/d-$dev-$a memory show chat >> $R 2>&1
    echo "-- query adapter=$a" >> $R
    T "query-$a-$dev" timeout 60 $B --device $dev $A --data-dir /tmp/d-$dev-$a query chat "Where does my sister live?" >> $R 2>>$OUT/log.txt
  done
done
cmp -s $OUT/r-cpu.txt $OUT/r-cuda.txt && echo "cpu and cuda outputs equal" >> $OUT/log.txt || { echo "cpu vs cuda:" >> $OUT/log.txt; diff $OUT/r-cpu.txt $OUT/r-cuda.txt >> $OUT/log.txt; }
for A in "" "--adapter none"; do
  timeout 100 $B --device cuda $A bench engine --prefill 512,2048 --decode 128 --rewrite 128 --repeats 2 >> $OUT/bench-cuda.txt 2>&1; echo "bench cuda ${A:-default} rc=$?" >> $OUT/log.txt
done
cat $OUT/log.txt; grep -E "prefill|decode|rewrite|tok/s" $OUT/bench-cuda.txt | head -30
