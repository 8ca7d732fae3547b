"""Calibrated K/V frames: a per-head shift and linear map that quantization works in.

Attention does not change when every key of a head moves by one vector ``μ_k`` (softmax ignores
the common ``q·μ_k``), nor when every value moves by ``μ_v`` and ``μ_v`` comes back on the output
(the probabilities sum to 1). Nor does it change when the keys are mapped by an invertible ``F``
and the queries by ``F^-T`` (``q·k = (q F^-T)·(k F)``). A cache with a **frame** ``(μ, F)`` stores
``quantize((x − μ) F)`` and decodes ``x̂ = decode · F⁻¹ + μ``: what is quantized is centred (the
head's mean holds 17–55% of the keys' energy in the reference model) and its key directions are
weighted by how much the queries read them, so the same relative error of the quantizer costs
the scores less. The attention op keeps the codes as they are and moves the query instead
(``q F^-T``), and adds ``μ_v`` to its output.

Two forms, ``[Hkv, R, D]`` float32 per layer:

* **diagonal** (``R = 2``): row 0 ``μ``, row 1 the per-channel scale ``s`` (``F = diag(s)``);
* **full** (``R = 2D + 1``): row 0 ``μ``, rows ``1…D`` the matrix ``F``, rows ``D+1…2D`` its
  inverse.

:func:`calibrate` measures the frames of every layer from a model's own K/V on some text (one
forward, no gradients): ``μ`` the per-head mean over all positions; for keys ``F`` minimising the
score error of an isotropic quantization error, ``tr(F⁻¹ A F^-T) · tr(Fᵀ B F)`` (``A`` the second
moment of the queries reading the head, ``B`` the centred keys' covariance; see
:func:`_balanced_map`), full by default or diagonal (``s_i ∝ √(a_i / b_i)``); for values ``F = 1``
(the measured gain of a value map was nil). The frames are constants of the model, not of a
prompt: a cache built with them holds no more bytes per token, and any prompt, even one token,
uses them.

Reference model (benchmarks/RESULTS.md), frames from 8 windows of training text, turbo 4-bit,
decode steps over 64 held-out windows (H200): +3.61% → +1.39% perplexity (KL 0.062 → 0.030) with
full key maps, +1.37% (KL 0.033) with diagonal ones; over 24 windows (CPU) +1.30% full against
+1.69% diagonal.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ["KVFrames", "calibrate", "frame_rows", "unframe_rows", "frame_query", "per_kv_head", "KEY_MAPS"]

# how calibrate maps a head's keys: a full matrix, or a per-channel scale
KEY_MAPS = ("full", "diagonal")


@dataclass(frozen=True, eq=False)
class KVFrames:
    """Per-layer frames for keys and values: ``keys[i]``/``values[i]`` are float32 ``[Hkv, R, D]``
    (module doc: ``R = 2`` diagonal, rows ``μ`` and ``s``; ``R = 2D + 1`` full, rows ``μ``, ``F``,
    ``F⁻¹``), or ``None`` for a layer left as it is.

    Compared and hashed by identity (a config holding one is one setting). Build with
    :func:`calibrate`; ``tokens`` records how many positions it was measured on.
    """

    keys: Tuple[Optional[torch.Tensor], ...]
    values: Tuple[Optional[torch.Tensor], ...]
    tokens: int = 0

    def __post_init__(self):
        if len(self.keys) != len(self.values):
            raise ValueError(f"KVFrames: {len(self.keys)} key frames and {len(self.values)} value frames; "
                             "allowed: one of each per layer")
        for f in (*self.keys, *self.values):
            if f is not None and (f.dim() != 3 or f.shape[1] not in frame_rows_allowed(f.shape[2])
                                  or f.dtype != torch.float32):
                raise ValueError(f"KVFrames: a frame of shape {tuple(f.shape)} and dtype {f.dtype}; "
                                 "allowed: float32 [kv_heads, 2, head_dim] (diagonal) or "
                                 "[kv_heads, 2 * head_dim + 1, head_dim] (full)")

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def frame(self, layer: Optional[int], role: str) -> Optional[torch.Tensor]:
        """The ``[Hkv, R, D]`` frame of ``layer`` for ``role`` (``"k"``/``"v"``); raises if the layer is unknown."""
        if layer is None or not (-self.num_layers <= layer < self.num_layers):
            raise ValueError(f"KVFrames: layer {layer!r} has no frame; allowed: 0..{self.num_layers - 1} "
                             "(frames are calibrated for the model whose layers they index)")
        return (self.keys if role == "k" else self.values)[layer]

    def __repr__(self):
        return f"KVFrames(layers={self.num_layers}, tokens={self.tokens})"


def frame_rows_allowed(d: int) -> tuple:
    """Row counts ``R`` a frame of head_dim ``d`` may have: 2 (diagonal) or ``2d + 1`` (full)."""
    return (2, 2 * d + 1)


def _parts(frame: torch.Tensor):
    """``(μ [..., 1, D], map, inverse)`` of ``frame [..., R, D]``: ``(μ, s, None)`` for a diagonal
    frame (``s`` a row ``[..., 1, D]``), ``(μ, F, F⁻¹)`` matrices ``[..., D, D]`` for a full one."""
    d = frame.shape[-1]
    if frame.shape[-2] == 2:
        s = frame[..., 1:2, :]
        return frame[..., 0:1, :], s, None
    return frame[..., 0:1, :], frame[..., 1:d + 1, :], frame[..., d + 1:, :]


def _work(frame: torch.Tensor) -> torch.dtype:
    return torch.promote_types(torch.float32, frame.dtype)  # float32 (frames are), float64 in tests


def frame_rows(x: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """``(x − μ) F`` in float32 (a bf16 result would add a rounding as large as 8-bit codes' own
    error); ``frame [..., R, D]`` broadcasts over ``x [..., L, D]``."""
    mu, f, inv = _parts(frame)
    x = x.to(_work(frame)) - mu
    return x * f if inv is None else x @ f


def unframe_rows(x: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """``x F⁻¹ + μ``: the inverse of :func:`frame_rows`, in ``x``'s dtype."""
    mu, f, inv = _parts(frame)
    y = x.to(_work(frame))
    y = y / f if inv is None else y @ inv
    return (y + mu).to(x.dtype)


