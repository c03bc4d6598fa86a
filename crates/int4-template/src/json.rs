//! Python's `json.dumps`, over template values.
//!
//! Templates print tool schemas and tool-call arguments with `tojson`, and the model was trained on what
//! Python printed: `", "` and `": "` between items (`","` once an indent is set), non-ASCII text as it is,
//! keys in the order they were written, floats as Python's `repr` writes them (`1e-05`, `1e+16`, `2.0`).
//! minijinja's own `tojson` is compact, escapes HTML and sorts keys, so it is replaced by [`dumps`].

use minijinja::value::ValueKind;
use minijinja::{Error, ErrorKind, Value};

/// `json.dumps`'s arguments, with transformers' defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DumpOptions {
    /// Escape every non-ASCII character as `\uXXXX` (transformers: false).
    pub ensure_ascii: bool,
    /// Put each item on its own line, indented by this string per level (`None`: one line).
    pub indent: Option<String>,
    /// The item and key separators (`None`: `", "` and `": "`, or `","` and `": "` with an indent).
    pub separators: Option<(String, String)>,
    /// Write each object's keys in sorted order.
    pub sort_keys: bool,
}

/// Nesting deeper than this is refused (Python's recursion limit would stop it near here too).
const MAX_DEPTH: usize = 512;

/// `value` as `json.dumps(value, **opts)` writes it.
pub fn dumps(value: &Value, opts: &DumpOptions) -> Result<String, Error> {
    let (item, key) = match &opts.separators {
        Some((i, k)) => (i.as_str(), k.as_str()),
        None if opts.indent.is_some() => (",", ": "),
        None => (", ", ": "),
    };
    let mut w = Writer { out: String::new(), opts, item, key };
    w.value(value, 0)?;
    Ok(w.out)
}

/// `indent=`: `None`, a number of spaces (a negative number is none, as in Python), or a string.
pub(crate) fn indent_of(v: &Value) -> Result<Option<String>, Error> {
    if v.is_none() || v.is_undefined() {
        return Ok(None);
    }
    if let Some(s) = v.as_str() {
        return Ok(Some(s.to_string()));
    }
    match v.as_i64() {
        Some(n) if v.is_integer() => Ok(Some(" ".repeat(n.clamp(0, 64) as usize))),
        _ => Err(Error::new(ErrorKind::InvalidOperation, format!("tojson: indent={v} is not a number or a string"))),
    }
}

/// `separators=`: `None` or a pair of strings.
pub(crate) fn separators_of(v: &Value) -> Result<Option<(String, String)>, Error> {
    if v.is_none() || v.is_undefined() {
        return Ok(None);
    }
    let bad = || Error::new(ErrorKind::InvalidOperation, format!("tojson: separators={v} is not a pair of strings"));
    let items: Vec<Value> = v.try_iter().map_err(|_| bad())?.collect();
    match items.as_slice() {
        [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
            Ok(Some((a.as_str().unwrap_or_default().to_string(), b.as_str().unwrap_or_default().to_string())))
        }
        _ => Err(bad()),
    }
}

struct Writer<'a> {
    out: String,
    opts: &'a DumpOptions,
    item: &'a str,
    key: &'a str,
}

impl Writer<'_> {
    fn newline(&mut self, depth: usize) {
        if let Some(indent) = &self.opts.indent {
            self.out.push('\n');
            for _ in 0..depth {
                self.out.push_str(indent);
            }
        }
    }

    fn value(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        if depth > MAX_DEPTH {
            return Err(Error::new(ErrorKind::InvalidOperation, "tojson: the value is nested too deeply"));
        }
        match v.kind() {
            ValueKind::None => self.out.push_str("null"),
            ValueKind::Bool => self.out.push_str(if v.is_true() { "true" } else { "false" }),
            ValueKind::Number => self.number(v)?,
            ValueKind::String => self.string(v.as_str().unwrap_or_default()),
            ValueKind::Seq | ValueKind::Iterable => {
                let items: Vec<Value> = v.try_iter()?.collect();
                self.list(&items, depth)?;
            }
            ValueKind::Map => self.map(v, depth)?,
            ValueKind::Undefined => {
                return Err(Error::new(
                    ErrorKind::UndefinedError,
                    "tojson: an undefined value is not JSON serializable",
                ));
            }
            other => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson: a value of type {other} is not JSON serializable"),
                ));
            }
        }
        Ok(())
    }

    fn number(&mut self, v: &Value) -> Result<(), Error> {
        if v.is_integer() {
            self.out.push_str(&v.to_string());
            return Ok(());
        }
        let f = f64::try_from(v.clone())?;
        self.out.push_str(&py_float_repr(f));
        Ok(())
    }

    fn list(&mut self, items: &[Value], depth: usize) -> Result<(), Error> {
        if items.is_empty() {
            self.out.push_str("[]");
            return Ok(());
        }
        self.out.push('[');
        for (i, item) in items.iter().enumerate() {
            if i > 0 {
                self.out.push_str(self.item);
            }
            self.newline(depth + 1);
            self.value(item, depth + 1)?;
        }
        self.newline(depth);
        self.out.push(']');
        Ok(())
    }

    fn map(&mut self, v: &Value, depth: usize) -> Result<(), Error> {
        let mut pairs = Vec::new();
        for k in v.try_iter()? {
            let item = v.get_item(&k)?;
            pairs.push((key_string(&k)?, item));
        }
        if self.opts.sort_keys {
            pairs.sort_by(|a, b| a.0.cmp(&b.0));
        }
        if pairs.is_empty() {
            self.out.push_str("{}");
            return Ok(());
        }
        self.out.push('{');
        for (i, (k, item)) in pairs.iter().enumerate() {
            if i > 0 {
                self.out.push_str(self.item);
            }
            self.newline(depth + 1);
            self.string(k);
            self.out.push_str(self.key);
            self.value(item, depth + 1)?;
        }
        self.newline(depth);
        self.out.push('}');
        Ok(())
    }

    fn string(&mut self, s: &str) {
        self.out.push('"');
        for c in s.chars() {
            match c {
                '"' => self.out.push_str("\\\""),
                '\\' => self.out.push_str("\\\\"),
                '\n' => self.out.push_str("\\n"),
                '\r' => self.out.push_str("\\r"),
                '\t' => self.out.push_str("\\t"),
                '\u{8}' => self.out.push_str("\\b"),
                '\u{c}' => self.out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.opts.ensure_ascii && !(' '..='~').contains(&c)) => {
                    let mut units = [0u16; 2];
                    for u in c.encode_utf16(&mut units) {
                        self.out.push_str(&format!("\\u{u:04x}"));
                    }
                }
                c => self.out.push(c),
            }
        }
        self.out.push('"');
    }
}

