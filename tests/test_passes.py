"""The FX passes on hand-written graphs: site linking, the eager-attention rewrite (counter, graph, numbers)."""

import pytest
import torch
import torch.nn.functional as F

from turboquant import KVQuantConfig, quantize_kv, reference_attention
from turboquant.cache import QuantizedCacheTensor, attention_over_cache
from turboquant.passes import find_kv_sites, rewrite_eager_attention


def _capture(fn, *args, rewrite=False):
    """(Dynamo graph of ``fn`` — what a backend receives —, compiled fn running that graph)."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append((gm, find_kv_sites(gm), rewrite_eager_attention(gm) if rewrite else 0))
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend, fullgraph=True)
    compiled(*[a.clone() for a in args])
    return graphs[0], compiled


def eager_attention(q, k_cache, v_cache, k, pos, mask, softcap=None):
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, k)
    g = q.shape[1] // k_cache.shape[1]
    kk, vv = k_cache.repeat_interleave(g, 1), v_cache.repeat_interleave(g, 1)
    w = torch.matmul(q, kk.transpose(2, 3)) * 0.125
    if softcap is not None:
        w = w / softcap
        w = torch.tanh(w)
        w = w * softcap
    w = w + mask
    p = F.softmax(w, dim=-1, dtype=torch.float32).to(q.dtype)
    p = F.dropout(p, p=0.0, training=False)
    return torch.matmul(p, vv)


def _inputs(S=12, D=64):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, D, generator=g)
    kc, vc = torch.zeros(1, 2, S, D), torch.zeros(1, 2, S, D)
    kc[:, :, :5] = torch.randn(1, 2, 5, D, generator=g)
    vc[:, :, :5] = torch.randn(1, 2, 5, D, generator=g)
    k = torch.randn(1, 2, 1, D, generator=g)
    mask = torch.zeros(1, 1, 1, S)
    mask[..., 6:] = torch.finfo(torch.float32).min
    return q, kc, vc, k, torch.tensor([5]), mask


@pytest.mark.parametrize("softcap", [None, 30.0])
def test_eager_pattern_is_linked_and_rewritten(softcap):
    args = _inputs()
    fn = lambda *a: eager_attention(*a, softcap=softcap)  # noqa: E731
    expect = fn(*[a.clone() for a in args])
    (gm, sites, rewrites), compiled = _capture(fn, *args, rewrite=True)
    assert len(sites) == 1 and sites[0].read == "eager"
    assert sites[0].k.writes == ["index_copy_"] and sites[0].v.writes == ["index_copy_"]
    assert rewrites == 1
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert attention_over_cache in targets
    assert torch.matmul not in targets and F.softmax not in targets and torch.tanh not in targets
    call = next(n for n in gm.graph.nodes if n.target is attention_over_cache)
    assert call.kwargs["scale"] == 0.125 and call.kwargs["softcap"] == softcap
    torch.testing.assert_close(compiled(*[a.clone() for a in args]), expect, rtol=1e-5, atol=1e-6)


def test_rewritten_graph_over_quantized_caches_is_the_oracle():
    q, kc, vc, k, pos, mask = _inputs()
    cfg = KVQuantConfig(method="turbo", bits=4)
    qk = QuantizedCacheTensor.from_dense(kc, cfg.spec("k"))
    qv = QuantizedCacheTensor.from_dense(vc, cfg.spec("v"))
    fn = lambda *a: eager_attention(*a, softcap=30.0)  # noqa: E731
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(rewrite_eager_attention(gm))
        return gm.forward

    torch._dynamo.reset()
    out = torch.compile(fn, backend=backend, fullgraph=True)(q, qk, qv, k, pos, mask)
    assert graphs == [1]
    dense_k, dense_v = kc.clone(), vc.clone()
    dense_k[:, :, 5:6], dense_v[:, :, 5:6] = k, k
    ref = reference_attention(q, quantize_kv(dense_k, cfg), quantize_kv(dense_v, cfg, role="v"),
                              attn_mask=mask, scale=0.125, softcap=30.0)
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-5


def gpt_neo_attention(q, k_cache, v_cache, k, pos, mask, keep):
    """GPT-Neo's eager attention: scores in float32, unscaled, a boolean band (causal or local) by where."""
    k_cache.index_copy_(2, pos, k)
    v_cache.index_copy_(2, pos, k)
    w = torch.matmul(q.to(torch.float32), k_cache.to(torch.float32).transpose(-1, -2))
    fill = torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
    w = torch.where(keep, w, fill) + mask
    p = F.softmax(w, dim=-1).to(v_cache.dtype)
    return torch.matmul(F.dropout(p, 0.0, False), v_cache)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_where_masked_float32_scores_are_rewritten(dtype):
    q, kc, vc, k, pos, mask = (a.to(dtype) if a.is_floating_point() else a for a in _inputs())
    q, k = q[:, :2], k / 8  # MHA as GPT-Neo; unscaled scores of moderate size
    keep = torch.ones(1, 1, 1, 12, dtype=torch.bool)
    keep[..., :2] = False  # a local band that starts after the first two keys
    expect = gpt_neo_attention(q, kc.clone(), vc.clone(), k, pos, mask, keep)
    (gm, sites, rewrites), compiled = _capture(gpt_neo_attention, q, kc, vc, k, pos, mask, keep, rewrite=True)
    assert len(sites) == 1 and sites[0].read == "eager" and rewrites == 1
    call = next(n for n in gm.graph.nodes if n.target is attention_over_cache)
    assert call.kwargs == {"scale": 1.0, "softcap": None, "upcast": True}
    assert call.args[3].target is torch.where
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.matmul not in targets and F.softmax not in targets
    out = compiled(q, kc.clone(), vc.clone(), k, pos, mask, keep)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expect, rtol=0, atol=0)

    cfg = KVQuantConfig(bits=4)
    qk, qv = (QuantizedCacheTensor.from_dense(c, cfg.spec(r)) for c, r in ((kc, "k"), (vc, "v")))
    out = compiled(q, qk, qv, k, pos, mask, keep)
    dense_k, dense_v = kc.clone(), vc.clone()
    dense_k[:, :, 5:6], dense_v[:, :, 5:6] = k, k
    ref = reference_attention(q.double(), quantize_kv(dense_k, cfg), quantize_kv(dense_v, cfg, role="v"),
                              attn_mask=mask.double().masked_fill(~keep, float("-inf")), scale=1.0)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    assert float((out.double() - ref).norm() / ref.norm()) < tol


