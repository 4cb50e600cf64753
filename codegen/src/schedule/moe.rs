//! The DeepSeekMoE block's one-token fusion: the shared experts as slots of the routed
//! experts' kernels.

use super::*;
use dsc_ir::NodeId;

/// One-token steps run the shared experts inside the routed experts' two kernels, as
/// `shared` more slots of I hidden units each beside every token's `top_k` (SGLang's shared
/// experts fusion, done at lowering: the graph and the CPU executor keep the ops).
///
/// Where `matmul_add(silu_mul(cat[gate part], cat[up part]), W_down, moe_experts(x, route,
/// ..., residual))` — the shared MLP's down projection adding onto the routed experts, whose
/// gate and up are two parts of a `matmul_cat` over the same x as the experts — the cat's
/// other part being the router at offset 0, and the shared width F a multiple of the experts'
/// I: at one row
/// - the cat's GEMV computes the router part only (the shared gate/up rows are read by the
///   experts' gate/up instead),
/// - the SwiGLU step and the shared down projection do not run,
/// - `MoeGateUp { shared: F / I }` writes the routed and the shared slots' h into
///   `{experts}@rows{(top_k + F/I)·I}` (the shared slots first where the attention
///   prefetches their weights, `shared_first`), and `MoeDown { shared, residual }` sums the routed
///   slots (route-weighted, in expert order), then the shared ones, then the residual, into the
///   matmul_add's buffer — the layer's output.
///
/// From 2 rows everything runs as before: the cat's kernels stay its own (the router GEMV is
/// its one-row alternative), and the per-token expert kernels keep their own arguments as an
/// alternative from 2 rows, after the grouped ones (from `kernels::GROUPED_MIN_ROWS` rows).
pub(crate) fn fuse_moe_shared(g: &Graph, steps: &mut Vec<Step>, o: &ScheduleOptions) {
    let name = |id: NodeId| g.node(id).name.clone();
    for out in g.node_ids() {
        let Some(f) = shared_pattern(g, out) else { continue };
        let at = |steps: &[Step], node: &str, kernel: fn(&KernelSpec) -> bool| steps.iter().position(|s| s.node == node && s.kernel.as_ref().is_some_and(kernel));
        let h = format!("{}@rows{}", name(f.experts), f.top_k * f.inter);
        let h2 = format!("{}@rows{}", name(f.experts), (f.top_k + f.shared) * f.inter);
        let (Some(ci), Some(si), Some(ui), Some(di), Some(oi)) = (
            at(steps, &name(f.cat), |k| matches!(k, KernelSpec::MatMulParts { inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMul { .. }))),
            at(steps, &name(f.silu), |_| true),
            at(steps, &h, |k| matches!(k, KernelSpec::MoeGateUp { shared: 0, .. })),
            at(steps, &name(f.experts), |k| matches!(k, KernelSpec::MoeDown { shared: 0, residual: true, .. })),
            at(steps, &name(out), |_| true),
        ) else {
            continue;
        };
        if [si, oi].iter().any(|&i| steps[i].min_rows.is_some() || steps[i].max_rows.is_some()) || [ci, ui, di].iter().any(|&i| steps[i].min_rows.is_some()) {
            continue;
        }
        let (Some(KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, .. }), Some(KernelSpec::MoeDown { .. })) = (steps[ui].kernel.clone(), steps[di].kernel.clone()) else { continue };
        // (the shared slots first where their weights are prefetched: `prefetch_shared_experts`)
        let first = o.moe_prefetch;
        let up = KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared: f.shared, shared_first: first };
        let down = KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual: true, shared: f.shared, shared_first: first };
        if crate::kernels::fits(&up).is_err() || crate::kernels::fits(&down).is_err() {
            continue;
        }
        // the router part alone as the cat's one-row GEMV (part 0: the buffer's first columns)
        let cat_ops = g.operands(f.cat);
        let Ok(router) = matmul_step(&name(f.cat), vec![name(cat_ops[0]), name(cat_ops[1]), name(f.cat)], d, f.router, wdtype, false, false, None, o) else { continue };
        let Some(rk) = router.kernel else { continue };
        // the per-token kernels as they were from 2 rows, after the step's own alternatives
        // (the grouped kernels from GROUPED_MIN_ROWS rows come first where they fit)
        let before = |s: &Step| Large {
            min_rows: 2,
            max_rows: None,
            args: Some(s.args.clone()),
            kernel: s.kernel.clone().expect("a kernel"),
            scalars: s.scalars.clone(),
            work: s.work.clone(),
            grid_y: s.grid_y.clone(),
        };
        let xo = g.operands(f.experts);
        // the cat keeps its kernels for every row count but one: the router GEMV alone at one
        // row, the first alternative (its SwiGLU and shared down do not run there)
        let s = &mut steps[ci];
        s.keep_alternative_args();
        s.few.insert(0, Large { min_rows: 1, max_rows: Some(1), args: Some(router.args), kernel: rk, scalars: router.scalars, work: router.work, grid_y: router.grid_y });
        steps[si].min_rows = Some(2);
        steps[oi].min_rows = Some(2);
        let s = &mut steps[ui];
        s.keep_alternative_args();
        let keep = before(s);
        s.few.push(keep);
        s.kernel = Some(up);
        s.args = vec![name(xo[0]), name(xo[1]), name(xo[2]), name(xo[3]), name(f.gate_w), name(f.up_w), h2.clone()];
        s.grid_y = Scalar::RowsTimes(name(xo[0]), (top_k + f.shared) as i64);
        let s = &mut steps[di];
        s.keep_alternative_args();
        let keep = before(s);
        s.few.push(keep);
        s.kernel = Some(down);
        s.args = vec![h2.clone(), name(xo[1]), name(xo[4]), name(f.down_w), name(xo[5]), name(out)];
        // (the wider scratch, declared by a kernel-less step before its writer)
        steps.insert(ui, Step::new(&h2));
    }
}

