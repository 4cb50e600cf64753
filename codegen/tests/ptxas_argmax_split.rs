//! The greedy argmax over several blocks per row (`KernelSpec::ArgmaxSplit`, what the runtime
//! launches after a decode step for SmolLM2's and Llama 3's vocabularies) passes ptxas on
//! both targets without spills: every block's partial stored and counted at GPU scope, the
//! last block reading the partials past a fence and resetting its row's counter; and the
//! embedding gather that zeroes a first fused layer's accumulators (`ZeroFill` over `Gather`,
//! DSC_QKV_ATTN_L0=1) writes its row and both accumulators; the argmax in a thread-block
//! cluster per row (`ArgmaxCluster`, sm_90a only) shares its blocks' partials through
//! distributed shared memory and one cluster barrier.

use dsc_codegen::kernels::{argmax_splits, ARGMAX_CLUSTER_BLOCKS, ARGMAX_SPLIT_PIECES};
use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn split_argmax_covers_the_vocabularies_and_passes_ptxas() {
    // (SmolLM2: 49152 logits = 12288 pieces, 24 blocks; Llama 3: 128256 = 32064 pieces, 63)
    assert_eq!(argmax_splits(49152), Some(24));
    assert_eq!(argmax_splits(128256), Some(63));
    // (a row one block covers, or a width not a multiple of 4: the block-per-row kernel)
    assert_eq!(argmax_splits(4 * ARGMAX_SPLIT_PIECES), None);
    assert_eq!(argmax_splits(1001), None);
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let specs: Vec<KernelSpec> = [49152usize, 128256].iter().map(|&d| KernelSpec::ArgmaxSplit { d, splits: argmax_splits(d).unwrap() }).collect();
    let zf = KernelSpec::ZeroFill { inner: Box::new(KernelSpec::Gather { d: 576, dtype: DType::BF16 }), len: 576 };
    let cl = KernelSpec::ArgmaxCluster { d: 49152, blocks: ARGMAX_CLUSTER_BLOCKS };
    assert!(cl.hopper_only());
    let mut all = specs.clone();
    all.push(zf.clone());
    all.push(cl.clone());
    let m = compile_kernels(&all, &GpuTarget::ALL, &Default::default()).unwrap();
    common::assemble_without_spills(&ptxas, &m, dir.path());
    for (t, ptx) in &m.ptx {
        for s in &specs {
            let body = common::body(ptx, &s.symbol());
            for ins in ["st.relaxed.gpu.global.v2.b32", "fence.acq_rel.gpu", "atom.global.add.u32", "ld.relaxed.gpu.global.v2.b32", "st.relaxed.gpu.global.u32"] {
                assert!(body.contains(ins), "{}: {ins} missing on {}", s.symbol(), t.name());
            }
        }
        // the cluster argmax (sm_90a only): partials into block 0's shared memory, one barrier
        if t.name() == "sm_90a" {
            let body = common::body(ptx, &cl.symbol());
            for ins in ["mapa.shared::cluster", "st.shared::cluster.f32", "barrier.cluster.arrive.release", "barrier.cluster.wait.acquire"] {
                assert!(body.contains(ins), "{ins} missing");
            }
            assert!(!body.contains("atom.global"), "the cluster argmax needs no counter");
        } else {
            assert!(!ptx.contains(&cl.symbol()), "a Hopper-only kernel on {}", t.name());
        }
        // the gather's row and the two accumulators' zeros
        assert_eq!(common::body(ptx, &zf.symbol()).matches("st.global").count(), 3, "{}", t.name());
    }
}
