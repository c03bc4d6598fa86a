//! Offline tooling on top of the int4 runtime: writing 4-bit checkpoints once, to ship, and measuring how
//! far a path is from the exact model.
//!
//! # Brief overview
//!
//! * [`export`] — `int4 quantize`: an unquantized model directory in, a `cpu_int4` or GPTQ checkpoint out
//!   ([`quantize_checkpoint`]), streamed tensor by tensor, with a report of what was stored;
//! * [`gptq_method`] — GPTQ's second-order error compensation over calibration text, the export's
//!   `--method gptq`, on the same grids as round to nearest;
//! * [`eval`] — `int4 eval`: perplexity, top-1 agreement and KL of a path against a reference,
//!   teacher-forced over a text ([`eval::evaluate`]).
//!
//! The runtime never calls into this crate; it depends on the runtime (`int4`) for the model, the
//! checkpoint reader and the engine, and on `int4-layout` for the grids and the packed formats it writes.
#![deny(missing_docs)]

pub mod eval;
pub mod export;
pub mod gptq_method;

pub use eval::{EvalError, EvalErrorKind};
pub use export::{
    ExportFormat, Method, QuantizeError, QuantizeErrorKind, QuantizeOptions, QuantizeReport, quantize_checkpoint,
};
pub use gptq_method::{GptqError, GptqErrorKind, GptqOptions};
