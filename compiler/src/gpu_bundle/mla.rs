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
    // the latent cache rows in one launch (`MlaLatentCache`, the schedule's
    // `mla-latent-cache`): V2-Lite's 512 + 64 with YaRN into a bf16 pool, a tiny f32 one with
    // plain RoPE, one whose L is no multiple of 32 — checked against the six ops it replaces
    for (l, r, kv, yarn, interleaved) in [(512usize, 64usize, DType::BF16, Some((40.0f32, 4096usize)), true), (32, 8, DType::F32, None, false), (40, 6, DType::BF16, Some((4.0, 64)), false)] {
        let (nb, bs, c) = (6usize, 4usize, l + r);
        let slots = [13i32, 2, 21, 7, 0];
        let pos = [1999i32, 0, 17, 300, 5];
        let t = slots.len();
        let x = cx.r.vec(t * c, -2.0, 2.0);
        let gw = cx.r.vec(l, 0.5, 1.5);
        let init = kv_round(&cx.r.vec(nb * bs * c, -1.0, 1.0), kv);
        let (theta, eps) = (10000.0f32, 1e-6f32);
        let style = if interleaved { "interleaved" } else { "half" };
        let rope = match yarn {
            Some((factor, orig)) => format!("rope_yarn(%pr, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {r}, factor = {factor:?}, original_max_position = {orig}, beta_fast = 32.0, beta_slow = 1.0, attention_factor = 1.0}}"),
            None => format!("rope(%pr, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {r}}}"),
        };
        let src = format!("graph \"k\" {{\n{}  output c = %w\n}}\n", latent_ops(t, l, r, nb, bs, kv, eps, &rope));
        let want = latent_run(&src, (&x, &pos, &slots), &gw, &init, vec![])?.remove("c").context("output")?.data;
        let yarn_bits = yarn.map(|(factor, orig)| {
            let y = dsc_ir::Yarn { factor, original_max_position: orig, beta_fast: 32.0, beta_slow: 1.0, attention_factor: 1.0 };
            match dsc_codegen::kernels::rope_yarn_spec(1, r, theta, interleaved, &y) {
                KernelSpec::RopeYarn { factor_bits, low_bits, high_bits, mscale_bits, .. } => [factor_bits, low_bits, high_bits, mscale_bits],
                other => unreachable!("{other:?}"),
            }
        });
        let spec = KernelSpec::MlaLatentCache { l, r, eps_bits: eps.to_bits(), theta_bits: theta.to_bits(), interleaved, yarn: yarn_bits, kv };
        let (gr, b) = grid(&spec.launch(), t);
        let init_arr = cx.data.push_kv(&init, kv);
        cx.cases.push(Case {
            name: format!("mla_latent_cache T{t} L{l} R{r} {style}{}{}", if yarn.is_some() { " yarn" } else { "" }, kv_label(kv)),
            kernel: spec.symbol(),
            grid: gr,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x), cx.data.push(&gw), cx.data.push_i32(&pos), cx.data.push_i32(&slots)],
            scalars: vec![t as i64],
            expected: cx.data.push(&want),
            init: Some(init_arr),
            written_inputs: vec![],
            tmaps: vec![],
            tol: kv_tol(kv, 1e-4),
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // the latent row written inside the attention (`MlaCacheAttention`, one-token steps:
    // the schedule's `mla-cache-attention`): V2-Lite's dims with YaRN into a bf16 pool, three
    // sequences of one token each (contexts 1, 201 and 1,024), the rows of earlier positions
    // random — checked against the six cache ops and the attention after them, the pool as a
    // written input
    {
        let (h, l, r, bs, kv) = (16usize, 512usize, 64usize, 16usize, DType::BF16);
        let c = l + r;
        let seqs = vec![(0usize, 1usize), (200, 201), (1023, 1024)];
        let nb = seqs.iter().map(|s| s.1.div_ceil(bs)).sum::<usize>() + 2;
        let Paged { mb, table, pos, seq } = paged(&seqs, bs, nb)?;
        let t = pos.len();
        let slots: Vec<i32> = (0..t).map(|i| table[seq[i] as usize * mb + pos[i] as usize / bs] * bs as i32 + pos[i] % bs as i32).collect();
        let x = cx.r.vec(t * c, -2.0, 2.0);
        let gw = cx.r.vec(l, 0.5, 1.5);
        let q = cx.r.vec(t * h * c, -1.0, 1.0);
        let init = kv_round(&cx.r.vec(nb * bs * c, -1.0, 1.0), kv);
        let (theta, eps, scale, factor, orig) = (10000.0f32, 1e-6f32, 0.1352f32, 40.0f32, 4096usize);
        let ns = seqs.len();
        let rope = format!("rope_yarn(%pr, %p) {{theta = {theta:?}, style = interleaved, rotary_dim = {r}, factor = {factor:?}, original_max_position = {orig}, beta_fast = 32.0, beta_slow = 1.0, attention_factor = 1.0}}");
        let src = format!(
            "graph \"k\" {{\n{}  %q = input : f32[{t}, {h}, {c}]\n  %sq = input : i32[{t}]\n  %tb = input : i32[{ns}, {mb}]\n  %o = mla_attention(%q, %w, %p, %sq, %tb) {{scale = {scale:?}, kv_lora_rank = {l}}} : f32[{t}, {h}, {l}]\n  output o = %o\n  output c = %w\n}}\n",
            latent_ops(t, l, r, nb, bs, kv, eps, &rope)
        );
        let extra = vec![("q", Tensor::new(vec![t, h, c], q.clone())), ("sq", Tensor::from_i32(vec![t], &seq)), ("tb", Tensor::from_i32(vec![ns, mb], &table))];
        let mut out = latent_run(&src, (&x, &pos, &slots), &gw, &init, extra)?;
        let (want_o, want_c) = (out.remove("o").context("o")?.data, out.remove("c").context("c")?.data);
        let y = dsc_ir::Yarn { factor, original_max_position: orig, beta_fast: 32.0, beta_slow: 1.0, attention_factor: 1.0 };
        let yarn = match dsc_codegen::kernels::rope_yarn_spec(1, r, theta, true, &y) {
            KernelSpec::RopeYarn { factor_bits, low_bits, high_bits, mscale_bits, .. } => Some([factor_bits, low_bits, high_bits, mscale_bits]),
            other => unreachable!("{other:?}"),
        };
        let write = KernelSpec::MlaLatentCache { l, r, eps_bits: eps.to_bits(), theta_bits: theta.to_bits(), interleaved: true, yarn, kv };
        let attn = KernelSpec::MlaAttention { h, c, l, bs, scale_bits: scale.to_bits(), kv };
        let spec = KernelSpec::MlaCacheAttention { attn: Box::new(attn), write: Box::new(write) };
        let inputs =
            vec![cx.data.push(&x), cx.data.push(&gw), cx.data.push_i32(&slots), cx.data.push(&q), cx.data.push_kv(&init, kv), cx.data.push_i32(&pos), cx.data.push_i32(&seq), cx.data.push_i32(&table)];
        let (gr, b) = grid(&spec.launch(), t);
        cx.cases.push(Case {
            name: format!("mla_cache_attention T{t} H{h} C{c} L{l} BS{bs} yarn{}", kv_label(kv)),
            kernel: spec.symbol(),
            grid: gr,
            grid_y: grid_rows(&spec.launch(), h),
            block: b,
            inputs,
            scalars: vec![t as i64, mb as i64],
            expected: cx.data.push(&want_o),
            init: None,
            written_inputs: vec![(4, cx.data.push(&want_c))],
            tmaps: vec![],
            tol: kv_tol(kv, 1e-4),
            cluster: None,
        });
        cx.specs.push(spec);
    }
    // the absorbed query in one launch (`MlaQuery`, the schedule's `mla-fusions`): V2-Lite's
    // 16 heads of 128 + 64 onto 512 with YaRN, a tiny f32 one with plain RoPE and K no
    // multiple of 8 — checked against the five ops it replaces
    // (and batched, `MlaQueryMma`, where it fits: 40 tokens, two warps' passes; the per-head
    // matmul's case below takes several passes a warp)
    let many: Vec<i32> = (0..40).map(|i| (i * 811 % 4000) as i32).collect();
    for (h, nope, r, l, wdtype, yarn, interleaved, pos) in [
        (16usize, 128usize, 64usize, 512usize, DType::BF16, Some((40.0f32, 4096usize)), true, vec![1999i32, 0, 17]),
        (16, 128, 64, 512, DType::BF16, Some((40.0f32, 4096usize)), true, many.clone()),
        (3, 12, 6, 20, DType::F32, None, false, vec![1999, 0, 17]),
    ] {
        let t = pos.len();
        let qw = nope + r;
        let x = cx.r.vec(t * h * qw, -1.0, 1.0);
        let wb = dsc_ir::quant::encode(wdtype, &cx.r.vec(h * l * nope, -0.2, 0.2)).context("encode")?;
        let theta = 10000.0f32;
        let style = if interleaved { "interleaved" } else { "half" };
        let rope = match yarn {
            Some((factor, orig)) => format!("rope_yarn(%qp, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {r}, factor = {factor:?}, original_max_position = {orig}, beta_fast = 32.0, beta_slow = 1.0, attention_factor = 1.0}}"),
            None => format!("rope(%qp, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {r}}}"),
        };
        let src = format!(
            "graph \"k\" {{\n  %x = input : f32[{t}, {h}, {qw}]\n  %w = weight : {wdtype}[{h}, {l}, {nope}]\n  %p = input : i32[{t}]\n  %qn = slice(%x) {{axis = 2, start = 0, len = {nope}}} : f32[{t}, {h}, {nope}]\n  %qp = slice(%x) {{axis = 2, start = {nope}, len = {r}}} : f32[{t}, {h}, {r}]\n  %qa = head_matmul(%qn, %w) {{transpose_b = true}} : f32[{t}, {h}, {l}]\n  %qr = {rope} : f32[{t}, {h}, {r}]\n  %y = concat(%qa, %qr) {{axis = 2}} : f32[{t}, {h}, {}]\n  output y = %y\n}}\n",
            l + r
        );
        let ws: Weights = [("w".to_string(), (wdtype, vec![h, l, nope], wb.clone()))].into_iter().collect();
        let want = reference(&src, vec![("x", Tensor::new(vec![t, h, qw], x.clone())), ("p", Tensor::from_i32(vec![t], &pos))], &ws)?;
        let yarn_bits = yarn.map(|(factor, orig)| {
            let y = dsc_ir::Yarn { factor, original_max_position: orig, beta_fast: 32.0, beta_slow: 1.0, attention_factor: 1.0 };
            match dsc_codegen::kernels::rope_yarn_spec(1, r, theta, interleaved, &y) {
                KernelSpec::RopeYarn { factor_bits, low_bits, high_bits, mscale_bits, .. } => [factor_bits, low_bits, high_bits, mscale_bits],
                other => unreachable!("{other:?}"),
            }
        });
        let spec = KernelSpec::MlaQuery { h, nope, r, l, wdtype, theta_bits: theta.to_bits(), interleaved, yarn: yarn_bits };
        let inputs = vec![cx.data.push(&x), cx.data.push_u8(&wb), cx.data.push_i32(&pos)];
        let expected = cx.data.push(&want);
        let name = format!("mla_query T{t} H{h} NOPE{nope} R{r} L{l} {wdtype} {style}{}", if yarn.is_some() { " yarn" } else { "" });
        if t > 8 {
            // (q's rows in two bf16 halves into the MMAs: f32-class products)
            let mma = KernelSpec::MlaQueryMma { h, nope, r, l, wdtype, theta_bits: theta.to_bits(), interleaved, yarn: yarn_bits };
            let work = l.div_ceil(16) * 16 + 16;
            cx.cases.push(case(format!("{name} mma"), &mma, grid(&mma.launch(), work), h as u32, inputs, vec![l as i64, t as i64], expected, 1e-4));
            cx.specs.push(mma);
            continue;
        }
        let outs = h * l + h;
        cx.cases.push(case(name, &spec, grid(&spec.launch(), outs), t as u32, inputs, vec![outs as i64], expected, 1e-4));
        cx.specs.push(spec);
    }
    // the absorbed form's per-head matmuls: (T, H, K, N, weights)
    // (and batched on the tensor cores, `HeadMatMulMma`: 37 and 150 tokens)
    for (t, h, k, n, wdtype) in [
        (3usize, 16usize, 128usize, 512usize, DType::BF16),
        (3, 16, 512, 128, DType::BF16),
        (5, 4, 16, 32, DType::F32),
        (2, 3, 20, 12, DType::F16),
        (150, 16, 512, 128, DType::BF16),
        (37, 3, 64, 40, DType::F16),
    ] {
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
        if t > 8 {
            let mma = KernelSpec::HeadMatMulMma { h, k, n, wdtype };
            cx.cases.push(case(format!("head_matmul_mma T{t} H{h} K{k} N{n} {wdtype}"), &mma, grid(&mma.launch(), n), h as u32, inputs, vec![n as i64, t as i64], expected, 1e-4));
            cx.specs.push(mma);
            continue;
        }
        cx.cases.push(case(format!("head_matmul T{t} H{h} K{k} N{n} {wdtype}"), &spec, grid(&spec.launch(), h * n), t as u32, inputs, vec![(h * n) as i64], expected, 1e-5));
        cx.specs.push(spec);
    }
    Ok(())
}

