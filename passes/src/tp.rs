//! Tensor-parallel partitioning (Megatron-LM style: Shoeybi et al. 2019).
//!
//! The pass turns the whole-model graph into the graph one rank of `world` runs; every rank
//! runs the same graph on its own slice of the weights (`dsc_ir::shard`: the slice is implied
//! by the weight's declared local shape) and meets the others at `all_reduce` nodes.
//!
//! How it decides, without model-specific patterns: starting from a matmul whose input is
//! replicated, it grows a *region* of tensors that can be split along one axis —
//! column-parallel matmuls (weight rows split), then forward through elementwise ops,
//! reshapes that keep the split axis whole, RoPE over heads, KV-cache writes and paged
//! attention (heads split, KV pools split on their head axis), and backward to every operand
//! those ops need split as well (the K and V projections that feed attention, the up
//! projection that meets the gate). A matmul that consumes a split tensor along its reduction
//! axis closes the region: it becomes row-parallel (weight columns split) and its partial
//! sums are combined by an `all_reduce`. Any other use of a split tensor (a norm, a graph
//! output, a broadcast), a dim that `world` does not divide, or a cut through a quantization
//! block rejects the region, and its ops stay replicated. For Llama this finds exactly the
//! two regions per layer Megatron uses: attention (QKV columns → heads → O rows) and the MLP
//! (gate/up columns → SwiGLU → down rows): two all-reduces per layer.
//!
//! Expert parallelism (MoE) will add its own region kind (experts split across ranks with
//! all-to-all dispatch/combine) beside this one.

use crate::{Pass, PassError};
use dsc_ir::{Dim, Graph, IrError, NodeId, Op, TensorType};
use std::collections::{HashMap, HashSet, VecDeque};

pub struct TensorParallel {
    pub world: usize,
}

#[derive(Default)]
struct Region {
    /// split tensors → axis
    split: HashMap<NodeId, usize>,
    /// weights → axis to shard
    weights: HashMap<NodeId, usize>,
    /// row-parallel matmuls (outputs need an all_reduce)
    row: HashSet<NodeId>,
}

fn const_dim(t: &TensorType, ax: usize) -> Option<usize> {
    t.shape.get(ax).and_then(Dim::as_const)
}

struct Grow<'g> {
    g: &'g Graph,
    world: usize,
    outputs: HashSet<NodeId>,
}

