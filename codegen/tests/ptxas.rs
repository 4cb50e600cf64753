//! Every kernel the generator knows goes MLIR → LLVM → PTX for sm_90a and sm_80, and ptxas
//! (PyPI nvidia-cuda-nvcc; `$DSC_PTXAS` or found through python3) accepts it. No GPU needed.

use dsc_codegen::kernels::{BinaryOpKey, UnaryOpKey};
use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::{BinaryOp, DType, UnaryOp};
use std::path::PathBuf;
use std::process::Command;

fn ptxas() -> PathBuf {
    if let Some(p) = std::env::var_os("DSC_PTXAS") {
        return p.into();
    }
    let out = Command::new("python3").args(["-c", "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin', 'ptxas'))"]).output().expect("python3 runs");
    let p = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    assert!(p.exists(), "ptxas not found: `pip install nvidia-cuda-nvcc==13.0.88` (or set DSC_PTXAS)");
    p
}

pub fn all_specs() -> Vec<KernelSpec> {
    let mut v: Vec<KernelSpec> =
        [UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Sqrt, UnaryOp::Rsqrt, UnaryOp::Recip, UnaryOp::Tanh, UnaryOp::Sigmoid, UnaryOp::Relu, UnaryOp::Silu, UnaryOp::Gelu, UnaryOp::GeluErf]
            .into_iter()
            .map(|u| KernelSpec::Unary(UnaryOpKey(u)))
            .collect();
    v.extend([BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div, BinaryOp::Max, BinaryOp::Min, BinaryOp::SiluMul].into_iter().map(|b| KernelSpec::Binary(BinaryOpKey(b))));
    v.push(KernelSpec::RmsNorm { d: 576, eps_bits: 1e-5f32.to_bits() });
    for wdtype in [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        v.push(KernelSpec::MatMul { k: 576, n: 1536, wdtype, bias: false, residual: false });
        v.push(KernelSpec::Gather { d: 576, dtype: wdtype });
    }
    v.push(KernelSpec::MatMul { k: 576, n: 192, wdtype: DType::BF16, bias: true, residual: false });
    // the 8B shape's GEMVs
    v.push(KernelSpec::MatMul { k: 4096, n: 14336, wdtype: DType::BF16, bias: false, residual: false });
    v.push(KernelSpec::MatMul { k: 14336, n: 4096, wdtype: DType::Q4_1, bias: false, residual: false });
    for wdtype in [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        v.push(KernelSpec::MatMulMma { k: 576, n: 1536, wdtype, bias: false, residual: false });
    }
    v.push(KernelSpec::MatMulMma { k: 576, n: 192, wdtype: DType::BF16, bias: true, residual: false });
    // the residual add as the epilogue
    v.push(KernelSpec::MatMul { k: 576, n: 192, wdtype: DType::BF16, bias: true, residual: true });
    // the batched-decode GEMV: every plain weight format, the 8B shape, bias + residual
    for wdtype in [DType::F32, DType::F16, DType::BF16] {
        v.push(KernelSpec::MatMulFew { k: 576, n: 1536, wdtype, bias: false, residual: false, rows: dsc_codegen::kernels::few_rows(wdtype) });
    }
    v.push(KernelSpec::MatMulFew { k: 14336, n: 4096, wdtype: DType::BF16, bias: true, residual: true, rows: 32 });
    v.push(KernelSpec::MatMulMma { k: 576, n: 192, wdtype: DType::Q4_1, bias: false, residual: true });
    v.push(KernelSpec::MatMulWgmma { k: 576, n: 192, wdtype: DType::BF16, bias: true, residual: true, n_tile: 64 });
    for wdtype in [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        for n_tile in [16, 64] {
            v.push(KernelSpec::MatMulWgmma { k: 576, n: 1536, wdtype, bias: false, residual: false, n_tile });
        }
    }
    v.push(KernelSpec::MatMulWgmma { k: 576, n: 192, wdtype: DType::BF16, bias: true, residual: false, n_tile: 16 });
    // the pipelined prefill matmul: both default tilings (x in 16 bits), x in f32 with and
    // without overlap, f16 weights, bias + residual, merged parts; and the cast before it
    // (and the 64-row tiles of batched decode)
    for (bn, stages, overlap, a16, bm) in
        [(128, 6, true, true, 128), (256, 4, true, true, 128), (128, 4, true, false, 128), (256, 3, false, false, 128), (128, 8, true, true, 64), (256, 5, true, true, 64), (64, 8, true, true, 64)]
    {
        for wdtype in [DType::BF16, DType::F16] {
            v.push(KernelSpec::MatMulPipe { k: 4096, n: 6144, wdtype, bias: false, residual: true, bn, stages, overlap, a16, bm });
        }
        v.push(KernelSpec::MatMulPipe { k: 576, n: 1536, wdtype: DType::BF16, bias: true, residual: false, bn, stages, overlap, a16, bm });
        v.push(KernelSpec::MatMulParts {
            inner: Box::new(KernelSpec::MatMulPipe { k: 4096, n: 6144, wdtype: DType::BF16, bias: false, residual: false, bn, stages, overlap, a16, bm }),
            parts: vec![1024, 4096, 1024],
        });
    }
    // 224-wide 64-row tiles (the 8B shape's gate/up at 16-64 rows: 128 tiles for 132 SMs)
    {
        let t = dsc_codegen::kernels::pipe64_tiling(28672);
        assert_eq!(t.bn, 224);
        let pipe = KernelSpec::MatMulPipe { k: 4096, n: 28672, wdtype: DType::BF16, bias: false, residual: false, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: true, bm: 64 };
        v.push(pipe.clone());
        v.push(KernelSpec::MatMulParts { inner: Box::new(pipe), parts: vec![14336, 14336] });
    }
    // split-K over the 64-row tiles (DSC_SPLIT_K: the 8B shape's o and down projections) and
    // its reduce pass
    for (k, sk) in [(4096usize, 4usize), (14336, 4), (4096, 2)] {
        let inner = KernelSpec::MatMulPipe { k, n: 4096, wdtype: DType::BF16, bias: false, residual: false, bn: 128, stages: 8, overlap: true, a16: true, bm: 64 };
        v.push(KernelSpec::SplitK { inner: Box::new(inner), splits: sk });
    }
    v.push(KernelSpec::SplitKReduce { splits: 4, residual: true });
    v.push(KernelSpec::SplitKReduce { splits: 2, residual: false });
    v.push(KernelSpec::FlashAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), kv: DType::F32, warps: 4, mtiles: 1 });
    v.push(KernelSpec::FlashAttention { h: 9, kvh: 3, d: 64, bs: 16, scale_bits: 0.125f32.to_bits(), kv: DType::F32, warps: 4, mtiles: 1 });
    v.push(KernelSpec::SwiGluGemv { k: 4096, f: 14336, wdtype: DType::BF16 });
    // the bias + activation epilogue (matmul_act) over the GEMV, a packed GEMV and the pipelined matmul
    for (inner, act) in [
        (KernelSpec::MatMul { k: 768, n: 3072, wdtype: DType::BF16, bias: true, residual: false }, UnaryOp::Gelu),
        (KernelSpec::MatMul { k: 768, n: 3072, wdtype: DType::Q8_0, bias: true, residual: false }, UnaryOp::GeluErf),
        (KernelSpec::MatMulPipe { k: 768, n: 3072, wdtype: DType::BF16, bias: true, residual: false, bn: 128, stages: 6, overlap: true, a16: true, bm: 128 }, UnaryOp::Relu),
    ] {
        v.push(KernelSpec::MatMulAct { inner: Box::new(inner), act: UnaryOpKey(act) });
    }
    v.push(KernelSpec::MatMulFewX16 { k: 4096, n: 14336, wdtype: DType::BF16, bias: false, residual: true });
    v.push(KernelSpec::MatMulFewX16 { k: 576, n: 1536, wdtype: DType::F16, bias: true, residual: false });
    v.push(KernelSpec::MatMulParts { inner: Box::new(KernelSpec::MatMulFewX16 { k: 4096, n: 6144, wdtype: DType::BF16, bias: false, residual: false }), parts: vec![1024, 4096, 1024] });
    v.push(KernelSpec::SwiGluGemv { k: 576, f: 1536, wdtype: DType::F16 });
    v.push(KernelSpec::ToHalf { f16: false });
    v.push(KernelSpec::ToHalf { f16: true });
    v.push(KernelSpec::Rope { h: 9, d: 64, theta_bits: 100000f32.to_bits(), interleaved: true });
    v.push(KernelSpec::Rope { h: 3, d: 64, theta_bits: 100000f32.to_bits(), interleaved: false });
    v.push(KernelSpec::RopeCacheWrite { h: 8, d: 128, theta_bits: 500000f32.to_bits(), interleaved: false, kv: DType::F32 });
    v.push(KernelSpec::CacheWrite { row: 192, kv: DType::F32 });
    v.push(KernelSpec::Softmax { d: 1000 });
    v.push(KernelSpec::LayerNorm { d: 768, eps_bits: 1e-5f32.to_bits(), half: None });
    v.push(KernelSpec::LayerNorm { d: 768, eps_bits: 1e-5f32.to_bits(), half: Some(false) });
    v.push(KernelSpec::LayerNorm { d: 768, eps_bits: 1e-5f32.to_bits(), half: Some(true) });
    v.push(KernelSpec::Argmax { d: 49152 });
    v.push(KernelSpec::Argmax { d: 128256 });
    v.push(KernelSpec::Argmax { d: 1001 });
    v.push(KernelSpec::SiluMulHalf { f16: false });
    v.push(KernelSpec::SiluMulHalf { f16: true });
    // W tiles by TMA (DSC_TMA): the prefill tile, the 64-row tile, split-K over a merged matmul
    for tiling in [dsc_codegen::kernels::pipe_tiling(6144), dsc_codegen::kernels::pipe64_tiling(28672)] {
        let pipe = KernelSpec::MatMulPipe {
            k: 4096,
            n: 28672,
            wdtype: DType::BF16,
            bias: false,
            residual: true,
            bn: tiling.bn,
            stages: tiling.stages,
            overlap: tiling.overlap,
            a16: tiling.a16,
            bm: tiling.bm,
        };
        v.push(KernelSpec::Tma { inner: Box::new(pipe) });
    }
    {
        let t = dsc_codegen::kernels::pipe64_tiling(4096);
        let pipe = KernelSpec::MatMulPipe { k: 4096, n: 6144, wdtype: DType::F16, bias: false, residual: false, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: true, bm: 64 };
        v.push(KernelSpec::Tma { inner: Box::new(KernelSpec::SplitK { inner: Box::new(KernelSpec::MatMulParts { inner: Box::new(pipe), parts: vec![4096, 1024, 1024] }), splits: 2 }) });
    }
    // the split-K reduce folded into the RMSNorm after it
    v.push(KernelSpec::SplitKReduceNorm { splits: 4, residual: true, d: 4096, eps_bits: 1e-5f32.to_bits(), half: Some(false), cluster: 1 });
    v.push(KernelSpec::SplitKReduceNorm { splits: 2, residual: false, d: 1000, eps_bits: 1e-5f32.to_bits(), half: None, cluster: 1 });
    // (and in thread-block clusters: sm_90a only)
    v.push(KernelSpec::SplitKReduceNorm { splits: 4, residual: true, d: 4096, eps_bits: 1e-5f32.to_bits(), half: Some(false), cluster: 4 });
    // split-K over a merged matmul (q/k/v of the 8B shape)
    {
        let t = dsc_codegen::kernels::pipe64_tiling(4096);
        let pipe = KernelSpec::MatMulPipe { k: 4096, n: 6144, wdtype: DType::BF16, bias: false, residual: false, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: true, bm: 64 };
        v.push(KernelSpec::SplitK { inner: Box::new(KernelSpec::MatMulParts { inner: Box::new(pipe), parts: vec![4096, 1024, 1024] }), splits: 2 });
    }
    v.push(KernelSpec::Slice { inner: 64, d: 12, start: 3, len: 4 });
    v.push(KernelSpec::TakeAlong { n_in: 64, k: 6 });
    v.push(KernelSpec::TopK { d: 64, k: 6 });
    v.push(KernelSpec::Transpose { perm: vec![1, 0, 2] });
    v.push(KernelSpec::Concat { sizes: vec![3, 5], inner: 16 });
    v.push(KernelSpec::PagedAttention { h: 9, kvh: 3, d: 64, bs: 16, scale_bits: 0.125f32.to_bits(), warps: 4, keys: 1, group: 1, kv: DType::F32 });
    v.push(KernelSpec::PagedAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 16, keys: 4, group: 1, kv: DType::F32 });
    v.push(KernelSpec::PagedAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 4, keys: 3, group: 1, kv: DType::F32 });
    // (the grouped kernel of batched decode: a block per (token, KV head))
    v.push(KernelSpec::PagedAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 8, keys: 4, group: 4, kv: DType::F32 });
    v.push(KernelSpec::PagedAttention { h: 9, kvh: 3, d: 64, bs: 16, scale_bits: 0.125f32.to_bits(), warps: 8, keys: 4, group: 3, kv: DType::F32 });
    // (prefetching the next matmul's weights into L2 first)
    v.push(KernelSpec::PrefetchL2 { inner: Box::new(KernelSpec::PagedAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 8, keys: 4, group: 4, kv: DType::F32 }) });
    // norm + quantize: the register-resident (D = 4096) and vectorized (D = 576) RMSNorm with a 16-bit copy
    for (d, f16) in [(4096usize, false), (576, true)] {
        v.push(KernelSpec::RmsNormHalf { d, eps_bits: 1e-5f32.to_bits(), f16 });
    }
    // the split decode attention's two passes
    v.push(KernelSpec::PagedAttentionSplit { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 16, keys: 4, splits: 16, min_keys: 256, group: 1, kv: DType::F32 });
    v.push(KernelSpec::PagedAttentionSplit { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 16, keys: 4, splits: 16, min_keys: 256, group: 4, kv: DType::F32 });
    v.push(KernelSpec::AttentionCombine { h: 32, d: 128, splits: 16, min_keys: 256 });
    v.push(KernelSpec::AttentionCombine { h: 9, d: 64, splits: 4, min_keys: 8 });
    // merged matmuls in every family, the norm prologue, the fused Q/K/V rope + cache writes,
    // one-pass RMSNorm
    let parts = vec![1024usize, 4096, 1024];
    for inner in [
        KernelSpec::MatMul { k: 4096, n: 6144, wdtype: DType::BF16, bias: false, residual: false },
        KernelSpec::MatMul { k: 4096, n: 6144, wdtype: DType::Q4_1, bias: false, residual: false },
        KernelSpec::MatMulFew { k: 4096, n: 6144, wdtype: DType::BF16, bias: false, residual: false, rows: 32 },
        KernelSpec::MatMulMma { k: 4096, n: 6144, wdtype: DType::BF16, bias: false, residual: false },
        KernelSpec::MatMulWgmma { k: 4096, n: 6144, wdtype: DType::BF16, bias: false, residual: false, n_tile: 64 },
        KernelSpec::MatMulWgmma { k: 4096, n: 6144, wdtype: DType::BF16, bias: false, residual: false, n_tile: 16 },
    ] {
        v.push(KernelSpec::MatMulParts { inner: Box::new(inner), parts: parts.clone() });
    }
    let gemv = KernelSpec::MatMul { k: 4096, n: 6144, wdtype: DType::BF16, bias: false, residual: false };
    v.push(KernelSpec::NormMatMul { inner: Box::new(KernelSpec::MatMulParts { inner: Box::new(gemv), parts }), eps_bits: 1e-5f32.to_bits() });
    v.push(KernelSpec::QkvRopeCache { h: 32, kvh: 8, d: 128, theta_bits: 500000f32.to_bits(), interleaved: false, kv: DType::F32 });
    // the decode attention with RoPE and the cache writes folded in (one-token steps)
    for (kv, interleaved) in [(DType::F32, false), (DType::BF16, true)] {
        let inner = KernelSpec::PagedAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 16, keys: 4, group: 1, kv };
        v.push(KernelSpec::RopeAttention { inner: Box::new(inner), theta_bits: 500000f32.to_bits(), interleaved });
    }
    // bf16 KV pools: the writes round, the attention kernels read 16-bit rows
    let bf = DType::BF16;
    v.push(KernelSpec::QkvRopeCache { h: 32, kvh: 8, d: 128, theta_bits: 500000f32.to_bits(), interleaved: false, kv: bf });
    v.push(KernelSpec::RopeCacheWrite { h: 8, d: 128, theta_bits: 500000f32.to_bits(), interleaved: true, kv: bf });
    v.push(KernelSpec::CacheWrite { row: 192, kv: bf });
    v.push(KernelSpec::PagedAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 16, keys: 4, group: 1, kv: bf });
    v.push(KernelSpec::PagedAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 8, keys: 4, group: 4, kv: bf });
    v.push(KernelSpec::PagedAttention { h: 9, kvh: 3, d: 64, bs: 16, scale_bits: 0.125f32.to_bits(), warps: 8, keys: 4, group: 3, kv: bf });
    v.push(KernelSpec::PagedAttentionSplit { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), warps: 16, keys: 4, splits: 16, min_keys: 256, group: 4, kv: bf });
    v.push(KernelSpec::FlashAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), kv: bf, warps: 4, mtiles: 1 });
    v.push(KernelSpec::FlashAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), kv: bf, warps: 8, mtiles: 1 });
    v.push(KernelSpec::FlashAttention { h: 32, kvh: 8, d: 128, bs: 16, scale_bits: 0.088f32.to_bits(), kv: bf, warps: 4, mtiles: 2 });
    v.push(KernelSpec::FlashAttention { h: 9, kvh: 3, d: 64, bs: 16, scale_bits: 0.125f32.to_bits(), kv: bf, warps: 4, mtiles: 1 });
    v.push(KernelSpec::RmsNorm { d: 4096, eps_bits: 1e-5f32.to_bits() });
    v
}

