//! OpenAI's request and response shapes: parsing a body into a [`Parsed`] request (every field checked,
//! errors naming it), and building the JSON of a response or a stream chunk.
//!
//! Fields a request may give and we cannot honour (`n` > 1, `logit_bias`, `response_format` other than
//! text, a required or named `tool_choice`, `echo`, `suffix`, `best_of` > 1) are a 400 naming the field;
//! fields the API does not define are ignored, each name logged once, as vLLM does.

use std::collections::BTreeSet;
use std::sync::Mutex;

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use int4::template::Value as Ordered;
use int4::{ChatOptions, GenerationRequest, Messages, Prompt, SamplingOverrides};
use serde_json::{Map, Value, json};

/// An OpenAI-shaped error response.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong.
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `server_error`, …
    pub kind: &'static str,
    /// The request field concerned.
    pub param: Option<String>,
    /// `context_length_exceeded`, `model_not_found`, …
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 about `param`.
    pub fn bad(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param: Some(param.into()),
            code: None,
        }
    }

    /// A 400 with no one field to blame.
    pub fn bad_body(message: impl Into<String>) -> Self {
        ApiError { param: None, ..ApiError::bad("", message) }
    }

    /// The error body.
    pub fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::TOO_MANY_REQUESTS || self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}

/// Which endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

/// What to continue, before tokenizing.
#[derive(Clone, Debug)]
pub enum PromptInput {
    /// A conversation, for the chat template.
    Chat(Messages, ChatOptions),
    /// Text.
    Text(String),
    /// Token ids.
    Ids(Vec<u32>),
}

/// A request, parsed and checked.
#[derive(Clone, Debug)]
pub struct Parsed {
    /// Which endpoint it came to.
    pub endpoint: Endpoint,
    /// The `model` it names.
    pub model: String,
    /// One prompt (chat) or several (completions given a list).
    pub prompts: Vec<PromptInput>,
    /// Everything else the generation takes, for each prompt (its `prompt` is set per prompt once
    /// tokenized; `ignore_eos` and `stop_token_ids` are vLLM's extensions).
    pub generation: GenerationRequest,
    /// Stream the answer.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
}

/// The fields each endpoint knows (others are ignored and logged once).
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "stream",
    "stream_options",
    "n",
    "logit_bias",
    "user",
    "ignore_eos",
    "logprobs",
];
const CHAT: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "chat_template_kwargs",
    "add_generation_prompt",
];
const COMPLETION: &[&str] = &["prompt", "echo", "suffix", "best_of"];

static LOGGED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

