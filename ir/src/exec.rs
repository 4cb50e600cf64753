//! The CPU reference executor: interprets any graph in f32, one op at a time, in topological
//! order. Integer tensors (token ids, positions, indices) are carried as exact f32 values
//! (inputs are checked to be below 2^24). Simple and obviously correct first: it is the
//! oracle for passes and kernels. Matmuls go through `matrixmultiply`'s sgemm so that a real
//! model runs in seconds.

use crate::op::{BinaryOp, MoeRouting, MoeScoring, MoeSelect, RopeStyle, UnaryOp};
use crate::{quant, DType, Dim, Graph, IrError, NodeId, Op, Result};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

mod attention;

/// A dense f32 tensor, row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Tensor { shape, data }
    }
    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        Tensor { shape, data: vec![0.0; n] }
    }
    pub fn from_i32(shape: Vec<usize>, v: &[i32]) -> Self {
        Tensor::new(shape, v.iter().map(|&x| x as f32).collect())
    }
    pub fn numel(&self) -> usize {
        self.data.len()
    }
    /// Last-axis length and number of rows.
    fn rows(&self) -> (usize, usize) {
        let d = *self.shape.last().unwrap_or(&1);
        (if d == 0 { 0 } else { self.data.len() / d }, d)
    }
}

/// Where the executor gets weight bytes: (dtype, shape, raw little-endian bytes).
pub trait WeightSource {
    fn weight(&self, name: &str) -> Option<(DType, Vec<usize>, &[u8])>;
}

impl WeightSource for HashMap<String, (DType, Vec<usize>, Vec<u8>)> {
    fn weight(&self, name: &str) -> Option<(DType, Vec<usize>, &[u8])> {
        self.get(name).map(|(d, s, b)| (*d, s.clone(), b.as_slice()))
    }
}

enum Val {
    T(Arc<Tensor>),
    /// a state pool, updated in place
    State(String),
    /// a weight kept as stored, for the matmul kernels only ([`PackedMatMul`])
    Packed,
}

/// Matmuls a backend runs itself on weights as stored (the compiled CPU kernels of a plan):
/// the executor keeps those weights' bytes instead of widening them to f32, and hands each
/// `x · Wᵀ` of a matmul op (plain, with activation, residual or bias, or a concatenation)
/// to [`PackedMatMul::matmul`]; the op's epilogue stays the executor's.
pub trait PackedMatMul: Send + Sync {
    /// Whether the kernels take a weight of `dtype` and shape [n, k].
    fn takes(&self, dtype: DType, n: usize, k: usize) -> bool;
    /// The bytes the kernels read for a weight they take, from its stored bytes, once at load
    /// (a layout of their own; the default: as stored).
    fn prepare(&self, dtype: DType, n: usize, k: usize, stored: &[u8]) -> std::result::Result<Vec<u8>, String> {
        let _ = (dtype, n, k);
        Ok(stored.to_vec())
    }
    /// y[m, n] = x[m, k] · W[n, k]ᵀ (`w`: the bytes [`PackedMatMul::prepare`] gave).
    fn matmul(&self, dtype: DType, w: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> std::result::Result<Vec<f32>, String>;
    /// y[m, Σn] = x · [W₁; W₂; …]ᵀ: the parts' products side by side in each row (a
    /// concatenating matmul, e.g. Q, K and V), as the kernels can in one hand-off. The
    /// default: one [`PackedMatMul::matmul`] each, interleaved.
    fn matmul_cat(&self, parts: &[(DType, &[u8], usize)], k: usize, x: &[f32], m: usize) -> std::result::Result<Vec<f32>, String> {
        let ys = parts.iter().map(|&(d, w, n)| self.matmul(d, w, n, k, x, m)).collect::<std::result::Result<Vec<_>, _>>()?;
        Ok(concat_columns(&parts.iter().zip(&ys).map(|(p, y)| (&y[..], p.2)).collect::<Vec<_>>(), m))
    }
    /// Run `step` (a whole [`Executor::run`]) where the kernels' workers are, so that the
    /// step's serial work and its matmuls share those threads rather than compete with them
    /// (the default: on the calling thread).
    fn on_workers(&self, step: &mut (dyn FnMut() + Send)) {
        step()
    }
}

/// `rows` rows of several products side by side: part p holds rows of `p.1` values.
fn concat_columns(parts: &[(&[f32], usize)], rows: usize) -> Vec<f32> {
    let total: usize = parts.iter().map(|p| p.1).sum();
    let mut data = Vec::with_capacity(rows * total);
    for r in 0..rows {
        for &(p, n) in parts {
            data.extend_from_slice(&p[r * n..(r + 1) * n]);
        }
    }
    data
}

/// A weight held as stored for [`PackedMatMul`].
struct PackedWeight {
    dtype: DType,
    n: usize,
    k: usize,
    bytes: Vec<u8>,
}

/// Whether operand `at` of `op` is the weight of an `x · Wᵀ` the matmul kernels can take.
fn packed_operand(op: &Op, at: usize) -> bool {
    match op {
        Op::MatMul { transpose_b: true } | Op::MatMulAct { transpose_b: true, .. } | Op::MatMulAdd { transpose_b: true } => at == 1,
        Op::MatMulCat => at >= 1,
        _ => false,
    }
}

pub struct Executor<'g> {
    graph: &'g Graph,
    order: Vec<NodeId>,
    weights: HashMap<NodeId, Arc<Tensor>>,
    states: HashMap<String, Tensor>,
    fixed: BTreeMap<String, usize>,
    collective: Arc<dyn Collective>,
    /// intermediates returned by `run` beside the outputs, by node name (see [`Executor::keep`])
    kept: Vec<NodeId>,
    /// weights kept as stored for `kernels` (a weight used elsewhere too is also in `weights`)
    packed: HashMap<NodeId, PackedWeight>,
    kernels: Option<Arc<dyn PackedMatMul>>,
}

/// How `all_reduce` nodes combine a tensor across the ranks of a tensor-parallel group.
/// Every rank calls it in the same order; it returns the elementwise sum over ranks.
pub trait Collective: Send + Sync {
    fn all_reduce(&self, x: &Tensor) -> std::result::Result<Tensor, String>;
}

/// World size 1: the sum over one rank is the tensor itself.
pub struct SingleRank;

impl Collective for SingleRank {
    fn all_reduce(&self, x: &Tensor) -> std::result::Result<Tensor, String> {
        Ok(x.clone())
    }
}

/// Ranks as threads of one process: each rank's executor runs on its own thread, and
/// `all_reduce` meets the others at a barrier and sums in rank order (so every rank gets
/// bit-identical results). Rank `r` uses `handle(r)`.
pub struct ThreadGroup {
    world: usize,
    barrier: std::sync::Barrier,
    slots: std::sync::Mutex<Vec<Option<Tensor>>>,
}

