//! Schedule rewrites that fold neighbours into the decode GEMVs: the gate/up SwiGLU GEMV, the
//! fused one-token MLP, the norm into the row gather and the wide lm_head, the embedding gather
//! into the first GEMV, the lm_head's L2 prefetch.

use crate::schedule::*;

/// The logits' row gather folded into the final RMSNorm (`KernelSpec::RowGather`): where a
/// plain f32 row gather of an activation (`Gather` with no alternatives, the logit rows of the
/// last hidden state, not a graph output) is read by nothing but the next kernel step, a block-per-row RMSNorm
/// (D a multiple of 4), the norm reads its rows through the gather's indices and the gather's
/// step goes (its buffer with it). DSC_ROW_GATHER_NORM=0 at compile time keeps them apart.
pub(crate) fn fold_row_gather(g: &Graph, mut steps: Vec<Step>) -> Vec<Step> {
    let mut i = 0;
    while i + 1 < steps.len() {
        let Some(KernelSpec::Gather { dtype: DType::F32, .. }) = steps[i].kernel else {
            i += 1;
            continue;
        };
        let out = steps[i].node.clone();
        let Some(j) = (i + 1..steps.len()).find(|&j| steps[j].kernel.is_some()) else { break };
        let norm_fits = matches!(&steps[j].kernel, Some(KernelSpec::RmsNorm { d, .. } | KernelSpec::RmsNormHalf { d, .. }) if d % 4 == 0);
        // (the gather's output: x of that norm and nowhere else, no alias of it)
        let only_there = steps.iter().enumerate().all(|(k, s)| k == i || (k == j) == s.args.contains(&out)) && steps[j].args.first() == Some(&out) && !steps[j].args[1..].contains(&out);
        let plain = |s: &Step| unbounded(s) && s.alternatives().next().is_none();
        let aliased = steps.iter().any(|s| s.alias_of.as_deref() == Some(out.as_str())) || g.outputs.iter().any(|(_, o)| g.node(*o).name == out);
        if !norm_fits || !only_there || !plain(&steps[i]) || !plain(&steps[j]) || aliased || steps[i].args.len() != 3 {
            i += 1;
            continue;
        }
        let (table, idx) = (steps[i].args[0].clone(), steps[i].args[1].clone());
        let n = &mut steps[j];
        n.kernel = n.kernel.take().map(|k| KernelSpec::RowGather { inner: Box::new(k) });
        n.args = [idx, table].into_iter().chain(n.args[1..].iter().cloned()).collect();
        steps.remove(i);
    }
    steps
}

