//! The serving engine: continuous (in-flight) batching over one backend.
//!
//! Every step the scheduler builds one [`StepBatch`] from
//! 1. the running sequences: one token each in decode, or the next chunk of a prompt
//!    (chunked prefill under the per-step token budget);
//! 2. new sequences admitted from the waiting queues: priority classes in order, each class
//!    behind a token-bucket limiter (the DeepSeek serving articles' way of keeping
//!    high-priority tail latency under load); a sequence that has waited longer than the
//!    starvation bound is admitted first whatever its class, so nothing starves.
//! When KV blocks run out, the lowest-priority, most recently arrived running sequence is
//! preempted: its blocks are freed and it goes back to the head of its queue, to be recomputed
//! (its prefix usually comes back from the prefix cache). Clients that disconnect are dropped
//! at the next step and their blocks freed; requests past their queue timeout or deadline fail
//! with a timeout ([`FailKind::Timeout`]). A finished request ends `stop` or `length`.
//!
//! The engine owns the backend and runs on its own thread ([`spawn`]); requests arrive on a
//! channel and results leave on each request's own channel, token by token. One request's own
//! work (queuing it, sampling and detokenizing its tokens, its stop strings) runs under
//! `catch_unwind`: a panic there fails that request alone. A failed step fails the requests in
//! flight and the engine goes on; [`crate::health`] says when it cannot.
//!
//! Pipelined greedy decode (`SchedulerConfig::pipeline`; the GPU backend supports it, the CPU
//! backend runs synchronously): a step where every sequence decodes one plain-greedy token is
//! launched without waiting (`Backend::launch_greedy`: argmax into a device id buffer, async copy of
//! the ids to pinned memory, an event); the next engine step launches the same rows again, their
//! input tokens copied on the device from those ids (`fed`), and only then collects and emits the
//! previous step's tokens (`collect_greedy`), so the host's work runs under the device's. The
//! engine keeps the rows of the step in flight in `Engine::pending`; for those sequences
//! `computed` == their tokens' length (the pending token's position). It resyncs — collects, then
//! schedules afresh — whenever the rows would change: a row ends by length, a sequence ended or
//! left, a request could be admitted, a preemption is needed, a row is no longer plain greedy. A
//! row ended by a stop token has one discarded position computed; its blocks may be freed while
//! that step runs, safely, because every later use of them is behind it on the same stream.

use crate::engine::{Backend, MoeStats, StepBatch};
use crate::error::{Result, RuntimeError};
use crate::kv::{BlockManager, KvStats, SeqBlocks};
use crate::metrics::{BlockState, ExpertLabel, LayerLabel, Metrics, PriorityLabel};
use crate::sampler::{logprobs, Sampler, SamplingParams};
use crate::tokenizer::Tokenizer;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Priority {
    High = 0,
    Normal = 1,
    Low = 2,
}

impl Priority {
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];
    pub fn name(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
    pub fn parse(s: &str) -> Option<Priority> {
        match s {
            "high" => Some(Priority::High),
            "normal" => Some(Priority::Normal),
            "low" => Some(Priority::Low),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct SchedulerConfig {
    /// tokens per step (prefill chunks + decodes)
    pub max_step_tokens: usize,
    /// sequences per step (the plan's max_batch)
    pub max_seqs: usize,
    /// tokens a sequence may reach (prompt + generated), the plan's max_seq_len
    pub max_seq_len: usize,
    pub prefix_caching: bool,
    /// admitted prompt tokens per second per class (None = unlimited) and burst size
    pub rate: [Option<(f64, f64)>; 3],
    /// a sequence waiting longer than this is admitted before any other
    pub starvation: Duration,
    /// a request still waiting after this long ends with `timeout`
    pub queue_timeout: Duration,
    /// pipelined greedy decoding where the backend supports it (the GPU): while the device
    /// runs step N, the host emits step N-1's tokens and prepares step N+1, whose input tokens
    /// the device takes from step N's argmax itself, so the device never waits for the host.
    /// A sequence that ends at step N has one more (discarded) position computed. Default on;
    /// DSC_NO_PIPELINE=1 turns it off
    pub pipeline: bool,
    /// pipelined greedy steps launched at once (as one CUDA graph on the GPU: the steps chained
    /// under PDL, no graph launch or input kernel between them): up to this many positions of
    /// the same rows, each fed the previous one's token on the device, where every row is
    /// greedy and nothing waits for admission; 1: one step at a time
    /// (`RuntimeOptions::multi_step`; [`crate::options::MULTI_STEP`] by default)
    pub multi_step: usize,
    /// `MeasureOptions::kv_first_block`: the block manager hands out blocks from this one on
    pub kv_first_block: usize,
    /// when a step in flight counts as stalled ([`crate::health`])
    pub watchdog: crate::health::Watchdog,
}

impl SchedulerConfig {
    /// The defaults with the run-time options' pipelining, multi-step k and KV block start.
    pub fn of(ro: &crate::options::RuntimeOptions) -> Self {
        SchedulerConfig { pipeline: ro.pipeline, multi_step: ro.multi_step, kv_first_block: ro.measure.kv_first_block, ..Default::default() }
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            max_step_tokens: 512,
            max_seqs: 32,
            max_seq_len: 2048,
            prefix_caching: true,
            rate: [None, None, None],
            starvation: Duration::from_secs(10),
            queue_timeout: Duration::from_secs(600),
            pipeline: true,
            multi_step: crate::options::MULTI_STEP,
            kv_first_block: 0,
            watchdog: Default::default(),
        }
    }
}

/// What a client asks for (already tokenized and validated).
pub struct GenRequest {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    /// generation stops after any of these ids (EOS ids and the client's stop tokens)
    pub stop_ids: Vec<u32>,
    /// generation stops where the text contains one of these (not included in the output)
    pub stop_strings: Vec<String>,
    /// top alternatives to report with each token's log-probability (None = no logprobs)
    pub logprobs: Option<usize>,
    /// independent completions of the prompt (share its KV blocks; copy-on-write)
    pub n: usize,
    pub priority: Priority,
    pub deadline: Option<Instant>,
    pub events: UnboundedSender<Event>,
    /// structured output: the grammar each sampled token must follow (`crate::structured`)
    pub constraint: Option<crate::structured::Constraint>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    Token {
        choice: usize,
        id: u32,
        /// new text since the previous event (may be empty while a multi-byte character or a
        /// possible stop string is pending)
        text: String,
        logprob: Option<(f32, Vec<(u32, f32)>)>,
    },
    Done {
        choice: usize,
        /// stop or length (OpenAI's finish reasons; anything else ends as an [`Event::Error`])
        reason: String,
        /// text held back at the end (released once no stop string can match)
        text: String,
        prompt_tokens: usize,
        completion_tokens: usize,
        cached_tokens: usize,
    },
    /// the request failed (after any tokens already sent): a bad request, a timeout, or a
    /// failure inside the engine, which goes on
    Error(Failure),
}

/// Why a request failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FailKind {
    /// it can never run as asked (HTTP 400)
    BadRequest,
    /// past its `timeout` or the queue timeout (HTTP 408)
    Timeout,
    /// the engine failed while running it (a panic or a failed step; HTTP 500); other
    /// requests go on
    Server,
    /// the engine cannot take it now (HTTP 503)
    Unavailable,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub kind: FailKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: FailKind, message: impl Into<String>) -> Self {
        Failure { kind, message: message.into() }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// How a sequence ended.
#[derive(Clone, Debug, PartialEq)]
enum End {
    Stop,
    Length,
    /// the client went away: nobody to tell
    Cancelled,
    Failed(Failure),
}

impl End {
    fn label(&self) -> &'static str {
        match self {
            End::Stop => "stop",
            End::Length => "length",
            End::Cancelled => "cancelled",
            End::Failed(f) if f.kind == FailKind::Timeout => "timeout",
            End::Failed(_) => "error",
        }
    }
}

/// A panic's message, for the request it failed.
pub fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned()).unwrap_or_else(|| "panic".into())
}

