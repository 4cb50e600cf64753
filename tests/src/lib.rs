//! Shared helpers for the integration tests in `tests/tests/`.

use std::path::PathBuf;

/// The repository root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// The reference data folder: `$DSC_REFERENCE_DIR`, else `../shared/reference` beside the
/// repository (where the workplace and CI put it).
pub fn reference_dir() -> PathBuf {
    std::env::var_os("DSC_REFERENCE_DIR").map(PathBuf::from).unwrap_or_else(|| root().join("../shared/reference"))
}

/// The default model's model.toml; panics with the fix when the weights are not fetched.
pub fn default_model() -> PathBuf {
    let gguf = root().join(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(gguf.exists(), "{} is missing: run scripts/fetch-model.sh", gguf.display());
    root().join("models/smollm2-135m.toml")
}

use dsc_ir::DType;
use dsc_ir::{Executor, Tensor};
use dsc_models::gguf::{write_gguf, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// A tiny llama (2 layers, hidden 64, 4 heads / 2 KV heads of 16, ffn 96, vocab 80) with
/// seeded f32 weights under HF names: (name, shape, values).
pub fn tiny_llama_hf(seed: u64) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let (hid, h, kvh, hd, ffn, vocab) = (64, 4, 2, 16, 96, 80);
    let mut out = vec![];
    let mut add = |name: String, shape: Vec<usize>| {
        let n = shape.iter().product();
        let norm = shape.len() == 1;
        let mut v = dsc_models::weights::seeded_values(seed, &name, n, if norm { 0.2 } else { 1.0 / (*shape.last().unwrap() as f32).sqrt() }, false);
        if norm {
            v.iter_mut().for_each(|x| *x += 1.0);
        }
        out.push((name, shape, v));
    };
    add("model.embed_tokens.weight".into(), vec![vocab, hid]);
    for i in 0..2 {
        let p = format!("model.layers.{i}");
        add(format!("{p}.input_layernorm.weight"), vec![hid]);
        add(format!("{p}.self_attn.q_proj.weight"), vec![h * hd, hid]);
        add(format!("{p}.self_attn.k_proj.weight"), vec![kvh * hd, hid]);
        add(format!("{p}.self_attn.v_proj.weight"), vec![kvh * hd, hid]);
        add(format!("{p}.self_attn.o_proj.weight"), vec![hid, h * hd]);
        add(format!("{p}.post_attention_layernorm.weight"), vec![hid]);
        add(format!("{p}.mlp.gate_proj.weight"), vec![ffn, hid]);
        add(format!("{p}.mlp.up_proj.weight"), vec![ffn, hid]);
        add(format!("{p}.mlp.down_proj.weight"), vec![hid, ffn]);
    }
    add("model.norm.weight".into(), vec![hid]);
    add("lm_head.weight".into(), vec![vocab, hid]);
    out
}

pub const TINY_CONFIG_JSON: &str = r#"{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 80, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
 "tie_word_embeddings": false, "max_position_embeddings": 256}"#;

