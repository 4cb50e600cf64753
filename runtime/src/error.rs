use std::path::PathBuf;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("plan {path}: {msg}")]
    Plan { path: PathBuf, msg: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error("request: {0}")]
    Request(String),
    #[error("GPU: {0}")]
    Gpu(String),
    #[error(transparent)]
    Ir(#[from] dsc_ir::IrError),
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;
