//! DeepSeek-V2/V3 from GGUF files of llama.cpp's architecture `deepseek2`, as its
//! convert_hf_to_gguf.py writes them: the config from the `deepseek2.*` metadata, the tensors
//! renamed to the HF names [`crate::deepseek`] builds from (experts already stacked as
//! `ffn_{gate,up,down}_exps` [E, out, in]).
//!
//! MLA's kv_b_proj comes in two layouts: `attn_kv_b` as HF has it (files from before llama.cpp
//! split it; `attention.key_length` = qk_nope + rope), or `attn_k_b` (the key half per head,
//! transposed: [H, kv_lora_rank, qk_nope] — exactly dsc's `kv_b_proj.k_heads`) and `attn_v_b`
//! ([H, v_head_dim, kv_lora_rank] — `kv_b_proj.v_heads`), with the per-head dims in
//! `attention.key_length_mla` / `value_length_mla`. Quantized halves are decoded to f32 (exact;
//! a `[precision]` policy may narrow them again): MLA's per-head matmuls take float weights.
//!
//! What GGUF does not carry, and what dsc assumes (llama.cpp's deepseek2 assumes the same):
//! YaRN's `mscale` equals `mscale_all_dim` (= `rope.scaling.yarn_log_multiplier` / 0.1; every
//! released V2/V3 config has them equal), `beta_fast` 32 / `beta_slow` 1 unless the file gives
//! them, `moe_layer_freq` 1, interleaved rope pairs. The version: V3 (sigmoid gate, noaux_tc)
//! where the layers carry `exp_probs_b` or the gating function is sigmoid; else V2, with
//! group-limited selection where `expert_group_count` > 1.

use crate::deepseek::{self, DeepseekConfig, MoeScoringName, Version, YarnConfig};
use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::weights::{Bytes, WeightSet, WeightTensor};
use dsc_ir::DType;
use std::sync::Arc;

