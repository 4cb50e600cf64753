//! The DeepSeek family on the CPU executor against HF transformers.
//!
//! The fixtures in tests/fixtures/deepseek/ are tiny DeepseekV2/V3ForCausalLM models with random
//! weights, saved by HF itself with its f32 logits and greedy continuations
//! (tests/fixtures/deepseek/make_fixtures.py, run with transformers 5.17):
//! - `v2-lite-tiny`: V2-Lite's choices (no q_lora, softmax gate, greedy top-k, 2 shared experts,
//!   YaRN with mscale 0.707);
//! - `v2-tiny`: V2's (q_lora, group-limited greedy over 4 groups keeping 2, routed scaling 16);
//! - `v3-tiny`: V3's (sigmoid gate, noaux_tc with the correction bias, renormalized, scaled 2.5,
//!   YaRN).
//!
//! Each goes the user's way: model.toml → compile (the optimizer included) → plan file → CPU
//! backend; the KV cache holds MLA's latent rows.

use dsc_runtime::engine::{CpuBackend, Session};
use dsc_runtime::generate::{generate, GenerateOptions};
use dsc_runtime::plan::Plan;
use dsc_runtime::sampler::SamplingParams;
use serde::Deserialize;
use std::path::{Path, PathBuf};

const FIXTURES: [&str; 3] = ["v2-lite-tiny", "v2-tiny", "v3-tiny"];

#[derive(Deserialize)]
struct Reference {
    prompt: Vec<u32>,
    greedy: Vec<u32>,
    logits: Vec<Vec<f32>>,
}

fn fixture(name: &str) -> PathBuf {
    dsc_tests::root().join("tests/fixtures/deepseek").join(name)
}

fn reference(name: &str) -> Reference {
    let p = fixture(name).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
}

fn model_toml(dir: &Path, weights: &Path, extra: &str) -> PathBuf {
    model_toml_of(dir, "safetensors", weights, extra)
}

/// dir/model.toml for the tiny fixtures' limits, weights of `format` at `weights`.
fn model_toml_of(dir: &Path, format: &str, weights: &Path, extra: &str) -> PathBuf {
    let p = dir.join("model.toml");
    let text = format!(
        "[model]\nname = \"ds-tiny\"\narchitecture = \"deepseek\"\n\n[weights]\nformat = \"{format}\"\npath = \"{}\"\n\n[limits]\nmax_seq_len = 64\nkv_block_size = 4\nmax_batch = 4\n{extra}",
        weights.display()
    );
    std::fs::write(&p, text).unwrap();
    p
}

/// Compile a fixture and open its plan (kept alive with the temp dir).
fn plan(name: &str) -> (tempfile::TempDir, Plan) {
    let dir = tempfile::tempdir().unwrap();
    let toml = model_toml(dir.path(), &fixture(name), "");
    let plan = compiled(&toml, name);
    (dir, plan)
}

/// Compile `toml` into a plan beside it and open it.
fn compiled(toml: &Path, what: &str) -> Plan {
    let c = dsc_compiler::compile(toml).unwrap_or_else(|e| panic!("{what}: compile: {e:#}"));
    let path = toml.with_file_name("ds.plan");
    dsc_compiler::write(&c, &path).unwrap();
    Plan::open(&path).unwrap()
}

/// max |a - b| over max |b|, per row, worst row.
fn worst_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    assert_eq!(a.len(), b.len(), "rows");
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            assert_eq!(x.len(), y.len(), "vocab");
            let scale = y.iter().fold(0f32, |m, v| m.max(v.abs()));
            x.iter().zip(y).fold(0f32, |m, (p, q)| m.max((p - q).abs())) / scale
        })
        .fold(0f32, f32::max)
}

#[test]
fn teacher_forced_logits_match_hf_f32() {
    for name in FIXTURES {
        let r = reference(name);
        let (_d, plan) = plan(name);
        let graph = plan.graph().unwrap();
        let mut backend = CpuBackend::new(&graph, &plan, 64).unwrap();
        // the whole prompt in one step
        let got = Session::new(&mut backend).feed(&r.prompt, true).unwrap();
        let rel = worst_rel(&got, &r.logits);
        assert!(rel < 1e-4, "{name}: one-step prefill logits differ from HF by {rel:e} (relative)");
        // chunked: 7 tokens, then the rest reading them back from the latent cache
        let mut s = Session::new(&mut backend);
        let mut got = s.feed(&r.prompt[..7], true).unwrap();
        got.extend(s.feed(&r.prompt[7..], true).unwrap());
        let rel2 = worst_rel(&got, &r.logits);
        assert!(rel2 < 1e-4, "{name}: chunked prefill logits differ from HF by {rel2:e}");
        eprintln!("{name}: logits vs HF f32, worst row max-abs / max|logit|: {rel:.2e} one step, {rel2:.2e} chunked");
    }
}

#[test]
fn greedy_continuations_match_hf() {
    for name in FIXTURES {
        let r = reference(name);
        let (_d, plan) = plan(name);
        let graph = plan.graph().unwrap();
        let mut backend = CpuBackend::new(&graph, &plan, 64).unwrap();
        let opts = GenerateOptions { max_tokens: r.greedy.len(), sampling: SamplingParams::default(), stop_ids: vec![] };
        let g = generate(&mut backend, &r.prompt, &opts, |_| {}).unwrap();
        assert_eq!(g.ids, r.greedy, "{name}: greedy continuation (decoding one token at a time over the latent cache)");
    }
}

