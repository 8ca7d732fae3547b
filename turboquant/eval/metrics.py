"""Fidelity metrics of a quantized KV cache against the same model with its dense cache.

Teacher-forced over held-out windows (``[BOS] + window - 1`` tokens of held-out text):

* perplexity ``exp(mean NLL)`` of the next token, and its change in % against the unquantized model;
* mean ``KL(P_unquantized || P_quantized)`` of the next-token distributions (nats per token);
* top-1 agreement: how often both distributions have the same argmax.

Needle retrieval (:mod:`turboquant.eval.needle`): exact match of the greedy continuation.

**What a forward over a quantized cache measures.** :class:`Runner` calls the model with a fresh
transformers ``DynamicCache`` per window. With turboquant, the cache's layers hold
:class:`~turboquant.cache.QuantizedCacheTensor` from the start, the layer's ``torch.cat`` writes
quantized rows *before* attention runs, and ``scaled_dot_product_attention`` reads the cache it
was handed — so every query of a prefill chunk, including the chunk's own tokens, attends to
quantized K and V. One forward over the whole window therefore already measures the quantized
cache at every position; splitting the window into a prefill chunk plus continuation chunks
(``chunk=N``) gives the same logits (tested in tests/test_eval.py; checked bit-identical with
``turboquant.compile`` on CPU) and only adds calls. The first tokens of a window see few keys,
so their error is small; later tokens read more quantized keys.

**Residual window** (``-rN``): the cache keeps the N most recently *written* positions in full
precision. A decode step's query then reads its N nearest positions exactly — but a one-forward
prefill over a whole window writes all its positions first, so only the last N are dense for
every query. ``chunk=1`` (each token predicted by a decode step over the cache, as in
generation) measures what generation sees; it gives every configuration without a window the
same logits as one forward, so a table run with ``chunk=1`` compares all rows on one protocol.

Backends (``Runner(backend=…)``):

* ``"compile"`` (default): ``turboquant.compile(copy.deepcopy(model), **options)`` — the product path
  (CPU: Inductor C++; CUDA: Triton decode kernel for decode shapes). Each configuration compiles
  afresh (``torch._dynamo.reset()``), which dominates the run time on CPU.
* ``"eager"``: the same quantized cache storage and ``turboquant::attention`` op, model run eagerly
  (no torch.compile). Seconds instead of minutes on CPU; numerics differ from compiled ones by the
  fp16 rounding of scales that Inductor may skip (docs/design.md), far below the quantization error.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

import torch
import torch.nn.functional as F

from ..integrations import transformers as hf
from .configs import EvalConfig
from .needle import NeedleSample, answer_is_argmax, stack

__all__ = ["Runner", "heldout_windows", "Reference", "TokenStats", "evaluate_windows", "needle_accuracy", "BACKENDS"]

BACKENDS = ("compile", "eager")


class Runner:
    """Calls a transformers causal LM with a fresh KV cache per call: dense, or quantized as ``config`` says."""

    def __init__(self, base, config: EvalConfig, backend: str = "compile", frames=None):
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not supported; allowed: {', '.join(BACKENDS)}")
        self.config, self.backend = config, backend
        self.kv = config.kv_config(frames)
        self.cache_arg = hf.cache_kwarg(base.forward)
        if self.kv is not None and backend == "compile":
            import turboquant

            torch._dynamo.reset()  # every configuration compiles the same forward code afresh
            self.model = turboquant.compile(copy.deepcopy(base), **config.compile_kwargs(frames))
        else:
            self.model = base
        self.last_cache = None

    def new_cache(self, batch: int):
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        if self.kv is not None and self.backend == "eager":
            n = len(cache.layers)
            hf.quantize_cache(cache, lambda i: self.kv.for_layer(i, n))
            hf.initialize_cache(cache, self.model, batch)
        return cache

    def _call(self, ids: torch.Tensor, cache) -> torch.Tensor:
        return self.model(input_ids=ids, use_cache=True, **{self.cache_arg: cache}).logits

    @torch.no_grad()
    def logits(self, ids: torch.Tensor, chunk: int = 0) -> torch.Tensor:
        """Logits ``[B, L, V]`` of ``ids [B, L]`` from an empty cache; ``chunk > 0`` feeds it in chunks."""
        cache = self.new_cache(ids.shape[0])
        if chunk <= 0 or chunk >= ids.shape[1]:
            out = self._call(ids, cache)
        else:
            out = torch.cat([self._call(ids[:, s:s + chunk], cache) for s in range(0, ids.shape[1], chunk)], 1)
        self.last_cache = cache
        return out

    @torch.no_grad()
    def greedy(self, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
        """Greedy continuation ``[B, new_tokens]`` of ``prompt [B, L]``: one prefill, then one-token decode steps."""
        cache = self.new_cache(prompt.shape[0])
        nxt = self._call(prompt, cache)[:, -1].argmax(-1, keepdim=True)
        out = [nxt]
        for _ in range(new_tokens - 1):
            nxt = self._call(nxt, cache)[:, -1].argmax(-1, keepdim=True)
            out.append(nxt)
        self.last_cache = cache
        return torch.cat(out, 1)

    def bits_per_element(self) -> float:
        """Bits the last call's cache holds per K/V element, metadata included (16/32 when dense)."""
        if self.last_cache is None:
            return float("nan")
        from ..tq_compile import cache_nbytes

        nb = cache_nbytes(self.last_cache, with_dense=True)
        return nb["quantized"] * 8 / nb["elements"] if nb["elements"] else float("nan")


