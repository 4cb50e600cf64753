//! The DeepSeek families' kernels (`kernels::moe`, `kernels::mla`, YaRN's rope) pass ptxas for
//! every target without spills, on the real models' shapes (V2-Lite, V2, V3) and tiny ones whose
//! widths are no multiple of 8; what each must not do is checked in its PTX: the router and
//! the routed experts take no shared memory and no barrier (warp-level only), the latent
//! attention one barrier, and two MLA scales (or two YaRN factors) are two kernels.

use dsc_codegen::{compile_kernels, kernel_names, GpuTarget, KernelSpec};
use dsc_ir::{DType, MoeScoring, MoeSelect};
mod common;

fn specs() -> Vec<KernelSpec> {
    let route = |e, top_k, n_group, topk_group, scoring, select, normalize, scaling: f32| KernelSpec::MoeRoute {
        e,
        top_k,
        n_group,
        topk_group,
        scoring,
        select,
        normalize,
        scaling_bits: scaling.to_bits(),
        count: e == 256,
    };
    let mut v = vec![
        route(64, 6, 1, 1, MoeScoring::Softmax, MoeSelect::Greedy, false, 1.0),
        route(160, 6, 8, 3, MoeScoring::Softmax, MoeSelect::GroupMax, false, 16.0),
        route(256, 8, 8, 4, MoeScoring::Sigmoid, MoeSelect::NoauxTc, true, 2.5),
        route(8, 3, 4, 2, MoeScoring::Sigmoid, MoeSelect::NoauxTc, true, 2.5),
    ];
    for (d, inter, e, top_k, wdtype) in [(2048, 1408, 64, 6, DType::BF16), (7168, 2048, 256, 8, DType::BF16), (64, 32, 8, 3, DType::F32), (36, 20, 40, 3, DType::F16)] {
        v.push(KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared: 0, shared_first: false });
        v.push(KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual: false, shared: 0, shared_first: false });
        v.push(KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual: true, shared: 0, shared_first: false });
        // (the one-token shared-expert slots, V2-Lite's two and V3's one)
        if wdtype == DType::BF16 {
            let shared = if e == 64 { 2 } else { 1 };
            for shared_first in [false, true] {
                v.push(KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared, shared_first });
                v.push(KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual: true, shared, shared_first });
            }
        }
    }
    for (d, inter, e, top_k, wdtype) in [(2048, 1408, 64, 6, DType::BF16), (7168, 2048, 256, 8, DType::BF16), (128, 64, 10, 2, DType::F16)] {
        v.push(KernelSpec::MoeGateUpMma { d, inter, e, top_k, wdtype });
        v.push(KernelSpec::MoeDownMma { d, inter, e, top_k, wdtype });
    }
    v.push(KernelSpec::MoeCombine { d: 2048, e: 64, top_k: 6, residual: true });
    v.push(KernelSpec::MoeCombine { d: 36, e: 10, top_k: 3, residual: false });
    for (h, c, l, bs, kv) in [(16, 576, 512, 16, DType::BF16), (128, 576, 512, 64, DType::BF16), (4, 40, 32, 4, DType::F32)] {
        v.push(KernelSpec::MlaAttention { h, c, l, bs, scale_bits: 0.1352f32.to_bits(), kv });
    }
    for (h, k, n, wdtype) in [(16, 128, 512, DType::BF16), (16, 512, 128, DType::BF16), (1, 24, 96, DType::F32), (3, 20, 12, DType::F16)] {
        v.push(KernelSpec::HeadMatMul { h, k, n, wdtype });
    }
    for (h, k, n, wdtype) in [(16, 512, 128, DType::BF16), (128, 512, 128, DType::BF16), (3, 64, 40, DType::F16)] {
        v.push(KernelSpec::HeadMatMulMma { h, k, n, wdtype });
    }
    v.push(KernelSpec::MlaQueryMma { h: 16, nope: 128, r: 64, l: 512, wdtype: DType::BF16, theta_bits: 10000f32.to_bits(), interleaved: true, yarn: Some([40f32, 10.0, 23.0, 1.0].map(f32::to_bits)) });
    // (the latent row in one launch: V2-Lite's with YaRN into bf16, a tiny f32 one)
    v.push(KernelSpec::MlaLatentCache {
        l: 512,
        r: 64,
        eps_bits: 1e-6f32.to_bits(),
        theta_bits: 10000f32.to_bits(),
        interleaved: true,
        yarn: Some([40f32, 10.0, 23.0, 1.0].map(f32::to_bits)),
        kv: DType::BF16,
    });
    v.push(KernelSpec::MlaLatentCache { l: 40, r: 6, eps_bits: 1e-6f32.to_bits(), theta_bits: 10000f32.to_bits(), interleaved: false, yarn: None, kv: DType::F32 });
    v.push(KernelSpec::MlaQuery { h: 16, nope: 128, r: 64, l: 512, wdtype: DType::BF16, theta_bits: 10000f32.to_bits(), interleaved: true, yarn: Some([40f32, 10.0, 23.0, 1.0].map(f32::to_bits)) });
    v.push(KernelSpec::MlaQuery { h: 3, nope: 12, r: 6, l: 20, wdtype: DType::F32, theta_bits: 10000f32.to_bits(), interleaved: false, yarn: None });
    let yarn = |factor: f32| KernelSpec::RopeYarn {
        h: 16,
        d: 64,
        theta_bits: 10000f32.to_bits(),
        interleaved: true,
        factor_bits: factor.to_bits(),
        low_bits: 10f32.to_bits(),
        high_bits: 23f32.to_bits(),
        mscale_bits: 1f32.to_bits(),
    };
    v.push(yarn(40.0));
    v.push(yarn(4.0));
    v
}

