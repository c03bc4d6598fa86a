//! A conversation as the template sees it: the messages as the JSON they came in.
//!
//! A message is whatever object the caller sent — `content` a string or a list of parts, `tool_calls`,
//! `tool_call_id`, `name`, `reasoning_content` — with its keys in the order they were written (a template
//! that prints a tool call with `tojson` prints them in that order). transformers prepares each message
//! before rendering, and so does [`Messages`]: keys whose value is `null` are dropped (templates test
//! `is defined`, not `is none`), and a message's reasoning under any of its names (`reasoning_content`,
//! `thinking`, `reasoning`) is also given under `thinking` and `reasoning_content`.

use indexmap::IndexMap;
use minijinja::Value;
use minijinja::value::ValueKind;

/// Why a conversation was refused.
#[derive(Debug, thiserror::Error)]
pub enum MessagesError {
    /// Not JSON.
    #[error("the messages are not JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// Not a list of objects each with a string `role`.
    #[error("{0}")]
    Shape(String),
}

/// The names a message's reasoning comes under; the first is the one templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// A conversation: a list of messages, each a JSON object with a string `role`.
#[derive(Clone, Debug, Default)]
pub struct Messages {
    items: Vec<Value>,
}

impl Messages {
    /// No messages.
    pub fn new() -> Self {
        Messages::default()
    }

    /// The messages of a JSON list (`[{"role": "user", "content": "Hi"}, ...]`).
    pub fn from_json(text: &str) -> Result<Self, MessagesError> {
        let v: Value = serde_json::from_str(text)?;
        Self::from_value(&v)
    }

    /// The messages of a list value.
    pub fn from_value(v: &Value) -> Result<Self, MessagesError> {
        if v.kind() != ValueKind::Seq {
            return Err(MessagesError::Shape(format!("the messages must be a list of objects, not {}", v.kind())));
        }
        let mut out = Messages::new();
        for (i, m) in v.try_iter().map_err(|e| MessagesError::Shape(e.to_string()))?.enumerate() {
            out.push_value(&m).map_err(|e| MessagesError::Shape(format!("message {i}: {e}")))?;
        }
        Ok(out)
    }

    /// Adds a message with `role` and text `content`.
    pub fn push(&mut self, role: &str, content: &str) {
        let mut map: IndexMap<Value, Value> = IndexMap::new();
        map.insert("role".into(), role.into());
        map.insert("content".into(), content.into());
        self.items.push(Value::from(map));
    }

    /// Adds a message given as an object value.
    pub fn push_value(&mut self, m: &Value) -> Result<(), MessagesError> {
        if m.kind() != ValueKind::Map {
            return Err(MessagesError::Shape(format!("a message must be an object, not {}", m.kind())));
        }
        let mut map: IndexMap<Value, Value> = IndexMap::new();
        for k in m.try_iter().map_err(|e| MessagesError::Shape(e.to_string()))? {
            let v = m.get_item(&k).map_err(|e| MessagesError::Shape(e.to_string()))?;
            if !v.is_none() {
                map.insert(k, v);
            }
        }
        match map.get(&Value::from("role")) {
            Some(r) if r.kind() == ValueKind::String => {}
            Some(r) => return Err(MessagesError::Shape(format!("\"role\" must be a string, not {}", r.kind()))),
            None => return Err(MessagesError::Shape("has no \"role\"".into())),
        }
        let reasoning = REASONING_FIELDS.iter().find_map(|f| map.get(&Value::from(*f)).cloned());
        if let Some(r) = reasoning {
            // As transformers builds it: `{"thinking": r, **message, "reasoning_content": r}`.
            let mut aliased: IndexMap<Value, Value> = IndexMap::new();
            aliased.insert("thinking".into(), r.clone());
            for (k, v) in map {
                aliased.insert(k, v);
            }
            aliased.insert("reasoning_content".into(), r);
            map = aliased;
        }
        self.items.push(Value::from(map));
        Ok(())
    }

    /// How many messages.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The role of message `i`.
    pub fn role(&self, i: usize) -> Option<String> {
        self.items.get(i)?.get_attr("role").ok()?.as_str().map(str::to_string)
    }

    /// Removes the messages in `range`.
    pub fn drain(&mut self, range: std::ops::Range<usize>) {
        self.items.drain(range);
    }

    /// Keeps the first `n` messages.
    pub fn truncate(&mut self, n: usize) {
        self.items.truncate(n);
    }

    /// The list the template sees.
    pub fn as_value(&self) -> Value {
        Value::from(self.items.clone())
    }
}
