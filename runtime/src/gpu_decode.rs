//! Decode a plan on the GPU for N steps (greedy, from a seeded prompt of token ids), timing
//! every step, and check the first steps against the CPU executor (teacher-forced along the
//! GPU's own tokens). Meant for benchmark-shape plans with seeded weights.

use crate::engine::{CpuBackend, Session};
use crate::gpu::GpuBackend;
use crate::gpu_e2e::rel_l2;
use crate::plan::Plan;
use crate::sampler::argmax;
use anyhow::Context;
use serde::Serialize;
use std::path::Path;

#[derive(Serialize)]
pub struct DecodeReport {
    pub model: String,
    pub prompt_len: usize,
    pub steps: usize,
    pub prefill_ms: f64,
    pub decode_ms_median: f64,
    pub decode_ms_p90: f64,
    pub tokens_per_s: f64,
    pub all_logits_finite: bool,
    pub generated: Vec<u32>,
    /// relative L2 of GPU vs CPU logits at the checked positions
    pub cpu_rel_l2: Vec<f64>,
    pub cpu_argmax_equal: Vec<bool>,
}

pub fn run(plan_path: &Path, prompt_len: usize, steps: usize, cpu_steps: usize, ro: &crate::options::RuntimeOptions) -> anyhow::Result<DecodeReport> {
    let plan = Plan::open(plan_path)?;
    let graph = plan.graph()?;
    let vocab = plan.header.model.dims["vocab"].as_u64().context("dims.vocab")? as u64;
    let prompt: Vec<u32> = (0..prompt_len as u64).map(|i| (dsc_ir::seeded::splitmix64(i ^ 0x5eed) % vocab) as u32).collect();
    let kv = prompt_len + steps + 1;
    let t_load = std::time::Instant::now();
    let mut gpu = GpuBackend::new(&graph, &plan, kv, ro)?;
    gpu.synchronize()?;
    eprintln!("GPU backend ready in {:.1} s (weights generated/uploaded)", t_load.elapsed().as_secs_f64());
    let mut s = Session::new(&mut gpu);
    let t0 = std::time::Instant::now();
    let mut logits = s.feed(&prompt, false)?.pop().context("logits")?;
    let prefill_ms = t0.elapsed().as_secs_f64() * 1e3;
    let mut all_logits = vec![logits.clone()];
    let mut generated = vec![];
    let mut times = vec![];
    let mut finite = logits.iter().all(|v| v.is_finite());
    for _ in 0..steps {
        let t = argmax(&logits) as u32;
        generated.push(t);
        let t1 = std::time::Instant::now();
        logits = s.feed(&[t], false)?.pop().context("logits")?;
        times.push(t1.elapsed().as_secs_f64() * 1e3);
        finite &= logits.iter().all(|v| v.is_finite());
        if all_logits.len() <= cpu_steps {
            all_logits.push(logits.clone());
        }
    }
    drop(s);
    let mut sorted = times.clone();
    sorted.sort_by(f64::total_cmp);
    let med = sorted.get(sorted.len() / 2).copied().unwrap_or(0.0);
    let p90 = sorted.get(sorted.len() * 9 / 10).copied().unwrap_or(0.0);
    let (mut rel, mut eq) = (vec![], vec![]);
    if cpu_steps > 0 {
        drop(gpu);
        eprintln!("CPU reference for the first {cpu_steps} steps ...");
        let mut cpu = CpuBackend::new(&graph, &plan, kv)?;
        let mut cs = Session::new(&mut cpu);
        let mut c = cs.feed(&prompt, false)?.pop().context("logits")?;
        for i in 0..=cpu_steps.min(steps) {
            rel.push(rel_l2(&all_logits[i], &c));
            eq.push(argmax(&all_logits[i]) == argmax(&c));
            if i < cpu_steps.min(steps) {
                c = cs.feed(&[generated[i]], false)?.pop().context("logits")?;
            }
        }
    }
    Ok(DecodeReport {
        model: plan.header.model.name.clone(),
        prompt_len,
        steps,
        prefill_ms,
        decode_ms_median: med,
        decode_ms_p90: p90,
        tokens_per_s: if med > 0.0 { 1e3 / med } else { 0.0 },
        all_logits_finite: finite,
        generated,
        cpu_rel_l2: rel,
        cpu_argmax_equal: eq,
    })
}
