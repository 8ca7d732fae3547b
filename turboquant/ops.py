"""turboquant's custom ops: attention over packed codes (the op the compiled graph calls).

``torch.ops.turboquant.attention`` takes the raw buffers of the quantized K and V caches
(codes + metadata) and the quantization settings as plain arguments, so a compiled graph
holds one opaque node per attention that a device-specific kernel can implement. The CPU
implementation decodes with the oracle's own functions and attends in float32.
"""

from __future__ import annotations

import functools
import sys
from typing import Optional

import torch
import torch.nn.functional as F

from . import compat
from .calibration import unframe_rows
from .config import TensorQuantSpec
from .quant.affine import metadata_pair
from .quant.packed import decode
from .quant.packing import unpack_codes
from .quant.reference import masked_softmax

__all__ = ["attention", "spec_args", "decode_buffers", "dense_rows", "overlay_ring"]

_METHOD_IDS = {"affine": 0, "turbo": 1}
_METHODS = {v: k for k, v in _METHOD_IDS.items()}
_META_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def spec_args(spec: TensorQuantSpec) -> list:
    """A spec as the int/float arguments a custom op can take."""
    return [_METHOD_IDS[spec.method], spec.bits, spec.group_size or 0, spec.seed,
            _META_DTYPES.index(spec.metadata_dtype)]


def _spec_from_args(args) -> TensorQuantSpec:
    method, bits, group, seed, meta = args
    return TensorQuantSpec(method=_METHODS[method], bits=bits, group_size=group or None, clip_percentile=None,
                           metadata_dtype=_META_DTYPES[meta], seed=seed)


@functools.lru_cache(maxsize=None)
def _specs(k_args: tuple, v_args: tuple) -> tuple:
    # built once per setting: a batch-1 decode step calls the op once per layer, host-bound
    return _spec_from_args(k_args), _spec_from_args(v_args)


