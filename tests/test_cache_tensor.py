"""QuantizedCacheTensor: writes quantize exactly like the oracle, reads attend like the oracle."""

import contextlib
import math
import re
import types

import pytest
import torch
import torch.nn.functional as F

from turboquant import KVQuantConfig, quantize_kv, reference_attention
from turboquant.quant.packing import unpack_codes
from turboquant.cache import QuantizedCacheTensor, UnsupportedCacheOperation
from turboquant.compat import exact_casts, run_and_get_code, triton_schedule_runs_on_cpu

CFGS = [KVQuantConfig(bits=4), KVQuantConfig(method="turbo", bits=3), KVQuantConfig(bits=8, group_size=32)]


def _empty(cfg, shape, role="k", dtype=torch.float32):
    return QuantizedCacheTensor.empty(shape, cfg.spec(role), dtype=dtype)


def _expected_rows(x, cfg, role="k"):
    p = quantize_kv(x, cfg, role=role)
    return p.codes, p.meta.reshape(*x.shape[:-1], -1)


def _flat_meta(meta, spec):
    """A cache's stored metadata as the oracle's flat pairs (affine keeps one integer word per row:
    the pair's bytes)."""
    return meta if meta.is_floating_point() else meta.view(spec.metadata_dtype)


@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("how", ["index_copy_", "setitem", "index_put_", "slice_copy_"])
def test_writes_store_the_oracles_codes_and_touch_only_their_rows(cfg, how):
    B, H, S, D = 2, 3, 17, 64
    cache = _empty(cfg, (B, H, S, D))
    new = torch.randn(B, H, 3, D)
    pos = torch.tensor([4, 5, 6])
    if how == "index_copy_":
        cache.index_copy_(2, pos, new)
    elif how == "setitem":
        cache[:, :, pos] = new
    elif how == "index_put_":
        cache.index_put_((torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], pos), new)
    else:
        cache[:, :, 4:7].copy_(new)
    codes, meta = _expected_rows(new, cfg)
    assert torch.equal(cache.codes[:, :, 4:7], codes) and torch.equal(_flat_meta(cache.meta, cache.spec)[:, :, 4:7], meta)
    untouched = torch.ones(S, dtype=torch.bool)
    untouched[4:7] = False
    assert int(cache.codes[:, :, untouched].count_nonzero()) == 0
    assert cache.quantized_nbytes == B * H * S * (cache.codes.shape[-1] + meta.shape[-1] * 2)  # fp16 metadata


def test_meta_llama_layout_slice_assignment():
    """cache_k[:bsz, start_pos:start_pos+S] = xk on a [B, S, H, D] cache."""
    cfg = KVQuantConfig(bits=4)
    cache = _empty(cfg, (4, 32, 2, 64))
    xk = torch.randn(3, 5, 2, 64)
    cache[:3, 10:15] = xk
    codes, _ = _expected_rows(xk, cfg)
    assert torch.equal(cache.codes[:3, 10:15], codes)
    torch.testing.assert_close(cache[:3, 10:15].dequantize(), quantize_kv_dense(xk, cfg))


def quantize_kv_dense(x, cfg):
    from turboquant import dequantize_kv

    return dequantize_kv(quantize_kv(x, cfg))


def test_cat_grows_and_zero_resets():
    cfg = KVQuantConfig(method="turbo", bits=4)
    cache = _empty(cfg, (1, 2, 0, 64))
    a, b = torch.randn(1, 2, 5, 64), torch.randn(1, 2, 1, 64)
    cache = torch.cat([torch.cat([cache, a], dim=-2), b], dim=-2)
    assert isinstance(cache, QuantizedCacheTensor) and cache.shape == (1, 2, 6, 64)
    torch.testing.assert_close(cache.dequantize(), quantize_kv_dense(torch.cat([a, b], -2), cfg))
    cache.zero_()
    assert torch.equal(cache.dequantize(), torch.zeros(1, 2, 6, 64))


