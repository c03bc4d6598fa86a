//! The GGUF reader and the GGUF → Hugging Face converter.
//!
//! * Synthetic files from a small writer below: every metadata value type (nested arrays included) and
//!   every dequantized tensor type (F32, F16, Q4_0, Q4_1, Q8_0), checked element by element against values
//!   computed by hand from the codes and scales written.
//! * Bad files: truncation at every byte, bad magic and versions, a tensor past the end, hostile counts
//!   and lengths (which must be refused before anything is allocated for them), unknown and unsupported
//!   types — each a clear error, never a panic.
//! * A tiny synthetic Llama converted end to end: tensor names, shapes, exact values, the undone Q/K
//!   permutation, config and a tokenizer the `tokenizers` crate loads.
//! * The real default model (SmolLM2-135M-Instruct) when `cargo xtask fetch-model` has put it in place:
//!   skipped with a message otherwise, and a failure under `CI=true`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use half::f16;
use int4_gguf::{ConvertErrorKind, gguf_to_hf, permute_qk};
use int4_gguf::{GgmlType, GgufError, GgufErrorKind, GgufFile, GgufValue};

// ---------------------------------------------------------------------------------------------------------
// A test-only GGUF writer.

/// GGUF value type id of a value.
fn type_id(v: &GgufValue) -> u32 {
    match v {
        GgufValue::U8(_) => 0,
        GgufValue::I8(_) => 1,
        GgufValue::U16(_) => 2,
        GgufValue::I16(_) => 3,
        GgufValue::U32(_) => 4,
        GgufValue::I32(_) => 5,
        GgufValue::F32(_) => 6,
        GgufValue::Bool(_) => 7,
        GgufValue::String(_) => 8,
        GgufValue::Array(_) => 9,
        GgufValue::U64(_) => 10,
        GgufValue::I64(_) => 11,
        GgufValue::F64(_) => 12,
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &GgufValue) {
    match v {
        GgufValue::U8(x) => out.push(*x),
        GgufValue::I8(x) => out.extend(x.to_le_bytes()),
        GgufValue::U16(x) => out.extend(x.to_le_bytes()),
        GgufValue::I16(x) => out.extend(x.to_le_bytes()),
        GgufValue::U32(x) => out.extend(x.to_le_bytes()),
        GgufValue::I32(x) => out.extend(x.to_le_bytes()),
        GgufValue::F32(x) => out.extend(x.to_le_bytes()),
        GgufValue::Bool(x) => out.push(u8::from(*x)),
        GgufValue::String(s) => put_str(out, s),
        GgufValue::Array(items) => {
            // An empty array is written as an array of uint8.
            out.extend(items.first().map_or(0, type_id).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            for i in items {
                put_value(out, i);
            }
        }
        GgufValue::U64(x) => out.extend(x.to_le_bytes()),
        GgufValue::I64(x) => out.extend(x.to_le_bytes()),
        GgufValue::F64(x) => out.extend(x.to_le_bytes()),
    }
}

struct RawTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
    data: Vec<u8>,
}

struct Writer {
    version: u32,
    alignment: u64,
    kvs: Vec<(String, GgufValue)>,
    tensors: Vec<RawTensor>,
}

impl Writer {
    fn new() -> Self {
        Writer { version: 3, alignment: 32, kvs: Vec::new(), tensors: Vec::new() }
    }

    fn kv(&mut self, key: &str, v: GgufValue) -> &mut Self {
        if key == "general.alignment" {
            self.alignment = v.as_u64().unwrap();
        }
        self.kvs.push((key.to_string(), v));
        self
    }

    fn tensor(&mut self, name: &str, dims: &[u64], ggml_type: GgmlType, data: Vec<u8>) -> &mut Self {
        self.tensors.push(RawTensor { name: name.into(), dims: dims.to_vec(), ggml_type: ggml_type.id(), data });
        self
    }

    /// The encoded file, the offset of each tensor's info record (for tests that corrupt it), and where the
    /// header ends (before the data section's padding).
    fn encode(&self) -> (Vec<u8>, Vec<usize>, usize) {
        let mut out = Vec::new();
        out.extend(b"GGUF");
        out.extend(self.version.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend((self.kvs.len() as u64).to_le_bytes());
        for (k, v) in &self.kvs {
            put_str(&mut out, k);
            out.extend(type_id(v).to_le_bytes());
            put_value(&mut out, v);
        }
        let mut offset = 0u64;
        let mut info_offsets = Vec::new();
        for t in &self.tensors {
            info_offsets.push(out.len());
            put_str(&mut out, &t.name);
            out.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(t.ggml_type.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset = (offset + t.data.len() as u64).div_ceil(self.alignment) * self.alignment;
        }
        let header_end = out.len();
        for t in &self.tensors {
            out.resize((out.len() as u64).div_ceil(self.alignment) as usize * self.alignment as usize, 0);
            out.extend(&t.data);
        }
        (out, info_offsets, header_end)
    }

    fn bytes_with_info_offsets(&self) -> (Vec<u8>, Vec<usize>) {
        let (bytes, infos, _) = self.encode();
        (bytes, infos)
    }

    fn bytes(&self) -> Vec<u8> {
        self.encode().0
    }

    fn write(&self, name: &str) -> PathBuf {
        let path = tmp_dir().join(name);
        std::fs::write(&path, self.bytes()).unwrap();
        path
    }
}

fn tmp_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("gguf_convert");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// Block encoders (ggml layouts).

fn h(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// Q4_0: f16 d, then 16 bytes; element j is the low nibble of byte j, element j + 16 the high nibble.
fn q4_0_block(d: f32, codes: &[u8; 32]) -> Vec<u8> {
    let mut b = h(d).to_vec();
    b.extend((0..16).map(|j| codes[j] | (codes[j + 16] << 4)));
    b
}

fn q4_1_block(d: f32, m: f32, codes: &[u8; 32]) -> Vec<u8> {
    let mut b = h(d).to_vec();
    b.extend(h(m));
    b.extend((0..16).map(|j| codes[j] | (codes[j + 16] << 4)));
    b
}

fn q8_0_block(d: f32, q: &[i8; 32]) -> Vec<u8> {
    let mut b = h(d).to_vec();
    b.extend(q.iter().map(|&x| x as u8));
    b
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn codes(&mut self) -> [u8; 32] {
        std::array::from_fn(|_| (self.next() % 16) as u8)
    }
    fn small(&mut self) -> f32 {
        ((self.next() % 2001) as f32 - 1000.0) / 4096.0
    }
}

// ---------------------------------------------------------------------------------------------------------
// (a) Synthetic files.

fn every_value_type() -> Vec<(String, GgufValue)> {
    use GgufValue::*;
    vec![
        ("t.u8".into(), U8(250)),
        ("t.i8".into(), I8(-7)),
        ("t.u16".into(), U16(65_000)),
        ("t.i16".into(), I16(-30_000)),
        ("t.u32".into(), U32(4_000_000_000)),
        ("t.i32".into(), I32(-2_000_000_000)),
        ("t.f32".into(), F32(1.0e-5)),
        ("t.bool".into(), Bool(true)),
        ("t.string".into(), String("héllo, GGUF".into())),
        ("t.u64".into(), U64(u64::MAX - 1)),
        ("t.i64".into(), I64(i64::MIN + 1)),
        ("t.f64".into(), F64(-2.5e300)),
        ("t.empty_string".into(), String(std::string::String::new())),
        ("t.array_u8".into(), Array(vec![U8(1), U8(2), U8(3)])),
        ("t.array_i32".into(), Array(vec![I32(-1), I32(0), I32(1)])),
        ("t.array_f32".into(), Array(vec![F32(0.5), F32(-0.25)])),
        ("t.array_bool".into(), Array(vec![Bool(false), Bool(true)])),
        ("t.array_string".into(), Array(vec![String("a b".into()), String("".into()), String("Ġx".into())])),
        ("t.array_u64".into(), Array(vec![U64(7)])),
        ("t.array_f64".into(), Array(vec![F64(1e-300)])),
        ("t.array_empty".into(), Array(vec![])),
        (
            "t.array_nested".into(),
            Array(vec![Array(vec![U16(1), U16(2)]), Array(vec![U16(3)]), Array(vec![U16(4), U16(5), U16(6)])]),
        ),
        ("t.array_nested3".into(), Array(vec![Array(vec![Array(vec![I8(-1), I8(2)])])])),
    ]
}

#[test]
fn every_metadata_value_type_round_trips_in_versions_2_and_3() {
    for version in [2, 3] {
        let mut w = Writer::new();
        w.version = version;
        for (k, v) in every_value_type() {
            w.kv(&k, v);
        }
        let path = w.write(&format!("values-v{version}.gguf"));
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.version(), version);
        assert_eq!(f.alignment(), 32);
        assert!(f.tensors().is_empty());
        for (k, v) in every_value_type() {
            assert_eq!(f.metadata(&k), Some(&v), "{k}");
        }
        assert_eq!(f.metadata_entries().len(), every_value_type().len());
        assert_eq!(f.metadata("absent"), None);

        // The helpers.
        let m = |k: &str| f.metadata(k).unwrap();
        assert_eq!(m("t.u8").as_u64(), Some(250));
        assert_eq!(m("t.i8").as_u64(), None);
        assert_eq!(m("t.i8").as_i64(), Some(-7));
        assert_eq!(m("t.u32").as_u64(), Some(4_000_000_000));
        assert_eq!(m("t.u64").as_u64(), Some(u64::MAX - 1));
        assert_eq!(m("t.f32").as_f64(), Some(f64::from(1.0e-5f32)));
        assert_eq!(m("t.i16").as_f64(), Some(-30_000.0));
        assert_eq!(m("t.f64").as_f64(), Some(-2.5e300));
        assert_eq!(m("t.string").as_str(), Some("héllo, GGUF"));
        assert_eq!(m("t.string").as_u64(), None);
        assert_eq!(m("t.bool").as_bool(), Some(true));
        let strings: Vec<&str> = m("t.array_string").as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        assert_eq!(strings, ["a b", "", "Ġx"]);
        let nested = m("t.array_nested").as_array().unwrap();
        assert_eq!(nested[2].as_array().unwrap()[2].as_u64(), Some(6));
        assert_eq!(m("t.array_empty").as_array(), Some(&[][..]));
    }
}

/// One tensor of each supported type (and one unsupported), with hand-computed expected values.
fn typed_tensors() -> (Writer, Vec<(&'static str, Vec<f32>)>) {
    let mut w = Writer::new();
    w.kv("general.alignment", GgufValue::U32(64));
    let mut expected = Vec::new();

    // F32 [3, 2]: the bytes are the values.
    let vals = [1.5f32, -2.25, 0.0, f32::MAX, f32::MIN_POSITIVE, -1e-30];
    w.tensor("f32", &[3, 2], GgmlType::F32, vals.iter().flat_map(|v| v.to_le_bytes()).collect());
    expected.push(("f32", vals.to_vec()));

    // F16 [4]: exact values, the largest half, and the smallest subnormal.
    let bits: [u16; 4] = [0x3C00, 0xB800, 0x7BFF, 0x0001];
    w.tensor("f16", &[4], GgmlType::F16, bits.iter().flat_map(|b| b.to_le_bytes()).collect());
    expected.push(("f16", vec![1.0, -0.5, 65504.0, 2f32.powi(-24)]));

    // Q4_0 [32, 2]: block 0 d = 0.5, codes 0..16 then 15..0 → (q - 8) * 0.5; block 1 d = -0.125, code 8 → 0,
    // code 0 → 1.0.
    let codes0: [u8; 32] = std::array::from_fn(|i| if i < 16 { i as u8 } else { 31 - i as u8 });
    let codes1: [u8; 32] = std::array::from_fn(|i| if i % 2 == 0 { 8 } else { 0 });
    let mut data = q4_0_block(0.5, &codes0);
    data.extend(q4_0_block(-0.125, &codes1));
    w.tensor("q4_0", &[32, 2], GgmlType::Q4_0, data);
    let mut e: Vec<f32> = (0..16).map(|i| (i as f32 - 8.0) * 0.5).collect();
    e.extend((0..16).map(|i| (15.0 - i as f32 - 8.0) * 0.5));
    // (8 - 8) × -0.125 is -0.0, as in ggml.
    e.extend((0..32).map(|i| if i % 2 == 0 { -0.0 } else { 1.0 }));
    assert_eq!((e[0], e[15], e[16], e[31]), (-4.0, 3.5, 3.5, -4.0));
    expected.push(("q4_0", e));

    // Q4_1 [64]: block 0 d = 0.25, m = -1 → q / 4 - 1; block 1 d = 2, m = 0.5 → 2q + 0.5.
    let codes: [u8; 32] = std::array::from_fn(|i| (i * 7 % 16) as u8);
    let mut data = q4_1_block(0.25, -1.0, &codes);
    data.extend(q4_1_block(2.0, 0.5, &codes));
    w.tensor("q4_1", &[64], GgmlType::Q4_1, data);
    let mut e: Vec<f32> = codes.iter().map(|&q| q as f32 / 4.0 - 1.0).collect();
    e.extend(codes.iter().map(|&q| 2.0 * q as f32 + 0.5));
    assert_eq!((e[0], e[1], e[32], e[33]), (-1.0, 0.75, 0.5, 14.5));
    expected.push(("q4_1", e));

    // Q8_0 [32]: d = 0.125, q = -128, -120, …, 120 → q / 8.
    let q: [i8; 32] = std::array::from_fn(|i| (i as i32 * 8 - 128) as i8);
    w.tensor("q8_0", &[32], GgmlType::Q8_0, q8_0_block(0.125, &q));
    expected.push(("q8_0", q.iter().map(|&x| x as f32 / 8.0).collect()));

    // Q5_0 [32]: d = 0.5, the fifth bit set on odd elements, every low nibble 1 and high nibble 2:
    // element j < 16 is (1 | 16·odd) - 16, element j ≥ 16 is (2 | 16·odd) - 16, times d.
    let mut data = half::f16::from_f32(0.5).to_le_bytes().to_vec();
    data.extend(0xAAAA_AAAAu32.to_le_bytes());
    data.extend([0x21u8; 16]);
    w.tensor("q5_0", &[32], GgmlType::Q5_0, data);
    let odd = |j: usize| if j % 2 == 1 { 16.0 } else { 0.0 };
    expected.push(("q5_0", (0..32).map(|j| (if j < 16 { 1.0 } else { 2.0 } + odd(j) - 16.0) * 0.5).collect()));

    // Q5_1 [32]: readable, not dequantizable.
    w.tensor("q5_1", &[32], GgmlType::Q5_1, vec![0; 24]);
    (w, expected)
}

#[test]
fn every_supported_type_dequantizes_exactly() {
    let (w, expected) = typed_tensors();
    let path = w.write("typed.gguf");
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.alignment(), 64);
    assert_eq!(f.data_offset() % 64, 0);
    let infos: Vec<(&str, &[u64], GgmlType)> =
        f.tensors().iter().map(|t| (t.name.as_str(), t.dims.as_slice(), t.ggml_type)).collect();
    assert_eq!(
        infos,
        [
            ("f32", &[3u64, 2][..], GgmlType::F32),
            ("f16", &[4][..], GgmlType::F16),
            ("q4_0", &[32, 2][..], GgmlType::Q4_0),
            ("q4_1", &[64][..], GgmlType::Q4_1),
            ("q8_0", &[32][..], GgmlType::Q8_0),
            ("q5_0", &[32][..], GgmlType::Q5_0),
            ("q5_1", &[32][..], GgmlType::Q5_1),
        ]
    );
    assert!(f.tensors().iter().all(|t| t.offset % 64 == 0));
    for (name, want) in expected {
        let got = f.tensor_f32(name).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name}[{i}]: {g} != {w}");
        }
    }

    // The raw Q4_1 content reproduces the dequantized tensor.
    let (codes, d, m) = f.q4_1_blocks("q4_1").unwrap();
    assert_eq!((d.as_slice(), m.as_slice()), (&[0.25f32, 2.0][..], &[-1.0f32, 0.5][..]));
    let want: Vec<u8> = (0..64).map(|i| (i % 32 * 7 % 16) as u8).collect();
    assert_eq!(codes, want);
    let deq = f.tensor_f32("q4_1").unwrap();
    for i in 0..64 {
        assert_eq!(codes[i] as f32 * d[i / 32] + m[i / 32], deq[i]);
    }

    // Unsupported type: an error naming the tensor and the type.
    let e = f.tensor_f32("q5_1").unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::UnsupportedType(GgmlType::Q5_1)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("q5_1") && msg.contains("typed.gguf") && msg.contains("(q5_1)"), "{msg}");
    let e = f.q4_1_blocks("q4_0").unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::WrongType { .. }), "{e:?}");
    let e = f.tensor_f32("nope").unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::NoSuchTensor) && e.to_string().contains("(nope)"), "{e}");
    assert_eq!(f.tensor_data("q8_0").unwrap().len(), 34);
}

