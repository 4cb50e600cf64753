//! The GPU backend: runs a plan's launch schedule with cudarc (the driver API, loaded at run
//! time). Weights are uploaded once as raw bytes (packed formats stay packed; seeded ones are
//! generated on the device); the KV pools are allocated once. Each step shape (T, S, R) gets a
//! bucket: its inputs and activations allocated once, its launches resolved once, and from
//! its second run on a CUDA graph that replays them (steps of up to 64 tokens; longer
//! prefill steps run eagerly on a transient bucket).
//!
//! Design notes (what each kernel does and why, with the measurements that chose it):
//! - Context classes: a step may carry `min_context` / `max_context` (plan format v4): it
//!   launches only when the step batch's longest context (max position + 1) lies in that range
//!   (`GpuStep::runs_in_context`). The runtime cuts contexts at `GpuProgram::context_bounds`
//!   (every range's ends) into classes and resolves the schedule once per class, at the class's
//!   shortest context, so the choice is made per bucket and the CUDA graph stays valid while a
//!   sequence grows inside its class. Two steps may write one node (the one-pass attention and
//!   the split's merge, in different classes): one buffer in the memory plan.
//! - The runtime keeps one *bucket* per step shape and context class (T, S, R, class): input buffers, one activation
//!   arena laid out by the plan's memory plan (`gpu.buffers`: lifetimes over the schedule;
//!   `plan::place_buffers` gives offsets once sizes are known, never sharing bytes between
//!   buffers live at the same step), the resolved launches, and from its second run a CUDA graph
//!   (steps of ≤ 128 tokens: `CACHED_MAX_TOKENS`; longer ones get a transient bucket).
//!   **Invariant**: a bucket's arena starts at a 2 MiB boundary (`gpu::ARENA_ALIGN`, the GPU's
//!   large page; DSC_ARENA_ALIGN overrides): where it fell inside its page moved the SmolLM2
//!   b1 step by 8% (session 18). Block tables are padded to the most blocks one sequence can have
//!   (max_seq_len / block size) so MB is fixed.
//! - A matmul step may carry alternatives to its default kernel (the decode GEMV), picked per
//!   step by row count in `GpuStep::alternative` (unit-tested): first on sm_90a the first of
//!   `hopper` (a list of row ranges) that holds the rows — `matmul_pipe*_m64` (64-row tiles, the
//!   warpgroups splitting the columns: batched decode, `schedule::pipe64_rows(N)`: 32..=64 rows where
//!   N ≥ 6144, 48..=64 below; tiles of `kernels::pipe64_tiling(N)`: 256, or 224 where that divides N
//!   and fills the last wave of 132 SMs better — the 8B gate/up —, 128 below 96 tiles), then `matmul_pipe*` above (128-row tiles) from
//!   `schedule::pipe_min_rows(N, bn)` rows — 16 where N has ≥ 96 column tiles, else 64 — or
//!   `matmul_wgmma64_*` from 128; then the first of `few` (a list of row
//!   ranges: the batched-decode GEMVs, any target, up to 128 rows: each weight
//!   read once per 32 rows with swap-AB `mma.sync` for bf16/f16 weights — `matmul_few32_*` on f32
//!   x for 2..=15 rows, `matmul_few32x16_*` on the `{x}@bf16` copy from 16 — or per 8 rows on
//!   the CUDA cores for f32 weights) that holds the rows; then on sm_90a `hopper_small`
//!   (`matmul_wgmma16_*`), else `large` (`matmul_mma_*`, from 16 rows). `dsc-runtime bench-gemm
//!   --m ...` times whichever kernel this picks for each row count. The plain-float GEMV (`emit_gemv`) is a block
//!   of 4 warps per 4 outputs (8 for K ≥ 2,048: `kernels::gemv_tiling`) splitting K, each warp reading 512 contiguous bytes per load
//!   instruction (the layout of every load decides whether a GEMV streams: see docs/perf.md).
//!   The tensor-core matmuls take f16 operands for f16 and block-quantized weights, bf16 for
//!   bf16/f32 (`kernels::tensor_core_f16`). Hopper-only kernels are compiled into the sm_90a PTX alone
//!   (`KernelSpec::hopper_only`). `gpu.argmax` names the kernel that picks greedy tokens on the
//!   device (`Backend::step_greedy`) at every row count: a block per row (`gpu.argmax_block`
//!   threads; plans without the field: the older warp per row, from 8 rows only), or where the
//!   plan has `gpu.argmax_split` (since session 18: vocabularies of 4·512+ logits) that many
//!   blocks per row (`KernelSpec::ArgmaxSplit`: partials and a u32 counter per row, allocated
//!   once by the runtime for up to `SYNC_TOKENS` rows — zero before, reset by the last block),
//!   and on sm_90a where the plan has
//!   `gpu.argmax_cluster` a thread-block cluster of 8 blocks per row instead
//!   (`KernelSpec::ArgmaxCluster`, Hopper-only: the blocks' partials into block 0's shared
//!   memory, one cluster barrier; DSC_ARGMAX_CLUSTER=0 at compile time leaves it out).
//!   Pipelined greedy steps
//!   (`Backend::launch_greedy`) write their ids into two device buffers in turn and copy them to
//!   pinned host memory on a second stream after an event (`GpuBackend::copy_stream`), so no copy-engine turn sits between a step's
//!   argmax and the next step. A step's inputs (tokens, positions, seq ids, slots, block table,
//!   logit rows: one packed span of the arena) go up through the runtime's own kernel
//!   `dsc_inputs` (`gpu::inputs_ptx`, hand-written PTX loaded beside the plan's module), which
//!   reads the pinned staging buffer as mapped host memory and, for a fed step, takes the tokens
//!   from the previous step's ids on the device; on sm_90a a fed step launches its variant `dsc_inputs_pdl`
//!   (`gpu::inputs_ptx(true)`, the same text with u64 parameters and the wait) with PDL right behind the previous step's argmax — only the threads
//!   taking a fed id `griddepcontrol.wait`. The logits'
//!   matmul can keep part of its weight in persisting L2 (`RuntimeOptions::l2_persist_mb`, an access policy
//!   window as a launch attribute; with the wide lm_head +0.2-0.35% at 8-30 MB, session 19, not
//!   on by default). The run-time knobs are one `RuntimeOptions` (runtime/src/options.rs: the
//!   paths `DSC_NO_WGMMA`, `DSC_NO_PDL`, `DSC_NO_CUDA_GRAPHS`, `DSC_NO_PIPELINE`, the tunables, and
//!   the measurement knobs in `MeasureOptions`), read once by the binaries; at compile time (`CodegenOptions`; the GEMV
//!   tilings are constants now — A = 2 weight tiles per batched-GEMV block measured +7% for the
//!   8B at b32 but −15% for SmolLM2, and the override went with the other tiling knobs)
//!   `DSC_GEMM_PIPE`, `DSC_FEW_X16=1` (the batched GEMV reads the `{x}@bf16` copy: prepared, not
//!   yet measured), `DSC_GEMV_FEW_MAX` and `DSC_ATTN_WARPS` override the GEMV tilings
//!   and the decode attention's warps per block, and `DSC_NO_GEMV_PREFETCH=1`,
//!   `DSC_NO_QKV_ROPE_FUSION=1`, `DSC_NORM_FUSION=1` switch codegen choices, for sweeps
//!   (`scripts/gpu-sweep.sh`, `SWEEP_ENV` in gpu-prepare.sh; the defaults are the measured best).
//!   Multi-step decode (on since session 20, `scheduler::MULTI_STEP` = 4; `serve --multi-step k`
//!   or DSC_MULTI_STEP=k overrides, 1 off; `GpuBackend::with_multi_step`): the scheduler launches k fed greedy steps of the same rows at once
//!   (`SchedulerConfig::multi_step`, `Engine::pipelined_batches`: every row greedy, nothing
//!   waiting for admission, k tokens of room, no more rows than `Backend::greedy_steps_rows`;
//!   `Backend::launch_greedy_steps`), the GPU backend —
//!   for steps of at most `MULTI_STEP_MAX_ROWS` = 4 rows whose bucket's one-step graph has run
//!   `MULTI_STEP_MIN_RUNS` = 8 times, on one GPU — as one CUDA graph per bucket in two instances
//!   used in turn (`gpu::Multi`; both captured at the bucket's first multi-step launch,
//!   `GpuBackend::capture_multi`). The graph is chained: one `dsc_inputs` launch copies the k
//!   steps' staged spans (one pinned buffer of k spans) into k copies of the packed span kept in
//!   the arena after it (`Bucket::multi_at`: room for 2 x `multi_k` spans and id buffers,
//!   reserved at `prepare` in every cached bucket when DSC_MULTI_STEP allows — only there did the b1 arena land where it runs fast: docs/perf.md "Session 20" item 5), step i's launches take copy i by
//!   `launch_all_over`'s address overrides and its tokens straight from step i - 1's id buffer
//!   (also in the arena; the first step's from the other instance's last one), and the logits
//!   step runs as its plan's `GpuStep::argmax` kernel — `KernelSpec::ArgmaxFold`: the wide
//!   lm_head whose blocks publish (max, index) partials and whose last block to count writes the
//!   id (partials and counters `Bucket::fold`) — or, without one, the argmax kernel under PDL: no
//!   graph launch, input kernel or argmax launch between two steps. The k ids go to pinned host memory on the copy stream as k
//!   in-flight entries. SmolLM2 shape b1 +4%. Pending steps may run k - 1 positions past the
//!   tokens the host knows (`Engine::computed` commits only known tokens to the prefix cache).
//!   Measurement knobs of the runtime: `DSC_GRAPH_REPEAT=n` captures a bucket's launches n
//!   times in its CUDA graph (the same step recomputed; what a graph launch costs its first
//!   kernels: ~9 µs of the SmolLM2 shape's 253, session 19), `DSC_SKIP_KERNELS=a,b` leaves out every launch whose
//!   kernel symbol contains one of the strings (the results are wrong; the step's time without
//!   them bounds what fusing them away can gain: `scripts/gpu-knockout.sh`), and `dsc-runtime
//!   compare-plans A B --seqs N` runs the same batched greedy requests through two plans and
//!   compares the token streams (how a fusion is shown not to change results at batch N).

