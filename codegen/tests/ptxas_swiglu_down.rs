//! The one-token MLP kernel (`KernelSpec::SwiGluDown`) and the o projection that seeds its
//! accumulator (`MatMulCopy`) pass ptxas for every target without spills; on sm_90a every
//! weight is loaded before `griddepcontrol.wait` (only x after it), and the down projection's
//! sums leave as reductions (`red.global.add`), not loads and stores of y.

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn one_token_mlp_passes_ptxas() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let eps_bits = 1e-5f32.to_bits();
    // the SmolLM2 shape (K 576: a partial last round of 16-byte pieces), and K 256; bf16 and
    // Q4_1 (the GGUF model's)
    let mlp = [
        KernelSpec::SwiGluDown { k: 576, f: 1536, n: 576, eps_bits, fb: 16, fpw: 2, wdtype: DType::BF16 },
        KernelSpec::SwiGluDown { k: 256, f: 64, n: 128, eps_bits, fb: 8, fpw: 2, wdtype: DType::BF16 },
        KernelSpec::SwiGluDown { k: 576, f: 1536, n: 576, eps_bits, fb: 16, fpw: 2, wdtype: DType::Q4_1 },
    ];
    let copy = KernelSpec::MatMulCopy { inner: Box::new(KernelSpec::MatMul { k: 576, n: 576, wdtype: DType::BF16, bias: false, residual: true }) };
    let specs: Vec<KernelSpec> = mlp.iter().cloned().chain([copy.clone()]).collect();
    let m = compile_kernels(&specs, &GpuTarget::ALL, &Default::default()).unwrap();
    common::assemble_without_spills(&ptxas, &m, dir.path());
    for (t, ptx) in &m.ptx {
        for spec in &mlp {
            let body = common::body(ptx, &spec.symbol());
            assert_eq!(body.matches("red.global.add.f32").count(), 4, "{}", spec.symbol());
            assert!(!body.contains("st.global"), "{}: stores y instead of adding into it", spec.symbol());
            if t.name() == "sm_90a" {
                let wait = body.find("griddepcontrol.wait").expect("a PDL wait");
                let after = body[wait..].matches("ld.global").count();
                // (x: two 16-byte loads per round of pieces)
                let rounds = if matches!(spec, KernelSpec::SwiGluDown { k: 576, .. }) { 3 } else { 1 };
                assert_eq!(after, 2 * rounds, "{}: loads after the wait", spec.symbol());
            }
        }
        // the copy: y and y2 stored
        assert_eq!(common::body(ptx, &copy.symbol()).matches("st.global").count(), 2);
    }
}
