//! The wide lm_head with the greedy argmax folded in (`KernelSpec::ArgmaxFold` over the
//! gathered, normalized `MatMulWide`: what a chained multi-step graph runs) passes ptxas on
//! both targets without spills, within the 168 registers of three blocks per SM, publishes its
//! block's partial with a GPU-scope fence before counting it, and the block counting last
//! writes the id and resets the counter; a GEMV with bias (or without the wide kernel) is
//! refused.

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn wide_gemv_with_the_argmax_passes_ptxas() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let wide = KernelSpec::MatMulWide { k: 576, n: 49152, wdtype: DType::BF16, bias: false, residual: false };
    let normed = KernelSpec::RowGather { inner: Box::new(KernelSpec::NormMatMul { inner: Box::new(wide.clone()), eps_bits: 1e-5f32.to_bits() }) };
    let specs = [KernelSpec::ArgmaxFold { inner: Box::new(normed) }, KernelSpec::ArgmaxFold { inner: Box::new(wide) }];
    let m = compile_kernels(&specs, &GpuTarget::ALL, &Default::default()).unwrap();
    let logs = common::assemble_without_spills(&ptxas, &m, dir.path());
    for ((t, ptx), log) in m.ptx.iter().zip(&logs) {
        for spec in &specs {
            let name = spec.symbol();
            assert!(name.ends_with("_argmax"), "{name}");
            let regs = common::registers(log, &name).unwrap_or_else(|| panic!("no register count for {name} in {log}"));
            assert!(regs <= 168, "{name} uses {regs} registers on {}", t.name());
            let body = common::body(ptx, &name);
            let fence = body.find("fence.acq_rel.gpu").expect("a GPU-scope fence");
            let count = body.find("atom.global.add.u32").expect("the block count");
            assert!(body.find("st.relaxed.gpu.global.v2").expect("the partial's store") < fence && fence < count, "{name}: partial, fence, count out of order on {}", t.name());
            assert!(body.contains("st.relaxed.gpu.global.u32"), "{name}: the counter is not reset on {}", t.name());
        }
    }
}

#[test]
fn the_argmax_folds_only_into_the_plain_wide_gemv() {
    for inner in
        [KernelSpec::MatMulWide { k: 576, n: 4096, wdtype: DType::BF16, bias: true, residual: false }, KernelSpec::MatMul { k: 576, n: 4096, wdtype: DType::BF16, bias: false, residual: false }]
    {
        let e = compile_kernels(&[KernelSpec::ArgmaxFold { inner: Box::new(inner.clone()) }], &GpuTarget::ALL, &Default::default()).err().unwrap_or_else(|| panic!("{} accepted", inner.symbol()));
        assert!(e.to_string().contains("argmax"), "{e}");
    }
}
