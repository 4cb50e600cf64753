//! Kernel generators: each emits one `gpu.func` in MLIR text, specialised to its shapes
//! (the kernel cache keys on the spec, so identical layers share one kernel).
//!
//! Calling convention: global pointers (`!llvm.ptr<1>`) for tensors, in operand order, then
//! the output, then i64 scalars. [`Launch`] says how the runtime sizes the grid.

use dsc_ir::{BinaryOp, UnaryOp};
use std::fmt::Write;

/// How to size a launch from the runtime's element/row counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Launch {
    /// one thread per element: block `threads`, grid ceil(n / threads); scalar param `n`
    PerElement { threads: u32 },
    /// one warp per row, `rows_per_block` warps per block; scalar param `rows`
    WarpPerRow { rows_per_block: u32 },
}

/// A kernel to generate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KernelSpec {
    /// y[i] = op(x[i]), f32
    Unary(UnaryOpKey),
    /// y[i] = op(a[i], b[i % nb]), f32 (b broadcast over leading dims); params a, b, y, n, nb
    Binary(BinaryOpKey),
    /// y = x / sqrt(mean(x^2) + eps) * w over rows of `d`, f32
    RmsNorm { d: usize, eps_bits: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnaryOpKey(pub UnaryOp);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BinaryOpKey(pub BinaryOp);

impl KernelSpec {
    /// A stable, readable symbol name.
    pub fn symbol(&self) -> String {
        match self {
            KernelSpec::Unary(u) => format!("unary_{}_f32", dsc_ir::Op::Unary(u.0).name()),
            KernelSpec::Binary(b) => format!("binary_{}_f32", dsc_ir::Op::Binary(b.0).name()),
            KernelSpec::RmsNorm { d, .. } => format!("rms_norm_d{d}_f32"),
        }
    }
    pub fn launch(&self) -> Launch {
        match self {
            KernelSpec::Unary(_) | KernelSpec::Binary(_) => Launch::PerElement { threads: 256 },
            KernelSpec::RmsNorm { .. } => Launch::WarpPerRow { rows_per_block: 4 },
        }
    }
}

/// SSA name generator and body buffer.
struct Body {
    s: String,
    n: usize,
}

impl Body {
    fn v(&mut self) -> String {
        self.n += 1;
        format!("%v{}", self.n)
    }
    fn op(&mut self, rhs: &str) -> String {
        let v = self.v();
        let _ = writeln!(self.s, "        {v} = {rhs}");
        v
    }
    fn line(&mut self, l: &str) {
        let _ = writeln!(self.s, "        {l}");
    }
    fn cf32(&mut self, x: f32) -> String {
        // hex form: exact, and always a valid MLIR float literal
        self.op(&format!("arith.constant 0x{:08X} : f32", x.to_bits()))
    }
    fn asm1(&mut self, ins: &str, x: &str) -> String {
        self.op(&format!("llvm.inline_asm \"{ins} $0, $1;\", \"=f,f\" {x} : (f32) -> f32"))
    }
    fn exp(&mut self, x: &str) -> String {
        let l2e = self.cf32(std::f32::consts::LOG2_E);
        let t = self.op(&format!("arith.mulf {x}, {l2e} : f32"));
        self.asm1("ex2.approx.ftz.f32", &t)
    }
    fn sigmoid(&mut self, x: &str) -> String {
        let nx = self.op(&format!("arith.negf {x} : f32"));
        let e = self.exp(&nx);
        let one = self.cf32(1.0);
        let d = self.op(&format!("arith.addf {one}, {e} : f32"));
        self.op(&format!("arith.divf {one}, {d} : f32"))
    }
    fn load(&mut self, ptr: &str, idx: &str) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        self.op(&format!("llvm.load {p} : !llvm.ptr<1> -> f32"))
    }
    fn store(&mut self, val: &str, ptr: &str, idx: &str) {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        self.line(&format!("llvm.store {val}, {p} : f32, !llvm.ptr<1>"));
    }
    /// global thread index as i64
    fn gid(&mut self) -> String {
        let b = self.op("gpu.block_id x");
        let d = self.op("gpu.block_dim x");
        let t = self.op("gpu.thread_id x");
        let m = self.op(&format!("arith.muli {b}, {d} : index"));
        let i = self.op(&format!("arith.addi {m}, {t} : index"));
        self.op(&format!("arith.index_cast {i} : index to i64"))
    }
}

fn unary_expr(b: &mut Body, u: UnaryOp, x: &str) -> Result<String, String> {
    Ok(match u {
        UnaryOp::Neg => b.op(&format!("arith.negf {x} : f32")),
        UnaryOp::Exp => b.exp(x),
        UnaryOp::Sqrt => b.asm1("sqrt.rn.f32", x),
        UnaryOp::Rsqrt => b.asm1("rsqrt.approx.ftz.f32", x),
        UnaryOp::Recip => {
            let one = b.cf32(1.0);
            b.op(&format!("arith.divf {one}, {x} : f32"))
        }
        UnaryOp::Tanh => b.asm1("tanh.approx.f32", x),
        UnaryOp::Sigmoid => b.sigmoid(x),
        UnaryOp::Relu => {
            let z = b.cf32(0.0);
            b.op(&format!("arith.maximumf {x}, {z} : f32"))
        }
        UnaryOp::Silu => {
            let s = b.sigmoid(x);
            b.op(&format!("arith.mulf {x}, {s} : f32"))
        }
        UnaryOp::Gelu => {
            // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            let x2 = b.op(&format!("arith.mulf {x}, {x} : f32"));
            let x3 = b.op(&format!("arith.mulf {x2}, {x} : f32"));
            let c = b.cf32(0.044715);
            let t = b.op(&format!("arith.mulf {x3}, {c} : f32"));
            let u = b.op(&format!("arith.addf {x}, {t} : f32"));
            let k = b.cf32(0.797_884_6);
            let v = b.op(&format!("arith.mulf {u}, {k} : f32"));
            let th = b.asm1("tanh.approx.f32", &v);
            let one = b.cf32(1.0);
            let w = b.op(&format!("arith.addf {one}, {th} : f32"));
            let half = b.cf32(0.5);
            let hx = b.op(&format!("arith.mulf {x}, {half} : f32"));
            b.op(&format!("arith.mulf {hx}, {w} : f32"))
        }
        UnaryOp::GeluErf => return Err("gelu_erf has no GPU lowering yet".into()),
    })
}