/// Write the tiny model as an HF folder (config.json + model.safetensors).
pub fn write_tiny_hf(dir: &Path, weights: &[(String, Vec<usize>, Vec<f32>)]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), TINY_CONFIG_JSON).unwrap();
    let bytes: Vec<Vec<u8>> = weights.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let views: Vec<(String, safetensors::tensor::TensorView)> =
        weights.iter().zip(&bytes).map(|((n, s, _), b)| (n.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
}

/// llama.cpp's Q/K row permutation (HF rotate_half layout → interleaved pairs).
pub fn permute_qk(v: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let d = rows / heads;
    let mut out = vec![0f32; v.len()];
    for h in 0..heads {
        for i in 0..d / 2 {
            for j in 0..2 {
                let dst = h * d + 2 * i + j;
                let src = h * d + j * (d / 2) + i;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&v[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

/// GGUF tensors (name, dtype, shape, bytes) for the tiny model, renamed and permuted as
/// llama.cpp's converter does; `dtype` for matrices.
pub fn tiny_gguf_tensors(weights: &[(String, Vec<usize>, Vec<f32>)], dtype: DType) -> Vec<(String, DType, Vec<usize>, Vec<u8>)> {
    weights
        .iter()
        .map(|(n, s, v)| {
            let name = n
                .replace("model.embed_tokens", "token_embd")
                .replace("model.norm", "output_norm")
                .replace("lm_head", "output")
                .replace("model.layers.", "blk.")
                .replace("input_layernorm", "attn_norm")
                .replace("post_attention_layernorm", "ffn_norm")
                .replace("self_attn.q_proj", "attn_q")
                .replace("self_attn.k_proj", "attn_k")
                .replace("self_attn.v_proj", "attn_v")
                .replace("self_attn.o_proj", "attn_output")
                .replace("mlp.gate_proj", "ffn_gate")
                .replace("mlp.up_proj", "ffn_up")
                .replace("mlp.down_proj", "ffn_down");
            let v = if n.contains("q_proj") {
                permute_qk(v, s[0], s[1], 4)
            } else if n.contains("k_proj") {
                permute_qk(v, s[0], s[1], 2)
            } else {
                v.clone()
            };
            let dt = if s.len() == 2 { dtype } else { DType::F32 };
            (name, dt, s.clone(), dsc_ir::quant::encode(dt, &v).unwrap())
        })
        .collect()
}

pub fn tiny_gguf_metadata() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::Str("llama".into())),
        ("llama.block_count", Value::U32(2)),
        ("llama.embedding_length", Value::U32(64)),
        ("llama.feed_forward_length", Value::U32(96)),
        ("llama.attention.head_count", Value::U32(4)),
        ("llama.attention.head_count_kv", Value::U32(2)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
        ("llama.vocab_size", Value::U32(80)),
    ]
}

/// Write a GGUF file from (name, dtype, shape, bytes) tensors.
pub fn write_tiny_gguf(path: &Path, meta: &[(&str, Value)], tensors: &[(String, DType, Vec<usize>, Vec<u8>)]) {
    let t: Vec<(&str, DType, Vec<usize>, Vec<u8>)> = tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect();
    write_gguf(path, meta, &t).unwrap();
}

pub fn model_toml(dir: &Path, format: &str, weights: &str) -> std::path::PathBuf {
    let p = dir.join("model.toml");
    std::fs::write(
        &p,
        format!("[model]\nname = \"tiny\"\narchitecture = \"llama\"\n\n[weights]\nformat = \"{format}\"\npath = \"{weights}\"\n\n[limits]\nmax_seq_len = 64\nkv_block_size = 4\nmax_batch = 4\n"),
    )
    .unwrap();
    p
}

/// A step's inputs for the CPU executor: one entry per token, the block table as (entries, sequences, blocks each).
pub fn inputs(tokens: &[i32], positions: &[i32], seq: &[i32], slots: &[i32], table: (&[i32], usize, usize), rows: &[i32]) -> BTreeMap<String, Tensor> {
    let t = |v: &[i32]| Tensor::from_i32(vec![v.len()], v);
    BTreeMap::from([
        ("tokens".into(), t(tokens)),
        ("positions".into(), t(positions)),
        ("seq_ids".into(), t(seq)),
        ("slots".into(), t(slots)),
        ("block_table".into(), Tensor::from_i32(vec![table.1, table.2], table.0)),
        ("logit_rows".into(), t(rows)),
    ])
}

/// Logits after every prompt token, prefilled in one step (blocks 0, 1 of the pool; the
/// prompt fits two blocks).
pub fn prefill_logits(m: &dsc_models::LoadedModel, prompt: &[i32]) -> Tensor {
    let mut ex = Executor::new(&m.graph, &m.weights, BTreeMap::from([("NB".into(), 8)])).unwrap();
    let n = prompt.len() as i32;
    let pos: Vec<i32> = (0..n).collect();
    let table: Vec<i32> = (0..2).collect();
    ex.run(&inputs(prompt, &pos, &vec![0; n as usize], &pos, (&table, 1, 2), &pos)).unwrap().remove("logits").unwrap()
}

pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    let num: f32 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum();
    let den: f32 = b.iter().map(|y| y * y).sum();
    (num / den).sqrt()
}
