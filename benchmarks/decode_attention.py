"""Is decode attention over packed codes faster than bf16 attention, and by how much? (GPU)

    python benchmarks/decode_attention.py                       # B=8, Hq=32, Hkv=8, D=128, 1K..64K
    python benchmarks/decode_attention.py --contexts 1024 32768 --methods turbo --bits 4
    python benchmarks/decode_attention.py --contexts 32768 --methods affine --variants one-group:row_groups=1
    python benchmarks/decode_attention.py --head-dim 64 --no-write-path     # Llama-3.2-1B's, Qwen2.5-0.5B's heads

Per context: bf16 cuDNN and flash SDPA (one query token, GQA) against turboquant's
``torch.ops.turboquant.attention`` (the Triton split kernel, then the merge kernel where the sequence is split)
for each method and bit width. Times are medians of triton.testing.do_bench (L2 flushed before every run) and,
in ``us_graph``, of the same call replayed in a CUDA graph (no launch overhead). Bytes are
what the kernel must read: K and V (codes + metadata, or bf16). ``pct_of_copy``: ``GBps_graph`` against a
device-to-device copy measured first in the same process (bytes read + written, as DESIGN.md §6 counts it),
issue 4's bandwidth criterion. Also the write path: compiled quantize-on-write of one token vs the bf16
``index_copy_``.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

from turboquant import KVQuantConfig
from turboquant.cache import QuantizedCacheTensor
from turboquant.reporting import format_table, write_csv

COLUMNS = ["head_dim", "context", "setting", "us", "us_graph", "speedup", "speedup_graph", "bytes", "GBps",
           "GBps_graph", "pct_of_copy"]
COPY_BYTES = 1 << 30  # the copy's source: large against any L2


def _bench(fn):
    import triton.testing as tt

    cold = tt.do_bench(fn, warmup=10, rep=50, return_mode="median")
    graph = tt.do_bench_cudagraph(fn, rep=50, return_mode="median")
    return cold * 1e3, graph * 1e3


def copy_bandwidth(nbytes=COPY_BYTES):
    """Device-to-device copy in GB/s (bytes read + written, CUDA-graph time): what ``pct_of_copy`` divides by."""
    src = torch.empty(nbytes // 2, device="cuda", dtype=torch.bfloat16).normal_()
    dst = torch.empty_like(src)
    _, usg = _bench(lambda: dst.copy_(src))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / usg / 1e3


def run(contexts, methods, bits, B=8, HQ=32, HKV=8, D=128):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    copy_gbps = copy_bandwidth()
    rows = [{"head_dim": D, "context": 0, "setting": "device copy (read + write)", "bytes": 2 * COPY_BYTES,
             "GBps_graph": copy_gbps, "pct_of_copy": 100.0}]
    for S in contexts:
        q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
        dense_bytes = 2 * k.numel() * k.element_size()
        base = {}
        for name, backend in (("bf16 cuDNN SDPA", SDPBackend.CUDNN_ATTENTION), ("bf16 flash SDPA", SDPBackend.FLASH_ATTENTION)):
            def fn(backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
            try:
                us, usg = _bench(fn)
            except RuntimeError as e:  # a backend this build/GPU lacks
                print(f"{name}: {e}", file=sys.stderr)
                continue
            base.setdefault("us", us)
            base.setdefault("usg", usg)
            rows.append({"head_dim": D, "context": S, "setting": name, "us": us, "us_graph": usg, "bytes": dense_bytes,
                         "GBps": dense_bytes / us / 1e3, "GBps_graph": dense_bytes / usg / 1e3})
        for method in methods:
            for b in bits:
                cfg = KVQuantConfig(method=method, bits=b)
                kc = QuantizedCacheTensor.from_dense(k, cfg.spec("k"))
                vc = QuantizedCacheTensor.from_dense(v, cfg.spec("v"))
                nbytes = kc.quantized_nbytes + vc.quantized_nbytes
                us, usg = _bench(lambda: F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True))
                rows.append({"head_dim": D, "context": S, "setting": f"turboquant {method} {b}-bit", "us": us,
                             "us_graph": usg,
                             "bytes": nbytes, "GBps": nbytes / us / 1e3, "GBps_graph": nbytes / usg / 1e3})
                del kc, vc
        for r in rows:
            if r["context"] == S:
                r["speedup"] = base["us"] / r["us"]
                r["speedup_graph"] = base["usg"] / r["us_graph"]
                r["pct_of_copy"] = 100 * r["GBps_graph"] / copy_gbps
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def write_path(S=32768, B=8, HKV=8, D=128, bits=(8, 4, 3)):
    """Compiled one-token cache write: bf16 index_copy_ vs quantize-on-write."""
    rows = []
    new = torch.randn(B, HKV, 1, D, device="cuda", dtype=torch.bfloat16)
    pos = torch.tensor([S // 2], device="cuda")

    def step(cache, new, pos):
        cache.index_copy_(2, pos, new)

    dense = torch.zeros(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
    f = torch.compile(step, fullgraph=True)
    us, usg = _bench(lambda: f(dense, new, pos))
    rows.append({"setting": "bf16 index_copy_", "us": us, "us_graph": usg})
    for method in ("affine", "turbo"):
        for b in bits:
            cache = QuantizedCacheTensor.empty((B, HKV, S, D), KVQuantConfig(method=method, bits=b).spec("k"),
                                               dtype=torch.bfloat16, device="cuda")
            torch._dynamo.reset()
            f = torch.compile(step, fullgraph=True)
            us, usg = _bench(lambda: f(cache, new, pos))
            rows.append({"setting": f"quantize-on-write {method} {b}-bit", "us": us, "us_graph": usg})
    return rows


def sweep(contexts, methods, bits, B=8, HQ=32, HKV=8, D=128):
    """Launch parameters of the decode kernel (what the defaults were chosen from): warps per
    program, keys per block, splits of the sequence and pipeline stages, CUDA-graph time of each
    (query rows per tile stay at their default for the warps; ``decode_attention(..., min_tile_rows=)``
    sets them)."""
    import itertools

    import triton.testing as tt

    from turboquant.templates.decode_attention import decode_attention

    rows_out = []
    for S in contexts:
        q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16)
        splits = [None] + [n for n in (2, 4, 8, 16, 32) if n * 64 <= S]
        for method, b in itertools.product(methods, bits):
            cfg = KVQuantConfig(method=method, bits=b)
            kc, vc = QuantizedCacheTensor.from_dense(k, cfg.spec("k")), QuantizedCacheTensor.from_dense(k, cfg.spec("v"))
            nbytes = kc.quantized_nbytes + vc.quantized_nbytes
            for warps, block_n, n_splits, stages, rows in itertools.product((1, 4), (32, 64, 128), splits, (2, 3),
                                                                             (None,)):
                fn = lambda: decode_attention(q, kc.codes, kc.meta, vc.codes, vc.meta, kc.spec, vc.spec, D,  # noqa: E731
                                              block_n=block_n, num_splits=n_splits, num_stages=stages,
                                              min_tile_rows=rows, num_warps=warps)
                try:
                    usg = tt.do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
                except Exception as e:  # out of resources for this tile
                    print(f"{method} {b} {warps} {block_n} {n_splits} {stages} {rows}: {type(e).__name__}", file=sys.stderr)
                    continue
                rows_out.append({"head_dim": D, "context": S, "setting": f"{method} {b}-bit", "num_warps": warps,
                                 "block_n": block_n,
                                 "num_splits": n_splits or "default", "num_stages": stages,
                                 "min_tile_rows": rows or "default", "us_graph": usg, "GBps_graph": nbytes / usg / 1e3})
            del kc, vc
    best = {}
    for r in rows_out:
        key = (r["context"], r["setting"])
        if key not in best or r["us_graph"] < best[key]["us_graph"]:
            best[key] = r
    return rows_out, list(best.values())


def _parse_variant(text):
    """``name:key=value,key=value`` → (name, launch overrides of ``decode_attention``)."""
    import ast

    name, _, body = text.partition(":")
    kwargs = {}
    for item in filter(None, body.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--variants {text!r}: {item!r} is not key=value")
        kwargs[key.strip()] = ast.literal_eval(value.strip())
    return name, kwargs


def compare_variants(contexts, methods, bits, variants, B=8, HQ=32, HKV=8, D=128):
    """The kernel with each variant's launch overrides against its defaults, in one process:
    CUDA-graph µs, ratio against bf16 cuDNN SDPA, and the relative error against a float64
    attention over the dequantized cache (the same codes)."""
    import itertools

    import triton.testing as tt
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from turboquant.templates.decode_attention import decode_attention

    rows = []
    for S in contexts:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, h, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for h, n in ((HQ, 1), (HKV, S), (HKV, S)))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

        base = tt.do_bench_cudagraph(cudnn, rep=50, return_mode="median") * 1e3
        rows.append({"head_dim": D, "context": S, "setting": "bf16 cuDNN SDPA", "variant": "", "us_graph": base,
                     "speedup_graph": 1.0})
        for method, b in itertools.product(methods, bits):
            cfg = KVQuantConfig(method=method, bits=b)
            kc, vc = QuantizedCacheTensor.from_dense(k, cfg.spec("k")), QuantizedCacheTensor.from_dense(v, cfg.spec("v"))
            kd, vd = (t.dequantize(torch.float32).double().repeat_interleave(HQ // HKV, 1) for t in (kc, vc))
            ref = F.scaled_dot_product_attention(q.double(), kd, vd)
            del kd, vd
            for name, kw in [("default", {})] + variants:
                def fn(kw=kw):
                    return decode_attention(q, kc.codes, kc.meta, vc.codes, vc.meta, kc.spec, vc.spec, D, **kw)
                try:
                    err = float((fn().double() - ref).norm() / ref.norm())
                    us = tt.do_bench_cudagraph(fn, rep=50, return_mode="median") * 1e3
                except Exception as e:  # a launch this tile cannot take (resources, constraints)
                    print(f"{S} {method} {b}-bit {name}: {type(e).__name__}: {e}", file=sys.stderr)
                    continue
                rows.append({"head_dim": D, "context": S, "setting": f"turboquant {method} {b}-bit", "variant": name,
                             "us_graph": us,
                             "speedup_graph": base / us, "rel_err": err})
            del kc, vc, ref
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384, 32768, 65536])
    p.add_argument("--methods", nargs="+", default=["affine", "turbo"])
    p.add_argument("--bits", type=int, nargs="+", default=[8, 4, 3, 2])
    p.add_argument("--head-dim", type=int, default=128, help="D (Hq=32, Hkv=8, B=8 as ever)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--sweep", action="store_true",
                   help="only sweep the kernel's launch parameters (at --contexts, --methods, --bits)")
    p.add_argument("--no-write-path", action="store_true", help="skip the compiled cache-write timings")
    p.add_argument("--variants", nargs="+", metavar="NAME:KEY=VALUE,...",
                   help="only time decode_attention with these launch overrides (e.g. 'one-group:row_groups=1') "
                        "against its defaults, with each one's error (at --contexts, --methods, --bits)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.sweep:
        rows, best = sweep(args.contexts, args.methods, args.bits, D=args.head_dim)
        cols = ["head_dim", "context", "setting", "num_warps", "block_n", "num_splits", "num_stages", "min_tile_rows",
                "us_graph", "GBps_graph"]
        write_csv(rows, os.path.join(args.out, "decode_sweep.csv"), cols)
        print(format_table(best, cols))
        return 0
    if args.variants:
        rows = compare_variants(args.contexts, args.methods, args.bits, [_parse_variant(v) for v in args.variants],
                                D=args.head_dim)
        cols = ["head_dim", "context", "setting", "variant", "us_graph", "speedup_graph", "rel_err"]
        print(format_table(rows, cols))
        print(f"wrote {write_csv(rows, os.path.join(args.out, 'decode_variants.csv'), cols)}")
        return 0
    rows = run(args.contexts, args.methods, args.bits, D=args.head_dim)
    print(format_table(rows, COLUMNS))
    print(f"wrote {write_csv(rows, os.path.join(args.out, 'decode_attention.csv'), COLUMNS)}")
    if args.no_write_path:
        return 0
    wrows = write_path(D=args.head_dim)
    print(format_table(wrows, ["setting", "us", "us_graph"]))
    print(f"wrote {write_csv(wrows, os.path.join(args.out, 'write_path.csv'), ['setting', 'us', 'us_graph'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
