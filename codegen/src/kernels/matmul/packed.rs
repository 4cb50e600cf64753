//! The packed-weight GEMV on the tensor cores (`KernelSpec::MatMulPacked`): y = x W^T for
//! weights in dsc's group-scaled layouts — [`DType::I4G128`] (int4, f16 scale d and minimum m
//! per group of 128, 4.25 bits a value) and [`DType::F8G128`] (FP8 e4m3, an f32 scale per group
//! of 128, 8.25 bits) — and up to 16 activation rows a block: the decode step of int4 and fp8
//! plans at every batch up to `gemv_few_max`.
//!
//! Why it looks like this (docs/perf.md, "int4"): the GGUF-block GEMV spent ~10.5 instructions a
//! weight (address arithmetic, 4-byte loads, shift/and/I2F/FMA per value) and ran at 22% of the
//! H200's bandwidth, issue-bound. Here a weight costs ~1.5 instructions:
//! - "swap AB" `mma.sync m16n8k16` (f32 accumulators): 16 weight rows as A, 8 activation rows
//!   (tokens) as each B tile; one row (b1) fills the B tile's 8 columns with copies of itself
//!   (the row index is clamped), whose results are simply not stored.
//! - Each lane loads 16-byte chunks of a group from rows g and g + 8, the 4 lanes of a row
//!   contiguous 64 bytes a load. The dot product does not care which K slot of the MMA a value
//!   takes as long as x takes the same one, so each format's bytes become MMA operands with
//!   no shuffles:
//!   - int4 (bf16 MMAs): chunk t of a group is lane t's, its word w holding the values
//!     32w + 4t + (0..4) and 32w + 16 + 4t + (0..4), value i in nibble i / 2 (even) or 4 + i / 2,
//!     so one `lop3` per shift (0, 4, 8, 12) or-s a nibble pair into bf16 128.0's bits: the bf16
//!     pairs (128 + q) of consecutive values with no conversion instruction. The offset and
//!     scales come after the MMAs, per group: with S = Σ x over the group (one more MMA per K
//!     step with an all-ones A: the B fragments' column sums), the group adds
//!     d · acc + (m − 128 d) · S (acc = Σ (128 + q) x exactly in the products; the f32
//!     cancellation of 128 S costs ~2^-24 · 15 relative).
//!   - fp8 (f16 MMAs): natural order, lane t's chunks the values 64j + 16t + (0..16) (j = 0, 1);
//!     a word's bytes (v0..v3) become the f16 pairs (v0, v2) and (v1, v3) by masks and shifts
//!     (sign in place, exponent and mantissa one bit down: e4m3 · 2^-8 exactly as f16, its
//!     subnormals too; no conversion instruction, which sm_80 lacks), x staged in the same
//!     order (x0, x2), (x1, x3) a quad; the group adds 256 s · acc.
//! - Warps split K by groups (warp w: groups w, w + W, ...), partial sums meet in shared memory;
//!   the first round's weights load before `griddepcontrol.wait` (PDL), as the other GEMVs do.
//! - Tilings (`tiles`): 0 = one row a block (b1): x staged once in shared memory in 16 bits
//!   (bf16 for int4, f16 for fp8; the RMSNorm applied on the way under `NormMatMul`), rounds of
//!   4 int4 / 2 fp8 groups software-pipelined (the next round's weights loaded before this
//!   round's math: 128 bytes a lane in flight either way); 1 = up to 8 rows, 16 outputs;
//!   2 = 16 rows, and 4 A tiles a warp (64 outputs a block) so x, which from 16 rows outweighs
//!   the weights a block reads, is read once for 64 outputs (b32 2,785 -> 5,005 tok/s on the 8B
//!   int4 shape). Measured and removed: 2 A tiles in the one-row kernel for wide N; the gate/up
//!   norm fold (docs/perf.md).
//!
//! GGUF's Q4_K at one row ([`emit_q4k_walk`]; `MatMulPacked { wdtype: Q4_K, tiles: 0, walk }`
//! and the merged gate/up's `SwiGluGemv`): a block walks `walk` tiles of 16 outputs ([`q4k_walk`]:
//! enough that the blocks are one wave of two an SM — the 8B gate/up 7, lm_head 31, q/k/v 2),
//! x staged once, each warp's weights loaded two steps ahead into registers across the tiles.
//! Measured on an H100 against one tile a block (bench/results/q4k-walk-gpu-h100-2026-12-07.json):
//! 8B b1 2.107 -> 2.009 ms a step (gate/up 28.1 -> 24.2 us, lm_head 112.5 -> 102.3; q/k/v and o
//! 0.6-0.8 us slower, down equal). Tried and dropped: the weights through per-warp `cp.async`
//! rings in shared memory (2.29 ms: shared-memory traffic and MIO throttling on top of x's
//! reads), two steps a loop trip to save the carried words' moves (spills at 128 registers), the
//! second step's loads after x's staging (2.093 vs 2.069 ms).
//!
//! Activations are f32 here (the plans' activations), rounded to bf16 (int4) or f16 (fp8:
//! e4m3's range needs f16's mantissa to keep W8A16 at bf16-plan accuracy; saturating at
//! ±65,504) for the MMAs, f32 sums.

use crate::kernels::*;

/// Warps per block (they split K by 128-value groups).
pub const PACKED_WARPS: usize = 8;

/// The readable symbol of a packed-weight GEMV (`KernelSpec::symbol`): `matmul_i4_...` for
/// i4g128, `matmul_f8_...` for f8g128.
pub(crate) fn packed_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::MatMulPacked { wdtype, k, n, tiles, walk, bias, residual } => {
            let f = match wdtype {
                DType::F8G128 => "f8",
                DType::Q4_K => "q4k",
                _ => "i4",
            };
            let w = if *walk > 1 { format!("_w{walk}") } else { String::new() };
            format!("matmul_{f}_t{tiles}{w}_k{k}_n{n}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" })
        }
        KernelSpec::SwiGluGemv { k, f, wdtype } => format!("matmul_swiglu_k{k}_f{f}_{wdtype}"),
        other => unreachable!("{other:?} is not a packed-weight GEMV (kernels::family)"),
    }
}

/// How the runtime launches a packed-weight GEMV: 16 outputs and 8 · `tiles` rows per block;
/// Q4_K's one-row form `walk` tiles of 16 outputs (SwiGLU: 8) a block.
pub(crate) fn packed_launch(spec: &KernelSpec) -> Launch {
    let walked = |outputs: usize| Launch::OutputsPerBlock { outputs: outputs as u32, rows: 1, warps: PACKED_WARPS as u32 };
    match spec {
        KernelSpec::MatMulPacked { wdtype: DType::Q4_K, walk, .. } => walked(16 * walk),
        KernelSpec::MatMulPacked { tiles, .. } => Launch::OutputsPerBlock { outputs: 16 * packed_a_tiles(*tiles) as u32, rows: (8 * *tiles).max(1) as u32, warps: PACKED_WARPS as u32 },
        // (the A tile's rows 8.. are the up rows of its rows 0..8: 8 outputs a tile)
        KernelSpec::SwiGluGemv { f, .. } => walked(8 * q4k_walk(f.div_ceil(8))),
        other => unreachable!("{other:?} is not a packed-weight GEMV (kernels::family)"),
    }
}

/// 16-row A tiles each warp computes for `tiles` B tiles: 4 from 16 rows (x, which from 16 rows
/// outweighs a block's weights, read once for 64 outputs), else 1.
pub fn packed_a_tiles(tiles: usize) -> usize {
    if tiles >= 2 {
        4
    } else {
        1
    }
}

/// Largest K of the one-row packed GEMV (`tiles` 0): x's bf16 copy in shared memory beside the
/// reduction within the 48 KB of static shared memory.
pub const PACKED_ONE_ROW_MAX_K: usize = 20480;

/// What the packed GEMV takes: i4g128 or f8g128 weights, K whole 512-value super-blocks, 1 or
/// 2 B tiles of 8 rows, or 0: one row a block with x staged in shared memory (K up to
/// [`PACKED_ONE_ROW_MAX_K`]).
pub(crate) fn packed_fits(spec: &KernelSpec) -> Result<(), String> {
    match spec {
        KernelSpec::MatMulPacked { wdtype: DType::Q4_K, k, tiles, walk, .. } => {
            if *tiles != 0 {
                return Err(format!("the packed GEMV reads Q4_K for one row (tiles 0), not {tiles} tiles"));
            }
            if *walk == 0 {
                return Err("the one-row Q4_K GEMV walks one or more tiles a block, not 0".into());
            }
            q4k_one_row_fits(*k)
        }
        KernelSpec::SwiGluGemv { k, wdtype: DType::Q4_K, .. } => q4k_one_row_fits(*k),
        KernelSpec::MatMulPacked { walk, .. } if *walk != 1 => Err(format!("only Q4_K's one-row GEMV walks tiles (walk {walk})")),
        KernelSpec::MatMulPacked { wdtype, k, tiles, .. } => {
            if !matches!(wdtype, DType::I4G128 | DType::F8G128) {
                return Err(format!("the packed GEMV reads i4g128 or f8g128 weights, not {wdtype}"));
            }
            if *k == 0 || k % 512 != 0 {
                return Err(format!("the packed GEMV needs K a multiple of 512 ({wdtype} super-blocks), got {k}"));
            }
            if !matches!(tiles, 0..=2) {
                return Err(format!("the packed GEMV takes 1 or 2 tiles of 8 rows (or 0: one row), not {tiles}"));
            }
            if *tiles == 0 && *k > PACKED_ONE_ROW_MAX_K {
                return Err(format!("the one-row packed GEMV stages x in shared memory: K up to {PACKED_ONE_ROW_MAX_K}, got {k}"));
            }
            Ok(())
        }
        other => Err(format!("`{}` is not the packed GEMV", other.symbol())),
    }
}

