"""Configuration spec strings for ``tq eval``: ``"affine-8"``, ``"turbo-3"``, ``"affine-k8v4"``, ….

Grammar: ``METHOD-BITS[-OPTION...]`` or ``METHOD-kKBITSvVBITS[-OPTION...]``, or ``none`` (the
unquantized model; also ``unquantized``, ``dense``). Options, each introduced by ``-``:

========  ==============================  =====================================
``gN``    group_size=N (affine)           ``affine-4-g32``
``cP``    clip_percentile=P (affine)      ``affine-3-c99.9``
``sN``    seed=N (turbo rotation)         ``turbo-3-s1``
``n0``    rescale_norm=False (turbo: the  ``turbo-4-n0``
          paper's plain norm)
``mfp32`` metadata_dtype (fp16/bf16/fp32) ``affine-2-mfp32``
``pN``    protected_layers = the first N  ``affine-3-p2``
          and last N layers (unquantized)
``hB``    protected_bits=B (with ``pN``)  ``turbo-3-p2-h8``
``rN``    residual_window=N: the N most   ``turbo-3-r16``
          recent positions in full
          precision
``fN``    frames calibrated on N windows  ``turbo-4-f8``
          of training text                ``turbo-4-f8d``
          (:func:`turboquant.calibrate`;
          ``fNd``: diagonal key maps)
========  ==============================  =====================================

A new option is one entry in :data:`_OPTIONS`: a prefix, the ``turboquant.compile`` keyword it
sets and a parser. Everything is validated by :class:`~turboquant.KVQuantConfig` when parsed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..config import KVQuantConfig, METHODS

__all__ = ["EvalConfig", "parse_config", "parse_configs", "DEFAULT_CONFIGS", "BASELINE_NAMES"]

# then the low-bit settings with the first and last layer at 8 bits (-p1-h8), with the 16 most
# recent positions in full precision (-r16), turbo with the paper's plain norm (-n0), and with
# frames calibrated on 8 windows of training text (-f8)
DEFAULT_CONFIGS = ("affine-8", "affine-4", "affine-3", "affine-2", "turbo-4", "turbo-3", "turbo-2",
                   "affine-k8v4", "affine-k4v3", "turbo-k8v4", "turbo-k4v3",
                   "affine-3-p1-h8", "affine-2-p1-h8", "turbo-3-p1-h8", "turbo-2-p1-h8", "affine-k4v3-p1-h8",
                   "turbo-k4v3-p1-h8",
                   "affine-4-r16", "turbo-4-r16", "affine-3-r16", "turbo-3-r16", "turbo-2-r16", "turbo-k4v3-r16",
                   "turbo-3-p1-h8-r16", "turbo-4-n0", "turbo-3-n0",
                   "turbo-4-f8", "turbo-3-f8", "affine-4-f8", "turbo-k4v3-f8")
BASELINE_NAMES = ("none", "unquantized", "dense", "bf16", "fp16", "fp32")


def _boundary_layers(text: str) -> Tuple[int, ...]:
    n = int(text)
    if n < 1:
        raise ValueError(f"-p{text}: the number of boundary layers must be >= 1")
    return tuple(range(n)) + tuple(range(-n, 0))


def _frames(text: str) -> Tuple[int, str]:
    """``N`` → ``(N, "full")``, ``Nd`` → ``(N, "diagonal")``: calibration windows and key map."""
    diagonal = text.endswith("d")
    n = int(text[:-1] if diagonal else text)
    if n < 1:
        raise ValueError(f"-f{text}: the number of calibration windows must be >= 1")
    return n, "diagonal" if diagonal else "full"


def _flag(text: str) -> bool:
    if text not in ("0", "1"):
        raise ValueError(f"-n{text}: allowed -n0 or -n1")
    return text == "1"


# prefix -> (turboquant.compile keyword, parser of the rest of the token)
_OPTIONS: Dict[str, Tuple[str, Callable[[str], object]]] = {
    "g": ("group_size", int),
    "c": ("clip_percentile", float),
    "s": ("seed", int),
    "n": ("rescale_norm", _flag),
    "m": ("metadata_dtype", str),
    "p": ("protected_layers", _boundary_layers),
    "h": ("protected_bits", int),
    "r": ("residual_window", int),
    "f": ("frames", _frames),
}


def _without_frames(options: dict) -> dict:
    """The options as KVQuantConfig takes them before calibration (``-fN`` counts windows, not frames)."""
    return {k: v for k, v in options.items() if k != "frames"}


@dataclass(frozen=True)
class EvalConfig:
    """One row of the evaluation: a name and the ``turboquant.compile`` keywords (empty: unquantized)."""

    name: str
    options: Tuple[Tuple[str, object], ...] = field(default_factory=tuple)

    @property
    def quantized(self) -> bool:
        return bool(self.options)

    @property
    def kwargs(self) -> dict:
        return dict(self.options)

    @property
    def calibration_windows(self) -> int:
        """Windows of training text the frames are calibrated on (``-fN``); 0: no frames."""
        return self.kwargs.get("frames", (0, "full"))[0]

    @property
    def key_map(self) -> str:
        """:func:`turboquant.calibrate`'s ``key_map`` for ``-fN`` (``"full"``) or ``-fNd`` (``"diagonal"``)."""
        return self.kwargs.get("frames", (0, "full"))[1]

    def compile_kwargs(self, frames=None) -> dict:
        """``turboquant.compile`` keywords: ``-fN`` becomes ``frames`` (the calibrated
        :class:`~turboquant.KVFrames`, required then)."""
        kw = self.kwargs
        if self.calibration_windows:
            if frames is None:
                raise ValueError(f"configuration {self.name!r} needs calibrated frames (-f); none given")
            kw["frames"] = frames
        return kw

    def kv_config(self, frames=None) -> Optional[KVQuantConfig]:
        return KVQuantConfig.from_kwargs(**self.compile_kwargs(frames)) if self.quantized else None

    @property
    def method(self) -> str:
        return self.kwargs.get("method", "none")

    @property
    def bits(self) -> Tuple[Optional[int], Optional[int]]:
        """``(k_bits, v_bits)``; ``(None, None)`` when unquantized."""
        if not self.quantized:
            return (None, None)
        c = KVQuantConfig.from_kwargs(**_without_frames(self.kwargs))
        return (c.spec("k").bits, c.spec("v").bits)


