//! KV-cache pool sizing for serving, the way vLLM sizes its pool: bytes per token (MHA, GQA,
//! MQA; TP-sharded heads), block bytes, number of blocks from the bytes the cache may take,
//! and the tokens and full-length sequences the pool holds. `reference/planner-math.md` §3.

use super::model::ModelConfig;

/// Element type of the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    Fp16,
    Bf16,
    Fp8,
}

impl KvDtype {
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::Fp16 => "fp16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8 => "fp8",
        }
    }

    pub fn bytes(self) -> u64 {
        match self {
            KvDtype::Fp16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8 => 1,
        }
    }
}

/// Bytes of model weights per parameter when serving (bf16 / fp16 checkpoints).
pub const WEIGHT_BYTES: u64 = 2;

/// vLLM's default block size on CUDA (tokens per block).
pub const DEFAULT_BLOCK_SIZE: u64 = 16;

/// Largest block size accepted.
pub const MAX_BLOCK_SIZE: u64 = 1 << 20;

/// What to size the pool for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KvSettings {
    pub dtype: KvDtype,
    pub tp: u64,
    pub block_size: u64,
    /// Tokens of a full-length request; the model's maximum when `None`.
    pub max_model_len: Option<u64>,
}

/// The sized pool, per GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPool {
    pub kv_bytes_per_token: u64,
    pub block_bytes: u64,
    /// Bytes the cache may take.
    pub available_bytes: u64,
    pub num_blocks: u64,
    pub max_tokens: u64,
    pub max_model_len: Option<u64>,
    /// Full-length sequences the pool holds at once (`num_blocks / ceil(len / block)`).
    pub max_concurrent_sequences: Option<u64>,
}

/// Why a pool cannot be sized.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KvError {
    #[error("{0} is an encoder-decoder model; plan kv sizes decoder-only caches")]
    EncoderDecoder(String),
    #[error("--tp and --block-size must be at least 1")]
    Zero,
    #[error("--block-size {0} is too large (at most {MAX_BLOCK_SIZE})")]
    BlockSize(u64),
}

/// KV-cache bytes per token on one GPU: 2 (K and V) x layers x KV heads on this rank x head
/// dim x element bytes. With more TP ranks than KV heads, heads are replicated, not split.
pub fn bytes_per_token(model: &ModelConfig, dtype: KvDtype, tp: u64) -> u64 {
    let heads_here = model.kv_heads.div_ceil(tp.max(1)).max(1);
    2 * model.layers * heads_here * model.head_dim * dtype.bytes()
}

/// Per-token and per-block bytes on one GPU, once the settings are checked.
pub fn cache_shape(model: &ModelConfig, s: &KvSettings) -> Result<(u64, u64), KvError> {
    if model.cross_attention_layers > 0 {
        return Err(KvError::EncoderDecoder(model.name.clone()));
    }
    if s.tp == 0 || s.block_size == 0 {
        return Err(KvError::Zero);
    }
    if s.block_size > MAX_BLOCK_SIZE {
        return Err(KvError::BlockSize(s.block_size));
    }
    let per_token = bytes_per_token(model, s.dtype, s.tp);
    Ok((per_token, per_token * s.block_size))
}

