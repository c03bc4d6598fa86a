//! Tokenizer and chat template of a model directory.
//!
//! `tokenizer.json` through the `tokenizers` crate; the chat template from `chat_template.jinja` if the
//! directory has one, else the `chat_template` key of `tokenizer_config.json`, rendered with minijinja.

use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::model_dir::{ModelDir, TEMPLATE_CAP, TOKENIZER_CAP};

/// One chat message.
#[derive(Clone, Debug, Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// The model's tokenizer and chat template.
pub struct TextCodec {
    tokenizer: tokenizers::Tokenizer,
    chat_template: Option<String>,
    bos: Option<String>,
    eos: Option<String>,
}

impl std::fmt::Debug for TextCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextCodec").field("has_chat_template", &self.chat_template.is_some()).finish_non_exhaustive()
    }
}

fn token_string(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    }
}

impl TextCodec {
    /// Loads `tokenizer.json` and the chat template from the model directory `dir`.
    pub fn load(dir: &Path) -> Result<Self> {
        Self::load_in(&ModelDir::open(dir)?)
    }

    /// Loads `tokenizer.json` and the chat template of `model`: `chat_template.jinja` if it has one, else
    /// the `chat_template` key of `tokenizer_config.json`.
    pub fn load_in(model: &ModelDir) -> Result<Self> {
        let tj = model.path().join("tokenizer.json").display().to_string();
        let bytes = model
            .read("tokenizer.json", TOKENIZER_CAP)?
            .ok_or_else(|| Error::config(&tj, "is missing: the model has no tokenizer"))?;
        let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| Error::tokenizer(&tj, e))?;
        drop(bytes);
        let cfg = model.read_json("tokenizer_config.json")?;
        let chat_template = match model.read_text("chat_template.jinja", TEMPLATE_CAP)? {
            Some(t) => Some(t),
            None => cfg.as_ref().and_then(|c| c.get("chat_template")).and_then(|t| t.as_str()).map(str::to_string),
        };
        Ok(TextCodec {
            tokenizer,
            chat_template,
            bos: token_string(cfg.as_ref().and_then(|c| c.get("bos_token"))),
            eos: token_string(cfg.as_ref().and_then(|c| c.get("eos_token"))),
        })
    }

    /// Token ids of `text` (no special tokens added).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tokenizer.encode(text, false).map_err(|e| Error::tokenizer("tokenizer", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids` (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, false).map_err(|e| Error::tokenizer("tokenizer", e))
    }

    /// Text of `ids` for people to read: special tokens (`<|im_end|>`, ...) left out.
    pub fn decode_for_display(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer.decode(ids, true).map_err(|e| Error::tokenizer("tokenizer", e))
    }

    /// Renders the chat template over `messages`, ending with the assistant's turn opened.
    pub fn apply_chat_template(&self, messages: &[Message]) -> Result<String> {
        let tpl = self.chat_template.as_ref().ok_or_else(|| Error::config("chat template", "the model has none"))?;
        let mut env = minijinja::Environment::new();
        env.add_template("chat", tpl).map_err(Error::template)?;
        let t = env.get_template("chat").map_err(Error::template)?;
        t.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos.clone().unwrap_or_default(),
            eos_token => self.eos.clone().unwrap_or_default(),
        })
        .map_err(Error::template)
    }
}
