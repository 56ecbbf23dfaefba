//! The model shape the planners reason about: layer sizes, attention layout, MLP kind, MoE, and
//! the parameter counts that follow from them.

use serde::Serialize;

/// Normalisation layers: RMSNorm has a weight per channel, LayerNorm a weight and a bias.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Norm {
    RmsNorm,
    LayerNorm,
}

impl Norm {
    /// Parameters per channel.
    pub fn params_per_channel(self) -> u64 {
        match self {
            Norm::RmsNorm => 1,
            Norm::LayerNorm => 2,
        }
    }
}

/// The feed-forward block: two matrices with an activation (GeLU, ReLU), or three with a gated
/// activation (SwiGLU, GeGLU).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mlp {
    Plain,
    Gated,
}

impl Mlp {
    /// Weight matrices of `hidden x ffn`.
    pub fn matrices(self) -> u64 {
        match self {
            Mlp::Plain => 2,
            Mlp::Gated => 3,
        }
    }
}

/// Mixture of experts: every layer's MLP is `experts` expert MLPs of width `expert_ffn`, of which
/// `active` run per token, plus `shared` always-active experts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Moe {
    pub experts: u64,
    pub active: u64,
    pub shared: u64,
    pub expert_ffn: u64,
}

/// A transformer, decoder-only or encoder-decoder.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ModelConfig {
    pub name: String,
    pub hidden_size: u64,
    /// Transformer blocks, encoder and decoder together.
    pub layers: u64,
    /// Blocks that also hold a cross-attention sub-block (the decoder of an encoder-decoder).
    pub cross_attention_layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    /// Width of the dense MLP.
    pub ffn: u64,
    pub mlp: Mlp,
    pub norm: Norm,
    /// Linear layers carry biases (GPT-2/3, OPT).
    pub bias: bool,
    pub vocab: u64,
    /// The output projection shares the input embedding's weights.
    pub tied_embeddings: bool,
    /// Learned absolute position embeddings, when the model has them.
    pub position_embeddings: Option<u64>,
    /// Longest sequence the model was built for, when known.
    pub max_positions: Option<u64>,
    pub moe: Option<Moe>,
    /// A parameter count that replaces the one computed from the shape (`--params`).
    pub params_override: Option<u64>,
}

/// Parameter counts of a model.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamCounts {
    /// Every parameter (all experts).
    pub total: u64,
    /// Parameters one token passes through (active experts only).
    pub active: u64,
    /// One transformer block of the dense kind (the largest block for encoder-decoders).
    pub per_layer: u64,
    /// All transformer blocks together.
    pub blocks: u64,
    /// One embedding matrix (`vocab x hidden`).
    pub embedding: u64,
    /// The largest single module, the way DeepSpeed's estimator counts a "layer".
    pub largest_module: u64,
}

impl ParamCounts {
    /// The same model with `total` parameters: embeddings and norms stay, the blocks take the
    /// rest, and the active share of an MoE is kept.
    fn scaled_to(self, total: u64, rest: u64, layers: u64) -> ParamCounts {
        let blocks = total.saturating_sub(rest);
        let share = if self.total == 0 {
            1.0
        } else {
            self.active as f64 / self.total as f64
        };
        ParamCounts {
            total,
            active: (total as f64 * share).round() as u64,
            per_layer: blocks / layers,
            blocks,
            ..self
        }
    }
}

impl ModelConfig {
    fn attention_params(&self) -> u64 {
        let h = self.hidden_size;
        let q = self.heads * self.head_dim;
        let kv = self.kv_heads * self.head_dim;
        let weights = h * q + 2 * h * kv + q * h;
        let biases = if self.bias { q + 2 * kv + h } else { 0 };
        weights + biases
    }

    fn mlp_params(&self, ffn: u64) -> u64 {
        let h = self.hidden_size;
        let biases = if self.bias {
            (self.mlp.matrices() - 1) * ffn + h
        } else {
            0
        };
        self.mlp.matrices() * h * ffn + biases
    }

