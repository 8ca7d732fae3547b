"""Quantized storage for transformers' cache objects (``DynamicCache``, ``StaticCache``, …).

transformers allocates a layer's K/V tensors lazily, in ``layer.lazy_initialization``, on the
first ``update``. We tag each layer of a cache that reaches a turboquant-compiled model and
wrap that method on the instance: right after it runs, the dense tensors are replaced by
:class:`~turboquant.cache.QuantizedCacheTensor` (empty for growing caches, zero-filled for
preallocated ones). From then on the layer's own ``update`` code — ``torch.cat`` or
``index_copy_`` — writes quantized rows through the subclass. The dense preallocation of a
static layer is released at once (one layer's worth exists for an instant).
"""

from __future__ import annotations

from typing import Callable, Optional

import torch

from ..cache import QuantizedCacheTensor
from ..compat import mark_static_address
from ..config import KVQuantConfig

__all__ = ["is_hf_model", "is_hf_cache", "quantize_cache", "new_dynamic_cache", "kv_shape", "initialize_cache",
           "call_batch_size"]


def is_hf_model(model) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:
        return False
    return isinstance(model, PreTrainedModel)


def cache_kwarg(forward) -> str:
    """The forward's cache keyword: transformers renamed ``past_key_values`` to ``cache`` (5.2x)."""
    import inspect

    fwd = getattr(forward, "__wrapped__", forward)
    return "cache" if "cache" in inspect.signature(fwd).parameters else "past_key_values"


def output_cache(out):
    """The cache a model output or ``generate`` result carries, by the name its transformers gives
    it (``cache`` from 5.2x, where reading ``past_key_values`` logs a deprecation warning)."""
    fields = getattr(type(out), "__dataclass_fields__", {})
    name = "cache" if "cache" in fields else "past_key_values"
    return getattr(out, name, None)


def is_hf_cache(obj) -> bool:
    try:
        from transformers.cache_utils import Cache
    except ImportError:
        return False
    return isinstance(obj, Cache)


def new_dynamic_cache(model):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def kv_shape(model) -> tuple:
    """``(kv_heads, head_dim)`` of a transformers model's attention layers."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head")
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    hidden = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd")
    head_dim = getattr(cfg, "head_dim", None) or hidden // heads
    return kv_heads, head_dim


def initialize_cache(cache, model, batch: int) -> None:
    """Allocate a cache's lazily created layers now, before a compiled region runs.

    transformers allocates them in the first ``update``; inside a compiled prefill they would be
    outputs of the graph — with CUDA graphs (``mode="reduce-overhead"``), memory that the next
    replay overwrites — and would not be marked as static addresses.
    """
    layers = getattr(cache, "layers", [])
    if layers and not all(getattr(layer, "is_initialized", True) for layer in layers):
        kv_heads, head_dim = kv_shape(model)
        cache.early_initialization(batch, kv_heads, head_dim, model.dtype, model.device)


def call_batch_size(args, kwargs) -> int:
    """The batch of a transformers forward call (``input_ids`` or ``inputs_embeds``)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    return (ids if ids is not None else kwargs["inputs_embeds"]).shape[0]


def _to_quantized(x: torch.Tensor, like: torch.Tensor, spec, window: int = 0,
                  frame: Optional[torch.Tensor] = None) -> QuantizedCacheTensor:
    if isinstance(x, QuantizedCacheTensor):
        return x
    if x.dim() == 1 and x.numel() == 0:  # DynamicLayer's empty start: [B, H, 0, D]
        shape = (*like.shape[:-2], 0, like.shape[-1])
        return QuantizedCacheTensor.empty(shape, spec, dtype=like.dtype, device=like.device, window=window,
                                          frame=frame)
    if not bool(x.any()):  # preallocated zeros: never quantize them, just allocate codes
        q = QuantizedCacheTensor.empty(tuple(x.shape), spec, dtype=x.dtype, device=x.device, window=window,
                                       frame=frame)
        # written in place at fixed addresses, like the dense tensors transformers marks: without
        # this, CUDA graph trees skip every graph that writes the cache (mutated inputs)
        for t in (q, q.codes, q.meta, q.ring, q.ring_pos, q.frame):
            if t is not None:
                mark_static_address(t)
        return q
    return QuantizedCacheTensor.from_dense(x, spec, window=window, frame=frame)


def _convert_layer(layer, config: KVQuantConfig, key_states, value_states, index: int) -> None:
    w = config.residual_window
    layer.keys = _to_quantized(layer.keys, key_states, config.spec("k"), w, config.frame(index, "k"))
    layer.values = _to_quantized(layer.values, value_states, config.spec("v"), w, config.frame(index, "v"))


def quantize_cache(cache, config_for_layer: Callable[[int], Optional[KVQuantConfig]]) -> int:
    """Make every layer of an HF ``cache`` store quantized K/V; returns how many layers were tagged.

    ``config_for_layer(i)`` gives the layer's config, or ``None`` to keep it dense.
    Already-initialized dense layers are quantized from their current content.
    """
    layers = getattr(cache, "layers", [])
    if getattr(cache, "_turboquant_layers", -1) == len(layers):
        return 0  # every layer seen already: the common case, once per decode step
    tagged = 0
    for i, layer in enumerate(layers):
        if getattr(layer, "_turboquant_config", None) is not None:
            continue
        config = config_for_layer(i)
        if config is None:
            continue
        layer._turboquant_config = config
        original = layer.lazy_initialization

        @torch.compiler.disable
        def lazy_initialization(key_states, value_states, _orig=original, _layer=layer, _cfg=config, _i=i):
            _orig(key_states, value_states)
            _convert_layer(_layer, _cfg, key_states, value_states, _i)

        layer.lazy_initialization = lazy_initialization
        if getattr(layer, "is_initialized", False) and isinstance(getattr(layer, "keys", None), torch.Tensor):
            _convert_layer(layer, config, layer.keys, layer.values, i)
        tagged += 1
    cache._turboquant_layers = len(layers)
    return tagged
