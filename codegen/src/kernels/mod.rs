//! Kernel generators: each emits one `gpu.func` in MLIR text, specialised to its shapes
//! (the kernel cache keys on the spec, so identical layers share one kernel).
//!
//! One file per op family, each owning its kernels' symbols (`<family>_symbol`), launch
//! geometry (`<family>_launch`), emitters (`<family>_kernel`), tunables and `fits` checks, and
//! the lowering of the ops it is the kernel of (`lower_rms_norm`, `lower_paged_attention`):
//! `norm`, `elementwise`, `rope`, `argmax`, `mlp`, `matmul/{common,gemv,int4,mma,pipe}`,
//! `attention/{paged,flash,qkv}`, `moe` (DeepSeekMoE's router and routed experts), `mla`
//! (Multi-head Latent Attention and its per-head matmuls); the spec's fields in `spec`, the
//! MLIR text builder in `body`. [`family`] maps every spec to its family (exhaustively). A new
//! family gets its own file (or folder), a [`Family`] variant and its arms in [`family`].
//!
//! Calling convention: global pointers (`!llvm.ptr<1>`) for tensors, in operand order, then
//! the output, then i64 scalars. [`Launch`] says how the runtime sizes the grid.
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - Calling convention of every generated kernel: global pointers (`!llvm.ptr<1>`) for the
//!   operands in order, then the output, then i64 scalars. Launch shapes: `per_element`
//!   (threads per block), `warp_per_row`, `warp_per_output` (the block-quantized GEMV) and
//!   `block_per_row` (warps per block), `outputs_per_block` (the plain-float GEMVs: `block`
//!   outputs per block of `threads` (default 128) threads, grid y = ceil(rows / rows_per_block)),
//!   `warp_per_tile` (mma.sync matmul: 16×8 tiles, grid y = rows / 16), `warpgroup_per_tile`
//!   (wgmma). `Launch::Tile` kernels (the pipelined matmul, the prefill attention) are written to
//!   the plan as `outputs_per_block` with `rows_per_block`, `threads` and `smem` (bytes of dynamic
//!   shared memory: `gpu.dynamic_shared_memory`; the runtime raises a kernel's limit past 48 KB
//!   when it loads the plan, `gpu::allow_smem`, and passes the bytes at every launch; the kernel
//!   check bundle carries them per kernel in `bundle.json`'s `smem`).
//! - Programmatic dependent launch: the sm_90a module's kernels (`kernels::emit_for(spec,
//!   true)`) start with `griddepcontrol.launch_dependents; griddepcontrol.wait`; the other
//!   targets' module is lowered separately without it. Buckets of decode-sized steps (≤ 64
//!   tokens, `gpu::PDL_MAX_TOKENS`, DSC_PDL_MAX_TOKENS=N; at 128 it was mixed: 8B +1%, the
//!   SmolLM2 shape -25% with its warp-specialized SwiGLU tile) launch every kernel through `GpuBackend::launch_pdl` (`cuLaunchKernelEx` with
//!   programmatic stream serialization; captured into the CUDA graph), so a kernel's launch
//!   overlaps its predecessor; `wait` keeps the data dependency. A kernel launched normally
//!   passes its `wait` at once. A body may issue the `wait` itself later (`Body::waited`): decode
//!   GEMVs over ≤ 16 MB of weights first prefetch their weight rows into L2
//!   (`cp.async.bulk.prefetch.L2`), and every decode GEMV, batched GEMV and pipelined wgmma
//!   matmul issues its first unrolled round of weight loads (the pipe: its prologue's W
//!   `cp.async` copies; x's follow the wait, in the same first commit group) before the wait
//!   (`kernels::gemv_preload`, DSC_GEMV_PRELOAD=0 off) — right because weights never depend on
//!   the previous kernel: the lowering gives GPU matmuls graph weights only (invariant below).

use crate::options::KernelOptions;
use dsc_ir::{BinaryOp, DType, UnaryOp};
use std::fmt::Write;

mod argmax;
pub mod attention;
mod body;
mod dot;
mod elementwise;
mod fp8;
pub mod matmul;
mod mla;
mod mlp;
mod moe;
mod norm;
mod rope;
mod spec;
#[cfg(test)]
mod tests;

pub use argmax::*;
pub use attention::*;
pub(crate) use body::*;
pub(crate) use elementwise::*;
pub use fp8::*;
pub use matmul::*;
pub use mla::*;
pub use mlp::*;
pub use moe::*;
pub use norm::*;
pub use rope::rope_yarn_spec;
pub(crate) use rope::*;
pub use spec::*;

/// The MLIR text of one kernel (a `gpu.func`) with the default [`KernelOptions`], or why it
/// cannot be generated.
pub fn emit(spec: &KernelSpec) -> Result<String, String> {
    emit_for(spec, false)
}

