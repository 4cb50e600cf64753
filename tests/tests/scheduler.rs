//! The serving engine on the CPU backend with a real (tiny) model: continuous batching,
//! chunked prefill, preemption, prefix caching, forks, cancellation and priorities, checked
//! against solo greedy runs.

use dsc_runtime::engine::{Backend, CpuBackend, StepBatch};
use dsc_runtime::generate::{generate, GenerateOptions};
use dsc_runtime::metrics::Metrics;
use dsc_runtime::plan::Plan;
use dsc_runtime::sampler::SamplingParams;
use dsc_runtime::scheduler::{Engine, Event, GenRequest, Priority, SchedulerConfig};
use dsc_tests::*;
use proptest::prelude::*;
use std::sync::Arc;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

fn tiny_plan() -> (tempfile::TempDir, Plan) {
    let d = tempfile::tempdir().unwrap();
    write_tiny_hf(&d.path().join("hf"), &tiny_llama_hf(21));
    let c = dsc_compiler::compile(&model_toml(d.path(), "safetensors", "hf")).unwrap();
    let p = d.path().join("tiny.plan");
    dsc_compiler::write(&c, &p).unwrap();
    let plan = Plan::open(&p).unwrap();
    (d, plan)
}

fn solo(plan: &Plan, prompt: &[u32], max_tokens: usize) -> Vec<u32> {
    let g = plan.graph().unwrap();
    let mut b = CpuBackend::new(&g, plan, 64).unwrap();
    generate(&mut b, prompt, &GenerateOptions { max_tokens, sampling: SamplingParams::default(), stop_ids: vec![] }, |_| {}).unwrap().ids
}

fn request(prompt: Vec<u32>, max_tokens: usize, priority: Priority) -> (GenRequest, UnboundedReceiver<Event>) {
    let (tx, rx) = unbounded_channel();
    (GenRequest { prompt, sampling: SamplingParams::default(), max_tokens, stop_ids: vec![], stop_strings: vec![], logprobs: None, n: 1, priority, deadline: None, events: tx, constraint: None }, rx)
}

/// (token ids per choice, finish reasons per choice) from a finished request's events.
fn collect(rx: &mut UnboundedReceiver<Event>, n: usize) -> (Vec<Vec<u32>>, Vec<String>) {
    let mut ids = vec![vec![]; n];
    let mut reasons = vec![String::new(); n];
    while let Ok(e) = rx.try_recv() {
        match e {
            Event::Token { choice, id, .. } => ids[choice].push(id),
            Event::Done { choice, reason, .. } => reasons[choice] = reason,
            Event::Error(m) => panic!("request failed: {m}"),
        }
    }
    (ids, reasons)
}

fn prompt(seed: u32, len: usize) -> Vec<u32> {
    (0..len as u32).map(|i| (i * 7 + seed * 13) % 79 + 1).collect()
}

fn engine<'p>(plan: &'p Plan, g: &'p dsc_ir::Graph, kv_tokens: usize, cfg: SchedulerConfig) -> Engine<CpuBackend<'p>> {
    Engine::new(Box::new(CpuBackend::new(g, plan, kv_tokens).unwrap()), cfg, None, Arc::new(Metrics::new()))
}

