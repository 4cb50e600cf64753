//! Every compile-time choice of the code generator, as one typed value: [`CodegenOptions`].
//!
//! `Default` is what production builds. The compiler reads the `DSC_*` environment variables
//! once ([`CodegenOptions::from_vars`], called with the process environment by
//! `dsc_compiler::codegen_options_from_env`; the names stay for the sweep scripts), passes the
//! value down explicitly and writes it into the plan header, where `dsc inspect` prints it.
//! Nothing inside this crate reads the environment.
//!
//! Two kinds of options:
//! - [`ScheduleOptions`]: which steps and kernels the schedule picks (`lower`). What they
//!   choose lands in the [`KernelSpec`](crate::KernelSpec)s, so it is in every symbol.
//! - [`KernelOptions`]: how a kernel's body is written for the same spec. They cannot change a
//!   kernel's launch geometry (which the runtime derives from the spec alone). A plan built with
//!   non-default ones carries their hash in every kernel symbol (`_x` + 8 hex digits,
//!   [`crate::compile_kernels`]), so two builds never ship different code under one name.
//!
//! A knob measured worse than the default is deleted, not kept for A/B: git keeps it.

use serde::{Deserialize, Serialize};

/// The whole configuration of one compile's code generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CodegenOptions {
    pub schedule: ScheduleOptions,
    pub kernels: KernelOptions,
}

/// Which pipelined wgmma matmul alternatives load their W tiles by TMA (`schedule::tma_wrap`).
/// Measured on the H200 (bench-gemm, bench/results/tma-silu-half-2026-11-30.json, 8B shapes):
/// the 128-row tiles of at most 128 columns gain (o 4096x4096x4096 346.8 -> 315.6 us, down at
/// 512 rows 129.6 -> 104.7 us and at 4096 982.8 -> 809.6 us), the 256-column ones lose 1-4%
/// (gate/up at 4096 rows 2,098 -> 2,179 us, lm_head 9,565 -> 9,983), and the 64-row decode
/// tiles are within noise alone and 0.5-1.8% slower end to end (b32 6,460 -> 6,382 tok/s).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Tma {
    Off,
    /// the 128-row tiles of at most 128 columns (the default)
    Narrow,
    /// every pipelined matmul (DSC_TMA=all, for sweeps)
    All,
}

/// Which gate/up matmul alternatives take the SwiGLU epilogue ([`ScheduleOptions::swiglu_pipe`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwiGluFusion {
    Off,
    /// the first pipelined alternative in 64-row tiles (batched decode, 32-64 rows on the 8B shape)
    Batched,
    /// every pipelined alternative, where the rows they take form one interval
    All,
}

/// Head dims whose one-token decode attention loads its first K/V rows before
/// `griddepcontrol.wait` ([`KernelOptions::attn_early`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttnEarly {
    Off,
    /// head dims up to 64 (the default)
    #[serde(rename = "up_to_64")]
    UpTo64,
    All,
}

