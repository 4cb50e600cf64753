//! The op table. Every op has: a text name, typed attributes, a shape/dtype rule
//! ([`infer`]), and a CPU reference implementation in `exec.rs`.
//!
//! The set is small and orthogonal: the Llama family needs gather, matmul, elementwise,
//! rms_norm, rope, cache_write and paged_attention; quantize/dequantize/cast cover the
//! precision modes. The DeepSeek family adds YaRN rope (`rope_yarn`), Multi-head Latent
//! Attention over a latent cache (`head_matmul` for the absorbed up-projections,
//! `mla_attention`) and DeepSeekMoE (`moe_route`, `moe_experts`).

use crate::{DType, Dim, TensorType};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Neg,
    Exp,
    Sqrt,
    Rsqrt,
    Recip,
    Tanh,
    Sigmoid,
    Relu,
    /// x * sigmoid(x)
    Silu,
    /// GELU, tanh approximation (GPT-2)
    Gelu,
    /// GELU with the exact erf (BERT)
    GeluErf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
    /// silu(a) * b: SwiGLU's gate (a fusion of silu and mul)
    SiluMul,
}

/// YaRN's frequency interpolation (Peng et al., 2023), as HF transformers'
/// `_compute_yarn_parameters` computes it: per frequency a blend of the original and the
/// `factor`-interpolated one, ramped between the dims that rotate `beta_fast` and `beta_slow`
/// times over `original_max_position`; cos and sin scaled by `attention_factor`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    pub factor: f32,
    pub original_max_position: usize,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub attention_factor: f32,
}

impl Yarn {
    /// The pair indices (low, high) between which YaRN's frequencies ramp from extrapolated to
    /// interpolated: HF's correction range, truncated to whole dims, in f64 as its Python
    /// floats (the GPU's RoPE kernel takes them as constants).
    pub fn ramp(&self, theta: f32, rotary_dim: usize) -> (f32, f32) {
        let dim = rotary_dim as f32;
        let corr = |rot: f32| rotary_dim as f64 * (self.original_max_position as f64 / (rot as f64 * 2.0 * std::f64::consts::PI)).ln() / (2.0 * (theta as f64).ln());
        let low = corr(self.beta_fast).floor().max(0.0) as f32;
        let high = corr(self.beta_slow).ceil().min(dim as f64 - 1.0) as f32;
        (low, if low == high { high + 0.001 } else { high })
    }
    /// The inverse frequencies of a `rotary_dim`-wide head with base `theta`, in f32 as
    /// HF computes them (its correction range truncated to whole dims).
    pub fn inv_freq(&self, theta: f32, rotary_dim: usize) -> Vec<f32> {
        let dim = rotary_dim as f32;
        let (low, high) = self.ramp(theta, rotary_dim);
        (0..rotary_dim / 2)
            .map(|i| {
                let pos_freq = theta.powf((2 * i) as f32 / dim);
                let (extra, inter) = (1.0 / pos_freq, 1.0 / (self.factor * pos_freq));
                let ramp = ((i as f32 - low) / (high - low)).clamp(0.0, 1.0);
                let extra_w = 1.0 - ramp;
                inter * (1.0 - extra_w) + extra * extra_w
            })
            .collect()
    }
}

/// YaRN's attention-temperature term `0.1 * m * ln(factor) + 1` (1 for factor <= 1): DeepSeek
/// multiplies its softmax scale by the square of it with `m = mscale_all_dim`.
pub fn yarn_mscale(factor: f32, m: f32) -> f32 {
    if factor <= 1.0 {
        1.0
    } else {
        0.1 * m * factor.ln() + 1.0
    }
}

/// How a MoE router turns its logits into scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoeScoring {
    Softmax,
    Sigmoid,
}

/// How a MoE router picks its experts (DeepSeek's `topk_method`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MoeSelect {
    /// the top-k scores (`greedy`)
    Greedy,
    /// DeepSeek-V2's `group_limited_greedy`: the `topk_group` groups with the largest
    /// maximum score, then the top-k scores inside them (the rest count as 0)
    GroupMax,
    /// DeepSeek-V3's `noaux_tc`: choice on scores + the correction bias (the router's second
    /// operand); groups ranked by the sum of their two best biased scores; the weights are
    /// the unbiased scores of the chosen experts
    NoauxTc,
}

/// A MoE router's typed configuration (`moe_route`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRouting {
    pub top_k: usize,
    pub n_group: usize,
    pub topk_group: usize,
    pub scoring: MoeScoring,
    pub select: MoeSelect,
    /// divide the chosen weights by their sum (+1e-20)
    pub normalize: bool,
    /// then multiply them by this (`routed_scaling_factor`)
    pub scaling: f32,
}

