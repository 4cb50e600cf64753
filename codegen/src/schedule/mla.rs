//! MLA's schedule rewrites (the kernels are `kernels/mla.rs`'s).
//!
//! `fuse_mla_latent_cache`: a DeepSeek layer computes its latent cache row as
//! `cache_write(cache, concat(reshape(rms_norm(slice(kva, 0, L), g)), rope(reshape(slice(kva,
//! L, R)), pos)), slots)` — six launches at decode, ~2-3 us each under PDL whatever their work
//! (V2-Lite: 162 of a b1 step's 644). Where every value between kva and the write has that one
//! use (and none is a graph output), the write's step becomes one
//! [`KernelSpec::MlaLatentCache`] launch reading kva, and the others launch nothing. The graph
//! and the CPU executor keep the separate ops.
//!
//! `fuse_mla_query`: the absorbed query `concat(head_matmul(slice(q, 0, NOPE), W_uk),
//! rope(slice(q, NOPE, R), pos))` — five launches — becomes one [`KernelSpec::MlaQuery`] at
//! the concat's step, under the same one-use conditions.

use super::{Scalar, Step};
use crate::kernels::KernelSpec;
use dsc_ir::{DType, Graph, NodeId, Op, RopeStyle};

/// (a rope or YaRN rope node's (theta, style, rotary dim, the YaRN constants as the rope
/// kernel's spec holds them); None for any other op)
fn rope_of(op: &Op) -> Option<(f32, RopeStyle, usize, Option<[u32; 4]>)> {
    match op {
        Op::Rope { theta, style, rotary_dim } => Some((*theta, *style, *rotary_dim, None)),
        Op::RopeYarn { theta, style, rotary_dim, yarn } => match crate::kernels::rope_yarn_spec(1, *rotary_dim, *theta, *style == RopeStyle::Interleaved, yarn) {
            KernelSpec::RopeYarn { factor_bits, low_bits, high_bits, mscale_bits, .. } => Some((*theta, *style, *rotary_dim, Some([factor_bits, low_bits, high_bits, mscale_bits]))),
            _ => None,
        },
        _ => None,
    }
}

/// Whether `id` has one user and is no graph output.
fn sole(g: &Graph, id: NodeId) -> bool {
    g.users(id).len() == 1 && !g.outputs.iter().any(|(_, o)| *o == id)
}

/// Whether the steps at `idx` are plain ones: no alternatives or row bounds to keep.
fn plain(steps: &[Step], idx: &[usize]) -> bool {
    idx.iter().all(|&i| steps[i].alternatives().next().is_none() && steps[i].min_rows.is_none() && steps[i].max_rows.is_none())
}