enum Command {
    Submit(Box<GenRequest>),
    /// expert failover: (layer, expert, enabled); the reply is the disabled list after it
    SetExpert(usize, usize, bool, std::sync::mpsc::Sender<Result<Vec<(usize, usize)>>>),
    DisabledExperts(std::sync::mpsc::Sender<Result<Vec<(usize, usize)>>>),
    Shutdown,
}

struct ReqInfo {
    events: UnboundedSender<Event>,
    sampling: SamplingParams,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    stop_strings: Vec<String>,
    logprobs: Option<usize>,
    priority: Priority,
    arrival: Instant,
    deadline: Option<Instant>,
    prompt_len: usize,
}

struct Seq {
    req: Arc<ReqInfo>,
    choice: usize,
    /// prompt + generated
    tokens: Vec<u32>,
    /// tokens whose KV is written
    computed: usize,
    blocks: SeqBlocks,
    sampler: Sampler,
    /// children to fork once the prompt is done (n > 1)
    forks: usize,
    /// text sent so far
    sent: String,
    /// the generated text so far (stop tokens excluded), built incrementally
    text: String,
    detok: crate::tokenizer::Detokenizer,
    cached: usize,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    /// arrival in its queue (for starvation), reset on preemption
    queued: Instant,
    /// structured output's grammar state (this choice's own)
    constraint: Option<crate::structured::Constraint>,
}

impl Seq {
    fn generated(&self) -> &[u32] {
        &self.tokens[self.req.prompt_len..]
    }

    /// The next token is the argmax of the raw logits (nothing else needs them).
    fn greedy_only(&self) -> bool {
        let p = &self.req.sampling;
        (p.temperature == 0.0 || p.top_k == 1)
            && p.repetition_penalty == 1.0
            && p.frequency_penalty == 0.0
            && p.presence_penalty == 0.0
            && p.logit_bias.is_empty()
            && self.req.logprobs.is_none()
            && self.constraint.is_none()
    }
}

/// Row `row` of a step batch: the sequence's `n` positions from `from` (their input
/// tokens, or 0 where the device feeds them: `fed`), and its block table padded to `mb`.
#[allow(clippy::too_many_arguments)]
fn push_row(b: &mut StepBatch, s: &Seq, row: usize, from: usize, n: usize, fed: bool, bs: usize, mb: usize) {
    for p in from..from + n {
        b.tokens.push(if fed { 0 } else { s.tokens[p] as i32 });
        b.positions.push(p as i32);
        b.seq_ids.push(row as i32);
        b.slots.push((s.blocks.blocks[p / bs] as usize * bs + p % bs) as i32);
    }
    let mut t: Vec<i32> = s.blocks.blocks.iter().map(|&x| x as i32).collect();
    t.resize(mb, 0);
    b.block_table.extend(t);
}

/// How a sequence's next token is chosen: sampled from its logits row, or already chosen.
#[derive(Clone, Copy)]
enum Pick<'a> {
    Logits(&'a [f32]),
    Token(u32),
}

struct Bucket {
    tokens: f64,
    rate: f64,
    burst: f64,
    at: Instant,
}

