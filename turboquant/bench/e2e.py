"""``tq bench``: compiled generation with a bf16 cache against turboquant, end to end.

For each prompt length × batch × setting: a Llama-architecture model (random weights; ~1B
parameters by default: 16 layers, 32 query / 8 KV heads, head_dim 128) generates greedily
with transformers' static cache (``--cache dynamic``: its DynamicCache), compiled
(``torch.compile`` for the bf16 baseline, ``turboquant.compile`` for quantized settings). Reported per row:

* ``ttft_ms``: a generate of one token (prefill + first token);
* ``decode_tok_s``: ``batch × (n - 1) / (t(n) - t(1))`` — decode steps only;
* ``peak_gib``: peak device memory of the n-token generate (CUDA);
* ``cache_bytes`` and ``cache_ratio``: bytes the cache holds (codes + metadata) vs the same
  cache in the model's dtype (bf16 on CUDA, fp32 on CPU);
* ``budget_tokens``: tokens (batch × context summed) a ``--budget-gib`` cache holds at this
  setting's bytes per token, and ``budget_vs_bf16``.

Settings are ``tq eval`` spec strings (``affine-4``, ``turbo-3``, ``turbo-3-r16``, …) plus
``bf16``. ``--tiny`` swaps in a 2-layer model for a CPU smoke run.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from typing import List, Optional, Sequence

import torch

from ..eval.configs import parse_config
from ..tq_compile import cache_nbytes

__all__ = ["E2E_ARCH", "TINY_ARCH", "COLUMNS", "build_model", "compiled_setting", "run_bench", "add_arguments",
           "run_from_args"]

E2E_ARCH = dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                num_key_value_heads=8, head_dim=128, vocab_size=32000, max_position_embeddings=40960)
TINY_ARCH = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=4096)
DEFAULT_SETTINGS = ("bf16", "affine-8", "affine-4", "affine-3", "turbo-8", "turbo-4", "turbo-3")
CACHES = ("static", "dynamic")
COLUMNS = ["setting", "cache", "context", "batch", "ttft_ms", "decode_tok_s", "speedup", "peak_gib", "cache_bytes",
           "cache_ratio", "budget_tokens", "budget_vs_bf16"]


def build_model(arch: dict, device, dtype, seed: int = 0):
    """A Llama-architecture causal LM with random weights, built locally."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(**arch)
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype)
    return model.eval()


def compiled_setting(base, setting: str, mode: Optional[str] = None):
    """``bf16``: ``base`` compiled with its dense cache (the baseline); else turboquant's compile of a copy
    with the setting's config (``affine-4``, ``turbo-3`` …)."""
    import turboquant

    from ..demo import compiled_baseline

    if setting == "bf16":
        return compiled_baseline(base, mode)
    cfg = parse_config(setting)
    return turboquant.compile(copy.deepcopy(base), **cfg.kwargs, **({"mode": mode} if mode else {}))


def _prepared(base, setting: str, mode: Optional[str]):
    torch._dynamo.reset()
    return compiled_setting(base, setting, mode)


def run_bench(contexts: Sequence[int] = (1024, 8192, 32768), batches: Sequence[int] = (1, 8),
              settings: Sequence[str] = DEFAULT_SETTINGS, new_tokens: int = 128, budget_gib: float = 40.0,
              device: str = "auto", tiny: bool = False, mode: Optional[str] = None, progress: bool = True,
              seed: int = 0, shapes: Optional[Sequence[tuple]] = None, cache: str = "static") -> List[dict]:
    """``shapes``: ``(batch, context)`` pairs to run instead of every batch × context. ``cache``:
    transformers' ``"static"`` cache or its ``"dynamic"`` one (grown by concatenation)."""
    from ..demo import timed_generate

    if cache not in CACHES:
        raise ValueError(f"cache={cache!r} is not supported; allowed: {', '.join(CACHES)}")
    dev = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device)
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    shapes = list(shapes) if shapes else [(b, c) for c in contexts for b in batches]
    arch = dict(TINY_ARCH if tiny else E2E_ARCH)
    arch["max_position_embeddings"] = max(arch["max_position_embeddings"], max(c for _, c in shapes) + new_tokens)
    for name in settings:
        if name != "bf16":
            parse_config(name)  # bad names fail before anything is built
    base = build_model(arch, dev, dtype, seed)
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        tqdm = None
    runs = [(c, b, s) for b, c in shapes for s in settings]
    bar = tqdm(total=len(runs), desc="tq bench", unit="run", disable=not progress, file=sys.stderr) if tqdm else None
    rows, baseline = [], {}
    gen = torch.Generator().manual_seed(seed)
    for batch, context in shapes:
        ids = torch.randint(0, arch["vocab_size"], (batch, context), generator=gen).to(dev)
        for setting in settings:
            if bar is not None:
                bar.set_description(f"tq bench {setting} {batch}x{context}")
            model = _prepared(base, setting, mode)
            kw = dict(cache_implementation="static") if cache == "static" else {}
            # generate keeps its static cache while a later call fits in it: the long call
            # first compiles the prefill and decode graphs that both timed lengths then run
            # (each prefill of 8 x 32K costs seconds: no more warm-up than that); a dynamic
            # cache's graphs are compiled by the same call, for every length it reaches
            timed_generate(model, ids, new_tokens, **kw)
            if mode == "reduce-overhead":  # CUDA-graph trees run a step eagerly, then record, then replay
                timed_generate(model, ids, new_tokens, **kw)
                timed_generate(model, ids, 1, **kw)
            _, _, t1 = timed_generate(model, ids, 1, **kw)
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            _, held_cache, tn = timed_generate(model, ids, new_tokens, **kw)
            peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")
            nb = cache_nbytes(held_cache, with_dense=True)
            held, dense = nb["quantized"], nb["dense"]
            per_token = held / (batch * (context + new_tokens))
            row = {"setting": setting, "cache": cache, "context": context, "batch": batch, "ttft_ms": 1e3 * t1,
                   "decode_tok_s": batch * (new_tokens - 1) / max(tn - t1, 1e-9), "peak_gib": peak,
                   "cache_bytes": held, "cache_ratio": held / dense,
                   "budget_tokens": int(budget_gib * 2**30 / per_token)}
            if setting == "bf16":
                baseline[(context, batch)] = row
            ref = baseline.get((context, batch))
            row["speedup"] = row["decode_tok_s"] / ref["decode_tok_s"] if ref else float("nan")
            row["budget_vs_bf16"] = row["budget_tokens"] / ref["budget_tokens"] if ref else float("nan")
            rows.append(row)
            # at once, on stderr: a run cut short keeps what it measured
            print(f"tq bench row: {setting} context {context} batch {batch}: ttft {row['ttft_ms']:.2f} ms, "
                  f"decode {row['decode_tok_s']:.1f} tok/s (x{row['speedup']:.3f}), cache {held:,} B "
                  f"({row['cache_ratio']:.4f}), peak {peak:.2f} GiB", file=sys.stderr, flush=True)
            del model, held_cache
            if bar is not None:
                bar.update(1)
    if bar is not None:
        bar.close()
    return rows


