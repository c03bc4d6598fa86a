//! What a `.gguf` file's name says: whether it is a model (not a vision projector or an importance matrix),
//! whether it is one part of a split model, and whether it carries a given quant.
//!
//! The quant rule is llama.cpp's `-hf repo:QUANT` rule made exact on both sides. llama.cpp picks the first
//! file whose path matches the regex `QUANT[.-]`, case-insensitive: the quant must be followed by `.` or `-`
//! (so `Q4_0` does not pick `…-Q4_0_4_4.gguf`), but it may be preceded by anything (so `Q4_0` would pick
//! `…-IQ4_0.gguf` too, and `K_M` would pick `…-Q4_K_M.gguf`). Here the quant must be a whole token of the
//! name without `.gguf`: preceded by the start, `-` or `.`, and followed by the end, `-` or `.`, compared
//! ASCII-case-insensitively. `Q4_0` matches `SmolLM2-135M-Instruct-Q4_0.gguf`, `model.q4_0.gguf` and
//! `model-Q4_0-00001-of-00002.gguf`, and neither `…-Q4_0_4_4.gguf` nor `…-IQ4_0.gguf`. `_` is no boundary
//! because quant names are made of `_`-joined parts. And where llama.cpp takes the first match, several
//! matches are an error here, since which one is "first" depends on a directory listing's order.

/// Whether the file name `name` (ending in `.gguf`) holds `quant` as a whole token.
pub(crate) fn has_quant(name: &str, quant: &str) -> bool {
    let stem = stem(name).to_ascii_lowercase();
    let quant = quant.to_ascii_lowercase();
    if quant.is_empty() {
        return false;
    }
    let boundary = |b: u8| b == b'-' || b == b'.';
    let bytes = stem.as_bytes();
    let mut from = 0;
    while let Some(i) = stem[from..].find(&quant).map(|i| i + from) {
        let end = i + quant.len();
        let left = i == 0 || boundary(bytes[i - 1]);
        let right = end == bytes.len() || boundary(bytes[end]);
        if left && right {
            return true;
        }
        from = i + 1;
        while !stem.is_char_boundary(from) {
            from += 1;
        }
    }
    false
}

/// Whether `name` ends in `.gguf` (ASCII-case-insensitively).
pub(crate) fn is_gguf(name: &str) -> bool {
    name.len() > 5 && name.is_char_boundary(name.len() - 5) && name[name.len() - 5..].eq_ignore_ascii_case(".gguf")
}

/// Whether a `.gguf` file holds a model, as llama.cpp decides: not a multimodal projector (`mmproj`) nor an
/// importance matrix (`imatrix`).
pub(crate) fn is_model(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !lower.contains("mmproj") && !lower.contains("imatrix")
}

/// For one part of a split model (`<prefix>-00001-of-00003.gguf`), the prefix and the part count, which
/// together name the model the part belongs to.
pub(crate) fn split_of(name: &str) -> Option<(String, u32)> {
    let stem = stem(name);
    // "-NNNNN-of-NNNNN" is 15 ASCII bytes.
    let cut = stem.len().checked_sub(15)?;
    if !stem.is_char_boundary(cut) {
        return None;
    }
    let (prefix, tail) = stem.split_at(cut);
    let t = tail.as_bytes();
    let digits = |r: std::ops::Range<usize>| t[r].iter().all(u8::is_ascii_digit);
    if t[0] != b'-' || !digits(1..6) || !t[6..10].eq_ignore_ascii_case(b"-of-") || !digits(10..15) {
        return None;
    }
    let count: u32 = tail[10..15].parse().ok()?;
    Some((prefix.to_owned(), count))
}

/// `name` without a trailing `.gguf`.
fn stem(name: &str) -> &str {
    if is_gguf(name) { &name[..name.len() - 5] } else { name }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quants_match_whole_tokens_only() {
        assert!(has_quant("SmolLM2-135M-Instruct-Q4_0.gguf", "Q4_0"));
        assert!(has_quant("model.q4_0.gguf", "Q4_0"));
        assert!(has_quant("model.Q4_0.gguf", "q4_0"));
        assert!(has_quant("Q4_0.gguf", "q4_0"));
        assert!(has_quant("m-Q4_0-00001-of-00002.gguf", "Q4_0"));
        assert!(has_quant("m-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"));
        assert!(has_quant("m-IQ4_0-Q4_0.gguf", "Q4_0"), "a later occurrence still counts");
        assert!(!has_quant("m-Q4_0_4_4.gguf", "Q4_0"));
        assert!(!has_quant("m-IQ4_0.gguf", "Q4_0"));
        assert!(!has_quant("m-Q4_K_M.gguf", "K_M"));
        assert!(!has_quant("m-Q4_K_M.gguf", "Q4_K"));
        assert!(!has_quant("m_Q4_0.gguf", "Q4_0"));
        assert!(!has_quant("m.gguf", "gguf"));
        assert!(!has_quant("m-Q4_0.gguf", ""));
        assert!(!has_quant("m-é-Q4_0x.gguf", "Q4_0"));
    }

    #[test]
    fn split_parts_are_recognised() {
        assert_eq!(split_of("m-Q4_0-00001-of-00003.gguf"), Some(("m-Q4_0".into(), 3)));
        assert_eq!(split_of("m-Q4_0-00002-OF-00003.GGUF"), Some(("m-Q4_0".into(), 3)));
        assert_eq!(split_of("m-Q4_0.gguf"), None);
        assert_eq!(split_of("m-0001-of-00003.gguf"), None);
        assert_eq!(split_of("-of-.gguf"), None);
        assert_eq!(split_of("éééééééé.gguf"), None);
        // A multi-byte character right after the first number: never a split, never a panic.
        assert_eq!(split_of("m-00001-o€1234.gguf"), None);
        assert_eq!(split_of("x-Q4_0-00001-o€1234.gguf"), None);
    }

    #[test]
    fn projectors_and_matrices_are_not_models() {
        assert!(is_gguf("a.GGUF") && !is_gguf(".gguf") && !is_gguf("a.gguf.incomplete"));
        assert!(is_model("m-Q4_0.gguf"));
        assert!(!is_model("mmproj-m-f16.gguf"));
        assert!(!is_model("m.imatrix.gguf"));
    }
}