use crate::engine::{Backend, StepBatch};
use crate::error::{Result, RuntimeError};
use crate::plan::{BufferRef, GpuProgram, Plan, Scalar};
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use dsc_ir::{Graph, Op};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

mod backend;
mod driver;
mod multi;
mod weights;

use multi::{multi_ids_bytes, Multi, MULTI_STEP_MAX_ROWS};

pub use driver::*;

/// Every buffer argument of the plan's Hopper alternatives (where its tensor maps are named).
fn hopper_args(prog: &GpuProgram) -> impl Iterator<Item = &str> {
    prog.steps.iter().flat_map(|s| s.hopper.iter()).filter_map(|l| l.args.as_ref()).flatten().map(String::as_str)
}

fn gerr(msg: impl Into<String>) -> RuntimeError {
    RuntimeError::Gpu(msg.into())
}

fn cu<T>(r: std::result::Result<T, cudarc::driver::DriverError>, what: &str) -> Result<T> {
    r.map_err(|e| gerr(format!("{what}: {e:?}")))
}

/// A pipelined greedy step launched and not yet collected: its token ids' pinned host buffer
/// (filled by an async copy), row count, the event recorded after that copy (this context
/// does not track events itself), and which device ids buffer it copies
struct Inflight {
    host: cudarc::driver::PinnedHostSlice<u8>,
    rows: usize,
    done: cudarc::driver::CudaEvent,
    buf: usize,
}

pub struct GpuBackend<'p> {
    graph: &'p Graph,
    prog: &'p GpuProgram,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    _module: Arc<CudaModule>,
    funcs: HashMap<String, CudaFunction>,
    /// weights and KV pools by node name
    resident: HashMap<String, CudaSlice<u8>>,
    blocks: usize,
    /// MB: block-table columns every step is padded to
    table_width: usize,
    block_size: usize,
    pub target: String,
    /// a MoE plan's routing state: the failover mask lives on the device as the graph input
    /// `expert_mask` (resident, updated in place by `set_expert`), the routers' selections in
    /// `expert_mask@counts` (u32, resident; read back by `moe_stats` at most every
    /// [`MOE_COUNTS_EVERY`])
    moe: Option<crate::engine::MoeState>,
    /// the counts last read back, and when
    moe_counts: std::sync::Mutex<Option<(std::time::Instant, Vec<u64>)>>,
    buckets: HashMap<BucketKey, Bucket>,
    /// where the schedule changes with the context (`GpuProgram::context_bounds`)
    context_bounds: Vec<i64>,
    /// replay decode-sized steps as CUDA graphs (captured on a bucket's second run)
    pub use_graphs: bool,
    /// `RuntimeOptions::wgmma` off: take the mma.sync matmul on sm_90a too (for comparisons)
    pub no_wgmma: bool,
    /// launch with programmatic stream serialization (sm_90a, whose kernels start with
    /// griddepcontrol; `RuntimeOptions::pdl`)
    pub pdl: bool,
    /// k of the scheduler's multi-step launches (`RuntimeOptions::multi_step`; 1: none): a cached bucket's
    /// arena keeps room for two instances' k copies of its packed inputs right after them
    multi_k: usize,
    collective: GpuCollective,
    /// `MeasureOptions::profile`: time every launch with CUDA events (no graphs): kernel →
    /// (launches, µs)
    profile: Option<std::cell::RefCell<BTreeMap<String, (usize, f64)>>>,
    /// pipelined greedy steps launched and not yet collected, oldest first
    inflight: std::collections::VecDeque<Inflight>,
    /// pinned id buffers to reuse
    spare_ids: Vec<cudarc::driver::PinnedHostSlice<u8>>,
    /// pipelined steps' token ids on the device, two in turn: a step's argmax writes one while
    /// the step before's ids, in the other, may still be on their way to the host; the last
    /// step's are the next fed step's input tokens
    feeds: [Option<CudaSlice<u8>>; 2],
    /// which of `feeds` the last pipelined step wrote
    feed_at: usize,
    /// where the last pipelined launch left its last ids when it was a multi-step one
    /// (`Backend::launch_greedy_steps`): (bucket key, graph instance)
    last_multi: Option<(BucketKey, usize)>,
    /// where the ids' device-to-host copies run: a second stream (after an event on the main
    /// one), so the next step's upload and graph need not queue behind a copy that takes
    /// ~10 µs of the stream's time (bench/launch_floor.cu on the H200: 290 -> 279 µs per step
    /// around a 273 µs graph)
    copy_stream: Arc<CudaStream>,
    /// `RuntimeOptions::cached_max_tokens`
    cached_max_tokens: usize,
    /// `RuntimeOptions::pdl_max_tokens`
    pdl_max_tokens: usize,
    /// the measurement knobs (`skip_kernels`, `force_cluster`, `graph_repeat`, the arena's
    /// alignment and pad), announced on stderr at start where set
    measure: crate::options::MeasureOptions,
    /// the split argmax's partials and per-row counters (`GpuProgram::argmax_split`), for up
    /// to [`SYNC_TOKENS`] rows; None: a block per row (the plan has no split kernel)
    argmax_split: Option<(crate::plan::ArgmaxSplit, CudaSlice<u8>, CudaSlice<u8>)>,
    /// `RuntimeOptions::l2_persist_mb`=N: N MB of L2 set aside for persisting lines (capped by the device's
    /// maximum), and the launches of the logits' matmul mark a fraction of their weight's lines
    /// persisting (an access policy window: bytes set aside / the weight's bytes): the lm_head,
    /// read once per step at the step's end, then finds that much in L2 instead of DRAM. 0: off.
    /// (bytes set aside, the largest window the device takes)
    l2_persist: (usize, usize),
    /// pinned buffers the packed inputs go up from, in turn, each with the event after its
    /// last copy
    staging: std::cell::RefCell<std::collections::VecDeque<(cudarc::driver::PinnedHostSlice<u8>, cudarc::driver::CudaEvent)>>,
    /// the step's inputs go up through [`inputs_ptx`]'s kernel, which reads the staged pinned
    /// buffer over PCIe (mapped host memory) and the fed token ids on the device, in place of a
    /// host-to-device copy and a device-to-device one: two copy-engine operations on the
    /// stream cost ~12 µs between a decode step's argmax and its next graph (CUPTI timeline on
    /// the H200, bench/results/timeline-2026-11-30.json)
    inputs_kernel: CudaFunction,
    /// [`inputs_ptx`]`(true)`'s kernel (sm_90a with PDL): a fed step's
    /// inputs go up under programmatic dependent launch after the previous step's argmax
    inputs_pdl: Option<CudaFunction>,
}

/// `RuntimeOptions::l2_persist_mb` (see `GpuBackend::l2_persist`): sets the context's
/// persisting-L2 limit; (bytes set aside, the device's largest access policy window), (0, 0)
/// when off.
fn l2_persist(ctx: &Arc<CudaContext>, mb: usize) -> Result<(usize, usize)> {
    use cudarc::driver::sys::CUdevice_attribute as A;
    if mb == 0 {
        return Ok((0, 0));
    }
    let max = cu(ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_PERSISTING_L2_CACHE_SIZE), "reading the persisting L2 size")?.max(0) as usize;
    let window = cu(ctx.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_ACCESS_POLICY_WINDOW_SIZE), "reading the access policy window size")?.max(0) as usize;
    let bytes = (mb << 20).min(max);
    eprintln!("l2_persist_mb={mb}: {bytes} bytes of L2 for persisting lines (the device's most: {max}; largest window {window})");
    if bytes == 0 || window == 0 {
        return Ok((0, 0));
    }
    cu(ctx.bind_to_thread(), "binding the context")?;
    // SAFETY: a plain driver call on the bound context
    unsafe { cudarc::driver::sys::cuCtxSetLimit(cudarc::driver::sys::CUlimit::CU_LIMIT_PERSISTING_L2_CACHE_SIZE, bytes) }
        .result()
        .map_err(|e| gerr(format!("setting the persisting L2 size to {bytes}: {e:?}")))?;
    Ok((bytes, window))
}

/// The measurement knobs that are set, announced on stderr (some make results wrong).
fn announce(m: &crate::options::MeasureOptions) {
    if !m.skip_kernels.is_empty() {
        eprintln!("DSC_SKIP_KERNELS: leaving out launches of kernels containing {:?} (timing only: results are wrong)", m.skip_kernels);
    }
    if let Some((k, n)) = &m.force_cluster {
        eprintln!("DSC_FORCE_CLUSTER: launching kernels containing {k:?} in clusters of {n} (timing only)");
    }
    if m.graph_repeat > 1 {
        eprintln!("DSC_GRAPH_REPEAT: every CUDA graph holds its step {} times (timing only)", m.graph_repeat);
    }
}

/// Pinned input buffers in turn: a step's inputs are written while up to two steps (the
/// pipelined one and the one before) are in flight.
const STAGING_BUFFERS: usize = 3;

/// How this backend's `all_reduce` steps meet the other tensor-parallel ranks.
pub enum GpuCollective {
    /// world size 1: all_reduce is the identity
    Single,
    /// NCCL on this backend's stream (captured into CUDA graphs like any launch)
    Nccl(cudarc::nccl::Comm),
    /// every rank on one GPU, the sum done by local copies through the host (a check of the
    /// partitioning without a second GPU; never captured)
    Local(Arc<dyn dsc_ir::Collective>),
}

/// Which rank a backend is, and where.
pub struct RankSpec {
    pub device: usize,
    pub rank: usize,
    pub world: usize,
}

