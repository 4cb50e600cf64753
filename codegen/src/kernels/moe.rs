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
//!   `{node}@rows{top_k·I}`, then [`KernelSpec::MoeDown`] (a block per (token, 2 outputs n), a
//!   warp per chosen expert, so all of them stream at once: y[t, n] = Σ over the chosen
//!   experts, in expert order, of route[t, e] · (down_e[n] · h[t, slot]), the sum in shared
//!   memory). The chosen experts are found from the dense routing row by warp ballots.
//!   From [`GROUPED_MIN_ROWS`] tokens (16-bit weights) both run expert-major on the tensor
//!   cores instead ([`KernelSpec::MoeGateUpMma`], [`KernelSpec::MoeDownMma`]: a block per (16
//!   weight rows, expert), the tokens that chose the expert gathered 32 at a time from the
//!   routing column as the B tiles of the `mma.sync` GEMV ([`MmaTiles`]), so each chosen
//!   expert's weights are read once per 32 of its tokens — the grouped GEMM over tokens
//!   permuted by expert, the permutation found by each block from the routing weights rather
//!   than a separate launch), the down projection into route-weighted partials per slot
//!   (`{node}@splitk{top_k}`, part-major) that [`KernelSpec::MoeCombine`] sums per token in
//!   expert order.
//! - One-token fusions, off until a GPU run measures them (`scripts/gpu-deepseek-b1.sh`):
//!   [`KernelSpec::MoeRouteGemv`] (the router GEMV whose last block per token routes it —
//!   blocks fence their logits and count on `{route}@sync`; `moe-router`, with the layer's
//!   RMSNorm folded in as `NormMatMul` there and over `MoeGateUp`), and the shared slots first
//!   (`shared_first`, [`shared_first`]) where the attention prefetches their weights into L2.

use crate::kernels::*;
use crate::schedule::{NodeCx, Scalar, Step};
use crate::CodegenError;
use dsc_ir::{MoeRouting, MoeScoring, MoeSelect};

/// Warps per block of the routed-expert kernels (a warp per output).
pub const MOE_WARPS: u32 = 8;

/// The readable symbol of a `moe` kernel (`KernelSpec::symbol`).
pub(crate) fn moe_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::MoeRoute { e, top_k, n_group, topk_group, scoring, select, normalize, scaling_bits, count } => {
            let sc = match scoring {
                MoeScoring::Softmax => "softmax",
                MoeScoring::Sigmoid => "sigmoid",
            };
            let sel = match select {
                MoeSelect::Greedy => "greedy",
                MoeSelect::GroupMax => "groupmax",
                MoeSelect::NoauxTc => "noauxtc",
            };
            format!("moe_route_e{e}_k{top_k}_g{n_group}x{topk_group}_{sc}_{sel}{}_s{scaling_bits:08x}{}", if *normalize { "_norm" } else { "" }, if *count { "_count" } else { "" })
        }
        KernelSpec::MoeRouteGemv { gemv, route } => format!("{}_{}", gemv.symbol(), route.symbol()),
        KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared, shared_first } => format!("moe_gate_up_e{e}_k{top_k}{}_d{d}_i{inter}_{wdtype}", shared_tag(*shared, *shared_first)),
        KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual, shared, shared_first } => {
            format!("moe_down_e{e}_k{top_k}{}_d{d}_i{inter}_{wdtype}{}", shared_tag(*shared, *shared_first), if *residual { "_res" } else { "" })
        }
        KernelSpec::MoeGateUpMma { d, inter, e, top_k, wdtype } => format!("moe_gate_up_mma_e{e}_k{top_k}_d{d}_i{inter}_{wdtype}"),
        KernelSpec::MoeDownMma { d, inter, e, top_k, wdtype } => format!("moe_down_mma_e{e}_k{top_k}_d{d}_i{inter}_{wdtype}"),
        KernelSpec::MoeCombine { d, e, top_k, residual } => format!("moe_combine_e{e}_k{top_k}_d{d}{}", if *residual { "_res" } else { "" }),
        other => unreachable!("{other:?} is not a moe kernel (kernels::family)"),
    }
}

/// `_s{n}` for `n` shared-expert slots after the routed ones, `_s{n}f` before them (none for 0).
fn shared_tag(n: usize, first: bool) -> String {
    if n > 0 {
        format!("_s{n}{}", if first { "f" } else { "" })
    } else {
        String::new()
    }
}

/// How the runtime launches a `moe` kernel (`KernelSpec::launch`): the router a warp per
/// token (4 per block), the expert kernels a warp per output, grid y = tokens.
pub(crate) fn moe_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::MoeRoute { .. } => Launch::WarpPerRow { rows_per_block: 4 },
        KernelSpec::MoeRouteGemv { gemv, .. } => gemv.launch(),
        KernelSpec::MoeGateUp { d, inter, wdtype, .. } if gate_up_gemv(*d, *inter, *wdtype) => KernelSpec::SwiGluGemv { k: *d, f: *inter, wdtype: *wdtype }.launch(),
        KernelSpec::MoeGateUp { .. } => Launch::WarpPerOutput { warps_per_block: MOE_WARPS },
        // (a warp per chosen expert)
        KernelSpec::MoeDown { top_k, shared, .. } => Launch::OutputsPerBlock { outputs: MOE_DOWN_OUTPUTS as u32, rows: 1, warps: (top_k + shared) as u32 },
        // (grid y = E: `rows` 1)
        KernelSpec::MoeGateUpMma { .. } | KernelSpec::MoeDownMma { .. } => Launch::OutputsPerBlock { outputs: 16, rows: 1, warps: MOE_MMA_WARPS as u32 },
        KernelSpec::MoeCombine { .. } => Launch::BlockPerRow { warps: MOE_COMBINE_WARPS as u32 },
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
        KernelSpec::MoeRouteGemv { gemv, route } => {
            moe_fits(route)?;
            crate::kernels::fits_in(gemv, Outer::default())?;
            // (the GEMV, or it with the norm prologue)
            let core = match gemv.as_ref() {
                KernelSpec::NormMatMul { inner, .. } => inner.as_ref(),
                other => other,
            };
            match (core, route.as_ref()) {
                (KernelSpec::MatMul { n, wdtype: DType::BF16 | DType::F16 | DType::F32, bias: false, residual: false, .. }, KernelSpec::MoeRoute { e, .. }) if n == e => Ok(()),
                _ => Err(format!("the folded router is a bias-less 16/32-bit GEMV of E outputs and the router ({} with {})", gemv.symbol(), route.symbol())),
            }
        }
        KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared, .. } | KernelSpec::MoeDown { d, inter, e, top_k, wdtype, shared, .. } => {
            // (the shared slots: 16-bit weights, the gate/up as the SwiGLU GEMV; at most 32
            // warps a down-projection block)
            if *shared > 0 && (!gate_up_gemv(*d, *inter, *wdtype) || top_k + shared > 32) {
                return Err(format!("shared-expert slots take 16-bit weights the SwiGLU GEMV fits and top_k + shared <= 32 (D {d}, I {inter}, {wdtype}, top_k {top_k}, {shared} shared)"));
            }
            // (fp8 experts in f8g128 — DeepSeek-V3's FP8 release as imported — where D and I are
            // whole 512-value super-blocks: the warp-per-output kernel, eight values a load)
            let f8 = *wdtype == DType::F8G128 && d % 512 == 0 && inter % 512 == 0;
            if !matches!(wdtype, DType::F32 | DType::BF16 | DType::F16) && !f8 {
                return Err(format!("the routed experts take f32/bf16/f16 weights, or f8g128 with D and I multiples of 512, not {wdtype} (D {d}, I {inter})"));
            }
            if *d == 0 || *inter == 0 || *e == 0 || *top_k == 0 || top_k > e {
                return Err(format!("empty routed experts (D {d}, I {inter}, E {e}, top_k {top_k})"));
            }
            Ok(())
        }
        KernelSpec::MoeGateUpMma { d, inter, e, top_k, wdtype } | KernelSpec::MoeDownMma { d, inter, e, top_k, wdtype } => {
            moe_fits(&KernelSpec::MoeGateUp { d: *d, inter: *inter, e: *e, top_k: *top_k, wdtype: *wdtype, shared: 0, shared_first: false })?;
            if !matches!(wdtype, DType::BF16 | DType::F16) || d % 32 != 0 || inter % 32 != 0 {
                return Err(format!("the grouped tensor-core experts take 16-bit weights and D, I multiples of 32 (D {d}, I {inter}, {wdtype})"));
            }
            Ok(())
        }
        KernelSpec::MoeCombine { d, e, top_k, .. } => {
            if *d == 0 || *e == 0 || *top_k == 0 || top_k > e {
                return Err(format!("empty routed-expert combine (D {d}, E {e}, top_k {top_k})"));
            }
            Ok(())
        }
        other => Err(format!("`{}` is not a moe kernel", other.symbol())),
    }
}

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

