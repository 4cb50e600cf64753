//! The warp-specialized pipelined matmul on quantized weights (`Ws { MatMulPipe }` with a GGUF
//! or dsc block format: its producer warpgroup dequantizes W's tiles into the stages) passes
//! ptxas for sm_90a without spills at the 8B shape's prefill matmuls, and is what it claims to
//! be: f16 wgmmas with both operands from shared memory, x by TMA, the weights read with plain
//! loads (no tensor map) and prefetched into L2, made f16 in registers and stored to shared
//! memory, the producer's registers handed to the consumers (`setmaxnreg`).

use dsc_codegen::{compile_kernels, GpuTarget, KernelSpec};
use dsc_ir::DType;
mod common;

#[test]
fn dequantizing_pipe_passes_ptxas_without_spills() {
    let ptxas = common::ptxas();
    let dir = tempfile::tempdir().unwrap();
    let pipe = |k: usize, n: usize, wdtype: DType, residual: bool| KernelSpec::MatMulPipe { k, n, wdtype, bias: false, residual, bn: 128, stages: 6, overlap: true, a16: true, bm: 128 };
    let ws = |inner: KernelSpec| KernelSpec::Ws { inner: Box::new(inner) };
    let specs = vec![
        // (q/k/v merged, o with its residual, gate/up with the SwiGLU epilogue, down; Q6_K's
        // 2-byte aligned super-blocks, i4g128 and Q8_0's blocks)
        ws(KernelSpec::MatMulParts { inner: Box::new(pipe(4096, 6144, DType::Q4_K, false)), parts: vec![4096, 1024, 1024] }),
        ws(pipe(4096, 4096, DType::Q4_K, true)),
        ws(KernelSpec::SwiGluPipe { inner: Box::new(pipe(4096, 28672, DType::Q4_K, false)) }),
        ws(pipe(14336, 4096, DType::Q6_K, true)),
        ws(pipe(4096, 4096, DType::I4G128, true)),
        ws(pipe(4096, 4096, DType::Q8_0, false)),
    ];
    let m = compile_kernels(&specs, &[GpuTarget::Sm90a], &Default::default()).unwrap();
    let logs = common::assemble_without_spills(&ptxas, &m, dir.path());
    let ptx = &m.ptx[&GpuTarget::Sm90a];
    for spec in &specs {
        let name = spec.symbol();
        let body = common::body(ptx, &name);
        assert!(body.contains("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16"), "no f16 wgmma in {name}");
        assert!(body.contains("cp.async.bulk.tensor.2d"), "x not by TMA in {name}");
        assert!(body.contains("prefetch.global.L2"), "no L2 prefetch of W in {name}");
        assert!(body.contains("st.shared.v4"), "W's f16 units not stored to shared memory in {name}");
        assert!(body.contains("setmaxnreg.dec.sync.aligned.u32 120") && body.contains("setmaxnreg.inc.sync.aligned.u32 192"), "register hand-over in {name}");
        assert!(body.contains("fence.proxy.async.shared::cta"), "no proxy fence before the wgmmas read the stores in {name}");
        assert_eq!(common::registers(&logs[0], &name), Some(168), "{name}: 384 threads start at 168 registers");
    }
}
