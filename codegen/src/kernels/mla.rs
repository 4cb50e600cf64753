//! Multi-head Latent Attention's kernels (the `mla_attention` and `head_matmul` ops):
//! - [`KernelSpec::MlaAttention`]: attention over the paged latent cache, absorbed form —
//!   each cache row is one token's `[c_kv (L) | k_rope]` (C values), the keys are whole rows
//!   and the values their first L elements, shared by every head. A block per (token, head)
//!   of [`MLA_WARPS`] warps; the query row (pre-scaled by scale · log2 e, so the softmax runs
//!   on `ex2`) lives in registers, lane l holding the 8-element chunks l + 32 r (16-byte
//!   loads of a bf16 row); warp w takes [`MLA_KEYS`] keys at a time (keys wK.., then W·K
//!   further), their rows' loads in flight together, with an online softmax rescaled once
//!   per step, and one load of a row serves both its score and its value accumulation. The warps' partial
//!   states (m, l, acc[L]) meet in shared memory. The softmax scale (with YaRN's mscale) is
//!   in the spec, so two scales are two kernels.
//! - [`KernelSpec::HeadMatMul`]: y[t, h, :] = x[t, h, :] @ W[h]ᵀ for one matrix per head (the
//!   up-projections absorbed into the query and the output), a warp per output element
//!   (`Body::lane_dot`), grid y = tokens.
//! - [`KernelSpec::MlaLatentCache`] and [`KernelSpec::MlaQuery`]: what the schedule's
//!   `mla-fusions` (schedule/mla.rs) put in place of the latent row's six launches (slices,
//!   norm, k's rope, concat, cache write: a warp per token) and the absorbed query's five
//!   (slices, W_uk, q's rope, concat: a warp per output, then a warp per head's rotation pairs)
//!   — launches cost ~2-3 us each at decode whatever their work.
//! - [`KernelSpec::MlaCacheAttention`]: one-token steps (`mla-cache-attention`, off until a
//!   GPU run measures it): warp 0 of every head's attention block writes its token's latent
//!   row as `MlaLatentCache` does (`latent_row`, the same values from every head), a barrier,
//!   then the attention — one launch fewer a layer.
//!
//! What is still to come for the H200's targets: every head of a token in one block sharing
//! each row's load (FlashMLA's layout, on the tensor cores at 128 heads), a split over the
//! context for long ones, and the expanded form for long prefills.

use crate::kernels::*;
use crate::schedule::{NodeCx, Scalar, Step};
use crate::CodegenError;

/// Warps per block of the MLA decode attention (each takes every W-th group of
/// [`MLA_KEYS`] keys).
pub const MLA_WARPS: usize = 8;

/// Keys a warp of the MLA decode attention takes per step: their rows' loads in flight
/// together, their scores reduced at once, one rescale of the running state.
pub const MLA_KEYS: usize = 4;

/// Warps per block of the per-head matmul (a warp per output).
pub const HEAD_MATMUL_WARPS: u32 = 8;

/// The readable symbol of an `mla` kernel (`KernelSpec::symbol`).
pub(crate) fn mla_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::MlaAttention { h, c, l, bs, scale_bits, kv } => format!("mla_attention_h{h}_c{c}_l{l}_bs{bs}_s{scale_bits:08x}{}", kv_suffix(*kv)),
        KernelSpec::MlaCacheAttention { attn, write } => format!("{}_w{}", attn.symbol(), write.symbol().trim_start_matches("mla_latent_cache")),
        KernelSpec::HeadMatMul { h, k, n, wdtype } => format!("head_matmul_h{h}_k{k}_n{n}_{wdtype}"),
        KernelSpec::HeadMatMulMma { h, k, n, wdtype } => format!("head_matmul_mma_h{h}_k{k}_n{n}_{wdtype}"),
        KernelSpec::MlaLatentCache { l, r, eps_bits, theta_bits, interleaved, yarn, kv } => format!(
            "mla_latent_cache_l{l}_r{r}_e{eps_bits:08x}_theta{}{}{}{}",
            f32::from_bits(*theta_bits),
            if *interleaved { "_interleaved" } else { "" },
            yarn.map(|[f, lo, hi, m]| format!("_yarn{f:08x}_{lo:08x}_{hi:08x}_{m:08x}")).unwrap_or_default(),
            kv_suffix(*kv)
        ),
        KernelSpec::MlaQuery { h, nope, r, l, wdtype, theta_bits, interleaved, yarn } | KernelSpec::MlaQueryMma { h, nope, r, l, wdtype, theta_bits, interleaved, yarn } => format!(
            "mla_query{}_h{h}_k{nope}_r{r}_l{l}_{wdtype}_theta{}{}{}",
            if matches!(spec, KernelSpec::MlaQueryMma { .. }) { "_mma" } else { "" },
            f32::from_bits(*theta_bits),
            if *interleaved { "_interleaved" } else { "" },
            yarn.map(|[f, lo, hi, m]| format!("_yarn{f:08x}_{lo:08x}_{hi:08x}_{m:08x}")).unwrap_or_default()
        ),
        other => unreachable!("{other:?} is not an mla kernel (kernels::family)"),
    }
}

/// How the runtime launches an `mla` kernel (`KernelSpec::launch`): the attention a block per
/// (token, head) — grid x = tokens, y = heads —, the per-head matmul a warp per output.
pub(crate) fn mla_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::MlaAttention { .. } | KernelSpec::MlaCacheAttention { .. } => Launch::BlockPerRow { warps: MLA_WARPS as u32 },
        KernelSpec::HeadMatMul { .. } => Launch::WarpPerOutput { warps_per_block: HEAD_MATMUL_WARPS },
        KernelSpec::MlaLatentCache { .. } => Launch::WarpPerRow { rows_per_block: 4 },
        KernelSpec::MlaQuery { .. } => Launch::WarpPerOutput { warps_per_block: HEAD_MATMUL_WARPS },
        // (grid y = H: `rows` 1)
        KernelSpec::HeadMatMulMma { .. } | KernelSpec::MlaQueryMma { .. } => Launch::OutputsPerBlock { outputs: 16, rows: 1, warps: HEAD_MMA_WARPS as u32 },
        other => unreachable!("{other:?} is not an mla kernel (kernels::family)"),
    }
}

