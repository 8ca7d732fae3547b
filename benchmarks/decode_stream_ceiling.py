"""What bandwidth does the decode kernel's access pattern allow, with next to no arithmetic? (GPU)

    python benchmarks/decode_stream_ceiling.py                  # B=8, Hkv=8, D=128, 32K keys
    python benchmarks/decode_stream_ceiling.py --context 16384 --bits 2 4

The low-bit decode kernels read well under cuDNN's bandwidth at 32K (H100, 37th session: affine 2-bit
2.39 TB/s, 4-bit 2.78, cuDNN 3.06) while their loops hold about as many instructions per key at every
width (sm_90 SASS: 14.0 at 2 bits, 14.9 at 4), so time does not follow the instruction count. This
kernel reads exactly what the split kernel reads, in the same grid (``B·Hkv`` heads × splits filling
``programs_per_sm`` programs per SM) and the same order: per block of ``block_n`` keys the key and
value code tiles (int16 words through the pipeliner's shared-memory stages into one MMA each, as the
value dots take them) and, one block ahead in registers, each key's and value's 4-byte metadata word.
Nothing else: the time left is what the access pattern costs. Variants change one thing each
(metadata off, keys per block, stages, warps, programs per SM); ``bf16`` rows read 256-byte rows
without metadata, the pattern of a bf16 cache; 3-bit rows (48 bytes) are read as tiles of 64 bytes, the last
16 masked, and in variants as the split kernel reads them (three 16-byte planes; the values' bytes then
leave shared memory a byte a load, as there) and as the same words in rows 64 bytes apart (does the 48-byte
stride cost anything?). ``pct_of_copy`` divides by a device copy measured
first in the same process (``decode_attention.copy_bandwidth``). H100, 38th session: the pattern alone reads
2-bit rows at 2903 GB/s, 4-bit 2999, 8-bit 2995, bf16 3077, and no variant moves it past the run's spread;
39th: 3-bit rows as three byte planes 2710 GB/s (80.5 µs at 32K), as masked 64-byte tiles 2400 (a masked
copy costs what a real one does) (``benchmarks/RESULTS.md``).
"""

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
import triton
import triton.language as tl

from turboquant.reporting import format_table, write_csv

COLUMNS = ["context", "setting", "variant", "block_n", "num_stages", "num_warps", "programs_per_sm", "meta",
           "us_graph", "bytes", "GBps_graph", "pct_of_copy"]


@triton.jit
def _stream_kernel(kc_ptr, km_ptr, vc_ptr, vm_ptr, out_ptr, S, split_blocks, ROW: tl.constexpr,
                   BLOCK_N: tl.constexpr, META: tl.constexpr, NUM_STAGES: tl.constexpr,
                   BYTE_PLANES: tl.constexpr, READ: tl.constexpr):
    """Read one split of one head's keys and values as the split kernel does; store a checksum. Rows of
    ``ROW`` int16 words, read as a tile of the next power of two columns (3-bit rows: 24 words in 32), or
    with ``BYTE_PLANES`` = 3 as three 16-byte planes of each 48-byte row (the split kernel's 3-bit byte planes), or
    with 1 as a "2+1" row: a 2-bit row's 16 words (the low two bits of each code) then one 16-byte plane (the
    high bits), a layout no cache has yet. ``READ``: the words of a row read (the rest of a wider row's stride left
    alone)."""
    pid_bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    base_c = pid_bh * S * ROW
    base_m = pid_bh * S
    start = split * split_blocks * BLOCK_N
    COLS: tl.constexpr = 16 if BYTE_PLANES else triton.next_power_of_2(ROW)
    tl.static_assert((BYTE_PLANES == 0 or BYTE_PLANES == 1 or BYTE_PLANES == 3) and (BYTE_PLANES == 0 or ROW == 24))
    cols = tl.arange(0, COLS)
    ones = tl.full([16, BLOCK_N], 1.0, tl.float16)
    acc = tl.zeros([16, COLS], tl.float32)
    ones16 = tl.full([16, 16], 1.0, tl.float16)
    k_acc = tl.zeros([16, BLOCK_N], tl.float32)
    m_acc = tl.zeros([BLOCK_N], tl.int32)
    n0 = start + tl.arange(0, BLOCK_N)
    km = tl.load(km_ptr + base_m + n0)
    vm = tl.load(vm_ptr + base_m + n0)
    for i in tl.range(0, split_blocks, num_stages=NUM_STAGES):
        n = start + i * BLOCK_N + tl.arange(0, BLOCK_N)
        n_next = tl.where(i + 1 < split_blocks, n + BLOCK_N, n)
        if META:  # a block ahead, in registers, as _block_meta's loads
            km_next = tl.load(km_ptr + base_m + n_next)
            vm_next = tl.load(vm_ptr + base_m + n_next)
        if BYTE_PLANES:  # the keys' planes meet the query along the row, the values' along the keys
            off = (base_c + n.to(tl.int64)[:, None] * ROW) * 2 + cols[None, :]  # bytes
            if BYTE_PLANES == 1:  # 2+1: the words of bytes 0–31, then the byte plane 32–47
                w_off = base_c + n.to(tl.int64)[:, None] * ROW + cols[None, :]
                k = tl.load(kc_ptr + w_off).to(tl.float16, bitcast=True)
                v = tl.load(vc_ptr + w_off).to(tl.float16, bitcast=True)
                k_acc = tl.dot(ones16, tl.trans(k), k_acc)
                acc = tl.dot(ones, v, acc)
            for p in tl.static_range(3 - BYTE_PLANES, 3):
                k = tl.load(kc_ptr.to(tl.pointer_type(tl.uint8)) + off + 16 * p).to(tl.int16)
                v = tl.load(vc_ptr.to(tl.pointer_type(tl.uint8)) + off + 16 * p).to(tl.int16)
                k_acc = tl.dot(ones16, tl.trans(k.to(tl.float16, bitcast=True)), k_acc)
                acc = tl.dot(ones, v.to(tl.float16, bitcast=True), acc)
        else:
            off = base_c + n.to(tl.int64)[:, None] * ROW + cols[None, :]
            k = tl.load(kc_ptr + off, mask=cols[None, :] < READ, other=0).to(tl.float16, bitcast=True)
            v = tl.load(vc_ptr + off, mask=cols[None, :] < READ, other=0).to(tl.float16, bitcast=True)
            acc = tl.dot(ones, k, acc)
            acc = tl.dot(ones, v, acc)
        if META:
            m_acc = m_acc ^ km ^ vm
            km, vm = km_next, vm_next
    total = tl.sum(tl.sum(acc, axis=1), axis=0) + tl.sum(m_acc, axis=0).to(tl.float32)
    if BYTE_PLANES:
        total += tl.sum(tl.sum(k_acc, axis=1), axis=0)
    tl.store(out_ptr + pid_bh * tl.num_programs(1) + split, total)


