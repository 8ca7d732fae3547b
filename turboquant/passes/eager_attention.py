"""Rewrite transformers' eager attention into one attention call that reads quantized caches.

The pattern (``eager_attention_forward`` of Llama, Gemma 2, Qwen, …)::

    w = matmul(q, k.transpose(2, 3)) * scale        # or / d, or no scale; q and k may be upcast to
                                                     # float32 first (GPT-Neo)
    w = tanh(w / softcap) * softcap                  # optional (Gemma 2)
    w = where(keep, w, fill)                         # optional (GPT-Neo's causal / local band)
    w = w + mask                                     # optional
    p = softmax(w, dim=-1, dtype=float32).to(dtype)  # or softmax(w.float(), -1).type_as(q);
                                                     # dropout(p, training=False) optional
    out = matmul(p, v)

becomes ``attention_over_cache(q, k, v, mask, scale=…, softcap=…)`` (a ``where`` folds into the mask as
``where(keep, mask, fill)``: a dropped score becomes ``w + fill`` rather than ``fill + mask``, which softmax
weighs 0 all the same), which is a single
``turboquant::attention`` when ``k``/``v`` are quantized caches and the same eager math
otherwise. Anything that does not match exactly is left alone.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, List, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

from ..cache import attention_over_cache

__all__ = ["rewrite_eager_attention", "EagerMatch"]

_MATMUL = (torch.matmul, operator.matmul)
_MUL = (operator.mul, torch.mul)
_DIV = (operator.truediv, torch.div)
_ADD = (operator.add, torch.add)


@dataclass
class EagerMatch:
    q: fx.Node
    k: fx.Node
    v: fx.Node
    mask: Optional[fx.Node]
    scale: float
    softcap: Optional[float]
    chain: List[fx.Node]       # the replaced nodes, last one first
    keep: Optional[fx.Node] = None   # torch.where(keep, scores, fill) before the additive mask
    fill: Any = None
    upcast: bool = False       # q and k taken to float32 for the score matmul


def _is(node, op, targets) -> bool:
    return isinstance(node, fx.Node) and node.op == op and node.target in targets


def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _key_of_transpose(kt) -> Optional[fx.Node]:
    """``k`` if ``kt`` is ``k.transpose(-2, -1)`` (any spelling), else None."""
    if not isinstance(kt, fx.Node):
        return None
    if kt.op == "call_method" and kt.target == "transpose" or _is(kt, "call_function", (torch.transpose,)):
        k, d0, d1 = kt.args[0], kt.args[1], kt.args[2]
        return k if {d0, d1} in ({2, 3}, {-2, -1}, {-1, 2}, {3, -2}) else None
    if kt.op == "call_function" and kt.target is getattr and kt.args[1] == "mT":
        return kt.args[0]
    return None


def _softmax_input(p) -> Optional[tuple]:
    """(scores node, chain) for ``p`` = softmax(scores, -1) possibly followed by a cast and dropout."""
    chain = []
    for _ in range(4):
        if not isinstance(p, fx.Node):
            return None
        if _is(p, "call_function", (F.dropout,)):
            if p.kwargs.get("training", p.args[2] if len(p.args) > 2 else True) is not False:
                return None
            chain.append(p)
            p = p.args[0]
        elif p.op == "call_method" and p.target in ("to", "type", "type_as", "float", "half", "bfloat16"):
            chain.append(p)
            p = p.args[0]
        elif _is(p, "call_function", (F.softmax, torch.softmax)) or (p.op == "call_method" and p.target == "softmax"):
            dim = p.kwargs.get("dim", p.args[1] if len(p.args) > 1 else None)
            if dim not in (-1, 3):
                return None
            chain.append(p)
            s = p.args[0]
            # Meta's reference code upcasts before the softmax: softmax(scores.float(), dim=-1)
            if isinstance(s, fx.Node) and s.op == "call_method" and s.target in ("float", "to") and len(s.users) == 1:
                chain.append(s)
                s = s.args[0]
            return s, chain
        else:
            return None
    return None


def _scores(s, chain) -> Optional[tuple]:
    """(q, k, scale, softcap, upcast, keep, fill, mask) for the pre-softmax scores ``s``."""
    if _is(s, "call_function", _ADD):
        a, b = s.args[:2]
        chain.append(s)
        for cand, other in ((a, b), (b, a)):
            got = _kept(cand, list(chain))
            if got is not None:
                chain[:] = got[-1]
                return (*got[:-1], other)
        return None
    got = _kept(s, chain)
    if got is None:
        return None
    chain[:] = got[-1]
    return (*got[:-1], None)


def _kept(s, chain):
    """:func:`_capped`'s (q, k, scale, softcap, upcast) and (keep, fill) of ``s = torch.where(keep, scores, fill)``
    (None, None without one), then the chain."""
    keep = fill = None
    if _is(s, "call_function", (torch.where,)) and len(s.args) == 3 and not s.kwargs:
        keep, fill, chain, s = s.args[0], s.args[2], chain + [s], s.args[1]
    got = _capped(s, chain)
    return None if got is None else (*got[:-1], keep, fill, got[-1])


def _upcast_source(x) -> Optional[fx.Node]:
    """``t`` if ``x`` is ``t.to(torch.float32)`` or ``t.float()`` and used once, else None."""
    if not (isinstance(x, fx.Node) and x.op == "call_method" and len(x.users) == 1 and not x.kwargs):
        return None
    if x.target == "float" and len(x.args) == 1 or x.target in ("to", "type") and x.args[1:] == (torch.float32,):
        return x.args[0]
    return None


def _capped(s, chain):
    softcap = None
    if _is(s, "call_function", _MUL) and _number(s.args[1]) and _is(s.args[0], "call_function", (torch.tanh,)):
        t = s.args[0]
        inner = t.args[0]
        if _is(inner, "call_function", _DIV) and inner.args[1] == s.args[1]:
            softcap = float(s.args[1])
            chain = chain + [s, t, inner]
            s = inner.args[0]
        else:
            return None
    scale = 1.0
    if _is(s, "call_function", _MUL) and _number(s.args[1]):
        scale, chain, s = float(s.args[1]), chain + [s], s.args[0]
    elif _is(s, "call_function", _DIV) and _number(s.args[1]):
        scale, chain, s = 1.0 / float(s.args[1]), chain + [s], s.args[0]
    if not _is(s, "call_function", _MATMUL):
        return None
    q, k = s.args[0], _key_of_transpose(s.args[1])
    if k is None:
        return None
    chain = chain + [s, s.args[1]]
    q_source, k_source = _upcast_source(q), _upcast_source(k)
    upcast = q_source is not None and k_source is not None
    if upcast:
        chain, q, k = chain + [q, k], q_source, k_source
    return q, k, scale, softcap, upcast, chain


def match_eager_attention(node: fx.Node) -> Optional[EagerMatch]:
    if not _is(node, "call_function", _MATMUL):
        return None
    p, v = node.args[:2]
    got = _softmax_input(p)
    if got is None:
        return None
    s, chain = got
    got = _scores(s, chain)
    if got is None:
        return None
    q, k, scale, softcap, upcast, keep, fill, mask = got
    return EagerMatch(q=q, k=k, v=v, mask=mask, scale=scale, softcap=softcap, chain=[node] + chain, keep=keep,
                      fill=fill, upcast=upcast)


def rewrite_eager_attention(gm: fx.GraphModule) -> int:
    """Replace every matched eager attention in ``gm``; returns how many."""
    count = 0
    for node in list(gm.graph.nodes):
        m = match_eager_attention(node)
        if m is None:
            continue
        with gm.graph.inserting_before(node):
            mask = m.mask
            if m.keep is not None:
                mask = gm.graph.call_function(torch.where, (m.keep, 0.0 if mask is None else mask, m.fill))
            kwargs = {"scale": m.scale, "softcap": m.softcap}
            if m.upcast:
                kwargs["upcast"] = True
            new = gm.graph.call_function(attention_over_cache, (m.q, m.k, m.v, mask), kwargs)
        new.meta.update(node.meta)
        node.replace_all_uses_with(new)
        for n in m.chain:  # output first: each becomes dead once its user is gone
            if not n.users:
                gm.graph.erase_node(n)
        count += 1
    if count:
        gm.graph.lint()
        gm.recompile()
    return count
