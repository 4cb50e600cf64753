//! dsc's runtime: loads a plan and runs it. Never links LLVM or MLIR: the `dsc-runtime`
//! binary is the part shipped to GPU servers.
//!
//! - [`plan`]: the plan file format (writer and checked reader).
//! - [`engine`]: backends (the CPU reference backend today) and per-sequence sessions.
//! - [`sampler`], [`generate`], [`tokenizer`]: turning logits into text.
//! - [`cli`]: the `run` and `inspect` commands, shared by `dsc` and `dsc-runtime`.

pub mod bench;
pub mod cli;
pub mod cpu_kernels;
pub mod engine;
mod error;
pub mod export;
pub mod generate;
pub mod gpu;
pub mod gpu_check;
pub mod gpu_decode;
pub mod gpu_e2e;
pub mod gpu_tp;
pub mod health;
pub mod kv;
pub mod metrics;
pub mod nvml;
pub mod options;
pub mod plan;
pub mod ppl;
pub mod reasoning;
pub mod sampler;
pub mod scheduler;
pub mod server;
pub mod stop;
pub mod structured;
pub mod tokenizer;
pub mod tools;
pub mod tp;

pub use error::{Result, RuntimeError};
