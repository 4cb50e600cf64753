//! The FP8 family (W8A8 on Hopper's FP8 tensor cores): the activation quantizer
//! (`KernelSpec::ActQuantF8`) and the e4m3 x e4m3 wgmma GEMM with DeepSeek-style fine-grained
//! scales (`KernelSpec::MatMulF8`).
//!
//! Design notes (what each kernel does and why):
//! - 8-bit activations are the IR's `act_quant { dtype = f8e4m3, group = 128 }` (DeepSeek-V3's
//!   1x128 activation groups): a dynamic scale s = amax / 448 per 128 values of a token, each
//!   value rounded to e4m3 (RNE, saturating) of x / s. `ActQuantF8` (a warp per group, four
//!   values a lane, the amax by xor shuffles) writes two things: the node itself in f32 as the
//!   CPU executor defines it (s · e4m3(x / s), which the decode GEMVs read unchanged), and
//!   `{node}@rows{W}` — per row its K e4m3 bytes then K / 128 f32 scales (W = K/4 + K/128 f32
//!   slots: the runtime's row scratch) — which the FP8 GEMM reads. Conversions by
//!   `cvt.rn.satfinite.e4m3x2.f32` and `cvt.rn.f16x2.e4m3x2` (exact), the quotient by an IEEE
//!   division as the CPU's `v / s`: the f32 output equals the CPU executor's bit for bit.
//! - `MatMulF8 { k, n, residual, bn, stages }` (`matmul_f8gemm{bn}s{S}_k{K}_n{N}`, sm_90a, from
//!   129 rows: the prefill and large batches): y = Σ over 128-value K blocks of
//!   sx[row, kb] · sw[col, kb] · (q_x · q_w), both operands e4m3 from shared memory (K-major,
//!   the 128-byte swizzle: a K step of 128 e4m3 is one 128-byte row per x row and W row, the
//!   same tile geometry as the bf16 pipe's 64-value steps). W comes in dsc's f8g128 layout
//!   (512-value super-blocks: four f32 group scales, then 512 e4m3), so each W row's 128-byte
//!   step is contiguous and its scale one f32 beside it. A block of two warpgroups takes a
//!   128 x bn tile (warpgroup w rows 64w..); every thread issues 16-byte `cp.async` copies of
//!   x's and W's steps and one 4-byte copy of a scale into a ring of `stages` stages (x tile,
//!   W tile, x scales, W scales); per K step 4 x `wgmma m64n{bn}k32.e4m3.e4m3` into a
//!   step accumulator (the first with scale-d 0), `wgmma.wait_group 0`, then the promotion
//!   (DeepGEMM's): acc += step · (sx[row] · sw[col]) in f32, so the tensor cores' limited
//!   accumulation precision never spans more than 128 products.

use crate::kernels::elementwise::{f32_to_e4m3_bits, rn_f32};
use crate::kernels::*;

/// The readable symbol of an FP8 kernel (`KernelSpec::symbol`).
pub(crate) fn fp8_symbol(spec: &KernelSpec) -> String {
    match spec {
        KernelSpec::ActQuantF8 { d, group } => format!("act_quant_f8_d{d}_g{group}"),
        KernelSpec::MatMulF8 { k, n, residual, bn, stages } => format!("matmul_f8gemm{bn}s{stages}_k{k}_n{n}{}", if *residual { "_res" } else { "" }),
        other => unreachable!("{other:?} is not an FP8 kernel (kernels::family)"),
    }
}

/// How the runtime launches an FP8 kernel: the quantizer a thread per four values (scalar:
/// rows · d / 4), the GEMM a block of 256 threads per 128 x bn tile.
pub(crate) fn fp8_launch(spec: &KernelSpec) -> Launch {
    match spec {
        KernelSpec::ActQuantF8 { .. } => Launch::PerElement { threads: 256 },
        KernelSpec::MatMulF8 { bn, stages, .. } => Launch::Tile { outputs: *bn as u32, rows: F8_BM as u32, threads: 256, smem: f8_smem(*bn, *stages) as u32, carveout: false },
        other => unreachable!("{other:?} is not an FP8 kernel (kernels::family)"),
    }
}