#[test]
fn deepseek_kernels_pass_ptxas() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let specs = specs();
    let m = compile_kernels(&specs, &GpuTarget::ALL, &Default::default()).unwrap();
    assert_eq!(m.kernels.len(), specs.len(), "every spec its own kernel");
    common::assemble_without_spills(&ptxas, &m, dir.path());
    for ptx in m.ptx.values() {
        for s in &specs {
            let body = common::body(ptx, &s.symbol());
            match s {
                // (the 16-bit gate/up as the SwiGLU GEMV: its expert found by ballots, the warps' sums met in shared memory)
                KernelSpec::MoeGateUp { .. } if matches!(s.launch(), dsc_codegen::Launch::OutputsPerBlock { .. }) => {
                    assert!(body.contains("vote.sync.ballot") && body.contains("bar.sync") && body.contains("shfl.sync.bfly"), "{}: the GEMV on the slot's expert", s.symbol());
                }
                // (the grouped experts: tokens gathered by ballots and `fns`, tensor-core MMAs,
                // the warps' sums met in shared memory)
                KernelSpec::MoeGateUpMma { .. } | KernelSpec::MoeDownMma { .. } => {
                    for what in ["vote.sync.ballot", "fns.b32", "mma.sync.aligned.m16n8k16", "bar.sync"] {
                        assert!(body.contains(what), "{}: {what}", s.symbol());
                    }
                }
                // (the down projection: a warp per chosen expert, their dots met in shared memory
                // and summed in expert order; its weights' loads in flight before the FMAs)
                KernelSpec::MoeDown { .. } => {
                    assert!(body.contains("vote.sync.ballot") && body.matches("bar.sync").count() == 1 && body.contains("shfl.sync.bfly"), "{}: a warp per expert, one barrier", s.symbol());
                    assert!(body.contains(".maxntid") && body.contains(".minnctapersm"), "{}: launch bounds", s.symbol());
                }
                KernelSpec::MoeRoute { .. } | KernelSpec::MoeGateUp { .. } | KernelSpec::HeadMatMul { .. } => {
                    assert!(!body.contains("bar.sync") && !body.contains(".shared"), "{}: warp-level only", s.symbol());
                    assert!(body.contains("shfl.sync.bfly"), "{}: warp reductions", s.symbol());
                }
                KernelSpec::MlaAttention { .. } => {
                    assert_eq!(body.matches("bar.sync").count(), 1, "{}: one barrier before the warps' states meet", s.symbol());
                    assert!(body.contains("ex2.approx"), "{}", s.symbol());
                }
                _ => {}
            }
        }
        // the router's chosen experts found by ballots in the expert kernels
        assert!(common::body(ptx, &specs[4].symbol()).contains("vote.sync.ballot"));
    }
}

#[test]
fn mla_scale_and_yarn_factor_are_in_the_kernel_identity() {
    let a = KernelSpec::MlaAttention { h: 16, c: 576, l: 512, bs: 16, scale_bits: 0.1352f32.to_bits(), kv: DType::BF16 };
    let b = KernelSpec::MlaAttention { h: 16, c: 576, l: 512, bs: 16, scale_bits: 0.1353f32.to_bits(), kv: DType::BF16 };
    let names = kernel_names(&[a.clone(), b.clone()]);
    assert_eq!(names.len(), 2, "{names:?}");
    let s = specs();
    let (y40, y4) = (&s[s.len() - 2], &s[s.len() - 1]);
    assert_ne!(y40.symbol(), y4.symbol());
    // and the scale is in the code: the constant that scales q differs
    let m = compile_kernels(&[a.clone(), b.clone()], &[GpuTarget::Sm90a], &Default::default()).unwrap();
    let ptx = &m.ptx[&GpuTarget::Sm90a];
    assert_ne!(common::body(ptx, &a.symbol()).replace(&a.symbol(), ""), common::body(ptx, &b.symbol()).replace(&b.symbol(), ""));
}