pub struct Engine<B: Backend + ?Sized> {
    backend: Box<B>,
    bm: BlockManager,
    cfg: SchedulerConfig,
    tok: Option<Arc<Tokenizer>>,
    metrics: Arc<Metrics>,
    seqs: HashMap<u64, Seq>,
    next_id: u64,
    waiting: [VecDeque<u64>; 3],
    running: Vec<u64>,
    buckets: [Option<Bucket>; 3],
    pool_blocks: usize,
    /// the backend's MoE routing counts the metrics last saw
    moe_seen: Option<MoeStats>,
    gen_window: VecDeque<(Instant, usize)>,
    /// the sequences, in row order, of the pipelined greedy step in flight (launched, its
    /// token ids not yet collected); each has `computed` == its tokens' length, the pending
    /// token's position
    pending: Option<Vec<u64>>,
    /// the steps in flight over those rows (more than 1: `SchedulerConfig::multi_step`)
    pending_steps: usize,
}

impl<B: Backend + ?Sized> Engine<B> {
    pub fn new(backend: Box<B>, cfg: SchedulerConfig, tok: Option<Arc<Tokenizer>>, metrics: Arc<Metrics>) -> Self {
        let (blocks, bs) = backend.kv_geometry();
        let now = Instant::now();
        let buckets = cfg.rate.map(|r| r.map(|(rate, burst)| Bucket { tokens: burst, rate, burst, at: now }));
        Engine {
            backend,
            bm: BlockManager::new(blocks, bs, cfg.prefix_caching).starting_at(cfg.kv_first_block),
            cfg,
            tok,
            metrics,
            seqs: HashMap::new(),
            next_id: 0,
            waiting: Default::default(),
            running: vec![],
            buckets,
            pool_blocks: blocks,
            moe_seen: None,
            gen_window: VecDeque::new(),
            pending: None,
            pending_steps: 1,
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn kv_stats(&self) -> KvStats {
        self.bm.stats()
    }

    pub fn idle(&self) -> bool {
        self.pending.is_none() && self.running.is_empty() && self.waiting.iter().all(|w| w.is_empty())
    }

    /// Queue a request; errors (reported on its channel) when it can never run.
    pub fn submit(&mut self, r: GenRequest) {
        let fail = |m: String| {
            let _ = r.events.send(Event::Error(Failure::new(FailKind::BadRequest, m)));
        };
        if r.prompt.is_empty() {
            return fail("the prompt is empty".into());
        }
        if r.prompt.len() + r.max_tokens > self.cfg.max_seq_len {
            return fail(format!("prompt ({}) + max_tokens ({}) exceeds the context ({} tokens)", r.prompt.len(), r.max_tokens, self.cfg.max_seq_len));
        }
        let bs = self.bm.block_size();
        if (r.prompt.len() + r.max_tokens).div_ceil(bs) > self.pool_blocks {
            return fail(format!("the request needs more KV blocks than the pool holds ({})", self.pool_blocks));
        }
        let sampler = match Sampler::new(r.sampling.clone()) {
            Ok(s) => s,
            Err(e) => return fail(e.to_string()),
        };
        let now = Instant::now();
        let info = Arc::new(ReqInfo {
            events: r.events,
            sampling: r.sampling,
            max_tokens: r.max_tokens,
            stop_ids: r.stop_ids,
            stop_strings: r.stop_strings,
            logprobs: r.logprobs,
            priority: r.priority,
            arrival: now,
            deadline: r.deadline,
            prompt_len: r.prompt.len(),
        });
        self.metrics.prompt_tokens.inc_by(r.prompt.len() as u64);
        let id = self.next_id;
        self.next_id += 1;
        self.seqs.insert(
            id,
            Seq {
                req: info,
                choice: 0,
                tokens: r.prompt,
                computed: 0,
                blocks: SeqBlocks::default(),
                sampler,
                forks: r.n.max(1) - 1,
                sent: String::new(),
                text: String::new(),
                detok: Default::default(),
                cached: 0,
                first_token: None,
                last_token: None,
                queued: now,
                constraint: r.constraint,
            },
        );
        self.waiting[r.priority as usize].push_back(id);
    }

    fn finish(&mut self, id: u64, end: End, tail: String) {
        if let Some(s) = self.seqs.remove(&id) {
            self.running.retain(|&r| r != id);
            for w in &mut self.waiting {
                w.retain(|&r| r != id);
            }
            let reason = end.label();
            let _ = s.req.events.send(match end {
                End::Failed(f) => Event::Error(f),
                _ => Event::Done { choice: s.choice, reason: reason.into(), text: tail, prompt_tokens: s.req.prompt_len, completion_tokens: s.generated().len(), cached_tokens: s.cached },
            });
            self.bm.release(s.blocks);
            self.metrics.finished(reason);
            if reason != "cancelled" {
                self.metrics.e2e.observe(s.req.arrival.elapsed().as_secs_f64());
            }
        }
    }

    /// Fail one request alone: it gets the error, its blocks go back, the others go on.
    fn fail(&mut self, id: u64, f: Failure) {
        self.finish(id, End::Failed(f), String::new());
    }

    /// Fail every request the engine holds (a failed step: their state on the device is
    /// unknown), dropping any pipelined step in flight.
    pub fn fail_all(&mut self, why: &str) {
        self.pending = None;
        self.pending_steps = 1;
        self.backend.discard_inflight();
        let ids: Vec<u64> = self.seqs.keys().copied().collect();
        for id in ids {
            self.metrics.engine_failure("step");
            self.fail(id, Failure::new(FailKind::Server, why));
        }
        self.update_gauges();
    }

    /// Queue a request; a panic while doing so fails that request alone.
    pub fn submit_isolated(&mut self, r: GenRequest) {
        let events = r.events.clone();
        if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.submit(r))) {
            self.metrics.engine_failure("panic");
            let m = panic_message(&*p);
            tracing::error!(target: "dsc::engine", "a request failed while queued: {m}");
            let _ = events.send(Event::Error(Failure::new(FailKind::Server, format!("internal error while queuing the request: {m}"))));
        }
    }