// ---------------------------------------------------------------------------------------------------------
// (b) Bad files.

fn parse(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
    GgufFile::from_bytes("bad.gguf", bytes)
}

/// The error a bad file gives (which must name the file).
fn error_of(bytes: Vec<u8>) -> GgufError {
    let e = parse(bytes).expect_err("a bad file was accepted");
    assert!(e.to_string().starts_with("bad.gguf: "), "{e}");
    e
}

#[test]
fn truncation_anywhere_is_an_error() {
    let (w, _) = typed_tensors();
    let mut w2 = Writer::new();
    for (k, v) in every_value_type() {
        w2.kv(&k, v);
    }
    for t in w.tensors {
        w2.tensors.push(t);
    }
    let (full, _, header_end) = w2.encode();
    assert!(parse(full.clone()).is_ok());
    // Every cut fails: in the header as a truncation (or a count the rest cannot hold), after it as a
    // tensor out of bounds (the last tensor ends at the end of the file).
    for cut in 0..full.len() {
        let e = error_of(full[..cut].to_vec());
        if cut < header_end {
            let ok = matches!(e.kind(), GgufErrorKind::Truncated { .. } | GgufErrorKind::LengthTooLarge { .. });
            assert!(ok, "cut at {cut} in the header: {e:?}");
        } else {
            assert!(matches!(e.kind(), GgufErrorKind::OutOfBounds { .. }), "cut at {cut} after the header: {e:?}");
        }
    }
    for cut in [0, 3, 4, 7, 8, 23] {
        assert!(matches!(error_of(full[..cut].to_vec()).kind(), GgufErrorKind::Truncated { .. }), "cut at {cut}");
    }
    // Through `open` too: the message names the file.
    let path = tmp_dir().join("truncated.gguf");
    std::fs::write(&path, &full[..100]).unwrap();
    let e = GgufFile::open(&path).unwrap_err();
    assert!(e.to_string().contains("truncated.gguf") && e.to_string().ends_with(')'), "{e}");
    let e = GgufFile::open(&tmp_dir().join("does-not-exist.gguf")).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::File(f) if f.is_not_found()), "{e:?}");
    // Not a regular file: refused at once, never read without end (`/dev/zero`) or waited on.
    for not_a_file in [Path::new("/dev/zero"), &tmp_dir()] {
        let e = GgufFile::open(not_a_file).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}

