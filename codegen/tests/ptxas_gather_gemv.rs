//! The first layer's q/k/v GEMV taking x as a bf16 embedding row itself (`KernelSpec::GatherX`
//! under the zero fill; on by default, DSC_GATHER_GEMV=0 off) passes
//! ptxas on both targets without spills, reads the token id and the table row, and writes x.

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn gathered_x_gemv_passes_ptxas() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let mm = KernelSpec::MatMulParts { inner: Box::new(KernelSpec::MatMul { k: 576, n: 960, wdtype: DType::BF16, bias: false, residual: false }), parts: vec![192, 576, 192] };
    let norm = KernelSpec::NormMatMul { inner: Box::new(mm), eps_bits: 1e-5f32.to_bits() };
    let spec = KernelSpec::ZeroFill { inner: Box::new(KernelSpec::GatherX { inner: Box::new(norm) }), len: 576 };
    let m = compile_kernels(std::slice::from_ref(&spec), &GpuTarget::ALL, &Default::default()).unwrap();
    common::assemble_without_spills(&ptxas, &m, dir.path());
    for (t, ptx) in &m.ptx {
        let body = common::body(ptx, &spec.symbol());
        // (x's pieces stored as 16-byte f32 vectors by block 0; the zero fill's two stores)
        assert!(body.contains("st.global.v4.b32") || body.contains("st.global.v4.f32"), "no x written on {}", t.name());
        assert!(body.contains("ld.global.b32") || body.contains("ld.global.u32"), "no token id read on {}", t.name());
    }
}
