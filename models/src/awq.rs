//! Activation-aware scale search before integer rounding (AWQ: Lin et al., "AWQ:
//! Activation-aware Weight Quantization for LLM Compression and Acceleration", 2023; the
//! reference is llm-awq's `auto_scale`). For the llama family.
//!
//! A matrix's input channels that see large activations matter more than others; scaling
//! column c of W up by s_c (and its input down by 1/s_c) leaves x·Wᵀ unchanged in exact
//! arithmetic but gives that column a finer share of the group's quantization grid. Per layer,
//! each group of matrices that read one input — W_q/W_k/W_v (the attention RMSNorm's output),
//! W_gate/W_up (the MLP RMSNorm's), W_down (the SwiGLU product) — gets s = mean|x|^α over
//! calibration tokens (normalized to a geometric mean of 1), α from a grid of 20 in [0, 1)
//! minimizing ‖X·(Q(W·s)/s − W)ᵀ‖² summed over the group's matrices; α = 0 is plain
//! round-to-nearest, so the search never does worse than it on the calibration tokens. The
//! 1/s folds into what produces the input: the RMSNorm weight, or W_up's rows for W_down (the
//! SwiGLU product is linear in up). W_o is scaled only where 1/s can fold into W_v's rows:
//! one query head per KV head and no biases (not under GQA, as in llm-awq). The weight
//! clipping search of the paper is not done.
//!
//! Activations come from the CPU executor running the model as loaded (one prefill of the
//! calibration tokens). Groups are scaled only where every matrix they touch is re-encoded by
//! the policy (an int format): a matrix kept as stored is never rewritten.

use crate::config::Dims;
use crate::error::{ModelError, Result};
use crate::llama::Naming;
use crate::quantize::{Format, IntSpec, LayerKind, Policy};
use crate::weights::{Bytes, WeightSet};
use dsc_ir::exec::{Executor, Tensor};
use dsc_ir::{DType, Graph};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// What produces a group's input, where 1/s folds in.
enum Prev {
    /// an RMSNorm weight (a vector)
    Norm(String),
    /// the rows of a matrix (its outputs)
    Rows(String),
}

struct Group {
    /// the graph node whose value is the matrices' input
    input: String,
    mats: Vec<String>,
    prev: Prev,
}

/// The search's outcome, for the compile summary.
#[derive(Clone, Debug, Default)]
pub struct AwqReport {
    pub tokens: usize,
    /// (first matrix of the group, α, error with the chosen scales / error of round-to-nearest)
    pub groups: Vec<(String, f32, f64)>,
}

impl AwqReport {
    pub fn summary(&self) -> String {
        if self.groups.is_empty() {
            return format!("awq: no group to scale ({} calibration tokens)", self.tokens);
        }
        let n = self.groups.len() as f64;
        let alpha = self.groups.iter().map(|g| g.1 as f64).sum::<f64>() / n;
        let ratio = self.groups.iter().map(|g| g.2).sum::<f64>() / n;
        format!("awq: {} matrix groups scaled on {} calibration tokens, mean α {alpha:.2}, output error {ratio:.2}x round-to-nearest's", self.groups.len(), self.tokens)
    }
}

fn err(path: &Path, tensor: &str, msg: String) -> ModelError {
    ModelError::Tensor { path: path.to_path_buf(), tensor: tensor.into(), msg }
}

/// The values of a tensor as f32.
fn values(ws: &WeightSet, name: &str, path: &Path) -> Result<Vec<f32>> {
    let t = ws.get(name).ok_or_else(|| err(path, name, "not in the checkpoint".into()))?;
    let n: usize = t.shape.iter().product();
    dsc_ir::quant::decode(t.dtype, t.bytes.as_slice(), n).ok_or_else(|| err(path, name, "stored bytes do not match its shape".into()))
}

fn store_f32(ws: &mut WeightSet, name: &str, v: &[f32]) {
    if let Some(t) = ws.tensors.get_mut(name) {
        t.dtype = DType::F32;
        t.bytes = Bytes::Owned(Arc::new(v.iter().flat_map(|x| x.to_le_bytes()).collect()));
    }
}

