//! Decode GEMVs (y = x Wᵀ for few rows): the plain-float GEMV with its tiling by K and N,
//! the wide one-row GEMV for lm_head-sized N, the batched GEMV on CUDA cores for f32 weights,
//! the quantized GGUF GEMVs, and the wrappers that fold neighbours into them — the RMSNorm
//! prologue (`NormMatMul`), the embedding gather (`GatherX`, `RowGather`), zeroing an
//! accumulator (`ZeroFill`), an L2 prefetch of the next weights (`PrefetchL2`), a second output
//! (`MatMulCopy`), an activation (`MatMulAct`) and the SwiGLU GEMV. With PDL the first weights
//! load before `griddepcontrol.wait`.
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - The logits' row gather (the rows that need logits, `logit_rows`, out of the last hidden
//!   state) rides on the final RMSNorm (`schedule::fold_row_gather`, `KernelSpec::RowGather`: the
//!   block-per-row norm reads its row r at row `idx[r]`; the gather's step and buffer go) where
//!   nothing else reads the gathered rows and they are no graph output (session 18;
//!   DSC_ROW_GATHER_NORM=0 off).
//! - A small model's lm_head (one row of a wide, short-rowed 16-bit matrix: N ≥ `GEMV_WIDE_N`,
//!   K a multiple of 64 up to 768, `kernels::wide_gemv_fits`) runs as the wide GEMV
//!   (`KernelSpec::MatMulWide`, `emit_gemv_wide`, session 19; DSC_GEMV_WIDE=0 off): 8 lanes per W
//!   row, so a lane's share of x (9 units of 8 floats for K = 576) is the same for every row and
//!   stays in registers; each warp walks 8 row groups of 4 rows as one stream of 16-byte units,
//!   12 loaded ahead (the first ones before `griddepcontrol.wait`), ptxas kept to 168 registers
//!   (`nvvm.minctasm` 3: the 384 blocks in one wave). The final RMSNorm (with the row gather
//!   folded in) folds into it (`schedule::fold_norm_into_wide`: `RowGather { NormMatMul {
//!   MatMulWide } }`, each warp normalizes its registers' share itself; the norm's step runs from
//!   two rows, for the alternatives; DSC_WIDE_NORM=0 off). SmolLM2 shape: lm_head + norm 18.1 ->
//!   14.6 µs (3.9 TB/s), 62 launches per b1 step.
//! - L2 prefetch of the next matmul's weights by the decode attention (`KernelSpec::PrefetchL2`,
//!   `schedule::prefetch_after_attention`: the weight as the step's first arg, its bytes as the last
//!   scalar; checked on the H200, measured slower, off: DSC_ATTN_PREFETCH=1 at compile time).

use crate::kernels::*;

/// The readable symbol of a `gemv` kernel (`KernelSpec::symbol`).
pub(crate) fn gemv_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::MatMul { k, n, wdtype, bias, residual } => format!("matmul_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
        KernelSpec::MatMulWide { k, n, wdtype, bias, residual } => format!("matmul_wide_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
        KernelSpec::MatMulCopy { inner } => format!("{}_copy", inner.symbol()),
        KernelSpec::PrefetchL2 { inner } => format!("{}_pf", inner.symbol()),
        KernelSpec::ZeroFill { inner, len } => format!("{}_zero{len}", inner.symbol()),
        KernelSpec::RowGather { inner } => format!("{}_rows", inner.symbol()),
        KernelSpec::GatherX { inner } => format!("{}_gx", inner.symbol()),
        KernelSpec::MatMulParts { inner, parts } => format!("{}_parts_{}", inner.symbol(), parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("_")),
        KernelSpec::NormMatMul { inner, .. } => format!("rms_{}", inner.symbol()),
        KernelSpec::MatMulFew { k, n, wdtype, bias, residual, rows } => format!("matmul_few{rows}_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
        KernelSpec::SwiGluGemv { k, f, wdtype } => format!("matmul_swiglu_k{k}_f{f}_{wdtype}"),
        KernelSpec::MatMulAct { inner, act } => format!("{}_{}", inner.symbol(), dsc_ir::Op::Unary(act.0).name()),
        other => unreachable!("{other:?} is not a gemv kernel (kernels::family)"),
    }
}

/// How the runtime launches a `gemv` kernel (`KernelSpec::launch`).
pub(crate) fn gemv_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::MatMul { k, n, wdtype: DType::F32 | DType::F16 | DType::BF16 | DType::Q4_1, .. } => {
            Launch::OutputsPerBlock { outputs: gemv_tiling(*k, *n, 1).0 as u32, rows: 1, warps: GEMV_WARPS as u32 }
        }
        KernelSpec::MatMulWide { .. } => Launch::OutputsPerBlock { outputs: wide_outputs() as u32, rows: 1, warps: GEMV_WARPS as u32 },
        KernelSpec::MatMulFew { wdtype, rows, .. } if gemv_mma_weights(*wdtype) => {
            let (w, _, a) = gemv_mma_tiling3();
            Launch::OutputsPerBlock { outputs: 16 * a as u32, rows: *rows as u32, warps: w as u32 }
        }
        KernelSpec::MatMulFew { k, n, rows, .. } => Launch::OutputsPerBlock { outputs: gemv_tiling(*k, *n, *rows).0 as u32, rows: *rows as u32, warps: GEMV_WARPS as u32 },
        KernelSpec::MatMul { wdtype, .. } if kquant_dtype(*wdtype) => kquant_launch(),
        KernelSpec::MatMul { .. } => Launch::WarpPerOutput { warps_per_block: 4 },
        // (half of a GEMV block's outputs: the other half are the up rows)
        KernelSpec::SwiGluGemv { k, f, .. } => Launch::OutputsPerBlock { outputs: gemv_tiling(*k, 2 * *f, 1).0 as u32 / 2, rows: 1, warps: GEMV_WARPS as u32 },
        KernelSpec::MatMulParts { inner, .. }
        | KernelSpec::NormMatMul { inner, .. }
        | KernelSpec::MatMulAct { inner, .. }
        | KernelSpec::PrefetchL2 { inner }
        | KernelSpec::ZeroFill { inner, .. }
        | KernelSpec::RowGather { inner }
        | KernelSpec::GatherX { inner }
        | KernelSpec::MatMulCopy { inner } => inner.launch(),
        other => unreachable!("{other:?} is not a gemv kernel (kernels::family)"),
    }
}

/// Warps per block of the plain-float GEMV (the runtime launches 32 x this many threads for
/// `outputs_per_block` steps).
pub const GEMV_WARPS: usize = 4;

/// N from which a one-row GEMV counts as wide (the lm_head; [`gemv_tiling`]).
pub const GEMV_WIDE_N: usize = 16384;

/// K from which the one-row GEMV takes 8 outputs per block ([`gemv_tiling`]).
pub const GEMV_LONG_K: usize = 2048;

/// Lanes per W row of the wide GEMV (`KernelSpec::MatMulWide`): a warp takes 32 / this rows
/// at a time, each lane every this-many-th 16-byte unit of them.
pub const WIDE_LANES: usize = 8;

/// Whether the one-row GEMV over `wdtype` [N, K] weights fits the wide GEMV: 16-bit weights,
/// N ≥ [`GEMV_WIDE_N`], K a multiple of 8·[`WIDE_LANES`] with at most 12 units per lane (x's
/// share in registers: 8 floats a unit); the lowering takes it where [`wide_gemv_on`].
pub fn wide_gemv_fits(k: usize, n: usize, wdtype: DType) -> bool {
    n >= GEMV_WIDE_N && wide_gemv_kernel_fits(k, wdtype).is_ok()
}

