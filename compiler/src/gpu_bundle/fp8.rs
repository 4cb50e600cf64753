//! Kernel-check cases: the FP8 family (`dsc_codegen::kernels::fp8`): the activation quantizer
//! bit for bit against the CPU executor's `act_quant` (the f32 node and the e4m3 copy), and the
//! FP8 GEMM on that copy against the CPU's matmul of the quantized activations.

use super::*;

/// x's e4m3 copy as the GPU quantizer writes it (`kernels::f8_rows_width`): per row its d
/// codes, then d / 128 f32 scales; the CPU executor's rounding (`dsc_ir::quant`).
fn e4m3_rows(x: &[f32], d: usize) -> Vec<u8> {
    let g = dsc_codegen::kernels::F8_GROUP;
    let mut out = vec![];
    for row in x.chunks(d) {
        let mut scales = vec![];
        for grp in row.chunks(g) {
            let amax = grp.iter().fold(0f32, |a, v| a.max(v.abs()));
            let s = amax / 448.0;
            let ok = s > 0.0 && s.is_finite();
            out.extend(grp.iter().map(|&v| if ok { dsc_ir::quant::f32_to_f8e4m3(v / s) } else { 0 }));
            scales.push(if ok { s } else { 0.0 });
        }
        out.extend(scales.iter().flat_map(|s| s.to_le_bytes()));
    }
    out
}

pub(super) fn cases(cx: &mut Cx) -> anyhow::Result<()> {
    // the quantizer: the f32 node (as an input it writes) and the e4m3 copy (the output), one
    // all-zero group, values spanning e4m3's subnormals
    {
        let (m, d) = (37usize, 1024usize);
        let mut x = cx.r.vec(m * d, -3.0, 3.0);
        x[..128].fill(0.0);
        for v in x[1024..1152].iter_mut() {
            *v *= 1e-3;
        }
        let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {d}]\n  %y = act_quant(%x) {{dtype = f8e4m3, group = 128}} : f32[{m}, {d}]\n  output y = %y\n}}\n");
        let want_y = reference(&src, vec![("x", Tensor::new(vec![m, d], x.clone()))], &cx.none)?;
        let spec = KernelSpec::ActQuantF8 { d, group: 128 };
        let (g, b) = grid(&spec.launch(), m * d / 4);
        let poison = cx.data.push(&vec![f32::NAN; m * d]);
        let want_y = cx.data.push(&want_y);
        cx.cases.push(Case {
            name: format!("act_quant f8 {m}x{d}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x), poison],
            scalars: vec![(m * d / 4) as i64],
            // (bytes compared one by one as numbers, written over a 0xAB fill)
            expected: cx.data.push(&e4m3_rows(&x, d).iter().map(|&v| v as f32).collect::<Vec<f32>>()),
            init: Some(cx.data.push_u8(&vec![0xAB; m * (d + d / 32)])),
            written_inputs: vec![(1, want_y)],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // the GEMM: partial row and column tiles, a residual, fewer K steps than stages, 64-column
    // tiles, merged parts
    for (m, k, n, residual, bn, stages, parts) in [
        (256usize, 1024usize, 384usize, true, 128usize, 6usize, None),
        (200, 2048, 320, false, 128, 6, None),
        (130, 512, 128, true, 64, 4, None),
        (160, 1024, 512, false, 128, 6, Some([256usize, 128, 128])),
    ] {
        let x = cx.r.vec(m * k, -2.0, 2.0);
        let mut xq = x.clone();
        dsc_ir::quant::act_quant_rows(&mut xq, k, 128, DType::F8E4M3);
        let xa = cx.data.push_u8(&e4m3_rows(&x, k));
        let inner = KernelSpec::MatMulF8 { k, n, residual, bn, stages };
        let (spec, inputs, want, scalars) = match parts {
            None => {
                let wb = dsc_ir::quant::encode(DType::F8G128, &cx.r.vec(n * k, -0.1, 0.1)).context("encode")?;
                let ws: Weights = HashMap::from([("w".to_string(), (DType::F8G128, vec![n, k], wb.clone()))]);
                let r = cx.r.vec(m * n, -1.0, 1.0);
                let want = matmul_reference(&xq, residual.then_some(&r[..]), m, k, n, DType::F8G128, &ws)?;
                let mut inputs = vec![xa, cx.data.push_u8(&wb)];
                if residual {
                    inputs.push(cx.data.push(&r));
                }
                (inner, inputs, want, vec![m as i64, n as i64])
            }
            Some(p) => {
                let (enc, ws, decl) = part_weights(&p, k, DType::F8G128, &mut cx.r)?;
                let src = format!("graph \"k\" {{\n  %x = input : f32[{m}, {k}]\n{decl}  %y = matmul_cat(%x, %w0, %w1, %w2) : f32[{m}, {n}]\n  output y = %y\n}}\n");
                let want = part_major(&reference(&src, vec![("x", Tensor::new(vec![m, k], xq.clone()))], &ws)?, m, &p);
                let mut inputs = vec![xa];
                inputs.extend(enc.iter().map(|w| cx.data.push_u8(w)));
                (KernelSpec::MatMulParts { inner: Box::new(inner), parts: p.to_vec() }, inputs, want, vec![m as i64, n as i64, m as i64])
            }
        };
        let (g, b) = grid(&spec.launch(), n);
        cx.cases.push(Case {
            name: format!("f8 gemm {m}x{k}x{n} bn{bn}{}{}", if residual { " +res" } else { "" }, if parts.is_some() { " parts" } else { "" }),
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
            // (the FP8 tensor cores' accumulation within a 128-value step is not f32's)
            tol: 1e-3,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    Ok(())
}
