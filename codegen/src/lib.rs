//! Kernel generation: MLIR (melior) → LLVM IR → PTX (inkwell's NVPTX backend).
//!
//! [`kernels`] emits each kernel as MLIR text with upstream dialects; [`pipeline`] runs the
//! MLIR passes, translates to LLVM IR and emits PTX per [`GpuTarget`]; [`compile_kernels`]
//! does both for a set of specs and keeps every stage's text for the dumps.

pub mod kernels;
pub mod lower;
pub mod pipeline;

pub use kernels::{KernelSpec, Launch};
pub use pipeline::GpuTarget;
use std::collections::BTreeMap;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum CodegenError {
    #[error("kernel `{kernel}`: {msg}")]
    Unsupported { kernel: String, msg: String },
    #[error("MLIR {stage}: {msg}\n--- MLIR ---\n{mlir}")]
    Mlir { stage: &'static str, msg: String, mlir: String },
    #[error("LLVM: {0}")]
    Llvm(String),
}

/// One compiled module: the kernels' specs and every stage's text.
#[derive(Clone, Debug)]
pub struct CompiledModule {
    pub kernels: Vec<(String, KernelSpec)>,
    pub mlir: String,
    pub lowered: String,
    pub llvm: String,
    pub ptx: BTreeMap<GpuTarget, String>,
}

/// Generate, lower and emit PTX for `specs` (deduplicated: the kernel cache). Kernels only
/// sm_90a runs (`KernelSpec::hopper_only`) go into that target's module alone; the dumps show
/// the module with every kernel.
pub fn compile_kernels(specs: &[KernelSpec], targets: &[GpuTarget]) -> Result<CompiledModule, CodegenError> {
    let mut seen: BTreeMap<String, KernelSpec> = BTreeMap::new();
    for s in specs {
        match seen.get(&s.symbol()) {
            // two kernels under one name would run the first one's code for both (the
            // symbol leaves out, e.g., RMSNorm's eps and the attention's scale): refuse
            // until symbols come from the whole spec (issue 31)
            Some(other) if other != s => {
                return Err(CodegenError::Unsupported {
                    kernel: s.symbol(),
                    msg: format!("two different kernels share this symbol ({other:?} and {s:?}); KernelSpec::symbol must name every field that changes the code"),
                })
            }
            Some(_) => {}
            None => {
                seen.insert(s.symbol(), s.clone());
            }
        }
    }
    // sm_90a: every kernel, with the programmatic-dependent-launch prologue; other targets:
    // the kernels they can run, without it
    let mut funcs = vec![];
    let mut common = vec![];
    for (name, s) in &seen {
        let unsupported = |msg| CodegenError::Unsupported { kernel: name.clone(), msg };
        funcs.push(kernels::emit_for(s, true).map_err(unsupported)?);
        if !s.hopper_only() {
            common.push(kernels::emit_for(s, false).map_err(|msg| CodegenError::Unsupported { kernel: name.clone(), msg })?);
        }
    }
    let mlir = kernels::module(&funcs);
    let (lowered, llvm) = pipeline::mlir_to_llvm_ir(&mlir)?;
    let others = targets.iter().any(|&t| t != GpuTarget::Sm90a);
    let common_llvm = if others { Some(pipeline::mlir_to_llvm_ir(&kernels::module(&common))?.1) } else { None };
    let mut ptx = BTreeMap::new();
    for &t in targets {
        let ir = match (&common_llvm, t) {
            (Some(c), t) if t != GpuTarget::Sm90a => c,
            _ => &llvm,
        };
        ptx.insert(t, pipeline::llvm_ir_to_ptx(ir, t)?);
    }
    Ok(CompiledModule { kernels: seen.into_iter().collect(), mlir, lowered, llvm, ptx })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two norms that differ only in eps used to share one kernel (the first one's eps) under
    /// one symbol: now a clear error until symbols come from the whole spec (issue 31).
    #[test]
    fn two_kernels_under_one_symbol_are_refused() {
        let a = KernelSpec::RmsNorm { d: 64, eps_bits: 1e-5f32.to_bits() };
        let b = KernelSpec::RmsNorm { d: 64, eps_bits: 1e-6f32.to_bits() };
        assert_eq!(a.symbol(), b.symbol());
        let e = compile_kernels(&[a.clone(), b], &[GpuTarget::Sm90a]).err().expect("refused").to_string();
        assert!(e.contains("share this symbol") && e.contains("rms_norm_d64"), "{e}");
        // the same spec twice is one kernel
        let m = compile_kernels(&[a.clone(), a], &[GpuTarget::Sm90a]).unwrap();
        assert_eq!(m.kernels.len(), 1);
    }
}