/// Which Q4_K rows the packed GEMV's one-row form takes (the schedule and the norm fold ask
/// the same): whole 256-value super-blocks, x's f16 copy within the staging limit.
pub(crate) fn q4k_one_row_fits(k: usize) -> Result<(), String> {
    if k == 0 || k % 256 != 0 || k > PACKED_ONE_ROW_MAX_K {
        return Err(format!("the packed Q4_K GEMV needs K whole 256-value super-blocks up to {PACKED_ONE_ROW_MAX_K}, got {k}"));
    }
    Ok(())
}

/// The packed GEMV's body; returns its parameter list (x, w, [bias], [res], y, M, N).
pub(crate) fn packed_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    packed_fits(spec)?;
    if let KernelSpec::SwiGluGemv { k, f, .. } = spec {
        emit_q4k_walk(b, *k, q4k_walk(f.div_ceil(8)), false, false, true)?;
        return Ok("%x: !llvm.ptr<1>, %w0: !llvm.ptr<1>, %w1: !llvm.ptr<1>, %y: !llvm.ptr<1>, %m: i64, %n: i64".into());
    }
    let KernelSpec::MatMulPacked { wdtype, k, tiles, walk, bias, residual, .. } = spec else { unreachable!("checked") };
    if *wdtype == DType::Q4_K {
        emit_q4k_walk(b, *k, *walk, *bias, *residual, false)?;
    } else {
        emit_gemv_packed(b, *wdtype, *k, *tiles, *bias, *residual)?;
    }
    Ok(matmul_params(*bias, *residual, true))
}

/// One group's weights for this lane as loaded: [row g, row g + 8] x (int4: 4 nibble words,
/// the (d, m) word; fp8: 8 e4m3 words, the f32 scale's bits).
type GroupW = Vec<Vec<String>>;

