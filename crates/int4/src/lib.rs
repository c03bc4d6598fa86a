//! int4: 4-bit-weight LLM inference on x86 CPUs.
//!
//! The facade over the workspace's crates, re-exported here so users depend on one crate:
//!
//! * [`layout`] — 4-bit grids and packed layouts (row-major, tinygemm, split halves, GPTQ, AWQ);
//! * [`kernels`] — the matrix kernels;
//! * [`select`] — the hardware probe and path policy;
//! * [`cache`] — config-hash keys and the packed-artifact store.
//!
//! and owns the model runtime:
//!
//! * [`config`] — `config.json` of Llama, Qwen2 and Qwen3 checkpoints (transformers v4 and v5 spellings);
//! * [`weights`] — memory-mapped safetensors (single file or shards);
//! * [`linear`] — a linear layer on the kernel the plan chose, reporting which kernel runs each phase;
//! * [`quantized`] — the linears of `cpu_int4`, GPTQ and AWQ checkpoints as codes and parameters;
//! * [`model`] — the forward pass and KV cache; [`sampling`] — greedy and seeded sampling;
//! * [`text`] — tokenizer and chat template; [`engine`] — load a directory and generate;
//! * [`gguf`] and [`convert`] — reading GGUF files and turning a Llama GGUF into a model directory (how the
//!   default model is prepared).
#![deny(missing_docs)]

pub mod config;
pub mod convert;
pub mod engine;
pub mod error;
pub mod eval;
pub mod gguf;
pub mod gptq;
pub mod linear;
pub mod model;
pub mod quantize;
pub mod quantized;
pub mod sampling;
pub mod text;
pub mod weights;

pub use int4_cache as cache;
pub use int4_kernels as kernels;
pub use int4_layout as layout;
pub use int4_select as select;