pub struct RankHandle {
    group: Arc<ThreadGroup>,
    rank: usize,
}

impl ThreadGroup {
    pub fn new(world: usize) -> Arc<Self> {
        Arc::new(ThreadGroup { world, barrier: std::sync::Barrier::new(world), slots: std::sync::Mutex::new(vec![None; world]) })
    }
    pub fn handle(self: &Arc<Self>, rank: usize) -> Arc<RankHandle> {
        debug_assert!(rank < self.world, "rank {rank} of a group of {}", self.world);
        Arc::new(RankHandle { group: self.clone(), rank })
    }
}

impl Collective for RankHandle {
    fn all_reduce(&self, x: &Tensor) -> std::result::Result<Tensor, String> {
        let g = &self.group;
        g.slots.lock().map_err(|_| "a rank panicked")?[self.rank] = Some(x.clone());
        g.barrier.wait();
        let sum = {
            let slots = g.slots.lock().map_err(|_| "a rank panicked")?;
            let mut acc = vec![0f32; x.numel()];
            for (r, s) in slots.iter().enumerate() {
                let s = s.as_ref().ok_or_else(|| format!("rank {r} gave no tensor"))?;
                if s.shape != x.shape {
                    return Err(format!("rank {r} reduces shape {:?}, rank {} shape {:?}", s.shape, self.rank, x.shape));
                }
                acc.iter_mut().zip(&s.data).for_each(|(a, b)| *a += b);
            }
            Tensor::new(x.shape.clone(), acc)
        };
        // nobody refills the slots before every rank has read them
        g.barrier.wait();
        if self.rank == 0 {
            g.slots.lock().map_err(|_| "a rank panicked")?.iter_mut().for_each(|s| *s = None);
        }
        g.barrier.wait();
        Ok(sum)
    }
}

fn xerr(g: &Graph, id: NodeId, msg: impl Into<String>) -> IrError {
    let n = g.node(id);
    IrError::Exec { node: n.name.clone(), op: n.op.name(), msg: msg.into() }
}

impl<'g> Executor<'g> {
    /// Prepare to run `graph`: widen every weight to f32 (checking its dtype and shape against
    /// the graph) and allocate zeroed state pools. `fixed` binds the symbols that state
    /// shapes use (e.g. `NB`, the KV blocks in the pool).
    pub fn new(graph: &'g Graph, weights: &dyn WeightSource, fixed: BTreeMap<String, usize>) -> Result<Self> {
        Self::build(graph, weights, fixed, None)
    }

    /// [`Executor::new`] with matmul kernels that read weights as stored: every weight that only
    /// feeds the `x · Wᵀ` of matmul ops and that `kernels` takes stays packed (one used elsewhere
    /// too, e.g. a tied embedding's gather, is also widened for those uses).
    pub fn with_kernels(graph: &'g Graph, weights: &dyn WeightSource, fixed: BTreeMap<String, usize>, kernels: Arc<dyn PackedMatMul>) -> Result<Self> {
        Self::build(graph, weights, fixed, Some(kernels))
    }

