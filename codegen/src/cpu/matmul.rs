//! The CPU matmul family: `y[i, j] = sum_k x[i, k] · W[j, k]` for output columns `n0..n1`,
//! W read packed — GGUF Q4_0 / Q5_0 / Q5_1 blocks and the K-quants' super-blocks, f16, bf16 or
//! f32 rows as stored; Q4_1 and Q8_0 in the CPU layout `dsc_ir::quant::cpu_layout` makes of
//! them at load (a row's quants, then its f16 scales, then (Q4_1) its f16 minima) — and widened
//! to f32 in registers, 16 lanes at a time (one zmm on AVX-512; two ymm on AVX2, where LLVM
//! splits the vectors). The K-quants' gemv is its own (`emit_gemv_k`: a super-block decoded
//! once, its scales in vectors).
//!
//! Two functions per weight type, same C signature
//! `(x: *const f32, w: *const u8, y: *mut f32, scratch: *mut f32, m, k, n0, n1, ldy: i64)`:
//! - `<sym>_gemv` (decode, m < 4): for each column, every block is widened in registers and
//!   fused into the dot product with each x row (blocks in pairs, each of a pair into
//!   accumulators of its own, so no one FMA chain runs through every block), the weight bytes
//!   [`PREFETCH_BYTES`] ahead prefetched; Q4_1 keeps its min apart (`d·(q·x) + m·Σx`, the x
//!   block sums in `scratch`), Q4_1 / Q8_0 convert a row's f16 scales once into `scratch`.
//! - `<sym>_gemm` (prefill, m ≥ 4): four weight rows are widened into `scratch` (the caller's,
//!   per thread), then a 4×4 register tile — four x rows by four weight rows,
//!   sixteen accumulators — walks k 16 at a time (8 loads for 16 FMAs); leftover x rows take a
//!   1×4 tile. `n1 - n0` must be a multiple of 4 there. (The `x86-64-v4-amx` library's gemm
//!   is [`amx`](super::amx)'s instead: AMX tiles, the same result.)
//!
//! The caller splits columns over threads and gives each run `dsc_ir::quant::cpu_matmul_scratch`
//! floats of scratch; `fits` says which shapes the kernels take.

use dsc_ir::DType;
use std::fmt::Write;

/// The weight types the family reads packed.
pub const DTYPES: [DType; 11] = [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q4_K, DType::Q5_K, DType::Q6_K];

/// Elements of the unit a weight row is read in: a 32-element block, or a K-quant's
/// 256-element super-block.
pub fn unit_elements(dtype: DType) -> usize {
    dtype.block().0.max(32)
}

/// Whether the kernels take weight `dtype` of shape [n, k]: a type above, k a whole number of
/// units (32-element blocks, K-quants' 256-element super-blocks), n a multiple of 4 (the gemm's
/// column tile).
pub fn fits(dtype: DType, n: usize, k: usize) -> bool {
    DTYPES.contains(&dtype) && k > 0 && k % unit_elements(dtype) == 0 && n % 4 == 0 && n > 0
}

fn is_k(dtype: DType) -> bool {
    matches!(dtype, DType::Q4_K | DType::Q5_K | DType::Q6_K)
}

/// The exported symbol stem of the kernels for `dtype` (`dsc_cpu_matmul_q4_1`).
pub fn symbol(dtype: DType) -> String {
    format!("dsc_cpu_matmul_{}", dtype.name())
}

/// Bytes of one unit ([`unit_elements`]) of a weight row as the kernels read it (Q4_1: 24,
/// Q8_0: 34, the CPU layout of `dsc_ir::quant::cpu_layout`; K-quants' super-blocks as stored).
fn block_bytes(dtype: DType) -> usize {
    match dtype {
        DType::F32 => 128,
        DType::F16 | DType::BF16 => 64,
        DType::Q4_1 => 20,
        DType::Q8_0 => 34,
        other => other.block().1,
    }
}

/// Bytes a block advances a row's leading run: Q4_1 / Q8_0's quants in the CPU layout (16 /
/// 32; their scales follow the row's quants), the whole block as stored for the other types.
fn quant_bytes(dtype: DType) -> i64 {
    match dtype {
        DType::Q4_1 => 16,
        DType::Q8_0 => 32,
        d => block_bytes(d) as i64,
    }
}

/// 16 bytes of nibbles at `p` → (low nibbles, high nibbles) as vector<16xf32>: the bytes
/// widened once, the nibbles split in the 32-bit lanes (one widening per 16 bytes). (A
/// 16-entry `vpermps` table lookup instead of the int → float conversions measured the same.)
fn nibbles(f: &mut F, p: &str) -> (String, String) {
    let qs = f.load(p, "vector<16xi8>", 1);
    let q32 = f.op(format!("arith.extui {qs} : vector<16xi8> to vector<16xi32>"));
    let m15 = f.op("arith.constant dense<15> : vector<16xi32>");
    let s4 = f.op("arith.constant dense<4> : vector<16xi32>");
    let lo = f.op(format!("arith.andi {q32}, {m15} : vector<16xi32>"));
    let hi = f.op(format!("arith.shrui {q32}, {s4} : vector<16xi32>"));
    (f.op(format!("arith.sitofp {lo} : vector<16xi32> to {V}")), f.op(format!("arith.sitofp {hi} : vector<16xi32> to {V}")))
}

/// Block `b` of a Q8_0 row in the CPU layout (`nb` blocks: 32-byte quants, then f16 d):
/// (elements 0..16 and 16..32 as f32, d).
fn q8_0_block(f: &mut F, row: &str, nb: &str, b: &str) -> (String, String, String) {
    let (c16, c32) = (f.c64(16), f.c64(32));
    let off = f.mul(b, &c32);
    let pq = f.gep(row, &off, "i8");
    let pq2 = f.gep(&pq, &c16, "i8");
    let (l, h) = (f.load(&pq, "vector<16xi8>", 1), f.load(&pq2, "vector<16xi8>", 1));
    let lf = f.op(format!("arith.sitofp {l} : vector<16xi8> to {V}"));
    let hf = f.op(format!("arith.sitofp {h} : vector<16xi8> to {V}"));
    let qbytes = f.mul(nb, &c32);
    let pd0 = f.gep(row, &qbytes, "i8");
    let pd = f.gep(&pd0, b, "f16");
    let d = f.load(&pd, "f16", 2);
    let d = f.op(format!("arith.extf {d} : f16 to f32"));
    (lf, hf, d)
}

