"""How many instructions does the decode kernel's loop spend per key? (CPU: compiles for sm_90)

    python benchmarks/decode_sass.py turbo 2 --no-register-lut       # gather
    python benchmarks/decode_sass.py turbo 2 --register-lut          # centroids from registers
    python benchmarks/decode_sass.py affine 4 --S 32768 --row-groups 1
    python benchmarks/decode_sass.py turbo 4 --S 1024 --no-plane-hadamard   # rotation read as a matrix
    python benchmarks/decode_sass.py affine 2 --head-dim 64
    python benchmarks/decode_sass.py affine 4 --no-keys-major           # the row-major tile (row groups)
    python benchmarks/decode_sass.py affine 3 --gqa 8 --kv-heads 4 --query-len 2
    python benchmarks/decode_sass.py turbo 2 --no-linear-levels        # 2-bit levels looked up, not fields

Compiles ``_decode_split_kernel`` ahead of time for an H100/H200 (sm_90) with the launch plan a
call of this shape would get on a GPU of ``--sms`` multiprocessors (132; B = 8, Hkv = 8, GQA 4, one query
position, head_dim 128 unless set, inside a CUDA graph), disassembles it with the ptxas/cuobjdump that
ship with Triton, and counts the SASS instructions of the main loop (the longest backward branch): per
key, and per opcode; and the whole kernel's count, also per key of one split (``program_per_key``: with
the fixed work a short split pays, turbo's rotations, the stores; a split of one block has no loop). No
GPU is needed; the counts are not timings (the design notes pair them with H200 timings where they
have them). Prints the registers, spill stack and shared memory, and how many such programs one
multiprocessor holds at once (``programs_per_sm_fit``; the plan fills 8 by default); writes the row as CSV
(``decode_sass.csv``). Before the twenty-seventh session the plan was made for 4 multiprocessors (one
split of a 1K cache where the H200 takes 4 or 8), so its figures at short lengths describe that plan.
"""

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler.compiler import ASTSource  # noqa: E402

from turboquant import KVQuantConfig  # noqa: E402
from turboquant.cache import QuantizedCacheTensor  # noqa: E402
from turboquant.reporting import write_csv  # noqa: E402
from turboquant.templates import code_operands as co  # noqa: E402
from turboquant.templates import decode_attention as da  # noqa: E402

COLUMNS = ["method", "bits", "S", "head_dim", "gqa", "num_splits", "program_per_key", "lookup", "plane_hadamard",
           "keys_major",
           "num_warps", "block_n", "registers", "stack", "shared", "programs_per_sm_fit", "instructions",
           "loop_instructions", "per_key",
           "opcodes"]
_TL = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.uint8: "u8", torch.int16: "i16",
       torch.int32: "i32", torch.bool: "i1"}


def _tool(name: str) -> str:
    return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)


def compile_sass(method, bits, S, D=128, G=4, B=8, HKV=8, L=1, sms=132, bool_mask=False, **tuning):
    """SASS text and resource line of the split kernel a call of this shape would launch on a GPU of
    ``sms`` multiprocessors (with a bool attention mask ``[B, 1, L, S]``: ``bool_mask``)."""
    spec = KVQuantConfig(method=method, bits=bits).spec("k")
    small = QuantizedCacheTensor.empty((1, 1, 4, D), spec)  # the rows as a cache stores them
    q = torch.zeros(B, HKV * G, L, D, dtype=torch.bfloat16)
    codes = torch.zeros(B, HKV, S, small.codes.shape[-1], dtype=small.codes.dtype)
    meta = torch.zeros(B, HKV, S, small.meta.shape[-1], dtype=small.meta.dtype)
    cpu_sms, da.CPU_PLAN_MULTIPROCESSORS = da.CPU_PLAN_MULTIPROCESSORS, sms  # the GPU's geometry, not the tests'
    try:
        mask = torch.ones(B, 1, L, S, dtype=torch.bool).expand(B, HKV * G, L, S) if bool_mask else None
        plan = da._make_plan(q, codes, meta, codes, meta, spec, spec, mask, False, 0.0, 0, D ** -0.5,
                             da._tuning(use_asm=True, **tuning), True)
    finally:
        da.CPU_PLAN_MULTIPROCESSORS = cpu_sms
    names = da._decode_split_kernel.arg_names
    tables = [q if t is None else t for t in plan.tables]  # the centroid and rotation tables' dtypes shape the code
    args = [q, codes, meta, codes, meta] + tables + [q if mask is None else mask] + [q] * 3 + list(plan.split.tail)
    first_const = names.index("HKV")
    if plan.split.options["num_warps"] == 1:  # on the GPU one-warp programs take their bound as an argument
        args[names.index("FIXED_BLOCKS")] = 0  # (the CPU tensors here made the interpreter's constant)
    sig, consts, attrs = {}, {}, {}
    for i, (n, v) in enumerate(zip(names, args)):
        if i >= first_const:
            sig[n], consts[n] = "constexpr", v
        elif isinstance(v, torch.Tensor):
            sig[n], attrs[(i,)] = "*" + _TL[v.dtype], [["tt.divisibility", 16]]
        elif isinstance(v, float):
            sig[n] = "fp32"
        else:
            sig[n] = "i32"
            if v % 16 == 0 and v != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    sass, res, shared, ttgir = compile_for_sm90(da._decode_split_kernel, sig, consts, attrs, plan.split.options)
    return sass, res, shared, plan.split.options, consts, plan.split.tail, ttgir


