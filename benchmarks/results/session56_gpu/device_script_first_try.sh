#!/bin/bash
# session 56: 3-bit value word tiles on the GPU (untracked)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
{ echo "$GPU"; python -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; date; } > $OUT/gpu.txt
timeout 220 python -m pytest tests/test_decode_kernel.py -m gpu -q -n 8 -p no:cacheprovider -rf > $OUT/decode_gpu_tests.log 2>&1
tail -3 $OUT/decode_gpu_tests.log | cut -c1-300
timeout 250 python benchmarks/decode_attention.py --contexts 32768 16384 4096 1024 --methods affine turbo --bits 3 \
  --variants bytes:value_words=False again: --out $OUT/ab > $OUT/ab_words.log 2>&1
grep -E '^\|' $OUT/ab_words.log | cut -d'|' -f3-8
if [[ "$GPU" == *H200* ]]; then
  timeout 100 python benchmarks/decode_attention.py --contexts 32768 1024 --methods affine --bits 8 4 3 2 --no-write-path --out $OUT/kernel > $OUT/table.log 2>&1
  grep -E '^\|' $OUT/table.log | cut -d'|' -f3,4,6,8,12
fi
cat $OUT/gpu.txt
