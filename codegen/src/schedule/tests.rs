//! The schedule's tests, each on explicit options (never the process environment).

use super::*;

/// The production options without the warp-specialized matmuls and without the norm folded
/// into the GEMVs (what most tests here look at in isolation)
fn no_ws() -> ScheduleOptions {
    ScheduleOptions { ws: false, ws64: false, norm_fusion: false, ..Default::default() }
}
use dsc_ir::text;

fn graph(extra_user: bool, wdtype: &str) -> Graph {
    let extra = if extra_user { "  %z = add(%xn, %x) : f32[T, 64]\n  output z = %z\n" } else { "" };
    let src = format!(
        "graph \"t\" {{\n  %x = input : f32[T, 64]\n  %g = weight : f32[64]\n  %wq = weight : {wdtype}[32, 64]\n  %wk = weight : {wdtype}[32, 64]\n  %xn = rms_norm(%x, %g) {{eps = 1e-5}} : f32[T, 64]\n  %qk = matmul_cat(%xn, %wq, %wk) : f32[T, 64]\n  %q = slice(%qk) {{axis = 1, start = 0, len = 32}} : f32[T, 32]\n  %k = slice(%qk) {{axis = 1, start = 32, len = 32}} : f32[T, 32]\n  %y = mul(%q, %k) : f32[T, 32]\n  output y = %y\n{extra}}}\n"
    );
    text::parse(&src).unwrap()
}

#[test]
fn rms_norm_folds_into_the_decode_gemv_and_runs_only_for_more_rows() {
    // (x in f32 for every batched GEMV: no cast steps)
    let folding = ScheduleOptions { norm_fusion: true, few_x16: false, split_kv: false, split_k: None, norm_half: false, silu_half: false, tma: Tma::Off, rope_attention: false, ..no_ws() };
    let steps = lower_opts(&graph(false, "bf16"), folding).unwrap();
    // off (the default): the norm runs as its own kernel
    let plain = lower_opts(&graph(false, "bf16"), ScheduleOptions { norm_fusion: false, ..folding }).unwrap();
    assert!(plain.iter().all(|s| s.min_rows.is_none() && !matches!(s.kernel, Some(KernelSpec::NormMatMul { .. }))));
    let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
    assert_eq!(by("xn").min_rows, Some(2));
    let mm = by("qk");
    assert!(matches!(mm.kernel, Some(KernelSpec::NormMatMul { .. })), "{:?}", mm.kernel);
    assert_eq!(mm.args, ["x", "g", "wq", "wk", "qk"]);
    // the batched and tensor-core kernels read the norm's output
    for l in mm.large.iter().chain(&mm.few).chain(&mm.hopper_small) {
        assert_eq!(l.args.as_deref(), Some(&["xn".to_string(), "wq".into(), "wk".into(), "qk".into()][..]));
    }
    // the parts are views at rows x offset
    assert_eq!(by("k").alias_offset, Some(Scalar::RowsTimes("qk".into(), 32)));
}

#[test]
fn q4_1_one_row_gemvs_take_the_norm_prologue() {
    // (the decode GEMV dequantizes Q4_1 in its units: the RMSNorm folds in as for bf16)
    let folding = ScheduleOptions { norm_fusion: true, few_x16: false, split_kv: false, split_k: None, norm_half: false, silu_half: false, tma: Tma::Off, rope_attention: false, ..no_ws() };
    let steps = lower_opts(&graph(false, "q4_1"), folding).unwrap();
    let mm = steps.iter().find(|s| s.node == "qk").unwrap();
    let Some(KernelSpec::NormMatMul { inner, .. }) = &mm.kernel else { panic!("{:?}", mm.kernel) };
    assert!(matches!(inner.as_ref(), KernelSpec::MatMulParts { inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMul { wdtype: DType::Q4_1, .. })), "{inner:?}");
    assert_eq!(steps.iter().find(|s| s.node == "xn").unwrap().min_rows, Some(2));
}

#[test]
fn one_token_steps_run_rope_and_the_cache_writes_inside_the_attention() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 32]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %wq = weight : bf16[32, 32]\n  %wk = weight : bf16[16, 32]\n  %wv = weight : bf16[16, 32]\n  %kc = state : f32[4, 4, 2, 8]\n  %vc = state : f32[4, 4, 2, 8]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 64]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %k = slice(%qkv) {axis = 1, start = 32, len = 16} : f32[T, 16]\n  %v = slice(%qkv) {axis = 1, start = 48, len = 16} : f32[T, 16]\n  %qh = reshape(%q) : f32[T, 4, 8]\n  %kh = reshape(%k) : f32[T, 2, 8]\n  %vh = reshape(%v) : f32[T, 2, 8]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[T, 4, 8]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[4, 4, 2, 8]\n  %vw = cache_write(%vc, %vh, %slots) : f32[4, 4, 2, 8]\n  %o = paged_attention(%qr, %kw, %vw, %pos, %seq, %table) {scale = 0.35} : f32[T, 4, 8]\n  output o = %o\n}\n";
    let g = text::parse(src).unwrap();
    let plain = lower_opts(&g, ScheduleOptions { rope_attention: false, ..no_ws() }).unwrap();
    assert!(plain.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::RopeAttention { .. }))));
    let steps = lower_opts(&g, no_ws()).unwrap();
    // one token (rows = H = 4): the fused kernel, reading q/k/v before RoPE and the slots
    let fused: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::RopeAttention { .. }))).collect();
    let [f] = &fused[..] else { panic!("{fused:?}") };
    assert_eq!((f.node.as_str(), f.max_rows, f.max_context), ("o", Some(4), Some(ATTN_SPLIT_FROM_KEYS - 1)));
    assert_eq!(f.args, ["qh", "kh", "vh", "pos", "slots", "kw", "vw", "seq", "table", "o"]);
    assert!(f.few.is_empty() && f.large.is_none());
    // more tokens: the one-pass kernel as before, from 2 tokens
    assert!(steps.iter().any(|s| s.node == "o" && matches!(s.kernel, Some(KernelSpec::PagedAttention { .. })) && s.min_rows == Some(5) && s.max_context == f.max_context));
    // the Q/K/V RoPE + cache-write kernel from 2 tokens, and for one token where the split
    // attention takes the context; nowhere else
    let qkv: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))).collect();
    assert_eq!(qkv.len(), 2, "{qkv:?}");
    assert!(qkv.iter().all(|s| s.node == "qr" && s.alias_of.is_none()));
    assert_eq!((qkv[0].min_rows, qkv[0].max_rows, qkv[0].min_context), (Some(5), None, None));
    assert_eq!((qkv[1].min_rows, qkv[1].max_rows, qkv[1].min_context), (None, Some(4), Some(ATTN_SPLIT_FROM_KEYS)));
    // ... ahead of every attention step reading what it writes
    let first_attn = steps.iter().position(|s| s.node.starts_with('o') && s.kernel.is_some()).unwrap();
    assert!(steps.iter().position(|s| s.node == "qr" && s.kernel.is_some()).unwrap() < first_attn);
}

#[test]
fn one_token_steps_fold_the_o_projection_into_the_rope_attention_when_asked() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 32]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %wq = weight : bf16[32, 32]\n  %wk = weight : bf16[16, 32]\n  %wv = weight : bf16[16, 32]\n  %wo = weight : bf16[24, 32]\n  %kc = state : bf16[4, 4, 2, 8]\n  %vc = state : bf16[4, 4, 2, 8]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 64]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %k = slice(%qkv) {axis = 1, start = 32, len = 16} : f32[T, 16]\n  %v = slice(%qkv) {axis = 1, start = 48, len = 16} : f32[T, 16]\n  %qh = reshape(%q) : f32[T, 4, 8]\n  %kh = reshape(%k) : f32[T, 2, 8]\n  %vh = reshape(%v) : f32[T, 2, 8]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[T, 4, 8]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : bf16[4, 4, 2, 8]\n  %vw = cache_write(%vc, %vh, %slots) : bf16[4, 4, 2, 8]\n  %o = paged_attention(%qr, %kw, %vw, %pos, %seq, %table) {scale = 0.35} : f32[T, 4, 8]\n  %of = reshape(%o) : f32[T, 32]\n  %r = input : f32[T, 24]\n  %y = matmul_add(%of, %wo, %r) {transpose_b = true} : f32[T, 24]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let plain = lower_opts(&g, no_ws()).unwrap();
    assert!(plain.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::AttentionO { .. }))));
    let steps = lower_opts(&g, ScheduleOptions { attn_o: true, ..no_ws() }).unwrap();
    let fused: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::AttentionO { .. }))).collect();
    let [f] = &fused[..] else { panic!("{fused:?}") };
    assert!(matches!(&f.kernel, Some(KernelSpec::AttentionO { inner, n: 24, red: false, .. }) if matches!(inner.as_ref(), KernelSpec::RopeAttention { .. })));
    assert_eq!((f.node.as_str(), f.max_rows, f.max_context), ("o", Some(4), Some(ATTN_SPLIT_FROM_KEYS - 1)));
    assert_eq!(f.args, ["qh", "kh", "vh", "pos", "slots", "kw", "vw", "seq", "table", "wo", "r", "y@splitk4", "y@sync", "y"]);
    // (the partial sums declared before it)
    let at = |n: &str, k: bool| steps.iter().position(|s| s.node == n && s.kernel.is_some() == k).unwrap();
    assert!(at("y@splitk4", false) < at("o", true));
    // the o projection: from 2 tokens, and for one at the split attention's contexts
    let mm: Vec<&Step> = steps.iter().filter(|s| s.node == "y" && matches!(s.kernel, Some(KernelSpec::MatMul { .. }))).collect();
    assert_eq!(mm.len(), 2, "{mm:?}");
    assert_eq!((mm[0].min_rows, mm[0].max_rows, mm[0].min_context), (Some(2), None, None));
    assert_eq!((mm[1].min_rows, mm[1].max_rows, mm[1].min_context), (None, Some(1), Some(ATTN_SPLIT_FROM_KEYS)));
    assert!(mm.iter().all(|s| s.args == ["of", "wo", "r", "y"]));
}

#[test]
fn rope_q_rope_cache_k_and_cache_v_run_as_one_kernel_at_the_last_of_their_steps() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 32]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %wq = weight : bf16[32, 32]\n  %wk = weight : bf16[16, 32]\n  %wv = weight : bf16[16, 32]\n  %kc = state : f32[4, 4, 2, 8]\n  %vc = state : f32[4, 4, 2, 8]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 64]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %k = slice(%qkv) {axis = 1, start = 32, len = 16} : f32[T, 16]\n  %v = slice(%qkv) {axis = 1, start = 48, len = 16} : f32[T, 16]\n  %qh = reshape(%q) : f32[T, 4, 8]\n  %kh = reshape(%k) : f32[T, 2, 8]\n  %vh = reshape(%v) : f32[T, 2, 8]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[T, 4, 8]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[4, 4, 2, 8]\n  %vw = cache_write(%vc, %vh, %slots) : f32[4, 4, 2, 8]\n  output q = %qr\n  output k = %kw\n  output v = %vw\n}\n";
    let steps = lower_opts(&text::parse(src).unwrap(), ScheduleOptions { norm_fusion: false, ..Default::default() }).unwrap();
    let idx = |n: &str| steps.iter().position(|s| s.node == n).unwrap();
    let host = idx("qr").max(idx("kw")).max(idx("vw"));
    let fused: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))).collect();
    assert_eq!(fused.len(), 1);
    assert_eq!(fused[0].node, steps[host].node);
    assert!(matches!(fused[0].kernel, Some(KernelSpec::QkvRopeCache { h: 4, kvh: 2, d: 8, interleaved: false, .. })));
    assert_eq!(fused[0].args, ["qh", "kh", "vh", "pos", "slots", "kc", "vc", "qr"]);
    for n in ["qr", "kw", "vw"] {
        assert!(steps[idx(n)].kernel.is_none() || idx(n) == host, "{n}");
    }
    // the pools stay aliased, the rotated q keeps its own buffer
    assert_eq!(steps[idx("kw")].alias_of.as_deref(), Some("kc"));
    assert_eq!(steps[idx("qr")].alias_of, None);
    // another reader of k's slice: no fusion
    let other = src.replace("  output q = %qr\n", "  %k2 = neg(%k) : f32[T, 16]\n  output q = %qr\n  output k2 = %k2\n");
    let steps = lower_opts(&text::parse(&other).unwrap(), ScheduleOptions { norm_fusion: false, ..Default::default() }).unwrap();
    assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))));
}

