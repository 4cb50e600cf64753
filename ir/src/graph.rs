//! The tensor graph: a petgraph `StableDiGraph` whose nodes are ops with a declared type and
//! a unique name, and whose edges carry the operand position.

use crate::op::{infer, Op};
use crate::{IrError, Result, TensorType};
use petgraph::stable_graph::{NodeIndex, StableDiGraph};
use petgraph::visit::EdgeRef;
use petgraph::Direction;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

pub type NodeId = NodeIndex<u32>;

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    /// Unique within the graph. Leaves carry the external name (checkpoint tensor name,
    /// input name); builders name intermediates after the checkpoint module they belong to.
    pub name: String,
    pub op: Op,
    pub ty: TensorType,
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    g: StableDiGraph<Node, u32>,
    names: HashMap<String, NodeId>,
    /// Named results, in declaration order.
    pub outputs: Vec<(String, NodeId)>,
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Self {
        Graph { name: name.into(), ..Default::default() }
    }

    /// Add a node whose type is inferred from its operands. `declared` supplies the type
    /// for leaves and the result dtype/shape for reshape, cast, quantize and dequantize; for
    /// other ops it may be `None`.
    pub fn add(&mut self, name: impl Into<String>, op: Op, operands: &[NodeId], declared: Option<TensorType>) -> Result<NodeId> {
        let name = name.into();
        if self.names.contains_key(&name) {
            return Err(IrError::DuplicateName(name));
        }
        for &o in operands {
            if !self.g.contains_node(o) {
                return Err(IrError::Verify { node: name, op: op.name(), msg: format!("operand {} does not exist", o.index()) });
            }
        }
        let arg_tys: Vec<&TensorType> = operands.iter().map(|&o| &self.g[o].ty).collect();
        let hint = declared.clone().unwrap_or_else(|| arg_tys.first().map(|t| (*t).clone()).unwrap_or_else(|| TensorType::new(crate::DType::F32, [])));
        if op.is_leaf() && declared.is_none() {
            return Err(IrError::Verify { node: name, op: op.name(), msg: "leaves need a declared type".into() });
        }
        let ty = infer(&op, &arg_tys, &hint).map_err(|msg| IrError::Verify { node: name.clone(), op: op.name(), msg })?;
        let id = self.g.add_node(Node { name: name.clone(), op, ty });
        for (i, &o) in operands.iter().enumerate() {
            self.g.add_edge(o, id, i as u32);
        }
        self.names.insert(name, id);
        Ok(id)
    }

    pub fn set_output(&mut self, name: impl Into<String>, id: NodeId) {
        self.outputs.push((name.into(), id));
    }

    pub fn node(&self, id: NodeId) -> &Node {
        &self.g[id]
    }

    pub fn by_name(&self, name: &str) -> Option<NodeId> {
        self.names.get(name).copied()
    }

    pub fn node_count(&self) -> usize {
        self.g.node_count()
    }

    pub fn node_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.g.node_indices()
    }

    /// Operands in position order.
    pub fn operands(&self, id: NodeId) -> Vec<NodeId> {
        let mut es: Vec<(u32, NodeId)> = self.g.edges_directed(id, Direction::Incoming).map(|e| (*e.weight(), e.source())).collect();
        es.sort_unstable();
        es.into_iter().map(|(_, s)| s).collect()
    }

    /// Nodes that use `id`, each once, in index order.
    pub fn users(&self, id: NodeId) -> Vec<NodeId> {
        let mut us: Vec<NodeId> = self.g.neighbors_directed(id, Direction::Outgoing).collect();
        us.sort_unstable();
        us.dedup();
        us
    }

    /// Replace every use of `old` (operands and outputs) by `new`.
    pub fn replace_uses(&mut self, old: NodeId, new: NodeId) {
        let edges: Vec<_> = self.g.edges_directed(old, Direction::Outgoing).map(|e| (e.id(), e.target(), *e.weight())).collect();
        for (e, tgt, pos) in edges {
            self.g.remove_edge(e);
            self.g.add_edge(new, tgt, pos);
        }
        for (_, o) in &mut self.outputs {
            if *o == old {
                *o = new;
            }
        }
    }

    pub fn remove(&mut self, id: NodeId) -> Option<Node> {
        let n = self.g.remove_node(id)?;
        self.names.remove(&n.name);
        Some(n)
    }

    /// Topological order; among ready nodes the oldest (lowest index) goes first, so the
    /// order is stable and follows the builder's order.
    pub fn topo_order(&self) -> Result<Vec<NodeId>> {
        let mut indeg: HashMap<NodeId, usize> = self.g.node_indices().map(|n| (n, self.g.edges_directed(n, Direction::Incoming).count())).collect();
        let mut ready: BinaryHeap<std::cmp::Reverse<NodeId>> = indeg.iter().filter(|(_, &d)| d == 0).map(|(&n, _)| std::cmp::Reverse(n)).collect();
        let mut order = Vec::with_capacity(self.g.node_count());
        while let Some(std::cmp::Reverse(n)) = ready.pop() {
            order.push(n);
            for e in self.g.edges_directed(n, Direction::Outgoing) {
                let d = indeg.get_mut(&e.target()).expect("target is a node");
                *d -= 1;
                if *d == 0 {
                    ready.push(std::cmp::Reverse(e.target()));
                }
            }
        }
        if order.len() != self.g.node_count() {
            let stuck = indeg.iter().filter(|(_, &d)| d > 0).map(|(n, _)| *n).min().expect("some node is stuck");
            return Err(IrError::Cycle(self.g[stuck].name.clone()));
        }
        Ok(order)
    }

    /// Check every invariant: acyclic, operand counts and positions, each node's declared
    /// type equal to the one its op infers, unique names, outputs present and named once.
    pub fn verify(&self) -> Result<()> {
        self.topo_order()?;
        let mut seen = HashMap::new();
        for id in self.g.node_indices() {
            let n = &self.g[id];
            if let Some(prev) = seen.insert(n.name.as_str(), id) {
                let _ = prev;
                return Err(IrError::DuplicateName(n.name.clone()));
            }
            let mut pos: Vec<u32> = self.g.edges_directed(id, Direction::Incoming).map(|e| *e.weight()).collect();
            pos.sort_unstable();
            if pos.iter().enumerate().any(|(i, &p)| p as usize != i) {
                return Err(IrError::Verify { node: n.name.clone(), op: n.op.name(), msg: format!("operand positions {pos:?} are not 0..{}", pos.len()) });
            }
            let ops = self.operands(id);
            let tys: Vec<&TensorType> = ops.iter().map(|&o| &self.g[o].ty).collect();
            let ty = infer(&n.op, &tys, &n.ty).map_err(|msg| IrError::Verify { node: n.name.clone(), op: n.op.name(), msg })?;
            if ty != n.ty {
                return Err(IrError::Verify { node: n.name.clone(), op: n.op.name(), msg: format!("declared type {} but operands give {ty}", n.ty) });
            }
            if n.op.writes_state() {
                let cache = &self.g[ops[0]];
                if !matches!(cache.op, crate::Op::State) && !cache.op.writes_state() {
                    return Err(IrError::Verify { node: n.name.clone(), op: n.op.name(), msg: format!("cache operand `{}` must be a state or a cache write", cache.name) });
                }
            }
        }
        let mut out_names = std::collections::HashSet::new();
        for (name, id) in &self.outputs {
            if !self.g.contains_node(*id) {
                return Err(IrError::UnknownNode(name.clone()));
            }
            if !out_names.insert(name) {
                return Err(IrError::DuplicateName(format!("output {name}")));
            }
        }
        Ok(())
    }

    /// Leaves of one kind (input / weight / state), in index order.
    pub fn leaves(&self, kind: &Op) -> Vec<NodeId> {
        self.g.node_indices().filter(|&n| &self.g[n].op == kind).collect()
    }

    /// Symbols used anywhere in the graph, sorted.
    pub fn symbols(&self) -> Vec<String> {
        let mut s: BTreeMap<String, ()> = BTreeMap::new();
        for n in self.g.node_weights() {
            for d in &n.ty.shape {
                if let crate::Dim::Sym(x) = d {
                    s.insert(x.clone(), ());
                }
            }
        }
        s.into_keys().collect()
    }

    /// Count of nodes per op name, for summaries.
    pub fn op_histogram(&self) -> BTreeMap<&'static str, usize> {
        let mut h = BTreeMap::new();
        for n in self.g.node_weights() {
            *h.entry(n.op.name()).or_default() += 1;
        }
        h
    }
}
