use std::path::PathBuf;
use thiserror::Error;

/// Errors of the model front ends. Each names the file, field or tensor at fault.
#[derive(Debug, Error)]
pub enum ModelError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: {msg}")]
    Config { path: PathBuf, msg: String },
    #[error("{path}: {msg}")]
    Format { path: PathBuf, msg: String },
    #[error("{path}: tensor `{tensor}`: {msg}")]
    Tensor { path: PathBuf, tensor: String, msg: String },
    #[error("{path}: tensor `{tensor}` not found (the {arch} builder needs it)")]
    MissingTensor { path: PathBuf, tensor: String, arch: String },
    #[error("tokenizer ({path}): {msg}")]
    Tokenizer { path: PathBuf, msg: String },
    #[error("building the graph: {0}")]
    Ir(#[from] dsc_ir::IrError),
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;

pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io { path: path.to_path_buf(), source }
}
