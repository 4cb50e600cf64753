//! Tensor parallelism on the CPU backend: partitioned plans (ranks as threads, all-reduce by
//! barrier + sum) against the whole model, on the tiny llama and on the real SmolLM2.

use dsc_ir::DType;
use dsc_runtime::engine::{Backend, CpuBackend, Session};
use dsc_runtime::plan::Plan;
use dsc_tests::*;
use std::path::{Path, PathBuf};

/// Prefill `prompt`, then decode `steps` greedy tokens; every logits row along the way.
fn trace(b: &mut dyn Backend, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut s = Session::new(b);
    let mut out = s.feed(prompt, true).unwrap();
    for _ in 0..steps {
        let last = out.last().unwrap();
        let t = (0..last.len()).max_by(|&a, &b| last[a].total_cmp(&last[b])).unwrap() as u32;
        out.extend(s.feed(&[t], false).unwrap());
    }
    out
}

fn whole(plan: &Path, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let plan = Plan::open(plan).unwrap();
    let g = plan.graph().unwrap();
    let mut cpu = CpuBackend::new(&g, &plan, 64).unwrap();
    trace(&mut cpu, prompt, steps)
}

fn ranks(plan: &Path, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let plan = Plan::open(plan).unwrap();
    let g = plan.graph().unwrap();
    dsc_runtime::tp::cpu(&g, &plan, 64, |r| Ok(trace(r, prompt, steps))).unwrap()
}

fn max_rel(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| dsc_runtime::gpu_e2e::rel_l2(x, y)).fold(0.0, f64::max)
}

fn compile(toml: &Path, tp: Option<usize>, out: PathBuf) -> (PathBuf, String) {
    let c = dsc_compiler::compile_with(toml, tp).unwrap();
    let note = c.reports.iter().find(|r| r.pass == "tensor_parallel").map(|r| r.note.clone()).unwrap_or_default();
    dsc_compiler::write(&c, &out).unwrap();
    (out, note)
}

#[test]
fn tiny_llama_splits_attention_and_mlp_and_matches_the_whole_model() {
    let d = tempfile::tempdir().unwrap();
    write_tiny_hf(&d.path().join("hf"), &tiny_llama_hf(9));
    let toml = model_toml(d.path(), "safetensors", "hf");
    let (base, _) = compile(&toml, None, d.path().join("whole.plan"));
    let (tp1, note1) = compile(&toml, Some(1), d.path().join("tp1.plan"));
    let (tp2, note2) = compile(&toml, Some(2), d.path().join("tp2.plan"));
    // 2 layers x (attention + MLP), one all_reduce closing each
    assert!(note1.contains("world 1: 4 split regions") && note1.contains("4 all_reduce"), "{note1}");
    assert!(note2.contains("world 2: 4 split regions") && note2.contains("4 all_reduce"), "{note2}");
    let p2 = Plan::open(&tp2).unwrap();
    assert_eq!(p2.header.tensor_parallel, 2);
    // the plan keeps the full tensors (each rank cuts its part), the graph the rank's shapes
    assert_eq!(p2.header.weights.total_bytes, Plan::open(&base).unwrap().header.weights.total_bytes);
    assert!(p2.header.graph.contains("%model.layers.0.self_attn.q_proj.weight = weight : f32[32, 64]"), "{}", p2.header.graph);
    assert!(p2.header.graph.contains("%model.layers.0.mlp.down_proj.weight = weight : f32[64, 48]"));
    assert!(p2.header.graph.contains("all_reduce(%model.layers.1.mlp.down_proj)"));
    let prompt = [3u32, 14, 15, 9, 26, 5];
    let want = whole(&base, &prompt, 4);
    assert_eq!(ranks(&tp1, &prompt, 4), want, "world size 1 is the whole model, bit for bit");
    let got = ranks(&tp2, &prompt, 4);
    let err = max_rel(&got, &want);
    assert!(err < 1e-5, "tp=2 vs whole model: relative L2 {err}");
}

#[test]
fn quantized_blocks_limit_what_splits() {
    // Q8_0 blocks of 32: the MLP's 96 columns split in two would cut blocks, so only
    // attention splits (64 -> 32 columns per rank for the output projection)
    let d = tempfile::tempdir().unwrap();
    let w = tiny_llama_hf(10);
    let t = tiny_gguf_tensors(&w, DType::Q8_0);
    write_tiny_gguf(&d.path().join("m.gguf"), &tiny_gguf_metadata(), &t);
    let toml = model_toml(d.path(), "gguf", "m.gguf");
    let (base, _) = compile(&toml, None, d.path().join("whole.plan"));
    let (tp2, note) = compile(&toml, Some(2), d.path().join("tp2.plan"));
    assert!(note.contains("world 2: 2 split regions") && note.contains("2 all_reduce"), "{note}");
    let prompt = [1u32, 2, 3, 4, 5];
    let err = max_rel(&ranks(&tp2, &prompt, 3), &whole(&base, &prompt, 3));
    assert!(err < 1e-5, "tp=2 vs whole model: relative L2 {err}");
}

#[test]
fn smollm2_tp2_matches_on_the_cpu() {
    // 9 query heads and 3 KV heads do not split in two: attention stays replicated, the
    // MLP (1536 columns, Q4_1 blocks) splits; 30 all-reduces
    let d = tempfile::tempdir().unwrap();
    let (base, _) = compile(&default_model(), None, d.path().join("whole.plan"));
    let (tp2, note) = compile(&default_model(), Some(2), d.path().join("tp2.plan"));
    assert!(note.contains("world 2: 30 split regions") && note.contains("30 all_reduce"), "{note}");
    let prompt = [1u32, 504, 3458, 282, 4649, 314];
    let want = whole(&base, &prompt, 2);
    let got = ranks(&tp2, &prompt, 2);
    let err = max_rel(&got, &want);
    assert!(err < 1e-4, "SmolLM2 tp=2 vs whole model: relative L2 {err}");
}

#[test]
fn bad_world_sizes_are_clear_errors() {
    let d = tempfile::tempdir().unwrap();
    write_tiny_hf(&d.path().join("hf"), &tiny_llama_hf(9));
    let toml = model_toml(d.path(), "safetensors", "hf");
    let e = dsc_compiler::compile_with(&toml, Some(0)).err().unwrap().to_string();
    assert!(e.contains("--tp"), "{e}");
    let text = std::fs::read_to_string(&toml).unwrap() + "\n[parallel]\ntp = 0\n";
    std::fs::write(&toml, text).unwrap();
    let e = format!("{:#}", dsc_compiler::compile(&toml).err().unwrap());
    assert!(e.contains("parallel.tp") && e.contains("model.toml"), "{e}");
    // 5 ranks divide nothing of the tiny model: nothing splits, and the note says why
    let e = dsc_compiler::compile_with(&model_toml(d.path(), "safetensors", "hf"), Some(5)).unwrap();
    let note = &e.reports.iter().find(|r| r.pass == "tensor_parallel").unwrap().note;
    assert!(note.contains("0 split regions") && note.contains("not divisible by 5"), "{note}");
}
