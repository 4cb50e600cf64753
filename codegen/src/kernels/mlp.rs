//! The fused one-token MLP (`SwiGluDown`): RMSNorm, gate/up GEMV, SwiGLU and the down
//! projection with its residual in one kernel — each block takes `fb` features, a warp per
//! `fpw` of them, and adds its share of the down projection into y with reductions, so one-token
//! steps launch one kernel per MLP instead of four (SmolLM2 shape b1 2,808 -> 3,298 tok/s).
//! Where it does not fit (`swiglu_down_fits`), the schedule keeps the separate kernels.

use crate::kernels::*;

/// The readable symbol of a `mlp` kernel (`KernelSpec::symbol`).
pub(crate) fn mlp_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::SwiGluDown { k, f, n, eps_bits, fb, fpw, wdtype } => {
            let q = if *wdtype == DType::BF16 { String::new() } else { format!("_{}", wdtype.name()) };
            format!("rms_swiglu_down_k{k}_f{f}_n{n}_e{eps_bits:08x}_fb{fb}{}{q}", if *fpw == 2 { String::new() } else { format!("_fpw{fpw}") })
        }
        other => unreachable!("{other:?} is not a mlp kernel (kernels::family)"),
    }
}

/// How the runtime launches a `mlp` kernel (`KernelSpec::launch`).
pub(crate) fn mlp_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::SwiGluDown { fb, fpw, .. } => Launch::OutputsPerBlock { outputs: *fb as u32, rows: 1, warps: (*fb / (*fpw).max(1)) as u32 },
        other => unreachable!("{other:?} is not a mlp kernel (kernels::family)"),
    }
}

/// Whether the fused one-token MLP kernel (`KernelSpec::SwiGluDown`) takes a [K] x, F
/// features and N outputs in blocks of `fb` features: whole 16-byte pieces of every row
/// (K and fb multiples of 8), a feature per warp at least, a thread per 4 outputs, and at most
/// 64 registers of preloaded gate/up weights per thread; Q4_1 weights: whole blocks (K and F
/// multiples of 32) and whole halves of W_down's blocks per feature block (fb a multiple of 16).
pub fn swiglu_down_fits(k: usize, f: usize, n: usize, fb: usize, fpw: usize, wdtype: DType) -> Result<(), String> {
    if fpw == 0 || k == 0 || k % 8 != 0 || fb == 0 || fb % 8 != 0 || fb % fpw != 0 || fb / fpw > 32 || f % fb != 0 {
        return Err(format!("the fused MLP needs K and the features per block multiples of 8 (at most 64), and F a multiple of them (K {k}, F {f}, {fb} per block)"));
    }
    match wdtype {
        DType::BF16 => {}
        DType::Q4_1 if k % 32 == 0 && f % 32 == 0 && fb % 16 == 0 => {}
        DType::Q4_1 => return Err(format!("the fused MLP on Q4_1 needs K and F multiples of 32 and 16 features per block at least (K {k}, F {f}, {fb} per block)")),
        other => return Err(format!("the fused MLP takes bf16 or Q4_1 weights, not {}", other.name())),
    }
    let threads = 32 * fb / fpw;
    if n == 0 || n % 4 != 0 || n / 4 > threads {
        return Err(format!("the fused MLP needs N a multiple of 4 and at most 4 per thread ({threads} threads; N {n})"));
    }
    if 2 * fpw * (k / 8).div_ceil(32) * 4 > 64 {
        return Err(format!("the fused MLP's gate/up weights would take more than 64 registers a thread (K {k})"));
    }
    Ok(())
}