/// The config a `deepseek2` GGUF file's metadata gives; a missing key or an unsupported value
/// is an error naming the key.
pub fn config_from_gguf(g: &GgufFile) -> Result<DeepseekConfig> {
    let arch = g.str("general.architecture")?;
    if arch != "deepseek2" {
        return Err(ModelError::Format { path: g.path.clone(), msg: format!("GGUF architecture `{arch}` is not deepseek2 (model.toml says architecture \"deepseek\")") });
    }
    let ferr = |msg: String| ModelError::Format { path: g.path.clone(), msg };
    let k = |s: &str| format!("deepseek2.{s}");
    let u = |s: &str| g.u64(&k(s)).map(|v| v as usize);
    let u_or = |s: &str, d: usize| g.get(&k(s)).map_or(Ok(d), |v| v.as_u64().map(|v| v as usize).ok_or_else(|| ferr(format!("metadata key `{}` is not an unsigned integer", k(s)))));
    let f_or = |s: &str, d: f64| g.get(&k(s)).map_or(Ok(d as f32), |v| v.as_f64().map(|v| v as f32).ok_or_else(|| ferr(format!("metadata key `{}` is not a number", k(s)))));
    let heads = u("attention.head_count")?;
    let rope = u("rope.dimension_count")?;
    let kv_lora_rank = u("attention.kv_lora_rank")?;
    // (split files: key_length_mla = qk_nope + rope, value_length_mla = v_head_dim; before:
    // key_length and value_length themselves)
    let (qk, vd) = match (g.get(&k("attention.key_length_mla")), g.get(&k("attention.value_length_mla"))) {
        (Some(_), Some(_)) => (u("attention.key_length_mla")?, u("attention.value_length_mla")?),
        _ => (u("attention.key_length")?, u("attention.value_length")?),
    };
    if qk <= rope {
        return Err(ferr(format!("the per-head key length {qk} ({}) is not more than the rope dims {rope} ({})", k("attention.key_length[_mla]"), k("rope.dimension_count"))));
    }
    let experts = u_or("expert_count", 0)?;
    let sigmoid = match g.get(&k("expert_gating_func")).map(|v| v.as_u64()) {
        None => false,
        Some(Some(1)) => false,
        Some(Some(2)) => true,
        Some(other) => return Err(ferr(format!("metadata key `{}`: {other:?} is not softmax (1) or sigmoid (2)", k("expert_gating_func")))),
    };
    let bias = (0..u("block_count")?).any(|l| g.tensors.contains_key(&format!("blk.{l}.exp_probs_b.bias")));
    let version = if sigmoid || bias { Version::V3 } else { Version::V2 };
    let n_group = u_or("expert_group_count", 1)?;
    let topk_method = match version {
        Version::V3 => "noaux_tc",
        Version::V2 if n_group > 1 => "group_limited_greedy",
        Version::V2 => "greedy",
    };
    let yarn = match g.get(&k("rope.scaling.type")).map(|v| v.as_str()) {
        None | Some(Some("none")) => None,
        Some(Some("yarn")) => {
            let mscale = f_or("rope.scaling.yarn_log_multiplier", 0.0)? / 0.1;
            let y = YarnConfig {
                factor: f_or("rope.scaling.factor", f64::NAN)?,
                original_max_position_embeddings: u("rope.scaling.original_context_length")?,
                beta_fast: f_or("rope.scaling.yarn_beta_fast", 32.0)?,
                beta_slow: f_or("rope.scaling.yarn_beta_slow", 1.0)?,
                mscale,
                mscale_all_dim: mscale,
            };
            if !(y.factor.is_finite() && y.factor >= 1.0) {
                return Err(ferr(format!("metadata key `{}` is missing or below 1", k("rope.scaling.factor"))));
            }
            Some(y)
        }
        Some(other) => return Err(ferr(format!("metadata key `{}`: {other:?} is not supported for deepseek2 (yarn or none)", k("rope.scaling.type")))),
    };
    let vocab = match g.get(&k("vocab_size")) {
        Some(v) => v.as_u64().ok_or_else(|| ferr(format!("metadata key `{}` is not an unsigned integer", k("vocab_size"))))? as usize,
        None => {
            g.tensors.get("token_embd.weight").map(|t| t.shape[0]).ok_or_else(|| ModelError::MissingTensor { path: g.path.clone(), tensor: "token_embd.weight".into(), arch: "deepseek2".into() })?
        }
    };
    let c = DeepseekConfig {
        version,
        hidden: u("embedding_length")?,
        layers: u("block_count")?,
        heads,
        vocab,
        ffn: u("feed_forward_length")?,
        moe_ffn: u_or("expert_feed_forward_length", 0)?,
        q_lora_rank: u_or("attention.q_lora_rank", 0).map(|q| (q > 0).then_some(q))?,
        kv_lora_rank,
        qk_nope_head_dim: qk - rope,
        qk_rope_head_dim: rope,
        v_head_dim: vd,
        rope_theta: f_or("rope.freq_base", 10000.0)?,
        rope_interleave: true,
        yarn,
        n_routed_experts: experts,
        n_shared_experts: u_or("expert_shared_count", 0)?,
        num_experts_per_tok: u_or("expert_used_count", 0)?,
        first_k_dense_replace: u_or("leading_dense_block_count", 0)?,
        moe_layer_freq: 1,
        routed_scaling_factor: f_or("expert_weights_scale", 1.0)?,
        norm_topk_prob: g.get(&k("expert_weights_norm")).and_then(|v| v.as_bool()).unwrap_or(false),
        scoring: if version == Version::V3 { MoeScoringName::Sigmoid } else { MoeScoringName::Softmax },
        topk_method: topk_method.into(),
        n_group,
        topk_group: u_or("expert_group_used_count", 1)?,
        norm_eps: f_or("attention.layer_norm_rms_epsilon", 1e-6)?,
        tie_embeddings: !g.tensors.contains_key("output.weight"),
        attention_bias: false,
        max_position: u("context_length").ok(),
    };
    if c.norm_topk_prob && version == Version::V2 {
        return Err(ferr(format!("metadata key `{}`: true is not supported for DeepseekV2 (HF transformers and DeepSeek's code disagree on it)", k("expert_weights_norm"))));
    }
    c.check().map_err(|m| ferr(format!("{m} (from the deepseek2.* metadata)")))?;
    Ok(c)
}