#[test]
fn prefill_matmuls_read_a_16_bit_copy_of_x_made_once_before_the_first_of_them() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %wa = weight : bf16[128, 64]\n  %wb = weight : bf16[256, 64]\n  %wc = weight : f32[128, 64]\n  %a = matmul(%x, %wa) {transpose_b = true} : f32[T, 128]\n  %b = matmul(%x, %wb) {transpose_b = true} : f32[T, 256]\n  %c = matmul(%x, %wc) {transpose_b = true} : f32[T, 128]\n  output a = %a\n  output b = %b\n  output c = %c\n}\n";
    // (the batched GEMVs on f32 x: only the prefill matmuls read the copy)
    let steps = lower_opts(&text::parse(src).unwrap(), ScheduleOptions { few_x16: false, tma: Tma::Off, ..no_ws() }).unwrap();
    let casts: Vec<usize> = steps.iter().enumerate().filter(|(_, s)| matches!(s.kernel, Some(KernelSpec::ToHalf { f16: false }))).map(|(i, _)| i).collect();
    assert_eq!(casts.len(), 1, "one cast for the two bf16 matmuls");
    let cast = &steps[casts[0]];
    // from the pipelined matmul's rows: its 64-row tiles from 48 for these few columns
    assert_eq!((cast.node.as_str(), cast.args.as_slice(), cast.min_rows), ("x@bf16", &["x".to_string(), "x@bf16".to_string()][..], Some(48)));
    assert_eq!(cast.work, Scalar::RowsTimes("x".into(), 8));
    let at = |n: &str| steps.iter().position(|s| s.node == n).unwrap();
    assert!(casts[0] < at("a") && casts[0] < at("b"));
    for n in ["a", "b"] {
        let h = steps[at(n)].hopper.last().unwrap();
        assert!(matches!(h.kernel, KernelSpec::MatMulPipe { a16: true, .. }), "{n}: {:?}", h.kernel);
        assert_eq!(h.args.as_ref().unwrap()[0], "x@bf16");
        assert_eq!(h.min_rows, 64);
        // decode and batched decode keep reading the f32 x
        assert_eq!(steps[at(n)].args[0], "x");
    }
    // f32 weights: the wgmma kernel on the f32 x, no cast
    let c = steps[at("c")].hopper.last().unwrap();
    assert!(matches!(c.kernel, KernelSpec::MatMulWgmma { .. }) && c.args.is_none());
}

#[test]
fn batched_decode_reads_the_16_bit_copy_when_asked_and_one_cast_serves_both() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %wa = weight : bf16[128, 64]\n  %wb = weight : bf16[256, 64]\n  %a = matmul(%x, %wa) {transpose_b = true} : f32[T, 128]\n  %b = matmul(%x, %wb) {transpose_b = true} : f32[T, 256]\n  output a = %a\n  output b = %b\n}\n";
    let g = text::parse(src).unwrap();
    let plain = lower_opts(&g, ScheduleOptions { few_x16: false, tma: Tma::Off, ..no_ws() }).unwrap();
    assert!(plain.iter().all(|s| s.few.iter().all(|l| !matches!(l.kernel, KernelSpec::MatMulFewX16 { .. }))));
    let steps = lower_opts(&g, ScheduleOptions { few_x16: true, ..no_ws() }).unwrap();
    let casts: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))).collect();
    assert_eq!(casts.len(), 1);
    assert_eq!(casts[0].min_rows, Some(16), "the cast runs from the 16-bit batched GEMV's rows");
    for n in ["a", "b"] {
        let s = steps.iter().find(|s| s.node == n).unwrap();
        // f32 x for 2..=15 rows, the 16-bit copy from 16
        let [f32x, x16] = &s.few[..] else { panic!("{:?}", s.few) };
        assert!(matches!(f32x.kernel, KernelSpec::MatMulFew { .. }) && (f32x.min_rows, f32x.max_rows) == (2, Some(15)));
        assert!(f32x.args.is_none());
        assert!(matches!(x16.kernel, KernelSpec::MatMulFewX16 { .. }) && x16.min_rows == 16);
        assert_eq!(x16.args.as_ref().unwrap()[0], "x@bf16");
        assert_eq!(s.hopper.last().unwrap().args.as_ref().unwrap()[0], "x@bf16");
        assert_eq!(s.args[0], "x");
    }
}

#[test]
fn packed_decode_runs_the_tensor_core_gemv_at_every_decode_row_count() {
    for wdtype in [DType::I4G128, DType::F8G128] {
        packed_decode_schedule(wdtype);
    }
}

fn packed_decode_schedule(wdtype: DType) {
    // one row: x staged in shared memory (t0); 2..8 rows one 8-row tile; 9..few_max 16 rows
    // a block over 64 outputs; prefill the wgmma matmul; K past the staging limit: t1 at one row
    for (k, one) in [(1024usize, 0usize), (crate::kernels::PACKED_ONE_ROW_MAX_K + 512, 1)] {
        let src = format!("graph \"t\" {{\n  %x = input : f32[T, {k}]\n  %w = weight : {wdtype}[128, {k}]\n  %a = matmul(%x, %w) {{transpose_b = true}} : f32[T, 128]\n  output a = %a\n}}\n");
        let g = text::parse(&src).unwrap();
        let steps = lower_opts(&g, no_ws()).unwrap();
        let s = steps.iter().find(|s| s.node == "a").unwrap();
        assert_eq!(s.kernel, Some(KernelSpec::MatMulPacked { wdtype, k, n: 128, tiles: one, walk: 1, bias: false, residual: false }));
        assert_eq!(s.scalars.len(), 2, "rows and N");
        let [t1, t2] = &s.few[..] else { panic!("{:?}", s.few) };
        assert!(matches!(t1.kernel, KernelSpec::MatMulPacked { tiles: 1, .. }) && (t1.min_rows, t1.max_rows) == (2, Some(8)));
        assert!(matches!(t2.kernel, KernelSpec::MatMulPacked { tiles: 2, .. }) && (t2.min_rows, t2.max_rows) == (9, Some(128)));
        assert_eq!(t2.kernel.launch(), crate::kernels::Launch::OutputsPerBlock { outputs: 64, rows: 16, warps: 8 });
        let [h] = &s.hopper[..] else { panic!("{:?}", s.hopper) };
        assert!(matches!(h.kernel, KernelSpec::MatMulWgmma { wdtype: w, n_tile: 64, .. } if w == wdtype) && h.min_rows == 129, "{h:?}");
        assert!(crate::kernels::fits(s.kernel.as_ref().unwrap()).is_ok());
    }
    // an RMSNorm whose users are packed GEMVs folds into the one-row kernel's staging of x
    let src = format!("graph \"t\" {{\n  %x = input : f32[T, 1024]\n  %g = weight : f32[1024]\n  %n = rms_norm(%x, %g) {{eps = 0.00001}} : f32[T, 1024]\n  %w = weight : {wdtype}[128, 1024]\n  %a = matmul(%n, %w) {{transpose_b = true}} : f32[T, 128]\n  output a = %a\n}}\n");
    let steps = lower_opts(&text::parse(&src).unwrap(), ScheduleOptions { norm_fusion: true, ..no_ws() }).unwrap();
    let a = steps.iter().find(|s| s.node == "a").unwrap();
    assert!(matches!(&a.kernel, Some(KernelSpec::NormMatMul { inner, .. }) if matches!(inner.as_ref(), KernelSpec::MatMulPacked { tiles: 0, .. })), "{:?}", a.kernel);
    assert_eq!(&a.args[..2], ["x".to_string(), "g".to_string()]);
    assert_eq!(steps.iter().find(|s| s.node == "n").unwrap().min_rows, Some(2), "the norm's own kernel from two rows");
    // ... up to 8,192 weight rows (the blocks re-reading g), whatever the bytes: fp8's q/k/v
    // (26 MB) folds like int4's (13 MB), a gate/up's 28,672 rows do not
    for (rows, folds) in [(6144usize, true), (8704, false)] {
        let src = format!("graph \"t\" {{\n  %x = input : f32[T, 1024]\n  %g = weight : f32[1024]\n  %n = rms_norm(%x, %g) {{eps = 0.00001}} : f32[T, 1024]\n  %w = weight : {wdtype}[{rows}, 1024]\n  %a = matmul(%n, %w) {{transpose_b = true}} : f32[T, {rows}]\n  output a = %a\n}}\n");
        let steps = lower_opts(&text::parse(&src).unwrap(), ScheduleOptions { norm_fusion: true, ..no_ws() }).unwrap();
        let a = steps.iter().find(|s| s.node == "a").unwrap();
        assert_eq!(matches!(&a.kernel, Some(KernelSpec::NormMatMul { .. })), folds, "{wdtype} {rows} rows: {:?}", a.kernel);
    }
    // rows not whole 512-value super-blocks have no packed GEMV
    assert!(crate::kernels::fits(&KernelSpec::MatMulPacked { wdtype, k: 576, n: 128, tiles: 1, walk: 1, bias: false, residual: false }).is_err());
}

