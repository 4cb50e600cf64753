//! Argmax over logits rows on the device (greedy decoding copies back token ids, not logits):
//! a block per row (`Argmax`), several blocks per row with a last-block reduction
//! (`ArgmaxSplit`), a thread-block cluster per row through distributed shared memory on sm_90a
//! (`ArgmaxCluster`), and the argmax folded into the wide lm_head GEMV (`ArgmaxFold`). Ties go to
//! the lowest index, NaN never wins (the CPU reference's rule).

use crate::kernels::*;

/// The readable symbol of a `argmax` kernel (`KernelSpec::symbol`).
pub(crate) fn argmax_symbol(spec: &KernelSpec) -> String {
    match spec {
            KernelSpec::ArgmaxFold { inner } => format!("{}_argmax", inner.symbol()),
            KernelSpec::Argmax { d } => format!("argmax_d{d}"),
            KernelSpec::ArgmaxSplit { d, splits } => format!("argmax_split{splits}_d{d}"),
            KernelSpec::ArgmaxCluster { d, blocks } => format!("argmax_c{blocks}_d{d}"),
        other => unreachable!("{other:?} is not a argmax kernel (kernels::family)"),
    }
}

/// How the runtime launches a `argmax` kernel (`KernelSpec::launch`).
pub(crate) fn argmax_launch(spec: &KernelSpec) -> Launch {
    match spec {
            KernelSpec::Argmax { d } if d % 4 == 0 => Launch::BlockPerRow { warps: ARGMAX_WARPS as u32 },
            // (grid x: the splits, grid y: the rows — set by the runtime)
            KernelSpec::ArgmaxSplit { .. } => Launch::BlockPerRow { warps: ARGMAX_SPLIT_WARPS as u32 },
            KernelSpec::ArgmaxCluster { .. } => Launch::BlockPerRow { warps: ARGMAX_CLUSTER_WARPS as u32 },
            KernelSpec::Argmax { .. } => Launch::WarpPerRow { rows_per_block: 4 },
            KernelSpec::ArgmaxFold { inner } => inner.launch(),
        other => unreachable!("{other:?} is not a argmax kernel (kernels::family)"),
    }
}

/// Warps of the argmax kernel's block (one block per row of a width that is a multiple of 4:
/// a row of 128,256 logits is 63 16-byte loads per thread, [`ARGMAX_UNROLL`] in flight).
pub const ARGMAX_WARPS: usize = 16;
/// 16-byte loads each thread of the argmax kernel issues before comparing them.
pub const ARGMAX_UNROLL: usize = 4;
/// Warps of a split argmax block ([`KernelSpec::ArgmaxSplit`]).
pub const ARGMAX_SPLIT_WARPS: usize = 8;
/// 16-byte pieces of a row each split argmax block takes (two per thread).
pub const ARGMAX_SPLIT_PIECES: usize = 2 * 32 * ARGMAX_SPLIT_WARPS;

/// Warps of a cluster argmax block ([`KernelSpec::ArgmaxCluster`]).
pub const ARGMAX_CLUSTER_WARPS: usize = 16;
/// Blocks per row of the cluster argmax (a portable cluster size).
pub const ARGMAX_CLUSTER_BLOCKS: usize = 8;

/// Blocks per row of the split argmax over rows of `d` floats (None: one block per row, d not
/// a multiple of 4, or a row one block's pieces already cover); at most 64 (a warp's two
/// partials per lane in the last block's reduction).
pub fn argmax_splits(d: usize) -> Option<usize> {
    if d % 4 != 0 {
        return None;
    }
    Some((d / 4).div_ceil(ARGMAX_SPLIT_PIECES)).filter(|&s| (2..=64).contains(&s))
}

