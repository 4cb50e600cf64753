//! The plan file: the one contract between compiler and runtime.
//!
//! ```text
//! offset  size  field
//! 0       8     magic "DSCPLAN\0"
//! 8       4     format version (u32 LE)            -- PLAN_FORMAT_VERSION
//! 12      4     flags (u32 LE, 0)
//! 16      8     header length (u64 LE)
//! 24      8     blob offset (u64 LE, 4096-aligned)
//! 32      8     blob length (u64 LE)
//! 40      32    sha256 of the header
//! 72      32    sha256 of the blob
//! 104     ..    header: pretty JSON (PlanHeader), human-readable
//! blob    ..    weights, each 64-byte aligned, at the offsets the header lists
//! ```
//! Every length and checksum is checked on load; a truncated or corrupt plan, a wrong magic or
//! version is an error naming the file and what is wrong. Every header field is then checked
//! against bounds before anything uses it ([`PlanHeader::validate`]), with checked arithmetic
//! for every size, since a plan from elsewhere is untrusted input (and carries PTX the GPU runs).
//!
//! Signed plans (`dsc compile --sign KEY`): flags bit 0 set, and after the blob a trailer
//! `"DSCSIG\0\0"`, the 32-byte ed25519 public key and the 64-byte signature of the 104-byte
//! prefix (magic, version, flags, lengths and both SHA-256 sums: so of the whole plan).
//! [`OpenOptions::trusted_keys`] (`dsc serve --trusted-key`) refuses plans not signed by one.
//!
//! Referenced weights (`dsc compile --reference-weights`) are named by file name only and looked
//! up in the plan's directory or [`OpenOptions::weights_dir`], never at an arbitrary path.

use crate::error::{Result, RuntimeError};
use dsc_ir::{DType, WeightSource};
use memmap2::Mmap;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

pub const PLAN_MAGIC: &[u8; 8] = b"DSCPLAN\0";
pub const PLAN_FORMAT_VERSION: u32 = 4;
const PREFIX: usize = 104;
/// flags bit 0: a signature trailer follows the blob
pub const FLAG_SIGNED: u32 = 1;
const SIG_MAGIC: &[u8; 8] = b"DSCSIG\0\0";
const SIG_TRAILER: usize = 8 + 32 + 64;

/// Bounds a plan header must keep (far past any real model; they stop a crafted header from
/// driving a division by zero, a multi-TiB allocation or a thread per "rank").
pub mod limits {
    pub const MAX_SEQ_LEN: usize = 1 << 22;
    pub const MAX_KV_BLOCK: usize = 4096;
    pub const MAX_BATCH: usize = 1 << 16;
    pub const MAX_TP: usize = 64;
    pub const MAX_TENSORS: usize = 1 << 20;
    pub const MAX_DIMS: usize = 8;
    /// elements of one tensor
    pub const MAX_NUMEL: u64 = 1 << 40;
    /// bytes of all weights together (stored, referenced and seeded)
    pub const MAX_TOTAL_BYTES: u64 = 16 << 40;
    pub const MAX_SOURCE_FILES: usize = 4096;
    pub const MAX_STEPS: usize = 1 << 20;
    pub const MAX_THREADS: u32 = 1024;
    pub const MAX_SMEM: u32 = 232_448;
    pub const MAX_CLUSTER: u32 = 16;
}
const BLOB_ALIGN: usize = 4096;
const TENSOR_ALIGN: usize = 64;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PlanHeader {
    pub format_version: u32,
    pub created_by: String,
    pub model: ModelMeta,
    /// What the plan can run on: "cpu" (the reference executor) and, once kernels are in
    /// the plan, GPU targets such as "sm_90a".
    pub targets: Vec<String>,
    /// The verified graph in the IR text format.
    pub graph: String,
    pub tokenizer: Option<PlanTokenizer>,
    pub weights: PlanWeights,
    /// The GPU program: PTX per target and the launch schedule. Absent when some op of the
    /// graph has no GPU lowering yet (the plan then runs on the CPU backend only).
    pub gpu: Option<GpuProgram>,
    /// The CPU program: compiled x86-64 kernels (`--backend cpu`). Absent: the CPU runs the
    /// reference executor.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<CpuProgram>,
    /// Tensor-parallel ranks the graph is partitioned for. Every rank runs the same graph;
    /// rank r's weights are its slices of the stored full tensors (`dsc_ir::shard`).
    #[serde(default = "one")]
    pub tensor_parallel: usize,
}

fn one() -> usize {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuProgram {
    /// target ("sm_90a", "sm_80") → PTX module text
    pub ptx: std::collections::BTreeMap<String, String>,
    /// one entry per compute node, in execution order
    pub steps: Vec<GpuStep>,
    /// the memory plan: every activation buffer with the steps that define it and last use
    /// it (aliases folded in). The runtime places buffers whose lifetimes do not overlap at
    /// the same arena offsets once a step shape fixes their sizes.
    pub buffers: Vec<BufferLife>,
    /// kernel that takes the argmax of each logits row on the device (greedy decoding copies
    /// back token ids instead of logits); params logits, ids (i32), rows
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argmax: Option<String>,
    /// threads of the argmax kernel's block where it takes a block per row (grid: rows);
    /// absent: a warp per row, 4 rows per 128-thread block (plans before session 8)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argmax_block: Option<u32>,
    /// the argmax over several blocks per row instead (grid: splits x rows): kernel `argmax_split`, params logits, partials (8 bytes per block), a u32
    /// counter per row (zero before, zero after), ids, rows; absent: a block per row
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argmax_split: Option<ArgmaxSplit>,
    /// on sm_90a, the argmax over a thread-block cluster of `splits` blocks per row instead
    /// (grid: rows x splits, clusters along y; params logits, ids, rows; in the sm_90a PTX
    /// only); absent: the split or block-per-row argmax
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argmax_cluster: Option<ArgmaxSplit>,
    /// the code generator's options the program was compiled with (`dsc_codegen::CodegenOptions`
    /// as JSON: `schedule` and `kernels` sections; `dsc inspect` prints them); absent in plans
    /// from before they were recorded
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codegen_options: Option<serde_json::Value>,
}

/// The compiled CPU kernels of a plan (`dsc_codegen::cpu`).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CpuProgram {
    /// weight types the matmul kernels read as stored ("q4_1", ...): every library exports
    /// `dsc_cpu_matmul_<type>_gemv` and `_gemm` for each
    pub matmul_dtypes: Vec<String>,
    /// x86-64 level ("x86-64-v3", "x86-64-v4", "x86-64-v4-amx") → the shared library (ELF, base64), built
    /// from the same LLVM IR; the runtime loads the highest level the CPU has
    pub libraries: std::collections::BTreeMap<String, String>,
    /// the weight layout the kernels read (`dsc_ir::quant::CPU_LAYOUT`; 1 in plans from before
    /// it was recorded): the runtime lays weights out in its own and refuses other kernels
    #[serde(default = "cpu_layout_1")]
    pub layout: u32,
}

fn cpu_layout_1() -> u32 {
    1
}

/// The x86-64 levels a plan's CPU libraries may be built for, lowest first.
pub const CPU_TARGETS: [&str; 3] = ["x86-64-v3", "x86-64-v4", "x86-64-v4-amx"];

/// The split argmax of a plan ([`GpuProgram::argmax_split`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArgmaxSplit {
    pub kernel: String,
    pub splits: u32,
    /// threads per block
    pub threads: u32,
}

impl GpuProgram {
    /// Kernel launches of a step whose matmuls have `rows` rows (steps with a `min_rows` above
    /// it are skipped: one-row steps fold RMSNorm into the GEMVs), at short contexts.
    pub fn launches(&self, rows: i64) -> usize {
        self.launches_at(rows, 1)
    }

