"""Calibrated K/V frames: a per-head shift and per-channel scale that quantization works in.

Attention does not change when every key of a head moves by one vector ``μ_k`` (softmax ignores
the common ``q·μ_k``), nor when every value moves by ``μ_v`` and ``μ_v`` comes back on the output
(the probabilities sum to 1). Nor does it change when key channel ``i`` is scaled by ``s_i`` and
query channel ``i`` by ``1/s_i``. A cache with a **frame** ``(μ, s)`` stores
``quantize((x − μ) · s)`` and decodes ``x̂ = decode / s + μ``: what is quantized is centred (the
head's mean holds 17–55% of the keys' energy in the reference model) and its key channels are
weighted by how much the queries read them, so the same relative error of the quantizer costs
the scores less. The attention op keeps the codes as they are and moves the query instead
(``q / s_k``), and adds ``μ_v`` to its output.

:func:`calibrate` measures the frames of every layer from a model's own K/V on some text (one
forward, no gradients): ``μ`` the per-head mean over all positions, ``s_i ∝ √(a_i / rms_i(k − μ_k))``
for keys, ``a`` the rms of the queries reading channel ``i`` (scaled to a mean ``s²`` of 1; see
:func:`_key_frame`), ``s = 1`` for values (the measured gain of a value scale was nil). The
frames are constants of the model, not of a prompt: a cache built with them holds no more bytes
per token, and any prompt, even one token, uses them.

Reference model (benchmarks/RESULTS.md, 2026-12-02), frames from 8 windows of training text;
one forward over 64 held-out windows: turbo 4-bit +3.56% → +1.55% perplexity (KL 0.062 → 0.033),
turbo 3-bit +13.0% → +6.2%, affine 4-bit +3.90% → +1.73%; decode steps over 8 windows: turbo
4-bit +2.61% → +1.66%.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

__all__ = ["KVFrames", "calibrate", "frame_rows", "unframe_rows"]


@dataclass(frozen=True, eq=False)
class KVFrames:
    """Per-layer frames for keys and values: ``keys[i]``/``values[i]`` are float32 ``[Hkv, 2, D]``
    (row 0 the shift ``μ``, row 1 the scale ``s``), or ``None`` for a layer left as it is.

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
            if f is not None and (f.dim() != 3 or f.shape[1] != 2 or f.dtype != torch.float32):
                raise ValueError(f"KVFrames: a frame of shape {tuple(f.shape)} and dtype {f.dtype}; "
                                 "allowed: float32 [kv_heads, 2, head_dim]")

    @property
    def num_layers(self) -> int:
        return len(self.keys)

    def frame(self, layer: Optional[int], role: str) -> Optional[torch.Tensor]:
        """The ``[Hkv, 2, D]`` frame of ``layer`` for ``role`` (``"k"``/``"v"``); raises if the layer is unknown."""
        if layer is None or not (-self.num_layers <= layer < self.num_layers):
            raise ValueError(f"KVFrames: layer {layer!r} has no frame; allowed: 0..{self.num_layers - 1} "
                             "(frames are calibrated for the model whose layers they index)")
        return (self.keys if role == "k" else self.values)[layer]

    def __repr__(self):
        return f"KVFrames(layers={self.num_layers}, tokens={self.tokens})"