/// How RoPE pairs the elements of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeStyle {
    /// (x[2i], x[2i+1]): GGUF llama Q/K weights, GPT-J, DeepSeek's MLA rope part.
    Interleaved,
    /// (x[i], x[i + d/2]): HF `rotate_half` (Llama/Qwen checkpoints), GPT-NeoX.
    Half,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A step input (token ids, positions, block tables...). Its name is the node's name.
    Input,
    /// A model parameter; its name is the checkpoint's tensor name.
    Weight,
    /// Persistent device state that outlives a step (the KV cache pools).
    State,
    /// Rows of a table: (table[V, ...], idx[...]) -> [..., table.shape[1..]], in the node's
    /// float dtype (a packed table is dequantized).
    Gather,
    /// (a[..., M, K], b[K, N] | b[N, K] when transpose_b, bias?[N]) -> [..., M, N].
    /// `b` may be stored in any dtype (packed types make a weight-only-quantized matmul).
    MatMul {
        transpose_b: bool,
    },
    Unary(UnaryOp),
    /// numpy-style broadcast over trailing dims
    Binary(BinaryOp),
    /// (x[..., D], w[D]) -> x / sqrt(mean(x^2) + eps) * w
    RmsNorm {
        eps: f32,
    },
    /// (x[..., D], w[D], b[D])
    LayerNorm {
        eps: f32,
    },
    /// (x[T, H, D], pos[T]) -> rotated; the first `rotary_dim` elements of each head rotate.
    Rope {
        theta: f32,
        style: RopeStyle,
        rotary_dim: usize,
    },
    /// along the last axis
    Softmax,
    /// `rope` with YaRN's interpolated frequencies and cos/sin scaled by its attention factor
    /// (DeepSeek-V2/V3's long-context rope).
    RopeYarn {
        theta: f32,
        style: RopeStyle,
        rotary_dim: usize,
        yarn: Yarn,
    },
    /// (a[T, H, K], b[H, K, N] | b[H, N, K] when transpose_b) -> [T, H, N]: one matrix per
    /// head (MLA's up-projections absorbed into the query and the output).
    HeadMatMul {
        transpose_b: bool,
    },
    /// Multi-head Latent Attention over a paged latent cache: (q[T, H, C], cache[NB, BS, 1, C],
    /// pos[T], seq[T], block_table[S, MB]) -> [T, H, kv_lora_rank]. Each cache row is one
    /// token's latent `[c_kv (kv_lora_rank) | k_rope]`; the keys are the whole rows and the
    /// values their first `kv_lora_rank` elements, shared by every head (MQA over the
    /// latent, as FlashMLA computes it). Causal and paged as `paged_attention`.
    MlaAttention {
        scale: f32,
        kv_lora_rank: usize,
    },
    /// (logits[T, E], mask[E], bias?[E]) -> f32 [T, E]: each token's routing weights, zero
    /// for the experts not chosen (DeepSeekMoE's gate; see [`MoeRouting`]). Experts whose mask
    /// is 0 are disabled (expert failover): no choice falls on them (their slot goes to the
    /// next best), the groups keep their rank, a softmax gate renormalizes over the enabled
    /// experts; a token with every expert disabled routes nowhere (`exec::route_token`).
    MoeRoute(MoeRouting),
    /// (x[T, D], route[T, E], gate[E, I, D], up[E, I, D], down[E, D, I], residual?[T, D]) ->
    /// [T, D]: sum over the experts e with route[t, e] != 0 of route[t, e] * down_e(silu(gate_e
    /// x) * up_e x), in expert order, then + residual. Weights stacked per expert, in the
    /// checkpoint's [out, in] layout.
    MoeExperts,
    /// (cache[NB, BS, KVH, D], x[T, KVH, D], slot[T]) -> cache with row slot[t] = x[t]
    /// (slot = block * BS + offset), stored in the cache's type (a bf16 pool rounds x to
    /// nearest even: the cast is part of the write). Updates the state in place.
    CacheWrite,
    /// (cache[NB, BS, KVH, D], x[T, KVH, D], slot[T], pos[T]) -> cache with row slot[t] =
    /// rope(x, pos)[t]: `cache_write(cache, rope(x, pos), slot)` in one kernel (the optimizer's
    /// rope-cache-write fusion). Updates the state in place.
    RopeCacheWrite {
        theta: f32,
        style: RopeStyle,
        rotary_dim: usize,
    },
    /// (q[T, H, D], k_cache[NB, BS, KVH, D], v_cache, pos[T], seq[T], block_table[S, MB]) ->
    /// [T, H, D]: token t attends causally to cache positions 0..=pos[t] of sequence seq[t],
    /// whose position j lives in block block_table[seq[t], j / BS], row j % BS. GQA: head h
    /// reads KV head h / (H / KVH).
    PagedAttention {
        scale: f32,
    },
    /// indices (i32) of the k largest values along the last axis, largest first
    TopK {
        k: usize,
    },
    /// (x[..., N], idx[..., K]) -> x gathered along the last axis
    TakeAlong,
    Concat {
        axis: usize,
    },
    Slice {
        axis: usize,
        start: usize,
        len: usize,
    },
    /// to the node's declared shape (same element count)
    Reshape,
    Transpose {
        perm: Vec<usize>,
    },
    /// (x, scale?) -> node dtype. Float targets round; int targets compute round(x / scale)
    /// with saturation; block formats carry their own scales and take none.
    Quantize,
    /// (x, scale?) -> node's float dtype: x * scale (block formats: their own scales)
    Dequantize,
    /// to the node's declared dtype
    Cast,
    /// index (i32) of the largest value along the last axis
    Argmax,
    /// (x, W, bias?, r) -> matmul(x, W, bias?) + r: a matmul with the residual add as its
    /// epilogue (a fusion; r has the result's type)
    MatMulAdd {
        transpose_b: bool,
    },
    /// (x, W, bias?) -> act(matmul(x, W, bias?)): a matmul with its bias and activation as
    /// the epilogue (a fusion; the MLP of GPT-2/BERT-style blocks: gelu(x W1 + b1))
    MatMulAct {
        transpose_b: bool,
        act: UnaryOp,
    },
    /// (x, W_0, .., W_{p-1}) -> concat(x @ W_0^T, .., x @ W_{p-1}^T) along the last axis
    /// (weights in [N_i, K] layout): matmuls of one input merged into one kernel (the
    /// optimizer's Q/K/V and gate/up merges; its users read the parts with `slice`)
    MatMulCat,
    /// Sum of this tensor over every rank of the tensor-parallel group (identity at world
    /// size 1). Inserted by the partitioner after row-parallel matmuls.
    AllReduce,
    /// (x[..., D]) -> x as an 8-bit-activation matmul multiplies it (W8A8, W4A8): each row's
    /// groups of `group` values (0: the whole row, per token; the last group may be shorter)
    /// scaled by s = max|x| / qmax and rounded to `dtype` — f8e4m3 (qmax 448, nearest even,
    /// saturating) or i8 (qmax 127) — the result s · q in x's type (`quant::act_quant_rows`).
    /// Inserted before the matmuls whose weights the precision policy quantizes when
    /// `precision.act_quant` asks for it.
    ActQuant {
        dtype: DType,
        group: usize,
    },
}

