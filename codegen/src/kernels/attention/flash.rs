//! Prefill attention (FlashAttention-2 tiles over the paged KV pools): a block per (64 query
//! rows, head) on mma.sync (`FlashAttention`, f32 or bf16 pools, 4 or 8 warps, 1 or 2 m16 tiles
//! per warp) and, on sm_90a with bf16 pools at D 128, both products on wgmma with K/V tiles by
//! TMA and a lazy rescale (`FlashWgmma`: 8B layer at 4k 463-467 TFLOP/s vs SDPA 484).
//! `emit_flash_attention` is one function (~1,000 lines) because it writes one kernel whose
//! loop carries every accumulator: its phases (Q fragments, the K/V stage ring, S = QKᵀ, the
//! online softmax, O += PV, the epilogue), marked in order by its comments, share the loop's
//! SSA values and the closures that issue the K/V copies — cut into functions, each would take
//! and return dozens of them. Its preconditions are `flash_attention_fits`. Semantics:
//! `dsc_ir::exec`'s `paged_attention`.

use crate::kernels::*;

/// The readable symbol of a `flash` kernel (`KernelSpec::symbol`).
pub(crate) fn flash_symbol(spec: &KernelSpec) -> String {
    match spec {
            KernelSpec::FlashWgmma { inner } => match inner.as_ref() {
                // (K/V tiles by TMA: `_wgt`)
                KernelSpec::FlashAttention { bs, .. } if flash_wg_tma_rows(*bs).is_some() => format!("{}_wgt", inner.symbol()),
                _ => format!("{}_wg", inner.symbol()),
            },
            KernelSpec::FlashAttention { h, kvh, d, bs, kv, warps, mtiles, .. } => {
                format!(
                    "flash_attention_h{h}_kv{kvh}_d{d}_bs{bs}{}{}{}",
                    if *warps == 4 { String::new() } else { format!("_w{warps}") },
                    if *mtiles == 1 { String::new() } else { format!("_m{mtiles}") },
                    kv_suffix(*kv)
                )
            }
        other => unreachable!("{other:?} is not a flash kernel (kernels::family)"),
    }
}

/// How the runtime launches a `flash` kernel (`KernelSpec::launch`).
pub(crate) fn flash_launch(spec: &KernelSpec) -> Launch {
    match spec {
            // (grid x = heads: work H with 1 "output" per block; y = tiles of 64 tokens)
            KernelSpec::FlashAttention { d, kv, warps, mtiles, .. } => {
                Launch::Tile { outputs: 1, rows: (16 * *mtiles * *warps) as u32, threads: 32 * *warps as u32, smem: flash_smem(*d, *kv, *warps, *mtiles) as u32, carveout: true }
            }
            // (+ the producer warpgroup, and a full and an empty mbarrier per stage)
            KernelSpec::FlashWgmma { inner } => match inner.as_ref() {
                KernelSpec::FlashAttention { d, bs, .. } => {
                    // (a query head per block; TMA tiles: + the two stages' mbarriers and use
                    // counts)
                    let tma = if flash_wg_tma_rows(*bs).is_some() { FLASH_WG_TMA_BYTES } else { 0 };
                    Launch::Tile { outputs: 1, rows: 64, threads: 128, smem: (flash_wg_smem(*d) + tma) as u32, carveout: true }
                }
                other => other.launch(),
            },
        other => unreachable!("{other:?} is not a flash kernel (kernels::family)"),
    }
}

/// Keys per step of the prefill attention's K/V loop.
pub(crate) const FLASH_KEYS: usize = 64;

/// Keys per K/V tile of the prefill attention: [`FLASH_KEYS`], half that with 2 m16 tiles
/// per warp.
pub(crate) fn flash_keys(mtiles: usize) -> usize {
    if mtiles > 1 {
        FLASH_KEYS / 2
    } else {
        FLASH_KEYS
    }
}

/// Dynamic shared memory of a [`KernelSpec::FlashAttention`] block: from f32 pools, the K
/// tile (64 keys x d bf16, rows padded by 16 bytes) and V transposed (d rows x 64 keys bf16,
/// padded by 16 bytes), so the mma fragment loads hit every bank once; from bf16 pools, two
/// stages of the K and V tiles as the pools hold them (64 keys x d, rows padded by 16 bytes:
/// `ldmatrix` rows on distinct banks), one filling while the other is read, then (2 m16 tiles
/// per warp) the block's Q rows in bf16, padded alike.
pub fn flash_smem(d: usize, kv: DType, warps: usize, mtiles: usize) -> usize {
    if kv == DType::F32 {
        FLASH_KEYS * (2 * d + 16) + d * (2 * FLASH_KEYS + 16)
    } else {
        // (+ the block's Q rows in bf16 with 2 m16 tiles per warp)
        let q_rows = if mtiles > 1 { 16 * mtiles * warps } else { 0 };
        2 * 2 * flash_keys(mtiles) * (2 * d + 16) + q_rows * (2 * d + 16)
    }
}

/// The head dim the wgmma prefill attention takes: 128 (checked on the H200; with D = 64 the
/// same code failed the kernel check, rel. error 0.13-0.68, cause not found yet — the one
/// difference in the instructions is PV's m64n64 with V read N-major in a single swizzle atom).
pub const FLASH_WG_D: usize = 128;

/// Rows per TMA box of the wgmma prefill attention's K/V tiles (the tiles come as boxes of 64
/// columns x rows keys) from the pools' 4-D tensor maps, `{pool}@kvmap{rows}`, on one
/// mbarrier per stage, in place of every thread's `cp.async` copies and their address math —
/// ~45% of the loop's instructions; ncu: the integer pipe was the busiest). A box never
/// crosses a cache block and starts on a 128-byte swizzle atom row group: `bs` a multiple of 8.
/// None: `cp.async` (other block sizes). 8B layer at 4,096 tokens 351 -> 424 TFLOP/s, 16,384
/// 393 -> 455 (bench/results/flash-tma-2026-11-30.json).
pub fn flash_wg_tma_rows(bs: usize) -> Option<usize> {
    let rows = bs.min(FLASH_KEYS);
    (bs % 8 == 0 && bs > 0 && FLASH_KEYS % rows == 0 && bs % rows == 0).then_some(rows)
}

/// Shared memory past the wgmma attention's K/V stages when they load by TMA: two mbarriers
/// (8 bytes each) and the two stages' use counts (4 bytes each), padded.
pub const FLASH_WG_TMA_BYTES: usize = 64;

/// Whether the wgmma prefill attention's kernel takes head dim `d`: [`FLASH_WG_D`] (D = 64
/// failed the kernel check, above).
pub fn flash_wg_d_ok(d: usize) -> bool {
    d == FLASH_WG_D
}

/// The V descriptor's (LBO, SBO) in bytes for the wgmma prefill attention: 64 keys x 128
/// bytes between head-dim column blocks, 1 KB between 8-key groups.
pub(crate) const FLASH_WG_VDESC: (u64, u64) = ((FLASH_KEYS * 128) as u64, 1024);

/// Dynamic shared memory of a [`KernelSpec::FlashWgmma`] block: two stages of the K and V
/// tiles (64 keys x D bf16 each, in D/64 column blocks of 64 rows x 128 bytes, 128-byte
/// swizzle), + 1 KB to align the base as the swizzle needs. (One query head per block: two
/// heads of a KV head per block, a warpgroup each sharing the tiles, measured slower — 8B layer
/// at 4k 351 -> 332 TFLOP/s — and so did issuing the next tile's S before this tile's softmax
/// from three stages — one block per SM, 68% of the throughput: bench/results/
/// flash-wgmma-2026-11-30.json; both went.)
pub fn flash_wg_smem(d: usize) -> usize {
    2 * 2 * FLASH_KEYS * d * 2 + 1024
}

/// [`crate::options::KernelOptions::flash_lazy`]'s default, in log2 units: the wgmma prefill
/// attention's lazy rescale (FlashAttention-4's) — a row's reference max, which its
/// probabilities are taken against, moves only where a tile's max passes it by more than this
/// many log2 units, so P <= 2^threshold, exact after the final division (O and the sum share
/// the reference); a warp rescales its O accumulators only where one of its rows moved it:
/// after the first tiles almost never (64 multiplies per thread per tile saved).
pub const FLASH_LAZY_THRESHOLD: f32 = 8.0;

