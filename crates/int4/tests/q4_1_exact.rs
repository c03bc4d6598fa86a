//! The shipped SmolLM2 GGUF stores its linears as Q4_1 (groups of 32: `w = q·d + m`). Imported as W4A16 at
//! group 32 — the same codes, `scale = d`, `zero = m + 8d` — and packed into the tinygemm layout, every
//! weight of every Q4_1 tensor decodes to exactly the value ggml's own dequantization gives: the 4-bit path
//! loses nothing against the file. (`d` and `m` are f16, so `m + 8d` and `(q − 8)·d` are exact in f32 and
//! both sides round `q·d + m` once.) The W4A8 path holds the same grid with `m + 8d` as a float offset and
//! decodes the same values; its 8-bit head finds the Q8_0 embedding's codes and scales again.

use int4::gguf::{GgmlType, GgufFile};
use int4::kernels::w4a8::W4A8Weights;
use int4::kernels::w4a8::int8::Int8Weights;
use int4::layout::tinygemm::{self, TinygemmBlock, TinygemmMatrix};
use int4::layout::{Codes, GroupParams, GroupSize};

/// The shipped GGUF, or `None` (a skip that CI refuses) when the default model is not fetched.
fn shipped_gguf() -> Option<GgufFile> {
    let gguf = int4::cache::dirs::default_model_dir().map(|d| d.join("SmolLM2-135M-Instruct.Q4_1.gguf"));
    let Some(gguf) = gguf.filter(|g| g.is_file()) else {
        let msg = "default model not found: run `cargo xtask fetch-model`";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
        eprintln!("SKIPPED: {msg}");
        return None;
    };
    Some(GgufFile::open(&gguf).unwrap())
}

fn differing(got: &[f32], want: &[f32]) -> usize {
    got.iter().zip(want).filter(|(a, b)| a.to_bits() != b.to_bits() && !(**a == 0.0 && **b == 0.0)).count()
}

#[test]
fn w4a16_at_group_32_reproduces_every_q4_1_weight_exactly() {
    let Some(gguf) = shipped_gguf() else { return };
    let mut checked = 0;
    for t in gguf.tensors().iter().filter(|t| t.ggml_type == GgmlType::Q4_1) {
        let (k, n) = (t.dims[0] as usize, t.dims[1] as usize);
        let (codes, d, m) = gguf.q4_1_blocks(&t.name).unwrap();
        let want = gguf.tensor_f32(&t.name).unwrap();
        let zero: Vec<f32> = d.iter().zip(&m).map(|(&d, &m)| m + 8.0 * d).collect();
        let params = GroupParams::new(n, k, GroupSize::G32, d, zero).unwrap();
        let packed = tinygemm::pack(&Codes::new(n, k, codes).unwrap(), TinygemmBlock::N32).unwrap();
        let mut got = vec![0.0f32; n * k];
        TinygemmMatrix::new(&packed, n, k, TinygemmBlock::N32)
            .unwrap()
            .decode_k_range(&params, 0..k, &mut got)
            .unwrap();
        let differ = differing(&got, &want);
        assert_eq!(differ, 0, "{}: {differ} of {} weights differ from ggml's dequantization", t.name, n * k);
        checked += 1;
    }
    assert_eq!(checked, 210, "every Q4_1 tensor of SmolLM2-135M");
}

/// W4A8 at group 32 with float offsets: the same codes, `scale = d`, offset `m + 8d` over zero point 8,
/// decodes every Q4_1 weight exactly (one rounding of `(q − 8)·d + (m + 8d)`, whose parts are exact).
#[test]
fn w4a8_with_float_offsets_reproduces_every_q4_1_weight_exactly() {
    let Some(gguf) = shipped_gguf() else { return };
    let mut checked = 0;
    // A spread of the 210 tensors keeps this quick: every kind of layer, first and last blocks.
    for t in gguf.tensors().iter().filter(|t| t.ggml_type == GgmlType::Q4_1).step_by(7) {
        let (k, n) = (t.dims[0] as usize, t.dims[1] as usize);
        let (codes, d, m) = gguf.q4_1_blocks(&t.name).unwrap();
        let want = gguf.tensor_f32(&t.name).unwrap();
        let groups = k / 32;
        let gn = |v: &dyn Fn(usize) -> f32| (0..groups * n).map(|i| v((i % n) * groups + i / n)).collect::<Vec<_>>();
        let scales = gn(&|j| d[j]);
        let offsets = gn(&|j| m[j] + 8.0 * d[j]);
        let w = W4A8Weights::pack(&Codes::new(n, k, codes).unwrap(), &scales, None, Some(&offsets), GroupSize::G32)
            .unwrap();
        let mut row = vec![0.0f32; k];
        for r in 0..n {
            w.decode_row(r, &mut row).unwrap();
            assert_eq!(differing(&row, &want[r * k..(r + 1) * k]), 0, "{} row {r}", t.name);
        }
        checked += 1;
    }
    assert_eq!(checked, 30);
}

