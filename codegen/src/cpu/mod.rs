//! CPU kernels: the same MLIR → LLVM path as the GPU's, for x86-64.
//!
//! Each family emits `func.func`s on `!llvm.ptr` arguments with the vector, scf and arith
//! dialects ([`matmul`]); [`compile_cpu`] lowers the module to the LLVM dialect
//! ([`CPU_PASS_PIPELINE`]), translates it to LLVM IR, and per [`CpuTarget`] emits an object
//! (O3, position-independent) and links it into a shared library with the system's C compiler
//! driver (`cc -shared`, at compile time only). The plan carries the libraries; the runtime
//! loads the one the CPU can run (`dlopen`, no compiler there) and calls the functions by name.

pub mod matmul;

use crate::CodegenError;
use dsc_ir::DType;
use inkwell::context::Context as LlvmContext;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetTriple};
use inkwell::OptimizationLevel;
use melior::ir::operation::OperationLike;
use melior::ir::Module;
use melior::pass::PassManager;
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
}

impl CpuTarget {
    pub const ALL: [CpuTarget; 2] = [CpuTarget::X86_64V3, CpuTarget::X86_64V4];
    pub fn name(self) -> &'static str {
        match self {
            CpuTarget::X86_64V3 => "x86-64-v3",
            CpuTarget::X86_64V4 => "x86-64-v4",
        }
    }
    /// LLVM target features beyond the level's own: on v4 the kernels' 16-lane vectors stay
    /// whole zmm registers (the generic tuning would split them into two ymm).
    fn features(self) -> &'static str {
        match self {
            CpuTarget::X86_64V3 => "",
            CpuTarget::X86_64V4 => "-prefer-256-bit",
        }
    }
}

/// The compiled CPU kernels: the functions' dtypes, every stage's text, a library per target.
#[derive(Clone, Debug)]
pub struct CpuModule {
    pub dtypes: Vec<DType>,
    pub mlir: String,
    pub llvm: String,
    /// target → the shared library (ELF) exporting every function
    pub libraries: BTreeMap<CpuTarget, Vec<u8>>,
}

/// The MLIR module of the matmul kernels for `dtypes` (each once, in the given order).
pub fn module_mlir(dtypes: &[DType]) -> String {
    let mut body = String::new();
    let mut seen = vec![];
    for &d in dtypes {
        if !seen.contains(&d) {
            seen.push(d);
            body.push_str(&matmul::emit(d));
        }
    }
    format!("module {{\n{body}}}\n")
}

/// MLIR text → the LLVM dialect → LLVM IR text.
pub fn lower(mlir: &str) -> Result<String, CodegenError> {
    let ctx = crate::pipeline::mlir_context();
    let mut module = Module::parse(&ctx, mlir).ok_or_else(|| CodegenError::Mlir { stage: "parse", msg: "the generated CPU MLIR does not parse".into(), mlir: mlir.to_string() })?;
    if !module.as_operation().verify() {
        return Err(CodegenError::Mlir { stage: "verify", msg: "the generated CPU MLIR does not verify".into(), mlir: mlir.to_string() });
    }
    let pm = PassManager::new(&ctx);
    melior::utility::parse_pass_pipeline(pm.as_operation_pass_manager(), CPU_PASS_PIPELINE).map_err(|e| CodegenError::Mlir { stage: "pipeline", msg: e.to_string(), mlir: mlir.to_string() })?;
    pm.run(&mut module).map_err(|e| CodegenError::Mlir { stage: "passes", msg: e.to_string(), mlir: mlir.to_string() })?;
    let llvm = LlvmContext::create();
    // SAFETY: both handles are live for the call; the returned LLVM module belongs to `llvm`,
    // and we print it and dispose of it before `llvm` is dropped.
    unsafe {
        let m = mlir_sys::mlirTranslateModuleToLLVMIR(module.as_operation().to_raw(), llvm.raw() as *mut _);
        if m.is_null() {
            return Err(CodegenError::Mlir { stage: "translate", msg: "translation to LLVM IR failed".into(), mlir: module.as_operation().to_string() });
        }
        let m = m as inkwell::llvm_sys::prelude::LLVMModuleRef;
        let s = inkwell::llvm_sys::core::LLVMPrintModuleToString(m);
        let text = std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned();
        inkwell::llvm_sys::core::LLVMDisposeMessage(s);
        inkwell::llvm_sys::core::LLVMDisposeModule(m);
        Ok(text)
    }
}

/// LLVM IR text → an object file (or assembly, for reading) for `target` (O3, PIC).
pub fn emit_object(ir: &str, target: CpuTarget, file: FileType) -> Result<Vec<u8>, CodegenError> {
    static INIT: Once = Once::new();
    INIT.call_once(|| LlvmTarget::initialize_x86(&InitializationConfig::default()));
    let ctx = LlvmContext::create();
    let buf = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "cpu_kernels");
    let module = ctx.create_module_from_ir(buf).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let triple = TargetTriple::create("x86_64-unknown-linux-gnu");
    module.set_triple(&triple);
    let t = LlvmTarget::from_triple(&triple).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let tm = t
        .create_target_machine(&triple, target.name(), target.features(), OptimizationLevel::Aggressive, RelocMode::PIC, CodeModel::Default)
        .ok_or_else(|| CodegenError::Llvm(format!("no x86-64 target machine for {}", target.name())))?;
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    module.run_passes("default<O3>", &tm, inkwell::passes::PassBuilderOptions::create()).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let out = tm.write_to_memory_buffer(&module, file).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    Ok(out.as_slice().to_vec())
}

/// Link an object into a shared library with the C compiler driver (`$CC`, else `cc`).
fn link_shared(object: &[u8], target: CpuTarget) -> Result<Vec<u8>, CodegenError> {
    let dir = tempfile::tempdir().map_err(|e| CodegenError::Llvm(format!("linking the CPU kernels: a temporary directory: {e}")))?;
    let (obj, so) = (dir.path().join("kernels.o"), dir.path().join("kernels.so"));
    std::fs::write(&obj, object).map_err(|e| CodegenError::Llvm(format!("linking the CPU kernels: {}: {e}", obj.display())))?;
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = std::process::Command::new(&cc)
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
/// `dtypes` (those [`matmul::DTYPES`] holds; others are refused by name).
pub fn compile_cpu(dtypes: &[DType]) -> Result<CpuModule, CodegenError> {
    if let Some(d) = dtypes.iter().find(|d| !matmul::DTYPES.contains(d)) {
        return Err(CodegenError::Unsupported { kernel: matmul::symbol(*d), msg: format!("no CPU matmul reads {d} weights (it takes {:?})", matmul::DTYPES) });
    }
    let mut ds: Vec<DType> = vec![];
    for &d in dtypes {
        if !ds.contains(&d) {
            ds.push(d);
        }
    }
    let mlir = module_mlir(&ds);
    let llvm = lower(&mlir)?;
    let mut libraries = BTreeMap::new();
    for t in CpuTarget::ALL {
        let obj = emit_object(&llvm, t, FileType::Object)?;
        libraries.insert(t, link_shared(&obj, t)?);
    }
    Ok(CpuModule { dtypes: ds, mlir, llvm, libraries })
}

#[cfg(test)]
mod tests;
