//! N:M structured sparsity at compile time (model.toml `precision.sparsity`, `dsc compile
//! --sparsity 2:4`): the chosen weight matrices keep N of every M consecutive values of a row.
//!
//! - Scores: `magnitude` (|W|), or `wanda` (|W| · ‖x_k‖₂, Sun et al. 2023: the weight times the
//!   L2 norm of its input feature over calibration tokens — the same text and token count as
//!   AWQ's calibration, run through the CPU executor on the model as built). Within each group
//!   of M the N highest scores stay (the earlier value on a tie), the rest become 0. No weight
//!   update (SparseGPT's) and no fine-tuning: a one-shot prune.
//! - 2:4 matrices are stored as [`DType::Sp24Bf16`] (the kept values in bf16 and their 2-bit
//!   positions, what sparse tensor cores read); 4:8, which the hardware has no format for, as
//!   bf16 with its zeros (an accuracy option).
//! - Layer types: `precision.sparse_layers` (default attn_o and mlp; the sensitive types —
//!   Q/K/V, router, lm_head, embeddings — only when named). A sparse layer keeps 16-bit
//!   values: its weight format must be `stored`, f32, bf16 or f16 (with FP8/INT8: still to come).

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::quantize::LayerKind;
use crate::weights::{Bytes, WeightSet, WeightTensor};
use dsc_ir::{quant, DType, Graph, Op};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// How the values to drop are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Magnitude,
    Wanda,
}

/// `precision.sparsity` and its companions.
#[derive(Clone, Debug, PartialEq)]
pub struct SparsitySpec {
    /// kept values per group
    pub n: usize,
    /// group size
    pub m: usize,
    pub method: Method,
    pub layers: Vec<LayerKind>,
}

impl SparsitySpec {
    /// `none` → None; `2:4` or `4:8`, a method and the layer types (None: attn_o and mlp).
    pub fn parse(pattern: &str, method: &str, layers: Option<&[String]>) -> std::result::Result<Option<SparsitySpec>, String> {
        let (n, m) = match pattern {
            "none" => return Ok(None),
            "2:4" => (2, 4),
            "4:8" => (4, 8),
            other => return Err(format!("field `precision.sparsity`: `{other}` (none, 2:4, 4:8)")),
        };
        let method = match method {
            "magnitude" => Method::Magnitude,
            "wanda" => Method::Wanda,
            other => return Err(format!("field `precision.sparsity_method`: `{other}` (magnitude, wanda)")),
        };
        let layers = match layers {
            None => vec![LayerKind::AttnO, LayerKind::Mlp],
            Some(ls) => ls
                .iter()
                .map(|k| {
                    LayerKind::ALL.into_iter().find(|l| l.key() == k).ok_or_else(|| {
                        let keys: Vec<_> = LayerKind::ALL.iter().map(|l| l.key()).collect();
                        format!("field `precision.sparse_layers`: `{k}` is not a layer type (one of {})", keys.join(", "))
                    })
                })
                .collect::<std::result::Result<_, _>>()?,
        };
        if layers.contains(&LayerKind::Experts) {
            return Err("field `precision.sparse_layers`: the routed experts' stacked weights are not pruned yet".into());
        }
        Ok(Some(SparsitySpec { n, m, method, layers }))
    }

    pub fn name(&self) -> String {
        let m = match self.method {
            Method::Magnitude => "magnitude",
            Method::Wanda => "wanda",
        };
        let ls: Vec<_> = self.layers.iter().map(|l| l.key()).collect();
        format!("{}:{} {m} ({})", self.n, self.m, ls.join(", "))
    }
}

/// What the pass did, for the compile summary.
#[derive(Clone, Debug, Default)]
pub struct SparsityReport {
    pub matrices: usize,
    pub pruned_values: usize,
    pub total_values: usize,
    pub calibration_tokens: usize,
}