/// i4g128 and f8g128 (Q4_K's one-row form: [`emit_q4k_walk`]).
fn emit_gemv_packed(b: &mut Body, wdtype: DType, k: usize, tiles: usize, bias: bool, residual: bool) -> Result<(), String> {
    let nw = PACKED_WARPS;
    let f8 = wdtype == DType::F8G128;
    let groups = k / 128;
    // (one row: x from shared memory, 128 bytes of weights a lane in flight: 4 int4 groups
    // or 2 fp8 groups)
    let staged = tiles == 0;
    let tiles = tiles.max(1);
    let unroll = match (staged, tiles, f8) {
        (true, _, false) => 4,
        (true, _, true) | (false, 1, false) => 2,
        _ => 1,
    };
    // words a row's group takes in registers (the scale word last)
    let wl = if f8 { 9 } else { 5 };
    if staged {
        // (256 threads, two blocks an SM: up to 128 registers, so ptxas keeps the next round's
        // loads at the top of the loop — left to itself it kept to ~80 and sank them to the
        // loop's end, behind the math, a DRAM round trip exposed per round)
        b.launch_bounds = Some(((32 * nw) as u32, 2));
    }
    let (jloop, rounds) = split_k_schedule(groups, 1, nw, unroll);
    // 16-row A tiles a warp computes (x read once for all: 64 outputs a block from 16 rows)
    let na = if staged { 1 } else { packed_a_tiles(tiles) };
    let per = 4 * tiles * na;
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", nw * per * 32);
    let xst = format!("memref<{}xi32, #gpu.address_space<workgroup>>", k / 2);
    b.workgroup = Some(if staged { format!("%red : {smt}, %xs : {xst}") } else { format!("%red : {smt}") });
    let MmaLane { t, lane, warp, bx64, by64, warp64, g, tq } = mma_lane(b);
    let c16 = b.ci64(16);
    let cout = b.ci64(16 * na as i64);
    let col0 = b.op(&format!("arith.muli {bx64}, {cout} : i64"));
    let crows = b.ci64(8 * tiles as i64);
    let row0 = b.op(&format!("arith.muli {by64}, {crows} : i64"));
    let one = b.ci64(1);
    let nlast = b.op(&format!("arith.subi %n, {one} : i64"));
    let mlast = b.op(&format!("arith.subi %m, {one} : i64"));
    // weight rows g and g + 8 (clamped), and this lane's 16 bytes within a group's 64
    let rowbytes = b.ci64((k / 512 * if f8 { 528 } else { 272 }) as i64);
    let lane_b = b.op(&format!("arith.muli {tq}, {c16} : i64"));
    let wrow: Vec<String> = (0..na as i64)
        .flat_map(|a| [16 * a, 16 * a + 8])
        .map(|d| {
            let cd = b.ci64(d);
            let r = b.op(&format!("arith.addi {col0}, {g} : i64"));
            let r = b.op(&format!("arith.addi {r}, {cd} : i64"));
            let r = b.op(&format!("arith.minsi {r}, {nlast} : i64"));
            b.op(&format!("arith.muli {r}, {rowbytes} : i64"))
        })
        .collect();
    // activation row of B tile j: row0 + 8j + g (clamped); this lane's 32 values of a group
    // are (int4) 16q + 4t + (0..4) for q = 0..7, at 4 (128 gi + 16 q + 4 t) bytes (the four
    // lanes of a row read 64 contiguous bytes a load), (fp8) 64j + 16t + (0..16), j = 0, 1
    let xrowbytes = b.ci64((k * 4) as i64);
    let c64 = b.ci64(64);
    let lane_x = b.op(&format!("arith.muli {tq}, {} : i64", if f8 { &c64 } else { &c16 }));
    let xrow: Vec<String> = (0..tiles)
        .map(|j| {
            let cj = b.ci64(8 * j as i64);
            let r = b.op(&format!("arith.addi {row0}, {cj} : i64"));
            let r = b.op(&format!("arith.addi {r}, {g} : i64"));
            let r = b.op(&format!("arith.minsi {r}, {mlast} : i64"));
            let o = b.op(&format!("arith.muli {r}, {xrowbytes} : i64"));
            b.op(&format!("arith.addi {o}, {lane_x} : i64"))
        })
        .collect();
    // int4 group gi: nibbles at 16 + 16 (gi / 4) + 64 gi (+ 16 t), (d, m) at 256 (gi / 4) + 4 gi;
    // fp8: e4m3 at 528 (gi / 4) + 16 + 128 (gi % 4) (+ 16 t, + 64), the scale at 528 (gi / 4) + 4 (gi % 4)
    let load_w = |b: &mut Body, gi: &str| -> GroupW {
        let c2 = b.ci64(2);
        let sb = b.op(&format!("arith.shrui {gi}, {c2} : i64"));
        let c16 = b.ci64(16);
        let c4 = b.ci64(4);
        let (no, so) = if f8 {
            let c3 = b.ci64(3);
            let gq = b.op(&format!("arith.andi {gi}, {c3} : i64"));
            let c528 = b.ci64(528);
            let c128 = b.ci64(128);
            let base = b.op(&format!("arith.muli {sb}, {c528} : i64"));
            let q128 = b.op(&format!("arith.muli {gq}, {c128} : i64"));
            let no = b.op(&format!("arith.addi {base}, {q128} : i64"));
            let no = b.op(&format!("arith.addi {no}, {c16} : i64"));
            let no = b.op(&format!("arith.addi {no}, {lane_b} : i64"));
            let q4 = b.op(&format!("arith.muli {gq}, {c4} : i64"));
            (no, b.op(&format!("arith.addi {base}, {q4} : i64")))
        } else {
            let c64 = b.ci64(64);
            let c256 = b.ci64(256);
            let s16 = b.op(&format!("arith.muli {sb}, {c16} : i64"));
            let g64 = b.op(&format!("arith.muli {gi}, {c64} : i64"));
            let no = b.op(&format!("arith.addi {s16}, {g64} : i64"));
            let no = b.op(&format!("arith.addi {no}, {c16} : i64"));
            let no = b.op(&format!("arith.addi {no}, {lane_b} : i64"));
            let s256 = b.op(&format!("arith.muli {sb}, {c256} : i64"));
            let g4 = b.op(&format!("arith.muli {gi}, {c4} : i64"));
            (no, b.op(&format!("arith.addi {s256}, {g4} : i64")))
        };
        let c64 = b.ci64(64);
        wrow.iter()
            .map(|r| {
                let o = b.op(&format!("arith.addi {r}, {no} : i64"));
                let mut w = b.load_vec("%w", &o, 4, "i32", 16);
                if f8 {
                    let o2 = b.op(&format!("arith.addi {o}, {c64} : i64"));
                    w.extend(b.load_vec("%w", &o2, 4, "i32", 16));
                }
                let o = b.op(&format!("arith.addi {r}, {so} : i64"));
                w.push(b.load_vec("%w", &o, 1, "i32", 4).remove(0));
                w
            })
            .collect()
    };
    // (staged: the shared address of this lane's x pairs in group 0: 8 t bytes into %xs)
    let xsm = staged.then(|| {
        let base = b.op(&format!("memref.extract_aligned_pointer_as_index %xs : {xst} -> index"));
        let base = b.idx64(&base);
        let c = b.ci64(if f8 { 32 } else { 8 });
        let lo = b.op(&format!("arith.muli {tq}, {c} : i64"));
        b.op(&format!("arith.addi {base}, {lo} : i64"))
    });
    let xbase = staged.then(|| {
        let base = b.op(&format!("memref.extract_aligned_pointer_as_index %xs : {xst} -> index"));
        b.idx64(&base)
    });
    let ones = b.op(&format!("arith.constant {} : i32", 0x3F80_3F80u32 as i32));
    let m128 = b.cf32(-128.0);
    let c256f = b.cf32(256.0);
    let zero = b.cf32(0.0);
    // one group's math into `acc`; `valid` false: a clamped group past K, adding nothing
    let math = |b: &mut Body, gi: &str, valid: Option<&str>, w: &GroupW, acc: &[String]| -> Vec<String> {
        let mut out = acc.to_vec();
        // x: per B tile the lane's 32 values of the group as 16 16-bit pairs, in the order the
        // MMAs take them (K step u: pairs 2u and 2u + 1)
        let c512 = b.ci64(512);
        let xo = b.op(&format!("arith.muli {gi}, {c512} : i64"));
        let xs: Vec<Vec<String>> = if let Some(xb) = &xsm {
            // staged, 256 bytes a group: int4 the lane's word w pairs at 16-bit 128 gi + 32 w +
            // 4 t (and + 16); fp8 its 16 values at 128 gi + 64 j + 16 t, already in pair order
            let c256 = b.ci64(256);
            let go = b.op(&format!("arith.muli {gi}, {c256} : i64"));
            let base = b.op(&format!("arith.addi {xb}, {go} : i64"));
            let (n, step, width) = if f8 { (4, 16, 4) } else { (8, 32, 2) };
            let mut v = vec![];
            for q in 0..n {
                let off = if f8 { 128 * (q / 2) + 16 * (q % 2) } else { step * q };
                let c = b.ci64(off as i64);
                let o = b.op(&format!("arith.addi {base}, {c} : i64"));
                let p = b.op(&format!("llvm.inttoptr {o} : i64 to !llvm.ptr<3>"));
                let r = b.op(&format!("llvm.load {p} {{alignment = {} : i64}} : !llvm.ptr<3> -> vector<{width}xi32>", 4 * width));
                v.extend(b.elements(&r, width, "i32"));
            }
            vec![v]
        } else {
            xrow.iter()
                .map(|r| {
                    let base = b.op(&format!("arith.addi {r}, {xo} : i64"));
                    let mut v = vec![];
                    for q in 0..8 {
                        let c = b.ci64(if f8 { 256 * (q / 4) + 16 * (q % 4) } else { 64 * q });
                        let o = b.op(&format!("arith.addi {base}, {c} : i64"));
                        v.extend(b.load_vec("%x", &o, 4, "f32", 16));
                    }
                    if f8 {
                        // (x0, x2), (x1, x3) per 4 values, as the e4m3 words unpack
                        (0..16).map(|p| b.pack2(&v[4 * (p / 2) + p % 2], &v[4 * (p / 2) + p % 2 + 2], true)).collect()
                    } else {
                        (0..16).map(|p| b.pack2(&v[2 * p], &v[2 * p + 1], false)).collect()
                    }
                })
                .collect()
        };
        // the rows' weights as 16-bit pairs, [row][K step u][a0 slot, a2 slot]: int4 bf16
        // (128 + q), fp8 f16 e4m3 · 2^-8
        let a: Vec<Vec<[String; 2]>> = w
            .iter()
            .map(|row| {
                if f8 {
                    (0..8).map(|u| f8_f16_pairs(b, &row[u])).collect()
                } else {
                    (0..4)
                        .flat_map(|wi| {
                            let [p0, p1, p2, p3] = i4_bf16_words(b, &row[wi]);
                            [[p0, p1], [p2, p3]]
                        })
                        .collect()
                }
            })
            .collect();
        // rows g and g + 8: int4 (d, m - 128 d), fp8 (256 s, -)
        let sc: Vec<(String, String)> = w
            .iter()
            .map(|row| {
                let (d, mp) = if f8 {
                    let s = b.op(&format!("arith.bitcast {} : i32 to f32", row[wl - 1]));
                    (b.op(&format!("arith.mulf {s}, {c256f} : f32")), zero.clone())
                } else {
                    // (the (d, m) word: f16 d low, f16 m high)
                    let [d, m] = b.f16_pair(&row[wl - 1]);
                    let mp = b.op(&format!("llvm.intr.fma({m128}, {d}, {m}) : (f32, f32, f32) -> f32"));
                    (d, mp)
                };
                match valid {
                    Some(v) => (b.op(&format!("arith.select {v}, {d}, {zero} : f32")), b.op(&format!("arith.select {v}, {mp}, {zero} : f32"))),
                    None => (d, mp),
                }
            })
            .collect();
        let (ty, steps) = (if f8 { "f16" } else { "bf16" }, 8);
        for (j, x) in xs.iter().enumerate() {
            // int4: S over the group once per B tile
            let mut s = [zero.clone(), zero.clone(), zero.clone(), zero.clone()];
            if !f8 {
                for u in 0..steps {
                    let r = b.mma_m16n8k16("bf16", [&ones, &ones, &ones, &ones], &x[2 * u], &x[2 * u + 1], [&s[0], &s[1], &s[2], &s[3]]);
                    s = [r[0].clone(), r[1].clone(), r[2].clone(), r[3].clone()];
                }
            }
            for at in 0..na {
                let mut c = [zero.clone(), zero.clone(), zero.clone(), zero.clone()];
                for u in 0..steps {
                    let (p, q) = (&a[2 * at][u][0], &a[2 * at][u][1]);
                    let (p8, q8) = (&a[2 * at + 1][u][0], &a[2 * at + 1][u][1]);
                    let r = b.mma_m16n8k16(ty, [p, p8, q, q8], &x[2 * u], &x[2 * u + 1], [&c[0], &c[1], &c[2], &c[3]]);
                    c = [r[0].clone(), r[1].clone(), r[2].clone(), r[3].clone()];
                }
                // value i: row g (+ 8 for i >= 2), token 2t + i % 2: y += d acc (+ (m - 128 d) S)
                for i in 0..4 {
                    let (d, mp) = &sc[2 * at + i / 2];
                    let o = at * 4 * tiles + 4 * j + i;
                    let y = b.op(&format!("llvm.intr.fma({d}, {}, {}) : (f32, f32, f32) -> f32", c[i], out[o]));
                    out[o] = if f8 { y } else { b.op(&format!("llvm.intr.fma({mp}, {}, {y}) : (f32, f32, f32) -> f32", s[i])) };
                }
            }
        }
        out
    };
    let body = |b: &mut Body, us: &[String], acc: &[String], pre: Option<&[GroupW]>| -> Vec<String> {
        let ws: Vec<GroupW> = match pre {
            Some(p) => p.to_vec(),
            None => us.iter().map(|u| load_w(b, u)).collect(),
        };
        let mut out = acc.to_vec();
        for (gi, w) in us.iter().zip(&ws) {
            out = math(b, gi, None, w, &out);
        }
        out
    };
    let acc = if xsm.is_some() {
        // software-pipelined rounds of `unroll` groups: round r + 1's weights are loaded
        // before round r's math (two rounds in flight a warp); round 0's before the wait
        // (PDL), then x staged. Group q of round r is warp + W (U r + q), clamped to the last
        // group (an L2 hit) and adding nothing past it.
        let nr = groups.div_ceil(nw * unroll);
        let at = |b: &mut Body, r: &str, q: usize| -> (String, String) {
            let cu = b.ci64((nw * unroll) as i64);
            let o = b.op(&format!("arith.muli {r}, {cu} : i64"));
            let cq = b.ci64((nw * q) as i64);
            let o = b.op(&format!("arith.addi {o}, {cq} : i64"));
            let u = b.op(&format!("arith.addi {warp64}, {o} : i64"));
            let cg = b.ci64(groups as i64);
            let valid = b.op(&format!("arith.cmpi slt, {u}, {cg} : i64"));
            let cl = b.ci64(groups as i64 - 1);
            (b.op(&format!("arith.minsi {u}, {cl} : i64")), valid)
        };
        let r0 = b.ci64(0);
        let first: Vec<(String, String)> = (0..unroll).map(|q| at(b, &r0, q)).collect();
        let mut pre: Vec<GroupW> = first.iter().map(|(u, _)| load_w(b, u)).collect();
        if b.pdl && !b.waited {
            b.wait_for_previous();
        }
        stage_x(b, f8, k, &by64, &t, xbase.as_ref().expect("staged"), &smt);
        let zero = b.cf32(0.0);
        let mut acc: Vec<String> = vec![zero; per];
        if nr > 1 {
            // the loop carries the accumulators and the next round's weights
            let flat: Vec<String> = pre.iter().flatten().flatten().cloned().collect();
            let (res, rv) = (b.v(), b.v());
            let args: Vec<String> = (0..per + flat.len()).map(|_| b.v()).collect();
            let inits: Vec<String> = args.iter().zip(acc.iter().chain(&flat)).map(|(a, z)| format!("{a} = {z}")).collect();
            let tys = vec!["f32"; per].into_iter().chain(vec!["i32"; flat.len()]).collect::<Vec<_>>().join(", ");
            let lo = b.op("arith.constant 0 : index");
            let hi = b.op(&format!("arith.constant {} : index", nr - 1));
            let st = b.op("arith.constant 1 : index");
            b.line(&format!("{res}:{} = scf.for {rv} = {lo} to {hi} step {st} iter_args({}) -> ({tys}) {{", args.len(), inits.join(", ")));
            let r = b.idx64(&rv);
            let cur: Vec<GroupW> = args[per..].chunks(2 * wl).map(|g| g.chunks(wl).map(|c| c.to_vec()).collect()).collect();
            let one = b.ci64(1);
            let r1 = b.op(&format!("arith.addi {r}, {one} : i64"));
            let next: Vec<GroupW> = (0..unroll)
                .map(|q| {
                    let (u, _) = at(b, &r1, q);
                    load_w(b, &u)
                })
                .collect();
            let mut out: Vec<String> = args[..per].to_vec();
            for (q, w) in cur.iter().enumerate() {
                let (u, valid) = at(b, &r, q);
                out = math(b, &u, Some(&valid), w, &out);
            }
            let ys: Vec<String> = out.into_iter().chain(next.iter().flatten().flatten().cloned()).collect();
            b.line(&format!("scf.yield {} : {tys}", ys.join(", ")));
            b.line("}");
            acc = (0..per).map(|i| format!("{res}#{i}")).collect();
            pre = (per..args.len()).map(|i| format!("{res}#{i}")).collect::<Vec<_>>().chunks(2 * wl).map(|g| g.chunks(wl).map(|c| c.to_vec()).collect()).collect();
        }
        let rl = b.ci64(nr as i64 - 1);
        for (q, w) in pre.iter().enumerate() {
            let (u, valid) = at(b, &rl, q);
            acc = math(b, &u, Some(&valid), w, &acc);
        }
        acc
    } else {
        b.split_k_rounds_preloaded(per, jloop, rounds, unroll, &warp64, nw as i64, groups as i64, &load_w, &body)
    };
    MmaTiles::meet_in_shared(b, &acc, &warp, &lane, per, &smt);
    let c2 = b.ci64(2);
    let t2 = b.op(&format!("arith.muli {tq}, {c2} : i64"));
    if staged {
        one_row_store(b, &acc, OneRow { lane: &lane, smt: &smt, col0: &col0, g: &g, tq: &tq, row: &by64, bias, residual, swiglu: false })?;
        b.line("}");
        return Ok(());
    }
    for (a, part) in acc.iter().enumerate() {
        let total = MmaTiles::warps_total(b, part, a, nw, per, &lane, &smt);
        MmaTiles::store_swap_ab(b, &total, a, tiles, (&col0, &g), (&row0, &t2), bias, residual);
    }
    b.line("}");
    Ok(())
}