#[test]
fn batched_requests_match_solo_runs_and_free_every_block() {
    let (_d, plan) = tiny_plan();
    let g = plan.graph().unwrap();
    // a small pool (forces preemption), a small step budget (forces chunked prefill)
    let cfg = SchedulerConfig { max_step_tokens: 8, max_seqs: 4, max_seq_len: 64, ..Default::default() };
    let metrics = Arc::new(Metrics::new());
    let mut e = Engine::new(Box::new(CpuBackend::new(&g, &plan, 48).unwrap()), cfg, None, metrics.clone());
    let mut rxs = vec![];
    let mut want = vec![];
    for i in 0..6u32 {
        // two pairs share a prefix (prefix cache), lengths straddle the block size
        let p = if i % 3 == 0 { prompt(1, 9 + i as usize) } else { prompt(i, 3 + 2 * i as usize) };
        want.push(solo(&plan, &p, 7));
        let (r, rx) = request(p, 7, Priority::ALL[i as usize % 3]);
        e.submit(r);
        rxs.push(rx);
    }
    e.run_to_idle().unwrap();
    for (i, rx) in rxs.iter_mut().enumerate() {
        let (ids, reasons) = collect(rx, 1);
        assert_eq!(ids[0], want[i], "request {i}: batched greedy output differs from its solo run");
        assert_eq!(reasons[0], "length");
    }
    let st = e.kv_stats();
    assert_eq!(st.used_blocks, 0, "every block back: {st:?}");
    assert!(st.prefix_hit_tokens > 0, "shared prefixes hit the cache: {st:?}");
    let text = metrics.encode();
    let preempted: f64 = text.lines().find(|l| l.starts_with("dsc_preemptions_total")).and_then(|l| l.split_whitespace().last()).unwrap().parse().unwrap();
    assert!(preempted > 0.0, "the small pool forced preemptions:\n{text}");
    assert!(text.contains("dsc_kv_blocks{state=\"used\"} 0"), "{text}");
}

#[test]
fn forks_share_the_prompt_and_copy_on_write() {
    let (_d, plan) = tiny_plan();
    let g = plan.graph().unwrap();
    let mut e = engine(&plan, &g, 64, SchedulerConfig { max_seq_len: 64, ..Default::default() });
    let p = prompt(5, 6);
    let want = solo(&plan, &p, 5);
    let (mut r, mut rx) = request(p, 5, Priority::Normal);
    r.n = 3;
    e.submit(r);
    e.run_to_idle().unwrap();
    let (ids, reasons) = collect(&mut rx, 3);
    for c in 0..3 {
        assert_eq!(ids[c], want, "greedy choice {c}");
        assert_eq!(reasons[c], "length");
    }
    let st = e.kv_stats();
    assert!(st.cow_copies >= 2, "the shared partial block was copied for the children: {st:?}");
    assert_eq!(st.used_blocks, 0);
}

#[test]
fn cancelled_requests_free_their_blocks_and_priorities_go_first() {
    let (_d, plan) = tiny_plan();
    let g = plan.graph().unwrap();
    // one sequence at a time: admission order is the priority order
    let mut e = engine(&plan, &g, 64, SchedulerConfig { max_seqs: 1, max_seq_len: 64, ..Default::default() });
    let (low, mut rx_low) = request(prompt(1, 5), 3, Priority::Low);
    let (norm, rx_norm) = request(prompt(2, 5), 3, Priority::Normal);
    let (high, mut rx_high) = request(prompt(3, 5), 3, Priority::High);
    e.submit(low);
    e.submit(norm);
    e.submit(high);
    // the client of the normal request goes away before it runs
    drop(rx_norm);
    e.step().unwrap();
    assert!(matches!(rx_high.try_recv(), Ok(Event::Token { .. })), "high priority runs first");
    assert!(rx_low.try_recv().is_err(), "low waits");
    e.run_to_idle().unwrap();
    assert_eq!(collect(&mut rx_low, 1).1[0], "length");
    assert_eq!(e.kv_stats().used_blocks, 0);
}

