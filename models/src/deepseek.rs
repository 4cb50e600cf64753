//! The DeepSeek family: DeepSeek-V2, V2-Lite, V2.5 (`DeepseekV2ForCausalLM`) and DeepSeek-V3, R1
//! (`DeepseekV3ForCausalLM`): Multi-head Latent Attention and DeepSeekMoE.
//!
//! Papers: DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts
//! Language Model" (2024) and "DeepSeek-V3 Technical Report" (2024); Dai et al., "DeepSeekMoE"
//! (2024). Reference implementation, and the oracle the tests hold us to: HF transformers
//! `models/deepseek_v2` and `models/deepseek_v3` (5.17), with DeepSeek's own `modeling_deepseek.py`
//! where the two differ (noted at the field).
//!
//! The graph (same step inputs as `llama`) per layer:
//! - MLA, absorbed form (DeepSeek-V2 §2.1.2; FlashMLA's decode): the KV cache holds one latent
//!   row per token, `[rms_norm(c_kv) (kv_lora_rank) | rope(k_rope) (qk_rope_head_dim)]` (576
//!   values for V2/V3); the query's no-rope part is multiplied by `kv_b_proj`'s key half per
//!   head (`head_matmul`, `q_nope @ W_uk`), so attention runs over the latent directly
//!   (`mla_attention`) and its output goes through the value half (`@ W_uv^T`) before `o_proj`.
//! - the MLP: a dense SwiGLU MLP for the first `first_k_dense_replace` layers, then DeepSeekMoE:
//!   router (`moe_route`), routed experts (`moe_experts`, weights stacked per expert), the shared
//!   experts as one SwiGLU MLP, summed.
//!
//! Weight names mirror the HF checkpoint, except two the importer derives ([`prepare`]):
//! - the routed experts' matrices, stacked: `model.layers.N.mlp.experts.E.gate_proj.weight` for
//!   E in 0..n_routed_experts become `model.layers.N.mlp.experts.gate_proj.weight` `[E, I, D]`
//!   (llama.cpp's GGUF layout, `blk.N.ffn_gate_exps.weight`);
//! - `kv_b_proj.weight` `[H * (nope + v), L]`, split per head into the absorbed forms, both in
//!   the `x @ W^T` layout: `kv_b_proj.k_heads.weight` `[H, L, nope]` (the key half, transposed:
//!   `q_latent = q_nope @ W_uk`) and `kv_b_proj.v_heads.weight` `[H, v, L]` (llama.cpp's
//!   `attn_k_b` / `attn_v_b`). Exact for f32/f16/bf16 checkpoints; an FP8 one's halves are bf16.
//!
//! DeepSeek's FP8 release (`quantization_config` quant_method fp8, 128x128 blocks) imports as
//! shipped ([`import_fp8`]): e4m3 matrices with their `weight_scale_inv` become dsc's f8g128.

use crate::builder::Builder;
use crate::error::{ModelError, Result};
use crate::weights::{Bytes, WeightSet, WeightTensor};
use dsc_ir::{shape, yarn_mscale, BinaryOp, DType, Graph, MoeRouting, MoeScoring, MoeSelect, NodeId, Op, RopeStyle, TensorType, UnaryOp, Yarn};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    /// DeepseekV2ForCausalLM: softmax gate, greedy or group-limited top-k, complex-number rope
    V2,
    /// DeepseekV3ForCausalLM: sigmoid gate with the noaux_tc correction bias
    V3,
}

/// YaRN as a DeepSeek config.json gives it (`rope_scaling`, or transformers 5's `rope_parameters`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct YarnConfig {
    pub factor: f32,
    pub original_max_position_embeddings: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub mscale: f32,
    pub mscale_all_dim: f32,
}

/// Every config.json field of the family that changes the math.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DeepseekConfig {
    pub version: Version,
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    pub vocab: usize,
    /// the dense layers' MLP width (`intermediate_size`)
    pub ffn: usize,
    pub moe_ffn: usize,
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    pub rope_theta: f32,
    /// V3's `rope_interleave` (V2 always pairs (2i, 2i+1))
    pub rope_interleave: bool,
    pub yarn: Option<YarnConfig>,
    pub n_routed_experts: usize,
    pub n_shared_experts: usize,
    pub num_experts_per_tok: usize,
    pub first_k_dense_replace: usize,
    pub moe_layer_freq: usize,
    pub routed_scaling_factor: f32,
    pub norm_topk_prob: bool,
    pub scoring: MoeScoringName,
    pub topk_method: String,
    pub n_group: usize,
    pub topk_group: usize,
    pub norm_eps: f32,
    pub tie_embeddings: bool,
    pub attention_bias: bool,
    pub max_position: Option<usize>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MoeScoringName {
    Softmax,
    Sigmoid,
}

/// q_a_layernorm and kv_a_layernorm are built with the RMSNorm default (HF and DeepSeek), not
/// `rms_norm_eps`.
const LORA_NORM_EPS: f32 = 1e-6;

impl DeepseekConfig {
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// One token's latent cache row: kv_lora_rank + qk_rope_head_dim.
    pub fn latent_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// DeepSeek's layer rule (its modeling_deepseek.py): MoE from `first_k_dense_replace` on,
    /// every `moe_layer_freq`-th layer (HF reads only the first; every released config has 1).
    pub fn is_moe(&self, layer: usize) -> bool {
        self.n_routed_experts > 0 && layer >= self.first_k_dense_replace && layer % self.moe_layer_freq == 0
    }

    /// The softmax scale: qk_head_dim^-0.5, times YaRN's mscale(factor, mscale_all_dim)^2.
    pub fn softmax_scale(&self) -> f32 {
        let base = (self.qk_head_dim() as f32).powf(-0.5);
        match &self.yarn {
            Some(y) if y.mscale_all_dim != 0.0 => {
                let m = yarn_mscale(y.factor, y.mscale_all_dim);
                base * m * m
            }
            _ => base,
        }
    }

