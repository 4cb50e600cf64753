//! The plan's compiled CPU kernels (`--backend cpu`): the shared library of the highest x86-64
//! level this CPU runs, loaded with `dlopen` (no compiler here), its matmuls handed to the
//! executor as [`PackedMatMul`] so that weights stay as stored (Q4_1 blocks read in place).
//!
//! Launch: the whole step runs on a worker of a rayon pool (one thread per core: the executor's
//! own work does not compete with idle workers for the cores); each product's output columns
//! are split over the pool in runs of a multiple of 4 (the gemm's column tile); `_gemv` for
//! fewer than 4 rows, `_gemm` otherwise, each with `dsc_ir::quant::cpu_matmul_scratch` floats of
//! scratch (a thread's own, kept between calls). Products too small to pay
//! a hand-off run on the calling thread.

use crate::error::{Result, RuntimeError};
use crate::plan::Plan;
use base64::Engine as _;
use dsc_ir::{DType, PackedMatMul};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

/// `(x, w, y, scratch, m, k, n0, n1, ldy)` — `dsc_codegen::cpu::matmul`'s signature.
type Kernel = unsafe extern "C" fn(*const f32, *const u8, *mut f32, *mut f32, i64, i64, i64, i64, i64);

thread_local! {
    /// The kernels' scratch on this thread (`dsc_ir::quant::cpu_matmul_scratch` floats).
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Multiply-adds below which a product runs on one thread.
const SERIAL_MACS: usize = 1 << 17;

pub struct CpuKernels {
    /// (gemv, gemm) per weight type
    fns: HashMap<DType, (Kernel, Kernel)>,
    pool: rayon::ThreadPool,
    threads: usize,
    target: String,
    // keeps the functions above mapped
    _lib: libloading::Library,
}

/// Whether this CPU runs code built for x86-64 level `target`.
pub fn cpu_runs(target: &str) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let v3 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("bmi2");
        match target {
            "x86-64-v3" => v3,
            "x86-64-v4" => {
                v3 && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512dq")
                    && is_x86_feature_detected!("avx512cd")
            }
            // (asks Linux for the tile state once: `amx_usable`)
            "x86-64-v4-amx" => cpu_runs("x86-64-v4") && dsc_ir::quant::amx_usable(),
            _ => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = target;
        false
    }
}

/// glibc's allocator, told to keep what the CPU backend frees: a step's activations (a 500-token
/// prefill's are several MB each) would otherwise be `mmap`ed and unmapped every step (the
/// dynamic threshold lets them move in and out of the heap) and faulted in page by page again,
/// which cost 0.1-1.2 s of system time a 3 x 500-token prefill and moved prefill by ±20% run to
/// run on the 2-core build machine (`GLIBC_TUNABLES` trials, docs/perf.md). Blocks under 32 MB
/// come from the heap, and up to 256 MB freed at its top stays there.
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        // SAFETY: mallopt only sets the allocator's thresholds (it takes its own lock).
        ONCE.call_once(|| unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
            libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        });
    }
}

impl CpuKernels {
    /// Load the plan's library for this CPU; `threads` workers (0: one per core).
    pub fn load(plan: &Plan, threads: usize) -> Result<CpuKernels> {
        Self::load_target(plan, threads, None)
    }