#[test]
fn impossible_requests_fail_clearly() {
    let (_d, plan) = tiny_plan();
    let g = plan.graph().unwrap();
    let mut e = engine(&plan, &g, 64, SchedulerConfig { max_seq_len: 64, ..Default::default() });
    let (r, mut rx) = request(prompt(1, 60), 10, Priority::Normal);
    e.submit(r);
    match rx.try_recv() {
        Ok(Event::Error(m)) => assert!(m.message.contains("exceeds the context"), "{m}"),
        other => panic!("{other:?}"),
    }
    let (mut r, mut rx) = request(prompt(1, 4), 4, Priority::Normal);
    r.sampling.top_p = 0.0;
    e.submit(r);
    assert!(matches!(rx.try_recv(), Ok(Event::Error(m)) if m.message.contains("top_p")));
    assert!(e.idle());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]
    /// Random workloads on random pool sizes: every request finishes, greedy outputs equal
    /// solo runs, no block leaks.
    #[test]
    fn any_workload_finishes_with_solo_outputs(reqs in proptest::collection::vec((0u32..4, 1usize..14, 1usize..6, 0usize..3), 1..7), kv in 24usize..64, budget in 2usize..16, seqs in 1usize..5) {
        let (_d, plan) = tiny_plan();
        let g = plan.graph().unwrap();
        let mut e = engine(&plan, &g, kv, SchedulerConfig { max_step_tokens: budget, max_seqs: seqs, max_seq_len: 64, ..Default::default() });
        let mut rxs = vec![];
        for &(s, len, gen, pr) in &reqs {
            let p = prompt(s, len);
            let (r, rx) = request(p.clone(), gen, Priority::ALL[pr]);
            e.submit(r);
            rxs.push((rx, solo(&plan, &p, gen)));
        }
        e.run_to_idle().unwrap();
        for (rx, want) in rxs.iter_mut() {
            let (ids, reasons) = collect(rx, 1);
            prop_assert_eq!(&ids[0], want);
            prop_assert_eq!(&reasons[0], "length");
        }
        prop_assert_eq!(e.kv_stats().used_blocks, 0);
    }
}

/// The CPU backend driven the way the GPU pipelines greedy decode: `launch_greedy` runs the
/// step at once but keeps its ids until `collect_greedy`, and a fed step takes its input
/// tokens from the previous launch's ids (not from the batch), as the device does.
struct Piped<'p> {
    cpu: CpuBackend<'p>,
    inflight: std::collections::VecDeque<Vec<u32>>,
    last: Vec<u32>,
    fed_steps: Arc<std::sync::atomic::AtomicUsize>,
    /// multi-step launches taken (`launch_greedy_steps`; the GPU's one graph for k steps)
    multi: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

