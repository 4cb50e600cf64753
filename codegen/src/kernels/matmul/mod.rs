//! The matmul kernel families: the decode GEMVs (`gemv`), the tensor-core matmuls on
//! mma.sync and wgmma (`mma`), the pipelined Hopper matmul with its TMA, warp-specialized,
//! split-K and SwiGLU variants (`pipe`), and what they share (`common`).

mod common;
mod gemv;
mod mma;
mod pipe;

pub use common::*;
pub use gemv::*;
pub use mma::*;
pub use pipe::*;
