//! Graph → launch schedule: one kernel launch (or a buffer alias) per compute node, in
//! topological order, with the kernel specs to generate. Scalars and grid sizes are
//! expressions over node shapes, evaluated by the runtime once a step binds its symbols.

use crate::kernels::{BinaryOpKey, KernelSpec, UnaryOpKey};
pub use crate::options::{ScheduleOptions, SwiGluFusion, Tma};
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
    /// not launched for steps of fewer rows (an RMSNorm the decode GEMVs after it compute in
    /// their prologue)
    pub min_rows: Option<i64>,
    /// not launched for steps of more rows (the split decode attention's second pass: the
    /// prefill attention writes the output itself)
    pub max_rows: Option<i64>,
    /// launched only in steps whose longest context (keys of the sequence with the most) is
    /// at least / at most this: the split decode attention from [`ATTN_SPLIT_FROM_KEYS`] keys,
    /// the one-pass kernel below (the runtime keeps a bucket per context class)
    pub min_context: Option<i64>,
    pub max_context: Option<i64>,
    /// launched only where the Hopper alternatives run (sm_90a, wgmma on): the second pass of
    /// a split-K alternative
    pub hopper_only: bool,
    /// not launched where the Hopper alternatives run for rows in this range (inclusive): an
    /// earlier step's Hopper alternative writes this node in its epilogue
    /// ([`fuse_swiglu_pipe`]: the gate/up matmul's SwiGLU)
    pub hopper_skip: Option<(i64, i64)>,
    /// a kernel for large steps, used when the output has at least `min_rows` rows (the
    /// tensor-core matmul for prefill; the default kernel is the decode GEMV path)
    pub large: Option<Large>,
    /// on sm_90a, used instead of `large` and ahead of `few`, each for its row range (the
    /// first that fits): the pipelined wgmma matmul in 64-row tiles (batched decode) and in
    /// 128-row tiles (prefill), or the older wgmma matmul
    pub hopper: Vec<Large>,
    /// on sm_90a for fewer rows than `hopper` takes (16-column tiles: more blocks)
    pub hopper_small: Option<Large>,
    /// on any target, each for its `min_rows..=max_rows` rows (the first that fits), after
    /// `hopper` where that takes the rows: the batched decode GEMVs (each weight read once per
    /// 8 or 32 rows; x in f32, or from more rows its 16-bit copy)
    pub few: Vec<Large>,
    /// a collective over the tensor-parallel group, done in place on the aliased buffer
    /// ("all_reduce_sum"); the runtime issues it (NCCL, or local copies when simulating)
    pub collective: Option<String>,
}

impl Step {
    /// A step of `node` that launches nothing and aliases nothing yet (fields to fill in).
    pub fn new(node: &str) -> Step {
        Step {
            node: node.to_string(),
            kernel: None,
            args: vec![],
            scalars: vec![],
            work: Scalar::Const(0),
            grid_y: Scalar::Const(1),
            alias_of: None,
            alias_offset: None,
            min_rows: None,
            max_rows: None,
            min_context: None,
            max_context: None,
            hopper_only: false,
            hopper_skip: None,
            large: None,
            hopper: vec![],
            hopper_small: None,
            few: vec![],
            collective: None,
        }
    }

    /// Every buffer the step's kernels name: its args and every alternative's own.
    pub fn buffers(&self) -> impl Iterator<Item = &String> {
        self.args.iter().chain(self.alternatives().filter_map(|l| l.args.as_ref()).flatten())
    }

    /// Every alternative kernel of the step (tensor-core matmuls, batched GEMVs).
    pub fn alternatives(&self) -> impl Iterator<Item = &Large> {
        self.large.iter().chain(&self.hopper).chain(&self.hopper_small).chain(&self.few)
    }

    /// Give every alternative without args of its own the step's current args, and return
    /// them: for a fusion that changes the default kernel's args while the alternatives keep
    /// reading what they read.
    fn keep_alternative_args(&mut self) -> Vec<String> {
        let old = self.args.clone();
        for l in self.alternatives_mut() {
            l.args.get_or_insert_with(|| old.clone());
        }
        old
    }