/// The `slot`-th (i32, warp-uniform) chosen expert of the routing row at `rbase`, in expert
/// order: per 32-expert chunk a ballot of the nonzero routing weights, and the lane whose set
/// bits below it number slot − (the chunks' count so far) holds it. Returns (whether the row
/// chose more than `slot` experts, the expert — 0 where it did not). `lane` is the lane (i64).
fn slot_expert(b: &mut Body, e: usize, lane: &str, rbase: &str, slot: &str) -> (String, String) {
    let lane32 = b.op(&format!("arith.trunci {lane} : i64 to i32"));
    let one = b.op("arith.constant 1 : i32");
    let below = b.op(&format!("arith.shli {one}, {lane32} : i32"));
    let below = b.op(&format!("arith.subi {below}, {one} : i32"));
    let ce = b.ci64(e as i64);
    let last = b.ci64(e as i64 - 1);
    let zero = b.cf32(0.0);
    let z32 = b.op("arith.constant 0 : i32");
    let mut count = z32.clone();
    let mut expert = b.ci64(0);
    let mut found = b.op("arith.constant false");
    for c in 0..e.div_ceil(32) {
        let (cc, nz, bal) = chosen_ballot(b, c, lane, rbase, &last, &ce, &zero);
        let under = b.op(&format!("arith.andi {bal}, {below} : i32"));
        let under = b.popc(&under);
        let under = b.op(&format!("arith.addi {under}, {count} : i32"));
        let is = b.op(&format!("arith.cmpi eq, {under}, {slot} : i32"));
        let is = b.op(&format!("arith.andi {is}, {nz} : i1"));
        let hit = b.ballot(&is);
        let here = b.op(&format!("arith.cmpi ne, {hit}, {z32} : i32"));
        let (_, bit) = b.lowest_bit(&hit);
        let ex = b.op(&format!("arith.addi {cc}, {bit} : i64"));
        expert = b.op(&format!("arith.select {here}, {ex}, {expert} : i64"));
        found = b.op(&format!("arith.ori {found}, {here} : i1"));
        let pc = b.popc(&bal);
        count = b.op(&format!("arith.addi {count}, {pc} : i32"));
    }
    (found, expert)
}

/// A token's slots with `shared` > 0 and `shared_first` (`schedule::fuse_moe_shared` under
/// `prefetch_shared_experts`): the shared experts' chunks first (slots 0..shared), then its
/// chosen experts in expert order — so the blocks that read the shared weights, which the
/// attention before prefetched into L2, are the first of the grid to run. Returns (slot <
/// shared; the routed slot number: slot − shared, clamped at 0) for an i64 slot; without
/// `shared_first` (the shared slots after the routed ones) (None, slot).
fn shared_first(b: &mut Body, slot: &str, shared: usize, first: bool) -> (Option<String>, String) {
    if shared == 0 || !first {
        return (None, slot.to_string());
    }
    let cs = b.ci64(shared as i64);
    let is = b.op(&format!("arith.cmpi ult, {slot}, {cs} : i64"));
    let r = b.op(&format!("arith.subi {slot}, {cs} : i64"));
    let z = b.ci64(0);
    let r = b.op(&format!("arith.select {is}, {z}, {r} : i64"));
    (Some(is), r)
}

/// Whether the routed experts' gate/up ([`KernelSpec::MoeGateUp`]) runs as the decode SwiGLU
/// GEMV (`emit_gemv`: a block per (token, slot, tile of hidden units), its warps splitting D,
/// x loaded once per block for all its gate and up rows) on the slot's expert's rows; else a
/// warp per (token, slot, hidden unit) (`emit_gate_up`: any D, f32 or fp8 weights). The GEMV's
/// launch is the dense SwiGLU GEMV's, whose tiling must agree for I and 2·I.
pub(crate) fn gate_up_gemv(d: usize, inter: usize, wdtype: DType) -> bool {
    matches!(wdtype, DType::BF16 | DType::F16)
        && swiglu_fits(d, inter, wdtype).is_ok()
        && gemv_body_fits(d, inter, wdtype, 1, Outer::default(), true).is_ok()
        && gemv_tiling(d, inter, 1) == gemv_tiling(d, 2 * inter, 1)
}

