"""Fidelity evaluation of quantized KV caches (``tq eval``) and the reference model it runs on.

* :mod:`~turboquant.eval.corpus`  — the stdlib text corpus, byte tokenizer, fixed held-out split
* :mod:`~turboquant.eval.needle`  — synthetic long-context retrieval samples
* :mod:`~turboquant.eval.configs` — configuration spec strings (``"affine-8"``, ``"turbo-k4v3"``)
* :mod:`~turboquant.eval.metrics` — perplexity, KL, top-1 agreement, needle accuracy
* :mod:`~turboquant.eval.run`     — the evaluation loop, table, CSV, PNG (``tq eval``)
* :mod:`~turboquant.eval.train`   — trains the reference model (``scripts/train_reference.py``)
"""

from .configs import DEFAULT_CONFIGS, EvalConfig, parse_config, parse_configs
from .run import REFERENCE_MODEL, run_eval

__all__ = ["DEFAULT_CONFIGS", "EvalConfig", "parse_config", "parse_configs", "REFERENCE_MODEL", "run_eval"]