def stream(kc, km, vc, vm, out, block_n=64, num_stages=3, num_warps=1, programs_per_sm=8, meta=True, sms=None,
           byte_planes=0, read=None):
    """One launch over ``kc``/``vc`` ``[BH, S, ROW]`` int16 and ``km``/``vm`` ``[BH, S]`` int32; returns ``out``."""
    bh, S, row = kc.shape
    sms = sms or torch.cuda.get_device_properties(kc.device).multi_processor_count
    splits = max(1, min(programs_per_sm * sms // bh, S // block_n))
    split_blocks = S // (splits * block_n)
    _stream_kernel[(bh, splits)](kc, km, vc, vm, out, S, split_blocks, ROW=row, BLOCK_N=block_n, META=meta,
                                 NUM_STAGES=num_stages, BYTE_PLANES=byte_planes, READ=read or row,
                                 num_warps=num_warps)
    return out, splits * split_blocks * block_n


def variants(bits):
    """(name, overrides) per width: the split kernel's one-warp pattern, then one change at a time."""
    base = dict(block_n=64, num_stages=3, num_warps=1, programs_per_sm=8, meta=True)
    changes = [("kernel's", {}), ("no meta", {"meta": False}), ("128 keys", {"block_n": 128}),
               ("128 keys, 2 stages", {"block_n": 128, "num_stages": 2}), ("4 stages", {"num_stages": 4}),
               ("16 programs", {"programs_per_sm": 16}), ("4 warps, 128 keys", {"num_warps": 4, "block_n": 128})]
    if bits == 3:  # the split kernel reads three byte planes a row; 64-byte tiles are the other rows' shape
        changes = [("byte planes", {"byte_planes": 3}), ("byte planes, no meta", {"byte_planes": 3, "meta": False}),
                   ("byte planes, 2 stages", {"byte_planes": 3, "num_stages": 2}),
                   ("byte planes, 4 stages", {"byte_planes": 3, "num_stages": 4}),
                   ("2+1", {"byte_planes": 1}), ("2+1, 2 stages", {"byte_planes": 1, "num_stages": 2}),
                   ("2+1, 128 keys, 2 stages", {"byte_planes": 1, "block_n": 128, "num_stages": 2}),
                   ("words, 64-byte stride", {"stride64": True})] + changes
    if bits == 16:
        # 64 KB of stages a program at 3: as many programs as fit an SM's shared memory
        changes = [("no meta", {"meta": False, "programs_per_sm": 3}),
                   ("no meta, 2 stages", {"meta": False, "num_stages": 2, "programs_per_sm": 4}),
                   ("no meta, 4 warps", {"meta": False, "num_warps": 4, "programs_per_sm": 3})]
    return [(name, {**base, **kw}) for name, kw in changes]


def run(S, bits_list, BH=64, D=128):
    import triton.testing as tt

    from decode_attention import copy_bandwidth

    copy_gbps = copy_bandwidth()
    rows = [{"context": 0, "setting": "device copy (read + write)", "GBps_graph": copy_gbps, "pct_of_copy": 100.0}]
    out = torch.empty(BH * 4096, device="cuda", dtype=torch.float32)
    for bits in bits_list:
        row = D * bits // 16  # int16 words per row
        # small codes: the words read as fp16 are subnormal numbers, as the split kernel's fields are
        kc = torch.randint(0, 256, (BH, S, row), device="cuda", dtype=torch.int16)
        vc = torch.randint(0, 256, (BH, S, row), device="cuda", dtype=torch.int16)
        km = torch.randint(0, 1 << 20, (BH, S), device="cuda", dtype=torch.int32)
        vm = torch.randint(0, 1 << 20, (BH, S), device="cuda", dtype=torch.int32)
        for name, kw in variants(bits):
            kw = dict(kw)
            k_rows, v_rows = kc, vc
            if kw.pop("stride64", False):  # 3-bit rows' words, 64 bytes apart: the 2/4-bit rows' alignment
                k_rows, v_rows = (torch.randint(0, 256, (BH, S, 32), device="cuda", dtype=torch.int16) for _ in "kv")
                kw["read"] = row
            try:
                _, keys = stream(k_rows, km, v_rows, vm, out, **kw)
                usg = tt.do_bench_cudagraph(lambda: stream(k_rows, km, v_rows, vm, out, **kw), rep=50,
                                            return_mode="median") * 1e3
            except Exception as e:  # a tile out of resources
                print(f"{bits}-bit {name}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            nbytes = BH * keys * (2 * row * 2 + (8 if kw["meta"] else 0))
            gbps = nbytes / usg / 1e3
            rows.append({"context": S, "setting": "bf16 rows" if bits == 16 else f"{bits}-bit rows", "variant": name,
                         **{k: v for k, v in kw.items() if k in COLUMNS}, "us_graph": usg, "bytes": nbytes,
                         "GBps_graph": gbps, "pct_of_copy": 100 * gbps / copy_gbps})
    return rows


def sm90_loop(bits, meta=True, block_n=64, num_stages=3, num_warps=1, byte_planes=0):
    """The pattern kernel compiled for sm_90 on this machine (no GPU): its loop's instruction count and
    opcodes, and its shared memory in bytes (``decode_sass.py``'s compile and loop finder)."""
    from decode_sass import compile_for_sm90, loop_counts

    sig = {"kc_ptr": "*i16", "km_ptr": "*i32", "vc_ptr": "*i16", "vm_ptr": "*i32", "out_ptr": "*fp32", "S": "i32",
           "split_blocks": "i32", "ROW": "constexpr", "BLOCK_N": "constexpr", "META": "constexpr",
           "NUM_STAGES": "constexpr", "BYTE_PLANES": "constexpr", "READ": "constexpr"}
    consts = {"ROW": 128 * bits // 16, "BLOCK_N": block_n, "META": meta, "NUM_STAGES": num_stages,
              "BYTE_PLANES": byte_planes, "READ": 128 * bits // 16}
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(6)}
    sass, _, shared, _ = compile_for_sm90(_stream_kernel, sig, consts, attrs, {"num_warps": num_warps})
    n, ops = loop_counts(sass)
    return {"loop_instructions": n, "opcodes": dict(ops), "shared": shared}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--context", type=int, default=32768)
    p.add_argument("--bits", type=int, nargs="+", default=[2, 3, 4, 8, 16], choices=[2, 3, 4, 8, 16],
                   help="code widths (row words of D·bits/16; 16: bf16 rows)")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    p.add_argument("--sm90-loop", action="store_true",
                   help="CPU: print the pattern kernel's sm_90 loop (instructions, opcodes, shared bytes) per --bits "
                        "as JSON lines, and time nothing")
    p.add_argument("--no-meta", action="store_true", help="with --sm90-loop: the kernel without metadata loads")
    p.add_argument("--byte-planes", type=int, default=0, choices=[0, 1, 3],
                   help="with --sm90-loop: 3-bit rows read as three byte planes, as the split kernel reads them (3), "
                        "or as 16 words and one byte plane (1: the 2+1 layout)")
    args = p.parse_args(argv)
    if args.sm90_loop:
        import json

        for bits in args.bits:
            loop = sm90_loop(bits, meta=not args.no_meta, byte_planes=args.byte_planes if bits == 3 else 0)
            print(json.dumps({"bits": bits, "meta": not args.no_meta, **loop}))
        return 0
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = run(args.context, args.bits)
    print(format_table(rows, COLUMNS))
    print(f"wrote {write_csv(rows, os.path.join(args.out, 'decode_stream_ceiling.csv'), COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
