//! GGUF's K-quants (Q4_K, Q5_K, Q6_K: 256-value super-blocks) and 5-bit blocks (Q5_0, Q5_1:
//! blocks of 32) on the GPU, read as stored — the formats of the GGUF files people download
//! (a Q4_K_M is Q4_K and Q6_K, with Q5_0 where rows are not whole super-blocks).
//!
//! - [`kquant_elem`]: one value at a flat element index, as f32 — what the gathers (embedding
//!   rows) and the tensor-core kernels' weight staging (`Body::weight_elem`) read.
//! - [`kquant_unit`]: a 32-value unit's dot product with x for the warp-per-output decode GEMV
//!   (`KernelSpec::MatMul`, a lane per unit): Q4_K / Q5_K unit j of a super-block is its
//!   sub-block j (d·sc_j and dmin·m_j decoded once: d·sc_j·Σq·x − dmin·m_j·Σx), Q6_K's unit is
//!   two 16-value sub-blocks with their signed scales, Q5_0 / Q5_1 a block.
//!
//! Values are ggml's (`dequantize_row_q*`; the CPU executor's `dsc_ir::quant::decode`, equal to
//! the `gguf` package's bit for bit): Q4_K d·sc·q − dmin·m (q 4 bits, +16 from the fifth bit in
//! Q5_K), Q6_K d·sc·(q − 32) (q 6 bits: 4 from `ql`, 2 from `qh`), Q5_0 d·(q − 16), Q5_1 d·q + m.
//! Q6_K's 210-byte and Q5_0's 22-byte blocks are only 2-byte aligned: their words load with
//! `alignment = 2` (LLVM splits them into 16-bit loads).

use crate::kernels::*;

/// Warps per block of the K-quant decode GEMV, and the output rows each warp computes (x's 32
/// values of a unit loaded once for all of them).
pub const KQ_WARPS: usize = 4;
pub const KQ_OUTPUTS_PER_WARP: usize = 4;

/// How the runtime launches the K-quant decode GEMV: 16 outputs a block, a block per x row.
pub(crate) fn kquant_launch() -> Launch {
    Launch::OutputsPerBlock { outputs: (KQ_WARPS * KQ_OUTPUTS_PER_WARP) as u32, rows: 1, warps: KQ_WARPS as u32 }
}

/// The decode GEMV over K-quant / 5-bit weights (`KernelSpec::MatMul`): y[row, n] = x[row] ·
/// W[n] for the block's 16 outputs, a warp per 4 of them; lane l takes the 32-value units l,
/// l + 32, ... of K, loads x's values there once (f32, and their sum) and dots them with the
/// unit in each of its 4 rows ([`kquant_unit`]); warp sums, lane 0 stores.
pub(crate) fn emit_kquant_gemv(b: &mut Body, k: usize, dtype: DType, bias: bool, residual: bool) {
    let r = KQ_OUTPUTS_PER_WARP;
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (bx64, row, warp64) = (b.idx64(&bx), b.idx64(&by), b.idx64(&warp));
    let c0 = bin64(b, "muli", &bx64, (KQ_WARPS * r) as i64);
    let w0 = bin64(b, "muli", &warp64, r as i64);
    let col0 = b.op(&format!("arith.addi {c0}, {w0} : i64"));
    let nlast = bin64(b, "subi", "%n", 1);
    // (rows past N read the last row, and are not stored)
    let cols: Vec<String> = (0..r)
        .map(|i| {
            let c = addc(b, &col0, i as i64);
            b.op(&format!("arith.minsi {c}, {nlast} : i64"))
        })
        .collect();
    let units = k / 32;
    let zero = b.cf32(0.0);
    let (res, u, accs) = (b.v(), b.v(), (0..r).map(|_| b.v()).collect::<Vec<_>>());
    let hi = b.op(&format!("arith.constant {units} : index"));
    let st = b.op("arith.constant 32 : index");
    let tys = vec!["f32"; r].join(", ");
    b.line(&format!("{res}:{r} = scf.for {u} = {lane} to {hi} step {st} iter_args({}) -> ({tys}) {{", accs.iter().map(|a| format!("{a} = {zero}")).collect::<Vec<_>>().join(", ")));
    let u64 = b.idx64(&u);
    // x's 32 values of the unit (rows 128-byte aligned: K % 32 == 0), and their sum
    let xe = bin64(b, "muli", &row, k as i64);
    let ue = bin64(b, "muli", &u64, 32);
    let xe = b.op(&format!("arith.addi {xe}, {ue} : i64"));
    let xbyte = bin64(b, "muli", &xe, 4);
    let xs = b.load_f32s("%x", &xbyte, 32);
    let mut s4 = vec![zero.clone(); 4];
    for (e, x) in xs.iter().enumerate() {
        s4[e % 4] = b.op(&format!("arith.addf {}, {x} : f32", s4[e % 4]));
    }
    let sx = b.sum4(&s4);
    let next: Vec<String> = (0..r)
        .map(|i| {
            let p = kquant_unit(b, dtype, k, &cols[i], &u64, &xs, &sx);
            b.op(&format!("arith.addf {}, {p} : f32", accs[i]))
        })
        .collect();
    b.line(&format!("scf.yield {} : {tys}", next.join(", ")));
    b.line("}");
    let lane32 = b.op(&format!("arith.index_cast {lane} : index to i32"));
    let parts: Vec<String> = (0..r).map(|i| format!("{res}#{i}")).collect();
    let totals = b.warp_sums(&parts, &lane32);
    let z = b.op("arith.constant 0 : index");
    let first = b.op(&format!("arith.cmpi eq, {lane}, {z} : index"));
    b.line(&format!("scf.if {first} {{"));
    for (i, tot) in totals.iter().enumerate() {
        let c = addc(b, &col0, i as i64);
        let ok = b.op(&format!("arith.cmpi slt, {c}, %n : i64"));
        b.line(&format!("scf.if {ok} {{"));
        b.matmul_store(tot, &row, &c, bias, residual);
        b.line("}");
    }
    b.line("}");
}

/// The formats of this file.
pub fn kquant_dtype(d: DType) -> bool {
    matches!(d, DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::Q5_0 | DType::Q5_1)
}