    /// As [`GpuProgram::launches`] for steps whose longest context is `context` keys.
    pub fn launches_at(&self, rows: i64, context: i64) -> usize {
        self.steps.iter().filter(|s| s.kernel.is_some() && s.runs_at(rows) && s.runs_in_context(context)).count()
    }

    /// The context lengths at which the schedule changes (where a step's context range starts
    /// or ends), ascending.
    pub fn context_bounds(&self) -> Vec<i64> {
        let mut b: Vec<i64> = self.steps.iter().flat_map(|s| s.min_context.into_iter().chain(s.max_context.map(|m| m + 1))).collect();
        b.sort_unstable();
        b.dedup();
        b
    }

    /// The context class of a step whose longest context is `context` keys: how many of
    /// [`GpuProgram::context_bounds`] it reaches, and the shortest context of that class (the
    /// same steps run for every context of a class).
    pub fn context_class(&self, context: i64) -> (usize, i64) {
        context_class_in(&self.context_bounds(), context)
    }
}

/// [`GpuProgram::context_class`] from bounds computed once ([`GpuProgram::context_bounds`]: the
/// runtime asks at every step).
pub fn context_class_in(bounds: &[i64], context: i64) -> (usize, i64) {
    let class = bounds.iter().take_while(|&&x| context >= x).count();
    (class, if class == 0 { 0 } else { bounds[class - 1] })
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BufferLife {
    pub node: String,
    pub first: usize,
    pub last: usize,
}

/// Arena placement: offsets (256-byte aligned) for buffers given their sizes and lifetimes,
/// first-fit in order of definition; a buffer is free after the step of its last use, so no
/// kernel ever writes into a buffer it also reads. Returns (offsets, arena size).
pub fn place_buffers(lives: &[BufferLife], sizes: &[usize]) -> (Vec<usize>, usize) {
    let align = |x: usize| x.div_ceil(256) * 256;
    let mut order: Vec<usize> = (0..lives.len()).collect();
    order.sort_by_key(|&i| (lives[i].first, i));
    let mut offsets = vec![0; lives.len()];
    let mut live: Vec<usize> = vec![]; // indices, kept sorted by offset
    let mut total = 0;
    for i in order {
        live.retain(|&j| lives[j].last >= lives[i].first);
        live.sort_by_key(|&j| offsets[j]);
        let size = align(sizes[i].max(1));
        let mut at = 0;
        for &j in &live {
            if offsets[j] >= at + size {
                break;
            }
            at = at.max(offsets[j] + align(sizes[j].max(1)));
        }
        offsets[i] = at;
        total = total.max(at + size);
        live.push(i);
    }
    (offsets, total)
}

/// An integer the runtime evaluates once a step binds the graph's symbols.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Scalar {
    Const(i64),
    Numel(String),
    Rows(String),
    Dim(String, usize),
    HalfNumel(String),
    /// rows (element count / last dim) of a node times a constant
    RowsTimes(String, i64),
}

/// How a step's kernel covers its work: the grid and block the runtime launches it with
/// ([`LaunchKind::dims`]). In the plan's JSON by its snake_case name (`"per_element"`); a plan
/// naming another kind does not parse.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq, Hash)]
#[serde(rename_all = "snake_case")]
pub enum LaunchKind {
    /// `block` threads per block, one per unit of work
    PerElement,
    /// a warp per row (`block` rows per block)
    WarpPerRow,
    /// a warp per output (`block` warps per block)
    WarpPerOutput,
    /// a warp per 8-output tile, 16 activation rows per block (`block` warps per block)
    WarpPerTile,
    /// a warpgroup (128 threads) per tile, 64 activation rows per block
    WarpgroupPerTile,
    /// a block of `block` warps per row
    BlockPerRow,
    /// `block` outputs per block of `threads` threads, `rows_per_block` activation rows (the
    /// decode GEMVs and the tile matmuls)
    OutputsPerBlock,
    /// no kernel (a pure alias)
    None,
}