/// Opens `scf.if` output column `col` (i64) is inside N and this lane is its row's t = 0
/// (`tq`): where the one-row forms store (every column of their D fragment is the one row).
fn if_lane0_inside(b: &mut Body, col: &str, tq: &str) {
    let okc = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
    let z = b.ci64(0);
    let t0 = b.op(&format!("arith.cmpi eq, {tq}, {z} : i64"));
    let ok = b.op(&format!("arith.andi {okc}, {t0} : i1"));
    b.line(&format!("scf.if {ok} {{"));
}

/// Where and what a one-row form stores once its warps' sums meet (`MmaTiles::meet_in_shared`
/// has opened warp 0's `scf.if`): lane t = 0 of row g stores output columns col0 + g and
/// col0 + g + 8 of activation row `row`; `swiglu`: silu(gate) · up of column col0 + g (the A
/// tile's rows g are gate rows, rows g + 8 the same up rows).
struct OneRow<'a> {
    lane: &'a str,
    smt: &'a str,
    col0: &'a str,
    g: &'a str,
    tq: &'a str,
    row: &'a str,
    bias: bool,
    residual: bool,
    swiglu: bool,
}

fn one_row_store(b: &mut Body, acc: &[String], o: OneRow) -> Result<(), String> {
    let (nw, per) = (PACKED_WARPS, acc.len());
    if o.swiglu {
        let gate = MmaTiles::warps_total(b, &acc[0], 0, nw, per, o.lane, o.smt);
        let up = MmaTiles::warps_total(b, &acc[2], 2, nw, per, o.lane, o.smt);
        let col = b.op(&format!("arith.addi {}, {} : i64", o.col0, o.g));
        if_lane0_inside(b, &col, o.tq);
        let s = unary_expr(b, UnaryOp::Silu, &gate)?;
        let y = b.op(&format!("arith.mulf {s}, {up} : f32"));
        b.matmul_store(&y, o.row, &col, false, false);
        b.line("}");
        return Ok(());
    }
    // (every column of the D fragment is the one row: values 0 and 2, rows g and g + 8)
    for a in [0usize, 2] {
        let total = MmaTiles::warps_total(b, &acc[a], a, nw, per, o.lane, o.smt);
        let co = b.ci64(if a >= 2 { 8 } else { 0 });
        let col = b.op(&format!("arith.addi {}, {} : i64", o.col0, o.g));
        let col = b.op(&format!("arith.addi {col}, {co} : i64"));
        if_lane0_inside(b, &col, o.tq);
        b.matmul_store(&total, o.row, &col, o.bias, o.residual);
        b.line("}");
    }
    Ok(())
}

/// Output tiles a block of the one-row Q4_K GEMV takes for `tiles` tiles in all (16 outputs a
/// tile; SwiGLU 8): as many as put every block in one wave of two a multiprocessor, so x is
/// staged once a block and each warp's weight stream runs on across its tiles.
pub fn q4k_walk(tiles: usize) -> usize {
    tiles.div_ceil(2 * TARGET_SMS).max(1)
}

