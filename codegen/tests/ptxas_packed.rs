//! The packed GEMV on the tensor cores (`KernelSpec::MatMulPacked`, dsc's i4g128 and f8g128
//! weights) at each of its tilings passes ptxas on both targets without spills, and is what it
//! claims to be: the products on `mma.sync` (bf16 for int4, f16 for fp8), the weights turned
//! into 16-bit pairs by `lop3` (no conversion instruction per weight), read in 16-byte loads;
//! one row stages x in shared memory (with the RMSNorm folded in under `NormMatMul`). GGUF Q4_K
//! through its one-row form likewise.

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn int4_gemv_passes_ptxas_without_spills() {
    packed_gemv_passes_ptxas_without_spills(DType::I4G128);
}

#[test]
fn fp8_gemv_passes_ptxas_without_spills() {
    packed_gemv_passes_ptxas_without_spills(DType::F8G128);
}

fn packed_gemv_passes_ptxas_without_spills(wdtype: DType) {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let f8 = wdtype == DType::F8G128;
    let mut specs: Vec<KernelSpec> =
        [(0usize, false), (1, true), (2, false)].iter().map(|&(tiles, res)| KernelSpec::MatMulPacked { wdtype, k: 14336, n: 4096, tiles, walk: 1, bias: false, residual: res }).collect();
    // (one row with the RMSNorm folded into x's staging, merged q/k/v parts)
    let qkv = KernelSpec::MatMulParts { inner: Box::new(KernelSpec::MatMulPacked { wdtype, k: 4096, n: 6144, tiles: 0, walk: 1, bias: false, residual: false }), parts: vec![4096, 1024, 1024] };
    specs.push(KernelSpec::NormMatMul { inner: Box::new(qkv), eps_bits: 1e-5f32.to_bits() });
    let m = compile_kernels(&specs, &GpuTarget::ALL, &Default::default()).unwrap();
    common::assemble_without_spills(&ptxas, &m, dir.path());
    for (t, ptx) in &m.ptx {
        for spec in &specs {
            let body = common::body(ptx, &spec.symbol());
            let ty = if f8 { "f16" } else { "bf16" };
            assert!(body.contains(&format!("mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32")), "no {ty} mma in {} on {}", spec.symbol(), t.name());
            let magic = if f8 { "0x3F803F80" } else { "0x43004300" };
            assert!(body.contains("lop3.b32") && body.contains(magic), "no lop3 unpacking ({magic}) in {}", spec.symbol());
            assert!(!body.contains("cvt.rn.f16x2.e4m3x2"), "an FP8 conversion instruction (sm_89+) in {}", spec.symbol());
            assert!(body.contains("ld.global.v4.u32") || body.contains("ld.global.v4.b32"), "no 16-byte weight loads in {}", spec.symbol());
            assert!(!body.contains("cvt.rn.f32.u32") && !body.contains("cvt.rn.f32.s32"), "an int-to-float conversion per weight in {}", spec.symbol());
            let staged = matches!(spec, KernelSpec::MatMulPacked { tiles: 0, .. } | KernelSpec::NormMatMul { .. });
            assert_eq!(body.contains("st.shared.v4"), staged, "x staged in shared memory exactly for one row: {}", spec.symbol());
            // (one row: ptxas told 256 threads and two blocks an SM, so it keeps the next
            // round's loads ahead of the math instead of sinking them to the loop's end)
            let head = &ptx[ptx.find(&format!(".entry {}(", spec.symbol())).unwrap()..];
            let head = &head[..head.find('{').unwrap()];
            assert_eq!(head.contains(".maxntid 256, 1, 1") && head.contains(".minnctapersm 2"), staged, "launch bounds of {}: {head}", spec.symbol());
        }
    }
}

/// GGUF's Q4_K through the packed GEMV's one-row form: ptxas without spills on both targets
/// (the 8B shape's down projection: K = 14,336, seven steps a warp; its lm_head walking 31
/// tiles a block; its q/k/v with the norm folded in, 2 tiles a block within the merged parts;
/// its gate/up with the SwiGLU epilogue), f16 MMAs on weights made f16 pairs by `lop3` /
/// `fma.rn.f16x2` (no int-to-float conversion per weight), 16-byte loads, x staged in shared
/// memory.
#[test]
fn q4_k_gemv_passes_ptxas_without_spills() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let wdtype = DType::Q4_K;
    let mut specs = vec![
        KernelSpec::MatMulPacked { wdtype, k: 14336, n: 4096, tiles: 0, walk: 1, bias: false, residual: true },
        KernelSpec::MatMulPacked { wdtype, k: 4096, n: 128256, tiles: 0, walk: 31, bias: false, residual: false },
    ];
    let qkv = KernelSpec::MatMulParts { inner: Box::new(KernelSpec::MatMulPacked { wdtype, k: 4096, n: 6144, tiles: 0, walk: 2, bias: false, residual: false }), parts: vec![4096, 1024, 1024] };
    specs.push(KernelSpec::NormMatMul { inner: Box::new(qkv), eps_bits: 1e-5f32.to_bits() });
    // (the merged gate/up with the SwiGLU epilogue)
    specs.push(KernelSpec::SwiGluGemv { k: 4096, f: 14336, wdtype });
    let m = compile_kernels(&specs, &GpuTarget::ALL, &Default::default()).unwrap();
    common::assemble_without_spills(&ptxas, &m, dir.path());
    for (t, ptx) in &m.ptx {
        for spec in &specs {
            let body = common::body(ptx, &spec.symbol());
            assert!(body.contains("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"), "no f16 mma in {} on {}", spec.symbol(), t.name());
            assert!(body.contains("lop3.b32") && body.contains("0x64006400") && body.contains("fma.rn.f16x2"), "no lop3 / fma.rn.f16x2 unpacking in {}", spec.symbol());
            assert!(body.contains("ld.global.v4.u32") || body.contains("ld.global.v4.b32"), "no 16-byte weight loads in {}", spec.symbol());
            assert!(!body.contains("cvt.rn.f32.u32") && !body.contains("cvt.rn.f32.s32"), "an int-to-float conversion per weight in {}", spec.symbol());
            assert!(body.contains("st.shared.v4"), "x not staged in shared memory: {}", spec.symbol());
        }
    }
}