#[test]
fn q4_k_decode_runs_the_packed_gemv_at_one_row_and_the_k_quant_gemv_above() {
    // one row: the tensor-core packed GEMV (x staged in f16) where K is whole super-blocks up to
    // the staging limit, past it the K-quant GEMV; 2..few_max rows the K-quant batched GEMV
    for (k, packed) in [(4096usize, true), (crate::kernels::PACKED_ONE_ROW_MAX_K + 256, false)] {
        let src = format!("graph \"t\" {{\n  %x = input : f32[T, {k}]\n  %w = weight : q4_k[128, {k}]\n  %a = matmul(%x, %w) {{transpose_b = true}} : f32[T, 128]\n  output a = %a\n}}\n");
        let steps = lower_opts(&text::parse(&src).unwrap(), no_ws()).unwrap();
        let s = steps.iter().find(|s| s.node == "a").unwrap();
        let want = if packed {
            KernelSpec::MatMulPacked { wdtype: DType::Q4_K, k, n: 128, tiles: 0, walk: 1, bias: false, residual: false }
        } else {
            KernelSpec::MatMul { k, n: 128, wdtype: DType::Q4_K, bias: false, residual: false }
        };
        assert_eq!(s.kernel, Some(want));
        assert!(crate::kernels::fits(s.kernel.as_ref().unwrap()).is_ok());
        assert!(!s.few.is_empty() && s.few.iter().all(|f| matches!(f.kernel, KernelSpec::MatMulFew { wdtype: DType::Q4_K, .. } | KernelSpec::MatMulFewX16 { wdtype: DType::Q4_K, .. })), "{:?}", s.few);
    }
    // the norm folds into its staging of x, as for int4
    let src = "graph \"t\" {\n  %x = input : f32[T, 1024]\n  %g = weight : f32[1024]\n  %n = rms_norm(%x, %g) {eps = 0.00001} : f32[T, 1024]\n  %w = weight : q4_k[128, 1024]\n  %a = matmul(%n, %w) {transpose_b = true} : f32[T, 128]\n  output a = %a\n}\n";
    let steps = lower_opts(&text::parse(src).unwrap(), ScheduleOptions { norm_fusion: true, ..no_ws() }).unwrap();
    let a = steps.iter().find(|s| s.node == "a").unwrap();
    assert!(matches!(&a.kernel, Some(KernelSpec::NormMatMul { inner, .. }) if matches!(inner.as_ref(), KernelSpec::MatMulPacked { wdtype: DType::Q4_K, tiles: 0, .. })), "{:?}", a.kernel);
    // the packed form is one row only
    assert!(crate::kernels::fits(&KernelSpec::MatMulPacked { wdtype: DType::Q4_K, k: 1024, n: 128, tiles: 1, walk: 1, bias: false, residual: false }).is_err());
    // wide rows walk tiles so the blocks fit one wave of two an SM (an 8B lm_head: 8,016
    // tiles, 31 a block); merged parts take as many as keep a block inside one part
    let walk_of = |src: &str, node: &str| {
        let steps = lower_opts(&text::parse(src).unwrap(), no_ws()).unwrap();
        match steps.iter().find(|s| s.node == node).unwrap().kernel.clone() {
            Some(KernelSpec::MatMulPacked { walk, .. }) => walk,
            Some(KernelSpec::MatMulParts { inner, .. }) => match *inner {
                KernelSpec::MatMulPacked { walk, .. } => walk,
                other => panic!("{other:?}"),
            },
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(walk_of("graph \"t\" {\n  %x = input : f32[T, 256]\n  %w = weight : q4_k[128256, 256]\n  %a = matmul(%x, %w) {transpose_b = true} : f32[T, 128256]\n  output a = %a\n}\n", "a"), 31);
    // (q/k/v 4,096 + 1,024 + 1,024 wide: 384 tiles, 2 a block; parts 9,008 + 112 + 96: 576
    // tiles would take 3, but 9,008 columns are 563 tiles and 112 are 7: so 1)
    let cat = |parts: [usize; 3]| {
        let n: usize = parts.iter().sum();
        format!("graph \"t\" {{\n  %x = input : f32[T, 256]\n  %a = weight : q4_k[{}, 256]\n  %b = weight : q4_k[{}, 256]\n  %c = weight : q4_k[{}, 256]\n  %y = matmul_cat(%x, %a, %b, %c) : f32[T, {n}]\n  output y = %y\n}}\n", parts[0], parts[1], parts[2])
    };
    assert_eq!(walk_of(&cat([4096, 1024, 1024]), "y"), 2);
    assert_eq!(walk_of(&cat([9008, 112, 96]), "y"), 1);
    // a merged gate/up's SiLU·mul moves into its one-row kernel (the packed SwiGLU form, rows
    // and f its scalars); the silu_mul step runs from two rows
    let src = "graph \"t\" {\n  %x = input : f32[T, 1024]\n  %wg = weight : q4_k[512, 1024]\n  %wu = weight : q4_k[512, 1024]\n  %gu = matmul_cat(%x, %wg, %wu) : f32[T, 1024]\n  %g = slice(%gu) {axis = 1, start = 0, len = 512} : f32[T, 512]\n  %u = slice(%gu) {axis = 1, start = 512, len = 512} : f32[T, 512]\n  %h = silu_mul(%g, %u) : f32[T, 512]\n  output h = %h\n}\n";
    let steps = lower_opts(&text::parse(src).unwrap(), no_ws()).unwrap();
    let cat = steps.iter().find(|s| s.node == "gu").unwrap();
    assert_eq!(cat.kernel, Some(KernelSpec::SwiGluGemv { k: 1024, f: 512, wdtype: DType::Q4_K }));
    assert_eq!(crate::kernels::family(cat.kernel.as_ref().unwrap()), crate::kernels::Family::Packed);
    assert_eq!(cat.kernel.as_ref().unwrap().launch(), crate::kernels::Launch::OutputsPerBlock { outputs: 8, rows: 1, warps: 8 });
    assert_eq!(cat.scalars.len(), 2, "rows and f");
    assert_eq!(steps.iter().find(|s| s.node == "h").unwrap().min_rows, Some(2));
}

#[test]
fn quantized_prefill_runs_the_warp_specialized_pipe_with_a_dequantizing_producer() {
    // warp-specialized (the production options): past the batched GEMV's rows, the pipelined
    // matmul in 128 x 128 tiles on x's f16 copy (its tensor map), the weights as stored (no
    // tensor map); the merged gate/up takes the SwiGLU epilogue; without warp specialization
    // the wgmma matmul as before
    let src = "graph \"t\" {\n  %x = input : f32[T, 1024]\n  %g = weight : f32[1024]\n  %n = rms_norm(%x, %g) {eps = 0.00001} : f32[T, 1024]\n  %wg = weight : q4_k[512, 1024]\n  %wu = weight : q4_k[512, 1024]\n  %gu = matmul_cat(%n, %wg, %wu) : f32[T, 1024]\n  %a = slice(%gu) {axis = 1, start = 0, len = 512} : f32[T, 512]\n  %b = slice(%gu) {axis = 1, start = 512, len = 512} : f32[T, 512]\n  %h = silu_mul(%a, %b) : f32[T, 512]\n  %wd = weight : q6_k[1024, 512]\n  %d = matmul(%h, %wd) {transpose_b = true} : f32[T, 1024]\n  output d = %d\n}\n";
    let g = text::parse(src).unwrap();
    let steps = lower_opts(&g, ScheduleOptions::default()).unwrap();
    let min_rows = (ScheduleOptions::default().gemv_few_max + 1).max(128);
    for (node, wdtype, swiglu) in [("gu", DType::Q4_K, true), ("d", DType::Q6_K, false)] {
        let s = steps.iter().find(|s| s.node == node).unwrap();
        let [h] = &s.hopper[..] else { panic!("{node}: {:?}", s.hopper) };
        let KernelSpec::Ws { inner } = &h.kernel else { panic!("{node}: {:?}", h.kernel) };
        assert_eq!(matches!(inner.as_ref(), KernelSpec::SwiGluPipe { .. }), swiglu, "{node}: {inner:?}");
        assert!(matches!(inner.pipe_core(), KernelSpec::MatMulPipe { wdtype: w, bn: 128, bm: 128, a16: true, .. } if *w == wdtype), "{node}: {:?}", h.kernel);
        assert_eq!(h.min_rows, min_rows);
        let args = h.args.as_ref().unwrap();
        assert!(args[0].ends_with("@f16@xmap128"), "{node}: {args:?}");
        assert!(args[1..].iter().all(|a| !a.contains("@tmap")), "{node}: the weights as stored, {args:?}");
        assert!(crate::kernels::fits(&h.kernel).is_ok(), "{node}: {:?}", crate::kernels::fits(&h.kernel));
    }
    // (the silu_mul step skips the rows the fused epilogue covers)
    assert_eq!(steps.iter().find(|s| s.node == "h").unwrap().hopper_skip.as_ref().map(|r| r.0), Some(min_rows));
    // the kernel exists only warp-specialized; unsupported tilings are refused
    let pipe = KernelSpec::MatMulPipe { k: 1024, n: 512, wdtype: DType::Q4_K, bias: false, residual: false, bn: 128, stages: 6, overlap: true, a16: true, bm: 128 };
    assert!(crate::kernels::fits(&pipe).is_err());
    let wide = KernelSpec::MatMulPipe { k: 1024, n: 512, wdtype: DType::Q4_K, bias: false, residual: false, bn: 256, stages: 4, overlap: true, a16: true, bm: 128 };
    assert!(crate::kernels::fits(&KernelSpec::Ws { inner: Box::new(wide) }).is_err());
    let steps = lower_opts(&g, no_ws()).unwrap();
    let d = steps.iter().find(|s| s.node == "d").unwrap();
    assert!(matches!(d.hopper[..], [Large { kernel: KernelSpec::MatMulWgmma { n_tile: 64, .. }, .. }]), "{:?}", d.hopper);
}

#[test]
fn q4_1_batched_decode_runs_the_tensor_core_gemv_up_to_few_max_rows_on_an_f16_copy() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %w = weight : q4_1[128, 64]\n  %a = matmul(%x, %w) {transpose_b = true} : f32[T, 128]\n  output a = %a\n}\n";
    let g = text::parse(src).unwrap();
    let steps = lower_opts(&g, ScheduleOptions { few_x16: true, ..no_ws() }).unwrap();
    let s = steps.iter().find(|s| s.node == "a").unwrap();
    let [f32x, x16] = &s.few[..] else { panic!("{:?}", s.few) };
    assert!(matches!(f32x.kernel, KernelSpec::MatMulFew { wdtype: DType::Q4_1, rows: 32, .. }) && (f32x.min_rows, f32x.max_rows) == (2, Some(15)));
    assert!(matches!(x16.kernel, KernelSpec::MatMulFewX16 { wdtype: DType::Q4_1, .. }) && (x16.min_rows, x16.max_rows) == (16, Some(128)));
    // x copied in f16 (the dequantized Q4_1 operands are f16)
    assert_eq!(x16.args.as_ref().unwrap()[0], "x@f16");
    assert!(steps.iter().any(|s| s.node == "x@f16"));
    // the wgmma prefill kernel only past the batched GEMV's rows
    let [h] = &s.hopper[..] else { panic!("{:?}", s.hopper) };
    assert!(matches!(h.kernel, KernelSpec::MatMulWgmma { n_tile: 64, .. }) && h.min_rows == 129, "{h:?}");
}

#[test]
fn batched_decode_rows_go_to_64_row_tiles_then_128_row_tiles_by_width() {
    // (x in f32 for the batched GEMV here: only the Hopper list matters)
    for (n, lo64, from128) in [(6144usize, 32i64, 64i64), (28672, 32, 16), (128, 48, 64)] {
        let src = format!("graph \"t\" {{\n  %x = input : f32[T, 64]\n  %w = weight : bf16[{n}, 64]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[T, {n}]\n  output y = %y\n}}\n");
        let steps = lower_opts(&text::parse(&src).unwrap(), ScheduleOptions { few_x16: false, tma: Tma::Off, ..no_ws() }).unwrap();
        let s = steps.iter().find(|s| s.node == "y").unwrap();
        let [p64, p128] = &s.hopper[..] else { panic!("{:?}", s.hopper) };
        assert!(matches!(p64.kernel, KernelSpec::MatMulPipe { bm: 64, a16: true, .. }), "{:?}", p64.kernel);
        assert_eq!((p64.min_rows, p64.max_rows), (lo64, Some(64)), "N {n}");
        assert!(matches!(p128.kernel, KernelSpec::MatMulPipe { bm: 128, .. }), "{:?}", p128.kernel);
        assert_eq!((p128.min_rows, p128.max_rows), (from128, None), "N {n}");
        // both read the 16-bit copy, which is made from the fewest rows either takes
        assert!(s.hopper.iter().all(|h| h.args.as_ref().unwrap()[0] == "x@bf16"));
        let cast = steps.iter().find(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))).unwrap();
        assert_eq!(cast.min_rows, Some(lo64.min(from128)));
    }
}

#[test]
fn norm_half_writes_the_16_bit_copy_from_the_norm_instead_of_a_cast() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %g = weight : f32[64]\n  %xn = rms_norm(%x, %g) {eps = 1e-5} : f32[T, 64]\n  %w = weight : bf16[6144, 64]\n  %y = matmul(%xn, %w) {transpose_b = true} : f32[T, 6144]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let plain = lower_opts(&g, ScheduleOptions { norm_half: false, ..no_ws() }).unwrap();
    assert!(plain.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))));
    let steps = lower_opts(&g, ScheduleOptions { norm_half: true, ..no_ws() }).unwrap();
    assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))), "no cast step");
    let norm = steps.iter().find(|s| s.node == "xn").unwrap();
    assert_eq!(norm.kernel, Some(KernelSpec::RmsNormHalf { d: 64, eps_bits: 1e-5f32.to_bits(), f16: false }));
    assert_eq!(norm.args, ["x", "g", "xn", "xn@bf16"]);
    // the copy's buffer is declared by a step of its own, and the matmul's 16-bit readers use it
    assert!(steps.iter().any(|s| s.node == "xn@bf16" && s.kernel.is_none() && s.alias_of.is_none()));
    let y = steps.iter().find(|s| s.node == "y").unwrap();
    assert!(y.hopper.iter().chain(&y.few).filter(|l| l.args.is_some()).all(|l| l.args.as_ref().unwrap()[0] == "xn@bf16"));
    assert_eq!(y.args[0], "xn");
}

