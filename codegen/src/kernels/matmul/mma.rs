//! Tensor-core matmuls without the Hopper pipeline: the batched-decode GEMV on `mma.sync`
//! (16 outputs per block, x in f32 or 16 bits; 16-bit weights, or GGUF Q8_0/Q4_0/Q4_1 blocks
//! dequantized to f16 in registers next to the MMAs — docs/perf.md, "Quantized weights"), the
//! tiled `mma.sync` matmul, and the simple wgmma matmul.

use crate::kernels::*;

/// The readable symbol of a `mma` kernel (`KernelSpec::symbol`).
pub(crate) fn mma_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::MatMulFewX16 { k, n, wdtype, bias, residual } => format!("matmul_few32x16_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
        KernelSpec::MatMulMma { k, n, wdtype, bias, residual } => format!("matmul_mma_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
        KernelSpec::MatMulWgmma { k, n, wdtype, bias, residual, n_tile } => {
            format!("matmul_wgmma{n_tile}_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" })
        }
        other => unreachable!("{other:?} is not a mma kernel (kernels::family)"),
    }
}

/// How the runtime launches a `mma` kernel (`KernelSpec::launch`).
pub(crate) fn mma_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::MatMulFewX16 { .. } => {
            let (w, _, a) = gemv_mma_tiling3();
            Launch::OutputsPerBlock { outputs: 16 * a as u32, rows: GEMV_MMA_ROWS as u32, warps: w as u32 }
        }
        KernelSpec::MatMulMma { .. } => Launch::WarpPerTile { warps_per_block: 4 },
        KernelSpec::MatMulWgmma { n_tile, .. } => Launch::WarpgroupPerTile { n_tile: *n_tile as u32 },
        other => unreachable!("{other:?} is not a mma kernel (kernels::family)"),
    }
}

/// (warps per block, K steps unrolled) of the tensor-core batched GEMV.
pub fn gemv_mma_tiling() -> (usize, usize) {
    let (w, u, _) = gemv_mma_tiling3();
    (w, u)
}

/// (warps per block, K steps unrolled, 16-row A tiles per block) of the tensor-core batched
/// GEMV. (The emitter takes A > 1 — each block computing 16·A outputs, reusing every
/// activation fragment for A tiles — but no plan does: never measured better; the sweep knob
/// went with the environment variables.)
pub fn gemv_mma_tiling3() -> (usize, usize, usize) {
    // measured on the H200 (8B shape, b8/b32/b64 tok/s): (4,2) 795/1967/2998, (8,2)
    // 923/2357/2793, (4,4) 943/2092/2892, (8,4) 1034/2591/3019, (16,1) 993/2632/3044
    (8, 4, 1)
}

/// Activation rows per block of the tensor-core batched GEMV (`MatMulFew`, bf16/f16 weights):
/// four 8-column B tiles of `mma.m16n8k16`, 16 outputs per block.
pub const GEMV_MMA_ROWS: usize = 32;

/// The weights the tensor-core batched GEMV ([`emit_gemv_mma`]) reads: bf16/f16, or the GGUF
/// blocks Q8_0/Q4_0/Q4_1 and the K-quants' super-blocks dequantized in registers ([`MmaTiles`]).
pub fn gemv_mma_weights(wdtype: DType) -> bool {
    matches!(wdtype, DType::BF16 | DType::F16 | DType::Q8_0 | DType::Q4_0 | DType::Q4_1) || kquant_dtype(wdtype)
}

/// What [`emit_gemv_mma`] takes: [`gemv_mma_weights`], K a multiple of 32, a reduction within
/// 48 KB of shared memory.
pub(crate) fn gemv_mma_fits(k: usize, wdtype: DType) -> Result<(), String> {
    if !k.is_multiple_of(32) {
        return Err(format!("matmul needs K a multiple of 32, got {k}"));
    }
    if !gemv_mma_weights(wdtype) {
        return Err(format!("the tensor-core batched GEMV takes bf16/f16/q8_0/q4_0/q4_1 weights or a K-quant / 5-bit GGUF format, not {wdtype}"));
    }
    if kquant_dtype(wdtype) {
        kquant_fits(k, wdtype)?;
    }
    let (nw, _, na) = gemv_mma_tiling3();
    let per = 4 * (GEMV_MMA_ROWS / 8) * na;
    if nw * per * 32 * 4 > 48 * 1024 {
        return Err(format!("batched GEMV tiling: {nw} warps x {na} A tiles need {} KB of shared memory for the reduction (max 48)", nw * per * 32 * 4 / 1024));
    }
    Ok(())
}

/// Whether a tensor-core matmul generates ([`fits`]): K and the weight types each kernel
/// takes, wgmma's column tiles of 16 or 64.
pub(crate) fn mma_fits(spec: &KernelSpec) -> Result<(), String> {
    let lowered = |w: &DType| matches!(w, DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::I4G128 | DType::F8G128) || kquant_dtype(*w);
    match spec {
        KernelSpec::MatMulFewX16 { k, wdtype, .. } => gemv_mma_fits(*k, *wdtype),
        KernelSpec::MatMulMma { k, wdtype, .. } => {
            if k % 16 != 0 {
                return Err(format!("the tensor-core matmul needs K a multiple of 16, got {k}"));
            }
            if !lowered(wdtype) {
                return Err(format!("matmul weights in {wdtype} are not lowered yet"));
            }
            Ok(())
        }
        KernelSpec::MatMulWgmma { k, wdtype, n_tile, .. } => {
            if *n_tile != 16 && *n_tile != 64 {
                return Err(format!("wgmma n_tile must be 16 or 64, got {n_tile}"));
            }
            if k % 64 != 0 {
                return Err(format!("the wgmma matmul needs K a multiple of 64, got {k}"));
            }
            if !lowered(wdtype) {
                return Err(format!("matmul weights in {wdtype} are not lowered yet"));
            }
            Ok(())
        }
        other => Err(format!("`{}` is not one of the tensor-core (mma.sync, wgmma) matmul kernels", other.symbol())),
    }
}