/// The six ops [`KernelSpec::MlaLatentCache`] replaces, as graph lines: the inputs %x [t, l + r],
/// %g (the norm's weight), %p (positions), %s (slots) and the pool %lc, then %w, the pool with
/// the t latent rows (the norm of the first l, `rope` of the last r) written.
#[allow(clippy::too_many_arguments)]
fn latent_ops(t: usize, l: usize, r: usize, nb: usize, bs: usize, kv: DType, eps: f32, rope: &str) -> String {
    let c = l + r;
    format!(
        "  %x = input : f32[{t}, {c}]\n  %g = weight : f32[{l}]\n  %p = input : i32[{t}]\n  %s = input : i32[{t}]\n  %lc = state : {kv}[{nb}, {bs}, 1, {c}]\n  %a = slice(%x) {{axis = 1, start = 0, len = {l}}} : f32[{t}, {l}]\n  %pe = slice(%x) {{axis = 1, start = {l}, len = {r}}} : f32[{t}, {r}]\n  %n = rms_norm(%a, %g) {{eps = {eps:?}}} : f32[{t}, {l}]\n  %nr = reshape(%n) : f32[{t}, 1, {l}]\n  %pr = reshape(%pe) : f32[{t}, 1, {r}]\n  %rr = {rope} : f32[{t}, 1, {r}]\n  %lat = concat(%nr, %rr) {{axis = 2}} : f32[{t}, 1, {c}]\n  %w = cache_write(%lc, %lat, %s) : {kv}[{nb}, {bs}, 1, {c}]\n"
    )
}

