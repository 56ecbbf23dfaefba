//! Reading a Hugging Face `config.json` (dense, GQA/MQA, MoE, encoder-decoder) into a
//! `ModelConfig`. Takes the file's text; the caller opens the file.

use super::model::{Mlp, ModelConfig, Moe, Norm};
use serde_json::{Map, Value};

/// Why a `config.json` could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("not valid JSON: {0}")]
    Json(String),
    #[error("expected a JSON object at the top level")]
    NotObject,
    #[error("missing {0}")]
    Missing(&'static str),
    #[error("{field} must be a positive integer")]
    Invalid { field: &'static str },
    #[error(
        "hidden size {hidden} is not divisible by {heads} attention heads and no head_dim is given"
    )]
    HeadDim { hidden: u64, heads: u64 },
    #[error(
        "multi-head latent attention (kv_lora_rank, DeepSeek-V2/V3 style) is not modelled yet"
    )]
    LatentAttention,
    #[error("implausibly large model (about {0} parameters); check the sizes in the file")]
    TooLarge(u64),
}

/// Largest model accepted (parameters), so that counts stay far from `u64::MAX`.
const MAX_PARAMS: f64 = 1e15;

/// Most transformer blocks accepted.
const MAX_LAYERS: f64 = 65536.0;

/// Model types whose MLP is gated (SwiGLU / GeGLU).
const GATED: [&str; 16] = [
    "llama",
    "mistral",
    "mixtral",
    "qwen2",
    "qwen2_moe",
    "qwen3",
    "qwen3_moe",
    "gemma",
    "gemma2",
    "gemma3_text",
    "phi3",
    "olmo",
    "olmo2",
    "olmoe",
    "deepseek_v2",
    "deepseek_v3",
];

/// Model types with a learned absolute position table.
const LEARNED_POSITIONS: [&str; 4] = ["gpt2", "gpt_bigcode", "opt", "gpt_neo"];

struct Fields<'a>(&'a Map<String, Value>);

impl Fields<'_> {
    /// The first of `keys` that is present and not null.
    fn get(&self, keys: &[&str]) -> Option<&Value> {
        keys.iter()
            .filter_map(|k| self.0.get(*k))
            .find(|v| !v.is_null())
    }

    fn uint(&self, keys: &[&str], field: &'static str) -> Result<Option<u64>, ConfigError> {
        match self.get(keys) {
            None => Ok(None),
            Some(v) => match v.as_u64() {
                Some(n) if n > 0 => Ok(Some(n)),
                _ => Err(ConfigError::Invalid { field }),
            },
        }
    }

    fn required(&self, keys: &[&str], field: &'static str) -> Result<u64, ConfigError> {
        self.uint(keys, field)?.ok_or(ConfigError::Missing(field))
    }

    fn flag(&self, keys: &[&str]) -> Option<bool> {
        self.get(keys).and_then(Value::as_bool)
    }

    fn text(&self, keys: &[&str]) -> Option<&str> {
        self.get(keys).and_then(Value::as_str)
    }
}

