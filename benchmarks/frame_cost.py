"""What does a calibrated frame cost an attention call? (GPU)

    python benchmarks/frame_cost.py

Turbo 4-bit caches with no frame, a diagonal frame and a full one (random μ and F near the
identity; Hq 32, Hkv 8, D 128), at batch 1 × 1K and batch 8 × 32K: host µs per eager call of
``attention_over_cache`` (the frames moved around the op: the query, the rings, the output),
wall µs, and GPU µs of the call captured in a CUDA graph (``triton.testing.do_bench_cudagraph``).
Eager: in a compiled graph the frame work is Inductor's ops around the op (not timed here).
"""
import os
import sys
import time

import torch
import triton.testing as tt

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from turboquant import KVQuantConfig  # noqa: E402
from turboquant.cache import QuantizedCacheTensor, attention_over_cache  # noqa: E402

def main() -> int:
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    D = 128
    for B, S in ((1, 1024), (8, 32768)):
        k = torch.randn(B, 8, S, D, device="cuda", dtype=torch.bfloat16)
        q = torch.randn(B, 32, 1, D, device="cuda", dtype=torch.bfloat16)
        mu = torch.randn(8, 1, D)
        f = torch.eye(D) + 0.1 * torch.randn(8, D, D)
        frames = {"none": None, "diagonal": torch.cat([mu, torch.rand(8, 1, D) + 0.5], 1),
                  "full": torch.cat([mu, f, torch.linalg.inv(f)], 1)}
        cfg = KVQuantConfig(method="turbo", bits=4)
        for name, fr in frames.items():
            vfr = None if fr is None else torch.cat([mu, torch.ones(8, 1, D)], 1)
            kc = QuantizedCacheTensor.from_dense(k, cfg.spec("k"), frame=fr)
            vc = QuantizedCacheTensor.from_dense(k, cfg.spec("v"), frame=vfr)
            call = lambda: attention_over_cache(q, kc, vc)  # noqa: E731  (frames moved around the op, eager)
            for _ in range(20):
                call()
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(200):
                call()
            host = (time.perf_counter() - t0) / 200 * 1e6
            torch.cuda.synchronize()
            wall = (time.perf_counter() - t0) / 200 * 1e6
            g = tt.do_bench_cudagraph(call, rep=50, return_mode="median") * 1e3
            print(f"B={B} S={S} frame={name:8s} host {host:7.1f} us/call  wall {wall:7.1f}  graph {g:7.2f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