/// Block `b` of a Q4_1 row in the CPU layout (`nb` blocks: nibbles, then f16 d, then f16 m):
/// (low nibbles, high nibbles as f32, d, m).
fn q4_1_block(f: &mut F, row: &str, nb: &str, b: &str) -> (String, String, String, String) {
    let c16 = f.c64(16);
    let off = f.mul(b, &c16);
    let pq = f.gep(row, &off, "i8");
    let (lf, hf) = nibbles(f, &pq);
    let qbytes = f.mul(nb, &c16);
    let pd0 = f.gep(row, &qbytes, "i8");
    let pd = f.gep(&pd0, b, "f16");
    let d = f.load(&pd, "f16", 2);
    let d = f.op(format!("arith.extf {d} : f16 to f32"));
    let pm = f.gep(&pd, nb, "f16");
    let m = f.load(&pm, "f16", 2);
    let m = f.op(format!("arith.extf {m} : f16 to f32"));
    (lf, hf, d, m)
}

/// Block `b` of a GGUF Q5_0 / Q5_1 row as stored (22 / 24 bytes: f16 d, (Q5_1) f16 m, a u32 of
/// fifth bits — bit j element j's —, 16 nibble bytes): (elements 0..16 and 16..32 as 5-bit
/// values in f32, d, and the offset each value adds: Q5_0 −16·d, Q5_1 m), so that a value is
/// d·q + offset. (The gemv widens them: taking the offset apart as Q4_1's `m · Σx` measured
/// the same on SmolLM2's Q4_K_M, whose Q5_0 cost is the fifth bits.)
fn q5_block(f: &mut F, dtype: DType, row: &str, b: &str) -> (String, String, String, String) {
    let one = dtype == DType::Q5_1;
    let bb = f.c64(block_bytes(dtype) as i64);
    let off = f.mul(b, &bb);
    let p = f.gep(row, &off, "i8");
    let d = f16_at(f, &p, 0);
    let m = if one {
        f16_at(f, &p, 2)
    } else {
        let c = f.op("arith.constant -16.0 : f32");
        f.op(format!("arith.mulf {c}, {d} : f32"))
    };
    let at = if one { 4 } else { 2 };
    let (cq, cs) = (f.c64(at), f.c64(at + 4));
    let (pqh, pq) = (f.gep(&p, &cq, "i8"), f.gep(&p, &cs, "i8"));
    let qh = f.load(&pqh, "i32", 1);
    let qhv = f.op(format!("vector.broadcast {qh} : i32 to vector<16xi32>"));
    let (one1, four) = (f.op("arith.constant dense<1> : vector<16xi32>"), f.op("arith.constant dense<4> : vector<16xi32>"));
    let qs = f.load(&pq, "vector<16xi8>", 1);
    let q32 = f.op(format!("arith.extui {qs} : vector<16xi8> to vector<16xi32>"));
    let mut halves = vec![];
    for half in 0..2 {
        let nib = bits(f, &q32, 4 * half, 15);
        let lanes: Vec<String> = (0..16).map(|j| (j + 16 * half).to_string()).collect();
        let sh = f.op(format!("arith.constant dense<[{}]> : vector<16xi32>", lanes.join(", ")));
        let hb = f.op(format!("arith.shrui {qhv}, {sh} : vector<16xi32>"));
        let hb = f.op(format!("arith.andi {hb}, {one1} : vector<16xi32>"));
        let hb = f.op(format!("arith.shli {hb}, {four} : vector<16xi32>"));
        let q = f.op(format!("arith.ori {nib}, {hb} : vector<16xi32>"));
        halves.push(f.op(format!("arith.sitofp {q} : vector<16xi32> to {V}")));
    }
    (halves[0].clone(), halves[1].clone(), d, m)
}

/// SSA-name generator and text sink for one function.
pub(super) struct F {
    pub(super) s: String,
    pub(super) n: usize,
}

impl F {
    pub(super) fn v(&mut self) -> String {
        self.n += 1;
        format!("%v{}", self.n)
    }
    /// emit `%new = <rhs>`; returns %new
    pub(super) fn op(&mut self, rhs: impl AsRef<str>) -> String {
        let v = self.v();
        let _ = writeln!(self.s, "    {v} = {}", rhs.as_ref());
        v
    }
    pub(super) fn line(&mut self, l: impl AsRef<str>) {
        let _ = writeln!(self.s, "    {}", l.as_ref());
    }
    pub(super) fn c64(&mut self, c: i64) -> String {
        self.op(format!("arith.constant {c} : i64"))
    }
    pub(super) fn cidx(&mut self, c: i64) -> String {
        self.op(format!("arith.constant {c} : index"))
    }
    pub(super) fn idx(&mut self, v: &str) -> String {
        self.op(format!("arith.index_cast {v} : i64 to index"))
    }
    pub(super) fn i64(&mut self, v: &str) -> String {
        self.op(format!("arith.index_cast {v} : index to i64"))
    }
    pub(super) fn gep(&mut self, base: &str, off: &str, elem: &str) -> String {
        self.op(format!("llvm.getelementptr {base}[{off}] : (!llvm.ptr, i64) -> !llvm.ptr, {elem}"))
    }
    pub(super) fn load(&mut self, p: &str, ty: &str, align: u32) -> String {
        self.op(format!("llvm.load {p} {{alignment = {align} : i64}} : !llvm.ptr -> {ty}"))
    }
    pub(super) fn mul(&mut self, a: &str, b: &str) -> String {
        self.op(format!("arith.muli {a}, {b} : i64"))
    }
    pub(super) fn add(&mut self, a: &str, b: &str) -> String {
        self.op(format!("arith.addi {a}, {b} : i64"))
    }
}

pub(super) const V: &str = "vector<16xf32>";