/// The final RMSNorm (with the logits' row gather folded in, or without) folded into the wide
/// GEMV after it (`KernelSpec::MatMulWide`, the lm_head): its default kernel becomes
/// `NormMatMul { MatMulWide }` (under `RowGather`), every warp normalizing its registers'
/// share of x itself, and the norm runs from two rows only (the GEMV's alternatives read its
/// output). One kernel less per step; DSC_WIDE_NORM=0 at compile time off.
pub(crate) fn fold_norm_into_wide(g: &Graph, mut steps: Vec<Step>) -> Vec<Step> {
    let Some(j) = steps.iter().position(|s| matches!(s.kernel, Some(KernelSpec::MatMulWide { bias: false, .. })) && unbounded(s) && s.args.len() == 3) else {
        return steps;
    };
    let Some(KernelSpec::MatMulWide { k, .. }) = steps[j].kernel else { unreachable!("matched") };
    let x = steps[j].args[0].clone();
    let Some(i) = steps[..j].iter().rposition(|s| s.node == x) else { return steps };
    // (the norm, maybe with its 16-bit copy for the prefill matmuls: 1 or 2 outputs)
    let norm_of = |k: &KernelSpec| match k {
        KernelSpec::RmsNorm { d, eps_bits } => Some((*d, *eps_bits, 1)),
        KernelSpec::RmsNormHalf { d, eps_bits, .. } => Some((*d, *eps_bits, 2)),
        _ => None,
    };
    let (gather, (d, eps_bits, nout)) = match &steps[i].kernel {
        Some(KernelSpec::RowGather { inner }) => match norm_of(inner) {
            Some(n) => (true, n),
            None => return steps,
        },
        Some(other) => match norm_of(other) {
            Some(n) => (false, n),
            None => return steps,
        },
        None => return steps,
    };
    let nargs = steps[i].args.len();
    if d != k || nargs < nout + 2 || steps[i].args[nargs - nout] != x {
        return steps;
    }
    // (the norm's outputs read by that GEMV alone — its alternatives aside — under no alias,
    // and not graph outputs)
    let outs = steps[i].args[nargs - nout..].to_vec();
    let reads = |s: &Step| outs.iter().any(|o| s.args.contains(o) || s.alternatives().any(|l| l.args.as_ref().is_some_and(|a| a.contains(o))));
    let only_there = steps.iter().enumerate().all(|(n, s)| n == i || n == j || !reads(s)) && !steps[j].args[1..].iter().any(|a| outs.contains(a));
    let aliased = steps.iter().any(|s| s.alias_of.as_deref().is_some_and(|a| outs.iter().any(|o| o == a))) || g.outputs.iter().any(|(_, o)| outs.contains(&g.node(*o).name));
    let plain = unbounded(&steps[i]) && steps[i].alternatives().next().is_none();
    if !only_there || aliased || !plain {
        return steps;
    }
    let Some(wide) = steps[j].kernel.clone() else { return steps };
    let inner = KernelSpec::NormMatMul { inner: Box::new(wide), eps_bits };
    let kernel = if gather { KernelSpec::RowGather { inner: Box::new(inner) } } else { inner };
    if crate::kernels::fits(&kernel).is_err() {
        return steps;
    }
    let pre = steps[i].args[..nargs - nout].to_vec();
    let s = &mut steps[j];
    s.keep_alternative_args();
    s.kernel = Some(kernel);
    s.args = pre.into_iter().chain(s.args[1..].iter().cloned()).collect();
    steps[i].min_rows = Some(2);
    steps
}

/// The embedding gather folded into the one-row q/k/v GEMV after it (`KernelSpec::GatherX`;
/// on by default since session 19, DSC_GATHER_GEMV=0 at compile time off): where a bf16
/// table's `Gather` writes x and the next kernel step is the one-row GEMV with the norm
/// prologue (zero-filling or not) reading x first, that GEMV reads the table row itself and its
/// block 0 writes x for the kernels after it; the gather runs from two rows only (the GEMV's
/// alternatives read x).
pub(crate) fn fold_embedding_gather(mut steps: Vec<Step>) -> Vec<Step> {
    let Some(i) = steps.iter().position(|s| matches!(s.kernel, Some(KernelSpec::Gather { dtype: DType::BF16, .. })) && unbounded(s) && s.alternatives().next().is_none()) else {
        return steps;
    };
    let x = steps[i].node.clone();
    // (the next kernel at one row: the norm for more rows, `min_rows`, runs with the gather)
    let Some(z) = (i + 1..steps.len()).find(|&j| steps[j].kernel.is_some() && steps[j].min_rows.is_none_or(|m| m <= 1)) else { return steps };
    let xi = match &steps[z].kernel {
        Some(KernelSpec::ZeroFill { inner, .. }) if matches!(inner.as_ref(), KernelSpec::NormMatMul { .. }) => 2,
        Some(KernelSpec::NormMatMul { .. }) => 0,
        _ => return steps,
    };
    if steps[i].args.len() != 3 || steps[z].args.get(xi) != Some(&x) || !unbounded(&steps[z]) {
        return steps;
    }
    let fused = |k: KernelSpec| match k {
        KernelSpec::ZeroFill { inner, len } => KernelSpec::ZeroFill { inner: Box::new(KernelSpec::GatherX { inner }), len },
        other => KernelSpec::GatherX { inner: Box::new(other) },
    };
    let Some(k) = steps[z].kernel.clone().map(fused) else { return steps };
    if crate::kernels::fits(&k).is_err() {
        return steps;
    }
    let (table, tok) = (steps[i].args[0].clone(), steps[i].args[1].clone());
    let zs = &mut steps[z];
    zs.keep_alternative_args();
    zs.kernel = Some(k);
    zs.args.splice(xi..xi, [table, tok]);
    steps[i].min_rows = Some(2);
    steps
}