def plot(rows: Sequence[dict], folder: str) -> List[str]:
    """PNGs: decode tokens/s vs context and cache memory vs context (one line per setting and batch)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    contexts = sorted({r["context"] for r in rows})  # ticks at the measured lengths, named as run (1K, 32K)
    tick_labels = [f"{c // 1024}K" if c % 1024 == 0 else str(c) for c in contexts]
    paths = []
    for key, ylabel, name, logy in (("decode_tok_s", "decode tokens/s", "tokens_per_s.png", False),
                                    ("cache_bytes", "cache bytes", "cache_bytes.png", True)):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for setting in dict.fromkeys(r["setting"] for r in rows):
            for batch in sorted({r["batch"] for r in rows}):
                pts = sorted((r["context"], r[key]) for r in rows if r["setting"] == setting and r["batch"] == batch)
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{setting}, batch {batch}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(contexts, tick_labels)
        ax.minorticks_off()
        if logy:
            ax.set_yscale("log")
        ax.set_xlabel("prompt length (tokens)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, name)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        paths.append(path)
    return paths


def add_arguments(p: argparse.ArgumentParser, out_default: str = "tq_bench"):
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 8192, 32768], help="prompt lengths")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--shapes", nargs="+", default=None, metavar="BATCHxCONTEXT",
                   help="run these batch x context pairs only (e.g. 1x1024 8x32768) instead of every combination")
    p.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS),
                   help="bf16 and tq eval spec strings, e.g. affine-4 turbo-3 turbo-3-r16")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--budget-gib", type=float, default=40.0, help="cache budget for the tokens-that-fit column")
    p.add_argument("--device", default="auto")
    p.add_argument("--mode", default="default", choices=["default", "reduce-overhead", "max-autotune"],
                   help="torch.compile mode for every setting (reduce-overhead: CUDA graphs)")
    p.add_argument("--cache", default="static", choices=list(CACHES),
                   help="transformers' cache: static (preallocated) or dynamic (grown by concatenation)")
    p.add_argument("--tiny", action="store_true", help="a 2-layer model (CPU smoke run)")
    p.add_argument("--out", default=out_default, help="folder for e2e_generate.csv and the PNGs ('' for none)")
    p.add_argument("--no-progress", action="store_true")
    return p


def _shape(text: str) -> tuple:
    """``"8x32768"`` → ``(8, 32768)`` (batch, context)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise SystemExit(f"--shapes takes BATCHxCONTEXT pairs such as 8x32768, got {text!r}")
    return int(parts[0]), int(parts[1])


def run_from_args(args) -> int:
    from ..reporting import environment, format_table, write_csv

    shapes = [_shape(s) for s in args.shapes] if args.shapes else None
    rows = run_bench(args.contexts, args.batches, args.settings, args.new_tokens, args.budget_gib, args.device,
                     args.tiny, None if args.mode == "default" else args.mode, not args.no_progress,
                     shapes=shapes, cache=args.cache)
    env = environment()
    print(f"End-to-end greedy generation, {args.new_tokens} new tokens, {args.cache} cache, compiled "
          f"({'tiny' if args.tiny else '~1B'} Llama, random weights; {env.get('device', '')}); speedup and "
          f"budget_vs_bf16 against bf16 in the same run; budget {args.budget_gib:g} GiB.")
    print(format_table(rows, COLUMNS))
    if args.out:
        print(f"wrote {write_csv(rows, os.path.join(args.out, 'e2e_generate.csv'), COLUMNS)}")
        paths = plot(rows, args.out)
        print("wrote " + ", ".join(paths) if paths else "matplotlib is not installed: no PNG")
    return 0