/// What the K-quant decode GEMV takes: rows of whole blocks (super-blocks of 256 for the K-quants).
pub(crate) fn kquant_fits(k: usize, wdtype: DType) -> Result<(), String> {
    if !kquant_dtype(wdtype) {
        return Err(format!("{wdtype} is not a K-quant or 5-bit GGUF format"));
    }
    let per = wdtype.block().0;
    if k == 0 || k % per != 0 {
        return Err(format!("{wdtype} rows are whole blocks of {per} values, got K = {k}"));
    }
    Ok(())
}

fn addc(b: &mut Body, a: &str, c: i64) -> String {
    if c == 0 {
        return a.to_string();
    }
    let c = b.ci64(c);
    b.op(&format!("arith.addi {a}, {c} : i64"))
}

fn bin64(b: &mut Body, op: &str, a: &str, c: i64) -> String {
    let c = b.ci64(c);
    b.op(&format!("arith.{op} {a}, {c} : i64"))
}

fn bin32(b: &mut Body, op: &str, a: &str, c: i64) -> String {
    let c = b.op(&format!("arith.constant {c} : i32"));
    b.op(&format!("arith.{op} {a}, {c} : i32"))
}

/// `(v >> s) & mask` on i32, `s` an i32 value
fn field(b: &mut Body, v: &str, s: &str, mask: i64) -> String {
    let sh = b.op(&format!("arith.shrui {v}, {s} : i32"));
    bin32(b, "andi", &sh, mask)
}

/// i64 index as the i32 shift amount
fn shift32(b: &mut Body, v: &str) -> String {
    b.op(&format!("arith.trunci {v} : i64 to i32"))
}

fn u2f(b: &mut Body, v: &str) -> String {
    b.op(&format!("arith.uitofp {v} : i32 to f32"))
}

fn s2f(b: &mut Body, v: &str) -> String {
    b.op(&format!("arith.sitofp {v} : i32 to f32"))
}

/// the signed byte (bits 0..8 of `v`, i32) as f32
fn i8f(b: &mut Body, v: &str) -> String {
    let t = b.op(&format!("arith.trunci {v} : i32 to i8"));
    let w = b.op(&format!("arith.extsi {t} : i8 to i32"));
    s2f(b, &w)
}

/// Q4_K / Q5_K sub-block `j`'s (scale, min) as 6-bit i32 from the 12 scale bytes' words
/// `s = [s0..3, s4..7, s8..11]` (`dsc_ir::quant`'s `k_scale_min`): j < 4 the low 6 bits of bytes
/// j and j + 4; else the nibbles of byte j + 4 with the top bits of bytes j − 4 and j.
fn k_scale_min(b: &mut Body, s: &[String; 3], j: &str) -> (String, String) {
    let j4 = bin64(b, "remui", j, 4);
    let sh = bin64(b, "muli", &j4, 8);
    let sh = shift32(b, &sh);
    let a = field(b, &s[0], &sh, 0xFF);
    let bb = field(b, &s[1], &sh, 0xFF);
    let c = field(b, &s[2], &sh, 0xFF);
    let lo_sc = bin32(b, "andi", &a, 63);
    let lo_mn = bin32(b, "andi", &bb, 63);
    let hi_sc = {
        let n = bin32(b, "andi", &c, 0xF);
        let t = bin32(b, "shrui", &a, 2);
        let t = bin32(b, "andi", &t, 0x30);
        b.op(&format!("arith.ori {n}, {t} : i32"))
    };
    let hi_mn = {
        let n = bin32(b, "shrui", &c, 4);
        let t = bin32(b, "shrui", &bb, 2);
        let t = bin32(b, "andi", &t, 0x30);
        b.op(&format!("arith.ori {n}, {t} : i32"))
    };
    let c4 = b.ci64(4);
    let low = b.op(&format!("arith.cmpi ult, {j}, {c4} : i64"));
    let sc = b.op(&format!("arith.select {low}, {lo_sc}, {hi_sc} : i32"));
    let mn = b.op(&format!("arith.select {low}, {lo_mn}, {hi_mn} : i32"));
    (sc, mn)
}

/// Byte offset of Q4_K / Q5_K sub-block `j`'s quants (i64) from `at` (a super-block's start, or a
/// lane's place in it): chunk j / 2 of the 128 nibble bytes, past the header (and Q5_K's qh).
fn k_quants_at(b: &mut Body, at: &str, j: &str, five: bool) -> String {
    let jh = bin64(b, "divui", j, 2);
    let jo = bin64(b, "muli", &jh, 32);
    let o = addc(b, at, if five { 48 } else { 16 });
    b.op(&format!("arith.addi {o}, {jo} : i64"))
}

/// Byte offset of a Q6_K unit's high bits from `at` (a super-block's start, or a lane's place
/// in it), `h` (i64) its half of the super-block: qh bytes 128 + 32h.
fn q6_k_qh_at(b: &mut Body, at: &str, h: &str) -> String {
    let h32 = bin64(b, "muli", h, 32);
    let o = addc(b, at, 128);
    b.op(&format!("arith.addi {o}, {h32} : i64"))
}

