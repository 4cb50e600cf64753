//! Kernel-check cases: the matmul family (`dsc_codegen::kernels::matmul`).

use super::*;

/// Matmul in every weight dtype and family (decode GEMV, batched GEMV, mma.sync, wgmma), with the residual add and merged parts.
pub(super) fn gemv_mma(cx: &mut Cx) -> anyhow::Result<()> {
    // matmul: x[M, K] @ W[N, K]^T for every weight dtype, decode (M = 1) and prefill-like M
    // (N = 512: the bundle, the runtime and the tracked files share one call's 64 MiB)
    let (k, n) = (576usize, 512usize);
    let wf = cx.r.vec(n * k, -0.1, 0.1);
    for wdtype in [DType::F32, DType::F16, DType::BF16, DType::Q8_0, DType::Q4_0, DType::Q4_1] {
        let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
        let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
        let warr = cx.data.push_u8(&wb);
        let spec = KernelSpec::MatMul { k, n, wdtype, bias: false, residual: false };
        // (and the wide GEMV, the small model's lm_head, over the first 500 of the 512 rows: a
        // partial block; at 1 and 3 rows where the plain one takes 1 and 7, one reference each)
        let nw = 500usize;
        let wide = dsc_codegen::kernels::wide_gemv_kernel_fits(k, wdtype).is_ok().then_some(KernelSpec::MatMulWide { k, n: nw, wdtype, bias: false, residual: false });
        let first_cols = |y: &[f32], m: usize| -> Vec<f32> { (0..m).flat_map(|r| y[r * n..r * n + nw].to_vec()).collect() };
        for m in [1usize, 3, 7] {
            let (plain, wide) = (m != 3, wide.as_ref().filter(|_| m != 7));
            if !plain && wide.is_none() {
                continue;
            }
            let x = cx.r.vec(m * k, -1.0, 1.0);
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
            let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
            let xa = cx.data.push(&x);
            let mut add = |name: String, spec: &KernelSpec, cols: usize, expected: Vec<f32>| {
                let (g, b) = grid(&spec.launch(), cols);
                cx.cases.push(Case {
                    name,
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y: m as u32,
                    block: b,
                    inputs: vec![xa.clone(), warr.clone()],
                    scalars: vec![cols as i64],
                    expected: cx.data.push(&expected),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
            };
            if plain {
                add(format!("matmul {m}x{k}x{n} {wdtype}"), &spec, n, want.clone());
            }
            if let Some(w) = wide {
                add(format!("matmul_wide {m}x{k}x{nw} {wdtype}"), w, nw, first_cols(&want, m));
            }
        }
        cx.specs.push(spec);
        // (bf16: the wide GEMV with the final norm and the logits' row gather folded in, rows
        // 8, 0, 4 of 9 hidden rows)
        if let Some(spec) = wide {
            let norm = KernelSpec::RowGather { inner: Box::new(KernelSpec::NormMatMul { inner: Box::new(spec.clone()), eps_bits: 1e-5f32.to_bits() }) };
            cx.specs.push(spec);
            if wdtype == DType::BF16 {
                let (t, pick) = (9usize, [8i32, 0, 4]);
                let m = pick.len();
                let hidden = cx.r.vec(t * k, -2.0, 2.0);
                let gw = cx.r.vec(k, 0.5, 1.5);
                let rows: Vec<f32> = pick.iter().flat_map(|&r| hidden[r as usize * k..(r as usize + 1) * k].to_vec()).collect();
                let mut wsn = ws.clone();
                wsn.insert("g".into(), (DType::F32, vec![k], dsc_ir::quant::encode(DType::F32, &gw).context("encode")?));
                let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %g = weight : f32[{k}]\n  %xn = rms_norm(%x, %g) {{eps = 0.00001}} : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%xn, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = reference(&src, vec![("x", Tensor::new(vec![m, k], rows))], &wsn)?;
                let (g, b) = grid(&norm.launch(), nw);
                cx.cases.push(Case {
                    name: format!("rms_norm+matmul_wide {m} of {t} rows gathered x{k}x{nw} {wdtype}"),
                    kernel: norm.symbol(),
                    grid: g,
                    grid_y: m as u32,
                    block: b,
                    inputs: vec![cx.data.push_i32(&pick), cx.data.push(&hidden), cx.data.push(&gw), warr.clone()],
                    scalars: vec![nw as i64],
                    expected: cx.data.push(&first_cols(&want, m)),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
                // (and with the greedy argmax folded in: the logits as above, each row's
                // first maximal index, the counters back at zero)
                let fold = KernelSpec::ArgmaxFold { inner: Box::new(norm.clone()) };
                let logits = first_cols(&want, m);
                let ids: Vec<f32> = (0..m)
                    .map(|r| {
                        let row = &logits[r * nw..(r + 1) * nw];
                        let best = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        row.iter().position(|&v| v == best).unwrap_or(0) as f32
                    })
                    .collect();
                let blocks = g as usize;
                cx.cases.push(Case {
                    name: format!("rms_norm+matmul_wide+argmax {m} of {t} rows gathered x{k}x{nw} {wdtype}"),
                    kernel: fold.symbol(),
                    grid: g,
                    grid_y: m as u32,
                    block: b,
                    inputs: vec![
                        cx.data.push(&vec![0.0; 2 * blocks * m]),
                        cx.data.push_i32(&vec![0; m]),
                        cx.data.push_i32(&vec![-1; m]),
                        cx.data.push_i32(&pick),
                        cx.data.push(&hidden),
                        cx.data.push(&gw),
                        warr.clone(),
                    ],
                    scalars: vec![nw as i64],
                    expected: cx.data.push(&logits),
                    init: None,
                    written_inputs: vec![(1, cx.data.push(&vec![0.0; m])), (2, cx.data.push(&ids))],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
                cx.specs.push(fold);
                cx.specs.push(norm);
            }
        }
        // the batched-decode GEMV (8 activation rows per block): a partial second row block
        if wdtype == DType::F32 || dsc_codegen::kernels::gemv_mma_weights(wdtype) {
            let rows = dsc_codegen::kernels::few_rows(wdtype);
            let spec = KernelSpec::MatMulFew { k, n, wdtype, bias: false, residual: false, rows };
            // bf16/f16 and GGUF blocks run on the tensor cores (activations rounded): bf16-level tolerance
            let tol = if wdtype == DType::F32 { 1e-5 } else { 1e-2 };
            for m in [2usize, 13, 37] {
                let x = cx.r.vec(m * k, -1.0, 1.0);
                let src =
                    format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
                let (g, b) = grid(&spec.launch(), n);
                cx.cases.push(Case {
                    name: format!("gemv_few {m}x{k}x{n} {wdtype}"),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y: grid_rows(&spec.launch(), m),
                    block: b,
                    inputs: vec![cx.data.push(&x), warr.clone()],
                    scalars: vec![m as i64, n as i64],
                    expected: cx.data.push(&want),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol,
                    cluster: None,
                });
            }
            cx.specs.push(spec);
        }
        // tensor cores (mma.sync, bf16/f16 operands, f32 accumulation): bf16-level tolerance
        let spec = KernelSpec::MatMulMma { k, n, wdtype, bias: false, residual: false };
        for m in [16usize, 37] {
            let x = cx.r.vec(m * k, -1.0, 1.0);
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
            let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
            let (g, b) = grid(&spec.launch(), n);
            cx.cases.push(Case {
                name: format!("mma {m}x{k}x{n} {wdtype}"),
                kernel: spec.symbol(),
                grid: g,
                grid_y: grid_rows(&spec.launch(), m),
                block: b,
                inputs: vec![cx.data.push(&x), warr.clone()],
                scalars: vec![m as i64, n as i64],
                expected: cx.data.push(&want),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            });
        }
        cx.specs.push(spec);
        // Hopper warpgroup MMA (sm_90a only), K a multiple of 64
        if k % 64 == 0 {
            // a partial tile everywhere, a full one and small M for two formats, both tile widths
            // (the bundle must stay under the 64 MiB a device call carries)
            let cases_m: Vec<(usize, usize)> = if matches!(wdtype, DType::BF16 | DType::Q4_1) { vec![(64, 16), (64, 77), (16, 2), (16, 64)] } else { vec![(64, 5), (16, 5)] };
            for (n_tile, m) in cases_m {
                let spec = KernelSpec::MatMulWgmma { k, n, wdtype, bias: false, residual: false, n_tile };
                let x = cx.r.vec(m * k, -1.0, 1.0);
                let src =
                    format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
                let (g, b) = grid(&spec.launch(), n);
                cx.specs.push(spec.clone());
                cx.cases.push(Case {
                    name: format!("wgmma{n_tile} {m}x{k}x{n} {wdtype}"),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y: grid_rows(&spec.launch(), m),
                    block: b,
                    inputs: vec![cx.data.push(&x), warr.clone()],
                    scalars: vec![m as i64, n as i64],
                    expected: cx.data.push(&want),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol: 1e-2,
                    cluster: None,
                });
            }
        }
    }
    // a longer K (the 8B shape's GEMVs have K = 4096 and 14336)
    for wdtype in [DType::BF16, DType::Q4_1] {
        let (k, n, m) = (2048usize, 99usize, 3usize);
        let wf = cx.r.vec(n * k, -0.1, 0.1);
        let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
        let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
        let x = cx.r.vec(m * k, -1.0, 1.0);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
        let spec = KernelSpec::MatMul { k, n, wdtype, bias: false, residual: false };
        let (g, b) = grid(&spec.launch(), n);
        let (xa, wa, ya) = (cx.data.push(&x), cx.data.push_u8(&wb), cx.data.push(&want));
        cx.cases.push(Case {
            name: format!("matmul {m}x{k}x{n} {wdtype}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: m as u32,
            block: b,
            inputs: vec![xa.clone(), wa.clone()],
            scalars: vec![n as i64],
            expected: ya.clone(),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        cx.specs.push(spec);
        if wdtype == DType::BF16 {
            // N = 99: a partial block of outputs in the batched GEMV too
            let spec = KernelSpec::MatMulFew { k, n, wdtype, bias: false, residual: false, rows: dsc_codegen::kernels::few_rows(wdtype) };
            let (g, b) = grid(&spec.launch(), n);
            cx.cases.push(Case {
                name: format!("gemv_few {m}x{k}x{n} {wdtype}"),
                kernel: spec.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![xa, wa],
                scalars: vec![m as i64, n as i64],
                expected: ya,
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            });
            cx.specs.push(spec);
        }
    }
    {
        let (k, n, m) = (576usize, 192usize, 5usize);
        let w = cx.r.vec(n * k, -0.1, 0.1);
        let wb = dsc_ir::quant::encode(DType::BF16, &w).context("encode")?;
        let bias = cx.r.vec(n, -1.0, 1.0);
        let ws: Weights = HashMap::from([("w".to_string(), (DType::BF16, vec![n, k], wb.clone())), ("bias".to_string(), (DType::F32, vec![n], bias.iter().flat_map(|v| v.to_le_bytes()).collect()))]);
        let x = cx.r.vec(m * k, -1.0, 1.0);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : bf16[{n}, {k}]\n  %bias = weight : f32[{n}]\n  %y = matmul(%x, %w, %bias) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
        let (xa, wa, ba, ya) = (cx.data.push(&x), cx.data.push_u8(&wb), cx.data.push(&bias), cx.data.push(&want));
        for few in [false, true] {
            let spec = if few {
                KernelSpec::MatMulFew { k, n, wdtype: DType::BF16, bias: true, residual: false, rows: 32 }
            } else {
                KernelSpec::MatMul { k, n, wdtype: DType::BF16, bias: true, residual: false }
            };
            let (g, b) = grid(&spec.launch(), n);
            cx.cases.push(Case {
                name: format!("{}+bias {m}x{k}x{n} bf16", if few { "gemv_few" } else { "matmul" }),
                kernel: spec.symbol(),
                grid: g,
                grid_y: grid_rows(&spec.launch(), m),
                block: b,
                inputs: vec![xa.clone(), wa.clone(), ba.clone()],
                scalars: if few { vec![m as i64, n as i64] } else { vec![n as i64] },
                expected: ya.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: if few { 1e-2 } else { 1e-5 },
                cluster: None,
            });
            cx.specs.push(spec);
        }
    }
    // the residual add as the matmul epilogue (matmul_add): GEMV, mma.sync and wgmma16
    {
        let (k, n) = (576usize, 192usize);
        let w = cx.r.vec(n * k, -0.1, 0.1);
        let wb = dsc_ir::quant::encode(DType::BF16, &w).context("encode")?;
        let ws: Weights = HashMap::from([("w".to_string(), (DType::BF16, vec![n, k], wb.clone()))]);
        let warr = cx.data.push_u8(&wb);
        for (kind, m) in [("gemv", 3usize), ("few", 11), ("mma", 16), ("wgmma16", 5)] {
            let x = cx.r.vec(m * k, -1.0, 1.0);
            let r = cx.r.vec(m * n, -1.0, 1.0);
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %r = input : f32[{m}, {n}]\n  %w = weight : bf16[{n}, {k}]\n  %y = matmul_add(%x, %w, %r) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
            let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone())), ("r", Tensor::new(vec![m, n], r.clone()))], &ws)?;
            let (spec, grid_y, scalars, tol) = match kind {
                "gemv" => (KernelSpec::MatMul { k, n, wdtype: DType::BF16, bias: false, residual: true }, m as u32, vec![n as i64], 1e-5),
                "few" => (KernelSpec::MatMulFew { k, n, wdtype: DType::BF16, bias: false, residual: true, rows: 32 }, m.div_ceil(32) as u32, vec![m as i64, n as i64], 1e-2),
                "mma" => (KernelSpec::MatMulMma { k, n, wdtype: DType::BF16, bias: false, residual: true }, m.div_ceil(16) as u32, vec![m as i64, n as i64], 1e-2),
                _ => (KernelSpec::MatMulWgmma { k, n, wdtype: DType::BF16, bias: false, residual: true, n_tile: 16 }, m.div_ceil(64) as u32, vec![m as i64, n as i64], 1e-2),
            };
            let (g, b) = grid(&spec.launch(), n);
            cx.cases.push(Case {
                name: format!("matmul_add {kind} {m}x{k}x{n} bf16"),
                kernel: spec.symbol(),
                grid: g,
                grid_y,
                block: b,
                inputs: vec![cx.data.push(&x), warr.clone(), cx.data.push(&r)],
                scalars,
                expected: cx.data.push(&want),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol,
                cluster: None,
            });
            cx.specs.push(spec);
        }
    }
    // merged matmuls (matmul_cat: Q/K/V-like parts of one input), output part-major, in every
    // kernel family: decode GEMV, batched GEMV, mma.sync, wgmma 16/64; a packed format's GEMV
    {
        let (k, parts) = (576usize, [128usize, 64, 192]);
        let total: usize = parts.iter().sum();
        for wdtype in [DType::BF16, DType::Q4_1] {
            let (enc, ws, decl) = part_weights(&parts, k, wdtype, &mut cx.r)?;
            let warrs: Vec<Array> = enc.iter().map(|b| cx.data.push_u8(b)).collect();
            let kinds: &[(&str, usize)] = if wdtype == DType::BF16 { &[("gemv", 1), ("few", 11), ("mma", 37), ("wgmma16", 5), ("wgmma64", 77)] } else { &[("gemv", 2), ("mma", 16)] };
            for &(kind, m) in kinds {
                let x = cx.r.vec(m * k, -1.0, 1.0);
                let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1, %w2) : f32[{m}, {total}]\n  output y = %y\n}}\n");
                let rowmajor = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
                let want = part_major(&rowmajor, m, &parts);
                let (inner, grid_y, mut scalars, tol) = match kind {
                    "gemv" => (KernelSpec::MatMul { k, n: total, wdtype, bias: false, residual: false }, m as u32, vec![total as i64], if wdtype == DType::BF16 { 1e-5 } else { 1e-4 }),
                    "few" => (KernelSpec::MatMulFew { k, n: total, wdtype, bias: false, residual: false, rows: 32 }, m.div_ceil(32) as u32, vec![m as i64, total as i64], 1e-2),
                    "mma" => (KernelSpec::MatMulMma { k, n: total, wdtype, bias: false, residual: false }, m.div_ceil(16) as u32, vec![m as i64, total as i64], 1e-2),
                    "wgmma16" => (KernelSpec::MatMulWgmma { k, n: total, wdtype, bias: false, residual: false, n_tile: 16 }, m.div_ceil(64) as u32, vec![m as i64, total as i64], 1e-2),
                    _ => (KernelSpec::MatMulWgmma { k, n: total, wdtype, bias: false, residual: false, n_tile: 64 }, m.div_ceil(64) as u32, vec![m as i64, total as i64], 1e-2),
                };
                scalars.push(m as i64);
                let spec = KernelSpec::MatMulParts { inner: Box::new(inner), parts: parts.to_vec() };
                let (g, b) = grid(&spec.launch(), total);
                let mut inputs = vec![cx.data.push(&x)];
                inputs.extend(warrs.iter().cloned());
                cx.cases.push(Case {
                    name: format!("matmul_cat {kind} {m}x{k}x({}) {wdtype}", parts.map(|p| p.to_string()).join("+")),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y,
                    block: b,
                    inputs,
                    scalars,
                    expected: cx.data.push(&want),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol,
                    cluster: None,
                });
                cx.specs.push(spec);
            }
        }
    }
    Ok(())
}

/// The pipelined prefill matmul (sm_90a) in the plans' tilings and their TMA / warp-specialized variants; the batched GEMV over 16-bit x; matmul_act.
pub(super) fn pipe(cx: &mut Cx) -> anyhow::Result<()> {
    // the pipelined prefill matmul (sm_90a): partial M and N tiles, more K steps than stages
    // (the stage ring wraps; an odd count: the overlapped loop's tail step), both 16-bit
    // weight formats, a residual, and merged parts; in the plans' tiling and the sweep's others
    // (a16: x arrives in 16 bits, as the ToHalf step writes it; the reference rounds nothing,
    // as the f32-x kernels round x on the way in)
    use dsc_codegen::kernels::PipeTiling as T;
    // (and their TMA variants, on by default for the 128-row tiles of at most 128 columns:
    // every tiling here; `ScheduleOptions::tma` off leaves them out. An mbarrier wait that
    // never completes would hang the whole check: gpu-check.sh runs it under `timeout`)
    let with_tma = cx.opts.schedule.tma != dsc_codegen::schedule::Tma::Off;
    // (and the 64-row tiles of batched decode: the warpgroups split the columns)
    let tilings = [
        dsc_codegen::kernels::pipe_tiling(4096),
        dsc_codegen::kernels::pipe_tiling(6144),
        T { bn: 256, stages: 3, overlap: true, a16: false, bm: dsc_codegen::kernels::PIPE_BM },
        dsc_codegen::kernels::pipe64_tiling(4096),
        // (224-wide tiles: the 8B shape's gate/up)
        dsc_codegen::kernels::pipe64_tiling(28672),
        dsc_codegen::kernels::pipe64_tiling(128256),
    ];
    for (i, &T { bn, stages, overlap, a16, bm }) in tilings.iter().enumerate() {
        if tilings[..i].contains(&tilings[i]) {
            continue;
        }
        // (an odd number of K steps past the stage count)
        let k = 64 * (stages + 1 + stages % 2);
        // (and fewer rows than one tile: batched decode from 16 rows runs it)
        for (wdtype, m, n, residual) in [(DType::BF16, 150usize, bn + 40, false), (DType::F16, 131, bn, true), (DType::BF16, 128, bn, true), (DType::BF16, 20, bn + 8, true)] {
            let wf = cx.r.vec(n * k, -0.1, 0.1);
            let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
            let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
            let x = cx.r.vec(m * k, -1.0, 1.0);
            let r = cx.r.vec(m * n, -1.0, 1.0);
            let want = matmul_reference(&x, residual.then_some(&r[..]), m, k, n, wdtype, &ws)?;
            let spec = KernelSpec::MatMulPipe { k, n, wdtype, bias: false, residual, bn, stages, overlap, a16, bm };
            let (g, b) = grid(&spec.launch(), n);
            let xa = if a16 { cx.data.push_u8(&dsc_ir::quant::encode(wdtype, &x).context("encode")?) } else { cx.data.push(&x) };
            let mut ins = vec![xa, cx.data.push_u8(&wb)];
            if residual {
                ins.push(cx.data.push(&r));
            }
            let case = Case {
                name: format!(
                    "matmul_pipe{bn}s{stages}{}{}{} {m}x{k}x{n} {wdtype}{}",
                    if overlap { "o" } else { "" },
                    if a16 { " x16" } else { "" },
                    if bm == 64 { " m64" } else { "" },
                    if residual { " +res" } else { "" }
                ),
                kernel: spec.symbol(),
                grid: g,
                grid_y: grid_rows(&spec.launch(), m),
                block: b,
                inputs: ins,
                scalars: vec![m as i64, n as i64],
                expected: cx.data.push(&want),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            };
            // ... and with W by TMA (DSC_TMA): W's tensor map in its place
            let tma = with_tma.then(|| tma_variant(&case, &spec, vec![TmapInput { input: 1, n, k, rows: bn as u32, f16: wdtype == DType::F16, pool: None }]));
            // ... and warp-specialized (DSC_GEMM_WS): x's map too
            if let Some((c, s)) = ws_variant(&case, &spec, m, k, wdtype == DType::F16, &[n]) {
                cx.cases.push(c);
                cx.specs.push(s);
            }
            cx.cases.push(case);
            cx.specs.push(spec);
            cx.cases.extend(tma.iter().map(|t| t.0.clone()));
            cx.specs.extend(tma.map(|t| t.1));
        }
        let parts = [bn, 2 * bn];
        let total: usize = parts.iter().sum();
        let (enc, ws, decl) = part_weights(&parts, k, DType::BF16, &mut cx.r)?;
        let m = 140usize;
        let x = cx.r.vec(m * k, -1.0, 1.0);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1) : f32[{m}, {total}]\n  output y = %y\n}}\n");
        let want = part_major(&reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?, m, &parts);
        let spec =
            KernelSpec::MatMulParts { inner: Box::new(KernelSpec::MatMulPipe { k, n: total, wdtype: DType::BF16, bias: false, residual: false, bn, stages, overlap, a16, bm }), parts: parts.to_vec() };
        let (g, b) = grid(&spec.launch(), total);
        let mut inputs = vec![if a16 { cx.data.push_u8(&dsc_ir::quant::encode(DType::BF16, &x).context("encode")?) } else { cx.data.push(&x) }];
        inputs.extend(enc.iter().map(|w| cx.data.push_u8(w)));
        let case = Case {
            name: format!(
                "matmul_cat pipe{bn}s{stages}{}{}{} {m}x{k}x({}+{}) bf16",
                if overlap { "o" } else { "" },
                if a16 { " x16" } else { "" },
                if bm == 64 { " m64" } else { "" },
                parts[0],
                parts[1]
            ),
            kernel: spec.symbol(),
            grid: g,
            grid_y: grid_rows(&spec.launch(), m),
            block: b,
            inputs,
            scalars: vec![m as i64, total as i64, m as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        };
        if let Some((c, s)) = ws_variant(&case, &spec, m, k, false, &parts) {
            cx.cases.push(c);
            cx.specs.push(s);
        }
        cx.cases.push(case);
        cx.specs.push(spec);
        // ... and as the gate/up matmul with the SwiGLU in its epilogue (SwiGluPipe, x in 16
        // bits): h over a NaN-filled buffer, its 16-bit copy the output; two blocks of
        // features, rows past one tile
        let f = bn;
        if a16 && dsc_codegen::kernels::swiglu_pipe_fits(2 * f, bn, bm) {
            let (enc, ws, decl) = part_weights(&[f, f], k, DType::BF16, &mut cx.r)?;
            let m = 70usize;
            let x = cx.r.vec(m * k, -1.0, 1.0);
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1) : f32[{m}, {}]\n  output y = %y\n}}\n", 2 * f);
            let gu = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
            let h: Vec<f32> = (0..m * f).map(|i| (i / f, i % f)).map(|(r, c)| (gu[r * 2 * f + c], gu[r * 2 * f + f + c])).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
            let half = dsc_ir::quant::encode(DType::BF16, &h).context("encode")?;
            let words: Vec<f32> = le_words(&half);
            let spec = KernelSpec::SwiGluPipe { inner: Box::new(KernelSpec::MatMulPipe { k, n: 2 * f, wdtype: DType::BF16, bias: false, residual: false, bn, stages, overlap, a16, bm }) };
            let (g, b) = grid(&spec.launch(), 2 * f);
            let mut inputs = vec![cx.data.push_u8(&dsc_ir::quant::encode(DType::BF16, &x).context("encode")?)];
            inputs.extend(enc.iter().map(|w| cx.data.push_u8(w)));
            inputs.push(cx.data.push(&vec![f32::NAN; m * f]));
            let case = Case {
                name: format!("swiglu pipe{bn}s{stages}{}{} {m}x{k}x2x{f} bf16", if overlap { "o" } else { "" }, if bm == 64 { " m64" } else { "" }),
                kernel: spec.symbol(),
                grid: g,
                grid_y: grid_rows(&spec.launch(), m),
                block: b,
                inputs,
                scalars: vec![m as i64, f as i64],
                expected: cx.data.push(&words),
                init: None,
                written_inputs: vec![(3, cx.data.push(&h))],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            };
            // ... warp-specialized too (the 128-row tiles)
            if let Some((c, s)) = ws_variant(&case, &spec, m, k, false, &[f, f]) {
                cx.cases.push(c);
                cx.specs.push(s);
            }
            cx.cases.push(case);
            cx.specs.push(spec);
        }
    }
    // the batched-decode GEMV reading x in 16 bits (MatMulFewX16, DSC_FEW_X16=1): partial B
    // tiles, both 16-bit formats and the GGUF blocks (x in f16), a residual, merged parts
    for (wdtype, m, n, residual, parts) in [
        (DType::BF16, 11usize, 192usize, false, None),
        (DType::F16, 29, 64, true, None),
        (DType::BF16, 7, 384, false, Some([128usize, 256])),
        (DType::Q4_1, 37, 192, true, None),
        (DType::Q4_1, 7, 384, false, Some([128usize, 256])),
        (DType::Q8_0, 21, 192, true, None),
        (DType::Q4_0, 16, 64, false, None),
    ] {
        let k = 576usize;
        let x = cx.r.vec(m * k, -1.0, 1.0);
        let xdt = if dsc_codegen::kernels::tensor_core_f16(wdtype) { DType::F16 } else { DType::BF16 };
        let xa = cx.data.push_u8(&dsc_ir::quant::encode(xdt, &x).context("encode")?);
        let inner = KernelSpec::MatMulFewX16 { k, n, wdtype, bias: false, residual };
        let (spec, inputs, want, scalars) = match parts {
            None => {
                let wb = dsc_ir::quant::encode(wdtype, &cx.r.vec(n * k, -0.1, 0.1)).context("encode")?;
                let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
                let r = cx.r.vec(m * n, -1.0, 1.0);
                let want = matmul_reference(&x, residual.then_some(&r[..]), m, k, n, wdtype, &ws)?;
                let mut inputs = vec![xa, cx.data.push_u8(&wb)];
                if residual {
                    inputs.push(cx.data.push(&r));
                }
                (inner, inputs, want, vec![m as i64, n as i64])
            }
            Some(p) => {
                let (enc, ws, decl) = part_weights(&p, k, wdtype, &mut cx.r)?;
                let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1) : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = part_major(&reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?, m, &p);
                let mut inputs = vec![xa];
                inputs.extend(enc.iter().map(|w| cx.data.push_u8(w)));
                (KernelSpec::MatMulParts { inner: Box::new(inner), parts: p.to_vec() }, inputs, want, vec![m as i64, n as i64, m as i64])
            }
        };
        let (g, b) = grid(&spec.launch(), n);
        cx.cases.push(Case {
            name: format!("few x16 {m}x{k}x{n} {wdtype}{}{}", if residual { " +res" } else { "" }, if parts.is_some() { " parts" } else { "" }),
            kernel: spec.symbol(),
            grid: g,
            grid_y: grid_rows(&spec.launch(), m),
            block: b,
            inputs,
            scalars,
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // matmul_act (bias + activation in the epilogue; the matmul-act rule's kernels) in each
    // matmul family the step may run: decode GEMV (bf16 and a packed format), batched GEMV,
    // mma.sync, wgmma16 and the pipelined prefill matmul (x in bf16); one x and W, prefixes
    {
        let (k, n) = (576usize, 192usize);
        let x = cx.r.vec(150 * k, -1.0, 1.0);
        let xa = cx.data.push(&x);
        let x16 = cx.data.push_u8(&dsc_ir::quant::encode(DType::BF16, &x).context("encode")?);
        let wf = cx.r.vec(n * k, -0.1, 0.1);
        let bias = cx.r.vec(n, -0.5, 0.5);
        let ba = cx.data.push(&bias);
        for wdtype in [DType::BF16, DType::Q4_1] {
            let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
            let wa = cx.data.push_u8(&wb);
            let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb)), ("b".to_string(), (DType::F32, vec![n], bias.iter().flat_map(|v| v.to_le_bytes()).collect()))]);
            let kinds: &[(&str, usize)] = if wdtype == DType::BF16 { &[("gemv", 1), ("few", 11), ("mma", 37), ("wgmma16", 5), ("pipe", 150)] } else { &[("gemv", 2)] };
            for &(kind, m) in kinds {
                let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %b = weight : f32[{n}]\n  %y = matmul_act(%x, %w, %b) {{transpose_b = true, act = gelu}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x[..m * k].to_vec()))], &ws)?;
                let (inner, grid_y, scalars, tol) = match kind {
                    "gemv" => (KernelSpec::MatMul { k, n, wdtype, bias: true, residual: false }, m as u32, vec![n as i64], 1e-4),
                    "few" => (KernelSpec::MatMulFew { k, n, wdtype, bias: true, residual: false, rows: 32 }, m.div_ceil(32) as u32, vec![m as i64, n as i64], 1e-2),
                    "mma" => (KernelSpec::MatMulMma { k, n, wdtype, bias: true, residual: false }, m.div_ceil(16) as u32, vec![m as i64, n as i64], 1e-2),
                    "wgmma16" => (KernelSpec::MatMulWgmma { k, n, wdtype, bias: true, residual: false, n_tile: 16 }, m.div_ceil(64) as u32, vec![m as i64, n as i64], 1e-2),
                    _ => {
                        let t = dsc_codegen::kernels::pipe_tiling(n);
                        (
                            KernelSpec::MatMulPipe { k, n, wdtype, bias: true, residual: false, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: t.a16, bm: t.bm },
                            m.div_ceil(dsc_codegen::kernels::PIPE_BM) as u32,
                            vec![m as i64, n as i64],
                            1e-2,
                        )
                    }
                };
                let x_in = if kind == "pipe" { x16.clone() } else { xa.clone() };
                let spec = KernelSpec::MatMulAct { inner: Box::new(inner), act: UnaryOpKey(UnaryOp::Gelu) };
                let (g, b) = grid(&spec.launch(), n);
                cx.cases.push(Case {
                    name: format!("matmul_act gelu {kind} {m}x{k}x{n} {wdtype}"),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y,
                    block: b,
                    inputs: vec![Array { len: m * k * if kind == "pipe" { 2 } else { 1 }, ..x_in }, wa.clone(), ba.clone()],
                    scalars,
                    expected: cx.data.push(&want),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol,
                    cluster: None,
                });
                cx.specs.push(spec);
            }
        }
    }
    Ok(())
}

