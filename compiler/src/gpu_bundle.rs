//! `dsc gpu-bundle`: every generated kernel, compiled to PTX, with fresh random inputs and the
//! CPU reference executor's outputs, for `dsc-runtime gpu-check` to run on a GPU.

use anyhow::Context;
use dsc_codegen::kernels::{BinaryOpKey, UnaryOpKey};
use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec, Launch};
use dsc_ir::{text, BinaryOp, DType, Executor, Tensor, UnaryOp};
use dsc_runtime::gpu_check::{Array, Bundle, Case, TmapInput};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

struct Data(Vec<u8>);
impl Data {
    fn push(&mut self, v: &[f32]) -> Array {
        let a = Array { offset: self.0.len(), len: v.len(), dtype: "f32".into() };
        self.0.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        a
    }
    fn push_i32(&mut self, v: &[i32]) -> Array {
        let a = Array { offset: self.0.len(), len: v.len(), dtype: "i32".into() };
        self.0.extend(v.iter().flat_map(|x| x.to_le_bytes()));
        a
    }
    /// a KV pool's values as `kv` (f32, or bf16 bytes: the values are already bf16-exact)
    fn push_kv(&mut self, v: &[f32], kv: DType) -> Array {
        if kv == DType::F32 {
            return self.push(v);
        }
        let bytes = dsc_ir::quant::encode(DType::BF16, v).expect("bf16 encodes");
        Array { dtype: "bf16".into(), len: v.len(), ..self.push_u8(&bytes) }
    }
    fn push_u8(&mut self, v: &[u8]) -> Array {
        let a = Array { offset: self.0.len(), len: v.len(), dtype: "u8".into() };
        self.0.extend_from_slice(v);
        // keep every array 16-byte aligned
        while self.0.len() % 16 != 0 {
            self.0.push(0);
        }
        a
    }
}

type Weights = HashMap<String, (DType, Vec<usize>, Vec<u8>)>;

/// Evaluate `src` (a one-op graph) on the CPU reference executor.
fn reference(src: &str, inputs: Vec<(&str, Tensor)>, weights: &Weights) -> anyhow::Result<Vec<f32>> {
    let g = text::parse(src)?;
    let mut ex = Executor::new(&g, weights, BTreeMap::new())?;
    let out = ex.run(&inputs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())?;
    Ok(out.into_values().next().context("one output")?.data)
}