    fn build(graph: &'g Graph, weights: &dyn WeightSource, fixed: BTreeMap<String, usize>, kernels: Option<Arc<dyn PackedMatMul>>) -> Result<Self> {
        graph.verify()?;
        let order = graph.topo_order()?;
        let mut w = HashMap::new();
        let mut packed = HashMap::new();
        for id in graph.leaves(&Op::Weight) {
            let n = graph.node(id);
            let (dtype, shape, bytes) = weights.weight(&n.name).ok_or_else(|| IrError::Weight { name: n.name.clone(), msg: "not found in the weight source".into() })?;
            let want =
                n.ty.shape
                    .iter()
                    .map(|d| d.as_const())
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| IrError::Weight { name: n.name.clone(), msg: format!("weight type {} must have constant dims", n.ty) })?;
            if dtype != n.ty.dtype || shape != want {
                return Err(IrError::Weight { name: n.name.clone(), msg: format!("source has {dtype}{shape:?}, graph expects {}", n.ty) });
            }
            let numel = want.iter().product();
            // (per use: operand positions the matmul kernels can take it at, and any other)
            let (mut kernel_uses, mut other_uses) = (false, false);
            for u in graph.users(id) {
                for (at, o) in graph.operands(u).into_iter().enumerate() {
                    if o == id {
                        if packed_operand(&graph.node(u).op, at) {
                            kernel_uses = true;
                        } else {
                            other_uses = true;
                        }
                    }
                }
            }
            if graph.outputs.iter().any(|(_, o)| *o == id) {
                other_uses = true;
            }
            if let (Some(kern), [rows, cols]) = (&kernels, want.as_slice()) {
                if kernel_uses && kern.takes(dtype, *rows, *cols) {
                    let prepared = kern.prepare(dtype, *rows, *cols, bytes).map_err(|msg| IrError::Weight { name: n.name.clone(), msg })?;
                    packed.insert(id, PackedWeight { dtype, n: *rows, k: *cols, bytes: prepared });
                    if !other_uses {
                        continue;
                    }
                }
            }
            let data = quant::decode(dtype, bytes, numel).ok_or_else(|| IrError::Weight { name: n.name.clone(), msg: format!("{} bytes do not hold {numel} {dtype} elements", bytes.len()) })?;
            w.insert(id, Arc::new(Tensor::new(want, data)));
        }
        let mut states = HashMap::new();
        for id in graph.leaves(&Op::State) {
            let n = graph.node(id);
            let shape = n.ty.eval_shape(&fixed).ok_or_else(|| xerr(graph, id, format!("state shape {} needs every symbol bound at creation (bound: {fixed:?})", n.ty)))?;
            states.insert(n.name.clone(), Tensor::zeros(shape));
        }
        Ok(Executor { graph, order, weights: w, states, fixed, collective: Arc::new(SingleRank), kept: vec![], packed, kernels })
    }

    /// Run as one rank of a tensor-parallel group (see [`Collective`]).
    pub fn with_collective(mut self, c: Arc<dyn Collective>) -> Self {
        self.collective = c;
        self
    }

    pub fn state(&self, name: &str) -> Option<&Tensor> {
        self.states.get(name)
    }

    /// The graph this executor runs.
    pub fn graph(&self) -> &'g Graph {
        self.graph
    }

    /// Also return these nodes' values from [`Executor::run`], under their node names (a
    /// backend's view of intermediates, e.g. MoE routing for the load metrics).
    pub fn keep(&mut self, ids: &[NodeId]) {
        self.kept = ids.to_vec();
    }

    /// A state pool, to fill or inspect (tests seed KV caches with random contents).
    pub fn state_mut(&mut self, name: &str) -> Option<&mut Tensor> {
        self.states.get_mut(name)
    }

    /// Names of the state pools, sorted.
    pub fn state_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.states.keys().cloned().collect();
        v.sort();
        v
    }

    /// Zero every state pool (a fresh KV cache).
    pub fn reset_states(&mut self) {
        for t in self.states.values_mut() {
            t.data.iter_mut().for_each(|x| *x = 0.0);
        }
    }

    /// Run one step. Every graph input must be given; returns the graph's named outputs.
    pub fn run(&mut self, inputs: &BTreeMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>> {
        match self.kernels.clone() {
            Some(k) => {
                let mut out = None;
                k.on_workers(&mut || out = Some(self.run_step(inputs)));
                out.unwrap_or_else(|| Err(IrError::Input { name: "step".into(), msg: "the matmul kernels' workers did not run the step".into() }))
            }
            None => self.run_step(inputs),
        }
    }

    fn run_step(&mut self, inputs: &BTreeMap<String, Tensor>) -> Result<BTreeMap<String, Tensor>> {
        let g = self.graph;
        let mut bind = self.fixed.clone();
        for id in g.leaves(&Op::Input) {
            let n = g.node(id);
            let t = inputs.get(&n.name).ok_or_else(|| IrError::Input { name: n.name.clone(), msg: "missing".into() })?;
            if t.shape.len() != n.ty.rank() {
                return Err(IrError::Input { name: n.name.clone(), msg: format!("rank {} given, {} expected", t.shape.len(), n.ty) });
            }
            for (d, &v) in n.ty.shape.iter().zip(&t.shape) {
                match d {
                    Dim::Const(c) if *c != v => return Err(IrError::Input { name: n.name.clone(), msg: format!("shape {:?} given, {} expected", t.shape, n.ty) }),
                    Dim::Sym(s) => match bind.get(s) {
                        Some(&b) if b != v => return Err(IrError::Input { name: n.name.clone(), msg: format!("symbol {s} is {b} elsewhere but {v} here") }),
                        _ => {
                            bind.insert(s.clone(), v);
                        }
                    },
                    _ => {}
                }
            }
            if n.ty.dtype.is_int() && t.data.iter().any(|x| x.fract() != 0.0 || x.abs() >= 16_777_216.0) {
                return Err(IrError::Input { name: n.name.clone(), msg: "integer input holds a non-integer or a value beyond 2^24".into() });
            }
        }
        let mut vals: HashMap<NodeId, Val> = HashMap::with_capacity(self.order.len());
        // free intermediates after their last use
        // one count per operand edge (a node may use the same value twice)
        let mut uses: HashMap<NodeId, usize> = self.order.iter().map(|&id| (id, 0)).collect();
        for &id in &self.order {
            for o in g.operands(id) {
                *uses.get_mut(&o).expect("operand is a node") += 1;
            }
        }
        for o in g.outputs.iter().map(|(_, o)| o).chain(&self.kept) {
            *uses.get_mut(o).ok_or_else(|| IrError::Input { name: format!("node {}", o.index()), msg: "kept node is not in the graph".into() })? += 1;
        }
        for &id in &self.order {
            let n = g.node(id);
            let ops = g.operands(id);
            let val = match &n.op {
                Op::Input => Val::T(Arc::new(inputs[&n.name].clone())),
                Op::Weight => match self.weights.get(&id) {
                    Some(t) => Val::T(t.clone()),
                    None => Val::Packed,
                },
                Op::State => Val::State(n.name.clone()),
                Op::CacheWrite | Op::RopeCacheWrite { .. } => {
                    let name = match &vals[&ops[0]] {
                        Val::State(s) => s.clone(),
                        Val::T(_) | Val::Packed => return Err(xerr(g, id, "cache operand is not a state")),
                    };
                    let x = tensor(&vals, ops[1], g, id)?;
                    // rope_cache_write: the rows written are rope(x, pos)
                    let roped;
                    let x = match &n.op {
                        &Op::RopeCacheWrite { theta, style, rotary_dim } => {
                            let pos = tensor(&vals, ops[3], g, id)?;
                            roped = eval(&Op::Rope { theta, style, rotary_dim }, &[x, pos], DType::F32, None).map_err(|m| xerr(g, id, m))?;
                            &roped
                        }
                        _ => x,
                    };
                    let slots = tensor(&vals, ops[2], g, id)?;
                    let cache = self.states.get_mut(&name).expect("state allocated");
                    let row = cache.shape[2] * cache.shape[3];
                    let nslots = cache.shape[0] * cache.shape[1];
                    // (rows are stored in the pool's type: a bf16 pool rounds them)
                    let pool = n.ty.dtype;
                    for (t, &s) in slots.data.iter().enumerate() {
                        if s < 0.0 || s as usize >= nslots {
                            return Err(xerr(g, id, format!("slot {s} out of range 0..{nslots}")));
                        }
                        let s = s as usize;
                        let dst = &mut cache.data[s * row..(s + 1) * row];
                        dst.copy_from_slice(&x.data[t * row..(t + 1) * row]);
                        if pool == DType::F8E4M3 {
                            // (an e4m3 pool keeps one f32 scale per token and KV head, amax / 448:
                            // each head's row in e4m3's normal range, none saturated; a row of a
                            // power-of-two length is rounded rotated by the normalized Hadamard
                            // transform H — its outlier channels spread over the row, as QuaRot
                            // rotates K — and rotated back (H = H^-1): the pool holds H q(H x).
                            // A kernel stores q(H x) and rotates q and the output instead:
                            // q·H q(H k) = (H q)·q(H k). SmolLM2, e4m3 K and V: +0.69% -> +0.42% ppl)
                            let had = cache.shape[3].is_power_of_two();
                            for h in dst.chunks_mut(cache.shape[3]) {
                                if had {
                                    quant::hadamard(h);
                                }
                                let sc = h.iter().fold(0f32, |a, v| a.max(v.abs())) / 448.0;
                                let inv = if sc > 0.0 { 1.0 / sc } else { 0.0 };
                                h.iter_mut().for_each(|v| *v = quant::round_to(pool, *v * inv) * sc);
                                if had {
                                    quant::hadamard(h);
                                }
                            }
                        } else if pool != DType::F32 {
                            dst.iter_mut().for_each(|v| *v = quant::round_to(pool, *v));
                        }
                    }
                    Val::State(name)
                }
                Op::AllReduce => {
                    let x = tensor(&vals, ops[0], g, id)?;
                    Val::T(Arc::new(self.collective.all_reduce(x).map_err(|m| xerr(g, id, m))?))
                }
                Op::PagedAttention { .. } | Op::MlaAttention { .. } => {
                    let st = |v: NodeId| -> Result<&Tensor> {
                        match &vals[&v] {
                            Val::State(s) => Ok(&self.states[s]),
                            Val::T(t) => Ok(t.as_ref()),
                            Val::Packed => Err(xerr(g, id, "a packed weight is not a cache")),
                        }
                    };
                    let t = |i: usize| tensor(&vals, ops[i], g, id);
                    let out = match n.op {
                        Op::PagedAttention { scale } => attention::paged_attention(t(0)?, st(ops[1])?, st(ops[2])?, t(3)?, t(4)?, t(5)?, scale),
                        Op::MlaAttention { scale, kv_lora_rank } => mla_attention(t(0)?, st(ops[1])?, t(2)?, t(3)?, t(4)?, scale, kv_lora_rank),
                        _ => unreachable!("matched above"),
                    }
                    .map_err(|m| xerr(g, id, m))?;
                    Val::T(Arc::new(out))
                }
                op if packed_operand(op, 1) && ops[1..].iter().any(|o| self.packed.contains_key(o)) => Val::T(Arc::new(self.packed_matmul(op, &ops, &vals, id)?)),
                op => {
                    let args: Vec<&Tensor> = ops.iter().map(|&o| tensor(&vals, o, g, id)).collect::<Result<_>>()?;
                    let want = n.ty.eval_shape(&bind);
                    Val::T(Arc::new(eval(op, &args, n.ty.dtype, want.as_deref()).map_err(|m| xerr(g, id, m))?))
                }
            };
            if let Val::T(t) = &val {
                if let Some(want) = n.ty.eval_shape(&bind) {
                    if want != t.shape {
                        return Err(xerr(g, id, format!("computed shape {:?} but the graph declares {} = {want:?}", t.shape, n.ty)));
                    }
                } else {
                    // bind symbols first seen in a computed shape
                    for (d, &v) in n.ty.shape.iter().zip(&t.shape) {
                        if let Dim::Sym(s) = d {
                            bind.entry(s.clone()).or_insert(v);
                        }
                    }
                }
            }
            vals.insert(id, val);
            for o in ops {
                let u = uses.get_mut(&o).expect("operand counted");
                *u -= 1;
                if *u == 0 {
                    vals.remove(&o);
                }
            }
        }
        let mut out = BTreeMap::new();
        for id in &self.kept {
            if let Some(Val::T(t)) = vals.get(id) {
                out.insert(g.node(*id).name.clone(), t.as_ref().clone());
            }
        }
        for (name, id) in &g.outputs {
            let t = match &vals[id] {
                Val::T(t) => t.as_ref().clone(),
                Val::State(s) => self.states[s].clone(),
                Val::Packed => return Err(xerr(g, *id, "a packed weight is not an output")),
            };
            out.insert(name.clone(), t);
        }
        Ok(out)
    }
}

