use thiserror::Error;

/// Everything the IR can report. Variants name the node (by its graph name) and op.
#[derive(Debug, Error)]
pub enum IrError {
    #[error("node `{node}` ({op}): {msg}")]
    Verify { node: String, op: &'static str, msg: String },
    #[error("duplicate node name `{0}`")]
    DuplicateName(String),
    #[error("unknown node `{0}`")]
    UnknownNode(String),
    #[error("graph has a cycle through node `{0}`")]
    Cycle(String),
    #[error("line {line}: {msg}")]
    Parse { line: usize, msg: String },
    #[error("executing node `{node}` ({op}): {msg}")]
    Exec { node: String, op: &'static str, msg: String },
    #[error("input `{name}`: {msg}")]
    Input { name: String, msg: String },
    #[error("weight `{name}`: {msg}")]
    Weight { name: String, msg: String },
}

pub type Result<T, E = IrError> = std::result::Result<T, E>;
