"""Split-K decode attention that reads packed K/V codes directly (Triton).

One program handles one (batch, KV head, split of the sequence): all ``G = Hq / Hkv`` query
heads and all ``L`` query positions of that KV head are the rows of one tile, so each KV byte
is read once. Codes are unpacked in registers from the packed bit stream (code ``i`` of a row
starts at bit ``i·BITS``, the layout of :mod:`turboquant.quant.packing`) and never written
back as a dense tensor:

* affine keys: ``score_j = s_j · (q·c_j − z_j · Σq)`` (group size = head_dim);
* affine values: the V scale is folded into the probabilities, ``acc += (p·s) @ c`` and the
  zero point comes off once at the end, ``acc −= Σ_j p_j s_j z_j``;
* turbo: codes index a 2^b-entry LUT of centroids; ``q`` arrives rotated and the output
  leaves rotated (the caller rotates once per query / output row), norms scale the scores
  and the probabilities.

Each split writes its running max, normaliser and unnormalised output; :func:`decode_attention`
merges the splits (log-sum-exp). Rows whose keys are all masked give 0, as the oracle.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from ..config import TensorQuantSpec
from ..quant.rotation import rotation_matrix
from ..quant.turbo import turbo_centroids

__all__ = ["decode_attention", "supports"]

MAX_QUERY_LEN = 8


@triton.jit
def _bytes(row_ptr, n_mask, j, NBYTES: tl.constexpr):
    """Bytes ``j`` (a [BLOCK] range) of each row as int32 ``[BLOCK_N, BLOCK]``."""
    return tl.load(row_ptr + j[None, :], mask=n_mask[:, None] & (j[None, :] < NBYTES), other=0).to(tl.int32)


@triton.jit
def _unpack(codes_row_ptr, n_mask, BITS: tl.constexpr, NBYTES: tl.constexpr, BLOCK_D: tl.constexpr):
    """Codes ``[BLOCK_N, BLOCK_D]`` (int32) of packed rows at ``codes_row_ptr`` ([BLOCK_N, 1] pointers).

    Bytes are loaded as contiguous tiles and split in registers; ``tl.join`` + reshape put the
    codes back in element order (code ``t`` of a byte block sits at bits ``t·BITS``).
    """
    BLOCK_N: tl.constexpr = codes_row_ptr.shape[0]
    if BITS == 8:
        c = _bytes(codes_row_ptr, n_mask, tl.arange(0, BLOCK_D), NBYTES)
    elif BITS == 4:
        b = _bytes(codes_row_ptr, n_mask, tl.arange(0, BLOCK_D // 2), NBYTES)
        c = tl.reshape(tl.join(b & 15, b >> 4), (BLOCK_N, BLOCK_D))
    elif BITS == 2:
        b = _bytes(codes_row_ptr, n_mask, tl.arange(0, BLOCK_D // 4), NBYTES)
        lo = tl.join(b & 3, (b >> 4) & 3)          # codes 0, 2 of each byte
        hi = tl.join((b >> 2) & 3, (b >> 6) & 3)   # codes 1, 3
        c = tl.reshape(tl.join(lo, hi), (BLOCK_N, BLOCK_D))
    else:  # 3 bits: a 24-bit word per 8 codes
        j = tl.arange(0, BLOCK_D // 8) * 3
        w = (_bytes(codes_row_ptr, n_mask, j, NBYTES) | (_bytes(codes_row_ptr, n_mask, j + 1, NBYTES) << 8)
             | (_bytes(codes_row_ptr, n_mask, j + 2, NBYTES) << 16))
        even = tl.join(tl.join(w & 7, (w >> 12) & 7), tl.join((w >> 6) & 7, (w >> 18) & 7))  # 0 4 2 6
        odd = tl.join(tl.join((w >> 3) & 7, (w >> 15) & 7), tl.join((w >> 9) & 7, (w >> 21) & 7))  # 1 5 3 7
        c = tl.reshape(tl.join(even, odd), (BLOCK_N, BLOCK_D))
    return c


@triton.jit
def _lookup(lut_ptr, codes, BITS: tl.constexpr):
    """Centroid values (fp16) of turbo ``codes``: a register gather for ≤ 16 entries, else a cached load."""
    if BITS <= 4:
        lut = tl.load(lut_ptr + tl.arange(0, 1 << BITS))
        src = tl.broadcast_to(lut[None, :], (codes.shape[0], 1 << BITS))
        vals = tl.gather(src, codes, axis=1)
    else:
        vals = tl.load(lut_ptr + codes)
    return vals.to(tl.float16)


@triton.jit
def _decode_split_kernel(
    q_ptr, kc_ptr, km_ptr, vc_ptr, vm_ptr, klut_ptr, vlut_ptr, mask_ptr,
    po_ptr, pm_ptr, pl_ptr,
    S, sm_scale, softcap,
    stride_qb, stride_qh, stride_ql,
    stride_kcb, stride_kch, stride_kcs,
    stride_kmb, stride_kmh, stride_kms,
    stride_vcb, stride_vch, stride_vcs,
    stride_vmb, stride_vmh, stride_vms,
    stride_mb, stride_mh, stride_ml, stride_ms,
    HKV: tl.constexpr, G: tl.constexpr, L: tl.constexpr, M: tl.constexpr,
    D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, SPLIT_BLOCKS: tl.constexpr,
    K_BITS: tl.constexpr, V_BITS: tl.constexpr, K_TURBO: tl.constexpr, V_TURBO: tl.constexpr,
    K_NBYTES: tl.constexpr, V_NBYTES: tl.constexpr,
    HAS_MASK: tl.constexpr, MASK_BOOL: tl.constexpr, IS_CAUSAL: tl.constexpr, SOFTCAP: tl.constexpr,
):
    tl.static_assert(M >= G * L)
    tl.static_assert(BLOCK_D >= D)
    pid_bh = tl.program_id(0)
    split = tl.program_id(1)
    n_splits = tl.num_programs(1)
    b = (pid_bh // HKV).to(tl.int64)
    h = (pid_bh % HKV).to(tl.int64)

    rows = tl.arange(0, M)
    row_ok = rows < G * L
    qh = h * G + rows // L
    ql = rows % L
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D

    q = tl.load(q_ptr + b * stride_qb + qh[:, None] * stride_qh + ql[:, None] * stride_ql + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float16)
    q_sum = tl.sum(q.to(tl.float32), axis=1)

    m_i = tl.full([M], float("-inf"), tl.float32)
    l_i = tl.zeros([M], tl.float32)
    acc = tl.zeros([M, BLOCK_D], tl.float32)
    z_acc = tl.zeros([M], tl.float32)

    start = split * (SPLIT_BLOCKS * BLOCK_N)
    for i in range(SPLIT_BLOCKS):
        n = start + i * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = n < S
        n64 = n.to(tl.int64)

        # ---- scores -------------------------------------------------------------------
        kc = _unpack(kc_ptr + b * stride_kcb + h * stride_kch + n64[:, None] * stride_kcs, n_ok,
                     K_BITS, K_NBYTES, BLOCK_D)
        km_row = km_ptr + b * stride_kmb + h * stride_kmh + n64 * stride_kms
        if K_TURBO:
            kval = _lookup(klut_ptr, kc, K_BITS)
            norm_k = tl.load(km_row, mask=n_ok, other=0.0).to(tl.float32)
            s = tl.dot(q, tl.trans(kval)) * norm_k[None, :]
        else:
            s_k = tl.load(km_row, mask=n_ok, other=0.0).to(tl.float32)
            z_k = tl.load(km_row + 1, mask=n_ok, other=0.0).to(tl.float32)
            dots = tl.dot(q, tl.trans(kc.to(tl.float16)))
            s = (dots - q_sum[:, None] * z_k[None, :]) * s_k[None, :]
        s = s * sm_scale
        if SOFTCAP:
            s = softcap * (2.0 * tl.sigmoid(2.0 * s / softcap) - 1.0)  # softcap · tanh(s / softcap)
        keep = n_ok[None, :] & row_ok[:, None]
        if IS_CAUSAL:  # top-left aligned, as scaled_dot_product_attention
            keep = keep & (n[None, :] <= ql[:, None])
        if HAS_MASK:
            mptr = mask_ptr + b * stride_mb + qh[:, None] * stride_mh + ql[:, None] * stride_ml + n64[None, :] * stride_ms
            if MASK_BOOL:
                keep = keep & (tl.load(mptr, mask=keep, other=0) != 0)
            else:
                s = s + tl.load(mptr, mask=keep, other=0.0).to(tl.float32)
        s = tl.where(keep, s, float("-inf"))

        # ---- online softmax -------------------------------------------------------------
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new

        # ---- values -------------------------------------------------------------------------
        vc = _unpack(vc_ptr + b * stride_vcb + h * stride_vch + n64[:, None] * stride_vcs, n_ok,
                     V_BITS, V_NBYTES, BLOCK_D)
        vm_row = vm_ptr + b * stride_vmb + h * stride_vmh + n64 * stride_vms
        if V_TURBO:
            vval = _lookup(vlut_ptr, vc, V_BITS)
            norm_v = tl.load(vm_row, mask=n_ok, other=0.0).to(tl.float32)
            pv = (p * norm_v[None, :]).to(tl.float16)
            acc = acc * alpha[:, None] + tl.dot(pv, vval)
        else:
            s_v = tl.load(vm_row, mask=n_ok, other=0.0).to(tl.float32)
            z_v = tl.load(vm_row + 1, mask=n_ok, other=0.0).to(tl.float32)
            pv32 = p * s_v[None, :]
            acc = acc * alpha[:, None] + tl.dot(pv32.to(tl.float16), vc.to(tl.float16))
            z_acc = z_acc * alpha + tl.sum(pv32 * z_v[None, :], axis=1)

    if not V_TURBO:
        acc = acc - z_acc[:, None]
    # partials: [B, Hq, L, n_splits, (BLOCK_D | 1)]
    prow = ((b * HKV * G + qh) * L + ql) * n_splits + split
    tl.store(po_ptr + prow[:, None] * BLOCK_D + d[None, :], acc, mask=row_ok[:, None])
    tl.store(pm_ptr + prow, m_i, mask=row_ok)
    tl.store(pl_ptr + prow, l_i, mask=row_ok)


@triton.jit
def _merge_splits_kernel(po_ptr, pm_ptr, pl_ptr, out_ptr, n_splits, D: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_SPLITS: tl.constexpr):
    """One output row from its splits' (max, normaliser, unnormalised output): log-sum-exp merge."""
    row = tl.program_id(0).to(tl.int64)
    sp = tl.arange(0, BLOCK_SPLITS)
    sp_ok = sp < n_splits
    m = tl.load(pm_ptr + row * n_splits + sp, mask=sp_ok, other=float("-inf"))
    l = tl.load(pl_ptr + row * n_splits + sp, mask=sp_ok, other=0.0)
    m_max = tl.max(m, axis=0)
    m_max = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.where(sp_ok, tl.exp(m - m_max), 0.0)
    den = tl.sum(w * l, axis=0)
    d = tl.arange(0, BLOCK_D)
    o = tl.load(po_ptr + (row * n_splits + sp[:, None]) * BLOCK_D + d[None, :], mask=sp_ok[:, None], other=0.0)
    acc = tl.sum(w[:, None] * o, axis=0)
    acc = acc / tl.where(den > 0, den, 1.0)  # every key masked: 0, as the oracle
    tl.store(out_ptr + row * D + d, acc.to(out_ptr.dtype.element_ty), mask=d < D)


