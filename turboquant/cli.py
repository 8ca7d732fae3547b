"""The ``tq`` command."""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from .reporting import format_table, write_csv

__all__ = ["main"]


def _distortion(args) -> int:
    from .quant.distortion import DISTORTION_COLUMNS, measure_distortion

    rows = measure_distortion(d=args.head_dim, n=args.vectors, bits=args.bits, methods=args.methods, seed=args.seed)
    print(f"Distortion on {args.vectors} random unit vectors, head_dim={args.head_dim} "
          "(mse = E||x - x_hat||^2; ip = <y,x> - <y,x_hat> for an independent unit y)")
    print(format_table(rows, DISTORTION_COLUMNS))
    if args.csv:
        print(f"wrote {write_csv(rows, args.csv, DISTORTION_COLUMNS)}")
    return 0


def _demo(args) -> int:
    from .demo import run_demo

    rows = run_demo(args.model, bits=args.bits, method=args.method, prompt_len=args.prompt_len,
                    new_tokens=args.new_tokens, batch=args.batch)
    print(f"Greedy generation, prompt {args.prompt_len} tokens, {args.new_tokens} new tokens, batch {args.batch} "
          f"({'model ' + args.model if args.model else 'default: the trained reference model, held-out prompts'}; "
          "every row compiled; tokens/s after warm-up)")
    print(format_table(rows, ["setting", "cache_bytes", "ratio_vs_dense", "tokens_per_s", "token_agreement", "sample"]))
    return 0


def _eval(args) -> int:
    from .eval.run import run_from_args

    return run_from_args(args, args._argv)


def _bench(args) -> int:
    from .bench.e2e import run_from_args

    return run_from_args(args)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tq", description="turboquant: quantized KV caches for PyTorch models")
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("distortion", help="MSE and inner-product error per method and bit width")
    d.add_argument("--head-dim", type=int, default=128)
    d.add_argument("--vectors", type=int, default=20000)
    d.add_argument("--bits", type=int, nargs="+", default=[2, 3, 4, 8])
    d.add_argument("--methods", nargs="+", default=["affine", "turbo"], choices=["affine", "turbo"])
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--csv", default="", help="also write the table to this CSV file")
    d.set_defaults(func=_distortion)
    m = sub.add_parser("demo", help="generate with and without a quantized KV cache and compare")
    m.add_argument("--model", default=None, help="a local transformers checkpoint (default: the reference model in turboquant/eval/reference_model)")
    m.add_argument("--bits", type=int, nargs="+", default=[8, 4, 3])
    m.add_argument("--method", default="affine", choices=["affine", "turbo"])
    m.add_argument("--prompt-len", type=int, default=64)
    m.add_argument("--new-tokens", type=int, default=32)
    m.add_argument("--batch", type=int, default=1)
    m.set_defaults(func=_demo)
    from .eval.run import add_arguments as eval_arguments

    e = sub.add_parser("eval", help="perplexity, KL, top-1 agreement and needle retrieval per configuration",
                       description="Fidelity of quantized KV caches on held-out text (turboquant/eval/run.py).")
    eval_arguments(e)
    e.set_defaults(func=_eval)
    from .bench.e2e import add_arguments as bench_arguments

    b = sub.add_parser("bench", help="compiled generation: tokens/s, TTFT, memory, cache bytes vs a bf16 cache",
                       description="End-to-end generation benchmark (turboquant/bench/e2e.py).")
    bench_arguments(b)
    b.set_defaults(func=_bench)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = _parser().parse_args(argv)
    args._argv = argv
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