/// The schedule's choices (graph → steps, `lower`). Each field's doc says what it does, what
/// it measured and its environment variable. (The measured history of each is in
/// docs/perf.md and bench/results.)
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScheduleOptions {
    /// RMSNorm folded into the decode GEMVs after it, the SwiGLU GEMV included (the GEMVs load
    /// their first weights before waiting for the previous kernel: SmolLM2 b1 +13-18%, 8B b1
    /// neutral to +4%, bench/results/norm-fusion-2026-11-30.json; DSC_NORM_FUSION=0 off)
    pub norm_fusion: bool,
    /// from [`ScheduleOptions::few_x16_min`] rows the batched-decode GEMV reads a 16-bit copy
    /// of x (DSC_FEW_X16=0 off)
    pub few_x16: bool,
    /// decode attention split over blocks along the context, then merged, for contexts from
    /// [`ScheduleOptions::split_kv_from`] keys (`split_attention`; DSC_SPLIT_KV=0 off)
    pub split_kv: bool,
    /// batched decode of matmuls with few column tiles in `S` K-parts over blocks (`split_k`;
    /// [`crate::schedule::SPLIT_K_PARTS`] parts; DSC_SPLIT_K=S picks S, DSC_SPLIT_K=0 off)
    pub split_k: Option<usize>,
    /// an RMSNorm whose output a matmul reads in 16 bits writes that copy itself (norm +
    /// quantize, `insert_half_casts`: 8B b32 6,322 -> 6,426, b64 10,233 -> 10,523, prefill 512
    /// 21.7k -> 22.6k tok/s, bench/results/norm-half-2026-11-30.json; DSC_NORM_HALF=0 off)
    pub norm_half: bool,
    /// ... and so does a silu_mul step (`SiluMulHalf`: 8B b16 3,388 -> 3,426 tok/s,
    /// bench/results/tma-silu-half-2026-11-30.json; with `norm_half` only; DSC_SILU_HALF=0 off)
    pub silu_half: bool,
    /// which gate/up matmul alternatives compute h = silu(gate) · up in their epilogue
    /// (`fuse_swiglu_pipe`; with `silu_half` only): `All` (8B b128 +8.5%, prefill 512 / 4096
    /// +6% / +10%, bench/results/swiglu-all-2026-11-30.json); DSC_SWIGLU_PIPE=0 | batched
    pub swiglu_pipe: SwiGluFusion,
    /// the split-K reduce of a merged Q/K/V matmul folded into the `QkvRopeCache` step reading
    /// it (`fold_splitk_reduce_rope`: 8B b32 4.619 -> 4.593 ms per step; DSC_SPLITK_ROPE=0 off)
    pub splitk_rope: bool,
    /// ... and the split-K reduce and the RMSNorm after it into one kernel
    /// (`fold_splitk_reduce_norm`: 8B b32 4.546 -> 4.523 ms per step,
    /// bench/results/swiglu-splitk-norm-2026-11-30.json; DSC_SPLITK_NORM=0 off)
    pub splitk_norm: bool,
    /// thread-block cluster size of that kernel (1, 2, 4 or 8; None: the measured default,
    /// `kernels::SPLITK_NORM_CLUSTER`; DSC_SPLITK_NORM_CLUSTER=C)
    pub splitk_norm_cluster: Option<usize>,
    /// which pipelined wgmma matmuls load W by TMA ([`Tma`]; DSC_TMA=0 | all)
    pub tma: Tma,
    /// the pipelined matmul's 128-row tiles warp-specialized, x and W by TMA from a producer
    /// warpgroup (`KernelSpec::Ws`: 8B down at 4,096 rows 621 -> 710 TFLOP/s, lm_head 455 ->
    /// 656, bench/results/gemm-ws-2026-11-30.json; DSC_GEMM_WS=0 off)
    pub ws: bool,
    /// the batched-decode 64-row tiles warp-specialized too from `schedule::WS64_MIN_ROWS` rows
    /// (8B b128 16.2k -> 19.1k tok/s, SmolLM2 shape b64 51.7k -> 63.8k; DSC_GEMM_WS64=0 off)
    pub ws64: bool,
    /// 256-column prefill tiles where they give three waves of blocks (DSC_GEMM_WIDE=0 off)
    pub gemm_wide: bool,
    /// the prefill matmul's tiling for every N, for sweeps: (BN, stages, overlap, x in 16 bits)
    /// (None: `kernels::pipe_tiling`; DSC_GEMM_PIPE=BN,S,O,A; one that does not fit is refused)
    pub gemm_pipe: Option<(usize, usize, bool, bool)>,
    /// the batched-decode 64-row tiling for every N, for sweeps: (BN, stages) (None:
    /// `kernels::pipe64_tiling`; DSC_GEMM_PIPE64=BN,S)
    pub gemm_pipe64: Option<(usize, usize)>,
    /// the fewest rows the pipelined Hopper matmul takes (None: by N, `schedule::pipe_min_rows`;
    /// DSC_PIPE_MIN_ROWS=R, R ≥ 2)
    pub pipe_min_rows: Option<i64>,
    /// rows (min, max) the 64-row tiles take ahead of the batched GEMV (None: by N,
    /// `schedule::pipe64_rows`; Some((1, 0)): never; DSC_PIPE64_ROWS=MIN,MAX, "0,0" never)
    pub pipe64_rows: Option<(i64, i64)>,
    /// the most rows the batched-decode GEMV takes (DSC_GEMV_FEW_MAX)
    pub gemv_few_max: i64,
    /// the fewest rows for which the batched-decode GEMV reads x in 16 bits (with `few_x16`:
    /// at 8 rows the f32 x kernel is 10-20% faster, at 32 the bf16 one 20-25%,
    /// bench/results/few-x16-2026-11-29.json; DSC_FEW_X16_MIN=R, R ≥ 2)
    pub few_x16_min: i64,
    /// the wide one-row GEMV (lm_head-sized N) where it fits (DSC_GEMV_WIDE=0: split-K)
    pub gemv_wide: bool,
    /// prefill attention on the tensor cores, FlashAttention tiles (DSC_NO_FLASH set: off)
    pub flash: bool,
    /// the prefill attention's products on wgmma on bf16 pools at D 128 (`FlashWgmma`: 8B
    /// layer at 4,096 tokens 249 -> 351 TFLOP/s, bench/results/flash-wgmma-2026-11-30.json;
    /// DSC_FLASH_WGMMA=0 off)
    pub flash_wgmma: bool,
    /// warps (of 16 query rows) per block of the mma.sync prefill attention: 4 or 8
    /// (DSC_FLASH_WARPS)
    pub flash_warps: usize,
    /// m16 tiles per warp of that kernel: 1 or 2 (DSC_FLASH_MTILES)
    pub flash_mtiles: usize,
    /// warps per block of the decode attention, 1..=32 (16: 8B b1 194 -> 213 tok/s, SmolLM2 b1
    /// 830 -> 1081 vs 4, bench/results/attn16-rope-cache-write-2026-11-29.json; DSC_ATTN_WARPS)
    pub attn_warps: usize,
    /// keys per warp step of the decode attention, 1..=8 (DSC_ATTN_KEYS)
    pub attn_keys: usize,
    /// the decode attention's grouped kernels, a block per (token, group of a KV head's query
    /// heads), for batched decode and the split pass (DSC_ATTN_GROUP=0 off)
    pub attn_group: bool,
    /// warps per block of the grouped decode attention, 1..=32 (8 beat 16 at b32 and b128:
    /// 6,401 / 9,253 with 16; DSC_ATTN_GROUP_WARPS)
    pub attn_group_warps: usize,
    /// keys per warp step of the grouped kernels (None: `attn_keys`; DSC_ATTN_GROUP_KEYS)
    pub attn_group_keys: Option<usize>,
    /// contexts (keys) from which the split decode attention runs (256 keys 11.4 µs one-pass
    /// vs 13.2 split, 1k 21.1 vs 15.9, 8k 143 vs 41 per 8B layer,
    /// bench/results/split-kv-2026-11-30.json; DSC_SPLIT_KV_FROM=N)
    pub split_kv_from: i64,
    /// one-token steps run RoPE and the K/V cache writes inside the decode attention
    /// (`fuse_rope_attention`: SmolLM2 shape b1 +3%, 8B neutral; DSC_ROPE_ATTENTION=0 off)
    pub rope_attention: bool,
    /// the RoPE and the K/V cache writes fused beside the q/k/v matmul (`fuse_qkv_rope_cache`;
    /// DSC_NO_QKV_ROPE_FUSION set: off)
    pub qkv_rope_fusion: bool,
    /// silu(gate) · up fused into one GEMV (`fuse_swiglu`; DSC_NO_SWIGLU_FUSION set: off)
    pub swiglu_fusion: bool,
    /// one-token DeepSeekMoE steps run the shared experts as slots of the routed experts'
    /// kernels (`fuse_moe_shared`; DSC_MOE_SHARED=0 off)
    pub moe_shared: bool,
    /// ... and prefetch the shared experts' gate and up weights into L2 from the attention's
    /// query and value kernels, the shared slots first (`prefetch_shared_experts`; written,
    /// checked on the CPU, not yet run on a GPU: off, DSC_MOE_PREFETCH=1 on)
    pub moe_prefetch: bool,
    /// ... and route the token in the router GEMV's last block, the MoE layer's RMSNorm folded
    /// into it and the gate/up (`fuse_moe_router`, `fold_moe_norm`; not yet run on a GPU: off,
    /// DSC_MOE_ROUTER=1 on)
    pub moe_router: bool,
    /// one-token MLA steps write the latent cache row inside the attention
    /// (`fuse_mla_cache_attention`; not yet run on a GPU: off, DSC_MLA_CACHE_ATTN=1 on)
    pub mla_cache_attention: bool,
    /// one-token steps fold the o projection and its residual into the RoPE attention, one
    /// block per head (`fuse_attention_o`; off: slower than `attn_o_red`'s split blocks;
    /// DSC_ATTN_O=1 on)
    pub attn_o: bool,
    /// one-token steps run the MLP (norm, gate/up, SwiGLU, down + residual) as one kernel
    /// (`fuse_swiglu_down`: SmolLM2 shape b1 2,808 -> 3,298 tok/s,
    /// bench/results/swiglu-down-2026-11-30.json; DSC_SWIGLU_DOWN=0 off)
    pub swiglu_down: bool,
    /// features per block of that kernel: 8, 16 or 32 (W_down's 32 bytes per row at 16 features:
    /// one sector; DSC_SWIGLU_DOWN_FB)
    pub swiglu_down_fb: usize,
    /// features per warp of that kernel: 1 or 2 (DSC_SWIGLU_DOWN_FPW)
    pub swiglu_down_fpw: usize,
    /// ... and the o projection folded into the one-token RoPE attention, each head's
    /// `attn_o_splits` blocks adding their part into the residual stream (`fuse_attention_o_red`:
    /// SmolLM2 shape b1 0.315 -> 0.272 ms per step with 4, bench/results/attn-o-red-2026-11-30.json;
    /// DSC_ATTN_O_RED=0 off)
    pub attn_o_red: bool,
    /// blocks per head of that attention, 1..=16 (4; 2: 0.283, 8: 0.293 ms; DSC_ATTN_O_SPLITS)
    pub attn_o_splits: usize,
    /// ... and the q/k/v GEMV (its RMSNorm prologue included) into that attention, a head's
    /// blocks a thread-block cluster on sm_90a (`fuse_qkv_attention`; DSC_QKV_ATTN=0 off)
    pub qkv_attn: bool,
    /// the norm before a GEMV computed in the row gather that feeds it (`fold_row_gather`;
    /// DSC_ROW_GATHER_NORM=0 off)
    pub row_gather_norm: bool,
    /// the norm folded into the wide lm_head GEMV (`fold_norm_into_wide`; DSC_WIDE_NORM=0 off)
    pub wide_norm: bool,
    /// the embedding gather folded into the first GEMV (`fold_embedding_gather`: SmolLM2 shape
    /// b1 3,900 -> 3,917 tok/s; DSC_GATHER_GEMV=0 off)
    pub gather_gemv: bool,
    /// MiB of the lm_head's weight the last layer's one-token attention prefetches into L2
    /// (`prefetch_lm_head`; None: off; DSC_LMHEAD_PREFETCH_MB=M)
    pub lm_head_prefetch_mb: Option<usize>,
    /// the decode attention prefetches the next matmul's weights into L2
    /// (`prefetch_after_attention`; off: 8B b1 259 -> 256 tok/s, b32 6,532 -> 6,505,
    /// bench/results/attn-prefetch-2026-11-30.json; DSC_ATTN_PREFETCH=1 on)
    pub attn_prefetch: bool,
    /// the plan carries the split argmax (several blocks per logits row; DSC_ARGMAX_SPLIT=0 off)
    pub argmax_split: bool,
    /// ... and the cluster argmax beside it (SmolLM2 b1 +0.35%, 8B neutral; DSC_ARGMAX_CLUSTER=0
    /// off)
    pub argmax_cluster: bool,
    /// the argmax folded into the logits step's wide lm_head (`ArgmaxFold`; DSC_ARGMAX_FOLD=0 off)
    pub argmax_fold: bool,
}

