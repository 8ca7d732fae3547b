"""The evaluation corpus: Python's own standard library, byte-level tokens, a fixed held-out split.

Every machine with Python has the text, so nothing is downloaded. The stdlib differs between
Python versions (3.11 on the CPU machines, 3.12 on the GPU machine) and between patch
releases, so the held-out split is **a fixed list of files whose content was byte-identical in
CPython 3.11.7, 3.12.1 and 3.13.0** (:data:`HELDOUT_FILES`, with each file's SHA-256). They
were picked deterministically: stdlib ``.py`` files of 3–40 KB, identical in the three versions,
outside tests, codec tables (``encodings/``, ``stringprep.py``) and the packages Linux
distributions split off into separate packages (``idlelib``, ``tkinter``, ``turtledemo``,
``ensurepip``, ``lib2to3``, ``distutils``, ``venv``), sorted by the SHA-256 of their relative
path, taken until 300 KB (29 files, 320,688 bytes). So held-out
perplexity is measured on the same bytes on every machine; :func:`heldout_tokens` warns if a
file is missing or differs, and :func:`heldout_digest` (recorded with every result) tells.

Training text is every other stdlib ``.py`` file (``site-packages`` excluded), sorted by path,
minus any file whose content equals a held-out file's. It differs between Python versions,
which only changes what the model was trained on, not what it is measured on.

Tokens: one per byte (0–255) plus specials (:class:`ByteTokenizer`); files are joined with EOS.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sysconfig
import warnings
from typing import Iterable, List, Optional, Sequence, Tuple

import torch

__all__ = ["ByteTokenizer", "TextTokenizer", "load_tokenizer", "TOKENIZER_FILE", "HELDOUT_FILES", "stdlib_root",
           "heldout_tokens", "train_tokens", "heldout_digest", "train_files", "calibration_windows"]

# (path relative to the stdlib root, sha256 of its bytes): identical in CPython 3.11.7, 3.12.1, 3.13.0
HELDOUT_FILES: Tuple[Tuple[str, str], ...] = (
    ("__future__.py", "981d4c398849f9ebcab72300d9c1fe288fd6d7f28957b3b3fa3a493a5836d95c"),
    ("_compression.py", "3ad5d60627477a60939ee44fc1bb3a05dbe8fb52f0f75039b8f5d8f1a278b981"),
    ("_py_abc.py", "f9c6fe3dd9b51bd7d93f867356e9d362600c924febfd903ee1c6e298860dca92"),
    ("_sitebuiltins.py", "b9388bc1d6d12ed6be12da420ab1feca40f99c0e33ec315d92b1e01cb69b25bc"),
    ("asyncio/protocols.py", "1d1b49988c338b4ef06e30f9e92d9db2e00080c341f0a3f573bb8312deb8aff6"),
    ("asyncio/windows_utils.py", "e6fcffefa2521666bc2aed0f5caf8e862c1c1014ad12d2ab5fbce09c2df9c6f0"),
    ("curses/has_key.py", "15a052812d9ae80124bb25b3f5b9ffae38e2b03073774e163abf3d773140cfb3"),
    ("email/_encoded_words.py", "4178321600c0a19ca04cfe8542ce44487f339d15d89a473b58cea63c0b230217"),
    ("email/base64mime.py", "e2b4b87a5f42a8c5780e343f675513bbcc6abdd23fa14f8f1a7d4f7d72304770"),
    ("email/contentmanager.py", "2d81026aef17e4786b15d9ec0629304987e3f275a0fd0a421a81b4ed87234b2c"),
    ("email/headerregistry.py", "fada56c25b6a457c6a62af43f9f929bbc29424103ce65f40f114adb4fdf3d39f"),
    ("email/mime/image.py", "460be5b50cfcaab8e72a73f24f14ab062cedf1a40a775b8b0d80c13aed44bb5e"),
    ("email/quoprimime.py", "77b454bd3ba3b5e3776be28ae3a0fd8de5d1e50d5b8ee10dd539c37c2bd68082"),
    ("heapq.py", "6d43277e5c76fc0f073cd388fcff852d14d068f6bb6d4886c340f8b75a1229a9"),
    ("json/__init__.py", "d5d41e2c29049515d295d81a6d40b4890fbec8d8482cfb401630f8ef2f77e4d5"),
    ("multiprocessing/heap.py", "f6bb79bb99b9ae484935f0d68822e9603a1622dd0b6c4966c79db232a93ba614"),
    ("multiprocessing/reduction.py", "4999f8b9ae7b3e8a7f5de302612b4131498dc2e238a2c47f894905c1c63294fe"),
    ("multiprocessing/sharedctypes.py", "77ef522912474652490b7df523112858e51721e63dcf109b8567a35ce9b31b0d"),
    ("pyclbr.py", "e8ca09333701ba41244e20b8c2c37b7ed0499b88c4b2ca82cac51ef89ca9e647"),
    ("tomllib/_parser.py", "4579b04a7566452304781ccce37d3ebc1c36e810b058bdb1f33c0e51ddab0397"),
    ("tracemalloc.py", "c2cc84a05b824df79840c98729a0e94ef8909b11c528a1b2c5a00aa436b97b25"),
    ("unittest/suite.py", "ed2da92bc9f97c53403ee2d3d12cc53b16a96e85d596ebc887b5a93458f3f6bc"),
    ("weakref.py", "56f8d313fb74019e53eb9287400702fbce788b7fe30e097b0b6e06296f3f080c"),
    ("xml/dom/__init__.py", "b415a6f3d3663c3ac332ee4a0f4213eadad9281508dc97410e258a03633b063a"),
    ("xml/dom/domreg.py", "826b02a803930834b96b1086cbee7db1d21c684f65dd3073706dc7bb5ba1a3e8"),
    ("xml/dom/xmlbuilder.py", "d4f33a8f018755626b64557953a91c6bba21ff613da46f7558a2874aa5d08ebf"),
    ("xml/etree/ElementPath.py", "ae8a80a8b51567b4f0965481682705e70c73dd6bfa145283f630d6833f1b4975"),
    ("xml/sax/handler.py", "64c7aae49f1dd382a7b9012610307bfa1d43a14a5dc09a5c8da30903f6805c3d"),
    ("zoneinfo/_zoneinfo.py", "ebb9b679519a23252eb90541003a2fdbb3f2d7bc36713fd70672baa575dcdcb6"),
)

_SKIP_DIRS = ("site-packages", "dist-packages", "__pycache__")


class ByteTokenizer:
    """Byte-level tokens: id = byte value for 0–255, then PAD, BOS, EOS, KEY, QUERY; vocab 264.

    ``KEY`` opens a planted "key:value" line of a needle sample and ``QUERY`` asks for a key
    (:mod:`turboquant.eval.needle`). Ids 261–263 are reserved (unused).
    """

    name = "bytes"
    PAD, BOS, EOS, KEY, QUERY = 256, 257, 258, 259, 260
    vocab_size = 264

    @property
    def pad_id(self) -> int:
        return self.PAD

    @property
    def bos_id(self) -> int:
        return self.BOS

    @property
    def eos_id(self) -> int:
        return self.EOS

    @property
    def key_marker(self) -> List[int]:
        return [self.KEY]

    @property
    def query_marker(self) -> List[int]:
        return [self.QUERY]

    def encode(self, text) -> List[int]:
        return list(text.encode("utf-8") if isinstance(text, str) else bytes(text))

    def decode(self, ids: Iterable[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def to_dict(self) -> dict:
        return {"type": "bytes", "vocab_size": self.vocab_size, "pad": self.PAD, "bos": self.BOS, "eos": self.EOS,
                "key": self.KEY, "query": self.QUERY}


class TextTokenizer:
    """A transformers tokenizer behind :class:`ByteTokenizer`'s interface (``--model`` checkpoints
    that ship one); the needle markers are short text snippets instead of special ids."""

    name = "transformers"

    def __init__(self, tok):
        self.tok = tok
        self.vocab_size = len(tok)
        eos = tok.eos_token_id if tok.eos_token_id is not None else 0
        self.eos_id = eos
        self.bos_id = tok.bos_token_id if tok.bos_token_id is not None else eos
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else eos
        self.key_marker = self.encode("\n# secret ")
        self.query_marker = self.encode("\n# the value of secret ")

    def encode(self, text) -> List[int]:
        if not isinstance(text, str):
            text = bytes(text).decode("utf-8", errors="replace")
        return list(self.tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Iterable[int]) -> str:
        return self.tok.decode([int(i) for i in ids])

    def to_dict(self) -> dict:
        return {"type": "transformers", "name": getattr(self.tok, "name_or_path", ""), "vocab_size": self.vocab_size}


TOKENIZER_FILE = "turboquant_tokenizer.json"
_HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def load_tokenizer(path: Optional[str], vocab_size: int):
    """The tokenizer for a checkpoint: ours (``turboquant_tokenizer.json`` beside the weights, or no
    tokenizer files and a vocab of at least 261), else the checkpoint's transformers tokenizer."""
    if path and os.path.exists(os.path.join(path, TOKENIZER_FILE)):
        return ByteTokenizer()
    if path and any(os.path.exists(os.path.join(path, f)) for f in _HF_TOKENIZER_FILES):
        from transformers import AutoTokenizer

        return TextTokenizer(AutoTokenizer.from_pretrained(path))
    if vocab_size >= 261:
        return ByteTokenizer()
    raise ValueError(f"the model at {path!r} has no tokenizer files and a vocabulary of {vocab_size} < 261 "
                     "tokens, too small for turboquant's byte-level tokenizer; give a checkpoint with a tokenizer")