/// [`KernelSpec::MoeGateUp`] as the SwiGLU GEMV: after `griddepcontrol.wait` (the routing row
/// is the previous kernel's output), block row y = token · slots + slot (slots = top_k +
/// shared) finds the slot-th chosen expert of its token ([`slot_expert`]), points `%w0` /
/// `%w1` at its gate and up rows — a shared slot at its chunk of `%sg` / `%su` —, and runs the
/// dense SwiGLU GEMV with x row = y / slots into h row y.
#[allow(clippy::too_many_arguments)]
fn emit_gate_up_gemv(b: &mut Body, d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType, shared: usize, first: bool) -> Result<(), String> {
    if b.pdl {
        b.wait_for_previous();
    }
    let slots = top_k + shared;
    let by = b.op("gpu.block_id y");
    let by = b.idx64(&by);
    let ck = b.ci64(slots as i64);
    let t = b.op(&format!("arith.divui {by}, {ck} : i64"));
    let slot64 = b.op(&format!("arith.remui {by}, {ck} : i64"));
    // (with the shared slots first, [`shared_first`], slot − shared is the routed one)
    let (first_is, routed) = shared_first(b, &slot64, shared, first);
    let slot = b.op(&format!("arith.trunci {routed} : i64 to i32"));
    let tid = b.op("gpu.thread_id x");
    let tid = b.idx64(&tid);
    let c31 = b.ci64(31);
    let lane = b.op(&format!("arith.andi {tid}, {c31} : i64"));
    let ce = b.ci64(e as i64);
    let rbase = b.op(&format!("arith.muli {t}, {ce} : i64"));
    // (expert 0 where the row chose fewer — that slot's h row is never read)
    let (_, expert) = slot_expert(b, e, &lane, &rbase, &slot);
    let stride = b.ci64((inter * d * wdtype.block().1) as i64);
    let off = b.op(&format!("arith.muli {expert}, {stride} : i64"));
    if shared > 0 {
        // (a shared slot: chunk slot (shared first) or slot - top_k, I rows of [shared · I, D])
        let (is_shared, chunk) = match first_is {
            Some(is) => (is, slot64.clone()),
            None => {
                let ck = b.ci64(top_k as i64);
                let is = b.op(&format!("arith.cmpi uge, {slot64}, {ck} : i64"));
                (is, b.op(&format!("arith.subi {slot64}, {ck} : i64")))
            }
        };
        let chunk = b.op(&format!("arith.select {is_shared}, {chunk}, {expert} : i64"));
        let off = b.op(&format!("arith.muli {chunk}, {stride} : i64"));
        let g = b.op(&format!("llvm.select {is_shared}, %sg, %wg : i1, !llvm.ptr<1>"));
        let u = b.op(&format!("llvm.select {is_shared}, %su, %wu : i1, !llvm.ptr<1>"));
        b.line(&format!("%w0 = llvm.getelementptr {g}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        b.line(&format!("%w1 = llvm.getelementptr {u}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    } else {
        b.line(&format!("%w0 = llvm.getelementptr %wg[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        b.line(&format!("%w1 = llvm.getelementptr %wu[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    }
    b.x_row_div = Some(slots);
    b.swiglu = true;
    emit_gemv(b, d, inter, wdtype, false, false, 1)
}

/// Fewest tokens from which the routed experts run expert-major on the tensor cores
/// ([`KernelSpec::MoeGateUpMma`], [`KernelSpec::MoeDownMma`], [`KernelSpec::MoeCombine`]:
/// each chosen expert's weights read once per 32 of its tokens) instead of per (token,
/// chosen expert). Measured on the H200 (V2-Lite shape, tok/s, per-token / expert-major):
/// b8 1,231 / 1,117, b16 1,409 / 1,752, b24 1,468 / 2,276.
pub const GROUPED_MIN_ROWS: i64 = 16;

/// The `moe` kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn moe_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    moe_fits(spec)?;
    match spec {
        KernelSpec::MoeRoute { e, top_k, n_group, topk_group, scoring, select, normalize, scaling_bits, count } => {
            emit_route(b, *e, *top_k, *n_group, *topk_group, *scoring, *select, *normalize, f32::from_bits(*scaling_bits), *count);
            Ok(format!(
                "%logits: !llvm.ptr<1>, %mask: !llvm.ptr<1>, {}{}%y: !llvm.ptr<1>, %n: i64",
                if *select == MoeSelect::NoauxTc { "%bias: !llvm.ptr<1>, " } else { "" },
                if *count { "%counts: !llvm.ptr<1>, " } else { "" }
            ))
        }
        KernelSpec::MoeRouteGemv { gemv, route } => {
            let KernelSpec::MoeRoute { e, top_k, n_group, topk_group, scoring, select, normalize, scaling_bits, count } = route.as_ref() else {
                return Err("the folded router wraps a MoeRoute".into());
            };
            let gp = crate::kernels::emit_into(b, gemv)?;
            last_block_routes(b, *e, *top_k, *n_group, *topk_group, *scoring, *select, *normalize, f32::from_bits(*scaling_bits), *count);
            // (the route's pointers after the GEMV's, before its scalars)
            let ptrs = format!(
                "%mask: !llvm.ptr<1>, {}{}%sync: !llvm.ptr<1>, %ry: !llvm.ptr<1>",
                if *select == MoeSelect::NoauxTc { "%bias: !llvm.ptr<1>, " } else { "" },
                if *count { "%counts: !llvm.ptr<1>, " } else { "" }
            );
            let at = gp.find(": i64").and_then(|i| gp[..i].rfind(", ")).ok_or("the router GEMV has scalar params")?;
            Ok(format!("{}, {ptrs}{}", &gp[..at], &gp[at..]))
        }
        KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared, shared_first } if gate_up_gemv(*d, *inter, *wdtype) => {
            emit_gate_up_gemv(b, *d, *inter, *e, *top_k, *wdtype, *shared, *shared_first)?;
            Ok(format!(
                "%x: !llvm.ptr<1>, %route: !llvm.ptr<1>, %wg: !llvm.ptr<1>, %wu: !llvm.ptr<1>, {}%y: !llvm.ptr<1>, %n: i64",
                if *shared > 0 { "%sg: !llvm.ptr<1>, %su: !llvm.ptr<1>, " } else { "" }
            ))
        }
        KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, .. } => {
            emit_gate_up(b, *d, *inter, *e, *top_k, *wdtype)?;
            Ok("%x: !llvm.ptr<1>, %route: !llvm.ptr<1>, %wg: !llvm.ptr<1>, %wu: !llvm.ptr<1>, %h: !llvm.ptr<1>, %n: i64".into())
        }
        KernelSpec::MoeGateUpMma { d, inter, e, top_k, wdtype } => {
            emit_moe_mma(b, true, *d, *inter, *e, *top_k, *wdtype)?;
            Ok("%x: !llvm.ptr<1>, %route: !llvm.ptr<1>, %wg: !llvm.ptr<1>, %wu: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %m: i64".into())
        }
        KernelSpec::MoeDownMma { d, inter, e, top_k, wdtype } => {
            emit_moe_mma(b, false, *d, *inter, *e, *top_k, *wdtype)?;
            Ok("%x: !llvm.ptr<1>, %route: !llvm.ptr<1>, %w: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %m: i64".into())
        }
        KernelSpec::MoeCombine { d, e, top_k, residual } => {
            emit_moe_combine(b, *d, *e, *top_k, *residual);
            Ok(format!("%p: !llvm.ptr<1>, %route: !llvm.ptr<1>, {}%y: !llvm.ptr<1>, %n: i64", if *residual { "%res: !llvm.ptr<1>, " } else { "" }))
        }
        KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual, shared, shared_first } => {
            emit_down(b, *d, *inter, *e, *top_k, *wdtype, *residual, *shared, *shared_first)?;
            Ok(format!(
                "%h: !llvm.ptr<1>, %route: !llvm.ptr<1>, %wd: !llvm.ptr<1>, {}{}%y: !llvm.ptr<1>, %n: i64",
                if *shared > 0 { "%sd: !llvm.ptr<1>, " } else { "" },
                if *residual { "%res: !llvm.ptr<1>, " } else { "" }
            ))
        }
        other => Err(format!("`{}` is not a moe kernel", other.symbol())),
    }
}

/// The router (see the file header). `%n` = tokens.
#[allow(clippy::too_many_arguments)]
fn emit_route(b: &mut Body, e: usize, top_k: usize, n_group: usize, topk_group: usize, scoring: MoeScoring, select: MoeSelect, normalize: bool, scaling: f32, count: bool) {
    let (row, lane) = b.open_guarded_warp_row();
    route_row(b, &row, &lane, "%logits", "%y", e, top_k, n_group, topk_group, scoring, select, normalize, scaling, count);
    b.line("}");
}

/// [`KernelSpec::MoeRouteGemv`]'s epilogue, after the GEMV wrote its logits: each block fences
/// its stores and counts itself on token (block y)'s `%sync` counter; in the block that counts
/// last (the grid's x blocks of the row), warp 0 fences again, routes the token from the
/// logits row `%y` into `%ry` and zeroes the counter for the next step.
#[allow(clippy::too_many_arguments)]
fn last_block_routes(b: &mut Body, e: usize, top_k: usize, n_group: usize, topk_group: usize, scoring: MoeScoring, select: MoeSelect, normalize: bool, scaling: f32, count: bool) {
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"~{memory}\" : () -> ()");
    b.line("gpu.barrier");
    let t = b.op("gpu.block_id y");
    let t = b.idx64(&t);
    let tid = b.op("gpu.thread_id x");
    let (lane_i, warp_i) = b.lane_warp(&tid);
    let lane = b.idx64(&lane_i);
    let zi = b.op("arith.constant 0 : index");
    let w0 = b.op(&format!("arith.cmpi eq, {warp_i}, {zi} : index"));
    b.line(&format!("scf.if {w0} {{"));
    let l0 = b.op(&format!("arith.cmpi eq, {lane_i}, {zi} : index"));
    let c4 = b.ci64(4);
    let off = b.op(&format!("arith.muli {t}, {c4} : i64"));
    let ctr = b.op(&format!("llvm.getelementptr %sync[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    let old = b.v();
    b.line(&format!("{old} = scf.if {l0} -> (i32) {{"));
    let got = b.op(&format!("llvm.inline_asm has_side_effects \"atom.global.add.u32 $0, [$1], 1;\", \"=r,l,~{{memory}}\" {ctr} : (!llvm.ptr<1>) -> i32"));
    b.line(&format!("scf.yield {got} : i32"));
    b.line("} else {");
    let z = b.op("arith.constant 0 : i32");
    b.line(&format!("scf.yield {z} : i32"));
    b.line("}");
    let (c0, w32) = (b.op("arith.constant 0 : i32"), b.op("arith.constant 32 : i32"));
    let (all, ok) = (b.v(), b.v());
    b.line(&format!("{all}, {ok} = gpu.shuffle idx {old}, {c0}, {w32} : i32"));
    let gx = b.op("gpu.grid_dim x");
    let gx = b.op(&format!("arith.index_cast {gx} : index to i32"));
    let one = b.op("arith.constant 1 : i32");
    let lastn = b.op(&format!("arith.subi {gx}, {one} : i32"));
    let last = b.op(&format!("arith.cmpi eq, {all}, {lastn} : i32"));
    b.line(&format!("scf.if {last} {{"));
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"~{memory}\" : () -> ()");
    route_row(b, &t, &lane, "%y", "%ry", e, top_k, n_group, topk_group, scoring, select, normalize, scaling, count);
    b.line(&format!("scf.if {l0} {{"));
    let z = b.op("arith.constant 0 : i32");
    b.line(&format!("llvm.store {z}, {ctr} : i32, !llvm.ptr<1>"));
    b.line("}");
    b.line("}");
    b.line("}");
}

/// One warp's routing of token `row` (`row`, `lane` i64): [`emit_route`]'s body, the logits
/// read from `logits`, the dense routing row written to `out`.
#[allow(clippy::too_many_arguments)]
fn route_row(
    b: &mut Body,
    row: &str,
    lane: &str,
    logits: &str,
    out: &str,
    e: usize,
    top_k: usize,
    n_group: usize,
    topk_group: usize,
    scoring: MoeScoring,
    select: MoeSelect,
    normalize: bool,
    scaling: f32,
    count: bool,
) {
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
        let logit = b.load(logits, &at);
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
        let mut any = b.op("arith.constant false");
        for ((idx, _), w) in picks.iter().zip(&ws) {
            let hit = b.op(&format!("arith.cmpi eq, {}, {idx} : i32", x.e32));
            y = b.op(&format!("arith.select {hit}, {w}, {y} : f32"));
            any = b.op(&format!("arith.ori {any}, {hit} : i1"));
        }
        let at = b.op(&format!("arith.addi {base}, {} : i64", x.e));
        match &x.valid {
            Some(v) => {
                b.line(&format!("scf.if {v} {{"));
                b.store(&y, out, &at);
                b.line("}");
            }
            None => b.store(&y, out, &at),
        }
        if count {
            // (a chosen expert — a pick is never -1 where it matches a lane's index, and an
            // out-of-range lane's index matches none — adds this token to its counter)
            b.line(&format!("scf.if {any} {{"));
            let p = b.op(&format!("llvm.getelementptr %counts[{}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32", x.e));
            b.line(&format!("llvm.inline_asm has_side_effects \"red.global.add.u32 [$0], 1;\", \"l\" {p} : (!llvm.ptr<1>) -> ()"));
            b.line("}");
        }
    }
}