#[test]
fn a_layer_norm_writes_the_16_bit_copy_too() {
    // (GPT-2 / BERT style: layer_norm, then a matmul with a bias whose tensor-core kernels
    // read x in 16 bits)
    let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %g = weight : f32[64]\n  %b = weight : f32[64]\n  %xn = layer_norm(%x, %g, %b) {eps = 1e-5} : f32[T, 64]\n  %w = weight : f16[6144, 64]\n  %y = matmul(%xn, %w) {transpose_b = true} : f32[T, 6144]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let plain = lower_opts(&g, ScheduleOptions { norm_half: false, ..no_ws() }).unwrap();
    assert!(plain.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { f16: true }))));
    let steps = lower_opts(&g, no_ws()).unwrap();
    assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))), "no cast step");
    let norm = steps.iter().find(|s| s.node == "xn").unwrap();
    assert_eq!(norm.kernel, Some(KernelSpec::LayerNorm { d: 64, eps_bits: 1e-5f32.to_bits(), half: Some(true) }));
    assert_eq!(norm.args, ["x", "g", "b", "xn", "xn@f16"]);
    let y = steps.iter().find(|s| s.node == "y").unwrap();
    assert!(y.hopper.iter().chain(&y.few).filter(|l| l.args.is_some()).all(|l| l.args.as_ref().unwrap()[0] == "xn@f16"));
}

#[test]
fn split_k_adds_a_partial_sums_alternative_and_its_reduce_step() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %r = input : f32[T, 4096]\n  %w = weight : bf16[4096, 4096]\n  %y = matmul_add(%x, %w, %r) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let plain = lower_opts(&g, ScheduleOptions { split_k: None, ..no_ws() }).unwrap();
    assert!(plain.iter().all(|s| !s.node.contains("@splitk") && s.hopper.iter().all(|h| !matches!(h.kernel, KernelSpec::SplitK { .. }))));
    let steps = lower_opts(&g, ScheduleOptions { split_k: Some(4), ..no_ws() }).unwrap();
    let i = steps.iter().position(|s| s.node == "y" && s.kernel.as_ref().is_some_and(|k| matches!(k, KernelSpec::MatMul { .. }))).unwrap();
    // the partial sums' buffer declared first (then the cast of x), the reduce pass right after
    let (decl, mm, red) = (steps[..i].iter().find(|s| s.node == "y@splitk4").unwrap(), &steps[i], &steps[i + 1]);
    assert!(decl.kernel.is_none() && decl.alias_of.is_none());
    let sk = &mm.hopper[0];
    let KernelSpec::SplitK { inner, splits: 4 } = &sk.kernel else { panic!("{:?}", sk.kernel) };
    assert!(matches!(inner.as_ref(), KernelSpec::MatMulPipe { bm: 64, residual: false, bias: false, a16: true, .. }));
    let hi = sk.max_rows.unwrap();
    assert_eq!((sk.min_rows, hi), (SPLIT_K_MIN_ROWS, SPLIT_K_MAX_ROWS));
    // (the 64-row alternative it stands in front of keeps its rows: first fit)
    assert!(mm.hopper[1..].iter().any(|h| matches!(h.kernel, KernelSpec::MatMulPipe { bm: 64, .. }) && h.max_rows == Some(64)));
    // x from its 16-bit copy, no residual in the first pass
    assert_eq!(sk.args.as_deref().unwrap(), ["x@bf16", "w", "y@splitk4"]);
    assert_eq!(red.kernel, Some(KernelSpec::SplitKReduce { splits: 4, residual: true }));
    assert_eq!(red.args, ["y@splitk4", "r", "y"]);
    assert_eq!((red.min_rows, red.max_rows, red.hopper_only), (Some(SPLIT_K_MIN_ROWS), Some(hi), true));
    // the cast to bf16 runs from the split's first row
    let cast = steps.iter().find(|s| s.node == "x@bf16").unwrap();
    assert!(cast.min_rows.unwrap() <= SPLIT_K_MIN_ROWS);
}

#[test]
fn the_batched_gate_up_matmul_takes_the_swiglu_and_the_silu_step_skips_its_rows() {
    // the 8B shape's MLP: merged gate/up, silu_mul, down
    let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %wg = weight : bf16[14336, 4096]\n  %wu = weight : bf16[14336, 4096]\n  %gu = matmul_cat(%x, %wg, %wu) : f32[T, 28672]\n  %g = slice(%gu) {axis = 1, start = 0, len = 14336} : f32[T, 14336]\n  %u = slice(%gu) {axis = 1, start = 14336, len = 14336} : f32[T, 14336]\n  %h = silu_mul(%g, %u) : f32[T, 14336]\n  %wd = weight : bf16[4096, 14336]\n  %y = matmul(%h, %wd) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let plain = lower_opts(&g, ScheduleOptions { swiglu_pipe: SwiGluFusion::Off, ..no_ws() }).unwrap();
    let steps = lower_opts(&g, ScheduleOptions { swiglu_pipe: SwiGluFusion::Batched, ..no_ws() }).unwrap();
    assert_eq!(plain.len(), steps.len());
    let sm = steps.iter().find(|s| s.node == "h").unwrap();
    assert_eq!(sm.kernel, Some(KernelSpec::SiluMulHalf { f16: false }));
    let mm = steps.iter().find(|s| s.node == "gu").unwrap();
    let fused: Vec<&Large> = mm.hopper.iter().filter(|l| matches!(l.kernel, KernelSpec::SwiGluPipe { .. })).collect();
    let [alt] = fused[..] else { panic!("{:?}", mm.hopper) };
    let KernelSpec::SwiGluPipe { inner } = &alt.kernel else { unreachable!() };
    assert!(matches!(inner.as_ref(), KernelSpec::MatMulPipe { bm: 64, n: 28672, a16: true, bias: false, residual: false, .. }), "{inner:?}");
    // x's 16-bit copy, both weights, then h and its copy; M and F
    assert_eq!(alt.args.as_deref().unwrap(), ["x@bf16", "wg", "wu", "h", "h@bf16"]);
    assert_eq!(alt.scalars, vec![Scalar::Rows("h".into()), Scalar::Const(14336)]);
    // the silu step skips exactly the fused alternative's rows; the unfused plan has none
    assert_eq!(sm.hopper_skip, Some((alt.min_rows, alt.max_rows.unwrap_or(i64::MAX))));
    assert!(plain.iter().all(|s| s.hopper_skip.is_none() && s.alternatives().all(|l| !matches!(l.kernel, KernelSpec::SwiGluPipe { .. }))));
    // ... and every other alternative is as before
    let before = plain.iter().find(|s| s.node == "gu").unwrap();
    assert_eq!(before.hopper.len(), mm.hopper.len());
    assert_eq!(
        before.hopper.iter().filter(|l| !matches!(l.kernel, KernelSpec::MatMulParts { ref inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMulPipe { bm: 64, .. }))).count(),
        mm.hopper.len() - 1
    );
    // every pipelined alternative (DSC_SWIGLU_PIPE=all): the 128-row tiles too, and the
    // silu step skips every row they and the 64-row tile take (from the first's 16 up)
    let all = lower_opts(&g, ScheduleOptions { swiglu_pipe: SwiGluFusion::All, ..no_ws() }).unwrap();
    let mm = all.iter().find(|s| s.node == "gu").unwrap();
    let fused: Vec<&Large> = mm.hopper.iter().filter(|l| matches!(l.kernel, KernelSpec::SwiGluPipe { .. })).collect();
    let pipes = before.hopper.iter().filter(|l| matches!(&l.kernel, KernelSpec::MatMulParts { inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMulPipe { .. }))).count();
    assert_eq!(fused.len(), pipes);
    assert!(fused.len() >= 2, "{:?}", mm.hopper);
    let lo = fused.iter().map(|l| l.min_rows).min().unwrap();
    assert_eq!(all.iter().find(|s| s.node == "h").unwrap().hopper_skip, Some((lo, i64::MAX)));
}

#[test]
fn the_swiglu_stays_out_of_the_tiles_that_load_w_by_tma() {
    // the SmolLM2 shape's MLP: its 128-row gate/up tiles are 128 columns wide (TMA loads
    // by default), so only the 64-row tile takes the SwiGLU; with TMA off both do
    let src = "graph \"t\" {\n  %x = input : f32[T, 576]\n  %wg = weight : bf16[1536, 576]\n  %wu = weight : bf16[1536, 576]\n  %gu = matmul_cat(%x, %wg, %wu) : f32[T, 3072]\n  %g = slice(%gu) {axis = 1, start = 0, len = 1536} : f32[T, 1536]\n  %u = slice(%gu) {axis = 1, start = 1536, len = 1536} : f32[T, 1536]\n  %h = silu_mul(%g, %u) : f32[T, 1536]\n  %wd = weight : bf16[576, 1536]\n  %y = matmul(%h, %wd) {transpose_b = true} : f32[T, 576]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    // ((rows, columns) per tile, fused) of the pipelined alternatives, first fit first
    let fused = |tma: Tma| -> Vec<((usize, usize), bool)> {
        let steps = lower_opts(&g, ScheduleOptions { tma, ..no_ws() }).unwrap();
        let mm = steps.iter().find(|s| s.node == "gu").unwrap();
        let tile = |k: &KernelSpec| match k.matmul_core().0 {
            KernelSpec::MatMulPipe { bm, bn, .. } => (*bm, *bn),
            _ => (0, 0),
        };
        mm.hopper
            .iter()
            .map(|l| match &l.kernel {
                KernelSpec::SwiGluPipe { inner } => (tile(inner), true),
                other => (tile(other), false),
            })
            .filter(|&(t, _)| t.0 > 0)
            .collect()
    };
    let narrow = fused(Tma::Narrow);
    assert_eq!(narrow[0], ((64, 128), true));
    assert_eq!(narrow.last(), Some(&((128, 128), false)));
    assert!(fused(Tma::Off).iter().all(|&(_, f)| f));
    // warp-specialized (the default), the 128-row tiles load by TMA and take the SwiGLU too
    let steps = lower_opts(&g, ScheduleOptions::default()).unwrap();
    let mm = steps.iter().find(|s| s.node == "gu").unwrap();
    let ws: Vec<&Large> = mm.hopper.iter().filter(|l| matches!(&l.kernel, KernelSpec::Ws { inner } if matches!(inner.as_ref(), KernelSpec::SwiGluPipe { .. }))).collect();
    assert!(!ws.is_empty(), "{:?}", mm.hopper);
    // (128-row tiles: a box of 64 gate and 64 up rows; 64-row ones, from WS64_MIN_ROWS:
    // per warpgroup 32 and 32)
    // (and the 256-column tiles of long prefills: 128 and 128)
    let ok = |a: &[String]| [["x@bf16@xmap128", "wg@tmap64", "wu@tmap64"], ["x@bf16@xmap64", "wg@tmap32", "wu@tmap32"], ["x@bf16@xmap128", "wg@tmap128", "wu@tmap128"]].iter().any(|w| a[..3] == *w);
    assert!(ws.iter().all(|l| ok(l.args.as_deref().unwrap())), "{ws:?}");
}

