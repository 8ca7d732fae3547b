"""Train the reference model: a small Llama-architecture LM on the Python stdlib plus a needle task.

    python scripts/train_reference.py --device cuda                 # ≈ 9 min on one H200, 9.35 M params
    python scripts/train_reference.py --device cpu --tiny --steps 20 --out /tmp/tiny   # smoke test, seconds

Model: transformers ``LlamaForCausalLM`` (GQA 8 query / 2 KV heads, head_dim 64, RoPE θ = 10000,
6 layers, hidden 384, MLP 896, vocab 264 byte-level tokens, 4096 positions), saved in bfloat16
as safetensors shards of ≤ 10 MB (≈ 19 MB in all) beside ``turboquant_tokenizer.json``
and ``training_summary.json``.

Data (:mod:`turboquant.eval.corpus`, :mod:`turboquant.eval.needle`): each row of a batch is
either ``[BOS]`` + a random window of the training text, or (``--needle-frac``) a needle sample
whose filler is training text: the target "key:value" line anywhere in the first 90 % of the
row, 0–3 distractor lines, the query at the end. Loss: next-token cross entropy over all tokens
plus ``--answer-weight`` × the cross entropy of the answer tokens. Sequence-length curriculum:
512 → 1024 → 2048 → 4096 tokens (constant tokens per step).

Schedule: AdamW (β = 0.9, 0.95, weight decay 0.1 on matrices), linear warm-up, cosine decay to
10 %. With ``--steps N`` the schedule follows steps — the same command gives the same data and
schedule (GPU kernels may still differ in the last bits); without it, it follows wall time within
``--minutes``, and the summary records the step count so that ``--steps`` reproduces the run.
``--minutes`` always stops the run. bf16 autocast on CUDA.

At the end: held-out perplexity and needle accuracy of the *saved* model, computed with the
``tq eval`` code (:func:`turboquant.eval.run.run_eval`, unquantized row, forced needle scoring).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import shlex
import sys
import tempfile
import time
from typing import List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .corpus import TOKENIZER_FILE, ByteTokenizer, train_files, train_tokens
from .needle import make_needle_sample
from .run import REFERENCE_MODEL

__all__ = ["ARCH", "TINY_ARCH", "build_model", "train", "fit_text", "main"]

ARCH = dict(hidden_size=384, intermediate_size=896, num_hidden_layers=6, num_attention_heads=8,
            num_key_value_heads=2, head_dim=64, max_position_embeddings=4096, rope_theta=10000.0)
TINY_ARCH = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, max_position_embeddings=512, rope_theta=10000.0)
# (end of the stage as a fraction of training, sequence length)
CURRICULUM = ((0.10, 512), (0.30, 1024), (0.55, 2048), (1.0, 4096))
TINY_CURRICULUM = ((0.5, 128), (1.0, 256))


def build_model(arch: dict, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = ByteTokenizer()
    cfg = LlamaConfig(vocab_size=tok.vocab_size, bos_token_id=tok.BOS, eos_token_id=tok.EOS, pad_token_id=tok.PAD,
                      tie_word_embeddings=False, rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False,
                      initializer_range=0.02, **arch)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _seq_len(progress: float, curriculum) -> int:
    for end, length in curriculum:
        if progress < end:
            return length
    return curriculum[-1][1]


def _lr(progress: float, step: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def make_batch(stream: torch.Tensor, seq_len: int, rows: int, needle_frac: float, rng: random.Random,
               tok: ByteTokenizer) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(ids [rows, seq_len], answer_mask [rows, seq_len - 1])``: corpus windows and needle samples;
    the mask marks the shifted targets that are answer tokens."""
    ids, mask = [], torch.zeros(rows, seq_len - 1, dtype=torch.bool)
    for r in range(rows):
        if rng.random() < needle_frac:
            s = make_needle_sample(stream, seq_len, tok, rng, n_distractors=rng.randint(0, 3), depth=(0.0, 0.9))
            ids.append(s.ids)
            a = len(s.answer)
            mask[r, seq_len - 1 - a:] = True
        else:
            o = rng.randrange(0, len(stream) - seq_len)
            ids.append(torch.cat([torch.tensor([tok.BOS]), stream[o:o + seq_len - 1]]))
    return torch.stack(ids), mask


def _param_groups(model, weight_decay: float):
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