impl Grow<'_> {
    fn divisible(&self, t: &TensorType, ax: usize) -> Result<(), String> {
        match const_dim(t, ax) {
            Some(d) if d % self.world == 0 && d >= self.world => Ok(()),
            Some(d) => Err(format!("dim {d} is not divisible by {}", self.world)),
            None => Err("a symbolic dim cannot be split".into()),
        }
    }

    fn weight_of(&self, mm: NodeId, i: usize) -> Result<NodeId, String> {
        let w = *self.g.operands(mm).get(i).ok_or("missing operand")?;
        if !matches!(self.g.node(w).op, Op::Weight) || self.g.users(w).len() != 1 {
            return Err(format!("`{}` is not a weight used by this matmul alone", self.g.node(w).name));
        }
        Ok(w)
    }

    /// Grow a region from column-parallel matmul `start`; Err says why it cannot be split.
    fn region(&self, start: NodeId) -> Result<Region, String> {
        let g = self.g;
        let mut r = Region::default();
        let mut queue = VecDeque::from([(start, g.node(start).ty.rank() - 1)]);
        while let Some((n, ax)) = queue.pop_front() {
            let node = g.node(n);
            if let Some(&a) = r.split.get(&n) {
                if a != ax {
                    return Err(format!("`{}` would be split on axes {a} and {ax}", node.name));
                }
                continue;
            }
            self.divisible(&node.ty, ax).map_err(|m| format!("`{}`: {m}", node.name))?;
            if self.outputs.contains(&n) {
                return Err(format!("`{}` is a graph output", node.name));
            }
            r.split.insert(n, ax);
            let ops = g.operands(n);
            // backward: what this split needs of its operands
            match &node.op {
                Op::MatMul { transpose_b: true } if ax == node.ty.rank() - 1 => {
                    // column-parallel: input replicated, weight rows (and bias) split
                    if r.split.contains_key(&ops[0]) {
                        return Err(format!("`{}` would be both row- and column-parallel", node.name));
                    }
                    let w = self.weight_of(n, 1)?;
                    r.weights.insert(w, 0);
                    if ops.len() > 2 {
                        r.weights.insert(self.weight_of(n, 2)?, 0);
                    }
                }
                Op::Unary(_) | Op::Cast => queue.push_back((ops[0], ax)),
                Op::Rope { .. } if ax + 1 < node.ty.rank() => queue.push_back((ops[0], ax)),
                Op::Binary(_) => {
                    for &o in &ops {
                        if g.node(o).ty.shape != node.ty.shape {
                            return Err(format!("`{}` broadcasts an operand across the split", node.name));
                        }
                        queue.push_back((o, ax));
                    }
                }
                Op::Reshape => queue.push_back((ops[0], reshape_axis(&node.ty, &g.node(ops[0]).ty, ax).ok_or_else(|| format!("reshape `{}` moves the split axis", node.name))?)),
                Op::State if ax + 2 == node.ty.rank() => {}
                Op::CacheWrite if ax + 2 == node.ty.rank() => {
                    queue.push_back((ops[0], ax));
                    queue.push_back((ops[1], ax - 1));
                }
                Op::PagedAttention { .. } if ax == 1 => {
                    queue.push_back((ops[0], 1));
                    queue.push_back((ops[1], 2));
                    queue.push_back((ops[2], 2));
                }
                other => return Err(format!("`{}` ({}) cannot be split on axis {ax}", node.name, other.name())),
            }
            // forward: every user of a split tensor is split too, or closes the region
            for u in g.users(n) {
                let un = g.node(u);
                let pos: Vec<usize> = g.operands(u).iter().enumerate().filter(|(_, &o)| o == n).map(|(i, _)| i).collect();
                match (&un.op, pos.as_slice()) {
                    (Op::MatMul { transpose_b: true }, [0]) if ax == node.ty.rank() - 1 => {
                        // row-parallel: weight columns split, partial sums all-reduced
                        if g.operands(u).len() > 2 {
                            return Err(format!("row-parallel `{}` has a bias (it would be added {} times)", un.name, self.world));
                        }
                        let w = self.weight_of(u, 1)?;
                        let wt = &g.node(w).ty;
                        self.divisible(wt, 1).map_err(|m| format!("`{}`: {m}", un.name))?;
                        let k = const_dim(wt, 1).unwrap_or(0) / self.world;
                        if wt.dtype.bytes_for(k).is_none() {
                            return Err(format!("`{}`: {k} columns per rank cut {} blocks", un.name, wt.dtype));
                        }
                        r.weights.insert(w, 1);
                        r.row.insert(u);
                    }
                    (Op::Unary(_) | Op::Cast | Op::Binary(_), _) => queue.push_back((u, ax)),
                    (Op::Rope { .. }, [0]) => queue.push_back((u, ax)),
                    (Op::Reshape, _) => queue.push_back((u, reshape_axis(&node.ty, &un.ty, ax).ok_or_else(|| format!("reshape `{}` moves the split axis", un.name))?)),
                    (Op::CacheWrite, [0]) => queue.push_back((u, ax)),
                    (Op::CacheWrite, [1]) => queue.push_back((u, ax + 1)),
                    (Op::PagedAttention { .. }, [0]) => queue.push_back((u, ax)),
                    (Op::PagedAttention { .. }, [1] | [2]) => queue.push_back((u, ax - 1)),
                    _ => return Err(format!("`{}` ({}) uses split `{}`", un.name, un.op.name(), node.name)),
                }
            }
        }
        Ok(r)
    }
}