/// The fixtures as llama.cpp's converter writes them (tests/fixtures/deepseek/make_gguf.py:
/// gguf-py's writer, keys and tensor names; v2-lite-tiny with the earlier `attn_kv_b`, the
/// others with `attn_k_b` / `attn_v_b`): the same config as config.json gives, and the same
/// logits as the safetensors plan and HF.
#[test]
fn deepseek2_gguf_files_load_as_llama_cpp_writes_them() {
    for name in FIXTURES {
        let r = reference(name);
        let gguf = fixture(name).join("model.gguf");
        let g = dsc_models::gguf::GgufFile::open(&gguf).unwrap();
        let from_gguf = dsc_models::deepseek_gguf::config_from_gguf(&g).unwrap();
        let cfg = fixture(name).join("config.json");
        let mut from_json = dsc_models::deepseek::config_from_json(&cfg, &std::fs::read_to_string(&cfg).unwrap()).unwrap();
        // (GGUF carries mscale_all_dim as 0.1 x it, and assumes mscale equal to it; the HF
        // config's max_position_embeddings is context_length)
        if let (Some(a), Some(b)) = (from_gguf.yarn.as_ref(), from_json.yarn.as_mut()) {
            assert!((a.mscale_all_dim - b.mscale_all_dim).abs() < 1e-6, "{name}: mscale_all_dim {a:?} vs {b:?}");
            b.mscale_all_dim = a.mscale_all_dim;
            b.mscale = a.mscale;
        }
        assert_eq!(from_gguf, from_json, "{name}: the config from the GGUF metadata");
        let dir = tempfile::tempdir().unwrap();
        let gplan = compiled(&model_toml_of(dir.path(), "gguf", &gguf, ""), &format!("{name} GGUF"));
        let ggraph = gplan.graph().unwrap();
        let mut gb = CpuBackend::new(&ggraph, &gplan, 64).unwrap();
        let got = Session::new(&mut gb).feed(&r.prompt, true).unwrap();
        let (_d, plan) = plan(name);
        let graph = plan.graph().unwrap();
        let mut sb = CpuBackend::new(&graph, &plan, 64).unwrap();
        let st = Session::new(&mut sb).feed(&r.prompt, true).unwrap();
        let vs_st = worst_rel(&got, &st);
        let vs_hf = worst_rel(&got, &r.logits);
        assert!(vs_st < 1e-6, "{name}: the GGUF plan's logits differ from the safetensors plan's by {vs_st:e}");
        assert!(vs_hf < 1e-4, "{name}: the GGUF plan's logits differ from HF's by {vs_hf:e}");
        eprintln!("{name}: GGUF plan vs safetensors plan {vs_st:.1e}, vs HF f32 {vs_hf:.1e}");
    }
}

/// A deepseek2 GGUF file with a tensor dsc does not read, or of another architecture, is an
/// error naming the tensor or the key.
#[test]
fn a_deepseek2_gguf_that_is_not_one_names_the_tensor_or_key() {
    use dsc_models::gguf::{write_gguf, GgufFile, Value};
    let g = GgufFile::open(&fixture("v3-tiny").join("model.gguf")).unwrap();
    let meta: Vec<(String, Value)> = g.metadata.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let tensors: Vec<(String, dsc_ir::DType, Vec<usize>, Vec<u8>)> = g.tensors.values().map(|t| (t.name.clone(), t.dtype, t.shape.clone(), g.bytes(t).to_vec())).collect();
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, meta: &[(String, Value)], tensors: &[(String, dsc_ir::DType, Vec<usize>, Vec<u8>)]| -> PathBuf {
        let p = dir.path().join(name);
        let m: Vec<(&str, Value)> = meta.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let t: Vec<(&str, dsc_ir::DType, Vec<usize>, Vec<u8>)> = tensors.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.clone(), b.clone())).collect();
        write_gguf(&p, &m, &t).unwrap();
        model_toml_of(dir.path(), "gguf", &p, "")
    };
    let err = |toml: &Path| dsc_models::load(toml).err().map(|e| e.to_string()).expect("an error");
    let mut extra = tensors.clone();
    extra.push(("blk.1.attn_sinks.weight".into(), dsc_ir::DType::F32, vec![4], vec![0; 16]));
    let e = err(&write("extra.gguf", &meta, &extra));
    assert!(e.contains("blk.1.attn_sinks.weight") && e.contains("extra.gguf"), "{e}");
    let mut m = meta.clone();
    m.retain(|(k, _)| k != "deepseek2.attention.kv_lora_rank");
    let e = err(&write("nokv.gguf", &m, &tensors));
    assert!(e.contains("deepseek2.attention.kv_lora_rank"), "{e}");
    let mut m = meta.clone();
    for (k, v) in m.iter_mut() {
        if k == "deepseek2.expert_gating_func" {
            *v = Value::U32(7);
        }
    }
    let e = err(&write("gating.gguf", &m, &tensors));
    assert!(e.contains("deepseek2.expert_gating_func"), "{e}");
    let mut missing = tensors.clone();
    missing.retain(|(n, ..)| n != "blk.2.ffn_down_exps.weight");
    let e = err(&write("missing.gguf", &meta, &missing));
    assert!(e.contains("blk.2.ffn_down_exps.weight") && e.contains("missing.gguf"), "{e}");
}

#[test]
fn the_plan_records_the_latent_cache_and_the_moe_config() {
    let (_d, plan) = plan("v3-tiny");
    let graph = plan.graph().unwrap();
    // one latent pool per layer, kv_lora_rank + qk_rope_head_dim = 32 + 8 per token
    let pools: Vec<_> = dsc_runtime::engine::kv_pools(&graph).map(|(n, row)| (n.name.clone(), row)).collect();
    assert_eq!(pools.len(), 3, "{pools:?}");
    assert!(pools.iter().all(|(n, row)| n.ends_with("self_attn.latent_cache") && *row == 40), "{pools:?}");
    assert_eq!(plan.header.model.architecture, "deepseek");
    let ds = &plan.header.model.dims["deepseek"];
    assert_eq!(ds["topk_method"], "noaux_tc");
    assert_eq!(ds["kv_lora_rank"], 32);
    let text = dsc_ir::text::print(&graph);
    for op in ["mla_attention", "moe_route", "moe_experts", "head_matmul", "rope_yarn"] {
        assert!(text.contains(op), "the graph text names {op}");
    }
    // the text form round-trips with the new ops' attributes
    let back = dsc_ir::text::parse(&text).unwrap();
    assert_eq!(dsc_ir::text::print(&back), text);
}

/// A fixture's config.json with `edit` applied, in a temp dir beside a link to its weights.
fn edited(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let w = dir.path().join("w");
    std::fs::create_dir(&w).unwrap();
    std::fs::copy(fixture(name).join("model.safetensors"), w.join("model.safetensors")).unwrap();
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap()).unwrap();
    edit(&mut cfg);
    std::fs::write(w.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let toml = model_toml(dir.path(), &w, "");
    (dir, toml)
}