def test_unrecognized_eager_variant_is_left_alone():
    def odd(q, kc, vc, k, pos, mask):
        kc.index_copy_(2, pos, k)
        vc.index_copy_(2, pos, k)
        w = torch.matmul(q, kc.repeat_interleave(2, 1).transpose(2, 3))
        p = torch.sigmoid(w)  # not softmax
        return torch.matmul(p, vc.repeat_interleave(2, 1))

    (gm, sites, rewrites), _ = _capture(odd, *_inputs(), rewrite=True)
    assert rewrites == 0


def test_attention_not_over_a_written_tensor_is_not_a_cache():
    def cross(q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    (gm, sites, _), _ = _capture(cross, torch.randn(1, 2, 3, 64), torch.randn(1, 2, 5, 64), torch.randn(1, 2, 5, 64))
    assert sites == []


def test_softcap_oracle():
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 3, 64, generator=g, dtype=torch.float64) * 4 for _ in range(3))
    s = q @ k.transpose(-1, -2) * 0.125
    expect = torch.softmax(torch.tanh(s / 5.0) * 5.0, -1) @ v
    torch.testing.assert_close(reference_attention(q, k, v, scale=0.125, softcap=5.0), expect)
    cfg = KVQuantConfig(bits=4)
    kq, vq = quantize_kv(k, cfg), quantize_kv(v, cfg, role="v")
    from turboquant import folded_attention

    torch.testing.assert_close(folded_attention(q, kq, vq, scale=0.125, softcap=5.0),
                               reference_attention(q, kq, vq, scale=0.125, softcap=5.0), atol=1e-10, rtol=0)


def _constant_copy_graph(other_use):
    import torch.fx as fx

    g = fx.Graph()
    x = g.placeholder("x")
    const = g.get_attr("_tensor_constant0")
    copy = g.call_function(torch.ops.aten.lift_fresh_copy.default, (const,))
    rt = g.call_function(torch.ops.aten.permute.default, (copy, [1, 0]))
    if other_use == "add_":  # written
        g.call_function(torch.ops.aten.add_.Tensor, (rt, 1.0))
    elif other_use == "bucketize":  # read by a lowering that needs a fake input (seen failing)
        g.call_function(torch.ops.aten.bucketize.Tensor, (x, copy))
    g.output(g.call_function(torch.ops.aten.mm.default, (x, rt)))
    return g


@pytest.mark.parametrize("other_use", [None, "add_", "bucketize"])
def test_a_copy_of_a_constant_is_folded_only_where_matmuls_alone_read_it(other_use):
    from turboquant.compat import dynamo_counters
    from turboquant.passes import FoldConstantCopies

    g = _constant_copy_graph(other_use)
    dynamo_counters().clear()
    FoldConstantCopies()(g)
    copies = [n for n in g.nodes if n.target is torch.ops.aten.lift_fresh_copy.default]
    folded = other_use is None
    assert len(copies) == (0 if folded else 1)
    assert dynamo_counters()["turboquant"]["constant_copies_folded"] == (1 if folded else 0)
    assert isinstance(FoldConstantCopies().uuid(), (bytes, str))
