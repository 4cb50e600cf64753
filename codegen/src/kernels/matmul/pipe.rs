//! The pipelined Hopper matmul (prefill and batched decode from 16-64 rows): wgmma over a ring
//! of shared-memory stages filled by `cp.async` or TMA (`Tma`), warp-specialized with a producer
//! warpgroup (`Ws`), split-K over blocks (`SplitK`), and the SwiGLU epilogue (`SwiGluPipe`).
//! Tilings: `pipe_tiling` (128-row tiles) and `pipe64_tiling` (64-row tiles), measured per N.
//! `emit_gemm_pipe` (~600 lines) is one kernel's prologue, stage ring, MMA loop and epilogue
//! over shared SSA state.
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - Prefill matmuls on sm_90a (`hopper`, from 128 rows, bf16/f16 weights): `matmul_pipe{bn}s{S}o_a16_*`
//!   (`KernelSpec::MatMulPipe`, `kernels::emit_gemm_pipe`): a block of two warpgroups per 128 × bn
//!   output tile (bn = 256 with 4 stages for N ≥ 6144, 128 with 6 below: `kernels::pipe_tiling`),
//!   every thread issuing 16-byte `cp.async` copies of x and W K-steps of 64 into a ring of stages
//!   laid out in the 128-byte swizzle wgmma's K-major descriptors read (rows past M/N zero-filled),
//!   one commit group per step; each step waits for its group, syncs, starts the copies `S - 2`
//!   steps ahead, and issues 4 × `wgmma m64n{bn}k16` with both operands from shared memory,
//!   leaving one wgmma group in flight (two steps per loop iteration: measured wrong with one —
//!   bench/results/gemm-pipe-2026-11-29.json). x comes in bf16 (f16 for f16 weights): a `ToHalf`
//!   step (`schedule::insert_half_casts`) writes `{x}@bf16` right before the first matmul reading x,
//!   (by default — norm + quantize, DSC_NORM_HALF=0 turns it off — an x that an RMSNorm step writes
//!   gets its copy from that step instead: `RmsNormHalf`, the copy's buffer declared by a
//!   kernel-less step; a LayerNorm step likewise: `LayerNorm { half: Some(f16) }`; a silu_mul step likewise: `SiluMulHalf`, DSC_SILU_HALF=0 turns it off) with `min_rows` = the fewest rows of any alternative reading it (16: the batched GEMV on
//!   bf16 x, and the pipelined matmul from 16/64 rows), so batch-1 decode never runs it; the alternative reads it
//!   through `GpuLarge.args`. `@bf16`/`@f16` buffers (and the split attention's `@split{S}`) are the only step nodes
//!   that are not graph nodes: the runtime sizes them from their base node, at 2 bytes per
//!   element (`gpu::half_base`; `gpu::split_base`: [T, H, S·(D + 2)] f32). DSC_GEMM_PIPE=BN,S,O,A overrides the tiling (A = 0: f32 x converted in
//!   registers, the A operand from registers). Merged matmuls whose parts are not multiples of bn
//!   keep `matmul_wgmma64_*` (f32 x).
//! - TMA (`schedule::tma_wrap`, `schedule::Tma`; checked on the H200: bundle cases for every pipelined
//!   tiling): by default the pipelined wgmma alternatives in 128-row tiles of at most 128
//!   columns (prefill o/down/q/k/v: +10-24%; the 256-column tiles measured 1-4% slower and the
//!   64-row decode tiles no faster; DSC_TMA=all wraps every one, DSC_TMA=0 none) are wrapped as
//!   `KernelSpec::Tma` (also around split-K / merged parts / an activation epilogue): its weight args become
//!   `{w}@tmap{bn}` — pointers to 128-byte `CUtensorMap`s the runtime encodes once per weight and
//!   tile height when it loads the plan (`gpu::weight_tensor_map`: box 64 x bn, 128-byte swizzle,
//!   zero fill) — and thread 0 loads each stage's W tile with one `cp.async.bulk.tensor` on the
//!   stage's mbarrier (`Body::tma`; x stays on cp.async).
//! - Warp-specialized matmul (`KernelSpec::Ws`, `schedule::tma_wrap` with `ScheduleOptions::ws`, on;
//!   DSC_GEMM_WS=0 off; checked on the H200, bundle cases "… ws"): every pipelined alternative in
//!   128-row tiles with x in 16 bits, unsplit (prefill, b128 decode; around merged parts, an
//!   activation epilogue or the SwiGLU epilogue) takes it instead of `Tma`; and, with
//!   `ScheduleOptions::ws64` (on, DSC_GEMM_WS64=0 off), the 64-row batched-decode tiles from
//!   `schedule::WS64_MIN_ROWS` rows (an alternative reaching below is split in two there, so the
//!   rows and first fit are unchanged), split-K ones included (the producer adds the part's first
//!   K step to the box coordinate) — x's map then in 64-row boxes (`@xmap64`), the SwiGLU W tile
//!   as four boxes (per warpgroup wn/2 gate rows, then wn/2 up rows: `@tmap{wn/2}`). Under PDL the
//!   producer issues the first round's W boxes before `griddepcontrol.wait` (on already-armed
//!   full barriers; x's follow the wait); the consumers wait before their epilogue. 384 threads
//!   (`known_block_size` → `.maxntid 384`): warpgroup 2 is the producer — `setmaxnreg.dec 40`,
//!   its thread 256 loops over the K steps: wait for the stage's *empty* mbarrier (parity of the
//!   previous round; a fresh barrier's counts as done), `mbarrier.arrive.expect_tx` the stage's
//!   bytes on its *full* mbarrier, then one `cp.async.bulk.tensor` for x's tile (box 64 x 128
//!   rows) and one for W's (the SwiGLU tile: a bn/2-row box from each of the gate and up
//!   weights) —; warpgroups 0-1 are the consumers — `setmaxnreg.inc 232`, wait for the full
//!   barrier, 4 wgmmas, keep one group in flight, and after `wgmma.wait_group 1` every consumer
//!   thread arrives on the previous step's empty barrier (count 256). No block barrier in the K
//!   loop. Args: x becomes `{x}@xmap128` — the runtime encodes a tensor map of x's place in each
//!   bucket's arena when it builds the bucket (`gpu::tensor_map_at`; rows past x's are zeros) —
//!   and each W `{w}@tmap{bn}` (`@tmap{bn/2}` for SwiGLU). Blocks take their tiles rasterized
//!   (`RASTER_ROWS` = 16 row tiles per group, column by column: a wave shares x's rows and a few
//!   W tiles in L2; `Body::block_x`/`block_y` carry the remapped indices through the parts
//!   prologue). The epilogue (`Body::store_d_tile`) stores 8-byte pairs where the thread's rows
//!   and the tile's columns are in bounds, loading 8 column groups' residual/bias pairs before
//!   storing any (the per-element path waited for each load in turn: 474 -> 662 TFLOP/s at
//!   4096³). Long prefills get 256-column tiles where N's default is 128 (`schedule::WIDE_MIN_TILES`:
//!   from 3 waves of them; DSC_GEMM_WIDE=0 off). Measured: bench/results/gemm-ws-2026-11-30.json,
//!   perf-2026-11-30-session13.json (4096³ 97% of cuBLAS, down 98%).
//! - Quantized weights (`MatMulPipe { wdtype }` a GGUF block, K-quant, i4g128 or f8g128:
//!   `dequant_pipe_fits`; only warp-specialized, 128 x 128 tiles, 6 stages; `schedule::initial`
//!   takes it past the batched GEMV's rows where `ScheduleOptions::ws` is on, x in f16 from its
//!   copy): the producer warpgroup (`dequant_producer`; `setmaxnreg` 120 / 192) takes each K
//!   step in turn: a thread loads the raw words of its 8 units (8 values of a W row: 8 threads
//!   a row, as the wgmma staging reads them, `mma::weight_eight_raw`), prefetches its row of
//!   step + `DEQ_PREFETCH_STEPS` into L2, waits for the stage's empty barrier, (thread 256)
//!   arms the full barrier with x's bytes and issues x's TMA copy, makes the units f16 pairs
//!   (`weight_eight_pairs`), stores them where the 128-byte swizzle puts them (chunk c of row r
//!   at c ^ (r % 8), rows past N zeros), then `fence.proxy.async` and one arrive (the full
//!   barrier counts 129). The consumers are the bf16 kernel's, in f16. The weights take no
//!   tensor map (`schedule::tma_wrap`). Measured 213-272 TFLOP/s at 512 rows on an H100 (8B
//!   Q4_K prefill 4.5k -> 15.5k tok/s; bench/results/dequant-pipe-gpu-h100-2026-12-07.json):
//!   the producer sets the pace. Two producer warpgroups taking the steps in turn (two steps'
//!   loads in flight) measured no gain at the model level (15,730 vs 15,821 tok/s,
//!   bench/results/dequant-pipe-2p-gpu-h100-2026-12-07.json): not load latency.
//! - Split-K (on: `schedule::split_k`, at most `SPLIT_K_PARTS` = 4 parts; `DSC_SPLIT_K=S` at compile
//!   time, 0 off): a plain or merged matmul whose 64-row pipelined tiles number fewer than 64
//!   (the 8B o/down projections: 32; q/k/v: 48) gets `KernelSpec::SplitK` first in its `hopper`
//!   list from 16 rows to 128 (`SPLIT_K_MAX_ROWS`; past the 64-row alternative's own 64: two row
//!   tiles of K parts beat the 128-row tiles' 32-48 blocks there) — the same tile with its K steps cut into S
//!   parts over blocks (block x = tile·S + part; S = `split_k_parts`: the most that keep tiles x S
//!   within one wave of `kernels::TARGET_SMS` = 132, so o/down 4, q/k/v 2), part s writing f32
//!   partial sums at `{node}@splitk{S}` + s·M·N (declared by a kernel-less step;
//!   `gpu::splitk_base` sizes it [S, ..node]; a merged matmul's slice is part-major like its
//!   output: `SplitK { inner: MatMulParts { MatMulPipe } }`, `Body::split_n` the slice's width) —
//!   and a `SplitKReduce` step after it (sum of the parts + the residual into the node) for the
//!   same rows, `hopper_only` (a `GpuStep` flag: launched only where the hopper alternatives
//!   run). A reduce whose node an RMSNorm reads next is folded into that norm (on;
//!   `DSC_SPLITK_NORM=0` off; `fold_splitk_reduce_norm`: a `hopper` alternative of the norm
//!   step, `SplitKReduceNorm`, summing the parts + residual, writing the node and its normalized
//!   bf16 copy; since session 20 a thread-block cluster of `kernels::splitk_norm_cluster` = 8
//!   blocks per row on sm_90a (block r takes columns r·d/8.., its sum of squares goes into every
//!   block's shared memory by `st.shared::cluster` before one cluster barrier; `GpuLarge::cluster`
//!   tells the runtime to launch the alternative in clusters along grid y; 8B b32 +2.7%;
//!   DSC_SPLITK_NORM_CLUSTER=1 at compile time: a block of 32 warps per row as before).
//! - The SwiGLU in the gate/up matmul (`schedule::fuse_swiglu_pipe`, after the casts;
//!   `ScheduleOptions::swiglu_pipe`: `SwiGluFusion::All` on — every pipelined alternative that
//!   does not load W by TMA (`schedule::takes_tma`: the SwiGLU kernel has no TMA path, and the
//!   SmolLM2 shape's TMA 128-row tile lost 20% at b128 when fused without it) —,
//!   `DSC_SWIGLU_PIPE=batched` the 64-row tile alone, `DSC_SWIGLU_PIPE=0` off): where a `SiluMulHalf`
//!   step reads both parts of a merged gate/up matmul, those `hopper` alternatives of that
//!   matmul become
//!   `KernelSpec::SwiGluPipe { MatMulPipe }` (args x@bf16, w_gate, w_up, h, h@bf16; scalars M, F):
//!   each warpgroup's W tile rows are wn/2 gate rows then the same features' up rows
//!   (`emit_gemm_pipe` maps a W row to (weight, feature); block i takes features bn/2·i..), so
//!   a thread holds a feature's gate and up accumulators and writes h = silu(g)·u and its bf16
//!   copy (`store_swiglu_fragments`). The silu_mul step gets `hopper_skip` = that alternative's
//!   rows (a `GpuStep` field, plan format unchanged for plans without it:
//!   `GpuStep::runs_on(rows, hopper)` skips it where the Hopper alternatives run). The rows are
//!   computed as the runtime picks (`schedule::fused_rows`: where the first-fitting `hopper`
//!   alternative is a fused one), and must be one interval (else only the 64-row tile is fused).
//!   Likewise (on; DSC_SPLITK_ROPE=0 at compile time off):
//!   `schedule::fold_splitk_reduce_rope` folds a merged Q/K/V matmul's split-K reduce into the
//!   `QkvRopeCache` step reading it (`KernelSpec::QkvRopeSplitK`: q, k, v loaded as the sums of
//!   the partial-sum slices, `Body::load_summed`), where no other step reads the merged node in
//!   those rows (the one-token attention and RoPE steps do not). The fused
//!   kernel writes h before h's own step: `compiler::lifetimes` extends h's life to the matmul's
//!   step, as for every buffer an alternative names.