/// The embedding (the tied head) is Q8_0: quantized again by the W4A8 path's 8-bit head (`amax/127` per
/// 32), every code and scale is found again, so every weight decodes exactly to ggml's value.
#[test]
fn the_eight_bit_head_reproduces_the_q8_0_embedding_exactly() {
    let Some(gguf) = shipped_gguf() else { return };
    let t = gguf.tensors().iter().find(|t| t.name == "token_embd.weight").unwrap();
    assert_eq!(t.ggml_type, GgmlType::Q8_0);
    let (k, n) = (t.dims[0] as usize, t.dims[1] as usize);
    let want = gguf.tensor_f32(&t.name).unwrap();
    let w = Int8Weights::quantize(&want, n, k, GroupSize::G32).unwrap();
    let mut row = vec![0.0f32; k];
    let mut differ = 0;
    for r in 0..n {
        w.decode_row(r, &mut row).unwrap();
        differ += differing(&row, &want[r * k..(r + 1) * k]);
    }
    assert_eq!(differ, 0, "{differ} of {} embedding weights differ from ggml's Q8_0 dequantization", n * k);
}

/// Q4_K's sub-blocks of 32 are Q4_1's form (`d·sc·q − dmin·m`): on the random super-blocks of the GGUF
/// reference fixture (checked against gguf-py), the W4A16 layout at group 32 decodes every weight of every
/// block whose zero `m + 8d` f32 holds exactly to ggml's value, and every other within half an ulp of that
/// zero.
#[test]
fn w4a16_reproduces_q4_k_sub_blocks() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../int4-gguf/tests/fixtures/quants_reference.gguf");
    let gguf = GgufFile::open(&path).unwrap();
    let t = gguf.tensor("q4_k.weight").unwrap();
    let (k, n) = (t.dims[0] as usize, t.dims[1] as usize);
    let b = gguf.blocks("q4_k.weight").unwrap();
    let want = gguf.tensor_f32("q4_k.weight").unwrap();
    let m = b.m.as_deref().unwrap();
    let zero: Vec<f32> = b.d.iter().zip(m).map(|(&d, &m)| m + 8.0 * d).collect();
    let exact: Vec<bool> =
        b.d.iter().zip(m).map(|(&d, &m)| f64::from(m + 8.0 * d) == f64::from(m) + 8.0 * f64::from(d)).collect();
    let codes = Codes::new(n, k, b.codes.iter().map(|&q| q as u8).collect()).unwrap();
    let params = GroupParams::new(n, k, GroupSize::G32, b.d.clone(), zero.clone()).unwrap();
    // Eight rows, padded to the layout's 16 (the padding decodes to zeros and is not compared).
    let (codes, params, np) = (codes.padded_n(16), params.padded_n(16), n.next_multiple_of(16));
    let packed = tinygemm::pack(&codes, TinygemmBlock::N32).unwrap();
    let mut got = vec![0.0f32; np * k];
    TinygemmMatrix::new(&packed, np, k, TinygemmBlock::N32).unwrap().decode_k_range(&params, 0..k, &mut got).unwrap();
    got.truncate(n * k);
    let mut checked_exact = 0;
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        let block = i / 32;
        if exact[block] {
            assert!(g == w, "element {i}: {g} != ggml's {w}");
            checked_exact += 1;
        } else {
            let half_ulp = f64::from(zero[block].abs()) * f64::EPSILON.max(f64::from(f32::EPSILON)) / 2.0;
            assert!(f64::from((g - w).abs()) <= half_ulp + f64::from(w.abs()) * f64::from(f32::EPSILON), "element {i}");
        }
    }
    assert!(checked_exact > want.len() / 4, "only {checked_exact} weights in blocks with an exact zero");
}
