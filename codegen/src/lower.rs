//! Graph → launch schedule: one kernel launch (or a buffer alias) per compute node, in
//! topological order, with the kernel specs to generate. Scalars and grid sizes are
//! expressions over node shapes, evaluated by the runtime once a step binds its symbols.

use crate::kernels::{BinaryOpKey, KernelSpec, UnaryOpKey};
use crate::CodegenError;
use dsc_ir::{DType, Graph, Op, RopeStyle};

/// A runtime-evaluated integer. Mirrors `dsc_runtime::plan::Scalar` (codegen and the runtime
/// do not depend on each other; the compiler converts when it writes the plan).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scalar {
    Const(i64),
    /// element count of a node
    Numel(String),
    /// element count / last dim
    Rows(String),
    /// one dim of a node
    Dim(String, usize),
    /// rows of a node (element count / last dim) times a constant
    RowsTimes(String, i64),
    /// element count / 2 (rope works on pairs)
    HalfNumel(String),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Step {
    pub node: String,
    /// kernel symbol; None when the node only aliases another buffer
    pub kernel: Option<KernelSpec>,
    /// buffers passed to the kernel: operands then the output
    pub args: Vec<String>,
    pub scalars: Vec<Scalar>,
    /// grid: x covers `work` units of the kernel's launch shape, y = `grid_y`
    pub work: Scalar,
    pub grid_y: Scalar,
    /// the node's buffer is this node's buffer (reshape, same-dtype cast, cache_write)
    pub alias_of: Option<String>,
    /// ... starting this many elements in (a part of a merged matmul's output)
    pub alias_offset: Option<Scalar>,
    /// a kernel for large steps, used when the output has at least `min_rows` rows (the
    /// tensor-core matmul for prefill; the default kernel is the decode GEMV path)
    pub large: Option<Large>,
    /// on sm_90a, used instead of `large` (the wgmma matmul, 64-column tiles)
    pub hopper: Option<Large>,
    /// on sm_90a for fewer rows than `hopper` takes (16-column tiles: more blocks)
    pub hopper_small: Option<Large>,
    /// on any target, for `min_rows..=max_rows` rows, before all of the above: the batched
    /// decode GEMV (each weight read once per 8 rows)
    pub few: Option<Large>,
    /// a collective over the tensor-parallel group, done in place on the aliased buffer
    /// ("all_reduce_sum"); the runtime issues it (NCCL, or local copies when simulating)
    pub collective: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Large {
    pub min_rows: i64,
    /// used only up to this many rows (none: no bound)
    pub max_rows: Option<i64>,
    pub kernel: KernelSpec,
    pub scalars: Vec<Scalar>,
    pub work: Scalar,
    pub grid_y: Scalar,
}

/// Warps per block of the decode attention kernel (DSC_ATTN_WARPS overrides, 1..=32, for
/// sweeps). 16 measured fastest on the H200 (8B b1 194 -> 213 tok/s, SmolLM2 b1 830 -> 1081 vs 4:
/// bench/results/attn16-rope-cache-write-2026-11-29.json).
fn attention_warps() -> usize {
    std::env::var("DSC_ATTN_WARPS").ok().and_then(|v| v.parse().ok()).filter(|w| (1..=32).contains(w)).unwrap_or(16)
}

/// The most rows the batched-decode GEMV takes (DSC_GEMV_FEW_MAX overrides, for sweeps).
fn few_max_rows() -> i64 {
    std::env::var("DSC_GEMV_FEW_MAX").ok().and_then(|v| v.parse().ok()).unwrap_or(128)
}

/// (heads, head dim) of a RoPE input x[T, H, D], which the kernels rotate whole.
fn rope_dims(name: &str, x: &dsc_ir::TensorType, rotary_dim: usize) -> Result<(usize, usize), CodegenError> {
    let (Some(h), Some(d)) = (x.shape[1].as_const(), x.shape[2].as_const()) else {
        return Err(err(name, "rope needs constant heads and head dim"));
    };
    if rotary_dim != d {
        return Err(err(name, "partial rotary dims are not lowered yet"));
    }
    Ok((h, d))
}

fn err(node: &str, msg: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported { kernel: node.to_string(), msg: msg.into() }
}

/// Lower every compute node of `g`. Leaves (inputs, weights, states) get no step.
pub fn lower(g: &Graph) -> Result<Vec<Step>, CodegenError> {
    let order = g.topo_order().map_err(|e| err(&g.name, e.to_string()))?;
    let mut steps = vec![];
    for id in order {
        let n = g.node(id);
        if n.op.is_leaf() {
            continue;
        }
        let ops: Vec<&dsc_ir::Node> = g.operands(id).into_iter().map(|o| g.node(o)).collect();
        let names: Vec<String> = ops.iter().map(|o| o.name.clone()).collect();
        let name = n.name.clone();
        if n.ty.dtype != DType::F32 && !matches!(n.op, Op::TopK { .. } | Op::Argmax) {
            return Err(err(&name, format!("GPU kernels take f32 activations today; node is {}", n.ty)));
        }
        if ops.iter().any(|o| matches!(o.op, Op::MatMulCat)) && !matches!(n.op, Op::Slice { .. }) {
            return Err(err(&name, "a merged matmul (matmul_cat) is read only through slices of its parts"));
        }
        let mut args = names.clone();
        args.push(name.clone());
        let one = Scalar::Const(1);
        let step = |kernel, args, scalars, work, grid_y| Step {
            node: name.clone(),
            kernel: Some(kernel),
            args,
            scalars,
            work,
            grid_y,
            alias_of: None,
            alias_offset: None,
            large: None,
            hopper: None,
            hopper_small: None,
            few: None,
            collective: None,
        };
        let alias = |of: &str| Step {
            node: name.clone(),
            kernel: None,
            args: vec![],
            scalars: vec![],
            work: Scalar::Const(0),
            grid_y: Scalar::Const(1),
            alias_of: Some(of.to_string()),
            alias_offset: None,
            large: None,
            hopper: None,
            hopper_small: None,
            few: None,
            collective: None,
        };
        steps.push(match &n.op {
            Op::Reshape => alias(&names[0]),
            Op::AllReduce => Step { collective: Some("all_reduce_sum".into()), ..alias(&names[0]) },
            Op::Cast if ops[0].ty.dtype == n.ty.dtype => alias(&names[0]),
            Op::Unary(u) => step(KernelSpec::Unary(UnaryOpKey(*u)), args, vec![Scalar::Numel(name.clone())], Scalar::Numel(name.clone()), one),
            Op::Binary(b) => {
                if ops[0].ty.shape != n.ty.shape {
                    return Err(err(&name, "binary ops broadcast only their second operand on the GPU"));
                }
                if ops[1].ty.shape.len() > n.ty.shape.len() || n.ty.shape[n.ty.shape.len() - ops[1].ty.shape.len()..] != ops[1].ty.shape[..] {
                    return Err(err(&name, format!("the second operand {} must match the trailing dims of {}", ops[1].ty, n.ty)));
                }
                step(KernelSpec::Binary(BinaryOpKey(*b)), args, vec![Scalar::Numel(name.clone()), Scalar::Numel(names[1].clone())], Scalar::Numel(name.clone()), one)
            }
            Op::RmsNorm { eps } => {
                let d = n.ty.shape.last().and_then(|d| d.as_const()).ok_or_else(|| err(&name, "rms_norm needs a constant last dim"))?;
                if ops[1].ty.dtype != DType::F32 {
                    return Err(err(&name, "rms_norm weight must be f32"));
                }
                step(KernelSpec::RmsNorm { d, eps_bits: eps.to_bits() }, args, vec![Scalar::Rows(name.clone())], Scalar::Rows(name.clone()), one)
            }
            Op::MatMul { transpose_b } | Op::MatMulAdd { transpose_b } => {
                // matmul_add: the last operand is the residual, added in the epilogue
                let residual = matches!(n.op, Op::MatMulAdd { .. });
                let ops: Vec<&dsc_ir::Node> = if residual { ops[..ops.len() - 1].to_vec() } else { ops.clone() };
                if !transpose_b {
                    return Err(err(&name, "matmul needs W in [N, K] layout (transpose_b = true)"));
                }
                if ops.len() > 2 && ops[2].ty.dtype != DType::F32 {
                    return Err(err(&name, "matmul bias must be f32"));
                }
                let (nn, k) = weight_dims(&name, &ops[1].ty)?;
                matmul_step(
                    step(KernelSpec::MatMul { k: 0, n: 0, wdtype: DType::F32, bias: false, residual: false }, args, vec![], Scalar::Const(0), one),
                    &name,
                    k,
                    nn,
                    ops[1].ty.dtype,
                    ops.len() > 2,
                    residual,
                    None,
                )?
            }
            Op::MatMulCat => {
                // merged matmuls: one kernel per alternative over all the weights, the output
                // part-major (each part a contiguous [M, N_i]; its slices are views)
                let mut parts = vec![];
                for w in &ops[1..] {
                    let (nn, k) = weight_dims(&name, &w.ty)?;
                    if k != weight_dims(&name, &ops[1].ty)?.1 || w.ty.dtype != ops[1].ty.dtype {
                        return Err(err(&name, "matmul_cat weights differ in K or dtype"));
                    }
                    parts.push(nn);
                }
                let (_, k) = weight_dims(&name, &ops[1].ty)?;
                let total = parts.iter().sum();
                matmul_step(
                    step(KernelSpec::MatMul { k: 0, n: 0, wdtype: DType::F32, bias: false, residual: false }, args, vec![], Scalar::Const(0), one),
                    &name,
                    k,
                    total,
                    ops[1].ty.dtype,
                    false,
                    false,
                    Some(&parts),
                )?
            }
            Op::Slice { axis, start, len } if matches!(ops[0].op, Op::MatMulCat) => {
                // a part of a merged matmul: a view at M * (columns before it)
                let cat = g.operands(id)[0];
                let parts: Vec<usize> = g.operands(cat)[1..].iter().map(|&w| g.node(w).ty.shape[0].as_const().unwrap_or(0)).collect();
                let before: Vec<usize> = parts
                    .iter()
                    .scan(0, |acc, p| {
                        let s = *acc;
                        *acc += p;
                        Some(s)
                    })
                    .collect();
                if *axis + 1 != n.ty.rank() || !before.iter().zip(&parts).any(|(b, p)| b == start && p == len) {
                    return Err(err(&name, format!("a merged matmul's output is read only as whole parts {parts:?} along its last axis")));
                }
                Step { alias_offset: Some(Scalar::RowsTimes(names[0].clone(), *start as i64)), ..alias(&names[0]) }
            }
            Op::Gather => {
                let d: usize = ops[0].ty.shape[1..].iter().map(|x| x.as_const()).product::<Option<usize>>().ok_or_else(|| err(&name, "gather rows need constant dims"))?;
                step(KernelSpec::Gather { d, dtype: ops[0].ty.dtype }, args, vec![Scalar::Numel(name.clone())], Scalar::Numel(name.clone()), one)
            }
            Op::Rope { theta, style, rotary_dim } => {
                let (h, d) = rope_dims(&name, &n.ty, *rotary_dim)?;
                let spec = KernelSpec::Rope { h, d, theta_bits: theta.to_bits(), interleaved: *style == RopeStyle::Interleaved };
                step(spec, args, vec![Scalar::HalfNumel(name.clone())], Scalar::HalfNumel(name.clone()), one)
            }
            Op::CacheWrite => {
                if ops[0].ty.dtype != DType::F32 {
                    return Err(err(&name, "KV caches are f32 on the GPU today"));
                }
                let row: usize = ops[1].ty.shape[1..].iter().map(|x| x.as_const()).product::<Option<usize>>().ok_or_else(|| err(&name, "cache rows need constant dims"))?;
                // kernel(x, slots, cache): writes into the pool the node aliases
                let n = Scalar::Numel(names[1].clone());
                Step { alias_of: Some(names[0].clone()), ..step(KernelSpec::CacheWrite { row }, vec![names[1].clone(), names[2].clone(), names[0].clone()], vec![n.clone()], n, one) }
            }
            Op::RopeCacheWrite { theta, style, rotary_dim } => {
                // operands (cache, x, slots, pos); kernel(x, pos, slots, cache) writes into the
                // pool the node aliases
                let (h, d) = rope_dims(&name, &ops[1].ty, *rotary_dim)?;
                if ops[0].ty.dtype != DType::F32 || ops[1].ty.dtype != DType::F32 {
                    return Err(err(&name, "KV caches are f32 on the GPU today"));
                }
                let spec = KernelSpec::RopeCacheWrite { h, d, theta_bits: theta.to_bits(), interleaved: *style == RopeStyle::Interleaved };
                let n = Scalar::HalfNumel(names[1].clone());
                Step { alias_of: Some(names[0].clone()), ..step(spec, vec![names[1].clone(), names[3].clone(), names[2].clone(), names[0].clone()], vec![n.clone()], n, one) }
            }
            Op::PagedAttention { scale } => {
                let c = |t: &dsc_ir::TensorType, i: usize| t.shape[i].as_const();
                let (h, d) = (c(&ops[0].ty, 1), c(&ops[0].ty, 2));
                let (bs, kvh) = (c(&ops[1].ty, 1), c(&ops[1].ty, 2));
                let (Some(h), Some(d), Some(bs), Some(kvh)) = (h, d, bs, kvh) else {
                    return Err(err(&name, "paged attention needs constant heads, head dim and block size"));
                };
                if ops[1].ty.dtype != DType::F32 {
                    return Err(err(&name, "KV caches are f32 on the GPU today"));
                }
                let spec = KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps: attention_warps() };
                step(spec, args, vec![Scalar::Rows(name.clone()), Scalar::Dim(names[5].clone(), 1)], Scalar::Rows(name.clone()), one)
            }
            Op::Softmax | Op::Argmax => {
                let d = ops[0].ty.shape.last().and_then(|d| d.as_const()).ok_or_else(|| err(&name, "needs a constant last dim"))?;
                if ops[0].ty.dtype != DType::F32 {
                    return Err(err(&name, "GPU kernels take f32 activations today"));
                }
                let spec = if matches!(n.op, Op::Softmax) { KernelSpec::Softmax { d } } else { KernelSpec::Argmax { d } };
                step(spec, args, vec![Scalar::Rows(names[0].clone())], Scalar::Rows(names[0].clone()), one)
            }
            Op::LayerNorm { eps } => {
                let d = n.ty.shape.last().and_then(|d| d.as_const()).ok_or_else(|| err(&name, "layer_norm needs a constant last dim"))?;
                if ops[1].ty.dtype != DType::F32 || ops[2].ty.dtype != DType::F32 {
                    return Err(err(&name, "layer_norm weight and bias must be f32"));
                }
                step(KernelSpec::LayerNorm { d, eps_bits: eps.to_bits() }, args, vec![Scalar::Rows(name.clone())], Scalar::Rows(name.clone()), one)
            }
            Op::Slice { axis, start, len } => {
                let x = &ops[0].ty;
                let inner: Option<usize> = x.shape[axis + 1..].iter().map(|d| d.as_const()).product();
                let (Some(inner), Some(d)) = (inner, x.shape[*axis].as_const()) else {
                    return Err(err(&name, "slice needs constant dims from the axis inward"));
                };
                step(KernelSpec::Slice { inner, d, start: *start, len: *len }, args, vec![Scalar::Numel(name.clone())], Scalar::Numel(name.clone()), one)
            }
            Op::TakeAlong => {
                let (Some(n_in), Some(k)) = (ops[0].ty.shape.last().and_then(|d| d.as_const()), n.ty.shape.last().and_then(|d| d.as_const())) else {
                    return Err(err(&name, "take_along needs constant last dims"));
                };
                step(KernelSpec::TakeAlong { n_in, k }, args, vec![Scalar::Numel(name.clone())], Scalar::Numel(name.clone()), one)
            }
            Op::TopK { k } => {
                let d = ops[0].ty.shape.last().and_then(|d| d.as_const()).ok_or_else(|| err(&name, "top_k needs a constant last dim"))?;
                if ops[0].ty.dtype != DType::F32 {
                    return Err(err(&name, "GPU kernels take f32 activations today"));
                }
                step(KernelSpec::TopK { d, k: *k }, args, vec![Scalar::Rows(names[0].clone())], Scalar::Rows(names[0].clone()), one)
            }
            Op::Transpose { perm } => {
                if perm.len() > 4 {
                    return Err(err(&name, "transpose of rank > 4 is not lowered"));
                }
                let mut sc = vec![Scalar::Numel(name.clone())];
                sc.extend((0..perm.len()).map(|i| Scalar::Dim(names[0].clone(), i)));
                step(KernelSpec::Transpose { perm: perm.clone() }, args, sc, Scalar::Numel(name.clone()), one)
            }
            Op::Concat { axis } => {
                let sizes: Option<Vec<usize>> = ops.iter().map(|o| o.ty.shape[*axis].as_const()).collect();
                let inner: Option<usize> = n.ty.shape[axis + 1..].iter().map(|d| d.as_const()).product();
                let (Some(sizes), Some(inner)) = (sizes, inner) else {
                    return Err(err(&name, "concat needs constant dims from the axis inward"));
                };
                step(KernelSpec::Concat { sizes, inner }, args, vec![Scalar::Numel(name.clone())], Scalar::Numel(name.clone()), one)
            }
            other => return Err(err(&name, format!("op `{}` has no GPU lowering yet", other.name()))),
        });
    }
    Ok(steps)
}