use crate::kernels::*;

/// The readable symbol of a `pipe` kernel (`KernelSpec::symbol`).
pub(crate) fn pipe_symbol(spec: &KernelSpec) -> String {
    match spec {
            KernelSpec::SplitK { inner, splits } => format!("{}_splitk{splits}", inner.symbol()),
            KernelSpec::Tma { inner } => format!("{}_tma", inner.symbol()),
            KernelSpec::Ws { inner } => format!("{}_ws", inner.symbol()),
            KernelSpec::SwiGluPipe { inner } => format!("{}_swiglu", inner.symbol()),
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
        other => unreachable!("{other:?} is not a pipe kernel (kernels::family)"),
    }
}

/// How the runtime launches a `pipe` kernel (`KernelSpec::launch`).
pub(crate) fn pipe_launch(spec: &KernelSpec) -> Launch {
    match spec {
            KernelSpec::MatMulPipe { bn, stages, a16, bm, .. } => Launch::Tile { outputs: *bn as u32, rows: *bm as u32, threads: 256, smem: pipe_smem(*bn, *stages, *a16, *bm) as u32, carveout: false },
            // (the stages' mbarriers past the tiles: 8 bytes each)
            KernelSpec::Tma { inner } => match inner.launch() {
                Launch::Tile { outputs, rows, threads, smem, carveout } => Launch::Tile { outputs, rows, threads, smem: smem + TMA_MBAR_BYTES as u32, carveout },
                other => other,
            },
            KernelSpec::Ws { inner } => match inner.launch() {
                Launch::Tile { outputs, rows, threads, smem, carveout } => Launch::Tile { outputs, rows, threads: threads + 128, smem: smem + TMA_MBAR_BYTES as u32, carveout },
                other => other,
            },
            KernelSpec::SplitK { inner, splits } => match inner.launch() {
                // (a tile's columns over `splits` blocks: grid x = N / (bn / splits))
                Launch::Tile { outputs, rows, threads, smem, carveout } => Launch::Tile { outputs: outputs / *splits as u32, rows, threads, smem, carveout },
                other => other,
            },
            KernelSpec::SwiGluPipe { inner } => inner.launch(),
        other => unreachable!("{other:?} is not a pipe kernel (kernels::family)"),
    }
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

/// The tiling of the pipelined matmul on quantized weights ([`dequant_pipe_fits`]): 128 x 128
/// tiles (the producer's 8 units a thread a K step), 6 stages of 32 KB, x in 16 bits, overlapped.
pub fn dequant_pipe_tiling() -> PipeTiling {
    PipeTiling { bn: 128, stages: 6, overlap: true, a16: true, bm: PIPE_BM }
}

/// Row tiles per raster group of the warp-specialized matmul (`KernelSpec::Ws`).
pub const RASTER_ROWS: usize = 16;

/// Shared memory past a TMA pipelined matmul's stages for their mbarriers (8 bytes each).
pub const TMA_MBAR_BYTES: usize = 128;

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
/// What [`emit_gemm_pipe`] takes: K a multiple of 64, bf16/f16 weights (or, warp-specialized,
/// the quantized formats of [`dequant_pipe_fits`]), a tiling whose stages
/// fit shared memory (3+ when overlapped).
fn pipe_gemm_fits(k: usize, wdtype: DType, tiling: PipeTiling, ws: bool) -> Result<(), String> {
    let PipeTiling { bn, stages, overlap, .. } = tiling;
    if overlap && stages < 3 {
        return Err("the overlapped pipelined matmul needs 3 or more stages".into());
    }
    if k % 64 != 0 {
        return Err(format!("the pipelined wgmma matmul needs K a multiple of 64, got {k}"));
    }
    if !tiling.fits() {
        return Err(format!("pipelined wgmma matmul: bn {bn} with {stages} stages does not fit"));
    }
    if !matches!(wdtype, DType::BF16 | DType::F16) {
        // (quantized weights: warp-specialized, the producer dequantizing)
        dequant_pipe_fits(wdtype, tiling).map_err(|e| format!("the pipelined wgmma matmul takes bf16/f16 weights, or {e}"))?;
        if !ws {
            return Err(format!("the pipelined wgmma matmul takes {wdtype} weights only warp-specialized (its producer dequantizes them)"));
        }
    }
    Ok(())
}

/// One thread's TMA copy of a 2D box (`k`, `row`: its first element's coordinates, i32) of the
/// tensor map at `map` (i64) to shared memory at `dst` (i32), on the mbarrier at `mb` (i32),
/// which it arrives on expecting `bytes` (i32) more transaction bytes.
fn tma_arm_copy_2d(b: &mut Body, mb: &str, bytes: &str, dst: &str, map: &str, k: &str, row: &str) {
    b.line(&format!(
        "llvm.inline_asm has_side_effects \"{{ .reg .b64 st; mbarrier.arrive.expect_tx.shared::cta.b64 st, [$0], $1; }} cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [$2], [$3, {{$4, $5}}], [$0];\", \"r,r,r,l,r,r\" {mb}, {bytes}, {dst}, {map}, {k}, {row} : (i32, i32, i32, i64, i32, i32) -> ()"
    ));
}

/// Registers of the dequantizing producer warpgroup (`setmaxnreg.dec`) and of the consumers:
/// 128 · 120 + 256 · 192 = 64,512 of the 65,536 (the kernel starts at 168 a thread: 384
/// threads).
pub const DEQ_PRODUCER_REGS: usize = 120;
pub const DEQ_CONSUMER_REGS: usize = 192;
/// Arrivals completing a full stage of the dequantizing pipe: the lead producer thread's (x's
/// bytes expected) and one from each producer thread after its W units.
const DEQ_FULL_ARRIVALS: usize = 129;
/// K steps of 64 ahead of the producer's loads that it prefetches W's rows into L2 (its loads
/// then wait on L2, not DRAM).
pub const DEQ_PREFETCH_STEPS: i64 = 4;

/// Whether the warp-specialized pipelined matmul takes `wdtype` weights dequantized by its
/// producer warpgroup: the GGUF blocks and dsc's i4g128 / f8g128 (eight values at a time as the
/// wgmma staging reads them), 128 x 128 tiles (the producer's 8 units a thread a K step).
pub fn dequant_pipe_fits(wdtype: DType, tiling: PipeTiling) -> Result<(), String> {
    let ok = matches!(wdtype, DType::Q8_0 | DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::I4G128 | DType::F8G128) || kquant_dtype(wdtype);
    if !ok {
        return Err(format!("{wdtype} weights are not dequantized by the pipelined matmul's producer"));
    }
    if tiling.bm != PIPE_BM || tiling.bn != 128 || !tiling.a16 {
        return Err(format!("{wdtype} weights in the pipelined matmul: 128 x 128 tiles with x in 16 bits, not {} x {}", tiling.bm, tiling.bn));
    }
    Ok(())
}

/// The SwiGLU epilogue's W tile row `r` (i64, `wn` rows a warpgroup, the block's first feature
/// `f0`): row r of warpgroup r / wn is gate feature f0 + (r / wn)·wn/2 + r % (wn/2) in its
/// first half, that feature's up row in the second. Returns (feature, its weight: what
/// `weight` makes of whether it is an up row, an i1).
fn swiglu_tile_row(b: &mut Body, r: &str, wn: usize, f0: &str, weight: &dyn Fn(&mut Body, &str) -> String) -> (String, String) {
    let cwn = b.ci64(wn as i64);
    let cq = b.ci64(wn as i64 / 2);
    let wgi = b.op(&format!("arith.divui {r}, {cwn} : i64"));
    let rr = b.op(&format!("arith.remui {r}, {cwn} : i64"));
    let up = b.op(&format!("arith.cmpi uge, {rr}, {cq} : i64"));
    let rq = b.op(&format!("arith.remui {rr}, {cq} : i64"));
    let fb = b.op(&format!("arith.muli {wgi}, {cq} : i64"));
    let fb = b.op(&format!("arith.addi {fb}, {rq} : i64"));
    let w = weight(b, &up);
    (b.op(&format!("arith.addi {f0}, {fb} : i64")), w)
}

/// Waits until the consumers released the stage of K step `kt` (i64) of a `stages`-deep ring:
/// its empty mbarrier (`mbar` of stage + `stages`, past the full ones) completes the phase of
/// parity (kt / stages + 1) % 2 — a fresh barrier's "previous" phase counts as complete.
fn wait_stage_empty(b: &mut Body, kt: &str, stages: usize, mbar: &dyn Fn(&mut Body, &str) -> String) {
    let cs = b.ci64(stages as i64);
    let st = b.op(&format!("arith.remui {kt}, {cs} : i64"));
    let u = b.op(&format!("arith.divui {kt}, {cs} : i64"));
    let c1 = b.ci64(1);
    let par = b.op(&format!("arith.andi {u}, {c1} : i64"));
    let par = b.op(&format!("arith.xori {par}, {c1} : i64"));
    let par = b.op(&format!("arith.trunci {par} : i64 to i32"));
    let se = b.op(&format!("arith.addi {st}, {cs} : i64"));
    let eb = mbar(b, &se);
    b.mbar_spin(&eb, &par);
}

/// What [`dequant_producer`] needs of the pipelined matmul around it.
pub(crate) struct DequantProducer<'a> {
    pub t: &'a str,
    pub wdtype: DType,
    pub k: usize,
    pub bn: usize,
    pub wn: usize,
    /// SwiGLU: the block's first feature (W rows are gate rows then up rows per warpgroup)
    pub f0: Option<&'a str>,
    pub n0: &'a str,
    /// split-K: this part's first K step
    pub k0: Option<&'a str>,
    pub nk: i64,
    pub stages: usize,
    pub a_bytes: i64,
    pub f16: bool,
}

