//! Norms: RMSNorm (a block per row in registers where the row splits evenly, `rms_norm_regs`;
//! else a looping block or a warp per row), with its optional 16-bit copy for the matmul after
//! it (`RmsNormHalf`), LayerNorm, and the split-K reduce fused with the RMSNorm after it
//! (`SplitKReduceNorm`: on sm_90a a cluster of blocks per row). The norm folded into a GEMV's
//! prologue is the GEMV's (`NormMatMul`, `matmul/gemv.rs`). Semantics: `dsc_ir::exec`'s CPU
//! executor (`rms_norm`: x · g / sqrt(mean(x²) + eps)). This file also owns the family's
//! symbols and launch geometry (`norm_symbol`, `norm_launch`), the lowering of `rms_norm`
//! (`lower_rms_norm`) and its unit tests; ptxas runs over it in codegen/tests, and on the GPU
//! the bundle's cases in compiler/src/gpu_bundle/norm.rs.
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - RMSNorm: one pass from registers when 32·w threads split the row's 16-byte pieces evenly
//!   (`kernels::rms_norm_regs`: d = 4096 → 32 warps × 1 piece), else a looping 8-warp block.
//!   The one-row GEMVs reading an RMSNorm compute it in their prologue (`KernelSpec::NormMatMul`,
//!   over a plain, merged or SwiGLU GEMV) where every reader is such a GEMV over ≤ 16 MB of
//!   weights (`schedule::fusable_norms`; larger ones are bandwidth-bound and lose by it: measured;
//!   DSC_NORM_FUSION=0 off): their step's default kernel reads the norm's input and weight, the
//!   alternatives keep reading its output (`GpuLarge.args`), and the norm's step has `min_rows: 2`.

use crate::kernels::*;
use crate::schedule::{NodeCx, Scalar, Step};
use crate::CodegenError;

/// The lowering of `rms_norm`: a block (or warp) per row; `fused`: the decode GEMVs reading it
/// normalize in their prologue, so one-row steps skip it (`schedule::fusable_norms`).
pub(crate) fn lower_rms_norm(cx: &NodeCx, args: Vec<String>, eps: f32, fused: bool) -> Result<Step, CodegenError> {
    let d = cx.node.ty.shape.last().and_then(|d| d.as_const()).ok_or_else(|| cx.err("rms_norm needs a constant last dim"))?;
    if cx.ops[1].ty.dtype != DType::F32 {
        return Err(cx.err("rms_norm weight must be f32"));
    }
    let rows = Scalar::Rows(cx.name.to_string());
    let st = cx.step(KernelSpec::RmsNorm { d, eps_bits: eps.to_bits() }, args, vec![rows.clone()], rows, Scalar::Const(1));
    Ok(Step { min_rows: fused.then_some(2), ..st })
}

/// The readable symbol of a `norm` kernel (`KernelSpec::symbol`).
pub(crate) fn norm_symbol(spec: &KernelSpec) -> String {
    match spec {
            KernelSpec::RmsNorm { d, .. } => format!("rms_norm_d{d}_f32"),
            KernelSpec::RmsNormHalf { d, f16, .. } => format!("rms_norm_d{d}_f32_{}", if *f16 { "f16" } else { "bf16" }),
            KernelSpec::SplitKReduceNorm { splits, residual, d, eps_bits, half, cluster } => format!(
                "splitk_reduce{splits}{}_rms_norm_d{d}_e{eps_bits:08x}{}{}",
                if *residual { "_res" } else { "" },
                match half {
                    Some(true) => "_f16",
                    Some(false) => "_bf16",
                    None => "",
                },
                if *cluster > 1 { format!("_c{cluster}") } else { String::new() }
            ),
            KernelSpec::LayerNorm { d, half, .. } => format!("layer_norm_d{d}{}", half.map_or("", |f| if f { "_f16" } else { "_bf16" })),
        other => unreachable!("{other:?} is not a norm kernel (kernels::family)"),
    }
}

