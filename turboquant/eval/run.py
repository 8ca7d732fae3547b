"""``tq eval``: fidelity of quantized KV caches on held-out text, one row per configuration.

    tq eval                                        # the reference model, every default configuration
    tq eval --model PATH --configs affine-8 turbo-3 affine-k8v4 --contexts 1024 2048 4096
    tq eval --backend eager --needle-mode forced   # quick CPU run (no torch.compile)

Rows: the unquantized model first, then each configuration: perplexity on held-out stdlib
text and its change in %, mean KL(unquantized || quantized) of the next-token distributions,
top-1 agreement, needle retrieval accuracy per context length, and the bits per K/V element
the cache actually held (metadata included). Table on stdout, CSV (with the environment), and a
PNG of perplexity change against bits per element, one line per method (needs matplotlib;
skipped with a note without it). Metric definitions: :mod:`turboquant.eval.metrics`.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import sys
import time
import warnings
from typing import Callable, List, Optional, Sequence

import torch

from .configs import DEFAULT_CONFIGS, EvalConfig, parse_configs
from .corpus import calibration_windows, heldout_digest, heldout_tokens, load_tokenizer
from .metrics import BACKENDS, Reference, Runner, evaluate_windows, heldout_windows, needle_accuracy
from .needle import needle_set

__all__ = ["REFERENCE_MODEL", "ModelNotFound", "resolve_model_path", "load_model", "run_eval", "columns",
           "plot_ppl_vs_bits", "add_arguments", "run_from_args", "TRAIN_COMMAND"]

REFERENCE_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_model")
TRAIN_COMMAND = "python scripts/train_reference.py --device cuda"


class ModelNotFound(FileNotFoundError):
    pass


def resolve_model_path(path: Optional[str] = None) -> str:
    """``path``, or the reference model's folder; raises :class:`ModelNotFound` saying how to get one."""
    if path:
        if not os.path.isdir(path) or not os.path.exists(os.path.join(path, "config.json")):
            raise ModelNotFound(f"no transformers checkpoint (config.json) at {path!r}")
        return path
    if not os.path.exists(os.path.join(REFERENCE_MODEL, "config.json")):
        raise ModelNotFound(
            f"the reference model is not there yet ({REFERENCE_MODEL} has no config.json). Train it with "
            f"`{TRAIN_COMMAND}` (about 10 minutes on one GPU; `--device cpu --tiny` makes a small smoke-test "
            f"model in seconds), or pass --model PATH for a local transformers checkpoint.")
    return REFERENCE_MODEL


def _device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if dtype not in names:
        raise ValueError(f"dtype={dtype!r} is not supported; allowed: auto, {', '.join(names)}")
    return names[dtype]