#[test]
fn bad_magic_and_versions_are_refused() {
    let good = Writer::new().bytes();
    let mut b = good.clone();
    b[..4].copy_from_slice(b"GGML");
    assert!(matches!(error_of(b).kind(), GgufErrorKind::BadMagic(m) if m == b"GGML"));
    for v in [0u32, 1, 4, 0xFFFF_FFFF] {
        let mut b = good.clone();
        b[4..8].copy_from_slice(&v.to_le_bytes());
        assert!(matches!(error_of(b).kind(), GgufErrorKind::UnsupportedVersion(x) if *x == v), "version {v}");
    }
    let mut b = good.clone();
    b[4..8].copy_from_slice(&3u32.to_be_bytes());
    assert!(matches!(error_of(b).kind(), GgufErrorKind::BigEndian));
    assert!(matches!(error_of(Vec::new()).kind(), GgufErrorKind::Truncated { offset: 0, needed: 4 }));
    let e = parse(b"GGUF\x01\0\0\0".to_vec()).unwrap_err();
    assert_eq!(e.to_string(), "bad.gguf: unsupported GGUF version 1 (2 and 3 are read) (version)");
}

#[test]
fn a_tensor_past_the_end_is_refused() {
    let mut w = Writer::new();
    w.tensor("a", &[8], GgmlType::F32, vec![0; 32]);
    let (mut b, infos) = w.bytes_with_info_offsets();
    assert!(parse(b.clone()).is_ok());
    // The offset field is the record's last 8 bytes: name (8 + 1), n_dims (4), dims (8), type (4).
    let at = infos[0] + 9 + 4 + 8 + 4;
    for off in [32u64, 1 << 40, 1 << 63, u64::MAX - 31] {
        b[at..at + 8].copy_from_slice(&off.to_le_bytes());
        let e = error_of(b.clone());
        assert!(matches!(e.kind(), GgufErrorKind::OutOfBounds { .. }), "offset {off}: {e:?}");
    }
    // A misaligned offset.
    b[at..at + 8].copy_from_slice(&4u64.to_le_bytes());
    assert!(matches!(error_of(b.clone()).kind(), GgufErrorKind::Malformed(m) if m.contains("alignment")));
    // Dims whose product overflows, and dims huge enough to lie past the end.
    let dims_at = infos[0] + 9 + 4;
    b[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    b[dims_at..dims_at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    let e = parse(b.clone()).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::OutOfBounds { .. }), "{e:?}");
    assert!(e.to_string().ends_with("(a)"), "{e}");
}

