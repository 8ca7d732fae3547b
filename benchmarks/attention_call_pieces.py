"""What does one attention call cost the host, piece by piece, in the tree on PYTHONPATH? (GPU)

    python benchmarks/attention_call_pieces.py new --pieces
    mkdir -p /tmp/old && git archive b5f2aba turboquant | tar -x -C /tmp/old && PYTHONPATH=/tmp/old python benchmarks/attention_call_pieces.py old

Batch 1, Hq = 32, Hkv = 8, D = 128, 1056 keys with a bool mask, without grad (as ``generate`` runs):
µs of host time per call of ``ops._attention_direct`` (what compiled graphs call) and
``decode_attention``, for affine-4 and turbo-4, each the least over rounds of fewer calls than the
launch queue holds. ``--pieces`` (a tree with ``compat.empty_cuda``) adds the parts of an affine-4
call: the plan key's tuple and hash, pointers, allocation, the split kernel's launch. It imports
``turboquant`` from wherever ``PYTHONPATH`` says, so two trees run alternately on one machine compare
the same host (its speed drifts between processes). Prints one line per figure; tagged with the first
argument.
"""
import functools
import operator
import os
import sys
import time

import torch

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # after PYTHONPATH: its tree wins


def host_us(fn, calls=400, rounds=9):
    # attention_call_host._host_us's loop, not imported: that module puts this repository's tree first on
    # sys.path, and here PYTHONPATH's tree must win. Fewer calls than the launch queue holds (~1000): the
    # host never waits for the GPU
    for _ in range(50):
        fn()
    best = float("inf")
    for _ in range(rounds):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return best


def _pieces(q, kc, vc, mask, D):
    """The parts of an affine-4 call (the plan made by the call before)."""
    from turboquant import compat, ops
    import turboquant.templates.decode_attention as kernel

    plan = next(reversed(kernel._PLANS.values()))
    tuning = kernel._tuning()  # the defaults, as the call passes them
    kcodes, kmeta, vcodes, vmeta, ks, vs = kc.codes, kc.meta, vc.codes, vc.meta, kc.spec, vc.spec

    def key():
        return (False, q.shape, q.stride(), q.dtype, 0, kcodes.shape, kcodes.stride(), kmeta.shape, kmeta.stride(),
                kmeta.dtype, vcodes.shape, vcodes.stride(), vmeta.shape, vmeta.stride(), vmeta.dtype, ks, vs,
                (mask.shape, mask.stride(), mask.dtype), False, 0.0, D ** -0.5, 0, tuning, True)

    built = key()
    out = torch.empty(plan.out_shape, device="cuda", dtype=q.dtype)
    tensors = (q, kcodes, kmeta, vcodes, vmeta, *(q if t is None else t for t in plan.tables), mask, q, out, out)
    pointers = tuple(t.data_ptr() for t in tensors)
    stream = compat.current_raw_stream(0)
    return [
        ("key tuple", key), ("key hash", lambda: hash(built)), ("spec hash x2", lambda: (hash(ks), hash(vs))),
        ("plans.get", lambda: kernel._PLANS.get(built)),
        ("7 data_ptr", lambda: (q.data_ptr(), kcodes.data_ptr(), kmeta.data_ptr(), vcodes.data_ptr(),
                                vmeta.data_ptr(), mask.data_ptr(), q.data_ptr())),
        ("reduce or", lambda: functools.reduce(operator.or_, pointers) & 15),
        ("capturing", torch.cuda.is_current_stream_capturing), ("raw stream", lambda: compat.current_raw_stream(0)),
        ("get_device", q.get_device),
        ("empty_cuda", lambda: compat.empty_cuda(plan.out_shape, plan.out_stride, q.dtype, 0)),
        ("new_empty", lambda: q.new_empty(plan.out_shape)),
        ("split launch", lambda: plan.split(stream, pointers)),
        ("cuda_call", lambda: ops._cuda_call((0, 4, 0, 0, 0), (0, 4, 0, 0, 0), 32, 1, D, D, 8)),
        ("is_grad_enabled", torch.is_grad_enabled)]


def main(tag, pieces):
    from turboquant import KVQuantConfig, ops
    from turboquant.cache import QuantizedCacheTensor
    import turboquant.templates.decode_attention as kernel

    B, HQ, HKV, S, D = 1, 32, 8, 1056, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(B, HQ, 1, D, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(B, HKV, S, D, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn_like(k)
    mask = torch.ones(B, 1, 1, S, device="cuda", dtype=torch.bool)
    rows = []
    for setting in ("affine-4", "turbo-4"):
        method, bits = setting.split("-")
        cfg = KVQuantConfig(method=method, bits=int(bits))
        kc, vc = QuantizedCacheTensor.from_dense(k, cfg.spec("k")), QuantizedCacheTensor.from_dense(v, cfg.spec("v"))
        args = (q, kc.codes, kc.meta, vc.codes, vc.meta, mask, False, D ** -0.5, ops.spec_args(kc.spec),
                ops.spec_args(vc.spec), D, D)
        kw = dict(softcap=0.0, k_ring=None, k_ring_pos=None, v_ring=None, v_ring_pos=None, k_frame=None, v_frame=None)
        rows.append((setting, "direct", host_us(lambda: ops._attention_direct(*args, **kw))))
        rows.append((setting, "decode_attention", host_us(lambda: kernel.decode_attention(
            q, kc.codes, kc.meta, vc.codes, vc.meta, kc.spec, vc.spec, D, mask, False, D ** -0.5, 0.0))))
        if pieces and setting == "affine-4":
            rows += [(setting, name, host_us(fn)) for name, fn in _pieces(q, kc, vc, mask, D)]
    for setting, name, us in rows:
        print(f"{tag:4s} {setting:9s} {name:22s} {us:7.2f}")


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("needs a CUDA GPU")
    with torch.no_grad():  # as generate runs
        main(sys.argv[1], "--pieces" in sys.argv[2:])
