"""Calibrated K/V frames (turboquant.calibration): measurement, storage, attention, the eval option."""

import copy

import pytest
import torch
import torch.nn.functional as F

import turboquant
from turboquant import KVQuantConfig
from turboquant.cache import QuantizedCacheTensor, UnsupportedCacheOperation
from turboquant.calibration import KEY_MAPS, KVFrames, calibrate, frame_query, frame_rows, unframe_rows
from turboquant.testing import KERNEL_REL_TOL, tiny_hf_model


def _keys(B=2, H=2, S=40, D=64, seed=0):
    """Keys with a large common offset and channels of very unequal spread, as trained models have."""
    gen = torch.Generator().manual_seed(seed)
    spread = torch.logspace(-1, 0.7, D)[torch.randperm(D, generator=gen)]
    return torch.randn(B, H, S, D, generator=gen) * spread + 3 * torch.randn(H, 1, D, generator=gen)


def _frame(x, key_map="full", query_moment=None):
    """A frame measured on ``x [B, H, S, D]`` the way calibrate measures one."""
    from turboquant.calibration import _key_frame, _Moments

    m = _Moments()
    m.add(x)
    return _key_frame(m, query_moment, key_map)


def _centred_cov(x):
    x = x.double() - x.double().mean((0, 2), keepdim=True)
    return torch.einsum("bhtd,bhte->hde", x, x) / (x.shape[0] * x.shape[2])


@pytest.mark.parametrize("key_map", KEY_MAPS)
def test_frame_rows_round_trip_exactly(key_map):
    x = _keys()
    f = _frame(x, key_map)
    assert f.shape == (2, 2 if key_map == "diagonal" else 129, 64)
    assert torch.allclose(unframe_rows(frame_rows(x, f), f), x, rtol=1e-5, atol=1e-4)
    framed = frame_rows(x, f).double()
    assert framed.mean((0, 2)).abs().max() < 1e-4  # centred per head
    q = torch.randn(2, 2, 5, 64, dtype=torch.float64)  # the query's move keeps scores up to q·μ
    scores = frame_query(q, f.double()) @ framed.transpose(-1, -2)
    want = q @ (x.double() - f[:, 0:1].double()).transpose(-1, -2)
    assert torch.allclose(scores, want, rtol=1e-5, atol=1e-4)
    b = _centred_cov(x)
    if key_map == "diagonal":  # without queries (a = 1) the optimal scale s² = a/b leaves channel spreads of √b
        sd = torch.diagonal(b, dim1=-2, dim2=-1).sqrt()
        ratio = framed.pow(2).mean((0, 2)).sqrt() / sd.sqrt()
        assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio), rtol=1e-3)
    else:  # ... and the full map F = B^-1/4 leaves a covariance ∝ B^1/2 (mean squared singular value 1)
        got = _centred_cov(framed)
        w, u = torch.linalg.eigh(b)
        half = (u * w.sqrt()[..., None, :]) @ u.transpose(-1, -2)
        c = torch.einsum("hii->h", got) / torch.einsum("hii->h", half)
        assert torch.allclose(got, c[:, None, None] * half, rtol=1e-3, atol=1e-3 * float(got.abs().max()))


def test_the_full_map_minimises_the_score_error_it_models():
    """``F`` minimises tr(F⁻¹AF^-T)·tr(FᵀBF) (the score error of an isotropic error on the framed
    keys): no perturbation does better, the diagonal form does worse on correlated channels."""
    from turboquant.calibration import _balanced_map

    gen = torch.Generator().manual_seed(3)
    mix = lambda: torch.linalg.qr(torch.randn(16, 16, generator=gen, dtype=torch.float64))[0]  # noqa: E731
    a = mix() @ torch.diag(torch.logspace(-2, 1, 16, dtype=torch.float64)) @ mix().T
    a = a @ a.T
    b = mix() @ torch.diag(torch.logspace(-1, 1, 16, dtype=torch.float64)) @ mix().T
    b = b @ b.T

    def cost(f):  # framed keys k F, queries q F^-T: E|q F^-T|² · E|k F|²
        fi = torch.linalg.inv(f)
        return float(torch.trace(fi @ a @ fi.T) * torch.trace(f.T @ b @ f))

    f = _balanced_map(a, b)
    best = cost(f)
    for _ in range(20):
        assert cost(f @ (torch.eye(16, dtype=torch.float64) + 1e-2 * torch.randn(16, 16, generator=gen,
                                                                                 dtype=torch.float64))) > best
    diag = torch.diag((torch.diagonal(a).sqrt() / torch.diagonal(b).sqrt()).sqrt())
    assert best < 0.9 * cost(diag) < 0.9 * cost(torch.eye(16, dtype=torch.float64))


