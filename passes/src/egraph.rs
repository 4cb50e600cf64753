//! The optimizer: equality saturation over the graph with egg (Willsey et al., "egg: Fast and
//! Extensible Equality Saturation", POPL 2021).
//!
//! The graph goes into an e-graph (one e-node per op, typed: the op, its attributes and its
//! result type are the e-node's key, so only type-preserving rewrites can union classes);
//! rewrite rules add equivalent forms until nothing new appears or a limit is hit; extraction
//! picks, per class, the form the cost model (bytes moved at the H200's bandwidth plus a cost
//! per kernel launch, `cost.rs` in the compiler) finds cheapest; the graph is rebuilt from it,
//! keeping every surviving node's checkpoint-derived name.
//!
//! Rules are Rust functions over e-nodes, in families (each with the identity it uses):
//! - algebra: `reshape(reshape(x)) = reshape(x)`; `cast(x) = x` when the dtype is unchanged.
//! - fusion: `mul(silu(a), b) = silu_mul(a, b)` (SwiGLU's gate in one kernel);
//!   `add(r, matmul(x, W)) = matmul_add(x, W, r)` (the residual add as the matmul epilogue);
//!   `cache_write(c, rope(x, p), s) = rope_cache_write(c, x, s, p)` (RoPE applied on the way
//!   into the KV pool); merge-matmuls: `matmul(x, W_i) = slice_i(matmul_cat(x, W_0, ..))` for
//!   every bias-free matmul of one x with weights of one dtype (Q/K/V, gate/up: one kernel
//!   streams all the weights; the slices are views on the GPU).
//!
//! A rule whose kernels have not yet run on a GPU is listed in [`UNVERIFIED_RULES`] and is off
//! unless enabled (`dsc compile --rule NAME=on`).
//! No rule is commutative or associative over an unbounded set (no blow-up), so the e-graph
//! saturates. Extraction moves one class at a time, then in groups: an alternative over a
//! value nothing uses yet (a matmul_cat) is tried together with every class that has an
//! alternative over that same value (a single class could never pay for the shared kernel).
//! Next fusions: the norm into a matmul prologue, a SwiGLU epilogue of the merged gate/up.

use crate::{Pass, PassError};
use dsc_ir::{BinaryOp, Graph, IrError, NodeId, Op, TensorType, UnaryOp};
use egg::{EGraph, Id, Language};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

/// An e-node: `key` indexes the pass's table of (op, result type, leaf name).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct INode {
    key: u32,
    children: Vec<Id>,
}

impl Language for INode {
    type Discriminant = u32;
    fn discriminant(&self) -> u32 {
        self.key
    }
    fn matches(&self, other: &Self) -> bool {
        self.key == other.key && self.children.len() == other.children.len()
    }
    fn children(&self) -> &[Id] {
        &self.children
    }
    fn children_mut(&mut self) -> &mut [Id] {
        &mut self.children
    }
}

#[derive(Clone, Debug)]
struct Entry {
    op: Op,
    ty: TensorType,
    /// leaves (inputs, weights, states) are distinct by name
    leaf: Option<String>,
}

#[derive(Default)]
struct Table {
    entries: Vec<Entry>,
    index: HashMap<String, u32>,
}

impl Table {
    fn key(&mut self, op: &Op, ty: &TensorType, leaf: Option<&str>) -> u32 {
        let text = format!("{}{:?}:{}:{}", op.name(), op.attrs(), ty, leaf.unwrap_or(""));
        if let Some(&k) = self.index.get(&text) {
            return k;
        }
        let k = self.entries.len() as u32;
        self.entries.push(Entry { op: op.clone(), ty: ty.clone(), leaf: leaf.map(String::from) });
        self.index.insert(text, k);
        k
    }
}

/// Limits on saturation; the stop reason and the e-graph's size are reported.
#[derive(Clone, Debug)]
pub struct Limits {
    pub iterations: usize,
    pub nodes: usize,
    pub time: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { iterations: 16, nodes: 200_000, time: Duration::from_secs(10) }
    }
}

/// Every rule, by the name the pass note and `--rule` use.
pub const RULES: &[&str] = &["reshape-reshape", "cast-same-dtype", "matmul-add", "silu-mul", "rope-cache-write", "merge-matmuls", "matmul-act"];

/// Rules whose fused kernels have not yet been checked on the H200 (`scripts/gpu-check.sh`):
/// off by default.
/// (rope-cache-write passed on 2026-11-29: bench/results/attn16-rope-cache-write-2026-11-29.json.)
/// (matmul-act passed on 2026-11-29, session 6: the bundle's matmul_act gelu cases over every
/// matmul family.)
pub const UNVERIFIED_RULES: &[&str] = &[];

/// Equality saturation + cost-model extraction.
pub struct Optimize {
    pub limits: Limits,
    /// rules that do not fire (default: [`UNVERIFIED_RULES`])
    pub disabled: std::collections::BTreeSet<String>,
    /// the last run's e-graph, as text (`--dump-ir=egraph`)
    last: std::sync::Mutex<Option<String>>,
}

/// What one rule wants added to a class: a new e-node (op, type, children).
struct Add {
    class: Id,
    op: Op,
    ty: TensorType,
    children: Vec<Id>,
    rule: &'static str,
}

type Eg = EGraph<INode, ()>;

impl Default for Optimize {
    fn default() -> Self {
        Optimize { limits: Limits::default(), disabled: UNVERIFIED_RULES.iter().map(|r| r.to_string()).collect(), last: Default::default() }
    }
}

impl Optimize {
    /// Turn a rule on or off by name (an unknown name is an error listing the rules).
    pub fn set_rule(&mut self, name: &str, on: bool) -> Result<(), String> {
        if !RULES.contains(&name) {
            return Err(format!("unknown optimizer rule `{name}` (rules: {})", RULES.join(", ")));
        }
        if on {
            self.disabled.remove(name);
        } else {
            self.disabled.insert(name.to_string());
        }
        Ok(())
    }
}

