//! The H200 cost model: bytes moved and FLOPs of every kernel of one step, and the time the
//! hardware needs for them at best (bytes at 4.62 TB/s — a plain streaming read measured on
//! this H200 — or FLOPs at the tensor-core rate, whichever is longer, plus a per-launch cost).
//! The optimizer's extraction (issue 4) and the per-kernel roofline table in docs/perf.md use
//! it. Activations are counted in their graph dtype (f32 today), weights in their stored dtype;
//! attention reads `context` cached positions per token in the KV pools' type (f32 or bf16).

use dsc_ir::{DType, Graph, Op};
use std::collections::BTreeMap;

/// H200 numbers (../shared/docs/GPU.md).
pub const BYTES_PER_S: f64 = 4.62e12;
pub const TENSOR_FLOPS: f64 = 800e12;
pub const CUDA_FLOPS: f64 = 60e12;
/// a dependent kernel in a CUDA graph costs at least this much (launch + ramp + drain)
pub const LAUNCH_S: f64 = 2.5e-6;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelCost {
    pub launches: usize,
    pub bytes: f64,
    pub flops: f64,
}

impl KernelCost {
    /// Best-case time: the larger of memory and compute time, plus launch costs.
    pub fn roofline_s(&self, tensor_cores: bool) -> f64 {
        let f = if tensor_cores { TENSOR_FLOPS } else { CUDA_FLOPS };
        (self.bytes / BYTES_PER_S).max(self.flops / f) + self.launches as f64 * LAUNCH_S
    }
}

fn nbytes(d: DType, n: usize) -> f64 {
    d.bytes_for(n).map(|b| b as f64).unwrap_or(n as f64 * 4.0)
}

