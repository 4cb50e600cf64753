//! Run generated kernels on the GPU against expected outputs from the CPU reference executor.
//!
//! A bundle is a folder with `bundle.json` ([`Bundle`]), the PTX it names, and `data.bin`
//! (little-endian arrays — f32, i32, or raw bytes for packed weights — at the byte offsets
//! the cases give). For each case the runtime uploads
//! the inputs, fills the output with NaN (poison), launches, and compares:
//! ‖out − expected‖ / ‖expected‖ ≤ tol, and every element written (no NaN left).

use anyhow::{bail, Context};
use cudarc::driver::{CudaContext, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Array {
    /// byte offset in data.bin
    pub offset: usize,
    /// elements
    pub len: usize,
    /// "f32", "i32", "bf16" (a bf16 KV pool) or "u8"
    pub dtype: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Case {
    pub name: String,
    pub kernel: String,
    pub grid: u32,
    #[serde(default = "one")]
    pub grid_y: u32,
    pub block: u32,
    pub inputs: Vec<Array>,
    pub scalars: Vec<i64>,
    pub expected: Array,
    /// initial output contents (an in-place kernel's buffer); NaN poison when absent
    #[serde(default)]
    pub init: Option<Array>,
    /// inputs the kernel also writes (KV pools), by position in `inputs`, with their
    /// expected contents after one launch (checked like the output)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub written_inputs: Vec<(usize, Array)>,
    /// inputs the kernel takes as TMA tensor maps (`KernelSpec::Tma`): the uploaded weight's
    /// map replaces it in the kernel's arguments
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tmaps: Vec<TmapInput>,
    pub tol: f32,
    /// on sm_90a, launched in thread-block clusters of this many blocks along grid y
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<u32>,
}

/// A weight input of a check case passed as its tensor map: a [n, k] bf16 (`f16`: f16) matrix,
/// boxes of `rows` rows (`gpu::weight_tensor_map`).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TmapInput {
    pub input: usize,
    pub n: usize,
    pub k: usize,
    pub rows: u32,
    pub f16: bool,
    /// a bf16 KV pool [blocks, block size, KV heads, head dim] instead (`gpu::pool_tensor_map`:
    /// the wgmma prefill attention's K/V tiles by TMA); n and k unused
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool: Option<[usize; 4]>,
}

fn one() -> u32 {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Bundle {
    /// target → PTX file name
    pub ptx: std::collections::BTreeMap<String, String>,
    pub cases: Vec<Case>,
    /// bytes of dynamic shared memory, for the kernels that take it
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub smem: std::collections::BTreeMap<String, u32>,
    /// the kernels that ask for the largest shared-memory carveout (`GpuLarge::carveout`)
    #[serde(default, skip_serializing_if = "std::collections::BTreeSet::is_empty")]
    pub carveout: std::collections::BTreeSet<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct CaseResult {
    pub name: String,
    pub kernel: String,
    pub elements: usize,
    pub rel_err: f64,
    pub unwritten: usize,
    pub tol: f32,
    pub pass: bool,
    pub median_us: f64,
}

impl Array {
    /// Its bytes in data.bin (elements of its dtype).
    pub fn byte_len(&self) -> anyhow::Result<usize> {
        let w = match self.dtype.as_str() {
            "f32" | "i32" => 4,
            "bf16" => 2,
            "u8" => 1,
            other => bail!("unknown array dtype {other}"),
        };
        Ok(self.len * w)
    }
}

fn bytes_of<'a>(data: &'a [u8], a: &Array) -> anyhow::Result<&'a [u8]> {
    data.get(a.offset..a.offset + a.byte_len()?).context("array outside data.bin")
}

fn f32s(data: &[u8], a: &Array) -> anyhow::Result<Vec<f32>> {
    anyhow::ensure!(a.dtype == "f32", "expected an f32 array");
    Ok(bytes_of(data, a)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// A buffer's bytes as f32 values: bf16 (`dtype` "bf16") widened, else f32.
fn decode(bytes: &[u8], dtype: &str) -> anyhow::Result<Vec<f32>> {
    // (i32: token ids a kernel wrote, compared as numbers)
    if dtype == "i32" {
        anyhow::ensure!(bytes.len() % 4 == 0, "{} bytes are not whole i32 values", bytes.len());
        return Ok(bytes.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32).collect());
    }
    // (u8: packed weights a kernel wrote, compared byte by byte as numbers)
    if dtype == "u8" {
        return Ok(bytes.iter().map(|&b| b as f32).collect());
    }
    let (dt, w) = if dtype == "bf16" { (dsc_ir::DType::BF16, 2) } else { (dsc_ir::DType::F32, 4) };
    dsc_ir::quant::decode(dt, bytes, bytes.len() / w).with_context(|| format!("{} bytes are not whole {dtype} values", bytes.len()))
}

/// Upload an array as raw bytes (the kernel reinterprets them).
fn upload(stream: &std::sync::Arc<cudarc::driver::CudaStream>, data: &[u8], a: &Array) -> anyhow::Result<cudarc::driver::CudaSlice<u8>> {
    Ok(stream.clone_htod(bytes_of(data, a)?)?)
}

pub fn run(dir: &Path, target: &str) -> anyhow::Result<Vec<CaseResult>> {
    let bundle: Bundle = serde_json::from_str(&std::fs::read_to_string(dir.join("bundle.json")).context("bundle.json")?)?;
    let data = std::fs::read(dir.join("data.bin")).context("data.bin")?;
    let ptx_file = bundle.ptx.get(target).with_context(|| format!("no PTX for target {target} in the bundle"))?;
    let ptx = std::fs::read_to_string(dir.join(ptx_file))?;
    crate::gpu::cuda_available().map_err(|e| anyhow::anyhow!("gpu-check: {e}"))?;
    let ctx = CudaContext::new(0).context("CUDA device 0")?;
    let stream = ctx.default_stream();
    let module = ctx.load_module(Ptx::from_src(ptx)).context("loading the PTX module")?;
    let mut results = vec![];
    for c in &bundle.cases {
        let f = module.load_function(&c.kernel).with_context(|| format!("kernel {}", c.kernel))?;
        let smem = bundle.smem.get(&c.kernel).copied().unwrap_or(0);
        crate::gpu::allow_smem(&f, smem, bundle.carveout.contains(&c.kernel)).with_context(|| format!("kernel {}: {smem} bytes of shared memory", c.kernel))?;
        let mut ins = c.inputs.iter().map(|a| upload(&stream, &data, a)).collect::<anyhow::Result<Vec<_>>>()?;
        // (TMA kernels: the weights stay allocated, their tensor maps take their places)
        let mut _weights = vec![];
        for tm in &c.tmaps {
            let w = ins.get(tm.input).with_context(|| format!("{}: tensor-map input {} out of range", c.name, tm.input))?;
            let map = match tm.pool {
                Some(dims) => crate::gpu::pool_tensor_map(&stream, w, dims, tm.rows),
                None => crate::gpu::weight_tensor_map(&stream, w, tm.n, tm.k, tm.f16, tm.rows),
            };
            let map = map.map_err(|e| anyhow::anyhow!("{}: {e}", c.name))?;
            _weights.push(std::mem::replace(&mut ins[tm.input], map));
        }
        let want = f32s(&data, &c.expected)?;
        // (the output's initial bytes: `init` as it is — f32, or a bf16 KV pool —, else NaN)
        let out_dtype = c.init.as_ref().map_or("f32", |a| a.dtype.as_str());
        let init = match &c.init {
            Some(a) => bytes_of(&data, a)?.to_vec(),
            None => vec![f32::NAN; want.len()].iter().flat_map(|x| x.to_le_bytes()).collect(),
        };
        let mut out = stream.clone_htod(&init)?;
        let cfg = LaunchConfig { grid_dim: (c.grid, c.grid_y, 1), block_dim: (c.block, 1, 1), shared_mem_bytes: smem };
        let cluster = c.cluster.filter(|&n| n > 1 && target == "sm_90a");
        let launch = |out: &mut cudarc::driver::CudaSlice<u8>| -> anyhow::Result<()> {
            if let Some(n) = cluster {
                // (clusters: cuLaunchKernelEx, as the runtime launches them)
                use cudarc::driver::DevicePtr;
                let mut guards = vec![];
                let mut ptrs: Vec<u64> = vec![];
                for i in ins.iter().chain([&*out]) {
                    let (p, g) = i.device_ptr(&stream);
                    ptrs.push(p);
                    guards.push(g);
                }
                stream.context().bind_to_thread()?;
                // SAFETY: argument order and types follow the kernel's calling convention (as
                // below); the buffers live past the launch
                unsafe { crate::gpu::launch_kernel_ex(&stream, &f, &ptrs, &c.scalars, cfg, false, n, None) }.with_context(|| format!("{}: launching in clusters of {n}", c.name))?;
                return Ok(());
            }
            let mut b = stream.launch_builder(&f);
            for i in &ins {
                b.arg(i);
            }
            b.arg(out);
            for s in &c.scalars {
                b.arg(s);
            }
            // SAFETY: argument order and types follow the kernel's calling convention
            // (pointers in operand order, the output, then i64 scalars), and the buffers hold
            // the element counts the scalars describe.
            unsafe { b.launch(cfg) }?;
            Ok(())
        };
        launch(&mut out)?;
        stream.synchronize()?;
        let got = decode(&stream.clone_dtoh(&out)?, out_dtype)?;
        let unwritten = got.iter().filter(|v| v.is_nan()).count();
        let rel_of = |got: &[f32], want: &[f32]| {
            let (mut num, mut den) = (0f64, 0f64);
            for (g, w) in got.iter().zip(want) {
                num += ((g - w) as f64).powi(2);
                den += (*w as f64).powi(2);
            }
            (num / den.max(1e-30)).sqrt()
        };
        let mut rel = rel_of(&got, &want);
        for (i, a) in &c.written_inputs {
            let buf = ins.get(*i).with_context(|| format!("{}: written input {i} out of range", c.name))?;
            let bytes = stream.clone_dtoh(buf)?;
            let got = decode(&bytes, &c.inputs[*i].dtype)?;
            // (the expected values in their own dtype: a router's u32 counters are i32 arrays)
            let r = rel_of(&got, &decode(bytes_of(&data, a)?, &a.dtype)?);
            rel = if r.is_nan() { r } else { rel.max(r) };
        }
        // timing: CUDA events around repeated launches after warm-up, median of 20
        let mut times = vec![];
        for _ in 0..3 {
            launch(&mut out)?;
        }
        for _ in 0..20 {
            let e0 = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            let e1 = ctx.new_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            e0.record(&stream)?;
            launch(&mut out)?;
            e1.record(&stream)?;
            e1.synchronize()?;
            times.push(e0.elapsed_ms(&e1)? as f64 * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        let pass = unwritten == 0 && rel.is_finite() && rel <= c.tol as f64;
        results.push(CaseResult { name: c.name.clone(), kernel: c.kernel.clone(), elements: want.len(), rel_err: rel, unwritten, tol: c.tol, pass, median_us: times[times.len() / 2] });
    }
    if results.is_empty() {
        bail!("the bundle has no cases");
    }
    Ok(results)
}
