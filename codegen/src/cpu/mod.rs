//! CPU kernels: the same MLIR → LLVM path as the GPU's, for x86-64.
//!
//! Each family emits `func.func`s on `!llvm.ptr` arguments with the vector, scf and arith
//! dialects ([`matmul`]); [`compile_cpu`] lowers the module to the LLVM dialect
//! ([`CPU_PASS_PIPELINE`]), translates it to LLVM IR, and per [`CpuTarget`] emits an object
//! (O3, position-independent) and links it into a shared library with the system's C compiler
//! driver (`cc -shared`, at compile time only). The plan carries the libraries; the runtime
//! loads the one the CPU can run (`dlopen`, no compiler there) and calls the functions by name.

pub mod amx;
pub mod matmul;

use crate::CodegenError;
use dsc_ir::DType;
use inkwell::targets::{FileType, InitializationConfig, RelocMode, Target as LlvmTarget};
use std::collections::BTreeMap;
use std::sync::Once;

/// Structured cleanups while loops are `scf.for`, then everything to the LLVM dialect. Vector
/// reductions may reassociate (a tree of adds instead of 16 in a row: the sums differ from
/// the reference's order in the last bits, as any blocked dot product's do).
pub const CPU_PASS_PIPELINE: &str = "builtin.module(canonicalize,cse,loop-invariant-code-motion,convert-scf-to-cf,convert-vector-to-llvm{reassociate-fp-reductions=1},convert-arith-to-llvm,convert-cf-to-llvm,convert-func-to-llvm,canonicalize,cse,reconcile-unrealized-casts)";

/// An x86-64 level a library is built for (the psABI micro-architecture levels). The runtime
/// takes the highest one the CPU has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CpuTarget {
    /// AVX2, FMA, F16C (Haswell and later; Zen)
    X86_64V3,
    /// + AVX-512 F/BW/CD/DQ/VL (Skylake-SP and later; Zen 4), 512-bit vectors preferred
    X86_64V4,
    /// v4 + AMX-TILE, AMX-BF16 and AVX512-BF16 (Sapphire Rapids and later): the prefill gemm
    /// on AMX tiles ([`amx`]), the rest as v4's
    X86_64V4Amx,
}

impl CpuTarget {
    pub const ALL: [CpuTarget; 3] = [CpuTarget::X86_64V3, CpuTarget::X86_64V4, CpuTarget::X86_64V4Amx];
    pub fn name(self) -> &'static str {
        match self {
            CpuTarget::X86_64V3 => "x86-64-v3",
            CpuTarget::X86_64V4 => "x86-64-v4",
            CpuTarget::X86_64V4Amx => "x86-64-v4-amx",
        }
    }
    /// The CPU LLVM tunes for (the psABI level; AMX is features on top of v4).
    fn llvm_cpu(self) -> &'static str {
        match self {
            CpuTarget::X86_64V4Amx => "x86-64-v4",
            t => t.name(),
        }
    }
    /// Whether the gemm runs on AMX tiles ([`amx`]) instead of f32 FMAs.
    pub fn amx(self) -> bool {
        self == CpuTarget::X86_64V4Amx
    }
    /// LLVM target features beyond the level's own: on v4 the kernels' 16-lane vectors stay
    /// whole zmm registers (the generic tuning would split them into two ymm).
    fn features(self) -> &'static str {
        match self {
            CpuTarget::X86_64V3 => "",
            CpuTarget::X86_64V4 => "-prefer-256-bit",
            CpuTarget::X86_64V4Amx => "-prefer-256-bit,+amx-tile,+amx-bf16,+avx512bf16",
        }
    }
}

/// The compiled CPU kernels: the functions' dtypes, every stage's text (the f32 kernels', then
/// the AMX gemms'), a library per target.
#[derive(Clone, Debug)]
pub struct CpuModule {
    pub dtypes: Vec<DType>,
    pub mlir: String,
    pub llvm: String,
    pub amx_mlir: String,
    pub amx_llvm: String,
    /// target → the shared library (ELF) exporting every function
    pub libraries: BTreeMap<CpuTarget, Vec<u8>>,
}