/// The MLIR text of one kernel (a `gpu.func`), or why it cannot be generated.
pub fn emit(spec: &KernelSpec) -> Result<String, String> {
    let name = spec.symbol();
    let mut b = Body { s: String::new(), n: 0 };
    let params = match spec {
        KernelSpec::Unary(u) => {
            let i = b.gid();
            let ok = b.op(&format!("arith.cmpi slt, {i}, %n : i64"));
            b.line(&format!("scf.if {ok} {{"));
            let x = b.load("%x", &i);
            let y = unary_expr(&mut b, u.0, &x)?;
            b.store(&y, "%y", &i);
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64"
        }
        KernelSpec::Binary(op) => {
            let i = b.gid();
            let ok = b.op(&format!("arith.cmpi slt, {i}, %n : i64"));
            b.line(&format!("scf.if {ok} {{"));
            let j = b.op(&format!("arith.remui {i}, %nb : i64"));
            let x = b.load("%a", &i);
            let y = b.load("%b", &j);
            let f = match op.0 {
                BinaryOp::Add => "arith.addf",
                BinaryOp::Sub => "arith.subf",
                BinaryOp::Mul => "arith.mulf",
                BinaryOp::Div => "arith.divf",
                BinaryOp::Max => "arith.maximumf",
                BinaryOp::Min => "arith.minimumf",
            };
            let z = b.op(&format!("{f} {x}, {y} : f32"));
            b.store(&z, "%y", &i);
            b.line("}");
            "%a: !llvm.ptr<1>, %b: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %nb: i64"
        }
        KernelSpec::RmsNorm { d, eps_bits } => {
            let eps = f32::from_bits(*eps_bits);
            let t = b.op("gpu.thread_id x");
            let blk = b.op("gpu.block_id x");
            let c32 = b.op("arith.constant 32 : index");
            let lane = b.op(&format!("arith.remui {t}, {c32} : index"));
            let warp = b.op(&format!("arith.divui {t}, {c32} : index"));
            let Launch::WarpPerRow { rows_per_block } = spec.launch() else { unreachable!() };
            let rpb = b.op(&format!("arith.constant {rows_per_block} : index"));
            let r0 = b.op(&format!("arith.muli {blk}, {rpb} : index"));
            let row = b.op(&format!("arith.addi {r0}, {warp} : index"));
            let rowi = b.op(&format!("arith.index_cast {row} : index to i64"));
            let ok = b.op(&format!("arith.cmpi slt, {rowi}, %rows : i64"));
            b.line(&format!("scf.if {ok} {{"));
            let dd = b.op(&format!("arith.constant {d} : index"));
            let base = b.op(&format!("arith.muli {row}, {dd} : index"));
            let zero = b.cf32(0.0);
            let acc = b.v();
            let (iv, a) = (b.v(), b.v());
            b.line(&format!("{acc} = scf.for {iv} = {lane} to {dd} step {c32} iter_args({a} = {zero}) -> (f32) {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let x = b.load("%x", &idx);
            let sq = b.op(&format!("arith.mulf {x}, {x} : f32"));
            let a2 = b.op(&format!("arith.addf {a}, {sq} : f32"));
            b.line(&format!("scf.yield {a2} : f32"));
            b.line("}");
            let w32 = b.op("arith.constant 32 : i32");
            let mut total = acc;
            for off in [16, 8, 4, 2, 1] {
                let o = b.op(&format!("arith.constant {off} : i32"));
                let (sh, _valid) = (b.v(), b.v());
                b.line(&format!("{sh}, {_valid} = gpu.shuffle xor {total}, {o}, {w32} : f32"));
                total = b.op(&format!("arith.addf {total}, {sh} : f32"));
            }
            let df = b.cf32(*d as f32);
            let mean = b.op(&format!("arith.divf {total}, {df} : f32"));
            let e = b.cf32(eps);
            let me = b.op(&format!("arith.addf {mean}, {e} : f32"));
            let sd = b.asm1("sqrt.rn.f32", &me);
            let one = b.cf32(1.0);
            let inv = b.op(&format!("arith.divf {one}, {sd} : f32"));
            let iv2 = b.v();
            b.line(&format!("scf.for {iv2} = {lane} to {dd} step {c32} {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv2} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let wi = b.op(&format!("arith.index_cast {iv2} : index to i64"));
            let x = b.load("%x", &idx);
            let w = b.load("%w", &wi);
            let xn = b.op(&format!("arith.mulf {x}, {inv} : f32"));
            let y = b.op(&format!("arith.mulf {xn}, {w} : f32"));
            b.store(&y, "%y", &idx);
            b.line("}");
            b.line("}");
            "%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64"
        }
    };
    Ok(format!("    gpu.func @{name}({params}) kernel {{\n{}        gpu.return\n    }}\n", b.s))
}

/// Wrap kernels in the module the pass pipeline expects.
pub fn module(funcs: &[String]) -> String {
    format!("module attributes {{gpu.container_module}} {{\n  gpu.module @kernels {{\n{}  }}\n}}\n", funcs.concat())
}
