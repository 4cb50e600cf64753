//! The wgmma prefill attention (`KernelSpec::FlashWgmma`, K/V tiles by TMA, the 8B layer's
//! shape) passes ptxas for sm_90a within the 168 registers of three blocks per SM, without
//! ptxas serializing its wgmma instructions (C7510-C7520 "wgmma.mma_async instructions are
//! serialized ...": a wgmma under a branch, registers an in-flight wgmma reads written before
//! its wait, or too few registers — each silently costs the overlap of the products with the
//! softmax), and carries the lazy rescale's ballot (`kernels::flash_lazy_threshold`).

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn the_wgmma_prefill_attention_passes_ptxas_unserialized() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let flash = KernelSpec::FlashAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: (1.0f32 / 128f32.sqrt()).to_bits(), kv: DType::BF16, warps: 4, mtiles: 1 };
    let spec = KernelSpec::FlashWgmma { inner: Box::new(flash) };
    let name = spec.symbol();
    assert!(name.ends_with("_wgt"), "{name}: K/V tiles by TMA expected for cache blocks of 16");
    let m = compile_kernels(std::slice::from_ref(&spec), &[GpuTarget::Sm90a], &Default::default()).unwrap();
    for (t, ptx) in &m.ptx {
        let f = dir.path().join(format!("{}.ptx", t.name()));
        std::fs::write(&f, ptx).unwrap();
        let (ok, log) = common::assemble(&ptxas, t.name(), &f);
        assert!(ok, "ptxas rejected {name}:\n{log}");
        assert!(!log.contains("instructions are serialized"), "ptxas serializes {name}'s wgmma:\n{log}");
        let regs = common::registers(&log, &name).unwrap_or_else(|| panic!("no register count for {name} in {log}"));
        assert!(regs <= 168, "{name} uses {regs} registers");
        let body = common::body(ptx, &name);
        assert!(body.contains("wgmma.mma_async"), "{name}: no wgmma");
        // (the lazy rescale: its threshold added to each of the thread's two rows' reference
        // max — 8.0 = 0f41000000 —, and its ballot beside the run scan's two)
        assert_eq!(body.matches("0f41000000").count(), 2, "{name}: the lazy rescale's threshold");
        assert_eq!(body.matches("vote.sync.ballot").count(), 3, "{name}: the lazy rescale's ballot");
    }
}