impl ScheduleOptions {
    /// The prefill matmul's tiling [`ScheduleOptions::gemm_pipe`] asks for, if any.
    pub fn pipe_override(&self) -> Option<crate::kernels::PipeTiling> {
        self.gemm_pipe.map(|(bn, stages, overlap, a16)| crate::kernels::PipeTiling { bn, stages, overlap, a16, bm: crate::kernels::PIPE_BM })
    }
    /// The batched-decode 64-row tiling [`ScheduleOptions::gemm_pipe64`] asks for, if any.
    pub fn pipe64_override(&self) -> Option<crate::kernels::PipeTiling> {
        self.gemm_pipe64.map(|(bn, stages)| crate::kernels::PipeTiling { bn, stages, overlap: true, a16: true, bm: 64 })
    }
    /// The prefill matmul's tiling for N columns: the override, else `kernels::pipe_tiling`.
    pub fn pipe_tiling(&self, n: usize) -> crate::kernels::PipeTiling {
        self.pipe_override().unwrap_or_else(|| crate::kernels::pipe_tiling(n))
    }
    /// The batched-decode 64-row tiling for N columns: the override, else
    /// `kernels::pipe64_tiling`.
    pub fn pipe64_tiling(&self, n: usize) -> crate::kernels::PipeTiling {
        self.pipe64_override().unwrap_or_else(|| crate::kernels::pipe64_tiling(n))
    }
}