/// One value of a K-quant / 5-bit weight at flat element `e` (i64) of `ptr`, as f32.
pub(crate) fn kquant_elem(b: &mut Body, ptr: &str, e: &str, dtype: DType) -> String {
    let (per, bytes) = dtype.block();
    let blk = bin64(b, "divui", e, per as i64);
    let r = bin64(b, "remui", e, per as i64);
    let base = bin64(b, "muli", &blk, bytes as i64);
    let byte = |b: &mut Body, off: &str| b.u8_at_byte(ptr, off);
    match dtype {
        DType::Q5_0 | DType::Q5_1 => {
            let one = dtype == DType::Q5_1;
            let d = b.f16_at_byte(ptr, &base);
            let at = if one { 4 } else { 2 };
            // the fifth bit: bit r of qh (byte r / 8, bit r % 8)
            let qhb = bin64(b, "divui", &r, 8);
            let o = addc(b, &base, at);
            let o = b.op(&format!("arith.addi {o}, {qhb} : i64"));
            let hb = byte(b, &o);
            let bit = bin64(b, "remui", &r, 8);
            let bit = shift32(b, &bit);
            let h = field(b, &hb, &bit, 1);
            let h = bin32(b, "shli", &h, 4);
            // the nibble: byte r % 16 of qs, high half for r >= 16
            let jm = bin64(b, "remui", &r, 16);
            let o = addc(b, &base, at + 4);
            let o = b.op(&format!("arith.addi {o}, {jm} : i64"));
            let qb = byte(b, &o);
            let half = bin64(b, "divui", &r, 16);
            let sh = bin64(b, "muli", &half, 4);
            let sh = shift32(b, &sh);
            let q = field(b, &qb, &sh, 0xF);
            let q = b.op(&format!("arith.ori {q}, {h} : i32"));
            let qf = u2f(b, &q);
            if one {
                let mo = addc(b, &base, 2);
                let m = b.f16_at_byte(ptr, &mo);
                b.op(&format!("llvm.intr.fma({d}, {qf}, {m}) : (f32, f32, f32) -> f32"))
            } else {
                let c16 = b.cf32(16.0);
                let q16 = b.op(&format!("arith.subf {qf}, {c16} : f32"));
                b.op(&format!("arith.mulf {d}, {q16} : f32"))
            }
        }
        DType::Q4_K | DType::Q5_K => {
            let five = dtype == DType::Q5_K;
            let d = b.f16_at_byte(ptr, &base);
            let o = addc(b, &base, 2);
            let dmin = b.f16_at_byte(ptr, &o);
            let j = bin64(b, "divui", &r, 32);
            let i = bin64(b, "remui", &r, 32);
            let o = addc(b, &base, 4);
            let s = b.load_vec(ptr, &o, 3, "i32", 4);
            let (sc, mn) = k_scale_min(b, &[s[0].clone(), s[1].clone(), s[2].clone()], &j);
            // the nibble: byte 32 (j / 2) + i of qs, high half for odd j
            let o = k_quants_at(b, &base, &j, five);
            let o = b.op(&format!("arith.addi {o}, {i} : i64"));
            let qb = byte(b, &o);
            let odd = bin64(b, "remui", &j, 2);
            let sh = bin64(b, "muli", &odd, 4);
            let sh = shift32(b, &sh);
            let mut q = field(b, &qb, &sh, 0xF);
            if five {
                // bit j of qh byte i
                let o = addc(b, &base, 16);
                let o = b.op(&format!("arith.addi {o}, {i} : i64"));
                let hb = byte(b, &o);
                let js = shift32(b, &j);
                let h = field(b, &hb, &js, 1);
                let h = bin32(b, "shli", &h, 4);
                q = b.op(&format!("arith.ori {q}, {h} : i32"));
            }
            let (scf, mnf, qf) = (u2f(b, &sc), u2f(b, &mn), u2f(b, &q));
            let dj = b.op(&format!("arith.mulf {d}, {scf} : f32"));
            let mj = b.op(&format!("arith.mulf {dmin}, {mnf} : f32"));
            let v = b.op(&format!("arith.mulf {dj}, {qf} : f32"));
            b.op(&format!("arith.subf {v}, {mj} : f32"))
        }
        DType::Q6_K => {
            // halves of 128: ql's 64 bytes low nibbles then high; qh's 32 bytes four 2-bit fields
            let h = bin64(b, "divui", &r, 128);
            let rr = bin64(b, "remui", &r, 128);
            let r64 = bin64(b, "remui", &rr, 64);
            let h64 = bin64(b, "muli", &h, 64);
            let o = b.op(&format!("arith.addi {base}, {h64} : i64"));
            let o = b.op(&format!("arith.addi {o}, {r64} : i64"));
            let lb = byte(b, &o);
            let q4 = bin64(b, "divui", &rr, 64);
            let sh = bin64(b, "muli", &q4, 4);
            let sh = shift32(b, &sh);
            let low = field(b, &lb, &sh, 0xF);
            let r32 = bin64(b, "remui", &rr, 32);
            let h32 = bin64(b, "muli", &h, 32);
            let o = addc(b, &base, 128);
            let o = b.op(&format!("arith.addi {o}, {h32} : i64"));
            let o = b.op(&format!("arith.addi {o}, {r32} : i64"));
            let hb = byte(b, &o);
            let q2 = bin64(b, "divui", &rr, 32);
            let sh = bin64(b, "muli", &q2, 2);
            let sh = shift32(b, &sh);
            let high = field(b, &hb, &sh, 3);
            let high = bin32(b, "shli", &high, 4);
            let q = b.op(&format!("arith.ori {low}, {high} : i32"));
            let q = bin32(b, "subi", &q, 32);
            let qf = s2f(b, &q);
            let si = bin64(b, "divui", &r, 16);
            let o = addc(b, &base, 192);
            let o = b.op(&format!("arith.addi {o}, {si} : i64"));
            let sb = byte(b, &o);
            let scf = i8f(b, &sb);
            let o = addc(b, &base, 208);
            let d = b.f16_at_byte(ptr, &o);
            let ds = b.op(&format!("arith.mulf {d}, {scf} : f32"));
            b.op(&format!("arith.mulf {ds}, {qf} : f32"))
        }
        other => unreachable!("{other} is not a K-quant (kquant_fits)"),
    }
}

/// Σ_i q_i x_i over a unit's values (`q` i32, `xs` f32), as four partial sums
fn dots(b: &mut Body, q: &[String], xs: &[String], signed: bool) -> Vec<String> {
    let zero = b.cf32(0.0);
    let mut sq = vec![zero; 4];
    for (e, (qe, x)) in q.iter().zip(xs).enumerate() {
        let qf = if signed { s2f(b, qe) } else { u2f(b, qe) };
        sq[e % 4] = b.op(&format!("llvm.intr.fma({qf}, {x}, {}) : (f32, f32, f32) -> f32", sq[e % 4]));
    }
    sq
}

