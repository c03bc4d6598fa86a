//! Chat templates rendered as transformers renders them.
//!
//! A model's chat template is a Jinja program written for Python: transformers compiles it in an
//! `ImmutableSandboxedEnvironment` with `trim_blocks` and `lstrip_blocks` on and the `loopcontrols`
//! extension, adds `raise_exception`, `strftime_now` and a `tojson` filter that is Python's `json.dumps`,
//! and renders it over the messages as the caller gave them, the tools, `add_generation_prompt` and the
//! tokenizer's named special tokens. Templates lean on every part of that: Qwen3's calls
//! `message.content.startswith(...)`, Llama 3.1's prints tool schemas with `tojson(indent=4)` and today's
//! date, Mistral's raises on roles out of order. [`ChatTemplate`] reproduces that environment on
//! minijinja: the same whitespace rules, loop controls, Python's string, dict and list methods
//! (`minijinja-contrib`'s pycompat), a [`tojson`](json::dumps) written to match `json.dumps` byte for
//! byte, and messages kept as the JSON they came in, keys in the order they were written.
//!
//! A template is its author's program, so a render is bounded: [`Limits::fuel`] counts minijinja's
//! instructions and [`Limits::output_bytes`] the text it writes. Memory a template asks for in few steps
//! (a string doubled forty times) is the caller's to bound; the runtime renders in a child process with an
//! address-space limit.

mod json;
mod messages;

use std::sync::Arc;

use minijinja::value::{Kwargs, Rest};
use minijinja::{Environment, ErrorKind, State};

pub use json::{DumpOptions, dumps};
pub use messages::{Messages, MessagesError};
pub use minijinja::Value;

/// Why a template could not be compiled or rendered.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template's syntax, or an error raised while rendering (including `raise_exception`).
    #[error("{0:#}")]
    Jinja(#[from] minijinja::Error),
    /// The template called `raise_exception(message)`.
    #[error("the chat template refused the conversation: {0}")]
    Raised(String),
    /// The render ran out of fuel.
    #[error("the chat template did not finish within {0} steps; it is refused")]
    OutOfFuel(u64),
    /// The render wrote more than its limit.
    #[error("the chat template rendered more than {0} bytes; it is refused")]
    TooLong(usize),
    /// A bound the caller keeps around the render (memory, wall-clock time) ran out.
    #[error("{0}")]
    Bounded(String),
}

/// What a render may use.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// minijinja instructions (about 64 bytes of allocated data count as one).
    pub fuel: u64,
    /// Bytes of rendered text.
    pub output_bytes: usize,
}

impl Default for Limits {
    /// 20 million steps and 16 MiB: a chat of a thousand turns with tools renders in a few hundred
    /// thousand steps.
    fn default() -> Self {
        Limits { fuel: 20_000_000, output_bytes: 16 << 20 }
    }
}

/// What `strftime_now` reads.
#[derive(Clone, Debug)]
pub enum Clock {
    /// The system's local time, as Python's `datetime.now()`.
    System,
    /// A fixed time (for reproducible renders and tests).
    Fixed(jiff::ZonedDateTime),
}

/// What a template renders over.
#[derive(Clone, Debug)]
pub struct ChatInput<'a> {
    /// The conversation.
    pub messages: &'a Messages,
    /// Tool definitions (a JSON list), as the OpenAI API sends them; `None` renders `tools` as `none`.
    pub tools: Option<&'a Value>,
    /// End with the assistant's turn opened.
    pub add_generation_prompt: bool,
    /// Named special tokens (`bos_token`, `eos_token`, ...), from the tokenizer's configuration.
    pub special_tokens: &'a [(String, String)],
    /// Further variables for the template (`enable_thinking`, `date_string`, ...); they override the special
    /// tokens, as transformers' keyword arguments do.
    pub extra: &'a [(String, Value)],
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    limits: Limits,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("limits", &self.limits).finish_non_exhaustive()
    }
}

const NAME: &str = "chat_template";

/// The message `raise_exception` carries through minijinja's error, recognised on the way out.
const RAISED: &str = "raise_exception: ";

