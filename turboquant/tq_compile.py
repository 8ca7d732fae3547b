"""``turboquant.compile(model)`` and the ``"turboquant"`` torch.compile backend.

How a cache becomes quantized (details in docs/design.md):

1. The backend runs :func:`~turboquant.passes.find_kv_sites` on every Dynamo graph: each
   attention read (SDPA or the eager matmul-softmax-matmul) is linked to the K/V cache
   tensors it reads and the writes into them.
2. A cache that is already a :class:`~turboquant.cache.QuantizedCacheTensor` — an input, or
   built inside the graph from the plain buffers a transformers layer holds — needs nothing
   more: its writes quantize on the fly and SDPA over it is one ``turboquant::attention``.
3. A dense cache found in the graph (a module buffer, a transformers cache layer) is
   swapped at its owner for a quantized copy right after this call, which runs unchanged;
   Dynamo's guards then recompile the next call with the quantized storage.
4. Anything else runs unchanged and a warning (once) says which layer and why.

``turboquant.compile`` adds what a backend cannot do: transformers caches are quantized
from their creation (no dense cache is ever filled), ``model.forward`` is replaced so that
``model.generate`` runs the compiled quantized path, and transformers' own auto-compile of
the decode step is turned off (the forward is compiled already).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import re
import warnings
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch

from .cache import QuantizedCacheTensor
from .compat import dynamo_counters, inductor_compile
from .config import KVQuantConfig
from .integrations import transformers as hf
from .passes import find_kv_sites, rewrite_eager_attention
from .passes.constant_copies import FoldConstantCopies

__all__ = ["compile", "turboquant_backend", "report", "Report", "LayerReport", "CompileState", "cache_nbytes"]

_COMPILE_KWARGS = ("mode", "fullgraph", "dynamic")
_WARNED: set = set()

_FOLD_CONSTANT_COPIES = FoldConstantCopies()  # one instance: the FX graph cache keys on its uuid()


def _warn_once(msg: str) -> None:
    if msg not in _WARNED:
        _WARNED.add(msg)
        warnings.warn(f"turboquant: {msg}", stacklevel=3)


@dataclass
class LayerReport:
    layer: int
    k_source: str
    v_source: str
    write: str
    read: str
    status: str            # "quantized", "swapped" (dense when found, quantized after), "decoded", "dense"
    reason: str = ""
    bits: str = ""         # "k4/v3"; "" when dense


@dataclass
class CompileState:
    """What turboquant did to one model (or one torch.compile call): config and per-layer report."""

    config: KVQuantConfig
    mode: Optional[str] = None
    graphs: int = 0
    layers: Dict[str, LayerReport] = field(default_factory=dict)
    num_layers: Optional[int] = None   # known for transformers models; else the attentions in the graph
    # turboquant.compile judges "no cache found" after a whole call (a call may compile several
    # graphs and the first may hold no attention); the bare backend judges each graph
    check_after_call: bool = False
    warned_no_cache: bool = False
    calls_without_layers: int = 0   # calls of a transformers model that recorded no layer yet
    warned_grad_mode: bool = False

    def warn_if_no_cache(self, cache_quantized: bool = False, patient: bool = False) -> None:
        """Warn (once) when the captured graphs held no cache turboquant rewrote. ``cache_quantized``: the call's
        transformers cache stores quantized K/V all the same (its writes and reads then go through
        :class:`~turboquant.cache.QuantizedCacheTensor`'s handlers), so the model does not run unchanged.
        ``patient`` (a transformers model, as any ``cache_quantized`` call is): judged after a second call, since a
        prefill may record nothing while the decode steps do: its graphs break around the cache (Falcon-H1), or
        it builds the cache inside its forward, which the steps then receive as an input to swap (MiniMax)."""
        if self.layers or self.warned_no_cache:
            return
        if patient:
            self.calls_without_layers += 1
            if self.calls_without_layers < 2:
                return
        self.warned_no_cache = True
        if cache_quantized:
            warnings.warn("turboquant: the transformers cache stores quantized K/V, but the captured graphs hold no "
                          "cache write feeding an attention that turboquant rewrites (an attention of another form, "
                          "or graph breaks around the cache update: torch._dynamo.explain shows them): the cache's "
                          "writes and reads go through QuantizedCacheTensor's own handlers, correct but not the fused "
                          "kernels, and turboquant.report lists no layers", stacklevel=4)
            return
        warnings.warn("turboquant: no KV-cache write feeding an attention was found in the captured graphs; the "
                      "model runs unchanged (a cache must be written with cat/index_copy_/index_put_/setitem/copy_ "
                      "and read by scaled_dot_product_attention or matmul-softmax-matmul)", stacklevel=4)

    def inference_only(self, quantized: bool):
        """The context a forward runs in: ``torch.no_grad()`` when it has a quantized cache and grad
        mode is on (warned once); a model that writes no cache keeps its grad mode.

        A quantized cache is an inference feature: tracing a backward through its writes fails
        (the cache's codes have no derivative), so a model called without ``torch.no_grad()``,
        as evaluation loops often do, would otherwise not compile."""
        if not (quantized and torch.is_grad_enabled()):
            return contextlib.nullcontext()
        if not self.warned_grad_mode:
            self.warned_grad_mode = True
            warnings.warn("turboquant: a quantized KV cache is for inference; the compiled forward runs under "
                          "torch.no_grad() and its outputs carry no gradient (call it inside torch.no_grad() "
                          "to silence this)", stacklevel=4)
        return torch.no_grad()

    def layer_config(self, layer: int, graph_layers: int) -> Optional[KVQuantConfig]:
        """Layer ``layer``'s config (``None``: kept dense by ``protected_layers``)."""
        return self.config.for_layer(layer, self.num_layers or graph_layers)

    def record(self, row: LayerReport) -> None:
        key = row.k_source
        old = self.layers.get(key)
        if old is None or old.status != "quantized":  # once quantized, a layer stays reported so
            self.layers[key] = row


def _owner_slots(t: torch.Tensor):
    """(dict, key) pairs holding ``t`` as an object attribute or a module buffer, found through the GC.

    Only an object's ``__dict__`` or a module's ``_buffers`` count: frames, kwargs and other
    containers that happen to hold the tensor are left alone.
    """
    slots = []
    for ref in gc.get_referrers(t):
        if not isinstance(ref, dict):
            continue
        owned = any(getattr(o, "__dict__", None) is ref or (isinstance(o, dict) and o.get("_buffers") is ref)
                    for o in gc.get_referrers(ref))
        if owned:
            slots.extend((ref, key) for key, val in ref.items() if val is t and isinstance(key, str))
    return slots


_LAYER_IN_SOURCE = re.compile(r"\.layers\[(\d+)\]")


def _model_layer(site) -> int:
    """The model's index of a linked layer: ``….layers[N]…`` in the cache's source (transformers caches,
    ``nn.ModuleList`` models) when there, else its order among the graph's attentions."""
    m = _LAYER_IN_SOURCE.search(site.k.source)
    return int(m.group(1)) if m else site.layer


def _analyze(gm, sites, example_inputs, state: CompileState, eager_rewritten: bool):
    """Classify each linked layer; returns ``(site, k_index, v_index, config)`` of dense caches to swap."""
    counters = dynamo_counters()
    index = {n.name: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    to_swap = []
    for site in sites:
        ik, iv = index.get(site.k.node), index.get(site.v.node)
        tensors = [example_inputs[i] if i is not None else None for i in (ik, iv)]
        write = "/".join(sorted(set(site.k.writes)))
        layer = _model_layer(site)
        config = state.layer_config(layer, len(sites))
        row = dict(layer=layer, k_source=site.k.source, v_source=site.v.source, write=write, read=site.read,
                   bits=f"k{config.spec('k').bits}/v{config.spec('v').bits}" if config is not None else "")
        if config is None:
            if not any(isinstance(t, QuantizedCacheTensor) for t in tensors) and not site.k.built_in_graph:
                state.record(LayerReport(**{**row, "status": "dense", "reason": "protected_layers keeps it dense"}))
                continue
        if site.read == "eager" and not eager_rewritten:
            reason = ("its eager attention does not match the matmul-softmax-matmul pattern turboquant rewrites; "
                      "it reads decoded copies of the cache (correct, not fast)")
            _warn_once(f"layer {layer} ({site.k.source}): {reason}")
            row["status"], row["reason"] = "decoded", reason
        if all(isinstance(t, QuantizedCacheTensor) for t in tensors) or (site.k.built_in_graph and site.v.built_in_graph):
            counters["turboquant"]["layers_quantized"] += 1
            state.record(LayerReport(**{"status": "quantized", **row}))
        elif all(isinstance(t, torch.Tensor) for t in tensors):
            to_swap.append((site, ik, iv, config))
            state.record(LayerReport(**{"status": "swapped", **row}))
        else:
            reason = "its K/V are not tensors the graph receives as inputs"
            _warn_once(f"layer {layer} ({site.k.source}) left unquantized: {reason}")
            state.record(LayerReport(**{**row, "bits": "", "status": "dense", "reason": reason}))
    if not sites and not state.check_after_call:
        state.warn_if_no_cache()
    return to_swap


def _swapping_entry(gm, to_swap, state: CompileState):
    """Run ``gm`` eagerly after moving its dense cache inputs to quantized storage at their owners.

    Swapping *before* the call means the call's own writes — in place or a ``cat`` whose
    result Dynamo assigns back to the owner afterwards — already land in quantized storage.
    A cache no owner holds stays dense (its writes would otherwise be lost) and is reported.
    """
    counters = dynamo_counters()

    def run(*args):
        args = list(args)
        for site, ik, iv, config in to_swap:
            for i, role in ((ik, "k"), (iv, "v")):
                t = args[i]
                if isinstance(t, QuantizedCacheTensor):
                    continue
                slots = _owner_slots(t)
                if not slots:
                    reason = "no owner (module buffer or object attribute) holds the cache tensor"
                    layer = _model_layer(site)
                    _warn_once(f"layer {layer} ({site.k.source}) left unquantized: {reason}")
                    state.record(LayerReport(layer, site.k.source, site.v.source, "/".join(site.k.writes),
                                             site.read, "dense", reason))
                    continue
                q = QuantizedCacheTensor.from_dense(t, config.spec(role), window=config.residual_window,
                                                    frame=config.frame(_model_layer(site), role))
                for d, key in slots:
                    d[key] = q
                args[i] = q
                counters["turboquant"]["caches_swapped"] += 1
        return gm.forward(*args)

    return run


def _backend(gm, example_inputs, state: CompileState):
    state.graphs += 1
    counters = dynamo_counters()
    counters["turboquant"]["graphs"] += 1
    sites = find_kv_sites(gm)
    eager_reads = sum(site.read == "eager" for site in sites)
    rewritten = rewrite_eager_attention(gm) if eager_reads else 0
    counters["turboquant"]["eager_attention_rewrites"] += rewritten
    to_swap = _analyze(gm, sites, example_inputs, state, eager_rewritten=rewritten >= eager_reads)
    if to_swap:
        # runs once per dense cache, eagerly; the next call fails Dynamo's type guards and
        # compiles the graph over quantized storage, so compiling this one would be wasted
        return _inference_only(_swapping_entry(gm, to_swap, state), state, True)
    quantized = any(isinstance(t, QuantizedCacheTensor) for t in example_inputs) or \
        any(site.k.built_in_graph for site in sites)
    # the bare backend has no wrapper around the model's call: a graph over a quantized cache
    # traced in grad mode is compiled (AOTAutograd: no joint graph) and run under no_grad here
    with state.inference_only(quantized):
        compiled = inductor_compile(gm, example_inputs, mode=state.mode, post_grad_pass=_FOLD_CONSTANT_COPIES)
    return _inference_only(compiled, state, quantized)


def _inference_only(fn, state: CompileState, quantized: bool):
    """``fn`` run in :meth:`CompileState.inference_only` (unchanged when it touches no quantized cache)."""
    if not quantized:
        return fn
    def run(*args):
        with state.inference_only(True):
            return fn(*args)

    return run


def turboquant_backend(gm, example_inputs, mode=None, options=None):
    """The ``"turboquant"`` torch.compile backend: ``torch.compile(m, backend="turboquant", options={...})``.

    ``options`` are :class:`~turboquant.KVQuantConfig` fields (``bits``, ``method``, …).
    Prefer :func:`turboquant.compile`, which also quantizes transformers caches from creation.
    """
    options = dict(options or {})
    state = options.pop("_turboquant_state", None)
    if state is None:
        state = _BACKEND_STATES.get(tuple(sorted(options.items())))
        if state is None:
            state = CompileState(KVQuantConfig.from_kwargs(**options), mode=mode)
            _BACKEND_STATES[tuple(sorted(options.items()))] = state
    return _backend(gm, example_inputs, state)


_BACKEND_STATES: Dict[tuple, CompileState] = {}


def _prepare_hf_cache(model, state: CompileState, cache_arg: str, args, kwargs) -> bool:
    """Give the call a quantized transformers cache, initialized before the compiled region; whether
    it has one."""
    cache = kwargs.get(cache_arg)
    if cache is None:
        if kwargs.get("use_cache") is False or not getattr(model.config, "use_cache", True):
            return False
        cache = hf.new_dynamic_cache(model)
        if cache is None:
            return False
        kwargs[cache_arg] = cache
    if not hf.is_hf_cache(cache):
        return False
    hf.quantize_cache(cache, lambda i: state.config.for_layer(i, len(cache.layers)))
    hf.initialize_cache(cache, model, hf.call_batch_size(args, kwargs))
    return True


def compile(model, bits: int = 4, **options):
    """Quantize ``model``'s KV cache and compile it; returns the model, used as before.

    Args:
        model: an ``nn.Module`` whose forward writes a KV cache and attends over it —
            a transformers model (``DynamicCache``/``StaticCache``, ``generate`` included),
            or a model with cache buffers (gpt-fast, Meta llama style).
        bits: code width of K and V (2, 3, 4, 8).
        **options: :class:`~turboquant.KVQuantConfig` fields (``method``, ``k_bits``,
            ``v_bits``, ``group_size``, ``clip_percentile``, ``metadata_dtype``, ``seed``,
            ``protected_layers``, ``residual_window``, ``frames`` from :func:`turboquant.calibrate`, …)
            and torch.compile's ``mode``, ``fullgraph``, ``dynamic``.

    Raises:
        ValueError: an unknown option or an invalid value, before anything is traced.

    ``turboquant.report(model)`` then tells which layers were rewritten and how.
    """
    compile_kwargs = {k: options.pop(k) for k in _COMPILE_KWARGS if k in options}
    config = KVQuantConfig.from_kwargs(bits=bits, **options)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"turboquant.compile expects an nn.Module, got {type(model).__name__}")
    state = CompileState(config, mode=compile_kwargs.get("mode"), check_after_call=True)
    is_hf = hf.is_hf_model(model)
    if is_hf:
        text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        state.num_layers = getattr(text, "num_hidden_layers", None) or getattr(text, "n_layer", None)
    backend = functools.partial(_backend, state=state)
    original = model.forward
    compiled = torch.compile(original, backend=backend, fullgraph=compile_kwargs.get("fullgraph", False),
                             dynamic=compile_kwargs.get("dynamic"))
    cache_arg = hf.cache_kwarg(original)

    @functools.wraps(original)
    def forward(*args, **kwargs):
        quantized = bool(state.layers)
        hf_quantized = is_hf and _prepare_hf_cache(model, state, cache_arg, args, kwargs)
        with state.inference_only(quantized or hf_quantized):
            out = compiled(*args, **kwargs)
        if state.graphs:
            state.warn_if_no_cache(cache_quantized=hf_quantized, patient=is_hf)
        return out

    model.forward = forward
    model._turboquant = state
    if is_hf and getattr(model, "generation_config", None) is not None:
        model.generation_config.disable_compile = True  # the forward is compiled already
    return model


def cache_nbytes(obj, with_dense: bool = False) -> Dict[str, int]:
    """``{"quantized": bytes held, "dense": bytes the same caches take in their dtype, "elements": their
    elements}``.

    ``obj``: a transformers cache, a module (its buffers), or a list of tensors. Counted: the
    quantized caches; with ``with_dense`` the dense tensors too (a cache's layers left unquantized,
    e.g. protected ones, or a dense baseline; for a module, every buffer).
    """
    if hf.is_hf_cache(obj):
        tensors = [t for layer in obj.layers for t in (getattr(layer, "keys", None), getattr(layer, "values", None))]
    elif isinstance(obj, torch.nn.Module):
        tensors = list(obj.buffers())
    else:
        tensors = list(obj)
    q = [t for t in tensors
         if isinstance(t, QuantizedCacheTensor) or (with_dense and isinstance(t, torch.Tensor) and t.numel())]
    return {"quantized": sum(t.quantized_nbytes if isinstance(t, QuantizedCacheTensor) else t.numel() * t.element_size()
                             for t in q),
            "dense": sum(t.numel() * t.element_size() for t in q),
            "elements": sum(t.numel() for t in q)}


class Report(list):
    """The per-layer rows of :func:`report` (a list of :class:`LayerReport`), printable as a table."""

    config: KVQuantConfig
    bytes: Optional[Dict[str, int]] = None

    def __str__(self) -> str:
        from .reporting import format_table

        c = self.config
        head = (f"turboquant: method={c.method}, k_bits={c.spec('k').bits}, v_bits={c.spec('v').bits}, "
                f"{sum(r.status == 'quantized' for r in self)}/{len(self)} layers quantized")
        if self.bytes and self.bytes["dense"]:
            head += (f"; cache {self.bytes['quantized']:,} bytes vs {self.bytes['dense']:,} dense "
                     f"({self.bytes['quantized'] / self.bytes['dense']:.3f})")
        if c.protected_layers:
            head += (f"; protected layers {list(c.protected_layers)} "
                     + ("unquantized" if c.protected_bits is None else f"at {c.protected_bits} bits"))
        cols = ["layer", "status", "bits", "write", "read", "k_source", "reason"]
        return head + "\n" + format_table([vars(r) for r in self], cols)


def report(model, cache=None) -> Report:
    """What turboquant did to ``model`` (after at least one call): one row per layer.

    ``print(report(model))`` shows method and bits, each layer's status (quantized /
    decoded / dense, with the reason), how its cache is written and read, and — for the
    module's own cache buffers, or for ``cache`` (e.g. a transformers cache) if given — the
    bytes the quantized cache holds against the same cache in its dense dtype.
    """
    state: Optional[CompileState] = getattr(model, "_turboquant", None)
    if state is None:
        raise ValueError("this model was not compiled with turboquant.compile")
    rows = Report(sorted(state.layers.values(), key=lambda r: (r.layer, r.k_source)))
    rows.config = state.config
    rows.bytes = cache_nbytes(cache if cache is not None else model)
    return rows
