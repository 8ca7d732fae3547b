"""Every private torch / Inductor API turboquant uses, in one place (torch >= 2.11)."""

from __future__ import annotations

import torch

__all__ = ["inductor_compile", "dynamo_counters", "is_compiling"]


def dynamo_counters():
    """``torch._dynamo.utils.counters``: a defaultdict of Counters, reset by ``torch._dynamo.reset``."""
    from torch._dynamo.utils import counters

    return counters


def inductor_compile(gm, example_inputs, mode=None):
    """Compile a Dynamo graph with Inductor as ``torch.compile(mode=...)`` would."""
    from torch._inductor.compile_fx import compile_fx

    patches = {}
    if mode not in (None, "default"):
        patches = dict(torch._inductor.list_mode_options(mode))
    return compile_fx(gm, example_inputs, config_patches=patches)


def is_compiling() -> bool:
    return torch.compiler.is_compiling()
