//! Kernel generation: MLIR (melior) → LLVM IR → PTX (inkwell's NVPTX backend).
//!
//! [`kernels`] emits each kernel as MLIR text with upstream dialects; [`pipeline`] runs the
//! MLIR passes, translates to LLVM IR and emits PTX per [`GpuTarget`]; [`compile_kernels`]
//! does both for a set of specs and keeps every stage's text for the dumps.

pub mod cpu;
pub mod kernels;
pub mod options;
pub mod pipeline;
pub mod schedule;

pub use kernels::{KernelSpec, Launch};
pub use options::{CodegenOptions, KernelOptions, ScheduleOptions};
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
/// The symbol of every distinct spec among `specs`: its readable name
/// ([`KernelSpec::symbol`]), or, where specs that differ share that name (it leaves out a field
/// such as RMSNorm's eps or the attention's scale), the name and `_h` + a hash of the whole
/// spec for each of them. So a field that changes the code always changes the symbol, and a
/// module without such a clash keeps the plain names.
pub fn kernel_names(specs: &[KernelSpec]) -> BTreeMap<String, KernelSpec> {
    let mut by_base: BTreeMap<String, Vec<&KernelSpec>> = BTreeMap::new();
    for s in specs {
        let v = by_base.entry(s.symbol()).or_default();
        if !v.contains(&s) {
            v.push(s);
        }
    }
    let mut out = BTreeMap::new();
    for (base, v) in by_base {
        if v.len() == 1 {
            out.insert(base, v[0].clone());
        } else {
            for s in v {
                out.insert(format!("{base}_h{:08x}", spec_hash(s)), s.clone());
            }
        }
    }
    out
}

/// A hash of the whole spec that does not change between builds or machines (FNV-1a over its
/// `Debug` text, which names every field).
pub fn spec_hash(s: &KernelSpec) -> u32 {
    fnv1a(format!("{s:?}").as_bytes())
}

/// FNV-1a, 32 bits: a hash that is the same on every machine and build.
pub(crate) fn fnv1a(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in bytes {
        h ^= b as u32;
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

impl CompiledModule {
    /// The symbol `spec` was compiled under ([`kernel_names`]).
    pub fn symbol_of(&self, spec: &KernelSpec) -> Option<&str> {
        self.kernels.iter().find(|(_, s)| s == spec).map(|(n, _)| n.as_str())
    }
}

/// The kernels' bodies are written as `o` says; with options other than the default every
/// symbol carries their hash (`_x` + 8 hex digits), so a kernel's name never stands for two
/// different codes across builds.
pub fn compile_kernels(specs: &[KernelSpec], targets: &[GpuTarget], o: &KernelOptions) -> Result<CompiledModule, CodegenError> {
    let suffix = o.symbol_suffix();
    let seen: BTreeMap<String, KernelSpec> = kernel_names(specs).into_iter().map(|(n, s)| (n + &suffix, s)).collect();
    // sm_90a: every kernel, with the programmatic-dependent-launch prologue; other targets:
    // the kernels they can run, without it
    let mut funcs = vec![];
    let mut common = vec![];
    for (name, s) in &seen {
        let unsupported = |msg| CodegenError::Unsupported { kernel: name.clone(), msg };
        funcs.push(kernels::emit_named(s, true, name, o).map_err(unsupported)?);
        if !s.hopper_only() {
            common.push(kernels::emit_named(s, false, name, o).map_err(|msg| CodegenError::Unsupported { kernel: name.clone(), msg })?);
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
    /// one symbol: now each gets its own kernel and symbol; a module without such a clash keeps
    /// the plain names.
    #[test]
    fn specs_that_differ_only_in_eps_or_scale_get_two_kernels() {
        let a = KernelSpec::RmsNorm { d: 64, eps_bits: 1e-5f32.to_bits() };
        let b = KernelSpec::RmsNorm { d: 64, eps_bits: 1e-6f32.to_bits() };
        assert_eq!(a.symbol(), b.symbol());
        let m = compile_kernels(&[a.clone(), b.clone(), a.clone()], &[GpuTarget::Sm90a], &KernelOptions::default()).unwrap();
        assert_eq!(m.kernels.len(), 2);
        let (na, nb) = (m.symbol_of(&a).unwrap(), m.symbol_of(&b).unwrap());
        assert!(na != nb && na.starts_with("rms_norm_d64_f32_h") && nb.starts_with("rms_norm_d64_f32_h"), "{na} {nb}");
        let ptx = &m.ptx[&GpuTarget::Sm90a];
        assert!(ptx.contains(&format!(".entry {na}(")) && ptx.contains(&format!(".entry {nb}(")));
        // each with its own eps in the code
        for eps in [1e-5f32, 1e-6] {
            assert!(m.mlir.contains(&format!("{:e}", eps)) || m.mlir.contains(&format!("{eps:?}")) || m.mlir.contains(&format!("0x{:08X}", eps.to_bits())), "eps {eps} is not in the MLIR");
        }
        // the same spec twice is one kernel, under its plain name
        let m = compile_kernels(&[a.clone(), a.clone()], &[GpuTarget::Sm90a], &KernelOptions::default()).unwrap();
        assert_eq!((m.kernels.len(), m.symbol_of(&a)), (1, Some("rms_norm_d64_f32")));
        // kernel options other than the default mark every symbol with their hash
        let o = KernelOptions { flash_tree: false, ..Default::default() };
        let m = compile_kernels(&[a.clone()], &[GpuTarget::Sm90a], &o).unwrap();
        assert_eq!(m.symbol_of(&a), Some(format!("rms_norm_d64_f32_x{:08x}", o.hash()).as_str()));
        // attention kernels that differ only in the softmax scale (MLA's YaRN mscale)
        let names = kernel_names(&[attn(0.125), attn(0.1), attn(0.125)]);
        assert_eq!(names.len(), 2);
    }

    fn attn(scale: f32) -> KernelSpec {
        KernelSpec::PagedAttention { h: 8, kvh: 2, d: 64, bs: 16, scale_bits: scale.to_bits(), warps: 16, keys: 4, group: 1, kv: dsc_ir::DType::F32 }
    }
}