_HEAD = re.compile(r"^(?P<method>[a-z]+)-(?:(?P<bits>\d+)|k(?P<k>\d+)v(?P<v>\d+))$")


def parse_config(spec: str) -> EvalConfig:
    """``"turbo-k4v3-s1"`` → ``EvalConfig("turbo-k4v3-s1", method="turbo", bits=4, k_bits=4, v_bits=3, seed=1)``."""
    text = spec.strip().lower()
    if text in BASELINE_NAMES:
        return EvalConfig("none")
    tokens = text.split("-")
    head = "-".join(tokens[:2])
    m = _HEAD.match(head)
    if m is None or m["method"] not in METHODS:
        raise ValueError(f"configuration {spec!r} is not understood; expected METHOD-BITS or METHOD-kKvV "
                         f"(method one of {', '.join(METHODS)}), e.g. 'affine-8', 'turbo-3', 'affine-k8v4', "
                         f"or 'none'")
    opts: Dict[str, object] = {"method": m["method"]}
    if m["bits"] is not None:
        opts["bits"] = int(m["bits"])
    else:
        opts["k_bits"], opts["v_bits"] = int(m["k"]), int(m["v"])
        opts["bits"] = opts["k_bits"]
    for token in tokens[2:]:
        entry = _OPTIONS.get(token[:1])
        if entry is None or len(token) < 2:
            raise ValueError(f"option {token!r} of configuration {spec!r} is not understood; allowed prefixes: "
                             + ", ".join(f"{p}<{k}>" for p, (k, _) in _OPTIONS.items()))
        key, parse = entry
        try:
            opts[key] = parse(token[1:])
        except ValueError as e:
            raise ValueError(f"option {token!r} of configuration {spec!r}: {e}") from None
    # validate now, with KVQuantConfig's messages (frames are measured later, per model)
    KVQuantConfig.from_kwargs(**_without_frames(opts))
    return EvalConfig(text, tuple(opts.items()))


def parse_configs(specs: Sequence[str]) -> List[EvalConfig]:
    """Parse several specs; duplicates are dropped, order kept."""
    out, seen = [], set()
    for s in specs:
        c = parse_config(s)
        if c.name not in seen:
            seen.add(c.name)
            out.append(c)
    return out