/// How the runtime launches a `norm` kernel (`KernelSpec::launch`).
pub(crate) fn norm_launch(spec: &KernelSpec) -> Launch {
    match spec {
            // a block of 8 warps per row with 16-byte loads (a warp per row leaves a 4096-wide
            // row as 128 dependent load iterations: 55 us instead of a few)
            KernelSpec::RmsNorm { d, .. } | KernelSpec::RmsNormHalf { d, .. } if rms_norm_regs(*d).is_some() => Launch::BlockPerRow { warps: rms_norm_regs(*d).expect("checked").0 as u32 },
            KernelSpec::RmsNorm { d, .. } | KernelSpec::RmsNormHalf { d, .. } if d % 4 == 0 => Launch::BlockPerRow { warps: 8 },
            KernelSpec::RmsNormHalf { .. } => Launch::WarpPerRow { rows_per_block: 4 },
            KernelSpec::RmsNorm { .. } => Launch::WarpPerRow { rows_per_block: 4 },
            KernelSpec::LayerNorm { .. } => Launch::WarpPerRow { rows_per_block: 4 },
            KernelSpec::SplitKReduceNorm { d, cluster, .. } if *cluster > 1 => Launch::BlockPerRow { warps: (d / 4 / cluster / 32).max(1) as u32 },
            KernelSpec::SplitKReduceNorm { .. } => Launch::BlockPerRow { warps: SPLITK_NORM_WARPS as u32 },
        other => unreachable!("{other:?} is not a norm kernel (kernels::family)"),
    }
}

/// RMSNorm rows that one block covers in a single pass, 16 bytes per thread per piece kept in
/// registers: (warps, pieces per thread), the most warps (up to 32) whose threads split the
/// row's 16-byte pieces evenly, at most 4 pieces each (d = 4096: 32 warps x 1; 8192: 32 x 2).
/// None: the looping kernel (e.g. d = 576, whose 144 pieces no multiple of 32 divides).
pub fn rms_norm_regs(d: usize) -> Option<(usize, usize)> {
    if d % 4 != 0 {
        return None;
    }
    let pieces = d / 4;
    (1..=32usize).rev().find(|w| pieces % (32 * w) == 0 && pieces / (32 * w) <= 4).map(|w| (w, pieces / (32 * w)))
}

/// The loop values of a block-per-row kernel over 4-float row pieces ([`Body::open_row_pieces`]):
/// thread index, its first piece's column (t·4), the row width, the loop step (4 per thread),
/// the row's first element, f32 zero, i64 4, the `%red` memref type.
#[derive(Clone)]
pub(crate) struct RowPieces {
    pub(crate) t: String,
    pub(crate) t4: String,
    pub(crate) dd: String,
    pub(crate) step: String,
    pub(crate) base: String,
    pub(crate) zero: String,
    pub(crate) c4b: String,
    pub(crate) smt: String,
}

/// Whether an RMSNorm kernel also writes a 16-bit copy (`Some(f16)`).
pub(crate) fn rms_half(spec: &KernelSpec) -> Option<bool> {
    match spec {
        KernelSpec::RmsNormHalf { f16, .. } => Some(*f16),
        _ => None,
    }
}

/// The RMSNorm kernels' parameters (with the 16-bit copy's pointer after y).
pub(crate) fn rms_norm_params(half: Option<bool>) -> String {
    format!("%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %y: !llvm.ptr<1>, {}%rows: i64", if half.is_some() { "%yh: !llvm.ptr<1>, " } else { "" })
}

/// Warps of the split-K reduce + RMSNorm kernel's block: 32, a row of d = 4096 one 16-byte
/// piece per thread, all its partial sums' loads in flight at once (8 warps, 4 pieces per
/// thread, made the fold lose; bench/results/swiglu-splitk-norm-2026-11-30.json).
pub const SPLITK_NORM_WARPS: usize = 32;

