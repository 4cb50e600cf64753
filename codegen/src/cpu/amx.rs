//! The matmul family's `<sym>_gemm` (prefill, m ≥ [`AMX_FROM_ROWS`]) on AMX tiles, for the `x86-64-v4-amx`
//! library (Sapphire Rapids and later): the same C signature and result as
//! [`matmul`](super::matmul)'s f32 gemm, to about f32 accuracy, ~3x its rate (300 vs ~100
//! GFLOP/s a core on a Sapphire Rapids VM).
//!
//! AMX multiplies bf16 (8-bit significands) into f32. A bf16 product alone moves a dot
//! product by ~2e-3 of its size — far from the f32 executor the CPU backend is checked against
//! — so every operand is split into two bf16 (`v = hi + lo`, `hi = bf16(v)`, `lo = bf16(v −
//! hi)`: 16 significant bits) and the three products that matter are summed in f32:
//! `x·w ≈ xh·wh + xl·wh + xh·wl` (the dropped `xl·wl` is ~2^-16 of the product), three
//! `tdpbf16ps` where one would do (docs/perf.md, "CPU backend").
//!
//! Per call (the thread's columns `n0..n1`), in `scratch` (`dsc_ir::quant::cpu_matmul_scratch`)
//! from its first 64-byte boundary (a tile row across two cache lines costs two loads):
//! - the x rows split into bf16 `Ah`, `Al` (rows padded with zeros to a multiple of 16), once;
//! - per 32 output columns, their weight rows widened to f32 as the f32 gemm widens them
//!   ([`matmul::widen_unit`](super::matmul)), split, and scattered into the tiles' pair layout
//!   (`B[k/2][col][k%2]`: the 16 two-element words of a column's 32-element block go one to
//!   each of a tile's 16 rows), two 16-column tiles of hi and lo per 32-element block;
//! - then each 16 x rows: two f32 accumulator tiles (16 rows x 16 columns each) over the blocks,
//!   six `tdpbf16ps` a block (all eight tile registers: 2 accumulators, `Ah`, `Al`, 4 weight
//!   tiles), stored to a 16 x 32 buffer and copied out with masks (the last rows and columns).
//!
//! LLVM's AMX passes configure the tiles (`ldtilecfg` at entry, `tilerelease` at exit): the
//! tiles are the `*.internal` intrinsics on `!llvm.x86_amx` values, shapes as operands.

use super::matmul::{prologue, symbol, unit_elements, widen_unit, F, SIG, V};
use dsc_ir::DType;

const AMX: &str = "!llvm.x86_amx";

/// One AMX intrinsic call.
fn call(f: &mut F, name: &str, args: &[&str], tys: &[&str], ret: &str) -> String {
    let rhs = format!("llvm.call_intrinsic \"llvm.x86.{name}.internal\"({}) : ({}) -> {ret}", args.join(", "), tys.join(", "));
    if ret == "()" {
        f.line(rhs);
        String::new()
    } else {
        f.op(rhs)
    }
}

/// A 16-row x 64-byte tile loaded from `p`, rows `stride` bytes apart.
fn tile_load(f: &mut F, rows: &str, colsb: &str, p: &str, stride: &str) -> String {
    call(f, "tileloadd64", &[rows, colsb, p, stride], &["i16", "i16", "!llvm.ptr", "i64"], AMX)
}

/// `v` (vector<16xf32>) as its bf16 high part and the bf16 of what that leaves.
fn split(f: &mut F, v: &str) -> (String, String) {
    let bf = "vector<16xbf16>";
    let hi = f.op(format!("arith.truncf {v} : {V} to {bf}"));
    let he = f.op(format!("arith.extf {hi} : {bf} to {V}"));
    let r = f.op(format!("arith.subf {v}, {he} : {V}"));
    let lo = f.op(format!("arith.truncf {r} : {V} to {bf}"));
    (hi, lo)
}

/// x rows from which `<sym>_gemm` takes the tiles: with fewer, widening and scattering the
/// weights costs more than the tiles save (ctypes, Q4_1 k 576 n 3072, one core: the f32 gemm
/// 0.26 / 0.38 / 0.74 / 1.08 ms at 4 / 8 / 16 / 32 rows, the tiles 0.93 / 0.94 / 0.95 / 1.09),
/// so a batch of a few decoding sequences keeps the f32 gemm.
pub const AMX_FROM_ROWS: i64 = 32;