/// The batched-decode matmul on the tensor cores for bf16/f16 weights and GGUF blocks (see
/// [`MmaTiles`]) ("swap AB"): y^T = W x^T
/// with `mma.sync m16n8k16`, W as the 16-row A operand and up to 32 activation rows as four
/// 8-column B tiles. One block of [`gemv_mma_tiling`] warps per 16 outputs and 32 rows (grid
/// (ceil(N / 16), ceil(M / 32))); the warps split K in 32-wide steps (warp w: steps w, w + W,
/// ...), two steps per loop iteration with their loads issued first.
///
/// Because a dot product does not care in which order K is walked, the operands are laid out
/// so every lane does plain 16-byte loads: lane (g = lane / 4, t = lane % 4) loads elements
/// 8t..8t+8 of a step from W rows g and g + 8 (rows 64 bytes apart per 4 lanes: full sectors)
/// and from activation row g of each live B tile, and the fragment's logical k = 2t + e and
/// 2t + 8 + e map to physical 8t + e and 8t + 2 + e (first MMA) and 8t + 4 + e, 8t + 6 + e (second).
/// B tiles past M are skipped (a warp-uniform branch); partial sums meet in shared memory and
/// warp 0 runs the epilogue.
pub(crate) fn emit_gemv_mma(b: &mut Body, k: usize, wdtype: DType, bias: bool, residual: bool, x16: bool) -> Result<(), String> {
    gemv_mma_fits(k, wdtype)?;
    let f16 = tensor_core_f16(wdtype);
    // (GGUF blocks: one per K step and row; the nibble formats give lane t elements 4t.. and
    // 16+4t.., the others 8t..8t+7)
    let packed = wdtype.is_packed();
    let nibbles = matches!(wdtype, DType::Q4_0 | DType::Q4_1);
    let (nw, unroll, na) = gemv_mma_tiling3();
    let nt = GEMV_MMA_ROWS / 8; // B tiles
    let steps = k / 32;
    let (jloop, rounds) = split_k_schedule(steps, 1, nw, unroll);
    // accumulators per lane: [A tile a][B tile j][4] at a * 4 nt + 4 j + i
    let per = 4 * nt * na;
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", nw * per * 32);
    b.workgroup = Some(format!("%red : {smt}"));
    let MmaLane { lane, warp, bx64, by64, warp64, g, tq, .. } = mma_lane(b);
    let cout = b.ci64(16 * na as i64);
    let col0 = b.op(&format!("arith.muli {bx64}, {cout} : i64"));
    let cmt = b.ci64(GEMV_MMA_ROWS as i64);
    let row0 = b.op(&format!("arith.muli {by64}, {cmt} : i64"));
    let one = b.ci64(1);
    let nlast = b.op(&format!("arith.subi %n, {one} : i64"));
    let mlast = b.op(&format!("arith.subi %m, {one} : i64"));
    // this lane's first element within a step: 8t (16-bit weights), 4t (Q4_1: and 16 + 4t);
    // its weights' byte offset inside a step: 16t, or 4 + 4t inside the Q4_1 block
    let c8 = b.ci64(if nibbles { 4 } else { 8 });
    let e0 = b.op(&format!("arith.muli {tq}, {c8} : i64"));
    let wrowbytes = b.ci64(if packed { (k / wdtype.block().0 * wdtype.block().1) as i64 } else { (k * 2) as i64 });
    // (a block's quants start past its f16 d, and for Q4_1 its f16 min; K-quants: the lane's
    // 8 values' offset 8t, from which `kquant_step_words` finds them)
    let chdr = b.ci64(match wdtype {
        DType::Q4_1 => 4,
        d if kquant_dtype(d) => 0,
        _ => 2,
    });
    let qoff = packed.then(|| b.op(&format!("arith.addi {e0}, {chdr} : i64")));
    // A tile a's rows g and g + 8: wbase[2 a], wbase[2 a + 1]
    let wbase: Vec<String> = (0..na)
        .flat_map(|a| [16 * a as i64, 16 * a as i64 + 8])
        .map(|d| {
            let cd = b.ci64(d);
            let r = b.op(&format!("arith.addi {col0}, {g} : i64"));
            let r = b.op(&format!("arith.addi {r}, {cd} : i64"));
            let r = b.op(&format!("arith.minsi {r}, {nlast} : i64"));
            let o = b.op(&format!("arith.muli {r}, {wrowbytes} : i64"));
            let eb = match &qoff {
                Some(q) => q.clone(),
                None => {
                    let c2 = b.ci64(2);
                    b.op(&format!("arith.muli {e0}, {c2} : i64"))
                }
            };
            b.op(&format!("arith.addi {o}, {eb} : i64"))
        })
        .collect();
    // (x16: x in 16 bits, the lane's 8 elements one 16-byte load already in pairs)
    let xsz = if x16 { 2 } else { 4 };
    let xrowbytes = b.ci64((k * xsz) as i64);
    let cxsz = b.ci64(xsz as i64);
    let mut xbase = vec![];
    let mut live = vec![];
    for j in 0..nt {
        let cj = b.ci64(8 * j as i64);
        let r0j = b.op(&format!("arith.addi {row0}, {cj} : i64"));
        live.push(b.op(&format!("arith.cmpi slt, {r0j}, %m : i64")));
        let r = b.op(&format!("arith.addi {r0j}, {g} : i64"));
        let r = b.op(&format!("arith.minsi {r}, {mlast} : i64"));
        let o = b.op(&format!("arith.muli {r}, {xrowbytes} : i64"));
        let eb = b.op(&format!("arith.muli {e0}, {cxsz} : i64"));
        xbase.push(b.op(&format!("arith.addi {o}, {eb} : i64")));
    }
    let tiles = MmaTiles { w: wbase.chunks(2).map(|c| ("%w".to_string(), c[0].clone(), c[1].clone())).collect(), x: xbase, live, x16, f16, split: false, packed: qoff.map(|o| (wdtype, o)) };
    let load_w = |b: &mut Body, s: &str| tiles.load_w(b, s);
    let steps_mma_pre = |b: &mut Body, ss: &[String], acc: &[String], pre: Option<&[Vec<Vec<Vec<String>>>]>| tiles.steps(b, ss, acc, pre);
    // K steps: warp w takes steps w, w + W, ...; the last rounds are guarded (idle warps)
    let acc = b.split_k_rounds_preloaded(per, jloop, rounds, unroll, &warp64, nw as i64, steps as i64, &load_w, &steps_mma_pre);
    // partial sums to shared memory at [warp][value][lane]; warp 0 adds them up and stores
    MmaTiles::meet_in_shared(b, &acc, &warp, &lane, per, &smt);
    // D fragment of tile j: value i at output col0 + g (+ 8 for i >= 2), row 8j + 2t + i % 2
    let c2 = b.ci64(2);
    let t2 = b.op(&format!("arith.muli {tq}, {c2} : i64"));
    for (a, part) in acc.iter().enumerate() {
        let total = MmaTiles::warps_total(b, part, a, nw, per, &lane, &smt);
        MmaTiles::store_swap_ab(b, &total, a, nt, (&col0, &g), (&row0, &t2), bias, residual);
    }
    b.line("}");
    Ok(())
}

