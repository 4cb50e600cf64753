//! Graph → launch schedule: one kernel launch (or a buffer alias) per compute node, in
//! topological order, with the kernel specs to generate. Scalars and grid sizes are
//! expressions over node shapes, evaluated by the runtime once a step binds its symbols.
//!
//! [`lower`] builds the first schedule ([`initial`]) and then runs [`REWRITES`], one ordered,
//! named list; each rewrite runs where the options turn it on, and the schedule is checked
//! ([`verify`]) after every one, so a rewrite that breaks an invariant is named in the error.
//! `dsc compile --dump-ir=schedule` prints the final schedule ([`print`]) with the rewrites
//! that ran; `--dump-ir=schedule@NAME` the schedule right after rewrite NAME.
//!
//! Files: `initial` (graph → steps, the matmul alternatives, the norm folded into GEMVs), `mla` (MLA's launch fusions),
//! `attention`, `matmul` and `fold` (the rewrites by what they touch), `tests`. A new op
//! family (MoE, MLA) adds its lowering to `initial` and its rewrites to a file of its own and
//! to [`REWRITES`].
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - A plan's `gpu.steps` replay the graph in topological order: a step launches a kernel on node
//!   buffers, or makes the node an alias of another buffer (reshape, same-dtype cast,
//!   cache_write's pool), optionally `alias_offset` elements in (a *view*: the runtime places the
//!   node inside its root's buffer). Scalars and grids are expressions over node shapes (`numel`,
//!   `rows`, `dim`, `rows_times`), evaluated per step once T/S/MB/R/NB are bound.
//! - Lowering-level fusions (`schedule/`, after the per-node steps; the graph and the CPU oracle
//!   keep the separate ops): `fuse_qkv_rope_cache` runs rope(q), rope_cache_write(k) and
//!   cache_write(v) of one merged Q/K/V matmul as one `QkvRopeCache` launch placed at the *last*
//!   of the three steps (so every buffer it writes is already live and every input still is);
//!   the other two steps launch nothing. `DSC_NO_QKV_ROPE_FUSION=1` at compile time for A/B.
//!   `fuse_swiglu`: where silu_mul reads both parts of a two-part gate/up `matmul_cat` with
//!   plain-float weights, the cat's one-row kernel becomes `SwiGluGemv` (half of each GEMV
//!   block's outputs from each weight, silu(g)·u in the epilogue) writing silu_mul's buffer —
//!   named in the cat step's args, so its life starts there — and silu_mul's step gets
//!   `min_rows: 2`; the cat's alternatives keep their own args and write the cat
//!   (`DSC_NO_SWIGLU_FUSION=1` for A/B). Order: QKV fusion, SwiGLU, then the prefill casts, which
//!   start from an alternative's own args. `fuse_rope_attention` (after the split attention; on,
//!   DSC_ROPE_ATTENTION=0 off): where a `QkvRopeCache` feeds a one-pass decode attention of a
//!   block per (token, head), that attention step is split — one token (rows = H): a
//!   `RopeAttention` kernel reading q/k/v before RoPE, each block writing its KV head's rotated
//!   K row and V row into the pools first (every block of the KV head writes the same values),
//!   then attending with q rotated on load; more tokens: the original — and `QkvRopeCache` moves
//!   to a step of its own on the rotated q's node for 2+ tokens, and for one token at contexts
//!   the split attention takes. One token only: with more, a token may read another's K/V row
//!   written in the same step. Under PDL, with bf16 pools and head dims up to 64, the pipelined kernel loads
//!   its first warp step's K/V rows (earlier positions: written by earlier steps, never by the
//!   kernel before) ahead of `griddepcontrol.wait`; the one warp whose first step holds the token's
//!   own position takes that row from shared memory, where the cache-write threads also put the
//!   rotated K and the V row (`kernels::emit_paged_attention`, `early`, `short`; DSC_ATTN_EARLY=0 /
//!   =all; DSC_ATTN_SHORT=0: reloaded from the pool, and q loaded after the cache write's barrier). Prepared, off (measured slower): `fuse_attention_o` (DSC_ATTN_O=1) folds the o
//!   projection into that one-token kernel (`KernelSpec::AttentionO`: per-head partials
//!   `{y}@splitk{H}`, a per-token counter `{y}@sync` the runtime keeps resident and zeroed, the
//!   last block summing), for W_o slices up to `ATTN_O_MAX_BYTES` per block.