def decode_buffers(codes: torch.Tensor, meta: torch.Tensor, spec: TensorQuantSpec, head_dim: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """Dense ``[..., head_dim]`` from packed ``codes [..., P]`` and flat ``meta [..., M]`` (affine: or
    one integer word per row, :func:`~.quant.affine.metadata_word`)."""
    c = unpack_codes(codes, spec.bits, head_dim)
    if spec.method == "turbo":
        m = meta
    elif not meta.is_floating_point():
        m = torch.stack(metadata_pair(meta, spec.metadata_dtype), -1)  # [..., 1 group, 2]
    else:
        m = meta.unflatten(-1, (-1, 2))
    return decode(c, m, spec, dtype)


def overlay_ring(dense: torch.Tensor, ring: torch.Tensor, ring_pos: torch.Tensor) -> torch.Tensor:
    """``dense [..., S, D]`` with every position the ring holds taken from the ring (full precision).

    A residual window's read (:mod:`turboquant.cache`): slot = position mod W.
    """
    s, w = dense.shape[-2], ring.shape[-2]
    pos = torch.arange(s, device=dense.device)
    slot = pos % w
    held = ring_pos.index_select(0, slot) == pos
    from_ring = ring.index_select(ring.dim() - 2, slot).to(dense.dtype)
    return torch.where(held[:, None], from_ring, dense)


def _kernel_decodes(codes: torch.Tensor) -> bool:
    """Whether :func:`dense_rows` decodes with the Triton kernel: real tensors on a GPU."""
    return codes.is_cuda and not compat.tracing_with_fake_tensors()


def dense_rows(codes: torch.Tensor, meta: torch.Tensor, spec: TensorQuantSpec, head_dim: int, dtype: torch.dtype,
               frame: Optional[torch.Tensor] = None, ring: Optional[torch.Tensor] = None,
               ring_pos: Optional[torch.Tensor] = None, copies: int = 1) -> torch.Tensor:
    """Dense ``[..., H · copies, S, head_dim]`` rows of a cache's buffers (:func:`decode_buffers`),
    back in the model's frame when the layer has one, a residual window's ring laid over them
    (:func:`overlay_ring`), each KV head repeated ``copies`` times (GQA expansion). On a GPU, outside
    tracing, one Triton kernel decodes, and expands where nothing comes between
    (:mod:`turboquant.templates.dequantize`): with torch ops a prefill's decode was a dozen
    element-wise kernels, 437 µs against bf16 flash SDPA's 282 for a 4K prompt (H200)."""
    decode = decode_buffers
    if _kernel_decodes(codes):
        from .templates import dequantize  # Triton: imported only where a GPU runs

        if dequantize.supports(codes, meta, spec, head_dim) is None:
            if frame is None and ring is None:
                return dequantize.dequantize_rows(codes, meta, spec, head_dim, dtype, copies)
            decode = dequantize.dequantize_rows
    x = decode(codes, meta, spec, head_dim, dtype if frame is None else torch.float32)
    if frame is not None:
        x = unframe_rows(x, frame).to(dtype)
    if ring is not None:
        x = overlay_ring(x, ring, ring_pos)
    return x if copies == 1 else x.repeat_interleave(copies, dim=-3)


def _attention_decoded(q, k_codes, k_meta, v_codes, v_meta, attn_mask, is_causal, scale, k_spec, v_spec, head_dim,
                       v_head_dim, softcap, k_ring=None, k_ring_pos=None, v_ring=None, v_ring_pos=None,
                       k_frame=None, v_frame=None):
    """Decode the caches and attend: in float32 on the CPU; in q's dtype on a GPU, where this serves
    prefill and the shapes the decode kernel does not cover."""
    half = q.is_cuda and q.dtype in (torch.float16, torch.bfloat16)
    work = q.dtype if half else torch.float32
    g = q.shape[1] // k_codes.shape[1]
    # expanded K/V where grouped heads cannot be used: the soft-cap path is plain matmuls, and
    # enable_gqa with a mask has only SDPA's math backend on CUDA, which builds the [B, Hq, L, S]
    # scores (1 TiB for a batch-8 32K prefill); expanded K/V take the memory-efficient kernel
    expand = g if g > 1 and (softcap > 0 or (q.is_cuda and attn_mask is not None)) else 1
    k = dense_rows(k_codes, k_meta, _spec_from_args(k_spec), head_dim, work, k_frame, k_ring, k_ring_pos, expand)
    v = dense_rows(v_codes, v_meta, _spec_from_args(v_spec), v_head_dim, work, v_frame, v_ring, v_ring_pos, expand)
    mask = attn_mask if attn_mask is None or attn_mask.dtype == torch.bool else attn_mask.to(work)
    qw = q.to(work)
    if softcap > 0:
        out = masked_softmax(qw @ k.transpose(-1, -2) * scale, mask, is_causal, softcap) @ v
    else:
        out = F.scaled_dot_product_attention(qw, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
    return out.to(q.dtype).contiguous()


# Registered through the plain dispatcher (a kernel per device key), not ``torch.library.custom_op``:
# custom_op wraps every call in Python autograd, redispatch and aliasing-check layers (dispatch of
# a trivial kernel: 37 µs per call against 12 µs, CPU, 2026-12-01), and a batch-1 decode step is
# host-bound and calls the op once per layer. Inference only: the autograd key falls through, so
# the output carries no gradient (a quantized cache is not trained through; see
# ``CompileState.inference_only``).
_LIB = torch.library.Library("turboquant", "DEF")
_LIB.define(
    "attention(Tensor q, Tensor k_codes, Tensor k_meta, Tensor v_codes, Tensor v_meta, Tensor? attn_mask, "
    "bool is_causal, float scale, SymInt[] k_spec, SymInt[] v_spec, SymInt head_dim, SymInt v_head_dim, "
    "float softcap=0., Tensor? k_ring=None, Tensor? k_ring_pos=None, Tensor? v_ring=None, "
    "Tensor? v_ring_pos=None, Tensor? k_frame=None, Tensor? v_frame=None) -> Tensor",
    tags=(torch.Tag.pt2_compliant_tag,))


def _without_grad(kernel):
    """``kernel`` run with grad mode off: with the autograd key fallen through, the torch ops inside
    (the decoded attention, a residual window's partial) would otherwise record a graph with
    respect to q. Checked first: a ``torch.no_grad()`` decorator costs ~10 µs per call (CPU), and
    generation already runs without grad."""
    @functools.wraps(kernel)
    def run(*args, **kwargs):
        if torch.is_grad_enabled():
            with torch.no_grad():
                return kernel(*args, **kwargs)
        return kernel(*args, **kwargs)
    return run


@_without_grad
def _attention_cpu(q, k_codes, k_meta, v_codes, v_meta, attn_mask, is_causal, scale, k_spec, v_spec, head_dim,
                   v_head_dim, softcap=0.0, k_ring=None, k_ring_pos=None, v_ring=None, v_ring_pos=None,
                   k_frame=None, v_frame=None):
    return _attention_decoded(q, k_codes, k_meta, v_codes, v_meta, attn_mask, is_causal, scale, k_spec, v_spec,
                              head_dim, v_head_dim, softcap, k_ring, k_ring_pos, v_ring, v_ring_pos, k_frame, v_frame)


@functools.cache
def _kernel_module():
    from .templates import decode_attention  # Triton: imported only where a GPU runs

    return decode_attention


@functools.lru_cache(maxsize=1024)
def _cuda_call(k_args: tuple, v_args: tuple, hq: int, lq: int, head_dim: int, v_head_dim: int, hkv: int) -> tuple:
    # keyed on plain ints: asked once per layer and decode step (a spec's dataclass hash costs more)
    ks, vs = _specs(k_args, v_args)
    return ks, vs, _kernel_module().unsupported(hq, lq, ks, vs, head_dim, v_head_dim, hkv)


@_without_grad
def _attention_cuda(q, k_codes, k_meta, v_codes, v_meta, attn_mask, is_causal, scale, k_spec, v_spec, head_dim,
                    v_head_dim, softcap=0.0, k_ring=None, k_ring_pos=None, v_ring=None, v_ring_pos=None,
                    k_frame=None, v_frame=None):
    kernel = _kernel_module()
    ks, vs, unsupported = _cuda_call(tuple(k_spec), tuple(v_spec), q.shape[1], q.shape[2], head_dim, v_head_dim,
                                     k_codes.shape[1])
    # a residual window's ring is one more partial of the kernel's split merge; K and V rings are
    # written together, so one position table serves both. Frames reach the op only with a
    # soft-cap (attention_over_cache moves q and the output otherwise; tanh is not shift-invariant):
    # those decode.
    rings_ok = (k_ring is None) == (v_ring is None)
    frames_ok = k_frame is None and v_frame is None
    if rings_ok and frames_ok and not unsupported:
        # positional where it can: a decode step calls this once per layer, host-bound
        return kernel.decode_attention(q, k_codes, k_meta, v_codes, v_meta, ks, vs, head_dim, attn_mask, is_causal,
                                       scale, softcap, k_ring=k_ring, v_ring=v_ring, ring_pos=k_ring_pos)
    return _attention_decoded(q, k_codes, k_meta, v_codes, v_meta, attn_mask, is_causal, scale, k_spec, v_spec,
                              head_dim, v_head_dim, softcap, k_ring, k_ring_pos, v_ring, v_ring_pos, k_frame, v_frame)


def _attention_fake(q, k_codes, k_meta, v_codes, v_meta, attn_mask, is_causal, scale, k_spec, v_spec, head_dim,
                    v_head_dim, softcap=0.0, k_ring=None, k_ring_pos=None, v_ring=None, v_ring_pos=None,
                    k_frame=None, v_frame=None):
    # every compile that traces the op passes here first: an Inductor compile (whose module import
    # brought the lowering registry in) gets the direct call before it lowers the graph, whichever
    # backend or tensor subclass put the op in it
    if "torch._inductor.lowering" in sys.modules:
        call_directly_from_inductor()
    return q.new_empty((*q.shape[:-1], v_head_dim))


# every device without a kernel of its own (CPU included) decodes and attends, as the oracle
_LIB.impl("attention", _attention_cpu, "CompositeExplicitAutograd")
_LIB.impl("attention", _attention_cuda, "CUDA")
_LIB.impl("attention", torch.library.fallthrough_kernel, "Autograd")
torch.library.register_fake("turboquant::attention", _attention_fake, lib=_LIB)


def _attention_direct(q, *args, **kwargs):
    """The op's kernel for ``q``'s device, as a compiled graph's wrapper calls it without the dispatcher
    (:func:`call_directly_from_inductor`). Generation runs without grad: there the CUDA kernel is called
    as it is, without :func:`_without_grad`'s frame."""
    if q.is_cuda:
        return (_attention_cuda if torch.is_grad_enabled() else _attention_cuda.__wrapped__)(q, *args, **kwargs)
    return _attention_cpu(q, *args, **kwargs)


@functools.cache
def call_directly_from_inductor() -> bool:
    """Inductor's Python wrapper calls the attention op's kernels directly from now on (in place of
    ``torch.ops.turboquant.attention``: the dispatcher's boxing of ~20 arguments cost ~20 µs a call on
    the H200's host, a batch-1 decode step is host-bound and calls the op once per layer)."""
    return compat.call_directly_from_inductor(torch.ops.turboquant.attention.default, "turboquant_attention",
                                              _attention_direct)


attention = torch.ops.turboquant.attention
"""SDPA of ``q [B, Hq, L, D]`` over quantized K/V caches ``[B, Hkv, S, ·]`` (Hq a multiple of Hkv):
``attention(q, k_codes, k_meta, v_codes, v_meta, attn_mask, is_causal, scale, k_spec, v_spec, head_dim,
v_head_dim, softcap=0., k_ring=None, k_ring_pos=None, v_ring=None, v_ring_pos=None, k_frame=None,
v_frame=None)``.

``*_spec``: :func:`spec_args` of each cache's spec. ``softcap > 0`` caps the scores as
:func:`turboquant.quant.reference.masked_softmax` does. ``*_ring``/``*_ring_pos``: the residual
window (:mod:`turboquant.cache`); the positions a ring holds are read from it in full precision.
``*_frame [B, Hkv, R, D]``: a calibrated frame (:mod:`turboquant.calibration`): the codes hold
``(x − μ) F`` and decode to ``decode · F⁻¹ + μ``; the ring holds rows as written. (Callers without a
soft-cap pass none: attention over framed codes is attention with ``q F_k^-T``, framed ring rows and
the output unframed, which :func:`turboquant.cache.attention_over_cache` does around the op.)
On CUDA, decode shapes run the Triton kernel of :mod:`turboquant.templates.decode_attention` (a
residual window's ring as one more merged partial); everything else decodes and attends."""
