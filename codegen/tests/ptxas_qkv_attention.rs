//! The one-token attention that computes its own q, k and v (`KernelSpec::QkvAttentionO`, the
//! SmolLM2 shape's layer from its second on) and the fused MLP that zeroes its accumulators
//! (`ZeroFill` over `SwiGluDown`) pass ptxas: on sm_90a without spills, every weight row
//! (W_q/W_k/W_v, W_o) and the first K/V rows loaded before `griddepcontrol.wait`, q/k/v shared
//! through distributed shared memory and a cluster barrier, the keys split over the cluster's
//! blocks (their partial states shared past a second barrier); on sm_80 (no clusters: every
//! block computes its head's q, k and v and takes every key) no cluster instruction.

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn one_token_attention_with_qkv_passes_ptxas() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let eps_bits = 1e-5f32.to_bits();
    let att = KernelSpec::PagedAttention { h: 9, kvh: 3, d: 64, bs: 16, scale_bits: 0.125f32.to_bits(), warps: 16, keys: 4, group: 1, kv: DType::BF16 };
    let rope = KernelSpec::RopeAttention { inner: Box::new(att), theta_bits: 100000f32.to_bits(), interleaved: false };
    // (bf16 weights, and Q4_1 as the GGUF plans')
    for wdtype in [DType::BF16, DType::Q4_1] {
        let o = KernelSpec::AttentionO { inner: Box::new(rope.clone()), n: 576, red: true, splits: 4, wdtype };
        let fused = KernelSpec::QkvAttentionO { inner: Box::new(o), k: 576, eps_bits, cluster: 4, wdtype };
        let mlp = KernelSpec::ZeroFill { inner: Box::new(KernelSpec::SwiGluDown { k: 576, f: 1536, n: 576, eps_bits, fb: 16, fpw: 2, wdtype }), len: 576 };
        assert_eq!(fused.cluster(), Some(4));
        assert_eq!(mlp.cluster(), None);
        let m = compile_kernels(&[fused.clone(), mlp.clone()], &GpuTarget::ALL, &Default::default()).unwrap();
        for (t, ptx) in &m.ptx {
            let f = dir.path().join(format!("{}-{wdtype}.ptx", t.name()));
            std::fs::write(&f, ptx).unwrap();
            let (ok, log) = common::assemble(&ptxas, t.name(), &f);
            assert!(ok, "ptxas rejected the kernels for {}:\n{log}", t.name());
            let body = common::body(ptx, &fused.symbol());
            if t.name() == "sm_90a" {
                assert!(log.lines().filter(|l| l.contains("spill stores")).all(|l| l.contains("0 bytes spill stores")), "spills: {log}");
                let wait = body.find("griddepcontrol.wait").expect("a PDL wait");
                // (3 rows x 3 rounds of 16-byte W_q/W_k/W_v pieces, 8 of W_o, 8 K/V words; Q4_1:
                // two words a piece, W_o's 10)
                assert!(body[..wait].matches("ld.global").count() >= 25, "weights after the wait:\n{}", &body[..wait]);
                for ins in ["mapa.shared::cluster", "st.shared::cluster.f32", "barrier.cluster.arrive.release", "barrier.cluster.wait.acquire"] {
                    assert!(body.contains(ins), "{ins} missing");
                }
                // (two cluster barriers: q/k/v shared, then the blocks' partial softmax states —
                // the cluster's blocks split the keys)
                assert_eq!(body.matches("barrier.cluster.wait.acquire").count(), 2);
            } else {
                assert!(!body.contains("cluster"), "a cluster instruction on {}", t.name());
            }
            // the MLP zeroes both accumulators (and adds its sums into y)
            let mb = common::body(ptx, &mlp.symbol());
            assert_eq!(mb.matches("st.global").count(), 2);
            assert_eq!(mb.matches("red.global.add.f32").count(), 4);
        }
    }
}