pub(crate) fn fuse_mla_query(g: &Graph, steps: &mut [Step]) {
    let at: std::collections::HashMap<String, usize> = steps.iter().enumerate().map(|(i, s)| (s.node.clone(), i)).collect();
    let name = |id: NodeId| g.node(id).name.clone();
    for qf in g.node_ids().filter(|&n| matches!(g.node(n).op, Op::Concat { axis: 2 })) {
        let ops = g.operands(qf);
        if ops.len() != 2 {
            continue;
        }
        let (qa, qr) = (ops[0], ops[1]);
        let Op::HeadMatMul { transpose_b: true } = g.node(qa).op else { continue };
        let Some((theta, style, r, yarn)) = rope_of(&g.node(qr).op) else { continue };
        let (qn, w) = (g.operands(qa)[0], g.operands(qa)[1]);
        let (qp, pos) = (g.operands(qr)[0], g.operands(qr)[1]);
        let (Op::Slice { axis: 2, start: 0, len: nope }, Op::Slice { axis: 2, start: ps, len: pl }) = (&g.node(qn).op, &g.node(qp).op) else { continue };
        let (nope, q) = (*nope, g.operands(qn)[0]);
        let qt = &g.node(q).ty;
        let wt = &g.node(w).ty;
        if g.operands(qp)[0] != q
            || *ps != nope
            || *pl != r
            || qt.rank() != 3
            || qt.shape[2].as_const() != Some(nope + r)
            || qt.dtype != DType::F32
            || !matches!(g.node(w).op, Op::Weight)
            || wt.rank() != 3
        {
            continue;
        }
        let (Some(h), Some(l)) = (qt.shape[1].as_const(), wt.shape[1].as_const()) else { continue };
        if ![qn, qa, qp, qr].iter().all(|&n| sole(g, n)) {
            continue;
        }
        let Some(&host) = at.get(&name(qf)) else { continue };
        let idx: Vec<usize> = [qn, qa, qp, qr].iter().filter_map(|&n| at.get(&name(n)).copied()).collect();
        // (the absorbed matmul's own batched alternative gives way to the fused query's)
        let own = |s: &Step| s.alternatives().all(|l| matches!(l.kernel, KernelSpec::HeadMatMulMma { .. })) && s.min_rows.is_none() && s.max_rows.is_none();
        if idx.len() != 4 || !plain(steps, &[idx[0], idx[2], idx[3]]) || !own(&steps[idx[1]]) || !plain(steps, &[host]) {
            continue;
        }
        let spec = KernelSpec::MlaQuery { h, nope, r, l, wdtype: wt.dtype, theta_bits: theta.to_bits(), interleaved: style == RopeStyle::Interleaved, yarn };
        if crate::kernels::fits(&spec).is_err() {
            continue;
        }
        for &i in &idx {
            steps[i].kernel = None;
            steps[i].few.clear();
        }
        let outs = Scalar::Const((h * l + h) as i64);
        let s = &mut steps[host];
        s.kernel = Some(spec);
        s.args = vec![name(q), name(w), name(pos), name(qf)];
        s.scalars = vec![outs.clone()];
        s.work = outs;
        s.grid_y = Scalar::Dim(name(qf), 0);
        let mma = KernelSpec::MlaQueryMma { h, nope, r, l, wdtype: wt.dtype, theta_bits: theta.to_bits(), interleaved: style == RopeStyle::Interleaved, yarn };
        if crate::kernels::fits(&mma).is_ok() {
            s.few = vec![crate::kernels::head_mma_large(mma, l, h, Scalar::Dim(name(qf), 0))];
        }
    }
}