    /// Drop cancelled requests (client gone) and end those past their timeouts.
    fn expire(&mut self) {
        let now = Instant::now();
        let ids: Vec<u64> = self.seqs.keys().copied().collect();
        for id in ids {
            let s = &self.seqs[&id];
            let waiting = !self.running.contains(&id);
            if s.req.events.is_closed() {
                self.finish(id, End::Cancelled, String::new());
            } else if s.req.deadline.is_some_and(|d| now >= d) {
                self.fail(id, Failure::new(FailKind::Timeout, "the request ran past its `timeout`"));
            } else if waiting && s.first_token.is_none() && now.duration_since(s.req.arrival) > self.cfg.queue_timeout {
                self.fail(id, Failure::new(FailKind::Timeout, format!("the request waited in the queue past the server's queue timeout ({} s)", self.cfg.queue_timeout.as_secs_f64())));
            }
        }
    }

    fn refill(&mut self) {
        let now = Instant::now();
        for b in self.buckets.iter_mut().flatten() {
            b.tokens = (b.tokens + b.rate * now.duration_since(b.at).as_secs_f64()).min(b.burst);
            b.at = now;
        }
    }

    /// Preempt running sequence `v`: free its blocks, back to the head of its queue (it
    /// is recomputed when admitted again).
    fn preempt(&mut self, v: u64) {
        self.running.retain(|&r| r != v);
        let s = self.seqs.get_mut(&v).expect("running sequence");
        let blocks = std::mem::take(&mut s.blocks);
        s.computed = 0;
        s.queued = Instant::now();
        let p = s.req.priority as usize;
        self.bm.release(blocks);
        self.waiting[p].push_front(v);
        self.metrics.preemptions.inc();
    }

    fn rank(&self, id: u64) -> (Priority, Instant) {
        let s = &self.seqs[&id];
        (s.req.priority, s.req.arrival)
    }

    /// Pick the next waiting sequence to admit: one past the starvation bound first, then by
    /// class, skipping classes whose token bucket is empty.
    fn next_waiting(&self) -> Option<(usize, u64)> {
        let now = Instant::now();
        let starving = (0..3)
            .filter_map(|c| self.waiting[c].front().map(|&id| (c, id)))
            .filter(|(_, id)| now.duration_since(self.seqs[id].queued) > self.cfg.starvation)
            .min_by_key(|(_, id)| self.seqs[id].queued);
        if starving.is_some() {
            return starving;
        }
        (0..3).find_map(|c| {
            let id = *self.waiting[c].front()?;
            match &self.buckets[c] {
                Some(b) if b.tokens <= 0.0 => None,
                _ => Some((c, id)),
            }
        })
    }

