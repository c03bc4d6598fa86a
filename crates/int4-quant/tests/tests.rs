//! The offline tools' integration tests, as one binary (each file a module). The tiny random model and the
//! default model's lookup come from `int4-test-support`.

// `int4 eval`'s scoring against hand-computed values, and its report on real paths.
mod eval;
// The GPTQ solver against its definition, and `--method gptq` end to end.
mod gptq_method;
// The cpu_int4 and GPTQ writers: what they store, what the runtime loads from it, and refusals.
mod quantize_writers;