/// The CPU reference of x[M, K] @ w^T (`w` in `weights`, [N, K] of `wdtype`), plus `r`
/// [M, N] when given (matmul_add: the residual epilogue).
fn matmul_reference(x: &[f32], r: Option<&[f32]>, m: usize, k: usize, n: usize, wdtype: DType, weights: &Weights) -> anyhow::Result<Vec<f32>> {
    let mut inputs = vec![("x", Tensor::new(vec![m, k], x.to_vec()))];
    let src = match r {
        Some(r) => {
            inputs.push(("r", Tensor::new(vec![m, n], r.to_vec())));
            format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %r = input : f32[{m}, {n}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul_add(%x, %w, %r) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n")
        }
        None => format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n"),
    };
    reference(&src, inputs, weights)
}

/// Random weights w0, w1, .. of [N_i, K] for merged-matmul cases: their bytes in `wdtype`, the
/// weight source for the CPU reference, and their declarations in the graph text.
fn part_weights(parts: &[usize], k: usize, wdtype: DType, rand_vec: &mut dyn FnMut(usize, f32, f32) -> Vec<f32>) -> anyhow::Result<(Vec<Vec<u8>>, Weights, String)> {
    let enc: Vec<Vec<u8>> = parts.iter().map(|&p| dsc_ir::quant::encode(wdtype, &rand_vec(p * k, -0.1, 0.1))).collect::<Option<_>>().context("encode")?;
    let ws: Weights = parts.iter().zip(&enc).enumerate().map(|(i, (&p, b))| (format!("w{i}"), (wdtype, vec![p, k], b.clone()))).collect();
    let decl = parts.iter().enumerate().map(|(i, p)| format!("  %w{i} = weight : {wdtype}[{p}, {k}]\n")).collect();
    Ok((enc, ws, decl))
}

/// Bytes as little-endian f32 words (how a case's 16-bit data travels: pairs in a word).
fn le_words(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A merged matmul's row-major [m, sum(parts)] result in the GPU's part-major layout: part i
/// is a contiguous [m, N_i] after the parts before it.
fn part_major(rowmajor: &[f32], m: usize, parts: &[usize]) -> Vec<f32> {
    let total: usize = parts.iter().sum();
    let mut out = Vec::with_capacity(rowmajor.len());
    let mut off = 0;
    for &p in parts {
        for r in 0..m {
            out.extend_from_slice(&rowmajor[r * total + off..r * total + off + p]);
        }
        off += p;
    }
    out
}

fn grid(launch: &Launch, n: usize) -> (u32, u32) {
    match launch {
        Launch::PerElement { threads } => ((n as u32).div_ceil(*threads), *threads),
        Launch::WarpPerRow { rows_per_block } => ((n as u32).div_ceil(*rows_per_block), 32 * rows_per_block),
        Launch::WarpPerOutput { warps_per_block } => ((n as u32).div_ceil(*warps_per_block), 32 * warps_per_block),
        Launch::BlockPerRow { warps } => (n as u32, 32 * warps),
        Launch::WarpPerTile { warps_per_block } => ((n as u32).div_ceil(8).div_ceil(*warps_per_block), 32 * warps_per_block),
        Launch::WarpgroupPerTile { n_tile } => ((n as u32).div_ceil(*n_tile), 128),
        Launch::OutputsPerBlock { outputs, warps, .. } => ((n as u32).div_ceil(*outputs), 32 * warps),
        Launch::Tile { outputs, threads, .. } => ((n as u32).div_ceil(*outputs), *threads),
    }
}

/// A pipelined-matmul check case once more warp-specialized (`KernelSpec::Ws`): x and the
/// weights as tensor maps (`tmaps`: x's first), one more warpgroup (the producer), the same
/// data and grid; None where the tiling has no such variant (64-row tiles, x in f32, more
/// stages than the mbarrier space holds).
fn ws_variant(case: &Case, spec: &KernelSpec, m: usize, k: usize, f16: bool, weights: &[usize]) -> Option<(Case, KernelSpec)> {
    // (the SwiGLU epilogue's tile: bn/2 rows from each of the two weights)
    let swiglu = matches!(spec, KernelSpec::SwiGluPipe { .. });
    let KernelSpec::MatMulPipe { bn, stages, a16: true, bm, .. } = *spec.pipe_core() else { return None };
    if stages * 16 > dsc_codegen::kernels::TMA_MBAR_BYTES {
        return None;
    }
    // (a warpgroup's columns: half the tile's in 64-row tiles; SwiGLU boxes half of those)
    let wn = if bm == 64 { bn / 2 } else { bn };
    let rows = if swiglu { wn / 2 } else { bn } as u32;
    let ws = KernelSpec::Ws { inner: Box::new(spec.clone()) };
    let mut tmaps = vec![TmapInput { input: 0, n: m, k, rows: bm as u32, f16, pool: None }];
    tmaps.extend(weights.iter().enumerate().map(|(i, &n)| TmapInput { input: 1 + i, n, k, rows, f16, pool: None }));
    let (_, threads) = grid(&ws.launch(), 1);
    Some((Case { name: format!("{} ws", case.name), kernel: ws.symbol(), tmaps, block: threads, ..case.clone() }, ws))
}

/// A pipelined-matmul check case once more with its W tiles by TMA (`KernelSpec::Tma`): the
/// same data and grid (the wrapper only adds shared memory), `tmaps` naming the weight inputs.
fn tma_variant(case: &Case, spec: &KernelSpec, tmaps: Vec<TmapInput>) -> (Case, KernelSpec) {
    let tma = KernelSpec::Tma { inner: Box::new(spec.clone()) };
    (Case { name: format!("{} tma", case.name), kernel: tma.symbol(), tmaps, ..case.clone() }, tma)
}

pub fn write_bundle(dir: &Path, seed: u64) -> anyhow::Result<usize> {
    write_bundle_only(dir, seed, &[], &dsc_codegen::CodegenOptions::default())
}

/// [`write_bundle`] keeping only the cases whose kernel name contains one of `only` (all when
/// empty), and only their kernels and data: a focused check that fits one device call beside
/// a plan. The kernels' bodies are written as `opts.kernels` says; `opts.schedule` picks the
/// variants the plans would (TMA matmuls, the attention's keys per step and o-projection
/// blocks).
pub fn write_bundle_only(dir: &Path, seed: u64, only: &[String], opts: &dsc_codegen::CodegenOptions) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut rand_vec = |n: usize, lo: f32, hi: f32| -> Vec<f32> { (0..n).map(|_| rng.random_range(lo..hi)).collect() };
    let mut data = Data(vec![]);
    let mut cases = vec![];
    let mut specs = vec![];
    let none = Weights::new();
    let n = 20_011usize; // not a multiple of the block: exercises the bounds check
    let unary = [UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Recip, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Relu, UnaryOp::Silu, UnaryOp::Gelu, UnaryOp::GeluErf];
    for u in unary {
        let spec = KernelSpec::Unary(UnaryOpKey(u));
        let (lo, hi) = match u {
            UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Recip => (0.05, 4.0),
            _ => (-4.0, 4.0),
        };
        let x = rand_vec(n, lo, hi);
        let name = dsc_ir::Op::Unary(u).name();
        let want = reference(&format!("graph \"k\" {{\n  %x = input : f32[N]\n  %y = {name}(%x) : f32[N]\n  output y = %y\n}}\n"), vec![("x", Tensor::new(vec![n], x.clone()))], &none)?;
        let (g, b) = grid(&spec.launch(), n);
        // approx instructions (ex2/tanh/rsqrt .approx) are good to ~1e-6 relative per element
        let tol = if matches!(u, UnaryOp::Neg | UnaryOp::Relu | UnaryOp::Sqrt | UnaryOp::Recip) { 1e-6 } else { 1e-4 };
        cases.push(Case {
            name: format!("{name} n={n}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&x)],
            scalars: vec![n as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol,
            cluster: None,
        });
        specs.push(spec);
    }
    for bop in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min, BinaryOp::SiluMul] {
        let spec = KernelSpec::Binary(BinaryOpKey(bop));
        let name = dsc_ir::Op::Binary(bop).name();
        for (rows, cols, bcast) in [(33usize, 576usize, false), (33, 576, true)] {
            let a = rand_vec(rows * cols, -3.0, 3.0);
            let bl = if bcast { cols } else { rows * cols };
            let bv: Vec<f32> = rand_vec(bl, 0.5, 2.0).into_iter().enumerate().map(|(i, v)| if i % 2 == 0 { v } else { -v }).collect();
            let bshape = if bcast { format!("[{cols}]") } else { format!("[{rows}, {cols}]") };
            let src = format!("graph \"k\" {{\n  %a = input : f32[{rows}, {cols}]\n  %b = input : f32{bshape}\n  %y = {name}(%a, %b) : f32[{rows}, {cols}]\n  output y = %y\n}}\n");
            let bt = if bcast { Tensor::new(vec![cols], bv.clone()) } else { Tensor::new(vec![rows, cols], bv.clone()) };
            let want = reference(&src, vec![("a", Tensor::new(vec![rows, cols], a.clone())), ("b", bt)], &none)?;
            let (g, b) = grid(&spec.launch(), rows * cols);
            cases.push(Case {
                name: format!("{name} {rows}x{cols}{}", if bcast { " bcast" } else { "" }),
                kernel: spec.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![data.push(&a), data.push(&bv)],
                scalars: vec![(rows * cols) as i64, bl as i64],
                expected: data.push(&want),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-6,
                cluster: None,
            });
        }
        specs.push(spec);
    }
    // silu_mul writing the 16-bit copy the down projection reads (norm + quantize's sibling):
    // y over a NaN-filled buffer, the copy (as 32-bit words of 16-bit pairs) the output
    for f16 in [false, true] {
        let (rows, cols) = (33usize, 576usize);
        let a = rand_vec(rows * cols, -3.0, 3.0);
        let bv = rand_vec(rows * cols, -2.0, 2.0);
        let src = format!("graph \"k\" {{\n  %a = input : f32[{rows}, {cols}]\n  %b = input : f32[{rows}, {cols}]\n  %y = silu_mul(%a, %b) : f32[{rows}, {cols}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("a", Tensor::new(vec![rows, cols], a.clone())), ("b", Tensor::new(vec![rows, cols], bv.clone()))], &none)?;
        let half = dsc_ir::quant::encode(if f16 { DType::F16 } else { DType::BF16 }, &want).context("encode")?;
        let words: Vec<f32> = le_words(&half);
        let spec = KernelSpec::SiluMulHalf { f16 };
        let (g, b) = grid(&spec.launch(), rows * cols);
        cases.push(Case {
            name: format!("silu_mul {rows}x{cols} + {} copy", if f16 { "f16" } else { "bf16" }),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&a), data.push(&bv), data.push(&vec![f32::NAN; rows * cols])],
            scalars: vec![(rows * cols) as i64, (rows * cols) as i64],
            expected: data.push(&words),
            init: None,
            written_inputs: vec![(2, data.push(&want))],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        });
        specs.push(spec);
    }
    for (rows, d) in [(77usize, 576usize), (5, 4096), (3, 8192), (9, 2048)] {
        let eps = 1e-5f32;
        let spec = KernelSpec::RmsNorm { d, eps_bits: eps.to_bits() };
        let x = rand_vec(rows * d, -2.0, 2.0);
        let w = rand_vec(d, 0.5, 1.5);
        let ws: Weights = HashMap::from([("w".to_string(), (DType::F32, vec![d], w.iter().flat_map(|v| v.to_le_bytes()).collect()))]);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %w = weight : f32[{d}]\n  %y = rms_norm(%x, %w) {{eps = {eps:?}}} : f32[{rows}, {d}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![rows, d], x.clone()))], &ws)?;
        let (g, b) = grid(&spec.launch(), rows);
        let (xa, wa, ya) = (data.push(&x), data.push(&w), data.push(&want));
        cases.push(Case {
            name: format!("rms_norm {rows}x{d}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![xa.clone(), wa.clone()],
            scalars: vec![rows as i64],
            expected: ya.clone(),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        specs.push(spec);
        // norm + quantize (DSC_NORM_HALF): y as above, and its bf16/f16 copy as the output
        // (compared as the 32-bit words of 16-bit pairs: equal where the rounding agrees)
        if rows * d <= 5 * 4096 {
            let poison = data.push(&vec![f32::NAN; rows * d]);
            for f16 in [false, true] {
                let spec = KernelSpec::RmsNormHalf { d, eps_bits: eps.to_bits(), f16 };
                let half = dsc_ir::quant::encode(if f16 { DType::F16 } else { DType::BF16 }, &want).context("encode")?;
                let words: Vec<f32> = le_words(&half);
                let (g, b) = grid(&spec.launch(), rows);
                cases.push(Case {
                    name: format!("rms_norm {rows}x{d} + {} copy", if f16 { "f16" } else { "bf16" }),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y: 1,
                    block: b,
                    inputs: vec![xa.clone(), wa.clone(), poison.clone()],
                    scalars: vec![rows as i64],
                    expected: data.push(&words),
                    init: None,
                    written_inputs: vec![(2, ya.clone())],
                    tmaps: vec![],
                    tol: 1e-2,
                    cluster: None,
                });
                specs.push(spec);
            }
            // (and over gathered rows — the logits' row gather folded into the final norm,
            // `RowGather`: 3 of the rows, out of order, the last one among them)
            let pick: Vec<i32> = vec![rows as i32 - 1, 0, (rows / 2) as i32];
            let spec = KernelSpec::RowGather { inner: Box::new(KernelSpec::RmsNormHalf { d, eps_bits: eps.to_bits(), f16: false }) };
            let y: Vec<f32> = pick.iter().flat_map(|&r| want[r as usize * d..(r as usize + 1) * d].iter().copied()).collect();
            let words: Vec<f32> = le_words(&dsc_ir::quant::encode(DType::BF16, &y).context("encode")?);
            let (g, b) = grid(&spec.launch(), pick.len());
            cases.push(Case {
                name: format!("rms_norm of rows {pick:?} of {rows}x{d} + bf16 copy"),
                kernel: spec.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![data.push_i32(&pick), xa.clone(), wa.clone(), data.push(&vec![f32::NAN; pick.len() * d])],
                scalars: vec![pick.len() as i64],
                expected: data.push(&words),
                init: None,
                written_inputs: vec![(3, data.push(&y))],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            });
            specs.push(spec);
        }
    }

    // matmul: x[M, K] @ W[N, K]^T for every weight dtype, decode (M = 1) and prefill-like M
    // (N = 512: the bundle, the runtime and the tracked files share one call's 64 MiB)
    let (k, n) = (576usize, 512usize);
    let wf = rand_vec(n * k, -0.1, 0.1);
    for wdtype in [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
        let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
        let warr = data.push_u8(&wb);
        let spec = KernelSpec::MatMul { k, n, wdtype, bias: false, residual: false };
        // (and the wide GEMV, the small model's lm_head, over the first 500 of the 512 rows: a
        // partial block; at 1 and 3 rows where the plain one takes 1 and 7, one reference each)
        let nw = 500usize;
        let wide = dsc_codegen::kernels::wide_gemv_kernel_fits(k, wdtype).is_ok().then_some(KernelSpec::MatMulWide { k, n: nw, wdtype, bias: false, residual: false });
        let first_cols = |y: &[f32], m: usize| -> Vec<f32> { (0..m).flat_map(|r| y[r * n..r * n + nw].to_vec()).collect() };
        for m in [1usize, 3, 7] {
            let (plain, wide) = (m != 3, wide.as_ref().filter(|_| m != 7));
            if !plain && wide.is_none() {
                continue;
            }
            let x = rand_vec(m * k, -1.0, 1.0);
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
            let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
            let xa = data.push(&x);
            let mut add = |name: String, spec: &KernelSpec, cols: usize, expected: Vec<f32>| {
                let (g, b) = grid(&spec.launch(), cols);
                cases.push(Case {
                    name,
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y: m as u32,
                    block: b,
                    inputs: vec![xa.clone(), warr.clone()],
                    scalars: vec![cols as i64],
                    expected: data.push(&expected),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
            };
            if plain {
                add(format!("matmul {m}x{k}x{n} {wdtype}"), &spec, n, want.clone());
            }
            if let Some(w) = wide {
                add(format!("matmul_wide {m}x{k}x{nw} {wdtype}"), w, nw, first_cols(&want, m));
            }
        }
        specs.push(spec);
        // (bf16: the wide GEMV with the final norm and the logits' row gather folded in, rows
        // 8, 0, 4 of 9 hidden rows)
        if let Some(spec) = wide {
            let norm = KernelSpec::RowGather { inner: Box::new(KernelSpec::NormMatMul { inner: Box::new(spec.clone()), eps_bits: 1e-5f32.to_bits() }) };
            specs.push(spec);
            if wdtype == DType::BF16 {
                let (t, pick) = (9usize, [8i32, 0, 4]);
                let m = pick.len();
                let hidden = rand_vec(t * k, -2.0, 2.0);
                let gw = rand_vec(k, 0.5, 1.5);
                let rows: Vec<f32> = pick.iter().flat_map(|&r| hidden[r as usize * k..(r as usize + 1) * k].to_vec()).collect();
                let mut wsn = ws.clone();
                wsn.insert("g".into(), (DType::F32, vec![k], dsc_ir::quant::encode(DType::F32, &gw).context("encode")?));
                let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %g = weight : f32[{k}]\n  %xn = rms_norm(%x, %g) {{eps = 0.00001}} : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%xn, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = reference(&src, vec![("x", Tensor::new(vec![m, k], rows))], &wsn)?;
                let (g, b) = grid(&norm.launch(), nw);
                cases.push(Case {
                    name: format!("rms_norm+matmul_wide {m} of {t} rows gathered x{k}x{nw} {wdtype}"),
                    kernel: norm.symbol(),
                    grid: g,
                    grid_y: m as u32,
                    block: b,
                    inputs: vec![data.push_i32(&pick), data.push(&hidden), data.push(&gw), warr.clone()],
                    scalars: vec![nw as i64],
                    expected: data.push(&first_cols(&want, m)),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
                // (and with the greedy argmax folded in: the logits as above, each row's
                // first maximal index, the counters back at zero)
                let fold = KernelSpec::ArgmaxFold { inner: Box::new(norm.clone()) };
                let logits = first_cols(&want, m);
                let ids: Vec<f32> = (0..m)
                    .map(|r| {
                        let row = &logits[r * nw..(r + 1) * nw];
                        let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        row.iter().position(|&v| v == best).unwrap_or(0) as f32
                    })
                    .collect();
                let blocks = g as usize;
                cases.push(Case {
                    name: format!("rms_norm+matmul_wide+argmax {m} of {t} rows gathered x{k}x{nw} {wdtype}"),
                    kernel: fold.symbol(),
                    grid: g,
                    grid_y: m as u32,
                    block: b,
                    inputs: vec![
                        data.push(&vec![0.0; 2 * blocks * m]),
                        data.push_i32(&vec![0; m]),
                        data.push_i32(&vec![-1; m]),
                        data.push_i32(&pick),
                        data.push(&hidden),
                        data.push(&gw),
                        warr.clone(),
                    ],
                    scalars: vec![nw as i64],
                    expected: data.push(&logits),
                    init: None,
                    written_inputs: vec![(1, data.push(&vec![0.0; m])), (2, data.push(&ids))],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
                specs.push(fold);
                specs.push(norm);
            }
        }
        // the batched-decode GEMV (8 activation rows per block): a partial second row block
        if matches!(wdtype, DType::F32 | DType::F16 | DType::BF16) {
            let rows = dsc_codegen::kernels::few_rows(wdtype);
            let spec = KernelSpec::MatMulFew { k, n, wdtype, bias: false, residual: false, rows };
            // bf16/f16 run on the tensor cores (activations rounded): bf16-level tolerance
            let tol = if wdtype == DType::F32 { 1e-5 } else { 1e-2 };
            for m in [2usize, 13, 37] {
                let x = rand_vec(m * k, -1.0, 1.0);
                let src =
                    format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
                let (g, b) = grid(&spec.launch(), n);
                cases.push(Case {
                    name: format!("gemv_few {m}x{k}x{n} {wdtype}"),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y: m.div_ceil(rows) as u32,
                    block: b,
                    inputs: vec![data.push(&x), warr.clone()],
                    scalars: vec![m as i64, n as i64],
                    expected: data.push(&want),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol,
                    cluster: None,
                });
            }
            specs.push(spec);
        }
        // tensor cores (mma.sync, bf16/f16 operands, f32 accumulation): bf16-level tolerance
        let spec = KernelSpec::MatMulMma { k, n, wdtype, bias: false, residual: false };
        for m in [16usize, 37] {
            let x = rand_vec(m * k, -1.0, 1.0);
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
            let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
            let (g, b) = grid(&spec.launch(), n);
            cases.push(Case {
                name: format!("mma {m}x{k}x{n} {wdtype}"),
                kernel: spec.symbol(),
                grid: g,
                grid_y: m.div_ceil(16) as u32,
                block: b,
                inputs: vec![data.push(&x), warr.clone()],
                scalars: vec![m as i64, n as i64],
                expected: data.push(&want),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            });
        }
        specs.push(spec);
        // Hopper warpgroup MMA (sm_90a only), K a multiple of 64
        if k % 64 == 0 {
            // a partial tile everywhere, a full one and small M for two formats, both tile widths
            // (the bundle must stay under the 64 MiB a device call carries)
            let cases_m: Vec<(usize, usize)> = if matches!(wdtype, DType::BF16 | DType::Q4_1) { vec![(64, 16), (64, 77), (16, 2), (16, 64)] } else { vec![(64, 5), (16, 5)] };
            for (n_tile, m) in cases_m {
                let spec = KernelSpec::MatMulWgmma { k, n, wdtype, bias: false, residual: false, n_tile };
                let x = rand_vec(m * k, -1.0, 1.0);
                let src =
                    format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
                let (g, b) = grid(&spec.launch(), n);
                specs.push(spec.clone());
                cases.push(Case {
                    name: format!("wgmma{n_tile} {m}x{k}x{n} {wdtype}"),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y: m.div_ceil(64) as u32,
                    block: b,
                    inputs: vec![data.push(&x), warr.clone()],
                    scalars: vec![m as i64, n as i64],
                    expected: data.push(&want),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol: 1e-2,
                    cluster: None,
                });
            }
        }
    }
    // a longer K (the 8B shape's GEMVs have K = 4096 and 14336)
    for wdtype in [DType::BF16, DType::Q4_1] {
        let (k, n, m) = (2048usize, 99usize, 3usize);
        let wf = rand_vec(n * k, -0.1, 0.1);
        let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
        let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
        let x = rand_vec(m * k, -1.0, 1.0);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
        let spec = KernelSpec::MatMul { k, n, wdtype, bias: false, residual: false };
        let (g, b) = grid(&spec.launch(), n);
        let (xa, wa, ya) = (data.push(&x), data.push_u8(&wb), data.push(&want));
        cases.push(Case {
            name: format!("matmul {m}x{k}x{n} {wdtype}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: m as u32,
            block: b,
            inputs: vec![xa.clone(), wa.clone()],
            scalars: vec![n as i64],
            expected: ya.clone(),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        specs.push(spec);
        if wdtype == DType::BF16 {
            // N = 99: a partial block of outputs in the batched GEMV too
            let spec = KernelSpec::MatMulFew { k, n, wdtype, bias: false, residual: false, rows: dsc_codegen::kernels::few_rows(wdtype) };
            let (g, b) = grid(&spec.launch(), n);
            cases.push(Case {
                name: format!("gemv_few {m}x{k}x{n} {wdtype}"),
                kernel: spec.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![xa, wa],
                scalars: vec![m as i64, n as i64],
                expected: ya,
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            });
            specs.push(spec);
        }
    }
    {
        let (k, n, m) = (576usize, 192usize, 5usize);
        let w = rand_vec(n * k, -0.1, 0.1);
        let wb = dsc_ir::quant::encode(DType::BF16, &w).context("encode")?;
        let bias = rand_vec(n, -1.0, 1.0);
        let ws: Weights = HashMap::from([("w".to_string(), (DType::BF16, vec![n, k], wb.clone())), ("bias".to_string(), (DType::F32, vec![n], bias.iter().flat_map(|v| v.to_le_bytes()).collect()))]);
        let x = rand_vec(m * k, -1.0, 1.0);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : bf16[{n}, {k}]\n  %bias = weight : f32[{n}]\n  %y = matmul(%x, %w, %bias) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
        let (xa, wa, ba, ya) = (data.push(&x), data.push_u8(&wb), data.push(&bias), data.push(&want));
        for few in [false, true] {
            let spec = if few {
                KernelSpec::MatMulFew { k, n, wdtype: DType::BF16, bias: true, residual: false, rows: 32 }
            } else {
                KernelSpec::MatMul { k, n, wdtype: DType::BF16, bias: true, residual: false }
            };
            let (g, b) = grid(&spec.launch(), n);
            cases.push(Case {
                name: format!("{}+bias {m}x{k}x{n} bf16", if few { "gemv_few" } else { "matmul" }),
                kernel: spec.symbol(),
                grid: g,
                grid_y: if few { m.div_ceil(32) as u32 } else { m as u32 },
                block: b,
                inputs: vec![xa.clone(), wa.clone(), ba.clone()],
                scalars: if few { vec![m as i64, n as i64] } else { vec![n as i64] },
                expected: ya.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: if few { 1e-2 } else { 1e-5 },
                cluster: None,
            });
            specs.push(spec);
        }
    }
    // the residual add as the matmul epilogue (matmul_add): GEMV, mma.sync and wgmma16
    {
        let (k, n) = (576usize, 192usize);
        let w = rand_vec(n * k, -0.1, 0.1);
        let wb = dsc_ir::quant::encode(DType::BF16, &w).context("encode")?;
        let ws: Weights = HashMap::from([("w".to_string(), (DType::BF16, vec![n, k], wb.clone()))]);
        let warr = data.push_u8(&wb);
        for (kind, m) in [("gemv", 3usize), ("few", 11), ("mma", 16), ("wgmma16", 5)] {
            let x = rand_vec(m * k, -1.0, 1.0);
            let r = rand_vec(m * n, -1.0, 1.0);
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %r = input : f32[{m}, {n}]\n  %w = weight : bf16[{n}, {k}]\n  %y = matmul_add(%x, %w, %r) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
            let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone())), ("r", Tensor::new(vec![m, n], r.clone()))], &ws)?;
            let (spec, grid_y, scalars, tol) = match kind {
                "gemv" => (KernelSpec::MatMul { k, n, wdtype: DType::BF16, bias: false, residual: true }, m as u32, vec![n as i64], 1e-5),
                "few" => (KernelSpec::MatMulFew { k, n, wdtype: DType::BF16, bias: false, residual: true, rows: 32 }, m.div_ceil(32) as u32, vec![m as i64, n as i64], 1e-2),
                "mma" => (KernelSpec::MatMulMma { k, n, wdtype: DType::BF16, bias: false, residual: true }, m.div_ceil(16) as u32, vec![m as i64, n as i64], 1e-2),
                _ => (KernelSpec::MatMulWgmma { k, n, wdtype: DType::BF16, bias: false, residual: true, n_tile: 16 }, m.div_ceil(64) as u32, vec![m as i64, n as i64], 1e-2),
            };
            let (g, b) = grid(&spec.launch(), n);
            cases.push(Case {
                name: format!("matmul_add {kind} {m}x{k}x{n} bf16"),
                kernel: spec.symbol(),
                grid: g,
                grid_y,
                block: b,
                inputs: vec![data.push(&x), warr.clone(), data.push(&r)],
                scalars,
                expected: data.push(&want),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol,
                cluster: None,
            });
            specs.push(spec);
        }
    }
    // merged matmuls (matmul_cat: Q/K/V-like parts of one input), output part-major, in every
    // kernel family: decode GEMV, batched GEMV, mma.sync, wgmma 16/64; a packed format's GEMV
    {
        let (k, parts) = (576usize, [128usize, 64, 192]);
        let total: usize = parts.iter().sum();
        for wdtype in [DType::BF16, DType::Q4_1] {
            let (enc, ws, decl) = part_weights(&parts, k, wdtype, &mut rand_vec)?;
            let warrs: Vec<Array> = enc.iter().map(|b| data.push_u8(b)).collect();
            let kinds: &[(&str, usize)] = if wdtype == DType::BF16 { &[("gemv", 1), ("few", 11), ("mma", 37), ("wgmma16", 5), ("wgmma64", 77)] } else { &[("gemv", 2), ("mma", 16)] };
            for &(kind, m) in kinds {
                let x = rand_vec(m * k, -1.0, 1.0);
                let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1, %w2) : f32[{m}, {total}]\n  output y = %y\n}}\n");
                let rowmajor = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
                let want = part_major(&rowmajor, m, &parts);
                let (inner, grid_y, mut scalars, tol) = match kind {
                    "gemv" => (KernelSpec::MatMul { k, n: total, wdtype, bias: false, residual: false }, m as u32, vec![total as i64], if wdtype == DType::BF16 { 1e-5 } else { 1e-4 }),
                    "few" => (KernelSpec::MatMulFew { k, n: total, wdtype, bias: false, residual: false, rows: 32 }, m.div_ceil(32) as u32, vec![m as i64, total as i64], 1e-2),
                    "mma" => (KernelSpec::MatMulMma { k, n: total, wdtype, bias: false, residual: false }, m.div_ceil(16) as u32, vec![m as i64, total as i64], 1e-2),
                    "wgmma16" => (KernelSpec::MatMulWgmma { k, n: total, wdtype, bias: false, residual: false, n_tile: 16 }, m.div_ceil(64) as u32, vec![m as i64, total as i64], 1e-2),
                    _ => (KernelSpec::MatMulWgmma { k, n: total, wdtype, bias: false, residual: false, n_tile: 64 }, m.div_ceil(64) as u32, vec![m as i64, total as i64], 1e-2),
                };
                scalars.push(m as i64);
                let spec = KernelSpec::MatMulParts { inner: Box::new(inner), parts: parts.to_vec() };
                let (g, b) = grid(&spec.launch(), total);
                let mut inputs = vec![data.push(&x)];
                inputs.extend(warrs.iter().cloned());
                cases.push(Case {
                    name: format!("matmul_cat {kind} {m}x{k}x({}) {wdtype}", parts.map(|p| p.to_string()).join("+")),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y,
                    block: b,
                    inputs,
                    scalars,
                    expected: data.push(&want),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol,
                    cluster: None,
                });
                specs.push(spec);
            }
        }
    }
    // the pipelined prefill matmul (sm_90a): partial M and N tiles, more K steps than stages
    // (the stage ring wraps; an odd count: the overlapped loop's tail step), both 16-bit
    // weight formats, a residual, and merged parts; in the plans' tiling and the sweep's others
    // (a16: x arrives in 16 bits, as the ToHalf step writes it; the reference rounds nothing,
    // as the f32-x kernels round x on the way in)
    use dsc_codegen::kernels::PipeTiling as T;
    // (and their TMA variants, on by default for the 128-row tiles of at most 128 columns:
    // every tiling here; `ScheduleOptions::tma` off leaves them out. An mbarrier wait that
    // never completes would hang the whole check: gpu-check.sh runs it under `timeout`)
    let with_tma = opts.schedule.tma != dsc_codegen::schedule::Tma::Off;
    // (and the 64-row tiles of batched decode: the warpgroups split the columns)
    let tilings = [
        dsc_codegen::kernels::pipe_tiling(4096),
        dsc_codegen::kernels::pipe_tiling(6144),
        T { bn: 256, stages: 3, overlap: true, a16: false, bm: dsc_codegen::kernels::PIPE_BM },
        dsc_codegen::kernels::pipe64_tiling(4096),
        // (224-wide tiles: the 8B shape's gate/up)
        dsc_codegen::kernels::pipe64_tiling(28672),
        dsc_codegen::kernels::pipe64_tiling(128256),
    ];
    for (i, &T { bn, stages, overlap, a16, bm }) in tilings.iter().enumerate() {
        if tilings[..i].contains(&tilings[i]) {
            continue;
        }
        // (an odd number of K steps past the stage count)
        let k = 64 * (stages + 1 + stages % 2);
        // (and fewer rows than one tile: batched decode from 16 rows runs it)
        for (wdtype, m, n, residual) in [(DType::BF16, 150usize, bn + 40, false), (DType::F16, 131, bn, true), (DType::BF16, 128, bn, true), (DType::BF16, 20, bn + 8, true)] {
            let wf = rand_vec(n * k, -0.1, 0.1);
            let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
            let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
            let x = rand_vec(m * k, -1.0, 1.0);
            let r = rand_vec(m * n, -1.0, 1.0);
            let want = matmul_reference(&x, residual.then_some(&r[..]), m, k, n, wdtype, &ws)?;
            let spec = KernelSpec::MatMulPipe { k, n, wdtype, bias: false, residual, bn, stages, overlap, a16, bm };
            let (g, b) = grid(&spec.launch(), n);
            let xa = if a16 { data.push_u8(&dsc_ir::quant::encode(wdtype, &x).context("encode")?) } else { data.push(&x) };
            let mut ins = vec![xa, data.push_u8(&wb)];
            if residual {
                ins.push(data.push(&r));
            }
            let case = Case {
                name: format!(
                    "matmul_pipe{bn}s{stages}{}{}{} {m}x{k}x{n} {wdtype}{}",
                    if overlap { "o" } else { "" },
                    if a16 { " x16" } else { "" },
                    if bm == 64 { " m64" } else { "" },
                    if residual { " +res" } else { "" }
                ),
                kernel: spec.symbol(),
                grid: g,
                grid_y: m.div_ceil(bm) as u32,
                block: b,
                inputs: ins,
                scalars: vec![m as i64, n as i64],
                expected: data.push(&want),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            };
            // ... and with W by TMA (DSC_TMA): W's tensor map in its place
            let tma = with_tma.then(|| tma_variant(&case, &spec, vec![TmapInput { input: 1, n, k, rows: bn as u32, f16: wdtype == DType::F16, pool: None }]));
            // ... and warp-specialized (DSC_GEMM_WS): x's map too
            if let Some((c, s)) = ws_variant(&case, &spec, m, k, wdtype == DType::F16, &[n]) {
                cases.push(c);
                specs.push(s);
            }
            cases.push(case);
            specs.push(spec);
            cases.extend(tma.iter().map(|t| t.0.clone()));
            specs.extend(tma.map(|t| t.1));
        }
        let parts = [bn, 2 * bn];
        let total: usize = parts.iter().sum();
        let (enc, ws, decl) = part_weights(&parts, k, DType::BF16, &mut rand_vec)?;
        let m = 140usize;
        let x = rand_vec(m * k, -1.0, 1.0);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1) : f32[{m}, {total}]\n  output y = %y\n}}\n");
        let want = part_major(&reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?, m, &parts);
        let spec =
            KernelSpec::MatMulParts { inner: Box::new(KernelSpec::MatMulPipe { k, n: total, wdtype: DType::BF16, bias: false, residual: false, bn, stages, overlap, a16, bm }), parts: parts.to_vec() };
        let (g, b) = grid(&spec.launch(), total);
        let mut inputs = vec![if a16 { data.push_u8(&dsc_ir::quant::encode(DType::BF16, &x).context("encode")?) } else { data.push(&x) }];
        inputs.extend(enc.iter().map(|w| data.push_u8(w)));
        let case = Case {
            name: format!(
                "matmul_cat pipe{bn}s{stages}{}{}{} {m}x{k}x({}+{}) bf16",
                if overlap { "o" } else { "" },
                if a16 { " x16" } else { "" },
                if bm == 64 { " m64" } else { "" },
                parts[0],
                parts[1]
            ),
            kernel: spec.symbol(),
            grid: g,
            grid_y: m.div_ceil(bm) as u32,
            block: b,
            inputs,
            scalars: vec![m as i64, total as i64, m as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        };
        if let Some((c, s)) = ws_variant(&case, &spec, m, k, false, &parts) {
            cases.push(c);
            specs.push(s);
        }
        cases.push(case);
        specs.push(spec);
        // ... and as the gate/up matmul with the SwiGLU in its epilogue (SwiGluPipe, x in 16
        // bits): h over a NaN-filled buffer, its 16-bit copy the output; two blocks of
        // features, rows past one tile
        let f = bn;
        if a16 && dsc_codegen::kernels::swiglu_pipe_fits(2 * f, bn, bm) {
            let (enc, ws, decl) = part_weights(&[f, f], k, DType::BF16, &mut rand_vec)?;
            let m = 70usize;
            let x = rand_vec(m * k, -1.0, 1.0);
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1) : f32[{m}, {}]\n  output y = %y\n}}\n", 2 * f);
            let gu = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
            let h: Vec<f32> = (0..m * f).map(|i| (i / f, i % f)).map(|(r, c)| (gu[r * 2 * f + c], gu[r * 2 * f + f + c])).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let half = dsc_ir::quant::encode(DType::BF16, &h).context("encode")?;
            let words: Vec<f32> = le_words(&half);
            let spec = KernelSpec::SwiGluPipe { inner: Box::new(KernelSpec::MatMulPipe { k, n: 2 * f, wdtype: DType::BF16, bias: false, residual: false, bn, stages, overlap, a16, bm }) };
            let (g, b) = grid(&spec.launch(), 2 * f);
            let mut inputs = vec![data.push_u8(&dsc_ir::quant::encode(DType::BF16, &x).context("encode")?)];
            inputs.extend(enc.iter().map(|w| data.push_u8(w)));
            inputs.push(data.push(&vec![f32::NAN; m * f]));
            let case = Case {
                name: format!("swiglu pipe{bn}s{stages}{}{} {m}x{k}x2x{f} bf16", if overlap { "o" } else { "" }, if bm == 64 { " m64" } else { "" }),
                kernel: spec.symbol(),
                grid: g,
                grid_y: m.div_ceil(bm) as u32,
                block: b,
                inputs,
                scalars: vec![m as i64, f as i64],
                expected: data.push(&words),
                init: None,
                written_inputs: vec![(3, data.push(&h))],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            };
            // ... warp-specialized too (the 128-row tiles)
            if let Some((c, s)) = ws_variant(&case, &spec, m, k, false, &[f, f]) {
                cases.push(c);
                specs.push(s);
            }
            cases.push(case);
            specs.push(spec);
        }
    }
    // the batched-decode GEMV reading x in 16 bits (MatMulFewX16, DSC_FEW_X16=1): partial B
    // tiles, both 16-bit formats, a residual, merged parts
    for (wdtype, m, n, residual, parts) in [(DType::BF16, 11usize, 192usize, false, None), (DType::F16, 29, 64, true, None), (DType::BF16, 7, 384, false, Some([128usize, 256]))] {
        let k = 576usize;
        let x = rand_vec(m * k, -1.0, 1.0);
        let xa = data.push_u8(&dsc_ir::quant::encode(wdtype, &x).context("encode")?);
        let inner = KernelSpec::MatMulFewX16 { k, n, wdtype, bias: false, residual };
        let (spec, inputs, want, scalars) = match parts {
            None => {
                let wb = dsc_ir::quant::encode(wdtype, &rand_vec(n * k, -0.1, 0.1)).context("encode")?;
                let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
                let r = rand_vec(m * n, -1.0, 1.0);
                let want = matmul_reference(&x, residual.then_some(&r[..]), m, k, n, wdtype, &ws)?;
                let mut inputs = vec![xa, data.push_u8(&wb)];
                if residual {
                    inputs.push(data.push(&r));
                }
                (inner, inputs, want, vec![m as i64, n as i64])
            }
            Some(p) => {
                let (enc, ws, decl) = part_weights(&p, k, wdtype, &mut rand_vec)?;
                let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1) : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = part_major(&reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?, m, &p);
                let mut inputs = vec![xa];
                inputs.extend(enc.iter().map(|w| data.push_u8(w)));
                (KernelSpec::MatMulParts { inner: Box::new(inner), parts: p.to_vec() }, inputs, want, vec![m as i64, n as i64, m as i64])
            }
        };
        let (g, b) = grid(&spec.launch(), n);
        cases.push(Case {
            name: format!("few x16 {m}x{k}x{n} {wdtype}{}{}", if residual { " +res" } else { "" }, if parts.is_some() { " parts" } else { "" }),
            kernel: spec.symbol(),
            grid: g,
            grid_y: m.div_ceil(32) as u32,
            block: b,
            inputs,
            scalars,
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        });
        specs.push(spec);
    }
    // matmul_act (bias + activation in the epilogue; the matmul-act rule's kernels) in each
    // matmul family the step may run: decode GEMV (bf16 and a packed format), batched GEMV,
    // mma.sync, wgmma16 and the pipelined prefill matmul (x in bf16); one x and W, prefixes
    {
        let (k, n) = (576usize, 192usize);
        let x = rand_vec(150 * k, -1.0, 1.0);
        let xa = data.push(&x);
        let x16 = data.push_u8(&dsc_ir::quant::encode(DType::BF16, &x).context("encode")?);
        let wf = rand_vec(n * k, -0.1, 0.1);
        let bias = rand_vec(n, -0.5, 0.5);
        let ba = data.push(&bias);
        for wdtype in [DType::BF16, DType::Q4_1] {
            let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
            let wa = data.push_u8(&wb);
            let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb)), ("b".to_string(), (DType::F32, vec![n], bias.iter().flat_map(|v| v.to_le_bytes()).collect()))]);
            let kinds: &[(&str, usize)] = if wdtype == DType::BF16 { &[("gemv", 1), ("few", 11), ("mma", 37), ("wgmma16", 5), ("pipe", 150)] } else { &[("gemv", 2)] };
            for &(kind, m) in kinds {
                let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %b = weight : f32[{n}]\n  %y = matmul_act(%x, %w, %b) {{transpose_b = true, act = gelu}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x[..m * k].to_vec()))], &ws)?;
                let (inner, grid_y, scalars, tol) = match kind {
                    "gemv" => (KernelSpec::MatMul { k, n, wdtype, bias: true, residual: false }, m as u32, vec![n as i64], 1e-4),
                    "few" => (KernelSpec::MatMulFew { k, n, wdtype, bias: true, residual: false, rows: 32 }, m.div_ceil(32) as u32, vec![m as i64, n as i64], 1e-2),
                    "mma" => (KernelSpec::MatMulMma { k, n, wdtype, bias: true, residual: false }, m.div_ceil(16) as u32, vec![m as i64, n as i64], 1e-2),
                    "wgmma16" => (KernelSpec::MatMulWgmma { k, n, wdtype, bias: true, residual: false, n_tile: 16 }, m.div_ceil(64) as u32, vec![m as i64, n as i64], 1e-2),
                    _ => {
                        let t = dsc_codegen::kernels::pipe_tiling(n);
                        (
                            KernelSpec::MatMulPipe { k, n, wdtype, bias: true, residual: false, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: t.a16, bm: t.bm },
                            m.div_ceil(dsc_codegen::kernels::PIPE_BM) as u32,
                            vec![m as i64, n as i64],
                            1e-2,
                        )
                    }
                };
                let x_in = if kind == "pipe" { x16.clone() } else { xa.clone() };
                let spec = KernelSpec::MatMulAct { inner: Box::new(inner), act: UnaryOpKey(UnaryOp::Gelu) };
                let (g, b) = grid(&spec.launch(), n);
                cases.push(Case {
                    name: format!("matmul_act gelu {kind} {m}x{k}x{n} {wdtype}"),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y,
                    block: b,
                    inputs: vec![Array { len: m * k * if kind == "pipe" { 2 } else { 1 }, ..x_in }, wa.clone(), ba.clone()],
                    scalars,
                    expected: data.push(&want),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol,
                    cluster: None,
                });
                specs.push(spec);
            }
        }
    }
    // split-K (DSC_SPLIT_K, batched decode of few column tiles): each block's K part of the
    // 64-row pipelined tile into its slice of the partial sums (checked against the matmul of
    // that K slice), then the reduce pass adding them and the residual
    for (sk, wdtype, m) in [(4usize, DType::BF16, 40usize), (2, DType::F16, 40), (4, DType::BF16, 100)] {
        let t = dsc_codegen::kernels::pipe64_tiling(4096);
        // (an odd number of K steps per part, fewer rows than the tile or two row tiles, the
        // second partial; whole column tiles, which split-K requires)
        let (k, n) = (64 * sk * 3, 2 * t.bn);
        let wf = rand_vec(n * k, -0.1, 0.1);
        let x = rand_vec(m * k, -1.0, 1.0);
        let r = rand_vec(m * n, -1.0, 1.0);
        let kp = k / sk;
        let mut partials = vec![];
        for part in 0..sk {
            let cols = |v: &[f32], rows: usize| -> Vec<f32> { (0..rows).flat_map(|i| v[i * k + part * kp..i * k + (part + 1) * kp].to_vec()).collect() };
            let wp = dsc_ir::quant::encode(wdtype, &cols(&wf, n)).context("encode")?;
            let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, kp], wp))]);
            partials.extend(matmul_reference(&cols(&x, m), None, m, kp, n, wdtype, &ws)?);
        }
        let inner = KernelSpec::MatMulPipe { k, n, wdtype, bias: false, residual: false, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: true, bm: 64 };
        let spec = KernelSpec::SplitK { inner: Box::new(inner), splits: sk };
        let (g, b) = grid(&spec.launch(), n);
        let pa = data.push(&partials);
        cases.push(Case {
            name: format!("matmul_pipe{}s{} m64 split-K {sk} {m}x{k}x{n} {wdtype}", t.bn, t.stages),
            kernel: spec.symbol(),
            grid: g,
            grid_y: m.div_ceil(64) as u32,
            block: b,
            inputs: vec![data.push_u8(&dsc_ir::quant::encode(wdtype, &x).context("encode")?), data.push_u8(&dsc_ir::quant::encode(wdtype, &wf).context("encode")?)],
            scalars: vec![m as i64, n as i64],
            expected: pa.clone(),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        });
        specs.push(spec);
        let want: Vec<f32> = (0..m * n).map(|i| (0..sk).map(|p| partials[p * m * n + i]).sum::<f32>() + r[i]).collect();
        let spec = KernelSpec::SplitKReduce { splits: sk, residual: true };
        let (g, b) = grid(&spec.launch(), m * n);
        cases.push(Case {
            name: format!("splitk reduce {sk} {m}x{n} +res"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![pa, data.push(&r)],
            scalars: vec![(m * n) as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        specs.push(spec);
    }
    // ... and over a merged matmul (q/k/v: parts of whole column tiles), each K slice's
    // partial sums part-major like the merged output
    {
        let sk = 2usize;
        let t = dsc_codegen::kernels::pipe64_tiling(4096);
        let parts = vec![t.bn, 2 * t.bn];
        let (m, k, n) = (40usize, 64 * sk * 3, 3 * t.bn);
        let kp = k / sk;
        let ws: Vec<Vec<f32>> = parts.iter().map(|&p| rand_vec(p * k, -0.1, 0.1)).collect();
        let x = rand_vec(m * k, -1.0, 1.0);
        let mut partials = vec![];
        for part in 0..sk {
            let cols = |v: &[f32], rows: usize| -> Vec<f32> { (0..rows).flat_map(|i| v[i * k + part * kp..i * k + (part + 1) * kp].to_vec()).collect() };
            for (w, &p) in ws.iter().zip(&parts) {
                let wp = dsc_ir::quant::encode(DType::BF16, &cols(w, p)).context("encode")?;
                let wt: Weights = HashMap::from([("w".to_string(), (DType::BF16, vec![p, kp], wp))]);
                partials.extend(matmul_reference(&cols(&x, m), None, m, kp, p, DType::BF16, &wt)?);
            }
        }
        let pipe = KernelSpec::MatMulPipe { k, n, wdtype: DType::BF16, bias: false, residual: false, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: true, bm: 64 };
        let spec = KernelSpec::SplitK { inner: Box::new(KernelSpec::MatMulParts { inner: Box::new(pipe), parts: parts.clone() }), splits: sk };
        let (g, b) = grid(&spec.launch(), n);
        let mut inputs = vec![data.push_u8(&dsc_ir::quant::encode(DType::BF16, &x).context("encode")?)];
        for w in &ws {
            inputs.push(data.push_u8(&dsc_ir::quant::encode(DType::BF16, w).context("encode")?));
        }
        let case = Case {
            name: format!("matmul_cat pipe{}s{} m64 split-K {sk} {m}x{k}x({}+{}) bf16", t.bn, t.stages, parts[0], parts[1]),
            kernel: spec.symbol(),
            grid: g,
            grid_y: m.div_ceil(64) as u32,
            block: b,
            inputs,
            scalars: vec![m as i64, n as i64, m as i64],
            expected: data.push(&partials),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        };
        // ... and with W by TMA: each part's tensor map; and warp-specialized
        let tma = with_tma.then(|| tma_variant(&case, &spec, parts.iter().enumerate().map(|(i, &p)| TmapInput { input: 1 + i, n: p, k, rows: t.bn as u32, f16: false, pool: None }).collect()));
        if let Some((c, s)) = ws_variant(&case, &spec, m, k, false, &parts) {
            cases.push(c);
            specs.push(s);
        }
        cases.push(case);
        specs.push(spec);
        cases.extend(tma.iter().map(|t| t.0.clone()));
        specs.extend(tma.map(|t| t.1));
    }
    // the split-K reduce folded into the RMSNorm after it: y (the parts' sum + the residual)
    // and the normalized x written over NaN-filled buffers, the 16-bit copy (or x) the output
    // (and in thread-block clusters of 4 and 8 blocks per row, sm_90a)
    for (sk, residual, rows, d, half, cluster) in
        [(4usize, true, 5usize, 2048usize, Some(false), 1usize), (2, false, 3, 1000, None, 1), (4, true, 5, 4096, Some(false), 4), (2, false, 3, 1024, Some(true), 8)]
    {
        let eps = 1e-5f32;
        let parts = rand_vec(sk * rows * d, -1.0, 1.0);
        let r = rand_vec(rows * d, -1.0, 1.0);
        let y: Vec<f32> = (0..rows * d).map(|i| (0..sk).map(|p| parts[p * rows * d + i]).sum::<f32>() + if residual { r[i] } else { 0.0 }).collect();
        let w = rand_vec(d, 0.5, 1.5);
        let ws: Weights = HashMap::from([("w".to_string(), (DType::F32, vec![d], w.iter().flat_map(|v| v.to_le_bytes()).collect()))]);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %w = weight : f32[{d}]\n  %y = rms_norm(%x, %w) {{eps = {eps:?}}} : f32[{rows}, {d}]\n  output y = %y\n}}\n");
        let xn = reference(&src, vec![("x", Tensor::new(vec![rows, d], y.clone()))], &ws)?;
        let spec = KernelSpec::SplitKReduceNorm { splits: sk, residual, d, eps_bits: eps.to_bits(), half, cluster };
        let (g, b) = grid(&spec.launch(), rows);
        let poison = data.push(&vec![f32::NAN; rows * d]);
        let mut inputs = vec![data.push(&parts)];
        if residual {
            inputs.push(data.push(&r));
        }
        let yi = inputs.len();
        inputs.extend([poison.clone(), data.push(&w)]);
        let (expected, mut written) = match half {
            Some(f16) => {
                let h = dsc_ir::quant::encode(if f16 { DType::F16 } else { DType::BF16 }, &xn).context("encode")?;
                let words: Vec<f32> = le_words(&h);
                inputs.push(poison.clone());
                (data.push(&words), vec![(yi + 2, data.push(&xn))])
            }
            None => (data.push(&xn), vec![]),
        };
        written.insert(0, (yi, data.push(&y)));
        cases.push(Case {
            name: format!(
                "splitk reduce {sk}{} + rms_norm {rows}x{d}{}{}",
                if residual { " +res" } else { "" },
                match half {
                    Some(true) => " + f16 copy",
                    Some(false) => " + bf16 copy",
                    None => "",
                },
                if cluster > 1 { format!(" in clusters of {cluster}") } else { String::new() }
            ),
            kernel: spec.symbol(),
            grid: g,
            grid_y: cluster as u32,
            block: b,
            inputs,
            scalars: vec![rows as i64],
            expected,
            init: None,
            written_inputs: written,
            tmaps: vec![],
            tol: 1e-2,
            cluster: spec.cluster(),
        });
        specs.push(spec);
    }
    // the SwiGLU in the decode GEMV's epilogue (SwiGluGemv): silu(x Wg^T) * (x Wu^T), a partial
    // last block; and with the RMSNorm in its prologue (NormMatMul over SwiGluGemv: x is the
    // norm's input, g its weight)
    for (wdtype, k, f, norm) in [(DType::BF16, 576usize, 201usize, false), (DType::F16, 1024, 130, false), (DType::F32, 256, 64, false), (DType::BF16, 576, 201, true), (DType::F16, 256, 64, true)] {
        let eps = 1e-5f32;
        let (enc, mut ws, decl) = part_weights(&[f, f], k, wdtype, &mut rand_vec)?;
        let g = rand_vec(k, 0.5, 1.5);
        ws.insert("g".into(), (DType::F32, vec![k], g.iter().flat_map(|v| v.to_le_bytes()).collect()));
        let x = rand_vec(k, -2.0, 2.0);
        let (xn, gdecl) = if norm { ("xn", format!("  %g = weight : f32[{k}]\n{decl}  %xn = rms_norm(%x, %g) {{eps = {eps:?}}} : f32[1, {k}]\n")) } else { ("x", decl) };
        let src = format!(
            "graph \"k\" {{\n  %x = input : f32[1, {k}]\n{gdecl}  %a = matmul(%{xn}, %w0) {{transpose_b = true}} : f32[1, {f}]\n  %u = matmul(%{xn}, %w1) {{transpose_b = true}} : f32[1, {f}]\n  %y = silu_mul(%a, %u) : f32[1, {f}]\n  output y = %y\n}}\n"
        );
        let want = reference(&src, vec![("x", Tensor::new(vec![1, k], x.clone()))], &ws)?;
        let swiglu = KernelSpec::SwiGluGemv { k, f, wdtype };
        let spec = if norm { KernelSpec::NormMatMul { inner: Box::new(swiglu), eps_bits: eps.to_bits() } } else { swiglu };
        let (gx, b) = grid(&spec.launch(), f);
        let mut inputs = vec![data.push(&x)];
        if norm {
            inputs.push(data.push(&g));
        }
        inputs.extend(enc.iter().map(|w| data.push_u8(w)));
        cases.push(Case {
            name: format!("{}swiglu gemv 1x{k}x{f} {wdtype}", if norm { "rms_norm+" } else { "" }),
            kernel: spec.symbol(),
            grid: gx,
            grid_y: 1,
            block: b,
            inputs,
            scalars: vec![f as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-4,
            cluster: None,
        });
        specs.push(spec);
    }
    // the one-token MLP in one kernel (SwiGluDown): norm, gate/up, SwiGLU, down, added into y
    // (which holds the residual: `init`); two rows (grid y), K with a partial last round of
    // pieces (576) and without (256), both feature blocks
    for (m, k, f, n, fb, fpw) in [(2usize, 576usize, 48usize, 576usize, 16usize, 2usize), (1, 256, 64, 128, 8, 2), (1, 256, 64, 128, 32, 2), (1, 576, 48, 576, 16, 1)] {
        let eps = 1e-5f32;
        let (enc, mut ws, decl) = part_weights(&[f, f], k, DType::BF16, &mut rand_vec)?;
        let wd = dsc_ir::quant::encode(DType::BF16, &rand_vec(n * f, -0.1, 0.1)).context("encode")?;
        ws.insert("wd".into(), (DType::BF16, vec![n, f], wd.clone()));
        let g = rand_vec(k, 0.5, 1.5);
        ws.insert("g".into(), (DType::F32, vec![k], g.iter().flat_map(|v| v.to_le_bytes()).collect()));
        let x = rand_vec(m * k, -2.0, 2.0);
        let r = rand_vec(m * n, -1.0, 1.0);
        let src = format!(
            "graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %r = input : f32[{m}, {n}]\n  %g = weight : f32[{k}]\n{decl}  %wd = weight : bf16[{n}, {f}]\n  %xn = rms_norm(%x, %g) {{eps = {eps:?}}} : f32[{m}, {k}]\n  %a = matmul(%xn, %w0) {{transpose_b = true}} : f32[{m}, {f}]\n  %u = matmul(%xn, %w1) {{transpose_b = true}} : f32[{m}, {f}]\n  %h = silu_mul(%a, %u) : f32[{m}, {f}]\n  %y = matmul_add(%h, %wd, %r) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n"
        );
        let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone())), ("r", Tensor::new(vec![m, n], r.clone()))], &ws)?;
        let spec = KernelSpec::SwiGluDown { k, f, n, eps_bits: eps.to_bits(), fb, fpw };
        let (gx, b) = grid(&spec.launch(), f);
        let mut inputs = vec![data.push(&x), data.push(&g)];
        inputs.extend(enc.iter().map(|w| data.push_u8(w)));
        inputs.push(data.push_u8(&wd));
        cases.push(Case {
            name: format!("rms_norm+swiglu+down {m}x{k}x{f}x{n} bf16, {fb} features per block, {fpw} per warp"),
            kernel: spec.symbol(),
            grid: gx,
            grid_y: m as u32,
            block: b,
            inputs,
            scalars: vec![f as i64],
            expected: data.push(&want),
            init: Some(data.push(&r)),
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-4,
            cluster: None,
        });
        specs.push(spec);
    }
    // ... and the o projection that seeds its accumulator (MatMulCopy): the GEMV's output also
    // in y2 (an input it writes)
    {
        let (k, n) = (256usize, 200usize);
        let (enc, ws, _) = part_weights(&[n], k, DType::BF16, &mut rand_vec)?;
        let mut ws1 = Weights::new();
        ws1.insert("w".into(), ws["w0"].clone());
        let x = rand_vec(k, -1.0, 1.0);
        let r = rand_vec(n, -1.0, 1.0);
        let want = matmul_reference(&x, Some(&r), 1, k, n, DType::BF16, &ws1)?;
        let spec = KernelSpec::MatMulCopy { inner: Box::new(KernelSpec::MatMul { k, n, wdtype: DType::BF16, bias: false, residual: true }) };
        let (gx, b) = grid(&spec.launch(), n);
        let expected = data.push(&want);
        cases.push(Case {
            name: format!("gemv+residual 1x{k}x{n} bf16, output also copied"),
            kernel: spec.symbol(),
            grid: gx,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&x), data.push_u8(&enc[0]), data.push(&r), data.push(&vec![f32::NAN; n])],
            scalars: vec![n as i64],
            expected: expected.clone(),
            init: None,
            written_inputs: vec![(3, expected)],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        specs.push(spec);
    }
    // RMSNorm in the decode GEMV's prologue (NormMatMul): one weight, and merged parts
    {
        let (k, m, eps) = (576usize, 3usize, 1e-5f32);
        let g = rand_vec(k, 0.5, 1.5);
        let gb: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
        for parts in [vec![192usize], vec![128, 64, 192]] {
            let total: usize = parts.iter().sum();
            let (enc, mut ws, decl) = part_weights(&parts, k, DType::BF16, &mut rand_vec)?;
            ws.insert("g".into(), (DType::F32, vec![k], gb.clone()));
            // (x bf16-exact: the same rows also come gathered from a bf16 table, `GatherX`)
            let x = dsc_ir::quant::decode(DType::BF16, &dsc_ir::quant::encode(DType::BF16, &rand_vec(m * k, -2.0, 2.0)).context("encode")?, m * k).context("decode")?;
            let mm = if parts.len() == 1 {
                format!("matmul(%xn, %w0) {{transpose_b = true}} : f32[{m}, {total}]")
            } else {
                format!("matmul_cat(%xn, {}) : f32[{m}, {total}]", (0..parts.len()).map(|i| format!("%w{i}")).collect::<Vec<_>>().join(", "))
            };
            let src =
                format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %g = weight : f32[{k}]\n{decl}  %xn = rms_norm(%x, %g) {{eps = {eps:?}}} : f32[{m}, {k}]\n  %y = {mm}\n  output y = %y\n}}\n");
            let rowmajor = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
            let want = part_major(&rowmajor, m, &parts);
            let gemv = KernelSpec::MatMul { k, n: total, wdtype: DType::BF16, bias: false, residual: false };
            let (inner, scalars) = if parts.len() == 1 { (gemv, vec![total as i64]) } else { (KernelSpec::MatMulParts { inner: Box::new(gemv), parts: parts.clone() }, vec![total as i64, m as i64]) };
            let spec = KernelSpec::NormMatMul { inner: Box::new(inner), eps_bits: eps.to_bits() };
            let (gx, b) = grid(&spec.launch(), total);
            let mut inputs = vec![data.push(&x), data.push(&g)];
            inputs.extend(enc.iter().map(|e| data.push_u8(e)));
            let expected = data.push(&want);
            // x gathered: row r of x is row tok[r] of a 40-row bf16 table (the others random),
            // and the kernel writes x back as f32 (an input it writes: NaN before)
            {
                let v = 40usize;
                let tok: Vec<i32> = (0..m).map(|r| ((7 * r + 3) % v) as i32).collect();
                let mut table = rand_vec(v * k, -2.0, 2.0);
                for (r, &t) in tok.iter().enumerate() {
                    table[t as usize * k..(t as usize + 1) * k].copy_from_slice(&x[r * k..(r + 1) * k]);
                }
                let gxs = KernelSpec::GatherX { inner: Box::new(spec.clone()) };
                let mut gin = vec![data.push_u8(&dsc_ir::quant::encode(DType::BF16, &table).context("encode")?), data.push_i32(&tok), data.push(&vec![f32::NAN; m * k])];
                gin.extend(inputs[1..].iter().cloned());
                cases.push(Case {
                    name: format!("rms_norm+gemv {m}x{k}x({}) bf16, x gathered from a bf16 table", parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("+")),
                    kernel: gxs.symbol(),
                    grid: gx,
                    grid_y: m as u32,
                    block: b,
                    inputs: gin,
                    scalars: scalars.clone(),
                    expected: expected.clone(),
                    init: None,
                    written_inputs: vec![(2, data.push(&x))],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
                specs.push(gxs);
            }
            // (merged: also as the zero fill of a one-token layer's accumulators, `ZeroFill`,
            // two inputs it writes: 200 zeros each, the narrowest part's blocks covering them)
            if parts.len() > 1 {
                let len = 200usize;
                let zf = KernelSpec::ZeroFill { inner: Box::new(spec.clone()), len };
                let nan = data.push(&vec![f32::NAN; len]);
                let zeros = data.push(&vec![0.0; len]);
                cases.push(Case {
                    name: format!("rms_norm+gemv {m}x{k}x({}) bf16 + zero fill {len}", parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("+")),
                    kernel: zf.symbol(),
                    grid: gx,
                    grid_y: m as u32,
                    block: b,
                    inputs: [nan.clone(), nan].into_iter().chain(inputs.iter().cloned()).collect(),
                    scalars: scalars.clone(),
                    expected: expected.clone(),
                    init: None,
                    written_inputs: vec![(0, zeros.clone()), (1, zeros)],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
                specs.push(zf);
            }
            cases.push(Case {
                name: format!("rms_norm+gemv {m}x{k}x({}) bf16", parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("+")),
                kernel: spec.symbol(),
                grid: gx,
                grid_y: m as u32,
                block: b,
                inputs,
                scalars,
                expected,
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-5,
                cluster: None,
            });
            specs.push(spec);
        }
    }
    // the fused users of a merged Q/K/V matmul: rope(q) out of place, rope(k) into the K pool,
    // v into the V pool (QkvRopeCache), both rope styles; the pools checked as written inputs
    // (and into bf16 pools)
    for (interleaved, kv) in [(false, DType::F32), (true, DType::F32), (false, DType::BF16)] {
        let (t, h, kvh, d, nb, bs, theta) = (5usize, 4usize, 2usize, 16usize, 3usize, 4usize, 10000.0f32);
        let style = if interleaved { "interleaved" } else { "half" };
        let xq = rand_vec(t * h * d, -1.0, 1.0);
        let xk = rand_vec(t * kvh * d, -1.0, 1.0);
        let xv = rand_vec(t * kvh * d, -1.0, 1.0);
        let pos: Vec<i32> = (0..t).map(|i| [0, 1, 77, 4095, 9][i]).collect();
        let slots: Vec<i32> = (0..t).map(|i| [3, 0, 11, 7, 5][i]).collect();
        let kc0 = kv_round(&rand_vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let vc0 = kv_round(&rand_vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let rope_src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {h}, {d}]\n  %p = input : i32[{t}]\n  %y = rope(%x, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}}} : f32[{t}, {h}, {d}]\n  output y = %y\n}}\n");
        let want_q = reference(&rope_src, vec![("x", Tensor::new(vec![t, h, d], xq.clone())), ("p", Tensor::from_i32(vec![t], &pos))], &Weights::new())?;
        let cache = |x: &[f32], c0: &[f32], rope: bool| -> anyhow::Result<Vec<f32>> {
            let op = if rope { format!("rope_cache_write(%c, %x, %s, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}}}") } else { "cache_write(%c, %x, %s)".to_string() };
            let src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {kvh}, {d}]\n  %s = input : i32[{t}]\n  %p = input : i32[{t}]\n  %c = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %w = {op} : {kv}[{nb}, {bs}, {kvh}, {d}]\n  output c = %w\n}}\n");
            let g = text::parse(&src)?;
            let none: Weights = HashMap::new();
            let mut ex = Executor::new(&g, &none, BTreeMap::new())?;
            ex.state_mut("c").context("state c")?.data.copy_from_slice(c0);
            let ins =
                BTreeMap::from([("x".to_string(), Tensor::new(vec![t, kvh, d], x.to_vec())), ("s".to_string(), Tensor::from_i32(vec![t], &slots)), ("p".to_string(), Tensor::from_i32(vec![t], &pos))]);
            Ok(ex.run(&ins)?.into_values().next().context("one output")?.data)
        };
        let want_k = cache(&xk, &kc0, true)?;
        let want_v = cache(&xv, &vc0, false)?;
        let spec = KernelSpec::QkvRopeCache { h, kvh, d, theta_bits: theta.to_bits(), interleaved, kv };
        let items = t * d / 2 * (h + 2 * kvh);
        let (g, b) = grid(&spec.launch(), items);
        let (kca, vca) = (data.push_kv(&kc0, kv), data.push_kv(&vc0, kv));
        let (wk, wv) = (data.push(&want_k), data.push(&want_v));
        cases.push(Case {
            name: format!("qkv_rope_cache {t} tokens {h}/{kvh}x{d} {style}{}", kv_label(kv)),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&xq), data.push(&xk), data.push(&xv), data.push_i32(&pos), data.push_i32(&slots), kca, vca],
            scalars: vec![items as i64, (t * h * d / 2) as i64, (t * kvh * d / 2) as i64],
            expected: data.push(&want_q),
            init: None,
            written_inputs: vec![(5, wk.clone()), (6, wv.clone())],
            tmaps: vec![],
            // the rope kernels' bound (approximate sin/cos after range reduction; pos 4095; a
            // bf16 pool: a value near a rounding boundary may round the other way)
            tol: kv_tol(kv, 1e-4),
            cluster: None,
        });
        specs.push(spec.clone());
        // ... reading q, k and v as the sums of two split-K partial-sum slices of the merged
        // node (QkvRopeSplitK, DSC_SPLITK_ROPE): part-major q, k, v in a slice, slice 1 random,
        // slice 0 the rest
        let merged: Vec<f32> = xq.iter().chain(&xk).chain(&xv).copied().collect();
        let r = rand_vec(merged.len(), -1.0, 1.0);
        let parts: Vec<f32> = merged.iter().zip(&r).map(|(x, r)| x - r).chain(r.iter().copied()).collect();
        let split = KernelSpec::QkvRopeSplitK { inner: Box::new(spec), splits: 2 };
        let (kca, vca) = (data.push_kv(&kc0, kv), data.push_kv(&vc0, kv));
        cases.push(Case {
            name: format!("qkv_rope_cache split-K 2 {t} tokens {h}/{kvh}x{d} {style}{}", kv_label(kv)),
            kernel: split.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&parts), data.push_i32(&pos), data.push_i32(&slots), kca, vca],
            scalars: vec![items as i64, (t * h * d / 2) as i64, (t * kvh * d / 2) as i64, merged.len() as i64, 0, (t * h * d) as i64, (t * (h + kvh) * d) as i64],
            expected: data.push(&want_q),
            init: None,
            written_inputs: vec![(3, data.push(&want_k)), (4, data.push(&want_v))],
            tmaps: vec![],
            // (x - r + r: one rounding more than the plain kernel's inputs)
            tol: kv_tol(kv, 1e-4),
            cluster: None,
        });
        specs.push(split);
    }
    // gather (embedding) from plain and packed tables
    // (300 rows: the bundle and the runtime share one call's 64 MiB)
    let (v, d, t) = (300usize, 576usize, 13usize);
    let table = rand_vec(v * d, -1.0, 1.0);
    let idx: Vec<i32> = (0..t)
        .map(|i| {
            if i == 0 {
                0
            } else if i == 1 {
                v as i32 - 1
            } else {
                (rand_vec(1, 0.0, v as f32)[0] as i32).min(v as i32 - 1)
            }
        })
        .collect();
    for dtype in [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        let tb = dsc_ir::quant::encode(dtype, &table).context("encode")?;
        let ws: Weights = HashMap::from([("table".to_string(), (dtype, vec![v, d], tb.clone()))]);
        let src = format!("graph \"k\" {{\n  %idx = input : i32[{t}]\n  %table = weight : {dtype}[{v}, {d}]\n  %y = gather(%table, %idx) : f32[{t}, {d}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("idx", Tensor::from_i32(vec![t], &idx))], &ws)?;
        let spec = KernelSpec::Gather { d, dtype };
        let (g, b) = grid(&spec.launch(), t * d);
        // (bf16: also as the first one-token layer's zero fill of its attention's
        // accumulators, `ZeroFill`: two inputs of NaN it writes, d zeros each)
        if dtype == DType::BF16 {
            let zf = KernelSpec::ZeroFill { inner: Box::new(spec.clone()), len: d };
            let nan = data.push(&vec![f32::NAN; d]);
            let zeros = data.push(&vec![0.0; d]);
            cases.push(Case {
                name: format!("gather {t}x{d} {dtype} + zero fill {d}"),
                kernel: zf.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![nan.clone(), nan, data.push_u8(&tb), data.push_i32(&idx)],
                scalars: vec![(t * d) as i64],
                expected: data.push(&want),
                init: None,
                written_inputs: vec![(0, zeros.clone()), (1, zeros)],
                tmaps: vec![],
                tol: 1e-6,
                cluster: None,
            });
            specs.push(zf);
        }
        cases.push(Case {
            name: format!("gather {t}x{d} {dtype}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push_u8(&tb), data.push_i32(&idx)],
            scalars: vec![(t * d) as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-6,
            cluster: None,
        });
        specs.push(spec);
    }
    // rope, both pairings, positions up to ~2000
    for (h, interleaved) in [(9usize, true), (3, false)] {
        let (t, d, theta) = (11usize, 64usize, 100000f32);
        let x = rand_vec(t * h * d, -1.0, 1.0);
        let pos: Vec<i32> = (0..t).map(|i| if i == 0 { 0 } else { rand_vec(1, 0.0, 2000.0)[0] as i32 }).collect();
        let style = if interleaved { "interleaved" } else { "half" };
        let src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {h}, {d}]\n  %p = input : i32[{t}]\n  %y = rope(%x, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}}} : f32[{t}, {h}, {d}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![t, h, d], x.clone())), ("p", Tensor::from_i32(vec![t], &pos))], &none)?;
        let spec = KernelSpec::Rope { h, d, theta_bits: theta.to_bits(), interleaved };
        let (g, b) = grid(&spec.launch(), t * h * d / 2);
        cases.push(Case {
            name: format!("rope {t}x{h}x{d} {style}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&x), data.push_i32(&pos)],
            scalars: vec![(t * h * d / 2) as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-4,
            cluster: None,
        });
        specs.push(spec);
    }
    // cache_write into a randomly filled pool (f32, bf16), and paged attention over scattered
    // blocks
    for kv in [DType::F32, DType::BF16] {
        let (nb, bs, kvh, d) = (8usize, 4usize, 3usize, 64usize);
        let row = kvh * d;
        let slots = [13i32, 2, 30, 7, 21];
        let t = slots.len();
        let x = rand_vec(t * row, -1.0, 1.0);
        let init = kv_round(&rand_vec(nb * bs * row, -1.0, 1.0), kv);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {kvh}, {d}]\n  %s = input : i32[{t}]\n  %c = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %w = cache_write(%c, %x, %s) : {kv}[{nb}, {bs}, {kvh}, {d}]\n  output c = %w\n}}\n");
        let g = text::parse(&src)?;
        let mut ex = Executor::new(&g, &none, BTreeMap::new())?;
        ex.state_mut("c").context("state c")?.data.copy_from_slice(&init);
        let want = ex.run(&BTreeMap::from([("x".to_string(), Tensor::new(vec![t, kvh, d], x.clone())), ("s".to_string(), Tensor::from_i32(vec![t], &slots))]))?.remove("c").context("output")?.data;
        let spec = KernelSpec::CacheWrite { row, kv };
        let (gr, b) = grid(&spec.launch(), t * row);
        let init_arr = data.push_kv(&init, kv);
        cases.push(Case {
            name: format!("cache_write {t} rows of {row}{}", kv_label(kv)),
            kernel: spec.symbol(),
            grid: gr,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&x), data.push_i32(&slots)],
            scalars: vec![(t * row) as i64],
            expected: data.push(&want),
            init: Some(init_arr.clone()),
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        specs.push(spec);
        // the optimizer's rope-cache-write fusion: the same rows, rotated on the way in
        for interleaved in [false, true] {
            let pos = [1999i32, 0, 17, 300, 5];
            let style = if interleaved { "interleaved" } else { "half" };
            let theta = 500000.0f32;
            let src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {kvh}, {d}]\n  %s = input : i32[{t}]\n  %p = input : i32[{t}]\n  %c = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %w = rope_cache_write(%c, %x, %s, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}}} : {kv}[{nb}, {bs}, {kvh}, {d}]\n  output c = %w\n}}\n");
            let g = text::parse(&src)?;
            let mut ex = Executor::new(&g, &none, BTreeMap::new())?;
            ex.state_mut("c").context("state c")?.data.copy_from_slice(&init);
            let ins =
                BTreeMap::from([("x".to_string(), Tensor::new(vec![t, kvh, d], x.clone())), ("s".to_string(), Tensor::from_i32(vec![t], &slots)), ("p".to_string(), Tensor::from_i32(vec![t], &pos))]);
            let want = ex.run(&ins)?.remove("c").context("output")?.data;
            let spec = KernelSpec::RopeCacheWrite { h: kvh, d, theta_bits: theta.to_bits(), interleaved, kv };
            let (gr, b) = grid(&spec.launch(), t * row / 2);
            cases.push(Case {
                name: format!("rope_cache_write {t} rows of {kvh}x{d} {style}{}", kv_label(kv)),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: 1,
                block: b,
                inputs: vec![data.push(&x), data.push_i32(&pos), data.push_i32(&slots)],
                scalars: vec![(t * row / 2) as i64],
                expected: data.push(&want),
                init: Some(init_arr.clone()),
                written_inputs: vec![],
                tmaps: vec![],
                tol: kv_tol(kv, 1e-4),
                cluster: None,
            });
            specs.push(spec);
        }
    }
    // (the last two: the prefill kernel, FlashAttention, on tiles that mix a prefill chunk, a
    // chunk after a cached prefix and decode tokens, and on a partial last tile)
    // (then bf16 pools: the decode kernels, the split pass and the prefill kernel again)
    let (f32_, bf16_) = (DType::F32, DType::BF16);
    let mut prefetched = None;
    for (h, kvh, d, bs, nb, seqs, kv, qs) in [
        (9usize, 3usize, 64usize, 4usize, 12usize, vec![(0usize, 11usize), (0, 6)], f32_, 1.0f32),
        (32, 8, 128, 16, 19, vec![(257, 260), (0, 1)], f32_, 1.0),
        (8, 2, 64, 16, 78, vec![(999, 1000), (200, 201)], f32_, 1.0),
        (8, 2, 128, 16, 18, vec![(0, 150), (40, 70), (0, 1), (9, 10)], f32_, 1.0),
        (9, 3, 64, 4, 24, vec![(0, 70), (5, 6)], f32_, 1.0),
        (9, 3, 64, 4, 12, vec![(0, 11), (0, 6)], bf16_, 1.0),
        // (smaller pools than the f32 cases': the bundle shares one call's 64 MiB)
        (32, 8, 128, 16, 12, vec![(97, 100), (0, 1)], bf16_, 1.0),
        (8, 2, 128, 16, 52, vec![(599, 600), (200, 201)], bf16_, 1.0),
        (8, 2, 128, 16, 18, vec![(0, 150), (40, 70), (0, 1), (9, 10)], bf16_, 1.0),
        (9, 3, 64, 4, 24, vec![(0, 70), (5, 6)], bf16_, 1.0),
        // (the wgmma kernel's head dims and block sizes crossed)
        (9, 3, 128, 4, 24, vec![(0, 70), (5, 6)], bf16_, 1.0),
        (8, 2, 64, 16, 18, vec![(0, 150), (40, 70), (0, 1), (9, 10)], bf16_, 1.0),
        // (the wgmma kernel's TMA boxes: 32-position cache blocks, two boxes per 64-key tile,
        // and 128-position ones, a box starting half-way into a block; 4 heads: the bundle's
        // data must fit a call)
        (4, 1, 128, 32, 10, vec![(0, 100), (40, 70), (0, 1), (9, 10)], bf16_, 1.0),
        (4, 1, 128, 128, 3, vec![(0, 130), (40, 70)], bf16_, 1.0),
        // (queries x 20: scores of ~10 log2 units' deviation, so a row's max jumps by more than
        // the wgmma kernel's lazy-rescale threshold from tile to tile and both of its paths run;
        // a looser tolerance: Q's bf16 rounding is ~20x larger in the scores)
        (4, 1, 128, 16, 18, vec![(0, 150), (40, 70), (0, 1), (9, 10)], bf16_, 20.0),
    ] {
        // seqs: (first query position, length); every sequence's queries are its positions first..len
        let mb = seqs.iter().map(|s| s.1.div_ceil(bs)).max().unwrap_or(1);
        let mut table = vec![];
        let mut free: Vec<i32> = (0..nb as i32).rev().collect();
        for s in &seqs {
            for j in 0..mb {
                table.push(if j < s.1.div_ceil(bs) { free.pop().context("blocks")? } else { -1 });
            }
            free.reverse();
        }
        let (mut pos, mut seq) = (vec![], vec![]);
        for (si, s) in seqs.iter().enumerate() {
            for p in s.0..s.1 {
                pos.push(p as i32);
                seq.push(si as i32);
            }
        }
        let t = pos.len();
        let q = rand_vec(t * h * d, -qs, qs);
        let kc = kv_round(&rand_vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let vc = kv_round(&rand_vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let scale = 1.0 / (d as f32).sqrt();
        let ns = seqs.len();
        let src = format!("graph \"k\" {{\n  %q = input : f32[{t}, {h}, {d}]\n  %pos = input : i32[{t}]\n  %seq = input : i32[{t}]\n  %table = input : i32[{ns}, {mb}]\n  %kc = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %vc = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {{scale = {scale:?}}} : f32[{t}, {h}, {d}]\n  output o = %o\n}}\n");
        let g = text::parse(&src)?;
        let mut ex = Executor::new(&g, &none, BTreeMap::new())?;
        ex.state_mut("kc").context("kc")?.data.copy_from_slice(&kc);
        ex.state_mut("vc").context("vc")?.data.copy_from_slice(&vc);
        let want = ex
            .run(&BTreeMap::from([
                ("q".to_string(), Tensor::new(vec![t, h, d], q.clone())),
                ("pos".to_string(), Tensor::from_i32(vec![t], &pos)),
                ("seq".to_string(), Tensor::from_i32(vec![t], &seq)),
                ("table".to_string(), Tensor::from_i32(vec![ns, mb], &table)),
            ]))?
            .remove("o")
            .context("output")?
            .data;
        let inputs = vec![data.push(&q), data.push_kv(&kc, kv), data.push_kv(&vc, kv), data.push_i32(&pos), data.push_i32(&seq), data.push_i32(&table)];
        let expected = data.push(&want);
        // (8 warps of query rows per block too, from bf16 pools)
        // (and 2 m16 tiles per warp: 32 rows)
        let shapes: &[(usize, usize)] = if kv == DType::F32 || d % 32 != 0 { &[(4, 1)] } else { &[(4, 1), (8, 1), (4, 2)] };
        // (and the wgmma kernel, sm_90a: bf16 pools, 4 warps of one m-tile, D 128)
        let wg = (kv == DType::BF16 && dsc_codegen::kernels::flash_wg_d_ok(d)).then_some((4usize, 0usize));
        for &(warps, mtiles) in shapes.iter().chain(wg.iter()).filter(|_| t > 64) {
            let flash = KernelSpec::FlashAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), kv, warps, mtiles: mtiles.max(1) };
            // (mtiles 0 marks the wgmma variant)
            let spec = if mtiles == 0 { KernelSpec::FlashWgmma { inner: Box::new(flash) } } else { flash };
            let mtiles = mtiles.max(1);
            cases.push(Case {
                name: format!(
                    "flash_attn T{t} H{h}/{kvh} D{d} {} sequences{}{}{}{}{}",
                    seqs.len(),
                    if qs == 1.0 { String::new() } else { format!(" q x{qs}") },
                    kv_label(kv),
                    if warps == 4 { String::new() } else { format!(" {warps} warps") },
                    if mtiles == 1 { String::new() } else { format!(" {mtiles} m-tiles") },
                    if matches!(spec, KernelSpec::FlashWgmma { .. }) { " wgmma" } else { "" }
                ),
                kernel: spec.symbol(),
                // (the wgmma kernel: heads per block as its launch says)
                grid: grid(&spec.launch(), h).0,
                grid_y: t.div_ceil(16 * mtiles * warps) as u32,
                block: grid(&spec.launch(), 1).1,
                inputs: inputs.clone(),
                scalars: vec![t as i64, mb as i64],
                expected: expected.clone(),
                init: None,
                written_inputs: vec![],
                // (the wgmma kernel with TMA tiles: the pools' tensor maps)
                tmaps: match dsc_codegen::kernels::flash_wg_tma_rows(bs).filter(|_| matches!(spec, KernelSpec::FlashWgmma { .. })) {
                    Some(rows) => (1..3).map(|input| TmapInput { input, n: 0, k: 0, rows: rows as u32, f16: false, pool: Some([nb, bs, kvh, d]) }).collect(),
                    None => vec![],
                },
                tol: if qs == 1.0 { 1e-2 } else { 5e-2 },
                cluster: None,
            });
            specs.push(spec);
        }
        if t > 64 {
            continue;
        }
        // 16 warps per block and 4 keys per warp step (the defaults), 4 warps (DSC_ATTN_WARPS
        // sweeps), one key and 3 (a step straddling the context's end: DSC_ATTN_KEYS), on
        // the same data
        // ... and the grouped kernel of batched decode (a block per (token, KV head): 8 warps,
        // and 4 with 3 keys; and per half a KV head's group, as models whose whole group does
        // not fit a block take: `lower::attention_group_size`)
        let rep = h / kvh;
        let mut variants = vec![(4usize, 4usize, 1usize), (16, 4, 1), (16, 1, 1), (4, 3, 1)];
        if kv != DType::F32 {
            variants = vec![(16, 4, 1), (4, 3, 1)];
        }
        if rep > 1 {
            variants.extend([(8, 4, rep), (4, 3, rep)]);
        }
        if rep % 2 == 0 && rep > 2 {
            variants.push((8, 4, rep / 2));
        }
        for (warps, keys, group) in variants {
            let spec = KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps, keys, group, kv };
            // (a block per (token, group of heads))
            let (gr, b) = grid(&spec.launch(), t);
            cases.push(Case {
                name: format!(
                    "paged_attn T{t} H{h}/{kvh} D{d}{}{}{}{}",
                    if warps == 16 { String::new() } else { format!(" {warps} warps") },
                    if keys == 4 { String::new() } else { format!(" {keys} keys") },
                    if group == 1 { String::new() } else { format!(" groups of {group}") },
                    kv_label(kv)
                ),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: (h / group) as u32,
                block: b,
                inputs: inputs.clone(),
                scalars: vec![(t * h) as i64, mb as i64],
                expected: expected.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-4,
                cluster: None,
            });
            specs.push(spec);
        }
        // ... prefetching another buffer's bytes into L2 first (`PrefetchL2`: the next
        // matmul's weights; 100,003 f32, split over the blocks — one buffer for every case),
        // the one-pass and the grouped kernel: the same outputs
        let pf = prefetched.get_or_insert_with(|| data.push(&rand_vec(100_003, -1.0, 1.0))).clone();
        for (warps, group) in [(16usize, 1usize), (dsc_codegen::schedule::ATTN_GROUP_WARPS, rep)].into_iter().filter(|_| kv == DType::F32) {
            let spec = KernelSpec::PrefetchL2 { inner: Box::new(KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps, keys: 4, group, kv }) };
            let (gr, b) = grid(&spec.launch(), t);
            let mut ins = vec![pf.clone()];
            ins.extend(inputs.iter().cloned());
            cases.push(Case {
                name: format!("paged_attn T{t} H{h}/{kvh} D{d}{} + L2 prefetch", if group == 1 { String::new() } else { format!(" groups of {group}") }),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: (h / group) as u32,
                block: b,
                inputs: ins,
                scalars: vec![(t * h) as i64, mb as i64, 100_003 * 4],
                expected: expected.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-4,
                cluster: None,
            });
            specs.push(spec);
        }
        // the split decode attention (DSC_SPLIT_KV): its first pass against partial states
        // computed here, then its merge from those states against the executor's output;
        // the plans' split (16 parts of 256+ keys) and a small one that every context fills
        for (ns, mk, warps, keys) in [(dsc_codegen::schedule::ATTN_SPLITS, dsc_codegen::schedule::ATTN_SPLIT_MIN_KEYS, 16usize, 4usize), (4, 8, 4, 3)] {
            // (the plans' split only where a context is long enough to be cut: the bundle
            // shares one call's 64 MiB with the runtime)
            if pos.iter().all(|&p| (p as usize) < mk) && ns == dsc_codegen::schedule::ATTN_SPLITS {
                continue;
            }
            let parts = split_partials(&q, &kc, &vc, &pos, &seq, &table, (h, kvh, d, bs, mb), scale, ns, mk);
            let pa = data.push(&parts);
            let zeros = data.push(&vec![0.0f32; parts.len()]);
            // (a block per (token, head, part), and per (token, KV head, part): the grouped
            // kernel of models with 8+ KV heads)
            for group in [1, rep].into_iter().filter(|&g| g == 1 || rep > 1) {
                let spec = KernelSpec::PagedAttentionSplit { h, kvh, d, bs, scale_bits: scale.to_bits(), warps, keys, splits: ns, min_keys: mk, group, kv };
                let (gr, b) = grid(&spec.launch(), t);
                let mut ins = inputs.clone();
                ins.truncate(6);
                cases.push(Case {
                    name: format!("paged_attn split {ns}x{mk} T{t} H{h}/{kvh} D{d}{}{}", if group == 1 { String::new() } else { format!(" groups of {group}") }, kv_label(kv)),
                    kernel: spec.symbol(),
                    grid: gr,
                    grid_y: (h / group * ns) as u32,
                    block: b,
                    inputs: ins,
                    scalars: vec![(t * h) as i64, mb as i64],
                    expected: pa.clone(),
                    // (parts past a row's se are not written)
                    init: Some(zeros.clone()),
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol: 1e-4,
                    cluster: None,
                });
                specs.push(spec);
            }
            let spec = KernelSpec::AttentionCombine { h, d, splits: ns, min_keys: mk };
            let (gr, b) = grid(&spec.launch(), t * h);
            cases.push(Case {
                name: format!("attn combine {ns}x{mk} T{t} H{h} D{d}"),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: 1,
                block: b,
                inputs: vec![pa.clone(), data.push_i32(&pos)],
                scalars: vec![(t * h) as i64],
                expected: expected.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-4,
                cluster: None,
            });
            specs.push(spec);
        }
    }
    // the decode attention with RoPE and the K/V cache writes folded in (`RopeAttention`, one
    // token per sequence as the lowering uses it at batch 1; here 3 sequences): the output and
    // both pools against rope + rope_cache_write + cache_write + paged_attention
    // (the 8B shape's head dim and GQA group with 8 of its heads — small pools: the bundle
    // shares one call's 64 MiB —; SmolLM2's shape with f32 pools, as its real model's plan;
    // and bf16 pools)
    // (last: the SmolLM2 plans' one-token layer — q, k and v from x by the attention itself,
    // `QkvAttentionO` over a K = 576 x, the only case of that configuration)
    for (h, kvh, d, bs, interleaved, kv, qkv) in [
        (8usize, 2usize, 128usize, 16usize, false, DType::F32, None),
        (8, 2, 128, 16, false, DType::BF16, None),
        (9, 3, 64, 16, false, DType::F32, None),
        (9, 3, 64, 4, true, DType::BF16, None),
        (9, 3, 64, 16, false, DType::BF16, Some(264usize)),
    ] {
        let theta = 500000.0f32;
        // (q/k/v from x: also 300 keys, past one warp step of every warp of every block of the
        // cluster that splits them — 4 x 16 x 4 —, so the loop's later steps and this token's
        // row in one of them are checked too, and 1 key, where three of the four blocks have
        // none; K 264: a partial last round of 16-byte pieces, as the plans' 576; the others
        // keep their small pools: the bundle's data is near the 64 MiB a call carries)
        let lens: &[usize] = if qkv.is_some() { &[21, 1, 300] } else { &[21, 1, 40] };
        let t = lens.len();
        let mb = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(1);
        let nb = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 2;
        let mut table = vec![-1i32; t * mb];
        let mut next = nb as i32 - 1;
        for (si, l) in lens.iter().enumerate() {
            for j in 0..l.div_ceil(bs) {
                table[si * mb + j] = next;
                next -= 1;
            }
        }
        let pos: Vec<i32> = lens.iter().map(|&l| l as i32 - 1).collect();
        let seq: Vec<i32> = (0..t as i32).collect();
        let slots: Vec<i32> = (0..t).map(|i| table[i * mb + pos[i] as usize / bs] * bs as i32 + pos[i] % bs as i32).collect();
        let (mut xq, mut xk, mut xv) = (rand_vec(t * h * d, -1.0, 1.0), rand_vec(t * kvh * d, -1.0, 1.0), rand_vec(t * kvh * d, -1.0, 1.0));
        // (QkvAttentionO: q, k and v = RMSNorm(x) · g times bf16 W_q, W_k, W_v, as the
        // graph's rms_norm + matmul compute them on the host)
        let qkv_in = qkv.map(|kk| {
            let x = rand_vec(t * kk, -1.0, 1.0);
            let gw = rand_vec(kk, 0.5, 1.5);
            let ws: Vec<Vec<f32>> = [h, kvh, kvh].iter().map(|&heads| kv_round(&rand_vec(heads * d * kk, -0.05, 0.05), DType::BF16)).collect();
            let eps = 1e-5f32;
            let xn: Vec<f32> = (0..t * kk)
                .map(|i| {
                    let row = &x[(i / kk) * kk..(i / kk + 1) * kk];
                    let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / kk as f32 + eps).sqrt();
                    x[i] * inv * gw[i % kk]
                })
                .collect();
            let proj = |w: &[f32], rows: usize| -> Vec<f32> { (0..t * rows).map(|i| (0..kk).map(|j| w[(i % rows) * kk + j] * xn[(i / rows) * kk + j]).sum()).collect() };
            (kk, eps, x.clone(), gw.clone(), proj(&ws[0], h * d), proj(&ws[1], kvh * d), proj(&ws[2], kvh * d), ws)
        });
        if let Some((_, _, _, _, q, k, v, _)) = &qkv_in {
            (xq, xk, xv) = (q.clone(), k.clone(), v.clone());
        }
        let kc0 = kv_round(&rand_vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let vc0 = kv_round(&rand_vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let scale = 1.0 / (d as f32).sqrt();
        let style = if interleaved { "interleaved" } else { "half" };
        let r = format!("{{theta = {theta:?}, style = {style}, rotary_dim = {d}}}");
        let src = format!(
            "graph \"k\" {{\n  %xq = input : f32[{t}, {h}, {d}]\n  %xk = input : f32[{t}, {kvh}, {d}]\n  %xv = input : f32[{t}, {kvh}, {d}]\n  %pos = input : i32[{t}]\n  %seq = input : i32[{t}]\n  %slots = input : i32[{t}]\n  %table = input : i32[{t}, {mb}]\n  %kc = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %vc = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %q = rope(%xq, %pos) {r} : f32[{t}, {h}, {d}]\n  %kw = rope_cache_write(%kc, %xk, %slots, %pos) {r} : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %vw = cache_write(%vc, %xv, %slots) : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %o = paged_attention(%q, %kw, %vw, %pos, %seq, %table) {{scale = {scale:?}}} : f32[{t}, {h}, {d}]\n  output o = %o\n  output k = %kw\n  output v = %vw\n}}\n"
        );
        let g = text::parse(&src)?;
        let mut ex = Executor::new(&g, &none, BTreeMap::new())?;
        ex.state_mut("kc").context("kc")?.data.copy_from_slice(&kc0);
        ex.state_mut("vc").context("vc")?.data.copy_from_slice(&vc0);
        let mut outs = ex.run(&BTreeMap::from([
            ("xq".to_string(), Tensor::new(vec![t, h, d], xq.clone())),
            ("xk".to_string(), Tensor::new(vec![t, kvh, d], xk.clone())),
            ("xv".to_string(), Tensor::new(vec![t, kvh, d], xv.clone())),
            ("pos".to_string(), Tensor::from_i32(vec![t], &pos)),
            ("seq".to_string(), Tensor::from_i32(vec![t], &seq)),
            ("slots".to_string(), Tensor::from_i32(vec![t], &slots)),
            ("table".to_string(), Tensor::from_i32(vec![t, mb], &table)),
        ]))?;
        let (o, k, v) = (outs.remove("o").context("o")?.data, outs.remove("k").context("k")?.data, outs.remove("v").context("v")?.data);
        // (the keys per warp step the plans take: DSC_ATTN_KEYS at bundle time checks another)
        let inner = KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps: 16, keys: opts.schedule.attn_keys, group: 1, kv };
        let spec = KernelSpec::RopeAttention { inner: Box::new(inner), theta_bits: theta.to_bits(), interleaved };
        let (gr, b) = grid(&spec.launch(), t);
        let (wk, wv) = (data.push(&k), data.push(&v));
        let qkv_args =
            qkv_in.as_ref().map(|(_, _, x, gw, _, _, _, ws)| [data.push(x), data.push(gw), data.push_kv(&ws[0], DType::BF16), data.push_kv(&ws[1], DType::BF16), data.push_kv(&ws[2], DType::BF16)]);
        let heads = match &qkv_args {
            Some(a) => a.to_vec(),
            None => vec![data.push(&xq), data.push(&xk), data.push(&xv)],
        };
        let inputs: Vec<Array> =
            heads.into_iter().chain([data.push_i32(&pos), data.push_i32(&slots), data.push_kv(&kc0, kv), data.push_kv(&vc0, kv), data.push_i32(&seq), data.push_i32(&table)]).collect();
        // (the pools' and the accumulators' places in the inputs)
        let at = inputs.len() - 9;
        if qkv.is_none() {
            cases.push(Case {
                name: format!("paged_attn + rope + cache writes T{t} H{h}/{kvh} D{d} {style}{}", kv_label(kv)),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: h as u32,
                block: b,
                inputs: inputs.clone(),
                scalars: vec![(t * h) as i64, mb as i64],
                expected: data.push(&o),
                init: None,
                written_inputs: vec![(5, wk.clone()), (6, wv.clone())],
                tmaps: vec![],
                // (the rope kernels' approximate sin/cos; a bf16 pool's rounding of k may flip)
                tol: kv_tol(kv, 1e-4),
                cluster: None,
            });
            specs.push(spec.clone());
        }
        // ... with the o projection and its residual folded in (`AttentionO`, the SmolLM2
        // shape's head dim): y = res + o W_oᵀ over N = 520 rows (two rounds of the block's 512
        // threads, the second partial), the counters back at zero after. A probe the plans do
        // not use (measured slower): in the bundle under DSC_ATTN_O=1 only — the whole
        // bundle's data must fit one call's 64 MiB
        // With `red` (the default plans' one-token path, `AttentionO { red }`): each head adds
        // its projection (head 0: + the residual) into the output and a second accumulator,
        // both zero before the launch.
        // (`splits` blocks per head, each adding its part of the rows)
        // (one W_o, residual and result for every variant: the bundle's data is near the
        // 64 MiB a call carries)
        let nn = if qkv.is_some() { 128usize } else { 520 };
        let shared = (kv == DType::BF16 && d == 64).then(|| {
            let wo = kv_round(&rand_vec(nn * h * d, -0.1, 0.1), DType::BF16);
            let res = rand_vec(t * nn, -1.0, 1.0);
            let y: Vec<f32> = (0..t * nn)
                .map(|i| {
                    let (ti, j) = (i / nn, i % nn);
                    res[i] + (0..h * d).map(|c| wo[j * h * d + c] * o[ti * h * d + c]).sum::<f32>()
                })
                .collect();
            (data.push_kv(&wo, DType::BF16), data.push(&res), data.push(&y), data.push(&vec![0.0; t * nn]))
        });
        // (q/k/v from x: in the plans' clusters, `ScheduleOptions::attn_o_splits`)
        let qkv_splits = [(true, opts.schedule.attn_o_splits)];
        let variants: &[(bool, usize)] = if qkv.is_some() { &qkv_splits } else { &[(false, 1), (true, 1), (true, 4)] };
        for &(red, splits) in variants {
            let Some((wo_a, res_a, y_a, zeros)) = shared.clone() else { continue };
            if !(red || opts.schedule.attn_o) {
                continue;
            }
            let fused = KernelSpec::AttentionO { inner: Box::new(spec.clone()), n: nn, red, splits };
            if red {
                // (q/k/v from x: a head's blocks a cluster on sm_90a)
                let (fk, name, cluster) = match &qkv_in {
                    Some((kk, eps, ..)) => (
                        KernelSpec::QkvAttentionO { inner: Box::new(fused), k: *kk, eps_bits: eps.to_bits(), cluster: splits },
                        format!("paged_attn + q/k/v from x (K {kk}) + rope + cache writes + o projection added T{t} H{h}/{kvh} D{d} N{nn} clusters of {splits} {style}{}", kv_label(kv)),
                        Some(splits as u32),
                    ),
                    None => (fused, format!("paged_attn + rope + cache writes + o projection added T{t} H{h}/{kvh} D{d} N{nn} {splits} block(s) per head {style}{}", kv_label(kv)), None),
                };
                cases.push(Case {
                    name,
                    kernel: fk.symbol(),
                    grid: gr,
                    grid_y: (h * splits) as u32,
                    block: b,
                    inputs: inputs.iter().cloned().chain([wo_a, res_a, zeros.clone()]).collect(),
                    scalars: vec![(t * h) as i64, mb as i64],
                    expected: y_a.clone(),
                    init: Some(zeros),
                    written_inputs: vec![(at + 5, wk.clone()), (at + 6, wv.clone()), (at + 11, y_a)],
                    tmaps: vec![],
                    tol: kv_tol(kv, 1e-4),
                    cluster,
                });
                specs.push(fk);
                continue;
            }
            let zeros = vec![0i32; t];
            cases.push(Case {
                name: format!("paged_attn + rope + cache writes + o projection T{t} H{h}/{kvh} D{d} N{nn} {style}{}", kv_label(kv)),
                kernel: fused.symbol(),
                grid: gr,
                grid_y: h as u32,
                block: b,
                // (the same q/k/v, positions, pools and table: each case uploads its inputs)
                inputs: inputs.iter().cloned().chain([wo_a, res_a, data.push(&vec![0.0; h * t * nn]), data.push_i32(&zeros)]).collect(),
                scalars: vec![(t * h) as i64, mb as i64],
                expected: y_a,
                init: None,
                written_inputs: vec![(5, wk.clone()), (6, wv.clone()), (12, data.push(&vec![0.0; t]))],
                tmaps: vec![],
                tol: kv_tol(kv, 1e-4),
                cluster: None,
            });
            specs.push(fused);
        }
    }
    // seeded weights generated on the device, bit-exact against the host generator
    for (dtype, ones) in [(DType::F32, false), (DType::BF16, false), (DType::F16, false), (DType::F32, true)] {
        let (n, seed, name, scale) = (100_002usize, 7u64, "blk.3.ffn_up.weight", 1.0f32 / 64.0);
        let host = dsc_ir::quant::encode(dtype, &dsc_ir::seeded::values(seed, name, n, scale, ones)).context("encode")?;
        let as_f32: Vec<f32> = le_words(&host);
        let spec = KernelSpec::SeededInit { dtype };
        let (g, b) = grid(&spec.launch(), n);
        let base = dsc_ir::seeded::base(seed, name) as i64;
        cases.push(Case {
            name: format!("seeded_init {n} {dtype}{}", if ones { " ones" } else { "" }),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![],
            scalars: vec![n as i64, base, scale.to_bits() as i64, ones as i64, n as i64, 0, 0],
            expected: data.push(&as_f32),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        if !ones {
            specs.push(spec);
        }
    }
    // a tensor-parallel shard of a seeded weight: rank 1 of 2 of the columns of [rows, cols]
    {
        let (rows, cols, seed, name, scale) = (301usize, 512usize, 7u64, "blk.0.ffn_down.weight", 1.0f32 / 64.0);
        let full = dsc_ir::seeded::values(seed, name, rows * cols, scale, false);
        let s = dsc_ir::shard::Shard { axis: 1, start: cols / 2, len: cols / 2 };
        let want: Vec<f32> = (0..rows).flat_map(|r| full[r * cols + s.start..r * cols + s.start + s.len].to_vec()).collect();
        let (row0, len, stride, col0) = dsc_ir::shard::seeded_layout(&[rows, cols], s);
        let spec = KernelSpec::SeededInit { dtype: DType::F32 };
        let n = want.len();
        let (g, b) = grid(&spec.launch(), n);
        let base = dsc_ir::seeded::base(seed, name).wrapping_add(row0) as i64;
        cases.push(Case {
            name: format!("seeded_init shard [{rows}, {cols}] columns {}..{}", s.start, s.start + s.len),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![],
            scalars: vec![n as i64, base, scale.to_bits() as i64, 0, len as i64, stride as i64, col0 as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
    }
    // row ops and index ops
    {
        let (rows, d) = (37usize, 1000usize);
        let x = rand_vec(rows * d, -6.0, 6.0);
        let want = reference(
            &format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %y = softmax(%x) : f32[{rows}, {d}]\n  output y = %y\n}}\n"),
            vec![("x", Tensor::new(vec![rows, d], x.clone()))],
            &none,
        )?;
        let spec = KernelSpec::Softmax { d };
        let (g, b) = grid(&spec.launch(), rows);
        cases.push(Case {
            name: format!("softmax {rows}x{d}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&x)],
            scalars: vec![rows as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        specs.push(spec);
    }
    {
        let (rows, d, eps) = (19usize, 768usize, 1e-5f32);
        let x = rand_vec(rows * d, -3.0, 5.0);
        let w = rand_vec(d, 0.5, 1.5);
        let bias = rand_vec(d, -0.5, 0.5);
        let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let ws: Weights = HashMap::from([("w".to_string(), (DType::F32, vec![d], f(&w))), ("b".to_string(), (DType::F32, vec![d], f(&bias)))]);
        let want = reference(&format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %w = weight : f32[{d}]\n  %b = weight : f32[{d}]\n  %y = layer_norm(%x, %w, %b) {{eps = {eps:?}}} : f32[{rows}, {d}]\n  output y = %y\n}}\n"), vec![("x", Tensor::new(vec![rows, d], x.clone()))], &ws)?;
        let spec = KernelSpec::LayerNorm { d, eps_bits: eps.to_bits(), half: None };
        let (g, b) = grid(&spec.launch(), rows);
        let (xa, wa, ba, ya) = (data.push(&x), data.push(&w), data.push(&bias), data.push(&want));
        cases.push(Case {
            name: format!("layer_norm {rows}x{d}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![xa.clone(), wa.clone(), ba.clone()],
            scalars: vec![rows as i64],
            expected: ya.clone(),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        specs.push(spec);
        // norm + quantize: y as before (a written input) and its 16-bit copy (the output, as
        // the f32 words of packed pairs)
        let poison = data.push(&vec![f32::NAN; rows * d]);
        for f16 in [false, true] {
            let spec = KernelSpec::LayerNorm { d, eps_bits: eps.to_bits(), half: Some(f16) };
            let half = dsc_ir::quant::encode(if f16 { DType::F16 } else { DType::BF16 }, &want).context("encode")?;
            let words: Vec<f32> = le_words(&half);
            cases.push(Case {
                name: format!("layer_norm {rows}x{d} + {} copy", if f16 { "f16" } else { "bf16" }),
                kernel: spec.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![xa.clone(), wa.clone(), ba.clone(), poison.clone()],
                scalars: vec![rows as i64],
                expected: data.push(&words),
                init: None,
                written_inputs: vec![(3, ya.clone())],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            });
            specs.push(spec);
        }
    }
    // argmax: a block per row (SmolLM2's and Llama 3's vocabularies: whole loop steps, and a
    // partial last one), and a warp per row (a width not a multiple of 4)
    for (rows, d) in [(2usize, 49152usize), (2, 128256), (3, 1001)] {
        let mut x = rand_vec(rows * d, -10.0, 10.0);
        x[(rows - 2) * d + 7] = 50.0; // a tie at the top: the first index wins
        x[(rows - 2) * d + 900] = 50.0;
        x[rows * d - 1] = 60.0; // the row's last element the largest
        let want =
            reference(&format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %y = argmax(%x) : i32[{rows}]\n  output y = %y\n}}\n"), vec![("x", Tensor::new(vec![rows, d], x.clone()))], &none)?;
        // the kernel writes i32: compare bit patterns (small ints are f32 denormals, never NaN)
        let bits: Vec<f32> = want.iter().map(|&v| f32::from_bits(v as i32 as u32)).collect();
        // (one copy of the rows and of the ids for all three kernels: the bundle shares a
        // call's 64 MiB)
        let (xa, ya) = (data.push(&x), data.push(&bits));
        let spec = KernelSpec::Argmax { d };
        let (g, b) = grid(&spec.launch(), rows);
        // (and split over blocks: partials and counters as inputs, the counters zero again)
        if let Some(splits) = dsc_codegen::kernels::argmax_splits(d) {
            let split = KernelSpec::ArgmaxSplit { d, splits };
            let zeros = data.push(&vec![0.0; rows]);
            cases.push(Case {
                name: format!("argmax {rows}x{d} over {splits} blocks per row"),
                kernel: split.symbol(),
                grid: splits as u32,
                grid_y: rows as u32,
                block: 32 * dsc_codegen::kernels::ARGMAX_SPLIT_WARPS as u32,
                inputs: vec![xa.clone(), data.push(&vec![0.0; rows * splits * 2]), zeros.clone()],
                scalars: vec![rows as i64],
                expected: ya.clone(),
                init: None,
                written_inputs: vec![(2, zeros)],
                tmaps: vec![],
                tol: 0.0,
                cluster: None,
            });
            specs.push(split);
            // (and in a thread-block cluster per row, sm_90a)
            let blocks = dsc_codegen::kernels::ARGMAX_CLUSTER_BLOCKS;
            let cl = KernelSpec::ArgmaxCluster { d, blocks };
            cases.push(Case {
                name: format!("argmax {rows}x{d} in clusters of {blocks}"),
                kernel: cl.symbol(),
                grid: rows as u32,
                grid_y: blocks as u32,
                block: 32 * dsc_codegen::kernels::ARGMAX_CLUSTER_WARPS as u32,
                inputs: vec![xa.clone()],
                scalars: vec![rows as i64],
                expected: ya.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 0.0,
                cluster: Some(blocks as u32),
            });
            specs.push(cl);
        }
        cases.push(Case {
            name: format!("argmax {rows}x{d}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![xa.clone()],
            scalars: vec![rows as i64],
            expected: ya.clone(),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        specs.push(spec);
    }
    {
        let x = rand_vec(7 * 12 * 64, -1.0, 1.0);
        let want = reference(
            "graph \"k\" {\n  %x = input : f32[7, 12, 64]\n  %y = slice(%x) {axis = 1, start = 3, len = 4} : f32[7, 4, 64]\n  output y = %y\n}\n",
            vec![("x", Tensor::new(vec![7, 12, 64], x.clone()))],
            &none,
        )?;
        let spec = KernelSpec::Slice { inner: 64, d: 12, start: 3, len: 4 };
        let (g, b) = grid(&spec.launch(), want.len());
        cases.push(Case {
            name: "slice 7x12x64 [3..7]".into(),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&x)],
            scalars: vec![want.len() as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        specs.push(spec);
        let xs = rand_vec(9 * 64, -1.0, 1.0);
        let idx: Vec<i32> = rand_vec(9 * 6, 0.0, 64.0).into_iter().map(|v| (v as i32).min(63)).collect();
        let want = reference(
            "graph \"k\" {\n  %x = input : f32[9, 64]\n  %i = input : i32[9, 6]\n  %y = take_along(%x, %i) : f32[9, 6]\n  output y = %y\n}\n",
            vec![("x", Tensor::new(vec![9, 64], xs.clone())), ("i", Tensor::from_i32(vec![9, 6], &idx))],
            &none,
        )?;
        let spec = KernelSpec::TakeAlong { n_in: 64, k: 6 };
        let (g, b) = grid(&spec.launch(), want.len());
        cases.push(Case {
            name: "take_along 9x64 k6".into(),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&xs), data.push_i32(&idx)],
            scalars: vec![want.len() as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        specs.push(spec);
    }
    {
        // top_k with ties: values on a coarse grid so equal values are common
        let (rows, d, k) = (11usize, 64usize, 6usize);
        let x: Vec<f32> = rand_vec(rows * d, 0.0, 8.0).into_iter().map(|v| v.floor()).collect();
        let want = reference(
            &format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %y = top_k(%x) {{k = {k}}} : i32[{rows}, {k}]\n  output y = %y\n}}\n"),
            vec![("x", Tensor::new(vec![rows, d], x.clone()))],
            &none,
        )?;
        let bits: Vec<f32> = want.iter().map(|&v| f32::from_bits(v as i32 as u32)).collect();
        let spec = KernelSpec::TopK { d, k };
        let (g, b) = grid(&spec.launch(), rows);
        cases.push(Case {
            name: format!("top_k {rows}x{d} k{k} ties"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&x)],
            scalars: vec![rows as i64],
            expected: data.push(&bits),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        specs.push(spec);
        let x = rand_vec(5 * 3 * 16, -1.0, 1.0);
        let want = reference(
            "graph \"k\" {\n  %x = input : f32[5, 3, 16]\n  %y = transpose(%x) {perm = [1, 0, 2]} : f32[3, 5, 16]\n  output y = %y\n}\n",
            vec![("x", Tensor::new(vec![5, 3, 16], x.clone()))],
            &none,
        )?;
        let spec = KernelSpec::Transpose { perm: vec![1, 0, 2] };
        let (g, b) = grid(&spec.launch(), want.len());
        cases.push(Case {
            name: "transpose 5x3x16 [1,0,2]".into(),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&x)],
            scalars: vec![want.len() as i64, 5, 3, 16],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        specs.push(spec);
        let (a, c) = (rand_vec(4 * 3 * 16, -1.0, 1.0), rand_vec(4 * 5 * 16, -1.0, 1.0));
        let want = reference(
            "graph \"k\" {\n  %a = input : f32[4, 3, 16]\n  %c = input : f32[4, 5, 16]\n  %y = concat(%a, %c) {axis = 1} : f32[4, 8, 16]\n  output y = %y\n}\n",
            vec![("a", Tensor::new(vec![4, 3, 16], a.clone())), ("c", Tensor::new(vec![4, 5, 16], c.clone()))],
            &none,
        )?;
        let spec = KernelSpec::Concat { sizes: vec![3, 5], inner: 16 };
        let (g, b) = grid(&spec.launch(), want.len());
        cases.push(Case {
            name: "concat 4x(3+5)x16".into(),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![data.push(&a), data.push(&c)],
            scalars: vec![want.len() as i64],
            expected: data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        specs.push(spec);
    }
    if !only.is_empty() {
        let keep = |k: &str| only.iter().any(|o| k.contains(o.as_str()));
        cases.retain(|c| keep(&c.kernel));
        if cases.is_empty() {
            anyhow::bail!("no kernel-check case's kernel contains any of {only:?}");
        }
        specs.retain(|s| cases.iter().any(|c| c.kernel == s.symbol()));
        // (the kept cases' arrays copied into a fresh data.bin, offsets remapped)
        let old = std::mem::replace(&mut data, Data(vec![]));
        let mut moved: HashMap<usize, usize> = HashMap::new();
        let mut relocate = |a: &mut Array| -> anyhow::Result<()> {
            let at = match moved.get(&a.offset) {
                Some(&at) => at,
                None => {
                    let bytes = old.0.get(a.offset..a.offset + a.byte_len()?).context("array outside the data")?;
                    let at = data.push_u8(bytes).offset;
                    moved.insert(a.offset, at);
                    at
                }
            };
            a.offset = at;
            Ok(())
        };
        for c in &mut cases {
            for a in c.inputs.iter_mut().chain(std::iter::once(&mut c.expected)).chain(c.init.iter_mut()).chain(c.written_inputs.iter_mut().map(|(_, a)| a)) {
                relocate(a)?;
            }
        }
    }
    let m = compile_kernels(&specs, &GpuTarget::ALL, &opts.kernels)?;
    // (kernel options other than the default: every symbol carries their hash)
    let suffix = opts.kernels.symbol_suffix();
    for c in &mut cases {
        c.kernel.push_str(&suffix);
    }
    // the cases name kernels by their readable symbol: two bundle specs that share one (and so
    // were compiled under hashed names) would leave a case without its kernel
    let names: std::collections::BTreeSet<&str> = m.kernels.iter().map(|(n, _)| n.as_str()).collect();
    if let Some(c) = cases.iter().find(|c| !names.contains(c.kernel.as_str())) {
        anyhow::bail!("bundle case `{}`: kernel `{}` is not in the module (two bundle specs share its name: give them distinct shapes)", c.name, c.kernel);
    }
    let mut ptx = BTreeMap::new();
    for (t, text) in &m.ptx {
        let f = format!("kernels.{}.ptx", t.name());
        std::fs::write(dir.join(&f), text)?;
        ptx.insert(t.name().to_string(), f);
    }
    std::fs::write(dir.join("kernels.mlir"), &m.mlir)?;
    std::fs::write(dir.join("kernels.ll"), &m.llvm)?;
    std::fs::write(dir.join("data.bin"), &data.0)?;
    let n = cases.len();
    // dynamic shared memory of the kernels that take it (the pipelined matmuls)
    let smem = specs
        .iter()
        .filter_map(|s| match s.launch() {
            Launch::Tile { smem, .. } => Some((s.symbol(), smem)),
            _ => None,
        })
        .collect();
    std::fs::write(dir.join("bundle.json"), serde_json::to_string_pretty(&Bundle { ptx, cases, smem })?)?;
    Ok(n)
}

/// `v` as a `kv` KV pool holds it (bf16: rounded to nearest even).
fn kv_round(v: &[f32], kv: DType) -> Vec<f32> {
    v.iter().map(|&x| dsc_ir::quant::round_to(kv, x)).collect()
}

/// A case name's note of a KV pool's type (none for f32).
fn kv_label(kv: DType) -> String {
    if kv == DType::F32 {
        String::new()
    } else {
        format!(" {kv} pool")
    }
}

/// A KV-writing case's tolerance: `f32` for f32 pools; a bf16 pool's values near a rounding
/// boundary may round the other way from approximate math (half a bf16 ulp, 2^-9, on a few).
fn kv_tol(kv: DType, f32_tol: f32) -> f32 {
    if kv == DType::F32 {
        f32_tol
    } else {
        4e-3
    }
}

/// The split decode attention's partial states (`KernelSpec::PagedAttentionSplit`), computed
/// on the host: for row (token t, head hi) and part s < se (`kernels::split_parts`) of
/// ceil(ctx / se) keys, (m, l, acc[d]) at ((row·ns + s)·(d + 2)); zeros elsewhere.
#[allow(clippy::too_many_arguments)]
fn split_partials(q: &[f32], kc: &[f32], vc: &[f32], pos: &[i32], seq: &[i32], table: &[i32], dims: (usize, usize, usize, usize, usize), scale: f32, ns: usize, mk: usize) -> Vec<f32> {
    let (h, kvh, d, bs, mb) = dims;
    let t = pos.len();
    let mut out = vec![0.0f32; t * h * ns * (d + 2)];
    for ti in 0..t {
        let ctx = pos[ti] as usize + 1;
        let se = dsc_codegen::kernels::split_parts(ctx, t * h, ns, mk);
        let chunk = ctx.div_ceil(se);
        for hi in 0..h {
            let kh = hi / (h / kvh);
            let qrow = &q[(ti * h + hi) * d..][..d];
            for s in 0..se {
                let (lo, hi_k) = (s * chunk, ((s + 1) * chunk).min(ctx));
                let at = |j: usize| {
                    let blk = table[seq[ti] as usize * mb + j / bs] as usize;
                    ((blk * bs + j % bs) * kvh + kh) * d
                };
                let scores: Vec<f32> = (lo..hi_k).map(|j| qrow.iter().zip(&kc[at(j)..][..d]).map(|(a, b)| a * scale * b).sum()).collect();
                let m = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let base = ((ti * h + hi) * ns + s) * (d + 2);
                out[base] = m;
                for (j, sc) in (lo..hi_k).zip(&scores) {
                    let p = (sc - m).exp();
                    out[base + 1] += p;
                    for (e, v) in vc[at(j)..][..d].iter().enumerate() {
                        out[base + 2 + e] += p * v;
                    }
                }
            }
        }
    }
    out
}