/// The K loop of the `mma.sync` GEMVs ("swap AB": weights as the 16-row A operand, up to
/// [`GEMV_MMA_ROWS`] activation rows as 8-column B tiles), for [`emit_gemv_mma`] and the
/// grouped routed experts (`kernels::moe`): each A tile's weight pointer and the byte offsets
/// of this lane's 8 elements of K step 0 in its rows g and g + 8; each B tile's x offset (its
/// row g) and whether it is live (tile 0 always is; a dead tile is skipped, warp-uniformly).
/// x in 16 bits (`x16`: one 16-byte load per step, already in pairs) or f32 (two, packed;
/// with `split` as two 16-bit halves, hi = x rounded and lo = x − hi, each its own MMA: the
/// product of 16-bit weights and f32 x to ~2^-16 instead of bf16's 2^-8, for twice the MMAs of
/// a memory-bound kernel).
///
/// GGUF block weights (`packed`: Q8_0, Q4_0 or Q4_1 and this lane's byte offset of its quants
/// inside a block, i64): a K step is one block per row, its f16 d (and Q4_1's min) loaded
/// beside the quants and [`Body::gguf_f16_words`] dequantizing them to f16 pairs next to the
/// MMAs. Q8_0: the lane's 8 elements are 8t..8t+7 (two words at 2 + 8t, 2-byte aligned), as
/// for 16-bit weights; Q4_0/Q4_1: 4t..4t+3 and 16+4t..16+4t+3 (one word of nibbles at
/// 2 + 4t / 4 + 4t), and x is loaded in that order (its offsets in `x` at element 4t).
pub(crate) struct MmaTiles {
    pub w: Vec<(String, String, String)>,
    pub x: Vec<String>,
    pub live: Vec<String>,
    pub x16: bool,
    pub f16: bool,
    pub split: bool,
    pub packed: Option<(DType, String)>,
}

/// A swap-AB MMA GEMV block's indices (the packed and batched GEMVs): the thread, its lane
/// and warp (index), block x and y, the warp as i64, and the lane's fragment row
/// g = lane / 4 and column pair t = lane % 4 (i64).
pub(crate) struct MmaLane {
    pub t: String,
    pub lane: String,
    pub warp: String,
    pub bx64: String,
    pub by64: String,
    pub warp64: String,
    pub g: String,
    pub tq: String,
}

pub(crate) fn mma_lane(b: &mut Body) -> MmaLane {
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (bx64, by64, lane64, warp64) = (b.idx64(&bx), b.idx64(&by), b.idx64(&lane), b.idx64(&warp));
    let c4 = b.ci64(4);
    let g = b.op(&format!("arith.divui {lane64}, {c4} : i64"));
    let tq = b.op(&format!("arith.remui {lane64}, {c4} : i64"));
    MmaLane { t, lane, warp, bx64, by64, warp64, g, tq }
}