/// Rows of x per block of the FP8 GEMM: two warpgroups of 64.
pub const F8_BM: usize = 128;

/// The activation groups the FP8 GEMM takes (DeepSeek-V3's 1x128).
pub const F8_GROUP: usize = 128;

/// Bytes of one stage of the FP8 GEMM: the x tile (128 rows x 128 e4m3), the W tile (bn rows x
/// 128), x's and W's scales for the step (4 bytes a row), rounded up to the 1024 bytes the
/// 128-byte swizzle repeats over.
pub fn f8_stage_bytes(bn: usize) -> usize {
    (F8_BM * 128 + bn * 128 + 4 * (F8_BM + bn)).div_ceil(1024) * 1024
}

/// Dynamic shared memory of an FP8 GEMM block: its stages plus 1 KB to align them.
pub fn f8_smem(bn: usize, stages: usize) -> usize {
    stages * f8_stage_bytes(bn) + 1024
}

/// Row width, in f32 slots, of the e4m3 copy `{x}@rows{W}` of an activation of `k` values a
/// row: k e4m3 bytes then k / 128 f32 scales.
pub fn f8_rows_width(k: usize) -> usize {
    k / 4 + k / F8_GROUP
}

/// The FP8 GEMM's tiling for N output columns: 128-column tiles, 6 stages.
pub fn f8_tiling(_n: usize) -> (usize, usize) {
    (128, 6)
}

/// What the FP8 kernels take: the quantizer groups of 128 (rows whole groups); the GEMM K in
/// whole f8g128 super-blocks (512), bn 64 or 128 (its scale copies: one a thread), 3+ stages
/// within shared memory.
pub(crate) fn fp8_fits(spec: &KernelSpec) -> Result<(), String> {
    match spec {
        KernelSpec::ActQuantF8 { d, group } => {
            if *group != F8_GROUP || d % group != 0 {
                return Err(format!("the GPU activation quantizer takes groups of {F8_GROUP} values dividing the row, not group {group} of d {d}"));
            }
            Ok(())
        }
        KernelSpec::MatMulF8 { k, bn, stages, .. } => {
            if k % 512 != 0 {
                return Err(format!("the FP8 GEMM needs K a multiple of 512 (f8g128 super-blocks), got {k}"));
            }
            if !matches!(bn, 64 | 128) {
                return Err(format!("the FP8 GEMM takes 64- or 128-column tiles, not {bn}"));
            }
            if *stages < 3 || f8_smem(*bn, *stages) > 227 * 1024 {
                return Err(format!("the FP8 GEMM's {stages} stages of {bn} columns do not fit (3+ within 227 KB)"));
            }
            Ok(())
        }
        other => Err(format!("`{}` is not an FP8 kernel", other.symbol())),
    }
}

/// The FP8 kernels' bodies; returns the parameter list.
pub(crate) fn fp8_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    fp8_fits(spec)?;
    Ok(match spec {
        KernelSpec::ActQuantF8 { d, group } => {
            emit_act_quant_f8(b, *d, *group);
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %q: !llvm.ptr<1>, %n: i64".to_string()
        }
        KernelSpec::MatMulF8 { k, residual, bn, stages, .. } => {
            emit_gemm_f8(b, *k, *residual, *bn, *stages);
            matmul_params(false, *residual, true)
        }
        other => return Err(format!("`{}` is not an FP8 kernel", other.symbol())),
    })
}