    pub fn routing(&self) -> MoeRouting {
        MoeRouting {
            top_k: self.num_experts_per_tok,
            n_group: self.n_group,
            topk_group: self.topk_group,
            scoring: match self.scoring {
                MoeScoringName::Softmax => MoeScoring::Softmax,
                MoeScoringName::Sigmoid => MoeScoring::Sigmoid,
            },
            select: match self.topk_method.as_str() {
                "group_limited_greedy" => MoeSelect::GroupMax,
                "noaux_tc" => MoeSelect::NoauxTc,
                _ => MoeSelect::Greedy,
            },
            normalize: self.norm_topk_prob,
            scaling: self.routed_scaling_factor,
        }
    }

    fn rope_op(&self) -> Op {
        let style = if self.version == Version::V3 && !self.rope_interleave { RopeStyle::Half } else { RopeStyle::Interleaved };
        let (theta, rotary_dim) = (self.rope_theta, self.qk_rope_head_dim);
        match &self.yarn {
            None => Op::Rope { theta, style, rotary_dim },
            Some(y) => {
                // HF: attention_factor = mscale(factor, mscale) / mscale(factor, mscale_all_dim)
                // when both are given, else mscale(factor)
                let attention_factor = if y.mscale != 0.0 && y.mscale_all_dim != 0.0 { yarn_mscale(y.factor, y.mscale) / yarn_mscale(y.factor, y.mscale_all_dim) } else { yarn_mscale(y.factor, 1.0) };
                let yarn = Yarn { factor: y.factor, original_max_position: y.original_max_position_embeddings, beta_fast: y.beta_fast, beta_slow: y.beta_slow, attention_factor };
                Op::RopeYarn { theta, style, rotary_dim, yarn }
            }
        }
    }

    /// The dims every architecture shares (the plan header's, the compiler's layer count).
    pub fn common_dims(&self) -> crate::Dims {
        crate::Dims {
            hidden: self.hidden,
            layers: self.layers,
            heads: self.heads,
            kv_heads: self.heads,
            head_dim: self.qk_head_dim(),
            ffn: self.ffn,
            vocab: self.vocab,
            rope_theta: self.rope_theta,
            norm_eps: self.norm_eps,
            tie_embeddings: self.tie_embeddings,
            attention_bias: self.attention_bias,
            max_position: self.max_position,
        }
    }
}