impl MmaTiles {
    /// Byte offsets of this lane's 8 elements of K step 0 (`e0` = 8 · (lane % 4)) in rows g
    /// and g + 8 of the 16-row A tile at row `col0` (+ `dd`) of a 16-bit [rows, K] matrix
    /// starting at row `base` (an expert's or a head's), rows past `nlast` clamped to it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn row_offsets(b: &mut Body, base: &str, col0: &str, g: &str, nlast: &str, e0: &str, k: usize, dd: i64) -> (String, String) {
        let wrowbytes = b.ci64((k * 2) as i64);
        let c2 = b.ci64(2);
        let eb = b.op(&format!("arith.muli {e0}, {c2} : i64"));
        let mut at = |d: i64| {
            let cd = b.ci64(d);
            let r = b.op(&format!("arith.addi {col0}, {g} : i64"));
            let r = b.op(&format!("arith.addi {r}, {cd} : i64"));
            let r = b.op(&format!("arith.minsi {r}, {nlast} : i64"));
            let r = b.op(&format!("arith.addi {r}, {base} : i64"));
            let o = b.op(&format!("arith.muli {r}, {wrowbytes} : i64"));
            b.op(&format!("arith.addi {o}, {eb} : i64"))
        };
        (at(dd), at(dd + 8))
    }

    /// The warps' accumulators `acc` (`per` a lane) to the shared `%red` (type `smt`) at
    /// [warp][value][lane], a barrier, then `scf.if warp == 0` opened (close it): the caller
    /// adds the warps' values with [`MmaTiles::warps_total`].
    pub(crate) fn meet_in_shared(b: &mut Body, acc: &[String], warp: &str, lane: &str, per: usize, smt: &str) {
        let cper = b.op(&format!("arith.constant {} : index", per * 32));
        let wb = b.op(&format!("arith.muli {warp}, {cper} : index"));
        for (a, v) in acc.iter().enumerate() {
            let ca = b.op(&format!("arith.constant {} : index", a * 32));
            let at = b.op(&format!("arith.addi {wb}, {ca} : index"));
            let at = b.op(&format!("arith.addi {at}, {lane} : index"));
            b.line(&format!("memref.store {v}, %red[{at}] : {smt}"));
        }
        b.line("gpu.barrier");
        let c0 = b.op("arith.constant 0 : index");
        let w0 = b.op(&format!("arith.cmpi eq, {warp}, {c0} : index"));
        b.line(&format!("scf.if {w0} {{"));
    }

    /// In warp 0 after [`MmaTiles::meet_in_shared`]: value `a`'s sum over the `nw` warps (warp
    /// 0's own `own` first).
    pub(crate) fn warps_total(b: &mut Body, own: &str, a: usize, nw: usize, per: usize, lane: &str, smt: &str) -> String {
        let mut total = own.to_string();
        for w in 1..nw {
            let ca = b.op(&format!("arith.constant {} : index", (w * per + a) * 32));
            let at = b.op(&format!("arith.addi {ca}, {lane} : index"));
            let v = b.op(&format!("memref.load %red[{at}] : {smt}"));
            total = b.op(&format!("arith.addf {total}, {v} : f32"));
        }
        total
    }

    /// Store value `a` of a swap-AB accumulator set (A tile `a / (4 nt)`, B tile `a / 4 % nt`,
    /// fragment element `a % 4`) once summed: output column col0 + g + 16 (A tile) (+ 8 for
    /// elements 2, 3), row row0 + 2t + 8 (B tile) + a % 2, guarded by N and M.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn store_swap_ab(b: &mut Body, total: &str, a: usize, nt: usize, (col0, g): (&str, &str), (row0, t2): (&str, &str), bias: bool, residual: bool) {
        let (at, j, i) = (a / (4 * nt), (a / 4) % nt, a % 4);
        let co = b.ci64(16 * at as i64 + if i >= 2 { 8 } else { 0 });
        let col = b.op(&format!("arith.addi {col0}, {g} : i64"));
        let col = b.op(&format!("arith.addi {col}, {co} : i64"));
        let cr = b.ci64((8 * j + i % 2) as i64);
        let row = b.op(&format!("arith.addi {row0}, {t2} : i64"));
        let row = b.op(&format!("arith.addi {row}, {cr} : i64"));
        let okc = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
        let okr = b.op(&format!("arith.cmpi slt, {row}, %m : i64"));
        let ok = b.op(&format!("arith.andi {okc}, {okr} : i1"));
        b.line(&format!("scf.if {ok} {{"));
        b.matmul_store(total, &row, &col, bias, residual);
        b.line("}");
    }

    /// The weights of the 32-wide K step `s` (i64 step index): [A tile][row g, row g + 8][4 words]
    /// (GGUF blocks: [quant words.., header] per row, dequantized by [`MmaTiles::a_words`].)
    pub(crate) fn load_w(&self, b: &mut Body, s: &str) -> Vec<Vec<Vec<String>>> {
        if let Some((d, lane_off)) = self.packed.as_ref().filter(|(d, _)| kquant_dtype(*d)) {
            // (super-blocks of 8 steps: the row's start is this lane's offset less its 8t)
            return self
                .w
                .iter()
                .map(|(ptr, g0, g8)| {
                    [g0, g8]
                        .iter()
                        .map(|base| {
                            let rowb = b.op(&format!("arith.subi {base}, {lane_off} : i64"));
                            kquant_step_words(b, ptr, *d, &rowb, lane_off, s)
                        })
                        .collect()
                })
                .collect();
        }
        let cb = b.ci64(self.packed.as_ref().map_or(64, |(d, _)| d.block().1 as i64));
        let so = b.op(&format!("arith.muli {s}, {cb} : i64"));
        self.w
            .iter()
            .map(|(ptr, g0, g8)| {
                [g0, g8]
                    .iter()
                    .map(|base| {
                        let off = b.op(&format!("arith.addi {base}, {so} : i64"));
                        match &self.packed {
                            Some((d, lane_off)) => {
                                // (Q8_0 and Q4_0 blocks are 2-byte aligned: their words load in halves)
                                let (n, al) = match d {
                                    DType::Q4_1 => (1, 4),
                                    DType::Q4_0 => (1, 2),
                                    _ => (2, 2),
                                };
                                let mut w = b.load_vec(ptr, &off, n, "i32", al);
                                let hoff = b.op(&format!("arith.subi {off}, {lane_off} : i64"));
                                w.push(b.load_vec(ptr, &hoff, 1, if *d == DType::Q4_1 { "i32" } else { "i16" }, al).remove(0));
                                w
                            }
                            None => b.load_vec(ptr, &off, 4, "i32", 16),
                        }
                    })
                    .collect()
            })
            .collect()
    }

    /// One row's A words of a K step as [`MmaTiles::load_w`] loaded them: the 4 words the
    /// MMAs take (half h: words 2h and 2h + 1).
    fn a_words(&self, b: &mut Body, raw: &[String]) -> Vec<String> {
        match &self.packed {
            Some((d, _)) if kquant_dtype(*d) => kquant_step_values(b, *d, raw).to_vec(),
            Some((d, _)) => b.gguf_f16_words(*d, raw).to_vec(),
            None => raw.to_vec(),
        }
    }

    /// The MMAs of the 32-wide K steps `ss` (i64 step indices) into `acc` ([A tile a][B tile
    /// j][4] at a · 4 nt + 4 j + i), with their weights loaded here or (`pre`) already.
    pub(crate) fn steps(&self, b: &mut Body, ss: &[String], acc: &[String], pre: Option<&[Vec<Vec<Vec<String>>>]>) -> Vec<String> {
        let (na, nt) = (self.w.len(), self.x.len());
        let ty = if self.f16 { "f16" } else { "bf16" };
        let xsz = if self.x16 { 2 } else { 4 };
        let raw: Vec<Vec<Vec<Vec<String>>>> = match pre {
            Some(p) => p.to_vec(),
            None => ss.iter().map(|s| self.load_w(b, s)).collect(),
        };
        let ws: Vec<Vec<Vec<Vec<String>>>> = raw.iter().map(|step| step.iter().map(|tile| tile.iter().map(|row| self.a_words(b, row)).collect()).collect()).collect();
        let mut out = acc.to_vec();
        for j in 0..nt {
            // this B tile's accumulators of every A tile
            let idx: Vec<usize> = (0..na).flat_map(|a| (0..4).map(move |i| a * 4 * nt + 4 * j + i)).collect();
            let cur: Vec<String> = idx.iter().map(|&i| out[i].clone()).collect();
            let f32s = vec!["f32"; cur.len()].join(", ");
            let res = if j > 0 {
                let res = b.v();
                b.line(&format!("{res}:{} = scf.if {} -> ({f32s}) {{", cur.len(), self.live[j]));
                Some(res)
            } else {
                None
            };
            let mut xs = vec![];
            for s in ss {
                let cb = b.ci64(32 * xsz as i64);
                let so = b.op(&format!("arith.muli {s}, {cb} : i64"));
                let off = b.op(&format!("arith.addi {}, {so} : i64", self.x[j]));
                if matches!(self.packed, Some((DType::Q4_0 | DType::Q4_1, _))) {
                    // elements 4t..4t+3 and 16+4t..16+4t+3, as the words pair them
                    let c16e = b.ci64(16 * xsz as i64);
                    let off2 = b.op(&format!("arith.addi {off}, {c16e} : i64"));
                    if self.x16 {
                        let mut u = b.load_vec("%x", &off, 2, "i32", 8);
                        u.extend(b.load_vec("%x", &off2, 2, "i32", 8));
                        let w = vec![b.prmt(&u[0], &u[1], 0x5410), b.prmt(&u[0], &u[1], 0x7632), b.prmt(&u[2], &u[3], 0x5410), b.prmt(&u[2], &u[3], 0x7632)];
                        xs.push(w);
                    } else {
                        let mut v = b.load_vec("%x", &off, 4, "f32", 16);
                        v.extend(b.load_vec("%x", &off2, 4, "f32", 16));
                        xs.push([0, 2, 1, 3, 4, 6, 5, 7].iter().map(|&i| v[i].clone()).collect());
                    }
                    continue;
                }
                if self.x16 {
                    xs.push(b.load_vec("%x", &off, 4, "i32", 16));
                    continue;
                }
                let mut v = b.load_vec("%x", &off, 4, "f32", 16);
                let c16b = b.ci64(16);
                let off2 = b.op(&format!("arith.addi {off}, {c16b} : i64"));
                v.extend(b.load_vec("%x", &off2, 4, "f32", 16));
                xs.push(v);
            }
            let mut c = cur.clone();
            for (si, x) in xs.iter().enumerate() {
                for half in 0..2 {
                    // the B fragment once, for every A tile (and, split, the rounding's remainder)
                    let mut frags = vec![];
                    if self.x16 {
                        frags.push((x[2 * half].clone(), x[2 * half + 1].clone()));
                    } else {
                        let v = &x[4 * half..4 * half + 4];
                        let (b0, b1) = (b.pack2(&v[0], &v[1], self.f16), b.pack2(&v[2], &v[3], self.f16));
                        if self.split {
                            let mut rest = vec![];
                            for (word, pair) in [(&b0, &v[0..2]), (&b1, &v[2..4])] {
                                let hi = if self.f16 { b.f16_pair(word) } else { b.bf16_pair(word) };
                                for (xv, h) in pair.iter().zip(&hi) {
                                    rest.push(b.op(&format!("arith.subf {xv}, {h} : f32")));
                                }
                            }
                            let lo = (b.pack2(&rest[0], &rest[1], self.f16), b.pack2(&rest[2], &rest[3], self.f16));
                            frags.push((b0, b1));
                            frags.push(lo);
                        } else {
                            frags.push((b0, b1));
                        }
                    }
                    for (b0, b1) in &frags {
                        for a in 0..na {
                            let w = &ws[si][a];
                            let av = [w[0][2 * half].as_str(), &w[1][2 * half], &w[0][2 * half + 1], &w[1][2 * half + 1]];
                            let acc = [c[4 * a].clone(), c[4 * a + 1].clone(), c[4 * a + 2].clone(), c[4 * a + 3].clone()];
                            let out = b.mma_m16n8k16(ty, av, b0, b1, [&acc[0], &acc[1], &acc[2], &acc[3]]);
                            c[4 * a..4 * a + 4].clone_from_slice(&out);
                        }
                    }
                }
            }
            match res {
                Some(res) => {
                    b.line(&format!("scf.yield {} : {f32s}", c.join(", ")));
                    b.line("} else {");
                    b.line(&format!("scf.yield {} : {f32s}", cur.join(", ")));
                    b.line("}");
                    for (q, &i) in idx.iter().enumerate() {
                        out[i] = format!("{res}#{q}");
                    }
                }
                None => {
                    for (q, &i) in idx.iter().enumerate() {
                        out[i] = c[q].clone();
                    }
                }
            }
        }
        out
    }
}

