//! Execution backends and the per-sequence session on top of them.
//!
//! A [`Backend`] runs one step of the plan's graph on a [`StepBatch`] — the continuous-batching
//! form (tokens of several sequences, prefill and decode mixed, each with its KV slots and
//! block table). [`Session`] drives one sequence through a backend: feed tokens, get logits.

use crate::error::{Result, RuntimeError};
use crate::plan::Plan;
use dsc_ir::{Collective, Executor, Graph, SingleRank, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

/// One step's inputs. `block_table` is `num_seqs x max_blocks`, row-major.
#[derive(Clone, Debug, Default)]
pub struct StepBatch {
    pub tokens: Vec<i32>,
    pub positions: Vec<i32>,
    pub seq_ids: Vec<i32>,
    pub slots: Vec<i32>,
    pub block_table: Vec<i32>,
    pub num_seqs: usize,
    pub max_blocks: usize,
    /// tokens whose logits are returned, in this order
    pub logit_rows: Vec<i32>,
}

impl StepBatch {
    /// Check the arrays agree with each other (a malformed batch is an error, not a panic).
    pub fn validate(&self) -> Result<()> {
        let t = self.tokens.len();
        if t == 0 || self.positions.len() != t || self.seq_ids.len() != t || self.slots.len() != t {
            return Err(RuntimeError::Request(format!(
                "step batch: tokens ({t}), positions ({}), seq_ids ({}) and slots ({}) must have one entry per token",
                self.positions.len(),
                self.seq_ids.len(),
                self.slots.len()
            )));
        }
        if self.block_table.len() != self.num_seqs * self.max_blocks {
            return Err(RuntimeError::Request(format!("step batch: block table has {} entries, expected {} x {}", self.block_table.len(), self.num_seqs, self.max_blocks)));
        }
        if self.seq_ids.iter().any(|&s| s < 0 || s as usize >= self.num_seqs) {
            return Err(RuntimeError::Request("step batch: a seq_id is outside the block table".into()));
        }
        if self.logit_rows.iter().any(|&r| r < 0 || r as usize >= t) {
            return Err(RuntimeError::Request("step batch: a logit row is outside the step's tokens".into()));
        }
        Ok(())
    }
}

pub trait Backend {
    /// Run one step; returns one logits row per entry of `logit_rows`.
    fn step(&mut self, batch: &StepBatch) -> Result<Vec<Vec<f32>>>;
    /// KV blocks in the pool and tokens per block.
    fn kv_geometry(&self) -> (usize, usize);
    /// Forget all cached KV.
    fn reset(&mut self);
    /// Copy whole KV blocks (every layer's K and V pool): (src, dst) pairs, in order
    /// (copy-on-write of blocks shared by forked sequences).
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()>;
    /// Run one step and return the argmax token of each logits row (lowest id on ties).
    /// Backends that can pick on the device override it to skip copying the logits back.
    fn step_greedy(&mut self, batch: &StepBatch) -> Result<Vec<u32>> {
        Ok(self.step(batch)?.iter().map(|r| crate::sampler::argmax(r) as u32).collect())
    }
    /// Pipelined greedy decoding (the host's work overlapped with the device's): start a
    /// greedy step and return without waiting for its token ids ([`Backend::collect_greedy`]
    /// takes them, in launch order). With `fed`, row i's input token is not in
    /// `batch.tokens` but the previous launched step's argmax of row i, taken on the device
    /// (so the next step can start before the host has seen that token). Ok(false): this
    /// backend runs steps synchronously only (the default); the caller then uses
    /// [`Backend::step_greedy`].
    fn launch_greedy(&mut self, _batch: &StepBatch, _fed: bool) -> Result<bool> {
        Ok(false)
    }
    /// [`Backend::launch_greedy`] of several fed steps at once, in order (each fed the one
    /// before's argmax; the first the last launched step's): one launch for all of them where
    /// the backend can (the GPU: one CUDA graph). Ok(false): not here (the caller launches
    /// them one at a time); each step's ids are then collected in turn.
    fn launch_greedy_steps(&mut self, _batches: &[StepBatch]) -> Result<bool> {
        Ok(false)
    }
    /// The most rows [`Backend::launch_greedy_steps`] may take (0: none): the engine builds
    /// several steps' batches only for the row counts a backend can launch at once.
    fn greedy_steps_rows(&self) -> usize {
        0
    }
    /// The token ids of the oldest launched, not yet collected greedy step.
    fn collect_greedy(&mut self) -> Result<Vec<u32>> {
        Err(crate::RuntimeError::Request("collect_greedy: no pipelined step in flight".into()))
    }
    /// Forget launched steps not yet collected (after a failure).
    fn discard_inflight(&mut self) {}
    /// A MoE plan's routed experts: the MoE layers (model layer indices) and the experts per
    /// layer; None for a dense plan.
    fn moe_layout(&self) -> Option<(Vec<usize>, usize)> {
        None
    }
    /// Expert failover: enable or disable routed expert `expert` of model layer `layer` for
    /// the steps that follow (the router masks it and renormalizes over the rest).
    fn set_expert(&mut self, layer: usize, expert: usize, _enabled: bool) -> Result<()> {
        Err(RuntimeError::Request(format!("expert {expert} of layer {layer}: this plan has no routed experts (or its backend cannot mask them)")))
    }
    /// Routing counts since the backend started (None: a dense plan).
    fn moe_stats(&self) -> Option<MoeStats> {
        None
    }
}

/// What a MoE backend has routed: `tokens[row * experts + e]` = token selections of expert e
/// in the row-th MoE layer; `masked_selections` = selections a disabled expert would have had
/// (the router gave them to the next best); `disabled` = (layer, expert) now masked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MoeStats {
    pub layers: Vec<usize>,
    pub experts: usize,
    pub tokens: Vec<u64>,
    pub masked_selections: u64,
    pub disabled: Vec<(usize, usize)>,
}