/// Read a DeepSeek config.json. Every field that changes the math is read; a value dsc does
/// not implement is an error naming the field.
pub fn config_from_json(path: &Path, text: &str) -> Result<DeepseekConfig> {
    let v: Value = serde_json::from_str(text).map_err(|e| ModelError::Format { path: path.into(), msg: e.to_string() })?;
    let ferr = |msg: String| ModelError::Format { path: path.into(), msg };
    let uint = |k: &str| -> Result<usize> { v[k].as_u64().map(|x| x as usize).ok_or_else(|| ferr(format!("field `{k}` is missing or not a non-negative integer"))) };
    let uint_or = |k: &str, d: usize| -> Result<usize> {
        match &v[k] {
            Value::Null => Ok(d),
            x => x.as_u64().map(|x| x as usize).ok_or_else(|| ferr(format!("field `{k}` must be a non-negative integer, got {x}"))),
        }
    };
    let float_or = |k: &str, d: f64| -> Result<f32> {
        match &v[k] {
            Value::Null => Ok(d as f32),
            x => x.as_f64().map(|x| x as f32).ok_or_else(|| ferr(format!("field `{k}` must be a number, got {x}"))),
        }
    };
    let bool_or = |k: &str, d: bool| -> Result<bool> {
        match &v[k] {
            Value::Null => Ok(d),
            x => x.as_bool().ok_or_else(|| ferr(format!("field `{k}` must be true or false, got {x}"))),
        }
    };
    let str_or = |k: &str, d: &str| -> Result<String> {
        match &v[k] {
            Value::Null => Ok(d.to_string()),
            x => x.as_str().map(str::to_string).ok_or_else(|| ferr(format!("field `{k}` must be a string, got {x}"))),
        }
    };
    let arch = v["architectures"].get(0).and_then(|a| a.as_str()).unwrap_or("");
    let version = match (arch, v["model_type"].as_str().unwrap_or("")) {
        ("DeepseekV2ForCausalLM", _) | ("", "deepseek_v2") => Version::V2,
        ("DeepseekV3ForCausalLM", _) | ("", "deepseek_v3") => Version::V3,
        (a, m) => return Err(ferr(format!("field `architectures`: `{a}` (model_type `{m}`) is not DeepseekV2ForCausalLM or DeepseekV3ForCausalLM"))),
    };
    let act = str_or("hidden_act", "silu")?;
    if act != "silu" {
        return Err(ferr(format!("field `hidden_act`: `{act}` is not supported (DeepSeek's MLPs are SwiGLU: silu)")));
    }
    if !v["quantization_config"].is_null() {
        // DeepSeek-V3/R1's FP8 release: e4m3 weights with an f32 `weight_scale_inv` per 128x128
        // block (`prepare` turns them into f8g128, exactly)
        let q = &v["quantization_config"];
        let method = q["quant_method"].as_str().unwrap_or("?");
        let block = q["weight_block_size"].as_array().map(|b| b.iter().map(|x| x.as_u64()).collect::<Vec<_>>());
        let fmt = q["fmt"].as_str().unwrap_or("e4m3");
        if method != "fp8" || block != Some(vec![Some(128), Some(128)]) || fmt != "e4m3" {
            return Err(ferr(format!(
                "field `quantization_config`: {q} is not supported (dsc imports DeepSeek's FP8 release: quant_method \"fp8\", fmt \"e4m3\", weight_block_size [128, 128]; dequantize other checkpoints to bf16 first)"
            )));
        }
    }
    // rope: released checkpoints carry `rope_scaling`, transformers 5 writes `rope_parameters`
    let (rope_key, rope) = if !v["rope_scaling"].is_null() { ("rope_scaling", &v["rope_scaling"]) } else { ("rope_parameters", &v["rope_parameters"]) };
    let rope_theta = match (&v["rope_theta"], &rope["rope_theta"]) {
        (Value::Null, Value::Null) => 10000.0,
        (Value::Null, x) | (x, _) => x.as_f64().ok_or_else(|| ferr(format!("field `rope_theta` must be a number, got {x}")))? as f32,
    };
    let rope_type = rope["rope_type"].as_str().or(rope["type"].as_str()).unwrap_or("default");
    let yarn = match (rope.is_null(), rope_type) {
        (true, _) | (false, "default") => None,
        (false, "yarn") => {
            let f = |k: &str, d: Option<f64>| -> Result<f32> {
                match (&rope[k], d) {
                    (Value::Null, Some(d)) => Ok(d as f32),
                    (x, _) => x.as_f64().map(|x| x as f32).ok_or_else(|| ferr(format!("field `{rope_key}.{k}` is missing or not a number"))),
                }
            };
            if !rope["attention_factor"].is_null() {
                return Err(ferr(format!("field `{rope_key}.attention_factor` is not supported (DeepSeek derives it from mscale)")));
            }
            if rope["truncate"].as_bool() == Some(false) {
                return Err(ferr(format!("field `{rope_key}.truncate` = false is not supported")));
            }
            let y = YarnConfig {
                factor: f("factor", None)?,
                original_max_position_embeddings: rope["original_max_position_embeddings"]
                    .as_u64()
                    .ok_or_else(|| ferr(format!("field `{rope_key}.original_max_position_embeddings` is missing or not an integer")))? as usize,
                beta_fast: f("beta_fast", Some(32.0))?,
                beta_slow: f("beta_slow", Some(1.0))?,
                mscale: f("mscale", Some(0.0))?,
                mscale_all_dim: f("mscale_all_dim", Some(0.0))?,
            };
            if !(y.factor.is_finite() && y.factor >= 1.0) || y.original_max_position_embeddings == 0 || !(y.beta_fast > y.beta_slow && y.beta_slow > 0.0) {
                return Err(ferr(format!(
                    "field `{rope_key}`: factor {} (>= 1), original_max_position_embeddings {} (> 0), beta_fast {} > beta_slow {} > 0 required",
                    y.factor, y.original_max_position_embeddings, y.beta_fast, y.beta_slow
                )));
            }
            Some(y)
        }
        (false, other) => return Err(ferr(format!("field `{rope_key}`: rope type `{other}` is not supported for DeepSeek (default, yarn)"))),
    };
    let heads = uint("num_attention_heads")?;
    let n_routed_experts = uint_or("n_routed_experts", 0)?;
    let scoring = match (str_or("scoring_func", "softmax")?.as_str(), version) {
        ("softmax", Version::V2) => MoeScoringName::Softmax,
        ("sigmoid", Version::V3) => MoeScoringName::Sigmoid,
        (s, Version::V2) => return Err(ferr(format!("field `scoring_func`: `{s}` is not DeepseekV2's gate (softmax)"))),
        (s, Version::V3) => return Err(ferr(format!("field `scoring_func`: `{s}` is not DeepseekV3's gate (sigmoid)"))),
    };
    let topk_method = str_or("topk_method", if version == Version::V3 { "noaux_tc" } else { "greedy" })?;
    match (topk_method.as_str(), version) {
        ("greedy" | "group_limited_greedy", Version::V2) | ("noaux_tc", Version::V3) => {}
        (m, _) => return Err(ferr(format!("field `topk_method`: `{m}` is not supported for {version:?} (V2: greedy, group_limited_greedy; V3: noaux_tc)"))),
    }
    let norm_topk_prob = bool_or("norm_topk_prob", false)?;
    if norm_topk_prob && version == Version::V2 {
        // transformers' DeepseekV2 ignores it and scales; DeepSeek's code renormalizes and does
        // not scale: no released V2 sets it, and no one oracle defines it
        return Err(ferr("field `norm_topk_prob`: true is not supported for DeepseekV2 (HF transformers and DeepSeek's code disagree on it)".into()));
    }
    let c = DeepseekConfig {
        version,
        hidden: uint("hidden_size")?,
        layers: uint("num_hidden_layers")?,
        heads,
        vocab: uint("vocab_size")?,
        ffn: uint("intermediate_size")?,
        moe_ffn: uint_or("moe_intermediate_size", 0)?,
        q_lora_rank: match &v["q_lora_rank"] {
            Value::Null => None,
            x => Some(x.as_u64().ok_or_else(|| ferr(format!("field `q_lora_rank` must be an integer or null, got {x}")))? as usize),
        },
        kv_lora_rank: uint("kv_lora_rank")?,
        qk_nope_head_dim: uint("qk_nope_head_dim")?,
        qk_rope_head_dim: uint("qk_rope_head_dim")?,
        v_head_dim: uint("v_head_dim")?,
        rope_theta,
        rope_interleave: bool_or("rope_interleave", true)?,
        yarn,
        n_routed_experts,
        n_shared_experts: uint_or("n_shared_experts", 0)?,
        num_experts_per_tok: uint_or("num_experts_per_tok", 0)?,
        first_k_dense_replace: uint_or("first_k_dense_replace", 0)?,
        moe_layer_freq: uint_or("moe_layer_freq", 1)?,
        routed_scaling_factor: float_or("routed_scaling_factor", 1.0)?,
        norm_topk_prob,
        scoring,
        topk_method,
        n_group: uint_or("n_group", 1)?,
        topk_group: uint_or("topk_group", 1)?,
        norm_eps: float_or("rms_norm_eps", 1e-6)?,
        tie_embeddings: bool_or("tie_word_embeddings", false)?,
        attention_bias: bool_or("attention_bias", false)?,
        max_position: v["max_position_embeddings"].as_u64().map(|x| x as usize),
    };
    c.check().map_err(ferr)?;
    Ok(c)
}