/// The tensor-core (mma.sync, wgmma) matmul kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn mma_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    mma_fits(spec)?;
    Ok(match spec {
        KernelSpec::MatMulFewX16 { k, n: _, wdtype, bias, residual } => {
            emit_gemv_mma(b, *k, *wdtype, *bias, *residual, true)?;
            matmul_params(*bias, *residual, true)
        }
        KernelSpec::MatMulMma { k, n: _, wdtype, bias, residual } => {
            // f16 operands for f16 and block-quantized weights (their f16 scales dequantize
            // exactly enough in f16; 4x finer than bf16), bf16 for bf16 and f32 weights
            let f16 = tensor_core_f16(*wdtype);
            let Launch::WarpPerTile { warps_per_block } = spec.launch() else { unreachable!() };
            let t = b.op("gpu.thread_id x");
            let bx = b.op("gpu.block_id x");
            let by = b.op("gpu.block_id y");
            let (lane, warp) = b.lane_warp(&t);
            let lane = b.idx64(&lane);
            let warp = b.idx64(&warp);
            let bx = b.idx64(&bx);
            let by = b.idx64(&by);
            let c4 = b.ci64(4);
            let c2 = b.ci64(2);
            let c8 = b.ci64(8);
            let c16 = b.ci64(16);
            let g = b.op(&format!("arith.divui {lane}, {c4} : i64"));
            let tig = b.op(&format!("arith.remui {lane}, {c4} : i64"));
            let wpb = b.ci64(warps_per_block as i64);
            let tile = b.op(&format!("arith.muli {bx}, {wpb} : i64"));
            let tile = b.op(&format!("arith.addi {tile}, {warp} : i64"));
            let n0 = b.op(&format!("arith.muli {tile}, {c8} : i64"));
            let m0 = b.op(&format!("arith.muli {by}, {c16} : i64"));
            let ok = b.op(&format!("arith.cmpi slt, {n0}, %n : i64"));
            b.line(&format!("scf.if {ok} {{"));
            let kk = b.ci64(*k as i64);
            // A rows this lane loads: m0 + g and m0 + g + 8 (clamped; masked rows read row 0)
            let ra = b.op(&format!("arith.addi {m0}, {g} : i64"));
            let rb = b.op(&format!("arith.addi {ra}, {c8} : i64"));
            let c0 = b.ci64(0);
            let va = b.op(&format!("arith.cmpi slt, {ra}, %m : i64"));
            let vb = b.op(&format!("arith.cmpi slt, {rb}, %m : i64"));
            let ra_s = b.op(&format!("arith.select {va}, {ra}, {c0} : i64"));
            let rb_s = b.op(&format!("arith.select {vb}, {rb}, {c0} : i64"));
            let xa = b.op(&format!("arith.muli {ra_s}, {kk} : i64"));
            let xb = b.op(&format!("arith.muli {rb_s}, {kk} : i64"));
            // B column (W row) this lane loads: n0 + g
            let wn = b.op(&format!("arith.addi {n0}, {g} : i64"));
            let wrow = b.op(&format!("arith.muli {wn}, {kk} : i64"));
            let tig2 = b.op(&format!("arith.muli {tig}, {c2} : i64"));
            let zero = b.cf32(0.0);
            let c1 = b.ci64(1);
            let ki = b.op(&format!("arith.constant {k} : index"));
            let zi = b.op("arith.constant 0 : index");
            let si = b.op("arith.constant 16 : index");
            let res = b.v();
            let kv = b.v();
            let accs: Vec<String> = (0..4).map(|_| b.v()).collect();
            b.line(&format!("{res}:4 = scf.for {kv} = {zi} to {ki} step {si} iter_args({}) -> (f32, f32, f32, f32) {{", accs.iter().map(|a| format!("{a} = {zero}")).collect::<Vec<_>>().join(", ")));
            let k0 = b.idx64(&kv);
            let kc = b.op(&format!("arith.addi {k0}, {tig2} : i64"));
            let kc8 = b.op(&format!("arith.addi {kc}, {c8} : i64"));
            // A fragment: (ra, kc..kc+1), (rb, kc..), (ra, kc+8..), (rb, kc+8..)
            let mut areg = vec![];
            for (xr, valid, col) in [(&xa, &va, &kc), (&xb, &vb, &kc), (&xa, &va, &kc8), (&xb, &vb, &kc8)] {
                let i0 = b.op(&format!("arith.addi {xr}, {col} : i64"));
                let i1 = b.op(&format!("arith.addi {i0}, {c1} : i64"));
                let x0 = b.load("%x", &i0);
                let x1 = b.load("%x", &i1);
                let x0 = b.op(&format!("arith.select {valid}, {x0}, {zero} : f32"));
                let x1 = b.op(&format!("arith.select {valid}, {x1}, {zero} : f32"));
                areg.push(b.pack2(&x0, &x1, f16));
            }
            // B fragment: W[wn, kc..kc+1], W[wn, kc+8..kc+9]
            let mut breg = vec![];
            for col in [&kc, &kc8] {
                let e0 = b.op(&format!("arith.addi {wrow}, {col} : i64"));
                let e1 = b.op(&format!("arith.addi {e0}, {c1} : i64"));
                let w0 = b.weight_elem("%w", &e0, *wdtype)?;
                let w1 = b.weight_elem("%w", &e1, *wdtype)?;
                breg.push(b.pack2(&w0, &w1, f16));
            }
            let ty = if f16 { "f16" } else { "bf16" };
            let outs = b.mma_m16n8k16(ty, [&areg[0], &areg[1], &areg[2], &areg[3]], &breg[0], &breg[1], [&accs[0], &accs[1], &accs[2], &accs[3]]);
            b.line(&format!("scf.yield {} : f32, f32, f32, f32", outs.join(", ")));
            b.line("}");
            // D: (ra, n0 + tig*2 + {0,1}) = res#0,1; (rb, ...) = res#2,3
            let nc = b.op(&format!("arith.addi {n0}, {tig2} : i64"));
            for (i, (row, valid)) in [(0usize, (&ra, &va)), (1, (&ra, &va)), (2, (&rb, &vb)), (3, (&rb, &vb))] {
                let col = if i % 2 == 0 { nc.clone() } else { b.op(&format!("arith.addi {nc}, {c1} : i64")) };
                let colok = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
                let both = b.op(&format!("arith.andi {valid}, {colok} : i1"));
                b.line(&format!("scf.if {both} {{"));
                b.matmul_store(&format!("{res}#{i}"), row, &col, *bias, *residual);
                b.line("}");
            }
            b.line("}");
            matmul_params(*bias, *residual, true)
        }
        KernelSpec::MatMulWgmma { k, n: _, wdtype, bias, residual, n_tile } => {
            let nt = *n_tile;
            let nacc = nt / 2;
            // f16 operands for f16 and block-quantized weights (their f16 scales dequantize
            // exactly enough in f16; 4x finer than bf16), bf16 for bf16 and f32 weights
            let f16 = tensor_core_f16(*wdtype);
            let ty = if f16 { "f16" } else { "bf16" };
            // shared memory: A tile [64 rows x 64 k] then B tile [64 n x 64 k], 16-bit elements
            // packed in pairs along k (i32), in 8x8 core matrices of 128 bytes: core matrix
            // (row / 8, k / 8) at ((row / 8) * 8 + k / 8) * 128 bytes, row r % 8 at 16 * (r % 8)
            b.workgroup = Some("%sm : memref<4096xi32, #gpu.address_space<workgroup>>".into());
            let t = b.op("gpu.thread_id x");
            let bx = b.op("gpu.block_id x");
            let by = b.op("gpu.block_id y");
            let t = b.idx64(&t);
            let bx = b.idx64(&bx);
            let by = b.idx64(&by);
            let c64 = b.ci64(64);
            let cnt = b.ci64(nt as i64);
            let n0 = b.op(&format!("arith.muli {bx}, {cnt} : i64"));
            let m0 = b.op(&format!("arith.muli {by}, {c64} : i64"));
            let kk = b.ci64(*k as i64);
            let zero = b.cf32(0.0);
            let c0 = b.ci64(0);
            let c4 = b.ci64(4);
            let c8 = b.ci64(8);
            // the tile's shared-memory address for the descriptors
            let base = b.op("memref.extract_aligned_pointer_as_index %sm : memref<4096xi32, #gpu.address_space<workgroup>> -> index");
            let base = b.idx64(&base);
            // descriptor = (addr >> 4) | (LBO 128 >> 4) << 16 | (SBO 1024 >> 4) << 32, no swizzle
            let fixed = b.ci64(((128u64 >> 4) << 16 | (1024u64 >> 4) << 32) as i64);
            let mk = |b: &mut Body, off: i64| -> String {
                let o = b.ci64(off);
                let a = b.op(&format!("arith.addi {base}, {o} : i64"));
                let mask = b.ci64(0x3FFFF);
                let a = b.op(&format!("arith.andi {a}, {mask} : i64"));
                let a = b.op(&format!("arith.shrui {a}, {c4} : i64"));
                b.op(&format!("arith.ori {a}, {fixed} : i64"))
            };
            let da: Vec<String> = (0..4).map(|s| mk(b, 256 * s)).collect();
            let db: Vec<String> = (0..4).map(|s| mk(b, 8192 + 256 * s)).collect();
            let ki = b.op(&format!("arith.constant {k} : index"));
            let zi = b.op("arith.constant 0 : index");
            let si = b.op("arith.constant 64 : index");
            let res = b.v();
            let kv = b.v();
            let accs: Vec<String> = (0..nacc).map(|_| b.v()).collect();
            let f32s = vec!["f32"; nacc].join(", ");
            b.line(&format!("{res}:{nacc} = scf.for {kv} = {zi} to {ki} step {si} iter_args({}) -> ({f32s}) {{", accs.iter().map(|a| format!("{a} = {zero}")).collect::<Vec<_>>().join(", ")));
            let k0 = b.idx64(&kv);
            // stage: each thread moves 4 core-matrix rows (8 k-values, 16 bytes in shared
            // memory) of A and 4 of B; 8 consecutive threads cover one 64-wide row (coalesced)
            for (is_b, off) in [(false, 0i64), (true, 8192)] {
                // A: 64 rows x 8 chunks = 512 units; B: n_tile rows x 8 chunks
                let units = if is_b { nt as i64 * 8 } else { 512 };
                for i in 0..units / 128 {
                    let ci = b.ci64(128 * i);
                    let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
                    let row = b.op(&format!("arith.divui {u}, {c8} : i64"));
                    let kc = b.op(&format!("arith.remui {u}, {c8} : i64"));
                    let kl = b.op(&format!("arith.muli {kc}, {c8} : i64"));
                    let kg = b.op(&format!("arith.addi {k0}, {kl} : i64"));
                    let (r0, lim) = if is_b { (&n0, "%n") } else { (&m0, "%m") };
                    let gr = b.op(&format!("arith.addi {r0}, {row} : i64"));
                    let valid = b.op(&format!("arith.cmpi slt, {gr}, {lim} : i64"));
                    let grs = b.op(&format!("arith.select {valid}, {gr}, {c0} : i64"));
                    let rbase = b.op(&format!("arith.muli {grs}, {kk} : i64"));
                    let e0 = b.op(&format!("arith.addi {rbase}, {kg} : i64"));
                    let packed: Vec<String> = if is_b {
                        let raw = weight_eight_raw(b, "%w", *wdtype, *k, &grs, &kg)?;
                        weight_eight_pairs(b, *wdtype, raw, f16)
                    } else {
                        // rows past M are not loaded at all (batched decode has few rows)
                        let bo = b.op(&format!("arith.muli {e0}, {c4} : i64"));
                        let c16b = b.ci64(16);
                        let bo2 = b.op(&format!("arith.addi {bo}, {c16b} : i64"));
                        let r = b.v();
                        let f8 = vec!["f32"; 8].join(", ");
                        b.line(&format!("{r}:8 = scf.if {valid} -> ({f8}) {{"));
                        let mut v = b.load_vec("%x", &bo, 4, "f32", 16);
                        v.extend(b.load_vec("%x", &bo2, 4, "f32", 16));
                        b.line(&format!("scf.yield {} : {f8}", v.join(", ")));
                        b.line("} else {");
                        b.line(&format!("scf.yield {} : {f8}", vec![zero.as_str(); 8].join(", ")));
                        b.line("}");
                        let vals: Vec<String> = (0..8).map(|j| format!("{r}#{j}")).collect();
                        (0..4).map(|j| b.pack2(&vals[2 * j], &vals[2 * j + 1], f16)).collect()
                    };
                    let zi32 = b.op("arith.constant 0 : i32");
                    let mut vec_v = b.op("llvm.mlir.undef : vector<4xi32>");
                    for (j, p) in packed.iter().enumerate() {
                        let pj = b.op(&format!("arith.select {valid}, {p}, {zi32} : i32"));
                        let cj = b.op(&format!("arith.constant {j} : i32"));
                        vec_v = b.op(&format!("llvm.insertelement {pj}, {vec_v}[{cj} : i32] : vector<4xi32>"));
                    }
                    // byte offset: ((row/8)*8 + kc) * 128 + (row%8) * 16
                    let rg = b.op(&format!("arith.divui {row}, {c8} : i64"));
                    let rr = b.op(&format!("arith.remui {row}, {c8} : i64"));
                    let cm = b.op(&format!("arith.muli {rg}, {c8} : i64"));
                    let cm = b.op(&format!("arith.addi {cm}, {kc} : i64"));
                    let c128b = b.ci64(128);
                    let cm = b.op(&format!("arith.muli {cm}, {c128b} : i64"));
                    let c16b = b.ci64(16);
                    let ri = b.op(&format!("arith.muli {rr}, {c16b} : i64"));
                    let so = b.op(&format!("arith.addi {cm}, {ri} : i64"));
                    let offc = b.ci64(off);
                    let so = b.op(&format!("arith.addi {so}, {offc} : i64"));
                    let sa = b.op(&format!("arith.addi {base}, {so} : i64"));
                    let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
                    b.line(&format!("llvm.store {vec_v}, {sp} {{alignment = 16 : i64}} : vector<4xi32>, !llvm.ptr<3>"));
                }
            }
            b.line("gpu.barrier");
            // generic-proxy stores must be visible to the async proxy wgmma reads through
            b.line("llvm.inline_asm has_side_effects \"fence.proxy.async.shared::cta;\", \"\"  : () -> ()");
            b.line("llvm.inline_asm has_side_effects \"wgmma.fence.sync.aligned;\", \"\"  : () -> ()");
            let st = format!("!llvm.struct<({f32s})>");
            let mut cur: Vec<String> = accs.clone();
            for s in 0..4 {
                let outs: Vec<String> = (0..nacc).map(|i| format!("${i}")).collect();
                let cons = format!("{},l,l,{}", vec!["=f"; nacc].join(","), (0..nacc).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
                let r = b.op(&format!(
                    "llvm.inline_asm has_side_effects \"wgmma.mma_async.sync.aligned.m64n{nt}k16.f32.{ty}.{ty} {{{}}}, ${nacc}, ${}, 1, 1, 1, 0, 0;\", \"{cons}\" {}, {}, {} : (i64, i64, {f32s}) -> {st}",
                    outs.join(","),
                    nacc + 1,
                    da[s],
                    db[s],
                    cur.join(", ")
                ));
                cur = (0..nacc).map(|i| b.op(&format!("llvm.extractvalue {r}[{i}] : {st}"))).collect();
            }
            b.line("llvm.inline_asm has_side_effects \"wgmma.commit_group.sync.aligned;\", \"\"  : () -> ()");
            // wait, passing the accumulators through so nothing reads them early
            let cons = format!("{},{}", vec!["=f"; nacc].join(","), (0..nacc).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
            let r = b.op(&format!("llvm.inline_asm has_side_effects \"wgmma.wait_group.sync.aligned 0;\", \"{cons}\" {} : ({f32s}) -> {st}", cur.join(", ")));
            let done: Vec<String> = (0..nacc).map(|i| b.op(&format!("llvm.extractvalue {r}[{i}] : {st}"))).collect();
            b.line("gpu.barrier");
            b.line(&format!("scf.yield {} : {f32s}", done.join(", ")));
            b.line("}");
            // D fragment: warp w rows 16w + g (+8), columns 8j + 2 (lane % 4) (+1)
            let (warp, _, g, tq) = b.mma_coords(&t);
            let c16 = b.ci64(16);
            let wr = b.op(&format!("arith.muli {warp}, {c16} : i64"));
            let ra = b.op(&format!("arith.addi {m0}, {wr} : i64"));
            let ra = b.op(&format!("arith.addi {ra}, {g} : i64"));
            let vals: Vec<String> = (0..nacc).map(|i| format!("{res}#{i}")).collect();
            b.store_d_fragments(&ra, &n0, &tq, nt, &vals, *bias, *residual);
            matmul_params(*bias, *residual, true)
        }
        other => return Err(format!("`{}` is not one of the tensor-core (mma.sync, wgmma) matmul kernels", other.symbol())),
    })
}

/// The eight weights K = `kg`.. (i64, a multiple of 8) of row `row` (i64, inside N) of a
/// K-column weight matrix, as the wgmma stagings write them (a 16-byte row chunk of the tile):
/// first only their loads ([`weight_eight_pairs`] makes the pairs), so a caller can issue many
/// units' loads before any of their math. 16-bit weights: the four pair words of one 16-byte
/// load; K-quants: the raw words of a 32-value step as the batched GEMV reads them (its lane t
/// is kg % 32 / 8); i4g128 / f8g128: eight values from their words and scales; the other
/// blocks: eight values each dequantized.
pub(crate) fn weight_eight_raw(b: &mut Body, ptr: &str, wdtype: DType, k: usize, row: &str, kg: &str) -> Result<Vec<String>, String> {
    let kk = b.ci64(k as i64);
    let rbase = b.op(&format!("arith.muli {row}, {kk} : i64"));
    let e0 = b.op(&format!("arith.addi {rbase}, {kg} : i64"));
    Ok(match wdtype {
        DType::BF16 | DType::F16 => {
            let c2 = b.ci64(2);
            let bo = b.op(&format!("arith.muli {e0}, {c2} : i64"));
            b.load_vec(ptr, &bo, 4, "i32", 16)
        }
        d if kquant_dtype(d) => {
            let (per, bytes) = d.block();
            let crb = b.ci64((k / per * bytes) as i64);
            let rowb = b.op(&format!("arith.muli {row}, {crb} : i64"));
            let c32 = b.ci64(32);
            let step = b.op(&format!("arith.divui {kg}, {c32} : i64"));
            let lane_off = b.op(&format!("arith.remui {kg}, {c32} : i64"));
            kquant_step_words(b, ptr, d, &rowb, &lane_off, &step)
        }
        // (eight values from two words and one scale)
        DType::I4G128 => i4g128_eight(b, ptr, &e0),
        DType::F8G128 => f8g128_eight(b, ptr, &e0),
        d => {
            let mut v = vec![];
            for j in 0..8 {
                let cj = b.ci64(j);
                let e = b.op(&format!("arith.addi {e0}, {cj} : i64"));
                v.push(b.weight_elem(ptr, &e, d)?);
            }
            v
        }
    })
}

/// [`weight_eight_raw`]'s eight weights as four f16 (`f16`) or bf16 pair words.
pub(crate) fn weight_eight_pairs(b: &mut Body, wdtype: DType, raw: Vec<String>, f16: bool) -> Vec<String> {
    match wdtype {
        DType::BF16 | DType::F16 => raw,
        d if kquant_dtype(d) => kquant_step_values(b, d, &raw).to_vec(),
        _ => (0..4).map(|j| b.pack2(&raw[2 * j], &raw[2 * j + 1], f16)).collect(),
    }
}