/// As [`emit`]; with `pdl` (sm_90a) the kernel starts with `griddepcontrol.launch_dependents`
/// (the next kernel in the stream may launch now) and `griddepcontrol.wait` (this kernel waits
/// for the previous one to finish and its writes to be visible): launched with programmatic
/// stream serialization, a kernel's launch and block start-up overlap its predecessor.
pub fn emit_for(spec: &KernelSpec, pdl: bool) -> Result<String, String> {
    emit_named(spec, pdl, &spec.symbol(), &KernelOptions::default())
}

/// [`emit_for`] under the symbol `name` (the module's: [`crate::kernel_names`]), the body
/// written as `o` says.
pub fn emit_named(spec: &KernelSpec, pdl: bool, name: &str, o: &KernelOptions) -> Result<String, String> {
    let name = name.to_string();
    let mut b = Body {
        s: String::new(),
        n: 0,
        workgroup: None,
        block_x: None,
        block_y: None,
        pdl,
        waited: false,
        row_gather: false,
        gather_x: false,
        argmax_fold: false,
        norm: None,
        swiglu: false,
        swiglu_pipe: false,
        sum_slices: None,
        act: None,
        split_k: None,
        split_n: None,
        tma: false,
        ws: false,
        flash_wg: false,
        launch_bounds: None,
        attn_o: None,
        copy_y: false,
        attn_o_red: false,
        attn_o_splits: 1,
        attn_o_wdtype: DType::BF16,
        qkv_in: None,
        qkv_wdtype: DType::BF16,
        x_row_div: None,
        yarn: None,
        o: *o,
    };
    let params = emit_into(&mut b, spec)?;
    let wg = b.workgroup.as_ref().map(|w| format!(" workgroup({w})")).unwrap_or_default();
    // (the warp-specialized matmul: 384 threads, so ptxas keeps to 168 registers a thread
    // before `setmaxnreg` redistributes them)
    // (the wgmma prefill attention with TMA tiles: ptxas keeps to the registers
    // FLASH_WG_BLOCKS_PER_SM blocks of 128 threads leave — `flash_wg_blocks_per_sm`)
    let mincta = b.launch_bounds;
    let attrs = match (b.ws, mincta) {
        (true, _) => " attributes {known_block_size = array<i32: 384, 1, 1>}".to_string(),
        // (the decode attention with the o projection: its block size, so ptxas keeps the
        // registers 512 threads may have)
        _ if b.attn_o.is_some() || spec.is_fused_mlp() => {
            match spec.launch() {
                // (the fused one-token MLP too: 512 threads with 32 features per block)
                // (`KernelOptions::fused_mincta` 2: blocks of up to 256 threads kept to the
                // registers two per SM leave, so the fused MLP and attention of one-token steps
                // share SMs — the next one's blocks start while the last one's still run)
                Launch::OutputsPerBlock { warps, .. } | Launch::BlockPerRow { warps } => match b.o.fused_mincta.filter(|&m| 32 * warps as usize * m <= 512) {
                    Some(m) => format!(" attributes {{known_block_size = array<i32: {}, 1, 1>, nvvm.minctasm = {m} : i32}}", 32 * warps),
                    None => format!(" attributes {{known_block_size = array<i32: {}, 1, 1>}}", 32 * warps),
                },
                _ => String::new(),
            }
        }
        (false, Some((threads, n))) => format!(" attributes {{known_block_size = array<i32: {threads}, 1, 1>, nvvm.minctasm = {n} : i32}}"),
        _ => String::new(),
    };
    let prologue = match (pdl, b.waited) {
        (true, false) => {
            "        llvm.inline_asm has_side_effects \"griddepcontrol.launch_dependents;\", \"\" : () -> ()\n        llvm.inline_asm has_side_effects \"griddepcontrol.wait;\", \"~{memory}\" : () -> ()\n"
        }
        (true, true) => "        llvm.inline_asm has_side_effects \"griddepcontrol.launch_dependents;\", \"\" : () -> ()\n",
        _ => "",
    };
    Ok(format!("    gpu.func @{name}({params}){wg} kernel{attrs} {{\n{prologue}{}        gpu.return\n    }}\n", b.s))
}

/// Whether `spec` generates, with and without PDL (the sm_90a variant and the others'), or why
/// not — its family's preconditions, checked without generating MLIR: what a schedule rewrite
/// asks before it turns a step into a fused kernel. Each family's `<family>_fits` states what
/// its emitters require, and the emitters call the same checks (`emits_as_fits` in
/// kernels/tests.rs holds the two to agreement over every spec the tests know).
pub fn fits(spec: &KernelSpec) -> Result<(), String> {
    fits_in(spec, Outer { pdl: true, ..Outer::default() })?;
    fits_in(spec, Outer::default())
}