def load_model(path: str, device: torch.device, dtype: torch.dtype):
    """A transformers causal LM from ``path`` on ``device`` in ``dtype``, in eval mode."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


def columns(contexts: Sequence[int]) -> List[str]:
    return (["config", "method", "k_bits", "v_bits", "bits_per_element", "ppl", "ppl_change_pct", "kl",
             "top1_agree"] + [f"needle_{c}" for c in contexts] + ["seconds"])


def _progress(total: int, enabled: bool):
    try:
        from tqdm.auto import tqdm
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return None
    return tqdm(total=total, desc="tq eval", unit="batch", disable=not enabled, file=sys.stderr)


class _Calibrations:
    """Frames (:func:`turboquant.calibrate`) of one model per number of training-text windows, measured once."""

    def __init__(self, model, tokenizer, window: int):
        self.model, self.tokenizer, self.window, self.done = model, tokenizer, window, {}

    def get(self, cfg: EvalConfig):
        """The frames ``cfg`` asks for (``-fN``/``-fNd``), or None."""
        key = (cfg.calibration_windows, cfg.key_map)
        if not key[0]:
            return None
        if key not in self.done:
            from ..calibration import calibrate

            ids = calibration_windows(self.tokenizer, key[0], self.window)
            self.done[key] = calibrate(self.model, ids, key_map=key[1])
        return self.done[key]


def run_eval(model_path: Optional[str] = None, configs: Sequence[str] = DEFAULT_CONFIGS,
             contexts: Sequence[int] = (1024, 2048, 4096), needles: int = 32, max_windows: int = 64,
             window: int = 1024, batch_size: int = 4, device: str = "auto", dtype: str = "auto",
             backend: str = "compile", needle_mode: str = "generate", chunk: int = 0, seed: int = 0,
             progress: bool = True, model=None, on_row: Optional[Callable[[dict], None]] = None) -> dict:
    """Evaluate ``configs`` on one model; returns ``{"rows", "columns", "meta"}``.

    ``model``: an already loaded transformers model (then ``model_path`` only names it and picks
    its tokenizer). The first row is always the unquantized model (``"none"``). ``on_row`` sees
    each row as soon as it is measured (a run cut short keeps what it printed).
    """
    cfgs: List[EvalConfig] = parse_configs(["none", *configs])
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed: {', '.join(BACKENDS)}")
    dev = _device(device)
    if model is None:
        model_path = resolve_model_path(model_path)
        model = load_model(model_path, dev, _dtype(dtype, dev))
    dev = model.device
    text_cfg = model.config.get_text_config()
    tok = load_tokenizer(model_path, text_cfg.vocab_size)
    stream = heldout_tokens(tok)
    windows = heldout_windows(stream, window, max_windows, tok.bos_id)
    max_pos = getattr(text_cfg, "max_position_embeddings", None) or 1 << 30
    ctxs = []
    for c in contexts:
        if c > max_pos:
            warnings.warn(f"needle context {c} exceeds the model's max_position_embeddings={max_pos}; skipped")
        else:
            ctxs.append(c)
    sets = {c: needle_set(stream, c, needles, tok, seed=seed) for c in ctxs} if needles > 0 else {}
    n_needle_batches = sum(math.ceil(len(s) / batch_size) for s in sets.values())
    n_win_batches = math.ceil(len(windows) / batch_size)
    bar = _progress(len(cfgs) * (n_win_batches + n_needle_batches), progress)
    tick = (lambda: bar.update(1)) if bar is not None else None

    frames = _Calibrations(model, tok, window)
    ref_runner = Runner(model, cfgs[0], backend)
    reference = Reference(ref_runner, windows, batch_size, dev)
    rows = []
    base_ppl = None
    try:
        for cfg in cfgs:
            if bar is not None:
                bar.set_description(f"tq eval {cfg.name}")
            t0 = time.perf_counter()
            runner = ref_runner if not cfg.quantized else Runner(model, cfg, backend,
                                                                 frames=frames.get(cfg))
            m = evaluate_windows(runner, reference, chunk=chunk, tick=tick)
            bpe = runner.bits_per_element()
            acc = {f"needle_{c}": needle_accuracy(runner, s, batch_size, dev, mode=needle_mode, tick=tick)
                   for c, s in sets.items()}
            if base_ppl is None:
                base_ppl = m["ppl"]
            k_bits, v_bits = cfg.bits
            rows.append({"config": cfg.name, "method": cfg.method, "k_bits": k_bits or "-", "v_bits": v_bits or "-",
                         "bits_per_element": bpe, "ppl": m["ppl"], "ppl_change_pct": 100.0 * (m["ppl"] / base_ppl - 1),
                         "kl": m["kl"], "top1_agree": m["top1_agree"], **acc,
                         "seconds": time.perf_counter() - t0})
            if on_row is not None:
                on_row(rows[-1])
            if runner is not ref_runner:
                del runner
    finally:
        if bar is not None:
            bar.close()
    meta = {"model": model_path or "(in memory)", "params": sum(p.numel() for p in model.parameters()),
            "dtype": str(model.dtype).replace("torch.", ""), "device": str(dev), "backend": backend,
            "needle_mode": needle_mode, "windows": len(windows), "window": window,
            "tokens": len(windows) * (window - 1), "needles_per_context": needles,
            "contexts": list(ctxs), "tokenizer": tok.name, "heldout_digest": heldout_digest(), "seed": seed}
    return {"rows": rows, "columns": columns(ctxs), "meta": meta}


def plot_ppl_vs_bits(rows: Sequence[dict], path: str, title: str = "") -> Optional[str]:
    """PNG: perplexity change (%) against bits per K/V element, one line per method.

    Returns the path, or ``None`` when matplotlib is not installed (it is optional)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    methods = sorted({r["method"] for r in rows if r["method"] != "none"})
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        plain = re.compile(rf"^{method}-\d+$")  # the method at one width, no other option: the line
        same = sorted((r["bits_per_element"], r["ppl_change_pct"]) for r in mine if plain.match(r["config"]))
        other = [(r["bits_per_element"], r["ppl_change_pct"]) for r in mine if not plain.match(r["config"])]
        line, = ax.plot([p[0] for p in same], [p[1] for p in same], marker="o", label=method)
        if other:  # K/V widths differ, protected layers, residual window: same colour, open markers
            ax.plot([p[0] for p in other], [p[1] for p in other], ls="none", marker="s", mfc="none",
                    color=line.get_color(), label=f"{method} with options (kKvV, -p, -r)")
        for r in mine:
            ax.annotate(r["config"], (r["bits_per_element"], r["ppl_change_pct"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.axhline(0.0, color="gray", lw=0.8, ls="--", label="unquantized")
    ax.set_xlabel("bits per K/V element (codes + metadata)")
    ax.set_ylabel("perplexity change (%)")
    ys = [r["ppl_change_pct"] for r in rows if r["method"] != "none" and r["ppl_change_pct"] > 0]
    if ys and max(ys) / max(min(ys), 1e-3) > 100:
        ax.set_yscale("symlog", linthresh=1.0)
    ax.set_title(title or "KV-cache quantization: perplexity change vs bits")
    ax.grid(alpha=0.3)
    ax.legend()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def add_arguments(p: argparse.ArgumentParser, csv_default: str = "tq_eval.csv", png_default: str = "tq_eval.png"):
    p.add_argument("--model", default=None,
                   help=f"a local transformers checkpoint (default: the reference model in {REFERENCE_MODEL})")
    p.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS),
                   help="configurations: METHOD-BITS or METHOD-kKvV plus options, e.g. affine-8 turbo-3 affine-k8v4 "
                        "affine-4-g32 (turboquant/eval/configs.py)")
    p.add_argument("--contexts", type=int, nargs="*", default=[1024, 2048, 4096],
                   help="needle context lengths in tokens (none: skip the needle test)")
    p.add_argument("--needles", type=int, default=32, help="needle samples per context length")
    p.add_argument("--max-windows", type=int, default=64, help="held-out windows (0: all of them)")
    p.add_argument("--window", type=int, default=1024, help="tokens per held-out window")
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1, …")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU), float32, bfloat16, float16")
    p.add_argument("--backend", default="compile", choices=BACKENDS,
                   help="compile: turboquant.compile (the product path); eager: same quantized cache, no compile")
    p.add_argument("--needle-mode", default="generate", choices=["generate", "forced"],
                   help="generate: prefill + greedy decode steps; forced: one teacher-forced pass (same criterion)")
    p.add_argument("--chunk", type=int, default=0, help="feed held-out windows in chunks of this many tokens")
    p.add_argument("--seed", type=int, default=0, help="seed of the needle samples")
    p.add_argument("--csv", default=csv_default, help="CSV output ('' for none)")
    p.add_argument("--png", default=png_default, help="PNG output ('' for none; needs matplotlib)")
    p.add_argument("--no-progress", action="store_true")
    return p