/// Whether the `mla` kernels take `spec`, without generating it: Err says why not.
pub(crate) fn mla_fits(spec: &KernelSpec) -> Result<(), String> {
    match spec {
        KernelSpec::MlaAttention { h, c, l, bs, kv, .. } => {
            if !matches!(kv, DType::F32 | DType::BF16) {
                return Err(format!("{kv} latent caches are not lowered for the GPU (f32 or bf16)"));
            }
            if *h == 0 || *bs == 0 || *l == 0 || l > c {
                return Err(format!("the latent attention needs heads, a block size and 1 <= L <= C (H {h}, C {c}, L {l}, BS {bs})"));
            }
            // (the query and the accumulators in registers: C / 32 and L / 32 per lane)
            if c.div_ceil(32) > 24 {
                return Err(format!("the latent attention keeps a row of up to 768 values in a warp's registers, not {c}"));
            }
            Ok(())
        }
        KernelSpec::MlaCacheAttention { attn, write } => {
            mla_fits(attn)?;
            mla_fits(write)?;
            match (attn.as_ref(), write.as_ref()) {
                (KernelSpec::MlaAttention { c, l, kv, .. }, KernelSpec::MlaLatentCache { l: wl, r, kv: wkv, .. }) if wl == l && wl + r == *c && wkv == kv => Ok(()),
                _ => Err(format!("the cache-writing attention needs the latent row it attends over ({} with {})", attn.symbol(), write.symbol())),
            }
        }
        KernelSpec::HeadMatMul { h, k, n, wdtype } => {
            if !matches!(wdtype, DType::F32 | DType::BF16 | DType::F16) {
                return Err(format!("the per-head matmul takes f32/bf16/f16 weights, not {wdtype}"));
            }
            if *h == 0 || *k == 0 || *n == 0 {
                return Err(format!("an empty per-head matmul (H {h}, K {k}, N {n})"));
            }
            Ok(())
        }
        KernelSpec::MlaLatentCache { l, r, kv, .. } => {
            kv_fits(*kv)?;
            // (a warp per token: L / 32 values a lane in registers, a rotation pair a lane)
            if *l == 0 || l.div_ceil(32) > 32 || *r == 0 || r % 2 != 0 || *r > 64 {
                return Err(format!("the latent cache write keeps up to 1,024 normed values a warp and rotates up to 32 pairs (L {l}, R {r})"));
            }
            Ok(())
        }
        KernelSpec::MlaQuery { h, nope, r, l, wdtype, .. } => {
            mla_fits(&KernelSpec::HeadMatMul { h: *h, k: *nope, n: *l, wdtype: *wdtype })?;
            // (a rotation pair a lane; q's rows in 8-element chunks where the dot takes them)
            if *r == 0 || r % 2 != 0 || *r > 64 || (nope % 8 == 0 && (nope + r) % 8 != 0) {
                return Err(format!("the fused query rotates up to 32 pairs a head and reads q's rows in 8-element chunks (NOPE {nope}, R {r})"));
            }
            Ok(())
        }
        KernelSpec::HeadMatMulMma { h, k, n, wdtype } => {
            mla_fits(&KernelSpec::HeadMatMul { h: *h, k: *k, n: *n, wdtype: *wdtype })?;
            if !matches!(wdtype, DType::BF16 | DType::F16) || k % 32 != 0 {
                return Err(format!("the per-head tensor-core matmul takes 16-bit weights and K a multiple of 32 (K {k}, {wdtype})"));
            }
            Ok(())
        }
        KernelSpec::MlaQueryMma { h, nope, r, l, wdtype, theta_bits, interleaved, yarn } => {
            mla_fits(&KernelSpec::MlaQuery { h: *h, nope: *nope, r: *r, l: *l, wdtype: *wdtype, theta_bits: *theta_bits, interleaved: *interleaved, yarn: *yarn })?;
            mla_fits(&KernelSpec::HeadMatMulMma { h: *h, k: *nope, n: *l, wdtype: *wdtype })?;
            // (x's rows read in 16-byte pieces)
            if (nope + r) % 4 != 0 {
                return Err(format!("the batched fused query reads q's rows in 16-byte pieces (NOPE + R {})", nope + r));
            }
            Ok(())
        }
        other => Err(format!("`{}` is not an mla kernel", other.symbol())),
    }
}