impl Default for ScheduleOptions {
    fn default() -> Self {
        ScheduleOptions {
            norm_fusion: true,
            few_x16: true,
            split_kv: true,
            split_k: Some(crate::schedule::SPLIT_K_PARTS),
            norm_half: true,
            silu_half: true,
            swiglu_pipe: SwiGluFusion::All,
            splitk_rope: true,
            splitk_norm: true,
            splitk_norm_cluster: None,
            tma: Tma::Narrow,
            ws: true,
            ws64: true,
            gemm_wide: true,
            gemm_pipe: None,
            gemm_pipe64: None,
            pipe_min_rows: None,
            pipe64_rows: None,
            gemv_few_max: 128,
            few_x16_min: 16,
            gemv_wide: true,
            flash: true,
            flash_wgmma: true,
            flash_warps: crate::schedule::FLASH_WARPS,
            flash_mtiles: crate::schedule::FLASH_MTILES,
            attn_warps: 16,
            attn_keys: crate::kernels::ATTN_KEYS,
            attn_group: true,
            attn_group_warps: crate::schedule::ATTN_GROUP_WARPS,
            attn_group_keys: None,
            split_kv_from: crate::schedule::ATTN_SPLIT_FROM_KEYS,
            rope_attention: true,
            qkv_rope_fusion: true,
            swiglu_fusion: true,
            moe_shared: true,
            moe_prefetch: false,
            moe_router: false,
            mla_cache_attention: false,
            attn_o: false,
            swiglu_down: true,
            swiglu_down_fb: 16,
            swiglu_down_fpw: 2,
            attn_o_red: true,
            attn_o_splits: crate::schedule::ATTN_O_SPLITS,
            qkv_attn: true,
            row_gather_norm: true,
            wide_norm: true,
            gather_gemv: true,
            lm_head_prefetch_mb: None,
            attn_prefetch: false,
            argmax_split: true,
            argmax_cluster: true,
            argmax_fold: true,
        }
    }
}