    /// MLP parameters of one layer: (all, active per token).
    fn layer_mlp_params(&self) -> (u64, u64) {
        match self.moe {
            None => {
                let p = self.mlp_params(self.ffn);
                (p, p)
            }
            Some(m) => {
                let expert = self.mlp_params(m.expert_ffn);
                let router = self.hidden_size * m.experts;
                (
                    (m.experts + m.shared) * expert + router,
                    (m.active + m.shared) * expert + router,
                )
            }
        }
    }

    /// Parameter counts from the shape (embeddings, blocks, norms, biases).
    pub fn param_counts(&self) -> ParamCounts {
        let h = self.hidden_size;
        let norm = self.norm.params_per_channel() * h;
        let attention = self.attention_params();
        let (mlp_all, mlp_active) = self.layer_mlp_params();
        let self_layer = attention + mlp_all + 2 * norm;
        let self_layer_active = attention + mlp_active + 2 * norm;
        let cross = attention + norm;
        let blocks = self.layers * self_layer + self.cross_attention_layers * cross;
        let blocks_active = self.layers * self_layer_active + self.cross_attention_layers * cross;
        let embedding = self.vocab * h;
        let embeddings = if self.tied_embeddings {
            embedding
        } else {
            2 * embedding
        };
        let positions = self.position_embeddings.map_or(0, |p| p * h);
        // One final norm per stack (two for an encoder-decoder).
        let final_norms = if self.cross_attention_layers > 0 {
            2
        } else {
            1
        } * norm;
        // T5-style relative attention biases: 32 buckets per head, one table per stack.
        let relative = if self.cross_attention_layers > 0 && self.position_embeddings.is_none() {
            2 * 32 * self.heads
        } else {
            0
        };
        let rest = embeddings + positions + final_norms + relative;
        let per_layer = if self.cross_attention_layers > 0 {
            self_layer + cross
        } else {
            self_layer
        };
        let largest_module = embedding.max(self.largest_linear());
        let computed = ParamCounts {
            total: blocks + rest,
            active: blocks_active + rest,
            per_layer,
            blocks,
            embedding,
            largest_module,
        };
        match self.params_override {
            None => computed,
            Some(total) => computed.scaled_to(total, rest, self.layers.max(1)),
        }
    }

    /// The largest single linear layer (what `parameters(recurse=False)` sees as one module).
    fn largest_linear(&self) -> u64 {
        let h = self.hidden_size;
        let ffn = self.moe.map_or(self.ffn, |m| m.expert_ffn);
        let mlp = h * ffn;
        let attention = h * self.heads * self.head_dim;
        mlp.max(attention)
    }
}

#[cfg(test)]
mod tests {
    use crate::plan::builtin;

    fn total(name: &str) -> u64 {
        builtin::find(name).expect("built-in").param_counts().total
    }

    #[test]
    fn parameter_counts_match_published_totals() {
        // Published totals of the Hugging Face checkpoints (model cards / safetensors index).
        assert_eq!(total("llama-2-7b"), 6_738_415_616);
        assert_eq!(total("llama-3-8b"), 8_030_261_248);
        assert_eq!(total("llama-3.1-8b"), 8_030_261_248);
        assert_eq!(total("llama-2-13b"), 13_015_864_320);
        assert_eq!(total("llama-2-70b"), 68_976_648_192);
        assert_eq!(total("llama-3-70b"), 70_553_706_496);
        assert_eq!(total("mistral-7b"), 7_241_732_096);
        // DeepSpeed memory docs: t5-large has 737.67M parameters, largest layer 32.90M.
        let t5 = builtin::find("t5-large").expect("built-in").param_counts();
        assert_eq!(t5.total, 737_668_096);
        assert_eq!(t5.largest_module, 32_899_072);
    }

    #[test]
    fn gpt3_is_175b() {
        // Brown et al. 2020: 175B (12 L h^2 + 13 L h + (v + s) h = 174.6B).
        let n = total("gpt3-175b");
        assert!((174_000_000_000..176_000_000_000).contains(&n), "{n}");
    }
}
