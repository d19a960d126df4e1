#!/bin/bash
# The cuda build on the tiny random-weight models of every architecture (gemma3's window
# of 8 binds in every prompt here): CPU and GPU replies side by side, and the engine
# benchmark's prefill and decode on the GPU.
set -u
M=/root/m; mkdir -p $M
xz -dc .gpu3/memctl.xz > $M/memctl && chmod +x $M/memctl
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/log.txt
P="Hello there, how are you today? Tell me a long story about the sea, the ships that sail on it, the fish below and the birds above, and the people who wait for the ships to come home."
for arch in llama qwen2 qwen3 phi3 gemma3; do
  for dev in cpu cuda; do
    echo "== $arch $dev" >> $OUT/$dev.txt
    timeout 60 $M/memctl --model .gpu3/tiny-$arch.gguf --adapter none --embedder none --device $dev \
      generate --max-tokens 32 -p "$P" 2>>$OUT/log.txt | od -An -tx1 >> $OUT/$dev.txt
    echo "$arch $dev rc=${PIPESTATUS[0]}" >> $OUT/log.txt
  done
  cmp -s <(sed -n "/== $arch cpu/,/==/p" $OUT/cpu.txt | tail -n +2 | grep -v "==") \
         <(sed -n "/== $arch cuda/,/==/p" $OUT/cuda.txt | tail -n +2 | grep -v "==") \
    && echo "$arch: cpu and cuda replies equal" >> $OUT/log.txt || echo "$arch: replies differ" >> $OUT/log.txt
  timeout 60 $M/memctl --model .gpu3/tiny-$arch.gguf --adapter none --embedder none --device cuda \
    bench engine --prefill 200 --decode 64 --rewrite 0 --batch 0 --repeats 2 >> $OUT/bench.txt 2>&1
  echo "bench $arch cuda rc=$?" >> $OUT/log.txt
done
cat $OUT/log.txt $OUT/bench.txt
