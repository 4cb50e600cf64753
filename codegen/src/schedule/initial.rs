//! The first schedule ([`initial`]): a step per compute node of the graph in topological
//! order — the kernel its op lowers to (the decode kernel), the alternatives by row count
//! (`large`, `hopper`, `hopper_small`, `few`: the tensor-core matmuls, the batched GEMVs, the
//! prefill attention), buffer aliases for views — with the RMSNorm folded into the GEMVs after
//! it where `norm_fusion` is on.

use crate::schedule::*;

/// The decode attention takes a block per (token, KV head) — the GQA group's query heads
/// over K/V rows read once — from as many tokens as make this many such blocks (~ the 132
/// SMs; a block per (token, head) below: more blocks where there are few). Measured on the
/// H200 (bench/results/attn-group-2026-11-30.json). Grouped at every row count, 8B shape:
/// b32 6,300 -> 6,688 tok/s, b128 8,442 -> 9,555 (8 warps), but b1 261 -> 258 and at a
/// 400-token context b1 246 -> 227, b8 1,468 -> 1,357; SmolLM2 shape b1 2,316 -> 2,159.
/// From 16 tokens: 8B b16 +2.3%, b32 +3%, b128 +12.6%, b32 at a 400-token context +9%, b1
/// and b8 unchanged; but the SmolLM2 shape (3 KV heads: 48 blocks at b16) b16 -6%, b32 -2%,
/// b32 at 400 tokens -13%, b128 +6%. The split decode attention's first pass is grouped too
/// where its head groups x [`ATTN_SPLITS`] reach this (the 8B shape: 8 x 16; alone at b1, 8k context
/// 42.1 -> 30.7 us per layer, 1k 17.8 -> 18.8).
pub const ATTN_GROUP_MIN_BLOCKS: usize = 128;

/// Warps per block of the grouped decode attention (8 measured faster than 16 at b32 and
/// b128: 6,401 / 9,253 with 16).
pub const ATTN_GROUP_WARPS: usize = 8;

/// Warps (16 query rows each) per block of the prefill attention on bf16 pools
/// ([`ScheduleOptions::flash_warps`]).
pub const FLASH_WARPS: usize = 4;

/// m16 tiles per warp of the prefill attention on bf16 pools ([`ScheduleOptions::flash_mtiles`]).
pub const FLASH_MTILES: usize = 1;

/// Query heads per block of the grouped decode attention with `warps` warps: the largest
/// divisor of the GQA group (H / KVH) whose running softmax state fits a lane (group x D / 32
/// ≤ [`ATTN_GROUP_MAX_STATE`] accumulators) and whose partial states fit 48 KiB of static
/// shared memory (warps x group x (D + 2) f32); 1 where only that fits (no grouping). The 8B
/// shape: 4 (its whole group), SmolLM2's 3; Llama-3-70B's group of 8 heads of 128: 4.
pub fn attention_group_size(h: usize, kvh: usize, d: usize, warps: usize) -> usize {
    let rep = if kvh > 0 && h % kvh == 0 { h / kvh } else { 1 };
    (1..=rep).rev().find(|&g| rep % g == 0 && g * (d / 32) <= ATTN_GROUP_MAX_STATE && warps * g * (d + 2) * 4 <= 48 * 1024).unwrap_or(1)
}

/// Most f32 accumulators per lane the grouped decode attention keeps (group x D / 32; the
/// 8B shape's 4 x 4): past that, registers spill (512 threads of 16 warps get 128 each).
pub const ATTN_GROUP_MAX_STATE: usize = 16;

/// The fewest rows the pipelined Hopper matmul takes for N outputs in `bn`-wide tiles (it
/// comes before the batched-decode GEMV from there; `ScheduleOptions::pipe_min_rows` overrides).
/// With 96+ column tiles (most of the 132 SMs busy on one 128-row tile) it streams the weights
/// at 3.1-3.3 TB/s from 16 rows, where the batched GEMV (re-reading x per 16 outputs) makes
/// 1.6-2.5 TB/s; with fewer tiles it wins from 64 rows (bench/results/few-x16-2026-11-29.json).
pub(crate) fn pipe_min_rows(o: &ScheduleOptions, n: usize, bn: usize) -> i64 {
    if let Some(r) = o.pipe_min_rows {
        return r;
    }
    if n.div_ceil(bn) >= 96 {
        16
    } else {
        64
    }
}

/// The rows from which a matmul's tiled tensor-core kernel (the pipelined one, or the wgmma
/// one) takes over: 128, and for quantized weights past the batched GEMV's `gemv_few_max`.
fn quant_large_min_rows(o: &ScheduleOptions, wdtype: DType) -> i64 {
    if wdtype.is_packed() {
        (o.gemv_few_max + 1).max(128)
    } else {
        128
    }
}

