//! The tinygemm packers against PyTorch itself: bytes recorded from
//! `torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)` under `ATEN_CPU_CAPABILITY=avx512` and
//! `=avx2` (see `scripts/pytorch_int4pack_fixture.py` for the command and `fixtures/pytorch_int4pack.json`
//! for the torch version). Every case must be packed to exactly those bytes, and the bytes must unpack and
//! decode to the codes that produced them.

use int4_layout::tinygemm::{self, TinygemmBlock, TinygemmMatrix};
use int4_layout::{Codes, GroupParams, GroupSize};

const FIXTURE: &str = include_str!("fixtures/pytorch_int4pack.json");

fn pattern(name: &str, n: usize, k: usize) -> Codes {
    Codes::from_fn(n, k, |r, c| {
        let (r, c) = (r as u64, c as u64);
        let v = match name {
            "mix" => (r * 7 + c * 3 + ((r * c) % 5)) % 16,
            "hash" => (((r * 2654435761) + (c * 40503) + 12345) >> 7) % 16,
            other => panic!("unknown pattern {other}"),
        };
        v as u8
    })
    .unwrap()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[test]
fn both_tinygemm_layouts_match_pytorch_byte_for_byte() {
    let fixture: serde_json::Value = serde_json::from_str(FIXTURE).unwrap();
    let cases = fixture["cases"].as_array().unwrap();
    let mut checked = [0usize; 2];
    for case in cases {
        let cap = case["capability"].as_str().unwrap();
        let (block, slot) = match cap {
            "avx512" => (TinygemmBlock::N64, 0),
            "avx2" => (TinygemmBlock::N32, 1),
            other => panic!("unexpected capability {other}"),
        };
        assert_eq!(case["reported_capability"].as_str().unwrap().to_lowercase(), cap);
        let n = case["n"].as_u64().unwrap() as usize;
        let k = case["k"].as_u64().unwrap() as usize;
        let name = case["pattern"].as_str().unwrap();
        let expected = case["packed_hex"].as_str().unwrap_or_else(|| panic!("torch rejected {case}"));
        let codes = pattern(name, n, k);
        let ours = tinygemm::pack(&codes, block).unwrap();
        assert_eq!(hex(&ours), expected, "{cap} {name} N={n} K={k}: packed bytes differ from PyTorch's");

        let theirs = unhex(expected);
        let m = TinygemmMatrix::new(&theirs, n, k, block).unwrap();
        assert_eq!(m.unpack(), codes, "{cap} {name} N={n} K={k}: PyTorch's bytes unpack to other codes");
        // Decoding PyTorch's bytes directly gives each code's weight (scale 1, zero 8: w = q).
        let groups = GroupSize::PerChannel.groups(k);
        let params =
            GroupParams::new(n, k, GroupSize::PerChannel, vec![1.0; n * groups], vec![8.0; n * groups]).unwrap();
        let mut out = vec![0.0f32; n * k];
        m.decode_k_range(&params, 0..k, &mut out).unwrap();
        let want: Vec<f32> = codes.as_slice().iter().map(|&q| f32::from(q)).collect();
        assert_eq!(out, want, "{cap} {name} N={n} K={k}: direct decode of PyTorch's bytes");
        checked[slot] += 1;
    }
    // 2 patterns x 6 N x 4 K for each capability.
    assert_eq!(checked, [48, 48], "fixture cases checked per capability");
}