/// Thread i (of rows · d / 4) quantizes values 4i..4i+4: lane i % 32 of the warp that takes
/// the group of 128 they fall in.
fn emit_act_quant_f8(b: &mut Body, d: usize, group: usize) {
    let i = b.open_guarded_gid();
    let c4 = b.ci64(4);
    let e = b.op(&format!("arith.muli {i}, {c4} : i64"));
    let c16 = b.ci64(16);
    let eb = b.op(&format!("arith.muli {i}, {c16} : i64"));
    let xs = b.load_vec("%x", &eb, 4, "f32", 16);
    let mut amax = b.cf32(0.0);
    for x in &xs {
        // (|v| by its bits: math.absf would call libdevice)
        let vb = b.op(&format!("arith.bitcast {x} : f32 to i32"));
        let cabs = b.op(&format!("arith.constant {} : i32", 0x7FFF_FFFF));
        let ab = b.op(&format!("arith.andi {vb}, {cabs} : i32"));
        let a = b.op(&format!("arith.bitcast {ab} : i32 to f32"));
        amax = b.op(&format!("arith.maximumf {amax}, {a} : f32"));
    }
    let amax = b.warp_reduce(&amax, "arith.maximumf");
    let qmax = b.cf32(448.0);
    let s = rn_f32(b, "div", &amax, &qmax);
    // (an all-zero group, or a non-finite one, is left as it is: scale 0, codes 0)
    let zero = b.cf32(0.0);
    let inf = b.cf32(f32::INFINITY);
    let pos = b.op(&format!("arith.cmpf ogt, {s}, {zero} : f32"));
    let fin = b.op(&format!("arith.cmpf olt, {s}, {inf} : f32"));
    let ok = b.op(&format!("arith.andi {pos}, {fin} : i1"));
    let one = b.cf32(1.0);
    let sd = b.op(&format!("arith.select {ok}, {s}, {one} : f32"));
    // each value's e4m3 code (the CPU's integer rounding: no FP8 instruction, so every target
    // runs it) and its value back in f32, s · e4m3
    let mut codes = vec![];
    let mut ys = vec![];
    for (j, x) in xs.iter().enumerate() {
        let q = rn_f32(b, "div", x, &sd);
        let code = f32_to_e4m3_bits(b, &q);
        let v = e4m3_bits_to_f32(b, &code);
        let dq = b.op(&format!("arith.mulf {sd}, {v} : f32"));
        ys.push(b.op(&format!("arith.select {ok}, {dq}, {} : f32", xs[j])));
        codes.push(code);
    }
    // (four codes, the first in the low byte)
    let mut w = codes[0].clone();
    for (j, code) in codes.iter().enumerate().skip(1) {
        let sh = b.op(&format!("arith.constant {} : i32", 8 * j));
        let c = b.op(&format!("arith.shli {code}, {sh} : i32"));
        w = b.op(&format!("arith.ori {w}, {c} : i32"));
    }
    let z = b.op("arith.constant 0 : i32");
    let w = b.op(&format!("arith.select {ok}, {w}, {z} : i32"));
    let yv = b.vector(&ys, "f32");
    let yp = b.op(&format!("llvm.getelementptr %y[{eb}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    b.line(&format!("llvm.store {yv}, {yp} {{alignment = 16 : i64}} : vector<4xf32>, !llvm.ptr<1>"));
    // the e4m3 copy: row r's bytes at r · (d + d/32), its scales after them
    let cd = b.ci64(d as i64);
    let row = b.op(&format!("arith.divui {e}, {cd} : i64"));
    let col = b.op(&format!("arith.remui {e}, {cd} : i64"));
    let stride = b.ci64((d + d / 32) as i64);
    let rb = b.op(&format!("arith.muli {row}, {stride} : i64"));
    let qb = b.op(&format!("arith.addi {rb}, {col} : i64"));
    let qp = b.op(&format!("llvm.getelementptr %q[{qb}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    b.line(&format!("llvm.store {w}, {qp} {{alignment = 4 : i64}} : i32, !llvm.ptr<1>"));
    let c31 = b.ci64(31);
    let lane = b.op(&format!("arith.andi {i}, {c31} : i64"));
    let c0 = b.ci64(0);
    let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : i64"));
    b.line(&format!("scf.if {first} {{"));
    let cg = b.ci64(group as i64);
    let gi = b.op(&format!("arith.divui {col}, {cg} : i64"));
    let go = b.op(&format!("arith.muli {gi}, {c4} : i64"));
    let so = b.op(&format!("arith.addi {rb}, {cd} : i64"));
    let so = b.op(&format!("arith.addi {so}, {go} : i64"));
    let sv = b.op(&format!("arith.select {ok}, {s}, {zero} : f32"));
    let sp = b.op(&format!("llvm.getelementptr %q[{so}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    b.line(&format!("llvm.store {sv}, {sp} : f32, !llvm.ptr<1>"));
    b.line("}");
    b.line("}");
}

/// The f32 value of the e4m3fn code `c` (i32, 0..=255; not NaN): normal codes by moving the
/// exponent and mantissa into f32's fields (bias 127 - 7), subnormals as m · 2^-9.
fn e4m3_bits_to_f32(b: &mut Body, c: &str) -> String {
    let c7f = b.op("arith.constant 127 : i32");
    let em = b.op(&format!("arith.andi {c}, {c7f} : i32"));
    let c20 = b.op("arith.constant 20 : i32");
    let nb = b.op(&format!("arith.shli {em}, {c20} : i32"));
    let bias = b.op(&format!("arith.constant {} : i32", 120 << 23));
    let nb = b.op(&format!("arith.addi {nb}, {bias} : i32"));
    let c8 = b.op("arith.constant 8 : i32");
    let is_sub = b.op(&format!("arith.cmpi ult, {em}, {c8} : i32"));
    let mf = b.op(&format!("arith.uitofp {em} : i32 to f32"));
    let tiny = b.cf32(1.0 / 512.0);
    let sub = b.op(&format!("arith.mulf {mf}, {tiny} : f32"));
    let sb = b.op(&format!("arith.bitcast {sub} : f32 to i32"));
    let bits = b.op(&format!("arith.select {is_sub}, {sb}, {nb} : i32"));
    let c80 = b.op("arith.constant 128 : i32");
    let sign = b.op(&format!("arith.andi {c}, {c80} : i32"));
    let c24 = b.op("arith.constant 24 : i32");
    let sign = b.op(&format!("arith.shli {sign}, {c24} : i32"));
    let bits = b.op(&format!("arith.ori {bits}, {sign} : i32"));
    b.op(&format!("arith.bitcast {bits} : i32 to f32"))
}

/// The FP8 GEMM (see the module notes). x is the `{x}@rows{W}` copy (row stride K + K/32
/// bytes), W f8g128 (row stride K / 512 · 528 bytes).
fn emit_gemm_f8(b: &mut Body, k: usize, residual: bool, bn: usize, stages: usize) {
    let ahead = stages as i64 - 1;
    let stage_bytes = f8_stage_bytes(bn) as i64;
    let (x_off, w_off) = (0i64, (F8_BM * 128) as i64);
    let sx_off = w_off + (bn * 128) as i64;
    let sw_off = sx_off + 4 * F8_BM as i64;
    let nk = (k / 128) as i64;
    let nacc = bn / 2;
    let base = b.smem_base_1k();
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let t = b.idx64(&t);
    let bx = b.idx64(&bx);
    let by = b.idx64(&by);
    let cbn = b.ci64(bn as i64);
    let cbm = b.ci64(F8_BM as i64);
    let n0 = b.op(&format!("arith.muli {bx}, {cbn} : i64"));
    let m0 = b.op(&format!("arith.muli {by}, {cbm} : i64"));
    let c0 = b.ci64(0);
    let c7 = b.ci64(7);
    let c16 = b.ci64(16);
    let xint = b.op("llvm.ptrtoint %x : !llvm.ptr<1> to i64");
    let wint = b.op("llvm.ptrtoint %w : !llvm.ptr<1> to i64");
    let xstride = b.ci64((k + k / 32) as i64);
    let wstride = b.ci64((k / 512 * 528) as i64);
    // this thread's 16-byte copies: (global byte address at K step 0, byte offset in a stage,
    // bytes (16, or 0 past M / N: zero fill), whether W's (its step offset follows the
    // super-blocks))
    let mut slots: Vec<(String, String, String, bool)> = vec![];
    for (is_w, rows) in [(false, F8_BM), (true, bn)] {
        for i in 0..rows * 8 / 256 {
            let ci = b.ci64(256 * i as i64);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let c8 = b.ci64(8);
            let row = b.op(&format!("arith.divui {u}, {c8} : i64"));
            let ch = b.op(&format!("arith.remui {u}, {c8} : i64"));
            let (r0, lim, ptr, stride) = if is_w { (&n0, "%n", &wint, &wstride) } else { (&m0, "%m", &xint, &xstride) };
            let gr = b.op(&format!("arith.addi {r0}, {row} : i64"));
            let valid = b.op(&format!("arith.cmpi slt, {gr}, {lim} : i64"));
            let grs = b.op(&format!("arith.select {valid}, {gr}, {c0} : i64"));
            let ro = b.op(&format!("arith.muli {grs}, {stride} : i64"));
            let cb = b.op(&format!("arith.muli {ch}, {c16} : i64"));
            let g = b.op(&format!("arith.addi {ptr}, {ro} : i64"));
            let g = b.op(&format!("arith.addi {g}, {cb} : i64"));
            // (W: past the super-block's four scales)
            let g = if is_w { b.op(&format!("arith.addi {g}, {c16} : i64")) } else { g };
            let r8 = b.op(&format!("arith.andi {row}, {c7} : i64"));
            let pc = b.op(&format!("arith.xori {ch}, {r8} : i64"));
            let pcb = b.op(&format!("arith.muli {pc}, {c16} : i64"));
            let c128 = b.ci64(128);
            let rs = b.op(&format!("arith.muli {row}, {c128} : i64"));
            let so = b.op(&format!("arith.addi {rs}, {pcb} : i64"));
            let tile = b.ci64(if is_w { w_off } else { x_off });
            let so = b.op(&format!("arith.addi {so}, {tile} : i64"));
            let s16 = b.op("arith.constant 16 : i32");
            let s0 = b.op("arith.constant 0 : i32");
            let sz = b.op(&format!("arith.select {valid}, {s16}, {s0} : i32"));
            slots.push((g, so, sz, is_w));
        }
    }
    // the scales: thread t < 128 copies x row t's, 128 <= t < 128 + bn W row t - 128's (with
    // bn 64 the threads past them zero-fill slots of the stage's padding, which no one reads)
    let (scale_g, scale_so, scale_sz, scale_isw) = {
        let c128 = b.ci64(F8_BM as i64);
        let isw = b.op(&format!("arith.cmpi uge, {t}, {c128} : i64"));
        let wr = b.op(&format!("arith.subi {t}, {c128} : i64"));
        let row = b.op(&format!("arith.select {isw}, {wr}, {t} : i64"));
        let r0 = b.op(&format!("arith.select {isw}, {n0}, {m0} : i64"));
        let gr = b.op(&format!("arith.addi {r0}, {row} : i64"));
        let lim = b.op(&format!("arith.select {isw}, %n, %m : i64"));
        let inr = b.op(&format!("arith.cmpi slt, {gr}, {lim} : i64"));
        let cbnr = b.ci64(bn as i64);
        let wrow_ok = b.op(&format!("arith.cmpi ult, {row}, {cbnr} : i64"));
        let tru = b.op("arith.constant true");
        let notw = b.op(&format!("arith.xori {isw}, {tru} : i1"));
        let mine = b.op(&format!("arith.ori {notw}, {wrow_ok} : i1"));
        let valid = b.op(&format!("arith.andi {inr}, {mine} : i1"));
        let grs = b.op(&format!("arith.select {valid}, {gr}, {c0} : i64"));
        let stride = b.op(&format!("arith.select {isw}, {wstride}, {xstride} : i64"));
        let ptr = b.op(&format!("arith.select {isw}, {wint}, {xint} : i64"));
        let ro = b.op(&format!("arith.muli {grs}, {stride} : i64"));
        let g = b.op(&format!("arith.addi {ptr}, {ro} : i64"));
        // (x: past the row's K bytes; W: the super-block's first scale)
        let ck = b.ci64(k as i64);
        let xo = b.op(&format!("arith.select {isw}, {c0}, {ck} : i64"));
        let g = b.op(&format!("arith.addi {g}, {xo} : i64"));
        let c4 = b.ci64(4);
        let rb = b.op(&format!("arith.muli {row}, {c4} : i64"));
        let cso = b.ci64(sx_off);
        let csw = b.ci64(sw_off);
        let tile = b.op(&format!("arith.select {isw}, {csw}, {cso} : i64"));
        let so = b.op(&format!("arith.addi {tile}, {rb} : i64"));
        let s4 = b.op("arith.constant 4 : i32");
        let s0 = b.op("arith.constant 0 : i32");
        let sz = b.op(&format!("arith.select {valid}, {s4}, {s0} : i32"));
        (g, so, sz, isw)
    };
    // issue the copies of K step `ks` into stage `st`
    let issue = |b: &mut Body, ks: &str, st: &str| {
        let csb = b.ci64(stage_bytes);
        let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
        let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
        // x: + ks · 128; W: + (ks / 4) · 528 + (ks % 4) · 128; x scale: + ks · 4; W scale:
        // + (ks / 4) · 528 + (ks % 4) · 4
        let c2 = b.ci64(2);
        let c3 = b.ci64(3);
        let sbk = b.op(&format!("arith.shrui {ks}, {c2} : i64"));
        let kin = b.op(&format!("arith.andi {ks}, {c3} : i64"));
        let c528 = b.ci64(528);
        let sbo = b.op(&format!("arith.muli {sbk}, {c528} : i64"));
        let c128 = b.ci64(128);
        let c4 = b.ci64(4);
        let xo = b.op(&format!("arith.muli {ks}, {c128} : i64"));
        let wi = b.op(&format!("arith.muli {kin}, {c128} : i64"));
        let wo = b.op(&format!("arith.addi {sbo}, {wi} : i64"));
        let xso = b.op(&format!("arith.muli {ks}, {c4} : i64"));
        let wsi = b.op(&format!("arith.muli {kin}, {c4} : i64"));
        let wso = b.op(&format!("arith.addi {sbo}, {wsi} : i64"));
        let so_scale = b.op(&format!("arith.select {scale_isw}, {wso}, {xso} : i64"));
        let all = slots.iter().map(|(g, so, sz, is_w)| (g, so, sz, if *is_w { &wo } else { &xo }, 16)).chain([(&scale_g, &scale_so, &scale_sz, &so_scale, 4)]);
        for (g, so, sz, off, n) in all {
            let ga = b.op(&format!("arith.addi {g}, {off} : i64"));
            let sa = b.op(&format!("arith.addi {sb}, {so} : i64"));
            let sa = b.op(&format!("arith.trunci {sa} : i64 to i32"));
            let kind = if n == 4 { "ca" } else { "cg" };
            b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.{kind}.shared.global [$0], [$1], {n}, $2;\", \"r,l,r\" {sa}, {ga}, {sz} : (i32, i64, i32) -> ()"));
        }
    };
    let commit = "llvm.inline_asm has_side_effects \"cp.async.commit_group;\", \"\" : () -> ()";
    for s in 0..ahead {
        let ks = b.ci64(s);
        if s < nk {
            issue(b, &ks, &ks);
        }
        b.line(commit);
    }
    // this thread's accumulator rows (of the block's 128) and columns: warp w (of 8) rows
    // 16w + g, + 8; columns 8j + 2tq, + 1
    let (warp, _, g, tq) = b.mma_coords(&t);
    let wr = b.op(&format!("arith.muli {warp}, {c16} : i64"));
    let r0 = b.op(&format!("arith.addi {wr}, {g} : i64"));
    let c128t = b.ci64(128);
    let wg = b.op(&format!("arith.divui {t}, {c128t} : i64"));
    let c8k = b.ci64(8192);
    let wg_off = b.op(&format!("arith.muli {wg}, {c8k} : i64"));
    let c4 = b.ci64(4);
    let c2 = b.ci64(2);
    let sxa = b.op(&format!("arith.muli {r0}, {c4} : i64"));
    let tq2 = b.op(&format!("arith.muli {tq}, {c2} : i64"));
    let swa = b.op(&format!("arith.muli {tq2}, {c4} : i64"));
    let zero = b.cf32(0.0);
    let f32s = vec!["f32"; 2 * nacc].join(", ");
    let cst = b.ci64(stages as i64);
    let cnk = b.ci64(nk);
    let cah = b.ci64(ahead);
    let csb = b.ci64(stage_bytes);
    let fixed = SW128_K_DESC;
    let zi = b.op("arith.constant 0 : index");
    let ni = b.op(&format!("arith.constant {nk} : index"));
    let oi = b.op("arith.constant 1 : index");
    let res = b.v();
    let kv = b.v();
    let carried: Vec<String> = (0..2 * nacc).map(|_| b.v()).collect();
    b.line(&format!("{res}:{} = scf.for {kv} = {zi} to {ni} step {oi} iter_args({}) -> ({f32s}) {{", 2 * nacc, carried.iter().map(|a| format!("{a} = {zero}")).collect::<Vec<_>>().join(", ")));
    let kt = b.idx64(&kv);
    let (acc, tmp) = carried.split_at(nacc);
    b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.wait_group {};\", \"\" : () -> ()", ahead - 1));
    b.line("llvm.inline_asm has_side_effects \"fence.proxy.async.shared::cta;\", \"\"  : () -> ()");
    b.line("gpu.barrier");
    let kn = b.op(&format!("arith.addi {kt}, {cah} : i64"));
    let more = b.op(&format!("arith.cmpi slt, {kn}, {cnk} : i64"));
    b.line(&format!("scf.if {more} {{"));
    let stn = b.op(&format!("arith.remui {kn}, {cst} : i64"));
    issue(b, &kn, &stn);
    b.line("}");
    b.line(commit);
    let st = b.op(&format!("arith.remui {kt}, {cst} : i64"));
    let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
    let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
    let xo = b.op(&format!("arith.addi {sb}, {wg_off} : i64"));
    let xd = b.smem_desc(&xo, fixed);
    let cw = b.ci64(w_off);
    let wb = b.op(&format!("arith.addi {sb}, {cw} : i64"));
    let wd = b.smem_desc(&wb, fixed);
    b.line("llvm.inline_asm has_side_effects \"wgmma.fence.sync.aligned;\", \"\"  : () -> ()");
    let mut cur = tmp.to_vec();
    for s in 0..4usize {
        let ds = b.ci64(2 * s as i64);
        let a = b.op(&format!("arith.addi {xd}, {ds} : i64"));
        let d = b.op(&format!("arith.addi {wd}, {ds} : i64"));
        cur = wgmma_f8(b, bn, &cur, &a, &d, s > 0);
    }
    b.line("llvm.inline_asm has_side_effects \"wgmma.commit_group.sync.aligned;\", \"\"  : () -> ()");
    let cur = b.wgmma_wait(0, &cur);
    // promotion: acc += step · sx[row] · sw[col]
    let sxb = b.op(&format!("arith.addi {sb}, {sxa} : i64"));
    let csx = b.ci64(sx_off);
    let sxb = b.op(&format!("arith.addi {sxb}, {csx} : i64"));
    let sx0 = smem_f32(b, &sxb, 0);
    let sx1 = smem_f32(b, &sxb, 32);
    let swb = b.op(&format!("arith.addi {sb}, {swa} : i64"));
    let csw = b.ci64(sw_off);
    let swb = b.op(&format!("arith.addi {swb}, {csw} : i64"));
    let mut next = vec![];
    for j in 0..bn / 8 {
        let cj = b.ci64(32 * j as i64);
        let p = b.op(&format!("arith.addi {swb}, {cj} : i64"));
        let p = b.op(&format!("arith.trunci {p} : i64 to i32"));
        let p = b.op(&format!("llvm.inttoptr {p} : i32 to !llvm.ptr<3>"));
        let v = b.op(&format!("llvm.load {p} {{alignment = 8 : i64}} : !llvm.ptr<3> -> vector<2xf32>"));
        let sw = b.elements(&v, 2, "f32");
        for q in 0..4 {
            let sx = if q < 2 { &sx0 } else { &sx1 };
            let sc = b.op(&format!("arith.mulf {sx}, {} : f32", sw[q % 2]));
            let i = 4 * j + q;
            next.push(b.op(&format!("llvm.intr.fma({}, {sc}, {}) : (f32, f32, f32) -> f32", cur[i], acc[i])));
        }
    }
    b.line(&format!("scf.yield {}, {} : {f32s}", next.join(", "), cur.join(", ")));
    b.line("}");
    let acc: Vec<String> = (0..nacc).map(|i| format!("{res}#{i}")).collect();
    b.line("llvm.inline_asm has_side_effects \"cp.async.wait_group 0;\", \"\" : () -> ()");
    let ra = b.op(&format!("arith.addi {m0}, {r0} : i64"));
    b.store_d_tile(&ra, &n0, &tq, bn, &acc, false, residual, 4);
}

/// The f32 at shared byte address `a` (i64) + `off`.
fn smem_f32(b: &mut Body, a: &str, off: i64) -> String {
    let c = b.ci64(off);
    let p = b.op(&format!("arith.addi {a}, {c} : i64"));
    let p = b.op(&format!("arith.trunci {p} : i64 to i32"));
    let p = b.op(&format!("llvm.inttoptr {p} : i32 to !llvm.ptr<3>"));
    b.op(&format!("llvm.load {p} : !llvm.ptr<3> -> f32"))
}

/// One `wgmma.mma_async m64n{bn}k32.f32.e4m3.e4m3` with both operands from shared memory:
/// `acc` += A · B where `accumulate`, else acc = A · B (scale-d 0).
fn wgmma_f8(b: &mut Body, bn: usize, acc: &[String], a_desc: &str, b_desc: &str, accumulate: bool) -> Vec<String> {
    let n = acc.len();
    let f32s = vec!["f32"; n].join(", ");
    let stt = format!("!llvm.struct<({f32s})>");
    let outs: Vec<String> = (0..n).map(|i| format!("${i}")).collect();
    let tied = (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
    let r = b.op(&format!(
        "llvm.inline_asm has_side_effects \"wgmma.mma_async.sync.aligned.m64n{bn}k32.f32.e4m3.e4m3 {{{}}}, ${n}, ${}, {}, 1, 1;\", \"{},l,l,{tied}\" {a_desc}, {b_desc}, {} : (i64, i64, {f32s}) -> {stt}",
        outs.join(","),
        n + 1,
        accumulate as u8,
        vec!["=f"; n].join(","),
        acc.join(", ")
    ));
    (0..n).map(|i| b.op(&format!("llvm.extractvalue {r}[{i}] : {stt}"))).collect()
}
