//! Kernel-check cases: the attention family (`dsc_codegen::kernels::attention`).

use super::*;

/// The fused users of a merged Q/K/V matmul (QkvRopeCache).
pub(super) fn qkv_rope_cache(cx: &mut Cx) -> anyhow::Result<()> {
    // the fused users of a merged Q/K/V matmul: rope(q) out of place, rope(k) into the K pool,
    // v into the V pool (QkvRopeCache), both rope styles; the pools checked as written inputs
    // (and into bf16 pools)
    for (interleaved, kv) in [(false, DType::F32), (true, DType::F32), (false, DType::BF16)] {
        let (t, h, kvh, d, nb, bs, theta) = (5usize, 4usize, 2usize, 16usize, 3usize, 4usize, 10000.0f32);
        let style = if interleaved { "interleaved" } else { "half" };
        let xq = cx.r.vec(t * h * d, -1.0, 1.0);
        let xk = cx.r.vec(t * kvh * d, -1.0, 1.0);
        let xv = cx.r.vec(t * kvh * d, -1.0, 1.0);
        let pos: Vec<i32> = (0..t).map(|i| [0, 1, 77, 4095, 9][i]).collect();
        let slots: Vec<i32> = (0..t).map(|i| [3, 0, 11, 7, 5][i]).collect();
        let kc0 = kv_round(&cx.r.vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let vc0 = kv_round(&cx.r.vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let rope_src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {h}, {d}]\n  %p = input : i32[{t}]\n  %y = rope(%x, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}}} : f32[{t}, {h}, {d}]\n  output y = %y\n}}\n");
        let want_q = reference(&rope_src, vec![("x", Tensor::new(vec![t, h, d], xq.clone())), ("p", Tensor::from_i32(vec![t], &pos))], &Weights::new())?;
        let cache = |x: &[f32], c0: &[f32], rope: bool| -> anyhow::Result<Vec<f32>> {
            let op = if rope { format!("rope_cache_write(%c, %x, %s, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}}}") } else { "cache_write(%c, %x, %s)".to_string() };
            let src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {kvh}, {d}]\n  %s = input : i32[{t}]\n  %p = input : i32[{t}]\n  %c = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %w = {op} : {kv}[{nb}, {bs}, {kvh}, {d}]\n  output c = %w\n}}\n");
            let g = text::parse(&src)?;
            let mut ex = Executor::new(&g, &cx.none, BTreeMap::new())?;
            ex.state_mut("c").context("state c")?.data.copy_from_slice(c0);
            let ins =
                BTreeMap::from([("x".to_string(), Tensor::new(vec![t, kvh, d], x.to_vec())), ("s".to_string(), Tensor::from_i32(vec![t], &slots)), ("p".to_string(), Tensor::from_i32(vec![t], &pos))]);
            Ok(ex.run(&ins)?.into_values().next().context("one output")?.data)
        };
        let want_k = cache(&xk, &kc0, true)?;
        let want_v = cache(&xv, &vc0, false)?;
        let spec = KernelSpec::QkvRopeCache { h, kvh, d, theta_bits: theta.to_bits(), interleaved, kv };
        let items = t * d / 2 * (h + 2 * kvh);
        let (g, b) = grid(&spec.launch(), items);
        let (kca, vca) = (cx.data.push_kv(&kc0, kv), cx.data.push_kv(&vc0, kv));
        let (wk, wv) = (cx.data.push(&want_k), cx.data.push(&want_v));
        cx.cases.push(Case {
            name: format!("qkv_rope_cache {t} tokens {h}/{kvh}x{d} {style}{}", kv_label(kv)),
            kernel: spec.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&xq), cx.data.push(&xk), cx.data.push(&xv), cx.data.push_i32(&pos), cx.data.push_i32(&slots), kca, vca],
            scalars: vec![items as i64, (t * h * d / 2) as i64, (t * kvh * d / 2) as i64],
            expected: cx.data.push(&want_q),
            init: None,
            written_inputs: vec![(5, wk.clone()), (6, wv.clone())],
            tmaps: vec![],
            // the rope kernels' bound (approximate sin/cos after range reduction; pos 4095; a
            // bf16 pool: a value near a rounding boundary may round the other way)
            tol: kv_tol(kv, 1e-4),
            cluster: None,
        });
        cx.specs.push(spec.clone());
        // ... reading q, k and v as the sums of two split-K partial-sum slices of the merged
        // node (QkvRopeSplitK, DSC_SPLITK_ROPE): part-major q, k, v in a slice, slice 1 random,
        // slice 0 the rest
        let merged: Vec<f32> = xq.iter().chain(&xk).chain(&xv).copied().collect();
        let r = cx.r.vec(merged.len(), -1.0, 1.0);
        let parts: Vec<f32> = merged.iter().zip(&r).map(|(x, r)| x - r).chain(r.iter().copied()).collect();
        let split = KernelSpec::QkvRopeSplitK { inner: Box::new(spec), splits: 2 };
        let (kca, vca) = (cx.data.push_kv(&kc0, kv), cx.data.push_kv(&vc0, kv));
        cx.cases.push(Case {
            name: format!("qkv_rope_cache split-K 2 {t} tokens {h}/{kvh}x{d} {style}{}", kv_label(kv)),
            kernel: split.symbol(),
            grid: g,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&parts), cx.data.push_i32(&pos), cx.data.push_i32(&slots), kca, vca],
            scalars: vec![items as i64, (t * h * d / 2) as i64, (t * kvh * d / 2) as i64, merged.len() as i64, 0, (t * h * d) as i64, (t * (h + kvh) * d) as i64],
            expected: cx.data.push(&want_q),
            init: None,
            written_inputs: vec![(3, cx.data.push(&want_k)), (4, cx.data.push(&want_v))],
            tmaps: vec![],
            // (x - r + r: one rounding more than the plain kernel's inputs)
            tol: kv_tol(kv, 1e-4),
            cluster: None,
        });
        cx.specs.push(split);
    }
    Ok(())
}