/// Widen block `b` (i64 SSA value) of the weight row at `row` (ptr) into two vector<16xf32>:
/// elements 0..16 and 16..32 of the block, exactly as `dsc_ir::quant::decode` widens them
/// (d·q + m by one FMA for Q4_1).
fn widen(f: &mut F, dtype: DType, row: &str, nb: &str, b: &str) -> (String, String) {
    if dtype == DType::Q4_1 {
        // d·q + m
        let (lf, hf, d, m) = q4_1_block(f, row, nb, b);
        let dv = f.op(format!("vector.broadcast {d} : f32 to {V}"));
        let mv = f.op(format!("vector.broadcast {m} : f32 to {V}"));
        return (f.op(format!("vector.fma {dv}, {lf}, {mv} : {V}")), f.op(format!("vector.fma {dv}, {hf}, {mv} : {V}")));
    }
    let bb = f.c64(block_bytes(dtype) as i64);
    let off = f.mul(b, &bb);
    let p = f.gep(row, &off, "i8");
    let scale = |f: &mut F, at: i64| {
        let s = f16_at(f, &p, at);
        f.op(format!("vector.broadcast {s} : f32 to {V}"))
    };
    match dtype {
        DType::F32 => {
            let lo = f.load(&p, V, 4);
            let q = f.c64(64);
            let ph = f.gep(&p, &q, "i8");
            let hi = f.load(&ph, V, 4);
            (lo, hi)
        }
        DType::F16 => {
            let q = f.c64(32);
            let ph = f.gep(&p, &q, "i8");
            let (l, h) = (f.load(&p, "vector<16xf16>", 2), f.load(&ph, "vector<16xf16>", 2));
            (f.op(format!("arith.extf {l} : vector<16xf16> to {V}")), f.op(format!("arith.extf {h} : vector<16xf16> to {V}")))
        }
        DType::BF16 => {
            // bf16 → f32: the 16 bits become the high half
            let q = f.c64(32);
            let ph = f.gep(&p, &q, "i8");
            let sh = f.op("arith.constant dense<16> : vector<16xi32>");
            let mut out = vec![];
            for src in [p.clone(), ph] {
                let h = f.load(&src, "vector<16xi16>", 2);
                let w = f.op(format!("arith.extui {h} : vector<16xi16> to vector<16xi32>"));
                let s = f.op(format!("arith.shli {w}, {sh} : vector<16xi32>"));
                out.push(f.op(format!("arith.bitcast {s} : vector<16xi32> to {V}")));
            }
            (out[0].clone(), out[1].clone())
        }
        DType::Q8_0 => {
            let (lf, hf, d) = q8_0_block(f, row, nb, b);
            let dv = f.op(format!("vector.broadcast {d} : f32 to {V}"));
            (f.op(format!("arith.mulf {dv}, {lf} : {V}")), f.op(format!("arith.mulf {dv}, {hf} : {V}")))
        }
        DType::Q5_0 | DType::Q5_1 => {
            // Q5_0 d·(q − 16), Q5_1 d·q + m
            let (lf, hf, d, m) = q5_block(f, dtype, row, b);
            let dv = f.op(format!("vector.broadcast {d} : f32 to {V}"));
            let mv = f.op(format!("vector.broadcast {m} : f32 to {V}"));
            (f.op(format!("vector.fma {dv}, {lf}, {mv} : {V}")), f.op(format!("vector.fma {dv}, {hf}, {mv} : {V}")))
        }
        DType::Q4_0 => {
            // d·(q − 8)
            let d = scale(f, 0);
            let c2 = f.c64(2);
            let pq = f.gep(&p, &c2, "i8");
            let (lf, hf) = nibbles(f, &pq);
            let eight = f.op(format!("arith.constant dense<8.0> : {V}"));
            let (l8, h8) = (f.op(format!("arith.subf {lf}, {eight} : {V}")), f.op(format!("arith.subf {hf}, {eight} : {V}")));
            (f.op(format!("arith.mulf {d}, {l8} : {V}")), f.op(format!("arith.mulf {d}, {h8} : {V}")))
        }
        other => unreachable!("{other} is not in DTYPES (fits refuses it)"),
    }
}

/// One sub-block of a K-quant super-block as [`k_super`] decodes it: its quants as f32 vectors
/// of 16 in element order, and its value = `scale · q − min` (Q6_K: no min, q already − 32).
struct Sub {
    q: Vec<String>,
    scale: String,
    min: Option<String>,
}

fn f16_at(f: &mut F, p: &str, off: i64) -> String {
    let c = f.c64(off);
    let pp = f.gep(p, &c, "i8");
    let h = f.load(&pp, "f16", 1);
    f.op(format!("arith.extf {h} : f16 to f32"))
}

/// 16 bytes at `p + off` widened to vector<16xi32>, loaded once per super-block (`memo`).
fn bytes16(f: &mut F, memo: &mut std::collections::BTreeMap<i64, String>, p: &str, off: i64) -> String {
    if let Some(v) = memo.get(&off) {
        return v.clone();
    }
    let c = f.c64(off);
    let pp = f.gep(p, &c, "i8");
    let b = f.load(&pp, "vector<16xi8>", 1);
    let v = f.op(format!("arith.extui {b} : vector<16xi8> to vector<16xi32>"));
    memo.insert(off, v.clone());
    v
}

/// `(v >> shift) & mask` on vector<16xi32> (no shift where it is 0).
fn bits(f: &mut F, v: &str, shift: i64, mask: i64) -> String {
    let v = if shift > 0 {
        let s = f.op(format!("arith.constant dense<{shift}> : vector<16xi32>"));
        f.op(format!("arith.shrui {v}, {s} : vector<16xi32>"))
    } else {
        v.to_string()
    };
    let m = f.op(format!("arith.constant dense<{mask}> : vector<16xi32>"));
    f.op(format!("arith.andi {v}, {m} : vector<16xi32>"))
}

