//! The one-token fusions around the decode attention: RoPE and the cache writes inside it
//! (`RopeAttention`), the o projection and its residual added in by each head's blocks
//! (`AttentionO`), and the q/k/v GEMV with its RMSNorm prologue computed by the attention's own
//! blocks — a head's blocks a thread-block cluster sharing q/k/v through distributed shared
//! memory on sm_90a (`QkvAttentionO`). Two kernels per layer at one token.
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - The one-token layer in three kernels (small models at batch 1, where a kernel's dependent
//!   chain after its PDL wait, not its bytes, sets its time; on by default, SmolLM2 shape b1
//!   0.361 -> 0.272 ms per step): `fuse_swiglu_down` (DSC_SWIGLU_DOWN=0 off) — where the SwiGLU
//!   GEMV with the norm prologue feeds the down projection's one-row GEMV (residual = the norm's
//!   input x, nothing else reading h, h no graph output) and x comes from a one-row plain GEMV
//!   with a residual (the o projection) — makes the down step's one-row kernel
//!   `KernelSpec::SwiGluDown` (norm, gate/up, SwiGLU and the down projection; each block's 16
//!   features' partial sums added into y with `red.global.add`, a warp's reductions on 32
//!   consecutive floats) and the o step's `MatMulCopy` (its output also stored into y: the
//!   accumulator seeded with the residual); the SwiGLU step runs from two rows only. Then
//!   `fuse_attention_o_red` (DSC_ATTN_O_RED=0 off) folds that o GEMV into the one-token RoPE
//!   attention: `AttentionO { red: true, splits: 4 }` — 4 blocks per head, each running its head's
//!   attention and adding its quarter of W_o's rows (head 0: + the residual) into x and y — and
//!   the q/k/v GEMV before it zeroes both (`ZeroFill`, after its wait); the o step keeps two rows
//!   and more, and one row at the split attention's contexts (where `MatMulCopy` writes both).
//!   **Invariant**: a buffer a kernel adds into with reductions is zeroed or seeded by an
//!   earlier kernel of the same step, and no kernel between them reads or writes it; float
//!   additions in varying order make these one-token steps non-deterministic in the last bits
//!   (streams compared in the A/Bs: equal).
//! - The one-token layer in two kernels (session 17; on by default, DSC_QKV_ATTN=0 off):
//!   `fuse_qkv_attention` folds the q/k/v GEMV (the merged, bias-less bf16 `NormMatMul` that
//!   zero-fills) into that attention where the one-row kernel before the GEMV is the previous
//!   layer's fused MLP writing its x: the attention becomes `KernelSpec::QkvAttentionO` (args
//!   x, g, W_q, W_k, W_v — named by which part of the merged output each view starts at — then
//!   the rest), the MLP `ZeroFill { SwiGluDown }` (it zeroes the accumulators now), and the GEMV
//!   runs from two rows, and at one row only past the fused attention's contexts (a plain
//!   `NormMatMul` step with `min_context`). The first layer keeps three kernels (its GEMV follows
//!   the embedding gather; fusing it too, the gather zeroing the accumulators, measured slower in
//!   session 18 and went); instead the gather is folded into
//!   that GEMV, `GatherX`: it reads the bf16 table row itself and its block 0 writes x (the
//!   gather runs from two rows only; on since session 19, DSC_GATHER_GEMV=0 at compile time off). On sm_90a a head's 4 blocks (the o projection's splits) are a
//!   **thread-block cluster** (`KernelSpec::cluster()` -> `GpuStep::cluster`, the runtime's and
//!   gpu-check's `cuLaunchKernelEx` with `CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION` along grid y):
//!   block r computes elements r·D/4.. of the head's q, k and v (W rows loaded into registers
//!   before the PDL wait; x and g through shared memory, laid out so the lanes' reads are
//!   conflict-free), stores them into every block's shared memory (`mapa` +
//!   `st.shared::cluster`), cluster barrier (release / acquire); then block r takes chunk r of
//!   the context's keys, and the blocks' partial softmax states go the same way past a second
//!   cluster barrier, each block combining them for its quarter of the o projection. On sm_80
//!   (no clusters) the same symbol computes the head's whole q/k/v per block and takes every
//!   key. `griddepcontrol.wait` carries a memory clobber: without it LLVM sank loads issued
//!   before it (the attention's W_o and K/V rows) past it.

use crate::kernels::*;

/// The readable symbol of a `qkv` kernel (`KernelSpec::symbol`).
pub(crate) fn qkv_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::AttentionO { inner, n, red, splits, wdtype } => format!(
            "{}_o{n}{}{}",
            inner.symbol(),
            if *wdtype == DType::BF16 { String::new() } else { format!("_{}", wdtype.name()) },
            match (red, splits) {
                (false, _) => String::new(),
                (true, 1) => "_red".to_string(),
                (true, s) => format!("_red{s}"),
            }
        ),
        KernelSpec::QkvAttentionO { inner, k, eps_bits, cluster, wdtype } => {
            let q = if *wdtype == DType::BF16 { String::new() } else { format!("_{}", wdtype.name()) };
            format!("{}_qkv{k}{q}_e{eps_bits:x}_c{cluster}", inner.symbol())
        }
        KernelSpec::RopeAttention { inner, theta_bits, interleaved } => {
            format!("{}_rope{}_{}", inner.symbol(), f32::from_bits(*theta_bits) as u64, if *interleaved { "interleaved" } else { "half" })
        }
        other => unreachable!("{other:?} is not a qkv kernel (kernels::family)"),
    }
}