/// How kernels' bodies are written for a given spec. None of these changes a launch's
/// geometry; see the module header for how they enter the symbols.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KernelOptions {
    /// the decode GEMVs load their first weights before `griddepcontrol.wait`
    /// (DSC_GEMV_PRELOAD=0 off)
    pub gemv_preload: bool,
    /// decode GEMVs over at most `kernels::GEMV_PREFETCH_MAX_BYTES` prefetch their rows into
    /// L2 before the wait (DSC_NO_GEMV_PREFETCH set: off)
    pub gemv_prefetch: bool,
    /// the split-K reduce + RMSNorm keeps each thread's piece in registers for the scaling pass
    /// and loads its weights before the wait (prepared, not yet run on the H200;
    /// DSC_SPLITK_NORM_REGS=1 on)
    pub splitk_norm_regs: bool,
    /// the fused MLP adds its four down-projection sums per thread with one vector reduction
    /// (`red.global.add.v4.f32`; prepared; DSC_MLP_RED_V4=1 on)
    pub mlp_red_v4: bool,
    /// column groups (of 8) whose residual/bias pairs the warp-specialized matmul's epilogue
    /// loads before storing any (0: per-element stores; DSC_EPILOGUE_CHUNK=N)
    pub epilogue_chunk: usize,
    /// the prefill attention reduces each row's max and sum as pairwise trees
    /// (DSC_FLASH_TREE=0: left to right)
    pub flash_tree: bool,
    /// blocks per SM the wgmma prefill attention is compiled for (`.minnctapersm`; 3: 8B
    /// layer at 4k 417-427 -> 457-463 TFLOP/s, bench/results/flash-tma-2026-11-30.json; None:
    /// ptxas's choice; DSC_FLASH_WG_MINCTA=N, 0 none)
    pub flash_wg_mincta: Option<u32>,
    /// the wgmma prefill attention's lazy rescale threshold in log2 units (None: every tile
    /// rescaled; DSC_FLASH_LAZY=T, 0 off)
    pub flash_lazy: Option<f32>,
    /// the prefill attention's positions as i32 (fewer registers: spills 44 -> 0 bytes,
    /// bench/results/flash-pos32-2026-11-30.json; DSC_FLASH_POS32=0: i64)
    pub flash_pos32: bool,
    /// blocks per SM the one-token fused kernels keep registers for, 2..=4 (None: ptxas's
    /// choice; DSC_FUSED_MINCTA)
    pub fused_mincta: Option<usize>,
    /// bf16 pools, one-pass decode attention of a block per head: the next warp step's K/V rows
    /// loaded before this step's math (8B b1 3.836 -> 3.796 ms, bench/results/
    /// fusion-2026-11-30-session12.json; DSC_ATTN_PIPELINE=0 off)
    pub attn_pipeline: bool,
    /// the one-token attention's first K/V rows before `griddepcontrol.wait` (SmolLM2 shape b1
    /// 0.377 -> 0.365 ms; the 8B's D 128 lost 0.5%, bench/results/attn-early-2026-11-30.json;
    /// DSC_ATTN_EARLY=0 | all)
    pub attn_early: AttnEarly,
    /// the one-token RoPE attention takes this token's own K/V rows from shared memory instead
    /// of reloading them after the cache write (DSC_ATTN_SHORT=0 off)
    pub attn_short: bool,
    /// the fused q/k/v attention's cluster blocks split the context's keys
    /// (DSC_QKV_ATTN_KEYS=whole: every block all of them)
    pub qkv_attn_key_split: bool,
    /// one block-table lookup per warp step of keys in one cache block
    /// (DSC_ATTN_TABLE_PER_KEY=1: a lookup per key)
    pub attn_one_lookup: bool,
    /// the decode attention sums its heads' and keys' dot products over the warp together (32
    /// shuffles instead of 80 for 4 heads x 4 keys; DSC_ATTN_TRANSPOSED_SUMS=0: each alone)
    pub attn_transposed_sums: bool,
}

impl Default for KernelOptions {
    fn default() -> Self {
        KernelOptions {
            gemv_preload: true,
            gemv_prefetch: true,
            splitk_norm_regs: false,
            mlp_red_v4: false,
            epilogue_chunk: 8,
            flash_tree: true,
            flash_wg_mincta: Some(3),
            flash_lazy: Some(crate::kernels::FLASH_LAZY_THRESHOLD),
            flash_pos32: true,
            fused_mincta: None,
            attn_pipeline: true,
            attn_early: AttnEarly::UpTo64,
            attn_short: true,
            qkv_attn_key_split: true,
            attn_one_lookup: true,
            attn_transposed_sums: true,
        }
    }
}

impl KernelOptions {
    /// A hash of these options that does not change between builds (FNV-1a over their JSON).
    pub fn hash(&self) -> u32 {
        crate::fnv1a(serde_json::to_string(self).unwrap_or_default().as_bytes())
    }

    /// What every kernel symbol of a build with these options ends in: nothing for the
    /// default, else `_x` + their [`KernelOptions::hash`].
    pub fn symbol_suffix(&self) -> String {
        if *self == KernelOptions::default() {
            String::new()
        } else {
            format!("_x{:08x}", self.hash())
        }
    }
}

/// Reads `DSC_*` variables through `get` and collects what does not parse.
struct Vars<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
    errors: Vec<String>,
}