impl<B: Backend + ?Sized> Backend for &mut B {
    fn step(&mut self, batch: &StepBatch) -> Result<Vec<Vec<f32>>> {
        (**self).step(batch)
    }
    fn kv_geometry(&self) -> (usize, usize) {
        (**self).kv_geometry()
    }
    fn reset(&mut self) {
        (**self).reset()
    }
    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        (**self).copy_blocks(pairs)
    }
    fn step_greedy(&mut self, batch: &StepBatch) -> Result<Vec<u32>> {
        (**self).step_greedy(batch)
    }
    fn launch_greedy(&mut self, batch: &StepBatch, fed: bool) -> Result<bool> {
        (**self).launch_greedy(batch, fed)
    }
    fn launch_greedy_steps(&mut self, batches: &[StepBatch]) -> Result<bool> {
        (**self).launch_greedy_steps(batches)
    }
    fn greedy_steps_rows(&self) -> usize {
        (**self).greedy_steps_rows()
    }
    fn collect_greedy(&mut self) -> Result<Vec<u32>> {
        (**self).collect_greedy()
    }
    fn discard_inflight(&mut self) {
        (**self).discard_inflight()
    }
    fn moe_layout(&self) -> Option<(Vec<usize>, usize)> {
        (**self).moe_layout()
    }
    fn set_expert(&mut self, layer: usize, expert: usize, enabled: bool) -> Result<()> {
        (**self).set_expert(layer, expert, enabled)
    }
    fn moe_stats(&self) -> Option<MoeStats> {
        (**self).moe_stats()
    }
}

/// The CPU reference backend: the IR executor over the plan's graph and weights.
pub struct CpuBackend<'p> {
    exec: Executor<'p>,
    blocks: usize,
    block_size: usize,
    moe: Option<MoeState>,
}

/// The CPU backend's routed experts: the mask it feeds, the routers it reads back.
/// A MoE plan's routing state, kept by its backend: the routers, the failover mask (the
/// `expert_mask` input's values) and what has been routed.
pub(crate) struct MoeState {
    /// per MoE layer, in mask-row order: (model layer, router node, its logits, its bias)
    routers: Vec<(usize, dsc_ir::NodeId, dsc_ir::NodeId, Option<dsc_ir::NodeId>, dsc_ir::MoeRouting)>,
    experts: usize,
    mask: Vec<f32>,
    stats: MoeStats,
}