/// `n` little-endian words at byte offset `off` of `ptr`, `align` the alignment it has
fn words(b: &mut Body, ptr: &str, off: &str, n: usize, align: usize) -> Vec<String> {
    if align >= 16 && n % 4 == 0 {
        let mut v = vec![];
        for q in 0..n / 4 {
            let o = addc(b, off, 16 * q as i64);
            v.extend(b.load_vec(ptr, &o, 4, "i32", 16));
        }
        v
    } else {
        b.load_vec(ptr, off, n, "i32", align)
    }
}

/// Byte `i` (0..4 · words) of little-endian `words` shifted right by `extra` (an i32 value or a
/// constant), masked: the field of value i in the K-quant layouts.
fn byte_field(b: &mut Body, words: &[String], i: usize, extra: Option<&str>, mask: i64) -> String {
    let w = &words[i / 4];
    let c = b.op(&format!("arith.constant {} : i32", 8 * (i % 4)));
    let s = match extra {
        Some(e) => b.op(&format!("arith.addi {c}, {e} : i32")),
        None => c,
    };
    field(b, w, &s, mask)
}

/// The dot product of x's 32 values `xs` (their sum `sx`) with unit `unit` (i64, 0..K/32) of
/// weight row `col` (i64) in `dtype` (a K-quant or Q5_0 / Q5_1) of `%w`, as f32.
fn kquant_unit(b: &mut Body, dtype: DType, k: usize, col: &str, unit: &str, xs: &[String], sx: &str) -> String {
    let (per, bytes) = dtype.block();
    let row_bytes = (k / per * bytes) as i64;
    let rbase = bin64(b, "muli", col, row_bytes);
    match dtype {
        DType::Q5_0 | DType::Q5_1 => {
            let one = dtype == DType::Q5_1;
            let o = bin64(b, "muli", unit, bytes as i64);
            let base = b.op(&format!("arith.addi {rbase}, {o} : i64"));
            // (Q5_1's 24-byte blocks are 4-byte aligned, Q5_0's 22-byte ones 2-byte)
            let al = if one { 4 } else { 2 };
            let hdr = words(b, "%w", &base, if one { 6 } else { 1 }, al);
            let (d, m, qh, qs) = if one {
                let [d, m] = b.f16_pair(&hdr[0]);
                (d, Some(m), hdr[1].clone(), hdr[2..6].to_vec())
            } else {
                let d = b.f16_at_byte("%w", &base);
                let o = addc(b, &base, 2);
                let w = words(b, "%w", &o, 5, 2);
                (d, None, w[0].clone(), w[1..5].to_vec())
            };
            let q: Vec<String> = (0..32)
                .map(|j| {
                    let nib = {
                        let w = &qs[(j % 16) / 4];
                        let s = b.op(&format!("arith.constant {} : i32", 8 * ((j % 16) % 4) + 4 * (j / 16)));
                        field(b, w, &s, 0xF)
                    };
                    let s = b.op(&format!("arith.constant {j} : i32"));
                    let h = field(b, &qh, &s, 1);
                    let h = bin32(b, "shli", &h, 4);
                    b.op(&format!("arith.ori {nib}, {h} : i32"))
                })
                .collect();
            let sq = dots(b, &q, xs, false);
            let sq = b.sum4(&sq);
            let dq = b.op(&format!("arith.mulf {d}, {sq} : f32"));
            match m {
                // d Σqx + m Σx
                Some(m) => b.op(&format!("llvm.intr.fma({m}, {sx}, {dq}) : (f32, f32, f32) -> f32")),
                // d (Σqx − 16 Σx)
                None => {
                    let c = b.cf32(-16.0);
                    let t = b.op(&format!("arith.mulf {sx}, {c} : f32"));
                    let t = b.op(&format!("arith.mulf {d}, {t} : f32"));
                    b.op(&format!("arith.addf {dq}, {t} : f32"))
                }
            }
        }
        DType::Q4_K | DType::Q5_K => {
            let five = dtype == DType::Q5_K;
            let sb = bin64(b, "divui", unit, 8);
            let j = bin64(b, "remui", unit, 8);
            let o = bin64(b, "muli", &sb, bytes as i64);
            let base = b.op(&format!("arith.addi {rbase}, {o} : i64"));
            // (144- and 176-byte super-blocks: 16-byte aligned) d, dmin, the 12 scale bytes
            let hdr = words(b, "%w", &base, 4, 16);
            let [d, dmin] = b.f16_pair(&hdr[0]);
            let (sc, mn) = k_scale_min(b, &[hdr[1].clone(), hdr[2].clone(), hdr[3].clone()], &j);
            let qo = k_quants_at(b, &base, &j, five);
            let qw = words(b, "%w", &qo, 8, 16);
            let odd = bin64(b, "remui", &j, 2);
            let sh = bin64(b, "muli", &odd, 4);
            let sh = shift32(b, &sh);
            let hw = if five {
                let o = addc(b, &base, 16);
                Some(words(b, "%w", &o, 8, 16))
            } else {
                None
            };
            let js = shift32(b, &j);
            let q: Vec<String> = (0..32)
                .map(|i| {
                    let q = byte_field(b, &qw, i, Some(&sh), 0xF);
                    match &hw {
                        Some(hw) => {
                            let h = byte_field(b, hw, i, Some(&js), 1);
                            let h = bin32(b, "shli", &h, 4);
                            b.op(&format!("arith.ori {q}, {h} : i32"))
                        }
                        None => q,
                    }
                })
                .collect();
            let sq = dots(b, &q, xs, false);
            let sq = b.sum4(&sq);
            // d·sc Σqx − dmin·m Σx
            let (scf, mnf) = (u2f(b, &sc), u2f(b, &mn));
            let dj = b.op(&format!("arith.mulf {d}, {scf} : f32"));
            let mj = b.op(&format!("arith.mulf {dmin}, {mnf} : f32"));
            let a = b.op(&format!("arith.mulf {dj}, {sq} : f32"));
            let t = b.op(&format!("arith.mulf {mj}, {sx} : f32"));
            b.op(&format!("arith.subf {a}, {t} : f32"))
        }
        DType::Q6_K => {
            let sb = bin64(b, "divui", unit, 8);
            let u = bin64(b, "remui", unit, 8);
            let o = bin64(b, "muli", &sb, bytes as i64);
            let base = b.op(&format!("arith.addi {rbase}, {o} : i64"));
            // unit u: half h = u / 4; ql bytes 64h + 32 (u % 2) + i, nibble (u % 4) / 2; qh
            // bytes 128 + 32h + i, field u % 4; scales 192 + 2u, + 1; d at 208
            let h = bin64(b, "divui", &u, 4);
            let h64 = bin64(b, "muli", &h, 64);
            let u2 = bin64(b, "remui", &u, 2);
            let u32o = bin64(b, "muli", &u2, 32);
            let o = b.op(&format!("arith.addi {base}, {h64} : i64"));
            let lo = b.op(&format!("arith.addi {o}, {u32o} : i64"));
            let lw = words(b, "%w", &lo, 8, 2);
            let ho = q6_k_qh_at(b, &base, &h);
            let hw = words(b, "%w", &ho, 8, 2);
            let u4 = bin64(b, "remui", &u, 4);
            let nh = bin64(b, "divui", &u4, 2);
            let ls = bin64(b, "muli", &nh, 4);
            let ls = shift32(b, &ls);
            let hs = bin64(b, "muli", &u4, 2);
            let hs = shift32(b, &hs);
            let q: Vec<String> = (0..32)
                .map(|i| {
                    let l = byte_field(b, &lw, i, Some(&ls), 0xF);
                    let hi = byte_field(b, &hw, i, Some(&hs), 3);
                    let hi = bin32(b, "shli", &hi, 4);
                    let q = b.op(&format!("arith.ori {l}, {hi} : i32"));
                    bin32(b, "subi", &q, 32)
                })
                .collect();
            let s0 = dots(b, &q[..16], &xs[..16], true);
            let s1 = dots(b, &q[16..], &xs[16..], true);
            let (s0, s1) = (b.sum4(&s0), b.sum4(&s1));
            let two = bin64(b, "muli", &u, 2);
            let o = addc(b, &base, 192);
            let so = b.op(&format!("arith.addi {o}, {two} : i64"));
            let sw = b.load_vec("%w", &so, 1, "i16", 2).remove(0);
            let sw = b.op(&format!("arith.extui {sw} : i16 to i32"));
            let sc0 = i8f(b, &sw);
            let s8 = bin32(b, "shrui", &sw, 8);
            let sc1 = i8f(b, &s8);
            let o = addc(b, &base, 208);
            let d = b.f16_at_byte("%w", &o);
            let a = b.op(&format!("arith.mulf {sc0}, {s0} : f32"));
            let a = b.op(&format!("llvm.intr.fma({sc1}, {s1}, {a}) : (f32, f32, f32) -> f32"));
            b.op(&format!("arith.mulf {d}, {a} : f32"))
        }
        other => unreachable!("{other} is not a K-quant (kquant_fits)"),
    }
}