impl Vars<'_> {
    fn raw(&self, name: &str) -> Option<String> {
        (self.get)(name)
    }
    /// on unless the variable is "0"
    fn off_if_0(&self, name: &str, default: bool) -> bool {
        match self.raw(name) {
            Some(v) => v.trim() != "0",
            None => default,
        }
    }
    /// on only where the variable is "1"
    fn on_if_1(&self, name: &str, default: bool) -> bool {
        match self.raw(name) {
            Some(v) => v.trim() == "1",
            None => default,
        }
    }
    /// off where the variable is set at all (the `DSC_NO_*` switches)
    fn off_if_set(&self, name: &str, default: bool) -> bool {
        if self.raw(name).is_some() {
            false
        } else {
            default
        }
    }
    fn bad(&mut self, name: &str, v: &str, want: &str) {
        self.errors.push(format!("{name}={v:?}: expected {want}"));
    }
    /// one of `choices` by its spelling (several spellings may name one value)
    fn choice<T: Copy>(&mut self, name: &str, choices: &[(&str, T)], default: T, want: &str) -> T {
        let Some(v) = self.raw(name) else { return default };
        match choices.iter().find(|(s, _)| *s == v.trim()) {
            Some((_, t)) => *t,
            None => {
                self.bad(name, &v, want);
                default
            }
        }
    }
    fn num<T: std::str::FromStr + PartialOrd + Copy>(&mut self, name: &str, lo: T, hi: T, want: &str) -> Option<T> {
        let v = self.raw(name)?;
        match v.trim().parse::<T>() {
            Ok(x) if x >= lo && x <= hi => Some(x),
            _ => {
                self.bad(name, &v, want);
                None
            }
        }
    }
    fn list<T: std::str::FromStr>(&mut self, name: &str, len: usize, want: &str) -> Option<Vec<T>> {
        let v = self.raw(name)?;
        let xs: Result<Vec<T>, _> = v.split(',').map(|x| x.trim().parse::<T>()).collect();
        match xs {
            Ok(xs) if xs.len() == len => Some(xs),
            _ => {
                self.bad(name, &v, want);
                None
            }
        }
    }
}