impl MoeState {
    /// The graph's routers (the `moe_route` nodes, named `model.layers.N.…`) and its
    /// `expert_mask` input [MoE layers, E]; None for a dense graph.
    pub(crate) fn of(graph: &Graph) -> Option<MoeState> {
        let mask = graph.leaves(&dsc_ir::Op::Input).into_iter().find(|&i| graph.node(i).name == "expert_mask")?;
        let experts = graph.node(mask).ty.shape.get(1)?.as_const()?;
        let layer_of = |name: &str| name.strip_prefix("model.layers.")?.split('.').next()?.parse::<usize>().ok();
        let mut routers: Vec<_> = graph
            .node_ids()
            .filter_map(|id| match &graph.node(id).op {
                dsc_ir::Op::MoeRoute(r) => {
                    let ops = graph.operands(id);
                    Some((layer_of(&graph.node(id).name)?, id, ops[0], ops.get(2).copied(), *r))
                }
                _ => None,
            })
            .collect();
        routers.sort_by_key(|r| r.0);
        let n = routers.len();
        let layers = routers.iter().map(|r| r.0).collect();
        Some(MoeState { routers, experts, mask: vec![1.0; n * experts], stats: MoeStats { layers, experts, tokens: vec![0; n * experts], ..Default::default() } })
    }

    /// Enable or disable routed expert `expert` of model layer `layer`: its mask entry, and
    /// the disabled list; returns the entry's index in the mask ([MoE layers, E] row-major).
    pub(crate) fn set(&mut self, layer: usize, expert: usize, enabled: bool) -> Result<usize> {
        let row = self.stats.layers.iter().position(|&l| l == layer).ok_or_else(|| RuntimeError::Request(format!("layer {layer} has no routed experts (MoE layers: {:?})", self.stats.layers)))?;
        if expert >= self.experts {
            return Err(RuntimeError::Request(format!("expert {expert} of layer {layer}: the layer has {} experts", self.experts)));
        }
        let at = row * self.experts + expert;
        self.mask[at] = if enabled { 1.0 } else { 0.0 };
        self.stats.disabled.retain(|&d| d != (layer, expert));
        if !enabled {
            self.stats.disabled.push((layer, expert));
            self.stats.disabled.sort();
        }
        Ok(at)
    }

    /// (model layers with routed experts, experts per layer)
    pub(crate) fn layout(&self) -> (Vec<usize>, usize) {
        (self.stats.layers.clone(), self.experts)
    }

    /// The failover mask ([MoE layers, E], 1 enabled, 0 disabled): the `expert_mask` input.
    pub(crate) fn mask(&self) -> &[f32] {
        &self.mask
    }

    /// What has been routed so far.
    pub(crate) fn stats(&self) -> MoeStats {
        self.stats.clone()
    }

    fn kept(&self) -> Vec<dsc_ir::NodeId> {
        self.routers.iter().flat_map(|r| [r.1, r.2].into_iter().chain(r.3)).collect()
    }

    /// Count this step's routing: every selection, and those a disabled expert would have had.
    fn count(&mut self, graph: &Graph, out: &BTreeMap<String, Tensor>) {
        let e = self.experts;
        for (row, (_, route, logits, bias, r)) in self.routers.iter().enumerate() {
            let (Some(rt), Some(lg)) = (out.get(&graph.node(*route).name), out.get(&graph.node(*logits).name)) else { continue };
            for ti in 0..rt.shape[0] {
                for (k, &w) in rt.data[ti * e..(ti + 1) * e].iter().enumerate() {
                    if w != 0.0 {
                        self.stats.tokens[row * e + k] += 1;
                    }
                }
            }
            let mask = &self.mask[row * e..(row + 1) * e];
            if mask.iter().all(|&m| m != 0.0) {
                continue;
            }
            let b = bias.and_then(|b| out.get(&graph.node(b).name)).map(|t| &t.data[..]);
            let ones = vec![1.0; e];
            for ti in 0..lg.shape[0] {
                let unmasked = dsc_ir::exec::route_token(r, &lg.data[ti * e..(ti + 1) * e], &ones, b);
                self.stats.masked_selections += unmasked.iter().filter(|(i, _)| mask[*i] == 0.0).count() as u64;
            }
        }
    }
}

impl<'p> CpuBackend<'p> {
    /// `kv_tokens`: KV-cache capacity in tokens (rounded up to whole blocks).
    pub fn new(graph: &'p Graph, plan: &'p Plan, kv_tokens: usize) -> Result<Self> {
        Self::new_rank(graph, plan, kv_tokens, 0, 1, Arc::new(SingleRank))
    }

