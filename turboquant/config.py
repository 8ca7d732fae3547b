"""Quantization settings, validated when they are built, never deep inside a kernel."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Optional, Tuple

import torch

if TYPE_CHECKING:
    from .calibration import KVFrames

__all__ = ["KVQuantConfig", "TensorQuantSpec", "METHODS", "BITS", "GROUP_SIZES", "METADATA_DTYPES"]

METHODS = ("affine", "turbo")
BITS = (2, 3, 4, 8)
GROUP_SIZES = (None, 32, 64, 128)
METADATA_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
ROLES = ("k", "v")

_DTYPE_NAMES = {"float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
                "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float32": torch.float32, "fp32": torch.float32, "float": torch.float32}


def _allowed(values) -> str:
    return ", ".join(repr(v) for v in values)


def _check_bits(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value not in BITS:
        raise ValueError(f"{name}={value!r} is not supported; allowed: {_allowed(BITS)}")
    return value


def _check_dtype(value) -> torch.dtype:
    if isinstance(value, str):
        if value not in _DTYPE_NAMES:
            raise ValueError(f"metadata_dtype={value!r} is not supported; allowed: "
                             f"{_allowed(sorted(_DTYPE_NAMES))}")
        value = _DTYPE_NAMES[value]
    if value not in METADATA_DTYPES:
        raise ValueError(f"metadata_dtype={value!r} is not supported; allowed: {_allowed(METADATA_DTYPES)}")
    return value


@dataclass(frozen=True)
class TensorQuantSpec:
    """How one cache tensor (the keys or the values of a layer) is quantized.

    Resolved from a :class:`KVQuantConfig` by :meth:`KVQuantConfig.spec`; the packed
    tensor carries it so that it can be decoded without the config.
    """

    method: str
    bits: int
    group_size: Optional[int]
    clip_percentile: Optional[float]
    metadata_dtype: torch.dtype
    seed: int
    rescale_norm: bool = True

    def resolved_group_size(self, head_dim: int) -> int:
        """Elements per (scale, zero) group for a head of ``head_dim`` elements."""
        if self.method == "turbo":
            return head_dim
        group = head_dim if self.group_size is None else self.group_size
        if head_dim % group:
            raise ValueError(f"group_size={group} does not divide head_dim={head_dim}; "
                             f"allowed: a value of {_allowed(GROUP_SIZES)} that divides it")
        return group

    def check_head_dim(self, head_dim: int) -> None:
        """Raise ``ValueError`` if the codes of ``head_dim`` elements cannot be packed."""
        from .quant.packing import CODES_PER_BLOCK  # here: quant imports this module

        per_byte_block = CODES_PER_BLOCK[self.bits]
        if head_dim % per_byte_block:
            raise ValueError(f"head_dim={head_dim} cannot hold {self.bits}-bit codes packed along it; "
                             f"it must be a multiple of {per_byte_block}")
        self.resolved_group_size(head_dim)


@dataclass(frozen=True)
class KVQuantConfig:
    """How turboquant stores a KV cache.

    Args:
        method: ``"affine"`` — asymmetric min/max per group of ``group_size`` elements along
            head_dim, one (scale, integer zero point) pair per group, per token, per head;
            or ``"turbo"`` — Google's TurboQuant: a fixed random rotation of each head vector,
            its norm, and a Lloyd–Max codebook for the rotated coordinates.
        bits: code width for both K and V: 2, 3, 4 or 8.
        k_bits, v_bits: override ``bits`` for keys or values (keys are the more sensitive;
            ``k_bits=8, v_bits=4`` is a common choice).
        group_size: affine only. Elements per group along head_dim; ``None`` (default) means
            the whole head_dim; 32, 64 or 128 when it divides head_dim.
        clip_percentile: affine only. ``None`` uses the group's min/max; a value in (50, 100],
            e.g. ``99.99``, clips the range at that percentile of ``|x|`` within the group
            (elements outside saturate) to keep one outlier from widening every step.
        metadata_dtype: dtype of scales, zero points and norms: float16 (default),
            bfloat16 or float32 (also accepted as strings).
        seed: turbo only. Seed of the random rotation; the rotation is a pure function of
            (head_dim, seed), so the same seed always decodes the same codes.
        rescale_norm: turbo only. ``True`` (default) stores ``‖x‖ / ‖ŷ‖``, ``ŷ`` the decoded
            unit vector, so a decoded vector keeps the norm of ``x``: Lloyd–Max reconstruction
            shrinks it by about ``√(1 − D)``, which flattens every softmax over quantized keys.
            ``False`` stores ``‖x‖`` as the paper does (times the table's level unit,
            :func:`~turboquant.quant.turbo.level_unit`, at 2, 3, 4 and 8 bits; for 8-bit rows of
            head_dim ≤ 128, a grid of their own, :func:`~turboquant.quant.turbo.row_grid`, times the
            row's step). On the reference model (decode steps,
            8 windows; benchmarks/RESULTS.md) it takes 4-bit turbo from +3.38% to +2.61%
            perplexity, 3-bit from +17.5% to +12.6%. Mean squared error of unit vectors (``tq distortion``): 2-bit
            0.116 → 0.119, 3-bit 0.0340 → 0.0338, 4-bit 0.00931 → 0.00917.
        protected_layers: layer indices whose cache keeps more precision (negative indices
            count from the last layer): ``(0, 1, -2, -1)`` protects the first and last two.
            Low-bit caches degrade most in the boundary layers.
        protected_bits: ``None`` (default) keeps the protected layers' cache unquantized;
            2, 3, 4 or 8 stores them with that many bits (same method) instead.
        residual_window: keep the K/V of the ``residual_window`` most recently written
            positions in full precision as well (a ring of that many dense rows per cache);
            attention reads those positions dense and every older one from the codes. 0
            (default) turns it off. A few dozen tokens recover most of the low-bit loss:
            recent tokens carry most of the attention.
        frames: ``None`` (default), or :class:`~turboquant.calibration.KVFrames` from
            :func:`turboquant.calibrate`: each layer's cache quantizes its rows minus the head's
            mean key/value, keys mapped by how much the queries read each direction; attention
            is exactly unchanged by the frame itself, only the quantization error shrinks. No
            bytes per token; transformers models only (the frames index the model's layers). On
            the reference model (decode steps over 64 held-out windows; benchmarks/RESULTS.md) it
            takes 4-bit turbo from +3.61% to +1.39% perplexity (KL 0.062 → 0.030).

    Invalid values raise ``ValueError`` naming the value and what is allowed.

    Example::

        >>> cfg = KVQuantConfig(method="turbo", bits=4, v_bits=3)
        >>> cfg.spec("v").bits
        3
    """

    method: Literal["affine", "turbo"] = "affine"
    bits: int = 4
    k_bits: Optional[int] = None
    v_bits: Optional[int] = None
    group_size: Optional[int] = None
    clip_percentile: Optional[float] = None
    metadata_dtype: torch.dtype = torch.float16
    seed: int = 0
    rescale_norm: bool = True
    protected_layers: Tuple[int, ...] = ()
    protected_bits: Optional[int] = None
    residual_window: int = 0
    frames: Optional["KVFrames"] = None

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method={self.method!r} is not supported; allowed: {_allowed(METHODS)}")
        _check_bits("bits", self.bits)
        for name in ("k_bits", "v_bits"):
            if getattr(self, name) is not None:
                _check_bits(name, getattr(self, name))
        if self.group_size is not None:
            if isinstance(self.group_size, bool) or self.group_size not in GROUP_SIZES:
                raise ValueError(f"group_size={self.group_size!r} is not supported; "
                                 f"allowed: {_allowed(GROUP_SIZES)}")
            if self.method == "turbo":
                raise ValueError(f"group_size={self.group_size!r} applies to method='affine' only; "
                                 "turbo quantizes the whole rotated head vector (leave group_size=None)")
        if self.clip_percentile is not None:
            p = self.clip_percentile
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not (50.0 < p <= 100.0):
                raise ValueError(f"clip_percentile={p!r} is not supported; allowed: None or a number "
                                 "in (50, 100], e.g. 99.99")
            if self.method == "turbo":
                raise ValueError(f"clip_percentile={p!r} applies to method='affine' only")
        object.__setattr__(self, "metadata_dtype", _check_dtype(self.metadata_dtype))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed={self.seed!r} is not supported; allowed: an integer >= 0")
        if not isinstance(self.rescale_norm, bool):
            raise ValueError(f"rescale_norm={self.rescale_norm!r} is not supported; allowed: True or False")
        if self.method != "turbo" and not self.rescale_norm:
            raise ValueError("rescale_norm=False applies to method='turbo' only (affine stores no norm)")
        layers = self.protected_layers
        if isinstance(layers, int) and not isinstance(layers, bool):
            layers = (layers,)
        if not isinstance(layers, (tuple, list)) or any(isinstance(i, bool) or not isinstance(i, int) for i in layers):
            raise ValueError(f"protected_layers={self.protected_layers!r} is not supported; allowed: a tuple of "
                             "layer indices (ints; negative counts from the last layer), e.g. (0, 1, -2, -1)")
        object.__setattr__(self, "protected_layers", tuple(sorted(set(layers))))
        if self.protected_bits is not None:
            _check_bits("protected_bits", self.protected_bits)
            if not self.protected_layers:
                raise ValueError(f"protected_bits={self.protected_bits!r} needs protected_layers (which layers "
                                 "get those bits); allowed: protected_bits=None without protected_layers")
        w = self.residual_window
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"residual_window={w!r} is not supported; allowed: an integer >= 0 (0: off)")
        if self.frames is not None:
            from .calibration import KVFrames  # here: calibration's users import this module

            if not isinstance(self.frames, KVFrames):
                raise ValueError(f"frames={self.frames!r} is not supported; allowed: None or the KVFrames "
                                 "turboquant.calibrate(model, input_ids) returns")

    @classmethod
    def from_kwargs(cls, **kwargs) -> "KVQuantConfig":
        """Build from keyword options, naming any unknown option and the known ones."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(map(repr, unknown))}; "
                             f"allowed: {', '.join(sorted(known))}")
        return cls(**kwargs)

    def is_protected(self, layer: int, num_layers: Optional[int]) -> bool:
        """Whether ``layer`` (0-based) is one of ``protected_layers`` in a model of ``num_layers``."""
        for i in self.protected_layers:
            if i == layer or (i < 0 and num_layers is not None and num_layers + i == layer):
                return True
        return False

    def for_layer(self, layer: int, num_layers: Optional[int]) -> Optional["KVQuantConfig"]:
        """The config of layer ``layer``: ``self``, the ``protected_bits`` variant, or ``None`` (dense)."""
        if not self.is_protected(layer, num_layers):
            return self
        if self.protected_bits is None:
            return None
        return dataclasses.replace(self, bits=self.protected_bits, k_bits=None, v_bits=None,
                                   protected_layers=(), protected_bits=None)

    def frame(self, layer: Optional[int], role: str) -> Optional[torch.Tensor]:
        """Layer ``layer``'s ``[Hkv, R, D]`` frame for ``role`` (``"k"``/``"v"``), or None without frames."""
        return None if self.frames is None else self.frames.frame(layer, role)

    def spec(self, role: str) -> TensorQuantSpec:
        """The per-tensor settings for keys (``"k"``) or values (``"v"``)."""
        if role not in ROLES:
            raise ValueError(f"role={role!r} is not supported; allowed: {_allowed(ROLES)}")
        override = self.k_bits if role == "k" else self.v_bits
        return TensorQuantSpec(method=self.method, bits=self.bits if override is None else override,
                               group_size=self.group_size, clip_percentile=self.clip_percentile,
                               metadata_dtype=self.metadata_dtype, seed=self.seed,
                               rescale_norm=self.rescale_norm)