/// The one-row Q4_K GEMV (`MatMulPacked { wdtype: Q4_K, tiles: 0 }`, with the RMSNorm folded
/// under `NormMatMul`, merged parts; `swiglu`: `SwiGluGemv`, gate rows from `%w0`, up rows
/// from `%w1`). A block takes `walk` tiles of 16 outputs (SwiGLU 8) one after another; its 8
/// warps split each tile's K by super-blocks (warp w: w, w + 8, ...: a step, `nr` a tile), so
/// a warp's steps are the same K range in every tile. x is staged once a block (f16,
/// [`stage_x`]). One loop runs over the block's steps, carrying the accumulators and the
/// lane's 96 bytes of the next steps ([`q4k_load_rows`]): a step's loads are issued two steps
/// before its math (`Q4K_AHEAD` = 1 step in flight beyond the one computed, the first two
/// before the PDL wait), across tile boundaries; none past the block's last step. Each step
/// is made f16 MMA operands by [`q4k_math`]; at a tile's last step the warps' sums meet in
/// shared memory, warp 0 stores and the accumulators start again.
fn emit_q4k_walk(b: &mut Body, k: usize, walk: usize, bias: bool, residual: bool, swiglu: bool) -> Result<(), String> {
    let nw = PACKED_WARPS;
    let groups = k / 256;
    let nr = groups.div_ceil(nw);
    let steps = walk * nr;
    // (two blocks an SM: up to 128 registers, the two steps' words in them)
    b.launch_bounds = Some(((32 * nw) as u32, 2));
    let per = 4;
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", nw * per * 32);
    let xst = format!("memref<{}xi32, #gpu.address_space<workgroup>>", k / 2);
    b.workgroup = Some(format!("%red : {smt}, %xs : {xst}"));
    let MmaLane { t, lane, warp, bx64, by64, warp64, g, tq } = mma_lane(b);
    let one = b.ci64(1);
    let nlast = b.op(&format!("arith.subi %n, {one} : i64"));
    let rowbytes = b.ci64((groups * 144) as i64);
    let c16 = b.ci64(16);
    let lane_b = b.op(&format!("arith.muli {tq}, {c16} : i64"));
    let cout = b.ci64(if swiglu { 8 } else { 16 });
    let cwalk = b.ci64(walk as i64);
    let tile0 = b.op(&format!("arith.muli {bx64}, {cwalk} : i64"));
    // step s (i64) of this block: its tile's first output, the warp's super-block (clamped to
    // the last) and whether it is inside K
    let step_at = |b: &mut Body, s: &str| -> (String, String, String) {
        let cnr = b.ci64(nr as i64);
        let i = b.op(&format!("arith.divui {s}, {cnr} : i64"));
        let r = b.op(&format!("arith.remui {s}, {cnr} : i64"));
        let tile = b.op(&format!("arith.addi {tile0}, {i} : i64"));
        let col0 = b.op(&format!("arith.muli {tile}, {cout} : i64"));
        let cnw = b.ci64(nw as i64);
        let u = b.op(&format!("arith.muli {r}, {cnw} : i64"));
        let u = b.op(&format!("arith.addi {u}, {warp64} : i64"));
        let cg = b.ci64(groups as i64);
        let valid = b.op(&format!("arith.cmpi slt, {u}, {cg} : i64"));
        let cl = b.ci64(groups as i64 - 1);
        (col0, b.op(&format!("arith.minsi {u}, {cl} : i64")), valid)
    };
    let load = |b: &mut Body, s: &str| -> GroupW {
        let (col0, gi, _) = step_at(b, s);
        q4k_load_rows(b, &col0, &gi, &g, &nlast, &rowbytes, &lane_b, swiglu)
    };
    // (the first steps before the wait: weights never depend on the previous kernel)
    let pre: Vec<GroupW> = (0..=Q4K_AHEAD)
        .map(|s| {
            let cs = b.ci64(s.min(steps - 1) as i64);
            load(b, &cs)
        })
        .collect();
    if b.pdl && !b.waited {
        b.wait_for_previous();
    }
    let xs = b.op(&format!("memref.extract_aligned_pointer_as_index %xs : {xst} -> index"));
    let xs = b.idx64(&xs);
    stage_x(b, true, k, &by64, &t, &xs, &smt);
    // (this lane's x pairs in super-block 0: sub-block 2 (t / 2)'s values 16 (t % 2)..; the
    // `prmt` selector of its two scale bytes 2 (t / 2), + 1)
    let c2 = b.ci64(2);
    let (tp, tm) = (b.op(&format!("arith.divui {tq}, {c2} : i64")), b.op(&format!("arith.remui {tq}, {c2} : i64")));
    let (c128, c32) = (b.ci64(128), b.ci64(32));
    let xa = b.op(&format!("arith.muli {tp}, {c128} : i64"));
    let xm = b.op(&format!("arith.muli {tm}, {c32} : i64"));
    let xb = b.op(&format!("arith.addi {xs}, {xa} : i64"));
    let xb = b.op(&format!("arith.addi {xb}, {xm} : i64"));
    let tp32 = b.op(&format!("arith.trunci {tp} : i64 to i32"));
    let c514 = b.op("arith.constant 514 : i32");
    let sel = b.op(&format!("arith.muli {tp32}, {c514} : i32"));
    let sbase = b.op(&format!("arith.constant {} : i32", 0x4140));
    let sel = b.op(&format!("arith.addi {sel}, {sbase} : i32"));
    let zero = b.cf32(0.0);
    // the loop over the block's steps: accumulators, then the words of steps s .. s + AHEAD
    // (a step's words: [`q4k_load_rows`]'s 12 for each of the two rows)
    let wl = pre[0].iter().map(Vec::len).sum::<usize>();
    let flat: Vec<String> = pre.iter().flatten().flatten().cloned().collect();
    let (res, sv) = (b.v(), b.v());
    let args: Vec<String> = (0..per + flat.len()).map(|_| b.v()).collect();
    let inits: Vec<String> = args.iter().zip(std::iter::repeat_n(zero.clone(), per).chain(flat.iter().cloned())).map(|(a, z)| format!("{a} = {z}")).collect();
    let f4 = "f32, f32, f32, f32";
    let w24 = vec!["i32"; wl].join(", ");
    let tys = vec!["f32"; per].into_iter().chain(vec!["i32"; flat.len()]).collect::<Vec<_>>().join(", ");
    let lo = b.op("arith.constant 0 : index");
    let hi = b.op(&format!("arith.constant {steps} : index"));
    let st = b.op("arith.constant 1 : index");
    b.line(&format!("{res}:{} = scf.for {sv} = {lo} to {hi} step {st} iter_args({}) -> ({tys}) {{", args.len(), inits.join(", ")));
    let s = b.idx64(&sv);
    // step s + AHEAD + 1's loads, where the block has it (else the words stay as they are)
    let ca = b.ci64(Q4K_AHEAD as i64 + 1);
    let nx = b.op(&format!("arith.addi {s}, {ca} : i64"));
    let csteps = b.ci64(steps as i64);
    let has = b.op(&format!("arith.cmpi slt, {nx}, {csteps} : i64"));
    let next = b.v();
    b.line(&format!("{next}:{wl} = scf.if {has} -> ({w24}) {{"));
    let words: Vec<String> = load(b, &nx).into_iter().flatten().collect();
    b.line(&format!("scf.yield {} : {w24}", words.join(", ")));
    b.line("} else {");
    b.line(&format!("scf.yield {} : {w24}", args[per..per + wl].join(", ")));
    b.line("}");
    let cur: GroupW = args[per..per + wl].chunks(wl / 2).map(|c| c.to_vec()).collect();
    let (_, gi, valid) = step_at(b, &s);
    let out = q4k_math(b, &gi, Some(&valid), &cur, &args[..per], &xb, &sel);
    // a tile's last step: the warps' sums meet, warp 0 stores, the accumulators start again
    // (a barrier after: the reduction's shared memory is free for the next tile)
    let cnr = b.ci64(nr as i64);
    let r = b.op(&format!("arith.remui {s}, {cnr} : i64"));
    let clast = b.ci64(nr as i64 - 1);
    let end = b.op(&format!("arith.cmpi eq, {r}, {clast} : i64"));
    let acc = b.v();
    b.line(&format!("{acc}:{per} = scf.if {end} -> ({f4}) {{"));
    // (the tile's first output computed here, off the loop's every-step path)
    let i = b.op(&format!("arith.divui {s}, {cnr} : i64"));
    let tile = b.op(&format!("arith.addi {tile0}, {i} : i64"));
    let col0 = b.op(&format!("arith.muli {tile}, {cout} : i64"));
    MmaTiles::meet_in_shared(b, &out, &warp, &lane, per, &smt);
    one_row_store(b, &out, OneRow { lane: &lane, smt: &smt, col0: &col0, g: &g, tq: &tq, row: &by64, bias, residual, swiglu })?;
    b.line("}");
    b.line("gpu.barrier");
    b.line(&format!("scf.yield {zero}, {zero}, {zero}, {zero} : {f4}"));
    b.line("} else {");
    b.line(&format!("scf.yield {} : {f4}", out.join(", ")));
    b.line("}");
    let ys: Vec<String> = (0..per).map(|a| format!("{acc}#{a}")).chain(args[per + wl..].iter().cloned()).chain((0..wl).map(|i| format!("{next}#{i}"))).collect();
    b.line(&format!("scf.yield {} : {tys}", ys.join(", ")));
    b.line("}");
    Ok(())
}

/// Steps a warp of the one-row Q4_K GEMV has in flight beyond the one it computes (its loads
/// issued two steps ahead: 48 of its registers).
pub const Q4K_AHEAD: usize = 1;

/// Super-block `gi` of this lane's two rows of the tile starting at output `col0` (rows g and
/// g + 8, clamped; SwiGLU: gate row g of `%w0` and up row g of `%w1`): per row the 16-byte
/// quant chunks 16 t.. of both 64-byte halves — values 16 (t % 2).. of sub-blocks
/// A = 4h + 2 (t / 2) (low nibbles) and A + 1 (high) — then the 16-byte header (12 words).
#[allow(clippy::too_many_arguments)]
fn q4k_load_rows(b: &mut Body, col0: &str, gi: &str, g: &str, nlast: &str, rowbytes: &str, lane_b: &str, swiglu: bool) -> GroupW {
    let c144 = b.ci64(144);
    let sb = b.op(&format!("arith.muli {gi}, {c144} : i64"));
    let rows: [(&str, i64); 2] = if swiglu { [("%w0", 0), ("%w1", 0)] } else { [("%w", 0), ("%w", 8)] };
    rows.iter()
        .map(|(p, d)| {
            let cd = b.ci64(*d);
            let r = b.op(&format!("arith.addi {col0}, {g} : i64"));
            let r = b.op(&format!("arith.addi {r}, {cd} : i64"));
            let r = b.op(&format!("arith.minsi {r}, {nlast} : i64"));
            let r = b.op(&format!("arith.muli {r}, {rowbytes} : i64"));
            let r = b.op(&format!("arith.addi {r}, {sb} : i64"));
            let mut w = vec![];
            for off in [16i64, 80] {
                let co = b.ci64(off);
                let a = b.op(&format!("arith.addi {r}, {co} : i64"));
                let a = b.op(&format!("arith.addi {a}, {lane_b} : i64"));
                w.extend(b.load_vec(p, &a, 4, "i32", 16));
            }
            w.extend(b.load_vec(p, &r, 4, "i32", 16));
            w
        })
        .collect()
}