/// What the kernels around a kernel ask of it: the [`Body`] flags a wrapper sets before it
/// emits its inner kernel that change what that kernel's emitter accepts. [`fits_in`] passes
/// them down as `emit_into` passes the body.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Outer {
    /// the sm_90a variant (programmatic dependent launch; clusters)
    pub(crate) pdl: bool,
    /// `NormMatMul`: the RMSNorm prologue
    pub(crate) norm: bool,
    /// `GatherX`: x from the embedding table
    pub(crate) gather_x: bool,
    /// `ArgmaxFold`
    pub(crate) argmax_fold: bool,
    /// `MatMulAct`: an activation epilogue
    pub(crate) act: bool,
    /// `Tma` / `Ws`
    pub(crate) tma: bool,
    pub(crate) ws: bool,
    /// `SplitK`
    pub(crate) split_k: bool,
    /// `AttentionO` (with `red`)
    pub(crate) attn_o: bool,
    pub(crate) attn_o_red: bool,
    /// `QkvAttentionO`: (K, blocks per head on this target)
    pub(crate) qkv_in: Option<(usize, usize)>,
}

impl Body {
    /// What the wrappers emitted so far ask of the kernel inside them ([`fits_in`]'s view of
    /// this body's flags).
    pub(crate) fn outer(&self) -> Outer {
        Outer {
            pdl: self.pdl,
            norm: self.norm.is_some(),
            gather_x: self.gather_x,
            argmax_fold: self.argmax_fold,
            act: self.act.is_some(),
            tma: self.tma,
            ws: self.ws,
            split_k: self.split_k.is_some(),
            attn_o: self.attn_o.is_some(),
            attn_o_red: self.attn_o_red,
            qkv_in: self.qkv_in.map(|(k, _, c)| (k, c)),
        }
    }
}

/// Whether [`Body::weight_elem`] reads `dtype`: plain floats, the GGUF blocks Q8_0, Q4_0,
/// Q4_1 and dsc's I4G128 and F8G128.
pub(crate) fn weight_elem_fits(dtype: DType) -> Result<(), String> {
    match dtype {
        DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::I4G128 | DType::F8G128 => Ok(()),
        d if kquant_dtype(d) => Ok(()),
        other => Err(format!("{other} weights are not lowered yet")),
    }
}

/// [`fits`] inside the wrappers `o` describes: the family's check.
pub(crate) fn fits_in(spec: &KernelSpec, o: Outer) -> Result<(), String> {
    match family(spec) {
        Family::Norm => norm_fits(spec, o),
        Family::Elementwise => elementwise_fits(spec),
        Family::Rope => rope_fits(spec, o),
        Family::Argmax => argmax_fits(spec, o),
        Family::Gemv => gemv_fits(spec, o),
        Family::Mma => mma_fits(spec),
        Family::Packed => packed_fits(spec),
        Family::Fp8 => fp8_fits(spec),
        Family::Pipe => pipe_fits(spec, o),
        Family::Mlp => mlp_fits(spec),
        Family::Flash => flash_fits(spec, o),
        Family::Paged => paged_fits(spec, o),
        Family::Qkv => qkv_fits(spec, o),
        Family::Moe => moe_fits(spec),
        Family::Mla => mla_fits(spec),
    }
}

/// A KV pool's element type the kernels read and write (`Body::load_kv` / `store_kv`).
pub(crate) fn kv_fits(kv: DType) -> Result<(), String> {
    match kv {
        DType::F32 | DType::BF16 => Ok(()),
        other => Err(format!("{other} KV caches are not lowered for the GPU (f32 or bf16)")),
    }
}

/// The kernel families, one file (or folder) each: every spec belongs to one ([`family`]),
/// whose file owns its symbol, launch geometry and emitter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    Norm,
    Elementwise,
    Rope,
    Argmax,
    Gemv,
    Packed,
    Fp8,
    Mma,
    Pipe,
    Mlp,
    Flash,
    Paged,
    Qkv,
    Moe,
    Mla,
}