/// Every rule's matches over the whole e-graph.
fn search(eg: &Eg, t: &Table) -> Vec<Add> {
    let mut out = vec![];
    let entry = |n: &INode| &t.entries[n.key as usize];
    for class in eg.classes() {
        for n in &class.nodes {
            let e = entry(n);
            match &e.op {
                // algebra: reshape(reshape(x)) = reshape(x) to the outer shape
                Op::Reshape => {
                    for inner in &eg[n.children[0]].nodes {
                        if matches!(entry(inner).op, Op::Reshape) {
                            out.push(Add { class: class.id, op: Op::Reshape, ty: e.ty.clone(), children: vec![inner.children[0]], rule: "reshape-reshape" });
                        }
                    }
                }
                // algebra: cast to the dtype it already has is the identity
                Op::Cast => {
                    let src = &eg[n.children[0]];
                    if src.nodes.iter().any(|m| entry(m).ty == e.ty) {
                        out.push(Add { class: class.id, op: Op::Reshape, ty: e.ty.clone(), children: vec![n.children[0]], rule: "cast-same-dtype" });
                    }
                }
                // fusion: add(r, matmul(x, W, bias?)) = matmul_add(x, W, bias?, r): the residual
                // add as the matmul's epilogue (same result type only)
                Op::Binary(BinaryOp::Add) => {
                    for (mm, other) in [(0usize, 1usize), (1, 0)] {
                        for m in &eg[n.children[mm]].nodes {
                            if matches!(entry(m).op, Op::MatMul { transpose_b: true }) && entry(m).ty == e.ty && eg[n.children[other]].nodes.iter().any(|o| entry(o).ty == e.ty) {
                                let mut children = m.children.clone();
                                children.push(n.children[other]);
                                out.push(Add { class: class.id, op: Op::MatMulAdd { transpose_b: true }, ty: e.ty.clone(), children, rule: "matmul-add" });
                            }
                        }
                    }
                }
                // fusion: cache_write(c, rope(x, p), s) = rope_cache_write(c, x, s, p): RoPE on
                // the way into the KV pool (the rotated rows are not materialized)
                Op::CacheWrite => {
                    for r in &eg[n.children[1]].nodes {
                        if let Op::Rope { theta, style, rotary_dim } = entry(r).op {
                            let children = vec![n.children[0], r.children[0], n.children[2], r.children[1]];
                            out.push(Add { class: class.id, op: Op::RopeCacheWrite { theta, style, rotary_dim }, ty: e.ty.clone(), children, rule: "rope-cache-write" });
                        }
                    }
                }
                // fusion: act(matmul(x, W, bias?)) = matmul_act(x, W, bias?): the bias and the
                // activation as the matmul's epilogue (GPT-2/BERT MLPs: gelu(x W1 + b1)). Not
                // silu: in the models we lower silu gates a SwiGLU, which silu-mul and
                // merge-matmuls turn into one gate/up matmul with the SwiGLU in its epilogue
                // (with silu here the extraction split that merge: 8B 260 -> 324 launches)
                Op::Unary(u @ (UnaryOp::Gelu | UnaryOp::GeluErf | UnaryOp::Relu | UnaryOp::Tanh | UnaryOp::Sigmoid)) => {
                    for m in &eg[n.children[0]].nodes {
                        if matches!(entry(m).op, Op::MatMul { transpose_b: true }) && entry(m).ty == e.ty {
                            out.push(Add { class: class.id, op: Op::MatMulAct { transpose_b: true, act: *u }, ty: e.ty.clone(), children: m.children.clone(), rule: "matmul-act" });
                        }
                    }
                }
                // fusion: mul(silu(a), b) = silu_mul(a, b) (SwiGLU), same shapes only
                Op::Binary(BinaryOp::Mul) => {
                    for (gate, other) in [(0usize, 1usize), (1, 0)] {
                        for s in &eg[n.children[gate]].nodes {
                            if matches!(entry(s).op, Op::Unary(UnaryOp::Silu)) {
                                let a = s.children[0];
                                let shape_ok = eg[a].nodes.iter().any(|m| entry(m).ty == e.ty) && eg[n.children[other]].nodes.iter().any(|m| entry(m).ty == e.ty);
                                if shape_ok {
                                    out.push(Add { class: class.id, op: Op::Binary(BinaryOp::SiluMul), ty: e.ty.clone(), children: vec![a, n.children[other]], rule: "silu-mul" });
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Matmuls of one input to merge: the input class, then per part (its class, weight class,
/// output columns), in weight-name order.
struct Merge {
    x: Id,
    parts: Vec<(Id, Id, usize)>,
    ty: TensorType,
}

/// fusion (merge-matmuls): matmul(x, W_0) .. matmul(x, W_{p-1}) over one x, weights of one
/// dtype and no bias, = slice(matmul_cat(x, W_0, .., W_{p-1}), offset_i, N_i) along the last
/// axis: one kernel streams all the weights (Q/K/V, gate/up); the slices are views.
fn search_merges(eg: &Eg, t: &Table) -> Vec<Merge> {
    let entry = |n: &INode| &t.entries[n.key as usize];
    // (x class, weight dtype, K) -> (weight name, matmul class, weight class, N)
    let mut groups: BTreeMap<(Id, String, usize), Vec<(String, Id, Id, usize)>> = BTreeMap::new();
    for class in eg.classes() {
        for n in &class.nodes {
            let e = entry(n);
            if !matches!(e.op, Op::MatMul { transpose_b: true }) || n.children.len() != 2 {
                continue;
            }
            let (x, w) = (eg.find(n.children[0]), eg.find(n.children[1]));
            let Some(wl) = eg[w].nodes.iter().map(entry).find(|we| matches!(we.op, Op::Weight)) else { continue };
            let (Some(nn), Some(k)) = (wl.ty.shape[0].as_const(), wl.ty.shape.get(1).and_then(|d| d.as_const())) else { continue };
            let g = groups.entry((x, wl.ty.dtype.to_string(), k)).or_default();
            if !g.iter().any(|p| p.2 == w) {
                g.push((wl.leaf.clone().unwrap_or_default(), class.id, w, nn));
            }
        }
    }
    let mut out = vec![];
    for ((x, _, _), mut parts) in groups {
        if parts.len() < 2 {
            continue;
        }
        parts.sort_by(|a, b| a.0.cmp(&b.0));
        let any = entry(&eg[parts[0].1].nodes[0]);
        let mut ty = any.ty.clone();
        *ty.shape.last_mut().expect("rank >= 2") = dsc_ir::Dim::Const(parts.iter().map(|p| p.3).sum());
        out.push(Merge { x, parts: parts.into_iter().map(|(_, c, w, n)| (c, w, n)).collect(), ty });
    }
    out
}

/// Cost of one e-node in bytes-equivalent (bandwidth bytes plus a launch as the bytes the
/// H200 streams in 2.5 us): reshapes and casts in place are free.
fn node_cost(t: &Table, n: &INode, child_elems: &[usize]) -> f64 {
    let e = &t.entries[n.key as usize];
    const LAUNCH_BYTES: f64 = 2.5e-6 * 4.62e12;
    let elems = |ty: &TensorType| ty.shape.iter().map(|d| d.as_const().unwrap_or(64)).product::<usize>() as f64;
    match &e.op {
        Op::Input | Op::Weight | Op::State | Op::Reshape => 0.0,
        _ => LAUNCH_BYTES + 4.0 * (elems(&e.ty) + child_elems.iter().sum::<usize>() as f64),
    }
}

impl Pass for Optimize {
    fn name(&self) -> &'static str {
        "optimize"
    }

    fn dump(&self) -> Option<String> {
        self.last.lock().ok().and_then(|l| l.clone())
    }

    fn run(&self, g: Graph) -> Result<(Graph, String), PassError> {
        let ir = |source: IrError| PassError::Ir { pass: "optimize", source };
        let order = g.topo_order().map_err(ir)?;
        let mut t = Table::default();
        let mut eg: Eg = EGraph::default();
        let mut class_of: HashMap<NodeId, Id> = HashMap::new();
        for &id in &order {
            let n = g.node(id);
            let key = t.key(&n.op, &n.ty, n.op.is_leaf().then_some(n.name.as_str()));
            let children = g.operands(id).iter().map(|o| class_of[o]).collect();
            let c = eg.add(INode { key, children });
            class_of.insert(id, c);
        }
        let before = eg.total_number_of_nodes();
        // saturate
        let start = Instant::now();
        let mut applied: BTreeMap<&'static str, usize> = BTreeMap::new();
        let mut iterations = 0;
        let stop = loop {
            if iterations >= self.limits.iterations {
                break "iteration limit";
            }
            if eg.total_number_of_nodes() > self.limits.nodes {
                break "node limit";
            }
            if start.elapsed() > self.limits.time {
                break "time limit";
            }
            iterations += 1;
            let mut adds = search(&eg, &t);
            adds.retain(|a| !self.disabled.contains(a.rule));
            let mut changed = false;
            for a in adds {
                let key = t.key(&a.op, &a.ty, None);
                let id = eg.add(INode { key, children: a.children });
                if eg.union(a.class, id) {
                    changed = true;
                    *applied.entry(a.rule).or_default() += 1;
                }
            }
            if !self.disabled.contains("merge-matmuls") {
                for m in search_merges(&eg, &t) {
                    let mut children = vec![m.x];
                    children.extend(m.parts.iter().map(|p| p.1));
                    let key = t.key(&Op::MatMulCat, &m.ty, None);
                    let cat = eg.add(INode { key, children });
                    let (mut off, mut merged) = (0, false);
                    for &(class, _, n) in &m.parts {
                        let ty = t.entries[eg[class].nodes[0].key as usize].ty.clone();
                        let op = Op::Slice { axis: ty.rank() - 1, start: off, len: n };
                        off += n;
                        let key = t.key(&op, &ty, None);
                        let id = eg.add(INode { key, children: vec![cat] });
                        merged |= eg.union(class, id);
                    }
                    if merged {
                        changed = true;
                        *applied.entry("merge-matmuls").or_default() += 1;
                    }
                }
            }
            eg.rebuild();
            if !changed {
                break "saturated";
            }
        };
        // extract. Summing children's costs per tree would count shared values once per use
        // (exponentially many in a residual network), so the cost of a choice is the DAG's:
        // the own cost of every class reachable from the roots, each once. Start from any
        // extractable node per class, then switch classes to alternatives while that lowers
        // the DAG cost (a local search; fine while rules offer few alternatives per class).
        // inputs first (they keep their order), then the outputs and the cache writes (effects)
        let mut roots: Vec<Id> = order.iter().filter(|&&id| matches!(g.node(id).op, Op::Input)).map(|id| eg.find(class_of[id])).collect();
        roots.extend(g.outputs.iter().map(|(_, id)| eg.find(class_of[id])));
        roots.extend(order.iter().filter(|&&id| g.node(id).op.writes_state()).map(|id| eg.find(class_of[id])));
        let elems_of = |c: Id| -> usize { eg[c].nodes.first().map(|n| t.entries[n.key as usize].ty.shape.iter().map(|d| d.as_const().unwrap_or(64)).product::<usize>()).unwrap_or(0) };
        let own = |n: &INode| -> f64 {
            // a slice of merged matmuls is a view of the kernel's output (a part of it)
            if matches!(t.entries[n.key as usize].op, Op::Slice { .. }) && eg[n.children[0]].nodes.iter().any(|m| matches!(t.entries[m.key as usize].op, Op::MatMulCat)) {
                return 0.0;
            }
            node_cost(&t, n, &n.children.iter().map(|&c| elems_of(eg.find(c))).collect::<Vec<_>>())
        };
        let mut choice: HashMap<Id, INode> = HashMap::new();
        // the original graph's classes in its topological order first (one pass: each has its
        // original node's operands chosen before it), then the classes rewrites created
        for &id in &order {
            let c = eg.find(class_of[&id]);
            if choice.contains_key(&c) {
                continue;
            }
            if let Some(n) = eg[c].nodes.iter().find(|n| n.children.iter().all(|k| choice.contains_key(&eg.find(*k)))) {
                choice.insert(c, n.clone());
            }
        }
        loop {
            let mut progress = false;
            for class in eg.classes() {
                if choice.contains_key(&class.id) {
                    continue;
                }
                if let Some(n) = class.nodes.iter().find(|n| n.children.iter().all(|c| choice.contains_key(&eg.find(*c)))) {
                    choice.insert(class.id, n.clone());
                    progress = true;
                }
            }
            if !progress {
                break;
            }
        }
        // DAG cost of a choice, or None when it is cyclic or incomplete
        let dag_cost = |choice: &HashMap<Id, INode>| -> Option<f64> {
            let mut state: HashMap<Id, u8> = HashMap::new(); // 1 = on stack, 2 = done
            let mut total = 0.0;
            let mut stack: Vec<(Id, bool)> = roots.iter().map(|&r| (r, false)).collect();
            while let Some((c, exit)) = stack.pop() {
                if exit {
                    state.insert(c, 2);
                    continue;
                }
                match state.get(&c) {
                    Some(2) => continue,
                    Some(_) => return None,
                    None => {}
                }
                let n = choice.get(&c)?;
                state.insert(c, 1);
                total += own(n);
                stack.push((c, true));
                for &k in &n.children {
                    let k = eg.find(k);
                    match state.get(&k) {
                        Some(2) => {}
                        Some(_) => return None,
                        None => stack.push((k, false)),
                    }
                }
            }
            Some(total)
        };
        dag_cost(&choice).ok_or_else(|| ir(IrError::Verify { node: g.name.clone(), op: "optimize", msg: "no acyclic extraction".into() }))?;
        // single-class moves, costed locally: `rc` counts each class's uses by live classes
        // (roots once more); switching a class from o to n adds what n newly makes live and
        // removes what only o kept alive (linear in the graph overall, not one DAG walk per
        // alternative). Rewrites only add nodes over their original's operands or deeper, so a
        // move cannot close a cycle; the final DAG walk checks it anyway.
        let count_uses = |choice: &HashMap<Id, INode>| -> HashMap<Id, i64> {
            let mut rc: HashMap<Id, i64> = HashMap::new();
            let mut stack: Vec<Id> = vec![];
            for &r in &roots {
                *rc.entry(r).or_default() += 1;
                if rc[&r] == 1 {
                    stack.push(r);
                }
            }
            while let Some(c) = stack.pop() {
                if let Some(n) = choice.get(&c) {
                    for &k in &n.children {
                        let k = eg.find(k);
                        let e = rc.entry(k).or_default();
                        *e += 1;
                        if *e == 1 {
                            stack.push(k);
                        }
                    }
                }
            }
            rc
        };
        for _round in 0..4 {
            let mut moved = false;
            let mut rc = count_uses(&choice);
            // classes nothing live uses yet take their cheapest form, so a move that makes one
            // live is costed with it (a Q projection that is otherwise computed inside a
            // residual matmul_add comes back as a free slice of the merged matmul)
            for c in eg.classes().filter(|c| c.nodes.len() > 1 && rc.get(&c.id).copied().unwrap_or(0) == 0) {
                if let Some(n) = c.nodes.iter().filter(|n| n.children.iter().all(|k| choice.contains_key(&eg.find(*k)))).min_by(|a, b| own(a).total_cmp(&own(b))) {
                    choice.insert(c.id, n.clone());
                }
            }
            let start_choice = choice.clone();
            let mut multi: Vec<Id> = eg.classes().filter(|c| c.nodes.len() > 1).map(|c| c.id).collect();
            multi.sort();
            for _ in 0..4 {
                let mut improved = false;
                for &cid in &multi {
                    if rc.get(&cid).copied().unwrap_or(0) == 0 {
                        continue;
                    }
                    for n in &eg[cid].nodes {
                        let Some(o) = choice.get(&cid).cloned() else { continue };
                        if &o == n || n.children.iter().any(|k| !choice.contains_key(&eg.find(*k))) {
                            continue;
                        }
                        let mut drc: HashMap<Id, i64> = HashMap::new();
                        let mut delta = own(n) - own(&o);
                        // what n makes live
                        let mut stack: Vec<Id> = n.children.iter().map(|&k| eg.find(k)).collect();
                        while let Some(k) = stack.pop() {
                            let d = drc.entry(k).or_default();
                            *d += 1;
                            if rc.get(&k).copied().unwrap_or(0) + *d == 1 {
                                let m = &choice[&k];
                                delta += own(m);
                                stack.extend(m.children.iter().map(|&j| eg.find(j)));
                            }
                        }
                        // what only o kept alive
                        let mut stack: Vec<Id> = o.children.iter().map(|&k| eg.find(k)).collect();
                        while let Some(k) = stack.pop() {
                            let d = drc.entry(k).or_default();
                            *d -= 1;
                            if rc.get(&k).copied().unwrap_or(0) + *d == 0 {
                                if let Some(m) = choice.get(&k) {
                                    delta -= own(m);
                                    stack.extend(m.children.iter().map(|&j| eg.find(j)));
                                }
                            }
                        }
                        if delta < -1.0 {
                            for (k, d) in drc {
                                *rc.entry(k).or_default() += d;
                            }
                            choice.insert(cid, n.clone());
                            improved = true;
                            moved = true;
                        }
                    }
                }
                if !improved {
                    break;
                }
            }
            // (a cycle cannot form, see above; if one did, this round's moves are dropped)
            if dag_cost(&choice).is_none() {
                choice = start_choice;
            }
            // group moves: an alternative over a value nothing uses yet (merged matmuls) pays for
            // that value alone, so switch every class with an alternative over the same new value
            // together (the Q, K and V classes to their slices of one matmul_cat). Costed locally
            // (linear in the graph): the group's new nodes plus the new values' own cost against
            // the group's old nodes; values the old nodes alone used are not credited (a move can
            // only look worse than it is). The whole choice is checked acyclic afterwards.
            let mut live: std::collections::HashSet<Id> = std::collections::HashSet::new();
            let mut stack: Vec<Id> = roots.clone();
            while let Some(c) = stack.pop() {
                if live.insert(c) {
                    if let Some(n) = choice.get(&c) {
                        stack.extend(n.children.iter().map(|&k| eg.find(k)));
                    }
                }
            }
            let mut users_of: HashMap<Id, Vec<(Id, INode)>> = HashMap::new();
            let mut classes: Vec<Id> = eg.classes().filter(|c| c.nodes.len() > 1).map(|c| c.id).collect();
            classes.sort();
            for &cid in &classes {
                for n in &eg[cid].nodes {
                    for &k in &n.children {
                        users_of.entry(eg.find(k)).or_default().push((cid, n.clone()));
                    }
                }
            }
            let before_groups = choice.clone();
            let mut grouped = false;
            for &cid in &classes {
                if !live.contains(&cid) {
                    continue;
                }
                for n in &eg[cid].nodes {
                    if choice.get(&cid) == Some(n) {
                        continue;
                    }
                    let fresh: Vec<Id> = n.children.iter().map(|&k| eg.find(k)).filter(|k| !live.contains(k)).collect();
                    // a new value whose own inputs are all computed already
                    if fresh.is_empty() || !fresh.iter().all(|f| choice.get(f).is_some_and(|m| m.children.iter().all(|k| live.contains(&eg.find(*k))))) {
                        continue;
                    }
                    let mut moves: Vec<(Id, INode)> = vec![(cid, n.clone())];
                    for f in &fresh {
                        for (other, m) in users_of.get(f).into_iter().flatten() {
                            if live.contains(other) && !moves.iter().any(|(c, _)| c == other) && choice.get(other) != Some(m) {
                                moves.push((*other, m.clone()));
                            }
                        }
                    }
                    let new_cost: f64 = moves.iter().map(|(_, m)| own(m)).sum::<f64>() + fresh.iter().map(|f| own(&choice[f])).sum::<f64>();
                    let old_cost: f64 = moves.iter().map(|(c, _)| own(&choice[c])).sum();
                    if new_cost < old_cost - 1.0 {
                        for (c, m) in moves {
                            choice.insert(c, m);
                        }
                        live.extend(fresh);
                        grouped = true;
                    }
                }
            }
            if grouped && dag_cost(&choice).is_none() {
                choice = before_groups;
                grouped = false;
            }
            // a group move can make single moves pay again (and the other way round)
            if !moved && !grouped {
                break;
            }
        }
        let best: HashMap<Id, (f64, INode)> = choice.into_iter().map(|(k, n)| (k, (0.0, n))).collect();
        // each class keeps the name of its first original node (after unions)
        let mut names: HashMap<Id, String> = HashMap::new();
        for &id in &order {
            names.entry(eg.find(class_of[&id])).or_insert_with(|| g.node(id).name.clone());
        }
        // a merged matmul is named after its weights: the shared prefix, then each weight's
        // own part ("model.layers.0.self_attn.q_proj+k_proj+v_proj")
        for (c, (_, n)) in &best {
            if names.contains_key(c) || !matches!(t.entries[n.key as usize].op, Op::MatMulCat) {
                continue;
            }
            let ws: Vec<String> =
                n.children[1..].iter().filter_map(|&k| eg[k].nodes.iter().find_map(|m| t.entries[m.key as usize].leaf.clone())).map(|w| w.strip_suffix(".weight").unwrap_or(&w).to_string()).collect();
            if let Some(first) = ws.first() {
                let cut = first.rfind('.').map(|i| i + 1).unwrap_or(0);
                let prefix = &first[..cut];
                let rest: Vec<&str> = ws.iter().map(|w| w.strip_prefix(prefix).unwrap_or(w)).collect();
                names.insert(*c, format!("{prefix}{}", rest.join("+")));
            }
        }
        // rebuild the graph from the roots: outputs and cache writes (effects)
        let mut out = Graph::new(g.name.clone());
        let mut built: HashMap<Id, NodeId> = HashMap::new();
        let mut used: HashMap<String, usize> = HashMap::new();
        // outputs, cache writes (effects) and inputs (the calling convention) are the roots
        for r in roots {
            build(&eg, &t, &best, &names, r, &mut out, &mut built, &mut used).map_err(ir)?;
        }
        for (name, id) in &g.outputs {
            out.set_output(name.clone(), built[&eg.find(class_of[id])]);
        }
        // the e-graph for people: every class with its alternatives, the extracted one starred
        let mut dump = format!("// e-graph after saturation ({stop}): {} classes\n", eg.number_of_classes());
        let mut classes: Vec<_> = eg.classes().collect();
        classes.sort_by_key(|c| c.id);
        for c in classes {
            let e0 = &t.entries[c.nodes[0].key as usize];
            let chosen = best.get(&c.id).map(|b| &b.1);
            let alts: Vec<String> = c
                .nodes
                .iter()
                .map(|n| {
                    let e = &t.entries[n.key as usize];
                    let star = if Some(n) == chosen { "*" } else { "" };
                    let args: Vec<String> = n.children.iter().map(|k| format!("c{}", eg.find(*k))).collect();
                    format!("{star}{}({})", e.leaf.as_deref().unwrap_or(e.op.name()), args.join(", "))
                })
                .collect();
            dump.push_str(&format!("c{} {} : {} = {}\n", c.id, names.get(&c.id).map(String::as_str).unwrap_or("-"), e0.ty, alts.join(" | ")));
        }
        if let Ok(mut l) = self.last.lock() {
            *l = Some(dump);
        }
        let launches = |g: &Graph| g.node_ids().filter(|&n| !g.node(n).op.is_leaf() && !matches!(g.node(n).op, Op::Reshape | Op::AllReduce) && !is_part_view(g, n)).count();
        let rules: Vec<String> = applied.iter().map(|(r, n)| format!("{r} x{n}")).collect();
        let note = format!(
            "{iterations} iterations, stop: {stop}, e-graph {} e-nodes ({before} before saturation) in {} classes, rewrites: [{}], kernels {} -> {}, {:.0} ms",
            eg.total_number_of_nodes(),
            eg.number_of_classes(),
            rules.join(", "),
            launches(&g),
            launches(&out),
            start.elapsed().as_secs_f64() * 1e3
        );
        Ok((out, note))
    }
}

/// A slice of a merged matmul's output: a view (no kernel) on the GPU.
pub fn is_part_view(g: &Graph, n: NodeId) -> bool {
    matches!(g.node(n).op, Op::Slice { .. }) && g.operands(n).first().is_some_and(|&o| matches!(g.node(o).op, Op::MatMulCat))
}

#[allow(clippy::too_many_arguments)]
fn build(
    eg: &Eg,
    t: &Table,
    best: &HashMap<Id, (f64, INode)>,
    names: &HashMap<Id, String>,
    class: Id,
    out: &mut Graph,
    built: &mut HashMap<Id, NodeId>,
    used: &mut HashMap<String, usize>,
) -> Result<NodeId, IrError> {
    let class = eg.find(class);
    if let Some(&n) = built.get(&class) {
        return Ok(n);
    }
    let (_, node) = best.get(&class).ok_or_else(|| IrError::Verify { node: names.get(&class).cloned().unwrap_or_default(), op: "optimize", msg: "no extractable form".into() })?;
    let mut kids = vec![];
    for &c in &node.children {
        kids.push(build(eg, t, best, names, c, out, built, used)?);
    }
    let e = &t.entries[node.key as usize];
    // the class's original name; a second use of a name (a class split by extraction) is
    // suffixed
    let base = e.leaf.clone().or_else(|| names.get(&class).cloned()).unwrap_or_else(|| format!("{}.{}", e.op.name(), class));
    let k = used.entry(base.clone()).or_default();
    let name = if *k == 0 { base } else { format!("{base}.{k}") };
    *k += 1;
    let id = out.add(name, e.op.clone(), &kids, Some(e.ty.clone()))?;
    built.insert(class, id);
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsc_ir::{text, DType, Executor, Tensor};
    use rand::{Rng, SeedableRng};
    use std::collections::BTreeMap;

    fn run_both(src: &str, inputs: &[(&str, Vec<usize>)]) -> (Graph, String) {
        let g = text::parse(src).unwrap();
        let (o, note) = Optimize::default().run(g.clone()).unwrap();
        o.verify().unwrap();
        // fused ops round-trip through the text format (plans store the graph as text)
        assert_eq!(text::print(&text::parse(&text::print(&o)).unwrap()), text::print(&o));
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let weights: HashMap<String, (DType, Vec<usize>, Vec<u8>)> = g
            .leaves(&Op::Weight)
            .into_iter()
            .map(|id| {
                let n = g.node(id);
                let s: Vec<usize> = n.ty.shape.iter().map(|d| d.as_const().unwrap()).collect();
                let v: Vec<f32> = (0..s.iter().product::<usize>()).map(|_| rng.random_range(-1.0..1.0)).collect();
                (n.name.clone(), (DType::F32, s, dsc_ir::quant::encode(DType::F32, &v).unwrap()))
            })
            .collect();
        for _ in 0..3 {
            let ins: BTreeMap<String, Tensor> =
                inputs.iter().map(|(n, s)| (n.to_string(), Tensor::new(s.clone(), (0..s.iter().product::<usize>()).map(|_| rng.random_range(-3.0..3.0)).collect()))).collect();
            let a = Executor::new(&g, &weights, BTreeMap::new()).unwrap().run(&ins).unwrap();
            let b = Executor::new(&o, &weights, BTreeMap::new()).unwrap().run(&ins).unwrap();
            for (k, x) in &a {
                let y = &b[k];
                let err = x.data.iter().zip(&y.data).map(|(p, q)| (p - q).abs() / (1.0 + p.abs())).fold(0f32, f32::max);
                assert!(err < 1e-5, "output {k}: {err}\n{}", text::print(&o));
            }
        }
        (o, note)
    }

    #[test]
    fn matmuls_of_one_input_merge_into_one_kernel_read_through_slices() {
        // Q/K/V-like (three weights, one shared by an add) and a lone matmul of another input
        let src = "graph \"t\" {\n  %x = input : f32[3, 16]\n  %y = input : f32[3, 8]\n  %wq = weight : f32[8, 16]\n  %wk = weight : f32[4, 16]\n  %wv = weight : f32[4, 16]\n  %wo = weight : f32[5, 8]\n  %q = matmul(%x, %wq) {transpose_b = true} : f32[3, 8]\n  %k = matmul(%x, %wk) {transpose_b = true} : f32[3, 4]\n  %v = matmul(%x, %wv) {transpose_b = true} : f32[3, 4]\n  %s = add(%k, %v) : f32[3, 4]\n  %o = matmul(%y, %wo) {transpose_b = true} : f32[3, 5]\n  output q = %q\n  output s = %s\n  output o = %o\n}\n";
        let (o, note) = run_both(src, &[("x", vec![3, 16]), ("y", vec![3, 8])]);
        let p = text::print(&o);
        assert!(p.contains("%wk+wq+wv = matmul_cat(%x, %wk, %wq, %wv) : f32[3, 16]"), "{p}");
        assert!(p.contains("%q = slice(%wk+wq+wv) {axis = 1, start = 4, len = 8}"), "{p}");
        assert!(p.contains("%o = matmul(%y, %wo)"), "{p}");
        assert!(note.contains("merge-matmuls x1") && note.contains("kernels 5 -> 3"), "{note}");
        // off: three matmuls stay
        let mut off = Optimize::default();
        off.set_rule("merge-matmuls", false).unwrap();
        let (o, _) = off.run(text::parse(src).unwrap()).unwrap();
        assert!(!text::print(&o).contains("matmul_cat"));
    }

    #[test]
    fn rope_fuses_into_the_cache_write_when_enabled_and_the_pool_gets_the_same_rows() {
        let src = "graph \"t\" {\n  %x = input : f32[3, 2, 8]\n  %p = input : i32[3]\n  %s = input : i32[3]\n  %c = state : f32[4, 2, 2, 8]\n  %r = rope(%x, %p) {theta = 10000.0, style = half, rotary_dim = 8} : f32[3, 2, 8]\n  %w = cache_write(%c, %r, %s) : f32[4, 2, 2, 8]\n  output c = %w\n}\n";
        let g = text::parse(src).unwrap();
        // on by default (its kernel passed the H200 check); --rule rope-cache-write=off keeps them apart
        let mut off = Optimize::default();
        off.set_rule("rope-cache-write", false).unwrap();
        let (o, note) = off.run(g.clone()).unwrap();
        assert!(!text::print(&o).contains("rope_cache_write") && !note.contains("rope-cache-write"), "{note}");
        let opt = Optimize::default();
        assert!(Optimize::default().set_rule("no-such-rule", true).unwrap_err().contains("rope-cache-write"));
        let (o, note) = opt.run(g.clone()).unwrap();
        o.verify().unwrap();
        let p = text::print(&o);
        assert!(p.contains("%w = rope_cache_write(%c, %x, %s, %p) {theta = 10000.0, style = half, rotary_dim = 8}") && !p.contains("= rope("), "{p}");
        assert!(note.contains("rope-cache-write x1") && note.contains("kernels 2 -> 1"), "{note}");
        assert_eq!(text::print(&text::parse(&p).unwrap()), p);
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        for _ in 0..3 {
            let x: Vec<f32> = (0..48).map(|_| rng.random_range(-3.0..3.0)).collect();
            let ins: BTreeMap<String, Tensor> = [
                ("x".to_string(), Tensor::new(vec![3, 2, 8], x)),
                ("p".to_string(), Tensor::new(vec![3], vec![rng.random_range(0..500) as f32, 7.0, 1.0])),
                ("s".to_string(), Tensor::new(vec![3], vec![5.0, 0.0, 7.0])),
            ]
            .into();
            let none = HashMap::new();
            let a = Executor::new(&g, &none, BTreeMap::new()).unwrap().run(&ins).unwrap();
            let b = Executor::new(&o, &none, BTreeMap::new()).unwrap().run(&ins).unwrap();
            assert!(a["c"].data.iter().any(|v| *v != 0.0));
            assert_eq!(a["c"].data, b["c"].data);
        }
    }

    #[test]
    fn silu_mul_fuses_and_keeps_semantics() {
        let src = "graph \"t\" {\n  %x = input : f32[4, 8]\n  %wg = weight : f32[16, 8]\n  %wu = weight : f32[16, 8]\n  %g = matmul(%x, %wg) {transpose_b = true} : f32[4, 16]\n  %u = matmul(%x, %wu) {transpose_b = true} : f32[4, 16]\n  %s = silu(%g) : f32[4, 16]\n  %m = mul(%s, %u) : f32[4, 16]\n  output y = %m\n}\n";
        let (o, note) = run_both(src, &[("x", vec![4, 8])]);
        let p = text::print(&o);
        assert!(p.contains("%m = silu_mul(%g, %u) : f32[4, 16]") && !p.contains("silu(%g)"), "{p}");
        // gate and up are also merged into one matmul_cat (read through two slices)
        assert!(p.contains("%wg+wu = matmul_cat(%x, %wg, %wu) : f32[4, 32]") && p.contains("%u = slice(%wg+wu) {axis = 1, start = 16, len = 16}"), "{p}");
        assert!(note.contains("stop: saturated") && note.contains("silu-mul x1") && note.contains("merge-matmuls x1") && note.contains("kernels 4 -> 2"), "{note}");
    }

    #[test]
    fn silu_on_the_right_fuses_but_a_shared_silu_stays() {
        let src = "graph \"t\" {\n  %a = input : f32[3, 5]\n  %b = input : f32[3, 5]\n  %s = silu(%a) : f32[3, 5]\n  %m = mul(%b, %s) : f32[3, 5]\n  output y = %m\n}\n";
        let (o, _) = run_both(src, &[("a", vec![3, 5]), ("b", vec![3, 5])]);
        assert!(text::print(&o).contains("%m = silu_mul(%a, %b)"), "{}", text::print(&o));
        // the silu is used twice: fusing one use would still launch it, so nothing is gained
        // and extraction keeps the original (the cost is the DAG's, not a tree's)
        let src =
            "graph \"t\" {\n  %a = input : f32[3, 5]\n  %b = input : f32[3, 5]\n  %s = silu(%a) : f32[3, 5]\n  %m = mul(%b, %s) : f32[3, 5]\n  %n = add(%m, %s) : f32[3, 5]\n  output y = %n\n}\n";
        let (o, note) = run_both(src, &[("a", vec![3, 5]), ("b", vec![3, 5])]);
        let p = text::print(&o);
        assert!(p.starts_with("graph \"t\" {\n  %a = input : f32[3, 5]\n  %b = input"), "inputs keep their order: {p}");
        assert!(note.contains("kernels 3 -> 3"), "{note}");
    }

    #[test]
    fn residual_add_becomes_the_matmul_epilogue() {
        let src = "graph \"t\" {\n  %x = input : f32[3, 8]\n  %w = weight : f32[8, 8]\n  %b = weight : f32[8]\n  %m = matmul(%x, %w, %b) {transpose_b = true} : f32[3, 8]\n  %y = add(%x, %m) : f32[3, 8]\n  %m2 = matmul(%y, %w) {transpose_b = true} : f32[3, 8]\n  %z = add(%m2, %y) : f32[3, 8]\n  output z = %z\n}\n";
        let (o, note) = run_both(src, &[("x", vec![3, 8])]);
        let p = text::print(&o);
        assert!(p.contains("%y = matmul_add(%x, %w, %b, %x)") && p.contains("%z = matmul_add(%y, %w, %y)"), "{p}");
        assert!(note.contains("matmul-add x2") && note.contains("kernels 4 -> 2"), "{note}");
    }

    #[test]
    fn reshape_chains_and_same_dtype_casts_fold() {
        let src = "graph \"t\" {\n  %x = input : f32[2, 12]\n  %r1 = reshape(%x) : f32[2, 3, 4]\n  %r2 = reshape(%r1) : f32[6, 4]\n  %c = cast(%r2) : f32[6, 4]\n  %e = exp(%c) : f32[6, 4]\n  output y = %e\n}\n";
        let (o, note) = run_both(src, &[("x", vec![2, 12])]);
        let p = text::print(&o);
        assert!(!p.contains("cast") && p.matches("reshape").count() == 1, "{p}");
        assert!(note.contains("reshape-reshape") && note.contains("cast-same-dtype"), "{note}");
    }

    #[test]
    fn the_llama_graph_fuses_every_swiglu_and_keeps_its_names() {
        // the tiny llama of the partitioning tests, one layer, via the text format
        let src = r#"graph "mini" {
  %tokens = input : i32[T]
  %emb = weight : f32[50, 16]
  %x = gather(%emb, %tokens) : f32[T, 16]
  %wg = weight : f32[32, 16]
  %wu = weight : f32[32, 16]
  %wd = weight : f32[16, 32]
  %blk.0.ffn_gate = matmul(%x, %wg) {transpose_b = true} : f32[T, 32]
  %blk.0.ffn_up = matmul(%x, %wu) {transpose_b = true} : f32[T, 32]
  %blk.0.ffn_gate.silu = silu(%blk.0.ffn_gate) : f32[T, 32]
  %blk.0.ffn_up.swiglu = mul(%blk.0.ffn_gate.silu, %blk.0.ffn_up) : f32[T, 32]
  %blk.0.ffn_down = matmul(%blk.0.ffn_up.swiglu, %wd) {transpose_b = true} : f32[T, 16]
  %y = add(%x, %blk.0.ffn_down) : f32[T, 16]
  output y = %y
}
"#;
        let g = text::parse(src).unwrap();
        let (o, note) = Optimize::default().run(g).unwrap();
        let p = text::print(&o);
        assert!(p.contains("%blk.0.ffn_up.swiglu = silu_mul(%blk.0.ffn_gate, %blk.0.ffn_up)"), "{p}");
        assert!(p.contains("%y = matmul_add(%blk.0.ffn_up.swiglu, %wd, %x) {transpose_b = true} : f32[T, 16]"), "{p}");
        // gate/up merged: SwiGLU, the residual epilogue and the merge save three kernels
        assert!(note.contains("kernels 7 -> 4"), "{note}");
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use dsc_ir::{text, DType, Executor, Tensor};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// A random graph over [2, 6] inputs a, b built from the ops the rules touch (silu, mul,
    /// reshape chains, same-dtype casts) and others around them (add, exp, neg).
    fn graph(ops: &[(u8, u8, u8)]) -> String {
        let mut lines = vec!["  %a = input : f32[2, 6]".to_string(), "  %b = input : f32[2, 6]".to_string()];
        let mut vals = vec!["a".to_string(), "b".to_string()];
        for (i, &(op, x, y)) in ops.iter().enumerate() {
            let x = vals[x as usize % vals.len()].clone();
            let y = vals[y as usize % vals.len()].clone();
            let v = format!("v{i}");
            lines.push(match op % 7 {
                0 => format!("  %{v} = silu(%{x}) : f32[2, 6]"),
                1 => format!("  %{v} = mul(%{x}, %{y}) : f32[2, 6]"),
                2 => format!("  %{v}r = reshape(%{x}) : f32[3, 4]\n  %{v} = reshape(%{v}r) : f32[2, 6]"),
                3 => format!("  %{v} = cast(%{x}) : f32[2, 6]"),
                4 => format!("  %{v} = add(%{x}, %{y}) : f32[2, 6]"),
                5 => format!("  %{v} = neg(%{x}) : f32[2, 6]"),
                _ => format!("  %{v}s = silu(%{x}) : f32[2, 6]\n  %{v} = mul(%{v}s, %{y}) : f32[2, 6]"),
            });
            vals.push(v);
        }
        format!("graph \"p\" {{\n{}\n  output y = %{}\n}}\n", lines.join("\n"), vals.last().unwrap())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        /// Every rule, on random graphs: the optimized graph verifies and computes the same
        /// outputs as the original on fresh random inputs, with no more kernels.
        #[test]
        fn optimized_random_graphs_are_equivalent(ops in proptest::collection::vec((0u8..7, 0u8..16, 0u8..16), 1..14), seed in 0u64..1000) {
            let src = graph(&ops);
            let g = text::parse(&src).unwrap();
            let (o, note) = Optimize::default().run(g.clone()).unwrap();
            o.verify().map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
            let w: HashMap<String, (DType, Vec<usize>, Vec<u8>)> = HashMap::new();
            let mut s = seed;
            let mut rnd = || { s = dsc_ir::seeded::splitmix64(s); ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0 };
            let ins: BTreeMap<String, Tensor> = ["a", "b"].iter().map(|n| (n.to_string(), Tensor::new(vec![2, 6], (0..12).map(|_| rnd()).collect()))).collect();
            let x = Executor::new(&g, &w, BTreeMap::new()).unwrap().run(&ins).unwrap();
            let y = Executor::new(&o, &w, BTreeMap::new()).unwrap().run(&ins).unwrap();
            for (k, t) in &x {
                let err = t.data.iter().zip(&y[k].data).map(|(p, q)| (p - q).abs() / (1.0 + p.abs())).fold(0f32, f32::max);
                prop_assert!(err < 1e-5, "{k}: {err}\n{src}\n{}", text::print(&o));
            }
            let k = note.split("kernels ").nth(1).unwrap();
            let before: usize = k.split(" -> ").next().unwrap().parse().unwrap();
            let after: usize = k.split(" -> ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
            prop_assert!(after <= before, "{note}");
        }

        /// matmul-act on random variations: act(matmul(x, W, bias?)) for each lowered activation, with and without a
        /// bias, random rows, sometimes a second user of the matmul (then it must stay whole): the
        /// optimized graph computes the same outputs, fused exactly when the matmul has one user.
        #[test]
        fn matmul_act_computes_the_same_outputs(act in 0usize..5, bias in any::<bool>(), rows in 1usize..4, shared in any::<bool>(), seed in 0u64..1000) {
            let name = ["gelu", "gelu_erf", "relu", "tanh", "sigmoid"][act];
            let (k, n) = (8usize, 12usize);
            let mut lines = vec![format!("  %x = input : f32[{rows}, {k}]"), format!("  %w = weight : f32[{n}, {k}]")];
            if bias {
                lines.push(format!("  %b = weight : f32[{n}]"));
                lines.push(format!("  %m = matmul(%x, %w, %b) {{transpose_b = true}} : f32[{rows}, {n}]"));
            } else {
                lines.push(format!("  %m = matmul(%x, %w) {{transpose_b = true}} : f32[{rows}, {n}]"));
            }
            lines.push(format!("  %y = {name}(%m) : f32[{rows}, {n}]"));
            let mut outs = vec!["  output y = %y".to_string()];
            if shared {
                lines.push(format!("  %z = neg(%m) : f32[{rows}, {n}]"));
                outs.push("  output z = %z".to_string());
            }
            let src = format!("graph \"act\" {{\n{}\n{}\n}}\n", lines.join("\n"), outs.join("\n"));
            let g = text::parse(&src).unwrap();
            let mut opt = Optimize::default();
            opt.set_rule("matmul-act", true).unwrap();
            let (o, _) = opt.run(g.clone()).unwrap();
            o.verify().map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
            // (a matmul another op also reads stays whole: fusing would compute it twice)
            let fused = o.node_ids().any(|id| matches!(o.node(id).op, Op::MatMulAct { .. }));
            prop_assert!(fused != shared, "shared {shared}: {}", text::print(&o));
            let mut s = seed;
            let mut rnd = |len: usize| -> Vec<f32> { (0..len).map(|_| { s = dsc_ir::seeded::splitmix64(s); ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 }).collect() };
            let mut w: HashMap<String, (DType, Vec<usize>, Vec<u8>)> = HashMap::new();
            w.insert("w".into(), (DType::F32, vec![n, k], rnd(n * k).iter().flat_map(|v| v.to_le_bytes()).collect()));
            w.insert("b".into(), (DType::F32, vec![n], rnd(n).iter().flat_map(|v| v.to_le_bytes()).collect()));
            let ins: BTreeMap<String, Tensor> = BTreeMap::from([("x".to_string(), Tensor::new(vec![rows, k], rnd(rows * k)))]);
            let a = Executor::new(&g, &w, BTreeMap::new()).unwrap().run(&ins).unwrap();
            let b = Executor::new(&o, &w, BTreeMap::new()).unwrap().run(&ins).unwrap();
            for (name, t) in &a {
                let err = t.data.iter().zip(&b[name].data).map(|(p, q)| (p - q).abs()).fold(0f32, f32::max);
                prop_assert!(err < 1e-5, "{name}: {err}\n{}", text::print(&o));
            }
        }

        /// merge-matmuls on random variations: 1..=4 matmuls of one input with random widths,
        /// some with a bias (never merged), some weights in another dtype (merged only with their
        /// own dtype), a second input's matmul, random rows: same outputs (f32 weights are
        /// exact), every merged group read only through slices, kernels never increase.
        #[test]
        fn merged_matmuls_compute_the_same_outputs(widths in proptest::collection::vec((1usize..5, any::<bool>(), any::<bool>()), 1..5), rows in 1usize..4, other in any::<bool>(), seed in 0u64..1000) {
            let k = 8;
            let mut lines = vec![format!("  %x = input : f32[{rows}, {k}]"), format!("  %z = input : f32[{rows}, {k}]")];
            let mut outs = vec![];
            for (i, &(w, bias, half)) in widths.iter().enumerate() {
                let n = 4 * w;
                let dt = if half { "f16" } else { "f32" };
                lines.push(format!("  %w{i} = weight : {dt}[{n}, {k}]"));
                if bias {
                    lines.push(format!("  %b{i} = weight : f32[{n}]"));
                    lines.push(format!("  %m{i} = matmul(%x, %w{i}, %b{i}) {{transpose_b = true}} : f32[{rows}, {n}]"));
                } else {
                    lines.push(format!("  %m{i} = matmul(%x, %w{i}) {{transpose_b = true}} : f32[{rows}, {n}]"));
                }
                outs.push(format!("  output o{i} = %m{i}"));
            }
            if other {
                lines.push(format!("  %wz = weight : f32[4, {k}]"));
                lines.push(format!("  %mz = matmul(%z, %wz) {{transpose_b = true}} : f32[{rows}, 4]"));
                outs.push("  output oz = %mz".into());
            }
            let src = format!("graph \"p\" {{\n{}\n{}\n}}\n", lines.join("\n"), outs.join("\n"));
            let g = text::parse(&src).unwrap();
            let (o, note) = Optimize::default().run(g.clone()).unwrap();
            o.verify().map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
            let mut s = seed;
            let mut rnd = || { s = dsc_ir::seeded::splitmix64(s); ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0 };
            let w: HashMap<String, (DType, Vec<usize>, Vec<u8>)> = g
                .leaves(&Op::Weight)
                .into_iter()
                .map(|id| {
                    let n = g.node(id);
                    let sh: Vec<usize> = n.ty.shape.iter().map(|d| d.as_const().unwrap()).collect();
                    let v: Vec<f32> = (0..sh.iter().product::<usize>()).map(|_| rnd()).collect();
                    (n.name.clone(), (n.ty.dtype, sh, dsc_ir::quant::encode(n.ty.dtype, &v).unwrap()))
                })
                .collect();
            let ins: BTreeMap<String, Tensor> = ["x", "z"].iter().map(|n| (n.to_string(), Tensor::new(vec![rows, k], (0..rows * k).map(|_| rnd()).collect()))).collect();
            let a = Executor::new(&g, &w, BTreeMap::new()).unwrap().run(&ins).unwrap();
            let b = Executor::new(&o, &w, BTreeMap::new()).unwrap().run(&ins).unwrap();
            for (name, t) in &a {
                prop_assert_eq!(&t.data, &b[name].data, "{}\n{}", src, text::print(&o));
            }
            for id in o.node_ids() {
                if matches!(o.node(id).op, Op::MatMulCat) {
                    prop_assert!(o.users(id).iter().all(|&u| matches!(o.node(u).op, Op::Slice { .. })), "{}", text::print(&o));
                }
            }
            // merged: the bias-free matmuls of x, grouped by weight dtype
            let groups = [false, true].iter().filter(|&&h| widths.iter().filter(|w| !w.1 && w.2 == h).count() >= 2).count();
            prop_assert_eq!(note.contains("merge-matmuls"), groups > 0, "{}", note);
            let k = note.split("kernels ").nth(1).unwrap();
            let before: usize = k.split(" -> ").next().unwrap().parse().unwrap();
            let after: usize = k.split(" -> ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
            prop_assert!(after <= before, "{}", note);
        }

        /// rope-cache-write on random variations: either rope style, the rotated rows also
        /// used elsewhere (then fusing would not save the rope kernel), two writes chained into
        /// one pool, random positions and slots: the pool and the outputs match the unfused
        /// graph, and kernels never increase.
        #[test]
        fn rope_cache_write_keeps_pools_and_outputs(half in any::<bool>(), shared in any::<bool>(), chained in any::<bool>(), pos in proptest::collection::vec(0u32..5000, 2), slot0 in 0u32..8, seed in 0u64..1000) {
            let style = if half { "half" } else { "interleaved" };
            let rope = |x: &str, v: &str| format!("  %{v} = rope(%{x}, %p) {{theta = 10000.0, style = {style}, rotary_dim = 6}} : f32[2, 1, 6]");
            let mut lines = vec![
                "  %a = input : f32[2, 6]".to_string(),
                "  %p = input : i32[2]".into(),
                "  %s = input : i32[2]".into(),
                "  %c = state : f32[4, 2, 1, 6]".into(),
                "  %x = reshape(%a) : f32[2, 1, 6]".into(),
                rope("x", "r"),
                "  %w = cache_write(%c, %r, %s) : f32[4, 2, 1, 6]".into(),
            ];
            let mut last = "w";
            if chained {
                lines.push("  %x2 = neg(%x) : f32[2, 1, 6]".into());
                lines.push(rope("x2", "r2"));
                lines.push("  %w2 = cache_write(%w, %r2, %s2) : f32[4, 2, 1, 6]".into());
                lines.insert(3, "  %s2 = input : i32[2]".into());
                last = "w2";
            }
            let mut outs = format!("  output c = %{last}\n");
            if shared {
                lines.push("  %y = neg(%r) : f32[2, 1, 6]".into());
                outs.push_str("  output y = %y\n");
            }
            let src = format!("graph \"p\" {{\n{}\n{outs}}}\n", lines.join("\n"));
            let g = text::parse(&src).unwrap();
            let mut opt = Optimize::default();
            opt.set_rule("rope-cache-write", true).unwrap();
            let (o, note) = opt.run(g.clone()).unwrap();
            o.verify().map_err(|e| TestCaseError::fail(format!("{e}\n{src}")))?;
            prop_assert!(note.contains("rope-cache-write"), "{note}");
            let mut s = seed;
            let mut rnd = || { s = dsc_ir::seeded::splitmix64(s); ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0 };
            let slots = [slot0 as f32, ((slot0 + 3) % 8) as f32];
            let mut ins: BTreeMap<String, Tensor> = BTreeMap::new();
            ins.insert("a".into(), Tensor::new(vec![2, 6], (0..12).map(|_| rnd()).collect()));
            ins.insert("p".into(), Tensor::new(vec![2], pos.iter().map(|&v| v as f32).collect()));
            ins.insert("s".into(), Tensor::new(vec![2], slots.to_vec()));
            ins.insert("s2".into(), Tensor::new(vec![2], vec![slots[1], slots[0]]));
            if !chained {
                ins.remove("s2");
            }
            let none = HashMap::new();
            let x = Executor::new(&g, &none, BTreeMap::new()).unwrap().run(&ins).unwrap();
            let y = Executor::new(&o, &none, BTreeMap::new()).unwrap().run(&ins).unwrap();
            for (k, t) in &x {
                prop_assert_eq!(&t.data, &y[k].data, "{}\n{}", src, text::print(&o));
            }
            let k = note.split("kernels ").nth(1).unwrap();
            let before: usize = k.split(" -> ").next().unwrap().parse().unwrap();
            let after: usize = k.split(" -> ").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
            prop_assert!(after <= before, "{note}");
        }
    }
}