/// The PTX target for the device: sm_90a on Hopper, sm_80 on Ampere and Ada.
pub fn target_for(major: i32, minor: i32) -> Option<&'static str> {
    match (major, minor) {
        (9, 0) => Some("sm_90a"),
        (8, _) | (9, _) => Some("sm_80"),
        _ => None,
    }
}

/// Whether a CUDA driver and a device are there, checked before cudarc is asked (its dynamic
/// loading panics where libcuda is missing): Ok(device count), or why not.
pub fn cuda_available() -> std::result::Result<usize, String> {
    // SAFETY: loading the CUDA driver library runs its initializers, as cudarc would.
    let lib = unsafe { libloading::Library::new("libcuda.so.1").or_else(|_| libloading::Library::new("libcuda.so")) };
    if let Err(e) = lib {
        return Err(format!("no CUDA driver on this machine (libcuda.so.1: {e})"));
    }
    match std::panic::catch_unwind(|| cudarc::driver::result::init().and_then(|_| cudarc::driver::result::device::get_count())) {
        Ok(Ok(n)) if n > 0 => Ok(n as usize),
        Ok(Ok(_)) => Err("the CUDA driver sees no GPU".into()),
        Ok(Err(e)) => Err(format!("the CUDA driver failed to start ({e:?})")),
        Err(_) => Err("the CUDA driver could not be loaded".into()),
    }
}

impl<'p> GpuBackend<'p> {
    pub fn new(graph: &'p Graph, plan: &'p Plan, kv_tokens: usize, opts: &RuntimeOptions) -> Result<Self> {
        Self::new_rank(graph, plan, kv_tokens, opts, RankSpec { device: 0, rank: 0, world: 1 }, |_| Ok(GpuCollective::Single))
    }