/// The producer warpgroup of the warp-specialized pipelined matmul for quantized weights
/// (threads 256..383, inside their `scf.if`): it hands registers to the consumers
/// (`setmaxnreg.dec`), then for each K step kt: loads the raw words of its 8 units (a unit: 8
/// values of one W tile row, a 16-byte chunk of the tile; 8 consecutive threads a row, so a
/// warp reads 4 rows' 64 values), prefetches its row of step kt + `DEQ_PREFETCH_STEPS` into L2,
/// waits for the consumers to release the stage, (thread 256) arms the stage's full barrier
/// with x's bytes and issues x's TMA copy, makes the units f16 pairs and stores them where the
/// 128-byte swizzle puts them (chunk c of row r at c ^ (r % 8); rows past N zeros), and arrives
/// on the full barrier after `fence.proxy.async` (its stores then visible to the wgmmas).
pub(crate) fn dequant_producer(
    b: &mut Body,
    d: &DequantProducer,
    stage_of: &dyn Fn(&mut Body, &str) -> (String, String),
    mbar: &dyn Fn(&mut Body, &str) -> String,
    x_copy: &dyn Fn(&mut Body, &str),
) -> Result<(), String> {
    let DequantProducer { t, wdtype, k, bn, wn, f0, n0, k0, nk, stages, a_bytes, f16 } = *d;
    b.line(&format!("llvm.inline_asm has_side_effects \"setmaxnreg.dec.sync.aligned.u32 {DEQ_PRODUCER_REGS};\", \"\" : () -> ()"));
    let c256 = b.ci64(256);
    let p = b.op(&format!("arith.subi {t}, {c256} : i64"));
    let c0 = b.ci64(0);
    let lead = b.op(&format!("arith.cmpi eq, {p}, {c0} : i64"));
    if b.pdl && !b.waited {
        // (x, which the TMA copies read, is the previous kernel's: the lead waits for it)
        b.line(&format!("scf.if {lead} {{"));
        b.line("llvm.inline_asm has_side_effects \"griddepcontrol.wait;\", \"~{memory}\" : () -> ()");
        b.line("}");
    }
    // tile row r's weight row (clamped inside N), whether it is inside N, its weight pointer
    let row_of = |b: &mut Body, r: &str| -> (String, String, String) {
        let (gr, ptr) = match f0 {
            Some(f0) => {
                swiglu_tile_row(b, r, wn, f0, &|b, up| b.op(&format!("llvm.select {up}, %w1, %w0 : i1, !llvm.ptr<1>")))
            }
            None => (b.op(&format!("arith.addi {n0}, {r} : i64")), "%w".to_string()),
        };
        let valid = b.op(&format!("arith.cmpi slt, {gr}, %n : i64"));
        let c0 = b.ci64(0);
        let grs = b.op(&format!("arith.select {valid}, {gr}, {c0} : i64"));
        (grs, valid, ptr)
    };
    // this thread's units: (row, valid, pointer, K offset in the step, byte offset in the W tile)
    let c8 = b.ci64(8);
    let c7 = b.ci64(7);
    let c16 = b.ci64(16);
    let c128 = b.ci64(128);
    let mut units = vec![];
    for i in 0..bn * 8 / 128 {
        let ci = b.ci64(128 * i as i64);
        let u = b.op(&format!("arith.addi {p}, {ci} : i64"));
        let r = b.op(&format!("arith.divui {u}, {c8} : i64"));
        let ch = b.op(&format!("arith.remui {u}, {c8} : i64"));
        let (grs, valid, ptr) = row_of(b, &r);
        let kc = b.op(&format!("arith.muli {ch}, {c8} : i64"));
        let r8 = b.op(&format!("arith.andi {r}, {c7} : i64"));
        let pc = b.op(&format!("arith.xori {ch}, {r8} : i64"));
        let pcb = b.op(&format!("arith.muli {pc}, {c16} : i64"));
        let ro = b.op(&format!("arith.muli {r}, {c128} : i64"));
        let so = b.op(&format!("arith.addi {ro}, {pcb} : i64"));
        let ca = b.ci64(a_bytes);
        let so = b.op(&format!("arith.addi {so}, {ca} : i64"));
        units.push((grs, valid, ptr, kc, so));
    }
    // the rows this thread prefetches (tile rows p, p + 128, ..): their first element
    let (per, bytes) = wdtype.block();
    let kk = b.ci64(k as i64);
    let mut pref = vec![];
    for i in 0..bn.div_ceil(128) {
        let ci = b.ci64(128 * i as i64);
        let r = b.op(&format!("arith.addi {p}, {ci} : i64"));
        let (grs, valid, ptr) = row_of(b, &r);
        let e = b.op(&format!("arith.muli {grs}, {kk} : i64"));
        let pi = b.op(&format!("llvm.ptrtoint {ptr} : !llvm.ptr<1> to i64"));
        pref.push((e, valid, pi));
    }
    let kstep = |b: &mut Body, kt: &str| match k0 {
        Some(k0) => b.op(&format!("arith.addi {k0}, {kt} : i64")),
        None => kt.to_string(),
    };
    // L2 prefetch of K step `kt`'s bytes of the prefetch rows: the lines of its first and last
    // block and the one between (a block's values 64 at a time: at most 3 lines)
    let prefetch = |b: &mut Body, kt: &str| {
        let ks = kstep(b, kt);
        let c64 = b.ci64(64);
        let kg = b.op(&format!("arith.muli {ks}, {c64} : i64"));
        let cper = b.ci64(per as i64);
        let cby = b.ci64(bytes as i64);
        for (e, valid, pi) in &pref {
            b.line(&format!("scf.if {valid} {{"));
            let e0 = b.op(&format!("arith.addi {e}, {kg} : i64"));
            let c63 = b.ci64(63);
            let e1 = b.op(&format!("arith.addi {e0}, {c63} : i64"));
            let b0 = b.op(&format!("arith.divui {e0}, {cper} : i64"));
            let b0 = b.op(&format!("arith.muli {b0}, {cby} : i64"));
            let b1 = b.op(&format!("arith.divui {e1}, {cper} : i64"));
            let b1 = b.op(&format!("arith.muli {b1}, {cby} : i64"));
            let cl = b.ci64(bytes as i64 - 1);
            let b1 = b.op(&format!("arith.addi {b1}, {cl} : i64"));
            let c128 = b.ci64(128);
            let bm = b.op(&format!("arith.addi {b0}, {c128} : i64"));
            let bm = b.op(&format!("arith.minui {bm}, {b1} : i64"));
            for o in [&b0, &bm, &b1] {
                let a = b.op(&format!("arith.addi {pi}, {o} : i64"));
                b.line(&format!("llvm.inline_asm has_side_effects \"prefetch.global.L2 [$0];\", \"l\" {a} : (i64) -> ()"));
            }
            b.line("}");
        }
    };
    for s in 1..DEQ_PREFETCH_STEPS.min(nk) {
        let ks = b.ci64(s);
        prefetch(b, &ks);
    }
    let zi = b.op("arith.constant 0 : index");
    let ni = b.op(&format!("arith.constant {nk} : index"));
    let oi = b.op("arith.constant 1 : index");
    let kv = b.v();
    b.line(&format!("scf.for {kv} = {zi} to {ni} step {oi} {{"));
    let kt = b.idx64(&kv);
    // the units' loads first, then the prefetch and the wait for the stage
    let ks = kstep(b, &kt);
    let c64 = b.ci64(64);
    let kg = b.op(&format!("arith.muli {ks}, {c64} : i64"));
    let mut raws = vec![];
    for (grs, _, ptr, kc, _) in &units {
        let kgu = b.op(&format!("arith.addi {kg}, {kc} : i64"));
        raws.push(crate::kernels::matmul::mma::weight_eight_raw(b, ptr, wdtype, k, grs, &kgu)?);
    }
    let cpd = b.ci64(DEQ_PREFETCH_STEPS);
    let kp = b.op(&format!("arith.addi {kt}, {cpd} : i64"));
    let cnk = b.ci64(nk);
    let more = b.op(&format!("arith.cmpi slt, {kp}, {cnk} : i64"));
    b.line(&format!("scf.if {more} {{"));
    prefetch(b, &kp);
    b.line("}");
    let (st, sb) = stage_of(b, &kt);
    wait_stage_empty(b, &kt, stages, mbar);
    b.line(&format!("scf.if {lead} {{"));
    x_copy(b, &kt);
    b.line("}");
    let zi32 = b.op("arith.constant 0 : i32");
    for (raw, (_, valid, _, _, so)) in raws.into_iter().zip(&units) {
        let pairs = crate::kernels::matmul::mma::weight_eight_pairs(b, wdtype, raw, f16);
        let mut v = b.op("llvm.mlir.undef : vector<4xi32>");
        for (j, pj) in pairs.iter().enumerate() {
            let pj = b.op(&format!("arith.select {valid}, {pj}, {zi32} : i32"));
            let cj = b.op(&format!("arith.constant {j} : i32"));
            v = b.op(&format!("llvm.insertelement {pj}, {v}[{cj} : i32] : vector<4xi32>"));
        }
        let sa = b.op(&format!("arith.addi {sb}, {so} : i64"));
        let sp = b.op(&format!("llvm.inttoptr {sa} : i64 to !llvm.ptr<3>"));
        b.line(&format!("llvm.store {v}, {sp} {{alignment = 16 : i64}} : vector<4xi32>, !llvm.ptr<3>"));
    }
    // (generic-proxy stores, read by the wgmmas through the async proxy)
    b.line("llvm.inline_asm has_side_effects \"fence.proxy.async.shared::cta;\", \"\"  : () -> ()");
    let fb = mbar(b, &st);
    b.line(&format!("llvm.inline_asm has_side_effects \"{{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [$0]; }}\", \"r\" {fb} : (i32) -> ()"));
    b.line("}");
    Ok(())
}