def train(args) -> dict:
    t_start = time.perf_counter()
    device = torch.device(args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu"))
    random.seed(args.seed)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    tok = ByteTokenizer()
    arch = dict(TINY_ARCH if args.tiny else ARCH)
    curriculum = TINY_CURRICULUM if args.tiny else CURRICULUM
    stream = train_tokens(max_bytes=args.max_corpus_bytes or None)
    model = build_model(arch, args.seed).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"reference model: {n_params:,} parameters, {arch['num_hidden_layers']} layers; training text "
          f"{len(stream):,} tokens from {sys.version.split()[0]}'s stdlib; device {device}", flush=True)
    opt = torch.optim.AdamW(_param_groups(model, args.weight_decay), lr=args.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.type == "cuda" else {}))
    fwd = torch.compile(model) if args.compile else model
    use_amp = device.type == "cuda"
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    budget = args.minutes * 60.0
    model.train()
    log: List[dict] = []
    step = tokens = 0
    stopped_by = "steps"
    acc_loss = acc_ans = acc_hit = acc_n = acc_rows = 0.0
    t_log, tok_log = time.perf_counter(), 0
    t_train = time.perf_counter()
    while True:
        elapsed = time.perf_counter() - t_train
        if args.steps and step >= args.steps:
            break
        if elapsed >= budget:
            stopped_by = "time"
            break
        progress = step / args.steps if args.steps else elapsed / budget
        seq = min(_seq_len(progress, curriculum), arch["max_position_embeddings"])
        rows = max(1, args.tokens_per_step // seq)
        ids, amask = make_batch(stream, seq, rows, args.needle_frac, rng, tok)
        ids, amask = ids.to(device, non_blocking=True), amask.to(device, non_blocking=True)
        lr = _lr(progress, step, args.lr, args.warmup)
        for g in opt.param_groups:
            g["lr"] = lr
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=use_amp):
            logits = fwd(input_ids=ids, use_cache=False).logits
        logits = logits[:, :-1].float()
        targets = ids[:, 1:]
        per_tok = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                  reduction="none").view_as(targets)
        lm = per_tok.mean()
        n_ans = amask.sum()
        ans = (per_tok * amask).sum() / n_ans.clamp_min(1)
        loss = lm + args.answer_weight * ans
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # answer rows fully right (teacher-forced argmax == greedy exact match)
            hit = ((logits.argmax(-1) == targets) | ~amask).all(-1) & amask.any(-1)
            acc_hit += hit.sum()
            acc_rows += amask.any(-1).sum()
        acc_loss += lm.detach()
        acc_ans += ans.detach()
        acc_n += 1
        step += 1
        tokens += ids.numel()
        tok_log += ids.numel()
        if step % args.log_every == 0 or (args.steps and step == args.steps):
            now = time.perf_counter()
            entry = {"step": step, "seq_len": seq, "rows": rows, "lr": lr, "loss": float(acc_loss) / acc_n,
                     "answer_loss": float(acc_ans) / acc_n,
                     "needle_train_acc": float(acc_hit) / max(float(acc_rows), 1.0),
                     "tokens_per_s": tok_log / (now - t_log), "elapsed_s": now - t_start}
            log.append(entry)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in entry.items()),
                  flush=True)
            acc_loss = acc_ans = acc_hit = acc_n = acc_rows = 0.0
            t_log, tok_log = now, 0
    train_s = time.perf_counter() - t_train

    # save in bf16, then evaluate what was saved, loaded back through transformers
    model.eval()
    os.makedirs(args.out, exist_ok=True)
    # shards of ≤ 10 MB: one file each fits what a remote run can hand back, and transformers loads them as one
    model.to(torch.bfloat16).save_pretrained(args.out, max_shard_size="10MB")
    with open(os.path.join(args.out, TOKENIZER_FILE), "w") as f:
        json.dump(tok.to_dict(), f, indent=1)
    summary = _summary(args, step, tokens, stopped_by, log, n_params, arch, curriculum, stream, device, train_s,
                       t_start)
    _write_summary(args.out, summary)  # written now too, so a failed evaluation leaves the run recorded
    try:
        summary.update(_evaluate(args, arch, device))
    except Exception as e:  # the weights are saved; say what failed
        summary["eval_error"] = f"{type(e).__name__}: {e}"
        _write_summary(args.out, summary)
        raise
    summary["wall_seconds"] = time.perf_counter() - t_start
    _write_summary(args.out, summary)
    print(f"saved {args.out}: held-out perplexity {summary['heldout_ppl']:.4g} "
          f"({summary['heldout_bits_per_byte']:.3f} bits/byte), needle accuracy {summary['needle_accuracy']}, "
          f"{step} steps, {tokens:,} tokens, {summary['wall_seconds']:.0f} s", flush=True)
    return summary


