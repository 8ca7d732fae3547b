"""Find the KV-cache writes and the attention reads in a Dynamo graph, and link them per layer.

A static cache's write and read are not connected by a data edge (both use the cache
placeholder, DESIGN.md §3), so this is a graph walk, not a pattern match: every attention
read is followed back through view-like ops to its root — a placeholder (preallocated cache,
module buffer), a ``torch.cat`` on one (growing cache), or a
:class:`~turboquant.cache.QuantizedCacheTensor` the graph builds from placeholders (a cache
layer that holds plain buffers, see ``integrations.transformers``) — and the writes found on
the same root are attached to it.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..cache import QuantizedCacheTensor

__all__ = ["CacheSite", "LayerSites", "find_kv_sites", "SDPA_TARGETS"]

SDPA_TARGETS = {F.scaled_dot_product_attention, torch._C._nn.scaled_dot_product_attention}

# ops that keep the identity of the cache they read (views, GQA expansion, dtype casts)
_PASS_THROUGH_METHODS = {"view", "reshape", "expand", "transpose", "permute", "contiguous", "clone", "to",
                         "unsqueeze", "squeeze", "repeat_interleave", "narrow", "__getitem__", "type_as",
                         "float", "half", "bfloat16", "detach", "flatten", "unflatten"}
_PASS_THROUGH_FUNCTIONS = {operator.getitem, torch.transpose, torch.repeat_interleave, torch.reshape,
                           torch.narrow, torch.unsqueeze, torch.flatten, torch.permute, torch.squeeze}
_WRITE_METHODS = {"index_copy_", "index_put_", "copy_", "index_fill_", "masked_scatter_", "scatter_"}


@dataclass
class CacheSite:
    """One cache tensor (K or V of one layer) as the graph sees it."""

    node: str                  # the placeholder's name
    source: str                # where Dynamo found it, e.g. "L['past_key_values'].layers[0].keys"
    role: str                  # "k" or "v"
    writes: List[str] = field(default_factory=list)   # e.g. ["index_copy_"], ["setitem"], ["cat"]
    reads: List[str] = field(default_factory=list)    # "sdpa" or "eager"
    built_in_graph: bool = False  # a QuantizedCacheTensor the graph builds from its codes (``node``)


@dataclass
class LayerSites:
    """The K and V cache sites one attention read links together."""

    layer: int
    k: CacheSite
    v: CacheSite
    read: str                  # "sdpa" or "eager"
    attention_node: str


def _source_name(node: fx.Node) -> str:
    src = node.meta.get("_dynamo_source") or getattr(node, "_dynamo_source", None)
    if src is not None and hasattr(src, "name"):
        name = src.name
        return name() if callable(name) else str(name)
    grapharg = node.meta.get("grapharg")
    if grapharg is not None and getattr(grapharg, "source", None) is not None:
        return grapharg.source.name
    return node.name


def _root(node, seen=None) -> Optional[fx.Node]:
    """The placeholder (or the ``cat`` on a placeholder) a tensor is a view/expansion of."""
    for _ in range(64):
        if not isinstance(node, fx.Node):
            return None
        if node.op == "placeholder" or _built_in_graph(node):
            return node
        if node.op == "call_function" and node.target is torch.cat:
            parts = _cat_parts(node)
            first = _root(parts[0]) if parts else None
            return node if first is not None and (first.op == "placeholder" or _built_in_graph(first)) else None
        if node.op == "call_method" and node.target in _PASS_THROUGH_METHODS:
            node = node.args[0]
            continue
        if node.op == "call_function" and node.target in _PASS_THROUGH_FUNCTIONS:
            node = node.args[0]
            continue
        return None
    return None


def _cat_parts(node: fx.Node):
    return node.args[0] if node.args else node.kwargs.get("tensors")


def _built_in_graph(node: fx.Node) -> bool:
    return node.op == "call_function" and node.target is QuantizedCacheTensor


_HELD_CODES = re.compile(r"\._turboquant_(keys|values)\[0\]$")


def _held_source(codes_source: str) -> str:
    """The attribute a layer's held codes stand for: ``….layers[0]._turboquant_keys[0]`` → ``….layers[0].keys``."""
    return _HELD_CODES.sub(r".\1", codes_source)


