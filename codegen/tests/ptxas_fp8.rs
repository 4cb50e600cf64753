//! The FP8 kernels (`KernelSpec::ActQuantF8`, `KernelSpec::MatMulF8`) pass ptxas for sm_90a
//! without spills and are what they claim: the quantizer converts with the e4m3 instructions
//! (no software rounding), the GEMM multiplies e4m3 on wgmma (k32, both operands from shared
//! memory), copies by cp.async, and promotes each K step's sums in f32 (an fma per accumulator).

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
mod common;

#[test]
fn fp8_quantizer_and_gemm_pass_ptxas_without_spills() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let quant = KernelSpec::ActQuantF8 { d: 4096, group: 128 };
    let gemms: Vec<KernelSpec> =
        [(4096usize, 4096usize, true, 128usize, 6usize), (14336, 4096, false, 64, 4)].iter().map(|&(k, n, residual, bn, stages)| KernelSpec::MatMulF8 { k, n, residual, bn, stages }).collect();
    let mut specs = vec![quant.clone()];
    specs.extend(gemms.iter().cloned());
    assert!(!quant.hopper_only() && gemms.iter().all(|s| s.hopper_only()), "the quantizer runs on every target, the GEMM on sm_90a");
    let m = compile_kernels(&specs, &GpuTarget::ALL, &Default::default()).unwrap();
    let logs = common::assemble_without_spills(&ptxas, &m, dir.path());
    for ptx in m.ptx.values() {
        let q = common::body(ptx, &quant.symbol());
        assert!(!q.contains("e4m3x2"), "the quantizer rounds as the CPU does, by integer ops (sm_80 has no FP8 instruction)");
        assert!(q.contains("div.rn.f32"), "x / s as the CPU executor divides (IEEE)");
    }
    let ptx = &m.ptx[&GpuTarget::Sm90a];
    for g in &gemms {
        let KernelSpec::MatMulF8 { bn, .. } = g else { unreachable!() };
        let body = common::body(ptx, &g.symbol());
        assert_eq!(body.matches(&format!("wgmma.mma_async.sync.aligned.m64n{bn}k32.f32.e4m3.e4m3")).count(), 4, "4 e4m3 wgmmas a K step in {}", g.symbol());
        assert!(body.contains("cp.async.cg.shared.global") && body.contains("cp.async.ca.shared.global"), "tiles and scales by cp.async in {}", g.symbol());
        assert!(body.matches("fma.rn.f32").count() >= bn / 2, "the promotion's fmas in {}", g.symbol());
        let sm90 = m.ptx.keys().position(|t| *t == GpuTarget::Sm90a).unwrap();
        let regs = common::registers(&logs[sm90], &g.symbol()).unwrap();
        eprintln!("{}: {regs} registers", g.symbol());
        assert!(regs <= 255, "{} uses {regs} registers", g.symbol());
    }
}
