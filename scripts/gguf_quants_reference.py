"""Expected f32 values for GGUF dequantization, from an implementation independent of ours.

Writes a small GGUF holding one tensor of each of Q4_0, Q4_1, Q5_0, Q8_0, F16, BF16, F32, Q4_K and Q6_K, made of
random but valid blocks (fixed seed) plus blocks chosen by hand for their scales, and beside it a JSON
with what the `gguf` package (llama.cpp's own Python package: `gguf.quants.dequantize`, numpy code that
shares nothing with crates/int4-gguf) dequantizes every tensor to, as f32 bit patterns.
crates/int4-gguf/tests/quants_reference.rs compares `GgufFile::tensor_f32` against it, exactly.

The blocks (ggml's layouts; `d`, `m` are IEEE f16, little-endian; element j < 16 of a block is the low
nibble of byte j of the codes, element j >= 16 the high nibble of byte j - 16):

    Q4_0 (id 2, 18 bytes):  d, 16 bytes of nibbles                  w = d * (q - 8)
    Q4_1 (id 3, 20 bytes):  d, m, 16 bytes of nibbles               w = d * q + m
    Q5_0 (id 6, 22 bytes):  d, u32 qh (bit j = 5th bit of element j), 16 bytes of nibbles
                                                                    w = d * (q - 16)
    Q8_0 (id 8, 34 bytes):  d, 32 int8                              w = d * q

and the K-quants, super-blocks of 256 elements (ggml-common.h's block_q4_K and block_q6_K):

    Q4_K (id 12, 144 bytes): d, dmin, 12 bytes packing 8 six-bit scales sc_j and 8 six-bit mins m_j (ggml's
        get_scale_min_k4), 128 bytes of nibbles: element 64 k + l (l < 32) is the low nibble of byte 32 k + l,
        element 64 k + 32 + l its high nibble; sub-block j = element // 32.
                                                                    w = d * sc_j * q - dmin * m_j
    Q6_K (id 14, 210 bytes): ql[128], qh[64], int8 scales[16], d; in each half n (128 elements, ql + 64 n,
        qh + 32 n), for l < 32: element l, l + 32, l + 64, l + 96 = low nibble of ql[l], low of ql[l + 32],
        high of ql[l], high of ql[l + 32], each with bits 0-1, 2-3, 4-5, 6-7 of qh[l] above it; the scale of
        element e is scales[e // 16].                               w = d * sc * (q - 32)

The scales include positive and negative normal values, +0 and -0, subnormals (0x0001, 0x03ff, 0x8001,
0x83ff), the smallest normals and the largest finite f16 (0x7bff, 0xfbff); never NaN or infinity. In Q4_0,
Q4_1 and Q5_0 every block holds every code (a shuffled 0..15 twice, or 0..31); the first eight Q8_0 blocks
hold a shuffled -128..=127 between them, the others -128, -1, 0, 1, 127 and random codes. Q4_1 adds (d, m)
pairs where z = m + 8 d (the zero point of the `(q - 8) * d + z` form) is not exactly representable in f32
-- e.g. m = 65504, d = 2^-24 -- and pairs on either side of that edge; `q4_1_blocks` in the JSON lists
every block's d, m, z rounded to f32, whether that rounding was exact, and how many of its 32 elements
`(q - 8) * d + z` (in f32) would then differ from `d * q + m`. F16, BF16 and F32 tensors hold -0,
subnormals, the smallest normals, the largest finite values and random finite values.

The K-quant tensors (q4_k.weight [8, 512] and q6_k.weight [16, 256], 16 super-blocks each) come from a
second generator (seed SEED + 1), so the tensors above keep the bytes they had before the K-quants were
added; they are written after them. In both, super-blocks 0-11 have d = +-1, +-0, the four subnormals,
the smallest normals and +-65504; the last four are random bytes with a random finite d (and dmin). Q4_K's
dmin takes every one of those specials too (paired so that d * sc * q and dmin * m are far apart, e.g.
d = 2^-24 with dmin = 65504); its 6-bit scales and mins each take every value 0..=63, and every sub-block of
32 holds every code twice. Every one of Q6_K's special super-blocks has the int8 scales -128, -1, 0 and 127
among its 16 and every code 0..=63, each group of 16 (one scale) codes 0 and 63 (q - 32 = -32 and 31).

The order of operations. ggml-quants.c computes Q4_K as `d1 * q - m1` with d1 = d * sc, m1 = dmin * m (f32
products) and Q6_K as `d * sc[is] * q`, i.e. (d * sc) * q, in f32; gguf-py computes the same products in
the same order (numpy float32 arrays: `d * sc`, `dmin * m`, then `d * q - dm`; `d * scales`, then `* q`).
The script evaluates ggml's C functions statement for statement in numpy float32 scalars, from the bytes,
and records in the JSON (`c_order_differs`, `c_order_differs_elements`, `k_quants_order`) every element
where that differs from gguf-py, by f32 bits; where any does, the tensor also carries `c_order_f32_bits`.
It also counts which steps rounded: an f16 times a 6-bit or 8-bit integer, and that times a 4-bit or
6-bit code, are exact in f32 (at most 11 + 7 + 6 significant bits), so only Q4_K's subtraction can round,
and there fma(d1, q, -m1) (a compiler contracting the C) rounds the same exact value once, the same way;
the script checks that too (`fma_order_differs`), and Q6_K's other association d * (sc * q)
(`d_times_sc_q_order_differs`), which is equal in value but loses -0 where sc * q is an integer 0.

Before writing the JSON the script reads the GGUF back with `gguf.GGUFReader`, dequantizes the tensor data
it finds there, and checks it is the same as the dequantization of the blocks it wrote, and the same as the
formulas above evaluated exactly (float64, which holds every `d * q + m` of f16 inputs exactly; for the
K-quants the exact value, a Fraction, is asserted to be a float64) and rounded once to f32.

Run by hand (not by CI), from the repository root, in a throwaway virtualenv:

    python3 -m venv /tmp/ggufenv
    /tmp/ggufenv/bin/pip install gguf==0.19.0 numpy==2.4.6
    /tmp/ggufenv/bin/python scripts/gguf_quants_reference.py

Output (paths resolved from this file's location): crates/int4-gguf/tests/fixtures/quants_reference.gguf
and crates/int4-gguf/tests/fixtures/quants_reference.json. The output is deterministic: a rerun with the
same versions writes the same bytes.
"""
import hashlib
import importlib.metadata
import json
import os
import platform
import sys
from fractions import Fraction

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.quants import dequantize