def frame_rows(x: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """``(x − μ) · s`` in float32 (a bf16 result would add a rounding as large as 8-bit codes' own
    error); ``frame [..., 2, D]`` broadcasts over ``x [..., L, D]``."""
    mu, s = frame[..., 0:1, :], frame[..., 1:2, :]
    return (x.float() - mu) * s


def unframe_rows(x: torch.Tensor, frame: torch.Tensor) -> torch.Tensor:
    """``x / s + μ``: the inverse of :func:`frame_rows`, in ``x``'s dtype."""
    mu, s = frame[..., 0:1, :], frame[..., 1:2, :]
    return (x.float() / s + mu).to(x.dtype)


class _Moments:
    """Running per-head, per-channel count, sum and sum of squares (float64) of ``[B, H, T, D]`` rows."""

    def __init__(self):
        self.n, self.sum, self.sq = 0, 0.0, 0.0

    def add(self, x: torch.Tensor) -> None:
        x = x.double()
        self.n += x.shape[0] * x.shape[2]
        self.sum = self.sum + x.sum((0, 2)).cpu()
        self.sq = self.sq + x.pow(2).sum((0, 2)).cpu()

    def mean_rms(self):
        mu = self.sum / self.n
        return mu, (self.sq / self.n - mu * mu).clamp_min(0).sqrt()


def _key_frame(m: _Moments, query_rms: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``[Hkv, 2, D]``: per-head mean, per-channel scale ``s = √(a / b)`` normalised to a mean ``s²``
    of 1 per head, ``b`` the centred keys' rms and ``a`` the rms of the queries that read them (1
    when unknown). Scaling key channel i by s_i and its query channel by 1/s_i leaves every score
    as it is and makes the score error of an isotropic key error ∝ (Σ a_i²/s_i²)(Σ s_i² b_i²), least
    at s_i² ∝ a_i/b_i. (A channel that never moves gets the head's smallest scale.)"""
    mu, rms = m.mean_rms()
    rms = torch.where(rms > 0, rms, rms.max(-1, keepdim=True).values.clamp_min(1e-30))
    s = (1 / rms if query_rms is None else query_rms.clamp_min(1e-30) / rms).sqrt()
    s = s / s.pow(2).mean(-1, keepdim=True).sqrt()
    return torch.stack([mu, s], 1).float()


class _QueryEnergy:
    """Per-layer query energy per KV head and channel, from the queries the model passes to
    ``F.scaled_dot_product_attention`` (in call order: one call per layer per forward)."""

    def __init__(self):
        self.calls: List[torch.Tensor] = []

    def __enter__(self):
        self._sdpa = F.scaled_dot_product_attention

        def sdpa(query, *args, **kwargs):
            self.calls.append(query.double().pow(2).sum((0, 2)).cpu())  # [Hq, D]
            return self._sdpa(query, *args, **kwargs)

        F.scaled_dot_product_attention = sdpa
        return self

    def __exit__(self, *exc):
        F.scaled_dot_product_attention = self._sdpa

    def rms(self, layers: int, forwards: int, kv_heads: Sequence[int]) -> Optional[List[torch.Tensor]]:
        """``[Hkv, D]`` per layer (grouped query heads summed), or None if the calls do not map onto
        the layers (eager attention makes none; a model may call SDPA elsewhere too)."""
        if len(self.calls) != layers * forwards:
            return None
        out = []
        for i, hkv in enumerate(kv_heads):
            e = sum(self.calls[i::layers])
            if e.shape[0] % hkv:
                return None
            out.append(e.view(hkv, -1, e.shape[-1]).sum(1).sqrt())
        return out


def _value_frame(m: _Moments) -> torch.Tensor:
    mu, _ = m.mean_rms()
    return torch.stack([mu, torch.ones_like(mu)], 1).float()


@torch.no_grad()
def calibrate(model, input_ids: torch.Tensor, batch_size: int = 4, layers: Optional[Sequence[int]] = None,
              progress: bool = False) -> KVFrames:
    """Measure every layer's K/V frame of a transformers causal LM on ``input_ids [N, T]``.

    One unquantized forward per batch of ``batch_size`` rows, reading the keys and values the
    model writes into a ``DynamicCache``. Use text like what the model will see; a few thousand
    positions are enough (the reference model: 8 windows of 1024 tokens). ``layers``: only
    these layers get frames (the others ``None``).

    Returns :class:`KVFrames` for ``KVQuantConfig(frames=...)`` / ``turboquant.compile(...,
    frames=...)``. Raises ``NotImplementedError`` for a model that is not a transformers model
    (its K/V are not readable without running its own cache code).
    """
    from .integrations import transformers as hf

    if not hf.is_hf_model(model):
        raise NotImplementedError(f"calibrate: {type(model).__name__} is not a transformers model; allowed: a "
                                  "transformers PreTrainedModel (its DynamicCache exposes every layer's K/V)")
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
        with queries:
            model(input_ids=input_ids[start:start + batch_size].to(device), use_cache=True,
                  **{hf.cache_kwarg(model.forward): cache})
        if ks is None:
            ks, vs = [_Moments() for _ in cache.layers], [_Moments() for _ in cache.layers]
        for layer, mk, mv in zip(cache.layers, ks, vs):
            mk.add(layer.keys)
            mv.add(layer.values)
    keep = set(range(len(ks)) if layers is None else [i % len(ks) for i in layers])
    q_rms = queries.rms(len(ks), len(rows), [k.sum.shape[0] for k in ks])
    if q_rms is None:
        warnings.warn("turboquant.calibrate: the model's attention calls did not map onto its layers (eager "
                      "attention, or SDPA called elsewhere too), so key scales ignore the queries; "
                      "attn_implementation='sdpa' measures them")
        q_rms = [None] * len(ks)
    return KVFrames(keys=tuple(_key_frame(k, q_rms[i]) if i in keep else None for i, k in enumerate(ks)),
                    values=tuple(_value_frame(v) if i in keep else None for i, v in enumerate(vs)),
                    tokens=int(input_ids.numel()))
