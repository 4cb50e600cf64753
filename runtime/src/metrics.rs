//! Serving metrics in the Prometheus text format (prometheus-client). The engine and the HTTP
//! server update them; `/metrics` encodes the registry.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Reason {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PriorityLabel {
    pub priority: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BlockState {
    pub state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExpertLabel {
    pub layer: String,
    pub expert: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LayerLabel {
    pub layer: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct GpuLabel {
    pub gpu: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub queue_time: Histogram,
    pub prompt_tokens: Counter,
    pub generation_tokens: Counter,
    pub prefix_hit_tokens: Counter,
    pub requests: Family<Reason, Counter>,
    pub errors: Family<Reason, Counter>,
    pub preemptions: Counter,
    pub steps: Counter,
    /// requests that failed inside the engine (a panic or a failed step), the engine went on
    pub engine_failures: Family<Reason, Counter>,
    /// steps that ran past the watchdog's bound (the engine was reported unhealthy meanwhile)
    pub engine_stalls: Counter,
    /// 1 while the engine can serve, 0 once it cannot (liveness fails: the pod restarts)
    pub engine_healthy: Gauge,
    /// requests refused because the queue or the connection cap was full
    pub overloaded: Family<Reason, Counter>,
    pub queue_depth: Family<PriorityLabel, Gauge>,
    pub running: Gauge,
    pub kv_blocks: Family<BlockState, Gauge>,
    pub prefix_hit_ratio: Gauge<f64, AtomicU64>,
    pub tokens_per_second: Gauge<f64, AtomicU64>,
    pub gpu_utilization: Family<GpuLabel, Gauge<f64, AtomicU64>>,
    pub gpu_memory_used: Family<GpuLabel, Gauge<f64, AtomicU64>>,
    pub gpu_temperature: Family<GpuLabel, Gauge<f64, AtomicU64>>,
    pub gpu_ecc_errors: Family<GpuLabel, Gauge<f64, AtomicU64>>,
    /// MoE plans: token selections per (layer, routed expert)
    pub moe_expert_tokens: Family<ExpertLabel, Counter>,
    /// MoE plans: per layer, the busiest expert's selections over the mean (1 = balanced)
    pub moe_imbalance: Family<LayerLabel, Gauge<f64, AtomicU64>>,
    /// MoE plans: selections a disabled expert would have had (given to the next best)
    pub moe_masked_selections: Counter,
    /// MoE plans: routed experts disabled now (expert failover)
    pub moe_disabled_experts: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("dsc");
        let lat = || Histogram::new(exponential_buckets(0.001, 2.0, 18));
        let m = Metrics {
            ttft: lat(),
            itl: lat(),
            e2e: lat(),
            queue_time: lat(),
            prompt_tokens: Counter::default(),
            generation_tokens: Counter::default(),
            prefix_hit_tokens: Counter::default(),
            requests: Family::default(),
            errors: Family::default(),
            preemptions: Counter::default(),
            steps: Counter::default(),
            engine_failures: Family::default(),
            engine_stalls: Counter::default(),
            engine_healthy: Gauge::default(),
            overloaded: Family::default(),
            queue_depth: Family::default(),
            running: Gauge::default(),
            kv_blocks: Family::default(),
            prefix_hit_ratio: Gauge::default(),
            tokens_per_second: Gauge::default(),
            gpu_utilization: Family::default(),
            gpu_memory_used: Family::default(),
            gpu_temperature: Family::default(),
            gpu_ecc_errors: Family::default(),
            moe_expert_tokens: Family::default(),
            moe_imbalance: Family::default(),
            moe_masked_selections: Counter::default(),
            moe_disabled_experts: Gauge::default(),
            registry: Registry::default(),
        };
        r.register("time_to_first_token_seconds", "Time from arrival to the first generated token", m.ttft.clone());
        r.register("inter_token_latency_seconds", "Time between consecutive generated tokens of a sequence", m.itl.clone());
        r.register("e2e_request_latency_seconds", "Time from arrival to the last token", m.e2e.clone());
        r.register("queue_time_seconds", "Time a request waited before its first step", m.queue_time.clone());
        r.register("prompt_tokens", "Prompt tokens admitted", m.prompt_tokens.clone());
        r.register("generation_tokens", "Tokens generated", m.generation_tokens.clone());
        r.register("prefix_cache_hit_tokens", "Prompt tokens served from the prefix cache", m.prefix_hit_tokens.clone());
        r.register("requests", "Finished sequences by how they ended (stop, length, cancelled, timeout, error)", m.requests.clone());
        r.register("errors", "Rejected HTTP requests by kind", m.errors.clone());
        r.register("preemptions", "Sequences preempted (blocks freed, recomputed later)", m.preemptions.clone());
        r.register("engine_steps", "Engine steps run", m.steps.clone());
        r.register("engine_request_failures", "Requests failed inside the engine by cause (panic, step); the engine went on", m.engine_failures.clone());
        r.register("engine_stalls", "Engine steps that ran past the watchdog bound (far beyond the measured step times)", m.engine_stalls.clone());
        r.register("engine_healthy", "1 while the engine serves, 0 once it cannot (the liveness probe fails)", m.engine_healthy.clone());
        r.register("overloaded", "Requests refused with 503 and Retry-After, by what was full (queue, connections)", m.overloaded.clone());
        r.register("queue_depth", "Sequences waiting, by priority class", m.queue_depth.clone());
        r.register("running_sequences", "Sequences in the running batch", m.running.clone());
        r.register("kv_blocks", "KV-cache blocks by state (used, cached, free)", m.kv_blocks.clone());
        r.register("prefix_cache_hit_ratio", "Prompt tokens found in the prefix cache / looked up", m.prefix_hit_ratio.clone());
        r.register("generation_tokens_per_second", "Generated tokens per second over the last second", m.tokens_per_second.clone());
        r.register("gpu_utilization_percent", "GPU utilization (NVML)", m.gpu_utilization.clone());
        r.register("gpu_memory_used_bytes", "GPU memory used (NVML)", m.gpu_memory_used.clone());
        r.register("gpu_temperature_celsius", "GPU temperature (NVML)", m.gpu_temperature.clone());
        r.register("gpu_ecc_uncorrected_errors", "Uncorrected ECC errors, volatile (NVML)", m.gpu_ecc_errors.clone());
        r.register("moe_expert_tokens", "Token selections per MoE layer and routed expert", m.moe_expert_tokens.clone());
        r.register("moe_load_imbalance", "Per MoE layer: the busiest routed expert's selections / the mean (1 = balanced)", m.moe_imbalance.clone());
        r.register("moe_masked_selections", "Router selections a disabled expert would have had (given to the next best expert)", m.moe_masked_selections.clone());
        r.register("moe_disabled_experts", "Routed experts disabled now (expert failover)", m.moe_disabled_experts.clone());
        // series that exist from the start (dashboards and autoscalers see zeros, not gaps)
        for p in ["high", "normal", "low"] {
            let _ = m.queue_depth.get_or_create(&PriorityLabel { priority: p.into() });
        }
        for st in ["used", "cached", "free"] {
            let _ = m.kv_blocks.get_or_create(&BlockState { state: st.into() });
        }
        m.engine_healthy.set(1);
        Metrics { registry: r, ..m }
    }

    pub fn encode(&self) -> String {
        let mut s = String::new();
        // writing into a String cannot fail
        let _ = prometheus_client::encoding::text::encode(&mut s, &self.registry);
        s
    }

    pub fn finished(&self, reason: &str) {
        self.requests.get_or_create(&Reason { reason: reason.into() }).inc();
    }

    pub fn error(&self, kind: &str) {
        self.errors.get_or_create(&Reason { reason: kind.into() }).inc();
    }

    /// A request failed inside the engine (`why`: panic, step).
    pub fn engine_failure(&self, why: &str) {
        self.engine_failures.get_or_create(&Reason { reason: why.into() }).inc();
    }

    /// A request or connection refused as overloaded (`what` was full: queue, connections).
    pub fn refused(&self, what: &str) {
        self.overloaded.get_or_create(&Reason { reason: what.into() }).inc();
    }
}