use crate::kernels::{BinaryOpKey, KernelSpec, UnaryOpKey};
pub use crate::options::{ScheduleOptions, SwiGluFusion, Tma};
use crate::CodegenError;
use dsc_ir::{DType, Graph, Op, RopeStyle};

mod attention;
mod fold;
mod initial;
mod matmul;
mod mla;
mod moe;
#[cfg(test)]
mod tests;

pub use attention::*;
pub(crate) use fold::*;
pub use initial::*;
pub use matmul::*;

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

fn err(node: &str, msg: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported { kernel: node.to_string(), msg: msg.into() }
}

/// Lower every compute node of `g` with the schedule choices `o`. Leaves (inputs, weights,
/// states) get no step.
pub fn lower(g: &Graph, o: &ScheduleOptions) -> Result<Vec<Step>, CodegenError> {
    lower_traced(g, o, &mut |_, _| {})
}

/// [`lower`] by value (the tests' form).
pub fn lower_opts(g: &Graph, o: ScheduleOptions) -> Result<Vec<Step>, CodegenError> {
    lower(g, &o)
}

/// One schedule rewrite: its name (for errors and `--dump-ir=schedule@NAME`), whether the
/// options turn it on, and the rewrite itself.
pub struct Rewrite {
    pub name: &'static str,
    pub on: fn(&ScheduleOptions) -> bool,
    pub run: fn(&Graph, Vec<Step>, &ScheduleOptions) -> Vec<Step>,
}

/// The schedule's rewrites, in the order they run. Order matters: the split attention comes
/// before the one-token RoPE fusion (which keeps the split copies' context bounds), split-K
/// before the 16-bit casts and the SwiGLU epilogue that read its alternatives, the TMA wrap
/// after every rewrite that picks a pipelined matmul, the one-token fusions after the matmul
/// rewrites whose alternatives they keep, the GEMV folds last.
pub const REWRITES: &[Rewrite] = &[
    Rewrite {
        name: "qkv-rope-cache",
        on: |o| o.qkv_rope_fusion,
        run: |g, mut s, _| {
            fuse_qkv_rope_cache(g, &mut s);
            s
        },
    },
    Rewrite {
        name: "mla-fusions",
        on: |_| true,
        run: |g, mut s, _| {
            mla::fuse_mla_latent_cache(g, &mut s);
            mla::fuse_mla_query(g, &mut s);
            s
        },
    },
    Rewrite {
        name: "mla-cache-attention",
        on: |o| o.mla_cache_attention,
        run: |_, mut s, _| {
            mla::fuse_mla_cache_attention(&mut s);
            s
        },
    },
    Rewrite {
        name: "swiglu-gemv",
        on: |o| o.swiglu_fusion,
        run: |g, mut s, _| {
            fuse_swiglu(g, &mut s);
            s
        },
    },
    Rewrite { name: "split-attention", on: |o| o.split_kv, run: |_, s, o| split_attention(s, o.attn_group, o.split_kv_from) },
    Rewrite { name: "rope-attention", on: |o| o.rope_attention, run: |_, s, o| fuse_rope_attention(s, o.split_kv.then_some(o.split_kv_from)) },
    Rewrite { name: "split-k", on: |o| o.split_k.is_some(), run: |_, s, o| split_k(s, o.split_k.unwrap_or(SPLIT_K_PARTS)) },
    // (always: with both off it only inserts the casts the 16-bit readers need)
    Rewrite { name: "half-casts", on: |_| true, run: |_, s, o| insert_half_casts(s, o.norm_half, o.silu_half) },
    Rewrite { name: "swiglu-pipe", on: |o| o.swiglu_pipe != SwiGluFusion::Off, run: |_, s, o| fuse_swiglu_pipe(s, o.swiglu_pipe, o.tma, o.ws) },
    // (with 8 warps per row instead of 32 the fold lost: 8B b32 6,360 -> 6,021 tok/s, b64
    // 10,447 -> 9,793, bench/results/splitk-norm-2026-11-30.json)
    Rewrite { name: "splitk-norm", on: |o| o.split_k.is_some() && o.splitk_norm, run: |_, s, o| fold_splitk_reduce_norm(s, o.splitk_norm_cluster) },
    Rewrite { name: "splitk-rope", on: |o| o.splitk_rope, run: |_, s, _| fold_splitk_reduce_rope(s) },
    // (always: with TMA and warp specialization off it changes nothing)
    Rewrite { name: "tma", on: |_| true, run: |_, s, o| tma_wrap(s, o.tma, o.ws, o.ws64) },
    Rewrite { name: "attention-o", on: |o| o.attn_o, run: |_, s, _| fuse_attention_o(s) },
    Rewrite { name: "swiglu-down", on: |o| o.swiglu_down, run: |g, s, o| fuse_swiglu_down(g, s, o.swiglu_down_fb, o.swiglu_down_fpw) },
    Rewrite { name: "attention-o-red", on: |o| o.swiglu_down && o.attn_o_red, run: |_, s, o| fuse_attention_o_red(s, o.attn_o_splits) },
    Rewrite { name: "qkv-attention", on: |o| o.swiglu_down && o.attn_o_red && o.qkv_attn, run: |_, s, _| fuse_qkv_attention(s) },
    Rewrite {
        name: "moe-shared",
        on: |o| o.moe_shared,
        run: |g, mut s, o| {
            moe::fuse_moe_shared(g, &mut s, o);
            s
        },
    },
    Rewrite {
        name: "moe-router",
        on: |o| o.moe_shared && o.moe_router,
        run: |_, mut s, _| {
            moe::fuse_moe_router(&mut s);
            moe::fold_moe_norm(&mut s);
            s
        },
    },
    Rewrite { name: "moe-shared-prefetch", on: |o| o.moe_shared && o.moe_prefetch, run: |g, s, _| moe::prefetch_shared_experts(s, g) },
    Rewrite { name: "row-gather-norm", on: |o| o.row_gather_norm, run: |g, s, _| fold_row_gather(g, s) },
    Rewrite { name: "wide-norm", on: |o| o.wide_norm, run: |g, s, _| fold_norm_into_wide(g, s) },
    Rewrite { name: "gather-gemv", on: |o| o.gather_gemv, run: |_, s, _| fold_embedding_gather(s) },
    Rewrite { name: "lm-head-prefetch", on: |o| o.lm_head_prefetch_mb.is_some(), run: |g, s, o| prefetch_lm_head(s, g, o.lm_head_prefetch_mb.unwrap_or(0) << 20) },
    Rewrite { name: "attention-prefetch", on: |o| o.attn_prefetch, run: |g, s, _| prefetch_after_attention(s, g) },
];

