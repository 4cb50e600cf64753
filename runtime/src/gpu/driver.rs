//! The GPU backend's driver-level helpers: launches by `cuLaunchKernelEx` (PDL, clusters, an
//! L2 access policy window), the dynamic shared-memory opt-in, `CUtensorMap`s of weights, KV
//! pools and arena activations, and the runtime's own input kernel (`dsc_inputs`, hand-written
//! PTX loaded beside the plan's module).

use super::*;

/// The runtime's own kernel: `dsc_inputs(src, dst, words, fed, fed_at, fed_words)` copies
/// `words` 32-bit words from `src` (the pinned staging buffer, read over PCIe: host memory is
/// mapped into the device's address space under unified addressing) to `dst` (the arena's
/// input span), taking words `fed_at .. fed_at + fed_words` from `fed` instead (the previous
/// step's token ids on the device; `fed_words` 0: none). A thread per word.
/// With `pdl` its sm_90 variant `dsc_inputs_pdl(src, dst, fed, words, fed_at, fed_words)` for
/// programmatic dependent launch: the parameters as pointers then u64 (the runtime's
/// cuLaunchKernelEx convention), and only the threads that take a fed token id wait for the
/// kernel before it (`griddepcontrol.wait`: the previous step's argmax) — the staged words,
/// read from pinned host memory over PCIe, go while that argmax still runs.
pub(crate) fn inputs_ptx(pdl: bool) -> String {
    // (PDL: u64 parameters, the runtime's cuLaunchKernelEx convention, narrowed in registers)
    let (head, name, params, loads, rd) = if pdl {
        (
            ".version 7.8\n.target sm_90",
            "dsc_inputs_pdl",
            ".param .u64 src, .param .u64 dst, .param .u64 fed, .param .u64 words, .param .u64 fed_at, .param .u64 fed_words",
            "    ld.param.u64 %rd1, [src];\n    ld.param.u64 %rd2, [dst];\n    ld.param.u64 %rd3, [fed];\n    ld.param.u64 %rd8, [words];\n    ld.param.u64 %rd9, [fed_at];\n    ld.param.u64 %rd10, [fed_words];\n    cvt.u32.u64 %r1, %rd8;\n    cvt.u32.u64 %r2, %rd9;\n    cvt.u32.u64 %r3, %rd10;\n",
            12,
        )
    } else {
        (
            ".version 7.0\n.target sm_80",
            "dsc_inputs",
            ".param .u64 src, .param .u64 dst, .param .u32 words, .param .u64 fed, .param .u32 fed_at, .param .u32 fed_words",
            "    ld.param.u64 %rd1, [src];\n    ld.param.u64 %rd2, [dst];\n    ld.param.u32 %r1, [words];\n    ld.param.u64 %rd3, [fed];\n    ld.param.u32 %r2, [fed_at];\n    ld.param.u32 %r3, [fed_words];\n",
            10,
        )
    };
    // (only the threads taking a fed token id wait for the kernel before it)
    let wait = if pdl { "    griddepcontrol.wait;\n" } else { "" };
    format!(
        "
{head}
.address_size 64
.visible .entry {name}({params})
{{
    .reg .pred %p<3>;
    .reg .b32 %r<10>;
    .reg .b64 %rd<{rd}>;
{loads}    mov.u32 %r4, %ctaid.x;
    mov.u32 %r5, %ntid.x;
    mov.u32 %r6, %tid.x;
    mad.lo.u32 %r4, %r4, %r5, %r6;
    setp.ge.u32 %p1, %r4, %r1;
    @%p1 bra DONE;
    sub.u32 %r7, %r4, %r2;
    setp.lt.u32 %p2, %r7, %r3;
    @%p2 bra FED;
    mul.wide.u32 %rd4, %r4, 4;
    add.s64 %rd5, %rd1, %rd4;
    ld.u32 %r8, [%rd5];
    bra.uni STORE;
FED:
{wait}    mul.wide.u32 %rd4, %r7, 4;
    add.s64 %rd5, %rd3, %rd4;
    ld.global.u32 %r8, [%rd5];
STORE:
    mul.wide.u32 %rd6, %r4, 4;
    add.s64 %rd7, %rd2, %rd6;
    st.global.u32 [%rd7], %r8;
DONE:
    ret;
}}
"
    )
}