/// One Q4_K super-block's MMAs for the one-row GEMV: x from shared memory at `xb` (this lane's
/// place in super-block 0, f16 pairs (x0, x2), (x1, x3) a quad as [`stage_x`] writes them),
/// each row's weights d·sc·q − dmin·m made f16 pairs in registers ([`q4k_scales`],
/// [`q4k_f16_words`]) — a word's quad i of sub-block A and of A + 1 two K steps — into the
/// accumulators. `valid` false (a clamped super-block past K): every weight 0.
fn q4k_math(b: &mut Body, gi: &str, valid: Option<&str>, w: &GroupW, acc: &[String], xb: &str, sel: &str) -> Vec<String> {
    let c512 = b.ci64(512);
    let go = b.op(&format!("arith.muli {gi}, {c512} : i64"));
    let base = b.op(&format!("arith.addi {xb}, {go} : i64"));
    // [half h, sub-block A or A + 1]: the lane's 16 values, quad i as pairs 2i, 2i + 1
    let xs: Vec<Vec<String>> = [(0usize, 0usize), (0, 1), (1, 0), (1, 1)]
        .iter()
        .map(|(h, s)| {
            let mut v = vec![];
            for q in 0..2 {
                let c = b.ci64((256 * h + 64 * s + 16 * q) as i64);
                let o = b.op(&format!("arith.addi {base}, {c} : i64"));
                let p = b.op(&format!("llvm.inttoptr {o} : i64 to !llvm.ptr<3>"));
                let r = b.op(&format!("llvm.load {p} {{alignment = 16 : i64}} : !llvm.ptr<3> -> vector<4xi32>"));
                v.extend(b.elements(&r, 4, "i32"));
            }
            v
        })
        .collect();
    let sc: Vec<Vec<[String; 4]>> = w.iter().map(|row| (0..2).map(|h| q4k_scales(b, &row[8..12], sel, h == 1, valid)).collect()).collect();
    let mut c: Vec<String> = acc.to_vec();
    for h in 0..2 {
        for i in 0..4 {
            let p: Vec<[String; 4]> = w.iter().enumerate().map(|(r, row)| q4k_f16_words(b, &row[4 * h + i], &sc[r][h])).collect();
            for (s, (i0, i1)) in [(0usize, (0usize, 1usize)), (1, (2, 3))] {
                let x = &xs[2 * h + s];
                c = b.mma_m16n8k16("f16", [&p[0][i0], &p[1][i0], &p[0][i1], &p[1][i1]], &x[2 * i], &x[2 * i + 1], [&c[0], &c[1], &c[2], &c[3]]);
            }
        }
    }
    c
}

/// A Q4_K row's scales for this lane's sub-blocks A = 4h + 2 (t / 2) and A + 1 (`hdr`: the
/// header's words — (d, dmin), scale bytes 0..3, 4..7, 8..11; `sel`: the `prmt` selector of
/// bytes 2 (t / 2), + 1; `second`: h = 1) as f16 pairs (d·sc_A, d·sc_A), (−dmin·m_A, ..),
/// (d·sc_B, ..), (−dmin·m_B, ..). The 6-bit sc and m (ggml's `get_scale_min_k4`: sub-blocks
/// 0..3 the low 6 bits of bytes j and j + 4; 4..7 the nibbles of byte j + 4 and the top 2 bits
/// of bytes j − 4 and j) are or-ed into f16 1024's bits and 1024 taken off (exact), then
/// multiplied by d and dmin (each rounded once to f16, as the products of the f32 reference).
fn q4k_scales(b: &mut Body, hdr: &[String], sel: &str, second: bool, valid: Option<&str>) -> [String; 4] {
    let st = "!llvm.struct<(i32, i32, i32, i32)>";
    let mut asm = String::from("{ .reg .b32 z, k, u, v, t, s, a, c, d2, m2; mov.b32 z, 0; mov.b32 k, 0x64006400; ");
    if second {
        asm.push_str("prmt.b32 c, $7, z, $8; ");
        asm.push_str("prmt.b32 a, $5, z, $8; shr.b32 t, a, 2; lop3.b32 t, t, 0x00300030, 0x64006400, 0xEA; lop3.b32 u, c, 0x000F000F, t, 0xEA; sub.f16x2 u, u, k; ");
        asm.push_str("prmt.b32 a, $6, z, $8; shr.b32 t, a, 2; lop3.b32 t, t, 0x00300030, 0x64006400, 0xEA; shr.b32 s, c, 4; lop3.b32 v, s, 0x000F000F, t, 0xEA; sub.f16x2 v, v, k; ");
    } else {
        asm.push_str("prmt.b32 u, $5, z, $8; lop3.b32 u, u, 0x003F003F, 0x64006400, 0xEA; sub.f16x2 u, u, k; ");
        asm.push_str("prmt.b32 v, $6, z, $8; lop3.b32 v, v, 0x003F003F, 0x64006400, 0xEA; sub.f16x2 v, v, k; ");
    }
    asm.push_str("prmt.b32 d2, $4, $4, 0x1010; prmt.b32 m2, $4, $4, 0x3232; mul.rn.f16x2 u, u, d2; mul.rn.f16x2 v, v, m2; xor.b32 v, v, 0x80008000; ");
    asm.push_str("prmt.b32 $0, u, u, 0x1010; prmt.b32 $1, v, v, 0x1010; prmt.b32 $2, u, u, 0x3232; prmt.b32 $3, v, v, 0x3232; }");
    let r = b.op(&format!("llvm.inline_asm \"{asm}\", \"=r,=r,=r,=r,r,r,r,r,r\" {}, {}, {}, {}, {sel} : (i32, i32, i32, i32, i32) -> {st}", hdr[0], hdr[1], hdr[2], hdr[3]));
    let z = b.op("arith.constant 0 : i32");
    [0, 1, 2, 3].map(|i| {
        let v = b.op(&format!("llvm.extractvalue {r}[{i}] : {st}"));
        match valid {
            Some(ok) => b.op(&format!("arith.select {ok}, {v}, {z} : i32")),
            None => v,
        }
    })
}

/// A Q4_K quant word (bytes 4i..4i + 3 of a sub-block pair: low nibbles values 4i.. of
/// sub-block A, high nibbles of A + 1) as the f16 pairs (A_0, A_2), (A_1, A_3), (B_0, B_2),
/// (B_1, B_3) of the weights d·sc·q − dmin·m (`sc`: [`q4k_scales`]'s four): each nibble pair
/// or-ed into an f16's bits (low nibbles 1024 + q, high nibbles in place 64 + q), the offset
/// taken off (exact), one `fma.rn.f16x2`.
fn q4k_f16_words(b: &mut Body, w: &str, sc: &[String; 4]) -> [String; 4] {
    let st = "!llvm.struct<(i32, i32, i32, i32)>";
    // (low nibbles under 1024's bits: 1024 + q; high ones, 16 q, under 64's: 64 + q — no
    // shift for them)
    let mut asm = String::from("{ .reg .b32 k, h, t, u; mov.b32 k, 0x64006400; mov.b32 h, 0x54005400; shr.u32 u, $4, 8; ");
    for (o, (src, mask, magic, off)) in
        [("$4", "0x000F000F", "0x64006400", "k"), ("u", "0x000F000F", "0x64006400", "k"), ("$4", "0x00F000F0", "0x54005400", "h"), ("u", "0x00F000F0", "0x54005400", "h")].iter().enumerate()
    {
        let (d, m) = if o < 2 { (5, 6) } else { (7, 8) };
        asm.push_str(&format!("lop3.b32 t, {src}, {mask}, {magic}, 0xEA; sub.f16x2 t, t, {off}; fma.rn.f16x2 ${o}, t, ${d}, ${m}; "));
    }
    asm.push('}');
    let r = b.op(&format!("llvm.inline_asm \"{asm}\", \"=r,=r,=r,=r,r,r,r,r,r\" {w}, {}, {}, {}, {} : (i32, i32, i32, i32, i32) -> {st}", sc[0], sc[1], sc[2], sc[3]));
    [0, 1, 2, 3].map(|i| b.op(&format!("llvm.extractvalue {r}[{i}] : {st}")))
}