/// [`KernelSpec::MoeGateUp`] where it is not the SwiGLU GEMV (f32 or fp8 weights, any D): a
/// warp per (token, slot, hidden unit): h[t, slot, o] = silu(gate_e[o] · x_t) · (up_e[o] · x_t)
/// for the slot-th chosen expert e (block y = token · top_k + slot; params x, route, wg, wu, h,
/// n = I).
fn emit_gate_up(b: &mut Body, d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType) -> Result<(), String> {
    let by = b.op("gpu.block_id y");
    let by = b.idx64(&by);
    let ck = b.ci64(top_k as i64);
    let t = b.op(&format!("arith.divui {by}, {ck} : i64"));
    let slot = b.op(&format!("arith.remui {by}, {ck} : i64"));
    let (o, lane) = b.open_guarded_warp_output(MOE_WARPS);
    let ce = b.ci64(e as i64);
    let rbase = b.op(&format!("arith.muli {t}, {ce} : i64"));
    let slot32 = b.op(&format!("arith.trunci {slot} : i64 to i32"));
    let (found, ex) = slot_expert(b, e, &lane, &rbase, &slot32);
    let (cd, ci) = (b.ci64(d as i64), b.ci64(inter as i64));
    let xoff = b.op(&format!("arith.muli {t}, {cd} : i64"));
    b.line(&format!("scf.if {found} {{"));
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
    let hi = b.op(&format!("arith.muli {by}, {ci} : i64"));
    let hi = b.op(&format!("arith.addi {hi}, {o} : i64"));
    b.store(&hv, "%h", &hi);
    b.line("}");
    b.line("}");
    b.line("}");
    Ok(())
}

/// Outputs per block of [`KernelSpec::MoeDown`] (each of its `top_k` warps computes them all
/// for one chosen expert).
pub const MOE_DOWN_OUTPUTS: usize = 2;

/// The blocks of [`KernelSpec::MoeDown`] a SM is compiled to hold (ptxas's register budget).
pub const MOE_DOWN_BLOCKS_PER_SM: u32 = 3;

/// [`KernelSpec::MoeDown`]: y[t, n] = Σ over the token's chosen experts, in expert order, of
/// route[t, e] · (down_e[n] · h[t, slot]). A block per (token = block y, [`MOE_DOWN_OUTPUTS`]
/// outputs), warp s the token's s-th chosen expert ([`slot_expert`]), so every chosen expert's
/// rows stream at once; the route-weighted dots meet in shared memory and the first threads sum
/// them in slot (= expert) order from 0, the CPU executor's order. Slots a row did not fill
/// (disabled experts) add 0 and read nothing. Params h, route, wd, y, n = D.
#[allow(clippy::too_many_arguments)]
fn emit_down(b: &mut Body, d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType, residual: bool, shared: usize, first: bool) -> Result<(), String> {
    let r = MOE_DOWN_OUTPUTS;
    let slots = top_k + shared;
    // (the registers MOE_DOWN_BLOCKS_PER_SM blocks leave: without the bound ptxas kept to 40
    // and sank each round's loads behind the last round's FMAs)
    b.launch_bounds = Some((32 * slots as u32, MOE_DOWN_BLOCKS_PER_SM));
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", slots * r);
    b.workgroup = Some(format!("%red : {smt}"));
    let t = b.op("gpu.block_id y");
    let t = b.idx64(&t);
    let bx = b.op("gpu.block_id x");
    let bx = b.idx64(&bx);
    let tid = b.op("gpu.thread_id x");
    let (lane_i, warp_i) = b.lane_warp(&tid);
    let lane = b.idx64(&lane_i);
    let slot = b.idx64(&warp_i);
    // (the shared slots first where `first`: [`shared_first`])
    let (first_is, routed) = shared_first(b, &slot, shared, first);
    let slot32 = b.op(&format!("arith.trunci {routed} : i64 to i32"));
    let ce = b.ci64(e as i64);
    let rbase = b.op(&format!("arith.muli {t}, {ce} : i64"));
    let (found, ex) = slot_expert(b, e, &lane, &rbase, &slot32);
    let (cd, ci, cr) = (b.ci64(d as i64), b.ci64(inter as i64), b.ci64(r as i64));
    let o0 = b.op(&format!("arith.muli {bx}, {cr} : i64"));
    // (a shared slot — warp < shared where `first`, else warp >= top_k —: always there,
    // weight 1, its I-wide chunk of the [D, shared · I] rows, chunk · I in)
    let shared_slot = (shared > 0).then(|| match first_is {
        Some(is) => (is, b.op(&format!("arith.muli {slot}, {ci} : i64"))),
        None => {
            let ck = b.ci64(top_k as i64);
            let is = b.op(&format!("arith.cmpi uge, {slot}, {ck} : i64"));
            let chunk = b.op(&format!("arith.subi {slot}, {ck} : i64"));
            (is, b.op(&format!("arith.muli {chunk}, {ci} : i64")))
        }
    });
    let found = match &shared_slot {
        Some((is, _)) => b.op(&format!("arith.ori {found}, {is} : i1")),
        None => found,
    };
    let ck = b.ci64(slots as i64);
    let hrow = b.op(&format!("arith.muli {t}, {ck} : i64"));
    let hrow = b.op(&format!("arith.addi {hrow}, {slot} : i64"));
    let hoff = b.op(&format!("arith.muli {hrow}, {ci} : i64"));
    let zero = b.cf32(0.0);
    let zi = b.op("arith.constant 0 : index");
    let l0 = b.op(&format!("arith.cmpi eq, {lane_i}, {zi} : index"));
    let ri = b.op(&format!("arith.constant {r} : index"));
    let sbase = b.op(&format!("arith.muli {warp_i}, {ri} : index"));
    let res = b.v();
    b.line(&format!("{res}:{r} = scf.if {found} -> ({}) {{", vec!["f32"; r].join(", ")));
    let at = b.op(&format!("arith.addi {rbase}, {ex} : i64"));
    let w = b.load("%route", &at);
    let w = match &shared_slot {
        Some((is, _)) => {
            let one = b.cf32(1.0);
            b.op(&format!("arith.select {is}, {one}, {w} : f32"))
        }
        None => w,
    };
    let last = b.ci64(d as i64 - 1);
    let mut woffs = vec![];
    for j in 0..r {
        let cj = b.ci64(j as i64);
        let o = b.op(&format!("arith.addi {o0}, {cj} : i64"));
        let o = b.op(&format!("arith.minsi {o}, {last} : i64"));
        let row = b.op(&format!("arith.muli {ex}, {cd} : i64"));
        let row = b.op(&format!("arith.addi {row}, {o} : i64"));
        let routed = b.op(&format!("arith.muli {row}, {ci} : i64"));
        woffs.push(match &shared_slot {
            // (o · shared·I + the slot's chunk)
            Some((is, chunk)) => {
                let cs = b.ci64((shared * inter) as i64);
                let so = b.op(&format!("arith.muli {o}, {cs} : i64"));
                let so = b.op(&format!("arith.addi {so}, {chunk} : i64"));
                b.op(&format!("arith.select {is}, {so}, {routed} : i64"))
            }
            None => routed,
        });
    }
    let wbase = match &shared_slot {
        Some((is, _)) => b.op(&format!("llvm.select {is}, %sd, %wd : i1, !llvm.ptr<1>")),
        None => "%wd".to_string(),
    };
    let dots = b.lane_dots(&wbase, &woffs, wdtype, "%h", &hoff, inter, &lane)?;
    let ps: Vec<String> = dots
        .iter()
        .map(|v| {
            let s = b.warp_sum(v);
            b.op(&format!("arith.mulf {s}, {w} : f32"))
        })
        .collect();
    b.line(&format!("scf.yield {} : {}", ps.join(", "), vec!["f32"; r].join(", ")));
    b.line("} else {");
    b.line(&format!("scf.yield {} : {}", vec![zero.as_str(); r].join(", "), vec!["f32"; r].join(", ")));
    b.line("}");
    b.line(&format!("scf.if {l0} {{"));
    for j in 0..r {
        let cj = b.op(&format!("arith.constant {j} : index"));
        let at = b.op(&format!("arith.addi {sbase}, {cj} : index"));
        b.line(&format!("memref.store {res}#{j}, %red[{at}] : {smt}"));
    }
    b.line("}");
    b.line("gpu.barrier");
    // (thread j < r: output o0 + j, the slots' dots summed in order)
    let tid64 = b.idx64(&tid);
    let o = b.op(&format!("arith.addi {o0}, {tid64} : i64"));
    let mine = b.op(&format!("arith.cmpi ult, {tid}, {ri} : index"));
    let inside = b.op(&format!("arith.cmpi slt, {o}, {cd} : i64"));
    let mine = b.op(&format!("arith.andi {mine}, {inside} : i1"));
    b.line(&format!("scf.if {mine} {{"));
    let mut acc = zero.clone();
    // (the routed slots in expert order, then the shared ones)
    let order: Vec<usize> = if first { (shared..slots).chain(0..shared).collect() } else { (0..slots).collect() };
    for s in order {
        let cs = b.op(&format!("arith.constant {} : index", s * r));
        let at = b.op(&format!("arith.addi {cs}, {tid} : index"));
        let v = b.op(&format!("memref.load %red[{at}] : {smt}"));
        acc = b.op(&format!("arith.addf {acc}, {v} : f32"));
    }
    let yi = b.op(&format!("arith.muli {t}, {cd} : i64"));
    let yi = b.op(&format!("arith.addi {yi}, {o} : i64"));
    if residual {
        let v = b.load("%res", &yi);
        acc = b.op(&format!("arith.addf {acc}, {v} : f32"));
    }
    b.store(&acc, "%y", &yi);
    b.line("}");
    Ok(())
}

