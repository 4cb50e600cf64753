//! DeepSeekMoE's kernels (the `moe_route` and `moe_experts` ops):
//! - [`KernelSpec::MoeRoute`]: the router, a warp per token. Each lane holds the logits of
//!   experts `lane + 32 i`; scores (softmax, or sigmoid), V3's correction bias, the group
//!   ranking (V2's group max, V3's sum of the two best) by warp reductions, every lane ranking
//!   the groups alike; then `top_k` rounds of a warp argmax (ties: the lower index, as
//!   `exec::route_token`), the chosen weights renormalized and scaled, and the row written
//!   dense ([T, E], zero where not chosen). Disabled experts (mask 0) are never chosen and
//!   leave the groups' ranks alone — the CPU executor's failover semantics. One launch per MoE
//!   layer; no shared memory.
//! - The routed experts of a step in two launches that read only the chosen experts' weights
//!   (the decode path: at batch 1 a token's `top_k` experts of the E): [`KernelSpec::MoeGateUp`]
//!   (grid y = tokens × top_k, the slot-th chosen expert in expert order: h[t, slot, i] =
//!   silu(gate_e[i] · x_t) · (up_e[i] · x_t); for 16-bit weights the dense SwiGLU GEMV's body
//!   on that expert's rows — [`gate_up_gemv`]: a block per tile of hidden units, its warps
//!   splitting D, x loaded once per block for all its rows —, else a warp per hidden unit)
//!   into the step's scratch
//!   `{node}@rows{top_k·I}`, then [`KernelSpec::MoeDown`] (a warp per (token, output n):
//!   y[t, n] = Σ over the chosen experts, in expert order, of route[t, e] · (down_e[n] ·
//!   h[t, slot])). The chosen experts are found from the dense routing row by warp ballots.
//!   From [`GROUPED_MIN_ROWS`] tokens the gate/up runs expert-major instead
//!   ([`KernelSpec::MoeGateUpGrouped`]: a warp per (expert, row) holding its two rows in
//!   registers, applied to every token that chose the expert), so each chosen expert's gate
//!   and up rows are read once per step; the down projection still reads them once per token,
//!   and the grouped tensor-core GEMM over tokens permuted by expert (prefill, large batches)
//!   is still to come.

use crate::kernels::*;
use crate::schedule::{NodeCx, Scalar, Step};
use crate::CodegenError;
use dsc_ir::{MoeRouting, MoeScoring, MoeSelect};

/// Warps per block of the routed-expert kernels (a warp per output).
pub const MOE_WARPS: u32 = 8;

/// The readable symbol of a `moe` kernel (`KernelSpec::symbol`).
pub(crate) fn moe_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::MoeRoute { e, top_k, n_group, topk_group, scoring, select, normalize, scaling_bits } => {
            let sc = match scoring {
                MoeScoring::Softmax => "softmax",
                MoeScoring::Sigmoid => "sigmoid",
            };
            let sel = match select {
                MoeSelect::Greedy => "greedy",
                MoeSelect::GroupMax => "groupmax",
                MoeSelect::NoauxTc => "noauxtc",
            };
            format!("moe_route_e{e}_k{top_k}_g{n_group}x{topk_group}_{sc}_{sel}{}_s{scaling_bits:08x}", if *normalize { "_norm" } else { "" })
        }
        KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype } => format!("moe_gate_up_e{e}_k{top_k}_d{d}_i{inter}_{wdtype}"),
        KernelSpec::MoeDown { d, inter, e, top_k, wdtype } => format!("moe_down_e{e}_k{top_k}_d{d}_i{inter}_{wdtype}"),
        KernelSpec::MoeGateUpGrouped { d, inter, e, top_k, wdtype } => format!("moe_gate_up_grouped_e{e}_k{top_k}_d{d}_i{inter}_{wdtype}"),
        other => unreachable!("{other:?} is not a moe kernel (kernels::family)"),
    }
}

/// How the runtime launches a `moe` kernel (`KernelSpec::launch`): the router a warp per
/// token (4 per block), the expert kernels a warp per output, grid y = tokens.
pub(crate) fn moe_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::MoeRoute { .. } => Launch::WarpPerRow { rows_per_block: 4 },
        KernelSpec::MoeGateUp { d, inter, wdtype, .. } if gate_up_gemv(*d, *inter, *wdtype) => KernelSpec::SwiGluGemv { k: *d, f: *inter, wdtype: *wdtype }.launch(),
        KernelSpec::MoeGateUp { .. } | KernelSpec::MoeDown { .. } | KernelSpec::MoeGateUpGrouped { .. } => Launch::WarpPerOutput { warps_per_block: MOE_WARPS },
        other => unreachable!("{other:?} is not a moe kernel (kernels::family)"),
    }
}