impl Executor<'_> {
    /// A matmul op whose weight operand(s) are held packed: `x · Wᵀ` by the kernels (an f32
    /// weight of a concatenation by the reference product), then the op's bias, activation or
    /// residual as [`eval`] applies them.
    fn packed_matmul(&self, op: &Op, ops: &[NodeId], vals: &HashMap<NodeId, Val>, id: NodeId) -> Result<Tensor> {
        let g = self.graph;
        let kern = self.kernels.as_ref().ok_or_else(|| xerr(g, id, "packed weights without kernels"))?;
        let x = tensor(vals, ops[0], g, id)?;
        let k = *x.shape.last().ok_or_else(|| xerr(g, id, "a scalar operand"))?;
        let m = x.numel() / k.max(1);
        let product = |w: NodeId| -> Result<Tensor> {
            let out_shape = |n: usize| {
                let mut s = x.shape[..x.shape.len() - 1].to_vec();
                s.push(n);
                s
            };
            match self.packed.get(&w) {
                Some(p) => {
                    if p.k != k {
                        return Err(xerr(g, id, format!("x has {k} columns, weight `{}` {}", g.node(w).name, p.k)));
                    }
                    let y = kern.matmul(p.dtype, &p.bytes, p.n, p.k, &x.data, m).map_err(|e| xerr(g, id, format!("weight `{}`: {e}", g.node(w).name)))?;
                    Ok(Tensor::new(out_shape(p.n), y))
                }
                None => eval(&Op::MatMul { transpose_b: true }, &[x, tensor(vals, w, g, id)?], DType::F32, None).map_err(|e| xerr(g, id, e)),
            }
        };
        if matches!(op, Op::MatMulCat) {
            // every weight packed: one hand-off for all parts
            let packed: Option<Vec<&PackedWeight>> = ops[1..].iter().map(|w| self.packed.get(w)).collect();
            if let Some(ps) = packed.filter(|ps| ps.iter().all(|p| p.k == k)) {
                let parts: Vec<(DType, &[u8], usize)> = ps.iter().map(|p| (p.dtype, &p.bytes[..], p.n)).collect();
                let total: usize = ps.iter().map(|p| p.n).sum();
                let y = kern.matmul_cat(&parts, k, &x.data, m).map_err(|e| xerr(g, id, e))?;
                let mut shape = x.shape[..x.shape.len() - 1].to_vec();
                shape.push(total);
                return Ok(Tensor::new(shape, y));
            }
            let parts: Vec<Tensor> = ops[1..].iter().map(|&w| product(w)).collect::<Result<_>>()?;
            let cols: Vec<(&[f32], usize)> = parts.iter().map(|p| (&p.data[..], *p.shape.last().expect("rank >= 1"))).collect();
            let mut shape = parts[0].shape.clone();
            *shape.last_mut().expect("rank >= 1") = cols.iter().map(|c| c.1).sum();
            return Ok(Tensor::new(shape, concat_columns(&cols, m)));
        }
        // operands: x, W, [bias], [residual (MatMulAdd)]
        let (mm, resid) = match op {
            Op::MatMulAdd { .. } => (&ops[..ops.len() - 1], ops.last()),
            _ => (ops, None),
        };
        let mut y = product(mm[1])?;
        let n = *y.shape.last().expect("rank >= 1");
        if let Some(&b) = mm.get(2) {
            let bias = tensor(vals, b, g, id)?;
            if bias.numel() != n {
                return Err(xerr(g, id, format!("bias of {} for {n} columns", bias.numel())));
            }
            y.data.chunks_exact_mut(n.max(1)).for_each(|row| row.iter_mut().zip(&bias.data).for_each(|(p, q)| *p += q));
        }
        if let Op::MatMulAct { act, .. } = op {
            y.data.iter_mut().for_each(|p| *p = unary(*act, *p));
        }
        if let Some(&r) = resid {
            let r = tensor(vals, r, g, id)?;
            if r.numel() != y.numel() {
                return Err(xerr(g, id, format!("residual of {} values for {}", r.numel(), y.numel())));
            }
            y.data.iter_mut().zip(&r.data).for_each(|(p, q)| *p += q);
        }
        Ok(y)
    }
}

