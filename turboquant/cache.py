"""The quantized KV storage: a tensor that looks like a dense ``[..., S, D]`` cache to model code.

:class:`QuantizedCacheTensor` is a traceable wrapper subclass holding two inner tensors —
``codes`` (uint8, packed along head_dim) and ``meta`` (``[..., M]``: affine with one group per
row keeps its (scale, zero) pair as one integer word, ``M = 1``; otherwise scales/zeros or
norms flattened, in the metadata dtype). Model code keeps doing what it did to its cache and
the subclass maps it:

* **writes** (``index_copy_``, ``index_put_`` / ``k[:, :, pos] = k_new``, ``copy_`` into a
  slice, ``torch.cat([cache, k_new], -2)``) quantize the new rows with the oracle's
  numerics — plain aten ops, so Inductor fuses them into the producer of ``k_new``; an affine
  write is one Triton kernel per cache (min/max, rounding, packing, both stores) — and write
  only those rows of ``codes``/``meta`` (no copy of the cache);
* **views** that leave head_dim alone (slice, select, unsqueeze, expand, transpose of
  leading dims, view/reshape keeping the last dim) become the same views of ``codes`` and
  ``meta``, so a write through them lands in the cache;
* **attention** (``F.scaled_dot_product_attention`` with a quantized K or V) becomes one
  ``torch.ops.turboquant.attention`` call on the raw buffers;
* **other reads** decode to a dense tensor (correct, not fast; the compiler pass rewrites
  the attention patterns it knows so this does not happen on the hot path);
* a GQA expansion (``repeat_kv``: ``x[:, :, None].expand(...).reshape(B, H·g, S, D)``, or
  ``repeat_interleave(g, 1)``) stays lazy: the result reads the cache's own buffers with
  ``head_repeat = g``, so attention over it reads each KV byte once (no expanded copy of the
  cache per step); any other op on it works on an expanded copy;
* a transpose across head_dim (eager attention's ``key.transpose(2, 3)``) is a decoded,
  read-only copy;
* anything else that would lose a write — an in-place op it does not know, a view that slices
  head_dim — raises :class:`UnsupportedCacheOperation` instead of silently writing to a temporary.

**Residual window** (``KVQuantConfig.residual_window = W``): the tensor also holds a ring of
the W most recently written rows in full precision (``ring [..., W, D]``, slot = position mod
W, ``ring_pos [W]`` the position each slot holds, -1 when empty). Every read — attention and
decoded copies — takes a position from the ring when the ring holds it and from the codes
otherwise. Writes along the sequence dim (-2) keep the ring current; the sequence dim must
stay at -2 in the views attention reads.

**Frame** (``KVQuantConfig.frames``, :mod:`turboquant.calibration`): the tensor also holds its
layer's calibrated frame ``frame [..., R, D]`` (row 0 the shift ``μ``, then the map ``F``: a scale
row, or ``F`` and ``F⁻¹`` as ``2D`` rows; one per head). Writes store ``quantize((x − μ) F)``; reads
decode ``decode · F⁻¹ + μ``; attention moves the query (``q F^-T``) instead of the codes. Like the
ring it keeps the sequence dim at -2.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import torch.nn.functional as F
from torch.utils._pytree import tree_map

from .compat import schedules_with_triton
from .config import TensorQuantSpec
from .calibration import frame_query, frame_rows, frame_rows_allowed, per_kv_head, unframe_rows
from .ops import dense_rows, spec_args
from .quant.affine import affine_quantize_packed, metadata_word, metadata_word_dtype
from .quant.turbo import turbo_quantize_packed
from .quant.packed import encode, metadata_shape
from .quant.packing import pack_codes, packed_size

__all__ = ["QuantizedCacheTensor", "UnsupportedCacheOperation", "attention_over_cache"]

aten = torch.ops.aten


class UnsupportedCacheOperation(RuntimeError):
    """An operation on a quantized KV cache that turboquant cannot perform without losing data.

    A ``RuntimeError``, not ``NotImplementedError``: transformers' ``StaticLayer.update``
    catches the latter and retries the write another way, which would hide the message.
    """

# views whose dim argument (2nd positional) must not be head_dim; applied to codes and meta alike
_DIM_VIEWS = {aten.slice.Tensor, aten.select.int, aten.unsqueeze.default, aten.squeeze.dim}
# views taking a full size list whose last entry is head_dim
_SIZE_VIEWS = {aten.view.default, aten._unsafe_view.default, aten.expand.default, aten.reshape.default}
_PASSTHROUGH_VIEWS = {aten.alias.default, aten.detach.default}


@functools.lru_cache(maxsize=None)
def numerics_digest() -> str:
    """Hash of the source that compiled cache graphs trace through (this module, calibration's
    framing and quant/)."""
    import hashlib
    import pathlib

    here = pathlib.Path(__file__).parent
    h = hashlib.sha256()
    for path in sorted([here / "cache.py", here / "calibration.py", *(here / "quant").glob("*.py")]):
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


class QuantizedCacheTensor(torch.Tensor):
    """A K or V cache ``[..., D]`` stored as packed codes + metadata (see module doc).

    Build one with :meth:`empty` (preallocated caches) or :meth:`from_dense`.
    """

    codes: torch.Tensor
    meta: torch.Tensor
    spec: TensorQuantSpec
    head_dim: int
    ring: Optional[torch.Tensor]
    ring_pos: Optional[torch.Tensor]
    frame: Optional[torch.Tensor]
    head_repeat: int

    @staticmethod
    def __new__(cls, codes: torch.Tensor, meta: torch.Tensor, spec: TensorQuantSpec, head_dim: int,
                dtype: torch.dtype, outer_size=None, outer_stride=None, ring=None, ring_pos=None, head_repeat=1,
                frame=None, numerics=None):
        if outer_size is None and head_repeat > 1:  # [..., H·g, S, D], as the copy repeat_kv would make
            outer_size = (*codes.shape[:-3], codes.shape[-3] * head_repeat, codes.shape[-2], head_dim)
            outer_stride = _contiguous_strides(outer_size)
        elif outer_size is None:
            outer_size = (*codes.shape[:-1], head_dim)
            # mirror the codes' layout (expanded, transposed, sliced leading dims) so that model
            # code's reshape/contiguous decisions on the cache match what the buffers can do
            width = codes.shape[-1]
            outer_stride = (*(st // width * head_dim for st in codes.stride()[:-1]), 1)
        return torch.Tensor._make_wrapper_subclass(cls, outer_size, strides=outer_stride, dtype=dtype,
                                                   device=codes.device, requires_grad=False)

    def __init__(self, codes, meta, spec, head_dim, dtype, outer_size=None, outer_stride=None, ring=None,
                 ring_pos=None, head_repeat=1, frame=None, numerics=None):
        # numerics: ignored; a compiled graph that builds the tensor from plain buffers (see
        # integrations.transformers) passes numerics_digest() so that its text, which graph caches
        # key on, changes with the dispatch code it traced
        self.codes = codes
        self.meta = meta
        self.spec = spec
        self.head_dim = head_dim
        self.ring = ring
        self.ring_pos = ring_pos
        self.frame = frame
        self.head_repeat = head_repeat

    @property
    def window(self) -> int:
        """Positions held in full precision as well (``KVQuantConfig.residual_window``)."""
        return 0 if self.ring is None else self.ring.shape[-2]

    # -- construction ------------------------------------------------------------------
    @classmethod
    def empty(cls, shape, spec: TensorQuantSpec, *, dtype=torch.bfloat16, device=None,
              window: int = 0, frame: Optional[torch.Tensor] = None) -> "QuantizedCacheTensor":
        """A zero-filled cache of dense shape ``shape`` (decodes to zeros, or to ``μ`` with a frame);
        ``window``: residual window; ``frame``: the layer's ``[Hkv, R, D]`` frame, or None."""
        *lead, d = shape
        spec.check_head_dim(d)
        codes = torch.zeros(*lead, packed_size(d, spec.bits), dtype=torch.uint8, device=device)
        meta_width, meta_dtype = _meta_layout(spec, d)
        meta = torch.zeros(*lead, meta_width, dtype=meta_dtype, device=device)
        ring, ring_pos = _empty_ring(lead[:-1], window, d, dtype, device)
        return cls(codes, meta, spec, d, dtype, ring=ring, ring_pos=ring_pos,
                   frame=_held_frame(frame, lead[:-1], d, device))

    @classmethod
    def from_dense(cls, x: torch.Tensor, spec: TensorQuantSpec, window: int = 0,
                   frame: Optional[torch.Tensor] = None) -> "QuantizedCacheTensor":
        frame = _held_frame(frame, x.shape[:-2], x.shape[-1], x.device)
        codes, meta = _encode_rows(x if frame is None else frame_rows(x, frame), spec)
        ring, ring_pos = _empty_ring(x.shape[:-2], window, x.shape[-1], x.dtype, x.device)
        if ring is not None:
            ring, ring_pos = _ring_written(ring, ring_pos, x, torch.arange(x.shape[-2], device=x.device))
        return cls(codes, meta, spec, x.shape[-1], x.dtype, ring=ring, ring_pos=ring_pos, frame=frame)

    # -- tracing support ---------------------------------------------------------------
    def __tensor_flatten__(self):
        names = ["codes", "meta"] + (["ring", "ring_pos"] if self.ring is not None else []) + \
            (["frame"] if self.frame is not None else [])
        return names, (self.spec, self.head_dim, self.dtype, self.head_repeat)

    @staticmethod
    def __tensor_unflatten__(inner, ctx, outer_size, outer_stride):
        spec, head_dim, dtype, head_repeat = ctx
        # the outer size/stride Dynamo traced with (symbols with sources), not ones re-derived
        # from the inner tensors: derived expressions carry symbols no guard can name
        return QuantizedCacheTensor(inner["codes"], inner["meta"], spec, head_dim, dtype, outer_size, outer_stride,
                                    ring=inner.get("ring"), ring_pos=inner.get("ring_pos"), head_repeat=head_repeat,
                                    frame=inner.get("frame"))

    def _stable_hash_for_caching(self) -> str:
        # the AOT/FX graph caches key subclass inputs by this string alone: it must pin the inner
        # layouts too, or a graph compiled for other strides is reused (seen: "expected size 40==20")
        # ...and the numerics' source: the graphs trace our dispatch code, which the cache
        # key does not otherwise see (seen: a changed 3-bit layout served from a stale cache)
        return (f"turboquant.QuantizedCacheTensor:{numerics_digest()}:{self.spec}:{self.head_dim}:{self.dtype}:"
                f"{self.head_repeat}:"
                f"{tuple(self.codes.shape)}:{self.codes.stride()}:{tuple(self.meta.shape)}:{self.meta.stride()}:"
                f"{None if self.ring is None else (tuple(self.ring.shape), self.ring.stride())}:"
                f"{None if self.frame is None else (tuple(self.frame.shape), self.frame.stride())}")

    def __repr__(self):
        return (f"QuantizedCacheTensor(shape={tuple(self.shape)}, dtype={self.dtype}, method={self.spec.method}, "
                f"bits={self.spec.bits}, nbytes={self.quantized_nbytes})")

    @property
    def quantized_nbytes(self) -> int:
        """Bytes of codes plus metadata, plus the residual window's ring (what this cache really holds;
        a frame is a constant of the layer, ``2·D`` or ``(2D + 1)·D`` floats per head, not counted)."""
        held = [self.codes, self.meta] + ([self.ring, self.ring_pos] if self.ring is not None else [])
        return sum(t.numel() * t.element_size() for t in held)

    def dequantize(self, dtype: Optional[torch.dtype] = None) -> torch.Tensor:
        dtype = dtype or self.dtype
        return dense_rows(self.codes, self.meta, self.spec, self.head_dim, dtype, self.frame, self.ring, self.ring_pos,
                          self.head_repeat)

    # -- dispatch ------------------------------------------------------------------------
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _sdpa(*args, **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _any_head_repeat(args, kwargs):  # only attention reads a GQA expansion lazily
            args, kwargs = tree_map(_expand_heads, (args, kwargs))
        handler = _HANDLERS.get(func)
        if handler is not None:
            return handler(func, *args, **kwargs)
        if func in _PASSTHROUGH_VIEWS:
            return _same_view(args[0], lambda t: func(t))
        if func in _DIM_VIEWS:
            return _dim_view(func, *args, **kwargs)
        if func in _SIZE_VIEWS:
            return _size_view(func, *args, **kwargs)
        if func.is_view or _mutates_a_cache(func, args, kwargs):
            raise UnsupportedCacheOperation(
                f"turboquant: {func} on a quantized KV cache is not supported (it would write to or alias a "
                "dequantized copy and lose the write); quantize this model with turboquant.compile(..., "
                "exclude=...) or report the model")
        # a read: decode the caches and run it dense
        return func(*tree_map(_dense, args), **tree_map(_dense, kwargs))


def _contiguous_strides(size) -> tuple:
    strides, step = [], 1
    for n in reversed(size):
        strides.append(step)
        step = step * n
    return tuple(reversed(strides))


def _meta_words(spec: TensorQuantSpec, d: int) -> bool:
    """Whether a row's metadata is stored as one integer word (:func:`~.quant.affine.metadata_word`):
    affine with one group per row. One store per row then, which a compiler fuses into the
    kernel that reduces the row; a ``[rows, 2]`` store it does not (and a view of the buffer
    as a wider dtype is a library call in torch 2.11's Inductor)."""
    return spec.method == "affine" and spec.resolved_group_size(d) == d


def _meta_layout(spec: TensorQuantSpec, d: int) -> tuple:
    """(width, dtype) of a row's stored metadata."""
    if _meta_words(spec, d):
        return 1, metadata_word_dtype(spec.metadata_dtype)
    shape = metadata_shape(spec, d)
    return shape[0] * (shape[1] if len(shape) > 1 else 1), spec.metadata_dtype


def _encode_rows(x: torch.Tensor, spec: TensorQuantSpec):
    """Quantize dense rows to (packed codes, stored meta ``[..., width]``, see :func:`_meta_layout`)."""
    if _meta_words(spec, x.shape[-1]):
        if spec.clip_percentile in (None, 100) and schedules_with_triton(x):
            # one Triton kernel per cache write (the same bits as encode + pack_codes); Inductor's
            # C++ backend fuses the plain form into one kernel already, and eager runs it faster
            return affine_quantize_packed(x, spec.bits, spec.metadata_dtype)
        codes, meta = encode(x, spec)
        return pack_codes(codes, spec.bits), metadata_word(meta[..., 0, 0], meta[..., 0, 1]).unsqueeze(-1)
    if spec.method == "turbo" and schedules_with_triton(x):
        # after the rotation's reduction, one Triton kernel per cache write (see turbo_quantize_packed)
        return turbo_quantize_packed(x, spec.bits, spec.seed, spec.metadata_dtype, spec.rescale_norm)
    codes, meta = encode(x, spec)
    return pack_codes(codes, spec.bits), meta.reshape(*x.shape[:-1], -1)


def _empty_ring(lead, window: int, d: int, dtype, device):
    if not window:
        return None, None
    return (torch.zeros(*lead, window, d, dtype=dtype, device=device),
            torch.full((window,), -1, dtype=torch.int64, device=device))


def _ring_update(rows: torch.Tensor, positions: torch.Tensor, window: int):
    """(slots, rows, positions) to write into a ring of ``window`` slots: the last ``window`` rows only
    (more would collide in the ring, and index_copy_ with repeated indices has no defined order)."""
    n = min(rows.shape[-2], window)
    positions = positions[-n:]
    return positions % window, rows[..., -n:, :], positions


def _ring_written(ring, ring_pos, rows, positions):
    """Out-of-place: the ring after writing ``rows [..., L, D]`` at ``positions [L]``."""
    slots, rows, positions = _ring_update(rows.to(ring.dtype), positions, ring.shape[-2])
    return ring.index_copy(ring.dim() - 2, slots, rows), ring_pos.index_copy(0, slots, positions)


def _write_ring_(dst: "QuantizedCacheTensor", rows, positions) -> None:
    if dst.ring is None:
        return
    rows = rows.dequantize() if isinstance(rows, QuantizedCacheTensor) else rows
    slots, rows, positions = _ring_update(rows.to(dst.ring.dtype), positions, dst.window)
    dst.ring.index_copy_(dst.ring.dim() - 2, slots, rows.expand(*dst.ring.shape[:-2], *rows.shape[-2:]))
    dst.ring_pos.index_copy_(0, slots, positions)


def _held_frame(frame, lead, d: int, device):
    """A layer's ``[Hkv, R, D]`` frame as the cache holds it: ``[*lead, R, D]`` (lead ends with Hkv),
    contiguous (views that merge leading dims must be able to view it as they view the codes)."""
    if frame is None:
        return None
    if (frame.dim() != 3 or frame.shape[1] not in frame_rows_allowed(d) or frame.shape[2] != d or not lead
            or frame.shape[0] != lead[-1]):
        raise ValueError(f"turboquant: a frame of shape {tuple(frame.shape)} for a cache of heads x head_dim "
                         f"{tuple(lead[-1:])} x {d}; allowed: [kv_heads, 2 or 2 * head_dim + 1, head_dim] "
                         "of the same model")
    frame = frame.to(device=device, dtype=torch.float32)
    return frame.reshape(*(1,) * (len(lead) - 1), *frame.shape).expand(*lead, *frame.shape[1:]).contiguous()


def _seq_held(t) -> bool:
    """Whether ``t`` holds tensors (a residual window's ring, a frame) that need the sequence at dim -2."""
    return t.ring is not None or t.frame is not None


def _sequence_must_stay(t, what: str) -> None:
    if t.ring is not None:
        raise UnsupportedCacheOperation(f"turboquant: {what} on a quantized KV cache with a residual window is not "
                                        "supported (the window needs the sequence at dim -2); use residual_window=0")
    if t.frame is not None:
        raise UnsupportedCacheOperation(f"turboquant: {what} on a quantized KV cache with a calibrated frame is not "
                                        "supported (the frame needs the sequence at dim -2); use frames=None")


def _dense(x):
    return x.dequantize() if isinstance(x, QuantizedCacheTensor) else x


def _expand_heads(x):
    """A lazy GQA expansion as the expanded copy it stands for (other tensors unchanged)."""
    if not isinstance(x, QuantizedCacheTensor) or x.head_repeat == 1:
        return x
    g = x.head_repeat
    ring = None if x.ring is None else x.ring.repeat_interleave(g, dim=-3)
    frame = None if x.frame is None else x.frame.repeat_interleave(g, dim=-3)
    return QuantizedCacheTensor(x.codes.repeat_interleave(g, dim=-3), x.meta.repeat_interleave(g, dim=-3), x.spec,
                                x.head_dim, x.dtype, ring=ring, ring_pos=x.ring_pos, frame=frame)


def _any_head_repeat(args, kwargs) -> bool:
    """Whether a lazy GQA expansion is among the op's arguments (top level or in a list, as cat's)."""
    for a in (*args, *kwargs.values()):
        for t in (a if isinstance(a, (list, tuple)) else (a,)):
            if isinstance(t, QuantizedCacheTensor) and t.head_repeat > 1:
                return True
    return False


def _gqa_expanded(t) -> bool:
    """``t`` is ``[..., H, g, S, D]`` expanded along g (stride 0), as repeat_kv makes it."""
    return t.dim() >= 4 and t.shape[-3] > 1 and all(
        x.stride(-3) == 0 for x in (t.codes, t.meta, t.ring, t.frame) if x is not None)


def _heads_repeated(t, size):
    """``t`` reshaped to ``size`` as a lazy GQA expansion, or None if this is not one: ``t`` is
    :func:`_gqa_expanded` and ``size`` merges H and g."""
    if not _gqa_expanded(t) or len(size) != t.dim() - 1 or -1 in size[:-2]:
        return None
    want = [*t.shape[:-4], t.shape[-4] * t.shape[-3], t.shape[-2], t.head_dim]
    if list(size[:-2]) != want[:-2] or size[-2] not in (-1, want[-2]) or size[-1] not in (-1, want[-1]):
        return None
    ring = None if t.ring is None else t.ring.select(-3, 0)
    frame = None if t.frame is None else t.frame.select(-3, 0)
    return QuantizedCacheTensor(t.codes.select(-3, 0), t.meta.select(-3, 0), t.spec, t.head_dim, t.dtype,
                                ring=ring, ring_pos=t.ring_pos, head_repeat=t.shape[-3], frame=frame)


def _like(t: QuantizedCacheTensor, codes, meta, ring=None, ring_pos=None, frame=None) -> QuantizedCacheTensor:
    if ring is None:
        ring, ring_pos = t.ring, t.ring_pos
    return QuantizedCacheTensor(codes, meta, t.spec, t.head_dim, t.dtype, ring=ring, ring_pos=ring_pos,
                                frame=t.frame if frame is None else frame)


def _same_view(t, fn, ring_fn=None):
    """The view ``fn`` of codes and meta; the ring and the frame take ``ring_fn`` (default ``fn``)."""
    ring = None if t.ring is None else (ring_fn or fn)(t.ring)
    frame = None if t.frame is None else (ring_fn or fn)(t.frame)
    return _like(t, fn(t.codes), fn(t.meta), ring, t.ring_pos, frame)


def _not_head_dim(t, dim: int, what) -> int:
    dim = dim % t.dim() if t.dim() else 0
    if dim == t.dim() - 1:
        raise UnsupportedCacheOperation(f"turboquant: {what} along head_dim of a quantized KV cache is not supported "
                                  "(codes are packed along it)")
    return dim


def _dim_view(func, t, dim, *rest, **kw):
    if func is aten.unsqueeze.default:
        # a new dim may go anywhere before head_dim (x[:, :, :, None, :] in repeat_kv of [B, S, H, D])
        dim = dim % (t.dim() + 1)
        if dim == t.dim():
            raise UnsupportedCacheOperation("turboquant: unsqueeze after head_dim of a quantized KV cache")
        if dim == t.dim() - 1:
            _sequence_must_stay(t, "unsqueeze between the sequence and head_dim")
        return _same_view(t, lambda x: func(x, dim))
    dim = _not_head_dim(t, dim, func)
    if dim == t.dim() - 2 and _seq_held(t):
        if func is not aten.slice.Tensor:
            _sequence_must_stay(t, f"{func} of the sequence dim")
        return _same_view(t, lambda x: func(x, dim, *rest, **kw), ring_fn=lambda r: r)  # positions index the ring
    return _same_view(t, lambda x: func(x, dim, *rest, **kw))


def _last_size(func, t, size: list) -> int:
    """The last dim of ``func``'s view of ``t`` to ``size``: a ``-1`` there keeps it (``expand``) or is inferred from
    the other sizes (``view``, ``reshape``; one ``-1`` at most)."""
    if size[-1] != -1:
        return size[-1]
    if func is aten.expand.default:
        return t.shape[-1]
    known = 1
    for n in size[:-1]:
        known *= n
    return t.numel() // known if known else -1


def _size_view(func, t, size, *rest, **kw):
    size = list(size)
    if size and _last_size(func, t, size) != t.head_dim:
        if func is aten._unsafe_view.default:
            # the view after reshape's copy (``v.transpose(1, 2).reshape(B, S, -1)``: Doge's dynamic mask): its
            # input is that copy, which nothing else aliases, so a dense copy loses no write
            return func(_dense(t), size, *rest, **kw)
        raise UnsupportedCacheOperation(f"turboquant: {func} to size {size} changes head_dim of a quantized KV cache")
    if func is not aten.expand.default:
        repeated = _heads_repeated(t, size)
        if repeated is not None:
            return repeated
        if _expanded(t):  # a clone kept lazy (_clone) that this view cannot keep lazy: copy now
            t = _same_view(t, lambda x: x.contiguous())
    ring = frame = None
    if _seq_held(t):
        if len(size) < 2 or t.dim() < 2 or not (size[-2] == -1 or size[-2] == t.shape[-2]):
            _sequence_must_stay(t, f"{func} to size {size}")
        if t.ring is not None:
            ring = func(t.ring, size[:-2] + [-1 if size[-2] == -1 else t.window, t.head_dim], *rest, **kw)
        if t.frame is not None:
            frame = func(t.frame, size[:-2] + [-1 if size[-2] == -1 else t.frame.shape[-2], t.head_dim], *rest,
                         **kw)
    return _like(t, func(t.codes, size[:-1] + [t.codes.shape[-1]], *rest, **kw),
                 func(t.meta, size[:-1] + [t.meta.shape[-1]], *rest, **kw), ring, t.ring_pos, frame)


def _mutates_a_cache(func, args, kwargs) -> bool:
    schema = func._schema
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            val = args[i] if i < len(args) else kwargs.get(a.name)
            if isinstance(val, QuantizedCacheTensor):
                return True
    return False


def _rows_for(dst: QuantizedCacheTensor, src) -> tuple:
    """Encoded (codes, meta) of ``src`` for writing into ``dst``'s spec (and frame: two caches that both
    hold one are taken to be of the same layer, hence the same frame)."""
    if isinstance(src, QuantizedCacheTensor):
        if src.spec != dst.spec or (src.frame is None) != (dst.frame is None):
            src = src.dequantize()
        else:
            return src.codes, src.meta
    src = src.to(dst.dtype) if src.dtype != dst.dtype else src
    if dst.frame is not None:
        src = frame_rows(src, dst.frame)
    return _encode_rows(src, dst.spec)


def _copy_(func, dst, src, non_blocking=False):
    if not isinstance(dst, QuantizedCacheTensor):  # a read into a dense tensor (MLA's key from its cached latents)
        return func(dst, _dense(src), non_blocking)
    codes, meta = _rows_for(dst, src.expand(dst.shape) if not isinstance(src, QuantizedCacheTensor) else src)
    dst.codes.copy_(codes)
    dst.meta.copy_(meta)
    if dst.ring is not None:
        if isinstance(src, QuantizedCacheTensor) and src.window == dst.window:
            dst.ring.copy_(src.ring)
            dst.ring_pos.copy_(src.ring_pos)
        else:  # which positions a whole-cache copy holds is unknown (a rolled sliding window): read codes
            dst.ring_pos.fill_(-1)
    return dst


def _index_copy_(func, dst, dim, index, src):
    dim = _not_head_dim(dst, dim, "index_copy_")
    if _seq_held(dst) and dim != dst.dim() - 2:
        _sequence_must_stay(dst, f"index_copy_ along dim {dim}")
    codes, meta = _rows_for(dst, src)
    dst.codes.index_copy_(dim, index, codes)
    dst.meta.index_copy_(dim, index, meta)
    _write_ring_(dst, src, index)
    return dst


def _index_put_(func, dst, indices, values, accumulate=False):
    if accumulate:
        raise UnsupportedCacheOperation("turboquant: index_put_(accumulate=True) on a quantized KV cache")
    if len(indices) >= dst.dim():
        raise UnsupportedCacheOperation("turboquant: indexing head_dim of a quantized KV cache is not supported")
    target = list(dst.shape[:len(indices)])
    # the shape of the indexed region: broadcast index shape, then the remaining dims
    probe = torch.empty(target, device="meta")[tuple(slice(None) if i is None else i.to("meta") for i in indices)]
    values = values.expand(*probe.shape, *dst.shape[len(indices):]) if not isinstance(values, QuantizedCacheTensor) \
        else values
    if _seq_held(dst):  # k_cache[:, :, pos] = k (gpt-fast): a write along the sequence dim
        seq = len(indices) == dst.dim() - 1 and all(i is None for i in indices[:-1])
        if not (seq and indices[-1] is not None and indices[-1].dim() == 1):
            _sequence_must_stay(dst, "index_put_ other than cache[..., positions, :] = rows")
    codes, meta = _rows_for(dst, values)
    func(dst.codes, indices, codes)
    func(dst.meta, indices, meta)
    if dst.ring is not None:
        _write_ring_(dst, values, indices[-1])
    return dst


def _zero_(func, dst):
    dst.codes.zero_()
    dst.meta.zero_()
    if dst.ring is not None:
        dst.ring.zero_()
        dst.ring_pos.fill_(-1)
    return dst


def _cat(func, tensors, dim=0):
    first = next(t for t in tensors if isinstance(t, QuantizedCacheTensor))
    dim = _not_head_dim(first, dim, "cat")
    kept = [t for t in tensors if not (t.dim() == 1 and t.numel() == 0)]
    parts = [_rows_for(first, t) for t in kept]
    ring = ring_pos = None
    if _seq_held(first) and (dim != first.dim() - 2 or kept[0] is not first):
        _sequence_must_stay(first, "cat other than cat([cache, new_rows], dim=-2)")
    if first.ring is not None:
        rows = torch.cat([_dense(t).to(first.dtype) for t in kept[1:]], dim) if len(kept) > 1 else None
        ring, ring_pos = first.ring, first.ring_pos
        if rows is not None:
            start = first.shape[-2]
            ring, ring_pos = _ring_written(ring, ring_pos, rows,
                                           torch.arange(start, start + rows.shape[-2], device=rows.device))
    return _like(first, torch.cat([c for c, _ in parts], dim), torch.cat([m for _, m in parts], dim), ring, ring_pos)


def _expanded(t) -> bool:
    return any(st == 0 and n > 1 for st, n in zip(t.codes.stride(), t.codes.shape))


def _clone(func, t, memory_format=None, **kw):
    if _gqa_expanded(t):
        # the copy a GQA expansion ([..., H, g, S, D] expanded along g) makes before merging
        # heads: kept a view, so that the merge becomes a lazy head_repeat instead of a copy of
        # the whole cache per step (other expansions, e.g. of the batch, are copied)
        return _same_view(t, lambda x: x)
    out = _same_view(t, lambda x: x.clone(memory_format=torch.contiguous_format))
    if t.ring_pos is not None:
        out.ring_pos = t.ring_pos.clone()
    return out


def _to_copy(func, t, dtype=None, device=None, **kw):
    if dtype is not None and dtype != t.dtype:
        return func(t.dequantize(), dtype=dtype, device=device, **kw)
    if device is None:
        return _clone(func, t)
    ring = None if t.ring is None else t.ring.to(device=device)
    ring_pos = None if t.ring is None else t.ring_pos.to(device=device)
    frame = None if t.frame is None else t.frame.to(device=device)
    return _like(t, t.codes.to(device=device), t.meta.to(device=device), ring, ring_pos, frame)


def _transpose(func, t, d0, d1):
    d0, d1 = d0 % t.dim(), d1 % t.dim()
    if t.dim() - 1 in (d0, d1):
        # eager attention's key.transpose(2, 3): codes cannot be viewed across head_dim, so
        # this is a decoded copy — fine for the read it feeds (the FX pass replaces that
        # read with one attention op), and a write through it would not reach the cache
        return t.dequantize().transpose(d0, d1)
    if t.dim() - 2 in (d0, d1):
        _sequence_must_stay(t, "a transpose moving the sequence dim")
    return _same_view(t, lambda x: x.transpose(d0, d1))


def _permute(func, t, dims):
    dims = [d % t.dim() for d in dims]
    if dims[-1] != t.dim() - 1:
        raise UnsupportedCacheOperation("turboquant: a permute moving head_dim of a quantized KV cache is not supported")
    if dims[-2] != t.dim() - 2:
        _sequence_must_stay(t, "a permute moving the sequence dim")
    return _same_view(t, lambda x: x.permute(dims))


def _sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if not (isinstance(key, QuantizedCacheTensor) and isinstance(value, QuantizedCacheTensor)) or dropout_p:
        return F.scaled_dot_product_attention(_dense(query), _dense(key), _dense(value), attn_mask=attn_mask,
                                              dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                                              enable_gqa=enable_gqa)
    return attention_over_cache(query, key, value, attn_mask, scale=scale, is_causal=is_causal)


_attention_op = torch.ops.turboquant.attention  # a module global: tests put the CUDA entry here on the CPU


def attention_over_cache(query, key, value, attn_mask=None, scale=None, softcap=None, is_causal=False,
                         upcast=False):
    """Attention with optional soft-cap; one ``turboquant::attention`` call when K and V are quantized.

    With dense K/V it computes what transformers' eager attention does (matmul, scale,
    soft-cap, additive mask, float32 softmax, matmul), so the FX pass can put it in place of
    that pattern whether or not the cache it reads has been swapped yet; ``upcast`` takes the
    score matmul in float32, as GPT-Neo's eager attention does (the op's scores are float32 anyway).
    """
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    if isinstance(key, QuantizedCacheTensor) and isinstance(value, QuantizedCacheTensor):
        if key.head_repeat != value.head_repeat:  # the op's GQA needs K and V with the same heads
            key, value = _expand_heads(key), _expand_heads(value)
        k_ring, v_ring, k_frame, v_frame = key.ring, value.ring, key.frame, value.frame
        # Frames move out of the op (in a compiled graph: the graph's own ops around it, which
        # Inductor may fuse with q's producer and the output's consumer): (q F^-T)·((k − μ) F) =
        # q·k − q·μ, a shift per query row that softmax ignores, and the output of framed values is
        # unframed after. A soft-cap is not shift-invariant: then the op gets the frames and decodes.
        moved = not softcap
        if moved and k_frame is not None:
            query = per_kv_head(frame_query, query, k_frame)
            k_ring = None if k_ring is None else frame_rows(k_ring, k_frame)  # float32, as the op reads rings
        if moved and v_frame is not None and v_ring is not None:
            v_ring = frame_rows(v_ring, v_frame)
        out = _attention_op(query, key.codes, key.meta, value.codes, value.meta, attn_mask, is_causal, scale,
                            spec_args(key.spec), spec_args(value.spec), key.head_dim, value.head_dim,
                            float(softcap or 0.0), k_ring, key.ring_pos, v_ring, value.ring_pos,
                            None if moved else k_frame, None if moved else v_frame)
        return per_kv_head(unframe_rows, out, v_frame) if moved and v_frame is not None else out
    key, value = _dense(key), _dense(value)
    if upcast:
        w = torch.matmul(query.float(), key.float().transpose(-2, -1)) * scale
    else:
        w = torch.matmul(query, key.transpose(-2, -1)) * scale
    if softcap:
        w = torch.tanh(w / softcap) * softcap
    if is_causal:
        attn_mask = torch.ones(w.shape[-2:], dtype=torch.bool, device=w.device).tril()
    if attn_mask is not None:
        w = w.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else w + attn_mask
    w = F.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(w, value)


_HANDLERS = {
    aten.copy_.default: _copy_,
    aten.index_copy_.default: _index_copy_,
    aten.index_put_.default: _index_put_,
    aten.zero_.default: _zero_,
    aten.cat.default: _cat,
    aten.clone.default: _clone,
    aten._to_copy.default: _to_copy,
    aten.transpose.int: _transpose,
    aten.permute.default: _permute,
}
