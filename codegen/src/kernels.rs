//! Kernel generators: each emits one `gpu.func` in MLIR text, specialised to its shapes
//! (the kernel cache keys on the spec, so identical layers share one kernel).
//!
//! Calling convention: global pointers (`!llvm.ptr<1>`) for tensors, in operand order, then
//! the output, then i64 scalars. [`Launch`] says how the runtime sizes the grid.

use crate::options::KernelOptions;
use dsc_ir::{BinaryOp, DType, UnaryOp};
use std::fmt::Write;

/// How to size a launch from the runtime's element/row counts.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Launch {
    /// one thread per element: block `threads`, grid ceil(n / threads); scalar param `n`
    PerElement { threads: u32 },
    /// one warp per row, `rows_per_block` warps per block; scalar param `rows`
    WarpPerRow { rows_per_block: u32 },
    /// matmul: one warp per output element; grid (ceil(N / warps), M)
    WarpPerOutput { warps_per_block: u32 },
    /// one block of `warps` warps per row; scalar param `rows`
    BlockPerRow { warps: u32 },
    /// tensor-core matmul: one warp per 16x8 output tile; grid (ceil(N / (8 warps)),
    /// ceil(M / 16))
    WarpPerTile { warps_per_block: u32 },
    /// Hopper matmul: one warpgroup (128 threads) per 64 x n_tile output tile; grid
    /// (ceil(N / n_tile), ceil(M / 64))
    WarpgroupPerTile { n_tile: u32 },
    /// decode GEMV: `outputs` outputs of `rows` rows per block of `warps` warps that split K;
    /// grid (ceil(N / outputs), ceil(M / rows))
    OutputsPerBlock { outputs: u32, rows: u32, warps: u32 },
    /// tiled matmul with dynamic shared memory: a block of `threads` per `rows` x `outputs`
    /// output tile; grid (ceil(N / outputs), ceil(M / rows)), `smem` bytes of dynamic shared
    /// memory (the runtime raises the kernel's limit past 48 KB)
    Tile { outputs: u32, rows: u32, threads: u32, smem: u32 },
}

/// Warps per block of the plain-float GEMV (the runtime launches 32 x this many threads for
/// `outputs_per_block` steps).
pub const GEMV_WARPS: usize = 4;

/// (warps per block, K steps unrolled) of the tensor-core batched GEMV.
pub fn gemv_mma_tiling() -> (usize, usize) {
    let (w, u, _) = gemv_mma_tiling3();
    (w, u)
}

/// (warps per block, K steps unrolled, 16-row A tiles per block) of the tensor-core batched
/// GEMV. (The emitter takes A > 1 — each block computing 16·A outputs, reusing every
/// activation fragment for A tiles — but no plan does: never measured better; the sweep knob
/// went with the environment variables.)
pub fn gemv_mma_tiling3() -> (usize, usize, usize) {
    // measured on the H200 (8B shape, b8/b32/b64 tok/s): (4,2) 795/1967/2998, (8,2)
    // 923/2357/2793, (4,4) 943/2092/2892, (8,4) 1034/2591/3019, (16,1) 993/2632/3044
    (8, 4, 1)
}

/// N from which a one-row GEMV counts as wide (the lm_head; [`gemv_tiling`]).
pub const GEMV_WIDE_N: usize = 16384;

/// K from which the one-row GEMV takes 8 outputs per block ([`gemv_tiling`]).
pub const GEMV_LONG_K: usize = 2048;

/// Lanes per W row of the wide GEMV (`KernelSpec::MatMulWide`): a warp takes 32 / this rows
/// at a time, each lane every this-many-th 16-byte unit of them.
pub const WIDE_LANES: usize = 8;

/// Whether the one-row GEMV over `wdtype` [N, K] weights fits the wide GEMV: 16-bit weights,
/// N ≥ [`GEMV_WIDE_N`], K a multiple of 8·[`WIDE_LANES`] with at most 12 units per lane (x's
/// share in registers: 8 floats a unit); the lowering takes it where [`wide_gemv_on`].
pub fn wide_gemv_fits(k: usize, n: usize, wdtype: DType) -> bool {
    n >= GEMV_WIDE_N && wide_gemv_kernel_fits(k, wdtype).is_ok()
}

/// Whether the wide GEMV's kernel takes `wdtype` rows of K (any N): 16-bit weights, K a
/// multiple of 8·[`WIDE_LANES`], at most 12 units per lane.
pub fn wide_gemv_kernel_fits(k: usize, wdtype: DType) -> Result<(), String> {
    if matches!(wdtype, DType::BF16 | DType::F16) && k.is_multiple_of(8 * WIDE_LANES) && k / (8 * WIDE_LANES) <= 12 {
        Ok(())
    } else {
        Err(format!("the wide GEMV takes bf16/f16 rows of K a multiple of {} up to {}, not K = {k}, {wdtype}", 8 * WIDE_LANES, 96 * WIDE_LANES))
    }
}

/// The wide GEMV's schedule: (row groups per warp, 16-byte units per lane loaded ahead of the
/// one being summed).
pub fn wide_tiling() -> (usize, usize) {
    (8, 12)
}

/// Outputs (W rows) one block of the wide GEMV covers.
pub fn wide_outputs() -> usize {
    GEMV_WARPS * (32 / WIDE_LANES) * wide_tiling().0
}

/// The plain-float GEMV's tiling for a [N, K] weight: (outputs per block, chunk rounds
/// unrolled per loop iteration). Several outputs per block reuse each activation load; the
/// unroll keeps several 16-byte loads per lane in flight.
pub fn gemv_tiling(k: usize, n: usize, rows: usize) -> (usize, usize) {
    if rows == 1 && k >= GEMV_LONG_K && n % 64 == 0 {
        // long rows (the 8B shape): 8 outputs, 2 chunks per loop iteration — half the blocks
        // of (4, 4), the same loads in flight per thread; measured on the H200 (8B b1,
        // bench/results/gemv-tiling-2026-11-30.json): 238 -> 250 tok/s, every GEMV faster
        (8, 2)
    } else if rows == 1 {
        (4, 4)
    } else {
        (8, 1)
    }
}

/// Decode GEMVs over at most this many weight bytes prefetch their rows into L2 before
/// `griddepcontrol.wait` (see `emit_gemv`).
pub const GEMV_PREFETCH_MAX_BYTES: usize = 16 << 20;

/// RMSNorm rows that one block covers in a single pass, 16 bytes per thread per piece kept in
/// registers: (warps, pieces per thread), the most warps (up to 32) whose threads split the
/// row's 16-byte pieces evenly, at most 4 pieces each (d = 4096: 32 warps x 1; 8192: 32 x 2).
/// None: the looping kernel (e.g. d = 576, whose 144 pieces no multiple of 32 divides).
pub fn rms_norm_regs(d: usize) -> Option<(usize, usize)> {
    if d % 4 != 0 {
        return None;
    }
    let pieces = d / 4;
    (1..=32usize).rev().find(|w| pieces % (32 * w) == 0 && pieces / (32 * w) <= 4).map(|w| (w, pieces / (32 * w)))
}

/// The loop values of a block-per-row kernel over 4-float row pieces ([`Body::open_row_pieces`]):
/// thread index, its first piece's column (t·4), the row width, the loop step (4 per thread),
/// the row's first element, f32 zero, i64 4, the `%red` memref type.
#[derive(Clone)]
struct RowPieces {
    t: String,
    t4: String,
    dd: String,
    step: String,
    base: String,
    zero: String,
    c4b: String,
    smt: String,
}

/// Whether an RMSNorm kernel also writes a 16-bit copy (`Some(f16)`).
fn rms_half(spec: &KernelSpec) -> Option<bool> {
    match spec {
        KernelSpec::RmsNormHalf { f16, .. } => Some(*f16),
        _ => None,
    }
}

/// The RMSNorm kernels' parameters (with the 16-bit copy's pointer after y).
fn rms_norm_params(half: Option<bool>) -> String {
    format!("%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %y: !llvm.ptr<1>, {}%rows: i64", if half.is_some() { "%yh: !llvm.ptr<1>, " } else { "" })
}

/// Warps of the split-K reduce + RMSNorm kernel's block: 32, a row of d = 4096 one 16-byte
/// piece per thread, all its partial sums' loads in flight at once (8 warps, 4 pieces per
/// thread, made the fold lose; bench/results/swiglu-splitk-norm-2026-11-30.json).
pub const SPLITK_NORM_WARPS: usize = 32;

/// The split-K reduce + RMSNorm kernel's parameters.
fn splitk_norm_params(residual: bool, half: Option<bool>) -> String {
    format!(
        "%parts: !llvm.ptr<1>, {}%y: !llvm.ptr<1>, %g: !llvm.ptr<1>, %xn: !llvm.ptr<1>, {}%rows: i64",
        if residual { "%res: !llvm.ptr<1>, " } else { "" },
        if half.is_some() { "%xh: !llvm.ptr<1>, " } else { "" }
    )
}

/// Blocks per row of the split-K reduce + RMSNorm on sm_90a ([`KernelSpec::SplitKReduceNorm`]'s
/// `cluster`) for rows of `d` floats: a thread-block cluster of c blocks, block r taking the
/// row's columns [r·d/c, (r+1)·d/c) as one 4-float piece per thread, so a row's loads spread
/// over c SMs instead of one (the 8B shape's b32 step ran 63 of these kernels at 5.4 µs, 32
/// blocks on 132 SMs, latency-bound). `want`: [`SPLITK_NORM_CLUSTER`] unless the options
/// ask for another ([`crate::options::ScheduleOptions::splitk_norm_cluster`]); 1 where d is
/// not a multiple of 128·c (whole warps) or a block would pass 1024 threads.
/// (Only the sm_90a split-K alternatives take it: those kernels alone read the parts.)
pub fn splitk_norm_cluster(d: usize, want: Option<usize>) -> usize {
    let c = want.unwrap_or(SPLITK_NORM_CLUSTER);
    if c > 1 && d % (128 * c) == 0 && d / 4 / c <= 1024 {
        c
    } else {
        1
    }
}

/// The default of [`splitk_norm_cluster`]: 8 — the 8B shape's b32 7,018-7,028 -> 7,208-7,209
/// tok/s (4: 7,178-7,180), b8 and b128 unchanged, greedy streams equal
/// (bench/results/session20-2026-12-01.json).
pub const SPLITK_NORM_CLUSTER: usize = 8;

/// Warps of the argmax kernel's block (one block per row of a width that is a multiple of 4:
/// a row of 128,256 logits is 63 16-byte loads per thread, [`ARGMAX_UNROLL`] in flight).
pub const ARGMAX_WARPS: usize = 16;
/// 16-byte loads each thread of the argmax kernel issues before comparing them.
pub const ARGMAX_UNROLL: usize = 4;
/// Warps of a split argmax block ([`KernelSpec::ArgmaxSplit`]).
pub const ARGMAX_SPLIT_WARPS: usize = 8;
/// 16-byte pieces of a row each split argmax block takes (two per thread).
pub const ARGMAX_SPLIT_PIECES: usize = 2 * 32 * ARGMAX_SPLIT_WARPS;

/// Warps of a cluster argmax block ([`KernelSpec::ArgmaxCluster`]).
pub const ARGMAX_CLUSTER_WARPS: usize = 16;
/// Blocks per row of the cluster argmax (a portable cluster size).
pub const ARGMAX_CLUSTER_BLOCKS: usize = 8;

/// Blocks per row of the split argmax over rows of `d` floats (None: one block per row, d not
/// a multiple of 4, or a row one block's pieces already cover); at most 64 (a warp's two
/// partials per lane in the last block's reduction).
pub fn argmax_splits(d: usize) -> Option<usize> {
    if d % 4 != 0 {
        return None;
    }
    Some((d / 4).div_ceil(ARGMAX_SPLIT_PIECES)).filter(|&s| (2..=64).contains(&s))
}

/// Keys each warp of the decode attention kernel takes per loop step (the default of
/// [`crate::options::ScheduleOptions::attn_keys`]).
pub const ATTN_KEYS: usize = 4;

/// Activation rows per block of the batched-decode GEMV (`MatMulFew`) on the CUDA cores
/// (f32 weights).
pub const GEMV_FEW_ROWS: usize = 8;
/// Activation rows per block of the tensor-core batched GEMV (`MatMulFew`, bf16/f16 weights):
/// four 8-column B tiles of `mma.m16n8k16`, 16 outputs per block.
pub const GEMV_MMA_ROWS: usize = 32;

/// Activation rows per block `MatMulFew` uses for weights of `wdtype`.
pub fn few_rows(wdtype: DType) -> usize {
    if matches!(wdtype, DType::BF16 | DType::F16) {
        GEMV_MMA_ROWS
    } else {
        GEMV_FEW_ROWS
    }
}

impl KernelSpec {
    /// The matmul kernel under the wrappers that reshape its grid or arguments but not its
    /// tile (`SplitK`, `MatMulParts`, `MatMulAct`, `Tma`), and the part widths of a merged
    /// matmul among them (its weight params: one per part).
    pub fn matmul_core(&self) -> (&KernelSpec, Option<&[usize]>) {
        let (mut k, mut parts) = (self, None);
        while let KernelSpec::SplitK { inner, .. } | KernelSpec::MatMulParts { inner, .. } | KernelSpec::MatMulAct { inner, .. } | KernelSpec::Tma { inner } | KernelSpec::Ws { inner } = k {
            if let KernelSpec::MatMulParts { parts: p, .. } = k {
                parts = Some(p.as_slice());
            }
            k = inner.as_ref();
        }
        (k, parts)
    }

    /// [`KernelSpec::matmul_core`], also under the SwiGLU epilogue (`SwiGluPipe`): the kernel
    /// whose tiles a warp-specialized wrapper loads
    pub fn pipe_core(&self) -> &KernelSpec {
        match self {
            KernelSpec::SwiGluPipe { inner } => inner.as_ref(),
            other => other.matmul_core().0,
        }
    }

    /// Blocks per thread-block cluster along grid y the kernel is launched with on sm_90a
    /// (`QkvAttentionO`: a head's blocks share q, k and v through distributed shared memory);
    /// None: no cluster.
    pub fn cluster(&self) -> Option<u32> {
        match self {
            KernelSpec::QkvAttentionO { cluster, .. } if *cluster > 1 => Some(*cluster as u32),
            KernelSpec::SplitKReduceNorm { cluster, .. } if *cluster > 1 => Some(*cluster as u32),
            KernelSpec::PrefetchL2 { inner } => inner.cluster(),
            _ => None,
        }
    }

    /// The fused one-token MLP (`SwiGluDown`), also where it zeroes accumulators (`ZeroFill`).
    pub fn is_fused_mlp(&self) -> bool {
        match self {
            KernelSpec::SwiGluDown { .. } => true,
            KernelSpec::ZeroFill { inner, .. } => inner.is_fused_mlp(),
            _ => false,
        }
    }

    /// Kernels only sm_90a can run (they go into that target's PTX alone).
    pub fn hopper_only(&self) -> bool {
        match self {
            KernelSpec::MatMulParts { inner, .. }
            | KernelSpec::NormMatMul { inner, .. }
            | KernelSpec::MatMulAct { inner, .. }
            | KernelSpec::SplitK { inner, .. }
            | KernelSpec::PrefetchL2 { inner }
            | KernelSpec::SwiGluPipe { inner }
            | KernelSpec::RopeAttention { inner, .. }
            | KernelSpec::AttentionO { inner, .. }
            | KernelSpec::QkvAttentionO { inner, .. }
            | KernelSpec::ZeroFill { inner, .. }
            | KernelSpec::RowGather { inner }
            | KernelSpec::ArgmaxFold { inner }
            | KernelSpec::GatherX { inner } => inner.hopper_only(),
            // (it reads the partial sums that only the Hopper split-K alternative writes)
            KernelSpec::Tma { .. } | KernelSpec::Ws { .. } | KernelSpec::FlashWgmma { .. } | KernelSpec::QkvRopeSplitK { .. } | KernelSpec::ArgmaxCluster { .. } => true,
            KernelSpec::SplitKReduceNorm { cluster, .. } if *cluster > 1 => true,
            other => matches!(other, KernelSpec::MatMulWgmma { .. } | KernelSpec::MatMulPipe { .. }),
        }
    }
}

/// A kernel to generate.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KernelSpec {
    /// y[i] = op(x[i]), f32
    Unary(UnaryOpKey),
    /// y[i] = op(a[i], b[i % nb]), f32 (b broadcast over leading dims); params a, b, y, n, nb
    Binary(BinaryOpKey),
    /// y = x / sqrt(mean(x^2) + eps) * w over rows of `d`, f32
    RmsNorm { d: usize, eps_bits: u32 },
    /// `RmsNorm` that also writes its output rounded to bf16 (`f16`: f16) into yh (norm +
    /// quantize: the 16-bit copy the batched GEMV and the prefill matmul read, without a cast
    /// step); D a multiple of 4; params x, w, y, yh, rows
    RmsNormHalf { d: usize, eps_bits: u32, f16: bool },
    /// y[M, N] = x[M, K] (f32) @ W[N, K]^T (+ bias[N]), W stored as `wdtype`
    /// (f32/f16/bf16/q8_0/q4_0/q4_1) (+ res[M, N]: the residual add as the epilogue): the
    /// decode GEMV, one x row per block row. Plain floats: [`emit_gemv`]'s coalesced
    /// split-K blocks (`OutputsPerBlock`); block-quantized: a warp per output, a lane per
    /// 32-element block. params x, w, [bias], [res], y, N
    MatMul { k: usize, n: usize, wdtype: DType, bias: bool, residual: bool },
    /// `MatMul` for many short bf16/f16 rows (the lm_head of a small model: N ≥
    /// [`GEMV_WIDE_N`], K/64 ≤ 12, [`wide_gemv_fits`]): [`emit_gemv_wide`]'s blocks of
    /// [`GEMV_WARPS`] warps, [`WIDE_LANES`] lanes per W row, x kept in registers across a
    /// warp's rows, the next rows' weights loaded while the current ones are summed. Also
    /// under `NormMatMul` (and `RowGather`): the final norm (and the logits' row gather)
    /// folded in. params as `MatMul`'s
    MatMulWide { k: usize, n: usize, wdtype: DType, bias: bool, residual: bool },
    /// y[T, D] (f32) = table[idx[t], :] dequantized; params table, idx (i32), y, T*D
    Gather { d: usize, dtype: DType },
    /// rotary embedding of x[T, H, D] at pos[T] (i32), out of place; params x, pos, y, T*H*D/2
    Rope { h: usize, d: usize, theta_bits: u32, interleaved: bool },
    /// cache[slot[t], :] = x[t, :] for rows of `row` floats, in place; params x, slots (i32),
    /// cache, T*row
    CacheWrite { row: usize, kv: DType },
    /// cache[slot[t], :] = rope(x, pos)[t, :] (x[T, H, D]): `Rope` writing straight into the
    /// KV pool (the optimizer's rope-cache-write fusion); params x, pos (i32), slots (i32),
    /// cache, T*H*D/2
    RopeCacheWrite { h: usize, d: usize, theta_bits: u32, interleaved: bool, kv: DType },
    /// the three users of a merged Q/K/V matmul in one kernel: q[T, H, D] rotated into y,
    /// k[T, KVH, D] rotated into the K pool rows slots[t], v[T, KVH, D] copied into the V pool
    /// (a lowering-level fusion of `rope`, `rope_cache_write` and `cache_write`); one thread
    /// per (q or k) rotation pair or per pair of v elements; params xq, xk, xv, pos, slots,
    /// k_cache, v_cache, y, then n (all items), nq (q pairs), nk (k pairs)
    QkvRopeCache { h: usize, kvh: usize, d: usize, theta_bits: u32, interleaved: bool, kv: DType },
    /// causal attention of q[T, H, D] over the paged cache (see `Op::PagedAttention`); one block
    /// per (token, `group` query heads of one KV head) — grid x = T, y = H / group — over the
    /// same K/V rows (group = H / KVH: each K/V row read once for the GQA group; group = 1: a
    /// block per (token, head), more blocks), whose `warps` warps split the keys (online
    /// softmax each, combined in shared memory), each warp taking `keys` consecutive keys per
    /// loop step (their K and V rows loaded together: more loads in flight); params q,
    /// k_cache, v_cache, pos, seq, table, out, T*H, MB
    PagedAttention { h: usize, kvh: usize, d: usize, bs: usize, scale_bits: u32, warps: usize, keys: usize, group: usize, kv: DType },
    /// the first pass of the split decode attention (long contexts): `PagedAttention`'s block
    /// for (token, `group` heads, s), grid y = H / group · `splits` (y = head group · splits +
    /// s), taking part s of se = min(ceil(ctx / min_keys),
    /// splits) equal parts of the row's keys and writing its partial softmax state (m, l,
    /// acc[D]) to part[(row·splits + s)·(D + 2)..]; params as `PagedAttention` with the
    /// partial states in place of out
    PagedAttentionSplit { h: usize, kvh: usize, d: usize, bs: usize, scale_bits: u32, warps: usize, keys: usize, splits: usize, min_keys: usize, group: usize, kv: DType },
    /// the second pass: out[row] from the row's partial states; a warp per row; params part,
    /// pos, out, n (rows = T·H)
    AttentionCombine { h: usize, d: usize, splits: usize, min_keys: usize },
    /// y[M, N] = x[M, K] (f32) @ W[N, K]^T (+ bias) on the tensor cores: `mma.sync` m16n8k16,
    /// activations rounded to bf16 (f16 for f16 weights), packed weights dequantized to bf16
    /// in registers, f32 accumulation; params x, w, [bias], y, M, N
    MatMulMma { k: usize, n: usize, wdtype: DType, bias: bool, residual: bool },
    /// y[M, N] = x[M, K] (f32) @ W[N, K]^T (+ bias) with Hopper warpgroup MMA (sm_90a only):
    /// one warpgroup per 64x64 output tile, `wgmma.mma_async m64n64k16` on bf16 (f16 for f16
    /// weights) tiles staged in shared memory in the no-swizzle core-matrix layout (x rounded,
    /// packed weights dequantized on the way in), f32 accumulation in registers. Every weight
    /// is read once per 64 rows of x. `n_tile` (16 or 64) output columns per warpgroup: 16
    /// gives 4x the blocks (small M: batched decode), 64 reuses each x tile 4x (prefill).
    /// params x, w, [bias], y, M, N
    MatMulWgmma { k: usize, n: usize, wdtype: DType, bias: bool, residual: bool, n_tile: usize },
    /// y[M, N] = x[M, K] (f32) @ W[N, K]^T (+ bias) (+ res), W bf16/f16, on Hopper warpgroup
    /// MMA with a multistage `cp.async` pipeline (sm_90a only; prefill): a block of two
    /// warpgroups per 128 x `bn` tile, `stages` K steps of 64 in flight in dynamic shared
    /// memory (x as f32, W in the 128-byte-swizzled K-major layout wgmma reads through
    /// descriptors); each warpgroup converts its 64 rows of x to bf16 (f16) fragments in
    /// registers and runs `wgmma m64n{bn}k16` with A from registers. params x, w, [bias],
    /// [res], y, M, N
    /// With `overlap`, a K step's wgmmas still run while the next step's fragments load (one
    /// wgmma group left in flight; copies then run `stages` - 2 steps ahead). With `a16`, x
    /// comes in bf16 (f16 for f16 weights; a `ToHalf` step made it) and is copied into the same
    /// swizzled layout as W: both operands from shared memory, half the x bytes.
    /// With `bm` = 64 (x in 16 bits only), a block covers 64 rows x `bn` columns and each
    /// warpgroup takes half the columns (`m64n{bn/2}k16`): half the tensor work of a 128-row
    /// tile, for batched decode (16-64 rows) where the rows past M are padding.
    MatMulPipe { k: usize, n: usize, wdtype: DType, bias: bool, residual: bool, bn: usize, stages: usize, overlap: bool, a16: bool, bm: usize },
    /// y = x (f32) rounded to bf16 (`f16`: f16, saturating), 8 elements per thread; params x,
    /// y, n (elements / 8)
    ToHalf { f16: bool },
    /// `inner` (any matmul kernel) with an activation applied after the bias in its epilogue
    /// (`Op::MatMulAct`: gelu(x W1 + b1)); params as `inner`'s
    MatMulAct { inner: Box<KernelSpec>, act: UnaryOpKey },
    /// silu(x @ Wg^T) * (x @ Wu^T) for one x row (the decode GEMV of a merged gate/up matmul
    /// with the SwiGLU as its epilogue: a lowering-level fusion of `matmul_cat` + `silu_mul`):
    /// each block computes half its GEMV outputs from Wg and half from Wu, the same rows, and
    /// writes their silu_mul; params x, wg, wu, y, F (the columns of y)
    SwiGluGemv { k: usize, f: usize, wdtype: DType },
    /// `PagedAttention` for prefill (many query rows): FlashAttention-2 tiles on the tensor
    /// cores ([`emit_flash_attention`]), a block per (64 tokens, head); params as
    /// `PagedAttention` but `n` = T (tokens)
    /// (`warps` warps of 16 · `mtiles` query rows each per block: 4 warps of 16 rows from f32
    /// pools; from bf16, 4 or 8 warps, and 1 or 2 m16 tiles per warp — 2: Q staged in shared
    /// memory, each K/V fragment feeding two MMAs)
    FlashAttention { h: usize, kvh: usize, d: usize, bs: usize, scale_bits: u32, kv: DType, warps: usize, mtiles: usize },
    /// the batched-decode GEMV: as `MatMul` for f32/f16/bf16 weights, `rows` activation rows
    /// per block so each weight is read once per `rows` rows (few-row steps: batched decode);
    /// params x, w, [bias], [res], y, M, N
    MatMulFew { k: usize, n: usize, wdtype: DType, bias: bool, residual: bool, rows: usize },
    /// `MatMulFew` for bf16/f16 weights reading x in 16 bits (a `ToHalf` step's `{x}@bf16`):
    /// half the activation bytes, which bound batched decode (docs/perf.md); 32 rows per block;
    /// params as `MatMulFew`
    MatMulFewX16 { k: usize, n: usize, wdtype: DType, bias: bool, residual: bool },
    /// softmax over rows of `d` (warp per row); params x, y, rows
    Softmax { d: usize },
    /// layer norm over rows of `d` (warp per row); params x, w, b, y, rows
    /// (with `half` = Some(f16): it also writes a 16-bit copy of y, bf16 or f16, for the
    /// tensor-core matmul that reads it: norm + quantize, no cast launch; params x, w, b, y,
    /// yh, rows)
    LayerNorm { d: usize, eps_bits: u32, half: Option<bool> },
    /// index (i32) of the row maximum (first on ties), rows of `d`; params x, y, rows
    Argmax { d: usize },
    /// [`KernelSpec::Argmax`] over `splits` blocks per row (grid x: the splits, y: the rows;
    /// a row's 16-byte pieces [s·P, (s+1)·P) to block s, P = [`ARGMAX_SPLIT_PIECES`]): each
    /// block's (max, first index) into `%part` [rows, splits], then the block that counts last
    /// in `%sync[row]` (u32, zero before, reset by it) reduces the row's partials into y. One SM
    /// streams ~52 GB/s: a block per row read SmolLM2's 196 KB row in ~3.6 µs. params x,
    /// part, sync, y, rows
    ArgmaxSplit { d: usize, splits: usize },
    /// [`KernelSpec::Argmax`] over a thread-block cluster of `blocks` blocks per row (sm_90a:
    /// grid x the rows, y the blocks, clusters along y): block r reduces its share of the row,
    /// stores (max, first index) into block 0's shared memory (distributed shared memory), one
    /// cluster barrier, block 0 reduces the partials — no GPU-scope fence, counter or second
    /// L2 round trip (the split argmax's). params x, y, rows
    ArgmaxCluster { d: usize, blocks: usize },
    /// y = x[.., start..start+len, inner..] along an axis of size `d`; params x, y, n
    Slice { inner: usize, d: usize, start: usize, len: usize },
    /// y[r, j] = x[r, idx[r, j]] for rows of `n_in` and `k` picks; params x, idx, y, n
    TakeAlong { n_in: usize, k: usize },
    /// indices (i32) of the k largest values per row of `d`, largest first, ties by lower
    /// index (warp per row, k selection passes); params x, y, rows
    TopK { d: usize, k: usize },
    /// y = x with its axes permuted (rank <= 4); params x, y, n, then the input's dims
    Transpose { perm: Vec<usize> },
    /// y = silu(a) * b (the SwiGLU of batched steps) that also writes y's 16-bit copy (`f16`:
    /// f16, else bf16) for the down projection's readers, instead of a `ToHalf` launch;
    /// params a, b, y, yh, n, nb (b repeats every nb elements)
    SiluMulHalf { f16: bool },
    /// y = concat(x_0 .. x_{m-1}) along an axis: sizes along the axis, elements per axis step
    /// (`inner`); params x_0.., y, n
    Concat { sizes: Vec<usize>, inner: usize },
    /// merged matmuls (`Op::MatMulCat`): `inner`, a plain matmul kernel over N = sum(parts)
    /// columns, with one weight per part and the output part-major (part i: [M, N_i] at element
    /// M * (N_0 + .. + N_{i-1}), so each part is a contiguous tensor its users read in place);
    /// every block falls in one part ([`parts_fit`]). params x, w_0.., y, inner's scalars (N
    /// first), M
    MatMulParts { inner: Box<KernelSpec>, parts: Vec<usize> },
    /// the gate/up matmul of a SwiGLU MLP with h = silu(gate) · up in its epilogue: `inner`
    /// is a `MatMulPipe` over N = 2F (no bias, no residual, not split); block i takes features
    /// [bn/2 · i, bn/2 · (i + 1)), each warpgroup's wn columns of the tile being wn/2 gate rows
    /// then the same wn/2 features' up rows (two weights), so a thread holds a feature's gate
    /// and up accumulators and writes h ([M, F] f32) and its 16-bit copy. params x, w_gate,
    /// w_up, y, yh, M, F
    SwiGluPipe { inner: Box<KernelSpec> },
    /// `QkvRopeCache` (`inner`) reading q, k and v as the sums of a split-K merged Q/K/V
    /// matmul's `splits` partial-sum slices instead of the reduced node (the reduce step folded
    /// in): params as `inner`'s with `%parts` (slice 0 of the partial sums, part-major like the
    /// merged node) in place of xq, xk, xv, and after its scalars the slice's elements and q's,
    /// k's and v's element offsets in it
    QkvRopeSplitK { inner: Box<KernelSpec>, splits: usize },
    /// y = rms_norm(x, g) @ W^T with the norm in the decode GEMV's prologue (one x row per
    /// block row): `inner` is a plain-float `MatMul` (or `MatMulParts` of one); every block
    /// reads all of x anyway, so it accumulates sum(x^2) beside the dot products, multiplies x
    /// by g on load and scales its outputs by 1/rms at the end. params x, g (f32 [K]), then
    /// inner's from w on
    NormMatMul { inner: Box<KernelSpec>, eps_bits: u32 },
    /// split-K over blocks (batched decode where N has few column tiles): `inner`, the
    /// pipelined wgmma matmul without bias or residual, with each tile's K steps cut into
    /// `splits` equal parts, one block each (grid x = tiles x splits, the part the inner index:
    /// block x = tile * splits + part); part s writes its partial sums to y + s·M·N (f32), and a
    /// `SplitKReduce` step adds them up. On by default (`lower::SPLIT_K_PARTS`; DSC_SPLIT_K=0 off).
    /// params as `inner`'s, y being the partial sums [splits, M, N]. `inner` may be a
    /// `MatMulParts` of the pipelined matmul (q/k/v): each slice is then part-major like the
    /// merged output, so the reduce is the same elementwise sum
    SplitK { inner: Box<KernelSpec>, splits: usize },
    /// `inner` (the pipelined wgmma matmul, possibly inside `SplitK` / `MatMulParts` /
    /// `MatMulAct`) with its W tiles loaded by TMA: each W param is instead a pointer to a
    /// 128-byte `CUtensorMap` of that weight (bf16/f16 [N, K], box 64 x bn, 128-byte
    /// swizzle), arg `{w}@tmap{bn}`; one thread per stage issues the bulk tensor copy on
    /// the stage's mbarrier. On by default for the 128-row tiles of at most 128 columns
    /// (`lower::Tma`; checked and measured on the H200)
    Tma { inner: Box<KernelSpec> },
    /// `inner` (the pipelined wgmma matmul, x in 16 bits, possibly inside `SplitK` /
    /// `MatMulParts` / `MatMulAct` or under the SwiGLU epilogue) warp-specialized: a third warpgroup, the producer
    /// (one thread), loads x's and W's tiles by TMA into the ring of stages (a full and an
    /// empty mbarrier per stage), and the two consumer warpgroups only wait for a stage,
    /// multiply, release it and store — no block-wide barrier in the K loop, no copy work in
    /// the MMA warps (`setmaxnreg`: 232 registers for them, 40 for the producer). 384 threads.
    /// params as `inner`'s with x and each W a pointer to a `CUtensorMap`: `{x}@xmap{bm}`
    /// (box 64 x bm rows) and `{w}@tmap{bn}` (SwiGLU: `@tmap{wn/2}`, wn the columns of a
    /// warpgroup)
    Ws { inner: Box<KernelSpec> },
    /// `inner` (the prefill attention, `FlashAttention` on bf16 pools, 4 warps of one m16 tile,
    /// D = [`FLASH_WG_D`]) with both products on wgmma (sm_90a): S = Q Kᵀ as m64n64k16 with Q
    /// from registers and K's tile from shared memory (K-major, 128-byte swizzle), O += P V as
    /// m64n{D}k16 with P from registers and V's tile read N-major (transposed) from the same
    /// layout — each tile read once per warpgroup, not once per warp. params as `inner`'s
    FlashWgmma { inner: Box<KernelSpec> },
    /// `inner` (the one-pass decode attention, `PagedAttention`) taking q, k and v before
    /// RoPE — the merged Q/K/V matmul's parts — for a one-token step: each block first writes
    /// its KV head's K row (rotated) and V row into the pools at slot[t] (what `QkvRopeCache`
    /// does), then attends with q rotated as it loads it: one launch fewer per layer at batch
    /// 1 (`lower::fuse_rope_attention`). params xq, xk, xv, pos, slots, k_cache, v_cache, seq,
    /// table, out, T*H, MB
    RopeAttention { inner: Box<KernelSpec>, theta_bits: u32, interleaved: bool },
    /// A one-token [`KernelSpec::RopeAttention`] (one head per block, bf16 weights) with the o
    /// projection and its residual folded in: block h multiplies its head's output by W_o's
    /// columns of that head (N rows x D, loaded before `griddepcontrol.wait`) into a partial
    /// [H, N]; the last block of the token (a counter per token, reset by it) sums the H partials
    /// in head order + the residual into y. Params: the RoPE attention's up to `%table`, then
    /// %wo, %res, %parts, %sync (u32 counters), %out (= y [T, N]), %n, %mb
    /// With `red`: no partials and no counter — each block adds its head's projection (block
    /// of head 0: + the residual) into `%out` and `%out2` with `red.global.add` (both zeroed
    /// by an earlier kernel, `ZeroFill`; `%out2` is the fused MLP's accumulator, `SwiGluDown`).
    /// Params then: the RoPE attention's up to `%table`, %wo, %res, %out2, %out, %n, %mb
    /// With `red`, `splits` blocks per head (grid y = H · splits), block s of head h taking the
    /// N/splits rows [s·N/splits, (s+1)·N/splits) of the projection (each running the whole
    /// attention of its head: cheap at the one-pass contexts) — fewer W_o bytes per SM.
    AttentionO { inner: Box<KernelSpec>, n: usize, red: bool, splits: usize },
    /// `inner` ([`KernelSpec::AttentionO`] with `red`) computing its head's q, k and v itself:
    /// the RMSNorm of x ([T, K] f32, weight g) times the head's rows of W_q and its KV head's
    /// of W_k and W_v (bf16, no bias), instead of reading a q/k/v GEMV's output. On sm_90a the
    /// `cluster` blocks of a head (the o projection's splits, a thread-block cluster along
    /// grid y) each compute D / cluster of the head's elements of q, k and v and store them
    /// into every block's shared memory (distributed shared memory), then pass a cluster
    /// barrier; then block r takes chunk r of the context's keys and the blocks' partial
    /// softmax states meet the same way past a second barrier, each block combining them for
    /// its part of the o projection (DSC_QKV_ATTN_KEYS=whole: every block every key).
    /// Elsewhere (no clusters) every block computes all 3·D and takes every key. Params: %x,
    /// %g, %wq, %wk, %wv in place of %xq, %xk, %xv, then the rest of inner's.
    QkvAttentionO { inner: Box<KernelSpec>, k: usize, eps_bits: u32, cluster: usize },
    /// `inner` (the one-row decode GEMV with the norm prologue, or the fused MLP) that also
    /// zeroes the first `len` floats of `%z0` and `%z1` (after `griddepcontrol.wait`): the
    /// accumulators a later kernel adds into (`AttentionO` with `red`). params %z0, %z1, then
    /// inner's
    ZeroFill { inner: Box<KernelSpec>, len: usize },
    /// `inner` (the block-per-row RMSNorm: D a multiple of 4) reading its row r of x from row `%idx[r]` (i32) of `%x`: the logits' row gather folded
    /// into the final norm (one kernel less per step). params %idx, then inner's
    RowGather { inner: Box<KernelSpec> },
    /// the greedy argmax folded into the wide lm_head (`inner`: `MatMulWide` without bias or
    /// residual, maybe under `NormMatMul` and `RowGather`): besides the logits, each block's
    /// (max, first index) into `%apart`, counted in `%async[row]` (zero, and left zero); the
    /// block counting last reduces the partials into `%aids[row]` (i32). A chained multi-step
    /// graph runs it instead of the lm_head and the argmax kernel after it. params %apart,
    /// %async, %aids, then inner's
    ArgmaxFold { inner: Box<KernelSpec> },
    /// `inner` (the one-row bf16/f16 decode GEMV with the norm prologue, [`KernelSpec::NormMatMul`])
    /// taking its x as row `%tok[row]` of the bf16 table `%table` (the embedding gather folded
    /// into the first layer's q/k/v GEMV; DSC_GATHER_GEMV=0 turns it off) — and block 0
    /// writes that row as f32 into `%x` for the kernels after it (the residual). params %table,
    /// %tok, %x (written), then inner's after its %x
    GatherX { inner: Box<KernelSpec> },
    /// `inner` (the decode attention) that, on sm_90a, first prefetches a slice of another
    /// buffer into L2 — the next matmul's weights, which do not depend on any kernel — then
    /// waits for the previous kernel: the blocks of the grid split the bytes, each block's
    /// first warp issuing `cp.async.bulk.prefetch.L2` of up to 64 KiB per lane and step. The
    /// attention moves little from DRAM, so the weights stream in beside it and the matmul after
    /// it reads them from L2. params %pf (the buffer), inner's, then %pfb (its bytes; 0: none).
    /// Checked on the H200 but measured slower, so off (`lower::LowerOptions::attn_prefetch`,
    /// DSC_ATTN_PREFETCH=1)
    PrefetchL2 { inner: Box<KernelSpec> },
    /// y[i] = sum over s of parts[s·n + i] (+ res[i]): the second pass of `SplitK`; params
    /// parts, [res], y, n (elements of y)
    SplitKReduce { splits: usize, residual: bool },
    /// the split-K reduce folded into the RMSNorm that reads its output (the 8B shape's o and
    /// down projections feed the next norm): per row, y = sum over s of parts[s] (+ res),
    /// written, then xn = y / rms(y) * g (+ its 16-bit copy with `half`); a block per row, or
    /// with `cluster` > 1 (sm_90a) a thread-block cluster of that many blocks per row along
    /// grid y, their sums of squares exchanged through distributed shared memory
    /// ([`splitk_norm_cluster`]). params parts, [res], y, g, xn, [xh], rows
    SplitKReduceNorm { splits: usize, residual: bool, d: usize, eps_bits: u32, half: Option<bool>, cluster: usize },
    /// The MLP of a one-token step in one kernel (small models at batch 1, where a kernel's
    /// dependent chain, not its bytes, sets its time): RMSNorm (x, g) in the prologue, the
    /// gate/up GEMV, h = silu(gate) · up, and the down projection — block b takes the `fb`
    /// features [fb·b, fb·(b + 1)), each of its fb/fpw warps `fpw` of them (their gate and up rows over all of
    /// K, so the norm's sum of squares is the warp's own), h into shared memory, then thread
    /// t multiplies W_down's rows t + i·N/4 (i < 4) at the block's features by h and adds the
    /// four partial sums into y (`red.global.add`, one per sum): y must hold the
    /// residual before the launch (the o projection before it writes it, `MatMulCopy`). Every
    /// weight is loaded before `griddepcontrol.wait`. The order of the blocks' additions
    /// varies run to run (float sums: results may differ in the last bits). bf16 weights;
    /// grid (F / fb, rows). params x, g, wg, wu, wd, y, f (= F)
    SwiGluDown { k: usize, f: usize, n: usize, eps_bits: u32, fb: usize, fpw: usize },
    /// `inner` (the one-row plain-float decode GEMV) also storing its output into `%y2`,
    /// passed before `%y`: the o projection seeding the fused MLP's accumulator
    /// (`SwiGluDown`) with the residual stream. params inner's with %y2 before %y
    MatMulCopy { inner: Box<KernelSpec> },
    /// seeded weights generated on the device (`dsc_ir::seeded`), stored as `dtype`
    /// (f32/bf16/f16); params y, n, base, scale (f32 bits), ones
    SeededInit { dtype: DType },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnaryOpKey(pub UnaryOp);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BinaryOpKey(pub BinaryOp);

impl KernelSpec {
    /// A stable, readable symbol name.
    pub fn symbol(&self) -> String {
        match self {
            KernelSpec::Unary(u) => format!("unary_{}_f32", dsc_ir::Op::Unary(u.0).name()),
            KernelSpec::Binary(b) => format!("binary_{}_f32", dsc_ir::Op::Binary(b.0).name()),
            KernelSpec::SiluMulHalf { f16 } => format!("binary_silu_mul_f32_{}", if *f16 { "f16" } else { "bf16" }),
            KernelSpec::RmsNorm { d, .. } => format!("rms_norm_d{d}_f32"),
            KernelSpec::RmsNormHalf { d, f16, .. } => format!("rms_norm_d{d}_f32_{}", if *f16 { "f16" } else { "bf16" }),
            KernelSpec::MatMul { k, n, wdtype, bias, residual } => format!("matmul_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
            KernelSpec::MatMulWide { k, n, wdtype, bias, residual } => format!("matmul_wide_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
            KernelSpec::Gather { d, dtype } => format!("gather_d{d}_{dtype}"),
            KernelSpec::Rope { h, d, theta_bits, interleaved } => {
                format!("rope_h{h}_d{d}_theta{}_{}", f32::from_bits(*theta_bits) as u64, if *interleaved { "interleaved" } else { "half" })
            }
            KernelSpec::CacheWrite { row, kv } => format!("cache_write_row{row}{}", kv_suffix(*kv)),
            KernelSpec::QkvRopeCache { h, kvh, d, theta_bits, interleaved, kv } => {
                format!("qkv_rope_cache_h{h}_kv{kvh}_d{d}_theta{}_{}{}", f32::from_bits(*theta_bits) as u64, if *interleaved { "interleaved" } else { "half" }, kv_suffix(*kv))
            }
            KernelSpec::RopeCacheWrite { h, d, theta_bits, interleaved, kv } => {
                format!("rope_cache_write_h{h}_d{d}_theta{}_{}{}", f32::from_bits(*theta_bits) as u64, if *interleaved { "interleaved" } else { "half" }, kv_suffix(*kv))
            }
            KernelSpec::PagedAttention { h, kvh, d, bs, warps, keys, group, kv, .. } => {
                // (16 warps, 4 keys per step and a block per head, the defaults, keep the plain
                // name)
                format!(
                    "paged_attention_h{h}_kv{kvh}_d{d}_bs{bs}{}{}{}{}",
                    if *warps == 16 { String::new() } else { format!("_w{warps}") },
                    if *keys == ATTN_KEYS { String::new() } else { format!("_u{keys}") },
                    if *group == 1 { String::new() } else { format!("_g{group}") },
                    kv_suffix(*kv)
                )
            }
            KernelSpec::PagedAttentionSplit { h, kvh, d, bs, warps, keys, splits, min_keys, group, kv, .. } => {
                format!("paged_attention_split{splits}x{min_keys}_h{h}_kv{kvh}_d{d}_bs{bs}_w{warps}_u{keys}{}{}", if *group == 1 { String::new() } else { format!("_g{group}") }, kv_suffix(*kv))
            }
            KernelSpec::AttentionCombine { h, d, splits, min_keys } => format!("attention_combine_h{h}_d{d}_s{splits}x{min_keys}"),
            KernelSpec::SwiGluDown { k, f, n, eps_bits, fb, fpw } => {
                format!("rms_swiglu_down_k{k}_f{f}_n{n}_e{eps_bits:08x}_fb{fb}{}", if *fpw == 2 { String::new() } else { format!("_fpw{fpw}") })
            }
            KernelSpec::MatMulCopy { inner } => format!("{}_copy", inner.symbol()),
            KernelSpec::SeededInit { dtype } => format!("seeded_init_{dtype}"),
            KernelSpec::SplitK { inner, splits } => format!("{}_splitk{splits}", inner.symbol()),
            KernelSpec::Tma { inner } => format!("{}_tma", inner.symbol()),
            KernelSpec::Ws { inner } => format!("{}_ws", inner.symbol()),
            KernelSpec::FlashWgmma { inner } => match inner.as_ref() {
                // (K/V tiles by TMA: `_wgt`)
                KernelSpec::FlashAttention { bs, .. } if flash_wg_tma_rows(*bs).is_some() => format!("{}_wgt", inner.symbol()),
                _ => format!("{}_wg", inner.symbol()),
            },
            KernelSpec::PrefetchL2 { inner } => format!("{}_pf", inner.symbol()),
            KernelSpec::AttentionO { inner, n, red, splits } => format!(
                "{}_o{n}{}",
                inner.symbol(),
                match (red, splits) {
                    (false, _) => String::new(),
                    (true, 1) => "_red".to_string(),
                    (true, s) => format!("_red{s}"),
                }
            ),
            KernelSpec::ZeroFill { inner, len } => format!("{}_zero{len}", inner.symbol()),
            KernelSpec::RowGather { inner } => format!("{}_rows", inner.symbol()),
            KernelSpec::ArgmaxFold { inner } => format!("{}_argmax", inner.symbol()),
            KernelSpec::GatherX { inner } => format!("{}_gx", inner.symbol()),
            KernelSpec::QkvAttentionO { inner, k, eps_bits, cluster } => format!("{}_qkv{k}_e{eps_bits:x}_c{cluster}", inner.symbol()),
            KernelSpec::RopeAttention { inner, theta_bits, interleaved } => {
                format!("{}_rope{}_{}", inner.symbol(), f32::from_bits(*theta_bits) as u64, if *interleaved { "interleaved" } else { "half" })
            }
            KernelSpec::SplitKReduce { splits, residual } => format!("splitk_reduce{splits}{}", if *residual { "_res" } else { "" }),
            KernelSpec::SplitKReduceNorm { splits, residual, d, eps_bits, half, cluster } => format!(
                "splitk_reduce{splits}{}_rms_norm_d{d}_e{eps_bits:08x}{}{}",
                if *residual { "_res" } else { "" },
                match half {
                    Some(true) => "_f16",
                    Some(false) => "_bf16",
                    None => "",
                },
                if *cluster > 1 { format!("_c{cluster}") } else { String::new() }
            ),
            KernelSpec::MatMulParts { inner, parts } => format!("{}_parts_{}", inner.symbol(), parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("_")),
            KernelSpec::SwiGluPipe { inner } => format!("{}_swiglu", inner.symbol()),
            KernelSpec::QkvRopeSplitK { inner, splits } => format!("{}_splitk{splits}", inner.symbol()),
            KernelSpec::NormMatMul { inner, .. } => format!("rms_{}", inner.symbol()),
            KernelSpec::Softmax { d } => format!("softmax_d{d}"),
            KernelSpec::LayerNorm { d, half, .. } => format!("layer_norm_d{d}{}", half.map_or("", |f| if f { "_f16" } else { "_bf16" })),
            KernelSpec::Argmax { d } => format!("argmax_d{d}"),
            KernelSpec::ArgmaxSplit { d, splits } => format!("argmax_split{splits}_d{d}"),
            KernelSpec::ArgmaxCluster { d, blocks } => format!("argmax_c{blocks}_d{d}"),
            KernelSpec::Slice { inner, d, start, len } => format!("slice_i{inner}_d{d}_{start}_{len}"),
            KernelSpec::TakeAlong { n_in, k } => format!("take_along_n{n_in}_k{k}"),
            KernelSpec::TopK { d, k } => format!("top_k_d{d}_k{k}"),
            KernelSpec::Transpose { perm } => format!("transpose_{}", perm.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("")),
            KernelSpec::Concat { sizes, inner } => format!("concat_{}_i{inner}", sizes.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("_")),
            KernelSpec::MatMulFewX16 { k, n, wdtype, bias, residual } => format!("matmul_few32x16_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
            KernelSpec::MatMulFew { k, n, wdtype, bias, residual, rows } => format!("matmul_few{rows}_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
            KernelSpec::MatMulMma { k, n, wdtype, bias, residual } => format!("matmul_mma_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" }),
            KernelSpec::MatMulWgmma { k, n, wdtype, bias, residual, n_tile } => {
                format!("matmul_wgmma{n_tile}_k{k}_n{n}_{wdtype}{}{}", if *bias { "_bias" } else { "" }, if *residual { "_res" } else { "" })
            }
            KernelSpec::MatMulPipe { k, n, wdtype, bias, residual, bn, stages, overlap, a16, bm } => {
                format!(
                    "matmul_pipe{bn}s{stages}{}{}{}_k{k}_n{n}_{wdtype}{}{}",
                    if *overlap { "o" } else { "" },
                    if *a16 { "_a16" } else { "" },
                    if *bm == PIPE_BM { String::new() } else { format!("_m{bm}") },
                    if *bias { "_bias" } else { "" },
                    if *residual { "_res" } else { "" }
                )
            }
            KernelSpec::ToHalf { f16 } => format!("to_{}", if *f16 { "f16" } else { "bf16" }),
            KernelSpec::FlashAttention { h, kvh, d, bs, kv, warps, mtiles, .. } => {
                format!(
                    "flash_attention_h{h}_kv{kvh}_d{d}_bs{bs}{}{}{}",
                    if *warps == 4 { String::new() } else { format!("_w{warps}") },
                    if *mtiles == 1 { String::new() } else { format!("_m{mtiles}") },
                    kv_suffix(*kv)
                )
            }
            KernelSpec::SwiGluGemv { k, f, wdtype } => format!("matmul_swiglu_k{k}_f{f}_{wdtype}"),
            KernelSpec::MatMulAct { inner, act } => format!("{}_{}", inner.symbol(), dsc_ir::Op::Unary(act.0).name()),
        }
    }
    pub fn launch(&self) -> Launch {
        match self {
            KernelSpec::Unary(_) | KernelSpec::Binary(_) | KernelSpec::SiluMulHalf { .. } => Launch::PerElement { threads: 256 },
            // a block of 8 warps per row with 16-byte loads (a warp per row leaves a 4096-wide
            // row as 128 dependent load iterations: 55 us instead of a few)
            KernelSpec::RmsNorm { d, .. } | KernelSpec::RmsNormHalf { d, .. } if rms_norm_regs(*d).is_some() => Launch::BlockPerRow { warps: rms_norm_regs(*d).expect("checked").0 as u32 },
            KernelSpec::RmsNorm { d, .. } | KernelSpec::RmsNormHalf { d, .. } if d % 4 == 0 => Launch::BlockPerRow { warps: 8 },
            KernelSpec::RmsNormHalf { .. } => Launch::WarpPerRow { rows_per_block: 4 },
            KernelSpec::RmsNorm { .. } => Launch::WarpPerRow { rows_per_block: 4 },
            KernelSpec::MatMul { k, n, wdtype: DType::F32 | DType::F16 | DType::BF16, .. } => Launch::OutputsPerBlock { outputs: gemv_tiling(*k, *n, 1).0 as u32, rows: 1, warps: GEMV_WARPS as u32 },
            KernelSpec::MatMulWide { .. } => Launch::OutputsPerBlock { outputs: wide_outputs() as u32, rows: 1, warps: GEMV_WARPS as u32 },
            KernelSpec::MatMulFew { wdtype: DType::BF16 | DType::F16, rows, .. } => {
                let (w, _, a) = gemv_mma_tiling3();
                Launch::OutputsPerBlock { outputs: 16 * a as u32, rows: *rows as u32, warps: w as u32 }
            }
            KernelSpec::MatMulFewX16 { .. } => {
                let (w, _, a) = gemv_mma_tiling3();
                Launch::OutputsPerBlock { outputs: 16 * a as u32, rows: GEMV_MMA_ROWS as u32, warps: w as u32 }
            }
            KernelSpec::MatMulFew { k, n, rows, .. } => Launch::OutputsPerBlock { outputs: gemv_tiling(*k, *n, *rows).0 as u32, rows: *rows as u32, warps: GEMV_WARPS as u32 },
            KernelSpec::MatMul { .. } => Launch::WarpPerOutput { warps_per_block: 4 },
            KernelSpec::MatMulMma { .. } => Launch::WarpPerTile { warps_per_block: 4 },
            KernelSpec::MatMulWgmma { n_tile, .. } => Launch::WarpgroupPerTile { n_tile: *n_tile as u32 },
            KernelSpec::MatMulPipe { bn, stages, a16, bm, .. } => Launch::Tile { outputs: *bn as u32, rows: *bm as u32, threads: 256, smem: pipe_smem(*bn, *stages, *a16, *bm) as u32 },
            KernelSpec::ToHalf { .. } => Launch::PerElement { threads: 256 },
            // (half of a GEMV block's outputs: the other half are the up rows)
            KernelSpec::SwiGluGemv { k, f, .. } => Launch::OutputsPerBlock { outputs: gemv_tiling(*k, 2 * *f, 1).0 as u32 / 2, rows: 1, warps: GEMV_WARPS as u32 },
            // (grid x = heads: work H with 1 "output" per block; y = tiles of 64 tokens)
            KernelSpec::FlashAttention { d, kv, warps, mtiles, .. } => {
                Launch::Tile { outputs: 1, rows: (16 * *mtiles * *warps) as u32, threads: 32 * *warps as u32, smem: flash_smem(*d, *kv, *warps, *mtiles) as u32 }
            }
            KernelSpec::Argmax { d } if d % 4 == 0 => Launch::BlockPerRow { warps: ARGMAX_WARPS as u32 },
            // (grid x: the splits, grid y: the rows — set by the runtime)
            KernelSpec::ArgmaxSplit { .. } => Launch::BlockPerRow { warps: ARGMAX_SPLIT_WARPS as u32 },
            KernelSpec::ArgmaxCluster { .. } => Launch::BlockPerRow { warps: ARGMAX_CLUSTER_WARPS as u32 },
            KernelSpec::Softmax { .. } | KernelSpec::LayerNorm { .. } | KernelSpec::Argmax { .. } => Launch::WarpPerRow { rows_per_block: 4 },
            KernelSpec::Slice { .. } | KernelSpec::TakeAlong { .. } | KernelSpec::Transpose { .. } | KernelSpec::Concat { .. } => Launch::PerElement { threads: 256 },
            KernelSpec::TopK { .. } => Launch::WarpPerRow { rows_per_block: 4 },
            KernelSpec::Gather { .. }
            | KernelSpec::Rope { .. }
            | KernelSpec::RopeCacheWrite { .. }
            | KernelSpec::CacheWrite { .. }
            | KernelSpec::QkvRopeCache { .. }
            | KernelSpec::SeededInit { .. }
            | KernelSpec::SplitKReduce { .. } => Launch::PerElement { threads: 256 },
            KernelSpec::SplitKReduceNorm { d, cluster, .. } if *cluster > 1 => Launch::BlockPerRow { warps: (d / 4 / cluster / 32).max(1) as u32 },
            KernelSpec::SplitKReduceNorm { .. } => Launch::BlockPerRow { warps: SPLITK_NORM_WARPS as u32 },
            // (the stages' mbarriers past the tiles: 8 bytes each)
            KernelSpec::Tma { inner } => match inner.launch() {
                Launch::Tile { outputs, rows, threads, smem } => Launch::Tile { outputs, rows, threads, smem: smem + TMA_MBAR_BYTES as u32 },
                other => other,
            },
            // (+ the producer warpgroup, and a full and an empty mbarrier per stage)
            KernelSpec::FlashWgmma { inner } => match inner.as_ref() {
                KernelSpec::FlashAttention { d, bs, .. } => {
                    // (a query head per block; TMA tiles: + the two stages' mbarriers and use
                    // counts)
                    let tma = if flash_wg_tma_rows(*bs).is_some() { FLASH_WG_TMA_BYTES } else { 0 };
                    Launch::Tile { outputs: 1, rows: 64, threads: 128, smem: (flash_wg_smem(*d) + tma) as u32 }
                }
                other => other.launch(),
            },
            KernelSpec::Ws { inner } => match inner.launch() {
                Launch::Tile { outputs, rows, threads, smem } => Launch::Tile { outputs, rows, threads: threads + 128, smem: smem + TMA_MBAR_BYTES as u32 },
                other => other,
            },
            KernelSpec::SplitK { inner, splits } => match inner.launch() {
                // (a tile's columns over `splits` blocks: grid x = N / (bn / splits))
                Launch::Tile { outputs, rows, threads, smem } => Launch::Tile { outputs: outputs / *splits as u32, rows, threads, smem },
                other => other,
            },
            KernelSpec::PagedAttention { warps, .. } | KernelSpec::PagedAttentionSplit { warps, .. } => Launch::BlockPerRow { warps: *warps as u32 },
            KernelSpec::AttentionCombine { .. } => Launch::WarpPerRow { rows_per_block: 4 },
            KernelSpec::MatMulParts { inner, .. }
            | KernelSpec::NormMatMul { inner, .. }
            | KernelSpec::MatMulAct { inner, .. }
            | KernelSpec::PrefetchL2 { inner }
            | KernelSpec::SwiGluPipe { inner }
            | KernelSpec::QkvRopeSplitK { inner, .. }
            | KernelSpec::RopeAttention { inner, .. }
            | KernelSpec::AttentionO { inner, .. }
            | KernelSpec::QkvAttentionO { inner, .. }
            | KernelSpec::ZeroFill { inner, .. }
            | KernelSpec::RowGather { inner }
            | KernelSpec::ArgmaxFold { inner }
            | KernelSpec::GatherX { inner }
            | KernelSpec::MatMulCopy { inner } => inner.launch(),
            KernelSpec::SwiGluDown { fb, fpw, .. } => Launch::OutputsPerBlock { outputs: *fb as u32, rows: 1, warps: (*fb / (*fpw).max(1)) as u32 },
        }
    }
}

/// The body of a split-K round loop: (indices of the rounds it covers, accumulators) → the
/// new accumulators.
type RoundBody<'a> = dyn Fn(&mut Body, &[String], &[String]) -> Vec<String> + 'a;

/// SSA name generator and body buffer.
struct Body {
    s: String,
    n: usize,
    /// a `workgroup(...)` attribution (shared memory) for the gpu.func
    workgroup: Option<String>,
    /// what `gpu.block_id x` stands for (a merged matmul's block index within its part; the
    /// warp-specialized matmul's rasterized column tile)
    block_x: Option<String>,
    /// what `gpu.block_id y` stands for (the warp-specialized matmul's rasterized row tile)
    block_y: Option<String>,
    /// sm_90a with programmatic dependent launch: the kernel must `griddepcontrol.wait` before
    /// reading what the previous kernel wrote (at its start unless the body did: `waited`)
    pdl: bool,
    waited: bool,
    /// the block-per-row RMSNorm reads its x row through `%idx` (`KernelSpec::RowGather`)
    row_gather: bool,
    /// the one-row GEMV reads x as a bf16 table row through `%tok` and block 0 writes it to
    /// `%x` (`KernelSpec::GatherX`)
    gather_x: bool,
    /// the wide lm_head also reduces its logits' argmax (`KernelSpec::ArgmaxFold`)
    argmax_fold: bool,
    /// the decode GEMV normalizes its input on the way in (`KernelSpec::NormMatMul`): RMSNorm
    /// epsilon
    norm: Option<f32>,
    /// the matmul epilogue applies this activation after the bias (`KernelSpec::MatMulAct`)
    act: Option<UnaryOp>,
    /// the decode GEMV is `KernelSpec::SwiGluGemv`: outputs 0..r/2 read `%w0` (gate), r/2..r
    /// `%w1` (up) at the same rows, and the epilogue writes silu(gate) * up
    swiglu: bool,
    /// the pipelined matmul's SwiGLU epilogue (`SwiGluPipe`)
    swiglu_pipe: bool,
    /// (`QkvRopeSplitK`) q, k and v loads sum this many partial-sum slices, `%slice`
    /// elements apart
    sum_slices: Option<usize>,
    /// the pipelined matmul's K steps are cut into this many parts over blocks
    /// (`KernelSpec::SplitK`)
    split_k: Option<usize>,
    /// a split-K merged matmul: the columns of all parts (a partial-sum slice is [M, all]),
    /// where `%n` is the block's part's
    split_n: Option<&'static str>,
    /// the pipelined matmul's W tiles come by TMA: `%w` points at a `CUtensorMap`
    /// (`KernelSpec::Tma`)
    tma: bool,
    /// the pipelined matmul is warp-specialized (`KernelSpec::Ws`): x comes by TMA too, `%x`
    /// pointing at its `CUtensorMap`
    ws: bool,
    /// the prefill attention's products on wgmma (`KernelSpec::FlashWgmma`)
    flash_wg: bool,
    /// (the wgmma prefill attention: `.minnctapersm` for ptxas, `flash_wg_blocks_per_sm`)
    flash_mincta: Option<u32>,
    /// (the decode attention with the o projection folded in: its N, `KernelSpec::AttentionO`)
    attn_o: Option<usize>,
    /// the GEMV also stores its output into `%y2` (`KernelSpec::MatMulCopy`)
    copy_y: bool,
    /// (`AttentionO` with `red`: the projection added into `%out` and `%out2`, over this many
    /// blocks per head)
    attn_o_red: bool,
    attn_o_splits: usize,
    /// (`QkvAttentionO`: the attention computes its q, k and v from x — K, eps, blocks per
    /// cluster; 1: no cluster)
    qkv_in: Option<(usize, f32, usize)>,
    /// how the body is written for this spec (the compile's `KernelOptions`)
    o: KernelOptions,
}

impl Body {
    fn v(&mut self) -> String {
        self.n += 1;
        format!("%v{}", self.n)
    }
    fn op(&mut self, rhs: &str) -> String {
        if rhs == "gpu.block_id x" {
            if let Some(bx) = &self.block_x {
                return bx.clone();
            }
        }
        if rhs == "gpu.block_id y" {
            if let Some(by) = &self.block_y {
                return by.clone();
            }
        }
        let v = self.v();
        let _ = writeln!(self.s, "        {v} = {rhs}");
        v
    }
    fn line(&mut self, l: &str) {
        let _ = writeln!(self.s, "        {l}");
    }
    fn cf32(&mut self, x: f32) -> String {
        // hex form: exact, and always a valid MLIR float literal
        self.op(&format!("arith.constant 0x{:08X} : f32", x.to_bits()))
    }
    fn asm1(&mut self, ins: &str, x: &str) -> String {
        self.op(&format!("llvm.inline_asm \"{ins} $0, $1;\", \"=f,f\" {x} : (f32) -> f32"))
    }
    fn exp(&mut self, x: &str) -> String {
        let l2e = self.cf32(std::f32::consts::LOG2_E);
        let t = self.op(&format!("arith.mulf {x}, {l2e} : f32"));
        self.asm1("ex2.approx.ftz.f32", &t)
    }
    fn sigmoid(&mut self, x: &str) -> String {
        let nx = self.op(&format!("arith.negf {x} : f32"));
        let e = self.exp(&nx);
        let one = self.cf32(1.0);
        let d = self.op(&format!("arith.addf {one}, {e} : f32"));
        self.op(&format!("arith.divf {one}, {d} : f32"))
    }
    fn load(&mut self, ptr: &str, idx: &str) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        self.op(&format!("llvm.load {p} : !llvm.ptr<1> -> f32"))
    }
    /// f32 element `idx` of `ptr`, or with `sum_slices` (S) the sum of elements idx + s·%slice
    /// for s < S (a split-K matmul's partial sums)
    fn load_summed(&mut self, ptr: &str, idx: &str) -> String {
        let mut acc = self.load(ptr, idx);
        for s in 1..self.sum_slices.unwrap_or(1) {
            let cs = self.ci64(s as i64);
            let o = self.op(&format!("arith.muli %slice, {cs} : i64"));
            let at = self.op(&format!("arith.addi {idx}, {o} : i64"));
            let v = self.load(ptr, &at);
            acc = self.op(&format!("arith.addf {acc}, {v} : f32"));
        }
        acc
    }
    fn store(&mut self, val: &str, ptr: &str, idx: &str) {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        self.line(&format!("llvm.store {val}, {p} : f32, !llvm.ptr<1>"));
    }
    fn ci64(&mut self, v: i64) -> String {
        self.op(&format!("arith.constant {v} : i64"))
    }
    /// load a scalar of MLIR type `ty` at element index `idx` (i64) of `ptr`
    fn load_t(&mut self, ptr: &str, idx: &str, ty: &str) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, {ty}"));
        self.op(&format!("llvm.load {p} : !llvm.ptr<1> -> {ty}"))
    }
    /// `n` scalars of MLIR type `ty` from one aligned vector load at byte offset `off`
    fn load_vec(&mut self, ptr: &str, off: &str, n: usize, ty: &str, align: usize) -> Vec<String> {
        let v = self.load_vector(ptr, off, n, ty, align);
        self.elements(&v, n, ty)
    }
    /// `n` f32 of `ptr` from byte offset `at` (i64), one 16-byte load per 4
    fn load_f32s(&mut self, ptr: &str, at: &str, n: usize) -> Vec<String> {
        let mut v = vec![];
        for q in 0..n / 4 {
            let off = if q == 0 {
                at.to_string()
            } else {
                let o = self.ci64(16 * q as i64);
                self.op(&format!("arith.addi {at}, {o} : i64"))
            };
            v.extend(self.load_vec(ptr, &off, 4, "f32", 16));
        }
        v
    }
    /// `acc` + the dot product of `words` (i32 words of two bf16 each, low half first) with
    /// `xs` (two floats per word), one fma at a time in order
    fn fma_bf16_words(&mut self, acc: &str, words: &[String], xs: &[String]) -> String {
        let mut a = acc.to_string();
        for (q, word) in words.iter().enumerate() {
            let [lo, hi] = self.bf16_pair(word);
            a = self.op(&format!("llvm.intr.fma({lo}, {}, {a}) : (f32, f32, f32) -> f32", xs[2 * q]));
            a = self.op(&format!("llvm.intr.fma({hi}, {}, {a}) : (f32, f32, f32) -> f32", xs[2 * q + 1]));
        }
        a
    }
    /// A cluster barrier every thread of the cluster passes: the arrival releases what the
    /// thread wrote (e.g. into another block's shared memory), the wait acquires the others'
    fn cluster_barrier(&mut self) {
        self.line("llvm.inline_asm has_side_effects \"barrier.cluster.arrive.release;\", \"\" : () -> ()");
        self.line("llvm.inline_asm has_side_effects \"barrier.cluster.wait.acquire;\", \"\" : () -> ()");
    }
    /// The warp's ballot of the i1 `bit` (all 32 lanes taking part): bit l of the i32 result
    /// set where lane l's `bit` is
    fn ballot(&mut self, bit: &str) -> String {
        let w = self.op(&format!("arith.extui {bit} : i1 to i32"));
        self.op(&format!("llvm.inline_asm has_side_effects \"{{ .reg .pred p; setp.ne.u32 p, $1, 0; vote.sync.ballot.b32 $0, p, 0xffffffff; }}\", \"=r,r\" {w} : (i32) -> i32"))
    }
    /// the two f16 of an i32 word as f32, the low half first
    fn f16_pair(&mut self, word: &str) -> [String; 2] {
        let c16 = self.op("arith.constant 16 : i32");
        let lo = self.op(&format!("arith.trunci {word} : i32 to i16"));
        let hi = self.op(&format!("arith.shrui {word}, {c16} : i32"));
        let hi = self.op(&format!("arith.trunci {hi} : i32 to i16"));
        [lo, hi].map(|h| {
            let f = self.op(&format!("arith.bitcast {h} : i16 to f16"));
            self.op(&format!("arith.extf {f} : f16 to f32"))
        })
    }
    /// the two bf16 of an i32 word as f32: the low half shifted up, the high half masked
    fn bf16_pair(&mut self, word: &str) -> [String; 2] {
        let c16 = self.op("arith.constant 16 : i32");
        let lo = self.op(&format!("arith.shli {word}, {c16} : i32"));
        let m = self.op("arith.constant -65536 : i32");
        let hi = self.op(&format!("arith.andi {word}, {m} : i32"));
        [self.op(&format!("arith.bitcast {lo} : i32 to f32")), self.op(&format!("arith.bitcast {hi} : i32 to f32"))]
    }
    /// one aligned `vector<n x ty>` load at byte offset `off` of `ptr`
    fn load_vector(&mut self, ptr: &str, off: &str, n: usize, ty: &str, align: usize) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        self.op(&format!("llvm.load {p} {{alignment = {align} : i64}} : !llvm.ptr<1> -> vector<{n}x{ty}>"))
    }
    /// the `n` elements of vector `v` of MLIR type `ty`
    fn elements(&mut self, v: &str, n: usize, ty: &str) -> Vec<String> {
        (0..n).map(|i| self.element(v, i, n, ty)).collect()
    }
    /// element `i` of vector `v` (`n` elements of MLIR type `ty`)
    fn element(&mut self, v: &str, i: usize, n: usize, ty: &str) -> String {
        let c = self.op(&format!("arith.constant {i} : i32"));
        self.op(&format!("llvm.extractelement {v}[{c} : i32] : vector<{n}x{ty}>"))
    }
    /// i32 element as i64
    fn load_i32_as_i64(&mut self, ptr: &str, idx: &str) -> String {
        let v = self.load_t(ptr, idx, "i32");
        self.op(&format!("arith.extsi {v} : i32 to i64"))
    }
    /// f16 stored at byte offset `off` of `ptr`, widened to f32
    fn f16_at_byte(&mut self, ptr: &str, off: &str) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        let h = self.op(&format!("llvm.load {p} : !llvm.ptr<1> -> i16"));
        let f = self.op(&format!("arith.bitcast {h} : i16 to f16"));
        self.op(&format!("arith.extf {f} : f16 to f32"))
    }
    /// byte at byte offset `off` (i64), as i32 (unsigned)
    fn u8_at_byte(&mut self, ptr: &str, off: &str) -> String {
        let p = self.op(&format!("llvm.getelementptr {ptr}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        let b = self.op(&format!("llvm.load {p} : !llvm.ptr<1> -> i8"));
        self.op(&format!("arith.extui {b} : i8 to i32"))
    }
    /// bf16 bits `h` (i16) widened to f32
    fn bf16_to_f32(&mut self, h: &str) -> String {
        let w = self.op(&format!("arith.extui {h} : i16 to i32"));
        let c = self.op("arith.constant 16 : i32");
        let sh = self.op(&format!("arith.shli {w}, {c} : i32"));
        self.op(&format!("arith.bitcast {sh} : i32 to f32"))
    }
    /// element `idx` of a plain-float buffer of `dtype`, as f32
    fn plain_as_f32(&mut self, ptr: &str, idx: &str, dtype: DType) -> Result<String, String> {
        Ok(match dtype {
            DType::F32 => self.load(ptr, idx),
            DType::F16 => {
                let h = self.load_t(ptr, idx, "i16");
                let f = self.op(&format!("arith.bitcast {h} : i16 to f16"));
                self.op(&format!("arith.extf {f} : f16 to f32"))
            }
            DType::BF16 => {
                let h = self.load_t(ptr, idx, "i16");
                self.bf16_to_f32(&h)
            }
            other => return Err(format!("{other} is not a plain float type")),
        })
    }
    /// f32 `val` rounded to bf16 (`f16`: f16, saturating as [`Body::pack2`]) at element `idx`
    /// (i64) of the 16-bit buffer `ptr`
    fn store_half1(&mut self, val: &str, ptr: &str, idx: &str, f16: bool) {
        let v = if f16 {
            let big = self.cf32(65504.0);
            let nbig = self.cf32(-65504.0);
            let a = self.op(&format!("arith.minimumf {val}, {big} : f32"));
            self.op(&format!("arith.maximumf {a}, {nbig} : f32"))
        } else {
            val.to_string()
        };
        let ins = if f16 { "cvt.rn.f16.f32" } else { "cvt.rn.bf16.f32" };
        let h = self.op(&format!("llvm.inline_asm \"{ins} $0, $1;\", \"=h,f\" {v} : (f32) -> i16"));
        let p = self.op(&format!("llvm.getelementptr {ptr}[{idx}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i16"));
        self.line(&format!("llvm.store {h}, {p} : i16, !llvm.ptr<1>"));
    }
    /// f32 `val` stored at element `idx` (i64) of a KV pool of `kv` (f32, or bf16 rounded to
    /// nearest even)
    fn store_kv(&mut self, val: &str, ptr: &str, idx: &str, kv: DType) -> Result<(), String> {
        match kv {
            DType::F32 => self.store(val, ptr, idx),
            DType::BF16 => self.store_half1(val, ptr, idx, false),
            other => return Err(format!("{other} KV caches are not lowered for the GPU (f32 or bf16)")),
        }
        Ok(())
    }
    /// `n` consecutive elements (1, 2, 4 or 8) from element `e` (i64, a multiple of `n`) of a KV
    /// pool of `kv` (f32 or bf16), as f32: one vector load
    fn load_kv(&mut self, ptr: &str, e: &str, n: usize, kv: DType) -> Result<Vec<String>, String> {
        let size = match kv {
            DType::F32 => 4,
            DType::BF16 => 2,
            other => return Err(format!("{other} KV caches are not lowered for the GPU (f32 or bf16)")),
        };
        if n == 1 {
            return Ok(vec![self.plain_as_f32(ptr, e, kv)?]);
        }
        // (at most 16 bytes per load)
        let most = 16 / size as usize;
        if n > most {
            let mut out = vec![];
            for c in 0..n / most {
                let co = self.ci64((c * most) as i64);
                let ec = self.op(&format!("arith.addi {e}, {co} : i64"));
                out.extend(self.load_kv(ptr, &ec, most, kv)?);
            }
            return Ok(out);
        }
        let cs = self.ci64(size);
        let by = self.op(&format!("arith.muli {e}, {cs} : i64"));
        if kv == DType::F32 {
            return Ok(self.load_vec(ptr, &by, n, "f32", 4 * n));
        }
        let hs = self.load_vec(ptr, &by, n, "i16", 2 * n);
        Ok(hs.iter().map(|h| self.bf16_to_f32(h)).collect())
    }
    /// warp-per-row prologue: opens `scf.if row < %rows`; returns (lane, row base, d, 32) as
    /// index values
    fn open_row(&mut self, d: usize, rows_per_block: u32) -> (String, String, String, String) {
        let t = self.op("gpu.thread_id x");
        let blk = self.op("gpu.block_id x");
        let c32 = self.op("arith.constant 32 : index");
        let lane = self.op(&format!("arith.remui {t}, {c32} : index"));
        let warp = self.op(&format!("arith.divui {t}, {c32} : index"));
        let rpb = self.op(&format!("arith.constant {rows_per_block} : index"));
        let r0 = self.op(&format!("arith.muli {blk}, {rpb} : index"));
        let row = self.op(&format!("arith.addi {r0}, {warp} : index"));
        let rowi = self.op(&format!("arith.index_cast {row} : index to i64"));
        let ok = self.op(&format!("arith.cmpi slt, {rowi}, %rows : i64"));
        self.line(&format!("scf.if {ok} {{"));
        let dd = self.op(&format!("arith.constant {d} : index"));
        let base = self.op(&format!("arith.muli {row}, {dd} : index"));
        (lane, base, dd, c32)
    }
    /// sum over the row: scf.for lane..d step 32 of f(x[base+i]) then a warp reduction
    fn row_reduce(&mut self, lane: &str, base: &str, dd: &str, c32: &str, f: &dyn Fn(&mut Body, &str) -> String, max: bool) -> String {
        let init = if max { self.op("arith.constant 0xFF800000 : f32") } else { self.cf32(0.0) };
        let acc = self.v();
        let (iv, a) = (self.v(), self.v());
        self.line(&format!("{acc} = scf.for {iv} = {lane} to {dd} step {c32} iter_args({a} = {init}) -> (f32) {{"));
        let idx = self.op(&format!("arith.addi {base}, {iv} : index"));
        let idx = self.op(&format!("arith.index_cast {idx} : index to i64"));
        let x = self.load("%x", &idx);
        let v = f(self, &x);
        let a2 = if max { self.op(&format!("arith.maximumf {a}, {v} : f32")) } else { self.op(&format!("arith.addf {a}, {v} : f32")) };
        self.line(&format!("scf.yield {a2} : f32"));
        self.line("}");
        self.warp_reduce(&acc, if max { "arith.maximumf" } else { "arith.addf" })
    }
    /// (a + b) + (c + d)
    /// 1 / sqrt(sum_sq / d + eps): RMSNorm's scale from a row's sum of squares
    fn inv_rms(&mut self, sum_sq: &str, d: usize, eps: f32) -> String {
        let df = self.cf32(d as f32);
        let mean = self.op(&format!("arith.divf {sum_sq}, {df} : f32"));
        let ec = self.cf32(eps);
        let me = self.op(&format!("arith.addf {mean}, {ec} : f32"));
        let sd = self.asm1("sqrt.rn.f32", &me);
        let one = self.cf32(1.0);
        self.op(&format!("arith.divf {one}, {sd} : f32"))
    }
    fn sum4(&mut self, v: &[String]) -> String {
        let a = self.op(&format!("arith.addf {}, {} : f32", v[0], v[1]));
        let c = self.op(&format!("arith.addf {}, {} : f32", v[2], v[3]));
        self.op(&format!("arith.addf {a}, {c} : f32"))
    }
    fn warp_sum(&mut self, x: &str) -> String {
        self.warp_reduce(x, "arith.addf")
    }
    /// The warp sums of several values at once (every lane gets all of them): a transposing
    /// butterfly — at xor offset o each lane keeps half of its values and adds the partner's
    /// copy of them, sending the other half (one shuffle per pair) — then the sum's last
    /// offsets, then each sum broadcast from a lane holding it. For n values padded to P (a
    /// power of two ≤ 32): P - 1 + 5 - log2 P + n shuffles instead of 5n. `lane` (i32) is the
    /// thread's lane.
    fn warp_sums(&mut self, xs: &[String], lane: &str) -> Vec<String> {
        let n = xs.len();
        if n <= 1 {
            return xs.iter().map(|x| self.warp_sum(x)).collect();
        }
        let p = n.next_power_of_two().min(32);
        if p < n {
            return xs.iter().map(|x| self.warp_sum(x)).collect();
        }
        let zero = self.cf32(0.0);
        let mut c: Vec<String> = xs.iter().cloned().chain(std::iter::repeat_n(zero, p - n)).collect();
        let w32 = self.op("arith.constant 32 : i32");
        let z32 = self.op("arith.constant 0 : i32");
        let levels = p.trailing_zeros() as usize;
        for k in 0..levels {
            let off = 16i32 >> k;
            let o = self.op(&format!("arith.constant {off} : i32"));
            let lb = self.op(&format!("arith.andi {lane}, {o} : i32"));
            let hi = self.op(&format!("arith.cmpi ne, {lb}, {z32} : i32"));
            let half = c.len() / 2;
            let mut next = vec![];
            for i in 0..half {
                let send = self.op(&format!("arith.select {hi}, {}, {} : f32", c[i], c[i + half]));
                let keep = self.op(&format!("arith.select {hi}, {}, {} : f32", c[i + half], c[i]));
                let (sh, valid) = (self.v(), self.v());
                self.line(&format!("{sh}, {valid} = gpu.shuffle xor {send}, {o}, {w32} : f32"));
                next.push(self.op(&format!("arith.addf {keep}, {sh} : f32")));
            }
            c = next;
        }
        let rest: Vec<i32> = (levels..5).map(|k| 16 >> k).collect();
        let total = self.xor_reduce(&c[0], "arith.addf", &rest);
        // (value i's sum is in the lanes whose bits 16 >> k are i's bits from the top)
        (0..n)
            .map(|i| {
                let src: i32 = (0..levels).map(|k| if (i >> (levels - 1 - k)) & 1 == 1 { 16 >> k } else { 0 }).sum();
                let s = self.op(&format!("arith.constant {src} : i32"));
                let (sh, valid) = (self.v(), self.v());
                self.line(&format!("{sh}, {valid} = gpu.shuffle idx {total}, {s}, {w32} : f32"));
                sh
            })
            .collect()
    }
    /// butterfly reduction over the warp with `combine` (arith.addf / arith.maximumf); every
    /// lane gets the result
    fn warp_reduce(&mut self, x: &str, combine: &str) -> String {
        self.xor_reduce(x, combine, &[16, 8, 4, 2, 1])
    }
    /// `combine` of `x` over the lanes whose index differs in the bits of `offsets` (xor
    /// shuffles: [16, 8, 4, 2, 1] is the whole warp, [1, 2] an mma fragment's quad)
    fn xor_reduce(&mut self, x: &str, combine: &str, offsets: &[i32]) -> String {
        let w32 = self.op("arith.constant 32 : i32");
        let mut total = x.to_string();
        for off in offsets {
            let o = self.op(&format!("arith.constant {off} : i32"));
            let (sh, valid) = (self.v(), self.v());
            self.line(&format!("{sh}, {valid} = gpu.shuffle xor {total}, {o}, {w32} : f32"));
            total = self.op(&format!("{combine} {total}, {sh} : f32"));
        }
        total
    }
    /// warp-wide (max value, its index), the lower index winning ties; every lane gets it
    fn warp_argmax(&mut self, v: &str, i: &str) -> (String, String) {
        let w32 = self.op("arith.constant 32 : i32");
        let (mut v, mut i) = (v.to_string(), i.to_string());
        for off in [16, 8, 4, 2, 1] {
            let o = self.op(&format!("arith.constant {off} : i32"));
            let (sv, p1, si, p2) = (self.v(), self.v(), self.v(), self.v());
            self.line(&format!("{sv}, {p1} = gpu.shuffle xor {v}, {o}, {w32} : f32"));
            self.line(&format!("{si}, {p2} = gpu.shuffle xor {i}, {o}, {w32} : i32"));
            (v, i) = argmax_take(self, &v, &i, &sv, &si);
        }
        (v, i)
    }
    fn idx64(&mut self, i: &str) -> String {
        self.op(&format!("arith.index_cast {i} : index to i64"))
    }
    /// one element of a weight row-major buffer of `dtype` (plain or GGUF blocks), as f32;
    /// `e` is the flat element index (rows a multiple of 32 for block formats)
    fn weight_elem(&mut self, ptr: &str, e: &str, dtype: DType) -> Result<String, String> {
        Ok(match dtype {
            DType::F32 | DType::F16 | DType::BF16 => self.plain_as_f32(ptr, e, dtype)?,
            DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => {
                let c32 = self.ci64(32);
                let blk = self.op(&format!("arith.divui {e}, {c32} : i64"));
                let jj = self.op(&format!("arith.remui {e}, {c32} : i64"));
                let cb = self.ci64(dtype.block().1 as i64);
                let base = self.op(&format!("arith.muli {blk}, {cb} : i64"));
                let d = self.f16_at_byte(ptr, &base);
                if dtype == DType::Q8_0 {
                    let c2 = self.ci64(2);
                    let o = self.op(&format!("arith.addi {base}, {c2} : i64"));
                    let o = self.op(&format!("arith.addi {o}, {jj} : i64"));
                    let byte = self.u8_at_byte(ptr, &o);
                    let t8 = self.op(&format!("arith.trunci {byte} : i32 to i8"));
                    let q = self.op(&format!("arith.sitofp {t8} : i8 to f32"));
                    self.op(&format!("arith.mulf {d}, {q} : f32"))
                } else {
                    let c16 = self.ci64(16);
                    let qo = self.ci64(if dtype == DType::Q4_1 { 4 } else { 2 });
                    let jm = self.op(&format!("arith.remui {jj}, {c16} : i64"));
                    let o = self.op(&format!("arith.addi {base}, {qo} : i64"));
                    let o = self.op(&format!("arith.addi {o}, {jm} : i64"));
                    let byte = self.u8_at_byte(ptr, &o);
                    let hi_half = self.op(&format!("arith.cmpi uge, {jj}, {c16} : i64"));
                    let c4 = self.op("arith.constant 4 : i32");
                    let c0 = self.op("arith.constant 0 : i32");
                    let sh = self.op(&format!("arith.select {hi_half}, {c4}, {c0} : i32"));
                    let shifted = self.op(&format!("arith.shrui {byte}, {sh} : i32"));
                    let m15 = self.op("arith.constant 15 : i32");
                    let nib = self.op(&format!("arith.andi {shifted}, {m15} : i32"));
                    let q = self.op(&format!("arith.uitofp {nib} : i32 to f32"));
                    if dtype == DType::Q4_1 {
                        let c2 = self.ci64(2);
                        let mo = self.op(&format!("arith.addi {base}, {c2} : i64"));
                        let m = self.f16_at_byte(ptr, &mo);
                        self.op(&format!("llvm.intr.fma({d}, {q}, {m}) : (f32, f32, f32) -> f32"))
                    } else {
                        let c8 = self.cf32(8.0);
                        let q8 = self.op(&format!("arith.subf {q}, {c8} : f32"));
                        self.op(&format!("arith.mulf {d}, {q8} : f32"))
                    }
                }
            }
            other => return Err(format!("{other} weights are not lowered yet")),
        })
    }
    /// `vector<N x ty>` of the scalars `elems` (N = elems.len())
    fn vector(&mut self, elems: &[String], ty: &str) -> String {
        let n = elems.len();
        let mut v = self.op(&format!("llvm.mlir.undef : vector<{n}x{ty}>"));
        for (j, e) in elems.iter().enumerate() {
            let cj = self.op(&format!("arith.constant {j} : i32"));
            v = self.op(&format!("llvm.insertelement {e}, {v}[{cj} : i32] : vector<{n}x{ty}>"));
        }
        v
    }
    /// four f32 rounded to bf16 (f16) and stored as one 8-byte vector at element `e` (i64, a
    /// multiple of 4) of the 16-bit buffer `ptr`
    fn store_half4(&mut self, ys: &[String], ptr: &str, e: &str, f16: bool) {
        let lo = self.pack2(&ys[0], &ys[1], f16);
        let hi = self.pack2(&ys[2], &ys[3], f16);
        let v = self.vector(&[lo, hi], "i32");
        let c2 = self.ci64(2);
        let bo = self.op(&format!("arith.muli {e}, {c2} : i64"));
        let p = self.op(&format!("llvm.getelementptr {ptr}[{bo}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        self.line(&format!("llvm.store {v}, {p} {{alignment = 8 : i64}} : vector<2xi32>, !llvm.ptr<1>"));
    }
    /// two f32 packed as bf16x2 (or f16x2, saturating to the largest finite f16 rather than
    /// overflowing to inf): `lo` in the low half
    fn pack2(&mut self, lo: &str, hi: &str, f16: bool) -> String {
        let (lo, hi) = if f16 {
            // (cvt's .satfinite needs PTX 8.1; LLVM emits an older ISA version)
            let big = self.cf32(65504.0);
            let nbig = self.cf32(-65504.0);
            let mut sat = |v: &str| {
                let a = self.op(&format!("arith.minimumf {v}, {big} : f32"));
                self.op(&format!("arith.maximumf {a}, {nbig} : f32"))
            };
            (sat(lo), sat(hi))
        } else {
            (lo.to_string(), hi.to_string())
        };
        let ins = if f16 { "cvt.rn.f16x2.f32" } else { "cvt.rn.bf16x2.f32" };
        self.op(&format!("llvm.inline_asm \"{ins} $0, $1, $2;\", \"=r,f,f\" {hi}, {lo} : (f32, f32) -> i32"))
    }
    /// The matmul epilogue: y[row, col] = v (+ bias[col]) (+ res[row, col]), row-major with
    /// `%n` columns; shared by the GEMV and the tensor-core kernels.
    /// RoPE of rotation pair `i` (i64) of x[T, h, d] at `ptr` (positions in `%pos`): returns
    /// (token, element index of the pair's two values, their rotated values)
    /// (cos, sin) of RoPE rotation pair `pair` (i64) at position `p` (i64) for head dim `d`
    fn rope_cos_sin(&mut self, pair: &str, p: &str, d: usize, theta_bits: u32) -> (String, String) {
        let b = self;
        let pf = b.op(&format!("arith.sitofp {p} : i64 to f32"));
        let pairf = b.op(&format!("arith.uitofp {pair} : i64 to f32"));
        // inv_freq = theta^(-2 pair / d) = exp2(-(2 pair / d) log2 theta)
        let k = b.cf32(-2.0 * f32::from_bits(theta_bits).log2() / d as f32);
        let ex = b.op(&format!("arith.mulf {pairf}, {k} : f32"));
        let inv = b.asm1("ex2.approx.ftz.f32", &ex);
        let ang = b.op(&format!("arith.mulf {pf}, {inv} : f32"));
        // range-reduce to [-pi, pi] for the approx sin/cos
        let r2pi = b.cf32(1.0 / (2.0 * std::f32::consts::PI));
        let q = b.op(&format!("arith.mulf {ang}, {r2pi} : f32"));
        let qr = b.asm1("cvt.rni.f32.f32", &q);
        let m2pi = b.cf32(-2.0 * std::f32::consts::PI);
        let red = b.op(&format!("llvm.intr.fma({qr}, {m2pi}, {ang}) : (f32, f32, f32) -> f32"));
        let c = b.asm1("cos.approx.ftz.f32", &red);
        let sn = b.asm1("sin.approx.ftz.f32", &red);
        (c, sn)
    }
    /// Element `e` (i64, 0..d) of a head's row at element `base` of `ptr`, rotated by RoPE at
    /// position `p`: its pair and partner element by the style (half: e and e ± d/2;
    /// interleaved: e and e ^ 1), y = x c - x' s for the pair's first element, x c + x' s for
    /// its second (as [`Body::rope_pair`] computes them).
    fn rope_elem(&mut self, ptr: &str, base: &str, e: &str, p: &str, d: usize, theta_bits: u32, interleaved: bool) -> String {
        self.rope_elem_src(&Src::Global(ptr), base, e, p, d, theta_bits, interleaved)
    }
    /// f32 element `i` (i64) of `src`
    fn load_src(&mut self, src: &Src, i: &str) -> String {
        match src {
            Src::Global(ptr) => self.load(ptr, i),
            Src::Shared(smt, at) => {
                let ca = self.ci64(*at as i64);
                let j = self.op(&format!("arith.addi {ca}, {i} : i64"));
                let j = self.op(&format!("arith.index_cast {j} : i64 to index"));
                self.op(&format!("memref.load %sm[{j}] : {smt}"))
            }
        }
    }
    /// [`Body::rope_elem`] of a row in global memory or in shared memory
    #[allow(clippy::too_many_arguments)]
    fn rope_elem_src(&mut self, src: &Src, base: &str, e: &str, p: &str, d: usize, theta_bits: u32, interleaved: bool) -> String {
        let b = self;
        let (pair, partner, second) = if interleaved {
            let c1 = b.ci64(1);
            let pair = b.op(&format!("arith.shrui {e}, {c1} : i64"));
            let partner = b.op(&format!("arith.xori {e}, {c1} : i64"));
            let odd = b.op(&format!("arith.andi {e}, {c1} : i64"));
            let c0 = b.ci64(0);
            (pair, partner, b.op(&format!("arith.cmpi ne, {odd}, {c0} : i64")))
        } else {
            let ch = b.ci64((d / 2) as i64);
            let second = b.op(&format!("arith.cmpi sge, {e}, {ch} : i64"));
            let pair = b.op(&format!("arith.remui {e}, {ch} : i64"));
            let up = b.op(&format!("arith.addi {e}, {ch} : i64"));
            let down = b.op(&format!("arith.subi {e}, {ch} : i64"));
            (pair, b.op(&format!("arith.select {second}, {down}, {up} : i64")), second)
        };
        let (c, sn) = b.rope_cos_sin(&pair, p, d, theta_bits);
        let i = b.op(&format!("arith.addi {base}, {e} : i64"));
        let ip = b.op(&format!("arith.addi {base}, {partner} : i64"));
        let x = b.load_src(src, &i);
        let xp = b.load_src(src, &ip);
        let xps = b.op(&format!("arith.mulf {xp}, {sn} : f32"));
        let nxps = b.op(&format!("arith.negf {xps} : f32"));
        let t = b.op(&format!("arith.select {second}, {xps}, {nxps} : f32"));
        b.op(&format!("llvm.intr.fma({x}, {c}, {t}) : (f32, f32, f32) -> f32"))
    }
    fn rope_pair(&mut self, i: &str, ptr: &str, h: usize, d: usize, theta_bits: u32, interleaved: bool) -> (String, String, String, String, String) {
        let b = self;
        let half = d / 2;
        let ch = b.ci64(half as i64);
        let pair = b.op(&format!("arith.remui {i}, {ch} : i64"));
        let th = b.op(&format!("arith.divui {i}, {ch} : i64"));
        let hh = b.ci64(h as i64);
        let t = b.op(&format!("arith.divui {th}, {hh} : i64"));
        let p = b.load_i32_as_i64("%pos", &t);
        let (c, sn) = b.rope_cos_sin(&pair, &p, d, theta_bits);
        let dd = b.ci64(d as i64);
        let base = b.op(&format!("arith.muli {th}, {dd} : i64"));
        let (i0, i1) = if interleaved {
            let c2 = b.ci64(2);
            let p2 = b.op(&format!("arith.muli {pair}, {c2} : i64"));
            let a0 = b.op(&format!("arith.addi {base}, {p2} : i64"));
            let c1 = b.ci64(1);
            let a1 = b.op(&format!("arith.addi {a0}, {c1} : i64"));
            (a0, a1)
        } else {
            let a0 = b.op(&format!("arith.addi {base}, {pair} : i64"));
            let a1 = b.op(&format!("arith.addi {a0}, {ch} : i64"));
            (a0, a1)
        };
        let x0 = b.load_summed(ptr, &i0);
        let x1 = b.load_summed(ptr, &i1);
        // y0 = x0 c - x1 s, y1 = x1 c + x0 s
        let x1s = b.op(&format!("arith.mulf {x1}, {sn} : f32"));
        let nx1s = b.op(&format!("arith.negf {x1s} : f32"));
        let y0 = b.op(&format!("llvm.intr.fma({x0}, {c}, {nx1s}) : (f32, f32, f32) -> f32"));
        let x0s = b.op(&format!("arith.mulf {x0}, {sn} : f32"));
        let y1 = b.op(&format!("llvm.intr.fma({x1}, {c}, {x0s}) : (f32, f32, f32) -> f32"));
        (t, i0, i1, y0, y1)
    }
    /// (lane, warp) of thread index `t` (index values)
    /// `mma.sync m16n8k16` (f32 accumulators, `ty` = bf16 or f16 operands): A fragment `a`
    /// (4 x i32), B fragment `b0`, `b1`, accumulators `acc` (4 x f32); returns the new four.
    fn mma_m16n8k16(&mut self, ty: &str, a: [&str; 4], b0: &str, b1: &str, acc: [&str; 4]) -> Vec<String> {
        let st = "!llvm.struct<(f32, f32, f32, f32)>";
        let r = self.op(&format!(
            "llvm.inline_asm \"mma.sync.aligned.m16n8k16.row.col.f32.{ty}.{ty}.f32 {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};\", \"=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f\" {}, {}, {}, {}, {b0}, {b1}, {}, {}, {}, {} : (i32, i32, i32, i32, i32, i32, f32, f32, f32, f32) -> {st}",
            a[0], a[1], a[2], a[3], acc[0], acc[1], acc[2], acc[3]
        ));
        (0..4).map(|i| self.op(&format!("llvm.extractvalue {r}[{i}] : {st}"))).collect()
    }
    /// `ldmatrix.sync.aligned.m8n8.x{n}[.trans].shared.b16` (n = 2 or 4) from this lane's row
    /// address `addr` (i64, shared window) + `off` bytes (an immediate of the instruction: one
    /// base register serves a tile's loads): the n fragment registers (i32). Marked with side
    /// effects so it stays between the barriers that guard the tile it reads.
    fn ldmatrix(&mut self, addr: &str, off: i64, n: usize, trans: bool) -> Vec<String> {
        let a = self.op(&format!("arith.trunci {addr} : i64 to i32"));
        let st = format!("!llvm.struct<({})>", vec!["i32"; n].join(", "));
        let outs = (0..n).map(|i| format!("${i}")).collect::<Vec<_>>().join(",");
        let cons = vec!["=r"; n].join(",");
        let r = self.op(&format!(
            "llvm.inline_asm has_side_effects \"ldmatrix.sync.aligned.m8n8.x{n}{}.shared.b16 {{{outs}}}, [${n}+{off}];\", \"{cons},r\" {a} : (i32) -> {st}",
            if trans { ".trans" } else { "" }
        ));
        (0..n).map(|i| self.op(&format!("llvm.extractvalue {r}[{i}] : {st}"))).collect()
    }
    /// The D fragments of an m64nN warpgroup MMA (or an m16 mma per warp) stored through
    /// `matmul_store`: this thread's rows `ra` and `ra` + 8, columns `n0` + 8j + 2 tq (+1),
    /// value 4j + q of `vals`, each guarded by `%m` / `%n`.
    fn store_d_fragments(&mut self, ra: &str, n0: &str, tq: &str, cols: usize, vals: &[String], bias: bool, residual: bool) {
        let c8 = self.ci64(8);
        let c1 = self.ci64(1);
        let c2 = self.ci64(2);
        let rb = self.op(&format!("arith.addi {ra}, {c8} : i64"));
        let tq2 = self.op(&format!("arith.muli {tq}, {c2} : i64"));
        let nc = self.op(&format!("arith.addi {n0}, {tq2} : i64"));
        for j in 0..(cols / 8) as i64 {
            let cj = self.ci64(8 * j);
            let col0 = self.op(&format!("arith.addi {nc}, {cj} : i64"));
            for (q, row) in [(0usize, ra), (1, ra), (2, &rb), (3, &rb)] {
                let col = if q % 2 == 0 { col0.clone() } else { self.op(&format!("arith.addi {col0}, {c1} : i64")) };
                let rok = self.op(&format!("arith.cmpi slt, {row}, %m : i64"));
                let cok = self.op(&format!("arith.cmpi slt, {col}, %n : i64"));
                let both = self.op(&format!("arith.andi {rok}, {cok} : i1"));
                self.line(&format!("scf.if {both} {{"));
                self.matmul_store(&vals[4 * j as usize + q], row, &col, bias, residual);
                self.line("}");
            }
        }
    }
    /// A wgmma shared-memory matrix descriptor of the byte address `addr` (i64): bits 4..17 of
    /// it as the start field, OR'd with `fixed` (LBO, SBO and the swizzle mode)
    fn smem_desc(&mut self, addr: &str, fixed: u64) -> String {
        let mask = self.ci64(0x3FFFF);
        let c4 = self.ci64(4);
        let a = self.op(&format!("arith.andi {addr}, {mask} : i64"));
        let a = self.op(&format!("arith.shrui {a}, {c4} : i64"));
        let f = self.ci64(fixed as i64);
        self.op(&format!("arith.ori {a}, {f} : i64"))
    }
    /// The address field of a shared-memory matrix descriptor (bits 0-13: the address's bits
    /// 4-17) of the i64 address `addr`, as an i32: [`Body::desc_at`] makes descriptors from it
    fn smem_desc_lo(&mut self, addr: &str) -> String {
        let a = self.op(&format!("arith.trunci {addr} : i64 to i32"));
        let m = self.op("arith.constant 262143 : i32");
        let a = self.op(&format!("arith.andi {a}, {m} : i32"));
        let c4 = self.op("arith.constant 4 : i32");
        self.op(&format!("arith.shrui {a}, {c4} : i32"))
    }
    /// [`Body::smem_desc`] of the address `off` bytes past the one whose address field is `lo`
    /// ([`Body::smem_desc_lo`]): one 32-bit add on the low word (the field cannot carry out of
    /// its 14 bits: shared addresses are below 256 KB), the high word a constant — in place of
    /// 64-bit adds, shifts and masks per descriptor (~7 instructions each in the SASS)
    fn desc_at(&mut self, lo: &str, off: usize, fixed: u64) -> String {
        let c = self.op(&format!("arith.constant {} : i32", ((off as u64 >> 4) + (fixed & 0xFFFF_FFFF)) as u32 as i32));
        let l = self.op(&format!("arith.addi {lo}, {c} : i32"));
        let l = self.op(&format!("arith.extui {l} : i32 to i64"));
        let h = self.ci64((fixed & !0xFFFF_FFFF) as i64);
        self.op(&format!("arith.ori {l}, {h} : i64"))
    }
    /// One `wgmma.mma_async.sync.aligned.{shape}` (e.g. m64n64k16) of 16-bit `ty` operands:
    /// `acc` (f32) += A · B, A one shared-memory descriptor or four registers of m16n8k16
    /// fragments per warp, B the descriptor `b_desc`, read N-major where `trans_b`. The new
    /// accumulators are in flight until [`Body::wgmma_wait`]
    fn wgmma(&mut self, shape: &str, ty: &str, acc: &[String], a: &[String], b_desc: &str, trans_b: bool) -> Vec<String> {
        let n = acc.len();
        let f32s = vec!["f32"; n].join(", ");
        let stt = format!("!llvm.struct<({f32s})>");
        let outs: Vec<String> = (0..n).map(|i| format!("${i}")).collect();
        let tied = (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(",");
        let tb = trans_b as u8;
        let r = if let [ad] = a {
            self.op(&format!(
                "llvm.inline_asm has_side_effects \"wgmma.mma_async.sync.aligned.{shape}.f32.{ty}.{ty} {{{}}}, ${n}, ${}, 1, 1, 1, 0, {tb};\", \"{},l,l,{tied}\" {ad}, {b_desc}, {} : (i64, i64, {f32s}) -> {stt}",
                outs.join(","),
                n + 1,
                vec!["=f"; n].join(","),
                acc.join(", ")
            ))
        } else {
            self.op(&format!(
                "llvm.inline_asm has_side_effects \"wgmma.mma_async.sync.aligned.{shape}.f32.{ty}.{ty} {{{}}}, {{${}, ${}, ${}, ${}}}, ${}, 1, 1, 1, {tb};\", \"{},r,r,r,r,l,{tied}\" {}, {b_desc}, {} : (i32, i32, i32, i32, i64, {f32s}) -> {stt}",
                outs.join(","),
                n,
                n + 1,
                n + 2,
                n + 3,
                n + 4,
                vec!["=f"; n].join(","),
                a.join(", "),
                acc.join(", ")
            ))
        };
        (0..n).map(|i| self.op(&format!("llvm.extractvalue {r}[{i}] : {stt}"))).collect()
    }
    /// `wgmma.wait_group n` (all wgmma groups done but the newest `n`), the accumulators
    /// `vals` passing through it so nothing reads them early
    fn wgmma_wait(&mut self, n: usize, vals: &[String]) -> Vec<String> {
        let k = vals.len();
        let f32s = vec!["f32"; k].join(", ");
        let stt = format!("!llvm.struct<({f32s})>");
        let cons = format!("{},{}", vec!["=f"; k].join(","), (0..k).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
        let r = self.op(&format!("llvm.inline_asm has_side_effects \"wgmma.wait_group.sync.aligned {n};\", \"{cons}\" {} : ({f32s}) -> {stt}", vals.join(", ")));
        (0..k).map(|i| self.op(&format!("llvm.extractvalue {r}[{i}] : {stt}"))).collect()
    }
    /// [`Body::store_d_fragments`] for a whole wgmma tile of `cols` columns from `n0`: where
    /// both of this thread's rows are below %m, the tile's columns below %n and %n is even, the
    /// fragments go out as 8-byte pairs, each group of `chunk` column groups' residual and bias
    /// pairs loaded first (all in flight at once: the per-element path waits for each load in
    /// turn, y and res possibly aliasing); elsewhere the per-element path.
    #[allow(clippy::too_many_arguments)]
    fn store_d_tile(&mut self, ra: &str, n0: &str, tq: &str, cols: usize, vals: &[String], bias: bool, residual: bool, chunk: usize) {
        let c8 = self.ci64(8);
        let c1 = self.ci64(1);
        let c2 = self.ci64(2);
        let c0 = self.ci64(0);
        let rb = self.op(&format!("arith.addi {ra}, {c8} : i64"));
        let rok = self.op(&format!("arith.cmpi slt, {rb}, %m : i64"));
        let cc = self.ci64(cols as i64);
        let ne = self.op(&format!("arith.addi {n0}, {cc} : i64"));
        let cok = self.op(&format!("arith.cmpi sle, {ne}, %n : i64"));
        let odd = self.op(&format!("arith.andi %n, {c1} : i64"));
        let even = self.op(&format!("arith.cmpi eq, {odd}, {c0} : i64"));
        let full = self.op(&format!("arith.andi {rok}, {cok} : i1"));
        let full = self.op(&format!("arith.andi {full}, {even} : i1"));
        self.line(&format!("scf.if {full} {{"));
        let tq2 = self.op(&format!("arith.muli {tq}, {c2} : i64"));
        let nc = self.op(&format!("arith.addi {n0}, {tq2} : i64"));
        let c4 = self.ci64(4);
        let ya = self.op(&format!("arith.muli {ra}, %n : i64"));
        let yb = self.op(&format!("arith.muli {rb}, %n : i64"));
        let groups: Vec<usize> = (0..cols / 8).collect();
        for ch in groups.chunks(chunk.max(1)) {
            // (element offsets: columns, and (row, column) of y and res)
            let mut at = vec![];
            for &j in ch {
                let cj = self.ci64(8 * j as i64);
                let col = self.op(&format!("arith.addi {nc}, {cj} : i64"));
                let ia = self.op(&format!("arith.addi {ya}, {col} : i64"));
                let ib = self.op(&format!("arith.addi {yb}, {col} : i64"));
                at.push((col, ia, ib));
            }
            let bytes = |b: &mut Body, e: &str| b.op(&format!("arith.muli {e}, {c4} : i64"));
            let mut loaded = vec![];
            for (col, ia, ib) in &at {
                let bv = if bias {
                    let o = bytes(self, col);
                    Some(self.load_vec("%bias", &o, 2, "f32", 8))
                } else {
                    None
                };
                let rv = if residual {
                    let oa = bytes(self, ia);
                    let ob = bytes(self, ib);
                    Some((self.load_vec("%res", &oa, 2, "f32", 8), self.load_vec("%res", &ob, 2, "f32", 8)))
                } else {
                    None
                };
                loaded.push((bv, rv));
            }
            for (k, &j) in ch.iter().enumerate() {
                let (bv, rv) = &loaded[k];
                for (h, idx) in [(0usize, &at[k].1), (2, &at[k].2)] {
                    let mut out = vec![];
                    for e in 0..2 {
                        let mut v = vals[4 * j + h + e].clone();
                        if let Some(bv) = bv {
                            v = self.op(&format!("arith.addf {v}, {} : f32", bv[e]));
                        }
                        if let Some(a) = self.act {
                            v = unary_expr(self, a, &v).unwrap_or(v);
                        }
                        if let Some((r0, r1)) = rv {
                            let r = if h == 0 { &r0[e] } else { &r1[e] };
                            v = self.op(&format!("arith.addf {v}, {r} : f32"));
                        }
                        out.push(v);
                    }
                    let vv = self.vector(&out, "f32");
                    let o = bytes(self, idx);
                    let p = self.op(&format!("llvm.getelementptr %y[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                    self.line(&format!("llvm.store {vv}, {p} {{alignment = 8 : i64}} : vector<2xf32>, !llvm.ptr<1>"));
                }
            }
        }
        self.line("} else {");
        self.store_d_fragments(ra, n0, tq, cols, vals, bias, residual);
        self.line("}");
    }
    /// An mma fragment's coordinates of thread `t` (i64): (warp, lane, g = lane / 4, tq = lane
    /// % 4): the thread holds rows g and g + 8 of its warp's 16, columns 2 tq, 2 tq + 1 (+ 8).
    fn mma_coords(&mut self, t: &str) -> (String, String, String, String) {
        let c32 = self.ci64(32);
        let c4 = self.ci64(4);
        let warp = self.op(&format!("arith.divui {t}, {c32} : i64"));
        let lane = self.op(&format!("arith.remui {t}, {c32} : i64"));
        let g = self.op(&format!("arith.divui {lane}, {c4} : i64"));
        let tq = self.op(&format!("arith.remui {lane}, {c4} : i64"));
        (warp, lane, g, tq)
    }
    /// The opening of a block-per-row kernel: `scf.if row < %rows` (row = block x) opened, the
    /// caller closes it; (thread index, row as i64).
    fn open_block_row(&mut self) -> (String, String) {
        let t = self.op("gpu.thread_id x");
        let row = self.op("gpu.block_id x");
        let rowi = self.idx64(&row);
        let ok = self.op(&format!("arith.cmpi slt, {rowi}, %rows : i64"));
        self.line(&format!("scf.if {ok} {{"));
        (t, rowi)
    }
    /// The opening of a block-per-row kernel over rows of `d` floats, 4 per thread per loop
    /// step (`%red`: one f32 per warp of `warps`): `scf.if row < %rows` opened (the caller
    /// closes it); the loop's values.
    fn open_row_pieces(&mut self, d: usize, warps: usize) -> RowPieces {
        let nt = 32 * warps;
        let smt = format!("memref<{warps}xf32, #gpu.address_space<workgroup>>");
        self.workgroup = Some(format!("%red : {smt}"));
        let (t, rowi) = self.open_block_row();
        let c4 = self.op("arith.constant 4 : index");
        let t4 = self.op(&format!("arith.muli {t}, {c4} : index"));
        let dd = self.op(&format!("arith.constant {d} : index"));
        let step = self.op(&format!("arith.constant {} : index", 4 * nt));
        let dd64 = self.ci64(d as i64);
        let base = self.op(&format!("arith.muli {rowi}, {dd64} : i64"));
        let zero = self.cf32(0.0);
        let c4b = self.ci64(4);
        RowPieces { t, t4, dd, step, base, zero, c4b, smt }
    }
    /// An RMSNorm's 4-float piece at element `e` (i64) scaled: `out` = `xs` · `inv` · `gs`,
    /// and with `half` = (f16, pointer) its 16-bit copy.
    fn store_scaled_piece(&mut self, xs: &[String], gs: &[String], inv: &str, e: &str, out: &str, half: Option<(bool, &str)>) {
        let mut ys = vec![];
        for j in 0..4 {
            let xn = self.op(&format!("arith.mulf {}, {inv} : f32", xs[j]));
            let y = self.op(&format!("arith.mulf {xn}, {} : f32", gs[j]));
            let cj = self.ci64(j as i64);
            let yi = self.op(&format!("arith.addi {e}, {cj} : i64"));
            self.store(&y, out, &yi);
            ys.push(y);
        }
        if let Some((f16, ptr)) = half {
            self.store_half4(&ys, ptr, e, f16);
        }
    }
    /// An RMSNorm's scaling pass over the row pieces of [`Body::open_row_pieces`]: `out` =
    /// `src` · `inv` · `g` (g: one f32 per column), and with `half` = (f16, pointer) its
    /// 16-bit copy.
    fn scale_row_pieces(&mut self, r: &RowPieces, src: &str, g: &str, inv: &str, out: &str, half: Option<(bool, &str)>) {
        self.scale_row_pieces_from(r, src, None, g, inv, out, half)
    }
    /// [`Body::scale_row_pieces`] reading `src`'s row at element `src_base` (i64) where given
    /// (a gathered row), writing at the row's own place
    #[allow(clippy::too_many_arguments)]
    fn scale_row_pieces_from(&mut self, r: &RowPieces, src: &str, src_base: Option<&str>, g: &str, inv: &str, out: &str, half: Option<(bool, &str)>) {
        let RowPieces { t4, dd, step, base, c4b, .. } = r;
        let iv2 = self.v();
        self.line(&format!("scf.for {iv2} = {t4} to {dd} step {step} {{"));
        let i = self.idx64(&iv2);
        let e = self.op(&format!("arith.addi {base}, {i} : i64"));
        let se = match src_base {
            Some(sb) => self.op(&format!("arith.addi {sb}, {i} : i64")),
            None => e.clone(),
        };
        let bo = self.op(&format!("arith.muli {se}, {c4b} : i64"));
        let wo = self.op(&format!("arith.muli {i}, {c4b} : i64"));
        let xs = self.load_vec(src, &bo, 4, "f32", 16);
        let ws = self.load_vec(g, &wo, 4, "f32", 16);
        self.store_scaled_piece(&xs, &ws, inv, &e, out, half);
        self.line("}");
    }
    /// The split-K reduce's piece of 4 floats at element `e` (i64) of a row: the `splits` partial
    /// sums (slices `slice` elements apart) added in order (+ the residual), stored as y; returns
    /// the 4 sums and the sum of their squares.
    fn splitk_piece(&mut self, slice: &str, e: &str, splits: usize, residual: bool) -> (Vec<String>, String) {
        let c4b = self.ci64(4);
        let mut loads = vec![];
        for sp in 0..splits {
            let cs = self.ci64(sp as i64);
            let so = self.op(&format!("arith.muli {slice}, {cs} : i64"));
            let at = self.op(&format!("arith.addi {so}, {e} : i64"));
            let bo = self.op(&format!("arith.muli {at}, {c4b} : i64"));
            loads.push(self.load_vec("%parts", &bo, 4, "f32", 16));
        }
        if residual {
            let bo = self.op(&format!("arith.muli {e}, {c4b} : i64"));
            loads.push(self.load_vec("%res", &bo, 4, "f32", 16));
        }
        let mut ys = loads[0].clone();
        for l in &loads[1..] {
            for (y, v) in ys.iter_mut().zip(l) {
                *y = self.op(&format!("arith.addf {y}, {v} : f32"));
            }
        }
        for (j, y) in ys.iter().enumerate() {
            let cj = self.ci64(j as i64);
            let yi = self.op(&format!("arith.addi {e}, {cj} : i64"));
            self.store(y, "%y", &yi);
        }
        let sq: Vec<String> = ys.iter().map(|y| self.op(&format!("arith.mulf {y}, {y} : f32"))).collect();
        let s4 = self.sum4(&sq);
        (ys, s4)
    }
    fn lane_warp(&mut self, t: &str) -> (String, String) {
        let c32 = self.op("arith.constant 32 : index");
        let lane = self.op(&format!("arith.remui {t}, {c32} : index"));
        let warp = self.op(&format!("arith.divui {t}, {c32} : index"));
        (lane, warp)
    }
    /// Sum of `v` over a block of `warps` warps (`t`: the thread index): a warp sum, one
    /// partial per warp through the shared `%red` (`smt`), a barrier, then every thread adds
    /// the partials to `init`.
    fn block_sum(&mut self, v: &str, t: &str, warps: usize, smt: &str, init: &str) -> String {
        let part = self.warp_sum(v);
        let (lane, warp) = self.lane_warp(&t);
        let zi = self.op("arith.constant 0 : index");
        let l0 = self.op(&format!("arith.cmpi eq, {lane}, {zi} : index"));
        self.line(&format!("scf.if {l0} {{"));
        self.line(&format!("memref.store {part}, %red[{warp}] : {smt}"));
        self.line("}");
        self.line("gpu.barrier");
        let mut total = init.to_string();
        for w in 0..warps {
            let wi = self.op(&format!("arith.constant {w} : index"));
            let v = self.op(&format!("memref.load %red[{wi}] : {smt}"));
            total = self.op(&format!("arith.addf {total}, {v} : f32"));
        }
        total
    }
    /// y at element index `i` of a [T, row] tensor (token t) into the pool row slots[t]
    fn store_to_slot(&mut self, y: &str, i: &str, t: &str, row: usize, cache: &str, kv: DType) -> Result<(), String> {
        let r = self.ci64(row as i64);
        let slot = self.load_i32_as_i64("%slots", t);
        let tb = self.op(&format!("arith.muli {t}, {r} : i64"));
        let sb = self.op(&format!("arith.muli {slot}, {r} : i64"));
        let o = self.op(&format!("arith.subi {i}, {tb} : i64"));
        let dst = self.op(&format!("arith.addi {sb}, {o} : i64"));
        self.store_kv(y, cache, &dst, kv)
    }
    fn matmul_store(&mut self, v: &str, row: &str, col: &str, bias: bool, residual: bool) {
        let v = if bias {
            let bv = self.load("%bias", col);
            self.op(&format!("arith.addf {v}, {bv} : f32"))
        } else {
            v.to_string()
        };
        // (the MatMulAct wrapper checked that the activation lowers)
        let v = match self.act {
            Some(a) => unary_expr(self, a, &v).unwrap_or(v),
            None => v,
        };
        let yr = self.op(&format!("arith.muli {row}, %n : i64"));
        let yi = self.op(&format!("arith.addi {yr}, {col} : i64"));
        let v = if residual {
            let r = self.load("%res", &yi);
            self.op(&format!("arith.addf {v}, {r} : f32"))
        } else {
            v
        };
        self.store(&v, "%y", &yi);
        if self.copy_y {
            self.store(&v, "%y2", &yi);
        }
    }
    /// The split-K loop of the GEMV kernels over `rounds` rounds whose item index is `base +
    /// round * stride` (i64): rounds `0..jloop` in an `scf.for`, `unroll` per iteration (the
    /// body gets their indices and the accumulators and returns the new ones), the rest one at
    /// a time under `index < limit`. Returns the `per` f32 accumulators.
    #[allow(clippy::too_many_arguments)]
    fn split_k_rounds(&mut self, per: usize, jloop: usize, rounds: usize, unroll: usize, base: &str, stride: i64, limit: i64, body: &RoundBody) -> Vec<String> {
        let zero = self.cf32(0.0);
        self.split_k_rounds_from(0, vec![zero; per], jloop, rounds, unroll, base, stride, limit, body)
    }
    /// [`Body::split_k_rounds`] from round `from` (a multiple of `unroll`, at most `jloop`)
    /// with the accumulators `init`: the caller ran the rounds before it (the GEMV's first
    /// rounds, whose weights it loaded before waiting for the previous kernel)
    #[allow(clippy::too_many_arguments)]
    fn split_k_rounds_from(&mut self, from: usize, init: Vec<String>, jloop: usize, rounds: usize, unroll: usize, base: &str, stride: i64, limit: i64, body: &RoundBody) -> Vec<String> {
        let per = init.len();
        let tys = vec!["f32"; per].join(", ");
        let mut acc = init;
        if jloop > from {
            let res = self.v();
            let j = self.v();
            let args: Vec<String> = (0..per).map(|_| self.v()).collect();
            let lo = self.op(&format!("arith.constant {from} : index"));
            let hi = self.op(&format!("arith.constant {jloop} : index"));
            let st = self.op(&format!("arith.constant {unroll} : index"));
            let inits: Vec<String> = args.iter().zip(&acc).map(|(a, z)| format!("{a} = {z}")).collect();
            self.line(&format!("{res}:{per} = scf.for {j} = {lo} to {hi} step {st} iter_args({}) -> ({tys}) {{", inits.join(", ")));
            let j64 = self.idx64(&j);
            let cs = self.ci64(stride);
            let jo = self.op(&format!("arith.muli {j64}, {cs} : i64"));
            let ub = self.op(&format!("arith.addi {base}, {jo} : i64"));
            let idx: Vec<String> = (0..unroll)
                .map(|q| {
                    let c = self.ci64(q as i64 * stride);
                    self.op(&format!("arith.addi {ub}, {c} : i64"))
                })
                .collect();
            let out = body(self, &idx, &args);
            self.line(&format!("scf.yield {} : {tys}", out.join(", ")));
            self.line("}");
            acc = (0..per).map(|i| format!("{res}#{i}")).collect();
        }
        for jr in jloop..rounds {
            let c = self.ci64(jr as i64 * stride);
            let u = self.op(&format!("arith.addi {base}, {c} : i64"));
            let cu = self.ci64(limit);
            let ok = self.op(&format!("arith.cmpi slt, {u}, {cu} : i64"));
            let res = self.v();
            self.line(&format!("{res}:{per} = scf.if {ok} -> ({tys}) {{"));
            let out = body(self, &[u], &acc);
            self.line(&format!("scf.yield {} : {tys}", out.join(", ")));
            self.line("} else {");
            self.line(&format!("scf.yield {} : {tys}", acc.join(", ")));
            self.line("}");
            acc = (0..per).map(|i| format!("{res}#{i}")).collect();
        }
        acc
    }
    /// The GEMV norm prologue's sum of x² over the block's `nw` warps: slot `per` of each
    /// warp's `slots` partial sums in the reduction memref `%red` (of type `smt`).
    fn norm_sum_of_squares(&mut self, nw: usize, slots: usize, per: usize, smt: &str) -> String {
        let mut ss = self.cf32(0.0);
        for w in 0..nw {
            let at = self.op(&format!("arith.constant {} : index", w * slots + per));
            let v = self.op(&format!("memref.load %red[{at}] : {smt}"));
            ss = self.op(&format!("arith.addf {ss}, {v} : f32"));
        }
        ss
    }
    /// [`Body::split_k_rounds`] of a matmul whose weights do not depend on the previous kernel
    /// (the lowering gives matmuls graph weights only): where the kernel has not waited for
    /// it yet (PDL) and the schedule has a whole unrolled round, that round's weights (`load`:
    /// one item's) are issued before `griddepcontrol.wait`, so a block that starts during the
    /// previous kernel's tail streams its weights meanwhile (no extra traffic, unlike the L2
    /// prefetch; DSC_GEMV_PRELOAD=0 off). `body` does a round's math with its weights loaded
    /// there (None) or already.
    #[allow(clippy::too_many_arguments)]
    fn split_k_rounds_preloaded<W>(
        &mut self,
        per: usize,
        jloop: usize,
        rounds: usize,
        unroll: usize,
        base: &str,
        stride: i64,
        limit: i64,
        load: &dyn Fn(&mut Body, &str) -> W,
        body: &dyn Fn(&mut Body, &[String], &[String], Option<&[W]>) -> Vec<String>,
    ) -> Vec<String> {
        let plain = |b: &mut Body, us: &[String], acc: &[String]| body(b, us, acc, None);
        if !(self.pdl && !self.waited && jloop >= unroll && self.o.gemv_preload) {
            return self.split_k_rounds(per, jloop, rounds, unroll, base, stride, limit, &plain);
        }
        let idx: Vec<String> = (0..unroll)
            .map(|q| {
                let c = self.ci64(q as i64 * stride);
                self.op(&format!("arith.addi {base}, {c} : i64"))
            })
            .collect();
        let pre: Vec<W> = idx.iter().map(|u| load(self, u)).collect();
        self.wait_for_previous();
        let zero = self.cf32(0.0);
        let acc0 = body(self, &idx, &vec![zero; per], Some(&pre));
        self.split_k_rounds_from(unroll, acc0, jloop, rounds, unroll, base, stride, limit, &plain)
    }
    /// `xs` (f32 values, at least one) folded left to right by the binary op `op`
    fn chain_reduce(&mut self, xs: &[String], op: &str) -> String {
        let mut acc = xs[0].clone();
        for x in &xs[1..] {
            acc = self.op(&format!("{op} {acc}, {x} : f32"));
        }
        acc
    }
    /// `xs` (f32 values, at least one) reduced by the binary op `op` as a pairwise tree
    /// (log2 dependent steps)
    fn tree_reduce(&mut self, xs: &[String], op: &str) -> String {
        let mut v = xs.to_vec();
        while v.len() > 1 {
            let mut next = Vec::with_capacity(v.len().div_ceil(2));
            for p in v.chunks(2) {
                next.push(if let [a, c] = p { self.op(&format!("{op} {a}, {c} : f32")) } else { p[0].clone() });
            }
            v = next;
        }
        v[0].clone()
    }
    /// Spin until the shared-memory mbarrier at `mb` (i32 address) completes the phase of
    /// parity `par` (i32)
    fn mbar_spin(&mut self, mb: &str, par: &str) {
        self.line("scf.while : () -> () {");
        let r = self.op(&format!(
            "llvm.inline_asm has_side_effects \"{{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [$1], $2; selp.u32 $0, 1, 0, p; }}\", \"=r,r,r\" {mb}, {par} : (i32, i32) -> i32"
        ));
        let z = self.op("arith.constant 0 : i32");
        let pending = self.op(&format!("arith.cmpi eq, {r}, {z} : i32"));
        self.line(&format!("scf.condition({pending})"));
        self.line("} do {");
        self.line("scf.yield");
        self.line("}");
    }
    /// The paged KV pools' element offset of key `j` of a sequence whose block-table row
    /// starts at `trow`, for KV head `kh` (i64 values; `cbs`, `ckvh`, `cd`: the block size,
    /// KV heads and head dim as i64 constants): ((table[trow + j / bs] · bs + j % bs) · kvh +
    /// kh) · d
    fn paged_key_offset(&mut self, j: &str, trow: &str, kh: &str, cbs: &str, ckvh: &str, cd: &str) -> String {
        let bj = self.op(&format!("arith.divui {j}, {cbs} : i64"));
        let oj = self.op(&format!("arith.remui {j}, {cbs} : i64"));
        let ti = self.op(&format!("arith.addi {trow}, {bj} : i64"));
        let blk = self.load_i32_as_i64("%table", &ti);
        let row = self.op(&format!("arith.muli {blk}, {cbs} : i64"));
        let row = self.op(&format!("arith.addi {row}, {oj} : i64"));
        let row = self.op(&format!("arith.muli {row}, {ckvh} : i64"));
        let row = self.op(&format!("arith.addi {row}, {kh} : i64"));
        self.op(&format!("arith.muli {row}, {cd} : i64"))
    }
    /// `griddepcontrol.wait` here (what the previous kernel wrote is visible after it), not at
    /// the kernel's start (`emit_for`)
    fn wait_for_previous(&mut self) {
        self.line("llvm.inline_asm has_side_effects \"griddepcontrol.wait;\", \"~{memory}\" : () -> ()");
        self.waited = true;
    }
    /// `i` = global thread index; opens `scf.if i < %n` (close it with `b.line("}")`)
    fn open_guarded_gid(&mut self) -> String {
        let i = self.gid();
        let ok = self.op(&format!("arith.cmpi slt, {i}, %n : i64"));
        self.line(&format!("scf.if {ok} {{"));
        i
    }
    /// (row, lane) as i64 of a warp-per-row kernel (`Launch::WarpPerRow`, 4 rows per block);
    /// opens `scf.if row < %n` (close it with `b.line("}")`)
    fn open_guarded_warp_row(&mut self) -> (String, String) {
        let t = self.op("gpu.thread_id x");
        let blk = self.op("gpu.block_id x");
        let (lane, warp) = self.lane_warp(&t);
        let rpb = self.op("arith.constant 4 : index");
        let r0 = self.op(&format!("arith.muli {blk}, {rpb} : index"));
        let row = self.op(&format!("arith.addi {r0}, {warp} : index"));
        let row = self.idx64(&row);
        let lane = self.idx64(&lane);
        let ok = self.op(&format!("arith.cmpi slt, {row}, %n : i64"));
        self.line(&format!("scf.if {ok} {{"));
        (row, lane)
    }
    /// global thread index as i64
    fn gid(&mut self) -> String {
        let b = self.op("gpu.block_id x");
        let d = self.op("gpu.block_dim x");
        let t = self.op("gpu.thread_id x");
        let m = self.op(&format!("arith.muli {b}, {d} : index"));
        let i = self.op(&format!("arith.addi {m}, {t} : index"));
        self.op(&format!("arith.index_cast {i} : index to i64"))
    }
}

/// The split-K schedule of the GEMV kernels: `items` (16-byte units or 32-wide K steps) in
/// chunks of `chunk` (a warp's lanes take one item each), warp w of `nw` taking chunks w,
/// w + nw, ... in rounds. Returns (the rounds every warp runs unguarded — whole chunks only,
/// a multiple of `unroll` —, all rounds); rounds past the first are guarded by item < items.
pub fn split_k_schedule(items: usize, chunk: usize, nw: usize, unroll: usize) -> (usize, usize) {
    let (chunks, full) = (items.div_ceil(chunk), items / chunk);
    ((full / nw) / unroll * unroll, chunks.div_ceil(nw))
}

/// The decode GEMV for plain-float weights: y[row, col] = x[row, :] . W[col, :] for `R`
/// consecutive cols and `mr` consecutive rows per block (grid (ceil(N / R), ceil(M / mr))),
/// the block's warps splitting K.
///
/// Each warp reads a 512-byte chunk of a weight row per instruction (lane l: bytes 16l..16l+16,
/// fully coalesced) and the matching activations of its `mr` rows once for all R weight rows;
/// warp w takes chunks w, w + W, w + 2W, ..., `unroll` chunks per loop iteration with every load
/// issued before the FMAs. Each weight byte is read once per block for `mr` activation rows
/// (the batched-decode variant, `mr` > 1, takes M as a parameter). A lane's partial sums are
/// reduced over the warp, then across warps in shared memory, and threads 0..R*mr run the
/// epilogue. Rows past N (and past M) are clamped for loading and not stored. The earlier
/// warp-per-output kernel had lanes 64 bytes apart in every load and ran at ~1.5 TB/s on the
/// H200: L1-wavefront bound (see docs/perf.md).
fn emit_gemv(b: &mut Body, k: usize, n: usize, wdtype: DType, bias: bool, residual: bool, mr: usize) -> Result<(), String> {
    if !k.is_multiple_of(32) {
        return Err(format!("matmul needs K a multiple of 32, got {k}"));
    }
    let (r, unroll) = gemv_tiling(k, n, mr);
    let nw = GEMV_WARPS;
    if r * mr > 32 * nw {
        return Err(format!("GEMV tiling {r} outputs x {mr} rows exceeds the block's {} threads", 32 * nw));
    }
    let esz = wdtype.block().1;
    let e = 16 / esz; // elements per 16-byte unit
    let units = k / e;
    let (jloop, rounds) = split_k_schedule(units, 32, nw, unroll);
    let norm = if mr == 1 { b.norm } else { None };
    if b.norm.is_some() && mr != 1 {
        return Err("the norm prologue is for the one-row decode GEMV".into());
    }
    let per = r * mr; // partial sums per lane: [row i][output j] at i * r + j
                      // with the norm prologue one more: the sum of x^2 (slot `per`)
    let slots = per + usize::from(norm.is_some());
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", nw * slots);
    b.workgroup = Some(format!("%red : {smt}"));
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (t64, bx64, by64, lane64, warp64) = (b.idx64(&t), b.idx64(&bx), b.idx64(&by), b.idx64(&lane), b.idx64(&warp));
    let swiglu = b.swiglu && mr == 1;
    if b.swiglu && (mr != 1 || r % 2 != 0) {
        return Err("the SwiGLU epilogue is for the one-row decode GEMV with an even tiling".into());
    }
    // (SwiGLU: output j of the block is gate row col0 + j for j < r/2, up row col0 + j - r/2)
    let half = if swiglu { r / 2 } else { r };
    let wptr: Vec<&str> = (0..r)
        .map(|j| {
            if !swiglu {
                "%w"
            } else if j < half {
                "%w0"
            } else {
                "%w1"
            }
        })
        .collect();
    let cr = b.ci64(half as i64);
    let col0 = b.op(&format!("arith.muli {bx64}, {cr} : i64"));
    let cmr = b.ci64(mr as i64);
    let row0 = b.op(&format!("arith.muli {by64}, {cmr} : i64"));
    let one = b.ci64(1);
    let nlast = b.op(&format!("arith.subi %n, {one} : i64"));
    let rowbytes = b.ci64((k * esz) as i64);
    let wbase: Vec<String> = (0..r)
        .map(|j| {
            let cj = b.ci64((j % half) as i64);
            let c = b.op(&format!("arith.addi {col0}, {cj} : i64"));
            let c = b.op(&format!("arith.minsi {c}, {nlast} : i64"));
            b.op(&format!("arith.muli {c}, {rowbytes} : i64"))
        })
        .collect();
    if b.pdl && mr == 1 && n * k * esz <= GEMV_PREFETCH_MAX_BYTES && b.o.gemv_prefetch {
        // the weights do not depend on the previous kernel: while it finishes, thread j
        // prefetches this block's weight row j into L2 (one bulk prefetch), then waits.
        // Measured (bench/results/gemv-prefetch-*.json): SmolLM2 decode b1 +14%, but the 8B
        // shape's 33-235 MB GEMVs 15% slower (down_proj 31 -> 44 us), hence the size limit
        let rb = b.op(&format!("arith.constant {} : i32", k * esz));
        for (j, wb) in wbase.iter().enumerate() {
            let cj = b.ci64(j as i64);
            let me = b.op(&format!("arith.cmpi eq, {t64}, {cj} : i64"));
            b.line(&format!("scf.if {me} {{"));
            let p = b.op(&format!("llvm.getelementptr {}[{wb}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8", wptr[j]));
            b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.bulk.prefetch.L2.global [$0], $1;\", \"l,r\" {p}, {rb} : (!llvm.ptr<1>, i32) -> ()"));
            b.line("}");
        }
        b.wait_for_previous();
    }
    let xrow = b.ci64((k * 4) as i64);
    // (GatherX: x from row tok[row] of the 16-bit table, 2 bytes an element; block 0 writes it
    // as f32 at the row's own place, `xout`)
    let gather = b.gather_x && mr == 1 && e == 8;
    if b.gather_x && !gather {
        return Err("the gathered x needs the one-row GEMV over 16-bit weights".into());
    }
    let (xout, bx0, tbase) = if gather {
        let xw = b.op(&format!("arith.muli {row0}, {xrow} : i64"));
        let c0 = b.ci64(0);
        let first = b.op(&format!("arith.cmpi eq, {bx64}, {c0} : i64"));
        let tok = b.load_i32_as_i64("%tok", &row0);
        let trow = b.ci64((k * 2) as i64);
        (Some(xw), Some(first), Some(b.op(&format!("arith.muli {tok}, {trow} : i64"))))
    } else {
        (None, None, None)
    };
    let xbase: Vec<String> = (0..mr)
        .map(|i| {
            let row = if mr == 1 {
                row0.clone()
            } else {
                let ci = b.ci64(i as i64);
                let rw = b.op(&format!("arith.addi {row0}, {ci} : i64"));
                let mlast = b.op(&format!("arith.subi %m, {one} : i64"));
                b.op(&format!("arith.minsi {rw}, {mlast} : i64"))
            };
            b.op(&format!("arith.muli {row}, {xrow} : i64"))
        })
        .collect();
    let c32l = b.ci64(32);
    let wl = b.op(&format!("arith.muli {warp64}, {c32l} : i64"));
    let u0 = b.op(&format!("arith.addi {wl}, {lane64} : i64"));
    // the weights of the 16-byte unit `u` (i64 unit index): per output j, its words
    let load_w = |b: &mut Body, u: &str| -> Vec<Vec<String>> {
        let c16 = b.ci64(16);
        let wo = b.op(&format!("arith.muli {u}, {c16} : i64"));
        wbase
            .iter()
            .zip(&wptr)
            .map(|(base, ptr)| {
                let off = b.op(&format!("arith.addi {base}, {wo} : i64"));
                b.load_vec(ptr, &off, 4, if wdtype == DType::F32 { "f32" } else { "i32" }, 16)
            })
            .collect()
    };
    // the FMAs of the 16-byte units `us` (i64 unit indices) into `acc`, with their weights
    // loaded here or (`pre`) already
    let units_fma_pre = |b: &mut Body, us: &[String], acc: &[String], pre: Option<&[Vec<Vec<String>>]>| -> Vec<String> {
        let mut loaded = vec![];
        for (ui, u) in us.iter().enumerate() {
            let xb = b.ci64((e * 4) as i64);
            let xo = b.op(&format!("arith.muli {u}, {xb} : i64"));
            // (the unit's e f32 values, 16 bytes at a time; gathered: its 8 bf16 in one 16-byte
            // load, block 0 storing them as f32 into %x)
            let xs: Vec<Vec<String>> = match (&xout, &bx0) {
                (Some(xw), Some(first)) => {
                    let c16 = b.ci64(16);
                    let to = b.op(&format!("arith.muli {u}, {c16} : i64"));
                    let to = b.op(&format!("arith.addi {}, {to} : i64", tbase.as_deref().unwrap_or_default()));
                    let words = b.load_vec("%table", &to, 4, "i32", 16);
                    let v: Vec<String> = words.iter().flat_map(|w| b.bf16_pair(w)).collect();
                    b.line(&format!("scf.if {first} {{"));
                    let at = b.op(&format!("arith.addi {xw}, {xo} : i64"));
                    for half in 0..2 {
                        let vv = b.vector(&v[4 * half..4 * half + 4], "f32");
                        let ch = b.ci64(16 * half as i64);
                        let o = b.op(&format!("arith.addi {at}, {ch} : i64"));
                        let p = b.op(&format!("llvm.getelementptr %x[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                        b.line(&format!("llvm.store {vv}, {p} {{alignment = 16 : i64}} : vector<4xf32>, !llvm.ptr<1>"));
                    }
                    b.line("}");
                    vec![v]
                }
                _ => xbase
                    .iter()
                    .map(|base| {
                        let xo = b.op(&format!("arith.addi {base}, {xo} : i64"));
                        b.load_f32s("%x", &xo, e)
                    })
                    .collect(),
            };
            // the norm prologue: g for these elements (x's offsets without the row base)
            let gs: Vec<String> = if norm.is_some() { b.load_f32s("%g", &xo, e) } else { vec![] };
            let ws = match pre {
                Some(p) => p[ui].clone(),
                None => load_w(b, u),
            };
            loaded.push((xs, ws, gs));
        }
        let mut acc = acc.to_vec();
        for (xs, ws, gs) in loaded {
            // norm: sum x^2 of the raw x, then use x * g
            let xs: Vec<Vec<String>> = if gs.is_empty() {
                xs
            } else {
                for x in &xs[0] {
                    acc[per] = b.op(&format!("llvm.intr.fma({x}, {x}, {}) : (f32, f32, f32) -> f32", acc[per]));
                }
                vec![xs[0].iter().zip(&gs).map(|(x, g)| b.op(&format!("arith.mulf {x}, {g} : f32"))).collect()]
            };
            for (j, words) in ws.iter().enumerate() {
                let mut wf = vec![];
                for word in words {
                    match wdtype {
                        DType::F32 => wf.push(word.clone()),
                        DType::BF16 => wf.extend(b.bf16_pair(word)),
                        _ => wf.extend(b.f16_pair(word)),
                    }
                }
                for (i, xr) in xs.iter().enumerate() {
                    let a = i * r + j;
                    for (w, x) in wf.iter().zip(xr) {
                        acc[a] = b.op(&format!("llvm.intr.fma({w}, {x}, {}) : (f32, f32, f32) -> f32", acc[a]));
                    }
                }
            }
        }
        acc
    };
    // units between a warp's consecutive chunks; the last rounds are guarded (a partial
    // chunk, idle warps)
    let stride = (nw * 32) as i64;
    let acc = b.split_k_rounds_preloaded(slots, jloop, rounds, unroll, &u0, stride, units as i64, &load_w, &units_fma_pre);
    let sums: Vec<String> = acc.iter().map(|a| b.warp_sum(a)).collect();
    let c0 = b.op("arith.constant 0 : index");
    let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {first} {{"));
    let cper = b.op(&format!("arith.constant {slots} : index"));
    let wb = b.op(&format!("arith.muli {warp}, {cper} : index"));
    for (a, s) in sums.iter().enumerate() {
        let ca = b.op(&format!("arith.constant {a} : index"));
        let at = b.op(&format!("arith.addi {wb}, {ca} : index"));
        b.line(&format!("memref.store {s}, %red[{at}] : {smt}"));
    }
    b.line("}");
    b.line("gpu.barrier");
    if swiglu {
        // thread t < r/2 finishes column col0 + t: silu(gate sum t) * (up sum t + r/2)
        let ch64 = b.ci64(half as i64);
        let mine = b.op(&format!("arith.cmpi slt, {t64}, {ch64} : i64"));
        let col = b.op(&format!("arith.addi {col0}, {t64} : i64"));
        let inside = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
        let go = b.op(&format!("arith.andi {mine}, {inside} : i1"));
        b.line(&format!("scf.if {go} {{"));
        let chi = b.op(&format!("arith.constant {half} : index"));
        let tu = b.op(&format!("arith.addi {t}, {chi} : index"));
        let mut sums = vec![];
        for slot in [&t, &tu] {
            let mut total = String::new();
            for w in 0..nw {
                let cw = b.op(&format!("arith.constant {} : index", w * slots));
                let at = b.op(&format!("arith.addi {cw}, {slot} : index"));
                let v = b.op(&format!("memref.load %red[{at}] : {smt}"));
                total = if w == 0 { v } else { b.op(&format!("arith.addf {total}, {v} : f32")) };
            }
            sums.push(total);
        }
        if let Some(eps) = norm {
            // (the norm prologue: both sums scaled by 1/rms)
            let ss = b.norm_sum_of_squares(nw, slots, per, &smt);
            let inv = b.inv_rms(&ss, k, eps);
            for v in sums.iter_mut() {
                *v = b.op(&format!("arith.mulf {v}, {inv} : f32"));
            }
        }
        let s = unary_expr(b, UnaryOp::Silu, &sums[0])?;
        let y = b.op(&format!("arith.mulf {s}, {} : f32", sums[1]));
        b.matmul_store(&y, &row0, &col, false, false);
        b.line("}");
        return Ok(());
    }
    // thread t < r * mr finishes (row t / r, output t % r)
    let cper64 = b.ci64(per as i64);
    let mine = b.op(&format!("arith.cmpi slt, {t64}, {cper64} : i64"));
    b.line(&format!("scf.if {mine} {{"));
    let ti = b.op(&format!("arith.divui {t64}, {cr} : i64"));
    let tj = b.op(&format!("arith.remui {t64}, {cr} : i64"));
    let col = b.op(&format!("arith.addi {col0}, {tj} : i64"));
    let row = b.op(&format!("arith.addi {row0}, {ti} : i64"));
    let mut inside = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
    if mr > 1 {
        let rok = b.op(&format!("arith.cmpi slt, {row}, %m : i64"));
        inside = b.op(&format!("arith.andi {inside}, {rok} : i1"));
    }
    b.line(&format!("scf.if {inside} {{"));
    let mut total = String::new();
    for w in 0..nw {
        let cw = b.op(&format!("arith.constant {} : index", w * slots));
        let at = b.op(&format!("arith.addi {cw}, {t} : index"));
        let v = b.op(&format!("memref.load %red[{at}] : {smt}"));
        total = if w == 0 { v } else { b.op(&format!("arith.addf {total}, {v} : f32")) };
    }
    if let Some(eps) = norm {
        let ss = b.norm_sum_of_squares(nw, slots, per, &smt);
        let inv = b.inv_rms(&ss, k, eps);
        total = b.op(&format!("arith.mulf {total}, {inv} : f32"));
    }
    b.matmul_store(&total, &row, &col, bias, residual);
    b.line("}");
    b.line("}");
    Ok(())
}

/// The one-row GEMV for many short 16-bit rows (`KernelSpec::MatMulWide`: the lm_head of a
/// small model, 49,152 rows of 1,152 bytes for SmolLM2). The split-K GEMV gives such a
/// matrix 12,288 blocks of 4 rows whose threads mostly idle (72 units of a row over 128
/// threads) and re-load x each: 16.5 µs for 56.6 MB (3.4 TB/s). Here [`WIDE_LANES`] lanes take
/// a row (lane q: its units q, q + 8, ...: a warp's load instruction covers 4 rows' 128-byte
/// spans), so every lane holds the same share of x for all rows — loaded once, in registers
/// (with the norm prologue: scaled by g, the sum of squares over the row's 8 lanes) — and a
/// warp walks `groups` row groups of 32 / WIDE_LANES rows, its weights one stream of 16-byte
/// units of which `depth` are loaded ahead of the one being summed (the first ones before
/// `griddepcontrol.wait`: they do not depend on the previous kernel). Each row's sum: 4 accumulators per lane,
/// three xor shuffles; lane q = 0 stores. With the row gather (`RowGather`) x is row
/// `%idx[row]`.
fn emit_gemv_wide(b: &mut Body, k: usize, n: usize, wdtype: DType, bias: bool, residual: bool) -> Result<(), String> {
    let upl = k / 8 / WIDE_LANES; // 16-byte units per lane
    let rpw = 32 / WIDE_LANES; // rows per warp step
    let (groups, depth) = wide_tiling();
    // (the argmax's running (max, index) take the registers of one unit in flight: with the
    // norm the kernel spilled at 168)
    let depth = if b.argmax_fold { depth.saturating_sub(1).max(1) } else { depth };
    let nw = GEMV_WARPS;
    let opb = nw * rpw * groups;
    if b.argmax_fold && (bias || residual || b.act.is_some() || n > i32::MAX as usize) {
        return Err("the argmax folds into the wide GEMV without bias, residual or activation".into());
    }
    // (ptxas keeps to the registers 3 blocks of 128 threads per SM leave: the grid in one wave
    // on 132 SMs; x, g and the early weights would take ~230 with the norm prologue)
    b.flash_mincta = Some(3);
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (bx64, by64, lane64, warp64) = (b.idx64(&bx), b.idx64(&by), b.idx64(&lane), b.idx64(&warp));
    let cl = b.ci64(WIDE_LANES as i64);
    let sub = b.op(&format!("arith.divui {lane64}, {cl} : i64"));
    let q = b.op(&format!("arith.remui {lane64}, {cl} : i64"));
    // row of group 0: the block's opb rows, the warp's rpw * groups of them, the lane's row
    let copb = b.ci64(opb as i64);
    let r0 = b.op(&format!("arith.muli {bx64}, {copb} : i64"));
    let cwr = b.ci64((rpw * groups) as i64);
    let wr = b.op(&format!("arith.muli {warp64}, {cwr} : i64"));
    let r0 = b.op(&format!("arith.addi {r0}, {wr} : i64"));
    let row0 = b.op(&format!("arith.addi {r0}, {sub} : i64"));
    let one = b.ci64(1);
    let nlast = b.op(&format!("arith.subi %n, {one} : i64"));
    let c16 = b.ci64(16);
    let qoff = b.op(&format!("arith.muli {q}, {c16} : i64"));
    let rowbytes = b.ci64((k * 2) as i64);
    let row_of = |b: &mut Body, g: usize| -> String {
        let c = b.ci64((g * rpw) as i64);
        b.op(&format!("arith.addi {row0}, {c} : i64"))
    };
    // group g's row base (clamped to the last row), then unit i of it: 4 words
    let group_base = |b: &mut Body, g: usize| -> String {
        let r = row_of(b, g);
        let r = b.op(&format!("arith.minsi {r}, {nlast} : i64"));
        let base = b.op(&format!("arith.muli {r}, {rowbytes} : i64"));
        b.op(&format!("arith.addi {base}, {qoff} : i64"))
    };
    let load_unit = |b: &mut Body, base: &str, i: usize| -> Vec<String> {
        let c = b.ci64((i * WIDE_LANES * 16) as i64);
        let off = b.op(&format!("arith.addi {base}, {c} : i64"));
        b.load_vec("%w", &off, 4, "i32", 16)
    };
    // the weights stream as one sequence of (group, unit) items, `depth` items loaded ahead of
    // the one being summed (the first ones before the PDL wait)
    let items = groups * upl;
    let mut bases: Vec<Option<String>> = vec![None; groups];
    let mut inflight = std::collections::VecDeque::new();
    let mut next = 0;
    let mut issue = |b: &mut Body, next: &mut usize, inflight: &mut std::collections::VecDeque<Vec<String>>, until: usize| {
        while *next < until.min(items) {
            let (g, i) = (*next / upl, *next % upl);
            if bases[g].is_none() {
                bases[g] = Some(group_base(b, g));
            }
            let base = bases[g].clone().unwrap_or_default();
            inflight.push_back(load_unit(b, &base, i));
            *next += 1;
        }
    };
    if b.pdl && !b.waited && b.o.gemv_preload {
        issue(b, &mut next, &mut inflight, depth);
        b.wait_for_previous();
    }
    // x's units q + 8i of the row (gathered: row idx[row]), 8 floats each
    let xrow = if b.row_gather { b.load_i32_as_i64("%idx", &by64) } else { by64.clone() };
    let cxr = b.ci64((k * 4) as i64);
    let xbase = b.op(&format!("arith.muli {xrow}, {cxr} : i64"));
    let c32 = b.ci64(32);
    let q32 = b.op(&format!("arith.muli {q}, {c32} : i64"));
    let mut xs: Vec<Vec<String>> = vec![];
    let mut eos = vec![];
    for i in 0..upl {
        let c = b.ci64((i * WIDE_LANES * 32) as i64);
        let eo = b.op(&format!("arith.addi {q32}, {c} : i64"));
        let xo = b.op(&format!("arith.addi {xbase}, {eo} : i64"));
        xs.push(b.load_f32s("%x", &xo, 8));
        eos.push(eo);
    }
    let inv = match b.norm {
        Some(eps) => {
            // (the sum of squares first, then g a unit at a time: x, g and the early weights
            // at once would not fit 168 registers)
            let sq: Vec<String> = xs.iter().flatten().map(|x| b.op(&format!("arith.mulf {x}, {x} : f32"))).collect();
            let ss = b.tree_reduce(&sq, "arith.addf");
            let offs: Vec<i32> = (0..WIDE_LANES.trailing_zeros()).map(|l| 1 << l).collect();
            let ss = b.xor_reduce(&ss, "arith.addf", &offs);
            for (xr, eo) in xs.iter_mut().zip(&eos) {
                let gr = b.load_f32s("%g", eo, 8);
                for (x, g) in xr.iter_mut().zip(&gr) {
                    *x = b.op(&format!("arith.mulf {x}, {g} : f32"));
                }
            }
            Some(b.inv_rms(&ss, k, eps))
        }
        None => None,
    };
    let zero = b.cf32(0.0);
    let c0 = b.ci64(0);
    let first = b.op(&format!("arith.cmpi eq, {q}, {c0} : i64"));
    let offs: Vec<i32> = (0..WIDE_LANES.trailing_zeros()).rev().map(|l| 1 << l).collect();
    // (ArgmaxFold: the lane's (max, first index) over its groups' rows, in increasing order)
    let (ninf, big) = if b.argmax_fold { (b.op("arith.constant 0xFF800000 : f32"), b.op("arith.constant 2147483647 : i32")) } else { Default::default() };
    let (mut av, mut ai) = (ninf.clone(), big.clone());
    for g in 0..groups {
        // 4 accumulators (one per word of a unit): chains of 2·upl fmas
        let mut acc = vec![zero.clone(); 4];
        for (i, xr) in xs.iter().enumerate() {
            issue(b, &mut next, &mut inflight, g * upl + i + 1 + depth);
            let words = inflight.pop_front().ok_or("the wide GEMV's schedule lost a unit")?;
            for (wi, word) in words.iter().enumerate() {
                let pair = match wdtype {
                    DType::BF16 => b.bf16_pair(word),
                    _ => b.f16_pair(word),
                };
                for (e, w) in pair.iter().enumerate() {
                    acc[wi] = b.op(&format!("llvm.intr.fma({w}, {}, {}) : (f32, f32, f32) -> f32", xr[2 * wi + e], acc[wi]));
                }
            }
        }
        let s = b.tree_reduce(&acc, "arith.addf");
        let s = b.xor_reduce(&s, "arith.addf", &offs);
        let s = match &inv {
            Some(inv) => b.op(&format!("arith.mulf {s}, {inv} : f32")),
            None => s,
        };
        let col = row_of(b, g);
        let inside = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
        let go = b.op(&format!("arith.andi {first}, {inside} : i1"));
        b.line(&format!("scf.if {go} {{"));
        b.matmul_store(&s, &by64, &col, bias, residual);
        b.line("}");
        if b.argmax_fold {
            let sv = b.op(&format!("arith.select {inside}, {s}, {ninf} : f32"));
            let ci = b.op(&format!("arith.trunci {col} : i64 to i32"));
            // (the lane's rows come in increasing order)
            (av, ai) = argmax_keep(b, &av, &ai, &sv, &ci);
        }
    }
    if b.argmax_fold {
        argmax_blocks_reduce(b, ("%apart", "%async", "%aids"), &t, &bx64, &by64, &av, &ai, n.div_ceil(opb), nw, &ninf, &big);
    }
    Ok(())
}

/// The end of a split argmax ([`emit_argmax_split`]) and of the wide lm_head with the argmax
/// folded in ([`KernelSpec::ArgmaxFold`]): the block's (max, first index) of its threads' (`v`,
/// `i`) — warps through shared memory `%redv` / `%redi`, thread 0 combining them — into slot
/// `slot` of row `row`'s `blocks` partials in `part` (8 bytes: value, index), a GPU-scope
/// fence, the count in `sync[row]`; the block that counts last (its flag through shared
/// memory) has its warp 0 reduce the row's partials (ties by index, 0 where nothing is above
/// -inf, as the other argmax kernels) into `out[row]` (i32) and reset the count. `ptrs`: the
/// (part, sync, out) parameter names.
#[allow(clippy::too_many_arguments)]
fn argmax_blocks_reduce(b: &mut Body, ptrs: (&str, &str, &str), t: &str, slot: &str, row: &str, v: &str, i: &str, blocks: usize, warps: usize, ninf: &str, big: &str) {
    let (part, sync, out) = ptrs;
    let (smv, smi) = (format!("memref<{warps}xf32, #gpu.address_space<workgroup>>"), format!("memref<{}xi32, #gpu.address_space<workgroup>>", warps + 1));
    b.workgroup = Some(format!("%redv : {smv}, %redi : {smi}"));
    let (lane, warp, c0) = argmax_warps_to_shared(b, v, i, t, &smv, &smi);
    let flag = b.op(&format!("arith.constant {warps} : index"));
    let first = b.op(&format!("arith.cmpi eq, {t}, {c0} : index"));
    let (cs, c8, c4, z) = (b.ci64(blocks as i64), b.ci64(8), b.ci64(4), b.ci64(0));
    let pb = b.op(&format!("llvm.ptrtoint {part} : !llvm.ptr<1> to i64"));
    let prow = b.op(&format!("arith.muli {row}, {cs} : i64"));
    let sb = b.op(&format!("llvm.ptrtoint {sync} : !llvm.ptr<1> to i64"));
    let so = b.op(&format!("arith.muli {row}, {c4} : i64"));
    let sa = b.op(&format!("arith.addi {sb}, {so} : i64"));
    b.line(&format!("scf.if {first} {{"));
    let (mut bv, mut bi) = (ninf.to_string(), big.to_string());
    for w in 0..warps {
        let cw = b.op(&format!("arith.constant {w} : index"));
        let pv = b.op(&format!("memref.load %redv[{cw}] : {smv}"));
        let pi = b.op(&format!("memref.load %redi[{cw}] : {smi}"));
        (bv, bi) = argmax_take(b, &bv, &bi, &pv, &pi);
    }
    let at = b.op(&format!("arith.addi {prow}, {slot} : i64"));
    let so8 = b.op(&format!("arith.muli {at}, {c8} : i64"));
    let pa = b.op(&format!("arith.addi {pb}, {so8} : i64"));
    b.line(&format!("llvm.inline_asm has_side_effects \"st.relaxed.gpu.global.v2.b32 [$0], {{$1, $2}};\", \"l,f,r\" {pa}, {bv}, {bi} : (i64, f32, i32) -> ()"));
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"\" : () -> ()");
    let old = b.op(&format!("llvm.inline_asm has_side_effects \"atom.global.add.u32 $0, [$1], 1;\", \"=r,l\" {sa} : (i64) -> i32"));
    let sm1 = b.op(&format!("arith.constant {} : i32", blocks as i64 - 1));
    let last = b.op(&format!("arith.cmpi eq, {old}, {sm1} : i32"));
    let one = b.op("arith.constant 1 : i32");
    let zero = b.op("arith.constant 0 : i32");
    let fv = b.op(&format!("arith.select {last}, {one}, {zero} : i32"));
    b.line(&format!("memref.store {fv}, %redi[{flag}] : {smi}"));
    b.line("}");
    b.line("gpu.barrier");
    let fv = b.op(&format!("memref.load %redi[{flag}] : {smi}"));
    let zero = b.op("arith.constant 0 : i32");
    let is_last = b.op(&format!("arith.cmpi ne, {fv}, {zero} : i32"));
    let w0 = b.op(&format!("arith.cmpi eq, {warp}, {c0} : index"));
    let go = b.op(&format!("arith.andi {is_last}, {w0} : i1"));
    b.line(&format!("scf.if {go} {{"));
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"\" : () -> ()");
    let lane64 = b.idx64(&lane);
    let (mut bv, mut bi) = (ninf.to_string(), big.to_string());
    for m in 0..blocks.div_ceil(32) {
        // (lane l takes partials l, l + 32, ..: in increasing block order, so increasing index)
        let cm = b.ci64(32 * m as i64);
        let s = b.op(&format!("arith.addi {lane64}, {cm} : i64"));
        let valid = b.op(&format!("arith.cmpi slt, {s}, {cs} : i64"));
        let sc = b.op(&format!("arith.select {valid}, {s}, {z} : i64"));
        let at = b.op(&format!("arith.addi {prow}, {sc} : i64"));
        let so8 = b.op(&format!("arith.muli {at}, {c8} : i64"));
        let pa = b.op(&format!("arith.addi {pb}, {so8} : i64"));
        let pair = b.op(&format!("llvm.inline_asm has_side_effects \"ld.relaxed.gpu.global.v2.b32 {{$0, $1}}, [$2];\", \"=f,=r,l\" {pa} : (i64) -> !llvm.struct<(f32, i32)>"));
        let pv = b.op(&format!("llvm.extractvalue {pair}[0] : !llvm.struct<(f32, i32)>"));
        let pi = b.op(&format!("llvm.extractvalue {pair}[1] : !llvm.struct<(f32, i32)>"));
        let pv = b.op(&format!("arith.select {valid}, {pv}, {ninf} : f32"));
        let pi = b.op(&format!("arith.select {valid}, {pi}, {big} : i32"));
        (bv, bi) = argmax_keep(b, &bv, &bi, &pv, &pi);
    }
    let fi = argmax_settle(b, &bv, &bi, None, ninf, big);
    let lz = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {lz} {{"));
    let p = b.op(&format!("llvm.getelementptr {out}[{row}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
    b.line(&format!("llvm.store {fi}, {p} : i32, !llvm.ptr<1>"));
    // (the counter back to zero for the next launch: every block of the row has counted)
    b.line(&format!("llvm.inline_asm has_side_effects \"st.relaxed.gpu.global.u32 [$0], 0;\", \"l\" {sa} : (i64) -> ()"));
    b.line("}");
    b.line("}");
}

/// The batched-decode matmul on the tensor cores for bf16/f16 weights ("swap AB"): y^T = W x^T
/// with `mma.sync m16n8k16`, W as the 16-row A operand and up to 32 activation rows as four
/// 8-column B tiles. One block of [`gemv_mma_tiling`] warps per 16 outputs and 32 rows (grid
/// (ceil(N / 16), ceil(M / 32))); the warps split K in 32-wide steps (warp w: steps w, w + W,
/// ...), two steps per loop iteration with their loads issued first.
///
/// Because a dot product does not care in which order K is walked, the operands are laid out
/// so every lane does plain 16-byte loads: lane (g = lane / 4, t = lane % 4) loads elements
/// 8t..8t+8 of a step from W rows g and g + 8 (rows 64 bytes apart per 4 lanes: full sectors)
/// and from activation row g of each live B tile, and the fragment's logical k = 2t + e and
/// 2t + 8 + e map to physical 8t + e and 8t + 2 + e (first MMA) and 8t + 4 + e, 8t + 6 + e (second).
/// B tiles past M are skipped (a warp-uniform branch); partial sums meet in shared memory and
/// warp 0 runs the epilogue.
fn emit_gemv_mma(b: &mut Body, k: usize, wdtype: DType, bias: bool, residual: bool, x16: bool) -> Result<(), String> {
    if !k.is_multiple_of(32) {
        return Err(format!("matmul needs K a multiple of 32, got {k}"));
    }
    let f16 = match wdtype {
        DType::BF16 => false,
        DType::F16 => true,
        other => return Err(format!("the tensor-core batched GEMV takes bf16/f16 weights, not {other}")),
    };
    let (nw, unroll, na) = gemv_mma_tiling3();
    let nt = GEMV_MMA_ROWS / 8; // B tiles
    let steps = k / 32;
    let (jloop, rounds) = split_k_schedule(steps, 1, nw, unroll);
    // accumulators per lane: [A tile a][B tile j][4] at a * 4 nt + 4 j + i
    let per = 4 * nt * na;
    if nw * per * 32 * 4 > 48 * 1024 {
        return Err(format!("batched GEMV tiling: {nw} warps x {na} A tiles need {} KB of shared memory for the reduction (max 48)", nw * per * 32 * 4 / 1024));
    }
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", nw * per * 32);
    b.workgroup = Some(format!("%red : {smt}"));
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (bx64, by64, lane64, warp64) = (b.idx64(&bx), b.idx64(&by), b.idx64(&lane), b.idx64(&warp));
    let c4 = b.ci64(4);
    let g = b.op(&format!("arith.divui {lane64}, {c4} : i64"));
    let tq = b.op(&format!("arith.remui {lane64}, {c4} : i64"));
    let cout = b.ci64(16 * na as i64);
    let col0 = b.op(&format!("arith.muli {bx64}, {cout} : i64"));
    let cmt = b.ci64(GEMV_MMA_ROWS as i64);
    let row0 = b.op(&format!("arith.muli {by64}, {cmt} : i64"));
    let one = b.ci64(1);
    let nlast = b.op(&format!("arith.subi %n, {one} : i64"));
    let mlast = b.op(&format!("arith.subi %m, {one} : i64"));
    // byte offset of this lane's 8 elements within a step: 8t elements
    let c8 = b.ci64(8);
    let e0 = b.op(&format!("arith.muli {tq}, {c8} : i64"));
    let wrowbytes = b.ci64((k * 2) as i64);
    // A tile a's rows g and g + 8: wbase[2 a], wbase[2 a + 1]
    let wbase: Vec<String> = (0..na)
        .flat_map(|a| [16 * a as i64, 16 * a as i64 + 8])
        .map(|d| {
            let cd = b.ci64(d);
            let r = b.op(&format!("arith.addi {col0}, {g} : i64"));
            let r = b.op(&format!("arith.addi {r}, {cd} : i64"));
            let r = b.op(&format!("arith.minsi {r}, {nlast} : i64"));
            let o = b.op(&format!("arith.muli {r}, {wrowbytes} : i64"));
            let c2 = b.ci64(2);
            let eb = b.op(&format!("arith.muli {e0}, {c2} : i64"));
            b.op(&format!("arith.addi {o}, {eb} : i64"))
        })
        .collect();
    // (x16: x in 16 bits, the lane's 8 elements one 16-byte load already in pairs)
    let xsz = if x16 { 2 } else { 4 };
    let xrowbytes = b.ci64((k * xsz) as i64);
    let cxsz = b.ci64(xsz as i64);
    let mut xbase = vec![];
    let mut live = vec![];
    for j in 0..nt {
        let cj = b.ci64(8 * j as i64);
        let r0j = b.op(&format!("arith.addi {row0}, {cj} : i64"));
        live.push(b.op(&format!("arith.cmpi slt, {r0j}, %m : i64")));
        let r = b.op(&format!("arith.addi {r0j}, {g} : i64"));
        let r = b.op(&format!("arith.minsi {r}, {mlast} : i64"));
        let o = b.op(&format!("arith.muli {r}, {xrowbytes} : i64"));
        let eb = b.op(&format!("arith.muli {e0}, {cxsz} : i64"));
        xbase.push(b.op(&format!("arith.addi {o}, {eb} : i64")));
    }
    let ty = if f16 { "f16" } else { "bf16" };
    // the weights of the 32-wide K step `s` (i64 step index): [A tile][row g, row g + 8][4 words]
    let load_w = |b: &mut Body, s: &str| -> Vec<Vec<Vec<String>>> {
        let cb = b.ci64(64);
        let so = b.op(&format!("arith.muli {s}, {cb} : i64"));
        let loads: Vec<Vec<String>> = wbase
            .iter()
            .map(|base| {
                let off = b.op(&format!("arith.addi {base}, {so} : i64"));
                b.load_vec("%w", &off, 4, "i32", 16)
            })
            .collect();
        loads.chunks(2).map(|c| c.to_vec()).collect()
    };
    // the MMAs of the 32-wide K steps `ss` (i64 step indices) into `acc` ([tile][4]), with
    // their weights loaded here or (`pre`) already
    let steps_mma_pre = |b: &mut Body, ss: &[String], acc: &[String], pre: Option<&[Vec<Vec<Vec<String>>>]>| -> Vec<String> {
        let ws: Vec<Vec<Vec<Vec<String>>>> = match pre {
            Some(p) => p.to_vec(),
            None => ss.iter().map(|s| load_w(b, s)).collect(),
        };
        let mut out = acc.to_vec();
        for j in 0..nt {
            // this B tile's accumulators of every A tile
            let idx: Vec<usize> = (0..na).flat_map(|a| (0..4).map(move |i| a * 4 * nt + 4 * j + i)).collect();
            let cur: Vec<String> = idx.iter().map(|&i| out[i].clone()).collect();
            let f32s = vec!["f32"; cur.len()].join(", ");
            let res = if j > 0 {
                let res = b.v();
                b.line(&format!("{res}:{} = scf.if {} -> ({f32s}) {{", cur.len(), live[j]));
                Some(res)
            } else {
                None
            };
            let mut xs = vec![];
            for s in ss {
                let cb = b.ci64(32 * xsz as i64);
                let so = b.op(&format!("arith.muli {s}, {cb} : i64"));
                let off = b.op(&format!("arith.addi {}, {so} : i64", xbase[j]));
                if x16 {
                    xs.push(b.load_vec("%x", &off, 4, "i32", 16));
                    continue;
                }
                let mut v = b.load_vec("%x", &off, 4, "f32", 16);
                let c16b = b.ci64(16);
                let off2 = b.op(&format!("arith.addi {off}, {c16b} : i64"));
                v.extend(b.load_vec("%x", &off2, 4, "f32", 16));
                xs.push(v);
            }
            let mut c = cur.clone();
            for (si, x) in xs.iter().enumerate() {
                for half in 0..2 {
                    // the B fragment once, for every A tile
                    let (b0, b1) = if x16 { (x[2 * half].clone(), x[2 * half + 1].clone()) } else { (b.pack2(&x[4 * half], &x[4 * half + 1], f16), b.pack2(&x[4 * half + 2], &x[4 * half + 3], f16)) };
                    for a in 0..na {
                        let w = &ws[si][a];
                        let av = [w[0][2 * half].as_str(), &w[1][2 * half], &w[0][2 * half + 1], &w[1][2 * half + 1]];
                        let acc = [c[4 * a].clone(), c[4 * a + 1].clone(), c[4 * a + 2].clone(), c[4 * a + 3].clone()];
                        let out = b.mma_m16n8k16(ty, av, &b0, &b1, [&acc[0], &acc[1], &acc[2], &acc[3]]);
                        c[4 * a..4 * a + 4].clone_from_slice(&out);
                    }
                }
            }
            match res {
                Some(res) => {
                    b.line(&format!("scf.yield {} : {f32s}", c.join(", ")));
                    b.line("} else {");
                    b.line(&format!("scf.yield {} : {f32s}", cur.join(", ")));
                    b.line("}");
                    for (q, &i) in idx.iter().enumerate() {
                        out[i] = format!("{res}#{q}");
                    }
                }
                None => {
                    for (q, &i) in idx.iter().enumerate() {
                        out[i] = c[q].clone();
                    }
                }
            }
        }
        out
    };
    // K steps: warp w takes steps w, w + W, ...; the last rounds are guarded (idle warps)
    let acc = b.split_k_rounds_preloaded(per, jloop, rounds, unroll, &warp64, nw as i64, steps as i64, &load_w, &steps_mma_pre);
    // partial sums to shared memory at [warp][value][lane]; warp 0 adds them up and stores
    let cper = b.op(&format!("arith.constant {} : index", per * 32));
    let wb = b.op(&format!("arith.muli {warp}, {cper} : index"));
    for (a, v) in acc.iter().enumerate() {
        let ca = b.op(&format!("arith.constant {} : index", a * 32));
        let at = b.op(&format!("arith.addi {wb}, {ca} : index"));
        let at = b.op(&format!("arith.addi {at}, {lane} : index"));
        b.line(&format!("memref.store {v}, %red[{at}] : {smt}"));
    }
    b.line("gpu.barrier");
    let c0 = b.op("arith.constant 0 : index");
    let w0 = b.op(&format!("arith.cmpi eq, {warp}, {c0} : index"));
    b.line(&format!("scf.if {w0} {{"));
    // D fragment of tile j: value i at output col0 + g (+ 8 for i >= 2), row 8j + 2t + i % 2
    let c2 = b.ci64(2);
    let t2 = b.op(&format!("arith.muli {tq}, {c2} : i64"));
    for (a, part) in acc.iter().enumerate() {
        let (at, j, i) = (a / (4 * nt), (a / 4) % nt, a % 4);
        let mut total = part.clone();
        for w in 1..nw {
            let ca = b.op(&format!("arith.constant {} : index", (w * per + a) * 32));
            let at = b.op(&format!("arith.addi {ca}, {lane} : index"));
            let v = b.op(&format!("memref.load %red[{at}] : {smt}"));
            total = b.op(&format!("arith.addf {total}, {v} : f32"));
        }
        let co = b.ci64(16 * at as i64 + if i >= 2 { 8 } else { 0 });
        let col = b.op(&format!("arith.addi {col0}, {g} : i64"));
        let col = b.op(&format!("arith.addi {col}, {co} : i64"));
        let cr = b.ci64((8 * j + i % 2) as i64);
        let row = b.op(&format!("arith.addi {row0}, {t2} : i64"));
        let row = b.op(&format!("arith.addi {row}, {cr} : i64"));
        let okc = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
        let okr = b.op(&format!("arith.cmpi slt, {row}, %m : i64"));
        let ok = b.op(&format!("arith.andi {okc}, {okr} : i1"));
        b.line(&format!("scf.if {ok} {{"));
        b.matmul_store(&total, &row, &col, bias, residual);
        b.line("}");
    }
    b.line("}");
    Ok(())
}

/// Whether the fused one-token MLP kernel (`KernelSpec::SwiGluDown`) takes a [K] x, F
/// features and N outputs in blocks of `fb` features: whole 16-byte pieces of every row
/// (K and fb multiples of 8), a feature per warp at least, a thread per 4 outputs, and at most
/// 64 registers of preloaded gate/up weights per thread.
pub fn swiglu_down_fits(k: usize, f: usize, n: usize, fb: usize, fpw: usize) -> Result<(), String> {
    if fpw == 0 || k == 0 || k % 8 != 0 || fb == 0 || fb % 8 != 0 || fb % fpw != 0 || fb / fpw > 32 || f % fb != 0 {
        return Err(format!("the fused MLP needs K and the features per block multiples of 8 (at most 64), and F a multiple of them (K {k}, F {f}, {fb} per block)"));
    }
    let threads = 32 * fb / fpw;
    if n == 0 || n % 4 != 0 || n / 4 > threads {
        return Err(format!("the fused MLP needs N a multiple of 4 and at most 4 per thread ({threads} threads; N {n})"));
    }
    if 2 * fpw * (k / 8).div_ceil(32) * 4 > 64 {
        return Err(format!("the fused MLP's gate/up weights would take more than 64 registers a thread (K {k})"));
    }
    Ok(())
}

/// [`KernelSpec::SwiGluDown`]: see there. Thread t of warp w: the lane's 16-byte pieces
/// l, l + 32, .. of K (clamped, x zeroed past K) of its warp's gate and up rows, then
/// (t < N/4) W_down's rows t + i·N/4 at the block's features; every weight and g loaded before
/// `griddepcontrol.wait`, x after it.
fn emit_swiglu_down(b: &mut Body, k: usize, f: usize, n: usize, eps: f32, fb: usize, fpw: usize) -> Result<(), String> {
    let rounds = (k / 8).div_ceil(32);
    let smt = format!("memref<{fb}xf32, #gpu.address_space<workgroup>>");
    b.workgroup = Some(format!("%red : {smt}"));
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let (lane, warp) = b.lane_warp(&t);
    let (t64, bx64, by64, warp64) = (b.idx64(&t), b.idx64(&bx), b.idx64(&by), b.idx64(&warp));
    let cfb = b.ci64(fb as i64);
    let f0 = b.op(&format!("arith.muli {bx64}, {cfb} : i64"));
    let cfpw = b.ci64(fpw as i64);
    let wf = b.op(&format!("arith.muli {warp64}, {cfpw} : i64"));
    let fw = b.op(&format!("arith.addi {f0}, {wf} : i64"));
    // the lane's pieces of K, clamped to the last, and whether each is real
    let (uoff, valid) = lane_pieces(b, k, &lane);
    let c16 = b.ci64(16);
    let c32 = b.ci64(32);
    // gate rows fw..fw+fpw, then the same features' up rows: per row, per round, 4 words
    let rowbytes = b.ci64((k * 2) as i64);
    let mut wrows: Vec<Vec<Vec<String>>> = vec![];
    for ptr in ["%wg", "%wu"] {
        for j in 0..fpw {
            let cj = b.ci64(j as i64);
            let fr = b.op(&format!("arith.addi {fw}, {cj} : i64"));
            let base = b.op(&format!("arith.muli {fr}, {rowbytes} : i64"));
            let mut row = vec![];
            for u in &uoff {
                let o = b.op(&format!("arith.muli {u}, {c16} : i64"));
                let off = b.op(&format!("arith.addi {base}, {o} : i64"));
                row.push(b.load_vec(ptr, &off, 4, "i32", 16));
            }
            wrows.push(row);
        }
    }
    // W_down's rows t + i·N/4 (t clamped to N/4 - 1) at the block's fb features (a warp's
    // reductions then cover 32 consecutive floats: 4 sectors per instruction)
    let cq = b.ci64((n / 4) as i64 - 1);
    let tt = b.op(&format!("arith.minsi {t64}, {cq} : i64"));
    let dbytes = b.ci64((f * 2) as i64);
    let c2 = b.ci64(2);
    let fo = b.op(&format!("arith.muli {f0}, {c2} : i64"));
    // (DSC_MLP_RED_V4=1 at compile time: rows 4t + i instead, the four sums added by one
    // `red.global.add.v4.f32` — a warp's instruction covers 128 consecutive floats)
    // (`KernelOptions::mlp_red_v4`: the four down-projection sums per thread in one vector
    // reduction, rows 4t..4t+3; sm_90 has `red.global.add.v4.f32`)
    let v4 = b.o.mlp_red_v4 && b.pdl;
    let c4 = b.ci64(4);
    let t4 = b.op(&format!("arith.muli {tt}, {c4} : i64"));
    let mut drows: Vec<Vec<String>> = vec![];
    for i in 0..4 {
        let (first, ci) = if v4 { (t4.clone(), b.ci64(i)) } else { (tt.clone(), b.ci64(i * (n / 4) as i64)) };
        let o = b.op(&format!("arith.addi {first}, {ci} : i64"));
        let base = b.op(&format!("arith.muli {o}, {dbytes} : i64"));
        let base = b.op(&format!("arith.addi {base}, {fo} : i64"));
        let mut words = vec![];
        for q in 0..fb * 2 / 16 {
            let cqo = b.ci64(16 * q as i64);
            let off = b.op(&format!("arith.addi {base}, {cqo} : i64"));
            words.extend(b.load_vec("%wd", &off, 4, "i32", 16));
        }
        drows.push(words);
    }
    // (a piece's 8 f32 of g, and after the wait of x)
    let gs: Vec<Vec<String>> = uoff
        .iter()
        .map(|u| {
            let o = b.op(&format!("arith.muli {u}, {c32} : i64"));
            b.load_f32s("%g", &o, 8)
        })
        .collect();
    if b.pdl {
        b.wait_for_previous();
    }
    let xrow = b.ci64((k * 4) as i64);
    let xbase = b.op(&format!("arith.muli {by64}, {xrow} : i64"));
    let zero = b.cf32(0.0);
    let mut acc = vec![zero.clone(); 2 * fpw];
    let mut ss = zero.clone();
    let xs: Vec<Vec<String>> = uoff
        .iter()
        .zip(&valid)
        .map(|(u, ok)| {
            let o = b.op(&format!("arith.muli {u}, {c32} : i64"));
            let o = b.op(&format!("arith.addi {xbase}, {o} : i64"));
            let v = b.load_f32s("%x", &o, 8);
            match ok {
                Some(ok) => v.iter().map(|x| b.op(&format!("arith.select {ok}, {x}, {zero} : f32"))).collect(),
                None => v,
            }
        })
        .collect();
    for r in 0..rounds {
        let xg: Vec<String> = xs[r].iter().zip(&gs[r]).map(|(x, g)| b.op(&format!("arith.mulf {x}, {g} : f32"))).collect();
        for x in &xs[r] {
            ss = b.op(&format!("llvm.intr.fma({x}, {x}, {ss}) : (f32, f32, f32) -> f32"));
        }
        for (a, row) in acc.iter_mut().zip(&wrows) {
            *a = b.fma_bf16_words(a, &row[r], &xg);
        }
    }
    let lane32 = b.op(&format!("arith.index_cast {lane} : index to i32"));
    let mut vals = acc;
    vals.push(ss);
    let sums = b.warp_sums(&vals, &lane32);
    let inv = b.inv_rms(&sums[2 * fpw], k, eps);
    let c0 = b.op("arith.constant 0 : index");
    let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    let cfpwi = b.op(&format!("arith.constant {fpw} : index"));
    let hw = b.op(&format!("arith.muli {warp}, {cfpwi} : index"));
    let mut hs = vec![];
    for j in 0..fpw {
        let gate = b.op(&format!("arith.mulf {}, {inv} : f32", sums[j]));
        let up = b.op(&format!("arith.mulf {}, {inv} : f32", sums[fpw + j]));
        let sg = unary_expr(b, UnaryOp::Silu, &gate)?;
        hs.push(b.op(&format!("arith.mulf {sg}, {up} : f32")));
    }
    b.line(&format!("scf.if {first} {{"));
    for (j, h) in hs.iter().enumerate() {
        let cj = b.op(&format!("arith.constant {j} : index"));
        let at = b.op(&format!("arith.addi {hw}, {cj} : index"));
        b.line(&format!("memref.store {h}, %red[{at}] : {smt}"));
    }
    b.line("}");
    b.line("gpu.barrier");
    let nq = b.ci64((n / 4) as i64);
    let mine = b.op(&format!("arith.cmpi slt, {t64}, {nq} : i64"));
    b.line(&format!("scf.if {mine} {{"));
    let h: Vec<String> = (0..fb)
        .map(|j| {
            let cj = b.op(&format!("arith.constant {j} : index"));
            b.op(&format!("memref.load %red[{cj}] : {smt}"))
        })
        .collect();
    let mut parts = vec![];
    for words in &drows {
        parts.push(b.fma_bf16_words(&zero, words, &h));
    }
    // y[row, t + i·N/4] += the four sums (v4: y[row, 4t + i], one instruction)
    let cn = b.ci64(n as i64);
    let yr = b.op(&format!("arith.muli {by64}, {cn} : i64"));
    if v4 {
        let c4 = b.ci64(4);
        let t4 = b.op(&format!("arith.muli {t64}, {c4} : i64"));
        let e = b.op(&format!("arith.addi {yr}, {t4} : i64"));
        let p = b.op(&format!("llvm.getelementptr %y[{e}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        b.line(&format!(
            "llvm.inline_asm has_side_effects \"red.global.add.v4.f32 [$0], {{$1, $2, $3, $4}};\", \"l,f,f,f,f\" {p}, {}, {}, {}, {} : (!llvm.ptr<1>, f32, f32, f32, f32) -> ()",
            parts[0], parts[1], parts[2], parts[3]
        ));
        b.line("}");
        return Ok(());
    }
    let e = b.op(&format!("arith.addi {yr}, {t64} : i64"));
    for (i, v) in parts.iter().enumerate() {
        let ci = b.ci64(i as i64 * (n / 4) as i64);
        let ei = b.op(&format!("arith.addi {e}, {ci} : i64"));
        let p = b.op(&format!("llvm.getelementptr %y[{ei}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
        b.line(&format!("llvm.inline_asm has_side_effects \"red.global.add.f32 [$0], $1;\", \"l,f\" {p}, {v} : (!llvm.ptr<1>, f32) -> ()"));
    }
    b.line("}");
    Ok(())
}

/// Whether the decode GEMV can carry the SwiGLU epilogue (`KernelSpec::SwiGluGemv`):
/// plain-float weights, K a multiple of 32, an even number of outputs per block.
pub fn swiglu_fits(k: usize, f: usize, wdtype: DType) -> Result<(), String> {
    if !matches!(wdtype, DType::F32 | DType::F16 | DType::BF16) || !k.is_multiple_of(32) || gemv_tiling(k, 2 * f, 1).0 % 2 != 0 {
        return Err(format!("the SwiGLU GEMV takes plain-float weights, K a multiple of 32 and an even GEMV tiling (K {k}, {wdtype})"));
    }
    Ok(())
}

/// Whether a matmul epilogue applies activation `act` (`KernelSpec::MatMulAct`).
pub fn epilogue_act_fits(act: UnaryOp) -> Result<(), String> {
    if !matches!(act, UnaryOp::Gelu | UnaryOp::GeluErf | UnaryOp::Relu | UnaryOp::Silu | UnaryOp::Tanh | UnaryOp::Sigmoid) {
        return Err(format!("matmul epilogue activation {} is not lowered", dsc_ir::Op::Unary(act).name()));
    }
    Ok(())
}

/// Rows of x per block of the pipelined Hopper matmul ([`KernelSpec::MatMulPipe`]): two
/// warpgroups of 64 rows.
pub const PIPE_BM: usize = 128;

/// Dynamic shared memory of a [`KernelSpec::MatMulPipe`] block: `stages` x (x tile bm x 64
/// f32, or 16-bit with `a16`, + W tile bn x 64 16-bit), plus 1 KB to align the tiles to the
/// 1024 bytes the 128-byte swizzle repeats over.
pub fn pipe_smem(bn: usize, stages: usize, a16: bool, bm: usize) -> usize {
    stages * (bm * 64 * if a16 { 2 } else { 4 } + bn * 64 * 2) + 1024
}

/// The prefill matmul's tiling: output columns per block, pipeline stages, overlap (a wgmma
/// group left in flight), x in 16 bits (a cast step before it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PipeTiling {
    pub bn: usize,
    pub stages: usize,
    pub overlap: bool,
    pub a16: bool,
    /// rows of x per block: 128 (two warpgroups of 64 rows) or 64 (x in 16 bits: the two
    /// warpgroups split the columns)
    pub bm: usize,
}

impl PipeTiling {
    pub fn fits(&self) -> bool {
        (matches!(self.bn, 64 | 128 | 256) || (self.bn == 224 && self.bm == 64))
            && (self.bm == PIPE_BM || (self.bm == 64 && self.a16))
            && self.stages >= 2 + self.overlap as usize
            && pipe_smem(self.bn, self.stages, self.a16, self.bm) <= 227 * 1024
    }
}

/// The prefill matmul's tiling for N output columns: x in 16 bits, overlapped, 256-column tiles
/// with 4 stages from N = 6144 (the 8B shape's q/k/v, gate/up, lm_head: 410-630 TFLOP/s),
/// 128-column tiles with 6 stages below (N = 4096 at M = 512 gives 256-column tiles only 64
/// blocks for 132 SMs); bench/results/gemm-pipe-2026-11-29.json.
pub fn pipe_tiling(n: usize) -> PipeTiling {
    if n >= 6144 {
        PipeTiling { bn: 256, stages: 4, overlap: true, a16: true, bm: PIPE_BM }
    } else {
        PipeTiling { bn: 128, stages: 6, overlap: true, a16: true, bm: PIPE_BM }
    }
}

/// The fixed fields of a wgmma descriptor of a K-major tile in the 128-byte swizzle: LBO 1
/// (unused), SBO 1024 bytes (>> 4) between 8-row groups, swizzle mode 1.
const SW128_K_DESC: u64 = (1u64 << 16) | (64u64 << 32) | (1u64 << 62);

/// Row tiles per raster group of the warp-specialized matmul (`KernelSpec::Ws`).
pub const RASTER_ROWS: usize = 16;

/// Shared memory past a TMA pipelined matmul's stages for their mbarriers (8 bytes each).
pub const TMA_MBAR_BYTES: usize = 128;

/// SMs of the GPU the sm_90a kernels' grids are sized for (H100 SXM, H200: 132).
pub const TARGET_SMS: usize = 132;

/// The batched-decode tiling of the pipelined matmul (64-row tiles, x in 16 bits) for N
/// output columns: 256-wide tiles where that still gives 96+ of them (224-wide where those
/// fill the SMs better), else 128-wide (more blocks for the 132 SMs); stages to fill the
/// shared memory.
pub fn pipe64_tiling(n: usize) -> PipeTiling {
    if n.div_ceil(256) >= 96 {
        // 224-wide tiles where they divide N and fill the last wave of the SMs better (the 8B
        // shape's gate/up, N = 28,672: 128 tiles for 132 SMs instead of 112, one block each)
        let fill = |tiles: usize| tiles as f64 / (tiles.div_ceil(TARGET_SMS) * TARGET_SMS) as f64;
        if n % 224 == 0 && fill(n / 224) > fill(n.div_ceil(256)) {
            PipeTiling { bn: 224, stages: 6, overlap: true, a16: true, bm: 64 }
        } else {
            PipeTiling { bn: 256, stages: 5, overlap: true, a16: true, bm: 64 }
        }
    } else {
        PipeTiling { bn: 128, stages: 8, overlap: true, a16: true, bm: 64 }
    }
}

/// Whether a pipelined matmul of N = 2F columns in `bn`-column tiles of `bm` rows takes the
/// SwiGLU epilogue ([`KernelSpec::SwiGluPipe`]): each warpgroup's columns (bn/2 with 64-row
/// tiles, bn with 128) halve into whole 8-column groups, and the blocks' bn/2 features tile F.
pub fn swiglu_pipe_fits(n: usize, bn: usize, bm: usize) -> bool {
    let wn = if bm == 64 { bn / 2 } else { bn };
    n % 2 == 0 && wn % 16 == 0 && (n / 2) % (bn / 2) == 0
}

/// The pipelined Hopper matmul ([`KernelSpec::MatMulPipe`]).
///
/// Block: 256 threads = warpgroups 0 and 1, rows m0 + 64·wg .. of a 128 x bn tile. Shared
/// memory holds `stages` K steps of 64, each an x tile (128 rows x 256 bytes of f32; the 16-byte
/// chunk c of row r at chunk c ^ 2·(r % 8), so a warp's fragment loads hit every bank once)
/// and a W tile (bn rows x 128 bytes of bf16/f16 in the 128-byte swizzle: chunk c of row r at
/// c ^ (r % 8), 8-row groups 1024 bytes apart, as wgmma's K-major SW128 descriptor reads it).
/// Every thread copies its share of both with `cp.async` (16 bytes; rows past M or N are
/// zero-filled), one commit group per K step. Iteration kt waits for step kt's group, syncs
/// the block, starts the copies of step kt + stages - 1 into the stage step kt - 1 used, then
/// computes step kt: each warp loads its 16 rows' f32 fragments, converts them to bf16 pairs
/// (the m16n8k16 A layout wgmma takes from registers), and issues 4 x `wgmma m64n{bn}k16`
/// whose B descriptor advances 32 bytes per k16 inside the swizzle atom.
#[allow(clippy::too_many_arguments)]
fn emit_gemm_pipe(b: &mut Body, k: usize, wdtype: DType, bias: bool, residual: bool, tiling: PipeTiling) -> Result<String, String> {
    let PipeTiling { bn, stages, overlap, a16, .. } = tiling;
    if overlap && stages < 3 {
        return Err("the overlapped pipelined matmul needs 3 or more stages".into());
    }
    // K steps the copies run ahead: with a wgmma group in flight, the stage of step kt - 1
    // may still be read while step kt computes
    let ahead = if overlap { stages as i64 - 2 } else { stages as i64 - 1 };
    if k % 64 != 0 {
        return Err(format!("the pipelined wgmma matmul needs K a multiple of 64, got {k}"));
    }
    if !tiling.fits() {
        return Err(format!("pipelined wgmma matmul: bn {bn} with {stages} stages does not fit"));
    }
    if !matches!(wdtype, DType::BF16 | DType::F16) {
        return Err(format!("the pipelined wgmma matmul takes bf16/f16 weights, not {wdtype}"));
    }
    let f16 = wdtype == DType::F16;
    let ty = if f16 { "f16" } else { "bf16" };
    let bm = tiling.bm;
    // (64-row tiles: each warpgroup takes half the columns, wgmma m64n{bn/2})
    let split_n = bm == 64;
    let wn = if split_n { bn / 2 } else { bn };
    let a_bytes = (bm * 64 * if a16 { 2 } else { 4 }) as i64;
    let stage_bytes = a_bytes + (bn * 64 * 2) as i64;
    // (split-K: this block's part of the K steps, `nk` of them from `k0`)
    let sk = b.split_k.unwrap_or(1) as i64;
    let nk = (k / 64) as i64 / sk;
    let nacc = wn / 2;
    b.line("%dsm = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>");
    let base = b.op("memref.extract_aligned_pointer_as_index %dsm : memref<?xi8, #gpu.address_space<workgroup>> -> index");
    let base = b.idx64(&base);
    let c1023 = b.ci64(1023);
    let base = b.op(&format!("arith.addi {base}, {c1023} : i64"));
    let cmask = b.ci64(!1023);
    let base = b.op(&format!("arith.andi {base}, {cmask} : i64"));
    let t = b.op("gpu.thread_id x");
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let t = b.idx64(&t);
    let bx = b.idx64(&bx);
    let by = b.idx64(&by);
    let c = |b: &mut Body, v: i64| b.ci64(v);
    // split-K: block x = tile * sk + part; part s starts at K step s·nk and writes its
    // partial sums at y + s·M·N
    let (bx, k0) = if sk > 1 {
        let csk = c(b, sk);
        let part = b.op(&format!("arith.remui {bx}, {csk} : i64"));
        let tile = b.op(&format!("arith.divui {bx}, {csk} : i64"));
        let mn = b.op(&format!("arith.muli %m, {} : i64", b.split_n.unwrap_or("%n")));
        let pe = b.op(&format!("arith.muli {part}, {mn} : i64"));
        let c4 = c(b, 4);
        let pb = b.op(&format!("arith.muli {pe}, {c4} : i64"));
        b.line(&format!("%y = llvm.getelementptr %yparts[{pb}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        let cnk = c(b, nk);
        (tile, Some(b.op(&format!("arith.muli {part}, {cnk} : i64"))))
    } else {
        (bx, None)
    };
    let cbn = c(b, bn as i64);
    let cbm = c(b, bm as i64);
    let n0 = b.op(&format!("arith.muli {bx}, {cbn} : i64"));
    let m0 = b.op(&format!("arith.muli {by}, {cbm} : i64"));
    let kk = c(b, k as i64);
    let c0 = c(b, 0);
    let c7 = c(b, 7);
    let xint = b.op("llvm.ptrtoint %x : !llvm.ptr<1> to i64");
    // (SwiGLU epilogue: two weights, gate and up; block bx takes features f0 = bx · bn/2 ..)
    let swiglu = b.swiglu_pipe;
    let (wint, wint1) =
        if swiglu { (b.op("llvm.ptrtoint %w0 : !llvm.ptr<1> to i64"), Some(b.op("llvm.ptrtoint %w1 : !llvm.ptr<1> to i64"))) } else { (b.op("llvm.ptrtoint %w : !llvm.ptr<1> to i64"), None) };
    let f0 = swiglu.then(|| {
        let ch = c(b, bn as i64 / 2);
        b.op(&format!("arith.muli {bx}, {ch} : i64"))
    });
    // the copy slots of this thread: (global byte address at K step 0, byte offset in a
    // stage, bytes to copy (16, or 0: zero fill), global bytes per K step)
    let mut slots: Vec<(String, String, String, i64, bool)> = vec![];
    // (x in 16 bits: the same 128-byte rows and swizzle as W)
    // (warp-specialized: x's tiles come by TMA as well, from the producer warpgroup)
    let wspec = b.ws;
    let xs = if a16 { (false, if wspec { 0 } else { bm * 8 }, 8i64, 2i64) } else { (false, bm * 16, 16, 4) };
    // (with TMA, W's tiles come as one bulk tensor copy per stage instead)
    let tma = b.tma;
    let ws = (true, if tma { 0 } else { bn * 8 }, 8, 2);
    for (is_w, units, chunks, elt) in [xs, ws] {
        for i in 0..units / 256 {
            let ci = c(b, 256 * i as i64);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let cc = c(b, chunks);
            let row = b.op(&format!("arith.divui {u}, {cc} : i64"));
            let ch = b.op(&format!("arith.remui {u}, {cc} : i64"));
            let (r0, lim, ptr) = if is_w { (&n0, "%n", &wint) } else { (&m0, "%m", &xint) };
            // (SwiGLU: tile row r of warpgroup r / wn is gate feature f0 + (r / wn)·wn/2 + r % (wn/2)
            // in its first half, that feature's up row in the second)
            let (gr, ptr) = match (&wint1, &f0, is_w) {
                (Some(w1), Some(f0), true) => {
                    let cwn = c(b, wn as i64);
                    let cq = c(b, wn as i64 / 2);
                    let wgi = b.op(&format!("arith.divui {row}, {cwn} : i64"));
                    let rr = b.op(&format!("arith.remui {row}, {cwn} : i64"));
                    let up = b.op(&format!("arith.cmpi uge, {rr}, {cq} : i64"));
                    let rq = b.op(&format!("arith.remui {rr}, {cq} : i64"));
                    let fb = b.op(&format!("arith.muli {wgi}, {cq} : i64"));
                    let fb = b.op(&format!("arith.addi {fb}, {rq} : i64"));
                    let ptr = b.op(&format!("arith.select {up}, {w1}, {ptr} : i64"));
                    (b.op(&format!("arith.addi {f0}, {fb} : i64")), ptr)
                }
                _ => (b.op(&format!("arith.addi {r0}, {row} : i64")), ptr.clone()),
            };
            let ptr = &ptr;
            let valid = b.op(&format!("arith.cmpi slt, {gr}, {lim} : i64"));
            let grs = b.op(&format!("arith.select {valid}, {gr}, {c0} : i64"));
            let re = b.op(&format!("arith.muli {grs}, {kk} : i64"));
            let per = c(b, 16 / elt);
            let ce = b.op(&format!("arith.muli {ch}, {per} : i64"));
            let e = b.op(&format!("arith.addi {re}, {ce} : i64"));
            let ceb = c(b, elt);
            let eb = b.op(&format!("arith.muli {e}, {ceb} : i64"));
            let g = b.op(&format!("arith.addi {ptr}, {eb} : i64"));
            // swizzled position: x chunk c ^ 2(r % 8) in 256-byte rows; W c ^ (r % 8) in 128
            let r8 = b.op(&format!("arith.andi {row}, {c7} : i64"));
            let sw = if is_w || a16 {
                r8
            } else {
                let one = c(b, 1);
                b.op(&format!("arith.shli {r8}, {one} : i64"))
            };
            let pc = b.op(&format!("arith.xori {ch}, {sw} : i64"));
            let c16 = c(b, 16);
            let pcb = b.op(&format!("arith.muli {pc}, {c16} : i64"));
            let rb = c(b, chunks * 16);
            let ro = b.op(&format!("arith.muli {row}, {rb} : i64"));
            let so = b.op(&format!("arith.addi {ro}, {pcb} : i64"));
            let so = if is_w {
                let ca = c(b, a_bytes);
                b.op(&format!("arith.addi {so}, {ca} : i64"))
            } else {
                so
            };
            let s16 = b.op("arith.constant 16 : i32");
            let s0 = b.op("arith.constant 0 : i32");
            let sz = b.op(&format!("arith.select {valid}, {s16}, {s0} : i32"));
            // (split-K: from this part's first K step)
            let g = match &k0 {
                Some(k0) => {
                    let cst = c(b, 64 * elt);
                    let ko = b.op(&format!("arith.muli {k0}, {cst} : i64"));
                    b.op(&format!("arith.addi {g}, {ko} : i64"))
                }
                None => g,
            };
            slots.push((g, so, sz, 64 * elt, is_w));
        }
    }
    // issue the copies of K step `ks` (i64) into stage `st` (i64): x's and W's (`which`
    // None), or only W's (Some(true)) or x's (Some(false))
    let issue_of = |b: &mut Body, ks: &str, st: &str, which: Option<bool>| {
        let csb = b.ci64(stage_bytes);
        let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
        let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
        for (g, so, sz, step, is_w) in &slots {
            if which.is_some_and(|w| w != *is_w) {
                continue;
            }
            let cs = b.ci64(*step);
            let ko = b.op(&format!("arith.muli {ks}, {cs} : i64"));
            let ga = b.op(&format!("arith.addi {g}, {ko} : i64"));
            let sa = b.op(&format!("arith.addi {sb}, {so} : i64"));
            let sa = b.op(&format!("arith.trunci {sa} : i64 to i32"));
            b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.cg.shared.global [$0], [$1], 16, $2;\", \"r,l,r\" {sa}, {ga}, {sz} : (i32, i64, i32) -> ()"));
        }
    };
    // TMA: the mbarriers, one per stage (8 bytes each past the stages), thread 0 arming stage
    // `st`'s with the tile's bytes and issuing the bulk copy of K step `ks` (coordinates in
    // elements: K, then the tile's first row; rows past N arrive as zeros)
    let mb0 = {
        let cs = b.ci64(stages as i64 * stage_bytes);
        b.op(&format!("arith.addi {base}, {cs} : i64"))
    };
    let mbar = |b: &mut Body, st: &str| -> String {
        let c8 = b.ci64(8);
        let o = b.op(&format!("arith.muli {st}, {c8} : i64"));
        let a = b.op(&format!("arith.addi {mb0}, {o} : i64"));
        b.op(&format!("arith.trunci {a} : i64 to i32"))
    };
    // (thread 0 arms the mbarriers and issues the copies)
    let first = if tma {
        let c0 = b.ci64(0);
        b.op(&format!("arith.cmpi eq, {t}, {c0} : i64"))
    } else {
        String::new()
    };
    let tma_issue = |b: &mut Body, ks: &str, st: &str| {
        b.line(&format!("scf.if {first} {{"));
        let mb = mbar(b, st);
        let csb = b.ci64(stage_bytes);
        let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
        let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
        let cab = b.ci64(a_bytes);
        let dst = b.op(&format!("arith.addi {sb}, {cab} : i64"));
        let dst = b.op(&format!("arith.trunci {dst} : i64 to i32"));
        let kstep = match &k0 {
            Some(k0) => b.op(&format!("arith.addi {k0}, {ks} : i64")),
            None => ks.to_string(),
        };
        let c64 = b.ci64(64);
        let kc = b.op(&format!("arith.muli {kstep}, {c64} : i64"));
        let kc = b.op(&format!("arith.trunci {kc} : i64 to i32"));
        let nc = b.op(&format!("arith.trunci {n0} : i64 to i32"));
        let bytes = b.op(&format!("arith.constant {} : i32", bn * 128));
        let map = b.op("llvm.ptrtoint %w : !llvm.ptr<1> to i64");
        b.line(&format!(
            "llvm.inline_asm has_side_effects \"{{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1; }} cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$2], [$3, {{$4, $5}}], [$0];\", \"r,r,r,l,r,r\" {mb}, {bytes}, {dst}, {map}, {kc}, {nc} : (i32, i32, i32, i64, i32, i32) -> ()"
        ));
        b.line("}");
    };
    let issue = |b: &mut Body, ks: &str, st: &str| {
        issue_of(b, ks, st, None);
        if tma {
            tma_issue(b, ks, st);
        }
    };
    let commit = "llvm.inline_asm has_side_effects \"cp.async.commit_group;\", \"\" : () -> ()";
    if tma {
        // (thread 0 initialises every stage's mbarrier, one arrival each, before any copy)
        b.line(&format!("scf.if {first} {{"));
        for st in 0..stages {
            let cst = b.ci64(st as i64);
            let mb = mbar(b, &cst);
            b.line(&format!("llvm.inline_asm has_side_effects \"mbarrier.init.shared::cta.b64 [$0], 1;\", \"r\" {mb} : (i32) -> ()"));
            // (warp-specialized: stage st's empty mbarrier, past the full ones, completes
            // when all 256 consumer threads have released the stage)
            if wspec {
                let ce = b.ci64((stages + st) as i64);
                let eb = mbar(b, &ce);
                b.line(&format!("llvm.inline_asm has_side_effects \"mbarrier.init.shared::cta.b64 [$0], 256;\", \"r\" {eb} : (i32) -> ()"));
            }
        }
        b.line("llvm.inline_asm has_side_effects \"fence.mbarrier_init.release.cluster;\", \"\" : () -> ()");
        b.line("}");
        b.line("gpu.barrier");
    }
    let spin = |b: &mut Body, mb: &str, par: &str| b.mbar_spin(mb, par);
    if wspec {
        // warp-specialized: warpgroup 2 hands its registers to the consumers and its first
        // thread runs the loads: for K step kt in stage kt % S, wait until the consumers
        // released the stage's previous round (the empty barrier's phase of parity
        // (kt / S + 1) % 2: a fresh barrier's "previous" phase counts as complete), arm the
        // full barrier with the stage's bytes and issue x's and W's bulk tensor copies on it.
        // Under PDL the first round's W copies go out before `griddepcontrol.wait` (weights do
        // not depend on the previous kernel), x's after it on the same armed barriers
        let c256 = b.ci64(256);
        let prod = b.op(&format!("arith.cmpi uge, {t}, {c256} : i64"));
        b.line(&format!("scf.if {prod} {{"));
        b.line("llvm.inline_asm has_side_effects \"setmaxnreg.dec.sync.aligned.u32 40;\", \"\" : () -> ()");
        let lead = b.op(&format!("arith.cmpi eq, {t}, {c256} : i64"));
        b.line(&format!("scf.if {lead} {{"));
        let xmap = b.op("llvm.ptrtoint %x : !llvm.ptr<1> to i64");
        // the W boxes: (map, first row, byte offset in the W tile, rows); SwiGLU: per
        // warpgroup column half, its gate features then the same features' up rows
        let wmaps: Vec<(String, String, i64)> = match &f0 {
            Some(f0) => {
                let gmap = b.op("llvm.ptrtoint %w0 : !llvm.ptr<1> to i64");
                let umap = b.op("llvm.ptrtoint %w1 : !llvm.ptr<1> to i64");
                let q = wn / 2;
                let mut v = vec![];
                for h in 0..bn / wn {
                    let cf = b.ci64((h * q) as i64);
                    let fh = b.op(&format!("arith.addi {f0}, {cf} : i64"));
                    let fh = b.op(&format!("arith.trunci {fh} : i64 to i32"));
                    v.push((gmap.clone(), fh.clone(), (h * wn * 128) as i64));
                    v.push((umap.clone(), fh, (h * wn * 128 + q * 128) as i64));
                }
                v
            }
            None => {
                let wmap = b.op("llvm.ptrtoint %w : !llvm.ptr<1> to i64");
                let nc = b.op(&format!("arith.trunci {n0} : i64 to i32"));
                vec![(wmap, nc, 0)]
            }
        };
        let copy = "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes";
        // one K step's copies into its stage: arm (expect the stage's bytes) and/or x and/or W
        let tma_step = |b: &mut Body, kt: &str, arm: bool, x: bool, w: bool| {
            let cs = b.ci64(stages as i64);
            let st = b.op(&format!("arith.remui {kt}, {cs} : i64"));
            let fb = mbar(b, &st);
            let csb = b.ci64(stage_bytes);
            let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
            let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
            let kstep = match &k0 {
                Some(k0) => b.op(&format!("arith.addi {k0}, {kt} : i64")),
                None => kt.to_string(),
            };
            let c64 = b.ci64(64);
            let kc = b.op(&format!("arith.muli {kstep}, {c64} : i64"));
            let kc = b.op(&format!("arith.trunci {kc} : i64 to i32"));
            let mut asm = String::new();
            let mut cons: Vec<&str> = vec!["r"];
            let mut args: Vec<(String, &str)> = vec![(fb, "i32")];
            let arg = |args: &mut Vec<(String, &'static str)>, cons: &mut Vec<&'static str>, v: String, ty: &'static str| -> usize {
                args.push((v, ty));
                cons.push(if ty == "i64" { "l" } else { "r" });
                args.len() - 1
            };
            let ikc = arg(&mut args, &mut cons, kc, "i32");
            if arm {
                let bytes = b.op(&format!("arith.constant {stage_bytes} : i32"));
                let i = arg(&mut args, &mut cons, bytes, "i32");
                asm.push_str(&format!("{{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], ${i}; }} "));
            }
            if x {
                let dx = b.op(&format!("arith.trunci {sb} : i64 to i32"));
                let mc = b.op(&format!("arith.trunci {m0} : i64 to i32"));
                let (id, im, ix) = (arg(&mut args, &mut cons, dx, "i32"), arg(&mut args, &mut cons, xmap.clone(), "i64"), arg(&mut args, &mut cons, mc, "i32"));
                asm.push_str(&format!("{copy} [${id}], [${im}, {{${ikc}, ${ix}}}], [$0]; "));
            }
            if w {
                for (map, row, off) in &wmaps {
                    let co = b.ci64(a_bytes + off);
                    let dw = b.op(&format!("arith.addi {sb}, {co} : i64"));
                    let dw = b.op(&format!("arith.trunci {dw} : i64 to i32"));
                    let (id, im, ir) = (arg(&mut args, &mut cons, dw, "i32"), arg(&mut args, &mut cons, map.clone(), "i64"), arg(&mut args, &mut cons, row.clone(), "i32"));
                    asm.push_str(&format!("{copy} [${id}], [${im}, {{${ikc}, ${ir}}}], [$0]; "));
                }
            }
            b.line(&format!(
                "llvm.inline_asm has_side_effects \"{}\", \"{}\" {} : ({}) -> ()",
                asm.trim_end(),
                cons.join(","),
                args.iter().map(|a| a.0.clone()).collect::<Vec<_>>().join(", "),
                args.iter().map(|a| a.1).collect::<Vec<_>>().join(", ")
            ));
        };
        // (the first round's W before the wait: its empty barriers are fresh)
        let early = if b.pdl && !b.waited { (stages as i64).min(nk) } else { 0 };
        for kt in 0..early {
            let k = b.ci64(kt);
            tma_step(b, &k, true, false, true);
        }
        if b.pdl && !b.waited {
            b.line("llvm.inline_asm has_side_effects \"griddepcontrol.wait;\", \"~{memory}\" : () -> ()");
        }
        for kt in 0..early {
            let k = b.ci64(kt);
            tma_step(b, &k, false, true, false);
        }
        let zi = b.op(&format!("arith.constant {early} : index"));
        let ni = b.op(&format!("arith.constant {nk} : index"));
        let oi = b.op("arith.constant 1 : index");
        let kv = b.v();
        b.line(&format!("scf.for {kv} = {zi} to {ni} step {oi} {{"));
        let kt = b.idx64(&kv);
        let cs = b.ci64(stages as i64);
        let st = b.op(&format!("arith.remui {kt}, {cs} : i64"));
        let u = b.op(&format!("arith.divui {kt}, {cs} : i64"));
        let c1 = b.ci64(1);
        let par = b.op(&format!("arith.andi {u}, {c1} : i64"));
        let par = b.op(&format!("arith.xori {par}, {c1} : i64"));
        let par = b.op(&format!("arith.trunci {par} : i64 to i32"));
        let se = b.op(&format!("arith.addi {st}, {cs} : i64"));
        let eb = mbar(b, &se);
        spin(b, &eb, &par);
        tma_step(b, &kt, true, true, true);
        b.line("}");
        b.line("}");
        b.line("}");
        // the consumers: warpgroups 0 and 1 (closed after the epilogue)
        let cons = b.op(&format!("arith.cmpi ult, {t}, {c256} : i64"));
        b.line(&format!("scf.if {cons} {{"));
        b.line("llvm.inline_asm has_side_effects \"setmaxnreg.inc.sync.aligned.u32 232;\", \"\" : () -> ()");
        // (the consumers read the residual and write y: after the previous kernel)
        if b.pdl && !b.waited {
            b.wait_for_previous();
        }
    } else if b.pdl && !b.waited && b.o.gemv_preload {
        // W does not depend on the previous kernel (graph weights only): its prologue copies
        // go out before `griddepcontrol.wait`, x's after it; the first commit group holds
        // them all
        for s in 0..ahead.min(nk) {
            let ks = b.ci64(s);
            issue_of(b, &ks, &ks, Some(true));
            if tma {
                tma_issue(b, &ks, &ks);
            }
        }
        b.wait_for_previous();
        for s in 0..ahead {
            let ks = b.ci64(s);
            if s < nk {
                issue_of(b, &ks, &ks, Some(false));
            }
            b.line(commit);
        }
    } else {
        for s in 0..ahead {
            let ks = b.ci64(s);
            if s < nk {
                issue(b, &ks, &ks);
            }
            b.line(commit);
        }
    }
    // this warp's fragment rows (the same % 8 for both halves: g)
    let (warp, _, g, tq) = b.mma_coords(&t);
    let c16 = c(b, 16);
    // (64-row tiles: both warpgroups' warps cover rows 0..63)
    let wrow = if split_n {
        let c3 = c(b, 3);
        b.op(&format!("arith.andi {warp}, {c3} : i64"))
    } else {
        warp.clone()
    };
    let wr = b.op(&format!("arith.muli {wrow}, {c16} : i64"));
    let r0 = b.op(&format!("arith.addi {wr}, {g} : i64"));
    let c8 = c(b, 8);
    let r1 = b.op(&format!("arith.addi {r0}, {c8} : i64"));
    let c256 = c(b, 256);
    let rb0 = b.op(&format!("arith.muli {r0}, {c256} : i64"));
    let rb1 = b.op(&format!("arith.muli {r1}, {c256} : i64"));
    let c1 = c(b, 1);
    let g2 = b.op(&format!("arith.shli {g}, {c1} : i64"));
    let th = b.op(&format!("arith.shrui {tq}, {c1} : i64"));
    let tl = b.op(&format!("arith.andi {tq}, {c1} : i64"));
    let tlb = b.op(&format!("arith.muli {tl}, {c8} : i64"));
    // (x in 16 bits) this warpgroup's rows of the x tile: 64 rows of 128 bytes per warpgroup
    let c128t = c(b, 128);
    let wg = b.op(&format!("arith.divui {t}, {c128t} : i64"));
    // (64-row tiles: one x tile for both; this warpgroup's W rows bn/2·wg.., in 1024-byte
    // groups of 8 rows)
    let c8k = c(b, if split_n { 0 } else { 8192 });
    let wg_off = b.op(&format!("arith.muli {wg}, {c8k} : i64"));
    let cwb = c(b, if split_n { (bn / 2 * 128) as i64 } else { 0 });
    let wg_woff = b.op(&format!("arith.muli {wg}, {cwb} : i64"));
    // byte offsets in a stage of this thread's 16 fragment pairs: [k16 step][a0..a3]
    let mut frag_off = vec![];
    for s in 0..4i64 {
        for (rb, kh) in [(&rb0, 0i64), (&rb1, 0), (&rb0, 2), (&rb1, 2)] {
            let cb = c(b, 4 * s + kh);
            let ch = b.op(&format!("arith.addi {cb}, {th} : i64"));
            let pc = b.op(&format!("arith.xori {ch}, {g2} : i64"));
            let pcb = b.op(&format!("arith.muli {pc}, {c16} : i64"));
            let o = b.op(&format!("arith.addi {rb}, {pcb} : i64"));
            frag_off.push(b.op(&format!("arith.addi {o}, {tlb} : i64")));
        }
    }
    let zero = b.cf32(0.0);
    let f32s = vec!["f32"; nacc].join(", ");
    let cst = b.ci64(stages as i64);
    let cnk = b.ci64(nk);
    let cs1 = b.ci64(ahead);
    let csb = b.ci64(stage_bytes);
    let cab = b.ci64(a_bytes);
    let fixed = SW128_K_DESC;
    // one K step `kt` (i64) on accumulators `acc`: returns the new accumulators
    let step = |b: &mut Body, kt: &str, acc: &[String]| -> Vec<String> {
        if !wspec {
            b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.wait_group {};\", \"\" : () -> ()", ahead - 1));
        }
        if tma {
            // (this step's W tile: its stage's mbarrier completes phase kt / stages)
            let st = b.op(&format!("arith.remui {kt}, {cst} : i64"));
            let mb = mbar(b, &st);
            let u = b.op(&format!("arith.divui {kt}, {cst} : i64"));
            let c1 = b.ci64(1);
            let par = b.op(&format!("arith.andi {u}, {c1} : i64"));
            let par = b.op(&format!("arith.trunci {par} : i64 to i32"));
            spin(b, &mb, &par);
        }
        if !wspec {
            b.line("llvm.inline_asm has_side_effects \"fence.proxy.async.shared::cta;\", \"\"  : () -> ()");
            b.line("gpu.barrier");
            let kn = b.op(&format!("arith.addi {kt}, {cs1} : i64"));
            let more = b.op(&format!("arith.cmpi slt, {kn}, {cnk} : i64"));
            b.line(&format!("scf.if {more} {{"));
            let stn = b.op(&format!("arith.remui {kn}, {cst} : i64"));
            issue(b, &kn, &stn);
            b.line("}");
            b.line(commit);
        }
        let st = b.op(&format!("arith.remui {kt}, {cst} : i64"));
        let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
        let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
        // this warp's fragments (warps 4..7, warpgroup 1, cover rows 64..127: r0 = 16w + g);
        // with x in 16 bits, this warpgroup's x descriptor instead (rows 64·wg.., 8 KB apart)
        let mut a = vec![];
        if a16 {
            let xo = b.op(&format!("arith.addi {sb}, {wg_off} : i64"));
            a.push(b.smem_desc(&xo, fixed));
        }
        for o in frag_off.iter().filter(|_| !a16) {
            let p = b.op(&format!("arith.addi {sb}, {o} : i64"));
            let p = b.op(&format!("llvm.inttoptr {p} : i64 to !llvm.ptr<3>"));
            let v = b.op(&format!("llvm.load {p} {{alignment = 8 : i64}} : !llvm.ptr<3> -> vector<2xf32>"));
            let i0 = b.op("arith.constant 0 : i32");
            let i1 = b.op("arith.constant 1 : i32");
            let lo = b.op(&format!("llvm.extractelement {v}[{i0} : i32] : vector<2xf32>"));
            let hi = b.op(&format!("llvm.extractelement {v}[{i1} : i32] : vector<2xf32>"));
            a.push(b.pack2(&lo, &hi, f16));
        }
        // W descriptors: start (>> 4), LBO 1 (unused by swizzled K-major), SBO 1024 >> 4, SW128
        let wb = b.op(&format!("arith.addi {sb}, {cab} : i64"));
        let wb = b.op(&format!("arith.addi {wb}, {wg_woff} : i64"));
        let wd = b.smem_desc(&wb, fixed);
        b.line("llvm.inline_asm has_side_effects \"wgmma.fence.sync.aligned;\", \"\"  : () -> ()");
        let mut cur = acc.to_vec();
        for s in 0..4usize {
            let ds = b.ci64(2 * s as i64);
            let d = b.op(&format!("arith.addi {wd}, {ds} : i64"));
            cur = if a16 {
                // both operands from shared memory, K-major (no transposes)
                let xd = b.op(&format!("arith.addi {}, {ds} : i64", a[0]));
                b.wgmma(&format!("m64n{wn}k16"), ty, &cur, &[xd], &d, false)
            } else {
                b.wgmma(&format!("m64n{bn}k16"), ty, &cur, &a[4 * s..4 * s + 4], &d, false)
            };
        }
        b.line("llvm.inline_asm has_side_effects \"wgmma.commit_group.sync.aligned;\", \"\"  : () -> ()");
        let cur = b.wgmma_wait(overlap as usize, &cur);
        if wspec {
            // (warp-specialized: the wgmmas of step kt - overlap are done, so this thread
            // releases that step's stage to the producer)
            let co = b.ci64(overlap as i64);
            let done = b.op(&format!("arith.cmpi sge, {kt}, {co} : i64"));
            b.line(&format!("scf.if {done} {{"));
            let kd = b.op(&format!("arith.subi {kt}, {co} : i64"));
            let sd = b.op(&format!("arith.remui {kd}, {cst} : i64"));
            let se = b.op(&format!("arith.addi {sd}, {cst} : i64"));
            let eb = mbar(b, &se);
            b.line(&format!("llvm.inline_asm has_side_effects \"{{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [$0]; }}\", \"r\" {eb} : (i32) -> ()"));
            b.line("}");
        }
        cur
    };
    // the K loop; overlapped, two steps per iteration: their A fragments are distinct values
    // (registers), and a step's fragments are written only after the wgmmas that read the
    // previous ones (two steps back) were waited for. (With x from shared memory too: one
    // step per iteration, a wgmma group in flight across the back edge, computed wrong on the
    // H200 — bench/results/gemm-pipe-2026-11-29.json — so both unroll.)
    let per = if overlap { 2 } else { 1 };
    let ki = b.op(&format!("arith.constant {} : index", nk / per as i64 * per as i64));
    let zi = b.op("arith.constant 0 : index");
    let stepi = b.op(&format!("arith.constant {per} : index"));
    let res = b.v();
    let kv = b.v();
    let accs: Vec<String> = (0..nacc).map(|_| b.v()).collect();
    b.line(&format!("{res}:{nacc} = scf.for {kv} = {zi} to {ki} step {stepi} iter_args({}) -> ({f32s}) {{", accs.iter().map(|a| format!("{a} = {zero}")).collect::<Vec<_>>().join(", ")));
    let kt = b.idx64(&kv);
    let mut acc = step(b, &kt, &accs);
    if overlap {
        let c1 = b.ci64(1);
        let kt1 = b.op(&format!("arith.addi {kt}, {c1} : i64"));
        acc = step(b, &kt1, &acc);
    }
    b.line(&format!("scf.yield {} : {f32s}", acc.join(", ")));
    b.line("}");
    let mut res: Vec<String> = (0..nacc).map(|i| format!("{res}#{i}")).collect();
    if nk % per as i64 != 0 {
        let last = b.ci64(nk - 1);
        res = step(b, &last, &res);
    }
    if overlap {
        res = b.wgmma_wait(0, &res);
    }
    if !wspec {
        b.line("llvm.inline_asm has_side_effects \"cp.async.wait_group 0;\", \"\" : () -> ()");
    }
    // D fragment: warp w (of 8) rows m0 + 16w + g (+8), columns 8j + 2 tq (+1); 64-row
    // tiles: rows m0 + 16(w % 4) + g, columns from n0 + bn/2·wg
    let ra = b.op(&format!("arith.addi {m0}, {r0} : i64"));
    let cwn = c(b, if split_n { wn as i64 } else { 0 });
    let nw0 = b.op(&format!("arith.muli {wg}, {cwn} : i64"));
    let nw0 = b.op(&format!("arith.addi {n0}, {nw0} : i64"));
    if let Some(f0) = &f0 {
        // h = silu(gate) · up: this warpgroup's features f0 + wg·wn/2 + 8j + 2tq (+1), gate in
        // column group j, up in j + wn/16
        let cq = c(b, if split_n { wn as i64 / 2 } else { 0 });
        let fw = b.op(&format!("arith.muli {wg}, {cq} : i64"));
        let fw = b.op(&format!("arith.addi {f0}, {fw} : i64"));
        store_swiglu_fragments(b, &ra, &fw, &tq, wn / 2, &res, f16)?;
    } else if wspec && b.o.epilogue_chunk > 0 {
        // (`KernelOptions::epilogue_chunk` column groups' residual/bias pairs loaded before
        // storing any of them)
        let chunk = b.o.epilogue_chunk;
        b.store_d_tile(&ra, &nw0, &tq, wn, &res, bias, residual, chunk);
    } else {
        b.store_d_fragments(&ra, &nw0, &tq, wn, &res, bias, residual);
    }
    if wspec {
        // (the consumers' scf.if)
        b.line("}");
    }
    Ok(matmul_params(bias, residual, true))
}

/// The SwiGLU epilogue of [`emit_gemm_pipe`]: D fragments (rows `ra`, `ra` + 8; the gate in
/// column groups 0..q/8, the same features' up in q/8..q/4) to h = silu(gate) · up at
/// features `f0` + 8j + 2tq (+1): `%y` (f32) and `%yh` (16-bit, rounded as `SiluMulHalf` rounds
/// it), rows below %m, features below %n.
fn store_swiglu_fragments(b: &mut Body, ra: &str, f0: &str, tq: &str, q: usize, vals: &[String], f16: bool) -> Result<(), String> {
    let c8 = b.ci64(8);
    let c1 = b.ci64(1);
    let c2 = b.ci64(2);
    let rb = b.op(&format!("arith.addi {ra}, {c8} : i64"));
    let tq2 = b.op(&format!("arith.muli {tq}, {c2} : i64"));
    let fc = b.op(&format!("arith.addi {f0}, {tq2} : i64"));
    let groups = q / 8;
    for j in 0..groups {
        let cj = b.ci64(8 * j as i64);
        let col = b.op(&format!("arith.addi {fc}, {cj} : i64"));
        let cok = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
        for (half, row) in [(0usize, ra), (2, rb.as_str())] {
            let rok = b.op(&format!("arith.cmpi slt, {row}, %m : i64"));
            let both = b.op(&format!("arith.andi {rok}, {cok} : i1"));
            b.line(&format!("scf.if {both} {{"));
            let mut hs = vec![];
            for e in 0..2 {
                let s = unary_expr(b, UnaryOp::Silu, &vals[4 * j + half + e])?;
                hs.push(b.op(&format!("arith.mulf {s}, {} : f32", vals[4 * (j + groups) + half + e])));
            }
            let yr = b.op(&format!("arith.muli {row}, %n : i64"));
            let yi = b.op(&format!("arith.addi {yr}, {col} : i64"));
            let yi1 = b.op(&format!("arith.addi {yi}, {c1} : i64"));
            b.store(&hs[0], "%y", &yi);
            b.store(&hs[1], "%y", &yi1);
            let w = b.pack2(&hs[0], &hs[1], f16);
            let p = b.op(&format!("llvm.getelementptr %yh[{yi}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i16"));
            b.line(&format!("llvm.store {w}, {p} {{alignment = 4 : i64}} : i32, !llvm.ptr<1>"));
            b.line("}");
        }
    }
    Ok(())
}

/// Keys per step of the prefill attention's K/V loop.
const FLASH_KEYS: usize = 64;

/// Keys per K/V tile of the prefill attention: [`FLASH_KEYS`], half that with 2 m16 tiles
/// per warp.
fn flash_keys(mtiles: usize) -> usize {
    if mtiles > 1 {
        FLASH_KEYS / 2
    } else {
        FLASH_KEYS
    }
}

/// Dynamic shared memory of a [`KernelSpec::FlashAttention`] block: from f32 pools, the K
/// tile (64 keys x d bf16, rows padded by 16 bytes) and V transposed (d rows x 64 keys bf16,
/// padded by 16 bytes), so the mma fragment loads hit every bank once; from bf16 pools, two
/// stages of the K and V tiles as the pools hold them (64 keys x d, rows padded by 16 bytes:
/// `ldmatrix` rows on distinct banks), one filling while the other is read, then (2 m16 tiles
/// per warp) the block's Q rows in bf16, padded alike.
pub fn flash_smem(d: usize, kv: DType, warps: usize, mtiles: usize) -> usize {
    if kv == DType::F32 {
        FLASH_KEYS * (2 * d + 16) + d * (2 * FLASH_KEYS + 16)
    } else {
        // (+ the block's Q rows in bf16 with 2 m16 tiles per warp)
        let q_rows = if mtiles > 1 { 16 * mtiles * warps } else { 0 };
        2 * 2 * flash_keys(mtiles) * (2 * d + 16) + q_rows * (2 * d + 16)
    }
}

/// The head dim the wgmma prefill attention takes: 128 (checked on the H200; with D = 64 the
/// same code failed the kernel check, rel. error 0.13-0.68, cause not found yet — the one
/// difference in the instructions is PV's m64n64 with V read N-major in a single swizzle atom).
pub const FLASH_WG_D: usize = 128;

/// Rows per TMA box of the wgmma prefill attention's K/V tiles (the tiles come as boxes of 64
/// columns x rows keys) from the pools' 4-D tensor maps, `{pool}@kvmap{rows}`, on one
/// mbarrier per stage, in place of every thread's `cp.async` copies and their address math —
/// ~45% of the loop's instructions; ncu: the integer pipe was the busiest). A box never
/// crosses a cache block and starts on a 128-byte swizzle atom row group: `bs` a multiple of 8.
/// None: `cp.async` (other block sizes). 8B layer at 4,096 tokens 351 -> 424 TFLOP/s, 16,384
/// 393 -> 455 (bench/results/flash-tma-2026-11-30.json).
pub fn flash_wg_tma_rows(bs: usize) -> Option<usize> {
    let rows = bs.min(FLASH_KEYS);
    (bs % 8 == 0 && bs > 0 && FLASH_KEYS % rows == 0 && bs % rows == 0).then_some(rows)
}

/// Shared memory past the wgmma attention's K/V stages when they load by TMA: two mbarriers
/// (8 bytes each) and the two stages' use counts (4 bytes each), padded.
pub const FLASH_WG_TMA_BYTES: usize = 64;

/// Whether the wgmma prefill attention's kernel takes head dim `d`: [`FLASH_WG_D`] (D = 64
/// failed the kernel check, above).
pub fn flash_wg_d_ok(d: usize) -> bool {
    d == FLASH_WG_D
}

/// The V descriptor's (LBO, SBO) in bytes for the wgmma prefill attention: 64 keys x 128
/// bytes between head-dim column blocks, 1 KB between 8-key groups.
const FLASH_WG_VDESC: (u64, u64) = ((FLASH_KEYS * 128) as u64, 1024);

/// Dynamic shared memory of a [`KernelSpec::FlashWgmma`] block: two stages of the K and V
/// tiles (64 keys x D bf16 each, in D/64 column blocks of 64 rows x 128 bytes, 128-byte
/// swizzle), + 1 KB to align the base as the swizzle needs. (One query head per block: two
/// heads of a KV head per block, a warpgroup each sharing the tiles, measured slower — 8B layer
/// at 4k 351 -> 332 TFLOP/s — and so did issuing the next tile's S before this tile's softmax
/// from three stages — one block per SM, 68% of the throughput: bench/results/
/// flash-wgmma-2026-11-30.json; both went.)
pub fn flash_wg_smem(d: usize) -> usize {
    2 * 2 * FLASH_KEYS * d * 2 + 1024
}

/// [`crate::options::KernelOptions::flash_lazy`]'s default, in log2 units: the wgmma prefill
/// attention's lazy rescale (FlashAttention-4's) — a row's reference max, which its
/// probabilities are taken against, moves only where a tile's max passes it by more than this
/// many log2 units, so P <= 2^threshold, exact after the final division (O and the sum share
/// the reference); a warp rescales its O accumulators only where one of its rows moved it:
/// after the first tiles almost never (64 multiplies per thread per tile saved).
pub const FLASH_LAZY_THRESHOLD: f32 = 8.0;

/// Byte offset of 16-byte chunk `chunk` (i64) of row `row` (i64) in a tile of `rows` rows
/// laid out for wgmma's K-major 128-byte swizzle: column blocks of 8 chunks (64 16-bit
/// elements), each `rows` x 128 bytes, chunk `chunk % 8` at `(chunk % 8) ^ (row % 8)`.
fn sw128_offset(b: &mut Body, row: &str, chunk: &str, rows: usize) -> String {
    let c8 = b.ci64(8);
    let blk = b.op(&format!("arith.divui {chunk}, {c8} : i64"));
    let cbb = b.ci64((rows * 128) as i64);
    let bo = b.op(&format!("arith.muli {blk}, {cbb} : i64"));
    let c128 = b.ci64(128);
    let ro = b.op(&format!("arith.muli {row}, {c128} : i64"));
    let c7 = b.ci64(7);
    let cl = b.op(&format!("arith.andi {chunk}, {c7} : i64"));
    let r7 = b.op(&format!("arith.andi {row}, {c7} : i64"));
    let sw = b.op(&format!("arith.xori {cl}, {r7} : i64"));
    let c16 = b.ci64(16);
    let so = b.op(&format!("arith.muli {sw}, {c16} : i64"));
    let o = b.op(&format!("arith.addi {bo}, {ro} : i64"));
    b.op(&format!("arith.addi {o}, {so} : i64"))
}

/// The prefill attention ([`KernelSpec::FlashAttention`]), FlashAttention-2 style on `mma.sync`
/// m16n8k16 (bf16 operands, f32 accumulation; sm_80 and sm_90a).
///
/// Block = 4 warps = 64 query rows (tokens t0..t0+63) of one head; warp w owns rows 16w..+15
/// and keeps its Q fragments (pre-scaled by scale·log2 e), its output accumulators and its
/// rows' running max and sum in registers. The tile's rows are taken in runs of one sequence
/// (a step mixes prefill chunks and decode tokens): for each run, the block walks that
/// sequence's keys 0..=max position in steps of 64 — the block gathers them from the paged
/// caches (f32) into shared memory as bf16, K row-major, V transposed — and each warp computes
/// S = Q Kᵀ (16 x 64), masks keys past each row's position and rows outside the run, updates
/// the online softmax (exp2), and accumulates P V with P packed from the S registers.
///
/// From bf16 pools (`kv`), the tiles are copied as they are with `cp.async` (16 bytes per copy,
/// no registers) into two stages, tile i + 1's copies in flight while tile i is computed, and
/// the mma B fragments come from `ldmatrix` (K) and `ldmatrix.trans` (V, stored key-major).
fn emit_flash_attention(b: &mut Body, h: usize, kvh: usize, d: usize, bs: usize, scale_bits: u32, kv: DType, warps: usize, mt: usize) -> Result<String, String> {
    if d % 16 != 0 || d > 128 || kvh == 0 || h % kvh != 0 || bs == 0 {
        return Err(format!("the prefill attention needs D a multiple of 16 up to 128 and H a multiple of KVH (D {d}, H {h}, KVH {kvh})"));
    }
    if !matches!(kv, DType::F32 | DType::BF16) {
        return Err(format!("{kv} KV caches are not lowered for the GPU (f32 or bf16)"));
    }
    let wide = kv == DType::F32;
    let nt = 32 * warps as i64; // threads
    if !(warps == 4 || (!wide && warps == 8)) || (!wide && (flash_keys(mt) as i64 * (d / 8) as i64) % nt != 0) {
        return Err(format!("the prefill attention takes 4 warps (f32 pools) or 4 / 8 (bf16, D a multiple of 32 then), not {warps} (D {d})"));
    }
    if !(mt == 1 || (mt == 2 && !wide && d % 32 == 0)) {
        return Err(format!("the prefill attention takes 1 m16 tile per warp, or 2 from bf16 pools with D a multiple of 32, not {mt} (D {d})"));
    }
    // keys per K/V tile: 64, or 32 with 2 m16 tiles per warp (its S and P registers halved)
    #[allow(non_snake_case)]
    let KEYS: usize = flash_keys(mt);
    // row strides in bytes: K's; V's — transposed rows of 64 keys (f32 pools), or key rows as
    // K's (bf16: `ldmatrix.trans`)
    let ks = (2 * d + 16) as i64;
    let vs = if wide { (2 * KEYS + 16) as i64 } else { ks };
    // (wgmma: K's and V's tiles in column blocks of 64 head-dim elements, 64 keys x 128 bytes
    // each, 128-byte swizzle: what both descriptors read)
    let wg = b.flash_wg;
    // (positions as i32, the output rows re-derived after the loops and (wgmma) the lane rows
    // read per run — ptxas: the TMA wgmma kernel's spills at 168 registers 44 -> 0 bytes, the
    // mma.sync kernels' 12 -> 0 (bs 4), 24 -> 12 (f32 pools), 52 -> 36-40 (2 m-tiles); H200,
    // 8B layer at 4k: 462-463 -> 463-467 TFLOP/s, 16k 485-505 -> 494-522, flash bundle 24/24,
    // streams equal (bench/results/flash-pos32-2026-11-30.json); `KernelOptions::flash_pos32`)
    let pos32 = b.o.flash_pos32;
    let v_at = if wg { (KEYS * d * 2) as i64 } else { (KEYS as i64) * ks };
    // (bf16: a stage = the K tile, then the V tile)
    let stage_bytes = 2 * v_at;
    let nd8 = d / 8; // output column tiles
    let nkc = d / 16; // k16 steps over the head dim
    let nacc = nd8 * 4; // O accumulators per m16 tile
    let ncar = mt * (nacc + 4); // carried: every tile's O, then (m, l) of each of the 2·mt rows
    let q_at = 2 * stage_bytes; // (mt 2: the block's Q rows in bf16)
    let c = |b: &mut Body, v: i64| b.ci64(v);
    b.line("%dsm = gpu.dynamic_shared_memory : memref<?xi8, #gpu.address_space<workgroup>>");
    let base = b.op("memref.extract_aligned_pointer_as_index %dsm : memref<?xi8, #gpu.address_space<workgroup>> -> index");
    let base = b.idx64(&base);
    // (wgmma: the base rounded up to 1 KB, as the 128-byte swizzle needs; the 1 KB pad is in
    // `flash_wg_smem`)
    let base = if wg {
        let c1023 = c(b, 1023);
        let up = b.op(&format!("arith.addi {base}, {c1023} : i64"));
        let cmask = c(b, !1023);
        b.op(&format!("arith.andi {up}, {cmask} : i64"))
    } else {
        base
    };
    let t = b.op("gpu.thread_id x");
    let t = b.idx64(&t);
    let hq = b.op("gpu.block_id x");
    let hq = b.idx64(&hq);
    // (the last query tiles, which see the most keys, start first: less of a tail)
    let tile = b.op("gpu.block_id y");
    let tiles = b.op("gpu.grid_dim y");
    let tile = b.op(&format!("arith.subi {tiles}, {tile} : index"));
    let onei0 = b.op("arith.constant 1 : index");
    let tile = b.op(&format!("arith.subi {tile}, {onei0} : index"));
    let tile = b.idx64(&tile);
    let c4 = c(b, 4);
    let c8 = c(b, 8);
    let c16 = c(b, 16);
    let c2 = c(b, 2);
    let c0 = c(b, 0);
    let (warp, lane, g, tq) = b.mma_coords(&t);
    // (K/V tiles by TMA: thread 0 arms stage st's mbarrier, at 2·stage_bytes + 8·st, and
    // issues the tile's boxes on it; the stages' use counts past the mbarriers give each run's
    // wait parities — a tile mixing sequences walks the K/V loop once per sequence)
    let tma_rows = if wg { flash_wg_tma_rows(bs) } else { None };
    let tfirst = tma_rows.map(|_| {
        let c0 = c(b, 0);
        b.op(&format!("arith.cmpi eq, {t}, {c0} : i64"))
    });
    let bar_at = 2 * stage_bytes;
    let mbar = |b: &mut Body, st: &str| -> String {
        let c8 = b.ci64(8);
        let o = b.op(&format!("arith.muli {st}, {c8} : i64"));
        let cb = b.ci64(bar_at);
        let o = b.op(&format!("arith.addi {o}, {cb} : i64"));
        let a = b.op(&format!("arith.addi {base}, {o} : i64"));
        b.op(&format!("arith.trunci {a} : i64 to i32"))
    };
    let uses_ptr = |b: &mut Body, st: usize| -> String {
        let o = b.ci64(bar_at + 16 + 4 * st as i64);
        let a = b.op(&format!("arith.addi {base}, {o} : i64"));
        b.op(&format!("llvm.inttoptr {a} : i64 to !llvm.ptr<3>"))
    };
    if let Some(first) = &tfirst {
        b.line(&format!("scf.if {first} {{"));
        for st in 0..2 {
            let cst = c(b, st);
            let mb = mbar(b, &cst);
            b.line(&format!("llvm.inline_asm has_side_effects \"mbarrier.init.shared::cta.b64 [$0], 1;\", \"r\" {mb} : (i32) -> ()"));
            let p = uses_ptr(b, st as usize);
            let z = b.op("arith.constant 0 : i32");
            b.line(&format!("llvm.store {z}, {p} : i32, !llvm.ptr<3>"));
        }
        b.line("llvm.inline_asm has_side_effects \"fence.mbarrier_init.release.cluster;\", \"\" : () -> ()");
        b.line("}");
    }
    let crows = c(b, (16 * mt * warps) as i64);
    let t0 = b.op(&format!("arith.muli {tile}, {crows} : i64"));
    let crep = c(b, (h / kvh) as i64);
    let kh = b.op(&format!("arith.divui {hq}, {crep} : i64"));
    let ch = c(b, h as i64);
    let cd = c(b, d as i64);
    let ckvh = c(b, kvh as i64);
    let cbs = c(b, bs as i64);
    // rows in this tile, and this thread's two rows of each of its warp's m16 tiles (a = g,
    // b = g + 8 of tile i: warp rows 16·mt·w + 16 i)
    let left = b.op(&format!("arith.subi %n, {t0} : i64"));
    let nrows = b.op(&format!("arith.minsi {left}, {crows} : i64"));
    let cwr = c(b, (16 * mt) as i64);
    let w16 = b.op(&format!("arith.muli {warp}, {cwr} : i64"));
    let mut rels = vec![];
    for i in 0..mt {
        let ci = c(b, 16 * i as i64);
        let ra = b.op(&format!("arith.addi {w16}, {ci} : i64"));
        let ra = b.op(&format!("arith.addi {ra}, {g} : i64"));
        let rb = b.op(&format!("arith.addi {ra}, {c8} : i64"));
        rels.push(ra);
        rels.push(rb);
    }
    let mut rows = vec![];
    for rel in &rels {
        let row = b.op(&format!("arith.addi {t0}, {rel} : i64"));
        let ok = b.op(&format!("arith.cmpi slt, {rel}, {nrows} : i64"));
        let rc = b.op(&format!("arith.select {ok}, {row}, {t0} : i64"));
        // (the position as i32, one register across the loops; DSC_FLASH_POS32=0: i64)
        let p = if pos32 { b.load_t("%pos", &rc, "i32") } else { b.load_i32_as_i64("%pos", &rc) };
        rows.push((rel.clone(), rc, ok, p));
    }
    // Q fragments (m16n8k16 A layout), scaled so S is in log2 units
    let scale = b.cf32(f32::from_bits(scale_bits) * std::f32::consts::LOG2_E);
    let mut qf = vec![];
    let qrow = |b: &mut Body, rc: &str| -> String {
        let r = b.op(&format!("arith.muli {rc}, {ch} : i64"));
        let r = b.op(&format!("arith.addi {r}, {hq} : i64"));
        b.op(&format!("arith.muli {r}, {cd} : i64"))
    };
    let tq2 = b.op(&format!("arith.muli {tq}, {c2} : i64"));
    // the block's rows of Q (scaled) into shared memory as bf16, 8 elements per copy, chunk
    // `cc` of row `rr` at `base` + `at(rr, cc)`: 2 m16 tiles per warp (ldmatrix rows padded
    // like K's), or pipelined wgmma (after the three K/V stages, in the K tiles' layout, for
    // the S wgmma's A descriptor)
    let stage_q = |b: &mut Body, at: &dyn Fn(&mut Body, &str, &str) -> String| {
        let nch = (d / 8) as i64;
        let cnch = c(b, nch);
        for i in 0..(16 * mt * warps) as i64 * nch / nt {
            let ci = c(b, nt * i);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let rr = b.op(&format!("arith.divui {u}, {cnch} : i64"));
            let cc = b.op(&format!("arith.remui {u}, {cnch} : i64"));
            let ok = b.op(&format!("arith.cmpi slt, {rr}, {nrows} : i64"));
            let row = b.op(&format!("arith.addi {t0}, {rr} : i64"));
            let row = b.op(&format!("arith.select {ok}, {row}, {t0} : i64"));
            let e = qrow(b, &row);
            let c8e = c(b, 8);
            let co = b.op(&format!("arith.muli {cc}, {c8e} : i64"));
            let e = b.op(&format!("arith.addi {e}, {co} : i64"));
            let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
            let v0 = b.load_vec("%q", &by, 4, "f32", 16);
            let c16q = c(b, 16);
            let by1 = b.op(&format!("arith.addi {by}, {c16q} : i64"));
            let v1 = b.load_vec("%q", &by1, 4, "f32", 16);
            let v: Vec<String> = v0.iter().chain(&v1).map(|x| b.op(&format!("arith.mulf {x}, {scale} : f32"))).collect();
            let packed: Vec<String> = (0..4).map(|j| b.pack2(&v[2 * j], &v[2 * j + 1], false)).collect();
            let so = at(b, &rr, &cc);
            let sa = b.op(&format!("arith.addi {base}, {so} : i64"));
            let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
            let vv = b.vector(&packed, "i32");
            b.line(&format!("llvm.store {vv}, {sp} {{alignment = 16 : i64}} : vector<4xi32>, !llvm.ptr<3>"));
        }
    };
    if mt > 1 {
        stage_q(b, &|b: &mut Body, rr: &str, cc: &str| {
            let cks = b.ci64(ks);
            let so = b.op(&format!("arith.muli {rr}, {cks} : i64"));
            let c16o = b.ci64(16);
            let co = b.op(&format!("arith.muli {cc}, {c16o} : i64"));
            let so = b.op(&format!("arith.addi {so}, {co} : i64"));
            let cqa = b.ci64(q_at);
            b.op(&format!("arith.addi {so}, {cqa} : i64"))
        });
    }
    let (qa, qb) = (qrow(b, &rows[0].1), qrow(b, &rows[1].1));
    for kc in (0..nkc as i64).filter(|_| mt == 1) {
        for (qbase, off) in [(&qa, 0i64), (&qb, 0), (&qa, 8), (&qb, 8)] {
            let co = c(b, 16 * kc + off);
            let e = b.op(&format!("arith.addi {qbase}, {co} : i64"));
            let e = b.op(&format!("arith.addi {e}, {tq2} : i64"));
            let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
            let v = b.load_vec("%q", &by, 2, "f32", 8);
            let lo = b.op(&format!("arith.mulf {}, {scale} : f32", v[0]));
            let hi = b.op(&format!("arith.mulf {}, {scale} : f32", v[1]));
            qf.push(b.pack2(&lo, &hi, false));
        }
    }
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let zero = b.cf32(0.0);
    let quad = |b: &mut Body, x: &str, combine: &str| -> String { b.xor_reduce(x, combine, &[1, 2]) };
    let ex2 = |b: &mut Body, x: &str| b.asm1("ex2.approx.ftz.f32", x);
    let mma = |b: &mut Body, a: &[String], b0: &str, b1: &str, acc: &[String]| -> Vec<String> { b.mma_m16n8k16("bf16", [&a[0], &a[1], &a[2], &a[3]], b0, b1, [&acc[0], &acc[1], &acc[2], &acc[3]]) };
    let lds = |b: &mut Body, off: &str| -> String {
        let p = b.op(&format!("arith.addi {base}, {off} : i64"));
        let p = b.op(&format!("llvm.inttoptr {p} : i64 to !llvm.ptr<3>"));
        b.op(&format!("llvm.load {p} {{alignment = 4 : i64}} : !llvm.ptr<3> -> i32"))
    };
    // carried: output accumulators of each m16 tile, then (m, l) of each row
    let carried_tys = vec!["f32"; ncar].join(", ");
    let init: Vec<String> = (0..mt * nacc).map(|_| zero.clone()).chain((0..2 * mt).flat_map(|_| [ninf.clone(), zero.clone()])).collect();
    // this lane's rows for the runs' scans: (row in the tile, inside it, seq, pos)
    let true_ = b.op("arith.constant true");
    // (pos32, wgmma: this lane's rows read per run inside the loop over runs, the lane from
    // its special register, rather than held in registers across the loops)
    let per_run = pos32 && wg;
    let lane_rows_of = |b: &mut Body| {
        let lane = if per_run {
            let v = b.op("llvm.inline_asm has_side_effects \"mov.u32 $0, %laneid;\", \"=r\" : () -> i32");
            b.op(&format!("arith.extui {v} : i32 to i64"))
        } else {
            lane.clone()
        };
        let mut lane_rows = vec![];
        for k in 0..(16 * mt * warps) / 32 {
            let ck = b.ci64(32 * k as i64);
            let j = b.op(&format!("arith.addi {lane}, {ck} : i64"));
            let valid = b.op(&format!("arith.cmpi slt, {j}, {nrows} : i64"));
            let tj = b.op(&format!("arith.addi {t0}, {j} : i64"));
            let tj = b.op(&format!("arith.select {valid}, {tj}, {t0} : i64"));
            // (seq and pos kept as i32: fewer registers across the loops)
            let sq = b.load_t("%seq", &tj, "i32");
            let ps = b.load_t("%pos", &tj, "i32");
            lane_rows.push((j, valid, sq, ps));
        }
        lane_rows
    };
    let early_lane_rows = if per_run { vec![] } else { lane_rows_of(b) };
    // runs of one sequence: r .. end
    let runs = b.v();
    let (r_in, r_body) = (b.v(), b.v());
    let acc_in: Vec<String> = (0..ncar).map(|_| b.v()).collect();
    let acc_body: Vec<String> = (0..ncar).map(|_| b.v()).collect();
    b.line(&format!(
        "{runs}:{} = scf.while ({r_in} = {c0}, {}) : (i64, {carried_tys}) -> (i64, {carried_tys}) {{",
        ncar + 1,
        acc_in.iter().zip(&init).map(|(a, i)| format!("{a} = {i}")).collect::<Vec<_>>().join(", ")
    ));
    let more = b.op(&format!("arith.cmpi slt, {r_in}, {nrows} : i64"));
    b.line(&format!("scf.condition({more}) {r_in}, {} : i64, {carried_tys}", acc_in.join(", ")));
    b.line("} do {");
    b.line(&format!("^bb0({r_body}: i64, {}):", acc_body.iter().map(|a| format!("{a}: f32")).collect::<Vec<_>>().join(", ")));
    let lane_rows = if per_run { lane_rows_of(b) } else { early_lane_rows };
    let tr = b.op(&format!("arith.addi {t0}, {r_body} : i64"));
    let s = b.load_i32_as_i64("%seq", &tr);
    // the run's end (the first row of another sequence, or past the tile's rows) and its
    // largest and smallest positions, uniform over the block: every warp finds them from its
    // lanes' rows (lane l: rows l, l + 32, ..) with a ballot per row group and shuffles
    let mut end = crows.clone();
    let s32 = b.op(&format!("arith.trunci {s} : i64 to i32"));
    for (k, (j, valid, sq, _)) in lane_rows.iter().enumerate() {
        let ge = b.op(&format!("arith.cmpi sge, {j}, {r_body} : i64"));
        let other = b.op(&format!("arith.cmpi ne, {sq}, {s32} : i32"));
        let nv = b.op(&format!("arith.xori {valid}, {true_} : i1"));
        let diff = b.op(&format!("arith.ori {other}, {nv} : i1"));
        let bit = b.op(&format!("arith.andi {ge}, {diff} : i1"));
        let bal = b.ballot(&bit);
        let tz = b.op(&format!("llvm.inline_asm \"{{ .reg .b32 r; brev.b32 r, $1; bfind.shiftamt.u32 $0, r; }}\", \"=r,r\" {bal} : (i32) -> i32"));
        let tz = b.op(&format!("arith.extui {tz} : i32 to i64"));
        let c32k = c(b, 32 * k as i64);
        let cand = b.op(&format!("arith.addi {tz}, {c32k} : i64"));
        let z32 = b.op("arith.constant 0 : i32");
        let has = b.op(&format!("arith.cmpi ne, {bal}, {z32} : i32"));
        let cand = b.op(&format!("arith.select {has}, {cand}, {crows} : i64"));
        end = b.op(&format!("arith.minsi {end}, {cand} : i64"));
    }
    let (mut mx, mut mn) = (b.op("arith.constant -1 : i32"), b.op("arith.constant 2147483647 : i32"));
    for (j, valid, _, ps) in &lane_rows {
        let ge = b.op(&format!("arith.cmpi sge, {j}, {r_body} : i64"));
        let lt = b.op(&format!("arith.cmpi slt, {j}, {end} : i64"));
        let inr = b.op(&format!("arith.andi {ge}, {lt} : i1"));
        let inr = b.op(&format!("arith.andi {inr}, {valid} : i1"));
        let a = b.op(&format!("arith.select {inr}, {ps}, {mx} : i32"));
        mx = b.op(&format!("arith.maxsi {mx}, {a} : i32"));
        let z = b.op(&format!("arith.select {inr}, {ps}, {mn} : i32"));
        mn = b.op(&format!("arith.minsi {mn}, {z} : i32"));
    }
    let w32 = b.op("arith.constant 32 : i32");
    for off in [16, 8, 4, 2, 1] {
        let o = b.op(&format!("arith.constant {off} : i32"));
        for (v, comb) in [(&mut mx, "arith.maxsi"), (&mut mn, "arith.minsi")] {
            let (sh, ok) = (b.v(), b.v());
            b.line(&format!("{sh}, {ok} = gpu.shuffle xor {v}, {o}, {w32} : i32"));
            *v = b.op(&format!("{comb} {v}, {sh} : i32"));
        }
    }
    let maxp = b.op(&format!("arith.extsi {mx} : i32 to i64"));
    // (the run's largest and smallest positions as i32, for the loop's key arithmetic)
    let (maxp32, minp32) = (mx.clone(), mn.clone());
    // the run takes the whole tile (every row of the block in it)
    let whole = {
        let first = b.op(&format!("arith.cmpi eq, {r_body}, {c0} : i64"));
        let all = b.op(&format!("arith.cmpi eq, {end}, {crows} : i64"));
        b.op(&format!("arith.andi {first}, {all} : i1"))
    };
    // this thread's rows in the run
    let mut inrun = vec![];
    for (rel, _, ok, _) in &rows {
        let ge = b.op(&format!("arith.cmpi sge, {rel}, {r_body} : i64"));
        let lt = b.op(&format!("arith.cmpi slt, {rel}, {end} : i64"));
        let x = b.op(&format!("arith.andi {ge}, {lt} : i1"));
        inrun.push(b.op(&format!("arith.andi {x}, {ok} : i1")));
    }
    let ckeys = c(b, KEYS as i64);
    let span = b.op(&format!("arith.addi {maxp}, {ckeys} : i64"));
    let ntiles64 = b.op(&format!("arith.divsi {span}, {ckeys} : i64"));
    let ntiles = b.op(&format!("arith.index_cast {ntiles64} : i64 to index"));
    let zi = b.op("arith.constant 0 : index");
    let onei = b.op("arith.constant 1 : index");
    let srow = b.op(&format!("arith.muli {s}, %mb : i64"));
    // the cache element of key j (i64): ((table[s, j / bs] * bs + j % bs) * kvh + kh) * d
    let key_base = |b: &mut Body, j: &str| -> String {
        let jc = b.op(&format!("arith.minsi {j}, {maxp} : i64"));
        b.paged_key_offset(&jc, &srow, &kh, &cbs, &ckvh, &cd)
    };
    // bf16 pools: tile `tile`'s K and V rows (keys clamped to the run's last) into stage `st`
    // with `cp.async`, 16 bytes each, rows as the pools hold them
    let chunks = (d / 8) as i64;
    let issue = |b: &mut Body, tile: &str, st: &str| {
        let ckeys = c(b, KEYS as i64);
        let j0 = b.op(&format!("arith.muli {tile}, {ckeys} : i64"));
        let csb = c(b, stage_bytes);
        let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
        let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
        let kg = b.op("llvm.ptrtoint %kc : !llvm.ptr<1> to i64");
        let vg = b.op("llvm.ptrtoint %vc : !llvm.ptr<1> to i64");
        let cch = c(b, chunks);
        // (every thread of the block copies)
        let ntc = nt;
        for i in 0..(KEYS as i64 * chunks) / ntc {
            let ci = c(b, ntc * i);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let kk = b.op(&format!("arith.divui {u}, {cch} : i64"));
            let ch = b.op(&format!("arith.remui {u}, {cch} : i64"));
            let j = b.op(&format!("arith.addi {j0}, {kk} : i64"));
            let kb = key_base(b, &j);
            let c2b = c(b, 2);
            let src = b.op(&format!("arith.muli {kb}, {c2b} : i64"));
            let c16b = c(b, 16);
            let cho = b.op(&format!("arith.muli {ch}, {c16b} : i64"));
            let src = b.op(&format!("arith.addi {src}, {cho} : i64"));
            let dst = if wg {
                sw128_offset(b, &kk, &ch, KEYS)
            } else {
                let cks = c(b, ks);
                let dst = b.op(&format!("arith.muli {kk}, {cks} : i64"));
                b.op(&format!("arith.addi {dst}, {cho} : i64"))
            };
            let dst = b.op(&format!("arith.addi {sb}, {dst} : i64"));
            for (g0, at) in [(&kg, 0i64), (&vg, v_at)] {
                let ga = b.op(&format!("arith.addi {g0}, {src} : i64"));
                let cat = c(b, at);
                let sa = b.op(&format!("arith.addi {dst}, {cat} : i64"));
                let sa = b.op(&format!("arith.trunci {sa} : i64 to i32"));
                b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.cg.shared.global [$0], [$1], 16;\", \"r,l\" {sa}, {ga} : (i32, i64) -> ()"));
            }
        }
    };
    let commit = "llvm.inline_asm has_side_effects \"cp.async.commit_group;\", \"\" : () -> ()";
    // TMA: tile `tile`'s K and V into stage `st` as boxes of `rows` keys x 64 head-dim columns
    // (one cache block's rows: coordinates (column, KV head, row in the block, block)), box w
    // by lane 0 of warp w — each issuing warp's share off the critical path is small — on the
    // stage's mbarrier, armed by thread 0 with the whole stage's bytes (a box landing before
    // the arming only runs the transaction count below zero; the phase needs the arrival).
    // `tma_box` first: the warp's box's (row in its block, block), read from the block table
    // ahead of the issue with a load the compiler cannot sink into it. Boxes past the run's
    // last key load its box again (masked like the clamped copies; the rows past it inside
    // that box are other slots' finite values)
    let nbox = tma_rows.map_or(1, |r| KEYS / r) as i64;
    let twarp = {
        let c32 = c(b, 32);
        b.op(&format!("arith.divui {t}, {c32} : i64"))
    };
    // (key positions in i32: the 64-bit compares, shifts and selects were ~8 of the loop's
    // instructions per tile)
    let tma_box = |b: &mut Body, tile: &str| -> (String, String) {
        let rows = tma_rows.unwrap_or(KEYS) as i64;
        let i32c = |b: &mut Body, v: i64| b.op(&format!("arith.constant {v} : i32"));
        let tile = b.op(&format!("arith.trunci {tile} : i64 to i32"));
        let ckeys = i32c(b, KEYS as i64);
        let j0 = b.op(&format!("arith.muli {tile}, {ckeys} : i32"));
        let crows = i32c(b, rows);
        let mrem = b.op(&format!("arith.remsi {maxp32}, {crows} : i32"));
        let lastb = b.op(&format!("arith.subi {maxp32}, {mrem} : i32"));
        let cl = c(b, nbox - 1);
        let wb = b.op(&format!("arith.minui {twarp}, {cl} : i64"));
        let wb = b.op(&format!("arith.trunci {wb} : i64 to i32"));
        let co = b.op(&format!("arith.muli {wb}, {crows} : i32"));
        let j = b.op(&format!("arith.addi {j0}, {co} : i32"));
        let j = b.op(&format!("arith.minsi {j}, {lastb} : i32"));
        let cbs32 = i32c(b, bs as i64);
        let bj = b.op(&format!("arith.divui {j}, {cbs32} : i32"));
        let within = b.op(&format!("arith.remui {j}, {cbs32} : i32"));
        let bj = b.op(&format!("arith.extui {bj} : i32 to i64"));
        let ti = b.op(&format!("arith.addi {srow}, {bj} : i64"));
        let c4t = c(b, 4);
        let to = b.op(&format!("arith.muli {ti}, {c4t} : i64"));
        let tb = b.op("llvm.ptrtoint %table : !llvm.ptr<1> to i64");
        let ta = b.op(&format!("arith.addi {tb}, {to} : i64"));
        let blk = b.op(&format!("llvm.inline_asm has_side_effects \"ld.global.nc.b32 $0, [$1];\", \"=r,l\" {ta} : (i64) -> i32"));
        (within, blk)
    };
    let tma_issue = |b: &mut Body, bx: &(String, String), st: &str| {
        let (Some(rows), Some(first)) = (tma_rows, &tfirst) else { return };
        let mb = mbar(b, st);
        b.line(&format!("scf.if {first} {{"));
        let bytes = b.op(&format!("arith.constant {stage_bytes} : i32"));
        b.line(&format!("llvm.inline_asm has_side_effects \"{{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1; }}\", \"r,r\" {mb}, {bytes} : (i32, i32) -> ()"));
        b.line("}");
        let c31 = c(b, 31);
        let ln = b.op(&format!("arith.andi {t}, {c31} : i64"));
        let c0t = c(b, 0);
        let l0 = b.op(&format!("arith.cmpi eq, {ln}, {c0t} : i64"));
        let cnb = c(b, nbox);
        let mine = b.op(&format!("arith.cmpi ult, {twarp}, {cnb} : i64"));
        let go = b.op(&format!("arith.andi {l0}, {mine} : i1"));
        b.line(&format!("scf.if {go} {{"));
        let csb = c(b, stage_bytes);
        let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
        let sb = b.op(&format!("arith.addi {base}, {sb} : i64"));
        let cbr = c(b, rows as i64 * 128);
        let wo = b.op(&format!("arith.muli {twarp}, {cbr} : i64"));
        let sb = b.op(&format!("arith.addi {sb}, {wo} : i64"));
        let kmap = b.op("llvm.ptrtoint %kc : !llvm.ptr<1> to i64");
        let vmap = b.op("llvm.ptrtoint %vc : !llvm.ptr<1> to i64");
        let kh32 = b.op(&format!("arith.trunci {kh} : i64 to i32"));
        let (within, blk) = bx;
        for cb in 0..(d / 64) as i64 {
            let col = b.op(&format!("arith.constant {} : i32", 64 * cb));
            for (map, at) in [(&kmap, 0i64), (&vmap, v_at)] {
                let o = c(b, at + cb * (KEYS * 128) as i64);
                let dst = b.op(&format!("arith.addi {sb}, {o} : i64"));
                let dst = b.op(&format!("arith.trunci {dst} : i64 to i32"));
                b.line(&format!(
                    "llvm.inline_asm has_side_effects \"cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$0], [$1, {{$2, $3, $4, $5}}], [$6];\", \"r,l,r,r,r,r,r\" {dst}, {map}, {col}, {kh32}, {within}, {blk}, {mb} : (i32, i64, i32, i32, i32, i32, i32) -> ()"
                ));
            }
        }
        b.line("}");
    };
    // (TMA: each stage's use count at the run's start — thread 0 adds the run's tiles after it)
    let uses: Option<[String; 2]> = tfirst.as_ref().map(|_| {
        b.line("gpu.barrier");
        let u0 = uses_ptr(b, 0);
        let u0 = b.op(&format!("llvm.load {u0} : !llvm.ptr<3> -> i32"));
        let u1 = uses_ptr(b, 1);
        let u1 = b.op(&format!("llvm.load {u1} : !llvm.ptr<3> -> i32"));
        let z = c(b, 0);
        let bx = tma_box(b, &z);
        tma_issue(b, &bx, &z);
        [u0, u1]
    });
    if !wide && uses.is_none() {
        // (the run's first tile, into stage 0)
        let z = c(b, 0);
        issue(b, &z, &z);
        b.line(commit);
    }
    // (wgmma: S = Q Kᵀ of the K tile at `kbase`, issued and committed, not waited: per k16
    // step kk of the head dim an m64n{KEYS}k16, A = this warp's Q fragments in registers (the
    // m16n8k16 A layout), B = K's tile, K-major — start in column block kk / 4, 32 bytes per
    // k16 inside it)
    let ns = KEYS / 2;
    let s_issue = |b: &mut Body, kbase: &str| -> Vec<String> {
        let zero = b.cf32(0.0);
        let mut cur: Vec<String> = vec![zero; ns];
        b.line("llvm.inline_asm has_side_effects \"wgmma.fence.sync.aligned;\", \"\"  : () -> ()");
        let klo = b.smem_desc_lo(kbase);
        for kk in 0..nkc {
            let o = kk / 4 * KEYS * 128 + kk % 4 * 32;
            let a = qf[4 * kk..4 * kk + 4].to_vec();
            let db = b.desc_at(&klo, o, SW128_K_DESC);
            cur = b.wgmma(&format!("m64n{KEYS}k16"), "bf16", &cur, &a, &db, false);
        }
        b.line("llvm.inline_asm has_side_effects \"wgmma.commit_group.sync.aligned;\", \"\"  : () -> ()");
        cur
    };
    let kvl = b.v();
    let tl = b.v();
    let acc_t: Vec<String> = (0..ncar).map(|_| b.v()).collect();
    b.line(&format!(
        "{kvl}:{ncar} = scf.for {tl} = {zi} to {ntiles} step {onei} iter_args({}) -> ({carried_tys}) {{",
        acc_t.iter().zip(acc_body.iter()).map(|(a, i)| format!("{a} = {i}")).collect::<Vec<_>>().join(", ")
    ));
    let tl64 = b.idx64(&tl);
    let j0 = b.op(&format!("arith.muli {tl64}, {ckeys} : i64"));
    // this tile's K and V in shared memory: bf16 (stage tl % 2 filled by the copies issued one
    // tile ago; the next tile's issued now), or gathered here from f32 pools
    let mut next_box: Option<(String, String)> = None;
    let sbase = if wide {
        // gather K (row-major) and V (transposed) of keys j0..j0+63 as bf16
        let dq = (d / 4) as i64;
        let cdq = c(b, dq);
        for i in 0..(KEYS as i64 * dq) / 128 {
            let ci = c(b, 128 * i);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let kk = b.op(&format!("arith.divui {u}, {cdq} : i64"));
            let ch4 = b.op(&format!("arith.remui {u}, {cdq} : i64"));
            let j = b.op(&format!("arith.addi {j0}, {kk} : i64"));
            let kb = key_base(b, &j);
            let e = b.op(&format!("arith.muli {ch4}, {c4} : i64"));
            let e = b.op(&format!("arith.addi {kb}, {e} : i64"));
            let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
            let v = b.load_vec("%kc", &by, 4, "f32", 16);
            let (p0, p1) = (b.pack2(&v[0], &v[1], false), b.pack2(&v[2], &v[3], false));
            let cks = c(b, ks);
            let so = b.op(&format!("arith.muli {kk}, {cks} : i64"));
            let c8b = c(b, 8);
            let co = b.op(&format!("arith.muli {ch4}, {c8b} : i64"));
            let so = b.op(&format!("arith.addi {so}, {co} : i64"));
            let sa = b.op(&format!("arith.addi {base}, {so} : i64"));
            let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
            let vv = b.vector(&[p0, p1], "i32");
            b.line(&format!("llvm.store {vv}, {sp} {{alignment = 8 : i64}} : vector<2xi32>, !llvm.ptr<3>"));
        }
        let cpairs = c(b, (KEYS / 2) as i64);
        for i in 0..(KEYS as i64 / 2 * dq) / 128 {
            let ci = c(b, 128 * i);
            let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
            let pk = b.op(&format!("arith.remui {u}, {cpairs} : i64"));
            let ch4 = b.op(&format!("arith.divui {u}, {cpairs} : i64"));
            let k2 = b.op(&format!("arith.muli {pk}, {c2} : i64"));
            let mut vals = vec![];
            for dk in 0..2 {
                let cdk = c(b, dk);
                let kk = b.op(&format!("arith.addi {k2}, {cdk} : i64"));
                let j = b.op(&format!("arith.addi {j0}, {kk} : i64"));
                let kb = key_base(b, &j);
                let e = b.op(&format!("arith.muli {ch4}, {c4} : i64"));
                let e = b.op(&format!("arith.addi {kb}, {e} : i64"));
                let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
                vals.push(b.load_vec("%vc", &by, 4, "f32", 16));
            }
            for q in 0..4i64 {
                let w = b.pack2(&vals[0][q as usize], &vals[1][q as usize], false);
                let dr = b.op(&format!("arith.muli {ch4}, {c4} : i64"));
                let cq = c(b, q);
                let dr = b.op(&format!("arith.addi {dr}, {cq} : i64"));
                let cvs = c(b, vs);
                let so = b.op(&format!("arith.muli {dr}, {cvs} : i64"));
                let po = b.op(&format!("arith.muli {pk}, {c4} : i64"));
                let so = b.op(&format!("arith.addi {so}, {po} : i64"));
                let cva = c(b, v_at);
                let so = b.op(&format!("arith.addi {so}, {cva} : i64"));
                let sa = b.op(&format!("arith.addi {base}, {so} : i64"));
                let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
                b.line(&format!("llvm.store {w}, {sp} {{alignment = 4 : i64}} : i32, !llvm.ptr<3>"));
            }
        }
        b.line("gpu.barrier");
        base.clone()
    } else if let Some([u0, u1]) = &uses {
        // (the next tile's box entry read now, used after this tile's S is issued)
        let c1t = c(b, 1);
        let nt = b.op(&format!("arith.addi {tl64}, {c1t} : i64"));
        next_box = Some(tma_box(b, &nt));
        // (TMA: tile tl landed in stage tl % 2 — that stage's use count at the run's start +
        // tl / 2 completed phases before it; no block barrier: every thread waits itself)
        // (in i32: the 64-bit remainder, compare and address math were ~6 instructions)
        let tl32 = b.op(&format!("arith.trunci {tl64} : i64 to i32"));
        let one32 = b.op("arith.constant 1 : i32");
        let cst = b.op(&format!("arith.andi {tl32}, {one32} : i32"));
        let half = b.op(&format!("arith.shrui {tl32}, {one32} : i32"));
        let z32 = b.op("arith.constant 0 : i32");
        let is0 = b.op(&format!("arith.cmpi eq, {cst}, {z32} : i32"));
        let u = b.op(&format!("arith.select {is0}, {u0}, {u1} : i32"));
        let ph = b.op(&format!("arith.addi {u}, {half} : i32"));
        let par = b.op(&format!("arith.andi {ph}, {one32} : i32"));
        let base32 = b.op(&format!("arith.trunci {base} : i64 to i32"));
        let c8m = b.op("arith.constant 8 : i32");
        let mo = b.op(&format!("arith.muli {cst}, {c8m} : i32"));
        let cba = b.op(&format!("arith.constant {bar_at} : i32"));
        let mo = b.op(&format!("arith.addi {mo}, {cba} : i32"));
        let mb = b.op(&format!("arith.addi {base32}, {mo} : i32"));
        b.mbar_spin(&mb, &par);
        let csb = b.op(&format!("arith.constant {stage_bytes} : i32"));
        let so = b.op(&format!("arith.muli {cst}, {csb} : i32"));
        let so = b.op(&format!("arith.extui {so} : i32 to i64"));
        b.op(&format!("arith.addi {base}, {so} : i64"))
    } else {
        // (tile tl + 1 into stage (tl + 1) % 2)
        let ahead_t = c(b, 1);
        let cstg = c(b, 2);
        let nt = b.op(&format!("arith.addi {tl64}, {ahead_t} : i64"));
        let more = b.op(&format!("arith.cmpi slt, {nt}, {ntiles64} : i64"));
        b.line(&format!("scf.if {more} {{"));
        let nst = b.op(&format!("arith.remui {nt}, {cstg} : i64"));
        issue(b, &nt, &nst);
        b.line("}");
        b.line(commit);
        // (this tile's copies have landed)
        b.line("llvm.inline_asm has_side_effects \"cp.async.wait_group 1;\", \"\" : () -> ()");
        if wg {
            // (the copies' writes, made by the generic proxy, before wgmma reads them)
            b.line("llvm.inline_asm has_side_effects \"fence.proxy.async.shared::cta;\", \"\" : () -> ()");
        }
        b.line("gpu.barrier");
        let cst = b.op(&format!("arith.remui {tl64}, {cstg} : i64"));
        let csb = c(b, stage_bytes);
        let so = b.op(&format!("arith.muli {cst}, {csb} : i64"));
        b.op(&format!("arith.addi {base}, {so} : i64"))
    };
    // S = Q K^T: 8 tiles of 8 keys (per m16 tile: sacc_t[i][n8])
    let tq4 = b.op(&format!("arith.muli {tq}, {c4} : i64"));
    let mut sacc: Vec<Vec<String>> = vec![];
    let mut sacc_t: Vec<Vec<Vec<String>>> = vec![];
    // (bf16: this lane's `ldmatrix` row address in the K tile — row l % 8 (key) of matrix
    // l / 8, 8 head-dim columns further each — and its (m, r) = (l / 8, l % 8))
    let (m, r) = (b.op(&format!("arith.divui {lane}, {c8} : i64")), b.op(&format!("arith.remui {lane}, {c8} : i64")));
    let kl = {
        let cks = c(b, ks);
        let ro = b.op(&format!("arith.muli {r}, {cks} : i64"));
        let mo = b.op(&format!("arith.muli {m}, {c16} : i64"));
        let lo = b.op(&format!("arith.addi {ro}, {mo} : i64"));
        b.op(&format!("arith.addi {sbase}, {lo} : i64"))
    };
    if mt > 1 {
        // per pair of k16 steps: each tile's A fragments from Q in shared memory (ldmatrix.x4:
        // lane l addresses row l % 8 + 8 ((l / 8) % 2), 8 (l / 16) columns further), then per
        // 8 keys one K ldmatrix feeding every tile's two MMAs
        let cks = c(b, ks);
        let m2 = b.op(&format!("arith.remui {m}, {c2} : i64"));
        let mh = b.op(&format!("arith.divui {m}, {c2} : i64"));
        let qr = b.op(&format!("arith.muli {m2}, {c8} : i64"));
        let qr = b.op(&format!("arith.addi {qr}, {r} : i64"));
        let qr = b.op(&format!("arith.addi {qr}, {w16} : i64"));
        let ql = b.op(&format!("arith.muli {qr}, {cks} : i64"));
        let qc = b.op(&format!("arith.muli {mh}, {c16} : i64"));
        let ql = b.op(&format!("arith.addi {ql}, {qc} : i64"));
        let cqa = c(b, q_at);
        let ql = b.op(&format!("arith.addi {ql}, {cqa} : i64"));
        let ql = b.op(&format!("arith.addi {base}, {ql} : i64"));
        sacc_t = vec![vec![vec![zero.clone(); 4]; KEYS / 8]; mt];
        for p in 0..(nkc / 2) as i64 {
            let qa: Vec<Vec<Vec<String>>> = (0..mt as i64).map(|i| (0..2).map(|h2| b.ldmatrix(&ql, 16 * i * ks + 32 * (2 * p + h2), 4, false)).collect()).collect();
            for n8 in 0..KEYS / 8 {
                let f = b.ldmatrix(&kl, 8 * n8 as i64 * ks + 64 * p, 4, false);
                for i in 0..mt {
                    let acc = mma(b, &qa[i][0], &f[0], &f[1], &sacc_t[i][n8]);
                    sacc_t[i][n8] = mma(b, &qa[i][1], &f[2], &f[3], &acc);
                }
            }
        }
    } else if wg {
        // S = Q Kᵀ on wgmma, Q from registers (`s_issue`)
        let cur = s_issue(b, &sbase);
        if uses.is_some() {
            // (TMA: the next tile's boxes go out under this S — its stage was last read by
            // the previous tile, done before that iteration's closing barrier)
            let c1t = c(b, 1);
            let nt = b.op(&format!("arith.addi {tl64}, {c1t} : i64"));
            let more = b.op(&format!("arith.cmpi slt, {nt}, {ntiles64} : i64"));
            b.line(&format!("scf.if {more} {{"));
            let c2t = c(b, 2);
            let nst = b.op(&format!("arith.remui {nt}, {c2t} : i64"));
            tma_issue(b, next_box.as_ref().expect("TMA"), &nst);
            b.line("}");
        }
        let cur = b.wgmma_wait(0, &cur);
        sacc = cur.chunks(4).map(|x| x.to_vec()).collect();
    } else if wide {
        let cks = c(b, ks);
        let gk = b.op(&format!("arith.muli {g}, {cks} : i64"));
        let kfrag = b.op(&format!("arith.addi {gk}, {tq4} : i64"));
        for n8 in 0..(KEYS / 8) as i64 {
            let mut acc = vec![zero.clone(); 4];
            for kc in 0..nkc as i64 {
                let o = c(b, 8 * n8 * ks + 32 * kc);
                let off = b.op(&format!("arith.addi {kfrag}, {o} : i64"));
                let b0 = lds(b, &off);
                let c16b = c(b, 16);
                let off1 = b.op(&format!("arith.addi {off}, {c16b} : i64"));
                let b1 = lds(b, &off1);
                acc = mma(b, &qf[4 * kc as usize..4 * kc as usize + 4], &b0, &b1, &acc);
            }
            sacc.push(acc);
        }
    } else {
        // ldmatrix.x4 at `kl`: the B fragments of two k16 steps of 8 keys
        for n8 in 0..(KEYS / 8) as i64 {
            let mut acc = vec![zero.clone(); 4];
            for p in 0..nkc.div_ceil(2) as i64 {
                let two = 2 * p as usize + 1 < nkc;
                let f = b.ldmatrix(&kl, 8 * n8 * ks + 64 * p, if two { 4 } else { 2 }, false);
                acc = mma(b, &qf[8 * p as usize..8 * p as usize + 4], &f[0], &f[1], &acc);
                if two {
                    acc = mma(b, &qf[8 * p as usize + 4..8 * p as usize + 8], &f[2], &f[3], &acc);
                }
            }
            sacc.push(acc);
        }
    }
    if mt == 1 {
        sacc_t = vec![sacc];
    }
    let nk8 = KEYS / 8;
    // mask: key j0 + 8 n8 + 2 tq (+1) for row a (c0, c1) and row b (c2, c3) — only where
    // the tile has keys past a row's position or rows outside the run (block-uniform: tiles
    // wholly below the diagonal of a run that fills the block skip it)
    let jq = b.op(&format!("arith.addi {j0}, {tq2} : i64"));
    // (in i32: the run's smallest position is one already)
    let j032 = b.op(&format!("arith.trunci {j0} : i64 to i32"));
    let cl = b.op(&format!("arith.constant {} : i32", KEYS as i64 - 1));
    let jl = b.op(&format!("arith.addi {j032}, {cl} : i32"));
    let below = b.op(&format!("arith.cmpi sle, {jl}, {minp32} : i32"));
    let plain = b.op(&format!("arith.andi {below}, {whole} : i1"));
    // (row ri = tile ri / 2, half ri % 2: its 16 values, 8 keys x 2, in key order)
    let raw: Vec<String> = (0..2 * mt).flat_map(|ri| sacc_t[ri / 2].iter().flat_map(move |sa| (0..2).map(move |q| sa[2 * (ri % 2) + q].clone()))).collect();
    let masked = b.v();
    let ftys = vec!["f32"; raw.len()].join(", ");
    b.line(&format!("{masked}:{} = scf.if {plain} -> ({ftys}) {{", raw.len()));
    b.line(&format!("scf.yield {} : {ftys}", raw.join(", ")));
    b.line("} else {");
    let mut mvals = vec![];
    let jq32 = pos32.then(|| b.op(&format!("arith.trunci {jq} : i64 to i32")));
    for (ri, (_, _, _, p)) in rows.iter().enumerate() {
        // (pos32: key jq + c is at or before the row's position where c <= p - jq)
        let left = jq32.as_ref().map(|jq32| b.op(&format!("arith.subi {p}, {jq32} : i32")));
        for n8 in 0..nk8 {
            for q in 0..2 {
                let le = match &left {
                    Some(left) => {
                        let cj = b.op(&format!("arith.constant {} : i32", 8 * n8 + q));
                        b.op(&format!("arith.cmpi sle, {cj}, {left} : i32"))
                    }
                    None => {
                        let cj = c(b, 8 * n8 as i64 + q as i64);
                        let j = b.op(&format!("arith.addi {jq}, {cj} : i64"));
                        b.op(&format!("arith.cmpi sle, {j}, {p} : i64"))
                    }
                };
                let ok = b.op(&format!("arith.andi {le}, {} : i1", inrun[ri]));
                mvals.push(b.op(&format!("arith.select {ok}, {}, {ninf} : f32", raw[ri * 2 * nk8 + 2 * n8 + q])));
            }
        }
    }
    b.line(&format!("scf.yield {} : {ftys}", mvals.join(", ")));
    b.line("}");
    let mut new_state = vec![];
    let tree = b.o.flash_tree;
    // (wgmma: the lazy rescale, `FLASH_LAZY_THRESHOLD`)
    let lazy = if wg && mt == 1 { b.o.flash_lazy } else { None };
    let mut grows: Vec<String> = vec![];
    let mut lazy_rows: Vec<(String, String, String)> = vec![];
    let mut pvals_t: Vec<Vec<Vec<String>>> = vec![vec![vec![]; nk8]; mt];
    let mut pf_t: Vec<Vec<Vec<String>>> = vec![];
    let mut alphas = vec![];
    for ri in 0..rows.len() {
        let vals: Vec<String> = (0..2 * nk8).map(|k| format!("{masked}#{}", ri * 2 * nk8 + k)).collect();
        let mx = if tree { b.tree_reduce(&vals, "arith.maximumf") } else { b.chain_reduce(&vals, "arith.maximumf") };
        let mx = quad(b, &mx, "arith.maximumf");
        let (m_old, l_old) = (&acc_t[mt * nacc + 2 * ri], &acc_t[mt * nacc + 2 * ri + 1]);
        let m_new = b.op(&format!("arith.maximumf {m_old}, {mx} : f32"));
        let m_new = match lazy {
            // (lazy: the row's reference max moves only where the tile's max passes it by more
            // than the threshold)
            Some(th) => {
                let cth = b.cf32(th);
                let lim = b.op(&format!("arith.addf {m_old}, {cth} : f32"));
                let grow = b.op(&format!("arith.cmpf ogt, {mx}, {lim} : f32"));
                grows.push(grow.clone());
                b.op(&format!("arith.select {grow}, {m_new}, {m_old} : f32"))
            }
            None => m_new,
        };
        let none = b.op(&format!("arith.cmpf oeq, {m_new}, {ninf} : f32"));
        let m_use = b.op(&format!("arith.select {none}, {zero}, {m_new} : f32"));
        let dm = b.op(&format!("arith.subf {m_old}, {m_use} : f32"));
        // (lazy: alpha only where the warp rescales, in that branch below; `alphas` then holds
        // no values and only the non-lazy paths read it)
        let alpha = if lazy.is_some() { String::new() } else { ex2(b, &dm) };
        let mut pes = vec![zero.clone()];
        for (k, v) in vals.iter().enumerate() {
            let x = b.op(&format!("arith.subf {v}, {m_use} : f32"));
            let pe = ex2(b, &x);
            pes.push(pe.clone());
            pvals_t[ri / 2][k / 2].push(pe);
        }
        // (the row's max and sum as pairwise trees: 4 dependent steps, not 15 — ncu on the
        // wgmma kernel: a third of its stalls waited on fixed-latency dependencies)
        let sum = if tree { b.tree_reduce(&pes[1..], "arith.addf") } else { b.chain_reduce(&pes, "arith.addf") };
        let l_new = if lazy.is_some() {
            // (lazy: the row's sum updated with the rescale's branch below)
            lazy_rows.push((dm.clone(), l_old.clone(), sum.clone()));
            String::new()
        } else {
            b.op(&format!("llvm.intr.fma({l_old}, {alpha}, {sum}) : (f32, f32, f32) -> f32"))
        };
        new_state.push(m_new);
        new_state.push(l_new);
        alphas.push(alpha);
        // a tile's both rows done: its P fragments now (pvals[n8] = [a q0, a q1, b q0, b q1];
        // per 16 keys: tiles 2kc and 2kc + 1), so its probabilities die here
        if ri % 2 == 1 {
            let pvals = &pvals_t[ri / 2];
            let frags: Vec<Vec<String>> = (0..KEYS / 16)
                .map(|kc| {
                    let (x, y) = (&pvals[2 * kc], &pvals[2 * kc + 1]);
                    vec![b.pack2(&x[0], &x[1], false), b.pack2(&x[2], &x[3], false), b.pack2(&y[0], &y[1], false), b.pack2(&y[2], &y[3], false)]
                })
                .collect();
            pf_t.push(frags);
        }
    }
    let pf = &pf_t[0];
    // O = O * alpha + P V
    let mut out_acc = vec![];
    if wg {
        // O = O·alpha + P V on wgmma: m64n{D}k16 per 16 keys, A = P (registers), B = V's tile
        // N-major (imm-trans-b): 8 keys x 128 bytes per swizzle atom, atoms along the head dim
        // LBO = 64 keys x 128 bytes apart, along the keys SBO = 1024 bytes
        let mut cur: Vec<String> = if lazy.is_some() {
            // (lazy: O rescaled only where a row of the warp moved its reference max — after
            // the first tiles, almost never)
            let mut any = b.op("arith.constant false");
            for g in &grows {
                any = b.op(&format!("arith.ori {any}, {g} : i1"));
            }
            let bal = b.ballot(&any);
            let z32 = b.op("arith.constant 0 : i32");
            let moved = b.op(&format!("arith.cmpi ne, {bal}, {z32} : i32"));
            // (the rows' sums ride the same branch: alpha's ex2 only where some row moved, l + sum
            // where none did — alpha is 1 there, or 0 with l and sum both 0)
            let nr = lazy_rows.len();
            let o_tys = vec!["f32"; nacc + nr].join(", ");
            let r = b.v();
            b.line(&format!("{r}:{} = scf.if {moved} -> ({o_tys}) {{", nacc + nr));
            let al: Vec<String> = lazy_rows.iter().map(|(dm, _, _)| ex2(b, dm)).collect();
            let mut sc: Vec<String> = (0..nacc).map(|i| b.op(&format!("arith.mulf {}, {} : f32", acc_t[i], al[(i % 4) / 2]))).collect();
            for ((_, l_old, sum), a) in lazy_rows.iter().zip(&al) {
                sc.push(b.op(&format!("llvm.intr.fma({l_old}, {a}, {sum}) : (f32, f32, f32) -> f32")));
            }
            b.line(&format!("scf.yield {} : {o_tys}", sc.join(", ")));
            b.line("} else {");
            let mut keep: Vec<String> = acc_t[..nacc].to_vec();
            for (_, l_old, sum) in &lazy_rows {
                keep.push(b.op(&format!("arith.addf {l_old}, {sum} : f32")));
            }
            b.line(&format!("scf.yield {} : {o_tys}", keep.join(", ")));
            b.line("}");
            for ri in 0..nr {
                new_state[2 * ri + 1] = format!("{r}#{}", nacc + ri);
            }
            (0..nacc).map(|i| format!("{r}#{i}")).collect()
        } else {
            (0..nacc).map(|i| b.op(&format!("arith.mulf {}, {} : f32", acc_t[i], alphas[(i % 4) / 2]))).collect()
        };
        let (lbo, sbo) = FLASH_WG_VDESC;
        let fixed = (lbo >> 4) << 16 | ((sbo >> 4) << 32) | (1u64 << 62);
        b.line("llvm.inline_asm has_side_effects \"wgmma.fence.sync.aligned;\", \"\"  : () -> ()");
        let cva = c(b, v_at);
        let vbase = b.op(&format!("arith.addi {sbase}, {cva} : i64"));
        let vlo = b.smem_desc_lo(&vbase);
        for (kc, a) in pf.iter().enumerate() {
            let desc = b.desc_at(&vlo, kc * 16 * 128, fixed);
            cur = b.wgmma(&format!("m64n{d}k16"), "bf16", &cur, a, &desc, true);
        }
        b.line("llvm.inline_asm has_side_effects \"wgmma.commit_group.sync.aligned;\", \"\"  : () -> ()");
        out_acc = b.wgmma_wait(0, &cur);
    } else if wide {
        let cvs = c(b, vs);
        let gv = b.op(&format!("arith.muli {g}, {cvs} : i64"));
        let vfrag = b.op(&format!("arith.addi {gv}, {tq4} : i64"));
        for n8 in 0..nd8 {
            let mut acc: Vec<String> = (0..4).map(|q| b.op(&format!("arith.mulf {}, {} : f32", acc_t[4 * n8 + q], alphas[q / 2]))).collect();
            for (kc, a) in pf.iter().enumerate() {
                let o = c(b, v_at + 8 * n8 as i64 * vs + 32 * kc as i64);
                let off = b.op(&format!("arith.addi {vfrag}, {o} : i64"));
                let b0 = lds(b, &off);
                let c16b = c(b, 16);
                let off1 = b.op(&format!("arith.addi {off}, {c16b} : i64"));
                let b1 = lds(b, &off1);
                acc = mma(b, a, &b0, &b1, &acc);
            }
            out_acc.extend(acc);
        }
    } else {
        // ldmatrix.x4.trans over key-major V: lane l addresses key 8 (m % 2) + l % 8 of the
        // k16 step, head-dim columns 8 (m / 2) further (m = l / 8): the B fragments of two
        // 8-column tiles
        let m2 = b.op(&format!("arith.remui {m}, {c2} : i64"));
        let mh = b.op(&format!("arith.divui {m}, {c2} : i64"));
        let key = b.op(&format!("arith.muli {m2}, {c8} : i64"));
        let key = b.op(&format!("arith.addi {key}, {r} : i64"));
        let cvs = c(b, vs);
        let lo = b.op(&format!("arith.muli {key}, {cvs} : i64"));
        let co = b.op(&format!("arith.muli {mh}, {c16} : i64"));
        let lo = b.op(&format!("arith.addi {lo}, {co} : i64"));
        let cva = c(b, v_at);
        let lo = b.op(&format!("arith.addi {lo}, {cva} : i64"));
        let vl = b.op(&format!("arith.addi {sbase}, {lo} : i64"));
        // (tile i's O accumulators at i·nacc + 4 n8 + j, rows 2i (j < 2) and 2i + 1)
        let mut outs: Vec<Vec<String>> = vec![vec![]; mt];
        for q in 0..nd8 / 2 {
            let scaled =
                |b: &mut Body, i: usize, n8: usize| -> Vec<String> { (0..4).map(|j| b.op(&format!("arith.mulf {}, {} : f32", acc_t[i * nacc + 4 * n8 + j], alphas[2 * i + j / 2]))).collect() };
            let mut a0: Vec<Vec<String>> = (0..mt).map(|i| scaled(b, i, 2 * q)).collect();
            let mut a1: Vec<Vec<String>> = (0..mt).map(|i| scaled(b, i, 2 * q + 1)).collect();
            for kc in 0..KEYS / 16 {
                let f = b.ldmatrix(&vl, 16 * kc as i64 * vs + 32 * q as i64, 4, true);
                for i in 0..mt {
                    a0[i] = mma(b, &pf_t[i][kc], &f[0], &f[1], &a0[i]);
                    a1[i] = mma(b, &pf_t[i][kc], &f[2], &f[3], &a1[i]);
                }
            }
            for i in 0..mt {
                outs[i].extend(a0[i].clone());
                outs[i].extend(a1[i].clone());
            }
        }
        out_acc = outs.concat();
    }
    b.line("gpu.barrier");
    out_acc.extend(new_state);
    b.line(&format!("scf.yield {} : {carried_tys}", out_acc.join(", ")));
    b.line("}");
    if let (Some([u0, u1]), Some(first)) = (&uses, &tfirst) {
        // (TMA: the run used stage 0 for its even tiles, stage 1 for its odd ones)
        b.line(&format!("scf.if {first} {{"));
        let n32 = b.op(&format!("arith.trunci {ntiles64} : i64 to i32"));
        let one32 = b.op("arith.constant 1 : i32");
        let n1 = b.op(&format!("arith.addi {n32}, {one32} : i32"));
        let e0 = b.op(&format!("arith.shrui {n1}, {one32} : i32"));
        let e1 = b.op(&format!("arith.shrui {n32}, {one32} : i32"));
        for (st, (u, e)) in [(u0, e0), (u1, e1)].into_iter().enumerate() {
            let v = b.op(&format!("arith.addi {u}, {e} : i32"));
            let p = uses_ptr(b, st);
            b.line(&format!("llvm.store {v}, {p} : i32, !llvm.ptr<3>"));
        }
        b.line("}");
    }
    let res: Vec<String> = (0..ncar).map(|i| format!("{kvl}#{i}")).collect();
    b.line(&format!("scf.yield {end}, {} : i64, {carried_tys}", res.join(", ")));
    b.line("}");
    // normalize and store rows a and b
    let fin: Vec<String> = (0..ncar).map(|i| format!("{runs}#{}", i + 1)).collect();
    let one = b.cf32(1.0);
    // (pos32, a head per block: this thread's output rows re-derived from the special
    // registers — read through side-effecting asm, so nothing carries them across the loops)
    let sreg = |b: &mut Body, r: &str| -> String {
        let v = b.op(&format!("llvm.inline_asm has_side_effects \"mov.u32 $0, {r};\", \"=r\" : () -> i32"));
        b.op(&format!("arith.extui {v} : i32 to i64"))
    };
    let (end_rows, end_hq, end_tq2): (Vec<(String, String)>, String, String) = if pos32 && mt == 1 {
        let te = sreg(b, "%tid.x");
        let hqe = sreg(b, "%ctaid.x");
        let ye = sreg(b, "%ctaid.y");
        let nye = sreg(b, "%nctaid.y");
        let tl = b.op(&format!("arith.subi {nye}, {ye} : i64"));
        let c1e = c(b, 1);
        let tl = b.op(&format!("arith.subi {tl}, {c1e} : i64"));
        let t0e = b.op(&format!("arith.muli {tl}, {crows} : i64"));
        let lefte = b.op(&format!("arith.subi %n, {t0e} : i64"));
        let nre = b.op(&format!("arith.minsi {lefte}, {crows} : i64"));
        let (we, _, ge, tqe) = b.mma_coords(&te);
        let c16e = c(b, 16);
        let w16e = b.op(&format!("arith.muli {we}, {c16e} : i64"));
        let ra = b.op(&format!("arith.addi {w16e}, {ge} : i64"));
        let c8e = c(b, 8);
        let rb = b.op(&format!("arith.addi {ra}, {c8e} : i64"));
        let rs = [ra, rb]
            .iter()
            .map(|rel| {
                let row = b.op(&format!("arith.addi {t0e}, {rel} : i64"));
                let ok = b.op(&format!("arith.cmpi slt, {rel}, {nre} : i64"));
                (b.op(&format!("arith.select {ok}, {row}, {t0e} : i64")), ok)
            })
            .collect();
        let c2e = c(b, 2);
        (rs, hqe, b.op(&format!("arith.muli {tqe}, {c2e} : i64")))
    } else {
        (rows.iter().map(|(_, rc, ok, _)| (rc.clone(), ok.clone())).collect(), hq.clone(), tq2.clone())
    };
    let tq2 = end_tq2;
    for (ri, (rc, ok)) in end_rows.iter().enumerate() {
        let l = quad(b, &fin[mt * nacc + 2 * ri + 1], "arith.addf");
        let inv = b.op(&format!("arith.divf {one}, {l} : f32"));
        let ob = {
            let r = b.op(&format!("arith.muli {rc}, {ch} : i64"));
            let r = b.op(&format!("arith.addi {r}, {end_hq} : i64"));
            b.op(&format!("arith.muli {r}, {cd} : i64"))
        };
        b.line(&format!("scf.if {ok} {{"));
        for n8 in 0..nd8 {
            let o = (ri / 2) * nacc + 4 * n8 + 2 * (ri % 2);
            let v0 = b.op(&format!("arith.mulf {}, {inv} : f32", fin[o]));
            let v1 = b.op(&format!("arith.mulf {}, {inv} : f32", fin[o + 1]));
            let co = c(b, 8 * n8 as i64);
            let e = b.op(&format!("arith.addi {ob}, {co} : i64"));
            let e = b.op(&format!("arith.addi {e}, {tq2} : i64"));
            let by = b.op(&format!("arith.muli {e}, {c4} : i64"));
            let p = b.op(&format!("llvm.getelementptr %out[{by}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
            let vv = b.vector(&[v0, v1], "f32");
            b.line(&format!("llvm.store {vv}, {p} {{alignment = 8 : i64}} : vector<2xf32>, !llvm.ptr<1>"));
        }
        b.line("}");
    }
    Ok("%q: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64".into())
}

/// Whether the tensor-core matmuls take `wdtype` weights (and the activations) as f16 rather
/// than bf16 operands: f16 and the block-quantized formats (whose dequantized values are
/// f16-scaled; f16's 11-bit significand keeps GPU prefill logits ~4x closer to the CPU's than
/// bf16 did: SmolLM2 Q4_1 'story' 2.5e-2 -> see bench/results/gpu-check-smollm2-*.json).
/// The kernel-name suffix of a KV pool type: none for f32 (the names plans had before), else
/// `_kv{dtype}`.
pub fn kv_suffix(kv: DType) -> String {
    if kv == DType::F32 {
        String::new()
    } else {
        format!("_kv{kv}")
    }
}

pub fn tensor_core_f16(wdtype: DType) -> bool {
    !matches!(wdtype, DType::BF16 | DType::F32)
}

/// Parameters of the matmul kernels: x, w, [bias], [res], y, then [M] and N.
fn matmul_params(bias: bool, residual: bool, with_m: bool) -> String {
    format!(
        "%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, {}{}%y: !llvm.ptr<1>, {}%n: i64",
        if bias { "%bias: !llvm.ptr<1>, " } else { "" },
        if residual { "%res: !llvm.ptr<1>, " } else { "" },
        if with_m { "%m: i64, " } else { "" }
    )
}

fn unary_expr(b: &mut Body, u: UnaryOp, x: &str) -> Result<String, String> {
    Ok(match u {
        UnaryOp::Neg => b.op(&format!("arith.negf {x} : f32")),
        UnaryOp::Exp => b.exp(x),
        UnaryOp::Sqrt => b.asm1("sqrt.rn.f32", x),
        UnaryOp::Rsqrt => b.asm1("rsqrt.approx.ftz.f32", x),
        UnaryOp::Recip => {
            let one = b.cf32(1.0);
            b.op(&format!("arith.divf {one}, {x} : f32"))
        }
        UnaryOp::Tanh => b.asm1("tanh.approx.f32", x),
        UnaryOp::Sigmoid => b.sigmoid(x),
        UnaryOp::Relu => {
            let z = b.cf32(0.0);
            b.op(&format!("arith.maximumf {x}, {z} : f32"))
        }
        UnaryOp::Silu => {
            let s = b.sigmoid(x);
            b.op(&format!("arith.mulf {x}, {s} : f32"))
        }
        UnaryOp::Gelu => {
            // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            let x2 = b.op(&format!("arith.mulf {x}, {x} : f32"));
            let x3 = b.op(&format!("arith.mulf {x2}, {x} : f32"));
            let c = b.cf32(0.044715);
            let t = b.op(&format!("arith.mulf {x3}, {c} : f32"));
            let u = b.op(&format!("arith.addf {x}, {t} : f32"));
            let k = b.cf32(0.797_884_6);
            let v = b.op(&format!("arith.mulf {u}, {k} : f32"));
            let th = b.asm1("tanh.approx.f32", &v);
            let one = b.cf32(1.0);
            let w = b.op(&format!("arith.addf {one}, {th} : f32"));
            let half = b.cf32(0.5);
            let hx = b.op(&format!("arith.mulf {x}, {half} : f32"));
            b.op(&format!("arith.mulf {hx}, {w} : f32"))
        }
        UnaryOp::GeluErf => {
            // 0.5 x (1 + erf(x / sqrt 2)); erf by the rational form the CPU executor uses
            let r2 = b.cf32(std::f32::consts::FRAC_1_SQRT_2);
            let z = b.op(&format!("arith.mulf {x}, {r2} : f32"));
            let nz = b.op(&format!("arith.negf {z} : f32"));
            let az = b.op(&format!("arith.maximumf {z}, {nz} : f32"));
            let half = b.cf32(0.5);
            let one = b.cf32(1.0);
            let hz = b.op(&format!("arith.mulf {az}, {half} : f32"));
            let den = b.op(&format!("arith.addf {one}, {hz} : f32"));
            let t = b.op(&format!("arith.divf {one}, {den} : f32"));
            let coef = [0.170_872_77f32, -0.822_152_23, 1.488_515_87, -1.135_203_98, 0.278_868_07, -0.186_288_06, 0.096_784_18, 0.374_091_96, 1.000_023_68];
            let mut p = b.cf32(coef[0]);
            for c in &coef[1..] {
                let cc = b.cf32(*c);
                p = b.op(&format!("llvm.intr.fma({p}, {t}, {cc}) : (f32, f32, f32) -> f32"));
            }
            let c0 = b.cf32(-1.265_512_23);
            let pt = b.op(&format!("llvm.intr.fma({p}, {t}, {c0}) : (f32, f32, f32) -> f32"));
            let z2 = b.op(&format!("arith.mulf {az}, {az} : f32"));
            let e_in = b.op(&format!("arith.subf {pt}, {z2} : f32"));
            let e = b.exp(&e_in);
            let te = b.op(&format!("arith.mulf {t}, {e} : f32"));
            let y = b.op(&format!("arith.subf {one}, {te} : f32"));
            let neg = b.op(&format!("arith.negf {y} : f32"));
            let zero = b.cf32(0.0);
            let pos = b.op(&format!("arith.cmpf oge, {z}, {zero} : f32"));
            let erf = b.op(&format!("arith.select {pos}, {y}, {neg} : f32"));
            let w = b.op(&format!("arith.addf {one}, {erf} : f32"));
            let hx = b.op(&format!("arith.mulf {x}, {half} : f32"));
            b.op(&format!("arith.mulf {hx}, {w} : f32"))
        }
    })
}

/// The MLIR text of one kernel (a `gpu.func`) with the default [`KernelOptions`], or why it
/// cannot be generated.
pub fn emit(spec: &KernelSpec) -> Result<String, String> {
    emit_for(spec, false)
}

/// As [`emit`]; with `pdl` (sm_90a) the kernel starts with `griddepcontrol.launch_dependents`
/// (the next kernel in the stream may launch now) and `griddepcontrol.wait` (this kernel waits
/// for the previous one to finish and its writes to be visible): launched with programmatic
/// stream serialization, a kernel's launch and block start-up overlap its predecessor.
pub fn emit_for(spec: &KernelSpec, pdl: bool) -> Result<String, String> {
    emit_named(spec, pdl, &spec.symbol(), &KernelOptions::default())
}

/// [`emit_for`] under the symbol `name` (the module's: [`crate::kernel_names`]), the body
/// written as `o` says.
pub fn emit_named(spec: &KernelSpec, pdl: bool, name: &str, o: &KernelOptions) -> Result<String, String> {
    let name = name.to_string();
    let mut b = Body {
        s: String::new(),
        n: 0,
        workgroup: None,
        block_x: None,
        block_y: None,
        pdl,
        waited: false,
        row_gather: false,
        gather_x: false,
        argmax_fold: false,
        norm: None,
        swiglu: false,
        swiglu_pipe: false,
        sum_slices: None,
        act: None,
        split_k: None,
        split_n: None,
        tma: false,
        ws: false,
        flash_wg: false,
        flash_mincta: None,
        attn_o: None,
        copy_y: false,
        attn_o_red: false,
        attn_o_splits: 1,
        qkv_in: None,
        o: *o,
    };
    let params = emit_into(&mut b, spec)?;
    let wg = b.workgroup.as_ref().map(|w| format!(" workgroup({w})")).unwrap_or_default();
    // (the warp-specialized matmul: 384 threads, so ptxas keeps to 168 registers a thread
    // before `setmaxnreg` redistributes them)
    // (the wgmma prefill attention with TMA tiles: ptxas keeps to the registers
    // FLASH_WG_BLOCKS_PER_SM blocks of 128 threads leave — `flash_wg_blocks_per_sm`)
    let mincta = b.flash_mincta;
    let attrs = match (b.ws, mincta) {
        (true, _) => " attributes {known_block_size = array<i32: 384, 1, 1>}".to_string(),
        // (the decode attention with the o projection: its block size, so ptxas keeps the
        // registers 512 threads may have)
        _ if b.attn_o.is_some() || spec.is_fused_mlp() => {
            match spec.launch() {
                // (the fused one-token MLP too: 512 threads with 32 features per block)
                // (`KernelOptions::fused_mincta` 2: blocks of up to 256 threads kept to the
                // registers two per SM leave, so the fused MLP and attention of one-token steps
                // share SMs — the next one's blocks start while the last one's still run)
                Launch::OutputsPerBlock { warps, .. } | Launch::BlockPerRow { warps } => match b.o.fused_mincta.filter(|&m| 32 * warps as usize * m <= 512) {
                    Some(m) => format!(" attributes {{known_block_size = array<i32: {}, 1, 1>, nvvm.minctasm = {m} : i32}}", 32 * warps),
                    None => format!(" attributes {{known_block_size = array<i32: {}, 1, 1>}}", 32 * warps),
                },
                _ => String::new(),
            }
        }
        (false, Some(n)) => format!(" attributes {{known_block_size = array<i32: 128, 1, 1>, nvvm.minctasm = {n} : i32}}"),
        _ => String::new(),
    };
    let prologue = match (pdl, b.waited) {
        (true, false) => {
            "        llvm.inline_asm has_side_effects \"griddepcontrol.launch_dependents;\", \"\" : () -> ()\n        llvm.inline_asm has_side_effects \"griddepcontrol.wait;\", \"~{memory}\" : () -> ()\n"
        }
        (true, true) => "        llvm.inline_asm has_side_effects \"griddepcontrol.launch_dependents;\", \"\" : () -> ()\n",
        _ => "",
    };
    Ok(format!("    gpu.func @{name}({params}){wg} kernel{attrs} {{\n{prologue}{}        gpu.return\n    }}\n", b.s))
}

/// Whether `spec` generates with and without PDL (the sm_90a variant and the others'): what a
/// lowering fold checks before it rewrites a step to a fused kernel.
pub fn emits(spec: &KernelSpec) -> bool {
    emit_for(spec, true).is_ok() && emit_for(spec, false).is_ok()
}

/// Output columns one block of a matmul kernel launched as `launch` covers.
/// Output columns one block of the matmul kernel `spec` covers.
pub fn columns_per_block_of(spec: &KernelSpec) -> Option<usize> {
    columns_per_block(&spec.launch())
}

fn columns_per_block(launch: &Launch) -> Option<usize> {
    match launch {
        Launch::OutputsPerBlock { outputs, .. } => Some(*outputs as usize),
        Launch::WarpPerOutput { warps_per_block } => Some(*warps_per_block as usize),
        Launch::WarpPerTile { warps_per_block } => Some(8 * *warps_per_block as usize),
        Launch::WarpgroupPerTile { n_tile } => Some(*n_tile as usize),
        Launch::Tile { outputs, .. } => Some(*outputs as usize),
        _ => None,
    }
}

/// Whether `inner` can run as a merged matmul of `parts` output columns (see
/// `KernelSpec::MatMulParts`): a plain matmul kernel (no bias or residual) whose blocks each
/// fall inside one part.
pub fn parts_fit(inner: &KernelSpec, parts: &[usize]) -> Result<(), String> {
    let (n, bias, residual) = match inner {
        KernelSpec::MatMul { n, bias, residual, .. }
        | KernelSpec::MatMulFew { n, bias, residual, .. }
        | KernelSpec::MatMulFewX16 { n, bias, residual, .. }
        | KernelSpec::MatMulMma { n, bias, residual, .. }
        | KernelSpec::MatMulWgmma { n, bias, residual, .. }
        | KernelSpec::MatMulPipe { n, bias, residual, .. } => (*n, *bias, *residual),
        other => return Err(format!("{} is not a matmul kernel", other.symbol())),
    };
    if bias || residual {
        return Err("merged matmuls take no bias or residual".into());
    }
    if parts.len() < 2 || parts.iter().sum::<usize>() != n {
        return Err(format!("parts {parts:?} must be two or more and sum to N = {n}"));
    }
    let cols = columns_per_block(&inner.launch()).ok_or("unknown matmul launch")?;
    if let Some(p) = parts.iter().find(|p| *p % cols != 0) {
        return Err(format!("part of {p} columns is not a multiple of the {cols} columns a block of {} covers", inner.symbol()));
    }
    Ok(())
}

/// [`KernelSpec::SplitKReduceNorm`] with a row as one 4-float piece per thread
/// ([`splitk_norm_regs`]): thread t takes columns 4t..4t+3 where 4t < d — g first (before the
/// PDL wait), then the split-K parts (+ the residual) summed and stored as y, the block's sum
/// of squares, and y · inv_rms · g from the registers. The same operations in the same order
/// as the looped kernel, so the same bits.
#[allow(clippy::too_many_arguments)]
fn emit_splitk_norm_regs(b: &mut Body, r: &RowPieces, slice: &str, splits: usize, residual: bool, d: usize, eps: f32, half: Option<bool>, warps: usize) {
    let RowPieces { t, t4, base, zero, c4b, smt, .. } = r;
    let i = b.idx64(t4);
    let dd = b.ci64(d as i64);
    let inrow = b.op(&format!("arith.cmpi slt, {i}, {dd} : i64"));
    let e = b.op(&format!("arith.addi {base}, {i} : i64"));
    let f4 = "f32, f32, f32, f32";
    // g: a weight, not written by the kernel before
    let gr = b.v();
    b.line(&format!("{gr}:4 = scf.if {inrow} -> ({f4}) {{"));
    let wo = b.op(&format!("arith.muli {i}, {c4b} : i64"));
    let gs = b.load_vec("%g", &wo, 4, "f32", 16);
    b.line(&format!("scf.yield {} : {f4}", gs.join(", ")));
    b.line("} else {");
    b.line(&format!("scf.yield {zero}, {zero}, {zero}, {zero} : {f4}"));
    b.line("}");
    if b.pdl && !b.waited {
        b.wait_for_previous();
    }
    // y = the parts' sum (+ res), stored; its squares' sum
    let yr = b.v();
    b.line(&format!("{yr}:5 = scf.if {inrow} -> ({f4}, f32) {{"));
    let (ys, s4) = b.splitk_piece(slice, &e, splits, residual);
    // (as the looped kernel: its accumulator starts at 0 and adds the piece's sum once)
    let a = b.op(&format!("arith.addf {zero}, {s4} : f32"));
    b.line(&format!("scf.yield {}, {a} : {f4}, f32", ys.join(", ")));
    b.line("} else {");
    b.line(&format!("scf.yield {zero}, {zero}, {zero}, {zero}, {zero} : {f4}, f32"));
    b.line("}");
    let total = b.block_sum(&format!("{yr}#4"), t, warps, smt, zero);
    let inv = b.inv_rms(&total, d, eps);
    b.line(&format!("scf.if {inrow} {{"));
    let ys: Vec<String> = (0..4).map(|j| format!("{yr}#{j}")).collect();
    let gs: Vec<String> = (0..4).map(|j| format!("{gr}#{j}")).collect();
    b.store_scaled_piece(&ys, &gs, &inv, &e, "%xn", half.map(|f16| (f16, "%xh")));
    b.line("}");
    // (the row's `scf.if` of open_row_pieces)
    b.line("}");
}

/// [`KernelSpec::SplitKReduceNorm`] in a thread-block cluster of `c` blocks per row (grid x =
/// rows, y = c, clusters along y): block r's thread t takes columns r·d/c + 4t .. + 3 — g
/// before the PDL wait, then the split-K parts (+ the residual) summed and stored as y, the
/// block's sum of squares (warp sums, one partial per warp in shared memory), which thread 0
/// stores into slot r of every block of the cluster (`mapa` + `st.shared::cluster`); past the
/// cluster barrier each thread adds the c partials in rank order (the same total in every
/// block) and writes y · inv_rms · g from its registers (+ the 16-bit copy).
#[allow(clippy::too_many_arguments)]
fn emit_splitk_norm_cluster(b: &mut Body, splits: usize, residual: bool, d: usize, eps: f32, half: Option<bool>, c: usize) -> Result<(), String> {
    let nt = d / 4 / c.max(1);
    if !(2..=8).contains(&c) || d % (128 * c) != 0 || nt > 1024 || !b.pdl {
        return Err(format!("the split-K reduce + RMSNorm in clusters: sm_90a, 2..=8 blocks per row, a whole number of warps of at most 1024 threads per block (D {d}, {c} blocks)"));
    }
    let warps = nt / 32;
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", warps + c);
    b.workgroup = Some(format!("%sm : {smt}"));
    let t = b.op("gpu.thread_id x");
    let row = b.op("gpu.block_id x");
    let rk = b.op("gpu.block_id y");
    let (t64, rowi, rk64) = (b.idx64(&t), b.idx64(&row), b.idx64(&rk));
    let (cd, cw, c4) = (b.ci64(d as i64), b.ci64((d / c) as i64), b.ci64(4));
    let col0 = b.op(&format!("arith.muli {rk64}, {cw} : i64"));
    let t4 = b.op(&format!("arith.muli {t64}, {c4} : i64"));
    let col = b.op(&format!("arith.addi {col0}, {t4} : i64"));
    let base = b.op(&format!("arith.muli {rowi}, {cd} : i64"));
    let e = b.op(&format!("arith.addi {base}, {col} : i64"));
    // (a slice of the partial sums is [rows, d])
    let slice = b.op(&format!("arith.muli %rows, {cd} : i64"));
    // g: a weight, not written by the kernel before
    let wo = b.op(&format!("arith.muli {col}, {c4} : i64"));
    let gs = b.load_vec("%g", &wo, 4, "f32", 16);
    b.wait_for_previous();
    let (ys, s4) = b.splitk_piece(&slice, &e, splits, residual);
    let part = b.warp_sum(&s4);
    let (lane, warp) = b.lane_warp(&t);
    let c0 = b.op("arith.constant 0 : index");
    let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {l0} {{"));
    b.line(&format!("memref.store {part}, %sm[{warp}] : {smt}"));
    b.line("}");
    b.line("gpu.barrier");
    // (thread 0: the block's sum into slot warps + r of every block of the cluster)
    let zero = b.cf32(0.0);
    let t0 = b.op(&format!("arith.cmpi eq, {t}, {c0} : index"));
    b.line(&format!("scf.if {t0} {{"));
    let mut bs = zero.clone();
    for w in 0..warps {
        let wi = b.op(&format!("arith.constant {w} : index"));
        let v = b.op(&format!("memref.load %sm[{wi}] : {smt}"));
        bs = b.op(&format!("arith.addf {bs}, {v} : f32"));
    }
    let cwarps = b.ci64(warps as i64);
    let slot = b.op(&format!("arith.addi {cwarps}, {rk64} : i64"));
    for r in 0..c {
        let cr = b.ci64(r as i64);
        st_cluster(b, &smt, &slot, &cr, &bs);
    }
    b.line("}");
    b.cluster_barrier();
    let mut total = zero.clone();
    for r in 0..c {
        let ri = b.op(&format!("arith.constant {} : index", warps + r));
        let v = b.op(&format!("memref.load %sm[{ri}] : {smt}"));
        total = b.op(&format!("arith.addf {total}, {v} : f32"));
    }
    let inv = b.inv_rms(&total, d, eps);
    b.store_scaled_piece(&ys, &gs, &inv, &e, "%xn", half.map(|f16| (f16, "%xh")));
    Ok(())
}

/// The decode attention ([`KernelSpec::PagedAttention`]; with `split` = (S, min keys), the
/// [`KernelSpec::PagedAttentionSplit`] pass: block (token, head group, s) takes split s of the
/// rows' context and writes their partial softmax states to `%out` instead of the output).
#[allow(clippy::too_many_arguments)]
fn emit_paged_attention(
    b: &mut Body,
    h: usize,
    kvh: usize,
    d: usize,
    bs: usize,
    scale_bits: u32,
    warps: usize,
    keys: usize,
    group: usize,
    kv: DType,
    split: Option<(usize, usize)>,
    rope: Option<(u32, bool)>,
) -> Result<String, String> {
    if rope.is_some() && (split.is_some() || 32 * warps < d || d % 2 != 0) {
        return Err(format!("the decode attention takes RoPE and the cache writes in with one pass and a thread per head-dim element (D {d}, {warps} warps)"));
    }
    if d % 32 != 0 || kvh == 0 || h % kvh != 0 {
        return Err(format!("paged attention needs D a multiple of 32 and H a multiple of KVH (D {d}, H {h}, KVH {kvh})"));
    }
    if !(1..=32).contains(&warps) {
        return Err(format!("paged attention takes 1..=32 warps per block, not {warps}"));
    }
    if !(1..=8).contains(&keys) {
        return Err(format!("paged attention takes 1..=8 keys per warp step, not {keys}"));
    }
    let nk = keys;
    let per = d / 32;
    if group == 0 || (h / kvh) % group != 0 {
        return Err(format!("paged attention takes groups of query heads within one KV head's (H {h}, KVH {kvh}), not {group}"));
    }
    let rep = group;
    // one block per (token, group of `rep` query heads of one KV head) — grid x = tokens, y =
    // H / rep (x the split's parts) —: each K/V row is loaded once for the group (GQA). The
    // block's warps split the context (split-KV) and combine their partial softmax states
    // through shared memory, warp g % WARPS merging head g of the group.
    #[allow(non_snake_case)]
    let WARPS: usize = warps;
    let stride = d + 2;
    // (the o projection folded in: the head's output (D floats) and the last-block flag past
    // the partial states)
    let attn_o = b.attn_o;
    if attn_o.is_some() && (rope.is_none() || split.is_some() || group != 1 || h / kvh < 1) {
        return Err("the o projection folds into the one-token RoPE attention of a head per block".into());
    }
    // (bf16 pools, the one-pass kernels of a block per head: the next warp step's K/V rows are
    // loaded before this step's math, carried through the loop as raw 16-bit vectors. On: 8B
    // b1 3.836 -> 3.796 ms, SmolLM2 shape b1 -0.8%, b32 -1.6%; not for the grouped kernels:
    // their extra registers cost the SmolLM2 shape's b128 a wave (52.4k -> 46.8k tok/s) for
    // +0.8% on the 8B's b128 (bench/results/fusion-2026-11-30-session12.json);
    // `KernelOptions::attn_pipeline`)
    let pipelined = kv == DType::BF16 && per <= 8 && split.is_none() && group == 1 && bs % nk == 0 && b.o.attn_pipeline;
    // (rope (a one-token step), PDL, the pipelined one-pass kernel: the first warp step's K/V
    // rows — earlier positions, written by earlier steps, not by the kernel before — go out
    // before griddepcontrol.wait; a warp whose first step reaches this token's own position
    // loads it again after the cache write below (`short`: takes
    // that position's rows from shared memory). Head dims up to 64: SmolLM2 shape b1 0.377 ->
    // 0.365 ms per step, where the 8B shape's D = 128 kernel lost 0.5% (3.803 -> 3.821 ms;
    // bench/results/attn-early-2026-11-30.json); `KernelOptions::attn_early`)
    let early_d = match b.o.attn_early {
        crate::options::AttnEarly::Off => false,
        crate::options::AttnEarly::All => true,
        crate::options::AttnEarly::UpTo64 => d <= 64,
    };
    let early = pipelined && rope.is_some() && split.is_none() && b.pdl && !b.waited && early_d;
    let o_at = WARPS * rep * stride;
    // (the one-token RoPE kernel, pipelined, first K/V rows before the wait: this token's
    // rotated K row and its V row past the o projection's slots, as f32, for the warp whose
    // first step holds this position — it takes them from here instead of reloading its rows
    // from the pool after the cache write: one L2 round trip fewer on the kernel's path;
    // `KernelOptions::attn_short`)
    let short = b.o.attn_short;
    let new_at = o_at + if attn_o.is_some() { d + 1 } else { 0 };
    // (QkvAttentionO: x and g of the token's row, then the head's q, k and v, past the rest)
    let qkv_in = b.qkv_in;
    let xs_at = new_at + if short && early { 2 * d } else { 0 };
    let (gs_at, qkv_at) = match qkv_in {
        Some((k, _, c)) => {
            if !(b.attn_o_red && rep == 1 && rope.is_some()) || k % 8 != 0 || c == 0 || d % c != 0 || (3 * d / c).div_ceil(WARPS) * c > 32 || k / 4 > 32 * WARPS {
                return Err(format!("the attention computes q, k and v itself in the one-token RoPE attention with the o projection added, a head per block, D / {c} elements per block, at most 32 rows times blocks per warp, K a multiple of 8 (K {k}, D {d}, {WARPS} warps)"));
            }
            (xs_at + k, xs_at + 2 * k)
        }
        None => (xs_at, xs_at),
    };
    // (QkvAttentionO in clusters: the cluster's blocks split the context's keys, and each
    // block's partial softmax state (m, l, acc[D]) goes to every block of the cluster, at
    // parts_at + rank·(D + 2); `KernelOptions::qkv_attn_key_split`)
    let key_split = qkv_in.map(|(_, _, c)| c).filter(|&c| c > 1 && pipelined && split.is_none() && b.o.qkv_attn_key_split);
    let parts_at = qkv_at + if qkv_in.is_some() { 3 * d } else { 0 };
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", parts_at + key_split.map_or(0, |c| c * (d + 2)));
    b.workgroup = Some(format!("%sm : {smt}"));
    let bid = b.op("gpu.block_id x");
    let t = b.idx64(&bid);
    let by = b.op("gpu.block_id y");
    let by = b.idx64(&by);
    let tid = b.op("gpu.thread_id x");
    let (lane_i, warp_i) = b.lane_warp(&tid);
    let lane = b.idx64(&lane_i);
    let hh = b.ci64(h as i64);
    let row0 = b.op(&format!("arith.muli {t}, {hh} : i64"));
    let ok = b.op(&format!("arith.cmpi slt, {row0}, %n : i64"));
    b.line(&format!("scf.if {ok} {{"));
    // (the split: block y = hg · S + s; the o projection's row parts: block y = hg · P + part)
    let osplits = if attn_o.is_some() { b.attn_o_splits } else { 1 };
    let (by, opart) = if osplits > 1 {
        let cp = b.ci64(osplits as i64);
        (b.op(&format!("arith.divui {by}, {cp} : i64")), Some(b.op(&format!("arith.remui {by}, {cp} : i64"))))
    } else {
        (by, None)
    };
    let (hg, sy) = match split {
        None => (by.clone(), None),
        Some((ns, _)) => {
            let cns = b.ci64(ns as i64);
            (b.op(&format!("arith.divui {by}, {cns} : i64")), Some(b.op(&format!("arith.remui {by}, {cns} : i64"))))
        }
    };
    let p = b.load_i32_as_i64("%pos", &t);
    let sq = b.load_i32_as_i64("%seq", &t);
    let dd = b.ci64(d as i64);
    let crep = b.ci64(rep as i64);
    let head0 = b.op(&format!("arith.muli {hg}, {crep} : i64"));
    let cgqa = b.ci64((h / kvh) as i64);
    let kh = b.op(&format!("arith.divui {head0}, {cgqa} : i64"));
    // (QkvAttentionO, before the wait: the warp's rows of W_q, W_k and W_v into L2 and g into
    // shared memory)
    let qkv_pre = match qkv_in {
        Some((k, _, c)) => Some(qkv_prologue(b, k, d, c, WARPS, &head0, &kh, opart.as_deref(), &tid, &warp_i, &lane_i, gs_at, &smt)),
        None => None,
    };
    // the lane's head-dim elements: 32e + lane from an f32 pool (a warp's loads take 128
    // consecutive bytes), lane·per + e from a 16-bit one (one vector load of `per` each)
    let wide = kv == DType::F32;
    let eoff: Vec<String> = (0..per)
        .map(|e| {
            if wide {
                let ce = b.ci64(32 * e as i64);
                b.op(&format!("arith.addi {lane}, {ce} : i64"))
            } else {
                let cp = b.ci64(per as i64);
                let l = b.op(&format!("arith.muli {lane}, {cp} : i64"));
                let ce = b.ci64(e as i64);
                b.op(&format!("arith.addi {l}, {ce} : i64"))
            }
        })
        .collect();
    // key `ju`'s element offset in the pools from `p0`, key `j0`'s, in the same cache block
    let in_block = |b: &mut Body, p0: &str, j0: &str, ju: &str| -> String {
        let krow = b.ci64((kvh * d) as i64);
        let du = b.op(&format!("arith.subi {ju}, {j0} : i64"));
        let o = b.op(&format!("arith.muli {du}, {krow} : i64"));
        b.op(&format!("arith.addi {p0}, {o} : i64"))
    };
    // the raw K and V vectors of the warp step from key `jb` (i64; keys past the context load
    // its last key's row)
    let raw_step = |b: &mut Body, jb: &str, hi: &str| -> Vec<String> {
        let c1 = b.ci64(1);
        let cl = b.op(&format!("arith.subi {hi}, {c1} : i64"));
        let cbs = b.ci64(bs as i64);
        let trow = b.op(&format!("arith.muli {sq}, %mb : i64"));
        let ckvh = b.ci64(kvh as i64);
        let j0 = b.op(&format!("arith.minsi {jb}, {cl} : i64"));
        let p0 = b.paged_key_offset(&j0, &trow, &kh, &cbs, &ckvh, &dd);
        let mut out = vec![];
        for u in 0..nk {
            let cu = b.ci64(u as i64);
            let ju = b.op(&format!("arith.addi {jb}, {cu} : i64"));
            let ju = b.op(&format!("arith.minsi {ju}, {cl} : i64"));
            let kb = in_block(b, &p0, &j0, &ju);
            let o = b.op(&format!("arith.addi {kb}, {} : i64", eoff[0]));
            let c2 = b.ci64(2);
            let by = b.op(&format!("arith.muli {o}, {c2} : i64"));
            for pool in ["%kc", "%vc"] {
                out.push(b.load_vector(pool, &by, per, "i16", 2 * per));
            }
        }
        out
    };
    // (the o projection: this thread's rows j = tid + 32·WARPS·r of W_o's D columns of head
    // h = head0, D/8 16-byte loads each, before the wait where the kernel has one ahead)
    let nthreads = 32 * WARPS;
    let o_rows: Vec<(String, String, Vec<String>, String)> = match attn_o {
        Some(nn) => {
            let tid64 = b.idx64(&tid);
            let hd = b.ci64((h * d) as i64);
            let hoff = b.op(&format!("arith.muli {head0}, {dd} : i64"));
            // (this block's rows: all N, or part `opart` of N / splits)
            let np = nn / osplits;
            let cnp = b.ci64(np as i64);
            let jbase = match &opart {
                Some(op) => b.op(&format!("arith.muli {op}, {cnp} : i64")),
                None => b.ci64(0),
            };
            let clocal = b.ci64(np as i64 - 1);
            let clast = b.ci64(nn as i64 - 1);
            (0..np.div_ceil(nthreads))
                .map(|r| {
                    let cr = b.ci64((r * nthreads) as i64);
                    let jl = b.op(&format!("arith.addi {tid64}, {cr} : i64"));
                    let valid = b.op(&format!("arith.cmpi sle, {jl}, {clocal} : i64"));
                    let j = b.op(&format!("arith.addi {jbase}, {jl} : i64"));
                    let jc = b.op(&format!("arith.minsi {j}, {clast} : i64"));
                    let e0 = b.op(&format!("arith.muli {jc}, {hd} : i64"));
                    let e0 = b.op(&format!("arith.addi {e0}, {hoff} : i64"));
                    // (round 0 only: a second round's rows load in `o_projection`, so 512
                    // threads keep to 128 registers)
                    let vs = (0..if r == 0 { d / 8 } else { 0 })
                        .map(|c8| {
                            let co = b.ci64(8 * c8 as i64);
                            let e = b.op(&format!("arith.addi {e0}, {co} : i64"));
                            let c2b = b.ci64(2);
                            let by = b.op(&format!("arith.muli {e}, {c2b} : i64"));
                            b.load_vector("%wo", &by, 8, "i16", 16)
                        })
                        .collect();
                    (j, valid, vs, e0)
                })
                .collect()
        }
        None => vec![],
    };
    // (key_split: this block's keys [klo, khi) — the context in `c` chunks of whole warp steps,
    // block r of the cluster taking chunk r)
    let key_range = match (key_split, &opart) {
        (Some(c), Some(r)) => {
            let c1 = b.ci64(1);
            let ctxk = b.op(&format!("arith.addi {p}, {c1} : i64"));
            let cm1 = b.ci64((c * nk) as i64 - 1);
            let cdiv = b.ci64((c * nk) as i64);
            let steps = b.op(&format!("arith.addi {ctxk}, {cm1} : i64"));
            let steps = b.op(&format!("arith.divui {steps}, {cdiv} : i64"));
            let cnk = b.ci64(nk as i64);
            let chunk = b.op(&format!("arith.muli {steps}, {cnk} : i64"));
            let klo = b.op(&format!("arith.muli {r}, {chunk} : i64"));
            let khi = b.op(&format!("arith.addi {klo}, {chunk} : i64"));
            let khi = b.op(&format!("arith.minsi {khi}, {ctxk} : i64"));
            Some((klo, khi))
        }
        _ => None,
    };
    let early_first = if early {
        let c1e = b.ci64(1);
        let ctx_e = b.op(&format!("arith.addi {p}, {c1e} : i64"));
        let w64 = b.idx64(&warp_i);
        let cnk = b.ci64(nk as i64);
        let js = b.op(&format!("arith.muli {w64}, {cnk} : i64"));
        let js = match &key_range {
            Some((klo, _)) => b.op(&format!("arith.addi {js}, {klo} : i64")),
            None => js,
        };
        let pre = raw_step(b, &js, &ctx_e);
        b.wait_for_previous();
        Some((js, pre))
    } else {
        None
    };
    // the group's rows (token, head) and their q (pre-scaled), lane's elements 32e + lane
    // (short: loaded and rotated before the cache write below, their L2 round trip beside the
    // K/V rows' instead of after the block barrier)
    let q_rows = |b: &mut Body| -> (Vec<String>, Vec<Vec<String>>) {
        let grow0 = b.op(&format!("arith.addi {row0}, {head0} : i64"));
        let rows: Vec<String> = (0..rep)
            .map(|g| {
                let cg = b.ci64(g as i64);
                b.op(&format!("arith.addi {grow0}, {cg} : i64"))
            })
            .collect();
        let scale = b.cf32(f32::from_bits(scale_bits));
        let mut qv = vec![];
        for row in &rows {
            let qbase = b.op(&format!("arith.muli {row}, {dd} : i64"));
            let mut qg = vec![];
            for eo in &eoff {
                let q = match rope {
                    // (computed above, in shared memory: the head's q at qkv_at)
                    Some((theta_bits, interleaved)) if qkv_in.is_some() => {
                        let c0 = b.ci64(0);
                        b.rope_elem_src(&Src::Shared(&smt, qkv_at), &c0, eo, &p, d, theta_bits, interleaved)
                    }
                    Some((theta_bits, interleaved)) => b.rope_elem("%xq", &qbase, eo, &p, d, theta_bits, interleaved),
                    None => {
                        let o = b.op(&format!("arith.addi {qbase}, {eo} : i64"));
                        b.load("%q", &o)
                    }
                };
                qg.push(b.op(&format!("arith.mulf {q}, {scale} : f32")));
            }
            qv.push(qg);
        }
        (rows, qv)
    };
    if let (Some((k, eps, c)), Some(rows)) = (qkv_in, &qkv_pre) {
        if b.pdl && !b.waited {
            b.wait_for_previous();
        }
        qkv_compute(b, k, eps, c, &t, rows, &tid, &lane_i, xs_at, gs_at, qkv_at, &smt);
    }
    let early_q = (short && rope.is_some()).then(|| q_rows(b));
    // (rope: this token's K row of KV head kh rotated and its V row into the pools at slot[t]
    // first — every block of the KV head writes the same values —, visible to the block after
    // the barrier; a one-token step only: no other token of the step reads them)
    if let Some((theta_bits, interleaved)) = rope {
        let tid64 = b.idx64(&tid);
        let slot = b.load_i32_as_i64("%slots", &t);
        let ckvh = b.ci64(kvh as i64);
        let cd = b.ci64(d as i64);
        let xb = b.op(&format!("arith.muli {t}, {ckvh} : i64"));
        let xb = b.op(&format!("arith.addi {xb}, {kh} : i64"));
        let xb = b.op(&format!("arith.muli {xb}, {cd} : i64"));
        let cb = b.op(&format!("arith.muli {slot}, {ckvh} : i64"));
        let cb = b.op(&format!("arith.addi {cb}, {kh} : i64"));
        let cb = b.op(&format!("arith.muli {cb}, {cd} : i64"));
        let mine = b.op(&format!("arith.cmpi slt, {tid64}, {cd} : i64"));
        b.line(&format!("scf.if {mine} {{"));
        // (QkvAttentionO: k and v from shared memory, at qkv_at + D and + 2·D)
        let (ksrc, vsrc, kvb) = match qkv_in {
            Some(_) => (Src::Shared(&smt, qkv_at + d), Src::Shared(&smt, qkv_at + 2 * d), b.ci64(0)),
            None => (Src::Global("%xk"), Src::Global("%xv"), xb.clone()),
        };
        let y = b.rope_elem_src(&ksrc, &kvb, &tid64, &p, d, theta_bits, interleaved);
        let dst = b.op(&format!("arith.addi {cb}, {tid64} : i64"));
        let src = b.op(&format!("arith.addi {kvb}, {tid64} : i64"));
        // (short: V loaded before K is stored — the pools may alias x for all the compiler
        // knows, so a load after the store waits for it: two L2 round trips in a row)
        let v_first = short.then(|| b.load_src(&vsrc, &src));
        b.store_kv(&y, "%kc", &dst, kv)?;
        let v = match v_first {
            Some(v) => v,
            None => b.load_src(&vsrc, &src),
        };
        b.store_kv(&v, "%vc", &dst, kv)?;
        if short && early {
            // (and into shared memory, for the warp whose first step holds this position)
            for (val, at) in [(&y, new_at), (&v, new_at + d)] {
                let ca = b.op(&format!("arith.constant {at} : index"));
                let i = b.op(&format!("arith.addi {ca}, {tid} : index"));
                b.line(&format!("memref.store {val}, %sm[{i}] : {smt}"));
            }
        }
        b.line("}");
        b.line("gpu.barrier");
    }
    let (rows, qv) = match early_q {
        Some(q) => q,
        None => q_rows(b),
    };
    let c1 = b.ci64(1);
    let ctx = b.op(&format!("arith.addi {p}, {c1} : i64"));
    // the keys [lo, hi) this block takes: all of the context, or with `split` its part s
    // of the se = min(ceil(ctx / min keys), S) parts of ceil(ctx / se) keys; blocks past se
    // do nothing
    let (lo, hi, part) = match (split, &sy) {
        (Some((ns, min_keys)), Some(sy)) => {
            let (se, chunk) = split_extent(b, &ctx, ns, min_keys);
            let lo = b.op(&format!("arith.muli {sy}, {chunk} : i64"));
            let hi = b.op(&format!("arith.addi {lo}, {chunk} : i64"));
            let hi = b.op(&format!("arith.minsi {hi}, {ctx} : i64"));
            let active = b.op(&format!("arith.cmpi slt, {sy}, {se} : i64"));
            b.line(&format!("scf.if {active} {{"));
            (lo, hi, Some((sy.clone(), ns)))
        }
        _ => match &key_range {
            Some((klo, khi)) => (klo.clone(), khi.clone(), None),
            None => (b.ci64(0), ctx.clone(), None),
        },
    };
    let ctxi = b.op(&format!("arith.index_cast {hi} : i64 to index"));
    let wstep = b.op(&format!("arith.constant {WARPS} : index"));
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let zero = b.cf32(0.0);
    let res = b.v();
    let j = b.v();
    // running state per head g: m, l, acc[per] at g·(per + 2)
    let st = per + 2;
    let state: Vec<String> = (0..rep * st).map(|_| b.v()).collect();
    let iter: Vec<String> = state.iter().enumerate().map(|(i, s)| format!("{s} = {}", if i % st == 0 { &ninf } else { &zero })).collect();
    let tys = vec!["f32"; rep * st].join(", ");
    // warp w takes keys nk·w .. nk·w + nk - 1, then the same WARPS·nk further on; the
    // first key of a step is always inside the context (the loop bound), the others
    // past it load the last key's row and count as -inf
    let cnk = b.op(&format!("arith.constant {nk} : index"));
    let jstart = b.op(&format!("arith.muli {warp_i}, {cnk} : index"));
    let loi = b.op(&format!("arith.index_cast {lo} : i64 to index"));
    let jstart = b.op(&format!("arith.addi {jstart}, {loi} : index"));
    let wstep = b.op(&format!("arith.muli {wstep}, {cnk} : index"));
    let vty = format!("vector<{per}xi16>");
    let (iter, tys, raw_args) = if pipelined {
        let js = b.idx64(&jstart);
        let first = match &early_first {
            Some((js_e, pre)) => {
                // (loaded before the wait: again where the warp's first step reaches key p)
                let cl = b.ci64(nk as i64 - 1);
                let last = b.op(&format!("arith.addi {js_e}, {cl} : i64"));
                let mut stale = b.op(&format!("arith.cmpi sge, {last}, {p} : i64"));
                if short {
                    // (only the warp whose first step holds key p: warps past it run no step)
                    let from = b.op(&format!("arith.cmpi sle, {js_e}, {p} : i64"));
                    stale = b.op(&format!("arith.andi {stale}, {from} : i1"));
                }
                let r = b.v();
                let vty1 = format!("vector<{per}xi16>");
                let vtys = vec![vty1.clone(); pre.len()].join(", ");
                b.line(&format!("{r}:{} = scf.if {stale} -> ({vtys}) {{", pre.len()));
                let again = if short {
                    // key p's rows from shared memory (as the pool holds them: bf16 of the
                    // f32 the cache write stored), the step's other keys as loaded before
                    let mut fresh = vec![];
                    for at in [new_at, new_at + d] {
                        let elems: Vec<String> = eoff
                            .iter()
                            .map(|eo| {
                                let ca = b.ci64(at as i64);
                                let i = b.op(&format!("arith.addi {ca}, {eo} : i64"));
                                let i = b.op(&format!("arith.index_cast {i} : i64 to index"));
                                let x = b.op(&format!("memref.load %sm[{i}] : {smt}"));
                                b.op(&format!("llvm.inline_asm \"cvt.rn.bf16.f32 $0, $1;\", \"=h,f\" {x} : (f32) -> i16"))
                            })
                            .collect();
                        fresh.push(b.vector(&elems, "i16"));
                    }
                    let mut out = vec![];
                    for u in 0..nk {
                        let cu = b.ci64(u as i64);
                        let ju = b.op(&format!("arith.addi {js_e}, {cu} : i64"));
                        let here = b.op(&format!("arith.cmpi eq, {ju}, {p} : i64"));
                        for kvi in 0..2 {
                            out.push(b.op(&format!("arith.select {here}, {}, {} : {vty1}", fresh[kvi], pre[2 * u + kvi])));
                        }
                    }
                    out
                } else {
                    raw_step(b, &js, &hi)
                };
                b.line(&format!("scf.yield {} : {vtys}", again.join(", ")));
                b.line("} else {");
                b.line(&format!("scf.yield {} : {vtys}", pre.join(", ")));
                b.line("}");
                (0..pre.len()).map(|i| format!("{r}#{i}")).collect()
            }
            None => raw_step(b, &js, &hi),
        };
        let args: Vec<String> = (0..first.len()).map(|_| b.v()).collect();
        let mut iter = iter;
        iter.extend(args.iter().zip(&first).map(|(a, f)| format!("{a} = {f}")));
        let tys = format!("{tys}{}", format!(", {vty}").repeat(first.len()));
        (iter, tys, args)
    } else {
        (iter, tys, vec![])
    };
    let nres = rep * st + raw_args.len();
    b.line(&format!("{res}:{nres} = scf.for {j} = {jstart} to {ctxi} step {wstep} iter_args({}) -> ({tys}) {{", iter.join(", ")));
    let j64 = b.idx64(&j);
    // (pipelined: the next step's loads go out first)
    let next_raw = if pipelined {
        let ws64 = b.idx64(&wstep);
        let jn = b.op(&format!("arith.addi {j64}, {ws64} : i64"));
        raw_step(b, &jn, &hi)
    } else {
        vec![]
    };
    let cbs = b.ci64(bs as i64);
    let trow = b.op(&format!("arith.muli {sq}, %mb : i64"));
    let ckvh = b.ci64(kvh as i64);
    let clast = b.op(&format!("arith.subi {hi}, {c1} : i64"));
    // (a warp step's keys j .. j + nk - 1 lie in one cache block when j is a multiple of nk
    // — the one-pass kernel's, from key 0 — and nk divides the block size: one block-table
    // lookup per step, the keys' rows kvh·d elements apart; `KernelOptions::attn_one_lookup`)
    let one_lookup = !pipelined && split.is_none() && bs % nk == 0 && b.o.attn_one_lookup;
    let page0 = one_lookup.then(|| b.paged_key_offset(&j64, &trow, &kh, &cbs, &ckvh, &dd));
    // every key's K and V rows first (nk·2·per loads in flight), then the math
    let mut kvrows: Vec<(Vec<String>, Vec<String>, Option<String>)> = vec![];
    for u in 0..nk {
        let cu = b.ci64(u as i64);
        let ju = b.op(&format!("arith.addi {j64}, {cu} : i64"));
        let valid = (u > 0).then(|| b.op(&format!("arith.cmpi slt, {ju}, {hi} : i64")));
        if pipelined {
            // (this step's rows, loaded one step ahead)
            let mut widen = |r: &str| -> Vec<String> {
                (0..per)
                    .map(|e| {
                        let h = b.element(r, e, per, "i16");
                        b.bf16_to_f32(&h)
                    })
                    .collect()
            };
            let (ks, vs) = (widen(&raw_args[2 * u]), widen(&raw_args[2 * u + 1]));
            kvrows.push((ks, vs, valid));
            continue;
        }
        let ju = if u > 0 { b.op(&format!("arith.minsi {ju}, {clast} : i64")) } else { ju };
        let kbase = match &page0 {
            Some(p0) => in_block(b, p0, &j64, &ju),
            None => b.paged_key_offset(&ju, &trow, &kh, &cbs, &ckvh, &dd),
        };
        let (mut ks, mut vs) = (vec![], vec![]);
        if wide {
            for eo in &eoff {
                let o = b.op(&format!("arith.addi {kbase}, {eo} : i64"));
                ks.push(b.load("%kc", &o));
                vs.push(b.load("%vc", &o));
            }
        } else {
            let o = b.op(&format!("arith.addi {kbase}, {} : i64", eoff[0]));
            ks = b.load_kv("%kc", &o, per, kv)?;
            vs = b.load_kv("%vc", &o, per, kv)?;
        }
        kvrows.push((ks, vs, valid));
    }
    // per head: scores (the warp sums of every head's and key's dot products at once), the
    // running max over them, one rescale per step
    let mut dots = vec![];
    for qg in &qv {
        for (ks, _, _) in &kvrows {
            let mut dot = zero.clone();
            for (qe, k) in qg.iter().zip(ks) {
                dot = b.op(&format!("llvm.intr.fma({qe}, {k}, {dot}) : (f32, f32, f32) -> f32"));
            }
            dots.push(dot);
        }
    }
    // ([`Body::warp_sums`]: 32 shuffles instead of 80 for 4 heads x 4 keys)
    let sums = if b.o.attn_transposed_sums {
        let lane32 = b.op(&format!("arith.index_cast {lane_i} : index to i32"));
        b.warp_sums(&dots, &lane32)
    } else {
        dots.iter().map(|d| b.warp_sum(d)).collect()
    };
    let mut outs = vec![];
    for (g, _) in qv.iter().enumerate() {
        let (m, l) = (&state[g * st], &state[g * st + 1]);
        let accs = &state[g * st + 2..(g + 1) * st];
        let mut ss = vec![];
        for (u, (_, _, valid)) in kvrows.iter().enumerate() {
            let s = sums[g * kvrows.len() + u].clone();
            ss.push(match valid {
                Some(v) => b.op(&format!("arith.select {v}, {s}, {ninf} : f32")),
                None => s,
            });
        }
        let mut mn = m.clone();
        for s in &ss {
            mn = b.op(&format!("arith.maximumf {mn}, {s} : f32"));
        }
        let d1 = b.op(&format!("arith.subf {m}, {mn} : f32"));
        let corr = b.exp(&d1);
        let mut l2 = b.op(&format!("arith.mulf {l}, {corr} : f32"));
        let mut outs_acc: Vec<String> = accs.iter().map(|a| b.op(&format!("arith.mulf {a}, {corr} : f32"))).collect();
        for (s, (_, vs, _)) in ss.iter().zip(&kvrows) {
            let d2 = b.op(&format!("arith.subf {s}, {mn} : f32"));
            let pe = b.exp(&d2);
            l2 = b.op(&format!("arith.addf {l2}, {pe} : f32"));
            for (a, v) in outs_acc.iter_mut().zip(vs) {
                *a = b.op(&format!("llvm.intr.fma({pe}, {v}, {a}) : (f32, f32, f32) -> f32"));
            }
        }
        outs.push(mn);
        outs.push(l2);
        outs.extend(outs_acc);
    }
    outs.extend(next_raw);
    b.line(&format!("scf.yield {} : {tys}", outs.join(", ")));
    b.line("}");
    // partial states to shared memory: head g of warp w at (w·rep + g)·stride: m, l, then
    // acc at +2+lane+32e
    let crepi = b.op(&format!("arith.constant {rep} : index"));
    let cst = b.op(&format!("arith.constant {stride} : index"));
    let wrow = b.op(&format!("arith.muli {warp_i}, {crepi} : index"));
    for g in 0..rep {
        let cg = b.op(&format!("arith.constant {g} : index"));
        let slot = b.op(&format!("arith.addi {wrow}, {cg} : index"));
        let wb = b.op(&format!("arith.muli {slot}, {cst} : index"));
        let c1i = b.op("arith.constant 1 : index");
        let c2i = b.op("arith.constant 2 : index");
        let wb1 = b.op(&format!("arith.addi {wb}, {c1i} : index"));
        let wb2 = b.op(&format!("arith.addi {wb}, {c2i} : index"));
        let wbl = b.op(&format!("arith.addi {wb2}, {lane_i} : index"));
        b.line(&format!("memref.store {res}#{}, %sm[{wb}] : {smt}", g * st));
        b.line(&format!("memref.store {res}#{}, %sm[{wb1}] : {smt}", g * st + 1));
        for e in 0..per {
            let ce = b.op(&format!("arith.constant {} : index", 32 * e));
            let i = b.op(&format!("arith.addi {wbl}, {ce} : index"));
            b.line(&format!("memref.store {res}#{}, %sm[{i}] : {smt}", g * st + 2 + e));
        }
    }
    b.line("gpu.barrier");
    // head g merged by warp g % WARPS
    for (g, row) in rows.iter().enumerate() {
        let cw = b.op(&format!("arith.constant {} : index", g % WARPS));
        let mine = b.op(&format!("arith.cmpi eq, {warp_i}, {cw} : index"));
        b.line(&format!("scf.if {mine} {{"));
        let ms: Vec<String> = (0..WARPS)
            .map(|w| {
                let i = b.op(&format!("arith.constant {} : index", (w * rep + g) * stride));
                b.op(&format!("memref.load %sm[{i}] : {smt}"))
            })
            .collect();
        let mut mx = ms[0].clone();
        for m_w in &ms[1..] {
            mx = b.op(&format!("arith.maximumf {mx}, {m_w} : f32"));
        }
        let mut lsum = zero.clone();
        let mut wts = vec![];
        for (w, m_w) in ms.iter().enumerate() {
            let dm = b.op(&format!("arith.subf {m_w}, {mx} : f32"));
            let f = b.exp(&dm);
            let i = b.op(&format!("arith.constant {} : index", (w * rep + g) * stride + 1));
            let l_w = b.op(&format!("memref.load %sm[{i}] : {smt}"));
            lsum = b.op(&format!("llvm.intr.fma({l_w}, {f}, {lsum}) : (f32, f32, f32) -> f32"));
            wts.push(f);
        }
        let qbase = b.op(&format!("arith.muli {row}, {dd} : i64"));
        for e in 0..per {
            let mut acc = zero.clone();
            for (w, f) in wts.iter().enumerate() {
                let base = b.op(&format!("arith.constant {} : index", (w * rep + g) * stride + 2 + 32 * e));
                let i = b.op(&format!("arith.addi {base}, {lane_i} : index"));
                let a_w = b.op(&format!("memref.load %sm[{i}] : {smt}"));
                acc = b.op(&format!("llvm.intr.fma({a_w}, {f}, {acc}) : (f32, f32, f32) -> f32"));
            }
            let ce = &eoff[e];
            match &part {
                None if key_split.is_some() => {
                    // (this block's partial state into every block of the cluster: acc not
                    // divided by l; lane 0 also m and l)
                    let c = key_split.expect("matched");
                    let r = opart.clone().expect("a cluster's blocks are the o projection's parts");
                    let cst2 = b.ci64((d + 2) as i64);
                    let mine_at = b.op(&format!("arith.muli {r}, {cst2} : i64"));
                    let cpa = b.ci64(parts_at as i64);
                    let mine_at = b.op(&format!("arith.addi {mine_at}, {cpa} : i64"));
                    let c2 = b.ci64(2);
                    let at = b.op(&format!("arith.addi {mine_at}, {c2} : i64"));
                    let at = b.op(&format!("arith.addi {at}, {ce} : i64"));
                    for dst in 0..c {
                        let cd = b.ci64(dst as i64);
                        st_cluster(b, &smt, &at, &cd, &acc);
                    }
                    if e == 0 {
                        let c0 = b.op("arith.constant 0 : index");
                        let first = b.op(&format!("arith.cmpi eq, {lane_i}, {c0} : index"));
                        b.line(&format!("scf.if {first} {{"));
                        let c1m = b.ci64(1);
                        let at1 = b.op(&format!("arith.addi {mine_at}, {c1m} : i64"));
                        for dst in 0..c {
                            let cd = b.ci64(dst as i64);
                            st_cluster(b, &smt, &mine_at, &cd, &mx);
                            st_cluster(b, &smt, &at1, &cd, &lsum);
                        }
                        b.line("}");
                    }
                }
                None if attn_o.is_some() => {
                    // (the head's output to shared memory, for the o projection below)
                    let y = b.op(&format!("arith.divf {acc}, {lsum} : f32"));
                    let cb = b.ci64(o_at as i64);
                    let i = b.op(&format!("arith.addi {cb}, {ce} : i64"));
                    let i = b.op(&format!("arith.index_cast {i} : i64 to index"));
                    b.line(&format!("memref.store {y}, %sm[{i}] : {smt}"));
                }
                None => {
                    let o = b.op(&format!("arith.addi {qbase}, {ce} : i64"));
                    let y = b.op(&format!("arith.divf {acc}, {lsum} : f32"));
                    b.store(&y, "%out", &o);
                }
                Some((sy, ns)) => {
                    // partial state of (row, s) at ((row·S + s)·(D + 2)): m, l, acc[D] (not
                    // divided by l)
                    let cns = b.ci64(*ns as i64);
                    let slot = b.op(&format!("arith.muli {row}, {cns} : i64"));
                    let slot = b.op(&format!("arith.addi {slot}, {sy} : i64"));
                    let cst = b.ci64(stride as i64);
                    let pb = b.op(&format!("arith.muli {slot}, {cst} : i64"));
                    if e == 0 {
                        b.store(&mx, "%out", &pb);
                        let pb1 = b.op(&format!("arith.addi {pb}, {c1} : i64"));
                        b.store(&lsum, "%out", &pb1);
                    }
                    let c2 = b.ci64(2);
                    let o = b.op(&format!("arith.addi {pb}, {c2} : i64"));
                    let o = b.op(&format!("arith.addi {o}, {ce} : i64"));
                    b.store(&acc, "%out", &o);
                }
            }
        }
        b.line("}");
    }
    if let Some(c) = key_split {
        // every block's state in, then thread e < D: the head's output element e from the c
        // partial states (their max, each scaled by exp(m_r - max)), for the o projection
        b.cluster_barrier();
        let tid64 = b.idx64(&tid);
        let cd = b.ci64(d as i64);
        let mine = b.op(&format!("arith.cmpi slt, {tid64}, {cd} : i64"));
        b.line(&format!("scf.if {mine} {{"));
        let read = |b: &mut Body, at: usize, off: Option<&str>| -> String {
            let ca = b.ci64(at as i64);
            let j = match off {
                Some(o) => b.op(&format!("arith.addi {ca}, {o} : i64")),
                None => ca,
            };
            let j = b.op(&format!("arith.index_cast {j} : i64 to index"));
            b.op(&format!("memref.load %sm[{j}] : {smt}"))
        };
        let ms: Vec<String> = (0..c).map(|r| read(b, parts_at + r * (d + 2), None)).collect();
        let mut mx = ms[0].clone();
        for m in &ms[1..] {
            mx = b.op(&format!("arith.maximumf {mx}, {m} : f32"));
        }
        let zero = b.cf32(0.0);
        let (mut num, mut den) = (zero.clone(), zero);
        // (a block past the context's last chunk has no keys: m = -inf and its l and acc are
        // not numbers — left out)
        let ninf = b.op("arith.constant 0xFF800000 : f32");
        for (r, m) in ms.iter().enumerate() {
            let dm = b.op(&format!("arith.subf {m}, {mx} : f32"));
            let w = b.exp(&dm);
            let l = read(b, parts_at + r * (d + 2) + 1, None);
            let a = read(b, parts_at + r * (d + 2) + 2, Some(&tid64));
            let empty = b.op(&format!("arith.cmpf oeq, {m}, {ninf} : f32"));
            let den2 = b.op(&format!("llvm.intr.fma({l}, {w}, {den}) : (f32, f32, f32) -> f32"));
            let num2 = b.op(&format!("llvm.intr.fma({a}, {w}, {num}) : (f32, f32, f32) -> f32"));
            den = b.op(&format!("arith.select {empty}, {den}, {den2} : f32"));
            num = b.op(&format!("arith.select {empty}, {num}, {num2} : f32"));
        }
        let y = b.op(&format!("arith.divf {num}, {den} : f32"));
        let cb = b.ci64(o_at as i64);
        let i = b.op(&format!("arith.addi {cb}, {tid64} : i64"));
        let i = b.op(&format!("arith.index_cast {i} : i64 to index"));
        b.line(&format!("memref.store {y}, %sm[{i}] : {smt}"));
        b.line("}");
    }
    if let Some(nn) = attn_o {
        o_projection(b, nn, h, d, &t, &head0, &tid, &o_rows, o_at, &smt)?;
    }
    if part.is_some() {
        b.line("}");
    }
    b.line("}");
    if attn_o.is_some() && b.attn_o_red {
        return Ok("%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %wo: !llvm.ptr<1>, %res: !llvm.ptr<1>, %out2: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64".into());
    }
    if attn_o.is_some() {
        return Ok("%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %wo: !llvm.ptr<1>, %res: !llvm.ptr<1>, %parts: !llvm.ptr<1>, %sync: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64".into());
    }
    Ok(if rope.is_some() {
        "%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64"
    } else {
        "%q: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64"
    }
    .into())
}

/// Where a row of values is read from: a global pointer, or the kernel's shared memory `%sm`
/// (its memref type) from an element offset.
enum Src<'a> {
    Global(&'a str),
    Shared(&'a str, usize),
}

/// A row of W_q, W_k or W_v a warp of [`KernelSpec::QkvAttentionO`] computes: its first byte
/// (a global pointer), its place in the head's q, k and v in shared memory (m·D + e, i64),
/// whether the warp has it (a warp past the block's rows: None = always), and its 16-byte
/// words per round of the lane's pieces of K where they were loaded before the wait.
struct QkvRow {
    ptr: String,
    at: String,
    valid: Option<String>,
    words: Option<Vec<Vec<String>>>,
}

/// The lane's 16-byte pieces of a K-long bf16 row, l, l + 32, ...: their indices (clamped to
/// the last piece) and, for a partial last round, whether the piece is real.
fn lane_pieces(b: &mut Body, k: usize, lane_i: &str) -> (Vec<String>, Vec<Option<String>>) {
    let units = k / 8;
    let lane64 = b.idx64(lane_i);
    let last = b.ci64(units as i64 - 1);
    let mut uoff = vec![];
    let mut valid = vec![];
    for r in 0..units.div_ceil(32) {
        let cr = b.ci64(32 * r as i64);
        let u = b.op(&format!("arith.addi {lane64}, {cr} : i64"));
        valid.push((units % 32 != 0 && r == units.div_ceil(32) - 1).then(|| b.op(&format!("arith.cmpi sle, {u}, {last} : i64"))));
        uoff.push(b.op(&format!("arith.minsi {u}, {last} : i64")));
    }
    (uoff, valid)
}

/// A bf16 row's 16-byte pieces at `uoff` (piece indices, i64) from `ptr`: 4 words each.
fn row_words(b: &mut Body, ptr: &str, uoff: &[String]) -> Vec<Vec<String>> {
    let c16 = b.ci64(16);
    uoff.iter()
        .map(|u| {
            let o = b.op(&format!("arith.muli {u}, {c16} : i64"));
            b.load_vec(ptr, &o, 4, "i32", 16)
        })
        .collect()
}

/// [`KernelSpec::QkvAttentionO`] before `griddepcontrol.wait`: the block of rank r in its
/// cluster of `c` (`opart`; one block computing all where `c` is 1) takes the head's elements
/// [r·D/c, (r+1)·D/c) of q (head `head0`), k and v (KV head `kh`): 3·D/c rows, row
/// j = m·D/c + e' (m: q, k, v) to warp j mod warps. Where a warp has at most three rows (sm_90a,
/// the kernel may start before the previous one ends) their weights are loaded here, into
/// registers; threads t < K/4 put g's floats 4t .. 4t + 3 into shared memory at `gs_at`.
#[allow(clippy::too_many_arguments)]
fn qkv_prologue(b: &mut Body, k: usize, d: usize, c: usize, warps: usize, head0: &str, kh: &str, opart: Option<&str>, tid: &str, warp_i: &str, lane_i: &str, gs_at: usize, smt: &str) -> Vec<QkvRow> {
    let per = d / c;
    let nrows = 3 * per;
    let rpw = nrows.div_ceil(warps);
    let e_blk = match opart {
        Some(op) if c > 1 => {
            let cper = b.ci64(per as i64);
            b.op(&format!("arith.muli {op}, {cper} : i64"))
        }
        _ => b.ci64(0),
    };
    let w64 = b.idx64(warp_i);
    let dd = b.ci64(d as i64);
    let q0 = b.op(&format!("arith.muli {head0}, {dd} : i64"));
    let k0 = b.op(&format!("arith.muli {kh}, {dd} : i64"));
    let rowb = b.ci64(2 * k as i64);
    let (cper, clast, c0, c1) = (b.ci64(per as i64), b.ci64(nrows as i64 - 1), b.ci64(0), b.ci64(1));
    let preload = b.pdl && rpw <= 3;
    let (uoff, _) = lane_pieces(b, k, lane_i);
    let c16 = b.ci64(16);
    let mut rows = vec![];
    for i in 0..rpw {
        let ci = b.ci64((i * warps) as i64);
        let j = b.op(&format!("arith.addi {w64}, {ci} : i64"));
        let valid = ((i + 1) * warps > nrows).then(|| b.op(&format!("arith.cmpi sle, {j}, {clast} : i64")));
        let j = b.op(&format!("arith.minsi {j}, {clast} : i64"));
        let m = b.op(&format!("arith.divui {j}, {cper} : i64"));
        let el = b.op(&format!("arith.remui {j}, {cper} : i64"));
        let e = b.op(&format!("arith.addi {e_blk}, {el} : i64"));
        let is_q = b.op(&format!("arith.cmpi eq, {m}, {c0} : i64"));
        let is_k = b.op(&format!("arith.cmpi eq, {m}, {c1} : i64"));
        let base = b.op(&format!("arith.select {is_k}, %wk, %wv : !llvm.ptr<1>"));
        let base = b.op(&format!("arith.select {is_q}, %wq, {base} : !llvm.ptr<1>"));
        let r0 = b.op(&format!("arith.select {is_q}, {q0}, {k0} : i64"));
        let r = b.op(&format!("arith.addi {r0}, {e} : i64"));
        let off = b.op(&format!("arith.muli {r}, {rowb} : i64"));
        let ptr = b.op(&format!("llvm.getelementptr {base}[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
        let md = b.op(&format!("arith.muli {m}, {dd} : i64"));
        let at = b.op(&format!("arith.addi {md}, {e} : i64"));
        let words = preload.then(|| row_words(b, &ptr, &uoff));
        rows.push(QkvRow { ptr, at, valid, words });
    }
    let t64 = b.idx64(tid);
    let cq = b.ci64((k / 4) as i64);
    let mine = b.op(&format!("arith.cmpi slt, {t64}, {cq} : i64"));
    b.line(&format!("scf.if {mine} {{"));
    let off = b.op(&format!("arith.muli {t64}, {c16} : i64"));
    let gv = b.load_f32s("%g", &off, 4);
    store_quad(b, &gv, gs_at, k, &t64, smt);
    b.line("}");
    rows
}

/// `val` (f32) into element `at` (i64) of the shared memory `%sm` of the cluster's block of
/// rank `rank` (i64): `mapa` of this block's address, then `st.shared::cluster` (visible to
/// that block past a cluster barrier with release / acquire).
fn st_cluster(b: &mut Body, smt: &str, at: &str, rank: &str, val: &str) {
    let base = b.op(&format!("memref.extract_aligned_pointer_as_index %sm : {smt} -> index"));
    let base = b.idx64(&base);
    let c4 = b.ci64(4);
    let by = b.op(&format!("arith.muli {at}, {c4} : i64"));
    let addr = b.op(&format!("arith.addi {base}, {by} : i64"));
    let r32 = b.op(&format!("arith.trunci {rank} : i64 to i32"));
    let remote = b.op(&format!("llvm.inline_asm \"mapa.shared::cluster.u64 $0, $1, $2;\", \"=l,l,r\" {addr}, {r32} : (i64, i32) -> i64"));
    b.line(&format!("llvm.inline_asm has_side_effects \"st.shared::cluster.f32 [$0], $1;\", \"l,f\" {remote}, {val} : (i64, f32) -> ()"));
}

/// A K-long row's floats 4·t .. 4·t + 3 into shared memory `%sm` from `at`, element e at
/// at + (e mod 8)·K/8 + e / 8: the reads of [`qkv_compute`] (lane l: elements 8l + q) then hit
/// consecutive words, no bank conflicts.
fn store_quad(b: &mut Body, v: &[String], at: usize, k: usize, t64: &str, smt: &str) {
    let c2 = b.ci64(2);
    let u = b.op(&format!("arith.divui {t64}, {c2} : i64"));
    let odd = b.op(&format!("arith.remui {t64}, {c2} : i64"));
    let cq = b.ci64((4 * (k / 8)) as i64);
    let q0 = b.op(&format!("arith.muli {odd}, {cq} : i64"));
    let base = b.op(&format!("arith.addi {q0}, {u} : i64"));
    for (i, x) in v.iter().enumerate() {
        let ci = b.ci64((at + i * (k / 8)) as i64);
        let j = b.op(&format!("arith.addi {base}, {ci} : i64"));
        let j = b.op(&format!("arith.index_cast {j} : i64 to index"));
        b.line(&format!("memref.store {x}, %sm[{j}] : {smt}"));
    }
}

/// [`KernelSpec::QkvAttentionO`] after `griddepcontrol.wait`: x's row `t` into shared memory
/// at `xs_at` (threads t < K/4), each warp's rows ([`qkv_prologue`]) over the whole of K —
/// the lane's 16-byte pieces l, l + 32, .. of a row, three rows at a time (their weights
/// loaded here where the prologue did not) — times x·g, the warp's sum of x² with them (so
/// each warp has the RMSNorm's scale itself); then lane i·c + r stores the warp's value i into
/// the shared memory of the cluster's block r (`mapa`, then `st.shared::cluster`) at qkv_at +
/// m·D + e and every thread passes the cluster barrier (release / acquire: the stores are
/// visible past it); without a cluster (c = 1) plain stores and a block barrier.
#[allow(clippy::too_many_arguments)]
fn qkv_compute(b: &mut Body, k: usize, eps: f32, c: usize, t: &str, rows: &[QkvRow], tid: &str, lane_i: &str, xs_at: usize, gs_at: usize, qkv_at: usize, smt: &str) {
    let t64 = b.idx64(tid);
    let cq = b.ci64((k / 4) as i64);
    let c16 = b.ci64(16);
    let mine = b.op(&format!("arith.cmpi slt, {t64}, {cq} : i64"));
    b.line(&format!("scf.if {mine} {{"));
    let xrow = b.ci64((k * 4) as i64);
    let xb = b.op(&format!("arith.muli {t}, {xrow} : i64"));
    let off = b.op(&format!("arith.muli {t64}, {c16} : i64"));
    let off = b.op(&format!("arith.addi {xb}, {off} : i64"));
    let xv = b.load_f32s("%x", &off, 4);
    store_quad(b, &xv, xs_at, k, &t64, smt);
    b.line("}");
    let (uoff, valid) = lane_pieces(b, k, lane_i);
    let rounds = uoff.len();
    let zero = b.cf32(0.0);
    let mut acc: Vec<String> = vec![];
    let mut ss = zero.clone();
    for (ci, chunk) in rows.chunks(3).enumerate() {
        // (the chunk's weights first where the prologue did not load them: 4 words per row
        // and round in flight)
        let words: Vec<Vec<Vec<String>>> = chunk.iter().map(|row| row.words.clone().unwrap_or_else(|| row_words(b, &row.ptr, &uoff))).collect();
        if ci == 0 {
            b.line("gpu.barrier");
        }
        let mut cacc = vec![zero.clone(); chunk.len()];
        for r in 0..rounds {
            let mut xg = vec![];
            for q in 0..8 {
                // (element 8u + q at q·K/8 + u: see store_quad)
                let read = |b: &mut Body, at: usize| -> String {
                    let ca = b.ci64((at + q * (k / 8)) as i64);
                    let j = b.op(&format!("arith.addi {}, {ca} : i64", uoff[r]));
                    let j = b.op(&format!("arith.index_cast {j} : i64 to index"));
                    b.op(&format!("memref.load %sm[{j}] : {smt}"))
                };
                let mut x = read(b, xs_at);
                if let Some(ok) = &valid[r] {
                    x = b.op(&format!("arith.select {ok}, {x}, {zero} : f32"));
                }
                let g = read(b, gs_at);
                if ci == 0 {
                    ss = b.op(&format!("llvm.intr.fma({x}, {x}, {ss}) : (f32, f32, f32) -> f32"));
                }
                xg.push(b.op(&format!("arith.mulf {x}, {g} : f32")));
            }
            for (a, w) in cacc.iter_mut().zip(&words) {
                *a = b.fma_bf16_words(a, &w[r], &xg);
            }
        }
        acc.extend(cacc);
    }
    let lane32 = b.op(&format!("arith.index_cast {lane_i} : index to i32"));
    let n = acc.len();
    acc.push(ss);
    let sums = b.warp_sums(&acc, &lane32);
    let inv = b.inv_rms(&sums[n], k, eps);
    let vals: Vec<String> = sums[..n].iter().map(|s| b.op(&format!("arith.mulf {s}, {inv} : f32"))).collect();
    // lane i·c + r: the warp's value i into block r's shared memory (where the warp has row i)
    let lane64 = b.idx64(lane_i);
    let cc = b.ci64(c as i64);
    let i = b.op(&format!("arith.divui {lane64}, {cc} : i64"));
    let r = b.op(&format!("arith.remui {lane64}, {cc} : i64"));
    let cn = b.ci64((n * c) as i64);
    let mut ok = b.op(&format!("arith.cmpi slt, {lane64}, {cn} : i64"));
    let mut val = vals[0].clone();
    let mut dst = rows[0].at.clone();
    let mut has = rows[0].valid.clone();
    for (j, row) in rows.iter().enumerate().skip(1) {
        let cj = b.ci64(j as i64);
        let is = b.op(&format!("arith.cmpi eq, {i}, {cj} : i64"));
        val = b.op(&format!("arith.select {is}, {}, {val} : f32", vals[j]));
        dst = b.op(&format!("arith.select {is}, {}, {dst} : i64", row.at));
        if let Some(v) = &row.valid {
            let t1 = b.op("arith.constant true");
            let prev = has.clone().unwrap_or(t1);
            has = Some(b.op(&format!("arith.select {is}, {v}, {prev} : i1")));
        }
    }
    if let Some(h) = has {
        ok = b.op(&format!("arith.andi {ok}, {h} : i1"));
    }
    let cq0 = b.ci64(qkv_at as i64);
    let dst = b.op(&format!("arith.addi {cq0}, {dst} : i64"));
    b.line(&format!("scf.if {ok} {{"));
    if c > 1 {
        st_cluster(b, smt, &dst, &r, &val);
    } else {
        let j = b.op(&format!("arith.index_cast {dst} : i64 to index"));
        b.line(&format!("memref.store {val}, %sm[{j}] : {smt}"));
    }
    b.line("}");
    if c > 1 {
        b.cluster_barrier();
    } else {
        b.line("gpu.barrier");
    }
}

/// Where a thread's argmax pieces lie: the row's first element `base`, the thread's first
/// 16-byte piece `j0`, the first piece past its share `bound` (i64 values), and the constants
/// 0, 4 (i64), -inf (f32) and i32::MAX the kernel already has.
struct ArgmaxRow<'a> {
    base: &'a str,
    j0: &'a str,
    bound: &'a str,
    z: &'a str,
    c4: &'a str,
    ninf: &'a str,
    big: &'a str,
}

/// A thread's (max, first index) over its `loads` 16-byte pieces j0 + k·nt of a row, all
/// loads issued before the compares (a piece at or past the bound reads piece 0 and compares
/// as -inf; i32::MAX where nothing is above -inf).
fn argmax_pieces(b: &mut Body, r: &ArgmaxRow, loads: usize, nt: usize) -> (String, String) {
    argmax_pieces_from(b, r, loads, nt, r.ninf, r.big)
}

/// [`argmax_pieces`] continuing from (v0, i0), the thread's result so far.
fn argmax_pieces_from(b: &mut Body, r: &ArgmaxRow, loads: usize, nt: usize, v0: &str, i0: &str) -> (String, String) {
    let ArgmaxRow { base, j0, bound, z, c4, ninf, .. } = *r;
    let mut pieces = vec![];
    for k in 0..loads {
        let ck = b.ci64((k * nt) as i64);
        let j = b.op(&format!("arith.addi {j0}, {ck} : i64"));
        let valid = b.op(&format!("arith.cmpi slt, {j}, {bound} : i64"));
        let jc = b.op(&format!("arith.select {valid}, {j}, {z} : i64"));
        let e = b.op(&format!("arith.muli {jc}, {c4} : i64"));
        let e = b.op(&format!("arith.addi {base}, {e} : i64"));
        let off = b.op(&format!("arith.muli {e}, {c4} : i64"));
        let xs = b.load_vec("%x", &off, 4, "f32", 16);
        pieces.push((j, valid, xs));
    }
    let (mut v, mut i) = (v0.to_string(), i0.to_string());
    for (j, valid, xs) in pieces {
        let j4 = b.op(&format!("arith.muli {j}, {c4} : i64"));
        for (q, x) in xs.iter().enumerate() {
            let x = b.op(&format!("arith.select {valid}, {x}, {ninf} : f32"));
            let cq = b.ci64(q as i64);
            let e = b.op(&format!("arith.addi {j4}, {cq} : i64"));
            let e = b.op(&format!("arith.trunci {e} : i64 to i32"));
            (v, i) = argmax_keep(b, &v, &i, &x, &e);
        }
    }
    (v, i)
}

/// The row's index from its lanes' (max, index) pairs (lanes without one, `has` false, taking
/// -inf and i32::MAX): the warp's argmax, 0 where nothing is above -inf (as the host argmax).
fn argmax_settle(b: &mut Body, v: &str, i: &str, has: Option<&str>, ninf: &str, big: &str) -> String {
    let (v, i) = match has {
        Some(h) => (b.op(&format!("arith.select {h}, {v}, {ninf} : f32")), b.op(&format!("arith.select {h}, {i}, {big} : i32"))),
        None => (v.to_string(), i.to_string()),
    };
    let (_, fi) = b.warp_argmax(&v, &i);
    let none = b.op(&format!("arith.cmpi eq, {fi}, {big} : i32"));
    let zi = b.op("arith.constant 0 : i32");
    b.op(&format!("arith.select {none}, {zi}, {fi} : i32"))
}

/// Each warp's (max, first index) of the threads' (v, i) into `%redv` / `%redi` (of types
/// `smv` / `smi`) at the warp's slot, then a block barrier. Returns (lane, warp, index 0).
fn argmax_warps_to_shared(b: &mut Body, v: &str, i: &str, t: &str, smv: &str, smi: &str) -> (String, String, String) {
    let (wv, wi) = b.warp_argmax(v, i);
    let (lane, warp) = b.lane_warp(t);
    let c0 = b.op("arith.constant 0 : index");
    let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {l0} {{"));
    b.line(&format!("memref.store {wv}, %redv[{warp}] : {smv}"));
    b.line(&format!("memref.store {wi}, %redi[{warp}] : {smi}"));
    b.line("}");
    b.line("gpu.barrier");
    (lane, warp, c0)
}

/// (v, i) and a candidate (x, e) of a higher index: x where strictly greater (the first
/// maximum kept, as elements come in increasing index order).
fn argmax_keep(b: &mut Body, v: &str, i: &str, x: &str, e: &str) -> (String, String) {
    let gt = b.op(&format!("arith.cmpf ogt, {x}, {v} : f32"));
    (b.op(&format!("arith.select {gt}, {x}, {v} : f32")), b.op(&format!("arith.select {gt}, {e}, {i} : i32")))
}

/// (v, i) and a partial (pv, pi): the larger value, the lower index on ties.
fn argmax_take(b: &mut Body, v: &str, i: &str, pv: &str, pi: &str) -> (String, String) {
    let gt = b.op(&format!("arith.cmpf ogt, {pv}, {v} : f32"));
    let eq = b.op(&format!("arith.cmpf oeq, {pv}, {v} : f32"));
    let lt = b.op(&format!("arith.cmpi slt, {pi}, {i} : i32"));
    let tie = b.op(&format!("arith.andi {eq}, {lt} : i1"));
    let take = b.op(&format!("arith.ori {gt}, {tie} : i1"));
    (b.op(&format!("arith.select {take}, {pv}, {v} : f32")), b.op(&format!("arith.select {take}, {pi}, {i} : i32")))
}

/// [`KernelSpec::ArgmaxCluster`]: block (row, r) takes the row's 16-byte pieces
/// [r·P, (r+1)·P) (P = ceil(D/4 / blocks), all its loads issued before the compares), reduces
/// (max, first index) over the block, thread 0 stores it into block 0's shared memory (slot r,
/// the index's bits as f32), a cluster barrier, then block 0's warp 0 reduces the blocks'
/// partials (ties by index) and writes y[row] (0 for a row with nothing above -inf).
fn emit_argmax_cluster(b: &mut Body, d: usize, blocks: usize) -> Result<(), String> {
    if d % 4 != 0 || !(2..=8).contains(&blocks) || !b.pdl {
        return Err(format!("the cluster argmax: sm_90a, D a multiple of 4 and 2..=8 blocks (D {d}, {blocks})"));
    }
    let warps = ARGMAX_CLUSTER_WARPS;
    let nt = 32 * warps;
    let nvec = d / 4;
    let per = nvec.div_ceil(blocks);
    let loads = per.div_ceil(nt);
    if loads > 16 {
        return Err(format!("the cluster argmax: {loads} 16-byte loads per thread (at most 16)"));
    }
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", 2 * warps + 2 * blocks);
    b.workgroup = Some(format!("%sm : {smt}"));
    let t = b.op("gpu.thread_id x");
    let row = b.op("gpu.block_id x");
    let rk = b.op("gpu.block_id y");
    let (t64, rowi, rk64) = (b.idx64(&t), b.idx64(&row), b.idx64(&rk));
    let cd = b.ci64(d as i64);
    let base = b.op(&format!("arith.muli {rowi}, {cd} : i64"));
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let big = b.op("arith.constant 2147483647 : i32");
    let (z, c4) = (b.ci64(0), b.ci64(4));
    let cper = b.ci64(per as i64);
    let first = b.op(&format!("arith.muli {rk64}, {cper} : i64"));
    let end = b.op(&format!("arith.addi {first}, {cper} : i64"));
    let cnv = b.ci64(nvec as i64);
    let end = b.op(&format!("arith.minsi {end}, {cnv} : i64"));
    let j0 = b.op(&format!("arith.addi {first}, {t64} : i64"));
    let (v, i) = argmax_pieces(b, &ArgmaxRow { base: &base, j0: &j0, bound: &end, z: &z, c4: &c4, ninf: &ninf, big: &big }, loads, nt);
    let (wv, wi) = b.warp_argmax(&v, &i);
    let (lane, warp) = b.lane_warp(&t);
    let c0 = b.op("arith.constant 0 : index");
    let c2i = b.op("arith.constant 2 : index");
    let c1i = b.op("arith.constant 1 : index");
    let l0 = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
    b.line(&format!("scf.if {l0} {{"));
    let at = b.op(&format!("arith.muli {warp}, {c2i} : index"));
    let at1 = b.op(&format!("arith.addi {at}, {c1i} : index"));
    let wif = b.op(&format!("arith.bitcast {wi} : i32 to f32"));
    b.line(&format!("memref.store {wv}, %sm[{at}] : {smt}"));
    b.line(&format!("memref.store {wif}, %sm[{at1}] : {smt}"));
    b.line("}");
    b.line("gpu.barrier");
    // (thread 0: the block's partial into block 0's slots 2·warps + 2r, + 1)
    let t0 = b.op(&format!("arith.cmpi eq, {t}, {c0} : index"));
    b.line(&format!("scf.if {t0} {{"));
    let (mut bv, mut bi) = (ninf.clone(), big.clone());
    for w in 0..warps {
        let cw = b.op(&format!("arith.constant {} : index", 2 * w));
        let cw1 = b.op(&format!("arith.constant {} : index", 2 * w + 1));
        let pv = b.op(&format!("memref.load %sm[{cw}] : {smt}"));
        let pif = b.op(&format!("memref.load %sm[{cw1}] : {smt}"));
        let pi = b.op(&format!("arith.bitcast {pif} : f32 to i32"));
        // (warps hold interleaved pieces: ties by index)
        (bv, bi) = argmax_take(b, &bv, &bi, &pv, &pi);
    }
    let cw2 = b.ci64(2 * warps as i64);
    let c2 = b.ci64(2);
    let slot = b.op(&format!("arith.muli {rk64}, {c2} : i64"));
    let slot = b.op(&format!("arith.addi {slot}, {cw2} : i64"));
    let c1 = b.ci64(1);
    let slot1 = b.op(&format!("arith.addi {slot}, {c1} : i64"));
    let bif = b.op(&format!("arith.bitcast {bi} : i32 to f32"));
    st_cluster(b, &smt, &slot, &z, &bv);
    st_cluster(b, &smt, &slot1, &z, &bif);
    b.line("}");
    b.cluster_barrier();
    // (block 0, warp 0: lane l < blocks takes block l's partial)
    let r0 = b.op(&format!("arith.cmpi eq, {rk64}, {z} : i64"));
    let w0 = b.op(&format!("arith.cmpi eq, {warp}, {c0} : index"));
    let go = b.op(&format!("arith.andi {r0}, {w0} : i1"));
    b.line(&format!("scf.if {go} {{"));
    let cb = b.op(&format!("arith.constant {blocks} : index"));
    let has = b.op(&format!("arith.cmpi ult, {lane}, {cb} : index"));
    let cbm = b.op(&format!("arith.constant {} : index", blocks - 1));
    let lc = b.op(&format!("arith.minui {lane}, {cbm} : index"));
    let s0 = b.op(&format!("arith.muli {lc}, {c2i} : index"));
    let cwi = b.op(&format!("arith.constant {} : index", 2 * warps));
    let s0 = b.op(&format!("arith.addi {s0}, {cwi} : index"));
    let s1 = b.op(&format!("arith.addi {s0}, {c1i} : index"));
    let pv = b.op(&format!("memref.load %sm[{s0}] : {smt}"));
    let pif = b.op(&format!("memref.load %sm[{s1}] : {smt}"));
    let pi = b.op(&format!("arith.bitcast {pif} : f32 to i32"));
    let fi = argmax_settle(b, &pv, &pi, Some(&has), &ninf, &big);
    b.line(&format!("scf.if {l0} {{"));
    let p = b.op(&format!("llvm.getelementptr %y[{rowi}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
    b.line(&format!("llvm.store {fi}, {p} : i32, !llvm.ptr<1>"));
    b.line("}");
    b.line("}");
    Ok(())
}

/// [`KernelSpec::ArgmaxSplit`]: block (s, row) takes the row's 16-byte pieces
/// [s·P, (s+1)·P) (both loads of a thread issued before their compares), reduces (max, first
/// index) over the block, and thread 0 stores it into `%part[row·S + s]` (value bits, index),
/// fences at GPU scope and counts the block in `%sync[row]`; the block that counts last
/// (S - 1 before it) reads the S partials (GPU-scope loads, in split order: ties keep the lower
/// index), writes y[row] (0 for a row with nothing above -inf, as the host argmax) and resets
/// the counter.
fn emit_argmax_split(b: &mut Body, d: usize, splits: usize) -> Result<(), String> {
    if d % 4 != 0 || !(1..=64).contains(&splits) || splits * ARGMAX_SPLIT_PIECES < d / 4 {
        return Err(format!("split argmax: {splits} blocks of {ARGMAX_SPLIT_PIECES} pieces do not cover a row of {d}"));
    }
    let warps = ARGMAX_SPLIT_WARPS;
    let nt = 32 * warps;
    let nvec = d / 4;
    let t = b.op("gpu.thread_id x");
    let sx = b.op("gpu.block_id x");
    let row = b.op("gpu.block_id y");
    let (t64, sx64, rowi) = (b.idx64(&t), b.idx64(&sx), b.idx64(&row));
    let ok = b.op(&format!("arith.cmpi slt, {rowi}, %rows : i64"));
    b.line(&format!("scf.if {ok} {{"));
    let cd = b.ci64(d as i64);
    let base = b.op(&format!("arith.muli {rowi}, {cd} : i64"));
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let big = b.op("arith.constant 2147483647 : i32");
    let (cnv, z, c4) = (b.ci64(nvec as i64), b.ci64(0), b.ci64(4));
    let cp = b.ci64(ARGMAX_SPLIT_PIECES as i64);
    let j0 = b.op(&format!("arith.muli {sx64}, {cp} : i64"));
    let j0 = b.op(&format!("arith.addi {j0}, {t64} : i64"));
    let (v, i) = argmax_pieces(b, &ArgmaxRow { base: &base, j0: &j0, bound: &cnv, z: &z, c4: &c4, ninf: &ninf, big: &big }, ARGMAX_SPLIT_PIECES / nt, nt);
    argmax_blocks_reduce(b, ("%part", "%sync", "%y"), &t, &sx64, &rowi, &v, &i, splits, warps, &ninf, &big);
    // (the row's `scf.if`)
    b.line("}");
    Ok(())
}

/// The o projection folded into the one-token decode attention ([`KernelSpec::AttentionO`]),
/// after the head's output is in shared memory at `o_at` (D floats; the flag slot after them):
/// each thread's rows of W_o's head columns (`o_rows`: row, valid, its D/8 loaded 16-byte
/// vectors) times the output into the partial (h, t) of `%parts` ([H, T, N]); then thread 0,
/// past a block barrier and a GPU-scope fence, counts the block in `%sync[t]`; the block that
/// counts last (H - 1 before it) sums the H partials in head order + `%res` into `%out`
/// ([T, N]) and resets the counter.
#[allow(clippy::too_many_arguments)]
fn o_projection(b: &mut Body, nn: usize, h: usize, d: usize, t: &str, head0: &str, tid: &str, o_rows: &[(String, String, Vec<String>, String)], o_at: usize, smt: &str) -> Result<(), String> {
    b.line("gpu.barrier");
    let ch = b.ci64(h as i64);
    let ntok = b.op(&format!("arith.divui %n, {ch} : i64"));
    let cn = b.ci64(nn as i64);
    // (the head's output, read back from shared memory)
    let ys: Vec<String> = (0..d)
        .map(|e| {
            let i = b.op(&format!("arith.constant {} : index", o_at + e));
            b.op(&format!("memref.load %sm[{i}] : {smt}"))
        })
        .collect();
    // partial (h, t): row (h·T + t)
    let prow = b.op(&format!("arith.muli {head0}, {ntok} : i64"));
    let prow = b.op(&format!("arith.addi {prow}, {t} : i64"));
    let pbase = b.op(&format!("arith.muli {prow}, {cn} : i64"));
    for (j, valid, vs, e0) in o_rows {
        // (rows past the first round: their loads now)
        let loaded: Vec<String> = if vs.is_empty() {
            (0..d / 8)
                .map(|c8| {
                    let co = b.ci64(8 * c8 as i64);
                    let e = b.op(&format!("arith.addi {e0}, {co} : i64"));
                    let c2b = b.ci64(2);
                    let by = b.op(&format!("arith.muli {e}, {c2b} : i64"));
                    b.load_vector("%wo", &by, 8, "i16", 16)
                })
                .collect()
        } else {
            vs.clone()
        };
        let vs = &loaded;
        let mut acc = b.cf32(0.0);
        for (c8, v) in vs.iter().enumerate() {
            for e in 0..8 {
                let w = b.element(v, e, 8, "i16");
                let w = b.bf16_to_f32(&w);
                acc = b.op(&format!("llvm.intr.fma({w}, {}, {acc}) : (f32, f32, f32) -> f32", ys[8 * c8 + e]));
            }
        }
        if b.attn_o_red {
            // (head 0 adds the residual; every head adds into both accumulators)
            b.line(&format!("scf.if {valid} {{"));
            let tn = b.op(&format!("arith.muli {t}, {cn} : i64"));
            let at = b.op(&format!("arith.addi {tn}, {j} : i64"));
            let c0h = b.ci64(0);
            let h0 = b.op(&format!("arith.cmpi eq, {head0}, {c0h} : i64"));
            let r = b.load("%res", &at);
            let zr = b.cf32(0.0);
            let r = b.op(&format!("arith.select {h0}, {r}, {zr} : f32"));
            let v = b.op(&format!("arith.addf {acc}, {r} : f32"));
            for out in ["%out", "%out2"] {
                let p = b.op(&format!("llvm.getelementptr {out}[{at}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
                b.line(&format!("llvm.inline_asm has_side_effects \"red.global.add.f32 [$0], $1;\", \"l,f\" {p}, {v} : (!llvm.ptr<1>, f32) -> ()"));
            }
            b.line("}");
            continue;
        }
        b.line(&format!("scf.if {valid} {{"));
        let at = b.op(&format!("arith.addi {pbase}, {j} : i64"));
        b.store(&acc, "%parts", &at);
        b.line("}");
    }
    if b.attn_o_red {
        return Ok(());
    }
    b.line("gpu.barrier");
    let tid64 = b.idx64(tid);
    let c0 = b.ci64(0);
    let first = b.op(&format!("arith.cmpi eq, {tid64}, {c0} : i64"));
    let flag = b.op(&format!("arith.constant {} : index", o_at + d));
    let c4 = b.ci64(4);
    let so = b.op(&format!("arith.muli {t}, {c4} : i64"));
    let sb = b.op("llvm.ptrtoint %sync : !llvm.ptr<1> to i64");
    let sa = b.op(&format!("arith.addi {sb}, {so} : i64"));
    b.line(&format!("scf.if {first} {{"));
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"\" : () -> ()");
    let old = b.op(&format!("llvm.inline_asm has_side_effects \"atom.global.add.u32 $0, [$1], 1;\", \"=r,l\" {sa} : (i64) -> i32"));
    let hm1 = b.op(&format!("arith.constant {} : i32", h as i64 - 1));
    let last = b.op(&format!("arith.cmpi eq, {old}, {hm1} : i32"));
    let one = b.cf32(1.0);
    let zero = b.cf32(0.0);
    let fv = b.op(&format!("arith.select {last}, {one}, {zero} : f32"));
    b.line(&format!("memref.store {fv}, %sm[{flag}] : {smt}"));
    b.line("}");
    b.line("gpu.barrier");
    let fv = b.op(&format!("memref.load %sm[{flag}] : {smt}"));
    let zero = b.cf32(0.0);
    let is_last = b.op(&format!("arith.cmpf one, {fv}, {zero} : f32"));
    b.line(&format!("scf.if {is_last} {{"));
    b.line("llvm.inline_asm has_side_effects \"fence.acq_rel.gpu;\", \"\" : () -> ()");
    let tn = b.op(&format!("arith.muli {t}, {cn} : i64"));
    let pb = b.op("llvm.ptrtoint %parts : !llvm.ptr<1> to i64");
    for (j, valid, _, _) in o_rows {
        b.line(&format!("scf.if {valid} {{"));
        let at = b.op(&format!("arith.addi {tn}, {j} : i64"));
        let mut acc = b.load("%res", &at);
        for hh in 0..h {
            let chh = b.ci64(hh as i64);
            let r = b.op(&format!("arith.muli {chh}, {ntok} : i64"));
            let r = b.op(&format!("arith.addi {r}, {t} : i64"));
            let r = b.op(&format!("arith.muli {r}, {cn} : i64"));
            let r = b.op(&format!("arith.addi {r}, {j} : i64"));
            // (GPU-scope loads: the other blocks' partials, past any stale L1 line)
            let rb = b.op(&format!("arith.muli {r}, {c4} : i64"));
            let pa = b.op(&format!("arith.addi {pb}, {rb} : i64"));
            let pv = b.op(&format!("llvm.inline_asm has_side_effects \"ld.relaxed.gpu.global.f32 $0, [$1];\", \"=f,l\" {pa} : (i64) -> f32"));
            acc = b.op(&format!("arith.addf {acc}, {pv} : f32"));
        }
        b.store(&acc, "%out", &at);
        b.line("}");
    }
    // (the counter back to zero for the next step: no block of this token counts again)
    b.line(&format!("scf.if {first} {{"));
    b.line(&format!("llvm.inline_asm has_side_effects \"st.relaxed.gpu.global.u32 [$0], 0;\", \"l\" {sa} : (i64) -> ()"));
    b.line("}");
    b.line("}");
    Ok(())
}

/// The split decode attention cuts a row's context into at most max(1, this / rows) parts
/// (rows = tokens x heads of the step): enough blocks to fill the H200 (4 blocks of 16 warps
/// on each of 132 SMs), no more. Measured at a 4k context (8B shape): 16 parts at batch 1
/// 141 -> 212 tok/s, but at batch 8 (256 rows) 787 -> 749.
pub const ATTN_SPLIT_BLOCKS: usize = 512;

/// The parts a split decode attention row takes ([`split_extent`]), on the host.
pub fn split_parts(ctx: usize, rows: usize, ns: usize, min_keys: usize) -> usize {
    ctx.div_ceil(min_keys).min(ns).min((ATTN_SPLIT_BLOCKS / rows.max(1)).max(1))
}

/// (se, chunk) of a split decode attention row whose context is `ctx` keys (i64 values), in a
/// step of `%n` rows: se = min(ceil(ctx / min_keys), S, max(1, [`ATTN_SPLIT_BLOCKS`] / n))
/// parts of chunk = ceil(ctx / se) keys (every part non-empty while min_keys > S + 1, which
/// the lowering keeps).
fn split_extent(b: &mut Body, ctx: &str, ns: usize, min_keys: usize) -> (String, String) {
    let cmk = b.ci64(min_keys as i64);
    let cmk1 = b.ci64(min_keys as i64 - 1);
    let se = b.op(&format!("arith.addi {ctx}, {cmk1} : i64"));
    let se = b.op(&format!("arith.divui {se}, {cmk} : i64"));
    let cns = b.ci64(ns as i64);
    let se = b.op(&format!("arith.minsi {se}, {cns} : i64"));
    let cb = b.ci64(ATTN_SPLIT_BLOCKS as i64);
    let c1 = b.ci64(1);
    let nn = b.op(&format!("arith.maxsi %n, {c1} : i64"));
    let cap = b.op(&format!("arith.divui {cb}, {nn} : i64"));
    let cap = b.op(&format!("arith.maxsi {cap}, {c1} : i64"));
    let se = b.op(&format!("arith.minsi {se}, {cap} : i64"));
    let c1 = b.ci64(1);
    let se1 = b.op(&format!("arith.subi {se}, {c1} : i64"));
    let chunk = b.op(&format!("arith.addi {ctx}, {se1} : i64"));
    let chunk = b.op(&format!("arith.divui {chunk}, {se} : i64"));
    (se, chunk)
}

/// The second pass of the split decode attention ([`KernelSpec::AttentionCombine`]): one warp
/// per (token, head) row merges the row's se partial softmax states (m, l, acc) into the
/// output, out = Σ acc_s e^(m_s − M) / Σ l_s e^(m_s − M) with M = max m_s.
fn emit_attention_combine(b: &mut Body, h: usize, d: usize, ns: usize, min_keys: usize) -> Result<String, String> {
    if d % 32 != 0 || h == 0 || !(1..=32).contains(&ns) || min_keys <= ns + 1 {
        return Err(format!("attention combine needs D a multiple of 32, 1..=32 splits and min keys > splits + 1 (D {d}, S {ns}, min keys {min_keys})"));
    }
    let per = d / 32;
    let stride = (d + 2) as i64;
    let (row, lane) = b.open_guarded_warp_row();
    let hh = b.ci64(h as i64);
    let t = b.op(&format!("arith.divui {row}, {hh} : i64"));
    let p = b.load_i32_as_i64("%pos", &t);
    let c1 = b.ci64(1);
    let ctx = b.op(&format!("arith.addi {p}, {c1} : i64"));
    let (se, _) = split_extent(b, &ctx, ns, min_keys);
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let zero = b.cf32(0.0);
    let cns = b.ci64(ns as i64);
    let slot0 = b.op(&format!("arith.muli {row}, {cns} : i64"));
    // (parts past se were not written: their values are replaced before any arithmetic)
    let mut parts = vec![];
    for sidx in 0..ns {
        let cs = b.ci64(sidx as i64);
        let live = b.op(&format!("arith.cmpi slt, {cs}, {se} : i64"));
        let slot = b.op(&format!("arith.addi {slot0}, {cs} : i64"));
        let cst = b.ci64(stride);
        let pb = b.op(&format!("arith.muli {slot}, {cst} : i64"));
        let m = b.load("%part", &pb);
        let m = b.op(&format!("arith.select {live}, {m}, {ninf} : f32"));
        let pb1 = b.op(&format!("arith.addi {pb}, {c1} : i64"));
        let l = b.load("%part", &pb1);
        let l = b.op(&format!("arith.select {live}, {l}, {zero} : f32"));
        let mut accs = vec![];
        for e in 0..per {
            let co = b.ci64(2 + 32 * e as i64);
            let o = b.op(&format!("arith.addi {pb}, {co} : i64"));
            let o = b.op(&format!("arith.addi {o}, {lane} : i64"));
            let a = b.load("%part", &o);
            accs.push(b.op(&format!("arith.select {live}, {a}, {zero} : f32")));
        }
        parts.push((m, l, accs));
    }
    let mut mx = parts[0].0.clone();
    for (m, _, _) in &parts[1..] {
        mx = b.op(&format!("arith.maximumf {mx}, {m} : f32"));
    }
    let mut lsum = zero.clone();
    let mut out = vec![zero.clone(); per];
    for (m, l, accs) in &parts {
        let dm = b.op(&format!("arith.subf {m}, {mx} : f32"));
        let w = b.exp(&dm);
        lsum = b.op(&format!("llvm.intr.fma({l}, {w}, {lsum}) : (f32, f32, f32) -> f32"));
        for (o, a) in out.iter_mut().zip(accs) {
            *o = b.op(&format!("llvm.intr.fma({a}, {w}, {o}) : (f32, f32, f32) -> f32"));
        }
    }
    let dd = b.ci64(d as i64);
    let ob = b.op(&format!("arith.muli {row}, {dd} : i64"));
    for (e, o) in out.iter().enumerate() {
        let ce = b.ci64(32 * e as i64);
        let at = b.op(&format!("arith.addi {ob}, {ce} : i64"));
        let at = b.op(&format!("arith.addi {at}, {lane} : i64"));
        let y = b.op(&format!("arith.divf {o}, {lsum} : f32"));
        b.store(&y, "%out", &at);
    }
    b.line("}");
    Ok("%part: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64".into())
}

/// A merged matmul (`KernelSpec::MatMulParts`): a prologue maps the block to its part — its
/// weight pointer becomes `%w`, its column count `%n`, its output (part-major: part i holds
/// [M, N_i] at element M * (N_0 + .. + N_{i-1})) `%y` — and the block index within the part
/// stands in for `gpu.block_id x`; then the plain kernel's body runs unchanged.
fn emit_parts(b: &mut Body, inner: &KernelSpec, parts: &[usize]) -> Result<String, String> {
    parts_fit(inner, parts)?;
    // (split-K: `splits` blocks per column tile, so a block index unit is bn / splits columns)
    let cols = columns_per_block(&inner.launch()).expect("checked") / b.split_k.unwrap_or(1);
    let bx = b.op("gpu.block_id x");
    let bx = b.idx64(&bx);
    let (mut w, mut n, mut boff, mut yoff) = ("%w0".to_string(), b.ci64(parts[0] as i64), b.ci64(0), b.ci64(0));
    let mut start = 0usize;
    for (i, &p) in parts.iter().enumerate().skip(1) {
        start += parts[i - 1];
        let last = i + 1 == parts.len();
        let first = b.ci64((start / cols) as i64);
        let here = b.op(&format!("arith.cmpi sge, {bx}, {first} : i64"));
        // the last select of each chain defines the name the kernel body uses
        let wsel = format!("llvm.select {here}, %w{i}, {w} : i1, !llvm.ptr<1>");
        let np = b.ci64(p as i64);
        let nsel = format!("arith.select {here}, {np}, {n} : i64");
        if last {
            b.line(&format!("%w = {wsel}"));
            b.line(&format!("%n = {nsel}"));
        } else {
            w = b.op(&wsel);
            n = b.op(&nsel);
        }
        boff = b.op(&format!("arith.select {here}, {first}, {boff} : i64"));
        let off = b.ci64(start as i64);
        yoff = b.op(&format!("arith.select {here}, {off}, {yoff} : i64"));
    }
    let local = b.op(&format!("arith.subi {bx}, {boff} : i64"));
    b.block_x = Some(b.op(&format!("arith.index_cast {local} : i64 to index")));
    let c4 = b.ci64(4);
    let rows = b.op(&format!("arith.muli {yoff}, %prows : i64"));
    let bytes = b.op(&format!("arith.muli {rows}, {c4} : i64"));
    // (split-K: this part's place in a partial-sum slice, which the kernel offsets by its K
    // part's slice, [M, all columns] each)
    let yname = if b.split_k.is_some() {
        b.split_n = Some("%nall");
        "%yparts"
    } else {
        "%y"
    };
    b.line(&format!("{yname} = llvm.getelementptr %yall[{bytes}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    let params = emit_into(b, inner)?;
    let ws: Vec<String> = (0..parts.len()).map(|i| format!("%w{i}: !llvm.ptr<1>")).collect();
    let params = params.replacen("%w: !llvm.ptr<1>", &ws.join(", "), 1).replacen("%y: !llvm.ptr<1>", "%yall: !llvm.ptr<1>", 1).replacen("%n: i64", "%nall: i64, %prows: i64", 1);
    Ok(params)
}

/// The kernel's body into `b`; returns its parameter list.
fn emit_into(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    Ok(match spec {
        KernelSpec::MatMulParts { inner, parts } => emit_parts(b, inner, parts)?,
        KernelSpec::NormMatMul { inner, eps_bits } => {
            let plain = |k: &KernelSpec| matches!(k, KernelSpec::MatMul { wdtype: DType::F32 | DType::F16 | DType::BF16, bias: false, .. });
            let ok = match inner.as_ref() {
                KernelSpec::MatMulParts { inner: i, .. } => plain(i),
                KernelSpec::SwiGluGemv { .. } => true,
                KernelSpec::MatMulWide { bias: false, .. } => true,
                other => plain(other),
            };
            if !ok {
                return Err(format!("the norm prologue needs a plain-float decode GEMV (or the SwiGLU GEMV) without bias, not {}", inner.symbol()));
            }
            b.norm = Some(f32::from_bits(*eps_bits));
            emit_into(b, inner)?.replacen("%x: !llvm.ptr<1>, ", "%x: !llvm.ptr<1>, %g: !llvm.ptr<1>, ", 1)
        }
        KernelSpec::Unary(u) => {
            let i = b.open_guarded_gid();
            let x = b.load("%x", &i);
            let y = unary_expr(b, u.0, &x)?;
            b.store(&y, "%y", &i);
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        KernelSpec::SiluMulHalf { f16 } => {
            let i = b.open_guarded_gid();
            let z = binary_at(b, BinaryOp::SiluMul, &i)?;
            b.store(&z, "%y", &i);
            // (the 16-bit copy as the norm + quantize kernels round it: the low half of a pair)
            let w = b.pack2(&z, &z, *f16);
            let h = b.op(&format!("arith.trunci {w} : i32 to i16"));
            let p = b.op(&format!("llvm.getelementptr %yh[{i}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i16"));
            b.line(&format!("llvm.store {h}, {p} : i16, !llvm.ptr<1>"));
            b.line("}");
            "%a: !llvm.ptr<1>, %b: !llvm.ptr<1>, %y: !llvm.ptr<1>, %yh: !llvm.ptr<1>, %n: i64, %nb: i64".into()
        }
        KernelSpec::Binary(op) => {
            let i = b.open_guarded_gid();
            let z = binary_at(b, op.0, &i)?;
            b.store(&z, "%y", &i);
            b.line("}");
            "%a: !llvm.ptr<1>, %b: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %nb: i64".into()
        }
        KernelSpec::RmsNorm { d, eps_bits } | KernelSpec::RmsNormHalf { d, eps_bits, .. } if rms_norm_regs(*d).is_some() => {
            // one pass: every thread loads its 16-byte pieces once and keeps them in registers
            let (warps, per) = rms_norm_regs(*d).expect("checked");
            let eps = f32::from_bits(*eps_bits);
            let nt = 32 * warps;
            let smt = format!("memref<{warps}xf32, #gpu.address_space<workgroup>>");
            b.workgroup = Some(format!("%red : {smt}"));
            let (t, rowi) = b.open_block_row();
            let t64 = b.idx64(&t);
            let dd64 = b.ci64(*d as i64);
            let base = b.op(&format!("arith.muli {rowi}, {dd64} : i64"));
            // (x's row: this row, or with the row gather folded in, row idx[row] of x)
            let xbase = if b.row_gather {
                let src = b.load_i32_as_i64("%idx", &rowi);
                b.op(&format!("arith.muli {src}, {dd64} : i64"))
            } else {
                base.clone()
            };
            let c4 = b.ci64(4);
            let t4 = b.op(&format!("arith.muli {t64}, {c4} : i64"));
            // piece j of thread t: elements 4 (t + j nt) .. + 4
            let idx: Vec<String> = (0..per)
                .map(|j| {
                    let o = b.ci64((4 * j * nt) as i64);
                    b.op(&format!("arith.addi {t4}, {o} : i64"))
                })
                .collect();
            let xs: Vec<Vec<String>> = idx
                .iter()
                .map(|i| {
                    let e = b.op(&format!("arith.addi {xbase}, {i} : i64"));
                    let bo = b.op(&format!("arith.muli {e}, {c4} : i64"));
                    b.load_vec("%x", &bo, 4, "f32", 16)
                })
                .collect();
            let ws: Vec<Vec<String>> = idx
                .iter()
                .map(|i| {
                    let wo = b.op(&format!("arith.muli {i}, {c4} : i64"));
                    b.load_vec("%w", &wo, 4, "f32", 16)
                })
                .collect();
            let mut acc = b.cf32(0.0);
            for x in &xs {
                let sq: Vec<String> = x.iter().map(|v| b.op(&format!("arith.mulf {v}, {v} : f32"))).collect();
                let s4 = b.sum4(&sq);
                acc = b.op(&format!("arith.addf {acc}, {s4} : f32"));
            }
            let zero = b.cf32(0.0);
            let total = b.block_sum(&acc, &t, warps, &smt, &zero);
            let inv = b.inv_rms(&total, *d, eps);
            let half = rms_half(spec);
            for (j, i) in idx.iter().enumerate() {
                let e = b.op(&format!("arith.addi {base}, {i} : i64"));
                b.store_scaled_piece(&xs[j], &ws[j], &inv, &e, "%y", half.map(|f16| (f16, "%yh")));
            }
            b.line("}");
            rms_norm_params(half)
        }
        KernelSpec::RmsNorm { d, eps_bits } | KernelSpec::RmsNormHalf { d, eps_bits, .. } if d % 4 == 0 => {
            let eps = f32::from_bits(*eps_bits);
            let Launch::BlockPerRow { warps } = spec.launch() else { unreachable!() };
            let r = b.open_row_pieces(*d, warps as usize);
            let RowPieces { t, t4, dd, step, base, zero, c4b, smt, .. } = r.clone();
            // (x's row: this row, or with the row gather folded in, row idx[row] of x)
            let xbase = if b.row_gather {
                let row = b.op("gpu.block_id x");
                let row = b.idx64(&row);
                let src = b.load_i32_as_i64("%idx", &row);
                let dd64 = b.ci64(*d as i64);
                Some(b.op(&format!("arith.muli {src}, {dd64} : i64")))
            } else {
                None
            };
            // sum of squares: 4 floats per thread per iteration
            let acc = b.v();
            let (iv, a) = (b.v(), b.v());
            b.line(&format!("{acc} = scf.for {iv} = {t4} to {dd} step {step} iter_args({a} = {zero}) -> (f32) {{"));
            let i = b.idx64(&iv);
            let e = b.op(&format!("arith.addi {}, {i} : i64", xbase.as_deref().unwrap_or(&base)));
            let bo = b.op(&format!("arith.muli {e}, {c4b} : i64"));
            let xs = b.load_vec("%x", &bo, 4, "f32", 16);
            let sq: Vec<String> = xs.iter().map(|x| b.op(&format!("arith.mulf {x}, {x} : f32"))).collect();
            let s4 = b.sum4(&sq);
            let a2 = b.op(&format!("arith.addf {a}, {s4} : f32"));
            b.line(&format!("scf.yield {a2} : f32"));
            b.line("}");
            let total = b.block_sum(&acc, &t, warps as usize, &smt, &zero);
            let inv = b.inv_rms(&total, *d, eps);
            let half = rms_half(spec);
            b.scale_row_pieces_from(&r, "%x", xbase.as_deref(), "%w", &inv, "%y", half.map(|f16| (f16, "%yh")));
            b.line("}");
            rms_norm_params(half)
        }
        KernelSpec::RmsNormHalf { d, .. } => return Err(format!("the RMSNorm with a 16-bit copy needs D a multiple of 4, got {d}")),
        KernelSpec::RmsNorm { d, eps_bits } => {
            let eps = f32::from_bits(*eps_bits);
            let t = b.op("gpu.thread_id x");
            let blk = b.op("gpu.block_id x");
            let c32 = b.op("arith.constant 32 : index");
            let lane = b.op(&format!("arith.remui {t}, {c32} : index"));
            let warp = b.op(&format!("arith.divui {t}, {c32} : index"));
            let Launch::WarpPerRow { rows_per_block } = spec.launch() else { unreachable!() };
            let rpb = b.op(&format!("arith.constant {rows_per_block} : index"));
            let r0 = b.op(&format!("arith.muli {blk}, {rpb} : index"));
            let row = b.op(&format!("arith.addi {r0}, {warp} : index"));
            let rowi = b.op(&format!("arith.index_cast {row} : index to i64"));
            let ok = b.op(&format!("arith.cmpi slt, {rowi}, %rows : i64"));
            b.line(&format!("scf.if {ok} {{"));
            let dd = b.op(&format!("arith.constant {d} : index"));
            let base = b.op(&format!("arith.muli {row}, {dd} : index"));
            let zero = b.cf32(0.0);
            let acc = b.v();
            let (iv, a) = (b.v(), b.v());
            b.line(&format!("{acc} = scf.for {iv} = {lane} to {dd} step {c32} iter_args({a} = {zero}) -> (f32) {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let x = b.load("%x", &idx);
            let sq = b.op(&format!("arith.mulf {x}, {x} : f32"));
            let a2 = b.op(&format!("arith.addf {a}, {sq} : f32"));
            b.line(&format!("scf.yield {a2} : f32"));
            b.line("}");
            let total = b.warp_sum(&acc);
            let inv = b.inv_rms(&total, *d, eps);
            let iv2 = b.v();
            b.line(&format!("scf.for {iv2} = {lane} to {dd} step {c32} {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv2} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let wi = b.op(&format!("arith.index_cast {iv2} : index to i64"));
            let x = b.load("%x", &idx);
            let w = b.load("%w", &wi);
            let xn = b.op(&format!("arith.mulf {x}, {inv} : f32"));
            let y = b.op(&format!("arith.mulf {xn}, {w} : f32"));
            b.store(&y, "%y", &idx);
            b.line("}");
            b.line("}");
            "%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }

        KernelSpec::MatMul { k, n, wdtype, bias, residual } if matches!(wdtype, DType::F32 | DType::F16 | DType::BF16) => {
            emit_gemv(b, *k, *n, *wdtype, *bias, *residual, 1)?;
            matmul_params(*bias, *residual, false)
        }
        KernelSpec::MatMulWide { k, n, wdtype, bias, residual } => {
            wide_gemv_kernel_fits(*k, *wdtype)?;
            emit_gemv_wide(b, *k, *n, *wdtype, *bias, *residual)?;
            matmul_params(*bias, *residual, false)
        }
        KernelSpec::MatMulFew { k, n, wdtype, bias, residual, rows } => {
            if !matches!(wdtype, DType::F32 | DType::F16 | DType::BF16) {
                return Err(format!("the batched GEMV takes f32/f16/bf16 weights, not {wdtype}"));
            }
            if *rows != few_rows(*wdtype) {
                return Err(format!("the batched GEMV for {wdtype} takes {} rows per block, not {rows}", few_rows(*wdtype)));
            }
            if *wdtype == DType::F32 {
                emit_gemv(b, *k, *n, *wdtype, *bias, *residual, *rows)?;
            } else {
                emit_gemv_mma(b, *k, *wdtype, *bias, *residual, false)?;
            }
            matmul_params(*bias, *residual, true)
        }
        KernelSpec::MatMulFewX16 { k, n: _, wdtype, bias, residual } => {
            emit_gemv_mma(b, *k, *wdtype, *bias, *residual, true)?;
            matmul_params(*bias, *residual, true)
        }
        KernelSpec::MatMul { k, n: _, wdtype, bias, residual } => {
            if k % 32 != 0 {
                return Err(format!("matmul needs K a multiple of 32, got {k}"));
            }
            let nblk = k / 32;
            let Launch::WarpPerOutput { warps_per_block } = spec.launch() else { unreachable!() };
            let t = b.op("gpu.thread_id x");
            let bx = b.op("gpu.block_id x");
            let by = b.op("gpu.block_id y");
            let c32 = b.op("arith.constant 32 : index");
            let lane = b.op(&format!("arith.remui {t}, {c32} : index"));
            let warp = b.op(&format!("arith.divui {t}, {c32} : index"));
            let wpb = b.op(&format!("arith.constant {warps_per_block} : index"));
            let n0 = b.op(&format!("arith.muli {bx}, {wpb} : index"));
            let col = b.op(&format!("arith.addi {n0}, {warp} : index"));
            let col64 = b.idx64(&col);
            let row64 = b.idx64(&by);
            let ok = b.op(&format!("arith.cmpi slt, {col64}, %n : i64"));
            b.line(&format!("scf.if {ok} {{"));
            let nb = b.op(&format!("arith.constant {nblk} : index"));
            let zero = b.cf32(0.0);
            let acc = b.v();
            let (blk, a) = (b.v(), b.v());
            b.line(&format!("{acc} = scf.for {blk} = {lane} to {nb} step {c32} iter_args({a} = {zero}) -> (f32) {{"));
            let blk64 = b.idx64(&blk);
            let kk = b.ci64(*k as i64);
            let c32l = b.ci64(32);
            let xrow = b.op(&format!("arith.muli {row64}, {kk} : i64"));
            let xoff = b.op(&format!("arith.muli {blk64}, {c32l} : i64"));
            let xbase = b.op(&format!("arith.addi {xrow}, {xoff} : i64"));
            // 32 activations as 8 16-byte loads (rows are 128-byte aligned: K % 32 == 0)
            let c4l = b.ci64(4);
            let xbyte = b.op(&format!("arith.muli {xbase}, {c4l} : i64"));
            let mut xs = vec![];
            for q in 0..8 {
                let o = b.ci64(16 * q);
                let off = b.op(&format!("arith.addi {xbyte}, {o} : i64"));
                xs.extend(b.load_vec("%x", &off, 4, "f32", 16));
            }
            let nblk64 = b.ci64(nblk as i64);
            let wrow = b.op(&format!("arith.muli {col64}, {nblk64} : i64"));
            let gblk = b.op(&format!("arith.addi {wrow}, {blk64} : i64"));
            let part = match wdtype {
                DType::Q8_0 | DType::Q4_0 | DType::Q4_1 => {
                    let bytes = wdtype.block().1 as i64;
                    let cb = b.ci64(bytes);
                    let base = b.op(&format!("arith.muli {gblk}, {cb} : i64"));
                    let d = b.f16_at_byte("%w", &base);
                    let qoff = match wdtype {
                        DType::Q4_1 => 4,
                        _ => 2,
                    };
                    // q[e] as f32, e in 0..32
                    let mut q = vec![String::new(); 32];
                    // the quant bytes: 4 aligned i32 loads for Q4_1 (20-byte blocks), else bytes
                    let mut bytes = vec![];
                    if *wdtype == DType::Q4_1 {
                        for wq in 0..4 {
                            let cj = b.ci64(qoff + 4 * wq);
                            let off = b.op(&format!("arith.addi {base}, {cj} : i64"));
                            let p = b.op(&format!("llvm.getelementptr %w[{off}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
                            let word = b.op(&format!("llvm.load {p} {{alignment = 4 : i64}} : !llvm.ptr<1> -> i32"));
                            for by in 0..4 {
                                let sh = b.op(&format!("arith.constant {} : i32", 8 * by));
                                let v = b.op(&format!("arith.shrui {word}, {sh} : i32"));
                                let m = b.op("arith.constant 255 : i32");
                                bytes.push(b.op(&format!("arith.andi {v}, {m} : i32")));
                            }
                        }
                    } else {
                        for j in 0..(if *wdtype == DType::Q8_0 { 32 } else { 16 }) {
                            let cj = b.ci64(qoff + j as i64);
                            let off = b.op(&format!("arith.addi {base}, {cj} : i64"));
                            bytes.push(b.u8_at_byte("%w", &off));
                        }
                    }
                    for (j, byte) in bytes.into_iter().enumerate() {
                        if *wdtype == DType::Q8_0 {
                            let t8 = b.op(&format!("arith.trunci {byte} : i32 to i8"));
                            q[j] = b.op(&format!("arith.sitofp {t8} : i8 to f32"));
                        } else {
                            let m15 = b.op("arith.constant 15 : i32");
                            let c4 = b.op("arith.constant 4 : i32");
                            let lo = b.op(&format!("arith.andi {byte}, {m15} : i32"));
                            let hi = b.op(&format!("arith.shrui {byte}, {c4} : i32"));
                            q[j] = b.op(&format!("arith.uitofp {lo} : i32 to f32"));
                            q[j + 16] = b.op(&format!("arith.uitofp {hi} : i32 to f32"));
                        }
                    }
                    let mut sq4 = vec![zero.clone(); 4];
                    let mut sx4 = vec![zero.clone(); 4];
                    for (e, (qe, x)) in q.iter().zip(&xs).enumerate() {
                        sq4[e % 4] = b.op(&format!("llvm.intr.fma({qe}, {x}, {}) : (f32, f32, f32) -> f32", sq4[e % 4]));
                        if *wdtype != DType::Q8_0 {
                            sx4[e % 4] = b.op(&format!("arith.addf {}, {x} : f32", sx4[e % 4]));
                        }
                    }
                    let sq = b.sum4(&sq4);
                    let sx = if *wdtype != DType::Q8_0 { b.sum4(&sx4) } else { zero.clone() };
                    let dq = b.op(&format!("arith.mulf {d}, {sq} : f32"));
                    match wdtype {
                        DType::Q8_0 => dq,
                        DType::Q4_0 => {
                            // d * sum((q - 8) x) = d * (sum q x - 8 sum x)
                            let c8 = b.cf32(8.0);
                            let e8 = b.op(&format!("arith.mulf {sx}, {c8} : f32"));
                            let de = b.op(&format!("arith.mulf {d}, {e8} : f32"));
                            b.op(&format!("arith.subf {dq}, {de} : f32"))
                        }
                        _ => {
                            let c2 = b.ci64(2);
                            let moff = b.op(&format!("arith.addi {base}, {c2} : i64"));
                            let m = b.f16_at_byte("%w", &moff);
                            b.op(&format!("llvm.intr.fma({m}, {sx}, {dq}) : (f32, f32, f32) -> f32"))
                        }
                    }
                }
                other => return Err(format!("matmul weights in {other} are not lowered yet")),
            };
            let a2 = b.op(&format!("arith.addf {a}, {part} : f32"));
            b.line(&format!("scf.yield {a2} : f32"));
            b.line("}");
            let total = b.warp_sum(&acc);
            let c0 = b.op("arith.constant 0 : index");
            let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
            b.line(&format!("scf.if {first} {{"));
            b.matmul_store(&total, &row64, &col64, *bias, *residual);
            b.line("}");
            b.line("}");
            matmul_params(*bias, *residual, false)
        }
        KernelSpec::PrefetchL2 { inner } => {
            if b.pdl {
                emit_l2_prefetch(b);
                // (the one-token fused kernels wait themselves, past their own early loads)
                if !(matches!(inner.as_ref(), KernelSpec::QkvAttentionO { .. }) || inner.is_fused_mlp()) {
                    b.wait_for_previous();
                }
            }
            let params = emit_into(b, inner)?;
            format!("%pf: !llvm.ptr<1>, {params}, %pfb: i64")
        }
        KernelSpec::FlashWgmma { inner } => {
            match inner.as_ref() {
                KernelSpec::FlashAttention { d, kv: DType::BF16, warps: 4, mtiles: 1, .. } if flash_wg_d_ok(*d) => {}
                other => return Err(format!("the wgmma prefill attention takes FlashAttention on bf16 pools, 4 warps, 1 m-tile, D {FLASH_WG_D}, not {}", other.symbol())),
            }
            b.flash_wg = true;
            if let KernelSpec::FlashAttention { bs, .. } = inner.as_ref() {
                b.flash_mincta = flash_wg_tma_rows(*bs).and(b.o.flash_wg_mincta);
            }
            emit_into(b, inner)?
        }
        KernelSpec::Ws { inner } => {
            // (also around the SwiGLU epilogue)
            match inner.pipe_core() {
                KernelSpec::MatMulPipe { stages, a16: true, .. } if *stages * 16 <= TMA_MBAR_BYTES && !b.tma => {}
                other => return Err(format!("warp specialization takes the pipelined wgmma matmul with x in 16 bits, up to {} stages, not {}", TMA_MBAR_BYTES / 16, other.symbol())),
            }
            b.tma = true;
            b.ws = true;
            // rasterized: the blocks, launched in x-fastest order, take their tiles in groups
            // of RASTER_ROWS row tiles, column tile by column tile, so the ~132 blocks running
            // at once share x's rows and a few W column tiles in L2 (x-fastest, a wave spans
            // 132 column tiles: 264 MB of lm_head's W, re-read from HBM for every row tile)
            let bx = b.op("gpu.block_id x");
            let by = b.op("gpu.block_id y");
            let gx = b.op("gpu.grid_dim x");
            let gy = b.op("gpu.grid_dim y");
            let lin = b.op(&format!("arith.muli {by}, {gx} : index"));
            let lin = b.op(&format!("arith.addi {lin}, {bx} : index"));
            let cg = b.op(&format!("arith.constant {RASTER_ROWS} : index"));
            let gsz = b.op(&format!("arith.muli {cg}, {gx} : index"));
            let grp = b.op(&format!("arith.divui {lin}, {gsz} : index"));
            let first = b.op(&format!("arith.muli {grp}, {cg} : index"));
            let left = b.op(&format!("arith.subi {gy}, {first} : index"));
            let gs = b.op(&format!("arith.minui {left}, {cg} : index"));
            let r = b.op(&format!("arith.remui {lin}, {gsz} : index"));
            let ry = b.op(&format!("arith.remui {r}, {gs} : index"));
            b.block_y = Some(b.op(&format!("arith.addi {first}, {ry} : index")));
            b.block_x = Some(b.op(&format!("arith.divui {r}, {gs} : index")));
            emit_into(b, inner)?
        }
        KernelSpec::Tma { inner } => {
            match inner.matmul_core().0 {
                KernelSpec::MatMulPipe { stages, .. } if *stages * 8 <= TMA_MBAR_BYTES => {}
                other => return Err(format!("TMA takes the pipelined wgmma matmul (up to {} stages), not {}", TMA_MBAR_BYTES / 8, other.symbol())),
            }
            b.tma = true;
            emit_into(b, inner)?
        }
        KernelSpec::SplitK { inner, splits } => {
            // (a merged matmul's parts each whole column tiles: parts_fit with the pipe's bn)
            let pipe = match inner.as_ref() {
                KernelSpec::MatMulParts { inner: p, parts } => parts_fit(p, parts).map(|_| p.as_ref())?,
                other => other,
            };
            match pipe {
                // (whole column tiles: the grid, N / (bn / splits) blocks, is tiles x splits)
                KernelSpec::MatMulPipe { k, n, bias: false, residual: false, bn, .. } if *splits >= 2 && (k / 64) % splits == 0 && bn % splits == 0 && n % bn == 0 => {}
                other => {
                    return Err(format!(
                        "split-K takes the pipelined matmul (or merged matmul of one) without bias or residual, K / 64 and bn multiples of the {splits} parts and N of bn, not {}",
                        other.symbol()
                    ))
                }
            }
            b.split_k = Some(*splits);
            emit_into(b, inner)?.replacen("%y: !llvm.ptr<1>", "%yparts: !llvm.ptr<1>", 1)
        }
        KernelSpec::SplitKReduceNorm { splits, residual, d, eps_bits, half, cluster } if *cluster > 1 => {
            emit_splitk_norm_cluster(b, *splits, *residual, *d, f32::from_bits(*eps_bits), *half, *cluster)?;
            splitk_norm_params(*residual, *half)
        }
        KernelSpec::SplitKReduceNorm { splits, residual, d, eps_bits, half, .. } => {
            if d % 4 != 0 {
                return Err(format!("the split-K reduce + RMSNorm needs D a multiple of 4, got {d}"));
            }
            let warps = SPLITK_NORM_WARPS;
            let r = b.open_row_pieces(*d, warps);
            let RowPieces { t, t4, dd, step, base, zero, smt, .. } = r.clone();
            // (a slice of the partial sums is [rows, d])
            let dd64 = b.ci64(*d as i64);
            let slice = b.op(&format!("arith.muli %rows, {dd64} : i64"));
            // (`KernelOptions::splitk_norm_regs`: each thread's summed piece kept in registers
            // for the scaling pass, the norm weights loaded before the wait; prepared, not yet
            // run on the H200 — the 8B b32 step spends 343 µs in these kernels,
            // bench/results/timeline-2026-11-30.json)
            if b.o.splitk_norm_regs && *d <= 4 * 32 * warps {
                emit_splitk_norm_regs(b, &r, &slice, *splits, *residual, *d, f32::from_bits(*eps_bits), *half, warps);
                return Ok(splitk_norm_params(*residual, *half));
            }
            // y = the parts' sum (+ res), 4 floats per thread per iteration, and sum(y^2)
            let acc = b.v();
            let (iv, a) = (b.v(), b.v());
            b.line(&format!("{acc} = scf.for {iv} = {t4} to {dd} step {step} iter_args({a} = {zero}) -> (f32) {{"));
            let i = b.idx64(&iv);
            let e = b.op(&format!("arith.addi {base}, {i} : i64"));
            let (_, s4) = b.splitk_piece(&slice, &e, *splits, *residual);
            let a2 = b.op(&format!("arith.addf {a}, {s4} : f32"));
            b.line(&format!("scf.yield {a2} : f32"));
            b.line("}");
            let total = b.block_sum(&acc, &t, warps, &smt, &zero);
            let inv = b.inv_rms(&total, *d, f32::from_bits(*eps_bits));
            // (each thread reads back the y it wrote)
            b.scale_row_pieces(&r, "%y", "%g", &inv, "%xn", half.map(|f16| (f16, "%xh")));
            b.line("}");
            splitk_norm_params(*residual, *half)
        }
        KernelSpec::SplitKReduce { splits, residual } => {
            let i = b.open_guarded_gid();
            let mut acc = b.load("%parts", &i);
            for sp in 1..*splits {
                let cs = b.ci64(sp as i64);
                let o = b.op(&format!("arith.muli %n, {cs} : i64"));
                let at = b.op(&format!("arith.addi {o}, {i} : i64"));
                let v = b.load("%parts", &at);
                acc = b.op(&format!("arith.addf {acc}, {v} : f32"));
            }
            if *residual {
                let r = b.load("%res", &i);
                acc = b.op(&format!("arith.addf {acc}, {r} : f32"));
            }
            b.store(&acc, "%y", &i);
            b.line("}");
            format!("%parts: !llvm.ptr<1>, {}%y: !llvm.ptr<1>, %n: i64", if *residual { "%res: !llvm.ptr<1>, " } else { "" })
        }
        KernelSpec::SeededInit { dtype } => {
            let i = b.open_guarded_gid();
            // a tensor-parallel shard reads element j of the full tensor's stream:
            // j = i (contiguous, stride 0) or (i / len) * stride + col0 + i % len
            let q = b.op(&format!("arith.divui {i}, %len : i64"));
            let rem = b.op(&format!("arith.remui {i}, %len : i64"));
            let qs = b.op(&format!("arith.muli {q}, %stride : i64"));
            let j1 = b.op(&format!("arith.addi {qs}, %col0 : i64"));
            let j2 = b.op(&format!("arith.addi {j1}, {rem} : i64"));
            let zero = b.ci64(0);
            let contiguous = b.op(&format!("arith.cmpi eq, %stride, {zero} : i64"));
            let j = b.op(&format!("arith.select {contiguous}, {i}, {j2} : i64"));
            // splitmix64(base + j)
            let mut z = b.op(&format!("arith.addi %base, {j} : i64"));
            let k0 = b.ci64(0x9E37_79B9_7F4A_7C15u64 as i64);
            z = b.op(&format!("arith.addi {z}, {k0} : i64"));
            for (sh, mul) in [(30u32, 0xBF58_476D_1CE4_E5B9u64), (27, 0x94D0_49BB_1331_11EB)] {
                let c = b.ci64(sh as i64);
                let t = b.op(&format!("arith.shrui {z}, {c} : i64"));
                let x = b.op(&format!("arith.xori {z}, {t} : i64"));
                let m = b.ci64(mul as i64);
                z = b.op(&format!("arith.muli {x}, {m} : i64"));
            }
            let c31 = b.ci64(31);
            let t = b.op(&format!("arith.shrui {z}, {c31} : i64"));
            let r = b.op(&format!("arith.xori {z}, {t} : i64"));
            let c40 = b.ci64(40);
            let top = b.op(&format!("arith.shrui {r}, {c40} : i64"));
            let uf = b.op(&format!("arith.uitofp {top} : i64 to f32"));
            let inv = b.cf32(1.0 / (1u64 << 24) as f32);
            let u = b.op(&format!("arith.mulf {uf}, {inv} : f32"));
            let two = b.cf32(2.0);
            let one = b.cf32(1.0);
            let u2 = b.op(&format!("arith.mulf {u}, {two} : f32"));
            let u3 = b.op(&format!("arith.subf {u2}, {one} : f32"));
            let sb = b.op("arith.trunci %scale : i64 to i32");
            let sc = b.op(&format!("arith.bitcast {sb} : i32 to f32"));
            let v = b.op(&format!("arith.mulf {u3}, {sc} : f32"));
            let c0 = b.ci64(0);
            let is1 = b.op(&format!("arith.cmpi ne, %ones, {c0} : i64"));
            let v = b.op(&format!("arith.select {is1}, {one}, {v} : f32"));
            match dtype {
                DType::F32 => b.store(&v, "%y", &i),
                DType::BF16 => {
                    // round to nearest even on the dropped 16 bits (no NaNs arise here)
                    let bits = b.op(&format!("arith.bitcast {v} : f32 to i32"));
                    let c16 = b.op("arith.constant 16 : i32");
                    let c1 = b.op("arith.constant 1 : i32");
                    let bias = b.op("arith.constant 32767 : i32");
                    let lsb = b.op(&format!("arith.shrui {bits}, {c16} : i32"));
                    let lsb = b.op(&format!("arith.andi {lsb}, {c1} : i32"));
                    let r1 = b.op(&format!("arith.addi {bits}, {bias} : i32"));
                    let r2 = b.op(&format!("arith.addi {r1}, {lsb} : i32"));
                    let hi = b.op(&format!("arith.shrui {r2}, {c16} : i32"));
                    let h = b.op(&format!("arith.trunci {hi} : i32 to i16"));
                    let p = b.op(&format!("llvm.getelementptr %y[{i}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i16"));
                    b.line(&format!("llvm.store {h}, {p} : i16, !llvm.ptr<1>"));
                }
                DType::F16 => {
                    let h = b.op(&format!("arith.truncf {v} : f32 to f16"));
                    let p = b.op(&format!("llvm.getelementptr %y[{i}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f16"));
                    b.line(&format!("llvm.store {h}, {p} : f16, !llvm.ptr<1>"));
                }
                other => return Err(format!("seeded weights in {other} are not generated on the GPU")),
            }
            b.line("}");
            "%y: !llvm.ptr<1>, %n: i64, %base: i64, %scale: i64, %ones: i64, %len: i64, %stride: i64, %col0: i64".into()
        }
        KernelSpec::MatMulMma { k, n: _, wdtype, bias, residual } => {
            if k % 16 != 0 {
                return Err(format!("the tensor-core matmul needs K a multiple of 16, got {k}"));
            }
            if !matches!(wdtype, DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0 | DType::Q4_1) {
                return Err(format!("matmul weights in {wdtype} are not lowered yet"));
            }
            // f16 operands for f16 and block-quantized weights (their f16 scales dequantize
            // exactly enough in f16; 4x finer than bf16), bf16 for bf16 and f32 weights
            let f16 = tensor_core_f16(*wdtype);
            let Launch::WarpPerTile { warps_per_block } = spec.launch() else { unreachable!() };
            let t = b.op("gpu.thread_id x");
            let bx = b.op("gpu.block_id x");
            let by = b.op("gpu.block_id y");
            let (lane, warp) = b.lane_warp(&t);
            let lane = b.idx64(&lane);
            let warp = b.idx64(&warp);
            let bx = b.idx64(&bx);
            let by = b.idx64(&by);
            let c4 = b.ci64(4);
            let c2 = b.ci64(2);
            let c8 = b.ci64(8);
            let c16 = b.ci64(16);
            let g = b.op(&format!("arith.divui {lane}, {c4} : i64"));
            let tig = b.op(&format!("arith.remui {lane}, {c4} : i64"));
            let wpb = b.ci64(warps_per_block as i64);
            let tile = b.op(&format!("arith.muli {bx}, {wpb} : i64"));
            let tile = b.op(&format!("arith.addi {tile}, {warp} : i64"));
            let n0 = b.op(&format!("arith.muli {tile}, {c8} : i64"));
            let m0 = b.op(&format!("arith.muli {by}, {c16} : i64"));
            let ok = b.op(&format!("arith.cmpi slt, {n0}, %n : i64"));
            b.line(&format!("scf.if {ok} {{"));
            let kk = b.ci64(*k as i64);
            // A rows this lane loads: m0 + g and m0 + g + 8 (clamped; masked rows read row 0)
            let ra = b.op(&format!("arith.addi {m0}, {g} : i64"));
            let rb = b.op(&format!("arith.addi {ra}, {c8} : i64"));
            let c0 = b.ci64(0);
            let va = b.op(&format!("arith.cmpi slt, {ra}, %m : i64"));
            let vb = b.op(&format!("arith.cmpi slt, {rb}, %m : i64"));
            let ra_s = b.op(&format!("arith.select {va}, {ra}, {c0} : i64"));
            let rb_s = b.op(&format!("arith.select {vb}, {rb}, {c0} : i64"));
            let xa = b.op(&format!("arith.muli {ra_s}, {kk} : i64"));
            let xb = b.op(&format!("arith.muli {rb_s}, {kk} : i64"));
            // B column (W row) this lane loads: n0 + g
            let wn = b.op(&format!("arith.addi {n0}, {g} : i64"));
            let wrow = b.op(&format!("arith.muli {wn}, {kk} : i64"));
            let tig2 = b.op(&format!("arith.muli {tig}, {c2} : i64"));
            let zero = b.cf32(0.0);
            let c1 = b.ci64(1);
            let ki = b.op(&format!("arith.constant {k} : index"));
            let zi = b.op("arith.constant 0 : index");
            let si = b.op("arith.constant 16 : index");
            let res = b.v();
            let kv = b.v();
            let accs: Vec<String> = (0..4).map(|_| b.v()).collect();
            b.line(&format!("{res}:4 = scf.for {kv} = {zi} to {ki} step {si} iter_args({}) -> (f32, f32, f32, f32) {{", accs.iter().map(|a| format!("{a} = {zero}")).collect::<Vec<_>>().join(", ")));
            let k0 = b.idx64(&kv);
            let kc = b.op(&format!("arith.addi {k0}, {tig2} : i64"));
            let kc8 = b.op(&format!("arith.addi {kc}, {c8} : i64"));
            // A fragment: (ra, kc..kc+1), (rb, kc..), (ra, kc+8..), (rb, kc+8..)
            let mut areg = vec![];
            for (xr, valid, col) in [(&xa, &va, &kc), (&xb, &vb, &kc), (&xa, &va, &kc8), (&xb, &vb, &kc8)] {
                let i0 = b.op(&format!("arith.addi {xr}, {col} : i64"));
                let i1 = b.op(&format!("arith.addi {i0}, {c1} : i64"));
                let x0 = b.load("%x", &i0);
                let x1 = b.load("%x", &i1);
                let x0 = b.op(&format!("arith.select {valid}, {x0}, {zero} : f32"));
                let x1 = b.op(&format!("arith.select {valid}, {x1}, {zero} : f32"));
                areg.push(b.pack2(&x0, &x1, f16));
            }
            // B fragment: W[wn, kc..kc+1], W[wn, kc+8..kc+9]
            let mut breg = vec![];
            for col in [&kc, &kc8] {
                let e0 = b.op(&format!("arith.addi {wrow}, {col} : i64"));
                let e1 = b.op(&format!("arith.addi {e0}, {c1} : i64"));
                let w0 = b.weight_elem("%w", &e0, *wdtype)?;
                let w1 = b.weight_elem("%w", &e1, *wdtype)?;
                breg.push(b.pack2(&w0, &w1, f16));
            }
            let ty = if f16 { "f16" } else { "bf16" };
            let outs = b.mma_m16n8k16(ty, [&areg[0], &areg[1], &areg[2], &areg[3]], &breg[0], &breg[1], [&accs[0], &accs[1], &accs[2], &accs[3]]);
            b.line(&format!("scf.yield {} : f32, f32, f32, f32", outs.join(", ")));
            b.line("}");
            // D: (ra, n0 + tig*2 + {0,1}) = res#0,1; (rb, ...) = res#2,3
            let nc = b.op(&format!("arith.addi {n0}, {tig2} : i64"));
            for (i, (row, valid)) in [(0usize, (&ra, &va)), (1, (&ra, &va)), (2, (&rb, &vb)), (3, (&rb, &vb))] {
                let col = if i % 2 == 0 { nc.clone() } else { b.op(&format!("arith.addi {nc}, {c1} : i64")) };
                let colok = b.op(&format!("arith.cmpi slt, {col}, %n : i64"));
                let both = b.op(&format!("arith.andi {valid}, {colok} : i1"));
                b.line(&format!("scf.if {both} {{"));
                b.matmul_store(&format!("{res}#{i}"), row, &col, *bias, *residual);
                b.line("}");
            }
            b.line("}");
            matmul_params(*bias, *residual, true)
        }
        KernelSpec::QkvRopeSplitK { inner, splits } => {
            if !matches!(inner.as_ref(), KernelSpec::QkvRopeCache { .. }) || *splits < 2 {
                return Err(format!("the split-K Q/K/V sums fold into QkvRopeCache over 2+ slices, not {} over {splits}", inner.symbol()));
            }
            for (x, o) in [("%xq", "%oq"), ("%xk", "%ok"), ("%xv", "%ov")] {
                b.line(&format!("{x} = llvm.getelementptr %parts[{o}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, f32"));
            }
            b.sum_slices = Some(*splits);
            let params = emit_into(b, inner)?;
            b.sum_slices = None;
            params.replacen("%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>", "%parts: !llvm.ptr<1>", 1).replacen("%nk: i64", "%nk: i64, %slice: i64, %oq: i64, %ok: i64, %ov: i64", 1)
        }
        KernelSpec::SwiGluPipe { inner } => {
            match inner.as_ref() {
                KernelSpec::MatMulPipe { n, bias: false, residual: false, bn, bm, .. } if swiglu_pipe_fits(*n, *bn, *bm) && (!b.tma || b.ws) && b.split_k.is_none() && b.act.is_none() => {}
                other => {
                    return Err(format!(
                        "the SwiGLU epilogue takes an unsplit pipelined matmul without bias or residual whose warpgroup columns halve into 8-column groups and tile F, not {}",
                        other.symbol()
                    ))
                }
            }
            b.swiglu_pipe = true;
            emit_into(b, inner)?.replacen("%w: !llvm.ptr<1>", "%w0: !llvm.ptr<1>, %w1: !llvm.ptr<1>", 1).replacen("%y: !llvm.ptr<1>", "%y: !llvm.ptr<1>, %yh: !llvm.ptr<1>", 1)
        }
        KernelSpec::MatMulPipe { k, n: _, wdtype, bias, residual, bn, stages, overlap, a16, bm } => {
            emit_gemm_pipe(b, *k, *wdtype, *bias, *residual, PipeTiling { bn: *bn, stages: *stages, overlap: *overlap, a16: *a16, bm: *bm })?
        }
        KernelSpec::FlashAttention { h, kvh, d, bs, scale_bits, kv, warps, mtiles } => emit_flash_attention(b, *h, *kvh, *d, *bs, *scale_bits, *kv, *warps, *mtiles)?,
        KernelSpec::MatMulAct { inner, act } => {
            epilogue_act_fits(act.0)?;
            // (a plain matmul kernel: every family ends in `matmul_store`, which applies it)
            if !matches!(
                inner.as_ref(),
                KernelSpec::MatMul { .. }
                    | KernelSpec::MatMulWide { .. }
                    | KernelSpec::MatMulFew { .. }
                    | KernelSpec::MatMulFewX16 { .. }
                    | KernelSpec::MatMulMma { .. }
                    | KernelSpec::MatMulWgmma { .. }
                    | KernelSpec::MatMulPipe { .. }
            ) {
                return Err(format!("{} takes no activation epilogue", inner.symbol()));
            }
            b.act = Some(act.0);
            emit_into(b, inner)?
        }
        KernelSpec::GatherX { inner } => {
            let ok = match inner.as_ref() {
                KernelSpec::NormMatMul { inner: mm, .. } => match mm.as_ref() {
                    KernelSpec::MatMulParts { inner: core, .. } => matches!(core.as_ref(), KernelSpec::MatMul { wdtype: DType::BF16 | DType::F16, bias: false, residual: false, .. }),
                    KernelSpec::MatMul { wdtype: DType::BF16 | DType::F16, bias: false, residual: false, .. } => true,
                    _ => false,
                },
                _ => false,
            };
            if !ok {
                return Err(format!("the gathered x rides on the one-row 16-bit GEMV with the norm prologue, not {}", inner.symbol()));
            }
            b.gather_x = true;
            let params = emit_into(b, inner)?;
            if !params.starts_with("%x: !llvm.ptr<1>, ") {
                return Err(format!("{}: x is not the first parameter", inner.symbol()));
            }
            format!("%table: !llvm.ptr<1>, %tok: !llvm.ptr<1>, {params}")
        }
        KernelSpec::ArgmaxFold { inner } => {
            // (bias, residual and activations: refused by `emit_gemv_wide`)
            let plain = |k: &KernelSpec| matches!(k, KernelSpec::MatMulWide { .. });
            let normed = |k: &KernelSpec| match k {
                KernelSpec::NormMatMul { inner: mm, .. } => plain(mm),
                other => plain(other),
            };
            let ok = match inner.as_ref() {
                KernelSpec::RowGather { inner: g } => normed(g),
                other => normed(other),
            };
            if !ok {
                return Err(format!("the argmax folds into the wide GEMV, not {}", inner.symbol()));
            }
            b.argmax_fold = true;
            format!("%apart: !llvm.ptr<1>, %async: !llvm.ptr<1>, %aids: !llvm.ptr<1>, {}", emit_into(b, inner)?)
        }
        KernelSpec::RowGather { inner } => {
            let wide = |k: &KernelSpec| matches!(k, KernelSpec::MatMulWide { .. });
            let ok = match inner.as_ref() {
                KernelSpec::RmsNorm { d, .. } | KernelSpec::RmsNormHalf { d, .. } => d % 4 == 0,
                KernelSpec::NormMatMul { inner: mm, .. } => wide(mm),
                other => wide(other),
            };
            if !ok {
                return Err(format!("the row gather rides on the block-per-row RMSNorm or the wide GEMV, not {}", inner.symbol()));
            }
            b.row_gather = true;
            format!("%idx: !llvm.ptr<1>, {}", emit_into(b, inner)?)
        }
        KernelSpec::ZeroFill { inner, len } => {
            if !matches!(inner.as_ref(), KernelSpec::NormMatMul { .. } | KernelSpec::SwiGluDown { .. } | KernelSpec::Gather { .. } | KernelSpec::GatherX { .. }) {
                return Err(format!("the zero fill rides on the one-row GEMV with the norm prologue, the fused MLP or the embedding gather, not {}", inner.symbol()));
            }
            let params = emit_into(b, inner)?;
            // (at the end: every thread is past the PDL wait; grid x covers at least `len`
            // threads in any part of a merged GEMV — checked by the lowering)
            let t = b.op("gpu.thread_id x");
            let bx = b.op("gpu.block_id x");
            let nt = b.op("gpu.block_dim x");
            let i = b.op(&format!("arith.muli {bx}, {nt} : index"));
            let i = b.op(&format!("arith.addi {i}, {t} : index"));
            let i = b.idx64(&i);
            let cl = b.ci64(*len as i64);
            let mine = b.op(&format!("arith.cmpi slt, {i}, {cl} : i64"));
            b.line(&format!("scf.if {mine} {{"));
            let zero = b.cf32(0.0);
            b.store(&zero, "%z0", &i);
            b.store(&zero, "%z1", &i);
            b.line("}");
            format!("%z0: !llvm.ptr<1>, %z1: !llvm.ptr<1>, {params}")
        }
        KernelSpec::MatMulCopy { inner } => {
            if !matches!(inner.as_ref(), KernelSpec::MatMul { wdtype: DType::F32 | DType::F16 | DType::BF16, .. }) {
                return Err(format!("the output copy is for the plain-float decode GEMV, not {}", inner.symbol()));
            }
            b.copy_y = true;
            emit_into(b, inner)?.replacen("%y: !llvm.ptr<1>", "%y2: !llvm.ptr<1>, %y: !llvm.ptr<1>", 1)
        }
        KernelSpec::SwiGluDown { k, f, n, eps_bits, fb, fpw } => {
            swiglu_down_fits(*k, *f, *n, *fb, *fpw)?;
            emit_swiglu_down(b, *k, *f, *n, f32::from_bits(*eps_bits), *fb, *fpw)?;
            "%x: !llvm.ptr<1>, %g: !llvm.ptr<1>, %wg: !llvm.ptr<1>, %wu: !llvm.ptr<1>, %wd: !llvm.ptr<1>, %y: !llvm.ptr<1>, %f: i64".into()
        }
        KernelSpec::SwiGluGemv { k, f, wdtype } => {
            swiglu_fits(*k, *f, *wdtype)?;
            b.swiglu = true;
            emit_gemv(b, *k, *f, *wdtype, false, false, 1)?;
            "%x: !llvm.ptr<1>, %w0: !llvm.ptr<1>, %w1: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        KernelSpec::ToHalf { f16 } => {
            // 8 elements per thread: two 16-byte loads, one 16-byte store
            let i = b.open_guarded_gid();
            let c32 = b.ci64(32);
            let c16 = b.ci64(16);
            let o = b.op(&format!("arith.muli {i}, {c32} : i64"));
            let o2 = b.op(&format!("arith.addi {o}, {c16} : i64"));
            let mut v = b.load_vec("%x", &o, 4, "f32", 16);
            v.extend(b.load_vec("%x", &o2, 4, "f32", 16));
            let packed: Vec<String> = (0..4).map(|j| b.pack2(&v[2 * j], &v[2 * j + 1], *f16)).collect();
            let vec_v = b.vector(&packed, "i32");
            let so = b.op(&format!("arith.muli {i}, {c16} : i64"));
            let p = b.op(&format!("llvm.getelementptr %y[{so}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
            b.line(&format!("llvm.store {vec_v}, {p} {{alignment = 16 : i64}} : vector<4xi32>, !llvm.ptr<1>"));
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".to_string()
        }
        KernelSpec::MatMulWgmma { k, n: _, wdtype, bias, residual, n_tile } => {
            let nt = *n_tile;
            if nt != 16 && nt != 64 {
                return Err(format!("wgmma n_tile must be 16 or 64, got {nt}"));
            }
            let nacc = nt / 2;
            if k % 64 != 0 {
                return Err(format!("the wgmma matmul needs K a multiple of 64, got {k}"));
            }
            if !matches!(wdtype, DType::F32 | DType::F16 | DType::BF16 | DType::Q8_0 | DType::Q4_0 | DType::Q4_1) {
                return Err(format!("matmul weights in {wdtype} are not lowered yet"));
            }
            // f16 operands for f16 and block-quantized weights (their f16 scales dequantize
            // exactly enough in f16; 4x finer than bf16), bf16 for bf16 and f32 weights
            let f16 = tensor_core_f16(*wdtype);
            let ty = if f16 { "f16" } else { "bf16" };
            // shared memory: A tile [64 rows x 64 k] then B tile [64 n x 64 k], 16-bit elements
            // packed in pairs along k (i32), in 8x8 core matrices of 128 bytes: core matrix
            // (row / 8, k / 8) at ((row / 8) * 8 + k / 8) * 128 bytes, row r % 8 at 16 * (r % 8)
            b.workgroup = Some("%sm : memref<4096xi32, #gpu.address_space<workgroup>>".into());
            let t = b.op("gpu.thread_id x");
            let bx = b.op("gpu.block_id x");
            let by = b.op("gpu.block_id y");
            let t = b.idx64(&t);
            let bx = b.idx64(&bx);
            let by = b.idx64(&by);
            let c64 = b.ci64(64);
            let cnt = b.ci64(nt as i64);
            let n0 = b.op(&format!("arith.muli {bx}, {cnt} : i64"));
            let m0 = b.op(&format!("arith.muli {by}, {c64} : i64"));
            let kk = b.ci64(*k as i64);
            let zero = b.cf32(0.0);
            let c0 = b.ci64(0);
            let c2 = b.ci64(2);
            let c4 = b.ci64(4);
            let c8 = b.ci64(8);
            // the tile's shared-memory address for the descriptors
            let base = b.op("memref.extract_aligned_pointer_as_index %sm : memref<4096xi32, #gpu.address_space<workgroup>> -> index");
            let base = b.idx64(&base);
            // descriptor = (addr >> 4) | (LBO 128 >> 4) << 16 | (SBO 1024 >> 4) << 32, no swizzle
            let fixed = b.ci64(((128u64 >> 4) << 16 | (1024u64 >> 4) << 32) as i64);
            let mk = |b: &mut Body, off: i64| -> String {
                let o = b.ci64(off);
                let a = b.op(&format!("arith.addi {base}, {o} : i64"));
                let mask = b.ci64(0x3FFFF);
                let a = b.op(&format!("arith.andi {a}, {mask} : i64"));
                let a = b.op(&format!("arith.shrui {a}, {c4} : i64"));
                b.op(&format!("arith.ori {a}, {fixed} : i64"))
            };
            let da: Vec<String> = (0..4).map(|s| mk(b, 256 * s)).collect();
            let db: Vec<String> = (0..4).map(|s| mk(b, 8192 + 256 * s)).collect();
            let ki = b.op(&format!("arith.constant {k} : index"));
            let zi = b.op("arith.constant 0 : index");
            let si = b.op("arith.constant 64 : index");
            let res = b.v();
            let kv = b.v();
            let accs: Vec<String> = (0..nacc).map(|_| b.v()).collect();
            let f32s = vec!["f32"; nacc].join(", ");
            b.line(&format!("{res}:{nacc} = scf.for {kv} = {zi} to {ki} step {si} iter_args({}) -> ({f32s}) {{", accs.iter().map(|a| format!("{a} = {zero}")).collect::<Vec<_>>().join(", ")));
            let k0 = b.idx64(&kv);
            // stage: each thread moves 4 core-matrix rows (8 k-values, 16 bytes in shared
            // memory) of A and 4 of B; 8 consecutive threads cover one 64-wide row (coalesced)
            for (is_b, off) in [(false, 0i64), (true, 8192)] {
                // A: 64 rows x 8 chunks = 512 units; B: n_tile rows x 8 chunks
                let units = if is_b { nt as i64 * 8 } else { 512 };
                for i in 0..units / 128 {
                    let ci = b.ci64(128 * i);
                    let u = b.op(&format!("arith.addi {t}, {ci} : i64"));
                    let row = b.op(&format!("arith.divui {u}, {c8} : i64"));
                    let kc = b.op(&format!("arith.remui {u}, {c8} : i64"));
                    let kl = b.op(&format!("arith.muli {kc}, {c8} : i64"));
                    let kg = b.op(&format!("arith.addi {k0}, {kl} : i64"));
                    let (r0, lim) = if is_b { (&n0, "%n") } else { (&m0, "%m") };
                    let gr = b.op(&format!("arith.addi {r0}, {row} : i64"));
                    let valid = b.op(&format!("arith.cmpi slt, {gr}, {lim} : i64"));
                    let grs = b.op(&format!("arith.select {valid}, {gr}, {c0} : i64"));
                    let rbase = b.op(&format!("arith.muli {grs}, {kk} : i64"));
                    let e0 = b.op(&format!("arith.addi {rbase}, {kg} : i64"));
                    let packed: Vec<String> = if is_b && matches!(wdtype, DType::BF16 | DType::F16) {
                        // eight 16-bit weights in one 16-byte load, already in pairs
                        let bo = b.op(&format!("arith.muli {e0}, {c2} : i64"));
                        b.load_vec("%w", &bo, 4, "i32", 16)
                    } else {
                        let vals: Vec<String> = if is_b {
                            let mut v = vec![];
                            for j in 0..8 {
                                let cj = b.ci64(j);
                                let e = b.op(&format!("arith.addi {e0}, {cj} : i64"));
                                v.push(b.weight_elem("%w", &e, *wdtype)?);
                            }
                            v
                        } else {
                            // rows past M are not loaded at all (batched decode has few rows)
                            let bo = b.op(&format!("arith.muli {e0}, {c4} : i64"));
                            let c16b = b.ci64(16);
                            let bo2 = b.op(&format!("arith.addi {bo}, {c16b} : i64"));
                            let r = b.v();
                            let f8 = vec!["f32"; 8].join(", ");
                            b.line(&format!("{r}:8 = scf.if {valid} -> ({f8}) {{"));
                            let mut v = b.load_vec("%x", &bo, 4, "f32", 16);
                            v.extend(b.load_vec("%x", &bo2, 4, "f32", 16));
                            b.line(&format!("scf.yield {} : {f8}", v.join(", ")));
                            b.line("} else {");
                            b.line(&format!("scf.yield {} : {f8}", vec![zero.as_str(); 8].join(", ")));
                            b.line("}");
                            (0..8).map(|j| format!("{r}#{j}")).collect()
                        };
                        (0..4).map(|j| b.pack2(&vals[2 * j], &vals[2 * j + 1], f16)).collect()
                    };
                    let zi32 = b.op("arith.constant 0 : i32");
                    let mut vec_v = b.op("llvm.mlir.undef : vector<4xi32>");
                    for (j, p) in packed.iter().enumerate() {
                        let pj = b.op(&format!("arith.select {valid}, {p}, {zi32} : i32"));
                        let cj = b.op(&format!("arith.constant {j} : i32"));
                        vec_v = b.op(&format!("llvm.insertelement {pj}, {vec_v}[{cj} : i32] : vector<4xi32>"));
                    }
                    // byte offset: ((row/8)*8 + kc) * 128 + (row%8) * 16
                    let rg = b.op(&format!("arith.divui {row}, {c8} : i64"));
                    let rr = b.op(&format!("arith.remui {row}, {c8} : i64"));
                    let cm = b.op(&format!("arith.muli {rg}, {c8} : i64"));
                    let cm = b.op(&format!("arith.addi {cm}, {kc} : i64"));
                    let c128b = b.ci64(128);
                    let cm = b.op(&format!("arith.muli {cm}, {c128b} : i64"));
                    let c16b = b.ci64(16);
                    let ri = b.op(&format!("arith.muli {rr}, {c16b} : i64"));
                    let so = b.op(&format!("arith.addi {cm}, {ri} : i64"));
                    let offc = b.ci64(off);
                    let so = b.op(&format!("arith.addi {so}, {offc} : i64"));
                    let sa = b.op(&format!("arith.addi {base}, {so} : i64"));
                    let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
                    b.line(&format!("llvm.store {vec_v}, {sp} {{alignment = 16 : i64}} : vector<4xi32>, !llvm.ptr<3>"));
                }
            }
            b.line("gpu.barrier");
            // generic-proxy stores must be visible to the async proxy wgmma reads through
            b.line("llvm.inline_asm has_side_effects \"fence.proxy.async.shared::cta;\", \"\"  : () -> ()");
            b.line("llvm.inline_asm has_side_effects \"wgmma.fence.sync.aligned;\", \"\"  : () -> ()");
            let st = format!("!llvm.struct<({f32s})>");
            let mut cur: Vec<String> = accs.clone();
            for s in 0..4 {
                let outs: Vec<String> = (0..nacc).map(|i| format!("${i}")).collect();
                let cons = format!("{},l,l,{}", vec!["=f"; nacc].join(","), (0..nacc).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
                let r = b.op(&format!(
                    "llvm.inline_asm has_side_effects \"wgmma.mma_async.sync.aligned.m64n{nt}k16.f32.{ty}.{ty} {{{}}}, ${nacc}, ${}, 1, 1, 1, 0, 0;\", \"{cons}\" {}, {}, {} : (i64, i64, {f32s}) -> {st}",
                    outs.join(","),
                    nacc + 1,
                    da[s],
                    db[s],
                    cur.join(", ")
                ));
                cur = (0..nacc).map(|i| b.op(&format!("llvm.extractvalue {r}[{i}] : {st}"))).collect();
            }
            b.line("llvm.inline_asm has_side_effects \"wgmma.commit_group.sync.aligned;\", \"\"  : () -> ()");
            // wait, passing the accumulators through so nothing reads them early
            let cons = format!("{},{}", vec!["=f"; nacc].join(","), (0..nacc).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
            let r = b.op(&format!("llvm.inline_asm has_side_effects \"wgmma.wait_group.sync.aligned 0;\", \"{cons}\" {} : ({f32s}) -> {st}", cur.join(", ")));
            let done: Vec<String> = (0..nacc).map(|i| b.op(&format!("llvm.extractvalue {r}[{i}] : {st}"))).collect();
            b.line("gpu.barrier");
            b.line(&format!("scf.yield {} : {f32s}", done.join(", ")));
            b.line("}");
            // D fragment: warp w rows 16w + g (+8), columns 8j + 2 (lane % 4) (+1)
            let (warp, _, g, tq) = b.mma_coords(&t);
            let c16 = b.ci64(16);
            let wr = b.op(&format!("arith.muli {warp}, {c16} : i64"));
            let ra = b.op(&format!("arith.addi {m0}, {wr} : i64"));
            let ra = b.op(&format!("arith.addi {ra}, {g} : i64"));
            let vals: Vec<String> = (0..nacc).map(|i| format!("{res}#{i}")).collect();
            b.store_d_fragments(&ra, &n0, &tq, nt, &vals, *bias, *residual);
            matmul_params(*bias, *residual, true)
        }
        KernelSpec::Softmax { d } => {
            let (lane, base, dd, c32) = b.open_row(*d, 4);
            let m = b.row_reduce(&lane, &base, &dd, &c32, &|_, x| x.to_string(), true);
            let mm = m.clone();
            let sum = b.row_reduce(
                &lane,
                &base,
                &dd,
                &c32,
                &move |b, x| {
                    let t = b.op(&format!("arith.subf {x}, {mm} : f32"));
                    b.exp(&t)
                },
                false,
            );
            let iv = b.v();
            b.line(&format!("scf.for {iv} = {lane} to {dd} step {c32} {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let x = b.load("%x", &idx);
            let t = b.op(&format!("arith.subf {x}, {m} : f32"));
            let e = b.exp(&t);
            let y = b.op(&format!("arith.divf {e}, {sum} : f32"));
            b.store(&y, "%y", &idx);
            b.line("}");
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::LayerNorm { d, eps_bits, half } => {
            let (lane, base, dd, c32) = b.open_row(*d, 4);
            let df = b.cf32(*d as f32);
            let s1 = b.row_reduce(&lane, &base, &dd, &c32, &|_, x| x.to_string(), false);
            let mean = b.op(&format!("arith.divf {s1}, {df} : f32"));
            let mm = mean.clone();
            let s2 = b.row_reduce(
                &lane,
                &base,
                &dd,
                &c32,
                &move |b, x| {
                    let t = b.op(&format!("arith.subf {x}, {mm} : f32"));
                    b.op(&format!("arith.mulf {t}, {t} : f32"))
                },
                false,
            );
            let var = b.op(&format!("arith.divf {s2}, {df} : f32"));
            let e = b.cf32(f32::from_bits(*eps_bits));
            let ve = b.op(&format!("arith.addf {var}, {e} : f32"));
            let sd = b.asm1("sqrt.rn.f32", &ve);
            let one = b.cf32(1.0);
            let inv = b.op(&format!("arith.divf {one}, {sd} : f32"));
            let iv = b.v();
            b.line(&format!("scf.for {iv} = {lane} to {dd} step {c32} {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let wi = b.op(&format!("arith.index_cast {iv} : index to i64"));
            let x = b.load("%x", &idx);
            let w = b.load("%w", &wi);
            let bb = b.load("%b", &wi);
            let xc = b.op(&format!("arith.subf {x}, {mean} : f32"));
            let xn = b.op(&format!("arith.mulf {xc}, {inv} : f32"));
            let y = b.op(&format!("llvm.intr.fma({xn}, {w}, {bb}) : (f32, f32, f32) -> f32"));
            b.store(&y, "%y", &idx);
            if let Some(f16) = half {
                b.store_half1(&y, "%yh", &idx, *f16);
            }
            b.line("}");
            b.line("}");
            format!("%x: !llvm.ptr<1>, %w: !llvm.ptr<1>, %b: !llvm.ptr<1>, %y: !llvm.ptr<1>, {}%rows: i64", if half.is_some() { "%yh: !llvm.ptr<1>, " } else { "" })
        }
        KernelSpec::Argmax { d } if d % 4 == 0 => {
            // a block per row: thread t takes the row's 16-byte pieces t, t + T, t + 2T, ...,
            // ARGMAX_UNROLL loads issued before their compares; (max, first index) per
            // thread, then over the warp, then warp 0 over the warps' results
            let Launch::BlockPerRow { warps } = spec.launch() else { unreachable!() };
            let warps = warps as usize;
            let nt = 32 * warps;
            let (u, nvec) = (ARGMAX_UNROLL, d / 4);
            let iters = nvec.div_ceil(nt * u);
            let (smv, smi) = (format!("memref<{warps}xf32, #gpu.address_space<workgroup>>"), format!("memref<{warps}xi32, #gpu.address_space<workgroup>>"));
            b.workgroup = Some(format!("%redv : {smv}, %redi : {smi}"));
            let (t, rowi) = b.open_block_row();
            let t64 = b.idx64(&t);
            let cd = b.ci64(*d as i64);
            let base = b.op(&format!("arith.muli {rowi}, {cd} : i64"));
            let ninf = b.op("arith.constant 0xFF800000 : f32");
            let big = b.op("arith.constant 2147483647 : i32");
            let (c0, c1, cit) = (b.op("arith.constant 0 : index"), b.op("arith.constant 1 : index"), b.op(&format!("arith.constant {iters} : index")));
            let (res, it, bv, bi) = (b.v(), b.v(), b.v(), b.v());
            b.line(&format!("{res}:2 = scf.for {it} = {c0} to {cit} step {c1} iter_args({bv} = {ninf}, {bi} = {big}) -> (f32, i32) {{"));
            let it64 = b.idx64(&it);
            let cstep = b.ci64((nt * u) as i64);
            let j0 = b.op(&format!("arith.muli {it64}, {cstep} : i64"));
            let j0 = b.op(&format!("arith.addi {j0}, {t64} : i64"));
            let (cnv, z, c4) = (b.ci64(nvec as i64), b.ci64(0), b.ci64(4));
            let row = ArgmaxRow { base: &base, j0: &j0, bound: &cnv, z: &z, c4: &c4, ninf: &ninf, big: &big };
            let (v, i) = argmax_pieces_from(b, &row, u, nt, &bv, &bi);
            b.line(&format!("scf.yield {v}, {i} : f32, i32"));
            b.line("}");
            let (lane, warp, c0) = argmax_warps_to_shared(b, &format!("{res}#0"), &format!("{res}#1"), &t, &smv, &smi);
            let w0 = b.op(&format!("arith.cmpi eq, {warp}, {c0} : index"));
            b.line(&format!("scf.if {w0} {{"));
            // (lanes past the warps' count take -inf and the largest index)
            let cw = b.op(&format!("arith.constant {warps} : index"));
            let has = b.op(&format!("arith.cmpi ult, {lane}, {cw} : index"));
            let cwm = b.op(&format!("arith.constant {} : index", warps - 1));
            let lc = b.op(&format!("arith.minui {lane}, {cwm} : index"));
            let pv = b.op(&format!("memref.load %redv[{lc}] : {smv}"));
            let pi = b.op(&format!("memref.load %redi[{lc}] : {smi}"));
            let fi = argmax_settle(b, &pv, &pi, Some(&has), &ninf, &big);
            let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
            b.line(&format!("scf.if {first} {{"));
            let p = b.op(&format!("llvm.getelementptr %y[{rowi}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
            b.line(&format!("llvm.store {fi}, {p} : i32, !llvm.ptr<1>"));
            b.line("}");
            b.line("}");
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::ArgmaxCluster { d, blocks } => {
            emit_argmax_cluster(b, *d, *blocks)?;
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::ArgmaxSplit { d, splits } => {
            emit_argmax_split(b, *d, *splits)?;
            "%x: !llvm.ptr<1>, %part: !llvm.ptr<1>, %sync: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::Argmax { d } => {
            let (lane, base, dd, c32) = b.open_row(*d, 4);
            let ninf = b.op("arith.constant 0xFF800000 : f32");
            let big = b.op("arith.constant 2147483647 : i32");
            let res = b.v();
            let (iv, bv, bi) = (b.v(), b.v(), b.v());
            b.line(&format!("{res}:2 = scf.for {iv} = {lane} to {dd} step {c32} iter_args({bv} = {ninf}, {bi} = {big}) -> (f32, i32) {{"));
            let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
            let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
            let x = b.load("%x", &idx);
            let i32v = b.op(&format!("arith.index_cast {iv} : index to i32"));
            let gt = b.op(&format!("arith.cmpf ogt, {x}, {bv} : f32"));
            let nv = b.op(&format!("arith.select {gt}, {x}, {bv} : f32"));
            let ni = b.op(&format!("arith.select {gt}, {i32v}, {bi} : i32"));
            b.line(&format!("scf.yield {nv}, {ni} : f32, i32"));
            b.line("}");
            let (_, i) = b.warp_argmax(&format!("{res}#0"), &format!("{res}#1"));
            let c0 = b.op("arith.constant 0 : index");
            let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
            b.line(&format!("scf.if {first} {{"));
            let row = b.op(&format!("arith.divui {base}, {dd} : index"));
            let row = b.op(&format!("arith.index_cast {row} : index to i64"));
            let p = b.op(&format!("llvm.getelementptr %y[{row}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
            b.line(&format!("llvm.store {i}, {p} : i32, !llvm.ptr<1>"));
            b.line("}");
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::Slice { inner, d, start, len } => {
            let o = b.open_guarded_gid();
            let ci = b.ci64(*inner as i64);
            let cl = b.ci64(*len as i64);
            let cd = b.ci64(*d as i64);
            let cs = b.ci64(*start as i64);
            let inn = b.op(&format!("arith.remui {o}, {ci} : i64"));
            let t = b.op(&format!("arith.divui {o}, {ci} : i64"));
            let ax = b.op(&format!("arith.remui {t}, {cl} : i64"));
            let outer = b.op(&format!("arith.divui {t}, {cl} : i64"));
            let r = b.op(&format!("arith.muli {outer}, {cd} : i64"));
            let r = b.op(&format!("arith.addi {r}, {cs} : i64"));
            let r = b.op(&format!("arith.addi {r}, {ax} : i64"));
            let r = b.op(&format!("arith.muli {r}, {ci} : i64"));
            let src = b.op(&format!("arith.addi {r}, {inn} : i64"));
            let x = b.load("%x", &src);
            b.store(&x, "%y", &o);
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        KernelSpec::TakeAlong { n_in, k } => {
            let o = b.open_guarded_gid();
            let ck = b.ci64(*k as i64);
            let cn = b.ci64(*n_in as i64);
            let r = b.op(&format!("arith.divui {o}, {ck} : i64"));
            let j = b.load_i32_as_i64("%idx", &o);
            let rb = b.op(&format!("arith.muli {r}, {cn} : i64"));
            let src = b.op(&format!("arith.addi {rb}, {j} : i64"));
            let x = b.load("%x", &src);
            b.store(&x, "%y", &o);
            b.line("}");
            "%x: !llvm.ptr<1>, %idx: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        KernelSpec::TopK { d, k } => {
            let (lane, base, dd, c32) = b.open_row(*d, 4);
            let row = b.op(&format!("arith.divui {base}, {dd} : index"));
            let row = b.op(&format!("arith.index_cast {row} : index to i64"));
            let ck = b.ci64(*k as i64);
            let obase = b.op(&format!("arith.muli {row}, {ck} : i64"));
            // pass p finds the largest (value desc, index asc) element after the previous pick
            let mut pv = b.op("arith.constant 0x7F800000 : f32"); // +inf
            let mut pi = b.op("arith.constant -1 : i32");
            for p in 0..*k {
                let ninf = b.op("arith.constant 0xFF800000 : f32");
                let big = b.op("arith.constant 2147483647 : i32");
                let res = b.v();
                let (iv, bv, bi) = (b.v(), b.v(), b.v());
                b.line(&format!("{res}:2 = scf.for {iv} = {lane} to {dd} step {c32} iter_args({bv} = {ninf}, {bi} = {big}) -> (f32, i32) {{"));
                let idx = b.op(&format!("arith.addi {base}, {iv} : index"));
                let idx = b.op(&format!("arith.index_cast {idx} : index to i64"));
                let x = b.load("%x", &idx);
                let xi = b.op(&format!("arith.index_cast {iv} : index to i32"));
                // eligible: (x < pv) or (x == pv and xi > pi)
                let lt = b.op(&format!("arith.cmpf olt, {x}, {pv} : f32"));
                let eqv = b.op(&format!("arith.cmpf oeq, {x}, {pv} : f32"));
                let gti = b.op(&format!("arith.cmpi sgt, {xi}, {pi} : i32"));
                let after = b.op(&format!("arith.andi {eqv}, {gti} : i1"));
                let elig = b.op(&format!("arith.ori {lt}, {after} : i1"));
                // better: x > bv, or x == bv and xi < bi
                let gt = b.op(&format!("arith.cmpf ogt, {x}, {bv} : f32"));
                let eqb = b.op(&format!("arith.cmpf oeq, {x}, {bv} : f32"));
                let lti = b.op(&format!("arith.cmpi slt, {xi}, {bi} : i32"));
                let tie = b.op(&format!("arith.andi {eqb}, {lti} : i1"));
                let better = b.op(&format!("arith.ori {gt}, {tie} : i1"));
                let take = b.op(&format!("arith.andi {elig}, {better} : i1"));
                let nv = b.op(&format!("arith.select {take}, {x}, {bv} : f32"));
                let ni = b.op(&format!("arith.select {take}, {xi}, {bi} : i32"));
                b.line(&format!("scf.yield {nv}, {ni} : f32, i32"));
                b.line("}");
                let (v, i) = b.warp_argmax(&format!("{res}#0"), &format!("{res}#1"));
                let c0 = b.op("arith.constant 0 : index");
                let first = b.op(&format!("arith.cmpi eq, {lane}, {c0} : index"));
                b.line(&format!("scf.if {first} {{"));
                let cp = b.ci64(p as i64);
                let oi = b.op(&format!("arith.addi {obase}, {cp} : i64"));
                let ptr = b.op(&format!("llvm.getelementptr %y[{oi}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i32"));
                b.line(&format!("llvm.store {i}, {ptr} : i32, !llvm.ptr<1>"));
                b.line("}");
                pv = v;
                pi = i;
            }
            b.line("}");
            "%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %rows: i64".into()
        }
        KernelSpec::Transpose { perm } => {
            let r = perm.len();
            if r == 0 || r > 4 {
                return Err(format!("transpose of rank {r} is not lowered (1..=4)"));
            }
            let o = b.open_guarded_gid();
            // input dims %d0..; output coordinate j runs over input axis perm[j]
            let ind: Vec<String> = (0..r).map(|i| format!("%d{i}")).collect();
            let mut rem = o.clone();
            let mut coord = vec![String::new(); r];
            for j in (0..r).rev() {
                let dim = &ind[perm[j]];
                coord[perm[j]] = b.op(&format!("arith.remui {rem}, {dim} : i64"));
                rem = b.op(&format!("arith.divui {rem}, {dim} : i64"));
            }
            let mut src = coord[0].clone();
            for i in 1..r {
                let m = b.op(&format!("arith.muli {src}, {} : i64", ind[i]));
                src = b.op(&format!("arith.addi {m}, {} : i64", coord[i]));
            }
            let x = b.load("%x", &src);
            b.store(&x, "%y", &o);
            b.line("}");
            let dims: Vec<String> = (0..r).map(|i| format!("%d{i}: i64")).collect();
            format!("%x: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, {}", dims.join(", "))
        }
        KernelSpec::Concat { sizes, inner } => {
            let total: usize = sizes.iter().sum();
            let o = b.open_guarded_gid();
            let ci = b.ci64(*inner as i64);
            let ct = b.ci64(total as i64);
            let inn = b.op(&format!("arith.remui {o}, {ci} : i64"));
            let t = b.op(&format!("arith.divui {o}, {ci} : i64"));
            let a = b.op(&format!("arith.remui {t}, {ct} : i64"));
            let outer = b.op(&format!("arith.divui {t}, {ct} : i64"));
            // pick the operand by the axis coordinate; each branch loads from its own input
            let mut val = b.cf32(0.0);
            let mut start = 0usize;
            for (m, &sz) in sizes.iter().enumerate() {
                let lo = b.ci64(start as i64);
                let hi = b.ci64((start + sz) as i64);
                let ge = b.op(&format!("arith.cmpi uge, {a}, {lo} : i64"));
                let lt = b.op(&format!("arith.cmpi ult, {a}, {hi} : i64"));
                let inr = b.op(&format!("arith.andi {ge}, {lt} : i1"));
                let la = b.op(&format!("arith.subi {a}, {lo} : i64"));
                let csz = b.ci64(sz as i64);
                let r0 = b.op(&format!("arith.muli {outer}, {csz} : i64"));
                let r1 = b.op(&format!("arith.addi {r0}, {la} : i64"));
                let r2 = b.op(&format!("arith.muli {r1}, {ci} : i64"));
                let src = b.op(&format!("arith.addi {r2}, {inn} : i64"));
                // clamp the index for lanes of other operands so the load stays in bounds
                let z = b.ci64(0);
                let safe = b.op(&format!("arith.select {inr}, {src}, {z} : i64"));
                let x = b.load(&format!("%x{m}"), &safe);
                val = b.op(&format!("arith.select {inr}, {x}, {val} : f32"));
                start += sz;
            }
            b.store(&val, "%y", &o);
            b.line("}");
            let xs: Vec<String> = (0..sizes.len()).map(|m| format!("%x{m}: !llvm.ptr<1>")).collect();
            format!("{}, %y: !llvm.ptr<1>, %n: i64", xs.join(", "))
        }
        KernelSpec::Gather { d, dtype } => {
            let i = b.open_guarded_gid();
            let dd = b.ci64(*d as i64);
            let t = b.op(&format!("arith.divui {i}, {dd} : i64"));
            let j = b.op(&format!("arith.remui {i}, {dd} : i64"));
            let row = b.load_i32_as_i64("%idx", &t);
            let rbase = b.op(&format!("arith.muli {row}, {dd} : i64"));
            let e = b.op(&format!("arith.addi {rbase}, {j} : i64"));
            if dtype.is_packed() && d % 32 != 0 {
                return Err(format!("gather from {dtype} needs D a multiple of 32, got {d}"));
            }
            let v = b.weight_elem("%table", &e, *dtype)?;
            b.store(&v, "%y", &i);
            b.line("}");
            "%table: !llvm.ptr<1>, %idx: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
        }
        KernelSpec::Rope { h, d, theta_bits, interleaved } | KernelSpec::RopeCacheWrite { h, d, theta_bits, interleaved, .. } => {
            let to_cache = match spec {
                KernelSpec::RopeCacheWrite { kv, .. } => Some(*kv),
                _ => None,
            };
            let i = b.open_guarded_gid();
            let (t, i0, i1, y0, y1) = b.rope_pair(&i, "%x", *h, *d, *theta_bits, *interleaved);
            if let Some(kv) = to_cache {
                // token t's row of h*d values goes to the pool row slot[t]
                let row = b.ci64((h * d) as i64);
                let slot = b.load_i32_as_i64("%slots", &t);
                let tb = b.op(&format!("arith.muli {t}, {row} : i64"));
                let sb = b.op(&format!("arith.muli {slot}, {row} : i64"));
                for (y, i) in [(&y0, &i0), (&y1, &i1)] {
                    let o = b.op(&format!("arith.subi {i}, {tb} : i64"));
                    let dst = b.op(&format!("arith.addi {sb}, {o} : i64"));
                    b.store_kv(y, "%cache", &dst, kv)?;
                }
                b.line("}");
                "%x: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %cache: !llvm.ptr<1>, %n: i64".into()
            } else {
                b.store(&y0, "%y", &i0);
                b.store(&y1, "%y", &i1);
                b.line("}");
                "%x: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64".into()
            }
        }
        KernelSpec::QkvRopeCache { h, kvh, d, theta_bits, interleaved, kv } => {
            if d % 2 != 0 {
                return Err(format!("rope needs an even head dim, got {d}"));
            }
            let i = b.open_guarded_gid();
            let isq = b.op(&format!("arith.cmpi slt, {i}, %nq : i64"));
            b.line(&format!("scf.if {isq} {{"));
            let (_, i0, i1, y0, y1) = b.rope_pair(&i, "%xq", *h, *d, *theta_bits, *interleaved);
            b.store(&y0, "%y", &i0);
            b.store(&y1, "%y", &i1);
            b.line("} else {");
            let j = b.op(&format!("arith.subi {i}, %nq : i64"));
            let isk = b.op(&format!("arith.cmpi slt, {j}, %nk : i64"));
            b.line(&format!("scf.if {isk} {{"));
            let (t, i0, i1, y0, y1) = b.rope_pair(&j, "%xk", *kvh, *d, *theta_bits, *interleaved);
            b.store_to_slot(&y0, &i0, &t, kvh * d, "%kc", *kv)?;
            b.store_to_slot(&y1, &i1, &t, kvh * d, "%kc", *kv)?;
            b.line("} else {");
            // v: two consecutive elements per item
            let v = b.op(&format!("arith.subi {j}, %nk : i64"));
            let c2 = b.ci64(2);
            let e0 = b.op(&format!("arith.muli {v}, {c2} : i64"));
            let row = b.ci64((kvh * d) as i64);
            let t = b.op(&format!("arith.divui {e0}, {row} : i64"));
            let c1 = b.ci64(1);
            let e1 = b.op(&format!("arith.addi {e0}, {c1} : i64"));
            for e in [e0, e1] {
                let x = b.load_summed("%xv", &e);
                b.store_to_slot(&x, &e, &t, kvh * d, "%vc", *kv)?;
            }
            b.line("}");
            b.line("}");
            b.line("}");
            "%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %y: !llvm.ptr<1>, %n: i64, %nq: i64, %nk: i64"
                .into()
        }
        KernelSpec::CacheWrite { row, kv } => {
            let i = b.open_guarded_gid();
            let r = b.ci64(*row as i64);
            let t = b.op(&format!("arith.divui {i}, {r} : i64"));
            let j = b.op(&format!("arith.remui {i}, {r} : i64"));
            let slot = b.load_i32_as_i64("%slots", &t);
            let sb = b.op(&format!("arith.muli {slot}, {r} : i64"));
            let dst = b.op(&format!("arith.addi {sb}, {j} : i64"));
            let x = b.load("%x", &i);
            b.store_kv(&x, "%cache", &dst, *kv)?;
            b.line("}");
            "%x: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %cache: !llvm.ptr<1>, %n: i64".into()
        }
        KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits, warps, keys, group, kv } => emit_paged_attention(b, *h, *kvh, *d, *bs, *scale_bits, *warps, *keys, *group, *kv, None, None)?,
        KernelSpec::AttentionO { inner, n, red, splits } => match inner.as_ref() {
            KernelSpec::RopeAttention { inner: att, .. } if matches!(att.as_ref(), KernelSpec::PagedAttention { group: 1, .. }) => {
                if *splits == 0 || n % splits != 0 || (*splits > 1 && !*red) {
                    return Err(format!("the o projection splits its {n} rows over blocks evenly, with `red` only (not {splits})"));
                }
                b.attn_o = Some(*n);
                b.attn_o_red = *red;
                b.attn_o_splits = *splits;
                emit_into(b, inner)?
            }
            other => return Err(format!("the o projection folds into the one-token RoPE attention of a head per block, not {}", other.symbol())),
        },
        KernelSpec::QkvAttentionO { inner, k, eps_bits, cluster } => match inner.as_ref() {
            KernelSpec::AttentionO { red: true, splits, .. } if *cluster == 1 || cluster == splits => {
                // (clusters on sm_90a alone; elsewhere every block computes the head's 3·D)
                b.qkv_in = Some((*k, f32::from_bits(*eps_bits), if b.pdl { *cluster } else { 1 }));
                emit_into(b, inner)?.replacen(
                    "%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, ",
                    "%x: !llvm.ptr<1>, %g: !llvm.ptr<1>, %wq: !llvm.ptr<1>, %wk: !llvm.ptr<1>, %wv: !llvm.ptr<1>, ",
                    1,
                )
            }
            other => {
                return Err(format!("q, k and v fold into the one-token attention with the o projection added, in clusters of its blocks per head, not {} in clusters of {cluster}", other.symbol()))
            }
        },
        KernelSpec::RopeAttention { inner, theta_bits, interleaved } => match inner.as_ref() {
            KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits, warps, keys, group, kv } => {
                emit_paged_attention(b, *h, *kvh, *d, *bs, *scale_bits, *warps, *keys, *group, *kv, None, Some((*theta_bits, *interleaved)))?
            }
            other => return Err(format!("RoPE and the cache writes fold into the decode attention, not {}", other.symbol())),
        },
        KernelSpec::PagedAttentionSplit { h, kvh, d, bs, scale_bits, warps, keys, splits, min_keys, group, kv } => {
            emit_paged_attention(b, *h, *kvh, *d, *bs, *scale_bits, *warps, *keys, *group, *kv, Some((*splits, *min_keys)), None)?
        }
        KernelSpec::AttentionCombine { h, d, splits, min_keys } => emit_attention_combine(b, *h, *d, *splits, *min_keys)?,
    })
}

/// Bytes one lane of [`KernelSpec::PrefetchL2`] prefetches per instruction.
const PREFETCH_PIECE: usize = 64 << 10;

/// [`KernelSpec::PrefetchL2`]'s prologue: block (x, y) of the grid takes its share of `%pfb`
/// bytes of `%pf` (16-byte multiples), and lane l of its first warp prefetches pieces l, l +
/// 32, ... of [`PREFETCH_PIECE`] bytes into L2.
fn emit_l2_prefetch(b: &mut Body) {
    let bx = b.op("gpu.block_id x");
    let by = b.op("gpu.block_id y");
    let gx = b.op("gpu.grid_dim x");
    let gy = b.op("gpu.grid_dim y");
    let bid = b.op(&format!("arith.muli {by}, {gx} : index"));
    let bid = b.op(&format!("arith.addi {bid}, {bx} : index"));
    let bid = b.idx64(&bid);
    let nb = b.op(&format!("arith.muli {gx}, {gy} : index"));
    let nb = b.idx64(&nb);
    let c1 = b.ci64(1);
    let c16 = b.ci64(16);
    let chunk = b.op(&format!("arith.addi %pfb, {nb} : i64"));
    let chunk = b.op(&format!("arith.subi {chunk}, {c1} : i64"));
    let chunk = b.op(&format!("arith.divui {chunk}, {nb} : i64"));
    let c15 = b.ci64(15);
    let chunk = b.op(&format!("arith.addi {chunk}, {c15} : i64"));
    let chunk = b.op(&format!("arith.divui {chunk}, {c16} : i64"));
    let chunk = b.op(&format!("arith.muli {chunk}, {c16} : i64"));
    let lo = b.op(&format!("arith.muli {bid}, {chunk} : i64"));
    let hi = b.op(&format!("arith.addi {lo}, {chunk} : i64"));
    let hi = b.op(&format!("arith.minui {hi}, %pfb : i64"));
    let tid = b.op("gpu.thread_id x");
    let c32 = b.op("arith.constant 32 : index");
    let lane = b.op(&format!("arith.cmpi ult, {tid}, {c32} : index"));
    b.line(&format!("scf.if {lane} {{"));
    let t = b.idx64(&tid);
    let piece = b.ci64(PREFETCH_PIECE as i64);
    let start = b.op(&format!("arith.muli {t}, {piece} : i64"));
    let start = b.op(&format!("arith.addi {lo}, {start} : i64"));
    let (starti, hii) = (b.op(&format!("arith.index_cast {start} : i64 to index")), b.op(&format!("arith.index_cast {hi} : i64 to index")));
    let stepi = b.op(&format!("arith.constant {} : index", 32 * PREFETCH_PIECE));
    let p = b.v();
    b.line(&format!("scf.for {p} = {starti} to {hii} step {stepi} {{"));
    let p64 = b.idx64(&p);
    let left = b.op(&format!("arith.subi {hi}, {p64} : i64"));
    let len = b.op(&format!("arith.minui {left}, {piece} : i64"));
    let len = b.op(&format!("arith.trunci {len} : i64 to i32"));
    let ptr = b.op(&format!("llvm.getelementptr %pf[{p64}] : (!llvm.ptr<1>, i64) -> !llvm.ptr<1>, i8"));
    b.line(&format!("llvm.inline_asm has_side_effects \"cp.async.bulk.prefetch.L2.global [$0], $1;\", \"l,r\" {ptr}, {len} : (!llvm.ptr<1>, i32) -> ()"));
    b.line("}");
    b.line("}");
}

/// Element `i` (i64) of an elementwise binary kernel: `op(a[i], b[i % nb])` (params `%a`,
/// `%b`, `%nb`; b repeats every nb elements).
fn binary_at(b: &mut Body, op: BinaryOp, i: &str) -> Result<String, String> {
    let j = b.op(&format!("arith.remui {i}, %nb : i64"));
    let x = b.load("%a", i);
    let y = b.load("%b", &j);
    Ok(match op {
        BinaryOp::SiluMul => {
            let s = unary_expr(b, UnaryOp::Silu, &x)?;
            b.op(&format!("arith.mulf {s}, {y} : f32"))
        }
        other => {
            let f = match other {
                BinaryOp::Add => "arith.addf",
                BinaryOp::Sub => "arith.subf",
                BinaryOp::Mul => "arith.mulf",
                BinaryOp::Div => "arith.divf",
                BinaryOp::Max => "arith.maximumf",
                _ => "arith.minimumf",
            };
            b.op(&format!("{f} {x}, {y} : f32"))
        }
    })
}

/// Wrap kernels in the module the pass pipeline expects.
pub fn module(funcs: &[String]) -> String {
    format!("module attributes {{gpu.container_module}} {{\n  gpu.module @kernels {{\n{}  }}\n}}\n", funcs.concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn rms_norm_one_pass_shapes_split_rows_evenly() {
        assert_eq!(rms_norm_regs(4096), Some((32, 1)));
        assert_eq!(rms_norm_regs(8192), Some((32, 2)));
        assert_eq!(rms_norm_regs(2048), Some((16, 1)));
        assert_eq!(rms_norm_regs(896), Some((7, 1)));
        // 144 pieces: no multiple of 32 threads divides them; odd widths: no 16-byte pieces
        assert_eq!(rms_norm_regs(576), None);
        assert_eq!(rms_norm_regs(30), None);
        for d in (4..20000).step_by(4) {
            if let Some((w, per)) = rms_norm_regs(d) {
                assert!((1..=32).contains(&w) && (1..=4).contains(&per) && w * 32 * per * 4 == d, "{d}");
            }
        }
    }

    #[test]
    fn merged_matmul_parts_must_fit_whole_blocks() {
        let gemv = KernelSpec::MatMul { k: 64, n: 24, wdtype: DType::BF16, bias: false, residual: false };
        assert!(parts_fit(&gemv, &[16, 8]).is_ok());
        assert!(parts_fit(&gemv, &[14, 10]).unwrap_err().contains("not a multiple"));
        assert!(parts_fit(&gemv, &[16, 4]).unwrap_err().contains("sum to N"));
        let wg = KernelSpec::MatMulWgmma { k: 64, n: 192, wdtype: DType::BF16, bias: false, residual: false, n_tile: 64 };
        assert!(parts_fit(&wg, &[128, 64]).is_ok() && parts_fit(&wg, &[96, 96]).is_err());
        let res = KernelSpec::MatMul { k: 64, n: 24, wdtype: DType::BF16, bias: false, residual: true };
        assert!(parts_fit(&res, &[16, 8]).unwrap_err().contains("residual"));
        // the wrapper's symbol names the inner kernel and the parts; its MLIR has one weight per part
        let spec = KernelSpec::MatMulParts { inner: Box::new(gemv), parts: vec![16, 8] };
        assert_eq!(spec.symbol(), "matmul_k64_n24_bf16_parts_16_8");
        let text = emit(&spec).unwrap();
        assert!(text.contains("%w0: !llvm.ptr<1>, %w1: !llvm.ptr<1>") && text.contains("%yall: !llvm.ptr<1>") && text.contains("%prows: i64"), "{text}");
    }

    proptest! {
        /// Walking the schedule as the kernels do (unguarded rounds, then rounds guarded by
        /// item < items) reads every item exactly once and nothing past the end, for any K.
        #[test]
        fn split_k_schedule_covers_every_item_once(items in 1usize..6000, wide in any::<bool>(), nw in 1usize..17, unroll in 1usize..9) {
            let chunk = if wide { 32 } else { 1 };
            let (jloop, rounds) = split_k_schedule(items, chunk, nw, unroll);
            prop_assert!(jloop <= rounds && jloop % unroll == 0);
            let mut seen = vec![0u8; items];
            for w in 0..nw {
                for r in 0..rounds {
                    for lane in 0..chunk {
                        let item = (w + nw * r) * chunk + lane;
                        if r < jloop {
                            prop_assert!(item < items, "unguarded round {r} reads item {item} of {items}");
                        } else if item >= items {
                            continue;
                        }
                        seen[item] += 1;
                    }
                }
            }
            prop_assert!(seen.iter().all(|&c| c == 1));
        }
    }
}