/// The rows (min, max) the pipelined matmul takes in 64-row tiles (`pipe64_tiling`) for N
/// output columns, ahead of the batched GEMV; `ScheduleOptions::pipe64_rows` overrides.
/// Measured on the H200 (bench/results/pipe64-2026-11-29.json, 8B shape): with N ≥ 6,144
/// (q/k/v, gate/up, lm_head) the 64-row tiles beat the batched GEMV and the 128-row tiles in
/// isolation from 16 rows (q/k/v 24 vs 31-37 µs, gate/up 65-67 vs 72-73) and end to end from
/// 32 (b32 +3%, b64 +39%; b16 −9%, not understood yet: so from 32); with N = 4,096 (o, down:
/// 32 tiles) the batched GEMV is faster at 16-32 rows (o 19-23 vs 28, down 58-70 vs 73) and
/// the tiles from 64 (o 23 vs 40, down 63 vs 129); up to 64 rows, 128-row tiles above.
pub(crate) fn pipe64_rows(o: &ScheduleOptions, n: usize) -> (i64, i64) {
    if let Some(p) = o.pipe64_rows {
        return p;
    }
    (if n >= 6144 { 32 } else { 48 }, 64)
}

/// (heads, head dim) of a RoPE input x[T, H, D], which the kernels rotate whole.
pub(crate) fn rope_dims(name: &str, x: &dsc_ir::TensorType, rotary_dim: usize) -> Result<(usize, usize), CodegenError> {
    let (Some(h), Some(d)) = (x.shape[1].as_const(), x.shape[2].as_const()) else {
        return Err(err(name, "rope needs constant heads and head dim"));
    };
    if rotary_dim != d {
        return Err(err(name, "partial rotary dims are not lowered yet"));
    }
    Ok((h, d))
}

/// The KV pool type of a cache write's or attention's pool, if the GPU kernels take it: f32,
/// or bf16 (half the bytes the decode attention streams; FP8 comes with quantization).
pub(crate) fn gpu_kv(node: &str, dtype: DType) -> Result<DType, CodegenError> {
    match dtype {
        DType::F32 | DType::BF16 => Ok(dtype),
        other => Err(err(node, format!("{other} KV caches are not lowered for the GPU; use kv_cache = \"bf16\" or \"f32\""))),
    }
}

/// What a family's lowering of one compute node sees (`kernels::lower_*`): the node, its
/// operands and their buffer names, the schedule's options.
pub(crate) struct NodeCx<'a> {
    pub node: &'a dsc_ir::Node,
    pub ops: &'a [&'a dsc_ir::Node],
    pub names: &'a [String],
    pub name: &'a str,
    pub opts: &'a ScheduleOptions,
    /// the whole graph (a lowering that looks past its operands)
    pub graph: &'a Graph,
}

impl NodeCx<'_> {
    /// A step launching `kernel` for this node.
    pub fn step(&self, kernel: KernelSpec, args: Vec<String>, scalars: Vec<Scalar>, work: Scalar, grid_y: Scalar) -> Step {
        Step { kernel: Some(kernel), args, scalars, work, grid_y, ..Step::new(self.name) }
    }
    /// An error naming this node.
    pub fn err(&self, msg: impl Into<String>) -> CodegenError {
        err(self.name, msg)
    }
}