/// The family of `spec` (exhaustive: a new spec variant must pick one here).
pub(crate) fn family(spec: &KernelSpec) -> Family {
    match spec {
        KernelSpec::RmsNorm { .. } | KernelSpec::RmsNormHalf { .. } | KernelSpec::SplitKReduceNorm { .. } | KernelSpec::LayerNorm { .. } => Family::Norm,
        KernelSpec::Unary(..)
        | KernelSpec::SiluMulHalf { .. }
        | KernelSpec::Binary(..)
        | KernelSpec::SplitKReduce { .. }
        | KernelSpec::SeededInit { .. }
        | KernelSpec::ToHalf { .. }
        | KernelSpec::Softmax { .. }
        | KernelSpec::Slice { .. }
        | KernelSpec::TakeAlong { .. }
        | KernelSpec::TopK { .. }
        | KernelSpec::Transpose { .. }
        | KernelSpec::Concat { .. }
        | KernelSpec::Gather { .. } => Family::Elementwise,
        KernelSpec::QkvRopeSplitK { .. }
        | KernelSpec::Rope { .. }
        | KernelSpec::RopeYarn { .. }
        | KernelSpec::RopeCacheWrite { .. }
        | KernelSpec::QkvRopeCache { .. }
        | KernelSpec::CacheWrite { .. } => Family::Rope,
        KernelSpec::ArgmaxFold { .. } | KernelSpec::Argmax { .. } | KernelSpec::ArgmaxCluster { .. } | KernelSpec::ArgmaxSplit { .. } => Family::Argmax,
        // (Q4_K's SwiGLU GEMV: the packed one-row form with the epilogue)
        KernelSpec::SwiGluGemv { wdtype: DType::Q4_K, .. } => Family::Packed,
        KernelSpec::MatMulParts { .. }
        | KernelSpec::NormMatMul { .. }
        | KernelSpec::MatMul { .. }
        | KernelSpec::MatMulWide { .. }
        | KernelSpec::MatMulFew { .. }
        | KernelSpec::PrefetchL2 { .. }
        | KernelSpec::MatMulAct { .. }
        | KernelSpec::GatherX { .. }
        | KernelSpec::RowGather { .. }
        | KernelSpec::ZeroFill { .. }
        | KernelSpec::MatMulCopy { .. }
        | KernelSpec::SwiGluGemv { .. } => Family::Gemv,
        KernelSpec::MatMulFewX16 { .. } | KernelSpec::MatMulMma { .. } | KernelSpec::MatMulWgmma { .. } => Family::Mma,
        KernelSpec::MatMulPacked { .. } => Family::Packed,
        KernelSpec::ActQuantF8 { .. } | KernelSpec::MatMulF8 { .. } => Family::Fp8,
        KernelSpec::Ws { .. } | KernelSpec::Tma { .. } | KernelSpec::SplitK { .. } | KernelSpec::SwiGluPipe { .. } | KernelSpec::MatMulPipe { .. } => Family::Pipe,
        KernelSpec::SwiGluDown { .. } => Family::Mlp,
        KernelSpec::FlashWgmma { .. } | KernelSpec::FlashAttention { .. } => Family::Flash,
        KernelSpec::PagedAttention { .. } | KernelSpec::PagedAttentionSplit { .. } | KernelSpec::AttentionCombine { .. } => Family::Paged,
        KernelSpec::AttentionO { .. } | KernelSpec::QkvAttentionO { .. } | KernelSpec::RopeAttention { .. } => Family::Qkv,
        KernelSpec::MoeRoute { .. }
        | KernelSpec::MoeRouteGemv { .. }
        | KernelSpec::MoeGateUp { .. }
        | KernelSpec::MoeGateUpMma { .. }
        | KernelSpec::MoeDown { .. }
        | KernelSpec::MoeDownMma { .. }
        | KernelSpec::MoeCombine { .. } => Family::Moe,
        KernelSpec::MlaAttention { .. }
        | KernelSpec::MlaCacheAttention { .. }
        | KernelSpec::HeadMatMul { .. }
        | KernelSpec::HeadMatMulMma { .. }
        | KernelSpec::MlaLatentCache { .. }
        | KernelSpec::MlaQuery { .. }
        | KernelSpec::MlaQueryMma { .. } => Family::Mla,
    }
}

/// The kernel's body into `b`; returns its parameter list.
fn emit_into(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    Ok(match family(spec) {
        Family::Norm => norm_kernel(b, spec)?,
        Family::Elementwise => elementwise_kernel(b, spec)?,
        Family::Rope => rope_kernel(b, spec)?,
        Family::Argmax => argmax_kernel(b, spec)?,
        Family::Gemv => gemv_kernel(b, spec)?,
        Family::Mma => mma_kernel(b, spec)?,
        Family::Packed => packed_kernel(b, spec)?,
        Family::Fp8 => fp8_kernel(b, spec)?,
        Family::Pipe => pipe_kernel(b, spec)?,
        Family::Mlp => mlp_kernel(b, spec)?,
        Family::Flash => flash_kernel(b, spec)?,
        Family::Paged => paged_kernel(b, spec)?,
        Family::Qkv => qkv_kernel(b, spec)?,
        Family::Moe => moe_kernel(b, spec)?,
        Family::Mla => mla_kernel(b, spec)?,
    })
}

/// Wrap kernels in the module the pass pipeline expects.
pub fn module(funcs: &[String]) -> String {
    format!("module attributes {{gpu.container_module}} {{\n  gpu.module @kernels {{\n{}  }}\n}}\n", funcs.concat())
}