/// A tensor whose type disagrees with its data, or two tensors sharing bytes: refused, as llama.cpp refuses
/// a file whose tensors are not laid out one after the other.
#[test]
fn tensors_must_follow_one_another() {
    let mut w = Writer::new();
    w.tensor("a", &[64], GgmlType::Q4_1, vec![0; 40]);
    w.tensor("b", &[32], GgmlType::F32, vec![0; 128]);
    let (b, infos) = w.bytes_with_info_offsets();
    assert!(parse(b.clone()).is_ok());
    // "a" declared Q8_0 (68 bytes, not 40): "b" no longer starts where "a" ends.
    let type_at = infos[0] + 9 + 4 + 8;
    let mut typed = b.clone();
    typed[type_at..type_at + 4].copy_from_slice(&GgmlType::Q8_0.id().to_le_bytes());
    let e = error_of(typed);
    assert!(matches!(e.kind(), GgufErrorKind::Malformed(m) if m.contains("disagrees")), "{e:?}");
    assert!(e.to_string().ends_with("(b)"), "{e}");
    // "b" pointed back at "a"'s bytes.
    let at = infos[1] + 9 + 4 + 8 + 4;
    let mut shared = b;
    shared[at..at + 8].copy_from_slice(&0u64.to_le_bytes());
    let e = error_of(shared);
    assert!(matches!(e.kind(), GgufErrorKind::Malformed(m) if m.contains("where the tensors before it end")), "{e:?}");
}

#[test]
fn hostile_lengths_are_refused_before_allocating() {
    // Tensor count and metadata count far beyond what the file could hold.
    let mut b = Writer::new().bytes();
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(error_of(b).kind(), GgufErrorKind::LengthTooLarge { len: u64::MAX, .. }));
    let mut b = Writer::new().bytes();
    b[16..24].copy_from_slice(&(u64::MAX / 2).to_le_bytes());
    assert!(matches!(error_of(b).kind(), GgufErrorKind::LengthTooLarge { .. }));

    // A string length of u64::MAX (in a key, then in a value).
    let mut w = Writer::new();
    w.kv("k", GgufValue::String("v".into()));
    let good = w.bytes();
    let mut b = good.clone();
    b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(matches!(error_of(b).kind(), GgufErrorKind::LengthTooLarge { .. }));
    let mut b = good.clone();
    let value_len_at = 24 + 8 + 1 + 4;
    b[value_len_at..value_len_at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let e = parse(b).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::LengthTooLarge { .. }) && e.field() == "value of k", "{e}");

    // An array length of 2^62 (of u64s, of strings, of arrays).
    for elem in [GgufValue::U64(1), GgufValue::String("s".into()), GgufValue::Array(vec![GgufValue::U8(1)])] {
        let mut w = Writer::new();
        w.kv("arr", GgufValue::Array(vec![elem]));
        let mut b = w.bytes();
        let len_at = 24 + 8 + 3 + 4 + 4;
        b[len_at..len_at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
        let e = parse(b).unwrap_err();
        assert!(matches!(e.kind(), GgufErrorKind::LengthTooLarge { .. }), "{e:?}");
        assert!(e.to_string().contains("(value of arr)"), "{e}");
    }

    // Arrays nested deeper than the bound (each level is 12 bytes; no stack overflow).
    let mut v = GgufValue::U8(1);
    for _ in 0..1_000 {
        v = GgufValue::Array(vec![v]);
    }
    let mut w = Writer::new();
    w.kv("deep", v);
    assert!(matches!(error_of(w.bytes()).kind(), GgufErrorKind::NestingTooDeep));
}