#[test]
fn the_split_k_qkv_reduce_folds_into_the_rope_kernel() {
    // the 8B shape's attention inputs: merged q/k/v (48 column tiles: split-K 2), RoPE and
    // the cache writes
    let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %wq = weight : bf16[4096, 4096]\n  %wk = weight : bf16[1024, 4096]\n  %wv = weight : bf16[1024, 4096]\n  %kc = state : bf16[64, 16, 8, 128]\n  %vc = state : bf16[64, 16, 8, 128]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 6144]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 4096} : f32[T, 4096]\n  %k = slice(%qkv) {axis = 1, start = 4096, len = 1024} : f32[T, 1024]\n  %v = slice(%qkv) {axis = 1, start = 5120, len = 1024} : f32[T, 1024]\n  %qh = reshape(%q) : f32[T, 32, 128]\n  %kh = reshape(%k) : f32[T, 8, 128]\n  %vh = reshape(%v) : f32[T, 8, 128]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 128} : f32[T, 32, 128]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 128} : bf16[64, 16, 8, 128]\n  %vw = cache_write(%vc, %vh, %slots) : bf16[64, 16, 8, 128]\n  output q = %qr\n  output k = %kw\n  output v = %vw\n}\n";
    let g = text::parse(src).unwrap();
    let plain = lower_opts(&g, ScheduleOptions { splitk_rope: false, ..no_ws() }).unwrap();
    let red = plain.iter().find(|s| matches!(s.kernel, Some(KernelSpec::SplitKReduce { splits: 2, residual: false }))).expect("a q/k/v reduce by default");
    let (lo, hi) = (red.min_rows.unwrap(), red.max_rows.unwrap());
    let steps = lower_opts(&g, ScheduleOptions { splitk_rope: true, ..no_ws() }).unwrap();
    assert_eq!(steps.len(), plain.len() - 1);
    assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::SplitKReduce { .. }))));
    let rope = steps.iter().find(|s| matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))).unwrap();
    let [alt] = &rope.hopper[..] else { panic!("{:?}", rope.hopper) };
    assert!(matches!(&alt.kernel, KernelSpec::QkvRopeSplitK { inner, splits: 2 } if Some(inner.as_ref()) == rope.kernel.as_ref()));
    // its rows are tokens x 32 heads
    assert_eq!((alt.min_rows, alt.max_rows), (lo * 32, Some(hi * 32)));
    let parts = red.args[0].clone();
    assert_eq!(alt.args.as_deref().unwrap()[0], parts);
    assert_eq!(alt.args.as_deref().unwrap()[1..], rope.args[3..]);
    // the slice, then q's, k's and v's offsets in it
    assert_eq!(alt.scalars[rope.scalars.len()..], [Scalar::Numel("qkv".into()), Scalar::RowsTimes("qkv".into(), 0), Scalar::RowsTimes("qkv".into(), 4096), Scalar::RowsTimes("qkv".into(), 5120)]);
}

#[test]
fn fused_rows_are_the_rows_a_fused_alternative_is_picked_for() {
    let alt =
        |min_rows: i64, max_rows: Option<i64>| Large { min_rows, max_rows, args: None, kernel: KernelSpec::ToHalf { f16: false }, scalars: vec![], work: Scalar::Const(1), grid_y: Scalar::Const(1) };
    // a 64-row tile for 32..=64 in front of a 128-row tile from 16
    let alts = [alt(32, Some(64)), alt(16, None)];
    assert_eq!(fused_rows(&alts, &[0]), Some((32, 64)));
    assert_eq!(fused_rows(&alts, &[0, 1]), Some((16, i64::MAX)));
    // the 128-row tile alone is picked at 16..=31 and from 65: two intervals
    assert_eq!(fused_rows(&alts, &[1]), None);
    assert_eq!(fused_rows(&alts, &[]), None);
    // an earlier alternative takes part of a later one's rows
    let alts = [alt(16, Some(128)), alt(32, Some(64)), alt(100, None)];
    assert_eq!(fused_rows(&alts, &[1]), None);
    assert_eq!(fused_rows(&alts, &[2]), Some((129, i64::MAX)));
}

#[test]
fn silu_mul_writes_the_16_bit_copy_the_down_projection_reads() {
    let src = "graph \"t\" {\n  %g = input : f32[T, 256]\n  %u = input : f32[T, 256]\n  %h = silu_mul(%g, %u) : f32[T, 256]\n  %w = weight : bf16[4096, 256]\n  %y = matmul(%h, %w) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let steps = lower_opts(&g, ScheduleOptions { silu_half: true, ..no_ws() }).unwrap();
    assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))), "no cast step");
    let sm = steps.iter().find(|s| s.node == "h").unwrap();
    assert_eq!(sm.kernel, Some(KernelSpec::SiluMulHalf { f16: false }));
    assert_eq!(sm.args, ["g", "u", "h", "h@bf16"]);
    let y = steps.iter().find(|s| s.node == "y").unwrap();
    assert!(y.hopper.iter().chain(&y.few).filter(|l| l.args.is_some()).all(|l| l.args.as_ref().unwrap()[0] == "h@bf16"));
    assert_eq!(steps, lower_opts(&g, no_ws()).unwrap(), "on by default");
    // (off, or without norm + quantize: the cast, and silu_mul as before)
    let plain = lower_opts(&g, ScheduleOptions { norm_half: false, ..no_ws() }).unwrap();
    assert!(plain.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))));
    let plain = lower_opts(&g, ScheduleOptions { silu_half: false, ..no_ws() }).unwrap();
    assert!(plain.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))));
    assert!(plain.iter().any(|s| s.kernel == Some(KernelSpec::Binary(BinaryOpKey(dsc_ir::BinaryOp::SiluMul)))));
}

#[test]
fn split_k_takes_a_merged_matmul_with_fewer_parts_for_more_tiles() {
    // the 8B shape's q/k/v: 6144 columns, 48 tiles of 128 -> 2 parts (96 blocks; 4 would
    // be 192, past one wave of 132 SMs)
    let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %wq = weight : bf16[4096, 4096]\n  %wk = weight : bf16[1024, 4096]\n  %wv = weight : bf16[1024, 4096]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 6144]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 4096} : f32[T, 4096]\n  %k = slice(%qkv) {axis = 1, start = 4096, len = 1024} : f32[T, 1024]\n  %v = slice(%qkv) {axis = 1, start = 5120, len = 1024} : f32[T, 1024]\n  output q = %q\n  output k = %k\n  output v = %v\n}\n";
    let g = text::parse(src).unwrap();
    let steps = lower_opts(&g, no_ws()).unwrap();
    let i = steps.iter().position(|s| s.node == "qkv" && s.kernel.is_some()).unwrap();
    let (mm, red) = (&steps[i], &steps[i + 1]);
    let KernelSpec::SplitK { inner, splits: 2 } = &mm.hopper[0].kernel else { panic!("{:?}", mm.hopper[0].kernel) };
    let KernelSpec::MatMulParts { inner: pipe, parts } = inner.as_ref() else { panic!("{inner:?}") };
    assert_eq!(parts, &[4096, 1024, 1024]);
    assert!(matches!(pipe.as_ref(), KernelSpec::MatMulPipe { bm: 64, bn: 128, .. }));
    assert_eq!(mm.hopper[0].args.as_deref().unwrap(), ["x@bf16", "wq", "wk", "wv", "qkv@splitk2"]);
    assert_eq!(red.kernel, Some(KernelSpec::SplitKReduce { splits: 2, residual: false }));
    assert_eq!(red.args, ["qkv@splitk2", "qkv"]);
    assert!(steps.iter().any(|s| s.node == "qkv@splitk2" && s.kernel.is_none()));
    // the part counts: o/down (32 tiles) 4, q/k/v (48) 2, gate/up (112) none
    assert_eq!((split_k_parts(32, 64, 128, 4), split_k_parts(48, 64, 128, 4), split_k_parts(112, 64, 256, 4)), (Some(4), Some(2), None));
}

#[test]
fn split_k_reduce_folds_into_the_norm_reading_its_output() {
    // o projection + residual, then the norm of the residual stream ahead of a bf16 matmul
    let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %h = input : f32[T, 4096]\n  %wo = weight : bf16[4096, 4096]\n  %h2 = matmul_add(%x, %wo, %h) {transpose_b = true} : f32[T, 4096]\n  %g = weight : f32[4096]\n  %xn = rms_norm(%h2, %g) {eps = 1e-5} : f32[T, 4096]\n  %w2 = weight : bf16[4096, 4096]\n  %y = matmul_add(%xn, %w2, %h2) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let steps = lower_opts(&g, no_ws()).unwrap();
    // h2's reduce is gone, folded into the norm; y's (read by no norm) stays
    assert!(steps.iter().all(|s| !(s.node == "h2" && matches!(s.kernel, Some(KernelSpec::SplitKReduce { .. })))));
    assert!(steps.iter().any(|s| s.node == "y" && matches!(s.kernel, Some(KernelSpec::SplitKReduce { .. }))));
    let norm = steps.iter().find(|s| s.node == "xn").unwrap();
    assert_eq!(norm.kernel, Some(KernelSpec::RmsNormHalf { d: 4096, eps_bits: 1e-5f32.to_bits(), f16: false }));
    let [alt] = &norm.hopper[..] else { panic!("{:?}", norm.hopper) };
    assert_eq!(
        alt.kernel,
        KernelSpec::SplitKReduceNorm { splits: 4, residual: true, d: 4096, eps_bits: 1e-5f32.to_bits(), half: Some(false), cluster: crate::kernels::splitk_norm_cluster(4096, None) }
    );
    assert_eq!(alt.args.as_deref().unwrap(), ["h2@splitk4", "h", "h2", "g", "xn", "xn@bf16"]);
    let mm = steps.iter().find(|s| s.node == "h2" && s.kernel.is_some()).unwrap();
    assert_eq!((alt.min_rows, alt.max_rows), (mm.hopper[0].min_rows, mm.hopper[0].max_rows));
}

#[test]
fn tma_wraps_the_pipelined_matmuls_and_names_the_weights_tensor_maps() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %wq = weight : bf16[4096, 4096]\n  %wk = weight : bf16[1024, 4096]\n  %wv = weight : bf16[1024, 4096]\n  %qkv = matmul_cat(%x, %wq, %wk, %wv) : f32[T, 6144]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 4096} : f32[T, 4096]\n  %k = slice(%qkv) {axis = 1, start = 4096, len = 1024} : f32[T, 1024]\n  %v = slice(%qkv) {axis = 1, start = 5120, len = 1024} : f32[T, 1024]\n  %h = input : f32[T, 4096]\n  %wo = weight : bf16[4096, 4096]\n  %y = matmul_add(%q, %wo, %h) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n  output k = %k\n  output v = %v\n}\n";
    let g = text::parse(src).unwrap();
    let plain = lower_opts(&g, ScheduleOptions { tma: Tma::Off, ..no_ws() }).unwrap();
    let steps = lower_opts(&g, ScheduleOptions { tma: Tma::All, ..no_ws() }).unwrap();
    assert_eq!(plain.len(), steps.len());
    let mut wrapped = 0;
    for (p, s) in plain.iter().zip(&steps) {
        assert_eq!(p.hopper.len(), s.hopper.len());
        for (ph, sh) in p.hopper.iter().zip(&s.hopper) {
            let KernelSpec::Tma { inner } = &sh.kernel else {
                assert_eq!(ph.kernel, sh.kernel, "only pipelined matmuls change");
                continue;
            };
            wrapped += 1;
            assert_eq!(inner.as_ref(), &ph.kernel);
            let (pa, sa) = (ph.args.clone().unwrap_or_else(|| p.args.clone()), sh.args.clone().unwrap());
            // x and the outputs as before; each weight its tensor map
            assert_eq!((pa[0].as_str(), pa.last()), (sa[0].as_str(), sa.last()));
            assert!(sa.iter().filter(|a| a.contains("@tmap")).all(|a| a.starts_with('w')));
            let n_w = sa.iter().filter(|a| a.contains("@tmap")).count();
            assert_eq!(n_w, if s.node == "qkv" { 3 } else { 1 }, "{sa:?}");
        }
    }
    // q/k/v and o: the split-K alternatives and the 64-/128-row tiles
    assert!(wrapped >= 4, "{wrapped}");
}

