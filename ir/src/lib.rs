//! dsc's tensor-graph IR.
//!
//! - [`DType`]: element and storage types, incl. FP8 and the GGUF block formats ([`quant`]
//!   holds their byte-level semantics).
//! - [`Dim`] / [`TensorType`]: symbolic shapes.
//! - [`Op`]: the op table with shape/dtype inference ([`op::infer`]).
//! - [`Graph`]: a petgraph DAG of named, typed nodes with a verifier.
//! - [`text`]: printer and parser that round-trip; [`dot`]: Graphviz export.
//! - [`exec`]: the CPU reference executor, the oracle for every pass and kernel.
//!
//! This crate depends on no other crate of the project and on no GPU library.

pub mod dot;
mod dtype;
mod error;
pub mod exec;
mod graph;
pub mod op;
pub mod quant;
pub mod seeded;
mod shape;
pub mod shard;
pub mod text;

pub use dtype::DType;
pub use error::{IrError, Result};
pub use exec::{Collective, Executor, PackedMatMul, RankHandle, SingleRank, Tensor, ThreadGroup, WeightSource};
pub use graph::{Graph, Node, NodeId};
pub use op::{yarn_mscale, BinaryOp, MoeRouting, MoeScoring, MoeSelect, Op, RopeStyle, UnaryOp, Yarn};
pub use shape::{Dim, TensorType};
