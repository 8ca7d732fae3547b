"""How the kernels' launchers hand a cache's buffers over: the element types the kernels
reinterpret them as, strides in those units, and whether Triton runs interpreted."""

from __future__ import annotations

import os

import torch
import triton.language as tl

from ..config import TensorQuantSpec

TL_DTYPES = {torch.float16: tl.float16, torch.bfloat16: tl.bfloat16, torch.float32: tl.float32}


def meta_dtype(meta: torch.Tensor, spec: TensorQuantSpec) -> torch.dtype:
    """What a kernel reads the metadata as: affine rows keep (scale, zero) as one integer word
    whose bytes are the pair (:func:`turboquant.quant.affine.metadata_word`)."""
    return meta.dtype if meta.is_floating_point() else spec.metadata_dtype


def strides_as(t: torch.Tensor, elem: torch.dtype, n: int = 3) -> tuple:
    """``t``'s first ``n`` strides in units of ``elem`` (the type the kernel reinterprets it as)."""
    return tuple(x * t.element_size() // elem.itemsize for x in t.stride()[:n])


def interpreted(t: torch.Tensor) -> bool:
    """Whether kernels on ``t`` run under Triton's interpreter (CPU tensors, or ``TRITON_INTERPRET=1``)."""
    return not t.is_cuda or os.environ.get("TRITON_INTERPRET", "0") == "1"