pub(crate) fn fuse_mla_latent_cache(g: &Graph, steps: &mut [Step]) {
    let at: std::collections::HashMap<String, usize> = steps.iter().enumerate().map(|(i, s)| (s.node.clone(), i)).collect();
    let sole = |id: NodeId| sole(g, id);
    let through_reshape = |id: NodeId| -> NodeId {
        match g.node(id).op {
            Op::Reshape => g.operands(id)[0],
            _ => id,
        }
    };
    for w in g.node_ids().filter(|&n| matches!(g.node(n).op, Op::CacheWrite)) {
        let wo = g.operands(w);
        let (latent, slots) = (wo[1], wo[2]);
        if !matches!(g.node(latent).op, Op::Concat { axis: 2 }) || !sole(latent) {
            continue;
        }
        let lo = g.operands(latent);
        if lo.len() != 2 {
            continue;
        }
        let (norm_row, rope) = (lo[0], lo[1]);
        let norm = through_reshape(norm_row);
        let Op::RmsNorm { eps } = g.node(norm).op else { continue };
        let (ckv, gw) = (g.operands(norm)[0], g.operands(norm)[1]);
        let Some((theta, style, rotary_dim, yarn)) = rope_of(&g.node(rope).op) else { continue };
        let (pe_row, pos) = (g.operands(rope)[0], g.operands(rope)[1]);
        let pe = through_reshape(pe_row);
        let (Op::Slice { axis: 1, start: 0, len: l }, Op::Slice { axis: 1, start: ls, len: r }) = (&g.node(ckv).op, &g.node(pe).op) else { continue };
        let (l, r) = (*l, *r);
        let kva = g.operands(ckv)[0];
        let kt = &g.node(kva).ty;
        if g.operands(pe)[0] != kva || *ls != l || rotary_dim != r || kt.rank() != 2 || kt.shape[1].as_const() != Some(l + r) || kt.dtype != DType::F32 {
            continue;
        }
        let chain = [ckv, norm, norm_row, pe, pe_row, rope, latent];
        let mut ids: Vec<NodeId> = chain.to_vec();
        ids.dedup();
        if !ids.iter().all(|&n| sole(n)) || g.node(gw).ty.dtype != DType::F32 || !matches!(g.node(gw).op, Op::Weight) {
            continue;
        }
        let name = |id: NodeId| g.node(id).name.clone();
        let Some(&iw) = at.get(&name(w)) else { continue };
        // (every step of the chain a plain one: no alternatives by rows to keep)
        let idx: Vec<usize> = ids.iter().filter_map(|&n| at.get(&name(n)).copied()).collect();
        if !plain(steps, &idx) || !plain(steps, &[iw]) {
            continue;
        }
        let kv = g.node(w).ty.dtype;
        let interleaved = style == RopeStyle::Interleaved;
        let spec = KernelSpec::MlaLatentCache { l, r, eps_bits: eps.to_bits(), theta_bits: theta.to_bits(), interleaved, yarn, kv };
        if crate::kernels::fits(&spec).is_err() {
            continue;
        }
        for &i in &idx {
            steps[i].kernel = None;
        }
        let cache = steps[iw].args[2].clone();
        let s = &mut steps[iw];
        s.kernel = Some(spec);
        s.args = vec![name(kva), name(gw), name(pos), name(slots), cache];
        s.scalars = vec![Scalar::Rows(name(kva))];
        s.work = Scalar::Rows(name(kva));
        s.grid_y = Scalar::Const(1);
    }
}

/// One-token steps write the latent cache row inside the attention
/// ([`KernelSpec::MlaCacheAttention`]): where a [`KernelSpec::MlaLatentCache`] step writes the
/// pool an [`KernelSpec::MlaAttention`] step reads, the attention gets a one-row alternative
/// whose blocks first write their token's row (every head's block the same values), and the
/// cache step runs from 2 rows — one launch fewer per layer where a decode step's layers are
/// a chain of small latency-bound kernels. One row only: with more, a token of a prefill may
/// read a row another token's blocks write in the same launch.
pub(crate) fn fuse_mla_cache_attention(steps: &mut [Step]) {
    for a in 0..steps.len() {
        let Some(attn @ KernelSpec::MlaAttention { .. }) = steps[a].kernel.clone() else { continue };
        let Some(w) = steps[..a].iter().position(|s| s.node == steps[a].args[1]) else { continue };
        let Some(write @ KernelSpec::MlaLatentCache { .. }) = steps[w].kernel.clone() else { continue };
        if !plain(steps, &[w]) || steps[a].min_rows.is_some() || steps[a].max_rows.is_some() || steps[w].args.len() != 5 {
            continue;
        }
        let fused = KernelSpec::MlaCacheAttention { attn: Box::new(attn), write: Box::new(write) };
        if crate::kernels::fits(&fused).is_err() {
            continue;
        }
        // (x, g, slots; the attention's own args, the cache as the pool the write names)
        let wa = steps[w].args.clone();
        let mut args = vec![wa[0].clone(), wa[1].clone(), wa[3].clone()];
        args.extend(steps[a].args.iter().cloned());
        args[4] = wa[4].clone();
        steps[w].min_rows = Some(2);
        let s = &mut steps[a];
        s.keep_alternative_args();
        let one = super::Large { min_rows: 1, max_rows: Some(1), args: Some(args), kernel: fused, scalars: s.scalars.clone(), work: s.work.clone(), grid_y: s.grid_y.clone() };
        s.few.insert(0, one);
    }
}