/// Prune the matrices of `spec.layers` in `ws` (values as the policy left them), scoring with
/// `graph` run on `tokens` for Wanda. `tied`: the embedding table is the lm_head.
#[allow(clippy::too_many_arguments)]
pub fn prune(config: &ModelConfig, spec: &SparsitySpec, graph: &Graph, ws: &mut WeightSet, tokens: &[u32], kv_block: usize, tied: bool, path: &Path) -> Result<SparsityReport> {
    let terr = |name: &str, msg: String| ModelError::Tensor { path: path.into(), tensor: name.into(), msg };
    let chosen: Vec<String> = ws.tensors.iter().filter(|(n, t)| t.shape.len() == 2 && LayerKind::of(n, tied).is_some_and(|k| spec.layers.contains(&k))).map(|(n, _)| n.clone()).collect();
    for name in &chosen {
        let t = &ws.tensors[name];
        let kind = LayerKind::of(name, tied).expect("chosen by kind");
        if config.policy.format_for(Some(kind)).quantized()
            || !matches!(t.dtype, DType::F32 | DType::BF16 | DType::F16 | DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q4_K | DType::Q5_K | DType::Q6_K)
        {
            return Err(terr(name, format!("{} weights with {}:{} sparsity: a sparse layer keeps 16-bit values (its `precision.weights` must be stored, f32, bf16 or f16)", t.dtype, spec.n, spec.m)));
        }
        let k = t.shape[1];
        let block = if spec.m == 4 { 32 } else { spec.m };
        if !k.is_multiple_of(block) {
            return Err(terr(name, format!("rows of {k} values are not whole {block}-value blocks of {}:{} sparsity", spec.n, spec.m)));
        }
    }
    // Wanda: ‖x_k‖₂ of every chosen matrix's input over the calibration tokens
    let norms = match spec.method {
        Method::Magnitude => BTreeMap::new(),
        Method::Wanda => input_norms(graph, ws, &chosen, tokens, kv_block, path)?,
    };
    let mut report = SparsityReport { calibration_tokens: if spec.method == Method::Wanda { tokens.len() } else { 0 }, ..Default::default() };
    for name in &chosen {
        let t = ws.tensors.get_mut(name).expect("chosen");
        let (rows, k) = (t.shape[0], t.shape[1]);
        let mut v = quant::decode(t.dtype, t.bytes.as_slice(), rows * k).ok_or_else(|| terr(name, "stored bytes do not match its shape".into()))?;
        let norm = norms.get(name);
        for row in v.chunks_exact_mut(k) {
            for (gi, grp) in row.chunks_exact_mut(spec.m).enumerate() {
                let score = |j: usize| grp[j].abs() * norm.map_or(1.0, |nv: &Vec<f32>| nv[gi * spec.m + j]);
                let mut idx: Vec<usize> = (0..spec.m).collect();
                idx.sort_by(|&a, &b| score(b).total_cmp(&score(a)).then(a.cmp(&b)));
                for &j in &idx[spec.n..] {
                    if grp[j] != 0.0 {
                        report.pruned_values += 1;
                    }
                    grp[j] = 0.0;
                }
            }
        }
        report.matrices += 1;
        report.total_values += rows * k;
        let dtype = if spec.m == 4 { DType::Sp24Bf16 } else { DType::BF16 };
        let bytes = quant::encode(dtype, &v).ok_or_else(|| terr(name, format!("{} values are not whole {dtype} blocks", v.len())))?;
        *t = WeightTensor { dtype, shape: t.shape.clone(), bytes: Bytes::Owned(Arc::new(bytes)) };
    }
    Ok(report)
}

/// The L2 norm of each input feature of the matmuls reading `weights`, over `tokens` run as
/// one prompt through the CPU executor.
fn input_norms(graph: &Graph, ws: &WeightSet, weights: &[String], tokens: &[u32], kv_block: usize, path: &Path) -> Result<BTreeMap<String, Vec<f32>>> {
    // (the weight's matmul and that matmul's input)
    let mut input_of: BTreeMap<String, dsc_ir::NodeId> = BTreeMap::new();
    for id in graph.node_ids() {
        if let Op::MatMul { transpose_b: true } = graph.node(id).op {
            let ops = graph.operands(id);
            let w = &graph.node(ops[1]).name;
            if weights.contains(w) {
                input_of.insert(w.clone(), ops[0]);
            }
        }
    }
    if let Some(w) = weights.iter().find(|w| !input_of.contains_key(*w)) {
        return Err(ModelError::Tensor { path: path.into(), tensor: w.clone(), msg: "wanda: no matmul of the graph reads this weight as x @ W^T".into() });
    }
    if tokens.is_empty() {
        return Err(ModelError::Format { path: path.into(), msg: "wanda calibration: no tokens".into() });
    }
    let keep: Vec<_> = input_of.values().copied().collect();
    let acts = crate::awq::run_prompt(graph, ws, tokens, kv_block, &keep, "wanda calibration", path)?;
    let mut out = BTreeMap::new();
    for (w, id) in input_of {
        let x = acts.get(&graph.node(id).name).ok_or_else(|| ModelError::Format { path: path.into(), msg: format!("wanda calibration: `{}` was not kept", graph.node(id).name) })?;
        let k = *x.shape.last().unwrap_or(&1);
        let mut sq = vec![0f64; k];
        for row in x.data.chunks_exact(k) {
            for (s, v) in sq.iter_mut().zip(row) {
                *s += (*v as f64) * (*v as f64);
            }
        }
        out.insert(w, sq.into_iter().map(|s| s.sqrt() as f32).collect());
    }
    Ok(out)
}
