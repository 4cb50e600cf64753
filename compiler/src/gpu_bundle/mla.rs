//! Kernel-check cases: Multi-head Latent Attention (`dsc_codegen::kernels::mla`).

use super::*;

/// MLA's attention over the latent cache (V2-Lite's 16 heads of 576 = 512 + 64, bf16 pool; a
/// tiny f32 one whose width is no multiple of 8) and the per-head matmuls of its absorbed form
/// (YaRN's rope: `rope::yarn_cases`).
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
        let inputs = vec![cx.data.push(&q), cx.data.push_kv(&cache, kv), cx.data.push_i32(&pos), cx.data.push_i32(&seq), cx.data.push_i32(&table)];
        let expected = cx.data.push(&want);
        let name = format!("mla_attention T{t} H{h} C{c} L{l} BS{bs}{}", kv_label(kv));
        cx.cases.push(case(name, &spec, grid(&spec.launch(), t), grid_rows(&spec.launch(), h), inputs, vec![t as i64, mb as i64], expected, 1e-4));
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
        let wa = cx.data.push_u8(&wb);
        let inputs = vec![cx.data.push(&x), wa];
        let expected = cx.data.push(&want);
        cx.cases.push(case(format!("head_matmul T{t} H{h} K{k} N{n} {wdtype}"), &spec, grid(&spec.launch(), h * n), t as u32, inputs, vec![(h * n) as i64], expected, 1e-5));
        cx.specs.push(spec);
    }
    Ok(())
}
