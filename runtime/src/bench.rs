//! `dsc-runtime bench`: the numbers issue 6 compares with the PyTorch peers, measured through
//! the same paths users run.
//! - decode: B sequences with 32-token seeded prompts, 128 greedy tokens each, run by the
//!   serving engine (continuous batching, paged KV); tokens/s over the decode phase (from
//!   the step after the last prefill to the end), and ms per step.
//! - prefill: one sequence of N tokens in one step (warmed up, median of 5), tokens/s.

use crate::engine::{Backend, Session};
use crate::gpu::GpuBackend;
use crate::metrics::Metrics;
use crate::options::RuntimeOptions;
use crate::plan::{BufferRef, Plan};
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
    /// ms of the step's CUDA graph replayed alone (device time, no host work; not profiling)
    #[serde(skip_serializing_if = "Option::is_none")]
    pub graph_ms: Option<f64>,
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

/// A plain greedy request of `max_tokens` tokens (no stops, normal priority).
fn greedy_request(prompt: Vec<u32>, max_tokens: usize, events: tokio::sync::mpsc::UnboundedSender<Event>) -> GenRequest {
    GenRequest { prompt, sampling: SamplingParams::default(), max_tokens, stop_ids: vec![], stop_strings: vec![], logprobs: None, n: 1, priority: Priority::Normal, deadline: None, events, constraint: None }
}

/// The engine's greedy token streams with pipelined decode (`SchedulerConfig::pipeline`)
/// against the same requests run synchronously, on the GPU: `seqs` sequences of
/// `prompt_len`-token seeded prompts, sequence s generating `new - s` tokens (so they end at
/// different steps). Ok(true) when every stream is equal and complete.
pub fn pipeline_check(plan_path: &Path, seqs: usize, prompt_len: usize, new: usize, ro: &RuntimeOptions) -> anyhow::Result<bool> {
    let plan = Plan::open(plan_path)?;
    let graph = plan.graph()?;
    let bs = plan.header.model.kv_block_size;
    let mut backend = GpuBackend::new(&graph, &plan, seqs * (prompt_len + new + bs) + 4 * bs, ro)?;
    let sync = greedy_streams(&mut backend, &plan, seqs, prompt_len, new, false, ro)?;
    let piped = greedy_streams(&mut backend, &plan, seqs, prompt_len, new, true, ro)?;
    Ok(sync == piped && sync.iter().enumerate().all(|(s, ids)| ids.len() == new.saturating_sub(s).max(1)))
}

/// The engine's greedy token streams on `backend` (of `plan`): `seqs` sequences of
/// `prompt_len`-token seeded prompts submitted at once, sequence s generating max(new - s, 1)
/// tokens.
fn greedy_streams(backend: &mut GpuBackend, plan: &Plan, seqs: usize, prompt_len: usize, new: usize, pipeline: bool, ro: &RuntimeOptions) -> anyhow::Result<Vec<Vec<u32>>> {
    let vocab = plan.header.model.dims["vocab"].as_u64().context("dims.vocab")?;
    let cfg = SchedulerConfig { max_step_tokens: seqs * prompt_len, max_seqs: seqs, max_seq_len: plan.header.model.max_seq_len, prefix_caching: false, pipeline, ..SchedulerConfig::of(ro) };
    let mut e = Engine::new(Box::new(backend), cfg, None, Arc::new(Metrics::new()));
    let mut rxs = vec![];
    for s in 0..seqs {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        e.submit(greedy_request(prompt(vocab, 77 + s as u64, prompt_len), new.saturating_sub(s).max(1), tx));
        rxs.push(rx);
    }
    e.run_to_idle()?;
    let mut got = vec![];
    for rx in &mut rxs {
        let mut ids = vec![];
        while let Ok(ev) = rx.try_recv() {
            match ev {
                Event::Token { id, .. } => ids.push(id),
                Event::Error(m) => anyhow::bail!("greedy request failed: {m}"),
                _ => {}
            }
        }
        got.push(ids);
    }
    Ok(got)
}