/// The K-quant super-block at `sb` decoded as `dsc_ir::quant::decode` reads it (llama.cpp's
/// `dequantize_row_q*_K`): Q4_K / Q5_K 8 sub-blocks of 32 (`d·sc` and `dmin·m` from the 12
/// packed six-bit bytes; the nibbles of 32 bytes per pair of sub-blocks, Q5_K's fifth bit from
/// the 32 `qh` bytes), Q6_K 16 sub-blocks of 16 (`d·sc`, signed scales; 4 bits from `ql`,
/// 2 from `qh`, minus 32). The scales (and mins) are decoded together in vectors; the mins also
/// come back as one vector<8xf32> (the gemv's `min · Σx` terms in one multiply-add).
fn k_super(f: &mut F, dtype: DType, sb: &str) -> (Vec<Sub>, Option<String>) {
    let mut memo = std::collections::BTreeMap::new();
    match dtype {
        DType::Q4_K | DType::Q5_K => {
            let five = dtype == DType::Q5_K;
            let (d, dmin) = (f16_at(f, sb, 0), f16_at(f, sb, 2));
            // the 12 scale bytes as one vector (16 loaded: the quants follow), the 8 scales and
            // mins picked out by shuffles: sub-blocks 0-3 the low 6 bits of bytes 0-3 / 4-7,
            // 4-7 bytes 8-11's nibbles with the top 2 bits of bytes 0-3 / 4-7 above them
            let b = bytes16(f, &mut memo, sb, 4);
            let v8 = "vector<8xi32>";
            let shuf = |f: &mut F, idx: &str| f.op(format!("vector.shuffle {b}, {b} [{idx}] : vector<16xi32>, vector<16xi32>"));
            let (a, top_s) = (shuf(f, "0, 1, 2, 3, 8, 9, 10, 11"), shuf(f, "0, 1, 2, 3, 0, 1, 2, 3"));
            let (c, top_m) = (shuf(f, "4, 5, 6, 7, 8, 9, 10, 11"), shuf(f, "4, 5, 6, 7, 4, 5, 6, 7"));
            let k = |f: &mut F, v: i64| f.op(format!("arith.constant dense<{v}> : {v8}"));
            let (c63, c15, c48, c2, c4) = (k(f, 63), k(f, 15), k(f, 0x30), k(f, 2), k(f, 4));
            let first4 = f.op("arith.constant dense<[true, true, true, true, false, false, false, false]> : vector<8xi1>");
            let pick = |f: &mut F, lo6: &str, hi4: &str, top: &str| {
                let lo = f.op(format!("arith.andi {lo6}, {c63} : {v8}"));
                let t = f.op(format!("arith.shrui {top}, {c2} : {v8}"));
                let t = f.op(format!("arith.andi {t}, {c48} : {v8}"));
                let hi = f.op(format!("arith.ori {hi4}, {t} : {v8}"));
                let v = f.op(format!("arith.select {first4}, {lo}, {hi} : vector<8xi1>, {v8}"));
                f.op(format!("arith.uitofp {v} : {v8} to vector<8xf32>"))
            };
            let sc_hi = f.op(format!("arith.andi {a}, {c15} : {v8}"));
            let scf = pick(f, &a, &sc_hi, &top_s);
            let mn_hi = f.op(format!("arith.shrui {c}, {c4} : {v8}"));
            let mnf = pick(f, &c, &mn_hi, &top_m);
            let dv = f.op(format!("vector.broadcast {d} : f32 to vector<8xf32>"));
            let dmv = f.op(format!("vector.broadcast {dmin} : f32 to vector<8xf32>"));
            let scales = f.op(format!("arith.mulf {dv}, {scf} : vector<8xf32>"));
            let mins = f.op(format!("arith.mulf {dmv}, {mnf} : vector<8xf32>"));
            let qs = if five { 48 } else { 16 };
            let mut subs: Vec<Sub> = (0..8)
                .map(|j| Sub {
                    q: vec![],
                    scale: f.op(format!("vector.extract {scales}[{j}] : f32 from vector<8xf32>")),
                    min: Some(f.op(format!("vector.extract {mins}[{j}] : f32 from vector<8xf32>"))),
                })
                .collect();
            for c in 0..4 {
                for half in 0..2 {
                    let v = bytes16(f, &mut memo, sb, qs + 32 * c + 16 * half);
                    for (j, shift) in [(2 * c, 0), (2 * c + 1, 4)] {
                        let mut q = bits(f, &v, shift, 15);
                        if five {
                            let h = bytes16(f, &mut memo, sb, 16 + 16 * half);
                            let bit = bits(f, &h, j, 1);
                            let s4 = f.op("arith.constant dense<4> : vector<16xi32>");
                            let hi = f.op(format!("arith.shli {bit}, {s4} : vector<16xi32>"));
                            q = f.op(format!("arith.ori {q}, {hi} : vector<16xi32>"));
                        }
                        subs[j as usize].q.push(f.op(format!("arith.sitofp {q} : vector<16xi32> to {V}")));
                    }
                }
            }
            (subs, Some(mins))
        }
        DType::Q6_K => {
            let d = f16_at(f, sb, 208);
            // the 16 signed scales as one vector
            let pp = f.c64(192);
            let ps = f.gep(sb, &pp, "i8");
            let sv = f.load(&ps, "vector<16xi8>", 1);
            let sv = f.op(format!("arith.sitofp {sv} : vector<16xi8> to {V}"));
            let dv = f.op(format!("vector.broadcast {d} : f32 to {V}"));
            let scales = f.op(format!("arith.mulf {dv}, {sv} : {V}"));
            let subs = (0..16i64)
                .map(|g| {
                    let (h, r0) = (g / 8, 16 * (g % 8));
                    let ql = bytes16(f, &mut memo, sb, 64 * h + r0 % 64);
                    let low = bits(f, &ql, 4 * (r0 / 64), 15);
                    let qh = bytes16(f, &mut memo, sb, 128 + 32 * h + r0 % 32);
                    let high = bits(f, &qh, 2 * (r0 / 32), 3);
                    let s4 = f.op("arith.constant dense<4> : vector<16xi32>");
                    let high = f.op(format!("arith.shli {high}, {s4} : vector<16xi32>"));
                    let q = f.op(format!("arith.ori {low}, {high} : vector<16xi32>"));
                    let c32 = f.op("arith.constant dense<32> : vector<16xi32>");
                    let q = f.op(format!("arith.subi {q}, {c32} : vector<16xi32>"));
                    Sub { q: vec![f.op(format!("arith.sitofp {q} : vector<16xi32> to {V}"))], scale: f.op(format!("vector.extract {scales}[{g}] : f32 from {V}")), min: None }
                })
                .collect();
            (subs, None)
        }
        other => unreachable!("{other} is not a K-quant"),
    }
}

/// Widen unit `b` of the weight row at `row` into vector<16xf32>s in element order: a block's
/// two halves ([`widen`]), or a K-quant super-block's sixteen (`scale · q − min` by one FMA).
pub(super) fn widen_unit(f: &mut F, dtype: DType, row: &str, nb: &str, b: &str) -> Vec<String> {
    if !is_k(dtype) {
        let (lo, hi) = widen(f, dtype, row, nb, b);
        return vec![lo, hi];
    }
    let bb = f.c64(block_bytes(dtype) as i64);
    let off = f.mul(b, &bb);
    let sb = f.gep(row, &off, "i8");
    let mut out = vec![];
    for sub in k_super(f, dtype, &sb).0 {
        let sv = f.op(format!("vector.broadcast {} : f32 to {V}", sub.scale));
        let nm = sub.min.as_ref().map(|m| {
            let n = f.op(format!("arith.negf {m} : f32"));
            f.op(format!("vector.broadcast {n} : f32 to {V}"))
        });
        for q in &sub.q {
            out.push(match &nm {
                Some(nm) => f.op(format!("vector.fma {sv}, {q}, {nm} : {V}")),
                None => f.op(format!("arith.mulf {sv}, {q} : {V}")),
            });
        }
    }
    out
}