impl CodegenOptions {
    /// The options with every `DSC_*` variable that `get` returns applied over the defaults.
    /// A value that does not parse, or is out of range, is an error naming the variable.
    pub fn from_vars(get: &dyn Fn(&str) -> Option<String>) -> Result<CodegenOptions, String> {
        let mut v = Vars { get, errors: vec![] };
        let d = CodegenOptions::default();
        let (s0, k0) = (d.schedule, d.kernels);
        let split_k = match v.num::<usize>("DSC_SPLIT_K", 0, 64, "0 (off) or the K-parts, 2..=64") {
            Some(0 | 1) => None,
            Some(s) => Some(s),
            None => s0.split_k,
        };
        let swiglu_pipe =
            v.choice("DSC_SWIGLU_PIPE", &[("0", SwiGluFusion::Off), ("batched", SwiGluFusion::Batched), ("1", SwiGluFusion::All), ("all", SwiGluFusion::All)], s0.swiglu_pipe, "0, batched or all");
        let tma = v.choice("DSC_TMA", &[("0", Tma::Off), ("narrow", Tma::Narrow), ("1", Tma::All), ("all", Tma::All)], s0.tma, "0, narrow or all");
        let gemm_pipe = v.list::<usize>("DSC_GEMM_PIPE", 4, "BN,STAGES,OVERLAP,A16").map(|p| (p[0], p[1], p[2] == 1, p[3] == 1));
        let gemm_pipe64 = v.list::<usize>("DSC_GEMM_PIPE64", 2, "BN,STAGES").map(|p| (p[0], p[1]));
        let asked = ScheduleOptions { gemm_pipe, gemm_pipe64, ..s0 };
        if asked.pipe_override().is_some_and(|t| !t.fits()) {
            v.errors.push("DSC_GEMM_PIPE: BN 64, 128 or 256, the stages within 227 KB of shared memory, 3+ with overlap".into());
        }
        if asked.pipe64_override().is_some_and(|t| !t.fits()) {
            v.errors.push("DSC_GEMM_PIPE64: BN 64, 128, 224 or 256, the stages within 227 KB of shared memory".into());
        }
        let pipe64_rows = v.list::<i64>("DSC_PIPE64_ROWS", 2, "MIN,MAX").map(|p| if p[0] >= 2 && p[1] >= p[0] { (p[0], p[1]) } else { (1, 0) });
        let splitk_norm_cluster = v.num::<usize>("DSC_SPLITK_NORM_CLUSTER", 1, 8, "1, 2, 4 or 8");
        if splitk_norm_cluster.is_some_and(|c| !c.is_power_of_two()) {
            v.errors.push("DSC_SPLITK_NORM_CLUSTER: expected 1, 2, 4 or 8".into());
        }
        let flash_warps = v.num::<usize>("DSC_FLASH_WARPS", 4, 8, "4 or 8").filter(|w| [4, 8].contains(w)).unwrap_or(s0.flash_warps);
        let swiglu_down_fb = v.num::<usize>("DSC_SWIGLU_DOWN_FB", 8, 32, "8, 16 or 32").filter(|f| [8, 16, 32].contains(f)).unwrap_or(s0.swiglu_down_fb);
        let schedule = ScheduleOptions {
            norm_fusion: v.off_if_0("DSC_NORM_FUSION", s0.norm_fusion),
            few_x16: v.off_if_0("DSC_FEW_X16", s0.few_x16),
            split_kv: v.off_if_0("DSC_SPLIT_KV", s0.split_kv),
            split_k,
            norm_half: v.off_if_0("DSC_NORM_HALF", s0.norm_half),
            silu_half: v.off_if_0("DSC_SILU_HALF", s0.silu_half),
            swiglu_pipe,
            splitk_rope: v.off_if_0("DSC_SPLITK_ROPE", s0.splitk_rope),
            splitk_norm: v.off_if_0("DSC_SPLITK_NORM", s0.splitk_norm),
            splitk_norm_cluster,
            tma,
            ws: v.off_if_0("DSC_GEMM_WS", s0.ws),
            ws64: v.off_if_0("DSC_GEMM_WS64", s0.ws64),
            gemm_wide: v.off_if_0("DSC_GEMM_WIDE", s0.gemm_wide),
            gemm_pipe,
            gemm_pipe64,
            pipe_min_rows: v.num::<i64>("DSC_PIPE_MIN_ROWS", 2, 1 << 20, "rows ≥ 2"),
            pipe64_rows,
            gemv_few_max: v.num::<i64>("DSC_GEMV_FEW_MAX", 0, 1 << 20, "rows").unwrap_or(s0.gemv_few_max),
            few_x16_min: v.num::<i64>("DSC_FEW_X16_MIN", 2, 1 << 20, "rows ≥ 2").unwrap_or(s0.few_x16_min),
            gemv_wide: v.off_if_0("DSC_GEMV_WIDE", s0.gemv_wide),
            flash: v.off_if_set("DSC_NO_FLASH", s0.flash),
            flash_wgmma: v.off_if_0("DSC_FLASH_WGMMA", s0.flash_wgmma),
            flash_warps,
            flash_mtiles: v.num::<usize>("DSC_FLASH_MTILES", 1, 2, "1 or 2").unwrap_or(s0.flash_mtiles),
            attn_warps: v.num::<usize>("DSC_ATTN_WARPS", 1, 32, "1..=32").unwrap_or(s0.attn_warps),
            attn_keys: v.num::<usize>("DSC_ATTN_KEYS", 1, 8, "1..=8").unwrap_or(s0.attn_keys),
            attn_group: v.off_if_0("DSC_ATTN_GROUP", s0.attn_group),
            attn_group_warps: v.num::<usize>("DSC_ATTN_GROUP_WARPS", 1, 32, "1..=32").unwrap_or(s0.attn_group_warps),
            attn_group_keys: v.num::<usize>("DSC_ATTN_GROUP_KEYS", 1, 8, "1..=8"),
            split_kv_from: v.num::<i64>("DSC_SPLIT_KV_FROM", 0, i64::MAX, "keys").unwrap_or(s0.split_kv_from),
            rope_attention: v.off_if_0("DSC_ROPE_ATTENTION", s0.rope_attention),
            qkv_rope_fusion: v.off_if_set("DSC_NO_QKV_ROPE_FUSION", s0.qkv_rope_fusion),
            swiglu_fusion: v.off_if_set("DSC_NO_SWIGLU_FUSION", s0.swiglu_fusion),
            moe_shared: v.off_if_0("DSC_MOE_SHARED", s0.moe_shared),
            moe_prefetch: v.on_if_1("DSC_MOE_PREFETCH", s0.moe_prefetch),
            moe_router: v.on_if_1("DSC_MOE_ROUTER", s0.moe_router),
            mla_cache_attention: v.on_if_1("DSC_MLA_CACHE_ATTN", s0.mla_cache_attention),
            attn_o: v.on_if_1("DSC_ATTN_O", s0.attn_o),
            swiglu_down: v.off_if_0("DSC_SWIGLU_DOWN", s0.swiglu_down),
            swiglu_down_fb,
            swiglu_down_fpw: v.num::<usize>("DSC_SWIGLU_DOWN_FPW", 1, 2, "1 or 2").unwrap_or(s0.swiglu_down_fpw),
            attn_o_red: v.off_if_0("DSC_ATTN_O_RED", s0.attn_o_red),
            attn_o_splits: v.num::<usize>("DSC_ATTN_O_SPLITS", 1, 16, "1..=16").unwrap_or(s0.attn_o_splits),
            qkv_attn: v.off_if_0("DSC_QKV_ATTN", s0.qkv_attn),
            row_gather_norm: v.off_if_0("DSC_ROW_GATHER_NORM", s0.row_gather_norm),
            wide_norm: v.off_if_0("DSC_WIDE_NORM", s0.wide_norm),
            gather_gemv: v.off_if_0("DSC_GATHER_GEMV", s0.gather_gemv),
            lm_head_prefetch_mb: v.num::<usize>("DSC_LMHEAD_PREFETCH_MB", 0, 1 << 16, "MiB").filter(|&m| m > 0),
            attn_prefetch: v.on_if_1("DSC_ATTN_PREFETCH", s0.attn_prefetch),
            argmax_split: v.off_if_0("DSC_ARGMAX_SPLIT", s0.argmax_split),
            argmax_cluster: v.off_if_0("DSC_ARGMAX_CLUSTER", s0.argmax_cluster),
            argmax_fold: v.off_if_0("DSC_ARGMAX_FOLD", s0.argmax_fold),
        };
        let attn_early = v.choice("DSC_ATTN_EARLY", &[("0", AttnEarly::Off), ("64", AttnEarly::UpTo64), ("all", AttnEarly::All)], k0.attn_early, "0, 64 or all");
        let flash_wg_mincta = match v.num::<u32>("DSC_FLASH_WG_MINCTA", 0, 32, "0..=32") {
            Some(0) => None,
            Some(n) => Some(n),
            None => k0.flash_wg_mincta,
        };
        let flash_lazy = match v.num::<f32>("DSC_FLASH_LAZY", 0.0, 16.0, "0 (off) or a threshold up to 16") {
            Some(t) if t > 0.0 => Some(t),
            Some(_) => None,
            None => k0.flash_lazy,
        };
        let kernels = KernelOptions {
            gemv_preload: v.off_if_0("DSC_GEMV_PRELOAD", k0.gemv_preload),
            gemv_prefetch: v.off_if_set("DSC_NO_GEMV_PREFETCH", k0.gemv_prefetch),
            splitk_norm_regs: v.on_if_1("DSC_SPLITK_NORM_REGS", k0.splitk_norm_regs),
            mlp_red_v4: v.on_if_1("DSC_MLP_RED_V4", k0.mlp_red_v4),
            epilogue_chunk: v.num::<usize>("DSC_EPILOGUE_CHUNK", 0, 64, "0..=64").unwrap_or(k0.epilogue_chunk),
            flash_tree: v.off_if_0("DSC_FLASH_TREE", k0.flash_tree),
            flash_wg_mincta,
            flash_lazy,
            flash_pos32: v.off_if_0("DSC_FLASH_POS32", k0.flash_pos32),
            fused_mincta: v.num::<usize>("DSC_FUSED_MINCTA", 2, 4, "2..=4"),
            attn_pipeline: v.off_if_0("DSC_ATTN_PIPELINE", k0.attn_pipeline),
            attn_early,
            attn_short: v.off_if_0("DSC_ATTN_SHORT", k0.attn_short),
            qkv_attn_key_split: v.raw("DSC_QKV_ATTN_KEYS").is_none_or(|x| x.trim() != "whole"),
            attn_one_lookup: !v.on_if_1("DSC_ATTN_TABLE_PER_KEY", !k0.attn_one_lookup),
            attn_transposed_sums: v.off_if_0("DSC_ATTN_TRANSPOSED_SUMS", k0.attn_transposed_sums),
        };
        if v.errors.is_empty() {
            Ok(CodegenOptions { schedule, kernels })
        } else {
            Err(v.errors.join("; "))
        }
    }

