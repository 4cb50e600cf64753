//! The Llama family: Llama 2/3, SmolLM2, Mistral-style GQA, Qwen2 (q/k/v biases).
//!
//! Paper: Touvron et al., "LLaMA: Open and Efficient Foundation Language Models" (2023), and
//! "Llama 2" (2023); GQA: Ainslie et al. (2023). Reference implementation: HF transformers
//! `models/llama/modeling_llama.py`; llama.cpp `src/llama-model.cpp` (LLM_ARCH_LLAMA) for the
//! GGUF layout. Weight names mirror the checkpoint (GGUF `blk.N.attn_q.weight` or HF
//! `model.layers.N.self_attn.q_proj.weight`), and so do the graph's intermediate names.
//!
//! One step of the graph serves a whole continuous batch: `T` tokens from `S` sequences,
//! prefill and decode mixed. Inputs: `tokens[T]`, `positions[T]`, `seq_ids[T]` (row of
//! `block_table` for each token), `slots[T]` (KV-cache row each token writes),
//! `block_table[S, MB]`, `logit_rows[R]` (tokens whose logits are wanted). States: one K and
//! one V pool per layer, `[NB, BS, KVH, D]`.

use crate::builder::Builder;
use crate::config::Dims;
use crate::error::Result;
use crate::weights::WeightSet;
use dsc_ir::{shape, BinaryOp, DType, Graph, Op, RopeStyle, TensorType, UnaryOp};
use std::path::PathBuf;

/// How a checkpoint names its tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    Gguf,
    Hf,
}

impl Naming {
    pub fn embed(self) -> &'static str {
        match self {
            Naming::Gguf => "token_embd.weight",
            Naming::Hf => "model.embed_tokens.weight",
        }
    }
    pub fn final_norm(self) -> &'static str {
        match self {
            Naming::Gguf => "output_norm.weight",
            Naming::Hf => "model.norm.weight",
        }
    }
    pub fn lm_head(self) -> &'static str {
        match self {
            Naming::Gguf => "output.weight",
            Naming::Hf => "lm_head.weight",
        }
    }
    /// Module name (no `.weight`) of a per-layer tensor; `what` is the GGUF short name.
    pub fn layer(self, i: usize, what: &str) -> String {
        match self {
            Naming::Gguf => format!("blk.{i}.{what}"),
            Naming::Hf => {
                let m = match what {
                    "attn_norm" => "input_layernorm",
                    "ffn_norm" => "post_attention_layernorm",
                    "attn_q" => "self_attn.q_proj",
                    "attn_k" => "self_attn.k_proj",
                    "attn_v" => "self_attn.v_proj",
                    "attn_output" => "self_attn.o_proj",
                    "ffn_gate" => "mlp.gate_proj",
                    "ffn_up" => "mlp.up_proj",
                    "ffn_down" => "mlp.down_proj",
                    other => other,
                };
                format!("model.layers.{i}.{m}")
            }
        }
    }
    /// GGUF stores Q/K permuted for interleaved-pair RoPE; HF checkpoints use rotate_half.
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Naming::Gguf => RopeStyle::Interleaved,
            Naming::Hf => RopeStyle::Half,
        }
    }
}

