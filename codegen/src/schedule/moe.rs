//! The DeepSeekMoE block's one-token fusion: the shared experts as slots of the routed
//! experts' kernels.

use super::*;
use dsc_ir::NodeId;

/// One-token steps run the shared experts inside the routed experts' two kernels, as
/// `shared` more slots of I hidden units each after every token's `top_k` (SGLang's shared
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
///   `{experts}@rows{(top_k + F/I)·I}`, and `MoeDown { shared, residual }` sums the routed
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
        let up = KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared: f.shared };
        let down = KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual: true, shared: f.shared };
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