def compile_for_sm90(kernel, sig, consts, attrs, options):
    """A Triton kernel's sm_90 SASS, resource line, shared memory (bytes) and TTGIR, compiled on this machine."""
    ck = triton.compile(ASTSource(kernel, sig, consts, attrs), target=GPUTarget("cuda", 90, 32), options=dict(options))
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(ck.asm["cubin"])
    try:
        sass = subprocess.run([_tool("cuobjdump"), "-sass", f.name], capture_output=True, text=True, check=True).stdout
        res = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    finally:
        os.unlink(f.name)
    return sass, res, ck.metadata.shared, ck.asm["ttgir"]


def programs_per_sm_fit(registers: int, shared: int, num_warps: int) -> int:
    """How many programs an H100/H200 multiprocessor holds at once: 64K registers allocated per warp in
    units of 256 (8 a thread), 228 KB of shared memory less 1 KB per program, 64 warps, 32 programs."""
    by_regs = 65536 // (-(-max(registers, 1) // 8) * 8 * 32 * num_warps)
    by_shared = da.SM_SHARED_BYTES // (shared + da.PROGRAM_RESERVED_SHARED)
    return min(by_regs, by_shared, 64 // num_warps, 32)


def loop_counts(sass: str):
    """Instructions of the longest backward branch's body, and their opcodes."""
    addr_re = re.compile(r"\s+/\*([0-9a-f]{4,})\*/")
    lines = [line for line in sass.splitlines() if addr_re.match(line)]
    addr = lambda line: int(addr_re.match(line).group(1), 16)  # noqa: E731
    best = None
    for line in lines:
        m = re.search(r"BRA\s+0x([0-9a-f]+)", line)
        if m and int(m.group(1), 16) < addr(line):
            span = (int(m.group(1), 16), addr(line))
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    body = [line for line in lines if best and best[0] <= addr(line) <= best[1]]
    ops = collections.Counter(re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", line).group(1) for line in body)
    return len(body), ops


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("method", choices=["affine", "turbo"])
    p.add_argument("bits", type=int, choices=[2, 3, 4, 8])
    p.add_argument("--S", type=int, default=32768, help="cache length (sets the plan: warps, blocks, row groups)")
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--gqa", type=int, default=4, help="query heads per KV head")
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--query-len", type=int, default=1, help="query positions (speculative decoding: up to 8)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--sms", type=int, default=132,
                   help="the GPU's multiprocessors, which set the splits (H100/H200: 132)")
    p.add_argument("--num-warps", type=int)
    p.add_argument("--block-n", type=int)
    p.add_argument("--row-groups", type=int)
    p.add_argument("--register-lut", action=argparse.BooleanOptionalAction, default=None,
                   help="turbo centroids from registers by byte permutes, or by tl.gather (default: the plan's)")
    p.add_argument("--plane-hadamard", action=argparse.BooleanOptionalAction, default=True,
                   help="turbo's Hadamard rotation plane by plane (default), or read as a matrix")
    p.add_argument("--wide-query-rotation", action=argparse.BooleanOptionalAction, default=None,
                   help="the query's plane Hadamard on parts of up to 64 columns, or 32 (default: the plan's)")
    p.add_argument("--early-rows", action=argparse.BooleanOptionalAction, default=None,
                   help="a one-block split's key and value rows loaded before the query's prologue "
                        "(default: the plan's)")
    p.add_argument("--block-sums", action=argparse.BooleanOptionalAction, default=None,
                   help="value dots summed per block by fp32 adds (default: the plan's)")
    p.add_argument("--zero-drain", type=int, default=None,
                   help="affine values' zero point out of the MMA accumulators every N blocks (default: the plan's)")
    p.add_argument("--shuffle-lut", action=argparse.BooleanOptionalAction, default=None,
                   help="turbo centroids by warp shuffles from a per-lane table register (default: the plan's)")
    p.add_argument("--polynomial-levels", action=argparse.BooleanOptionalAction, default=None,
                   help="8-bit turbo levels computed from the code (default), or gathered from their table")
    p.add_argument("--constant-rows", action=argparse.BooleanOptionalAction, default=None,
                   help="row strides compiled in and affine metadata a word a pair (default), or run-time strides")
    p.add_argument("--query-sum-tile", action=argparse.BooleanOptionalAction, default=None,
                   help="affine keys' zero points against the query's sums as an MMA-made score tile (default with "
                        "row groups), or a vector")
    p.add_argument("--keys-major", action=argparse.BooleanOptionalAction, default=None,
                   help="one-warp tiles as scores [keys, rows] and accumulators [dims, rows] (default for affine "
                        "2/4/8-bit and turbo 2/4-bit words from head_dim 96; turbo 8-bit on request), or row-major")
    p.add_argument("--query-row-load", action=argparse.BooleanOptionalAction, default=None,
                   help="affine keys' query planes from one load of the rows (default but for one-warp programs of "
                        "128-key blocks), or a load a plane")
    p.add_argument("--linear-levels", action=argparse.BooleanOptionalAction, default=None,
                   help="2-bit turbo codes read as fields in place, their levels linear in the code's bits "
                        "(default), or looked up")
    p.add_argument("--value-words", action=argparse.BooleanOptionalAction, default=None,
                   help="3-bit values as 16-bit word tiles (default where a row group's sub-block is 16 keys at "
                        "head_dim 128), or byte planes")
    p.add_argument("--maxnreg", type=int, help="a register cap (ptxas; more programs per SM where they fit)")
    p.add_argument("--bool-mask", action="store_true", help="with a bool attention mask (every key kept)")
    p.add_argument("--dump", help="write the whole SASS here")
    p.add_argument("--dump-ttgir", help="write the kernel's TTGIR here")
    p.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    a = p.parse_args(argv)
    sass, res, shared, options, consts, tail, ttgir = compile_sass(
        a.method, a.bits, a.S, D=a.head_dim, G=a.gqa, B=a.batch, HKV=a.kv_heads, L=a.query_len, sms=a.sms,
        bool_mask=a.bool_mask,
        num_warps=a.num_warps,
        block_n=a.block_n, row_groups=a.row_groups, register_lut=a.register_lut, plane_hadamard=a.plane_hadamard,
        block_sums=a.block_sums, zero_drain=a.zero_drain, shuffle_lut=a.shuffle_lut,
        polynomial_levels=a.polynomial_levels,
        constant_rows=a.constant_rows, maxnreg=a.maxnreg, query_sum_tile=a.query_sum_tile, keys_major=a.keys_major,
        query_row_load=a.query_row_load, linear_levels=a.linear_levels, wide_query_rotation=a.wide_query_rotation,
        early_rows=a.early_rows, value_words=a.value_words)
    if a.dump:
        with open(a.dump, "w") as f:
            f.write(sass)
    if a.dump_ttgir:
        with open(a.dump_ttgir, "w") as f:
            f.write(ttgir)
    usage = re.search(r"REG:(\d+) STACK:(\d+)", res)
    n, ops = loop_counts(sass)
    total = len(re.findall(r"^\s+/\*[0-9a-f]{4,}\*/\s+\S", sass, flags=re.M))
    block_n = consts["BLOCK_N"]
    n_parts, split_blocks = tail[1], tail[2]  # the launch's S, n_parts, split_blocks, ...
    split_keys = min(split_blocks * block_n, a.S)
    lookup = co._lut_kind.fn(consts["K_LUT"]) or ("gather" if a.method == "turbo" else "")
    row = dict(method=a.method, bits=a.bits, S=a.S, head_dim=a.head_dim, gqa=a.gqa, num_splits=n_parts,
               program_per_key=round(total / split_keys, 2), lookup=lookup,
               plane_hadamard=consts["K_PLANE_H"], keys_major=consts["KEYS_MAJOR"], instructions=total,
               num_warps=options["num_warps"], block_n=block_n, registers=int(usage.group(1)),
               stack=int(usage.group(2)), shared=shared,
               programs_per_sm_fit=programs_per_sm_fit(int(usage.group(1)), shared, options["num_warps"]),
               loop_instructions=n, per_key=round(n / block_n, 2),
               opcodes=" ".join(f"{k}:{v}" for k, v in ops.most_common()))
    for k in COLUMNS:
        print(f"{k:>17}: {row[k]}")
    print(f"wrote {write_csv([row], os.path.join(a.out, 'decode_sass.csv'), COLUMNS)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