    /// The options that differ from [`Default`], as `section.field = value` lines (what `dsc
    /// inspect` prints; empty: every option at its default).
    pub fn differences(&self) -> Vec<String> {
        let (a, b) = (serde_json::to_value(self).unwrap_or_default(), serde_json::to_value(CodegenOptions::default()).unwrap_or_default());
        let mut out = vec![];
        for section in ["schedule", "kernels"] {
            if let (Some(x), Some(y)) = (a[section].as_object(), b[section].as_object()) {
                let mut lines: Vec<String> = x.iter().filter(|(k, v)| y.get(*k) != Some(v)).map(|(k, v)| format!("{section}.{k} = {v} (default {})", y.get(k).cloned().unwrap_or_default())).collect();
                // (by name whatever serde_json's map order: llguidance turns on preserve_order)
                lines.sort();
                out.extend(lines);
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from(pairs: &[(&str, &str)]) -> Result<CodegenOptions, String> {
        let m: std::collections::HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        CodegenOptions::from_vars(&|k| m.get(k).cloned())
    }

    #[test]
    fn no_variables_is_the_default_and_the_default_round_trips() {
        assert_eq!(from(&[]).unwrap(), CodegenOptions::default());
        let j = serde_json::to_string(&CodegenOptions::default()).unwrap();
        assert_eq!(serde_json::from_str::<CodegenOptions>(&j).unwrap(), CodegenOptions::default());
        assert!(CodegenOptions::default().differences().is_empty());
        // a plan written before a field existed reads with that field at its default
        assert_eq!(serde_json::from_str::<CodegenOptions>("{\"schedule\": {\"ws\": false}}").unwrap().schedule.ws, false);
        assert!(serde_json::from_str::<CodegenOptions>("{\"schedule\": {\"no_such\": 1}}").is_err());
    }

    #[test]
    fn variables_set_their_fields_and_bad_values_name_the_variable() {
        let o = from(&[("DSC_TMA", "all"), ("DSC_SPLIT_K", "0"), ("DSC_NO_FLASH", "1"), ("DSC_ATTN_EARLY", "all"), ("DSC_GEMM_PIPE", "128,6,1,1")]).unwrap();
        assert_eq!((o.schedule.tma, o.schedule.split_k, o.schedule.flash, o.kernels.attn_early), (Tma::All, None, false, AttnEarly::All));
        assert_eq!(o.schedule.gemm_pipe, Some((128, 6, true, true)));
        assert_eq!(o.differences().len(), 5, "{:?}", o.differences());
        let e = from(&[("DSC_ATTN_WARPS", "64"), ("DSC_TMA", "maybe")]).unwrap_err();
        assert!(e.contains("DSC_ATTN_WARPS=\"64\"") && e.contains("DSC_TMA=\"maybe\""), "{e}");
        assert_ne!(KernelOptions::default().hash(), from(&[("DSC_FLASH_TREE", "0")]).unwrap().kernels.hash());
    }
}