SEED = 20240521
COMMAND = (
    "python3 -m venv /tmp/ggufenv && /tmp/ggufenv/bin/pip install gguf==0.19.0 numpy==2.4.6 && "
    "/tmp/ggufenv/bin/python scripts/gguf_quants_reference.py"
)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "crates", "int4-gguf", "tests", "fixtures")
GGUF_NAME = "quants_reference.gguf"
JSON_NAME = "quants_reference.json"

# f16 bit patterns of the special scales.
F16_SPECIAL = [
    0x3C00,  # 1.0
    0xBC00,  # -1.0
    0x0000,  # +0
    0x8000,  # -0
    0x0001,  # smallest subnormal, 2^-24
    0x03FF,  # largest subnormal
    0x8001,  # -2^-24
    0x83FF,  # -largest subnormal
    0x0400,  # smallest normal, 2^-14
    0x8400,  # -smallest normal
    0x7BFF,  # 65504, largest finite
    0xFBFF,  # -65504
    0x3555,  # ~1/3
    0x2E66,  # ~0.1
    0xC900,  # -10
    0x1C00,  # 2^-8
]

# (d, m) f16 bit patterns for Q4_1, chosen by hand.
Q4_1_SPECIAL = [
    (0x3C00, 0x0000),  # d = 1, m = +0
    (0x3C00, 0x8000),  # d = 1, m = -0
    (0x8000, 0x8000),  # d = -0, m = -0: every element is -0
    (0x0000, 0x0000),  # all +0
    (0x0000, 0x3C00),  # d = 0: every element is m
    (0x0001, 0x0001),  # subnormal d and m
    (0x03FF, 0x83FF),  # largest subnormal d, its negative as m
    (0x8001, 0x03FF),  # negative subnormal d
    (0x83FF, 0x0001),  # negative largest subnormal d
    (0x0400, 0x8400),  # smallest normal d, its negative as m
    (0x8400, 0x0400),  # and the other way round
    (0x7BFF, 0xFBFF),  # d = 65504, m = -65504
    (0xFBFF, 0x7BFF),  # d = -65504, m = 65504
    (0x7BFF, 0x7BFF),  # d = m = 65504 (largest element 16 * 65504)
    (0x0001, 0x7BFF),  # m = 65504, d = 2^-24: z = m + 8 d not exact in f32
    (0x8001, 0x7BFF),  # m = 65504, d = -2^-24: not exact
    (0x0001, 0xFBFF),  # m = -65504, d = 2^-24: not exact
    (0x0401, 0x6400),  # m = 1024, d = 2^-14 (1 + 2^-10): not exact
    (0x0001, 0x4400),  # m = 4, d = 2^-24: 4 + 2^-21 spans 24 bits, exact
    (0x0001, 0x4800),  # m = 8, d = 2^-24: 8 + 2^-21 spans 25 bits, not exact
    (0x8001, 0x4800),  # m = 8, d = -2^-24: 8 - 2^-21 falls below 8, spans 24 bits, exact
    (0x0003, 0x4800),  # m = 8, d = 3 * 2^-24: not exact
    (0x0002, 0x4800),  # m = 8, d = 2^-23: 8 + 2^-20 exact
    (0x3C01, 0x7800),  # m = 32768, d = 1 + 2^-10: exact (spans 19 bits)
    (0x1001, 0x7800),  # m = 32768, d = 2^-11 (1 + 2^-10): not exact
    (0x1001, 0xF800),  # m = -32768, same d: not exact
    (0x0400, 0x7BFF),  # m = 65504, d = 2^-14: 65504 + 2^-11 spans 27 bits, not exact
    (0x5BFF, 0xE3FF),  # d = 255.875, m = -1023.5: exact
]


