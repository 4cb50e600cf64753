//! `model.toml`: what to compile. Unknown fields and missing required fields are errors
//! that name the field (serde's `deny_unknown_fields`; the toml crate adds line and column).
//!
//! ```toml
//! [model]
//! name = "smollm2-135m-instruct"   # plan and API model name
//! architecture = "llama"           # llama family: Llama 2/3, SmolLM2, Qwen2 (attention biases);
//!                                  # deepseek: DeepSeek-V2/V2-Lite/V3/R1 (safetensors + config.json)
//!
//! [weights]
//! format = "gguf"                  # gguf | safetensors | seeded
//! path = "../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"  # relative to this file
//! sha256 = "b179c952..."           # optional; checked when given
//! # seeded only: seed = 0, dtype = "bf16" (weights generated from the seed, for benchmarks)
//!
//! [dims]            # required for seeded weights; otherwise optional and checked against
//! hidden = 576      # the checkpoint's own config
//! ...
//!
//! [limits]
//! max_seq_len = 2048    # longest sequence (prompt + generated) the plan serves
//! kv_block_size = 16    # tokens per KV-cache block
//! max_batch = 32        # sequences per step
//!
//! [precision]
//! activations = "f32"   # f32 | bf16 | f16
//! kv_cache = "f32"      # f32 | bf16 | f16 | f8e4m3 (each token's head row Hadamard-rotated, a
//!                       # scale per token and head; CPU executor only — the GPU kernels: f32
//!                       # or bf16, half the bytes)
//! act_quant = "none"    # none | fp8[-gN] | int8[-gN]: 8-bit activations (dynamic scale per
//!                       # token or per N values) for the matmuls with weights below 16 bits
//!                       # (W8A8, W4A8); the GPU takes fp8-g128 (FP8 GEMM with
//!                       # f8g128 weights on sm_90a), the rest CPU executor only
//! sparsity = "none"     # none | 2:4 | 4:8 over sparse_layers (default ["attn_o", "mlp"]),
//! sparsity_method = "magnitude"  # | wanda; 2:4 stored as sp24_bf16; CPU executor only
//! weights = "stored"    # stored (as in the checkpoint) | f32 | bf16 | f16 | q8_0 | q4_0 | q4_1
//!                       # | fp8 (e4m3, an f32 scale per 128 values of a row: dsc's f8g128,
//!                       #   or f8g32 blocks for rows not whole 512-value super-blocks)
//!                       # | int8[-gN] | int4[-sym|-asym][-gN] (groups of N, default 128)
//! calibration = "none"  # none | awq (activation-aware scales before integer rounding)
//! # calibration_text = "calib.txt"; calibration_tokens = 512
//!
//! [precision.layers]    # optional, per layer type over `weights` (quantize.rs): attn_qkv,
//! mlp = "int4-g128"     # attn_o, mlp, experts, router, lm_head, embeddings; with a quantized
//!                       # `weights`, attn_qkv / router / lm_head / embeddings stay stored
//!
//! [parallel]            # optional
//! tp = 2                # tensor-parallel ranks (one GPU each); `dsc compile --tp N` overrides
//!
//! [tokenizer]           # optional: default is the GGUF metadata or tokenizer.json next to the weights
//! path = "tokenizer.json"
//! # gguf = "../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"  # or: from a GGUF's metadata
//! chat_template = "..." # overrides the checkpoint's template
//! ```

use crate::error::{ModelError, Result};
use crate::quantize::{Format, LayerKind, Policy};
use dsc_ir::DType;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelToml {
    pub model: ModelSection,
    pub weights: WeightsSection,
    #[serde(default)]
    pub dims: Option<Dims>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default)]
    pub precision: Precision,
    #[serde(default)]
    pub tokenizer: Option<TokenizerSection>,
    #[serde(default)]
    pub parallel: Option<Parallel>,
}