/// Split-K: partial sums, the reduce pass, the reduce folded into the next RMSNorm.
pub(super) fn split_k(cx: &mut Cx) -> anyhow::Result<()> {
    let with_tma = cx.opts.schedule.tma != dsc_codegen::schedule::Tma::Off;
    // split-K (DSC_SPLIT_K, batched decode of few column tiles): each block's K part of the
    // 64-row pipelined tile into its slice of the partial sums (checked against the matmul of
    // that K slice), then the reduce pass adding them and the residual
    for (sk, wdtype, m) in [(4usize, DType::BF16, 40usize), (2, DType::F16, 40), (4, DType::BF16, 100)] {
        let t = dsc_codegen::kernels::pipe64_tiling(4096);
        // (an odd number of K steps per part, fewer rows than the tile or two row tiles, the
        // second partial; whole column tiles, which split-K requires)
        let (k, n) = (64 * sk * 3, 2 * t.bn);
        let wf = cx.r.vec(n * k, -0.1, 0.1);
        let x = cx.r.vec(m * k, -1.0, 1.0);
        let r = cx.r.vec(m * n, -1.0, 1.0);
        let kp = k / sk;
        let mut partials = vec![];
        for part in 0..sk {
            let cols = |v: &[f32], rows: usize| -> Vec<f32> { (0..rows).flat_map(|i| v[i * k + part * kp..i * k + (part + 1) * kp].to_vec()).collect() };
            let wp = dsc_ir::quant::encode(wdtype, &cols(&wf, n)).context("encode")?;
            let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, kp], wp))]);
            partials.extend(matmul_reference(&cols(&x, m), None, m, kp, n, wdtype, &ws)?);
        }
        let inner = KernelSpec::MatMulPipe { k, n, wdtype, bias: false, residual: false, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: true, bm: 64 };
        let spec = KernelSpec::SplitK { inner: Box::new(inner), splits: sk };
        let (g, b) = grid(&spec.launch(), n);
        let pa = cx.data.push(&partials);
        cx.cases.push(Case {
            name: format!("matmul_pipe{}s{} m64 split-K {sk} {m}x{k}x{n} {wdtype}", t.bn, t.stages),
            kernel: spec.symbol(),
            grid: g,
            grid_y: grid_rows(&spec.launch(), m),
            block: b,
            inputs: vec![cx.data.push_u8(&dsc_ir::quant::encode(wdtype, &x).context("encode")?), cx.data.push_u8(&dsc_ir::quant::encode(wdtype, &wf).context("encode")?)],
            scalars: vec![m as i64, n as i64],
            expected: pa.clone(),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        });
        cx.specs.push(spec);
        let want: Vec<f32> = (0..m * n).map(|i| (0..sk).map(|p| partials[p * m * n + i]).sum::<f32>() + r[i]).collect();
        let spec = KernelSpec::SplitKReduce { splits: sk, residual: true };
        let (g, b) = grid(&spec.launch(), m * n);
        cx.cases.push(Case {
            name: format!("splitk reduce {sk} {m}x{n} +res"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![pa, cx.data.push(&r)],
            scalars: vec![(m * n) as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // ... and over a merged matmul (q/k/v: parts of whole column tiles), each K slice's
    // partial sums part-major like the merged output
    {
        let sk = 2usize;
        let t = dsc_codegen::kernels::pipe64_tiling(4096);
        let parts = vec![t.bn, 2 * t.bn];
        let (m, k, n) = (40usize, 64 * sk * 3, 3 * t.bn);
        let kp = k / sk;
        let ws: Vec<Vec<f32>> = parts.iter().map(|&p| cx.r.vec(p * k, -0.1, 0.1)).collect();
        let x = cx.r.vec(m * k, -1.0, 1.0);
        let mut partials = vec![];
        for part in 0..sk {
            let cols = |v: &[f32], rows: usize| -> Vec<f32> { (0..rows).flat_map(|i| v[i * k + part * kp..i * k + (part + 1) * kp].to_vec()).collect() };
            for (w, &p) in ws.iter().zip(&parts) {
                let wp = dsc_ir::quant::encode(DType::BF16, &cols(w, p)).context("encode")?;
                let wt: Weights = HashMap::from([("w".to_string(), (DType::BF16, vec![p, kp], wp))]);
                partials.extend(matmul_reference(&cols(&x, m), None, m, kp, p, DType::BF16, &wt)?);
            }
        }
        let pipe = KernelSpec::MatMulPipe { k, n, wdtype: DType::BF16, bias: false, residual: false, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: true, bm: 64 };
        let spec = KernelSpec::SplitK { inner: Box::new(KernelSpec::MatMulParts { inner: Box::new(pipe), parts: parts.clone() }), splits: sk };
        let (g, b) = grid(&spec.launch(), n);
        let mut inputs = vec![cx.data.push_u8(&dsc_ir::quant::encode(DType::BF16, &x).context("encode")?)];
        for w in &ws {
            inputs.push(cx.data.push_u8(&dsc_ir::quant::encode(DType::BF16, w).context("encode")?));
        }
        let case = Case {
            name: format!("matmul_cat pipe{}s{} m64 split-K {sk} {m}x{k}x({}+{}) bf16", t.bn, t.stages, parts[0], parts[1]),
            kernel: spec.symbol(),
            grid: g,
            grid_y: grid_rows(&spec.launch(), m),
            block: b,
            inputs,
            scalars: vec![m as i64, n as i64, m as i64],
            expected: cx.data.push(&partials),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        };
        // ... and with W by TMA: each part's tensor map; and warp-specialized
        let tma = with_tma.then(|| tma_variant(&case, &spec, parts.iter().enumerate().map(|(i, &p)| TmapInput { input: 1 + i, n: p, k, rows: t.bn as u32, f16: false, pool: None }).collect()));
        if let Some((c, s)) = ws_variant(&case, &spec, m, k, false, &parts) {
            cx.cases.push(c);
            cx.specs.push(s);
        }
        cx.cases.push(case);
        cx.specs.push(spec);
        cx.cases.extend(tma.iter().map(|t| t.0.clone()));
        cx.specs.extend(tma.map(|t| t.1));
    }
    // the split-K reduce folded into the RMSNorm after it: y (the parts' sum + the residual)
    // and the normalized x written over NaN-filled buffers, the 16-bit copy (or x) the output
    // (and in thread-block clusters of 4 and 8 blocks per row, sm_90a)
    for (sk, residual, rows, d, half, cluster) in
        [(4usize, true, 5usize, 2048usize, Some(false), 1usize), (2, false, 3, 1000, None, 1), (4, true, 5, 4096, Some(false), 4), (2, false, 3, 1024, Some(true), 8)]
    {
        let eps = 1e-5f32;
        let parts = cx.r.vec(sk * rows * d, -1.0, 1.0);
        let r = cx.r.vec(rows * d, -1.0, 1.0);
        let y: Vec<f32> = (0..rows * d).map(|i| (0..sk).map(|p| parts[p * rows * d + i]).sum::<f32>() + if residual { r[i] } else { 0.0 }).collect();
        let w = cx.r.vec(d, 0.5, 1.5);
        let ws: Weights = HashMap::from([("w".to_string(), (DType::F32, vec![d], w.iter().flat_map(|v| v.to_le_bytes()).collect()))]);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %w = weight : f32[{d}]\n  %y = rms_norm(%x, %w) {{eps = {eps:?}}} : f32[{rows}, {d}]\n  output y = %y\n}}\n");
        let xn = reference(&src, vec![("x", Tensor::new(vec![rows, d], y.clone()))], &ws)?;
        let spec = KernelSpec::SplitKReduceNorm { splits: sk, residual, d, eps_bits: eps.to_bits(), half, cluster };
        let (g, b) = grid(&spec.launch(), rows);
        let poison = cx.data.push(&vec![f32::NAN; rows * d]);
        let mut inputs = vec![cx.data.push(&parts)];
        if residual {
            inputs.push(cx.data.push(&r));
        }
        let yi = inputs.len();
        inputs.extend([poison.clone(), cx.data.push(&w)]);
        let (expected, mut written) = match half {
            Some(f16) => {
                let h = dsc_ir::quant::encode(if f16 { DType::F16 } else { DType::BF16 }, &xn).context("encode")?;
                let words: Vec<f32> = le_words(&h);
                inputs.push(poison.clone());
                (cx.data.push(&words), vec![(yi + 2, cx.data.push(&xn))])
            }
            None => (cx.data.push(&xn), vec![]),
        };
        written.insert(0, (yi, cx.data.push(&y)));
        cx.cases.push(Case {
            name: format!(
                "splitk reduce {sk}{} + rms_norm {rows}x{d}{}{}",
                if residual { " +res" } else { "" },
                match half {
                    Some(true) => " + f16 copy",
                    Some(false) => " + bf16 copy",
                    None => "",
                },
                if cluster > 1 { format!(" in clusters of {cluster}") } else { String::new() }
            ),
            kernel: spec.symbol(),
            grid: g,
            grid_y: cluster as u32,
            block: b,
            inputs,
            scalars: vec![rows as i64],
            expected,
            init: None,
            written_inputs: written,
            tmaps: vec![],
            tol: 1e-2,
            cluster: spec.cluster(),
        });
        cx.specs.push(spec);
    }
    Ok(())
}

/// The packed GEMV on the tensor cores (`MatMulPacked`, dsc's i4g128 or f8g128 weights) at
/// every tile count, with a partial block of outputs, rows past a tile, bias and residual; the
/// RMSNorm fold, the wgmma prefill matmul and the embedding gather on the same format.
pub(super) fn packed(cx: &mut Cx, wdtype: DType) -> anyhow::Result<()> {
    let (k, n) = (1536usize, 100usize);
    let f = if wdtype == DType::F8G128 { "f8" } else { "i4" };
    let wf = cx.r.vec(n * k, -0.1, 0.1);
    let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
    let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
    let warr = cx.data.push_u8(&wb);
    let bias = cx.r.vec(n, -1.0, 1.0);
    let (ba, mut specs) = (cx.data.push(&bias), vec![]);
    for (tiles, m, extra) in [(0usize, 1usize, false), (0, 3, true), (1, 1, false), (1, 5, true), (2, 13, false), (2, 29, false), (2, 40, true)] {
        let x = cx.r.vec(m * k, -1.0, 1.0);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
        let mut want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
        let spec = KernelSpec::MatMulPacked { wdtype, k, n, tiles, walk: 1, bias: extra, residual: extra };
        let mut inputs = vec![cx.data.push(&x), warr.clone()];
        if extra {
            let res = cx.r.vec(m * n, -1.0, 1.0);
            for (i, w) in want.iter_mut().enumerate() {
                *w += bias[i % n] + res[i];
            }
            inputs.push(ba.clone());
            inputs.push(cx.data.push(&res));
        }
        let (g, b) = grid(&spec.launch(), n);
        cx.cases.push(Case {
            name: format!("matmul_{f} t{tiles} {m}x{k}x{n}{}", if extra { " bias res" } else { "" }),
            kernel: spec.symbol(),
            grid: g,
            grid_y: grid_rows(&spec.launch(), m),
            block: b,
            inputs,
            scalars: vec![m as i64, n as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        });
        if !specs.contains(&spec) {
            specs.push(spec);
        }
        if m == 40 {
            // prefill-sized rows: the wgmma matmul dequantizing eight values at a time
            let spec = KernelSpec::MatMulWgmma { k, n, wdtype, bias: false, residual: false, n_tile: 64 };
            let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
            let (g, b) = grid(&spec.launch(), n);
            cx.cases.push(Case {
                name: format!("wgmma64 {m}x{k}x{n} {wdtype}"),
                kernel: spec.symbol(),
                grid: g,
                grid_y: grid_rows(&spec.launch(), m),
                block: b,
                inputs: vec![cx.data.push(&x), warr.clone()],
                scalars: vec![m as i64, n as i64],
                expected: cx.data.push(&want),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            });
            specs.push(spec);
        }
    }
    cx.specs.extend(specs);
    // one row with the RMSNorm folded into the staging of x (`NormMatMul`), two rows
    {
        let m = 2usize;
        let x = cx.r.vec(m * k, -2.0, 2.0);
        let gw = cx.r.vec(k, 0.5, 1.5);
        let mut wsn = ws.clone();
        wsn.insert("g".into(), (DType::F32, vec![k], dsc_ir::quant::encode(DType::F32, &gw).context("encode")?));
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %g = weight : f32[{k}]\n  %xn = rms_norm(%x, %g) {{eps = 0.00001}} : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%xn, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &wsn)?;
        let spec = KernelSpec::NormMatMul { inner: Box::new(KernelSpec::MatMulPacked { wdtype, k, n, tiles: 0, walk: 1, bias: false, residual: false }), eps_bits: 1e-5f32.to_bits() };
        let (g, b) = grid(&spec.launch(), n);
        cx.cases.push(Case {
            name: format!("rms_norm+matmul_{f} t0 {m}x{k}x{n}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: grid_rows(&spec.launch(), m),
            block: b,
            inputs: vec![cx.data.push(&x), cx.data.push(&gw), warr.clone()],
            scalars: vec![m as i64, n as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-2,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // the embedding gather from a table in the format
    let (v, d, t) = (37usize, 1024usize, 5usize);
    let table = cx.r.vec(v * d, -1.0, 1.0);
    let tb = dsc_ir::quant::encode(wdtype, &table).context("encode")?;
    let idx: Vec<i32> = vec![0, 36, 7, 19, 36];
    let ws: Weights = HashMap::from([("table".to_string(), (wdtype, vec![v, d], tb.clone()))]);
    let src = format!("graph \"k\" {{\n  %idx = input : i32[{t}]\n  %table = weight : {wdtype}[{v}, {d}]\n  %y = gather(%table, %idx) : f32[{t}, {d}]\n  output y = %y\n}}\n");
    let want = reference(&src, vec![("idx", Tensor::from_i32(vec![t], &idx))], &ws)?;
    let spec = KernelSpec::Gather { d, dtype: wdtype };
    let (g, b) = grid(&spec.launch(), t * d);
    cx.cases.push(Case {
        name: format!("gather {t}x{d} {wdtype}"),
        kernel: spec.symbol(),
        grid: g,
        grid_y: 1,
        block: b,
        inputs: vec![cx.data.push_u8(&tb), cx.data.push_i32(&idx)],
        scalars: vec![(t * d) as i64],
        expected: cx.data.push(&want),
        init: None,
        written_inputs: vec![],
        tmaps: vec![],
        tol: 1e-6,
        cluster: None,
    });
    cx.specs.push(spec);
    Ok(())
}

/// GGUF's K-quants and 5-bit blocks (`kernels::matmul::kquant`): the one-row decode GEMV at 1
/// and 3 rows, the batched-decode GEMV (f32 and f16 x), the tensor-core kernels staging them
/// through `weight_elem` (mma.sync; wgmma 16 and 64 columns), and the embedding gather — against the CPU executor's decoding (`quant::
/// decode`, equal to the `gguf` package's). K = 512: two super-blocks a row, so Q6_K's
/// 210-byte super-blocks sit at 2-byte aligned offsets in every other one.
pub(super) fn kquant(cx: &mut Cx) -> anyhow::Result<()> {
    let (k, n) = (512usize, 256usize);
    for wdtype in [DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q5_0, DType::Q5_1] {
        let wf = cx.r.vec(n * k, -0.1, 0.1);
        let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
        let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
        let warr = cx.data.push_u8(&wb);
        let mut specs = vec![(KernelSpec::MatMul { k, n, wdtype, bias: false, residual: false }, vec![1usize, 3], 1e-4, "matmul")];
        specs.push((KernelSpec::MatMulMma { k, n, wdtype, bias: false, residual: false }, vec![20], 1e-2, "mma"));
        // (the batched-decode GEMV on the tensor cores, values dequantized to f16 in registers)
        let rows = dsc_codegen::kernels::few_rows(wdtype);
        specs.push((KernelSpec::MatMulFew { k, n, wdtype, bias: false, residual: false, rows }, vec![2, 13, 37], 1e-2, "gemv_few"));
        specs.push((KernelSpec::MatMulFewX16 { k, n, wdtype, bias: false, residual: false }, vec![21], 1e-2, "few_x16"));
        for (n_tile, m) in [(16usize, 5usize), (64, 70)] {
            specs.push((KernelSpec::MatMulWgmma { k, n, wdtype, bias: false, residual: false, n_tile }, vec![m], 1e-2, if n_tile == 16 { "wgmma16" } else { "wgmma64" }));
        }
        for (spec, ms, tol, what) in specs {
            for m in ms {
                let x = cx.r.vec(m * k, -1.0, 1.0);
                let src =
                    format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
                let (g, b) = grid(&spec.launch(), n);
                let one_row = matches!(spec, KernelSpec::MatMul { .. });
                // (the x16 kernel reads x's f16 copy)
                let xa = if matches!(spec, KernelSpec::MatMulFewX16 { .. }) { cx.data.push_u8(&dsc_ir::quant::encode(DType::F16, &x).context("encode")?) } else { cx.data.push(&x) };
                cx.cases.push(Case {
                    name: format!("{what} {m}x{k}x{n} {wdtype}"),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y: if one_row { m as u32 } else { grid_rows(&spec.launch(), m) },
                    block: b,
                    inputs: vec![xa, warr.clone()],
                    scalars: if one_row { vec![n as i64] } else { vec![m as i64, n as i64] },
                    expected: cx.data.push(&want),
                    init: None,
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol,
                    cluster: None,
                });
            }
            cx.specs.push(spec);
        }
        // the embedding gather: rows 0, the last and random ones of the [n, k] table
        let t = 11usize;
        let idx: Vec<i32> = (0..t)
            .map(|i| {
                if i == 0 {
                    0
                } else if i == 1 {
                    n as i32 - 1
                } else {
                    (cx.r.vec(1, 0.0, n as f32)[0] as i32).min(n as i32 - 1)
                }
            })
            .collect();
        let wst: Weights = HashMap::from([("table".to_string(), (wdtype, vec![n, k], wb.clone()))]);
        let src = format!("graph \"k\" {{\n  %idx = input : i32[{t}]\n  %table = weight : {wdtype}[{n}, {k}]\n  %y = gather(%table, %idx) : f32[{t}, {k}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("idx", Tensor::from_i32(vec![t], &idx))], &wst)?;
        let spec = KernelSpec::Gather { d: k, dtype: wdtype };
        let (g, b) = grid(&spec.launch(), t * k);
        cx.cases.push(Case {
            name: format!("gather {t}x{k} {wdtype}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![warr.clone(), cx.data.push_i32(&idx)],
            scalars: vec![(t * k) as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-6,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // seeded Q4_K weights generated on the device: the host encoder's bytes, exactly
    super::elementwise::seeded_bytes(cx, DType::Q4_K, 256 * 37)?;
    kquant_packed(cx)?;
    dequant_pipe(cx)
}

/// The warp-specialized pipelined matmul on quantized weights (its producer warpgroup
/// dequantizing W's tiles into the stages): the formats it takes (of the GGUF blocks, one of
/// each dequantizing helper), over a partial second row tile and a partial column tile, K of 16
/// steps (2 rounds of the 6 stages and 4); Q4_K also with a
/// residual, as a merged matmul and with the SwiGLU epilogue. x: its f16 copy's tensor map.
fn dequant_pipe(cx: &mut Cx) -> anyhow::Result<()> {
    use dsc_codegen::kernels::PIPE_BM;
    let t = dsc_codegen::kernels::dequant_pipe_tiling();
    let k = 1024usize;
    let pipe = |n: usize, wdtype: DType, residual: bool| KernelSpec::MatMulPipe { k, n, wdtype, bias: false, residual, bn: t.bn, stages: t.stages, overlap: t.overlap, a16: t.a16, bm: t.bm };
    let x16 = |cx: &mut Cx, x: &[f32]| -> anyhow::Result<Array> { Ok(cx.data.push_u8(&dsc_ir::quant::encode(DType::F16, x).context("encode")?)) };
    let ws_case = |spec: KernelSpec, name: String, m: usize, n_launch: usize, inputs: Vec<Array>, scalars: Vec<i64>, expected: Array, written: Vec<(usize, Array)>| -> (Case, KernelSpec) {
        let ws = KernelSpec::Ws { inner: Box::new(spec) };
        let (g, b) = grid(&ws.launch(), n_launch);
        let case = Case {
            name,
            kernel: ws.symbol(),
            grid: g,
            grid_y: grid_rows(&ws.launch(), m),
            block: b,
            inputs,
            scalars,
            expected,
            init: None,
            written_inputs: written,
            tmaps: vec![TmapInput { input: 0, n: m, k, rows: PIPE_BM as u32, f16: true, pool: None }],
            tol: 1e-2,
            cluster: None,
        };
        (case, ws)
    };
    let formats = [DType::Q4_K, DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q4_1, DType::Q5_1, DType::I4G128, DType::F8G128];
    for (i, wdtype) in formats.into_iter().enumerate() {
        let cases: &[(usize, usize, bool)] = if i == 0 { &[(130, 168, false), (131, 128, true)] } else { &[(130, 168, false)] };
        for &(m, n, residual) in cases {
            let wf = cx.r.vec(n * k, -0.1, 0.1);
            let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
            let ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
            let x = cx.r.vec(m * k, -1.0, 1.0);
            let r = cx.r.vec(m * n, -1.0, 1.0);
            let want = matmul_reference(&x, residual.then_some(&r[..]), m, k, n, wdtype, &ws)?;
            let mut inputs = vec![x16(cx, &x)?, cx.data.push_u8(&wb)];
            if residual {
                inputs.push(cx.data.push(&r));
            }
            let expected = cx.data.push(&want);
            let (c, s) =
                ws_case(pipe(n, wdtype, residual), format!("pipe128 dequant ws {m}x{k}x{n} {wdtype}{}", if residual { " +res" } else { "" }), m, n, inputs, vec![m as i64, n as i64], expected, vec![]);
            cx.cases.push(c);
            cx.specs.push(s);
        }
    }
    // Q4_K merged (q/k/v-like parts) and gate/up with the SwiGLU epilogue
    let wdtype = DType::Q4_K;
    let parts = [128usize, 256, 128];
    let total: usize = parts.iter().sum();
    let (enc, ws, decl) = part_weights(&parts, k, wdtype, &mut cx.r)?;
    let m = 129usize;
    let x = cx.r.vec(m * k, -1.0, 1.0);
    let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1, %w2) : f32[{m}, {total}]\n  output y = %y\n}}\n");
    let want = part_major(&reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?, m, &parts);
    let spec = KernelSpec::MatMulParts { inner: Box::new(pipe(total, wdtype, false)), parts: parts.to_vec() };
    let mut inputs = vec![x16(cx, &x)?];
    inputs.extend(enc.iter().map(|w| cx.data.push_u8(w)));
    let expected = cx.data.push(&want);
    let (c, s) = ws_case(spec, format!("matmul_cat pipe128 dequant ws {m}x{k}x(128+256+128) {wdtype}"), m, total, inputs, vec![m as i64, total as i64, m as i64], expected, vec![]);
    cx.cases.push(c);
    cx.specs.push(s);
    let f = 192usize;
    let (enc, ws, decl) = part_weights(&[f, f], k, wdtype, &mut cx.r)?;
    let m = 130usize;
    let x = cx.r.vec(m * k, -1.0, 1.0);
    let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1) : f32[{m}, {}]\n  output y = %y\n}}\n", 2 * f);
    let gu = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
    let h: Vec<f32> = (0..m * f).map(|i| (i / f, i % f)).map(|(r, c)| (gu[r * 2 * f + c], gu[r * 2 * f + f + c])).map(|(g, u)| g / (1.0 + (-g).exp()) * u).collect();
    let half = dsc_ir::quant::encode(DType::F16, &h).context("encode")?;
    let spec = KernelSpec::SwiGluPipe { inner: Box::new(pipe(2 * f, wdtype, false)) };
    let mut inputs = vec![x16(cx, &x)?];
    inputs.extend(enc.iter().map(|w| cx.data.push_u8(w)));
    inputs.push(cx.data.push(&vec![f32::NAN; m * f]));
    let expected = cx.data.push(&le_words(&half));
    let written = vec![(3, cx.data.push(&h))];
    let (c, s) = ws_case(spec, format!("swiglu pipe128 dequant ws {m}x{k}x2x{f} {wdtype}"), m, 2 * f, inputs, vec![m as i64, f as i64], expected, written);
    cx.cases.push(c);
    cx.specs.push(s);
    Ok(())
}

/// Q4_K's one-row GEMV on the tensor cores (`MatMulPacked` tiles 0): one and a few rows (a
/// block each), a partial block of outputs, bias and residual, K of 2 super-blocks (most warps
/// idle), 6, 32 (four steps a warp) and 35 (a clamped last step); the RMSNorm folded into its
/// staging; blocks walking 4 and 5 tiles (the weight loads running on across tiles, a partial
/// last tile and tiles past N in the last block).
fn kquant_packed(cx: &mut Cx) -> anyhow::Result<()> {
    let wdtype = DType::Q4_K;
    let cases = [
        (512usize, 256usize, 1usize, false, false, 1usize),
        (1536, 100, 3, true, false, 1),
        (8192, 40, 1, false, false, 1),
        (8960, 24, 2, true, false, 1),
        (1536, 100, 2, false, true, 1),
        (2048, 1000, 2, true, false, 4),
        (512, 600, 1, false, true, 5),
    ];
    for (k, n, m, extra, norm, walk) in cases {
        let wf = cx.r.vec(n * k, -0.1, 0.1);
        let wb = dsc_ir::quant::encode(wdtype, &wf).context("encode")?;
        let mut ws: Weights = HashMap::from([("w".to_string(), (wdtype, vec![n, k], wb.clone()))]);
        let x = cx.r.vec(m * k, -2.0, 2.0);
        let mut inputs = vec![cx.data.push(&x)];
        let (src, spec) = if norm {
            let gw = cx.r.vec(k, 0.5, 1.5);
            ws.insert("g".into(), (DType::F32, vec![k], dsc_ir::quant::encode(DType::F32, &gw).context("encode")?));
            inputs.push(cx.data.push(&gw));
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %g = weight : f32[{k}]\n  %xn = rms_norm(%x, %g) {{eps = 0.00001}} : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%xn, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
            (src, KernelSpec::NormMatMul { inner: Box::new(KernelSpec::MatMulPacked { wdtype, k, n, tiles: 0, walk, bias: false, residual: false }), eps_bits: 1e-5f32.to_bits() })
        } else {
            let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %w = weight : {wdtype}[{n}, {k}]\n  %y = matmul(%x, %w) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n");
            (src, KernelSpec::MatMulPacked { wdtype, k, n, tiles: 0, walk, bias: extra, residual: extra })
        };
        let mut want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
        inputs.push(cx.data.push_u8(&wb));
        if extra {
            let bias = cx.r.vec(n, -1.0, 1.0);
            let res = cx.r.vec(m * n, -1.0, 1.0);
            for (i, w) in want.iter_mut().enumerate() {
                *w += bias[i % n] + res[i];
            }
            inputs.push(cx.data.push(&bias));
            inputs.push(cx.data.push(&res));
        }
        let w = if walk > 1 { format!(" walk {walk}") } else { String::new() };
        let name = format!("{}matmul_q4k t0 {m}x{k}x{n}{w}{}", if norm { "rms_norm+" } else { "" }, if extra { " bias res" } else { "" });
        let expected = cx.data.push(&want);
        cx.cases.push(case(name, &spec, grid(&spec.launch(), n), grid_rows(&spec.launch(), m), inputs, vec![m as i64, n as i64], expected, 1e-2));
        if !cx.specs.contains(&spec) {
            cx.specs.push(spec);
        }
    }
    // the SwiGLU form (a merged gate/up's one-row kernel: gate rows and up rows in one A tile,
    // silu(gate) · up stored), 8 outputs a tile: a partial last tile at f = 100; with the
    // RMSNorm folded in; f = 2,200: 275 tiles, two a block (the last block's second past f)
    for (k, f, m, norm) in [(1536usize, 100usize, 1usize, false), (4096, 64, 2, false), (1536, 40, 1, true), (256, 2200, 1, false)] {
        let (wg, wu) = (cx.r.vec(f * k, -0.1, 0.1), cx.r.vec(f * k, -0.1, 0.1));
        let (bg, bu) = (dsc_ir::quant::encode(wdtype, &wg).context("encode")?, dsc_ir::quant::encode(wdtype, &wu).context("encode")?);
        let mut ws: Weights = HashMap::from([("wg".to_string(), (wdtype, vec![f, k], bg.clone())), ("wu".to_string(), (wdtype, vec![f, k], bu.clone()))]);
        let x = cx.r.vec(m * k, -2.0, 2.0);
        let mut inputs = vec![cx.data.push(&x)];
        let (head, xin) = if norm {
            let gw = cx.r.vec(k, 0.5, 1.5);
            ws.insert("g".into(), (DType::F32, vec![k], dsc_ir::quant::encode(DType::F32, &gw).context("encode")?));
            inputs.push(cx.data.push(&gw));
            (format!("  %g = weight : f32[{k}]\n  %xn = rms_norm(%x, %g) {{eps = 0.00001}} : f32[{m}, {k}]\n"), "%xn")
        } else {
            (String::new(), "%x")
        };
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{head}  %wg = weight : {wdtype}[{f}, {k}]\n  %wu = weight : {wdtype}[{f}, {k}]\n  %a = matmul({xin}, %wg) {{transpose_b = true}} : f32[{m}, {f}]\n  %b = matmul({xin}, %wu) {{transpose_b = true}} : f32[{m}, {f}]\n  %h = silu_mul(%a, %b) : f32[{m}, {f}]\n  output h = %h\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
        inputs.push(cx.data.push_u8(&bg));
        inputs.push(cx.data.push_u8(&bu));
        let inner = KernelSpec::SwiGluGemv { k, f, wdtype };
        let spec = if norm { KernelSpec::NormMatMul { inner: Box::new(inner), eps_bits: 1e-5f32.to_bits() } } else { inner };
        let name = format!("{}swiglu_q4k {m}x{k}x{f}", if norm { "rms_norm+" } else { "" });
        let expected = cx.data.push(&want);
        cx.cases.push(case(name, &spec, grid(&spec.launch(), f), grid_rows(&spec.launch(), m), inputs, vec![m as i64, f as i64], expected, 1e-2));
        if !cx.specs.contains(&spec) {
            cx.specs.push(spec);
        }
    }
    Ok(())
}
