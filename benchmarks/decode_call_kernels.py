"""What does each kernel of one decode attention call take on the GPU? (GPU)

    python benchmarks/decode_call_kernels.py                      # 1K and 32K, bf16 cuDNN and every setting
    python benchmarks/decode_call_kernels.py --contexts 1024 --methods turbo --bits 4

B=8, Hq=32, Hkv=8, D=128, one query token, as ``decode_attention.py``. Each setting's call is
captured 20 times into a CUDA graph; the graph is replayed under ``torch.profiler`` and each kernel's
mean GPU time per call is reported (turboquant: the split kernel and the merge kernel; cuDNN: its
attention and reduction kernels), with the replay's wall time per call (CUDA events), so the gap
between the kernels shows as the rest. Prints a table, writes CSV.
"""

import argparse
import collections
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from turboquant import KVQuantConfig  # noqa: E402
from turboquant.cache import QuantizedCacheTensor  # noqa: E402
from turboquant.reporting import format_table, write_csv  # noqa: E402

COLUMNS = ["context", "setting", "us_per_call", "kernel_us", "kernels"]
CALLS = 20


def _call(setting, q, k, v, D):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from turboquant.templates.decode_attention import decode_attention

    if setting == "bf16 cuDNN SDPA":
        def fn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return fn
    method, bits = setting.split()
    cfg = KVQuantConfig(method=method, bits=int(bits.removesuffix("-bit")))
    kc, vc = QuantizedCacheTensor.from_dense(k, cfg.spec("k")), QuantizedCacheTensor.from_dense(v, cfg.spec("v"))
    return lambda: decode_attention(q, kc.codes, kc.meta, vc.codes, vc.meta, kc.spec, vc.spec, D)


def kernel_times(fn):
    """Mean GPU µs per call of each kernel, and the graph replay's wall µs per call."""
    from torch.profiler import ProfilerActivity, profile

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # compile, plan
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    replays = 5
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    per_kernel = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[e.name[:48]] += e.time_range.elapsed_us() / (replays * CALLS)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return dict(per_kernel), start.elapsed_time(end) * 1e3 / (10 * CALLS)


def run(contexts, methods, bits, B=8, HQ=32, HKV=8, D=128):
    rows = []
    for S in contexts:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, h, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for h, n in ((HQ, 1), (HKV, S), (HKV, S)))
        settings = ["bf16 cuDNN SDPA"] + [f"{m} {b}-bit" for m in methods for b in bits]
        for setting in settings:
            kernels, wall = kernel_times(_call(setting, q, k, v, D))
            rows.append({"context": S, "setting": setting, "us_per_call": wall, "kernel_us": sum(kernels.values()),
                         "kernels": "; ".join(f"{name} {us:.2f}" for name, us in kernels.items())})
            print(format_table(rows[-1:], COLUMNS), flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[1024, 32768])
    p.add_argument("--methods", nargs="+", default=["affine", "turbo"])
    p.add_argument("--bits", type=int, nargs="+", default=[8, 4, 3, 2])
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_call_kernels.py needs a CUDA device", file=sys.stderr)
        return 1
    rows = run(a.contexts, a.methods, a.bits)
    print(format_table(rows, COLUMNS))
    print(f"wrote {write_csv(rows, os.path.join(a.out, 'decode_call_kernels.csv'), COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
