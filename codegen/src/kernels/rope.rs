//! RoPE and the KV-cache writes: rotating q/k (half or interleaved pairs; YaRN's frequencies
//! with `RopeYarn`, DeepSeek's rope), writing K/V rows
//! into the paged pools (f32 or bf16), the fused q/k/v RoPE + cache write beside a merged
//! q/k/v matmul (`QkvRopeCache`) and its split-K variant summing the partial slices on the way
//! (`QkvRopeSplitK`). The one-token RoPE inside the decode attention is the attention's
//! (`attention/qkv.rs`).

use crate::kernels::*;

/// The readable symbol of a `rope` kernel (`KernelSpec::symbol`).
pub(crate) fn rope_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::Rope { h, d, theta_bits, interleaved } => {
            format!("rope_h{h}_d{d}_theta{}_{}", f32::from_bits(*theta_bits) as u64, if *interleaved { "interleaved" } else { "half" })
        }
        KernelSpec::CacheWrite { row, kv } => format!("cache_write_row{row}{}", kv_suffix(*kv)),
        KernelSpec::QkvRopeCache { h, kvh, d, theta_bits, interleaved, kv } => {
            format!("qkv_rope_cache_h{h}_kv{kvh}_d{d}_theta{}_{}{}", f32::from_bits(*theta_bits) as u64, if *interleaved { "interleaved" } else { "half" }, kv_suffix(*kv))
        }
        KernelSpec::RopeCacheWrite { h, d, theta_bits, interleaved, kv } => {
            format!("rope_cache_write_h{h}_d{d}_theta{}_{}{}", f32::from_bits(*theta_bits) as u64, if *interleaved { "interleaved" } else { "half" }, kv_suffix(*kv))
        }
        KernelSpec::QkvRopeSplitK { inner, splits } => format!("{}_splitk{splits}", inner.symbol()),
        KernelSpec::RopeYarn { h, d, theta_bits, interleaved, factor_bits, low_bits, high_bits, mscale_bits } => format!(
            "rope_yarn_h{h}_d{d}_theta{}_{}_f{factor_bits:08x}_r{low_bits:08x}_{high_bits:08x}_m{mscale_bits:08x}",
            f32::from_bits(*theta_bits) as u64,
            if *interleaved { "interleaved" } else { "half" }
        ),
        other => unreachable!("{other:?} is not a rope kernel (kernels::family)"),
    }
}

/// The `RopeYarn` kernel of `rope_yarn(theta, yarn)` over x[T, h, d] (every dim rotating): YaRN's
/// ramp (`dsc_ir::Yarn::ramp`) and attention factor as the spec's constants.
pub fn rope_yarn_spec(h: usize, d: usize, theta: f32, interleaved: bool, yarn: &dsc_ir::Yarn) -> KernelSpec {
    let (low, high) = yarn.ramp(theta, d);
    KernelSpec::RopeYarn {
        h,
        d,
        theta_bits: theta.to_bits(),
        interleaved,
        factor_bits: yarn.factor.to_bits(),
        low_bits: low.to_bits(),
        high_bits: high.to_bits(),
        mscale_bits: yarn.attention_factor.to_bits(),
    }
}

/// How the runtime launches a `rope` kernel (`KernelSpec::launch`).
pub(crate) fn rope_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::Rope { .. } | KernelSpec::RopeYarn { .. } | KernelSpec::RopeCacheWrite { .. } | KernelSpec::CacheWrite { .. } | KernelSpec::QkvRopeCache { .. } => {
            Launch::PerElement { threads: 256 }
        }
        KernelSpec::QkvRopeSplitK { inner, .. } => inner.launch(),
        other => unreachable!("{other:?} is not a rope kernel (kernels::family)"),
    }
}

/// Whether a RoPE or KV-cache write kernel generates ([`fits`]): pools of f32 or bf16, an
/// even head dim for the fused q/k/v kernel, whose split-K form sums 2+ slices.
pub(crate) fn rope_fits(spec: &KernelSpec, o: Outer) -> Result<(), String> {
    match spec {
        KernelSpec::QkvRopeSplitK { inner, splits } => {
            if !matches!(inner.as_ref(), KernelSpec::QkvRopeCache { .. }) || *splits < 2 {
                return Err(format!("the split-K Q/K/V sums fold into QkvRopeCache over 2+ slices, not {} over {splits}", inner.symbol()));
            }
            fits_in(inner, o)
        }
        KernelSpec::QkvRopeCache { d, kv, .. } => {
            if d % 2 != 0 {
                return Err(format!("rope needs an even head dim, got {d}"));
            }
            kv_fits(*kv)
        }
        KernelSpec::RopeCacheWrite { kv, .. } | KernelSpec::CacheWrite { kv, .. } => kv_fits(*kv),
        _ => Ok(()),
    }
}