def stdlib_root() -> str:
    """The directory of this interpreter's standard library."""
    return sysconfig.get_paths()["stdlib"]


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _read(root: str, rel: str) -> Optional[bytes]:
    try:
        with open(os.path.join(root, *rel.split("/")), "rb") as f:
            return f.read()
    except OSError:
        return None


def _join(docs: Sequence[bytes], eos: int) -> torch.Tensor:
    """Token ids (int64) of ``docs``, each followed by ``eos``."""
    parts = []
    sep = torch.tensor([eos], dtype=torch.int64)
    for d in docs:
        if d:
            parts.append(torch.frombuffer(bytearray(d), dtype=torch.uint8).to(torch.int64))
            parts.append(sep)
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.int64)


@functools.lru_cache(maxsize=4)
def _heldout(root: str) -> Tuple[Tuple[bytes, ...], str, Tuple[str, ...]]:
    docs, problems = [], []
    h = hashlib.sha256()
    for rel, digest in HELDOUT_FILES:
        data = _read(root, rel)
        if data is None:
            problems.append(f"{rel} (missing)")
            continue
        if _sha(data) != digest:
            problems.append(f"{rel} (content differs)")
        h.update(rel.encode() + b"\0" + data)
        docs.append(data)
    return tuple(docs), h.hexdigest(), tuple(problems)


