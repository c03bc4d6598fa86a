//! The whole-model shapes the benchmarks generate and time: SmolLM2-135M's and the upstream model's.

/// `(name, N, K)` of every 4-bit matrix of a Llama-family model, per layer and once for the tied head.
#[derive(Clone, Copy, Debug)]
pub struct ModelShape {
    /// The model's name.
    pub name: &'static str,
    /// Decoder layers.
    pub layers: usize,
    /// `(name, N, K)` per layer, with q/k/v and gate/up fused.
    pub per_layer: [(&'static str, usize, usize); 4],
    /// The tied embedding / head: `(vocabulary, hidden)`.
    pub head: (usize, usize),
}

/// SmolLM2-135M: hidden 576, 30 layers, 9 query heads and 3 KV heads of 64, intermediate 1536, vocabulary
/// 49152, tied embeddings.
pub const SMOLLM2_135M: ModelShape = ModelShape {
    name: "smollm2-shaped",
    layers: 30,
    per_layer: [("qkv", 960, 576), ("o_proj", 576, 576), ("gate_up", 3072, 576), ("down", 576, 1536)],
    head: (49152, 576),
};

/// The upstream model's shapes (1.54 B parameters): hidden 2048, 28 layers, 8 query heads and 2 KV heads of
/// 256, intermediate 6656, tied embeddings; vocabulary 49152 so it can reuse SmolLM2's tokenizer.
pub const SPARK_SHAPED: ModelShape = ModelShape {
    name: "spark-shaped",
    layers: 28,
    per_layer: [("qkv", 3072, 2048), ("o_proj", 2048, 2048), ("gate_up", 13312, 2048), ("down", 2048, 6656)],
    head: (49152, 2048),
};