/// The `mla` kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn mla_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    mla_fits(spec)?;
    match spec {
        KernelSpec::MlaAttention { h, c, l, bs, scale_bits, kv } => {
            emit_mla_attention(b, *h, *c, *l, *bs, f32::from_bits(*scale_bits), *kv, None)?;
            Ok("%q: !llvm.ptr<1>, %cache: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %mb: i64".into())
        }
        KernelSpec::MlaCacheAttention { attn, write } => {
            let (KernelSpec::MlaAttention { h, c, l, bs, scale_bits, kv }, KernelSpec::MlaLatentCache { r, eps_bits, theta_bits, interleaved, yarn, .. }) = (attn.as_ref(), write.as_ref()) else {
                return Err("the cache-writing attention wraps an MlaAttention and an MlaLatentCache".into());
            };
            b.yarn = yarn.map(|y| y.map(f32::from_bits));
            emit_mla_attention(b, *h, *c, *l, *bs, f32::from_bits(*scale_bits), *kv, Some((*r, f32::from_bits(*eps_bits), *theta_bits, *interleaved)))?;
            b.yarn = None;
            Ok("%x: !llvm.ptr<1>, %g: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %q: !llvm.ptr<1>, %cache: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %mb: i64".into())
        }
        KernelSpec::HeadMatMul { h, k, n, wdtype } => {
            emit_head_matmul(b, *h, *k, *n, *wdtype)?;
            Ok("%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into())
        }
        KernelSpec::MlaQuery { h, nope, r, l, wdtype, theta_bits, interleaved, yarn } => {
            b.yarn = yarn.map(|y| y.map(f32::from_bits));
            emit_query(b, *h, *nope, *r, *l, *wdtype, *theta_bits, *interleaved)?;
            b.yarn = None;
            Ok("%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into())
        }
        KernelSpec::HeadMatMulMma { h, k, n, wdtype } => {
            emit_head_mma(b, *h, *k, *n, *k, *n, *wdtype, None)?;
            Ok("%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %m: i64".into())
        }
        KernelSpec::MlaQueryMma { h, nope, r, l, wdtype, theta_bits, interleaved, yarn } => {
            b.yarn = yarn.map(|y| y.map(f32::from_bits));
            emit_head_mma(b, *h, *nope, *l, nope + r, l + r, *wdtype, Some((*r, *theta_bits, *interleaved)))?;
            b.yarn = None;
            Ok("%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %m: i64".into())
        }
        KernelSpec::MlaLatentCache { l, r, eps_bits, theta_bits, interleaved, yarn, kv } => {
            b.yarn = yarn.map(|y| y.map(f32::from_bits));
            emit_latent_cache(b, *l, *r, f32::from_bits(*eps_bits), *theta_bits, *interleaved, *kv)?;
            b.yarn = None;
            Ok("%x: !llvm.ptr<1>, %g: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %cache: !llvm.ptr<1>, %rows: i64".into())
        }
        other => Err(format!("`{}` is not an mla kernel", other.symbol())),
    }
}

/// Lane `lane` (i64) < R/2 takes RoPE pair `lane` of an R-wide row of token `t` (opens `scf.if`;
/// close it): (cos, sin) at pos[t] (YaRN's through `Body::yarn`) and the pair's two element
/// indices in the row (interleaved: 2p, 2p + 1; else p, p + R/2).
fn open_lane_pair(b: &mut Body, lane: &str, t: &str, r: usize, theta_bits: u32, interleaved: bool) -> (String, String, String, String) {
    let half = b.ci64((r / 2) as i64);
    let mine = b.op(&format!("arith.cmpi slt, {lane}, {half} : i64"));
    b.line(&format!("scf.if {mine} {{"));
    let p = b.load_i32_as_i64("%pos", t);
    let (co, sn) = b.rope_cos_sin(lane, &p, r, theta_bits);
    let (i0, i1) = if interleaved {
        let c2 = b.ci64(2);
        let a0 = b.op(&format!("arith.muli {lane}, {c2} : i64"));
        let c1 = b.ci64(1);
        let a1 = b.op(&format!("arith.addi {a0}, {c1} : i64"));
        (a0, a1)
    } else {
        (lane.to_string(), b.op(&format!("arith.addi {lane}, {half} : i64")))
    };
    (co, sn, i0, i1)
}

/// Lane `lane` < R/2 rotates RoPE pair `lane` (at token `t`'s position) of x's row `row`
/// (width, start of the R values) into y's row `row` (width, start): the fused query's
/// rotation of each head's last R values.
#[allow(clippy::too_many_arguments)]
fn rotate_row_tail(b: &mut Body, lane: &str, t: &str, row: &str, (xw, xs): (&str, usize), (yw, ys): (&str, usize), r: usize, theta_bits: u32, interleaved: bool) {
    let (co, sn, i0, i1) = open_lane_pair(b, lane, t, r, theta_bits, interleaved);
    let cxs = b.ci64(xs as i64);
    let xb = b.op(&format!("arith.muli {row}, {xw} : i64"));
    let xb = b.op(&format!("arith.addi {xb}, {cxs} : i64"));
    let cys = b.ci64(ys as i64);
    let yb = b.op(&format!("arith.muli {row}, {yw} : i64"));
    let yb = b.op(&format!("arith.addi {yb}, {cys} : i64"));
    let (a0, a1) = (b.op(&format!("arith.addi {xb}, {i0} : i64")), b.op(&format!("arith.addi {xb}, {i1} : i64")));
    let (x0, x1) = (b.load("%x", &a0), b.load("%x", &a1));
    let (y0, y1) = b.rotate_pair(&x0, &x1, &co, &sn);
    for (y, i) in [(y0, i0), (y1, i1)] {
        let at = b.op(&format!("arith.addi {yb}, {i} : i64"));
        b.store(&y, "%y", &at);
    }
    b.line("}");
}

/// [`KernelSpec::MlaQuery`]: token t = block y; warp output o < H·L is head o / L's output
/// o % L — x's row (t, head) at its first NOPE values dotted with W's row o (`Body::lane_dot`),
/// stored at y's row (t, head) — and o = H·L + head rotates that head's last R values into
/// y's row past its L (lane p: pair p, as [`emit_latent_cache`]).
#[allow(clippy::too_many_arguments)]
fn emit_query(b: &mut Body, h: usize, nope: usize, r: usize, l: usize, wdtype: DType, theta_bits: u32, interleaved: bool) -> Result<(), String> {
    let t = b.op("gpu.block_id y");
    let t = b.idx64(&t);
    let (o, lane) = b.open_guarded_warp_output(HEAD_MATMUL_WARPS);
    let (ch, cl, cxw, cyw) = (b.ci64(h as i64), b.ci64(l as i64), b.ci64((nope + r) as i64), b.ci64((l + r) as i64));
    let hl = b.ci64((h * l) as i64);
    let th = b.op(&format!("arith.muli {t}, {ch} : i64"));
    let mm = b.op(&format!("arith.cmpi slt, {o}, {hl} : i64"));
    b.line(&format!("scf.if {mm} {{"));
    {
        let hd = b.op(&format!("arith.divui {o}, {cl} : i64"));
        let j = b.op(&format!("arith.remui {o}, {cl} : i64"));
        let row = b.op(&format!("arith.addi {th}, {hd} : i64"));
        let xoff = b.op(&format!("arith.muli {row}, {cxw} : i64"));
        let ck = b.ci64(nope as i64);
        let woff = b.op(&format!("arith.muli {o}, {ck} : i64"));
        let part = b.lane_dot("%w", &woff, wdtype, "%x", &xoff, nope, &lane)?;
        let s = b.warp_sum(&part);
        let c0 = b.ci64(0);
        let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : i64"));
        b.line(&format!("scf.if {l0} {{"));
        let yi = b.op(&format!("arith.muli {row}, {cyw} : i64"));
        let yi = b.op(&format!("arith.addi {yi}, {j} : i64"));
        b.store(&s, "%y", &yi);
        b.line("}");
    }
    b.line("} else {");
    {
        let hd = b.op(&format!("arith.subi {o}, {hl} : i64"));
        let row = b.op(&format!("arith.addi {th}, {hd} : i64"));
        rotate_row_tail(b, &lane, &t, &row, (&cxw, nope), (&cyw, l), r, theta_bits, interleaved);
    }
    b.line("}");
    b.line("}");
    Ok(())
}

/// [`KernelSpec::MlaLatentCache`]: warp `row` takes token t's x row (L + R values): lane l
/// holds x[l + 32 i] of the first L (loads clamped, the lanes past L contributing zero), their
/// squares summed over the warp give 1 / rms; lane p < R/2 rotates pair p of the last R
/// (`Body::rope_cos_sin` at pos[t], YaRN's through `Body::yarn`) as `Body::rope_pair` does, and
/// each normed value is stored as x · (1/rms) · g (the CPU executor's order) into pool row
/// slot[t] — every load (x, g, the pair) ahead of the first store.
fn emit_latent_cache(b: &mut Body, l: usize, r: usize, eps: f32, theta_bits: u32, interleaved: bool, kv: DType) -> Result<(), String> {
    let c = l + r;
    let (lane, base, _, _) = b.open_row(c, 4);
    let lane = b.idx64(&lane);
    let base = b.idx64(&base);
    let cc = b.ci64(c as i64);
    let t = b.op(&format!("arith.divui {base}, {cc} : i64"));
    latent_row(b, &lane, &t, &base, l, r, eps, theta_bits, interleaved, kv)?;
    b.line("}");
    Ok(())
}

/// One warp's part of [`emit_latent_cache`]: token `t`'s row (x from element `base`) normed,
/// rotated and stored into pool row slot[t] (`lane`, `t`, `base` i64).
#[allow(clippy::too_many_arguments)]
fn latent_row(b: &mut Body, lane: &str, t: &str, base: &str, l: usize, r: usize, eps: f32, theta_bits: u32, interleaved: bool, kv: DType) -> Result<(), String> {
    let cc = b.ci64((l + r) as i64);
    let slot = b.load_i32_as_i64("%slots", t);
    let dst = b.op(&format!("arith.muli {slot}, {cc} : i64"));
    let zero = b.cf32(0.0);
    let last = b.ci64(l as i64 - 1);
    let cl = b.ci64(l as i64);
    // (every load before the first store: a store may alias the next load, so a load placed
    // after one waits its own round trip — 16 in a row at L = 512)
    let mut xs = vec![];
    let mut ss = zero.clone();
    for i in 0..l.div_ceil(32) {
        let ci = b.ci64(32 * i as i64);
        let j = b.op(&format!("arith.addi {lane}, {ci} : i64"));
        let inside = b.op(&format!("arith.cmpi slt, {j}, {cl} : i64"));
        let jc = b.op(&format!("arith.minsi {j}, {last} : i64"));
        let at = b.op(&format!("arith.addi {base}, {jc} : i64"));
        let x = b.load("%x", &at);
        let x = b.op(&format!("arith.select {inside}, {x}, {zero} : f32"));
        let g = b.load("%g", &jc);
        ss = b.op(&format!("llvm.intr.fma({x}, {x}, {ss}) : (f32, f32, f32) -> f32"));
        xs.push((j, inside, x, g));
    }
    let ss = b.warp_sum(&ss);
    let inv = b.inv_rms(&ss, l, eps);
    // the rotation pairs of the last R values (their loads ahead of the normed stores too)
    let (co, sn, i0, i1) = open_lane_pair(b, lane, t, r, theta_bits, interleaved);
    let (i0, i1) = (b.op(&format!("arith.addi {i0}, {cl} : i64")), b.op(&format!("arith.addi {i1}, {cl} : i64")));
    let x0 = b.op(&format!("arith.addi {base}, {i0} : i64"));
    let x0 = b.load("%x", &x0);
    let x1 = b.op(&format!("arith.addi {base}, {i1} : i64"));
    let x1 = b.load("%x", &x1);
    let (y0, y1) = b.rotate_pair(&x0, &x1, &co, &sn);
    for (y, i) in [(y0, i0), (y1, i1)] {
        let at = b.op(&format!("arith.addi {dst}, {i} : i64"));
        b.store_kv(&y, "%cache", &at, kv)?;
    }
    b.line("}");
    for (j, inside, x, g) in xs {
        b.line(&format!("scf.if {inside} {{"));
        let y = b.op(&format!("arith.mulf {x}, {inv} : f32"));
        let y = b.op(&format!("arith.mulf {y}, {g} : f32"));
        let at = b.op(&format!("arith.addi {dst}, {j} : i64"));
        b.store_kv(&y, "%cache", &at, kv)?;
        b.line("}");
    }
    Ok(())
}

/// What [`KernelSpec::MlaCacheAttention`] adds to the attention: its token's latent cache row
/// (R, eps, theta, interleaved), written by warp 0 of every head's block before the keys.
type LatentWrite = (usize, f32, u32, bool);

/// [`KernelSpec::MlaAttention`] (see the file header). `%n` = tokens. With `write`
/// ([`KernelSpec::MlaCacheAttention`], one token a sequence), warp 0 of the block first writes
/// its token's latent row into the pool as `MlaLatentCache` does — every head's block writing
/// the same values — and the block's barrier orders that before its warps read the row.
#[allow(clippy::too_many_arguments)]
fn emit_mla_attention(b: &mut Body, h: usize, c: usize, l: usize, bs: usize, scale: f32, kv: DType, write: Option<LatentWrite>) -> Result<(), String> {
    let w = MLA_WARPS;
    // (8-element chunks where both widths allow, else single elements)
    let u = if c % 8 == 0 && l % 8 == 0 { 8 } else { 1 };
    let chunks = c / u;
    let rounds = chunks.div_ceil(32);
    // (rounds holding any value element, for some lane)
    let vrounds = (0..rounds).filter(|r| 32 * r * u < l).count();
    let stride = l + 2;
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", w * stride);
    b.workgroup = Some(format!("%sm : {smt}"));
    let t = b.op("gpu.block_id x");
    let t = b.idx64(&t);
    let head = b.op("gpu.block_id y");
    let head = b.idx64(&head);
    let tid = b.op("gpu.thread_id x");
    let (lane_i, warp_i) = b.lane_warp(&tid);
    let lane = b.idx64(&lane_i);
    if let Some((r, eps, theta_bits, interleaved)) = write {
        // (grid x = T: every block's token is in range)
        let zi = b.op("arith.constant 0 : index");
        let w0 = b.op(&format!("arith.cmpi eq, {warp_i}, {zi} : index"));
        b.line(&format!("scf.if {w0} {{"));
        let cc = b.ci64(c as i64);
        let base = b.op(&format!("arith.muli {t}, {cc} : i64"));
        latent_row(b, &lane, &t, &base, l, r, eps, theta_bits, interleaved, kv)?;
        b.line("}");
        b.line("gpu.barrier");
    }
    let ok = b.op(&format!("arith.cmpi slt, {t}, %n : i64"));
    b.line(&format!("scf.if {ok} {{"));
    let zero = b.cf32(0.0);
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let (ch, cc, cu) = (b.ci64(h as i64), b.ci64(c as i64), b.ci64(u as i64));
    let qrow = b.op(&format!("arith.muli {t}, {ch} : i64"));
    let qrow = b.op(&format!("arith.addi {qrow}, {head} : i64"));
    let qbase = b.op(&format!("arith.muli {qrow}, {cc} : i64"));
    // the lane's chunks: element offsets in a row, whether in range
    let clast = b.ci64(chunks as i64 - 1);
    let mut eoff = vec![];
    for r in 0..rounds {
        let cr = b.ci64(32 * r as i64);
        let ci = b.op(&format!("arith.addi {lane}, {cr} : i64"));
        let valid = (32 * (r + 1) > chunks).then(|| {
            let cn = b.ci64(chunks as i64);
            b.op(&format!("arith.cmpi slt, {ci}, {cn} : i64"))
        });
        let cl = if valid.is_some() { b.op(&format!("arith.minsi {ci}, {clast} : i64")) } else { ci };
        eoff.push((b.op(&format!("arith.muli {cl}, {cu} : i64")), valid));
    }
    // q, scaled into log2 units (0 outside the row)
    let qs = b.cf32(scale * std::f32::consts::LOG2_E);
    let mut q = vec![];
    for (e, valid) in &eoff {
        let at = b.op(&format!("arith.addi {qbase}, {e} : i64"));
        for k in 0..u {
            let ck = b.ci64(k as i64);
            let ak = b.op(&format!("arith.addi {at}, {ck} : i64"));
            let v = b.load("%q", &ak);
            let v = b.op(&format!("arith.mulf {v}, {qs} : f32"));
            q.push(match valid {
                Some(ok) => b.op(&format!("arith.select {ok}, {v}, {zero} : f32")),
                None => v,
            });
        }
    }
    let p = b.load_i32_as_i64("%pos", &t);
    let sq = b.load_i32_as_i64("%seq", &t);
    let c1 = b.ci64(1);
    let ctx = b.op(&format!("arith.addi {p}, {c1} : i64"));
    let ctxi = b.op(&format!("arith.index_cast {ctx} : i64 to index"));
    let trow = b.op(&format!("arith.muli {sq}, %mb : i64"));
    let (cbs, c0) = (b.ci64(bs as i64), b.ci64(0));
    let wstep = b.op(&format!("arith.constant {} : index", w * MLA_KEYS));
    let nacc = vrounds * u;
    let tys = vec!["f32"; 2 + nacc].join(", ");
    let (res, j) = (b.v(), b.v());
    let (m_in, l_in) = (b.v(), b.v());
    let acc_in: Vec<String> = (0..nacc).map(|_| b.v()).collect();
    let mut iter = vec![format!("{m_in} = {ninf}"), format!("{l_in} = {zero}")];
    iter.extend(acc_in.iter().map(|a| format!("{a} = {zero}")));
    // (warp w starts at key w·NK and steps W·NK: its NK keys' rows load together)
    let nk = MLA_KEYS;
    let cnk = b.op(&format!("arith.constant {nk} : index"));
    let jstart = b.op(&format!("arith.muli {warp_i}, {cnk} : index"));
    b.line(&format!("{res}:{} = scf.for {j} = {jstart} to {ctxi} step {wstep} iter_args({}) -> ({tys}) {{", 2 + nacc, iter.join(", ")));
    let j64 = b.idx64(&j);
    let clast = b.op(&format!("arith.subi {ctx}, {c1} : i64"));
    let mut keys: Vec<(Vec<String>, Option<String>)> = vec![];
    for ku in 0..nk {
        let cu_k = b.ci64(ku as i64);
        let ju = b.op(&format!("arith.addi {j64}, {cu_k} : i64"));
        let valid = (ku > 0).then(|| b.op(&format!("arith.cmpi slt, {ju}, {ctx} : i64")));
        let ju = if ku > 0 { b.op(&format!("arith.minsi {ju}, {clast} : i64")) } else { ju };
        // (one latent "head": the row's KV head 0 of 1)
        let kbase = b.paged_key_offset(&ju, &trow, &c0, &cbs, &c1, &cc);
        let mut kvals = vec![];
        for (e, valid) in &eoff {
            let at = b.op(&format!("arith.addi {kbase}, {e} : i64"));
            let vs = b.load_kv("%cache", &at, u, kv)?;
            for v in vs {
                kvals.push(match valid {
                    Some(ok) => b.op(&format!("arith.select {ok}, {v}, {zero} : f32")),
                    None => v,
                });
            }
        }
        keys.push((kvals, valid));
    }
    // the NK scores at once (`Body::warp_sums`), keys past the context at -inf
    let dots: Vec<String> = keys
        .iter()
        .map(|(kvals, _)| {
            let mut dot = zero.clone();
            for (qv, kvv) in q.iter().zip(kvals) {
                dot = b.op(&format!("llvm.intr.fma({qv}, {kvv}, {dot}) : (f32, f32, f32) -> f32"));
            }
            dot
        })
        .collect();
    let lane32 = b.op(&format!("arith.index_cast {lane_i} : index to i32"));
    let sums = b.warp_sums(&dots, &lane32);
    let mut mn = m_in.clone();
    let mut ss = vec![];
    for (sv, (_, valid)) in sums.iter().zip(&keys) {
        let sv = match valid {
            Some(v) => b.op(&format!("arith.select {v}, {sv}, {ninf} : f32")),
            None => sv.clone(),
        };
        mn = b.op(&format!("arith.maximumf {mn}, {sv} : f32"));
        ss.push(sv);
    }
    let d1 = b.op(&format!("arith.subf {m_in}, {mn} : f32"));
    let corr = b.asm1("ex2.approx.ftz.f32", &d1);
    let mut l2 = b.op(&format!("arith.mulf {l_in}, {corr} : f32"));
    let mut outs_acc: Vec<String> = acc_in.iter().map(|a| b.op(&format!("arith.mulf {a}, {corr} : f32"))).collect();
    for (sv, (kvals, _)) in ss.iter().zip(&keys) {
        let d2 = b.op(&format!("arith.subf {sv}, {mn} : f32"));
        let pe = b.asm1("ex2.approx.ftz.f32", &d2);
        l2 = b.op(&format!("arith.addf {l2}, {pe} : f32"));
        for (a, v) in outs_acc.iter_mut().zip(kvals) {
            *a = b.op(&format!("llvm.intr.fma({pe}, {v}, {a}) : (f32, f32, f32) -> f32"));
        }
    }
    let mut outs = vec![mn, l2];
    outs.extend(outs_acc);
    b.line(&format!("scf.yield {} : {tys}", outs.join(", ")));
    b.line("}");
    // the warp's state to shared memory: m, l, then acc at 2 + element
    let cst = b.op(&format!("arith.constant {stride} : index"));
    let wb = b.op(&format!("arith.muli {warp_i}, {cst} : index"));
    let zi = b.op("arith.constant 0 : index");
    let l0 = b.op(&format!("arith.cmpi eq, {lane_i}, {zi} : index"));
    b.line(&format!("scf.if {l0} {{"));
    b.line(&format!("memref.store {res}#0, %sm[{wb}] : {smt}"));
    let c1i = b.op("arith.constant 1 : index");
    let wb1 = b.op(&format!("arith.addi {wb}, {c1i} : index"));
    b.line(&format!("memref.store {res}#1, %sm[{wb1}] : {smt}"));
    b.line("}");
    let cl = b.ci64(l as i64);
    for (r, (e, valid)) in eoff.iter().enumerate().take(vrounds) {
        for k in 0..u {
            let ck = b.ci64(k as i64);
            let ek = b.op(&format!("arith.addi {e}, {ck} : i64"));
            let inv = b.op(&format!("arith.cmpi slt, {ek}, {cl} : i64"));
            let inv = match valid {
                Some(ok) => b.op(&format!("arith.andi {inv}, {ok} : i1")),
                None => inv,
            };
            b.line(&format!("scf.if {inv} {{"));
            let c2 = b.ci64(2);
            let at = b.op(&format!("arith.addi {ek}, {c2} : i64"));
            let at = b.op(&format!("arith.index_cast {at} : i64 to index"));
            let at = b.op(&format!("arith.addi {wb}, {at} : index"));
            b.line(&format!("memref.store {res}#{}, %sm[{at}] : {smt}", 2 + r * u + k));
            b.line("}");
        }
    }
    b.line("gpu.barrier");
    // merge: thread i takes elements i, i + 32 W, ...
    let ms: Vec<String> = (0..w)
        .map(|wi| {
            let at = b.op(&format!("arith.constant {} : index", wi * stride));
            b.op(&format!("memref.load %sm[{at}] : {smt}"))
        })
        .collect();
    let mut mx = ninf.clone();
    for m in &ms {
        mx = b.op(&format!("arith.maximumf {mx}, {m} : f32"));
    }
    let mut den = zero.clone();
    let mut facs = vec![];
    for (wi, m) in ms.iter().enumerate() {
        let d = b.op(&format!("arith.subf {m}, {mx} : f32"));
        let f = b.asm1("ex2.approx.ftz.f32", &d);
        let at = b.op(&format!("arith.constant {} : index", wi * stride + 1));
        let lw = b.op(&format!("memref.load %sm[{at}] : {smt}"));
        den = b.op(&format!("llvm.intr.fma({lw}, {f}, {den}) : (f32, f32, f32) -> f32"));
        facs.push(f);
    }
    let one = b.cf32(1.0);
    let inv = b.op(&format!("arith.divf {one}, {den} : f32"));
    let cl = b.op(&format!("arith.constant {l} : index"));
    let nt = b.op(&format!("arith.constant {} : index", 32 * w));
    let cl64 = b.ci64(l as i64);
    let ybase = b.op(&format!("arith.muli {qrow}, {cl64} : i64"));
    let e = b.v();
    b.line(&format!("scf.for {e} = {tid} to {cl} step {nt} {{"));
    let mut num = zero.clone();
    for (wi, f) in facs.iter().enumerate() {
        let at = b.op(&format!("arith.constant {} : index", wi * stride + 2));
        let at = b.op(&format!("arith.addi {at}, {e} : index"));
        let a = b.op(&format!("memref.load %sm[{at}] : {smt}"));
        num = b.op(&format!("llvm.intr.fma({a}, {f}, {num}) : (f32, f32, f32) -> f32"));
    }
    let y = b.op(&format!("arith.mulf {num}, {inv} : f32"));
    let e64 = b.idx64(&e);
    let yi = b.op(&format!("arith.addi {ybase}, {e64} : i64"));
    b.store(&y, "%y", &yi);
    b.line("}");
    b.line("}");
    Ok(())
}

/// Warps per block of the per-head tensor-core matmul (each its own 32-token passes).
pub const HEAD_MMA_WARPS: usize = 4;

/// [`KernelSpec::HeadMatMulMma`] (and the absorbed part of [`KernelSpec::MlaQueryMma`]): block
/// (16 rows of head `by`'s W [N, K], head by); warp w takes the tokens in 32-token passes w, w
/// + W, ... as the B tiles of the `mma.sync` GEMV ([`MmaTiles`], x in f32: row (t, head) of
/// x, `xs` values apart, its first K) over all of K, and stores its D fragments at y's row (t,
/// head), `ys` apart, its first N. With `rope` = (R, theta, interleaved) the block column past
/// N's tiles rotates each head's last R values of x into y past N (a warp per token, lane p
/// pair p, as `emit_query`). `%n` = N, `%m` = T.
#[allow(clippy::too_many_arguments)]
fn emit_head_mma(b: &mut Body, h: usize, k: usize, n: usize, xs: usize, ys: usize, wdtype: DType, rope: Option<(usize, u32, bool)>) -> Result<(), String> {
    let f16 = wdtype == DType::F16;
    let nw = HEAD_MMA_WARPS;
    let nt = GEMV_MMA_ROWS / 8;
    let steps = k / 32;
    let unroll = 4.min(steps);
    let (jloop, rounds) = split_k_schedule(steps, 1, 1, unroll);
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (bx64, hd, lane64, warp64) = (b.idx64(&bx), b.idx64(&by), b.idx64(&lane), b.idx64(&warp));
    let tiles_n = n.div_ceil(16);
    // (constants both branches use, defined ahead of them)
    let ch = b.ci64(h as i64);
    let (cxs, cys, cn) = (b.ci64(xs as i64), b.ci64(ys as i64), b.ci64(n as i64));
    if rope.is_some() {
        let ct = b.ci64(tiles_n as i64);
        let mm = b.op(&format!("arith.cmpi slt, {bx64}, {ct} : i64"));
        b.line(&format!("scf.if {mm} {{"));
    }
    let (c1, c2, c4, c8, c16) = (b.ci64(1), b.ci64(2), b.ci64(4), b.ci64(8), b.ci64(16));
    let g = b.op(&format!("arith.divui {lane64}, {c4} : i64"));
    let tq = b.op(&format!("arith.remui {lane64}, {c4} : i64"));
    let col0 = b.op(&format!("arith.muli {bx64}, {c16} : i64"));
    let nlast = b.ci64(n as i64 - 1);
    let mlast = b.op(&format!("arith.subi %m, {c1} : i64"));
    let e0 = b.op(&format!("arith.muli {tq}, {c8} : i64"));
    let hrow = b.op(&format!("arith.muli {hd}, {cn} : i64"));
    let (r0, r8) = MmaTiles::row_offsets(b, &hrow, &col0, &g, &nlast, &e0, k, 0);
    // the warp's passes: tokens p0.. p0 + 31
    let c32 = b.ci64(32);
    let p0w = b.op(&format!("arith.muli {warp64}, {c32} : i64"));
    let p0w = b.op(&format!("arith.index_cast {p0w} : i64 to index"));
    let m_i = b.op("arith.index_cast %m : i64 to index");
    let stp = b.op(&format!("arith.constant {} : index", 32 * nw));
    let p0 = b.v();
    b.line(&format!("scf.for {p0} = {p0w} to {m_i} step {stp} {{"));
    let p064 = b.idx64(&p0);
    let (mut xoff, mut live) = (vec![], vec![]);
    for j in 0..nt {
        let cj = b.ci64(8 * j as i64);
        let r0j = b.op(&format!("arith.addi {p064}, {cj} : i64"));
        live.push(b.op(&format!("arith.cmpi slt, {r0j}, %m : i64")));
        let t = b.op(&format!("arith.addi {r0j}, {g} : i64"));
        let t = b.op(&format!("arith.minsi {t}, {mlast} : i64"));
        let row = b.op(&format!("arith.muli {t}, {ch} : i64"));
        let row = b.op(&format!("arith.addi {row}, {hd} : i64"));
        let o = b.op(&format!("arith.muli {row}, {cxs} : i64"));
        let o = b.op(&format!("arith.addi {o}, {e0} : i64"));
        xoff.push(b.op(&format!("arith.muli {o}, {c4} : i64")));
    }
    let tiles = MmaTiles { w: vec![("%w".to_string(), r0, r8)], x: xoff, live: live.clone(), x16: false, f16, split: true, packed: None };
    let c0 = b.ci64(0);
    let acc = b.split_k_rounds(4 * nt, jloop, rounds, unroll, &c0, 1, steps as i64, &|b: &mut Body, ss: &[String], acc: &[String]| tiles.steps(b, ss, acc, None));
    // D fragment value i of tile j: W row col0 + g (+ 8 for i >= 2), token p0 + 8j + 2 tq + i % 2
    let t2 = b.op(&format!("arith.muli {tq}, {c2} : i64"));
    for j in 0..nt {
        b.line(&format!("scf.if {} {{", live[j]));
        for i in 0..4 {
            let cr = b.ci64((8 * j + i % 2) as i64);
            let tt = b.op(&format!("arith.addi {p064}, {t2} : i64"));
            let tt = b.op(&format!("arith.addi {tt}, {cr} : i64"));
            let cc = b.ci64(if i >= 2 { 8 } else { 0 });
            let col = b.op(&format!("arith.addi {col0}, {g} : i64"));
            let col = b.op(&format!("arith.addi {col}, {cc} : i64"));
            let okr = b.op(&format!("arith.cmpi slt, {tt}, %m : i64"));
            let okc = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
            let ok = b.op(&format!("arith.andi {okr}, {okc} : i1"));
            b.line(&format!("scf.if {ok} {{"));
            let row = b.op(&format!("arith.muli {tt}, {ch} : i64"));
            let row = b.op(&format!("arith.addi {row}, {hd} : i64"));
            let yi = b.op(&format!("arith.muli {row}, {cys} : i64"));
            let yi = b.op(&format!("arith.addi {yi}, {col} : i64"));
            b.store(&acc[4 * j + i], "%y", &yi);
            b.line("}");
        }
        b.line("}");
    }
    b.line("}");
    if let Some((r, theta_bits, interleaved)) = rope {
        b.line("} else {");
        // the rotation block: warp w takes tokens w, w + W, ...
        let w_i = b.op(&format!("arith.index_cast {warp64} : i64 to index"));
        let m_i = b.op("arith.index_cast %m : i64 to index");
        let stp = b.op(&format!("arith.constant {nw} : index"));
        let tv = b.v();
        b.line(&format!("scf.for {tv} = {w_i} to {m_i} step {stp} {{"));
        let t = b.idx64(&tv);
        let row = b.op(&format!("arith.muli {t}, {ch} : i64"));
        let row = b.op(&format!("arith.addi {row}, {hd} : i64"));
        rotate_row_tail(b, &lane64, &t, &row, (&cxs, k), (&cys, n), r, theta_bits, interleaved);
        b.line("}");
        b.line("}");
    }
    Ok(())
}

/// [`KernelSpec::HeadMatMul`]: x [T, H, K] f32, W [H, N, K], y [T, H, N]; `%n` = H · N.
fn emit_head_matmul(b: &mut Body, h: usize, k: usize, n: usize, wdtype: DType) -> Result<(), String> {
    let t = b.op("gpu.block_id y");
    let t = b.idx64(&t);
    let (o, lane) = b.open_guarded_warp_output(HEAD_MATMUL_WARPS);
    let (ch, cn, ck) = (b.ci64(h as i64), b.ci64(n as i64), b.ci64(k as i64));
    // output o = head · N + j: x's row t · H + head, W's row (head, j) = o
    let hd = b.op(&format!("arith.divui {o}, {cn} : i64"));
    let th = b.op(&format!("arith.muli {t}, %n : i64"));
    let xrow = b.op(&format!("arith.muli {t}, {ch} : i64"));
    let xrow = b.op(&format!("arith.addi {xrow}, {hd} : i64"));
    let xoff = b.op(&format!("arith.muli {xrow}, {ck} : i64"));
    let woff = b.op(&format!("arith.muli {o}, {ck} : i64"));
    let part = b.lane_dot("%w", &woff, wdtype, "%x", &xoff, k, &lane)?;
    let s = b.warp_sum(&part);
    let c0 = b.ci64(0);
    let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : i64"));
    b.line(&format!("scf.if {l0} {{"));
    let yi = b.op(&format!("arith.addi {th}, {o} : i64"));
    b.store(&s, "%y", &yi);
    b.line("}");
    b.line("}");
    Ok(())
}

/// The lowering of `head_matmul` (x [T, H, K], W [H, N, K] with transpose_b): a warp per
/// output, grid y = tokens.
pub(crate) fn lower_head_matmul(cx: &NodeCx, args: Vec<String>, transpose_b: bool) -> Result<Step, CodegenError> {
    if !transpose_b {
        return Err(cx.err("head_matmul needs W in [H, N, K] layout (transpose_b = true) on the GPU"));
    }
    if !matches!(cx.ops[1].op, dsc_ir::Op::Weight) {
        return Err(cx.err("head_matmul's W must be a graph weight on the GPU"));
    }
    let c = |i: usize, j: usize| cx.ops[i].ty.shape[j].as_const();
    let (Some(h), Some(k), Some(n)) = (c(0, 1), c(0, 2), c(1, 1)) else {
        return Err(cx.err("head_matmul needs constant heads and widths"));
    };
    let wdtype = cx.ops[1].ty.dtype;
    let spec = KernelSpec::HeadMatMul { h, k, n, wdtype };
    mla_fits(&spec).map_err(|m| cx.err(m))?;
    let outs = Scalar::Const((h * n) as i64);
    let tokens = Scalar::Dim(cx.name.to_string(), 0);
    let mut step = cx.step(spec, args, vec![outs.clone()], outs, tokens.clone());
    // (batches: each head's W read once per 32 tokens, on the tensor cores)
    let mma = KernelSpec::HeadMatMulMma { h, k, n, wdtype };
    if mla_fits(&mma).is_ok() {
        step.few = vec![head_mma_large(mma, n, h, tokens)];
    }
    Ok(step)
}

/// Fewest tokens from which the per-head matmuls (and the fused query) run on the tensor
/// cores ([`KernelSpec::HeadMatMulMma`], [`KernelSpec::MlaQueryMma`]).
pub const HEAD_MMA_MIN_ROWS: i64 = 8;

/// The batched alternative `kernel` of a per-head step: `work` outputs of 16-row tiles a head
/// (N, + 16 for the fused query's rotation column), grid y = H; scalars N and T.
pub(crate) fn head_mma_large(kernel: KernelSpec, n: usize, h: usize, tokens: Scalar) -> crate::schedule::Large {
    let work = if matches!(kernel, KernelSpec::MlaQueryMma { .. }) { n.div_ceil(16) * 16 + 16 } else { n };
    crate::schedule::Large {
        min_rows: HEAD_MMA_MIN_ROWS,
        max_rows: None,
        args: None,
        kernel,
        scalars: vec![Scalar::Const(n as i64), tokens],
        work: Scalar::Const(work as i64),
        grid_y: Scalar::Const(h as i64),
    }
}

/// The lowering of `mla_attention` (q [T, H, C], latent cache [NB, BS, 1, C], pos, seq, block
/// table): a block per (token, head).
pub(crate) fn lower_mla_attention(cx: &NodeCx, args: Vec<String>, scale: f32, l: usize) -> Result<Step, CodegenError> {
    let c = |i: usize, j: usize| cx.ops[i].ty.shape[j].as_const();
    let (Some(h), Some(cw), Some(bs)) = (c(0, 1), c(0, 2), c(1, 1)) else {
        return Err(cx.err("the latent attention needs constant heads, width and block size"));
    };
    let kv = crate::schedule::gpu_kv(cx.name, cx.ops[1].ty.dtype)?;
    let spec = KernelSpec::MlaAttention { h, c: cw, l, bs, scale_bits: scale.to_bits(), kv };
    mla_fits(&spec).map_err(|m| cx.err(m))?;
    let tokens = Scalar::Dim(cx.name.to_string(), 0);
    let mb = Scalar::Dim(cx.names[4].clone(), 1);
    Ok(cx.step(spec, args, vec![tokens.clone(), mb], tokens, Scalar::Const(h as i64)))
}