/// The graph nodes of [`fuse_moe_shared`]'s pattern at `out`.
struct SharedExperts {
    experts: NodeId,
    cat: NodeId,
    silu: NodeId,
    gate_w: NodeId,
    up_w: NodeId,
    down_w: NodeId,
    /// the router part's width (the cat's part 0)
    router: usize,
    /// the experts' hidden width I, and the shared width F in I-wide slots
    inter: usize,
    shared: usize,
    top_k: usize,
}

fn shared_pattern(g: &Graph, out: NodeId) -> Option<SharedExperts> {
    let Op::MatMulAdd { transpose_b: true } = g.node(out).op else { return None };
    let ops = g.operands(out);
    let [hs, down_w, experts] = ops[..] else { return None };
    let xo = g.operands(experts);
    if !matches!(g.node(experts).op, Op::MoeExperts) || xo.len() != 6 || g.users(experts) != [out] {
        return None;
    }
    let top_k = match &g.node(xo[1]).op {
        Op::MoeRoute(r) => r.top_k,
        _ => return None,
    };
    if !matches!(g.node(hs).op, Op::Binary(dsc_ir::BinaryOp::SiluMul)) || g.users(hs) != [out] || !matches!(g.node(down_w).op, Op::Weight) {
        return None;
    }
    // the SwiGLU's two operands: whole parts of one matmul_cat over the experts' x
    let part = |s: NodeId| -> Option<(NodeId, usize, usize)> {
        let Op::Slice { axis: 1, start, len } = g.node(s).op else { return None };
        let cat = g.operands(s)[0];
        (matches!(g.node(cat).op, Op::MatMulCat) && g.users(s) == [hs]).then_some((cat, start, len))
    };
    let so = g.operands(hs);
    let ((cat, s0, f), (cat1, s1, f1)) = (part(so[0])?, part(so[1])?);
    let co = g.operands(cat);
    let rows = |w: NodeId| g.node(w).ty.shape.first().and_then(|d| d.as_const());
    let parts: Vec<usize> = co[1..].iter().map(|&w| rows(w)).collect::<Option<_>>()?;
    let inter = g.node(xo[2]).ty.shape.get(1)?.as_const()?;
    let wdtype = g.node(xo[2]).ty.dtype;
    let (router, gate_w, up_w) = match parts[..] {
        [r, a, b] if a == f && b == f && f == f1 && s0 == r && s1 == r + f && cat1 == cat => (r, co[2], co[3]),
        _ => return None,
    };
    let same = [gate_w, up_w, down_w, co[1]].iter().all(|&w| g.node(w).ty.dtype == wdtype && matches!(g.node(w).op, Op::Weight));
    if co[0] != xo[0] || !same || f % inter != 0 || g.node(down_w).ty.shape.get(1).and_then(|d| d.as_const()) != Some(f) {
        return None;
    }
    Some(SharedExperts { experts, cat, silu: hs, gate_w, up_w, down_w, router, inter, shared: f / inter, top_k })
}