/// Two plans of one model (e.g. compiled with and without a fusion) on the same batched greedy
/// requests: `seqs` sequences decoding together (see [`greedy_streams`]). Returns how many of
/// the streams are equal, of `seqs`, and the first position where each unequal one differs.
pub fn compare_plans(a: &Path, b: &Path, seqs: usize, prompt_len: usize, new: usize, ro: &RuntimeOptions) -> anyhow::Result<(usize, Vec<(usize, usize)>)> {
    let mut streams = vec![];
    for p in [a, b] {
        let plan = Plan::open(p)?;
        let graph = plan.graph()?;
        let bs = plan.header.model.kv_block_size;
        let mut backend = GpuBackend::new(&graph, &plan, seqs * (prompt_len + new + bs) + 4 * bs, ro)?;
        streams.push(greedy_streams(&mut backend, &plan, seqs, prompt_len, new, true, ro)?);
    }
    let differ: Vec<(usize, usize)> =
        streams[0].iter().zip(&streams[1]).enumerate().filter(|(_, (x, y))| x != y).map(|(s, (x, y))| (s, x.iter().zip(y.iter()).take_while(|(p, q)| p == q).count())).collect();
    Ok((seqs - differ.len(), differ))
}

pub fn decode(plan_path: &Path, batches: &[usize], prompt_len: usize, new: usize, ro: &RuntimeOptions) -> anyhow::Result<Vec<DecodeResult>> {
    let plan = Plan::open(plan_path)?;
    let graph = plan.graph()?;
    let vocab = plan.header.model.dims["vocab"].as_u64().context("dims.vocab")?;
    let maxb = batches.iter().copied().max().unwrap_or(1);
    let bs = plan.header.model.kv_block_size;
    // every sequence's blocks, plus slack
    let kv = maxb * (prompt_len + new + bs) + 4 * bs;
    let backend = GpuBackend::new(&graph, &plan, kv, ro)?;
    let profiling = ro.measure.profile;
    let cfg = SchedulerConfig { max_step_tokens: (maxb * prompt_len).max(maxb), max_seqs: maxb, max_seq_len: plan.header.model.max_seq_len, prefix_caching: false, ..SchedulerConfig::of(ro) };
    // (multi-step launches, `RuntimeOptions::multi_step` = k: a warm-up long enough for a bucket's first
    // multi-step launch — after the one-step graph's first runs — so both graph instances are
    // captured before the measured run)
    let warm_new = if cfg.multi_step > 1 { 2 * cfg.multi_step + 16 } else { 3 };
    let mut e = Engine::new(Box::new(backend), cfg, None, Arc::new(Metrics::new()));
    let mut out = vec![];
    for (round, &b) in batches.iter().enumerate() {
        // a short warm-up of this batch shape (buckets, CUDA graphs), then the measured run
        for (warm, n_new) in [(true, warm_new), (false, new)] {
            let mut rxs = vec![];
            for s in 0..b {
                let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
                e.submit(greedy_request(prompt(vocab, (round * 1000 + s) as u64 + warm as u64 * 500, prompt_len), n_new, tx));
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
                // the step's device time alone (its CUDA graph replayed back to back): the rest
                // of ms/step is host work (inputs, argmax launch, reading ids, scheduling)
                let graph_us = if profiling { None } else { e.backend().graph_replay_us(b, 50)? };
                out.push(DecodeResult {
                    model: plan.header.model.name.clone(),
                    batch: b,
                    prompt: prompt_len,
                    new_tokens: n_new,
                    decode_tokens_per_s: toks as f64 / dt,
                    // (per generated token of a sequence: a pipelined run's last engine step only
                    // collects, so steps_after counts one more than the device ran)
                    ms_per_step: dt * 1e3 / (n_new - 1).max(1) as f64,
                    total_s: end.duration_since(t0).as_secs_f64(),
                    graph_ms: graph_us.map(|u| u / 1e3),
                    profile: prof,
                });
                eprintln!(
                    "decode b{b}: {:.1} tok/s, {:.2} ms/step{}",
                    toks as f64 / dt,
                    dt * 1e3 / (n_new - 1).max(1) as f64,
                    graph_us.map(|u| format!(" (graph replay alone {:.3} ms)", u / 1e3)).unwrap_or_default()
                );
            }
        }
    }
    Ok(out)
}