@pytest.mark.parametrize("key_map", KEY_MAPS)
@pytest.mark.parametrize("method,bits", [("turbo", 4), ("turbo", 3), ("affine", 4)])
def test_a_frame_shrinks_the_score_error(method, bits, key_map):
    """The point of a frame: the same codes width, a smaller error in q·k (measured, not assumed)."""
    k = _keys(S=256)
    q = torch.randn(2, 2, 8, 64, generator=torch.Generator().manual_seed(1))
    spec = KVQuantConfig(method=method, bits=bits).spec("k")
    plain = QuantizedCacheTensor.from_dense(k, spec).dequantize()
    framed = QuantizedCacheTensor.from_dense(k, spec, frame=_frame(k, key_map)).dequantize()
    ref = q @ k.transpose(-1, -2)

    def err(kh):  # score error up to the per-query shift softmax ignores
        e = q @ kh.transpose(-1, -2) - ref
        return float((e - e.mean(-1, keepdim=True)).norm() / (ref - ref.mean(-1, keepdim=True)).norm())

    assert err(framed) < 0.7 * err(plain)


@pytest.mark.parametrize("key_map", KEY_MAPS)
def test_views_and_writes_keep_the_frame_aligned(key_map):
    k = _keys(B=3, H=2, S=24, D=32)
    f = _frame(k, key_map)
    spec = KVQuantConfig(method="turbo", bits=4).spec("k")
    cache = QuantizedCacheTensor.empty((3, 2, 30, 32), spec, dtype=torch.float32, frame=f)
    assert torch.allclose(cache.dequantize(), f[:, 0:1, :].expand(3, 2, 30, 32))  # empty rows decode to μ
    cache.index_copy_(2, torch.arange(20), k[:, :, :20])
    cache[:, :, torch.tensor([20, 21, 22, 23])] = k[:, :, 20:24]  # gpt-fast's write
    want = QuantizedCacheTensor.from_dense(k, spec, frame=f).dequantize()
    dense = cache.dequantize()
    assert torch.equal(dense[:, :, :24], want)
    assert torch.equal(cache[1:].dequantize(), dense[1:])  # batch slice
    assert torch.equal(cache[:, :, 5:9].dequantize(), dense[:, :, 5:9])  # sequence slice: the frame stays
    rep = cache[:, :, None].expand(3, 2, 4, 30, 32).reshape(3, 8, 30, 32)  # repeat_kv: lazy GQA
    assert rep.head_repeat == 4 and torch.equal(rep.dequantize(), dense.repeat_interleave(4, 1))
    grown = torch.cat([QuantizedCacheTensor.from_dense(k[:, :, :10], spec, frame=f), k[:, :, 10:]], -2)
    assert torch.equal(grown.dequantize(), want)
    with pytest.raises(UnsupportedCacheOperation, match="frame"):
        cache.index_copy_(0, torch.tensor([0]), torch.zeros(1, 2, 30, 32))  # along the batch
    with pytest.raises(ValueError, match=r"kv_heads, 2 or 2 \* head_dim \+ 1, head_dim"):
        QuantizedCacheTensor.empty((1, 3, 4, 32), spec, frame=f)  # 3 heads, a frame for 2