impl DeepseekConfig {
    /// Every dimension positive and bounded, the MoE fields consistent: an error naming the field.
    pub fn check(&self) -> std::result::Result<(), String> {
        use crate::config::bounds::*;
        let mut dims = vec![
            ("hidden_size", self.hidden, HIDDEN),
            ("num_hidden_layers", self.layers, LAYERS),
            ("num_attention_heads", self.heads, HEADS),
            ("vocab_size", self.vocab, VOCAB),
            ("intermediate_size", self.ffn, FFN),
            ("kv_lora_rank", self.kv_lora_rank, HIDDEN),
            ("qk_nope_head_dim", self.qk_nope_head_dim, HEAD_DIM),
            ("qk_rope_head_dim", self.qk_rope_head_dim, HEAD_DIM),
            ("v_head_dim", self.v_head_dim, HEAD_DIM),
            ("moe_layer_freq", self.moe_layer_freq, LAYERS),
        ];
        if let Some(q) = self.q_lora_rank {
            dims.push(("q_lora_rank", q, HIDDEN));
        }
        if self.n_routed_experts > 0 {
            dims.extend([
                ("moe_intermediate_size", self.moe_ffn, FFN),
                ("num_experts_per_tok", self.num_experts_per_tok, self.n_routed_experts),
                ("n_group", self.n_group, self.n_routed_experts),
                ("topk_group", self.topk_group, self.n_group.max(1)),
            ]);
        }
        for (name, v, max) in dims {
            if v == 0 || v > max {
                return Err(format!("field `{name}` is {v}; it must be 1 to {max}"));
            }
        }
        if self.n_routed_experts > 1 << 16 || self.n_shared_experts > 1 << 10 {
            return Err(format!("fields `n_routed_experts` ({}) / `n_shared_experts` ({}) out of bounds", self.n_routed_experts, self.n_shared_experts));
        }
        if self.qk_rope_head_dim % 2 != 0 {
            return Err(format!("field `qk_rope_head_dim` ({}) must be even (RoPE rotates pairs)", self.qk_rope_head_dim));
        }
        if self.n_routed_experts > 0 {
            if self.n_routed_experts % self.n_group != 0 {
                return Err(format!("field `n_group`: {} experts do not split into {} groups", self.n_routed_experts, self.n_group));
            }
            let per = self.n_routed_experts / self.n_group;
            if self.num_experts_per_tok > self.topk_group * per {
                return Err(format!("field `num_experts_per_tok` ({}) exceeds the {} experts of `topk_group` = {} groups", self.num_experts_per_tok, self.topk_group * per, self.topk_group));
            }
            if self.topk_method == "noaux_tc" && per < 2 {
                return Err(format!("field `n_group`: noaux_tc ranks groups by their two best experts, but {} groups of {per}", self.n_group));
            }
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return Err(format!("field `rope_theta` is {}; it must be a positive number", self.rope_theta));
        }
        if !(self.norm_eps.is_finite() && self.norm_eps >= 0.0 && self.norm_eps < 1.0) {
            return Err(format!("field `rms_norm_eps` is {}; it must be in [0, 1)", self.norm_eps));
        }
        if !self.routed_scaling_factor.is_finite() || self.routed_scaling_factor <= 0.0 {
            return Err(format!("field `routed_scaling_factor` is {}; it must be a positive number", self.routed_scaling_factor));
        }
        Ok(())
    }
}

fn expert_name(layer: usize, e: usize, proj: &str) -> String {
    format!("model.layers.{layer}.mlp.experts.{e}.{proj}.weight")
}

/// The stacked name of a layer's routed-expert matrices (see the module docs).
pub fn stacked_name(layer: usize, proj: &str) -> String {
    format!("model.layers.{layer}.mlp.experts.{proj}.weight")
}

/// The per-head halves of a layer's `kv_b_proj` (`half`: `k` or `v`; see the module docs).
pub fn kv_b_half_name(layer: usize, half: &str) -> String {
    format!("model.layers.{layer}.self_attn.kv_b_proj.{half}_heads.weight")
}

/// The dtype the importer gives a tensor it derives from one of `dtype`: kv_b_proj's per-head
/// halves of an FP8 checkpoint are bf16 (the key half's rows are qk_nope_head_dim values, not
/// f8g128 super-blocks; [`split_kv_b`]); every other tensor keeps `dtype`. Seeded DeepSeek
/// weights follow it, so a seeded FP8 plan is the plan an FP8 checkpoint makes.
pub fn derived_dtype(name: &str, dtype: DType) -> DType {
    if dtype == DType::F8G128 && name.contains(".kv_b_proj.") {
        DType::BF16
    } else {
        dtype
    }
}

/// Turn an HF checkpoint's tensors into the ones the graph reads: FP8 block-scaled weights
/// into f8g128, experts stacked, kv_b_proj split per head (see the module docs).
pub fn prepare(ws: &mut WeightSet, c: &DeepseekConfig, path: &Path) -> Result<()> {
    import_fp8(ws, path)?;
    stack_experts(ws, c, path)?;
    split_kv_b(ws, c, path)
}