/// Whether the wide GEMV's kernel takes `wdtype` rows of K (any N): 16-bit weights, K a
/// multiple of 8·[`WIDE_LANES`], at most 12 units per lane.
pub fn wide_gemv_kernel_fits(k: usize, wdtype: DType) -> Result<(), String> {
    if matches!(wdtype, DType::BF16 | DType::F16) && k.is_multiple_of(8 * WIDE_LANES) && k / (8 * WIDE_LANES) <= 12 {
        Ok(())
    } else {
        Err(format!("the wide GEMV takes bf16/f16 rows of K a multiple of {} up to {}, not K = {k}, {wdtype}", 8 * WIDE_LANES, 96 * WIDE_LANES))
    }
}

/// The wide GEMV's schedule: (row groups per warp, 16-byte units per lane loaded ahead of the
/// one being summed).
pub fn wide_tiling() -> (usize, usize) {
    (8, 12)
}

/// Outputs (W rows) one block of the wide GEMV covers.
pub fn wide_outputs() -> usize {
    GEMV_WARPS * (32 / WIDE_LANES) * wide_tiling().0
}

/// The plain-float GEMV's tiling for a [N, K] weight: (outputs per block, chunk rounds
/// unrolled per loop iteration). Several outputs per block reuse each activation load; the
/// unroll keeps several 16-byte loads per lane in flight.
pub fn gemv_tiling(k: usize, n: usize, rows: usize) -> (usize, usize) {
    if rows == 1 && k >= GEMV_LONG_K && n % 64 == 0 {
        // long rows (the 8B shape): 8 outputs, 2 chunks per loop iteration — half the blocks
        // of (4, 4), the same loads in flight per thread; measured on the H200 (8B b1,
        // bench/results/gemv-tiling-2026-11-30.json): 238 -> 250 tok/s, every GEMV faster
        (8, 2)
    } else if rows == 1 {
        (4, 4)
    } else {
        (8, 1)
    }
}

/// Decode GEMVs over at most this many weight bytes prefetch their rows into L2 before
/// `griddepcontrol.wait` (see `emit_gemv`).
pub const GEMV_PREFETCH_MAX_BYTES: usize = 16 << 20;

/// Activation rows per block of the batched-decode GEMV (`MatMulFew`) on the CUDA cores
/// (f32 weights).
pub const GEMV_FEW_ROWS: usize = 8;
/// Activation rows per block `MatMulFew` uses for weights of `wdtype`.
pub fn few_rows(wdtype: DType) -> usize {
    if gemv_mma_weights(wdtype) {
        GEMV_MMA_ROWS
    } else {
        GEMV_FEW_ROWS
    }
}

