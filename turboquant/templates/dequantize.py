"""Packed cache rows to dense rows in one Triton kernel: prefill's read of a quantized cache.

A prompt's attention (query length past the decode kernel's ``MAX_QUERY_LEN``) is bound by its
matrix work, ``L × S`` scores, not by reading the cache: it runs SDPA's flash or memory-efficient
kernel over dense K/V. What it must not do is spend more on producing those K/V than the SDPA
itself. Decoding with torch ops (:func:`turboquant.ops.decode_buffers`) is a dozen element-wise
kernels per tensor over int32 and float32 intermediates: a 4K prompt (B=1, Hq=32, Hkv=8, D=128)
took 437 µs against 282 for bf16 flash SDPA on the dense cache (H200, CUDA graph,
``benchmarks/prefill_attention.py``). Here each packed row is read once and its dense row written
once, in the attention's dtype, with the same arithmetic as the plain-torch decode (affine:
``scale · (code − zero)`` in fp32; turbo: ``(centroids[code] @ R) · norm``, the rotation
fp32-accurate MMAs per tile). ``copies`` writes each KV head's rows to that many consecutive
heads: the GQA expansion that SDPA's masked kernels need, without a second pass over the cache.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..config import TensorQuantSpec
from ..quant.rotation import hadamard_rotation, is_power_of_two, rotation_matrix
from ..quant.turbo import turbo_centroids
from .buffers import TL_DTYPES, interpreted, meta_dtype, strides_as

__all__ = ["dequantize_rows", "supports"]

# rows and warps per program, by method (a sweep of 16–128 rows and 4 or 8 warps on the H200's
# prefill benchmark, benchmarks/RESULTS.md: turbo reads R per program, so more rows share it)
TILES = {"affine": (16, 4), "turbo": (64, 4)}


@triton.jit
def _dequantize_rows_kernel(
    codes_ptr, meta_ptr, lut_ptr, rot_ptr, out_ptr,
    S,
    stride_cb, stride_ch, stride_cs,
    stride_mb, stride_mh, stride_ms,
    stride_ob, stride_oh, stride_os,
    H: tl.constexpr, COPIES: tl.constexpr, D: tl.constexpr, DP: tl.constexpr, BITS: tl.constexpr,
    NBYTES: tl.constexpr, TURBO: tl.constexpr, HADAMARD: tl.constexpr, GROUP: tl.constexpr, META: tl.constexpr,
    PRECISION: tl.constexpr, BLOCK_R: tl.constexpr,
):
    tl.static_assert(DP >= D)
    tl.static_assert(BITS == 2 or BITS == 3 or BITS == 4 or BITS == 8)
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    rows = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    row_ok = rows < S
    d = tl.arange(0, DP)
    d_ok = d < D
    ok = row_ok[:, None] & d_ok[None, :]

    # codes as packed by turboquant.quant.packing: little-endian fields inside whole bytes; a
    # 3-bit row holds 24-bit words byte-planar (byte k of word j at k·W + j)
    crow = codes_ptr + b * stride_cb + h * stride_ch + rows[:, None] * stride_cs
    if BITS == 3:
        W: tl.constexpr = NBYTES // 3
        j = (d // 8)[None, :]
        word = (tl.load(crow + j, mask=ok, other=0).to(tl.int32)
                | (tl.load(crow + W + j, mask=ok, other=0).to(tl.int32) << 8)
                | (tl.load(crow + 2 * W + j, mask=ok, other=0).to(tl.int32) << 16))
        code = (word >> (3 * (d % 8))[None, :]) & 7
    else:
        PER: tl.constexpr = 8 // BITS
        byte = tl.load(crow + (d // PER)[None, :], mask=ok, other=0).to(tl.int32)
        code = (byte >> (BITS * (d % PER))[None, :]) & ((1 << BITS) - 1)

    # metadata read as stored: affine pairs (or one integer word holding the pair) as scale, zero
    # per group; a turbo row's norm
    mrow = meta_ptr.to(tl.pointer_type(META)) + b * stride_mb + h * stride_mh + rows * stride_ms
    if TURBO:  # back to the model's basis: y @ R
        y = tl.load(lut_ptr + code, mask=ok, other=0.0)
        r = tl.load(rot_ptr + d[:, None] * D + d[None, :], mask=d_ok[:, None] & d_ok[None, :], other=0.0)
        norm = tl.load(mrow, mask=row_ok, other=0.0).to(tl.float32)
        if HADAMARD:
            # R = H / √D with H's entries ±1, exact in fp16: two fp16 MMAs on y's hi and lo halves
            # are as accurate as fp32 (as the decode kernel rotates), at a quarter of R's fp32 bytes
            y_hi = y.to(tl.float16)
            y_lo = (y - y_hi.to(tl.float32)).to(tl.float16)
            x = tl.dot(y_lo, r, tl.dot(y_hi, r)) * (norm * (1.0 / tl.sqrt(D * 1.0)))[:, None]
        else:
            x = tl.dot(y, r, input_precision=PRECISION) * norm[:, None]
    else:
        g2 = (2 * (d // GROUP))[None, :]
        scale = tl.load(mrow[:, None] + g2, mask=ok, other=0.0).to(tl.float32)
        zero = tl.load(mrow[:, None] + g2 + 1, mask=ok, other=0.0).to(tl.float32)
        x = scale * (code.to(tl.float32) - zero)
    if out_ptr.dtype.element_ty != tl.float32:
        x = x.to(out_ptr.dtype.element_ty, fp_downcast_rounding="rtne")  # as torch casts
    orow = out_ptr + b * stride_ob + rows[:, None] * stride_os + d[None, :]
    for c in tl.static_range(COPIES):
        tl.store(orow + (h * COPIES + c) * stride_oh, x, mask=ok)


def supports(codes: torch.Tensor, meta: torch.Tensor, spec: TensorQuantSpec, head_dim: int) -> Optional[str]:
    """None if :func:`dequantize_rows` takes these buffers, else the reason it does not."""
    if codes.dim() != 4 or meta.dim() != 4:
        return f"buffers of {codes.dim()} and {meta.dim()} dims (the kernel takes [B, H, S, ·])"
    if codes.stride(-1) != 1 or meta.stride(-1) != 1:
        return "packed rows not contiguous along their last dim"
    if spec.method == "affine" and not meta.is_floating_point() and spec.resolved_group_size(head_dim) != head_dim:
        return "integer metadata words with more than one group per row"
    return None


def dequantize_rows(codes: torch.Tensor, meta: torch.Tensor, spec: TensorQuantSpec, head_dim: int,
                    dtype: torch.dtype, copies: int = 1) -> torch.Tensor:
    """Dense ``[B, H · copies, S, head_dim]`` in ``dtype`` from packed ``codes [B, H, S, P]`` and
    ``meta [B, H, S, M]`` (as :func:`turboquant.ops.decode_buffers` takes them). ``copies`` > 1
    repeats each head's rows over ``copies`` consecutive heads (``repeat_interleave(copies, 1)``).
    The values are those of the plain-torch decode in float32, rounded once to ``dtype``."""
    why = supports(codes, meta, spec, head_dim)
    if why is not None:
        raise NotImplementedError(f"dequantize_rows: {why}")
    if dtype not in TL_DTYPES:
        raise ValueError(f"dtype={dtype} is not supported; allowed: {', '.join(map(str, TL_DTYPES))}")
    B, H, S, nbytes = codes.shape
    out = torch.empty(B, H * copies, S, head_dim, device=codes.device, dtype=dtype)
    if out.numel() == 0:
        return out
    turbo = spec.method == "turbo"
    hadamard = turbo and is_power_of_two(head_dim)
    lut = rot = codes  # placeholders an affine launch never reads
    if turbo:
        lut = turbo_centroids(head_dim, spec.bits, device=codes.device, dtype=torch.float32)
        rot = (hadamard_rotation(head_dim, spec.seed, device=codes.device, dtype=torch.float16) if hadamard
               else rotation_matrix(head_dim, spec.seed, device=codes.device, dtype=torch.float32))
    meta_t = meta_dtype(meta, spec)
    block_r, num_warps = TILES[spec.method]
    _dequantize_rows_kernel[(triton.cdiv(S, block_r), B * H)](
        codes, meta, lut, rot, out, S, *codes.stride()[:3], *strides_as(meta, meta_t), *out.stride()[:3],
        H=H, COPIES=copies, D=head_dim, DP=max(16, triton.next_power_of_2(head_dim)), BITS=spec.bits,
        NBYTES=nbytes, TURBO=turbo, HADAMARD=hadamard,
        GROUP=head_dim if turbo else spec.resolved_group_size(head_dim), META=TL_DTYPES[meta_t],
        PRECISION="ieee" if interpreted(codes) else "tf32x3", BLOCK_R=block_r, num_warps=num_warps)
    return out