/// The split-K reduce + RMSNorm kernel's parameters.
pub(crate) fn splitk_norm_params(residual: bool, half: Option<bool>) -> String {
    format!(
        "%parts: !llvm.ptr<1>, {}%y: !llvm.ptr<1>, %g: !llvm.ptr<1>, %xn: !llvm.ptr<1>, {}%rows: i64",
        if residual { "%res: !llvm.ptr<1>, " } else { "" },
        if half.is_some() { "%xh: !llvm.ptr<1>, " } else { "" }
    )
}

/// Blocks per row of the split-K reduce + RMSNorm on sm_90a ([`KernelSpec::SplitKReduceNorm`]'s
/// `cluster`) for rows of `d` floats: a thread-block cluster of c blocks, block r taking the
/// row's columns [r·d/c, (r+1)·d/c) as one 4-float piece per thread, so a row's loads spread
/// over c SMs instead of one (the 8B shape's b32 step ran 63 of these kernels at 5.4 µs, 32
/// blocks on 132 SMs, latency-bound). `want`: [`SPLITK_NORM_CLUSTER`] unless the options
/// ask for another ([`crate::options::ScheduleOptions::splitk_norm_cluster`]); 1 where d is
/// not a multiple of 128·c (whole warps) or a block would pass 1024 threads.
/// (Only the sm_90a split-K alternatives take it: those kernels alone read the parts.)
pub fn splitk_norm_cluster(d: usize, want: Option<usize>) -> usize {
    let c = want.unwrap_or(SPLITK_NORM_CLUSTER);
    if c > 1 && d % (128 * c) == 0 && d / 4 / c <= 1024 {
        c
    } else {
        1
    }
}

/// The default of [`splitk_norm_cluster`]: 8 — the 8B shape's b32 7,018-7,028 -> 7,208-7,209
/// tok/s (4: 7,178-7,180), b8 and b128 unchanged, greedy streams equal
/// (bench/results/session20-2026-12-01.json).
pub const SPLITK_NORM_CLUSTER: usize = 8;

/// [`KernelSpec::SplitKReduceNorm`] with a row as one 4-float piece per thread
/// ([`splitk_norm_regs`]): thread t takes columns 4t..4t+3 where 4t < d — g first (before the
/// PDL wait), then the split-K parts (+ the residual) summed and stored as y, the block's sum
/// of squares, and y · inv_rms · g from the registers. The same operations in the same order
/// as the looped kernel, so the same bits.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_splitk_norm_regs(b: &mut Body, r: &RowPieces, slice: &str, splits: usize, residual: bool, d: usize, eps: f32, half: Option<bool>, warps: usize) {
    let RowPieces { t, t4, base, zero, c4b, smt, .. } = r;
    let i = b.idx64(t4);
    let dd = b.ci64(d as i64);
    let inrow = b.op(&format!("arith.cmpi slt, {i}, {dd} : i64"));
    let e = b.op(&format!("arith.addi {base}, {i} : i64"));
    let f4 = "f32, f32, f32, f32";
    // g: a weight, not written by the kernel before
    let gr = b.v();
    b.line(&format!("{gr}:4 = scf.if {inrow} -> ({f4}) {{"));
    let wo = b.op(&format!("arith.muli {i}, {c4b} : i64"));
    let gs = b.load_vec("%g", &wo, 4, "f32", 16);
    b.line(&format!("scf.yield {} : {f4}", gs.join(", ")));
    b.line("} else {");
    b.line(&format!("scf.yield {zero}, {zero}, {zero}, {zero} : {f4}"));
    b.line("}");
    if b.pdl && !b.waited {
        b.wait_for_previous();
    }
    // y = the parts' sum (+ res), stored; its squares' sum
    let yr = b.v();
    b.line(&format!("{yr}:5 = scf.if {inrow} -> ({f4}, f32) {{"));
    let (ys, s4) = b.splitk_piece(slice, &e, splits, residual);
    // (as the looped kernel: its accumulator starts at 0 and adds the piece's sum once)
    let a = b.op(&format!("arith.addf {zero}, {s4} : f32"));
    b.line(&format!("scf.yield {}, {a} : {f4}, f32", ys.join(", ")));
    b.line("} else {");
    b.line(&format!("scf.yield {zero}, {zero}, {zero}, {zero}, {zero} : {f4}, f32"));
    b.line("}");
    let total = b.block_sum(&format!("{yr}#4"), t, warps, smt, zero);
    let inv = b.inv_rms(&total, d, eps);
    b.line(&format!("scf.if {inrow} {{"));
    let ys: Vec<String> = (0..4).map(|j| format!("{yr}#{j}")).collect();
    let gs: Vec<String> = (0..4).map(|j| format!("{gr}#{j}")).collect();
    b.store_scaled_piece(&ys, &gs, &inv, &e, "%xn", half.map(|f16| (f16, "%xh")));
    b.line("}");
    // (the row's `scf.if` of open_row_pieces)
    b.line("}");
}