impl ChatTemplate {
    /// Compiles `source` in transformers' environment, `strftime_now` reading `clock`.
    pub fn new(source: &str, clock: Clock, limits: Limits) -> Result<Self, TemplateError> {
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .expect("the default delimiters are valid"),
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_fuel(Some(limits.fuel));
        env.add_filter("tojson", tojson_filter);
        env.add_function("raise_exception", |message: String| -> Result<Value, minijinja::Error> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{message}")))
        });
        let clock = Arc::new(clock);
        env.add_function("strftime_now", move |format: String| -> Result<String, minijinja::Error> {
            let now = match &*clock {
                Clock::System => jiff::ZonedDateTime::now(),
                Clock::Fixed(t) => t.clone(),
            };
            jiff::fmt::strtime::format(format.as_str(), &now).map_err(|e| {
                minijinja::Error::new(ErrorKind::InvalidOperation, format!("strftime_now({format:?}): {e}"))
            })
        });
        env.add_template_owned(NAME, source.to_string())?;
        Ok(ChatTemplate { env, limits })
    }

    /// The limits a render runs under.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Renders the template over `input`.
    pub fn render(&self, input: &ChatInput<'_>) -> Result<String, TemplateError> {
        let template = self.env.get_template(NAME)?;
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), input.messages.as_value().clone()),
            ("tools".into(), input.tools.cloned().unwrap_or(Value::from(()))),
            ("documents".into(), Value::from(())),
            ("add_generation_prompt".into(), Value::from(input.add_generation_prompt)),
        ];
        for (k, v) in input.special_tokens {
            ctx.push((k.clone(), Value::from(v.as_str())));
        }
        for (k, v) in input.extra {
            ctx.push((k.clone(), v.clone()));
        }
        let ctx: Value = Value::from(
            ctx.into_iter().map(|(k, v)| (Value::from(k), v)).collect::<indexmap::IndexMap<Value, Value>>(),
        );
        let mut out = Capped { bytes: Vec::new(), cap: self.limits.output_bytes, overflowed: false };
        let rendered = template.render_captured_to(ctx, &mut out);
        if out.overflowed {
            return Err(TemplateError::TooLong(self.limits.output_bytes));
        }
        if let Err(e) = rendered {
            return Err(self.classify(e));
        }
        String::from_utf8(out.bytes).map_err(|_| {
            TemplateError::Jinja(minijinja::Error::new(ErrorKind::InvalidOperation, "the rendered text is not UTF-8"))
        })
    }

    fn classify(&self, e: minijinja::Error) -> TemplateError {
        if e.kind() == ErrorKind::OutOfFuel {
            return TemplateError::OutOfFuel(self.limits.fuel);
        }
        if let Some(message) = e.detail().and_then(|d| d.strip_prefix(RAISED)) {
            return TemplateError::Raised(message.to_string());
        }
        TemplateError::Jinja(e)
    }
}

/// `tojson`, as transformers defines it: `json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False)`, each argument positional or by name.
fn tojson_filter(
    state: &State<'_, '_>,
    value: Value,
    args: Rest<Value>,
    kwargs: Kwargs,
) -> Result<String, minijinja::Error> {
    let mut opts = DumpOptions::default();
    let names = ["ensure_ascii", "indent", "separators", "sort_keys"];
    if args.len() > names.len() {
        return Err(minijinja::Error::new(ErrorKind::TooManyArguments, "tojson takes at most 4 arguments"));
    }
    let mut given: Vec<(&str, Value)> = names.iter().copied().zip(args.iter().cloned()).collect();
    for name in names {
        if let Some(v) = kwargs.get::<Option<Value>>(name)? {
            if given.iter().any(|(n, _)| *n == name) {
                return Err(minijinja::Error::new(
                    ErrorKind::InvalidOperation,
                    format!("tojson got multiple values for argument {name:?}"),
                ));
            }
            given.push((name, v));
        }
    }
    kwargs.assert_all_used()?;
    for (name, v) in given {
        match name {
            "ensure_ascii" => opts.ensure_ascii = v.is_true(),
            "indent" => opts.indent = json::indent_of(&v)?,
            "separators" => opts.separators = json::separators_of(&v)?,
            _ => opts.sort_keys = v.is_true(),
        }
    }
    let out = dumps(&value, &opts)?;
    // A large dump is work the template did: charge it like the data it would allocate.
    state.consume_fuel((out.len() / 64) as u64)?;
    Ok(out)
}

/// Collects rendered text, failing once it passes `cap` bytes.
struct Capped {
    bytes: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > self.cap {
            self.overflowed = true;
            return Err(std::io::Error::other(format!("the rendered text is longer than {} bytes", self.cap)));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