    /// One rank of a tensor-parallel group: its slices of the weights on GPU `spec.device`;
    /// `collective` is made once this rank's stream exists (NCCL communicators bind to it).
    pub fn new_rank(graph: &'p Graph, plan: &'p Plan, kv_tokens: usize, opts: &RuntimeOptions, spec: RankSpec, collective: impl FnOnce(&Arc<CudaStream>) -> Result<GpuCollective>) -> Result<Self> {
        let prog = plan.header.gpu.as_ref().ok_or_else(|| gerr("this plan has no GPU program (compile it with a GPU lowering for every op)"))?;
        cuda_available().map_err(|e| gerr(format!("{e}; use --backend cpu")))?;
        let ctx = cu(CudaContext::new(spec.device), &format!("opening CUDA device {}", spec.device))?;
        use cudarc::driver::sys::CUdevice_attribute as A;
        let major = cu(ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR), "device attribute")?;
        let minor = cu(ctx.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR), "device attribute")?;
        let target = target_for(major, minor).ok_or_else(|| gerr(format!("GPU compute capability {major}.{minor} has no target in dsc (sm_80+)")))?;
        let ptx = prog.ptx.get(target).ok_or_else(|| gerr(format!("the plan has no PTX for {target} (it has {:?})", prog.ptx.keys().collect::<Vec<_>>())))?;
        let module = cu(ctx.load_module(Ptx::from_src(ptx.clone())), "loading the plan's PTX")?;
        let inputs_kernel = {
            let m = cu(ctx.load_module(Ptx::from_src(inputs_ptx(false))), "loading the input kernel")?;
            cu(m.load_function("dsc_inputs"), "kernel dsc_inputs")?
        };
        let inputs_pdl = if target == "sm_90a" && opts.pdl {
            let m = cu(ctx.load_module(Ptx::from_src(inputs_ptx(true))), "loading the PDL input kernel")?;
            Some(cu(m.load_function("dsc_inputs_pdl"), "kernel dsc_inputs_pdl")?)
        } else {
            None
        };
        let mut funcs = HashMap::new();
        let hopper = target == "sm_90a";
        for k in prog.argmax.iter().chain(prog.argmax_split.as_ref().map(|a| &a.kernel)).chain(prog.argmax_cluster.as_ref().map(|a| &a.kernel).filter(|_| target == "sm_90a")).chain(
            prog.steps.iter().flat_map(|s| {
                s.kernel
                    .iter()
                    .chain(s.argmax.iter())
                    .chain(s.large.as_ref().map(|l| &l.kernel))
                    .chain(s.hopper.iter().chain(s.hopper_small.iter()).filter(|_| hopper).map(|l| &l.kernel))
                    .chain(s.few.iter().map(|l| &l.kernel))
            }),
        ) {
            if !funcs.contains_key(k) {
                funcs.insert(k.clone(), cu(module.load_function(k), &format!("kernel {k}"))?);
            }
        }
        // kernels with more than the default 48 KB of dynamic shared memory opt in
        for l in prog.steps.iter().flat_map(|s| s.large.iter().chain(s.hopper.iter().chain(s.hopper_small.iter()).filter(|_| hopper)).chain(s.few.iter())) {
            if let (Some(bytes), Some(f)) = (l.smem, funcs.get(&l.kernel)) {
                cu(allow_smem(f, bytes, l.carveout), &format!("kernel {}: {bytes} bytes of shared memory", l.kernel))?;
            }
        }
        // one stream for everything, so cudarc's per-buffer event tracking is not needed (and
        // would get in the way of graph capture); a created stream, since the legacy default
        // stream cannot be captured
        // SAFETY: all work of this backend is ordered on `stream`.
        unsafe { ctx.disable_event_tracking() };
        let stream = cu(ctx.new_stream(), "creating a stream")?;
        let copy_stream = cu(ctx.new_stream(), "creating the ids copy stream")?;
        let collective = collective(&stream)?;
        let mut resident = weights::upload(graph, plan, &module, &stream, &spec)?;
        let block_size = plan.header.model.kv_block_size;
        // (`MeasureOptions::kv_extra_blocks`: more blocks in every pool, placed elsewhere)
        let blocks = kv_tokens.div_ceil(block_size).max(1) + opts.measure.kv_extra_blocks;
        let fixed = BTreeMap::from([("NB".to_string(), blocks)]);
        for id in graph.leaves(&Op::State) {
            let n = graph.node(id);
            let numel: usize = n.ty.eval_shape(&fixed).ok_or_else(|| gerr(format!("state {} has unbound dims", n.name)))?.iter().product();
            let bytes = n.ty.dtype.bytes_for(numel).ok_or_else(|| gerr(format!("state {}: {} pools have no byte size", n.name, n.ty.dtype)))?;
            resident.insert(n.name.clone(), cu(stream.alloc_zeros::<u8>(bytes), &format!("allocating {}", n.name))?);
        }
        // the TMA matmuls' tensor maps (`{w}@tmap{rows}`, sm_90a): one per weight and tile height
        if hopper {
            let maps: std::collections::BTreeMap<&str, (&str, u32)> = hopper_args(prog)
                .filter_map(|a| match BufferRef::of(a) {
                    BufferRef::WeightMap { weight, rows } => Some((a, (weight, rows))),
                    _ => None,
                })
                .collect();
            for (name, (w, rows)) in maps {
                let node = graph.by_name(w).map(|id| graph.node(id)).ok_or_else(|| gerr(format!("tensor map {name}: no weight `{w}` in the graph")))?;
                let dims: Vec<usize> = node.ty.shape.iter().map(|d| d.as_const().unwrap_or(0)).collect();
                let f16 = match node.ty.dtype {
                    dsc_ir::DType::BF16 => false,
                    dsc_ir::DType::F16 => true,
                    other => return Err(gerr(format!("tensor map {name}: weight `{w}` is {other}, not bf16/f16"))),
                };
                let [n, k] = dims[..] else { return Err(gerr(format!("tensor map {name}: weight `{w}` is not 2-D"))) };
                let buf = resident.get(w).ok_or_else(|| gerr(format!("tensor map {name}: weight `{w}` is not resident")))?;
                let map = weight_tensor_map(&stream, buf, n, k, f16, rows)?;
                resident.insert(name.to_string(), map);
            }
        }
        // a MoE plan's failover mask (the `expert_mask` input): resident, all experts enabled
        let moe = crate::engine::MoeState::of(graph);
        if let Some(m) = &moe {
            let bytes: Vec<u8> = m.mask().iter().flat_map(|v| v.to_le_bytes()).collect();
            resident.insert("expert_mask".to_string(), cu(stream.clone_htod(&bytes), "uploading the expert mask")?);
            resident.insert("expert_mask@counts".to_string(), cu(stream.alloc_zeros::<u8>(bytes.len()), "allocating the routed-token counters")?);
        }
        // the one-token attention with the o projection folded in, the router GEMV whose last
        // block routes: a u32 counter per token (`{node}@sync`), zeroed once here — each use
        // leaves it at zero again (in a step's args or an alternative's)
        let syncs: std::collections::BTreeSet<&str> = prog
            .steps
            .iter()
            .flat_map(|s| s.args.iter().chain(s.large.iter().chain(&s.hopper).chain(&s.hopper_small).chain(&s.few).filter_map(|l| l.args.as_ref()).flatten()))
            .map(String::as_str)
            .filter(|a| matches!(BufferRef::of(a), BufferRef::Sync { .. }))
            .collect();
        for name in syncs {
            resident.insert(name.to_string(), cu(stream.alloc_zeros::<u8>(4 * SYNC_TOKENS), &format!("allocating {name}"))?);
        }
        // the wgmma prefill attention's K/V pool tensor maps (`{pool}@kvmap{rows}`, sm_90a)
        if hopper {
            let maps: std::collections::BTreeSet<(&str, u32)> = hopper_args(prog)
                .filter_map(|a| match BufferRef::of(a) {
                    BufferRef::PoolMap { pool, rows } => Some((pool, rows)),
                    _ => None,
                })
                .collect();
            for (arg, rows) in maps {
                // (the attention reads the cache writes' outputs: aliases of the pool state)
                let mut pool = arg;
                while let Some(of) = prog.steps.iter().find(|s| s.node == pool && s.alias_offset.is_none()).and_then(|s| s.alias_of.as_deref()) {
                    pool = of;
                }
                let name = format!("{pool}@kvmap{rows}");
                let node = graph.by_name(pool).map(|id| graph.node(id)).ok_or_else(|| gerr(format!("tensor map {name}: no KV pool `{pool}` in the graph")))?;
                let dims = node.ty.eval_shape(&fixed).ok_or_else(|| gerr(format!("tensor map {name}: pool `{pool}` has unbound dims")))?;
                let [nb, bs, kvh, d] = dims[..] else { return Err(gerr(format!("tensor map {name}: pool `{pool}` is not [blocks, block size, KV heads, head dim]"))) };
                if node.ty.dtype != dsc_ir::DType::BF16 {
                    return Err(gerr(format!("tensor map {name}: pool `{pool}` is {}, not bf16", node.ty.dtype)));
                }
                let buf = resident.get(pool).ok_or_else(|| gerr(format!("tensor map {name}: pool `{pool}` is not resident")))?;
                let map = pool_tensor_map(&stream, buf, [nb, bs, kvh, d], rows)?;
                resident.insert(name, map);
            }
        }
        // host-side reductions cannot be captured
        let profile = opts.measure.profile.then(|| std::cell::RefCell::new(BTreeMap::new()));
        let use_graphs = opts.cuda_graphs && !matches!(collective, GpuCollective::Local(_)) && profile.is_none();
        // block tables are padded to the most blocks one sequence can have (a fixed MB keeps
        // one CUDA graph per step shape), not to the pool
        let table_width = blocks.min(plan.header.model.max_seq_len.div_ceil(block_size)).max(1);
        let l2_persist = l2_persist(&ctx, opts.l2_persist_mb)?;
        announce(&opts.measure);
        let argmax_split = match &prog.argmax_split {
            Some(a) => Some((
                a.clone(),
                cu(stream.alloc_zeros::<u8>(SYNC_TOKENS * a.splits as usize * 8), "allocating the argmax partials")?,
                cu(stream.alloc_zeros::<u8>(SYNC_TOKENS * 4), "allocating the argmax counters")?,
            )),
            _ => None,
        };
        Ok(GpuBackend {
            graph,
            prog,
            moe,
            moe_counts: std::sync::Mutex::new(None),
            ctx,
            stream,
            _module: module,
            funcs,
            resident,
            blocks,
            table_width,
            block_size,
            target: target.to_string(),
            buckets: HashMap::new(),
            context_bounds: prog.context_bounds(),
            use_graphs,
            no_wgmma: !opts.wgmma,
            pdl: target == "sm_90a" && opts.pdl,
            multi_k: opts.multi_step,
            collective,
            profile,
            inflight: Default::default(),
            spare_ids: vec![],
            feeds: [None, None],
            feed_at: 0,
            last_multi: None,
            copy_stream,
            cached_max_tokens: opts.cached_max_tokens,
            pdl_max_tokens: opts.pdl_max_tokens,
            staging: Default::default(),
            inputs_kernel,
            inputs_pdl,
            measure: opts.measure.clone(),
            l2_persist,
            argmax_split,
        })
    }

    pub fn synchronize(&self) -> Result<()> {
        cu(self.stream.synchronize(), "synchronize")
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

const INPUTS: [&str; 6] = ["tokens", "positions", "seq_ids", "slots", "block_table", "logit_rows"];

/// One resolved action of a step: a kernel launch or an all-reduce of an arena buffer.
enum Action {
    Launch(Launch),
    /// in place on (offset, bytes) of the arena, f32
    AllReduce(usize, usize),
}

/// One resolved kernel launch of a step.
struct Launch {
    kernel: String,
    /// buffer keys (after alias resolution)
    args: Vec<String>,
    scalars: Vec<i64>,
    cfg: LaunchConfig,
    /// blocks per thread-block cluster along grid y (1: none)
    cluster: u32,
    /// an L2 access policy window (`GpuBackend::l2_persist`): (base, bytes, hit ratio) of the
    /// weight whose lines it marks persisting
    l2_window: Option<(u64, usize, f32)>,
    /// the same launch with the greedy argmax folded in (the logits step's `argmax` kernel:
    /// buffers `@apart`, `@async`, `@aids` first), for chained multi-step graphs
    argmax: Option<String>,
}

/// Everything one step shape (T, S, R) needs, allocated once: the inputs, every activation,
/// the resolved launches, and (after the first run) the CUDA graph that replays them.
struct Bucket {
    /// step inputs (token ids, positions, ...)
    bufs: HashMap<String, CudaSlice<u8>>,
    /// every activation, placed by the plan's memory plan
    arena: CudaSlice<u8>,
    /// node → (offset, bytes) in the arena
    placed: HashMap<String, (usize, usize)>,
    /// views into resident buffers: node → (resident buffer, byte offset) (a MoE layer's row
    /// of the expert mask)
    views: HashMap<String, (String, usize)>,
    launches: Vec<Action>,
    logits: String,
    vocab: usize,
    graph: Option<cudarc::driver::CudaGraph>,
    runs: usize,
    /// token ids of a greedy step (device argmax)
    ids: Option<CudaSlice<u8>>,
    /// launch with programmatic dependent launch (decode-sized steps on sm_90a)
    pdl: bool,
    /// packed inputs: (input, arena offset, bytes), and the arena span they
    /// fill, uploaded in one copy
    packed: Vec<(&'static str, usize, usize)>,
    packed_span: (usize, usize),
    /// k pipelined greedy steps as one CUDA graph (`Backend::launch_greedy_steps`)
    multi: Option<Multi>,
    /// the folded argmax's partials and counters (`Launch::argmax`; counters zero between
    /// launches), allocated with the first multi-step graph
    fold: Option<(CudaSlice<u8>, CudaSlice<u8>)>,
    /// (arena offset, bytes) of the room for two multi-step instances' k copies of the packed
    /// inputs, right after them (`GpuBackend::multi_k`)
    multi_at: Option<(usize, usize)>,
}

/// A bucket: (tokens, sequences, logits rows, context class).
type BucketKey = (usize, usize, usize, usize);

use crate::options::RuntimeOptions;

/// Tokens a step's `{node}@sync` counters cover (the fused one-token attention uses the first).
const SYNC_TOKENS: usize = 1024;

/// How often `moe_stats` reads the routed-token counters back (a copy on the step stream: it
/// waits for the step in flight).
pub const MOE_COUNTS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);

/// Where a bucket's activation arena starts: a multiple of the GPU's 2 MiB large page
/// (DSC_ARENA_ALIGN overrides; see `GpuBackend::prepare`)
const ARENA_ALIGN: usize = 2 << 20;

impl GpuBackend<'_> {
    /// The bucket of a step shape: `t` tokens, `s_` sequences, `r` logit rows, and steps whose
    /// longest context is `context` keys (the shortest of its context class: the steps with a
    /// context range, e.g. the split decode attention, are chosen by it).
    fn prepare(&self, t: usize, s_: usize, r: usize, context: i64) -> Result<Bucket> {
        let g = self.graph;
        let bind = BTreeMap::from([("T".to_string(), t), ("S".to_string(), s_), ("MB".to_string(), self.table_width), ("R".to_string(), r), ("NB".to_string(), self.blocks)]);
        // (`{node}@bf16`: a 16-bit copy of a node that a cast step writes for the prefill
        // matmuls; its shape is the node's)
        // (`{node}@split{S}`: the split decode attention's partial states, [T, H, S·(D + 2)]
        // for a [T, H, D] node)
        // (`{node}@splitk{S}`: a split-K matmul's partial sums, [S, ..] of the node's shape)
        let shape_of = |name: &str| -> Result<Vec<usize>> {
            let (name, split, parts, width) = match BufferRef::of(name) {
                BufferRef::SplitK { node, parts } => (node, None, Some(parts), None),
                BufferRef::SplitParts { node, parts } => (node, Some(parts), None, None),
                BufferRef::RowScratch { node, width } => (node, None, None, Some(width)),
                r => (r.node(), None, None, None),
            };
            let id = g.by_name(name).ok_or_else(|| gerr(format!("schedule names unknown node {name}")))?;
            let mut sh = g.node(id).ty.eval_shape(&bind).ok_or_else(|| gerr(format!("node {name} has unbound dims {}", g.node(id).ty)))?;
            if let Some(w) = width {
                let rows = sh.iter().product::<usize>() / sh.last().copied().unwrap_or(1).max(1);
                sh = vec![rows, w];
            }
            if let (Some(ns), Some(last)) = (split, sh.last_mut()) {
                *last = ns * (*last + 2);
            }
            if let Some(sk) = parts {
                sh.insert(0, sk);
            }
            Ok(sh)
        };
        let rows_of = |n: &str| -> Result<i64> {
            let sh = shape_of(n)?;
            Ok((sh.iter().product::<usize>() / sh.last().copied().unwrap_or(1).max(1)) as i64)
        };
        let eval = |s: &Scalar| -> Result<i64> {
            Ok(match s {
                Scalar::Const(v) => *v,
                Scalar::Numel(n) => shape_of(n)?.iter().product::<usize>() as i64,
                Scalar::Rows(n) => rows_of(n)?,
                Scalar::Dim(n, i) => *shape_of(n)?.get(*i).ok_or_else(|| gerr(format!("node {n} has no dim {i}")))? as i64,
                Scalar::HalfNumel(n) => (shape_of(n)?.iter().product::<usize>() / 2) as i64,
                Scalar::RowsTimes(n, c) => rows_of(n)? * c,
            })
        };
        let mut bufs: HashMap<String, CudaSlice<u8>> = HashMap::new();
        let sizes: Vec<usize> =
            self.prog.buffers.iter().map(|b| Ok(shape_of(&b.node)?.iter().product::<usize>() * if matches!(BufferRef::of(&b.node), BufferRef::Half { .. }) { 2 } else { 4 })).collect::<Result<_>>()?;
        let (offsets, total) = crate::plan::place_buffers(&self.prog.buffers, &sizes);
        // the inputs: 256-byte aligned after the activations, one span
        let mut packed = vec![];
        let mut end = total.div_ceil(256) * 256;
        let span0 = end;
        for name in INPUTS {
            if g.by_name(name).is_some() {
                let bytes = shape_of(name)?.iter().product::<usize>().max(1) * 4;
                packed.push((name, end, bytes));
                end += bytes.div_ceil(256) * 256;
            }
        }
        // The activations start at a 2 MiB boundary (the GPU's large page): where a bucket's
        // arena fell inside its pages changed the SmolLM2 b1 step by up to 8% (graph replay
        // 0.257 vs 0.278 ms with the same kernels: the arena placed after KV pools of
        // another size, docs/perf.md "Session 18"), aligned it is the fast one wherever the
        // pools end. (`MeasureOptions::arena_align` / `arena_pad` move it, to measure that)
        let align = self.measure.arena_align.unwrap_or(ARENA_ALIGN);
        let pad0 = self.measure.arena_pad;
        // (the multi-step inputs' and ids' room, beside the packed span in the arena's pages —
        // as separate allocations they measured the same. Reserved in every cached bucket,
        // though only steps of <= MULTI_STEP_MAX_ROWS rows use it: reserving it in those
        // alone moved the b1 bucket's arena (the prompt's bucket before it shrank) and the
        // harness-like b1 went 4,078-4,087 -> 3,995-4,006 tok/s in one call, the same kernels:
        // the arena-placement effect of session 18, bench/results/session20-2026-12-01.json)
        let multi_room = if self.multi_k > 1 && t <= self.cached_max_tokens { 2 * self.multi_k * (end - span0 + multi_ids_bytes(r)) } else { 0 };
        let arena = cu(self.stream.alloc_zeros::<u8>(end.max(256) + multi_room + pad0 + if align > 1 { align } else { 0 }), "allocating the activation arena")?;
        let base = cudarc::driver::DevicePtr::device_ptr(&arena, &self.stream).0 as usize;
        let pad = (align - base % align) % align + pad0;
        let mut placed: HashMap<String, (usize, usize)> = self.prog.buffers.iter().zip(offsets.iter().zip(&sizes)).map(|(b, (&o, &n))| (b.node.clone(), (o + pad, n))).collect();
        for p in &mut packed {
            p.1 += pad;
        }
        for &(name, o, n) in &packed {
            placed.insert(name.to_string(), (o, n));
        }
        let packed_span = (span0 + pad, end + pad);
        let multi_at = (multi_room > 0).then_some((end + pad, multi_room));
        let mut alias: HashMap<String, String> = HashMap::new();
        let mut views: HashMap<String, (String, usize)> = HashMap::new();
        let mut launches = vec![];
        // (the step that writes the logits)
        let (_, out) = g.outputs.iter().find(|(n, _)| n == "logits").ok_or_else(|| gerr("the graph has no `logits` output"))?;
        let out_name = g.node(*out).name.clone();
        for s in &self.prog.steps {
            if let (Some(of), Some(off)) = (&s.alias_of, &s.alias_offset) {
                // a view into its root's buffer (a part of a merged matmul's output)
                let root = alias.get(of).cloned().unwrap_or_else(|| of.clone());
                let at = eval(off)? as usize * 4;
                let bytes = shape_of(&s.node)?.iter().product::<usize>() * 4;
                let (o, n) = match (placed.get(&root), self.resident.get(&root)) {
                    (Some(&(o, n)), _) => (Some(o), n),
                    (None, Some(buf)) => (None, buf.len()),
                    (None, None) => return Err(gerr(format!("view {}: {root} is neither an activation nor a resident buffer", s.node))),
                };
                if at + bytes > n {
                    return Err(gerr(format!("view {} ({bytes} bytes at {at}) lies outside {root} ({n} bytes)", s.node)));
                }
                match o {
                    Some(o) => {
                        placed.insert(s.node.clone(), (o + at, bytes));
                    }
                    None => {
                        // (and its counters, `{view}@counts`, at the same place in the root's)
                        let counts = format!("{root}@counts");
                        if self.resident.contains_key(&counts) {
                            views.insert(format!("{}@counts", s.node), (counts, at));
                        }
                        views.insert(s.node.clone(), (root, at));
                    }
                }
            } else if let Some(of) = &s.alias_of {
                let root = alias.get(of).cloned().unwrap_or_else(|| of.clone());
                alias.insert(s.node.clone(), root);
            } else if !placed.contains_key(&s.node) {
                return Err(gerr(format!("node {} has no place in the memory plan", s.node)));
            }
            if s.collective.is_some() {
                let root = alias.get(&s.node).cloned().unwrap_or_else(|| s.node.clone());
                let &(o, n) = placed.get(&root).ok_or_else(|| gerr(format!("all_reduce {}: {root} is not an activation buffer", s.node)))?;
                launches.push(Action::AllReduce(o, n));
                continue;
            }
            let Some(k0) = &s.kernel else { continue };
            let rows = eval(&Scalar::Rows(s.node.clone()))?;
            let hopper = self.target == "sm_90a" && !self.no_wgmma;
            if !s.runs_on(rows, hopper) || !s.runs_in_context(context) {
                continue;
            }
            let alt = s.alternative(rows, hopper);
            // (the argmax folds into the default kernel only)
            let argmax = if alt.is_none() { s.argmax.clone() } else { None };
            let (k, scal, work, grid_y, launch, block, rpb, threads, args, smem, cluster) = match alt {
                Some(l) => {
                    let cluster = if self.target == "sm_90a" { l.cluster.unwrap_or(1) } else { 1 };
                    (&l.kernel, &l.scalars, &l.work, &l.grid_y, l.launch, l.block, l.rows_per_block, l.threads.unwrap_or(128), l.args.as_ref().unwrap_or(&s.args), l.smem.unwrap_or(0), cluster)
                }
                // (clusters: the sm_90a module's kernel; elsewhere the same symbol takes none)
                None => (k0, &s.scalars, &s.work, &s.grid_y, s.launch, s.block, 1, s.threads.unwrap_or(128), &s.args, 0, if self.target == "sm_90a" { s.cluster.unwrap_or(1) } else { 1 }),
            };
            if self.measure.skip_kernels.iter().any(|x| k.contains(x.as_str())) {
                continue;
            }
            let scalars: Vec<i64> = scal.iter().map(&eval).collect::<Result<_>>()?;
            let work = eval(work)? as u32;
            let gy = eval(grid_y)? as u32;
            if work == 0 || gy == 0 {
                continue;
            }
            let (grid, gy, block) = launch.dims(work, gy, block, rpb, threads).ok_or_else(|| gerr(format!("step {}: kernel {k} with launch kind none", s.node)))?;
            let cluster = match &self.measure.force_cluster {
                Some((x, n)) if self.target == "sm_90a" && k.contains(x.as_str()) && gy % n == 0 => *n,
                _ => cluster,
            };
            if cluster == 0 || gy % cluster != 0 {
                return Err(gerr(format!("step {}: grid y {gy} is not a whole number of clusters of {cluster}", s.node)));
            }
            let args = args
                .iter()
                .map(|a| match BufferRef::of(a) {
                    // (a KV pool's tensor map: keyed by the pool state the alias resolves to)
                    BufferRef::PoolMap { pool: p, rows } => format!("{}@kvmap{rows}", alias.get(p).map_or(p, String::as_str)),
                    // (the counters of a view: keyed by the view the alias resolves to)
                    BufferRef::Counts { of } => format!("{}@counts", alias.get(of).map_or(of, String::as_str)),
                    _ => alias.get(a).cloned().unwrap_or_else(|| a.clone()),
                })
                .collect::<Vec<_>>();
            // (`{x}@xmap{rows}`: the tensor map of x's place in this bucket's arena, encoded
            // once per bucket; rows past x's are zeros, the map covering exactly its buffer)
            for a in &args {
                let BufferRef::ActivationMap { x, rows } = BufferRef::of(a) else { continue };
                if bufs.contains_key(a) {
                    continue;
                }
                let root = alias.get(x).cloned().unwrap_or_else(|| x.to_string());
                let &(o, n) = placed.get(&root).ok_or_else(|| gerr(format!("step {}: tensor map {a}: {root} is not an activation buffer", s.node)))?;
                let sh = shape_of(x)?;
                let k = *sh.last().ok_or_else(|| gerr(format!("tensor map {a}: {x} is a scalar")))?;
                let f16 = matches!(BufferRef::of(x), BufferRef::Half { f16: true, .. });
                let (arena_ptr, guard) = cudarc::driver::DevicePtr::device_ptr(&arena, &self.stream);
                let map = tensor_map_at(&self.stream, arena_ptr + o as u64, n, n / (2 * k.max(1)), k, f16, rows);
                drop(guard);
                bufs.insert(a.clone(), map.map_err(|e| gerr(format!("step {}: tensor map {a}: {e}", s.node)))?);
            }
            for a in &args {
                if !bufs.contains_key(a) && !placed.contains_key(a) && !self.resident.contains_key(a) && !views.contains_key(a) {
                    return Err(gerr(format!("step {}: no buffer for {a}", s.node)));
                }
            }
            // (the logits' matmul: its largest resident argument, the weight, partly persisting
            // in L2 — `l2_persist`)
            let l2_window = match self.l2_persist {
                (set, window) if set > 0 && s.node == out_name => args
                    .iter()
                    .filter_map(|a| self.resident.get(a))
                    .max_by_key(|b| b.len())
                    .map(|b| (cudarc::driver::DevicePtr::device_ptr(b, &self.stream).0, b.len().min(window)))
                    .map(|(p, n)| (p, n, (set as f32 / n.max(1) as f32).min(1.0))),
                _ => None,
            };
            launches.push(Action::Launch(Launch {
                kernel: k.clone(),
                args,
                scalars,
                cfg: LaunchConfig { grid_dim: (grid, gy, 1), block_dim: (block, 1, 1), shared_mem_bytes: smem },
                cluster,
                l2_window,
                argmax,
            }));
        }
        let vocab = *shape_of(&out_name)?.last().unwrap_or(&1);
        let logits = alias.get(&out_name).cloned().unwrap_or(out_name);
        // PDL for decode-sized steps only: measured +6-10% for SmolLM2 decode, ~0 for the 8B
        // shape, and one 8B prefill-512 run 5% slower with it (bench/results/pdl-*.json)
        let pdl = self.pdl && t <= self.cached_max_tokens.min(self.pdl_max_tokens);
        Ok(Bucket { bufs, arena, placed, views, launches, logits, vocab, graph: None, runs: 0, ids: None, pdl, packed, packed_span, multi: None, multi_at, fold: None })
    }

    fn all_reduce(&self, arena: &mut CudaSlice<u8>, off: usize, n: usize) -> Result<()> {
        match &self.collective {
            GpuCollective::Single => Ok(()),
            GpuCollective::Nccl(comm) => {
                let mut view = arena.slice_mut(off..off + n);
                // SAFETY: the buffer holds n / 4 f32 values (activations are f32)
                let mut f = unsafe { view.transmute_mut::<f32>(n / 4) }.ok_or_else(|| gerr("all_reduce buffer too small"))?;
                comm.all_reduce_in_place(&mut f, &cudarc::nccl::ReduceOp::Sum).map(|_| ()).map_err(|e| gerr(format!("NCCL all_reduce: {e:?}")))
            }
            GpuCollective::Local(c) => {
                let bytes = cu(self.stream.clone_dtoh(&arena.slice(off..off + n)), "all_reduce: reading")?;
                let x = dsc_ir::Tensor::new(vec![n / 4], bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect());
                let sum = c.all_reduce(&x).map_err(|m| gerr(format!("all_reduce: {m}")))?;
                let out: Vec<u8> = sum.data.iter().flat_map(|v| v.to_le_bytes()).collect();
                let mut dst = arena.slice_mut(off..off + n);
                cu(self.stream.memcpy_htod(&out, &mut dst), "all_reduce: writing")?;
                cu(self.stream.synchronize(), "all_reduce")
            }
        }
    }

    /// Per-kernel launch counts and total µs since the last call (`MeasureOptions::profile`),
    /// largest first.
    pub fn take_profile(&self) -> Vec<(String, usize, f64)> {
        let Some(p) = &self.profile else { return vec![] };
        let mut v: Vec<(String, usize, f64)> = std::mem::take(&mut *p.borrow_mut()).into_iter().map(|(k, (n, t))| (k, n, t)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2));
        v
    }

    /// The device time of one decode step alone: the captured CUDA graph of the cached bucket of
    /// a `batch`-sequence decode step (one token and one logits row each) replayed `n` times
    /// back to back (no input upload, no argmax, no host work between them), µs per replay by
    /// CUDA events; None if no such bucket has a graph. Beside the engine's ms/step it splits a
    /// step into GPU time and host overhead.
    pub fn graph_replay_us(&self, batch: usize, n: usize) -> Result<Option<f64>> {
        // (a prefill step of `batch` tokens for one sequence has a bucket of as many tokens)
        let Some(gr) = self.buckets.iter().filter(|(k, _)| (k.0, k.1, k.2) == (batch, batch, batch)).find_map(|(_, b)| b.graph.as_ref()) else { return Ok(None) };
        let ev = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        cu(gr.launch(), "graph replay")?;
        let a = cu(self.stream.record_event(ev), "replay event")?;
        for _ in 0..n {
            cu(gr.launch(), "graph replay")?;
        }
        let b = cu(self.stream.record_event(ev), "replay event")?;
        cu(b.synchronize(), "replay sync")?;
        Ok(Some(cu(a.elapsed_ms(&b), "replay elapsed")? as f64 * 1e3 / n.max(1) as f64))
    }

    fn launch_all(&self, bucket: &mut Bucket) -> Result<()> {
        self.launch_all_over(bucket, None).map(|_| ())
    }

    /// [`GpuBackend::launch_all`], with `over` (a chained multi-step copy's inputs): the
    /// buffers it names at those device addresses instead (every launch then by
    /// cuLaunchKernelEx); where `over` places `@aids`, the logits step's launch with the
    /// argmax folded in (returns whether there was one).
    fn launch_all_over(&self, bucket: &mut Bucket, over: Option<&HashMap<&'static str, u64>>) -> Result<bool> {
        let mut fused = false;
        let mut marks: Vec<(String, cudarc::driver::CudaEvent, cudarc::driver::CudaEvent)> = vec![];
        let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
        for a in &bucket.launches {
            let l = match a {
                Action::Launch(l) => l,
                &Action::AllReduce(off, n) => {
                    self.all_reduce(&mut bucket.arena, off, n)?;
                    continue;
                }
            };
            let start = match &self.profile {
                Some(_) => Some(cu(self.stream.record_event(timing), "profile event")?),
                None => None,
            };
            // (a chained multi-step copy with the ids' place in `over`: the logits step with the
            // argmax folded in)
            if let (Some(fk), true) = (&l.argmax, over.is_some_and(|o| o.contains_key("@aids"))) {
                let mut args = vec!["@apart".to_string(), "@async".to_string(), "@aids".to_string()];
                args.extend(l.args.iter().cloned());
                let fl = Launch { kernel: fk.clone(), args, scalars: l.scalars.clone(), cfg: l.cfg, cluster: l.cluster, l2_window: l.l2_window, argmax: None };
                self.launch_ex(bucket, &fl, bucket.pdl, over)?;
                fused = true;
                continue;
            }
            if bucket.pdl || l.cluster > 1 || l.l2_window.is_some() || over.is_some() {
                self.launch_ex(bucket, l, bucket.pdl, over)?;
                if let Some(s0) = start {
                    marks.push((l.kernel.clone(), s0, cu(self.stream.record_event(timing), "profile event")?));
                }
                continue;
            }
            let mut lb = self.stream.launch_builder(&self.funcs[&l.kernel]);
            let views: Vec<_> = l
                .args
                .iter()
                .filter_map(|a| match (bucket.placed.get(a), bucket.views.get(a)) {
                    (Some(&(o, n)), _) => Some((a, bucket.arena.slice(o..o + n.max(1)))),
                    (None, Some((root, at))) => self.resident.get(root).map(|b| (a, b.slice(*at..))),
                    (None, None) => None,
                })
                .collect();
            for a in &l.args {
                match views.iter().find(|(n, _)| *n == a) {
                    Some((_, v)) => {
                        lb.arg(v);
                    }
                    None => {
                        lb.arg(bucket.bufs.get(a).or_else(|| self.resident.get(a)).expect("checked in prepare"));
                    }
                }
            }
            for v in &l.scalars {
                lb.arg(v);
            }
            // SAFETY: the schedule was generated with the kernels: argument order, types and
            // buffer sizes (from the node types under this bucket's binding) match.
            unsafe { lb.launch(l.cfg) }.map_err(|e| gerr(format!("launching {}: {e:?}", l.kernel)))?;
            if let Some(s0) = start {
                marks.push((l.kernel.clone(), s0, cu(self.stream.record_event(timing), "profile event")?));
            }
        }
        if let Some(p) = &self.profile {
            cu(self.stream.synchronize(), "profile")?;
            let mut p = p.borrow_mut();
            for (k, a, b) in marks {
                let ms = cu(a.elapsed_ms(&b), "profile elapsed")? as f64;
                let e = p.entry(k).or_insert((0, 0.0));
                e.0 += 1;
                e.1 += ms * 1e3;
            }
        }
        Ok(fused)
    }

    /// One launch by cuLaunchKernelEx: with `pdl` programmatic stream serialization (the
    /// kernel may launch before its predecessor in the stream finishes; its
    /// `griddepcontrol.wait` — every sm_90a kernel starts with it — holds it until then), and
    /// in thread-block clusters of `l.cluster` blocks along grid y where that is more than 1.
    fn launch_ex(&self, bucket: &Bucket, l: &Launch, pdl: bool, over: Option<&HashMap<&'static str, u64>>) -> Result<()> {
        use cudarc::driver::DevicePtr;
        let mut ptrs: Vec<u64> = Vec::with_capacity(l.args.len());
        let mut guards = vec![];
        let (arena, g) = bucket.arena.device_ptr(&self.stream);
        guards.push(g);
        for a in &l.args {
            if let Some(&p) = over.and_then(|o| o.get(a.as_str())) {
                ptrs.push(p);
                continue;
            }
            let p = match bucket.placed.get(a) {
                // an activation: its offset in the arena (in bounds: placed by the memory plan)
                Some(&(o, _)) => arena + o as u64,
                None if bucket.views.contains_key(a) => {
                    let (root, at) = &bucket.views[a];
                    let (p, g) = self.resident.get(root).ok_or_else(|| gerr(format!("launching {}: no resident buffer {root} under view {a}", l.kernel)))?.device_ptr(&self.stream);
                    guards.push(g);
                    p + *at as u64
                }
                None => {
                    let (p, g) = bucket.bufs.get(a).or_else(|| self.resident.get(a)).ok_or_else(|| gerr(format!("launching {}: no buffer {a}", l.kernel)))?.device_ptr(&self.stream);
                    guards.push(g);
                    p
                }
            };
            ptrs.push(p);
        }
        let f = self.funcs.get(&l.kernel).ok_or_else(|| gerr(format!("kernel {} is not in the plan's module", l.kernel)))?;
        cu(self.ctx.bind_to_thread(), "binding the context")?;
        // SAFETY: the schedule was generated with the kernels (argument order, types, buffer
        // sizes); the pointers stay valid while `guards` lives
        let r = unsafe { launch_kernel_ex(&self.stream, f, &ptrs, &l.scalars, l.cfg, pdl, l.cluster, l.l2_window) };
        drop(guards);
        cu(r, &format!("launching {}", l.kernel))
    }

    fn run_bucket(&self, bucket: &mut Bucket, b: &StepBatch, use_graph: bool) -> Result<Vec<Vec<f32>>> {
        self.run_launches(bucket, b, use_graph, None)?;
        let (o, n) = *bucket.placed.get(&bucket.logits).ok_or_else(|| gerr("the logits are not an activation buffer of the schedule"))?;
        let bytes = cu(self.stream.clone_dtoh(&bucket.arena.slice(o..o + n)), "reading logits")?;
        let data: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
        Ok(data.chunks_exact(bucket.vocab.max(1)).map(|r| r.to_vec()).collect())
    }

    /// The step, then the argmax of each logits row on the device; only the ids come back.
    fn run_bucket_greedy(&self, bucket: &mut Bucket, b: &StepBatch, use_graph: bool) -> Result<Vec<u32>> {
        // a block-per-row argmax runs at every row count; the older warp-per-row kernel only
        // from 8 rows (copying a handful of rows back and scanning them on the host was faster:
        // 8B 1.3 ms vs ~0.3 ms at one row)
        let block = self.prog.argmax_block;
        let device = block.is_some() || b.logit_rows.len() >= 8;
        let Some(k) = self.prog.argmax.as_ref().filter(|_| device) else {
            return Ok(self.run_bucket(bucket, b, use_graph)?.iter().map(|r| crate::sampler::argmax(r) as u32).collect());
        };
        self.run_launches(bucket, b, use_graph, None)?;
        let rows = Self::logit_rows(bucket)?;
        if bucket.ids.as_ref().is_none_or(|x| x.len() < rows * 4) {
            bucket.ids = Some(cu(self.stream.alloc_zeros::<u8>(rows.max(1) * 4), "allocating token ids")?);
        }
        let ids = bucket.ids.as_ref().expect("allocated above");
        self.launch_argmax(bucket, k, self.dev(ids), false)?;
        let bytes = cu(self.stream.clone_dtoh(&ids.slice(0..rows * 4)), "reading token ids")?;
        Ok(bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as u32).collect())
    }

    /// The logits rows of a bucket's step.
    fn logit_rows(bucket: &Bucket) -> Result<usize> {
        let (_, n) = *bucket.placed.get(&bucket.logits).ok_or_else(|| gerr("the logits are not an activation buffer of the schedule"))?;
        Ok(n / 4 / bucket.vocab.max(1))
    }

    /// The argmax kernel `k` over the bucket's logits rows, one i32 per row into `ids`; the
    /// cluster argmax with `pdl` under programmatic dependent launch (inside a chained
    /// multi-step graph, right after the lm_head).
    fn launch_argmax(&self, bucket: &Bucket, k: &str, ids: (u64, usize), pdl: bool) -> Result<()> {
        let (o, n) = *bucket.placed.get(&bucket.logits).ok_or_else(|| gerr("the logits are not an activation buffer of the schedule"))?;
        let rows = n / 4 / bucket.vocab.max(1);
        let (ip, ids_len) = ids;
        if ids_len < rows * 4 {
            return Err(gerr(format!("token id buffer of {ids_len} bytes for {rows} rows")));
        }
        let logits = bucket.arena.slice(o..o + n);
        let rows64 = rows as i64;
        if let Some(a) = self.prog.argmax_cluster.as_ref().filter(|_| self.target == "sm_90a" && self.argmax_split.is_some()) {
            // (sm_90a: a thread-block cluster per row)
            let f = self.funcs.get(&a.kernel).ok_or_else(|| gerr(format!("kernel {} is not in the plan's module", a.kernel)))?;
            let (lp, g1) = cudarc::driver::DevicePtr::device_ptr(&logits, &self.stream);
            let cfg = LaunchConfig { grid_dim: (rows as u32, a.splits, 1), block_dim: (a.threads, 1, 1), shared_mem_bytes: 0 };
            cu(self.ctx.bind_to_thread(), "binding the context")?;
            // SAFETY: argmax_c<B>_d<V>(x, y, rows): rows rows of V f32 in `logits`, one i32 per
            // row into `ids` (checked above to hold `rows`); grid y = B blocks, one cluster
            let r = unsafe { launch_kernel_ex(&self.stream, f, &[lp, ip], &[rows64], cfg, pdl, a.splits, None) };
            drop(g1);
            return cu(r, &format!("launching {}", a.kernel));
        }
        if let Some((a, part, sync)) = self.argmax_split.as_ref().filter(|_| rows <= SYNC_TOKENS) {
            let ks = &a.kernel;
            let mut lb = self.stream.launch_builder(&self.funcs[ks]);
            lb.arg(&logits).arg(part).arg(sync).arg(&ip).arg(&rows64);
            let cfg = LaunchConfig { grid_dim: (a.splits, rows as u32, 1), block_dim: (a.threads, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: argmax_split<S>_d<V>(x, part, sync, y, rows): rows rows of V f32 in
            // `logits`; `part` holds S 8-byte partials and `sync` a zeroed u32 per row for up to
            // SYNC_TOKENS rows (checked above); one i32 per row into `ids` (checked above)
            unsafe { lb.launch(cfg) }.map_err(|e| gerr(format!("launching {ks}: {e:?}")))?;
            return Ok(());
        }
        let mut lb = self.stream.launch_builder(&self.funcs[k]);
        lb.arg(&logits).arg(&ip).arg(&rows64);
        let cfg = match self.prog.argmax_block {
            Some(threads) => LaunchConfig { grid_dim: (rows as u32, 1, 1), block_dim: (threads, 1, 1), shared_mem_bytes: 0 },
            None => LaunchConfig { grid_dim: ((rows as u32).div_ceil(4), 1, 1), block_dim: (128, 1, 1), shared_mem_bytes: 0 },
        };
        // SAFETY: argmax_d<V>(x, y, rows): rows rows of V f32 in `logits`, one i32 per row into
        // `ids` (checked above to hold `rows`); a block per row (`argmax_block` threads), or a
        // warp per row, 4 rows per block.
        unsafe { lb.launch(cfg) }.map_err(|e| gerr(format!("launching {k}: {e:?}")))?;
        Ok(())
    }

    /// A pipelined greedy step on its bucket: inputs (the tokens from `fed`, the previous
    /// step's ids on the device, when given), the launches, the argmax into `ids`.
    fn launch_bucket_greedy(&self, bucket: &mut Bucket, b: &StepBatch, use_graph: bool, k: &str, ids: &CudaSlice<u8>, fed: Option<&CudaSlice<u8>>) -> Result<()> {
        self.run_launches(bucket, b, use_graph, fed)?;
        if Self::logit_rows(bucket)? != b.logit_rows.len() {
            return Err(gerr("a pipelined step's logits rows differ from its batch's"));
        }
        self.launch_argmax(bucket, k, self.dev(ids), false)
    }

    /// A device buffer's address and length (event tracking is off: nothing to guard).
    fn dev(&self, b: &CudaSlice<u8>) -> (u64, usize) {
        (cudarc::driver::DevicePtr::device_ptr(b, &self.stream).0, b.len())
    }

    /// `n` bytes from device address `src` to `dst` on the stream.
    fn dtod(&self, dst: u64, src: u64, n: usize) -> Result<()> {
        // SAFETY: the callers pass two device buffers of at least n bytes each (checked there)
        cu(unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, n, self.stream.cu_stream()) }, "feeding the last ids")
    }

    /// The step's block table padded to the plan's fixed width (so MB, and the graph, is
    /// fixed).
    fn padded_table(&self, b: &StepBatch) -> Vec<i32> {
        let w = self.table_width;
        let mut table = vec![0i32; b.num_seqs * w];
        for sq in 0..b.num_seqs {
            let n = b.max_blocks.min(w);
            table[sq * w..sq * w + n].copy_from_slice(&b.block_table[sq * b.max_blocks..sq * b.max_blocks + n]);
        }
        table
    }

    /// The step's six inputs by name, with its padded block table.
    fn step_inputs<'a>(b: &'a StepBatch, table: &'a [i32]) -> [(&'static str, &'a [i32]); 6] {
        [("tokens", &b.tokens), ("positions", &b.positions), ("seq_ids", &b.seq_ids), ("slots", &b.slots), ("block_table", table), ("logit_rows", &b.logit_rows)]
    }

    /// Every packed input at its place in the packed span's staging copy `h` (zeros past each
    /// input's data).
    fn pack_inputs(bucket: &Bucket, inputs: &[(&'static str, &[i32]); 6], h: &mut [u8]) -> Result<()> {
        let s0 = bucket.packed_span.0;
        h.fill(0);
        for &(name, o, n) in &bucket.packed {
            let v = inputs.iter().find(|(k, _)| *k == name).map(|(_, v)| i32_bytes(v)).unwrap_or_default();
            if v.len() > n {
                return Err(gerr(format!("step input {name}: {} bytes for a {n}-byte buffer", v.len())));
            }
            h[o - s0..o - s0 + v.len()].copy_from_slice(&v);
        }
        Ok(())
    }

    /// The input kernel: the packed span's staged words from pinned memory at `src_ptr` into
    /// the arena, and with `fed` (a device buffer of token ids) the step's tokens from there —
    /// under PDL on sm_90a, only the threads taking a fed id waiting. The caller keeps the
    /// staging buffer and `fed` alive until the kernel has run.
    fn launch_inputs(&self, f: &CudaFunction, bucket: &mut Bucket, src_ptr: u64, fed: Option<(u64, usize)>) -> Result<()> {
        use cudarc::driver::DevicePtr;
        let (s0, s1) = bucket.packed_span;
        let (arena, _guard) = bucket.arena.device_ptr(&self.stream);
        self.launch_inputs_to(f, bucket, src_ptr, arena + s0 as u64, s1 - s0, fed)
    }

    /// [`GpuBackend::launch_inputs`] into `bytes` at device address `dptr` (the packed span, or
    /// several copies of it one after another: the fed ids go into the first one's tokens).
    fn launch_inputs_to(&self, f: &CudaFunction, bucket: &Bucket, src_ptr: u64, dptr: u64, bytes: usize, fed: Option<(u64, usize)>) -> Result<()> {
        let s0 = bucket.packed_span.0;
        let (mut fed_ptr, mut fed_at, mut fed_words) = (0u64, 0u32, 0u32);
        if let Some((p, tokens)) = fed {
            let n = tokens * 4;
            let Some(&(_, o, len)) = bucket.packed.iter().find(|p| p.0 == "tokens") else {
                return Err(gerr("the step has no tokens input to feed"));
            };
            if len < n {
                return Err(gerr(format!("fed token ids for {tokens} tokens ({len}-byte input)")));
            }
            (fed_ptr, fed_at, fed_words) = (p, ((o - s0) / 4) as u32, (n / 4) as u32);
        }
        let words = (bytes / 4) as u32;
        let cfg = LaunchConfig { grid_dim: (words.div_ceil(256).max(1), 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        if let (Some(fp), true) = (&self.inputs_pdl, fed.is_some()) {
            // (a fed step: right after the previous step's argmax, with PDL)
            cu(self.ctx.bind_to_thread(), "binding the context")?;
            // SAFETY: dsc_inputs_pdl(src, dst, fed, words, fed_at, fed_words): `src` is pinned
            // staging of at least `bytes` (device-readable under unified addressing) the caller
            // keeps until after this kernel; `dst` spans `bytes` of the arena; `fed` holds
            // `fed_words` words landing inside the (first) tokens input (checked above)
            let r = unsafe { launch_kernel_ex(&self.stream, fp, &[src_ptr, dptr, fed_ptr], &[words as i64, fed_at as i64, fed_words as i64], cfg, true, 1, None) };
            return cu(r, "launching dsc_inputs_pdl");
        }
        let mut lb = self.stream.launch_builder(f);
        lb.arg(&src_ptr).arg(&dptr).arg(&words).arg(&fed_ptr).arg(&fed_at).arg(&fed_words);
        // SAFETY: dsc_inputs(src, dst, words, fed, fed_at, fed_words): as above
        unsafe { lb.launch(cfg) }.map_err(|e| gerr(format!("launching dsc_inputs: {e:?}")))?;
        Ok(())
    }

    /// Upload the step's inputs and run its launches (as a CUDA graph once captured). With
    /// `fed`, the token ids come from that device buffer (a pipelined step: the previous
    /// step's argmax), not from `b.tokens`.
    fn run_launches(&self, bucket: &mut Bucket, b: &StepBatch, use_graph: bool, fed: Option<&CudaSlice<u8>>) -> Result<()> {
        let table = self.padded_table(b);
        let inputs = Self::step_inputs(b, &table);
        // (a graph without inputs has nothing to upload)
        if !bucket.packed.is_empty() {
            // (one copy: every packed input at its place in the span, zeros past its data)
            // from pinned memory: a pageable copy may wait for the stream to drain, which would
            // serialize a pipelined step's host work with the step before it
            let (s0, s1) = bucket.packed_span;
            let mut ring = self.staging.borrow_mut();
            // (a full ring hands back its oldest buffer once that buffer's copy has run)
            let mut host = if ring.len() >= STAGING_BUFFERS {
                let (h, copied) = ring.pop_front().expect("a full ring");
                cu(copied.synchronize(), "waiting for a staging buffer")?;
                h
            } else {
                self.pinned((s1 - s0).max(1 << 16))?
            };
            if host.len() < s1 - s0 {
                host = self.pinned(s1 - s0)?;
            }
            let h = &mut cu(host.as_mut_slice(), "staging inputs")?[..s1 - s0];
            Self::pack_inputs(bucket, &inputs, h)?;
            // (the fed token ids taken in the same kernel, at the tokens' words)
            let mut _fed_guard = None;
            let fed_at = match fed {
                Some(src) => {
                    let n = b.tokens.len() * 4;
                    if src.len() < n {
                        return Err(gerr(format!("fed token ids: {} bytes for {} tokens", src.len(), b.tokens.len())));
                    }
                    let (p, g) = cudarc::driver::DevicePtr::device_ptr(src, &self.stream);
                    _fed_guard = Some(g);
                    Some((p, b.tokens.len()))
                }
                None => None,
            };
            self.launch_inputs(&self.inputs_kernel, bucket, h.as_ptr() as u64, fed_at)?;
            let done = cu(self.stream.record_event(None), "recording the input copy")?;
            ring.push_back((host, done));
        }
        if use_graph && bucket.graph.is_none() && bucket.runs > 0 {
            cu(self.stream.begin_capture(cudarc::driver::sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "begin capture")?;
            // (`MeasureOptions::graph_repeat` = n: the step's launches n times in the graph —
            // the same step recomputed, every accumulator zeroed before use — to see what a
            // graph launch costs its first kernels)
            let repeat = self.measure.graph_repeat.clamp(1, 8);
            let mut launched = Ok(());
            for _ in 0..repeat {
                launched = self.launch_all(bucket);
                if launched.is_err() {
                    break;
                }
            }
            let graph = cu(self.stream.end_capture(cudarc::driver::sys::CUgraphInstantiate_flags::CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH), "end capture")?;
            launched?;
            bucket.graph = graph;
        }
        match &bucket.graph {
            Some(gr) if use_graph => cu(gr.launch(), "graph launch")?,
            _ => self.launch_all(bucket)?,
        }
        bucket.runs += 1;
        Ok(())
    }
}

impl GpuBackend<'_> {
    /// `bytes` of page-locked host memory (plain: the host reads it back too). Its contents
    /// are unset: every user writes (or has a copy write) the bytes it reads.
    fn pinned(&self, bytes: usize) -> Result<cudarc::driver::PinnedHostSlice<u8>> {
        // SAFETY: see above; nothing reads the buffer before it is written
        cu(unsafe { self.ctx.alloc_pinned_with_flags::<u8>(bytes, 0) }, "allocating pinned host memory")
    }

    /// A synchronous step may not overtake pipelined ones whose ids are not collected.
    fn no_inflight(&self) -> Result<()> {
        if self.inflight.is_empty() {
            Ok(())
        } else {
            Err(gerr("a synchronous step while pipelined steps are in flight (collect them first)"))
        }
    }

    /// The bucket a step runs in, and the shortest context of its context class.
    fn bucket_key(&self, b: &StepBatch) -> (BucketKey, i64) {
        // (the longest context of the step: its sequences' last position + 1)
        let context = b.positions.iter().map(|&p| p as i64 + 1).max().unwrap_or(1);
        let (class, shortest) = crate::plan::context_class_in(&self.context_bounds, context);
        ((b.tokens.len(), b.num_seqs, b.logit_rows.len(), class), shortest)
    }

    /// The stream the launched steps' token ids go to the host on: the copy stream, after an
    /// event at the main stream's end so far (or the main stream itself).
    fn ids_copy_stream(&self) -> Result<&Arc<CudaStream>> {
        let ready = cu(self.stream.record_event(None), "recording the step's end")?;
        cu(self.copy_stream.wait(&ready), "ordering the token ids' copy")?;
        Ok(&self.copy_stream)
    }

    /// The device argmax kernel pipelined greedy steps use (None: the host picks, or
    /// tensor-parallel ranks).
    fn greedy_argmax(&self) -> Option<String> {
        self.prog.argmax.clone().filter(|_| self.prog.argmax_block.is_some() && !matches!(self.collective, GpuCollective::Local(_)))
    }

    /// Find (or make) the step shape's bucket and run `f` on it; long steps get a transient one.
    fn with_bucket<R>(&mut self, b: &StepBatch, f: impl FnOnce(&Self, &mut Bucket, bool) -> Result<R>) -> Result<R> {
        b.validate()?;
        if b.max_blocks > self.table_width {
            return Err(gerr(format!("block table of {} blocks per sequence exceeds the plan's longest sequence ({} blocks)", b.max_blocks, self.table_width)));
        }
        let (key, shortest) = self.bucket_key(b);
        if key.0 > self.cached_max_tokens {
            let mut bucket = self.prepare(key.0, key.1, key.2, shortest)?;
            return f(self, &mut bucket, false);
        }
        let mut bucket = match self.buckets.remove(&key) {
            Some(bk) => bk,
            None => self.prepare(key.0, key.1, key.2, shortest)?,
        };
        let out = f(self, &mut bucket, self.use_graphs);
        self.buckets.insert(key, bucket);
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn launch_dims_cover_the_work() {
        // the warp-specialized tile: 384 threads, a block per 256 columns and 128 rows
        use crate::plan::LaunchKind;
        assert_eq!(LaunchKind::OutputsPerBlock.dims(4096, 4096, 256, 128, 384), Some((16, 32, 384)));
        assert_eq!(LaunchKind::OutputsPerBlock.dims(4096, 100, 256, 128, 384), Some((16, 1, 384)));
        assert_eq!(LaunchKind::None.dims(1, 1, 1, 1, 1), None);
        // in the plan by name; another name does not parse
        assert_eq!(serde_json::to_string(&LaunchKind::WarpgroupPerTile).unwrap(), "\"warpgroup_per_tile\"");
        let e = serde_json::from_str::<LaunchKind>("\"no_such_kind\"").unwrap_err().to_string();
        assert!(e.contains("unknown variant `no_such_kind`"), "{e}");
    }
}
