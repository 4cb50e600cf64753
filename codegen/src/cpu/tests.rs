//! The CPU matmul kernels, built and run here: every weight type, both functions, against
//! the weights widened by `dsc_ir::quant::decode` and an f64 dot product.

use super::*;
use rand::{Rng, SeedableRng};

type Kernel = unsafe extern "C" fn(*const f32, *const u8, *mut f32, *mut f32, i64, i64, i64, i64, i64);

fn host_runs(t: CpuTarget) -> bool {
    match t {
        CpuTarget::X86_64V3 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") && is_x86_feature_detected!("f16c"),
        CpuTarget::X86_64V4 => is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl") && is_x86_feature_detected!("avx512dq"),
        CpuTarget::X86_64V4Amx => host_runs(CpuTarget::X86_64V4) && dsc_ir::quant::amx_usable(),
    }
}

#[test]
fn matmul_kernels_match_the_widened_weights_for_every_type_and_target() {
    let module = compile_cpu(&matmul::DTYPES, "cc").expect("the CPU kernels compile and link");
    assert!(module.llvm.contains("dsc_cpu_matmul_q4_1_gemm"), "the LLVM IR has the kernels");
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let n = 40usize;
    let mut ran = 0;
    let mut amx_ran = false;
    for (t, so) in &module.libraries {
        assert!(so.starts_with(b"\x7fELF"), "{}: an ELF shared library", t.name());
        if !host_runs(*t) {
            continue;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{}.so", t.name()));
        std::fs::write(&path, so).unwrap();
        // SAFETY: the library is ours, just built; it has no initializers.
        let lib = unsafe { libloading::Library::new(&path) }.expect("dlopen");
        for &dt in &matmul::DTYPES {
            // (3 and 35 units: 32-element blocks, K-quants' 256-element super-blocks; 35 has
            // whole 16-block chunks of scales and a tail)
            for units in [3, 35] {
                let k = units * matmul::unit_elements(dt);
                let wf: Vec<f32> = (0..n * k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
                let stored = dsc_ir::quant::encode(dt, &wf).unwrap();
                let w = dsc_ir::quant::decode(dt, &stored, n * k).unwrap();
                // (as the runtime prepares it: the CPU layout where the type has one)
                let packed = dsc_ir::quant::cpu_layout(dt, &stored, n, k).unwrap_or(stored);
                // (gemv 1 and 3 rows; gemm 4, 6 and 21 — the AMX library's f32 gemm — and 37,
                // its tiles: two 16-row tiles and a tail)
                for m in [1usize, 3, 4, 6, 21, 37] {
                    let x: Vec<f32> = (0..m * k).map(|_| rng.random_range(-2.0f32..2.0)).collect();
                    for (f, min_m) in [("gemv", 1), ("gemm", 4)] {
                        if m < min_m {
                            continue;
                        }
                        let name = format!("{}_{f}", matmul::symbol(dt));
                        // SAFETY: the signature is the family's (matmul.rs); the buffers below
                        // cover m*k, n*k (packed), m*n floats and the scratch the kernels need.
                        let kern: libloading::Symbol<Kernel> = unsafe { lib.get(name.as_bytes()) }.unwrap_or_else(|e| panic!("{name}: {e}"));
                        let mut y = vec![f32::NAN; m * n];
                        let mut scratch = vec![0f32; dsc_ir::quant::cpu_matmul_scratch(m, k)];
                        // (poisoned: the kernels must not read scratch they did not write)
                        scratch.fill(f32::NAN);
                        // columns 4..40 only (an AMX gemm's 32-column tile and a part one): the kernel
                        // leaves 0..4 alone
                        unsafe { kern(x.as_ptr(), packed.as_ptr(), y.as_mut_ptr(), scratch.as_mut_ptr(), m as i64, k as i64, 4, n as i64, n as i64) };
                        for i in 0..m {
                            for j in 0..n {
                                let got = y[i * n + j];
                                if j < 4 {
                                    assert!(got.is_nan(), "{name} m={m}: column {j} outside n0..n1 was written");
                                    continue;
                                }
                                let want: f64 = (0..k).map(|q| x[i * k + q] as f64 * w[j * k + q] as f64).sum();
                                let scale: f64 = (0..k).map(|q| (x[i * k + q] as f64 * w[j * k + q] as f64).abs()).sum();
                                assert!(((got as f64) - want).abs() <= 1e-5 * scale.max(1e-3), "{} {name} m={m} y[{i},{j}] = {got}, want {want}", t.name());
                            }
                        }
                        ran += 1;
                        amx_ran |= t.amx();
                    }
                }
            }
        }
    }
    assert!(ran > 0, "no library runs on this CPU (it needs AVX2 at least)");
    assert_eq!(amx_ran, dsc_ir::quant::amx_usable(), "the AMX library ran where the CPU has AMX");
}

#[test]
fn the_v4_library_keeps_512_bit_vectors() {
    let llvm = lower(&module_mlir(&[DType::Q4_1], false)).unwrap();
    let asm = String::from_utf8(emit_object(&llvm, CpuTarget::X86_64V4, FileType::Assembly).unwrap()).unwrap();
    assert!(asm.contains("zmm"), "v4 code uses zmm registers");
    let asm3 = String::from_utf8(emit_object(&llvm, CpuTarget::X86_64V3, FileType::Assembly).unwrap()).unwrap();
    assert!(!asm3.contains("zmm") && asm3.contains("ymm"), "v3 code stays on AVX2");
}

#[test]
fn other_weight_types_are_refused_by_name() {
    let e = compile_cpu(&[DType::F8G128], "cc").unwrap_err().to_string();
    assert!(e.contains("f8g128"), "{e}");
}

#[test]
fn the_amx_library_multiplies_on_tiles() {
    let llvm = lower(&module_mlir(&[DType::Q4_1], true)).unwrap();
    let asm = String::from_utf8(emit_object(&llvm, CpuTarget::X86_64V4Amx, FileType::Assembly).unwrap()).unwrap();
    assert!(asm.contains("tdpbf16ps") && asm.contains("ldtilecfg") && asm.contains("tilerelease"), "the AMX gemm configures, multiplies and releases tiles");
}