#[test]
fn decode_attention_prefetches_the_output_projections_weights() {
    // (the 8B shape's o projection: 32 MiB of bf16, over the GEMV's own prefetch limit)
    let src = "graph \"t\" {\n  %q = input : f32[T, 32, 128]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : f32[NB, 16, 8, 128]\n  %vc = state : f32[NB, 16, 8, 128]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {scale = 0.088} : f32[T, 32, 128]\n  %a = reshape(%o) : f32[T, 4096]\n  %wo = weight : bf16[4096, 4096]\n  %h = input : f32[T, 4096]\n  %y = matmul_add(%a, %wo, %h) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let steps = lower_opts(&g, ScheduleOptions { attn_prefetch: true, ..no_ws() }).unwrap();
    let attn: Vec<&Step> = steps.iter().filter(|s| matches!(s.kernel, Some(KernelSpec::PrefetchL2 { .. }))).collect();
    // the one-pass steps (short and long contexts), not the split pass
    assert_eq!(attn.len(), 2, "{:?}", steps.iter().map(|s| &s.kernel).collect::<Vec<_>>());
    for s in attn {
        assert_eq!(s.args[0], "wo");
        assert_eq!(s.scalars.last(), Some(&Scalar::Const(4096 * 4096 * 2)));
        assert!(s.few.iter().all(|l| matches!(l.kernel, KernelSpec::PrefetchL2 { .. }) && l.scalars.last() == Some(&Scalar::Const(4096 * 4096 * 2))));
        // the prefill attention keeps its args
        assert_eq!(s.large.as_ref().unwrap().args.as_ref().unwrap()[0], "q");
    }
}

#[test]
fn the_long_prefill_matmuls_are_warp_specialized() {
    // the 8B shape's o projection: 128-column tiles from 128 rows, 256-column ones from
    // WIDE_MIN_TILES of them, both warp-specialized (x's and W's tensor maps); the 64-row
    // decode tiles and split-K are not
    let src = "graph \"t\" {\n  %x = input : f32[T, 4096]\n  %w = weight : bf16[4096, 4096]\n  %r = input : f32[T, 4096]\n  %y = matmul_add(%x, %w, %r) {transpose_b = true} : f32[T, 4096]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let steps = lower_opts(&g, ScheduleOptions::default()).unwrap();
    let y = steps.iter().find(|s| s.node == "y").unwrap();
    let ws: Vec<&Large> = y.hopper.iter().filter(|l| matches!(l.kernel, KernelSpec::Ws { .. }) && matches!(l.kernel.matmul_core().0, KernelSpec::MatMulPipe { bm: 128, .. })).collect();
    let [wide, narrow] = ws[..] else { panic!("{:?}", y.hopper) };
    assert!(matches!(wide.kernel.matmul_core().0, KernelSpec::MatMulPipe { bn: 256, bm: 128, residual: true, .. }), "{:?}", wide.kernel);
    assert!(matches!(narrow.kernel.matmul_core().0, KernelSpec::MatMulPipe { bn: 128, bm: 128, .. }), "{:?}", narrow.kernel);
    assert_eq!(wide.min_rows, (WIDE_MIN_TILES.div_ceil(16) * 128) as i64);
    assert!(narrow.min_rows < wide.min_rows && wide.max_rows.is_none());
    assert_eq!(wide.args.as_deref().unwrap()[..2], ["x@bf16@xmap128", "w@tmap256"]);
    assert_eq!(narrow.args.as_deref().unwrap()[..2], ["x@bf16@xmap128", "w@tmap128"]);
    assert!(y.hopper.iter().all(|l| matches!(l.kernel, KernelSpec::Ws { .. }) || l.kernel.matmul_core().0 != wide.kernel.matmul_core().0));
    // the 64-row tiles keep cp.async loads below WS64_MIN_ROWS rows, and are
    // warp-specialized from there (x's map in 64-row boxes), split-K ones too
    let m64: Vec<&Large> = y.hopper.iter().filter(|l| matches!(l.kernel.matmul_core().0, KernelSpec::MatMulPipe { bm: 64, .. })).collect();
    assert!(m64.iter().any(|l| !matches!(l.kernel, KernelSpec::Ws { .. })));
    for l in &m64 {
        let is_ws = matches!(l.kernel, KernelSpec::Ws { .. });
        assert_eq!(is_ws, l.min_rows >= WS64_MIN_ROWS, "{l:?}");
        assert!(is_ws || l.max_rows.is_some_and(|m| m < WS64_MIN_ROWS), "{l:?}");
        if is_ws {
            assert_eq!(l.args.as_deref().unwrap()[..2], ["x@bf16@xmap64", "w@tmap128"]);
        }
    }
    assert!(m64.iter().any(|l| matches!(&l.kernel, KernelSpec::Ws { inner } if matches!(inner.as_ref(), KernelSpec::SplitK { .. }))));
    // and none without it
    let off = lower_opts(&g, no_ws()).unwrap();
    assert!(off.iter().flat_map(|s| s.alternatives()).all(|l| !matches!(l.kernel, KernelSpec::Ws { .. })));
}

#[test]
fn matmul_act_puts_the_activation_in_every_kernel_of_the_step() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %w = weight : bf16[128, 64]\n  %b = weight : f32[128]\n  %y = matmul_act(%x, %w, %b) {transpose_b = true, act = gelu} : f32[T, 128]\n  output y = %y\n}\n";
    let steps = lower_opts(&text::parse(src).unwrap(), ScheduleOptions { norm_fusion: false, ..Default::default() }).unwrap();
    let s = steps.iter().find(|s| s.node == "y").unwrap();
    let act = |k: &KernelSpec| matches!(k, KernelSpec::MatMulAct { act: UnaryOpKey(dsc_ir::UnaryOp::Gelu), .. });
    assert!(act(s.kernel.as_ref().unwrap()), "{:?}", s.kernel);
    for l in s.alternatives() {
        // (the prefill tile loads W by TMA, or is warp-specialized: the wrapper outside)
        let k = match &l.kernel {
            KernelSpec::Tma { inner } | KernelSpec::Ws { inner } => inner.as_ref(),
            k => k,
        };
        assert!(act(k), "{:?}", l.kernel);
    }
    // the prefill kernel under the wrapper still gets its bf16 copy of x (as the tensor
    // map of it, warp-specialized)
    assert_eq!(s.hopper.last().unwrap().args.as_ref().unwrap()[0], "x@bf16@xmap128");
    assert!(steps.iter().any(|s| matches!(s.kernel, Some(KernelSpec::ToHalf { .. }))));
}

#[test]
fn swiglu_runs_in_the_merged_gate_up_gemv_for_one_row() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %wg = weight : bf16[128, 64]\n  %wu = weight : bf16[128, 64]\n  %gu = matmul_cat(%x, %wg, %wu) : f32[T, 256]\n  %g = slice(%gu) {axis = 1, start = 0, len = 128} : f32[T, 128]\n  %u = slice(%gu) {axis = 1, start = 128, len = 128} : f32[T, 128]\n  %h = silu_mul(%g, %u) : f32[T, 128]\n  output h = %h\n}\n";
    let steps = lower_opts(&text::parse(src).unwrap(), ScheduleOptions { few_x16: false, tma: Tma::Off, ..no_ws() }).unwrap();
    let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
    let cat = by("gu");
    assert_eq!(cat.kernel, Some(KernelSpec::SwiGluGemv { k: 64, f: 128, wdtype: DType::BF16 }));
    assert_eq!(cat.args, ["x", "wg", "wu", "h"]);
    // the alternatives keep computing the cat (the prefill one from the bf16 copy of x),
    // and silu_mul runs after them
    for l in cat.few.iter().chain(&cat.large).chain(&cat.hopper_small) {
        assert_eq!(l.args.as_deref(), Some(&["x".to_string(), "wg".to_string(), "wu".to_string(), "gu".to_string()][..]));
    }
    let h = cat.hopper.last().unwrap();
    assert_eq!(h.args.as_deref(), Some(&["x@bf16".to_string(), "wg".to_string(), "wu".to_string(), "gu".to_string()][..]));
    assert_eq!(by("h").min_rows, Some(2));
    // the up part first: the gate weight is still the one silu reads
    let swapped = src.replace("silu_mul(%g, %u)", "silu_mul(%u, %g)");
    let steps = lower_opts(&text::parse(&swapped).unwrap(), ScheduleOptions { norm_fusion: false, ..Default::default() }).unwrap();
    assert_eq!(steps.iter().find(|s| s.node == "gu").unwrap().args, ["x", "wu", "wg", "h"]);
}

#[test]
fn one_token_mlp_runs_as_one_kernel_seeded_by_the_o_projection() {
    let src = "graph \"t\" {\n  %a = input : f32[T, 64]\n  %x0 = input : f32[T, 64]\n  %wo = weight : bf16[64, 64]\n  %x3 = matmul_add(%a, %wo, %x0) {transpose_b = true} : f32[T, 64]\n  %g = weight : f32[64]\n  %xn = rms_norm(%x3, %g) {eps = 0.00001} : f32[T, 64]\n  %wg = weight : bf16[128, 64]\n  %wu = weight : bf16[128, 64]\n  %gu = matmul_cat(%xn, %wg, %wu) : f32[T, 256]\n  %ga = slice(%gu) {axis = 1, start = 0, len = 128} : f32[T, 128]\n  %up = slice(%gu) {axis = 1, start = 128, len = 128} : f32[T, 128]\n  %h = silu_mul(%ga, %up) : f32[T, 128]\n  %wd = weight : bf16[64, 128]\n  %y = matmul_add(%h, %wd, %x3) {transpose_b = true} : f32[T, 64]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let opts = ScheduleOptions { norm_fusion: true, swiglu_down: true, ..ScheduleOptions::default() };
    let steps = lower_opts(&g, opts).unwrap();
    let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
    let (fb, fpw) = (ScheduleOptions::default().swiglu_down_fb, ScheduleOptions::default().swiglu_down_fpw);
    assert_eq!(by("y").kernel, Some(KernelSpec::SwiGluDown { k: 64, f: 128, n: 64, eps_bits: 0.00001f32.to_bits(), fb, fpw, wdtype: DType::BF16 }));
    assert_eq!(by("y").args, ["x3", "g", "wg", "wu", "wd", "y"]);
    assert!(matches!(by("x3").kernel, Some(KernelSpec::MatMulCopy { .. })), "{:?}", by("x3").kernel);
    assert_eq!(by("x3").args, ["a", "wo", "x0", "y", "x3"]);
    assert_eq!(by("gu").min_rows, Some(2));
    // every alternative (two rows and more) keeps its kernel's own args
    // (h or its 16-bit copy, `h@bf16`)
    for (node, x) in [("y", "h"), ("x3", "a")] {
        for l in by(node).alternatives() {
            let a = l.args.as_deref().unwrap();
            assert!(a[0].starts_with(x), "{node}: {a:?}");
        }
    }
    // off, or with another reader of h: the three kernels stay
    let off = lower_opts(&g, ScheduleOptions { swiglu_down: false, ..opts }).unwrap();
    assert!(off.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::SwiGluDown { .. } | KernelSpec::MatMulCopy { .. }))));
    let extra = src.replace("  output y = %y\n", "  output y = %y\n  output h = %h\n");
    let steps = lower_opts(&text::parse(&extra).unwrap(), opts).unwrap();
    assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::SwiGluDown { .. } | KernelSpec::MatMulCopy { .. }))));
    // Q4_1 weights (GGUF): the same kernel on Q4_1; a down projection of another format keeps
    // the separate kernels
    let q4 = src.replace(" bf16[", " q4_1[");
    let steps = lower_opts(&text::parse(&q4).unwrap(), opts).unwrap();
    let y = steps.iter().find(|s| s.node == "y").unwrap();
    assert_eq!(y.kernel, Some(KernelSpec::SwiGluDown { k: 64, f: 128, n: 64, eps_bits: 0.00001f32.to_bits(), fb, fpw, wdtype: DType::Q4_1 }));
    let mixed = q4.replace("%wd = weight : q4_1[", "%wd = weight : bf16[");
    let steps = lower_opts(&text::parse(&mixed).unwrap(), opts).unwrap();
    assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::SwiGluDown { .. }))));
}