/// One cuLaunchKernelEx of `f` on `stream`: the device pointers `ptrs` then the i64 `scalars`
/// as its parameters, with programmatic stream serialization where `pdl`, and in
/// thread-block clusters of `cluster` blocks along grid y where that is more than 1, and with
/// an L2 access policy window (base, bytes, hit ratio: that fraction of the range's lines
/// persisting, the rest streaming) where given.
///
/// # Safety
/// `ptrs` and `scalars` follow the kernel's calling convention (order, types, buffer sizes)
/// and the pointers stay valid until the kernel has run.
pub unsafe fn launch_kernel_ex(
    stream: &CudaStream,
    f: &CudaFunction,
    ptrs: &[u64],
    scalars: &[i64],
    cfg: LaunchConfig,
    pdl: bool,
    cluster: u32,
    l2_window: Option<(u64, usize, f32)>,
) -> std::result::Result<(), cudarc::driver::DriverError> {
    use cudarc::driver::sys;
    let (mut ptrs, mut scalars) = (ptrs.to_vec(), scalars.to_vec());
    let mut params: Vec<*mut std::ffi::c_void> = ptrs.iter_mut().map(|p| p as *mut u64 as *mut std::ffi::c_void).chain(scalars.iter_mut().map(|s| s as *mut i64 as *mut std::ffi::c_void)).collect();
    let mut attrs = Vec::with_capacity(3);
    if let Some((base, bytes, ratio)) = l2_window {
        // SAFETY: as below; the window is an address range, not dereferenced here
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.accessPolicyWindow = sys::CUaccessPolicyWindow {
            base_ptr: base as *mut std::ffi::c_void,
            num_bytes: bytes,
            hitRatio: ratio,
            hitProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_PERSISTING,
            missProp: sys::CUaccessProperty::CU_ACCESS_PROPERTY_STREAMING,
        };
        attrs.push(sys::CUlaunchAttribute { id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW, pad: [0; 4], value });
    }
    if pdl {
        // SAFETY: a zeroed attribute value is valid; we set the one field the id selects
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        attrs.push(sys::CUlaunchAttribute { id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, pad: [0; 4], value });
    }
    if cluster > 1 {
        // SAFETY: as above
        let mut value: sys::CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.clusterDim.x = 1;
        value.clusterDim.y = cluster;
        value.clusterDim.z = 1;
        attrs.push(sys::CUlaunchAttribute { id: sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION, pad: [0; 4], value });
    }
    let (gx, gy, gz) = cfg.grid_dim;
    let (bx, by, bz) = cfg.block_dim;
    let lc = sys::CUlaunchConfig {
        gridDimX: gx,
        gridDimY: gy,
        gridDimZ: gz,
        blockDimX: bx,
        blockDimY: by,
        blockDimZ: bz,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: attrs.as_mut_ptr(),
        numAttrs: attrs.len() as u32,
    };
    // SAFETY: the caller's contract; `params` points at values that outlive the call, which
    // copies them
    unsafe { sys::cuLaunchKernelEx(&lc, f.cu_function(), params.as_mut_ptr(), std::ptr::null_mut()) }.result()
}

/// Let kernel `f` use `bytes` of dynamic shared memory (past the default 48 KB a kernel may
/// take without opting in); with `carveout` (the plan's `GpuLarge::carveout`) it also asks for
/// the largest shared-memory carveout.
pub fn allow_smem(f: &CudaFunction, bytes: u32, carveout: bool) -> std::result::Result<(), cudarc::driver::DriverError> {
    if bytes > 48 * 1024 {
        f.set_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, bytes as i32)?;
    }
    // (the prefill attention, compiled for several blocks per SM — three of 66.6 KB for the
    // wgmma kernel —, asks for it: else the driver picked a 168 KB configuration for it, two
    // blocks)
    if bytes > 48 * 1024 && carveout {
        f.set_attribute(cudarc::driver::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100)?;
    }
    Ok(())
}




/// A device buffer holding the `CUtensorMap` of a bf16 KV pool `[blocks, bs, kvh, d]` as the
/// wgmma prefill attention loads it (`dsc_codegen::kernels::flash_wg_tma_rows`): boxes of 64
/// head-dim columns (128 bytes) x one KV head x `rows` positions of one cache block, in the
/// 128-byte swizzle.
pub fn pool_tensor_map(stream: &Arc<CudaStream>, pool: &CudaSlice<u8>, dims: [usize; 4], rows: u32) -> Result<CudaSlice<u8>> {
    use cudarc::driver::DevicePtr;
    let [nb, bs, kvh, d] = dims;
    if d % 64 != 0 || rows == 0 || rows as usize > bs || bs % rows as usize != 0 || nb * bs * kvh * d * 2 > pool.len() || nb == 0 || kvh == 0 {
        return Err(gerr(format!("tensor map of a [{nb}, {bs}, {kvh}, {d}] bf16 pool in {} bytes with {rows}-row boxes: D must be a multiple of 64, rows divide the block size", pool.len())));
    }
    let (ptr, guard) = pool.device_ptr(stream);
    let gdims = [d as u64, kvh as u64, bs as u64, nb as u64];
    let strides = [(d * 2) as u64, (kvh * d * 2) as u64, (bs * kvh * d * 2) as u64];
    // (`ptr` holds nb·bs·kvh·d bf16 elements: checked above)
    let map = encode_sw128_map(stream, false, ptr, &gdims, &strides, &[64, 1, rows, 1], &format!("a [{nb}, {bs}, {kvh}, {d}] KV pool"));
    drop(guard);
    map
}