/// The decode GEMV for plain-float weights: y[row, col] = x[row, :] . W[col, :] for `R`
/// consecutive cols and `mr` consecutive rows per block (grid (ceil(N / R), ceil(M / mr))),
/// the block's warps splitting K.
///
/// Each warp reads a 512-byte chunk of a weight row per instruction (lane l: bytes 16l..16l+16,
/// fully coalesced) and the matching activations of its `mr` rows once for all R weight rows;
/// warp w takes chunks w, w + W, w + 2W, ..., `unroll` chunks per loop iteration with every load
/// issued before the FMAs. Each weight byte is read once per block for `mr` activation rows
/// (the batched-decode variant, `mr` > 1, takes M as a parameter). A lane's partial sums are
/// reduced over the warp, then across warps in shared memory, and threads 0..R*mr run the
/// epilogue. Rows past N (and past M) are clamped for loading and not stored. The earlier
/// warp-per-output kernel had lanes 64 bytes apart in every load and ran at ~1.5 TB/s on the
/// H200: L1-wavefront bound (see docs/perf.md).
pub(crate) fn emit_gemv(b: &mut Body, k: usize, n: usize, wdtype: DType, bias: bool, residual: bool, mr: usize) -> Result<(), String> {
    gemv_body_fits(k, n, wdtype, mr, b.outer(), b.swiglu)?;
    let (r, unroll) = gemv_tiling(k, n, mr);
    let nw = GEMV_WARPS;
    let esz = wdtype.block().1;
    // Q4_1: a unit is a quarter of a 20-byte GGUF block — the nibble word of bytes 4t..4t+3
    // (elements 4t+i, 16+4t+i) and the block's d/min word — 8 elements, as a bf16 unit has
    let q4 = wdtype == DType::Q4_1;
    let e = if q4 { 8 } else { 16 / esz }; // elements per unit (16 bytes of plain floats)
    let units = k / e;
    let row_bytes = if q4 { k / 32 * esz } else { k * esz };
    let (jloop, rounds) = split_k_schedule(units, 32, nw, unroll);
    let norm = if mr == 1 { b.norm } else { None };
    let per = r * mr; // partial sums per lane: [row i][output j] at i * r + j
                      // with the norm prologue one more: the sum of x^2 (slot `per`)
    let slots = per + usize::from(norm.is_some());
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", nw * slots);
    b.workgroup = Some(format!("%red : {smt}"));
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (t64, bx64, by64, lane64, warp64) = (b.idx64(&t), b.idx64(&bx), b.idx64(&by), b.idx64(&lane), b.idx64(&warp));
    let swiglu = b.swiglu && mr == 1;
    // (SwiGLU: output j of the block is gate row col0 + j for j < r/2, up row col0 + j - r/2)
    let half = if swiglu { r / 2 } else { r };
    let wptr: Vec<&str> = (0..r)
        .map(|j| {
            if !swiglu {
                "%w"
            } else if j < half {
                "%w0"
            } else {
                "%w1"
            }
        })
        .collect();
    let cr = b.ci64(half as i64);
    let col0 = b.op(&format!("arith.muli {bx64}, {cr} : i64"));
    let cmr = b.ci64(mr as i64);
    let row0 = b.op(&format!("arith.muli {by64}, {cmr} : i64"));
    let one = b.ci64(1);
    let nlast = b.op(&format!("arith.subi %n, {one} : i64"));
    let rowbytes = b.ci64(row_bytes as i64);
    let wbase: Vec<String> = (0..r)
        .map(|j| {
            let cj = b.ci64((j % half) as i64);
            let c = b.op(&format!("arith.addi {col0}, {cj} : i64"));
            let c = b.op(&format!("arith.minsi {c}, {nlast} : i64"));
            b.op(&format!("arith.muli {c}, {rowbytes} : i64"))
        })
        .collect();
    if b.pdl && mr == 1 && n * row_bytes <= GEMV_PREFETCH_MAX_BYTES && b.o.gemv_prefetch && b.x_row_div.is_none() {
        // the weights do not depend on the previous kernel: while it finishes, thread j
        // prefetches this block's weight row j into L2 (one bulk prefetch), then waits.
        // Measured (bench/results/gemv-prefetch-*.json): SmolLM2 decode b1 +14%, but the 8B
        // shape's 33-235 MB GEMVs 15% slower (down_proj 31 -> 44 us), hence the size limit
        let rb = b.op(&format!("arith.constant {} : i32", row_bytes));
        for (j, wb) in wbase.iter().enumerate() {
            let cj = b.ci64(j as i64);
            let me = b.op(&format!("arith.cmpi eq, {t64}, {cj} : i64"));
            b.line(&format!("scf.if {me} {{"));
            // (the bulk prefetch takes 16-byte aligned spans: Q4_1 rows of K/32 20-byte blocks
            // are not, so the aligned span around the row)
            let (wb, rb) = if q4 {
                let (m16, c15) = (b.ci64(-16), b.ci64(15));
                let lo = b.op(&format!("arith.andi {wb}, {m16} : i64"));
                let crb = b.ci64(row_bytes as i64);
                let hi = b.op(&format!("arith.addi {wb}, {crb} : i64"));
                let hi = b.op(&format!("arith.addi {hi}, {c15} : i64"));
                let hi = b.op(&format!("arith.andi {hi}, {m16} : i64"));
                let len = b.op(&format!("arith.subi {hi}, {lo} : i64"));
                (lo, b.op(&format!("arith.trunci {len} : i64 to i32")))
            } else {
                (wb.clone(), rb.clone())
            };
            let p = b.op(&format!("llvm.getelementptr {}[{wb}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8", wptr[j]));
            b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.bulk.prefetch.L2.global [$0], $1;\", \"l,r\" {p}, {rb} : (!llvm.ptr<1>, i32) -> ()"));
            b.line("}");
        }
        b.wait_for_previous();
    }
    let xrow = b.ci64((k * 4) as i64);
    // (GatherX: x from row tok[row] of the 16-bit table, 2 bytes an element; block 0 writes it
    // as f32 at the row's own place, `xout`)
    let gather = b.gather_x && mr == 1 && e == 8 && !q4;
    let (xout, bx0, tbase) = if gather {
        let xw = b.op(&format!("arith.muli {row0}, {xrow} : i64"));
        let c0 = b.ci64(0);
        let first = b.op(&format!("arith.cmpi eq, {bx64}, {c0} : i64"));
        let tok = b.load_i32_as_i64("%tok", &row0);
        let trow = b.ci64((k * 2) as i64);
        (Some(xw), Some(first), Some(b.op(&format!("arith.muli {tok}, {trow} : i64"))))
    } else {
        (None, None, None)
    };
    let xbase: Vec<String> = (0..mr)
        .map(|i| {
            let row = if let (1, Some(dv)) = (mr, b.x_row_div) {
                let c = b.ci64(dv as i64);
                b.op(&format!("arith.divui {row0}, {c} : i64"))
            } else if mr == 1 {
                row0.clone()
            } else {
                let ci = b.ci64(i as i64);
                let rw = b.op(&format!("arith.addi {row0}, {ci} : i64"));
                let mlast = b.op(&format!("arith.subi %m, {one} : i64"));
                b.op(&format!("arith.minsi {rw}, {mlast} : i64"))
            };
            b.op(&format!("arith.muli {row}, {xrow} : i64"))
        })
        .collect();
    let c32l = b.ci64(32);
    let wl = b.op(&format!("arith.muli {warp64}, {c32l} : i64"));
    let u0 = b.op(&format!("arith.addi {wl}, {lane64} : i64"));
    // the weights of unit `u` (i64 unit index): per output j, its words (Q4_1: the nibble
    // word, then the block's d/min word)
    let load_w = |b: &mut Body, u: &str| -> Vec<Vec<String>> {
        if q4 {
            let (bo, e0) = b.q4_1_unit(u);
            return wbase.iter().zip(&wptr).map(|(base, ptr)| b.q4_1_words(ptr, base, &bo, &e0)).collect();
        }
        let c16 = b.ci64(16);
        let wo = b.op(&format!("arith.muli {u}, {c16} : i64"));
        wbase
            .iter()
            .zip(&wptr)
            .map(|(base, ptr)| {
                let off = b.op(&format!("arith.addi {base}, {wo} : i64"));
                b.load_vec(ptr, &off, 4, if wdtype == DType::F32 { "f32" } else { "i32" }, 16)
            })
            .collect()
    };
    // x (or g) at the unit's elements: e f32 from byte offset `xo`, or Q4_1's two groups of 4
    // (elements 4t.. and 16+4t.. of the block)
    let unit_f32s = |b: &mut Body, ptr: &str, xo: &str| -> Vec<String> {
        if q4 {
            b.q4_1_f32s(ptr, xo)
        } else {
            b.load_f32s(ptr, xo, e)
        }
    };
    // the FMAs of the 16-byte units `us` (i64 unit indices) into `acc`, with their weights
    // loaded here or (`pre`) already
    let units_fma_pre = |b: &mut Body, us: &[String], acc: &[String], pre: Option<&[Vec<Vec<String>>]>| -> Vec<String> {
        let mut loaded = vec![];
        for (ui, u) in us.iter().enumerate() {
            let xo = if q4 {
                let (_, e0) = b.q4_1_unit(u);
                let c4 = b.ci64(4);
                b.op(&format!("arith.muli {e0}, {c4} : i64"))
            } else {
                let xb = b.ci64((e * 4) as i64);
                b.op(&format!("arith.muli {u}, {xb} : i64"))
            };
            // (the unit's e f32 values, 16 bytes at a time; gathered: its 8 bf16 in one 16-byte
            // load, block 0 storing them as f32 into %x)
            let xs: Vec<Vec<String>> = match (&xout, &bx0) {
                (Some(xw), Some(first)) => {
                    let c16 = b.ci64(16);
                    let to = b.op(&format!("arith.muli {u}, {c16} : i64"));
                    let to = b.op(&format!("arith.addi {}, {to} : i64", tbase.as_deref().unwrap_or_default()));
                    let words = b.load_vec("%table", &to, 4, "i32", 16);
                    let v: Vec<String> = words.iter().flat_map(|w| b.bf16_pair(w)).collect();
                    b.line(&format!("scf.if {first} {{"));
                    let at = b.op(&format!("arith.addi {xw}, {xo} : i64"));
                    for half in 0..2 {
                        let vv = b.vector(&v[4 * half..4 * half + 4], "f32");
                        let ch = b.ci64(16 * half as i64);
                        let o = b.op(&format!("arith.addi {at}, {ch} : i64"));
                        let p = b.op(&format!("llvm.getelementptr %x[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                        b.line(&format!("llvm.store {vv}, {p} {{alignment = 16 : i64}} : vector<4xf32>, !llvm.ptr<1>"));
                    }
                    b.line("}");
                    vec![v]
                }
                _ => xbase
                    .iter()
                    .map(|base| {
                        let xo = b.op(&format!("arith.addi {base}, {xo} : i64"));
                        unit_f32s(b, "%x", &xo)
                    })
                    .collect(),
            };
            // the norm prologue: g for these elements (x's offsets without the row base)
            let gs: Vec<String> = if norm.is_some() { unit_f32s(b, "%g", &xo) } else { vec![] };
            let ws = match pre {
                Some(p) => p[ui].clone(),
                None => load_w(b, u),
            };
            loaded.push((xs, ws, gs));
        }
        let mut acc = acc.to_vec();
        for (xs, ws, gs) in loaded {
            // norm: sum x^2 of the raw x, then use x * g
            let xs: Vec<Vec<String>> = if gs.is_empty() {
                xs
            } else {
                for x in &xs[0] {
                    acc[per] = b.op(&format!("llvm.intr.fma({x}, {x}, {}) : (f32, f32, f32) -> f32", acc[per]));
                }
                vec![xs[0].iter().zip(&gs).map(|(x, g)| b.op(&format!("arith.mulf {x}, {g} : f32"))).collect()]
            };
            for (j, words) in ws.iter().enumerate() {
                let mut wf = vec![];
                if q4 {
                    wf = b.q4_1_weights(words);
                }
                for word in words.iter().filter(|_| !q4) {
                    match wdtype {
                        DType::F32 => wf.push(word.clone()),
                        DType::BF16 => wf.extend(b.bf16_pair(word)),
                        _ => wf.extend(b.f16_pair(word)),
                    }
                }
                for (i, xr) in xs.iter().enumerate() {
                    let a = i * r + j;
                    for (w, x) in wf.iter().zip(xr) {
                        acc[a] = b.op(&format!("llvm.intr.fma({w}, {x}, {}) : (f32, f32, f32) -> f32", acc[a]));
                    }
                }
            }
        }
        acc
    };
    // units between a warp's consecutive chunks; the last rounds are guarded (a partial
    // chunk, idle warps)
    let stride = (nw * 32) as i64;
    let acc = b.split_k_rounds_preloaded(slots, jloop, rounds, unroll, &u0, stride, units as i64, &load_w, &units_fma_pre);
    let sums: Vec<String> = acc.iter().map(|a| b.warp_sum(a)).collect();
    let c0 = b.op("arith.constant 0 : index");
    let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {first} {{"));
    let cper = b.op(&format!("arith.constant {slots} : index"));
    let wb = b.op(&format!("arith.muli {warp}, {cper} : index"));
    for (a, s) in sums.iter().enumerate() {
        let ca = b.op(&format!("arith.constant {a} : index"));
        let at = b.op(&format!("arith.addi {wb}, {ca} : index"));
        b.line(&format!("memref.store {s}, %red[{at}] : {smt}"));
    }
    b.line("}");
    b.line("gpu.barrier");
    if swiglu {
        // thread t < r/2 finishes column col0 + t: silu(gate sum t) * (up sum t + r/2)
        let ch64 = b.ci64(half as i64);
        let mine = b.op(&format!("arith.cmpi slt, {t64}, {ch64} : i64"));
        let col = b.op(&format!("arith.addi {col0}, {t64} : i64"));
        let inside = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
        let go = b.op(&format!("arith.andi {mine}, {inside} : i1"));
        b.line(&format!("scf.if {go} {{"));
        let chi = b.op(&format!("arith.constant {half} : index"));
        let tu = b.op(&format!("arith.addi {t}, {chi} : index"));
        let mut sums = vec![];
        for slot in [&t, &tu] {
            let mut total = String::new();
            for w in 0..nw {
                let cw = b.op(&format!("arith.constant {} : index", w * slots));
                let at = b.op(&format!("arith.addi {cw}, {slot} : index"));
                let v = b.op(&format!("memref.load %red[{at}] : {smt}"));
                total = if w == 0 { v } else { b.op(&format!("arith.addf {total}, {v} : f32")) };
            }
            sums.push(total);
        }
        if let Some(eps) = norm {
            // (the norm prologue: both sums scaled by 1/rms)
            let ss = b.norm_sum_of_squares(nw, slots, per, &smt);
            let inv = b.inv_rms(&ss, k, eps);
            for v in sums.iter_mut() {
                *v = b.op(&format!("arith.mulf {v}, {inv} : f32"));
            }
        }
        let s = unary_expr(b, UnaryOp::Silu, &sums[0])?;
        let y = b.op(&format!("arith.mulf {s}, {} : f32", sums[1]));
        b.matmul_store(&y, &row0, &col, false, false);
        b.line("}");
        return Ok(());
    }
    // thread t < r * mr finishes (row t / r, output t % r)
    let cper64 = b.ci64(per as i64);
    let mine = b.op(&format!("arith.cmpi slt, {t64}, {cper64} : i64"));
    b.line(&format!("scf.if {mine} {{"));
    let ti = b.op(&format!("arith.divui {t64}, {cr} : i64"));
    let tj = b.op(&format!("arith.remui {t64}, {cr} : i64"));
    let col = b.op(&format!("arith.addi {col0}, {tj} : i64"));
    let row = b.op(&format!("arith.addi {row0}, {ti} : i64"));
    let mut inside = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
    if mr > 1 {
        let rok = b.op(&format!("arith.cmpi slt, {row}, %m : i64"));
        inside = b.op(&format!("arith.andi {inside}, {rok} : i1"));
    }
    b.line(&format!("scf.if {inside} {{"));
    let mut total = String::new();
    for w in 0..nw {
        let cw = b.op(&format!("arith.constant {} : index", w * slots));
        let at = b.op(&format!("arith.addi {cw}, {t} : index"));
        let v = b.op(&format!("memref.load %red[{at}] : {smt}"));
        total = if w == 0 { v } else { b.op(&format!("arith.addf {total}, {v} : f32")) };
    }
    if let Some(eps) = norm {
        let ss = b.norm_sum_of_squares(nw, slots, per, &smt);
        let inv = b.inv_rms(&ss, k, eps);
        total = b.op(&format!("arith.mulf {total}, {inv} : f32"));
    }
    b.matmul_store(&total, &row, &col, bias, residual);
    b.line("}");
    b.line("}");
    Ok(())
}

/// The one-row GEMV for many short 16-bit rows (`KernelSpec::MatMulWide`: the lm_head of a
/// small model, 49,152 rows of 1,152 bytes for SmolLM2). The split-K GEMV gives such a
/// matrix 12,288 blocks of 4 rows whose threads mostly idle (72 units of a row over 128
/// threads) and re-load x each: 16.5 µs for 56.6 MB (3.4 TB/s). Here [`WIDE_LANES`] lanes take
/// a row (lane q: its units q, q + 8, ...: a warp's load instruction covers 4 rows' 128-byte
/// spans), so every lane holds the same share of x for all rows — loaded once, in registers
/// (with the norm prologue: scaled by g, the sum of squares over the row's 8 lanes) — and a
/// warp walks `groups` row groups of 32 / WIDE_LANES rows, its weights one stream of 16-byte
/// units of which `depth` are loaded ahead of the one being summed (the first ones before
/// `griddepcontrol.wait`: they do not depend on the previous kernel). Each row's sum: 4 accumulators per lane,
/// three xor shuffles; lane q = 0 stores. With the row gather (`RowGather`) x is row
/// `%idx[row]`.
pub(crate) fn emit_gemv_wide(b: &mut Body, k: usize, n: usize, wdtype: DType, bias: bool, residual: bool) -> Result<(), String> {
    let upl = k / 8 / WIDE_LANES; // 16-byte units per lane
    let rpw = 32 / WIDE_LANES; // rows per warp step
    let (groups, depth) = wide_tiling();
    // (the argmax's running (max, index) take the registers of one unit in flight: with the
    // norm the kernel spilled at 168)
    let depth = if b.argmax_fold { depth.saturating_sub(1).max(1) } else { depth };
    let nw = GEMV_WARPS;
    let opb = nw * rpw * groups;
    // (ptxas keeps to the registers 3 blocks of 128 threads per SM leave: the grid in one wave
    // on 132 SMs; x, g and the early weights would take ~230 with the norm prologue)
    b.launch_bounds = Some((128, 3));
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (bx64, by64, lane64, warp64) = (b.idx64(&bx), b.idx64(&by), b.idx64(&lane), b.idx64(&warp));
    let cl = b.ci64(WIDE_LANES as i64);
    let sub = b.op(&format!("arith.divui {lane64}, {cl} : i64"));
    let q = b.op(&format!("arith.remui {lane64}, {cl} : i64"));
    // row of group 0: the block's opb rows, the warp's rpw * groups of them, the lane's row
    let copb = b.ci64(opb as i64);
    let r0 = b.op(&format!("arith.muli {bx64}, {copb} : i64"));
    let cwr = b.ci64((rpw * groups) as i64);
    let wr = b.op(&format!("arith.muli {warp64}, {cwr} : i64"));
    let r0 = b.op(&format!("arith.addi {r0}, {wr} : i64"));
    let row0 = b.op(&format!("arith.addi {r0}, {sub} : i64"));
    let one = b.ci64(1);
    let nlast = b.op(&format!("arith.subi %n, {one} : i64"));
    let c16 = b.ci64(16);
    let qoff = b.op(&format!("arith.muli {q}, {c16} : i64"));
    let rowbytes = b.ci64((k * 2) as i64);
    let row_of = |b: &mut Body, g: usize| -> String {
        let c = b.ci64((g * rpw) as i64);
        b.op(&format!("arith.addi {row0}, {c} : i64"))
    };
    // group g's row base (clamped to the last row), then unit i of it: 4 words
    let group_base = |b: &mut Body, g: usize| -> String {
        let r = row_of(b, g);
        let r = b.op(&format!("arith.minsi {r}, {nlast} : i64"));
        let base = b.op(&format!("arith.muli {r}, {rowbytes} : i64"));
        b.op(&format!("arith.addi {base}, {qoff} : i64"))
    };
    let load_unit = |b: &mut Body, base: &str, i: usize| -> Vec<String> {
        let c = b.ci64((i * WIDE_LANES * 16) as i64);
        let off = b.op(&format!("arith.addi {base}, {c} : i64"));
        b.load_vec("%w", &off, 4, "i32", 16)
    };
    // the weights stream as one sequence of (group, unit) items, `depth` items loaded ahead of
    // the one being summed (the first ones before the PDL wait)
    let items = groups * upl;
    let mut bases: Vec<Option<String>> = vec![None; groups];
    let mut inflight = std::collections::VecDeque::new();
    let mut next = 0;
    let mut issue = |b: &mut Body, next: &mut usize, inflight: &mut std::collections::VecDeque<Vec<String>>, until: usize| {
        while *next < until.min(items) {
            let (g, i) = (*next / upl, *next % upl);
            if bases[g].is_none() {
                bases[g] = Some(group_base(b, g));
            }
            let base = bases[g].clone().unwrap_or_default();
            inflight.push_back(load_unit(b, &base, i));
            *next += 1;
        }
    };
    if b.pdl && !b.waited && b.o.gemv_preload {
        issue(b, &mut next, &mut inflight, depth);
        b.wait_for_previous();
    }
    // x's units q + 8i of the row (gathered: row idx[row]), 8 floats each
    let xrow = if b.row_gather { b.load_i32_as_i64("%idx", &by64) } else { by64.clone() };
    let cxr = b.ci64((k * 4) as i64);
    let xbase = b.op(&format!("arith.muli {xrow}, {cxr} : i64"));
    let c32 = b.ci64(32);
    let q32 = b.op(&format!("arith.muli {q}, {c32} : i64"));
    let mut xs: Vec<Vec<String>> = vec![];
    let mut eos = vec![];
    for i in 0..upl {
        let c = b.ci64((i * WIDE_LANES * 32) as i64);
        let eo = b.op(&format!("arith.addi {q32}, {c} : i64"));
        let xo = b.op(&format!("arith.addi {xbase}, {eo} : i64"));
        xs.push(b.load_f32s("%x", &xo, 8));
        eos.push(eo);
    }
    let inv = match b.norm {
        Some(eps) => {
            // (the sum of squares first, then g a unit at a time: x, g and the early weights
            // at once would not fit 168 registers)
            let sq: Vec<String> = xs.iter().flatten().map(|x| b.op(&format!("arith.mulf {x}, {x} : f32"))).collect();
            let ss = b.tree_reduce(&sq, "arith.addf");
            let offs: Vec<i32> = (0..WIDE_LANES.trailing_zeros()).map(|l| 1 << l).collect();
            let ss = b.xor_reduce(&ss, "arith.addf", &offs);
            for (xr, eo) in xs.iter_mut().zip(&eos) {
                let gr = b.load_f32s("%g", eo, 8);
                for (x, g) in xr.iter_mut().zip(&gr) {
                    *x = b.op(&format!("arith.mulf {x}, {g} : f32"));
                }
            }
            Some(b.inv_rms(&ss, k, eps))
        }
        None => None,
    };
    let zero = b.cf32(0.0);
    let c0 = b.ci64(0);
    let first = b.op(&format!("arith.cmpi eq, {q}, {c0} : i64"));
    let offs: Vec<i32> = (0..WIDE_LANES.trailing_zeros()).rev().map(|l| 1 << l).collect();
    // (ArgmaxFold: the lane's (max, first index) over its groups' rows, in increasing order)
    let (ninf, big) = if b.argmax_fold { (b.op("arith.constant 0xFF800000 : f32"), b.op("arith.constant 2147483647 : i32")) } else { Default::default() };
    let (mut av, mut ai) = (ninf.clone(), big.clone());
    for g in 0..groups {
        // 4 accumulators (one per word of a unit): chains of 2·upl fmas
        let mut acc = vec![zero.clone(); 4];
        for (i, xr) in xs.iter().enumerate() {
            issue(b, &mut next, &mut inflight, g * upl + i + 1 + depth);
            let words = inflight.pop_front().ok_or("the wide GEMV's schedule lost a unit")?;
            for (wi, word) in words.iter().enumerate() {
                let pair = match wdtype {
                    DType::BF16 => b.bf16_pair(word),
                    _ => b.f16_pair(word),
                };
                for (e, w) in pair.iter().enumerate() {
                    acc[wi] = b.op(&format!("llvm.intr.fma({w}, {}, {}) : (f32, f32, f32) -> f32", xr[2 * wi + e], acc[wi]));
                }
            }
        }
        let s = b.tree_reduce(&acc, "arith.addf");
        let s = b.xor_reduce(&s, "arith.addf", &offs);
        let s = match &inv {
            Some(inv) => b.op(&format!("arith.mulf {s}, {inv} : f32")),
            None => s,
        };
        let col = row_of(b, g);
        let inside = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
        let go = b.op(&format!("arith.andi {first}, {inside} : i1"));
        b.line(&format!("scf.if {go} {{"));
        b.matmul_store(&s, &by64, &col, bias, residual);
        b.line("}");
        if b.argmax_fold {
            let sv = b.op(&format!("arith.select {inside}, {s}, {ninf} : f32"));
            let ci = b.op(&format!("arith.trunci {col} : i64 to i32"));
            // (the lane's rows come in increasing order)
            (av, ai) = argmax_keep(b, &av, &ai, &sv, &ci);
        }
    }
    if b.argmax_fold {
        argmax_blocks_reduce(b, ("%apart", "%async", "%aids"), &t, &bx64, &by64, &av, &ai, n.div_ceil(opb), nw, &ninf, &big);
    }
    Ok(())
}

/// Bytes one lane of [`KernelSpec::PrefetchL2`] prefetches per instruction.
pub(crate) const PREFETCH_PIECE: usize = 64 << 10;

/// [`KernelSpec::PrefetchL2`]'s prologue: block (x, y) of the grid takes its share of `%pfb`
/// bytes of `%pf` (16-byte multiples), and lane l of its first warp prefetches pieces l, l +
/// 32, ... of [`PREFETCH_PIECE`] bytes into L2.
pub(crate) fn emit_l2_prefetch(b: &mut Body) {
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let gx = b.op("gpu.grid_dim x");
    let gy = b.op("gpu.grid_dim y");
    let bid = b.op(&format!("arith.muli {by}, {gx} : index"));
    let bid = b.op(&format!("arith.addi {bid}, {bx} : index"));
    let bid = b.idx64(&bid);
    let nb = b.op(&format!("arith.muli {gx}, {gy} : index"));
    let nb = b.idx64(&nb);
    let c1 = b.ci64(1);
    let c16 = b.ci64(16);
    let chunk = b.op(&format!("arith.addi %pfb, {nb} : i64"));
    let chunk = b.op(&format!("arith.subi {chunk}, {c1} : i64"));
    let chunk = b.op(&format!("arith.divui {chunk}, {nb} : i64"));
    let c15 = b.ci64(15);
    let chunk = b.op(&format!("arith.addi {chunk}, {c15} : i64"));
    let chunk = b.op(&format!("arith.divui {chunk}, {c16} : i64"));
    let chunk = b.op(&format!("arith.muli {chunk}, {c16} : i64"));
    let lo = b.op(&format!("arith.muli {bid}, {chunk} : i64"));
    let hi = b.op(&format!("arith.addi {lo}, {chunk} : i64"));
    let hi = b.op(&format!("arith.minui {hi}, %pfb : i64"));
    let tid = b.op("gpu.thread_id x");
    let c32 = b.op("arith.constant 32 : index");
    let lane = b.op(&format!("arith.cmpi ult, {tid}, {c32} : index"));
    b.line(&format!("scf.if {lane} {{"));
    let t = b.idx64(&tid);
    let piece = b.ci64(PREFETCH_PIECE as i64);
    let start = b.op(&format!("arith.muli {t}, {piece} : i64"));
    let start = b.op(&format!("arith.addi {lo}, {start} : i64"));
    let (starti, hii) = (b.op(&format!("arith.index_cast {start} : i64 to index")), b.op(&format!("arith.index_cast {hi} : i64 to index")));
    let stepi = b.op(&format!("arith.constant {} : index", 32 * PREFETCH_PIECE));
    let p = b.v();
    b.line(&format!("scf.for {p} = {starti} to {hii} step {stepi} {{"));
    let p64 = b.idx64(&p);
    let left = b.op(&format!("arith.subi {hi}, {p64} : i64"));
    let len = b.op(&format!("arith.minui {left}, {piece} : i64"));
    let len = b.op(&format!("arith.trunci {len} : i64 to i32"));
    let ptr = b.op(&format!("llvm.getelementptr %pf[{p64}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.bulk.prefetch.L2.global [$0], $1;\", \"l,r\" {ptr}, {len} : (!llvm.ptr<1>, i32) -> ()"));
    b.line("}");
    b.line("}");
}

/// What [`emit_gemv`] takes for `mr` rows a block: K a multiple of 32, a tiling within the
/// block's threads; the norm prologue (`o.norm`) and the gathered x (`o.gather_x`, 16-bit
/// weights) at one row; the SwiGLU epilogue at one row with an even tiling.
pub(crate) fn gemv_body_fits(k: usize, n: usize, wdtype: DType, mr: usize, o: Outer, swiglu: bool) -> Result<(), String> {
    if !k.is_multiple_of(32) {
        return Err(format!("matmul needs K a multiple of 32, got {k}"));
    }
    let (r, _) = gemv_tiling(k, n, mr);
    if r * mr > 32 * GEMV_WARPS {
        return Err(format!("GEMV tiling {r} outputs x {mr} rows exceeds the block's {} threads", 32 * GEMV_WARPS));
    }
    if o.norm && mr != 1 {
        return Err("the norm prologue is for the one-row decode GEMV".into());
    }
    if swiglu && (mr != 1 || r % 2 != 0) {
        return Err("the SwiGLU epilogue is for the one-row decode GEMV with an even tiling".into());
    }
    if o.gather_x && !(mr == 1 && matches!(wdtype, DType::BF16 | DType::F16)) {
        return Err("the gathered x needs the one-row GEMV over 16-bit weights".into());
    }
    Ok(())
}

/// Whether a decode GEMV kernel generates ([`fits`]): each wrapper's inner kernel, the flags it
/// sets passed down as its emitter sets them on the body.
pub(crate) fn gemv_fits(spec: &KernelSpec, o: Outer) -> Result<(), String> {
    let plain_float = |w: &DType| matches!(w, DType::F32 | DType::F16 | DType::BF16);
    match spec {
        KernelSpec::MatMulParts { inner, parts } => {
            parts_fit(inner, parts)?;
            fits_in(inner, o)
        }
        KernelSpec::NormMatMul { inner, .. } => {
            // (the int4 GEMV's one-row kernel: the norm applied where it stages x)
            let plain = |k: &KernelSpec| {
                matches!(k, KernelSpec::MatMul { wdtype: DType::F32 | DType::F16 | DType::BF16 | DType::Q4_1, bias: false, .. } | KernelSpec::MatMulPacked { tiles: 0, bias: false, .. })
            };
            let ok = match inner.as_ref() {
                KernelSpec::MatMulParts { inner: i, .. } => plain(i),
                KernelSpec::SwiGluGemv { .. } => true,
                // (the routed experts' gate/up as the SwiGLU GEMV: its x row is the token's)
                KernelSpec::MoeGateUp { d, inter, wdtype, .. } => crate::kernels::gate_up_gemv(*d, *inter, *wdtype),
                KernelSpec::MatMulWide { bias: false, .. } => true,
                other => plain(other),
            };
            if !ok {
                return Err(format!("the norm prologue needs a plain-float decode GEMV (or the SwiGLU GEMV) without bias, not {}", inner.symbol()));
            }
            fits_in(inner, Outer { norm: true, ..o })
        }
        KernelSpec::MatMul { k, n, wdtype, .. } if plain_float(wdtype) || *wdtype == DType::Q4_1 => gemv_body_fits(*k, *n, *wdtype, 1, o, false),
        KernelSpec::MatMul { k, wdtype, .. } if kquant_dtype(*wdtype) => kquant_fits(*k, *wdtype),
        KernelSpec::MatMul { k, wdtype, .. } => {
            if k % 32 != 0 {
                return Err(format!("matmul needs K a multiple of 32, got {k}"));
            }
            if !matches!(wdtype, DType::Q8_0 | DType::Q4_0 | DType::Q4_1) {
                return Err(format!("matmul weights in {wdtype} are not lowered yet"));
            }
            Ok(())
        }
        KernelSpec::MatMulWide { k, n, wdtype, bias, residual } => {
            wide_gemv_kernel_fits(*k, *wdtype)?;
            if o.argmax_fold && (*bias || *residual || o.act || *n > i32::MAX as usize) {
                return Err("the argmax folds into the wide GEMV without bias, residual or activation".into());
            }
            Ok(())
        }
        KernelSpec::MatMulFew { k, n, wdtype, rows, .. } => {
            if *wdtype != DType::F32 && !gemv_mma_weights(*wdtype) {
                return Err(format!("the batched GEMV takes f32/f16/bf16/q8_0/q4_0/q4_1 weights, not {wdtype}"));
            }
            if *rows != few_rows(*wdtype) {
                return Err(format!("the batched GEMV for {wdtype} takes {} rows per block, not {rows}", few_rows(*wdtype)));
            }
            if *wdtype == DType::F32 {
                gemv_body_fits(*k, *n, *wdtype, *rows, o, false)
            } else {
                gemv_mma_fits(*k, *wdtype)
            }
        }
        KernelSpec::PrefetchL2 { inner } => fits_in(inner, o),
        KernelSpec::ZeroFill { inner, .. } => {
            if !matches!(inner.as_ref(), KernelSpec::NormMatMul { .. } | KernelSpec::SwiGluDown { .. } | KernelSpec::Gather { .. } | KernelSpec::GatherX { .. }) {
                return Err(format!("the zero fill rides on the one-row GEMV with the norm prologue, the fused MLP or the embedding gather, not {}", inner.symbol()));
            }
            fits_in(inner, o)
        }
        KernelSpec::MatMulAct { inner, act } => {
            epilogue_act_fits(act.0)?;
            // (a plain matmul kernel: every family ends in `matmul_store`, which applies it)
            if !matches!(
                inner.as_ref(),
                KernelSpec::MatMul { .. }
                    | KernelSpec::MatMulWide { .. }
                    | KernelSpec::MatMulFew { .. }
                    | KernelSpec::MatMulFewX16 { .. }
                    | KernelSpec::MatMulMma { .. }
                    | KernelSpec::MatMulWgmma { .. }
                    | KernelSpec::MatMulPipe { .. }
            ) {
                return Err(format!("{} takes no activation epilogue", inner.symbol()));
            }
            fits_in(inner, Outer { act: true, ..o })
        }
        KernelSpec::GatherX { inner } => {
            let ok = match inner.as_ref() {
                KernelSpec::NormMatMul { inner: mm, .. } => match mm.as_ref() {
                    KernelSpec::MatMulParts { inner: core, .. } => matches!(core.as_ref(), KernelSpec::MatMul { wdtype: DType::BF16 | DType::F16, bias: false, residual: false, .. }),
                    KernelSpec::MatMul { wdtype: DType::BF16 | DType::F16, bias: false, residual: false, .. } => true,
                    _ => false,
                },
                _ => false,
            };
            if !ok {
                return Err(format!("the gathered x rides on the one-row 16-bit GEMV with the norm prologue, not {}", inner.symbol()));
            }
            fits_in(inner, Outer { gather_x: true, ..o })
        }
        KernelSpec::RowGather { inner } => {
            let wide = |k: &KernelSpec| matches!(k, KernelSpec::MatMulWide { .. });
            let ok = match inner.as_ref() {
                KernelSpec::RmsNorm { d, .. } | KernelSpec::RmsNormHalf { d, .. } => d % 4 == 0,
                KernelSpec::NormMatMul { inner: mm, .. } => wide(mm),
                other => wide(other),
            };
            if !ok {
                return Err(format!("the row gather rides on the block-per-row RMSNorm or the wide GEMV, not {}", inner.symbol()));
            }
            fits_in(inner, o)
        }
        KernelSpec::MatMulCopy { inner } => {
            if !matches!(inner.as_ref(), KernelSpec::MatMul { wdtype: DType::F32 | DType::F16 | DType::BF16 | DType::Q4_1, .. }) {
                return Err(format!("the output copy is for the plain-float or Q4_1 decode GEMV, not {}", inner.symbol()));
            }
            fits_in(inner, o)
        }
        KernelSpec::SwiGluGemv { k, f, wdtype } => {
            swiglu_fits(*k, *f, *wdtype)?;
            gemv_body_fits(*k, *f, *wdtype, 1, o, true)
        }
        other => Err(format!("`{}` is not one of the decode GEMV kernels", other.symbol())),
    }
}

/// The decode GEMV kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn gemv_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    gemv_fits(spec, b.outer())?;
    Ok(match spec {
        KernelSpec::MatMulParts { inner, parts } => emit_parts(b, inner, parts)?,
        KernelSpec::NormMatMul { inner, eps_bits } => {
            b.norm = Some(f32::from_bits(*eps_bits));
            emit_into(b, inner)?.replacen("%x: !llvm.ptr<1>, ", "%x: !llvm.ptr<1>, %g: !llvm.ptr<1>, ", 1)
        }
        KernelSpec::MatMul { k, n, wdtype, bias, residual } if matches!(wdtype, DType::F32 | DType::F16 | DType::BF16 | DType::Q4_1) => {
            emit_gemv(b, *k, *n, *wdtype, *bias, *residual, 1)?;
            matmul_params(*bias, *residual, false)
        }
        KernelSpec::MatMulWide { k, n, wdtype, bias, residual } => {
            emit_gemv_wide(b, *k, *n, *wdtype, *bias, *residual)?;
            matmul_params(*bias, *residual, false)
        }
        KernelSpec::MatMulFew { k, n, wdtype, bias, residual, rows } => {
            if *wdtype == DType::F32 {
                emit_gemv(b, *k, *n, *wdtype, *bias, *residual, *rows)?;
            } else {
                emit_gemv_mma(b, *k, *wdtype, *bias, *residual, false)?;
            }
            matmul_params(*bias, *residual, true)
        }
        KernelSpec::MatMul { k, wdtype, bias, residual, .. } if kquant_dtype(*wdtype) => {
            emit_kquant_gemv(b, *k, *wdtype, *bias, *residual);
            matmul_params(*bias, *residual, false)
        }
        KernelSpec::MatMul { k, n: _, wdtype, bias, residual } => {
            let nblk = k / 32;
            let Launch::WarpPerOutput { warps_per_block } = spec.launch() else { unreachable!() };
            let t = b.op("gpu.thread_id x");
            let bx = b.op("gpu.block_id x");
            let by = b.op("gpu.block_id y");
            let c32 = b.op("arith.constant 32 : index");
            let lane = b.op(&format!("arith.remui {t}, {c32} : index"));
            let warp = b.op(&format!("arith.divui {t}, {c32} : index"));
            let wpb = b.op(&format!("arith.constant {warps_per_block} : index"));
            let n0 = b.op(&format!("arith.muli {bx}, {wpb} : index"));
            let col = b.op(&format!("arith.addi {n0}, {warp} : index"));
            let col64 = b.idx64(&col);
            let row64 = b.idx64(&by);
            let ok = b.op(&format!("arith.cmpi slt, {col64}, %n : i64"));
            b.line(&format!("scf.if {ok} {{"));
            let nb = b.op(&format!("arith.constant {nblk} : index"));
            let zero = b.cf32(0.0);
            let acc = b.v();
            let (blk, a) = (b.v(), b.v());
            b.line(&format!("{acc} = scf.for {blk} = {lane} to {nb} step {c32} iter_args({a} = {zero}) -> (f32) {{"));
            let blk64 = b.idx64(&blk);
            let kk = b.ci64(*k as i64);
            let c32l = b.ci64(32);
            let xrow = b.op(&format!("arith.muli {row64}, {kk} : i64"));
            let xoff = b.op(&format!("arith.muli {blk64}, {c32l} : i64"));
            let xbase = b.op(&format!("arith.addi {xrow}, {xoff} : i64"));
            // 32 activations as 8 16-byte loads (rows are 128-byte aligned: K % 32 == 0)
            let c4l = b.ci64(4);
            let xbyte = b.op(&format!("arith.muli {xbase}, {c4l} : i64"));
            let mut xs = vec![];
            for q in 0..8 {
                let o = b.ci64(16 * q);
                let off = b.op(&format!("arith.addi {xbyte}, {o} : i64"));
                xs.extend(b.load_vec("%x", &off, 4, "f32", 16));
            }
            let nblk64 = b.ci64(nblk as i64);
            let wrow = b.op(&format!("arith.muli {col64}, {nblk64} : i64"));
            let gblk = b.op(&format!("arith.addi {wrow}, {blk64} : i64"));
            let part = match wdtype {
                DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => {
                    let bytes = wdtype.block().1 as i64;
                    let cb = b.ci64(bytes);
                    let base = b.op(&format!("arith.muli {gblk}, {cb} : i64"));
                    let d = b.f16_at_byte("%w", &base);
                    let qoff = match wdtype {
                        DType::Q4_1 => 4,
                        _ => 2,
                    };
                    // q[e] as f32, e in 0..32
                    let mut q = vec![String::new(); 32];
                    // the quant bytes: 4 aligned i32 loads for Q4_1 (20-byte blocks), else bytes
                    let mut bytes = vec![];
                    if *wdtype == DType::Q4_1 {
                        for wq in 0..4 {
                            let cj = b.ci64(qoff + 4 * wq);
                            let off = b.op(&format!("arith.addi {base}, {cj} : i64"));
                            let p = b.op(&format!("llvm.getelementptr %w[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                            let word = b.op(&format!("llvm.load {p} {{alignment = 4 : i64}} : !llvm.ptr<1> -> i32"));
                            for by in 0..4 {
                                let sh = b.op(&format!("arith.constant {} : i32", 8 * by));
                                let v = b.op(&format!("arith.shrui {word}, {sh} : i32"));
                                let m = b.op("arith.constant 255 : i32");
                                bytes.push(b.op(&format!("arith.andi {v}, {m} : i32")));
                            }
                        }
                    } else {
                        for j in 0..(if *wdtype == DType::Q8_0 { 32 } else { 16 }) {
                            let cj = b.ci64(qoff + j as i64);
                            let off = b.op(&format!("arith.addi {base}, {cj} : i64"));
                            bytes.push(b.u8_at_byte("%w", &off));
                        }
                    }
                    for (j, byte) in bytes.into_iter().enumerate() {
                        if *wdtype == DType::Q8_0 {
                            let t8 = b.op(&format!("arith.trunci {byte} : i32 to i8"));
                            q[j] = b.op(&format!("arith.sitofp {t8} : i8 to f32"));
                        } else {
                            let m15 = b.op("arith.constant 15 : i32");
                            let c4 = b.op("arith.constant 4 : i32");
                            let lo = b.op(&format!("arith.andi {byte}, {m15} : i32"));
                            let hi = b.op(&format!("arith.shrui {byte}, {c4} : i32"));
                            q[j] = b.op(&format!("arith.uitofp {lo} : i32 to f32"));
                            q[j + 16] = b.op(&format!("arith.uitofp {hi} : i32 to f32"));
                        }
                    }
                    let mut sq4 = vec![zero.clone(); 4];
                    let mut sx4 = vec![zero.clone(); 4];
                    for (e, (qe, x)) in q.iter().zip(&xs).enumerate() {
                        sq4[e % 4] = b.op(&format!("llvm.intr.fma({qe}, {x}, {}) : (f32, f32, f32) -> f32", sq4[e % 4]));
                        if *wdtype != DType::Q8_0 {
                            sx4[e % 4] = b.op(&format!("arith.addf {}, {x} : f32", sx4[e % 4]));
                        }
                    }
                    let sq = b.sum4(&sq4);
                    let sx = if *wdtype != DType::Q8_0 { b.sum4(&sx4) } else { zero.clone() };
                    let dq = b.op(&format!("arith.mulf {d}, {sq} : f32"));
                    match wdtype {
                        DType::Q8_0 => dq,
                        DType::Q4_0 => {
                            // d * sum((q - 8) x) = d * (sum q x - 8 sum x)
                            let c8 = b.cf32(8.0);
                            let e8 = b.op(&format!("arith.mulf {sx}, {c8} : f32"));
                            let de = b.op(&format!("arith.mulf {d}, {e8} : f32"));
                            b.op(&format!("arith.subf {dq}, {de} : f32"))
                        }
                        _ => {
                            let c2 = b.ci64(2);
                            let moff = b.op(&format!("arith.addi {base}, {c2} : i64"));
                            let m = b.f16_at_byte("%w", &moff);
                            b.op(&format!("llvm.intr.fma({m}, {sx}, {dq}) : (f32, f32, f32) -> f32"))
                        }
                    }
                }
                other => unreachable!("gemv_fits refuses {other} weights"),
            };
            let a2 = b.op(&format!("arith.addf {a}, {part} : f32"));
            b.line(&format!("scf.yield {a2} : f32"));
            b.line("}");
            let total = b.warp_sum(&acc);
            let c0 = b.op("arith.constant 0 : index");
            let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
            b.line(&format!("scf.if {first} {{"));
            b.matmul_store(&total, &row64, &col64, *bias, *residual);
            b.line("}");
            b.line("}");
            matmul_params(*bias, *residual, false)
        }
        KernelSpec::PrefetchL2 { inner } => {
            if b.pdl {
                emit_l2_prefetch(b);
                // (the one-token fused kernels wait themselves, past their own early loads)
                if !(matches!(inner.as_ref(), KernelSpec::QkvAttentionO { .. }) || inner.is_fused_mlp()) {
                    b.wait_for_previous();
                }
            }
            let params = emit_into(b, inner)?;
            format!("%pf: !llvm.ptr<1>, {params}, %pfb: i64")
        }
        KernelSpec::MatMulAct { inner, act } => {
            b.act = Some(act.0);
            emit_into(b, inner)?
        }
        KernelSpec::GatherX { inner } => {
            b.gather_x = true;
            let params = emit_into(b, inner)?;
            if !params.starts_with("%x: !llvm.ptr<1>, ") {
                return Err(format!("{}: x is not the first parameter", inner.symbol()));
            }
            format!("%table: !llvm.ptr<1>, %tok: !llvm.ptr<1>, {params}")
        }
        KernelSpec::RowGather { inner } => {
            b.row_gather = true;
            format!("%idx: !llvm.ptr<1>, {}", emit_into(b, inner)?)
        }
        KernelSpec::ZeroFill { inner, len } => {
            let params = emit_into(b, inner)?;
            // (at the end: every thread is past the PDL wait; grid x covers at least `len`
            // threads in any part of a merged GEMV — checked by the lowering)
            let t = b.op("gpu.thread_id x");
            let bx = b.op("gpu.block_id x");
            let nt = b.op("gpu.block_dim x");
            let i = b.op(&format!("arith.muli {bx}, {nt} : index"));
            let i = b.op(&format!("arith.addi {i}, {t} : index"));
            let i = b.idx64(&i);
            let cl = b.ci64(*len as i64);
            let mine = b.op(&format!("arith.cmpi slt, {i}, {cl} : i64"));
            b.line(&format!("scf.if {mine} {{"));
            let zero = b.cf32(0.0);
            b.store(&zero, "%z0", &i);
            b.store(&zero, "%z1", &i);
            b.line("}");
            format!("%z0: !llvm.ptr<1>, %z1: !llvm.ptr<1>, {params}")
        }
        KernelSpec::MatMulCopy { inner } => {
            b.copy_y = true;
            emit_into(b, inner)?.replacen("%y: !llvm.ptr<1>", "%y2: !llvm.ptr<1>, %y: !llvm.ptr<1>", 1)
        }
        KernelSpec::SwiGluGemv { k, f, wdtype } => {
            b.swiglu = true;
            emit_gemv(b, *k, *f, *wdtype, false, false, 1)?;
            "%x: !llvm.ptr<1>, %w0: !llvm.ptr<1>, %w1: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        other => return Err(format!("`{}` is not one of the decode GEMV kernels", other.symbol())),
    })
}

/// One element of a GGUF Q8_0 / Q4_0 / Q4_1 weight (blocks of 32: f16 d, [f16 m,] the quants)
/// at flat element `e` (i64) of `ptr`, as f32 (`Body::weight_elem`).
pub(crate) fn gguf_block_elem(b: &mut Body, ptr: &str, e: &str, dtype: DType) -> String {
    let c32 = b.ci64(32);
    let blk = b.op(&format!("arith.divui {e}, {c32} : i64"));
    let jj = b.op(&format!("arith.remui {e}, {c32} : i64"));
    let cb = b.ci64(dtype.block().1 as i64);
    let base = b.op(&format!("arith.muli {blk}, {cb} : i64"));
    let d = b.f16_at_byte(ptr, &base);
    if dtype == DType::Q8_0 {
        let c2 = b.ci64(2);
        let o = b.op(&format!("arith.addi {base}, {c2} : i64"));
        let o = b.op(&format!("arith.addi {o}, {jj} : i64"));
        let byte = b.u8_at_byte(ptr, &o);
        let t8 = b.op(&format!("arith.trunci {byte} : i32 to i8"));
        let q = b.op(&format!("arith.sitofp {t8} : i8 to f32"));
        b.op(&format!("arith.mulf {d}, {q} : f32"))
    } else {
        let c16 = b.ci64(16);
        let qo = b.ci64(if dtype == DType::Q4_1 { 4 } else { 2 });
        let jm = b.op(&format!("arith.remui {jj}, {c16} : i64"));
        let o = b.op(&format!("arith.addi {base}, {qo} : i64"));
        let o = b.op(&format!("arith.addi {o}, {jm} : i64"));
        let byte = b.u8_at_byte(ptr, &o);
        let hi_half = b.op(&format!("arith.cmpi uge, {jj}, {c16} : i64"));
        let c4 = b.op("arith.constant 4 : i32");
        let c0 = b.op("arith.constant 0 : i32");
        let sh = b.op(&format!("arith.select {hi_half}, {c4}, {c0} : i32"));
        let shifted = b.op(&format!("arith.shrui {byte}, {sh} : i32"));
        let m15 = b.op("arith.constant 15 : i32");
        let nib = b.op(&format!("arith.andi {shifted}, {m15} : i32"));
        let q = b.op(&format!("arith.uitofp {nib} : i32 to f32"));
        if dtype == DType::Q4_1 {
            let c2 = b.ci64(2);
            let mo = b.op(&format!("arith.addi {base}, {c2} : i64"));
            let m = b.f16_at_byte(ptr, &mo);
            b.op(&format!("llvm.intr.fma({d}, {q}, {m}) : (f32, f32, f32) -> f32"))
        } else {
            let c8 = b.cf32(8.0);
            let q8 = b.op(&format!("arith.subf {q}, {c8} : f32"));
            b.op(&format!("arith.mulf {d}, {q8} : f32"))
        }
    }
}