#[test]
fn one_token_layer_adds_the_o_projection_from_the_attention_into_both_accumulators() {
    let src = "graph \"t\" {\n  %x = input : f32[T, 32]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %g1 = weight : f32[32]\n  %xn = rms_norm(%x, %g1) {eps = 0.00001} : f32[T, 32]\n  %wq = weight : bf16[32, 32]\n  %wk = weight : bf16[16, 32]\n  %wv = weight : bf16[16, 32]\n  %wo = weight : bf16[32, 32]\n  %kc = state : bf16[4, 4, 2, 8]\n  %vc = state : bf16[4, 4, 2, 8]\n  %qkv = matmul_cat(%xn, %wq, %wk, %wv) : f32[T, 64]\n  %q = slice(%qkv) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %k = slice(%qkv) {axis = 1, start = 32, len = 16} : f32[T, 16]\n  %v = slice(%qkv) {axis = 1, start = 48, len = 16} : f32[T, 16]\n  %qh = reshape(%q) : f32[T, 4, 8]\n  %kh = reshape(%k) : f32[T, 2, 8]\n  %vh = reshape(%v) : f32[T, 2, 8]\n  %qr = rope(%qh, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : f32[T, 4, 8]\n  %kw = rope_cache_write(%kc, %kh, %slots, %pos) {theta = 10000.0, style = half, rotary_dim = 8} : bf16[4, 4, 2, 8]\n  %vw = cache_write(%vc, %vh, %slots) : bf16[4, 4, 2, 8]\n  %o = paged_attention(%qr, %kw, %vw, %pos, %seq, %table) {scale = 0.35} : f32[T, 4, 8]\n  %of = reshape(%o) : f32[T, 32]\n  %x3 = matmul_add(%of, %wo, %x) {transpose_b = true} : f32[T, 32]\n  %g2 = weight : f32[32]\n  %xn2 = rms_norm(%x3, %g2) {eps = 0.00001} : f32[T, 32]\n  %wg = weight : bf16[32, 32]\n  %wu = weight : bf16[32, 32]\n  %gu = matmul_cat(%xn2, %wg, %wu) : f32[T, 64]\n  %ga = slice(%gu) {axis = 1, start = 0, len = 32} : f32[T, 32]\n  %up = slice(%gu) {axis = 1, start = 32, len = 32} : f32[T, 32]\n  %h = silu_mul(%ga, %up) : f32[T, 32]\n  %wd = weight : bf16[32, 32]\n  %y = matmul_add(%h, %wd, %x3) {transpose_b = true} : f32[T, 32]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let opts = ScheduleOptions { norm_fusion: true, swiglu_down: true, attn_o_red: true, ..no_ws() };
    let steps = lower_opts(&g, opts).unwrap();
    let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
    let att = by("o");
    assert!(matches!(&att.kernel, Some(KernelSpec::AttentionO { n: 32, red: true, .. })), "{:?}", att.kernel);
    assert_eq!(att.args[9..], ["wo", "x", "y", "x3"]);
    let qkv = by("qkv");
    assert!(matches!(&qkv.kernel, Some(KernelSpec::ZeroFill { len: 32, .. })), "{:?}", qkv.kernel);
    assert_eq!(qkv.args[..3], ["x3", "y", "x"]);
    assert!(qkv.alternatives().all(|l| l.args.as_deref().is_some_and(|a| !a.contains(&"y".to_string()))));
    assert!(matches!(by("y").kernel, Some(KernelSpec::SwiGluDown { .. })));
    // the o GEMV: two rows and more, and one row past the fused attention's contexts
    let os: Vec<&Step> = steps.iter().filter(|s| s.node == "x3").collect();
    assert_eq!(os[0].min_rows, Some(2));
    if let Some(mc) = att.max_context {
        assert_eq!((os[1].max_rows, os[1].min_context), (Some(1), Some(mc + 1)));
        assert!(matches!(os[1].kernel, Some(KernelSpec::MatMulCopy { .. })));
    }
    // off: the o GEMV keeps one row, seeding the MLP
    let off = lower_opts(&g, ScheduleOptions { attn_o_red: false, ..opts }).unwrap();
    assert!(off.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::AttentionO { .. } | KernelSpec::ZeroFill { .. }))));
    assert!(matches!(off.iter().find(|s| s.node == "x3").unwrap().kernel, Some(KernelSpec::MatMulCopy { .. })));
}

#[test]
fn second_layer_computes_its_qkv_in_the_attention_in_clusters() {
    // two layers like the one above (2 heads of 32, a KV head, hidden 64): the second's
    // q/k/v GEMV folds into its attention
    let layer = |p: &str, x: &str| -> String {
        format!(
            "  %{p}g1 = weight : f32[64]\n  %{p}xn = rms_norm(%{x}, %{p}g1) {{eps = 0.00001}} : f32[T, 64]\n  %{p}wq = weight : bf16[64, 64]\n  %{p}wk = weight : bf16[32, 64]\n  %{p}wv = weight : bf16[32, 64]\n  %{p}wo = weight : bf16[64, 64]\n  %{p}kc = state : bf16[4, 4, 1, 32]\n  %{p}vc = state : bf16[4, 4, 1, 32]\n  %{p}qkv = matmul_cat(%{p}xn, %{p}wk, %{p}wq, %{p}wv) : f32[T, 128]\n  %{p}k = slice(%{p}qkv) {{axis = 1, start = 0, len = 32}} : f32[T, 32]\n  %{p}q = slice(%{p}qkv) {{axis = 1, start = 32, len = 64}} : f32[T, 64]\n  %{p}v = slice(%{p}qkv) {{axis = 1, start = 96, len = 32}} : f32[T, 32]\n  %{p}qh = reshape(%{p}q) : f32[T, 2, 32]\n  %{p}kh = reshape(%{p}k) : f32[T, 1, 32]\n  %{p}vh = reshape(%{p}v) : f32[T, 1, 32]\n  %{p}qr = rope(%{p}qh, %pos) {{theta = 10000.0, style = half, rotary_dim = 32}} : f32[T, 2, 32]\n  %{p}kw = rope_cache_write(%{p}kc, %{p}kh, %slots, %pos) {{theta = 10000.0, style = half, rotary_dim = 32}} : bf16[4, 4, 1, 32]\n  %{p}vw = cache_write(%{p}vc, %{p}vh, %slots) : bf16[4, 4, 1, 32]\n  %{p}o = paged_attention(%{p}qr, %{p}kw, %{p}vw, %pos, %seq, %table) {{scale = 0.17}} : f32[T, 2, 32]\n  %{p}of = reshape(%{p}o) : f32[T, 64]\n  %{p}x3 = matmul_add(%{p}of, %{p}wo, %{x}) {{transpose_b = true}} : f32[T, 64]\n  %{p}g2 = weight : f32[64]\n  %{p}xn2 = rms_norm(%{p}x3, %{p}g2) {{eps = 0.00001}} : f32[T, 64]\n  %{p}wg = weight : bf16[64, 64]\n  %{p}wu = weight : bf16[64, 64]\n  %{p}gu = matmul_cat(%{p}xn2, %{p}wg, %{p}wu) : f32[T, 128]\n  %{p}ga = slice(%{p}gu) {{axis = 1, start = 0, len = 64}} : f32[T, 64]\n  %{p}up = slice(%{p}gu) {{axis = 1, start = 64, len = 64}} : f32[T, 64]\n  %{p}h = silu_mul(%{p}ga, %{p}up) : f32[T, 64]\n  %{p}wd = weight : bf16[64, 64]\n  %{p}y = matmul_add(%{p}h, %{p}wd, %{p}x3) {{transpose_b = true}} : f32[T, 64]\n"
        )
    };
    let src = format!(
        "graph \"t\" {{\n  %x = input : f32[T, 64]\n  %pos = input : i32[T]\n  %slots = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n{}{}  output y = %by\n}}\n",
        layer("a", "x"),
        layer("b", "ay")
    );
    let g = text::parse(&src).unwrap();
    let opts = ScheduleOptions { norm_fusion: true, swiglu_down: true, attn_o_red: true, qkv_attn: true, ..no_ws() };
    let steps = lower_opts(&g, opts).unwrap();
    let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
    // the first layer as before (its GEMV follows no fused MLP)
    assert!(matches!(by("ao").kernel, Some(KernelSpec::AttentionO { .. })), "{:?}", by("ao").kernel);
    assert!(matches!(by("aqkv").kernel, Some(KernelSpec::ZeroFill { .. })));
    // the second: its attention reads x, g and W_q, W_k, W_v (named by their parts), in
    // clusters of its blocks per head; the first layer's MLP zeroes its accumulators
    let att = by("bo");
    assert!(matches!(&att.kernel, Some(KernelSpec::QkvAttentionO { k: 64, cluster: ATTN_O_SPLITS, .. })), "{:?}", att.kernel);
    assert_eq!(att.kernel.as_ref().unwrap().cluster(), Some(ATTN_O_SPLITS as u32));
    assert_eq!(att.args[..5], ["ay", "bg1", "bwq", "bwk", "bwv"]);
    assert_eq!(att.args[att.args.len() - 4..], ["bwo", "ay", "by", "bx3"]);
    assert!(att.alternatives().all(|l| l.args.as_deref().is_some_and(|a| a[0] == "bqh")));
    let mlp = by("ay");
    assert!(matches!(&mlp.kernel, Some(KernelSpec::ZeroFill { inner, len: 64 }) if matches!(inner.as_ref(), KernelSpec::SwiGluDown { .. })), "{:?}", mlp.kernel);
    assert_eq!(mlp.args[..3], ["bx3", "by", "ax3"]);
    // the GEMV: from two rows, and at one row only past the fused attention's contexts
    let qkvs: Vec<&Step> = steps.iter().filter(|s| s.node == "bqkv").collect();
    assert_eq!(qkvs[0].min_rows, Some(2));
    match att.max_context {
        Some(mc) => {
            assert_eq!((qkvs[1].max_rows, qkvs[1].min_context), (Some(1), Some(mc + 1)));
            assert!(matches!(qkvs[1].kernel, Some(KernelSpec::NormMatMul { .. })), "{:?}", qkvs[1].kernel);
            assert_eq!(qkvs[1].args[0], "ay");
        }
        None => assert_eq!(qkvs.len(), 1),
    }
    // off: every layer's GEMV zeroes
    let off = lower_opts(&g, ScheduleOptions { qkv_attn: false, ..opts }).unwrap();
    assert!(off.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::QkvAttentionO { .. }))));
    assert!(matches!(off.iter().find(|s| s.node == "bqkv").unwrap().kernel, Some(KernelSpec::ZeroFill { .. })));
    // Q4_1 weights (the GGUF plans): the same two kernels a layer, on Q4_1
    let q4 = src.replace("weight : bf16[", "weight : q4_1[");
    let steps = lower_opts(&text::parse(&q4).unwrap(), opts).unwrap();
    let att = steps.iter().find(|s| s.node == "bo").unwrap();
    let Some(KernelSpec::QkvAttentionO { inner, wdtype: DType::Q4_1, .. }) = &att.kernel else { panic!("{:?}", att.kernel) };
    assert!(matches!(inner.as_ref(), KernelSpec::AttentionO { wdtype: DType::Q4_1, red: true, .. }), "{inner:?}");
    assert!(matches!(&steps.iter().find(|s| s.node == "ay").unwrap().kernel, Some(KernelSpec::ZeroFill { inner, .. }) if matches!(inner.as_ref(), KernelSpec::SwiGluDown { wdtype: DType::Q4_1, .. })));
}

#[test]
fn rms_norm_stays_when_something_else_reads_it_or_the_gemv_cannot_take_it() {
    for (extra, dt) in [(true, "bf16"), (false, "q8_0")] {
        let steps = lower_opts(&graph(extra, dt), ScheduleOptions { norm_fusion: true, ..Default::default() }).unwrap();
        let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
        assert_eq!(by("xn").min_rows, None, "{dt}");
        assert!(!matches!(by("qk").kernel, Some(KernelSpec::NormMatMul { .. })));
        assert_eq!(by("qk").args[0], "xn");
    }
}

