//! GPU gauges for `/metrics` through NVML (libnvidia-ml, opened at run time; absent on
//! machines without an NVIDIA driver, where nothing is reported).

use crate::metrics::{GpuLabel, Metrics};
use std::os::raw::{c_int, c_uint, c_void};
use std::sync::OnceLock;

type Dev = *mut c_void;

#[repr(C)]
struct Util {
    gpu: c_uint,
    memory: c_uint,
}

#[repr(C)]
struct Mem {
    total: u64,
    free: u64,
    used: u64,
}

struct Nvml {
    _lib: libloading::Library,
    count: unsafe extern "C" fn(*mut c_uint) -> c_int,
    handle: unsafe extern "C" fn(c_uint, *mut Dev) -> c_int,
    util: unsafe extern "C" fn(Dev, *mut Util) -> c_int,
    mem: unsafe extern "C" fn(Dev, *mut Mem) -> c_int,
    temp: unsafe extern "C" fn(Dev, c_int, *mut c_uint) -> c_int,
    ecc: unsafe extern "C" fn(Dev, c_int, c_int, *mut u64) -> c_int,
}

// SAFETY: NVML is thread-safe once initialized; the function pointers are plain C symbols.
unsafe impl Send for Nvml {}
unsafe impl Sync for Nvml {}

fn load() -> Option<Nvml> {
    // SAFETY: opening the driver's NVML library and reading documented C symbols with their
    // documented signatures (nvml.h); nvmlInit_v2 is called before any other function.
    unsafe {
        let lib = libloading::Library::new("libnvidia-ml.so.1").ok()?;
        let init: libloading::Symbol<unsafe extern "C" fn() -> c_int> = lib.get(b"nvmlInit_v2").ok()?;
        if init() != 0 {
            return None;
        }
        let n = Nvml {
            count: *lib.get(b"nvmlDeviceGetCount_v2").ok()?,
            handle: *lib.get(b"nvmlDeviceGetHandleByIndex_v2").ok()?,
            util: *lib.get(b"nvmlDeviceGetUtilizationRates").ok()?,
            mem: *lib.get(b"nvmlDeviceGetMemoryInfo").ok()?,
            temp: *lib.get(b"nvmlDeviceGetTemperature").ok()?,
            ecc: *lib.get(b"nvmlDeviceGetTotalEccErrors").ok()?,
            _lib: lib,
        };
        Some(n)
    }
}

/// Read every GPU's utilization, memory, temperature and uncorrected ECC count into `m`.
pub fn sample(m: &Metrics) {
    static NVML: OnceLock<Option<Nvml>> = OnceLock::new();
    let Some(n) = NVML.get_or_init(load) else { return };
    // SAFETY: NVML initialized in `load`; out-pointers are valid locals.
    unsafe {
        let mut count = 0;
        if (n.count)(&mut count) != 0 {
            return;
        }
        for i in 0..count {
            let mut d: Dev = std::ptr::null_mut();
            if (n.handle)(i, &mut d) != 0 {
                continue;
            }
            let l = GpuLabel { gpu: i.to_string() };
            let mut u = Util { gpu: 0, memory: 0 };
            if (n.util)(d, &mut u) == 0 {
                m.gpu_utilization.get_or_create(&l).set(u.gpu as f64);
            }
            let mut mem = Mem { total: 0, free: 0, used: 0 };
            if (n.mem)(d, &mut mem) == 0 {
                m.gpu_memory_used.get_or_create(&l).set(mem.used as f64);
            }
            let mut t = 0;
            if (n.temp)(d, 0, &mut t) == 0 {
                m.gpu_temperature.get_or_create(&l).set(t as f64);
            }
            // NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1, NVML_VOLATILE_ECC = 0
            let mut e = 0u64;
            if (n.ecc)(d, 1, 0, &mut e) == 0 {
                m.gpu_ecc_errors.get_or_create(&l).set(e as f64);
            }
        }
    }
}
