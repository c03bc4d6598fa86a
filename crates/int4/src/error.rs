//! The runtime's error type: what went wrong ([`ErrorKind`], with the underlying error kept whole where
//! there is one, so [`std::error::Error::source`] returns it), and what it is about (a file, a tensor, a
//! config key: [`Error::context`]).

use std::fmt;

/// Why loading or running a model failed.
#[derive(Debug)]
pub struct Error {
    context: String,
    kind: ErrorKind,
}

/// What went wrong.
#[derive(Debug)]
#[non_exhaustive]
pub enum ErrorKind {
    /// A file could not be opened, read or mapped.
    Io(std::io::Error),
    /// A file could not be opened or read under the rules of `int4_files` (missing, not a regular file,
    /// over its size cap).
    File(int4_files::FileError),
    /// A JSON file (`config.json`, a shard index, the tokenizer or generation config) is not valid JSON.
    Json(serde_json::Error),
    /// The model's configuration lacks, mistypes or contradicts what the runtime needs (the message says
    /// which key and why).
    Config(String),
    /// The checkpoint's tensors: one missing, of the wrong shape, dtype or size, or holding a value the
    /// runtime cannot use (the message names it).
    Checkpoint(String),
    /// The safetensors reader refused a file.
    Safetensors(safetensors::SafeTensorError),
    /// The GGUF reader refused a file, or a GGUF is not a model this runtime reads (its message names the
    /// key or tensor).
    Gguf(int4_gguf::ConvertError),
    /// A model reference could not be resolved: a path that does not exist, or a repo id that is not in the
    /// Hugging Face cache (the message says what to run).
    Hub(int4_hub::HubError),
    /// The artifact cache or the checkpoint's `quantization_config` (normalised by the cache's rules).
    Cache(int4_cache::CacheError),
    /// A packed artifact lacks a section or holds one that does not fit the layer.
    Artifact(String),
    /// The layout crate refused the weights.
    Layout(int4_layout::LayoutError),
    /// `INT4_ISA` or `INT4_DISABLE` holds a value that names no level or feature.
    Caps(int4_kernels::isa::CapsError),
    /// A kernel could not be built or run.
    Kernel(int4_kernels::KernelError),
    /// No path of the ones asked for runs on this machine.
    Policy(int4_select::PolicyError),
    /// The CPU profile named by `INT4_CPU_PROFILE` could not be used.
    Profile(int4_select::ProfileError),
    /// The tokenizer could not be loaded or refused a text or an id.
    Tokenizer(Box<dyn std::error::Error + Send + Sync>),
    /// The chat template could not be compiled or rendered.
    Template(int4_template::TemplateError),
    /// An argument the caller gave that cannot be run: an empty prompt, a prompt larger than the context,
    /// a batch whose parts disagree, a KV cache larger than the memory available.
    Input(String),
}

impl Error {
    pub(crate) fn new(context: impl Into<String>, kind: ErrorKind) -> Self {
        Error { context: context.into(), kind }
    }

    pub(crate) fn config(context: impl Into<String>, why: impl Into<String>) -> Self {
        Error::new(context, ErrorKind::Config(why.into()))
    }

    pub(crate) fn checkpoint(context: impl Into<String>, why: impl Into<String>) -> Self {
        Error::new(context, ErrorKind::Checkpoint(why.into()))
    }

    pub(crate) fn artifact(context: impl Into<String>, why: impl Into<String>) -> Self {
        Error::new(context, ErrorKind::Artifact(why.into()))
    }

    pub(crate) fn input(context: impl Into<String>, why: impl Into<String>) -> Self {
        Error::new(context, ErrorKind::Input(why.into()))
    }

    pub(crate) fn tokenizer(context: impl Into<String>, e: Box<dyn std::error::Error + Send + Sync>) -> Self {
        Error::new(context, ErrorKind::Tokenizer(e))
    }

    pub(crate) fn template(e: int4_template::TemplateError) -> Self {
        Error::new("chat template", ErrorKind::Template(e))
    }

    /// What went wrong.
    pub fn kind(&self) -> &ErrorKind {
        &self.kind
    }