impl Backend for Piped<'_> {
    fn step(&mut self, b: &StepBatch) -> dsc_runtime::Result<Vec<Vec<f32>>> {
        assert!(self.inflight.is_empty(), "a synchronous step overtook a pipelined one");
        self.cpu.step(b)
    }
    fn kv_geometry(&self) -> (usize, usize) {
        self.cpu.kv_geometry()
    }
    fn reset(&mut self) {
        self.cpu.reset()
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> dsc_runtime::Result<()> {
        self.cpu.copy_blocks(pairs)
    }
    fn step_greedy(&mut self, b: &StepBatch) -> dsc_runtime::Result<Vec<u32>> {
        assert!(self.inflight.is_empty(), "a synchronous step overtook a pipelined one");
        self.cpu.step_greedy(b)
    }
    fn launch_greedy(&mut self, b: &StepBatch, fed: bool) -> dsc_runtime::Result<bool> {
        let mut b = b.clone();
        if fed {
            assert_eq!(self.last.len(), b.tokens.len(), "a fed step has the previous step's rows");
            b.tokens = self.last.iter().map(|&t| t as i32).collect();
            self.fed_steps.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        let ids = self.cpu.step_greedy(&b)?;
        self.last = ids.clone();
        self.inflight.push_back(ids);
        Ok(true)
    }
    fn launch_greedy_steps(&mut self, bs: &[StepBatch]) -> dsc_runtime::Result<bool> {
        let Some(m) = &self.multi else { return Ok(false) };
        m.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for b in bs {
            // (each step one position on, the same rows)
            assert_eq!(b.positions.len(), bs[0].positions.len());
            self.launch_greedy(b, true)?;
        }
        Ok(true)
    }
    fn greedy_steps_rows(&self) -> usize {
        if self.multi.is_some() {
            usize::MAX
        } else {
            0
        }
    }
    fn collect_greedy(&mut self) -> dsc_runtime::Result<Vec<u32>> {
        Ok(self.inflight.pop_front().expect("a launched step to collect"))
    }
}

/// Five greedy requests of lengths `max_of(i)` (request 3 with a stop id mid-way) through
/// the engine on `backend`: each output equal to its solo run, the right finish reasons, and
/// every KV block back afterwards. `what` names the path in the failure messages.
fn piped_requests_match_solo_runs(plan: &Plan, backend: Piped, cfg: SchedulerConfig, max_of: impl Fn(u32) -> usize, what: &str) {
    let mut e = Engine::new(Box::new(backend), cfg, None, Arc::new(Metrics::new()));
    let mut rxs = vec![];
    let mut want = vec![];
    for i in 0..5u32 {
        let p = prompt(i + 2, 4 + i as usize);
        let max = max_of(i);
        let mut w = solo(plan, &p, max);
        let (mut r, rx) = request(p, max, Priority::ALL[i as usize % 3]);
        if i == 3 {
            // a stop id: the sequence ends at its first occurrence, included
            let stop = w[w.len() / 2];
            r.stop_ids = vec![stop];
            w.truncate(w.iter().position(|&t| t == stop).unwrap() + 1);
        }
        want.push(w);
        e.submit(r);
        rxs.push(rx);
    }
    e.run_to_idle().unwrap();
    for (i, rx) in rxs.iter_mut().enumerate() {
        let (ids, reasons) = collect(rx, 1);
        assert_eq!(ids[0], want[i], "request {i}: {what} output differs from its solo run");
        assert_eq!(reasons[0], if i == 3 { "stop" } else { "length" }, "request {i}");
    }
    assert_eq!(e.kv_stats().used_blocks, 0, "every block back");
}

#[test]
fn pipelined_greedy_decode_matches_solo_runs() {
    let (_d, plan) = tiny_plan();
    let g = plan.graph().unwrap();
    let fed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // a small pool (preemption) and step budget (chunked prefill); lengths differ so sequences
    // end at different steps (each end computes one discarded position and resyncs)
    let cfg = SchedulerConfig { max_step_tokens: 8, max_seqs: 3, max_seq_len: 64, pipeline: true, ..Default::default() };
    let backend = Piped { cpu: CpuBackend::new(&g, &plan, 48).unwrap(), inflight: Default::default(), last: vec![], fed_steps: fed.clone(), multi: None };
    piped_requests_match_solo_runs(&plan, backend, cfg, |i| 4 + 3 * i as usize, "pipelined");
    assert!(fed.load(std::sync::atomic::Ordering::Relaxed) > 5, "the decode steps ran pipelined");
}

#[test]
fn multi_step_greedy_decode_matches_solo_runs() {
    // (k = 3 fed steps per launch, `SchedulerConfig::multi_step`: the rows' positions run up
    // to k - 1 past the tokens the host knows; a stop id mid-way, lengths that leave fewer
    // than k tokens, preemption and chunked prefill as in the pipelined test)
    let (_d, plan) = tiny_plan();
    let g = plan.graph().unwrap();
    let fed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let multi = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let cfg = SchedulerConfig { max_step_tokens: 8, max_seqs: 3, max_seq_len: 64, pipeline: true, multi_step: 3, ..Default::default() };
    let backend = Piped { cpu: CpuBackend::new(&g, &plan, 64).unwrap(), inflight: Default::default(), last: vec![], fed_steps: fed, multi: Some(multi.clone()) };
    piped_requests_match_solo_runs(&plan, backend, cfg, |i| 5 + 4 * i as usize, "multi-step");
    assert!(multi.load(std::sync::atomic::Ordering::Relaxed) >= 3, "the decode ran in multi-step launches");
}