/// The first schedule: a step per compute node in topological order, each with the kernel its
/// op lowers to and the alternatives by row count (the rewrites in [`REWRITES`] come after).
pub(crate) fn initial(g: &Graph, opts: ScheduleOptions) -> Result<Vec<Step>, CodegenError> {
    let norm_fusion = opts.norm_fusion;
    let order = g.topo_order().map_err(|e| err(&g.name, e.to_string()))?;
    let norms = if norm_fusion { fusable_norms(g) } else { Default::default() };
    let mut steps = vec![];
    for id in order {
        let n = g.node(id);
        if n.op.is_leaf() {
            continue;
        }
        let ops: Vec<&dsc_ir::Node> = g.operands(id).into_iter().map(|o| g.node(o)).collect();
        let names: Vec<String> = ops.iter().map(|o| o.name.clone()).collect();
        let name = n.name.clone();
        // (a cache write's node is its pool, of the KV cache's type)
        if n.ty.dtype != DType::F32 && !matches!(n.op, Op::TopK { .. } | Op::Argmax | Op::CacheWrite | Op::RopeCacheWrite { .. }) {
            return Err(err(&name, format!("GPU kernels take f32 activations today; node is {}", n.ty)));
        }
        if ops.iter().any(|o| matches!(o.op, Op::MatMulCat)) && !matches!(n.op, Op::Slice { .. }) {
            return Err(err(&name, "a merged matmul (matmul_cat) is read only through slices of its parts"));
        }
        let mut args = names.clone();
        args.push(name.clone());
        let cx = NodeCx { node: n, ops: &ops, names: &names, name: &name, opts: &opts, graph: g };
        let one = Scalar::Const(1);
        let step = |kernel, args, scalars, work, grid_y| Step { kernel: Some(kernel), args, scalars, work, grid_y, ..Step::new(&name) };
        let alias = |of: &str| Step { alias_of: Some(of.to_string()), ..Step::new(&name) };
        let st = match &n.op {
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
            // (one-row steps: the decode GEMVs reading it normalize in their prologue)
            Op::RmsNorm { eps } => crate::kernels::lower_rms_norm(&cx, args, *eps, norms.contains(&id))?,
            Op::MatMulAct { transpose_b, act } => {
                // every kernel of the step (decode GEMV and the alternatives) with the bias and
                // the activation in its epilogue
                if !transpose_b {
                    return Err(err(&name, "matmul needs W in [N, K] layout (transpose_b = true)"));
                }
                if ops.len() > 2 && ops[2].ty.dtype != DType::F32 {
                    return Err(err(&name, "matmul bias must be f32"));
                }
                crate::kernels::epilogue_act_fits(*act).map_err(|e| err(&name, e))?;
                let (nn, k) = weight_dims(&name, &ops[1].ty)?;
                let mut st = matmul_step(&name, args, k, nn, ops[1].ty.dtype, ops.len() > 2, false, None, &opts)?;
                let wrap = |k: KernelSpec| KernelSpec::MatMulAct { inner: Box::new(k), act: UnaryOpKey(*act) };
                st.kernel = st.kernel.map(wrap);
                for l in st.alternatives_mut() {
                    l.kernel = wrap(l.kernel.clone());
                }
                st
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
                if !matches!(ops[1].op, Op::Weight) {
                    return Err(err(&name, GRAPH_WEIGHTS_ONLY));
                }
                let (nn, k) = weight_dims(&name, &ops[1].ty)?;
                let mut st = matmul_step(&name, args, k, nn, ops[1].ty.dtype, ops.len() > 2, residual, None, &opts)?;
                if ops.len() == 2 {
                    add_fp8_gemm(ops[0], ops[1].ty.dtype, k, nn, residual, None, &mut st, &opts);
                }
                fuse_norm(g, &norms, id, st)
            }
            Op::MatMulCat => {
                // merged matmuls: one kernel per alternative over all the weights, the output
                // part-major (each part a contiguous [M, N_i]; its slices are views)
                let (_, k) = weight_dims(&name, &ops[1].ty)?;
                let mut parts = vec![];
                for w in &ops[1..] {
                    if !matches!(w.op, Op::Weight) {
                        return Err(err(&name, GRAPH_WEIGHTS_ONLY));
                    }
                    let (nn, kw) = weight_dims(&name, &w.ty)?;
                    if kw != k || w.ty.dtype != ops[1].ty.dtype {
                        return Err(err(&name, "matmul_cat weights differ in K or dtype"));
                    }
                    parts.push(nn);
                }
                let total = parts.iter().sum();
                let mut st = matmul_step(&name, args, k, total, ops[1].ty.dtype, false, false, Some(&parts), &opts)?;
                add_fp8_gemm(ops[0], ops[1].ty.dtype, k, total, false, Some(&parts), &mut st, &opts);
                fuse_norm(g, &norms, id, st)
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
                let kv = gpu_kv(&name, ops[0].ty.dtype)?;
                if ops[1].ty.dtype != DType::F32 {
                    return Err(err(&name, format!("GPU kernels take f32 activations today; the cache write's value is {}", ops[1].ty)));
                }
                let row: usize = ops[1].ty.shape[1..].iter().map(|x| x.as_const()).product::<Option<usize>>().ok_or_else(|| err(&name, "cache rows need constant dims"))?;
                // kernel(x, slots, cache): writes into the pool the node aliases
                let n = Scalar::Numel(names[1].clone());
                Step { alias_of: Some(names[0].clone()), ..step(KernelSpec::CacheWrite { row, kv }, vec![names[1].clone(), names[2].clone(), names[0].clone()], vec![n.clone()], n, one) }
            }
            Op::RopeCacheWrite { theta, style, rotary_dim } => {
                // operands (cache, x, slots, pos); kernel(x, pos, slots, cache) writes into the
                // pool the node aliases
                let (h, d) = rope_dims(&name, &ops[1].ty, *rotary_dim)?;
                let kv = gpu_kv(&name, ops[0].ty.dtype)?;
                if ops[1].ty.dtype != DType::F32 {
                    return Err(err(&name, format!("GPU kernels take f32 activations today; the cache write's value is {}", ops[1].ty)));
                }
                let spec = KernelSpec::RopeCacheWrite { h, d, theta_bits: theta.to_bits(), interleaved: *style == RopeStyle::Interleaved, kv };
                let n = Scalar::HalfNumel(names[1].clone());
                Step { alias_of: Some(names[0].clone()), ..step(spec, vec![names[1].clone(), names[3].clone(), names[2].clone(), names[0].clone()], vec![n.clone()], n, one) }
            }
            Op::PagedAttention { scale } => crate::kernels::lower_paged_attention(&cx, args, *scale)?,
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
                step(KernelSpec::LayerNorm { d, eps_bits: eps.to_bits(), half: None }, args, vec![Scalar::Rows(name.clone())], Scalar::Rows(name.clone()), one)
            }
            Op::Slice { axis: 0, start, .. } if matches!(ops[0].op, Op::Input) && ops[0].ty.dtype == DType::F32 && ops[0].ty.shape[1..].iter().all(|d| d.as_const().is_some()) => {
                // rows of a step input (a MoE layer's row of the expert mask): a view at
                // start x (the row's elements), no kernel
                let inner: usize = ops[0].ty.shape[1..].iter().filter_map(|d| d.as_const()).product();
                Step { alias_offset: Some(Scalar::Const((start * inner) as i64)), ..alias(&names[0]) }
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
            Op::RopeYarn { theta, style, rotary_dim, yarn } => {
                let (h, d) = rope_dims(&name, &n.ty, *rotary_dim)?;
                let spec = crate::kernels::rope_yarn_spec(h, d, *theta, *style == RopeStyle::Interleaved, yarn);
                step(spec, args, vec![Scalar::HalfNumel(name.clone())], Scalar::HalfNumel(name.clone()), one)
            }
            Op::HeadMatMul { transpose_b } => crate::kernels::lower_head_matmul(&cx, args, *transpose_b)?,
            Op::MlaAttention { scale, kv_lora_rank } => crate::kernels::lower_mla_attention(&cx, args, *scale, *kv_lora_rank)?,
            Op::MoeRoute(r) => crate::kernels::lower_moe_route(&cx, args, r)?,
            Op::MoeExperts => {
                // (the router's top_k bounds the experts a routing row chooses)
                let top_k = match &ops[1].op {
                    Op::MoeRoute(r) => r.top_k,
                    _ => ops[1].ty.shape[1].as_const().ok_or_else(|| err(&name, "the routed experts need a constant expert count"))?,
                };
                let mut all = crate::kernels::lower_moe_experts(&cx, top_k)?;
                let last = all.pop().expect("the routed experts' steps");
                steps.extend(all);
                last
            }
            Op::ActQuant { dtype, group } => {
                // (e4m3 in DeepSeek's 1x128 groups: the node in f32 for the GEMVs, its e4m3 copy
                // `{node}@rows{W}` for the FP8 GEMM)
                let d = n.ty.shape.last().and_then(|d| d.as_const()).ok_or_else(|| err(&name, "8-bit activations need a constant row width"))?;
                if *dtype != DType::F8E4M3 || *group != crate::kernels::F8_GROUP {
                    return Err(err(
                        &name,
                        format!(
                            "8-bit activations on the GPU are fp8-g{} (e4m3, a scale per 128 values of a token); {dtype} in groups of {group} runs on the CPU executor only",
                            crate::kernels::F8_GROUP
                        ),
                    ));
                }
                let spec = KernelSpec::ActQuantF8 { d, group: *group };
                crate::kernels::fits(&spec).map_err(|e| err(&name, e))?;
                let q = format!("{name}@rows{}", crate::kernels::f8_rows_width(d));
                let work = Scalar::RowsTimes(name.clone(), (d / 4) as i64);
                // (the copy's buffer, declared by a kernel-less step: `compiler::lifetimes`)
                steps.push(Step::new(&q));
                step(spec, vec![names[0].clone(), name.clone(), q], vec![work.clone()], work, one)
            }
            other => return Err(err(&name, format!("op `{}` has no GPU lowering yet", other.name()))),
        };
        steps.push(st);
    }
    Ok(steps)
}