    /// One scheduling step and its backend step. Returns false when there was nothing to do.
    pub fn step(&mut self) -> Result<bool> {
        self.expire();
        self.refill();
        if let Some(rows) = self.pending.take() {
            let inflight = std::mem::replace(&mut self.pending_steps, 1);
            // the same rows once more, each fed its pending token on the device (k positions
            // at once with `multi_step`); then, while that runs, the previous launch's tokens
            // are emitted
            let k = self.cfg.multi_step;
            let mut launched = None;
            if k > 1 && rows.len() <= self.backend.greedy_steps_rows() {
                if let Some(bs) = self.pipelined_batches(&rows, k, inflight)? {
                    if self.backend.launch_greedy_steps(&bs)? {
                        launched = Some(k);
                    }
                }
            }
            if launched.is_none() {
                if let Some(b) = self.pipelined_batch(&rows, inflight)? {
                    if self.backend.launch_greedy(&b, true)? {
                        launched = Some(1);
                    }
                }
            }
            self.settle_inflight(&rows, inflight)?;
            if let Some(n) = launched {
                self.metrics.steps.inc_by(n as u64);
                // (rows that ended in `settle` are gone: their positions are discarded)
                for &id in &rows {
                    self.computed(id, n);
                }
                self.pending = Some(rows);
                self.pending_steps = n;
                self.update_gauges();
                return Ok(true);
            }
        }
        let mut budget = self.cfg.max_step_tokens;
        let mut sched: Vec<(u64, usize)> = vec![];
        let mut copies = vec![];
        // 1. running sequences, highest priority first (decodes are one token each)
        let mut order = self.running.clone();
        order.sort_by_key(|r| (self.seqs[r].req.priority, self.seqs[r].req.arrival));
        for id in order {
            if budget == 0 || !self.running.contains(&id) {
                continue;
            }
            let s = &self.seqs[&id];
            let n = (s.tokens.len() - s.computed).min(budget);
            loop {
                let s = self.seqs.get_mut(&id).expect("running");
                match self.bm.grow(&mut s.blocks, s.computed, s.computed + n) {
                    Ok(c) => {
                        copies.extend(c);
                        sched.push((id, n));
                        budget -= n;
                        break;
                    }
                    Err(_) => {
                        // free blocks from the least important other sequence not yet in this
                        // step; if that one matters more than this one, this one yields
                        let victim = self.running.iter().copied().filter(|&r| r != id && !sched.iter().any(|x| x.0 == r)).max_by_key(|&r| self.rank(r));
                        match victim {
                            Some(v) if self.rank(v) > self.rank(id) => self.preempt(v),
                            _ => {
                                self.preempt(id);
                                break;
                            }
                        }
                    }
                }
            }
        }
        // 2. admissions
        while budget > 0 && self.running.len() < self.cfg.max_seqs {
            let Some((c, id)) = self.next_waiting() else { break };
            let s = self.seqs.get_mut(&id).expect("waiting sequence");
            if s.blocks.blocks.is_empty() && s.computed == 0 {
                let (b, hit) = self.bm.start(&s.tokens);
                s.blocks = b;
                s.computed = hit;
                if s.first_token.is_none() {
                    s.cached = hit;
                    self.metrics.prefix_hit_tokens.inc_by(hit as u64);
                }
            }
            let n = (s.tokens.len() - s.computed).min(budget);
            match self.bm.grow(&mut s.blocks, s.computed, s.computed + n) {
                Ok(c2) => {
                    copies.extend(c2);
                    self.waiting[c].pop_front();
                    if s.first_token.is_none() && s.computed == s.cached {
                        self.metrics.queue_time.observe(s.req.arrival.elapsed().as_secs_f64());
                    }
                    if let Some(b) = &mut self.buckets[c] {
                        b.tokens -= n as f64;
                    }
                    self.running.push(id);
                    sched.push((id, n));
                    budget -= n;
                }
                Err(_) => {
                    // hand the prefix blocks back; wait for running sequences to finish
                    let b = std::mem::take(&mut s.blocks);
                    s.computed = 0;
                    self.bm.release(b);
                    break;
                }
            }
        }
        self.update_gauges();
        if sched.is_empty() {
            return Ok(false);
        }
        if !copies.is_empty() {
            self.backend.copy_blocks(&copies)?;
        }
        // 3. the batch
        let bs = self.bm.block_size();
        let mb = sched.iter().map(|(id, _)| self.seqs[id].blocks.blocks.len()).max().unwrap_or(1).max(1);
        let mut b = StepBatch { num_seqs: sched.len(), max_blocks: mb, ..Default::default() };
        let mut wants = vec![];
        for (row, &(id, n)) in sched.iter().enumerate() {
            let s = &self.seqs[&id];
            push_row(&mut b, s, row, s.computed, n, false, bs, mb);
            if s.computed + n == s.tokens.len() {
                b.logit_rows.push(b.tokens.len() as i32 - 1);
                wants.push(id);
            }
        }
        // plain greedy rows (no penalties, no logprobs) are decided on the device: only the
        // token ids come back instead of the logits
        let greedy = wants.iter().all(|id| self.seqs[id].greedy_only());
        let (logits, tokens) = if b.logit_rows.is_empty() {
            // a step of prompt chunks only: run it, no logits needed but the graph wants one row
            b.logit_rows.push(0);
            self.backend.step_greedy(&b)?;
            (vec![], vec![])
        } else if greedy {
            // one token per sequence, each wanting its next: this step can start a pipeline
            let decode = b.tokens.len() == sched.len() && b.logit_rows.len() == sched.len() && sched.iter().all(|(id, _)| self.seqs[id].forks == 0);
            if self.cfg.pipeline && decode && self.backend.launch_greedy(&b, false)? {
                self.metrics.steps.inc();
                for &(id, n) in &sched {
                    self.computed(id, n);
                }
                self.pending = Some(wants);
                self.update_gauges();
                return Ok(true);
            }
            (vec![], self.backend.step_greedy(&b)?)
        } else {
            (self.backend.step(&b)?, vec![])
        };
        self.metrics.steps.inc();
        for &(id, n) in &sched {
            self.computed(id, n);
        }
        if greedy {
            for (id, t) in wants.into_iter().zip(tokens) {
                self.sample_isolated(id, Pick::Token(t));
            }
        } else {
            for (id, row) in wants.into_iter().zip(logits) {
                self.sample_isolated(id, Pick::Logits(&row));
            }
        }
        self.update_gauges();
        Ok(true)
    }

    /// The next pipelined step over the same rows (each at its pending token's position, the
    /// token itself fed on the device), or None when the step must be scheduled afresh: a
    /// sequence ended, left or stopped being plain greedy, a waiting request could be
    /// admitted, or the KV pool needs a preemption.
    fn pipelined_batch(&mut self, rows: &[u64], inflight: usize) -> Result<Option<StepBatch>> {
        Ok(self.pipelined_batches(rows, 1, inflight)?.and_then(|b| b.into_iter().next()))
    }

    /// Collect and emit the `steps` pipelined steps in flight over `rows`, oldest first.
    fn settle_inflight(&mut self, rows: &[u64], steps: usize) -> Result<()> {
        for _ in 0..steps {
            let ids = self.backend.collect_greedy()?;
            self.settle(rows, ids);
        }
        Ok(())
    }

    /// `k` pipelined steps over the same rows at once (positions computed .. computed + k,
    /// each fed on the device; [`Engine::pipelined_batch`]'s one for k = 1), or None as there,
    /// or where a row has fewer than k tokens left to its limits (a row whose pending tokens
    /// reach its length limit ends there: resync instead of computing positions nobody wants;
    /// a stop token or string still ends a row mid-way: its later positions are computed for
    /// nothing, as a pipelined step's are). `inflight`: the steps of the launch before, whose
    /// tokens are not settled yet.
    fn pipelined_batches(&mut self, rows: &[u64], k: usize, inflight: usize) -> Result<Option<Vec<StepBatch>>> {
        let admissible = self.running.len() < self.cfg.max_seqs && self.waiting.iter().any(|w| !w.is_empty());
        if admissible || self.running.len() != rows.len() || rows.len() > self.cfg.max_step_tokens {
            return Ok(None);
        }
        let running: std::collections::HashSet<u64> = self.running.iter().copied().collect();
        // (the tokens after this launch: the settled ones, the launch before's, these k)
        let room = |s: &Seq| s.generated().len() + inflight + k <= s.req.max_tokens && s.computed + k < self.cfg.max_seq_len;
        if !rows.iter().all(|id| running.contains(id) && self.seqs[id].greedy_only() && self.seqs[id].forks == 0 && room(&self.seqs[id])) {
            return Ok(None);
        }
        let mut copies = vec![];
        for &id in rows {
            let s = self.seqs.get_mut(&id).expect("running");
            match self.bm.grow(&mut s.blocks, s.computed, s.computed + k) {
                Ok(c) => copies.extend(c),
                Err(_) => return Ok(None),
            }
        }
        if !copies.is_empty() {
            self.backend.copy_blocks(&copies)?;
        }
        let bs = self.bm.block_size();
        let mb = rows.iter().map(|id| self.seqs[id].blocks.blocks.len()).max().unwrap_or(1).max(1);
        let batches = (0..k)
            .map(|i| {
                let mut b = StepBatch { num_seqs: rows.len(), max_blocks: mb, ..Default::default() };
                for (row, id) in rows.iter().enumerate() {
                    let s = &self.seqs[id];
                    push_row(&mut b, s, row, s.computed + i, 1, true, bs, mb);
                    b.logit_rows.push(row as i32);
                }
                b
            })
            .collect();
        Ok(Some(batches))
    }

