//! [`KernelSpec`]: what a kernel computes, with every field that changes its code — the kernel
//! cache and the symbols key on it (`crate::kernel_names`). Also the readable symbol and the
//! launch geometry ([`Launch`]) the runtime sizes the grid with: both functions of the spec
//! alone, never of options. A new kernel family adds its variants here, its emitter in its own
//! file, and an arm in `emit_into`.

use crate::kernels::*;

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
    /// memory (the runtime raises the kernel's limit past 48 KB); `carveout`: the kernel asks
    /// for the largest shared-memory carveout (the prefill attention, compiled for several
    /// blocks per SM)
    Tile { outputs: u32, rows: u32, threads: u32, smem: u32, carveout: bool },
}

impl Launch {
    /// The work units of a step whose kernel covers `outputs` output columns, as the schedule
    /// writes its `work` and the runtime's launch kind divides it into blocks: 8-column tiles
    /// (warp per tile), `n_tile`-column tiles (warpgroup per tile), else the columns themselves.
    pub fn work_units(&self, outputs: usize) -> usize {
        match self {
            Launch::WarpPerTile { .. } => outputs.div_ceil(8),
            Launch::WarpgroupPerTile { n_tile } => outputs.div_ceil(*n_tile as usize),
            _ => outputs,
        }
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
            other => matches!(other, KernelSpec::MatMulWgmma { .. } | KernelSpec::MatMulPipe { .. } | KernelSpec::MatMulF8 { .. }),
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
    /// y[M, N] = x[M, K] (f32) @ W[N, K]^T (+ bias) (+ res) for [`DType::I4G128`] or
    /// [`DType::F8G128`] weights (and [`DType::Q4_K`] at one row): the packed GEMV on
    /// `mma.sync` (`kernels/matmul/packed.rs`), 16 outputs and `tiles` B tiles of 8 rows per
    /// block (0: one row a block, x staged in shared memory in 16 bits); every row count up to
    /// the batched-decode limit. `walk`: output tiles a block takes one after another (Q4_K's
    /// one-row form: x staged once, each warp's weights loaded two steps ahead across them; 1
    /// elsewhere). params x, w, [bias], [res], y, M, N
    MatMulPacked { wdtype: DType, k: usize, n: usize, tiles: usize, walk: usize, bias: bool, residual: bool },
    /// 8-bit activations (`act_quant`, e4m3 in groups of `group` values of a row of `d`):
    /// y = the node in f32 (s · e4m3(x / s)) and q = its e4m3 copy `{y}@rows{W}` (per row d
    /// bytes, then d / group f32 scales) for the FP8 GEMM (`kernels/fp8.rs`); params x, y, q,
    /// rows · d / 4
    ActQuantF8 { d: usize, group: usize },
    /// y[M, N] = x @ W^T (+ res), x an `ActQuantF8` copy (e4m3 + 1x128 scales), W f8g128: the
    /// FP8 wgmma GEMM (`kernels/fp8.rs`, sm_90a), 128 x bn tiles, `stages` cp.async stages;
    /// params x, w, [res], y, M, N
    MatMulF8 { k: usize, n: usize, residual: bool, bn: usize, stages: usize },
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
    /// `SplitKReduce` step adds them up. On by default (`schedule::SPLIT_K_PARTS`; DSC_SPLIT_K=0 off).
    /// params as `inner`'s, y being the partial sums [splits, M, N]. `inner` may be a
    /// `MatMulParts` of the pipelined matmul (q/k/v): each slice is then part-major like the
    /// merged output, so the reduce is the same elementwise sum
    SplitK { inner: Box<KernelSpec>, splits: usize },
    /// `inner` (the pipelined wgmma matmul, possibly inside `SplitK` / `MatMulParts` /
    /// `MatMulAct`) with its W tiles loaded by TMA: each W param is instead a pointer to a
    /// 128-byte `CUtensorMap` of that weight (bf16/f16 [N, K], box 64 x bn, 128-byte
    /// swizzle), arg `{w}@tmap{bn}`; one thread per stage issues the bulk tensor copy on
    /// the stage's mbarrier. On by default for the 128-row tiles of at most 128 columns
    /// (`schedule::Tma`; checked and measured on the H200)
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
    /// 1 (`schedule::fuse_rope_attention`). params xq, xk, xv, pos, slots, k_cache, v_cache, seq,
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
    AttentionO { inner: Box<KernelSpec>, n: usize, red: bool, splits: usize, wdtype: DType },
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
    QkvAttentionO { inner: Box<KernelSpec>, k: usize, eps_bits: u32, cluster: usize, wdtype: DType },
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
    /// Checked on the H200 but measured slower, so off (`schedule::ScheduleOptions::attn_prefetch`,
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
    /// varies run to run (float sums: results may differ in the last bits). bf16 or Q4_1
    /// weights (`wdtype`; Q4_1: a gate/up piece is a quarter block, as in the decode GEMV, and
    /// the block's features are whole 16-element halves of W_down's blocks);
    /// grid (F / fb, rows). params x, g, wg, wu, wd, y, f (= F)
    SwiGluDown { k: usize, f: usize, n: usize, eps_bits: u32, fb: usize, fpw: usize, wdtype: DType },
    /// `inner` (the one-row plain-float decode GEMV) also storing its output into `%y2`,
    /// passed before `%y`: the o projection seeding the fused MLP's accumulator
    /// (`SwiGluDown`) with the residual stream. params inner's with %y2 before %y
    MatMulCopy { inner: Box<KernelSpec> },
    /// seeded weights generated on the device (`dsc_ir::seeded`), stored as `dtype`
    /// (f32/bf16/f16); params y, n, base, scale (f32 bits), ones
    SeededInit { dtype: DType },
    /// `Rope` with YaRN's frequencies (`dsc_ir::Yarn`): pair i's inverse frequency blends the
    /// original and the `factor`-interpolated one by the ramp between pairs `low` and `high`,
    /// cos and sin scaled by `mscale` (the attention factor); params as `Rope`'s
    RopeYarn { h: usize, d: usize, theta_bits: u32, interleaved: bool, factor_bits: u32, low_bits: u32, high_bits: u32, mscale_bits: u32 },
    /// DeepSeekMoE's router, a warp per token (`kernels::moe`): (logits [T, E], mask [E],
    /// [bias [E] with noaux_tc]) -> dense routing weights [T, E]; params logits, mask,
    /// [bias], y, rows
    /// With `count`, each token's selections are also added to a u32 counter per expert
    /// (param counts [E] u32 before y: the per-expert load the runtime's metrics read).
    MoeRoute { e: usize, top_k: usize, n_group: usize, topk_group: usize, scoring: dsc_ir::MoeScoring, select: dsc_ir::MoeSelect, normalize: bool, scaling_bits: u32, count: bool },
    /// `gemv` (the router's one-row GEMV, [`KernelSpec::MatMul`] with N = E, writing the logits
    /// y) whose last block of each token routes it as `route` does (`kernels::moe`): every
    /// block counts itself on the token's `{y}@sync` counter after its logits are out, and the
    /// block that counts last reads the row, writes the dense routing row (ry) and zeroes the
    /// counter — the router in one launch (`schedule::fuse_moe_router`). params the GEMV's
    /// pointers, mask, [bias], [counts], sync, ry, then its scalars
    MoeRouteGemv { gemv: Box<KernelSpec>, route: Box<KernelSpec> },
    /// The routed experts' first kernel (`kernels::moe`): h[t, slot, i] = silu(gate_e[i] · x_t)
    /// · (up_e[i] · x_t) for each token's chosen experts e (route != 0, the slot-th in expert
    /// order); a warp per (token, slot, i), grid y = T · top_k. params x, route, gate [E, I,
    /// D], up, h [T, top_k · I], I
    /// With `shared` > 0 (one-token steps: `schedule::fuse_moe_shared`) each token also has
    /// `shared` slots after its `top_k`, the shared experts' I-wide chunks (params sg, su
    /// [shared · I, D] after up; h [T, (top_k + shared) · I]); with `shared_first` before
    /// them, so that their blocks run first (where the attention prefetched their weights).
    MoeGateUp { d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType, shared: usize, shared_first: bool },
    /// [`KernelSpec::MoeGateUp`] expert-major on the tensor cores for batches: a block per (16
    /// hidden units, expert), grid y = E; the tokens that chose the expert gathered 32 at a
    /// time as `mma.sync` B tiles, the expert's gate and up rows read once per pass. params x
    /// (16-bit), route, gate, up, h, I, T
    MoeGateUpMma { d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType },
    /// The routed experts' second kernel: y[t, n] = Σ over the chosen experts of route[t, e] ·
    /// (down_e[n] · h[t, slot]) (+ res[t, n] with `residual`); a block per (token, 2 n), a
    /// warp per chosen expert. params h, route, down [E, D, I], [res], y, D
    /// With `shared` > 0 the token's `shared` slots after its `top_k` (before, `shared_first`:
    /// the gate/up's layout) are the shared experts' I-wide chunks, weight 1, summed after the
    /// routed ones (param sd [D, shared · I] after down; `shared` more warps).
    MoeDown { d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType, residual: bool, shared: usize, shared_first: bool },
    /// [`KernelSpec::MoeDown`] expert-major on the tensor cores (as `MoeGateUpMma`): the
    /// route-weighted partial p[slot, t, n] = route[t, e] · (down_e[n] · h[t, slot]) into the
    /// part-major `{node}@splitk{top_k}`. params h, route, down, p, D, T
    MoeDownMma { d: usize, inter: usize, e: usize, top_k: usize, wdtype: DType },
    /// The sum of `MoeDownMma`'s partials over each token's chosen slots (their count from its
    /// routing row; + res[t, n] with `residual`), a block per token. params p, route, [res], y, T
    MoeCombine { d: usize, e: usize, top_k: usize, residual: bool },
    /// MLA's attention over the paged latent cache (`kernels::mla`): q [T, H, C], cache [NB,
    /// BS, 1, C] of `kv` -> [T, H, L] (keys the whole rows, values their first L elements);
    /// a block per (token, head). params q, cache, pos, seq, table, y, T, MB
    MlaAttention { h: usize, c: usize, l: usize, bs: usize, scale_bits: u32, kv: DType },
    /// `attn` (an [`KernelSpec::MlaAttention`]) whose blocks first write their token's latent
    /// cache row as `write` (an [`KernelSpec::MlaLatentCache`] of the same row) does — one
    /// launch instead of two for one-token steps (`schedule::fuse_mla_cache_attention`).
    /// params x, g, slots (the write's), then the attention's
    MlaCacheAttention { attn: Box<KernelSpec>, write: Box<KernelSpec> },
    /// y[t, h] = x[t, h] @ W[h]ᵀ, one [N, K] matrix per head (`kernels::mla`); a warp per
    /// output. params x, w, y, H · N
    HeadMatMul { h: usize, k: usize, n: usize, wdtype: DType },
    /// [`KernelSpec::HeadMatMul`] for batches on the tensor cores (16-bit W, K a multiple of
    /// 32): a block per (16 rows of one head's W, head), grid y = H, its warps taking 32-token
    /// passes as `mma.sync` B tiles. params x, w, y, N, T
    HeadMatMulMma { h: usize, k: usize, n: usize, wdtype: DType },
    /// MLA's latent cache rows from the kv_a projection's output x [T, L + R]
    /// (`kernels::mla`): RMSNorm (eps, weight g [L]) of each row's first L values and RoPE of
    /// its last R (YaRN's when `yarn` = [factor, low, high, mscale] as bits), written to pool
    /// row slot[t] of `kv` — slice, rms_norm, slice, rope, concat and cache_write in one launch,
    /// a warp per token. params x, g, pos, slots, cache, T
    MlaLatentCache { l: usize, r: usize, eps_bits: u32, theta_bits: u32, interleaved: bool, yarn: Option<[u32; 4]>, kv: DType },
    /// MLA's absorbed query from q [T, H, NOPE + R] (`kernels::mla`): y[t, h] = [q_nope @
    /// W_uk[h]ᵀ (L values, W [H, L, NOPE]) | RoPE of q's last R (YaRN's when `yarn`)] — slice,
    /// head_matmul, slice, rope and concat in one launch: a warp per output of the matmul, then
    /// a warp per head for its rotation pairs; grid y = tokens. params x, w, pos, y, H · L + H
    MlaQuery { h: usize, nope: usize, r: usize, l: usize, wdtype: DType, theta_bits: u32, interleaved: bool, yarn: Option<[u32; 4]> },
    /// [`KernelSpec::MlaQuery`] for batches: the absorbed part as `HeadMatMulMma` (x's rows
    /// their first NOPE values, y's their first L), one more block column rotating each
    /// head's last R values. params as `MlaQuery`'s, then T
    MlaQueryMma { h: usize, nope: usize, r: usize, l: usize, wdtype: DType, theta_bits: u32, interleaved: bool, yarn: Option<[u32; 4]> },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnaryOpKey(pub UnaryOp);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BinaryOpKey(pub BinaryOp);

impl KernelSpec {
    /// A stable, readable symbol name.
    pub fn symbol(&self) -> String {
        match family(self) {
            Family::Norm => norm_symbol(self),
            Family::Elementwise => elementwise_symbol(self),
            Family::Rope => rope_symbol(self),
            Family::Argmax => argmax_symbol(self),
            Family::Gemv => gemv_symbol(self),
            Family::Mma => mma_symbol(self),
            Family::Packed => packed_symbol(self),
            Family::Fp8 => fp8_symbol(self),
            Family::Pipe => pipe_symbol(self),
            Family::Mlp => mlp_symbol(self),
            Family::Flash => flash_symbol(self),
            Family::Paged => paged_symbol(self),
            Family::Qkv => qkv_symbol(self),
            Family::Moe => moe_symbol(self),
            Family::Mla => mla_symbol(self),
        }
    }
    pub fn launch(&self) -> Launch {
        match family(self) {
            Family::Norm => norm_launch(self),
            Family::Elementwise => elementwise_launch(self),
            Family::Rope => rope_launch(self),
            Family::Argmax => argmax_launch(self),
            Family::Gemv => gemv_launch(self),
            Family::Mma => mma_launch(self),
            Family::Packed => packed_launch(self),
            Family::Fp8 => fp8_launch(self),
            Family::Pipe => pipe_launch(self),
            Family::Mlp => mlp_launch(self),
            Family::Flash => flash_launch(self),
            Family::Paged => paged_launch(self),
            Family::Qkv => qkv_launch(self),
            Family::Moe => moe_launch(self),
            Family::Mla => mla_launch(self),
        }
    }
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

/// Output columns one block of a matmul kernel launched as `launch` covers.
/// Output columns one block of the matmul kernel `spec` covers.
pub fn columns_per_block_of(spec: &KernelSpec) -> Option<usize> {
    columns_per_block(&spec.launch())
}

pub(crate) fn columns_per_block(launch: &Launch) -> Option<usize> {
    match launch {
        Launch::OutputsPerBlock { outputs, .. } => Some(*outputs as usize),
        Launch::WarpPerOutput { warps_per_block } => Some(*warps_per_block as usize),
        Launch::WarpPerTile { warps_per_block } => Some(8 * *warps_per_block as usize),
        Launch::WarpgroupPerTile { n_tile } => Some(*n_tile as usize),
        Launch::Tile { outputs, .. } => Some(*outputs as usize),
        _ => None,
    }
}
