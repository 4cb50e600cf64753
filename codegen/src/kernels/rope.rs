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

/// The RoPE arithmetic the rope, MLA and attention families share: (cos, sin) of a pair (with
/// YaRN's frequencies through `Body::yarn`), a rotated element or pair of a row in global or
/// shared memory.
impl Body {
    /// (cos, sin) of RoPE rotation pair `pair` (i64) at position `p` (i64) for head dim `d`
    pub(crate) fn rope_cos_sin(&mut self, pair: &str, p: &str, d: usize, theta_bits: u32) -> (String, String) {
        let b = self;
        let pf = b.op(&format!("arith.sitofp {p} : i64 to f32"));
        let pairf = b.op(&format!("arith.uitofp {pair} : i64 to f32"));
        // inv_freq = theta^(-2 pair / d) = exp2(-(2 pair / d) log2 theta)
        let k = b.cf32(-2.0 * f32::from_bits(theta_bits).log2() / d as f32);
        let ex = b.op(&format!("arith.mulf {pairf}, {k} : f32"));
        let inv = b.asm1("ex2.approx.ftz.f32", &ex);
        // (YaRN: the interpolated frequency inv / factor blended in by the ramp over pairs
        // low..high, as `dsc_ir::Yarn::inv_freq`)
        let inv = match b.yarn {
            Some([factor, low, high, _]) => {
                let cf = b.cf32(factor);
                let inter = b.op(&format!("arith.divf {inv}, {cf} : f32"));
                let cl = b.cf32(low);
                let cw = b.cf32(high - low);
                let r = b.op(&format!("arith.subf {pairf}, {cl} : f32"));
                let r = b.op(&format!("arith.divf {r}, {cw} : f32"));
                let (z, one) = (b.cf32(0.0), b.cf32(1.0));
                let r = b.op(&format!("arith.maximumf {r}, {z} : f32"));
                let ramp = b.op(&format!("arith.minimumf {r}, {one} : f32"));
                let extra_w = b.op(&format!("arith.subf {one}, {ramp} : f32"));
                let keep = b.op(&format!("arith.subf {one}, {extra_w} : f32"));
                let a = b.op(&format!("arith.mulf {inter}, {keep} : f32"));
                b.op(&format!("llvm.intr.fma({inv}, {extra_w}, {a}) : (f32, f32, f32) -> f32"))
            }
            None => inv,
        };
        let ang = b.op(&format!("arith.mulf {pf}, {inv} : f32"));
        // range-reduce to [-pi, pi] for the approx sin/cos
        let r2pi = b.cf32(1.0 / (2.0 * std::f32::consts::PI));
        let q = b.op(&format!("arith.mulf {ang}, {r2pi} : f32"));
        let qr = b.asm1("cvt.rni.f32.f32", &q);
        let m2pi = b.cf32(-2.0 * std::f32::consts::PI);
        let red = b.op(&format!("llvm.intr.fma({qr}, {m2pi}, {ang}) : (f32, f32, f32) -> f32"));
        let c = b.asm1("cos.approx.ftz.f32", &red);
        let sn = b.asm1("sin.approx.ftz.f32", &red);
        match b.yarn {
            Some([.., mscale]) => {
                let ms = b.cf32(mscale);
                (b.op(&format!("arith.mulf {c}, {ms} : f32")), b.op(&format!("arith.mulf {sn}, {ms} : f32")))
            }
            None => (c, sn),
        }
    }
    /// Element `e` (i64, 0..d) of a head's row at element `base` of `ptr`, rotated by RoPE at
    /// position `p`: its pair and partner element by the style (half: e and e ± d/2;
    /// interleaved: e and e ^ 1), y = x c - x' s for the pair's first element, x c + x' s for
    /// its second (as [`Body::rope_pair`] computes them).
    pub(crate) fn rope_elem(&mut self, ptr: &str, base: &str, e: &str, p: &str, d: usize, theta_bits: u32, interleaved: bool) -> String {
        self.rope_elem_src(&Src::Global(ptr), base, e, p, d, theta_bits, interleaved)
    }
    /// f32 element `i` (i64) of `src`
    pub(crate) fn load_src(&mut self, src: &Src, i: &str) -> String {
        match src {
            Src::Global(ptr) => self.load(ptr, i),
            Src::Shared(smt, at) => {
                let ca = self.ci64(*at as i64);
                let j = self.op(&format!("arith.addi {ca}, {i} : i64"));
                let j = self.op(&format!("arith.index_cast {j} : i64 to index"));
                self.op(&format!("memref.load %sm[{j}] : {smt}"))
            }
        }
    }
    /// [`Body::rope_elem`] of a row in global memory or in shared memory
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_elem_src(&mut self, src: &Src, base: &str, e: &str, p: &str, d: usize, theta_bits: u32, interleaved: bool) -> String {
        let b = self;
        let (pair, partner, second) = if interleaved {
            let c1 = b.ci64(1);
            let pair = b.op(&format!("arith.shrui {e}, {c1} : i64"));
            let partner = b.op(&format!("arith.xori {e}, {c1} : i64"));
            let odd = b.op(&format!("arith.andi {e}, {c1} : i64"));
            let c0 = b.ci64(0);
            (pair, partner, b.op(&format!("arith.cmpi ne, {odd}, {c0} : i64")))
        } else {
            let ch = b.ci64((d / 2) as i64);
            let second = b.op(&format!("arith.cmpi sge, {e}, {ch} : i64"));
            let pair = b.op(&format!("arith.remui {e}, {ch} : i64"));
            let up = b.op(&format!("arith.addi {e}, {ch} : i64"));
            let down = b.op(&format!("arith.subi {e}, {ch} : i64"));
            (pair, b.op(&format!("arith.select {second}, {down}, {up} : i64")), second)
        };
        let (c, sn) = b.rope_cos_sin(&pair, p, d, theta_bits);
        let i = b.op(&format!("arith.addi {base}, {e} : i64"));
        let ip = b.op(&format!("arith.addi {base}, {partner} : i64"));
        let x = b.load_src(src, &i);
        let xp = b.load_src(src, &ip);
        let xps = b.op(&format!("arith.mulf {xp}, {sn} : f32"));
        let nxps = b.op(&format!("arith.negf {xps} : f32"));
        let t = b.op(&format!("arith.select {second}, {xps}, {nxps} : f32"));
        b.op(&format!("llvm.intr.fma({x}, {c}, {t}) : (f32, f32, f32) -> f32"))
    }
    /// RoPE of rotation pair `i` (i64) of x[T, h, d] at `ptr` (positions in `%pos`): returns
    /// (token, element index of the pair's two values, their rotated values)
    pub(crate) fn rope_pair(&mut self, i: &str, ptr: &str, h: usize, d: usize, theta_bits: u32, interleaved: bool) -> (String, String, String, String, String) {
        let b = self;
        let half = d / 2;
        let ch = b.ci64(half as i64);
        let pair = b.op(&format!("arith.remui {i}, {ch} : i64"));
        let th = b.op(&format!("arith.divui {i}, {ch} : i64"));
        let hh = b.ci64(h as i64);
        let t = b.op(&format!("arith.divui {th}, {hh} : i64"));
        let p = b.load_i32_as_i64("%pos", &t);
        let (c, sn) = b.rope_cos_sin(&pair, &p, d, theta_bits);
        let dd = b.ci64(d as i64);
        let base = b.op(&format!("arith.muli {th}, {dd} : i64"));
        let (i0, i1) = if interleaved {
            let c2 = b.ci64(2);
            let p2 = b.op(&format!("arith.muli {pair}, {c2} : i64"));
            let a0 = b.op(&format!("arith.addi {base}, {p2} : i64"));
            let c1 = b.ci64(1);
            let a1 = b.op(&format!("arith.addi {a0}, {c1} : i64"));
            (a0, a1)
        } else {
            let a0 = b.op(&format!("arith.addi {base}, {pair} : i64"));
            let a1 = b.op(&format!("arith.addi {a0}, {ch} : i64"));
            (a0, a1)
        };
        let x0 = b.load_summed(ptr, &i0);
        let x1 = b.load_summed(ptr, &i1);
        let (y0, y1) = b.rotate_pair(&x0, &x1, &c, &sn);
        (t, i0, i1, y0, y1)
    }
    /// A RoPE pair (x0, x1) rotated by (cos, sin): y0 = x0 c - x1 s, y1 = x1 c + x0 s.
    pub(crate) fn rotate_pair(&mut self, x0: &str, x1: &str, c: &str, sn: &str) -> (String, String) {
        let x1s = self.op(&format!("arith.mulf {x1}, {sn} : f32"));
        let nx1s = self.op(&format!("arith.negf {x1s} : f32"));
        let y0 = self.op(&format!("llvm.intr.fma({x0}, {c}, {nx1s}) : (f32, f32, f32) -> f32"));
        let x0s = self.op(&format!("arith.mulf {x0}, {sn} : f32"));
        let y1 = self.op(&format!("llvm.intr.fma({x1}, {c}, {x0s}) : (f32, f32, f32) -> f32"));
        (y0, y1)
    }
}
