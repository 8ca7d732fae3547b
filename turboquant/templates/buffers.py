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


def metadata_pairs(meta: torch.Tensor, spec: TensorQuantSpec) -> bool:
    """Whether affine metadata comes as the integer words that hold each (scale, zero) pair, which a
    kernel then reads one load a pair (a word's alignment is its width's)."""
    return spec.method == "affine" and not meta.is_floating_point()


def strides_as(t: torch.Tensor, elem: torch.dtype, n: int = 3) -> tuple:
    """``t``'s first ``n`` strides in units of ``elem`` (the type the kernel reinterprets it as)."""
    return tuple(x * t.element_size() // elem.itemsize for x in t.stride()[:n])


def dense_row_stride(t: torch.Tensor, elem: torch.dtype) -> int:
    """The stride of ``t [B, H, S, …]``'s rows (dim 2) in ``elem`` units where the rows lie back to back
    (a row's stride is its size, as in every cache turboquant allocates), which a kernel may compile in
    as a constant; 0 where they do not."""
    size = 1
    for n, stride in reversed(list(zip(t.shape[3:], t.stride()[3:]))):
        if n != 1 and stride != size:
            return 0
        size *= n
    if t.shape[2] != 1 and t.stride(2) != size:
        return 0
    return size * t.element_size() // elem.itemsize


def interpreted(t: torch.Tensor) -> bool:
    """Whether kernels on ``t`` run under Triton's interpreter (CPU tensors, or ``TRITON_INTERPRET=1``)."""
    return not t.is_cuda or os.environ.get("TRITON_INTERPRET", "0") == "1"