#[test]
fn malformed_fields_are_refused() {
    // Unknown ggml type id.
    let mut w = Writer::new();
    w.tensor("t", &[4], GgmlType::F32, vec![0; 16]);
    let (mut b, infos) = w.bytes_with_info_offsets();
    let type_at = infos[0] + 9 + 4 + 8;
    b[type_at..type_at + 4].copy_from_slice(&99u32.to_le_bytes());
    let e = parse(b).unwrap_err();
    assert!(matches!(e.kind(), GgufErrorKind::UnknownGgmlType(99)) && e.field() == "t", "{e}");

    // Too many dimensions.
    let mut w = Writer::new();
    w.tensor("t5", &[1, 1, 1, 1, 1], GgmlType::F32, vec![0; 4]);
    assert!(matches!(error_of(w.bytes()).kind(), GgufErrorKind::Malformed(m) if m.contains("dimensions")));

    // A quantized row not a multiple of the block.
    let mut w = Writer::new();
    w.tensor("q", &[16, 2], GgmlType::Q4_1, vec![0; 20]);
    assert!(matches!(error_of(w.bytes()).kind(), GgufErrorKind::Malformed(m) if m.contains("block size")));

    // Unknown value type.
    let mut w = Writer::new();
    w.kv("k", GgufValue::U8(1));
    let mut b = w.bytes();
    b[24 + 8 + 1..24 + 8 + 1 + 4].copy_from_slice(&13u32.to_le_bytes());
    assert!(matches!(error_of(b).kind(), GgufErrorKind::UnknownValueType(13)));

    // Invalid UTF-8, duplicate key, duplicate tensor, bad alignment.
    let mut w = Writer::new();
    w.kv("k", GgufValue::String("ab".into()));
    let mut b = w.bytes();
    let n = b.len();
    b[n - 1] = 0xFF;
    assert!(matches!(error_of(b).kind(), GgufErrorKind::InvalidUtf8));
    let mut w = Writer::new();
    w.kv("k", GgufValue::U8(1)).kv("k", GgufValue::U8(2));
    assert!(matches!(error_of(w.bytes()).kind(), GgufErrorKind::DuplicateKey));
    let mut w = Writer::new();
    w.tensor("t", &[1], GgmlType::F32, vec![0; 4]).tensor("t", &[1], GgmlType::F32, vec![0; 4]);
    assert!(matches!(error_of(w.bytes()).kind(), GgufErrorKind::DuplicateTensor));
    let mut b = Writer::new();
    b.kvs.push(("general.alignment".into(), GgufValue::U32(24)));
    assert!(matches!(error_of(b.bytes()).kind(), GgufErrorKind::Malformed(m) if m.contains("power of two")));
}

// ---------------------------------------------------------------------------------------------------------
// A tiny synthetic Llama, converted end to end.

const TINY_HIDDEN: u64 = 32;
const TINY_HEADS: u64 = 2;
const TINY_KV: u64 = 1;
const TINY_HEAD_DIM: u64 = 16;
const TINY_FF: u64 = 64;
const TINY_LAYERS: u64 = 2;

/// A quantized tensor's bytes and its dequantized values (computed here from the codes and scales).
fn tiny_tensor(rng: &mut Rng, ty: GgmlType, n: usize) -> (Vec<u8>, Vec<f32>) {
    let mut data = Vec::new();
    let mut vals = Vec::new();
    let round = |x: f32| f16::from_f32(x).to_f32();
    match ty {
        GgmlType::F32 => {
            for _ in 0..n {
                let v = rng.small();
                data.extend(v.to_le_bytes());
                vals.push(v);
            }
        }
        GgmlType::F16 => {
            for _ in 0..n {
                let v = round(rng.small());
                data.extend(h(v));
                vals.push(v);
            }
        }
        GgmlType::Q4_0 => {
            for _ in 0..n / 32 {
                let (d, c) = (round(rng.small()), rng.codes());
                data.extend(q4_0_block(d, &c));
                vals.extend(c.iter().map(|&q| (q as i32 - 8) as f32 * d));
            }
        }
        GgmlType::Q4_1 => {
            for _ in 0..n / 32 {
                let (d, m, c) = (round(rng.small()), round(rng.small()), rng.codes());
                data.extend(q4_1_block(d, m, &c));
                vals.extend(c.iter().map(|&q| q as f32 * d + m));
            }
        }
        GgmlType::Q8_0 => {
            for _ in 0..n / 32 {
                let d = round(rng.small());
                let q: [i8; 32] = std::array::from_fn(|_| rng.next() as i8);
                data.extend(q8_0_block(d, &q));
                vals.extend(q.iter().map(|&x| x as f32 * d));
            }
        }
        other => panic!("{other}"),
    }
    (data, vals)
}

struct TinyModel {
    writer: Writer,
    /// HF name → (HF shape, values as the HF checkpoint holds them).
    expected: Vec<(String, Vec<usize>, Vec<f32>)>,
}

