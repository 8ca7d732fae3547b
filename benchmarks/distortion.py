"""How much error does each method and bit width add to a unit vector? (TurboQuant paper, Table/Fig. 1)

    python benchmarks/distortion.py                # d = 128, 20000 vectors, writes benchmarks/results/distortion.csv
    python benchmarks/distortion.py --head-dim 96
"""

import os
import sys

from turboquant.cli import main

if __name__ == "__main__":
    here = os.path.dirname(os.path.abspath(__file__))
    args = sys.argv[1:]
    if "--csv" not in args:
        args += ["--csv", os.path.join(here, "results", "distortion.csv")]
    sys.exit(main(["distortion", *args]))
