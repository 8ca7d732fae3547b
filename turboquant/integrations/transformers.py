"""Quantized storage for transformers' cache objects (``DynamicCache``, ``StaticCache``, …).

transformers allocates a layer's K/V tensors lazily, in ``layer.lazy_initialization``, on the
first ``update``. We tag each layer of a cache that reaches a turboquant-compiled model and
wrap that method on the instance: right after it runs, the dense tensors are replaced by
:class:`~turboquant.cache.QuantizedCacheTensor` (empty for growing caches, zero-filled for
preallocated ones). From then on the layer's own ``update`` code — ``torch.cat`` or
``index_copy_`` — writes quantized rows through the subclass. The dense preallocation of a
static layer is released at once (one layer's worth exists for an instant).

A preallocated layer (written in place) holds its quantized cache as plain buffers instead:
its class becomes a subclass whose ``keys``/``values`` properties wrap the buffers in a
:class:`~turboquant.cache.QuantizedCacheTensor` on each access. A compiled step then builds the
wrapper inside its graph, and its inputs are plain tensors: AOTAutograd has no subclass input to
unwrap on every call (torch 2.11 does that in Python, 0.4–0.8 ms per decode step of a 16-layer
model on the H200's host).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from ..cache import QuantizedCacheTensor, numerics_digest
from ..compat import mark_static_address
from ..config import KVQuantConfig

__all__ = ["is_hf_model", "is_hf_cache", "quantize_cache", "new_dynamic_cache", "kv_shape", "initialize_cache",
           "call_batch_size", "holds_buffers"]


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
    """A ``DynamicCache`` for a call that brought none, or None where the model makes a cache class of its own
    (transformers' ``_supports_default_dynamic_cache``: the linear-attention MiniMax, RWKV, …) and refuses one."""
    from transformers import DynamicCache

    supports = getattr(type(model), "_supports_default_dynamic_cache", None)
    if supports is not None and not supports():
        return None
    return DynamicCache(config=model.config)


def kv_shape(model) -> tuple:
    """``(kv_heads, head_dim)`` of a transformers model's attention layers.

    Multi-query configs (GPTBigCode, Falcon's first architecture: ``multi_query``) have one KV head; transformers
    before 5.2x derived no ``num_key_value_heads`` for them, and a cache allocated with ``num_attention_heads``
    heads failed at the first write (Falcon, StarCoder on 5.17)."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head")
    if getattr(cfg, "multi_query", False) and not getattr(cfg, "new_decoder_architecture", False):
        kv_heads = 1
    else:
        kv_heads = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_kv_heads", None) or heads
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
        shape = _initial_shape(model)
        if shape is not None:
            cache.early_initialization(batch, *shape, model.dtype, model.device)


def _initial_shape(model) -> Optional[tuple]:
    """``(kv_heads, head_dim)`` to allocate a cache's layers with ahead of the first call (either may be a list, one
    per layer), or None where they cannot be: transformers' own answer where it has one (``None`` for MLA models,
    whose cached keys and values differ in width, and for models spread over devices), else :func:`kv_shape`."""
    shape_of = getattr(model, "_get_static_cache_init_shape", None)
    if shape_of is None:
        return kv_shape(model)
    shape = shape_of()
    if shape is None or not isinstance(shape[0], int):
        return shape
    # transformers 5.17 reads num_key_value_heads, which its multi-query configs lack: Falcon got 4 heads for 1
    return min(kv_shape(model)[0], shape[0]), shape[1]


def call_batch_size(args, kwargs) -> int:
    """The batch of a transformers forward call (``input_ids`` or ``inputs_embeds``)."""
    ids = kwargs.get("input_ids", args[0] if args else None)
    return (ids if ids is not None else kwargs["inputs_embeds"]).shape[0]


# A held layer's static facts (spec, head_dim, dtype, numerics digest, which optional buffers it
# holds) by their text. A compiled step reads them from here, a global, not from the layer: Dynamo
# specializes ints reached from globals, while an int attribute of a local object (``spec.bits``)
# that differs between two compiles of the same code (two models, transformers' one forward)
# became a symbol ("bits=s45"), which no cache view can take. One text for all of them, and no
# items for absent buffers, also keeps the compiled step's guards few: 755 for a 16-layer Llama at
# affine-4 where nine tuple items per K or V had made 940 (their evaluation time on the host was
# the same within noise, ~200 µs on a CPU core).
_HELD_LAYOUTS: dict = {}
_OPTIONAL_BUFFERS = ("ring", "ring_pos", "frame")


def _held_parts(q: QuantizedCacheTensor) -> tuple:
    present = tuple(name for name in _OPTIONAL_BUFFERS if getattr(q, name) is not None)
    digest = numerics_digest()
    layout = f"{q.spec}|{q.head_dim}|{q.dtype}|{digest}|{','.join(present)}"
    _HELD_LAYOUTS.setdefault(layout, (q.spec, q.head_dim, q.dtype, digest, present))
    return (q.codes, q.meta, layout, *(getattr(q, name) for name in present))


def _held_property(role: str) -> property:
    attr = f"_turboquant_{role}"

    def get(self) -> QuantizedCacheTensor:
        codes, meta, layout, *held = getattr(self, attr)
        spec, head_dim, dtype, digest, present = _HELD_LAYOUTS[layout]
        return QuantizedCacheTensor(codes, meta, spec, head_dim, dtype, numerics=digest, **dict(zip(present, held)))

    def set(self, value: torch.Tensor) -> None:
        if not isinstance(value, QuantizedCacheTensor):  # a dense assignment (e.g. a beam reorder): requantized
            now = get(self)
            value = _to_quantized(value, value, now.spec, 0 if now.ring is None else now.ring.shape[-2],
                                  None if now.frame is None else now.frame[0])
        setattr(self, attr, _held_parts(value))

    return property(get, set, doc=f"The layer's quantized {role} (a wrapper over the buffers it holds).")


@functools.lru_cache(maxsize=None)
def _held_class(cls: type) -> type:
    """``cls`` with ``keys``/``values`` built from held buffers (one subclass per layer class)."""
    return type(cls.__name__, (cls,), {"keys": _held_property("keys"), "values": _held_property("values"),
                                      "__module__": cls.__module__, "_turboquant_held": True})


def holds_buffers(layer) -> bool:
    """Whether a cache layer holds its quantized K/V as plain buffers (see the module doc)."""
    return getattr(type(layer), "_turboquant_held", False)


def _hold_buffers(layer, keys: QuantizedCacheTensor, values: QuantizedCacheTensor) -> None:
    if not holds_buffers(layer):
        for name in ("keys", "values"):
            layer.__dict__.pop(name, None)
        layer.__class__ = _held_class(type(layer))
    layer.keys, layer.values = keys, values


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
        # this, CUDA graph trees skip every graph that writes the cache (mutated inputs); a held
        # layer's buffers come from here too, re-initialized ones through its setter
        for t in (q, q.codes, q.meta, q.ring, q.ring_pos, q.frame):
            if t is not None:
                mark_static_address(t)
        return q
    return QuantizedCacheTensor.from_dense(x, spec, window=window, frame=frame)


def _preallocated(x) -> bool:
    return isinstance(x, torch.Tensor) and not isinstance(x, QuantizedCacheTensor) and x.dim() > 1 \
        and not bool(x.any())


def _convert_layer(layer, config: KVQuantConfig, key_states, value_states, index: int) -> None:
    w = config.residual_window
    # written in place: plain buffers suffice (a held layer initialized again stays held)
    in_place = holds_buffers(layer) or (_preallocated(layer.keys) and _preallocated(layer.values))
    keys = _to_quantized(layer.keys, key_states, config.spec("k"), w, config.frame(index, "k"))
    values = _to_quantized(layer.values, value_states, config.spec("v"), w, config.frame(index, "v"))
    if in_place:
        _hold_buffers(layer, keys, values)
    else:
        layer.keys, layer.values = keys, values


def _key_value_states(args, kwargs) -> Optional[tuple]:
    """``(key_states, value_states)`` of a ``lazy_initialization`` call that allocates K/V; None for a hybrid
    layer's other calls (a linear-attention part's ``conv_states=…`` / ``recurrent_states=…``)."""
    if len(args) == 2 and not kwargs:
        return args
    if not args and set(kwargs) == {"key_states", "value_states"}:
        return kwargs["key_states"], kwargs["value_states"]
    return None


def _quantizing_initialization(layer, config: KVQuantConfig, index: int):
    """``layer.lazy_initialization`` followed by the layer's conversion to quantized K/V."""
    original = layer.lazy_initialization

    @torch.compiler.disable
    def lazy_initialization(*args, **kwargs):
        original(*args, **kwargs)
        states = _key_value_states(args, kwargs)
        if states is not None:
            _convert_layer(layer, config, *states, index)

    return lazy_initialization


