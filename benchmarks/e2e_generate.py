"""Does the quantized cache make compiled generation faster and fit more? (``tq bench``)

    python benchmarks/e2e_generate.py                       # H200: ~1B Llama, contexts 1K/8K/32K, batch 1 and 8
    python benchmarks/e2e_generate.py --mode reduce-overhead  # the same with CUDA graphs
    python benchmarks/e2e_generate.py --tiny --device cpu --contexts 64 --batches 1 --new-tokens 8   # smoke

Same code and options as ``tq bench`` (turboquant/bench/e2e.py); results go to
benchmarks/results/e2e/ (CSV and PNGs) unless ``--out`` says otherwise.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from turboquant.cli import main  # noqa: E402

if __name__ == "__main__":
    args = sys.argv[1:]
    if "--out" not in args:
        args += ["--out", os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "e2e")]
    sys.exit(main(["bench", *args]))