/// `scratch[i * k/32 + b]` = the sum of x row i's 32-element block b, for every row and block
/// (the gemv's `m · Σx` terms of Q4_1 and Q4_K / Q5_K).
fn x_block_sums(f: &mut F) {
    let (c0, c1) = (f.cidx(0), f.cidx(1));
    let c32 = f.c64(32);
    let nb = f.op(format!("arith.divui %k, {c32} : i64"));
    let (m, nbi) = (f.idx("%m"), f.idx(&nb));
    f.line(format!("scf.for %si = {c0} to {m} step {c1} {{"));
    let i = f.i64("%si");
    let xoff = f.mul(&i, "%k");
    let xr = f.gep("%x", &xoff, "f32");
    let soff = f.mul(&i, &nb);
    let sr = f.gep("%scratch", &soff, "f32");
    f.line(format!("scf.for %sb = {c0} to {nbi} step {c1} {{"));
    let b = f.i64("%sb");
    let (xl, xh) = x_block(f, &xr, &b);
    let t = f.op(format!("arith.addf {xl}, {xh} : {V}"));
    let r = f.op(format!("vector.reduction <add>, {t} : {V} into f32"));
    store_f32(f, &sr, &b, &r);
    f.line("}");
    f.line("}");
}

/// `<sym>_gemv` for the K-quants: per column and x row, the super-blocks in turn, each decoded
/// once ([`k_super`]) and its sub-blocks fused into the dot product as `scale · (q·x)` (into
/// two accumulators, alternate sub-blocks), Q4_K / Q5_K's mins apart as `− min · Σx`, eight
/// lanes a super-block (the x block sums in scratch, m·k/32 floats).
fn emit_gemv_k(dtype: DType) -> String {
    let mut f = F { s: String::new(), n: 0 };
    let (nsb, rowb) = prologue(&mut f, dtype);
    let mins = dtype != DType::Q6_K;
    if mins {
        x_block_sums(&mut f);
    }
    let nsbi = f.idx(&nsb);
    let (c0, c1) = (f.cidx(0), f.cidx(1));
    let zero = f.op(format!("arith.constant dense<0.0> : {V}"));
    let c32 = f.c64(32);
    let nb32 = f.op(format!("arith.divui %k, {c32} : i64"));
    let (bb, c256, c8) = (f.c64(block_bytes(dtype) as i64), f.c64(256), f.c64(8));
    let (j, row, i, xr, sr) = gemv_loops(&mut f, &rowb, &nb32);
    let zero8 = f.op("arith.constant dense<0.0> : vector<8xf32>");
    f.line(format!("%acc:3 = scf.for %u = {c0} to {nsbi} step {c1} iter_args(%a0 = {zero}, %a1 = {zero}, %ms = {zero8}) -> ({V}, {V}, vector<8xf32>) {{"));
    let u = f.i64("%u");
    let off = f.mul(&u, &bb);
    prefetch_ahead(&mut f, &row, &off, block_bytes(dtype) as i64);
    let sb = f.gep(&row, &off, "i8");
    let xe = f.mul(&u, &c256);
    let xu = f.gep(&xr, &xe, "f32");
    let mut acc = ["%a0".to_string(), "%a1".to_string()];
    let (subs, mins) = k_super(&mut f, dtype, &sb);
    let per = 256 / subs.len() as i64;
    for (t, sub) in subs.iter().enumerate() {
        let mut dot = String::new();
        for (v, q) in sub.q.iter().enumerate() {
            let c = f.c64(per * t as i64 + 16 * v as i64);
            let px = f.gep(&xu, &c, "f32");
            let x = f.load(&px, V, 4);
            dot = if v == 0 { f.op(format!("arith.mulf {q}, {x} : {V}")) } else { f.op(format!("vector.fma {q}, {x}, {dot} : {V}")) };
        }
        let sv = f.op(format!("vector.broadcast {} : f32 to {V}", sub.scale));
        acc[t % 2] = f.op(format!("vector.fma {sv}, {dot}, {} : {V}", acc[t % 2]));
    }
    // Σ min · Σx over the 8 sub-blocks in one multiply-add (subtracted at the end)
    let ms = match &mins {
        Some(mv) => {
            let se = f.mul(&u, &c8);
            let su = f.gep(&sr, &se, "f32");
            let sx = f.load(&su, "vector<8xf32>", 4);
            f.op(format!("vector.fma {mv}, {sx}, %ms : vector<8xf32>"))
        }
        None => "%ms".to_string(),
    };
    f.line(format!("scf.yield {}, {}, {ms} : {V}, {V}, vector<8xf32>", acc[0], acc[1]));
    f.line("}");
    let s = f.op(format!("arith.addf %acc#0, %acc#1 : {V}"));
    let r = f.op(format!("vector.reduction <add>, {s} : {V} into f32"));
    let r = if mins.is_some() {
        let m = f.op("vector.reduction <add>, %acc#2 : vector<8xf32> into f32");
        f.op(format!("arith.subf {r}, {m} : f32"))
    } else {
        r
    };
    gemv_store(&mut f, &i, &j, &r);
    format!("  func.func @{}_gemv({SIG}) {{\n{}    return\n  }}\n", symbol(dtype), f.s)
}

/// How far ahead of the weight bytes it reads the gemv prefetches (into every cache level): the
/// rows stream from memory once a token, and without it one core read ~6.5 GB/s of Q4_1 rows
/// where a plain sum reads 17 (Sapphire Rapids VM: the hardware prefetcher alone keeps too few
/// lines in flight); 4 KiB ahead: 9.5 GB/s, decode +40% at one thread. 1 and 2 KiB measured
/// less, 8 and 16 KiB the same (docs/perf.md, "CPU backend").
pub const PREFETCH_BYTES: i64 = 4096;