#[test]
fn the_logit_row_gather_folds_into_the_final_norm() {
    // (the model's tail: the rows that need logits gathered, normalized, then the head —
    // a vocabulary past the GEMV's norm prologue: 25.6 MB of head, as a real lm_head)
    let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %rows = input : i32[R]\n  %h = gather(%x, %rows) : f32[R, 64]\n  %g = weight : f32[64]\n  %n = rms_norm(%h, %g) {eps = 0.00001} : f32[R, 64]\n  %w = weight : bf16[200000, 64]\n  %y = matmul(%n, %w) {transpose_b = true} : f32[R, 200000]\n  output y = %y\n}\n";
    let g = text::parse(src).unwrap();
    let steps = lower(&g, &ScheduleOptions::default()).unwrap();
    assert!(steps.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::Gather { .. }))), "the gather stayed");
    let n = steps.iter().find(|s| s.node == "n").unwrap();
    assert!(matches!(&n.kernel, Some(KernelSpec::RowGather { .. })), "{:?}", n.kernel);
    assert_eq!(n.args[..3], ["rows", "x", "g"]);
    assert!(steps.iter().all(|s| !s.args.contains(&"h".to_string())));
    // (a gather something else reads too stays)
    let src2 = src.replace("  output y = %y", "  output y = %y\n  output h = %h");
    let steps = lower(&text::parse(&src2).unwrap(), &ScheduleOptions::default()).unwrap();
    assert!(steps.iter().any(|s| matches!(s.kernel, Some(KernelSpec::Gather { .. }))));
}

#[test]
fn the_final_norm_folds_into_the_wide_lm_head() {
    // (a small model's tail: 200,000 short bf16 rows — the wide GEMV, the gathered norm
    // folded into it at one row, the norm's own kernel from two rows)
    let src = "graph \"t\" {\n  %x = input : f32[T, 64]\n  %rows = input : i32[R]\n  %h = gather(%x, %rows) : f32[R, 64]\n  %g = weight : f32[64]\n  %n = rms_norm(%h, %g) {eps = 0.00001} : f32[R, 64]\n  %w = weight : bf16[200000, 64]\n  %y = matmul(%n, %w) {transpose_b = true} : f32[R, 200000]\n  output y = %y\n}\n";
    let steps = lower(&text::parse(src).unwrap(), &ScheduleOptions::default()).unwrap();
    let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
    let y = by("y");
    let Some(KernelSpec::RowGather { inner }) = &y.kernel else { panic!("{:?}", y.kernel) };
    let KernelSpec::NormMatMul { inner: wide, .. } = inner.as_ref() else { panic!("{inner:?}") };
    assert!(matches!(wide.as_ref(), KernelSpec::MatMulWide { k: 64, n: 200000, .. }), "{wide:?}");
    assert_eq!(y.args, ["rows", "x", "g", "w", "y"]);
    assert_eq!(by("n").min_rows, Some(2));
    // (the alternatives read the norm's output, or its 16-bit copy)
    assert!(y.alternatives().next().is_some() && y.alternatives().all(|l| l.args.as_deref().is_some_and(|a| a.first().is_some_and(|x| x == "n" || x.starts_with("n@")))));
    // (the norm read elsewhere too: it stays, the GEMV plain wide)
    let src2 = src.replace("  output y = %y", "  output y = %y\n  output n = %n");
    let steps = lower(&text::parse(&src2).unwrap(), &ScheduleOptions::default()).unwrap();
    let y = steps.iter().find(|s| s.node == "y").unwrap();
    assert!(matches!(y.kernel, Some(KernelSpec::MatMulWide { .. })), "{:?}", y.kernel);
    assert!(steps.iter().find(|s| s.node == "n").unwrap().min_rows.is_none());
    // (rows too long for a lane's registers, K = 1024: the split-K GEMV)
    let src3 = src.replace("64]", "1024]");
    let steps = lower(&text::parse(&src3).unwrap(), &ScheduleOptions::default()).unwrap();
    let y = steps.iter().find(|s| s.node == "y").unwrap();
    assert!(matches!(y.kernel, Some(KernelSpec::MatMul { .. })), "{:?}", y.kernel);
}

#[test]
fn the_embedding_gather_can_fold_into_the_first_gemv() {
    // (the gather of a bf16 table, then the one-row GEMV with the norm prologue reading x;
    // x is also needed after it, as the residual in a model — here a graph output)
    let src = "graph \"t\" {\n  %tok = input : i32[T]\n  %table = weight : bf16[100, 64]\n  %x = gather(%table, %tok) : f32[T, 64]\n  %g = weight : f32[64]\n  %xn = rms_norm(%x, %g) {eps = 0.00001} : f32[T, 64]\n  %w = weight : bf16[64, 64]\n  %y = matmul(%xn, %w) {transpose_b = true} : f32[T, 64]\n  output y = %y\n  output x = %x\n}\n";
    let g = text::parse(src).unwrap();
    let steps = lower(&g, &ScheduleOptions::default()).unwrap();
    // (folding twice changes nothing: the gather is bounded now)
    let steps = fold_embedding_gather(steps);
    let by = |n: &str| steps.iter().find(|s| s.node == n).unwrap();
    let y = by("y");
    assert!(matches!(&y.kernel, Some(KernelSpec::GatherX { .. })), "{:?}", y.kernel);
    assert_eq!(y.args[..4], ["table", "tok", "x", "g"]);
    // (more rows: the gather runs, the alternatives read x)
    assert_eq!(by("x").min_rows, Some(2));
    assert!(y.alternatives().next().is_some());
    assert!(y.alternatives().all(|l| l.args.as_deref().is_some_and(|a| !a.contains(&"table".to_string()))));
}

/// Every rewrite in [`REWRITES`] runs, in its order, where the options turn it on, each
/// followed by a verified schedule; the trace names them.
#[test]
fn every_rewrite_runs_in_order_and_each_result_verifies() {
    let all = ScheduleOptions { attn_o: true, attn_prefetch: true, lm_head_prefetch_mb: Some(1), moe_router: true, moe_prefetch: true, mla_cache_attention: true, ..Default::default() };
    let mut ran = vec![];
    let steps = lower_traced(&graph(true, "bf16"), &all, &mut |name, s| {
        ran.push(name.to_string());
        assert!(!s.is_empty());
    })
    .unwrap();
    let want: Vec<String> = std::iter::once("initial").chain(REWRITES.iter().map(|r| r.name)).map(String::from).collect();
    assert_eq!(ran, want);
    assert!(verify(&graph(true, "bf16"), &steps).is_ok());
    // with a rewrite off, it does not run
    let mut ran = vec![];
    lower_traced(&graph(true, "bf16"), &ScheduleOptions { split_k: None, ..Default::default() }, &mut |name, _| ran.push(name.to_string())).unwrap();
    assert!(!ran.iter().any(|n| n == "split-k" || n == "splitk-norm"), "{ran:?}");
    // the text form names every step
    let text = print(&steps);
    assert!(steps.iter().all(|s| text.contains(&format!("{} = ", s.node))));
}

/// The checks between rewrites catch a step naming a buffer nothing defines, an empty row or
/// context range, and a graph output left without a step.
#[test]
fn verify_names_what_a_broken_schedule_breaks() {
    let g = graph(false, "bf16");
    let good = lower(&g, &ScheduleOptions::default()).unwrap();
    let mut bad = good.clone();
    bad[0].args.push("nowhere".into());
    assert!(verify(&g, &bad).unwrap_err().contains("`nowhere`"));
    let mut bad = good.clone();
    (bad[0].min_rows, bad[0].max_rows) = (Some(8), Some(2));
    assert!(verify(&g, &bad).unwrap_err().contains("rows 8..=2"));
    let mut bad = good.clone();
    (bad[0].min_context, bad[0].max_context) = (Some(9), Some(1));
    assert!(verify(&g, &bad).unwrap_err().contains("contexts 9..=1"));
    let bad: Vec<Step> = good.iter().filter(|s| s.node != "y").cloned().collect();
    assert!(verify(&g, &bad).unwrap_err().contains("graph output `y`"));
}

/// W8A8: an `act_quant` to e4m3 in groups of 128 lowers to the quantizer (the node in f32 and
/// its e4m3 copy `{node}@rows{W}`), and a matmul reading it with f8g128 weights gets the FP8
/// GEMM first among its Hopper alternatives from the rows past the packed GEMV's, on the copy
/// (also merged); other groups, int8 activations or another weight format keep the GPU out
/// (a clear error) or the FP8 GEMM out.
#[test]
fn fp8_activations_lower_to_the_quantizer_and_the_fp8_gemm() {
    let (k, n) = (1024usize, 256usize);
    let src = format!(
        "graph \"t\" {{\n  %x = input : f32[T, {k}]\n  %q = act_quant(%x) {{dtype = f8e4m3, group = 128}} : f32[T, {k}]\n  %w = weight : f8g128[{n}, {k}]\n  %r = input : f32[T, {n}]\n  %a = matmul_add(%q, %w, %r) {{transpose_b = true}} : f32[T, {n}]\n  %w0 = weight : f8g128[128, {k}]\n  %w1 = weight : f8g128[128, {k}]\n  %c = matmul_cat(%q, %w0, %w1) : f32[T, 256]\n  %c0 = slice(%c) {{axis = 1, start = 0, len = 128}} : f32[T, 128]\n  output a = %a\n  output c0 = %c0\n}}\n"
    );
    let g = text::parse(&src).unwrap();
    let steps = lower_opts(&g, no_ws()).unwrap();
    let q = steps.iter().find(|s| s.node == "q").unwrap();
    assert_eq!(q.kernel, Some(KernelSpec::ActQuantF8 { d: k, group: 128 }));
    let copy = format!("q@rows{}", crate::kernels::f8_rows_width(k));
    assert_eq!(q.args, ["x".to_string(), "q".to_string(), copy.clone()]);
    let few_max = ScheduleOptions::default().gemv_few_max;
    let a = steps.iter().find(|s| s.node == "a").unwrap();
    let h = &a.hopper[0];
    assert!(matches!(h.kernel, KernelSpec::MatMulF8 { k: 1024, n: 256, residual: true, .. }), "{h:?}");
    assert_eq!((h.min_rows, h.max_rows), (few_max + 1, None));
    assert_eq!(h.args.as_ref().unwrap()[0], copy, "the GEMM reads the e4m3 copy");
    assert_eq!(a.args[0], "q", "the GEMVs read the f32 node");
    assert!(a.kernel.as_ref().unwrap().hopper_only() == false && h.kernel.hopper_only());
    let c = steps.iter().find(|s| s.node == "c").unwrap();
    assert!(matches!(&c.hopper[0].kernel, KernelSpec::MatMulParts { inner, parts } if matches!(inner.as_ref(), KernelSpec::MatMulF8 { .. }) && parts == &[128, 128]), "{:?}", c.hopper[0]);
    // int8 activations, or groups other than 128: the GPU lowering refuses, naming the node
    for attrs in ["dtype = i8, group = 128", "dtype = f8e4m3, group = 0"] {
        let src = format!("graph \"t\" {{\n  %x = input : f32[T, {k}]\n  %q = act_quant(%x) {{{attrs}}} : f32[T, {k}]\n  %w = weight : f8g128[{n}, {k}]\n  %a = matmul(%q, %w) {{transpose_b = true}} : f32[T, {n}]\n  output a = %a\n}}\n");
        let e = lower_opts(&text::parse(&src).unwrap(), no_ws()).unwrap_err().to_string();
        assert!(e.contains("q") && e.contains("fp8-g128"), "{e}");
    }
    // bf16 weights behind e4m3 activations: no FP8 GEMM (W8A8 needs both in 8 bits)
    let src = format!("graph \"t\" {{\n  %x = input : f32[T, {k}]\n  %q = act_quant(%x) {{dtype = f8e4m3, group = 128}} : f32[T, {k}]\n  %w = weight : bf16[{n}, {k}]\n  %a = matmul(%q, %w) {{transpose_b = true}} : f32[T, {n}]\n  output a = %a\n}}\n");
    let steps = lower_opts(&text::parse(&src).unwrap(), no_ws()).unwrap();
    let a = steps.iter().find(|s| s.node == "a").unwrap();
    assert!(a.hopper.iter().all(|h| !matches!(h.kernel, KernelSpec::MatMulF8 { .. })));
}