/// Whether a pipelined Hopper matmul generates ([`fits`]): the wrappers' conditions on the
/// matmul inside (warp specialization and TMA within the mbarrier bytes, split-K over whole
/// tiles, the SwiGLU epilogue outside split-K, activations and TMA without warp
/// specialization), then the matmul itself.
pub(crate) fn pipe_fits(spec: &KernelSpec, o: Outer) -> Result<(), String> {
    match spec {
        KernelSpec::Ws { inner } => {
            match inner.pipe_core() {
                KernelSpec::MatMulPipe { stages, a16: true, .. } if *stages * 16 <= TMA_MBAR_BYTES && !o.tma => {}
                other => return Err(format!("warp specialization takes the pipelined wgmma matmul with x in 16 bits, up to {} stages, not {}", TMA_MBAR_BYTES / 16, other.symbol())),
            }
            fits_in(inner, Outer { tma: true, ws: true, ..o })
        }
        KernelSpec::Tma { inner } => {
            match inner.matmul_core().0 {
                KernelSpec::MatMulPipe { stages, .. } if *stages * 8 <= TMA_MBAR_BYTES => {}
                other => return Err(format!("TMA takes the pipelined wgmma matmul (up to {} stages), not {}", TMA_MBAR_BYTES / 8, other.symbol())),
            }
            fits_in(inner, Outer { tma: true, ..o })
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
            fits_in(inner, Outer { split_k: true, ..o })
        }
        KernelSpec::SwiGluPipe { inner } => {
            match inner.as_ref() {
                KernelSpec::MatMulPipe { n, bias: false, residual: false, bn, bm, .. } if swiglu_pipe_fits(*n, *bn, *bm) && (!o.tma || o.ws) && !o.split_k && !o.act => {}
                other => {
                    return Err(format!(
                        "the SwiGLU epilogue takes an unsplit pipelined matmul without bias or residual whose warpgroup columns halve into 8-column groups and tile F, not {}",
                        other.symbol()
                    ))
                }
            }
            fits_in(inner, o)
        }
        KernelSpec::MatMulPipe { k, wdtype, bn, stages, overlap, a16, bm, .. } => pipe_gemm_fits(*k, *wdtype, PipeTiling { bn: *bn, stages: *stages, overlap: *overlap, a16: *a16, bm: *bm }, o.ws),
        other => Err(format!("`{}` is not one of the pipelined Hopper matmul kernels", other.symbol())),
    }
}

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
pub(crate) fn emit_gemm_pipe(b: &mut Body, k: usize, wdtype: DType, bias: bool, residual: bool, tiling: PipeTiling) -> Result<String, String> {
    pipe_gemm_fits(k, wdtype, tiling, b.ws)?;
    let PipeTiling { bn, stages, overlap, a16, .. } = tiling;
    // K steps the copies run ahead: with a wgmma group in flight, the stage of step kt - 1
    // may still be read while step kt computes
    let ahead = if overlap { stages as i64 - 2 } else { stages as i64 - 1 };
    let f16 = tensor_core_f16(wdtype);
    let ty = if f16 { "f16" } else { "bf16" };
    // (quantized weights: the producer warpgroup dequantizes W's tiles into the stages)
    let deq = !matches!(wdtype, DType::BF16 | DType::F16);
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
    let base = b.smem_base_1k();
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
                    swiglu_tile_row(b, &row, wn, f0, &|b, up| b.op(&format!("arith.select {up}, {w1}, {ptr} : i64")))
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
    // the first K element of K step `kt` (i64; split-K: of this part's steps) as a TMA
    // coordinate (i32)
    let k_coord = |b: &mut Body, kt: &str| -> String {
        let kstep = match &k0 {
            Some(k0) => b.op(&format!("arith.addi {k0}, {kt} : i64")),
            None => kt.to_string(),
        };
        let c64 = b.ci64(64);
        let kc = b.op(&format!("arith.muli {kstep}, {c64} : i64"));
        b.op(&format!("arith.trunci {kc} : i64 to i32"))
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
        let kc = k_coord(b, ks);
        let nc = b.op(&format!("arith.trunci {n0} : i64 to i32"));
        let bytes = b.op(&format!("arith.constant {} : i32", bn * 128));
        let map = b.op("llvm.ptrtoint %w : !llvm.ptr<1> to i64");
        tma_arm_copy_2d(b, &mb, &bytes, &dst, &map, &kc, &nc);
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
            // (dequantizing producer: the lead thread's arrive with x's bytes and one from
            // each of its 128 threads once its W units are stored)
            let arrivals = if deq { DEQ_FULL_ARRIVALS } else { 1 };
            b.line(&format!("llvm.inline_asm has_side_effects \"mbarrier.init.shared::cta.b64 [$0], {arrivals};\", \"r\" {mb} : (i32) -> ()"));
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
    if wspec && deq {
        let c256 = b.ci64(256);
        let prod = b.op(&format!("arith.cmpi uge, {t}, {c256} : i64"));
        b.line(&format!("scf.if {prod} {{"));
        let stage_of = |b: &mut Body, kt: &str| {
            let cs = b.ci64(stages as i64);
            let st = b.op(&format!("arith.remui {kt}, {cs} : i64"));
            let csb = b.ci64(stage_bytes);
            let sb = b.op(&format!("arith.muli {st}, {csb} : i64"));
            (st.clone(), b.op(&format!("arith.addi {base}, {sb} : i64")))
        };
        let x_copy = |b: &mut Body, kt: &str| {
            let (st, sb) = stage_of(b, kt);
            let fb = mbar(b, &st);
            let kc = k_coord(b, kt);
            let dx = b.op(&format!("arith.trunci {sb} : i64 to i32"));
            let mc = b.op(&format!("arith.trunci {m0} : i64 to i32"));
            let bytes = b.op(&format!("arith.constant {a_bytes} : i32"));
            let xmap = b.op("llvm.ptrtoint %x : !llvm.ptr<1> to i64");
            tma_arm_copy_2d(b, &fb, &bytes, &dx, &xmap, &kc, &mc);
        };
        dequant_producer(b, &DequantProducer { t: &t, wdtype, k, bn, wn, f0: f0.as_deref(), n0: &n0, k0: k0.as_deref(), nk, stages, a_bytes, f16 }, &stage_of, &mbar, &x_copy)?;
        b.line("}");
        let cons = b.op(&format!("arith.cmpi ult, {t}, {c256} : i64"));
        b.line(&format!("scf.if {cons} {{"));
        b.line(&format!("llvm.inline_asm has_side_effects \"setmaxnreg.inc.sync.aligned.u32 {DEQ_CONSUMER_REGS};\", \"\" : () -> ()"));
        if b.pdl && !b.waited {
            b.wait_for_previous();
        }
    } else if wspec {
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
            let kc = k_coord(b, kt);
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
        wait_stage_empty(b, &kt, stages, &mbar);
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
pub(crate) fn store_swiglu_fragments(b: &mut Body, ra: &str, f0: &str, tq: &str, q: usize, vals: &[String], f16: bool) -> Result<(), String> {
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

/// The pipelined Hopper matmul kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn pipe_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    pipe_fits(spec, b.outer())?;
    Ok(match spec {
        KernelSpec::Ws { inner } => {
            // (also around the SwiGLU epilogue)
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
            b.tma = true;
            emit_into(b, inner)?
        }
        KernelSpec::SplitK { inner, splits } => {
            b.split_k = Some(*splits);
            emit_into(b, inner)?.replacen("%y: !llvm.ptr<1>", "%yparts: !llvm.ptr<1>", 1)
        }
        KernelSpec::SwiGluPipe { inner } => {
            b.swiglu_pipe = true;
            emit_into(b, inner)?.replacen("%w: !llvm.ptr<1>", "%w0: !llvm.ptr<1>, %w1: !llvm.ptr<1>", 1).replacen("%y: !llvm.ptr<1>", "%y: !llvm.ptr<1>, %yh: !llvm.ptr<1>", 1)
        }
        KernelSpec::MatMulPipe { k, n: _, wdtype, bias, residual, bn, stages, overlap, a16, bm } => {
            emit_gemm_pipe(b, *k, *wdtype, *bias, *residual, PipeTiling { bn: *bn, stages: *stages, overlap: *overlap, a16: *a16, bm: *bm })?
        }
        other => return Err(format!("`{}` is not one of the pipelined Hopper matmul kernels", other.symbol())),
    })
}
