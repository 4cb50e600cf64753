//! MLIR text → MLIR passes (melior) → LLVM IR → PTX (inkwell's NVPTX backend, O3).
//!
//! The kernels are `gpu.func`s inside a `gpu.module @kernels`, written with upstream dialects
//! (gpu, arith, scf, llvm; nvvm via inline asm where a PTX instruction is wanted directly).
//! Pass pipeline (TOOLCHAIN.md): on the gpu.module, first the structured passes while loops
//! are still `scf.for` — `canonicalize, cse, loop-invariant-code-motion,
//! scf-for-loop-canonicalization` (fold constants and index math, share common values, hoist
//! what a loop does not change, simplify the loops' iteration arguments) —, then the lowering
//! `convert-scf-to-cf, convert-gpu-to-nvvm, convert-nvvm-to-llvm, canonicalize, cse`, then
//! `reconcile-unrealized-casts`; the gpu.module op itself is translated to LLVM IR (O3).
//! (Measured on the 8B plan: the structured passes change a few kernels' PTX by register
//! renames and one hoisted value — LLVM's O3 already finds most of it —, compile time
//! unchanged at 8 s.)

use crate::CodegenError;
use inkwell::context::Context as LlvmContext;
use inkwell::memory_buffer::MemoryBuffer;
use inkwell::targets::{CodeModel, FileType, InitializationConfig, RelocMode, Target as LlvmTarget, TargetTriple};
use inkwell::OptimizationLevel;
use melior::dialect::DialectRegistry;
use melior::ir::operation::OperationLike;
use melior::ir::{BlockLike, Module};
use melior::pass::PassManager;
use melior::utility::{register_all_dialects, register_all_llvm_translations, register_all_passes};
use melior::Context;
use std::sync::Once;

pub const PASS_PIPELINE: &str = "builtin.module(gpu.module(canonicalize,cse,loop-invariant-code-motion,scf-for-loop-canonicalization,convert-scf-to-cf,convert-gpu-to-nvvm,convert-nvvm-to-llvm,canonicalize,cse),reconcile-unrealized-casts)";

/// A GPU architecture we emit PTX for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuTarget {
    /// Hopper (H100/H200), with the arch-specific features (wgmma, setmaxnreg)
    Sm90a,
    /// Ampere (A100)
    Sm80,
}

impl GpuTarget {
    pub const ALL: [GpuTarget; 2] = [GpuTarget::Sm90a, GpuTarget::Sm80];
    pub fn name(self) -> &'static str {
        match self {
            GpuTarget::Sm90a => "sm_90a",
            GpuTarget::Sm80 => "sm_80",
        }
    }
}

pub(crate) fn mlir_context() -> Context {
    static PASSES: Once = Once::new();
    PASSES.call_once(register_all_passes);
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let ctx = Context::new();
    ctx.append_dialect_registry(&registry);
    ctx.load_all_available_dialects();
    register_all_llvm_translations(&ctx);
    ctx
}

/// Parse and verify MLIR text, then run `pipeline` on it: the lowered module.
pub(crate) fn parse_and_lower<'c>(ctx: &'c Context, mlir: &str, pipeline: &str) -> Result<Module<'c>, CodegenError> {
    let mut module = Module::parse(ctx, mlir).ok_or_else(|| CodegenError::Mlir { stage: "parse", msg: "the generated MLIR does not parse".into(), mlir: mlir.to_string() })?;
    if !module.as_operation().verify() {
        return Err(CodegenError::Mlir { stage: "verify", msg: "the generated MLIR does not verify".into(), mlir: mlir.to_string() });
    }
    let pm = PassManager::new(ctx);
    melior::utility::parse_pass_pipeline(pm.as_operation_pass_manager(), pipeline).map_err(|e| CodegenError::Mlir { stage: "pipeline", msg: e.to_string(), mlir: mlir.to_string() })?;
    pm.run(&mut module).map_err(|e| CodegenError::Mlir { stage: "passes", msg: e.to_string(), mlir: mlir.to_string() })?;
    Ok(module)
}