/// DeepSeek's FP8 checkpoints: each e4m3 `X.weight` `[N, K]` with its f32 `X.weight_scale_inv`
/// `[ceil(N / 128), ceil(K / 128)]` (value = e4m3 · scale of its 128x128 block) becomes one
/// tensor — dsc's [`DType::F8G128`] where K is whole 512-value super-blocks (every V3/R1
/// matrix: the bytes as shipped, each row's group scale its block's, exact), else bf16 (the
/// products e4m3 · scale rounded once, as DeepSeek's own `weight_dequant` gives them).
pub fn import_fp8(ws: &mut WeightSet, path: &Path) -> Result<()> {
    let scales: Vec<String> = ws.tensors.keys().filter(|n| n.ends_with(".weight_scale_inv")).cloned().collect();
    for sname in scales {
        let wname = sname.trim_end_matches("_scale_inv").to_string();
        let terr = |tensor: &str, msg: String| ModelError::Tensor { path: path.into(), tensor: tensor.to_string(), msg };
        let st = ws.tensors.remove(&sname).expect("listed");
        let w = ws.get(&wname).ok_or_else(|| terr(&sname, format!("a scale without its weight `{wname}`")))?.clone();
        let [n, k] = w.shape[..] else { return Err(terr(&wname, format!("shape {:?}: block-scaled FP8 weights are matrices", w.shape))) };
        if w.dtype != DType::F8E4M3 {
            return Err(terr(&wname, format!("dtype {} beside a weight_scale_inv: DeepSeek's FP8 weights are F8_E4M3", w.dtype)));
        }
        let (bn, bk) = (n.div_ceil(128), k.div_ceil(128));
        if st.shape != [bn, bk] || !matches!(st.dtype, DType::F32 | DType::BF16 | DType::F16) {
            return Err(terr(&sname, format!("{}{:?}, expected f32[{bn}, {bk}] (one scale per 128x128 block of {wname}'s [{n}, {k}])", st.dtype, st.shape)));
        }
        let sv = dsc_ir::quant::decode(st.dtype, st.bytes.as_slice(), bn * bk).ok_or_else(|| terr(&sname, "stored bytes do not match its shape".into()))?;
        let q = w.bytes.as_slice();
        if q.len() != n * k {
            return Err(terr(&wname, "stored bytes do not match its shape".into()));
        }
        let (dtype, bytes) = if DType::F8G128.bytes_for(k).is_some() {
            let groups = (0..n).flat_map(|r| (0..k / 128).map(move |g| (r, g))).map(|(r, g)| (sv[(r / 128) * bk + g], q[r * k + 128 * g..r * k + 128 * g + 128].try_into().expect("128 bytes")));
            (DType::F8G128, dsc_ir::quant::pack_f8g128(groups))
        } else {
            let vals: Vec<f32> = (0..n * k).map(|i| dsc_ir::quant::f8e4m3_to_f32(q[i]) * sv[(i / k / 128) * bk + (i % k) / 128]).collect();
            (DType::BF16, dsc_ir::quant::encode(DType::BF16, &vals).expect("whole"))
        };
        ws.insert(wname, WeightTensor { dtype, shape: vec![n, k], bytes: Bytes::Owned(Arc::new(bytes)) });
    }
    if let Some((name, _)) = ws.tensors.iter().find(|(_, t)| t.dtype == DType::F8E4M3) {
        return Err(ModelError::Tensor { path: path.into(), tensor: name.clone(), msg: "an F8_E4M3 weight without its weight_scale_inv".into() });
    }
    Ok(())
}

fn split_kv_b(ws: &mut WeightSet, c: &DeepseekConfig, path: &Path) -> Result<()> {
    let (h, nope, vd, l) = (c.heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank);
    for layer in 0..c.layers {
        let name = format!("model.layers.{layer}.self_attn.kv_b_proj.weight");
        if ws.get(&kv_b_half_name(layer, "k")).is_some() {
            continue;
        }
        let terr = |msg: String| ModelError::Tensor { path: path.into(), tensor: name.clone(), msg };
        let t = ws.tensors.remove(&name).ok_or_else(|| ModelError::MissingTensor { path: path.into(), tensor: name.clone(), arch: "deepseek".into() })?;
        let want = vec![h * (nope + vd), l];
        if t.shape != want {
            return Err(terr(format!("shape {:?}, expected {want:?} from the model's dims", t.shape)));
        }
        if !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::F8G128) {
            return Err(terr(format!("dtype {}: the per-head split needs an f32/f16/bf16 (or FP8) kv_b_proj (quantize after import with precision.weights)", t.dtype)));
        }
        let out_dt = derived_dtype(&kv_b_half_name(layer, "k"), t.dtype);
        let v = dsc_ir::quant::decode(t.dtype, t.bytes.as_slice(), h * (nope + vd) * l).ok_or_else(|| terr("stored bytes do not match its shape".into()))?;
        let row = |hi: usize, r: usize| &v[(hi * (nope + vd) + r) * l..(hi * (nope + vd) + r + 1) * l];
        // k: [H, L, nope], element (h, c, n) = W[h * (nope + v) + n, c]
        let mut k = Vec::with_capacity(h * l * nope);
        for hi in 0..h {
            for ci in 0..l {
                k.extend((0..nope).map(|n| row(hi, n)[ci]));
            }
        }
        // v: [H, v, L], rows h * (nope + v) + nope .. as they are
        let vv: Vec<f32> = (0..h).flat_map(|hi| (0..vd).flat_map(move |r| row(hi, nope + r).iter().copied())).collect();
        for (half, vals, shape) in [("k", k, vec![h, l, nope]), ("v", vv, vec![h, vd, l])] {
            let bytes = dsc_ir::quant::encode(out_dt, &vals).ok_or_else(|| terr(format!("re-encoding the {half} half")))?;
            ws.insert(kv_b_half_name(layer, half), WeightTensor { dtype: out_dt, shape, bytes: Bytes::Owned(Arc::new(bytes)) });
        }
    }
    Ok(())
}

/// Stack each MoE layer's per-expert matrices of an HF checkpoint into one `[E, out, in]`
/// tensor per projection, removing the per-expert entries. Every expert must be there with
/// one dtype and shape; an error names the first that is not.
pub fn stack_experts(ws: &mut WeightSet, c: &DeepseekConfig, path: &Path) -> Result<()> {
    for layer in (0..c.layers).filter(|&l| c.is_moe(l)) {
        for proj in ["gate_proj", "up_proj", "down_proj"] {
            let stacked = stacked_name(layer, proj);
            if ws.get(&stacked).is_some() {
                continue;
            }
            let first = expert_name(layer, 0, proj);
            let t0 = ws.get(&first).ok_or_else(|| ModelError::MissingTensor { path: path.into(), tensor: first.clone(), arch: "deepseek".into() })?.clone();
            let mut bytes = Vec::with_capacity(t0.bytes.len(t0.dtype, t0.shape.iter().product()) * c.n_routed_experts);
            for e in 0..c.n_routed_experts {
                let name = expert_name(layer, e, proj);
                let t = ws.tensors.remove(&name).ok_or_else(|| ModelError::MissingTensor { path: path.into(), tensor: name.clone(), arch: "deepseek".into() })?;
                if t.dtype != t0.dtype || t.shape != t0.shape {
                    return Err(ModelError::Tensor {
                        path: path.into(),
                        tensor: name,
                        msg: format!("{}{:?} but expert 0 is {}{:?}: experts must agree to be stacked", t.dtype, t.shape, t0.dtype, t0.shape),
                    });
                }
                bytes.extend_from_slice(t.bytes.as_slice());
            }
            let mut shape = vec![c.n_routed_experts];
            shape.extend_from_slice(&t0.shape);
            ws.insert(stacked, WeightTensor { dtype: t0.dtype, shape, bytes: Bytes::Owned(Arc::new(bytes)) });
        }
    }
    Ok(())
}