/// Sizes a pool of `available_bytes`, as vLLM's `num_blocks = available // page size`.
pub fn size_pool(
    model: &ModelConfig,
    s: &KvSettings,
    available_bytes: u64,
) -> Result<KvPool, KvError> {
    let (per_token, block_bytes) = cache_shape(model, s)?;
    let num_blocks = available_bytes / block_bytes;
    let max_model_len = s.max_model_len.or(model.max_positions);
    Ok(KvPool {
        kv_bytes_per_token: per_token,
        block_bytes,
        available_bytes,
        num_blocks,
        max_tokens: num_blocks * s.block_size,
        max_model_len,
        max_concurrent_sequences: max_model_len
            .map(|len| num_blocks / len.div_ceil(s.block_size).max(1)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::{builtin, hf};

    fn per_token(name: &str) -> u64 {
        bytes_per_token(&builtin::find(name).expect("built-in"), KvDtype::Fp16, 1)
    }

    const GIB: f64 = (1u64 << 30) as f64;

    /// `reference/planner-math.md` §3.1 table (derived from the model configs): Llama-3-8B
    /// 128 KiB, Llama-3-70B 320 KiB, Llama-3.1-405B 504 KiB, Llama-2-7B 512 KiB, Llama-2-13B /
    /// OPT-13B 800 KiB per token in fp16.
    #[test]
    fn bytes_per_token_table() {
        assert_eq!(per_token("llama-3-8b"), 131_072);
        assert_eq!(per_token("mistral-7b"), 131_072);
        assert_eq!(per_token("llama-3-70b"), 327_680);
        assert_eq!(per_token("llama-2-70b"), 327_680);
        assert_eq!(per_token("llama-3.1-405b"), 516_096);
        assert_eq!(per_token("llama-2-7b"), 524_288);
        assert_eq!(per_token("llama-2-13b"), 819_200);
        assert_eq!(per_token("opt-13b"), 819_200);
        // Per 4096 tokens: 0.5 / 1.25 / 1.97 / 2.0 / 3.125 GiB.
        let gib4k = |n: &str| per_token(n) as f64 * 4096.0 / GIB;
        assert_eq!(gib4k("llama-3-8b"), 0.5);
        assert_eq!(gib4k("llama-3-70b"), 1.25);
        assert_eq!((gib4k("llama-3.1-405b") * 100.0).round() / 100.0, 1.97);
        assert_eq!(gib4k("llama-2-13b"), 3.125);
    }

    /// Kwon et al. 2023 (vLLM paper) §3: OPT-13B stores 800 KB per token, up to 1.6 GB for a
    /// 2048-token request. vLLM blog: "up to 1.7GB for a single sequence in LLaMA-13B".
    #[test]
    fn vllm_paper_and_blog() {
        let opt = per_token("opt-13b") * 2048;
        assert_eq!((opt as f64 / 1e9 * 10.0).round() / 10.0, 1.7);
        assert_eq!((opt as f64 / 1e9 * 10.0).trunc() / 10.0, 1.6);
        let llama = per_token("llama-2-13b") * 2048;
        assert_eq!((llama as f64 / 1e9 * 10.0).round() / 10.0, 1.7);
    }

    /// HF "Optimizing LLMs for speed and memory": bigcode/octocoder at 16,000 tokens holds
    /// 2 x 16000 x 40 x 6144 = 7,864,320,000 values, "around 15 GB" in fp16; with MQA "less
    /// than 400 MB".
    #[test]
    fn hf_octocoder_example() {
        let config = r#"{"model_type": "gpt_bigcode", "n_embd": 6144, "n_layer": 40,
            "n_head": 48, "multi_query": false, "vocab_size": 49152, "n_positions": 8192}"#;
        let mut model = hf::parse_config(config, "octocoder").expect("parses");
        let mha = bytes_per_token(&model, KvDtype::Fp16, 1) * 16_000;
        assert_eq!(mha / 2, 7_864_320_000);
        assert_eq!((mha as f64 / 1e9).floor(), 15.0);
        model.kv_heads = 1;
        let mqa = bytes_per_token(&model, KvDtype::Fp16, 1) * 16_000;
        assert!(mqa < 400_000_000, "{mqa}");
    }

    /// KIVI issue #17 (maintainer answer): Llama-2-7B, 4196 tokens, fp16 -> 2.05 GB (GiB).
    #[test]
    fn kivi_llama2_example() {
        let gib = per_token("llama-2-7b") as f64 * 4196.0 / GIB;
        assert_eq!((gib * 100.0).round() / 100.0, 2.05);
    }

    /// `reference/planner-math.md` §3.3 worked check (derived from vLLM's kv_cache_utils):
    /// Llama-3-8B bf16, block 16, 50 GiB available -> 25,600 blocks = 409,600 tokens.
    #[test]
    fn vllm_block_count_worked_check() {
        let model = builtin::find("llama-3-8b").expect("built-in");
        let settings = KvSettings {
            dtype: KvDtype::Bf16,
            tp: 1,
            block_size: DEFAULT_BLOCK_SIZE,
            max_model_len: Some(8192),
        };
        let pool = size_pool(&model, &settings, 50 << 30).expect("sized");
        assert_eq!(pool.block_bytes, 2 << 20);
        assert_eq!(pool.num_blocks, 25_600);
        assert_eq!(pool.max_tokens, 409_600);
        assert_eq!(pool.max_concurrent_sequences, Some(50));
    }

    #[test]
    fn tp_splits_heads_until_they_run_out() {
        let model = builtin::find("llama-3-70b").expect("built-in");
        let one = bytes_per_token(&model, KvDtype::Bf16, 1);
        assert_eq!(bytes_per_token(&model, KvDtype::Bf16, 8), one / 8);
        // 8 KV heads on 16 ranks: one head each, replicated.
        assert_eq!(bytes_per_token(&model, KvDtype::Bf16, 16), one / 8);
        assert_eq!(bytes_per_token(&model, KvDtype::Fp8, 8), one / 16);
    }

    #[test]
    fn bad_settings_are_refused() {
        let model = builtin::find("llama-3-8b").expect("built-in");
        let settings = KvSettings {
            dtype: KvDtype::Bf16,
            tp: 1,
            block_size: 16,
            max_model_len: None,
        };
        let pool = size_pool(&model, &settings, 1 << 30).expect("sized");
        assert_eq!(pool.max_model_len, Some(8192));
        assert_eq!(pool.num_blocks, 512);
        let zero = KvSettings { tp: 0, ..settings };
        assert_eq!(size_pool(&model, &zero, 1 << 30), Err(KvError::Zero));
        let t5 = builtin::find("t5-large").expect("built-in");
        assert!(matches!(
            cache_shape(&t5, &settings),
            Err(KvError::EncoderDecoder(_))
        ));
    }
}
