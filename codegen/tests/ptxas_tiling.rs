//! The batched-decode GEMV with several A tiles per block (DSC_GEMV_MMA_TILING=W,U,A, a
//! compile-time knob read when kernels are generated) passes ptxas without spills. Its own
//! test binary: the knob is a process environment variable.

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn batched_gemv_with_a_tiles_passes_ptxas() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    for tiling in ["8,4,2", "4,2,4"] {
        // SAFETY (of the env write): this binary has one test, nothing else reads the env here
        unsafe { std::env::set_var("DSC_GEMV_MMA_TILING", tiling) };
        let spec = KernelSpec::MatMulFew { k: 4096, n: 14336, wdtype: DType::BF16, bias: false, residual: true, rows: 32 };
        let a: u32 = tiling.rsplit(',').next().unwrap().parse().unwrap();
        assert!(matches!(spec.launch(), dsc_codegen::Launch::OutputsPerBlock { outputs, .. } if outputs == 16 * a));
        let m = compile_kernels(
            &[
                spec.clone(),
                KernelSpec::MatMulParts { inner: Box::new(KernelSpec::MatMulFew { k: 4096, n: 28672, wdtype: DType::BF16, bias: false, residual: false, rows: 32 }), parts: vec![14336, 14336] },
            ],
            &GpuTarget::ALL,
        )
        .unwrap();
        for (t, ptx) in &m.ptx {
            let f = dir.path().join(format!("{}-{tiling}.ptx", t.name()));
            std::fs::write(&f, ptx).unwrap();
            let (ok, log) = common::assemble(&ptxas, t.name(), &f);
            assert!(ok, "ptxas rejected {tiling} for {}:\n{log}", t.name());
            assert!(!log.contains("spill stores") || !log.lines().any(|l| l.contains("spill stores") && !l.contains("0 bytes spill stores")), "spills with {tiling}: {log}");
        }
    }
}