/// The step input that enables (1) or disables (0) each routed expert: f32 [MoE layers, E],
/// rows in layer order.
pub const EXPERT_MASK: &str = "expert_mask";

/// Every weight the graph reads, with its shape (the stacked experts included): what a
/// checkpoint must hold, and what seeded weights generate.
pub fn weight_shapes(c: &DeepseekConfig) -> Vec<(String, Vec<usize>)> {
    let (h, hid, qk, l, r, vd) = (c.heads, c.hidden, c.qk_head_dim(), c.kv_lora_rank, c.qk_rope_head_dim, c.v_head_dim);
    let mut v: Vec<(String, Vec<usize>)> = vec![("model.embed_tokens.weight".into(), vec![c.vocab, hid])];
    let mlp = |v: &mut Vec<(String, Vec<usize>)>, m: String, ffn: usize| {
        v.push((format!("{m}.gate_proj.weight"), vec![ffn, hid]));
        v.push((format!("{m}.up_proj.weight"), vec![ffn, hid]));
        v.push((format!("{m}.down_proj.weight"), vec![hid, ffn]));
    };
    for i in 0..c.layers {
        let a = |w: &str| format!("model.layers.{i}.self_attn.{w}");
        v.push((format!("model.layers.{i}.input_layernorm.weight"), vec![hid]));
        match c.q_lora_rank {
            None => v.push((a("q_proj.weight"), vec![h * qk, hid])),
            Some(q) => {
                v.push((a("q_a_proj.weight"), vec![q, hid]));
                v.push((a("q_a_layernorm.weight"), vec![q]));
                v.push((a("q_b_proj.weight"), vec![h * qk, q]));
            }
        }
        v.push((a("kv_a_proj_with_mqa.weight"), vec![l + r, hid]));
        v.push((a("kv_a_layernorm.weight"), vec![l]));
        v.push((kv_b_half_name(i, "k"), vec![h, l, c.qk_nope_head_dim]));
        v.push((kv_b_half_name(i, "v"), vec![h, vd, l]));
        v.push((a("o_proj.weight"), vec![hid, h * vd]));
        if c.attention_bias {
            for (w, n) in [("q_a_proj", c.q_lora_rank.unwrap_or(0)), ("kv_a_proj_with_mqa", l + r), ("o_proj", hid)] {
                if n > 0 {
                    v.push((a(&format!("{w}.bias")), vec![n]));
                }
            }
        }
        v.push((format!("model.layers.{i}.post_attention_layernorm.weight"), vec![hid]));
        if c.is_moe(i) {
            let e = c.n_routed_experts;
            v.push((format!("model.layers.{i}.mlp.gate.weight"), vec![e, hid]));
            if c.routing().select == MoeSelect::NoauxTc {
                v.push((format!("model.layers.{i}.mlp.gate.e_score_correction_bias"), vec![e]));
            }
            v.push((stacked_name(i, "gate_proj"), vec![e, c.moe_ffn, hid]));
            v.push((stacked_name(i, "up_proj"), vec![e, c.moe_ffn, hid]));
            v.push((stacked_name(i, "down_proj"), vec![e, hid, c.moe_ffn]));
            if c.n_shared_experts > 0 {
                mlp(&mut v, format!("model.layers.{i}.mlp.shared_experts"), c.moe_ffn * c.n_shared_experts);
            }
        } else {
            mlp(&mut v, format!("model.layers.{i}.mlp"), c.ffn);
        }
    }
    v.push(("model.norm.weight".into(), vec![hid]));
    if !c.tie_embeddings {
        v.push(("lm_head.weight".into(), vec![c.vocab, hid]));
    }
    v
}

pub struct BuildOptions {
    pub name: String,
    pub activations: DType,
    /// `precision.act_quant` and the weights whose matmuls take it
    /// (`ModelConfig::act_quant_weights`)
    pub act_quant: Option<(DType, usize)>,
    pub act_quant_weights: std::collections::BTreeSet<String>,
    pub kv_cache: DType,
    pub kv_block_size: usize,
    /// for error messages
    pub weights_path: PathBuf,
}

/// A SwiGLU MLP of the checkpoint's `module` (`gate_proj`, `up_proj`, `down_proj`).
fn mlp(b: &mut Builder, module: &str, x: NodeId, hid: usize, ffn: usize) -> Result<NodeId> {
    let gate = b.linear(&format!("{module}.gate_proj"), x, ffn, hid, false)?;
    let up = b.linear(&format!("{module}.up_proj"), x, ffn, hid, false)?;
    let gate = b.add(format!("{module}.gate_proj.silu"), Op::Unary(UnaryOp::Silu), &[gate])?;
    let act = b.add(format!("{module}.up_proj.swiglu"), Op::Binary(BinaryOp::Mul), &[gate, up])?;
    b.linear(&format!("{module}.down_proj"), act, hid, ffn, false)
}