def test_attention_over_a_framed_cache_is_attention_over_its_decoded_rows():
    k, v = _keys(seed=2), _keys(seed=3)
    kf, vf = _frame(k), _frame(v)
    cfg = KVQuantConfig(method="turbo", bits=3)
    kc = QuantizedCacheTensor.from_dense(k, cfg.spec("k"), frame=kf)
    vc = QuantizedCacheTensor.from_dense(v, cfg.spec("v"), frame=vf)
    q = torch.randn(2, 4, 3, 64, generator=torch.Generator().manual_seed(4))
    out = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True, is_causal=False)
    ref = F.scaled_dot_product_attention(q, kc.dequantize(), vc.dequantize(), enable_gqa=True)
    assert torch.allclose(out, ref, atol=1e-5)


def test_a_soft_cap_reads_framed_caches_decoded():
    """tanh is not shift-invariant, so with a soft-cap the frames go into the op, which decodes."""
    from turboquant.cache import attention_over_cache
    from turboquant.quant.reference import masked_softmax

    k, v = _keys(seed=8), _keys(seed=9)
    cfg = KVQuantConfig(method="turbo", bits=4)
    kc = QuantizedCacheTensor.from_dense(k, cfg.spec("k"), window=3, frame=_frame(k))
    vc = QuantizedCacheTensor.from_dense(v, cfg.spec("v"), window=3, frame=_frame(v, "diagonal"))
    q = torch.randn(2, 4, 2, 64, generator=torch.Generator().manual_seed(10))
    out = attention_over_cache(q, kc, vc, scale=0.125, softcap=5.0)
    kd, vd = kc.dequantize().repeat_interleave(2, 1), vc.dequantize().repeat_interleave(2, 1)
    ref = masked_softmax(q @ kd.transpose(-1, -2) * 0.125, None, False, 5.0) @ vd
    assert torch.allclose(out, ref, atol=1e-5)
    moved = attention_over_cache(q, kc, vc, scale=0.125)  # without: the query moves instead
    assert torch.allclose(moved, F.scaled_dot_product_attention(q, kd, vd, scale=0.125), atol=1e-5)