/// The MLIR module of the matmul kernels for `dtypes` (each once, in the given order); with
/// `amx`, the gemms on AMX tiles ([`amx::emit_gemm`]).
pub fn module_mlir(dtypes: &[DType], amx: bool) -> String {
    let mut body = String::new();
    let mut seen = vec![];
    for &d in dtypes {
        if !seen.contains(&d) {
            seen.push(d);
            body.push_str(&if amx { format!("{}{}", matmul::emit_gemv(d), amx::emit_gemm(d)) } else { matmul::emit(d) });
        }
    }
    format!("module {{\n{body}}}\n")
}

/// MLIR text → the LLVM dialect → LLVM IR text.
pub fn lower(mlir: &str) -> Result<String, CodegenError> {
    let ctx = crate::pipeline::mlir_context();
    let module = crate::pipeline::parse_and_lower(&ctx, mlir, CPU_PASS_PIPELINE)?;
    crate::pipeline::translate(module.as_operation(), &module.as_operation().to_string())
}

/// LLVM IR text → an object file (or assembly, for reading) for `target` (O3, PIC).
pub fn emit_object(ir: &str, target: CpuTarget, file: FileType) -> Result<Vec<u8>, CodegenError> {
    static INIT: Once = Once::new();
    INIT.call_once(|| LlvmTarget::initialize_x86(&InitializationConfig::default()));
    crate::pipeline::with_optimized(ir, "x86_64-unknown-linux-gnu", target.llvm_cpu(), target.features(), RelocMode::PIC, |tm, module| {
        Ok(tm.write_to_memory_buffer(module, file).map_err(|e| CodegenError::Llvm(e.to_string()))?.as_slice().to_vec())
    })
}

/// Link an object into a shared library with the C compiler driver `cc`.
fn link_shared(object: &[u8], target: CpuTarget, cc: &str) -> Result<Vec<u8>, CodegenError> {
    let dir = tempfile::tempdir().map_err(|e| CodegenError::Llvm(format!("linking the CPU kernels: a temporary directory: {e}")))?;
    let (obj, so) = (dir.path().join("kernels.o"), dir.path().join("kernels.so"));
    std::fs::write(&obj, object).map_err(|e| CodegenError::Llvm(format!("linking the CPU kernels: {}: {e}", obj.display())))?;
    let out = std::process::Command::new(cc)
        .args(["-shared", "-nostdlib", "-Wl,-z,noexecstack", "-o"])
        .arg(&so)
        .arg(&obj)
        .output()
        .map_err(|e| CodegenError::Llvm(format!("linking the CPU kernels ({}) needs a C compiler driver: `{cc}`: {e}", target.name())))?;
    if !out.status.success() {
        return Err(CodegenError::Llvm(format!("linking the CPU kernels ({}): `{cc} -shared` failed: {}", target.name(), String::from_utf8_lossy(&out.stderr))));
    }
    std::fs::read(&so).map_err(|e| CodegenError::Llvm(format!("linking the CPU kernels: {}: {e}", so.display())))
}

/// Generate, lower, and build a shared library per [`CpuTarget`] for the matmul kernels of
/// `dtypes` (those [`matmul::DTYPES`] holds; others are refused by name), linked by the C
/// compiler driver `cc`.
pub fn compile_cpu(dtypes: &[DType], cc: &str) -> Result<CpuModule, CodegenError> {
    if let Some(d) = dtypes.iter().find(|d| !matmul::DTYPES.contains(d)) {
        return Err(CodegenError::Unsupported { kernel: matmul::symbol(*d), msg: format!("no CPU matmul reads {d} weights (it takes {:?})", matmul::DTYPES) });
    }
    let mut ds: Vec<DType> = vec![];
    for &d in dtypes {
        if !ds.contains(&d) {
            ds.push(d);
        }
    }
    let mlir = module_mlir(&ds, false);
    let llvm = lower(&mlir)?;
    let amx_mlir = module_mlir(&ds, true);
    let amx_llvm = lower(&amx_mlir)?;
    let mut libraries = BTreeMap::new();
    for t in CpuTarget::ALL {
        let obj = emit_object(if t.amx() { &amx_llvm } else { &llvm }, t, FileType::Object)?;
        libraries.insert(t, link_shared(&obj, t, cc)?);
    }
    Ok(CpuModule { dtypes: ds, mlir, llvm, amx_mlir, amx_llvm, libraries })
}

#[cfg(test)]
mod tests;