/// Prefetch the `bytes` of the weight row at `row` + `at` (one a cache line), [`PREFETCH_BYTES`]
/// ahead. (Past a thread's last row it touches the next rows, or nothing: prefetches do not fault.)
fn prefetch_ahead(f: &mut F, row: &str, at: &str, bytes: i64) {
    for line in 0..(bytes + 63) / 64 {
        let c = f.c64(PREFETCH_BYTES + 64 * line);
        let o = f.add(at, &c);
        let p = f.gep(row, &o, "i8");
        f.line(format!("\"llvm.intr.prefetch\"({p}) <{{cache = 1 : i32, hint = 3 : i32, rw = 0 : i32}}> : (!llvm.ptr) -> ()"));
    }
}

/// The gemv's two loops opened over columns `%n0..%n1` (the weight row at `row`, `rowb` bytes
/// a row) and x rows (`xr`, and its x block sums `sr` in scratch, `nb` a row): (j, row, i, xr,
/// sr). [`gemv_store`] closes them.
fn gemv_loops(f: &mut F, rowb: &str, nb: &str) -> (String, String, String, String, String) {
    let (n0, n1, m) = (f.idx("%n0"), f.idx("%n1"), f.idx("%m"));
    let (c0, c1) = (f.cidx(0), f.cidx(1));
    f.line(format!("scf.for %j = {n0} to {n1} step {c1} {{"));
    let j = f.i64("%j");
    let roff = f.mul(&j, rowb);
    let row = f.gep("%w", &roff, "i8");
    f.line(format!("scf.for %i = {c0} to {m} step {c1} {{"));
    let i = f.i64("%i");
    let xoff = f.mul(&i, "%k");
    let xr = f.gep("%x", &xoff, "f32");
    let soff = f.mul(&i, nb);
    let sr = f.gep("%scratch", &soff, "f32");
    (j, row, i, xr, sr)
}

/// y[i, j] = r, and [`gemv_loops`]' loops closed.
fn gemv_store(f: &mut F, i: &str, j: &str, r: &str) {
    let yo = f.mul(i, "%ldy");
    let yo = f.add(&yo, j);
    store_f32(f, "%y", &yo, r);
    f.line("}");
    f.line("}");
}

pub(super) const SIG: &str = "%x: !llvm.ptr, %w: !llvm.ptr, %y: !llvm.ptr, %scratch: !llvm.ptr, %m: i64, %k: i64, %n0: i64, %n1: i64, %ldy: i64";

/// The prologue both functions share: unit count ([`unit_elements`]) and weight-row bytes.
pub(super) fn prologue(f: &mut F, dtype: DType) -> (String, String) {
    let cu = f.c64(unit_elements(dtype) as i64);
    let nb = f.op(format!("arith.divui %k, {cu} : i64"));
    let bb = f.c64(block_bytes(dtype) as i64);
    let rowb = f.mul(&nb, &bb);
    (nb, rowb)
}

/// Block `b` of the x row at `xr`: its elements 0..16 and 16..32.
fn x_block(f: &mut F, xr: &str, b: &str) -> (String, String) {
    let (c16, c32) = (f.c64(16), f.c64(32));
    let e = f.mul(b, &c32);
    let px = f.gep(xr, &e, "f32");
    let xl = f.load(&px, V, 4);
    let px2 = f.gep(&px, &c16, "f32");
    (xl, f.load(&px2, V, 4))
}

fn store_f32(f: &mut F, base: &str, at: &str, v: &str) {
    let p = f.gep(base, at, "f32");
    f.line(format!("llvm.store {v}, {p} {{alignment = 4 : i64}} : f32, !llvm.ptr"));
}

/// Where a Q4_1 / Q8_0 row's f16 scales (and Q4_1's minima) start: right after its quants.
fn scales_at(f: &mut F, dtype: DType, row: &str, nb: &str) -> String {
    let qb = f.c64(quant_bytes(dtype));
    let qbytes = f.mul(nb, &qb);
    f.gep(row, &qbytes, "i8")
}

/// The gemv's per-row prologue for Q4_1 / Q8_0: the row's `nb` f16 scales converted into the
/// f32 scratch row `dr` (16 at a time, then the tail), so the block loop broadcasts each
/// straight from memory (an FMA operand) instead of converting it there (four shuffle-port
/// uops a block); Q4_1's `Σ m · Σx` over the row (its f16 minima after the scales, the x block
/// sums at `sr`) in the same pass. Returns that sum (0 for Q8_0).
fn row_scales(f: &mut F, dtype: DType, row: &str, nb: &str, sr: &str, dr: &str) -> String {
    let mins = dtype == DType::Q4_1;
    let ds = scales_at(f, dtype, row, nb);
    let ms = mins.then(|| f.gep(&ds, nb, "f16"));
    let (c0, c1, c16) = (f.cidx(0), f.cidx(1), f.c64(16));
    let zero = f.op(format!("arith.constant dense<0.0> : {V}"));
    let fzero = f.op("arith.constant 0.0 : f32");
    let full = f.op(format!("arith.divui {nb}, {c16} : i64"));
    let fulli = f.idx(&full);
    let va = f.v();
    // one step of the pass at block b, `w` scales (16, or 1 in the tail): the f16 scales to
    // f32 in scratch, and (Q4_1) m·Σx into the accumulator `acc`
    let step = |f: &mut F, b: &str, w: usize, acc: &str| {
        let (h_ty, f_ty) = if w == 1 { ("f16".to_string(), "f32".to_string()) } else { (format!("vector<{w}xf16>"), V.to_string()) };
        let p = f.gep(&ds, b, "f16");
        let h = f.load(&p, &h_ty, 2);
        let d = f.op(format!("arith.extf {h} : {h_ty} to {f_ty}"));
        let q = f.gep(dr, b, "f32");
        f.line(format!("llvm.store {d}, {q} {{alignment = 4 : i64}} : {f_ty}, !llvm.ptr"));
        let acc = match &ms {
            Some(ms) => {
                let p = f.gep(ms, b, "f16");
                let h = f.load(&p, &h_ty, 2);
                let m = f.op(format!("arith.extf {h} : {h_ty} to {f_ty}"));
                let p = f.gep(sr, b, "f32");
                let sx = f.load(&p, &f_ty, 4);
                let t = f.op(format!("arith.mulf {m}, {sx} : {f_ty}"));
                f.op(format!("arith.addf {acc}, {t} : {f_ty}"))
            }
            None => acc.to_string(),
        };
        f.line(format!("scf.yield {acc} : {f_ty}"));
        f.line("}");
    };
    f.line(format!("{va} = scf.for %sc = {c0} to {fulli} step {c1} iter_args(%sa = {zero}) -> ({V}) {{"));
    let c = f.i64("%sc");
    let b0 = f.mul(&c, &c16);
    step(f, &b0, 16, "%sa");
    let t0 = f.mul(&full, &c16);
    let (t0i, nbi) = (f.idx(&t0), f.idx(nb));
    let ta = f.v();
    f.line(format!("{ta} = scf.for %st = {t0i} to {nbi} step {c1} iter_args(%ss = {fzero}) -> (f32) {{"));
    let b = f.i64("%st");
    step(f, &b, 1, "%ss");
    let r = f.op(format!("vector.reduction <add>, {va} : {V} into f32"));
    f.op(format!("arith.addf {r}, {ta} : f32"))
}