@pytest.mark.parametrize("cfg", CFGS)
@pytest.mark.parametrize("gqa", ["enable_gqa", "repeat_kv", "repeat_interleave"])
def test_sdpa_over_the_cache_is_the_oracle(cfg, gqa):
    B, Hkv, g, S, D = 2, 2, 4, 23, 64
    k, v = torch.randn(B, Hkv, S, D), torch.randn(B, Hkv, S, D)
    kc, vc = _empty(cfg, (B, Hkv, S, D)), _empty(cfg, (B, Hkv, S, D), "v")
    kc.copy_(k)
    vc.copy_(v)
    q = torch.randn(B, Hkv * g, 3, D)
    mask = torch.rand(B, 1, 3, S) > 0.2
    if gqa == "enable_gqa":
        out = F.scaled_dot_product_attention(q, kc, vc, attn_mask=mask, enable_gqa=True)
    elif gqa == "repeat_kv":
        exp = lambda x: x[:, :, None].expand(B, Hkv, g, S, D).reshape(B, Hkv * g, S, D)  # noqa: E731
        out = F.scaled_dot_product_attention(q, exp(kc), exp(vc), attn_mask=mask)
    else:
        out = F.scaled_dot_product_attention(q, kc.repeat_interleave(g, 1), vc.repeat_interleave(g, 1), attn_mask=mask)
    ref = reference_attention(q, quantize_kv(k, cfg), quantize_kv(v, cfg, role="v"), attn_mask=mask)
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-5  # float32 arithmetic vs float64 oracle


def _repeat_kv(x, g):  # transformers' repeat_kv
    B, H, S, D = x.shape
    return x[:, :, None, :, :].expand(B, H, g, S, D).reshape(B, H * g, S, D)


@pytest.mark.parametrize("expand", [_repeat_kv, lambda x, g: x.repeat_interleave(g, 1)], ids=["repeat_kv", "interleave"])
def test_gqa_expansion_reads_the_cache_without_copying_it(expand):
    """repeat_kv before SDPA would copy the whole cache, g times over, at every decode step; the
    expansion stays a view of the cache's own buffers and attention reads each KV byte once."""
    cfg = KVQuantConfig(bits=4, residual_window=2)
    B, Hkv, g, S, D = 2, 2, 4, 11, 32
    kc = QuantizedCacheTensor.from_dense(torch.randn(B, Hkv, S, D), cfg.spec("k"), window=2)
    vc = QuantizedCacheTensor.from_dense(torch.randn(B, Hkv, S, D), cfg.spec("v"), window=2)
    kr = expand(kc, g)
    assert kr.shape == (B, Hkv * g, S, D) and kr.head_repeat == g
    assert kr.codes.data_ptr() == kc.codes.data_ptr() and kr.ring.data_ptr() == kc.ring.data_ptr()
    # any other use sees the expanded tensor it stands for
    assert torch.equal(kr.dequantize(), kc.dequantize().repeat_interleave(g, 1))
    assert torch.equal(kr[:, 3:5, 2:7] * 1, kc.dequantize().repeat_interleave(g, 1)[:, 3:5, 2:7])
    # only this expansion stays a view: a batch expansion's clone is a copy that can be written
    beams = kc[:1].expand(3, -1, -1, -1).clone()
    assert beams.codes.stride(0) != 0 and beams.codes.data_ptr() != kc.codes.data_ptr()

    q = torch.randn(B, Hkv * g, 1, D)
    f = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, expand(k, g), expand(v, g)), fullgraph=True)
    out, code = run_and_get_code(f, q, kc, vc)
    src = "\n".join(code)
    # the op's kernel, called directly, takes the compiled function's inputs (the cache buffers) and
    # nothing copies them first
    args = re.search(r"\bturboquant_attention\(([^)]*)\)", src).group(1).split(", ")
    args = [a for a in args if "=" not in a]  # keyword arguments (absent frames) come last, when written
    buffers = args[1:5] + args[-4:]  # codes, meta and rings of K and V
    assert all(re.fullmatch(r"arg\d+_1", a) for a in buffers), args
    assert "cpp_fused" not in src, src
    ref = F.scaled_dot_product_attention(q, kc.dequantize(), vc.dequantize(), enable_gqa=True)
    assert float((out - ref).norm() / ref.norm()) < 1e-5


