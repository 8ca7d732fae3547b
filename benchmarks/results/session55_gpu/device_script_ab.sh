#!/bin/bash
# session 55 device script (untracked): the shared 3-bit lane spreads (new) against HEAD's code_operands.py (old)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
{ echo "$GPU"; python -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; date; } > $OUT/gpu.txt
NEW=turboquant/templates/code_operands.py
cp $NEW /tmp/new.py
ab() {  # ab TAG ARGS...: 3-bit new then old then new then old
  for r in 1 2; do
    cp /tmp/new.py $NEW; timeout 150 python benchmarks/decode_attention.py --no-write-path --bits 3 --out /tmp/ab_new$r "$@" > /tmp/ab_new$r.log 2>&1
    cp .scratch/code_operands_old.py $NEW; timeout 150 python benchmarks/decode_attention.py --no-write-path --bits 3 --out /tmp/ab_old$r "$@" > /tmp/ab_old$r.log 2>&1
  done
  cp /tmp/new.py $NEW
  for f in new1 old1 new2 old2; do echo "== $f"; grep -E '^\|' /tmp/ab_$f.log | cut -d'|' -f2-8; done > $OUT/ab_3bit.log
}
if [[ "$GPU" == *H200* ]]; then
  timeout 230 python benchmarks/decode_attention.py --contexts 32768 16384 1024 --no-write-path --out $OUT/kernel > $OUT/table.log 2>&1
  timeout 200 python -m pytest tests/test_decode_kernel.py -m gpu -n 8 -q -p no:cacheprovider -rf > $OUT/decode_gpu_tests.log 2>&1
  ab --contexts 32768 16384
  grep -E '^\|' $OUT/table.log | cut -d'|' -f3,4,6,8,12; tail -2 $OUT/decode_gpu_tests.log; cat $OUT/ab_3bit.log
else
  timeout 200 python -m pytest tests/test_decode_kernel.py -m gpu -n 8 -q -p no:cacheprovider -rf > $OUT/decode_gpu_tests.log 2>&1
  tail -3 $OUT/decode_gpu_tests.log
  ab --contexts 32768 16384 1024
  cat $OUT/ab_3bit.log
fi
cat $OUT/gpu.txt