/// Search the scales on `tokens`, fold them into the weights (left as f32 for the policy to
/// encode), and report. `graph`: the model as loaded, run on the CPU executor for the
/// activations.
#[allow(clippy::too_many_arguments)]
pub fn search_and_scale(graph: &Graph, ws: &mut WeightSet, tokens: &[u32], naming: Naming, dims: &Dims, kv_block: usize, policy: &Policy, path: &Path) -> Result<AwqReport> {
    let int = |name: &str| -> Option<IntSpec> {
        match policy.format_for(LayerKind::of(name, false)) {
            Format::Int(i) => Some(i),
            _ => None,
        }
    };
    let w = |i: usize, m: &str| format!("{}.weight", naming.layer(i, m));
    let mut groups = vec![];
    for i in 0..dims.layers {
        let node_in = |m: &str| -> Option<String> {
            let id = graph.by_name(&naming.layer(i, m))?;
            graph.operands(id).first().map(|&x| graph.node(x).name.clone())
        };
        let mut add = |m: &str, mats: Vec<String>, prev: Prev| {
            let prev_ok = match &prev {
                Prev::Norm(_) => true,
                Prev::Rows(r) => int(r).is_some(),
            };
            if let (Some(input), true, true) = (node_in(m), mats.iter().all(|m| int(m).is_some()), prev_ok) {
                groups.push(Group { input, mats, prev });
            }
        };
        add("attn_q", vec![w(i, "attn_q"), w(i, "attn_k"), w(i, "attn_v")], Prev::Norm(w(i, "attn_norm")));
        if dims.heads == dims.kv_heads && !dims.attention_bias {
            add("attn_output", vec![w(i, "attn_output")], Prev::Rows(w(i, "attn_v")));
        }
        add("ffn_gate", vec![w(i, "ffn_gate"), w(i, "ffn_up")], Prev::Norm(w(i, "ffn_norm")));
        add("ffn_down", vec![w(i, "ffn_down")], Prev::Rows(w(i, "ffn_up")));
    }
    let mut report = AwqReport { tokens: tokens.len(), groups: vec![] };
    if groups.is_empty() || tokens.is_empty() {
        return Ok(report);
    }
    let acts = calibrate(graph, ws, tokens, kv_block, &groups, path)?;
    for g in &groups {
        let x = acts.get(&g.input).ok_or_else(|| err(path, &g.input, "calibration did not return this activation".into()))?;
        let cols = *x.shape.last().unwrap_or(&0);
        let t = x.data.len() / cols.max(1);
        let mut mean = vec![0f64; cols];
        for row in x.data.chunks_exact(cols) {
            for (m, v) in mean.iter_mut().zip(row) {
                *m += v.abs() as f64;
            }
        }
        let mean: Vec<f32> = mean.iter().map(|m| (m / t as f64) as f32).collect();
        let mats: Vec<(String, Vec<f32>, IntSpec)> = g.mats.iter().map(|m| Ok((m.clone(), values(ws, m, path)?, int(m).expect("checked")))).collect::<Result<_>>()?;
        let mut best: Option<(f32, f64, Vec<f32>)> = None;
        let mut rtn = 0.0;
        for step in 0..20 {
            let alpha = step as f32 / 20.0;
            let s = scales(&mean, alpha);
            let mut e = 0.0;
            for (name, wv, spec) in &mats {
                let scaled: Vec<f32> = wv.chunks_exact(cols).flat_map(|r| r.iter().zip(&s).map(|(a, b)| a * b)).collect();
                let q = spec.round_trip(&scaled, cols).map_err(|m| err(path, name, m))?;
                let delta: Vec<f32> = q.chunks_exact(cols).zip(wv.chunks_exact(cols)).flat_map(|(qr, wr)| qr.iter().zip(wr).zip(&s).map(|((a, b), c)| a / c - b)).collect();
                e += output_error(&x.data, t, cols, &delta);
            }
            if step == 0 {
                rtn = e;
            }
            if best.as_ref().is_none_or(|b| e < b.1) {
                best = Some((alpha, e, s));
            }
        }
        let (alpha, e, s) = best.expect("20 candidates");
        for (name, wv, _) in &mats {
            let scaled: Vec<f32> = wv.chunks_exact(cols).flat_map(|r| r.iter().zip(&s).map(|(a, b)| a * b)).collect();
            store_f32(ws, name, &scaled);
        }
        match &g.prev {
            Prev::Norm(n) => {
                let v: Vec<f32> = values(ws, n, path)?.iter().zip(&s).map(|(a, b)| a / b).collect();
                store_f32(ws, n, &v);
            }
            Prev::Rows(n) => {
                let v = values(ws, n, path)?;
                let row = v.len() / cols;
                let v: Vec<f32> = v.chunks_exact(row).zip(&s).flat_map(|(r, c)| r.iter().map(move |a| a / c)).collect();
                store_f32(ws, n, &v);
            }
        }
        report.groups.push((g.mats[0].clone(), alpha, if rtn > 0.0 { e / rtn } else { 1.0 }));
    }
    Ok(report)
}