/// An attribute value as it appears in the text format.
#[derive(Clone, Debug, PartialEq)]
pub enum Attr {
    Int(i64),
    Float(f32),
    Bool(bool),
    Ident(String),
    Ints(Vec<i64>),
}

impl Op {
    pub fn name(&self) -> &'static str {
        match self {
            Op::Input => "input",
            Op::Weight => "weight",
            Op::State => "state",
            Op::Gather => "gather",
            Op::MatMul { .. } => "matmul",
            Op::Unary(u) => match u {
                UnaryOp::Neg => "neg",
                UnaryOp::Exp => "exp",
                UnaryOp::Sqrt => "sqrt",
                UnaryOp::Rsqrt => "rsqrt",
                UnaryOp::Recip => "recip",
                UnaryOp::Tanh => "tanh",
                UnaryOp::Sigmoid => "sigmoid",
                UnaryOp::Relu => "relu",
                UnaryOp::Silu => "silu",
                UnaryOp::Gelu => "gelu",
                UnaryOp::GeluErf => "gelu_erf",
            },
            Op::Binary(b) => match b {
                BinaryOp::Add => "add",
                BinaryOp::Sub => "sub",
                BinaryOp::Mul => "mul",
                BinaryOp::Div => "div",
                BinaryOp::Max => "max",
                BinaryOp::Min => "min",
                BinaryOp::SiluMul => "silu_mul",
            },
            Op::RmsNorm { .. } => "rms_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Rope { .. } => "rope",
            Op::Softmax => "softmax",
            Op::CacheWrite => "cache_write",
            Op::RopeCacheWrite { .. } => "rope_cache_write",
            Op::PagedAttention { .. } => "paged_attention",
            Op::TopK { .. } => "top_k",
            Op::RopeYarn { .. } => "rope_yarn",
            Op::HeadMatMul { .. } => "head_matmul",
            Op::MlaAttention { .. } => "mla_attention",
            Op::MoeRoute(_) => "moe_route",
            Op::MoeExperts => "moe_experts",
            Op::TakeAlong => "take_along",
            Op::Concat { .. } => "concat",
            Op::Slice { .. } => "slice",
            Op::Reshape => "reshape",
            Op::Transpose { .. } => "transpose",
            Op::Quantize => "quantize",
            Op::Dequantize => "dequantize",
            Op::Cast => "cast",
            Op::Argmax => "argmax",
            Op::AllReduce => "all_reduce",
            Op::ActQuant { .. } => "act_quant",
            Op::MatMulAdd { .. } => "matmul_add",
            Op::MatMulAct { .. } => "matmul_act",
            Op::MatMulCat => "matmul_cat",
        }
    }

    /// Leaves hold no operands and name external data.
    pub fn is_leaf(&self) -> bool {
        matches!(self, Op::Input | Op::Weight | Op::State)
    }

    /// Attributes in a fixed order, for the printer.
    pub fn attrs(&self) -> Vec<(&'static str, Attr)> {
        match self {
            Op::MatMul { transpose_b } | Op::MatMulAdd { transpose_b } | Op::HeadMatMul { transpose_b } => vec![("transpose_b", Attr::Bool(*transpose_b))],
            Op::RopeYarn { theta, style, rotary_dim, yarn } => {
                let mut v = Op::Rope { theta: *theta, style: *style, rotary_dim: *rotary_dim }.attrs();
                v.extend([
                    ("factor", Attr::Float(yarn.factor)),
                    ("original_max_position", Attr::Int(yarn.original_max_position as i64)),
                    ("beta_fast", Attr::Float(yarn.beta_fast)),
                    ("beta_slow", Attr::Float(yarn.beta_slow)),
                    ("attention_factor", Attr::Float(yarn.attention_factor)),
                ]);
                v
            }
            Op::MlaAttention { scale, kv_lora_rank } => vec![("scale", Attr::Float(*scale)), ("kv_lora_rank", Attr::Int(*kv_lora_rank as i64))],
            Op::MoeRoute(r) => vec![
                ("top_k", Attr::Int(r.top_k as i64)),
                ("n_group", Attr::Int(r.n_group as i64)),
                ("topk_group", Attr::Int(r.topk_group as i64)),
                (
                    "scoring",
                    Attr::Ident(
                        match r.scoring {
                            MoeScoring::Softmax => "softmax",
                            MoeScoring::Sigmoid => "sigmoid",
                        }
                        .into(),
                    ),
                ),
                (
                    "select",
                    Attr::Ident(
                        match r.select {
                            MoeSelect::Greedy => "greedy",
                            MoeSelect::GroupMax => "group_max",
                            MoeSelect::NoauxTc => "noaux_tc",
                        }
                        .into(),
                    ),
                ),
                ("normalize", Attr::Bool(r.normalize)),
                ("scaling", Attr::Float(r.scaling)),
            ],
            Op::MatMulAct { transpose_b, act } => vec![("transpose_b", Attr::Bool(*transpose_b)), ("act", Attr::Ident(Op::Unary(*act).name().to_string()))],
            Op::RmsNorm { eps } | Op::LayerNorm { eps } => vec![("eps", Attr::Float(*eps))],
            Op::Rope { theta, style, rotary_dim } | Op::RopeCacheWrite { theta, style, rotary_dim } => vec![
                ("theta", Attr::Float(*theta)),
                (
                    "style",
                    Attr::Ident(match style {
                        RopeStyle::Interleaved => "interleaved".into(),
                        RopeStyle::Half => "half".into(),
                    }),
                ),
                ("rotary_dim", Attr::Int(*rotary_dim as i64)),
            ],
            Op::PagedAttention { scale } => vec![("scale", Attr::Float(*scale))],
            Op::ActQuant { dtype, group } => vec![("dtype", Attr::Ident(dtype.name().into())), ("group", Attr::Int(*group as i64))],
            Op::TopK { k } => vec![("k", Attr::Int(*k as i64))],
            Op::Concat { axis } => vec![("axis", Attr::Int(*axis as i64))],
            Op::Slice { axis, start, len } => vec![("axis", Attr::Int(*axis as i64)), ("start", Attr::Int(*start as i64)), ("len", Attr::Int(*len as i64))],
            Op::Transpose { perm } => {
                vec![("perm", Attr::Ints(perm.iter().map(|&p| p as i64).collect()))]
            }
            _ => vec![],
        }
    }

    /// Rebuild an op from its text name and attributes (the parser's half of the table).
    pub fn from_parts(name: &str, attrs: &[(String, Attr)]) -> Result<Op, String> {
        let get = |k: &str| -> Result<&Attr, String> { attrs.iter().find(|(n, _)| n == k).map(|(_, v)| v).ok_or_else(|| format!("op `{name}` needs attribute `{k}`")) };
        let float = |k: &str| -> Result<f32, String> {
            match get(k)? {
                Attr::Float(f) => Ok(*f),
                Attr::Int(i) => Ok(*i as f32),
                other => Err(format!("attribute `{k}` of `{name}` must be a number, got {other:?}")),
            }
        };
        let uint = |k: &str| -> Result<usize, String> {
            match get(k)? {
                Attr::Int(i) if *i >= 0 => Ok(*i as usize),
                other => Err(format!("attribute `{k}` of `{name}` must be a non-negative integer, got {other:?}")),
            }
        };
        let expected: &[&str] = match name {
            "matmul" | "matmul_add" | "head_matmul" => &["transpose_b"],
            "rope_yarn" => &["theta", "style", "rotary_dim", "factor", "original_max_position", "beta_fast", "beta_slow", "attention_factor"],
            "mla_attention" => &["scale", "kv_lora_rank"],
            "moe_route" => &["top_k", "n_group", "topk_group", "scoring", "select", "normalize", "scaling"],
            "matmul_act" => &["transpose_b", "act"],
            "rms_norm" | "layer_norm" => &["eps"],
            "rope" | "rope_cache_write" => &["theta", "style", "rotary_dim"],
            "paged_attention" => &["scale"],
            "act_quant" => &["dtype", "group"],
            "top_k" => &["k"],
            "concat" => &["axis"],
            "slice" => &["axis", "start", "len"],
            "transpose" => &["perm"],
            _ => &[],
        };
        if let Some((k, _)) = attrs.iter().find(|(k, _)| !expected.contains(&k.as_str())) {
            return Err(format!("op `{name}` has no attribute `{k}`"));
        }
        let boolean = |k: &str| -> Result<bool, String> {
            match get(k)? {
                Attr::Bool(b) => Ok(*b),
                other => Err(format!("attribute `{k}` of `{name}` must be true/false, got {other:?}")),
            }
        };
        let ident = |k: &str| -> Result<&str, String> {
            match get(k)? {
                Attr::Ident(s) => Ok(s.as_str()),
                other => Err(format!("attribute `{k}` of `{name}` must be a name, got {other:?}")),
            }
        };
        use BinaryOp as B;
        use UnaryOp as U;
        Ok(match name {
            "input" => Op::Input,
            "weight" => Op::Weight,
            "state" => Op::State,
            "gather" => Op::Gather,
            "matmul" => Op::MatMul {
                transpose_b: match get("transpose_b")? {
                    Attr::Bool(b) => *b,
                    other => return Err(format!("attribute `transpose_b` must be true/false, got {other:?}")),
                },
            },
            "neg" => Op::Unary(U::Neg),
            "exp" => Op::Unary(U::Exp),
            "sqrt" => Op::Unary(U::Sqrt),
            "rsqrt" => Op::Unary(U::Rsqrt),
            "recip" => Op::Unary(U::Recip),
            "tanh" => Op::Unary(U::Tanh),
            "sigmoid" => Op::Unary(U::Sigmoid),
            "relu" => Op::Unary(U::Relu),
            "silu" => Op::Unary(U::Silu),
            "gelu" => Op::Unary(U::Gelu),
            "gelu_erf" => Op::Unary(U::GeluErf),
            "add" => Op::Binary(B::Add),
            "sub" => Op::Binary(B::Sub),
            "mul" => Op::Binary(B::Mul),
            "div" => Op::Binary(B::Div),
            "max" => Op::Binary(B::Max),
            "min" => Op::Binary(B::Min),
            "silu_mul" => Op::Binary(B::SiluMul),
            "rms_norm" => Op::RmsNorm { eps: float("eps")? },
            "layer_norm" => Op::LayerNorm { eps: float("eps")? },
            "rope" | "rope_cache_write" | "rope_yarn" => {
                let (theta, rotary_dim) = (float("theta")?, uint("rotary_dim")?);
                let style = match get("style")? {
                    Attr::Ident(s) if s == "interleaved" => RopeStyle::Interleaved,
                    Attr::Ident(s) if s == "half" => RopeStyle::Half,
                    other => return Err(format!("rope style must be interleaved or half, got {other:?}")),
                };
                if name == "rope" {
                    Op::Rope { theta, style, rotary_dim }
                } else if name == "rope_yarn" {
                    let yarn = Yarn {
                        factor: float("factor")?,
                        original_max_position: uint("original_max_position")?,
                        beta_fast: float("beta_fast")?,
                        beta_slow: float("beta_slow")?,
                        attention_factor: float("attention_factor")?,
                    };
                    Op::RopeYarn { theta, style, rotary_dim, yarn }
                } else {
                    Op::RopeCacheWrite { theta, style, rotary_dim }
                }
            }
            "softmax" => Op::Softmax,
            "cache_write" => Op::CacheWrite,
            "paged_attention" => Op::PagedAttention { scale: float("scale")? },
            "top_k" => Op::TopK { k: uint("k")? },
            "take_along" => Op::TakeAlong,
            "head_matmul" => Op::HeadMatMul { transpose_b: boolean("transpose_b")? },
            "mla_attention" => Op::MlaAttention { scale: float("scale")?, kv_lora_rank: uint("kv_lora_rank")? },
            "moe_route" => Op::MoeRoute(MoeRouting {
                top_k: uint("top_k")?,
                n_group: uint("n_group")?,
                topk_group: uint("topk_group")?,
                scoring: match ident("scoring")? {
                    "softmax" => MoeScoring::Softmax,
                    "sigmoid" => MoeScoring::Sigmoid,
                    s => return Err(format!("moe_route scoring must be softmax or sigmoid, got {s}")),
                },
                select: match ident("select")? {
                    "greedy" => MoeSelect::Greedy,
                    "group_max" => MoeSelect::GroupMax,
                    "noaux_tc" => MoeSelect::NoauxTc,
                    s => return Err(format!("moe_route select must be greedy, group_max or noaux_tc, got {s}")),
                },
                normalize: boolean("normalize")?,
                scaling: float("scaling")?,
            }),
            "moe_experts" => Op::MoeExperts,
            "concat" => Op::Concat { axis: uint("axis")? },
            "slice" => Op::Slice { axis: uint("axis")?, start: uint("start")?, len: uint("len")? },
            "reshape" => Op::Reshape,
            "transpose" => Op::Transpose {
                perm: match get("perm")? {
                    Attr::Ints(v) if v.iter().all(|&p| p >= 0) => v.iter().map(|&p| p as usize).collect(),
                    other => return Err(format!("attribute `perm` must be a list of axes, got {other:?}")),
                },
            },
            "quantize" => Op::Quantize,
            "dequantize" => Op::Dequantize,
            "cast" => Op::Cast,
            "argmax" => Op::Argmax,
            "all_reduce" => Op::AllReduce,
            "act_quant" => Op::ActQuant {
                dtype: match ident("dtype")? {
                    "f8e4m3" => DType::F8E4M3,
                    "i8" => DType::I8,
                    other => return Err(format!("attribute `dtype` of `act_quant` is f8e4m3 or i8, got {other}")),
                },
                group: uint("group")?,
            },
            "matmul_cat" => Op::MatMulCat,
            "matmul_act" => Op::MatMulAct {
                transpose_b: match get("transpose_b")? {
                    Attr::Bool(b) => *b,
                    other => return Err(format!("attribute `transpose_b` must be true/false, got {other:?}")),
                },
                act: match get("act")? {
                    Attr::Ident(s) => match Op::from_parts(s, &[]) {
                        Ok(Op::Unary(u)) => u,
                        _ => return Err(format!("attribute `act` must name an elementwise unary op (gelu, relu, silu, ...), got {s}")),
                    },
                    other => return Err(format!("attribute `act` must name a unary op, got {other:?}")),
                },
            },
            "matmul_add" => Op::MatMulAdd {
                transpose_b: match get("transpose_b")? {
                    Attr::Bool(b) => *b,
                    other => return Err(format!("attribute `transpose_b` must be true/false, got {other:?}")),
                },
            },
            other => return Err(format!("unknown op `{other}`")),
        })
    }

    /// Ops that update a state (a KV pool) in place: effects that DCE keeps and whose first
    /// operand must be a state or another such op.
    pub fn writes_state(&self) -> bool {
        matches!(self, Op::CacheWrite | Op::RopeCacheWrite { .. })
    }

    /// (min, max) operand count.
    pub fn arity(&self) -> (usize, usize) {
        match self {
            Op::Input | Op::Weight | Op::State => (0, 0),
            Op::Unary(_) | Op::Softmax | Op::TopK { .. } | Op::Slice { .. } | Op::Reshape | Op::Transpose { .. } | Op::Cast | Op::Argmax | Op::AllReduce | Op::ActQuant { .. } => (1, 1),
            Op::Gather | Op::Binary(_) | Op::RmsNorm { .. } | Op::Rope { .. } | Op::RopeYarn { .. } | Op::TakeAlong | Op::HeadMatMul { .. } => (2, 2),
            Op::MoeRoute(_) => (2, 3),
            Op::MlaAttention { .. } => (5, 5),
            Op::MoeExperts => (5, 6),
            Op::MatMul { .. } | Op::MatMulAct { .. } => (2, 3),
            Op::MatMulAdd { .. } => (3, 4),
            Op::LayerNorm { .. } | Op::CacheWrite => (3, 3),
            Op::RopeCacheWrite { .. } => (4, 4),
            Op::PagedAttention { .. } => (6, 6),
            Op::Concat { .. } => (1, usize::MAX),
            Op::MatMulCat => (3, usize::MAX),
            Op::Quantize | Op::Dequantize => (1, 2),
        }
    }
}

