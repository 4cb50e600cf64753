//! Kernel-check cases: the fused mlp kernels (`dsc_codegen::kernels::mlp`).

use super::*;

/// The SwiGLU GEMV, the one-token MLP (SwiGluDown), the o projection seeding its accumulator, RMSNorm in the GEMV prologue.
pub(super) fn cases(cx: &mut Cx) -> anyhow::Result<()> {
    // the SwiGLU in the decode GEMV's epilogue (SwiGluGemv): silu(x Wg^T) * (x Wu^T), a partial
    // last block; and with the RMSNorm in its prologue (NormMatMul over SwiGluGemv: x is the
    // norm's input, g its weight)
    for (wdtype, k, f, norm) in [
        (DType::BF16, 576usize, 201usize, false),
        (DType::F16, 1024, 130, false),
        (DType::F32, 256, 64, false),
        (DType::BF16, 576, 201, true),
        (DType::F16, 256, 64, true),
        (DType::Q4_1, 576, 202, true),
    ] {
        let eps = 1e-5f32;
        let (enc, mut ws, decl) = part_weights(&[f, f], k, wdtype, &mut cx.r)?;
        let g = cx.r.vec(k, 0.5, 1.5);
        ws.insert("g".into(), (DType::F32, vec![k], g.iter().flat_map(|v| v.to_le_bytes()).collect()));
        let x = cx.r.vec(k, -2.0, 2.0);
        let (xn, gdecl) = if norm { ("xn", format!("  %g = weight : f32[{k}]\n{decl}  %xn = rms_norm(%x, %g) {{eps = {eps:?}}} : f32[1, {k}]\n")) } else { ("x", decl) };
        let src = format!(
            "graph \"k\" {{\n  %x = input : f32[1, {k}]\n{gdecl}  %a = matmul(%{xn}, %w0) {{transpose_b = true}} : f32[1, {f}]\n  %u = matmul(%{xn}, %w1) {{transpose_b = true}} : f32[1, {f}]\n  %y = silu_mul(%a, %u) : f32[1, {f}]\n  output y = %y\n}}\n"
        );
        let want = reference(&src, vec![("x", Tensor::new(vec![1, k], x.clone()))], &ws)?;
        let swiglu = KernelSpec::SwiGluGemv { k, f, wdtype };
        let spec = if norm { KernelSpec::NormMatMul { inner: Box::new(swiglu), eps_bits: eps.to_bits() } } else { swiglu };
        let (gx, b) = grid(&spec.launch(), f);
        let mut inputs = vec![cx.data.push(&x)];
        if norm {
            inputs.push(cx.data.push(&g));
        }
        inputs.extend(enc.iter().map(|w| cx.data.push_u8(w)));
        cx.cases.push(Case {
            name: format!("{}swiglu gemv 1x{k}x{f} {wdtype}", if norm { "rms_norm+" } else { "" }),
            kernel: spec.symbol(),
            grid: gx,
            grid_y: 1,
            block: b,
            inputs,
            scalars: vec![f as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-4,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // the one-token MLP in one kernel (SwiGluDown): norm, gate/up, SwiGLU, down, added into y
    // (which holds the residual: `init`); two rows (grid y), K with a partial last round of
    // pieces (576) and without (256), both feature blocks; Q4_1: the block's features half a
    // W_down block (both halves across the grid) and a whole one
    for (m, k, f, n, fb, fpw, wdtype) in [
        (2usize, 576usize, 48usize, 576usize, 16usize, 2usize, DType::BF16),
        (1, 256, 64, 128, 8, 2, DType::BF16),
        (1, 256, 64, 128, 32, 2, DType::BF16),
        (1, 576, 48, 576, 16, 1, DType::BF16),
        (2, 576, 96, 576, 16, 2, DType::Q4_1),
        (1, 256, 64, 128, 32, 2, DType::Q4_1),
    ] {
        let eps = 1e-5f32;
        let (enc, mut ws, decl) = part_weights(&[f, f], k, wdtype, &mut cx.r)?;
        let wd = dsc_ir::quant::encode(wdtype, &cx.r.vec(n * f, -0.1, 0.1)).context("encode")?;
        ws.insert("wd".into(), (wdtype, vec![n, f], wd.clone()));
        let g = cx.r.vec(k, 0.5, 1.5);
        ws.insert("g".into(), (DType::F32, vec![k], g.iter().flat_map(|v| v.to_le_bytes()).collect()));
        let x = cx.r.vec(m * k, -2.0, 2.0);
        let r = cx.r.vec(m * n, -1.0, 1.0);
        let src = format!(
            "graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %r = input : f32[{m}, {n}]\n  %g = weight : f32[{k}]\n{decl}  %wd = weight : {wdtype}[{n}, {f}]\n  %xn = rms_norm(%x, %g) {{eps = {eps:?}}} : f32[{m}, {k}]\n  %a = matmul(%xn, %w0) {{transpose_b = true}} : f32[{m}, {f}]\n  %u = matmul(%xn, %w1) {{transpose_b = true}} : f32[{m}, {f}]\n  %h = silu_mul(%a, %u) : f32[{m}, {f}]\n  %y = matmul_add(%h, %wd, %r) {{transpose_b = true}} : f32[{m}, {n}]\n  output y = %y\n}}\n"
        );
        let want = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone())), ("r", Tensor::new(vec![m, n], r.clone()))], &ws)?;
        let spec = KernelSpec::SwiGluDown { k, f, n, eps_bits: eps.to_bits(), fb, fpw, wdtype };
        let (gx, b) = grid(&spec.launch(), f);
        let mut inputs = vec![cx.data.push(&x), cx.data.push(&g)];
        inputs.extend(enc.iter().map(|w| cx.data.push_u8(w)));
        inputs.push(cx.data.push_u8(&wd));
        cx.cases.push(Case {
            name: format!("rms_norm+swiglu+down {m}x{k}x{f}x{n} {wdtype}, {fb} features per block, {fpw} per warp"),
            kernel: spec.symbol(),
            grid: gx,
            grid_y: m as u32,
            block: b,
            inputs,
            scalars: vec![f as i64],
            expected: cx.data.push(&want),
            init: Some(cx.data.push(&r)),
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-4,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // ... and the o projection that seeds its accumulator (MatMulCopy): the GEMV's output also
    // in y2 (an input it writes)
    for wdtype in [DType::BF16, DType::Q4_1] {
        let (k, n) = (256usize, 200usize);
        let (enc, ws, _) = part_weights(&[n], k, wdtype, &mut cx.r)?;
        let mut ws1 = Weights::new();
        ws1.insert("w".into(), ws["w0"].clone());
        let x = cx.r.vec(k, -1.0, 1.0);
        let r = cx.r.vec(n, -1.0, 1.0);
        let want = matmul_reference(&x, Some(&r), 1, k, n, wdtype, &ws1)?;
        let spec = KernelSpec::MatMulCopy { inner: Box::new(KernelSpec::MatMul { k, n, wdtype, bias: false, residual: true }) };
        let (gx, b) = grid(&spec.launch(), n);
        let expected = cx.data.push(&want);
        cx.cases.push(Case {
            name: format!("gemv+residual 1x{k}x{n} {wdtype}, output also copied"),
            kernel: spec.symbol(),
            grid: gx,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x), cx.data.push_u8(&enc[0]), cx.data.push(&r), cx.data.push(&vec![f32::NAN; n])],
            scalars: vec![n as i64],
            expected: expected.clone(),
            init: None,
            written_inputs: vec![(3, expected)],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // RMSNorm in the decode GEMV's prologue (NormMatMul): one weight, and merged parts
    {
        let (k, m, eps) = (576usize, 3usize, 1e-5f32);
        let g = cx.r.vec(k, 0.5, 1.5);
        let gb: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
        for (wdtype, parts) in [(DType::BF16, vec![192usize]), (DType::BF16, vec![128, 64, 192]), (DType::Q4_1, vec![128, 64, 192])] {
            let total: usize = parts.iter().sum();
            let (enc, mut ws, decl) = part_weights(&parts, k, wdtype, &mut cx.r)?;
            ws.insert("g".into(), (DType::F32, vec![k], gb.clone()));
            // (x bf16-exact: the same rows also come gathered from a bf16 table, `GatherX`)
            let x = dsc_ir::quant::decode(DType::BF16, &dsc_ir::quant::encode(DType::BF16, &cx.r.vec(m * k, -2.0, 2.0)).context("encode")?, m * k).context("decode")?;
            let mm = if parts.len() == 1 {
                format!("matmul(%xn, %w0) {{transpose_b = true}} : f32[{m}, {total}]")
            } else {
                format!("matmul_cat(%xn, {}) : f32[{m}, {total}]", (0..parts.len()).map(|i| format!("%w{i}")).collect::<Vec<_>>().join(", "))
            };
            let src =
                format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n  %g = weight : f32[{k}]\n{decl}  %xn = rms_norm(%x, %g) {{eps = {eps:?}}} : f32[{m}, {k}]\n  %y = {mm}\n  output y = %y\n}}\n");
            let rowmajor = reference(&src, vec![("x", Tensor::new(vec![m, k], x.clone()))], &ws)?;
            let want = part_major(&rowmajor, m, &parts);
            let gemv = KernelSpec::MatMul { k, n: total, wdtype, bias: false, residual: false };
            let (inner, scalars) = if parts.len() == 1 { (gemv, vec![total as i64]) } else { (KernelSpec::MatMulParts { inner: Box::new(gemv), parts: parts.clone() }, vec![total as i64, m as i64]) };
            let spec = KernelSpec::NormMatMul { inner: Box::new(inner), eps_bits: eps.to_bits() };
            let (gx, b) = grid(&spec.launch(), total);
            let mut inputs = vec![cx.data.push(&x), cx.data.push(&g)];
            inputs.extend(enc.iter().map(|e| cx.data.push_u8(e)));
            let expected = cx.data.push(&want);
            // x gathered: row r of x is row tok[r] of a 40-row bf16 table (the others random),
            // and the kernel writes x back as f32 (an input it writes: NaN before; 16-bit weights)
            if wdtype != DType::Q4_1 {
                let v = 40usize;
                let tok: Vec<i32> = (0..m).map(|r| ((7 * r + 3) % v) as i32).collect();
                let mut table = cx.r.vec(v * k, -2.0, 2.0);
                for (r, &t) in tok.iter().enumerate() {
                    table[t as usize * k..(t as usize + 1) * k].copy_from_slice(&x[r * k..(r + 1) * k]);
                }
                let gxs = KernelSpec::GatherX { inner: Box::new(spec.clone()) };
                let mut gin = vec![cx.data.push_u8(&dsc_ir::quant::encode(DType::BF16, &table).context("encode")?), cx.data.push_i32(&tok), cx.data.push(&vec![f32::NAN; m * k])];
                gin.extend(inputs[1..].iter().cloned());
                cx.cases.push(Case {
                    name: format!("rms_norm+gemv {m}x{k}x({}) bf16, x gathered from a bf16 table", parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("+")),
                    kernel: gxs.symbol(),
                    grid: gx,
                    grid_y: m as u32,
                    block: b,
                    inputs: gin,
                    scalars: scalars.clone(),
                    expected: expected.clone(),
                    init: None,
                    written_inputs: vec![(2, cx.data.push(&x))],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
                cx.specs.push(gxs);
            }
            // (merged: also as the zero fill of a one-token layer's accumulators, `ZeroFill`,
            // two inputs it writes: 200 zeros each, the narrowest part's blocks covering them)
            if parts.len() > 1 {
                let len = 200usize;
                let zf = KernelSpec::ZeroFill { inner: Box::new(spec.clone()), len };
                let nan = cx.data.push(&vec![f32::NAN; len]);
                let zeros = cx.data.push(&vec![0.0; len]);
                cx.cases.push(Case {
                    name: format!("rms_norm+gemv {m}x{k}x({}) {wdtype} + zero fill {len}", parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("+")),
                    kernel: zf.symbol(),
                    grid: gx,
                    grid_y: m as u32,
                    block: b,
                    inputs: [nan.clone(), nan].into_iter().chain(inputs.iter().cloned()).collect(),
                    scalars: scalars.clone(),
                    expected: expected.clone(),
                    init: None,
                    written_inputs: vec![(0, zeros.clone()), (1, zeros)],
                    tmaps: vec![],
                    tol: 1e-5,
                    cluster: None,
                });
                cx.specs.push(zf);
            }
            cx.cases.push(Case {
                name: format!("rms_norm+gemv {m}x{k}x({}) {wdtype}", parts.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("+")),
                kernel: spec.symbol(),
                grid: gx,
                grid_y: m as u32,
                block: b,
                inputs,
                scalars,
                expected,
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-5,
                cluster: None,
            });
            cx.specs.push(spec);
        }
    }
    Ok(())
}
