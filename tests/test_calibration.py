"""Calibrated K/V frames (turboquant.calibration): measurement, storage, attention, the eval option."""

import pytest
import torch
import torch.nn.functional as F

import turboquant
from turboquant import KVQuantConfig
from turboquant.cache import QuantizedCacheTensor, UnsupportedCacheOperation
from turboquant.calibration import KVFrames, calibrate, frame_rows, unframe_rows
from turboquant.testing import KERNEL_REL_TOL, tiny_hf_model


def _keys(B=2, H=2, S=40, D=64, seed=0):
    """Keys with a large common offset and channels of very unequal spread, as trained models have."""
    gen = torch.Generator().manual_seed(seed)
    spread = torch.logspace(-1, 0.7, D)[torch.randperm(D, generator=gen)]
    return torch.randn(B, H, S, D, generator=gen) * spread + 3 * torch.randn(H, 1, D, generator=gen)


def _frame(x):
    """A frame measured on ``x [B, H, S, D]`` the way calibrate measures one."""
    from turboquant.calibration import _key_frame, _Moments

    m = _Moments()
    m.add(x)
    return _key_frame(m)


def test_frame_rows_round_trip_exactly():
    x = _keys()
    f = _frame(x)
    assert torch.allclose(unframe_rows(frame_rows(x, f), f), x, rtol=1e-6, atol=1e-5)
    framed = frame_rows(x, f).double()
    assert framed.mean((0, 2)).abs().max() < 1e-4  # centred per head
    # without queries (a = 1) the optimal scale s² = a/b leaves channel spreads of √b
    b = (x.double() - x.double().mean((0, 2), keepdim=True)).pow(2).mean((0, 2)).sqrt()
    ratio = framed.pow(2).mean((0, 2)).sqrt() / b.sqrt()
    assert torch.allclose(ratio, ratio[:, :1].expand_as(ratio), rtol=1e-3)


@pytest.mark.parametrize("method,bits", [("turbo", 4), ("turbo", 3), ("affine", 4)])
def test_a_frame_shrinks_the_score_error(method, bits):
    """The point of a frame: the same codes width, a smaller error in q·k (measured, not assumed)."""
    k = _keys(S=256)
    q = torch.randn(2, 2, 8, 64, generator=torch.Generator().manual_seed(1))
    spec = KVQuantConfig(method=method, bits=bits).spec("k")
    plain = QuantizedCacheTensor.from_dense(k, spec).dequantize()
    framed = QuantizedCacheTensor.from_dense(k, spec, frame=_frame(k)).dequantize()
    ref = q @ k.transpose(-1, -2)

    def err(kh):  # score error up to the per-query shift softmax ignores
        e = q @ kh.transpose(-1, -2) - ref
        return float((e - e.mean(-1, keepdim=True)).norm() / (ref - ref.mean(-1, keepdim=True)).norm())

    assert err(framed) < 0.7 * err(plain)


def test_views_and_writes_keep_the_frame_aligned():
    k = _keys(B=3, H=2, S=24, D=32)
    f = _frame(k)
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
    with pytest.raises(ValueError, match="kv_heads, 2, head_dim"):
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


@pytest.mark.parametrize("window", [0, 5])
def test_the_kernel_moves_the_query_instead_of_the_codes(window):
    """The CUDA entry of the op (the Triton kernel: interpreted on the CPU) with frames and a ring,
    against attention over the decoded rows, within the kernel's tolerance."""
    pytest.importorskip("triton")
    from turboquant.ops import _attention_cuda, overlay_ring, spec_args

    device = "cuda" if torch.cuda.is_available() else "cpu"
    k, v = _keys(S=45, seed=5).to(device), _keys(S=45, seed=6).to(device)
    kf, vf = _frame(k.cpu()), _frame(v.cpu())
    cfg = KVQuantConfig(method="turbo", bits=4)
    kc = QuantizedCacheTensor.from_dense(k, cfg.spec("k"), window=window, frame=kf)
    vc = QuantizedCacheTensor.from_dense(v, cfg.spec("v"), window=window, frame=vf)
    q = torch.randn(2, 8, 1, 64, generator=torch.Generator().manual_seed(7)).to(device)
    out = _attention_cuda(q, kc.codes, kc.meta, vc.codes, vc.meta, None, False, 0.125, spec_args(kc.spec),
                          spec_args(vc.spec), 64, 64, 0.0, kc.ring, kc.ring_pos, vc.ring, vc.ring_pos, kc.frame,
                          vc.frame)
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
    assert torch.allclose(frames.frame(0, "k")[:, 1].pow(2).mean(-1), torch.ones(2))
    # eager attention never calls SDPA: no query energies, a warning, and scales from the keys alone
    with pytest.warns(UserWarning, match="key scales ignore the queries"):
        blind = turboquant.calibrate(tiny_hf_model("llama", attn="eager"), ids)
    assert torch.allclose(blind.frame(1, "k")[:, 0], frames.frame(1, "k")[:, 0], atol=1e-5)
    assert not torch.allclose(blind.frame(1, "k")[:, 1], frames.frame(1, "k")[:, 1], rtol=1e-2)

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
    assert cfg.calibration_windows == 8 and cfg.bits == (4, 4)
    with pytest.raises(ValueError, match="needs calibrated frames"):
        cfg.kv_config()
    with pytest.raises(ValueError, match="calibration windows must be >= 1"):
        parse_config("turbo-4-f0")
    with pytest.raises(NotImplementedError, match="not a transformers model"):
        calibrate(torch.nn.Linear(2, 2), torch.zeros(1, 4, dtype=torch.long))
