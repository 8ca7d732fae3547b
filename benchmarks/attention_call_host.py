"""What does one attention call cost the host, layer by layer? (GPU)

    python benchmarks/attention_call_host.py                      # affine-4, affine-8, turbo-4 at 1 x 1056 keys
    python benchmarks/attention_call_host.py --settings affine-4 --keys 4096
    python benchmarks/attention_call_host.py --settings turbo-3 --variants n4:num_splits=4 w1:num_warps=1

A batch-1 decode step outside a CUDA graph is host-bound and calls the attention once per layer. Per
setting this times, in µs of host time per call, each layer of the call as a compiled graph reaches
it: through the dispatcher (``torch.ops.turboquant.attention``), directly (``ops._attention_direct``,
what Inductor's wrapper calls since ``ops.call_directly_from_inductor``), the kernel's launcher
(``decode_attention``: plan lookup, allocation, launch) and the launch alone; against bf16 SDPA over
the same keys (the baseline's attention). Each figure is the least over rounds of fewer calls than
the launch queue holds, so the host never waits for the GPU (``with_gpu_us``: the same loop until
the GPU is done). Without grad, as ``generate`` runs. ``--variants``: the launcher's rows again with
``decode_attention``'s launch overrides (as ``decode_attention.py --variants``). Prints a table and writes CSV.
"""

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from decode_attention import _parse_variant  # noqa: E402

from turboquant import KVQuantConfig, compat, ops  # noqa: E402
from turboquant.cache import QuantizedCacheTensor  # noqa: E402
from turboquant.reporting import format_table, write_csv  # noqa: E402

COLUMNS = ["setting", "call", "host_us", "with_gpu_us"]


def _host_us(fn, calls=400, rounds=7):
    # fewer calls than the launch queue holds (~1000): the host never waits for the GPU
    for _ in range(50):
        fn()
    best = (float("inf"), float("inf"))
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        best = min(best, ((t1 - t0) / calls * 1e6, (time.perf_counter() - t0) / calls * 1e6))
    return best


def run(settings, S=1056, B=1, HQ=32, HKV=8, D=128, variants=()):
    import turboquant.templates.decode_attention as kernel

    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    mask = torch.ones(B, 1, 1, S, device="cuda", dtype=torch.bool)
    mask[..., S - 26:] = False  # a static cache's unwritten tail
    scale = D ** -0.5
    rows = []

    def row(setting, call, fn):
        host, total = _host_us(fn)
        rows.append({"setting": setting, "call": call, "host_us": host, "with_gpu_us": total})
        print(f"{setting:9s} {call:66s} host {host:7.2f} µs  with GPU {total:7.2f}", flush=True)

    kr, vr = (t[:, :, None].expand(B, HKV, HQ // HKV, S, D).reshape(B, HQ, S, D) for t in (k, v))
    bias = torch.zeros(B, HQ, 1, S, device="cuda", dtype=torch.bfloat16).masked_fill(~mask, float("-inf"))
    row("bf16", "F.scaled_dot_product_attention, bool mask", lambda: F.scaled_dot_product_attention(q, kr, vr, attn_mask=mask))
    row("bf16", "aten._scaled_dot_product_efficient_attention",
        lambda: torch.ops.aten._scaled_dot_product_efficient_attention.default(q, kr, vr, bias, False))
    row("bf16", "torch.empty of the output", lambda: torch.empty((B, HQ, 1, D), device="cuda", dtype=torch.bfloat16))
    row("bf16", "Tensor.new_empty of the output", lambda: q.new_empty((B, HQ, 1, D)))
    row("bf16", "compat.empty_cuda of the output",
        lambda: compat.empty_cuda((B, HQ, 1, D), (HQ * D, D, D, 1), torch.bfloat16, 0))
    for setting in settings:
        method, bits = setting.split("-")
        cfg = KVQuantConfig(method=method, bits=int(bits))
        kc, vc = QuantizedCacheTensor.from_dense(k, cfg.spec("k")), QuantizedCacheTensor.from_dense(v, cfg.spec("v"))
        args = (q, kc.codes, kc.meta, vc.codes, vc.meta, mask, False, scale, ops.spec_args(kc.spec),
                ops.spec_args(vc.spec), D, D)
        op = torch.ops.turboquant.attention.default
        row(setting, "torch.ops.turboquant.attention (dispatcher)", lambda: op(*args))
        row(setting, "ops._attention_direct (compiled graphs)", lambda: ops._attention_direct(*args))
        for name, kw in [("", {})] + list(variants):
            tag = f" [{name}]" if name else ""

            def call(kw=kw, kc=kc, vc=vc):
                return kernel.decode_attention(q, kc.codes, kc.meta, vc.codes, vc.meta, kc.spec, vc.spec, D,
                                               attn_mask=mask, scale=scale, **kw)
            row(setting, "decode_attention (plan, allocation, launch)" + tag, call)
            plan = next(reversed(kernel._PLANS.values()))
            out = torch.empty(plan.out_shape, device="cuda", dtype=q.dtype)
            ws = out if plan.merge is None else torch.empty(plan.ws_numel, device="cuda", dtype=torch.float32)
            launch_args = (q, kc.codes, kc.meta, vc.codes, vc.meta, *(q if t is None else t for t in plan.tables),
                           mask, q, out, ws)
            pointers = tuple(t.data_ptr() for t in launch_args)
            stream = compat.current_raw_stream(0)
            launcher = (f"{'torch' if plan.split.static is not None else 'Triton'}'s launcher, grid "
                        f"{plan.split.grid[:2]}, {plan.split.options.get('num_warps')} warps")
            row(setting, f"the split kernel's launch alone ({launcher}){tag}", lambda: plan.split(stream, pointers))
        del kc, vc
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--settings", nargs="+", default=["affine-4", "affine-8", "turbo-4"])
    p.add_argument("--keys", type=int, default=1056, help="cache length (1K prompt + 32 new tokens)")
    p.add_argument("--variants", nargs="+", default=[], metavar="NAME:KEY=VALUE,...",
                   help="the launcher's rows again with these launch overrides (e.g. 'n4:num_splits=4')")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    with torch.no_grad():  # as generate runs
        rows = run(args.settings, args.keys, variants=[_parse_variant(v) for v in args.variants])
    print(format_table(rows, COLUMNS))
    print(f"wrote {write_csv(rows, os.path.join(args.out, 'attention_call_host.csv'), COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