/// How the model is spread over GPUs. Absent: one GPU, graph not partitioned.
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Parallel {
    /// tensor-parallel world size (1 partitions for one rank: all_reduce nodes are identities)
    pub tp: usize,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub name: String,
    pub architecture: Architecture,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    /// DeepSeek-V2/V3 (MLA + DeepSeekMoE), from an HF checkpoint's config.json
    Deepseek,
}

#[derive(Clone, Copy, Debug, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum WeightFormat {
    Gguf,
    Safetensors,
    Seeded,
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WeightsSection {
    pub format: WeightFormat,
    /// GGUF file, or a safetensors file / HF directory; relative to model.toml
    #[serde(default)]
    pub path: Option<PathBuf>,
    #[serde(default)]
    pub sha256: Option<String>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub dtype: Option<String>,
    /// seeded DeepSeek only: the HF config.json that gives the architecture (relative to
    /// model.toml), e.g. `deepseek-v2-lite.config.json`
    #[serde(default)]
    pub config: Option<PathBuf>,
}

/// Architecture dimensions (llama family).
#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Dims {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    pub rope_theta: f32,
    pub norm_eps: f32,
    #[serde(default)]
    pub tie_embeddings: bool,
    #[serde(default)]
    pub attention_bias: bool,
    #[serde(default)]
    pub max_position: Option<usize>,
}

/// Upper bounds on model dimensions, far past any real model (DeepSeek-V3: hidden 7,168, 61
/// layers, 128 heads, vocab 129,280): they stop one field of a model.toml, config.json or GGUF
/// from driving an allocation abort or a wrapped product.
pub mod bounds {
    pub const HIDDEN: usize = 1 << 17;
    pub const LAYERS: usize = 1 << 12;
    pub const HEADS: usize = 1 << 12;
    pub const HEAD_DIM: usize = 1 << 12;
    pub const FFN: usize = 1 << 20;
    pub const VOCAB: usize = 1 << 22;
    pub const SEQ: usize = 1 << 22;
    pub const BATCH: usize = 1 << 16;
    pub const KV_BLOCK: usize = 4096;
}

impl Dims {
    /// Every dimension positive and under [`bounds`], the heads consistent: an error naming the
    /// field (`prefix` + its name in this source, e.g. `dims.` or config.json's key).
    pub fn check(&self, names: &DimNames) -> std::result::Result<(), String> {
        use bounds::*;
        for (name, v, max) in [
            (names.hidden, self.hidden, HIDDEN),
            (names.layers, self.layers, LAYERS),
            (names.heads, self.heads, HEADS),
            (names.kv_heads, self.kv_heads, HEADS),
            (names.head_dim, self.head_dim, HEAD_DIM),
            (names.ffn, self.ffn, FFN),
            (names.vocab, self.vocab, VOCAB),
        ] {
            if v == 0 || v > max {
                return Err(format!("field `{name}` is {v}; it must be 1 to {max}"));
            }
        }
        if self.heads % self.kv_heads != 0 {
            return Err(format!("field `{}` ({}) must be a multiple of `{}` ({})", names.heads, self.heads, names.kv_heads, self.kv_heads));
        }
        if self.head_dim % 2 != 0 {
            return Err(format!("field `{}` ({}) must be even (RoPE rotates pairs)", names.head_dim, self.head_dim));
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!("field `{}` is {}; it must be a positive number", names.rope_theta, self.rope_theta));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0 && self.norm_eps < 1.0) {
            return Err(format!("field `{}` is {}; it must be in [0, 1)", names.norm_eps, self.norm_eps));
        }
        Ok(())
    }
}

/// What each [`Dims`] field is called in one source (for errors).
pub struct DimNames {
    pub hidden: &'static str,
    pub layers: &'static str,
    pub heads: &'static str,
    pub kv_heads: &'static str,
    pub head_dim: &'static str,
    pub ffn: &'static str,
    pub vocab: &'static str,
    pub rope_theta: &'static str,
    pub norm_eps: &'static str,
}

