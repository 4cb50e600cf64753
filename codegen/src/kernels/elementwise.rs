//! Elementwise and data-movement kernels: unary/binary ops, SiLU·mul with its 16-bit copy, casts
//! to 16 bits, seeded weight generation, slice/take-along/top-k/transpose/concat, the embedding
//! gather, softmax and the split-K partial-sum reduce. A thread per element (or a warp per row
//! for the row reductions); their launch is `Launch::PerElement` / `WarpPerRow`.
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - Seeded weights (`dsc_ir::seeded`): element i of a tensor is a pure function of (seed, name,
//!   i); plans store the seed, the GPU generates the tensor with `seeded_init_<dtype>`, the CPU
//!   on first use; the two are bit-exact (checked on the H200).

use crate::kernels::*;

/// The readable symbol of a `elementwise` kernel (`KernelSpec::symbol`).
pub(crate) fn elementwise_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::Unary(u) => format!("unary_{}_f32", dsc_ir::Op::Unary(u.0).name()),
        KernelSpec::Binary(b) => format!("binary_{}_f32", dsc_ir::Op::Binary(b.0).name()),
        KernelSpec::SiluMulHalf { f16 } => format!("binary_silu_mul_f32_{}", if *f16 { "f16" } else { "bf16" }),
        KernelSpec::Gather { d, dtype } => format!("gather_d{d}_{dtype}"),
        KernelSpec::SeededInit { dtype } => format!("seeded_init_{dtype}"),
        KernelSpec::SplitKReduce { splits, residual } => format!("splitk_reduce{splits}{}", if *residual { "_res" } else { "" }),
        KernelSpec::Softmax { d } => format!("softmax_d{d}"),
        KernelSpec::Slice { inner, d, start, len } => format!("slice_i{inner}_d{d}_{start}_{len}"),
        KernelSpec::TakeAlong { n_in, k } => format!("take_along_n{n_in}_k{k}"),
        KernelSpec::TopK { d, k } => format!("top_k_d{d}_k{k}"),
        KernelSpec::Transpose { perm } => format!("transpose_{}", perm.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("")),
        KernelSpec::Concat { sizes, inner } => format!("concat_{}_i{inner}", sizes.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("_")),
        KernelSpec::ToHalf { f16 } => format!("to_{}", if *f16 { "f16" } else { "bf16" }),
        other => unreachable!("{other:?} is not a elementwise kernel (kernels::family)"),
    }
}

/// How the runtime launches a `elementwise` kernel (`KernelSpec::launch`).
pub(crate) fn elementwise_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::Unary(_) | KernelSpec::Binary(_) | KernelSpec::SiluMulHalf { .. } => Launch::PerElement { threads: 256 },
        KernelSpec::ToHalf { .. } => Launch::PerElement { threads: 256 },
        KernelSpec::Softmax { .. } => Launch::WarpPerRow { rows_per_block: 4 },
        KernelSpec::Slice { .. } | KernelSpec::TakeAlong { .. } | KernelSpec::Transpose { .. } | KernelSpec::Concat { .. } => Launch::PerElement { threads: 256 },
        KernelSpec::TopK { .. } => Launch::WarpPerRow { rows_per_block: 4 },
        KernelSpec::Gather { .. } | KernelSpec::SeededInit { .. } | KernelSpec::SplitKReduce { .. } => Launch::PerElement { threads: 256 },
        other => unreachable!("{other:?} is not a elementwise kernel (kernels::family)"),
    }
}