/// W8A8: where x is an `act_quant` to e4m3 in groups of 128 and the weights f8g128, the FP8
/// GEMM (`KernelSpec::MatMulF8`, reading x's e4m3 copy `{x}@rows{W}`) comes first among the
/// Hopper alternatives from the rows past the packed GEMV's (`gemv_few_max` + 1: prefill and
/// large batches); below, the GEMVs read x's f32 values as they do any x.
#[allow(clippy::too_many_arguments)]
fn add_fp8_gemm(x: &dsc_ir::Node, wdtype: DType, k: usize, nn: usize, residual: bool, parts: Option<&[usize]>, st: &mut Step, o: &ScheduleOptions) {
    let Op::ActQuant { dtype: DType::F8E4M3, group } = x.op else { return };
    if group != crate::kernels::F8_GROUP || wdtype != DType::F8G128 {
        return;
    }
    let (bn, stages) = crate::kernels::f8_tiling(nn);
    let spec = KernelSpec::MatMulF8 { k, n: nn, residual, bn, stages };
    if crate::kernels::fits(&spec).is_err() {
        return;
    }
    let rows = Scalar::Rows(st.node.clone());
    let work = Scalar::Const(spec.launch().work_units(nn) as i64);
    let (kernel, scalars) = match parts {
        None => (spec, vec![rows.clone(), Scalar::Const(nn as i64)]),
        Some(p) => {
            if crate::kernels::parts_fit(&spec, p).is_err() {
                return;
            }
            (KernelSpec::MatMulParts { inner: Box::new(spec), parts: p.to_vec() }, vec![rows.clone(), Scalar::Const(nn as i64), rows.clone()])
        }
    };
    let mut args = st.args.clone();
    args[0] = format!("{}@rows{}", x.name, crate::kernels::f8_rows_width(k));
    st.hopper.insert(0, Large { min_rows: o.gemv_few_max + 1, max_rows: None, args: Some(args), kernel, scalars, work, grid_y: rows });
}