/// The batched GEMV's weights (`MmaTiles`, a K step = 32 values = a Q4_K / Q5_K sub-block or a
/// Q6_K unit): the raw words of this lane's 8 values 8t..8t+7 of step `s` in the row whose
/// super-block row starts at byte `rowb` (i64; `lane_off` = 8t past it), as
/// [`kquant_step_values`] reads them: [quant words (2), (Q5_K: qh words (2)), header words..,
/// s % 8 as i32].
pub(crate) fn kquant_step_words(b: &mut Body, ptr: &str, dtype: DType, rowb: &str, lane_off: &str, s: &str) -> Vec<String> {
    let bytes = dtype.block().1 as i64;
    if matches!(dtype, DType::Q5_0 | DType::Q5_1) {
        // a block a step: lane t's values 8t..8t+7 are bytes 8 (t % 2).. of qs, nibble t / 2,
        // and byte t of qh; [qs words (2), qh, d (| m << 16), t as i32]
        let one = dtype == DType::Q5_1;
        let so = bin64(b, "muli", s, bytes);
        let base = b.op(&format!("arith.addi {rowb}, {so} : i64"));
        let t = bin64(b, "divui", lane_off, 8);
        let t2 = bin64(b, "remui", &t, 2);
        let qo = bin64(b, "muli", &t2, 8);
        let o = addc(b, &base, if one { 8 } else { 6 });
        let o = b.op(&format!("arith.addi {o}, {qo} : i64"));
        let mut w = b.load_vec(ptr, &o, 2, "i32", if one { 8 } else { 2 });
        let o = addc(b, &base, if one { 4 } else { 2 });
        w.extend(b.load_vec(ptr, &o, 1, "i32", if one { 4 } else { 2 }));
        if one {
            w.extend(b.load_vec(ptr, &base, 1, "i32", 4));
        } else {
            let d = b.load_vec(ptr, &base, 1, "i16", 2).remove(0);
            w.push(b.op(&format!("arith.extui {d} : i16 to i32")));
        }
        w.push(b.op(&format!("arith.trunci {t} : i64 to i32")));
        return w;
    }
    let sb = bin64(b, "divui", s, 8);
    let j = bin64(b, "remui", s, 8);
    let so = bin64(b, "muli", &sb, bytes);
    let base = b.op(&format!("arith.addi {rowb}, {so} : i64"));
    let lane = b.op(&format!("arith.addi {base}, {lane_off} : i64"));
    let mut w = vec![];
    match dtype {
        DType::Q4_K | DType::Q5_K => {
            let five = dtype == DType::Q5_K;
            let o = k_quants_at(b, &lane, &j, five);
            w.extend(b.load_vec(ptr, &o, 2, "i32", 8));
            if five {
                let o = addc(b, &lane, 16);
                w.extend(b.load_vec(ptr, &o, 2, "i32", 8));
            }
            w.extend(words(b, ptr, &base, 4, 16));
        }
        DType::Q6_K => {
            // (210-byte super-blocks: 2-byte aligned) ql 64 (u / 4) + 32 (u % 2), qh 128 + 32 (u / 4)
            let h = bin64(b, "divui", &j, 4);
            let h64 = bin64(b, "muli", &h, 64);
            let u2 = bin64(b, "remui", &j, 2);
            let u32o = bin64(b, "muli", &u2, 32);
            let o = b.op(&format!("arith.addi {lane}, {h64} : i64"));
            let o = b.op(&format!("arith.addi {o}, {u32o} : i64"));
            w.extend(b.load_vec(ptr, &o, 2, "i32", 2));
            let ho = q6_k_qh_at(b, &lane, &h);
            w.extend(b.load_vec(ptr, &ho, 2, "i32", 2));
            // the lane's scale: byte 192 + 2u + t / 2 (8t / 16), and d
            let t2 = bin64(b, "divui", lane_off, 16);
            let ju = bin64(b, "muli", &j, 2);
            let o = addc(b, &base, 192);
            let o = b.op(&format!("arith.addi {o}, {ju} : i64"));
            let o = b.op(&format!("arith.addi {o}, {t2} : i64"));
            w.push(b.u8_at_byte(ptr, &o));
            let o = addc(b, &base, 208);
            let d = b.load_vec(ptr, &o, 1, "i16", 2).remove(0);
            w.push(b.op(&format!("arith.extui {d} : i16 to i32")));
        }
        other => unreachable!("{other}: the batched GEMV reads the K-quants' super-blocks here"),
    }
    w.push(b.op(&format!("arith.trunci {j} : i64 to i32")));
    w
}

