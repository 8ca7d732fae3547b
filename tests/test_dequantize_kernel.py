"""The prefill decode kernel (turboquant/templates/dequantize.py) against the plain-torch decode.

Under Triton's interpreter on the CPU (CI), on the GPU at full size (``-m gpu``). The kernel does the
torch decode's float32 arithmetic, so affine rows must match it exactly; turbo rows go through a
matrix product (numpy's under the interpreter, tf32x3 MMAs on the GPU) and must match to float32
rounding.
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from turboquant import KVQuantConfig
from turboquant.cache import QuantizedCacheTensor
from turboquant.ops import decode_buffers

pytest.importorskip("triton")

from turboquant.templates.dequantize import dequantize_rows, supports  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _buffers(method, bits, shape, group_size=None, metadata_dtype=torch.float16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen) * 3
    x[..., 1, :] = 0.0  # a constant row: zero scale (affine) or zero norm (turbo)
    cfg = KVQuantConfig(method=method, bits=bits, group_size=group_size, metadata_dtype=metadata_dtype)
    cache = QuantizedCacheTensor.from_dense(x.to(DEVICE), cfg.spec("k"))
    return cache.codes, cache.meta, cache.spec


def _check(codes, meta, spec, head_dim, dtype, copies):
    out = dequantize_rows(codes, meta, spec, head_dim, dtype, copies)
    ref = decode_buffers(codes, meta, spec, head_dim, torch.float32).repeat_interleave(copies, 1)
    assert out.shape == ref.shape and out.dtype == dtype
    if spec.method == "affine":
        torch.testing.assert_close(out, ref.to(dtype), rtol=0, atol=0)
    else:  # the rotation's product: float32 rounding, then the dtype's
        err = float((out.double() - ref.to(dtype).double()).norm() / ref.double().norm().clamp_min(1e-30))
        assert err < (1e-5 if dtype == torch.float32 else 2 * torch.finfo(dtype).eps)


@settings(max_examples=25, deadline=None)
@given(method=st.sampled_from(["affine", "turbo"]), bits=st.sampled_from([8, 4, 3, 2]),
       head_dim=st.sampled_from([64, 80, 96, 128]), batch=st.sampled_from([1, 3]), heads=st.sampled_from([1, 2]),
       length=st.integers(2, 70), copies=st.sampled_from([1, 4]), seed=st.integers(0, 2**16))
def test_rows_match_the_torch_decode(method, bits, head_dim, batch, heads, length, copies, seed):
    # odd lengths leave partial row tiles; 80 and 96 leave padded dims; copies expand GQA
    codes, meta, spec = _buffers(method, bits, (batch, heads, length, head_dim), seed=seed)
    _check(codes, meta, spec, head_dim, torch.float32, copies)


@pytest.mark.parametrize("group_size, metadata_dtype", [(32, torch.float16), (None, torch.bfloat16),
                                                        (32, torch.float32), (None, torch.float32)])
def test_affine_groups_and_metadata_dtypes(group_size, metadata_dtype):
    # several groups per row come as float pairs; one group as an integer word holding the pair
    codes, meta, spec = _buffers("affine", 4, (2, 2, 19, 64), group_size, metadata_dtype)
    assert meta.is_floating_point() == (group_size is not None)
    _check(codes, meta, spec, 64, torch.float32, 2)


@pytest.mark.parametrize("method", ["affine", "turbo"])
def test_head_dim_256_and_views_of_a_longer_cache(method):
    codes, meta, spec = _buffers(method, 3, (1, 2, 40, 256))
    _check(codes[:, :, 5:33], meta[:, :, 5:33], spec, 256, torch.float32, 1)  # strided views: the cache's prefix


def test_unsupported_buffers_are_named():
    codes, meta, spec = _buffers("affine", 4, (1, 1, 4, 64))
    assert supports(codes, meta, spec, 64) is None
    assert "3 dims" in supports(codes[0], meta[0], spec, 64)
    with pytest.raises(NotImplementedError, match="dequantize_rows: buffers of 3 and 3 dims"):
        dequantize_rows(codes[0], meta[0], spec, 64, torch.float32)
    with pytest.raises(ValueError, match=r"dtype=torch.int8 is not supported; allowed: torch.float16"):
        dequantize_rows(codes, meta, spec, 64, torch.int8)


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA device")
@pytest.mark.parametrize("method", ["affine", "turbo"])
@pytest.mark.parametrize("bits", [8, 4, 3, 2])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_full_size_rows_on_the_gpu(method, bits, dtype):
    codes, meta, spec = _buffers(method, bits, (2, 8, 4097, 128), seed=bits)
    _check(codes, meta, spec, 128, dtype, 4)


@pytest.mark.parametrize("case", ["mask", "ring", "k_frame", "softcap"])
def test_the_prefill_path_decodes_with_the_kernel_as_with_torch(case, monkeypatch):
    # the op's prefill path (query past 8 positions) with the kernel decoding (as on a GPU; here under
    # the interpreter) against the torch decode: a mask, a ring overlaid on the heads as stored, a
    # frame undone after the decode, the soft-cap's GQA copies written by the kernel (with a ring,
    # expanded after the overlay)
    from turboquant import ops

    B, hkv, g, L, S, D = 2, 2, 4, 11, 29, 64
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(B, hkv * g, L, D, generator=gen)
    (kc, km, ks), (vc, vm, vs) = (_buffers("turbo", 3, (B, hkv, S, D), seed=s)[:3] for s in (1, 2))
    kw = dict(attn_mask=None, is_causal=True, softcap=0.0)
    if case == "mask":
        kw.update(attn_mask=torch.rand(B, 1, L, S, generator=gen) > 0.3, is_causal=False)
    elif case == "ring":
        kw.update(k_ring=torch.randn(B, hkv, 4, D, generator=gen), v_ring=torch.randn(B, hkv, 4, D, generator=gen),
                  k_ring_pos=torch.tensor([24, 25, 26, 27]), v_ring_pos=torch.tensor([24, 25, 26, 27]),
                  attn_mask=torch.ones(B, 1, L, S, dtype=torch.bool), is_causal=False, softcap=20.0)
    elif case == "k_frame":
        kw.update(k_frame=torch.stack([torch.randn(hkv, 1, D, generator=gen)[:, 0],
                                       torch.rand(hkv, 1, D, generator=gen)[:, 0] + 0.5], 1))
    else:
        kw.update(softcap=20.0)
    args = (q, kc, km, vc, vm, kw.pop("attn_mask"), kw.pop("is_causal"), D ** -0.5, ops.spec_args(ks),
            ops.spec_args(vs), D, D, kw.pop("softcap"))
    want = ops._attention_decoded(*args, **kw)
    calls = []
    from turboquant.templates import dequantize

    def counted(*a, **k):
        calls.append(a[-1] if len(a) > 5 else k.get("copies", 1))
        return dequantize_rows(*a, **k)

    monkeypatch.setattr(ops, "_kernel_decodes", lambda codes: True)
    monkeypatch.setattr(dequantize, "dequantize_rows", counted)
    got = ops._attention_decoded(*args, **kw)
    # copies for the soft-cap's plain matmuls (a mask expands only on CUDA, where SDPA needs it)
    assert calls == [g if case == "softcap" else 1] * 2  # a ring's heads expand after its overlay
    assert float((got - want).norm() / want.norm()) < 1e-5