fn same(a: &Dim, b: &Dim) -> bool {
    a == b
}

fn float_act(t: &TensorType, what: &str) -> Result<(), String> {
    if matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16) {
        Ok(())
    } else {
        Err(format!("{what} must be f32/f16/bf16, got {}", t.dtype))
    }
}

fn index(t: &TensorType, what: &str) -> Result<(), String> {
    if t.dtype == DType::I32 {
        Ok(())
    } else {
        Err(format!("{what} must be i32, got {t}"))
    }
}

fn rank(t: &TensorType, r: usize, what: &str) -> Result<(), String> {
    if t.rank() == r {
        Ok(())
    } else {
        Err(format!("{what} must have rank {r}, got {t}"))
    }
}

fn dims_eq(a: &Dim, b: &Dim, what: &str) -> Result<(), String> {
    if same(a, b) {
        Ok(())
    } else {
        Err(format!("{what}: {a} != {b}"))
    }
}

/// Product of the constant dims and the sorted list of symbols: equal for two shapes that
/// have the same element count under every binding.
fn numel_key(shape: &[Dim]) -> (usize, Vec<String>) {
    let mut c = 1usize;
    let mut syms = vec![];
    for d in shape {
        match d {
            Dim::Const(v) => c = c.saturating_mul(*v),
            Dim::Sym(s) => syms.push(s.clone()),
        }
    }
    syms.sort();
    (c, syms)
}