/// An e4m3 word (bytes v0..v3, v0 lowest) as the f16 pairs (v0, v2) and (v1, v3), each value
/// e4m3 · 2^-8 exactly (f16 bits: the sign in place, exponent and mantissa one bit down;
/// e4m3's subnormals land on f16's): the other byte of each half shifted out of the way first.
fn f8_f16_pairs(b: &mut Body, w: &str) -> [String; 2] {
    let st = "!llvm.struct<(i32, i32)>";
    let asm = "{ .reg .b32 u, v; shl.b32 u, $2, 8; shr.b32 v, u, 1; lop3.b32 v, v, 0x3F803F80, 0, 0xC0; lop3.b32 $0, u, 0x80008000, v, 0xEA; shr.b32 v, $2, 1; lop3.b32 v, v, 0x3F803F80, 0, 0xC0; lop3.b32 $1, $2, 0x80008000, v, 0xEA; }";
    let r = b.op(&format!("llvm.inline_asm \"{asm}\", \"=r,=r,r\" {w} : (i32) -> {st}"));
    [0, 1].map(|i| b.op(&format!("llvm.extractvalue {r}[{i}] : {st}")))
}

/// A nibble word (values e0..e7: e_2j in nibble j, e_2j+1 in nibble 4 + j) as four bf16 pairs
/// (128 + q): (e0, e1), (e2, e3), (e4, e5), (e6, e7) — a shift and a `lop3` each.
fn i4_bf16_words(b: &mut Body, w: &str) -> [String; 4] {
    let st = "!llvm.struct<(i32, i32, i32, i32)>";
    let mut asm = String::from("{ .reg .b32 u; ");
    for (o, shift) in [0, 4, 8, 12].iter().enumerate() {
        if *shift == 0 {
            asm.push_str(&format!("lop3.b32 ${o}, $4, 0x000F000F, 0x43004300, 0xEA; "));
        } else {
            asm.push_str(&format!("shr.u32 u, $4, {shift}; lop3.b32 ${o}, u, 0x000F000F, 0x43004300, 0xEA; "));
        }
    }
    asm.push('}');
    let r = b.op(&format!("llvm.inline_asm \"{asm}\", \"=r,=r,=r,=r,r\" {w} : (i32) -> {st}"));
    [0, 1, 2, 3].map(|i| b.op(&format!("llvm.extractvalue {r}[{i}] : {st}")))
}

/// x's row `row` (f32, K values) into the shared `%xs` at byte address `base` as 16-bit pairs
/// (int4: bf16 in natural order; fp8: f16 pairs (x0, x2), (x1, x3) a quad), by the block's threads: every thread's 16-byte pieces loaded at once,
/// then converted and stored; a barrier after. Under `NormMatMul` (`Body::norm`) the row is
/// RMS-normalized on the way (its sum of squares over the block in `%red[0..W]`, then
/// x · (1 / rms) · g[k]): the norm's own launch is skipped at one row.
fn stage_x(b: &mut Body, f8: bool, k: usize, row: &str, t: &str, base: &str, smt: &str) {
    let threads = 32 * PACKED_WARPS;
    let chunks = k / 8;
    let t64 = b.idx64(t);
    let xrowbytes = b.ci64((k * 4) as i64);
    let xo = b.op(&format!("arith.muli {row}, {xrowbytes} : i64"));
    let c32 = b.ci64(32);
    let c16 = b.ci64(16);
    let norm = b.norm;
    let zero = b.cf32(0.0);
    let mut loaded = vec![];
    for r in 0..chunks.div_ceil(threads) {
        let cr = b.ci64((r * threads) as i64);
        let c = b.op(&format!("arith.addi {t64}, {cr} : i64"));
        let ok = (r * threads + threads > chunks).then(|| {
            let lim = b.ci64(chunks as i64);
            b.op(&format!("arith.cmpi slt, {c}, {lim} : i64"))
        });
        // (a thread past the end loads chunk 0, counts nothing and stores nothing)
        let cc = match &ok {
            Some(ok) => {
                let z = b.ci64(0);
                b.op(&format!("arith.select {ok}, {c}, {z} : i64"))
            }
            None => c.clone(),
        };
        let co = b.op(&format!("arith.muli {cc}, {c32} : i64"));
        let o = b.op(&format!("arith.addi {xo}, {co} : i64"));
        let o2 = b.op(&format!("arith.addi {o}, {c16} : i64"));
        let mut v = b.load_vec("%x", &o, 4, "f32", 16);
        v.extend(b.load_vec("%x", &o2, 4, "f32", 16));
        let gv = norm.map(|_| {
            let g2 = b.op(&format!("arith.addi {co}, {c16} : i64"));
            let mut g = b.load_vec("%g", &co, 4, "f32", 16);
            g.extend(b.load_vec("%g", &g2, 4, "f32", 16));
            g
        });
        loaded.push((c, ok, v, gv));
    }
    let scale = norm.map(|eps| {
        // this thread's sum of squares, the warp's, the block's through %red[0..W]
        let mut ss = zero.clone();
        for (_, ok, v, _) in &loaded {
            let mut part = zero.clone();
            for x in v {
                part = b.op(&format!("llvm.intr.fma({x}, {x}, {part}) : (f32, f32, f32) -> f32"));
            }
            if let Some(ok) = ok {
                part = b.op(&format!("arith.select {ok}, {part}, {zero} : f32"));
            }
            ss = b.op(&format!("arith.addf {ss}, {part} : f32"));
        }
        let ws = b.warp_sum(&ss);
        let (lane, warp) = b.lane_warp(t);
        let c0 = b.op("arith.constant 0 : index");
        let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
        b.line(&format!("scf.if {first} {{"));
        b.line(&format!("memref.store {ws}, %red[{warp}] : {smt}"));
        b.line("}");
        b.line("gpu.barrier");
        let parts: Vec<String> = (0..PACKED_WARPS)
            .map(|w| {
                let cw = b.op(&format!("arith.constant {w} : index"));
                b.op(&format!("memref.load %red[{cw}] : {smt}"))
            })
            .collect();
        let total = b.chain_reduce(&parts, "arith.addf");
        b.inv_rms(&total, k, eps)
    });
    for (c, ok, v, gv) in loaded {
        let v: Vec<String> = match (&scale, &gv) {
            (Some(inv), Some(g)) => v
                .iter()
                .zip(g)
                .map(|(x, g)| {
                    let y = b.op(&format!("arith.mulf {x}, {inv} : f32"));
                    b.op(&format!("arith.mulf {y}, {g} : f32"))
                })
                .collect(),
            _ => v,
        };
        // (int4: bf16 pairs in order; fp8: f16 (x0, x2), (x1, x3) per 4 values, as its weight
        // words unpack)
        let words: Vec<String> =
            if f8 { (0..4).map(|j| b.pack2(&v[4 * (j / 2) + j % 2], &v[4 * (j / 2) + j % 2 + 2], true)).collect() } else { (0..4).map(|j| b.pack2(&v[2 * j], &v[2 * j + 1], false)).collect() };
        let vec_v = b.vector(&words, "i32");
        let so = b.op(&format!("arith.muli {c}, {c16} : i64"));
        let sa = b.op(&format!("arith.addi {base}, {so} : i64"));
        let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
        if let Some(ok) = &ok {
            b.line(&format!("scf.if {ok} {{"));
        }
        b.line(&format!("llvm.store {vec_v}, {sp} {{alignment = 16 : i64}} : vector<4xi32>, !llvm.ptr<3>"));
        if ok.is_some() {
            b.line("}");
        }
    }
    b.line("gpu.barrier");
}

/// The addressing every reader of an [`DType::I4G128`] element starts with: for flat element
/// `e` (i64), its super-block's byte offset, its group (0..4) and place in it (0..128), and the
/// byte offset of the group's (d, m) word (`c4`: the constant 4, reused).
struct I4Group {
    base: String,
    g: String,
    p: String,
    so: String,
    c4: String,
}

fn i4g128_group(b: &mut Body, e: &str) -> I4Group {
    let c512 = b.ci64(512);
    let sb = b.op(&format!("arith.divui {e}, {c512} : i64"));
    let r = b.op(&format!("arith.remui {e}, {c512} : i64"));
    let c272 = b.ci64(272);
    let base = b.op(&format!("arith.muli {sb}, {c272} : i64"));
    let c128 = b.ci64(128);
    let g = b.op(&format!("arith.divui {r}, {c128} : i64"));
    let p = b.op(&format!("arith.remui {r}, {c128} : i64"));
    let c4 = b.ci64(4);
    let so = b.op(&format!("arith.muli {g}, {c4} : i64"));
    let so = b.op(&format!("arith.addi {base}, {so} : i64"));
    I4Group { base, g, p, so, c4 }
}