/// A graph built on [`latent_ops`] run by the CPU executor: `xps` its %x rows, positions and
/// slots, `gw` the norm's weight, `init` the pool, `extra` the graph's other inputs.
fn latent_run(src: &str, xps: (&[f32], &[i32], &[i32]), gw: &[f32], init: &[f32], extra: Vec<(&str, Tensor)>) -> anyhow::Result<BTreeMap<String, Tensor>> {
    let (x, pos, slots) = xps;
    let t = pos.len();
    let g = text::parse(src)?;
    let ws: Weights = [("g".to_string(), (DType::F32, vec![gw.len()], dsc_ir::quant::encode(DType::F32, gw).context("encode")?))].into_iter().collect();
    let mut ex = Executor::new(&g, &ws, BTreeMap::new())?;
    ex.state_mut("lc").context("lc")?.data.copy_from_slice(init);
    let mut inputs =
        BTreeMap::from([("x".to_string(), Tensor::new(vec![t, x.len() / t], x.to_vec())), ("p".to_string(), Tensor::from_i32(vec![t], pos)), ("s".to_string(), Tensor::from_i32(vec![t], slots))]);
    inputs.extend(extra.into_iter().map(|(n, v)| (n.to_string(), v)));
    Ok(ex.run(&inputs)?)
}