#[test]
fn every_kernel_passes_ptxas_for_every_target() {
    let m = compile_kernels(&all_specs(), &GpuTarget::ALL, &Default::default()).unwrap();
    assert_eq!(m.kernels.len(), all_specs().len());
    let dir = tempfile::tempdir().unwrap();
    for (t, ptx) in &m.ptx {
        assert!(ptx.contains(&format!(".target {}", t.name())) && ptx.contains(".version 8.0"), "{ptx:.300}");
        for (name, spec) in &m.kernels {
            let here = *t == GpuTarget::Sm90a || !spec.hopper_only();
            assert_eq!(ptx.contains(&format!(".entry {name}(")), here, "{name} in the {} PTX: expected {here}", t.name());
        }
        let f = dir.path().join(format!("{}.ptx", t.name()));
        std::fs::write(&f, ptx).unwrap();
        let out = Command::new(ptxas()).args([&format!("-arch={}", t.name()), "-v", f.to_str().unwrap(), "-o", "/dev/null"]).output().unwrap();
        let log = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "ptxas rejected the {} PTX:\n{log}\nrepro: ptxas -arch={} {}", t.name(), t.name(), f.display());
        assert!(!log.contains("spill stores") || log.contains("0 bytes spill stores"), "spills: {log}");
    }
    // the rms_norm kernel reduces with warp shuffles; the large-M matmul uses the tensor cores
    assert!(m.ptx[&GpuTarget::Sm90a].contains("shfl.sync.bfly"));
    assert!(m.ptx[&GpuTarget::Sm80].contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
    // Hopper: warpgroup MMA from shared-memory descriptors, on sm_90a only
    assert!(m.ptx[&GpuTarget::Sm90a].contains("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"));
    assert!(m.ptx[&GpuTarget::Sm90a].contains("wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16"));
    assert!(!m.ptx[&GpuTarget::Sm80].contains("wgmma"));
}