def _holds_key_values(layer) -> bool:
    """Whether a cache layer stores attention K/V (transformers' ``keys``/``values``, allocated by its
    ``lazy_initialization``); a linear-attention or state-space layer of a hybrid model (Falcon-H1,
    Qwen3-Next, …) holds only its own states, and the ``DummyLayer`` of a layer that reads another's
    K/V (Gemma 3n's KV sharing) holds None and allocates nothing."""
    return hasattr(layer, "keys") and hasattr(layer, "values") and hasattr(layer, "lazy_initialization")


def quantize_cache(cache, config_for_layer: Callable[[int], Optional[KVQuantConfig]]) -> int:
    """Make every layer of an HF ``cache`` that holds K/V store them quantized; returns how many layers were tagged.

    ``config_for_layer(i)`` gives the layer's config, or ``None`` to keep it dense. Layers with no K/V (the
    linear-attention layers of a hybrid model) keep their states as they are.
    Already-initialized dense layers are quantized from their current content.
    """
    layers = getattr(cache, "layers", [])
    if getattr(cache, "_turboquant_layers", -1) == len(layers):
        return 0  # every layer seen already: the common case, once per decode step
    tagged = 0
    for i, layer in enumerate(layers):
        if getattr(layer, "_turboquant_config", None) is not None or not _holds_key_values(layer):
            continue
        config = config_for_layer(i)
        if config is None:
            continue
        layer._turboquant_config = config
        layer.lazy_initialization = _quantizing_initialization(layer, config, i)
        if getattr(layer, "is_initialized", False) and isinstance(getattr(layer, "keys", None), torch.Tensor):
            _convert_layer(layer, config, layer.keys, layer.values, i)
        tagged += 1
    cache._turboquant_layers = len(layers)
    return tagged