/// Whether an elementwise or data-movement kernel generates ([`fits`]): seeded weights in
/// f32/bf16/f16/q4_1/q4_k/i4g128/f8g128, transposes of rank 1..=4, gathers from the weight types the kernels read
/// (packed blocks whole in a row).
pub(crate) fn elementwise_fits(spec: &KernelSpec) -> Result<(), String> {
    match spec {
        KernelSpec::SeededInit { dtype } if !matches!(dtype, DType::F32 | DType::BF16 | DType::F16 | DType::Q4_1 | DType::Q4_K | DType::I4G128 | DType::F8G128) => {
            Err(format!("seeded weights in {dtype} are not generated on the GPU"))
        }
        KernelSpec::Transpose { perm } if perm.is_empty() || perm.len() > 4 => Err(format!("transpose of rank {} is not lowered (1..=4)", perm.len())),
        KernelSpec::Gather { d, dtype } => {
            weight_elem_fits(*dtype)?;
            if dtype.is_packed() && d % dtype.block().0 != 0 {
                return Err(format!("gather from {dtype} needs D a multiple of {}, got {d}", dtype.block().0));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// The elementwise and data-movement kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn elementwise_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    elementwise_fits(spec)?;
    Ok(match spec {
        KernelSpec::Unary(u) => {
            let i = b.open_guarded_gid();
            let x = b.load("%x", &i);
            let y = unary_expr(b, u.0, &x)?;
            b.store(&y, "%y", &i);
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        KernelSpec::SiluMulHalf { f16 } => {
            let i = b.open_guarded_gid();
            let z = binary_at(b, BinaryOp::SiluMul, &i)?;
            b.store(&z, "%y", &i);
            // (the 16-bit copy as the norm + quantize kernels round it: the low half of a pair)
            let w = b.pack2(&z, &z, *f16);
            let h = b.op(&format!("arith.trunci {w} : i32 to i16"));
            let p = b.op(&format!("llvm.getelementptr %yh[{i}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i16"));
            b.line(&format!("llvm.store {h}, {p} : i16, !llvm.ptr<1>"));
            b.line("}");
            "%a: !llvm.ptr<1>, %b: !llvm.ptr<1>, %y: !llvm.ptr<1>, %yh: !llvm.ptr<1>, %n: i64, %nb: i64".into()
        }
        KernelSpec::Binary(op) => {
            let i = b.open_guarded_gid();
            let z = binary_at(b, op.0, &i)?;
            b.store(&z, "%y", &i);
            b.line("}");
            "%a: !llvm.ptr<1>, %b: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %nb: i64".into()
        }
        KernelSpec::SplitKReduce { splits, residual } => {
            let i = b.open_guarded_gid();
            let mut acc = b.load("%parts", &i);
            for sp in 1..*splits {
                let cs = b.ci64(sp as i64);
                let o = b.op(&format!("arith.muli %n, {cs} : i64"));
                let at = b.op(&format!("arith.addi {o}, {i} : i64"));
                let v = b.load("%parts", &at);
                acc = b.op(&format!("arith.addf {acc}, {v} : f32"));
            }
            if *residual {
                let r = b.load("%res", &i);
                acc = b.op(&format!("arith.addf {acc}, {r} : f32"));
            }
            b.store(&acc, "%y", &i);
            b.line("}");
            format!("%parts: !llvm.ptr<1>, {}%y: !llvm.ptr<1>, %n: i64", if *residual { "%res: !llvm.ptr<1>, " } else { "" })
        }
        KernelSpec::SeededInit { dtype } => {
            let i = b.open_guarded_gid();
            // a tensor-parallel shard reads element j of the full tensor's stream:
            // j = i (contiguous, stride 0) or (i / len) * stride + col0 + i % len
            let q = b.op(&format!("arith.divui {i}, %len : i64"));
            let rem = b.op(&format!("arith.remui {i}, %len : i64"));
            let qs = b.op(&format!("arith.muli {q}, %stride : i64"));
            let j1 = b.op(&format!("arith.addi {qs}, %col0 : i64"));
            let j2 = b.op(&format!("arith.addi {j1}, {rem} : i64"));
            let zero = b.ci64(0);
            let contiguous = b.op(&format!("arith.cmpi eq, %stride, {zero} : i64"));
            let j = b.op(&format!("arith.select {contiguous}, {i}, {j2} : i64"));
            // splitmix64(base + j)
            let mut z = b.op(&format!("arith.addi %base, {j} : i64"));
            let k0 = b.ci64(0x9E37_79B9_7F4A_7C15u64 as i64);
            z = b.op(&format!("arith.addi {z}, {k0} : i64"));
            for (sh, mul) in [(30u32, 0xBF58_476D_1CE4_E5B9u64), (27, 0x94D0_49BB_1331_11EB)] {
                let c = b.ci64(sh as i64);
                let t = b.op(&format!("arith.shrui {z}, {c} : i64"));
                let x = b.op(&format!("arith.xori {z}, {t} : i64"));
                let m = b.ci64(mul as i64);
                z = b.op(&format!("arith.muli {x}, {m} : i64"));
            }
            let c31 = b.ci64(31);
            let t = b.op(&format!("arith.shrui {z}, {c31} : i64"));
            let r = b.op(&format!("arith.xori {z}, {t} : i64"));
            let c40 = b.ci64(40);
            let top = b.op(&format!("arith.shrui {r}, {c40} : i64"));
            let uf = b.op(&format!("arith.uitofp {top} : i64 to f32"));
            let inv = b.cf32(1.0 / (1u64 << 24) as f32);
            let u = b.op(&format!("arith.mulf {uf}, {inv} : f32"));
            let two = b.cf32(2.0);
            let one = b.cf32(1.0);
            let u2 = b.op(&format!("arith.mulf {u}, {two} : f32"));
            let u3 = b.op(&format!("arith.subf {u2}, {one} : f32"));
            let sb = b.op("arith.trunci %scale : i64 to i32");
            let sc = b.op(&format!("arith.bitcast {sb} : i32 to f32"));
            let v = b.op(&format!("arith.mulf {u3}, {sc} : f32"));
            let c0 = b.ci64(0);
            let is1 = b.op(&format!("arith.cmpi ne, %ones, {c0} : i64"));
            let v = b.op(&format!("arith.select {is1}, {one}, {v} : f32"));
            match dtype {
                DType::F32 => b.store(&v, "%y", &i),
                DType::BF16 => {
                    // round to nearest even on the dropped 16 bits (no NaNs arise here)
                    let bits = b.op(&format!("arith.bitcast {v} : f32 to i32"));
                    let c16 = b.op("arith.constant 16 : i32");
                    let c1 = b.op("arith.constant 1 : i32");
                    let bias = b.op("arith.constant 32767 : i32");
                    let lsb = b.op(&format!("arith.shrui {bits}, {c16} : i32"));
                    let lsb = b.op(&format!("arith.andi {lsb}, {c1} : i32"));
                    let r1 = b.op(&format!("arith.addi {bits}, {bias} : i32"));
                    let r2 = b.op(&format!("arith.addi {r1}, {lsb} : i32"));
                    let hi = b.op(&format!("arith.shrui {r2}, {c16} : i32"));
                    let h = b.op(&format!("arith.trunci {hi} : i32 to i16"));
                    let p = b.op(&format!("llvm.getelementptr %y[{i}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i16"));
                    b.line(&format!("llvm.store {h}, {p} : i16, !llvm.ptr<1>"));
                }
                DType::F16 => {
                    let h = b.op(&format!("arith.truncf {v} : f32 to f16"));
                    let p = b.op(&format!("llvm.getelementptr %y[{i}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16"));
                    b.line(&format!("llvm.store {h}, {p} : f16, !llvm.ptr<1>"));
                }
                DType::Q4_1 => {
                    // a warp per 32-element block (N a multiple of 32: whole warps in the
                    // guard), as `dsc_ir::quant::encode` does it: min and max over the block
                    // (order-free), d = (max - min) / 15 and q = trunc((v - min) · (1/d) + 0.5)
                    // clamped, each f32 operation rounded on its own (no contraction), d and
                    // the min stored as f16; lane j < 16 writes byte j (q_j | q_{j+16} << 4)
                    let lo = b.xor_reduce(&v, "arith.minimumf", &[16, 8, 4, 2, 1]);
                    let hi = b.xor_reduce(&v, "arith.maximumf", &[16, 8, 4, 2, 1]);
                    let (d, qi) = seeded_nibble(b, &v, &lo, &hi, &one);
                    let w32 = b.op("arith.constant 32 : i32");
                    let c16 = b.op("arith.constant 16 : i32");
                    let (up, valid) = (b.v(), b.v());
                    b.line(&format!("{up}, {valid} = gpu.shuffle down {qi}, {c16}, {w32} : i32"));
                    let c4 = b.op("arith.constant 4 : i32");
                    let hi4 = b.op(&format!("arith.shli {up}, {c4} : i32"));
                    let byte = b.op(&format!("arith.ori {qi}, {hi4} : i32"));
                    let byte = b.op(&format!("arith.trunci {byte} : i32 to i8"));
                    // block i / 32 at byte 20 (i / 32); lane = i % 32
                    let c32 = b.ci64(32);
                    let blk = b.op(&format!("arith.divui {i}, {c32} : i64"));
                    let lane = b.op(&format!("arith.remui {i}, {c32} : i64"));
                    let c20 = b.ci64(20);
                    let at = b.op(&format!("arith.muli {blk}, {c20} : i64"));
                    let c16l = b.ci64(16);
                    let low = b.op(&format!("arith.cmpi ult, {lane}, {c16l} : i64"));
                    b.line(&format!("scf.if {low} {{"));
                    let c4l = b.ci64(4);
                    let o = b.op(&format!("arith.addi {at}, {c4l} : i64"));
                    let o = b.op(&format!("arith.addi {o}, {lane} : i64"));
                    let p = b.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                    b.line(&format!("llvm.store {byte}, {p} : i8, !llvm.ptr<1>"));
                    b.line("}");
                    let c0l = b.ci64(0);
                    let first = b.op(&format!("arith.cmpi eq, {lane}, {c0l} : i64"));
                    b.line(&format!("scf.if {first} {{"));
                    for (val, off) in [(&d, 0i64), (&lo, 2)] {
                        let h = b.op(&format!("arith.truncf {val} : f32 to f16"));
                        let co = b.ci64(off);
                        let o = b.op(&format!("arith.addi {at}, {co} : i64"));
                        let p = b.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                        b.line(&format!("llvm.store {h}, {p} {{alignment = 2 : i64}} : f16, !llvm.ptr<1>"));
                    }
                    b.line("}");
                }
                DType::I4G128 => {
                    // a group of 128 is 4 warps (the 256-thread block two groups; N a multiple
                    // of 512: whole blocks in the guard), numbers as `dsc_ir::quant::encode` makes
                    // them (Q4_1's above, per group): min and max through shared memory, each
                    // value's nibble or-ed into its word by shuffles, lane 8w writes word w
                    let [lo, hi]: [String; 2] = group_reduce(b, &[(&v, "arith.minimumf"), (&v, "arith.maximumf")]).try_into().expect("two");
                    let (d, qi) = seeded_nibble(b, &v, &lo, &hi, &one);
                    // value p = i % 128 of its group (`dsc_ir::quant::i4g128_nibble`): chunk
                    // c = p % 16 / 4, word w = p / 32 (the warp), i = p % 4 + 4 (p % 32 / 16) in
                    // nibble i / 2 (+ 4 when odd); a word's lanes 4c.. and 16 + 4c.. or their
                    // nibbles together, lane 4c writes it
                    let c2 = b.ci64(2);
                    let c4 = b.ci64(4);
                    let c16l = b.ci64(16);
                    let c32l = b.ci64(32);
                    let r32 = b.op(&format!("arith.remui {i}, {c32l} : i64"));
                    let half = b.op(&format!("arith.divui {r32}, {c16l} : i64"));
                    let i4 = b.op(&format!("arith.remui {r32}, {c4} : i64"));
                    let h4 = b.op(&format!("arith.muli {half}, {c4} : i64"));
                    let i8 = b.op(&format!("arith.addi {i4}, {h4} : i64"));
                    let j = b.op(&format!("arith.divui {i8}, {c2} : i64"));
                    let odd = b.op(&format!("arith.remui {i8}, {c2} : i64"));
                    let o4 = b.op(&format!("arith.muli {odd}, {c4} : i64"));
                    let nib = b.op(&format!("arith.addi {j}, {o4} : i64"));
                    let sh = b.op(&format!("arith.muli {nib}, {c4} : i64"));
                    let sh = b.op(&format!("arith.trunci {sh} : i64 to i32"));
                    let mut word = b.op(&format!("arith.shli {qi}, {sh} : i32"));
                    let w32 = b.op("arith.constant 32 : i32");
                    for off in [1, 2, 16] {
                        let o = b.op(&format!("arith.constant {off} : i32"));
                        let (x, valid) = (b.v(), b.v());
                        b.line(&format!("{x}, {valid} = gpu.shuffle xor {word}, {o}, {w32} : i32"));
                        word = b.op(&format!("arith.ori {word}, {x} : i32"));
                    }
                    // super-block i / 512 at 272 (i / 512); group gi = i % 512 / 128
                    let c512 = b.ci64(512);
                    let c128 = b.ci64(128);
                    let sb = b.op(&format!("arith.divui {i}, {c512} : i64"));
                    let c272 = b.ci64(272);
                    let at = b.op(&format!("arith.muli {sb}, {c272} : i64"));
                    let r512 = b.op(&format!("arith.remui {i}, {c512} : i64"));
                    let gi = b.op(&format!("arith.divui {r512}, {c128} : i64"));
                    let p = b.op(&format!("arith.remui {i}, {c128} : i64"));
                    let c0l = b.ci64(0);
                    let lead = b.op(&format!("arith.cmpi eq, {i8}, {c0l} : i64"));
                    b.line(&format!("scf.if {lead} {{"));
                    let c64 = b.ci64(64);
                    let go = b.op(&format!("arith.muli {gi}, {c64} : i64"));
                    let o = b.op(&format!("arith.addi {at}, {c16l} : i64"));
                    let o = b.op(&format!("arith.addi {o}, {go} : i64"));
                    // (lane 4c: r32 = 4c, so chunk offset 16c = 4 r32; word w = p / 32 at 4w)
                    let co = b.op(&format!("arith.muli {r32}, {c4} : i64"));
                    let w = b.op(&format!("arith.divui {p}, {c32l} : i64"));
                    let wo = b.op(&format!("arith.muli {w}, {c4} : i64"));
                    let o = b.op(&format!("arith.addi {o}, {co} : i64"));
                    let o = b.op(&format!("arith.addi {o}, {wo} : i64"));
                    let pp = b.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                    b.line(&format!("llvm.store {word}, {pp} {{alignment = 4 : i64}} : i32, !llvm.ptr<1>"));
                    b.line("}");
                    let first = b.op(&format!("arith.cmpi eq, {p}, {c0l} : i64"));
                    b.line(&format!("scf.if {first} {{"));
                    let so = b.op(&format!("arith.muli {gi}, {c4} : i64"));
                    let so = b.op(&format!("arith.addi {at}, {so} : i64"));
                    for (val, off) in [(&d, 0i64), (&lo, 2)] {
                        let h = b.op(&format!("arith.truncf {val} : f32 to f16"));
                        let co = b.ci64(off);
                        let o = b.op(&format!("arith.addi {so}, {co} : i64"));
                        let p = b.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                        b.line(&format!("llvm.store {h}, {p} {{alignment = 2 : i64}} : f16, !llvm.ptr<1>"));
                    }
                    b.line("}");
                }
                DType::Q4_K => seeded_q4_k(b, &v, &i),
                DType::F8G128 => {
                    // a group of 128 is 4 warps (N a multiple of 512), numbers as
                    // `dsc_ir::quant::f8g128_group` makes them: |max| through shared memory,
                    // s = amax / 448, each value e4m3(v / s) rounded to nearest even (the
                    // host's integer rounding, so sm_80 needs no FP8 instruction); each thread
                    // writes its byte, the group's first its scale
                    // (|v| by its bits: math.absf would call libdevice)
                    let vb = b.op(&format!("arith.bitcast {v} : f32 to i32"));
                    let cabs = b.op(&format!("arith.constant {} : i32", 0x7FFF_FFFF));
                    let ab = b.op(&format!("arith.andi {vb}, {cabs} : i32"));
                    let av = b.op(&format!("arith.bitcast {ab} : i32 to f32"));
                    let amax = group_reduce(b, &[(&av, "arith.maximumf")]).remove(0);
                    let c448 = b.cf32(448.0);
                    let sc = rn_f32(b, "div", &amax, &c448);
                    let zf = b.cf32(0.0);
                    let nz = b.op(&format!("arith.cmpf une, {sc}, {zf} : f32"));
                    let one_f = b.cf32(1.0);
                    let den = b.op(&format!("arith.select {nz}, {sc}, {one_f} : f32"));
                    let qv = rn_f32(b, "div", &v, &den);
                    let code = f32_to_e4m3_bits(b, &qv);
                    let z32 = b.op("arith.constant 0 : i32");
                    let code = b.op(&format!("arith.select {nz}, {code}, {z32} : i32"));
                    let byte = b.op(&format!("arith.trunci {code} : i32 to i8"));
                    // super-block i / 512 at 528 (i / 512): scale of group gi at 4 gi, value r at 16 + r
                    let c512 = b.ci64(512);
                    let sb = b.op(&format!("arith.divui {i}, {c512} : i64"));
                    let c528 = b.ci64(528);
                    let at = b.op(&format!("arith.muli {sb}, {c528} : i64"));
                    let r = b.op(&format!("arith.remui {i}, {c512} : i64"));
                    let c16 = b.ci64(16);
                    let o = b.op(&format!("arith.addi {at}, {c16} : i64"));
                    let o = b.op(&format!("arith.addi {o}, {r} : i64"));
                    let pp = b.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                    b.line(&format!("llvm.store {byte}, {pp} : i8, !llvm.ptr<1>"));
                    let c128 = b.ci64(128);
                    let p = b.op(&format!("arith.remui {i}, {c128} : i64"));
                    let c0l = b.ci64(0);
                    let first = b.op(&format!("arith.cmpi eq, {p}, {c0l} : i64"));
                    b.line(&format!("scf.if {first} {{"));
                    let gi = b.op(&format!("arith.divui {r}, {c128} : i64"));
                    let c4 = b.ci64(4);
                    let so = b.op(&format!("arith.muli {gi}, {c4} : i64"));
                    let so = b.op(&format!("arith.addi {at}, {so} : i64"));
                    let sp = b.op(&format!("llvm.getelementptr %y[{so}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                    b.line(&format!("llvm.store {sc}, {sp} {{alignment = 4 : i64}} : f32, !llvm.ptr<1>"));
                    b.line("}");
                }
                other => unreachable!("elementwise_fits refuses seeded {other}"),
            }
            b.line("}");
            "%y: !llvm.ptr<1>, %n: i64, %base: i64, %scale: i64, %ones: i64, %len: i64, %stride: i64, %col0: i64".into()
        }
        KernelSpec::ToHalf { f16 } => {
            // 8 elements per thread: two 16-byte loads, one 16-byte store
            let i = b.open_guarded_gid();
            let c32 = b.ci64(32);
            let c16 = b.ci64(16);
            let o = b.op(&format!("arith.muli {i}, {c32} : i64"));
            let o2 = b.op(&format!("arith.addi {o}, {c16} : i64"));
            let mut v = b.load_vec("%x", &o, 4, "f32", 16);
            v.extend(b.load_vec("%x", &o2, 4, "f32", 16));
            let packed: Vec<String> = (0..4).map(|j| b.pack2(&v[2 * j], &v[2 * j + 1], *f16)).collect();
            let vec_v = b.vector(&packed, "i32");
            let so = b.op(&format!("arith.muli {i}, {c16} : i64"));
            let p = b.op(&format!("llvm.getelementptr %y[{so}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
            b.line(&format!("llvm.store {vec_v}, {p} {{alignment = 16 : i64}} : vector<4xi32>, !llvm.ptr<1>"));
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".to_string()
        }
        KernelSpec::Softmax { d } => {
            let (lane, base, dd, c32) = b.open_row(*d, 4);
            let m = b.row_reduce(&lane, &base, &dd, &c32, &|_, x| x.to_string(), true);
            let mm = m.clone();
            let sum = b.row_reduce(
                &lane,
                &base,
                &dd,
                &c32,
                &move |b, x| {
                    let t = b.op(&format!("arith.subf {x}, {mm} : f32"));
                    b.exp(&t)
                },
                false,
            );
            let iv = b.v();
            b.line(&format!("scf.for {iv} = {lane} to {dd} step {c32} {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let x = b.load("%x", &idx);
            let t = b.op(&format!("arith.subf {x}, {m} : f32"));
            let e = b.exp(&t);
            let y = b.op(&format!("arith.divf {e}, {sum} : f32"));
            b.store(&y, "%y", &idx);
            b.line("}");
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::Slice { inner, d, start, len } => {
            let o = b.open_guarded_gid();
            let ci = b.ci64(*inner as i64);
            let cl = b.ci64(*len as i64);
            let cd = b.ci64(*d as i64);
            let cs = b.ci64(*start as i64);
            let inn = b.op(&format!("arith.remui {o}, {ci} : i64"));
            let t = b.op(&format!("arith.divui {o}, {ci} : i64"));
            let ax = b.op(&format!("arith.remui {t}, {cl} : i64"));
            let outer = b.op(&format!("arith.divui {t}, {cl} : i64"));
            let r = b.op(&format!("arith.muli {outer}, {cd} : i64"));
            let r = b.op(&format!("arith.addi {r}, {cs} : i64"));
            let r = b.op(&format!("arith.addi {r}, {ax} : i64"));
            let r = b.op(&format!("arith.muli {r}, {ci} : i64"));
            let src = b.op(&format!("arith.addi {r}, {inn} : i64"));
            let x = b.load("%x", &src);
            b.store(&x, "%y", &o);
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        KernelSpec::TakeAlong { n_in, k } => {
            let o = b.open_guarded_gid();
            let ck = b.ci64(*k as i64);
            let cn = b.ci64(*n_in as i64);
            let r = b.op(&format!("arith.divui {o}, {ck} : i64"));
            let j = b.load_i32_as_i64("%idx", &o);
            let rb = b.op(&format!("arith.muli {r}, {cn} : i64"));
            let src = b.op(&format!("arith.addi {rb}, {j} : i64"));
            let x = b.load("%x", &src);
            b.store(&x, "%y", &o);
            b.line("}");
            "%x: !llvm.ptr<1>, %idx: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        KernelSpec::TopK { d, k } => {
            let (lane, base, dd, c32) = b.open_row(*d, 4);
            let row = b.op(&format!("arith.divui {base}, {dd} : index"));
            let row = b.op(&format!("arith.index_cast {row} : index to i64"));
            let ck = b.ci64(*k as i64);
            let obase = b.op(&format!("arith.muli {row}, {ck} : i64"));
            // pass p finds the largest (value desc, index asc) element after the previous pick
            let mut pv = b.op("arith.constant 0x7F800000 : f32"); // +inf
            let mut pi = b.op("arith.constant -1 : i32");
            for p in 0..*k {
                let ninf = b.op("arith.constant 0xFF800000 : f32");
                let big = b.op("arith.constant 2147483647 : i32");
                let res = b.v();
                let (iv, bv, bi) = (b.v(), b.v(), b.v());
                b.line(&format!("{res}:2 = scf.for {iv} = {lane} to {dd} step {c32} iter_args({bv} = {ninf}, {bi} = {big}) -> (f32, i32) {{"));
                let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
                let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
                let x = b.load("%x", &idx);
                let xi = b.op(&format!("arith.index_cast {iv} : index to i32"));
                // eligible: (x < pv) or (x == pv and xi > pi)
                let lt = b.op(&format!("arith.cmpf olt, {x}, {pv} : f32"));
                let eqv = b.op(&format!("arith.cmpf oeq, {x}, {pv} : f32"));
                let gti = b.op(&format!("arith.cmpi sgt, {xi}, {pi} : i32"));
                let after = b.op(&format!("arith.andi {eqv}, {gti} : i1"));
                let elig = b.op(&format!("arith.ori {lt}, {after} : i1"));
                // better: x > bv, or x == bv and xi < bi
                let gt = b.op(&format!("arith.cmpf ogt, {x}, {bv} : f32"));
                let eqb = b.op(&format!("arith.cmpf oeq, {x}, {bv} : f32"));
                let lti = b.op(&format!("arith.cmpi slt, {xi}, {bi} : i32"));
                let tie = b.op(&format!("arith.andi {eqb}, {lti} : i1"));
                let better = b.op(&format!("arith.ori {gt}, {tie} : i1"));
                let take = b.op(&format!("arith.andi {elig}, {better} : i1"));
                let nv = b.op(&format!("arith.select {take}, {x}, {bv} : f32"));
                let ni = b.op(&format!("arith.select {take}, {xi}, {bi} : i32"));
                b.line(&format!("scf.yield {nv}, {ni} : f32, i32"));
                b.line("}");
                let (v, i) = b.warp_argmax(&format!("{res}#0"), &format!("{res}#1"));
                let c0 = b.op("arith.constant 0 : index");
                let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
                b.line(&format!("scf.if {first} {{"));
                let cp = b.ci64(p as i64);
                let oi = b.op(&format!("arith.addi {obase}, {cp} : i64"));
                let ptr = b.op(&format!("llvm.getelementptr %y[{oi}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
                b.line(&format!("llvm.store {i}, {ptr} : i32, !llvm.ptr<1>"));
                b.line("}");
                pv = v;
                pi = i;
            }
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::Transpose { perm } => {
            let r = perm.len();
            let o = b.open_guarded_gid();
            // input dims %d0..; output coordinate j runs over input axis perm[j]
            let ind: Vec<String> = (0..r).map(|i| format!("%d{i}")).collect();
            let mut rem = o.clone();
            let mut coord = vec![String::new(); r];
            for j in (0..r).rev() {
                let dim = &ind[perm[j]];
                coord[perm[j]] = b.op(&format!("arith.remui {rem}, {dim} : i64"));
                rem = b.op(&format!("arith.divui {rem}, {dim} : i64"));
            }
            let mut src = coord[0].clone();
            for i in 1..r {
                let m = b.op(&format!("arith.muli {src}, {} : i64", ind[i]));
                src = b.op(&format!("arith.addi {m}, {} : i64", coord[i]));
            }
            let x = b.load("%x", &src);
            b.store(&x, "%y", &o);
            b.line("}");
            let dims: Vec<String> = (0..r).map(|i| format!("%d{i}: i64")).collect();
            format!("%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, {}", dims.join(", "))
        }
        KernelSpec::Concat { sizes, inner } => {
            let total: usize = sizes.iter().sum();
            let o = b.open_guarded_gid();
            let ci = b.ci64(*inner as i64);
            let ct = b.ci64(total as i64);
            let inn = b.op(&format!("arith.remui {o}, {ci} : i64"));
            let t = b.op(&format!("arith.divui {o}, {ci} : i64"));
            let a = b.op(&format!("arith.remui {t}, {ct} : i64"));
            let outer = b.op(&format!("arith.divui {t}, {ct} : i64"));
            // pick the operand by the axis coordinate; each branch loads from its own input
            let mut val = b.cf32(0.0);
            let mut start = 0usize;
            for (m, &sz) in sizes.iter().enumerate() {
                let lo = b.ci64(start as i64);
                let hi = b.ci64((start + sz) as i64);
                let ge = b.op(&format!("arith.cmpi uge, {a}, {lo} : i64"));
                let lt = b.op(&format!("arith.cmpi ult, {a}, {hi} : i64"));
                let inr = b.op(&format!("arith.andi {ge}, {lt} : i1"));
                let la = b.op(&format!("arith.subi {a}, {lo} : i64"));
                let csz = b.ci64(sz as i64);
                let r0 = b.op(&format!("arith.muli {outer}, {csz} : i64"));
                let r1 = b.op(&format!("arith.addi {r0}, {la} : i64"));
                let r2 = b.op(&format!("arith.muli {r1}, {ci} : i64"));
                let src = b.op(&format!("arith.addi {r2}, {inn} : i64"));
                // clamp the index for lanes of other operands so the load stays in bounds
                let z = b.ci64(0);
                let safe = b.op(&format!("arith.select {inr}, {src}, {z} : i64"));
                let x = b.load(&format!("%x{m}"), &safe);
                val = b.op(&format!("arith.select {inr}, {x}, {val} : f32"));
                start += sz;
            }
            b.store(&val, "%y", &o);
            b.line("}");
            let xs: Vec<String> = (0..sizes.len()).map(|m| format!("%x{m}: !llvm.ptr<1>")).collect();
            format!("{}, %y: !llvm.ptr<1>, %n: i64", xs.join(", "))
        }
        KernelSpec::Gather { d, dtype } => {
            let i = b.open_guarded_gid();
            let dd = b.ci64(*d as i64);
            let t = b.op(&format!("arith.divui {i}, {dd} : i64"));
            let j = b.op(&format!("arith.remui {i}, {dd} : i64"));
            let row = b.load_i32_as_i64("%idx", &t);
            let rbase = b.op(&format!("arith.muli {row}, {dd} : i64"));
            let e = b.op(&format!("arith.addi {rbase}, {j} : i64"));
            let v = b.weight_elem("%table", &e, *dtype)?;
            b.store(&v, "%y", &i);
            b.line("}");
            "%table: !llvm.ptr<1>, %idx: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        other => return Err(format!("`{}` is not one of the elementwise and data-movement kernels", other.symbol())),
    })
}

/// `ins.rn.f32` (sub, mul, div, add) of `x` and `y`: one IEEE rounding, no contraction — the
/// seeded quantizers' arithmetic step for step as the host's.
pub(crate) fn rn_f32(b: &mut Body, ins: &str, x: &str, y: &str) -> String {
    b.op(&format!("llvm.inline_asm \"{ins}.rn.f32 $0, $1, $2;\", \"=f,f,f\" {x}, {y} : (f32, f32) -> f32"))
}

/// The reductions over a 128-value group of a seeded block-format generator, where a group is
/// four consecutive warps of the 256-thread block: each `(value, op)` reduced over the warp by
/// shuffles, then over the group's four warps through `%red` (part p in slots 8p..8p + 8).
fn group_reduce(b: &mut Body, parts: &[(&str, &str)]) -> Vec<String> {
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", 8 * parts.len());
    b.workgroup = Some(format!("%red : {smt}"));
    let own: Vec<String> = parts.iter().map(|(v, op)| b.xor_reduce(v, op, &[16, 8, 4, 2, 1])).collect();
    let t = b.op("gpu.thread_id x");
    let (lane, warp) = b.lane_warp(&t);
    let c0x = b.op("arith.constant 0 : index");
    let offs: Vec<String> = (1..parts.len()).map(|p| b.op(&format!("arith.constant {} : index", 8 * p))).collect();
    let first_lane = b.op(&format!("arith.cmpi eq, {lane}, {c0x} : index"));
    b.line(&format!("scf.if {first_lane} {{"));
    let slots: Vec<String> = offs.iter().map(|o| b.op(&format!("arith.addi {warp}, {o} : index"))).collect();
    for (p, w) in own.iter().enumerate() {
        let slot = if p == 0 { &warp } else { &slots[p - 1] };
        b.line(&format!("memref.store {w}, %red[{slot}] : {smt}"));
    }
    b.line("}");
    b.line("gpu.barrier");
    let c4x = b.op("arith.constant 4 : index");
    let g0 = b.op(&format!("arith.divui {warp}, {c4x} : index"));
    let g0 = b.op(&format!("arith.muli {g0}, {c4x} : index"));
    let mut acc = own.clone();
    for k in 0..4 {
        let ck = b.op(&format!("arith.constant {k} : index"));
        let at = b.op(&format!("arith.addi {g0}, {ck} : index"));
        let ats: Vec<String> = offs.iter().map(|o| b.op(&format!("arith.addi {at}, {o} : index"))).collect();
        let vals: Vec<String> = (0..parts.len()).map(|p| b.op(&format!("memref.load %red[{}] : {smt}", if p == 0 { &at } else { &ats[p - 1] }))).collect();
        for (p, val) in vals.iter().enumerate() {
            acc[p] = b.op(&format!("{} {}, {val} : f32", parts[p].1, acc[p]));
        }
    }
    acc
}

/// The seeded 4-bit quantizers' value `v` of a group spanning `lo..=hi` (Q4_1's block,
/// i4g128's group), as `dsc_ir::quant::encode` computes it, each f32 operation rounded on its
/// own: (d = (hi − lo) / 15, q = trunc((v − lo) · (1 / d) + 0.5) clamped to 0..=15 as i32).
fn seeded_nibble(b: &mut Body, v: &str, lo: &str, hi: &str, one: &str) -> (String, String) {
    let span = rn_f32(b, "sub", hi, lo);
    let c15 = b.cf32(15.0);
    let d = rn_f32(b, "div", &span, &c15);
    let zero = b.cf32(0.0);
    let nz = b.op(&format!("arith.cmpf une, {d}, {zero} : f32"));
    let rd = rn_f32(b, "div", one, &d);
    let id = b.op(&format!("arith.select {nz}, {rd}, {zero} : f32"));
    let dv = rn_f32(b, "sub", v, lo);
    let sc = rn_f32(b, "mul", &dv, &id);
    let half = b.cf32(0.5);
    let r = rn_f32(b, "add", &sc, &half);
    let qi = b.op(&format!("arith.fptosi {r} : f32 to i32"));
    let (z32, c15i) = (b.op("arith.constant 0 : i32"), b.op("arith.constant 15 : i32"));
    let qi = b.op(&format!("arith.maxsi {qi}, {z32} : i32"));
    (d, b.op(&format!("arith.minsi {qi}, {c15i} : i32")))
}

/// e4m3fn bits (i32) of the finite f32 `x` as `dsc_ir::quant::f32_to_f8e4m3` computes them:
/// round to nearest even, saturating to ±448 (0x7E), multiples of 2^-9 below 2^-6.
pub(crate) fn f32_to_e4m3_bits(b: &mut Body, x: &str) -> String {
    let bits = b.op(&format!("arith.bitcast {x} : f32 to i32"));
    let c24 = b.op("arith.constant 24 : i32");
    let c80 = b.op("arith.constant 128 : i32");
    let sign = b.op(&format!("arith.shrui {bits}, {c24} : i32"));
    let sign = b.op(&format!("arith.andi {sign}, {c80} : i32"));
    let cabs = b.op(&format!("arith.constant {} : i32", 0x7FFF_FFFF));
    let ab = b.op(&format!("arith.andi {bits}, {cabs} : i32"));
    // normal: keep 3 mantissa bits, ties to even on the 20 dropped
    let c20 = b.op("arith.constant 20 : i32");
    let c1 = b.op("arith.constant 1 : i32");
    let half = b.op(&format!("arith.constant {} : i32", (1 << 19) - 1));
    let lsb = b.op(&format!("arith.shrui {ab}, {c20} : i32"));
    let lsb = b.op(&format!("arith.andi {lsb}, {c1} : i32"));
    let r = b.op(&format!("arith.addi {ab}, {half} : i32"));
    let r = b.op(&format!("arith.addi {r}, {lsb} : i32"));
    let c23 = b.op("arith.constant 23 : i32");
    let e = b.op(&format!("arith.shrui {r}, {c23} : i32"));
    let c120 = b.op("arith.constant 120 : i32");
    let e = b.op(&format!("arith.subi {e}, {c120} : i32"));
    let c3 = b.op("arith.constant 3 : i32");
    let e = b.op(&format!("arith.shli {e}, {c3} : i32"));
    let m = b.op(&format!("arith.shrui {r}, {c20} : i32"));
    let c7 = b.op("arith.constant 7 : i32");
    let m = b.op(&format!("arith.andi {m}, {c7} : i32"));
    let normal = b.op(&format!("arith.ori {e}, {m} : i32"));
    let c7e = b.op("arith.constant 126 : i32");
    let normal = b.op(&format!("arith.minsi {normal}, {c7e} : i32"));
    // subnormal: |x| · 512 rounded to nearest even
    let a = b.op(&format!("arith.bitcast {ab} : i32 to f32"));
    let c512 = b.cf32(512.0);
    let a512 = b.op(&format!("arith.mulf {a}, {c512} : f32"));
    let sub = b.op(&format!("llvm.inline_asm \"cvt.rni.u32.f32 $0, $1;\", \"=r,f\" {a512} : (f32) -> i32"));
    let tiny = b.cf32(1.0 / 64.0);
    let is_sub = b.op(&format!("arith.cmpf olt, {a}, {tiny} : f32"));
    let code = b.op(&format!("arith.select {is_sub}, {sub}, {normal} : i32"));
    b.op(&format!("arith.ori {code}, {sign} : i32"))
}