@pytest.mark.parametrize("key_map", KEY_MAPS)
def test_a_compiled_graph_moves_the_frames_around_the_op(key_map):
    """Compiled, the op reads the cache's buffers with no frame (the query's move, the ring's framing
    and the output's unframing are the graph's own ops) and computes attention over the decoded rows."""
    import re

    from turboquant.compat import run_and_get_code

    k, v = _keys(S=30, seed=11), _keys(S=30, seed=12)
    cfg = KVQuantConfig(method="turbo", bits=4)
    kc = QuantizedCacheTensor.from_dense(k, cfg.spec("k"), window=4, frame=_frame(k, key_map))
    vc = QuantizedCacheTensor.from_dense(v, cfg.spec("v"), window=4, frame=_frame(v, "diagonal"))
    q = torch.randn(2, 4, 1, 64, generator=torch.Generator().manual_seed(13))
    f = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), fullgraph=True)
    out, code = run_and_get_code(f, q, kc, vc)
    call = re.search(r"\bturboquant_attention\(.*", "\n".join(code)).group(0)
    assert ("k_frame=None" in call and "v_frame=None" in call) or call.rstrip().endswith(", None, None)"), call
    ref = F.scaled_dot_product_attention(q, kc.dequantize(), vc.dequantize(), enable_gqa=True)
    assert float((out - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.parametrize("window,key_map", [(0, "full"), (5, "full"), (0, "diagonal")])
def test_the_kernel_reads_framed_codes_with_the_query_moved(window, key_map, monkeypatch):
    """Attention over framed caches through the CUDA entry of the op (the Triton kernel: interpreted
    on the CPU): the query moved, the ring framed and the output unframed around the op, against
    attention over the decoded rows, within the kernel's tolerance."""
    pytest.importorskip("triton")
    import turboquant.cache as cache_mod
    from turboquant.ops import _attention_cuda

    device = "cuda" if torch.cuda.is_available() else "cpu"
    k, v = _keys(S=45, seed=5).to(device), _keys(S=45, seed=6).to(device)
    kf, vf = _frame(k.cpu(), key_map), _frame(v.cpu(), "diagonal")
    cfg = KVQuantConfig(method="turbo", bits=4)
    kc = QuantizedCacheTensor.from_dense(k, cfg.spec("k"), window=window, frame=kf)
    vc = QuantizedCacheTensor.from_dense(v, cfg.spec("v"), window=window, frame=vf)
    q = torch.randn(2, 8, 1, 64, generator=torch.Generator().manual_seed(7)).to(device)
    calls = []

    def cuda_entry(*args):
        calls.append(args[-2:])  # the frames the op got
        return _attention_cuda(*args)

    monkeypatch.setattr(cache_mod, "_attention_op", cuda_entry)
    out = F.scaled_dot_product_attention(q, kc, vc, scale=0.125, enable_gqa=True)
    assert calls == [(None, None)]  # moved out of the op: the kernel ran (it decodes when given frames)
    kd, vd = kc.dequantize(torch.float64), vc.dequantize(torch.float64)
    if window:  # the ring's rows are exact
        assert torch.equal(kd[:, :, -1], k[:, :, -1].double())
    ref = F.scaled_dot_product_attention(q.double(), kd, vd, scale=0.125, enable_gqa=True)
    assert float((out.double() - ref).norm() / ref.norm()) < KERNEL_REL_TOL


def test_calibrate_measures_each_layer_and_compile_uses_the_frames():
    model = tiny_hf_model("llama")
    ids = torch.randint(0, 128, (3, 33), generator=torch.Generator().manual_seed(0))
    frames = turboquant.calibrate(model, ids, batch_size=2)
    assert isinstance(frames, KVFrames) and frames.num_layers == 2 and frames.tokens == 99
    from transformers import DynamicCache

    from turboquant.integrations.transformers import cache_kwarg

    arg = cache_kwarg(model.forward)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=ids, use_cache=True, **{arg: cache})
    k = cache.layers[1].keys.double()
    assert torch.allclose(frames.frame(1, "k")[:, 0], k.mean((0, 2)).float(), atol=1e-5)
    assert torch.allclose(frames.frame(1, "v")[:, 1], torch.ones(2, 32))
    fk = frames.frame(0, "k")  # full by default: μ, F, F⁻¹
    assert fk.shape == (2, 65, 32)
    assert torch.allclose(fk[:, 1:33].pow(2).sum((-2, -1)) / 32, torch.ones(2))
    assert torch.allclose(fk[:, 1:33] @ fk[:, 33:], torch.eye(32).expand(2, 32, 32), atol=1e-4)
    diag = turboquant.calibrate(model, ids, batch_size=2, key_map="diagonal")
    assert torch.allclose(diag.frame(0, "k")[:, 1].pow(2).mean(-1), torch.ones(2))
    assert torch.equal(diag.frame(0, "k")[:, 0], fk[:, 0])
    # eager attention never calls SDPA: no query moments, a warning, and maps from the keys alone
    with pytest.warns(UserWarning, match="key maps ignore the queries"):
        blind = turboquant.calibrate(tiny_hf_model("llama", attn="eager"), ids)
    assert torch.allclose(blind.frame(1, "k")[:, 0], frames.frame(1, "k")[:, 0], atol=1e-5)
    assert not torch.allclose(blind.frame(1, "k")[:, 1:33], frames.frame(1, "k")[:, 1:33], rtol=1e-2)

    cfg = dict(method="turbo", bits=4)
    prompt = ids[:1, :12]
    with torch.no_grad():
        ref = model(input_ids=prompt).logits
        plain = turboquant.compile(tiny_hf_model("llama"), **cfg)
        framed = turboquant.compile(tiny_hf_model("llama"), frames=frames, **cfg)
        lp = plain(input_ids=prompt, use_cache=True, **{arg: DynamicCache(config=model.config)}).logits
        lf = framed(input_ids=prompt, use_cache=True, **{arg: DynamicCache(config=model.config)}).logits
    rows = turboquant.report(framed)
    assert len(rows) == 2 and all(r.status == "quantized" for r in rows)
    assert not torch.equal(lp, lf)  # the frames reached the caches
    rel = lambda x: float((x - ref).norm() / ref.norm())  # noqa: E731
    assert rel(lf) < 0.1 and rel(lp) < 0.1


def test_config_and_eval_options_are_validated():
    with pytest.raises(ValueError, match="frames=.*allowed: None or the KVFrames"):
        KVQuantConfig(frames="calibrated")
    with pytest.raises(ValueError, match="layer 5 has no frame"):
        KVFrames(keys=(None,), values=(None,)).frame(5, "k")
    from turboquant.eval.configs import parse_config

    cfg = parse_config("turbo-4-f8")
    assert cfg.calibration_windows == 8 and cfg.bits == (4, 4) and cfg.key_map == "full"
    assert parse_config("turbo-4-f8d").calibration_windows == 8 and parse_config("turbo-4-f8d").key_map == "diagonal"
    with pytest.raises(ValueError, match="needs calibrated frames"):
        cfg.kv_config()
    with pytest.raises(ValueError, match="calibration windows must be >= 1"):
        parse_config("turbo-4-f0")
    with pytest.raises(ValueError, match="key_map='pca'; allowed: 'full', 'diagonal'"):
        calibrate(tiny_hf_model("llama"), torch.zeros(1, 4, dtype=torch.long), key_map="pca")
    with pytest.raises(ValueError, match="2 \\* head_dim \\+ 1"):
        KVFrames(keys=(torch.zeros(2, 3, 8),), values=(None,))
    with pytest.raises(NotImplementedError, match="not a transformers model"):
        calibrate(torch.nn.Linear(2, 2), torch.zeros(1, 4, dtype=torch.long))


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_static_cache_generation_with_full_maps_and_a_window_matches_eager():
    """The CPU counterpart of the GPU generation test for what the H200 did not finish this time: a
    compiled static-cache generate with full-map frames and a residual window computes what eager
    generation over the same quantized cache computes (teacher-forced on the eager tokens)."""
    from transformers import DynamicCache

    from turboquant.integrations.transformers import quantize_cache

    model = tiny_hf_model("llama")
    gen = torch.Generator().manual_seed(14)
    frames = turboquant.calibrate(model, torch.randint(0, 128, (2, 48), generator=gen))
    options = dict(method="turbo", bits=4, frames=frames, residual_window=3)
    cfg = KVQuantConfig(**options)
    ids = torch.randint(0, 128, (2, 11), generator=gen)

    def generate(m, force=None, **kw):
        if force is not None:
            kw["prefix_allowed_tokens_fn"] = lambda b, seq: [int(force[b, seq.shape[-1] - ids.shape[1]])]
        with torch.no_grad():
            out = m.generate(ids, max_new_tokens=6, min_new_tokens=6, do_sample=False, output_logits=True,
                             return_dict_in_generate=True, **kw)
        return out.sequences[:, ids.shape[1]:], torch.stack(out.logits, 1)

    cache = DynamicCache(config=model.config)
    quantize_cache(cache, lambda i: cfg)
    ref_tokens, ref_logits = generate(model, past_key_values=cache)
    _, plain_logits = generate(model, force=ref_tokens)
    compiled = turboquant.compile(copy.deepcopy(model), **options)
    tokens, logits = generate(compiled, force=ref_tokens, cache_implementation="static")
    assert torch.equal(tokens, ref_tokens)
    rel = lambda x, y: float((x - y).norm() / y.norm())  # noqa: E731
    assert rel(logits, ref_logits) < 0.05 * rel(ref_logits, plain_logits), (rel(logits, ref_logits),
                                                                            rel(ref_logits, plain_logits))
    assert all(r.status == "quantized" for r in turboquant.report(compiled))
