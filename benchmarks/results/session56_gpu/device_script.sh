#!/bin/bash
# session 56: 3-bit value word tiles (v2) on the GPU (untracked)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
{ echo "$GPU"; python -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; date; } > $OUT/gpu.txt
timeout 190 python -m pytest tests/test_decode_kernel.py -m gpu -q -n 6 -p no:cacheprovider -rf > $OUT/decode_gpu_tests.log 2>&1
grep -E "^FAILED" $OUT/decode_gpu_tests.log | cut -c1-150; tail -1 $OUT/decode_gpu_tests.log | cut -c1-200
timeout 200 python benchmarks/decode_attention.py --contexts 32768 16384 1024 --methods affine turbo --bits 3 \
  --variants bytes:value_words=False again: --out $OUT/ab > $OUT/ab_words.log 2>&1
grep -E '^\|' $OUT/ab_words.log | cut -d'|' -f3-8
cat $OUT/gpu.txt