/// (N, K) of a matmul weight in [N, K] layout.
pub(crate) fn weight_dims(name: &str, w: &dsc_ir::TensorType) -> Result<(usize, usize), CodegenError> {
    match (w.shape[0].as_const(), w.shape.get(1).and_then(|d| d.as_const())) {
        (Some(a), Some(b)) => Ok((a, b)),
        _ => Err(err(name, "matmul weights need constant dims")),
    }
}

/// A matmul step and its alternatives by row count (decode GEMV by default; batched-decode
/// GEMV, mma.sync, wgmma) for node `name` on buffers `args`. With `parts` (merged
/// matmuls) every kernel is wrapped as `MatMulParts` and takes the rows as a last scalar; an
/// alternative whose blocks would straddle two parts is left out.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul_step(name: &str, args: Vec<String>, k: usize, nn: usize, wdtype: DType, bias: bool, residual: bool, parts: Option<&[usize]>, o: &ScheduleOptions) -> Result<Step, CodegenError> {
    let few_x16 = o.few_x16;
    let rows = Scalar::Rows(name.to_string());
    // (K not a multiple of 32 — the GEMVs' and tensor-core tiles' unit — in a small model,
    // e.g. a tiny DeepSeek's q_lora_rank 24: the warp-per-output matmul, which takes any K,
    // for every row count)
    if k % 32 != 0 && matches!(wdtype, DType::F32 | DType::F16 | DType::BF16) && !bias && !residual && parts.is_none() {
        let spec = KernelSpec::HeadMatMul { h: 1, k, n: nn, wdtype };
        return Ok(Step { kernel: Some(spec), args, scalars: vec![Scalar::Const(nn as i64)], work: Scalar::Const(nn as i64), grid_y: rows, ..Step::new(name) });
    }
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
    // (one row of a wide, short-rowed 16-bit matrix — a small model's lm_head: the wide GEMV)
    let wide = parts.is_none() && o.gemv_wide && crate::kernels::wide_gemv_fits(k, nn, wdtype);
    // (int4 in dsc's i4g128, fp8 in its f8g128: the tensor-core packed GEMV for every decode
    // row count, taking the rows as a scalar)
    let packed = matches!(wdtype, DType::I4G128 | DType::F8G128);
    // (GGUF's Q4_K: the packed kernel's one-row form where K allows — x staged in f16, the
    // weights made f16 in registers; more rows take the K-quant batched GEMV below)
    let q4k_one_row = wdtype == DType::Q4_K && crate::kernels::q4k_one_row_fits(k).is_ok();
    let i4 = |tiles: usize| KernelSpec::MatMulPacked { wdtype, k, n: nn, tiles, walk: 1, bias, residual };
    let (one_row, one_scalars) = if packed || q4k_one_row {
        // (one row: x staged in shared memory where K allows)
        (i4(if k <= crate::kernels::PACKED_ONE_ROW_MAX_K { 0 } else { 1 }), vec![rows.clone(), Scalar::Const(nn as i64)])
    } else if wide {
        (KernelSpec::MatMulWide { k, n: nn, wdtype, bias, residual }, vec![Scalar::Const(nn as i64)])
    } else {
        (KernelSpec::MatMul { k, n: nn, wdtype, bias, residual }, vec![Scalar::Const(nn as i64)])
    };
    // (Q4_K's one-row form walks tiles: as many as put its blocks in one wave, fewer where a
    // block would straddle merged parts)
    let walked = match &one_row {
        KernelSpec::MatMulPacked { wdtype: DType::Q4_K, .. } => {
            let most = crate::kernels::q4k_walk(nn.div_ceil(16));
            (1..=most).rev().find_map(|walk| wrap(KernelSpec::MatMulPacked { wdtype, k, n: nn, tiles: 0, walk, bias, residual }, one_scalars.clone()))
        }
        _ => wrap(one_row, one_scalars),
    };
    let (kernel, scalars) = walked.ok_or_else(|| err(name, format!("merged matmul parts {parts:?} do not fit the decode GEMV's blocks")))?;
    let mut st = Step { kernel: Some(kernel), args, scalars, work: Scalar::Const(nn as i64), grid_y: rows.clone(), ..Step::new(name) };
    // (the step's work in its kernel's units: `Launch::work_units`)
    let large = |spec: KernelSpec, min_rows: i64, max_rows: Option<i64>| {
        let work = spec.launch().work_units(nn);
        wrap(spec, vec![rows.clone(), Scalar::Const(nn as i64)]).map(|(kernel, scalars)| Large {
            min_rows,
            max_rows,
            args: None,
            kernel,
            scalars,
            work: Scalar::Const(work as i64),
            grid_y: rows.clone(),
        })
    };
    if packed {
        // 8 rows and 16 outputs a block up to 8 rows, then 16 rows and 64 outputs (x read
        // once for 64 outputs: from 16 rows x outweighs a block's weights)
        let few_max = o.gemv_few_max;
        for (tiles, lo, hi) in [(1usize, 2i64, 8i64), (2, 9, few_max)] {
            if lo <= few_max {
                st.few.extend(large(i4(tiles), lo, Some(hi.min(few_max))));
            }
        }
    }
    if k % 16 == 0 {
        st.large = large(KernelSpec::MatMulMma { k, n: nn, wdtype, bias, residual }, 16, None);
    }
    if k % 64 == 0 {
        // Hopper: 64-column tiles from 128 rows (prefill), 16-column tiles for 2..127 rows
        // (batched decode: weights read once, 4x the blocks)
        // (bf16/f16 weights: the pipelined kernel, 128 x bn tiles with cp.async stages, where
        // merged parts fit its tiles)
        let crate::kernels::PipeTiling { bn, stages, overlap, a16, bm } = o.pipe_tiling(nn);
        let half = matches!(wdtype, DType::BF16 | DType::F16);
        // batched decode: 64-row tiles (half the padded tensor work) for pipe64_rows()
        let (lo64, hi64) = pipe64_rows(o, nn);
        let p64 = o.pipe64_tiling(nn);
        let small = (half && hi64 >= lo64)
            .then(|| large(KernelSpec::MatMulPipe { k, n: nn, wdtype, bias, residual, bn: p64.bn, stages: p64.stages, overlap: p64.overlap, a16: p64.a16, bm: p64.bm }, lo64, Some(hi64)))
            .flatten();
        // (first fit: the 128-row tiles take the rows from pipe_min_rows that the 64-row
        // ones leave, below and above their range)
        let big = half
            .then(|| large(KernelSpec::MatMulPipe { k, n: nn, wdtype, bias, residual, bn, stages, overlap, a16, bm }, pipe_min_rows(o, nn, bn), None))
            .flatten()
            // (quantized weights, warp-specialized: the same pipelined kernel, its producer
            // warpgroup dequantizing W's tiles into the stages, 128 x 128 tiles)
            .or_else(|| {
                let t = crate::kernels::dequant_pipe_tiling();
                (o.ws && crate::kernels::dequant_pipe_fits(wdtype, t).is_ok())
                    .then(|| {
                        large(KernelSpec::MatMulPipe { k, n: nn, wdtype, bias, residual, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: t.a16, bm: t.bm }, quant_large_min_rows(o, wdtype), None)
                    })
                    .flatten()
            })
            // (GGUF blocks: the batched GEMV dequantizing in registers holds up to few_max rows
            // — Q4_1 at 128 rows: 5.6 ms a SmolLM2 step here, 1.6 there)
            .or_else(|| large(KernelSpec::MatMulWgmma { k, n: nn, wdtype, bias, residual, n_tile: 64 }, quant_large_min_rows(o, wdtype), None));
        // (long prefills: 256-column tiles where N's 128-column ones would be used, from the
        // rows where the wide tiles still give WIDE_MIN_TILES blocks: half the x traffic per
        // FLOP; DSC_GEMM_WIDE=0 at compile time off)
        let wide = (half && bn == 128 && nn % 256 == 0 && o.gemm_wide)
            .then(|| {
                let w = crate::kernels::PipeTiling { bn: 256, ..crate::kernels::pipe_tiling(6144) };
                let from = (WIDE_MIN_TILES.div_ceil(nn / 256) * crate::kernels::PIPE_BM) as i64;
                large(KernelSpec::MatMulPipe { k, n: nn, wdtype, bias, residual, bn: w.bn, stages: w.stages, overlap: w.overlap, a16: w.a16, bm: w.bm }, from, None)
            })
            .flatten();
        st.hopper = small.into_iter().chain(wide).chain(big).collect();
        st.hopper_small = large(KernelSpec::MatMulWgmma { k, n: nn, wdtype, bias, residual, n_tile: 16 }, 2, None);
    }
    if wdtype == DType::F32 || crate::kernels::gemv_mma_weights(wdtype) {
        // 2..=few_max rows (batched decode): a GEMV-shaped kernel reading each weight once per
        // 8 (f32) or 32 (bf16/f16 and GGUF blocks, tensor cores) rows beats the tiled
        // tensor-core kernels there
        // (bench/results, docs/perf.md)
        let rows_per_block = crate::kernels::few_rows(wdtype);
        let f32x = KernelSpec::MatMulFew { k, n: nn, wdtype, bias, residual, rows: rows_per_block };
        // bf16/f16 weights from FEW_X16_MIN_ROWS rows: x read from its 16-bit copy (half the
        // activation bytes, which at 32 rows are twice the weight bytes a block reads:
        // bench/results/few-x16-2026-11-29.json); below, x in f32 (no cast step to pay for)
        // (from `few_x16_min` rows x in 16 bits: at 8 rows the f32 x kernel is 10-20% faster
        // and needs no cast, at 32 the bf16 one 20-25%, bench/results/few-x16-2026-11-29.json)
        let (x16_min, few_max) = (o.few_x16_min, o.gemv_few_max);
        if wdtype != DType::F32 && few_x16 && x16_min <= few_max {
            if x16_min > 2 {
                st.few.extend(large(f32x, 2, Some(x16_min - 1)));
            }
            st.few.extend(large(KernelSpec::MatMulFewX16 { k, n: nn, wdtype, bias, residual }, x16_min.max(2), Some(few_max)));
        } else {
            st.few.extend(large(f32x, 2, Some(few_max)));
        }
    }
    Ok(st)
}