/// The AMX library's `<sym>_gemm`: fewer than [`AMX_FROM_ROWS`] x rows to the f32 gemm
/// (`<sym>_gemm_fma`), more to the tiles (`<sym>_gemm_amx`, [`emit_tiles`]): helpers the
/// runtime does not call.
pub fn emit_gemm(dtype: DType) -> String {
    let sym = symbol(dtype);
    let args = "%x, %w, %y, %scratch, %m, %k, %n0, %n1, %ldy";
    let tys = "(!llvm.ptr, !llvm.ptr, !llvm.ptr, !llvm.ptr, i64, i64, i64, i64, i64) -> ()";
    format!(
        "{}{}  func.func @{sym}_gemm({SIG}) {{\n    %from = arith.constant {AMX_FROM_ROWS} : i64\n    %few = arith.cmpi slt, %m, %from : i64\n    scf.if %few {{\n      func.call @{sym}_gemm_fma({args}) : {tys}\n    }} else {{\n      func.call @{sym}_gemm_amx({args}) : {tys}\n    }}\n    return\n  }}\n",
        super::matmul::emit_gemm(dtype, &format!("func.func private @{sym}_gemm_fma")),
        emit_tiles(dtype)
    )
}

/// Which 1 KiB weight tile holds block `kb`'s hi (`hl` 0) or lo (1) words of 16-column tile `t`
/// (0, 1) of the 32 columns: `(t·nb + kb)·2 + hl` (the layout both the scatter and the tile
/// loads address).
fn weight_tile(f: &mut F, t: &str, nb: &str, kb: &str, hl: i64) -> String {
    let two = f.c64(2);
    let o = f.mul(t, nb);
    let o = f.add(&o, kb);
    let o = f.mul(&o, &two);
    let h = f.c64(hl);
    f.add(&o, &h)
}