    /// A step computed `n` more positions of the sequence (if it still exists): advance it and
    /// register its newly filled blocks in the prefix cache (as far as its tokens are known: a
    /// multi-step launch computes positions whose input tokens the host has not seen yet).
    fn computed(&mut self, id: u64, n: usize) {
        if let Some(s) = self.seqs.get_mut(&id) {
            s.computed += n;
            let known = s.computed.min(s.tokens.len());
            self.bm.commit(&mut s.blocks, &s.tokens[..known]);
        }
    }

    /// Emit a collected pipelined step's tokens (rows whose sequence ended or was dropped
    /// since are skipped: that position was computed for nothing).
    fn settle(&mut self, rows: &[u64], ids: Vec<u32>) {
        for (&id, t) in rows.iter().zip(ids) {
            if self.seqs.contains_key(&id) {
                self.sample_isolated(id, Pick::Token(t));
            }
        }
    }

    /// [`Engine::sample`], where a panic (a bug met by one request's text, sampling parameters
    /// or stop strings) fails that request alone with a server error and the engine goes on.
    fn sample_isolated(&mut self, id: u64, pick: Pick) {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.sample(id, pick)));
        if let Err(p) = r {
            let m = panic_message(&*p);
            tracing::error!(target: "dsc::engine", "request failed inside the engine: {m}");
            self.metrics.engine_failure("panic");
            // (its forks, if it had any, are separate sequences that carry on)
            self.fail(id, Failure::new(FailKind::Server, format!("internal error while generating: {m}")));
        }
    }

    fn sample(&mut self, id: u64, logits: Pick) {
        // n > 1: fork the children off the finished prompt (shared blocks), each samples
        let forks = std::mem::take(&mut self.seqs.get_mut(&id).expect("seq").forks);
        let mut ids = vec![id];
        for k in 1..=forks {
            let s = &self.seqs[&id];
            let blocks = self.bm.fork(&s.blocks);
            let mut p = s.req.sampling.clone();
            p.seed = p.seed.wrapping_add(k as u64);
            let child = Seq {
                req: s.req.clone(),
                choice: k,
                tokens: s.tokens.clone(),
                computed: s.computed,
                blocks,
                sampler: Sampler::new(p).expect("validated"),
                forks: 0,
                sent: String::new(),
                text: String::new(),
                detok: Default::default(),
                cached: s.cached,
                first_token: None,
                last_token: None,
                queued: s.queued,
                constraint: s.constraint.as_ref().map(|c| c.fork()),
            };
            let cid = self.next_id;
            self.next_id += 1;
            self.seqs.insert(cid, child);
            self.running.push(cid);
            ids.push(cid);
        }
        for id in ids {
            self.emit(id, logits);
        }
    }

    fn emit(&mut self, id: u64, pick: Pick) {
        let now = Instant::now();
        let s = self.seqs.get_mut(&id).expect("seq");
        let mut failed = None;
        let (t, logits) = match (pick, &mut s.constraint) {
            (Pick::Logits(l), Some(c)) => {
                // structured output: only what the grammar allows next
                let mut masked = l.to_vec();
                let r = c.mask(&mut masked);
                let t = s.sampler.sample_with(&masked, &s.tokens[..s.req.prompt_len], &s.tokens[s.req.prompt_len..]);
                failed = r.and_then(|_| c.consume(t)).err();
                (t, Some(l))
            }
            (Pick::Logits(l), None) => (s.sampler.sample_with(l, &s.tokens[..s.req.prompt_len], &s.tokens[s.req.prompt_len..]), Some(l)),
            (Pick::Token(t), _) => (t, None),
        };
        if let Some(e) = failed {
            self.fail(id, Failure::new(FailKind::Server, e));
            return;
        }
        // (the grammar complete: the sequence ends with this token)
        let grammar_done = s.constraint.as_ref().is_some_and(|c| c.done());
        s.tokens.push(t);
        match s.last_token {
            None => self.metrics.ttft.observe(now.duration_since(s.req.arrival).as_secs_f64()),
            Some(prev) => self.metrics.itl.observe(now.duration_since(prev).as_secs_f64()),
        }
        s.first_token.get_or_insert(now);
        s.last_token = Some(now);
        self.metrics.generation_tokens.inc();
        self.gen_window.push_back((now, 1));
        let lp = match (s.req.logprobs, logits) {
            (Some(top), Some(l)) => Some(logprobs(l, t, top)),
            _ => None,
        };
        let stop_id = s.req.stop_ids.contains(&t);
        let done_len = s.generated().len() >= s.req.max_tokens || s.tokens.len() >= self.cfg.max_seq_len || grammar_done;
        // text: the generated text grows by what the new token adds (incremental
        // detokenization: a short window, not the whole generation, is decoded per token);
        // hold back what may still become a stop string or is an incomplete character
        let old_len = s.text.len();
        if let Some(tk) = &self.tok {
            let gen = &s.tokens[s.req.prompt_len..];
            // a stop token ends the stream and is not text
            let gen = if stop_id { &gen[..gen.len() - 1] } else { gen };
            let piece = if stop_id || done_len { s.detok.flush(tk, gen) } else { s.detok.step(tk, gen) };
            s.text.push_str(&piece);
        }
        let text = &s.text;
        let finished_by_token = stop_id || done_len;
        let sc = crate::stop::scan(text, old_len, &s.req.stop_strings, finished_by_token);
        let visible = &text[..sc.stop_at.unwrap_or(text.len())];
        let stop_at = sc.stop_at;
        let finished = finished_by_token || stop_at.is_some();
        let safe = sc.safe;
        let delta = if visible.starts_with(&s.sent) && safe >= s.sent.len() { visible[s.sent.len()..safe].to_string() } else { String::new() };
        s.sent.push_str(&delta);
        let choice = s.choice;
        let _ = s.req.events.send(Event::Token { choice, id: t, text: delta, logprob: lp });
        if finished {
            let tail = if visible.starts_with(&s.sent) { visible[s.sent.len()..].to_string() } else { String::new() };
            let end = if stop_id || stop_at.is_some() || grammar_done { End::Stop } else { End::Length };
            self.finish(id, end, tail);
        }
    }

    /// Expert failover (see [`EngineHandle::set_expert`]).
    pub fn set_expert(&mut self, layer: usize, expert: usize, enabled: bool) -> Result<Vec<(usize, usize)>> {
        self.backend.set_expert(layer, expert, enabled)?;
        let disabled = self.backend.moe_stats().map(|s| s.disabled).unwrap_or_default();
        self.metrics.moe_disabled_experts.set(disabled.len() as i64);
        tracing::warn!(target: "dsc::engine", "expert {expert} of layer {layer} {}; disabled now: {disabled:?}", if enabled { "enabled" } else { "disabled" });
        Ok(disabled)
    }

    /// The routed experts disabled now; an error for a dense plan.
    pub fn disabled_experts(&self) -> Result<Vec<(usize, usize)>> {
        self.backend.moe_stats().map(|s| s.disabled).ok_or_else(|| RuntimeError::Request("this plan has no routed experts".into()))
    }

    /// Bring the MoE metrics up to the backend's routing counts.
    fn update_moe_metrics(&mut self) {
        let Some(s) = self.backend.moe_stats() else { return };
        let last = self.moe_seen.get_or_insert_with(|| MoeStats { tokens: vec![0; s.tokens.len()], ..Default::default() });
        let m = &self.metrics;
        for (row, &layer) in s.layers.iter().enumerate() {
            let counts = &s.tokens[row * s.experts..(row + 1) * s.experts];
            for (e, &n) in counts.iter().enumerate() {
                let d = n.saturating_sub(last.tokens.get(row * s.experts + e).copied().unwrap_or(0));
                if d > 0 {
                    m.moe_expert_tokens.get_or_create(&ExpertLabel { layer: layer.to_string(), expert: e.to_string() }).inc_by(d);
                }
            }
            let total: u64 = counts.iter().sum();
            if total > 0 {
                let max = *counts.iter().max().unwrap_or(&0) as f64;
                m.moe_imbalance.get_or_create(&LayerLabel { layer: layer.to_string() }).set(max / (total as f64 / s.experts as f64));
            }
        }
        m.moe_masked_selections.inc_by(s.masked_selections.saturating_sub(last.masked_selections));
        *last = s;
    }

    fn update_gauges(&mut self) {
        self.update_moe_metrics();
        let m = &self.metrics;
        for p in Priority::ALL {
            m.queue_depth.get_or_create(&PriorityLabel { priority: p.name().into() }).set(self.waiting[p as usize].len() as i64);
        }
        m.running.set(self.running.len() as i64);
        let st = self.bm.stats();
        for (k, v) in [("used", st.used_blocks), ("cached", st.cached_blocks), ("free", st.free_blocks)] {
            m.kv_blocks.get_or_create(&BlockState { state: k.into() }).set(v as i64);
        }
        if st.prefix_query_tokens > 0 {
            m.prefix_hit_ratio.set(st.prefix_hit_tokens as f64 / st.prefix_query_tokens as f64);
        }
        let now = Instant::now();
        while self.gen_window.front().is_some_and(|(t, _)| now.duration_since(*t) > Duration::from_secs(1)) {
            self.gen_window.pop_front();
        }
        m.tokens_per_second.set(self.gen_window.iter().map(|x| x.1).sum::<usize>() as f64);
    }

    /// Run every queued request to completion (tests and batch jobs).
    pub fn run_to_idle(&mut self) -> Result<()> {
        while !self.idle() {
            self.step()?;
        }
        self.update_gauges();
        Ok(())
    }
}