/// Rows from which the batched-decode 64-row tiles are warp-specialized (`ScheduleOptions::ws64`):
/// measured on the H200 (bench/results/gemm-ws-2026-11-30.json, 8B shape) b16 -3.3%, b32
/// -0.7%, b64 +2.8%, b128 +18% (its split-K 64-row tiles) when every 64-row tile was.
pub const WS64_MIN_ROWS: i64 = 64;

/// Blocks (tiles) the 256-column prefill tiles must give before they replace the 128-column
/// ones (three waves of the 132 SMs): the 8B shape's o and down projections from 3,200 rows.
pub const WIDE_MIN_TILES: usize = 3 * crate::kernels::TARGET_SMS;

/// Why a matmul over an activation W has no GPU lowering: the decode GEMVs load their first
/// weights before waiting for the previous kernel (`kernels::gemv_preload`), which is right only
/// for weights no kernel writes.
pub(crate) const GRAPH_WEIGHTS_ONLY: &str = "matmul W must be a graph weight on the GPU (its kernels read W before the previous kernel finishes)";

/// RMSNorm nodes whose every user is a matmul (or merged matmul) that takes it as x with
/// plain-float weights and no bias: their decode GEMVs compute the norm in their prologue
/// (`KernelSpec::NormMatMul`), so one-row steps skip the norm's own kernel.
/// Most weight rows (outputs) the RMSNorm folds into a packed one-row GEMV over (see
/// [`fusable_norms`]): the 8B shape's q/k/v (6,144), not its gate/up (28,672).
pub(crate) const PACKED_NORM_FOLD_MAX_ROWS: usize = 8192;