/// One block `b` of a gemv's dot product into its accumulators `acc` = [a, a']: Q4_1 / Q8_0
/// `a += d·(q·x)` (d from the row's f32 scales `dr`, [`row_scales`]; Q4_1's minima are
/// summed there), the other types the block's halves into a and a'. Returns the new [a, a'].
#[allow(clippy::too_many_arguments)]
fn gemv_block(f: &mut F, dtype: DType, row: &str, nb: &str, xr: &str, dr: &str, b: &str, acc: [&str; 2]) -> (String, String) {
    let [a, a2] = acc;
    let (xl, xh) = x_block(f, xr, b);
    let quants = |f: &mut F| {
        let c = f.c64(quant_bytes(dtype));
        let off = f.mul(b, &c);
        f.gep(row, &off, "i8")
    };
    let (lf, hf) = match dtype {
        DType::Q4_1 => {
            let pq = quants(f);
            nibbles(f, &pq)
        }
        DType::Q8_0 => {
            let pq = quants(f);
            let c16 = f.c64(16);
            let pq2 = f.gep(&pq, &c16, "i8");
            let (l, h) = (f.load(&pq, "vector<16xi8>", 1), f.load(&pq2, "vector<16xi8>", 1));
            (f.op(format!("arith.sitofp {l} : vector<16xi8> to {V}")), f.op(format!("arith.sitofp {h} : vector<16xi8> to {V}")))
        }
        _ => {
            let (wl, wh) = widen(f, dtype, row, nb, b);
            let a = f.op(format!("vector.fma {wl}, {xl}, {a} : {V}"));
            let a2 = f.op(format!("vector.fma {wh}, {xh}, {a2} : {V}"));
            return (a, a2);
        }
    };
    // d · (q·x)
    let pd = f.gep(dr, b, "f32");
    let d = f.load(&pd, "f32", 4);
    let dv = f.op(format!("vector.broadcast {d} : f32 to {V}"));
    let t = f.op(format!("arith.mulf {lf}, {xl} : {V}"));
    let t = f.op(format!("vector.fma {hf}, {xh}, {t} : {V}"));
    (f.op(format!("vector.fma {dv}, {t}, {a} : {V}")), a2.to_string())
}

/// `<sym>_gemv`: columns outermost, each x row's dot product with the column's widened blocks.
/// Q4_1 splits the block's d·q + m: `d · (q·x) + m · Σx`, the x block sums computed once per
/// call into scratch (m·k/32 floats): two vector ops a block fewer than widening first; Q8_0
/// likewise takes `d · (q·x)`. Their scales are converted once a row ([`row_scales`], into
/// scratch after the sums).
pub(super) fn emit_gemv(dtype: DType) -> String {
    if is_k(dtype) {
        return emit_gemv_k(dtype);
    }
    let mut f = F { s: String::new(), n: 0 };
    let (nb, rowb) = prologue(&mut f, dtype);
    let (c0, c1) = (f.cidx(0), f.cidx(1));
    let zero = f.op(format!("arith.constant dense<0.0> : {V}"));
    let scaled = matches!(dtype, DType::Q4_1 | DType::Q8_0);
    if dtype == DType::Q4_1 {
        x_block_sums(&mut f);
    }
    // (the row's f32 scales after the x block sums: m·nb + nb + 16 floats of the 4·k)
    let soff = f.mul("%m", &nb);
    let dr = f.gep("%scratch", &soff, "f32");
    let (j, row, i, xr, sr) = gemv_loops(&mut f, &rowb, &nb);
    let ms = if scaled { row_scales(&mut f, dtype, &row, &nb, &sr, &dr) } else { f.op("arith.constant 0.0 : f32") };
    // (blocks in pairs, each of a pair into accumulators of its own: one FMA chain a block
    // was latency-bound, ~4 cycles a block; an odd last block after the loop)
    let c2 = f.c64(2);
    let pairs = f.op(format!("arith.divui {nb}, {c2} : i64"));
    let pairsi = f.idx(&pairs);
    let one = f.c64(1);
    f.line(format!("%acc:4 = scf.for %p = {c0} to {pairsi} step {c1} iter_args(%a0 = {zero}, %a1 = {zero}, %a2 = {zero}, %a3 = {zero}) -> ({V}, {V}, {V}, {V}) {{"));
    let p = f.i64("%p");
    let b0 = f.mul(&p, &c2);
    let b1 = f.add(&b0, &one);
    // (the weight bytes these two blocks start at)
    let qb = quant_bytes(dtype);
    let cq = f.c64(qb);
    let at = f.mul(&b0, &cq);
    prefetch_ahead(&mut f, &row, &at, 2 * qb);
    let (e0, e1) = gemv_block(&mut f, dtype, &row, &nb, &xr, &dr, &b0, ["%a0", "%a1"]);
    let (o0, o1) = gemv_block(&mut f, dtype, &row, &nb, &xr, &dr, &b1, ["%a2", "%a3"]);
    f.line(format!("scf.yield {e0}, {e1}, {o0}, {o1} : {V}, {V}, {V}, {V}"));
    f.line("}");
    let rem = f.op(format!("arith.remui {nb}, {c2} : i64"));
    let z64 = f.c64(0);
    let odd = f.op(format!("arith.cmpi ne, {rem}, {z64} : i64"));
    let last = f.op(format!("arith.subi {nb}, {one} : i64"));
    let t = f.v();
    f.line(format!("{t}:2 = scf.if {odd} -> ({V}, {V}) {{"));
    let (t0, t1) = gemv_block(&mut f, dtype, &row, &nb, &xr, &dr, &last, ["%acc#0", "%acc#1"]);
    f.line(format!("scf.yield {t0}, {t1} : {V}, {V}"));
    f.line("} else {");
    f.line(format!("scf.yield %acc#0, %acc#1 : {V}, {V}"));
    f.line("}");
    let s0 = f.op(format!("arith.addf {t}#0, {t}#1 : {V}"));
    let s1 = f.op(format!("arith.addf %acc#2, %acc#3 : {V}"));
    let s = f.op(format!("arith.addf {s0}, {s1} : {V}"));
    let r = f.op(format!("vector.reduction <add>, {s} : {V} into f32"));
    let r = f.op(format!("arith.addf {r}, {ms} : f32"));
    gemv_store(&mut f, &i, &j, &r);
    format!("  func.func @{}_gemv({SIG}) {{\n{}    return\n  }}\n", symbol(dtype), f.s)
}