/// Bytes of graph weight `name` where it is plain float (bf16, f16, f32): what an L2 prefetch
/// of it moves.
pub(crate) fn plain_weight_bytes(g: &Graph, name: &str) -> Option<usize> {
    let n = g.node(g.by_name(name)?);
    if !matches!(n.op, Op::Weight) || !matches!(n.ty.dtype, DType::BF16 | DType::F16 | DType::F32) {
        return None;
    }
    n.ty.dtype.bytes_for(n.ty.const_numel()?)
}

/// The one-row lm_head GEMV (the last step's weight, too large for its own L2 prefetch) reads
/// its first rows from L2: the last one-token fused attention before it (`QkvAttentionO`; or
/// the last fused MLP) prefetches the weight's first `bytes` before its wait
/// (`KernelSpec::PrefetchL2`) — DRAM is mostly idle under the latency-bound layer, and the
/// GEMV's blocks take the rows in order.
pub(crate) fn prefetch_lm_head(mut steps: Vec<Step>, g: &Graph, bytes: usize) -> Vec<Step> {
    let Some(h) = steps.iter().rposition(|s| matches!(s.kernel, Some(KernelSpec::MatMul { .. })) && unbounded(s)) else { return steps };
    let Some(w) = steps[h].args.get(1).cloned() else { return steps };
    let Some(wb) = plain_weight_bytes(g, &w).filter(|&b| b > crate::kernels::GEMV_PREFETCH_MAX_BYTES) else { return steps };
    let Some(p) = steps[..h]
        .iter()
        .rposition(|s| matches!(s.kernel, Some(KernelSpec::QkvAttentionO { .. })))
        .or_else(|| steps[..h].iter().rposition(|s| s.kernel.as_ref().is_some_and(KernelSpec::is_fused_mlp)))
    else {
        return steps;
    };
    prefetch_before(&mut steps[p], w, bytes.min(wb));
    steps
}

/// Step `s`'s kernel as [`KernelSpec::PrefetchL2`] of the first `bytes` (rounded down to 16)
/// of weight `w`: the weight its first arg, the bytes its last scalar; the alternatives keep
/// their own args.
pub(crate) fn prefetch_before(s: &mut Step, w: String, bytes: usize) {
    s.keep_alternative_args();
    s.kernel = s.kernel.take().map(|k| KernelSpec::PrefetchL2 { inner: Box::new(k) });
    s.args.insert(0, w);
    s.scalars.push(Scalar::Const(bytes as i64 / 16 * 16));
}