/// [`lower`], handing `seen` the schedule after the first lowering ("initial") and after every
/// rewrite that ran, by name.
pub fn lower_traced(g: &Graph, o: &ScheduleOptions, seen: &mut dyn FnMut(&str, &[Step])) -> Result<Vec<Step>, CodegenError> {
    let mut steps = initial(g, *o)?;
    verify(g, &steps).map_err(|m| err(&g.name, format!("the first schedule: {m}")))?;
    seen("initial", &steps);
    for r in REWRITES.iter().filter(|r| (r.on)(o)) {
        steps = (r.run)(g, steps, o);
        verify(g, &steps).map_err(|m| err(&g.name, format!("after the schedule rewrite `{}`: {m}", r.name)))?;
        seen(r.name, &steps);
    }
    Ok(steps)
}

/// The schedule's invariants: every buffer a step or alternative names (its args, its alias,
/// its scalars' nodes) is a graph node or a step's own; every graph output has a step; row
/// and context bounds are ordered, an alternative's too.
pub fn verify(g: &Graph, steps: &[Step]) -> Result<(), String> {
    let mut known: std::collections::HashSet<&str> = g.node_ids().map(|id| g.node(id).name.as_str()).collect();
    known.extend(steps.iter().map(|s| s.node.as_str()));
    let scalar_node = |s: &Scalar| -> Option<String> {
        match s {
            Scalar::Const(_) => None,
            Scalar::Numel(n) | Scalar::Rows(n) | Scalar::Dim(n, _) | Scalar::RowsTimes(n, _) | Scalar::HalfNumel(n) => Some(n.clone()),
        }
    };
    for s in steps {
        let at = |m: String| format!("step `{}`: {m}", s.node);
        for b in s.buffers().chain(s.alias_of.iter()) {
            // (a buffer's derived names — `{buffer}@...`: a TMA tensor map, a part — stand for
            // that buffer)
            let root = b.split('@').next().unwrap_or(b);
            if !known.contains(b.as_str()) && !known.contains(root) {
                return Err(at(format!("names buffer `{b}`, which no node or step defines")));
            }
        }
        let scalars = s.scalars.iter().chain([&s.work, &s.grid_y]).chain(s.alias_offset.iter()).chain(s.alternatives().flat_map(|l| l.scalars.iter().chain([&l.work, &l.grid_y])));
        for sc in scalars {
            if let Some(n) = scalar_node(sc) {
                if !known.contains(n.as_str()) {
                    return Err(at(format!("a scalar reads node `{n}`, which does not exist")));
                }
            }
        }
        if let (Some(a), Some(b)) = (s.min_rows, s.max_rows) {
            if a > b {
                return Err(at(format!("rows {a}..={b} are empty")));
            }
        }
        if let (Some(a), Some(b)) = (s.min_context, s.max_context) {
            if a > b {
                return Err(at(format!("contexts {a}..={b} are empty")));
            }
        }
        for l in s.alternatives() {
            if l.max_rows.is_some_and(|m| m < l.min_rows) {
                return Err(at(format!("alternative `{}` takes rows {}..={}: none", l.kernel.symbol(), l.min_rows, l.max_rows.unwrap_or(0))));
            }
        }
    }
    for (out, id) in &g.outputs {
        let n = &g.node(*id).name;
        if !g.node(*id).op.is_leaf() && !steps.iter().any(|s| &s.node == n) {
            return Err(format!("graph output `{out}` (node `{n}`) has no step"));
        }
    }
    Ok(())
}