/// Whether the `moe` kernels take `spec`, without generating it: Err says why not.
pub fn moe_fits(spec: &KernelSpec) -> Result<(), String> {
    match spec {
        KernelSpec::MoeRoute { e, top_k, n_group, topk_group, select, .. } => {
            if *e == 0 || *e > 1024 || *n_group == 0 || *n_group > 32 || e % n_group != 0 {
                return Err(format!("the router takes up to 1024 experts in up to 32 equal groups (E {e}, {n_group} groups)"));
            }
            if *topk_group == 0 || topk_group > n_group || *top_k == 0 || *top_k > 32 || *top_k > topk_group * (e / n_group) {
                return Err(format!("the router picks 1..=32 experts from its kept groups (top_k {top_k}, topk_group {topk_group})"));
            }
            if *select == MoeSelect::NoauxTc && e / n_group < 2 {
                return Err("noaux_tc ranks groups by their two best experts: groups need >= 2".into());
            }
            Ok(())
        }
        KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype } | KernelSpec::MoeDown { d, inter, e, top_k, wdtype } => {
            if !matches!(wdtype, DType::F32 | DType::BF16 | DType::F16) {
                return Err(format!("the routed experts take f32/bf16/f16 weights, not {wdtype}"));
            }
            if *d == 0 || *inter == 0 || *e == 0 || *top_k == 0 || top_k > e {
                return Err(format!("empty routed experts (D {d}, I {inter}, E {e}, top_k {top_k})"));
            }
            Ok(())
        }
        KernelSpec::MoeGateUpGrouped { d, inter, e, top_k, wdtype } => {
            moe_fits(&KernelSpec::MoeGateUp { d: *d, inter: *inter, e: *e, top_k: *top_k, wdtype: *wdtype })?;
            if !matches!(wdtype, DType::BF16 | DType::F16) || d % 256 != 0 || d / 256 > GROUPED_MAX_ROUNDS {
                return Err(format!("the grouped gate/up keeps a warp's two 16-bit weight rows in registers: D a multiple of 256 up to {} (D {d}, {wdtype})", 256 * GROUPED_MAX_ROUNDS));
            }
            Ok(())
        }
        other => Err(format!("`{}` is not a moe kernel", other.symbol())),
    }
}

/// Most 256-element rounds of a row the grouped gate/up keeps in registers (two rows: 8 · 4
/// words each at D = 2,048).
pub const GROUPED_MAX_ROUNDS: usize = 8;

/// Chunk `c` of a dense routing row (experts 32c.., the row at `rbase` of `%route`; `last` = E
/// − 1, `ce` = E, `zero` = 0.0): lane l's expert 32c + l chosen (weight ≠ 0, inside E) and the
/// warp's ballot of them — (32c, the lane's bit, the ballot).
fn chosen_ballot(b: &mut Body, c: usize, lane: &str, rbase: &str, last: &str, ce: &str, zero: &str) -> (String, String, String) {
    let cc = b.ci64(32 * c as i64);
    let ei = b.op(&format!("arith.addi {lane}, {cc} : i64"));
    let ec = b.op(&format!("arith.minsi {ei}, {last} : i64"));
    let at = b.op(&format!("arith.addi {rbase}, {ec} : i64"));
    let r = b.load("%route", &at);
    let nz = b.op(&format!("arith.cmpf une, {r}, {zero} : f32"));
    let inr = b.op(&format!("arith.cmpi slt, {ei}, {ce} : i64"));
    let nz = b.op(&format!("arith.andi {nz}, {inr} : i1"));
    let bal = b.ballot(&nz);
    (cc, nz, bal)
}

/// Whether the routed experts' gate/up ([`KernelSpec::MoeGateUp`]) runs as the decode SwiGLU
/// GEMV (`emit_gemv`: a block per (token, slot, tile of hidden units), its warps splitting D,
/// x loaded once per block for all its gate and up rows) on the slot's expert's rows; else a
/// warp per (token, slot, hidden unit) (`emit_experts`: any D, f32 weights). The GEMV's
/// launch is the dense SwiGLU GEMV's, whose tiling must agree for I and 2·I.
pub(crate) fn gate_up_gemv(d: usize, inter: usize, wdtype: DType) -> bool {
    matches!(wdtype, DType::BF16 | DType::F16)
        && swiglu_fits(d, inter, wdtype).is_ok()
        && gemv_body_fits(d, inter, wdtype, 1, Outer::default(), true).is_ok()
        && gemv_tiling(d, inter, 1) == gemv_tiling(d, 2 * inter, 1)
}