fn tiny_llama(tied: bool) -> TinyModel {
    let mut w = Writer::new();
    let s = |x: &str| GgufValue::String(x.into());
    w.kv("general.architecture", s("llama"));
    w.kv("llama.embedding_length", GgufValue::U32(TINY_HIDDEN as u32));
    w.kv("llama.feed_forward_length", GgufValue::U32(TINY_FF as u32));
    w.kv("llama.block_count", GgufValue::U32(TINY_LAYERS as u32));
    w.kv("llama.attention.head_count", GgufValue::U32(TINY_HEADS as u32));
    w.kv("llama.attention.head_count_kv", GgufValue::U32(TINY_KV as u32));
    w.kv("llama.attention.layer_norm_rms_epsilon", GgufValue::F32(1e-5));
    w.kv("llama.context_length", GgufValue::U32(2048));
    w.kv("llama.rope.dimension_count", GgufValue::U32(TINY_HEAD_DIM as u32));

    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
    let mut tokens: Vec<String> = specials.iter().map(|t| t.to_string()).collect();
    tokens.extend(int4_test_support::gguf::byte_chars().iter().map(|c| c.to_string()));
    let merges = ["H e", "l l", "He ll", "Hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
    }
    let mut types = vec![GgufValue::I32(3); specials.len()];
    types.resize(tokens.len(), GgufValue::I32(1));
    let vocab = tokens.len() as u64;
    w.kv("tokenizer.ggml.model", s("gpt2"));
    w.kv("tokenizer.ggml.pre", s("smollm"));
    w.kv("tokenizer.ggml.tokens", GgufValue::Array(tokens.iter().map(|t| s(t)).collect()));
    w.kv("tokenizer.ggml.token_type", GgufValue::Array(types));
    w.kv("tokenizer.ggml.merges", GgufValue::Array(merges.iter().map(|m| s(m)).collect()));
    w.kv("tokenizer.ggml.bos_token_id", GgufValue::U32(1));
    w.kv("tokenizer.ggml.eos_token_id", GgufValue::U32(2));
    w.kv("tokenizer.ggml.add_bos_token", GgufValue::Bool(false));
    w.kv("tokenizer.chat_template", s("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}"));

    let mut rng = Rng(0x1234_5678_9abc_def1);
    let mut expected = Vec::new();
    let mut add = |w: &mut Writer, gguf: &str, hf: &str, dims: &[u64], ty: GgmlType, heads: Option<u64>| {
        let n = dims.iter().product::<u64>() as usize;
        let (data, mut vals) = tiny_tensor(&mut rng, ty, n);
        w.tensor(gguf, dims, ty, data);
        if let Some(heads) = heads {
            // The GGUF holds permuted rows: the HF tensor is the one whose permutation this is.
            let (rows, cols) = (dims[1] as usize, dims[0] as usize);
            let hd = rows / heads as usize;
            let mut hf_vals = vec![0.0; n];
            for hh in 0..heads as usize {
                for t in 0..2 {
                    for i in 0..hd / 2 {
                        let (hf_row, gguf_row) = (hh * hd + t * hd / 2 + i, hh * hd + 2 * i + t);
                        hf_vals[hf_row * cols..][..cols].copy_from_slice(&vals[gguf_row * cols..][..cols]);
                    }
                }
            }
            assert_eq!(permute_qk(&hf_vals, heads as usize, rows, cols), vals);
            vals = hf_vals;
        }
        let shape = dims.iter().rev().map(|&d| d as usize).collect();
        expected.push((hf.to_string(), shape, vals));
    };
    let (hd, q_out, kv_out) = (TINY_HIDDEN, TINY_HEADS * TINY_HEAD_DIM, TINY_KV * TINY_HEAD_DIM);
    add(&mut w, "token_embd.weight", "model.embed_tokens.weight", &[hd, vocab], GgmlType::F16, None);
    for i in 0..TINY_LAYERS {
        let b = |p: &str| format!("blk.{i}.{p}.weight");
        let l = |p: &str| format!("model.layers.{i}.{p}.weight");
        add(&mut w, &b("attn_norm"), &l("input_layernorm"), &[hd], GgmlType::F32, None);
        add(&mut w, &b("attn_q"), &l("self_attn.q_proj"), &[hd, q_out], GgmlType::Q4_1, Some(TINY_HEADS));
        add(&mut w, &b("attn_k"), &l("self_attn.k_proj"), &[hd, kv_out], GgmlType::Q4_0, Some(TINY_KV));
        add(&mut w, &b("attn_v"), &l("self_attn.v_proj"), &[hd, kv_out], GgmlType::Q8_0, None);
        add(&mut w, &b("attn_output"), &l("self_attn.o_proj"), &[q_out, hd], GgmlType::Q4_1, None);
        add(&mut w, &b("ffn_gate"), &l("mlp.gate_proj"), &[hd, TINY_FF], GgmlType::Q4_1, None);
        add(&mut w, &b("ffn_up"), &l("mlp.up_proj"), &[hd, TINY_FF], GgmlType::Q4_1, None);
        add(&mut w, &b("ffn_down"), &l("mlp.down_proj"), &[TINY_FF, hd], GgmlType::Q8_0, None);
        add(&mut w, &b("ffn_norm"), &l("post_attention_layernorm"), &[hd], GgmlType::F32, None);
    }
    add(&mut w, "output_norm.weight", "model.norm.weight", &[hd], GgmlType::F32, None);
    if !tied {
        add(&mut w, "output.weight", "lm_head.weight", &[hd, vocab], GgmlType::Q8_0, None);
    }
    TinyModel { writer: w, expected }
}

fn read_json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

#[test]
fn a_tiny_llama_converts_exactly() {
    for tied in [true, false] {
        let tiny = tiny_llama(tied);
        let gguf = tiny.writer.write(&format!("tiny-llama-{tied}.gguf"));
        let out = tmp_dir().join(format!("tiny-llama-{tied}"));
        let _ = std::fs::remove_dir_all(&out);
        let report = gguf_to_hf(&gguf, &out).unwrap();
        assert_eq!(report.out_dir, out);
        assert_eq!(report.tensors.len(), tiny.expected.len());
        assert_eq!(
            report.special_tokens,
            [(0, "<|endoftext|>".into()), (1, "<|im_start|>".into()), (2, "<|im_end|>".into())]
        );
        let q = report.tensors.iter().find(|t| t.hf_name == "model.layers.1.self_attn.q_proj.weight").unwrap();
        assert!(q.unpermuted && q.ggml_type == GgmlType::Q4_1 && q.gguf_name == "blk.1.attn_q.weight");

        let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
        assert_eq!(bytes.len() as u64, report.safetensors_bytes);
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert_eq!(st.len(), tiny.expected.len());
        for (name, shape, vals) in &tiny.expected {
            let t = st.tensor(name).unwrap();
            assert_eq!(t.dtype(), safetensors::Dtype::F32, "{name}");
            assert_eq!(t.shape(), shape.as_slice(), "{name}");
            let got = f32s(t.data());
            assert!(got.iter().zip(vals).all(|(a, b)| a.to_bits() == b.to_bits()), "{name} differs");
        }
        assert_eq!(st.tensor("lm_head.weight").is_ok(), !tied);

        let c = read_json(&out.join("config.json"));
        assert_eq!(c["architectures"][0], "LlamaForCausalLM");
        assert_eq!(c["hidden_size"], TINY_HIDDEN);
        assert_eq!(c["num_attention_heads"], TINY_HEADS);
        assert_eq!(c["num_key_value_heads"], TINY_KV);
        assert_eq!(c["head_dim"], TINY_HEAD_DIM);
        assert_eq!(c["rms_norm_eps"], 1e-5);
        assert_eq!(c["rope_theta"], 10000.0);
        assert_eq!(c["max_position_embeddings"], 2048);
        assert_eq!(c["tie_word_embeddings"], tied);
        assert_eq!(c["vocab_size"], report.vocab_size);

        let tok = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
        let enc = tok.encode("Hello world 42<|im_end|>", false).unwrap();
        assert_eq!(enc.get_tokens(), ["Hello", "Ġworld", "Ġ", "4", "2", "<|im_end|>"]);
        assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), "Hello world 42<|im_end|>");
        let tc = read_json(&out.join("tokenizer_config.json"));
        assert_eq!((tc["bos_token"].as_str(), tc["eos_token"].as_str()), (Some("<|im_start|>"), Some("<|im_end|>")));
        assert!(tc["chat_template"].as_str().unwrap().contains("im_start"));
        let g = read_json(&out.join("generation_config.json"));
        assert_eq!((g["bos_token_id"].as_u64(), g["eos_token_id"].as_u64()), (Some(1), Some(2)));
    }
}