/// The 8 values of [`kquant_step_words`]' words as f16 pairs (8t, 8t+1) .. (8t+6, 8t+7).
/// Q5_0 / Q5_1: each value computed in f32 and rounded once. The K-quants in f16 pairs, no
/// int-to-float conversion per value (the batched GEMV was bound by them): the lane's scale
/// (and min) or-ed into f16 1024's bits, the offset taken off (exact), times d (dmin) — rounded
/// once, as the f32 reference's products — then per pair of values the quants `prmt`-ed into
/// the two halves, or-ed into 1024's bits, the offset taken off, one `fma.rn.f16x2` (Q4_K /
/// Q5_K: d·sc·q − dmin·m; Q6_K `mul.rn.f16x2` d·sc·(q − 32)).
pub(crate) fn kquant_step_values(b: &mut Body, dtype: DType, raw: &[String]) -> [String; 4] {
    let j = raw[raw.len() - 1].clone();
    let st = "!llvm.struct<(i32, i32)>";
    // pair p of the lane's 8 values: bytes 2 (p % 2), + 1 of quant word p / 2
    let sel = |p: usize| if p % 2 == 0 { "0x4140" } else { "0x4342" };
    let vals: Vec<String> = match dtype {
        DType::Q5_0 | DType::Q5_1 => {
            // (`j` is the lane's t here)
            let [d, m] = b.f16_pair(&raw[3]);
            let half = bin32(b, "shrui", &j, 1);
            let sh = bin32(b, "shli", &half, 2);
            let t8 = bin32(b, "shli", &j, 3);
            let off = if dtype == DType::Q5_1 {
                m
            } else {
                let c = b.cf32(-16.0);
                b.op(&format!("arith.mulf {d}, {c} : f32"))
            };
            (0..8)
                .map(|i| {
                    let nib = byte_field(b, &raw[..2], i, Some(&sh), 0xF);
                    let c = b.op(&format!("arith.constant {i} : i32"));
                    let hs = b.op(&format!("arith.addi {t8}, {c} : i32"));
                    let h = field(b, &raw[2], &hs, 1);
                    let h = bin32(b, "shli", &h, 4);
                    let q = b.op(&format!("arith.ori {nib}, {h} : i32"));
                    let qf = u2f(b, &q);
                    b.op(&format!("llvm.intr.fma({d}, {qf}, {off}) : (f32, f32, f32) -> f32"))
                })
                .collect()
        }
        DType::Q4_K | DType::Q5_K => {
            let five = dtype == DType::Q5_K;
            let hdr = &raw[if five { 4 } else { 2 }..raw.len() - 1];
            let j64 = b.op(&format!("arith.extui {j} : i32 to i64"));
            let (sc, mn) = k_scale_min(b, &[hdr[1].clone(), hdr[2].clone(), hdr[3].clone()], &j64);
            // (d·sc, d·sc) and (−dmin·m, −dmin·m)
            let asm = "{ .reg .b32 p, k; mov.b32 k, 0x64006400; shl.b32 p, $3, 16; or.b32 p, p, $2; or.b32 p, p, 0x64006400; sub.f16x2 p, p, k; mul.rn.f16x2 p, p, $4; xor.b32 p, p, 0x80000000; prmt.b32 $0, p, p, 0x1010; prmt.b32 $1, p, p, 0x3232; }";
            let r = b.op(&format!("llvm.inline_asm \"{asm}\", \"=r,=r,r,r,r\" {sc}, {mn}, {} : (i32, i32, i32) -> {st}", hdr[0]));
            let (ds, ndm) = (b.op(&format!("llvm.extractvalue {r}[0] : {st}")), b.op(&format!("llvm.extractvalue {r}[1] : {st}")));
            // (the sub-block's nibble: high for odd j; Q5_K's fifth bit: bit j of the qh bytes)
            let odd = bin32(b, "andi", &j, 1);
            let sh = bin32(b, "shli", &odd, 2);
            return [0, 1, 2, 3].map(|p| {
                let w = &raw[p / 2];
                let s = sel(p);
                let pre = "{ .reg .b32 u, t, x, z, k; mov.b32 z, 0; mov.b32 k, 0x64006400; shr.b32 u, $1, $2; prmt.b32 t, u, z, SEL; ".replace("SEL", s);
                if five {
                    let asm = format!("{pre}shr.b32 u, $5, $6; prmt.b32 x, u, z, {s}; shl.b32 x, x, 4; lop3.b32 x, x, 0x00100010, 0x64006400, 0xEA; lop3.b32 t, t, 0x000F000F, x, 0xEA; sub.f16x2 t, t, k; fma.rn.f16x2 $0, t, $3, $4; }}");
                    b.op(&format!("llvm.inline_asm \"{asm}\", \"=r,r,r,r,r,r,r\" {w}, {sh}, {ds}, {ndm}, {}, {j} : (i32, i32, i32, i32, i32, i32) -> i32", raw[2 + p / 2]))
                } else {
                    let asm = format!("{pre}lop3.b32 t, t, 0x000F000F, 0x64006400, 0xEA; sub.f16x2 t, t, k; fma.rn.f16x2 $0, t, $3, $4; }}");
                    b.op(&format!("llvm.inline_asm \"{asm}\", \"=r,r,r,r,r\" {w}, {sh}, {ds}, {ndm} : (i32, i32, i32, i32) -> i32"))
                }
            });
        }
        DType::Q6_K => {
            // (ql's nibble (j % 4) / 2, qh's 2-bit field j % 4)
            let u4 = bin32(b, "andi", &j, 3);
            let ls = {
                let nh = bin32(b, "shrui", &u4, 1);
                bin32(b, "shli", &nh, 2)
            };
            let hs = bin32(b, "shli", &u4, 1);
            // (d·sc, d·sc): the int8 scale + 128 under f16 1024's bits, 1152 off
            let asm = "{ .reg .b32 p, k, d2; mov.b32 k, 0x64806480; xor.b32 p, $1, 0x80; prmt.b32 p, p, p, 0x1010; or.b32 p, p, 0x64006400; sub.f16x2 p, p, k; prmt.b32 d2, $2, $2, 0x1010; mul.rn.f16x2 $0, p, d2; }";
            let ds = b.op(&format!("llvm.inline_asm \"{asm}\", \"=r,r,r\" {}, {} : (i32, i32) -> i32", raw[4], raw[5]));
            return [0, 1, 2, 3].map(|p| {
                let s = sel(p);
                let asm = format!("{{ .reg .b32 u, t, x, z, k; mov.b32 z, 0; mov.b32 k, 0x64206420; shr.b32 u, $1, $3; prmt.b32 t, u, z, {s}; shr.b32 u, $2, $4; prmt.b32 x, u, z, {s}; shl.b32 x, x, 4; lop3.b32 x, x, 0x00300030, 0x64006400, 0xEA; lop3.b32 t, t, 0x000F000F, x, 0xEA; sub.f16x2 t, t, k; mul.rn.f16x2 $0, t, $5; }}");
                b.op(&format!("llvm.inline_asm \"{asm}\", \"=r,r,r,r,r,r\" {}, {}, {ls}, {hs}, {ds} : (i32, i32, i32, i32, i32) -> i32", raw[p / 2], raw[2 + p / 2]))
            });
        }
        other => unreachable!("{other}: the batched GEMV reads the K-quants' super-blocks here"),
    };
    [0, 1, 2, 3].map(|p| b.pack2(&vals[2 * p], &vals[2 * p + 1], true))
}