/// One [`DType::I4G128`] value at flat element `e` (i64) of `ptr` as f32 (`Body::weight_elem`).
pub(crate) fn i4g128_elem(b: &mut Body, ptr: &str, e: &str) -> String {
    // super-block e / 512 (272 bytes): group g's d, m at 4g; its value p (0..128)
    // at 16 + 64g: chunk c = p % 16 / 4, word w = p / 32, i = p % 4 + 4 (p % 32 / 16)
    // in nibble i / 2 (+ 4 when odd) (`dsc_ir::quant::i4g128_nibble`)
    let I4Group { base, g, p, so, c4 } = i4g128_group(b, e);
    let d = b.f16_at_byte(ptr, &so);
    let c2 = b.ci64(2);
    let mo = b.op(&format!("arith.addi {so}, {c2} : i64"));
    let m = b.f16_at_byte(ptr, &mo);
    let c64 = b.ci64(64);
    let c16 = b.ci64(16);
    let c32 = b.ci64(32);
    let go = b.op(&format!("arith.muli {g}, {c64} : i64"));
    let o = b.op(&format!("arith.addi {base}, {c16} : i64"));
    let o = b.op(&format!("arith.addi {o}, {go} : i64"));
    let w = b.op(&format!("arith.divui {p}, {c32} : i64"));
    let r32 = b.op(&format!("arith.remui {p}, {c32} : i64"));
    let half = b.op(&format!("arith.divui {r32}, {c16} : i64"));
    let r16 = b.op(&format!("arith.remui {r32}, {c16} : i64"));
    let c = b.op(&format!("arith.divui {r16}, {c4} : i64"));
    let co = b.op(&format!("arith.muli {c}, {c16} : i64"));
    let wo = b.op(&format!("arith.muli {w}, {c4} : i64"));
    let o = b.op(&format!("arith.addi {o}, {co} : i64"));
    let o = b.op(&format!("arith.addi {o}, {wo} : i64"));
    let i4 = b.op(&format!("arith.remui {r32}, {c4} : i64"));
    let h4 = b.op(&format!("arith.muli {half}, {c4} : i64"));
    let i8 = b.op(&format!("arith.addi {i4}, {h4} : i64"));
    let j = b.op(&format!("arith.divui {i8}, {c2} : i64"));
    let odd = b.op(&format!("arith.remui {i8}, {c2} : i64"));
    let o4 = b.op(&format!("arith.muli {odd}, {c4} : i64"));
    let nib = b.op(&format!("arith.addi {j}, {o4} : i64"));
    let bo = b.op(&format!("arith.divui {nib}, {c2} : i64"));
    let o = b.op(&format!("arith.addi {o}, {bo} : i64"));
    let byte = b.u8_at_byte(ptr, &o);
    let hi = b.op(&format!("arith.remui {nib}, {c2} : i64"));
    let sh = b.op(&format!("arith.muli {hi}, {c4} : i64"));
    let sh = b.op(&format!("arith.trunci {sh} : i64 to i32"));
    let shifted = b.op(&format!("arith.shrui {byte}, {sh} : i32"));
    let m15 = b.op("arith.constant 15 : i32");
    let q = b.op(&format!("arith.andi {shifted}, {m15} : i32"));
    let q = b.op(&format!("arith.uitofp {q} : i32 to f32"));
    b.op(&format!("llvm.intr.fma({d}, {q}, {m}) : (f32, f32, f32) -> f32"))
}

/// The eight [`DType::I4G128`] values at flat element `e0` (i64, a multiple of 8) as f32:
/// in group p = e0 % 128 = 8a they are word a / 4 of chunks c and c + 1 (c = 2 (a % 2)),
/// values i = 4 (a % 4 / 2) .. + 4 of each (`dsc_ir::quant::i4g128_nibble`), d · q + m
pub(crate) fn i4g128_eight(b: &mut Body, ptr: &str, e0: &str) -> Vec<String> {
    let I4Group { base, g, p, so, c4 } = i4g128_group(b, e0);
    let sw = b.load_vec(ptr, &so, 1, "i32", 4).remove(0);
    let [d, m] = b.f16_pair(&sw);
    // a = p / 8: word a / 4, chunk 2 (a % 2), half a % 4 / 2
    let c8 = b.ci64(8);
    let a = b.op(&format!("arith.divui {p}, {c8} : i64"));
    let w = b.op(&format!("arith.divui {a}, {c4} : i64"));
    let c2 = b.ci64(2);
    let a2 = b.op(&format!("arith.remui {a}, {c2} : i64"));
    let c32 = b.ci64(32);
    let co = b.op(&format!("arith.muli {a2}, {c32} : i64"));
    let a4 = b.op(&format!("arith.remui {a}, {c4} : i64"));
    let half = b.op(&format!("arith.divui {a4}, {c2} : i64"));
    let c64 = b.ci64(64);
    let go = b.op(&format!("arith.muli {g}, {c64} : i64"));
    let c16 = b.ci64(16);
    let o = b.op(&format!("arith.addi {base}, {c16} : i64"));
    let o = b.op(&format!("arith.addi {o}, {go} : i64"));
    let o = b.op(&format!("arith.addi {o}, {co} : i64"));
    let wo = b.op(&format!("arith.muli {w}, {c4} : i64"));
    let o = b.op(&format!("arith.addi {o}, {wo} : i64"));
    let o2 = b.op(&format!("arith.addi {o}, {c16} : i64"));
    let words = [b.load_vec(ptr, &o, 1, "i32", 4).remove(0), b.load_vec(ptr, &o2, 1, "i32", 4).remove(0)];
    // values i = 4 half + (0..4): nibbles (0, 4, 1, 5) + 2 half; shift 4 nib
    let h32 = b.op(&format!("arith.trunci {half} : i64 to i32"));
    let c8i = b.op("arith.constant 8 : i32");
    let hs = b.op(&format!("arith.muli {h32}, {c8i} : i32"));
    let m15 = b.op("arith.constant 15 : i32");
    let mut out = vec![];
    for wd in &words {
        let ws = b.op(&format!("arith.shrui {wd}, {hs} : i32"));
        for nib in [0, 4, 1, 5] {
            let c = b.op(&format!("arith.constant {} : i32", 4 * nib));
            let q = b.op(&format!("arith.shrui {ws}, {c} : i32"));
            let q = b.op(&format!("arith.andi {q}, {m15} : i32"));
            let q = b.op(&format!("arith.uitofp {q} : i32 to f32"));
            out.push(b.op(&format!("llvm.intr.fma({d}, {q}, {m}) : (f32, f32, f32) -> f32")));
        }
    }
    out
}

/// For flat element `e` (i64) of an [`DType::F8G128`] tensor: (the byte offset of its e4m3
/// code, 256 x its group's scale: the codes unpack to e4m3 · 2^-8, [`f8_f16_pairs`]).
fn f8g128_at(b: &mut Body, ptr: &str, e: &str) -> (String, String) {
    // super-block e / 512 (528 bytes): group g's scale at 4g, value r (0..512) at 16 + r
    let c512 = b.ci64(512);
    let sb = b.op(&format!("arith.divui {e}, {c512} : i64"));
    let r = b.op(&format!("arith.remui {e}, {c512} : i64"));
    let c528 = b.ci64(528);
    let base = b.op(&format!("arith.muli {sb}, {c528} : i64"));
    let c128 = b.ci64(128);
    let g = b.op(&format!("arith.divui {r}, {c128} : i64"));
    let c4 = b.ci64(4);
    let so = b.op(&format!("arith.muli {g}, {c4} : i64"));
    let so = b.op(&format!("arith.addi {base}, {so} : i64"));
    let sw = b.load_vec(ptr, &so, 1, "f32", 4).remove(0);
    let c256 = b.cf32(256.0);
    let s256 = b.op(&format!("arith.mulf {sw}, {c256} : f32"));
    let c16 = b.ci64(16);
    let o = b.op(&format!("arith.addi {base}, {c16} : i64"));
    (b.op(&format!("arith.addi {o}, {r} : i64")), s256)
}

/// One [`DType::F8G128`] value at flat element `e` (i64) of `ptr` as f32 (`Body::weight_elem`):
/// its byte as the low value of the GEMV's unpack.
pub(crate) fn f8g128_elem(b: &mut Body, ptr: &str, e: &str) -> String {
    let (o, s256) = f8g128_at(b, ptr, e);
    let byte = b.u8_at_byte(ptr, &o);
    let [p02, _] = f8_f16_pairs(b, &byte);
    let [v, _] = b.f16_pair(&p02);
    b.op(&format!("arith.mulf {v}, {s256} : f32"))
}

/// The eight [`DType::F8G128`] values at flat element `e0` (i64, a multiple of 8: one group's,
/// 8-byte aligned) as f32: two words unpacked as the GEMV unpacks them.
pub(crate) fn f8g128_eight(b: &mut Body, ptr: &str, e0: &str) -> Vec<String> {
    let (o, s256) = f8g128_at(b, ptr, e0);
    let words = b.load_vec(ptr, &o, 2, "i32", 8);
    let mut out = vec![];
    for w in &words {
        // (the pairs are (v0, v2) and (v1, v3))
        let [p02, p13] = f8_f16_pairs(b, w);
        let ([v0, v2], [v1, v3]) = (b.f16_pair(&p02), b.f16_pair(&p13));
        for v in [v0, v1, v2, v3] {
            out.push(b.op(&format!("arith.mulf {v}, {s256} : f32")));
        }
    }
    out
}