def test_unsupported_uses_raise_instead_of_losing_writes():
    cache = _empty(KVQuantConfig(bits=4), (1, 2, 8, 64))
    with pytest.raises(UnsupportedCacheOperation, match="head_dim"):
        cache[..., :8].zero_()
    with pytest.raises(UnsupportedCacheOperation, match="not supported"):
        cache.add_(1.0)
    # reads are fine: they decode
    assert float((cache + 1).sum()) == 1 * 2 * 8 * 64
    # a view merging head_dim would alias packed codes; ``-1`` standing for the merged size included
    for size in ((1, 2, -1), (1, -1), (1, 2, 8 * 64)):
        with pytest.raises(UnsupportedCacheOperation, match="changes head_dim"):
            cache.view(*size)


@pytest.mark.parametrize("cfg", CFGS)
def test_copy_into_a_dense_tensor_is_a_read(cfg):
    """MLA (DeepSeek) builds its key by copying cached rows into slices of a dense tensor."""
    cache = QuantizedCacheTensor.from_dense(torch.randn(2, 1, 9, 64), cfg.spec("k"))
    key = torch.full((2, 3, 9, 80), 7.0)
    key[..., 16:].copy_(cache.expand(-1, 3, -1, -1))
    torch.testing.assert_close(key[..., 16:], cache.dequantize().expand(-1, 3, -1, -1), rtol=0, atol=0)
    assert bool((key[..., :16] == 7).all())


@pytest.mark.parametrize("cfg", CFGS)
def test_reshape_copy_merging_head_dim_is_a_dense_read(cfg):
    """Doge's dynamic mask reads ``v.transpose(1, 2).reshape(B, S, -1)``: reshape copies there (the transposed
    cache is no view of that shape), and the copy nothing else aliases may be dense."""
    x = torch.randn(2, 3, 9, 64)
    cache = QuantizedCacheTensor.from_dense(x, cfg.spec("v"))
    out = cache.transpose(1, 2).reshape(2, 9, -1)
    assert type(out) is torch.Tensor and out.shape == (2, 9, 3 * 64)
    torch.testing.assert_close(out, cache.dequantize().transpose(1, 2).reshape(2, 9, -1), rtol=0, atol=0)


def test_compiled_decode_step_writes_only_the_new_token():
    """One fused kernel quantizes and writes the new row; nothing loops over the 4096-long cache."""
    cache = _empty(KVQuantConfig(bits=4), (1, 2, 4096, 64))
    ptr = cache.codes.data_ptr()

    def step(cache, k, pos):
        cache.index_copy_(2, pos, k)

    new = torch.randn(1, 2, 1, 64, generator=torch.Generator().manual_seed(11))
    with exact_casts():
        _, code = run_and_get_code(torch.compile(step, fullgraph=True), cache, new, torch.tensor([7]))
    src = "\n".join(code)
    bounds = [int(n) for n in re.findall(r"<static_cast<int64_t>\((\d+)L\)", src)]
    assert bounds and max(bounds) < 4096, bounds
    assert src.count("cpp_fused") >= 1 and "index_copy" in src
    assert cache.codes.data_ptr() == ptr  # written in place
    codes, _ = _expected_rows(new, KVQuantConfig(bits=4))
    # compiled division may round a value that sits exactly on a rounding boundary the other way
    # (x * (1/s) vs x / s): codes may differ by one step, rarely — never more
    got = unpack_codes(cache.codes[:, :, 7:8], 4, 64).int()
    want = unpack_codes(codes, 4, 64).int()
    assert int((got - want).abs().max()) <= 1 and float((got != want).float().mean()) < 0.02


# "cpu-triton": the kernels a GPU gets (Inductor's Triton schedule, the packed forms), run by the Triton
# interpreter on CPU tensors (compat.triton_schedule_runs_on_cpu)
_WRITE_DEVICES = ["cpu", "cpu-triton", pytest.param("cuda", marks=pytest.mark.gpu)]