/// (N, K) of a matmul weight in [N, K] layout.
fn weight_dims(name: &str, w: &dsc_ir::TensorType) -> Result<(usize, usize), CodegenError> {
    match (w.shape[0].as_const(), w.shape.get(1).and_then(|d| d.as_const())) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(err(name, "matmul weights need constant dims")),
    }
}

/// A matmul step and its alternatives by row count (decode GEMV by default; batched-decode
/// GEMV, mma.sync, wgmma): `base` carries the node and its buffers. With `parts` (merged
/// matmuls) every kernel is wrapped as `MatMulParts` and takes the rows as a last scalar; an
/// alternative whose blocks would straddle two parts is left out.
#[allow(clippy::too_many_arguments)]
fn matmul_step(base: Step, name: &str, k: usize, nn: usize, wdtype: DType, bias: bool, residual: bool, parts: Option<&[usize]>) -> Result<Step, CodegenError> {
    let rows = Scalar::Rows(name.to_string());
    let wrap = |spec: KernelSpec, mut scalars: Vec<Scalar>| -> Option<(KernelSpec, Vec<Scalar>)> {
        match parts {
            None => Some((spec, scalars)),
            Some(p) => {
                crate::kernels::parts_fit(&spec, p).ok()?;
                scalars.push(rows.clone());
                Some((KernelSpec::MatMulParts { inner: Box::new(spec), parts: p.to_vec() }, scalars))
            }
        }
    };
    let (kernel, scalars) = wrap(KernelSpec::MatMul { k, n: nn, wdtype, bias, residual }, vec![Scalar::Const(nn as i64)])
        .ok_or_else(|| err(name, format!("merged matmul parts {parts:?} do not fit the decode GEMV's blocks")))?;
    let mut st = Step { kernel: Some(kernel), scalars, work: Scalar::Const(nn as i64), grid_y: rows.clone(), ..base };
    let large = |spec: KernelSpec, min_rows: i64, max_rows: Option<i64>, work: usize| {
        wrap(spec, vec![rows.clone(), Scalar::Const(nn as i64)]).map(|(kernel, scalars)| Large { min_rows, max_rows, kernel, scalars, work: Scalar::Const(work as i64), grid_y: rows.clone() })
    };
    if k % 16 == 0 {
        st.large = large(KernelSpec::MatMulMma { k, n: nn, wdtype, bias, residual }, 16, None, nn.div_ceil(8));
    }
    if k % 64 == 0 {
        // Hopper: 64-column tiles from 128 rows (prefill), 16-column tiles for 2..127 rows
        // (batched decode: weights read once, 4x the blocks)
        st.hopper = large(KernelSpec::MatMulWgmma { k, n: nn, wdtype, bias, residual, n_tile: 64 }, 128, None, nn.div_ceil(64));
        st.hopper_small = large(KernelSpec::MatMulWgmma { k, n: nn, wdtype, bias, residual, n_tile: 16 }, 2, None, nn.div_ceil(16));
    }
    if matches!(wdtype, DType::F32 | DType::F16 | DType::BF16) {
        // 2..=few_max rows (batched decode): a GEMV-shaped kernel reading each weight once per
        // 8 (f32) or 32 (bf16/f16, tensor cores) rows beats the tiled tensor-core kernels there
        // (bench/results, docs/perf.md)
        let rows_per_block = crate::kernels::few_rows(wdtype);
        st.few = large(KernelSpec::MatMulFew { k, n: nn, wdtype, bias, residual, rows: rows_per_block }, 2, Some(few_max_rows()), nn);
    }
    Ok(st)
}