/// Cache_write, the decode attention (one-pass, split, grouped) and the prefill attention.
pub(super) fn paged_flash(cx: &mut Cx) -> anyhow::Result<()> {
    // cache_write into a randomly filled pool (f32, bf16), and paged attention over scattered
    // blocks
    for kv in [DType::F32, DType::BF16] {
        let (nb, bs, kvh, d) = (8usize, 4usize, 3usize, 64usize);
        let row = kvh * d;
        let slots = [13i32, 2, 30, 7, 21];
        let t = slots.len();
        let x = cx.r.vec(t * row, -1.0, 1.0);
        let init = kv_round(&cx.r.vec(nb * bs * row, -1.0, 1.0), kv);
        let src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {kvh}, {d}]\n  %s = input : i32[{t}]\n  %c = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %w = cache_write(%c, %x, %s) : {kv}[{nb}, {bs}, {kvh}, {d}]\n  output c = %w\n}}\n");
        let g = text::parse(&src)?;
        let mut ex = Executor::new(&g, &cx.none, BTreeMap::new())?;
        ex.state_mut("c").context("state c")?.data.copy_from_slice(&init);
        let want = ex.run(&BTreeMap::from([("x".to_string(), Tensor::new(vec![t, kvh, d], x.clone())), ("s".to_string(), Tensor::from_i32(vec![t], &slots))]))?.remove("c").context("output")?.data;
        let spec = KernelSpec::CacheWrite { row, kv };
        let (gr, b) = grid(&spec.launch(), t * row);
        let init_arr = cx.data.push_kv(&init, kv);
        cx.cases.push(Case {
            name: format!("cache_write {t} rows of {row}{}", kv_label(kv)),
            kernel: spec.symbol(),
            grid: gr,
            grid_y: 1,
            block: b,
            inputs: vec![cx.data.push(&x), cx.data.push_i32(&slots)],
            scalars: vec![(t * row) as i64],
            expected: cx.data.push(&want),
            init: Some(init_arr.clone()),
            written_inputs: vec![],
            tmaps: vec![],
            tol: 0.0,
            cluster: None,
        });
        cx.specs.push(spec);
        // the optimizer's rope-cache-write fusion: the same rows, rotated on the way in
        for interleaved in [false, true] {
            let pos = [1999i32, 0, 17, 300, 5];
            let style = if interleaved { "interleaved" } else { "half" };
            let theta = 500000.0f32;
            let src = format!("graph \"k\" {{\n  %x = input : f32[{t}, {kvh}, {d}]\n  %s = input : i32[{t}]\n  %p = input : i32[{t}]\n  %c = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %w = rope_cache_write(%c, %x, %s, %p) {{theta = {theta:?}, style = {style}, rotary_dim = {d}}} : {kv}[{nb}, {bs}, {kvh}, {d}]\n  output c = %w\n}}\n");
            let g = text::parse(&src)?;
            let mut ex = Executor::new(&g, &cx.none, BTreeMap::new())?;
            ex.state_mut("c").context("state c")?.data.copy_from_slice(&init);
            let ins =
                BTreeMap::from([("x".to_string(), Tensor::new(vec![t, kvh, d], x.clone())), ("s".to_string(), Tensor::from_i32(vec![t], &slots)), ("p".to_string(), Tensor::from_i32(vec![t], &pos))]);
            let want = ex.run(&ins)?.remove("c").context("output")?.data;
            let spec = KernelSpec::RopeCacheWrite { h: kvh, d, theta_bits: theta.to_bits(), interleaved, kv };
            let (gr, b) = grid(&spec.launch(), t * row / 2);
            cx.cases.push(Case {
                name: format!("rope_cache_write {t} rows of {kvh}x{d} {style}{}", kv_label(kv)),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: 1,
                block: b,
                inputs: vec![cx.data.push(&x), cx.data.push_i32(&pos), cx.data.push_i32(&slots)],
                scalars: vec![(t * row / 2) as i64],
                expected: cx.data.push(&want),
                init: Some(init_arr.clone()),
                written_inputs: vec![],
                tmaps: vec![],
                tol: kv_tol(kv, 1e-4),
                cluster: None,
            });
            cx.specs.push(spec);
        }
    }
    // (the last two: the prefill kernel, FlashAttention, on tiles that mix a prefill chunk, a
    // chunk after a cached prefix and decode tokens, and on a partial last tile)
    // (then bf16 pools: the decode kernels, the split pass and the prefill kernel again)
    let (f32_, bf16_) = (DType::F32, DType::BF16);
    let mut prefetched = None;
    for (h, kvh, d, bs, nb, seqs, kv, qs) in [
        (9usize, 3usize, 64usize, 4usize, 12usize, vec![(0usize, 11usize), (0, 6)], f32_, 1.0f32),
        (32, 8, 128, 16, 19, vec![(257, 260), (0, 1)], f32_, 1.0),
        (8, 2, 64, 16, 78, vec![(999, 1000), (200, 201)], f32_, 1.0),
        (8, 2, 128, 16, 18, vec![(0, 150), (40, 70), (0, 1), (9, 10)], f32_, 1.0),
        (9, 3, 64, 4, 24, vec![(0, 70), (5, 6)], f32_, 1.0),
        (9, 3, 64, 4, 12, vec![(0, 11), (0, 6)], bf16_, 1.0),
        // (smaller pools than the f32 cases': the bundle shares one call's 64 MiB)
        (32, 8, 128, 16, 12, vec![(97, 100), (0, 1)], bf16_, 1.0),
        (8, 2, 128, 16, 52, vec![(599, 600), (200, 201)], bf16_, 1.0),
        (8, 2, 128, 16, 18, vec![(0, 150), (40, 70), (0, 1), (9, 10)], bf16_, 1.0),
        (9, 3, 64, 4, 24, vec![(0, 70), (5, 6)], bf16_, 1.0),
        // (the wgmma kernel's head dims and block sizes crossed)
        (9, 3, 128, 4, 24, vec![(0, 70), (5, 6)], bf16_, 1.0),
        (8, 2, 64, 16, 18, vec![(0, 150), (40, 70), (0, 1), (9, 10)], bf16_, 1.0),
        // (the wgmma kernel's TMA boxes: 32-position cache blocks, two boxes per 64-key tile,
        // and 128-position ones, a box starting half-way into a block; 4 heads: the bundle's
        // data must fit a call)
        (4, 1, 128, 32, 10, vec![(0, 100), (40, 70), (0, 1), (9, 10)], bf16_, 1.0),
        (4, 1, 128, 128, 3, vec![(0, 130), (40, 70)], bf16_, 1.0),
        // (queries x 20: scores of ~10 log2 units' deviation, so a row's max jumps by more than
        // the wgmma kernel's lazy-rescale threshold from tile to tile and both of its paths run;
        // a looser tolerance: Q's bf16 rounding is ~20x larger in the scores)
        (4, 1, 128, 16, 18, vec![(0, 150), (40, 70), (0, 1), (9, 10)], bf16_, 20.0),
    ] {
        let Paged { mb, table, pos, seq } = paged(&seqs, bs, nb)?;
        let t = pos.len();
        let q = cx.r.vec(t * h * d, -qs, qs);
        let kc = kv_round(&cx.r.vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let vc = kv_round(&cx.r.vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let scale = 1.0 / (d as f32).sqrt();
        let ns = seqs.len();
        let src = format!("graph \"k\" {{\n  %q = input : f32[{t}, {h}, {d}]\n  %pos = input : i32[{t}]\n  %seq = input : i32[{t}]\n  %table = input : i32[{ns}, {mb}]\n  %kc = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %vc = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {{scale = {scale:?}}} : f32[{t}, {h}, {d}]\n  output o = %o\n}}\n");
        let g = text::parse(&src)?;
        let mut ex = Executor::new(&g, &cx.none, BTreeMap::new())?;
        ex.state_mut("kc").context("kc")?.data.copy_from_slice(&kc);
        ex.state_mut("vc").context("vc")?.data.copy_from_slice(&vc);
        let want = ex
            .run(&BTreeMap::from([
                ("q".to_string(), Tensor::new(vec![t, h, d], q.clone())),
                ("pos".to_string(), Tensor::from_i32(vec![t], &pos)),
                ("seq".to_string(), Tensor::from_i32(vec![t], &seq)),
                ("table".to_string(), Tensor::from_i32(vec![ns, mb], &table)),
            ]))?
            .remove("o")
            .context("output")?
            .data;
        let inputs = vec![cx.data.push(&q), cx.data.push_kv(&kc, kv), cx.data.push_kv(&vc, kv), cx.data.push_i32(&pos), cx.data.push_i32(&seq), cx.data.push_i32(&table)];
        let expected = cx.data.push(&want);
        // (8 warps of query rows per block too, from bf16 pools)
        // (and 2 m16 tiles per warp: 32 rows)
        let shapes: &[(usize, usize)] = if kv == DType::F32 || d % 32 != 0 { &[(4, 1)] } else { &[(4, 1), (8, 1), (4, 2)] };
        // (and the wgmma kernel, sm_90a: bf16 pools, 4 warps of one m-tile, D 128)
        let wg = (kv == DType::BF16 && dsc_codegen::kernels::flash_wg_d_ok(d)).then_some((4usize, 0usize));
        for &(warps, mtiles) in shapes.iter().chain(wg.iter()).filter(|_| t > 64) {
            let flash = KernelSpec::FlashAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), kv, warps, mtiles: mtiles.max(1) };
            // (mtiles 0 marks the wgmma variant)
            let spec = if mtiles == 0 { KernelSpec::FlashWgmma { inner: Box::new(flash) } } else { flash };
            let mtiles = mtiles.max(1);
            cx.cases.push(Case {
                name: format!(
                    "flash_attn T{t} H{h}/{kvh} D{d} {} sequences{}{}{}{}{}",
                    seqs.len(),
                    if qs == 1.0 { String::new() } else { format!(" q x{qs}") },
                    kv_label(kv),
                    if warps == 4 { String::new() } else { format!(" {warps} warps") },
                    if mtiles == 1 { String::new() } else { format!(" {mtiles} m-tiles") },
                    if matches!(spec, KernelSpec::FlashWgmma { .. }) { " wgmma" } else { "" }
                ),
                kernel: spec.symbol(),
                // (the wgmma kernel: heads per block as its launch says)
                grid: grid(&spec.launch(), h).0,
                grid_y: grid_rows(&spec.launch(), t),
                block: grid(&spec.launch(), 1).1,
                inputs: inputs.clone(),
                scalars: vec![t as i64, mb as i64],
                expected: expected.clone(),
                init: None,
                written_inputs: vec![],
                // (the wgmma kernel with TMA tiles: the pools' tensor maps)
                tmaps: match dsc_codegen::kernels::flash_wg_tma_rows(bs).filter(|_| matches!(spec, KernelSpec::FlashWgmma { .. })) {
                    Some(rows) => (1..3).map(|input| TmapInput { input, n: 0, k: 0, rows: rows as u32, f16: false, pool: Some([nb, bs, kvh, d]) }).collect(),
                    None => vec![],
                },
                tol: if qs == 1.0 { 1e-2 } else { 5e-2 },
                cluster: None,
            });
            cx.specs.push(spec);
        }
        if t > 64 {
            continue;
        }
        // 16 warps per block and 4 keys per warp step (the defaults), 4 warps (DSC_ATTN_WARPS
        // sweeps), one key and 3 (a step straddling the context's end: DSC_ATTN_KEYS), on
        // the same data
        // ... and the grouped kernel of batched decode (a block per (token, KV head): 8 warps,
        // and 4 with 3 keys; and per half a KV head's group, as models whose whole group does
        // not fit a block take: `lower::attention_group_size`)
        let rep = h / kvh;
        let mut variants = vec![(4usize, 4usize, 1usize), (16, 4, 1), (16, 1, 1), (4, 3, 1)];
        if kv != DType::F32 {
            variants = vec![(16, 4, 1), (4, 3, 1)];
        }
        if rep > 1 {
            variants.extend([(8, 4, rep), (4, 3, rep)]);
        }
        if rep % 2 == 0 && rep > 2 {
            variants.push((8, 4, rep / 2));
        }
        for (warps, keys, group) in variants {
            let spec = KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps, keys, group, kv };
            // (a block per (token, group of heads))
            let (gr, b) = grid(&spec.launch(), t);
            cx.cases.push(Case {
                name: format!(
                    "paged_attn T{t} H{h}/{kvh} D{d}{}{}{}{}",
                    if warps == 16 { String::new() } else { format!(" {warps} warps") },
                    if keys == 4 { String::new() } else { format!(" {keys} keys") },
                    if group == 1 { String::new() } else { format!(" groups of {group}") },
                    kv_label(kv)
                ),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: (h / group) as u32,
                block: b,
                inputs: inputs.clone(),
                scalars: vec![(t * h) as i64, mb as i64],
                expected: expected.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-4,
                cluster: None,
            });
            cx.specs.push(spec);
        }
        // ... prefetching another buffer's bytes into L2 first (`PrefetchL2`: the next
        // matmul's weights; 100,003 f32, split over the blocks — one buffer for every case),
        // the one-pass and the grouped kernel: the same outputs
        let pf = prefetched.get_or_insert_with(|| cx.data.push(&cx.r.vec(100_003, -1.0, 1.0))).clone();
        for (warps, group) in [(16usize, 1usize), (dsc_codegen::schedule::ATTN_GROUP_WARPS, rep)].into_iter().filter(|_| kv == DType::F32) {
            let spec = KernelSpec::PrefetchL2 { inner: Box::new(KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps, keys: 4, group, kv }) };
            let (gr, b) = grid(&spec.launch(), t);
            let mut ins = vec![pf.clone()];
            ins.extend(inputs.iter().cloned());
            cx.cases.push(Case {
                name: format!("paged_attn T{t} H{h}/{kvh} D{d}{} + L2 prefetch", if group == 1 { String::new() } else { format!(" groups of {group}") }),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: (h / group) as u32,
                block: b,
                inputs: ins,
                scalars: vec![(t * h) as i64, mb as i64, 100_003 * 4],
                expected: expected.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-4,
                cluster: None,
            });
            cx.specs.push(spec);
        }
        // the split decode attention (DSC_SPLIT_KV): its first pass against partial states
        // computed here, then its merge from those states against the executor's output;
        // the plans' split (16 parts of 256+ keys) and a small one that every context fills
        for (ns, mk, warps, keys) in [(dsc_codegen::schedule::ATTN_SPLITS, dsc_codegen::schedule::ATTN_SPLIT_MIN_KEYS, 16usize, 4usize), (4, 8, 4, 3)] {
            // (the plans' split only where a context is long enough to be cut: the bundle
            // shares one call's 64 MiB with the runtime)
            if pos.iter().all(|&p| (p as usize) < mk) && ns == dsc_codegen::schedule::ATTN_SPLITS {
                continue;
            }
            let parts = split_partials(&q, &kc, &vc, &pos, &seq, &table, (h, kvh, d, bs, mb), scale, ns, mk);
            let pa = cx.data.push(&parts);
            let zeros = cx.data.push(&vec![0.0f32; parts.len()]);
            // (a block per (token, head, part), and per (token, KV head, part): the grouped
            // kernel of models with 8+ KV heads)
            for group in [1, rep].into_iter().filter(|&g| g == 1 || rep > 1) {
                let spec = KernelSpec::PagedAttentionSplit { h, kvh, d, bs, scale_bits: scale.to_bits(), warps, keys, splits: ns, min_keys: mk, group, kv };
                let (gr, b) = grid(&spec.launch(), t);
                let mut ins = inputs.clone();
                ins.truncate(6);
                cx.cases.push(Case {
                    name: format!("paged_attn split {ns}x{mk} T{t} H{h}/{kvh} D{d}{}{}", if group == 1 { String::new() } else { format!(" groups of {group}") }, kv_label(kv)),
                    kernel: spec.symbol(),
                    grid: gr,
                    grid_y: (h / group * ns) as u32,
                    block: b,
                    inputs: ins,
                    scalars: vec![(t * h) as i64, mb as i64],
                    expected: pa.clone(),
                    // (parts past a row's se are not written)
                    init: Some(zeros.clone()),
                    written_inputs: vec![],
                    tmaps: vec![],
                    tol: 1e-4,
                    cluster: None,
                });
                cx.specs.push(spec);
            }
            let spec = KernelSpec::AttentionCombine { h, d, splits: ns, min_keys: mk };
            let (gr, b) = grid(&spec.launch(), t * h);
            cx.cases.push(Case {
                name: format!("attn combine {ns}x{mk} T{t} H{h} D{d}"),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: 1,
                block: b,
                inputs: vec![pa.clone(), cx.data.push_i32(&pos)],
                scalars: vec![(t * h) as i64],
                expected: expected.clone(),
                init: None,
                written_inputs: vec![],
                tmaps: vec![],
                tol: 1e-4,
                cluster: None,
            });
            cx.specs.push(spec);
        }
    }
    Ok(())
}