/// Where split axis `ax` of `from` lands in `to` (same elements, another shape): the dims
/// before it must agree, and the split block (the axis and everything inside it) must map
/// onto one axis of `to` that `world` chunks evenly — checked by the caller's divisibility.
fn reshape_axis(from: &TensorType, to: &TensorType, ax: usize) -> Option<usize> {
    if ax >= to.rank() || from.shape[..ax] != to.shape[..ax] {
        return None;
    }
    let inner = |t: &TensorType| t.shape[ax..].iter().map(Dim::as_const).product::<Option<usize>>();
    match (inner(from), inner(to)) {
        (Some(a), Some(b)) if a == b => Some(ax),
        _ => None,
    }
}

fn local(t: &TensorType, ax: usize, world: usize) -> TensorType {
    let mut t = t.clone();
    if let Some(Dim::Const(d)) = t.shape.get(ax) {
        t.shape[ax] = Dim::Const(d / world);
    }
    t
}

impl Pass for TensorParallel {
    fn name(&self) -> &'static str {
        "tensor_parallel"
    }

    fn run(&self, g: Graph) -> Result<(Graph, String), PassError> {
        let ir = |source: IrError| PassError::Ir { pass: "tensor_parallel", source };
        if self.world == 0 {
            return Err(ir(IrError::Verify { node: g.name.clone(), op: "graph", msg: "tensor-parallel world size must be at least 1".into() }));
        }
        let order = g.topo_order().map_err(ir)?;
        let grow = Grow { g: &g, world: self.world, outputs: g.outputs.iter().map(|(_, id)| *id).collect() };
        let mut done = Region::default();
        let mut regions = 0;
        let mut refused: Vec<String> = vec![];
        for &id in &order {
            let n = g.node(id);
            if !matches!(n.op, Op::MatMul { transpose_b: true }) || done.split.contains_key(&id) || done.row.contains(&id) {
                continue;
            }
            match grow.region(id) {
                Ok(r) if r.row.is_empty() => {
                    refused.push(format!("`{}`: no row-parallel matmul closes its region", n.name));
                }
                Ok(r) => {
                    if r.split.keys().chain(&r.row).any(|k| done.split.contains_key(k) || done.row.contains(k)) {
                        continue;
                    }
                    regions += 1;
                    done.split.extend(r.split);
                    done.weights.extend(r.weights);
                    done.row.extend(r.row);
                }
                Err(why) => {
                    refused.push(why);
                }
            }
        }
        // rebuild with each rank's shapes, an all_reduce after every row-parallel matmul
        let mut out = Graph::new(g.name.clone());
        let mut map: HashMap<NodeId, NodeId> = HashMap::new();
        for &id in &order {
            let n = g.node(id);
            let ops: Vec<NodeId> = g.operands(id).iter().map(|o| map[o]).collect();
            let ty = match (done.weights.get(&id), done.split.get(&id)) {
                (Some(&ax), _) | (None, Some(&ax)) => local(&n.ty, ax, self.world),
                _ => n.ty.clone(),
            };
            let new = out.add(n.name.clone(), n.op.clone(), &ops, Some(ty)).map_err(ir)?;
            let new = if done.row.contains(&id) { out.add(format!("{}.all_reduce", n.name), Op::AllReduce, &[new], None).map_err(ir)? } else { new };
            map.insert(id, new);
        }
        for (name, id) in &g.outputs {
            out.set_output(name.clone(), map[id]);
        }
        let mut note = format!("world {}: {regions} split regions, {} sharded weights, {} all_reduce", self.world, done.weights.len(), done.row.len());
        // a model that does not split says why (the first refusal, in graph order)
        if regions == 0 {
            if let Some(why) = refused.first() {
                note.push_str(&format!("; nothing split: {why}"));
            }
        }
        Ok((out, note))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dsc_ir::{shard, text, DType, Executor, Tensor, ThreadGroup};
    use rand::{Rng, SeedableRng};
    use std::collections::{BTreeMap, HashMap};

    /// A two-layer decoder block in miniature: attention over a paged cache, then a SwiGLU MLP.
    const SRC: &str = r#"graph "mini" {
  %tokens = input : i32[T]
  %positions = input : i32[T]
  %seq_ids = input : i32[T]
  %slots = input : i32[T]
  %block_table = input : i32[S, MB]
  %emb = weight : f32[50, 16]
  %x = gather(%emb, %tokens) : f32[T, 16]
  %nw = weight : f32[16]
  %h = rms_norm(%x, %nw) {eps = 0.00001} : f32[T, 16]
  %wq = weight : f32[16, 16]
  %wk = weight : f32[8, 16]
  %wv = weight : f32[8, 16]
  %q = matmul(%h, %wq) {transpose_b = true} : f32[T, 16]
  %k = matmul(%h, %wk) {transpose_b = true} : f32[T, 8]
  %v = matmul(%h, %wv) {transpose_b = true} : f32[T, 8]
  %qh = reshape(%q) : f32[T, 4, 4]
  %kh = reshape(%k) : f32[T, 2, 4]
  %vh = reshape(%v) : f32[T, 2, 4]
  %qr = rope(%qh, %positions) {theta = 10000, style = half, rotary_dim = 4} : f32[T, 4, 4]
  %kr = rope(%kh, %positions) {theta = 10000, style = half, rotary_dim = 4} : f32[T, 2, 4]
  %kc = state : f32[NB, 4, 2, 4]
  %vc = state : f32[NB, 4, 2, 4]
  %kw = cache_write(%kc, %kr, %slots) : f32[NB, 4, 2, 4]
  %vw = cache_write(%vc, %vh, %slots) : f32[NB, 4, 2, 4]
  %att = paged_attention(%qr, %kw, %vw, %positions, %seq_ids, %block_table) {scale = 0.5} : f32[T, 4, 4]
  %flat = reshape(%att) : f32[T, 16]
  %wo = weight : f32[16, 16]
  %o = matmul(%flat, %wo) {transpose_b = true} : f32[T, 16]
  %x2 = add(%x, %o) : f32[T, 16]
  %wg = weight : f32[32, 16]
  %wu = weight : f32[32, 16]
  %wd = weight : f32[16, 32]
  %gate = matmul(%x2, %wg) {transpose_b = true} : f32[T, 32]
  %up = matmul(%x2, %wu) {transpose_b = true} : f32[T, 32]
  %sg = silu(%gate) : f32[T, 32]
  %act = mul(%sg, %up) : f32[T, 32]
  %down = matmul(%act, %wd) {transpose_b = true} : f32[T, 16]
  %x3 = add(%x2, %down) : f32[T, 16]
  %logits = matmul(%x3, %emb) {transpose_b = true} : f32[T, 50]
  output logits = %logits
}
"#;

    fn weights(g: &Graph, rng: &mut impl Rng) -> HashMap<String, (DType, Vec<usize>, Vec<u8>)> {
        g.leaves(&Op::Weight)
            .into_iter()
            .map(|id| {
                let n = g.node(id);
                let shape: Vec<usize> = n.ty.shape.iter().map(|d| d.as_const().unwrap()).collect();
                let v: Vec<f32> = (0..shape.iter().product::<usize>()).map(|_| rng.random_range(-0.5..0.5)).collect();
                (n.name.clone(), (DType::F32, shape, dsc_ir::quant::encode(DType::F32, &v).unwrap()))
            })
            .collect()
    }

    /// Rank `rank`'s weights: each full tensor cut to the shape the rank's graph declares.
    fn rank_weights(full: &HashMap<String, (DType, Vec<usize>, Vec<u8>)>, g: &Graph, rank: usize, world: usize) -> HashMap<String, (DType, Vec<usize>, Vec<u8>)> {
        g.leaves(&Op::Weight)
            .into_iter()
            .map(|id| {
                let n = g.node(id);
                let (d, fs, b) = &full[&n.name];
                let ls: Vec<usize> = n.ty.shape.iter().map(|d| d.as_const().unwrap()).collect();
                let bytes = match shard::shard_of(fs, &ls, rank, world).unwrap() {
                    Some(s) => shard::slice_bytes(*d, fs, s, b).unwrap(),
                    None => b.clone(),
                };
                (n.name.clone(), (*d, ls, bytes))
            })
            .collect()
    }

    fn inputs(rng: &mut impl Rng, t: usize) -> BTreeMap<String, Tensor> {
        let toks: Vec<i32> = (0..t).map(|_| rng.random_range(0..50)).collect();
        let pos: Vec<i32> = (0..t as i32).collect();
        BTreeMap::from([
            ("tokens".into(), Tensor::from_i32(vec![t], &toks)),
            ("positions".into(), Tensor::from_i32(vec![t], &pos)),
            ("seq_ids".into(), Tensor::from_i32(vec![t], &vec![0; t])),
            ("slots".into(), Tensor::from_i32(vec![t], &pos)),
            ("block_table".into(), Tensor::from_i32(vec![1, 2], &[0, 1])),
        ])
    }

    #[test]
    fn finds_the_megatron_split_and_keeps_semantics() {
        let g = text::parse(SRC).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let full = weights(&g, &mut rng);
        let fixed = BTreeMap::from([("NB".to_string(), 2)]);
        let inp = inputs(&mut rng, 7);
        let want = Executor::new(&g, &full, fixed.clone()).unwrap().run(&inp).unwrap()["logits"].clone();
        for world in [1usize, 2] {
            let (p, note) = TensorParallel { world }.run(g.clone()).unwrap();
            p.verify().unwrap();
            assert!(note.contains("2 split regions") && note.contains("2 all_reduce"), "{note}");
            let printed = text::print(&p);
            assert!(printed.contains(&format!("%wq = weight : f32[{}, 16]", 16 / world)), "{printed}");
            assert!(printed.contains(&format!("%wd = weight : f32[16, {}]", 32 / world)), "{printed}");
            assert!(printed.contains(&format!("%kc = state : f32[NB, 4, {}, 4]", 2 / world)), "{printed}");
            assert!(printed.contains("%emb = weight : f32[50, 16]"), "the tied embedding stays whole");
            let group = ThreadGroup::new(world);
            let outs: Vec<Tensor> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..world)
                    .map(|r| {
                        let (p, w, fixed, inp, c) = (&p, rank_weights(&full, &p, r, world), fixed.clone(), &inp, group.handle(r));
                        s.spawn(move || Executor::new(p, &w, fixed).unwrap().with_collective(c).run(inp).unwrap()["logits"].clone())
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for o in &outs {
                let err = o.data.iter().zip(&want.data).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
                if world == 1 {
                    assert_eq!(o.data, want.data, "world 1 is the unpartitioned graph exactly");
                }
                assert!(err < 1e-4, "world {world}: max |diff| {err}");
            }
            assert_eq!(outs[0].data, outs[world - 1].data, "every rank ends with the same logits");
        }
    }

    #[test]
    fn refuses_splits_that_do_not_divide() {
        let g = text::parse(SRC).unwrap();
        // 3 ranks: 4 heads and 2 KV heads do not divide; 32 ffn columns do not either
        let (p, note) = TensorParallel { world: 3 }.run(g.clone()).unwrap();
        assert!(note.contains("0 split regions") && note.contains("not divisible by 3"), "{note}");
        assert_eq!(text::print(&p), text::print(&g), "nothing split, nothing changed");
    }
}