/// round(x) as Rust's `f32::round` for x ≥ 0 (ties away from zero), exactly: the integer part
/// plus one where the (exact) fraction is at least one half; negative x give 0 or less, which the
/// callers clamp to 0 as the host's clamp does.
fn round_pos(b: &mut Body, x: &str) -> String {
    let t = b.op(&format!("arith.fptosi {x} : f32 to i32"));
    let tf = s2f(b, &t);
    let frac = b.op(&format!("arith.subf {x}, {tf} : f32"));
    let half = b.cf32(0.5);
    let up = b.op(&format!("arith.cmpf oge, {frac}, {half} : f32"));
    let one = b.op("arith.constant 1 : i32");
    let t1 = b.op(&format!("arith.addi {t}, {one} : i32"));
    b.op(&format!("arith.select {up}, {t1}, {t} : i32"))
}

/// clamp(round(x), 0, hi) as i32, or 0 where `unit` (the divisor that made x) is not positive
fn quant(b: &mut Body, x: &str, unit: &str, hi: i64) -> String {
    let r = round_pos(b, x);
    let z = b.op("arith.constant 0 : i32");
    let r = b.op(&format!("arith.maxsi {r}, {z} : i32"));
    let r = bin32(b, "minsi", &r, hi);
    let zf = b.cf32(0.0);
    let pos = b.op(&format!("arith.cmpf ogt, {unit}, {zf} : f32"));
    b.op(&format!("arith.select {pos}, {r}, {z} : i32"))
}