    /// `--backend cpu` (`reference`: false): the executor with the plan's compiled CPU matmul
    /// kernels on the weights as stored, where the plan has a library this CPU runs; otherwise,
    /// saying why on stderr, the reference executor alone (`--backend reference`: true).
    pub fn of_kind(graph: &'p Graph, plan: &'p Plan, kv_tokens: usize, reference: bool) -> Result<Self> {
        if !reference {
            match crate::cpu_kernels::CpuKernels::load(plan, 0) {
                Ok(k) => return Self::with_kernels(graph, plan, kv_tokens, Arc::new(k)),
                Err(e) => eprintln!("dsc: {e}; running the reference executor"),
            }
        }
        Self::new(graph, plan, kv_tokens)
    }

    /// The executor with `kernels` for the matmuls whose weights they take (kept as stored).
    pub fn with_kernels(graph: &'p Graph, plan: &'p Plan, kv_tokens: usize, kernels: Arc<dyn dsc_ir::PackedMatMul>) -> Result<Self> {
        let block_size = plan.header.model.kv_block_size;
        let blocks = kv_tokens.div_ceil(block_size).max(1);
        cpu_memory_check(graph, plan, blocks.saturating_mul(block_size), 1)?;
        let fixed = BTreeMap::from([("NB".to_string(), blocks)]);
        let mut exec = Executor::with_kernels(graph, plan, fixed, kernels)?;
        let moe = MoeState::of(graph);
        if let Some(m) = &moe {
            exec.keep(&m.kept());
        }
        Ok(CpuBackend { exec, blocks, block_size, moe })
    }

    /// Rank `rank` of a tensor-parallel group of `world` (the plan's graph is partitioned;
    /// this rank holds its slices of the weights and meets the others through `collective`).
    pub fn new_rank(graph: &'p Graph, plan: &'p Plan, kv_tokens: usize, rank: usize, world: usize, collective: Arc<dyn Collective>) -> Result<Self> {
        let block_size = plan.header.model.kv_block_size;
        let blocks = kv_tokens.div_ceil(block_size).max(1);
        cpu_memory_check(graph, plan, blocks.saturating_mul(block_size), world)?;
        let fixed = BTreeMap::from([("NB".to_string(), blocks)]);
        let mut exec = if world == 1 { Executor::new(graph, plan, fixed)? } else { Executor::new(graph, &plan.rank_weights(graph, rank, world)?, fixed)? };
        let moe = MoeState::of(graph);
        if let Some(m) = &moe {
            exec.keep(&m.kept());
        }
        Ok(CpuBackend { exec: exec.with_collective(collective), blocks, block_size, moe })
    }
}

/// The CPU executor holds every weight (and its KV pools) as f32: refuse, with the sizes, a plan
/// or pool that cannot fit this machine's available memory, instead of aborting on allocation.
fn cpu_memory_check(graph: &Graph, plan: &Plan, kv_tokens: usize, world: usize) -> Result<()> {
    let weights: u64 = plan.header.weights.tensors.iter().map(|t| t.shape.iter().map(|&d| d as u64).product::<u64>().saturating_mul(4)).fold(0u64, u64::saturating_add);
    let kv: u64 = kv_pools(graph).map(|(_, row)| (row as u64).saturating_mul(4).saturating_mul(kv_tokens as u64)).fold(0u64, u64::saturating_add);
    let need = weights.saturating_add(kv.saturating_mul(world as u64));
    if let Some(avail) = mem_available() {
        if need > avail {
            return Err(RuntimeError::Plan {
                path: plan.path.clone(),
                msg: format!(
                    "the CPU backend needs {:.1} GB ({:.1} GB of f32 weights, {:.1} GB of KV cache for {kv_tokens} tokens); this machine has {:.1} GB available",
                    need as f64 / 1e9,
                    weights as f64 / 1e9,
                    kv as f64 * world as f64 / 1e9,
                    avail as f64 / 1e9
                ),
            });
        }
    }
    Ok(())
}

/// The graph's KV-cache pools (its `State` leaves), each with the elements one token's row takes.
pub fn kv_pools(graph: &Graph) -> impl Iterator<Item = (&dsc_ir::Node, usize)> {
    graph.leaves(&dsc_ir::Op::State).into_iter().map(move |id| {
        let n = graph.node(id);
        (n, n.ty.shape.iter().skip(2).filter_map(|d| d.as_const()).product::<usize>())
    })
}

/// MemAvailable from /proc/meminfo, bytes (None where there is no such file).
fn mem_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