fn load_err(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> String {
    let (_d, toml) = edited(name, edit);
    match dsc_models::load(&toml) {
        Ok(_) => panic!("{name}: the edited config loaded"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn unsupported_config_values_name_the_field() {
    let cases: Vec<(&str, Box<dyn FnOnce(&mut serde_json::Value)>, &str)> = vec![
        ("v2-tiny", Box::new(|c| c["scoring_func"] = "sigmoid".into()), "field `scoring_func`"),
        ("v3-tiny", Box::new(|c| c["topk_method"] = "greedy".into()), "field `topk_method`"),
        ("v2-tiny", Box::new(|c| c["topk_method"] = "noaux_tc".into()), "field `topk_method`"),
        ("v2-tiny", Box::new(|c| c["norm_topk_prob"] = true.into()), "field `norm_topk_prob`"),
        ("v2-tiny", Box::new(|c| c["hidden_act"] = "gelu".into()), "field `hidden_act`"),
        ("v2-tiny", Box::new(|c| c["n_group"] = 3.into()), "field `n_group`"),
        ("v2-tiny", Box::new(|c| c["num_experts_per_tok"] = 5.into()), "field `num_experts_per_tok`"),
        ("v3-tiny", Box::new(|c| c["rope_parameters"]["rope_type"] = "longrope".into()), "field `rope_parameters`"),
        ("v3-tiny", Box::new(|c| c["rope_scaling"] = serde_json::json!({"type": "linear", "factor": 2.0})), "field `rope_scaling`"),
        ("v3-tiny", Box::new(|c| c["quantization_config"] = serde_json::json!({"quant_method": "fp8", "weight_block_size": [1, 128]})), "field `quantization_config`"),
        ("v3-tiny", Box::new(|c| c["architectures"] = serde_json::json!(["MixtralForCausalLM"])), "field `architectures`"),
        ("v3-tiny", Box::new(|c| c["kv_lora_rank"] = 0.into()), "field `kv_lora_rank`"),
        ("v3-tiny", Box::new(|c| c["qk_rope_head_dim"] = serde_json::Value::Null), "field `qk_rope_head_dim`"),
    ];
    for (name, edit, want) in cases {
        let e = load_err(name, edit);
        assert!(e.contains(want) && e.contains("config.json"), "{name}: expected an error naming {want} and the file, got: {e}");
    }
}

#[test]
fn a_missing_or_mismatched_expert_names_the_tensor() {
    // a config with more experts than the checkpoint holds
    let e = load_err("v3-tiny", |c| {
        c["n_routed_experts"] = 16.into();
    });
    assert!(e.contains("model.layers.1.mlp.experts.8.gate_proj.weight"), "{e}");
    // a wider expert MLP than the weights: the stacked tensor's shape is checked against the dims
    let e = load_err("v2-tiny", |c| c["moe_intermediate_size"] = 48.into());
    assert!(e.contains("model.layers.1.mlp.experts.gate_proj.weight") && e.contains("expected"), "{e}");
}

/// Greedy ids of `prompt` on a fresh session, and the backend's routing counts after.
fn greedy(backend: &mut CpuBackend, prompt: &[u32], n: usize) -> Vec<u32> {
    let opts = GenerateOptions { max_tokens: n, sampling: SamplingParams::default(), stop_ids: vec![] };
    generate(backend, prompt, &opts, |_| {}).unwrap().ids
}

#[test]
fn failover_masks_an_expert_and_the_router_renormalizes_over_the_rest() {
    use dsc_runtime::engine::Backend;
    for name in ["v2-lite-tiny", "v3-tiny"] {
        let r = reference(name);
        let (_d, plan) = plan(name);
        let graph = plan.graph().unwrap();
        let mut be = CpuBackend::new(&graph, &plan, 64).unwrap();
        assert_eq!(be.moe_layout(), Some((vec![1, 2], 8)));
        let base = Session::new(&mut be).feed(&r.prompt, true).unwrap();
        let s0 = be.moe_stats().unwrap();
        // every token picks top_k = 3 experts in each MoE layer
        assert_eq!(s0.tokens[..8].iter().sum::<u64>(), 3 * r.prompt.len() as u64, "{name}: {:?}", s0.tokens);
        // disable layer 1's busiest expert
        let x = (0..8).max_by_key(|&e| s0.tokens[e]).unwrap();
        be.set_expert(1, x, false).unwrap();
        let masked = Session::new(&mut be).feed(&r.prompt, true).unwrap();
        let s1 = be.moe_stats().unwrap();
        assert_eq!(s1.disabled, vec![(1, x)]);
        assert_eq!(s1.tokens[x], s0.tokens[x], "{name}: no token routes to the disabled expert");
        // still 3 experts per token in layer 1: the selections moved to the next best
        assert_eq!(s1.tokens[..8].iter().sum::<u64>() - s0.tokens[..8].iter().sum::<u64>(), 3 * r.prompt.len() as u64);
        // layer 1's router sees the same inputs, so exactly its selections of x were redirected
        assert_eq!(s1.masked_selections, s0.tokens[x], "{name}");
        assert!(worst_rel(&masked, &base) > 1e-3, "{name}: disabling expert {x} must change the logits");
        // the executor fed the same mask directly agrees with the backend
        let mut ex = dsc_ir::Executor::new(&graph, &plan, std::collections::BTreeMap::from([("NB".to_string(), 16)])).unwrap();
        let t = r.prompt.len();
        let ints = |v: Vec<i32>| dsc_ir::Tensor::from_i32(vec![v.len()], &v);
        let mut mask = vec![1.0; 16];
        mask[x] = 0.0;
        let inputs = std::collections::BTreeMap::from([
            ("tokens".to_string(), ints(r.prompt.iter().map(|&i| i as i32).collect())),
            ("positions".to_string(), ints((0..t as i32).collect())),
            ("seq_ids".to_string(), ints(vec![0; t])),
            ("slots".to_string(), ints((0..t as i32).collect())),
            ("block_table".to_string(), dsc_ir::Tensor::from_i32(vec![1, 16], &(0..16).collect::<Vec<i32>>())),
            ("logit_rows".to_string(), ints((0..t as i32).collect())),
            ("expert_mask".to_string(), dsc_ir::Tensor::new(vec![2, 8], mask)),
        ]);
        let out = ex.run(&inputs).unwrap();
        let direct: Vec<Vec<f32>> = out["logits"].data.chunks(512).map(|c| c.to_vec()).collect();
        assert!(worst_rel(&masked, &direct) < 1e-6, "{name}: backend vs executor with the same mask");
        // generation goes on, and re-enabling restores the exact unmasked results
        assert_eq!(greedy(&mut be, &r.prompt, 4).len(), 4);
        be.set_expert(1, x, true).unwrap();
        assert!(be.moe_stats().unwrap().disabled.is_empty());
        let again = Session::new(&mut be).feed(&r.prompt, true).unwrap();
        assert_eq!(again, base, "{name}: re-enabled");
        assert_eq!(greedy(&mut be, &r.prompt, r.greedy.len()), r.greedy);
        // an expert no token chose: with a sigmoid gate (V3) nothing changes; a softmax gate (V2)
        // renormalizes its probability over the rest, so the weights change, the choices do not
        if let Some(idle) = (0..8).find(|&e| s0.tokens[e] == 0) {
            be.set_expert(1, idle, false).unwrap();
            let before = be.moe_stats().unwrap();
            let got = Session::new(&mut be).feed(&r.prompt, true).unwrap();
            let after = be.moe_stats().unwrap();
            assert_eq!(after.masked_selections, before.masked_selections, "{name}");
            let d = worst_rel(&got, &base);
            if name == "v3-tiny" {
                assert_eq!(got, base, "{name}: disabling idle expert {idle}");
            } else {
                assert!(d > 0.0 && d < 0.5, "{name}: {d}");
            }
            be.set_expert(1, idle, true).unwrap();
        }
        // bad requests name what is wrong and change nothing
        let e = be.set_expert(0, 1, false).unwrap_err().to_string();
        assert!(e.contains("layer 0 has no routed experts"), "{e}");
        let e = be.set_expert(2, 8, false).unwrap_err().to_string();
        assert!(e.contains("expert 8") && e.contains("8 experts"), "{e}");
        assert!(be.moe_stats().unwrap().disabled.is_empty());
    }
}

#[test]
fn weight_shapes_list_exactly_what_an_hf_checkpoint_holds() {
    for name in FIXTURES {
        let dir = tempfile::tempdir().unwrap();
        let m = dsc_models::load(&model_toml(dir.path(), &fixture(name), "")).unwrap();
        let ds = m.deepseek.as_ref().unwrap();
        let want: std::collections::BTreeMap<String, Vec<usize>> = dsc_models::deepseek::weight_shapes(ds).into_iter().collect();
        let got: std::collections::BTreeMap<String, Vec<usize>> = m.weights.tensors.iter().map(|(n, t)| (n.clone(), t.shape.clone())).collect();
        assert_eq!(got, want, "{name}: the checkpoint (experts stacked) vs weight_shapes");
    }
}

#[test]
fn seeded_deepseek_shapes_load_with_the_real_models_dims() {
    let root = dsc_tests::root();
    // DeepSeek-V2-Lite: 15.7B parameters (DeepSeek's model card), 576 latent values per token
    let m = dsc_models::load(&root.join("models/deepseek-v2-lite-seeded.toml")).unwrap();
    let params: usize = m.weights.tensors.values().map(|t| t.shape.iter().product::<usize>()).sum();
    assert!((params as f64 / 1e9 - 15.706).abs() < 0.001, "V2-Lite: {params} parameters");
    let ds = m.deepseek.as_ref().unwrap();
    assert_eq!((ds.latent_dim(), ds.layers, ds.n_routed_experts, ds.num_experts_per_tok), (576, 27, 64, 6));
    // softmax scale: 192^-0.5 * (0.1 * 0.707 * ln 40 + 1)^2
    let want = 192f32.powf(-0.5) * (0.1 * 0.707 * 40f32.ln() + 1.0).powi(2);
    assert!((ds.softmax_scale() - want).abs() < 1e-7);
    let pools: Vec<usize> = dsc_runtime::engine::kv_pools(&m.graph).map(|(_, row)| row).collect();
    assert_eq!(pools, vec![576; 27]);
    let m = dsc_models::load(&root.join("models/deepseek-v3-4layer-seeded.toml")).unwrap();
    let ds = m.deepseek.as_ref().unwrap();
    assert_eq!((ds.is_moe(2), ds.is_moe(3), ds.routing().select), (false, true, dsc_ir::MoeSelect::NoauxTc));
    let bias = &m.weights.tensors["model.layers.3.mlp.gate.e_score_correction_bias"];
    assert_eq!(bias.shape, vec![256]);
    assert_eq!(m.weights.tensors["model.layers.3.mlp.experts.down_proj.weight"].shape, vec![256, 7168, 2048]);
}

#[test]
fn exported_weights_are_the_hf_checkpoint_and_load_back_as_the_seeded_plan() {
    use safetensors::SafeTensors;
    // an HF checkpoint through import and a plan comes back out byte for byte
    for name in FIXTURES {
        let (_d, plan) = plan(name);
        let got = dsc_runtime::export::hf_tensors(&plan).unwrap();
        let bytes = std::fs::read(fixture(name).join("model.safetensors")).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let mut names = st.names();
        names.sort();
        assert_eq!(got.keys().collect::<Vec<_>>(), names, "{name}");
        for n in names {
            let t = st.tensor(n).unwrap();
            let (_, shape, data) = &got[n];
            assert_eq!((shape.as_slice(), data.as_slice()), (t.shape(), t.data()), "{name}: {n}");
        }
    }
    // a seeded plan exported, then imported as an HF checkpoint: the same logits
    let dir = tempfile::tempdir().unwrap();
    let cfg = fixture("v3-tiny").join("config.json");
    let toml = dir.path().join("seeded.toml");
    std::fs::write(&toml, format!("[model]\nname = \"s\"\narchitecture = \"deepseek\"\n\n[weights]\nformat = \"seeded\"\nseed = 5\ndtype = \"f32\"\nconfig = \"{}\"\n\n[limits]\nmax_seq_len = 64\nkv_block_size = 4\nmax_batch = 4\n", cfg.display())).unwrap();
    let run = |toml: &Path, out: &Path| {
        let c = dsc_compiler::compile(toml).unwrap();
        dsc_compiler::write(&c, out).unwrap();
        let plan = Plan::open(out).unwrap();
        let graph = plan.graph().unwrap();
        let mut be = CpuBackend::new(&graph, &plan, 64).unwrap();
        let logits = Session::new(&mut be).feed(&[3, 14, 15, 92, 65, 35], true).unwrap();
        (plan, logits)
    };
    let (seeded, want) = run(&toml, &dir.path().join("seeded.plan"));
    let hf = dir.path().join("hf");
    dsc_runtime::export::export_hf(&seeded, &hf).unwrap();
    std::fs::copy(&cfg, hf.join("config.json")).unwrap();
    let (_, got) = run(&model_toml(dir.path(), &hf, ""), &dir.path().join("hf.plan"));
    assert_eq!(got, want, "the exported seeded weights, imported back");
    assert!(want.iter().flatten().all(|v| v.is_finite()));
}

/// Every DeepSeek fixture lowers to the GPU (its kernels checked against the CPU executor on
/// the H200 by `scripts/gpu-deepseek.sh`): the router a kernel of its own, the routed experts
/// two steps through a per-token scratch of top_k x I values, the absorbed MLA's per-head
/// matmuls and latent attention, YaRN's rope; the KV pools hold the latent rows.
#[test]
fn deepseek_plans_lower_to_the_gpu() {
    for name in FIXTURES {
        let dir = tempfile::tempdir().unwrap();
        let c = dsc_compiler::compile(&model_toml(dir.path(), &fixture(name), "")).unwrap();
        let gpu = c.gpu.as_ref().unwrap_or_else(|| panic!("{name}: no GPU program: {:?}", c.gpu_skipped));
        let kernels: Vec<&str> = gpu.steps.iter().filter_map(|s| s.kernel.as_deref()).collect();
        let count = |p: &str| kernels.iter().filter(|k| k.starts_with(p)).count();
        let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap()).unwrap();
        let layers = cfg["num_hidden_layers"].as_u64().unwrap() as usize;
        let moe_layers = layers - cfg["first_k_dense_replace"].as_u64().unwrap() as usize;
        let top_k = cfg["num_experts_per_tok"].as_u64().unwrap() as usize;
        let inter = cfg["moe_intermediate_size"].as_u64().unwrap() as usize;
        assert_eq!(count("moe_route_"), moe_layers, "{name}: {kernels:?}");
        assert_eq!(count("moe_gate_up_"), moe_layers, "{name}");
        assert_eq!(count("moe_down_"), moe_layers, "{name}");
        assert_eq!(count("mla_attention_"), layers, "{name}");
        // (the output's; the tiny V2/V3's q_b_proj of K = q_lora_rank 24 too)
        assert!(count("head_matmul_") >= layers, "{name}");
        // (the schedule's `mla-fusions`: the latent row — kv_a's slices, norm, k's rope, concat,
        // cache write — and the absorbed query — q's slices, W_uk, q's rope, concat — one
        // launch each; no separate rope, concat or cache write is left)
        assert_eq!(count("mla_latent_cache_"), layers, "{name}: the latent row in one launch: {kernels:?}");
        assert_eq!(count("mla_query_"), layers, "{name}: the absorbed query in one launch");
        assert_eq!(count("rope_") + count("cache_write_") + count("concat_") + count("slice_i1_"), 0, "{name}: {kernels:?}");
        let yarn = cfg["rope_parameters"]["rope_type"] == "yarn";
        let yarns = kernels.iter().filter(|k| (k.starts_with("mla_query_") || k.starts_with("mla_latent_cache_")) && k.contains("_yarn")).count();
        assert_eq!(yarns, if yarn { 2 * layers } else { 0 }, "{name}: YaRN's where the config has it");
        let scratch = format!("@rows{}", top_k * inter);
        let ups: Vec<_> = gpu.steps.iter().filter(|s| s.kernel.as_deref().is_some_and(|k| k.starts_with("moe_gate_up_"))).collect();
        assert!(ups.iter().all(|s| s.node.ends_with(&scratch) && s.args.last() == Some(&s.node)), "{name}: the gate/up kernels write the scratch");
        assert!(gpu.buffers.iter().any(|b| b.node.ends_with(&scratch)), "{name}: the scratch is in the memory plan");
        // (a MoE layer's row of the expert mask is a view into the resident mask, no kernel;
        // the residual stream rides on the routed experts — no separate add after the MoE)
        assert_eq!(count("slice_"), 0, "{name}: {kernels:?}");
        let masks: Vec<_> = gpu.steps.iter().filter(|s| s.node.ends_with("mlp.gate.mask")).collect();
        assert_eq!(masks.len(), moe_layers, "{name}");
        for (row, s) in masks.iter().enumerate() {
            assert_eq!((s.kernel.as_deref(), s.alias_of.as_deref()), (None, Some("expert_mask")), "{name}");
            let experts = cfg["n_routed_experts"].as_u64().unwrap() as i64;
            assert_eq!(s.alias_offset, Some(dsc_runtime::plan::Scalar::Const(row as i64 * experts)), "{name}: {}", s.node);
        }
        let downs: Vec<_> = gpu.steps.iter().filter(|s| s.kernel.as_deref().is_some_and(|k| k.starts_with("moe_down_"))).collect();
        assert!(downs.iter().all(|s| s.kernel.as_deref().is_some_and(|k| k.ends_with("_res"))), "{name}: the residual added by the down projection");
        assert_eq!(count("binary_add"), 0, "{name}: {kernels:?}");
        // (each router counts its selections beside the mask row: the GPU's per-expert load)
        for s in gpu.steps.iter().filter(|s| s.kernel.as_deref().is_some_and(|k| k.starts_with("moe_route_"))) {
            assert!(s.kernel.as_deref().is_some_and(|k| k.ends_with("_count")), "{name}: {:?}", s.kernel);
            assert_eq!(s.args[s.args.len() - 2], format!("{}@counts", s.args[1]), "{name}: {:?}", s.args);
        }
        // (the runtime reads every buffer role of the schedule)
        for s in &gpu.steps {
            for a in &s.args {
                dsc_runtime::plan::BufferRef::parse(a).unwrap_or_else(|e| panic!("{name}: {e}"));
            }
        }
    }
}

/// With 16-bit weights (here a tiny fixture's, converted to bf16: D 64, I 32) the routed
/// experts from 16 tokens run expert-major on the tensor cores: the gate/up's alternative reads
/// x's bf16 copy, the down projection's writes the route-weighted partials
/// `{experts}@splitk{top_k}`, and a combine step for those rows sums them into the node; below
/// 16 tokens the per-token kernels run.
#[test]
fn bf16_routed_experts_go_expert_major_on_the_tensor_cores_from_16_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let c = dsc_compiler::compile(&model_toml(dir.path(), &fixture("v3-tiny"), "\n[precision]\nweights = \"bf16\"\n")).unwrap();
    let gpu = c.gpu.as_ref().expect("a GPU program");
    let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture("v3-tiny").join("config.json")).unwrap()).unwrap();
    let top_k = cfg["num_experts_per_tok"].as_u64().unwrap() as usize;
    let moe_layers = (cfg["num_hidden_layers"].as_u64().unwrap() - cfg["first_k_dense_replace"].as_u64().unwrap()) as usize;
    let kernel = |s: &dsc_runtime::plan::GpuStep, p: &str| s.kernel.as_deref().is_some_and(|k| k.starts_with(p));
    // (at one row with the MoE layer's norm folded in: `rms_moe_gate_up_`)
    let ups: Vec<_> = gpu.steps.iter().filter(|s| kernel(s, "moe_gate_up_") || kernel(s, "rms_moe_gate_up_")).collect();
    assert_eq!(ups.len(), moe_layers);
    for up in ups {
        let alt = up.few.iter().find(|l| l.kernel.starts_with("moe_gate_up_mma_")).expect("the grouped gate/up");
        assert_eq!(alt.min_rows, 16);
        assert!(alt.args.as_ref().is_some_and(|a| a[0].ends_with("@bf16")), "x in 16 bits: {:?}", alt.args);
    }
    let downs: Vec<usize> = gpu.steps.iter().enumerate().filter(|(_, s)| kernel(s, "moe_down_")).map(|(i, _)| i).collect();
    assert_eq!(downs.len(), moe_layers);
    for i in downs {
        let (down, next) = (&gpu.steps[i], &gpu.steps[i + 1]);
        let alt = down.few.iter().find(|l| l.kernel.starts_with("moe_down_mma_")).expect("the grouped down projection");
        let parts = format!("{}@splitk{top_k}", down.node);
        assert_eq!(alt.args.as_ref().and_then(|a| a.last()), Some(&parts), "the partials");
        assert!(kernel(next, "moe_combine_") && next.node == down.node && next.min_rows == Some(16) && next.args[0] == parts, "the combine after it: {next:?}");
    }
    // (the MLA per-head matmuls too, from 8 tokens, where K is a multiple of 32: the v
    // projection's K = kv_lora_rank 32, not q_b's K = q_lora_rank 24)
    let heads: Vec<_> = gpu.steps.iter().filter(|s| kernel(s, "head_matmul_")).collect();
    let batched = |s: &dsc_runtime::plan::GpuStep| s.few.iter().any(|l| l.kernel.starts_with("head_matmul_mma_") && l.min_rows == 8);
    assert_eq!(heads.iter().filter(|s| batched(s)).count(), cfg["num_hidden_layers"].as_u64().unwrap() as usize, "the v projections");
    assert!(heads.iter().filter(|s| s.kernel.as_deref().is_some_and(|k| k.contains("_k24_"))).all(|s| !batched(s)), "q_b's K of 24 stays per token");
    // (f32 weights keep the per-token kernels only)
    let f32c = dsc_compiler::compile(&model_toml(dir.path(), &fixture("v3-tiny"), "")).unwrap();
    assert!(f32c.gpu.as_ref().unwrap().steps.iter().all(|s| !kernel(s, "moe_combine_") && s.few.iter().all(|l| !l.kernel.contains("_mma_"))));
}

