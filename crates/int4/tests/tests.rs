//! The runtime's integration tests, as one binary (each file a module; a test binary per file would link
//! the whole stack fourteen times). The tiny random model, the default model's lookup and the mutation
//! fuzzer they share come from `int4-test-support`.

// Each supported architecture (Llama 3 rope scaling, Qwen2, Qwen3) against transformers' own outputs.
mod architectures;
// The engine through the artifact cache: cold, warm, uncached, damaged and unusable caches.
mod artifact_cache;
// The bad-inputs table of docs/bad-inputs.md, one test per row.
mod bad_inputs;
// Mutation fuzzing of every loader: safetensors, config.json, quantized checkpoints, artifacts.
mod fuzz_loaders;
// Every layer runs the kernels its plan names, at every ISA level this machine offers.
mod kernel_choice;
// The generation API: sampling parameters, stop strings and ids, budgets, logprobs, defaults, seeds.
mod generation;
// GGUF checkpoints as stored: every type, every path, the cache, the tokenizer, directories and repo ids.
mod gguf_models;
// Sessions past 4096 tokens without memory growth, and several threads on one model.
mod long_runs;
// The shipped Q4_1 GGUF's weights, and Q4_K's sub-blocks, reproduced exactly by the W4A16 and W4A8 layouts.
mod q4_1_exact;
// GPTQ, AWQ and cpu_int4 checkpoints against a plain checkpoint of the same weights.
mod quantized_checkpoints;
// The runtime on the tiny model: every path against f32, incremental decoding, thread counts, shards.
mod runtime;
// The real default model against transformers' greedy tokens.
mod smollm2;
// The default model's tokenizer against independently built golden ids.
mod tokenizer_golden;