fn tensor<'a>(vals: &'a HashMap<NodeId, Val>, o: NodeId, g: &Graph, at: NodeId) -> Result<&'a Tensor> {
    match vals.get(&o) {
        Some(Val::T(t)) => Ok(t),
        Some(Val::Packed) => Err(xerr(g, at, format!("operand `{}` is a weight held packed for the matmul kernels", g.node(o).name))),
        Some(Val::State(_)) => Err(xerr(g, at, format!("operand `{}` is a state pool; only cache writes and the attention ops take those", g.node(o).name))),
        None => Err(xerr(g, at, format!("operand `{}` was not computed", g.node(o).name))),
    }
}

fn unary(u: UnaryOp, x: f32) -> f32 {
    match u {
        UnaryOp::Neg => -x,
        UnaryOp::Exp => x.exp(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Rsqrt => 1.0 / x.sqrt(),
        UnaryOp::Recip => 1.0 / x,
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Gelu => 0.5 * x * (1.0 + (0.797_884_6 * (x + 0.044715 * x * x * x)).tanh()),
        UnaryOp::GeluErf => 0.5 * x * (1.0 + erf(x / std::f32::consts::SQRT_2)),
    }
}

/// erf to f32 precision (Abramowitz–Stegun 7.1.26 is too coarse; this is the
/// W. J. Cody rational form used by many libms, evaluated in f64).
fn erf(x: f32) -> f32 {
    let x = x as f64;
    let t = 1.0 / (1.0 + 0.5 * x.abs());
    let y = 1.0
        - t * (-x * x - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96 + t * (0.096_784_18 + t * (-0.186_288_06 + t * (0.278_868_07 + t * (-1.135_203_98 + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    (if x >= 0.0 { y } else { -y }) as f32
}

fn binary(b: BinaryOp, x: f32, y: f32) -> f32 {
    match b {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Max => x.max(y),
        BinaryOp::Min => x.min(y),
        BinaryOp::SiluMul => x / (1.0 + (-x).exp()) * y,
    }
}

fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

fn eval(op: &Op, a: &[&Tensor], dtype: DType, declared: Option<&[usize]>) -> Result<Tensor, String> {
    Ok(match op {
        Op::Gather => {
            let (table, idx) = (a[0], a[1]);
            let rows = table.shape[0];
            let w: usize = table.shape[1..].iter().product();
            let mut data = Vec::with_capacity(idx.numel() * w);
            for &i in &idx.data {
                if i < 0.0 || i as usize >= rows {
                    return Err(format!("index {i} out of range 0..{rows}"));
                }
                let i = i as usize;
                data.extend_from_slice(&table.data[i * w..(i + 1) * w]);
            }
            let mut shape = idx.shape.clone();
            shape.extend_from_slice(&table.shape[1..]);
            Tensor::new(shape, data)
        }
        Op::MatMul { transpose_b } => {
            let (x, b) = (a[0], a[1]);
            let k = *x.shape.last().expect("rank >= 2");
            let m = x.numel() / k.max(1);
            let (n, rsb, csb) = if *transpose_b { (b.shape[0], 1isize, k as isize) } else { (b.shape[1], b.shape[1] as isize, 1isize) };
            let mut c = vec![0f32; m * n];
            if let Some(bias) = a.get(2) {
                for row in c.chunks_exact_mut(n) {
                    row.copy_from_slice(&bias.data);
                }
            }
            let beta = if a.len() > 2 { 1.0 } else { 0.0 };
            if m > 0 && n > 0 && k > 0 {
                // SAFETY: the pointers cover m*k, k*n (with the given strides) and m*n floats,
                // which the shape checks in `infer` guarantee.
                unsafe {
                    matrixmultiply::sgemm(m, k, n, 1.0, x.data.as_ptr(), k as isize, 1, b.data.as_ptr(), rsb, csb, beta, c.as_mut_ptr(), n as isize, 1);
                }
            }
            let mut shape = x.shape[..x.shape.len() - 1].to_vec();
            shape.push(n);
            Tensor::new(shape, c)
        }
        Op::MatMulCat => {
            let parts: Vec<Tensor> = a[1..].iter().map(|w| eval(&Op::MatMul { transpose_b: true }, &[a[0], w], dtype, declared)).collect::<Result<_, _>>()?;
            let rows = parts[0].numel() / parts[0].shape.last().copied().unwrap_or(1).max(1);
            let cols: Vec<(&[f32], usize)> = parts.iter().map(|p| (&p.data[..], *p.shape.last().expect("rank >= 2"))).collect();
            let mut shape = parts[0].shape.clone();
            *shape.last_mut().expect("rank >= 2") = cols.iter().map(|c| c.1).sum();
            Tensor::new(shape, concat_columns(&cols, rows))
        }
        Op::MatMulAct { transpose_b, act } => {
            let mut y = eval(&Op::MatMul { transpose_b: *transpose_b }, a, dtype, declared)?;
            y.data.iter_mut().for_each(|p| *p = unary(*act, *p));
            y
        }
        Op::MatMulAdd { transpose_b } => {
            let (mm, r) = a.split_at(a.len() - 1);
            let mut y = eval(&Op::MatMul { transpose_b: *transpose_b }, mm, dtype, declared)?;
            y.data.iter_mut().zip(&r[0].data).for_each(|(p, q)| *p += q);
            y
        }
        Op::Unary(u) => Tensor::new(a[0].shape.clone(), a[0].data.iter().map(|&x| unary(*u, x)).collect()),
        Op::Binary(bop) => {
            let (x, y) = (a[0], a[1]);
            if x.shape == y.shape {
                Tensor::new(x.shape.clone(), x.data.iter().zip(&y.data).map(|(&p, &q)| binary(*bop, p, q)).collect())
            } else {
                let r = x.shape.len().max(y.shape.len());
                let pad = |s: &[usize]| -> Vec<usize> { std::iter::repeat_n(1, r - s.len()).chain(s.iter().copied()).collect() };
                let (xs, ys) = (pad(&x.shape), pad(&y.shape));
                let shape: Vec<usize> = xs.iter().zip(&ys).map(|(&p, &q)| p.max(q)).collect();
                let (sx, sy, so) = (strides(&xs), strides(&ys), strides(&shape));
                let n: usize = shape.iter().product();
                let mut data = Vec::with_capacity(n);
                for i in 0..n {
                    let (mut ix, mut iy) = (0, 0);
                    for d in 0..r {
                        let c = (i / so[d]) % shape[d];
                        if xs[d] != 1 {
                            ix += c * sx[d];
                        }
                        if ys[d] != 1 {
                            iy += c * sy[d];
                        }
                    }
                    data.push(binary(*bop, x.data[ix], y.data[iy]));
                }
                Tensor::new(shape, data)
            }
        }
        Op::RmsNorm { eps } => {
            let (x, w) = (a[0], a[1]);
            let (_, d) = x.rows();
            let mut out = Vec::with_capacity(x.numel());
            for row in x.data.chunks_exact(d) {
                let ms = row.iter().map(|v| v * v).sum::<f32>() / d as f32;
                let r = 1.0 / (ms + eps).sqrt();
                out.extend(row.iter().zip(&w.data).map(|(v, w)| v * r * w));
            }
            Tensor::new(x.shape.clone(), out)
        }
        Op::LayerNorm { eps } => {
            let (x, w, b) = (a[0], a[1], a[2]);
            let (_, d) = x.rows();
            let mut out = Vec::with_capacity(x.numel());
            for row in x.data.chunks_exact(d) {
                let mean = row.iter().sum::<f32>() / d as f32;
                let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / d as f32;
                let r = 1.0 / (var + eps).sqrt();
                out.extend(row.iter().zip(&w.data).zip(&b.data).map(|((v, w), b)| (v - mean) * r * w + b));
            }
            Tensor::new(x.shape.clone(), out)
        }
        Op::Rope { theta, style, rotary_dim } => {
            let inv: Vec<f64> = (0..rotary_dim / 2).map(|i| 1.0 / (*theta as f64).powf((2 * i) as f64 / *rotary_dim as f64)).collect();
            rope(a[0], a[1], *style, *rotary_dim, |p| {
                inv.iter()
                    .map(|f| {
                        let ang = (p as f64 * f) as f32;
                        (ang.cos(), ang.sin())
                    })
                    .collect()
            })
        }
        Op::RopeYarn { theta, style, rotary_dim, yarn } => {
            // HF's arithmetic: f32 frequencies times the f32 position, cos/sin times the factor
            let inv = yarn.inv_freq(*theta, *rotary_dim);
            rope(a[0], a[1], *style, *rotary_dim, |p| {
                inv.iter()
                    .map(|f| {
                        let ang = f * p;
                        (ang.cos() * yarn.attention_factor, ang.sin() * yarn.attention_factor)
                    })
                    .collect()
            })
        }
        Op::HeadMatMul { transpose_b } => {
            let (x, w) = (a[0], a[1]);
            let (t, h, k) = (x.shape[0], x.shape[1], x.shape[2]);
            let n = if *transpose_b { w.shape[1] } else { w.shape[2] };
            let mut out = vec![0f32; t * h * n];
            for hi in 0..h {
                let wh = &w.data[hi * k * n..(hi + 1) * k * n];
                for ti in 0..t {
                    let xr = &x.data[(ti * h + hi) * k..(ti * h + hi + 1) * k];
                    let o = &mut out[(ti * h + hi) * n..(ti * h + hi + 1) * n];
                    for (j, oj) in o.iter_mut().enumerate() {
                        *oj = if *transpose_b { xr.iter().zip(&wh[j * k..(j + 1) * k]).map(|(p, q)| p * q).sum() } else { xr.iter().enumerate().map(|(i, p)| p * wh[i * n + j]).sum() };
                    }
                }
            }
            Tensor::new(vec![t, h, n], out)
        }
        Op::MoeRoute(r) => moe_route(r, a[0], a[1], a.get(2).copied())?,
        Op::MoeExperts => moe_experts(a[0], a[1], a[2], a[3], a[4], a.get(5).copied(), dtype)?,
        Op::Softmax => {
            let x = a[0];
            let (_, d) = x.rows();
            let mut out = Vec::with_capacity(x.numel());
            for row in x.data.chunks_exact(d.max(1)) {
                let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = row.iter().map(|v| (v - m).exp()).collect();
                let s: f32 = e.iter().sum();
                out.extend(e.iter().map(|v| v / s));
            }
            Tensor::new(x.shape.clone(), out)
        }
        Op::TopK { k } => {
            let x = a[0];
            let (_, d) = x.rows();
            let mut out = Vec::new();
            for row in x.data.chunks_exact(d.max(1)) {
                let mut idx: Vec<usize> = (0..d).collect();
                idx.sort_by(|&i, &j| row[j].total_cmp(&row[i]).then(i.cmp(&j)));
                out.extend(idx[..*k].iter().map(|&i| i as f32));
            }
            let mut shape = x.shape.clone();
            *shape.last_mut().expect("rank >= 1") = *k;
            Tensor::new(shape, out)
        }
        Op::TakeAlong => {
            let (x, idx) = (a[0], a[1]);
            let (_, n) = x.rows();
            let (_, k) = idx.rows();
            let mut out = Vec::with_capacity(idx.numel());
            for (r, irow) in idx.data.chunks_exact(k.max(1)).enumerate() {
                for &i in irow {
                    if i < 0.0 || i as usize >= n {
                        return Err(format!("index {i} out of range 0..{n}"));
                    }
                    out.push(x.data[r * n + i as usize]);
                }
            }
            Tensor::new(idx.shape.clone(), out)
        }
        Op::Concat { axis } => {
            let outer: usize = a[0].shape[..*axis].iter().product();
            let mut shape = a[0].shape.clone();
            shape[*axis] = a.iter().map(|t| t.shape[*axis]).sum();
            let mut data = Vec::with_capacity(shape.iter().product());
            for o in 0..outer {
                for t in a {
                    let inner: usize = t.shape[*axis..].iter().product();
                    data.extend_from_slice(&t.data[o * inner..(o + 1) * inner]);
                }
            }
            Tensor::new(shape, data)
        }
        Op::Slice { axis, start, len } => {
            let x = a[0];
            let outer: usize = x.shape[..*axis].iter().product();
            let inner: usize = x.shape[axis + 1..].iter().product();
            let d = x.shape[*axis];
            let mut data = Vec::with_capacity(outer * len * inner);
            for o in 0..outer {
                let base = o * d * inner;
                data.extend_from_slice(&x.data[base + start * inner..base + (start + len) * inner]);
            }
            let mut shape = x.shape.clone();
            shape[*axis] = *len;
            Tensor::new(shape, data)
        }
        Op::Reshape => {
            let x = a[0];
            let shape = declared.ok_or("reshape target has unbound symbols")?.to_vec();
            if shape.iter().product::<usize>() != x.numel() {
                return Err(format!("cannot reshape {:?} to {shape:?}", x.shape));
            }
            Tensor::new(shape, x.data.clone())
        }
        Op::Transpose { perm } => {
            let x = a[0];
            let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
            let (si, so) = (strides(&x.shape), strides(&shape));
            let n = x.numel();
            let mut data = vec![0f32; n];
            for (o, slot) in data.iter_mut().enumerate() {
                let mut src = 0;
                for (d, &p) in perm.iter().enumerate() {
                    src += ((o / so[d]) % shape[d]) * si[p];
                }
                *slot = x.data[src];
            }
            Tensor::new(shape, data)
        }
        Op::Quantize => {
            let x = a[0];
            let scale = a.get(1);
            let data = x
                .data
                .iter()
                .enumerate()
                .map(|(i, &v)| {
                    let s = scale.map(|s| s.data[i % s.numel()]).unwrap_or(1.0);
                    quant::round_to(dtype, v / s)
                })
                .collect();
            if dtype.is_packed() && dtype != DType::I4 {
                // block formats: the f32 value of the quantized blocks
                let enc = quant::encode(dtype, &x.data).ok_or(format!("{} elements are not whole {dtype} blocks", x.numel()))?;
                return Ok(Tensor::new(x.shape.clone(), quant::decode(dtype, &enc, x.numel()).expect("encoded length matches")));
            }
            Tensor::new(x.shape.clone(), data)
        }
        Op::Dequantize => {
            let x = a[0];
            match a.get(1) {
                Some(s) => Tensor::new(x.shape.clone(), x.data.iter().enumerate().map(|(i, &v)| v * s.data[i % s.numel()]).collect()),
                None => x.clone(),
            }
        }
        Op::Cast => Tensor::new(a[0].shape.clone(), a[0].data.iter().map(|&v| quant::round_to(dtype, v)).collect()),
        Op::ActQuant { dtype: q, group } => {
            let x = a[0];
            let (_, d) = x.rows();
            let mut data = x.data.clone();
            quant::act_quant_rows(&mut data, d, *group, *q);
            Tensor::new(x.shape.clone(), data)
        }
        Op::Argmax => {
            let x = a[0];
            let (_, d) = x.rows();
            let data = x.data.chunks_exact(d.max(1)).map(|row| row.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |(bi, bv), (i, &v)| if v > bv { (i, v) } else { (bi, bv) }).0 as f32).collect();
            Tensor::new(x.shape[..x.shape.len() - 1].to_vec(), data)
        }
        Op::Input | Op::Weight | Op::State | Op::CacheWrite | Op::RopeCacheWrite { .. } | Op::PagedAttention { .. } | Op::MlaAttention { .. } | Op::AllReduce => unreachable!("handled by the caller"),
    })
}

/// RoPE over x[T, H, D] at pos[T]; `cs(p)` gives each frequency's (cos, sin) at position p.
fn rope(x: &Tensor, pos: &Tensor, style: RopeStyle, rotary_dim: usize, cs: impl Fn(f32) -> Vec<(f32, f32)>) -> Tensor {
    let (t, h, d) = (x.shape[0], x.shape[1], x.shape[2]);
    let half = rotary_dim / 2;
    let mut out = x.data.clone();
    for ti in 0..t {
        let cs = cs(pos.data[ti]);
        for hi in 0..h {
            let base = (ti * h + hi) * d;
            for (i, &(c, s)) in cs.iter().enumerate() {
                let (i0, i1) = match style {
                    RopeStyle::Interleaved => (2 * i, 2 * i + 1),
                    RopeStyle::Half => (i, i + half),
                };
                let (x0, x1) = (x.data[base + i0], x.data[base + i1]);
                out[base + i0] = x0 * c - x1 * s;
                out[base + i1] = x0 * s + x1 * c;
            }
        }
    }
    Tensor::new(x.shape.clone(), out)
}

/// Indices of the k largest values, largest first (ties: the lower index first).
fn top_indices(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&i, &j| v[j].total_cmp(&v[i]).then(i.cmp(&j)));
    idx.truncate(k);
    idx
}

fn moe_route(r: &MoeRouting, logits: &Tensor, mask: &Tensor, bias: Option<&Tensor>) -> Result<Tensor, String> {
    if r.select == MoeSelect::NoauxTc && bias.is_none() {
        return Err("noaux_tc needs the correction bias".into());
    }
    let (t, e) = (logits.shape[0], logits.shape[1]);
    let mut out = vec![0f32; t * e];
    for ti in 0..t {
        for (i, w) in route_token(r, &logits.data[ti * e..(ti + 1) * e], &mask.data, bias.map(|b| &b.data[..])) {
            out[ti * e + i] = w;
        }
    }
    Ok(Tensor::new(vec![t, e], out))
}

/// DeepSeekMoE's gate for one token, as HF transformers' DeepseekV2/V3TopkRouter: the chosen
/// experts and their weights (scaling applied). Experts with `mask` 0 are disabled, with the
/// least change to everyone else: the groups are ranked as without the mask (a group keeps
/// its place), no choice falls on a disabled expert (its slot goes to the next best), and a
/// softmax gate renormalizes over the enabled experts. The runtime uses it too (to count the
/// selections a disabled expert would have had).
pub fn route_token(r: &MoeRouting, logits: &[f32], mask: &[f32], bias: Option<&[f32]>) -> Vec<(usize, f32)> {
    let e = logits.len();
    let per = e / r.n_group.max(1);
    let on = |i: usize| mask[i] != 0.0;
    if !(0..e).any(on) {
        return vec![];
    }
    let softmax = |row: &[f32], keep: &dyn Fn(usize) -> bool| -> Vec<f32> {
        let m = row.iter().enumerate().filter(|(i, _)| keep(*i)).map(|(_, &v)| v).fold(f32::NEG_INFINITY, f32::max);
        let ex: Vec<f32> = row.iter().enumerate().map(|(i, v)| if keep(i) { (v - m).exp() } else { 0.0 }).collect();
        let s: f32 = ex.iter().sum();
        ex.iter().map(|v| v / s).collect()
    };
    let sigmoid = || logits.iter().map(|&v| 1.0 / (1.0 + (-v).exp())).collect::<Vec<f32>>();
    // the scores that rank the groups (unmasked), and the weights' (renormalized over the enabled)
    let (rank_scores, weights): (Vec<f32>, Vec<f32>) = match r.scoring {
        MoeScoring::Softmax => (softmax(logits, &|_| true), softmax(logits, &on)),
        MoeScoring::Sigmoid => (sigmoid(), sigmoid()),
    };
    let choice: Vec<f32> = match (r.select, bias) {
        (MoeSelect::NoauxTc, Some(b)) => rank_scores.iter().zip(b).map(|(s, b)| s + b).collect(),
        _ => rank_scores,
    };
    let kept_group: Vec<bool> = match r.select {
        MoeSelect::Greedy => vec![true; r.n_group.max(1)],
        MoeSelect::GroupMax | MoeSelect::NoauxTc => {
            let group_score: Vec<f32> = choice
                .chunks_exact(per)
                .map(|g| match r.select {
                    MoeSelect::GroupMax => g.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                    _ => top_indices(g, 2).iter().map(|&i| g[i]).sum(),
                })
                .collect();
            let keep = top_indices(&group_score, r.topk_group);
            (0..group_score.len()).map(|g| keep.contains(&g)).collect()
        }
    };
    // V2 masks the other groups' scores to 0 (HF's masked_fill), V3 its biased choice to -inf;
    // a disabled expert is out of reach either way
    let masked: Vec<f32> = (0..e)
        .map(|i| match (on(i), kept_group[i / per]) {
            (false, _) => f32::NEG_INFINITY,
            (true, true) => choice[i],
            (true, false) if r.select == MoeSelect::GroupMax => 0.0,
            (true, false) => f32::NEG_INFINITY,
        })
        .collect();
    // (fewer reachable experts than top_k leaves those slots empty)
    let chosen: Vec<usize> = top_indices(&masked, r.top_k).into_iter().filter(|&i| masked[i] > f32::NEG_INFINITY).collect();
    // V2 weighs by the group-masked scores (0 outside the kept groups), V3 by the unbiased ones
    let mut w: Vec<f32> = chosen.iter().map(|&i| if r.select == MoeSelect::GroupMax && !kept_group[i / per] { 0.0 } else { weights[i] }).collect();
    if r.normalize {
        let s: f32 = w.iter().sum::<f32>() + 1e-20;
        w.iter_mut().for_each(|v| *v /= s);
    }
    chosen.into_iter().zip(w).map(|(i, v)| (i, v * r.scaling)).collect()
}

/// The routed experts: per expert, its tokens' SwiGLU MLP weighted by their routing weight,
/// summed in expert order (HF's `index_add_`).
fn moe_experts(x: &Tensor, route: &Tensor, gate: &Tensor, up: &Tensor, down: &Tensor, residual: Option<&Tensor>, dtype: DType) -> Result<Tensor, String> {
    let (t, d) = (x.shape[0], x.shape[1]);
    let (e, inter) = (gate.shape[0], gate.shape[1]);
    let mut out = vec![0f32; t * d];
    let slab = |w: &Tensor, i: usize, rows: usize, cols: usize| Tensor::new(vec![rows, cols], w.data[i * rows * cols..(i + 1) * rows * cols].to_vec());
    for ei in 0..e {
        let toks: Vec<usize> = (0..t).filter(|&ti| route.data[ti * e + ei] != 0.0).collect();
        if toks.is_empty() {
            continue;
        }
        let xs = Tensor::new(vec![toks.len(), d], toks.iter().flat_map(|&ti| x.data[ti * d..(ti + 1) * d].iter().copied()).collect());
        let mm = |a: &Tensor, w: &Tensor| eval(&Op::MatMul { transpose_b: true }, &[a, w], dtype, None);
        let g = mm(&xs, &slab(gate, ei, inter, d))?;
        let u = mm(&xs, &slab(up, ei, inter, d))?;
        let h = Tensor::new(g.shape.clone(), g.data.iter().zip(&u.data).map(|(&g, &u)| unary(UnaryOp::Silu, g) * u).collect());
        let y = mm(&h, &slab(down, ei, d, inter))?;
        for (j, &ti) in toks.iter().enumerate() {
            let w = route.data[ti * e + ei];
            for (o, v) in out[ti * d..(ti + 1) * d].iter_mut().zip(&y.data[j * d..(j + 1) * d]) {
                *o += v * w;
            }
        }
    }
    // (the residual last, after the experts' sum: the kernels' order)
    if let Some(r) = residual {
        for (o, v) in out.iter_mut().zip(&r.data) {
            *o += v;
        }
    }
    Ok(Tensor::new(x.shape.clone(), out))
}

/// Attention over MLA's latent cache: every head reads the same rows, keys are the whole
/// latent rows and values their first `l` elements (see `Op::MlaAttention`).
fn mla_attention(q: &Tensor, cache: &Tensor, pos: &Tensor, seq: &Tensor, table: &Tensor, scale: f32, l: usize) -> Result<Tensor, String> {
    let (t, h, c) = (q.shape[0], q.shape[1], q.shape[2]);
    let (nb, bs) = (cache.shape[0], cache.shape[1]);
    let (s, mb) = (table.shape[0], table.shape[1]);
    let mut out = vec![0f32; t * h * l];
    let mut scores = Vec::new();
    for ti in 0..t {
        let rows = context_rows(ti, pos, seq, table, nb, bs, s, mb)?;
        for hi in 0..h {
            let qv = &q.data[(ti * h + hi) * c..(ti * h + hi + 1) * c];
            scores.clear();
            for &r in &rows {
                let kv = &cache.data[r * c..(r + 1) * c];
                scores.push(qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f32>() * scale);
            }
            let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f32;
            for sc in scores.iter_mut() {
                *sc = (*sc - m).exp();
                sum += *sc;
            }
            let o = &mut out[(ti * h + hi) * l..(ti * h + hi + 1) * l];
            for (&r, &w) in rows.iter().zip(scores.iter()) {
                for (oi, vi) in o.iter_mut().zip(&cache.data[r * c..r * c + l]) {
                    *oi += w / sum * vi;
                }
            }
        }
    }
    Ok(Tensor::new(vec![t, h, l], out))
}

/// The pool rows token `ti` attends to: positions 0..=pos[ti] of its sequence, through the
/// block table.
#[allow(clippy::too_many_arguments)]
fn context_rows(ti: usize, pos: &Tensor, seq: &Tensor, table: &Tensor, nb: usize, bs: usize, s: usize, mb: usize) -> Result<Vec<usize>, String> {
    let p = pos.data[ti];
    let sq = seq.data[ti];
    if p < 0.0 || sq < 0.0 || sq as usize >= s {
        return Err(format!("token {ti}: position {p} / sequence {sq} out of range (S = {s})"));
    }
    let (p, sq) = (p as usize, sq as usize);
    let ctx = p + 1;
    if ctx.div_ceil(bs) > mb {
        return Err(format!("token {ti}: position {p} needs {} blocks but the table has {mb}", ctx.div_ceil(bs)));
    }
    (0..ctx)
        .map(|j| {
            let b = table.data[sq * mb + j / bs];
            if b < 0.0 || b as usize >= nb {
                Err(format!("block table entry {b} out of range 0..{nb}"))
            } else {
                Ok(b as usize * bs + j % bs)
            }
        })
        .collect()
}
