//! Kernel-check cases: the normalizations (`dsc_codegen::kernels::norm`).

use super::*;

/// Rms_norm, with its 16-bit copy, over gathered rows.
pub(super) fn rms_norm(cx: &mut Cx) -> anyhow::Result<()> {
    for (rows, d) in [(77usize, 576usize), (5, 4096), (3, 8192), (9, 2048)] {
        let eps = 1e-5f32;
        let spec = KernelSpec::RmsNorm { d, eps_bits: eps.to_bits() };
        let x = cx.r.vec(rows * d, -2.0, 2.0);
        let w = cx.r.vec(d, 0.5, 1.5);
        let ws: Weights = HashMap::from([("w".to_string(), (DType::F32, vec![d], w.iter().flat_map(|v| v.to_le_bytes()).collect()))]);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %w = weight : f32[{d}]\n  %y = rms_norm(%x, %w) {{eps = {eps:?}}} : f32[{rows}, {d}]\n  output y = %y\n}}\n");
        let want = reference(&src, vec![("x", Tensor::new(vec![rows, d], x.clone()))], &ws)?;
        let (g, b) = grid(&spec.launch(), rows);
        let (xa, wa, ya) = (cx.data.push(&x), cx.data.push(&w), cx.data.push(&want));
        cx.cases.push(Case {
            name: format!("rms_norm {rows}x{d}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![xa.clone(), wa.clone()],
            scalars: vec![rows as i64],
            expected: ya.clone(),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        cx.specs.push(spec);
        // norm + quantize (DSC_NORM_HALF): y as above, and its bf16/f16 copy as the output
        // (compared as the 32-bit words of 16-bit pairs: equal where the rounding agrees)
        if rows * d <= 5 * 4096 {
            let poison = cx.data.push(&vec![f32::NAN; rows * d]);
            for f16 in [false, true] {
                let spec = KernelSpec::RmsNormHalf { d, eps_bits: eps.to_bits(), f16 };
                let half = dsc_ir::quant::encode(if f16 { DType::F16 } else { DType::BF16 }, &want).context("encode")?;
                let words: Vec<f32> = le_words(&half);
                let (g, b) = grid(&spec.launch(), rows);
                cx.cases.push(Case {
                    name: format!("rms_norm {rows}x{d} + {} copy", if f16 { "f16" } else { "bf16" }),
                    kernel: spec.symbol(),
                    grid: g,
                    grid_y: 1,
                    block: b,
                    inputs: vec![xa.clone(), wa.clone(), poison.clone()],
                    scalars: vec![rows as i64],
                    expected: cx.data.push(&words),
                    init: None,
                    written_inputs: vec![(2, ya.clone())],
                    tmaps: vec![],
                    tol: 1e-2,
                    cluster: None,
                });
                cx.specs.push(spec);
            }
            // (and over gathered rows — the logits' row gather folded into the final norm,
            // `RowGather`: 3 of the rows, out of order, the last one among them)
            let pick: Vec<i32> = vec![rows as i32 - 1, 0, (rows / 2) as i32];
            let spec = KernelSpec::RowGather { inner: Box::new(KernelSpec::RmsNormHalf { d, eps_bits: eps.to_bits(), f16: false }) };
            let y: Vec<f32> = pick.iter().flat_map(|&r| want[r as usize * d..(r as usize + 1) * d].iter().copied()).collect();
            let words: Vec<f32> = le_words(&dsc_ir::quant::encode(DType::BF16, &y).context("encode")?);
            let (g, b) = grid(&spec.launch(), pick.len());
            cx.cases.push(Case {
                name: format!("rms_norm of rows {pick:?} of {rows}x{d} + bf16 copy"),
                kernel: spec.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![cx.data.push_i32(&pick), xa.clone(), wa.clone(), cx.data.push(&vec![f32::NAN; pick.len() * d])],
                scalars: vec![pick.len() as i64],
                expected: cx.data.push(&words),
                init: None,
                written_inputs: vec![(3, cx.data.push(&y))],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            });
            cx.specs.push(spec);
        }
    }

    Ok(())
}

/// Softmax and layer_norm.
pub(super) fn softmax_layer_norm(cx: &mut Cx) -> anyhow::Result<()> {
    // row ops and index ops
    {
        let (rows, d) = (37usize, 1000usize);
        let x = cx.r.vec(rows * d, -6.0, 6.0);
        let want = reference(
            &format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %y = softmax(%x) : f32[{rows}, {d}]\n  output y = %y\n}}\n"),
            vec![("x", Tensor::new(vec![rows, d], x.clone()))],
            &cx.none,
        )?;
        let spec = KernelSpec::Softmax { d };
        let (g, b) = grid(&spec.launch(), rows);
        cx.cases.push(Case {
            name: format!("softmax {rows}x{d}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x)],
            scalars: vec![rows as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    {
        let (rows, d, eps) = (19usize, 768usize, 1e-5f32);
        let x = cx.r.vec(rows * d, -3.0, 5.0);
        let w = cx.r.vec(d, 0.5, 1.5);
        let bias = cx.r.vec(d, -0.5, 0.5);
        let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let ws: Weights = HashMap::from([("w".to_string(), (DType::F32, vec![d], f(&w))), ("b".to_string(), (DType::F32, vec![d], f(&bias)))]);
        let want = reference(&format!("graph \"k\" {{\n  %x = input : f32[{rows}, {d}]\n  %w = weight : f32[{d}]\n  %b = weight : f32[{d}]\n  %y = layer_norm(%x, %w, %b) {{eps = {eps:?}}} : f32[{rows}, {d}]\n  output y = %y\n}}\n"), vec![("x", Tensor::new(vec![rows, d], x.clone()))], &ws)?;
        let spec = KernelSpec::LayerNorm { d, eps_bits: eps.to_bits(), half: None };
        let (g, b) = grid(&spec.launch(), rows);
        let (xa, wa, ba, ya) = (cx.data.push(&x), cx.data.push(&w), cx.data.push(&bias), cx.data.push(&want));
        cx.cases.push(Case {
            name: format!("layer_norm {rows}x{d}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![xa.clone(), wa.clone(), ba.clone()],
            scalars: vec![rows as i64],
            expected: ya.clone(),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        cx.specs.push(spec);
        // norm + quantize: y as before (a written input) and its 16-bit copy (the output, as
        // the f32 words of packed pairs)
        let poison = cx.data.push(&vec![f32::NAN; rows * d]);
        for f16 in [false, true] {
            let spec = KernelSpec::LayerNorm { d, eps_bits: eps.to_bits(), half: Some(f16) };
            let half = dsc_ir::quant::encode(if f16 { DType::F16 } else { DType::BF16 }, &want).context("encode")?;
            let words: Vec<f32> = le_words(&half);
            cx.cases.push(Case {
                name: format!("layer_norm {rows}x{d} + {} copy", if f16 { "f16" } else { "bf16" }),
                kernel: spec.symbol(),
                grid: g,
                grid_y: 1,
                block: b,
                inputs: vec![xa.clone(), wa.clone(), ba.clone(), poison.clone()],
                scalars: vec![rows as i64],
                expected: cx.data.push(&words),
                init: None,
                written_inputs: vec![(3, ya.clone())],
                tmaps: vec![],
                tol: 1e-2,
                cluster: None,
            });
            cx.specs.push(spec);
        }
    }
    Ok(())
}