/// Warps per block of the grouped tensor-core experts ([`KernelSpec::MoeGateUpMma`],
/// [`KernelSpec::MoeDownMma`]); they split K. Measured on the H200 (V2-Lite shape, b32 /
/// b128 / prefill 512 tok/s): 8 warps 1,951 / 5,111 / 6,564, 4 warps 2,840 / 6,958 / 8,613,
/// 2 warps 2,812 / 6,844 / 7,232 — a block's gather and epilogue are fixed costs, and
/// smaller blocks (4 resident a SM) overlap them with each other's weight streams.
pub const MOE_MMA_WARPS: usize = 4;
/// Rounds of 32 candidate tokens whose routing weights the grouped experts' gather loads at once.
const GATHER_ROUNDS: usize = 4;

/// `fns.b32`: the bit position of the `nth` (1-based, i32) set bit of the i32 `mask`
/// (0xffffffff when it has fewer).
fn nth_set_bit(b: &mut Body, mask: &str, nth: &str) -> String {
    b.op(&format!("llvm.inline_asm \"fns.b32 $0, $1, 0, $2;\", \"=r,r,r\" {mask}, {nth} : (i32, i32) -> i32"))
}

/// The chosen experts below expert `ex` (i64) in routing row `tok` (i64) of an E-wide dense
/// routing `%route`: the slot of `ex` in the token's expert-order list (i32). One lane's own
/// walk over the whole row, unrolled: 16-byte loads where E is a multiple of 4, issued 16 at
/// a time before any is compared (a loop waiting for each load in turn cost ~16 round trips).
fn slot_below(b: &mut Body, tok: &str, ex: &str, e: usize) -> String {
    let ce = b.ci64(e as i64);
    let rb = b.op(&format!("arith.muli {tok}, {ce} : i64"));
    let zero = b.cf32(0.0);
    let w = if e % 4 == 0 { 4 } else { 1 };
    let mut slot = b.op("arith.constant 0 : i32");
    let loads: Vec<usize> = (0..e / w).collect();
    for group in loads.chunks(16) {
        let vals: Vec<Vec<String>> = group
            .iter()
            .map(|&q| {
                let cq = b.ci64((q * w) as i64);
                let at = b.op(&format!("arith.addi {rb}, {cq} : i64"));
                if w == 4 {
                    let c4 = b.ci64(4);
                    let bo = b.op(&format!("arith.muli {at}, {c4} : i64"));
                    b.load_vec("%route", &bo, 4, "f32", 16)
                } else {
                    vec![b.load("%route", &at)]
                }
            })
            .collect();
        for (&q, vs) in group.iter().zip(&vals) {
            for (i, v) in vs.iter().enumerate() {
                let idx = b.ci64((q * w + i) as i64);
                let below = b.op(&format!("arith.cmpi slt, {idx}, {ex} : i64"));
                let nz = b.op(&format!("arith.cmpf une, {v}, {zero} : f32"));
                let both = b.op(&format!("arith.andi {below}, {nz} : i1"));
                let one = b.op(&format!("arith.extui {both} : i1 to i32"));
                slot = b.op(&format!("arith.addi {slot}, {one} : i32"));
            }
        }
    }
    slot
}

/// `gpu.shuffle idx` of the i32 `v` from lane `src` (i32)
fn shuffle_i32(b: &mut Body, v: &str, src: &str) -> String {
    let w32 = b.op("arith.constant 32 : i32");
    let (r, ok) = (b.v(), b.v());
    b.line(&format!("{r}, {ok} = gpu.shuffle idx {v}, {src}, {w32} : i32"));
    r
}

