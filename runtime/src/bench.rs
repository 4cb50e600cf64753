//! `dsc-runtime bench`: the numbers issue 6 compares with the PyTorch peers, measured through
//! the same paths users run.
//! - decode: B sequences with 32-token seeded prompts, 128 greedy tokens each, run by the
//!   serving engine (continuous batching, paged KV); tokens/s over the decode phase (from
//!   the step after the last prefill to the end), and ms per step.
//! - prefill: one sequence of N tokens in one step (warmed up, median of 5), tokens/s.

use crate::engine::{Backend, Session};
use crate::gpu::GpuBackend;
use crate::metrics::Metrics;
use crate::plan::Plan;
use crate::sampler::SamplingParams;
use crate::scheduler::{Engine, Event, GenRequest, Priority, SchedulerConfig};
use anyhow::Context;
use serde::Serialize;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

#[derive(Serialize)]
pub struct DecodeResult {
    pub model: String,
    pub batch: usize,
    pub prompt: usize,
    pub new_tokens: usize,
    pub decode_tokens_per_s: f64,
    pub ms_per_step: f64,
    pub total_s: f64,
    /// DSC_PROFILE=1: (kernel, launches per step, µs per step), largest first
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub profile: Vec<(String, f64, f64)>,
}

#[derive(Serialize)]
pub struct PrefillResult {
    pub model: String,
    pub tokens: usize,
    pub ms: f64,
    pub tokens_per_s: f64,
}

fn prompt(vocab: u64, seed: u64, len: usize) -> Vec<u32> {
    (0..len as u64).map(|i| (dsc_ir::seeded::splitmix64((seed << 20) ^ i ^ 0x5eed) % vocab) as u32).collect()
}

pub fn decode(plan_path: &Path, batches: &[usize], prompt_len: usize, new: usize) -> anyhow::Result<Vec<DecodeResult>> {
    let plan = Plan::open(plan_path)?;
    let graph = plan.graph()?;
    let vocab = plan.header.model.dims["vocab"].as_u64().context("dims.vocab")?;
    let maxb = batches.iter().copied().max().unwrap_or(1);
    let bs = plan.header.model.kv_block_size;
    // every sequence's blocks, plus slack
    let kv = maxb * (prompt_len + new + bs) + 4 * bs;
    let backend = GpuBackend::new(&graph, &plan, kv)?;
    let profiling = std::env::var_os("DSC_PROFILE").is_some();
    let cfg = SchedulerConfig { max_step_tokens: (maxb * prompt_len).max(maxb), max_seqs: maxb, max_seq_len: plan.header.model.max_seq_len, prefix_caching: false, ..Default::default() };
    let mut e = Engine::new(Box::new(backend), cfg, None, Arc::new(Metrics::new()));
    let mut out = vec![];
    for (round, &b) in batches.iter().enumerate() {
        // a short warm-up of this batch shape (buckets, CUDA graphs), then the measured run
        for (warm, n_new) in [(true, 3usize), (false, new)] {
            let mut rxs = vec![];
            for s in 0..b {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                e.submit(GenRequest {
                    prompt: prompt(vocab, (round * 1000 + s) as u64 + warm as u64 * 500, prompt_len),
                    sampling: SamplingParams::default(),
                    max_tokens: n_new,
                    stop_ids: vec![],
                    stop_strings: vec![],
                    logprobs: None,
                    n: 1,
                    priority: Priority::Normal,
                    deadline: None,
                    events: tx,
                });
                rxs.push(rx);
            }
            let t0 = Instant::now();
            e.backend().take_profile();
            let mut first_all: Option<Instant> = None;
            let mut steps_after = 0usize;
            while !e.idle() {
                e.step()?;
                if first_all.is_some() {
                    steps_after += 1;
                } else if rxs.iter_mut().all(|r| !r.is_empty()) {
                    // every sequence has its first token: prefill is over
                    first_all = Some(Instant::now());
                    e.backend().take_profile();
                }
            }
            let end = Instant::now();
            for rx in &mut rxs {
                while let Ok(ev) = rx.try_recv() {
                    if let Event::Error(m) = ev {
                        anyhow::bail!("bench request failed: {m}");
                    }
                }
            }
            if !warm {
                // the profile covers the decode steps (reset when prefill ended)
                let prof: Vec<(String, f64, f64)> = if profiling {
                    let steps = steps_after.max(1) as f64;
                    e.backend().take_profile().into_iter().take(12).map(|(k, n, us)| (k, n as f64 / steps, us / steps)).collect()
                } else {
                    vec![]
                };
                for (k, n, us) in &prof {
                    eprintln!("  {us:>10.1} us/step {n:>6.1} launches/step  {k}");
                }
                let fa = first_all.context("no tokens")?;
                let dt = end.duration_since(fa).as_secs_f64();
                let toks = b * (n_new - 1);
                out.push(DecodeResult {
                    model: plan.header.model.name.clone(),
                    batch: b,
                    prompt: prompt_len,
                    new_tokens: n_new,
                    decode_tokens_per_s: toks as f64 / dt,
                    ms_per_step: dt * 1e3 / steps_after.max(1) as f64,
                    total_s: end.duration_since(t0).as_secs_f64(),
                    profile: prof,
                });
                eprintln!("decode b{b}: {:.1} tok/s, {:.2} ms/step", toks as f64 / dt, dt * 1e3 / steps_after.max(1) as f64);
            }
        }
    }
    Ok(out)
}

pub fn prefill(plan_path: &Path, lens: &[usize]) -> anyhow::Result<Vec<PrefillResult>> {
    let plan = Plan::open(plan_path)?;
    let graph = plan.graph()?;
    let vocab = plan.header.model.dims["vocab"].as_u64().context("dims.vocab")?;
    let maxl = lens.iter().copied().max().unwrap_or(1);
    let mut g = GpuBackend::new(&graph, &plan, maxl + 16)?;
    let mut out = vec![];
    for &n in lens {
        let p = prompt(vocab, 7, n);
        let mut times = vec![];
        for _ in 0..6 {
            let mut s = Session::new(&mut g as &mut dyn Backend);
            let t = Instant::now();
            s.feed(&p, false)?;
            times.push(t.elapsed().as_secs_f64());
        }
        // the first run allocates the step's buffers: drop it
        let mut t = times[1..].to_vec();
        t.sort_by(f64::total_cmp);
        let med = t[t.len() / 2];
        eprintln!("prefill {n}: {:.1} ms, {:.0} tok/s", med * 1e3, n as f64 / med);
        out.push(PrefillResult { model: plan.header.model.name.clone(), tokens: n, ms: med * 1e3, tokens_per_s: n as f64 / med });
    }
    Ok(out)
}
