//! Built-in model shapes, by the names docs/planners.md lists, taken from the published
//! `config.json` of each checkpoint (GPT-3 from Brown et al. 2020, Table 2.1).

use super::model::{Mlp, ModelConfig, Norm};

/// Names `find` knows, in the order `--help` and errors list them.
pub const NAMES: [&str; 12] = [
    "gpt3-175b",
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-8b",
    "llama-3.1-70b",
    "llama-3.1-405b",
    "mistral-7b",
    "opt-13b",
    "t5-large",
];

/// A Llama-family decoder: RMSNorm, SwiGLU, no biases, untied embeddings, head_dim 128.
/// `shape` is `[hidden, layers, heads, kv_heads, ffn, vocab, max_positions]`.
fn llama(name: &str, shape: [u64; 7]) -> ModelConfig {
    let [h, layers, heads, kv, ffn, vocab, max] = shape;
    ModelConfig {
        name: name.to_string(),
        hidden_size: h,
        layers,
        cross_attention_layers: 0,
        heads,
        kv_heads: kv,
        head_dim: h / heads,
        ffn,
        mlp: Mlp::Gated,
        norm: Norm::RmsNorm,
        bias: false,
        vocab,
        tied_embeddings: false,
        position_embeddings: None,
        max_positions: Some(max),
        moe: None,
        params_override: None,
    }
}

/// A GPT-style decoder: LayerNorm, GeLU/ReLU MLP, biases, tied embeddings, learned positions.
/// `shape` is `[hidden, layers, heads, ffn, vocab, position_rows, max_positions]`.
fn gpt(name: &str, shape: [u64; 7]) -> ModelConfig {
    let [h, layers, heads, ffn, vocab, positions, max] = shape;
    ModelConfig {
        name: name.to_string(),
        hidden_size: h,
        layers,
        cross_attention_layers: 0,
        heads,
        kv_heads: heads,
        head_dim: h / heads,
        ffn,
        mlp: Mlp::Plain,
        norm: Norm::LayerNorm,
        bias: true,
        vocab,
        tied_embeddings: true,
        position_embeddings: Some(positions),
        max_positions: Some(max),
        moe: None,
        params_override: None,
    }
}

/// T5 v1.0 large: 24 encoder + 24 decoder blocks, ReLU MLP, bias-free norms, shared embedding.
fn t5_large() -> ModelConfig {
    ModelConfig {
        name: "t5-large".to_string(),
        hidden_size: 1024,
        layers: 48,
        cross_attention_layers: 24,
        heads: 16,
        kv_heads: 16,
        head_dim: 64,
        ffn: 4096,
        mlp: Mlp::Plain,
        norm: Norm::RmsNorm,
        bias: false,
        vocab: 32128,
        tied_embeddings: true,
        position_embeddings: None,
        max_positions: Some(512),
        moe: None,
        params_override: None,
    }
}

/// The built-in model called `name` (case-insensitive), if there is one.
pub fn find(name: &str) -> Option<ModelConfig> {
    let model = match name.to_ascii_lowercase().as_str() {
        "gpt3-175b" => gpt("gpt3-175b", [12288, 96, 96, 49152, 50257, 2048, 2048]),
        "llama-2-7b" => llama("llama-2-7b", [4096, 32, 32, 32, 11008, 32000, 4096]),
        "llama-2-13b" => llama("llama-2-13b", [5120, 40, 40, 40, 13824, 32000, 4096]),
        "llama-2-70b" => llama("llama-2-70b", [8192, 80, 64, 8, 28672, 32000, 4096]),
        "llama-3-8b" => llama("llama-3-8b", [4096, 32, 32, 8, 14336, 128256, 8192]),
        "llama-3-70b" => llama("llama-3-70b", [8192, 80, 64, 8, 28672, 128256, 8192]),
        "llama-3.1-8b" => llama("llama-3.1-8b", [4096, 32, 32, 8, 14336, 128256, 131072]),
        "llama-3.1-70b" => llama("llama-3.1-70b", [8192, 80, 64, 8, 28672, 128256, 131072]),
        "llama-3.1-405b" => llama(
            "llama-3.1-405b",
            [16384, 126, 128, 8, 53248, 128256, 131072],
        ),
        "mistral-7b" => llama("mistral-7b", [4096, 32, 32, 8, 14336, 32000, 32768]),
        // OPT's learned position table has 2 extra rows (offset 2).
        "opt-13b" => gpt("opt-13b", [5120, 40, 40, 20480, 50272, 2050, 2048]),
        "t5-large" => t5_large(),
        _ => return None,
    };
    Some(model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_name_resolves() {
        for name in NAMES {
            let model = find(name).expect(name);
            assert_eq!(model.name, name);
            assert!(model.param_counts().total > 0);
        }
        assert!(find("LLAMA-3-8B").is_some());
        assert!(find("llama-4").is_none());
    }
}