pub fn prefill(plan_path: &Path, lens: &[usize], ro: &RuntimeOptions) -> anyhow::Result<Vec<PrefillResult>> {
    let plan = Plan::open(plan_path)?;
    let graph = plan.graph()?;
    let vocab = plan.header.model.dims["vocab"].as_u64().context("dims.vocab")?;
    let maxl = lens.iter().copied().max().unwrap_or(1);
    let mut g = GpuBackend::new(&graph, &plan, maxl + 16, ro)?;
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

#[derive(Serialize)]
pub struct GemmResult {
    pub kernel: String,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub us: f64,
    pub tflop_s: f64,
    /// weight bytes / time, TB/s
    pub weight_tb_s: f64,
}

/// The plan's PTX loaded on GPU 0, for the kernel-level benchmarks: device-generated random
/// inputs (the plan's seeded_init kernels: nothing large is carried to the GPU machine) and
/// CUDA-event timing.
struct DeviceBench {
    module: std::sync::Arc<cudarc::driver::CudaModule>,
    stream: std::sync::Arc<cudarc::driver::CudaStream>,
    target: &'static str,
}

fn derr(what: &str) -> impl Fn(cudarc::driver::DriverError) -> anyhow::Error {
    let what = what.to_string();
    move |e| anyhow::anyhow!("{what}: {e:?}")
}

impl DeviceBench {
    fn open(prog: &crate::plan::GpuProgram) -> anyhow::Result<Self> {
        use cudarc::driver::{sys::CUdevice_attribute as A, CudaContext};
        crate::gpu::cuda_available().map_err(|e| anyhow::anyhow!("bench: {e}"))?;
        let ctx = CudaContext::new(0).map_err(|e| anyhow::anyhow!("opening GPU 0: {e:?}"))?;
        let cc = |a| ctx.attribute(a).map_err(|e| anyhow::anyhow!("device attribute: {e:?}"));
        let target = crate::gpu::target_for(cc(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?, cc(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?).context("GPU not supported (sm_80+)")?;
        let ptx = prog.ptx.get(target).with_context(|| format!("the plan has no PTX for {target}"))?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_src(ptx.clone())).map_err(|e| anyhow::anyhow!("loading the PTX: {e:?}"))?;
        Ok(DeviceBench { module, stream: ctx.default_stream(), target })
    }

    /// `numel` elements of `dtype` filled on the device (seeded_init_<dtype>, values ±0.05); for
    /// a format the plan has no device generator for (GGUF's K-quants), values from a host LCG
    /// encoded on the host and uploaded
    fn random(&self, dtype: &str, numel: usize, seed: i64) -> anyhow::Result<cudarc::driver::CudaSlice<u8>> {
        use cudarc::driver::{LaunchConfig, PushKernelArg};
        let d: dsc_ir::DType = dtype.parse().map_err(|e: String| anyhow::anyhow!(e))?;
        let Ok(f) = self.module.load_function(&format!("seeded_init_{dtype}")) else {
            let mut s = seed as u64 | 1;
            let vals: Vec<f32> = (0..numel)
                .map(|_| {
                    s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.1
                })
                .collect();
            let bytes = dsc_ir::quant::encode(d, &vals).with_context(|| format!("{numel} values do not encode as {d}"))?;
            return self.stream.clone_htod(&bytes).map_err(derr("uploading"));
        };
        let buf = self.stream.alloc_zeros::<u8>(d.bytes_for(numel).context("size")?).map_err(derr("allocating"))?;
        let (n, scale, ones, len, stride, col0) = (numel as i64, 0.05f32.to_bits() as i64, 0i64, numel as i64, 0i64, 0i64);
        let mut lb = self.stream.launch_builder(&f);
        lb.arg(&buf).arg(&n).arg(&seed).arg(&scale).arg(&ones).arg(&len).arg(&stride).arg(&col0);
        // SAFETY: seeded_init writes `numel` elements of `dtype` into `buf`, sized for them
        unsafe { lb.launch(LaunchConfig { grid_dim: ((numel as u32).div_ceil(256), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }) }.map_err(derr("seeded_init"))?;
        Ok(buf)
    }

    /// Median µs of 10 launches after 3 warm-ups (CUDA events).
    fn time(&self, launch: &dyn Fn() -> anyhow::Result<()>) -> anyhow::Result<f64> {
        let ev = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        for _ in 0..3 {
            launch()?;
        }
        let mut times = vec![];
        for _ in 0..10 {
            let a = self.stream.record_event(ev).map_err(derr("event"))?;
            launch()?;
            let b = self.stream.record_event(ev).map_err(derr("event"))?;
            b.synchronize().map_err(derr("sync"))?;
            times.push(a.elapsed_ms(&b).map_err(derr("elapsed"))? as f64 * 1e3);
        }
        times.sort_by(f64::total_cmp);
        Ok(times[times.len() / 2])
    }
}

/// Throughput of the plan's own matmul kernels, at each row count in `ms` the kernel the
/// runtime would pick for that many rows (`GpuStep::alternative`: the batched-decode GEMV for
/// 2..=128 rows, the pipelined wgmma (sm_90a) or mma.sync matmul for prefill), one per
/// distinct (kernel, rows), merged and residual matmuls included, biased ones not: x [m, K]
/// (f32, or 16-bit where the plan casts it first) and W [N, K] (the weight's dtype) generated
/// on the device; median of 10 timed launches after 3 warm-ups, CUDA events. 2·m·N·K FLOP per
/// launch; `weight_tb_s` is the weight bytes over the time (the decode roofline's measure).
pub fn gemm(plan_path: &Path, ms: &[usize]) -> anyhow::Result<Vec<GemmResult>> {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let plan = Plan::open(plan_path)?;
    let graph = plan.graph()?;
    let prog = plan.header.gpu.as_ref().context("the plan has no GPU program")?;
    let dev = DeviceBench::open(prog)?;
    let hopper = dev.target == "sm_90a";
    let mut seen = std::collections::BTreeSet::new();
    let mut out = vec![];
    for s in &prog.steps {
        // (steps of no graph node: the casts to 16 bits)
        let Some(node) = graph.by_name(&s.node) else { continue };
        let ops = graph.operands(node);
        // the weights (one, or a merged matmul's parts) and whether a residual comes after
        // them; matmuls with a bias are left out
        let (weights, residual) = match graph.node(node).op {
            dsc_ir::Op::MatMul { .. } if ops.len() == 2 => (vec![ops[1]], false),
            dsc_ir::Op::MatMulAdd { .. } if ops.len() == 3 => (vec![ops[1]], true),
            dsc_ir::Op::MatMulCat => (ops[1..].to_vec(), false),
            _ => continue,
        };
        let ws: Vec<&dsc_ir::Node> = weights.iter().map(|&w| graph.node(w)).collect();
        let k = ws[0].ty.shape[1].as_const().context("weight dims")?;
        let parts: Vec<usize> = ws.iter().map(|w| w.ty.shape[0].as_const().context("weight dims")).collect::<anyhow::Result<_>>()?;
        let n: usize = parts.iter().sum();
        let wdtype = ws[0].ty.dtype;
        for &m in ms {
            let Some(l) = s.alternative(m as i64, hopper) else { continue };
            if !seen.insert((l.kernel.clone(), m)) {
                continue;
            }
            let f = dev.module.load_function(&l.kernel).map_err(derr(&l.kernel))?;
            crate::gpu::allow_smem(&f, l.smem.unwrap_or(0), l.carveout).map_err(derr(&l.kernel))?;
            // (x in 16 bits where the plan casts it first: the `{x}@bf16` buffer)
            let x16 = l.args.as_ref().and_then(|a| a.first()).is_some_and(|x| match BufferRef::of(x) {
                BufferRef::ActivationMap { x, .. } => matches!(BufferRef::of(x), BufferRef::Half { .. }),
                r => matches!(r, BufferRef::Half { .. }),
            });
            let xdtype = match (x16, wdtype) {
                (false, _) => "f32",
                (true, dsc_ir::DType::F16) => "f16",
                (true, _) => "bf16",
            };
            // (split-K: the kernel writes S partial sums, `{node}@splitk{S}`, and the step's
            // reduce pass adds them and the residual into y: both timed)
            let split = l.args.as_ref().and_then(|a| a.last()).and_then(|y| match BufferRef::of(y) {
                BufferRef::SplitK { parts, .. } => Some(parts),
                _ => None,
            });
            let reduce = match split {
                Some(_) => {
                    let r = prog.steps.iter().find(|r| r.node == s.node && r.kernel.as_deref().is_some_and(|k| k.starts_with("splitk_reduce"))).context("a split-K matmul without its reduce step")?;
                    let k = r.kernel.clone().expect("found by its kernel");
                    // (the step's own launch over M·N elements)
                    let (gx, gy, threads) =
                        r.launch.dims((m * n) as u32, 1, r.block, 1, r.threads.unwrap_or(128)).with_context(|| format!("{k}: launch kind none"))?;
                    let cfg = LaunchConfig { grid_dim: (gx, gy, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 };
                    Some((dev.module.load_function(&k).map_err(derr(&k))?, k, cfg))
                }
                None => None,
            };
            // (the FP8 GEMM reads x's e4m3 copy, `{x}@rows{W}`: W f32 slots a row of codes and
            // scales; random words time the same)
            let x = match l.args.as_ref().and_then(|a| a.first()).map(|x| BufferRef::of(x)) {
                Some(BufferRef::RowScratch { width, .. }) => dev.random("f32", m * width, 11)?,
                _ => dev.random(xdtype, m * k, 11)?,
            };
            let wbs: Vec<_> = parts.iter().enumerate().map(|(i, &p)| dev.random(&wdtype.to_string(), p * k, 12 + i as i64)).collect::<anyhow::Result<_>>()?;
            // (a TMA matmul takes each weight's tensor map instead: `{w}@tmap{rows}`)
            let wbs = match l.args.as_ref().and_then(|a| a.get(1)).map(|w| BufferRef::of(w)) {
                Some(BufferRef::WeightMap { rows, .. }) => wbs
                    .iter()
                    .zip(&parts)
                    .map(|(wb, &p)| crate::gpu::weight_tensor_map(&dev.stream, wb, p, k, wdtype == dsc_ir::DType::F16, rows).map_err(|e| anyhow::anyhow!("{}: {e}", l.kernel)))
                    .collect::<anyhow::Result<Vec<_>>>()?,
                _ => wbs,
            };
            // (a warp-specialized matmul takes x's tensor map too: `{x}@xmap{rows}`)
            let xmap = match l.args.as_ref().and_then(|a| a.first()).map(|x| BufferRef::of(x)) {
                Some(BufferRef::ActivationMap { rows, .. }) => Some(crate::gpu::weight_tensor_map(&dev.stream, &x, m, k, xdtype == "f16", rows).map_err(|e| anyhow::anyhow!("{}: {e}", l.kernel))?),
                _ => None,
            };
            // (the SwiGLU epilogue, `SwiGluPipe`: h [M, F] f32 and its 16-bit copy instead of y)
            let swiglu = l.kernel.contains("_swiglu");
            let res = if residual { Some(dev.random("f32", m * n, 20)?) } else { None };
            let y = dev.stream.alloc_zeros::<u8>(m * n * 4 * split.unwrap_or(1)).map_err(derr("allocating y"))?;
            let y2 = dev.stream.alloc_zeros::<u8>(if split.is_some() { m * n * 4 } else { 4 }).map_err(derr("allocating y"))?;
            let (mm, nn) = (m as i64, n as i64);
            let fh = nn / 2;
            let yh = dev.stream.alloc_zeros::<u8>(if swiglu { m * n } else { 4 }).map_err(derr("allocating y"))?;
            let work = match &l.work {
                crate::plan::Scalar::Const(v) => *v as u32,
                other => anyhow::bail!("{}: unexpected work {other:?}", l.kernel),
            };
            let (gx, gy, threads) =
                l.launch.dims(work, m as u32, l.block, l.rows_per_block, l.threads.unwrap_or(128)).with_context(|| format!("{}: launch kind none", l.kernel))?;
            let cfg = LaunchConfig { grid_dim: (gx, gy, 1), block_dim: (threads, 1, 1), shared_mem_bytes: l.smem.unwrap_or(0) };
            let launch = || -> anyhow::Result<()> {
                let mut lb = dev.stream.launch_builder(&f);
                lb.arg(xmap.as_ref().unwrap_or(&x));
                for wb in &wbs {
                    lb.arg(wb);
                }
                if let (Some(r), None) = (&res, split) {
                    lb.arg(r);
                }
                if swiglu {
                    // (h in y's first half of bytes, its copy in y2's place: y holds M·N f32)
                    lb.arg(&y).arg(&yh).arg(&mm).arg(&fh);
                } else {
                    lb.arg(&y).arg(&mm).arg(&nn);
                    if parts.len() > 1 {
                        lb.arg(&mm);
                    }
                }
                // SAFETY: every matmul alternative takes (x, w.., [res], y, M, N, [M]) with
                // x [M, K] (f32 or the 16-bit copy; or its tensor map), w_i [N_i, K] (or their
                // maps), res and y [M, N] f32 (KernelSpec docs); split-K: no res, y [S, M, N];
                // SwiGLU: (x, w_gate, w_up, h [M, N/2] f32, h16 [M, N/2], M, N/2)
                unsafe { lb.launch(cfg) }.map_err(derr(&l.kernel))?;
                if let Some((rf, rk, rcfg)) = &reduce {
                    let numel = (m * n) as i64;
                    let mut lb = dev.stream.launch_builder(rf);
                    lb.arg(&y);
                    if let Some(r) = &res {
                        lb.arg(r);
                    }
                    lb.arg(&y2).arg(&numel);
                    // SAFETY: splitk_reduce(parts [S, M, N], [res [M, N]], y [M, N], M·N), one
                    // element per thread
                    unsafe { lb.launch(*rcfg) }.map_err(derr(rk))?;
                }
                Ok(())
            };
            let us = dev.time(&launch)?;
            let tflop_s = 2.0 * (m * n * k) as f64 / (us * 1e-6) / 1e12;
            let weight_tb_s = wdtype.bytes_for(n * k).unwrap_or(0) as f64 / (us * 1e-6) / 1e12;
            eprintln!("{:<48} {m:>6} x {n:>6} x {k:>6}: {us:>10.1} us {tflop_s:>8.1} TFLOP/s {weight_tb_s:>6.2} TB/s of weights", l.kernel);
            out.push(GemmResult { kernel: l.kernel.clone(), m, n, k, us, tflop_s, weight_tb_s });
        }
    }
    Ok(out)
}

#[derive(Serialize)]
pub struct AttentionResult {
    pub kernel: String,
    /// "prefill" (T tokens of one sequence, causal), "decode" (one token at `context`, the
    /// one-pass kernel) or "decode-split" (the same through the split decode attention)
    pub kind: String,
    pub tokens: usize,
    pub context: usize,
    pub us: f64,
    /// torch's count for causal SDPA (4·H·T²·D/2) for prefill, 4·H·context·D for decode
    pub tflop_s: f64,
    /// K/V bytes the kernel reads (every q head reads its KV head's rows) per second
    pub kv_gb_s: f64,
}

/// The plan's paged attention kernel on its own: causal prefill of `prefill` tokens of one
/// sequence (positions 0..T, K/V already in the pool), and one decode token at each of
/// `contexts`; q and the pools random on the device, a block table of consecutive blocks.
/// Beside torch's `scaled_dot_product_attention` (torch_kernels.py).
pub fn attention(plan_path: &Path, prefill: &[usize], contexts: &[usize]) -> anyhow::Result<Vec<AttentionResult>> {
    use cudarc::driver::{LaunchConfig, PushKernelArg};
    let plan = Plan::open(plan_path)?;
    let graph = plan.graph()?;
    let prog = plan.header.gpu.as_ref().context("the plan has no GPU program")?;
    // (not the one-token kernel that also applies RoPE and writes the cache: `_rope`, other args)
    let paged = |s: &&crate::plan::GpuStep| s.kernel.as_deref().is_some_and(|k| k.starts_with("paged_attention") && !k.contains("_rope"));
    // the one-pass kernel, and (for long contexts) the split one: a first pass into
    // `{node}@split{S}`, then the merge step
    let split_of = |s: &crate::plan::GpuStep| match BufferRef::of(&s.node) {
        BufferRef::SplitParts { node, parts } => Some((node.to_string(), parts)),
        _ => None,
    };
    let step = prog.steps.iter().filter(paged).find(|s| split_of(s).is_none()).context("the plan has no paged attention step")?;
    let kernel = step.kernel.clone().expect("found by its kernel");
    let base = step.node.as_str();
    let split_step = prog.steps.iter().filter(paged).find(|s| split_of(s).is_some_and(|(b, _)| b == base));
    let node = graph.by_name(base).with_context(|| format!("step {} has no graph node", step.node))?;
    let ops = graph.operands(node);
    let dim = |id: dsc_ir::NodeId, i: usize| graph.node(id).ty.shape[i].as_const().with_context(|| format!("{} needs constant dims", graph.node(id).name));
    let (h, d, bs, kvh) = (dim(ops[0], 1)?, dim(ops[0], 2)?, dim(ops[1], 1)?, dim(ops[1], 2)?);
    // (the pools' type: f32 or bf16)
    let kv = graph.node(ops[1]).ty.dtype;
    let kv_size = kv.bytes_for(1).context("KV pool type")?;
    let dev = DeviceBench::open(prog)?;
    let f = dev.module.load_function(&kernel).map_err(derr(&kernel))?;
    // (split: (parts, first-pass kernel and function, merge kernel and function))
    let split = match split_step {
        Some(sp) => {
            let (_, ns) = split_of(sp).expect("found by its name");
            let merge = prog.steps.iter().find(|s| s.node == base && s.kernel.as_deref().is_some_and(|k| k.starts_with("attention_combine"))).context("the split attention has no merge step")?;
            let (k1, k2) = (sp.kernel.clone().expect("found by its kernel"), merge.kernel.clone().expect("found by its kernel"));
            let (f1, f2) = (dev.module.load_function(&k1).map_err(derr(&k1))?, dev.module.load_function(&k2).map_err(derr(&k2))?);
            Some((ns, sp, k1, f1, k2, f2))
        }
        None => None,
    };
    // the prefill kernel (FlashAttention tiles) where the plan has one: used from its rows on
    // (on sm_90a its Hopper alternative where there is one: the wgmma kernel)
    let hopper_flash = step.hopper.iter().filter(|_| dev.target == "sm_90a").find(|l| l.kernel.starts_with("flash_attention"));
    let flash = match hopper_flash.or(step.large.as_ref()) {
        Some(l) => {
            let ff = dev.module.load_function(&l.kernel).map_err(derr(&l.kernel))?;
            crate::gpu::allow_smem(&ff, l.smem.unwrap_or(0), l.carveout).map_err(derr(&l.kernel))?;
            Some((l, ff))
        }
        None => None,
    };
    let i32s = |v: Vec<i32>| -> anyhow::Result<cudarc::driver::CudaSlice<i32>> { dev.stream.clone_htod(&v).map_err(derr("upload")) };
    // (decode: the one-pass kernel at every context, and the split one beside it)
    let mut cases: Vec<(&str, usize, usize)> = prefill.iter().map(|&t| ("prefill", t, t)).collect();
    for &c in contexts {
        cases.push(("decode", 1, c));
        if split.is_some() {
            cases.push(("decode-split", 1, c));
        }
    }
    let mut out = vec![];
    for (kind, t, ctx) in cases {
        let mb = ctx.div_ceil(bs);
        let q = dev.random("f32", t * h * d, 31)?;
        let kc = dev.random(&kv.to_string(), mb * bs * kvh * d, 32)?;
        let vc = dev.random(&kv.to_string(), mb * bs * kvh * d, 33)?;
        let pos = i32s((0..t).map(|i| (ctx - t + i) as i32).collect())?;
        let seq = i32s(vec![0; t])?;
        let table = i32s((0..mb as i32).collect())?;
        let y = dev.stream.alloc_zeros::<f32>(t * h * d).map_err(derr("allocating out"))?;
        let big = flash.as_ref().filter(|(l, _)| (t * h) as i64 >= l.min_rows);
        // (the wgmma kernel with TMA tiles takes the pools' tensor maps: `{pool}@kvmap{rows}`)
        let kv_maps = match big.and_then(|(l, _)| l.args.as_ref()).and_then(|a| a.get(1)).map(|a| BufferRef::of(a)) {
            Some(BufferRef::PoolMap { rows, .. }) => {
                let map = |p: &cudarc::driver::CudaSlice<u8>| crate::gpu::pool_tensor_map(&dev.stream, p, [mb, bs, kvh, d], rows).map_err(|e| anyhow::anyhow!("{kernel}: {e}"));
                Some((map(&kc)?, map(&vc)?))
            }
            _ => None,
        };
        let (kc_arg, vc_arg) = kv_maps.as_ref().map_or((&kc, &vc), |(k, v)| (k, v));
        // (a block launch's grid from its step: a block per row (T·H) in older plans, per
        // (token, KV head) since session 9)
        let grid = |s: &crate::plan::Scalar| -> anyhow::Result<u32> {
            Ok(match s {
                crate::plan::Scalar::Const(c) => *c as u32,
                crate::plan::Scalar::Rows(_) => (t * h) as u32,
                crate::plan::Scalar::Dim(_, 0) => t as u32,
                other => anyhow::bail!("the decode attention's grid {other:?} is not one bench-attention knows"),
            })
        };
        let split_pass = split.as_ref().filter(|_| kind == "decode-split");
        let (kernel, f, n, cfg) = match (big, split_pass) {
            // (a block per head x 64 tokens; n = T)
            (Some((l, ff)), _) => (
                l.kernel.clone(),
                ff,
                t as i64,
                // (grid x: heads over the heads per block, `block`)
                LaunchConfig {
                    grid_dim: ((h as u32).div_ceil(l.block.max(1)), (t as u32).div_ceil(l.rows_per_block), 1),
                    block_dim: (l.threads.unwrap_or(128), 1, 1),
                    shared_mem_bytes: l.smem.unwrap_or(0),
                },
            ),
            (None, Some((_, sp, k1, f1, _, _))) => {
                (k1.clone(), f1, (t * h) as i64, LaunchConfig { grid_dim: (grid(&sp.work)?, grid(&sp.grid_y)?, 1), block_dim: (32 * sp.block, 1, 1), shared_mem_bytes: 0 })
            }
            (None, None) => (kernel.clone(), &f, (t * h) as i64, LaunchConfig { grid_dim: (grid(&step.work)?, grid(&step.grid_y)?, 1), block_dim: (32 * step.block, 1, 1), shared_mem_bytes: 0 }),
        };
        let mbs = mb as i64;
        // (split: the partial states, then the merge into y)
        let split_pass = split_pass.filter(|_| big.is_none());
        let part = dev.stream.alloc_zeros::<f32>(split_pass.map_or(1, |m| t * h * m.0 * (d + 2))).map_err(derr("allocating the partial states"))?;
        let launch = || -> anyhow::Result<()> {
            let mut lb = dev.stream.launch_builder(f);
            // (a kernel that prefetches the next matmul's weights, `_pf`: 0 bytes of q, the
            // attention alone)
            let pf = kernel.ends_with("_pf");
            if pf {
                lb.arg(&q);
            }
            lb.arg(&q).arg(kc_arg).arg(vc_arg).arg(&pos).arg(&seq).arg(&table);
            if split_pass.is_some() {
                lb.arg(&part);
            } else {
                lb.arg(&y);
            }
            lb.arg(&n).arg(&mbs);
            if pf {
                lb.arg(&0i64);
            }
            // SAFETY: paged_attention(q [T,H,D], k/v pools [MB*BS, KVH, D], pos, seq, table
            // [1, MB] (i32), out [T,H,D] or the split's partial states [T*H*S*(D+2)], T*H, MB):
            // every position < MB*BS is in the table
            unsafe { lb.launch(cfg) }.map_err(derr(&kernel))?;
            if let Some((_, _, _, _, mk, mf)) = split_pass {
                let mut lb = dev.stream.launch_builder(mf);
                lb.arg(&part).arg(&pos).arg(&y).arg(&n);
                // SAFETY: attention_combine(partial states [T*H*S*(D+2)], pos [T], out
                // [T,H,D], T*H): a warp per row, 4 rows per block
                unsafe { lb.launch(LaunchConfig { grid_dim: (((t * h) as u32).div_ceil(4), 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 }) }.map_err(derr(mk))?;
            }
            Ok(())
        };
        let us = dev.time(&launch)?;
        let (flops, kv_bytes) =
            if kind == "prefill" { (4.0 * (h * t * t * d) as f64 / 2.0, (h * (t * (t + 1) / 2) * 2 * d * kv_size) as f64) } else { (4.0 * (h * ctx * d) as f64, (h * ctx * 2 * d * kv_size) as f64) };
        let (tflop_s, kv_gb_s) = (flops / (us * 1e-6) / 1e12, kv_bytes / (us * 1e-6) / 1e9);
        eprintln!("{kernel:<40} {kind:<8} T {t:>6} context {ctx:>6}: {us:>10.1} us {tflop_s:>8.2} TFLOP/s {kv_gb_s:>8.0} GB/s of K/V");
        out.push(AttentionResult { kernel: kernel.clone(), kind: kind.to_string(), tokens: t, context: ctx, us, tflop_s, kv_gb_s });
    }
    Ok(out)
}
