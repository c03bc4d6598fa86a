"""Expected f32 values for GGUF dequantization, from an implementation independent of ours.

Writes a small GGUF holding one tensor of each of Q4_0, Q4_1, Q5_0, Q8_0, F16, BF16 and F32, made of
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

The scales include positive and negative normal values, +0 and -0, subnormals (0x0001, 0x03ff, 0x8001,
0x83ff), the smallest normals and the largest finite f16 (0x7bff, 0xfbff); never NaN or infinity. In Q4_0,
Q4_1 and Q5_0 every block holds every code (a shuffled 0..15 twice, or 0..31); the first eight Q8_0 blocks
hold a shuffled -128..=127 between them, the others -128, -1, 0, 1, 127 and random codes. Q4_1 adds (d, m)
pairs where z = m + 8 d (the zero point of the `(q - 8) * d + z` form) is not exactly representable in f32
-- e.g. m = 65504, d = 2^-24 -- and pairs on either side of that edge; `q4_1_blocks` in the JSON lists
every block's d, m, z rounded to f32, whether that rounding was exact, and how many of its 32 elements
`(q - 8) * d + z` (in f32) would then differ from `d * q + m`. F16, BF16 and F32 tensors hold -0,
subnormals, the smallest normals, the largest finite values and random finite values.

Before writing the JSON the script reads the GGUF back with `gguf.GGUFReader`, dequantizes the tensor data
it finds there, and checks it is the same as the dequantization of the blocks it wrote, and the same as the
formulas above evaluated exactly (float64, which holds every `d * q + m` of f16 inputs exactly) and rounded
once to f32.

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
        if name in quant:
            entry.update({k: [f"{v:04x}" for v in vals] for k, vals in quant[name][3].items()})
        tensors[tname] = entry
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

    doc = {
        "generated_by": "scripts/gguf_quants_reference.py",
        "command": COMMAND,
        "python_version": platform.python_version(),
        "gguf_version": importlib.metadata.version("gguf"),
        "numpy_version": np.__version__,
        "seed": SEED,
        "gguf_file": GGUF_NAME,
        "gguf_sha256": sha256(gguf_path),
        "gguf_bytes": size,
        "reference": "gguf.quants.dequantize on the blocks written, equal to the same on the data read back by "
        "gguf.GGUFReader and to the ggml formulas evaluated exactly and rounded once to f32",
        "f32_bits_note": "lowercase hex of each element's f32 bit pattern, in GGUF order (dims[0] fastest); "
        "compare as floats (-0 == +0); no NaN or infinity appears",
        "shape_note": "shape is numpy order (outermost first), dims GGUF order (innermost first)",
        "q4_1_z_note": "per block of q4_1.weight: z = m + 8 d rounded to f32, whether that is exact, and how many "
        "of the block's 32 elements (q - 8) * d + z computed in f32 differs from d * q + m in f32",
        "q4_1_z_inexact_blocks": [z["block"] for z in inexact],
        "q4_1_blocks": zs,
        "tensors": tensors,
    }
    with open(json_path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    print(f"{gguf_path}: {size} bytes; {json_path}: {os.path.getsize(json_path)} bytes", flush=True)


if __name__ == "__main__":
    sys.exit(main())