/// `<sym>_gemm`: four weight rows widened into scratch, then 4×4 (and 1×4) register tiles.
/// (`decl`: how the function is declared — `func.func @<sym>_gemm`, or the AMX library's
/// private `_gemm_fma` for its few-row calls.)
pub(super) fn emit_gemm(dtype: DType, decl: &str) -> String {
    let mut f = F { s: String::new(), n: 0 };
    let (nb, rowb) = prologue(&mut f, dtype);
    let (n0, n1, nbi) = (f.idx("%n0"), f.idx("%n1"), f.idx(&nb));
    let (c0, c1, c4) = (f.cidx(0), f.cidx(1), f.cidx(4));
    let zero = f.op(format!("arith.constant dense<0.0> : {V}"));
    let cu = f.c64(unit_elements(dtype) as i64);
    let mask = f.c64(-4);
    let m4 = f.op(format!("arith.andi %m, {mask} : i64"));
    let (m4i, mi, ki) = (f.idx(&m4), f.idx("%m"), f.idx("%k"));
    let c16i = f.cidx(16);
    f.line(format!("scf.for %jt = {n0} to {n1} step {c4} {{"));
    let jt = f.i64("%jt");
    // widen four weight rows into scratch[r * k ..]
    f.line(format!("scf.for %r = {c0} to {c4} step {c1} {{"));
    let r = f.i64("%r");
    let jr = f.add(&jt, &r);
    let roff = f.mul(&jr, &rowb);
    let row = f.gep("%w", &roff, "i8");
    let soff = f.mul(&r, "%k");
    let srow = f.gep("%scratch", &soff, "f32");
    f.line(format!("scf.for %b = {c0} to {nbi} step {c1} {{"));
    let b = f.i64("%b");
    let ws = widen_unit(&mut f, dtype, &row, &nb, &b);
    let e = f.mul(&b, &cu);
    let ps = f.gep(&srow, &e, "f32");
    for (v, w) in ws.iter().enumerate() {
        let c = f.c64(16 * v as i64);
        let p = f.gep(&ps, &c, "f32");
        f.line(format!("llvm.store {w}, {p} {{alignment = 4 : i64}} : {V}, !llvm.ptr"));
    }
    f.line("}");
    f.line("}");
    // the four scratch rows
    let srows: Vec<String> = (0..4)
        .map(|r| {
            let c = f.c64(r);
            let o = f.mul(&c, "%k");
            f.gep("%scratch", &o, "f32")
        })
        .collect();
    // a tile of `rows` x rows (1 or 4) starting at x row %i
    let tile = |f: &mut F, rows: usize, iv: &str| {
        let i = f.i64(iv);
        let xrows: Vec<String> = (0..rows as i64)
            .map(|q| {
                let c = f.c64(q);
                let ii = f.add(&i, &c);
                let o = f.mul(&ii, "%k");
                f.gep("%x", &o, "f32")
            })
            .collect();
        let nacc = rows * 4;
        let names: Vec<String> = (0..nacc).map(|a| format!("%t{a}")).collect();
        let init: Vec<String> = names.iter().map(|n| format!("{n} = {zero}")).collect();
        let tys = vec![V; nacc].join(", ");
        let res = f.v();
        f.line(format!("{res}:{nacc} = scf.for %kk = {c0} to {ki} step {c16i} iter_args({}) -> ({tys}) {{", init.join(", ")));
        let kk = f.i64("%kk");
        let xs: Vec<String> = xrows
            .iter()
            .map(|xr| {
                let p = f.gep(xr, &kk, "f32");
                f.load(&p, V, 4)
            })
            .collect();
        let ws: Vec<String> = srows
            .iter()
            .map(|sr| {
                let p = f.gep(sr, &kk, "f32");
                f.load(&p, V, 4)
            })
            .collect();
        let mut outs = vec![];
        for (q, xv) in xs.iter().enumerate() {
            for (c, wv) in ws.iter().enumerate() {
                outs.push(f.op(format!("vector.fma {xv}, {wv}, {} : {V}", names[q * 4 + c])));
            }
        }
        f.line(format!("scf.yield {} : {tys}", outs.join(", ")));
        f.line("}");
        for q in 0..rows {
            let c = f.c64(q as i64);
            let ii = f.add(&i, &c);
            let yrow = f.mul(&ii, "%ldy");
            for cc in 0..4 {
                let s = f.op(format!("vector.reduction <add>, {res}#{} : {V} into f32", q * 4 + cc));
                let col = f.c64(cc as i64);
                let jc = f.add(&jt, &col);
                let at = f.add(&yrow, &jc);
                store_f32(f, "%y", &at, &s);
            }
        }
    };
    f.line(format!("scf.for %i4 = {c0} to {m4i} step {c4} {{"));
    tile(&mut f, 4, "%i4");
    f.line("}");
    f.line(format!("scf.for %i1 = {m4i} to {mi} step {c1} {{"));
    tile(&mut f, 1, "%i1");
    f.line("}");
    f.line("}");
    format!("  {decl}({SIG}) {{\n{}    return\n  }}\n", f.s)
}

/// Both functions for `dtype`, as MLIR `func.func`s (the module body).
pub fn emit(dtype: DType) -> String {
    format!("{}{}", emit_gemv(dtype), emit_gemm(dtype, &format!("func.func @{}_gemm", symbol(dtype))))
}