/// `<sym>_gemm_amx`: the gemm on AMX tiles (the module doc).
fn emit_tiles(dtype: DType) -> String {
    let mut f = F { s: String::new(), n: 0 };
    let (nu, rowb) = prologue(&mut f, dtype);
    let (c0, c1) = (f.cidx(0), f.cidx(1));
    let z64 = f.c64(0);
    let (i2, i16, i32c, i64c) = (f.c64(2), f.c64(16), f.c64(32), f.c64(64));
    let c15 = f.c64(15);
    let mm = f.op(format!("arith.addi %m, {c15} : i64"));
    let mask16 = f.c64(-16);
    let m16 = f.op(format!("arith.andi {mm}, {mask16} : i64"));
    let nb = f.op(format!("arith.divui %k, {i32c} : i64"));
    // scratch (bytes): Ah [m16][k] bf16, Al the same, then the weight tiles, then the buffer
    let xbytes = {
        let t = f.mul(&m16, "%k");
        f.mul(&t, &i2)
    };
    // (from the first 64-byte boundary in scratch: a tile row that crosses a cache line
    // costs two)
    let sp = f.op("llvm.ptrtoint %scratch : !llvm.ptr to i64");
    let c63 = f.c64(63);
    let sp = f.add(&sp, &c63);
    let m64 = f.c64(-64);
    let sp = f.op(format!("arith.andi {sp}, {m64} : i64"));
    let sbase = f.op(format!("llvm.inttoptr {sp} : i64 to !llvm.ptr"));
    let ah = f.gep(&sbase, &z64, "i8");
    let al = f.gep(&sbase, &xbytes, "i8");
    let bbase = {
        let t = f.mul(&xbytes, &i2);
        f.gep(&sbase, &t, "i8")
    };
    // (the weight tiles: [tile 0/1][block][hi/lo][16 rows][16 words], 1 KiB each)
    let cbuf = {
        let t = f.c64(4096);
        let t = f.mul(&nb, &t);
        f.gep(&bbase, &t, "i8")
    };
    let (mi, m16i, ki, nbi, nui) = (f.idx("%m"), f.idx(&m16), f.idx("%k"), f.idx(&nb), f.idx(&nu));
    let c16i = f.cidx(16);
    // x rows → Ah, Al; the padding rows zero
    let xrow = |f: &mut F, i: &str, zero: bool| {
        let xo = f.mul(i, "%k");
        let xr = f.gep("%x", &xo, "f32");
        f.line(format!("scf.for %xk = {c0} to {ki} step {c16i} {{"));
        let kk = f.i64("%xk");
        let at = f.add(&xo, &kk);
        let (hi, lo) = if zero {
            let z = f.op("arith.constant dense<0.0> : vector<16xbf16>");
            (z.clone(), z)
        } else {
            let p = f.gep(&xr, &kk, "f32");
            let v = f.load(&p, V, 4);
            split(f, &v)
        };
        for (base, v) in [(&ah, hi), (&al, lo)] {
            let p = f.gep(base, &at, "bf16");
            f.line(format!("llvm.store {v}, {p} {{alignment = 2 : i64}} : vector<16xbf16>, !llvm.ptr"));
        }
        f.line("}");
    };
    f.line(format!("scf.for %xi = {c0} to {mi} step {c1} {{"));
    let i = f.i64("%xi");
    xrow(&mut f, &i, false);
    f.line("}");
    f.line(format!("scf.for %xp = {mi} to {m16i} step {c1} {{"));
    let i = f.i64("%xp");
    xrow(&mut f, &i, true);
    f.line("}");
    // word r of a column's block goes to row r of its tile: 16 words (64 bytes) a row
    let rows: Vec<String> = (0..16).map(|r| (16 * r).to_string()).collect();
    let roffs = f.op(format!("arith.constant dense<[{}]> : vector<16xi64>", rows.join(", ")));
    let all = f.op("arith.constant dense<true> : vector<16xi1>");
    let upb = (unit_elements(dtype) / 32) as i64;
    let (n0, n1) = (f.idx("%n0"), f.idx("%n1"));
    let c32i = f.cidx(32);
    f.line(format!("scf.for %jt = {n0} to {n1} step {c32i} {{"));
    let jt = f.i64("%jt");
    let left = f.op(format!("arith.subi %n1, {jt} : i64"));
    let ncols = f.op(format!("arith.minsi {left}, {i32c} : i64"));
    let ncolsi = f.idx(&ncols);
    // widen, split and scatter the tile columns' weights (columns past n1 stay as they were:
    // they only reach accumulator columns that are not copied out)
    // (a unit of every column, then the next: the tiles being filled stay in L1 — a column at a
    // time over the whole row touched every line of the tiles, 74 KB at k 576, per column)
    f.line(format!("scf.for %u = {c0} to {nui} step {c1} {{"));
    let u = f.i64("%u");
    f.line(format!("scf.for %c = {c0} to {ncolsi} step {c1} {{"));
    let c = f.i64("%c");
    let col = f.add(&jt, &c);
    let ro = f.mul(&col, &rowb);
    let row = f.gep("%w", &ro, "i8");
    let t = f.op(format!("arith.divui {c}, {i16} : i64"));
    let cc = f.op(format!("arith.remui {c}, {i16} : i64"));
    let ws = widen_unit(&mut f, dtype, &row, &nu, &u);
    for s in 0..upb {
        let cs = f.c64(s);
        let cu = f.c64(upb);
        let kb = f.mul(&u, &cu);
        let kb = f.add(&kb, &cs);
        let (h0, l0) = split(&mut f, &ws[2 * s as usize]);
        let (h1, l1) = split(&mut f, &ws[2 * s as usize + 1]);
        for (hl, (a, b)) in [(h0, h1), (l0, l1)].into_iter().enumerate() {
            let lanes: Vec<String> = (0..32).map(|q| q.to_string()).collect();
            let cat = f.op(format!("vector.shuffle {a}, {b} [{}] : vector<16xbf16>, vector<16xbf16>", lanes.join(", ")));
            let words = f.op(format!("vector.bitcast {cat} : vector<32xbf16> to vector<16xi32>"));
            // word offset of row 0: the tile's 256 words in, + cc
            let o = weight_tile(&mut f, &t, &nb, &kb, hl as i64);
            let c256 = f.c64(256);
            let o = f.mul(&o, &c256);
            let o = f.add(&o, &cc);
            let ov = f.op(format!("vector.broadcast {o} : i64 to vector<16xi64>"));
            let offs = f.op(format!("arith.addi {ov}, {roffs} : vector<16xi64>"));
            let ptrs = f.op(format!("llvm.getelementptr {bbase}[{offs}] : (!llvm.ptr, vector<16xi64>) -> vector<16x!llvm.ptr>, i32"));
            f.line(format!("llvm.intr.masked.scatter {words}, {ptrs}, {all} {{alignment = 4 : i32}} : vector<16xi32>, vector<16xi1> into vector<16x!llvm.ptr>"));
        }
    }
    f.line("}");
    f.line("}");
    // 16 x rows at a time: two accumulator tiles over the blocks
    let (r16, cb64) = (f.op("arith.constant 16 : i16"), f.op("arith.constant 64 : i16"));
    let xstride = f.mul("%k", &i2);
    f.line(format!("scf.for %mt = {c0} to {m16i} step {c16i} {{"));
    let mt = f.i64("%mt");
    // (a zero tile each: one shared would be copied through memory, AMX has no tile move)
    let z0 = call(&mut f, "tilezero", &[&r16, &cb64], &["i16", "i16"], AMX);
    let z1 = call(&mut f, "tilezero", &[&r16, &cb64], &["i16", "i16"], AMX);
    let acc = f.v();
    f.line(format!("{acc}:2 = scf.for %kb = {c0} to {nbi} step {c1} iter_args(%c0 = {z0}, %c1 = {z1}) -> ({AMX}, {AMX}) {{"));
    let kb = f.i64("%kb");
    let xo = f.mul(&mt, "%k");
    let ko = f.mul(&kb, &i32c);
    let xo = f.add(&xo, &ko);
    let pa = f.gep(&ah, &xo, "bf16");
    let pl = f.gep(&al, &xo, "bf16");
    let th = tile_load(&mut f, &r16, &cb64, &pa, &xstride);
    let tl = tile_load(&mut f, &r16, &cb64, &pl, &xstride);
    let mut wt = vec![];
    for tt in 0..2i64 {
        for hl in 0..2i64 {
            let ct = f.c64(tt);
            let o = weight_tile(&mut f, &ct, &nb, &kb, hl);
            let c1k = f.c64(1024);
            let o = f.mul(&o, &c1k);
            let p = f.gep(&bbase, &o, "i8");
            wt.push(tile_load(&mut f, &r16, &cb64, &p, &i64c));
        }
    }
    let dp = |f: &mut F, c: &str, a: &str, b: &str| call(f, "tdpbf16ps", &[&r16, &cb64, &cb64, c, a, b], &["i16", "i16", "i16", AMX, AMX, AMX], AMX);
    let a0 = dp(&mut f, "%c0", &th, &wt[0]);
    let a1 = dp(&mut f, "%c1", &th, &wt[2]);
    let a0 = dp(&mut f, &a0, &tl, &wt[0]);
    let a1 = dp(&mut f, &a1, &tl, &wt[2]);
    let a0 = dp(&mut f, &a0, &th, &wt[1]);
    let a1 = dp(&mut f, &a1, &th, &wt[3]);
    f.line(format!("scf.yield {a0}, {a1} : {AMX}, {AMX}"));
    f.line("}");
    let c128 = f.c64(128);
    let cb2 = f.gep(&cbuf, &i64c, "i8");
    for (p, t) in [(&cbuf, format!("{acc}#0")), (&cb2, format!("{acc}#1"))] {
        call(&mut f, "tilestored64", &[&r16, &cb64, p, &c128, &t], &["i16", "i16", "!llvm.ptr", "i64", AMX], "()");
    }
    // copy the buffer's valid rows and columns out
    let mleft = f.op(format!("arith.subi %m, {mt} : i64"));
    let nrows = f.op(format!("arith.minsi {mleft}, {i16} : i64"));
    let nrowsi = f.idx(&nrows);
    let masks: Vec<String> = (0..2i64)
        .map(|h| {
            let ch = f.c64(16 * h);
            let n = f.op(format!("arith.subi {ncols}, {ch} : i64"));
            let n = f.op(format!("arith.maxsi {n}, {z64} : i64"));
            let n = f.op(format!("arith.minsi {n}, {i16} : i64"));
            let ni = f.idx(&n);
            f.op(format!("vector.create_mask {ni} : vector<16xi1>"))
        })
        .collect();
    f.line(format!("scf.for %r = {c0} to {nrowsi} step {c1} {{"));
    let r = f.i64("%r");
    let bo = f.mul(&r, &c128);
    let ii = f.add(&mt, &r);
    let yo = f.mul(&ii, "%ldy");
    let yo = f.add(&yo, &jt);
    for (h, mask) in masks.iter().enumerate() {
        let ch = f.c64(64 * h as i64);
        let o = f.add(&bo, &ch);
        let p = f.gep(&cbuf, &o, "i8");
        let v = f.load(&p, V, 4);
        let c = f.c64(16 * h as i64);
        let o = f.add(&yo, &c);
        let py = f.gep("%y", &o, "f32");
        f.line(format!("llvm.intr.masked.store {v}, {py}, {mask} {{alignment = 4 : i32}} : {V}, vector<16xi1> into !llvm.ptr"));
    }
    f.line("}");
    f.line("}");
    f.line("}");
    format!("  func.func private @{}_gemm_amx({SIG}) {{\n{}    return\n  }}\n", symbol(dtype), f.s)
}