/// s = mean^α, floored, normalized so that sqrt(max · min) = 1 (llm-awq's normalization).
fn scales(mean: &[f32], alpha: f32) -> Vec<f32> {
    let s: Vec<f32> = mean.iter().map(|m| m.max(1e-4).powf(alpha).max(1e-4)).collect();
    let (lo, hi) = s.iter().fold((f32::INFINITY, 0f32), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    let norm = (lo * hi).sqrt();
    s.iter().map(|v| v / norm).collect()
}

/// ‖X · Δᵀ‖² for X [t, k] and Δ [n, k] (row-major), through sgemm.
fn output_error(x: &[f32], t: usize, k: usize, delta: &[f32]) -> f64 {
    let n = delta.len() / k;
    let mut y = vec![0f32; t * n];
    // SAFETY: x is t·k, delta n·k (read as its transpose, k·n, with row stride 1 and column
    // stride k), y t·n; the strides stay inside those buffers
    unsafe {
        matrixmultiply::sgemm(t, k, n, 1.0, x.as_ptr(), k as isize, 1, delta.as_ptr(), 1, k as isize, 0.0, y.as_mut_ptr(), n as isize, 1);
    }
    y.iter().map(|v| (*v as f64) * (*v as f64)).sum()
}

/// One prefill of `tokens` on the CPU executor, returning the groups' input activations.
fn calibrate(graph: &Graph, ws: &WeightSet, tokens: &[u32], kv_block: usize, groups: &[Group], path: &Path) -> Result<BTreeMap<String, Tensor>> {
    let keep: Vec<_> = groups.iter().filter_map(|g| graph.by_name(&g.input)).collect();
    run_prompt(graph, ws, tokens, kv_block, &keep, "awq calibration", path)
}

/// Run `tokens` as one prompt through the CPU executor and return the `keep` nodes' values
/// (calibration: AWQ here, Wanda in `sparsity`); errors say `what` ran.
pub(crate) fn run_prompt(graph: &Graph, ws: &WeightSet, tokens: &[u32], kv_block: usize, keep: &[dsc_ir::NodeId], what: &str, path: &Path) -> Result<BTreeMap<String, Tensor>> {
    let t = tokens.len();
    let blocks = t.div_ceil(kv_block).max(1);
    let xerr = |e: dsc_ir::IrError| ModelError::Format { path: path.to_path_buf(), msg: format!("{what} run: {e}") };
    let mut exec = Executor::new(graph, ws, BTreeMap::from([("NB".to_string(), blocks)])).map_err(xerr)?;
    exec.keep(keep);
    let ints = |v: Vec<i32>| Tensor::from_i32(vec![v.len()], &v);
    let seq: Vec<i32> = (0..t as i32).collect();
    let inputs = BTreeMap::from([
        ("tokens".to_string(), ints(tokens.iter().map(|&x| x as i32).collect())),
        ("positions".to_string(), ints(seq.clone())),
        ("seq_ids".to_string(), ints(vec![0; t])),
        ("slots".to_string(), ints(seq)),
        ("block_table".to_string(), Tensor::from_i32(vec![1, blocks], &(0..blocks as i32).collect::<Vec<_>>())),
        ("logit_rows".to_string(), ints(vec![t as i32 - 1])),
    ]);
    exec.run(&inputs).map_err(xerr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_error_is_the_squared_norm_of_x_delta_t() {
        let (t, k, n) = (3, 4, 2);
        let x: Vec<f32> = (0..t * k).map(|i| i as f32 * 0.5 - 2.0).collect();
        let d: Vec<f32> = (0..n * k).map(|i| (i as f32 - 3.0) * 0.25).collect();
        let mut want = 0.0;
        for a in 0..t {
            for b in 0..n {
                let y: f32 = (0..k).map(|c| x[a * k + c] * d[b * k + c]).sum();
                want += (y * y) as f64;
            }
        }
        assert!((output_error(&x, t, k, &d) - want).abs() < 1e-4 * want);
    }

    #[test]
    fn scales_have_unit_geometric_midpoint() {
        let s = scales(&[0.01, 1.0, 4.0], 0.5);
        let (lo, hi) = (s.iter().copied().fold(f32::INFINITY, f32::min), s.iter().copied().fold(0f32, f32::max));
        assert!(((lo * hi).sqrt() - 1.0).abs() < 1e-5);
        assert!(scales(&[0.01, 1.0, 4.0], 0.0).iter().all(|v| (v - 1.0).abs() < 1e-6), "α = 0 is round-to-nearest");
    }
}