def heldout_windows(stream: torch.Tensor, window: int, max_windows: int, bos: int) -> torch.Tensor:
    """``[N, window]`` windows ``[BOS] + window - 1`` consecutive tokens, non-overlapping; with
    ``max_windows > 0`` that many, evenly spaced over the stream (deterministic)."""
    step = window - 1
    total = (len(stream)) // step
    if total == 0:
        raise ValueError(f"the held-out stream ({len(stream)} tokens) is shorter than one window ({window})")
    idx = range(total) if max_windows <= 0 or max_windows >= total else \
        sorted({int(i * total / max_windows) for i in range(max_windows)})
    rows = [torch.cat([torch.tensor([bos]), stream[i * step:(i + 1) * step]]) for i in idx]
    return torch.stack(rows).to(torch.int64)


def _batches(n: int, size: int) -> List[range]:
    return [range(s, min(n, s + size)) for s in range(0, n, size)]


class Reference:
    """The unquantized model's log-probabilities per batch of windows, computed once and kept on
    the CPU when they fit in ``max_bytes`` (else recomputed per configuration)."""

    def __init__(self, runner: Runner, windows: torch.Tensor, batch_size: int, device, max_bytes: float = 4e9):
        self.runner, self.windows, self.device = runner, windows, device
        self.batches = _batches(len(windows), batch_size)
        vocab = runner.model.config.get_text_config().vocab_size
        self.keep = windows.numel() * vocab * 4 <= max_bytes
        self._store: dict = {}

    def __len__(self):
        return len(self.batches)

    def get(self, i: int) -> torch.Tensor:
        """Log-probabilities ``[b, L - 1, V]`` (float32, on ``device``) of batch ``i``."""
        if i in self._store:
            return self._store[i].to(self.device)
        ids = self.windows[list(self.batches[i])].to(self.device)
        lp = F.log_softmax(self.runner.logits(ids).float(), -1)[:, :-1]
        if self.keep:
            self._store[i] = lp.cpu()
        return lp


@dataclass
class TokenStats:
    nll: float = 0.0
    kl: float = 0.0
    agree: float = 0.0
    n: int = 0

    def add(self, logits: torch.Tensor, ref_logp: torch.Tensor, targets: torch.Tensor) -> None:
        lq = F.log_softmax(logits.float()[:, :-1], -1)
        self.nll += float(-lq.gather(-1, targets[..., None]).sum())
        self.kl += float((ref_logp.exp() * (ref_logp - lq)).sum(-1).clamp_min(0).sum())
        self.agree += float((ref_logp.argmax(-1) == lq.argmax(-1)).sum())
        self.n += targets.numel()

    def add_self(self, ref_logp: torch.Tensor, targets: torch.Tensor) -> None:
        self.nll += float(-ref_logp.gather(-1, targets[..., None]).sum())
        self.agree += targets.numel()
        self.n += targets.numel()

    def result(self) -> dict:
        n = max(self.n, 1)
        nll = self.nll / n
        return {"ppl": math.exp(nll), "nll": nll, "kl": self.kl / n, "top1_agree": self.agree / n,
                "tokens": self.n}


def evaluate_windows(runner: Runner, reference: Reference, chunk: int = 0,
                     tick: Optional[Callable[[], None]] = None) -> dict:
    """Perplexity, KL against ``reference`` and top-1 agreement over its windows."""
    stats = TokenStats()
    for i, b in enumerate(reference.batches):
        ids = reference.windows[list(b)].to(reference.device)
        ref = reference.get(i)
        if runner is reference.runner and chunk <= 0:  # the reference itself: KL 0, agreement 1
            stats.add_self(ref, ids[:, 1:])
        else:
            stats.add(runner.logits(ids, chunk=chunk), ref, ids[:, 1:])
        if tick:
            tick()
    return stats.result()


def needle_accuracy(runner: Runner, samples: Sequence[NeedleSample], batch_size: int, device, mode: str = "generate",
                    tick: Optional[Callable[[], None]] = None) -> float:
    """Fraction of ``samples`` whose greedy continuation is exactly the value.

    ``mode="generate"``: prefill the prompt and decode ``len(answer)`` tokens one by one (exercises
    the decode path); ``"forced"``: one teacher-forced forward, every answer token the argmax —
    the same criterion (see :mod:`turboquant.eval.needle`), cheaper.
    """
    if mode not in ("generate", "forced"):
        raise ValueError(f"mode={mode!r} is not supported; allowed: 'generate', 'forced'")
    if not samples:
        return float("nan")
    correct = 0
    for b in _batches(len(samples), batch_size):
        part = [samples[i] for i in b]
        ids, answers = stack(part, with_answer=mode == "forced")
        ids, answers = ids.to(device), answers.to(device)
        if mode == "forced":
            ok = answer_is_argmax(runner.logits(ids), len(part[0].prompt), answers)
        else:
            ok = (runner.greedy(ids, answers.shape[1]) == answers).all(-1)
        correct += int(ok.sum())
        if tick:
            tick()
    return correct / len(samples)
