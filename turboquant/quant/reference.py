"""The attention oracle: what every turboquant attention op and kernel must compute.

Semantics follow ``torch.nn.functional.scaled_dot_product_attention``:

* ``q [B, Hq, L, D]``, ``k``/``v`` ``[B, Hkv, S, D]`` with ``Hq`` a multiple of ``Hkv``; query head
  ``h`` reads KV head ``h // (Hq // Hkv)`` (``enable_gqa`` / ``repeat_interleave``);
* ``attn_mask`` broadcastable to ``[B, Hq, L, S]``: boolean (True = attend) or additive;
* ``is_causal``: the top-left aligned lower triangle, as SDPA (not with ``attn_mask``);
* ``scale`` defaults to ``1 / √D``;
* ``softcap`` (Gemma 2 style, optional): scores become ``softcap · tanh(scores / softcap)``
  after scaling and before the mask;
* a query row with every key masked yields zeros (SDPA's math backend since torch 2.5).

Two forms, equal to rounding:

* :func:`reference_attention` dequantizes K and V and attends, in float64;
* :func:`folded_attention` never builds a dequantized K or V — the arithmetic kernels do:
  affine keys: ``q·k_j = Σ_g s_jg (q_g·c_jg − z_jg Σq_g)`` (scale and zero enter once per
  key and group); affine values: the V scales are folded into the probabilities,
  ``out_g = Σ_j (p_j s_jg) c_jg − Σ_j (p_j s_jg) z_jg``; turbo: ``q`` is rotated once
  (``q·k_j = n_j (Rq)·ĉ_j``), ``Σ_j (p_j n_j) ĉ_j`` is accumulated in the rotated space and
  the output is rotated back once.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from .packed import QuantizedKV, dequantize_kv
from .turbo import turbo_centroids, turbo_rotate

__all__ = ["reference_attention", "folded_attention", "masked_softmax"]

KV = Union[torch.Tensor, QuantizedKV]


def _check(q: torch.Tensor, k_shape, v_shape, attn_mask, is_causal) -> int:
    if q.dim() != 4 or len(k_shape) != 4 or len(v_shape) != 4:
        raise ValueError(f"expected 4-d q, k, v ([B, H, S, D]); got q {tuple(q.shape)}, "
                         f"k {tuple(k_shape)}, v {tuple(v_shape)}")
    hq, hkv = q.shape[1], k_shape[1]
    if hkv == 0 or hq % hkv or v_shape[1] != hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of the KV heads (k: {hkv}, v: {v_shape[1]})")
    if k_shape[2] != v_shape[2] or q.shape[-1] != k_shape[-1]:
        raise ValueError(f"mismatched shapes: q {tuple(q.shape)}, k {tuple(k_shape)}, v {tuple(v_shape)}")
    if is_causal and attn_mask is not None:
        raise ValueError("pass either attn_mask or is_causal=True, not both (as scaled_dot_product_attention)")
    return hq // hkv


def masked_softmax(scores: torch.Tensor, attn_mask: Optional[torch.Tensor], is_causal: bool,
                   softcap: Optional[float] = None) -> torch.Tensor:
    """Softmax over the last dim of ``scores [..., L, S]`` after soft-capping and the mask;
    fully masked rows give 0."""
    L, S = scores.shape[-2:]
    if softcap:
        scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        attn_mask = torch.ones(L, S, dtype=torch.bool, device=scores.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(~attn_mask, float("-inf"))
        else:
            scores = scores + attn_mask.to(scores.dtype)
    row_max = scores.amax(-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(scores - row_max)
    total = e.sum(-1, keepdim=True)
    return torch.where(total > 0, e / torch.where(total > 0, total, torch.ones_like(total)), torch.zeros_like(e))


def _dense(x: KV) -> torch.Tensor:
    return dequantize_kv(x, torch.float64) if isinstance(x, QuantizedKV) else x.to(torch.float64)


def _grouped_mask(attn_mask, b, hkv, g, L, S):
    """Mask broadcast to ``[B, Hkv, g, L, S]`` (query head = kv_head * g + i)."""
    if attn_mask is None:
        return None
    return attn_mask.expand(b, hkv * g, L, S).reshape(b, hkv, g, L, S)


def reference_attention(q: torch.Tensor, k: KV, v: KV, attn_mask: Optional[torch.Tensor] = None,
                        is_causal: bool = False, scale: Optional[float] = None,
                        softcap: Optional[float] = None) -> torch.Tensor:
    """Attention over (possibly quantized) K and V, dequantized, in float64.

    Returns ``[B, Hq, L, D]`` float64. ``k``/``v`` may be dense tensors or
    :class:`~turboquant.QuantizedKV` (then decoded exactly as :func:`dequantize_kv`).
    """
    g = _check(q, k.shape, v.shape, attn_mask, is_causal)
    kd, vd = _dense(k), _dense(v)
    if g > 1:
        kd, vd = kd.repeat_interleave(g, dim=1), vd.repeat_interleave(g, dim=1)
    qd = q.to(torch.float64)
    scale = qd.shape[-1] ** -0.5 if scale is None else scale
    p = masked_softmax(qd @ kd.transpose(-1, -2) * scale, attn_mask, is_causal, softcap)
    return p @ vd


def _code_values(x: QuantizedKV) -> torch.Tensor:
    """Per-element code values in float64: integers for affine, unit-vector centroids for turbo."""
    codes = x.unpacked_codes()
    if x.spec.method == "affine":
        return codes.to(torch.float64)
    return turbo_centroids(x.head_dim, x.spec.bits, device=codes.device)[codes.long()]


def _folded_scores(qg: torch.Tensor, k: QuantizedKV) -> torch.Tensor:
    """``q·k_j`` for ``qg [B, Hkv, g, L, D]`` over ``k [B, Hkv, S, D]`` -> ``[B, Hkv, g, L, S]``."""
    c = _code_values(k)
    meta = k.meta.to(torch.float64)
    if k.spec.method == "turbo":
        qr = turbo_rotate(qg, k.spec.seed)  # once per query, not per key
        return torch.einsum("bhgld,bhsd->bhgls", qr, c) * meta[..., 0].unsqueeze(2).unsqueeze(3)
    n_groups = meta.shape[-2]
    qgg = qg.reshape(*qg.shape[:-1], n_groups, -1)
    cg = c.reshape(*c.shape[:-1], n_groups, -1)
    dots = torch.einsum("bhglnx,bhsnx->bhglsn", qgg, cg)
    qsum = qgg.sum(-1).unsqueeze(-2)  # [B, Hkv, g, L, 1, n]
    s, z = meta[..., 0][:, :, None, None], meta[..., 1][:, :, None, None]  # [B, Hkv, 1, 1, S, n]
    return (s * (dots - z * qsum)).sum(-1)


def _folded_values(p: torch.Tensor, v: QuantizedKV) -> torch.Tensor:
    """``Σ_j p_j v_j`` for ``p [B, Hkv, g, L, S]`` -> ``[B, Hkv, g, L, D]``."""
    c = _code_values(v)
    meta = v.meta.to(torch.float64)
    if v.spec.method == "turbo":
        acc = torch.einsum("bhgls,bhsd->bhgld", p * meta[..., 0][:, :, None, None], c)
        return turbo_rotate(acc, v.spec.seed, inverse=True)  # once per output row
    n_groups = meta.shape[-2]
    cg = c.reshape(*c.shape[:-1], n_groups, -1)
    ps = p.unsqueeze(-1) * meta[..., 0][:, :, None, None]  # probabilities × V scale: [B,Hkv,g,L,S,n]
    out = torch.einsum("bhglsn,bhsnx->bhglnx", ps, cg) - (ps * meta[..., 1][:, :, None, None]).sum(-2).unsqueeze(-1)
    return out.reshape(*out.shape[:-2], -1)


def folded_attention(q: torch.Tensor, k: QuantizedKV, v: QuantizedKV, attn_mask: Optional[torch.Tensor] = None,
                     is_causal: bool = False, scale: Optional[float] = None,
                     softcap: Optional[float] = None) -> torch.Tensor:
    """Attention computed on codes and metadata, never forming a dequantized K or V (float64).

    Equal to :func:`reference_attention` to float64 rounding; the form kernels implement.
    """
    g = _check(q, k.shape, v.shape, attn_mask, is_causal)
    b, hq, L, d = q.shape
    hkv, S = k.shape[1], k.shape[2]
    qg = q.to(torch.float64).reshape(b, hkv, g, L, d)
    scale = d ** -0.5 if scale is None else scale
    scores = _folded_scores(qg, k) * scale
    p = masked_softmax(scores, _grouped_mask(attn_mask, b, hkv, g, L, S), is_causal, softcap)
    return _folded_values(p, v).reshape(b, hq, L, v.head_dim)
