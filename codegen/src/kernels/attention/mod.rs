//! The attention kernel families: decode over the paged KV cache (`paged`: one-pass, grouped,
//! split with its combine), prefill (`flash`: mma.sync and wgmma), and the one-token fusions
//! around the decode attention (`qkv`: RoPE and the cache writes, the o projection, the q/k/v
//! GEMV).

mod flash;
mod paged;
mod qkv;

pub use flash::*;
pub use paged::*;
pub(crate) use qkv::*;
