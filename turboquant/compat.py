"""Every private torch / Inductor API turboquant uses, in one place (torch >= 2.11)."""

from __future__ import annotations

import torch

__all__ = ["inductor_compile", "exact_casts", "dynamo_counters", "run_and_get_code", "tracing_with_fake_tensors",
           "real_tolist", "real_tensor_mode"]


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
    # keep the fp16 round trip of scales/zeros: without it compiled codes differ from the oracle's
    # by one step where a value sits on a rounding boundary (seen on torch 2.11)
    patches["emulate_precision_casts"] = True
    return compile_fx(gm, example_inputs, config_patches=patches)


def exact_casts():
    """Context in which plain ``torch.compile`` keeps dtype round trips, as turboquant's backend does."""
    return torch._inductor.config.patch(emulate_precision_casts=True)


def run_and_get_code(fn, *args, **kwargs):
    """(result, [generated source, ...]) of a compiled call (Inductor's test utility)."""
    from torch._inductor.utils import run_and_get_code as _run

    return _run(fn, *args, **kwargs)


def tracing_with_fake_tensors() -> bool:
    """True while AOTAutograd/Inductor trace with fake tensors (real constants must be rebuilt)."""
    from torch._guards import detect_fake_mode

    return detect_fake_mode() is not None


def real_tolist(t):
    """``t.tolist()`` for a real tensor, also while a fake-tensor mode is active."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return t.tolist()


def real_tensor_mode():
    """A context in which tensors are real even while a fake-tensor mode is active."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    return unset_fake_temporarily()


def mark_static_address(t: torch.Tensor) -> None:
    """Tell Dynamo (and CUDA graph trees) that ``t`` keeps its address across calls, as
    transformers does for a static cache's tensors: a graph that writes it in place is then
    recorded instead of skipped."""
    torch._dynamo.mark_static_address(t)