/// The end of a split argmax ([`emit_argmax_split`]) and of the wide lm_head with the argmax
/// folded in ([`KernelSpec::ArgmaxFold`]): the block's (max, first index) of its threads' (`v`,
/// `i`) — warps through shared memory `%redv` / `%redi`, thread 0 combining them — into slot
/// `slot` of row `row`'s `blocks` partials in `part` (8 bytes: value, index), a GPU-scope
/// fence, the count in `sync[row]`; the block that counts last (its flag through shared
/// memory) has its warp 0 reduce the row's partials (ties by index, 0 where nothing is above
/// -inf, as the other argmax kernels) into `out[row]` (i32) and reset the count. `ptrs`: the
/// (part, sync, out) parameter names.
#[allow(clippy::too_many_arguments)]
pub(crate) fn argmax_blocks_reduce(b: &mut Body, ptrs: (&str, &str, &str), t: &str, slot: &str, row: &str, v: &str, i: &str, blocks: usize, warps: usize, ninf: &str, big: &str) {
    let (part, sync, out) = ptrs;
    let (smv, smi) = (format!("memref<{warps}xf32, #gpu.address_space<workgroup>>"), format!("memref<{}xi32, #gpu.address_space<workgroup>>", warps + 1));
    b.workgroup = Some(format!("%redv : {smv}, %redi : {smi}"));
    let (lane, warp, c0) = argmax_warps_to_shared(b, v, i, t, &smv, &smi);
    let flag = b.op(&format!("arith.constant {warps} : index"));
    let first = b.op(&format!("arith.cmpi eq, {t}, {c0} : index"));
    let (cs, c8, c4, z) = (b.ci64(blocks as i64), b.ci64(8), b.ci64(4), b.ci64(0));
    let pb = b.op(&format!("llvm.ptrtoint {part} : !llvm.ptr<1> to i64"));
    let prow = b.op(&format!("arith.muli {row}, {cs} : i64"));
    let sb = b.op(&format!("llvm.ptrtoint {sync} : !llvm.ptr<1> to i64"));
    let so = b.op(&format!("arith.muli {row}, {c4} : i64"));
    let sa = b.op(&format!("arith.addi {sb}, {so} : i64"));
    b.line(&format!("scf.if {first} {{"));
    let (mut bv, mut bi) = (ninf.to_string(), big.to_string());
    for w in 0..warps {
        let cw = b.op(&format!("arith.constant {w} : index"));
        let pv = b.op(&format!("memref.load %redv[{cw}] : {smv}"));
        let pi = b.op(&format!("memref.load %redi[{cw}] : {smi}"));
        (bv, bi) = argmax_take(b, &bv, &bi, &pv, &pi);
    }
    let at = b.op(&format!("arith.addi {prow}, {slot} : i64"));
    let so8 = b.op(&format!("arith.muli {at}, {c8} : i64"));
    let pa = b.op(&format!("arith.addi {pb}, {so8} : i64"));
    b.line(&format!("llvm.inline_asm has_side_effects \"st.relaxed.gpu.global.v2.b32 [$0], {{$1, $2}};\", \"l,f,r\" {pa}, {bv}, {bi} : (i64, f32, i32) -> ()"));
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"\" : () -> ()");
    let old = b.op(&format!("llvm.inline_asm has_side_effects \"atom.global.add.u32 $0, [$1], 1;\", \"=r,l\" {sa} : (i64) -> i32"));
    let sm1 = b.op(&format!("arith.constant {} : i32", blocks as i64 - 1));
    let last = b.op(&format!("arith.cmpi eq, {old}, {sm1} : i32"));
    let one = b.op("arith.constant 1 : i32");
    let zero = b.op("arith.constant 0 : i32");
    let fv = b.op(&format!("arith.select {last}, {one}, {zero} : i32"));
    b.line(&format!("memref.store {fv}, %redi[{flag}] : {smi}"));
    b.line("}");
    b.line("gpu.barrier");
    let fv = b.op(&format!("memref.load %redi[{flag}] : {smi}"));
    let zero = b.op("arith.constant 0 : i32");
    let is_last = b.op(&format!("arith.cmpi ne, {fv}, {zero} : i32"));
    let w0 = b.op(&format!("arith.cmpi eq, {warp}, {c0} : index"));
    let go = b.op(&format!("arith.andi {is_last}, {w0} : i1"));
    b.line(&format!("scf.if {go} {{"));
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"\" : () -> ()");
    let lane64 = b.idx64(&lane);
    let (mut bv, mut bi) = (ninf.to_string(), big.to_string());
    for m in 0..blocks.div_ceil(32) {
        // (lane l takes partials l, l + 32, ..: in increasing block order, so increasing index)
        let cm = b.ci64(32 * m as i64);
        let s = b.op(&format!("arith.addi {lane64}, {cm} : i64"));
        let valid = b.op(&format!("arith.cmpi slt, {s}, {cs} : i64"));
        let sc = b.op(&format!("arith.select {valid}, {s}, {z} : i64"));
        let at = b.op(&format!("arith.addi {prow}, {sc} : i64"));
        let so8 = b.op(&format!("arith.muli {at}, {c8} : i64"));
        let pa = b.op(&format!("arith.addi {pb}, {so8} : i64"));
        let pair = b.op(&format!("llvm.inline_asm has_side_effects \"ld.relaxed.gpu.global.v2.b32 {{$0, $1}}, [$2];\", \"=f,=r,l\" {pa} : (i64) -> !llvm.struct<(f32, i32)>"));
        let pv = b.op(&format!("llvm.extractvalue {pair}[0] : !llvm.struct<(f32, i32)>"));
        let pi = b.op(&format!("llvm.extractvalue {pair}[1] : !llvm.struct<(f32, i32)>"));
        let pv = b.op(&format!("arith.select {valid}, {pv}, {ninf} : f32"));
        let pi = b.op(&format!("arith.select {valid}, {pi}, {big} : i32"));
        (bv, bi) = argmax_keep(b, &bv, &bi, &pv, &pi);
    }
    let fi = argmax_settle(b, &bv, &bi, None, ninf, big);
    let lz = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {lz} {{"));
    let p = b.op(&format!("llvm.getelementptr {out}[{row}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
    b.line(&format!("llvm.store {fi}, {p} : i32, !llvm.ptr<1>"));
    // (the counter back to zero for the next launch: every block of the row has counted)
    b.line(&format!("llvm.inline_asm has_side_effects \"st.relaxed.gpu.global.u32 [$0], 0;\", \"l\" {sa} : (i64) -> ()"));
    b.line("}");
    b.line("}");
}

/// Where a thread's argmax pieces lie: the row's first element `base`, the thread's first
/// 16-byte piece `j0`, the first piece past its share `bound` (i64 values), and the constants
/// 0, 4 (i64), -inf (f32) and i32::MAX the kernel already has.
pub(crate) struct ArgmaxRow<'a> {
    pub(crate) base: &'a str,
    pub(crate) j0: &'a str,
    pub(crate) bound: &'a str,
    pub(crate) z: &'a str,
    pub(crate) c4: &'a str,
    pub(crate) ninf: &'a str,
    pub(crate) big: &'a str,
}

/// A thread's (max, first index) over its `loads` 16-byte pieces j0 + k·nt of a row, all
/// loads issued before the compares (a piece at or past the bound reads piece 0 and compares
/// as -inf; i32::MAX where nothing is above -inf).
pub(crate) fn argmax_pieces(b: &mut Body, r: &ArgmaxRow, loads: usize, nt: usize) -> (String, String) {
    argmax_pieces_from(b, r, loads, nt, r.ninf, r.big)
}

/// [`argmax_pieces`] continuing from (v0, i0), the thread's result so far.
pub(crate) fn argmax_pieces_from(b: &mut Body, r: &ArgmaxRow, loads: usize, nt: usize, v0: &str, i0: &str) -> (String, String) {
    let ArgmaxRow { base, j0, bound, z, c4, ninf, .. } = *r;
    let mut pieces = vec![];
    for k in 0..loads {
        let ck = b.ci64((k * nt) as i64);
        let j = b.op(&format!("arith.addi {j0}, {ck} : i64"));
        let valid = b.op(&format!("arith.cmpi slt, {j}, {bound} : i64"));
        let jc = b.op(&format!("arith.select {valid}, {j}, {z} : i64"));
        let e = b.op(&format!("arith.muli {jc}, {c4} : i64"));
        let e = b.op(&format!("arith.addi {base}, {e} : i64"));
        let off = b.op(&format!("arith.muli {e}, {c4} : i64"));
        let xs = b.load_vec("%x", &off, 4, "f32", 16);
        pieces.push((j, valid, xs));
    }
    let (mut v, mut i) = (v0.to_string(), i0.to_string());
    for (j, valid, xs) in pieces {
        let j4 = b.op(&format!("arith.muli {j}, {c4} : i64"));
        for (q, x) in xs.iter().enumerate() {
            let x = b.op(&format!("arith.select {valid}, {x}, {ninf} : f32"));
            let cq = b.ci64(q as i64);
            let e = b.op(&format!("arith.addi {j4}, {cq} : i64"));
            let e = b.op(&format!("arith.trunci {e} : i64 to i32"));
            (v, i) = argmax_keep(b, &v, &i, &x, &e);
        }
    }
    (v, i)
}

/// The row's index from its lanes' (max, index) pairs (lanes without one, `has` false, taking
/// -inf and i32::MAX): the warp's argmax, 0 where nothing is above -inf (as the host argmax).
pub(crate) fn argmax_settle(b: &mut Body, v: &str, i: &str, has: Option<&str>, ninf: &str, big: &str) -> String {
    let (v, i) = match has {
        Some(h) => (b.op(&format!("arith.select {h}, {v}, {ninf} : f32")), b.op(&format!("arith.select {h}, {i}, {big} : i32"))),
        None => (v.to_string(), i.to_string()),
    };
    let (_, fi) = b.warp_argmax(&v, &i);
    let none = b.op(&format!("arith.cmpi eq, {fi}, {big} : i32"));
    let zi = b.op("arith.constant 0 : i32");
    b.op(&format!("arith.select {none}, {zi}, {fi} : i32"))
}

/// Each warp's (max, first index) of the threads' (v, i) into `%redv` / `%redi` (of types
/// `smv` / `smi`) at the warp's slot, then a block barrier. Returns (lane, warp, index 0).
pub(crate) fn argmax_warps_to_shared(b: &mut Body, v: &str, i: &str, t: &str, smv: &str, smi: &str) -> (String, String, String) {
    let (wv, wi) = b.warp_argmax(v, i);
    let (lane, warp) = b.lane_warp(t);
    let c0 = b.op("arith.constant 0 : index");
    let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {l0} {{"));
    b.line(&format!("memref.store {wv}, %redv[{warp}] : {smv}"));
    b.line(&format!("memref.store {wi}, %redi[{warp}] : {smi}"));
    b.line("}");
    b.line("gpu.barrier");
    (lane, warp, c0)
}

/// (v, i) and a candidate (x, e) of a higher index: x where strictly greater (the first
/// maximum kept, as elements come in increasing index order).
pub(crate) fn argmax_keep(b: &mut Body, v: &str, i: &str, x: &str, e: &str) -> (String, String) {
    let gt = b.op(&format!("arith.cmpf ogt, {x}, {v} : f32"));
    (b.op(&format!("arith.select {gt}, {x}, {v} : f32")), b.op(&format!("arith.select {gt}, {e}, {i} : i32")))
}

/// (v, i) and a partial (pv, pi): the larger value, the lower index on ties.
pub(crate) fn argmax_take(b: &mut Body, v: &str, i: &str, pv: &str, pi: &str) -> (String, String) {
    let gt = b.op(&format!("arith.cmpf ogt, {pv}, {v} : f32"));
    let eq = b.op(&format!("arith.cmpf oeq, {pv}, {v} : f32"));
    let lt = b.op(&format!("arith.cmpi slt, {pi}, {i} : i32"));
    let tie = b.op(&format!("arith.andi {eq}, {lt} : i1"));
    let take = b.op(&format!("arith.ori {gt}, {tie} : i1"));
    (b.op(&format!("arith.select {take}, {pv}, {v} : f32")), b.op(&format!("arith.select {take}, {pi}, {i} : i32")))
}

/// [`KernelSpec::ArgmaxCluster`]: block (row, r) takes the row's 16-byte pieces
/// [r·P, (r+1)·P) (P = ceil(D/4 / blocks), all its loads issued before the compares), reduces
/// (max, first index) over the block, thread 0 stores it into block 0's shared memory (slot r,
/// the index's bits as f32), a cluster barrier, then block 0's warp 0 reduces the blocks'
/// partials (ties by index) and writes y[row] (0 for a row with nothing above -inf).
pub(crate) fn emit_argmax_cluster(b: &mut Body, d: usize, blocks: usize) -> Result<(), String> {
    argmax_cluster_fits(d, blocks, b.pdl)?;
    let warps = ARGMAX_CLUSTER_WARPS;
    let nt = 32 * warps;
    let nvec = d / 4;
    let per = nvec.div_ceil(blocks);
    let loads = per.div_ceil(nt);
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", 2 * warps + 2 * blocks);
    b.workgroup = Some(format!("%sm : {smt}"));
    let t = b.op("gpu.thread_id x");
    let row = b.op("gpu.block_id x");
    let rk = b.op("gpu.block_id y");
    let (t64, rowi, rk64) = (b.idx64(&t), b.idx64(&row), b.idx64(&rk));
    let cd = b.ci64(d as i64);
    let base = b.op(&format!("arith.muli {rowi}, {cd} : i64"));
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let big = b.op("arith.constant 2147483647 : i32");
    let (z, c4) = (b.ci64(0), b.ci64(4));
    let cper = b.ci64(per as i64);
    let first = b.op(&format!("arith.muli {rk64}, {cper} : i64"));
    let end = b.op(&format!("arith.addi {first}, {cper} : i64"));
    let cnv = b.ci64(nvec as i64);
    let end = b.op(&format!("arith.minsi {end}, {cnv} : i64"));
    let j0 = b.op(&format!("arith.addi {first}, {t64} : i64"));
    let (v, i) = argmax_pieces(b, &ArgmaxRow { base: &base, j0: &j0, bound: &end, z: &z, c4: &c4, ninf: &ninf, big: &big }, loads, nt);
    let (wv, wi) = b.warp_argmax(&v, &i);
    let (lane, warp) = b.lane_warp(&t);
    let c0 = b.op("arith.constant 0 : index");
    let c2i = b.op("arith.constant 2 : index");
    let c1i = b.op("arith.constant 1 : index");
    let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {l0} {{"));
    let at = b.op(&format!("arith.muli {warp}, {c2i} : index"));
    let at1 = b.op(&format!("arith.addi {at}, {c1i} : index"));
    let wif = b.op(&format!("arith.bitcast {wi} : i32 to f32"));
    b.line(&format!("memref.store {wv}, %sm[{at}] : {smt}"));
    b.line(&format!("memref.store {wif}, %sm[{at1}] : {smt}"));
    b.line("}");
    b.line("gpu.barrier");
    // (thread 0: the block's partial into block 0's slots 2·warps + 2r, + 1)
    let t0 = b.op(&format!("arith.cmpi eq, {t}, {c0} : index"));
    b.line(&format!("scf.if {t0} {{"));
    let (mut bv, mut bi) = (ninf.clone(), big.clone());
    for w in 0..warps {
        let cw = b.op(&format!("arith.constant {} : index", 2 * w));
        let cw1 = b.op(&format!("arith.constant {} : index", 2 * w + 1));
        let pv = b.op(&format!("memref.load %sm[{cw}] : {smt}"));
        let pif = b.op(&format!("memref.load %sm[{cw1}] : {smt}"));
        let pi = b.op(&format!("arith.bitcast {pif} : f32 to i32"));
        // (warps hold interleaved pieces: ties by index)
        (bv, bi) = argmax_take(b, &bv, &bi, &pv, &pi);
    }
    let cw2 = b.ci64(2 * warps as i64);
    let c2 = b.ci64(2);
    let slot = b.op(&format!("arith.muli {rk64}, {c2} : i64"));
    let slot = b.op(&format!("arith.addi {slot}, {cw2} : i64"));
    let c1 = b.ci64(1);
    let slot1 = b.op(&format!("arith.addi {slot}, {c1} : i64"));
    let bif = b.op(&format!("arith.bitcast {bi} : i32 to f32"));
    st_cluster(b, &smt, &slot, &z, &bv);
    st_cluster(b, &smt, &slot1, &z, &bif);
    b.line("}");
    b.cluster_barrier();
    // (block 0, warp 0: lane l < blocks takes block l's partial)
    let r0 = b.op(&format!("arith.cmpi eq, {rk64}, {z} : i64"));
    let w0 = b.op(&format!("arith.cmpi eq, {warp}, {c0} : index"));
    let go = b.op(&format!("arith.andi {r0}, {w0} : i1"));
    b.line(&format!("scf.if {go} {{"));
    let cb = b.op(&format!("arith.constant {blocks} : index"));
    let has = b.op(&format!("arith.cmpi ult, {lane}, {cb} : index"));
    let cbm = b.op(&format!("arith.constant {} : index", blocks - 1));
    let lc = b.op(&format!("arith.minui {lane}, {cbm} : index"));
    let s0 = b.op(&format!("arith.muli {lc}, {c2i} : index"));
    let cwi = b.op(&format!("arith.constant {} : index", 2 * warps));
    let s0 = b.op(&format!("arith.addi {s0}, {cwi} : index"));
    let s1 = b.op(&format!("arith.addi {s0}, {c1i} : index"));
    let pv = b.op(&format!("memref.load %sm[{s0}] : {smt}"));
    let pif = b.op(&format!("memref.load %sm[{s1}] : {smt}"));
    let pi = b.op(&format!("arith.bitcast {pif} : f32 to i32"));
    let fi = argmax_settle(b, &pv, &pi, Some(&has), &ninf, &big);
    b.line(&format!("scf.if {l0} {{"));
    let p = b.op(&format!("llvm.getelementptr %y[{rowi}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
    b.line(&format!("llvm.store {fi}, {p} : i32, !llvm.ptr<1>"));
    b.line("}");
    b.line("}");
    Ok(())
}

/// [`KernelSpec::ArgmaxSplit`]: block (s, row) takes the row's 16-byte pieces
/// [s·P, (s+1)·P) (both loads of a thread issued before their compares), reduces (max, first
/// index) over the block, and thread 0 stores it into `%part[row·S + s]` (value bits, index),
/// fences at GPU scope and counts the block in `%sync[row]`; the block that counts last
/// (S - 1 before it) reads the S partials (GPU-scope loads, in split order: ties keep the lower
/// index), writes y[row] (0 for a row with nothing above -inf, as the host argmax) and resets
/// the counter.
pub(crate) fn emit_argmax_split(b: &mut Body, d: usize, splits: usize) -> Result<(), String> {
    argmax_split_fits(d, splits)?;
    let warps = ARGMAX_SPLIT_WARPS;
    let nt = 32 * warps;
    let nvec = d / 4;
    let t = b.op("gpu.thread_id x");
    let sx = b.op("gpu.block_id x");
    let row = b.op("gpu.block_id y");
    let (t64, sx64, rowi) = (b.idx64(&t), b.idx64(&sx), b.idx64(&row));
    let ok = b.op(&format!("arith.cmpi slt, {rowi}, %rows : i64"));
    b.line(&format!("scf.if {ok} {{"));
    let cd = b.ci64(d as i64);
    let base = b.op(&format!("arith.muli {rowi}, {cd} : i64"));
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let big = b.op("arith.constant 2147483647 : i32");
    let (cnv, z, c4) = (b.ci64(nvec as i64), b.ci64(0), b.ci64(4));
    let cp = b.ci64(ARGMAX_SPLIT_PIECES as i64);
    let j0 = b.op(&format!("arith.muli {sx64}, {cp} : i64"));
    let j0 = b.op(&format!("arith.addi {j0}, {t64} : i64"));
    let (v, i) = argmax_pieces(b, &ArgmaxRow { base: &base, j0: &j0, bound: &cnv, z: &z, c4: &c4, ninf: &ninf, big: &big }, ARGMAX_SPLIT_PIECES / nt, nt);
    argmax_blocks_reduce(b, ("%part", "%sync", "%y"), &t, &sx64, &rowi, &v, &i, splits, warps, &ninf, &big);
    // (the row's `scf.if`)
    b.line("}");
    Ok(())
}

/// The cluster argmax: sm_90a (`pdl`), 2..=8 blocks per row, at most 16 16-byte loads a thread.
fn argmax_cluster_fits(d: usize, blocks: usize, pdl: bool) -> Result<(), String> {
    if d % 4 != 0 || !(2..=8).contains(&blocks) || !pdl {
        return Err(format!("the cluster argmax: sm_90a, D a multiple of 4 and 2..=8 blocks (D {d}, {blocks})"));
    }
    let loads = (d / 4).div_ceil(blocks).div_ceil(32 * ARGMAX_CLUSTER_WARPS);
    if loads > 16 {
        return Err(format!("the cluster argmax: {loads} 16-byte loads per thread (at most 16)"));
    }
    Ok(())
}

/// The split argmax: 1..=64 blocks of [`ARGMAX_SPLIT_PIECES`] 16-byte pieces covering the row.
fn argmax_split_fits(d: usize, splits: usize) -> Result<(), String> {
    if d % 4 != 0 || !(1..=64).contains(&splits) || splits * ARGMAX_SPLIT_PIECES < d / 4 {
        return Err(format!("split argmax: {splits} blocks of {ARGMAX_SPLIT_PIECES} pieces do not cover a row of {d}"));
    }
    Ok(())
}

/// Whether an argmax kernel generates ([`fits`]); the fold rides on the wide GEMV (under its
/// norm prologue and row gather), which refuses bias, residual and activations with it.
pub(crate) fn argmax_fits(spec: &KernelSpec, o: Outer) -> Result<(), String> {
    match spec {
        KernelSpec::ArgmaxFold { inner } => {
            let plain = |k: &KernelSpec| matches!(k, KernelSpec::MatMulWide { .. });
            let normed = |k: &KernelSpec| match k {
                KernelSpec::NormMatMul { inner: mm, .. } => plain(mm),
                other => plain(other),
            };
            let ok = match inner.as_ref() {
                KernelSpec::RowGather { inner: g } => normed(g),
                other => normed(other),
            };
            if !ok {
                return Err(format!("the argmax folds into the wide GEMV, not {}", inner.symbol()));
            }
            fits_in(inner, Outer { argmax_fold: true, ..o })
        }
        KernelSpec::ArgmaxCluster { d, blocks } => argmax_cluster_fits(*d, *blocks, o.pdl),
        KernelSpec::ArgmaxSplit { d, splits } => argmax_split_fits(*d, *splits),
        _ => Ok(()),
    }
}

/// The argmax kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn argmax_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    argmax_fits(spec, b.outer())?;
    Ok(match spec {
        KernelSpec::ArgmaxFold { inner } => {
            b.argmax_fold = true;
            format!("%apart: !llvm.ptr<1>, %async: !llvm.ptr<1>, %aids: !llvm.ptr<1>, {}", emit_into(b, inner)?)
        }
        KernelSpec::Argmax { d } if d % 4 == 0 => {
            // a block per row: thread t takes the row's 16-byte pieces t, t + T, t + 2T, ...,
            // ARGMAX_UNROLL loads issued before their compares; (max, first index) per
            // thread, then over the warp, then warp 0 over the warps' results
            let Launch::BlockPerRow { warps } = spec.launch() else { unreachable!() };
            let warps = warps as usize;
            let nt = 32 * warps;
            let (u, nvec) = (ARGMAX_UNROLL, d / 4);
            let iters = nvec.div_ceil(nt * u);
            let (smv, smi) = (format!("memref<{warps}xf32, #gpu.address_space<workgroup>>"), format!("memref<{warps}xi32, #gpu.address_space<workgroup>>"));
            b.workgroup = Some(format!("%redv : {smv}, %redi : {smi}"));
            let (t, rowi) = b.open_block_row();
            let t64 = b.idx64(&t);
            let cd = b.ci64(*d as i64);
            let base = b.op(&format!("arith.muli {rowi}, {cd} : i64"));
            let ninf = b.op("arith.constant 0xFF800000 : f32");
            let big = b.op("arith.constant 2147483647 : i32");
            let (c0, c1, cit) = (b.op("arith.constant 0 : index"), b.op("arith.constant 1 : index"), b.op(&format!("arith.constant {iters} : index")));
            let (res, it, bv, bi) = (b.v(), b.v(), b.v(), b.v());
            b.line(&format!("{res}:2 = scf.for {it} = {c0} to {cit} step {c1} iter_args({bv} = {ninf}, {bi} = {big}) -> (f32, i32) {{"));
            let it64 = b.idx64(&it);
            let cstep = b.ci64((nt * u) as i64);
            let j0 = b.op(&format!("arith.muli {it64}, {cstep} : i64"));
            let j0 = b.op(&format!("arith.addi {j0}, {t64} : i64"));
            let (cnv, z, c4) = (b.ci64(nvec as i64), b.ci64(0), b.ci64(4));
            let row = ArgmaxRow { base: &base, j0: &j0, bound: &cnv, z: &z, c4: &c4, ninf: &ninf, big: &big };
            let (v, i) = argmax_pieces_from(b, &row, u, nt, &bv, &bi);
            b.line(&format!("scf.yield {v}, {i} : f32, i32"));
            b.line("}");
            let (lane, warp, c0) = argmax_warps_to_shared(b, &format!("{res}#0"), &format!("{res}#1"), &t, &smv, &smi);
            let w0 = b.op(&format!("arith.cmpi eq, {warp}, {c0} : index"));
            b.line(&format!("scf.if {w0} {{"));
            // (lanes past the warps' count take -inf and the largest index)
            let cw = b.op(&format!("arith.constant {warps} : index"));
            let has = b.op(&format!("arith.cmpi ult, {lane}, {cw} : index"));
            let cwm = b.op(&format!("arith.constant {} : index", warps - 1));
            let lc = b.op(&format!("arith.minui {lane}, {cwm} : index"));
            let pv = b.op(&format!("memref.load %redv[{lc}] : {smv}"));
            let pi = b.op(&format!("memref.load %redi[{lc}] : {smi}"));
            let fi = argmax_settle(b, &pv, &pi, Some(&has), &ninf, &big);
            let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
            b.line(&format!("scf.if {first} {{"));
            let p = b.op(&format!("llvm.getelementptr %y[{rowi}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
            b.line(&format!("llvm.store {fi}, {p} : i32, !llvm.ptr<1>"));
            b.line("}");
            b.line("}");
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::ArgmaxCluster { d, blocks } => {
            emit_argmax_cluster(b, *d, *blocks)?;
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::ArgmaxSplit { d, splits } => {
            emit_argmax_split(b, *d, *splits)?;
            "%x: !llvm.ptr<1>, %part: !llvm.ptr<1>, %sync: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::Argmax { d } => {
            let (lane, base, dd, c32) = b.open_row(*d, 4);
            let ninf = b.op("arith.constant 0xFF800000 : f32");
            let big = b.op("arith.constant 2147483647 : i32");
            let res = b.v();
            let (iv, bv, bi) = (b.v(), b.v(), b.v());
            b.line(&format!("{res}:2 = scf.for {iv} = {lane} to {dd} step {c32} iter_args({bv} = {ninf}, {bi} = {big}) -> (f32, i32) {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let x = b.load("%x", &idx);
            let i32v = b.op(&format!("arith.index_cast {iv} : index to i32"));
            let gt = b.op(&format!("arith.cmpf ogt, {x}, {bv} : f32"));
            let nv = b.op(&format!("arith.select {gt}, {x}, {bv} : f32"));
            let ni = b.op(&format!("arith.select {gt}, {i32v}, {bi} : i32"));
            b.line(&format!("scf.yield {nv}, {ni} : f32, i32"));
            b.line("}");
            let (_, i) = b.warp_argmax(&format!("{res}#0"), &format!("{res}#1"));
            let c0 = b.op("arith.constant 0 : index");
            let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
            b.line(&format!("scf.if {first} {{"));
            let row = b.op(&format!("arith.divui {base}, {dd} : index"));
            let row = b.op(&format!("arith.index_cast {row} : index to i64"));
            let p = b.op(&format!("llvm.getelementptr %y[{row}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
            b.line(&format!("llvm.store {i}, {p} : i32, !llvm.ptr<1>"));
            b.line("}");
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        other => return Err(format!("`{}` is not one of the argmax kernels", other.symbol())),
    })
}