    /// [`CpuKernels::load`], with the library of x86-64 level `target` where given (it must
    /// be in the plan and run on this CPU) instead of the highest one that runs.
    pub fn load_target(plan: &Plan, threads: usize, target: Option<&str>) -> Result<CpuKernels> {
        let err = |msg: String| RuntimeError::Plan { path: plan.path.clone(), msg };
        let prog = plan.header.cpu.as_ref().ok_or_else(|| err("the plan has no compiled CPU kernels (compiled before they existed, or without a C compiler); `--backend reference` runs it".into()))?;
        if prog.layout != dsc_ir::quant::CPU_LAYOUT {
            return Err(err(format!(
                "the plan's CPU kernels read weight layout {}, this runtime lays weights out as {} (recompile the plan with this dsc); `--backend reference` runs it",
                prog.layout,
                dsc_ir::quant::CPU_LAYOUT
            )));
        }
        let target = crate::plan::CPU_TARGETS.iter().rev().find(|t| prog.libraries.contains_key(**t) && cpu_runs(t) && target.is_none_or(|w| w == **t)).ok_or_else(|| {
            err(format!(
                "this CPU runs none of the plan's CPU libraries{} ({:?}; x86-64-v3 needs AVX2, FMA and F16C); `--backend reference` runs it",
                target.map(|t| format!(" asked for ({t})")).unwrap_or_default(),
                prog.libraries.keys().collect::<Vec<_>>()
            ))
        })?;
        let so = base64::engine::general_purpose::STANDARD.decode(&prog.libraries[*target]).map_err(|e| err(format!("cpu.libraries.{target}: not base64: {e}")))?;
        // dlopen needs a file: a private one, removed once mapped
        let dir = tempfile::Builder::new().prefix("dsc-cpu-").tempdir().map_err(|e| err(format!("a temporary directory for the CPU library: {e}")))?;
        let path = dir.path().join(format!("{target}.so"));
        std::fs::write(&path, &so).map_err(|e| err(format!("{}: {e}", path.display())))?;
        // SAFETY: the library comes from the plan (checksummed, and signed where the server
        // asks for it) and has no initializers: loading runs none of its code.
        let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| err(format!("loading the {target} CPU library: {e}")))?;
        let mut fns = HashMap::new();
        for name in &prog.matmul_dtypes {
            let dtype: DType = name.parse().map_err(|_| err(format!("cpu.matmul_dtypes: unknown type `{name}`")))?;
            let get = |f: &str| -> Result<Kernel> {
                let sym = format!("dsc_cpu_matmul_{name}_{f}");
                // SAFETY: the symbol is a function of the family's signature (the compiler
                // emits every listed type's pair with it).
                unsafe { lib.get::<Kernel>(sym.as_bytes()) }.map(|s| *s).map_err(|e| err(format!("the {target} CPU library lacks `{sym}`: {e}")))
            };
            fns.insert(dtype, (get("gemv")?, get("gemm")?));
        }
        keep_freed_memory();
        let threads = if threads == 0 { std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) } else { threads };
        let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).thread_name(|i| format!("dsc-cpu-{i}")).build().map_err(|e| err(format!("the CPU thread pool: {e}")))?;
        Ok(CpuKernels { fns, pool, threads, target: target.to_string(), _lib: lib })
    }

    /// The x86-64 level whose library runs ("x86-64-v4").
    pub fn target(&self) -> &str {
        &self.target
    }

    pub fn threads(&self) -> usize {
        self.threads
    }
}

/// A raw output pointer shared by the runs, each writing its own columns.
#[derive(Clone, Copy)]
struct Out(*mut f32);
// SAFETY: runs write disjoint columns of the buffer, which outlives the scope.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    // (a method, so that closures capture the whole Out, not its raw pointer field)
    fn ptr(self) -> *mut f32 {
        self.0
    }
}

impl PackedMatMul for CpuKernels {
    fn on_workers(&self, step: &mut (dyn FnMut() + Send)) {
        // The step runs on a worker; its matmuls' runs go to the others and this one. The other
        // workers spin through the step instead of sleeping between hand-offs (a decode step
        // has ~5 a layer, and waking a parked worker costs microseconds each): each runs a job
        // that takes whatever the pool has (`yield_now`) until the step ends. (A spinner that
        // lands on the step's own worker, while it waits inside a hand-off, returns at once.)
        let active = AtomicBool::new(true);
        self.pool.install(|| {
            let me = rayon::current_thread_index();
            rayon::scope(|s| {
                for _ in 1..self.threads {
                    s.spawn(|_| {
                        while active.load(Ordering::Acquire) && rayon::current_thread_index() != me {
                            if rayon::yield_now() != Some(rayon::Yield::Executed) {
                                std::hint::spin_loop();
                            }
                        }
                    });
                }
                step();
                active.store(false, Ordering::Release);
            })
        })
    }