pub(crate) fn fusable_norms(g: &Graph) -> std::collections::HashSet<dsc_ir::NodeId> {
    let mut out = std::collections::HashSet::new();
    for id in g.node_ids() {
        let n = g.node(id);
        let Op::RmsNorm { .. } = n.op else { continue };
        let ops = g.operands(id);
        let d = n.ty.shape.last().and_then(|d| d.as_const());
        if g.node(ops[1]).ty.dtype != DType::F32 || d.is_none_or(|d| d % 32 != 0) {
            continue;
        }
        // (plain floats, or Q4_1: the decode GEMV's prologue is the same; i4g128 where its
        // one-row kernel stages x, which normalizes it on the way: 8B b1 496 -> 506 tok/s)
        let plain = |w: dsc_ir::NodeId| match g.node(w).ty.dtype {
            DType::F32 | DType::F16 | DType::BF16 | DType::Q4_1 => true,
            DType::I4G128 | DType::F8G128 => d.is_some_and(|d| d <= crate::kernels::PACKED_ONE_ROW_MAX_K),
            DType::Q4_K => d.is_some_and(|d| crate::kernels::q4k_one_row_fits(d).is_ok()),
            _ => false,
        };
        // (only ahead of short GEMVs, as the L2 prefetch: those are latency-bound and gain
        // from one launch less; a long one is bandwidth-bound and every block's re-read of
        // x and g costs — measured on the 8B shape: b1 239 -> 231 with the gate/up norm fused;
        // i4g128, whose blocks read x whole anyway: 506 -> 487)
        let bytes = |w: dsc_ir::NodeId| {
            let t = &g.node(w).ty;
            let numel = t.shape.iter().map(|d| d.as_const().unwrap_or(usize::MAX)).fold(1usize, |a, b| a.saturating_mul(b));
            t.dtype.bytes_for(numel).unwrap_or(usize::MAX)
        };
        // (the packed GEMV's blocks stage x whole either way: what counts there is how many
        // blocks re-read g — 16 rows a block, i4g128's q/k/v (384 blocks) gained, its gate/up
        // (1,792) lost — so packed weights are bounded by rows, the same for fp8's twice the bytes)
        let rows = |w: dsc_ir::NodeId| g.node(w).ty.shape.first().and_then(|d| d.as_const()).unwrap_or(usize::MAX);
        let short = |ws: &[dsc_ir::NodeId]| {
            if ws.iter().all(|&w| matches!(g.node(w).ty.dtype, DType::I4G128 | DType::F8G128 | DType::Q4_K)) {
                ws.iter().map(|&w| rows(w)).fold(0usize, |a, b| a.saturating_add(b)) <= PACKED_NORM_FOLD_MAX_ROWS
            } else {
                ws.iter().map(|&w| bytes(w)).fold(0usize, |a, b| a.saturating_add(b)) <= crate::kernels::GEMV_PREFETCH_MAX_BYTES
            }
        };
        let users = g.users(id);
        let ok = !users.is_empty()
            && !g.outputs.iter().any(|(_, o)| *o == id)
            && users.iter().all(|&u| {
                let uo = g.operands(u);
                uo[0] == id
                    && !uo[1..].contains(&id)
                    && short(&uo[1..])
                    && match g.node(u).op {
                        Op::MatMul { transpose_b: true } => uo.len() == 2 && plain(uo[1]),
                        Op::MatMulCat => uo[1..].iter().all(|&w| plain(w)),
                        _ => false,
                    }
            });
        if ok {
            out.insert(id);
        }
    }
    out
}

/// A matmul step reading a fusable RMSNorm (see [`fusable_norms`]): its default kernel (the
/// one-row decode GEMV) becomes `NormMatMul`, reading the norm's input and weight; the other
/// kernels keep reading the norm's output.
pub(crate) fn fuse_norm(g: &Graph, norms: &std::collections::HashSet<dsc_ir::NodeId>, id: dsc_ir::NodeId, mut st: Step) -> Step {
    let x = g.operands(id)[0];
    if !norms.contains(&x) {
        return st;
    }
    let Op::RmsNorm { eps } = g.node(x).op else { return st };
    let nops = g.operands(x);
    let original = st.args.clone();
    for l in st.alternatives_mut() {
        l.args = Some(original.clone());
    }
    let mut args = vec![g.node(nops[0]).name.clone(), g.node(nops[1]).name.clone()];
    args.extend(original[1..].iter().cloned());
    st.args = args;
    st.kernel = st.kernel.take().map(|k| KernelSpec::NormMatMul { inner: Box::new(k), eps_bits: eps.to_bits() });
    st
}