/// The RoPE and KV-cache write kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn rope_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    rope_fits(spec, b.outer())?;
    Ok(match spec {
        KernelSpec::RopeYarn { h, d, theta_bits, interleaved, factor_bits, low_bits, high_bits, mscale_bits } => {
            b.yarn = Some([*factor_bits, *low_bits, *high_bits, *mscale_bits].map(f32::from_bits));
            let params = rope_kernel(b, &KernelSpec::Rope { h: *h, d: *d, theta_bits: *theta_bits, interleaved: *interleaved })?;
            b.yarn = None;
            params
        }
        KernelSpec::QkvRopeSplitK { inner, splits } => {
            for (x, o) in [("%xq", "%oq"), ("%xk", "%ok"), ("%xv", "%ov")] {
                b.line(&format!("{x} = llvm.getelementptr %parts[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
            }
            b.sum_slices = Some(*splits);
            let params = emit_into(b, inner)?;
            b.sum_slices = None;
            params.replacen("%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>", "%parts: !llvm.ptr<1>", 1).replacen("%nk: i64", "%nk: i64, %slice: i64, %oq: i64, %ok: i64, %ov: i64", 1)
        }
        KernelSpec::Rope { h, d, theta_bits, interleaved } | KernelSpec::RopeCacheWrite { h, d, theta_bits, interleaved, .. } => {
            let to_cache = match spec {
                KernelSpec::RopeCacheWrite { kv, .. } => Some(*kv),
                _ => None,
            };
            let i = b.open_guarded_gid();
            let (t, i0, i1, y0, y1) = b.rope_pair(&i, "%x", *h, *d, *theta_bits, *interleaved);
            if let Some(kv) = to_cache {
                // token t's row of h*d values goes to the pool row slot[t]
                let row = b.ci64((h * d) as i64);
                let slot = b.load_i32_as_i64("%slots", &t);
                let tb = b.op(&format!("arith.muli {t}, {row} : i64"));
                let sb = b.op(&format!("arith.muli {slot}, {row} : i64"));
                for (y, i) in [(&y0, &i0), (&y1, &i1)] {
                    let o = b.op(&format!("arith.subi {i}, {tb} : i64"));
                    let dst = b.op(&format!("arith.addi {sb}, {o} : i64"));
                    b.store_kv(y, "%cache", &dst, kv)?;
                }
                b.line("}");
                "%x: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %cache: !llvm.ptr<1>, %n: i64".into()
            } else {
                b.store(&y0, "%y", &i0);
                b.store(&y1, "%y", &i1);
                b.line("}");
                "%x: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
            }
        }
        KernelSpec::QkvRopeCache { h, kvh, d, theta_bits, interleaved, kv } => {
            let i = b.open_guarded_gid();
            let isq = b.op(&format!("arith.cmpi slt, {i}, %nq : i64"));
            b.line(&format!("scf.if {isq} {{"));
            let (_, i0, i1, y0, y1) = b.rope_pair(&i, "%xq", *h, *d, *theta_bits, *interleaved);
            b.store(&y0, "%y", &i0);
            b.store(&y1, "%y", &i1);
            b.line("} else {");
            let j = b.op(&format!("arith.subi {i}, %nq : i64"));
            let isk = b.op(&format!("arith.cmpi slt, {j}, %nk : i64"));
            b.line(&format!("scf.if {isk} {{"));
            let (t, i0, i1, y0, y1) = b.rope_pair(&j, "%xk", *kvh, *d, *theta_bits, *interleaved);
            b.store_to_slot(&y0, &i0, &t, kvh * d, "%kc", *kv)?;
            b.store_to_slot(&y1, &i1, &t, kvh * d, "%kc", *kv)?;
            b.line("} else {");
            // v: two consecutive elements per item
            let v = b.op(&format!("arith.subi {j}, %nk : i64"));
            let c2 = b.ci64(2);
            let e0 = b.op(&format!("arith.muli {v}, {c2} : i64"));
            let row = b.ci64((kvh * d) as i64);
            let t = b.op(&format!("arith.divui {e0}, {row} : i64"));
            let c1 = b.ci64(1);
            let e1 = b.op(&format!("arith.addi {e0}, {c1} : i64"));
            for e in [e0, e1] {
                let x = b.load_summed("%xv", &e);
                b.store_to_slot(&x, &e, &t, kvh * d, "%vc", *kv)?;
            }
            b.line("}");
            b.line("}");
            b.line("}");
            "%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %nq: i64, %nk: i64"
                .into()
        }
        KernelSpec::CacheWrite { row, kv } => {
            let i = b.open_guarded_gid();
            let r = b.ci64(*row as i64);
            let t = b.op(&format!("arith.divui {i}, {r} : i64"));
            let j = b.op(&format!("arith.remui {i}, {r} : i64"));
            let slot = b.load_i32_as_i64("%slots", &t);
            let sb = b.op(&format!("arith.muli {slot}, {r} : i64"));
            let dst = b.op(&format!("arith.addi {sb}, {j} : i64"));
            let x = b.load("%x", &i);
            b.store_kv(&x, "%cache", &dst, *kv)?;
            b.line("}");
            "%x: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %cache: !llvm.ptr<1>, %n: i64".into()
        }
        other => return Err(format!("`{}` is not one of the RoPE and KV-cache write kernels", other.symbol())),
    })
}