impl LaunchKind {
    /// (grid x, grid y, threads per block) covering `work` units by `rows` (grid y before
    /// tiling), with the step's `block`, `rows_per_block` and `threads`; None for [`LaunchKind::None`].
    pub fn dims(self, work: u32, rows: u32, block: u32, rows_per_block: u32, threads: u32) -> Option<(u32, u32, u32)> {
        Some(match self {
            LaunchKind::PerElement => (work.div_ceil(block), rows, block),
            LaunchKind::WarpPerRow | LaunchKind::WarpPerOutput => (work.div_ceil(block), rows, 32 * block),
            LaunchKind::WarpPerTile => (work.div_ceil(block), rows.div_ceil(16), 32 * block),
            LaunchKind::WarpgroupPerTile => (work, rows.div_ceil(64), 128),
            LaunchKind::BlockPerRow => (work, rows, 32 * block),
            LaunchKind::OutputsPerBlock => (work.div_ceil(block), rows.div_ceil(rows_per_block.max(1)), threads),
            LaunchKind::None => return None,
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuStep {
    /// the graph node this step computes
    pub node: String,
    /// kernel symbol in the PTX module; None for pure aliases
    pub kernel: Option<String>,
    /// node buffers passed to the kernel, then `scalars` as i64
    pub args: Vec<String>,
    pub scalars: Vec<Scalar>,
    /// how `work` and `grid_y` map to the grid ([`LaunchKind::dims`])
    pub launch: LaunchKind,
    /// threads (per_element), outputs (outputs_per_block) or warps (the others) per block
    pub block: u32,
    /// threads per block of an "outputs_per_block" kernel (default 128)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// units of work the grid's x dimension covers; grid y
    pub work: Scalar,
    pub grid_y: Scalar,
    /// the node's buffer is this node's buffer
    pub alias_of: Option<String>,
    /// ... from this many f32 elements in (a part of a merged matmul's output: a view)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias_offset: Option<Scalar>,
    /// not launched in steps of fewer rows (an RMSNorm that one-row steps compute in the
    /// prologue of the decode GEMVs reading it)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_rows: Option<i64>,
    /// not launched when the step has more rows (the split decode attention's merge step)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rows: Option<i64>,
    /// launched only in steps whose longest context (keys of the sequence with the most) is at
    /// least / at most this (the split decode attention for long contexts, the one-pass kernel
    /// for short ones); the runtime keeps a bucket per context class ([`GpuProgram::context_class`])
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_context: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_context: Option<i64>,
    /// launched only where the `hopper` alternatives run (sm_90a, wgmma not turned off): the
    /// second pass of a split-K alternative
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hopper_only: bool,
    /// not launched where the `hopper` alternatives run for rows in this range (inclusive):
    /// an earlier step's Hopper alternative computes this node in its epilogue (the gate/up
    /// matmul's SwiGLU)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hopper_skip: Option<(i64, i64)>,
    /// the kernel to use instead when the output has at least `min_rows` rows
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub large: Option<GpuLarge>,
    /// on sm_90a, ahead of `few` and instead of `large`, each for its `min_rows..=max_rows`
    /// rows, the first that fits (Hopper warpgroup MMA: 64-row tiles for batched decode,
    /// 128-row tiles for prefill)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hopper: Vec<GpuLarge>,
    /// on sm_90a, for steps with fewer rows than `hopper.min_rows` (narrower tiles)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hopper_small: Option<GpuLarge>,
    /// on any target, each for its `min_rows..=max_rows` rows, the first that fits (the
    /// batched-decode GEMVs), after `hopper` where that takes the rows
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub few: Vec<GpuLarge>,
    /// a collective over the tensor-parallel group on the (aliased) buffer: "all_reduce_sum"
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collective: Option<String>,
    /// on sm_90a the default kernel is launched in thread-block clusters of this many blocks
    /// along grid y (its blocks share shared memory: the one-token attention computing its
    /// head's q, k and v); grid y a multiple of it
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<u32>,
    /// the logits step: its default kernel with the greedy argmax folded in
    /// (`KernelSpec::ArgmaxFold`: params part, sync, ids, then the default kernel's), which a
    /// chained multi-step graph runs instead of it and the argmax kernel
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub argmax: Option<String>,
}

impl GpuStep {
    /// Whether the step launches at all for `rows` rows (its `min_rows..=max_rows`).
    pub fn runs_at(&self, rows: i64) -> bool {
        self.min_rows.is_none_or(|m| rows >= m) && self.max_rows.is_none_or(|m| rows <= m)
    }

    /// Whether the step launches for `rows` rows on a device that runs the `hopper`
    /// alternatives (`hopper`) or not: [`GpuStep::runs_at`], `hopper_only` and `hopper_skip`.
    pub fn runs_on(&self, rows: i64, hopper: bool) -> bool {
        self.runs_at(rows) && (hopper || !self.hopper_only) && !(hopper && self.hopper_skip.is_some_and(|(lo, hi)| (lo..=hi).contains(&rows)))
    }

    /// Whether the step launches in steps whose longest context is `context` keys (its
    /// `min_context..=max_context`).
    pub fn runs_in_context(&self, context: i64) -> bool {
        self.min_context.is_none_or(|m| context >= m) && self.max_context.is_none_or(|m| context <= m)
    }

    /// The kernel to run instead of `kernel` for a step of `rows` output rows, if any: on
    /// sm_90a the first `hopper` kernel whose row range holds `rows`; else the first batched
    /// GEMV (`few`) whose row range holds `rows`; else on sm_90a `hopper_small`, elsewhere
    /// `large` from its min_rows.
    pub fn alternative(&self, rows: i64, hopper: bool) -> Option<&GpuLarge> {
        let fits = |l: &&GpuLarge| rows >= l.min_rows && l.max_rows.is_none_or(|m| rows <= m);
        if let Some(h) = self.hopper.iter().filter(|_| hopper).find(fits) {
            return Some(h);
        }
        if let Some(f) = self.few.iter().find(fits) {
            return Some(f);
        }
        let rest = match &self.hopper_small {
            Some(h) if hopper => Some(h),
            _ => self.large.as_ref(),
        };
        rest.filter(fits)
    }
}

fn one_u32() -> u32 {
    1
}
fn is_one_u32(v: &u32) -> bool {
    *v == 1
}

/// What a step's buffer argument is. The schedule names the buffers it derives from a node by
/// the node's name and a tag (`{node}@bf16`, `{x}@xmap64`, ...): readable in the plan, and read
/// here only, by [`BufferRef::parse`] (the plan's validation parses every argument, so an
/// unknown tag fails the load naming the step).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufferRef<'a> {
    /// a graph node's own buffer: an activation, a weight, a KV pool, an input
    Node(&'a str),
    /// `{node}@bf16`, `{node}@f16`: a 16-bit copy of a node a cast step writes (the prefill
    /// matmuls' operand), of the node's shape
    Half { node: &'a str, f16: bool },
    /// `{node}@split{S}`: the split decode attention's partial states, [T, H, S·(D + 2)] for a
    /// [T, H, D] node
    SplitParts { node: &'a str, parts: usize },
    /// `{node}@splitk{S}`: a split-K matmul's partial sums, [S, ..] of the node's shape
    SplitK { node: &'a str, parts: usize },
    /// `{weight}@tmap{rows}`: the `CUtensorMap` of a 16-bit weight in `rows`-row boxes (the TMA
    /// matmuls, sm_90a), made once at load
    WeightMap { weight: &'a str, rows: u32 },
    /// `{x}@xmap{rows}`: the tensor map of the 16-bit activation `x` (itself a buffer name,
    /// e.g. `h@bf16`) at its place in a bucket's arena (the warp-specialized matmul)
    ActivationMap { x: &'a str, rows: u32 },
    /// `{pool}@kvmap{rows}`: the tensor map of a bf16 KV pool (the wgmma prefill attention)
    PoolMap { pool: &'a str, rows: u32 },
    /// `{node}@sync`: a u32 counter per token, zero between uses (the one-token attention with
    /// the o projection folded in)
    Sync { node: &'a str },
    /// `{node}@rows{W}`: an f32 scratch of `width` values per row of the node, [rows, W] (the
    /// routed experts' hidden activations, `MoeGateUp` -> `MoeDown`)
    RowScratch { node: &'a str, width: usize },
    /// `{x}@counts`: a u32 counter per element of the step input `x` (or of the view of one
    /// that `x` names), resident and zeroed at load, that kernels add to (the routers'
    /// selections per expert: `expert_mask@counts`, read back for the MoE metrics)
    Counts { of: &'a str },
}

impl<'a> BufferRef<'a> {
    /// The role of buffer `name`; Err for a tag this runtime does not know.
    pub fn parse(name: &'a str) -> std::result::Result<Self, String> {
        let Some((base, tag)) = name.rsplit_once('@') else { return Ok(BufferRef::Node(name)) };
        let num = |prefix: &str| tag.strip_prefix(prefix).filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())).and_then(|n| n.parse::<u32>().ok());
        let r = match tag {
            "bf16" | "f16" => Some(BufferRef::Half { node: base, f16: tag == "f16" }),
            "sync" => Some(BufferRef::Sync { node: base }),
            "counts" => Some(BufferRef::Counts { of: base }),
            _ if tag.starts_with("splitk") => num("splitk").map(|s| BufferRef::SplitK { node: base, parts: s as usize }),
            _ if tag.starts_with("rows") => num("rows").filter(|&w| w > 0).map(|w| BufferRef::RowScratch { node: base, width: w as usize }),
            _ if tag.starts_with("split") => num("split").map(|s| BufferRef::SplitParts { node: base, parts: s as usize }),
            _ if tag.starts_with("tmap") => num("tmap").map(|rows| BufferRef::WeightMap { weight: base, rows }),
            _ if tag.starts_with("xmap") => num("xmap").map(|rows| BufferRef::ActivationMap { x: base, rows }),
            _ if tag.starts_with("kvmap") => num("kvmap").map(|rows| BufferRef::PoolMap { pool: base, rows }),
            _ => None,
        };
        match r {
            Some(r) if !base.is_empty() => Ok(r),
            _ => Err(format!("buffer `{name}`: unknown tag `@{tag}` (bf16, f16, sync, counts, split<S>, splitk<S>, rows<W>, tmap<R>, xmap<R>, kvmap<R>)")),
        }
    }

    /// [`BufferRef::parse`] of a name already validated (the plan's arguments): an unknown tag
    /// reads as a node of that name.
    pub fn of(name: &'a str) -> Self {
        Self::parse(name).unwrap_or(BufferRef::Node(name))
    }

    /// The graph node whose shape (and element type, for `Half`) the buffer derives from: the
    /// name without its tags.
    pub fn node(self) -> &'a str {
        match self {
            BufferRef::Node(n)
            | BufferRef::Half { node: n, .. }
            | BufferRef::SplitParts { node: n, .. }
            | BufferRef::SplitK { node: n, .. }
            | BufferRef::Sync { node: n }
            | BufferRef::Counts { of: n }
            | BufferRef::RowScratch { node: n, .. } => n,
            BufferRef::WeightMap { weight, .. } => weight,
            BufferRef::PoolMap { pool, .. } => pool,
            BufferRef::ActivationMap { x, .. } => BufferRef::of(x).node(),
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuLarge {
    pub min_rows: i64,
    /// used only up to this many rows (none: no upper bound)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rows: Option<i64>,
    /// the buffers this kernel takes, when they differ from the step's `args`
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// activation rows per block ("outputs_per_block": grid y = ceil(grid_y / this))
    #[serde(default = "one_u32", skip_serializing_if = "is_one_u32")]
    pub rows_per_block: u32,
    /// threads per block ("outputs_per_block"; default 128)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// bytes of dynamic shared memory per block (the pipelined tile matmuls; the runtime raises
    /// the kernel's limit past the default 48 KB when it loads the plan)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub smem: Option<u32>,
    /// the kernel asks for the largest shared-memory carveout (the prefill attention)
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub carveout: bool,
    pub kernel: String,
    pub scalars: Vec<Scalar>,
    /// how `work` and `grid_y` map to the grid ([`LaunchKind::dims`])
    pub launch: LaunchKind,
    pub block: u32,
    pub work: Scalar,
    pub grid_y: Scalar,
    /// on sm_90a the kernel is launched in thread-block clusters of this many blocks along
    /// grid y (the split-K reduce + RMSNorm's blocks of a row); none: no cluster
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<u32>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelMeta {
    pub name: String,
    pub architecture: String,
    /// architecture dims as given by the model front end (hidden, layers, heads, ...)
    pub dims: serde_json::Value,
    pub max_seq_len: usize,
    pub kv_block_size: usize,
    pub max_batch: usize,
    pub activations: String,
    pub kv_cache: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PlanTokenizer {
    /// HF tokenizer.json
    pub json: String,
    pub bos_id: Option<u32>,
    pub eos_ids: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PlanWeights {
    /// where the weights came from: the checkpoint path and its sha256, or "seeded"
    pub source: String,
    pub source_sha256: Option<String>,
    pub total_bytes: u64,
    pub tensors: Vec<WeightEntry>,
    /// checkpoint files that referenced weights are read from (`WeightEntry::file`)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<SourceFile>,
    /// what model.toml's precision policy (`dsc compile --quant`) made of the checkpoint's
    /// matrices, per layer type (absent: every weight as stored)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
}

/// A checkpoint file a plan reads weights from instead of embedding them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceFile {
    /// the file name (no directory): looked up beside the plan or in `--weights-dir`
    pub path: String,
    pub len: u64,
    pub sha256: String,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WeightEntry {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    /// byte offset within the blob (0 and unused for seeded tensors)
    pub offset: u64,
    /// stored size in bytes (for seeded tensors: the size once generated)
    pub nbytes: u64,
    /// generated from a seed where it is used instead of stored (`dsc_ir::seeded`)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seeded: Option<SeededWeight>,
    /// read from `weights.files[file]` at `offset` instead of the blob
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<usize>,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SeededWeight {
    pub seed: u64,
    pub scale: f32,
    pub ones: bool,
}

/// What the writer stores for one weight.
pub enum WeightData<'a> {
    Bytes(&'a [u8]),
    Seeded(SeededWeight),
    /// a range of a checkpoint file: (index into `PlanWeights::files`, offset, length)
    Referenced(usize, u64, u64),
}

/// Write a plan: `weights` yields (name, dtype, shape, bytes) in the order to store them.
pub fn write_plan<'a>(path: &Path, header: PlanHeader, weights: impl IntoIterator<Item = (String, DType, Vec<usize>, WeightData<'a>)>) -> Result<()> {
    write_plan_signed(path, header, weights, None)
}

/// [`write_plan`], signed with `key` where given (the trailer described above).
pub fn write_plan_signed<'a>(
    path: &Path,
    mut header: PlanHeader,
    weights: impl IntoIterator<Item = (String, DType, Vec<usize>, WeightData<'a>)>,
    key: Option<&ed25519_dalek::SigningKey>,
) -> Result<()> {
    let ioe = |source| RuntimeError::Io { path: path.to_path_buf(), source };
    let all: Vec<_> = weights.into_iter().collect();
    let mut entries = vec![];
    let mut items = vec![];
    let mut off = 0u64;
    let mut total = 0u64;
    for (name, dtype, shape, data) in all {
        let numel: usize = shape.iter().product();
        match data {
            WeightData::Bytes(bytes) => {
                off = off.div_ceil(TENSOR_ALIGN as u64) * TENSOR_ALIGN as u64;
                entries.push(WeightEntry { name: name.clone(), dtype: dtype.to_string(), shape: shape.clone(), offset: off, nbytes: bytes.len() as u64, seeded: None, file: None });
                off += bytes.len() as u64;
                total += bytes.len() as u64;
                items.push((name, dtype, shape, bytes));
            }
            WeightData::Seeded(sw) => {
                let nbytes =
                    dtype.bytes_for(numel).ok_or_else(|| RuntimeError::Plan { path: path.into(), msg: format!("seeded weight `{name}`: {numel} elements are not whole {dtype} blocks") })? as u64;
                total += nbytes;
                entries.push(WeightEntry { name, dtype: dtype.to_string(), shape, offset: 0, nbytes, seeded: Some(sw), file: None });
            }
            WeightData::Referenced(file, offset, nbytes) => {
                total += nbytes;
                entries.push(WeightEntry { name, dtype: dtype.to_string(), shape, offset, nbytes, seeded: None, file: Some(file) });
            }
        }
    }
    let blob_len = off;
    header.weights.total_bytes = total;
    header.weights.tensors = entries.clone();
    let entries: Vec<WeightEntry> = entries.into_iter().filter(|e| e.seeded.is_none() && e.file.is_none()).collect();
    let hjson = serde_json::to_vec_pretty(&header).map_err(|e| RuntimeError::Plan { path: path.into(), msg: e.to_string() })?;
    let blob_offset = (PREFIX + hjson.len()).div_ceil(BLOB_ALIGN) * BLOB_ALIGN;
    // hash the blob as it will be laid out (zero padding between tensors)
    let mut bh = Sha256::new();
    let mut pos = 0u64;
    let zeros = [0u8; TENSOR_ALIGN];
    for ((_, _, _, bytes), e) in items.iter().zip(&entries) {
        bh.update(&zeros[..(e.offset - pos) as usize]);
        bh.update(bytes);
        pos = e.offset + e.nbytes;
    }
    let tmp = path.with_extension("plan.part");
    let f = std::fs::File::create(&tmp).map_err(|source| RuntimeError::Io { path: tmp.clone(), source })?;
    let mut w = std::io::BufWriter::new(f);
    let mut prefix = Vec::with_capacity(PREFIX);
    prefix.extend_from_slice(PLAN_MAGIC);
    prefix.extend(PLAN_FORMAT_VERSION.to_le_bytes());
    prefix.extend((if key.is_some() { FLAG_SIGNED } else { 0 }).to_le_bytes());
    prefix.extend((hjson.len() as u64).to_le_bytes());
    prefix.extend((blob_offset as u64).to_le_bytes());
    prefix.extend(blob_len.to_le_bytes());
    prefix.extend(Sha256::digest(&hjson));
    prefix.extend(bh.finalize());
    w.write_all(&prefix).map_err(ioe)?;
    w.write_all(&hjson).map_err(ioe)?;
    w.write_all(&vec![0u8; blob_offset - PREFIX - hjson.len()]).map_err(ioe)?;
    let mut pos = 0u64;
    for ((_, _, _, bytes), e) in items.iter().zip(&entries) {
        w.write_all(&zeros[..(e.offset - pos) as usize]).map_err(ioe)?;
        w.write_all(bytes).map_err(ioe)?;
        pos = e.offset + e.nbytes;
    }
    if let Some(k) = key {
        use ed25519_dalek::Signer;
        w.write_all(SIG_MAGIC).map_err(ioe)?;
        w.write_all(k.verifying_key().as_bytes()).map_err(ioe)?;
        w.write_all(&k.sign(&prefix).to_bytes()).map_err(ioe)?;
    }
    w.flush().map_err(ioe)?;
    drop(w);
    // write-then-rename: a crash never leaves a half-written plan under the real name
    std::fs::rename(&tmp, path).map_err(ioe)?;
    Ok(())
}

/// A loaded plan: header plus the memory-mapped weight blob.
pub struct Plan {
    pub path: PathBuf,
    pub header: PlanHeader,
    map: Mmap,
    blob_offset: usize,
    blob_len: usize,
    index: std::collections::HashMap<String, usize>,
    /// seeded tensors generated on the CPU on first use
    generated: std::collections::HashMap<String, std::sync::OnceLock<Vec<u8>>>,
    /// mapped checkpoint files of referenced weights
    sources: Vec<Mmap>,
    /// the key whose signature verified, for signed plans
    pub signer: Option<[u8; 32]>,
}

/// How a plan is opened.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// hash the weights (the header is always checked)
    pub verify_blob: bool,
    /// where referenced weight files are (default: the plan's directory)
    pub weights_dir: Option<PathBuf>,
    /// when not empty, the plan must be signed by one of these ed25519 public keys
    pub trusted_keys: Vec<[u8; 32]>,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { verify_blob: true, weights_dir: None, trusted_keys: vec![] }
    }
}

/// A key file's 32 bytes: 64 hex digits (what `dsc keygen` writes), whitespace around allowed.
pub fn read_key_file(path: &Path) -> Result<[u8; 32]> {
    let text = std::fs::read_to_string(path).map_err(|source| RuntimeError::Io { path: path.to_path_buf(), source })?;
    let t = text.trim();
    let bad = || RuntimeError::Plan { path: path.to_path_buf(), msg: "a key file holds 64 hex digits (dsc keygen writes them)".into() };
    if t.len() != 64 || !t.is_ascii() {
        return Err(bad());
    }
    let mut k = [0u8; 32];
    for (i, b) in k.iter_mut().enumerate() {
        *b = u8::from_str_radix(&t[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
    }
    Ok(k)
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl PlanHeader {
    /// Every field against [`limits`], with checked arithmetic: a crafted header is an error
    /// naming the field, never a panic or an unbounded allocation later.
    pub fn validate(&self) -> std::result::Result<(), String> {
        use limits::*;
        let m = &self.model;
        let within = |what: &str, v: usize, lo: usize, hi: usize| if (lo..=hi).contains(&v) { Ok(()) } else { Err(format!("{what} is {v}; it must be {lo} to {hi}")) };
        within("model.max_seq_len", m.max_seq_len, 1, MAX_SEQ_LEN)?;
        within("model.kv_block_size", m.kv_block_size, 1, MAX_KV_BLOCK)?;
        within("model.max_batch", m.max_batch, 1, MAX_BATCH)?;
        within("tensor_parallel", self.tensor_parallel, 1, MAX_TP)?;
        within("weights.tensors (count)", self.weights.tensors.len(), 0, MAX_TENSORS)?;
        within("weights.files (count)", self.weights.files.len(), 0, MAX_SOURCE_FILES)?;
        let mut total = 0u64;
        for e in &self.weights.tensors {
            if e.shape.len() > MAX_DIMS {
                return Err(format!("weight `{}` has {} dims (at most {MAX_DIMS})", e.name, e.shape.len()));
            }
            let numel = e.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d as u64)).filter(|&n| n <= MAX_NUMEL);
            if numel.is_none() {
                return Err(format!("weight `{}`: shape {:?} has more than {MAX_NUMEL} elements", e.name, e.shape));
            }
            total = total.checked_add(e.nbytes).filter(|&t| t <= MAX_TOTAL_BYTES).ok_or_else(|| format!("weights: more than {MAX_TOTAL_BYTES} bytes in all"))?;
            if e.file.is_some() && e.seeded.is_some() {
                return Err(format!("weight `{}` is both seeded and referenced", e.name));
            }
            if let Some(sw) = &e.seeded {
                if !sw.scale.is_finite() {
                    return Err(format!("weight `{}`: seeded scale {} is not finite", e.name, sw.scale));
                }
            }
        }
        if let Some(c) = &self.cpu {
            for (t, lib) in &c.libraries {
                if !CPU_TARGETS.contains(&t.as_str()) {
                    return Err(format!("cpu.libraries: unknown target `{t}` (known: {CPU_TARGETS:?})"));
                }
                if lib.len() > 64 << 20 {
                    return Err(format!("cpu.libraries.{t}: {} bytes of base64 (at most 64 MiB)", lib.len()));
                }
            }
            for d in &c.matmul_dtypes {
                d.parse::<DType>().map_err(|_| format!("cpu.matmul_dtypes: unknown type `{d}`"))?;
            }
        }
        for f in &self.weights.files {
            source_file_name(&f.path)?;
        }
        if let Some(g) = &self.gpu {
            within("gpu.steps (count)", g.steps.len(), 0, MAX_STEPS)?;
            let threads = |what: &str, t: u32| if (1..=MAX_THREADS).contains(&t) { Ok(()) } else { Err(format!("{what}: {t} threads per block (1 to {MAX_THREADS})")) };
            for st in &g.steps {
                let at = |f: &str| format!("gpu step `{}`: {f}", st.node);
                // (every buffer argument's role: an unknown tag is not a buffer this runtime has)
                let args = st.args.iter().chain(std::iter::once(&st.node)).chain(st.large.iter().chain(&st.hopper).chain(&st.hopper_small).chain(&st.few).filter_map(|l| l.args.as_ref()).flatten());
                for a in args {
                    BufferRef::parse(a).map_err(|e| at(&e))?;
                }
                if st.kernel.is_some() && !(1..=1 << 20).contains(&st.block) {
                    return Err(at(&format!("block {} (1 to {})", st.block, 1 << 20)));
                }
                if let Some(t) = st.threads {
                    threads(&at("threads"), t)?;
                }
                if st.cluster.is_some_and(|c| !(1..=MAX_CLUSTER).contains(&c)) {
                    return Err(at(&format!("cluster {:?} (1 to {MAX_CLUSTER})", st.cluster)));
                }
                for l in st.large.iter().chain(&st.hopper).chain(&st.hopper_small).chain(&st.few) {
                    let at = |f: &str| format!("gpu step `{}`, kernel `{}`: {f}", st.node, l.kernel);
                    if !(1..=1 << 20).contains(&l.block) || l.rows_per_block == 0 || l.rows_per_block > 1 << 16 {
                        return Err(at(&format!("block {} / rows_per_block {} out of bounds", l.block, l.rows_per_block)));
                    }
                    if let Some(t) = l.threads {
                        threads(&at("threads"), t)?;
                    }
                    if l.smem.is_some_and(|b| b > MAX_SMEM) {
                        return Err(at(&format!("{} bytes of shared memory (at most {MAX_SMEM})", l.smem.unwrap_or(0))));
                    }
                    if l.cluster.is_some_and(|c| !(1..=MAX_CLUSTER).contains(&c)) {
                        return Err(at(&format!("cluster {:?} (1 to {MAX_CLUSTER})", l.cluster)));
                    }
                }
            }
            if let Some(b) = g.argmax_block {
                threads("gpu.argmax_block", b)?;
            }
            for a in g.argmax_split.iter().chain(&g.argmax_cluster) {
                threads("gpu argmax threads", a.threads)?;
                if !(1..=1024).contains(&a.splits) {
                    return Err(format!("gpu argmax `{}`: {} splits (1 to 1024)", a.kernel, a.splits));
                }
            }
        }
        Ok(())
    }
}

/// A referenced weights file's name as a plan may give it: a bare file name (no directory, no
/// `..`), looked up beside the plan or in the weights directory.
pub fn source_file_name(name: &str) -> std::result::Result<&str, String> {
    let p = Path::new(name);
    let ok = !name.is_empty() && p.file_name().is_some_and(|f| f == p.as_os_str()) && name != ".." && name != "." && !name.contains(['/', '\\']);
    if ok {
        Ok(name)
    } else {
        Err(format!("referenced weights file `{name}`: a plan names its weight files by file name only (no directories)"))
    }
}

/// A plan's prefix, signature and header from its bytes, every length, checksum and header
/// field checked ([`PlanHeader::validate`]): (header, blob offset, blob length). `path` names the
/// plan in errors. What [`Plan::open_with`] runs on the mapped file (and the fuzzer on bytes).
pub fn parse_plan_bytes(path: &Path, map: &[u8], opts: &OpenOptions) -> Result<ParsedPlan> {
    let verify_blob = opts.verify_blob;
    let perr = |msg: String| RuntimeError::Plan { path: path.to_path_buf(), msg };
    if map.get(..8).is_some_and(|m| m != PLAN_MAGIC) || (map.len() < 8 && !PLAN_MAGIC.starts_with(&map)) {
        return Err(perr("not a dsc plan (bad magic)".into()));
    }
    if map.len() < PREFIX {
        return Err(perr(format!("truncated: {} bytes, shorter than the {PREFIX}-byte prefix", map.len())));
    }
    let u32at = |o: usize| u32::from_le_bytes(map[o..o + 4].try_into().expect("4 bytes"));
    let u64at = |o: usize| u64::from_le_bytes(map[o..o + 8].try_into().expect("8 bytes"));
    let version = u32at(8);
    if version != PLAN_FORMAT_VERSION {
        return Err(perr(format!("plan format version {version}; this runtime reads version {PLAN_FORMAT_VERSION} (recompile the plan with a matching dsc)")));
    }
    let flags = u32at(12);
    if flags & !FLAG_SIGNED != 0 {
        return Err(perr(format!("unknown flags {flags:#x} (a newer dsc wrote it?)")));
    }
    let (hlen, blob_offset, blob_len) = (u64at(16), u64at(24), u64at(32));
    let (header_end, blob_end) = ((PREFIX as u64).saturating_add(hlen), blob_offset.checked_add(blob_len));
    if header_end > map.len() as u64 || blob_end.is_none_or(|e| e > map.len() as u64) || blob_offset < header_end {
        return Err(perr(format!("truncated or corrupt: header {hlen} B, blob {blob_len} B at {blob_offset}, file {} B", map.len())));
    }
    let (hlen, blob_offset, blob_len) = (hlen as usize, blob_offset as usize, blob_len as usize);
    let signer = if flags & FLAG_SIGNED != 0 {
        let t = blob_offset + blob_len;
        let tr = map.get(t..t + SIG_TRAILER).filter(|tr| &tr[..8] == SIG_MAGIC).ok_or_else(|| perr("flagged as signed but the signature trailer is missing or damaged".into()))?;
        let key: [u8; 32] = tr[8..40].try_into().expect("32 bytes");
        let sig: [u8; 64] = tr[40..104].try_into().expect("64 bytes");
        let vk = ed25519_dalek::VerifyingKey::from_bytes(&key).map_err(|_| perr("the signature's public key is invalid".into()))?;
        vk.verify_strict(&map[..PREFIX], &ed25519_dalek::Signature::from_bytes(&sig)).map_err(|_| perr("the signature does not verify: the plan was altered after signing".into()))?;
        Some(key)
    } else {
        None
    };
    if !opts.trusted_keys.is_empty() {
        match signer {
            None => return Err(perr("the plan is not signed, and only plans signed by a trusted key are accepted (dsc compile --sign)".into())),
            Some(k) if !opts.trusted_keys.contains(&k) => return Err(perr(format!("the plan is signed by key {}, which is not among the trusted keys", hex(&k)))),
            Some(_) => {}
        }
    }
    let hbytes = &map[PREFIX..PREFIX + hlen];
    if Sha256::digest(hbytes).as_slice() != &map[40..72] {
        return Err(perr("header checksum mismatch: the plan is corrupt".into()));
    }
    if verify_blob && Sha256::digest(&map[blob_offset..blob_offset + blob_len]).as_slice() != &map[72..104] {
        return Err(perr("weights checksum mismatch: the plan is corrupt".into()));
    }
    let header: PlanHeader = serde_json::from_slice(hbytes).map_err(|e| perr(format!("header: {e}")))?;
    header.validate().map_err(|m| perr(format!("header: {m}")))?;
    Ok(ParsedPlan { header, blob_offset, blob_len, signer })
}

/// What [`parse_plan_bytes`] checked and found.
pub struct ParsedPlan {
    pub header: PlanHeader,
    pub blob_offset: usize,
    pub blob_len: usize,
    /// the ed25519 public key whose signature verified (None: unsigned)
    pub signer: Option<[u8; 32]>,
}

impl Plan {
    pub fn open(path: &Path) -> Result<Plan> {
        Self::open_with(path, &OpenOptions::default())
    }

    /// `verify_blob = false` skips hashing the weights (the header is always checked).
    pub fn open_opts(path: &Path, verify_blob: bool) -> Result<Plan> {
        Self::open_with(path, &OpenOptions { verify_blob, ..Default::default() })
    }

    pub fn open_with(path: &Path, opts: &OpenOptions) -> Result<Plan> {
        let verify_blob = opts.verify_blob;
        let perr = |msg: String| RuntimeError::Plan { path: path.to_path_buf(), msg };
        let f = std::fs::File::open(path).map_err(|source| RuntimeError::Io { path: path.to_path_buf(), source })?;
        // SAFETY: read-only mapping; the plan is not modified while loaded.
        let map = unsafe { Mmap::map(&f) }.map_err(|source| RuntimeError::Io { path: path.to_path_buf(), source })?;
        let ParsedPlan { header, blob_offset, blob_len, signer } = parse_plan_bytes(path, &map, opts)?;
        let mut index = std::collections::HashMap::new();
        for (i, e) in header.weights.tensors.iter().enumerate() {
            let dt: DType = e.dtype.parse().map_err(|m: String| perr(format!("weight `{}`: {m}", e.name)))?;
            // (validate bounded the product)
            let numel: usize = e.shape.iter().product();
            let limit = match e.file {
                Some(f) => header.weights.files.get(f).map(|s| s.len).ok_or_else(|| perr(format!("weight `{}` names source file {f}, which the plan does not list", e.name)))? as usize,
                None => blob_len,
            };
            if dt.bytes_for(numel) != Some(e.nbytes as usize) || (e.seeded.is_none() && e.offset.checked_add(e.nbytes).is_none_or(|end| end as usize > limit)) {
                return Err(perr(format!("weight `{}`: {} bytes at {} do not fit its {}{:?} or the blob", e.name, e.nbytes, e.offset, e.dtype, e.shape)));
            }
            index.insert(e.name.clone(), i);
        }
        let generated = header.weights.tensors.iter().filter(|e| e.seeded.is_some()).map(|e| (e.name.clone(), std::sync::OnceLock::new())).collect();
        let mut sources = vec![];
        for sf in &header.weights.files {
            let name = source_file_name(&sf.path).map_err(&perr)?;
            let dir = opts.weights_dir.clone().unwrap_or_else(|| path.parent().map(Path::to_path_buf).unwrap_or_default());
            let found = dir.join(name);
            if !found.is_file() {
                return Err(perr(format!(
                    "referenced weights file `{name}` is missing from {} (--weights-dir names another directory)",
                    if dir.as_os_str().is_empty() { ".".into() } else { dir.display().to_string() }
                )));
            }
            let f = std::fs::File::open(&found).map_err(|source| RuntimeError::Io { path: found.clone(), source })?;
            // SAFETY: read-only mapping of a checkpoint we do not modify.
            let m = unsafe { Mmap::map(&f) }.map_err(|source| RuntimeError::Io { path: found.clone(), source })?;
            if m.len() as u64 != sf.len {
                return Err(perr(format!("referenced weights file {} is not the file the plan was compiled from (size differs)", found.display())));
            }
            if verify_blob {
                let got = format!("{:x}", Sha256::digest(&m[..]));
                if got != sf.sha256 {
                    return Err(perr(format!("referenced weights file {} has sha256 {got}, the plan expects {}", found.display(), sf.sha256)));
                }
            }
            sources.push(m);
        }
        Ok(Plan { path: path.to_path_buf(), header, map, blob_offset, blob_len, index, generated, sources, signer })
    }

    /// A weight's entry by name.
    pub fn entry(&self, name: &str) -> Option<&WeightEntry> {
        self.index.get(name).map(|&i| &self.header.weights.tensors[i])
    }

    pub fn graph(&self) -> Result<dsc_ir::Graph> {
        dsc_ir::text::parse(&self.header.graph).map_err(|e| RuntimeError::Plan { path: self.path.clone(), msg: format!("graph: {e}") })
    }

    /// A weight's bytes; seeded weights are generated (once) on the CPU.
    pub fn weight_bytes(&self, e: &WeightEntry) -> &[u8] {
        if let Some(sw) = &e.seeded {
            let cell = &self.generated[&e.name];
            return cell.get_or_init(|| {
                let numel: usize = e.shape.iter().product();
                let v = dsc_ir::seeded::values(sw.seed, &e.name, numel, sw.scale, sw.ones);
                e.dtype.parse::<DType>().ok().and_then(|d| dsc_ir::quant::encode(d, &v)).unwrap_or_default()
            });
        }
        if let Some(f) = e.file {
            return &self.sources[f][e.offset as usize..(e.offset + e.nbytes) as usize];
        }
        let s = self.blob_offset + e.offset as usize;
        &self.map[s..s + e.nbytes as usize]
    }

    pub fn blob_len(&self) -> usize {
        self.blob_len
    }
}

/// The weights one tensor-parallel rank runs with: its slices of the plan's full tensors
/// (replicated tensors are read from the plan as they are).
pub struct RankWeights<'p> {
    plan: &'p Plan,
    cut: HashMap<String, (DType, Vec<usize>, Vec<u8>)>,
}

impl Plan {
    /// Which slice of weight `e` rank `rank` of `world` holds when the graph declares
    /// `local` for it (None: the whole tensor).
    pub fn shard_for(&self, e: &WeightEntry, local: &[usize], rank: usize, world: usize) -> Result<Option<dsc_ir::shard::Shard>> {
        dsc_ir::shard::shard_of(&e.shape, local, rank, world).map_err(|m| RuntimeError::Plan { path: self.path.clone(), msg: format!("weight `{}`: {m}", e.name) })
    }

    /// Rank `rank`'s weights for `graph` (the plan's partitioned graph).
    pub fn rank_weights(&self, graph: &dsc_ir::Graph, rank: usize, world: usize) -> Result<RankWeights<'_>> {
        let mut cut = HashMap::new();
        for id in graph.leaves(&dsc_ir::Op::Weight) {
            let n = graph.node(id);
            let e = self.entry(&n.name).ok_or_else(|| RuntimeError::Plan { path: self.path.clone(), msg: format!("weight `{}` is not in the plan", n.name) })?;
            let local: Vec<usize> = n.ty.shape.iter().map(|d| d.as_const().unwrap_or(0)).collect();
            if let Some(s) = self.shard_for(e, &local, rank, world)? {
                let d: DType = e.dtype.parse().map_err(|m: String| RuntimeError::Plan { path: self.path.clone(), msg: m })?;
                let bytes = dsc_ir::shard::slice_bytes(d, &e.shape, s, self.weight_bytes(e)).map_err(|m| RuntimeError::Plan { path: self.path.clone(), msg: format!("weight `{}`: {m}", e.name) })?;
                cut.insert(n.name.clone(), (d, local, bytes));
            }
        }
        Ok(RankWeights { plan: self, cut })
    }
}

impl WeightSource for RankWeights<'_> {
    fn weight(&self, name: &str) -> Option<(DType, Vec<usize>, &[u8])> {
        match self.cut.get(name) {
            Some((d, s, b)) => Some((*d, s.clone(), b.as_slice())),
            None => self.plan.weight(name),
        }
    }
}

impl WeightSource for Plan {
    fn weight(&self, name: &str) -> Option<(DType, Vec<usize>, &[u8])> {
        let e = self.entry(name)?;
        Some((e.dtype.parse().ok()?, e.shape.clone(), self.weight_bytes(e)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn each_row_count_gets_the_kernel_meant_for_it() {
        let alt = |kernel: &str, min_rows: i64, max_rows: Option<i64>| GpuLarge {
            min_rows,
            max_rows,
            args: None,
            rows_per_block: 1,
            threads: None,
            smem: None,
            carveout: false,
            kernel: kernel.into(),
            scalars: vec![],
            launch: LaunchKind::OutputsPerBlock,
            block: 1,
            work: Scalar::Const(1),
            grid_y: Scalar::Const(1),
            cluster: None,
        };
        let step = GpuStep {
            node: "y".into(),
            kernel: Some("gemv".into()),
            args: vec![],
            scalars: vec![],
            launch: LaunchKind::OutputsPerBlock,
            block: 4,
            threads: Some(128),
            work: Scalar::Const(1),
            grid_y: Scalar::Const(1),
            alias_of: None,
            alias_offset: None,
            min_rows: None,
            max_rows: None,
            min_context: None,
            max_context: None,
            hopper_only: false,
            hopper_skip: None,
            large: Some(alt("mma", 16, None)),
            hopper: vec![alt("pipe64", 32, Some(64)), alt("wgmma64", 128, None)],
            hopper_small: Some(alt("wgmma16", 2, None)),
            few: vec![alt("few", 2, Some(15)), alt("few16", 16, Some(128))],
            collective: None,
            cluster: None,
            argmax: None,
        };
        let pick = |rows, hopper| step.alternative(rows, hopper).map(|l| l.kernel.as_str());
        // one row: the GEMV everywhere
        assert_eq!(pick(1, true), None);
        assert_eq!(pick(1, false), None);
        // batched decode: the batched GEMVs on any target, each in its rows, up to the max
        assert_eq!(pick(2, true), Some("few"));
        assert_eq!(pick(15, false), Some("few"));
        assert_eq!(pick(16, false), Some("few16"));
        assert_eq!(pick(127, true), Some("few16"));
        assert_eq!(pick(128, false), Some("few16"));
        // the Hopper matmuls in their rows, ahead of the batched GEMV; mma.sync past the GEMV
        assert_eq!(pick(32, true), Some("pipe64"));
        assert_eq!(pick(64, true), Some("pipe64"));
        assert_eq!(pick(65, true), Some("few16"));
        assert_eq!(pick(32, false), Some("few16"));
        assert_eq!(pick(128, true), Some("wgmma64"));
        assert_eq!(pick(129, true), Some("wgmma64"));
        assert_eq!(pick(129, false), Some("mma"));
        // without batched GEMVs: wgmma16 below wgmma64's rows, mma.sync from 16, else GEMV
        let no_few = GpuStep { few: vec![], ..step.clone() };
        let pick = |rows, hopper| no_few.alternative(rows, hopper).map(|l| l.kernel.as_str());
        assert_eq!(pick(8, true), Some("wgmma16"));
        assert_eq!(pick(8, false), None);
        assert_eq!(pick(16, false), Some("mma"));
        // a step with a row range runs only inside it (the split attention's merge)
        let merge = GpuStep { min_rows: Some(2), max_rows: Some(128), ..step.clone() };
        assert!(!merge.runs_at(1) && merge.runs_at(2) && merge.runs_at(128) && !merge.runs_at(129));
        assert!(step.runs_at(1) && step.runs_at(i64::MAX));
        // on Hopper a step skips the rows an earlier step's epilogue computes it for (the
        // silu_mul after the SwiGLU gate/up matmul); elsewhere it runs; a Hopper-only step
        // runs only there
        let silu = GpuStep { min_rows: Some(2), hopper_skip: Some((32, 64)), ..step.clone() };
        assert!(silu.runs_on(31, true) && !silu.runs_on(32, true) && !silu.runs_on(64, true) && silu.runs_on(65, true));
        assert!(silu.runs_on(32, false) && !silu.runs_on(1, false) && !silu.runs_on(1, true));
        let reduce = GpuStep { hopper_only: true, ..step.clone() };
        assert!(reduce.runs_on(32, true) && !reduce.runs_on(32, false));
        // context classes: the one-pass attention below 512 keys, the split one from 512
        let one = GpuStep { max_context: Some(511), ..step.clone() };
        let split = GpuStep { min_context: Some(512), ..step.clone() };
        assert!(one.runs_in_context(1) && one.runs_in_context(511) && !one.runs_in_context(512));
        assert!(!split.runs_in_context(511) && split.runs_in_context(512) && split.runs_in_context(1 << 20));
        let prog = GpuProgram {
            ptx: Default::default(),
            steps: vec![step.clone(), one, split.clone(), split],
            buffers: vec![],
            argmax: None,
            argmax_block: None,
            argmax_split: None,
            argmax_cluster: None,
            codegen_options: None,
        };
        assert_eq!(prog.context_bounds(), [512]);
        assert_eq!(prog.context_class(1), (0, 0));
        assert_eq!(prog.context_class(511), (0, 0));
        assert_eq!(prog.context_class(512), (1, 512));
        assert_eq!(prog.context_class(9000), (1, 512));
        assert_eq!((prog.launches_at(1, 100), prog.launches_at(1, 600)), (2, 3));
    }

    #[test]
    fn derived_buffers_name_their_role_and_base_node() {
        use BufferRef as B;
        let p = |n| BufferRef::parse(n).unwrap();
        assert_eq!(p("model.norm"), B::Node("model.norm"));
        assert_eq!(p("model.norm@bf16"), B::Half { node: "model.norm", f16: false });
        assert_eq!(p("x@f16"), B::Half { node: "x", f16: true });
        assert_eq!(p("layers.0.attn@split16"), B::SplitParts { node: "layers.0.attn", parts: 16 });
        assert_eq!(p("layers.0.mlp.down_proj@splitk4"), B::SplitK { node: "layers.0.mlp.down_proj", parts: 4 });
        assert_eq!(p("model.layers.1.mlp.experts@rows8448"), B::RowScratch { node: "model.layers.1.mlp.experts", width: 8448 });
        assert_eq!(p("model.layers.1.mlp.gate.mask.row@counts"), B::Counts { of: "model.layers.1.mlp.gate.mask.row" });
        assert_eq!(p("model.layers.0.mlp.down_proj.weight@tmap128"), B::WeightMap { weight: "model.layers.0.mlp.down_proj.weight", rows: 128 });
        assert_eq!(p("model.layers.0.attn.k_cache.write@kvmap16"), B::PoolMap { pool: "model.layers.0.attn.k_cache.write", rows: 16 });
        assert_eq!(p("layers.0.attn@sync"), B::Sync { node: "layers.0.attn" });
        // a warp-specialized matmul's x map: of the 16-bit copy, whose node is the base
        assert_eq!(p("model.layers.0.input_layernorm@bf16@xmap128"), B::ActivationMap { x: "model.layers.0.input_layernorm@bf16", rows: 128 });
        assert_eq!(p("h@bf16@xmap64").node(), "h");
        assert_eq!(p("w@tmap56").node(), "w");
        // malformed or unknown tags are errors naming the buffer
        for bad in ["a@split", "a@splitx", "a@splitkx", "w@tmap", "kc@kvmap", "h@bf16@xmapx", "x@nope", "@bf16", "a@split-1"] {
            let e = BufferRef::parse(bad).unwrap_err();
            assert!(e.contains(&format!("buffer `{bad}`")), "{e}");
        }
    }

    #[test]
    fn plans_without_the_argmax_block_keep_the_warp_per_row_launch() {
        // (a session-7 plan's GPU program has no `argmax_block`: it deserializes as None)
        let prog: GpuProgram = serde_json::from_str(r#"{"ptx": {}, "steps": [], "buffers": [], "argmax": "argmax_d49152"}"#).unwrap();
        assert_eq!((prog.argmax.as_deref(), prog.argmax_block), (Some("argmax_d49152"), None));
        let prog: GpuProgram = serde_json::from_str(r#"{"ptx": {}, "steps": [], "buffers": [], "argmax": "argmax_d49152", "argmax_block": 512}"#).unwrap();
        assert_eq!(prog.argmax_block, Some(512));
        // (plans before session 18 have no split argmax: the block per row stays)
        assert_eq!(prog.argmax_split, None);
        let split = ArgmaxSplit { kernel: "argmax_split24_d49152".into(), splits: 24, threads: 256 };
        let text = serde_json::to_string(&GpuProgram { argmax_split: Some(split.clone()), ..prog }).unwrap();
        assert!(text.contains("\"splits\":24"), "{text}");
        assert_eq!(serde_json::from_str::<GpuProgram>(&text).unwrap().argmax_split, Some(split.clone()));
        assert_eq!(serde_json::from_str::<GpuProgram>(&text).unwrap().argmax_cluster, None);
        let cl = ArgmaxSplit { kernel: "argmax_c8_d49152".into(), splits: 8, threads: 512 };
        let prog: GpuProgram = serde_json::from_str(&text).unwrap();
        let text = serde_json::to_string(&GpuProgram { argmax_cluster: Some(cl.clone()), ..prog }).unwrap();
        assert_eq!(serde_json::from_str::<GpuProgram>(&text).unwrap().argmax_cluster, Some(cl));
    }

    #[test]
    fn a_step_in_clusters_says_so_and_older_steps_take_none() {
        let json = r#"{"node": "a", "kernel": "k", "args": [], "scalars": [], "launch": "block_per_row", "block": 16, "work": {"const": 1}, "grid_y": {"const": 36}, "alias_of": null}"#;
        let old: GpuStep = serde_json::from_str(json).unwrap();
        assert_eq!(old.cluster, None);
        let with = GpuStep { cluster: Some(4), ..old };
        let text = serde_json::to_string(&with).unwrap();
        assert!(text.contains("\"cluster\":4"), "{text}");
        assert_eq!(serde_json::from_str::<GpuStep>(&text).unwrap().cluster, Some(4));
    }

    #[test]
    fn placement_never_overlaps_live_buffers_and_reuses_dead_ones() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for _ in 0..200 {
            let n = rng.random_range(1..40);
            let lives: Vec<BufferLife> = (0..n)
                .map(|i| {
                    let first = rng.random_range(0..30);
                    BufferLife { node: format!("b{i}"), first, last: first + rng.random_range(0..6) }
                })
                .collect();
            let sizes: Vec<usize> = (0..n).map(|_| rng.random_range(1..5000)).collect();
            let (off, total) = place_buffers(&lives, &sizes);
            for i in 0..n {
                assert!(off[i] % 256 == 0 && off[i] + sizes[i] <= total);
                for j in 0..i {
                    let overlap_t = lives[i].first <= lives[j].last && lives[j].first <= lives[i].last;
                    let overlap_m = off[i] < off[j] + sizes[j] && off[j] < off[i] + sizes[i];
                    assert!(!(overlap_t && overlap_m), "buffers {i} and {j} are live together and share bytes");
                }
            }
            assert!(total <= sizes.iter().map(|s| s.div_ceil(256) * 256).sum::<usize>());
        }
        // a chain a -> b -> c: c can take a's place
        let lives = vec![BufferLife { node: "a".into(), first: 0, last: 1 }, BufferLife { node: "b".into(), first: 1, last: 2 }, BufferLife { node: "c".into(), first: 2, last: 3 }];
        let (off, total) = place_buffers(&lives, &[1024, 1024, 1024]);
        assert_eq!((off[0], off[2], total), (0, 0, 2048));
    }
}