    /// [`Step::alternatives`], to change them.
    pub fn alternatives_mut(&mut self) -> impl Iterator<Item = &mut Large> {
        self.large.iter_mut().chain(&mut self.hopper).chain(&mut self.hopper_small).chain(&mut self.few)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Large {
    pub min_rows: i64,
    /// used only up to this many rows (none: no bound)
    pub max_rows: Option<i64>,
    /// buffers when they differ from the step's (the step's default kernel reads the
    /// un-normalized input when the norm is fused into it)
    pub args: Option<Vec<String>>,
    pub kernel: KernelSpec,
    pub scalars: Vec<Scalar>,
    pub work: Scalar,
    pub grid_y: Scalar,
}

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
fn pipe_min_rows(o: &ScheduleOptions, n: usize, bn: usize) -> i64 {
    if let Some(r) = o.pipe_min_rows {
        return r;
    }
    if n.div_ceil(bn) >= 96 {
        16
    } else {
        64
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
fn pipe64_rows(o: &ScheduleOptions, n: usize) -> (i64, i64) {
    if let Some(p) = o.pipe64_rows {
        return p;
    }
    (if n >= 6144 { 32 } else { 48 }, 64)
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

/// Lower every compute node of `g` with the schedule choices `o`. Leaves (inputs, weights,
/// states) get no step.
pub fn lower(g: &Graph, o: &ScheduleOptions) -> Result<Vec<Step>, CodegenError> {
    lower_opts(g, *o)
}

/// The KV pool type of a cache write's or attention's pool, if the GPU kernels take it: f32,
/// or bf16 (half the bytes the decode attention streams; FP8 comes with quantization).
fn gpu_kv(node: &str, dtype: DType) -> Result<DType, CodegenError> {
    match dtype {
        DType::F32 | DType::BF16 => Ok(dtype),
        other => Err(err(node, format!("{other} KV caches are not lowered for the GPU; use kv_cache = \"bf16\" or \"f32\""))),
    }
}

/// [`lower`] with explicit [`ScheduleOptions`].
pub fn lower_opts(g: &Graph, opts: ScheduleOptions) -> Result<Vec<Step>, CodegenError> {
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
        let one = Scalar::Const(1);
        let step = |kernel, args, scalars, work, grid_y| Step { kernel: Some(kernel), args, scalars, work, grid_y, ..Step::new(&name) };
        let alias = |of: &str| Step { alias_of: Some(of.to_string()), ..Step::new(&name) };
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
                let st = step(KernelSpec::RmsNorm { d, eps_bits: eps.to_bits() }, args, vec![Scalar::Rows(name.clone())], Scalar::Rows(name.clone()), one);
                // one-row steps: the decode GEMVs reading it normalize in their prologue
                Step { min_rows: norms.contains(&id).then_some(2), ..st }
            }
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
                let st = matmul_step(&name, args, k, nn, ops[1].ty.dtype, ops.len() > 2, residual, None, &opts)?;
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
                let st = matmul_step(&name, args, k, total, ops[1].ty.dtype, false, false, Some(&parts), &opts)?;
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
            Op::PagedAttention { scale } => {
                let c = |t: &dsc_ir::TensorType, i: usize| t.shape[i].as_const();
                let (h, d) = (c(&ops[0].ty, 1), c(&ops[0].ty, 2));
                let (bs, kvh) = (c(&ops[1].ty, 1), c(&ops[1].ty, 2));
                let (Some(h), Some(d), Some(bs), Some(kvh)) = (h, d, bs, kvh) else {
                    return Err(err(&name, "paged attention needs constant heads, head dim and block size"));
                };
                let kv = gpu_kv(&name, ops[1].ty.dtype)?;
                let spec = KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps: opts.attn_warps, keys: opts.attn_keys, group: 1, kv };
                let mb = Scalar::Dim(names[5].clone(), 1);
                // (a block per (token, head): grid x = tokens, y = heads)
                let st = step(spec, args, vec![Scalar::Rows(name.clone()), mb.clone()], Scalar::Dim(name.clone(), 0), Scalar::Const(h as i64));
                // prefill (more than 128 tokens: never a decode batch): FlashAttention tiles on
                // the tensor cores, a block per (64 tokens, head). (Rows here are tokens x heads.)
                let flash = (d % 16 == 0 && d <= 128 && opts.flash).then(|| Large {
                    min_rows: 129 * h as i64,
                    max_rows: None,
                    args: None,
                    kernel: KernelSpec::FlashAttention {
                        h,
                        kvh,
                        d,
                        bs,
                        scale_bits: scale.to_bits(),
                        kv,
                        warps: if kv == DType::F32 || d % 32 != 0 { 4 } else { opts.flash_warps },
                        mtiles: if kv == DType::F32 || d % 32 != 0 { 1 } else { opts.flash_mtiles },
                    },
                    scalars: vec![Scalar::Dim(name.clone(), 0), mb],
                    work: Scalar::Const(h as i64),
                    grid_y: Scalar::Dim(name.clone(), 0),
                });
                // batched decode (from as many tokens as give ATTN_GROUP_MIN_BLOCKS blocks, up
                // to the prefill kernel's rows): a block per (token, KV head) taking the KV
                // head's query heads, each K/V row read once for them, in fewer warps
                let gw = opts.attn_group_warps;
                let g = attention_group_size(h, kvh, d, gw);
                let max_rows = flash.as_ref().map(|f| f.min_rows - 1);
                let grouped = (g > 1 && opts.attn_group).then(|| Large {
                    min_rows: (ATTN_GROUP_MIN_BLOCKS.div_ceil(h / g) * h) as i64,
                    max_rows,
                    args: None,
                    kernel: KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps: gw, keys: opts.attn_group_keys.unwrap_or(opts.attn_keys), group: g, kv },
                    scalars: st.scalars.clone(),
                    work: Scalar::Dim(name.clone(), 0),
                    grid_y: Scalar::Const((h / g) as i64),
                });
                // (sm_90a, bf16 pools: the same tiles with both products on wgmma)
                let wg = flash.as_ref().filter(|f| opts.flash_wgmma && matches!(f.kernel, KernelSpec::FlashAttention { kv: DType::BF16, warps: 4, mtiles: 1, d: crate::kernels::FLASH_WG_D, .. })).map(
                    |f| {
                        // (K/V tiles by TMA: the pools' args become their tensor maps,
                        // `{pool}@kvmap{rows}`, encoded by the runtime once per pool)
                        let args = crate::kernels::flash_wg_tma_rows(bs).map(|rows| {
                            let mut a = f.args.clone().unwrap_or_else(|| st.args.clone());
                            for p in &mut a[1..3] {
                                *p = format!("{p}@kvmap{rows}");
                            }
                            a
                        });
                        Large { kernel: KernelSpec::FlashWgmma { inner: Box::new(f.kernel.clone()) }, args: args.or_else(|| f.args.clone()), ..f.clone() }
                    },
                );
                Step { large: flash, few: grouped.into_iter().collect(), hopper: wg.into_iter().collect(), ..st }
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
                step(KernelSpec::LayerNorm { d, eps_bits: eps.to_bits(), half: None }, args, vec![Scalar::Rows(name.clone())], Scalar::Rows(name.clone()), one)
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
    if opts.qkv_rope_fusion {
        fuse_qkv_rope_cache(g, &mut steps);
    }
    if opts.swiglu_fusion {
        fuse_swiglu(g, &mut steps);
    }
    let steps = if opts.split_kv { split_attention(steps, opts.attn_group, opts.split_kv_from) } else { steps };
    let steps = if opts.rope_attention { fuse_rope_attention(steps, opts.split_kv.then_some(opts.split_kv_from)) } else { steps };
    let steps = match opts.split_k {
        Some(sk) => split_k(steps, sk),
        None => steps,
    };
    let steps = insert_half_casts(steps, opts.norm_half, opts.silu_half);
    let steps = fuse_swiglu_pipe(steps, opts.swiglu_pipe, opts.tma, opts.ws);
    // (with 8 warps per row instead of 32 the fold lost: 8B b32 6,360 -> 6,021 tok/s, b64
    // 10,447 -> 9,793, bench/results/splitk-norm-2026-11-30.json)
    let fold = opts.split_k.is_some() && opts.splitk_norm;
    let steps = if fold { fold_splitk_reduce_norm(steps, opts.splitk_norm_cluster) } else { steps };
    let steps = if opts.splitk_rope { fold_splitk_reduce_rope(steps) } else { steps };
    let steps = tma_wrap(steps, opts.tma, opts.ws, opts.ws64);
    let steps = if opts.attn_o { fuse_attention_o(steps) } else { steps };
    let steps = if opts.swiglu_down { fuse_swiglu_down(g, steps, opts.swiglu_down_fb, opts.swiglu_down_fpw) } else { steps };
    let steps = if opts.swiglu_down && opts.attn_o_red { fuse_attention_o_red(steps, opts.attn_o_splits) } else { steps };
    let steps = if opts.swiglu_down && opts.attn_o_red && opts.qkv_attn { fuse_qkv_attention(steps) } else { steps };
    let steps = if opts.row_gather_norm { fold_row_gather(g, steps) } else { steps };
    let steps = if opts.wide_norm { fold_norm_into_wide(g, steps) } else { steps };
    let steps = if opts.gather_gemv { fold_embedding_gather(steps) } else { steps };
    let steps = match opts.lm_head_prefetch_mb {
        Some(mb) => prefetch_lm_head(steps, g, mb << 20),
        None => steps,
    };
    Ok(if opts.attn_prefetch { prefetch_after_attention(steps, g) } else { steps })
}

/// The q/k/v GEMV folded into the one-token attention with the o projection added
/// ([`fuse_attention_o_red`]; `KernelSpec::QkvAttentionO`): where that attention's q, k and v
/// are the three parts of a merged bias-less bf16 GEMV with the norm prologue (which zeroes the
/// attention's accumulators, `ZeroFill`), and the one-row kernel before that GEMV is the
/// previous layer's fused MLP writing the GEMV's x, the attention's one-row kernel reads x, g
/// and the three weights instead (each head's blocks a cluster on sm_90a), the MLP zeroes the
/// accumulators (`ZeroFill` over `SwiGluDown`), and the GEMV runs from two rows — and at one
/// row only at the contexts past the fused attention's (the split attention's, where the o
/// GEMV writes both accumulators), without the zero fill. A launch fewer per layer at batch 1
/// from the second layer on (the first layer's GEMV follows the embedding gather; under
/// DSC_QKV_ATTN_L0=1 the gather zeroes the accumulators too, `ZeroFill` over `Gather`, and the
/// first layer is fused as well — measured slower).
fn fuse_qkv_attention(mut steps: Vec<Step>) -> Vec<Step> {
    // (the element offset of a view of a merged matmul's output, through plain aliases)
    let offset_of = |steps: &[Step], name: &str, root: &str| -> Option<i64> {
        let mut n = name.to_string();
        for _ in 0..8 {
            let s = steps.iter().find(|s| s.node == n && s.alias_of.is_some())?;
            let of = s.alias_of.clone()?;
            match &s.alias_offset {
                Some(Scalar::RowsTimes(r, off)) if of == root && r == root => return Some(*off),
                Some(_) => return None,
                None => n = of,
            }
        }
        None
    };
    let mut i = 0;
    while i < steps.len() {
        let Some(KernelSpec::AttentionO { inner, red: true, splits, .. }) = &steps[i].kernel else {
            i += 1;
            continue;
        };
        let KernelSpec::RopeAttention { inner: att, .. } = inner.as_ref() else {
            i += 1;
            continue;
        };
        let KernelSpec::PagedAttention { h, kvh, d, .. } = *att.as_ref() else {
            i += 1;
            continue;
        };
        let splits = *splits;
        // the zero-filling q/k/v GEMV and the fused MLP before it
        let Some(z) = steps[..i].iter().rposition(|s| matches!(s.kernel, Some(KernelSpec::ZeroFill { .. }))) else {
            i += 1;
            continue;
        };
        let Some(KernelSpec::ZeroFill { inner: zi, len }) = steps[z].kernel.clone() else { unreachable!("matched") };
        let KernelSpec::NormMatMul { inner: mm, eps_bits } = zi.as_ref() else {
            i += 1;
            continue;
        };
        let KernelSpec::MatMulParts { inner: core, parts } = mm.as_ref() else {
            i += 1;
            continue;
        };
        let KernelSpec::MatMul { k, wdtype: DType::BF16, bias: false, residual: false, .. } = **core else {
            i += 1;
            continue;
        };
        // (the GEMV's args: the two accumulators, x, g, the parts' weights, its output)
        if parts.len() != 3 || steps[z].args.len() != 8 || steps[i].args.len() != 13 || !unbounded(&steps[z]) {
            i += 1;
            continue;
        }
        let (x, g, out) = (steps[z].args[2].clone(), steps[z].args[3].clone(), steps[z].args[7].clone());
        // q, k and v: which part each view starts at
        let starts: Vec<i64> = parts
            .iter()
            .scan(0i64, |a, &p| {
                let s = *a;
                *a += p as i64;
                Some(s)
            })
            .collect();
        let part = |v: &str, width: usize| -> Option<usize> {
            let off = offset_of(&steps, v, &out)?;
            (0..3).find(|&j| starts[j] == off && parts[j] == width)
        };
        let (Some(pq), Some(pk), Some(pv)) = (part(&steps[i].args[0], h * d), part(&steps[i].args[1], kvh * d), part(&steps[i].args[2], kvh * d)) else {
            i += 1;
            continue;
        };
        let Some(p) = steps[..z].iter().rposition(|s| s.kernel.is_some() && s.min_rows.is_none()) else {
            i += 1;
            continue;
        };
        // (the kernel zeroing the accumulators has a thread for each of their `len` floats:
        // the fused MLP's. (Not the first layer's embedding gather, a thread per element of x:
        // measured slower, SmolLM2 b1 0.255 -> 0.258 ms, as there the fused kernel's 36 blocks
        // load their W_q/W_k/W_v rows from DRAM with no MLP before them to hide it, where the
        // GEMV spreads them over all SMs.)
        let mlp_fits = match &steps[p].kernel {
            Some(KernelSpec::SwiGluDown { f, fb, fpw, .. }) => (f / fb) * 32 * (fb / fpw) >= len,
            _ => false,
        };
        if !mlp_fits || steps[p].node != x || steps[p].args.last() != Some(&x) {
            i += 1;
            continue;
        }
        let fused = KernelSpec::QkvAttentionO { inner: Box::new(steps[i].kernel.clone().expect("matched")), k, eps_bits: *eps_bits, cluster: splits };
        if !crate::kernels::emits(&fused) {
            i += 1;
            continue;
        }
        // the MLP zeroes the accumulators
        let (acc_out, acc_y) = (steps[z].args[0].clone(), steps[z].args[1].clone());
        let ps = &mut steps[p];
        let old = ps.keep_alternative_args();
        ps.kernel = ps.kernel.take().map(|k| KernelSpec::ZeroFill { inner: Box::new(k), len });
        ps.args = [acc_out, acc_y].into_iter().chain(old).collect();
        // the attention computes q, k and v
        let zargs = steps[z].args.clone();
        let a = &mut steps[i];
        let max_context = a.max_context;
        let old = a.keep_alternative_args();
        a.kernel = Some(fused);
        a.args = [x, g, zargs[4 + pq].clone(), zargs[4 + pk].clone(), zargs[4 + pv].clone()].into_iter().chain(old[3..].iter().cloned()).collect();
        // the GEMV: from two rows, and at one row past the fused attention's contexts (plain)
        let zs = steps[z].clone();
        steps[z] = Step { min_rows: Some(2), ..zs.clone() };
        if let Some(mc) = max_context {
            let plain =
                Step { kernel: Some((*zi).clone()), args: zargs[2..].to_vec(), max_rows: Some(1), min_context: Some(mc + 1), large: None, hopper: vec![], hopper_small: None, few: vec![], ..zs };
            steps.insert(z + 1, plain);
            i += 1;
        }
        i += 1;
    }
    steps
}

/// The logits' row gather folded into the final RMSNorm (`KernelSpec::RowGather`): where a
/// plain f32 row gather of an activation (`Gather` with no alternatives, the logit rows of the
/// last hidden state, not a graph output) is read by nothing but the next kernel step, a block-per-row RMSNorm
/// (D a multiple of 4), the norm reads its rows through the gather's indices and the gather's
/// step goes (its buffer with it). DSC_ROW_GATHER_NORM=0 at compile time keeps them apart.
fn fold_row_gather(g: &Graph, mut steps: Vec<Step>) -> Vec<Step> {
    let mut i = 0;
    while i + 1 < steps.len() {
        let Some(KernelSpec::Gather { dtype: DType::F32, .. }) = steps[i].kernel else {
            i += 1;
            continue;
        };
        let out = steps[i].node.clone();
        let Some(j) = (i + 1..steps.len()).find(|&j| steps[j].kernel.is_some()) else { break };
        let norm_fits = matches!(&steps[j].kernel, Some(KernelSpec::RmsNorm { d, .. } | KernelSpec::RmsNormHalf { d, .. }) if d % 4 == 0);
        // (the gather's output: x of that norm and nowhere else, no alias of it)
        let only_there = steps.iter().enumerate().all(|(k, s)| k == i || (k == j) == s.args.contains(&out)) && steps[j].args.first() == Some(&out) && !steps[j].args[1..].contains(&out);
        let plain = |s: &Step| unbounded(s) && s.alternatives().next().is_none();
        let aliased = steps.iter().any(|s| s.alias_of.as_deref() == Some(out.as_str())) || g.outputs.iter().any(|(_, o)| g.node(*o).name == out);
        if !norm_fits || !only_there || !plain(&steps[i]) || !plain(&steps[j]) || aliased || steps[i].args.len() != 3 {
            i += 1;
            continue;
        }
        let (table, idx) = (steps[i].args[0].clone(), steps[i].args[1].clone());
        let n = &mut steps[j];
        n.kernel = n.kernel.take().map(|k| KernelSpec::RowGather { inner: Box::new(k) });
        n.args = [idx, table].into_iter().chain(n.args[1..].iter().cloned()).collect();
        steps.remove(i);
    }
    steps
}

/// The final RMSNorm (with the logits' row gather folded in, or without) folded into the wide
/// GEMV after it (`KernelSpec::MatMulWide`, the lm_head): its default kernel becomes
/// `NormMatMul { MatMulWide }` (under `RowGather`), every warp normalizing its registers'
/// share of x itself, and the norm runs from two rows only (the GEMV's alternatives read its
/// output). One kernel less per step; DSC_WIDE_NORM=0 at compile time off.
fn fold_norm_into_wide(g: &Graph, mut steps: Vec<Step>) -> Vec<Step> {
    let Some(j) = steps.iter().position(|s| matches!(s.kernel, Some(KernelSpec::MatMulWide { bias: false, .. })) && unbounded(s) && s.args.len() == 3) else {
        return steps;
    };
    let Some(KernelSpec::MatMulWide { k, .. }) = steps[j].kernel else { unreachable!("matched") };
    let x = steps[j].args[0].clone();
    let Some(i) = steps[..j].iter().rposition(|s| s.node == x) else { return steps };
    // (the norm, maybe with its 16-bit copy for the prefill matmuls: 1 or 2 outputs)
    let norm_of = |k: &KernelSpec| match k {
        KernelSpec::RmsNorm { d, eps_bits } => Some((*d, *eps_bits, 1)),
        KernelSpec::RmsNormHalf { d, eps_bits, .. } => Some((*d, *eps_bits, 2)),
        _ => None,
    };
    let (gather, (d, eps_bits, nout)) = match &steps[i].kernel {
        Some(KernelSpec::RowGather { inner }) => match norm_of(inner) {
            Some(n) => (true, n),
            None => return steps,
        },
        Some(other) => match norm_of(other) {
            Some(n) => (false, n),
            None => return steps,
        },
        None => return steps,
    };
    let nargs = steps[i].args.len();
    if d != k || nargs < nout + 2 || steps[i].args[nargs - nout] != x {
        return steps;
    }
    // (the norm's outputs read by that GEMV alone — its alternatives aside — under no alias,
    // and not graph outputs)
    let outs = steps[i].args[nargs - nout..].to_vec();
    let reads = |s: &Step| outs.iter().any(|o| s.args.contains(o) || s.alternatives().any(|l| l.args.as_ref().is_some_and(|a| a.contains(o))));
    let only_there = steps.iter().enumerate().all(|(n, s)| n == i || n == j || !reads(s)) && !steps[j].args[1..].iter().any(|a| outs.contains(a));
    let aliased = steps.iter().any(|s| s.alias_of.as_deref().is_some_and(|a| outs.iter().any(|o| o == a))) || g.outputs.iter().any(|(_, o)| outs.contains(&g.node(*o).name));
    let plain = unbounded(&steps[i]) && steps[i].alternatives().next().is_none();
    if !only_there || aliased || !plain {
        return steps;
    }
    let Some(wide) = steps[j].kernel.clone() else { return steps };
    let inner = KernelSpec::NormMatMul { inner: Box::new(wide), eps_bits };
    let kernel = if gather { KernelSpec::RowGather { inner: Box::new(inner) } } else { inner };
    if !crate::kernels::emits(&kernel) {
        return steps;
    }
    let pre = steps[i].args[..nargs - nout].to_vec();
    let s = &mut steps[j];
    s.keep_alternative_args();
    s.kernel = Some(kernel);
    s.args = pre.into_iter().chain(s.args[1..].iter().cloned()).collect();
    steps[i].min_rows = Some(2);
    steps
}

/// The embedding gather folded into the one-row q/k/v GEMV after it (`KernelSpec::GatherX`;
/// on by default since session 19, DSC_GATHER_GEMV=0 at compile time off): where a bf16
/// table's `Gather` writes x and the next kernel step is the one-row GEMV with the norm
/// prologue (zero-filling or not) reading x first, that GEMV reads the table row itself and its
/// block 0 writes x for the kernels after it; the gather runs from two rows only (the GEMV's
/// alternatives read x).
fn fold_embedding_gather(mut steps: Vec<Step>) -> Vec<Step> {
    let Some(i) = steps.iter().position(|s| matches!(s.kernel, Some(KernelSpec::Gather { dtype: DType::BF16, .. })) && unbounded(s) && s.alternatives().next().is_none()) else {
        return steps;
    };
    let x = steps[i].node.clone();
    // (the next kernel at one row: the norm for more rows, `min_rows`, runs with the gather)
    let Some(z) = (i + 1..steps.len()).find(|&j| steps[j].kernel.is_some() && steps[j].min_rows.is_none_or(|m| m <= 1)) else { return steps };
    let xi = match &steps[z].kernel {
        Some(KernelSpec::ZeroFill { inner, .. }) if matches!(inner.as_ref(), KernelSpec::NormMatMul { .. }) => 2,
        Some(KernelSpec::NormMatMul { .. }) => 0,
        _ => return steps,
    };
    if steps[i].args.len() != 3 || steps[z].args.get(xi) != Some(&x) || !unbounded(&steps[z]) {
        return steps;
    }
    let fused = |k: KernelSpec| match k {
        KernelSpec::ZeroFill { inner, len } => KernelSpec::ZeroFill { inner: Box::new(KernelSpec::GatherX { inner }), len },
        other => KernelSpec::GatherX { inner: Box::new(other) },
    };
    let Some(k) = steps[z].kernel.clone().map(fused) else { return steps };
    if !crate::kernels::emits(&k) {
        return steps;
    }
    let (table, tok) = (steps[i].args[0].clone(), steps[i].args[1].clone());
    let zs = &mut steps[z];
    zs.keep_alternative_args();
    zs.kernel = Some(k);
    zs.args.splice(xi..xi, [table, tok]);
    steps[i].min_rows = Some(2);
    steps
}

/// Bytes of graph weight `name` where it is plain float (bf16, f16, f32): what an L2 prefetch
/// of it moves.
fn plain_weight_bytes(g: &Graph, name: &str) -> Option<usize> {
    let n = g.node(g.by_name(name)?);
    if !matches!(n.op, Op::Weight) || !matches!(n.ty.dtype, DType::BF16 | DType::F16 | DType::F32) {
        return None;
    }
    n.ty.dtype.bytes_for(n.ty.const_numel()?)
}

/// The one-row lm_head GEMV (the last step's weight, too large for its own L2 prefetch) reads
/// its first rows from L2: the last one-token fused attention before it (`QkvAttentionO`; or
/// the last fused MLP) prefetches the weight's first `bytes` before its wait
/// (`KernelSpec::PrefetchL2`) — DRAM is mostly idle under the latency-bound layer, and the
/// GEMV's blocks take the rows in order.
fn prefetch_lm_head(mut steps: Vec<Step>, g: &Graph, bytes: usize) -> Vec<Step> {
    let Some(h) = steps.iter().rposition(|s| matches!(s.kernel, Some(KernelSpec::MatMul { .. })) && unbounded(s)) else { return steps };
    let Some(w) = steps[h].args.get(1).cloned() else { return steps };
    let Some(wb) = plain_weight_bytes(g, &w).filter(|&b| b > crate::kernels::GEMV_PREFETCH_MAX_BYTES) else { return steps };
    let Some(p) = steps[..h]
        .iter()
        .rposition(|s| matches!(s.kernel, Some(KernelSpec::QkvAttentionO { .. })))
        .or_else(|| steps[..h].iter().rposition(|s| s.kernel.as_ref().is_some_and(KernelSpec::is_fused_mlp)))
    else {
        return steps;
    };
    let s = &mut steps[p];
    s.keep_alternative_args();
    s.kernel = s.kernel.take().map(|k| KernelSpec::PrefetchL2 { inner: Box::new(k) });
    s.args.insert(0, w);
    s.scalars.push(Scalar::Const(bytes.min(wb) as i64 / 16 * 16));
    steps
}

/// The one-token RoPE attention of a head per block at step `i`, if it is one: its heads,
/// H·D, and the names its output goes by (itself and the views of it).
fn one_token_attention(steps: &[Step], i: usize) -> Option<(usize, usize, Vec<String>)> {
    let Some(KernelSpec::RopeAttention { inner, .. }) = &steps[i].kernel else { return None };
    let KernelSpec::PagedAttention { h, d, group: 1, .. } = inner.as_ref() else { return None };
    let a = steps[i].node.as_str();
    let views = std::iter::once(a.to_string()).chain(steps.iter().filter(|s| s.alias_of.as_deref() == Some(a) && s.alias_offset.is_none()).map(|s| s.node.clone())).collect();
    Some((*h, h * d, views))
}

/// Whether a step launches for every row count and context (no bounds).
fn unbounded(s: &Step) -> bool {
    s.min_rows.is_none() && s.max_rows.is_none() && s.min_context.is_none() && s.max_context.is_none()
}

/// Blocks per head of the one-token attention with the o projection added in
/// ([`fuse_attention_o_red`]), each taking 1/ATTN_O_SPLITS of W_o's rows.
pub const ATTN_O_SPLITS: usize = 4;

/// Most bytes of W_o one block of the fused one-token attention reads ([`fuse_attention_o`]).
pub const ATTN_O_MAX_BYTES: usize = 128 << 10;

/// The o projection folded into the one-token RoPE attention (`KernelSpec::AttentionO`, sm_90a
/// and sm_80 alike): where a `RopeAttention` step (a head per block, one token) feeds, through
/// views, a bias-less bf16 matmul with a residual whose K is H·D, the attention step takes the
/// matmul's weight, residual and output, plus `{y}@splitk{H}` (the heads' partial sums,
/// [H, T, N], declared by a kernel-less step before it) and `{y}@sync` (a counter per token,
/// resident, zeroed once by the runtime), and the matmul's step keeps the other cases: two or
/// more tokens, and one token at the contexts the split attention takes (past the fused step's
/// `max_context`). A launch fewer per layer at batch 1.
fn fuse_attention_o(mut steps: Vec<Step>) -> Vec<Step> {
    let mut i = 0;
    while i < steps.len() {
        let Some((h, hd, views)) = one_token_attention(&steps, i) else {
            i += 1;
            continue;
        };
        let o = steps.iter().position(|s| {
            matches!(s.kernel, Some(KernelSpec::MatMul { k, residual: true, bias: false, wdtype: DType::BF16, .. }) if k == hd) && s.args.len() == 4 && views.contains(&s.args[0]) && unbounded(s)
        });
        let Some(o) = o.filter(|&o| o > i) else {
            i += 1;
            continue;
        };
        let Some(KernelSpec::MatMul { n, .. }) = steps[o].kernel else { unreachable!("matched") };
        // (each block reads its head's columns of W_o: small models only — the 8B shape's
        // would be 1 MB per block on 32 SMs, where its o GEMV streams on all of them)
        if n * (hd / h) * 2 > ATTN_O_MAX_BYTES {
            i += 1;
            continue;
        }
        let om = steps[o].clone();
        let (w, res, y) = (om.args[1].clone(), om.args[2].clone(), om.args[3].clone());
        let parts = format!("{y}@splitk{h}");
        let fused = &mut steps[i];
        let max_context = fused.max_context;
        let inner = fused.kernel.take().expect("matched");
        fused.kernel = Some(KernelSpec::AttentionO { inner: Box::new(inner), n, red: false, splits: 1 });
        fused.args.truncate(9);
        fused.args.extend([w, res, parts.clone(), format!("{y}@sync"), y.clone()]);
        // (the matmul for two or more tokens, and for one at the split attention's contexts)
        steps[o] = Step { min_rows: Some(2), ..om.clone() };
        if let Some(mc) = max_context {
            steps.insert(o + 1, Step { max_rows: Some(1), min_context: Some(mc + 1), ..om });
        }
        steps.insert(i, Step::new(&parts));
        i += 2;
    }
    steps
}

/// The one-token MLP as one kernel (`KernelSpec::SwiGluDown`): where the SwiGLU GEMV with the
/// norm prologue (`NormMatMul` over `SwiGluGemv`, bf16, reading x and writing h) feeds the
/// down projection's one-row GEMV (bf16, bias-less, its residual that same x, nothing else
/// reading h), and x is the output of a one-row bias-less GEMV with a residual (the o
/// projection), the down step's one-row kernel becomes the fused MLP reading x, g and the
/// three weights and adding into its output, which the o projection's one-row kernel also
/// writes (`MatMulCopy`: the residual seeded); the SwiGLU step then runs only from two rows
/// (its alternatives), and the down step's alternatives keep their kernels. Two launches
/// fewer per layer at batch 1. (Not where h is a graph output: it is not written at one row.)
fn fuse_swiglu_down(g: &Graph, mut steps: Vec<Step>, fb: usize, fpw: usize) -> Vec<Step> {
    for ci in 0..steps.len() {
        let Some(KernelSpec::NormMatMul { inner, eps_bits }) = &steps[ci].kernel else { continue };
        let KernelSpec::SwiGluGemv { k, f, wdtype: DType::BF16 } = **inner else { continue };
        let eps_bits = *eps_bits;
        if steps[ci].min_rows.is_some() || steps[ci].args.len() != 5 {
            continue;
        }
        let [x, gn, wg, wu, h] = <[String; 5]>::try_from(steps[ci].args.clone()).expect("five args");
        // (h is written only from two rows on now: not where a graph output needs it)
        if g.outputs.iter().any(|(_, o)| g.node(*o).name == h) {
            continue;
        }
        // the one reader of h on the one-row path: the down projection, residual x
        let readers: Vec<usize> = (0..steps.len()).filter(|&i| i != ci && steps[i].buffers().any(|a| *a == h)).collect();
        let down = readers.iter().copied().find(|&i| {
            matches!(steps[i].kernel, Some(KernelSpec::MatMul { k: dk, wdtype: DType::BF16, bias: false, residual: true, .. }) if dk == f)
                && steps[i].args.len() == 4
                && steps[i].args[0] == h
                && steps[i].args[2] == x
                && steps[i].min_rows.is_none()
                && steps[i].max_rows.is_none()
        });
        let Some(di) = down.filter(|&di| di > ci) else { continue };
        // (the silu_mul step that writes h from two rows, and the down step: no one else)
        if readers.iter().any(|&i| i != di && !(steps[i].node == h && steps[i].min_rows.is_some_and(|m| m >= 2))) {
            continue;
        }
        let Some(KernelSpec::MatMul { n, .. }) = steps[di].kernel else { unreachable!("matched") };
        if crate::kernels::swiglu_down_fits(k, f, n, fb, fpw).is_err() {
            continue;
        }
        // x's producer: the one-row plain GEMV with a residual, nothing between it and the
        // MLP writing x
        let Some(oi) = steps[..ci].iter().rposition(|s| s.node == x) else { continue };
        let o = &steps[oi];
        let plain = matches!(o.kernel, Some(KernelSpec::MatMul { bias: false, residual: true, wdtype: DType::F32 | DType::F16 | DType::BF16, .. }));
        if !plain || o.args.len() != 4 || o.args[3] != x || !unbounded(o) {
            continue;
        }
        let y = steps[di].node.clone();
        let wd = steps[di].args[1].clone();
        // the o projection's one-row kernel seeds y with x
        let o = &mut steps[oi];
        let old = o.keep_alternative_args();
        o.kernel = o.kernel.take().map(|k| KernelSpec::MatMulCopy { inner: Box::new(k) });
        o.args = vec![old[0].clone(), old[1].clone(), old[2].clone(), y.clone(), old[3].clone()];
        // the SwiGLU GEMV from two rows only (its alternatives)
        steps[ci].min_rows = Some(2);
        let d = &mut steps[di];
        d.keep_alternative_args();
        d.kernel = Some(KernelSpec::SwiGluDown { k, f, n, eps_bits, fb, fpw });
        d.args = vec![x, gn, wg, wu, wd, y];
        d.scalars = vec![Scalar::Const(f as i64)];
        d.work = Scalar::Const(f as i64);
    }
    steps
}

/// The o projection folded into the one-token RoPE attention where the fused MLP follows
/// ([`fuse_swiglu_down`]; `KernelSpec::AttentionO` with `red`): the o step's one-row kernel
/// (`MatMulCopy`, writing the residual stream x and the MLP's accumulator y) is replaced by
/// the attention's blocks adding their heads' parts (head 0: + the residual) into both, which
/// the one-row q/k/v GEMV before it zeroes (`ZeroFill`). The o step keeps two rows and more,
/// and one row at the contexts the split attention takes (past the fused step's
/// `max_context`), where it writes both as before. A launch fewer per layer at batch 1.
fn fuse_attention_o_red(mut steps: Vec<Step>, splits_per_head: usize) -> Vec<Step> {
    let mut i = 0;
    while i < steps.len() {
        let Some((h, hd, views)) = one_token_attention(&steps, i) else {
            i += 1;
            continue;
        };
        let o = steps.iter().position(|s| {
            matches!(&s.kernel, Some(KernelSpec::MatMulCopy { inner }) if matches!(inner.as_ref(), KernelSpec::MatMul { k, residual: true, bias: false, wdtype: DType::BF16, .. } if *k == hd))
                && s.args.len() == 5
                && views.contains(&s.args[0])
                && unbounded(s)
        });
        // the q/k/v GEMV with the norm prologue before the attention zeroes the accumulators:
        // a grid of at least N threads in every part
        let z = steps[..i].iter().rposition(|s| s.kernel.is_some() && s.min_rows.is_none() && s.max_rows.is_none());
        let (Some(o), Some(z)) = (o.filter(|&o| o > i), z) else {
            i += 1;
            continue;
        };
        let Some(KernelSpec::MatMulCopy { inner }) = &steps[o].kernel else { unreachable!("matched") };
        let KernelSpec::MatMul { n, .. } = **inner else { unreachable!("matched") };
        let threads = |k: &KernelSpec| -> Option<usize> {
            let KernelSpec::NormMatMul { inner, .. } = k else { return None };
            let (core, parts) = inner.matmul_core();
            let KernelSpec::MatMul { n: cn, .. } = core else { return None };
            let per = crate::kernels::columns_per_block_of(core)?;
            let narrowest = parts.map_or(*cn, |p| p.iter().copied().min().unwrap_or(0));
            Some(narrowest.div_ceil(per) * 32 * crate::kernels::GEMV_WARPS)
        };
        if n * (hd / h) * 2 > ATTN_O_MAX_BYTES || steps[z].kernel.as_ref().and_then(threads).is_none_or(|t| t < n) {
            i += 1;
            continue;
        }
        // (the projection's rows over `splits` blocks per head, where they divide evenly)
        let splits = splits_per_head;
        let Scalar::Const(gy) = steps[i].grid_y else {
            i += 1;
            continue;
        };
        let splits = if n % splits == 0 { splits } else { 1 };
        let om = steps[o].clone();
        let (wo, res, y, x) = (om.args[1].clone(), om.args[2].clone(), om.args[3].clone(), om.args[4].clone());
        let fused = &mut steps[i];
        let max_context = fused.max_context;
        let att = fused.kernel.take().expect("matched");
        fused.kernel = Some(KernelSpec::AttentionO { inner: Box::new(att), n, red: true, splits });
        fused.grid_y = Scalar::Const(gy * splits as i64);
        fused.args.truncate(9);
        fused.args.extend([wo, res, y.clone(), x.clone()]);
        let zs = &mut steps[z];
        let old = zs.keep_alternative_args();
        zs.kernel = zs.kernel.take().map(|k| KernelSpec::ZeroFill { inner: Box::new(k), len: n });
        zs.args = [x, y].into_iter().chain(old).collect();
        steps[o] = Step { min_rows: Some(2), ..om.clone() };
        if let Some(mc) = max_context {
            steps.insert(o + 1, Step { max_rows: Some(1), min_context: Some(mc + 1), ..om });
        }
        i += 1;
    }
    steps
}

/// Most weight bytes the decode attention prefetches into L2 for the matmul after it (the
/// H200's L2 is 50 MB; the 8B shape's o projection is 33.5 MB).
pub const ATTN_PREFETCH_MAX_BYTES: usize = 40 << 20;

/// The decode attention steps (one-pass and grouped; not the prefill attention) prefetch into
/// L2 the weight of the first later step reading one (the output projection), where that
/// weight is larger than its own GEMV prefetches ([`crate::kernels::GEMV_PREFETCH_MAX_BYTES`])
/// and at most [`ATTN_PREFETCH_MAX_BYTES`]: `KernelSpec::PrefetchL2`, the weight as the first
/// arg and its bytes as the last scalar (the prefill alternative keeps the old args).
fn prefetch_after_attention(mut steps: Vec<Step>, g: &Graph) -> Vec<Step> {
    for i in 0..steps.len() {
        if !matches!(steps[i].kernel, Some(KernelSpec::PagedAttention { .. })) {
            continue;
        }
        let next = steps[i + 1..].iter().find_map(|s| {
            let ws: Vec<(String, usize)> = s.args.iter().filter_map(|a| plain_weight_bytes(g, a).map(|b| (a.clone(), b))).collect();
            (!ws.is_empty()).then_some(ws)
        });
        let Some([(w, bytes)]) = next.as_deref() else { continue };
        if *bytes <= crate::kernels::GEMV_PREFETCH_MAX_BYTES || *bytes > ATTN_PREFETCH_MAX_BYTES {
            continue;
        }
        let s = &mut steps[i];
        let original = s.args.clone();
        let wrap = |k: &KernelSpec| KernelSpec::PrefetchL2 { inner: Box::new(k.clone()) };
        s.kernel = s.kernel.as_ref().map(wrap);
        s.args.insert(0, w.clone());
        s.scalars.push(Scalar::Const(*bytes as i64));
        for l in &mut s.few {
            l.kernel = wrap(&l.kernel);
            l.scalars.push(Scalar::Const(*bytes as i64));
        }
        if let Some(l) = &mut s.large {
            l.args.get_or_insert(original);
        }
    }
    steps
}

/// The pipelined wgmma matmul alternatives (also inside split-K, merged parts or an
/// activation epilogue) that `which` takes load their W tiles by TMA (`KernelSpec::Tma`):
/// their weight args become their tensor maps, `{w}@tmap{bn}` (the runtime encodes one per
/// weight and tile height).
fn tma_wrap(mut steps: Vec<Step>, which: Tma, ws: bool, ws64: bool) -> Vec<Step> {
    for s in &mut steps {
        let step_args = s.args.clone();
        // (ws64: a 64-row alternative that also takes fewer than WS64_MIN_ROWS rows splits in
        // two at that row count — below it stays as it is, measured faster there — so the
        // rows its alternatives cover, and the first fit, are unchanged)
        if ws64 {
            let mut split = Vec::with_capacity(s.hopper.len());
            for h in s.hopper.drain(..) {
                let m64 = matches!(h.kernel.pipe_core(), KernelSpec::MatMulPipe { bm: 64, .. });
                if m64 && h.min_rows < WS64_MIN_ROWS && h.max_rows.is_none_or(|m| m >= WS64_MIN_ROWS) {
                    split.push(Large { max_rows: Some(WS64_MIN_ROWS - 1), ..h.clone() });
                    split.push(Large { min_rows: WS64_MIN_ROWS, ..h });
                } else {
                    split.push(h);
                }
            }
            s.hopper = split;
        }
        for h in &mut s.hopper {
            let (core, parts) = h.kernel.matmul_core();
            // (warp-specialized: the 128-row tiles, x in 16 bits, unsplit, and with `ws64` the
            // 64-row batched-decode tiles, split-K ones included; x's tensor map too. The
            // SwiGLU epilogue's tile takes wn/2 gate rows and wn/2 up rows per warpgroup)
            let swiglu = matches!(h.kernel, KernelSpec::SwiGluPipe { .. });
            if let KernelSpec::MatMulPipe { bn, bm, a16: true, stages, .. } = *h.kernel.pipe_core() {
                let on = if bm == crate::kernels::PIPE_BM { ws && !matches!(h.kernel, KernelSpec::SplitK { .. }) } else { ws64 && h.min_rows >= WS64_MIN_ROWS };
                if on && stages * 16 <= crate::kernels::TMA_MBAR_BYTES {
                    let wn = if bm == 64 { bn / 2 } else { bn };
                    let (weights, box_rows) = if swiglu { (2, wn / 2) } else { (parts.map_or(1, |p| p.len()), bn) };
                    let mut args = h.args.clone().unwrap_or_else(|| step_args.clone());
                    args[0] = format!("{}@xmap{bm}", args[0]);
                    for w in &mut args[1..1 + weights] {
                        *w = format!("{w}@tmap{box_rows}");
                    }
                    h.args = Some(args);
                    h.kernel = KernelSpec::Ws { inner: Box::new(h.kernel.clone()) };
                    continue;
                }
            }
            // (`takes_tma` is false under Tma::Off)
            if !takes_tma(&h.kernel, which) {
                continue;
            }
            let KernelSpec::MatMulPipe { bn, .. } = *core else { continue };
            let weights = parts.map_or(1, |p| p.len());
            let mut args = h.args.clone().unwrap_or_else(|| step_args.clone());
            for w in &mut args[1..1 + weights] {
                *w = format!("{w}@tmap{bn}");
            }
            h.args = Some(args);
            h.kernel = KernelSpec::Tma { inner: Box::new(h.kernel.clone()) };
        }
    }
    steps
}

/// Whether [`tma_wrap`] under `which` gives the matmul alternative `kernel` TMA loads.
fn takes_tma(kernel: &KernelSpec, which: Tma) -> bool {
    let (core, _) = kernel.matmul_core();
    match *core {
        KernelSpec::MatMulPipe { bn, bm, .. } => match which {
            Tma::Off => false,
            Tma::Narrow => bm == crate::kernels::PIPE_BM && bn <= 128,
            Tma::All => true,
        },
        _ => false,
    }
}

/// The SwiGLU into the gate/up matmul: where a `SiluMulHalf` step (h = silu(gate) · up and
/// its 16-bit copy) reads the two parts of a merged matmul, that matmul's pipelined `hopper`
/// alternatives (unsplit, two equal parts, no bias; with [`SwiGluFusion::Batched`] only the
/// first in 64-row tiles, with `All` every one) become `SwiGluPipe` writing h and the copy
/// themselves, and the silu_mul step skips, on Hopper, exactly the rows whose first-fitting
/// Hopper alternative is a fused one (`hopper_skip`; that set must be one interval, else only
/// the batched tile is fused). One launch fewer per layer, and the matmul writes F 16-bit + F
/// f32 values per row instead of 2F f32.
fn fuse_swiglu_pipe(mut steps: Vec<Step>, mode: SwiGluFusion, tma: Tma, ws: bool) -> Vec<Step> {
    for i in 0..steps.len() {
        let Some(KernelSpec::SiluMulHalf { .. }) = steps[i].kernel else { continue };
        let [gate, up, h, hh] = steps[i].args.as_slice() else { continue };
        let part_of = |name: &str| steps[..i].iter().find(|s| s.node == name).and_then(|s| Some((s.alias_of.clone()?, s.alias_offset.clone())));
        let (Some((mg, og)), Some((mu, ou))) = (part_of(gate), part_of(up)) else { continue };
        if mg != mu {
            continue;
        }
        let Some(j) = steps[..i].iter().position(|s| s.node == mg) else { continue };
        let (h, hh) = (h.clone(), hh.clone());
        let step_args = steps[j].args.clone();
        // (gate the first part at offset 0, up the second at F)
        let at = |o: &Option<Scalar>, c: i64| matches!(o, Some(Scalar::RowsTimes(m, k)) if *m == mg && *k == c);
        let fusable = |l: &Large| -> Option<(Box<KernelSpec>, usize)> {
            let KernelSpec::MatMulParts { inner, parts } = &l.kernel else { return None };
            let KernelSpec::MatMulPipe { n, bias: false, residual: false, bn, bm, .. } = *inner.as_ref() else { return None };
            let f = n / 2;
            let ok = parts.as_slice() == [f, f] && crate::kernels::swiglu_pipe_fits(n, bn, bm) && at(&og, 0) && at(&ou, f as i64) && l.args.as_ref().unwrap_or(&step_args).len() == 4;
            ok.then(|| (inner.clone(), f))
        };
        let is_m64 = |l: &Large| matches!(&l.kernel, KernelSpec::MatMulParts { inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMulPipe { bm: 64, .. }));
        let hopper = &steps[j].hopper;
        let batched: Vec<usize> = hopper.iter().position(is_m64).filter(|&k| fusable(&hopper[k]).is_some()).into_iter().collect();
        // (not the alternatives `tma_wrap` gives TMA loads, unless warp-specialized: the
        // SwiGLU kernel's only TMA path is that one, and on the SmolLM2 shape's b128 tile, 24
        // blocks, the fused kernel without TMA lost 20% end to end to the unfused one with
        // it — bench/results/swiglu-all-2026-11-30.json)
        let ws_tile = |l: &Large| ws && matches!(l.kernel.matmul_core().0, KernelSpec::MatMulPipe { bm: crate::kernels::PIPE_BM, a16: true, .. });
        let all: Vec<usize> = (0..hopper.len()).filter(|&k| fusable(&hopper[k]).is_some() && (!takes_tma(&hopper[k].kernel, tma) || ws_tile(&hopper[k]))).collect();
        let chosen = match mode {
            SwiGluFusion::Off => continue,
            SwiGluFusion::Batched => batched,
            SwiGluFusion::All => match fused_rows(hopper, &all) {
                Some(_) => all,
                None => batched,
            },
        };
        let Some(range) = fused_rows(hopper, &chosen) else { continue };
        for k in chosen {
            let alt = &mut steps[j].hopper[k];
            let Some((inner, f)) = fusable(alt) else { continue };
            let mut args = alt.args.clone().unwrap_or_else(|| step_args.clone());
            args.truncate(3);
            args.extend([h.clone(), hh.clone()]);
            alt.kernel = KernelSpec::SwiGluPipe { inner };
            alt.scalars = vec![Scalar::Rows(h.clone()), Scalar::Const(f as i64)];
            alt.args = Some(args);
        }
        steps[i].hopper_skip = Some(range);
    }
    steps
}

/// The rows (one interval, inclusive) whose first-fitting alternative of `alts` — as the
/// runtime picks among a step's `hopper` list — is one of `chosen`; None when there are none
/// or they are not one interval.
fn fused_rows(alts: &[Large], chosen: &[usize]) -> Option<(i64, i64)> {
    let hi_of = |l: &Large| l.max_rows.unwrap_or(i64::MAX);
    // (the first fit is the same between consecutive boundaries)
    let mut points: Vec<i64> = alts.iter().flat_map(|l| [l.min_rows, hi_of(l).saturating_add(1)]).chain([1]).collect();
    points.sort_unstable();
    points.dedup();
    let mut spans: Vec<(i64, i64)> = vec![];
    for (w, &p) in points.iter().enumerate() {
        let end = points.get(w + 1).map_or(i64::MAX, |&q| q - 1);
        let pick = alts.iter().position(|l| p >= l.min_rows && p <= hi_of(l));
        if pick.is_some_and(|k| chosen.contains(&k)) {
            match spans.last_mut() {
                Some(last) if last.1.saturating_add(1) >= p => last.1 = end,
                _ => spans.push((p, end)),
            }
        }
    }
    match spans.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// The split-K reduce of a merged Q/K/V matmul (no
/// residual) folded into the `QkvRopeCache` step that reads the three parts: that step gets a
/// `hopper` alternative for the reduce's rows (in its own rows: tokens x H) reading the
/// partial sums (`QkvRopeSplitK`: q, k, v summed over the slices on load) and the reduce step
/// goes. Only where nothing else reads the merged node or a view of it.
fn fold_splitk_reduce_rope(mut steps: Vec<Step>) -> Vec<Step> {
    let mut i = 0;
    while i < steps.len() {
        let Some(KernelSpec::SplitKReduce { splits, residual: false }) = steps[i].kernel else {
            i += 1;
            continue;
        };
        let merged = steps[i].node.clone();
        let parts = steps[i].args.first().cloned().unwrap_or_default();
        // every view of the merged node, with its element offset in it
        let mut views: Vec<(String, Option<Scalar>)> = vec![(merged.clone(), None)];
        for s in &steps {
            if let Some(of) = &s.alias_of {
                if let Some(k) = views.iter().position(|(v, _)| v == of) {
                    let off = match (&views[k].1, &s.alias_offset) {
                        (None, o) => o.clone(),
                        (o, None) => o.clone(),
                        (Some(_), Some(_)) => continue,
                    };
                    views.push((s.node.clone(), off));
                }
            }
        }
        let offset = |a: &str| views.iter().find(|(v, _)| v == a).map(|(_, o)| o.clone().unwrap_or(Scalar::Const(0)));
        let reads_view = |s: &Step| s.buffers().any(|a| views.iter().any(|(v, _)| v == a));
        let (lo, hi) = (steps[i].min_rows.unwrap_or(1), steps[i].max_rows);
        // (the matmul writing the node names it too; the one-token steps — the decode attention
        // taking RoPE in, and the RoPE kernel where the split attention takes one token — read
        // q, k and v too, but never in the reduce's rows: rows there are tokens x H)
        let one_token_only = |s: &Step| {
            let h = match &s.kernel {
                Some(KernelSpec::RopeAttention { inner, .. }) => match inner.as_ref() {
                    KernelSpec::PagedAttention { h, .. } => *h as i64,
                    _ => return false,
                },
                Some(KernelSpec::QkvRopeCache { h, .. }) => *h as i64,
                _ => return false,
            };
            s.max_rows.is_some_and(|m| m < lo * h)
        };
        let readers: Vec<usize> = (0..steps.len()).filter(|&k| k != i && steps[k].node != merged && steps[k].kernel.is_some() && !one_token_only(&steps[k]) && reads_view(&steps[k])).collect();
        let [r] = readers[..] else {
            i += 1;
            continue;
        };
        let Some(rope @ KernelSpec::QkvRopeCache { h, .. }) = steps[r].kernel.clone() else {
            i += 1;
            continue;
        };
        let (Some(oq), Some(ok), Some(ov)) = (offset(&steps[r].args[0]), offset(&steps[r].args[1]), offset(&steps[r].args[2])) else {
            i += 1;
            continue;
        };
        if steps[r].args.len() != 8 || steps[r].alternatives().next().is_some() {
            i += 1;
            continue;
        }
        let mut args = vec![parts];
        args.extend(steps[r].args[3..].iter().cloned());
        let mut scalars = steps[r].scalars.clone();
        scalars.extend([Scalar::Numel(merged), oq, ok, ov]);
        let kernel = KernelSpec::QkvRopeSplitK { inner: Box::new(rope), splits };
        // (the rope step's rows are tokens x H)
        let hh = h as i64;
        let (work, grid_y) = (steps[r].work.clone(), steps[r].grid_y.clone());
        steps[r].hopper.push(Large { min_rows: lo * hh, max_rows: hi.map(|m| m * hh), args: Some(args), kernel, scalars, work, grid_y });
        steps.remove(i);
    }
    steps
}

/// (on; DSC_SPLITK_NORM=0 off, see [`lower_opts`]) A split-K reduce step whose
/// output's next reader is an RMSNorm (the 8B shape's o and down projections: the residual
/// stream, normalized for the next matmul) is folded into that norm: the norm step gets a `hopper` alternative for the reduce's rows that sums the parts
/// (+ the residual), writes the node, and normalizes it (`SplitKReduceNorm`; one launch
/// instead of two). Steps between them must not read the node.
fn fold_splitk_reduce_norm(mut steps: Vec<Step>, cluster_want: Option<usize>) -> Vec<Step> {
    let reads = |s: &Step, y: &str| s.buffers().any(|a| a == y);
    let mut i = 0;
    while i < steps.len() {
        let Some(KernelSpec::SplitKReduce { splits, residual }) = steps[i].kernel else {
            i += 1;
            continue;
        };
        let r = &steps[i];
        let y = r.node.clone();
        let Some(j) = (i + 1..steps.len()).find(|&j| reads(&steps[j], &y)) else {
            i += 1;
            continue;
        };
        let n = &steps[j];
        let (d, eps_bits, half) = match n.kernel {
            Some(KernelSpec::RmsNorm { d, eps_bits }) => (d, eps_bits, None),
            Some(KernelSpec::RmsNormHalf { d, eps_bits, f16 }) => (d, eps_bits, Some(f16)),
            _ => {
                i += 1;
                continue;
            }
        };
        // (the norm over this node as its input, no alternatives of its own, a row a multiple of
        // 4 floats: args x, g, xn[, xh])
        if d % 4 != 0 || n.args.first() != Some(&y) || n.alias_of.is_some() || !n.hopper.is_empty() || n.args.len() != 3 + usize::from(half.is_some()) {
            i += 1;
            continue;
        }
        let mut args = r.args.clone();
        args.extend(n.args[1..].iter().cloned());
        // (on sm_90a, where this alternative runs, a cluster of blocks per row: grid y = the
        // cluster)
        let cluster = crate::kernels::splitk_norm_cluster(d, cluster_want);
        let alt = Large {
            min_rows: r.min_rows.unwrap_or(1),
            max_rows: r.max_rows,
            args: Some(args),
            kernel: KernelSpec::SplitKReduceNorm { splits, residual, d, eps_bits, half, cluster },
            scalars: n.scalars.clone(),
            work: n.work.clone(),
            grid_y: if cluster > 1 { Scalar::Const(cluster as i64) } else { n.grid_y.clone() },
        };
        steps[j].hopper.push(alt);
        steps.remove(i);
    }
    steps
}

/// (N, K) of a matmul weight in [N, K] layout.
fn weight_dims(name: &str, w: &dsc_ir::TensorType) -> Result<(usize, usize), CodegenError> {
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
fn matmul_step(name: &str, args: Vec<String>, k: usize, nn: usize, wdtype: DType, bias: bool, residual: bool, parts: Option<&[usize]>, o: &ScheduleOptions) -> Result<Step, CodegenError> {
    let few_x16 = o.few_x16;
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
    // (one row of a wide, short-rowed 16-bit matrix — a small model's lm_head: the wide GEMV)
    let wide = parts.is_none() && o.gemv_wide && crate::kernels::wide_gemv_fits(k, nn, wdtype);
    let one_row = if wide { KernelSpec::MatMulWide { k, n: nn, wdtype, bias, residual } } else { KernelSpec::MatMul { k, n: nn, wdtype, bias, residual } };
    let (kernel, scalars) = wrap(one_row, vec![Scalar::Const(nn as i64)]).ok_or_else(|| err(name, format!("merged matmul parts {parts:?} do not fit the decode GEMV's blocks")))?;
    let mut st = Step { kernel: Some(kernel), args, scalars, work: Scalar::Const(nn as i64), grid_y: rows.clone(), ..Step::new(name) };
    let large = |spec: KernelSpec, min_rows: i64, max_rows: Option<i64>, work: usize| {
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
    if k % 16 == 0 {
        st.large = large(KernelSpec::MatMulMma { k, n: nn, wdtype, bias, residual }, 16, None, nn.div_ceil(8));
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
            .then(|| large(KernelSpec::MatMulPipe { k, n: nn, wdtype, bias, residual, bn: p64.bn, stages: p64.stages, overlap: p64.overlap, a16: p64.a16, bm: p64.bm }, lo64, Some(hi64), nn))
            .flatten();
        // (first fit: the 128-row tiles take the rows from pipe_min_rows that the 64-row
        // ones leave, below and above their range)
        let big = half
            .then(|| large(KernelSpec::MatMulPipe { k, n: nn, wdtype, bias, residual, bn, stages, overlap, a16, bm }, pipe_min_rows(o, nn, bn), None, nn))
            .flatten()
            .or_else(|| large(KernelSpec::MatMulWgmma { k, n: nn, wdtype, bias, residual, n_tile: 64 }, 128, None, nn.div_ceil(64)));
        // (long prefills: 256-column tiles where N's 128-column ones would be used, from the
        // rows where the wide tiles still give WIDE_MIN_TILES blocks: half the x traffic per
        // FLOP; DSC_GEMM_WIDE=0 at compile time off)
        let wide = (half && bn == 128 && nn % 256 == 0 && o.gemm_wide)
            .then(|| {
                let w = crate::kernels::PipeTiling { bn: 256, ..crate::kernels::pipe_tiling(6144) };
                let from = (WIDE_MIN_TILES.div_ceil(nn / 256) * crate::kernels::PIPE_BM) as i64;
                large(KernelSpec::MatMulPipe { k, n: nn, wdtype, bias, residual, bn: w.bn, stages: w.stages, overlap: w.overlap, a16: w.a16, bm: w.bm }, from, None, nn)
            })
            .flatten();
        st.hopper = small.into_iter().chain(wide).chain(big).collect();
        st.hopper_small = large(KernelSpec::MatMulWgmma { k, n: nn, wdtype, bias, residual, n_tile: 16 }, 2, None, nn.div_ceil(16));
    }
    if matches!(wdtype, DType::F32 | DType::F16 | DType::BF16) {
        // 2..=few_max rows (batched decode): a GEMV-shaped kernel reading each weight once per
        // 8 (f32) or 32 (bf16/f16, tensor cores) rows beats the tiled tensor-core kernels there
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
                st.few.extend(large(f32x, 2, Some(x16_min - 1), nn));
            }
            st.few.extend(large(KernelSpec::MatMulFewX16 { k, n: nn, wdtype, bias, residual }, x16_min.max(2), Some(few_max), nn));
        } else {
            st.few.extend(large(f32x, 2, Some(few_max), nn));
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

/// Parts the split decode attention cuts a context into, at most, and the fewest keys per part.
pub const ATTN_SPLITS: usize = 16;
pub const ATTN_SPLIT_MIN_KEYS: usize = 256;

/// Steps whose longest context has at least this many keys run the split decode attention
/// (the one-pass kernel below). Measured on the H200 (8B shape, one token, per layer): 256
/// keys 11.4 µs one-pass vs 13.2 split, 1k 21.1 vs 15.9, 8k 143 vs 41
/// (bench/results/split-kv-2026-11-30.json). `ScheduleOptions::split_kv_from` overrides.
pub const ATTN_SPLIT_FROM_KEYS: i64 = 512;

/// ... and at most this many rows (tokens x heads): measured at a 2k context, the split
/// path at 8B batch 8 (256 rows) and 32 was 4-7% slower than the one-pass kernel (its idle
/// parts' blocks), at SmolLM2 batch 8 (72 rows) 44% faster.
pub const ATTN_SPLIT_ROWS: i64 = (crate::kernels::ATTN_SPLIT_BLOCKS / 4) as i64;

/// Long-context decode attention over more of the GPU: beside each decode attention step
/// (kept for contexts under [`ATTN_SPLIT_FROM_KEYS`] keys: `max_context`), two steps for longer
/// ones (`min_context`): `{node}@split{S}` (`PagedAttentionSplit`: a block per (token, head,
/// part) writing partial softmax states into that buffer, `S` = [`ATTN_SPLITS`] parts of at
/// least [`ATTN_SPLIT_MIN_KEYS`] keys) and `{node}` itself (`AttentionCombine`, up to the
/// prefill attention's rows: that writes the output itself). One block per (token, head) uses
/// 32 of the 132 SMs at batch 1 (8B shape), whatever the context; split 16 ways an 8k context
/// keeps them all busy, while at short contexts the second launch and the idle parts' blocks
/// cost more than they win.
fn split_attention(steps: Vec<Step>, attn_group: bool, from: i64) -> Vec<Step> {
    let mut out = Vec::with_capacity(steps.len());
    for s in steps {
        let Some(KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits, warps, keys, kv, .. }) = s.kernel.clone() else {
            out.push(s);
            continue;
        };
        let (ns, mk) = (ATTN_SPLITS, ATTN_SPLIT_MIN_KEYS);
        let part = format!("{}@split{ns}", s.node);
        let original = s.args.clone();
        // (the split passes up to ATTN_SPLIT_ROWS rows — below the prefill attention's —, the
        // one-pass kernel above them at long contexts: a second copy of its step)
        let max_rows = ATTN_SPLIT_ROWS.min(s.large.as_ref().map_or(i64::MAX, |l| l.min_rows - 1));
        out.push(Step { max_context: Some(from - 1), ..s.clone() });
        out.push(Step { min_context: Some(from), min_rows: Some(max_rows + 1), ..s.clone() });
        let mut first = Step { min_context: Some(from), max_rows: Some(max_rows), large: None, hopper: vec![], ..s.clone() };
        first.node = part.clone();
        // (grouped where its head groups alone give ATTN_GROUP_MIN_BLOCKS blocks at a full
        // split)
        let g = attention_group_size(h, kvh, d, warps);
        let group = if attn_group && h / g * ns >= ATTN_GROUP_MIN_BLOCKS { g } else { 1 };
        first.kernel = Some(KernelSpec::PagedAttentionSplit { h, kvh, d, bs, scale_bits, warps, keys, splits: ns, min_keys: mk, group, kv });
        if let Some(last) = first.args.last_mut() {
            *last = part.clone();
        }
        first.grid_y = Scalar::Const((h / group * ns) as i64);
        first.few = vec![];
        let rows = Scalar::Rows(s.node.clone());
        let combine = Step {
            kernel: Some(KernelSpec::AttentionCombine { h, d, splits: ns, min_keys: mk }),
            args: vec![part, original[3].clone(), s.node.clone()],
            scalars: vec![rows.clone()],
            work: rows,
            max_rows: Some(max_rows),
            min_context: Some(from),
            ..Step::new(&s.node)
        };
        out.push(first);
        out.push(combine);
    }
    out
}

/// Most K parts of [`split_k`] by default: measured on the H200 (bench/results/split-k-2026-11-30.json,
/// 8B shape, same call): b16 2,216 -> 2,501 tok/s, b32 4,087 -> 4,866, b64 7,402 -> 8,314;
/// o at 32 rows 21.7 -> 14.7 us, down 65.7 -> 39.1 us (both passes).
pub const SPLIT_K_PARTS: usize = 4;

/// SMs the split-K grid is sized for (H100 SXM / H200: 132): the 64-row tiles of a split-K
/// matmul (one block per SM: ~200 KB of shared memory) times its parts stay within one wave.
pub const SPLIT_K_SMS: usize = crate::kernels::TARGET_SMS;

/// K parts of a split-K matmul of `tiles` column tiles of `bn` over `ksteps` 64-wide K steps:
/// the most, up to `max_parts`, that divide the K steps and bn and keep tiles x parts within
/// [`SPLIT_K_SMS`] (the 8B shape: o/down 32 tiles -> 4, q/k/v 48 -> 2); None below 2.
pub fn split_k_parts(tiles: usize, ksteps: usize, bn: usize, max_parts: usize) -> Option<usize> {
    (2..=max_parts).rev().find(|&s| tiles * s <= SPLIT_K_SMS && ksteps % s == 0 && bn % s == 0)
}

/// Rows from which [`split_k`] takes a matmul ...
pub const SPLIT_K_MIN_ROWS: i64 = 16;
/// ... up to these (past its 64-row tiles' own range, 64 rows: at 128 rows (8B shape, H200)
/// the 64-row split-K tiles take down 94 -> 70 us per call, q/k/v 53 -> 35, o 42 -> 27, where
/// the 128-row tiles run 32-48 blocks; bench/results/splitk128-2026-11-30.json).
pub const SPLIT_K_MAX_ROWS: i64 = 128;
/// ... where its 64-row pipelined tiles number fewer than this (N = 4096 at bn 128: 32 tiles
/// on 132 SMs; its K parts multiply the blocks).
pub const SPLIT_K_MAX_TILES: usize = 64;

/// RoPE and the cache writes inside the decode attention for one-token steps: where a
/// `QkvRopeCache` step (rope(q), rope_cache_write(k), cache_write(v) of a merged Q/K/V
/// matmul) feeds a one-pass `PagedAttention` of a block per (token, head), the attention step
/// is split in two — for one token (rows = H) a `RopeAttention` kernel reading q, k and v
/// before RoPE and writing the token's K/V rows itself, for more the original — and the
/// `QkvRopeCache` launch moves to a step of its own on the rotated q's node (rows T·H) from
/// two tokens on, and for one token where the split attention takes the context (from
/// `split_from` keys: its passes read the pools the kernel would have written). One token
/// only: with more, a token may attend to another's row of the same step.
fn fuse_rope_attention(mut steps: Vec<Step>, split_from: Option<i64>) -> Vec<Step> {
    let hosts: Vec<usize> = steps.iter().enumerate().filter(|(_, s)| matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))).map(|(i, _)| i).collect();
    // (indices shift as steps are inserted: from the last host back)
    for &i in hosts.iter().rev() {
        let Some(KernelSpec::QkvRopeCache { h, theta_bits, interleaved, .. }) = steps[i].kernel.clone() else { continue };
        let qkv = steps[i].clone();
        let Some(rq) = qkv.args.get(7).cloned() else { continue };
        let Some(a) =
            steps.iter().position(|s| s.args.first() == Some(&rq) && s.min_context.is_none() && s.min_rows.is_none() && matches!(s.kernel, Some(KernelSpec::PagedAttention { group: 1, .. })))
        else {
            continue;
        };
        if a < i {
            continue;
        }
        let att = steps[a].clone();
        let one = h as i64;
        let fused = Step {
            kernel: Some(KernelSpec::RopeAttention { inner: Box::new(att.kernel.clone().expect("matched")), theta_bits, interleaved }),
            args: vec![
                qkv.args[0].clone(),
                qkv.args[1].clone(),
                qkv.args[2].clone(),
                att.args[3].clone(),
                qkv.args[4].clone(),
                att.args[1].clone(),
                att.args[2].clone(),
                att.args[4].clone(),
                att.args[5].clone(),
                att.args[6].clone(),
            ],
            max_rows: Some(one),
            large: None,
            few: vec![],
            hopper: vec![],
            hopper_small: None,
            ..att.clone()
        };
        steps[a] = Step { min_rows: Some(one + 1), ..att };
        steps.insert(a, fused);
        let write = Step { node: rq.clone(), min_rows: Some(one + 1), alias_of: None, alias_offset: None, ..qkv.clone() };
        let mut moved = vec![write.clone()];
        if let Some(from) = split_from {
            moved.push(Step { min_rows: None, max_rows: Some(one), min_context: Some(from), ..write });
        }
        steps[i].kernel = None;
        steps[i].args = vec![];
        steps[i].scalars = vec![];
        for (k, m) in moved.into_iter().enumerate() {
            steps.insert(i + 1 + k, m);
        }
    }
    steps
}

/// Split-K for batched decode (on by default, [`SPLIT_K_PARTS`]; DSC_SPLIT_K=S at compile
/// time, 0 off): a plain matmul whose 64-row pipelined alternative has fewer than
/// [`SPLIT_K_MAX_TILES`] column tiles (the 8B shape's o and down projections: 32 tiles, a
/// quarter of the SMs; today they run the batched GEMV at 1.4-1.7 TB/s from 16 to 47 rows)
/// gets, first in its `hopper` list for [`SPLIT_K_MIN_ROWS`] up to that alternative's last
/// row or [`SPLIT_K_MAX_ROWS`], `SplitK` over the same tile writing `{node}@splitk{S}` ([S, M, N] f32 partial sums,
/// declared by a kernel-less step before it), and after it a `SplitKReduce` step writing the
/// node (+ the residual) for the same rows, `hopper_only` like the alternative.
fn split_k(steps: Vec<Step>, max_parts: usize) -> Vec<Step> {
    let mut out = Vec::with_capacity(steps.len());
    for mut s in steps {
        // (the 64-row tile, the same kernel without the residual: the reduce pass adds it; a
        // merged matmul's (q/k/v) with its parts, whole tiles each)
        let pipe = s.hopper.iter().find_map(|h| {
            let (p, parts) = match &h.kernel {
                KernelSpec::MatMulParts { inner, parts } => (inner.as_ref(), Some(parts)),
                k => (k, None),
            };
            match *p {
                KernelSpec::MatMulPipe { k, n, wdtype, bias: false, bn, stages, overlap, a16, bm: 64, .. }
                    if n / bn < SPLIT_K_MAX_TILES && n % bn == 0 && parts.is_none_or(|ps| ps.iter().all(|q| q % bn == 0)) =>
                {
                    let sk = split_k_parts(n / bn, k / 64, bn, max_parts)?;
                    let pipe = KernelSpec::MatMulPipe { k, n, wdtype, bias: false, residual: false, bn, stages, overlap, a16, bm: 64 };
                    let inner = match parts {
                        Some(ps) => KernelSpec::MatMulParts { inner: Box::new(pipe), parts: ps.clone() },
                        None => pipe,
                    };
                    Some((h.clone(), h.max_rows, inner, sk))
                }
                _ => None,
            }
        });
        let residual = match &s.kernel {
            Some(KernelSpec::MatMul { residual, .. }) => *residual,
            Some(KernelSpec::MatMulParts { inner, .. }) if matches!(inner.as_ref(), KernelSpec::MatMul { .. }) => false,
            _ => {
                out.push(s);
                continue;
            }
        };
        let Some((pipe, Some(hi), inner, sk)) = pipe else {
            out.push(s);
            continue;
        };
        // (up to SPLIT_K_MAX_ROWS rows, past the 64-row alternative's own range: two row tiles
        // of K parts beat one 128-row tile per column tile there)
        let hi = hi.max(SPLIT_K_MAX_ROWS);
        let parts = format!("{}@splitk{sk}", s.node);
        // (x and W as the alternative reads them: its own args where a fusion gave it some)
        let own = pipe.args.clone().unwrap_or_else(|| s.args.clone());
        let y = s.node.clone();
        // (x and the weights — one, or a merged matmul's parts — then the partial sums; the
        // residual goes to the reduce pass)
        let mut first = own[..own.len() - 1 - usize::from(residual)].to_vec();
        first.push(parts.clone());
        let lo = SPLIT_K_MIN_ROWS.min(hi);
        s.hopper.insert(0, Large { min_rows: lo, max_rows: Some(hi), args: Some(first), kernel: KernelSpec::SplitK { inner: Box::new(inner), splits: sk }, ..pipe });
        let mut args = vec![parts.clone()];
        if residual {
            args.push(own[own.len() - 2].clone());
        }
        args.push(y.clone());
        let reduce = Step {
            kernel: Some(KernelSpec::SplitKReduce { splits: sk, residual }),
            args,
            scalars: vec![Scalar::Numel(y.clone())],
            work: Scalar::Numel(y.clone()),
            min_rows: Some(lo),
            max_rows: Some(hi),
            hopper_only: true,
            ..Step::new(&y)
        };
        out.push(Step::new(&parts));
        out.push(s);
        out.push(reduce);
    }
    out
}

/// The pipelined matmuls that take x in 16 bits (`MatMulPipe { a16 }`) read it from a buffer
/// `{x}@bf16` (`@f16`) that a `ToHalf` step writes just before the first of them (steps of
/// 128+ rows only, like the matmuls: decode never runs it). The buffer is the graph node's
/// shape in 16-bit elements (the runtime sizes `@` buffers from their base node).
///
/// With `norm_half`, an x that an RMSNorm step writes gets its copy from that step instead
/// (`RmsNormHalf`: norm + quantize, no cast launch; the copy's buffer is declared by a
/// kernel-less step).
fn insert_half_casts(steps: Vec<Step>, norm_half: bool, silu_half: bool) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    // cast buffer -> its cast step's index in `out` (None: an RMSNorm writes it)
    let mut made: std::collections::HashMap<String, Option<usize>> = std::collections::HashMap::new();
    for mut s in steps {
        let step_args = s.args.clone();
        for h in s.hopper.iter_mut().chain(s.few.iter_mut()) {
            // (x as this alternative reads it: its own args where a fusion gave it some)
            let x = h.args.as_ref().unwrap_or(&step_args).first().cloned().unwrap_or_default();
            // (through the wrappers: split-K over a merged matmul is two deep)
            let inner = h.kernel.matmul_core().0;
            let (k, wdtype) = match inner {
                KernelSpec::MatMulPipe { k, wdtype, a16: true, .. } | KernelSpec::MatMulFewX16 { k, wdtype, .. } => (*k, *wdtype),
                _ => continue,
            };
            let f16 = wdtype == DType::F16;
            let half = format!("{x}@{}", if f16 { "f16" } else { "bf16" });
            // (for a new copy: the RMSNorm — or silu_mul — step writing x, where it can write the
            // copy too)
            let norm = || {
                norm_half
                    .then(|| {
                        out.iter().position(|p| {
                            p.node == x
                                && p.alias_of.is_none()
                                && ((p.args.len() == 3
                                    && (matches!(p.kernel, Some(KernelSpec::RmsNorm { d, .. }) if d % 4 == 0)
                                        || (silu_half && p.kernel == Some(KernelSpec::Binary(BinaryOpKey(dsc_ir::BinaryOp::SiluMul))))))
                                    || (p.args.len() == 4 && matches!(p.kernel, Some(KernelSpec::LayerNorm { half: None, .. }))))
                        })
                    })
                    .flatten()
            };
            match made.get(&half) {
                // (one cast serves every alternative reading it: it runs from the fewest rows)
                Some(&Some(i)) => out[i].min_rows = out[i].min_rows.min(Some(h.min_rows)),
                Some(None) => {}
                None => match norm() {
                    Some(i) => {
                        out[i].kernel = match out[i].kernel.take() {
                            Some(KernelSpec::RmsNorm { d, eps_bits }) => Some(KernelSpec::RmsNormHalf { d, eps_bits, f16 }),
                            Some(KernelSpec::LayerNorm { d, eps_bits, half: None }) => Some(KernelSpec::LayerNorm { d, eps_bits, half: Some(f16) }),
                            Some(KernelSpec::Binary(_)) => Some(KernelSpec::SiluMulHalf { f16 }),
                            other => other,
                        };
                        out[i].args.push(half.clone());
                        made.insert(half.clone(), None);
                        out.push(Step::new(&half));
                    }
                    None => {
                        let units = Scalar::RowsTimes(x.clone(), (k / 8) as i64);
                        made.insert(half.clone(), Some(out.len()));
                        out.push(Step {
                            kernel: Some(KernelSpec::ToHalf { f16 }),
                            args: vec![x.clone(), half.clone()],
                            scalars: vec![units.clone()],
                            work: units,
                            min_rows: Some(h.min_rows),
                            ..Step::new(&half)
                        });
                    }
                },
            }
            // (the alternative's own args where it has them: a fused default kernel may
            // write another buffer)
            let mut args = h.args.clone().unwrap_or_else(|| step_args.clone());
            args[0] = half;
            h.args = Some(args);
        }
        out.push(s);
    }
    out
}

/// Why a matmul over an activation W has no GPU lowering: the decode GEMVs load their first
/// weights before waiting for the previous kernel (`kernels::gemv_preload`), which is right only
/// for weights no kernel writes.
const GRAPH_WEIGHTS_ONLY: &str = "matmul W must be a graph weight on the GPU (its kernels read W before the previous kernel finishes)";

/// RMSNorm nodes whose every user is a matmul (or merged matmul) that takes it as x with
/// plain-float weights and no bias: their decode GEMVs compute the norm in their prologue
/// (`KernelSpec::NormMatMul`), so one-row steps skip the norm's own kernel.
fn fusable_norms(g: &Graph) -> std::collections::HashSet<dsc_ir::NodeId> {
    let mut out = std::collections::HashSet::new();
    for id in g.node_ids() {
        let n = g.node(id);
        let Op::RmsNorm { .. } = n.op else { continue };
        let ops = g.operands(id);
        let d = n.ty.shape.last().and_then(|d| d.as_const());
        if g.node(ops[1]).ty.dtype != DType::F32 || d.is_none_or(|d| d % 32 != 0) {
            continue;
        }
        let plain = |w: dsc_ir::NodeId| matches!(g.node(w).ty.dtype, DType::F32 | DType::F16 | DType::BF16);
        // (only ahead of short GEMVs, as the L2 prefetch: those are latency-bound and gain
        // from one launch less; a long one is bandwidth-bound and every block's re-read of
        // x and g costs — measured on the 8B shape: b1 239 -> 231 with the gate/up norm fused)
        let bytes = |w: dsc_ir::NodeId| {
            let t = &g.node(w).ty;
            let numel = t.shape.iter().map(|d| d.as_const().unwrap_or(usize::MAX)).fold(1usize, |a, b| a.saturating_mul(b));
            t.dtype.bytes_for(numel).unwrap_or(usize::MAX)
        };
        let users = g.users(id);
        let ok = !users.is_empty()
            && !g.outputs.iter().any(|(_, o)| *o == id)
            && users.iter().all(|&u| {
                let uo = g.operands(u);
                uo[0] == id
                    && !uo[1..].contains(&id)
                    && uo[1..].iter().map(|&w| bytes(w)).fold(0usize, |a, b| a.saturating_add(b)) <= crate::kernels::GEMV_PREFETCH_MAX_BYTES
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
fn fuse_norm(g: &Graph, norms: &std::collections::HashSet<dsc_ir::NodeId>, id: dsc_ir::NodeId, mut st: Step) -> Step {
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

/// The users of a merged Q/K/V matmul — rope(q), rope_cache_write(k) into the K pool,
/// cache_write(v) into the V pool — run as one kernel (`QkvRopeCache`), launched at the last
/// of the three steps (so every buffer it writes is live by then and every input still is);
/// the other two steps launch nothing (the rotated q keeps its buffer, the pools their
/// aliases). A lowering-level fusion: the graph keeps the three ops. DSC_NO_QKV_ROPE_FUSION=1
/// at compile time keeps three kernels (A/B runs).
/// The SwiGLU of a merged gate/up matmul in its decode GEMV's epilogue: where `silu_mul(a, b)`
/// reads the two whole parts of a two-part `matmul_cat` (plain-float weights, equal widths,
/// nothing else reading them), the cat's one-row kernel becomes `SwiGluGemv` writing the
/// silu_mul's buffer, and the silu_mul step runs only for 2+ rows (the cat's alternatives keep
/// writing the cat). The graph and the CPU oracle keep both ops. `DSC_NO_SWIGLU_FUSION=1` at
/// compile time turns it off.
fn fuse_swiglu(g: &Graph, steps: &mut [Step]) {
    let at: std::collections::HashMap<String, usize> = steps.iter().enumerate().map(|(i, s)| (s.node.clone(), i)).collect();
    for id in g.node_ids() {
        let n = g.node(id);
        if !matches!(n.op, Op::Binary(dsc_ir::BinaryOp::SiluMul)) {
            continue;
        }
        let ops = g.operands(id);
        let part = |s: dsc_ir::NodeId| -> Option<(dsc_ir::NodeId, usize, usize)> {
            let Op::Slice { start, len, .. } = g.node(s).op else { return None };
            let cat = g.operands(s)[0];
            (matches!(g.node(cat).op, Op::MatMulCat) && g.users(s) == [id]).then_some((cat, start, len))
        };
        let (Some((cat, s0, f)), Some((cat1, s1, f1))) = (part(ops[0]), part(ops[1])) else { continue };
        let ws = &g.operands(cat)[1..];
        let wdt = g.node(ws[0]).ty.dtype;
        if cat != cat1 || f != f1 || ws.len() != 2 || s0 == s1 || s0 % f != 0 || s1 % f != 0 || !matches!(wdt, DType::F32 | DType::F16 | DType::BF16) {
            continue;
        }
        let Some(k) = g.node(ws[0]).ty.shape.get(1).and_then(|d| d.as_const()) else { continue };
        if crate::kernels::swiglu_fits(k, f, wdt).is_err() {
            continue;
        }
        let spec = KernelSpec::SwiGluGemv { k, f, wdtype: wdt };
        let (Some(&ci), Some(&si)) = (at.get(&g.node(cat).name), at.get(&n.name)) else { continue };
        // (over the plain merged GEMV, or the one with the RMSNorm prologue: then x is the
        // norm's input and g its weight, and the SwiGLU GEMV keeps the prologue)
        let merged = |k: &KernelSpec| matches!(k, KernelSpec::MatMulParts { inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMul { .. }));
        let (spec, head) = match &steps[ci].kernel {
            Some(k) if merged(k) => (spec, vec![g.node(g.operands(cat)[0]).name.clone()]),
            Some(KernelSpec::NormMatMul { inner, eps_bits }) if merged(inner) => (KernelSpec::NormMatMul { inner: Box::new(spec), eps_bits: *eps_bits }, steps[ci].args[..2].to_vec()),
            _ => continue,
        };
        let (wg, wu) = (g.node(ws[s0 / f]).name.clone(), g.node(ws[s1 / f]).name.clone());
        let st = &mut steps[ci];
        st.keep_alternative_args();
        st.kernel = Some(spec);
        st.args = head.into_iter().chain([wg, wu, n.name.clone()]).collect();
        st.scalars = vec![Scalar::Const(f as i64)];
        st.work = Scalar::Const(f as i64);
        steps[si].min_rows = Some(2);
    }
}

fn fuse_qkv_rope_cache(g: &Graph, steps: &mut [Step]) {
    use dsc_ir::NodeId;
    let at: std::collections::HashMap<String, usize> = steps.iter().enumerate().map(|(i, s)| (s.node.clone(), i)).collect();
    // the one user of `id` through reshapes, and the reshape chain's last node
    let through = |id: NodeId| -> Option<(NodeId, NodeId)> {
        let mut cur = id;
        loop {
            let users = g.users(cur);
            if users.len() != 1 || g.outputs.iter().any(|(_, o)| *o == cur) {
                return None;
            }
            let u = users[0];
            if matches!(g.node(u).op, Op::Reshape) {
                cur = u;
            } else {
                return Some((cur, u));
            }
        }
    };
    for cat in g.node_ids().filter(|&n| matches!(g.node(n).op, Op::MatMulCat)) {
        let slices = g.users(cat);
        if slices.len() != 3 {
            continue;
        }
        let (mut q, mut k, mut v) = (None, None, None);
        for &s in &slices {
            let Some((x, u)) = through(s) else { continue };
            match g.node(u).op {
                Op::Rope { .. } if g.operands(u)[0] == x => q = Some((x, u)),
                Op::RopeCacheWrite { .. } if g.operands(u)[1] == x => k = Some((x, u)),
                Op::CacheWrite if g.operands(u)[1] == x => v = Some((x, u)),
                _ => {}
            }
        }
        let (Some((xq, rq)), Some((xk, rk)), Some((xv, wv))) = (q, k, v) else { continue };
        let (Op::Rope { theta, style, rotary_dim }, Op::RopeCacheWrite { theta: tk, style: sk, rotary_dim: dk }) = (&g.node(rq).op, &g.node(rk).op) else { continue };
        let (qo, ko, vo) = (g.operands(rq), g.operands(rk), g.operands(wv));
        // same positions for both ropes, same slots for both writes, one rotation
        if qo[1] != ko[3] || ko[2] != vo[2] || theta != tk || style != sk || rotary_dim != dk {
            continue;
        }
        let dims = |id: NodeId| -> Option<(usize, usize)> {
            let t = &g.node(id).ty;
            (t.rank() == 3).then_some((t.shape[1].as_const()?, t.shape[2].as_const()?))
        };
        let (Some((h, d)), Some((kvh, dk2)), Some((kvh2, dv))) = (dims(xq), dims(xk), dims(xv)) else { continue };
        if d != dk2 || d != dv || kvh != kvh2 || *rotary_dim != d || d % 2 != 0 {
            continue;
        }
        // (both pools of one type)
        let kv = g.node(rk).ty.dtype;
        if g.node(wv).ty.dtype != kv {
            continue;
        }
        let name = |id: NodeId| g.node(id).name.clone();
        let (Some(&iq), Some(&ik), Some(&iv)) = (at.get(&name(rq)), at.get(&name(rk)), at.get(&name(wv))) else { continue };
        let host = iq.max(ik).max(iv);
        let kc = steps[ik].args[3].clone();
        let vc = steps[iv].args[2].clone();
        for i in [iq, ik, iv] {
            steps[i].kernel = None;
        }
        let h_ = &mut steps[host];
        h_.kernel = Some(KernelSpec::QkvRopeCache { h, kvh, d, theta_bits: theta.to_bits(), interleaved: *style == RopeStyle::Interleaved, kv });
        h_.args = vec![name(xq), name(xk), name(xv), name(qo[1]), name(ko[2]), kc, vc, name(rq)];
        h_.scalars = vec![Scalar::HalfNumel(name(cat)), Scalar::HalfNumel(name(xq)), Scalar::HalfNumel(name(xk))];
        h_.work = Scalar::HalfNumel(name(cat));
        h_.grid_y = Scalar::Const(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The default options without the warp-specialized prefill matmul (whose tensor-map
    /// args the older tests do not expect; `the_long_prefill_matmuls_are_warp_specialized`).
    /// the production options without the warp-specialized matmuls and without the norm folded
    /// into the GEMVs (what most tests here look at in isolation)
    fn no_ws() -> ScheduleOptions {
        ScheduleOptions { ws: false, ws64: false, norm_fusion: false, ..Default::default() }
    }
    use dsc_ir::text;

    fn graph(extra_user: bool, wdtype: &str) -> Graph {
        let extra = if extra_user { "  %z = add(%xn, %x) : f32[T, 64]\n  output z = %z\n" } else { "" };
        let src = format!(
            "graph \"t\" {{\n  %x = input : f32[T, 64]\n  %g = weight : f32[64]\n  %wq = weight : {wdtype}[32, 64]\n  %wk = weight : {wdtype}[32, 64]\n  %xn = rms_norm(%x, %g) {{eps = 1e-5}} : f32[T, 64]\n  %qk = matmul_cat(%xn, %wq, %wk) : f32[T, 64]\n  %q = slice(%qk) {{axis = 1, start = 0, len = 32}} : f32[T, 32]\n  %k = slice(%qk) {{axis = 1, start = 32, len = 32}} : f32[T, 32]\n  %y = mul(%q, %k) : f32[T, 32]\n  output y = %y\n{extra}}}\n"
        );
        text::parse(&src).unwrap()
    }

    #[test]
    fn rms_norm_folds_into_the_decode_gemv_and_runs_only_for_more_rows() {
        // (x in f32 for every batched GEMV: no cast steps)
        let folding = ScheduleOptions { norm_fusion: true, few_x16: false, split_kv: false, split_k: None, norm_half: false, silu_half: false, tma: Tma::Off, rope_attention: false, ..no_ws() };
        let steps = lower_opts(&graph(false, "bf16"), folding).unwrap();
        // off (the default): the norm runs as its own kernel
        let plain = lower_opts(&graph(false, "bf16"), ScheduleOptions { norm_fusion: false, ..folding }).unwrap();
        assert!(plain.iter().all(|s| s.min_rows.is_none() && !matches!(s.kernel, Some(KernelSpec::NormMatMul { .. }))));
        let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
        assert_eq!(by("xn").min_rows, Some(2));
        let mm = by("qk");
        assert!(matches!(mm.kernel, Some(KernelSpec::NormMatMul { .. })), "{:?}", mm.kernel);
        assert_eq!(mm.args, ["x", "g", "wq", "wk", "qk"]);
        // the batched and tensor-core kernels read the norm's output
        for l in mm.large.iter().chain(&mm.few).chain(&mm.hopper_small) {
            assert_eq!(l.args.as_deref(), Some(&["xn".to_string(), "wq".into(), "wk".into(), "qk".into()][..]));
        }
        // the parts are views at rows x offset
        assert_eq!(by("k").alias_offset, Some(Scalar::RowsTimes("qk".into(), 32)));
    }

    #[test]
    fn one_token_steps_run_rope_and_the_cache_writes_inside_the_attention() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 32]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %wq = weight : bf16[32, 32]\n  %wk = weight : bf16[16, 32]\n  %wv = weight : bf16[16, 32]\n  %kc = state : f32[4, 4, 2, 8]\n  %vc = state : f32[4, 4, 2, 8]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 64]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %k = slice(%qkv) {axis = 1, start = 32, len = 16} : f32[T, 16]\n  %v = slice(%qkv) {axis = 1, start = 48, len = 16} : f32[T, 16]\n  %qh = reshape(%q) : f32[T, 4, 8]\n  %kh = reshape(%k) : f32[T, 2, 8]\n  %vh = reshape(%v) : f32[T, 2, 8]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[T, 4, 8]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[4, 4, 2, 8]\n  %vw = cache_write(%vc, %vh, %slots) : f32[4, 4, 2, 8]\n  %o = paged_attention(%qr, %kw, %vw, %pos, %seq, %table) {scale = 0.35} : f32[T, 4, 8]\n  output o = %o\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { rope_attention: false, ..no_ws() }).unwrap();
        assert!(plain.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::RopeAttention { .. }))));
        let steps = lower_opts(&g, no_ws()).unwrap();
        // one token (rows = H = 4): the fused kernel, reading q/k/v before RoPE and the slots
        let fused: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::RopeAttention { .. }))).collect();
        let [f] = &fused[..] else { panic!("{fused:?}") };
        assert_eq!((f.node.as_str(), f.max_rows, f.max_context), ("o", Some(4), Some(ATTN_SPLIT_FROM_KEYS - 1)));
        assert_eq!(f.args, ["qh", "kh", "vh", "pos", "slots", "kw", "vw", "seq", "table", "o"]);
        assert!(f.few.is_empty() && f.large.is_none());
        // more tokens: the one-pass kernel as before, from 2 tokens
        assert!(steps.iter().any(|s| s.node == "o" && matches!(s.kernel, Some(KernelSpec::PagedAttention { .. })) && s.min_rows == Some(5) && s.max_context == f.max_context));
        // the Q/K/V RoPE + cache-write kernel from 2 tokens, and for one token where the split
        // attention takes the context; nowhere else
        let qkv: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))).collect();
        assert_eq!(qkv.len(), 2, "{qkv:?}");
        assert!(qkv.iter().all(|s| s.node == "qr" && s.alias_of.is_none()));
        assert_eq!((qkv[0].min_rows, qkv[0].max_rows, qkv[0].min_context), (Some(5), None, None));
        assert_eq!((qkv[1].min_rows, qkv[1].max_rows, qkv[1].min_context), (None, Some(4), Some(ATTN_SPLIT_FROM_KEYS)));
        // ... ahead of every attention step reading what it writes
        let first_attn = steps.iter().position(|s| s.node.starts_with('o') && s.kernel.is_some()).unwrap();
        assert!(steps.iter().position(|s| s.node == "qr" && s.kernel.is_some()).unwrap() < first_attn);
    }

    #[test]
    fn one_token_steps_fold_the_o_projection_into_the_rope_attention_when_asked() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 32]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %wq = weight : bf16[32, 32]\n  %wk = weight : bf16[16, 32]\n  %wv = weight : bf16[16, 32]\n  %wo = weight : bf16[24, 32]\n  %kc = state : bf16[4, 4, 2, 8]\n  %vc = state : bf16[4, 4, 2, 8]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 64]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %k = slice(%qkv) {axis = 1, start = 32, len = 16} : f32[T, 16]\n  %v = slice(%qkv) {axis = 1, start = 48, len = 16} : f32[T, 16]\n  %qh = reshape(%q) : f32[T, 4, 8]\n  %kh = reshape(%k) : f32[T, 2, 8]\n  %vh = reshape(%v) : f32[T, 2, 8]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[T, 4, 8]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : bf16[4, 4, 2, 8]\n  %vw = cache_write(%vc, %vh, %slots) : bf16[4, 4, 2, 8]\n  %o = paged_attention(%qr, %kw, %vw, %pos, %seq, %table) {scale = 0.35} : f32[T, 4, 8]\n  %of = reshape(%o) : f32[T, 32]\n  %r = input : f32[T, 24]\n  %y = matmul_add(%of, %wo, %r) {transpose_b = true} : f32[T, 24]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, no_ws()).unwrap();
        assert!(plain.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::AttentionO { .. }))));
        let steps = lower_opts(&g, ScheduleOptions { attn_o: true, ..no_ws() }).unwrap();
        let fused: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::AttentionO { .. }))).collect();
        let [f] = &fused[..] else { panic!("{fused:?}") };
        assert!(matches!(&f.kernel, Some(KernelSpec::AttentionO { inner, n: 24, red: false, .. }) if matches!(inner.as_ref(), KernelSpec::RopeAttention { .. })));
        assert_eq!((f.node.as_str(), f.max_rows, f.max_context), ("o", Some(4), Some(ATTN_SPLIT_FROM_KEYS - 1)));
        assert_eq!(f.args, ["qh", "kh", "vh", "pos", "slots", "kw", "vw", "seq", "table", "wo", "r", "y@splitk4", "y@sync", "y"]);
        // (the partial sums declared before it)
        let at = |n: &str, k: bool| steps.iter().position(|s| s.node == n && s.kernel.is_some() == k).unwrap();
        assert!(at("y@splitk4", false) < at("o", true));
        // the o projection: from 2 tokens, and for one at the split attention's contexts
        let mm: Vec<&Step> = steps.iter().filter(|s| s.node == "y" && matches!(s.kernel, Some(KernelSpec::MatMul { .. }))).collect();
        assert_eq!(mm.len(), 2, "{mm:?}");
        assert_eq!((mm[0].min_rows, mm[0].max_rows, mm[0].min_context), (Some(2), None, None));
        assert_eq!((mm[1].min_rows, mm[1].max_rows, mm[1].min_context), (None, Some(1), Some(ATTN_SPLIT_FROM_KEYS)));
        assert!(mm.iter().all(|s| s.args == ["of", "wo", "r", "y"]));
    }

    #[test]
    fn rope_q_rope_cache_k_and_cache_v_run_as_one_kernel_at_the_last_of_their_steps() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 32]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %wq = weight : bf16[32, 32]\n  %wk = weight : bf16[16, 32]\n  %wv = weight : bf16[16, 32]\n  %kc = state : f32[4, 4, 2, 8]\n  %vc = state : f32[4, 4, 2, 8]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 64]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %k = slice(%qkv) {axis = 1, start = 32, len = 16} : f32[T, 16]\n  %v = slice(%qkv) {axis = 1, start = 48, len = 16} : f32[T, 16]\n  %qh = reshape(%q) : f32[T, 4, 8]\n  %kh = reshape(%k) : f32[T, 2, 8]\n  %vh = reshape(%v) : f32[T, 2, 8]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[T, 4, 8]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[4, 4, 2, 8]\n  %vw = cache_write(%vc, %vh, %slots) : f32[4, 4, 2, 8]\n  output q = %qr\n  output k = %kw\n  output v = %vw\n}\n";
        let steps = lower_opts(&text::parse(src).unwrap(), ScheduleOptions { norm_fusion: false, ..Default::default() }).unwrap();
        let idx = |n: &str| steps.iter().position(|s| s.node == n).unwrap();
        let host = idx("qr").max(idx("kw")).max(idx("vw"));
        let fused: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))).collect();
        assert_eq!(fused.len(), 1);
        assert_eq!(fused[0].node, steps[host].node);
        assert!(matches!(fused[0].kernel, Some(KernelSpec::QkvRopeCache { h: 4, kvh: 2, d: 8, interleaved: false, .. })));
        assert_eq!(fused[0].args, ["qh", "kh", "vh", "pos", "slots", "kc", "vc", "qr"]);
        for n in ["qr", "kw", "vw"] {
            assert!(steps[idx(n)].kernel.is_none() || idx(n) == host, "{n}");
        }
        // the pools stay aliased, the rotated q keeps its own buffer
        assert_eq!(steps[idx("kw")].alias_of.as_deref(), Some("kc"));
        assert_eq!(steps[idx("qr")].alias_of, None);
        // another reader of k's slice: no fusion
        let other = src.replace("  output q = %qr\n", "  %k2 = neg(%k) : f32[T, 16]\n  output q = %qr\n  output k2 = %k2\n");
        let steps = lower_opts(&text::parse(&other).unwrap(), ScheduleOptions { norm_fusion: false, ..Default::default() }).unwrap();
        assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))));
    }

    #[test]
    fn prefill_matmuls_read_a_16_bit_copy_of_x_made_once_before_the_first_of_them() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %wa = weight : bf16[128, 64]\n  %wb = weight : bf16[256, 64]\n  %wc = weight : f32[128, 64]\n  %a = matmul(%x, %wa) {transpose_b = true} : f32[T, 128]\n  %b = matmul(%x, %wb) {transpose_b = true} : f32[T, 256]\n  %c = matmul(%x, %wc) {transpose_b = true} : f32[T, 128]\n  output a = %a\n  output b = %b\n  output c = %c\n}\n";
        // (the batched GEMVs on f32 x: only the prefill matmuls read the copy)
        let steps = lower_opts(&text::parse(src).unwrap(), ScheduleOptions { few_x16: false, tma: Tma::Off, ..no_ws() }).unwrap();
        let casts: Vec<usize> = steps.iter().enumerate().filter(|(_, s)| matches!(s.kernel, Some(KernelSpec::ToHalf { f16: false }))).map(|(i, _)| i).collect();
        assert_eq!(casts.len(), 1, "one cast for the two bf16 matmuls");
        let cast = &steps[casts[0]];
        // from the pipelined matmul's rows: its 64-row tiles from 48 for these few columns
        assert_eq!((cast.node.as_str(), cast.args.as_slice(), cast.min_rows), ("x@bf16", &["x".to_string(), "x@bf16".to_string()][..], Some(48)));
        assert_eq!(cast.work, Scalar::RowsTimes("x".into(), 8));
        let at = |n: &str| steps.iter().position(|s| s.node == n).unwrap();
        assert!(casts[0] < at("a") && casts[0] < at("b"));
        for n in ["a", "b"] {
            let h = steps[at(n)].hopper.last().unwrap();
            assert!(matches!(h.kernel, KernelSpec::MatMulPipe { a16: true, .. }), "{n}: {:?}", h.kernel);
            assert_eq!(h.args.as_ref().unwrap()[0], "x@bf16");
            assert_eq!(h.min_rows, 64);
            // decode and batched decode keep reading the f32 x
            assert_eq!(steps[at(n)].args[0], "x");
        }
        // f32 weights: the wgmma kernel on the f32 x, no cast
        let c = steps[at("c")].hopper.last().unwrap();
        assert!(matches!(c.kernel, KernelSpec::MatMulWgmma { .. }) && c.args.is_none());
    }

    #[test]
    fn batched_decode_reads_the_16_bit_copy_when_asked_and_one_cast_serves_both() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %wa = weight : bf16[128, 64]\n  %wb = weight : bf16[256, 64]\n  %a = matmul(%x, %wa) {transpose_b = true} : f32[T, 128]\n  %b = matmul(%x, %wb) {transpose_b = true} : f32[T, 256]\n  output a = %a\n  output b = %b\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { few_x16: false, tma: Tma::Off, ..no_ws() }).unwrap();
        assert!(plain.iter().all(|s| s.few.iter().all(|l| !matches!(l.kernel, KernelSpec::MatMulFewX16 { .. }))));
        let steps = lower_opts(&g, ScheduleOptions { few_x16: true, ..no_ws() }).unwrap();
        let casts: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))).collect();
        assert_eq!(casts.len(), 1);
        assert_eq!(casts[0].min_rows, Some(16), "the cast runs from the 16-bit batched GEMV's rows");
        for n in ["a", "b"] {
            let s = steps.iter().find(|s| s.node == n).unwrap();
            // f32 x for 2..=15 rows, the 16-bit copy from 16
            let [f32x, x16] = &s.few[..] else { panic!("{:?}", s.few) };
            assert!(matches!(f32x.kernel, KernelSpec::MatMulFew { .. }) && (f32x.min_rows, f32x.max_rows) == (2, Some(15)));
            assert!(f32x.args.is_none());
            assert!(matches!(x16.kernel, KernelSpec::MatMulFewX16 { .. }) && x16.min_rows == 16);
            assert_eq!(x16.args.as_ref().unwrap()[0], "x@bf16");
            assert_eq!(s.hopper.last().unwrap().args.as_ref().unwrap()[0], "x@bf16");
            assert_eq!(s.args[0], "x");
        }
    }

    #[test]
    fn batched_decode_rows_go_to_64_row_tiles_then_128_row_tiles_by_width() {
        // (x in f32 for the batched GEMV here: only the Hopper list matters)
        for (n, lo64, from128) in [(6144usize, 32i64, 64i64), (28672, 32, 16), (128, 48, 64)] {
            let src = format!("graph \"t\" {{\n  %x = input : f32[T, 64]\n  %w = weight : bf16[{n}, 64]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[T, {n}]\n  output y = %y\n}}\n");
            let steps = lower_opts(&text::parse(&src).unwrap(), ScheduleOptions { few_x16: false, tma: Tma::Off, ..no_ws() }).unwrap();
            let s = steps.iter().find(|s| s.node == "y").unwrap();
            let [p64, p128] = &s.hopper[..] else { panic!("{:?}", s.hopper) };
            assert!(matches!(p64.kernel, KernelSpec::MatMulPipe { bm: 64, a16: true, .. }), "{:?}", p64.kernel);
            assert_eq!((p64.min_rows, p64.max_rows), (lo64, Some(64)), "N {n}");
            assert!(matches!(p128.kernel, KernelSpec::MatMulPipe { bm: 128, .. }), "{:?}", p128.kernel);
            assert_eq!((p128.min_rows, p128.max_rows), (from128, None), "N {n}");
            // both read the 16-bit copy, which is made from the fewest rows either takes
            assert!(s.hopper.iter().all(|h| h.args.as_ref().unwrap()[0] == "x@bf16"));
            let cast = steps.iter().find(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))).unwrap();
            assert_eq!(cast.min_rows, Some(lo64.min(from128)));
        }
    }

    #[test]
    fn norm_half_writes_the_16_bit_copy_from_the_norm_instead_of_a_cast() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %g = weight : f32[64]\n  %xn = rms_norm(%x, %g) {eps = 1e-5} : f32[T, 64]\n  %w = weight : bf16[6144, 64]\n  %y = matmul(%xn, %w) {transpose_b = true} : f32[T, 6144]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { norm_half: false, ..no_ws() }).unwrap();
        assert!(plain.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))));
        let steps = lower_opts(&g, ScheduleOptions { norm_half: true, ..no_ws() }).unwrap();
        assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))), "no cast step");
        let norm = steps.iter().find(|s| s.node == "xn").unwrap();
        assert_eq!(norm.kernel, Some(KernelSpec::RmsNormHalf { d: 64, eps_bits: 1e-5f32.to_bits(), f16: false }));
        assert_eq!(norm.args, ["x", "g", "xn", "xn@bf16"]);
        // the copy's buffer is declared by a step of its own, and the matmul's 16-bit readers use it
        assert!(steps.iter().any(|s| s.node == "xn@bf16" && s.kernel.is_none() && s.alias_of.is_none()));
        let y = steps.iter().find(|s| s.node == "y").unwrap();
        assert!(y.hopper.iter().chain(&y.few).filter(|l| l.args.is_some()).all(|l| l.args.as_ref().unwrap()[0] == "xn@bf16"));
        assert_eq!(y.args[0], "xn");
    }

    #[test]
    fn a_layer_norm_writes_the_16_bit_copy_too() {
        // (GPT-2 / BERT style: layer_norm, then a matmul with a bias whose tensor-core kernels
        // read x in 16 bits)
        let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %g = weight : f32[64]\n  %b = weight : f32[64]\n  %xn = layer_norm(%x, %g, %b) {eps = 1e-5} : f32[T, 64]\n  %w = weight : f16[6144, 64]\n  %y = matmul(%xn, %w) {transpose_b = true} : f32[T, 6144]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { norm_half: false, ..no_ws() }).unwrap();
        assert!(plain.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { f16: true }))));
        let steps = lower_opts(&g, no_ws()).unwrap();
        assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))), "no cast step");
        let norm = steps.iter().find(|s| s.node == "xn").unwrap();
        assert_eq!(norm.kernel, Some(KernelSpec::LayerNorm { d: 64, eps_bits: 1e-5f32.to_bits(), half: Some(true) }));
        assert_eq!(norm.args, ["x", "g", "b", "xn", "xn@f16"]);
        let y = steps.iter().find(|s| s.node == "y").unwrap();
        assert!(y.hopper.iter().chain(&y.few).filter(|l| l.args.is_some()).all(|l| l.args.as_ref().unwrap()[0] == "xn@f16"));
    }

    #[test]
    fn split_k_adds_a_partial_sums_alternative_and_its_reduce_step() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %r = input : f32[T, 4096]\n  %w = weight : bf16[4096, 4096]\n  %y = matmul_add(%x, %w, %r) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { split_k: None, ..no_ws() }).unwrap();
        assert!(plain.iter().all(|s| !s.node.contains("@splitk") && s.hopper.iter().all(|h| !matches!(h.kernel, KernelSpec::SplitK { .. }))));
        let steps = lower_opts(&g, ScheduleOptions { split_k: Some(4), ..no_ws() }).unwrap();
        let i = steps.iter().position(|s| s.node == "y" && s.kernel.as_ref().is_some_and(|k| matches!(k, KernelSpec::MatMul { .. }))).unwrap();
        // the partial sums' buffer declared first (then the cast of x), the reduce pass right after
        let (decl, mm, red) = (steps[..i].iter().find(|s| s.node == "y@splitk4").unwrap(), &steps[i], &steps[i + 1]);
        assert!(decl.kernel.is_none() && decl.alias_of.is_none());
        let sk = &mm.hopper[0];
        let KernelSpec::SplitK { inner, splits: 4 } = &sk.kernel else { panic!("{:?}", sk.kernel) };
        assert!(matches!(inner.as_ref(), KernelSpec::MatMulPipe { bm: 64, residual: false, bias: false, a16: true, .. }));
        let hi = sk.max_rows.unwrap();
        assert_eq!((sk.min_rows, hi), (SPLIT_K_MIN_ROWS, SPLIT_K_MAX_ROWS));
        // (the 64-row alternative it stands in front of keeps its rows: first fit)
        assert!(mm.hopper[1..].iter().any(|h| matches!(h.kernel, KernelSpec::MatMulPipe { bm: 64, .. }) && h.max_rows == Some(64)));
        // x from its 16-bit copy, no residual in the first pass
        assert_eq!(sk.args.as_deref().unwrap(), ["x@bf16", "w", "y@splitk4"]);
        assert_eq!(red.kernel, Some(KernelSpec::SplitKReduce { splits: 4, residual: true }));
        assert_eq!(red.args, ["y@splitk4", "r", "y"]);
        assert_eq!((red.min_rows, red.max_rows, red.hopper_only), (Some(SPLIT_K_MIN_ROWS), Some(hi), true));
        // the cast to bf16 runs from the split's first row
        let cast = steps.iter().find(|s| s.node == "x@bf16").unwrap();
        assert!(cast.min_rows.unwrap() <= SPLIT_K_MIN_ROWS);
    }

    #[test]
    fn the_batched_gate_up_matmul_takes_the_swiglu_and_the_silu_step_skips_its_rows() {
        // the 8B shape's MLP: merged gate/up, silu_mul, down
        let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %wg = weight : bf16[14336, 4096]\n  %wu = weight : bf16[14336, 4096]\n  %gu = matmul_cat(%x, %wg, %wu) : f32[T, 28672]\n  %g = slice(%gu) {axis = 1, start = 0, len = 14336} : f32[T, 14336]\n  %u = slice(%gu) {axis = 1, start = 14336, len = 14336} : f32[T, 14336]\n  %h = silu_mul(%g, %u) : f32[T, 14336]\n  %wd = weight : bf16[4096, 14336]\n  %y = matmul(%h, %wd) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { swiglu_pipe: SwiGluFusion::Off, ..no_ws() }).unwrap();
        let steps = lower_opts(&g, ScheduleOptions { swiglu_pipe: SwiGluFusion::Batched, ..no_ws() }).unwrap();
        assert_eq!(plain.len(), steps.len());
        let sm = steps.iter().find(|s| s.node == "h").unwrap();
        assert_eq!(sm.kernel, Some(KernelSpec::SiluMulHalf { f16: false }));
        let mm = steps.iter().find(|s| s.node == "gu").unwrap();
        let fused: Vec<&Large> = mm.hopper.iter().filter(|l| matches!(l.kernel, KernelSpec::SwiGluPipe { .. })).collect();
        let [alt] = fused[..] else { panic!("{:?}", mm.hopper) };
        let KernelSpec::SwiGluPipe { inner } = &alt.kernel else { unreachable!() };
        assert!(matches!(inner.as_ref(), KernelSpec::MatMulPipe { bm: 64, n: 28672, a16: true, bias: false, residual: false, .. }), "{inner:?}");
        // x's 16-bit copy, both weights, then h and its copy; M and F
        assert_eq!(alt.args.as_deref().unwrap(), ["x@bf16", "wg", "wu", "h", "h@bf16"]);
        assert_eq!(alt.scalars, vec![Scalar::Rows("h".into()), Scalar::Const(14336)]);
        // the silu step skips exactly the fused alternative's rows; the unfused plan has none
        assert_eq!(sm.hopper_skip, Some((alt.min_rows, alt.max_rows.unwrap_or(i64::MAX))));
        assert!(plain.iter().all(|s| s.hopper_skip.is_none() && s.alternatives().all(|l| !matches!(l.kernel, KernelSpec::SwiGluPipe { .. }))));
        // ... and every other alternative is as before
        let before = plain.iter().find(|s| s.node == "gu").unwrap();
        assert_eq!(before.hopper.len(), mm.hopper.len());
        assert_eq!(
            before.hopper.iter().filter(|l| !matches!(l.kernel, KernelSpec::MatMulParts { ref inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMulPipe { bm: 64, .. }))).count(),
            mm.hopper.len() - 1
        );
        // every pipelined alternative (DSC_SWIGLU_PIPE=all): the 128-row tiles too, and the
        // silu step skips every row they and the 64-row tile take (from the first's 16 up)
        let all = lower_opts(&g, ScheduleOptions { swiglu_pipe: SwiGluFusion::All, ..no_ws() }).unwrap();
        let mm = all.iter().find(|s| s.node == "gu").unwrap();
        let fused: Vec<&Large> = mm.hopper.iter().filter(|l| matches!(l.kernel, KernelSpec::SwiGluPipe { .. })).collect();
        let pipes = before.hopper.iter().filter(|l| matches!(&l.kernel, KernelSpec::MatMulParts { inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMulPipe { .. }))).count();
        assert_eq!(fused.len(), pipes);
        assert!(fused.len() >= 2, "{:?}", mm.hopper);
        let lo = fused.iter().map(|l| l.min_rows).min().unwrap();
        assert_eq!(all.iter().find(|s| s.node == "h").unwrap().hopper_skip, Some((lo, i64::MAX)));
    }

    #[test]
    fn the_swiglu_stays_out_of_the_tiles_that_load_w_by_tma() {
        // the SmolLM2 shape's MLP: its 128-row gate/up tiles are 128 columns wide (TMA loads
        // by default), so only the 64-row tile takes the SwiGLU; with TMA off both do
        let src = "graph \"t\" {\n  %x = input : f32[T, 576]\n  %wg = weight : bf16[1536, 576]\n  %wu = weight : bf16[1536, 576]\n  %gu = matmul_cat(%x, %wg, %wu) : f32[T, 3072]\n  %g = slice(%gu) {axis = 1, start = 0, len = 1536} : f32[T, 1536]\n  %u = slice(%gu) {axis = 1, start = 1536, len = 1536} : f32[T, 1536]\n  %h = silu_mul(%g, %u) : f32[T, 1536]\n  %wd = weight : bf16[576, 1536]\n  %y = matmul(%h, %wd) {transpose_b = true} : f32[T, 576]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        // ((rows, columns) per tile, fused) of the pipelined alternatives, first fit first
        let fused = |tma: Tma| -> Vec<((usize, usize), bool)> {
            let steps = lower_opts(&g, ScheduleOptions { tma, ..no_ws() }).unwrap();
            let mm = steps.iter().find(|s| s.node == "gu").unwrap();
            let tile = |k: &KernelSpec| match k.matmul_core().0 {
                KernelSpec::MatMulPipe { bm, bn, .. } => (*bm, *bn),
                _ => (0, 0),
            };
            mm.hopper
                .iter()
                .map(|l| match &l.kernel {
                    KernelSpec::SwiGluPipe { inner } => (tile(inner), true),
                    other => (tile(other), false),
                })
                .filter(|&(t, _)| t.0 > 0)
                .collect()
        };
        let narrow = fused(Tma::Narrow);
        assert_eq!(narrow[0], ((64, 128), true));
        assert_eq!(narrow.last(), Some(&((128, 128), false)));
        assert!(fused(Tma::Off).iter().all(|&(_, f)| f));
        // warp-specialized (the default), the 128-row tiles load by TMA and take the SwiGLU too
        let steps = lower_opts(&g, ScheduleOptions::default()).unwrap();
        let mm = steps.iter().find(|s| s.node == "gu").unwrap();
        let ws: Vec<&Large> = mm.hopper.iter().filter(|l| matches!(&l.kernel, KernelSpec::Ws { inner } if matches!(inner.as_ref(), KernelSpec::SwiGluPipe { .. }))).collect();
        assert!(!ws.is_empty(), "{:?}", mm.hopper);
        // (128-row tiles: a box of 64 gate and 64 up rows; 64-row ones, from WS64_MIN_ROWS:
        // per warpgroup 32 and 32)
        // (and the 256-column tiles of long prefills: 128 and 128)
        let ok =
            |a: &[String]| [["x@bf16@xmap128", "wg@tmap64", "wu@tmap64"], ["x@bf16@xmap64", "wg@tmap32", "wu@tmap32"], ["x@bf16@xmap128", "wg@tmap128", "wu@tmap128"]].iter().any(|w| a[..3] == *w);
        assert!(ws.iter().all(|l| ok(l.args.as_deref().unwrap())), "{ws:?}");
    }

    #[test]
    fn the_split_k_qkv_reduce_folds_into_the_rope_kernel() {
        // the 8B shape's attention inputs: merged q/k/v (48 column tiles: split-K 2), RoPE and
        // the cache writes
        let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %wq = weight : bf16[4096, 4096]\n  %wk = weight : bf16[1024, 4096]\n  %wv = weight : bf16[1024, 4096]\n  %kc = state : bf16[64, 16, 8, 128]\n  %vc = state : bf16[64, 16, 8, 128]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 6144]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 4096} : f32[T, 4096]\n  %k = slice(%qkv) {axis = 1, start = 4096, len = 1024} : f32[T, 1024]\n  %v = slice(%qkv) {axis = 1, start = 5120, len = 1024} : f32[T, 1024]\n  %qh = reshape(%q) : f32[T, 32, 128]\n  %kh = reshape(%k) : f32[T, 8, 128]\n  %vh = reshape(%v) : f32[T, 8, 128]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 128} : f32[T, 32, 128]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 128} : bf16[64, 16, 8, 128]\n  %vw = cache_write(%vc, %vh, %slots) : bf16[64, 16, 8, 128]\n  output q = %qr\n  output k = %kw\n  output v = %vw\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { splitk_rope: false, ..no_ws() }).unwrap();
        let red = plain.iter().find(|s| matches!(s.kernel, Some(KernelSpec::SplitKReduce { splits: 2, residual: false }))).expect("a q/k/v reduce by default");
        let (lo, hi) = (red.min_rows.unwrap(), red.max_rows.unwrap());
        let steps = lower_opts(&g, ScheduleOptions { splitk_rope: true, ..no_ws() }).unwrap();
        assert_eq!(steps.len(), plain.len() - 1);
        assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::SplitKReduce { .. }))));
        let rope = steps.iter().find(|s| matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))).unwrap();
        let [alt] = &rope.hopper[..] else { panic!("{:?}", rope.hopper) };
        assert!(matches!(&alt.kernel, KernelSpec::QkvRopeSplitK { inner, splits: 2 } if Some(inner.as_ref()) == rope.kernel.as_ref()));
        // its rows are tokens x 32 heads
        assert_eq!((alt.min_rows, alt.max_rows), (lo * 32, Some(hi * 32)));
        let parts = red.args[0].clone();
        assert_eq!(alt.args.as_deref().unwrap()[0], parts);
        assert_eq!(alt.args.as_deref().unwrap()[1..], rope.args[3..]);
        // the slice, then q's, k's and v's offsets in it
        assert_eq!(alt.scalars[rope.scalars.len()..], [Scalar::Numel("qkv".into()), Scalar::RowsTimes("qkv".into(), 0), Scalar::RowsTimes("qkv".into(), 4096), Scalar::RowsTimes("qkv".into(), 5120)]);
    }

    #[test]
    fn fused_rows_are_the_rows_a_fused_alternative_is_picked_for() {
        let alt = |min_rows: i64, max_rows: Option<i64>| Large {
            min_rows,
            max_rows,
            args: None,
            kernel: KernelSpec::ToHalf { f16: false },
            scalars: vec![],
            work: Scalar::Const(1),
            grid_y: Scalar::Const(1),
        };
        // a 64-row tile for 32..=64 in front of a 128-row tile from 16
        let alts = [alt(32, Some(64)), alt(16, None)];
        assert_eq!(fused_rows(&alts, &[0]), Some((32, 64)));
        assert_eq!(fused_rows(&alts, &[0, 1]), Some((16, i64::MAX)));
        // the 128-row tile alone is picked at 16..=31 and from 65: two intervals
        assert_eq!(fused_rows(&alts, &[1]), None);
        assert_eq!(fused_rows(&alts, &[]), None);
        // an earlier alternative takes part of a later one's rows
        let alts = [alt(16, Some(128)), alt(32, Some(64)), alt(100, None)];
        assert_eq!(fused_rows(&alts, &[1]), None);
        assert_eq!(fused_rows(&alts, &[2]), Some((129, i64::MAX)));
    }

    #[test]
    fn silu_mul_writes_the_16_bit_copy_the_down_projection_reads() {
        let src = "graph \"t\" {\n  %g = input : f32[T, 256]\n  %u = input : f32[T, 256]\n  %h = silu_mul(%g, %u) : f32[T, 256]\n  %w = weight : bf16[4096, 256]\n  %y = matmul(%h, %w) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let steps = lower_opts(&g, ScheduleOptions { silu_half: true, ..no_ws() }).unwrap();
        assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))), "no cast step");
        let sm = steps.iter().find(|s| s.node == "h").unwrap();
        assert_eq!(sm.kernel, Some(KernelSpec::SiluMulHalf { f16: false }));
        assert_eq!(sm.args, ["g", "u", "h", "h@bf16"]);
        let y = steps.iter().find(|s| s.node == "y").unwrap();
        assert!(y.hopper.iter().chain(&y.few).filter(|l| l.args.is_some()).all(|l| l.args.as_ref().unwrap()[0] == "h@bf16"));
        assert_eq!(steps, lower_opts(&g, no_ws()).unwrap(), "on by default");
        // (off, or without norm + quantize: the cast, and silu_mul as before)
        let plain = lower_opts(&g, ScheduleOptions { norm_half: false, ..no_ws() }).unwrap();
        assert!(plain.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))));
        let plain = lower_opts(&g, ScheduleOptions { silu_half: false, ..no_ws() }).unwrap();
        assert!(plain.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))));
        assert!(plain.iter().any(|s| s.kernel == Some(KernelSpec::Binary(BinaryOpKey(dsc_ir::BinaryOp::SiluMul)))));
    }

    #[test]
    fn split_k_takes_a_merged_matmul_with_fewer_parts_for_more_tiles() {
        // the 8B shape's q/k/v: 6144 columns, 48 tiles of 128 -> 2 parts (96 blocks; 4 would
        // be 192, past one wave of 132 SMs)
        let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %wq = weight : bf16[4096, 4096]\n  %wk = weight : bf16[1024, 4096]\n  %wv = weight : bf16[1024, 4096]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 6144]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 4096} : f32[T, 4096]\n  %k = slice(%qkv) {axis = 1, start = 4096, len = 1024} : f32[T, 1024]\n  %v = slice(%qkv) {axis = 1, start = 5120, len = 1024} : f32[T, 1024]\n  output q = %q\n  output k = %k\n  output v = %v\n}\n";
        let g = text::parse(src).unwrap();
        let steps = lower_opts(&g, no_ws()).unwrap();
        let i = steps.iter().position(|s| s.node == "qkv" && s.kernel.is_some()).unwrap();
        let (mm, red) = (&steps[i], &steps[i + 1]);
        let KernelSpec::SplitK { inner, splits: 2 } = &mm.hopper[0].kernel else { panic!("{:?}", mm.hopper[0].kernel) };
        let KernelSpec::MatMulParts { inner: pipe, parts } = inner.as_ref() else { panic!("{inner:?}") };
        assert_eq!(parts, &[4096, 1024, 1024]);
        assert!(matches!(pipe.as_ref(), KernelSpec::MatMulPipe { bm: 64, bn: 128, .. }));
        assert_eq!(mm.hopper[0].args.as_deref().unwrap(), ["x@bf16", "wq", "wk", "wv", "qkv@splitk2"]);
        assert_eq!(red.kernel, Some(KernelSpec::SplitKReduce { splits: 2, residual: false }));
        assert_eq!(red.args, ["qkv@splitk2", "qkv"]);
        assert!(steps.iter().any(|s| s.node == "qkv@splitk2" && s.kernel.is_none()));
        // the part counts: o/down (32 tiles) 4, q/k/v (48) 2, gate/up (112) none
        assert_eq!((split_k_parts(32, 64, 128, 4), split_k_parts(48, 64, 128, 4), split_k_parts(112, 64, 256, 4)), (Some(4), Some(2), None));
    }

    #[test]
    fn split_k_reduce_folds_into_the_norm_reading_its_output() {
        // o projection + residual, then the norm of the residual stream ahead of a bf16 matmul
        let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %h = input : f32[T, 4096]\n  %wo = weight : bf16[4096, 4096]\n  %h2 = matmul_add(%x, %wo, %h) {transpose_b = true} : f32[T, 4096]\n  %g = weight : f32[4096]\n  %xn = rms_norm(%h2, %g) {eps = 1e-5} : f32[T, 4096]\n  %w2 = weight : bf16[4096, 4096]\n  %y = matmul_add(%xn, %w2, %h2) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let steps = lower_opts(&g, no_ws()).unwrap();
        // h2's reduce is gone, folded into the norm; y's (read by no norm) stays
        assert!(steps.iter().all(|s| !(s.node == "h2" && matches!(s.kernel, Some(KernelSpec::SplitKReduce { .. })))));
        assert!(steps.iter().any(|s| s.node == "y" && matches!(s.kernel, Some(KernelSpec::SplitKReduce { .. }))));
        let norm = steps.iter().find(|s| s.node == "xn").unwrap();
        assert_eq!(norm.kernel, Some(KernelSpec::RmsNormHalf { d: 4096, eps_bits: 1e-5f32.to_bits(), f16: false }));
        let [alt] = &norm.hopper[..] else { panic!("{:?}", norm.hopper) };
        assert_eq!(
            alt.kernel,
            KernelSpec::SplitKReduceNorm { splits: 4, residual: true, d: 4096, eps_bits: 1e-5f32.to_bits(), half: Some(false), cluster: crate::kernels::splitk_norm_cluster(4096, None) }
        );
        assert_eq!(alt.args.as_deref().unwrap(), ["h2@splitk4", "h", "h2", "g", "xn", "xn@bf16"]);
        let mm = steps.iter().find(|s| s.node == "h2" && s.kernel.is_some()).unwrap();
        assert_eq!((alt.min_rows, alt.max_rows), (mm.hopper[0].min_rows, mm.hopper[0].max_rows));
    }

    #[test]
    fn tma_wraps_the_pipelined_matmuls_and_names_the_weights_tensor_maps() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %wq = weight : bf16[4096, 4096]\n  %wk = weight : bf16[1024, 4096]\n  %wv = weight : bf16[1024, 4096]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 6144]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 4096} : f32[T, 4096]\n  %k = slice(%qkv) {axis = 1, start = 4096, len = 1024} : f32[T, 1024]\n  %v = slice(%qkv) {axis = 1, start = 5120, len = 1024} : f32[T, 1024]\n  %h = input : f32[T, 4096]\n  %wo = weight : bf16[4096, 4096]\n  %y = matmul_add(%q, %wo, %h) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n  output k = %k\n  output v = %v\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { tma: Tma::Off, ..no_ws() }).unwrap();
        let steps = lower_opts(&g, ScheduleOptions { tma: Tma::All, ..no_ws() }).unwrap();
        assert_eq!(plain.len(), steps.len());
        let mut wrapped = 0;
        for (p, s) in plain.iter().zip(&steps) {
            assert_eq!(p.hopper.len(), s.hopper.len());
            for (ph, sh) in p.hopper.iter().zip(&s.hopper) {
                let KernelSpec::Tma { inner } = &sh.kernel else {
                    assert_eq!(ph.kernel, sh.kernel, "only pipelined matmuls change");
                    continue;
                };
                wrapped += 1;
                assert_eq!(inner.as_ref(), &ph.kernel);
                let (pa, sa) = (ph.args.clone().unwrap_or_else(|| p.args.clone()), sh.args.clone().unwrap());
                // x and the outputs as before; each weight its tensor map
                assert_eq!((pa[0].as_str(), pa.last()), (sa[0].as_str(), sa.last()));
                assert!(sa.iter().filter(|a| a.contains("@tmap")).all(|a| a.starts_with('w')));
                let n_w = sa.iter().filter(|a| a.contains("@tmap")).count();
                assert_eq!(n_w, if s.node == "qkv" { 3 } else { 1 }, "{sa:?}");
            }
        }
        // q/k/v and o: the split-K alternatives and the 64-/128-row tiles
        assert!(wrapped >= 4, "{wrapped}");
    }

    #[test]
    fn decode_attention_prefetches_the_output_projections_weights() {
        // (the 8B shape's o projection: 32 MiB of bf16, over the GEMV's own prefetch limit)
        let src = "graph \"t\" {\n  %q = input : f32[T, 32, 128]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : f32[NB, 16, 8, 128]\n  %vc = state : f32[NB, 16, 8, 128]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {scale = 0.088} : f32[T, 32, 128]\n  %a = reshape(%o) : f32[T, 4096]\n  %wo = weight : bf16[4096, 4096]\n  %h = input : f32[T, 4096]\n  %y = matmul_add(%a, %wo, %h) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let steps = lower_opts(&g, ScheduleOptions { attn_prefetch: true, ..no_ws() }).unwrap();
        let attn: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::PrefetchL2 { .. }))).collect();
        // the one-pass steps (short and long contexts), not the split pass
        assert_eq!(attn.len(), 2, "{:?}", steps.iter().map(|s| &s.kernel).collect::<Vec<_>>());
        for s in attn {
            assert_eq!(s.args[0], "wo");
            assert_eq!(s.scalars.last(), Some(&Scalar::Const(4096 * 4096 * 2)));
            assert!(s.few.iter().all(|l| matches!(l.kernel, KernelSpec::PrefetchL2 { .. }) && l.scalars.last() == Some(&Scalar::Const(4096 * 4096 * 2))));
            // the prefill attention keeps its args
            assert_eq!(s.large.as_ref().unwrap().args.as_ref().unwrap()[0], "q");
        }
    }

    #[test]
    fn bf16_kv_pools_lower_to_the_16_bit_kernels_and_f16_ones_are_refused() {
        let src = |kv: &str| {
            format!("graph \"t\" {{\n  %q = input : f32[T, 32, 128]\n  %k = input : f32[T, 8, 128]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %slots = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : {kv}[NB, 16, 8, 128]\n  %vc = state : {kv}[NB, 16, 8, 128]\n  %kw = cache_write(%kc, %k, %slots) : {kv}[NB, 16, 8, 128]\n  %vw = cache_write(%vc, %k, %slots) : {kv}[NB, 16, 8, 128]\n  %o = paged_attention(%q, %kw, %vw, %pos, %seq, %table) {{scale = 0.088}} : f32[T, 32, 128]\n  output o = %o\n}}\n")
        };
        let steps = lower_opts(&text::parse(&src("bf16")).unwrap(), no_ws()).unwrap();
        let kernels: Vec<&KernelSpec> = steps.iter().flat_map(|s| s.kernel.iter().chain(s.large.iter().map(|l| &l.kernel)).chain(s.few.iter().map(|l| &l.kernel))).collect();
        let attn = kernels.iter().filter(|k| matches!(k, KernelSpec::PagedAttention { .. } | KernelSpec::PagedAttentionSplit { .. } | KernelSpec::FlashAttention { .. })).count();
        assert!(attn >= 3, "{kernels:?}");
        for k in &kernels {
            match k {
                KernelSpec::CacheWrite { kv, .. } | KernelSpec::PagedAttention { kv, .. } | KernelSpec::PagedAttentionSplit { kv, .. } | KernelSpec::FlashAttention { kv, .. } => {
                    assert_eq!(*kv, DType::BF16, "{k:?}");
                    assert!(k.symbol().ends_with("_kvbf16"), "{}", k.symbol());
                }
                _ => {}
            }
        }
        let e = lower_opts(&text::parse(&src("f16")).unwrap(), no_ws()).unwrap_err().to_string();
        assert!(e.contains("kw") && e.contains("f16 KV caches"), "{e}");
    }

    #[test]
    fn grouped_attention_takes_what_fits_a_lane_and_shared_memory() {
        // the 8B shape, SmolLM2's, Llama-3-70B's (64 heads over 8), head dim 256, MHA
        assert_eq!(attention_group_size(32, 8, 128, ATTN_GROUP_WARPS), 4);
        assert_eq!(attention_group_size(9, 3, 64, ATTN_GROUP_WARPS), 3);
        assert_eq!(attention_group_size(64, 8, 128, 16), 4);
        assert_eq!(attention_group_size(16, 4, 256, 16), 2);
        assert_eq!(attention_group_size(32, 32, 128, 16), 1);
        // 70B-like: the batched alternative in groups of 4, grid y = 16 head groups
        let src = "graph \"t\" {\n  %q = input : f32[T, 64, 128]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : f32[NB, 16, 8, 128]\n  %vc = state : f32[NB, 16, 8, 128]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {scale = 0.088} : f32[T, 64, 128]\n  output o = %o\n}\n";
        let steps = lower_opts(&text::parse(src).unwrap(), no_ws()).unwrap();
        let one = steps.iter().find(|s| s.node == "o" && s.kernel.is_some()).unwrap();
        let [g] = &one.few[..] else { panic!("{:?}", one.few) };
        assert!(matches!(g.kernel, KernelSpec::PagedAttention { group: 4, .. }), "{:?}", g.kernel);
        assert_eq!((g.grid_y.clone(), g.min_rows), (Scalar::Const(16), 8 * 64));
        let split = steps.iter().find(|s| matches!(s.kernel, Some(KernelSpec::PagedAttentionSplit { .. }))).unwrap();
        assert!(matches!(split.kernel, Some(KernelSpec::PagedAttentionSplit { group: 4, .. })), "{:?}", split.kernel);
        assert_eq!(split.grid_y, Scalar::Const(16 * ATTN_SPLITS as i64));
    }

    #[test]
    fn split_kv_makes_decode_attention_two_steps_and_leaves_prefill_to_flash() {
        let src = "graph \"t\" {\n  %q = input : f32[T, 8, 64]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : f32[NB, 16, 2, 64]\n  %vc = state : f32[NB, 16, 2, 64]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {scale = 0.125} : f32[T, 8, 64]\n  output o = %o\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { split_kv: false, ..no_ws() }).unwrap();
        assert!(plain.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::PagedAttentionSplit { .. }))));
        let steps = lower_opts(&g, ScheduleOptions { split_kv: true, ..no_ws() }).unwrap();
        let part = format!("o@split{ATTN_SPLITS}");
        let i = steps.iter().position(|s| s.node == part).expect("the first pass");
        let (one, wide, first, merge) = (&steps[i - 2], &steps[i - 1], &steps[i], &steps[i + 1]);
        // the one-pass kernel stays for shorter contexts, and for more rows than the split
        // takes (with the prefill attention); the two passes take long contexts of few rows
        assert_eq!((one.node.as_str(), wide.node.as_str()), ("o", "o"));
        assert!(matches!(one.kernel, Some(KernelSpec::PagedAttention { .. })) && one.kernel == wide.kernel);
        assert_eq!((one.min_context, one.max_context, one.min_rows), (None, Some(ATTN_SPLIT_FROM_KEYS - 1), None));
        assert_eq!((wide.min_context, wide.max_context, wide.min_rows), (Some(ATTN_SPLIT_FROM_KEYS), None, Some(ATTN_SPLIT_ROWS + 1)));
        assert!(one.large.is_some() && wide.large.is_some() && first.large.is_none());
        assert_eq!((first.min_context, merge.min_context), (Some(ATTN_SPLIT_FROM_KEYS), Some(ATTN_SPLIT_FROM_KEYS)));
        assert_eq!((first.max_context, merge.max_context), (None, None));
        assert_eq!((first.max_rows, merge.max_rows), (Some(ATTN_SPLIT_ROWS), Some(ATTN_SPLIT_ROWS)));
        assert!(matches!(first.kernel, Some(KernelSpec::PagedAttentionSplit { splits: ATTN_SPLITS, min_keys: ATTN_SPLIT_MIN_KEYS, .. })), "{:?}", first.kernel);
        assert_eq!(first.args.last(), Some(&part));
        // (a block per (token, head, part): 8 heads, 2 KV heads — too few to group)
        assert_eq!(first.grid_y, Scalar::Const(8 * ATTN_SPLITS as i64));
        assert_eq!((one.work.clone(), one.grid_y.clone()), (Scalar::Dim("o".into(), 0), Scalar::Const(8)));
        // batched decode: a block per (token, KV head) from ATTN_GROUP_MIN_BLOCKS of them, up
        // to the prefill attention's rows; the split pass has none
        let [g] = &one.few[..] else { panic!("{:?}", one.few) };
        assert!(matches!(g.kernel, KernelSpec::PagedAttention { group: 4, warps: ATTN_GROUP_WARPS, .. }), "{:?}", g.kernel);
        assert_eq!((g.min_rows, g.max_rows), ((ATTN_GROUP_MIN_BLOCKS / 2 * 8) as i64, Some(one.large.as_ref().unwrap().min_rows - 1)));
        assert_eq!((g.work.clone(), g.grid_y.clone()), (Scalar::Dim("o".into(), 0), Scalar::Const(2)));
        assert!(first.few.is_empty() && wide.few == one.few);
        // prefill: FlashAttention (the one-pass steps' alternative) writes o itself
        assert!(wide.large.as_ref().unwrap().min_rows > ATTN_SPLIT_ROWS);
        assert_eq!(merge.node, "o");
        assert!(matches!(merge.kernel, Some(KernelSpec::AttentionCombine { h: 8, d: 64, .. })));
        assert_eq!(merge.args, [part.as_str(), "pos", "o"]);
    }

    #[test]
    fn the_long_prefill_matmuls_are_warp_specialized() {
        // the 8B shape's o projection: 128-column tiles from 128 rows, 256-column ones from
        // WIDE_MIN_TILES of them, both warp-specialized (x's and W's tensor maps); the 64-row
        // decode tiles and split-K are not
        let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %w = weight : bf16[4096, 4096]\n  %r = input : f32[T, 4096]\n  %y = matmul_add(%x, %w, %r) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let steps = lower_opts(&g, ScheduleOptions::default()).unwrap();
        let y = steps.iter().find(|s| s.node == "y").unwrap();
        let ws: Vec<&Large> = y.hopper.iter().filter(|l| matches!(l.kernel, KernelSpec::Ws { .. }) && matches!(l.kernel.matmul_core().0, KernelSpec::MatMulPipe { bm: 128, .. })).collect();
        let [wide, narrow] = ws[..] else { panic!("{:?}", y.hopper) };
        assert!(matches!(wide.kernel.matmul_core().0, KernelSpec::MatMulPipe { bn: 256, bm: 128, residual: true, .. }), "{:?}", wide.kernel);
        assert!(matches!(narrow.kernel.matmul_core().0, KernelSpec::MatMulPipe { bn: 128, bm: 128, .. }), "{:?}", narrow.kernel);
        assert_eq!(wide.min_rows, (WIDE_MIN_TILES.div_ceil(16) * 128) as i64);
        assert!(narrow.min_rows < wide.min_rows && wide.max_rows.is_none());
        assert_eq!(wide.args.as_deref().unwrap()[..2], ["x@bf16@xmap128", "w@tmap256"]);
        assert_eq!(narrow.args.as_deref().unwrap()[..2], ["x@bf16@xmap128", "w@tmap128"]);
        assert!(y.hopper.iter().all(|l| matches!(l.kernel, KernelSpec::Ws { .. }) || l.kernel.matmul_core().0 != wide.kernel.matmul_core().0));
        // the 64-row tiles keep cp.async loads below WS64_MIN_ROWS rows, and are
        // warp-specialized from there (x's map in 64-row boxes), split-K ones too
        let m64: Vec<&Large> = y.hopper.iter().filter(|l| matches!(l.kernel.matmul_core().0, KernelSpec::MatMulPipe { bm: 64, .. })).collect();
        assert!(m64.iter().any(|l| !matches!(l.kernel, KernelSpec::Ws { .. })));
        for l in &m64 {
            let is_ws = matches!(l.kernel, KernelSpec::Ws { .. });
            assert_eq!(is_ws, l.min_rows >= WS64_MIN_ROWS, "{l:?}");
            assert!(is_ws || l.max_rows.is_some_and(|m| m < WS64_MIN_ROWS), "{l:?}");
            if is_ws {
                assert_eq!(l.args.as_deref().unwrap()[..2], ["x@bf16@xmap64", "w@tmap128"]);
            }
        }
        assert!(m64.iter().any(|l| matches!(&l.kernel, KernelSpec::Ws { inner } if matches!(inner.as_ref(), KernelSpec::SplitK { .. }))));
        // and none without it
        let off = lower_opts(&g, no_ws()).unwrap();
        assert!(off.iter().flat_map(|s| s.alternatives()).all(|l| !matches!(l.kernel, KernelSpec::Ws { .. })));
    }

    #[test]
    fn the_prefill_attention_on_bf16_pools_has_a_wgmma_alternative_for_d_128() {
        let src = |d: usize| {
            format!("graph \"t\" {{\n  %q = input : f32[T, 8, {d}]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : bf16[NB, 16, 2, {d}]\n  %vc = state : bf16[NB, 16, 2, {d}]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {{scale = 0.125}} : f32[T, 8, {d}]\n  output o = %o\n}}\n")
        };
        let attn = |d: usize, opts: ScheduleOptions| {
            let steps = lower_opts(&text::parse(&src(d)).unwrap(), opts).unwrap();
            steps.into_iter().find(|s| s.node == "o" && s.large.is_some()).unwrap()
        };
        let s = attn(128, ScheduleOptions::default());
        let large = s.large.as_ref().unwrap();
        let [wg] = &s.hopper[..] else { panic!("{:?}", s.hopper) };
        assert!(matches!(&wg.kernel, KernelSpec::FlashWgmma { inner } if **inner == large.kernel), "{:?}", wg.kernel);
        assert_eq!((wg.min_rows, wg.max_rows, &wg.scalars, &wg.grid_y), (large.min_rows, large.max_rows, &large.scalars, &large.grid_y));
        // (its K/V tiles by TMA: the pools passed as their tensor maps, boxes of a 16-position
        // cache block; the other args as the step's)
        let args = wg.args.as_ref().expect("the TMA kernel's args");
        assert_eq!(args[1..3], ["kc@kvmap16", "vc@kvmap16"]);
        assert_eq!((&args[..1], &args[3..]), (&s.args[..1], &s.args[3..]));
        assert!(wg.kernel.symbol().ends_with("_wgt"), "{}", wg.kernel.symbol());
        // not for D 64 (failed the kernel check), nor when off
        assert!(attn(64, ScheduleOptions::default()).hopper.is_empty());
        assert!(attn(128, ScheduleOptions { flash_wgmma: false, ..ScheduleOptions::default() }).hopper.is_empty());
    }

    #[test]
    fn matmul_act_puts_the_activation_in_every_kernel_of_the_step() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %w = weight : bf16[128, 64]\n  %b = weight : f32[128]\n  %y = matmul_act(%x, %w, %b) {transpose_b = true, act = gelu} : f32[T, 128]\n  output y = %y\n}\n";
        let steps = lower_opts(&text::parse(src).unwrap(), ScheduleOptions { norm_fusion: false, ..Default::default() }).unwrap();
        let s = steps.iter().find(|s| s.node == "y").unwrap();
        let act = |k: &KernelSpec| matches!(k, KernelSpec::MatMulAct { act: UnaryOpKey(dsc_ir::UnaryOp::Gelu), .. });
        assert!(act(s.kernel.as_ref().unwrap()), "{:?}", s.kernel);
        for l in s.alternatives() {
            // (the prefill tile loads W by TMA, or is warp-specialized: the wrapper outside)
            let k = match &l.kernel {
                KernelSpec::Tma { inner } | KernelSpec::Ws { inner } => inner.as_ref(),
                k => k,
            };
            assert!(act(k), "{:?}", l.kernel);
        }
        // the prefill kernel under the wrapper still gets its bf16 copy of x (as the tensor
        // map of it, warp-specialized)
        assert_eq!(s.hopper.last().unwrap().args.as_ref().unwrap()[0], "x@bf16@xmap128");
        assert!(steps.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))));
    }

    #[test]
    fn swiglu_runs_in_the_merged_gate_up_gemv_for_one_row() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %wg = weight : bf16[128, 64]\n  %wu = weight : bf16[128, 64]\n  %gu = matmul_cat(%x, %wg, %wu) : f32[T, 256]\n  %g = slice(%gu) {axis = 1, start = 0, len = 128} : f32[T, 128]\n  %u = slice(%gu) {axis = 1, start = 128, len = 128} : f32[T, 128]\n  %h = silu_mul(%g, %u) : f32[T, 128]\n  output h = %h\n}\n";
        let steps = lower_opts(&text::parse(src).unwrap(), ScheduleOptions { few_x16: false, tma: Tma::Off, ..no_ws() }).unwrap();
        let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
        let cat = by("gu");
        assert_eq!(cat.kernel, Some(KernelSpec::SwiGluGemv { k: 64, f: 128, wdtype: DType::BF16 }));
        assert_eq!(cat.args, ["x", "wg", "wu", "h"]);
        // the alternatives keep computing the cat (the prefill one from the bf16 copy of x),
        // and silu_mul runs after them
        for l in cat.few.iter().chain(&cat.large).chain(&cat.hopper_small) {
            assert_eq!(l.args.as_deref(), Some(&["x".to_string(), "wg".to_string(), "wu".to_string(), "gu".to_string()][..]));
        }
        let h = cat.hopper.last().unwrap();
        assert_eq!(h.args.as_deref(), Some(&["x@bf16".to_string(), "wg".to_string(), "wu".to_string(), "gu".to_string()][..]));
        assert_eq!(by("h").min_rows, Some(2));
        // the up part first: the gate weight is still the one silu reads
        let swapped = src.replace("silu_mul(%g, %u)", "silu_mul(%u, %g)");
        let steps = lower_opts(&text::parse(&swapped).unwrap(), ScheduleOptions { norm_fusion: false, ..Default::default() }).unwrap();
        assert_eq!(steps.iter().find(|s| s.node == "gu").unwrap().args, ["x", "wu", "wg", "h"]);
    }

    #[test]
    fn one_token_mlp_runs_as_one_kernel_seeded_by_the_o_projection() {
        let src = "graph \"t\" {\n  %a = input : f32[T, 64]\n  %x0 = input : f32[T, 64]\n  %wo = weight : bf16[64, 64]\n  %x3 = matmul_add(%a, %wo, %x0) {transpose_b = true} : f32[T, 64]\n  %g = weight : f32[64]\n  %xn = rms_norm(%x3, %g) {eps = 0.00001} : f32[T, 64]\n  %wg = weight : bf16[128, 64]\n  %wu = weight : bf16[128, 64]\n  %gu = matmul_cat(%xn, %wg, %wu) : f32[T, 256]\n  %ga = slice(%gu) {axis = 1, start = 0, len = 128} : f32[T, 128]\n  %up = slice(%gu) {axis = 1, start = 128, len = 128} : f32[T, 128]\n  %h = silu_mul(%ga, %up) : f32[T, 128]\n  %wd = weight : bf16[64, 128]\n  %y = matmul_add(%h, %wd, %x3) {transpose_b = true} : f32[T, 64]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let opts = ScheduleOptions { norm_fusion: true, swiglu_down: true, ..ScheduleOptions::default() };
        let steps = lower_opts(&g, opts).unwrap();
        let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
        let (fb, fpw) = (ScheduleOptions::default().swiglu_down_fb, ScheduleOptions::default().swiglu_down_fpw);
        assert_eq!(by("y").kernel, Some(KernelSpec::SwiGluDown { k: 64, f: 128, n: 64, eps_bits: 0.00001f32.to_bits(), fb, fpw }));
        assert_eq!(by("y").args, ["x3", "g", "wg", "wu", "wd", "y"]);
        assert!(matches!(by("x3").kernel, Some(KernelSpec::MatMulCopy { .. })), "{:?}", by("x3").kernel);
        assert_eq!(by("x3").args, ["a", "wo", "x0", "y", "x3"]);
        assert_eq!(by("gu").min_rows, Some(2));
        // every alternative (two rows and more) keeps its kernel's own args
        // (h or its 16-bit copy, `h@bf16`)
        for (node, x) in [("y", "h"), ("x3", "a")] {
            for l in by(node).alternatives() {
                let a = l.args.as_deref().unwrap();
                assert!(a[0].starts_with(x), "{node}: {a:?}");
            }
        }
        // off, or with another reader of h: the three kernels stay
        let off = lower_opts(&g, ScheduleOptions { swiglu_down: false, ..opts }).unwrap();
        assert!(off.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::SwiGluDown { .. } | KernelSpec::MatMulCopy { .. }))));
        let extra = src.replace("  output y = %y\n", "  output y = %y\n  output h = %h\n");
        let steps = lower_opts(&text::parse(&extra).unwrap(), opts).unwrap();
        assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::SwiGluDown { .. } | KernelSpec::MatMulCopy { .. }))));
    }

    #[test]
    fn one_token_layer_adds_the_o_projection_from_the_attention_into_both_accumulators() {
        let src = "graph \"t\" {\n  %x = input : f32[T, 32]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %g1 = weight : f32[32]\n  %xn = rms_norm(%x, %g1) {eps = 0.00001} : f32[T, 32]\n  %wq = weight : bf16[32, 32]\n  %wk = weight : bf16[16, 32]\n  %wv = weight : bf16[16, 32]\n  %wo = weight : bf16[32, 32]\n  %kc = state : bf16[4, 4, 2, 8]\n  %vc = state : bf16[4, 4, 2, 8]\n  %qkv = matmul_cat(%xn, %wq, %wk, %wv) : f32[T, 64]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %k = slice(%qkv) {axis = 1, start = 32, len = 16} : f32[T, 16]\n  %v = slice(%qkv) {axis = 1, start = 48, len = 16} : f32[T, 16]\n  %qh = reshape(%q) : f32[T, 4, 8]\n  %kh = reshape(%k) : f32[T, 2, 8]\n  %vh = reshape(%v) : f32[T, 2, 8]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[T, 4, 8]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : bf16[4, 4, 2, 8]\n  %vw = cache_write(%vc, %vh, %slots) : bf16[4, 4, 2, 8]\n  %o = paged_attention(%qr, %kw, %vw, %pos, %seq, %table) {scale = 0.35} : f32[T, 4, 8]\n  %of = reshape(%o) : f32[T, 32]\n  %x3 = matmul_add(%of, %wo, %x) {transpose_b = true} : f32[T, 32]\n  %g2 = weight : f32[32]\n  %xn2 = rms_norm(%x3, %g2) {eps = 0.00001} : f32[T, 32]\n  %wg = weight : bf16[32, 32]\n  %wu = weight : bf16[32, 32]\n  %gu = matmul_cat(%xn2, %wg, %wu) : f32[T, 64]\n  %ga = slice(%gu) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %up = slice(%gu) {axis = 1, start = 32, len = 32} : f32[T, 32]\n  %h = silu_mul(%ga, %up) : f32[T, 32]\n  %wd = weight : bf16[32, 32]\n  %y = matmul_add(%h, %wd, %x3) {transpose_b = true} : f32[T, 32]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let opts = ScheduleOptions { norm_fusion: true, swiglu_down: true, attn_o_red: true, ..no_ws() };
        let steps = lower_opts(&g, opts).unwrap();
        let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
        let att = by("o");
        assert!(matches!(&att.kernel, Some(KernelSpec::AttentionO { n: 32, red: true, .. })), "{:?}", att.kernel);
        assert_eq!(att.args[9..], ["wo", "x", "y", "x3"]);
        let qkv = by("qkv");
        assert!(matches!(&qkv.kernel, Some(KernelSpec::ZeroFill { len: 32, .. })), "{:?}", qkv.kernel);
        assert_eq!(qkv.args[..3], ["x3", "y", "x"]);
        assert!(qkv.alternatives().all(|l| l.args.as_deref().is_some_and(|a| !a.contains(&"y".to_string()))));
        assert!(matches!(by("y").kernel, Some(KernelSpec::SwiGluDown { .. })));
        // the o GEMV: two rows and more, and one row past the fused attention's contexts
        let os: Vec<&Step> = steps.iter().filter(|s| s.node == "x3").collect();
        assert_eq!(os[0].min_rows, Some(2));
        if let Some(mc) = att.max_context {
            assert_eq!((os[1].max_rows, os[1].min_context), (Some(1), Some(mc + 1)));
            assert!(matches!(os[1].kernel, Some(KernelSpec::MatMulCopy { .. })));
        }
        // off: the o GEMV keeps one row, seeding the MLP
        let off = lower_opts(&g, ScheduleOptions { attn_o_red: false, ..opts }).unwrap();
        assert!(off.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::AttentionO { .. } | KernelSpec::ZeroFill { .. }))));
        assert!(matches!(off.iter().find(|s| s.node == "x3").unwrap().kernel, Some(KernelSpec::MatMulCopy { .. })));
    }

    #[test]
    fn second_layer_computes_its_qkv_in_the_attention_in_clusters() {
        // two layers like the one above (2 heads of 32, a KV head, hidden 64): the second's
        // q/k/v GEMV folds into its attention
        let layer = |p: &str, x: &str| -> String {
            format!(
                "  %{p}g1 = weight : f32[64]\n  %{p}xn = rms_norm(%{x}, %{p}g1) {{eps = 0.00001}} : f32[T, 64]\n  %{p}wq = weight : bf16[64, 64]\n  %{p}wk = weight : bf16[32, 64]\n  %{p}wv = weight : bf16[32, 64]\n  %{p}wo = weight : bf16[64, 64]\n  %{p}kc = state : bf16[4, 4, 1, 32]\n  %{p}vc = state : bf16[4, 4, 1, 32]\n  %{p}qkv = matmul_cat(%{p}xn, %{p}wk, %{p}wq, %{p}wv) : f32[T, 128]\n  %{p}k = slice(%{p}qkv) {{axis = 1, start = 0, len = 32}} : f32[T, 32]\n  %{p}q = slice(%{p}qkv) {{axis = 1, start = 32, len = 64}} : f32[T, 64]\n  %{p}v = slice(%{p}qkv) {{axis = 1, start = 96, len = 32}} : f32[T, 32]\n  %{p}qh = reshape(%{p}q) : f32[T, 2, 32]\n  %{p}kh = reshape(%{p}k) : f32[T, 1, 32]\n  %{p}vh = reshape(%{p}v) : f32[T, 1, 32]\n  %{p}qr = rope(%{p}qh, %pos) {{theta = 10000.0, style = half, rotary_dim = 32}} : f32[T, 2, 32]\n  %{p}kw = rope_cache_write(%{p}kc, %{p}kh, %slots, %pos) {{theta = 10000.0, style = half, rotary_dim = 32}} : bf16[4, 4, 1, 32]\n  %{p}vw = cache_write(%{p}vc, %{p}vh, %slots) : bf16[4, 4, 1, 32]\n  %{p}o = paged_attention(%{p}qr, %{p}kw, %{p}vw, %pos, %seq, %table) {{scale = 0.17}} : f32[T, 2, 32]\n  %{p}of = reshape(%{p}o) : f32[T, 64]\n  %{p}x3 = matmul_add(%{p}of, %{p}wo, %{x}) {{transpose_b = true}} : f32[T, 64]\n  %{p}g2 = weight : f32[64]\n  %{p}xn2 = rms_norm(%{p}x3, %{p}g2) {{eps = 0.00001}} : f32[T, 64]\n  %{p}wg = weight : bf16[64, 64]\n  %{p}wu = weight : bf16[64, 64]\n  %{p}gu = matmul_cat(%{p}xn2, %{p}wg, %{p}wu) : f32[T, 128]\n  %{p}ga = slice(%{p}gu) {{axis = 1, start = 0, len = 64}} : f32[T, 64]\n  %{p}up = slice(%{p}gu) {{axis = 1, start = 64, len = 64}} : f32[T, 64]\n  %{p}h = silu_mul(%{p}ga, %{p}up) : f32[T, 64]\n  %{p}wd = weight : bf16[64, 64]\n  %{p}y = matmul_add(%{p}h, %{p}wd, %{p}x3) {{transpose_b = true}} : f32[T, 64]\n"
            )
        };
        let src = format!(
            "graph \"t\" {{\n  %x = input : f32[T, 64]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n{}{}  output y = %by\n}}\n",
            layer("a", "x"),
            layer("b", "ay")
        );
        let g = text::parse(&src).unwrap();
        let opts = ScheduleOptions { norm_fusion: true, swiglu_down: true, attn_o_red: true, qkv_attn: true, ..no_ws() };
        let steps = lower_opts(&g, opts).unwrap();
        let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
        // the first layer as before (its GEMV follows no fused MLP)
        assert!(matches!(by("ao").kernel, Some(KernelSpec::AttentionO { .. })), "{:?}", by("ao").kernel);
        assert!(matches!(by("aqkv").kernel, Some(KernelSpec::ZeroFill { .. })));
        // the second: its attention reads x, g and W_q, W_k, W_v (named by their parts), in
        // clusters of its blocks per head; the first layer's MLP zeroes its accumulators
        let att = by("bo");
        assert!(matches!(&att.kernel, Some(KernelSpec::QkvAttentionO { k: 64, cluster: ATTN_O_SPLITS, .. })), "{:?}", att.kernel);
        assert_eq!(att.kernel.as_ref().unwrap().cluster(), Some(ATTN_O_SPLITS as u32));
        assert_eq!(att.args[..5], ["ay", "bg1", "bwq", "bwk", "bwv"]);
        assert_eq!(att.args[att.args.len() - 4..], ["bwo", "ay", "by", "bx3"]);
        assert!(att.alternatives().all(|l| l.args.as_deref().is_some_and(|a| a[0] == "bqh")));
        let mlp = by("ay");
        assert!(matches!(&mlp.kernel, Some(KernelSpec::ZeroFill { inner, len: 64 }) if matches!(inner.as_ref(), KernelSpec::SwiGluDown { .. })), "{:?}", mlp.kernel);
        assert_eq!(mlp.args[..3], ["bx3", "by", "ax3"]);
        // the GEMV: from two rows, and at one row only past the fused attention's contexts
        let qkvs: Vec<&Step> = steps.iter().filter(|s| s.node == "bqkv").collect();
        assert_eq!(qkvs[0].min_rows, Some(2));
        match att.max_context {
            Some(mc) => {
                assert_eq!((qkvs[1].max_rows, qkvs[1].min_context), (Some(1), Some(mc + 1)));
                assert!(matches!(qkvs[1].kernel, Some(KernelSpec::NormMatMul { .. })), "{:?}", qkvs[1].kernel);
                assert_eq!(qkvs[1].args[0], "ay");
            }
            None => assert_eq!(qkvs.len(), 1),
        }
        // off: every layer's GEMV zeroes
        let off = lower_opts(&g, ScheduleOptions { qkv_attn: false, ..opts }).unwrap();
        assert!(off.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::QkvAttentionO { .. }))));
        assert!(matches!(off.iter().find(|s| s.node == "bqkv").unwrap().kernel, Some(KernelSpec::ZeroFill { .. })));
    }

    #[test]
    fn rms_norm_stays_when_something_else_reads_it_or_the_gemv_cannot_take_it() {
        for (extra, dt) in [(true, "bf16"), (false, "q8_0")] {
            let steps = lower_opts(&graph(extra, dt), ScheduleOptions { norm_fusion: true, ..Default::default() }).unwrap();
            let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
            assert_eq!(by("xn").min_rows, None, "{dt}");
            assert!(!matches!(by("qk").kernel, Some(KernelSpec::NormMatMul { .. })));
            assert_eq!(by("qk").args[0], "xn");
        }
    }

    #[test]
    fn the_logit_row_gather_folds_into_the_final_norm() {
        // (the model's tail: the rows that need logits gathered, normalized, then the head —
        // a vocabulary past the GEMV's norm prologue: 25.6 MB of head, as a real lm_head)
        let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %rows = input : i32[R]\n  %h = gather(%x, %rows) : f32[R, 64]\n  %g = weight : f32[64]\n  %n = rms_norm(%h, %g) {eps = 0.00001} : f32[R, 64]\n  %w = weight : bf16[200000, 64]\n  %y = matmul(%n, %w) {transpose_b = true} : f32[R, 200000]\n  output y = %y\n}\n";
        let g = text::parse(src).unwrap();
        let steps = lower(&g, &ScheduleOptions::default()).unwrap();
        assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::Gather { .. }))), "the gather stayed");
        let n = steps.iter().find(|s| s.node == "n").unwrap();
        assert!(matches!(&n.kernel, Some(KernelSpec::RowGather { .. })), "{:?}", n.kernel);
        assert_eq!(n.args[..3], ["rows", "x", "g"]);
        assert!(steps.iter().all(|s| !s.args.contains(&"h".to_string())));
        // (a gather something else reads too stays)
        let src2 = src.replace("  output y = %y", "  output y = %y\n  output h = %h");
        let steps = lower(&text::parse(&src2).unwrap(), &ScheduleOptions::default()).unwrap();
        assert!(steps.iter().any(|s| matches!(s.kernel, Some(KernelSpec::Gather { .. }))));
    }

    #[test]
    fn the_final_norm_folds_into_the_wide_lm_head() {
        // (a small model's tail: 200,000 short bf16 rows — the wide GEMV, the gathered norm
        // folded into it at one row, the norm's own kernel from two rows)
        let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %rows = input : i32[R]\n  %h = gather(%x, %rows) : f32[R, 64]\n  %g = weight : f32[64]\n  %n = rms_norm(%h, %g) {eps = 0.00001} : f32[R, 64]\n  %w = weight : bf16[200000, 64]\n  %y = matmul(%n, %w) {transpose_b = true} : f32[R, 200000]\n  output y = %y\n}\n";
        let steps = lower(&text::parse(src).unwrap(), &ScheduleOptions::default()).unwrap();
        let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
        let y = by("y");
        let Some(KernelSpec::RowGather { inner }) = &y.kernel else { panic!("{:?}", y.kernel) };
        let KernelSpec::NormMatMul { inner: wide, .. } = inner.as_ref() else { panic!("{inner:?}") };
        assert!(matches!(wide.as_ref(), KernelSpec::MatMulWide { k: 64, n: 200000, .. }), "{wide:?}");
        assert_eq!(y.args, ["rows", "x", "g", "w", "y"]);
        assert_eq!(by("n").min_rows, Some(2));
        // (the alternatives read the norm's output, or its 16-bit copy)
        assert!(y.alternatives().next().is_some() && y.alternatives().all(|l| l.args.as_deref().is_some_and(|a| a.first().is_some_and(|x| x == "n" || x.starts_with("n@")))));
        // (the norm read elsewhere too: it stays, the GEMV plain wide)
        let src2 = src.replace("  output y = %y", "  output y = %y\n  output n = %n");
        let steps = lower(&text::parse(&src2).unwrap(), &ScheduleOptions::default()).unwrap();
        let y = steps.iter().find(|s| s.node == "y").unwrap();
        assert!(matches!(y.kernel, Some(KernelSpec::MatMulWide { .. })), "{:?}", y.kernel);
        assert!(steps.iter().find(|s| s.node == "n").unwrap().min_rows.is_none());
        // (rows too long for a lane's registers, K = 1024: the split-K GEMV)
        let src3 = src.replace("64]", "1024]");
        let steps = lower(&text::parse(&src3).unwrap(), &ScheduleOptions::default()).unwrap();
        let y = steps.iter().find(|s| s.node == "y").unwrap();
        assert!(matches!(y.kernel, Some(KernelSpec::MatMul { .. })), "{:?}", y.kernel);
    }

    #[test]
    fn the_embedding_gather_can_fold_into_the_first_gemv() {
        // (the gather of a bf16 table, then the one-row GEMV with the norm prologue reading x;
        // x is also needed after it, as the residual in a model — here a graph output)
        let src = "graph \"t\" {\n  %tok = input : i32[T]\n  %table = weight : bf16[100, 64]\n  %x = gather(%table, %tok) : f32[T, 64]\n  %g = weight : f32[64]\n  %xn = rms_norm(%x, %g) {eps = 0.00001} : f32[T, 64]\n  %w = weight : bf16[64, 64]\n  %y = matmul(%xn, %w) {transpose_b = true} : f32[T, 64]\n  output y = %y\n  output x = %x\n}\n";
        let g = text::parse(src).unwrap();
        let steps = lower(&g, &ScheduleOptions::default()).unwrap();
        // (folding twice changes nothing: the gather is bounded now)
        let steps = fold_embedding_gather(steps);
        let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
        let y = by("y");
        assert!(matches!(&y.kernel, Some(KernelSpec::GatherX { .. })), "{:?}", y.kernel);
        assert_eq!(y.args[..4], ["table", "tok", "x", "g"]);
        // (more rows: the gather runs, the alternatives read x)
        assert_eq!(by("x").min_rows, Some(2));
        assert!(y.alternatives().next().is_some());
        assert!(y.alternatives().all(|l| l.args.as_deref().is_some_and(|a| !a.contains(&"table".to_string()))));
    }
}
