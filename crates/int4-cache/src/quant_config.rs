//! Normalising a checkpoint's `quantization_config` so that equal meanings hash equally.
//!
//! Defaults are filled in (an absent key and its explicit default normalise the same). Keys are sorted
//! into three maps: `fields` (keys this project reads), `ignored` (keys it knows and deliberately does
//! not act on, such as GPTQ's `damp_percent`), and `unknown` (everything else, hashed and warned about,
//! never dropped). Only values the project cannot honour (`bits` other than 4, a mistyped value) are
//! errors.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{Value, json};

use crate::error::CacheError;

/// A normalised `quantization_config`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NormalizedConfig {
    /// `none` (unquantized), `cpu_int4`, `gptq` or `awq`.
    pub method: String,
    /// Keys this project reads, defaults filled in.
    pub fields: BTreeMap<String, Value>,
    /// Keys known and deliberately not acted on.
    pub ignored: BTreeMap<String, Value>,
    /// Keys not known (hashed, and warned about).
    pub unknown: BTreeMap<String, Value>,
    /// One warning per unknown key.
    #[serde(skip)]
    pub warnings: Vec<String>,
}

/// `(key, default, kind)` for every key a method reads.
type Known = &'static [(&'static str, fn() -> Value, Kind)];

#[derive(Clone, Copy)]
enum Kind {
    Int,
    Bool,
    Str,
    StrList,
    OptInt,
}

const CPU_INT4: Known = &[
    ("bits", || json!(4), Kind::Int),
    ("group_size", || json!(128), Kind::Int),
    ("quantize_embedding", || json!(true), Kind::Bool),
    ("prefill_dequant", || json!(true), Kind::Bool),
    ("direct_dequant", || json!(true), Kind::Bool),
    ("dequant_threshold", || Value::Null, Kind::OptInt),
    ("ignore", || json!([]), Kind::StrList),
];
const CPU_INT4_IGNORED: &[&str] = &["use_custom_op"];

const GPTQ: Known = &[
    ("bits", || json!(4), Kind::Int),
    ("group_size", || json!(128), Kind::Int),
    ("sym", || json!(true), Kind::Bool),
    ("desc_act", || json!(false), Kind::Bool),
    ("checkpoint_format", || json!("gptq"), Kind::Str),
    ("lm_head", || json!(false), Kind::Bool),
];
const GPTQ_IGNORED: &[&str] = &[
    "damp_percent",
    "damp_auto_increment",
    "true_sequential",
    "static_groups",
    "model_name_or_path",
    "model_file_base_name",
    "pack_dtype",
    "meta",
    "quantizer",
    "mse",
    "is_marlin_format",
    "format",
];

const AWQ: Known = &[
    ("bits", || json!(4), Kind::Int),
    ("group_size", || json!(128), Kind::Int),
    ("zero_point", || json!(true), Kind::Bool),
    ("version", || json!("gemm"), Kind::Str),
    ("modules_to_not_convert", || json!([]), Kind::StrList),
];
const AWQ_IGNORED: &[&str] = &["do_fuse", "fuse_max_seq_len", "backend"];

/// Normalises `quantization_config` (`None` for an unquantized checkpoint).
pub fn normalize(config: Option<&Value>) -> Result<NormalizedConfig, CacheError> {
    let Some(config) = config else {
        return Ok(NormalizedConfig {
            method: "none".into(),
            fields: BTreeMap::new(),
            ignored: BTreeMap::new(),
            unknown: BTreeMap::new(),
            warnings: Vec::new(),
        });
    };
    let obj = config.as_object().ok_or_else(|| CacheError::config("is not a JSON object"))?;
    let method = obj
        .get("quant_method")
        .and_then(Value::as_str)
        .ok_or_else(|| CacheError::config("has no string \"quant_method\""))?
        .to_string();
    let (known, ignored_names): (Known, &[&str]) = match method.as_str() {
        "cpu_int4" => (CPU_INT4, CPU_INT4_IGNORED),
        "gptq" => (GPTQ, GPTQ_IGNORED),
        "awq" => (AWQ, AWQ_IGNORED),
        other => {
            return Err(CacheError::config(format!("quant_method \"{other}\" is not supported (cpu_int4, gptq, awq)")));
        }
    };
    let mut fields = BTreeMap::new();
    for (name, default, kind) in known {
        let v = obj.get(*name).cloned().unwrap_or_else(default);
        let ok = match kind {
            Kind::Int => v.as_i64().is_some(),
            Kind::Bool => v.is_boolean(),
            Kind::Str => v.is_string(),
            Kind::StrList => v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
            Kind::OptInt => v.is_null() || v.as_u64().is_some(),
        };
        if !ok {
            return Err(CacheError::config(format!("\"{name}\" has the wrong type ({v})")));
        }
        fields.insert((*name).to_string(), v);
    }
    if fields["bits"] != json!(4) {
        return Err(CacheError::config(format!("bits = {} is not supported: only 4-bit weights", fields["bits"])));
    }
    let gs = fields["group_size"].as_i64().unwrap_or(0);
    if ![32, 64, 128, 256, -1].contains(&gs) {
        return Err(CacheError::config(format!("group_size = {gs} is not supported (32, 64, 128, 256, -1)")));
    }
    let mut ignored = BTreeMap::new();
    let mut unknown = BTreeMap::new();
    let mut warnings = Vec::new();
    for (k, v) in obj {
        if k == "quant_method" || known.iter().any(|(n, _, _)| n == k) {
            continue;
        }
        if ignored_names.contains(&k.as_str()) {
            ignored.insert(k.clone(), v.clone());
        } else {
            warnings.push(format!(
                "quantization_config key \"{k}\" is not known to int4; it is kept in the cache key but has no effect"
            ));
            unknown.insert(k.clone(), v.clone());
        }
    }
    Ok(NormalizedConfig { method, fields, ignored, unknown, warnings })
}