def _write_summary(out: str, summary: dict) -> None:
    with open(os.path.join(out, "training_summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


def _evaluate(args, arch: dict, device) -> dict:
    """Held-out perplexity and needle accuracy of the saved checkpoint (``tq eval``'s code, unquantized row)."""
    from .run import run_eval

    contexts = [c for c in args.eval_contexts if c <= arch["max_position_embeddings"]]
    ev = run_eval(args.out, configs=[], contexts=contexts,
                  needles=args.eval_needles, max_windows=args.eval_windows, window=args.eval_window,
                  batch_size=args.eval_batch_size, device=str(device), backend="eager", needle_mode="forced",
                  progress=False)
    row = ev["rows"][0]
    return {"heldout_ppl": row["ppl"], "heldout_bits_per_byte": math.log2(row["ppl"]),
            "heldout": {"windows": ev["meta"]["windows"], "window": ev["meta"]["window"],
                        "tokens": ev["meta"]["tokens"], "digest": ev["meta"]["heldout_digest"],
                        "model_dtype": ev["meta"]["dtype"]},
            "needle_accuracy": {k.split("_", 1)[1]: v for k, v in row.items() if k.startswith("needle_")},
            "needles_per_context": args.eval_needles}


def fit_text(model, steps: int, seq_len: int = 128, batch: int = 16, lr: float = 3e-3, seed: int = 0,
             max_bytes: int = 2_000_000):
    """Train ``model`` (any transformers causal LM with ≥ 256 byte tokens) for ``steps`` AdamW steps
    on stdlib text: deterministic for a seed, seconds for a tiny model on CPU. Returns the model in
    eval mode. Random weights give near-uniform or chaotic next-token distributions; a few hundred
    steps give the confident, text-shaped predictions that fidelity probes need."""
    stream = train_tokens(max_bytes=max_bytes)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(_param_groups(model, 0.0), lr=lr, betas=(0.9, 0.95))
    model.train()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = _lr(step / steps, step, lr, max(1, steps // 10))
        starts = torch.randint(0, len(stream) - seq_len, (batch,), generator=gen)
        ids = torch.stack([stream[o:o + seq_len] for o in starts.tolist()])
        logits = model(input_ids=ids, use_cache=False).logits[:, :-1]
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return model.eval()


def _summary(args, step, tokens, stopped_by, log, n_params, arch, curriculum, stream, device, train_s, t_start):
    import transformers

    argv = list(args._argv)
    reproduce = argv + ["--steps", str(step)] if not args.steps else argv
    return {
        "command": "python scripts/train_reference.py " + " ".join(shlex.quote(a) for a in argv),
        "reproduce_command": "python scripts/train_reference.py " + " ".join(shlex.quote(a) for a in reproduce),
        "seed": args.seed, "steps": step, "tokens": tokens, "stopped_by": stopped_by,
        "final_train_loss": log[-1]["loss"] if log else float("nan"),
        "final_answer_loss": log[-1]["answer_loss"] if log else float("nan"),
        "final_needle_train_acc": log[-1]["needle_train_acc"] if log else float("nan"),
        "params": n_params, "arch": arch, "curriculum": [list(c) for c in curriculum],
        "hyper": {k: getattr(args, k) for k in ("lr", "warmup", "weight_decay", "tokens_per_step", "needle_frac",
                                                "answer_weight", "minutes", "compile")},
        "corpus": {"python": sys.version.split()[0], "train_files": len(train_files()), "train_tokens": len(stream)},
        "torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({platform.machine()})",
        "train_seconds": train_s, "wall_seconds": time.perf_counter() - t_start,
        "log": log,
    }


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="train_reference.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=None, help=f"output folder (default: {REFERENCE_MODEL}; with --tiny a temp folder)")
    p.add_argument("--device", default="auto")
    p.add_argument("--minutes", type=float, default=8.5,
                   help="wall-clock budget of the training loop (start-up, saving and the final evaluation add ≈ 30 s)")
    p.add_argument("--steps", type=int, default=0, help="optimizer steps (0: as many as --minutes allows)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="a 2-layer model, 256-token rows: CPU smoke test")
    p.add_argument("--lr", type=float, default=1.5e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--tokens-per-step", type=int, default=None, help="default 65536 (tiny: 2048)")
    p.add_argument("--needle-frac", type=float, default=0.5, help="fraction of rows that are needle samples")
    p.add_argument("--answer-weight", type=float, default=1.0, help="extra weight of the answer tokens' loss")
    p.add_argument("--max-corpus-bytes", type=int, default=None, help="cap the training text (default: all; tiny 2 MB)")
    p.add_argument("--compile", action="store_true", help="torch.compile the training forward")
    p.add_argument("--log-every", type=int, default=None, help="default 50 (tiny: 5)")
    p.add_argument("--eval-windows", type=int, default=64)
    p.add_argument("--eval-window", type=int, default=None, help="default 1024 (tiny: 256)")
    p.add_argument("--eval-contexts", type=int, nargs="*", default=None, help="default 1024 2048 4096 (tiny: 256)")
    p.add_argument("--eval-needles", type=int, default=32)
    p.add_argument("--eval-batch-size", type=int, default=8)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args._argv = argv
    if args.out is None:
        args.out = os.path.join(tempfile.gettempdir(), "tq_reference_tiny") if args.tiny else REFERENCE_MODEL
    tiny = args.tiny
    if args.tokens_per_step is None:
        args.tokens_per_step = 2048 if tiny else 65536
    if args.max_corpus_bytes is None and tiny:
        args.max_corpus_bytes = 2_000_000
    if args.log_every is None:
        args.log_every = 5 if tiny else 50
    if args.eval_window is None:
        args.eval_window = 256 if tiny else 1024
    if args.eval_contexts is None:
        args.eval_contexts = [256] if tiny else [1024, 2048, 4096]
    if tiny and args.warmup > 10 and "--warmup" not in argv:
        args.warmup = 5
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