/// The decode attention with RoPE and the cache writes folded in, and with q, k, v computed by the attention itself.
pub(super) fn rope_qkv_attention(cx: &mut Cx) -> anyhow::Result<()> {
    // the decode attention with RoPE and the K/V cache writes folded in (`RopeAttention`, one
    // token per sequence as the lowering uses it at batch 1; here 3 sequences): the output and
    // both pools against rope + rope_cache_write + cache_write + paged_attention
    // (the 8B shape's head dim and GQA group with 8 of its heads — small pools: the bundle
    // shares one call's 64 MiB —; SmolLM2's shape with f32 pools, as its real model's plan;
    // and bf16 pools)
    // (last: the SmolLM2 plans' one-token layer — q, k and v from x by the attention itself,
    // `QkvAttentionO` over a K = 576 x, the only case of that configuration; and with Q4_1
    // W_q/W_k/W_v and W_o, as the GGUF plans: bf16 pools as the seeded Q4_1 shape's, f32 as the
    // real SmolLM2 plan's)
    for (h, kvh, d, bs, interleaved, kv, qkv) in [
        (8usize, 2usize, 128usize, 16usize, false, DType::F32, None),
        (8, 2, 128, 16, false, DType::BF16, None),
        (9, 3, 64, 16, false, DType::F32, None),
        (9, 3, 64, 4, true, DType::BF16, None),
        (9, 3, 64, 16, false, DType::BF16, Some((264usize, DType::BF16))),
        (9, 3, 64, 16, false, DType::BF16, Some((288, DType::Q4_1))),
        (9, 3, 64, 16, false, DType::F32, Some((288, DType::Q4_1))),
    ] {
        let wdt = qkv.map_or(DType::BF16, |(_, w)| w);
        let qkv = qkv.map(|(kk, _)| kk);
        let theta = 500000.0f32;
        // (q/k/v from x: also 300 keys, past one warp step of every warp of every block of the
        // cluster that splits them — 4 x 16 x 4 —, so the loop's later steps and this token's
        // row in one of them are checked too, and 1 key, where three of the four blocks have
        // none; K 264: a partial last round of 16-byte pieces, as the plans' 576; the others
        // keep their small pools: the bundle's data is near the 64 MiB a call carries)
        let lens: &[usize] = if qkv.is_some() { &[21, 1, 300] } else { &[21, 1, 40] };
        let t = lens.len();
        let mb = lens.iter().map(|l| l.div_ceil(bs)).max().unwrap_or(1);
        let nb = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 2;
        let mut table = vec![-1i32; t * mb];
        let mut next = nb as i32 - 1;
        for (si, l) in lens.iter().enumerate() {
            for j in 0..l.div_ceil(bs) {
                table[si * mb + j] = next;
                next -= 1;
            }
        }
        let pos: Vec<i32> = lens.iter().map(|&l| l as i32 - 1).collect();
        let seq: Vec<i32> = (0..t as i32).collect();
        let slots: Vec<i32> = (0..t).map(|i| table[i * mb + pos[i] as usize / bs] * bs as i32 + pos[i] % bs as i32).collect();
        let (mut xq, mut xk, mut xv) = (cx.r.vec(t * h * d, -1.0, 1.0), cx.r.vec(t * kvh * d, -1.0, 1.0), cx.r.vec(t * kvh * d, -1.0, 1.0));
        // (QkvAttentionO: q, k and v = RMSNorm(x) · g times bf16 (or Q4_1) W_q, W_k, W_v, as
        // the graph's rms_norm + matmul compute them on the host; `ws` the weights' values,
        // `wenc` their bytes)
        let mut wenc: Vec<Vec<u8>> = vec![];
        let qkv_in = qkv.map(|kk| {
            let x = cx.r.vec(t * kk, -1.0, 1.0);
            let gw = cx.r.vec(kk, 0.5, 1.5);
            let ws: Vec<Vec<f32>> = [h, kvh, kvh]
                .iter()
                .map(|&heads| {
                    let w = cx.r.vec(heads * d * kk, -0.05, 0.05);
                    let e = dsc_ir::quant::encode(wdt, &w).expect("bf16 and Q4_1 encode any K-multiple-of-32 rows");
                    let v = dsc_ir::quant::decode(wdt, &e, w.len()).expect("decodes what it encoded");
                    wenc.push(e);
                    v
                })
                .collect();
            let eps = 1e-5f32;
            let xn: Vec<f32> = (0..t * kk)
                .map(|i| {
                    let row = &x[(i / kk) * kk..(i / kk + 1) * kk];
                    let inv = 1.0 / (row.iter().map(|v| v * v).sum::<f32>() / kk as f32 + eps).sqrt();
                    x[i] * inv * gw[i % kk]
                })
                .collect();
            let proj = |w: &[f32], rows: usize| -> Vec<f32> { (0..t * rows).map(|i| (0..kk).map(|j| w[(i % rows) * kk + j] * xn[(i / rows) * kk + j]).sum()).collect() };
            (kk, eps, x.clone(), gw.clone(), proj(&ws[0], h * d), proj(&ws[1], kvh * d), proj(&ws[2], kvh * d), ws)
        });
        if let Some((_, _, _, _, q, k, v, _)) = &qkv_in {
            (xq, xk, xv) = (q.clone(), k.clone(), v.clone());
        }
        let kc0 = kv_round(&cx.r.vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let vc0 = kv_round(&cx.r.vec(nb * bs * kvh * d, -1.0, 1.0), kv);
        let scale = 1.0 / (d as f32).sqrt();
        let style = if interleaved { "interleaved" } else { "half" };
        let r = format!("{{theta = {theta:?}, style = {style}, rotary_dim = {d}}}");
        let src = format!(
            "graph \"k\" {{\n  %xq = input : f32[{t}, {h}, {d}]\n  %xk = input : f32[{t}, {kvh}, {d}]\n  %xv = input : f32[{t}, {kvh}, {d}]\n  %pos = input : i32[{t}]\n  %seq = input : i32[{t}]\n  %slots = input : i32[{t}]\n  %table = input : i32[{t}, {mb}]\n  %kc = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %vc = state : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %q = rope(%xq, %pos) {r} : f32[{t}, {h}, {d}]\n  %kw = rope_cache_write(%kc, %xk, %slots, %pos) {r} : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %vw = cache_write(%vc, %xv, %slots) : {kv}[{nb}, {bs}, {kvh}, {d}]\n  %o = paged_attention(%q, %kw, %vw, %pos, %seq, %table) {{scale = {scale:?}}} : f32[{t}, {h}, {d}]\n  output o = %o\n  output k = %kw\n  output v = %vw\n}}\n"
        );
        let g = text::parse(&src)?;
        let mut ex = Executor::new(&g, &cx.none, BTreeMap::new())?;
        ex.state_mut("kc").context("kc")?.data.copy_from_slice(&kc0);
        ex.state_mut("vc").context("vc")?.data.copy_from_slice(&vc0);
        let mut outs = ex.run(&BTreeMap::from([
            ("xq".to_string(), Tensor::new(vec![t, h, d], xq.clone())),
            ("xk".to_string(), Tensor::new(vec![t, kvh, d], xk.clone())),
            ("xv".to_string(), Tensor::new(vec![t, kvh, d], xv.clone())),
            ("pos".to_string(), Tensor::from_i32(vec![t], &pos)),
            ("seq".to_string(), Tensor::from_i32(vec![t], &seq)),
            ("slots".to_string(), Tensor::from_i32(vec![t], &slots)),
            ("table".to_string(), Tensor::from_i32(vec![t, mb], &table)),
        ]))?;
        let (o, k, v) = (outs.remove("o").context("o")?.data, outs.remove("k").context("k")?.data, outs.remove("v").context("v")?.data);
        // (the keys per warp step the plans take: DSC_ATTN_KEYS at bundle time checks another)
        let inner = KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps: 16, keys: cx.opts.schedule.attn_keys, group: 1, kv };
        let spec = KernelSpec::RopeAttention { inner: Box::new(inner), theta_bits: theta.to_bits(), interleaved };
        let (gr, b) = grid(&spec.launch(), t);
        let (wk, wv) = (cx.data.push(&k), cx.data.push(&v));
        let qkv_args = qkv_in.as_ref().map(|(_, _, x, gw, ..)| [cx.data.push(x), cx.data.push(gw), cx.data.push_u8(&wenc[0]), cx.data.push_u8(&wenc[1]), cx.data.push_u8(&wenc[2])]);
        let heads = match &qkv_args {
            Some(a) => a.to_vec(),
            None => vec![cx.data.push(&xq), cx.data.push(&xk), cx.data.push(&xv)],
        };
        let inputs: Vec<Array> = heads
            .into_iter()
            .chain([cx.data.push_i32(&pos), cx.data.push_i32(&slots), cx.data.push_kv(&kc0, kv), cx.data.push_kv(&vc0, kv), cx.data.push_i32(&seq), cx.data.push_i32(&table)])
            .collect();
        // (the pools' and the accumulators' places in the inputs)
        let at = inputs.len() - 9;
        if qkv.is_none() {
            cx.cases.push(Case {
                name: format!("paged_attn + rope + cache writes T{t} H{h}/{kvh} D{d} {style}{}", kv_label(kv)),
                kernel: spec.symbol(),
                grid: gr,
                grid_y: h as u32,
                block: b,
                inputs: inputs.clone(),
                scalars: vec![(t * h) as i64, mb as i64],
                expected: cx.data.push(&o),
                init: None,
                written_inputs: vec![(5, wk.clone()), (6, wv.clone())],
                tmaps: vec![],
                // (the rope kernels' approximate sin/cos; a bf16 pool's rounding of k may flip)
                tol: kv_tol(kv, 1e-4),
                cluster: None,
            });
            cx.specs.push(spec.clone());
        }
        // ... with the o projection and its residual folded in (`AttentionO`, the SmolLM2
        // shape's head dim): y = res + o W_oᵀ over N = 520 rows (two rounds of the block's 512
        // threads, the second partial), the counters back at zero after. A probe the plans do
        // not use (measured slower): in the bundle under DSC_ATTN_O=1 only — the whole
        // bundle's data must fit one call's 64 MiB
        // With `red` (the default plans' one-token path, `AttentionO { red }`): each head adds
        // its projection (head 0: + the residual) into the output and a second accumulator,
        // both zero before the launch.
        // (`splits` blocks per head, each adding its part of the rows)
        // (one W_o, residual and result for every variant: the bundle's data is near the
        // 64 MiB a call carries)
        let nn = if qkv.is_some() { 128usize } else { 520 };
        let shared = ((kv == DType::BF16 || qkv.is_some()) && d == 64).then(|| {
            let we = dsc_ir::quant::encode(wdt, &cx.r.vec(nn * h * d, -0.1, 0.1)).expect("bf16 and Q4_1 encode H·D-wide rows");
            let wo = dsc_ir::quant::decode(wdt, &we, nn * h * d).expect("decodes what it encoded");
            let res = cx.r.vec(t * nn, -1.0, 1.0);
            let y = o_projected(&o, &wo, &res, nn, h * d);
            (cx.data.push_u8(&we), cx.data.push(&res), cx.data.push(&y), cx.data.push(&vec![0.0; t * nn]))
        });
        // (q/k/v from x: in the plans' clusters, `ScheduleOptions::attn_o_splits`)
        let qkv_splits = [(true, cx.opts.schedule.attn_o_splits)];
        let variants: &[(bool, usize)] = if qkv.is_some() { &qkv_splits } else { &[(false, 1), (true, 1), (true, 4)] };
        for &(red, splits) in variants {
            let Some((wo_a, res_a, y_a, zeros)) = shared.clone() else { continue };
            if !(red || cx.opts.schedule.attn_o) {
                continue;
            }
            let fused = KernelSpec::AttentionO { inner: Box::new(spec.clone()), n: nn, red, splits, wdtype: wdt };
            if red {
                // (q/k/v from x: a head's blocks a cluster on sm_90a)
                let (fk, name, cluster) = match &qkv_in {
                    Some((kk, eps, ..)) => (
                        KernelSpec::QkvAttentionO { inner: Box::new(fused), k: *kk, eps_bits: eps.to_bits(), cluster: splits, wdtype: wdt },
                        format!("paged_attn + q/k/v from x (K {kk}, {wdt}) + rope + cache writes + o projection added T{t} H{h}/{kvh} D{d} N{nn} clusters of {splits} {style}{}", kv_label(kv)),
                        Some(splits as u32),
                    ),
                    None => (fused, format!("paged_attn + rope + cache writes + o projection added T{t} H{h}/{kvh} D{d} N{nn} {splits} block(s) per head {style}{}", kv_label(kv)), None),
                };
                cx.cases.push(Case {
                    name,
                    kernel: fk.symbol(),
                    grid: gr,
                    grid_y: (h * splits) as u32,
                    block: b,
                    inputs: inputs.iter().cloned().chain([wo_a, res_a, zeros.clone()]).collect(),
                    scalars: vec![(t * h) as i64, mb as i64],
                    expected: y_a.clone(),
                    init: Some(zeros),
                    written_inputs: vec![(at + 5, wk.clone()), (at + 6, wv.clone()), (at + 11, y_a)],
                    tmaps: vec![],
                    tol: kv_tol(kv, 1e-4),
                    cluster,
                });
                cx.specs.push(fk);
                continue;
            }
            let zeros = vec![0i32; t];
            cx.cases.push(Case {
                name: format!("paged_attn + rope + cache writes + o projection T{t} H{h}/{kvh} D{d} N{nn} {style}{}", kv_label(kv)),
                kernel: fused.symbol(),
                grid: gr,
                grid_y: h as u32,
                block: b,
                // (the same q/k/v, positions, pools and table: each case uploads its inputs)
                inputs: inputs.iter().cloned().chain([wo_a, res_a, cx.data.push(&vec![0.0; h * t * nn]), cx.data.push_i32(&zeros)]).collect(),
                scalars: vec![(t * h) as i64, mb as i64],
                expected: y_a,
                init: None,
                written_inputs: vec![(5, wk.clone()), (6, wv.clone()), (12, cx.data.push(&vec![0.0; t]))],
                tmaps: vec![],
                tol: kv_tol(kv, 1e-4),
                cluster: None,
            });
            cx.specs.push(fused);
        }
        // ... with Q4_1 W_o (the GGUF plans; their KV pools bf16 from seeded shapes, f32 in
        // the real SmolLM2 plan): the plans' 4 blocks per head adding into both accumulators
        if qkv.is_none() && d == 64 {
            let nn = 128usize;
            let wq = dsc_ir::quant::encode(DType::Q4_1, &cx.r.vec(nn * h * d, -0.1, 0.1)).context("encode")?;
            let wo = dsc_ir::quant::decode(DType::Q4_1, &wq, nn * h * d).context("decode")?;
            let res = cx.r.vec(t * nn, -1.0, 1.0);
            let y = o_projected(&o, &wo, &res, nn, h * d);
            let splits = 4;
            let fused = KernelSpec::AttentionO { inner: Box::new(spec.clone()), n: nn, red: true, splits, wdtype: DType::Q4_1 };
            let zeros = cx.data.push(&vec![0.0; t * nn]);
            let y_a = cx.data.push(&y);
            cx.cases.push(Case {
                name: format!("paged_attn + rope + cache writes + o projection added T{t} H{h}/{kvh} D{d} N{nn} q4_1, {splits} blocks per head {style}{}", kv_label(kv)),
                kernel: fused.symbol(),
                grid: gr,
                grid_y: (h * splits) as u32,
                block: b,
                inputs: inputs.iter().cloned().chain([cx.data.push_u8(&wq), cx.data.push(&res), zeros.clone()]).collect(),
                scalars: vec![(t * h) as i64, mb as i64],
                expected: y_a.clone(),
                init: Some(zeros),
                written_inputs: vec![(at + 5, wk.clone()), (at + 6, wv.clone()), (at + 11, y_a)],
                tmaps: vec![],
                tol: kv_tol(kv, 1e-4),
                cluster: None,
            });
            cx.specs.push(fused);
        }
    }
    Ok(())
}

/// The o projection's reference with its residual: y[t, j] = res[t, j] + Σ_c W_o[j, c] · o[t, c]
/// (o: [T, H·D], W_o: [N, H·D], res and y: [T, N])
fn o_projected(o: &[f32], wo: &[f32], res: &[f32], nn: usize, hd: usize) -> Vec<f32> {
    (0..res.len())
        .map(|i| {
            let (ti, j) = (i / nn, i % nn);
            res[i] + (0..hd).map(|c| wo[j * hd + c] * o[ti * hd + c]).sum::<f32>()
        })
        .collect()
}
