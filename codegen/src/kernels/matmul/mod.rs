//! The matmul kernel families: the decode GEMVs (`gemv`; GGUF's K-quant and 5-bit blocks in
//! `kquant`), the int4 GEMV on the tensor cores
//! (`int4`, dsc's i4g128 weights), the tensor-core matmuls on mma.sync and wgmma (`mma`), the pipelined Hopper matmul with its TMA, warp-specialized,
//! split-K and SwiGLU variants (`pipe`), and what they share (`common`).
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - Merged matmuls (`matmul_cat(x, W_0, .., W_p-1)`, from the optimizer's merge-matmuls rule):
//!   one kernel, `KernelSpec::MatMulParts { inner, parts }`, wraps any plain matmul kernel (GEMV,
//!   batched GEMV, mma.sync, wgmma 16/64): a prologue (`kernels::emit_parts`) picks the block's
//!   part from its block index — that part's weight pointer becomes `%w`, its width `%n`, its
//!   output base `%y`, and the block index within the part stands in for `gpu.block_id x`
//!   (`Body::block_x`) — then the unchanged kernel body runs. The output is **part-major** (part i
//!   = a contiguous [M, N_i] at element M·(N_0+..+N_i-1)), so the `slice` of a whole part lowers
//!   to a view (`Scalar::RowsTimes(cat, offset)`) and rope / cache_write / silu_mul read it in
//!   place. Invariant (checked in `schedule/initial.rs`): a matmul_cat is read only through slices of whole
//!   parts, and every part is a multiple of the columns one block covers (`kernels::parts_fit`;
//!   alternatives that do not fit are dropped). New matmul epilogues/prologues therefore get the
//!   merge for free as long as they use `%w`, `%n`, `%y`, `gpu.block_id x` and `matmul_store`.

mod common;
mod gemv;
mod kquant;
mod mma;
mod packed;
mod pipe;

pub use common::*;
pub use gemv::*;
pub use kquant::*;
pub use mma::*;
pub use packed::*;
pub use pipe::*;