/// Mutation fuzzing of the reader and the converter together: a mutated tiny Llama GGUF either converts
/// or fails with an error naming the file; never a panic, and never an allocation sized by a hostile
/// count (which would abort the test process).
#[test]
fn mutated_gguf_files_never_panic() {
    let good = tiny_llama(false).writer.bytes();
    let (path, out) = (tmp_dir().join("fuzz.gguf"), tmp_dir().join("fuzz.out"));
    let converted = std::cell::Cell::new(0u32);
    int4_test_support::fuzz::run("gguf", int4_test_support::fuzz::edits(), |edits| {
        std::fs::write(&path, int4_test_support::fuzz::apply(&good, edits)).unwrap();
        let _ = std::fs::remove_dir_all(&out);
        match catch_unwind(AssertUnwindSafe(|| gguf_to_hf(&path, &out))) {
            Err(_) => Err(format!("panicked on {edits:?}")),
            Ok(Ok(_)) => {
                converted.set(converted.get() + 1);
                Ok(())
            }
            Ok(Err(e)) if e.to_string().contains("fuzz.gguf") => Ok(()),
            Ok(Err(e)) => Err(format!("the error does not name the file: {e}")),
        }
    });
    eprintln!("fuzz gguf: {} mutated files still converted", converted.get());
}

#[test]
fn conversion_refuses_what_it_cannot_convert() {
    let convert = |w: &Writer, name: &str| {
        let gguf = w.write(name);
        gguf_to_hf(&gguf, &tmp_dir().join(format!("{name}.out"))).unwrap_err()
    };
    let base = || tiny_llama(true).writer;

    let mut w = base();
    w.kvs[0].1 = GgufValue::String("qwen2".into());
    let e = convert(&w, "arch.gguf");
    assert!(matches!(e.kind(), ConvertErrorKind::Unsupported(_)) && e.field() == "general.architecture", "{e}");
    assert!(e.to_string().contains("arch.gguf") && e.to_string().contains("qwen2"), "{e}");

    let mut w = base();
    let i = w.kvs.iter().position(|(k, _)| k == "tokenizer.ggml.model").unwrap();
    w.kvs[i].1 = GgufValue::String("llama".into());
    let e = convert(&w, "tok.gguf");
    assert!(e.field() == "tokenizer.ggml.model" && e.to_string().contains("\"llama\""), "{e}");

    let mut w = base();
    w.kvs.retain(|(k, _)| k != "llama.block_count");
    let e = convert(&w, "missing-key.gguf");
    assert!(matches!(e.kind(), ConvertErrorKind::Missing) && e.field() == "llama.block_count", "{e}");

    // A block count the file cannot hold (2^40 blocks) is refused before anything is sized by it.
    let mut w = base();
    let i = w.kvs.iter().position(|(k, _)| k == "llama.block_count").unwrap();
    w.kvs[i].1 = GgufValue::U64(1 << 40);
    let e = convert(&w, "blocks.gguf");
    assert!(matches!(e.kind(), ConvertErrorKind::Invalid(_)) && e.field() == "llama.block_count", "{e}");
    assert!(e.to_string().contains("1099511627776 blocks"), "{e}");

    // A NaN or infinite float is an error, not a `null` that loads as the default.
    for (key, bad) in [("llama.rope.freq_base", f32::NAN), ("llama.attention.layer_norm_rms_epsilon", f32::INFINITY)] {
        let mut w = base();
        w.kvs.retain(|(k, _)| k != key);
        w.kv(key, GgufValue::F32(bad));
        let e = convert(&w, "nan.gguf");
        assert!(matches!(e.kind(), ConvertErrorKind::Invalid(_)) && e.field() == key, "{key}: {e}");
    }

    let mut w = base();
    w.tensor("blk.0.attn_q.bias", &[32], GgmlType::F32, vec![0; 128]);
    let e = convert(&w, "extra.gguf");
    assert!(matches!(e.kind(), ConvertErrorKind::Unsupported(_)) && e.field() == "blk.0.attn_q.bias", "{e}");

    let mut w = base();
    w.tensors.retain(|t| t.name != "blk.1.ffn_up.weight");
    let e = convert(&w, "missing-tensor.gguf");
    assert!(matches!(e.kind(), ConvertErrorKind::Missing) && e.field() == "blk.1.ffn_up.weight", "{e}");

    let mut w = base();
    let i = w.kvs.iter().position(|(k, _)| k == "llama.feed_forward_length").unwrap();
    w.kvs[i].1 = GgufValue::U32(48);
    let e = convert(&w, "shape.gguf");
    assert!(matches!(e.kind(), ConvertErrorKind::Invalid(_)) && e.field() == "blk.0.ffn_gate.weight", "{e}");

    let mut w = base();
    let t = w.tensors.iter_mut().find(|t| t.name == "blk.0.ffn_gate.weight").unwrap();
    t.ggml_type = GgmlType::Q5_1.id();
    t.data = vec![0; 24 * 64];
    let e = convert(&w, "q5.gguf");
    assert!(matches!(e.kind(), ConvertErrorKind::Gguf(_)), "{e}");
    assert!(e.to_string().contains("q5_1") && e.to_string().contains("(blk.0.ffn_gate.weight)"), "{e}");
}