/// The grouped routed experts on the tensor cores ([`KernelSpec::MoeGateUpMma`] when
/// `gate_up`, else [`KernelSpec::MoeDownMma`]): block (16 rows of expert e = block y's
/// weights, its [`MOE_MMA_WARPS`] warps splitting K). Its tokens — those whose routing row chose e — are
/// gathered in passes of up to 32 by ballots over the routing column (every warp alike: lane
/// l holds the l-th token, found with `fns`), each pass the `mma.sync` GEMV of
/// [`MmaTiles`] with those tokens' rows as the B tiles (x in 16 bits for the gate/up, the f32
/// h rows at the token's slot of e for the down projection), the warps' sums met in shared
/// memory and stored by warp 0: h[t, slot, i] = silu(g)·u, or the route-weighted partial
/// p[slot, t, n] = route[t, e] · (down_e[n] · h[t, slot]) that [`KernelSpec::MoeCombine`]
/// sums. A token's slot is its chosen experts below e (expert order, as the CPU executor
/// sums). Each expert's weights are read once per pass: once per step up to 32 tokens an
/// expert (batch 32: ~3 each), and experts no token chose cost a scan of the column.
fn emit_moe_mma(b: &mut Body, gate_up: bool, d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType) -> Result<(), String> {
    let f16 = wdtype == DType::F16;
    let k = if gate_up { d } else { inter };
    // (A tiles: the gate's and the up's 16 rows, or 16 rows of the down projection — 32 rows
    // there, in two tiles, measured slower: b32 5.0 -> 6.7 ms a step)
    let (nw, nt, na) = (MOE_MMA_WARPS, GEMV_MMA_ROWS / 8, if gate_up { 2 } else { 1 });
    let per = 4 * nt * na;
    let steps = k / 32;
    // (K steps a warp's loop iteration loads: 4 weight rows' 16 bytes each a lane)
    let unroll = 4 / na;
    let (jloop, rounds) = split_k_schedule(steps, 1, nw, unroll);
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", nw * per * 32);
    b.workgroup = Some(format!("%red : {smt}"));
    if b.pdl {
        b.wait_for_previous();
    }
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (bx64, ex, lane64, warp64) = (b.idx64(&bx), b.idx64(&by), b.idx64(&lane), b.idx64(&warp));
    let lane32 = b.op(&format!("arith.trunci {lane64} : i64 to i32"));
    let (c1, c2, c4, c8, c16) = (b.ci64(1), b.ci64(2), b.ci64(4), b.ci64(8), b.ci64(16));
    let g = b.op(&format!("arith.divui {lane64}, {c4} : i64"));
    let tq = b.op(&format!("arith.remui {lane64}, {c4} : i64"));
    let col0 = b.op(&format!("arith.muli {bx64}, {c16} : i64"));
    let nlast = b.op(&format!("arith.subi %n, {c1} : i64"));
    let mlast = b.op(&format!("arith.subi %m, {c1} : i64"));
    let e0 = b.op(&format!("arith.muli {tq}, {c8} : i64"));
    // this lane's weight rows g and g + 8 of the expert's tile (row stride K 16-bit values)
    let cre = b.ci64(if gate_up { inter } else { d } as i64);
    let erow = b.op(&format!("arith.muli {ex}, {cre} : i64"));
    let (r0, r8) = MmaTiles::row_offsets(b, &erow, &col0, &g, &nlast, &e0, k, 0);
    let a_tiles: Vec<(String, String, String)> = if gate_up { vec![("%wg".into(), r0.clone(), r8.clone()), ("%wu".into(), r0, r8)] } else { vec![("%w".into(), r0, r8)] };
    let ce = b.ci64(e as i64);
    let zero = b.cf32(0.0);
    let (z32, one32, c32x) = (b.op("arith.constant 0 : i32"), b.op("arith.constant 1 : i32"), b.op("arith.constant 32 : i32"));
    let (c0, neg1, c32) = (b.ci64(0), b.ci64(-1), b.ci64(32));
    // gather from token `start`: (the next pass's start, the count, the lane's token)
    let gather = |b: &mut Body, start: &str| -> (String, String, String) {
        // gather: GATHER_ROUNDS rounds of 32 candidates an iteration (their routing weights loaded
        // first), until 32 tokens or the end
        let (gr, gc, gn, gt) = (b.v(), b.v(), b.v(), b.v());
        b.line(&format!("{gr}:3 = scf.while ({gc} = {start}, {gn} = {z32}, {gt} = {neg1}) : (i64, i32, i64) -> (i64, i32, i64) {{"));
        let room = b.op(&format!("arith.cmpi slt, {gn}, {c32x} : i32"));
        let cands = b.op(&format!("arith.cmpi slt, {gc}, %m : i64"));
        let go = b.op(&format!("arith.andi {room}, {cands} : i1"));
        b.line(&format!("scf.condition({go}) {gc}, {gn}, {gt} : i64, i32, i64"));
        b.line("} do {");
        let (c, cnt0, tk0) = (b.v(), b.v(), b.v());
        b.line(&format!("^bb0({c}: i64, {cnt0}: i32, {tk0}: i64):"));
        let nz: Vec<String> = (0..GATHER_ROUNDS)
            .map(|q| {
                let cq = b.ci64(32 * q as i64);
                let cand = b.op(&format!("arith.addi {c}, {cq} : i64"));
                let cand = b.op(&format!("arith.addi {cand}, {lane64} : i64"));
                let inr = b.op(&format!("arith.cmpi slt, {cand}, %m : i64"));
                let cl = b.op(&format!("arith.minsi {cand}, {mlast} : i64"));
                let at = b.op(&format!("arith.muli {cl}, {ce} : i64"));
                let at = b.op(&format!("arith.addi {at}, {ex} : i64"));
                let r = b.load("%route", &at);
                let nz = b.op(&format!("arith.cmpf une, {r}, {zero} : f32"));
                b.op(&format!("arith.andi {nz}, {inr} : i1"))
            })
            .collect();
        let f = b.op("arith.constant false");
        let (mut cnt, mut tk, mut cn, mut stopped) = (cnt0.clone(), tk0.clone(), c.clone(), f);
        for (q, nzq) in nz.iter().enumerate() {
            let bal = b.ballot(nzq);
            let n = b.popc(&bal);
            let space = b.op(&format!("arith.subi {c32x}, {cnt} : i32"));
            let take = b.op(&format!("arith.minui {n}, {space} : i32"));
            let take = b.op(&format!("arith.select {stopped}, {z32}, {take} : i32"));
            // (lane l takes the (l - cnt)-th chosen candidate of the round)
            let kk = b.op(&format!("arith.subi {lane32}, {cnt} : i32"));
            let k_ge = b.op(&format!("arith.cmpi sge, {kk}, {z32} : i32"));
            let k_lt = b.op(&format!("arith.cmpi slt, {kk}, {take} : i32"));
            let mine = b.op(&format!("arith.andi {k_ge}, {k_lt} : i1"));
            let kp = b.op(&format!("arith.maxsi {kk}, {z32} : i32"));
            let kp = b.op(&format!("arith.addi {kp}, {one32} : i32"));
            // (0xffffffff where the lane takes none: its token is then not used)
            let pos = nth_set_bit(b, &bal, &kp);
            let pos64 = b.op(&format!("arith.extui {pos} : i32 to i64"));
            let cq = b.ci64(32 * q as i64);
            let base = b.op(&format!("arith.addi {c}, {cq} : i64"));
            let tokn = b.op(&format!("arith.addi {base}, {pos64} : i64"));
            tk = b.op(&format!("arith.select {mine}, {tokn}, {tk} : i64"));
            // (a round with more than fit: the next pass starts at the first one left; else past
            // the round, unless an earlier round stopped)
            let more = b.op(&format!("arith.cmpi ult, {take}, {n} : i32"));
            let t1 = b.op(&format!("arith.addi {take}, {one32} : i32"));
            let stop = nth_set_bit(b, &bal, &t1);
            let stop = b.op(&format!("arith.extui {stop} : i32 to i64"));
            let stop = b.op(&format!("arith.addi {base}, {stop} : i64"));
            let past = b.op(&format!("arith.addi {base}, {c32} : i64"));
            let here = b.op(&format!("arith.select {more}, {stop}, {past} : i64"));
            cn = b.op(&format!("arith.select {stopped}, {cn}, {here} : i64"));
            stopped = b.op(&format!("arith.ori {stopped}, {more} : i1"));
            cnt = b.op(&format!("arith.addi {cnt}, {take} : i32"));
        }
        b.line(&format!("scf.yield {cn}, {cnt}, {tk} : i64, i32, i64"));
        b.line("}");
        (format!("{gr}#0"), format!("{gr}#1"), format!("{gr}#2"))
    };
    // a pass over `count` gathered tokens (lane l's `tok`)
    let pass = |b: &mut Body, count: &str, tok: &str| {
        // the lane's token (lanes past the count take entry 0's: read, never stored), its slot
        // of e and (down) its routing weight
        let valid = b.op(&format!("arith.cmpi slt, {lane32}, {count} : i32"));
        let tok32 = b.op(&format!("arith.trunci {tok} : i64 to i32"));
        let t0 = shuffle_i32(b, &tok32, &z32);
        let tokc32 = b.op(&format!("arith.select {valid}, {tok32}, {t0} : i32"));
        let tokc = b.op(&format!("arith.extui {tokc32} : i32 to i64"));
        // (the gate/up needs it only to store: warp 0 finds it after the K loop)
        let slot_early = (!gate_up).then(|| slot_below(b, &tokc, &ex, e));
        let wt = (!gate_up).then(|| {
            let at = b.op(&format!("arith.muli {tokc}, {ce} : i64"));
            let at = b.op(&format!("arith.addi {at}, {ex} : i64"));
            b.load("%route", &at)
        });
        // the B tiles: entry 8j + g's x row (gate/up: x [T, D] in 16 bits; down: h [T, top_k, I] f32 at the slot)
        let g32 = b.op(&format!("arith.trunci {g} : i64 to i32"));
        let (mut xoff, mut live) = (vec![], vec![]);
        for j in 0..nt {
            let cj = b.op(&format!("arith.constant {} : i32", 8 * j));
            live.push(b.op(&format!("arith.cmpi slt, {cj}, {count} : i32")));
            let ej = b.op(&format!("arith.addi {cj}, {g32} : i32"));
            let tj = shuffle_i32(b, &tokc32, &ej);
            let tj = b.op(&format!("arith.extui {tj} : i32 to i64"));
            let (row, rowbytes, esz) = if gate_up {
                (tj, d * 2, c2.clone())
            } else {
                let sj = shuffle_i32(b, slot_early.as_ref().expect("down: the slot"), &ej);
                let sj = b.op(&format!("arith.extui {sj} : i32 to i64"));
                let ck = b.ci64(top_k as i64);
                let hr = b.op(&format!("arith.muli {tj}, {ck} : i64"));
                (b.op(&format!("arith.addi {hr}, {sj} : i64")), inter * 4, c4.clone())
            };
            let crb = b.ci64(rowbytes as i64);
            let o = b.op(&format!("arith.muli {row}, {crb} : i64"));
            let eo = b.op(&format!("arith.muli {e0}, {esz} : i64"));
            xoff.push(b.op(&format!("arith.addi {o}, {eo} : i64")));
        }
        let tiles = MmaTiles { w: a_tiles.clone(), x: xoff, live: live.clone(), x16: gate_up, f16, split: !gate_up, packed: None };
        // (the first round's weights loaded ahead of the gather, under PDL before the wait,
        // measured slower: b32 gate/up 8.3 -> 9.6 ms a step)
        let acc = b.split_k_rounds(per, jloop, rounds, unroll, &warp64, nw as i64, steps as i64, &|b: &mut Body, ss: &[String], acc: &[String]| tiles.steps(b, ss, acc, None));
        // partial sums to shared memory at [warp][value][lane]; warp 0 adds them up and stores
        MmaTiles::meet_in_shared(b, &acc, &warp, &lane, per, &smt);
        let slot32 = match &slot_early {
            Some(s) => s.clone(),
            None => slot_below(b, &tokc, &ex, e),
        };
        let total = |b: &mut Body, a: usize| MmaTiles::warps_total(b, &acc[a], a, nw, per, &lane, &smt);
        let tq32 = b.op(&format!("arith.trunci {tq} : i64 to i32"));
        let two32 = b.op("arith.constant 2 : i32");
        let t2 = b.op(&format!("arith.muli {tq32}, {two32} : i32"));
        let ctk = b.ci64(top_k as i64);
        for j in 0..nt {
            b.line(&format!("scf.if {} {{", live[j]));
            for i in 0..4 {
                // D fragment value i: weight row col0 + g (+ 8 for i >= 2), entry 8j + 2 tq + i % 2
                let ce_ = b.op(&format!("arith.constant {} : i32", 8 * j + i % 2));
                let r = b.op(&format!("arith.addi {t2}, {ce_} : i32"));
                let tr = shuffle_i32(b, &tokc32, &r);
                let tr = b.op(&format!("arith.extui {tr} : i32 to i64"));
                let sr = shuffle_i32(b, &slot32, &r);
                let sr = b.op(&format!("arith.extui {sr} : i32 to i64"));
                let okr = b.op(&format!("arith.cmpi slt, {r}, {count} : i32"));
                let oks = b.op(&format!("arith.cmpi slt, {sr}, {ctk} : i64"));
                let okrs = b.op(&format!("arith.andi {okr}, {oks} : i1"));
                let wr = (!gate_up).then(|| {
                    let (wr, okv) = (b.v(), b.v());
                    let w32 = b.op("arith.constant 32 : i32");
                    b.line(&format!("{wr}, {okv} = gpu.shuffle idx {}, {r}, {w32} : f32", wt.as_ref().expect("down: the routing weight")));
                    wr
                });
                // (gate/up: silu(gate) · up; down: route-weighted)
                let cc = b.ci64(if i >= 2 { 8 } else { 0 });
                let col = b.op(&format!("arith.addi {col0}, {g} : i64"));
                let col = b.op(&format!("arith.addi {col}, {cc} : i64"));
                let okc = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
                let ok = b.op(&format!("arith.andi {okrs}, {okc} : i1"));
                let val = match &wr {
                    None => {
                        let gv = total(b, 4 * j + i);
                        let uv = total(b, 4 * nt + 4 * j + i);
                        let sg = b.sigmoid(&gv);
                        let sg = b.op(&format!("arith.mulf {gv}, {sg} : f32"));
                        b.op(&format!("arith.mulf {sg}, {uv} : f32"))
                    }
                    Some(wr) => {
                        let v = total(b, 4 * j + i);
                        b.op(&format!("arith.mulf {v}, {wr} : f32"))
                    }
                };
                b.line(&format!("scf.if {ok} {{"));
                let at = if gate_up {
                    let hi = b.op(&format!("arith.muli {tr}, {ctk} : i64"));
                    let hi = b.op(&format!("arith.addi {hi}, {sr} : i64"));
                    let ci = b.ci64(inter as i64);
                    let hi = b.op(&format!("arith.muli {hi}, {ci} : i64"));
                    b.op(&format!("arith.addi {hi}, {col} : i64"))
                } else {
                    let pi = b.op(&format!("arith.muli {sr}, %m : i64"));
                    let pi = b.op(&format!("arith.addi {pi}, {tr} : i64"));
                    let cd = b.ci64(d as i64);
                    let pi = b.op(&format!("arith.muli {pi}, {cd} : i64"));
                    b.op(&format!("arith.addi {pi}, {col} : i64"))
                };
                b.store(&val, "%y", &at);
                b.line("}");
            }
            b.line("}");
        }
        b.line("}");
        // (the next pass reuses the shared memory)
        b.line("gpu.barrier");
    };
    // the passes: from token 0 until every candidate is gathered
    let (pres, cur) = (b.v(), b.v());
    b.line(&format!("{pres} = scf.while ({cur} = {c0}) : (i64) -> i64 {{"));
    let left = b.op(&format!("arith.cmpi slt, {cur}, %m : i64"));
    b.line(&format!("scf.condition({left}) {cur} : i64"));
    b.line("} do {");
    let cur2 = b.v();
    b.line(&format!("^bb0({cur2}: i64):"));
    let (next, count, tok) = gather(b, &cur2);
    let any = b.op(&format!("arith.cmpi sgt, {count}, {z32} : i32"));
    b.line(&format!("scf.if {any} {{"));
    pass(b, &count, &tok);
    b.line("}");
    b.line(&format!("scf.yield {next} : i64"));
    b.line("}");
    Ok(())
}