/// The shared experts' gate and up weights stream into L2 while the attention before them runs
/// (`KernelSpec::PrefetchL2`): the absorbed query (`MlaQuery`, a thousand blocks at one token)
/// prefetches the gate weight, the value projection (`HeadMatMul`) the up weight, each before
/// its wait. A one-token MoE layer's attention is a chain of small latency-bound kernels that
/// leave DRAM mostly idle; the shared slots, first in the experts' gate/up grid
/// (`kernels::moe` `shared_first`), then read them from L2 instead of streaming them beside
/// the routed experts.
pub(crate) fn prefetch_shared_experts(mut steps: Vec<Step>, g: &Graph) -> Vec<Step> {
    for i in 0..steps.len() {
        // (also with the norm folded in, `fold_moe_norm`)
        let shared = match &steps[i].kernel {
            Some(KernelSpec::MoeGateUp { shared, shared_first: true, .. }) => *shared,
            Some(KernelSpec::NormMatMul { inner, .. }) => match inner.as_ref() {
                KernelSpec::MoeGateUp { shared, shared_first: true, .. } => *shared,
                _ => continue,
            },
            _ => continue,
        };
        // (args: x, [norm weight], route, gate, up, shared gate, shared up, h)
        let a = &steps[i].args;
        if shared == 0 || a.len() < 7 {
            continue;
        }
        let (sg, su) = (a[a.len() - 3].clone(), a[a.len() - 2].clone());
        let (Some(gb), Some(ub)) = (plain_weight_bytes(g, &sg), plain_weight_bytes(g, &su)) else { continue };
        // this layer's attention: the steps back to the previous MoE layer's experts
        let from = steps[..i].iter().rposition(|s| matches!(s.kernel, Some(KernelSpec::MoeDown { .. } | KernelSpec::MoeGateUp { .. }))).map_or(0, |p| p + 1);
        let find = |steps: &[Step], want: fn(&KernelSpec) -> bool| (from..i).rev().find(|&j| steps[j].kernel.as_ref().is_some_and(want));
        let (Some(q), Some(v)) = (find(&steps, |k| matches!(k, KernelSpec::MlaQuery { .. })), find(&steps, |k| matches!(k, KernelSpec::HeadMatMul { .. }))) else { continue };
        prefetch_before(&mut steps[q], sg, gb);
        prefetch_before(&mut steps[v], su, ub);
    }
    steps
}

/// One-token steps route inside the router's GEMV ([`KernelSpec::MoeRouteGemv`]): where a
/// [`KernelSpec::MoeRoute`] step reads logits that are the first columns of a step whose
/// one-row alternative is the router GEMV alone (`fuse_moe_shared`'s), that alternative's
/// last block of each token routes it, and the router step runs from 2 rows — one launch
/// fewer per MoE layer at one token.
pub(crate) fn fuse_moe_router(steps: &mut [Step]) {
    for r in 0..steps.len() {
        let Some(route @ KernelSpec::MoeRoute { e, .. }) = steps[r].kernel.clone() else { continue };
        if steps[r].alternatives().next().is_some() || steps[r].min_rows.is_some() || steps[r].max_rows.is_some() {
            continue;
        }
        let logits = steps[r].args[0].clone();
        // (the logits: a view at offset 0 of the merged router + shared gate/up output)
        let Some(cat) = steps[..r].iter().find(|s| s.node == logits && matches!(s.alias_offset, Some(Scalar::RowsTimes(_, 0) | Scalar::Const(0)))).and_then(|s| s.alias_of.clone()) else { continue };
        let Some(c) = steps[..r].iter().position(|s| s.node == cat) else { continue };
        let Some(l) = steps[c].few.iter().position(|l| l.min_rows == 1 && l.max_rows == Some(1) && matches!(l.kernel, KernelSpec::MatMul { n, .. } if n == e)) else { continue };
        let fused = KernelSpec::MoeRouteGemv { gemv: Box::new(steps[c].few[l].kernel.clone()), route: Box::new(route) };
        let Some(mut args) = steps[c].few[l].args.clone() else { continue };
        if crate::kernels::fits(&fused).is_err() {
            continue;
        }
        // (mask, [bias], [counts], the counter, the routing row)
        let ra = &steps[r].args;
        args.extend(ra[1..ra.len() - 1].iter().cloned());
        args.push(format!("{}@sync", steps[r].node));
        args.push(ra[ra.len() - 1].clone());
        let alt = &mut steps[c].few[l];
        alt.kernel = fused;
        alt.args = Some(args);
        steps[r].min_rows = Some(2);
    }
}