pub fn build(opts: &BuildOptions, c: &DeepseekConfig, weights: &WeightSet) -> Result<Graph> {
    let mut b = Builder {
        g: Graph::new(opts.name.clone()),
        w: weights,
        path: &opts.weights_path,
        activations: opts.activations,
        arch: "deepseek",
        act_quant: opts.act_quant,
        act_quant_weights: &opts.act_quant_weights,
    };
    let inp = b.step_inputs()?;
    let (h, hid, nope, rope_d, vd, l) = (c.heads, c.hidden, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank);
    let qk = c.qk_head_dim();
    let embed = b.weight("model.embed_tokens.weight", &[c.vocab, hid], true)?;
    let mut x = b.typed("embed", Op::Gather, &[embed, inp.tokens], b.act(shape!["T", hid]))?;
    let cache_ty = TensorType::new(opts.kv_cache, shape!["NB", opts.kv_block_size, 1, c.latent_dim()]);
    let rope = c.rope_op();
    let scale = c.softmax_scale();
    // expert failover: one row per MoE layer, 0 disables an expert (the runtime feeds it)
    let moe_layers: Vec<usize> = (0..c.layers).filter(|&l| c.is_moe(l)).collect();
    let mask = if moe_layers.is_empty() { None } else { Some(b.typed(EXPERT_MASK, Op::Input, &[], TensorType::new(DType::F32, shape![moe_layers.len(), c.n_routed_experts]))?) };
    for i in 0..c.layers {
        let m = |w: &str| format!("model.layers.{i}.{w}");
        let a = |w: &str| format!("model.layers.{i}.self_attn.{w}");
        // --- MLA
        let norm_w = b.weight(&format!("{}.weight", m("input_layernorm")), &[hid], false)?;
        let hn = b.add(m("input_layernorm"), Op::RmsNorm { eps: c.norm_eps }, &[x, norm_w])?;
        let q = match c.q_lora_rank {
            None => b.linear(&a("q_proj"), hn, h * qk, hid, false)?,
            Some(r) => {
                let qa = b.linear(&a("q_a_proj"), hn, r, hid, c.attention_bias)?;
                let nw = b.weight(&format!("{}.weight", a("q_a_layernorm")), &[r], false)?;
                let qa = b.add(a("q_a_layernorm"), Op::RmsNorm { eps: LORA_NORM_EPS }, &[qa, nw])?;
                b.linear(&a("q_b_proj"), qa, h * qk, r, false)?
            }
        };
        let q = b.typed(a("q.heads"), Op::Reshape, &[q], b.act(shape!["T", h, qk]))?;
        let q_nope = b.add(a("q_nope"), Op::Slice { axis: 2, start: 0, len: nope }, &[q])?;
        let q_pe = b.add(a("q_rope"), Op::Slice { axis: 2, start: nope, len: rope_d }, &[q])?;
        let q_pe = b.add(a("q_rope.rope"), rope.clone(), &[q_pe, inp.positions])?;
        let kva = b.linear(&a("kv_a_proj_with_mqa"), hn, l + rope_d, hid, c.attention_bias)?;
        let ckv = b.add(a("kv_latent"), Op::Slice { axis: 1, start: 0, len: l }, &[kva])?;
        let k_pe = b.add(a("k_rope"), Op::Slice { axis: 1, start: l, len: rope_d }, &[kva])?;
        let nw = b.weight(&format!("{}.weight", a("kv_a_layernorm")), &[l], false)?;
        let ckv = b.add(a("kv_a_layernorm"), Op::RmsNorm { eps: LORA_NORM_EPS }, &[ckv, nw])?;
        let ckv = b.typed(a("kv_a_layernorm.row"), Op::Reshape, &[ckv], b.act(shape!["T", 1, l]))?;
        let k_pe = b.typed(a("k_rope.row"), Op::Reshape, &[k_pe], b.act(shape!["T", 1, rope_d]))?;
        let k_pe = b.add(a("k_rope.rope"), rope.clone(), &[k_pe, inp.positions])?;
        let latent = b.add(a("latent"), Op::Concat { axis: 2 }, &[ckv, k_pe])?;
        let cache_name = a("latent_cache");
        let cache = b.typed(cache_name.clone(), Op::State, &[], cache_ty.clone())?;
        let cache = b.add(format!("{cache_name}.write"), Op::CacheWrite, &[cache, latent, inp.slots])?;
        // kv_b_proj per head: its key half absorbs into the query, its value half into the output
        let w_uk = b.weight(&kv_b_half_name(i, "k"), &[h, l, nope], true)?;
        let w_uv = b.weight(&kv_b_half_name(i, "v"), &[h, vd, l], true)?;
        let q_lat = b.add(a("q_absorbed"), Op::HeadMatMul { transpose_b: true }, &[q_nope, w_uk])?;
        let q_full = b.add(a("q_latent"), Op::Concat { axis: 2 }, &[q_lat, q_pe])?;
        let o_lat = b.add(a("attention"), Op::MlaAttention { scale, kv_lora_rank: l }, &[q_full, cache, inp.positions, inp.seq_ids, inp.table])?;
        let o = b.add(a("v_absorbed"), Op::HeadMatMul { transpose_b: true }, &[o_lat, w_uv])?;
        let o = b.typed(a("flat"), Op::Reshape, &[o], b.act(shape!["T", h * vd]))?;
        let o = b.linear(&a("o_proj"), o, hid, h * vd, c.attention_bias)?;
        x = b.add(format!("{}.residual", a("o_proj")), Op::Binary(BinaryOp::Add), &[x, o])?;
        // --- MLP
        let norm_w = b.weight(&format!("{}.weight", m("post_attention_layernorm")), &[hid], false)?;
        let hn = b.add(m("post_attention_layernorm"), Op::RmsNorm { eps: c.norm_eps }, &[x, norm_w])?;
        let out = if c.is_moe(i) {
            let e = c.n_routed_experts;
            let logits = b.linear(&m("mlp.gate"), hn, e, hid, false)?;
            let row = moe_layers.iter().position(|&l| l == i).expect("a MoE layer");
            let mask = mask.expect("MoE layers have a mask");
            let lm = b.add(m("mlp.gate.mask"), Op::Slice { axis: 0, start: row, len: 1 }, &[mask])?;
            let lm = b.typed(m("mlp.gate.mask.row"), Op::Reshape, &[lm], TensorType::new(DType::F32, shape![e]))?;
            let mut args = vec![logits, lm];
            if c.routing().select == MoeSelect::NoauxTc {
                args.push(b.weight(&m("mlp.gate.e_score_correction_bias"), &[e], false)?);
            }
            let route = b.add(m("mlp.gate.route"), Op::MoeRoute(c.routing()), &args)?;
            let ws: Vec<NodeId> = [("gate_proj", [c.moe_ffn, hid]), ("up_proj", [c.moe_ffn, hid]), ("down_proj", [hid, c.moe_ffn])]
                .into_iter()
                .map(|(p, [o, i_])| b.weight(&stacked_name(i, p), &[e, o, i_], true))
                .collect::<Result<_>>()?;
            // the residual stream rides on the routed experts (x + their sum, in one write),
            // the shared experts' down projection adding its part (the matmul-add fusion): no
            // separate adds. (HF adds x + (routed + shared); the f32 sums differ in rounding.)
            if c.n_shared_experts > 0 {
                let routed = b.add(m("mlp.experts"), Op::MoeExperts, &[hn, route, ws[0], ws[1], ws[2], x])?;
                let shared = mlp(&mut b, &m("mlp.shared_experts"), hn, hid, c.moe_ffn * c.n_shared_experts)?;
                b.add(m("mlp.residual"), Op::Binary(BinaryOp::Add), &[routed, shared])?
            } else {
                b.add(m("mlp.residual"), Op::MoeExperts, &[hn, route, ws[0], ws[1], ws[2], x])?
            }
        } else {
            let out = mlp(&mut b, &m("mlp"), hn, hid, c.ffn)?;
            b.add(m("mlp.residual"), Op::Binary(BinaryOp::Add), &[x, out])?
        };
        x = out;
    }
    let last = b.add("logit_hidden", Op::Gather, &[x, inp.logit_rows])?;
    let fw = b.weight("model.norm.weight", &[hid], false)?;
    let last = b.add("model.norm", Op::RmsNorm { eps: c.norm_eps }, &[last, fw])?;
    let head = if c.tie_embeddings { embed } else { b.weight("lm_head.weight", &[c.vocab, hid], true)? };
    let logits = b.add("logits", Op::MatMul { transpose_b: true }, &[last, head])?;
    b.g.set_output("logits", logits);
    b.g.verify()?;
    Ok(b.g)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(dtype: DType, shape: Vec<usize>, bytes: Vec<u8>) -> WeightTensor {
        WeightTensor { dtype, shape, bytes: Bytes::Owned(Arc::new(bytes)) }
    }

    #[test]
    fn fp8_block_scaled_weights_import_exactly() {
        // [200, 512]: whole super-blocks -> f8g128, the bytes as shipped; [130, 256] -> bf16
        let mut ws = WeightSet::default();
        let codes = |n: usize| -> Vec<u8> { (0..n).map(|i| ((i * 37 + i / 512) % 255) as u8).map(|b| if b & 0x7F == 0x7F { 0x3C } else { b }).collect() };
        let (q1, q2) = (codes(200 * 512), codes(130 * 256));
        let s1: Vec<f32> = (0..2 * 4).map(|i| 0.001 * (i + 1) as f32).collect();
        let s2: Vec<f32> = (0..2 * 2).map(|i| 0.5 + i as f32).collect();
        ws.insert("a.weight", owned(DType::F8E4M3, vec![200, 512], q1.clone()));
        ws.insert("a.weight_scale_inv", owned(DType::F32, vec![2, 4], dsc_ir::quant::encode(DType::F32, &s1).unwrap()));
        ws.insert("b.weight", owned(DType::F8E4M3, vec![130, 256], q2.clone()));
        ws.insert("b.weight_scale_inv", owned(DType::F32, vec![2, 2], dsc_ir::quant::encode(DType::F32, &s2).unwrap()));
        import_fp8(&mut ws, Path::new("x")).unwrap();
        assert!(ws.get("a.weight_scale_inv").is_none() && ws.get("b.weight_scale_inv").is_none());
        let a = ws.get("a.weight").unwrap();
        assert_eq!((a.dtype, a.shape.clone()), (DType::F8G128, vec![200, 512]));
        let av = dsc_ir::quant::decode(a.dtype, a.bytes.as_slice(), 200 * 512).unwrap();
        for i in 0..200 * 512 {
            let (r, c) = (i / 512, i % 512);
            assert_eq!(av[i].to_bits(), (dsc_ir::quant::f8e4m3_to_f32(q1[i]) * s1[(r / 128) * 4 + c / 128]).to_bits(), "a[{r}, {c}]");
        }
        let b = ws.get("b.weight").unwrap();
        assert_eq!(b.dtype, DType::BF16);
        let bv = dsc_ir::quant::decode(b.dtype, b.bytes.as_slice(), 130 * 256).unwrap();
        for i in 0..130 * 256 {
            let want = half::bf16::from_f32(dsc_ir::quant::f8e4m3_to_f32(q2[i]) * s2[(i / 256 / 128) * 2 + (i % 256) / 128]).to_f32();
            assert_eq!(bv[i], want, "b element {i}");
        }
        // a weight without its scale, a scale of the wrong shape: errors naming the tensor
        let mut ws = WeightSet::default();
        ws.insert("c.weight", owned(DType::F8E4M3, vec![4, 512], vec![0; 2048]));
        assert!(import_fp8(&mut ws, Path::new("x")).unwrap_err().to_string().contains("c.weight"));
        ws.insert("c.weight_scale_inv", owned(DType::F32, vec![1, 1], vec![0; 4]));
        let e = import_fp8(&mut ws, Path::new("x")).unwrap_err().to_string();
        assert!(e.contains("c.weight_scale_inv") && e.contains("[1, 4]"), "{e}");
    }
}