def _print_row(row: dict) -> None:
    """One measured row on stderr at once, so a run that is cut short still shows its rows."""
    needles = " ".join(f"{k}={v:.3f}" for k, v in row.items() if k.startswith("needle_"))
    print(f"tq eval row: {row['config']} bits/el {row['bits_per_element']:.3f} ppl {row['ppl']:.4f} "
          f"({row['ppl_change_pct']:+.3f}%) kl {row['kl']:.3g} top1 {row['top1_agree']:.4f} {needles} "
          f"[{row['seconds']:.1f} s]", file=sys.stderr, flush=True)


def run_from_args(args, argv: Optional[Sequence[str]] = None) -> int:
    from ..reporting import format_table, write_csv

    try:
        res = run_eval(args.model, configs=args.configs, contexts=args.contexts, needles=args.needles,
                       max_windows=args.max_windows, window=args.window, batch_size=args.batch_size,
                       device=args.device, dtype=args.dtype, backend=args.backend, needle_mode=args.needle_mode,
                       chunk=args.chunk, seed=args.seed, progress=not args.no_progress, on_row=_print_row)
    except ModelNotFound as e:
        print(f"tq eval: {e}", file=sys.stderr)
        return 2
    meta, rows = res["meta"], res["rows"]
    print(f"KV-cache fidelity on held-out stdlib text ({meta['windows']} windows x {meta['window']} tokens, "
          f"held-out {meta['heldout_digest']}); needles: {meta['needles_per_context']} per context, "
          f"{meta['needle_mode']}; model {meta['model']} ({meta['params']:,} params, {meta['dtype']}, "
          f"{meta['device']}, backend {meta['backend']}). kl: mean KL(unquantized || quantized), nats/token.")
    print(format_table(rows, res["columns"]))
    if args.csv:
        cmd = "tq " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
        extra = [{**r, "model": meta["model"], "heldout_digest": meta["heldout_digest"], "backend": meta["backend"],
                  "needle_mode": meta["needle_mode"], "windows": meta["windows"], "window": meta["window"],
                  "model_dtype": meta["dtype"], "command": cmd} for r in rows]
        cols = res["columns"] + ["model", "model_dtype", "backend", "needle_mode", "windows", "window",
                                 "heldout_digest", "command"]
        print(f"wrote {write_csv(extra, args.csv, cols)}")
    if args.png:
        path = plot_ppl_vs_bits(rows, args.png, title=f"{os.path.basename(os.path.normpath(meta['model']))}: "
                                                      "perplexity change vs bits per element")
        print(f"wrote {path}" if path else "matplotlib is not installed: no PNG (pip install matplotlib)")
    return 0