#[test]
fn unsupported_ops_are_named() {
    let e = compile_kernels(&[KernelSpec::MatMul { k: 64, n: 8, wdtype: DType::I8, bias: false, residual: false }], &[GpuTarget::Sm90a], &Default::default()).unwrap_err().to_string();
    assert!(e.contains("matmul_k64_n8_i8") && e.contains("not lowered"), "{e}");
}

/// Each wrapper kernel around `s` (most refuse most kernels): what the agreement test tries.
fn wrapped(s: &KernelSpec) -> Vec<KernelSpec> {
    let b = || Box::new(s.clone());
    let eps_bits = 1e-5f32.to_bits();
    let mut v = vec![
        KernelSpec::NormMatMul { inner: b(), eps_bits },
        KernelSpec::GatherX { inner: b() },
        KernelSpec::RowGather { inner: b() },
        KernelSpec::ZeroFill { inner: b(), len: 576 },
        KernelSpec::ArgmaxFold { inner: b() },
        KernelSpec::MatMulAct { inner: b(), act: UnaryOpKey(UnaryOp::Silu) },
        KernelSpec::MatMulAct { inner: b(), act: UnaryOpKey(UnaryOp::Exp) },
        KernelSpec::MatMulCopy { inner: b() },
        KernelSpec::PrefetchL2 { inner: b() },
        KernelSpec::Tma { inner: b() },
        KernelSpec::Ws { inner: b() },
        KernelSpec::SplitK { inner: b(), splits: 2 },
        KernelSpec::SplitK { inner: b(), splits: 3 },
        KernelSpec::SwiGluPipe { inner: b() },
        KernelSpec::RopeAttention { inner: b(), theta_bits: 10000f32.to_bits(), interleaved: false },
        KernelSpec::QkvRopeSplitK { inner: b(), splits: 2 },
        KernelSpec::FlashWgmma { inner: b() },
    ];
    for (n, red, splits) in [(576, true, 4), (4096, true, 2), (4096, false, 1), (4096, false, 2), (100, true, 3)] {
        v.push(KernelSpec::AttentionO { inner: b(), n, red, splits, wdtype: DType::BF16 });
    }
    for (k, cluster) in [(576, 4), (576, 1), (4096, 2), (4096, 1), (100, 1)] {
        v.push(KernelSpec::QkvAttentionO { inner: b(), k, eps_bits, cluster, wdtype: DType::BF16 });
    }
    if let KernelSpec::MatMul { n, .. } | KernelSpec::MatMulPipe { n, .. } | KernelSpec::MatMulFew { n, .. } = s {
        v.push(KernelSpec::MatMulParts { inner: b(), parts: vec![n / 2, n - n / 2] });
    }
    v
}

