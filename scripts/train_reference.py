"""Train turboquant's reference model (see turboquant/eval/train.py for what and how).

    python scripts/train_reference.py --device cuda       # ≈ 9 min on one GPU → turboquant/eval/reference_model/
    python scripts/train_reference.py --device cpu --tiny --steps 20 --out /tmp/tiny   # smoke test, seconds
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from turboquant.eval.train import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