def frame_query(q: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """``q F^-T`` (computed in float32, returned in ``q``'s dtype): the query that meets framed keys
    with the scores of ``q`` and the raw keys, up to ``q·μ`` per row (which softmax ignores)."""
    _, f, inv = _parts(frame)
    y = q.to(_work(frame))
    y = y / f if inv is None else y @ inv.transpose(-1, -2)
    return y.to(q.dtype)


def per_kv_head(fn, x: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """``fn(x, frame)`` for ``x [B, Hq, L, D]`` grouped by the KV head whose ``frame [B, Hkv, R, D]``
    it reads (a broadcast view, no per-query-head copy of the frame)."""
    hkv = frame.shape[-3]
    return fn(x.unflatten(-3, (hkv, -1)), frame.unsqueeze(-3)).flatten(-4, -3)


class _Moments:
    """Running per-head count, sum and sum of outer products (float64) of ``[B, H, T, D]`` rows."""

    def __init__(self):
        self.n, self.sum, self.outer = 0, 0.0, 0.0

    def add(self, x: torch.Tensor) -> None:
        x = x.double()
        self.n += x.shape[0] * x.shape[2]
        self.sum = self.sum + x.sum((0, 2)).cpu()
        self.outer = self.outer + torch.einsum("bhtd,bhte->hde", x, x).cpu()

    def mean_cov(self):
        mu = self.sum / self.n
        return mu, self.outer / self.n - mu[..., :, None] * mu[..., None, :]


def _psd_power(s: torch.Tensor, p: float, floor: float = 1e-6) -> torch.Tensor:
    """``s^p`` of symmetric PSD matrices, eigenvalues clamped at ``floor`` × the largest (a
    direction the rows never take would otherwise be infinitely cheap)."""
    w, u = torch.linalg.eigh((s + s.transpose(-1, -2)) / 2)
    w = w.clamp_min(floor * w.amax(-1, keepdim=True).clamp_min(1e-300))
    return (u * w.pow(p)[..., None, :]) @ u.transpose(-1, -2)


def _balanced_map(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The symmetric ``F`` minimising ``tr(F⁻¹ A F^-T) · tr(Fᵀ B F)``: the score error ``(q F^-T)·e``
    of an isotropic error ``e`` on the framed keys, whose size grows with their energy ``tr(FᵀBF)``
    (turbo's norm; affine's range). ``F² = B^-1/2 (B^1/2 A B^1/2)^1/2 B^-1/2`` (the matrix
    geometric mean of ``B⁻¹`` and ``A``); its diagonal restriction gives ``s_i² = a_i / b_i``.
    ``F²``'s eigenvalues are floored at 1e-6 of the largest: ``F``'s condition number is at most 1e3."""
    bh, bmh = _psd_power(b, 0.5), _psd_power(b, -0.5)
    f2 = bmh @ _psd_power(bh @ a @ bh, 0.5) @ bmh
    return _psd_power(f2, 0.5, floor=1e-6)


def _key_frame(m: _Moments, query_moment: Optional[torch.Tensor] = None, key_map: str = "full") -> torch.Tensor:
    """``[Hkv, R, D]``: per-head mean and the map of :func:`_balanced_map` (``key_map="full"``) or its
    diagonal form ``s = √(a / b)`` (``"diagonal"``: ``a``, ``b`` the queries' and centred keys' rms),
    scaled to a mean squared singular value of 1. ``query_moment [Hkv, D, D]``: the second moment of
    the queries reading each head (the identity when unknown). (A diagonal channel that never moves
    gets the head's smallest scale.)"""
    mu, cov = m.mean_cov()
    d = mu.shape[-1]
    a = torch.eye(d, dtype=cov.dtype).expand_as(cov) if query_moment is None else query_moment
    if key_map == "diagonal":
        rms = torch.diagonal(cov, dim1=-2, dim2=-1).clamp_min(0).sqrt()
        rms = torch.where(rms > 0, rms, rms.max(-1, keepdim=True).values.clamp_min(1e-30))
        q_rms = torch.diagonal(a, dim1=-2, dim2=-1).clamp_min(0).sqrt()
        s = (q_rms.clamp_min(1e-30) / rms).sqrt()
        s = s / s.pow(2).mean(-1, keepdim=True).sqrt()
        return torch.stack([mu, s], 1).float()
    f = _balanced_map(a, cov)
    f = f / (f.pow(2).sum((-2, -1)) / d).sqrt()[..., None, None]
    return torch.cat([mu[:, None, :], f, torch.linalg.inv(f)], 1).float()


class _QueryEnergy:
    """Per-layer second moment of the queries per KV head, from the queries the model passes to
    ``F.scaled_dot_product_attention`` (in call order: one call per layer per forward). Summed per
    call index as the forwards run (a ``[Hq, D, D]`` sum per layer, not one per call)."""

    def __init__(self):
        self.sums: List[torch.Tensor] = []
        self.calls_per_forward: List[int] = []

    def __enter__(self):
        self._sdpa = F.scaled_dot_product_attention
        self.calls_per_forward.append(0)

        def sdpa(query, *args, **kwargs):
            q = query.double()
            m = (torch.einsum("bhtd,bhte->hde", q, q) / (q.shape[0] * q.shape[2])).cpu()  # [Hq, D, D]
            i = self.calls_per_forward[-1]
            if i < len(self.sums):
                self.sums[i] += m
            else:
                self.sums.append(m)
            self.calls_per_forward[-1] += 1
            return self._sdpa(query, *args, **kwargs)

        F.scaled_dot_product_attention = sdpa
        return self

    def __exit__(self, *exc):
        F.scaled_dot_product_attention = self._sdpa

    def moments(self, layers: int, kv_heads: Sequence[int]) -> Optional[List[torch.Tensor]]:
        """``[Hkv, D, D]`` per layer (grouped query heads summed), or None if the calls do not map
        onto the layers (eager attention makes none; a model may call SDPA elsewhere too)."""
        if not self.calls_per_forward or any(n != layers for n in self.calls_per_forward):
            return None
        out = []
        for e, hkv in zip(self.sums, kv_heads):
            if e.shape[0] % hkv:
                return None
            out.append(e.view(hkv, -1, *e.shape[-2:]).sum(1) / len(self.calls_per_forward))
        return out


def _value_frame(m: _Moments) -> torch.Tensor:
    mu, _ = m.mean_cov()
    return torch.stack([mu, torch.ones_like(mu)], 1).float()


@torch.no_grad()
def calibrate(model, input_ids: torch.Tensor, batch_size: int = 4, layers: Optional[Sequence[int]] = None,
              progress: bool = False, key_map: str = "full") -> KVFrames:
    """Measure every layer's K/V frame of a transformers causal LM on ``input_ids [N, T]``.

    One unquantized forward per batch of ``batch_size`` rows, reading the keys and values the
    model writes into a ``DynamicCache``. Use text like what the model will see; a few thousand
    positions are enough (the reference model: 8 windows of 1024 tokens). ``layers``: only
    these layers get frames (the others ``None``). ``key_map``: ``"full"`` (a ``D × D`` map per
    head, module doc) or ``"diagonal"`` (a scale per channel).

    Returns :class:`KVFrames` for ``KVQuantConfig(frames=...)`` / ``turboquant.compile(...,
    frames=...)``. Raises ``NotImplementedError`` for a model that is not a transformers model
    (its K/V are not readable without running its own cache code).
    """
    from .integrations import transformers as hf

    if not hf.is_hf_model(model):
        raise NotImplementedError(f"calibrate: {type(model).__name__} is not a transformers model; allowed: a "
                                  "transformers PreTrainedModel (its DynamicCache exposes every layer's K/V)")
    if key_map not in KEY_MAPS:
        raise ValueError(f"calibrate: key_map={key_map!r}; allowed: {', '.join(map(repr, KEY_MAPS))}")
    if input_ids.dim() != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 2:
        raise ValueError(f"calibrate: input_ids of shape {tuple(input_ids.shape)}; allowed: [N >= 1, T >= 2]")
    device = next(model.parameters()).device
    ks, vs = None, None
    rows = range(0, input_ids.shape[0], batch_size)
    queries = _QueryEnergy()
    if progress:
        from tqdm.auto import tqdm

        rows = tqdm(rows, desc="tq calibrate", unit="batch")
    for start in rows:
        cache = hf.new_dynamic_cache(model)
        if cache is None:
            raise NotImplementedError(f"turboquant.calibrate: {type(model).__name__} makes a cache class of its own "
                                      "instead of transformers' DynamicCache, from which calibration reads K/V")
        with queries:
            model(input_ids=input_ids[start:start + batch_size].to(device), use_cache=True,
                  **{hf.cache_kwarg(model.forward): cache})
        if ks is None:
            ks, vs = [_Moments() for _ in cache.layers], [_Moments() for _ in cache.layers]
        for layer, mk, mv in zip(cache.layers, ks, vs):
            mk.add(layer.keys)
            mv.add(layer.values)
    keep = set(range(len(ks)) if layers is None else [i % len(ks) for i in layers])
    q_moments = queries.moments(len(ks), [k.sum.shape[0] for k in ks])
    if q_moments is None:
        warnings.warn("turboquant.calibrate: the model's attention calls did not map onto its layers (eager "
                      "attention, or SDPA called elsewhere too), so key maps ignore the queries; "
                      "attn_implementation='sdpa' measures them")
        q_moments = [None] * len(ks)
    return KVFrames(keys=tuple(_key_frame(k, q_moments[i], key_map) if i in keep else None for i, k in enumerate(ks)),
                    values=tuple(_value_frame(v) if i in keep else None for i, v in enumerate(vs)),
                    tokens=int(input_ids.numel()))
