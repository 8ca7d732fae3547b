"""Repro of a Triton 3.6 miscompile (H200, 2026-12-05; output in triton_join_transposed_operand.log):
3-bit byte planes interleaved into 12-bit half-words by tl.join + tl.reshape come out wrong where the
tile becomes the transposed B operand of a dot (DOT=2), right when stored directly or as a plain B
operand. Needs turboquant at commit 64db8ce (the half-word path, removed after this run):
    git worktree add /tmp/hw 64db8ce && PYTHONPATH=/tmp/hw python triton_join_transposed_operand.py
"""
import torch, triton, triton.language as tl, sys
from turboquant.templates import decode_attention as da
from turboquant.config import KVQuantConfig

@triton.jit
def k(codes_ptr, lut_ptr, out_ptr, BLOCK_N: tl.constexpr, NBYTES: tl.constexpr, PW: tl.constexpr,
      LUT: tl.constexpr, USE_ASM: tl.constexpr, MODE: tl.constexpr, DOT: tl.constexpr):
    n = tl.arange(0, BLOCK_N)
    b0, b1, b2 = da._load_row_bytes(codes_ptr + n[:, None] * NBYTES, n < BLOCK_N, 3, NBYTES, PW, True)
    t = tl.arange(0, PW)
    for s in tl.static_range(4):
        if MODE == 0:
            v = da._plane_values(b0, b1, b2, s, 3, True, lut_ptr, USE_ASM, LUT).to(tl.float32)
        elif MODE == 1:
            v = da._plane_codes(b0, b1, b2, s, 3).to(tl.float32)
        else:
            v = da._field3_lanes(b0, b1, b2, s, USE_ASM).to(tl.float32)
        if DOT == 1:  # as the V loop's B operand
            eye = tl.where(n[:, None] == n[None, :], 1.0, 0.0).to(tl.float16)
            v = tl.dot(eye, v.to(tl.float16))
        elif DOT == 2:  # as the K loop's transposed B operand
            eye = tl.where(t[:, None] == t[None, :], 1.0, 0.0).to(tl.float16)
            v = tl.trans(tl.dot(eye, tl.trans(v.to(tl.float16))))
        tl.store(out_ptr + s * BLOCK_N * PW + n[:, None] * PW + t[None, :], v)

D = 64; NB = 24; N = 64
spec = KVQuantConfig(method="turbo", bits=3).spec("k")
words = da._register_lut_words(spec, D)
DEV = "cuda" if torch.cuda.is_available() else "cpu"; ASM = DEV == "cuda"
lut = da._centroids_fp16(D, 3).to(DEV)
codes = torch.randint(0, 256, (N, NB), dtype=torch.uint8, device=DEV)
# reference codes from bytes: 24-bit word j = c0|c1<<8|c2<<16 (byte planes at j, W+j, 2W+j), dim 8j+s
c = codes.cpu().long(); W = NB // 3
ref = torch.zeros(4, N, 16)
tab = lut.float().cpu()
for s in range(4):
    for col in range(16):
        j, h = divmod(col, 2)
        w = c[:, j] | c[:, W + j] << 8 | c[:, 2 * W + j] << 16
        ref[s, :, col] = ((w >> (12 * h + 3 * s)) & 7).float()
def report(res):
 for (warps, name), out in res.items():
    if name == "codes":
        print(warps, name, "mismatches", (out != ref).sum().item())
    elif name == "lanes":
        print(warps, name, "mismatches", sum((out[s] != ref[s] * 2 ** da._field3_shift.fn(s)).sum().item() for s in range(4)))
    else:
        bad = (out != tab[ref.long()])
        print(warps, name, "mismatches", bad.sum().item(), "per plane", bad.sum((1, 2)).tolist())
        if bad.any():
            s_ = bad.sum((1, 2)).nonzero()[0].item(); r = bad[s_].nonzero()[0, 0].item()
            print("  plane", s_, "row", r, "got", out[s_, r].tolist(), "want", tab[ref.long()][s_, r].tolist(), "codes", ref[s_, r].tolist())

res = {}
for warps, dot in ((1, 0), (4, 0), (1, 1), (4, 1), (1, 2), (4, 2)):
  print("warps", warps, "dot", dot); res = {}
  for name, LUT, mode in (("gather", "", 0), ("shfl", "shfl:" + words, 0), ("prmt", "prmt:" + words, 0),
                            ("codes", "", 1), ("lanes", "", 2)):
        out = torch.zeros(4, N, 16, device=DEV)
        try:
            k[(1,)](codes, lut, out, N, NB, 16, LUT, ASM, mode, dot, num_warps=warps)
        except Exception as e:
            print(warps, name, type(e).__name__, str(e)[:300]); continue
        res[(warps, name)] = out.cpu()
  report(res)