pub struct BuildOptions {
    pub name: String,
    pub dims: Dims,
    pub naming: Naming,
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

pub fn build(opts: &BuildOptions, weights: &WeightSet) -> Result<Graph> {
    let d = &opts.dims;
    let n = opts.naming;
    let mut b = Builder {
        g: Graph::new(opts.name.clone()),
        w: weights,
        path: &opts.weights_path,
        activations: opts.activations,
        arch: "llama",
        act_quant: opts.act_quant,
        act_quant_weights: &opts.act_quant_weights,
    };
    let (h, kvh, hd, hid) = (d.heads, d.kv_heads, d.head_dim, d.hidden);
    let inp = b.step_inputs()?;
    let (tokens, positions, seq_ids, slots, table, logit_rows) = (inp.tokens, inp.positions, inp.seq_ids, inp.slots, inp.table, inp.logit_rows);

    let embed = b.weight(n.embed(), &[d.vocab, hid], true)?;
    let mut x = b.g.add("embed", Op::Gather, &[embed, tokens], Some(b.act(shape!["T", hid])))?;
    let cache_ty = TensorType::new(opts.kv_cache, shape!["NB", opts.kv_block_size, kvh, hd]);
    let rope = Op::Rope { theta: d.rope_theta, style: n.rope_style(), rotary_dim: hd };
    for i in 0..d.layers {
        let m = |w: &str| n.layer(i, w);
        let norm_w = b.weight(&format!("{}.weight", m("attn_norm")), &[hid], false)?;
        let hn = b.add(m("attn_norm"), Op::RmsNorm { eps: d.norm_eps }, &[x, norm_w])?;
        let q = b.linear(&m("attn_q"), hn, h * hd, hid, d.attention_bias)?;
        let k = b.linear(&m("attn_k"), hn, kvh * hd, hid, d.attention_bias)?;
        let v = b.linear(&m("attn_v"), hn, kvh * hd, hid, d.attention_bias)?;
        let q = b.g.add(format!("{}.heads", m("attn_q")), Op::Reshape, &[q], Some(b.act(shape!["T", h, hd])))?;
        let k = b.g.add(format!("{}.heads", m("attn_k")), Op::Reshape, &[k], Some(b.act(shape!["T", kvh, hd])))?;
        let v = b.g.add(format!("{}.heads", m("attn_v")), Op::Reshape, &[v], Some(b.act(shape!["T", kvh, hd])))?;
        let q = b.add(format!("{}.rope", m("attn_q")), rope.clone(), &[q, positions])?;
        let k = b.add(format!("{}.rope", m("attn_k")), rope.clone(), &[k, positions])?;
        let (kc_name, vc_name) = (format!("{}.k_cache", n.layer(i, "attn")), format!("{}.v_cache", n.layer(i, "attn")));
        let kc = b.g.add(kc_name.clone(), Op::State, &[], Some(cache_ty.clone()))?;
        let vc = b.g.add(vc_name.clone(), Op::State, &[], Some(cache_ty.clone()))?;
        // (a pool of another type than the activations, e.g. bf16: the write rounds the rows)
        let kc = b.add(format!("{kc_name}.write"), Op::CacheWrite, &[kc, k, slots])?;
        let vc = b.add(format!("{vc_name}.write"), Op::CacheWrite, &[vc, v, slots])?;
        let attn = b.add(format!("{}.attention", n.layer(i, "attn")), Op::PagedAttention { scale: 1.0 / (hd as f32).sqrt() }, &[q, kc, vc, positions, seq_ids, table])?;
        let attn = b.g.add(format!("{}.flat", n.layer(i, "attn")), Op::Reshape, &[attn], Some(b.act(shape!["T", h * hd])))?;
        let o = b.linear(&m("attn_output"), attn, hid, h * hd, false)?;
        x = b.add(format!("{}.residual", m("attn_output")), Op::Binary(BinaryOp::Add), &[x, o])?;
        let norm_w = b.weight(&format!("{}.weight", m("ffn_norm")), &[hid], false)?;
        let hn = b.add(m("ffn_norm"), Op::RmsNorm { eps: d.norm_eps }, &[x, norm_w])?;
        let gate = b.linear(&m("ffn_gate"), hn, d.ffn, hid, false)?;
        let up = b.linear(&m("ffn_up"), hn, d.ffn, hid, false)?;
        let gate = b.add(format!("{}.silu", m("ffn_gate")), Op::Unary(UnaryOp::Silu), &[gate])?;
        let act = b.add(format!("{}.swiglu", m("ffn_up")), Op::Binary(BinaryOp::Mul), &[gate, up])?;
        let down = b.linear(&m("ffn_down"), act, hid, d.ffn, false)?;
        x = b.add(format!("{}.residual", m("ffn_down")), Op::Binary(BinaryOp::Add), &[x, down])?;
    }
    let last = b.add("logit_hidden", Op::Gather, &[x, logit_rows])?;
    let fw = b.weight(n.final_norm(), &[hid], false)?;
    let last = b.add(n.final_norm().trim_end_matches(".weight"), Op::RmsNorm { eps: d.norm_eps }, &[last, fw])?;
    let head = if d.tie_embeddings { embed } else { b.weight(n.lm_head(), &[d.vocab, hid], true)? };
    let logits = b.add("logits", Op::MatMul { transpose_b: true }, &[last, head])?;
    b.g.set_output("logits", logits);
    b.g.verify()?;
    Ok(b.g)
}
