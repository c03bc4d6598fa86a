//! int4: 4-bit-weight LLM inference on x86 CPUs.
//!
//! # Brief overview
//!
//! An [`Engine`] loads a model — a Hugging Face checkpoint directory (unquantized, `cpu_int4`, GPTQ or AWQ),
//! or a llama.cpp GGUF file (Q4_0, Q4_1, Q4_K, Q5_0, Q8_0, Q6_K, F16, BF16, F32), read as it is stored; a repo id in the
//! Hugging Face cache resolves to either ([`resolve_model`]) — on a path ([`RunPath`]: the W4A16 or W4A8 kernels, or the exact bf16/f32 ones; by default what the
//! policy picks for this CPU), packing its weights once into the artifact cache, and generates text as a
//! stream of token events:
//!
//! ```no_run
//! use int4::{Engine, GenerationRequest, LoadOptions, Messages, Prompt, SamplingOverrides};
//!
//! let engine = Engine::load("path/to/SmolLM2-135M-Instruct".as_ref(), &LoadOptions::default())?;
//! let mut messages = Messages::new();
//! messages.push("user", "What is the capital of Australia?");
//! let mut req = GenerationRequest::new(Prompt::Chat { messages, options: Default::default() });
//! req.sampling = SamplingOverrides { temperature: Some(0.8), top_p: Some(0.95), ..Default::default() };
//! req.max_tokens = Some(64);
//! req.stop = vec!["\n\n".into()];
//! let out = engine.generate(req, |event| print!("{}", event.text))?;
//! println!("\n{:?}: {} prompt + {} generated tokens", out.finish, out.usage.prompt_tokens, out.usage.completion_tokens);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The runtime's parts, all re-exported here:
//!
//! * `config` — [`ModelConfig`] from `config.json` of Llama, Qwen2 and Qwen3 checkpoints (transformers v4
//!   and v5 spellings);
//! * `model_dir` — [`ModelDir`], the one place that opens a model's files (names confined to the
//!   directory, regular files only, sizes capped; a GGUF's configuration and tokenizer from its metadata);
//! * `weights` — [`Checkpoint`], memory-mapped safetensors (single file or shards) or a mapped GGUF;
//! * `linear` — a linear layer on the kernel the plan chose, reporting which kernel runs each phase;
//! * `quantized` — the linears of `cpu_int4`, GPTQ, AWQ and GGUF checkpoints as codes and parameters
//!   ([`QuantLinear`], and [`Int8Codes`] for a GGUF's 8-bit blocks);
//! * `model` — [`Model`]: the forward pass, and [`ForwardObserver`] for tools that need each linear's
//!   inputs (GPTQ calibration); `kv` — [`KvCache`], keys and values stored as f32 or f16 ([`KvType`]);
//! * `sampling` — penalties, temperature, min-p, top-k, top-p and seeded draws, and log-probabilities
//!   ([`SamplingParams`], [`Sampler`]); `text` — tokenizer, incremental decoding and chat template
//!   ([`TextCodec`]; templates rendered by [`template`] as transformers renders them, run under a time and
//!   memory budget by `sandbox`); `engine` — load a directory ([`Engine`]); `generation` — the one
//!   generation API: a [`GenerationRequest`] in, [`TokenEvent`]s out, a [`Generation`] at the end, each
//!   answer in progress a [`Sequence`]; [`speed`] — a model's speed timed as llama-bench times it (pp, tg,
//!   pp + tg).
//!
//! # Other crates
//!
//! The crates below the runtime are re-exported whole, so a user depends on this one crate:
//! [`layout`] (4-bit grids and packed layouts), [`kernels`] (the matrix kernels), [`select`] (the hardware
//! probe and path policy), [`cache`] (config-hash keys, the packed-artifact store, and where the cache and
//! the default model live), [`gguf`] (llama.cpp's GGUF files) and [`hub`] (repo ids in the Hugging Face
//! cache). Offline tooling — writing 4-bit
//! checkpoints, the GPTQ method, perplexity and KL evaluation — is the `int4-quant` crate, on top of this
//! one; the `int4` binary is `int4-cli`.
#![deny(missing_docs)]

mod config;
mod engine;
mod error;
mod generation;
mod kv;
mod linear;
mod model;
mod model_dir;
mod quantized;
mod sampling;
mod sandbox;
pub mod speed;
mod text;
mod weights;

pub use config::{Architecture, Llama3Rope, ModelConfig};
pub use engine::{Engine, LoadOptions, ModelInfo, PackProgress, PackedFrom};
pub use error::{Error, ErrorKind, Result};
pub use generation::{
    CancelToken, FinishReason, Generation, GenerationRequest, MAX_STOP_BYTES, MAX_STOP_STRINGS, Next, Prompt, Sequence,
    TokenEvent, Usage,
};
pub use kv::KvCache;
pub use linear::{HeadBits, INT8_GROUP, Linear, Numerics, SectionSource};
pub use model::{
    Dispatched, ForwardObserver, LayerFlow, LayerKernels, LinearSlot, LinearSpec, Model, StepEntry, linear_specs,
};
pub use model_dir::{CONFIG_CAP, ModelDir, ModelSource, TEMPLATE_CAP, TOKENIZER_CAP, resolve_model};
pub use quantized::{
    Int8Codes, IntegerZeros, QuantFormat, QuantLinear, StoredLinear, inexact_q4_1_zeros, read_gguf_linear, read_linear,
};
pub use sampling::{
    GenerationDefaults, MAX_TOP_LOGPROBS, Sampler, SamplingOverrides, SamplingParams, TokenLogprobs, argmax,
    random_seed, top_k, top2_gap,
};
pub use text::{ChatOptions, MAX_NORMALIZER_GROWTH, TEMPLATE_OUTPUT_CAP, TextCodec, TextStream};
pub use weights::{Checkpoint, StoredTensor};

pub use int4_select::{KvType, Plan, Priority, RunPath};

pub use int4_cache as cache;
pub use int4_gguf as gguf;
pub use int4_hub as hub;
pub use int4_kernels as kernels;
pub use int4_layout as layout;
pub use int4_select as select;
pub use int4_template as template;
pub use int4_template::Messages;