// ---------------------------------------------------------------------------------------------------------
// (c) The real default model.

/// The default model's GGUF and its conversion into a scratch directory, or `None` (after saying so) when
/// the model is not there.
fn real_model() -> Option<(PathBuf, PathBuf)> {
    let dir = int4_cache::dirs::default_model_dir();
    let gguf = dir.as_ref().map(|d| d.join("SmolLM2-135M-Instruct.Q4_1.gguf")).filter(|g| g.is_file());
    if let Some(gguf) = gguf {
        let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("smollm2-hf-{}", std::process::id()));
        let report = gguf_to_hf(&gguf, &out).unwrap();
        assert_eq!(report.vocab_size, 49152);
        return Some((gguf, out));
    }
    let shown =
        dir.map_or("(no INT4_MODEL_DIR, INT4_CACHE_DIR, XDG_CACHE_HOME or HOME)".into(), |d| d.display().to_string());
    let msg = format!("default model not found at {shown}, run cargo xtask fetch-model");
    assert!(std::env::var("CI").as_deref() != Ok("true"), "gguf_convert: {msg} (CI=true requires the model)");
    eprintln!("SKIPPED: {msg}");
    use std::io::Write;
    let skips = concat!(env!("CARGO_TARGET_TMPDIR"), "/int4-test-skips.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(skips) {
        let _ = writeln!(f, "gguf_convert: SKIPPED the real-model test ({msg})");
    }
    None
}

#[test]
fn the_real_model_is_converted_and_loads() {
    let Some((gguf_path, dir)) = real_model() else { return };

    let c = read_json(&dir.join("config.json"));
    assert_eq!(c["model_type"], "llama");
    assert_eq!(c["hidden_size"], 576);
    assert_eq!(c["intermediate_size"], 1536);
    assert_eq!(c["num_hidden_layers"], 30);
    assert_eq!(c["num_attention_heads"], 9);
    assert_eq!(c["num_key_value_heads"], 3);
    assert_eq!(c["head_dim"], 64);
    assert_eq!(c["vocab_size"], 49152);
    assert_eq!(c["tie_word_embeddings"], true);
    assert_eq!(c["rope_theta"], 100000.0);
    assert_eq!(c["rms_norm_eps"], 1e-5);
    assert_eq!(c["max_position_embeddings"], 8192);
    assert_eq!((c["bos_token_id"].as_u64(), c["eos_token_id"].as_u64()), (Some(1), Some(2)));

    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), 2 + 30 * 9);
    let shape = |n: &str| st.tensor(n).unwrap().shape().to_vec();
    assert_eq!(shape("model.embed_tokens.weight"), [49152, 576]);
    assert_eq!(shape("model.layers.0.self_attn.q_proj.weight"), [576, 576]);
    assert_eq!(shape("model.layers.29.self_attn.k_proj.weight"), [192, 576]);
    assert_eq!(shape("model.layers.7.mlp.down_proj.weight"), [576, 1536]);
    assert_eq!(shape("model.layers.7.mlp.gate_proj.weight"), [1536, 576]);
    assert_eq!(shape("model.norm.weight"), [576]);
    assert!(st.tensor("lm_head.weight").is_err());

    // The safetensors hold the GGUF's exact values (Q/K rows un-permuted).
    let gguf = GgufFile::open(&gguf_path).unwrap();
    let down = gguf.tensor_f32("blk.3.ffn_down.weight").unwrap();
    assert_eq!(f32s(st.tensor("model.layers.3.mlp.down_proj.weight").unwrap().data()), down);
    let k = gguf.tensor_f32("blk.3.attn_k.weight").unwrap();
    assert_eq!(
        f32s(st.tensor("model.layers.3.self_attn.k_proj.weight").unwrap().data()),
        int4_gguf::unpermute_qk(&k, 3, 192, 576)
    );
    let embed = gguf.tensor_f32("token_embd.weight").unwrap();
    assert_eq!(gguf.tensor("token_embd.weight").unwrap().ggml_type, GgmlType::Q8_0);
    assert_eq!(f32s(st.tensor("model.embed_tokens.weight").unwrap().data()), embed);

    // Q4_1 blocks reproduce the dequantized tensor exactly, for every weight of one layer.
    for part in ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"] {
        let name = format!("blk.5.{part}.weight");
        assert_eq!(gguf.tensor(&name).unwrap().ggml_type, GgmlType::Q4_1, "{name}");
        let (codes, d, m) = gguf.q4_1_blocks(&name).unwrap();
        let deq = gguf.tensor_f32(&name).unwrap();
        assert_eq!(codes.len(), deq.len());
        assert_eq!(d.len() * 32, deq.len());
        for (i, w) in deq.iter().enumerate() {
            assert!(codes[i] < 16);
            assert_eq!((codes[i] as f32 * d[i / 32] + m[i / 32]).to_bits(), w.to_bits(), "{name}[{i}]");
        }
    }

    let tok = tokenizers::Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
    assert_eq!(tok.get_vocab_size(true), 49152);
    let text = "Hello, world! 123";
    let enc = tok.encode(text, false).unwrap();
    assert_eq!(tok.decode(enc.get_ids(), false).unwrap(), text);
    // Digits are split one by one, as in the original tokenizer.
    assert_eq!(&enc.get_tokens()[enc.len() - 3..], ["1", "2", "3"]);
    let enc = tok.encode("<|im_start|>user\nHi<|im_end|>", false).unwrap();
    assert_eq!((enc.get_ids()[0], *enc.get_ids().last().unwrap()), (1, 2));

    let tc = read_json(&dir.join("tokenizer_config.json"));
    let template = tc["chat_template"].as_str().expect("tokenizer_config.json has a chat_template");
    assert!(template.contains("<|im_start|>") && template.contains("add_generation_prompt"), "{template}");
    assert_eq!((tc["bos_token"].as_str(), tc["eos_token"].as_str()), (Some("<|im_start|>"), Some("<|im_end|>")));
    drop(st);
    drop(bytes);
    std::fs::remove_dir_all(&dir).unwrap();
}