/// Shape and dtype rule. `declared` is the node's own type: leaves, reshape, cast, quantize
/// and dequantize take their result type from it; ops that may widen a packed operand take
/// their dtype from it.
pub fn infer(op: &Op, args: &[&TensorType], declared: &TensorType) -> Result<TensorType, String> {
    let (lo, hi) = op.arity();
    if args.len() < lo || args.len() > hi {
        return Err(if lo == hi { format!("takes {lo} operand(s), got {}", args.len()) } else { format!("takes {lo}..{} operands, got {}", hi.min(64), args.len()) });
    }
    match op {
        Op::Input | Op::Weight | Op::State => Ok(declared.clone()),
        Op::Gather => {
            let (table, idx) = (args[0], args[1]);
            index(idx, "gather index")?;
            if table.rank() < 1 {
                return Err(format!("gather table must have rank >= 1, got {table}"));
            }
            let mut shape = idx.shape.clone();
            shape.extend_from_slice(&table.shape[1..]);
            // the rows are widened/narrowed to the node's dtype (packed tables dequantize)
            let t = TensorType::new(declared.dtype, shape);
            float_act(&t, "gather result")?;
            Ok(t)
        }
        Op::MatMul { transpose_b } => {
            let (a, b) = (args[0], args[1]);
            float_act(a, "matmul lhs")?;
            if a.rank() < 2 {
                return Err(format!("matmul lhs must have rank >= 2, got {a}"));
            }
            rank(b, 2, "matmul rhs")?;
            let k = &a.shape[a.rank() - 1];
            let (bk, n) = if *transpose_b { (&b.shape[1], &b.shape[0]) } else { (&b.shape[0], &b.shape[1]) };
            dims_eq(k, bk, "matmul contraction dims differ")?;
            if let Some(bias) = args.get(2) {
                rank(bias, 1, "matmul bias")?;
                dims_eq(&bias.shape[0], n, "matmul bias length")?;
            }
            let mut shape = a.shape[..a.rank() - 1].to_vec();
            shape.push(n.clone());
            Ok(TensorType::new(a.dtype, shape))
        }
        Op::Unary(_) | Op::Softmax => {
            float_act(args[0], "operand")?;
            Ok(args[0].clone())
        }
        Op::ActQuant { dtype, group } => {
            float_act(args[0], "act_quant operand")?;
            if !matches!(dtype, DType::F8E4M3 | DType::I8) {
                return Err(format!("act_quant rounds to f8e4m3 or i8, not {dtype}"));
            }
            if !group.is_multiple_of(32) {
                return Err(format!("act_quant's group is 0 (a whole row) or a multiple of 32, not {group}"));
            }
            Ok(args[0].clone())
        }
        Op::Binary(_) => {
            let (a, b) = (args[0], args[1]);
            if a.dtype != b.dtype {
                return Err(format!("operand dtypes differ: {a} vs {b}"));
            }
            let r = a.rank().max(b.rank());
            let mut shape = vec![];
            for i in 0..r {
                let da = if i + a.rank() >= r { Some(&a.shape[i + a.rank() - r]) } else { None };
                let db = if i + b.rank() >= r { Some(&b.shape[i + b.rank() - r]) } else { None };
                shape.push(match (da, db) {
                    (Some(x), None) | (None, Some(x)) => x.clone(),
                    (Some(x), Some(y)) if x == y => x.clone(),
                    (Some(Dim::Const(1)), Some(y)) => y.clone(),
                    (Some(x), Some(Dim::Const(1))) => x.clone(),
                    (Some(x), Some(y)) => return Err(format!("cannot broadcast {a} with {b} (dims {x} and {y})")),
                    (None, None) => unreachable!("i < max rank"),
                });
            }
            Ok(TensorType::new(a.dtype, shape))
        }
        Op::RmsNorm { .. } | Op::LayerNorm { .. } => {
            let x = args[0];
            float_act(x, "norm input")?;
            let d = x.shape.last().ok_or("norm input must have rank >= 1")?;
            for w in &args[1..] {
                rank(w, 1, "norm weight")?;
                dims_eq(&w.shape[0], d, "norm weight length")?;
            }
            Ok(x.clone())
        }
        Op::Rope { rotary_dim, .. } | Op::RopeYarn { rotary_dim, .. } => {
            let (x, pos) = (args[0], args[1]);
            float_act(x, "rope input")?;
            rank(x, 3, "rope input [T, H, D]")?;
            index(pos, "rope positions")?;
            rank(pos, 1, "rope positions")?;
            dims_eq(&x.shape[0], &pos.shape[0], "rope tokens vs positions")?;
            if let Some(d) = x.shape[2].as_const() {
                if *rotary_dim > d || rotary_dim % 2 != 0 || *rotary_dim == 0 {
                    return Err(format!("rotary_dim {rotary_dim} must be even and in 2..={d}"));
                }
            }
            Ok(x.clone())
        }
        Op::CacheWrite => {
            let (cache, x, slot) = (args[0], args[1], args[2]);
            rank(cache, 4, "cache [NB, BS, KVH, D]")?;
            rank(x, 3, "cache_write value [T, KVH, D]")?;
            index(slot, "cache slots")?;
            rank(slot, 1, "cache slots")?;
            dims_eq(&x.shape[0], &slot.shape[0], "values vs slots")?;
            dims_eq(&cache.shape[2], &x.shape[1], "KV heads")?;
            dims_eq(&cache.shape[3], &x.shape[2], "head dim")?;
            Ok(cache.clone())
        }
        Op::RopeCacheWrite { rotary_dim, style, theta } => {
            // the two ops it fuses, checked in turn
            let roped = infer(&Op::Rope { theta: *theta, style: *style, rotary_dim: *rotary_dim }, &[args[1], args[3]], args[1])?;
            infer(&Op::CacheWrite, &[args[0], &roped, args[2]], declared)
        }
        Op::PagedAttention { .. } => {
            let (q, kc, vc, pos, seq, table) = (args[0], args[1], args[2], args[3], args[4], args[5]);
            float_act(q, "attention query")?;
            rank(q, 3, "attention query [T, H, D]")?;
            rank(kc, 4, "k cache [NB, BS, KVH, D]")?;
            if kc != vc {
                return Err(format!("k and v caches differ: {kc} vs {vc}"));
            }
            dims_eq(&kc.shape[3], &q.shape[2], "head dim of q vs cache")?;
            if let (Some(h), Some(kvh)) = (q.shape[1].as_const(), kc.shape[2].as_const()) {
                if kvh == 0 || h % kvh != 0 {
                    return Err(format!("query heads {h} not a multiple of KV heads {kvh}"));
                }
            }
            for (t, what) in [(pos, "positions"), (seq, "sequence index")] {
                index(t, what)?;
                rank(t, 1, what)?;
                dims_eq(&t.shape[0], &q.shape[0], what)?;
            }
            index(table, "block table")?;
            rank(table, 2, "block table [S, MB]")?;
            Ok(q.clone())
        }
        Op::HeadMatMul { transpose_b } => {
            let (a, b) = (args[0], args[1]);
            float_act(a, "head_matmul lhs")?;
            rank(a, 3, "head_matmul lhs [T, H, K]")?;
            rank(b, 3, "head_matmul rhs [H, K, N]")?;
            dims_eq(&a.shape[1], &b.shape[0], "head_matmul heads")?;
            let (bk, n) = if *transpose_b { (&b.shape[2], &b.shape[1]) } else { (&b.shape[1], &b.shape[2]) };
            dims_eq(&a.shape[2], bk, "head_matmul contraction dims differ")?;
            Ok(TensorType::new(a.dtype, vec![a.shape[0].clone(), a.shape[1].clone(), n.clone()]))
        }
        Op::MlaAttention { kv_lora_rank, .. } => {
            let (q, cache, pos, seq, table) = (args[0], args[1], args[2], args[3], args[4]);
            float_act(q, "mla query")?;
            rank(q, 3, "mla query [T, H, C]")?;
            rank(cache, 4, "latent cache [NB, BS, 1, C]")?;
            dims_eq(&cache.shape[2], &Dim::Const(1), "latent cache heads")?;
            dims_eq(&cache.shape[3], &q.shape[2], "latent width of q vs cache")?;
            if let Some(c) = q.shape[2].as_const() {
                if *kv_lora_rank == 0 || *kv_lora_rank > c {
                    return Err(format!("kv_lora_rank {kv_lora_rank} must be in 1..={c}"));
                }
            }
            for (t, what) in [(pos, "positions"), (seq, "sequence index")] {
                index(t, what)?;
                rank(t, 1, what)?;
                dims_eq(&t.shape[0], &q.shape[0], what)?;
            }
            index(table, "block table")?;
            rank(table, 2, "block table [S, MB]")?;
            Ok(TensorType::new(q.dtype, vec![q.shape[0].clone(), q.shape[1].clone(), Dim::Const(*kv_lora_rank)]))
        }
        Op::MoeRoute(r) => {
            let logits = args[0];
            float_act(logits, "router logits")?;
            rank(logits, 2, "router logits [T, E]")?;
            if let Some(e) = logits.shape[1].as_const() {
                if r.n_group == 0 || e % r.n_group != 0 {
                    return Err(format!("{e} experts do not split into n_group = {} groups", r.n_group));
                }
                if r.topk_group == 0 || r.topk_group > r.n_group {
                    return Err(format!("topk_group = {} must be in 1..={}", r.topk_group, r.n_group));
                }
                if r.top_k == 0 || r.top_k > r.topk_group * (e / r.n_group) {
                    return Err(format!("top_k = {} must be in 1..={} (the experts of topk_group groups)", r.top_k, r.topk_group * (e / r.n_group)));
                }
                if r.select == MoeSelect::NoauxTc && e / r.n_group < 2 {
                    return Err("noaux_tc ranks groups by their two best experts: groups need >= 2".into());
                }
            }
            let mask = args[1];
            float_act(mask, "expert mask")?;
            rank(mask, 1, "expert mask [E]")?;
            dims_eq(&mask.shape[0], &logits.shape[1], "expert mask length")?;
            match (args.get(2), r.select) {
                (Some(b), MoeSelect::NoauxTc) => {
                    float_act(b, "router bias")?;
                    rank(b, 1, "router bias [E]")?;
                    dims_eq(&b.shape[0], &logits.shape[1], "router bias length")?;
                }
                (None, MoeSelect::NoauxTc) => return Err("noaux_tc needs the correction bias as its third operand".into()),
                (Some(_), _) => return Err("only noaux_tc takes a correction bias".into()),
                (None, _) => {}
            }
            Ok(TensorType::new(DType::F32, logits.shape.clone()))
        }
        Op::MoeExperts => {
            let (x, route, gate, up, down) = (args[0], args[1], args[2], args[3], args[4]);
            float_act(x, "moe input")?;
            rank(x, 2, "moe input [T, D]")?;
            rank(route, 2, "moe routing [T, E]")?;
            dims_eq(&route.shape[0], &x.shape[0], "moe routing rows")?;
            for (w, what) in [(gate, "gate [E, I, D]"), (up, "up [E, I, D]"), (down, "down [E, D, I]")] {
                rank(w, 3, what)?;
                dims_eq(&w.shape[0], &route.shape[1], "experts")?;
            }
            if gate.shape != up.shape {
                return Err(format!("gate and up stacks differ: {gate} vs {up}"));
            }
            dims_eq(&gate.shape[2], &x.shape[1], "expert input width")?;
            dims_eq(&down.shape[1], &x.shape[1], "expert output width")?;
            dims_eq(&down.shape[2], &gate.shape[1], "expert hidden width")?;
            if let Some(r) = args.get(5) {
                float_act(r, "moe residual")?;
                if r.shape != x.shape {
                    return Err(format!("moe residual {r} differs from the input {x}"));
                }
            }
            Ok(x.clone())
        }
        Op::TopK { k } => {
            let x = args[0];
            let n = x.shape.last().ok_or("top_k input must have rank >= 1")?;
            if let Some(n) = n.as_const() {
                if *k == 0 || *k > n {
                    return Err(format!("k = {k} must be in 1..={n}"));
                }
            }
            let mut shape = x.shape.clone();
            *shape.last_mut().expect("rank >= 1") = Dim::Const(*k);
            Ok(TensorType::new(DType::I32, shape))
        }
        Op::TakeAlong => {
            let (x, idx) = (args[0], args[1]);
            index(idx, "take_along index")?;
            if x.rank() != idx.rank() || x.rank() == 0 {
                return Err(format!("take_along needs equal ranks >= 1: {x} vs {idx}"));
            }
            for i in 0..x.rank() - 1 {
                dims_eq(&x.shape[i], &idx.shape[i], "take_along leading dims")?;
            }
            Ok(TensorType::new(x.dtype, idx.shape.clone()))
        }
        Op::Concat { axis } => {
            let first = args[0];
            if *axis >= first.rank() {
                return Err(format!("axis {axis} out of range for {first}"));
            }
            let mut total = 0usize;
            for a in args {
                if a.dtype != first.dtype || a.rank() != first.rank() {
                    return Err(format!("concat operands differ: {first} vs {a}"));
                }
                for i in 0..a.rank() {
                    if i != *axis {
                        dims_eq(&a.shape[i], &first.shape[i], "concat non-axis dims")?;
                    }
                }
                total += a.shape[*axis].as_const().ok_or_else(|| format!("concat axis must be constant, got {a}"))?;
            }
            let mut shape = first.shape.clone();
            shape[*axis] = Dim::Const(total);
            Ok(TensorType::new(first.dtype, shape))
        }
        Op::Slice { axis, start, len } => {
            let x = args[0];
            let d = x.shape.get(*axis).ok_or_else(|| format!("axis {axis} out of range for {x}"))?;
            let d = d.as_const().ok_or_else(|| format!("slice axis must be constant, got {x}"))?;
            if start + len > d || *len == 0 {
                return Err(format!("slice {start}..{} out of 0..{d}", start + len));
            }
            let mut shape = x.shape.clone();
            shape[*axis] = Dim::Const(*len);
            Ok(TensorType::new(x.dtype, shape))
        }
        Op::Reshape => {
            let x = args[0];
            if numel_key(&x.shape) != numel_key(&declared.shape) {
                return Err(format!("reshape from {x} to {declared} changes the element count"));
            }
            if x.dtype != declared.dtype {
                return Err(format!("reshape cannot change dtype ({x} to {declared})"));
            }
            Ok(declared.clone())
        }
        Op::Transpose { perm } => {
            let x = args[0];
            let mut seen = vec![false; x.rank()];
            if perm.len() != x.rank() || perm.iter().any(|&p| p >= x.rank() || std::mem::replace(&mut seen[p], true)) {
                return Err(format!("perm {perm:?} is not a permutation of the axes of {x}"));
            }
            Ok(TensorType::new(x.dtype, perm.iter().map(|&p| x.shape[p].clone())))
        }
        Op::Quantize | Op::Dequantize | Op::Cast => {
            let x = args[0];
            if x.shape != declared.shape {
                return Err(format!("{} keeps the shape: {x} vs declared {declared}", op.name()));
            }
            if matches!(op, Op::Dequantize) {
                float_act(declared, "dequantize result")?;
            }
            if let Some(s) = args.get(1) {
                float_act(s, "scale")?;
            }
            Ok(declared.clone())
        }
        Op::Argmax => {
            let x = args[0];
            if x.rank() == 0 {
                return Err("argmax input must have rank >= 1".into());
            }
            Ok(TensorType::new(DType::I32, x.shape[..x.rank() - 1].to_vec()))
        }
        Op::AllReduce => {
            float_act(args[0], "all_reduce operand")?;
            Ok(args[0].clone())
        }
        Op::MatMulCat => {
            let mut total = 0usize;
            let mut shape = vec![];
            for (i, w) in args[1..].iter().enumerate() {
                if w.dtype != args[1].dtype {
                    return Err(format!("matmul_cat weights differ in dtype: {} vs {w}", args[1]));
                }
                let t = infer(&Op::MatMul { transpose_b: true }, &[args[0], w], declared).map_err(|e| format!("weight {i}: {e}"))?;
                total += t.shape.last().and_then(|d| d.as_const()).ok_or_else(|| format!("matmul_cat weight {i} needs constant dims, got {w}"))?;
                shape = t.shape;
            }
            *shape.last_mut().expect("rank >= 2") = Dim::Const(total);
            Ok(TensorType::new(args[0].dtype, shape))
        }
        Op::MatMulAct { transpose_b, .. } => infer(&Op::MatMul { transpose_b: *transpose_b }, args, declared),
        Op::MatMulAdd { transpose_b } => {
            let (mm, r) = args.split_at(args.len() - 1);
            let t = infer(&Op::MatMul { transpose_b: *transpose_b }, mm, declared)?;
            if r[0].shape != t.shape || r[0].dtype != t.dtype {
                return Err(format!("matmul_add residual {} must have the result's type {t}", r[0]));
            }
            Ok(t)
        }
    }
}