/// One-token steps run the shared experts as slots of the routed experts' kernels
/// (`fuse_moe_shared`, 16-bit weights): the merged router + shared gate/up GEMV computes the
/// router alone, the gate/up and down kernels take the shared weights (`_s{n}`) and the down
/// projection writes the layer's output; the SwiGLU and the shared down projection run from 2
/// rows, where the per-token kernels without the slots run as before.
#[test]
fn one_token_moe_steps_run_the_shared_experts_in_the_routed_kernels() {
    let dir = tempfile::tempdir().unwrap();
    // (and with the one-token fusions not yet measured on a GPU, off by default, turned on:
    // the router in its GEMV with the norm folded in, the latent row written in the attention,
    // the shared weights prefetched under the attention with the shared slots first)
    for (name, fused) in [("v2-lite-tiny", false), ("v3-tiny", false), ("v2-lite-tiny", true), ("v3-tiny", true)] {
        let mut codegen = dsc_codegen::CodegenOptions::default();
        (codegen.schedule.moe_router, codegen.schedule.mla_cache_attention, codegen.schedule.moe_prefetch) = (fused, fused, fused);
        let toml = model_toml(dir.path(), &fixture(name), "\n[precision]\nweights = \"bf16\"\n");
        let c = dsc_compiler::compile_full(&toml, &dsc_compiler::CompileOptions { codegen, ..Default::default() }).unwrap();
        let gpu = c.gpu.as_ref().expect("a GPU program");
        let cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture(name).join("config.json")).unwrap()).unwrap();
        let n = |k: &str| cfg[k].as_u64().unwrap() as usize;
        let (top_k, inter, shared, e) = (n("num_experts_per_tok"), n("moe_intermediate_size"), n("n_shared_experts"), n("n_routed_experts"));
        let moe_layers = n("num_hidden_layers") - n("first_k_dense_replace");
        fn kernel(s: &dsc_runtime::plan::GpuStep) -> &str {
            s.kernel.as_deref().unwrap_or("")
        }
        let tag = format!("_k{top_k}_s{shared}{}_", if fused { "f" } else { "" });
        // (fused: the MoE layer's RMSNorm folded in at one row, `rms_`, reading the residual
        // stream and the norm weight)
        let up_prefix = if fused { "rms_moe_gate_up_" } else { "moe_gate_up_" };
        let ups: Vec<_> = gpu.steps.iter().filter(|s| kernel(s).starts_with(up_prefix) && kernel(s).contains(&tag)).collect();
        assert!(!fused || ups.iter().all(|s| s.args[1].ends_with("post_attention_layernorm.weight")), "{name}");
        let downs: Vec<_> = gpu.steps.iter().filter(|s| kernel(s).starts_with("moe_down_") && kernel(s).contains(&tag)).collect();
        assert_eq!((ups.len(), downs.len()), (moe_layers, moe_layers), "{name}");
        for (up, down) in ups.iter().zip(&downs) {
            let h2 = format!("{}@rows{}", down.node, (top_k + shared) * inter);
            assert_eq!(up.args.last(), Some(&h2), "{name}: the wider scratch");
            assert!(up.args.iter().any(|a| a.ends_with("shared_experts.gate_proj.weight")) && up.args.iter().any(|a| a.ends_with("shared_experts.up_proj.weight")), "{name}: {:?}", up.args);
            assert_eq!(down.args[0], h2);
            assert!(down.args[3].ends_with("shared_experts.down_proj.weight") && down.args.last().is_some_and(|a| a.ends_with("mlp.residual")), "{name}: {:?}", down.args);
            // (from 2 rows, on either kind of GPU: the kernels without the slots, reading and
            // writing what they did — the down one into the experts' buffer, not the layer's)
            for r in [2, 8, 15, 16, 40, 300] {
                for hopper in [false, true] {
                    for s in [up, down] {
                        let k = s.alternative(r, hopper).map(|l| l.kernel.as_str()).unwrap_or(kernel(s));
                        assert!(!k.contains(&tag), "{name}: {r} rows (hopper {hopper}): {k}");
                    }
                    let args = down.alternative(r, hopper).and_then(|l| l.args.as_ref()).unwrap_or(&down.args);
                    assert!(args.last().is_some_and(|a| *a == down.node || a.contains("@splitk")), "{name}: {r} rows: {args:?}");
                }
            }
        }
        // the shared gate and up weights prefetched into L2 by the layer's absorbed query and
        // value projection (`prefetch_shared_experts`), the shared slots first in the grid
        let pf: Vec<_> = gpu.steps.iter().filter(|s| kernel(s).ends_with("_pf")).collect();
        assert_eq!(pf.len(), if fused { 2 * moe_layers } else { 0 }, "{name}: {:?}", pf.iter().map(|s| kernel(s)).collect::<Vec<_>>());
        for s in &pf {
            let want = if kernel(s).starts_with("mla_query_") { "shared_experts.gate_proj.weight" } else { "shared_experts.up_proj.weight" };
            assert!(kernel(s).starts_with("mla_query_") || kernel(s).starts_with("head_matmul_"), "{name}: {}", kernel(s));
            assert!(s.args[0].ends_with(want), "{name}: {:?}", s.args);
            assert!(s.few.iter().all(|l| !l.kernel.ends_with("_pf") && l.args.as_ref().is_some_and(|a| !a[0].contains("shared_experts"))), "{name}: batched alternatives do not prefetch");
        }
        // at one row the router GEMV's last block routes (`fuse_moe_router`: the router step
        // from 2 rows) and the attention writes the latent cache row (`fuse_mla_cache_attention`)
        let routes: Vec<_> = gpu.steps.iter().filter(|s| kernel(s).starts_with("moe_route_")).collect();
        assert_eq!(routes.len(), moe_layers, "{name}");
        for r in routes.iter().filter(|_| fused) {
            assert_eq!(r.min_rows, Some(2), "{name}");
            let folded = gpu.steps.iter().flat_map(|s| &s.few).find(|l| l.kernel.contains("_moe_route_") && l.args.as_ref().is_some_and(|a| a.last() == Some(&r.node)));
            let args = folded.and_then(|l| l.args.as_ref()).unwrap_or_else(|| panic!("{name}: no GEMV routes {}", r.node));
            assert_eq!(args[args.len() - 2], format!("{}@sync", r.node), "{name}");
        }
        let layers = n("num_hidden_layers");
        let writes: Vec<_> = gpu.steps.iter().filter(|s| kernel(s).starts_with("mla_latent_cache_")).collect();
        assert_eq!(writes.len(), layers, "{name}");
        assert!(writes.iter().all(|s| s.min_rows == fused.then_some(2)), "{name}");
        assert!(routes.iter().all(|s| s.min_rows == fused.then_some(2)), "{name}");
        let attn: Vec<_> = gpu.steps.iter().filter(|s| kernel(s).starts_with("mla_attention_")).collect();
        assert_eq!(attn.len(), layers, "{name}");
        for a in attn.iter().filter(|_| fused) {
            let one = a.alternative(1, true).expect("a one-row alternative");
            assert!(one.kernel.contains("_w_l") && one.args.as_ref().is_some_and(|x| x[0].ends_with("kv_a_proj_with_mqa")), "{name}: {}", one.kernel);
            assert!(a.alternative(2, true).is_none_or(|l| !l.kernel.contains("_w_l")), "{name}");
        }
        // the router GEMV alone at one row; the whole cat from 2 rows, where the SwiGLU and the
        // shared down run (v3-tiny's 8-row prefill read unwritten shared gate/up columns when
        // the router GEMV was the cat's kernel at every row count)
        let cats: Vec<_> = gpu.steps.iter().filter(|s| s.node.ends_with("mlp.gate+shared_experts.gate_proj+shared_experts.up_proj")).collect();
        assert_eq!(cats.len(), moe_layers, "{name}");
        for c in cats {
            for r in [1, 2, 8, 15, 16, 40, 300] {
                for hopper in [false, true] {
                    let k = c.alternative(r, hopper).map(|l| l.kernel.as_str()).unwrap_or(kernel(c));
                    let router_only = k.contains(&format!("_n{e}_")) && !k.contains("parts");
                    assert_eq!(router_only, r == 1, "{name}: {r} rows (hopper {hopper}): {k}");
                }
            }
        }
        let later: Vec<_> = gpu
            .steps
            .iter()
            .filter(|s| s.node.ends_with("shared_experts.up_proj.swiglu") || s.args.iter().any(|a| a.ends_with("shared_experts.down_proj.weight")) && !kernel(s).starts_with("moe_"))
            .collect();
        assert_eq!(later.len(), 2 * moe_layers, "{name}");
        assert!(later.iter().all(|s| s.min_rows == Some(2)), "{name}");
        // (f32 weights: no slots)
        let f32c = dsc_compiler::compile(&model_toml(dir.path(), &fixture(name), "")).unwrap();
        assert!(f32c.gpu.as_ref().unwrap().steps.iter().all(|s| !kernel(s).contains(&tag)), "{name}");
    }
}