/// The handle the server keeps: submit requests, stop the engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: std::sync::mpsc::Sender<Command>,
    pub metrics: Arc<Metrics>,
    pub health: Arc<crate::health::Health>,
}

impl EngineHandle {
    /// Hand a request to the engine; an error when the engine cannot serve (stopped, unable to
    /// go on, or stalled).
    pub fn submit(&self, r: GenRequest) -> Result<()> {
        self.health.status().map_err(|why| RuntimeError::Request(format!("the engine is unavailable: {why}")))?;
        self.tx.send(Command::Submit(Box::new(r))).map_err(|_| RuntimeError::Request("the engine has stopped".into()))
    }
    pub fn shutdown(&self) {
        let _ = self.tx.send(Command::Shutdown);
    }
    /// The routed experts disabled now, as (layer, expert); an error for a dense plan.
    pub fn disabled_experts(&self) -> Result<Vec<(usize, usize)>> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx.send(Command::DisabledExperts(tx)).map_err(|_| RuntimeError::Request("the engine has stopped".into()))?;
        rx.recv().map_err(|_| RuntimeError::Request("the engine stopped before it answered".into()))?
    }
    /// Expert failover: enable or disable a routed expert from the next step on; returns the
    /// experts disabled after it, as (layer, expert). Blocks until the engine is between steps.
    pub fn set_expert(&self, layer: usize, expert: usize, enabled: bool) -> Result<Vec<(usize, usize)>> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.tx.send(Command::SetExpert(layer, expert, enabled, tx)).map_err(|_| RuntimeError::Request("the engine has stopped".into()))?;
        rx.recv().map_err(|_| RuntimeError::Request("the engine stopped before it answered".into()))?
    }
    pub fn alive(&self) -> bool {
        self.health.alive()
    }
    /// Ok while the engine serves ([`crate::health::Health::status`]).
    pub fn status(&self) -> std::result::Result<(), String> {
        self.health.status()
    }
}

