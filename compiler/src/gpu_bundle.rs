//! `dsc gpu-bundle`: every generated kernel, compiled to PTX, with fresh random inputs and the
//! CPU reference executor's outputs, for `dsc-runtime gpu-check` to run on a GPU.

use anyhow::Context;
use dsc_codegen::kernels::{BinaryOpKey, UnaryOpKey};
use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec, Launch};
use dsc_ir::{text, BinaryOp, DType, Executor, Tensor, UnaryOp};
use dsc_runtime::gpu_check::{Array, Bundle, Case};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

struct Data(Vec<f32>);
impl Data {
    fn push(&mut self, v: &[f32]) -> Array {
        let a = Array { offset: self.0.len(), len: v.len() };
        self.0.extend_from_slice(v);
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

fn grid(launch: &Launch, n: usize) -> (u32, u32) {
    match launch {
        Launch::PerElement { threads } => ((n as u32).div_ceil(*threads), *threads),
        Launch::WarpPerRow { rows_per_block } => ((n as u32).div_ceil(*rows_per_block), 32 * rows_per_block),
    }
}

pub fn write_bundle(dir: &Path, seed: u64) -> anyhow::Result<usize> {
    std::fs::create_dir_all(dir)?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut rand_vec = |n: usize, lo: f32, hi: f32| -> Vec<f32> { (0..n).map(|_| rng.random_range(lo..hi)).collect() };
    let mut data = Data(vec![]);
    let mut cases = vec![];
    let mut specs = vec![];
    let none = Weights::new();
    let n = 100_003usize; // not a multiple of the block: exercises the bounds check
    let unary = [UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Recip, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Relu, UnaryOp::Silu, UnaryOp::Gelu];
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
        cases.push(Case { name: format!("{name} n={n}"), kernel: spec.symbol(), grid: g, block: b, inputs: vec![data.push(&x)], scalars: vec![n as i64], expected: data.push(&want), tol });
        specs.push(spec);
    }
    for bop in [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min] {
        let spec = KernelSpec::Binary(BinaryOpKey(bop));
        let name = dsc_ir::Op::Binary(bop).name();
        for (rows, cols, bcast) in [(129usize, 576usize, false), (129, 576, true)] {
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
                block: b,
                inputs: vec![data.push(&a), data.push(&bv)],
                scalars: vec![(rows * cols) as i64, bl as i64],
                expected: data.push(&want),
                tol: 1e-6,
            });
        }
        specs.push(spec);
    }
    for (rows, d) in [(77usize, 576usize), (5, 4096)] {
        let eps = 1e-5f32;
        let spec = KernelSpec::RmsNorm { d, eps_bits: eps.to_bits() };
        let x = rand_vec(rows * d, -2.0, 2.0);
        let w = rand_vec(d, 0.5, 1.5);
        let ws: Weights = HashMap::from([("w".to_string(), (DType::F32, vec![d], w.iter().flat_map(|v| v.to_le_bytes()).collect()))]);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %w = weight : f32[{d}]\n  %y = rms_norm(%x, %w) {{eps = {eps:?}}} : f32[{rows}, {d}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![rows, d], x.clone()))], &ws)?;
        let (g, b) = grid(&spec.launch(), rows);
        cases.push(Case { name: format!("rms_norm {rows}x{d}"), kernel: spec.symbol(), grid: g, block: b, inputs: vec![data.push(&x), data.push(&w)], scalars: vec![rows as i64], expected: data.push(&want), tol: 1e-5 });
        specs.push(spec);
    }
    let m = compile_kernels(&specs, &GpuTarget::ALL)?;
    let mut ptx = BTreeMap::new();
    for (t, text) in &m.ptx {
        let f = format!("kernels.{}.ptx", t.name());
        std::fs::write(dir.join(&f), text)?;
        ptx.insert(t.name().to_string(), f);
    }
    std::fs::write(dir.join("kernels.mlir"), &m.mlir)?;
    std::fs::write(dir.join("kernels.ll"), &m.llvm)?;
    let bytes: Vec<u8> = data.0.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.join("data.bin"), bytes)?;
    let n = cases.len();
    std::fs::write(dir.join("bundle.json"), serde_json::to_string_pretty(&Bundle { ptx, cases })?)?;
    Ok(n)
}