/// [`KernelSpec::MoeCombine`]: a block per token; y[t, n] = the sum of the token's route-weighted
/// partials p[s, t, n] over its chosen experts' slots s (in expert order; a row that chose
/// fewer than `top_k` — disabled experts — leaves the last slots unwritten and unread). The
/// count by ballots over the routing row.
fn emit_moe_combine(b: &mut Body, d: usize, e: usize, top_k: usize, residual: bool) {
    let row = b.op("gpu.block_id x");
    let row = b.idx64(&row);
    let t = b.op("gpu.thread_id x");
    let (lane, _) = b.lane_warp(&t);
    let lane = b.idx64(&lane);
    let t64 = b.idx64(&t);
    let ce = b.ci64(e as i64);
    let rb = b.op(&format!("arith.muli {row}, {ce} : i64"));
    let last = b.ci64(e as i64 - 1);
    let zero = b.cf32(0.0);
    let mut cnt = b.op("arith.constant 0 : i32");
    for c in 0..e.div_ceil(32) {
        let (_, _, bal) = chosen_ballot(b, c, &lane, &rb, &last, &ce, &zero);
        let n = b.popc(&bal);
        cnt = b.op(&format!("arith.addi {cnt}, {n} : i32"));
    }
    let threads = 32 * MOE_COMBINE_WARPS;
    let w = if d % 4 == 0 { 4 } else { 1 };
    // (w f32 values of `ptr` from element `at`: one 16-byte load where w is 4)
    let load_w = |b: &mut Body, ptr: &str, at: &str| -> Vec<String> {
        if w == 4 {
            let c4 = b.ci64(4);
            let bo = b.op(&format!("arith.muli {at}, {c4} : i64"));
            b.load_vec(ptr, &bo, 4, "f32", 16)
        } else {
            vec![b.load(ptr, at)]
        }
    };
    let units = d / w;
    let cd = b.ci64(d as i64);
    let yrow = b.op(&format!("arith.muli {row}, {cd} : i64"));
    let keep: Vec<String> = (0..top_k)
        .map(|s| {
            let cs = b.op(&format!("arith.constant {s} : i32"));
            b.op(&format!("arith.cmpi slt, {cs}, {cnt} : i32"))
        })
        .collect();
    for u0 in (0..units).step_by(threads) {
        let cu = b.ci64(u0 as i64);
        let u = b.op(&format!("arith.addi {t64}, {cu} : i64"));
        let guard = u0 + threads > units;
        if guard {
            let cn = b.ci64(units as i64);
            let ok = b.op(&format!("arith.cmpi slt, {u}, {cn} : i64"));
            b.line(&format!("scf.if {ok} {{"));
        }
        let cw = b.ci64(w as i64);
        let el = b.op(&format!("arith.muli {u}, {cw} : i64"));
        let mut acc = vec![zero.clone(); w];
        for (s, k) in keep.iter().enumerate() {
            let cs = b.ci64(s as i64);
            let pr = b.op(&format!("arith.muli {cs}, %n : i64"));
            let pr = b.op(&format!("arith.addi {pr}, {row} : i64"));
            let pr = b.op(&format!("arith.muli {pr}, {cd} : i64"));
            let pe = b.op(&format!("arith.addi {pr}, {el} : i64"));
            let vs = load_w(b, "%p", &pe);
            for (a, v) in acc.iter_mut().zip(&vs) {
                let v = b.op(&format!("arith.select {k}, {v}, {zero} : f32"));
                *a = b.op(&format!("arith.addf {a}, {v} : f32"));
            }
        }
        let ye = b.op(&format!("arith.addi {yrow}, {el} : i64"));
        if residual {
            // (the residual last, after the slots' sum: the CPU executor's order)
            let vs = load_w(b, "%res", &ye);
            for (a, v) in acc.iter_mut().zip(&vs) {
                *a = b.op(&format!("arith.addf {a}, {v} : f32"));
            }
        }
        if w == 4 {
            let v = b.vector(&acc, "f32");
            let c4 = b.ci64(4);
            let bo = b.op(&format!("arith.muli {ye}, {c4} : i64"));
            let p = b.op(&format!("llvm.getelementptr %y[{bo}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
            b.line(&format!("llvm.store {v}, {p} {{alignment = 16 : i64}} : vector<4xf32>, !llvm.ptr<1>"));
        } else {
            b.store(&acc[0], "%y", &ye);
        }
        if guard {
            b.line("}");
        }
    }
}

/// Warps per block of [`KernelSpec::MoeCombine`] (a block per token).
pub const MOE_COMBINE_WARPS: usize = 4;

/// The lowering of `moe_route` (operands logits [T, E], mask [E], V3's bias [E]): a step of
/// [`KernelSpec::MoeRoute`], a warp per token.
pub(crate) fn lower_moe_route(cx: &NodeCx, args: Vec<String>, r: &MoeRouting) -> Result<Step, CodegenError> {
    let e = cx.ops[0].ty.shape[1].as_const().ok_or_else(|| cx.err("the router needs a constant expert count"))?;
    for o in cx.ops {
        if o.ty.dtype != DType::F32 {
            return Err(cx.err(format!("the router takes f32 logits, mask and bias; {} is {}", o.name, o.ty)));
        }
    }
    // (a mask that is a row of a step input — the runtime's failover mask — gets a counter per
    // expert beside it, `{mask}@counts`: the router adds each token's selections there)
    let mut count = false;
    let g = cx.graph;
    let mut m = g.by_name(&cx.names[1]);
    while let Some(id) = m {
        match g.node(id).op {
            dsc_ir::Op::Input => {
                count = true;
                break;
            }
            dsc_ir::Op::Reshape | dsc_ir::Op::Slice { axis: 0, .. } => m = Some(g.operands(id)[0]),
            _ => break,
        }
    }
    let spec = KernelSpec::MoeRoute {
        e,
        top_k: r.top_k,
        n_group: r.n_group,
        topk_group: r.topk_group,
        scoring: r.scoring,
        select: r.select,
        normalize: r.normalize,
        scaling_bits: r.scaling.to_bits(),
        count,
    };
    moe_fits(&spec).map_err(|m| cx.err(m))?;
    let mut args = args;
    if count {
        args.insert(args.len() - 1, format!("{}@counts", cx.names[1]));
    }
    let rows = Scalar::Rows(cx.names[0].clone());
    Ok(cx.step(spec, args, vec![rows.clone()], rows, Scalar::Const(1)))
}

/// The lowering of `moe_experts` (operands x [T, D], route [T, E], gate/up [E, I, D], down
/// [E, D, I], stacked weights): the gate/up kernel into the scratch `{node}@rows{top_k·I}`
/// and the down projection into the node — from [`GROUPED_MIN_ROWS`] tokens (16-bit weights)
/// the grouped tensor-core pair instead, its down projection into the partials
/// `{node}@splitk{top_k}` (declared by a kernel-less step) and a [`KernelSpec::MoeCombine`]
/// step for those rows. `top_k` is the router's (the most nonzero weights a routing row
/// holds).
pub(crate) fn lower_moe_experts(cx: &NodeCx, top_k: usize) -> Result<Vec<Step>, CodegenError> {
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
    // (the residual, added after the experts' sum: the MoE block's output and the residual
    // stream in one write)
    let residual = match cx.ops.get(5) {
        Some(r) if r.ty.dtype != DType::F32 => return Err(cx.err(format!("the routed experts' residual must be f32, not {}", r.ty))),
        Some(_) => Some(cx.names[5].clone()),
        None => None,
    };
    let up = KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared: 0, shared_first: false };
    let down = KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual: residual.is_some(), shared: 0, shared_first: false };
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
    let down_args = [h.clone(), n[1].clone(), n[4].clone()].into_iter().chain(residual.clone()).chain([cx.name.to_string()]).collect();
    let mut second = cx.step(down, down_args, vec![Scalar::Const(d as i64)], Scalar::Const(d as i64), tokens);
    // (batches: expert-major on the tensor cores, each chosen expert's weights read once a
    // pass of up to 32 of its tokens)
    let (up_mma, down_mma) = (KernelSpec::MoeGateUpMma { d, inter, e, top_k, wdtype }, KernelSpec::MoeDownMma { d, inter, e, top_k, wdtype });
    if moe_fits(&up_mma).is_err() {
        return Ok(vec![first, second]);
    }
    let rows = Scalar::Rows(n[0].clone());
    let grouped = |kernel: KernelSpec, args: Option<Vec<String>>, width: usize| crate::schedule::Large {
        min_rows: GROUPED_MIN_ROWS,
        max_rows: None,
        args,
        kernel,
        scalars: vec![Scalar::Const(width as i64), rows.clone()],
        work: Scalar::Const(width as i64),
        grid_y: Scalar::Const(e as i64),
    };
    let parts = format!("{}@splitk{top_k}", cx.name);
    first.few = vec![grouped(up_mma, None, inter)];
    second.few = vec![grouped(down_mma, Some(vec![h, n[1].clone(), n[4].clone(), parts.clone()]), d)];
    let node_rows = Scalar::Rows(cx.name.to_string());
    let combine = Step {
        min_rows: Some(GROUPED_MIN_ROWS),
        ..cx.step(
            KernelSpec::MoeCombine { d, e, top_k, residual: residual.is_some() },
            [parts.clone(), n[1].clone()].into_iter().chain(residual).chain([cx.name.to_string()]).collect(),
            vec![node_rows.clone()],
            node_rows,
            Scalar::Const(1),
        )
    };
    Ok(vec![first, Step::new(&parts), second, combine])
}