/// The HF name of a `deepseek2` GGUF tensor (None: not one the model reads).
fn hf_name(name: &str) -> Option<String> {
    let whole = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(w) = whole {
        return Some(w.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, t) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let l = |s: &str| format!("model.layers.{layer}.{s}");
    Some(match t {
        "attn_norm.weight" => l("input_layernorm.weight"),
        "attn_q.weight" => l("self_attn.q_proj.weight"),
        "attn_q_a.weight" => l("self_attn.q_a_proj.weight"),
        "attn_q_a_norm.weight" => l("self_attn.q_a_layernorm.weight"),
        "attn_q_b.weight" => l("self_attn.q_b_proj.weight"),
        "attn_kv_a_mqa.weight" => l("self_attn.kv_a_proj_with_mqa.weight"),
        "attn_kv_a_norm.weight" => l("self_attn.kv_a_layernorm.weight"),
        "attn_kv_b.weight" => l("self_attn.kv_b_proj.weight"),
        "attn_k_b.weight" => deepseek::kv_b_half_name(layer, "k"),
        "attn_v_b.weight" => deepseek::kv_b_half_name(layer, "v"),
        "attn_output.weight" => l("self_attn.o_proj.weight"),
        "ffn_norm.weight" => l("post_attention_layernorm.weight"),
        "ffn_gate.weight" => l("mlp.gate_proj.weight"),
        "ffn_up.weight" => l("mlp.up_proj.weight"),
        "ffn_down.weight" => l("mlp.down_proj.weight"),
        "ffn_gate_inp.weight" => l("mlp.gate.weight"),
        "exp_probs_b.bias" => l("mlp.gate.e_score_correction_bias"),
        "ffn_gate_exps.weight" => deepseek::stacked_name(layer, "gate_proj"),
        "ffn_up_exps.weight" => deepseek::stacked_name(layer, "up_proj"),
        "ffn_down_exps.weight" => deepseek::stacked_name(layer, "down_proj"),
        "ffn_gate_shexp.weight" => l("mlp.shared_experts.gate_proj.weight"),
        "ffn_up_shexp.weight" => l("mlp.shared_experts.up_proj.weight"),
        "ffn_down_shexp.weight" => l("mlp.shared_experts.down_proj.weight"),
        _ => return None,
    })
}

/// The weights of a `deepseek2` GGUF file under the names [`deepseek::build`] reads (the
/// tensors stay in the mapped file, except quantized kv_b halves, decoded to f32); then
/// `attn_kv_b` split per head as for HF checkpoints. A tensor the model does not read is an
/// error naming it (a file of another layout would otherwise load wrong).
pub fn weights_from_gguf(g: &GgufFile, c: &DeepseekConfig) -> Result<WeightSet> {
    let mut ws = WeightSet::default();
    let file = Arc::new(g.path.clone());
    for info in g.tensors.values() {
        let terr = |msg: String| ModelError::Tensor { path: g.path.clone(), tensor: info.name.clone(), msg };
        let Some(name) = hf_name(&info.name) else {
            // (multi-token-prediction blocks past block_count: not read)
            if info.name.starts_with("blk.") && info.name[4..].split('.').next().and_then(|l| l.parse::<usize>().ok()).is_some_and(|l| l >= c.layers) {
                continue;
            }
            return Err(terr("not a deepseek2 tensor dsc reads".into()));
        };
        let mut t = WeightTensor { dtype: info.dtype, shape: info.shape.clone(), bytes: Bytes::Mapped { map: g.map.clone(), file: file.clone(), offset: info.offset, len: info.nbytes } };
        if name.contains(".kv_b_proj.") && !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) {
            let n: usize = t.shape.iter().product();
            let v = dsc_ir::quant::decode(t.dtype, g.bytes(info), n).ok_or_else(|| terr(format!("{} bytes do not decode as {} {:?}", info.nbytes, t.dtype, t.shape)))?;
            t = WeightTensor { dtype: DType::F32, shape: t.shape, bytes: Bytes::Owned(Arc::new(dsc_ir::quant::encode(DType::F32, &v).expect("f32"))) };
        }
        ws.insert(name, t);
    }
    // (what the HF path would name by its HF name, named as the file has it)
    let missing = |tensor: String| ModelError::MissingTensor { path: g.path.clone(), tensor, arch: "deepseek2".into() };
    for l in 0..c.layers {
        if ws.get(&deepseek::kv_b_half_name(l, "k")).is_none() && ws.get(&format!("model.layers.{l}.self_attn.kv_b_proj.weight")).is_none() {
            return Err(missing(format!("blk.{l}.attn_k_b.weight (or blk.{l}.attn_kv_b.weight)")));
        }
        for (t, proj) in [("ffn_gate_exps", "gate_proj"), ("ffn_up_exps", "up_proj"), ("ffn_down_exps", "down_proj")] {
            if c.is_moe(l) && ws.get(&deepseek::stacked_name(l, proj)).is_none() {
                return Err(missing(format!("blk.{l}.{t}.weight")));
            }
        }
    }
    deepseek::prepare(&mut ws, c, &g.path)?;
    Ok(ws)
}