/// Cost of one step of `tokens` tokens (one sequence, `context` positions cached), grouped by
/// kernel class (op name + weight shape for matmuls), in graph order of first appearance.
/// With the plan's GPU program, kernels fused by the lowering count as the one launch they are.
pub fn step_cost(g: &Graph, gpu: Option<&dsc_runtime::plan::GpuProgram>, tokens: usize, context: usize) -> Vec<(String, KernelCost)> {
    let bind = BTreeMap::from([("T".to_string(), tokens), ("S".to_string(), 1), ("R".to_string(), 1), ("MB".to_string(), context.div_ceil(16)), ("NB".to_string(), context.div_ceil(16))]);
    let numel = |id| g.node(id).ty.eval_shape(&bind).map(|s| s.iter().product::<usize>()).unwrap_or(0);
    let mut out: Vec<(String, KernelCost)> = vec![];
    let Ok(order) = g.topo_order() else { return out };
    // which steps run at this many tokens and this context (a step's rows are its node's:
    // tokens x heads for the attention, tokens for a matmul)
    let rows_of = |node: &str| -> i64 { g.by_name(node).and_then(|id| g.node(id).ty.eval_shape(&bind)).filter(|s| !s.is_empty()).map_or(tokens, |s| s[..s.len() - 1].iter().product()) as i64 };
    let runs = |s: &dsc_runtime::plan::GpuStep| {
        let (t, c) = (rows_of(&s.node), context as i64);
        s.min_rows.is_none_or(|m| t >= m) && s.max_rows.is_none_or(|m| t <= m) && s.min_context.is_none_or(|m| c >= m) && s.max_context.is_none_or(|m| c <= m)
    };
    // nodes skipped here: none of their steps runs (their work is in another kernel — the
    // SwiGLU in the gate/up GEMV's epilogue — or a node has copies for other rows and contexts:
    // split-K, the split attention, the one-token attention with RoPE folded in)
    let skipped: std::collections::HashSet<&str> = gpu
        .map(|p| {
            let active: std::collections::HashSet<&str> = p.steps.iter().filter(|s| runs(s)).map(|s| s.node.as_str()).collect();
            p.steps.iter().map(|s| s.node.as_str()).filter(|n| !active.contains(n)).collect()
        })
        .unwrap_or_default();
    // weights the running kernels read (a matmul whose own steps do not run but whose weights
    // are here had its work fused into another kernel)
    let fused_weights: std::collections::HashSet<&str> = gpu
        .map(|p| {
            p.steps
                .iter()
                .filter(|s| runs(s) && s.kernel.is_some())
                .flat_map(|s| s.args.iter().map(String::as_str))
                .filter(|a| g.by_name(a).is_some_and(|id| matches!(g.node(id).op, Op::Weight)))
                .collect()
        })
        .unwrap_or_default();
    // the GPU schedule's lowering-level fusions among the running steps: nodes whose step
    // launches nothing (their work is in another node's kernel) and nodes whose step runs a
    // fused kernel
    let lowered: std::collections::HashMap<&str, Option<&str>> = gpu.map(|p| p.steps.iter().filter(|s| runs(s)).map(|s| (s.node.as_str(), s.kernel.as_deref())).collect()).unwrap_or_default();
    for id in order {
        let n = g.node(id);
        if n.op.is_leaf() || matches!(n.op, Op::Reshape | Op::AllReduce) || (matches!(n.op, Op::Cast) && g.node(g.operands(id)[0]).ty.dtype == n.ty.dtype) || dsc_passes::is_part_view(g, id) {
            continue;
        }
        let ops = g.operands(id);
        let out_b = nbytes(n.ty.dtype, numel(id));
        let (key, bytes, flops) = match &n.op {
            Op::MatMul { .. } | Op::MatMulAdd { .. } | Op::MatMulAct { .. } => {
                let w = g.node(ops[1]);
                let s: Vec<usize> = w.ty.shape.iter().filter_map(|d| d.as_const()).collect();
                let (nn, k) = (s[0], s[1]);
                let m = numel(id) / nn.max(1);
                let (tag, res) = if matches!(n.op, Op::MatMulAdd { .. }) { ("+residual", out_b) } else { ("", 0.0) };
                (format!("matmul {k}x{nn} {}{tag}", w.ty.dtype), nbytes(w.ty.dtype, nn * k) + (m * k) as f64 * 4.0 + out_b + res, 2.0 * (m * nn * k) as f64)
            }
            Op::MatMulCat => {
                let ws: Vec<&dsc_ir::Node> = ops[1..].iter().map(|&w| g.node(w)).collect();
                let k = ws[0].ty.shape[1].as_const().unwrap_or(0);
                let nn: usize = ws.iter().map(|w| w.ty.shape[0].as_const().unwrap_or(0)).sum();
                let m = numel(id) / nn.max(1);
                let wb: f64 = ws.iter().map(|w| nbytes(w.ty.dtype, w.ty.shape[0].as_const().unwrap_or(0) * k)).sum();
                let parts: Vec<String> = ws.iter().map(|w| w.ty.shape[0].as_const().unwrap_or(0).to_string()).collect();
                (format!("matmul {k}x({}) {} merged", parts.join("+"), ws[0].ty.dtype), wb + (m * k) as f64 * 4.0 + out_b, 2.0 * (m * nn * k) as f64)
            }
            Op::PagedAttention { .. } => {
                let kc = g.node(ops[1]);
                let row: usize = kc.ty.shape[2..].iter().filter_map(|d| d.as_const()).product();
                let q = numel(ops[0]) as f64;
                // K and V rows of every cached position, per token
                (n.op.name().to_string(), nbytes(kc.ty.dtype, 2 * tokens * context * row) + q * 4.0 + out_b, 4.0 * q * context as f64)
            }
            // x in, rows out in the pool's type
            Op::CacheWrite => (n.op.name().to_string(), numel(ops[1]) as f64 * 4.0 + nbytes(n.ty.dtype, numel(ops[1])), 0.0),
            // ... and positions and slots
            Op::RopeCacheWrite { .. } => (n.op.name().to_string(), numel(ops[1]) as f64 * 4.0 + nbytes(n.ty.dtype, numel(ops[1])) + 8.0 * numel(ops[2]) as f64, numel(ops[1]) as f64 * 3.0),
            Op::Gather => (n.op.name().to_string(), 2.0 * out_b, 0.0),
            // each token reads its context's latent rows once for all heads
            Op::MlaAttention { kv_lora_rank, .. } => {
                let cache = g.node(ops[1]);
                let c = cache.ty.shape[3].as_const().unwrap_or(0);
                let q = numel(ops[0]) as f64;
                (n.op.name().to_string(), nbytes(cache.ty.dtype, tokens * context * c) + q * 4.0 + out_b, 2.0 * q / c.max(1) as f64 * context as f64 * (c + kv_lora_rank) as f64)
            }
            Op::HeadMatMul { .. } => {
                let w = g.node(ops[1]);
                let inb: f64 = ops.iter().map(|&o| nbytes(g.node(o).ty.dtype, numel(o))).sum();
                let k = g.node(ops[0]).ty.shape[2].as_const().unwrap_or(0);
                (format!("head_matmul {}", w.ty.dtype), inb + out_b, 2.0 * numel(id) as f64 * k as f64)
            }
            // the experts the tokens chose: at most tokens x top_k of them are read
            Op::MoeExperts => {
                let gate = g.node(ops[2]);
                let s: Vec<usize> = gate.ty.shape.iter().filter_map(|d| d.as_const()).collect();
                let (e, i, d) = (s[0], s[1], s[2]);
                let k = match g.node(ops[1]).op {
                    Op::MoeRoute(r) => r.top_k,
                    _ => e,
                };
                let active = e.min(tokens * k);
                (
                    format!("moe_experts {e}x(3x{i}x{d}) {} top-{k}", gate.ty.dtype),
                    nbytes(gate.ty.dtype, active * 3 * i * d) + (ops.len() - 3) as f64 * numel(ops[0]) as f64 * 4.0,
                    6.0 * (tokens * k * i * d) as f64,
                )
            }
            op => {
                let inb: f64 = ops.iter().map(|&o| nbytes(g.node(o).ty.dtype, numel(o))).sum();
                (op.name().to_string(), inb + out_b, numel(id) as f64 * 2.0)
            }
        };
        // rope(q) + rope_cache_write(k) + cache_write(v) of one merged Q/K/V matmul: one kernel
        // (a matmul none of whose steps runs but whose weights a running kernel reads: its
        // work is fused into that kernel — the one-token MLP, the attention with the o
        // projection — and counts there, without a launch of its own)
        // (the weights: a matmul_add's residual is an activation — the routed experts' output
        // where the one-token MoE fusion computes the shared experts in their kernels)
        let fused = matches!(n.op, Op::MatMul { .. } | Op::MatMulAdd { .. } | Op::MatMulCat)
            && ops[1..].iter().filter(|&&w| matches!(g.node(w).op, Op::Weight)).all(|&w| fused_weights.contains(g.node(w).name.as_str()));
        if skipped.contains(n.name.as_str()) && !fused {
            // (its bytes were the cat's output and its own: neither is written now)
            continue;
        }
        let (key, launches) = match lowered.get(n.name.as_str()) {
            _ if skipped.contains(n.name.as_str()) => (format!("{key} (fused)"), 0),
            Some(Some(k)) if k.starts_with("qkv_rope_cache") => ("qkv_rope_cache (rope q, k and v cache writes)".to_string(), 1),
            Some(None) if matches!(n.op, Op::Rope { .. } | Op::RopeCacheWrite { .. } | Op::CacheWrite) => ("qkv_rope_cache (rope q, k and v cache writes)".to_string(), 0),
            _ => (key, 1),
        };
        match out.iter_mut().find(|(k, _)| *k == key) {
            Some((_, c)) => {
                c.launches += launches;
                c.bytes += bytes;
                c.flops += flops;
            }
            None => out.push((key, KernelCost { launches, bytes, flops })),
        }
    }
    out
}