    fn takes(&self, dtype: DType, n: usize, k: usize) -> bool {
        // (k whole units: 32-element blocks, K-quants' 256-element super-blocks)
        self.fns.contains_key(&dsc_ir::quant::cpu_kernel_dtype(dtype)) && k > 0 && k % dtype.block().0.max(32) == 0 && n % 4 == 0 && n > 0
    }

    fn prepare(&self, dtype: DType, n: usize, k: usize, stored: &[u8]) -> std::result::Result<Vec<u8>, String> {
        match dtype {
            // (Q4_1 and Q8_0 in the kernels' layout: f16 scales apart from the quants; i4g128
            // in Q4_1's, for its kernels)
            DType::Q4_1 | DType::Q8_0 | DType::I4G128 => dsc_ir::quant::cpu_layout(dtype, stored, n, k).ok_or_else(|| format!("{} bytes are not {dtype} [{n}, {k}]", stored.len())),
            _ => Ok(stored.to_vec()),
        }
    }

    fn matmul(&self, dtype: DType, w: &[u8], n: usize, k: usize, x: &[f32], m: usize) -> std::result::Result<Vec<f32>, String> {
        self.matmul_cat(&[(dtype, w, n)], k, x, m)
    }

    fn matmul_cat(&self, parts: &[(DType, &[u8], usize)], k: usize, x: &[f32], m: usize) -> std::result::Result<Vec<f32>, String> {
        let mut fns = Vec::with_capacity(parts.len());
        let mut starts = Vec::with_capacity(parts.len());
        let mut total = 0usize;
        for &(dtype, w, n) in parts {
            let &(gemv, gemm) = self.fns.get(&dsc_ir::quant::cpu_kernel_dtype(dtype)).ok_or_else(|| format!("no CPU kernel reads {dtype}"))?;
            if !self.takes(dtype, n, k) || dsc_ir::quant::cpu_layout_bytes(dtype, n, k) != Some(w.len()) || x.len() != m * k {
                return Err(format!("CPU matmul: {m}x{k} by {dtype} [{n}, {k}] ({} weight bytes, {} x values) does not fit the kernels", w.len(), x.len()));
            }
            fns.push(if m < 4 { gemv } else { gemm });
            starts.push(total);
            total += n;
        }
        let mut y = vec![0f32; m * total];
        if m == 0 || total == 0 {
            return Ok(y);
        }
        let out = Out(y.as_mut_ptr());
        // columns c0..c1 of the concatenation: each part's share, written in place
        let run = |c0: usize, c1: usize| {
            SCRATCH.with_borrow_mut(|scratch| {
                // (a thread's, kept between calls: the AMX gemm's is ~m·k floats, which a
                // fresh allocation a call would fault in page by page)
                let need = dsc_ir::quant::cpu_matmul_scratch(m, k);
                if scratch.len() < need {
                    scratch.resize(need, 0.0);
                }
                for (p, &(_, w, n)) in parts.iter().enumerate() {
                    let (a, b) = (c0.max(starts[p]), c1.min(starts[p] + n));
                    if a >= b {
                        continue;
                    }
                    // SAFETY: x holds m*k floats, w the part's n*k weights as the kernels read them
                    // (checked above), y m*total floats: the pointer at the part's first column,
                    // rows `total` apart, this run writing its columns a..b only; scratch as the
                    // kernels need it (`cpu_matmul_scratch`).
                    unsafe {
                        fns[p](x.as_ptr(), w.as_ptr(), out.ptr().wrapping_add(starts[p]), scratch.as_mut_ptr(), m as i64, k as i64, (a - starts[p]) as i64, (b - starts[p]) as i64, total as i64)
                    };
                }
            })
        };
        let runs = if m * total * k < SERIAL_MACS { 1 } else { self.threads.min(total / 4) };
        if runs <= 1 {
            run(0, total);
        } else {
            // the concatenated columns in `runs` runs of whole 4-column tiles (every part's
            // width is a multiple of 4, so a run never splits a tile)
            let tiles = total / 4;
            self.pool.scope(|s| {
                for r in 0..runs {
                    let (t0, t1) = (tiles * r / runs, tiles * (r + 1) / runs);
                    let run = &run;
                    s.spawn(move |_| run(4 * t0, 4 * t1));
                }
            });
        }
        Ok(y)
    }
}
