"""Synthetic long-context retrieval ("needle in a haystack") samples.

One sample of ``length`` tokens::

    BOS  filler … KEY "qzvb:418093\\n" filler … KEY "mhol:772610\\n" filler …  QUERY "qzvb:"  | "418093"
         '-------------------------------- prompt ------------------------------------------'   '-answer-'

* filler: a contiguous slice of a token stream (held-out stdlib text for evaluation, training
  text for training), from a seeded random offset;
* the target "key:value" line is planted early (by default at 5–25 % of the context), ``n_distractors``
  other lines with different keys anywhere in the first 90 %; keys are 4 lowercase letters,
  values 6 digits;
* at the end, the query marker and the target key ask for the value.

Accuracy is exact match of the greedy continuation with the value. Teacher-forced scoring
(:func:`answer_is_argmax`: every answer token is the argmax given the correct prefix) is the
same criterion as greedy decoding — greedy produces the value iff each of its tokens is the
argmax after the previous ones — and needs one forward pass instead of ``len(answer)``.

With :class:`~turboquant.eval.corpus.ByteTokenizer` the markers are the special ids KEY and QUERY;
a transformers tokenizer (:class:`~turboquant.eval.corpus.TextTokenizer`) uses short text markers.
Everything is a pure function of (stream, length, seed, index): samples are reproducible.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass
from typing import List, Sequence, Tuple

import torch

__all__ = ["NeedleSample", "make_needle_sample", "needle_set", "answer_is_argmax", "stack"]


@dataclass(frozen=True)
class NeedleSample:
    prompt: torch.Tensor        # int64 [length - len(answer)]: BOS … QUERY key ':'
    answer: torch.Tensor        # int64 [len(answer)]: the value's tokens
    key: str
    value: str
    position: int               # index in ``prompt`` of the target line's first marker token

    @property
    def ids(self) -> torch.Tensor:
        """Prompt and answer: the whole sample, ``length`` tokens (for teacher forcing)."""
        return torch.cat([self.prompt, self.answer])


def _rand_key(rng: random.Random, used: set, n: int = 4) -> str:
    while True:
        k = "".join(rng.choice(string.ascii_lowercase) for _ in range(n))
        if k not in used:
            used.add(k)
            return k


def make_needle_sample(stream: torch.Tensor, length: int, tokenizer, rng: random.Random, *,
                       n_distractors: int = 2, depth: Tuple[float, float] = (0.05, 0.25),
                       key_len: int = 4, value_len: int = 6) -> NeedleSample:
    """One sample of exactly ``length`` tokens; randomness from ``rng`` only (see module doc)."""
    used: set = set()
    key = _rand_key(rng, used, key_len)
    value = "".join(rng.choice(string.digits) for _ in range(value_len))
    lines = [(key, value)] + [(_rand_key(rng, used, key_len), "".join(rng.choice(string.digits)
                                                                       for _ in range(value_len)))
                              for _ in range(n_distractors)]
    enc = [torch.tensor(tokenizer.key_marker + tokenizer.encode(f"{k}:{v}\n"), dtype=torch.int64) for k, v in lines]
    query = torch.tensor(tokenizer.query_marker + tokenizer.encode(f"{key}:"), dtype=torch.int64)
    answer = torch.tensor(tokenizer.encode(value), dtype=torch.int64)
    body = length - 1 - len(query) - len(answer)         # BOS + body + query + answer = length
    n_filler = body - sum(len(e) for e in enc)
    if n_filler < 8:
        raise ValueError(f"length={length} is too short for a needle sample with {n_distractors} distractor(s)")
    if len(stream) <= n_filler:
        raise ValueError(f"the filler stream ({len(stream)} tokens) is shorter than one sample's filler ({n_filler})")
    start = rng.randrange(0, len(stream) - n_filler)
    filler = stream[start:start + n_filler].to(torch.int64)
    # insertion points in the filler: the target early, distractors anywhere in the first 90 %
    cuts = [int(n_filler * rng.uniform(*depth))] + [int(n_filler * rng.uniform(0.0, 0.9)) for _ in range(n_distractors)]
    order = sorted(range(len(enc)), key=lambda i: (cuts[i], i))
    pieces: List[torch.Tensor] = [torch.tensor([tokenizer.bos_id], dtype=torch.int64)]
    prev, position = 0, -1
    for i in order:
        pieces.append(filler[prev:cuts[i]])
        if i == 0:
            position = sum(len(p) for p in pieces)
        pieces.append(enc[i])
        prev = cuts[i]
    pieces += [filler[prev:], query]
    prompt = torch.cat(pieces)
    assert len(prompt) + len(answer) == length
    return NeedleSample(prompt=prompt, answer=answer, key=key, value=value, position=position)


def needle_set(stream: torch.Tensor, length: int, n: int, tokenizer, seed: int = 0, **kw) -> List[NeedleSample]:
    """``n`` samples of ``length`` tokens, a pure function of (stream, length, n, seed, kw)."""
    rng = random.Random(seed * 1_000_003 + length)
    return [make_needle_sample(stream, length, tokenizer, rng, **kw) for _ in range(n)]


def answer_is_argmax(logits: torch.Tensor, prompt_len: int, answer: torch.Tensor) -> torch.Tensor:
    """Rows of ``logits [B, prompt_len + A, V]`` (teacher-forced over prompt + answer) whose greedy
    continuation of the prompt is exactly ``answer [B, A]``: bool ``[B]``."""
    a = answer.shape[-1]
    pred = logits[:, prompt_len - 1:prompt_len - 1 + a].argmax(-1)
    return (pred == answer.to(pred.device)).all(-1)


def stack(samples: Sequence[NeedleSample], with_answer: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(ids [B, L], answers [B, A])``: prompts (or whole samples) of equal length, batched."""
    ids = torch.stack([s.ids if with_answer else s.prompt for s in samples])
    return ids, torch.stack([s.answer for s in samples])