def f16_value(bits):
    return float(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def random_normal_f16(rng, n, min_exp=1, max_exp=30):
    """n random normal f16 bit patterns (random sign, biased exponent in [min_exp, max_exp], mantissa)."""
    sign = rng.integers(0, 2, n) << 15
    exp = rng.integers(min_exp, max_exp + 1, n) << 10
    mant = rng.integers(0, 1024, n)
    return [int(x) for x in (sign | exp | mant)]


def random_f16_any(rng, n):
    """n random finite f16 patterns, subnormals included."""
    out = []
    while len(out) < n:
        b = int(rng.integers(0, 1 << 16))
        if (b >> 10) & 0x1F != 0x1F:
            out.append(b)
    return out


def f16_bytes(bits):
    return int(bits).to_bytes(2, "little")


def nibbles(codes):
    """16 bytes: element j < 16 in the low nibble of byte j, element j >= 16 in the high nibble of byte j - 16."""
    assert len(codes) == 32
    return bytes((codes[j] & 0xF) | ((codes[j + 16] & 0xF) << 4) for j in range(16))


def all_codes_shuffled(rng, n_codes):
    """32 codes in 0..n_codes, each value present (n_codes = 16: twice each; 32: once each)."""
    codes = np.tile(np.arange(n_codes), 32 // n_codes)
    return [int(c) for c in rng.permutation(codes)]


def padded(scales, per_row, rng, make):
    """Pad a list of block parameters with random ones up to a multiple of per_row."""
    scales = list(scales)
    while len(scales) % per_row:
        scales.append(make(rng))
    return scales


def build_q4_0(rng):
    scales = F16_SPECIAL + random_normal_f16(rng, 5)
    scales = padded(scales, 3, rng, lambda r: random_normal_f16(r, 1)[0])
    blocks, codes = [], []
    for d in scales:
        c = all_codes_shuffled(rng, 16)
        blocks.append(f16_bytes(d) + nibbles(c))
        codes.append(c)
    exact = [[f16_value(d) * (q - 8) for q in c] for d, c in zip(scales, codes)]
    return blocks, 3, {"scales_f16_bits": scales}, exact


def build_q4_1(rng):
    pairs = list(Q4_1_SPECIAL)
    # Random pairs: d and m of any finite value, subnormals included.
    for _ in range(8):
        d, m = random_f16_any(rng, 2)
        pairs.append((d, m))
    # Random normal pairs with a wide exponent gap (m large, d small): z mostly not exact.
    for _ in range(4):
        pairs.append((random_normal_f16(rng, 1, 1, 8)[0], random_normal_f16(rng, 1, 22, 30)[0]))
    pairs = padded(pairs, 4, rng, lambda r: tuple(random_normal_f16(r, 2)))
    blocks, codes = [], []
    for d, m in pairs:
        c = all_codes_shuffled(rng, 16)
        blocks.append(f16_bytes(d) + f16_bytes(m) + nibbles(c))
        codes.append(c)
    exact = [[f16_value(d) * q + f16_value(m) for q in c] for (d, m), c in zip(pairs, codes)]
    extra = {"scales_f16_bits": [d for d, _ in pairs], "mins_f16_bits": [m for _, m in pairs]}
    return blocks, 4, extra, exact, pairs, codes


def build_q5_0(rng):
    scales = F16_SPECIAL + random_normal_f16(rng, 4)
    scales = padded(scales, 2, rng, lambda r: random_normal_f16(r, 1)[0])
    blocks, codes = [], []
    for d in scales:
        c = all_codes_shuffled(rng, 32)
        qh = 0
        for j in range(32):
            qh |= ((c[j] >> 4) & 1) << j
        blocks.append(f16_bytes(d) + qh.to_bytes(4, "little") + nibbles(c))
        codes.append(c)
    exact = [[f16_value(d) * (q - 16) for q in c] for d, c in zip(scales, codes)]
    return blocks, 2, {"scales_f16_bits": scales}, exact


def build_q8_0(rng):
    scales = F16_SPECIAL + random_normal_f16(rng, 8)
    scales = padded(scales, 2, rng, lambda r: random_normal_f16(r, 1)[0])
    perm = [int(x) for x in rng.permutation(np.arange(-128, 128))]
    blocks, codes = [], []
    for i, d in enumerate(scales):
        if i < 8:
            c = perm[32 * i : 32 * i + 32]
        else:
            c = [-128, -1, 0, 1, 127] + [int(x) for x in rng.integers(-128, 128, 27)]
            c = [int(x) for x in rng.permutation(c)]
        blocks.append(f16_bytes(d) + bytes(q & 0xFF for q in c))
        codes.append(c)
    assert sorted(set(q for c in codes for q in c)) == list(range(-128, 128))
    exact = [[f16_value(d) * q for q in c] for d, c in zip(scales, codes)]
    return blocks, 2, {"scales_f16_bits": scales}, exact


# K-quants: super-blocks of QK_K = 256 elements, laid out as ggml-common.h's block_q4_K / block_q6_K.
QK_K = 256
# A separate generator, so the draws above (and so the other tensors' bytes) are what they were before
# the K-quants were added.
K_SEED = SEED + 1
# d of the first 12 super-blocks of both types: +-1, +-0, the four subnormals, the smallest normals and
# the largest finite f16. The last 4 super-blocks of each type are random bytes with a random finite d.
K_D_SPECIAL = F16_SPECIAL[:12]
# dmin of Q4_K's first 12 super-blocks, paired with K_D_SPECIAL: every special again, in pairs where
# d * sc * q and dmin * m are far apart (d = 2^-24 with dmin = 65504, d = 65504 with dmin = -2^-14, ...).
Q4_K_DMIN_SPECIAL = [0x7BFF, 0x0001, 0x8000, 0x0000, 0x7BFF, 0xFBFF, 0x03FF, 0x8001, 0x83FF, 0x0400, 0x8400, 0x3C00]
K_RANDOM_BLOCKS = 4
# int8 scales put into every one of Q6_K's first 12 super-blocks.
Q6_K_SCALE_SPECIAL = [-128, -1, 0, 127]


def f16_f32(bits):
    return np.float32(np.array([bits], dtype=np.uint16).view(np.float16)[0])


def exact_f64(x):
    """x (a Fraction) as a float64, asserting that is exact: then one rounding to f32 follows."""
    f = float(x)
    assert Fraction(f) == x, x
    return f


def pack_q4_k_scales(sc, mn):
    """12 bytes holding 8 six-bit scales and 8 six-bit mins, the inverse of ggml's get_scale_min_k4."""
    q = [0] * 12
    for j in range(4):
        q[j] = sc[j] | ((sc[j + 4] >> 4) << 6)
        q[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6)
        q[j + 8] = (sc[j + 4] & 0xF) | ((mn[j + 4] & 0xF) << 4)
    return bytes(q)


def get_scale_min_k4(j, q):
    """ggml-quants.c's get_scale_min_k4, verbatim."""
    if j < 4:
        return q[j] & 63, q[j + 4] & 63
    return (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4)


def pack_q4_k_codes(codes):
    """128 bytes of nibbles: element 64 k + l (l < 32) is the low nibble of byte 32 k + l, element
    64 k + 32 + l its high nibble."""
    out = bytearray(128)
    for k in range(4):
        for l in range(32):
            out[32 * k + l] = codes[64 * k + l] | (codes[64 * k + 32 + l] << 4)
    return bytes(out)


def build_q4_k(rng):
    n_special = len(K_D_SPECIAL)
    # Every 6-bit scale and min appears among the special super-blocks' 96 sub-blocks.
    sc_all = [int(x) for x in rng.permutation(list(range(64)) + [int(v) for v in rng.integers(0, 64, 8 * n_special - 64)])]
    mn_all = [int(x) for x in rng.permutation(list(range(64)) + [int(v) for v in rng.integers(0, 64, 8 * n_special - 64)])]
    d_bits, dmin_bits, scs, mns, blocks = [], [], [], [], []
    for i in range(n_special + K_RANDOM_BLOCKS):
        if i < n_special:
            d, dmin = K_D_SPECIAL[i], Q4_K_DMIN_SPECIAL[i]
            sc, mn = sc_all[8 * i : 8 * i + 8], mn_all[8 * i : 8 * i + 8]
            scales = pack_q4_k_scales(sc, mn)
            # Each sub-block of 32 holds every code twice.
            codes = [c for _ in range(8) for c in all_codes_shuffled(rng, 16)]
            qs = pack_q4_k_codes(codes)
        else:
            if i < n_special + 2:
                d, dmin = random_f16_any(rng, 2)
            else:  # small d, large dmin: the subtraction rounds
                d, dmin = random_normal_f16(rng, 1, 1, 8)[0], random_normal_f16(rng, 1, 22, 30)[0]
            scales = rng.integers(0, 256, 12, dtype=np.uint8).tobytes()
            qs = rng.integers(0, 256, 128, dtype=np.uint8).tobytes()
        block = f16_bytes(d) + f16_bytes(dmin) + scales + qs
        assert len(block) == 144
        pair = [get_scale_min_k4(j, scales) for j in range(8)]
        if i < n_special:
            assert [p[0] for p in pair] == sc and [p[1] for p in pair] == mn
        d_bits.append(d)
        dmin_bits.append(dmin)
        scs += [p[0] for p in pair]
        mns += [p[1] for p in pair]
        blocks.append(block)
    assert set(scs) == set(range(64)) and set(mns) == set(range(64))
    # Exact values from the parameters (not from the packed bytes): d * sc * q - dmin * m.
    exact = []
    for i, b in enumerate(blocks):
        d, dmin = Fraction(f16_value(d_bits[i])), Fraction(f16_value(dmin_bits[i]))
        codes = [(b[16 + 32 * (e // 64) + e % 32] >> (4 * ((e % 64) // 32))) & 0xF for e in range(QK_K)]
        row = []
        for e, q in enumerate(codes):
            j = e // 32
            row.append(exact_f64(d * scs[8 * i + j] * q - dmin * mns[8 * i + j]))
        exact.append(row)
    extra = {"scales_f16_bits": d_bits, "mins_f16_bits": dmin_bits, "sub_scales": scs, "sub_mins": mns}
    return blocks, 2, extra, exact


def pack_q6_k_codes(L):
    """ql (128 bytes) and qh (64 bytes) of 256 six-bit codes, as ggml's quantize_row_q6_K_ref packs them."""
    ql, qh = bytearray(128), bytearray(64)
    for n in (0, 128):
        for l in range(32):
            a, b, c, e = L[n + l], L[n + l + 32], L[n + l + 64], L[n + l + 96]
            ql[n // 2 + l] = (a & 0xF) | ((c & 0xF) << 4)
            ql[n // 2 + l + 32] = (b & 0xF) | ((e & 0xF) << 4)
            qh[n // 4 + l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6)
    return bytes(ql), bytes(qh)


def unpack_q6_k_codes(ql, qh):
    """The 256 codes (0..=63) of ql and qh, ggml's dequantize_row_q6_K's indexing."""
    L = [0] * 256
    for n in (0, 128):
        for l in range(32):
            h = qh[n // 4 + l]
            L[n + l] = (ql[n // 2 + l] & 0xF) | (((h >> 0) & 3) << 4)
            L[n + l + 32] = (ql[n // 2 + l + 32] & 0xF) | (((h >> 2) & 3) << 4)
            L[n + l + 64] = (ql[n // 2 + l] >> 4) | (((h >> 4) & 3) << 4)
            L[n + l + 96] = (ql[n // 2 + l + 32] >> 4) | (((h >> 6) & 3) << 4)
    return L


def build_q6_k(rng):
    n_special = len(K_D_SPECIAL)
    d_bits, scs, blocks, all_codes = [], [], [], []
    for i in range(n_special + K_RANDOM_BLOCKS):
        if i < n_special:
            d = K_D_SPECIAL[i]
            sc = Q6_K_SCALE_SPECIAL + [int(v) for v in rng.integers(-128, 128, 16 - len(Q6_K_SCALE_SPECIAL))]
            sc = [int(x) for x in rng.permutation(sc)]
            # Every group of 16 (one scale) holds codes 0 and 63 (q - 32 = -32 and 31); the block holds
            # every code 0..=63.
            pool = [int(x) for x in rng.permutation(list(range(64)) * 3 + [int(v) for v in rng.integers(0, 64, 32)])]
            codes = []
            for g in range(16):
                codes += [int(x) for x in rng.permutation([0, 63] + pool[14 * g : 14 * g + 14])]
            assert set(codes) == set(range(64))
            ql, qh = pack_q6_k_codes(codes)
            sc_bytes = bytes(s & 0xFF for s in sc)
        else:
            d = random_f16_any(rng, 1)[0]
            ql = rng.integers(0, 256, 128, dtype=np.uint8).tobytes()
            qh = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
            sc_bytes = rng.integers(0, 256, 16, dtype=np.uint8).tobytes()
            codes = unpack_q6_k_codes(ql, qh)
        assert unpack_q6_k_codes(ql, qh) == codes
        block = ql + qh + sc_bytes + f16_bytes(d)
        assert len(block) == 210
        d_bits.append(d)
        scs += [int(x) for x in np.frombuffer(sc_bytes, dtype=np.int8)]
        blocks.append(block)
        all_codes.append(codes)
    for s in Q6_K_SCALE_SPECIAL:
        assert s in scs
    exact = []
    for i, codes in enumerate(all_codes):
        d = Fraction(f16_value(d_bits[i]))
        exact.append([exact_f64(d * scs[16 * i + e // 16] * (q - 32)) for e, q in enumerate(codes)])
    extra = {"scales_f16_bits": d_bits, "sub_scales": scs}
    return blocks, 1, extra, exact


def c_order_q4_k(block):
    """ggml-quants.c's dequantize_row_q4_K for one super-block, statement for statement in numpy float32
    scalars; with the rounding of each step and the fused-multiply-add alternative fma(d1, q, -m1)."""
    d, dmin = f16_f32(int.from_bytes(block[0:2], "little")), f16_f32(int.from_bytes(block[2:4], "little"))
    scales, q = block[4:16], block[16:144]
    y, fma, steps = [], [], {"d1_or_m1_rounded": 0, "d1_q_rounded": 0, "result_rounded": 0}
    is_, qo = 0, 0
    for _ in range(0, QK_K, 64):
        sc, m = get_scale_min_k4(is_ + 0, scales)
        d1, m1 = d * np.float32(sc), dmin * np.float32(m)
        steps["d1_or_m1_rounded"] += int(Fraction(float(d1)) != Fraction(float(d)) * sc)
        steps["d1_or_m1_rounded"] += int(Fraction(float(m1)) != Fraction(float(dmin)) * m)
        sc, m = get_scale_min_k4(is_ + 1, scales)
        d2, m2 = d * np.float32(sc), dmin * np.float32(m)
        steps["d1_or_m1_rounded"] += int(Fraction(float(d2)) != Fraction(float(d)) * sc)
        steps["d1_or_m1_rounded"] += int(Fraction(float(m2)) != Fraction(float(dmin)) * m)
        for dk, mk, shift in ((d1, m1, 0), (d2, m2, 4)):
            for l in range(32):
                qq = (q[qo + l] >> shift) & 0xF
                prod = dk * np.float32(qq)
                w = prod - mk
                steps["d1_q_rounded"] += int(Fraction(float(prod)) != Fraction(float(dk)) * qq)
                exact = Fraction(float(dk)) * qq - Fraction(float(mk))
                steps["result_rounded"] += int(Fraction(float(w)) != exact)
                y.append(w)
                # fma: the float64 product and difference are exact (asserted), so rounding them once to
                # f32 is fma(d1, q, -m1), signed zeros included.
                f = np.float64(dk) * np.float64(qq) - np.float64(mk)
                assert Fraction(float(f)) == exact
                fma.append(np.float32(f))
        qo += 32
        is_ += 2
    return y, fma, steps


def c_order_q6_k(block):
    """ggml-quants.c's dequantize_row_q6_K for one super-block, `d * sc[is] * q` left to right in numpy
    float32 scalars; with d * (sc * q) (the integer product first) as the alternative association."""
    ql, qh = block[0:128], block[128:192]
    sc = [int(x) for x in np.frombuffer(block[192:208], dtype=np.int8)]
    d = f16_f32(int.from_bytes(block[208:210], "little"))
    y, alt = [0.0] * QK_K, [0.0] * QK_K
    steps = {"d_sc_rounded": 0, "d_sc_q_rounded": 0}
    for n in (0, 128):
        for l in range(32):
            is_ = l // 16
            h = qh[n // 4 + l]
            q1 = ((ql[n // 2 + l] & 0xF) | (((h >> 0) & 3) << 4)) - 32
            q2 = ((ql[n // 2 + l + 32] & 0xF) | (((h >> 2) & 3) << 4)) - 32
            q3 = ((ql[n // 2 + l] >> 4) | (((h >> 4) & 3) << 4)) - 32
            q4 = ((ql[n // 2 + l + 32] >> 4) | (((h >> 6) & 3) << 4)) - 32
            for off, s, qq in ((0, sc[n // 16 + is_ + 0], q1), (32, sc[n // 16 + is_ + 2], q2),
                               (64, sc[n // 16 + is_ + 4], q3), (96, sc[n // 16 + is_ + 6], q4)):
                dsc = d * np.float32(s)
                w = dsc * np.float32(qq)
                steps["d_sc_rounded"] += int(Fraction(float(dsc)) != Fraction(float(d)) * s)
                steps["d_sc_q_rounded"] += int(Fraction(float(w)) != Fraction(float(dsc)) * qq)
                y[n + l + off] = w
                alt[n + l + off] = d * np.float32(s * qq)
    return y, alt, steps


def plain_values(rng, special, random_bits, bits_dtype, n):
    vals = list(special)
    while len(vals) < n:
        vals.append(random_bits(rng))
    return np.array(vals[:n], dtype=bits_dtype)


def random_finite_bf16(rng):
    while True:
        b = int(rng.integers(0, 1 << 16))
        if (b >> 7) & 0xFF != 0xFF:
            return b


def random_finite_f32(rng):
    while True:
        b = int(rng.integers(0, 1 << 32, dtype=np.uint64))
        if (b >> 23) & 0xFF != 0xFF:
            return b


BF16_SPECIAL = [0x3F80, 0xBF80, 0x0000, 0x8000, 0x0001, 0x007F, 0x8001, 0x807F, 0x0080, 0x8080, 0x7F7F, 0xFF7F]
F32_SPECIAL = [
    0x3F800000, 0xBF800000, 0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x80000001, 0x807FFFFF,
    0x00800000, 0x80800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x477FE000, 0x33800000,
]


def f32_of_exact(rows):
    """Round float64 values (exact here) once to f32."""
    return np.array(rows, dtype=np.float64).astype(np.float32)


def bits_hex(a):
    return [f"{int(x):08x}" for x in np.ascontiguousarray(a, dtype=np.float32).reshape(-1).view(np.uint32)]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    rng = np.random.default_rng(SEED)
    os.makedirs(FIXTURES, exist_ok=True)
    gguf_path = os.path.join(FIXTURES, GGUF_NAME)
    json_path = os.path.join(FIXTURES, JSON_NAME)

    q4_1 = build_q4_1(rng)
    quant = {
        "q4_0": (GGMLQuantizationType.Q4_0, *build_q4_0(rng)),
        "q4_1": (GGMLQuantizationType.Q4_1, *q4_1[:4]),
        "q5_0": (GGMLQuantizationType.Q5_0, *build_q5_0(rng)),
        "q8_0": (GGMLQuantizationType.Q8_0, *build_q8_0(rng)),
    }
    krng = np.random.default_rng(K_SEED)
    kquant = {
        "q4_k": (GGMLQuantizationType.Q4_K, *build_q4_k(krng)),
        "q6_k": (GGMLQuantizationType.Q6_K, *build_q6_k(krng)),
    }
    f16_special = F16_SPECIAL + [0x7BFE, 0x0200, 0x8200]
    plain = {
        "f16": (
            GGMLQuantizationType.F16,
            plain_values(rng, f16_special, lambda r: random_f16_any(r, 1)[0], np.uint16, 2 * 32).view(np.float16),
        ),
        "bf16": (
            GGMLQuantizationType.BF16,
            plain_values(rng, BF16_SPECIAL, random_finite_bf16, np.uint16, 2 * 32),
        ),
        "f32": (
            GGMLQuantizationType.F32,
            plain_values(rng, F32_SPECIAL, random_finite_f32, np.uint32, 2 * 32).view(np.float32),
        ),
    }

    writer = GGUFWriter(gguf_path, arch="llama")
    writer.add_name("int4-gguf quants reference")
    expected_raw = {}
    for name, (qtype, blocks, per_row, extra, exact) in quant.items():
        type_size = len(blocks[0])
        raw = np.frombuffer(b"".join(blocks), dtype=np.uint8).reshape(len(blocks) // per_row, per_row * type_size)
        # A three-dimensional Q8_0, to check the order of dims.
        if name == "q8_0":
            raw = raw.reshape(2, raw.shape[0] // 2, raw.shape[1])
        writer.add_tensor(f"{name}.weight", raw, raw_dtype=qtype)
        expected_raw[name] = (qtype, raw, exact)
    for name, (qtype, arr) in plain.items():
        arr = arr.reshape(2, 32)
        if qtype == GGMLQuantizationType.BF16:
            writer.add_tensor(f"{name}.weight", arr.view(np.uint8).reshape(2, 64), raw_dtype=qtype)
        else:
            writer.add_tensor(f"{name}.weight", arr)
        expected_raw[name] = (qtype, arr, None)
    # The K-quants last, so the tensors above keep their order and relative offsets.
    for name, (qtype, blocks, per_row, extra, exact) in kquant.items():
        type_size = len(blocks[0])
        raw = np.frombuffer(b"".join(blocks), dtype=np.uint8).reshape(len(blocks) // per_row, per_row * type_size)
        writer.add_tensor(f"{name}.weight", raw, raw_dtype=qtype)
        expected_raw[name] = (qtype, raw, exact)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    size = os.path.getsize(gguf_path)
    assert size < 64 * 1024, size

    reader = GGUFReader(gguf_path)
    assert reader.fields["general.architecture"].contents() == "llama"
    read = {t.name: t for t in reader.tensors}
    tensors = {}
    ref_bits = {}
    for name, (qtype, raw, exact) in expected_raw.items():
        tname = f"{name}.weight"
        t = read[tname]
        assert t.tensor_type == qtype, (tname, t.tensor_type)
        ours = dequantize(raw.view(np.uint8) if qtype != GGMLQuantizationType.F16 and qtype != GGMLQuantizationType.F32
                          else raw, qtype)
        from_file = dequantize(np.asarray(t.data), qtype)
        a = np.ascontiguousarray(ours, dtype=np.float32).reshape(-1).view(np.uint32)
        b = np.ascontiguousarray(from_file, dtype=np.float32).reshape(-1).view(np.uint32)
        assert np.array_equal(a, b), tname
        assert np.all(np.isfinite(ours)), tname
        if exact is not None:
            spec = f32_of_exact(exact).reshape(-1).view(np.uint32)
            # Equal as f32 values: the formula's exact -0 * q may come out +0 in float64 arithmetic.
            assert np.array_equal(spec.view(np.float32), a.view(np.float32)), tname
        dims = [int(x) for x in t.shape]  # GGUF order: dims[0] fastest
        entry = {
            "ggml_type": qtype.name,
            "ggml_type_id": int(qtype),
            "shape": list(reversed(dims)),
            "dims": dims,
            "n_elements": int(a.size),
            "f32_bits": bits_hex(ours),
        }
        if name in quant or name in kquant:
            extra = (quant[name] if name in quant else kquant[name])[3]
            entry.update({k: [f"{v:04x}" for v in vals] if k.endswith("_f16_bits") else list(vals)
                          for k, vals in extra.items()})
        tensors[tname] = entry
        ref_bits[name] = a
        print(f"{tname}: {qtype.name} dims {dims}, {a.size} elements", flush=True)

    # Q4_1's zero point z = m + 8 d in f32: exact or not, and what the (q - 8) * d + z form would change.
    _, _, _, _, pairs, codes = q4_1
    zs = []
    for i, ((d_bits, m_bits), c) in enumerate(zip(pairs, codes)):
        d, m = f16_value(d_bits), f16_value(m_bits)
        z_exact = m + 8.0 * d  # exact in float64
        z = np.float32(z_exact)
        d32, m32 = np.float32(d), np.float32(m)
        differ = 0
        for q in c:
            w = d32 * np.float32(q) + m32
            w_z = d32 * np.float32(q - 8) + z
            differ += int(w != w_z)
        zs.append(
            {
                "block": i,
                "d_f16_bits": f"{d_bits:04x}",
                "m_f16_bits": f"{m_bits:04x}",
                "d": d,
                "m": m,
                "z_f32_bits": bits_hex(np.array([z]))[0],
                "z_exact": bool(float(z) == z_exact),
                "elements_differ_with_z": differ,
            }
        )
    inexact = [z for z in zs if not z["z_exact"]]
    print(f"q4_1: {len(inexact)} of {len(zs)} blocks have m + 8d not exact in f32", flush=True)
    for z in inexact:
        print(f"  block {z['block']}: d {z['d_f16_bits']} ({z['d']!r}) m {z['m_f16_bits']} ({z['m']!r}) "
              f"z {z['z_f32_bits']}, {z['elements_differ_with_z']} of 32 elements differ", flush=True)

    # K-quants: gguf-py's values against ggml's C order of operations evaluated in numpy float32 scalars
    # (and against the other order a C compiler or a port might use).
    c_order_differs, c_order_elements, k_order = {}, {}, {}
    for name, (qtype, blocks, per_row, extra, exact) in kquant.items():
        tname = f"{name}.weight"
        c_vals, alt_vals, totals = [], [], {}
        for block in blocks:
            y, alt, steps = (c_order_q4_k if name == "q4_k" else c_order_q6_k)(block)
            c_vals += y
            alt_vals += alt
            for k, v in steps.items():
                totals[k] = totals.get(k, 0) + v
        c_bits = np.array(c_vals, dtype=np.float32).view(np.uint32)
        alt_bits = np.array(alt_vals, dtype=np.float32).view(np.uint32)
        ref = ref_bits[name]
        differ = [int(i) for i in np.nonzero(c_bits != ref)[0]]
        differ_value = int(np.count_nonzero(c_bits.view(np.float32) != ref.view(np.float32)))
        alt_differ = int(np.count_nonzero(alt_bits != ref))
        alt_differ_value = int(np.count_nonzero(alt_bits.view(np.float32) != ref.view(np.float32)))
        c_order_differs[tname] = len(differ)
        c_order_elements[tname] = [
            {"element": i, "block": i // QK_K, "gguf_py_f32_bits": f"{int(ref[i]):08x}",
             "c_order_f32_bits": f"{int(c_bits[i]):08x}"} for i in differ
        ]
        if differ:
            tensors[tname]["c_order_f32_bits"] = bits_hex(c_bits.view(np.float32))
        alt_name = "fma_order_differs" if name == "q4_k" else "d_times_sc_q_order_differs"
        k_order[tname] = {
            "elements": int(ref.size),
            "c_order_differs_bits": len(differ),
            "c_order_differs_value": differ_value,
            alt_name + "_bits": alt_differ,
            alt_name + "_value": alt_differ_value,
            **totals,
        }
        print(f"{tname}: C order differs from gguf-py in {len(differ)} of {ref.size} elements "
              f"({differ_value} by value); {alt_name} {alt_differ} by bits, {alt_differ_value} by value; rounding steps {totals}", flush=True)

    doc = {
        "generated_by": "scripts/gguf_quants_reference.py",
        "command": COMMAND,
        "python_version": platform.python_version(),
        "gguf_version": importlib.metadata.version("gguf"),
        "numpy_version": np.__version__,
        "seed": SEED,
        "k_seed": K_SEED,
        "gguf_file": GGUF_NAME,
        "gguf_sha256": sha256(gguf_path),
        "gguf_bytes": size,
        "reference": "gguf.quants.dequantize on the blocks written, equal to the same on the data read back by "
        "gguf.GGUFReader and to the ggml formulas evaluated exactly and rounded once to f32 (Q4_K, Q6_K: "
        "d*sc*q - dmin*m and d*sc*(q-32) from the parameters the blocks were packed from)",
        "f32_bits_note": "lowercase hex of each element's f32 bit pattern, in GGUF order (dims[0] fastest); "
        "compare as floats (-0 == +0); no NaN or infinity appears",
        "shape_note": "shape is numpy order (outermost first), dims GGUF order (innermost first)",
        "q4_1_z_note": "per block of q4_1.weight: z = m + 8 d rounded to f32, whether that is exact, and how many "
        "of the block's 32 elements (q - 8) * d + z computed in f32 differs from d * q + m in f32",
        "q4_1_z_inexact_blocks": [z["block"] for z in inexact],
        "k_quants_note": "q4_k.weight and q6_k.weight: extra per super-block: scales_f16_bits = d, mins_f16_bits = "
        "dmin (Q4_K), sub_scales = the 8 six-bit scales (Q4_K) or 16 int8 scales (Q6_K) per super-block, "
        "sub_mins = Q4_K's 8 six-bit mins, in super-block order. f32_bits is gguf-py's dequantization.",
        "c_order_note": "c_order_differs: per K-quant tensor, how many elements' f32 bits differ between gguf-py "
        "and ggml-quants.c's dequantize_row_q4_K / dequantize_row_q6_K evaluated statement for statement in "
        "float32 (Q4_K: d1 = d*sc, m1 = dmin*m, d1*q - m1; Q6_K: (d*sc)*q); c_order_differs_elements lists them; "
        "where any differ the tensor also carries c_order_f32_bits. k_quants_order: the same counts by bits and by "
        "value, the alternative orders (Q4_K: fma(d1, q, -m1), one rounding; Q6_K: d*(sc*q)) and how many "
        "intermediate steps of the C order rounded (d1_or_m1_rounded counts products, two per sub-block)",
        "c_order_differs": c_order_differs,
        "c_order_differs_elements": c_order_elements,
        "k_quants_order": k_order,
        "q4_1_blocks": zs,
        "tensors": tensors,
    }
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{gguf_path}: {size} bytes; {json_path}: {os.path.getsize(json_path)} bytes", flush=True)


if __name__ == "__main__":
    sys.exit(main())