def supports(q: torch.Tensor, k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, head_dim: int, v_head_dim: int,
             hkv: int) -> Optional[str]:
    """None if the kernel handles this call, else the reason it does not."""
    if q.shape[2] > MAX_QUERY_LEN:
        return f"query length {q.shape[2]} > {MAX_QUERY_LEN} (prefill)"
    if head_dim != v_head_dim:
        return "K and V head dims differ"
    for spec in (k_spec, v_spec):
        if spec.method == "affine" and spec.resolved_group_size(head_dim) != head_dim:
            return f"affine group_size={spec.group_size} < head_dim"
    if q.shape[1] % hkv:
        return "query heads are not a multiple of KV heads"
    return None


_LUTS: dict = {}


def _lut(spec: TensorQuantSpec, d: int, device) -> torch.Tensor:
    """The centroid table a turbo code indexes (a dummy for affine), made once per device."""
    key = (spec.method, spec.bits, d, str(device))
    if key not in _LUTS:
        _LUTS[key] = (turbo_centroids(d, spec.bits, device=device, dtype=torch.float32) if spec.method == "turbo"
                      else torch.zeros(1, device=device, dtype=torch.float32))
    return _LUTS[key]


def decode_attention(q: torch.Tensor, k_codes: torch.Tensor, k_meta: torch.Tensor, v_codes: torch.Tensor,
                     v_meta: torch.Tensor, k_spec: TensorQuantSpec, v_spec: TensorQuantSpec, head_dim: int,
                     attn_mask: Optional[torch.Tensor] = None, is_causal: bool = False, scale: Optional[float] = None,
                     softcap: float = 0.0, block_n: int = 128, num_splits: Optional[int] = None,
                     num_warps: int = 4, num_stages: int = 3, programs_per_sm: int = 8) -> torch.Tensor:
    """Attention of ``q [B, Hq, L ≤ 8, D]`` over packed caches ``[B, Hkv, S, ·]``; returns ``[B, Hq, L, D]``
    in ``q``'s dtype."""
    B, HQ, L, D = q.shape
    HKV, S = k_codes.shape[1], k_codes.shape[2]
    G = HQ // HKV
    scale = D ** -0.5 if scale is None else scale
    q_dtype = q.dtype
    if k_spec.method == "turbo":
        q = q.float() @ rotation_matrix(D, k_spec.seed, device=q.device, dtype=torch.float32).T
    q = q.contiguous() if q.stride(-1) != 1 else q
    for t in (k_codes, k_meta, v_codes, v_meta):
        assert t.stride(-1) == 1, "packed rows must be contiguous along their last dim"
    M = max(16, triton.next_power_of_2(G * L))
    BLOCK_D = max(16, triton.next_power_of_2(D))
    if num_splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        num_splits = max(1, min(triton.cdiv(programs_per_sm * sms, B * HKV), triton.cdiv(S, block_n)))
    # blocks per split: a power of two, so a growing cache recompiles the kernel only log2(S) times
    split_blocks = triton.next_power_of_2(triton.cdiv(triton.cdiv(max(S, 1), num_splits), block_n))
    num_splits = max(1, triton.cdiv(S, split_blocks * block_n))
    po = torch.empty(B, HQ, L, num_splits, BLOCK_D, device=q.device, dtype=torch.float32)
    pm = torch.empty(B, HQ, L, num_splits, device=q.device, dtype=torch.float32)
    pl = torch.empty_like(pm)
    if attn_mask is not None:
        mask = attn_mask.expand(B, HQ, L, S)
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8) if mask.is_contiguous() else mask.to(torch.uint8)
        strides = mask.stride()
    else:
        mask, strides = q, (0, 0, 0, 0)
    _decode_split_kernel[(B * HKV, num_splits)](
        q, k_codes, k_meta, v_codes, v_meta, _lut(k_spec, D, q.device), _lut(v_spec, D, q.device), mask,
        po, pm, pl,
        S, float(scale), float(softcap or 0.0),
        q.stride(0), q.stride(1), q.stride(2),
        k_codes.stride(0), k_codes.stride(1), k_codes.stride(2),
        k_meta.stride(0), k_meta.stride(1), k_meta.stride(2),
        v_codes.stride(0), v_codes.stride(1), v_codes.stride(2),
        v_meta.stride(0), v_meta.stride(1), v_meta.stride(2),
        *strides,
        HKV=HKV, G=G, L=L, M=M, D=D, BLOCK_D=BLOCK_D, BLOCK_N=block_n, SPLIT_BLOCKS=split_blocks,
        K_BITS=k_spec.bits, V_BITS=v_spec.bits, K_TURBO=k_spec.method == "turbo", V_TURBO=v_spec.method == "turbo",
        K_NBYTES=k_codes.shape[-1], V_NBYTES=v_codes.shape[-1],
        HAS_MASK=attn_mask is not None, MASK_BOOL=attn_mask is not None and attn_mask.dtype == torch.bool,
        IS_CAUSAL=bool(is_causal), SOFTCAP=bool(softcap), num_warps=num_warps, num_stages=num_stages,
    )
    out_dtype = torch.float32 if v_spec.method == "turbo" else q_dtype  # turbo still rotates back
    out = torch.empty(B, HQ, L, D, device=q.device, dtype=out_dtype)
    _merge_splits_kernel[(B * HQ * L,)](po, pm, pl, out, num_splits, D=D, BLOCK_D=BLOCK_D,
                                         BLOCK_SPLITS=max(2, triton.next_power_of_2(num_splits)))
    if v_spec.method == "turbo":
        out = (out @ rotation_matrix(D, v_spec.seed, device=q.device, dtype=torch.float32)).to(q_dtype)
    return out
