//! The attention kernel families: decode over the paged KV cache (`paged`: one-pass, grouped,
//! split with its combine), prefill (`flash`: mma.sync and wgmma), and the one-token fusions
//! around the decode attention (`qkv`: RoPE and the cache writes, the o projection, the q/k/v
//! GEMV).
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - Paged attention: decode-sized steps run `paged_attention_*` (a block per (token, head):
//!   grid x = tokens, y = heads; 16 warps splitting the keys, each warp taking 4 consecutive keys
//!   per loop step with their K and V rows loaded together: `KernelSpec::PagedAttention.keys`,
//!   DSC_ATTN_KEYS). Batched decode from 128 (token, KV head) blocks (`schedule::ATTN_GROUP_MIN_BLOCKS`:
//!   16 tokens on the 8B shape) takes the step's `few` alternative `paged_attention_*_w8_g{G}`
//!   (`KernelSpec::PagedAttention.group` = G = `schedule::attention_group_size`: the whole GQA
//!   group H / KVH where its softmax state fits a lane and 48 KiB of shared memory, else its
//!   largest divisor that does; a block per (token, G query heads of one KV head) whose warps
//!   take those heads over K/V rows loaded once, grid y = H / G; up to the prefill kernel's rows;
//!   DSC_ATTN_GROUP=0 at compile time leaves it out). Inside every decode attention kernel
//!   (`emit_paged_attention`) a warp step's dot products are summed over the warp together
//!   (`Body::warp_sums`, a transposing butterfly), the one-pass kernels look up the block
//!   table once per warp step (its keys share a cache block), and on bf16 pools the
//!   block-per-head ones load the next step's K/V rows before this step's math (raw 16-bit vectors carried by the loop;
//!   DSC_ATTN_TRANSPOSED_SUMS=0 / DSC_ATTN_TABLE_PER_KEY=1 / DSC_ATTN_PIPELINE=0 at compile time
//!   for A/B). Long
//!   contexts of few rows take the split decode attention instead (`schedule::split_attention`;
//!   DSC_SPLIT_KV=0 at compile time leaves it out): beside the one-pass step (kept with
//!   `max_context` = 511, and once more with `min_context` = 512 from 129 rows = tokens × heads)
//!   come two steps with `min_context` = 512 (`schedule::ATTN_SPLIT_FROM_KEYS`) and `max_rows` =
//!   128 (`ATTN_SPLIT_ROWS`): `{node}@split16`, a block per (token, head, part of the context:
//!   grid y = H · 16; per (token, G heads, part) where H / G · 16 ≥ 128,
//!   `PagedAttentionSplit.group`)
//!   writing partial softmax states into that buffer — `gpu::split_base` sizes it
//!   [T, H, S·(D + 2)]; a row takes min(ceil(ctx / 256), 16, 512 / rows) parts
//!   (`kernels::split_parts`) — and the merge `attention_combine_*` on `{node}` itself. Steps of
//!   more than 128 tokens run the one-pass steps' `large` alternative
//!   `flash_attention_*` (`KernelSpec::FlashAttention`, `kernels::emit_flash_attention`,
//!   FlashAttention-2 on `mma.sync` m16n8k16, sm_80 and sm_90a): a block per (64 tokens, head)
//!   (the last query tiles first: they see the most keys), S = QKᵀ and P·V in registers with
//!   the online softmax in exp2. From bf16 pools (the default of the seeded shapes) the 64-key
//!   K and V tiles are copied as the pools hold them with `cp.async` into two shared-memory
//!   stages — tile i + 1's copies in flight while tile i is computed — and the B fragments come
//!   from `ldmatrix` (K) and `ldmatrix.trans` (key-major V); from f32 pools they are gathered into
//!   one buffer as bf16 (V transposed). A tile's rows are taken in runs of one sequence (a step
//!   mixes prefill chunks and decode tokens; each warp finds a run's end and its positions'
//!   range with a ballot and shuffles over its lanes' rows), each run walking its sequence's keys
//!   0..=max position; rows outside the run and keys past a row's position are masked, in
//!   tiles that have any (tiles wholly below the diagonal of a run filling the block skip the
//!   mask). `FlashAttention.warps` (4; 8 measured slower: DSC_FLASH_WARPS=8) and `.mtiles` (1
//!   m16 tile per warp; 2 — Q staged in shared memory, each K/V fragment feeding two MMAs —
//!   spills at D = 128: DSC_FLASH_MTILES=2) are compile-time knobs. (`DSC_NO_FLASH=1` at compile
//!   time leaves it out.)
//!   On sm_90a, bf16 pools and D = 128 the step also has a `hopper` alternative,
//!   `flash_attention_*_wg` (`KernelSpec::FlashWgmma`, on; DSC_FLASH_WGMMA=0 off): the same
//!   kernel with both products on wgmma — the K and V tiles are written by the copies in column
//!   blocks of 64 head-dim elements (64 keys x 128 bytes, 128-byte swizzle, base aligned to 1 KB,
//!   a `fence.proxy.async` before the block barrier), S = QKᵀ is m64n64k16 with Q's fragments from
//!   registers and K's tile as a K-major descriptor, O += PV is m64n128k16 with P from registers
//!   and V's tile as an N-major descriptor (`imm-trans-b`; LBO = the 8 KB between column blocks,
//!   SBO = 1 KB between 8-key groups): each tile is read once per warpgroup instead of once per
//!   warp (8B layer at 4k: 249 -> 351 TFLOP/s). Where the cache block size is a multiple of 8
//!   (`kernels::flash_wg_tma_rows`; `_wgt`)
//!   the K/V tiles come by TMA instead: the step's pool args become `{pool}@kvmap{rows}` (the
//!   runtime encodes a 4-D tensor map per pool — [blocks, block size, KV heads, D], boxes of 64
//!   head-dim columns x one cache block's rows, 128-byte swizzle — in `GpuBackend::new`,
//!   `gpu::pool_tensor_map`, keyed by the pool state the cache writes alias), box w of a tile
//!   issued by lane 0 of warp w on the stage's mbarrier (armed by thread 0 with the stage's
//!   bytes), its block-table entry read at the top of the previous iteration; each run of a
//!   sequence reads the two stages' use counts (past the mbarriers) for its wait parities
//!   (351 -> 424 TFLOP/s at 4k: the copies' address math was ~27% of the loop's instructions, the
//!   integer pipe the busiest). The wgmma kernel rescales lazily (`kernels::flash_lazy_threshold`,
//!   FlashAttention-4's trick; default 8 log2 units, DSC_FLASH_LAZY=0 off): a row's reference max
//!   moves only when a tile's max passes it by more than 8, so P <= 256 and O and the row sum
//!   share the stale reference (exact after the final division), and a warp multiplies its 64 O
//!   accumulators only when one of its rows moved (a ballot; after the first tiles almost never);
//!   its wgmma descriptors are built from a 32-bit address field (`Body::smem_desc_lo` /
//!   `Body::desc_at`: one add per descriptor). D = 64 failed the kernel check and is not
//!   lowered (`kernels::FLASH_WG_D`). Two variants were checked, measured slower and
//!   deleted (git has them): two query heads of a KV head per block, a warpgroup each, sharing
//!   the tiles, and three K/V stages with Q in shared memory read through a descriptor, the next
//!   tile's S issued before this tile's softmax.
//! - KV pools of `precision.kv_cache` = f32 or bf16 (`schedule::gpu_kv`; f16 / FP8 are refused with
//!   the node named): the cache writes (`CacheWrite`, `RopeCacheWrite`, `QkvRopeCache`: `.kv`)
//!   round to bf16 on the way in — as the CPU executor's `cache_write` does for a bf16 state:
//!   the cast is part of the write, no Cast node — and the attention kernels (`.kv`, names
//!   `_kvbf16`) read 16-bit rows (decode: lane l takes head-dim elements l·D/32.. in one vector
//!   load instead of l, l + 32, ..). The runtime sizes the pools by their dtype
//!   (`DType::bytes_for`; `serve` counts KV bytes per token the same way).

mod flash;
mod paged;
mod qkv;

pub use flash::*;
pub use paged::*;
pub(crate) use qkv::*;
