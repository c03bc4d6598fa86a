//! int4: 4-bit-weight LLM inference on x86 CPUs.
//!
//! The facade over the workspace's crates, re-exported here so users depend on one crate:
//!
//! * [`layout`] — 4-bit grids and packed layouts (row-major, tinygemm, split halves, GPTQ, AWQ);
//! * [`kernels`] — the matrix kernels;
//! * [`select`] — the hardware probe and path policy;
//! * [`cache`] — config-hash keys and the packed-artifact store.
//!
//! and the default model's preparation: [`gguf`] reads GGUF files, [`convert`] turns a Llama GGUF into a
//! Hugging Face model directory.
#![deny(missing_docs)]

pub mod convert;
pub mod gguf;

pub use int4_cache as cache;
pub use int4_kernels as kernels;
pub use int4_layout as layout;
pub use int4_select as select;
