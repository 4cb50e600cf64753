//! Graph passes. Each pass is pure: a graph in, a graph out, typed errors, no device access.
//! The driver ([`run_pipeline`]) runs the verifier after every pass.

mod dce;
mod egraph;
mod tp;

pub use dce::Dce;
use dsc_ir::{Graph, IrError};
pub use egraph::{is_part_view, Limits, Optimize, RULES, UNVERIFIED_RULES};
use thiserror::Error;
pub use tp::TensorParallel;

#[derive(Debug, Error)]
pub enum PassError {
    #[error("pass `{pass}`: {source}")]
    Ir { pass: &'static str, source: IrError },
}

/// What a pass did, for the compile summary and the dumps.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PassReport {
    pub pass: &'static str,
    pub nodes_before: usize,
    pub nodes_after: usize,
    pub note: String,
    /// a readable dump of the pass's own structure (the optimizer's e-graph), when it has one
    pub dump: Option<String>,
}

pub trait Pass {
    fn name(&self) -> &'static str;
    fn run(&self, g: Graph) -> Result<(Graph, String), PassError>;
    /// what `run` left to show (`--dump-ir=egraph`), if anything
    fn dump(&self) -> Option<String> {
        None
    }
}

/// Run `passes` in order, verifying after each.
pub fn run_pipeline(mut g: Graph, passes: &[&dyn Pass]) -> Result<(Graph, Vec<PassReport>), PassError> {
    let mut reports = vec![];
    for p in passes {
        let before = g.node_count();
        let (ng, note) = p.run(g)?;
        ng.verify().map_err(|source| PassError::Ir { pass: p.name(), source })?;
        tracing::debug!(target: "dsc::passes", pass = p.name(), before, after = ng.node_count(), "{note}");
        reports.push(PassReport { pass: p.name(), nodes_before: before, nodes_after: ng.node_count(), note, dump: p.dump() });
        g = ng;
    }
    Ok((g, reports))
}
