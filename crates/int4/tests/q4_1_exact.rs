//! The shipped SmolLM2 GGUF stores its linears as Q4_1 (groups of 32: `w = q·d + m`). Imported as W4A16 at
//! group 32 — the same codes, `scale = d`, `zero = m + 8d` — and packed into the tinygemm layout, every
//! weight of every Q4_1 tensor decodes to exactly the value ggml's own dequantization gives: the 4-bit path
//! loses nothing against the file. (`d` and `m` are f16, so `m + 8d` and `(q − 8)·d` are exact in f32 and
//! both sides round `q·d + m` once.)

use int4::gguf::{GgmlType, GgufFile};
use int4_layout::tinygemm::{self, TinygemmBlock, TinygemmMatrix};
use int4_layout::{Codes, GroupParams, GroupSize};

#[test]
fn w4a16_at_group_32_reproduces_every_q4_1_weight_exactly() {
    let Some(dir) = int4::convert::default_model_dir().filter(|d| d.join("source.gguf").exists()) else {
        let msg = "default model not found: run `cargo xtask fetch-model`";
        assert!(std::env::var("CI").as_deref() != Ok("true"), "{msg}");
        eprintln!("SKIPPED: {msg}");
        return;
    };
    let gguf = GgufFile::open(&dir.join("source.gguf")).unwrap();
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
        let differ =
            got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits() && !(**a == 0.0 && **b == 0.0)).count();
        assert_eq!(differ, 0, "{}: {differ} of {} weights differ from ggml's dequantization", t.name, n * k);
        checked += 1;
    }
    assert_eq!(checked, 210, "every Q4_1 tensor of SmolLM2-135M");
}