    /// What the error is about: a file path, a tensor or layer name, a config key, `prompt`, ….
    pub fn context(&self) -> &str {
        &self.context
    }
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ErrorKind::Io(e) => write!(f, "{e}"),
            // The context names the file; the error says what is wrong with it.
            ErrorKind::File(e) => write!(f, "{}", e.kind()),
            ErrorKind::Json(e) => write!(f, "not valid JSON: {e}"),
            ErrorKind::Config(why) | ErrorKind::Checkpoint(why) | ErrorKind::Artifact(why) | ErrorKind::Input(why) => {
                f.write_str(why)
            }
            ErrorKind::Safetensors(e) => write!(f, "not a valid safetensors file: {e}"),
            ErrorKind::Gguf(e) => write!(f, "{e}"),
            ErrorKind::Hub(e) => write!(f, "{e}"),
            ErrorKind::Cache(e) => write!(f, "{e}"),
            ErrorKind::Layout(e) => write!(f, "{e}"),
            ErrorKind::Caps(e) => write!(f, "{e}"),
            ErrorKind::Kernel(e) => write!(f, "{e}"),
            ErrorKind::Policy(e) => write!(f, "{e}"),
            ErrorKind::Profile(e) => write!(f, "{e}"),
            ErrorKind::Tokenizer(e) => write!(f, "{e}"),
            ErrorKind::Template(e) => write!(f, "{e}"),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An error whose kind names its own file (a GGUF's) has no context of its own.
        if self.context.is_empty() {
            return write!(f, "{}", self.kind);
        }
        write!(f, "{}: {}", self.context, self.kind)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Io(e) => Some(e),
            ErrorKind::File(e) => Some(e),
            ErrorKind::Json(e) => Some(e),
            ErrorKind::Safetensors(e) => Some(e),
            ErrorKind::Gguf(e) => Some(e),
            ErrorKind::Hub(e) => Some(e),
            ErrorKind::Cache(e) => Some(e),
            ErrorKind::Layout(e) => Some(e),
            ErrorKind::Caps(e) => Some(e),
            ErrorKind::Kernel(e) => Some(e),
            ErrorKind::Policy(e) => Some(e),
            ErrorKind::Profile(e) => Some(e),
            ErrorKind::Tokenizer(e) => Some(e.as_ref()),
            ErrorKind::Template(e) => Some(e),
            ErrorKind::Config(_) | ErrorKind::Checkpoint(_) | ErrorKind::Artifact(_) | ErrorKind::Input(_) => None,
        }
    }
}

macro_rules! wrapped_kinds {
    ($($ty:ty => $variant:ident,)*) => {
        $(impl From<$ty> for ErrorKind {
            fn from(e: $ty) -> Self {
                ErrorKind::$variant(e)
            }
        })*
    };
}

wrapped_kinds! {
    std::io::Error => Io,
    int4_files::FileError => File,
    serde_json::Error => Json,
    safetensors::SafeTensorError => Safetensors,
    int4_gguf::ConvertError => Gguf,
    int4_hub::HubError => Hub,
    int4_cache::CacheError => Cache,
    int4_layout::LayoutError => Layout,
    int4_kernels::KernelError => Kernel,
    int4_kernels::isa::CapsError => Caps,
    int4_select::PolicyError => Policy,
    int4_select::ProfileError => Profile,
    int4_template::TemplateError => Template,
}

impl From<int4_safetensors::ReadError> for ErrorKind {
    fn from(e: int4_safetensors::ReadError) -> Self {
        match e {
            int4_safetensors::ReadError::Io(e) => ErrorKind::Io(e),
            int4_safetensors::ReadError::Header(e) => ErrorKind::Safetensors(e),
        }
    }
}

/// `.map_err(at(context))`: a wrapped error, kept whole, about `context`.
pub(crate) fn at<E: Into<ErrorKind>>(context: impl Into<String>) -> impl FnOnce(E) -> Error {
    move |e| Error::new(context, e.into())
}

/// Shorthand.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrapped_error_is_its_source_and_reads_as_before() {
        let io = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let e = at("model/config.json")(io);
        assert_eq!(e.to_string(), "model/config.json: no such file");
        assert!(std::error::Error::source(&e).is_some_and(|s| s.to_string() == "no such file"));
        assert!(matches!(e.kind(), ErrorKind::Io(_)) && e.context() == "model/config.json");
        let e = Error::config("config.json", "\"vocab_size\" is missing");
        assert!(std::error::Error::source(&e).is_none());
        assert_eq!(e.to_string(), "config.json: \"vocab_size\" is missing");
    }
}
