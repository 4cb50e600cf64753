//! Tensor-parallel check on GPUs: decode a whole-model plan on GPU 0 (greedy, seeded prompt),
//! then run tensor-parallel plans of the same model teacher-forced along that continuation
//! and compare their logits at every position; time the decode steps of each.

use crate::engine::{Backend, Session};
use crate::gpu::GpuBackend;
use crate::gpu_e2e::rel_l2;
use crate::plan::Plan;
use crate::sampler::argmax;
use crate::tp::{self, GpuMode};
use anyhow::Context;
use serde::Serialize;
use std::path::{Path, PathBuf};

#[derive(Serialize)]
pub struct TpRun {
    pub plan: String,
    pub tensor_parallel: usize,
    /// "single", "nccl" (rank r on GPU r) or "local" (every rank on GPU 0, sums by copies)
    pub mode: String,
    pub decode_ms_median: f64,
    pub decode_ms_p90: f64,
    pub tokens_per_s: f64,
    pub prefill_ms: f64,
    /// against the whole-model plan, at every position (prompt end + each decode step)
    pub max_rel_l2: f64,
    pub argmax_mismatches: usize,
    pub positions: usize,
    pub bitwise_equal: bool,
    /// relative L2 at every position
    pub rel_l2: Vec<f64>,
    /// where the argmax differs: (position, the whole model's top-2 margin there)
    pub mismatches: Vec<(usize, f32)>,
}

fn decode(b: &mut dyn Backend, prompt: &[u32], forced: Option<&[u32]>, steps: usize) -> anyhow::Result<(Vec<Vec<f32>>, Vec<u32>, f64, Vec<f64>)> {
    let mut s = Session::new(b);
    let t0 = std::time::Instant::now();
    let mut logits = s.feed(prompt, false)?.pop().context("logits")?;
    let prefill = t0.elapsed().as_secs_f64() * 1e3;
    let mut all = vec![logits.clone()];
    let mut toks = vec![];
    let mut times = vec![];
    for i in 0..steps {
        let t = match forced {
            Some(f) => f[i],
            None => argmax(&logits) as u32,
        };
        toks.push(t);
        let t1 = std::time::Instant::now();
        logits = s.feed(&[t], false)?.pop().context("logits")?;
        times.push(t1.elapsed().as_secs_f64() * 1e3);
        all.push(logits.clone());
    }
    Ok((all, toks, prefill, times))
}

fn stats(times: &[f64]) -> (f64, f64) {
    let mut t = times.to_vec();
    t.sort_by(f64::total_cmp);
    (t.get(t.len() / 2).copied().unwrap_or(0.0), t.get(t.len() * 9 / 10).copied().unwrap_or(0.0))
}

/// `base`: the whole-model plan; `others`: (plan, mode) pairs to compare with it.
pub fn run(base: &Path, others: &[(PathBuf, GpuMode)], prompt_len: usize, steps: usize, ro: &crate::options::RuntimeOptions) -> anyhow::Result<Vec<TpRun>> {
    let plan = Plan::open(base)?;
    let graph = plan.graph()?;
    let vocab = plan.header.model.dims["vocab"].as_u64().context("dims.vocab")?;
    let prompt: Vec<u32> = (0..prompt_len as u64).map(|i| (dsc_ir::seeded::splitmix64(i ^ 0x5eed) % vocab) as u32).collect();
    let kv = prompt_len + steps + 1;
    let (want, toks, prefill, times) = {
        let mut g = GpuBackend::new(&graph, &plan, kv, ro)?;
        decode(&mut g, &prompt, None, steps)?
    };
    let (med, p90) = stats(&times);
    let mut runs = vec![TpRun {
        plan: base.display().to_string(),
        tensor_parallel: plan.header.tensor_parallel,
        mode: "single".into(),
        decode_ms_median: med,
        decode_ms_p90: p90,
        tokens_per_s: 1e3 / med,
        prefill_ms: prefill,
        max_rel_l2: 0.0,
        argmax_mismatches: 0,
        positions: want.len(),
        bitwise_equal: true,
        rel_l2: vec![0.0; want.len()],
        mismatches: vec![],
    }];
    let dims = plan.header.model.dims.clone();
    drop(graph);
    drop(plan);
    for (path, mode) in others {
        let plan = Plan::open(path)?;
        anyhow::ensure!(plan.header.model.dims == dims, "{} is another model than {}", path.display(), base.display());
        let graph = plan.graph()?;
        eprintln!("{}: tensor_parallel {} ({mode:?})", path.display(), plan.header.tensor_parallel);
        let (got, _, prefill, times) = tp::gpu(&graph, &plan, kv, *mode, ro, |ranks| decode(ranks, &prompt, Some(&toks), steps).map_err(|e| crate::RuntimeError::Gpu(e.to_string())))?;
        let (med, p90) = stats(&times);
        let rels: Vec<f64> = want.iter().zip(&got).map(|(a, b)| rel_l2(b, a)).collect();
        let rel = rels.iter().copied().fold(0f64, f64::max);
        let mismatches: Vec<(usize, f32)> = want.iter().zip(&got).enumerate().filter(|(_, (a, b))| argmax(a) != argmax(b)).map(|(i, (a, _))| (i, crate::generate::top2_margin(a))).collect();
        let mism = mismatches.len();
        runs.push(TpRun {
            plan: path.display().to_string(),
            tensor_parallel: plan.header.tensor_parallel,
            mode: format!("{mode:?}").to_lowercase(),
            decode_ms_median: med,
            decode_ms_p90: p90,
            tokens_per_s: 1e3 / med,
            prefill_ms: prefill,
            max_rel_l2: rel,
            argmax_mismatches: mism,
            positions: got.len(),
            bitwise_equal: want == got,
            rel_l2: rels,
            mismatches,
        });
    }
    Ok(runs)
}