def _compiled_on(device):
    """(tensor device, rows per head, context) of a compiled write on ``device`` of :data:`_WRITE_DEVICES`
    (the interpreter runs a program's block as numpy arrays: fewer rows keep it to seconds)."""
    if device == "cpu-triton":
        return "cpu", 37, triton_schedule_runs_on_cpu()
    return device, 301, contextlib.nullcontext()


@pytest.mark.usefixtures("fresh_dynamo")  # else Dynamo makes `spec.bits` of the closure dynamic after recompiles
@pytest.mark.parametrize("device", _WRITE_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_compiled_affine_quantize_on_write_is_the_eager_encoding_bit_for_bit(bits, dtype, device):
    """What a compiled graph writes into the cache is what eager writes: codes and metadata equal,
    and that is the oracle's encoding.
    (Seen before the fix: Inductor took fp16 nextafter in float32, so compiled scales came out one
    fp16 step low for half the tokens and compiled generation parted from eager.)"""
    from turboquant.cache import _encode_rows

    device, rows, context = _compiled_on(device)
    x = (torch.randn(3, 2, rows, 64, generator=torch.Generator().manual_seed(5)) * 3).to(dtype).to(device)
    x[0, 0, 0, 0] = float("nan")
    spec = KVQuantConfig(bits=bits).spec("k")
    want = _encode_rows(x.cpu(), spec)
    with exact_casts(), context:
        got = torch.compile(lambda t: _encode_rows(t, spec), fullgraph=True)(x)
    assert torch.equal(got[0].cpu(), want[0]) and torch.equal(got[1].cpu(), want[1])
    codes, meta = _expected_rows(x.cpu(), KVQuantConfig(bits=bits))
    assert torch.equal(want[0], codes) and torch.equal(_flat_meta(want[1], spec), meta)


@pytest.mark.usefixtures("fresh_dynamo")
def test_compiled_cpu_writes_keep_the_fp16_round_trip_where_inductor_cached_it_away(monkeypatch):
    """torch < 2.13's C++ codegen, simulated on this torch: every float32 -> fp16 cast put its reverse in the
    kernel's CSE cache, flag or not (2.13 skips it under ``emulate_precision_casts``), so the scale's round trip
    gave back the unrounded value and the round-up was lost. That codegen writes codes and metadata off the eager
    encoding (as torch 2.11 did on the device's CPU); with turboquant's backport it writes them bit for bit."""
    import turboquant.compat as compat
    from torch._inductor.codegen import cpp

    from turboquant.cache import _encode_rows

    class Before213(types.ModuleType):
        def __getattr__(self, name):  # what 2.11's cast sees: no flag
            return False if name == "emulate_precision_casts" else getattr(torch._inductor.config, name)

    cache = getattr(cpp.CppKernel, "cache_dtype_convert", None)
    if cache is None:
        pytest.skip("this torch's C++ codegen has no cast cache (CppKernel.cache_dtype_convert)")
    monkeypatch.setattr(cpp, "config", Before213("config"))
    # the codegen's own cache (on torch < 2.13 the backport may be in already), restored after
    monkeypatch.setattr(cpp.CppKernel, "cache_dtype_convert", getattr(cache, "__wrapped__", cache))
    x = torch.randn(2, 2, 37, 64, generator=torch.Generator().manual_seed(5)) * 3
    spec = KVQuantConfig(bits=4).spec("k")
    want = _encode_rows(x, spec)

    def compiled_write():
        torch._dynamo.reset()
        with exact_casts(), torch._inductor.config.patch(fx_graph_cache=False):
            got = torch.compile(lambda t: _encode_rows(t, spec), fullgraph=True)(x)
        return torch.equal(got[0], want[0]), torch.equal(got[1], want[1])

    with monkeypatch.context() as m:
        m.setattr(compat, "_cpp_casts_round_under_emulation", lambda: None)
        if compiled_write() != (False, False):
            pytest.skip("this torch's C++ codegen does not cache casts as 2.11-2.13's does: nothing to simulate")
    with monkeypatch.context() as m:
        m.setattr(torch, "__version__", "2.11.0")
        compat._cpp_casts_round_under_emulation()
    assert compiled_write() == (True, True)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize("device", _WRITE_DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_compiled_turbo_quantize_on_write_is_the_eager_encoding(bits, dtype, device):
    """A compiled turbo write rotates by a reduction over the Hadamard matrix's signs (an int8
    constant; no matmul call), eager by a float64 matmul: both round the same sums, so the codes are
    the eager codes and the stored norm differs at most by the rounding of the norm's own sum (one
    fp16 step)."""
    from turboquant.cache import _encode_rows

    device, rows, context = _compiled_on(device)
    x = (torch.randn(3, 2, rows, 64, generator=torch.Generator().manual_seed(7)) * 3).to(dtype).to(device)
    x[0, 0, 0, 0] = float("nan")
    spec = KVQuantConfig(bits=bits, method="turbo").spec("k")
    want = _encode_rows(x.cpu(), spec)
    with context:
        got = torch.compile(lambda t: _encode_rows(t, spec), fullgraph=True)(x)
    assert torch.equal(got[0].cpu(), want[0])
    rel = ((got[1].cpu().float() - want[1].float()).abs() / want[1].float().clamp_min(1e-30)).max()
    assert rel <= 2 ** -10


def test_attention_over_the_cache_builds_no_autograd_graph():
    """The attention op is inference-only: with a query that requires grad it attends as usual and
    records nothing to backpropagate (its autograd key falls through; no Python autograd layer)."""
    cfg = KVQuantConfig(bits=4)
    k, v = torch.randn(1, 2, 9, 32), torch.randn(1, 2, 9, 32)
    kc, vc = _empty(cfg, (1, 2, 9, 32)), _empty(cfg, (1, 2, 9, 32), "v")
    kc.copy_(k)
    vc.copy_(v)
    q = torch.randn(1, 4, 1, 32, requires_grad=True)
    out = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
    assert out.grad_fn is None and not out.requires_grad
    ref = reference_attention(q.detach(), quantize_kv(k, cfg), quantize_kv(v, cfg, role="v"))
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-5


@pytest.mark.usefixtures("fresh_dynamo")
def test_triton_schedule_on_cpu_rounds_and_takes_roots_as_the_gpu():
    """The interpreter's stand-ins for libdevice (what Inductor's kernels call for ``round``,
    ``sqrt``, ``rsqrt`` and ``exp``): half to even, exact roots, ±inf and NaN through; an unknown
    function is named."""
    from turboquant.templates.interpreter_libdevice import InterpreterLibdevice

    x = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999998, 1e30, float("inf"), -float("inf"), float("nan"),
                      3.0, 0.0, 7.25])
    with triton_schedule_runs_on_cpu():
        # float64 roots: Inductor calls libdevice.sqrt there (float32 ones it writes as tl.sqrt)
        got = torch.compile(lambda t: (torch.round(t), torch.sqrt(t.abs().double())), fullgraph=True)(x)
    assert torch.allclose(got[0], torch.round(x), rtol=0, atol=0, equal_nan=True)
    # against math.sqrt: torch's own CPU float64 sqrt is one ulp off at 0.5 and 2.0 (torch 2.13)
    roots = torch.tensor([math.sqrt(v) if v == v else v for v in x.abs().double().tolist()], dtype=torch.float64)
    assert torch.allclose(got[1], roots, rtol=0, atol=0, equal_nan=True)
    # rsqrt (RMSNorm) and exp (float64 here): within the GPU's 2 ulp of torch's, specials through
    with triton_schedule_runs_on_cpu():
        got = torch.compile(lambda t: (torch.rsqrt(t.abs()), torch.exp(t.double().clamp(max=700))), fullgraph=True)(x)
    want = (torch.rsqrt(x.abs()), torch.exp(x.double().clamp(max=700)))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.allclose(g, w, rtol=4 * torch.finfo(w.dtype).eps, atol=0, equal_nan=True)
    with pytest.raises(NotImplementedError, match="libdevice.erfcx .*nearbyint"):
        InterpreterLibdevice().erfcx
