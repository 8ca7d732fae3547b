#!/bin/bash
# session 55, second device script (untracked)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
{ echo "$GPU"; python -c "import torch,triton,transformers;print(torch.__version__,triton.__version__,transformers.__version__)"; date; } > $OUT/gpu.txt
if [[ "$GPU" == *H200* ]]; then
  timeout 230 python benchmarks/decode_attention.py --contexts 32768 16384 1024 --no-write-path --out $OUT/kernel > $OUT/table.log 2>&1
  CUDA_VISIBLE_DEVICES= timeout 75 python -m pytest tests/test_bench.py::test_tq_bench_with_a_dynamic_cache tests/test_compile_models.py::test_the_dense_baseline_builds_where_torch_2_11_put_a_bounds_assert_before_its_index -n 2 -q -p no:cacheprovider -rf > $OUT/cpu_t211.log 2>&1
  grep -E '^\|' $OUT/table.log | cut -d'|' -f3,4,6,8,12; tail -3 $OUT/cpu_t211.log
else
  CUDA_VISIBLE_DEVICES= timeout ${LIMIT:-330} python -m pytest tests/test_bench.py tests/test_passes.py tests/test_packing.py tests/test_reference.py \
    tests/test_roundtrip.py tests/test_turbo.py tests/test_model_families.py tests/test_eval.py \
    tests/test_compile_models.py::test_the_dense_baseline_builds_where_torch_2_11_put_a_bounds_assert_before_its_index \
    -m "not gpu" -n 15 -v --tb=short -rf -p no:cacheprovider > $OUT/cpu_t211.log 2>&1
  grep -E "^(FAILED|ERROR)" $OUT/cpu_t211.log | head -20; grep -cE " PASSED " $OUT/cpu_t211.log; tail -2 $OUT/cpu_t211.log | cut -c1-300
fi
cat $OUT/gpu.txt