/// [`KernelSpec::MoeGateUp`] as the SwiGLU GEMV: after `griddepcontrol.wait` (the routing row
/// is the previous kernel's output), block row y = token · top_k + slot finds the slot-th
/// chosen expert of its token (in expert order: per 32-expert chunk a ballot of the nonzero
/// routing weights, and the lane whose set bits below it number slot − (the chunks' count so
/// far) holds it; expert 0 where the row chose fewer — that slot's h row is never read), points
/// `%w0` / `%w1` at its gate and up rows, and runs the dense SwiGLU GEMV with x row = y / top_k
/// into h row y.
fn emit_gate_up_gemv(b: &mut Body, d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType) -> Result<(), String> {
    if b.pdl {
        b.wait_for_previous();
    }
    let by = b.op("gpu.block_id y");
    let by = b.idx64(&by);
    let ck = b.ci64(top_k as i64);
    let t = b.op(&format!("arith.divui {by}, {ck} : i64"));
    let slot = b.op(&format!("arith.remui {by}, {ck} : i64"));
    let slot = b.op(&format!("arith.trunci {slot} : i64 to i32"));
    let tid = b.op("gpu.thread_id x");
    let tid = b.idx64(&tid);
    let c31 = b.ci64(31);
    let lane = b.op(&format!("arith.andi {tid}, {c31} : i64"));
    let lane32 = b.op(&format!("arith.trunci {lane} : i64 to i32"));
    let one = b.op("arith.constant 1 : i32");
    let below = b.op(&format!("arith.shli {one}, {lane32} : i32"));
    let below = b.op(&format!("arith.subi {below}, {one} : i32"));
    let ce = b.ci64(e as i64);
    let rbase = b.op(&format!("arith.muli {t}, {ce} : i64"));
    let last = b.ci64(e as i64 - 1);
    let zero = b.cf32(0.0);
    let z32 = b.op("arith.constant 0 : i32");
    let mut count = z32.clone();
    let mut expert = b.ci64(0);
    for c in 0..e.div_ceil(32) {
        let (cc, nz, bal) = chosen_ballot(b, c, &lane, &rbase, &last, &ce, &zero);
        // (this lane's expert is the slot's when the chosen ones below it, here and in the
        // chunks before, number `slot`)
        let under = b.op(&format!("arith.andi {bal}, {below} : i32"));
        let under = b.popc(&under);
        let under = b.op(&format!("arith.addi {under}, {count} : i32"));
        let is = b.op(&format!("arith.cmpi eq, {under}, {slot} : i32"));
        let is = b.op(&format!("arith.andi {is}, {nz} : i1"));
        let hit = b.ballot(&is);
        let found = b.op(&format!("arith.cmpi ne, {hit}, {z32} : i32"));
        let (_, bit) = b.lowest_bit(&hit);
        let ex = b.op(&format!("arith.addi {cc}, {bit} : i64"));
        expert = b.op(&format!("arith.select {found}, {ex}, {expert} : i64"));
        let pc = b.popc(&bal);
        count = b.op(&format!("arith.addi {count}, {pc} : i32"));
    }
    let stride = b.ci64((inter * d * wdtype.block().1) as i64);
    let off = b.op(&format!("arith.muli {expert}, {stride} : i64"));
    b.line(&format!("%w0 = llvm.getelementptr %wg[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    b.line(&format!("%w1 = llvm.getelementptr %wu[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    b.x_row_div = Some(top_k);
    b.swiglu = true;
    emit_gemv(b, d, inter, wdtype, false, false, 1)
}

/// Fewest tokens from which the routed experts' gate/up runs expert-major
/// ([`KernelSpec::MoeGateUpGrouped`]: each chosen expert's rows read once for all its tokens)
/// instead of a block row per (token, chosen expert).
pub const GROUPED_MIN_ROWS: i64 = 8;

/// The `moe` kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn moe_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    moe_fits(spec)?;
    match spec {
        KernelSpec::MoeRoute { e, top_k, n_group, topk_group, scoring, select, normalize, scaling_bits } => {
            emit_route(b, *e, *top_k, *n_group, *topk_group, *scoring, *select, *normalize, f32::from_bits(*scaling_bits));
            Ok(if *select == MoeSelect::NoauxTc {
                "%logits: !llvm.ptr<1>, %mask: !llvm.ptr<1>, %bias: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
            } else {
                "%logits: !llvm.ptr<1>, %mask: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
            })
        }
        KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype } if gate_up_gemv(*d, *inter, *wdtype) => {
            emit_gate_up_gemv(b, *d, *inter, *e, *top_k, *wdtype)?;
            Ok("%x: !llvm.ptr<1>, %route: !llvm.ptr<1>, %wg: !llvm.ptr<1>, %wu: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into())
        }
        KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype } => {
            emit_experts(b, true, *d, *inter, *e, *top_k, *wdtype)?;
            Ok("%x: !llvm.ptr<1>, %route: !llvm.ptr<1>, %wg: !llvm.ptr<1>, %wu: !llvm.ptr<1>, %h: !llvm.ptr<1>, %n: i64".into())
        }
        KernelSpec::MoeGateUpGrouped { d, inter, e, top_k, wdtype } => {
            emit_gate_up_grouped(b, *d, *inter, *e, *top_k, *wdtype)?;
            Ok("%x: !llvm.ptr<1>, %route: !llvm.ptr<1>, %wg: !llvm.ptr<1>, %wu: !llvm.ptr<1>, %h: !llvm.ptr<1>, %n: i64, %rows: i64".into())
        }
        KernelSpec::MoeDown { d, inter, e, top_k, wdtype } => {
            emit_experts(b, false, *d, *inter, *e, *top_k, *wdtype)?;
            Ok("%h: !llvm.ptr<1>, %route: !llvm.ptr<1>, %wd: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into())
        }
        other => Err(format!("`{}` is not a moe kernel", other.symbol())),
    }
}

/// The router (see the file header). `%n` = tokens.
#[allow(clippy::too_many_arguments)]
fn emit_route(b: &mut Body, e: usize, top_k: usize, n_group: usize, topk_group: usize, scoring: MoeScoring, select: MoeSelect, normalize: bool, scaling: f32) {
    let (row, lane) = b.open_guarded_warp_row();
    let per_lane = e.div_ceil(32);
    let ce = b.ci64(e as i64);
    let base = b.op(&format!("arith.muli {row}, {ce} : i64"));
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let zero = b.cf32(0.0);
    let last = b.ci64(e as i64 - 1);
    // the lane's experts: index (i64 and i32), in range, logit, enabled
    struct Ex {
        e: String,
        e32: String,
        valid: Option<String>,
        logit: String,
        on: String,
        bias: Option<String>,
    }
    let mut xs = vec![];
    for i in 0..per_lane {
        let ci = b.ci64(32 * i as i64);
        let ei = b.op(&format!("arith.addi {lane}, {ci} : i64"));
        let valid = (32 * (i + 1) > e).then(|| b.op(&format!("arith.cmpi slt, {ei}, {ce} : i64")));
        let ec = if valid.is_some() { b.op(&format!("arith.minsi {ei}, {last} : i64")) } else { ei.clone() };
        let at = b.op(&format!("arith.addi {base}, {ec} : i64"));
        let logit = b.load("%logits", &at);
        let m = b.load("%mask", &ec);
        let on = b.op(&format!("arith.cmpf une, {m}, {zero} : f32"));
        let on = match &valid {
            Some(v) => b.op(&format!("arith.andi {on}, {v} : i1")),
            None => on,
        };
        let bias = (select == MoeSelect::NoauxTc).then(|| b.load("%bias", &ec));
        let e32 = b.op(&format!("arith.trunci {ei} : i64 to i32"));
        xs.push(Ex { e: ei, e32, valid, logit, on, bias });
    }
    let sel = |b: &mut Body, c: &Option<String>, v: &str, other: &str| -> String {
        match c {
            Some(c) => b.op(&format!("arith.select {c}, {v}, {other} : f32")),
            None => v.to_string(),
        }
    };
    // the scores that rank (unmasked) and the weights (softmax renormalized over the enabled)
    let (rank, weight): (Vec<String>, Vec<String>) = match scoring {
        MoeScoring::Softmax => {
            let soft = |b: &mut Body, keep: &dyn Fn(&Ex) -> Option<String>| -> Vec<String> {
                let mut m = ninf.clone();
                let kept: Vec<Option<String>> = xs.iter().map(keep).collect();
                for (x, k) in xs.iter().zip(&kept) {
                    let v = sel(b, k, &x.logit, &ninf);
                    m = b.op(&format!("arith.maximumf {m}, {v} : f32"));
                }
                let m = b.warp_reduce(&m, "arith.maximumf");
                let mut s = zero.clone();
                let mut ex = vec![];
                for (x, k) in xs.iter().zip(&kept) {
                    let d = b.op(&format!("arith.subf {}, {m} : f32", x.logit));
                    let p = b.exp(&d);
                    let p = sel(b, k, &p, &zero);
                    s = b.op(&format!("arith.addf {s}, {p} : f32"));
                    ex.push(p);
                }
                let s = b.warp_sum(&s);
                ex.iter().map(|p| b.op(&format!("arith.divf {p}, {s} : f32"))).collect()
            };
            let rank = soft(b, &|x: &Ex| x.valid.clone());
            let weight = soft(b, &|x: &Ex| Some(x.on.clone()));
            (rank, weight)
        }
        MoeScoring::Sigmoid => {
            let s: Vec<String> = xs.iter().map(|x| b.sigmoid(&x.logit)).collect();
            (s.clone(), s)
        }
    };
    // what the choice ranks: the scores (+ V3's bias), -inf outside the experts
    let choice: Vec<String> = xs
        .iter()
        .zip(&rank)
        .map(|(x, r)| {
            let c = match &x.bias {
                Some(bi) => b.op(&format!("arith.addf {r}, {bi} : f32")),
                None => r.clone(),
            };
            sel(b, &x.valid, &c, &ninf)
        })
        .collect();
    // the kept groups (every lane ranks them alike): a bit per group
    let per = e / n_group;
    let kept_group: Option<Vec<String>> = (select != MoeSelect::Greedy).then(|| {
        let cper = b.ci64(per as i64);
        let groups: Vec<String> = xs.iter().map(|x| b.op(&format!("arith.divui {}, {cper} : i64", x.e))).collect();
        let mut scores = vec![];
        for g in 0..n_group {
            let cg = b.ci64(g as i64);
            let ins: Vec<String> = groups.iter().map(|gr| b.op(&format!("arith.cmpi eq, {gr}, {cg} : i64"))).collect();
            let score = if select == MoeSelect::GroupMax {
                let mut m = ninf.clone();
                for (c, i) in choice.iter().zip(&ins) {
                    let v = b.op(&format!("arith.select {i}, {c}, {ninf} : f32"));
                    m = b.op(&format!("arith.maximumf {m}, {v} : f32"));
                }
                b.warp_reduce(&m, "arith.maximumf")
            } else {
                // the two best of the group: (a1 >= a2) per lane, then over the warp
                let (mut a1, mut a2) = (ninf.clone(), ninf.clone());
                for (c, i) in choice.iter().zip(&ins) {
                    let v = b.op(&format!("arith.select {i}, {c}, {ninf} : f32"));
                    let lo = b.op(&format!("arith.minimumf {a1}, {v} : f32"));
                    a1 = b.op(&format!("arith.maximumf {a1}, {v} : f32"));
                    a2 = b.op(&format!("arith.maximumf {a2}, {lo} : f32"));
                }
                let w32 = b.op("arith.constant 32 : i32");
                for off in [16, 8, 4, 2, 1] {
                    let o = b.op(&format!("arith.constant {off} : i32"));
                    let (s1, p1, s2, p2) = (b.v(), b.v(), b.v(), b.v());
                    b.line(&format!("{s1}, {p1} = gpu.shuffle xor {a1}, {o}, {w32} : f32"));
                    b.line(&format!("{s2}, {p2} = gpu.shuffle xor {a2}, {o}, {w32} : f32"));
                    let lo = b.op(&format!("arith.minimumf {a1}, {s1} : f32"));
                    let hi2 = b.op(&format!("arith.maximumf {a2}, {s2} : f32"));
                    a1 = b.op(&format!("arith.maximumf {a1}, {s1} : f32"));
                    a2 = b.op(&format!("arith.maximumf {lo}, {hi2} : f32"));
                }
                b.op(&format!("arith.addf {a1}, {a2} : f32"))
            };
            scores.push(score);
        }
        // group g is kept when fewer than topk_group groups rank before it (a larger score,
        // or an equal one at a lower index)
        let mut mask = b.op("arith.constant 0 : i32");
        for g in 0..n_group {
            let mut cnt = b.op("arith.constant 0 : i32");
            for (h, sh) in scores.iter().enumerate().filter(|(h, _)| *h != g) {
                let cmp = if h < g { "oge" } else { "ogt" };
                let before = b.op(&format!("arith.cmpf {cmp}, {sh}, {} : f32", scores[g]));
                let one = b.op(&format!("arith.extui {before} : i1 to i32"));
                cnt = b.op(&format!("arith.addi {cnt}, {one} : i32"));
            }
            let ctg = b.op(&format!("arith.constant {topk_group} : i32"));
            let keep = b.op(&format!("arith.cmpi slt, {cnt}, {ctg} : i32"));
            let bit = b.op(&format!("arith.extui {keep} : i1 to i32"));
            let sh = b.op(&format!("arith.constant {g} : i32"));
            let bit = b.op(&format!("arith.shli {bit}, {sh} : i32"));
            mask = b.op(&format!("arith.ori {mask}, {bit} : i32"));
        }
        let one = b.op("arith.constant 1 : i32");
        groups
            .iter()
            .zip(&xs)
            .map(|(gr, x)| {
                // (out-of-range experts' groups clamp to the last: they are -inf anyway)
                let cl = b.ci64(n_group as i64 - 1);
                let gr = match &x.valid {
                    Some(_) => b.op(&format!("arith.minsi {gr}, {cl} : i64")),
                    None => gr.clone(),
                };
                let g32 = b.op(&format!("arith.trunci {gr} : i64 to i32"));
                let s = b.op(&format!("arith.shrui {mask}, {g32} : i32"));
                let bit = b.op(&format!("arith.andi {s}, {one} : i32"));
                b.op(&format!("arith.cmpi ne, {bit}, {one} : i32"))
            })
            .collect::<Vec<String>>() // (true: NOT kept)
    });
    // masked choice: disabled -inf; outside the kept groups V2 0, V3 -inf; and the weight a
    // choice carries (V2: 0 outside the kept groups)
    let mut masked = vec![];
    let mut wsel = vec![];
    for (i, x) in xs.iter().enumerate() {
        let (c, w) = match &kept_group {
            Some(out) => {
                let other = if select == MoeSelect::GroupMax { zero.clone() } else { ninf.clone() };
                let c = b.op(&format!("arith.select {}, {other}, {} : f32", out[i], choice[i]));
                let w = if select == MoeSelect::GroupMax { b.op(&format!("arith.select {}, {zero}, {} : f32", out[i], weight[i])) } else { weight[i].clone() };
                (c, w)
            }
            None => (choice[i].clone(), weight[i].clone()),
        };
        masked.push(b.op(&format!("arith.select {}, {c}, {ninf} : f32", x.on)));
        wsel.push(w);
    }
    // top_k rounds of the warp argmax (ties: the lower index)
    let mut picks: Vec<(String, String)> = vec![]; // (expert i32, weight) per round
    for _ in 0..top_k {
        let (mut bv, mut bi) = (masked[0].clone(), xs[0].e32.clone());
        for (m, x) in masked.iter().zip(&xs).skip(1) {
            (bv, bi) = crate::kernels::argmax_take(b, &bv, &bi, m, &x.e32);
        }
        let (v, idx) = b.warp_argmax(&bv, &bi);
        let chosen = b.op(&format!("arith.cmpf ogt, {v}, {ninf} : f32"));
        let mut wl = zero.clone();
        for (k, x) in xs.iter().enumerate() {
            let hit = b.op(&format!("arith.cmpi eq, {}, {idx} : i32", x.e32));
            let w = b.op(&format!("arith.select {hit}, {}, {zero} : f32", wsel[k]));
            wl = b.op(&format!("arith.addf {wl}, {w} : f32"));
            masked[k] = b.op(&format!("arith.select {hit}, {ninf}, {} : f32", masked[k]));
        }
        let w = b.warp_sum(&wl);
        let w = b.op(&format!("arith.select {chosen}, {w}, {zero} : f32"));
        let none = b.op("arith.constant -1 : i32");
        let idx = b.op(&format!("arith.select {chosen}, {idx}, {none} : i32"));
        picks.push((idx, w));
    }
    let scale = b.cf32(scaling);
    let ws: Vec<String> = if normalize {
        let mut s = zero.clone();
        for (_, w) in &picks {
            s = b.op(&format!("arith.addf {s}, {w} : f32"));
        }
        let tiny = b.cf32(1e-20);
        let s = b.op(&format!("arith.addf {s}, {tiny} : f32"));
        picks.iter().map(|(_, w)| b.op(&format!("arith.divf {w}, {s} : f32"))).collect()
    } else {
        picks.iter().map(|(_, w)| w.clone()).collect()
    };
    let ws: Vec<String> = ws.iter().map(|w| b.op(&format!("arith.mulf {w}, {scale} : f32"))).collect();
    for x in &xs {
        let mut y = zero.clone();
        for ((idx, _), w) in picks.iter().zip(&ws) {
            let hit = b.op(&format!("arith.cmpi eq, {}, {idx} : i32", x.e32));
            y = b.op(&format!("arith.select {hit}, {w}, {y} : f32"));
        }
        let at = b.op(&format!("arith.addi {base}, {} : i64", x.e));
        match &x.valid {
            Some(v) => {
                b.line(&format!("scf.if {v} {{"));
                b.store(&y, "%y", &at);
                b.line("}");
            }
            None => b.store(&y, "%y", &at),
        }
    }
    b.line("}");
}

/// The routed experts' two kernels (see the file header): `gate_up` the first (params x,
/// route, wg, wu, h, n = I), else the down projection (params h, route, wd, y, n = D).
fn emit_experts(b: &mut Body, gate_up: bool, d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType) -> Result<(), String> {
    // (gate/up: block y = token · top_k + slot, each warp one chosen expert's two rows;
    // down: block y = token)
    let by = b.op("gpu.block_id y");
    let by = b.idx64(&by);
    let (t, myslot) = if gate_up {
        let ck = b.ci64(top_k as i64);
        (b.op(&format!("arith.divui {by}, {ck} : i64")), Some(b.op(&format!("arith.remui {by}, {ck} : i64"))))
    } else {
        (by, None)
    };
    let (o, lane) = b.open_guarded_warp_output(MOE_WARPS);
    let ce = b.ci64(e as i64);
    let rbase = b.op(&format!("arith.muli {t}, {ce} : i64"));
    let hrow = b.ci64((top_k * inter) as i64);
    let hbase = b.op(&format!("arith.muli {t}, {hrow} : i64"));
    let (cd, ci) = (b.ci64(d as i64), b.ci64(inter as i64));
    let xoff = b.op(&format!("arith.muli {t}, {cd} : i64"));
    let zero = b.cf32(0.0);
    let z32 = b.op("arith.constant 0 : i32");
    let c1 = b.ci64(1);
    let mut slot = b.ci64(0);
    let mut acc = zero.clone();
    let last = b.ci64(e as i64 - 1);
    for c in 0..e.div_ceil(32) {
        let (cc, _, bal) = chosen_ballot(b, c, &lane, &rbase, &last, &ce, &zero);
        // over the set bits, lowest first (expert order)
        let (res, m_in, s_in, a_in) = (b.v(), b.v(), b.v(), b.v());
        b.line(&format!("{res}:3 = scf.while ({m_in} = {bal}, {s_in} = {slot}, {a_in} = {acc}) : (i32, i64, f32) -> (i32, i64, f32) {{"));
        let more = b.op(&format!("arith.cmpi ne, {m_in}, {z32} : i32"));
        b.line(&format!("scf.condition({more}) {m_in}, {s_in}, {a_in} : i32, i64, f32"));
        b.line("} do {");
        let (m, s, a) = (b.v(), b.v(), b.v());
        b.line(&format!("^bb0({m}: i32, {s}: i64, {a}: f32):"));
        let (low, bit) = b.lowest_bit(&m);
        let ex = b.op(&format!("arith.addi {cc}, {bit} : i64"));
        let a_next = if let Some(ms) = &myslot {
            // h[t, slot, o] = silu(gate_e[o] . x) * (up_e[o] . x), for this block's slot
            let mine = b.op(&format!("arith.cmpi eq, {s}, {ms} : i64"));
            b.line(&format!("scf.if {mine} {{"));
            let row = b.op(&format!("arith.muli {ex}, {ci} : i64"));
            let row = b.op(&format!("arith.addi {row}, {o} : i64"));
            let woff = b.op(&format!("arith.muli {row}, {cd} : i64"));
            let g = b.lane_dot("%wg", &woff, wdtype, "%x", &xoff, d, &lane)?;
            let u = b.lane_dot("%wu", &woff, wdtype, "%x", &xoff, d, &lane)?;
            let [g, u] = [g, u].map(|v| b.warp_sum(&v));
            let sg = b.sigmoid(&g);
            let sg = b.op(&format!("arith.mulf {g}, {sg} : f32"));
            let hv = b.op(&format!("arith.mulf {sg}, {u} : f32"));
            let c0 = b.ci64(0);
            let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : i64"));
            b.line(&format!("scf.if {l0} {{"));
            let so = b.op(&format!("arith.muli {s}, {ci} : i64"));
            let hi = b.op(&format!("arith.addi {hbase}, {so} : i64"));
            let hi = b.op(&format!("arith.addi {hi}, {o} : i64"));
            b.store(&hv, "%h", &hi);
            b.line("}");
            b.line("}");
            a.clone()
        } else {
            // y[t, o] += route[t, e] * (down_e[o] . h[t, slot])
            let at = b.op(&format!("arith.addi {rbase}, {ex} : i64"));
            let w = b.load("%route", &at);
            let row = b.op(&format!("arith.muli {ex}, {cd} : i64"));
            let row = b.op(&format!("arith.addi {row}, {o} : i64"));
            let woff = b.op(&format!("arith.muli {row}, {ci} : i64"));
            let so = b.op(&format!("arith.muli {s}, {ci} : i64"));
            let hoff = b.op(&format!("arith.addi {hbase}, {so} : i64"));
            let dv = b.lane_dot("%wd", &woff, wdtype, "%h", &hoff, inter, &lane)?;
            let dv = b.warp_sum(&dv);
            let p = b.op(&format!("arith.mulf {dv}, {w} : f32"));
            b.op(&format!("arith.addf {a}, {p} : f32"))
        };
        let m2 = b.op(&format!("arith.xori {m}, {low} : i32"));
        let s2 = b.op(&format!("arith.addi {s}, {c1} : i64"));
        b.line(&format!("scf.yield {m2}, {s2}, {a_next} : i32, i64, f32"));
        b.line("}");
        slot = format!("{res}#1");
        acc = format!("{res}#2");
    }
    if !gate_up {
        let c0 = b.ci64(0);
        let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : i64"));
        b.line(&format!("scf.if {l0} {{"));
        let yi = b.op(&format!("arith.addi {xoff}, {o} : i64"));
        b.store(&acc, "%y", &yi);
        b.line("}");
    }
    b.line("}");
    Ok(())
}

/// [`KernelSpec::MoeGateUpGrouped`]: warp (expert e = block y, row i); the tokens that chose
/// e found by ballots over the routing column; if any, the warp's gate and up rows loaded once
/// into registers and applied to each such token's x, h stored at the token's slot of e (the
/// chosen experts of the token below e, counted by ballots over its routing row).
fn emit_gate_up_grouped(b: &mut Body, d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType) -> Result<(), String> {
    let ex = b.op("gpu.block_id y");
    let ex = b.idx64(&ex);
    let (o, lane) = b.open_guarded_warp_output(MOE_WARPS);
    let (ce, cd, ci) = (b.ci64(e as i64), b.ci64(d as i64), b.ci64(inter as i64));
    let zero = b.cf32(0.0);
    let rows_i = b.op("arith.index_cast %rows : i64 to index");
    let (c0i, c32i) = (b.op("arith.constant 0 : index"), b.op("arith.constant 32 : index"));
    let rlast = b.ci64(-1);
    let rlast = b.op(&format!("arith.addi %rows, {rlast} : i64"));
    // the ballot of the tokens tc.. tc+31 that chose e
    let chose = |b: &mut Body, tc: &str| -> String {
        let t = b.op(&format!("arith.addi {tc}, {lane} : i64"));
        let inr = b.op(&format!("arith.cmpi slt, {t}, %rows : i64"));
        let tcl = b.op(&format!("arith.minsi {t}, {rlast} : i64"));
        let at = b.op(&format!("arith.muli {tcl}, {ce} : i64"));
        let at = b.op(&format!("arith.addi {at}, {ex} : i64"));
        let r = b.load("%route", &at);
        let nz = b.op(&format!("arith.cmpf une, {r}, {zero} : f32"));
        let nz = b.op(&format!("arith.andi {nz}, {inr} : i1"));
        b.ballot(&nz)
    };
    // any token at all? (then the rows are worth loading)
    let (anyr, tc, acc) = (b.v(), b.v(), b.v());
    let z32 = b.op("arith.constant 0 : i32");
    b.line(&format!("{anyr} = scf.for {tc} = {c0i} to {rows_i} step {c32i} iter_args({acc} = {z32}) -> (i32) {{"));
    let tc64 = b.idx64(&tc);
    let bal = chose(b, &tc64);
    let acc2 = b.op(&format!("arith.ori {acc}, {bal} : i32"));
    b.line(&format!("scf.yield {acc2} : i32"));
    b.line("}");
    let any = b.op(&format!("arith.cmpi ne, {anyr}, {z32} : i32"));
    b.line(&format!("scf.if {any} {{"));
    // the warp's gate and up rows: lane holds 8-element chunks lane + 32 r
    let rounds = d / 256;
    let row = b.op(&format!("arith.muli {ex}, {ci} : i64"));
    let row = b.op(&format!("arith.addi {row}, {o} : i64"));
    let woff = b.op(&format!("arith.muli {row}, {cd} : i64"));
    let c8 = b.ci64(8);
    let c2 = b.ci64(2);
    let c4 = b.ci64(4);
    let mut chunk_el = vec![];
    let (mut gw, mut uw) = (vec![], vec![]);
    for r in 0..rounds {
        let cr = b.ci64(32 * r as i64);
        let c = b.op(&format!("arith.addi {lane}, {cr} : i64"));
        let el = b.op(&format!("arith.muli {c}, {c8} : i64"));
        let we = b.op(&format!("arith.addi {woff}, {el} : i64"));
        let wb = b.op(&format!("arith.muli {we}, {c2} : i64"));
        gw.push(b.load_vec("%wg", &wb, 4, "i32", 16));
        uw.push(b.load_vec("%wu", &wb, 4, "i32", 16));
        chunk_el.push(el);
    }
    let gs: Vec<Vec<String>> = gw.iter().map(|w| b.half_words(w, wdtype)).collect();
    let us: Vec<Vec<String>> = uw.iter().map(|w| b.half_words(w, wdtype)).collect();
    let tc2 = b.v();
    b.line(&format!("scf.for {tc2} = {c0i} to {rows_i} step {c32i} {{"));
    let tcb = b.idx64(&tc2);
    let bal = chose(b, &tcb);
    let (res, m_in) = (b.v(), b.v());
    b.line(&format!("{res} = scf.while ({m_in} = {bal}) : (i32) -> i32 {{"));
    let more = b.op(&format!("arith.cmpi ne, {m_in}, {z32} : i32"));
    b.line(&format!("scf.condition({more}) {m_in} : i32"));
    b.line("} do {");
    let m = b.v();
    b.line(&format!("^bb0({m}: i32):"));
    let (low, bit) = b.lowest_bit(&m);
    let t = b.op(&format!("arith.addi {tcb}, {bit} : i64"));
    // g and u for token t
    let xrow = b.op(&format!("arith.muli {t}, {cd} : i64"));
    let (mut gp, mut up) = (zero.clone(), zero.clone());
    for (r, el) in chunk_el.iter().enumerate() {
        let xe = b.op(&format!("arith.addi {xrow}, {el} : i64"));
        let xb = b.op(&format!("arith.muli {xe}, {c4} : i64"));
        let xs = b.load_f32s("%x", &xb, 8);
        for (k, xv) in xs.iter().enumerate() {
            gp = b.op(&format!("llvm.intr.fma({}, {xv}, {gp}) : (f32, f32, f32) -> f32", gs[r][k]));
            up = b.op(&format!("llvm.intr.fma({}, {xv}, {up}) : (f32, f32, f32) -> f32", us[r][k]));
        }
    }
    let g = b.warp_sum(&gp);
    let u = b.warp_sum(&up);
    let sg = b.sigmoid(&g);
    let sg = b.op(&format!("arith.mulf {g}, {sg} : f32"));
    let hv = b.op(&format!("arith.mulf {sg}, {u} : f32"));
    // the token's slot of e: its chosen experts below e
    let rb = b.op(&format!("arith.muli {t}, {ce} : i64"));
    let last = b.ci64(e as i64 - 1);
    let mut slot = b.op("arith.constant 0 : i32");
    for c in 0..e.div_ceil(32) {
        let cc = b.ci64(32 * c as i64);
        let idx = b.op(&format!("arith.addi {lane}, {cc} : i64"));
        let below = b.op(&format!("arith.cmpi slt, {idx}, {ex} : i64"));
        let idc = b.op(&format!("arith.minsi {idx}, {last} : i64"));
        let at = b.op(&format!("arith.addi {rb}, {idc} : i64"));
        let rv = b.load("%route", &at);
        let nz = b.op(&format!("arith.cmpf une, {rv}, {zero} : f32"));
        let nz = b.op(&format!("arith.andi {nz}, {below} : i1"));
        let bl = b.ballot(&nz);
        let n = b.popc(&bl);
        slot = b.op(&format!("arith.addi {slot}, {n} : i32"));
    }
    let slot = b.op(&format!("arith.extui {slot} : i32 to i64"));
    let c0 = b.ci64(0);
    let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : i64"));
    let ctk = b.ci64(top_k as i64);
    let fits = b.op(&format!("arith.cmpi slt, {slot}, {ctk} : i64"));
    let w = b.op(&format!("arith.andi {l0}, {fits} : i1"));
    b.line(&format!("scf.if {w} {{"));
    let hi = b.op(&format!("arith.muli {t}, {ctk} : i64"));
    let hi = b.op(&format!("arith.addi {hi}, {slot} : i64"));
    let hi = b.op(&format!("arith.muli {hi}, {ci} : i64"));
    let hi = b.op(&format!("arith.addi {hi}, {o} : i64"));
    b.store(&hv, "%h", &hi);
    b.line("}");
    let m2 = b.op(&format!("arith.xori {m}, {low} : i32"));
    b.line(&format!("scf.yield {m2} : i32"));
    b.line("}");
    b.line("}");
    b.line("}");
    b.line("}");
    Ok(())
}

/// The lowering of `moe_route` (operands logits [T, E], mask [E], V3's bias [E]): a step of
/// [`KernelSpec::MoeRoute`], a warp per token.
pub(crate) fn lower_moe_route(cx: &NodeCx, args: Vec<String>, r: &MoeRouting) -> Result<Step, CodegenError> {
    let e = cx.ops[0].ty.shape[1].as_const().ok_or_else(|| cx.err("the router needs a constant expert count"))?;
    for o in cx.ops {
        if o.ty.dtype != DType::F32 {
            return Err(cx.err(format!("the router takes f32 logits, mask and bias; {} is {}", o.name, o.ty)));
        }
    }
    let spec =
        KernelSpec::MoeRoute { e, top_k: r.top_k, n_group: r.n_group, topk_group: r.topk_group, scoring: r.scoring, select: r.select, normalize: r.normalize, scaling_bits: r.scaling.to_bits() };
    moe_fits(&spec).map_err(|m| cx.err(m))?;
    let rows = Scalar::Rows(cx.names[0].clone());
    Ok(cx.step(spec, args, vec![rows.clone()], rows, Scalar::Const(1)))
}

/// The lowering of `moe_experts` (operands x [T, D], route [T, E], gate/up [E, I, D], down
/// [E, D, I], stacked weights): two steps, the gate/up kernel into the scratch
/// `{node}@rows{top_k·I}` and the down projection into the node. `top_k` is the router's (the
/// most nonzero weights a routing row holds).
pub(crate) fn lower_moe_experts(cx: &NodeCx, top_k: usize) -> Result<(Step, Step), CodegenError> {
    let c = |i: usize, j: usize| cx.ops[i].ty.shape[j].as_const();
    let (Some(d), Some(e), Some(inter)) = (c(0, 1), c(1, 1), c(2, 1)) else {
        return Err(cx.err("the routed experts need constant dims"));
    };
    let wdtype = cx.ops[2].ty.dtype;
    if cx.ops[3].ty.dtype != wdtype || cx.ops[4].ty.dtype != wdtype {
        return Err(cx.err("the routed experts' gate, up and down stacks must share one dtype"));
    }
    if cx.ops[0].ty.dtype != DType::F32 || cx.ops[1].ty.dtype != DType::F32 {
        return Err(cx.err("the routed experts take f32 activations and routing weights"));
    }
    for w in &cx.ops[2..5] {
        if !matches!(w.op, dsc_ir::Op::Weight) {
            return Err(cx.err("the routed experts' weights must be graph weights"));
        }
    }
    let up = KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype };
    let down = KernelSpec::MoeDown { d, inter, e, top_k, wdtype };
    for s in [&up, &down] {
        moe_fits(s).map_err(|m| cx.err(m))?;
    }
    let h = format!("{}@rows{}", cx.name, top_k * inter);
    let n = cx.names;
    let tokens = Scalar::Dim(cx.names[0].clone(), 0);
    // (gate/up: grid y = tokens x top_k, a block row per chosen expert)
    let mut first = Step {
        node: h.clone(),
        ..cx.step(
            up,
            vec![n[0].clone(), n[1].clone(), n[2].clone(), n[3].clone(), h.clone()],
            vec![Scalar::Const(inter as i64)],
            Scalar::Const(inter as i64),
            Scalar::RowsTimes(n[0].clone(), top_k as i64),
        )
    };
    // (batches: expert-major, each chosen expert's rows read once for all its tokens)
    let grouped = KernelSpec::MoeGateUpGrouped { d, inter, e, top_k, wdtype };
    if moe_fits(&grouped).is_ok() {
        first.few = vec![crate::schedule::Large {
            min_rows: GROUPED_MIN_ROWS,
            max_rows: None,
            args: None,
            kernel: grouped,
            scalars: vec![Scalar::Const(inter as i64), Scalar::Rows(n[0].clone())],
            work: Scalar::Const(inter as i64),
            grid_y: Scalar::Const(e as i64),
        }];
    }
    let second = cx.step(down, vec![h, n[1].clone(), n[4].clone(), cx.name.to_string()], vec![Scalar::Const(d as i64)], Scalar::Const(d as i64), tokens);
    Ok((first, second))
}