pub const TOML_NAMES: DimNames = DimNames {
    hidden: "dims.hidden",
    layers: "dims.layers",
    heads: "dims.heads",
    kv_heads: "dims.kv_heads",
    head_dim: "dims.head_dim",
    ffn: "dims.ffn",
    vocab: "dims.vocab",
    rope_theta: "dims.rope_theta",
    norm_eps: "dims.norm_eps",
};

pub const HF_NAMES: DimNames = DimNames {
    hidden: "hidden_size",
    layers: "num_hidden_layers",
    heads: "num_attention_heads",
    kv_heads: "num_key_value_heads",
    head_dim: "head_dim",
    ffn: "intermediate_size",
    vocab: "vocab_size",
    rope_theta: "rope_theta",
    norm_eps: "rms_norm_eps",
};

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default = "d_max_seq")]
    pub max_seq_len: usize,
    #[serde(default = "d_block")]
    pub kv_block_size: usize,
    #[serde(default = "d_batch")]
    pub max_batch: usize,
}
fn d_max_seq() -> usize {
    2048
}
fn d_block() -> usize {
    16
}
fn d_batch() -> usize {
    32
}
impl Default for Limits {
    fn default() -> Self {
        Limits { max_seq_len: d_max_seq(), kv_block_size: d_block(), max_batch: d_batch() }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Precision {
    #[serde(default = "d_f32")]
    pub activations: String,
    #[serde(default = "d_f32")]
    pub kv_cache: String,
    #[serde(default = "d_stored")]
    pub weights: String,
    /// `none` | `awq` (the activation-aware scale search before integer rounding)
    #[serde(default = "d_none")]
    pub calibration: String,
    /// the calibration text (default: the first tokens of the text `dsc ppl` scores,
    /// data/coriolanus-act1.txt, built in)
    #[serde(default)]
    pub calibration_text: Option<PathBuf>,
    /// calibration tokens (default 512)
    #[serde(default)]
    pub calibration_tokens: Option<usize>,
    /// per layer type: attn_qkv, attn_o, mlp, experts, router, lm_head, embeddings → a format
    #[serde(default)]
    pub layers: std::collections::BTreeMap<String, String>,
    /// 8-bit activations for the matmuls whose weights are below 16 bits (W8A8, W4A8; not
    /// the sensitive layer types unless `[precision.layers]` names them):
    /// `none` | `fp8` (e4m3, a dynamic scale per token) | `fp8-gN` (per N values of a token,
    /// DeepSeek-V3's 1x128) | `int8` | `int8-gN`
    #[serde(default = "d_none")]
    pub act_quant: String,
    /// N:M structured sparsity for `sparse_layers`: `none` | `2:4` | `4:8` (sparsity.rs)
    #[serde(default = "d_none")]
    pub sparsity: String,
    /// `magnitude` | `wanda` (|W| times its input's norm over the calibration text)
    #[serde(default = "d_magnitude")]
    pub sparsity_method: String,
    /// layer types pruned (default attn_o and mlp)
    #[serde(default)]
    pub sparse_layers: Option<Vec<String>>,
}
fn d_magnitude() -> String {
    "magnitude".into()
}
fn d_none() -> String {
    "none".into()
}
fn d_f32() -> String {
    "f32".into()
}
fn d_stored() -> String {
    "stored".into()
}
impl Default for Precision {
    fn default() -> Self {
        Precision {
            activations: d_f32(),
            kv_cache: d_f32(),
            weights: d_stored(),
            calibration: d_none(),
            calibration_text: None,
            calibration_tokens: None,
            layers: Default::default(),
            act_quant: d_none(),
            sparsity: d_none(),
            sparsity_method: d_magnitude(),
            sparse_layers: None,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TokenizerSection {
    #[serde(default)]
    pub path: Option<PathBuf>,
    /// take the tokenizer from this GGUF file's metadata (e.g. a seeded benchmark model with a
    /// real model's vocabulary)
    #[serde(default)]
    pub gguf: Option<PathBuf>,
    #[serde(default)]
    pub chat_template: Option<String>,
}

/// A parsed model.toml with its location (relative paths resolve against its folder).
#[derive(Clone, Debug)]
pub struct ModelConfig {
    pub path: PathBuf,
    pub toml: ModelToml,
    pub activations: DType,
    pub kv_cache: DType,
    /// what each weight matrix becomes
    pub policy: Policy,
    /// `precision.act_quant`: (f8e4m3 or i8, values per scale — 0: a whole row)
    pub act_quant: Option<(DType, usize)>,
    /// `precision.sparsity` with its method and layer types
    pub sparsity: Option<crate::sparsity::SparsitySpec>,
}

/// `dsc compile` flags over model.toml's `[precision]`.
#[derive(Clone, Debug, Default)]
pub struct PrecisionOverride {
    /// `--quant FORMAT`: `precision.weights`
    pub weights: Option<String>,
    /// `--calibration none|awq`: `precision.calibration`
    pub calibration: Option<String>,
    /// `--quant-layer KIND=FORMAT`: entries of `[precision.layers]`
    pub layers: Vec<(String, String)>,
    /// `--act-quant`: `precision.act_quant`
    pub act_quant: Option<String>,
    /// `--sparsity`, `--sparsity-method`: `precision.sparsity`, `precision.sparsity_method`
    pub sparsity: Option<String>,
    pub sparsity_method: Option<String>,
}

impl ModelConfig {
    pub fn load(path: &Path) -> Result<Self> {
        Self::load_with(path, &PrecisionOverride::default())
    }

    /// As [`ModelConfig::load`], with `dsc compile`'s precision flags over the file's.
    pub fn load_with(path: &Path, ov: &PrecisionOverride) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(crate::error::io(path))?;
        Self::parse_with(path, &text, ov)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self> {
        Self::parse_with(path, text, &PrecisionOverride::default())
    }

    fn parse_with(path: &Path, text: &str, ov: &PrecisionOverride) -> Result<Self> {
        let cerr = |msg: String| ModelError::Config { path: path.to_path_buf(), msg };
        let mut toml: ModelToml = toml::from_str(text).map_err(|e| cerr(e.to_string().trim_end().to_string()))?;
        if let Some(w) = &ov.weights {
            toml.precision.weights = w.clone();
        }
        if let Some(c) = &ov.calibration {
            toml.precision.calibration = c.clone();
        }
        for (k, v) in &ov.layers {
            toml.precision.layers.insert(k.clone(), v.clone());
        }
        if let Some(a) = &ov.act_quant {
            toml.precision.act_quant = a.clone();
        }
        if let Some(a) = &ov.sparsity {
            toml.precision.sparsity = a.clone();
        }
        if let Some(a) = &ov.sparsity_method {
            toml.precision.sparsity_method = a.clone();
        }
        let dt = |field: &str, v: &str, allowed: &[DType]| -> Result<DType> {
            let d: DType = v.parse().map_err(|e: String| cerr(format!("field `{field}`: {e}")))?;
            if !allowed.contains(&d) {
                let names: Vec<_> = allowed.iter().map(|d| d.name()).collect();
                return Err(cerr(format!("field `{field}`: `{v}` is not allowed here (one of {})", names.join(", "))));
            }
            Ok(d)
        };
        use DType::*;
        let activations = dt("precision.activations", &toml.precision.activations, &[F32, BF16, F16])?;
        let kv_cache = dt("precision.kv_cache", &toml.precision.kv_cache, &[F32, BF16, F16, F8E4M3])?;
        let policy = Self::policy(&toml.precision).map_err(cerr)?;
        let act_quant = parse_act_quant(&toml.precision.act_quant).map_err(|e| cerr(format!("field `precision.act_quant`: {e}")))?;
        let p = &toml.precision;
        let sparsity = crate::sparsity::SparsitySpec::parse(&p.sparsity, &p.sparsity_method, p.sparse_layers.as_deref()).map_err(cerr)?;
        let l = &toml.limits;
        if l.kv_block_size == 0 || !l.kv_block_size.is_power_of_two() {
            return Err(cerr(format!("field `limits.kv_block_size`: {} must be a power of two", l.kv_block_size)));
        }
        if l.kv_block_size > bounds::KV_BLOCK {
            return Err(cerr(format!("field `limits.kv_block_size`: {} is over {}", l.kv_block_size, bounds::KV_BLOCK)));
        }
        if l.max_seq_len == 0 || l.max_batch == 0 {
            return Err(cerr("fields `limits.max_seq_len` and `limits.max_batch` must be positive".into()));
        }
        if l.max_seq_len > bounds::SEQ || l.max_batch > bounds::BATCH {
            return Err(cerr(format!("fields `limits.max_seq_len` ({}, at most {}) / `limits.max_batch` ({}, at most {}) out of bounds", l.max_seq_len, bounds::SEQ, l.max_batch, bounds::BATCH)));
        }
        match toml.weights.format {
            WeightFormat::Seeded if toml.model.architecture == Architecture::Deepseek => {
                if toml.weights.config.is_none() {
                    return Err(cerr("seeded deepseek weights need `weights.config` (an HF config.json giving the architecture)".into()));
                }
                if toml.weights.path.is_some() {
                    return Err(cerr("field `weights.path` is not used with format = \"seeded\"".into()));
                }
                if let Some(d) = &toml.weights.dtype {
                    dt("weights.dtype", d, &[F32, BF16, F16, Q8_0, Q4_0, Q4_1, Q4_K, I4G128, F8G128])?;
                }
            }
            WeightFormat::Seeded => {
                if toml.dims.is_none() {
                    return Err(cerr("seeded weights need a [dims] table".into()));
                }
                if toml.weights.config.is_some() {
                    return Err(cerr("field `weights.config` is for seeded deepseek weights (llama takes [dims])".into()));
                }
                if toml.weights.path.is_some() {
                    return Err(cerr("field `weights.path` is not used with format = \"seeded\"".into()));
                }
                if let Some(d) = &toml.weights.dtype {
                    dt("weights.dtype", d, &[F32, BF16, F16, Q8_0, Q4_0, Q4_1, Q4_K, I4G128, F8G128])?;
                }
            }
            _ => {
                if toml.weights.path.is_none() {
                    return Err(cerr("missing field `weights.path`".into()));
                }
                if toml.weights.seed.is_some() || toml.weights.dtype.is_some() || toml.weights.config.is_some() {
                    return Err(cerr("fields `weights.seed` / `weights.dtype` / `weights.config` are only for format = \"seeded\"".into()));
                }
            }
        }
        if let Some(p) = &toml.parallel {
            if p.tp == 0 || p.tp > 64 {
                return Err(cerr(format!("field `parallel.tp`: {} ranks (1..=64)", p.tp)));
            }
        }
        if let Some(d) = &toml.dims {
            d.check(&TOML_NAMES).map_err(cerr)?;
        }
        if policy.converts() && toml.weights.format == WeightFormat::Seeded {
            return Err(cerr("seeded weights are generated in `weights.dtype`; `precision.weights` / `[precision.layers]` convert checkpoints".into()));
        }
        if sparsity.is_some() && toml.weights.format == WeightFormat::Seeded {
            return Err(cerr("field `precision.sparsity`: seeded weights are not pruned (prune a checkpoint)".into()));
        }
        Ok(ModelConfig { path: path.to_path_buf(), toml, activations, kv_cache, policy, act_quant, sparsity })
    }

    fn policy(p: &Precision) -> std::result::Result<Policy, String> {
        let default = Format::parse(&p.weights).map_err(|e| format!("field `precision.weights`: {e}"))?;
        let mut layers = std::collections::BTreeMap::new();
        for (k, v) in &p.layers {
            let kind = LayerKind::ALL.into_iter().find(|l| l.key() == k).ok_or_else(|| {
                let keys: Vec<_> = LayerKind::ALL.iter().map(|l| l.key()).collect();
                format!("field `precision.layers.{k}`: not a layer type (one of {})", keys.join(", "))
            })?;
            layers.insert(kind, Format::parse(v).map_err(|e| format!("field `precision.layers.{k}`: {e}"))?);
        }
        let awq = match p.calibration.as_str() {
            "none" => false,
            "awq" => true,
            c => return Err(format!("field `precision.calibration`: `{c}` (none or awq)")),
        };
        let policy = Policy { default, layers, awq };
        if awq && !LayerKind::ALL.iter().any(|k| matches!(policy.format_for(Some(*k)), Format::Int(_))) {
            return Err(format!("field `precision.calibration`: awq scales integer formats, and no layer type gets one (precision.weights is `{}`)", p.weights));
        }
        if p.calibration_tokens == Some(0) {
            return Err("field `precision.calibration_tokens`: must be positive".into());
        }
        Ok(policy)
    }

    /// The weight matrices of `ws` (stored dtypes, before the policy) whose matmuls take 8-bit
    /// activations under `precision.act_quant`: those whose weights end up below 16 bits
    /// (stored so, or by the policy), except the sensitive layer types (Q/K/V, router, lm_head,
    /// embeddings) unless `[precision.layers]` names them. An error naming the field when
    /// `act_quant` is set and no matrix takes it.
    pub fn act_quant_weights(&self, ws: &crate::WeightSet) -> Result<std::collections::BTreeSet<String>> {
        let Some(_) = self.act_quant else { return Ok(Default::default()) };
        let tied = crate::tied(ws);
        let set: std::collections::BTreeSet<String> = ws
            .tensors
            .iter()
            .filter(|(n, t)| {
                let Some(k) = LayerKind::of(n, tied).filter(|_| t.shape.len() >= 2) else { return false };
                let low = !matches!(self.policy.format_for(Some(k)).dtype(t.dtype, *t.shape.last().unwrap_or(&1), true), DType::F32 | DType::F16 | DType::BF16);
                low && (!k.sensitive() || self.policy.layers.contains_key(&k))
            })
            .map(|(n, _)| n.clone())
            .collect();
        if set.is_empty() {
            return Err(ModelError::Config {
                path: self.path.clone(),
                msg: format!(
                    "field `precision.act_quant`: `{}` rounds the activations of matmuls whose weights are below 16 bits, and no matrix outside the sensitive layer types is (quantize some with `precision.weights` / `[precision.layers]`)",
                    self.toml.precision.act_quant
                ),
            });
        }
        Ok(set)
    }

    /// A path from model.toml, resolved against the file's folder.
    pub fn resolve(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_path_buf()
        } else {
            self.path.parent().unwrap_or(Path::new(".")).join(p)
        }
    }
}

/// `precision.act_quant`: `none`, `fp8[-gN]` or `int8[-gN]` → (dtype, values per scale; 0: a
/// whole row).
fn parse_act_quant(s: &str) -> std::result::Result<Option<(DType, usize)>, String> {
    if s == "none" {
        return Ok(None);
    }
    let (dt, rest) = if let Some(r) = s.strip_prefix("fp8") {
        (DType::F8E4M3, r)
    } else if let Some(r) = s.strip_prefix("int8") {
        (DType::I8, r)
    } else {
        return Err(format!("`{s}` (none, fp8, fp8-gN, int8, int8-gN)"));
    };
    let group = match rest {
        "" => 0,
        g => match g.strip_prefix("-g").and_then(|n| n.parse::<usize>().ok()) {
            Some(n) if n > 0 && n.is_multiple_of(32) => n,
            _ => return Err(format!("`{s}`: the group is -gN with N a positive multiple of 32 (e.g. fp8-g128)")),
        },
    };
    Ok(Some((dt, group)))
}
