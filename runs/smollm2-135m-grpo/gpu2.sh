#!/bin/bash
# Second call: the model's second half, then GRPO from the shipped adapter for $SECONDS_RL
# seconds; adapters every 100 s and at the end, and the log, come back under $OUT.
set -u
cat /root/m/part00 .gpu2/part01 > /root/m/model.gguf
sha256sum /root/m/model.gguf | tee $OUT/run.txt
[ -d /tmp/site/gguf ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
xz -dc .gpu2/steps.jsonl.xz > /root/m/steps.jsonl
python3 runs/smollm2-135m-grpo/grpo.py --model /root/m/model.gguf \
  --init adapters/SmolLM2-135M-Instruct.Q4_1/adapter.safetensors --steps /root/m/steps.jsonl \
  --out $OUT --seconds ${SECONDS_RL:-360} --save-every 100 --prompts 16 --group 8 --lr 1e-4 --noise-unit line 2>&1 | tee -a $OUT/run.txt
