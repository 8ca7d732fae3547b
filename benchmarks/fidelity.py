"""How much does each KV-cache configuration change the model's predictions? (``tq eval``)

    python benchmarks/fidelity.py                        # reference model, all default configurations,
                                                         # writes benchmarks/results/fidelity.csv and .png
    python benchmarks/fidelity.py --model PATH --configs affine-8 turbo-3 --device cuda
    python benchmarks/fidelity.py --backend eager --needle-mode forced    # quick CPU run

Same code and options as ``tq eval`` (turboquant/eval/run.py); only the default output paths differ.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from turboquant.cli import main  # noqa: E402

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    args = sys.argv[1:]
    if "--csv" not in args:
        args += ["--csv", os.path.join(here, "results", "fidelity.csv")]
    if "--png" not in args:
        args += ["--png", os.path.join(here, "results", "fidelity.png")]
    sys.exit(main(["eval", *args]))