/// [`KernelSpec::SwiGluDown`]: see there. Thread t of warp w: the lane's 16-byte pieces
/// l, l + 32, .. of K (clamped, x zeroed past K) of its warp's gate and up rows, then
/// (t < N/4) W_down's rows t + i·N/4 at the block's features; every weight and g loaded before
/// `griddepcontrol.wait`, x after it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_swiglu_down(b: &mut Body, k: usize, f: usize, n: usize, eps: f32, fb: usize, fpw: usize, wdtype: DType) -> Result<(), String> {
    let q4 = wdtype == DType::Q4_1;
    let rounds = (k / 8).div_ceil(32);
    let smt = format!("memref<{fb}xf32, #gpu.address_space<workgroup>>");
    b.workgroup = Some(format!("%red : {smt}"));
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (t64, bx64, by64, warp64) = (b.idx64(&t), b.idx64(&bx), b.idx64(&by), b.idx64(&warp));
    let cfb = b.ci64(fb as i64);
    let f0 = b.op(&format!("arith.muli {bx64}, {cfb} : i64"));
    let cfpw = b.ci64(fpw as i64);
    let wf = b.op(&format!("arith.muli {warp64}, {cfpw} : i64"));
    let fw = b.op(&format!("arith.addi {f0}, {wf} : i64"));
    // the lane's pieces of K, clamped to the last, and whether each is real
    let (uoff, valid) = lane_pieces(b, k, &lane);
    let c16 = b.ci64(16);
    let c32 = b.ci64(32);
    // gate rows fw..fw+fpw, then the same features' up rows: per row, per round, 4 words
    // (Q4_1: the piece is a quarter block, its nibble word and the block's d/min word)
    let rowbytes = b.ci64(if q4 { (k / 32 * 20) as i64 } else { (k * 2) as i64 });
    let q4_units: Vec<(String, String)> = if q4 { uoff.iter().map(|u| b.q4_1_unit(u)).collect() } else { vec![] };
    let mut wrows: Vec<Vec<Vec<String>>> = vec![];
    for ptr in ["%wg", "%wu"] {
        for j in 0..fpw {
            let cj = b.ci64(j as i64);
            let fr = b.op(&format!("arith.addi {fw}, {cj} : i64"));
            let base = b.op(&format!("arith.muli {fr}, {rowbytes} : i64"));
            let mut row = vec![];
            for (r, u) in uoff.iter().enumerate() {
                if q4 {
                    let (bo, e0) = &q4_units[r];
                    row.push(b.q4_1_words(ptr, &base, bo, e0));
                    continue;
                }
                let o = b.op(&format!("arith.muli {u}, {c16} : i64"));
                let off = b.op(&format!("arith.addi {base}, {o} : i64"));
                row.push(b.load_vec(ptr, &off, 4, "i32", 16));
            }
            wrows.push(row);
        }
    }
    // W_down's rows t + i·N/4 (t clamped to N/4 - 1) at the block's fb features (a warp's
    // reductions then cover 32 consecutive floats: 4 sectors per instruction)
    let cq = b.ci64((n / 4) as i64 - 1);
    let tt = b.op(&format!("arith.minsi {t64}, {cq} : i64"));
    let dbytes = b.ci64(if q4 { (f / 32 * 20) as i64 } else { (f * 2) as i64 });
    let fo = if q4 {
        // (Q4_1: the block's 16-feature halves h = 0..fb/16 of W_down's blocks; their byte
        // offsets and nibble shifts, below)
        b.ci64(0)
    } else {
        let c2 = b.ci64(2);
        b.op(&format!("arith.muli {f0}, {c2} : i64"))
    };
    // (Q4_1: half j at features f0 + 16j: block (f0 + 16j) / 32 at byte 20 of each, its nibbles
    // the low ones for an even half, the high ones for an odd)
    let halves: Vec<(String, String)> = if q4 {
        (0..fb / 16)
            .map(|j| {
                let cj = b.ci64(16 * j as i64);
                let fj = b.op(&format!("arith.addi {f0}, {cj} : i64"));
                let (c16, c32, c20, c1, c4) = (b.ci64(16), b.ci64(32), b.ci64(20), b.ci64(1), b.ci64(4));
                let blk = b.op(&format!("arith.divui {fj}, {c32} : i64"));
                let bo = b.op(&format!("arith.muli {blk}, {c20} : i64"));
                let hf = b.op(&format!("arith.divui {fj}, {c16} : i64"));
                let odd = b.op(&format!("arith.andi {hf}, {c1} : i64"));
                let sh = b.op(&format!("arith.muli {odd}, {c4} : i64"));
                (bo, b.op(&format!("arith.trunci {sh} : i64 to i32")))
            })
            .collect()
    } else {
        vec![]
    };
    // (DSC_MLP_RED_V4=1 at compile time: rows 4t + i instead, the four sums added by one
    // `red.global.add.v4.f32` — a warp's instruction covers 128 consecutive floats)
    // (`KernelOptions::mlp_red_v4`: the four down-projection sums per thread in one vector
    // reduction, rows 4t..4t+3; sm_90 has `red.global.add.v4.f32`)
    let v4 = b.o.mlp_red_v4 && b.pdl;
    let c4 = b.ci64(4);
    let t4 = b.op(&format!("arith.muli {tt}, {c4} : i64"));
    let mut drows: Vec<Vec<String>> = vec![];
    for i in 0..4 {
        let (first, ci) = if v4 { (t4.clone(), b.ci64(i)) } else { (tt.clone(), b.ci64(i * (n / 4) as i64)) };
        let o = b.op(&format!("arith.addi {first}, {ci} : i64"));
        let base = b.op(&format!("arith.muli {o}, {dbytes} : i64"));
        let base = b.op(&format!("arith.addi {base}, {fo} : i64"));
        let mut words = vec![];
        if q4 {
            // per half: its block's 4 nibble words, then the d/min word
            for (bo, _) in &halves {
                let hb = b.op(&format!("arith.addi {base}, {bo} : i64"));
                let c4 = b.ci64(4);
                let qb = b.op(&format!("arith.addi {hb}, {c4} : i64"));
                words.extend(b.load_vec("%wd", &qb, 4, "i32", 4));
                words.extend(b.load_vec("%wd", &hb, 1, "i32", 4));
            }
            drows.push(words);
            continue;
        }
        for q in 0..fb * 2 / 16 {
            let cqo = b.ci64(16 * q as i64);
            let off = b.op(&format!("arith.addi {base}, {cqo} : i64"));
            words.extend(b.load_vec("%wd", &off, 4, "i32", 16));
        }
        drows.push(words);
    }
    // (a piece's 8 f32 of g, and after the wait of x)
    // (Q4_1: at the piece's elements 4t.. and 16 + 4t.. of its block)
    let piece_f32s = |b: &mut Body, r: usize, ptr: &str, base: Option<&str>| -> Vec<String> {
        let o = if q4 {
            let c4 = b.ci64(4);
            b.op(&format!("arith.muli {}, {c4} : i64", q4_units[r].1))
        } else {
            b.op(&format!("arith.muli {}, {c32} : i64", uoff[r]))
        };
        let o = match base {
            Some(base) => b.op(&format!("arith.addi {base}, {o} : i64")),
            None => o,
        };
        if q4 {
            b.q4_1_f32s(ptr, &o)
        } else {
            b.load_f32s(ptr, &o, 8)
        }
    };
    let gs: Vec<Vec<String>> = (0..uoff.len()).map(|r| piece_f32s(b, r, "%g", None)).collect();
    if b.pdl {
        b.wait_for_previous();
    }
    let xrow = b.ci64((k * 4) as i64);
    let xbase = b.op(&format!("arith.muli {by64}, {xrow} : i64"));
    let zero = b.cf32(0.0);
    let mut acc = vec![zero.clone(); 2 * fpw];
    let mut ss = zero.clone();
    let xs: Vec<Vec<String>> = valid
        .iter()
        .enumerate()
        .map(|(r, ok)| {
            let v = piece_f32s(b, r, "%x", Some(&xbase));
            match ok {
                Some(ok) => v.iter().map(|x| b.op(&format!("arith.select {ok}, {x}, {zero} : f32"))).collect(),
                None => v,
            }
        })
        .collect();
    for r in 0..rounds {
        let xg: Vec<String> = xs[r].iter().zip(&gs[r]).map(|(x, g)| b.op(&format!("arith.mulf {x}, {g} : f32"))).collect();
        for x in &xs[r] {
            ss = b.op(&format!("llvm.intr.fma({x}, {x}, {ss}) : (f32, f32, f32) -> f32"));
        }
        for (a, row) in acc.iter_mut().zip(&wrows) {
            *a = if q4 { b.fma_q4_1_words(a, &row[r], &xg) } else { b.fma_bf16_words(a, &row[r], &xg) };
        }
    }
    let lane32 = b.op(&format!("arith.index_cast {lane} : index to i32"));
    let mut vals = acc;
    vals.push(ss);
    let sums = b.warp_sums(&vals, &lane32);
    let inv = b.inv_rms(&sums[2 * fpw], k, eps);
    let c0 = b.op("arith.constant 0 : index");
    let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    let cfpwi = b.op(&format!("arith.constant {fpw} : index"));
    let hw = b.op(&format!("arith.muli {warp}, {cfpwi} : index"));
    let mut hs = vec![];
    for j in 0..fpw {
        let gate = b.op(&format!("arith.mulf {}, {inv} : f32", sums[j]));
        let up = b.op(&format!("arith.mulf {}, {inv} : f32", sums[fpw + j]));
        let sg = unary_expr(b, UnaryOp::Silu, &gate)?;
        hs.push(b.op(&format!("arith.mulf {sg}, {up} : f32")));
    }
    b.line(&format!("scf.if {first} {{"));
    for (j, h) in hs.iter().enumerate() {
        let cj = b.op(&format!("arith.constant {j} : index"));
        let at = b.op(&format!("arith.addi {hw}, {cj} : index"));
        b.line(&format!("memref.store {h}, %red[{at}] : {smt}"));
    }
    b.line("}");
    b.line("gpu.barrier");
    let nq = b.ci64((n / 4) as i64);
    let mine = b.op(&format!("arith.cmpi slt, {t64}, {nq} : i64"));
    b.line(&format!("scf.if {mine} {{"));
    let h: Vec<String> = (0..fb)
        .map(|j| {
            let cj = b.op(&format!("arith.constant {j} : index"));
            b.op(&format!("memref.load %red[{cj}] : {smt}"))
        })
        .collect();
    let mut parts = vec![];
    for words in &drows {
        if !q4 {
            parts.push(b.fma_bf16_words(&zero, words, &h));
            continue;
        }
        // Q4_1: per half, the 16 nibbles at its shift (byte i: feature 16j + i), d·q + m
        let mut a = zero.clone();
        let mask = b.op("arith.constant 252645135 : i32"); // 0x0F0F0F0F
        for (j, (_, sh)) in halves.iter().enumerate() {
            let hw = &words[5 * j..5 * j + 5];
            let [d, m] = b.f16_pair(&hw[4]);
            let c15 = b.op("arith.constant 15 : i32");
            for (q, word) in hw[..4].iter().enumerate() {
                let nib = b.op(&format!("arith.shrui {word}, {sh} : i32"));
                let nib = b.op(&format!("arith.andi {nib}, {mask} : i32"));
                for i in 0..4 {
                    let cs = b.op(&format!("arith.constant {} : i32", 8 * i));
                    let v = b.op(&format!("arith.shrui {nib}, {cs} : i32"));
                    let v = b.op(&format!("arith.andi {v}, {c15} : i32"));
                    let v = b.op(&format!("arith.uitofp {v} : i32 to f32"));
                    let w = b.op(&format!("llvm.intr.fma({d}, {v}, {m}) : (f32, f32, f32) -> f32"));
                    a = b.op(&format!("llvm.intr.fma({w}, {}, {a}) : (f32, f32, f32) -> f32", h[16 * j + 4 * q + i]));
                }
            }
        }
        parts.push(a);
    }
    // y[row, t + i·N/4] += the four sums (v4: y[row, 4t + i], one instruction)
    let cn = b.ci64(n as i64);
    let yr = b.op(&format!("arith.muli {by64}, {cn} : i64"));
    if v4 {
        let c4 = b.ci64(4);
        let t4 = b.op(&format!("arith.muli {t64}, {c4} : i64"));
        let e = b.op(&format!("arith.addi {yr}, {t4} : i64"));
        let p = b.op(&format!("llvm.getelementptr %y[{e}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        b.line(&format!(
            "llvm.inline_asm has_side_effects \"red.global.add.v4.f32 [$0], {{$1, $2, $3, $4}};\", \"l,f,f,f,f\" {p}, {}, {}, {}, {} : (!llvm.ptr<1>, f32, f32, f32, f32) -> ()",
            parts[0], parts[1], parts[2], parts[3]
        ));
        b.line("}");
        return Ok(());
    }
    let e = b.op(&format!("arith.addi {yr}, {t64} : i64"));
    for (i, v) in parts.iter().enumerate() {
        let ci = b.ci64(i as i64 * (n / 4) as i64);
        let ei = b.op(&format!("arith.addi {e}, {ci} : i64"));
        let p = b.op(&format!("llvm.getelementptr %y[{ei}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        b.line(&format!("llvm.inline_asm has_side_effects \"red.global.add.f32 [$0], $1;\", \"l,f\" {p}, {v} : (!llvm.ptr<1>, f32) -> ()"));
    }
    b.line("}");
    Ok(())
}

/// Whether a fused one-token MLP kernel generates ([`fits`]): [`swiglu_down_fits`].
pub(crate) fn mlp_fits(spec: &KernelSpec) -> Result<(), String> {
    match spec {
        KernelSpec::SwiGluDown { k, f, n, fb, fpw, wdtype, .. } => swiglu_down_fits(*k, *f, *n, *fb, *fpw, *wdtype),
        other => Err(format!("`{}` is not one of the fused one-token MLP kernels", other.symbol())),
    }
}

/// The fused one-token MLP kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn mlp_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    mlp_fits(spec)?;
    Ok(match spec {
        KernelSpec::SwiGluDown { k, f, n, eps_bits, fb, fpw, wdtype } => {
            emit_swiglu_down(b, *k, *f, *n, f32::from_bits(*eps_bits), *fb, *fpw, *wdtype)?;
            "%x: !llvm.ptr<1>, %g: !llvm.ptr<1>, %wg: !llvm.ptr<1>, %wu: !llvm.ptr<1>, %wd: !llvm.ptr<1>, %y: !llvm.ptr<1>, %f: i64".into()
        }
        other => return Err(format!("`{}` is not one of the fused one-token MLP kernels", other.symbol())),
    })
}