/// An op in the LLVM dialect (a module, or a gpu.module) → LLVM IR text; `lowered` is the
/// module's text, for the error.
pub(crate) fn translate(op: melior::ir::OperationRef, lowered: &str) -> Result<String, CodegenError> {
    let llvm = LlvmContext::create();
    // SAFETY: both handles are live for the call; the returned LLVM module belongs to `llvm`,
    // and we print it and dispose of it before `llvm` is dropped.
    unsafe {
        let m = mlir_sys::mlirTranslateModuleToLLVMIR(op.to_raw(), llvm.raw() as *mut _);
        if m.is_null() {
            return Err(CodegenError::Mlir { stage: "translate", msg: "translation to LLVM IR failed".into(), mlir: lowered.to_string() });
        }
        let m = m as inkwell::llvm_sys::prelude::LLVMModuleRef;
        let s = inkwell::llvm_sys::core::LLVMPrintModuleToString(m);
        let text = std::ffi::CStr::from_ptr(s).to_string_lossy().into_owned();
        inkwell::llvm_sys::core::LLVMDisposeMessage(s);
        inkwell::llvm_sys::core::LLVMDisposeModule(m);
        Ok(text)
    }
}

/// Run the MLIR pass pipeline; returns the lowered module's text (the `mlir` dump stage).
/// Then translate to LLVM IR text (the `llvm` stage).
pub fn mlir_to_llvm_ir(mlir: &str) -> Result<(String, String), CodegenError> {
    let ctx = mlir_context();
    let module = parse_and_lower(&ctx, mlir, PASS_PIPELINE)?;
    let lowered = module.as_operation().to_string();
    // the gpu.module is the first op of the top-level module's body
    let body = module.body();
    let gpu_mod = body.first_operation().ok_or_else(|| CodegenError::Mlir { stage: "translate", msg: "empty module".into(), mlir: lowered.clone() })?;
    let text = translate(gpu_mod, &lowered)?;
    Ok((lowered, text))
}

/// LLVM IR text → `emit(target machine, module)` after O3 on a target machine for `triple`,
/// `cpu` and `features` (the module given the triple and the machine's data layout).
pub(crate) fn with_optimized<T>(
    ir: &str,
    triple: &str,
    cpu: &str,
    features: &str,
    reloc: RelocMode,
    emit: impl FnOnce(&inkwell::targets::TargetMachine, &inkwell::module::Module) -> Result<T, CodegenError>,
) -> Result<T, CodegenError> {
    let ctx = LlvmContext::create();
    let buf = MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "kernels");
    let module = ctx.create_module_from_ir(buf).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let triple = TargetTriple::create(triple);
    module.set_triple(&triple);
    let t = LlvmTarget::from_triple(&triple).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    let tm = t.create_target_machine(&triple, cpu, features, OptimizationLevel::Aggressive, reloc, CodeModel::Default).ok_or_else(|| CodegenError::Llvm(format!("no target machine for {cpu}")))?;
    module.set_data_layout(&tm.get_target_data().get_data_layout());
    module.run_passes("default<O3>", &tm, inkwell::passes::PassBuilderOptions::create()).map_err(|e| CodegenError::Llvm(e.to_string()))?;
    emit(&tm, &module)
}

/// The PTX ISA the module asks for: 8.0, or 8.1 where its inline PTX has a vector reduction
/// (`red.global.add.v4.f32`, PTX 8.1+; the H200's driver takes up to 9.0).
fn ptx_features(ir: &str) -> &'static str {
    if ir.contains("red.global.add.v4.f32") {
        "+ptx81"
    } else {
        "+ptx80"
    }
}

/// LLVM IR text → PTX for `target` (NVPTX backend, O3, PTX ISA 8.0 or 8.1,
/// [`ptx_features`]: the H200's CUDA 13.0 driver accepts up to 9.0).
pub fn llvm_ir_to_ptx(ir: &str, target: GpuTarget) -> Result<String, CodegenError> {
    static INIT: Once = Once::new();
    INIT.call_once(|| LlvmTarget::initialize_nvptx(&InitializationConfig::default()));
    with_optimized(ir, "nvptx64-nvidia-cuda", target.name(), ptx_features(ir), RelocMode::Default, |tm, module| {
        let buf = tm.write_to_memory_buffer(module, FileType::Assembly).map_err(|e| CodegenError::Llvm(e.to_string()))?;
        Ok(String::from_utf8_lossy(buf.as_slice()).trim_end_matches('\0').to_string())
    })
}