/// One-token steps fold the MoE layer's RMSNorm into both kernels that read it
/// ([`KernelSpec::NormMatMul`]): the routing GEMV ([`fuse_moe_router`]'s) and the experts'
/// gate/up with the shared slots ([`fuse_moe_shared`]'s) each take the residual stream and
/// the norm weight and scale by 1/rms themselves (every block its own sum of squares of a
/// 2,048-value row), and the norm step runs from 2 rows — where nothing else reads the norm at
/// one row.
pub(crate) fn fold_moe_norm(steps: &mut [Step]) {
    for u in 0..steps.len() {
        let Some(KernelSpec::MoeGateUp { shared, .. }) = steps[u].kernel else { continue };
        if shared == 0 || steps[u].min_rows.is_some() {
            continue;
        }
        let x = steps[u].args[0].clone();
        let Some(n) = steps[..u].iter().position(|s| s.node == x) else { continue };
        let (Some(KernelSpec::RmsNorm { eps_bits, .. } | KernelSpec::RmsNormHalf { eps_bits, .. }), None) = (steps[n].kernel.clone(), steps[n].min_rows) else { continue };
        let (src, g) = (steps[n].args[0].clone(), steps[n].args[1].clone());
        // the router: a one-row alternative reading x that routes (`fuse_moe_router`)
        let Some((c, l)) = (n + 1..u)
            .find_map(|i| steps[i].few.iter().position(|l| l.max_rows == Some(1) && matches!(l.kernel, KernelSpec::MoeRouteGemv { .. }) && l.args.as_ref().is_some_and(|a| a[0] == x)).map(|l| (i, l)))
        else {
            continue;
        };
        // (nothing else launched at one row names x)
        let one_row = |s: &Step| -> Option<Vec<String>> {
            if s.min_rows.is_some_and(|m| m > 1) {
                return None;
            }
            match s.alternatives().find(|l| l.min_rows <= 1 && l.max_rows.is_none_or(|m| m >= 1)) {
                Some(l) => Some(l.args.clone().unwrap_or_else(|| s.args.clone())),
                None => s.kernel.as_ref().map(|_| s.args.clone()),
            }
        };
        if steps.iter().enumerate().any(|(i, s)| i != n && i != c && i != u && one_row(s).is_some_and(|a| a.contains(&x))) {
            continue;
        }
        let wrap = |k: KernelSpec| KernelSpec::NormMatMul { inner: Box::new(k), eps_bits };
        let KernelSpec::MoeRouteGemv { gemv, route } = steps[c].few[l].kernel.clone() else { continue };
        let router = KernelSpec::MoeRouteGemv { gemv: Box::new(wrap(*gemv)), route };
        let up = wrap(steps[u].kernel.clone().expect("checked"));
        if crate::kernels::fits(&router).is_err() || crate::kernels::fits(&up).is_err() {
            continue;
        }
        let alt = &mut steps[c].few[l];
        alt.kernel = router;
        if let Some(a) = alt.args.as_mut() {
            a[0] = src.clone();
            a.insert(1, g.clone());
        }
        let s = &mut steps[u];
        s.keep_alternative_args();
        s.kernel = Some(up);
        s.args[0] = src;
        s.args.insert(1, g);
        steps[n].min_rows = Some(2);
    }
}