/// The prefill attention ([`KernelSpec::FlashAttention`]), FlashAttention-2 style on `mma.sync`
/// m16n8k16 (bf16 operands, f32 accumulation; sm_80 and sm_90a).
///
/// Block = 4 warps = 64 query rows (tokens t0..t0+63) of one head; warp w owns rows 16w..+15
/// and keeps its Q fragments (pre-scaled by scale·log2 e), its output accumulators and its
/// rows' running max and sum in registers. The tile's rows are taken in runs of one sequence
/// (a step mixes prefill chunks and decode tokens): for each run, the block walks that
/// sequence's keys 0..=max position in steps of 64 — the block gathers them from the paged
/// caches (f32) into shared memory as bf16, K row-major, V transposed — and each warp computes
/// S = Q Kᵀ (16 x 64), masks keys past each row's position and rows outside the run, updates
/// the online softmax (exp2), and accumulates P V with P packed from the S registers.
///
/// From bf16 pools (`kv`), the tiles are copied as they are with `cp.async` (16 bytes per copy,
/// no registers) into two stages, tile i + 1's copies in flight while tile i is computed, and
/// the mma B fragments come from `ldmatrix` (K) and `ldmatrix.trans` (V, stored key-major).
pub(crate) fn emit_flash_attention(b: &mut Body, h: usize, kvh: usize, d: usize, bs: usize, scale_bits: u32, kv: DType, warps: usize, mt: usize) -> Result<String, String> {
    flash_attention_fits(h, kvh, d, bs, kv, warps, mt)?;
    let wide = kv == DType::F32;
    let nt = 32 * warps as i64; // threads
    // keys per K/V tile: 64, or 32 with 2 m16 tiles per warp (its S and P registers halved)
    #[allow(non_snake_case)]
    let KEYS: usize = flash_keys(mt);
    // row strides in bytes: K's; V's — transposed rows of 64 keys (f32 pools), or key rows as
    // K's (bf16: `ldmatrix.trans`)
    let ks = (2 * d + 16) as i64;
    let vs = if wide { (2 * KEYS + 16) as i64 } else { ks };
    // (wgmma: K's and V's tiles in column blocks of 64 head-dim elements, 64 keys x 128 bytes
    // each, 128-byte swizzle: what both descriptors read)
    let wg = b.flash_wg;
    // (positions as i32, the output rows re-derived after the loops and (wgmma) the lane rows
    // read per run — ptxas: the TMA wgmma kernel's spills at 168 registers 44 -> 0 bytes, the
    // mma.sync kernels' 12 -> 0 (bs 4), 24 -> 12 (f32 pools), 52 -> 36-40 (2 m-tiles); H200,
    // 8B layer at 4k: 462-463 -> 463-467 TFLOP/s, 16k 485-505 -> 494-522, flash bundle 24/24,
    // streams equal (bench/results/flash-pos32-2026-11-30.json); `KernelOptions::flash_pos32`)
    let pos32 = b.o.flash_pos32;
    let v_at = if wg { (KEYS * d * 2) as i64 } else { (KEYS as i64) * ks };
    // (bf16: a stage = the K tile, then the V tile)
    let stage_bytes = 2 * v_at;
    let nd8 = d / 8; // output column tiles
    let nkc = d / 16; // k16 steps over the head dim
    let nacc = nd8 * 4; // O accumulators per m16 tile
    let ncar = mt * (nacc + 4); // carried: every tile's O, then (m, l) of each of the 2·mt rows
    let q_at = 2 * stage_bytes; // (mt 2: the block's Q rows in bf16)
    let c = |b: &mut Body, v: i64| b.ci64(v);
    b.line("%dsm = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>");
    let base = b.op("memref.extract_aligned_pointer_as_index %dsm : memref<?xi8, #gpu.address_space<workgroup>> -> index");
    let base = b.idx64(&base);
    // (wgmma: the base rounded up to 1 KB, as the 128-byte swizzle needs; the 1 KB pad is in
    // `flash_wg_smem`)
    let base = if wg {
        let c1023 = c(b, 1023);
        let up = b.op(&format!("arith.addi {base}, {c1023} : i64"));
        let cmask = c(b, !1023);
        b.op(&format!("arith.andi {up}, {cmask} : i64"))
    } else {
        base
    };
    let t = b.op("gpu.thread_id x");
    let t = b.idx64(&t);
    let hq = b.op("gpu.block_id x");
    let hq = b.idx64(&hq);
    // (the last query tiles, which see the most keys, start first: less of a tail)
    let tile = b.op("gpu.block_id y");
    let tiles = b.op("gpu.grid_dim y");
    let tile = b.op(&format!("arith.subi {tiles}, {tile} : index"));
    let onei0 = b.op("arith.constant 1 : index");
    let tile = b.op(&format!("arith.subi {tile}, {onei0} : index"));
    let tile = b.idx64(&tile);
    let c4 = c(b, 4);
    let c8 = c(b, 8);
    let c16 = c(b, 16);
    let c2 = c(b, 2);
    let c0 = c(b, 0);
    let (warp, lane, g, tq) = b.mma_coords(&t);
    // (K/V tiles by TMA: thread 0 arms stage st's mbarrier, at 2·stage_bytes + 8·st, and
    // issues the tile's boxes on it; the stages' use counts past the mbarriers give each run's
    // wait parities — a tile mixing sequences walks the K/V loop once per sequence)
    let tma_rows = if wg { flash_wg_tma_rows(bs) } else { None };
    let tfirst = tma_rows.map(|_| {
        let c0 = c(b, 0);
        b.op(&format!("arith.cmpi eq, {t}, {c0} : i64"))
    });
    let bar_at = 2 * stage_bytes;
    let mbar = |b: &mut Body, st: &str| -> String {
        let c8 = b.ci64(8);
        let o = b.op(&format!("arith.muli {st}, {c8} : i64"));
        let cb = b.ci64(bar_at);
        let o = b.op(&format!("arith.addi {o}, {cb} : i64"));
        let a = b.op(&format!("arith.addi {base}, {o} : i64"));
        b.op(&format!("arith.trunci {a} : i64 to i32"))
    };
    let uses_ptr = |b: &mut Body, st: usize| -> String {
        let o = b.ci64(bar_at + 16 + 4 * st as i64);
        let a = b.op(&format!("arith.addi {base}, {o} : i64"));
        b.op(&format!("llvm.inttoptr {a} : i64 to !llvm.ptr<3>"))
    };
    if let Some(first) = &tfirst {
        b.line(&format!("scf.if {first} {{"));
        for st in 0..2 {
            let cst = c(b, st);
            let mb = mbar(b, &cst);
            b.line(&format!("llvm.inline_asm has_side_effects \"mbarrier.init.shared::cta.b64 [$0], 1;\", \"r\" {mb} : (i32) -> ()"));
            let p = uses_ptr(b, st as usize);
            let z = b.op("arith.constant 0 : i32");
            b.line(&format!("llvm.store {z}, {p} : i32, !llvm.ptr<3>"));
        }
        b.line("llvm.inline_asm has_side_effects \"fence.mbarrier_init.release.cluster;\", \"\" : () -> ()");
        b.line("}");
    }
    let crows = c(b, (16 * mt * warps) as i64);
    let t0 = b.op(&format!("arith.muli {tile}, {crows} : i64"));
    let crep = c(b, (h / kvh) as i64);
    let kh = b.op(&format!("arith.divui {hq}, {crep} : i64"));
    let ch = c(b, h as i64);
    let cd = c(b, d as i64);
    let ckvh = c(b, kvh as i64);
    let cbs = c(b, bs as i64);
    // rows in this tile, and this thread's two rows of each of its warp's m16 tiles (a = g,
    // b = g + 8 of tile i: warp rows 16·mt·w + 16 i)
    let left = b.op(&format!("arith.subi %n, {t0} : i64"));
    let nrows = b.op(&format!("arith.minsi {left}, {crows} : i64"));
    let cwr = c(b, (16 * mt) as i64);
    let w16 = b.op(&format!("arith.muli {warp}, {cwr} : i64"));
    let mut rels = vec![];
    for i in 0..mt {
        let ci = c(b, 16 * i as i64);
        let ra = b.op(&format!("arith.addi {w16}, {ci} : i64"));
        let ra = b.op(&format!("arith.addi {ra}, {g} : i64"));
        let rb = b.op(&format!("arith.addi {ra}, {c8} : i64"));
        rels.push(ra);
        rels.push(rb);
    }
    let mut rows = vec![];
    for rel in &rels {
        let row = b.op(&format!("arith.addi {t0}, {rel} : i64"));
        let ok = b.op(&format!("arith.cmpi slt, {rel}, {nrows} : i64"));
        let rc = b.op(&format!("arith.select {ok}, {row}, {t0} : i64"));
        // (the position as i32, one register across the loops; DSC_FLASH_POS32=0: i64)
        let p = if pos32 { b.load_t("%pos", &rc, "i32") } else { b.load_i32_as_i64("%pos", &rc) };
        rows.push((rel.clone(), rc, ok, p));
    }
    // Q fragments (m16n8k16 A layout), scaled so S is in log2 units
    let scale = b.cf32(f32::from_bits(scale_bits) * std::f32::consts::LOG2_E);
    let mut qf = vec![];
    let qrow = |b: &mut Body, rc: &str| -> String {
        let r = b.op(&format!("arith.muli {rc}, {ch} : i64"));
        let r = b.op(&format!("arith.addi {r}, {hq} : i64"));
        b.op(&format!("arith.muli {r}, {cd} : i64"))
    };
    let tq2 = b.op(&format!("arith.muli {tq}, {c2} : i64"));
    // the block's rows of Q (scaled) into shared memory as bf16, 8 elements per copy, chunk
    // `cc` of row `rr` at `base` + `at(rr, cc)`: 2 m16 tiles per warp (ldmatrix rows padded
    // like K's), or pipelined wgmma (after the three K/V stages, in the K tiles' layout, for
    // the S wgmma's A descriptor)
    let stage_q = |b: &mut Body, at: &dyn Fn(&mut Body, &str, &str) -> String| {
        let nch = (d / 8) as i64;
        let cnch = c(b, nch);
        for i in 0..(16 * mt * warps) as i64 * nch / nt {
            let ci = c(b, nt * i);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let rr = b.op(&format!("arith.divui {u}, {cnch} : i64"));
            let cc = b.op(&format!("arith.remui {u}, {cnch} : i64"));
            let ok = b.op(&format!("arith.cmpi slt, {rr}, {nrows} : i64"));
            let row = b.op(&format!("arith.addi {t0}, {rr} : i64"));
            let row = b.op(&format!("arith.select {ok}, {row}, {t0} : i64"));
            let e = qrow(b, &row);
            let c8e = c(b, 8);
            let co = b.op(&format!("arith.muli {cc}, {c8e} : i64"));
            let e = b.op(&format!("arith.addi {e}, {co} : i64"));
            let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
            let v0 = b.load_vec("%q", &by, 4, "f32", 16);
            let c16q = c(b, 16);
            let by1 = b.op(&format!("arith.addi {by}, {c16q} : i64"));
            let v1 = b.load_vec("%q", &by1, 4, "f32", 16);
            let v: Vec<String> = v0.iter().chain(&v1).map(|x| b.op(&format!("arith.mulf {x}, {scale} : f32"))).collect();
            let packed: Vec<String> = (0..4).map(|j| b.pack2(&v[2 * j], &v[2 * j + 1], false)).collect();
            let so = at(b, &rr, &cc);
            let sa = b.op(&format!("arith.addi {base}, {so} : i64"));
            let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
            let vv = b.vector(&packed, "i32");
            b.line(&format!("llvm.store {vv}, {sp} {{alignment = 16 : i64}} : vector<4xi32>, !llvm.ptr<3>"));
        }
    };
    if mt > 1 {
        stage_q(b, &|b: &mut Body, rr: &str, cc: &str| {
            let cks = b.ci64(ks);
            let so = b.op(&format!("arith.muli {rr}, {cks} : i64"));
            let c16o = b.ci64(16);
            let co = b.op(&format!("arith.muli {cc}, {c16o} : i64"));
            let so = b.op(&format!("arith.addi {so}, {co} : i64"));
            let cqa = b.ci64(q_at);
            b.op(&format!("arith.addi {so}, {cqa} : i64"))
        });
    }
    let (qa, qb) = (qrow(b, &rows[0].1), qrow(b, &rows[1].1));
    for kc in (0..nkc as i64).filter(|_| mt == 1) {
        for (qbase, off) in [(&qa, 0i64), (&qb, 0), (&qa, 8), (&qb, 8)] {
            let co = c(b, 16 * kc + off);
            let e = b.op(&format!("arith.addi {qbase}, {co} : i64"));
            let e = b.op(&format!("arith.addi {e}, {tq2} : i64"));
            let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
            let v = b.load_vec("%q", &by, 2, "f32", 8);
            let lo = b.op(&format!("arith.mulf {}, {scale} : f32", v[0]));
            let hi = b.op(&format!("arith.mulf {}, {scale} : f32", v[1]));
            qf.push(b.pack2(&lo, &hi, false));
        }
    }
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let zero = b.cf32(0.0);
    let quad = |b: &mut Body, x: &str, combine: &str| -> String { b.xor_reduce(x, combine, &[1, 2]) };
    let ex2 = |b: &mut Body, x: &str| b.asm1("ex2.approx.ftz.f32", x);
    let mma = |b: &mut Body, a: &[String], b0: &str, b1: &str, acc: &[String]| -> Vec<String> { b.mma_m16n8k16("bf16", [&a[0], &a[1], &a[2], &a[3]], b0, b1, [&acc[0], &acc[1], &acc[2], &acc[3]]) };
    let lds = |b: &mut Body, off: &str| -> String {
        let p = b.op(&format!("arith.addi {base}, {off} : i64"));
        let p = b.op(&format!("llvm.inttoptr {p} : i64 to !llvm.ptr<3>"));
        b.op(&format!("llvm.load {p} {{alignment = 4 : i64}} : !llvm.ptr<3> -> i32"))
    };
    // carried: output accumulators of each m16 tile, then (m, l) of each row
    let carried_tys = vec!["f32"; ncar].join(", ");
    let init: Vec<String> = (0..mt * nacc).map(|_| zero.clone()).chain((0..2 * mt).flat_map(|_| [ninf.clone(), zero.clone()])).collect();
    // this lane's rows for the runs' scans: (row in the tile, inside it, seq, pos)
    let true_ = b.op("arith.constant true");
    // (pos32, wgmma: this lane's rows read per run inside the loop over runs, the lane from
    // its special register, rather than held in registers across the loops)
    let per_run = pos32 && wg;
    let lane_rows_of = |b: &mut Body| {
        let lane = if per_run {
            let v = b.op("llvm.inline_asm has_side_effects \"mov.u32 $0, %laneid;\", \"=r\" : () -> i32");
            b.op(&format!("arith.extui {v} : i32 to i64"))
        } else {
            lane.clone()
        };
        let mut lane_rows = vec![];
        for k in 0..(16 * mt * warps) / 32 {
            let ck = b.ci64(32 * k as i64);
            let j = b.op(&format!("arith.addi {lane}, {ck} : i64"));
            let valid = b.op(&format!("arith.cmpi slt, {j}, {nrows} : i64"));
            let tj = b.op(&format!("arith.addi {t0}, {j} : i64"));
            let tj = b.op(&format!("arith.select {valid}, {tj}, {t0} : i64"));
            // (seq and pos kept as i32: fewer registers across the loops)
            let sq = b.load_t("%seq", &tj, "i32");
            let ps = b.load_t("%pos", &tj, "i32");
            lane_rows.push((j, valid, sq, ps));
        }
        lane_rows
    };
    let early_lane_rows = if per_run { vec![] } else { lane_rows_of(b) };
    // runs of one sequence: r .. end
    let runs = b.v();
    let (r_in, r_body) = (b.v(), b.v());
    let acc_in: Vec<String> = (0..ncar).map(|_| b.v()).collect();
    let acc_body: Vec<String> = (0..ncar).map(|_| b.v()).collect();
    b.line(&format!(
        "{runs}:{} = scf.while ({r_in} = {c0}, {}) : (i64, {carried_tys}) -> (i64, {carried_tys}) {{",
        ncar + 1,
        acc_in.iter().zip(&init).map(|(a, i)| format!("{a} = {i}")).collect::<Vec<_>>().join(", ")
    ));
    let more = b.op(&format!("arith.cmpi slt, {r_in}, {nrows} : i64"));
    b.line(&format!("scf.condition({more}) {r_in}, {} : i64, {carried_tys}", acc_in.join(", ")));
    b.line("} do {");
    b.line(&format!("^bb0({r_body}: i64, {}):", acc_body.iter().map(|a| format!("{a}: f32")).collect::<Vec<_>>().join(", ")));
    let lane_rows = if per_run { lane_rows_of(b) } else { early_lane_rows };
    let tr = b.op(&format!("arith.addi {t0}, {r_body} : i64"));
    let s = b.load_i32_as_i64("%seq", &tr);
    // the run's end (the first row of another sequence, or past the tile's rows) and its
    // largest and smallest positions, uniform over the block: every warp finds them from its
    // lanes' rows (lane l: rows l, l + 32, ..) with a ballot per row group and shuffles
    let mut end = crows.clone();
    let s32 = b.op(&format!("arith.trunci {s} : i64 to i32"));
    for (k, (j, valid, sq, _)) in lane_rows.iter().enumerate() {
        let ge = b.op(&format!("arith.cmpi sge, {j}, {r_body} : i64"));
        let other = b.op(&format!("arith.cmpi ne, {sq}, {s32} : i32"));
        let nv = b.op(&format!("arith.xori {valid}, {true_} : i1"));
        let diff = b.op(&format!("arith.ori {other}, {nv} : i1"));
        let bit = b.op(&format!("arith.andi {ge}, {diff} : i1"));
        let bal = b.ballot(&bit);
        let tz = b.op(&format!("llvm.inline_asm \"{{ .reg .b32 r; brev.b32 r, $1; bfind.shiftamt.u32 $0, r; }}\", \"=r,r\" {bal} : (i32) -> i32"));
        let tz = b.op(&format!("arith.extui {tz} : i32 to i64"));
        let c32k = c(b, 32 * k as i64);
        let cand = b.op(&format!("arith.addi {tz}, {c32k} : i64"));
        let z32 = b.op("arith.constant 0 : i32");
        let has = b.op(&format!("arith.cmpi ne, {bal}, {z32} : i32"));
        let cand = b.op(&format!("arith.select {has}, {cand}, {crows} : i64"));
        end = b.op(&format!("arith.minsi {end}, {cand} : i64"));
    }
    let (mut mx, mut mn) = (b.op("arith.constant -1 : i32"), b.op("arith.constant 2147483647 : i32"));
    for (j, valid, _, ps) in &lane_rows {
        let ge = b.op(&format!("arith.cmpi sge, {j}, {r_body} : i64"));
        let lt = b.op(&format!("arith.cmpi slt, {j}, {end} : i64"));
        let inr = b.op(&format!("arith.andi {ge}, {lt} : i1"));
        let inr = b.op(&format!("arith.andi {inr}, {valid} : i1"));
        let a = b.op(&format!("arith.select {inr}, {ps}, {mx} : i32"));
        mx = b.op(&format!("arith.maxsi {mx}, {a} : i32"));
        let z = b.op(&format!("arith.select {inr}, {ps}, {mn} : i32"));
        mn = b.op(&format!("arith.minsi {mn}, {z} : i32"));
    }
    let w32 = b.op("arith.constant 32 : i32");
    for off in [16, 8, 4, 2, 1] {
        let o = b.op(&format!("arith.constant {off} : i32"));
        for (v, comb) in [(&mut mx, "arith.maxsi"), (&mut mn, "arith.minsi")] {
            let (sh, ok) = (b.v(), b.v());
            b.line(&format!("{sh}, {ok} = gpu.shuffle xor {v}, {o}, {w32} : i32"));
            *v = b.op(&format!("{comb} {v}, {sh} : i32"));
        }
    }
    let maxp = b.op(&format!("arith.extsi {mx} : i32 to i64"));
    // (the run's largest and smallest positions as i32, for the loop's key arithmetic)
    let (maxp32, minp32) = (mx.clone(), mn.clone());
    // the run takes the whole tile (every row of the block in it)
    let whole = {
        let first = b.op(&format!("arith.cmpi eq, {r_body}, {c0} : i64"));
        let all = b.op(&format!("arith.cmpi eq, {end}, {crows} : i64"));
        b.op(&format!("arith.andi {first}, {all} : i1"))
    };
    // this thread's rows in the run
    let mut inrun = vec![];
    for (rel, _, ok, _) in &rows {
        let ge = b.op(&format!("arith.cmpi sge, {rel}, {r_body} : i64"));
        let lt = b.op(&format!("arith.cmpi slt, {rel}, {end} : i64"));
        let x = b.op(&format!("arith.andi {ge}, {lt} : i1"));
        inrun.push(b.op(&format!("arith.andi {x}, {ok} : i1")));
    }
    let ckeys = c(b, KEYS as i64);
    let span = b.op(&format!("arith.addi {maxp}, {ckeys} : i64"));
    let ntiles64 = b.op(&format!("arith.divsi {span}, {ckeys} : i64"));
    let ntiles = b.op(&format!("arith.index_cast {ntiles64} : i64 to index"));
    let zi = b.op("arith.constant 0 : index");
    let onei = b.op("arith.constant 1 : index");
    let srow = b.op(&format!("arith.muli {s}, %mb : i64"));
    // the cache element of key j (i64): ((table[s, j / bs] * bs + j % bs) * kvh + kh) * d
    let key_base = |b: &mut Body, j: &str| -> String {
        let jc = b.op(&format!("arith.minsi {j}, {maxp} : i64"));
        b.paged_key_offset(&jc, &srow, &kh, &cbs, &ckvh, &cd)
    };
    // bf16 pools: tile `tile`'s K and V rows (keys clamped to the run's last) into stage `st`
    // with `cp.async`, 16 bytes each, rows as the pools hold them
    let chunks = (d / 8) as i64;
    let issue = |b: &mut Body, tile: &str, st: &str| {
        let ckeys = c(b, KEYS as i64);
        let j0 = b.op(&format!("arith.muli {tile}, {ckeys} : i64"));
        let csb = c(b, stage_bytes);
        let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
        let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
        let kg = b.op("llvm.ptrtoint %kc : !llvm.ptr<1> to i64");
        let vg = b.op("llvm.ptrtoint %vc : !llvm.ptr<1> to i64");
        let cch = c(b, chunks);
        // (every thread of the block copies)
        let ntc = nt;
        for i in 0..(KEYS as i64 * chunks) / ntc {
            let ci = c(b, ntc * i);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let kk = b.op(&format!("arith.divui {u}, {cch} : i64"));
            let ch = b.op(&format!("arith.remui {u}, {cch} : i64"));
            let j = b.op(&format!("arith.addi {j0}, {kk} : i64"));
            let kb = key_base(b, &j);
            let c2b = c(b, 2);
            let src = b.op(&format!("arith.muli {kb}, {c2b} : i64"));
            let c16b = c(b, 16);
            let cho = b.op(&format!("arith.muli {ch}, {c16b} : i64"));
            let src = b.op(&format!("arith.addi {src}, {cho} : i64"));
            let dst = if wg {
                sw128_offset(b, &kk, &ch, KEYS)
            } else {
                let cks = c(b, ks);
                let dst = b.op(&format!("arith.muli {kk}, {cks} : i64"));
                b.op(&format!("arith.addi {dst}, {cho} : i64"))
            };
            let dst = b.op(&format!("arith.addi {sb}, {dst} : i64"));
            for (g0, at) in [(&kg, 0i64), (&vg, v_at)] {
                let ga = b.op(&format!("arith.addi {g0}, {src} : i64"));
                let cat = c(b, at);
                let sa = b.op(&format!("arith.addi {dst}, {cat} : i64"));
                let sa = b.op(&format!("arith.trunci {sa} : i64 to i32"));
                b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.cg.shared.global [$0], [$1], 16;\", \"r,l\" {sa}, {ga} : (i32, i64) -> ()"));
            }
        }
    };
    let commit = "llvm.inline_asm has_side_effects \"cp.async.commit_group;\", \"\" : () -> ()";
    // TMA: tile `tile`'s K and V into stage `st` as boxes of `rows` keys x 64 head-dim columns
    // (one cache block's rows: coordinates (column, KV head, row in the block, block)), box w
    // by lane 0 of warp w — each issuing warp's share off the critical path is small — on the
    // stage's mbarrier, armed by thread 0 with the whole stage's bytes (a box landing before
    // the arming only runs the transaction count below zero; the phase needs the arrival).
    // `tma_box` first: the warp's box's (row in its block, block), read from the block table
    // ahead of the issue with a load the compiler cannot sink into it. Boxes past the run's
    // last key load its box again (masked like the clamped copies; the rows past it inside
    // that box are other slots' finite values)
    let nbox = tma_rows.map_or(1, |r| KEYS / r) as i64;
    let twarp = {
        let c32 = c(b, 32);
        b.op(&format!("arith.divui {t}, {c32} : i64"))
    };
    // (key positions in i32: the 64-bit compares, shifts and selects were ~8 of the loop's
    // instructions per tile)
    let tma_box = |b: &mut Body, tile: &str| -> (String, String) {
        let rows = tma_rows.unwrap_or(KEYS) as i64;
        let i32c = |b: &mut Body, v: i64| b.op(&format!("arith.constant {v} : i32"));
        let tile = b.op(&format!("arith.trunci {tile} : i64 to i32"));
        let ckeys = i32c(b, KEYS as i64);
        let j0 = b.op(&format!("arith.muli {tile}, {ckeys} : i32"));
        let crows = i32c(b, rows);
        let mrem = b.op(&format!("arith.remsi {maxp32}, {crows} : i32"));
        let lastb = b.op(&format!("arith.subi {maxp32}, {mrem} : i32"));
        let cl = c(b, nbox - 1);
        let wb = b.op(&format!("arith.minui {twarp}, {cl} : i64"));
        let wb = b.op(&format!("arith.trunci {wb} : i64 to i32"));
        let co = b.op(&format!("arith.muli {wb}, {crows} : i32"));
        let j = b.op(&format!("arith.addi {j0}, {co} : i32"));
        let j = b.op(&format!("arith.minsi {j}, {lastb} : i32"));
        let cbs32 = i32c(b, bs as i64);
        let bj = b.op(&format!("arith.divui {j}, {cbs32} : i32"));
        let within = b.op(&format!("arith.remui {j}, {cbs32} : i32"));
        let bj = b.op(&format!("arith.extui {bj} : i32 to i64"));
        let ti = b.op(&format!("arith.addi {srow}, {bj} : i64"));
        let c4t = c(b, 4);
        let to = b.op(&format!("arith.muli {ti}, {c4t} : i64"));
        let tb = b.op("llvm.ptrtoint %table : !llvm.ptr<1> to i64");
        let ta = b.op(&format!("arith.addi {tb}, {to} : i64"));
        let blk = b.op(&format!("llvm.inline_asm has_side_effects \"ld.global.nc.b32 $0, [$1];\", \"=r,l\" {ta} : (i64) -> i32"));
        (within, blk)
    };
    let tma_issue = |b: &mut Body, bx: &(String, String), st: &str| {
        let (Some(rows), Some(first)) = (tma_rows, &tfirst) else { return };
        let mb = mbar(b, st);
        b.line(&format!("scf.if {first} {{"));
        let bytes = b.op(&format!("arith.constant {stage_bytes} : i32"));
        b.line(&format!("llvm.inline_asm has_side_effects \"{{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1; }}\", \"r,r\" {mb}, {bytes} : (i32, i32) -> ()"));
        b.line("}");
        let c31 = c(b, 31);
        let ln = b.op(&format!("arith.andi {t}, {c31} : i64"));
        let c0t = c(b, 0);
        let l0 = b.op(&format!("arith.cmpi eq, {ln}, {c0t} : i64"));
        let cnb = c(b, nbox);
        let mine = b.op(&format!("arith.cmpi ult, {twarp}, {cnb} : i64"));
        let go = b.op(&format!("arith.andi {l0}, {mine} : i1"));
        b.line(&format!("scf.if {go} {{"));
        let csb = c(b, stage_bytes);
        let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
        let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
        let cbr = c(b, rows as i64 * 128);
        let wo = b.op(&format!("arith.muli {twarp}, {cbr} : i64"));
        let sb = b.op(&format!("arith.addi {sb}, {wo} : i64"));
        let kmap = b.op("llvm.ptrtoint %kc : !llvm.ptr<1> to i64");
        let vmap = b.op("llvm.ptrtoint %vc : !llvm.ptr<1> to i64");
        let kh32 = b.op(&format!("arith.trunci {kh} : i64 to i32"));
        let (within, blk) = bx;
        for cb in 0..(d / 64) as i64 {
            let col = b.op(&format!("arith.constant {} : i32", 64 * cb));
            for (map, at) in [(&kmap, 0i64), (&vmap, v_at)] {
                let o = c(b, at + cb * (KEYS * 128) as i64);
                let dst = b.op(&format!("arith.addi {sb}, {o} : i64"));
                let dst = b.op(&format!("arith.trunci {dst} : i64 to i32"));
                b.line(&format!(
                    "llvm.inline_asm has_side_effects \"cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$0], [$1, {{$2, $3, $4, $5}}], [$6];\", \"r,l,r,r,r,r,r\" {dst}, {map}, {col}, {kh32}, {within}, {blk}, {mb} : (i32, i64, i32, i32, i32, i32, i32) -> ()"
                ));
            }
        }
        b.line("}");
    };
    // (TMA: each stage's use count at the run's start — thread 0 adds the run's tiles after it)
    let uses: Option<[String; 2]> = tfirst.as_ref().map(|_| {
        b.line("gpu.barrier");
        let u0 = uses_ptr(b, 0);
        let u0 = b.op(&format!("llvm.load {u0} : !llvm.ptr<3> -> i32"));
        let u1 = uses_ptr(b, 1);
        let u1 = b.op(&format!("llvm.load {u1} : !llvm.ptr<3> -> i32"));
        let z = c(b, 0);
        let bx = tma_box(b, &z);
        tma_issue(b, &bx, &z);
        [u0, u1]
    });
    if !wide && uses.is_none() {
        // (the run's first tile, into stage 0)
        let z = c(b, 0);
        issue(b, &z, &z);
        b.line(commit);
    }
    // (wgmma: S = Q Kᵀ of the K tile at `kbase`, issued and committed, not waited: per k16
    // step kk of the head dim an m64n{KEYS}k16, A = this warp's Q fragments in registers (the
    // m16n8k16 A layout), B = K's tile, K-major — start in column block kk / 4, 32 bytes per
    // k16 inside it)
    let ns = KEYS / 2;
    let s_issue = |b: &mut Body, kbase: &str| -> Vec<String> {
        let zero = b.cf32(0.0);
        let mut cur: Vec<String> = vec![zero; ns];
        b.line("llvm.inline_asm has_side_effects \"wgmma.fence.sync.aligned;\", \"\"  : () -> ()");
        let klo = b.smem_desc_lo(kbase);
        for kk in 0..nkc {
            let o = kk / 4 * KEYS * 128 + kk % 4 * 32;
            let a = qf[4 * kk..4 * kk + 4].to_vec();
            let db = b.desc_at(&klo, o, SW128_K_DESC);
            cur = b.wgmma(&format!("m64n{KEYS}k16"), "bf16", &cur, &a, &db, false);
        }
        b.line("llvm.inline_asm has_side_effects \"wgmma.commit_group.sync.aligned;\", \"\"  : () -> ()");
        cur
    };
    let kvl = b.v();
    let tl = b.v();
    let acc_t: Vec<String> = (0..ncar).map(|_| b.v()).collect();
    b.line(&format!(
        "{kvl}:{ncar} = scf.for {tl} = {zi} to {ntiles} step {onei} iter_args({}) -> ({carried_tys}) {{",
        acc_t.iter().zip(acc_body.iter()).map(|(a, i)| format!("{a} = {i}")).collect::<Vec<_>>().join(", ")
    ));
    let tl64 = b.idx64(&tl);
    let j0 = b.op(&format!("arith.muli {tl64}, {ckeys} : i64"));
    // this tile's K and V in shared memory: bf16 (stage tl % 2 filled by the copies issued one
    // tile ago; the next tile's issued now), or gathered here from f32 pools
    let mut next_box: Option<(String, String)> = None;
    let sbase = if wide {
        // gather K (row-major) and V (transposed) of keys j0..j0+63 as bf16
        let dq = (d / 4) as i64;
        let cdq = c(b, dq);
        for i in 0..(KEYS as i64 * dq) / 128 {
            let ci = c(b, 128 * i);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let kk = b.op(&format!("arith.divui {u}, {cdq} : i64"));
            let ch4 = b.op(&format!("arith.remui {u}, {cdq} : i64"));
            let j = b.op(&format!("arith.addi {j0}, {kk} : i64"));
            let kb = key_base(b, &j);
            let e = b.op(&format!("arith.muli {ch4}, {c4} : i64"));
            let e = b.op(&format!("arith.addi {kb}, {e} : i64"));
            let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
            let v = b.load_vec("%kc", &by, 4, "f32", 16);
            let (p0, p1) = (b.pack2(&v[0], &v[1], false), b.pack2(&v[2], &v[3], false));
            let cks = c(b, ks);
            let so = b.op(&format!("arith.muli {kk}, {cks} : i64"));
            let c8b = c(b, 8);
            let co = b.op(&format!("arith.muli {ch4}, {c8b} : i64"));
            let so = b.op(&format!("arith.addi {so}, {co} : i64"));
            let sa = b.op(&format!("arith.addi {base}, {so} : i64"));
            let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
            let vv = b.vector(&[p0, p1], "i32");
            b.line(&format!("llvm.store {vv}, {sp} {{alignment = 8 : i64}} : vector<2xi32>, !llvm.ptr<3>"));
        }
        let cpairs = c(b, (KEYS / 2) as i64);
        for i in 0..(KEYS as i64 / 2 * dq) / 128 {
            let ci = c(b, 128 * i);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let pk = b.op(&format!("arith.remui {u}, {cpairs} : i64"));
            let ch4 = b.op(&format!("arith.divui {u}, {cpairs} : i64"));
            let k2 = b.op(&format!("arith.muli {pk}, {c2} : i64"));
            let mut vals = vec![];
            for dk in 0..2 {
                let cdk = c(b, dk);
                let kk = b.op(&format!("arith.addi {k2}, {cdk} : i64"));
                let j = b.op(&format!("arith.addi {j0}, {kk} : i64"));
                let kb = key_base(b, &j);
                let e = b.op(&format!("arith.muli {ch4}, {c4} : i64"));
                let e = b.op(&format!("arith.addi {kb}, {e} : i64"));
                let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
                vals.push(b.load_vec("%vc", &by, 4, "f32", 16));
            }
            for q in 0..4i64 {
                let w = b.pack2(&vals[0][q as usize], &vals[1][q as usize], false);
                let dr = b.op(&format!("arith.muli {ch4}, {c4} : i64"));
                let cq = c(b, q);
                let dr = b.op(&format!("arith.addi {dr}, {cq} : i64"));
                let cvs = c(b, vs);
                let so = b.op(&format!("arith.muli {dr}, {cvs} : i64"));
                let po = b.op(&format!("arith.muli {pk}, {c4} : i64"));
                let so = b.op(&format!("arith.addi {so}, {po} : i64"));
                let cva = c(b, v_at);
                let so = b.op(&format!("arith.addi {so}, {cva} : i64"));
                let sa = b.op(&format!("arith.addi {base}, {so} : i64"));
                let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
                b.line(&format!("llvm.store {w}, {sp} {{alignment = 4 : i64}} : i32, !llvm.ptr<3>"));
            }
        }
        b.line("gpu.barrier");
        base.clone()
    } else if let Some([u0, u1]) = &uses {
        // (the next tile's box entry read now, used after this tile's S is issued)
        let c1t = c(b, 1);
        let nt = b.op(&format!("arith.addi {tl64}, {c1t} : i64"));
        next_box = Some(tma_box(b, &nt));
        // (TMA: tile tl landed in stage tl % 2 — that stage's use count at the run's start +
        // tl / 2 completed phases before it; no block barrier: every thread waits itself)
        // (in i32: the 64-bit remainder, compare and address math were ~6 instructions)
        let tl32 = b.op(&format!("arith.trunci {tl64} : i64 to i32"));
        let one32 = b.op("arith.constant 1 : i32");
        let cst = b.op(&format!("arith.andi {tl32}, {one32} : i32"));
        let half = b.op(&format!("arith.shrui {tl32}, {one32} : i32"));
        let z32 = b.op("arith.constant 0 : i32");
        let is0 = b.op(&format!("arith.cmpi eq, {cst}, {z32} : i32"));
        let u = b.op(&format!("arith.select {is0}, {u0}, {u1} : i32"));
        let ph = b.op(&format!("arith.addi {u}, {half} : i32"));
        let par = b.op(&format!("arith.andi {ph}, {one32} : i32"));
        let base32 = b.op(&format!("arith.trunci {base} : i64 to i32"));
        let c8m = b.op("arith.constant 8 : i32");
        let mo = b.op(&format!("arith.muli {cst}, {c8m} : i32"));
        let cba = b.op(&format!("arith.constant {bar_at} : i32"));
        let mo = b.op(&format!("arith.addi {mo}, {cba} : i32"));
        let mb = b.op(&format!("arith.addi {base32}, {mo} : i32"));
        b.mbar_spin(&mb, &par);
        let csb = b.op(&format!("arith.constant {stage_bytes} : i32"));
        let so = b.op(&format!("arith.muli {cst}, {csb} : i32"));
        let so = b.op(&format!("arith.extui {so} : i32 to i64"));
        b.op(&format!("arith.addi {base}, {so} : i64"))
    } else {
        // (tile tl + 1 into stage (tl + 1) % 2)
        let ahead_t = c(b, 1);
        let cstg = c(b, 2);
        let nt = b.op(&format!("arith.addi {tl64}, {ahead_t} : i64"));
        let more = b.op(&format!("arith.cmpi slt, {nt}, {ntiles64} : i64"));
        b.line(&format!("scf.if {more} {{"));
        let nst = b.op(&format!("arith.remui {nt}, {cstg} : i64"));
        issue(b, &nt, &nst);
        b.line("}");
        b.line(commit);
        // (this tile's copies have landed)
        b.line("llvm.inline_asm has_side_effects \"cp.async.wait_group 1;\", \"\" : () -> ()");
        if wg {
            // (the copies' writes, made by the generic proxy, before wgmma reads them)
            b.line("llvm.inline_asm has_side_effects \"fence.proxy.async.shared::cta;\", \"\" : () -> ()");
        }
        b.line("gpu.barrier");
        let cst = b.op(&format!("arith.remui {tl64}, {cstg} : i64"));
        let csb = c(b, stage_bytes);
        let so = b.op(&format!("arith.muli {cst}, {csb} : i64"));
        b.op(&format!("arith.addi {base}, {so} : i64"))
    };
    // S = Q K^T: 8 tiles of 8 keys (per m16 tile: sacc_t[i][n8])
    let tq4 = b.op(&format!("arith.muli {tq}, {c4} : i64"));
    let mut sacc: Vec<Vec<String>> = vec![];
    let mut sacc_t: Vec<Vec<Vec<String>>> = vec![];
    // (bf16: this lane's `ldmatrix` row address in the K tile — row l % 8 (key) of matrix
    // l / 8, 8 head-dim columns further each — and its (m, r) = (l / 8, l % 8))
    let (m, r) = (b.op(&format!("arith.divui {lane}, {c8} : i64")), b.op(&format!("arith.remui {lane}, {c8} : i64")));
    let kl = {
        let cks = c(b, ks);
        let ro = b.op(&format!("arith.muli {r}, {cks} : i64"));
        let mo = b.op(&format!("arith.muli {m}, {c16} : i64"));
        let lo = b.op(&format!("arith.addi {ro}, {mo} : i64"));
        b.op(&format!("arith.addi {sbase}, {lo} : i64"))
    };
    if mt > 1 {
        // per pair of k16 steps: each tile's A fragments from Q in shared memory (ldmatrix.x4:
        // lane l addresses row l % 8 + 8 ((l / 8) % 2), 8 (l / 16) columns further), then per
        // 8 keys one K ldmatrix feeding every tile's two MMAs
        let cks = c(b, ks);
        let m2 = b.op(&format!("arith.remui {m}, {c2} : i64"));
        let mh = b.op(&format!("arith.divui {m}, {c2} : i64"));
        let qr = b.op(&format!("arith.muli {m2}, {c8} : i64"));
        let qr = b.op(&format!("arith.addi {qr}, {r} : i64"));
        let qr = b.op(&format!("arith.addi {qr}, {w16} : i64"));
        let ql = b.op(&format!("arith.muli {qr}, {cks} : i64"));
        let qc = b.op(&format!("arith.muli {mh}, {c16} : i64"));
        let ql = b.op(&format!("arith.addi {ql}, {qc} : i64"));
        let cqa = c(b, q_at);
        let ql = b.op(&format!("arith.addi {ql}, {cqa} : i64"));
        let ql = b.op(&format!("arith.addi {base}, {ql} : i64"));
        sacc_t = vec![vec![vec![zero.clone(); 4]; KEYS / 8]; mt];
        for p in 0..(nkc / 2) as i64 {
            let qa: Vec<Vec<Vec<String>>> = (0..mt as i64).map(|i| (0..2).map(|h2| b.ldmatrix(&ql, 16 * i * ks + 32 * (2 * p + h2), 4, false)).collect()).collect();
            for n8 in 0..KEYS / 8 {
                let f = b.ldmatrix(&kl, 8 * n8 as i64 * ks + 64 * p, 4, false);
                for i in 0..mt {
                    let acc = mma(b, &qa[i][0], &f[0], &f[1], &sacc_t[i][n8]);
                    sacc_t[i][n8] = mma(b, &qa[i][1], &f[2], &f[3], &acc);
                }
            }
        }
    } else if wg {
        // S = Q Kᵀ on wgmma, Q from registers (`s_issue`)
        let cur = s_issue(b, &sbase);
        if uses.is_some() {
            // (TMA: the next tile's boxes go out under this S — its stage was last read by
            // the previous tile, done before that iteration's closing barrier)
            let c1t = c(b, 1);
            let nt = b.op(&format!("arith.addi {tl64}, {c1t} : i64"));
            let more = b.op(&format!("arith.cmpi slt, {nt}, {ntiles64} : i64"));
            b.line(&format!("scf.if {more} {{"));
            let c2t = c(b, 2);
            let nst = b.op(&format!("arith.remui {nt}, {c2t} : i64"));
            tma_issue(b, next_box.as_ref().expect("TMA"), &nst);
            b.line("}");
        }
        let cur = b.wgmma_wait(0, &cur);
        sacc = cur.chunks(4).map(|x| x.to_vec()).collect();
    } else if wide {
        let cks = c(b, ks);
        let gk = b.op(&format!("arith.muli {g}, {cks} : i64"));
        let kfrag = b.op(&format!("arith.addi {gk}, {tq4} : i64"));
        for n8 in 0..(KEYS / 8) as i64 {
            let mut acc = vec![zero.clone(); 4];
            for kc in 0..nkc as i64 {
                let o = c(b, 8 * n8 * ks + 32 * kc);
                let off = b.op(&format!("arith.addi {kfrag}, {o} : i64"));
                let b0 = lds(b, &off);
                let c16b = c(b, 16);
                let off1 = b.op(&format!("arith.addi {off}, {c16b} : i64"));
                let b1 = lds(b, &off1);
                acc = mma(b, &qf[4 * kc as usize..4 * kc as usize + 4], &b0, &b1, &acc);
            }
            sacc.push(acc);
        }
    } else {
        // ldmatrix.x4 at `kl`: the B fragments of two k16 steps of 8 keys
        for n8 in 0..(KEYS / 8) as i64 {
            let mut acc = vec![zero.clone(); 4];
            for p in 0..nkc.div_ceil(2) as i64 {
                let two = 2 * p as usize + 1 < nkc;
                let f = b.ldmatrix(&kl, 8 * n8 * ks + 64 * p, if two { 4 } else { 2 }, false);
                acc = mma(b, &qf[8 * p as usize..8 * p as usize + 4], &f[0], &f[1], &acc);
                if two {
                    acc = mma(b, &qf[8 * p as usize + 4..8 * p as usize + 8], &f[2], &f[3], &acc);
                }
            }
            sacc.push(acc);
        }
    }
    if mt == 1 {
        sacc_t = vec![sacc];
    }
    let nk8 = KEYS / 8;
    // mask: key j0 + 8 n8 + 2 tq (+1) for row a (c0, c1) and row b (c2, c3) — only where
    // the tile has keys past a row's position or rows outside the run (block-uniform: tiles
    // wholly below the diagonal of a run that fills the block skip it)
    let jq = b.op(&format!("arith.addi {j0}, {tq2} : i64"));
    // (in i32: the run's smallest position is one already)
    let j032 = b.op(&format!("arith.trunci {j0} : i64 to i32"));
    let cl = b.op(&format!("arith.constant {} : i32", KEYS as i64 - 1));
    let jl = b.op(&format!("arith.addi {j032}, {cl} : i32"));
    let below = b.op(&format!("arith.cmpi sle, {jl}, {minp32} : i32"));
    let plain = b.op(&format!("arith.andi {below}, {whole} : i1"));
    // (row ri = tile ri / 2, half ri % 2: its 16 values, 8 keys x 2, in key order)
    let raw: Vec<String> = (0..2 * mt).flat_map(|ri| sacc_t[ri / 2].iter().flat_map(move |sa| (0..2).map(move |q| sa[2 * (ri % 2) + q].clone()))).collect();
    let masked = b.v();
    let ftys = vec!["f32"; raw.len()].join(", ");
    b.line(&format!("{masked}:{} = scf.if {plain} -> ({ftys}) {{", raw.len()));
    b.line(&format!("scf.yield {} : {ftys}", raw.join(", ")));
    b.line("} else {");
    let mut mvals = vec![];
    let jq32 = pos32.then(|| b.op(&format!("arith.trunci {jq} : i64 to i32")));
    for (ri, (_, _, _, p)) in rows.iter().enumerate() {
        // (pos32: key jq + c is at or before the row's position where c <= p - jq)
        let left = jq32.as_ref().map(|jq32| b.op(&format!("arith.subi {p}, {jq32} : i32")));
        for n8 in 0..nk8 {
            for q in 0..2 {
                let le = match &left {
                    Some(left) => {
                        let cj = b.op(&format!("arith.constant {} : i32", 8 * n8 + q));
                        b.op(&format!("arith.cmpi sle, {cj}, {left} : i32"))
                    }
                    None => {
                        let cj = c(b, 8 * n8 as i64 + q as i64);
                        let j = b.op(&format!("arith.addi {jq}, {cj} : i64"));
                        b.op(&format!("arith.cmpi sle, {j}, {p} : i64"))
                    }
                };
                let ok = b.op(&format!("arith.andi {le}, {} : i1", inrun[ri]));
                mvals.push(b.op(&format!("arith.select {ok}, {}, {ninf} : f32", raw[ri * 2 * nk8 + 2 * n8 + q])));
            }
        }
    }
    b.line(&format!("scf.yield {} : {ftys}", mvals.join(", ")));
    b.line("}");
    let mut new_state = vec![];
    let tree = b.o.flash_tree;
    // (wgmma: the lazy rescale, `FLASH_LAZY_THRESHOLD`)
    let lazy = if wg && mt == 1 { b.o.flash_lazy } else { None };
    let mut grows: Vec<String> = vec![];
    let mut lazy_rows: Vec<(String, String, String)> = vec![];
    let mut pvals_t: Vec<Vec<Vec<String>>> = vec![vec![vec![]; nk8]; mt];
    let mut pf_t: Vec<Vec<Vec<String>>> = vec![];
    let mut alphas = vec![];
    for ri in 0..rows.len() {
        let vals: Vec<String> = (0..2 * nk8).map(|k| format!("{masked}#{}", ri * 2 * nk8 + k)).collect();
        let mx = if tree { b.tree_reduce(&vals, "arith.maximumf") } else { b.chain_reduce(&vals, "arith.maximumf") };
        let mx = quad(b, &mx, "arith.maximumf");
        let (m_old, l_old) = (&acc_t[mt * nacc + 2 * ri], &acc_t[mt * nacc + 2 * ri + 1]);
        let m_new = b.op(&format!("arith.maximumf {m_old}, {mx} : f32"));
        let m_new = match lazy {
            // (lazy: the row's reference max moves only where the tile's max passes it by more
            // than the threshold)
            Some(th) => {
                let cth = b.cf32(th);
                let lim = b.op(&format!("arith.addf {m_old}, {cth} : f32"));
                let grow = b.op(&format!("arith.cmpf ogt, {mx}, {lim} : f32"));
                grows.push(grow.clone());
                b.op(&format!("arith.select {grow}, {m_new}, {m_old} : f32"))
            }
            None => m_new,
        };
        let none = b.op(&format!("arith.cmpf oeq, {m_new}, {ninf} : f32"));
        let m_use = b.op(&format!("arith.select {none}, {zero}, {m_new} : f32"));
        let dm = b.op(&format!("arith.subf {m_old}, {m_use} : f32"));
        // (lazy: alpha only where the warp rescales, in that branch below; `alphas` then holds
        // no values and only the non-lazy paths read it)
        let alpha = if lazy.is_some() { String::new() } else { ex2(b, &dm) };
        let mut pes = vec![zero.clone()];
        for (k, v) in vals.iter().enumerate() {
            let x = b.op(&format!("arith.subf {v}, {m_use} : f32"));
            let pe = ex2(b, &x);
            pes.push(pe.clone());
            pvals_t[ri / 2][k / 2].push(pe);
        }
        // (the row's max and sum as pairwise trees: 4 dependent steps, not 15 — ncu on the
        // wgmma kernel: a third of its stalls waited on fixed-latency dependencies)
        let sum = if tree { b.tree_reduce(&pes[1..], "arith.addf") } else { b.chain_reduce(&pes, "arith.addf") };
        let l_new = if lazy.is_some() {
            // (lazy: the row's sum updated with the rescale's branch below)
            lazy_rows.push((dm.clone(), l_old.clone(), sum.clone()));
            String::new()
        } else {
            b.op(&format!("llvm.intr.fma({l_old}, {alpha}, {sum}) : (f32, f32, f32) -> f32"))
        };
        new_state.push(m_new);
        new_state.push(l_new);
        alphas.push(alpha);
        // a tile's both rows done: its P fragments now (pvals[n8] = [a q0, a q1, b q0, b q1];
        // per 16 keys: tiles 2kc and 2kc + 1), so its probabilities die here
        if ri % 2 == 1 {
            let pvals = &pvals_t[ri / 2];
            let frags: Vec<Vec<String>> = (0..KEYS / 16)
                .map(|kc| {
                    let (x, y) = (&pvals[2 * kc], &pvals[2 * kc + 1]);
                    vec![b.pack2(&x[0], &x[1], false), b.pack2(&x[2], &x[3], false), b.pack2(&y[0], &y[1], false), b.pack2(&y[2], &y[3], false)]
                })
                .collect();
            pf_t.push(frags);
        }
    }
    let pf = &pf_t[0];
    // O = O * alpha + P V
    let mut out_acc = vec![];
    if wg {
        // O = O·alpha + P V on wgmma: m64n{D}k16 per 16 keys, A = P (registers), B = V's tile
        // N-major (imm-trans-b): 8 keys x 128 bytes per swizzle atom, atoms along the head dim
        // LBO = 64 keys x 128 bytes apart, along the keys SBO = 1024 bytes
        let mut cur: Vec<String> = if lazy.is_some() {
            // (lazy: O rescaled only where a row of the warp moved its reference max — after
            // the first tiles, almost never)
            let mut any = b.op("arith.constant false");
            for g in &grows {
                any = b.op(&format!("arith.ori {any}, {g} : i1"));
            }
            let bal = b.ballot(&any);
            let z32 = b.op("arith.constant 0 : i32");
            let moved = b.op(&format!("arith.cmpi ne, {bal}, {z32} : i32"));
            // (the rows' sums ride the same branch: alpha's ex2 only where some row moved, l + sum
            // where none did — alpha is 1 there, or 0 with l and sum both 0)
            let nr = lazy_rows.len();
            let o_tys = vec!["f32"; nacc + nr].join(", ");
            let r = b.v();
            b.line(&format!("{r}:{} = scf.if {moved} -> ({o_tys}) {{", nacc + nr));
            let al: Vec<String> = lazy_rows.iter().map(|(dm, _, _)| ex2(b, dm)).collect();
            let mut sc: Vec<String> = (0..nacc).map(|i| b.op(&format!("arith.mulf {}, {} : f32", acc_t[i], al[(i % 4) / 2]))).collect();
            for ((_, l_old, sum), a) in lazy_rows.iter().zip(&al) {
                sc.push(b.op(&format!("llvm.intr.fma({l_old}, {a}, {sum}) : (f32, f32, f32) -> f32")));
            }
            b.line(&format!("scf.yield {} : {o_tys}", sc.join(", ")));
            b.line("} else {");
            let mut keep: Vec<String> = acc_t[..nacc].to_vec();
            for (_, l_old, sum) in &lazy_rows {
                keep.push(b.op(&format!("arith.addf {l_old}, {sum} : f32")));
            }
            b.line(&format!("scf.yield {} : {o_tys}", keep.join(", ")));
            b.line("}");
            for ri in 0..nr {
                new_state[2 * ri + 1] = format!("{r}#{}", nacc + ri);
            }
            (0..nacc).map(|i| format!("{r}#{i}")).collect()
        } else {
            (0..nacc).map(|i| b.op(&format!("arith.mulf {}, {} : f32", acc_t[i], alphas[(i % 4) / 2]))).collect()
        };
        let (lbo, sbo) = FLASH_WG_VDESC;
        let fixed = (lbo >> 4) << 16 | ((sbo >> 4) << 32) | (1u64 << 62);
        b.line("llvm.inline_asm has_side_effects \"wgmma.fence.sync.aligned;\", \"\"  : () -> ()");
        let cva = c(b, v_at);
        let vbase = b.op(&format!("arith.addi {sbase}, {cva} : i64"));
        let vlo = b.smem_desc_lo(&vbase);
        for (kc, a) in pf.iter().enumerate() {
            let desc = b.desc_at(&vlo, kc * 16 * 128, fixed);
            cur = b.wgmma(&format!("m64n{d}k16"), "bf16", &cur, a, &desc, true);
        }
        b.line("llvm.inline_asm has_side_effects \"wgmma.commit_group.sync.aligned;\", \"\"  : () -> ()");
        out_acc = b.wgmma_wait(0, &cur);
    } else if wide {
        let cvs = c(b, vs);
        let gv = b.op(&format!("arith.muli {g}, {cvs} : i64"));
        let vfrag = b.op(&format!("arith.addi {gv}, {tq4} : i64"));
        for n8 in 0..nd8 {
            let mut acc: Vec<String> = (0..4).map(|q| b.op(&format!("arith.mulf {}, {} : f32", acc_t[4 * n8 + q], alphas[q / 2]))).collect();
            for (kc, a) in pf.iter().enumerate() {
                let o = c(b, v_at + 8 * n8 as i64 * vs + 32 * kc as i64);
                let off = b.op(&format!("arith.addi {vfrag}, {o} : i64"));
                let b0 = lds(b, &off);
                let c16b = c(b, 16);
                let off1 = b.op(&format!("arith.addi {off}, {c16b} : i64"));
                let b1 = lds(b, &off1);
                acc = mma(b, a, &b0, &b1, &acc);
            }
            out_acc.extend(acc);
        }
    } else {
        // ldmatrix.x4.trans over key-major V: lane l addresses key 8 (m % 2) + l % 8 of the
        // k16 step, head-dim columns 8 (m / 2) further (m = l / 8): the B fragments of two
        // 8-column tiles
        let m2 = b.op(&format!("arith.remui {m}, {c2} : i64"));
        let mh = b.op(&format!("arith.divui {m}, {c2} : i64"));
        let key = b.op(&format!("arith.muli {m2}, {c8} : i64"));
        let key = b.op(&format!("arith.addi {key}, {r} : i64"));
        let cvs = c(b, vs);
        let lo = b.op(&format!("arith.muli {key}, {cvs} : i64"));
        let co = b.op(&format!("arith.muli {mh}, {c16} : i64"));
        let lo = b.op(&format!("arith.addi {lo}, {co} : i64"));
        let cva = c(b, v_at);
        let lo = b.op(&format!("arith.addi {lo}, {cva} : i64"));
        let vl = b.op(&format!("arith.addi {sbase}, {lo} : i64"));
        // (tile i's O accumulators at i·nacc + 4 n8 + j, rows 2i (j < 2) and 2i + 1)
        let mut outs: Vec<Vec<String>> = vec![vec![]; mt];
        for q in 0..nd8 / 2 {
            let scaled =
                |b: &mut Body, i: usize, n8: usize| -> Vec<String> { (0..4).map(|j| b.op(&format!("arith.mulf {}, {} : f32", acc_t[i * nacc + 4 * n8 + j], alphas[2 * i + j / 2]))).collect() };
            let mut a0: Vec<Vec<String>> = (0..mt).map(|i| scaled(b, i, 2 * q)).collect();
            let mut a1: Vec<Vec<String>> = (0..mt).map(|i| scaled(b, i, 2 * q + 1)).collect();
            for kc in 0..KEYS / 16 {
                let f = b.ldmatrix(&vl, 16 * kc as i64 * vs + 32 * q as i64, 4, true);
                for i in 0..mt {
                    a0[i] = mma(b, &pf_t[i][kc], &f[0], &f[1], &a0[i]);
                    a1[i] = mma(b, &pf_t[i][kc], &f[2], &f[3], &a1[i]);
                }
            }
            for i in 0..mt {
                outs[i].extend(a0[i].clone());
                outs[i].extend(a1[i].clone());
            }
        }
        out_acc = outs.concat();
    }
    b.line("gpu.barrier");
    out_acc.extend(new_state);
    b.line(&format!("scf.yield {} : {carried_tys}", out_acc.join(", ")));
    b.line("}");
    if let (Some([u0, u1]), Some(first)) = (&uses, &tfirst) {
        // (TMA: the run used stage 0 for its even tiles, stage 1 for its odd ones)
        b.line(&format!("scf.if {first} {{"));
        let n32 = b.op(&format!("arith.trunci {ntiles64} : i64 to i32"));
        let one32 = b.op("arith.constant 1 : i32");
        let n1 = b.op(&format!("arith.addi {n32}, {one32} : i32"));
        let e0 = b.op(&format!("arith.shrui {n1}, {one32} : i32"));
        let e1 = b.op(&format!("arith.shrui {n32}, {one32} : i32"));
        for (st, (u, e)) in [(u0, e0), (u1, e1)].into_iter().enumerate() {
            let v = b.op(&format!("arith.addi {u}, {e} : i32"));
            let p = uses_ptr(b, st);
            b.line(&format!("llvm.store {v}, {p} : i32, !llvm.ptr<3>"));
        }
        b.line("}");
    }
    let res: Vec<String> = (0..ncar).map(|i| format!("{kvl}#{i}")).collect();
    b.line(&format!("scf.yield {end}, {} : i64, {carried_tys}", res.join(", ")));
    b.line("}");
    // normalize and store rows a and b
    let fin: Vec<String> = (0..ncar).map(|i| format!("{runs}#{}", i + 1)).collect();
    let one = b.cf32(1.0);
    // (pos32, a head per block: this thread's output rows re-derived from the special
    // registers — read through side-effecting asm, so nothing carries them across the loops)
    let sreg = |b: &mut Body, r: &str| -> String {
        let v = b.op(&format!("llvm.inline_asm has_side_effects \"mov.u32 $0, {r};\", \"=r\" : () -> i32"));
        b.op(&format!("arith.extui {v} : i32 to i64"))
    };
    let (end_rows, end_hq, end_tq2): (Vec<(String, String)>, String, String) = if pos32 && mt == 1 {
        let te = sreg(b, "%tid.x");
        let hqe = sreg(b, "%ctaid.x");
        let ye = sreg(b, "%ctaid.y");
        let nye = sreg(b, "%nctaid.y");
        let tl = b.op(&format!("arith.subi {nye}, {ye} : i64"));
        let c1e = c(b, 1);
        let tl = b.op(&format!("arith.subi {tl}, {c1e} : i64"));
        let t0e = b.op(&format!("arith.muli {tl}, {crows} : i64"));
        let lefte = b.op(&format!("arith.subi %n, {t0e} : i64"));
        let nre = b.op(&format!("arith.minsi {lefte}, {crows} : i64"));
        let (we, _, ge, tqe) = b.mma_coords(&te);
        let c16e = c(b, 16);
        let w16e = b.op(&format!("arith.muli {we}, {c16e} : i64"));
        let ra = b.op(&format!("arith.addi {w16e}, {ge} : i64"));
        let c8e = c(b, 8);
        let rb = b.op(&format!("arith.addi {ra}, {c8e} : i64"));
        let rs = [ra, rb]
            .iter()
            .map(|rel| {
                let row = b.op(&format!("arith.addi {t0e}, {rel} : i64"));
                let ok = b.op(&format!("arith.cmpi slt, {rel}, {nre} : i64"));
                (b.op(&format!("arith.select {ok}, {row}, {t0e} : i64")), ok)
            })
            .collect();
        let c2e = c(b, 2);
        (rs, hqe, b.op(&format!("arith.muli {tqe}, {c2e} : i64")))
    } else {
        (rows.iter().map(|(_, rc, ok, _)| (rc.clone(), ok.clone())).collect(), hq.clone(), tq2.clone())
    };
    let tq2 = end_tq2;
    for (ri, (rc, ok)) in end_rows.iter().enumerate() {
        let l = quad(b, &fin[mt * nacc + 2 * ri + 1], "arith.addf");
        let inv = b.op(&format!("arith.divf {one}, {l} : f32"));
        let ob = {
            let r = b.op(&format!("arith.muli {rc}, {ch} : i64"));
            let r = b.op(&format!("arith.addi {r}, {end_hq} : i64"));
            b.op(&format!("arith.muli {r}, {cd} : i64"))
        };
        b.line(&format!("scf.if {ok} {{"));
        for n8 in 0..nd8 {
            let o = (ri / 2) * nacc + 4 * n8 + 2 * (ri % 2);
            let v0 = b.op(&format!("arith.mulf {}, {inv} : f32", fin[o]));
            let v1 = b.op(&format!("arith.mulf {}, {inv} : f32", fin[o + 1]));
            let co = c(b, 8 * n8 as i64);
            let e = b.op(&format!("arith.addi {ob}, {co} : i64"));
            let e = b.op(&format!("arith.addi {e}, {tq2} : i64"));
            let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
            let p = b.op(&format!("llvm.getelementptr %out[{by}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
            let vv = b.vector(&[v0, v1], "f32");
            b.line(&format!("llvm.store {vv}, {p} {{alignment = 8 : i64}} : vector<2xf32>, !llvm.ptr<1>"));
        }
        b.line("}");
    }
    Ok("%q: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64".into())
}

/// What [`emit_flash_attention`] takes: D a multiple of 16 up to 128, H a multiple of KVH,
/// f32 or bf16 pools; 4 warps (8 from bf16 pools where the K/V tile copies divide evenly), 1
/// m16 tile per warp or 2 from bf16 pools at D a multiple of 32.
fn flash_attention_fits(h: usize, kvh: usize, d: usize, bs: usize, kv: DType, warps: usize, mt: usize) -> Result<(), String> {
    if d % 16 != 0 || d > 128 || kvh == 0 || h % kvh != 0 || bs == 0 {
        return Err(format!("the prefill attention needs D a multiple of 16 up to 128 and H a multiple of KVH (D {d}, H {h}, KVH {kvh})"));
    }
    kv_fits(kv)?;
    let wide = kv == DType::F32;
    if !(warps == 4 || (!wide && warps == 8)) || (!wide && (flash_keys(mt) as i64 * (d / 8) as i64) % (32 * warps as i64) != 0) {
        return Err(format!("the prefill attention takes 4 warps (f32 pools) or 4 / 8 (bf16, D a multiple of 32 then), not {warps} (D {d})"));
    }
    if !(mt == 1 || (mt == 2 && !wide && d % 32 == 0)) {
        return Err(format!("the prefill attention takes 1 m16 tile per warp, or 2 from bf16 pools with D a multiple of 32, not {mt} (D {d})"));
    }
    Ok(())
}

/// Whether a prefill attention kernel generates ([`fits`]); the wgmma variant takes the
/// 4-warp, one-tile kernel on bf16 pools at its head dims.
pub(crate) fn flash_fits(spec: &KernelSpec, o: Outer) -> Result<(), String> {
    match spec {
        KernelSpec::FlashWgmma { inner } => match inner.as_ref() {
            KernelSpec::FlashAttention { d, kv: DType::BF16, warps: 4, mtiles: 1, .. } if flash_wg_d_ok(*d) => fits_in(inner, o),
            other => Err(format!("the wgmma prefill attention takes FlashAttention on bf16 pools, 4 warps, 1 m-tile, D {FLASH_WG_D}, not {}", other.symbol())),
        },
        KernelSpec::FlashAttention { h, kvh, d, bs, kv, warps, mtiles, .. } => flash_attention_fits(*h, *kvh, *d, *bs, *kv, *warps, *mtiles),
        other => Err(format!("`{}` is not one of the prefill attention kernels", other.symbol())),
    }
}

/// The prefill attention kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn flash_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    flash_fits(spec, b.outer())?;
    Ok(match spec {
        KernelSpec::FlashWgmma { inner } => {
            b.flash_wg = true;
            if let KernelSpec::FlashAttention { bs, .. } = inner.as_ref() {
                b.launch_bounds = flash_wg_tma_rows(*bs).and(b.o.flash_wg_mincta).map(|m| (128, m));
            }
            emit_into(b, inner)?
        }
        KernelSpec::FlashAttention { h, kvh, d, bs, scale_bits, kv, warps, mtiles } => emit_flash_attention(b, *h, *kvh, *d, *bs, *scale_bits, *kv, *warps, *mtiles)?,
        other => return Err(format!("`{}` is not one of the prefill attention kernels", other.symbol())),
    })
}
