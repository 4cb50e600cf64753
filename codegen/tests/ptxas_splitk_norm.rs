//! The split-K reduce + RMSNorm kernel with each thread's piece kept in registers
//! (`KernelOptions::splitk_norm_regs`; prepared for the H200) passes ptxas without spills,
//! loads its norm weights before `griddepcontrol.wait` and reads nothing from global memory
//! after its block barrier.

use dsc_codegen::{compile_kernels, GpuTarget, KernelOptions, KernelSpec};
mod common;

#[test]
fn splitk_norm_in_registers_passes_ptxas() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let o = KernelOptions { splitk_norm_regs: true, ..Default::default() };
    let eps_bits = 1e-5f32.to_bits();
    // d = 4096: a piece per thread of the 32-warp block; d = 1000: threads past 250 idle
    let specs = [
        KernelSpec::SplitKReduceNorm { splits: 4, residual: true, d: 4096, eps_bits, half: Some(false), cluster: 1 },
        KernelSpec::SplitKReduceNorm { splits: 2, residual: false, d: 1000, eps_bits, half: None, cluster: 1 },
    ];
    let m = compile_kernels(&specs, &GpuTarget::ALL, &o).unwrap();
    common::assemble_without_spills(&ptxas, &m, dir.path());
    for (t, ptx) in &m.ptx {
        // the sm_90a kernels wait for the kernel before (PDL): g's load comes first, and after
        // the block barrier only stores touch global memory
        if t.name() == "sm_90a" {
            for spec in &specs {
                let name = m.symbol_of(spec).expect("compiled").to_string();
                assert!(name.ends_with(&format!("_x{:08x}", o.hash())), "{name}");
                let body = common::body(ptx, &name);
                let wait = body.find("griddepcontrol.wait").expect("a PDL wait");
                let first_load = body.find("ld.global").expect("loads");
                assert!(first_load < wait, "{name}: g is loaded after the wait");
                let barrier = body.find("bar.sync").expect("the block barrier");
                assert!(!body[barrier..].contains("ld.global"), "{name}: a global load after the barrier");
            }
        }
    }
}