/// Seeded Q4_K weights (`seeded_init_q4_k`): the 256-thread block is a super-block, warp j its
/// sub-block j, thread t's value `v` (f32) element t — the numbers `dsc_ir::quant::encode` makes
/// (plain min/max scales, not llama.cpp's search), each f32 operation rounded on its own: per
/// sub-block scale (max − min(min, 0)) / 15 and offset −min(min, 0); d = f16(max scale / 63),
/// dmin = f16(max offset / 63); 6-bit sc = round(scale / d), m = round(offset / dmin); q =
/// round((v + dmin·m) / (d·sc)) clamped to 0..15. `i` (i64) is the flat element index.
pub(crate) fn seeded_q4_k(b: &mut Body, v: &str, i: &str) {
    let smt = "memref<16xf32, #gpu.address_space<workgroup>>";
    let qmt = "memref<272xi32, #gpu.address_space<workgroup>>";
    b.workgroup = Some(format!("%red : {smt}, %qs : {qmt}"));
    let t = b.op("gpu.thread_id x");
    let (lane, warp) = b.lane_warp(&t);
    let lo = b.xor_reduce(v, "arith.minimumf", &[16, 8, 4, 2, 1]);
    let zf = b.cf32(0.0);
    let lo = b.op(&format!("arith.minimumf {lo}, {zf} : f32"));
    let hi = b.xor_reduce(v, "arith.maximumf", &[16, 8, 4, 2, 1]);
    let span = rn_f32(b, "sub", &hi, &lo);
    let c15 = b.cf32(15.0);
    let scale = rn_f32(b, "div", &span, &c15);
    let offset = b.op(&format!("arith.negf {lo} : f32"));
    let c0x = b.op("arith.constant 0 : index");
    let c8x = b.op("arith.constant 8 : index");
    let first = b.op(&format!("arith.cmpi eq, {lane}, {c0x} : index"));
    b.line(&format!("scf.if {first} {{"));
    let w8 = b.op(&format!("arith.addi {warp}, {c8x} : index"));
    b.line(&format!("memref.store {scale}, %red[{warp}] : {smt}"));
    b.line(&format!("memref.store {offset}, %red[{w8}] : {smt}"));
    b.line("}");
    b.line("gpu.barrier");
    // (the host folds from 0 in sub-block order; max is order-free)
    let (mut smax, mut mmax) = (zf.clone(), zf.clone());
    for j in 0..8 {
        let cj = b.op(&format!("arith.constant {j} : index"));
        let cj8 = b.op(&format!("arith.constant {} : index", j + 8));
        let s = b.op(&format!("memref.load %red[{cj}] : {smt}"));
        let m = b.op(&format!("memref.load %red[{cj8}] : {smt}"));
        smax = b.op(&format!("arith.maximumf {smax}, {s} : f32"));
        mmax = b.op(&format!("arith.maximumf {mmax}, {m} : f32"));
    }
    let c63 = b.cf32(63.0);
    let dq = rn_f32(b, "div", &smax, &c63);
    let mq = rn_f32(b, "div", &mmax, &c63);
    let d16 = b.op(&format!("arith.truncf {dq} : f32 to f16"));
    let m16 = b.op(&format!("arith.truncf {mq} : f32 to f16"));
    let df = b.op(&format!("arith.extf {d16} : f16 to f32"));
    let mf = b.op(&format!("arith.extf {m16} : f16 to f32"));
    let sq = rn_f32(b, "div", &scale, &df);
    let sc = quant(b, &sq, &df, 63);
    let mqq = rn_f32(b, "div", &offset, &mf);
    let mn = quant(b, &mqq, &mf, 63);
    let scf = s2f(b, &sc);
    let mnf = s2f(b, &mn);
    let dj = rn_f32(b, "mul", &df, &scf);
    let mj = rn_f32(b, "mul", &mf, &mnf);
    let num = rn_f32(b, "add", v, &mj);
    let qx = rn_f32(b, "div", &num, &dj);
    let q = quant(b, &qx, &dj, 15);
    // q of every element, then sc and mn of every sub-block, through shared memory
    b.line(&format!("memref.store {q}, %qs[{t}] : {qmt}"));
    b.line(&format!("scf.if {first} {{"));
    let c256 = b.op("arith.constant 256 : index");
    let at = b.op(&format!("arith.addi {warp}, {c256} : index"));
    b.line(&format!("memref.store {sc}, %qs[{at}] : {qmt}"));
    let c264 = b.op("arith.constant 264 : index");
    let at = b.op(&format!("arith.addi {warp}, {c264} : index"));
    b.line(&format!("memref.store {mn}, %qs[{at}] : {qmt}"));
    b.line("}");
    b.line("gpu.barrier");
    let sb = bin64(b, "divui", i, 256);
    let base = bin64(b, "muli", &sb, 144);
    let t64 = b.idx64(&t);
    // threads 0..128: quant byte t = q[64c + l] | q[64c + 32 + l] << 4 (c = t / 32, l = t % 32)
    let c128 = b.ci64(128);
    let low = b.op(&format!("arith.cmpi ult, {t64}, {c128} : i64"));
    b.line(&format!("scf.if {low} {{"));
    let c = bin64(b, "divui", &t64, 32);
    let l = bin64(b, "remui", &t64, 32);
    let c64 = bin64(b, "muli", &c, 64);
    let e0 = b.op(&format!("arith.addi {c64}, {l} : i64"));
    let e1 = addc(b, &e0, 32);
    let ix0 = b.op(&format!("arith.index_cast {e0} : i64 to index"));
    let ix1 = b.op(&format!("arith.index_cast {e1} : i64 to index"));
    let q0 = b.op(&format!("memref.load %qs[{ix0}] : {qmt}"));
    let q1 = b.op(&format!("memref.load %qs[{ix1}] : {qmt}"));
    let q1 = bin32(b, "shli", &q1, 4);
    let byte = b.op(&format!("arith.ori {q0}, {q1} : i32"));
    let byte = b.op(&format!("arith.trunci {byte} : i32 to i8"));
    let o = addc(b, &base, 16);
    let o = b.op(&format!("arith.addi {o}, {t64} : i64"));
    let p = b.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    b.line(&format!("llvm.store {byte}, {p} : i8, !llvm.ptr<1>"));
    b.line("}");
    // thread 0: d, dmin and the 12 scale bytes (`k_pack_scale_min`)
    let z64 = b.ci64(0);
    let t0 = b.op(&format!("arith.cmpi eq, {t64}, {z64} : i64"));
    b.line(&format!("scf.if {t0} {{"));
    for (h, off) in [(&d16, 0i64), (&m16, 2)] {
        let o = addc(b, &base, off);
        let p = b.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        b.line(&format!("llvm.store {h}, {p} {{alignment = 2 : i64}} : f16, !llvm.ptr<1>"));
    }
    let at = |b: &mut Body, k: usize| {
        let ck = b.op(&format!("arith.constant {k} : index"));
        b.op(&format!("memref.load %qs[{ck}] : {qmt}"))
    };
    let scs: Vec<String> = (0..8).map(|j| at(b, 256 + j)).collect();
    let mns: Vec<String> = (0..8).map(|j| at(b, 264 + j)).collect();
    for j in 0..4 {
        let top = |b: &mut Body, x: &str| {
            let h = bin32(b, "andi", x, 0x30);
            bin32(b, "shli", &h, 2)
        };
        let ts = top(b, &scs[j + 4]);
        let s0 = b.op(&format!("arith.ori {}, {ts} : i32", scs[j]));
        let tm = top(b, &mns[j + 4]);
        let s1 = b.op(&format!("arith.ori {}, {tm} : i32", mns[j]));
        let lo4 = bin32(b, "andi", &scs[j + 4], 0xF);
        let hi4 = bin32(b, "andi", &mns[j + 4], 0xF);
        let hi4 = bin32(b, "shli", &hi4, 4);
        let s2 = b.op(&format!("arith.ori {lo4}, {hi4} : i32"));
        for (val, k) in [(s0, j), (s1, j + 4), (s2, j + 8)] {
            let byte = b.op(&format!("arith.trunci {val} : i32 to i8"));
            let o = addc(b, &base, 4 + k as i64);
            let p = b.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
            b.line(&format!("llvm.store {byte}, {p} : i8, !llvm.ptr<1>"));
        }
    }
    b.line("}");
}
