//! The kernel generators' unit tests (ptxas and GPU checks are in codegen/tests and the
//! kernel bundle).

use super::*;
use proptest::prelude::*;

#[test]
fn merged_matmul_parts_must_fit_whole_blocks() {
    let gemv = KernelSpec::MatMul { k: 64, n: 24, wdtype: DType::BF16, bias: false, residual: false };
    assert!(parts_fit(&gemv, &[16, 8]).is_ok());
    assert!(parts_fit(&gemv, &[14, 10]).unwrap_err().contains("not a multiple"));
    assert!(parts_fit(&gemv, &[16, 4]).unwrap_err().contains("sum to N"));
    let wg = KernelSpec::MatMulWgmma { k: 64, n: 192, wdtype: DType::BF16, bias: false, residual: false, n_tile: 64 };
    assert!(parts_fit(&wg, &[128, 64]).is_ok() && parts_fit(&wg, &[96, 96]).is_err());
    let res = KernelSpec::MatMul { k: 64, n: 24, wdtype: DType::BF16, bias: false, residual: true };
    assert!(parts_fit(&res, &[16, 8]).unwrap_err().contains("residual"));
    // the wrapper's symbol names the inner kernel and the parts; its MLIR has one weight per part
    let spec = KernelSpec::MatMulParts { inner: Box::new(gemv), parts: vec![16, 8] };
    assert_eq!(spec.symbol(), "matmul_k64_n24_bf16_parts_16_8");
    let text = emit(&spec).unwrap();
    assert!(text.contains("%w0: !llvm.ptr<1>, %w1: !llvm.ptr<1>") && text.contains("%yall: !llvm.ptr<1>") && text.contains("%prows: i64"), "{text}");
}

#[test]
fn fp8_routed_experts_take_whole_super_blocks() {
    // DeepSeek-V3's experts (D 7,168, I 2,048) in f8g128 take the warp-per-output kernels;
    // V2-Lite's I 1,408 is not whole 512-value super-blocks; the grouped tensor-core ones
    // stay 16-bit
    let up = |d, inter, wdtype| KernelSpec::MoeGateUp { d, inter, e: 256, top_k: 8, wdtype, shared: 0, shared_first: false };
    assert!(fits(&up(7168, 2048, DType::F8G128)).is_ok());
    assert!(fits(&KernelSpec::MoeDown { d: 7168, inter: 2048, e: 256, top_k: 8, wdtype: DType::F8G128, residual: true, shared: 0, shared_first: false }).is_ok());
    assert!(fits(&up(2048, 1408, DType::F8G128)).unwrap_err().contains("multiples of 512"));
    assert!(fits(&KernelSpec::MoeGateUpMma { d: 7168, inter: 2048, e: 256, top_k: 8, wdtype: DType::F8G128 }).is_err());
    let text = emit(&up(1024, 512, DType::F8G128)).unwrap();
    assert!(text.contains("vector<2xi32>"), "eight e4m3 values a load");
}

proptest! {
    /// Walking the schedule as the kernels do (unguarded rounds, then rounds guarded by
    /// item < items) reads every item exactly once and nothing past the end, for any K.
    #[test]
    fn split_k_schedule_covers_every_item_once(items in 1usize..6000, wide in any::<bool>(), nw in 1usize..17, unroll in 1usize..9) {
        let chunk = if wide { 32 } else { 1 };
        let (jloop, rounds) = split_k_schedule(items, chunk, nw, unroll);
        prop_assert!(jloop <= rounds && jloop % unroll == 0);
        let mut seen = vec![0u8; items];
        for w in 0..nw {
            for r in 0..rounds {
                for lane in 0..chunk {
                    let item = (w + nw * r) * chunk + lane;
                    if r < jloop {
                        prop_assert!(item < items, "unguarded round {r} reads item {item} of {items}");
                    } else if item >= items {
                        continue;
                    }
                    seen[item] += 1;
                }
            }
        }
        prop_assert!(seen.iter().all(|&c| c == 1));
    }
}