fn ints(v: &[i32]) -> Tensor {
    Tensor::from_i32(vec![v.len()], v)
}

impl Backend for CpuBackend<'_> {
    fn step(&mut self, b: &StepBatch) -> Result<Vec<Vec<f32>>> {
        b.validate()?;
        let mut inputs = BTreeMap::from([
            ("tokens".to_string(), ints(&b.tokens)),
            ("positions".to_string(), ints(&b.positions)),
            ("seq_ids".to_string(), ints(&b.seq_ids)),
            ("slots".to_string(), ints(&b.slots)),
            ("block_table".to_string(), Tensor::from_i32(vec![b.num_seqs, b.max_blocks], &b.block_table)),
            ("logit_rows".to_string(), ints(&b.logit_rows)),
        ]);
        if let Some(m) = &self.moe {
            inputs.insert("expert_mask".to_string(), Tensor::new(vec![m.routers.len(), m.experts], m.mask.clone()));
        }
        let out = self.exec.run(&inputs)?;
        if let Some(m) = &mut self.moe {
            m.count(self.exec.graph(), &out);
        }
        let logits = out.get("logits").ok_or_else(|| RuntimeError::Request("the plan's graph has no `logits` output".into()))?;
        let v = *logits.shape.last().unwrap_or(&0);
        Ok(logits.data.chunks_exact(v.max(1)).map(|r| r.to_vec()).collect())
    }

    fn kv_geometry(&self) -> (usize, usize) {
        (self.blocks, self.block_size)
    }

    fn reset(&mut self) {
        self.exec.reset_states();
    }

    fn moe_layout(&self) -> Option<(Vec<usize>, usize)> {
        self.moe.as_ref().map(MoeState::layout)
    }

    fn set_expert(&mut self, layer: usize, expert: usize, enabled: bool) -> Result<()> {
        let Some(m) = &mut self.moe else { return Err(RuntimeError::Request(format!("expert {expert} of layer {layer}: this plan has no routed experts"))) };
        m.set(layer, expert, enabled).map(|_| ())
    }

    fn moe_stats(&self) -> Option<MoeStats> {
        self.moe.as_ref().map(MoeState::stats)
    }

    fn copy_blocks(&mut self, pairs: &[(u32, u32)]) -> Result<()> {
        for name in self.exec.state_names() {
            let t = self.exec.state_mut(&name).expect("listed state");
            let per_block: usize = t.shape[1..].iter().product();
            for &(src, dst) in pairs {
                let (src, dst) = (src as usize * per_block, dst as usize * per_block);
                if src.max(dst) + per_block > t.data.len() {
                    return Err(RuntimeError::Request(format!("block copy outside the KV pool `{name}`")));
                }
                t.data.copy_within(src..src + per_block, dst);
            }
        }
        Ok(())
    }
}

/// One sequence on a backend it has to itself: blocks 0, 1, 2, ... in order.
pub struct Session<'b, B: Backend + ?Sized> {
    backend: &'b mut B,
    len: usize,
}

impl<'b, B: Backend + ?Sized> Session<'b, B> {
    pub fn new(backend: &'b mut B) -> Self {
        backend.reset();
        Session { backend, len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Append `ids` to the sequence in one step; returns the logits after every fed token
    /// when `all_logits`, else only after the last.
    pub fn feed(&mut self, ids: &[u32], all_logits: bool) -> Result<Vec<Vec<f32>>> {
        if ids.is_empty() {
            return Err(RuntimeError::Request("no tokens to feed".into()));
        }
        let (blocks, bs) = self.backend.kv_geometry();
        let end = self.len + ids.len();
        if end > blocks * bs {
            return Err(RuntimeError::Request(format!("sequence of {end} tokens exceeds the KV cache ({} tokens)", blocks * bs)));
        }
        let mb = end.div_ceil(bs);
        let n = ids.len();
        let batch = StepBatch {
            tokens: ids.iter().map(|&t| t as i32).collect(),
            positions: (self.len..end).map(|p| p as i32).collect(),
            seq_ids: vec![0; n],
            slots: (self.len..end).map(|p| p as i32).collect(),
            block_table: (0..mb as i32).collect(),
            num_seqs: 1,
            max_blocks: mb,
            logit_rows: if all_logits { (0..n as i32).collect() } else { vec![n as i32 - 1] },
        };
        let out = self.backend.step(&batch)?;
        self.len = end;
        Ok(out)
    }
}
