//! End-to-end GPU check of a real model against the CPU executor and the reference outputs:
//! for every reference prompt, teacher-force the reference's greedy continuation on both
//! backends and compare the logits at every position (relative L2, and the argmax wherever
//! the CPU's top-2 margin exceeds 0.25); then run free greedy decoding on the GPU and report
//! where, and at what reference margin, it first leaves the reference continuation.

use crate::engine::{Backend, CpuBackend, Session};
use crate::generate::{generate, top2_margin, GenerateOptions};
use crate::gpu::GpuBackend;
use crate::plan::Plan;
use crate::sampler::{argmax, SamplingParams};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Deserialize)]
struct RefPrompt {
    name: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    greedy_margins: Vec<f32>,
}

#[derive(Serialize)]
pub struct PromptReport {
    pub name: String,
    pub positions: usize,
    pub max_rel_l2: f64,
    pub mean_rel_l2: f64,
    /// positions where the CPU margin > 0.25 and the argmaxes differ
    pub argmax_mismatches: usize,
    pub argmax_checked: usize,
    pub reference_ids: Vec<u32>,
    pub gpu_greedy_ids: Vec<u32>,
    /// first index where the GPU's free greedy continuation differs from the reference
    pub first_difference: Option<usize>,
    pub reference_margin_there: Option<f32>,
    pub gpu_decode_ms_per_token: f64,
    pub pass: bool,
}

fn logits_along<B: Backend>(b: &mut B, prompt: &[u32], forced: &[u32]) -> anyhow::Result<Vec<Vec<f32>>> {
    let mut s = Session::new(b);
    let mut out = vec![s.feed(prompt, false)?.pop().context("logits")?];
    for &t in &forced[..forced.len().saturating_sub(1)] {
        out.push(s.feed(&[t], false)?.pop().context("logits")?);
    }
    Ok(out)
}

/// ‖a − b‖ / ‖b‖ in f64.
pub fn rel_l2(a: &[f32], b: &[f32]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    (num / den.max(1e-30)).sqrt()
}

pub fn run(plan_path: &Path, reference: &Path, ro: &crate::options::RuntimeOptions) -> anyhow::Result<Vec<PromptReport>> {
    let plan = Plan::open(plan_path)?;
    let graph = plan.graph()?;
    let refs: Vec<RefPrompt> = serde_json::from_str(&std::fs::read_to_string(reference).with_context(|| reference.display().to_string())?)?;
    // (KV for the longest reference, up to the plan's context: not a fixed 512)
    let max_seq = plan.header.model.max_seq_len;
    if let Some(r) = refs.iter().find(|r| r.prompt_ids.len() + r.greedy_ids.len() > max_seq) {
        anyhow::bail!("{}: prompt `{}` ({} tokens) and its continuation ({}) exceed the plan's max_seq_len ({max_seq})", reference.display(), r.name, r.prompt_ids.len(), r.greedy_ids.len());
    }
    let kv = refs.iter().map(|r| r.prompt_ids.len() + r.greedy_ids.len()).max().unwrap_or(0).max(16);
    let mut cpu = CpuBackend::new(&graph, &plan, kv)?;
    let mut gpu = GpuBackend::new(&graph, &plan, kv, ro)?;
    let eos = plan.header.tokenizer.as_ref().map(|t| t.eos_ids.clone()).unwrap_or_default();
    let mut reports = vec![];
    for r in &refs {
        let c = logits_along(&mut cpu, &r.prompt_ids, &r.greedy_ids)?;
        let g = logits_along(&mut gpu, &r.prompt_ids, &r.greedy_ids)?;
        let errs: Vec<f64> = c.iter().zip(&g).map(|(a, b)| rel_l2(b, a)).collect();
        let mut checked = 0;
        let mut mismatches = 0;
        for (a, b) in c.iter().zip(&g) {
            if top2_margin(a) > 0.25 {
                checked += 1;
                mismatches += (argmax(a) != argmax(b)) as usize;
            }
        }
        let opts = GenerateOptions { max_tokens: r.greedy_ids.len(), sampling: SamplingParams::default(), stop_ids: eos.clone() };
        gpu.synchronize()?;
        let t0 = std::time::Instant::now();
        let gen = generate(&mut gpu, &r.prompt_ids, &opts, |_| {})?;
        gpu.synchronize()?;
        let ms = t0.elapsed().as_secs_f64() * 1e3 / gen.ids.len().max(1) as f64;
        let first = gen.ids.iter().zip(&r.greedy_ids).position(|(a, b)| a != b).or(if gen.ids.len() != r.greedy_ids.len() { Some(gen.ids.len().min(r.greedy_ids.len())) } else { None });
        let max = errs.iter().copied().fold(0.0, f64::max);
        reports.push(PromptReport {
            name: r.name.clone(),
            positions: errs.len(),
            max_rel_l2: max,
            mean_rel_l2: errs.iter().sum::<f64>() / errs.len().max(1) as f64,
            argmax_mismatches: mismatches,
            argmax_checked: checked,
            reference_ids: r.greedy_ids.clone(),
            gpu_greedy_ids: gen.ids,
            first_difference: first,
            reference_margin_there: first.and_then(|i| r.greedy_margins.get(i).copied()),
            gpu_decode_ms_per_token: ms,
            pass: max <= 2e-2 && mismatches == 0,
        });
    }
    Ok(reports)
}
