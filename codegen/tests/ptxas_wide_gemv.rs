//! The wide one-row GEMV (`KernelSpec::MatMulWide`, the small model's lm_head) passes ptxas on
//! both targets without spills, plain and with the final norm and the logits' row gather
//! folded in, keeps its registers to three blocks per SM (the grid's one wave on 132 SMs) and
//! loads its weights as 16-byte vectors.

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn wide_gemv_passes_ptxas() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let wide = KernelSpec::MatMulWide { k: 576, n: 49152, wdtype: DType::BF16, bias: false, residual: false };
    let normed = KernelSpec::RowGather { inner: Box::new(KernelSpec::NormMatMul { inner: Box::new(wide.clone()), eps_bits: 1e-5f32.to_bits() }) };
    let half = KernelSpec::MatMulWide { k: 768, n: 32768, wdtype: DType::F16, bias: true, residual: false };
    let specs = [wide, normed, half];
    let m = compile_kernels(&specs, &GpuTarget::ALL, &Default::default()).unwrap();
    let logs = common::assemble_without_spills(&ptxas, &m, dir.path());
    for ((t, ptx), log) in m.ptx.iter().zip(&logs) {
        for spec in &specs[..2] {
            let regs = common::registers(log, &spec.symbol()).unwrap_or_else(|| panic!("no register count for {} in {log}", spec.symbol()));
            println!("{} on {}: {regs} registers", spec.symbol(), t.name());
            assert!(regs <= 168, "{} uses {regs} registers on {}: fewer than 3 blocks of 128 threads per SM", spec.symbol(), t.name());
            let body = common::body(ptx, &spec.symbol());
            assert!(body.matches("ld.global.v4.b32").count() + body.matches("ld.global.v4.u32").count() >= 18, "weights not loaded as 16-byte vectors on {}", t.name());
        }
    }
}