/// Parses `body` for `endpoint`.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Parsed, ApiError> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_body(format!("the body is not valid JSON: {e}")))?;
    let Value::Object(o) = &v else { return Err(ApiError::bad_body("the body must be a JSON object")) };
    let known = |k: &str| {
        COMMON.contains(&k)
            || (endpoint == Endpoint::Chat && CHAT.contains(&k))
            || (endpoint == Endpoint::Completion && COMPLETION.contains(&k))
    };
    for k in o.keys().filter(|k| !known(k)) {
        if LOGGED.lock().map(|mut l| l.insert(k.clone())).unwrap_or(false) {
            eprintln!("[int4 serve] ignoring the field `{k}`, which this server does not know (logged once)");
        }
    }
    let model = match o.get("model") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(ApiError::bad("model", "`model` must be a string")),
        None => return Err(ApiError::bad("model", "`model` is required")),
    };
    if let Some(n) = uint(o, "n")?
        && n != 1
    {
        return Err(ApiError::bad("n", format!("n = {n}: this server returns one choice per prompt (n = 1)")));
    }
    if let Some(b) = o.get("logit_bias")
        && !(b.is_null() || b.as_object().is_some_and(Map::is_empty))
    {
        return Err(ApiError::bad("logit_bias", "`logit_bias` is not supported"));
    }
    let top_k = match o.get("top_k") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_i64() {
            Some(-1 | 0) => Some(0),
            Some(k) if k > 0 => Some(k as usize),
            _ => {
                return Err(ApiError::bad(
                    "top_k",
                    format!("top_k = {v}: give a positive integer, or -1 or 0 for all"),
                ));
            }
        },
    };
    let sampling = SamplingOverrides {
        temperature: float(o, "temperature")?,
        top_k,
        top_p: float(o, "top_p")?,
        min_p: float(o, "min_p")?,
        repetition_penalty: float(o, "repetition_penalty")?,
        presence_penalty: float(o, "presence_penalty")?,
        frequency_penalty: float(o, "frequency_penalty")?,
        seed: match o.get("seed") {
            None | Some(Value::Null) => None,
            Some(v) => Some(v.as_i64().ok_or_else(|| ApiError::bad("seed", "`seed` must be an integer"))? as u64),
        },
    };
    let stop = match o.get("stop") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .map(|s| {
                s.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ApiError::bad("stop", "`stop` must be a string or a list of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad("stop", "`stop` must be a string or a list of strings")),
    };
    let stop_token_ids = match o.get("stop_token_ids") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_u64()
                    .and_then(|t| u32::try_from(t).ok())
                    .ok_or_else(|| ApiError::bad("stop_token_ids", "`stop_token_ids` must be a list of token ids"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(ApiError::bad("stop_token_ids", "`stop_token_ids` must be a list of token ids")),
    };
    let stream = boolean(o, "stream")?.unwrap_or(false);
    let include_usage = match o.get("stream_options") {
        None | Some(Value::Null) => false,
        Some(Value::Object(so)) => boolean(so, "include_usage")
            .map_err(|e| ApiError { param: Some("stream_options.include_usage".into()), ..e })?
            .unwrap_or(false),
        Some(_) => return Err(ApiError::bad("stream_options", "`stream_options` must be an object")),
    };
    let ignore_eos = boolean(o, "ignore_eos")?.unwrap_or(false);
    let (prompts, max_tokens, logprobs) = match endpoint {
        Endpoint::Chat => chat_fields(o, body)?,
        Endpoint::Completion => completion_fields(o)?,
    };
    let mut generation = GenerationRequest::new(Prompt::Ids(Vec::new()));
    generation.sampling = sampling;
    generation.max_tokens = max_tokens;
    generation.stop = stop;
    generation.stop_token_ids = stop_token_ids;
    generation.logprobs = logprobs;
    generation.ignore_eos = ignore_eos;
    Ok(Parsed { endpoint, model, prompts, generation, stream, include_usage })
}

type Fields = (Vec<PromptInput>, Option<usize>, Option<usize>);

fn chat_fields(o: &Map<String, Value>, body: &[u8]) -> Result<Fields, ApiError> {
    if let Some(f) = o.get("response_format")
        && !f.is_null()
        && f.get("type").and_then(Value::as_str) != Some("text")
    {
        return Err(ApiError::bad(
            "response_format",
            "only `{\"type\": \"text\"}` is supported: no JSON mode or schema",
        ));
    }
    match o.get("tool_choice") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) if s == "auto" || s == "none" => {}
        Some(_) => {
            return Err(ApiError::bad(
                "tool_choice",
                "only `auto` and `none` are supported: a required or named tool choice needs constrained decoding",
            ));
        }
    }
    // The messages and tools again, keys in the order they were written (a template may print them).
    let ordered: Ordered =
        serde_json::from_slice(body).map_err(|e| ApiError::bad_body(format!("the body is not valid JSON: {e}")))?;
    let messages = match o.get("messages") {
        Some(Value::Array(a)) if !a.is_empty() => {
            Messages::from_value(&ordered.get_attr("messages").unwrap_or_default())
                .map_err(|e| ApiError::bad("messages", e.to_string()))?
        }
        Some(Value::Array(_)) => return Err(ApiError::bad("messages", "`messages` is empty")),
        Some(_) => return Err(ApiError::bad("messages", "`messages` must be a list of message objects")),
        None => return Err(ApiError::bad("messages", "`messages` is required")),
    };
    let tools = match o.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) if a.is_empty() => None,
        Some(Value::Array(_)) if o.get("tool_choice").and_then(Value::as_str) == Some("none") => None,
        Some(Value::Array(_)) => Some(ordered.get_attr("tools").unwrap_or_default()),
        Some(_) => return Err(ApiError::bad("tools", "`tools` must be a list")),
    };
    let mut extra = Vec::new();
    match o.get("chat_template_kwargs") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            let kw = ordered.get_attr("chat_template_kwargs").unwrap_or_default();
            for k in m.keys() {
                extra.push((k.clone(), kw.get_attr(k).unwrap_or_default()));
            }
        }
        Some(_) => return Err(ApiError::bad("chat_template_kwargs", "`chat_template_kwargs` must be an object")),
    }
    let add_generation_prompt = boolean(o, "add_generation_prompt")?.unwrap_or(true);
    let max_tokens = match uint(o, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => uint(o, "max_tokens")?,
    };
    let logprobs = match boolean(o, "logprobs")? {
        Some(true) => Some(uint(o, "top_logprobs")?.unwrap_or(0)),
        _ => {
            if uint(o, "top_logprobs")?.is_some_and(|n| n > 0) {
                return Err(ApiError::bad("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
            }
            None
        }
    };
    let options = ChatOptions { tools, add_generation_prompt, extra };
    Ok((vec![PromptInput::Chat(messages, options)], max_tokens, logprobs))
}

fn completion_fields(o: &Map<String, Value>) -> Result<Fields, ApiError> {
    if boolean(o, "echo")?.unwrap_or(false) {
        return Err(ApiError::bad("echo", "`echo` is not supported"));
    }
    if o.get("suffix").is_some_and(|s| !s.is_null()) {
        return Err(ApiError::bad("suffix", "`suffix` is not supported"));
    }
    if uint(o, "best_of")?.is_some_and(|b| b > 1) {
        return Err(ApiError::bad("best_of", "`best_of` > 1 is not supported"));
    }
    let bad = || {
        ApiError::bad(
            "prompt",
            "`prompt` must be a string, a list of strings, a list of token ids, or a list of such lists",
        )
    };
    let ids = |a: &[Value]| -> Option<Vec<u32>> {
        a.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect()
    };
    let prompts = match o.get("prompt") {
        Some(Value::String(s)) => vec![PromptInput::Text(s.clone())],
        Some(Value::Array(a)) if a.is_empty() => return Err(ApiError::bad("prompt", "`prompt` is empty")),
        Some(Value::Array(a)) if a.iter().all(Value::is_string) => {
            a.iter().map(|s| PromptInput::Text(s.as_str().unwrap_or_default().to_string())).collect()
        }
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![PromptInput::Ids(ids(a).ok_or_else(bad)?)],
        Some(Value::Array(a)) if a.iter().all(Value::is_array) => a
            .iter()
            .map(|p| ids(p.as_array().map_or(&[][..], Vec::as_slice)).map(PromptInput::Ids).ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        None => return Err(ApiError::bad("prompt", "`prompt` is required")),
        Some(_) => return Err(bad()),
    };
    if prompts.len() > 64 {
        return Err(ApiError::bad("prompt", format!("{} prompts in one request; at most 64", prompts.len())));
    }
    // OpenAI's legacy default budget for completions.
    let max_tokens = Some(uint(o, "max_tokens")?.unwrap_or(16));
    let logprobs = uint(o, "logprobs")?;
    Ok((prompts, max_tokens, logprobs))
}

fn float(o: &Map<String, Value>, key: &str) -> Result<Option<f32>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            v.as_f64().map(|f| Some(f as f32)).ok_or_else(|| ApiError::bad(key, format!("`{key}` must be a number")))
        }
    }
}

fn uint(o: &Map<String, Value>, key: &str) -> Result<Option<usize>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
            .ok_or_else(|| ApiError::bad(key, format!("`{key}` must be a non-negative integer"))),
    }
}

fn boolean(o: &Map<String, Value>, key: &str) -> Result<Option<bool>, ApiError> {
    match o.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::bad(key, format!("`{key}` must be true or false"))),
    }
}