/// `kernels::fits` (what the schedule's rewrites ask before they fuse) answers as the emitters
/// do: for every kernel above, each inside every wrapper and the wrappers that fit inside every
/// wrapper again, `fits` is Ok exactly when the kernel generates for both targets (with and
/// without PDL). (The emitters call their family's `fits` first, so a kernel `fits` refuses
/// never generates; this holds the checks left inside the emitters — weight and KV element
/// types, parameter order — to what `fits` states. 2026-12-03: 1,119 of 15,446 fit.)
#[test]
fn fits_answers_as_the_emitters_do() {
    let emits = |s: &KernelSpec| dsc_codegen::kernels::emit_for(s, true).is_ok() && dsc_codegen::kernels::emit_for(s, false).is_ok();
    let eps_bits = 1e-5f32.to_bits();
    let mut base = all_specs();
    // (the one-token kernels the wrappers take: RoPE attention of a head per block, the fused MLP, the wide GEMV, the SwiGLU pipe)
    let att = KernelSpec::PagedAttention { h: 9, kvh: 3, d: 64, bs: 16, scale_bits: 0.125f32.to_bits(), warps: 16, keys: 4, group: 1, kv: DType::BF16 };
    base.push(KernelSpec::RopeAttention { inner: Box::new(att), theta_bits: 100000f32.to_bits(), interleaved: false });
    base.push(KernelSpec::SwiGluDown { k: 576, f: 1536, n: 576, eps_bits, fb: 16, fpw: 2, wdtype: DType::BF16 });
    base.push(KernelSpec::MatMulWide { k: 576, n: 49152, wdtype: DType::BF16, bias: false, residual: false });
    base.push(KernelSpec::MatMulWide { k: 576, n: 49152, wdtype: DType::BF16, bias: true, residual: false });
    base.push(KernelSpec::Gather { d: 576, dtype: DType::BF16 });
    base.push(KernelSpec::Gather { d: 100, dtype: DType::Q8_0 });
    base.push(KernelSpec::RmsNorm { d: 1001, eps_bits });
    base.push(KernelSpec::RmsNormHalf { d: 1001, eps_bits, f16: false });
    base.push(KernelSpec::Transpose { perm: vec![] });
    base.push(KernelSpec::QkvRopeCache { h: 9, kvh: 3, d: 63, theta_bits: 100000f32.to_bits(), interleaved: false, kv: DType::BF16 });
    base.push(KernelSpec::MatMul { k: 100, n: 64, wdtype: DType::BF16, bias: false, residual: false });
    base.push(KernelSpec::MatMulPipe { k: 4096, n: 28672, wdtype: DType::BF16, bias: false, residual: false, bn: 128, stages: 4, overlap: true, a16: true, bm: 128 });
    base.push(KernelSpec::FlashAttention { h: 32, kvh: 8, d: 128, bs: 64, scale_bits: 0.088f32.to_bits(), kv: DType::BF16, warps: 4, mtiles: 1 });
    // (the batched DeepSeek kernels on the tensor cores: 16-bit weights and K a multiple of 32
    // fit, f32 weights or K of 20 do not)
    for (d, inter, wdtype) in [(256, 64, DType::BF16), (256, 64, DType::F32), (256, 20, DType::BF16)] {
        base.push(KernelSpec::MoeGateUpMma { d, inter, e: 8, top_k: 2, wdtype });
        base.push(KernelSpec::MoeDownMma { d, inter, e: 8, top_k: 2, wdtype });
    }
    base.push(KernelSpec::MoeCombine { d: 36, e: 10, top_k: 3, residual: false });
    for (k, wdtype) in [(512, DType::BF16), (512, DType::F32), (20, DType::F16)] {
        base.push(KernelSpec::HeadMatMulMma { h: 4, k, n: 40, wdtype });
    }
    base.push(KernelSpec::MlaQueryMma { h: 4, nope: 32, r: 8, l: 40, wdtype: DType::BF16, theta_bits: 10000f32.to_bits(), interleaved: true, yarn: None });
    let mut tried = 0;
    let mut fit = 0;
    let mut check = |s: &KernelSpec| {
        let f = dsc_codegen::kernels::fits(s);
        assert_eq!(f.is_ok(), emits(s), "{s:?}: fits says {f:?}");
        tried += 1;
        fit += usize::from(f.is_ok());
        f.is_ok()
    };
    let mut fitting = vec![];
    for s in &base {
        check(s);
        for w in wrapped(s) {
            if check(&w) {
                fitting.push(w);
            }
        }
    }
    for s in &fitting {
        for w in wrapped(s) {
            check(&w);
        }
    }
    // (both answers occur, many times)
    assert!(fit > 200 && tried - fit > 1000, "{fit} of {tried} fit");
}