/// Parses the text of a `config.json`. `name` labels the model in reports.
pub fn parse_config(text: &str, name: &str) -> Result<ModelConfig, ConfigError> {
    let value: Value = serde_json::from_str(text).map_err(|e| ConfigError::Json(e.to_string()))?;
    let map = value.as_object().ok_or(ConfigError::NotObject)?;
    let f = Fields(map);
    let model_type = f.text(&["model_type"]).unwrap_or("").to_ascii_lowercase();

    if f.get(&["kv_lora_rank"]).is_some() {
        return Err(ConfigError::LatentAttention);
    }
    let hidden = f.required(&["hidden_size", "n_embd", "d_model"], "hidden_size")?;
    let encoder_layers = f.required(
        &["num_hidden_layers", "n_layer", "num_layers"],
        "num_hidden_layers",
    )?;
    let encoder_decoder = f.flag(&["is_encoder_decoder"]).unwrap_or(false);
    let decoder_layers = if encoder_decoder {
        f.uint(&["num_decoder_layers"], "num_decoder_layers")?
            .unwrap_or(encoder_layers)
    } else {
        0
    };
    let heads = f.required(
        &["num_attention_heads", "n_head", "num_heads"],
        "num_attention_heads",
    )?;
    let kv_heads = if f.flag(&["multi_query"]) == Some(true) {
        1
    } else {
        f.uint(&["num_key_value_heads"], "num_key_value_heads")?
            .unwrap_or(heads)
    };
    let head_dim = match f.uint(&["head_dim", "d_kv"], "head_dim")? {
        Some(d) => d,
        None if hidden.is_multiple_of(heads) => hidden / heads,
        None => return Err(ConfigError::HeadDim { hidden, heads }),
    };
    let ffn = f
        .uint(
            &["intermediate_size", "n_inner", "ffn_dim", "d_ff"],
            "intermediate_size",
        )?
        .unwrap_or(hidden.saturating_mul(4));
    let gated = GATED.contains(&model_type.as_str())
        || f.text(&["feed_forward_proj"])
            .is_some_and(|p| p.starts_with("gated"))
        || f.text(&["hidden_act", "activation_function"])
            .is_some_and(|a| a.contains("glu"));
    let rms = map.contains_key("rms_norm_eps") || model_type.starts_with("t5");
    let bias = f
        .flag(&["attention_bias", "bias", "use_bias"])
        .unwrap_or(!rms);
    let vocab = f.required(&["vocab_size"], "vocab_size")?;
    let max_positions = f.uint(
        &["max_position_embeddings", "n_positions", "n_ctx"],
        "max_position_embeddings",
    )?;
    let position_embeddings = if LEARNED_POSITIONS.contains(&model_type.as_str()) {
        let offset = if model_type == "opt" { 2 } else { 0 };
        max_positions.map(|p| p.saturating_add(offset))
    } else {
        None
    };
    let experts = f.uint(
        &["num_local_experts", "n_routed_experts", "num_experts"],
        "num_local_experts",
    )?;
    let moe = match experts {
        None | Some(1) => None,
        Some(experts) => Some(Moe {
            experts,
            active: f
                .uint(&["num_experts_per_tok", "moe_topk"], "num_experts_per_tok")?
                .unwrap_or(2),
            shared: f
                .uint(&["n_shared_experts"], "n_shared_experts")?
                .unwrap_or(0),
            expert_ffn: f
                .uint(&["moe_intermediate_size"], "moe_intermediate_size")?
                .unwrap_or(ffn),
        }),
    };
    // Keep every later integer product in range: estimate the size in floating point first.
    let (h, l, v) = (
        hidden as f64,
        encoder_layers as f64 + decoder_layers as f64,
        vocab as f64,
    );
    let width = heads.max(kv_heads) as f64 * head_dim as f64;
    let positions = position_embeddings.map_or(0.0, |p| p as f64);
    let experts = moe.map_or(1.0, |m| {
        m.experts as f64 + m.shared as f64 + m.active as f64 + 1.0
    });
    let mlp_width = moe.map_or(ffn, |m| m.expert_ffn.max(ffn)) as f64;
    let estimate =
        l * (4.0 * h * width + 3.0 * h * mlp_width * experts) + (2.0 * v + positions) * h;
    if estimate > MAX_PARAMS || width > MAX_PARAMS.sqrt() || h > MAX_PARAMS.sqrt() || l > MAX_LAYERS
    {
        return Err(ConfigError::TooLarge(estimate.min(u64::MAX as f64) as u64));
    }
    Ok(ModelConfig {
        name: name.to_string(),
        hidden_size: hidden,
        layers: encoder_layers + decoder_layers,
        cross_attention_layers: decoder_layers,
        heads,
        kv_heads,
        head_dim,
        ffn,
        mlp: if gated { Mlp::Gated } else { Mlp::Plain },
        norm: if rms { Norm::RmsNorm } else { Norm::LayerNorm },
        bias,
        vocab,
        tied_embeddings: f.flag(&["tie_word_embeddings"]).unwrap_or(true),
        position_embeddings,
        max_positions,
        moe,
        params_override: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::builtin;

    const LLAMA3_8B: &str = r#"{
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
      "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
      "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
      "max_position_embeddings": 8192, "tie_word_embeddings": false, "vocab_size": 128256,
      "attention_bias": false, "torch_dtype": "bfloat16"
    }"#;

    #[test]
    fn llama3_config_matches_the_builtin() {
        let parsed = parse_config(LLAMA3_8B, "llama-3-8b").expect("parses");
        let builtin = builtin::find("llama-3-8b").expect("built-in");
        assert_eq!(parsed, builtin);
    }

    #[test]
    fn mixtral_counts_total_and_active_experts() {
        // Mixtral-8x7B: 46.7B total, 12.9B active (Mistral AI announcement).
        let text = r#"{"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
          "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
          "num_local_experts": 8, "num_experts_per_tok": 2, "rms_norm_eps": 1e-05,
          "tie_word_embeddings": false, "vocab_size": 32000, "max_position_embeddings": 32768}"#;
        let counts = parse_config(text, "mixtral")
            .expect("parses")
            .param_counts();
        let billions = |n: u64| (n as f64 / 1e8).round() / 10.0;
        assert_eq!(billions(counts.total), 46.7);
        assert_eq!(billions(counts.active), 12.9);
    }

    #[test]
    fn gpt_bigcode_multi_query() {
        let text = r#"{"model_type": "gpt_bigcode", "n_embd": 6144, "n_layer": 40, "n_head": 48,
          "multi_query": true, "n_positions": 8192, "vocab_size": 49152, "n_inner": 24576}"#;
        let model = parse_config(text, "octocoder").expect("parses");
        assert_eq!((model.kv_heads, model.head_dim), (1, 128));
        assert_eq!(model.position_embeddings, Some(8192));
        assert!(model.bias);
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(
            parse_config(r#"{"n_embd": 10}"#, "x"),
            Err(ConfigError::Missing("num_hidden_layers"))
        );
        assert_eq!(
            parse_config(r#"{"hidden_size": -1}"#, "x"),
            Err(ConfigError::Invalid {
                field: "hidden_size"
            })
        );
        assert_eq!(parse_config("[]", "x"), Err(ConfigError::NotObject));
        let huge = r#"{"hidden_size": 4000000000, "num_hidden_layers": 4000000000,
            "num_attention_heads": 1, "vocab_size": 4000000000}"#;
        assert!(matches!(
            parse_config(huge, "x"),
            Err(ConfigError::TooLarge(_))
        ));
        assert_eq!(
            parse_config(r#"{"kv_lora_rank": 512}"#, "x"),
            Err(ConfigError::LatentAttention)
        );
        assert!(matches!(parse_config("{", "x"), Err(ConfigError::Json(_))));
    }
}