/// A schedule as text, a line per step: `node = kernel(args) grid work x grid_y`, its row and
/// context bounds, then each alternative indented with the rows it takes.
pub fn print(steps: &[Step]) -> String {
    use std::fmt::Write;
    let sc = |s: &Scalar| match s {
        Scalar::Const(v) => v.to_string(),
        Scalar::Numel(n) => format!("numel({n})"),
        Scalar::Rows(n) => format!("rows({n})"),
        Scalar::Dim(n, i) => format!("dim({n}, {i})"),
        Scalar::RowsTimes(n, c) => format!("rows({n})*{c}"),
        Scalar::HalfNumel(n) => format!("numel({n})/2"),
    };
    let range = |lo: Option<i64>, hi: Option<i64>, what: &str| match (lo, hi) {
        (None, None) => String::new(),
        (lo, hi) => format!(" {what} {}..{}", lo.map(|v| v.to_string()).unwrap_or_default(), hi.map(|v| format!("={v}")).unwrap_or_default()),
    };
    let mut out = String::new();
    for s in steps {
        let what = match (&s.kernel, &s.alias_of, &s.collective) {
            (Some(k), _, _) => format!(
                "{}({}) grid {} x {}{}",
                k.symbol(),
                s.args.join(", "),
                sc(&s.work),
                sc(&s.grid_y),
                if s.scalars.is_empty() { String::new() } else { format!(" [{}]", s.scalars.iter().map(sc).collect::<Vec<_>>().join(", ")) }
            ),
            (None, Some(a), c) => format!("alias {a}{}{}", s.alias_offset.as_ref().map(|o| format!(" + {}", sc(o))).unwrap_or_default(), c.as_ref().map(|c| format!(" then {c}")).unwrap_or_default()),
            (None, None, Some(c)) => c.clone(),
            (None, None, None) => "buffer".into(),
        };
        let _ = writeln!(
            out,
            "{} = {what}{}{}{}{}",
            s.node,
            range(s.min_rows, s.max_rows, "rows"),
            range(s.min_context, s.max_context, "context"),
            if s.hopper_only { " sm_90a-only" } else { "" },
            s.hopper_skip.map(|(a, b)| format!(" (sm_90a: not for rows {a}..={b})")).unwrap_or_default()
        );
        for (role, ls) in [("large", s.large.iter().collect::<Vec<_>>()), ("hopper", s.hopper.iter().collect()), ("hopper_small", s.hopper_small.iter().collect()), ("few", s.few.iter().collect())] {
            for l in ls {
                let args = l.args.as_ref().map(|a| a.join(", ")).unwrap_or_else(|| "..".into());
                let _ = writeln!(out, "    {role}{}: {}({args}) grid {} x {}", range(Some(l.min_rows), l.max_rows, "rows"), l.kernel.symbol(), sc(&l.work), sc(&l.grid_y));
            }
        }
    }
    out
}