/// [`KernelSpec::SplitKReduceNorm`] in a thread-block cluster of `c` blocks per row (grid x =
/// rows, y = c, clusters along y): block r's thread t takes columns r·d/c + 4t .. + 3 — g
/// before the PDL wait, then the split-K parts (+ the residual) summed and stored as y, the
/// block's sum of squares (warp sums, one partial per warp in shared memory), which thread 0
/// stores into slot r of every block of the cluster (`mapa` + `st.shared::cluster`); past the
/// cluster barrier each thread adds the c partials in rank order (the same total in every
/// block) and writes y · inv_rms · g from its registers (+ the 16-bit copy).
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_splitk_norm_cluster(b: &mut Body, splits: usize, residual: bool, d: usize, eps: f32, half: Option<bool>, c: usize) -> Result<(), String> {
    splitk_norm_cluster_fits(d, c, b.pdl)?;
    let nt = d / 4 / c.max(1);
    let warps = nt / 32;
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", warps + c);
    b.workgroup = Some(format!("%sm : {smt}"));
    let t = b.op("gpu.thread_id x");
    let row = b.op("gpu.block_id x");
    let rk = b.op("gpu.block_id y");
    let (t64, rowi, rk64) = (b.idx64(&t), b.idx64(&row), b.idx64(&rk));
    let (cd, cw, c4) = (b.ci64(d as i64), b.ci64((d / c) as i64), b.ci64(4));
    let col0 = b.op(&format!("arith.muli {rk64}, {cw} : i64"));
    let t4 = b.op(&format!("arith.muli {t64}, {c4} : i64"));
    let col = b.op(&format!("arith.addi {col0}, {t4} : i64"));
    let base = b.op(&format!("arith.muli {rowi}, {cd} : i64"));
    let e = b.op(&format!("arith.addi {base}, {col} : i64"));
    // (a slice of the partial sums is [rows, d])
    let slice = b.op(&format!("arith.muli %rows, {cd} : i64"));
    // g: a weight, not written by the kernel before
    let wo = b.op(&format!("arith.muli {col}, {c4} : i64"));
    let gs = b.load_vec("%g", &wo, 4, "f32", 16);
    b.wait_for_previous();
    let (ys, s4) = b.splitk_piece(&slice, &e, splits, residual);
    let part = b.warp_sum(&s4);
    let (lane, warp) = b.lane_warp(&t);
    let c0 = b.op("arith.constant 0 : index");
    let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {l0} {{"));
    b.line(&format!("memref.store {part}, %sm[{warp}] : {smt}"));
    b.line("}");
    b.line("gpu.barrier");
    // (thread 0: the block's sum into slot warps + r of every block of the cluster)
    let zero = b.cf32(0.0);
    let t0 = b.op(&format!("arith.cmpi eq, {t}, {c0} : index"));
    b.line(&format!("scf.if {t0} {{"));
    let mut bs = zero.clone();
    for w in 0..warps {
        let wi = b.op(&format!("arith.constant {w} : index"));
        let v = b.op(&format!("memref.load %sm[{wi}] : {smt}"));
        bs = b.op(&format!("arith.addf {bs}, {v} : f32"));
    }
    let cwarps = b.ci64(warps as i64);
    let slot = b.op(&format!("arith.addi {cwarps}, {rk64} : i64"));
    for r in 0..c {
        let cr = b.ci64(r as i64);
        st_cluster(b, &smt, &slot, &cr, &bs);
    }
    b.line("}");
    b.cluster_barrier();
    let mut total = zero.clone();
    for r in 0..c {
        let ri = b.op(&format!("arith.constant {} : index", warps + r));
        let v = b.op(&format!("memref.load %sm[{ri}] : {smt}"));
        total = b.op(&format!("arith.addf {total}, {v} : f32"));
    }
    let inv = b.inv_rms(&total, d, eps);
    b.store_scaled_piece(&ys, &gs, &inv, &e, "%xn", half.map(|f16| (f16, "%xh")));
    Ok(())
}

/// The split-K reduce + RMSNorm in clusters of `c` blocks per row (sm_90a: `pdl`): a whole
/// number of warps of at most 1024 threads per block.
fn splitk_norm_cluster_fits(d: usize, c: usize, pdl: bool) -> Result<(), String> {
    let nt = d / 4 / c.max(1);
    if !(2..=8).contains(&c) || d % (128 * c) != 0 || nt > 1024 || !pdl {
        return Err(format!("the split-K reduce + RMSNorm in clusters: sm_90a, 2..=8 blocks per row, a whole number of warps of at most 1024 threads per block (D {d}, {c} blocks)"));
    }
    Ok(())
}

/// Whether a norms kernel generates ([`fits`]): the 16-bit copy and the split-K reduce need D
/// a multiple of 4 (16-byte pieces); the cluster variant fits its blocks.
pub(crate) fn norm_fits(spec: &KernelSpec, o: Outer) -> Result<(), String> {
    match spec {
        KernelSpec::RmsNormHalf { d, .. } if rms_norm_regs(*d).is_none() && d % 4 != 0 => Err(format!("the RMSNorm with a 16-bit copy needs D a multiple of 4, got {d}")),
        KernelSpec::SplitKReduceNorm { d, cluster, .. } if *cluster > 1 => splitk_norm_cluster_fits(*d, *cluster, o.pdl),
        KernelSpec::SplitKReduceNorm { d, .. } if d % 4 != 0 => Err(format!("the split-K reduce + RMSNorm needs D a multiple of 4, got {d}")),
        KernelSpec::RmsNorm { .. } | KernelSpec::RmsNormHalf { .. } | KernelSpec::SplitKReduceNorm { .. } | KernelSpec::LayerNorm { .. } => Ok(()),
        other => Err(format!("`{}` is not one of the norms kernels", other.symbol())),
    }
}

/// The norms kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn norm_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    norm_fits(spec, b.outer())?;
    Ok(match spec {
        KernelSpec::RmsNorm { d, eps_bits } | KernelSpec::RmsNormHalf { d, eps_bits, .. } if rms_norm_regs(*d).is_some() => {
            // one pass: every thread loads its 16-byte pieces once and keeps them in registers
            let (warps, per) = rms_norm_regs(*d).expect("checked");
            let eps = f32::from_bits(*eps_bits);
            let nt = 32 * warps;
            let smt = format!("memref<{warps}xf32, #gpu.address_space<workgroup>>");
            b.workgroup = Some(format!("%red : {smt}"));
            let (t, rowi) = b.open_block_row();
            let t64 = b.idx64(&t);
            let dd64 = b.ci64(*d as i64);
            let base = b.op(&format!("arith.muli {rowi}, {dd64} : i64"));
            // (x's row: this row, or with the row gather folded in, row idx[row] of x)
            let xbase = if b.row_gather {
                let src = b.load_i32_as_i64("%idx", &rowi);
                b.op(&format!("arith.muli {src}, {dd64} : i64"))
            } else {
                base.clone()
            };
            let c4 = b.ci64(4);
            let t4 = b.op(&format!("arith.muli {t64}, {c4} : i64"));
            // piece j of thread t: elements 4 (t + j nt) .. + 4
            let idx: Vec<String> = (0..per)
                .map(|j| {
                    let o = b.ci64((4 * j * nt) as i64);
                    b.op(&format!("arith.addi {t4}, {o} : i64"))
                })
                .collect();
            let xs: Vec<Vec<String>> = idx
                .iter()
                .map(|i| {
                    let e = b.op(&format!("arith.addi {xbase}, {i} : i64"));
                    let bo = b.op(&format!("arith.muli {e}, {c4} : i64"));
                    b.load_vec("%x", &bo, 4, "f32", 16)
                })
                .collect();
            let ws: Vec<Vec<String>> = idx
                .iter()
                .map(|i| {
                    let wo = b.op(&format!("arith.muli {i}, {c4} : i64"));
                    b.load_vec("%w", &wo, 4, "f32", 16)
                })
                .collect();
            let mut acc = b.cf32(0.0);
            for x in &xs {
                let sq: Vec<String> = x.iter().map(|v| b.op(&format!("arith.mulf {v}, {v} : f32"))).collect();
                let s4 = b.sum4(&sq);
                acc = b.op(&format!("arith.addf {acc}, {s4} : f32"));
            }
            let zero = b.cf32(0.0);
            let total = b.block_sum(&acc, &t, warps, &smt, &zero);
            let inv = b.inv_rms(&total, *d, eps);
            let half = rms_half(spec);
            for (j, i) in idx.iter().enumerate() {
                let e = b.op(&format!("arith.addi {base}, {i} : i64"));
                b.store_scaled_piece(&xs[j], &ws[j], &inv, &e, "%y", half.map(|f16| (f16, "%yh")));
            }
            b.line("}");
            rms_norm_params(half)
        }
        KernelSpec::RmsNorm { d, eps_bits } | KernelSpec::RmsNormHalf { d, eps_bits, .. } if d % 4 == 0 => {
            let eps = f32::from_bits(*eps_bits);
            let Launch::BlockPerRow { warps } = spec.launch() else { unreachable!() };
            let r = b.open_row_pieces(*d, warps as usize);
            let RowPieces { t, t4, dd, step, base, zero, c4b, smt, .. } = r.clone();
            // (x's row: this row, or with the row gather folded in, row idx[row] of x)
            let xbase = if b.row_gather {
                let row = b.op("gpu.block_id x");
                let row = b.idx64(&row);
                let src = b.load_i32_as_i64("%idx", &row);
                let dd64 = b.ci64(*d as i64);
                Some(b.op(&format!("arith.muli {src}, {dd64} : i64")))
            } else {
                None
            };
            // sum of squares: 4 floats per thread per iteration
            let acc = b.v();
            let (iv, a) = (b.v(), b.v());
            b.line(&format!("{acc} = scf.for {iv} = {t4} to {dd} step {step} iter_args({a} = {zero}) -> (f32) {{"));
            let i = b.idx64(&iv);
            let e = b.op(&format!("arith.addi {}, {i} : i64", xbase.as_deref().unwrap_or(&base)));
            let bo = b.op(&format!("arith.muli {e}, {c4b} : i64"));
            let xs = b.load_vec("%x", &bo, 4, "f32", 16);
            let sq: Vec<String> = xs.iter().map(|x| b.op(&format!("arith.mulf {x}, {x} : f32"))).collect();
            let s4 = b.sum4(&sq);
            let a2 = b.op(&format!("arith.addf {a}, {s4} : f32"));
            b.line(&format!("scf.yield {a2} : f32"));
            b.line("}");
            let total = b.block_sum(&acc, &t, warps as usize, &smt, &zero);
            let inv = b.inv_rms(&total, *d, eps);
            let half = rms_half(spec);
            b.scale_row_pieces_from(&r, "%x", xbase.as_deref(), "%w", &inv, "%y", half.map(|f16| (f16, "%yh")));
            b.line("}");
            rms_norm_params(half)
        }
        KernelSpec::RmsNormHalf { .. } => unreachable!("norm_fits refuses the 16-bit copy of a row not in 16-byte pieces"),
        KernelSpec::RmsNorm { d, eps_bits } => {
            let eps = f32::from_bits(*eps_bits);
            let t = b.op("gpu.thread_id x");
            let blk = b.op("gpu.block_id x");
            let c32 = b.op("arith.constant 32 : index");
            let lane = b.op(&format!("arith.remui {t}, {c32} : index"));
            let warp = b.op(&format!("arith.divui {t}, {c32} : index"));
            let Launch::WarpPerRow { rows_per_block } = spec.launch() else { unreachable!() };
            let rpb = b.op(&format!("arith.constant {rows_per_block} : index"));
            let r0 = b.op(&format!("arith.muli {blk}, {rpb} : index"));
            let row = b.op(&format!("arith.addi {r0}, {warp} : index"));
            let rowi = b.op(&format!("arith.index_cast {row} : index to i64"));
            let ok = b.op(&format!("arith.cmpi slt, {rowi}, %rows : i64"));
            b.line(&format!("scf.if {ok} {{"));
            let dd = b.op(&format!("arith.constant {d} : index"));
            let base = b.op(&format!("arith.muli {row}, {dd} : index"));
            let zero = b.cf32(0.0);
            let acc = b.v();
            let (iv, a) = (b.v(), b.v());
            b.line(&format!("{acc} = scf.for {iv} = {lane} to {dd} step {c32} iter_args({a} = {zero}) -> (f32) {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let x = b.load("%x", &idx);
            let sq = b.op(&format!("arith.mulf {x}, {x} : f32"));
            let a2 = b.op(&format!("arith.addf {a}, {sq} : f32"));
            b.line(&format!("scf.yield {a2} : f32"));
            b.line("}");
            let total = b.warp_sum(&acc);
            let inv = b.inv_rms(&total, *d, eps);
            let iv2 = b.v();
            b.line(&format!("scf.for {iv2} = {lane} to {dd} step {c32} {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv2} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let wi = b.op(&format!("arith.index_cast {iv2} : index to i64"));
            let x = b.load("%x", &idx);
            let w = b.load("%w", &wi);
            let xn = b.op(&format!("arith.mulf {x}, {inv} : f32"));
            let y = b.op(&format!("arith.mulf {xn}, {w} : f32"));
            b.store(&y, "%y", &idx);
            b.line("}");
            b.line("}");
            "%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }

        KernelSpec::SplitKReduceNorm { splits, residual, d, eps_bits, half, cluster } if *cluster > 1 => {
            emit_splitk_norm_cluster(b, *splits, *residual, *d, f32::from_bits(*eps_bits), *half, *cluster)?;
            splitk_norm_params(*residual, *half)
        }
        KernelSpec::SplitKReduceNorm { splits, residual, d, eps_bits, half, .. } => {
            let warps = SPLITK_NORM_WARPS;
            let r = b.open_row_pieces(*d, warps);
            let RowPieces { t, t4, dd, step, base, zero, smt, .. } = r.clone();
            // (a slice of the partial sums is [rows, d])
            let dd64 = b.ci64(*d as i64);
            let slice = b.op(&format!("arith.muli %rows, {dd64} : i64"));
            // (`KernelOptions::splitk_norm_regs`: each thread's summed piece kept in registers
            // for the scaling pass, the norm weights loaded before the wait; prepared, not yet
            // run on the H200 — the 8B b32 step spends 343 µs in these kernels,
            // bench/results/timeline-2026-11-30.json)
            if b.o.splitk_norm_regs && *d <= 4 * 32 * warps {
                emit_splitk_norm_regs(b, &r, &slice, *splits, *residual, *d, f32::from_bits(*eps_bits), *half, warps);
                return Ok(splitk_norm_params(*residual, *half));
            }
            // y = the parts' sum (+ res), 4 floats per thread per iteration, and sum(y^2)
            let acc = b.v();
            let (iv, a) = (b.v(), b.v());
            b.line(&format!("{acc} = scf.for {iv} = {t4} to {dd} step {step} iter_args({a} = {zero}) -> (f32) {{"));
            let i = b.idx64(&iv);
            let e = b.op(&format!("arith.addi {base}, {i} : i64"));
            let (_, s4) = b.splitk_piece(&slice, &e, *splits, *residual);
            let a2 = b.op(&format!("arith.addf {a}, {s4} : f32"));
            b.line(&format!("scf.yield {a2} : f32"));
            b.line("}");
            let total = b.block_sum(&acc, &t, warps, &smt, &zero);
            let inv = b.inv_rms(&total, *d, f32::from_bits(*eps_bits));
            // (each thread reads back the y it wrote)
            b.scale_row_pieces(&r, "%y", "%g", &inv, "%xn", half.map(|f16| (f16, "%xh")));
            b.line("}");
            splitk_norm_params(*residual, *half)
        }
        KernelSpec::LayerNorm { d, eps_bits, half } => {
            let (lane, base, dd, c32) = b.open_row(*d, 4);
            let df = b.cf32(*d as f32);
            let s1 = b.row_reduce(&lane, &base, &dd, &c32, &|_, x| x.to_string(), false);
            let mean = b.op(&format!("arith.divf {s1}, {df} : f32"));
            let mm = mean.clone();
            let s2 = b.row_reduce(
                &lane,
                &base,
                &dd,
                &c32,
                &move |b, x| {
                    let t = b.op(&format!("arith.subf {x}, {mm} : f32"));
                    b.op(&format!("arith.mulf {t}, {t} : f32"))
                },
                false,
            );
            let var = b.op(&format!("arith.divf {s2}, {df} : f32"));
            let e = b.cf32(f32::from_bits(*eps_bits));
            let ve = b.op(&format!("arith.addf {var}, {e} : f32"));
            let sd = b.asm1("sqrt.rn.f32", &ve);
            let one = b.cf32(1.0);
            let inv = b.op(&format!("arith.divf {one}, {sd} : f32"));
            let iv = b.v();
            b.line(&format!("scf.for {iv} = {lane} to {dd} step {c32} {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let wi = b.op(&format!("arith.index_cast {iv} : index to i64"));
            let x = b.load("%x", &idx);
            let w = b.load("%w", &wi);
            let bb = b.load("%b", &wi);
            let xc = b.op(&format!("arith.subf {x}, {mean} : f32"));
            let xn = b.op(&format!("arith.mulf {xc}, {inv} : f32"));
            let y = b.op(&format!("llvm.intr.fma({xn}, {w}, {bb}) : (f32, f32, f32) -> f32"));
            b.store(&y, "%y", &idx);
            if let Some(f16) = half {
                b.store_half1(&y, "%yh", &idx, *f16);
            }
            b.line("}");
            b.line("}");
            format!("%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %b: !llvm.ptr<1>, %y: !llvm.ptr<1>, {}%rows: i64", if half.is_some() { "%yh: !llvm.ptr<1>, " } else { "" })
        }
        other => return Err(format!("`{}` is not one of the norms kernels", other.symbol())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_one_pass_shapes_split_rows_evenly() {
        assert_eq!(rms_norm_regs(4096), Some((32, 1)));
        assert_eq!(rms_norm_regs(8192), Some((32, 2)));
        assert_eq!(rms_norm_regs(2048), Some((16, 1)));
        assert_eq!(rms_norm_regs(896), Some((7, 1)));
        // 144 pieces: no multiple of 32 threads divides them; odd widths: no 16-byte pieces
        assert_eq!(rms_norm_regs(576), None);
        assert_eq!(rms_norm_regs(30), None);
        for d in (4..20000).step_by(4) {
            if let Some((w, per)) = rms_norm_regs(d) {
                assert!((1..=32).contains(&w) && (1..=4).contains(&per) && w * 32 * per * 4 == d, "{d}");
            }
        }
    }
}