/// An object key as Python writes it: a string as it is; a number, boolean or null as its JSON.
fn key_string(k: &Value) -> Result<String, Error> {
    match k.kind() {
        ValueKind::String => Ok(k.as_str().unwrap_or_default().to_string()),
        ValueKind::Number if k.is_integer() => Ok(k.to_string()),
        ValueKind::Number => Ok(py_float_repr(f64::try_from(k.clone())?)),
        ValueKind::Bool => Ok(if k.is_true() { "true" } else { "false" }.to_string()),
        ValueKind::None => Ok("null".to_string()),
        other => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("tojson: keys must be str, int, float, bool or None, not {other}"),
        )),
    }
}

/// A float as Python's `repr` writes it (and so `json.dumps`): the shortest digits that read back as the
/// same float, positional from 1e-4 up to 1e16 (always with a fractional part), else `d.ddde±XX`.
pub(crate) fn py_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    // Rust's `{:e}` writes the shortest round-tripping digits: "-1.25e-5".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').expect("{:e} always writes an exponent");
    let exp: i32 = exp.parse().expect("{:e} writes a decimal exponent");
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let mut out = String::from(sign);
    if (-4..16).contains(&exp) {
        if exp < 0 {
            out.push_str("0.");
            out.push_str(&"0".repeat((-exp - 1) as usize));
            out.push_str(&digits);
        } else {
            let point = exp as usize + 1;
            if digits.len() <= point {
                out.push_str(&digits);
                out.push_str(&"0".repeat(point - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push_str(&format!("e{}{:02}", if exp < 0 { '-' } else { '+' }, exp.abs()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_python_repr_writes_them() {
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (1e-4, "0.0001"),
            (1.5e-5, "1.5e-05"),
            (1e16, "1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (123456789012345678.0, "1.2345678901234568e+17"),
            (1e100, "1e+100"),
            (2.5e-300, "2.5e-300"),
            (f64::NAN, "NaN"),
            (f64::NEG_INFINITY, "-Infinity"),
            (2.75, "2.75"),
            (100.0, "100.0"),
        ];
        for (x, want) in cases {
            assert_eq!(py_float_repr(x), want, "{x:e}");
        }
    }

    #[test]
    fn separators_indent_escapes_and_order() {
        let v: Value =
            serde_json::from_str(r#"{"b": [1, 2.0, {"z": null, "a": true}], "a": "é\n\"\u0001", "c": {}, "d": []}"#)
                .unwrap();
        assert_eq!(
            dumps(&v, &DumpOptions::default()).unwrap(),
            r#"{"b": [1, 2.0, {"z": null, "a": true}], "a": "é\n\"\u0001", "c": {}, "d": []}"#
        );
        let sorted = DumpOptions { sort_keys: true, ..DumpOptions::default() };
        assert_eq!(
            dumps(&v, &sorted).unwrap(),
            r#"{"a": "é\n\"\u0001", "b": [1, 2.0, {"a": true, "z": null}], "c": {}, "d": []}"#
        );
        let indented = DumpOptions { indent: Some("  ".into()), ..DumpOptions::default() };
        assert_eq!(
            dumps(&v, &indented).unwrap(),
            "{\n  \"b\": [\n    1,\n    2.0,\n    {\n      \"z\": null,\n      \"a\": true\n    }\n  ],\n  \"a\": \"é\\n\\\"\\u0001\",\n  \"c\": {},\n  \"d\": []\n}"
        );
        let ascii =
            DumpOptions { ensure_ascii: true, separators: Some((",".into(), ":".into())), ..DumpOptions::default() };
        let s: Value = serde_json::from_str(r#"["é😀\u007f"]"#).unwrap();
        assert_eq!(dumps(&s, &ascii).unwrap(), r#"["\u00e9\ud83d\ude00\u007f"]"#);
    }
}
