# The FP8 GEMM peer (torch._scaled_mm, cuBLASLt) at the shapes dsc's FP8 GEMM is measured on:
# per-tensor scales (the fastest cuBLAS path) and row-wise scales (a scale per row of A and per
# column of B: the closest cuBLAS offers to dsc's 1x128 activation and f8g128 weight groups).
# Prints TFLOP/s per shape; JSON to $OUT/fp8_gemm_peer.json.
import json, os, sys, torch
out = os.environ.get("OUT", "/tmp")
shapes = [(int(a), int(b), int(c)) for a, b, c in (s.split("x") for s in (sys.argv[1:] or ["4096x4096x4096", "8192x8192x8192", "4096x28672x4096", "4096x4096x14336", "512x28672x4096", "512x4096x14336"]))]
def bench(fn, n=30):
    for _ in range(5): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(n):
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return ts[len(ts) // 2] / 1e3
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": []}
for M, N, K in shapes:
    a = torch.randn(M, K, device="cuda").to(torch.float8_e4m3fn); b = torch.randn(N, K, device="cuda").to(torch.float8_e4m3fn)
    one = torch.tensor(1.0, device="cuda")
    r = {"m": M, "n": N, "k": K}
    t = bench(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)); r["per_tensor_tflop_s"] = round(2 * M * N * K / t / 1e12, 1)
    try:
        sa = torch.rand(M, 1, device="cuda"); sb = torch.rand(1, N, device="cuda")
        t = bench(lambda: torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16)); r["rowwise_tflop_s"] = round(2 * M * N * K / t / 1e12, 1)
    except Exception as ex: r["rowwise_error"] = repr(ex)[:160]
    a16 = torch.randn(M, K, device="cuda", dtype=torch.bfloat16); b16 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
    t = bench(lambda: a16 @ b16.t()); r["bf16_tflop_s"] = round(2 * M * N * K / t / 1e12, 1)
    print(f"torch {M}x{N}x{K}: fp8 per-tensor {r['per_tensor_tflop_s']} rowwise {r.get('rowwise_tflop_s')} bf16 {r['bf16_tflop_s']} TFLOP/s", flush=True)
    res["shapes"].append(r)
json.dump(res, open(os.path.join(out, "fp8_gemm_peer.json"), "w"), indent=1)