/// How the runtime launches a `qkv` kernel (`KernelSpec::launch`).
pub(crate) fn qkv_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::RopeAttention { inner, .. } | KernelSpec::AttentionO { inner, .. } | KernelSpec::QkvAttentionO { inner, .. } => inner.launch(),
        other => unreachable!("{other:?} is not a qkv kernel (kernels::family)"),
    }
}

/// Where a row of values is read from: a global pointer, or the kernel's shared memory `%sm`
/// (its memref type) from an element offset.
pub(crate) enum Src<'a> {
    Global(&'a str),
    Shared(&'a str, usize),
}

/// A row of W_q, W_k or W_v a warp of [`KernelSpec::QkvAttentionO`] computes: its first byte
/// (a global pointer), its place in the head's q, k and v in shared memory (m·D + e, i64),
/// whether the warp has it (a warp past the block's rows: None = always), and its 16-byte
/// words per round of the lane's pieces of K where they were loaded before the wait.
pub(crate) struct QkvRow {
    pub(crate) ptr: String,
    pub(crate) at: String,
    pub(crate) valid: Option<String>,
    pub(crate) words: Option<Vec<Vec<String>>>,
}

/// The lane's 16-byte pieces of a K-long bf16 row, l, l + 32, ...: their indices (clamped to
/// the last piece) and, for a partial last round, whether the piece is real.
pub(crate) fn lane_pieces(b: &mut Body, k: usize, lane_i: &str) -> (Vec<String>, Vec<Option<String>>) {
    let units = k / 8;
    let lane64 = b.idx64(lane_i);
    let last = b.ci64(units as i64 - 1);
    let mut uoff = vec![];
    let mut valid = vec![];
    for r in 0..units.div_ceil(32) {
        let cr = b.ci64(32 * r as i64);
        let u = b.op(&format!("arith.addi {lane64}, {cr} : i64"));
        valid.push((units % 32 != 0 && r == units.div_ceil(32) - 1).then(|| b.op(&format!("arith.cmpi sle, {u}, {last} : i64"))));
        uoff.push(b.op(&format!("arith.minsi {u}, {last} : i64")));
    }
    (uoff, valid)
}

/// A bf16 row's 16-byte pieces at `uoff` (piece indices, i64) from `ptr`: 4 words each.
pub(crate) fn row_words(b: &mut Body, ptr: &str, uoff: &[String]) -> Vec<Vec<String>> {
    // (Q4_1, `b.qkv_wdtype`: a unit's nibble word and its block's d/min word)
    if b.qkv_wdtype == DType::Q4_1 {
        let c0 = b.ci64(0);
        return uoff
            .iter()
            .map(|u| {
                let (bo, e0) = b.q4_1_unit(u);
                b.q4_1_words(ptr, &c0, &bo, &e0)
            })
            .collect();
    }
    let c16 = b.ci64(16);
    uoff.iter()
        .map(|u| {
            let o = b.op(&format!("arith.muli {u}, {c16} : i64"));
            b.load_vec(ptr, &o, 4, "i32", 16)
        })
        .collect()
}

/// [`KernelSpec::QkvAttentionO`] before `griddepcontrol.wait`: the block of rank r in its
/// cluster of `c` (`opart`; one block computing all where `c` is 1) takes the head's elements
/// [r·D/c, (r+1)·D/c) of q (head `head0`), k and v (KV head `kh`): 3·D/c rows, row
/// j = m·D/c + e' (m: q, k, v) to warp j mod warps. Where a warp has at most three rows (sm_90a,
/// the kernel may start before the previous one ends) their weights are loaded here, into
/// registers; threads t < K/4 put g's floats 4t .. 4t + 3 into shared memory at `gs_at`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qkv_prologue(
    b: &mut Body,
    k: usize,
    d: usize,
    c: usize,
    warps: usize,
    head0: &str,
    kh: &str,
    opart: Option<&str>,
    tid: &str,
    warp_i: &str,
    lane_i: &str,
    gs_at: usize,
    smt: &str,
) -> Vec<QkvRow> {
    let per = d / c;
    let nrows = 3 * per;
    let rpw = nrows.div_ceil(warps);
    let e_blk = match opart {
        Some(op) if c > 1 => {
            let cper = b.ci64(per as i64);
            b.op(&format!("arith.muli {op}, {cper} : i64"))
        }
        _ => b.ci64(0),
    };
    let w64 = b.idx64(warp_i);
    let dd = b.ci64(d as i64);
    let q0 = b.op(&format!("arith.muli {head0}, {dd} : i64"));
    let k0 = b.op(&format!("arith.muli {kh}, {dd} : i64"));
    let rowb = b.ci64(if b.qkv_wdtype == DType::Q4_1 { (k / 32 * 20) as i64 } else { 2 * k as i64 });
    let (cper, clast, c0, c1) = (b.ci64(per as i64), b.ci64(nrows as i64 - 1), b.ci64(0), b.ci64(1));
    let preload = b.pdl && rpw <= 3;
    let (uoff, _) = lane_pieces(b, k, lane_i);
    let c16 = b.ci64(16);
    let mut rows = vec![];
    for i in 0..rpw {
        let ci = b.ci64((i * warps) as i64);
        let j = b.op(&format!("arith.addi {w64}, {ci} : i64"));
        let valid = ((i + 1) * warps > nrows).then(|| b.op(&format!("arith.cmpi sle, {j}, {clast} : i64")));
        let j = b.op(&format!("arith.minsi {j}, {clast} : i64"));
        let m = b.op(&format!("arith.divui {j}, {cper} : i64"));
        let el = b.op(&format!("arith.remui {j}, {cper} : i64"));
        let e = b.op(&format!("arith.addi {e_blk}, {el} : i64"));
        let is_q = b.op(&format!("arith.cmpi eq, {m}, {c0} : i64"));
        let is_k = b.op(&format!("arith.cmpi eq, {m}, {c1} : i64"));
        let base = b.op(&format!("arith.select {is_k}, %wk, %wv : !llvm.ptr<1>"));
        let base = b.op(&format!("arith.select {is_q}, %wq, {base} : !llvm.ptr<1>"));
        let r0 = b.op(&format!("arith.select {is_q}, {q0}, {k0} : i64"));
        let r = b.op(&format!("arith.addi {r0}, {e} : i64"));
        let off = b.op(&format!("arith.muli {r}, {rowb} : i64"));
        let ptr = b.op(&format!("llvm.getelementptr {base}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        let md = b.op(&format!("arith.muli {m}, {dd} : i64"));
        let at = b.op(&format!("arith.addi {md}, {e} : i64"));
        let words = preload.then(|| row_words(b, &ptr, &uoff));
        rows.push(QkvRow { ptr, at, valid, words });
    }
    let t64 = b.idx64(tid);
    let cq = b.ci64((k / 4) as i64);
    let mine = b.op(&format!("arith.cmpi slt, {t64}, {cq} : i64"));
    b.line(&format!("scf.if {mine} {{"));
    let off = b.op(&format!("arith.muli {t64}, {c16} : i64"));
    let gv = b.load_f32s("%g", &off, 4);
    store_quad(b, &gv, gs_at, k, &t64, smt);
    b.line("}");
    rows
}

/// `val` (f32) into element `at` (i64) of the shared memory `%sm` of the cluster's block of
/// rank `rank` (i64): `mapa` of this block's address, then `st.shared::cluster` (visible to
/// that block past a cluster barrier with release / acquire).
pub(crate) fn st_cluster(b: &mut Body, smt: &str, at: &str, rank: &str, val: &str) {
    let base = b.op(&format!("memref.extract_aligned_pointer_as_index %sm : {smt} -> index"));
    let base = b.idx64(&base);
    let c4 = b.ci64(4);
    let by = b.op(&format!("arith.muli {at}, {c4} : i64"));
    let addr = b.op(&format!("arith.addi {base}, {by} : i64"));
    let r32 = b.op(&format!("arith.trunci {rank} : i64 to i32"));
    let remote = b.op(&format!("llvm.inline_asm \"mapa.shared::cluster.u64 $0, $1, $2;\", \"=l,l,r\" {addr}, {r32} : (i64, i32) -> i64"));
    b.line(&format!("llvm.inline_asm has_side_effects \"st.shared::cluster.f32 [$0], $1;\", \"l,f\" {remote}, {val} : (i64, f32) -> ()"));
}

/// A K-long row's floats 4·t .. 4·t + 3 into shared memory `%sm` from `at`, element e at
/// at + (e mod 8)·K/8 + e / 8: the reads of [`qkv_compute`] (lane l: elements 8l + q) then hit
/// consecutive words, no bank conflicts.
pub(crate) fn store_quad(b: &mut Body, v: &[String], at: usize, k: usize, t64: &str, smt: &str) {
    // (Q4_1: lane l's unit l of a round is quarter t of block l / 4, elements 4t + i and
    // 16 + 4t + i: floats 4T + i at (4·half + i)·K/8 + u, T = 8·blk + 4·half + t, u = 4·blk + t)
    let (u, odd) = if b.qkv_wdtype == DType::Q4_1 {
        let (c8, c4) = (b.ci64(8), b.ci64(4));
        let blk = b.op(&format!("arith.divui {t64}, {c8} : i64"));
        let t8 = b.op(&format!("arith.remui {t64}, {c8} : i64"));
        let t = b.op(&format!("arith.remui {t8}, {c4} : i64"));
        let u = b.op(&format!("arith.muli {blk}, {c4} : i64"));
        (b.op(&format!("arith.addi {u}, {t} : i64")), b.op(&format!("arith.divui {t8}, {c4} : i64")))
    } else {
        let c2 = b.ci64(2);
        (b.op(&format!("arith.divui {t64}, {c2} : i64")), b.op(&format!("arith.remui {t64}, {c2} : i64")))
    };
    let cq = b.ci64((4 * (k / 8)) as i64);
    let q0 = b.op(&format!("arith.muli {odd}, {cq} : i64"));
    let base = b.op(&format!("arith.addi {q0}, {u} : i64"));
    for (i, x) in v.iter().enumerate() {
        let ci = b.ci64((at + i * (k / 8)) as i64);
        let j = b.op(&format!("arith.addi {base}, {ci} : i64"));
        let j = b.op(&format!("arith.index_cast {j} : i64 to index"));
        b.line(&format!("memref.store {x}, %sm[{j}] : {smt}"));
    }
}

/// [`KernelSpec::QkvAttentionO`] after `griddepcontrol.wait`: x's row `t` into shared memory
/// at `xs_at` (threads t < K/4), each warp's rows ([`qkv_prologue`]) over the whole of K —
/// the lane's 16-byte pieces l, l + 32, .. of a row, three rows at a time (their weights
/// loaded here where the prologue did not) — times x·g, the warp's sum of x² with them (so
/// each warp has the RMSNorm's scale itself); then lane i·c + r stores the warp's value i into
/// the shared memory of the cluster's block r (`mapa`, then `st.shared::cluster`) at qkv_at +
/// m·D + e and every thread passes the cluster barrier (release / acquire: the stores are
/// visible past it); without a cluster (c = 1) plain stores and a block barrier.
#[allow(clippy::too_many_arguments)]
pub(crate) fn qkv_compute(b: &mut Body, k: usize, eps: f32, c: usize, t: &str, rows: &[QkvRow], tid: &str, lane_i: &str, xs_at: usize, gs_at: usize, qkv_at: usize, smt: &str) {
    let t64 = b.idx64(tid);
    let cq = b.ci64((k / 4) as i64);
    let c16 = b.ci64(16);
    let mine = b.op(&format!("arith.cmpi slt, {t64}, {cq} : i64"));
    b.line(&format!("scf.if {mine} {{"));
    let xrow = b.ci64((k * 4) as i64);
    let xb = b.op(&format!("arith.muli {t}, {xrow} : i64"));
    let off = b.op(&format!("arith.muli {t64}, {c16} : i64"));
    let off = b.op(&format!("arith.addi {xb}, {off} : i64"));
    let xv = b.load_f32s("%x", &off, 4);
    store_quad(b, &xv, xs_at, k, &t64, smt);
    b.line("}");
    let (uoff, valid) = lane_pieces(b, k, lane_i);
    let rounds = uoff.len();
    let zero = b.cf32(0.0);
    let mut acc: Vec<String> = vec![];
    let mut ss = zero.clone();
    for (ci, chunk) in rows.chunks(3).enumerate() {
        // (the chunk's weights first where the prologue did not load them: 4 words per row
        // and round in flight)
        let words: Vec<Vec<Vec<String>>> = chunk.iter().map(|row| row.words.clone().unwrap_or_else(|| row_words(b, &row.ptr, &uoff))).collect();
        if ci == 0 {
            b.line("gpu.barrier");
        }
        let mut cacc = vec![zero.clone(); chunk.len()];
        for r in 0..rounds {
            let mut xg = vec![];
            for q in 0..8 {
                // (element 8u + q at q·K/8 + u: see store_quad)
                let read = |b: &mut Body, at: usize| -> String {
                    let ca = b.ci64((at + q * (k / 8)) as i64);
                    let j = b.op(&format!("arith.addi {}, {ca} : i64", uoff[r]));
                    let j = b.op(&format!("arith.index_cast {j} : i64 to index"));
                    b.op(&format!("memref.load %sm[{j}] : {smt}"))
                };
                let mut x = read(b, xs_at);
                if let Some(ok) = &valid[r] {
                    x = b.op(&format!("arith.select {ok}, {x}, {zero} : f32"));
                }
                let g = read(b, gs_at);
                if ci == 0 {
                    ss = b.op(&format!("llvm.intr.fma({x}, {x}, {ss}) : (f32, f32, f32) -> f32"));
                }
                xg.push(b.op(&format!("arith.mulf {x}, {g} : f32")));
            }
            for (a, w) in cacc.iter_mut().zip(&words) {
                *a = if b.qkv_wdtype == DType::Q4_1 { b.fma_q4_1_words(a, &w[r], &xg) } else { b.fma_bf16_words(a, &w[r], &xg) };
            }
        }
        acc.extend(cacc);
    }
    let lane32 = b.op(&format!("arith.index_cast {lane_i} : index to i32"));
    let n = acc.len();
    acc.push(ss);
    let sums = b.warp_sums(&acc, &lane32);
    let inv = b.inv_rms(&sums[n], k, eps);
    let vals: Vec<String> = sums[..n].iter().map(|s| b.op(&format!("arith.mulf {s}, {inv} : f32"))).collect();
    // lane i·c + r: the warp's value i into block r's shared memory (where the warp has row i)
    let lane64 = b.idx64(lane_i);
    let cc = b.ci64(c as i64);
    let i = b.op(&format!("arith.divui {lane64}, {cc} : i64"));
    let r = b.op(&format!("arith.remui {lane64}, {cc} : i64"));
    let cn = b.ci64((n * c) as i64);
    let mut ok = b.op(&format!("arith.cmpi slt, {lane64}, {cn} : i64"));
    let mut val = vals[0].clone();
    let mut dst = rows[0].at.clone();
    let mut has = rows[0].valid.clone();
    for (j, row) in rows.iter().enumerate().skip(1) {
        let cj = b.ci64(j as i64);
        let is = b.op(&format!("arith.cmpi eq, {i}, {cj} : i64"));
        val = b.op(&format!("arith.select {is}, {}, {val} : f32", vals[j]));
        dst = b.op(&format!("arith.select {is}, {}, {dst} : i64", row.at));
        if let Some(v) = &row.valid {
            let t1 = b.op("arith.constant true");
            let prev = has.clone().unwrap_or(t1);
            has = Some(b.op(&format!("arith.select {is}, {v}, {prev} : i1")));
        }
    }
    if let Some(h) = has {
        ok = b.op(&format!("arith.andi {ok}, {h} : i1"));
    }
    let cq0 = b.ci64(qkv_at as i64);
    let dst = b.op(&format!("arith.addi {cq0}, {dst} : i64"));
    b.line(&format!("scf.if {ok} {{"));
    if c > 1 {
        st_cluster(b, smt, &dst, &r, &val);
    } else {
        let j = b.op(&format!("arith.index_cast {dst} : i64 to index"));
        b.line(&format!("memref.store {val}, %sm[{j}] : {smt}"));
    }
    b.line("}");
    if c > 1 {
        b.cluster_barrier();
    } else {
        b.line("gpu.barrier");
    }
}

/// W_o's row at the head's D columns, from element `e0` (row·H·D + head·D): bf16, D/8 16-byte
/// vectors of 8 i16; Q4_1 (`b.attn_o_wdtype`), per block of 32 columns its five words (d/min,
/// then the 16 nibble bytes: 20-byte blocks, 4-byte aligned)
pub(crate) fn o_row_load(b: &mut Body, e0: &str, d: usize) -> Vec<String> {
    if b.attn_o_wdtype == DType::Q4_1 {
        let (c32, c20) = (b.ci64(32), b.ci64(20));
        let blk = b.op(&format!("arith.divui {e0}, {c32} : i64"));
        let by = b.op(&format!("arith.muli {blk}, {c20} : i64"));
        let mut words = vec![];
        for w in 0..d / 32 * 5 {
            let co = b.ci64(4 * w as i64);
            let at = b.op(&format!("arith.addi {by}, {co} : i64"));
            words.extend(b.load_vec("%wo", &at, 1, "i32", 4));
        }
        return words;
    }
    (0..d / 8)
        .map(|c8| {
            let co = b.ci64(8 * c8 as i64);
            let e = b.op(&format!("arith.addi {e0}, {co} : i64"));
            let c2b = b.ci64(2);
            let by = b.op(&format!("arith.muli {e}, {c2b} : i64"));
            b.load_vector("%wo", &by, 8, "i16", 16)
        })
        .collect()
}

/// The D weights (f32, column order) of a row [`o_row_load`] loaded
fn o_row_weights(b: &mut Body, vs: &[String], d: usize) -> Vec<String> {
    if b.attn_o_wdtype == DType::Q4_1 {
        let c15 = b.op("arith.constant 15 : i32");
        let mut ws = vec![];
        for words in vs.chunks(5).take(d / 32) {
            let [dd, m] = b.f16_pair(&words[0]);
            for e in 0..32 {
                let byte = e % 16;
                let cs = b.op(&format!("arith.constant {} : i32", 8 * (byte % 4) + if e >= 16 { 4 } else { 0 }));
                let q = b.op(&format!("arith.shrui {}, {cs} : i32", words[1 + byte / 4]));
                let q = b.op(&format!("arith.andi {q}, {c15} : i32"));
                let q = b.op(&format!("arith.uitofp {q} : i32 to f32"));
                ws.push(b.op(&format!("llvm.intr.fma({dd}, {q}, {m}) : (f32, f32, f32) -> f32")));
            }
        }
        return ws;
    }
    let mut ws = vec![];
    for v in vs {
        for e in 0..8 {
            let w = b.element(v, e, 8, "i16");
            ws.push(b.bf16_to_f32(&w));
        }
    }
    ws
}

/// The o projection folded into the one-token decode attention ([`KernelSpec::AttentionO`]),
/// after the head's output is in shared memory at `o_at` (D floats; the flag slot after them):
/// each thread's rows of W_o's head columns (`o_rows`: row, valid, its D/8 loaded 16-byte
/// vectors) times the output into the partial (h, t) of `%parts` ([H, T, N]); then thread 0,
/// past a block barrier and a GPU-scope fence, counts the block in `%sync[t]`; the block that
/// counts last (H - 1 before it) sums the H partials in head order + `%res` into `%out`
/// ([T, N]) and resets the counter.
#[allow(clippy::too_many_arguments)]
pub(crate) fn o_projection(
    b: &mut Body,
    nn: usize,
    h: usize,
    d: usize,
    t: &str,
    head0: &str,
    tid: &str,
    o_rows: &[(String, String, Vec<String>, String)],
    o_at: usize,
    smt: &str,
) -> Result<(), String> {
    b.line("gpu.barrier");
    let ch = b.ci64(h as i64);
    let ntok = b.op(&format!("arith.divui %n, {ch} : i64"));
    let cn = b.ci64(nn as i64);
    // (the head's output, read back from shared memory)
    let ys: Vec<String> = (0..d)
        .map(|e| {
            let i = b.op(&format!("arith.constant {} : index", o_at + e));
            b.op(&format!("memref.load %sm[{i}] : {smt}"))
        })
        .collect();
    // partial (h, t): row (h·T + t)
    let prow = b.op(&format!("arith.muli {head0}, {ntok} : i64"));
    let prow = b.op(&format!("arith.addi {prow}, {t} : i64"));
    let pbase = b.op(&format!("arith.muli {prow}, {cn} : i64"));
    for (j, valid, vs, e0) in o_rows {
        // (rows past the first round: their loads now)
        let loaded: Vec<String> = if vs.is_empty() { o_row_load(b, e0, d) } else { vs.clone() };
        let mut acc = b.cf32(0.0);
        for (w, y) in o_row_weights(b, &loaded, d).iter().zip(&ys) {
            acc = b.op(&format!("llvm.intr.fma({w}, {y}, {acc}) : (f32, f32, f32) -> f32"));
        }
        if b.attn_o_red {
            // (head 0 adds the residual; every head adds into both accumulators)
            b.line(&format!("scf.if {valid} {{"));
            let tn = b.op(&format!("arith.muli {t}, {cn} : i64"));
            let at = b.op(&format!("arith.addi {tn}, {j} : i64"));
            let c0h = b.ci64(0);
            let h0 = b.op(&format!("arith.cmpi eq, {head0}, {c0h} : i64"));
            let r = b.load("%res", &at);
            let zr = b.cf32(0.0);
            let r = b.op(&format!("arith.select {h0}, {r}, {zr} : f32"));
            let v = b.op(&format!("arith.addf {acc}, {r} : f32"));
            for out in ["%out", "%out2"] {
                let p = b.op(&format!("llvm.getelementptr {out}[{at}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
                b.line(&format!("llvm.inline_asm has_side_effects \"red.global.add.f32 [$0], $1;\", \"l,f\" {p}, {v} : (!llvm.ptr<1>, f32) -> ()"));
            }
            b.line("}");
            continue;
        }
        b.line(&format!("scf.if {valid} {{"));
        let at = b.op(&format!("arith.addi {pbase}, {j} : i64"));
        b.store(&acc, "%parts", &at);
        b.line("}");
    }
    if b.attn_o_red {
        return Ok(());
    }
    b.line("gpu.barrier");
    let tid64 = b.idx64(tid);
    let c0 = b.ci64(0);
    let first = b.op(&format!("arith.cmpi eq, {tid64}, {c0} : i64"));
    let flag = b.op(&format!("arith.constant {} : index", o_at + d));
    let c4 = b.ci64(4);
    let so = b.op(&format!("arith.muli {t}, {c4} : i64"));
    let sb = b.op("llvm.ptrtoint %sync : !llvm.ptr<1> to i64");
    let sa = b.op(&format!("arith.addi {sb}, {so} : i64"));
    b.line(&format!("scf.if {first} {{"));
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"\" : () -> ()");
    let old = b.op(&format!("llvm.inline_asm has_side_effects \"atom.global.add.u32 $0, [$1], 1;\", \"=r,l\" {sa} : (i64) -> i32"));
    let hm1 = b.op(&format!("arith.constant {} : i32", h as i64 - 1));
    let last = b.op(&format!("arith.cmpi eq, {old}, {hm1} : i32"));
    let one = b.cf32(1.0);
    let zero = b.cf32(0.0);
    let fv = b.op(&format!("arith.select {last}, {one}, {zero} : f32"));
    b.line(&format!("memref.store {fv}, %sm[{flag}] : {smt}"));
    b.line("}");
    b.line("gpu.barrier");
    let fv = b.op(&format!("memref.load %sm[{flag}] : {smt}"));
    let zero = b.cf32(0.0);
    let is_last = b.op(&format!("arith.cmpf one, {fv}, {zero} : f32"));
    b.line(&format!("scf.if {is_last} {{"));
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"\" : () -> ()");
    let tn = b.op(&format!("arith.muli {t}, {cn} : i64"));
    let pb = b.op("llvm.ptrtoint %parts : !llvm.ptr<1> to i64");
    for (j, valid, _, _) in o_rows {
        b.line(&format!("scf.if {valid} {{"));
        let at = b.op(&format!("arith.addi {tn}, {j} : i64"));
        let mut acc = b.load("%res", &at);
        for hh in 0..h {
            let chh = b.ci64(hh as i64);
            let r = b.op(&format!("arith.muli {chh}, {ntok} : i64"));
            let r = b.op(&format!("arith.addi {r}, {t} : i64"));
            let r = b.op(&format!("arith.muli {r}, {cn} : i64"));
            let r = b.op(&format!("arith.addi {r}, {j} : i64"));
            // (GPU-scope loads: the other blocks' partials, past any stale L1 line)
            let rb = b.op(&format!("arith.muli {r}, {c4} : i64"));
            let pa = b.op(&format!("arith.addi {pb}, {rb} : i64"));
            let pv = b.op(&format!("llvm.inline_asm has_side_effects \"ld.relaxed.gpu.global.f32 $0, [$1];\", \"=f,l\" {pa} : (i64) -> f32"));
            acc = b.op(&format!("arith.addf {acc}, {pv} : f32"));
        }
        b.store(&acc, "%out", &at);
        b.line("}");
    }
    // (the counter back to zero for the next step: no block of this token counts again)
    b.line(&format!("scf.if {first} {{"));
    b.line(&format!("llvm.inline_asm has_side_effects \"st.relaxed.gpu.global.u32 [$0], 0;\", \"l\" {sa} : (i64) -> ()"));
    b.line("}");
    b.line("}");
    Ok(())
}

/// Whether a fused one-token attention kernel generates ([`fits`]): each wrapper's inner
/// kernel (the o projection on the RoPE attention of a head per block, q/k/v on that with
/// `red`, in clusters of its blocks per head on sm_90a), then the decode attention under the
/// flags they set.
pub(crate) fn qkv_fits(spec: &KernelSpec, o: Outer) -> Result<(), String> {
    match spec {
        KernelSpec::AttentionO { inner, n, red, splits, wdtype } => match inner.as_ref() {
            KernelSpec::RopeAttention { inner: att, .. } if matches!(att.as_ref(), KernelSpec::PagedAttention { group: 1, .. }) => {
                if *splits == 0 || n % splits != 0 || (*splits > 1 && !*red) {
                    return Err(format!("the o projection splits its {n} rows over blocks evenly, with `red` only (not {splits})"));
                }
                // (Q4_1: a head's D columns are whole blocks, D a multiple of 32 as the
                // attention needs anyway)
                if !matches!(wdtype, DType::BF16 | DType::Q4_1) {
                    return Err(format!("the o projection in the attention reads bf16 or Q4_1 weights, not {}", wdtype.name()));
                }
                fits_in(inner, Outer { attn_o: true, attn_o_red: *red, ..o })
            }
            other => Err(format!("the o projection folds into the one-token RoPE attention of a head per block, not {}", other.symbol())),
        },
        KernelSpec::QkvAttentionO { inner, k, cluster, wdtype, .. } => match inner.as_ref() {
            KernelSpec::AttentionO { red: true, splits, .. } if *cluster == 1 || cluster == splits => {
                // (Q4_1: a lane's unit is a quarter block, as in the decode GEMV)
                match wdtype {
                    DType::BF16 => {}
                    DType::Q4_1 if k % 32 == 0 => {}
                    other => return Err(format!("q, k and v in the attention take bf16 weights or Q4_1 with K a multiple of 32, not {} (K {k})", other.name())),
                }
                fits_in(inner, Outer { qkv_in: Some((*k, if o.pdl { *cluster } else { 1 })), ..o })
            }
            other => Err(format!("q, k and v fold into the one-token attention with the o projection added, in clusters of its blocks per head, not {} in clusters of {cluster}", other.symbol())),
        },
        KernelSpec::RopeAttention { inner, .. } => match inner.as_ref() {
            KernelSpec::PagedAttention { h, kvh, d, warps, keys, group, kv, .. } => paged_attention_fits(*h, *kvh, *d, *warps, *keys, *group, *kv, false, true, o),
            other => Err(format!("RoPE and the cache writes fold into the decode attention, not {}", other.symbol())),
        },
        other => Err(format!("`{}` is not one of the fused one-token attention kernels", other.symbol())),
    }
}

/// The fused one-token attention kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn qkv_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    qkv_fits(spec, b.outer())?;
    Ok(match spec {
        KernelSpec::AttentionO { inner, n, red, splits, wdtype } => match inner.as_ref() {
            KernelSpec::RopeAttention { inner: att, .. } if matches!(att.as_ref(), KernelSpec::PagedAttention { group: 1, .. }) => {
                b.attn_o = Some(*n);
                b.attn_o_wdtype = *wdtype;
                b.attn_o_red = *red;
                b.attn_o_splits = *splits;
                emit_into(b, inner)?
            }
            _ => unreachable!("qkv_fits: the o projection on the RoPE attention of a head per block"),
        },
        KernelSpec::QkvAttentionO { inner, k, eps_bits, cluster, wdtype } => match inner.as_ref() {
            KernelSpec::AttentionO { red: true, splits, .. } if *cluster == 1 || cluster == splits => {
                b.qkv_wdtype = *wdtype;
                // (clusters on sm_90a alone; elsewhere every block computes the head's 3·D)
                b.qkv_in = Some((*k, f32::from_bits(*eps_bits), if b.pdl { *cluster } else { 1 }));
                emit_into(b, inner)?.replacen(
                    "%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, ",
                    "%x: !llvm.ptr<1>, %g: !llvm.ptr<1>, %wq: !llvm.ptr<1>, %wk: !llvm.ptr<1>, %wv: !llvm.ptr<1>, ",
                    1,
                )
            }
            _ => unreachable!("qkv_fits: q, k and v on the attention with the o projection"),
        },
        KernelSpec::RopeAttention { inner, theta_bits, interleaved } => match inner.as_ref() {
            KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits, warps, keys, group, kv } => {
                emit_paged_attention(b, *h, *kvh, *d, *bs, *scale_bits, *warps, *keys, *group, *kv, None, Some((*theta_bits, *interleaved)))?
            }
            _ => unreachable!("qkv_fits: RoPE on the decode attention"),
        },
        _ => unreachable!("qkv_fits: a fused one-token attention kernel"),
    })
}
