//! The split-K reduce + RMSNorm in thread-block clusters (a cluster of blocks per row, their
//! sums of squares exchanged through distributed shared memory) passes ptxas without spills
//! on sm_90a, loads its norm weights before `griddepcontrol.wait`, stores its block's sum into
//! the cluster's blocks (`mapa` + `st.shared::cluster`) before one cluster barrier, and reads
//! nothing from global memory after that barrier; no other target gets the kernel.

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
mod common;

#[test]
fn splitk_norm_in_clusters_passes_ptxas() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let eps_bits = 1e-5f32.to_bits();
    // the 8B shape's row (4096) over 2, 4 and 8 blocks; a narrower one with the f16 copy
    let specs = [
        KernelSpec::SplitKReduceNorm { splits: 4, residual: true, d: 4096, eps_bits, half: Some(false), cluster: 2 },
        KernelSpec::SplitKReduceNorm { splits: 4, residual: true, d: 4096, eps_bits, half: Some(false), cluster: 4 },
        KernelSpec::SplitKReduceNorm { splits: 4, residual: true, d: 4096, eps_bits, half: Some(false), cluster: 8 },
        KernelSpec::SplitKReduceNorm { splits: 2, residual: false, d: 1024, eps_bits, half: Some(true), cluster: 8 },
    ];
    let m = compile_kernels(&specs, &GpuTarget::ALL, &Default::default()).unwrap();
    common::assemble_without_spills(&ptxas, &m, dir.path());
    for (t, ptx) in &m.ptx {
        for spec in &specs {
            let name = spec.symbol();
            assert!(name.ends_with(&format!("_c{}", spec.cluster().unwrap())), "{name}: the cluster in the name");
            if t.name() != "sm_90a" {
                assert!(!ptx.contains(&format!(".entry {name}(")), "{name} in the {} PTX", t.name());
                continue;
            }
            let body = common::body(ptx, &name);
            let wait = body.find("griddepcontrol.wait").expect("a PDL wait");
            assert!(body.find("ld.global").expect("loads") < wait, "{name}: g is loaded after the wait");
            let remote = body.find("st.shared::cluster").expect("a store into the cluster's blocks");
            assert!(body.contains("mapa"), "{name}: no mapa");
            let barrier = body.find("barrier.cluster.wait").expect("the cluster barrier");
            assert!(remote < barrier, "{name}: the block sums are stored after the cluster barrier");
            assert!(!body[barrier..].contains("ld.global"), "{name}: a global load after the cluster barrier");
        }
    }
}

#[test]
fn splitk_norm_clusters_refuse_rows_they_cannot_split() {
    let eps_bits = 1e-5f32.to_bits();
    // d = 1000 is not a whole number of warps per block over 2 blocks
    let bad = KernelSpec::SplitKReduceNorm { splits: 2, residual: false, d: 1000, eps_bits, half: None, cluster: 2 };
    let e = compile_kernels(&[bad], &GpuTarget::ALL, &Default::default()).err().expect("refused");
    assert!(e.to_string().contains("clusters"), "{e}");
}
