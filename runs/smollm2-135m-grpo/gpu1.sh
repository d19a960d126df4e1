#!/bin/bash
# First call on the GPU machine: stage the model's first half (the file is over one call's
# transfer limit) and run the whole GRPO loop on a tiny random-weight model of the same
# vocabulary, so the second call's code path has run on the GPU.
set -u
mkdir -p /root/m && cp .gpu/part00 /root/m/part00
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; grep -m1 "model name" /proc/cpuinfo; nproc
  python3 -c "import torch, gguf; print('torch', torch.__version__, torch.cuda.is_available())"; } 2>&1 | tee $OUT/env.txt
xz -dc .gpu/steps.jsonl.xz | head -400 > /tmp/steps-small.jsonl
python3 runs/smollm2-135m-grpo/grpo.py --model .gpu/tiny.gguf --init none --steps /tmp/steps-small.jsonl \
  --out /tmp/tiny --prompts 16 --group 8 --micro 32 --max-new 96 --max-updates 3 2>&1 | tee $OUT/tiny.txt