/// Totals over the classes.
pub fn total(costs: &[(String, KernelCost)]) -> KernelCost {
    costs.iter().fold(KernelCost::default(), |a, (_, c)| KernelCost { launches: a.launches + c.launches, bytes: a.bytes + c.bytes, flops: a.flops + c.flops })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_step_is_its_weight_bytes() {
        let g = dsc_ir::text::parse(
            "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %w = weight : bf16[1024, 4096]\n  %y = matmul(%x, %w) {transpose_b = true} : f32[T, 1024]\n  %z = silu(%y) : f32[T, 1024]\n  output z = %z\n}\n",
        )
        .unwrap();
        let c = step_cost(&g, None, 1, 1);
        assert_eq!(c.len(), 2);
        let (k, m) = &c[0];
        assert_eq!(k, "matmul 4096x1024 bf16");
        // weights dominate: 8 MiB of bf16, plus 16 KiB in and 4 KiB out
        assert_eq!(m.bytes, (1024 * 4096 * 2 + 4096 * 4 + 1024 * 4) as f64);
        assert_eq!(m.flops, 2.0 * 1024.0 * 4096.0);
        let t = total(&c);
        assert_eq!(t.launches, 2);
        // memory-bound: 8.4 MB at 4.62 TB/s ~ 1.8 us, plus two launches
        let s = t.roofline_s(false);
        assert!(s > 1.8e-6 + 2.0 * LAUNCH_S && s < 2.0e-6 + 2.0 * LAUNCH_S, "{s}");
    }
}
