"""``libdevice`` functions for kernels that the Triton interpreter runs on the CPU.

Inductor's generated Triton kernels call ``libdevice.<name>``, whose functions are declarations that
only a GPU backend resolves: under ``TRITON_INTERPRET=1`` they return None. This module gives the
ones turboquant's cache writes and the transformers models of its tests need, written in ``tl`` terms (see
``compat.triton_schedule_runs_on_cpu``). Any other name fails with the list of those it has.
"""

import triton
import triton.language as tl

__all__ = ["InterpreterLibdevice"]


@triton.jit
def nearbyint(x):
    # round half to even, as the GPU's rint (the current rounding mode)
    r = tl.floor(x)
    d = x - r
    odd = (r - 2.0 * tl.floor(r * 0.5)) != 0.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), r + 1.0, r)


@triton.jit
def sqrt(x):
    # libdevice's sqrt is correctly rounded (fp32 with nvcc's default -prec-sqrt=true, and fp64);
    # the interpreter's tl.sqrt is numpy's, correctly rounded in both
    return tl.sqrt(x)


@triton.jit
def rsqrt(x):
    # RMSNorm's (transformers' Llama family). The GPU's rsqrt is within 2 ulp, not correctly
    # rounded: results on this schedule match the GPU's to that, not bit for bit
    return 1.0 / tl.sqrt(x)


@triton.jit
def floor(x):
    # exact in both (turbo 8-bit's row grid: its codes are floors of float64 quotients)
    return tl.floor(x)


@triton.jit
def exp(x):
    # the interpreter's tl.exp is numpy's; libdevice's expf is within 2 ulp of it
    return tl.exp(x)


class InterpreterLibdevice:
    """Stands in for a kernel module's ``libdevice``."""

    _FNS = {"nearbyint": nearbyint, "rint": nearbyint, "sqrt": sqrt, "rsqrt": rsqrt, "exp": exp, "floor": floor}

    def __getattr__(self, name):
        if name in self._FNS:
            return self._FNS[name]
        raise NotImplementedError(f"libdevice.{name} has no interpreter version in "
                                  f"turboquant.templates.interpreter_libdevice (has: {', '.join(sorted(self._FNS))})")