/// A device buffer holding the `CUtensorMap` of the 16-bit (`f16`: f16, else bf16) tensor at
/// device address `ptr` with `dims` (innermost first) and byte `strides` (of dims 1..): boxes
/// of `boxd` elements in the 128-byte swizzle, zeros past the edges. The caller checks that
/// the tensor lies in device memory at `ptr`.
fn encode_sw128_map(stream: &Arc<CudaStream>, f16: bool, ptr: u64, dims: &[u64], strides: &[u64], boxd: &[u32], what: &str) -> Result<CudaSlice<u8>> {
    use cudarc::driver::sys;
    let rank = dims.len();
    if rank == 0 || rank > 5 || strides.len() + 1 != rank || boxd.len() != rank {
        return Err(gerr(format!("tensor map of {what}: rank {rank} with {} strides and {} box dims", strides.len(), boxd.len())));
    }
    // SAFETY: a zeroed CUtensorMap is a valid value to be overwritten by the encoder
    let mut map: sys::CUtensorMap = unsafe { std::mem::zeroed() };
    let estr = [1u32; 5];
    let dt = if f16 { sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16 } else { sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 };
    // SAFETY: the pointers are to live slices of the rank's lengths (checked above; `estr`
    // longer); `ptr` is device memory holding the tensor (the caller's check)
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            dt,
            rank as u32,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxd.as_ptr(),
            estr.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    cu(r.result(), &format!("encoding the tensor map of {what}"))?;
    let bytes: Vec<u8> = map.opaque.iter().flat_map(|w| w.to_le_bytes()).collect();
    cu(stream.clone_htod(&bytes), "uploading a tensor map")
}




/// A device buffer holding the `CUtensorMap` of a [n, k] bf16 (or f16) weight at `w`, as the
/// TMA pipelined matmul loads it (`KernelSpec::Tma`): boxes of 64 columns (128 bytes) x `rows`
/// rows in the 128-byte swizzle, zeros past the edges.
pub fn weight_tensor_map(stream: &Arc<CudaStream>, w: &CudaSlice<u8>, n: usize, k: usize, f16: bool, rows: u32) -> Result<CudaSlice<u8>> {
    use cudarc::driver::DevicePtr;
    let (ptr, guard) = w.device_ptr(stream);
    let map = tensor_map_at(stream, ptr, w.len(), n, k, f16, rows);
    drop(guard);
    map
}

/// As [`weight_tensor_map`], of the [n, k] 16-bit matrix at device address `ptr` (`bytes`
/// long): also an activation inside the arena (`{x}@xmap{rows}`, the warp-specialized matmul's x).
pub fn tensor_map_at(stream: &Arc<CudaStream>, ptr: u64, bytes: usize, n: usize, k: usize, f16: bool, rows: u32) -> Result<CudaSlice<u8>> {
    if k % 64 != 0 || rows == 0 || rows > 256 || bytes < n * k * 2 || n == 0 || ptr % 16 != 0 {
        return Err(gerr(format!("tensor map of a [{n}, {k}] matrix in {bytes} bytes with {rows}-row boxes: K must be a multiple of 64, rows 1..=256, the address 16-byte aligned")));
    }
    // (`ptr` holds n·k 16-bit elements: checked above)
    encode_sw128_map(stream, f16, ptr, &[k as u64, n as u64], &[(k * 2) as u64], &[64, rows], &format!("a [{n}, {k}] matrix"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_input_kernel_assembles_for_every_target() {
        // the runtime's own PTX (`dsc_inputs`) goes to the driver's JIT as text: ptxas (the
        // wheel scripts/setup.sh installs; DSC_PTXAS overrides) must take it for each target
        // the plans carry, with its six parameters and no local memory
        let found = std::process::Command::new("python3").args(["-c", "import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], 'cu13', 'bin', 'ptxas'))"]).output().expect("python3 runs");
        let ptxas = std::env::var("DSC_PTXAS").unwrap_or_else(|_| String::from_utf8_lossy(&found.stdout).trim().to_string());
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("inputs.ptx");
        let ptx = inputs_ptx(false);
        std::fs::write(&f, &ptx).unwrap();
        assert!(ptx.contains(".visible .entry dsc_inputs(") && ptx.matches(".param .u").count() == 6);
        for arch in ["sm_80", "sm_90a"] {
            let o = std::process::Command::new(&ptxas).args([&format!("-arch={arch}"), "-v", f.to_str().unwrap(), "-o", "/dev/null"]).output().expect("ptxas runs");
            let log = String::from_utf8_lossy(&o.stderr);
            assert!(o.status.success(), "ptxas rejected dsc_inputs for {arch}:\n{log}");
            assert!(log.contains("dsc_inputs") && log.contains("0 bytes stack frame"), "{arch}: {log}");
        }
    }
}
