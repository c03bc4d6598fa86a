//! GGUF dequantization against an independent reference: llama.cpp's own Python package.
//!
//! What it proves: [`GgufFile::tensor_f32`] turns Q4_0, Q4_1, Q5_0, Q8_0, F16, BF16, F32, Q4_K and Q6_K tensors into
//! exactly the f32 values `gguf.quants.dequantize` (gguf 0.19.0, numpy code sharing nothing with this
//! crate) gives for the same bytes — every element compared as f32 (`==`, so -0 and +0 are equal; no NaN
//! occurs) — and reads their names, types and dims as the `gguf` writer wrote them.
//!
//! The fixture (`fixtures/quants_reference.gguf`, 9.2 KB, and `fixtures/quants_reference.json`, 207 KB, the
//! expected values as f32 bit patterns) was made by `scripts/gguf_quants_reference.py`, run by hand:
//!
//! ```text
//! python3 -m venv /tmp/ggufenv && /tmp/ggufenv/bin/pip install gguf==0.19.0 numpy==2.4.6 && \
//!     /tmp/ggufenv/bin/python scripts/gguf_quants_reference.py
//! ```
//!
//! (versions, seed and command are recorded in the JSON). Its blocks are random with a fixed seed plus
//! scales chosen by hand: ±normal, ±0, f16 subnormals (0x0001, 0x03ff, 0x8001, 0x83ff), the smallest
//! normals and the largest finite f16 (0x7bff, 0xfbff); every 4- and 5-bit block holds every code and the
//! Q8_0 tensor every value of -128..=127. The script checked the reference against the ggml formulas
//! evaluated exactly and rounded once to f32, and against the tensor data read back from the file.
//!
//! Q4_1 also carries (d, m) pairs where the zero point z = m + 8 d is not exactly representable in f32
//! (m = 65504 with d = 2^-24, and others on either side of the edge): the JSON lists, per block, z rounded
//! to f32 and whether that rounding was exact, and the last test recomputes that list from the blocks the
//! reader returns, so a runtime storing z in f32 knows which groups round.
//!
//! The K-quants (`q4_k.weight` [8, 512] and `q6_k.weight` [16, 256], 16 super-blocks of 256 each) have
//! super-block scales d (and Q4_K's dmin) of ±1, ±0, every f16 subnormal edge, the smallest normals and
//! ±65504, then four random super-blocks; Q4_K's 6-bit scales and mins take every value 0..=63, Q6_K's int8
//! scales include −128, −1, 0 and 127. Order of operations: ggml's C (`dequantize_row_q4_K`: `d1·q − m1`
//! with `d1 = d·sc`, `m1 = dmin·m`; `dequantize_row_q6_K`: `(d·sc)·q`, all f32) and gguf-py compute the same
//! products in the same order, and the script, evaluating the C statement for statement in float32, found
//! no element where they differ (`c_order_differs` in the JSON, 0 for both). Every product there is exact
//! in f32 (an f16 × a 6- or 8-bit integer × a 4- or 6-bit code has at most 24 significant bits), so only
//! Q4_K's subtraction rounds (1949 of its 4096 elements) and an FMA-contracted `fma(d1, q, −m1)` gives the
//! same bits; Q6_K's other association `d·(sc·q)` is equal in value but gives +0 where the C gives −0.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use half::f16;
use int4_gguf::GgufFile;
use serde_json::Value;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn reference() -> Value {
    let path = fixtures().join("quants_reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn open() -> GgufFile {
    GgufFile::open(&fixtures().join("quants_reference.gguf")).unwrap()
}

fn hex_u32(v: &Value) -> u32 {
    u32::from_str_radix(v.as_str().unwrap(), 16).unwrap()
}

fn hex_list(v: &Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(hex_u32).collect()
}

/// Tensor `name` of the fixture read by the crate and compared with the reference, element by element.
fn check_tensor(name: &str) {
    let doc = reference();
    let want = &doc["tensors"][name];
    assert!(want.is_object(), "{name} is not in the reference JSON");
    let file = open();
    let info = file.tensor(name).unwrap_or_else(|| panic!("{name} is not in the fixture GGUF"));

    assert_eq!(u64::from(info.ggml_type.id()), want["ggml_type_id"].as_u64().unwrap(), "{name}: type");
    // ggml spells the K-quants "q4_K", gguf-py "Q4_K".
    assert_eq!(
        info.ggml_type.name().to_lowercase(),
        want["ggml_type"].as_str().unwrap().to_lowercase(),
        "{name}: type name"
    );
    let dims: Vec<u64> = want["dims"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap()).collect();
    assert_eq!(info.dims, dims, "{name}: dims");

    let got = file.tensor_f32(name).unwrap_or_else(|e| panic!("tensor_f32({name}): {e}"));
    let want_bits = hex_list(&want["f32_bits"]);
    assert_eq!(got.len(), want_bits.len(), "{name}: element count");
    assert_eq!(got.len() as u64, info.n_elements(), "{name}: element count");

    let block = info.ggml_type.block_size() as usize;
    let mut bad = Vec::new();
    for (i, (&g, &w)) in got.iter().zip(&want_bits).enumerate() {
        let w = f32::from_bits(w);
        assert!(!w.is_nan(), "{name}[{i}]: NaN in the reference");
        if g != w {
            bad.push(format!(
                "[{i}] (block {}, element {}): got {g:e} ({:08x}), want {w:e} ({:08x})",
                i / block,
                i % block,
                g.to_bits(),
                w.to_bits()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{name}: {} of {} elements differ; first: {:#?}",
        bad.len(),
        got.len(),
        &bad[..bad.len().min(8)]
    );
}

#[test]
fn q4_0_matches_reference() {
    check_tensor("q4_0.weight");
}

#[test]
fn q4_1_matches_reference() {
    check_tensor("q4_1.weight");
}

#[test]
fn q5_0_matches_reference() {
    check_tensor("q5_0.weight");
}

#[test]
fn q8_0_matches_reference() {
    check_tensor("q8_0.weight");
}

#[test]
fn q4_k_matches_reference() {
    check_tensor("q4_k.weight");
}

#[test]
fn q6_k_matches_reference() {
    check_tensor("q6_k.weight");
}

#[test]
fn f16_matches_reference() {
    check_tensor("f16.weight");
}

#[test]
fn bf16_matches_reference() {
    check_tensor("bf16.weight");
}

#[test]
fn f32_matches_reference() {
    check_tensor("f32.weight");
}

/// The file is the one the JSON describes, well formed, and its tensors are exactly the JSON's.
#[test]
fn fixture_is_the_described_file() {
    let doc = reference();
    let path = fixtures().join(doc["gguf_file"].as_str().unwrap());
    let len = std::fs::metadata(&path).unwrap().len();
    assert_eq!(len, doc["gguf_bytes"].as_u64().unwrap(), "fixture GGUF size");
    assert!(len < 64 * 1024);
    let file = open();
    assert_eq!(file.metadata("general.architecture").and_then(|v| v.as_str()), Some("llama"));
    let in_file: BTreeSet<&str> = file.tensors().iter().map(|t| t.name.as_str()).collect();
    let in_json: BTreeSet<&str> = doc["tensors"].as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(in_file, in_json);
}

/// The scales the fixture is meant to cover are there (a regeneration that drops one fails here), and
/// the crate reads Q4_1's scales and minimums as the script wrote them.
#[test]
fn special_scales_are_covered() {
    let doc = reference();
    let specials = [0x0000, 0x8000, 0x0001, 0x03ff, 0x8001, 0x83ff, 0x0400, 0x8400, 0x7bff, 0xfbff];
    for name in ["q4_0.weight", "q5_0.weight", "q8_0.weight"] {
        let scales: BTreeSet<u32> = hex_list(&doc["tensors"][name]["scales_f16_bits"]).into_iter().collect();
        for s in specials {
            assert!(scales.contains(&s), "{name}: scale {s:04x} missing");
        }
    }
    let q41 = &doc["tensors"]["q4_1.weight"];
    let d_bits = hex_list(&q41["scales_f16_bits"]);
    let m_bits = hex_list(&q41["mins_f16_bits"]);
    let both: BTreeSet<u32> = d_bits.iter().chain(&m_bits).copied().collect();
    for s in specials {
        assert!(both.contains(&s), "q4_1.weight: {s:04x} missing among scales and minimums");
    }

    let (codes, d, m) = open().q4_1_blocks("q4_1.weight").unwrap();
    assert_eq!(codes.len(), 32 * d_bits.len());
    assert!(codes.iter().all(|&c| c < 16));
    let widen = |b: u32| f16::from_bits(b as u16).to_f32();
    assert_eq!(
        d.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        d_bits.iter().map(|&b| widen(b).to_bits()).collect::<Vec<_>>()
    );
    assert_eq!(
        m.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
        m_bits.iter().map(|&b| widen(b).to_bits()).collect::<Vec<_>>()
    );
}

/// Q4_1's z = m + 8 d in f32: the blocks where it rounds, recomputed here from the scales the crate reads
/// (f16 → f32 is exact and f64 holds m + 8 d exactly), are the ones the JSON lists, with the same f32 z.
#[test]
fn q4_1_inexact_zero_points_are_listed() {
    let doc = reference();
    let (_, d, m) = open().q4_1_blocks("q4_1.weight").unwrap();
    let blocks = doc["q4_1_blocks"].as_array().unwrap();
    assert_eq!(blocks.len(), d.len());
    let mut inexact = Vec::new();
    for (i, (&d, &m)) in d.iter().zip(&m).enumerate() {
        let z = m + 8.0 * d;
        let exact = f64::from(m) + 8.0 * f64::from(d);
        let z_exact = f64::from(z) == exact;
        assert_eq!(z.to_bits(), hex_u32(&blocks[i]["z_f32_bits"]), "block {i}: z");
        assert_eq!(z_exact, blocks[i]["z_exact"].as_bool().unwrap(), "block {i}: z_exact");
        if !z_exact {
            inexact.push(i as u64);
        }
    }
    let listed: Vec<u64> =
        doc["q4_1_z_inexact_blocks"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(inexact, listed);
    // m = 65504, d = 2^-24 is among them.
    assert!(
        d.iter().zip(&m).zip(0u64..).any(|((&d, &m), i)| d == 2f32.powi(-24) && m == 65504.0 && inexact.contains(&i))
    );
}

fn int_list(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

/// ggml-quants.c's `get_scale_min_k4`: the 6-bit scale and min of sub-block `j` of 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

/// The K-quant tensors' super-block parameters in the file (raw bytes, unpacked here) are the ones the
/// JSON lists, and they cover what the fixture is meant to cover.
#[test]
fn k_quant_scales_are_covered() {
    let doc = reference();
    let file = open();
    let specials = [0x0000, 0x8000, 0x0001, 0x03ff, 0x8001, 0x83ff, 0x0400, 0x8400, 0x7bff, 0xfbff];
    let u16_at = |b: &[u8], at: usize| u32::from(u16::from_le_bytes([b[at], b[at + 1]]));

    let q4k = &doc["tensors"]["q4_k.weight"];
    let data = file.tensor_data("q4_k.weight").unwrap();
    assert_eq!(data.len() % 144, 0);
    let (mut d, mut dmin, mut sc, mut mn) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for b in data.chunks_exact(144) {
        d.push(u16_at(b, 0));
        dmin.push(u16_at(b, 2));
        for j in 0..8 {
            let (s, m) = scale_min_k4(j, &b[4..16]);
            sc.push(i64::from(s));
            mn.push(i64::from(m));
        }
    }
    assert_eq!(d, hex_list(&q4k["scales_f16_bits"]), "q4_k: d");
    assert_eq!(dmin, hex_list(&q4k["mins_f16_bits"]), "q4_k: dmin");
    assert_eq!(sc, int_list(&q4k["sub_scales"]), "q4_k: sub-block scales");
    assert_eq!(mn, int_list(&q4k["sub_mins"]), "q4_k: sub-block mins");
    for s in specials {
        assert!(d.contains(&s), "q4_k: d {s:04x} missing");
        assert!(dmin.contains(&s), "q4_k: dmin {s:04x} missing");
    }
    for v in 0..64 {
        assert!(sc.contains(&v) && mn.contains(&v), "q4_k: 6-bit value {v} missing among scales or mins");
    }

    let q6k = &doc["tensors"]["q6_k.weight"];
    let data = file.tensor_data("q6_k.weight").unwrap();
    assert_eq!(data.len() % 210, 0);
    let (mut d, mut sc) = (Vec::new(), Vec::new());
    for b in data.chunks_exact(210) {
        sc.extend(b[192..208].iter().map(|&x| i64::from(x as i8)));
        d.push(u16_at(b, 208));
    }
    assert_eq!(d, hex_list(&q6k["scales_f16_bits"]), "q6_k: d");
    assert_eq!(sc, int_list(&q6k["sub_scales"]), "q6_k: int8 scales");
    for s in specials {
        assert!(d.contains(&s), "q6_k: d {s:04x} missing");
    }
    for v in [-128, -1, 0, 127] {
        assert!(sc.contains(&v), "q6_k: int8 scale {v} missing");
    }
}

/// gguf-py (the reference the tests above compare with) and ggml's C order of operations agree on every
/// K-quant element, as the script found: should a regeneration find them apart, the JSON lists where and
/// carries the C-order values, and this test says so, because then the choice of which to match is open.
#[test]
fn k_quants_c_order_agrees_with_gguf_py() {
    let doc = reference();
    for name in ["q4_k.weight", "q6_k.weight"] {
        let count = doc["c_order_differs"][name].as_u64().unwrap_or_else(|| panic!("{name}: no c_order_differs"));
        let listed = doc["c_order_differs_elements"][name].as_array().unwrap().len() as u64;
        assert_eq!(count, listed, "{name}: c_order_differs against the elements listed");
        let n = doc["tensors"][name]["n_elements"].as_u64().unwrap();
        assert_eq!(doc["k_quants_order"][name]["elements"].as_u64().unwrap(), n);
        assert_eq!(
            count, 0,
            "{name}: gguf-py and ggml's C order differ in {count} elements (see c_order_differs_elements and the \
             tensor's c_order_f32_bits); the tests compare with gguf-py"
        );
        assert!(doc["tensors"][name].get("c_order_f32_bits").is_none());
    }
}