/// The one-token MLP as one kernel (`KernelSpec::SwiGluDown`): where the SwiGLU GEMV with the
/// norm prologue (`NormMatMul` over `SwiGluGemv`, bf16 or Q4_1, reading x and writing h) feeds
/// the down projection's one-row GEMV (the same weight format, bias-less, its residual that
/// same x, nothing else reading h), and x is the output of a one-row bias-less GEMV with a residual (the o
/// projection), the down step's one-row kernel becomes the fused MLP reading x, g and the
/// three weights and adding into its output, which the o projection's one-row kernel also
/// writes (`MatMulCopy`: the residual seeded); the SwiGLU step then runs only from two rows
/// (its alternatives), and the down step's alternatives keep their kernels. Two launches
/// fewer per layer at batch 1. (Not where h is a graph output: it is not written at one row.)
pub(crate) fn fuse_swiglu_down(g: &Graph, mut steps: Vec<Step>, fb: usize, fpw: usize) -> Vec<Step> {
    for ci in 0..steps.len() {
        let Some(KernelSpec::NormMatMul { inner, eps_bits }) = &steps[ci].kernel else { continue };
        let KernelSpec::SwiGluGemv { k, f, wdtype } = **inner else { continue };
        if !matches!(wdtype, DType::BF16 | DType::Q4_1) {
            continue;
        }
        let eps_bits = *eps_bits;
        if steps[ci].min_rows.is_some() || steps[ci].args.len() != 5 {
            continue;
        }
        let [x, gn, wg, wu, h] = <[String; 5]>::try_from(steps[ci].args.clone()).expect("five args");
        // (h is written only from two rows on now: not where a graph output needs it)
        if g.outputs.iter().any(|(_, o)| g.node(*o).name == h) {
            continue;
        }
        // the one reader of h on the one-row path: the down projection, residual x
        let readers: Vec<usize> = (0..steps.len()).filter(|&i| i != ci && steps[i].buffers().any(|a| *a == h)).collect();
        let down = readers.iter().copied().find(|&i| {
            matches!(steps[i].kernel, Some(KernelSpec::MatMul { k: dk, wdtype: dw, bias: false, residual: true, .. }) if dk == f && dw == wdtype)
                && steps[i].args.len() == 4
                && steps[i].args[0] == h
                && steps[i].args[2] == x
                && steps[i].min_rows.is_none()
                && steps[i].max_rows.is_none()
        });
        let Some(di) = down.filter(|&di| di > ci) else { continue };
        // (the silu_mul step that writes h from two rows, and the down step: no one else)
        if readers.iter().any(|&i| i != di && !(steps[i].node == h && steps[i].min_rows.is_some_and(|m| m >= 2))) {
            continue;
        }
        let Some(KernelSpec::MatMul { n, .. }) = steps[di].kernel else { unreachable!("matched") };
        if crate::kernels::swiglu_down_fits(k, f, n, fb, fpw, wdtype).is_err() {
            continue;
        }
        // x's producer: the one-row plain GEMV with a residual, nothing between it and the
        // MLP writing x
        let Some(oi) = steps[..ci].iter().rposition(|s| s.node == x) else { continue };
        let o = &steps[oi];
        let plain = matches!(o.kernel, Some(KernelSpec::MatMul { bias: false, residual: true, wdtype: DType::F32 | DType::F16 | DType::BF16 | DType::Q4_1, .. }));
        if !plain || o.args.len() != 4 || o.args[3] != x || !unbounded(o) {
            continue;
        }
        let y = steps[di].node.clone();
        let wd = steps[di].args[1].clone();
        // the o projection's one-row kernel seeds y with x
        let o = &mut steps[oi];
        let old = o.keep_alternative_args();
        o.kernel = o.kernel.take().map(|k| KernelSpec::MatMulCopy { inner: Box::new(k) });
        o.args = vec![old[0].clone(), old[1].clone(), old[2].clone(), y.clone(), old[3].clone()];
        // the SwiGLU GEMV from two rows only (its alternatives)
        steps[ci].min_rows = Some(2);
        let d = &mut steps[di];
        d.keep_alternative_args();
        d.kernel = Some(KernelSpec::SwiGluDown { k, f, n, eps_bits, fb, fpw, wdtype });
        d.args = vec![x, gn, wg, wu, wd, y];
        d.scalars = vec![Scalar::Const(f as i64)];
        d.work = Scalar::Const(f as i64);
    }
    steps
}