def _placeholder_of(root: fx.Node) -> fx.Node:
    """The placeholder a root stands for: itself, the first ``cat`` operand's, or the codes'."""
    if root.op == "placeholder":
        return root
    if _built_in_graph(root):
        return _root(root.args[0] if root.args else root.kwargs["codes"])
    return _root(_cat_parts(root)[0])


def _first_cat_root(node: fx.Node):
    """A ``cat`` root's first operand's root; any other root itself."""
    if node.op == "call_function" and node.target is torch.cat:
        return _root(_cat_parts(node)[0])
    return node


def _write_target(node: fx.Node):
    """(written tensor node, kind) if ``node`` writes into a tensor, else None."""
    if node.op == "call_method" and node.target in _WRITE_METHODS:
        return node.args[0], node.target
    if node.op == "call_function" and node.target is operator.setitem:
        return node.args[0], "setitem"
    if node.op == "call_function" and getattr(node.target, "__name__", "") in _WRITE_METHODS:
        return node.args[0], node.target.__name__
    if node.op == "call_function" and node.target is torch.cat:
        parts = node.args[0] if node.args else node.kwargs.get("tensors")
        return (parts[0], "cat") if parts else None
    return None


def _eager_attention(node: fx.Node):
    """For ``softmax(...) @ v`` built on ``q @ k.transpose``: (k, v) nodes, else None."""
    if not (node.op == "call_function" and node.target in (torch.matmul, operator.matmul)):
        return None
    p, v = node.args[:2]
    # walk back from the probabilities to the score matmul (dropout, casts, softmax in between)
    for _ in range(12):
        if not isinstance(p, fx.Node):
            return None
        if p.op == "call_function" and p.target in (torch.matmul, operator.matmul):
            kt = p.args[1]
            if isinstance(kt, fx.Node) and (
                    (kt.op == "call_method" and kt.target in ("transpose", "mT"))
                    or (kt.op == "call_function" and kt.target is torch.transpose)):
                return kt.args[0], v
            return None
        # torch.where(keep, scores, fill) masks the scores it holds second (GPT-Neo's local and causal mask)
        p = p.args[1] if p.op == "call_function" and p.target is torch.where and len(p.args) == 3 else \
            p.args[0] if p.args else None
    return None


def find_kv_sites(gm: fx.GraphModule) -> List[LayerSites]:
    """Every attention read whose K and V lead back to cache tensors, with the writes into them."""
    writes: Dict[fx.Node, List[str]] = {}
    for node in gm.graph.nodes:
        hit = _write_target(node)
        if hit is not None:
            root = _root(hit[0])
            if root is not None:
                writes.setdefault(_placeholder_of(root), []).append(hit[1])

    layers: List[LayerSites] = []
    for node in gm.graph.nodes:
        kv, read = None, None
        if node.op == "call_function" and node.target in SDPA_TARGETS:
            k = node.args[1] if len(node.args) > 1 else node.kwargs.get("key")
            v = node.args[2] if len(node.args) > 2 else node.kwargs.get("value")
            kv, read = (k, v), "sdpa"
        else:
            pair = _eager_attention(node)
            if pair is not None:
                kv, read = pair, "eager"
        if kv is None:
            continue
        roots = [_root(x) for x in kv]
        if any(r is None for r in roots):
            continue
        ph = [_placeholder_of(r) for r in roots]
        if not (writes.get(ph[0]) and writes.get(ph[1])):
            continue  # attention over tensors nobody writes: not a cache (e.g. cross-attention states)
        built = [_built_in_graph(_first_cat_root(r)) for r in roots]
        sites = [CacheSite(node=p.name, source=_held_source(_source_name(p)) if b else _source_name(p), role=role,
                           writes=list(writes[p]), reads=[read], built_in_graph=b)
                 for p, role, b in zip(ph, ("k", "v"), built)]
        layers.append(LayerSites(layer=len(layers), k=sites[0], v=sites[1], read=read, attention_node=node.name))
    return layers