def heldout_digest(root: Optional[str] = None) -> str:
    """SHA-256 over the held-out files as read here (first 16 hex digits); equal on every machine
    whose stdlib has the pinned files unchanged."""
    return _heldout(root or stdlib_root())[1][:16]


def heldout_tokens(tokenizer=None, root: Optional[str] = None) -> torch.Tensor:
    """The held-out text as one token stream (files in :data:`HELDOUT_FILES` order, EOS-separated).

    With a non-byte ``tokenizer`` (a transformers checkpoint's), each file is encoded with it.
    Warns if a pinned file is missing or differs from its recorded hash.
    """
    docs, _, problems = _heldout(root or stdlib_root())
    if problems:
        warnings.warn(f"turboquant.eval: {len(problems)} held-out stdlib file(s) differ from the pinned list, "
                      f"so results are not comparable across machines: {', '.join(problems[:5])}")
    if not docs:
        raise RuntimeError(f"no held-out stdlib file found under {root or stdlib_root()}")
    tokenizer = tokenizer or ByteTokenizer()
    if isinstance(tokenizer, ByteTokenizer):
        return _join(docs, tokenizer.eos_id)
    ids: List[int] = []
    for d in docs:
        ids.extend(tokenizer.encode(d.decode("utf-8", errors="replace")))
        ids.append(tokenizer.eos_id)
    return torch.tensor(ids, dtype=torch.int64)


def train_files(root: Optional[str] = None) -> List[str]:
    """Relative paths of the training files: every stdlib ``.py`` but the held-out ones, sorted."""
    root = root or stdlib_root()
    held = {rel for rel, _ in HELDOUT_FILES}
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for name in filenames:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(dirpath, name), root).replace(os.sep, "/")
                if rel not in held:
                    out.append(rel)
    return sorted(out)


def train_tokens(root: Optional[str] = None, max_bytes: Optional[int] = None) -> torch.Tensor:
    """The training text as one byte-token stream (files sorted by path, EOS-separated).

    Files whose content equals a held-out file's are left out. ``max_bytes`` stops early
    (smoke tests).
    """
    root = root or stdlib_root()
    held_hashes = {digest for _, digest in HELDOUT_FILES}
    docs, total = [], 0
    for rel in train_files(root):
        data = _read(root, rel)
        if not data or _sha(data) in held_hashes:
            continue
        docs.append(data)
        total += len(data)
        if max_bytes is not None and total >= max_bytes:
            break
    return _join(docs, ByteTokenizer.EOS)


def calibration_windows(tokenizer, windows: int, window: int, root: Optional[str] = None) -> torch.Tensor:
    """``[windows, window]`` token windows of training text (never held-out text) for
    :func:`turboquant.calibrate`: ``[BOS]`` then consecutive tokens, from the start of the
    training stream (deterministic)."""
    tokenizer = tokenizer or ByteTokenizer()
    need = windows * (window - 1)
    stream = train_tokens(root, max_bytes=need + 1)
    if not isinstance(tokenizer, ByteTokenizer):
        text = bytes(t for t in stream.tolist() if t < 256).decode("utf-8", errors="replace")
        stream = torch.tensor(tokenizer.encode(text), dtype=torch.int64)
    if stream.numel() < need:
        raise RuntimeError(f"calibration needs {need} tokens of training text; found {stream.numel()}")
    body = stream[:need].view(windows, window - 1)
    return torch.cat([torch.full((windows, 1), tokenizer.bos_id, dtype=torch.int64), body], 1)
