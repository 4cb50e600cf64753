//! The compile pipeline, readable in one function: [`compile`].
//!
//! Stages, in order: `graph` (built from model.toml and verified) → passes (verified after
//! each) → `plan`. Later stages (`egraph`, `fused`, `mlir`, `llvm`, `ptx`) arrive with the
//! optimizer and code generator.

pub mod gpu_bundle;

use anyhow::Context;
use dsc_models::LoadedModel;
use dsc_passes::{run_pipeline, Dce, PassReport};
use dsc_runtime::plan::{write_plan, ModelMeta, PlanHeader, PlanTokenizer, PlanWeights, PLAN_FORMAT_VERSION};
use std::path::Path;

/// The stages `--dump-ir` knows today.
pub const STAGES: &[&str] = &["graph", "optimized", "plan"];

pub struct Compiled {
    pub model: LoadedModel,
    pub graph: dsc_ir::Graph,
    pub reports: Vec<PassReport>,
}

/// model.toml → verified, optimized graph (+ weights and tokenizer).
pub fn compile(model_toml: &Path) -> anyhow::Result<Compiled> {
    let model = dsc_models::load(model_toml)?;
    let (graph, reports) = run_pipeline(model.graph.clone(), &[&Dce])?;
    Ok(Compiled { model, graph, reports })
}

pub fn plan_header(c: &Compiled) -> anyhow::Result<PlanHeader> {
    let m = &c.model;
    let t = &m.config.toml;
    let source_sha256 = t.weights.sha256.clone();
    Ok(PlanHeader {
        format_version: PLAN_FORMAT_VERSION,
        created_by: format!("dsc {}", env!("CARGO_PKG_VERSION")),
        model: ModelMeta {
            name: t.model.name.clone(),
            architecture: "llama".into(),
            dims: serde_json::to_value(&m.dims)?,
            max_seq_len: t.limits.max_seq_len,
            kv_block_size: t.limits.kv_block_size,
            max_batch: t.limits.max_batch,
            activations: m.config.activations.to_string(),
            kv_cache: m.config.kv_cache.to_string(),
        },
        targets: vec!["cpu".into()],
        graph: dsc_ir::text::print(&c.graph),
        tokenizer: m.tokenizer.as_ref().map(|t| PlanTokenizer {
            json: t.json.clone(),
            bos_id: t.bos_id,
            eos_ids: t.eos_ids.clone(),
            add_bos: t.add_bos,
            chat_template: t.chat_template.clone(),
        }),
        weights: PlanWeights {
            source: m.weights_path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| format!("seeded (seed {})", t.weights.seed.unwrap_or(0))),
            source_sha256,
            total_bytes: 0,
            tensors: vec![],
        },
    })
}

/// Write the plan: the graph, and every weight the graph uses, in graph order.
pub fn write(c: &Compiled, out: &Path) -> anyhow::Result<()> {
    let header = plan_header(c)?;
    let order = c.graph.topo_order()?;
    let mut items = vec![];
    for id in order {
        let n = c.graph.node(id);
        if matches!(n.op, dsc_ir::Op::Weight) {
            let w = c.model.weights.get(&n.name).with_context(|| format!("weight `{}` vanished", n.name))?;
            items.push((n.name.clone(), w.dtype, w.shape.clone(), w.bytes.as_slice()));
        }
    }
    write_plan(out, header, items)?;
    Ok(())
}