/// `[tokenizer]` works for the DeepSeek family as for the llama one: a seeded V2-Lite shape
/// served with SmolLM2's GGUF tokenizer (scripts/gpu-deepseek.sh), and a tokenizer larger
/// than the model's vocabulary is an error naming model.toml.
#[test]
fn a_deepseek_plan_takes_the_tokenizer_model_toml_names() {
    let root = dsc_tests::root();
    let gguf = root.join(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let dir = tempfile::tempdir().unwrap();
    let write = |cfg: &Path| {
        let p = dir.path().join("model.toml");
        std::fs::write(
            &p,
            format!(
                "[model]\nname = \"s\"\narchitecture = \"deepseek\"\n\n[weights]\nformat = \"seeded\"\nseed = 1\ndtype = \"bf16\"\nconfig = \"{}\"\n\n[tokenizer]\ngguf = \"{}\"\n",
                cfg.display(),
                gguf.display()
            ),
        )
        .unwrap();
        p
    };
    let m = dsc_models::load(&write(&root.join("models/deepseek-v2-lite.config.json"))).unwrap();
    let tok = m.tokenizer.expect("the GGUF's tokenizer");
    assert!(tok.json.contains("\"model\""), "a tokenizer.json");
    let e = dsc_models::load(&write(&fixture("v3-tiny").join("config.json"))).err().expect("49152 tokens into a vocabulary of 512");
    let msg = format!("{e:#}");
    assert!(msg.contains("model.toml") && msg.contains("the model's vocabulary is 512"), "{msg}");
}

#[test]
fn perplexity_equals_the_one_hf_logits_give() {
    // the oracle: HF's own f32 logits of the prompt, scored the same way (every token after the
    // first, from the whole prompt's context)
    for name in FIXTURES {
        let r = reference(name);
        let (_d, plan) = plan(name);
        let graph = plan.graph().unwrap();
        let mut backend = CpuBackend::new(&graph, &plan, 64).unwrap();
        let n = r.prompt.len();
        let want: f64 = (0..n - 1).map(|i| dsc_runtime::ppl::nll(&r.logits[i], r.prompt[i + 1])).sum::<f64>() / (n - 1) as f64;
        let got = dsc_runtime::ppl::perplexity(&mut backend, &r.prompt, 64, None).unwrap();
        assert_eq!((got.windows, got.scored_tokens, got.text_tokens), (1, n - 1, n));
        assert!((got.mean_nll - want).abs() < 1e-4 * want.abs().max(1.0), "{name}: mean NLL {} vs HF's {want}", got.mean_nll);
        assert!((got.ppl - want.exp()).abs() < 1e-3 * want.exp(), "{name}: ppl {} vs {}", got.ppl, want.exp());
        // windows of 5 tokens, each from an empty cache: the first of each is context only;
        // with a BOS opening every window, every token is scored
        let w = dsc_runtime::ppl::perplexity(&mut backend, &r.prompt, 5, None).unwrap();
        let parts: Vec<usize> = r.prompt.chunks(5).map(|c| c.len()).filter(|&l| l >= 2).collect();
        assert_eq!((w.windows, w.scored_tokens), (parts.len(), parts.iter().map(|l| l - 1).sum()), "{name}");
        let b = dsc_runtime::ppl::perplexity(&mut backend, &r.prompt, 5, Some(r.prompt[0])).unwrap();
        assert_eq!((b.windows, b.scored_tokens), (n.div_ceil(4), n), "{name}");
        assert!(dsc_runtime::ppl::perplexity(&mut backend, &r.prompt, 1, None).is_err());
    }
}

/// DeepSeek's FP8 release as it ships (e4m3 `weight` + f32 `weight_scale_inv` per 128x128 block
/// for every linear projection, `quantization_config` fp8): v3-tiny's weights quantized that
/// way load, and the plan's logits are those of the same weights dequantized to f32 (up to the
/// bf16 rounding of the products the tiny matrices import as: rows shorter than f8g128's
/// 512-value super-blocks)
#[test]
fn fp8_block_scaled_checkpoints_import_as_shipped() {
    use safetensors::tensor::{Dtype, TensorView};
    use safetensors::SafeTensors;
    let bytes = std::fs::read(fixture("v3-tiny").join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (fp8, deq) = (dir.path().join("fp8"), dir.path().join("deq"));
    let mut out_fp8: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![];
    let mut out_deq: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = vec![];
    let mut quantized = 0;
    for (name, t) in st.tensors() {
        let shape = t.shape().to_vec();
        let linear = shape.len() == 2 && name.ends_with("_proj.weight");
        if !linear {
            out_fp8.push((name.clone(), t.dtype(), shape.clone(), t.data().to_vec()));
            out_deq.push((name, t.dtype(), shape, t.data().to_vec()));
            continue;
        }
        assert_eq!(t.dtype(), Dtype::F32, "{name}");
        let v: Vec<f32> = t.data().chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
        let (n, k) = (shape[0], shape[1]);
        let (bn, bk) = (n.div_ceil(128), k.div_ceil(128));
        let mut scale = vec![0f32; bn * bk];
        for i in 0..n * k {
            let b = (i / k / 128) * bk + (i % k) / 128;
            scale[b] = scale[b].max(v[i].abs() / 448.0);
        }
        let q: Vec<u8> = (0..n * k).map(|i| dsc_ir::quant::f32_to_f8e4m3(v[i] / scale[(i / k / 128) * bk + (i % k) / 128])).collect();
        let dq: Vec<f32> = (0..n * k).map(|i| dsc_ir::quant::f8e4m3_to_f32(q[i]) * scale[(i / k / 128) * bk + (i % k) / 128]).collect();
        out_fp8.push((name.clone(), Dtype::F8_E4M3, shape.clone(), q));
        out_fp8.push((format!("{name}_scale_inv"), Dtype::F32, vec![bn, bk], scale.iter().flat_map(|s| s.to_le_bytes()).collect()));
        out_deq.push((name, Dtype::F32, shape, dq.iter().flat_map(|s| s.to_le_bytes()).collect()));
        quantized += 1;
    }
    assert!(quantized >= 10, "{quantized} linear projections");
    let mut cfg: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(fixture("v3-tiny").join("config.json")).unwrap()).unwrap();
    for (d, tensors, q) in [(&fp8, &out_fp8, true), (&deq, &out_deq, false)] {
        std::fs::create_dir(d).unwrap();
        let views: Vec<(String, TensorView)> = tensors.iter().map(|(n, dt, s, b)| (n.clone(), TensorView::new(*dt, s.clone(), b).unwrap())).collect();
        safetensors::serialize_to_file(views, None, &d.join("model.safetensors")).unwrap();
        if q {
            cfg["quantization_config"] = serde_json::json!({"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]});
        } else {
            cfg.as_object_mut().unwrap().remove("quantization_config");
        }
        std::fs::write(d.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    }
    let logits = |w: &Path, tag: &str| {
        let sub = dir.path().join(tag);
        std::fs::create_dir(&sub).unwrap();
        let c = dsc_compiler::compile(&model_toml(&sub, w, "")).unwrap_or_else(|e| panic!("{tag}: {e:#}"));
        let out = sub.join("p.plan");
        dsc_compiler::write(&c, &out).unwrap();
        let plan = Plan::open(&out).unwrap();
        let graph = plan.graph().unwrap();
        let mut be = CpuBackend::new(&graph, &plan, 64).unwrap();
        Session::new(&mut be).feed(&[3, 14, 15, 92, 65, 35], true).unwrap()
    };
    let (got, want) = (logits(&fp8, "a"), logits(&deq, "b"));
    let rel = worst_rel(&got, &want);
    assert!(rel < 2e-2, "FP8 checkpoint vs its dequantized f32 twin: {rel}");
    assert!(rel > 0.0, "the import rounds the tiny matrices' products to bf16");
}
