#!/bin/bash
# First call: stage the binary and the default model's first half on the machine; the
# tiny random-weight files of every architecture, CPU (integer prefill where the CPU has
# VNNI, and the f32 tiles) against CUDA.
set -u
M=/root/m; mkdir -p $M
xz -dc .gpu2/memctl.xz > $M/memctl && chmod +x $M/memctl
cp .gpu2/part0 $M/part0
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; grep -m1 "model name" /proc/cpuinfo; grep -o -m1 avx512_vnni /proc/cpuinfo; } | tee $OUT/log.txt
P="Hello there, how are you today? Tell me a long story about the sea, the ships that sail on it, the fish below and the birds above, and the people who wait for the ships to come home."
for arch in llama qwen2 qwen3 phi3 gemma3; do
  B="$M/memctl --model .gpu3/tiny-$arch.gguf --adapter none --embedder none"
  [ $arch = llama ] && $B --device cpu model info >> $OUT/log.txt 2>&1
  for run in cpu tiles cuda; do
    dev=$run; E=""; [ $run = tiles ] && { dev=cpu; E="MEMAGENT_PREFILL_WEIGHTS=tiles"; }
    echo "== $arch" >> $OUT/$run.txt
    env $E timeout 60 $B --device $dev generate --max-tokens 32 -p "$P" 2>>$OUT/log.txt | od -An -tx1 >> $OUT/$run.txt
    echo "$arch $run rc=${PIPESTATUS[0]}" >> $OUT/log.txt
  done
  timeout 60 $B --device cuda bench engine --prefill 200 --decode 64 --rewrite 0 --batch 0 --repeats 2 >> $OUT/bench.txt 2>&1
  echo "bench $arch cuda rc=$?" >> $OUT/log.txt
done
for a in cpu tiles; do cmp -s $OUT/$a.txt $OUT/cuda.txt && echo "$a and cuda replies equal (all archs)" >> $OUT/log.txt || { echo "$a vs cuda differ:" >> $OUT/log.txt; diff $OUT/$a.txt $OUT/cuda.txt | head -20 >> $OUT/log.txt; }; done
cat $OUT/log.txt; grep -E "prefill|decode" $OUT/bench.txt
