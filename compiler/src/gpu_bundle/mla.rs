//! Kernel-check cases: Multi-head Latent Attention (`dsc_codegen::kernels::mla`) and
//! DeepSeek's YaRN rope (`dsc_codegen::kernels::rope`).

use super::*;

/// MLA's attention over the latent cache (V2-Lite's 16 heads of 576 = 512 + 64, bf16 pool; a
/// tiny f32 one whose width is no multiple of 8), the per-head matmuls of its absorbed form,
/// and YaRN's rope.
pub(super) fn cases(cx: &mut Cx) -> anyhow::Result<()> {
    // (H, C, L, BS, sequences (first query position, length), pool)
    for (h, c, l, bs, seqs, kv) in [
        (16usize, 576usize, 512usize, 16usize, vec![(0usize, 1usize), (200, 201), (0, 37), (1023, 1024)], DType::BF16),
        (4, 40, 32, 4, vec![(0, 12), (5, 6)], DType::F32),
        (2, 44, 36, 8, vec![(0, 9)], DType::BF16),
    ] {
        let nb = seqs.iter().map(|s| s.1.div_ceil(bs)).sum::<usize>() + 2;
        let Paged { mb, table, pos, seq } = paged(&seqs, bs, nb)?;
        let t = pos.len();
        let q = cx.r.vec(t * h * c, -1.0, 1.0);
        let cache = kv_round(&cx.r.vec(nb * bs * c, -1.0, 1.0), kv);
        let scale = 0.1352f32;
        let ns = seqs.len();
        let src = format!(
            "graph \"k\" {{\n  %q = input : f32[{t}, {h}, {c}]\n  %pos = input : i32[{t}]\n  %seq = input : i32[{t}]\n  %table = input : i32[{ns}, {mb}]\n  %lc = state : {kv}[{nb}, {bs}, 1, {c}]\n  %o = mla_attention(%q, %lc, %pos, %seq, %table) {{scale = {scale:?}, kv_lora_rank = {l}}} : f32[{t}, {h}, {l}]\n  output o = %o\n}}\n"
        );
        let g = text::parse(&src)?;
        let mut ex = Executor::new(&g, &cx.none, BTreeMap::new())?;
        ex.state_mut("lc").context("lc")?.data.copy_from_slice(&cache);
        let want = ex
            .run(&BTreeMap::from([
                ("q".to_string(), Tensor::new(vec![t, h, c], q.clone())),
                ("pos".to_string(), Tensor::from_i32(vec![t], &pos)),
                ("seq".to_string(), Tensor::from_i32(vec![t], &seq)),
                ("table".to_string(), Tensor::from_i32(vec![ns, mb], &table)),
            ]))?
            .remove("o")
            .context("output")?
            .data;
        let spec = KernelSpec::MlaAttention { h, c, l, bs, scale_bits: scale.to_bits(), kv };
        let (gx, threads) = grid(&spec.launch(), t);
        cx.cases.push(Case {
            name: format!("mla_attention T{t} H{h} C{c} L{l} BS{bs}{}", kv_label(kv)),
            kernel: spec.symbol(),
            grid: gx,
            grid_y: grid_rows(&spec.launch(), h),
            block: threads,
            inputs: vec![cx.data.push(&q), cx.data.push_kv(&cache, kv), cx.data.push_i32(&pos), cx.data.push_i32(&seq), cx.data.push_i32(&table)],
            scalars: vec![t as i64, mb as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-4,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // the absorbed form's per-head matmuls: (T, H, K, N, weights)
    for (t, h, k, n, wdtype) in [(3usize, 16usize, 128usize, 512usize, DType::BF16), (3, 16, 512, 128, DType::BF16), (5, 4, 16, 32, DType::F32), (2, 3, 20, 12, DType::F16)] {
        let x = cx.r.vec(t * h * k, -1.0, 1.0);
        let wb = dsc_ir::quant::encode(wdtype, &cx.r.vec(h * n * k, -0.2, 0.2)).context("encode")?;
        let src = format!(
            "graph \"k\" {{\n  %x = input : f32[{t}, {h}, {k}]\n  %w = weight : {wdtype}[{h}, {n}, {k}]\n  %y = head_matmul(%x, %w) {{transpose_b = true}} : f32[{t}, {h}, {n}]\n  output y = %y\n}}\n"
        );
        let ws: Weights = [("w".to_string(), (wdtype, vec![h, n, k], wb.clone()))].into_iter().collect();
        let want = reference(&src, vec![("x", Tensor::new(vec![t, h, k], x.clone()))], &ws)?;
        let spec = KernelSpec::HeadMatMul { h, k, n, wdtype };
        let (gx, threads) = grid(&spec.launch(), h * n);
        let wa = if wdtype == DType::F32 { cx.data.push(&le_words(&wb)) } else { cx.data.push_u8(&wb) };
        cx.cases.push(Case {
            name: format!("head_matmul T{t} H{h} K{k} N{n} {wdtype}"),
            kernel: spec.symbol(),
            grid: gx,
            grid_y: t as u32,
            block: threads,
            inputs: vec![cx.data.push(&x), wa],
            scalars: vec![(h * n) as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-5,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // YaRN's rope (DeepSeek's: interleaved pairs; V2-Lite's factor 40, and a tiny factor-4 one)
    for (h, d, theta, factor, orig, mscale, interleaved) in [(16usize, 64usize, 10000f32, 40f32, 4096usize, 1.0f32, true), (4, 8, 10000.0, 4.0, 64, 1.1386, false)] {
        let t = 13usize;
        let x = cx.r.vec(t * h * d, -1.0, 1.0);
        let pos: Vec<i32> = (0..t).map(|i| if i == 0 { 0 } else { cx.r.vec(1, 0.0, 3000.0)[0] as i32 }).collect();
        let style = if interleaved { "interleaved" } else { "half" };
        let src = format!(
            "graph \"k\" {{\n  %x = input : f32[{t}, {h}, {d}]\n  %p = input : i32[{t}]\n  %y = rope_yarn(%x, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}, factor = {factor:?}, original_max_position = {orig}, beta_fast = 32.0, beta_slow = 1.0, attention_factor = {mscale:?}}} : f32[{t}, {h}, {d}]\n  output y = %y\n}}\n"
        );
        let want = reference(&src, vec![("x", Tensor::new(vec![t, h, d], x.clone())), ("p", Tensor::from_i32(vec![t], &pos))], &cx.none)?;
        let yarn = dsc_ir::Yarn { factor, original_max_position: orig, beta_fast: 32.0, beta_slow: 1.0, attention_factor: mscale };
        let (low, high) = yarn.ramp(theta, d);
        let spec =
            KernelSpec::RopeYarn { h, d, theta_bits: theta.to_bits(), interleaved, factor_bits: factor.to_bits(), low_bits: low.to_bits(), high_bits: high.to_bits(), mscale_bits: mscale.to_bits() };
        let (g, b) = grid(&spec.launch(), t * h * d / 2);
        cx.cases.push(Case {
            name: format!("rope_yarn {t}x{h}x{d} {style} factor {factor}"),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x), cx.data.push_i32(&pos)],
            scalars: vec![(t * h * d / 2) as i64],
            expected: cx.data.push(&want),
            init: None,
            written_inputs: vec![],
            tmaps: vec![],
            tol: 1e-4,
            cluster: None,
        });
        cx.specs.push(spec);
    }
    Ok(())
}
