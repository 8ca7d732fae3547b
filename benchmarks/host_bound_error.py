"""How faithful is a host-bound affine call, whose one split sums every key? (GPU)

    python benchmarks/host_bound_error.py

Outside a CUDA graph a call with batch × KV heads × keys ≤ 64K runs one split of four-warp programs
(``HOST_BOUND_KEY_ROWS``), so one accumulator sums up to 8K keys. Per shape and affine width: the
kernel's relative error against a float64 attention over the dequantized cache (the same codes),
with its default launch, with value block sums forced on and forced off (``block_sums``). Hq = 32,
Hkv = 8, D = 128. Prints a table and writes CSV.
"""

import argparse
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from turboquant import KVQuantConfig  # noqa: E402
from turboquant.cache import QuantizedCacheTensor  # noqa: E402
from turboquant.reporting import format_table, write_csv  # noqa: E402

COLUMNS = ["batch", "keys", "setting", "programs", "num_warps", "err_default", "err_block_sums", "err_no_block_sums"]


def run(shapes=((1, 8192), (2, 4096), (8, 1024)), bits=(8, 4, 3, 2), HQ=32, HKV=8, D=128):
    from turboquant.templates.decode_attention import _PLANS, decode_attention

    rows = []
    for B, S in shapes:
        gen = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, h, n, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                   for h, n in ((HQ, 1), (HKV, S), (HKV, S)))
        for b in bits:
            cfg = KVQuantConfig(method="affine", bits=b)
            kc, vc = QuantizedCacheTensor.from_dense(k, cfg.spec("k")), QuantizedCacheTensor.from_dense(v, cfg.spec("v"))
            kd, vd = (t.dequantize(torch.float32).double().repeat_interleave(HQ // HKV, 1) for t in (kc, vc))
            ref = F.scaled_dot_product_attention(q.double(), kd, vd)
            errs = {}
            for name, bs in (("err_default", None), ("err_block_sums", True), ("err_no_block_sums", False)):
                out = decode_attention(q, kc.codes, kc.meta, vc.codes, vc.meta, kc.spec, vc.spec, D, block_sums=bs)
                errs[name] = float((out.double() - ref).norm() / ref.norm())
                if bs is None:
                    plan = next(reversed(_PLANS.values()))
            grid = plan.split.grid
            rows.append({"batch": B, "keys": S, "setting": f"affine {b}-bit", "programs": grid[0] * grid[1] * grid[2],
                         "num_warps": plan.split.options["num_warps"], **errs})
            print(f"B={B} S={S} affine-{b}: " + ", ".join(f"{k} {v:.3e}" for k, v in errs.items()), flush=True)
            del kc, vc, kd, vd, ref
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = run()
    print(format_table(rows, COLUMNS))
    print(f"wrote {write_csv(rows, os.path.join(args.out, 'host_bound_error.csv'), COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