/// The users of a merged Q/K/V matmul — rope(q), rope_cache_write(k) into the K pool,
/// cache_write(v) into the V pool — run as one kernel (`QkvRopeCache`), launched at the last
/// of the three steps (so every buffer it writes is live by then and every input still is);
/// the other two steps launch nothing (the rotated q keeps its buffer, the pools their
/// aliases). A lowering-level fusion: the graph keeps the three ops. DSC_NO_QKV_ROPE_FUSION=1
/// at compile time keeps three kernels (A/B runs).
/// The SwiGLU of a merged gate/up matmul in its decode GEMV's epilogue: where `silu_mul(a, b)`
/// reads the two whole parts of a two-part `matmul_cat` (plain-float weights, equal widths,
/// nothing else reading them), the cat's one-row kernel becomes `SwiGluGemv` writing the
/// silu_mul's buffer, and the silu_mul step runs only for 2+ rows (the cat's alternatives keep
/// writing the cat). The graph and the CPU oracle keep both ops. `DSC_NO_SWIGLU_FUSION=1` at
/// compile time turns it off.
pub(crate) fn fuse_swiglu(g: &Graph, steps: &mut [Step]) {
    let at: std::collections::HashMap<String, usize> = steps.iter().enumerate().map(|(i, s)| (s.node.clone(), i)).collect();
    for id in g.node_ids() {
        let n = g.node(id);
        if !matches!(n.op, Op::Binary(dsc_ir::BinaryOp::SiluMul)) {
            continue;
        }
        let ops = g.operands(id);
        let part = |s: dsc_ir::NodeId| -> Option<(dsc_ir::NodeId, usize, usize)> {
            let Op::Slice { start, len, .. } = g.node(s).op else { return None };
            let cat = g.operands(s)[0];
            (matches!(g.node(cat).op, Op::MatMulCat) && g.users(s) == [id]).then_some((cat, start, len))
        };
        let (Some((cat, s0, f)), Some((cat1, s1, f1))) = (part(ops[0]), part(ops[1])) else { continue };
        let ws = &g.operands(cat)[1..];
        let wdt = g.node(ws[0]).ty.dtype;
        if cat != cat1 || f != f1 || ws.len() != 2 || s0 == s1 || s0 % f != 0 || s1 % f != 0 || !matches!(wdt, DType::F32 | DType::F16 | DType::BF16 | DType::Q4_1 | DType::Q4_K) {
            continue;
        }
        let Some(k) = g.node(ws[0]).ty.shape.get(1).and_then(|d| d.as_const()) else { continue };
        // (Q4_K: the packed one-row GEMV's form, kernels/matmul/packed.rs; the others the GEMV's)
        let spec = KernelSpec::SwiGluGemv { k, f, wdtype: wdt };
        let q4k = wdt == DType::Q4_K;
        if crate::kernels::fits(&spec).is_err() {
            continue;
        }
        let (Some(&ci), Some(&si)) = (at.get(&g.node(cat).name), at.get(&n.name)) else { continue };
        // (over the plain merged GEMV, or the one with the RMSNorm prologue: then x is the
        // norm's input and g its weight, and the SwiGLU GEMV keeps the prologue)
        let merged = |k: &KernelSpec| matches!(k, KernelSpec::MatMulParts { inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMul { .. } | KernelSpec::MatMulPacked { tiles: 0, .. }));
        let (spec, head) = match &steps[ci].kernel {
            Some(k) if merged(k) => (spec, vec![g.node(g.operands(cat)[0]).name.clone()]),
            Some(KernelSpec::NormMatMul { inner, eps_bits }) if merged(inner) => (KernelSpec::NormMatMul { inner: Box::new(spec), eps_bits: *eps_bits }, steps[ci].args[..2].to_vec()),
            _ => continue,
        };
        let (wg, wu) = (g.node(ws[s0 / f]).name.clone(), g.node(ws[s1 / f]).name.clone());
        let st = &mut steps[ci];
        st.keep_alternative_args();
        st.kernel = Some(spec);
        st.args = head.into_iter().chain([wg, wu, n.name.clone()]).collect();
        // (the packed form takes the rows first, as its one-row matmul did)
        st.scalars = if q4k { vec![st.scalars[0].clone(), Scalar::Const(f as i64)] } else { vec![Scalar::Const(f as i64)] };
        st.work = Scalar::Const(f as i64);
        steps[si].min_rows = Some(2);
    }
}