/// The engine's loop, handed to the code that builds the backend: call [`EngineLoop::run`]
/// with it (that code may keep the backend inside a scope, e.g. tensor-parallel rank threads).
pub struct EngineLoop {
    rx: std::sync::mpsc::Receiver<Command>,
    ready: std::sync::mpsc::Sender<Result<()>>,
    cfg: SchedulerConfig,
    tok: Option<Arc<Tokenizer>>,
    metrics: Arc<Metrics>,
    health: Arc<crate::health::Health>,
}

impl EngineLoop {
    /// Serve requests on `backend` until shutdown and every accepted request has finished.
    pub fn run<B: Backend>(self, backend: B) -> Result<()> {
        let _ = self.ready.send(Ok(()));
        let rx = self.rx;
        let health = self.health;
        let mut e = Engine::new(Box::new(backend), self.cfg, self.tok, self.metrics);
        let mut stopping = false;
        let mut failed_steps = 0usize;
        loop {
            // take everything that arrived; block only when there is nothing to run
            loop {
                let cmd = if e.idle() && !stopping {
                    match rx.recv() {
                        Ok(c) => c,
                        Err(_) => return Ok(()),
                    }
                } else {
                    match rx.try_recv() {
                        Ok(c) => c,
                        Err(std::sync::mpsc::TryRecvError::Empty) => break,
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                            stopping = true;
                            break;
                        }
                    }
                };
                match cmd {
                    Command::Submit(r) => e.submit_isolated(*r),
                    Command::SetExpert(layer, expert, on, reply) => {
                        let _ = reply.send(e.set_expert(layer, expert, on));
                    }
                    Command::DisabledExperts(reply) => {
                        let _ = reply.send(e.disabled_experts());
                    }
                    Command::Shutdown => stopping = true,
                }
            }
            if stopping && e.idle() {
                return Ok(());
            }
            health.step_started();
            // a failed step (backend error or a panic outside one request's own work) fails
            // the requests in flight with a server error; the engine goes on. After
            // FATAL_AFTER in a row it reports that it cannot (the liveness probe restarts it).
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.step()));
            health.step_ended();
            let err = match r {
                Ok(Ok(_)) => {
                    failed_steps = 0;
                    continue;
                }
                Ok(Err(err)) => err.to_string(),
                Err(p) => format!("panic: {}", panic_message(&*p)),
            };
            tracing::error!(target: "dsc::engine", "step failed: {err}");
            failed_steps += 1;
            // (health first: whoever hears of the failure then sees the engine as it is)
            if failed_steps >= crate::health::FATAL_AFTER {
                health.set_fatal(format!("{failed_steps} engine steps failed in a row (last: {err})"));
            }
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| e.fail_all(&format!("engine step failed: {err}"))));
            if r.is_err() {
                health.set_fatal(format!("the engine could not recover from a failed step (last: {err})"));
                // the engine's own state is in doubt: stop (the handle then reports it dead)
                return Err(RuntimeError::Request(format!("the engine could not recover from a failed step: {err}")));
            }
        }
    }
}

/// Start the engine on its own thread. `start` builds the backend there (GPU contexts are per
/// thread) and hands it to the loop; the thread ends after `shutdown` once every accepted
/// request has finished.
pub fn spawn(
    start: impl FnOnce(EngineLoop) -> Result<()> + Send + 'static,
    cfg: SchedulerConfig,
    tok: Option<Arc<Tokenizer>>,
    metrics: Arc<Metrics>,
) -> Result<(EngineHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::channel::<Command>();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
    let health = crate::health::Health::new(cfg.watchdog, metrics.clone());
    let h2 = health.clone();
    let lp = EngineLoop { rx, ready: ready_tx.clone(), cfg, tok, metrics: metrics.clone(), health: health.clone() };
    let join = std::thread::Builder::new()
        .name("dsc-engine".into())
        .spawn(move || {
            // marks the engine dead however the thread ends, a panic included
            let _guard = crate::health::AliveGuard(h2);
            if let Err(e) = start(lp) {
                tracing::error!(target: "dsc::engine", "{e}");
                // reaches the caller if the backend never started
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|e| RuntimeError::Request(format!("starting the engine thread: {e}")))?;
    ready_rx.recv().map_err(|_| RuntimeError::Request("the engine thread died while starting".into()))??;
    Ok((EngineHandle { tx, metrics, health }, join))
}
