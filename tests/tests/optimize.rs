//! The optimizer on whole models: the optimized plan computes what the unoptimized one does
//! (CPU executor, a prompt and a few decode steps), with fewer kernels.

use dsc_runtime::engine::{CpuBackend, Session};
use dsc_runtime::plan::Plan;
use dsc_tests::*;
use std::path::Path;

fn logits(c: &dsc_compiler::Compiled, dir: &Path, name: &str, prompt: &[u32]) -> Vec<Vec<f32>> {
    let p = dir.join(name);
    dsc_compiler::write(c, &p).unwrap();
    let plan = Plan::open(&p).unwrap();
    let g = plan.graph().unwrap();
    let mut b = CpuBackend::new(&g, &plan, 64).unwrap();
    let mut s = Session::new(&mut b);
    let mut out = s.feed(prompt, true).unwrap();
    for t in [7u32, 11, 13] {
        out.extend(s.feed(&[t], false).unwrap());
    }
    out
}

/// Kernel launches of a one-token decode step at a short context (the plans' summary figure).
fn launches(c: &dsc_compiler::Compiled) -> usize {
    c.gpu.as_ref().map(|g| g.launches(1)).unwrap_or(0)
}

#[test]
fn optimized_models_compute_the_same_logits_with_fewer_kernels() {
    let d = tempfile::tempdir().unwrap();
    write_tiny_hf(&d.path().join("hf"), &tiny_llama_hf(5));
    let tiny = model_toml(d.path(), "safetensors", "hf");
    for (toml, prompt) in [(tiny, vec![1u32, 2, 3, 4, 5, 6]), (default_model(), vec![1u32, 504, 3458, 282, 4649, 314])] {
        let base = dsc_compiler::compile_opts(&toml, None, false).unwrap();
        // the default rules minus rope-cache-write and merge-matmuls, checked below
        let opt = dsc_compiler::compile_rules(&toml, None, true, &[("rope-cache-write".into(), false), ("merge-matmuls".into(), false)]).unwrap();
        let note = &opt.reports.iter().find(|r| r.pass == "optimize").unwrap().note;
        assert!(note.contains("stop: saturated") && note.contains("silu-mul") && note.contains("matmul-add"), "{note}");
        let layers = opt.model.dims.layers;
        let k = note.split("kernels ").nth(1).unwrap();
        let (before, after): (usize, usize) = (k.split(" -> ").next().unwrap().parse().unwrap(), k.split(" -> ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap());
        // per layer: SwiGLU in one kernel, both residual adds in matmul epilogues
        assert_eq!(before - after, 3 * layers, "three kernels saved per layer: {note}");
        if base.gpu.is_some() {
            assert_eq!(launches(&base) - launches(&opt), 3 * layers, "launches per step: {note}");
        }
        let a = logits(&base, d.path(), "base.plan", &prompt);
        let b = logits(&opt, d.path(), "opt.plan", &prompt);
        let err = a.iter().zip(&b).map(|(x, y)| dsc_runtime::gpu_e2e::rel_l2(y, x)).fold(0.0, f64::max);
        assert!(err < 1e-5, "{}: optimized vs base relative L2 {err}", toml.display());
        // the default rules: also the K rope goes into its cache write (one kernel fewer per
        // layer) and Q/K/V and gate/up are merged matmuls (three fewer); then the lowering runs
        // rope(q), the K write and the V write as one kernel (two fewer); same logits
        let all = dsc_compiler::compile_opts(&toml, None, true).unwrap();
        let note = &all.reports.iter().find(|r| r.pass == "optimize").unwrap().note;
        assert!(note.contains(&format!("rope-cache-write x{layers}")) && note.contains(&format!("merge-matmuls x{}", 2 * layers)), "{note}");
        if let Some(g) = &all.gpu {
            // ... and at one token that kernel's work goes into the attention (one more, where
            // the attention takes it: every layer of SmolLM2)
            let folded = g.steps.iter().filter(|s| s.kernel.as_deref().is_some_and(|k| k.starts_with("paged_attention") && k.contains("_rope"))).count();
            if toml == default_model() {
                assert_eq!(folded, layers, "RoPE + cache writes inside each layer's one-token attention");
            }
            if toml == default_model() {
                // the default model's Q4_1 layers take every one-token fusion of the lowering
                // on the optimized graph (RMSNorm into the merged GEMVs, SwiGLU + W_down as
                // one kernel, W_q/W_k/W_v and W_o inside the attention): two launches per
                // layer, plus the embedding gather, the final norm, the lm_head and the argmax
                assert_eq!(launches(&all), 2 * layers + 4, "launches per step: {note}");
                assert!(launches(&base) - launches(&all) > 9 * layers + folded, "launches per step: {note}");
            } else {
                assert_eq!(launches(&base) - launches(&all), 9 * layers + folded, "launches per step: {note}");
            }
        }
        let c = logits(&all, d.path(), "all.plan", &prompt);
        let err = a.iter().zip(&c).map(|(x, y)| dsc_runtime::gpu_e2e::rel_l2(y, x)).fold(0.0, f64::max);
        assert!(err < 1e-5, "{}: all default rules vs base relative L2 {err}", toml.display());
    }
}
