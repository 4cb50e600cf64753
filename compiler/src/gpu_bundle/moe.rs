//! Kernel-check cases: DeepSeekMoE's router and routed experts (`dsc_codegen::kernels::moe`).

use super::*;
use dsc_ir::{MoeScoring, MoeSelect};

/// The router on the DeepSeek gates' shapes (V2-Lite's greedy softmax, V2's group-limited
/// softmax, V3's noaux_tc sigmoid, a tiny one), with and without disabled experts; then the
/// two routed-expert kernels on bf16 and f32 weights.
pub(super) fn cases(cx: &mut Cx) -> anyhow::Result<()> {
    // (E, top_k, n_group, topk_group, scoring, select, normalize, scaling, disabled experts)
    let routers: [(usize, usize, usize, usize, MoeScoring, MoeSelect, bool, f32, &[usize]); 6] = [
        (64, 6, 1, 1, MoeScoring::Softmax, MoeSelect::Greedy, false, 1.0, &[]),
        (64, 6, 1, 1, MoeScoring::Softmax, MoeSelect::Greedy, false, 1.0, &[3, 17, 40]),
        (160, 6, 8, 3, MoeScoring::Softmax, MoeSelect::GroupMax, false, 16.0, &[5]),
        (256, 8, 8, 4, MoeScoring::Sigmoid, MoeSelect::NoauxTc, true, 2.5, &[]),
        (256, 8, 8, 4, MoeScoring::Sigmoid, MoeSelect::NoauxTc, true, 2.5, &[0, 1, 2, 100, 255]),
        (8, 3, 4, 2, MoeScoring::Sigmoid, MoeSelect::NoauxTc, true, 2.5, &[6]),
    ];
    for (e, top_k, n_group, topk_group, scoring, select, normalize, scaling, disabled) in routers {
        let t = 37usize;
        let logits = cx.r.vec(t * e, -4.0, 4.0);
        let mask: Vec<f32> = (0..e).map(|i| if disabled.contains(&i) { 0.0 } else { 1.0 }).collect();
        let bias = cx.r.vec(e, -0.5, 0.5);
        let noaux = select == MoeSelect::NoauxTc;
        let (sc, sl) = (
            match scoring {
                MoeScoring::Softmax => "softmax",
                MoeScoring::Sigmoid => "sigmoid",
            },
            match select {
                MoeSelect::Greedy => "greedy",
                MoeSelect::GroupMax => "group_max",
                MoeSelect::NoauxTc => "noaux_tc",
            },
        );
        let src = format!(
            "graph \"k\" {{\n  %l = input : f32[{t}, {e}]\n  %m = input : f32[{e}]\n{}  %y = moe_route(%l, %m{}) {{top_k = {top_k}, n_group = {n_group}, topk_group = {topk_group}, scoring = {sc}, select = {sl}, normalize = {normalize}, scaling = {scaling:?}}} : f32[{t}, {e}]\n  output y = %y\n}}\n",
            if noaux { format!("  %b = input : f32[{e}]\n") } else { String::new() },
            if noaux { ", %b" } else { "" }
        );
        let mut ins = vec![("l", Tensor::new(vec![t, e], logits.clone())), ("m", Tensor::new(vec![e], mask.clone()))];
        if noaux {
            ins.push(("b", Tensor::new(vec![e], bias.clone())));
        }
        let want = reference(&src, ins, &cx.none)?;
        // (the cases with disabled experts also count each expert's selections onto counters
        // that start at 7: the runtime's per-expert load)
        let count = !disabled.is_empty();
        let spec = KernelSpec::MoeRoute { e, top_k, n_group, topk_group, scoring, select, normalize, scaling_bits: scaling.to_bits(), count };
        let mut inputs = vec![cx.data.push(&logits), cx.data.push(&mask)];
        if noaux {
            inputs.push(cx.data.push(&bias));
        }
        let mut written = vec![];
        if count {
            let chosen: Vec<i32> = (0..e).map(|k| 7 + (0..t).filter(|&ti| want[ti * e + k] != 0.0).count() as i32).collect();
            written.push((inputs.len(), cx.data.push_i32(&chosen)));
            inputs.push(cx.data.push_i32(&vec![7; e]));
        }
        let expected = cx.data.push(&want);
        let name = format!("moe_route E{e} top{top_k} {sl} {sc}{}", if disabled.is_empty() { String::new() } else { format!(" {} disabled, counted", disabled.len()) });
        cx.cases.push(Case { written_inputs: written, ..case(name, &spec, grid(&spec.launch(), t), 1, inputs, vec![t as i64], expected, 1e-5) });
        cx.specs.push(spec);
    }
    // the router folded into its GEMV (`MoeRouteGemv`, one-token steps: the schedule's
    // `moe-router`): the logits of 3 tokens from bf16 weights, each token's last block routing
    // it — V2-Lite's greedy softmax with disabled experts counted, V3's noaux_tc; the logits,
    // the counters and the per-token sync counters (zero again after) as written inputs
    // (V2-Lite's also with the MoE layer's RMSNorm folded in, `NormMatMul`: x the norm of xr)
    for (fold, (e, top_k, n_group, topk_group, scoring, select, normalize, scaling, disabled)) in [(false, routers[1]), (true, routers[1]), (false, routers[4])] {
        let (t, k) = (3usize, 512usize);
        let (xr, gw) = (cx.r.vec(t * k, -2.0, 2.0), cx.r.vec(k, 0.5, 1.5));
        let x = if fold { rms_rows(&xr, &gw, k, 1e-6) } else { xr.clone() };
        let wb = dsc_ir::quant::encode(DType::BF16, &cx.r.vec(e * k, -0.2, 0.2)).context("encode")?;
        let ws: Weights = HashMap::from([("w".to_string(), (DType::BF16, vec![e, k], wb.clone()))]);
        let mask: Vec<f32> = (0..e).map(|i| if disabled.contains(&i) { 0.0 } else { 1.0 }).collect();
        let bias = cx.r.vec(e, -0.5, 0.5);
        let noaux = select == MoeSelect::NoauxTc;
        let (sc, sl) = (if scoring == MoeScoring::Softmax { "softmax" } else { "sigmoid" }, if noaux { "noaux_tc" } else { "greedy" });
        let src = format!(
            "graph \"k\" {{\n  %x = input : f32[{t}, {k}]\n  %w = weight : bf16[{e}, {k}]\n  %m = input : f32[{e}]\n{}  %l = matmul(%x, %w) {{transpose_b = true}} : f32[{t}, {e}]\n  %y = moe_route(%l, %m{}) {{top_k = {top_k}, n_group = {n_group}, topk_group = {topk_group}, scoring = {sc}, select = {sl}, normalize = {normalize}, scaling = {scaling:?}}} : f32[{t}, {e}]\n  output y = %y\n  output l = %l\n}}\n",
            if noaux { format!("  %b = input : f32[{e}]\n") } else { String::new() },
            if noaux { ", %b" } else { "" }
        );
        let g = text::parse(&src)?;
        let mut ex = Executor::new(&g, &ws, BTreeMap::new())?;
        let mut ins = BTreeMap::from([("x".to_string(), Tensor::new(vec![t, k], x.clone())), ("m".to_string(), Tensor::new(vec![e], mask.clone()))]);
        if noaux {
            ins.insert("b".to_string(), Tensor::new(vec![e], bias.clone()));
        }
        let mut out = ex.run(&ins)?;
        let (want, logits) = (out.remove("y").context("y")?.data, out.remove("l").context("l")?.data);
        let gemv = KernelSpec::MatMul { k, n: e, wdtype: DType::BF16, bias: false, residual: false };
        let route = KernelSpec::MoeRoute { e, top_k, n_group, topk_group, scoring, select, normalize, scaling_bits: scaling.to_bits(), count: true };
        let gemv = if fold { KernelSpec::NormMatMul { inner: Box::new(gemv), eps_bits: 1e-6f32.to_bits() } } else { gemv };
        let spec = KernelSpec::MoeRouteGemv { gemv: Box::new(gemv), route: Box::new(route) };
        let mut inputs = vec![cx.data.push(&xr), cx.data.push_u8(&wb), cx.data.push(&vec![f32::NAN; t * e]), cx.data.push(&mask)];
        if fold {
            inputs.insert(1, cx.data.push(&gw));
        }
        let mut written = vec![(inputs.len() - 2, cx.data.push(&logits))];
        if noaux {
            inputs.push(cx.data.push(&bias));
        }
        let chosen: Vec<i32> = (0..e).map(|j| 7 + (0..t).filter(|&ti| want[ti * e + j] != 0.0).count() as i32).collect();
        written.push((inputs.len(), cx.data.push_i32(&chosen)));
        inputs.push(cx.data.push_i32(&vec![7; e]));
        written.push((inputs.len(), cx.data.push_i32(&vec![0; t])));
        inputs.push(cx.data.push_i32(&vec![0; t]));
        let expected = cx.data.push(&want);
        let name = format!(
            "{}moe_route_gemv T{t} K{k} E{e} top{top_k} {sl} {sc}{}",
            if fold { "rms " } else { "" },
            if disabled.is_empty() { String::new() } else { format!(" {} disabled", disabled.len()) }
        );
        cx.cases.push(Case { written_inputs: written, ..case(name, &spec, grid(&spec.launch(), e), t as u32, inputs, vec![e as i64], expected, 1e-4) });
        cx.specs.push(spec);
    }
    // the routed experts: (T, D, I, E, top_k, weights)
    // (those with 16-bit weights and D, I multiples of 32 also expert-major on the tensor
    // cores, `MoeGateUpMma` / `MoeDownMma`: 40 tokens take two ballots of the routing column,
    // 100 tokens over 8 experts more than one 32-token pass of an expert)
    for (t, d, inter, e, top_k, wdtype) in [
        (5usize, 256usize, 128usize, 16usize, 4usize, DType::BF16),
        (3, 64, 32, 8, 3, DType::F32),
        (4, 40, 24, 6, 2, DType::F16),
        (2, 36, 20, 40, 3, DType::BF16),
        (40, 512, 64, 40, 6, DType::BF16),
        (100, 256, 96, 8, 3, DType::BF16),
        (40, 128, 64, 16, 2, DType::F16),
        // (fp8 experts, f8g128: the warp-per-output kernels)
        (3, 512, 512, 8, 2, DType::F8G128),
    ] {
        let x = cx.r.vec(t * d, -1.0, 1.0);
        // each token's top_k distinct experts with positive weights
        let mut route = vec![0f32; t * e];
        for ti in 0..t {
            let mut left: Vec<usize> = (0..e).collect();
            for _ in 0..top_k {
                let k = cx.r.0.random_range(0..left.len());
                route[ti * e + left.remove(k)] = cx.r.vec(1, 0.1, 1.0)[0];
            }
        }
        let enc = |v: &[f32]| dsc_ir::quant::encode(wdtype, v).context("encode");
        let dec = |b: &[u8], n: usize| dsc_ir::quant::decode(wdtype, b, n).context("decode");
        let (gb, ub, db) = (enc(&cx.r.vec(e * inter * d, -0.1, 0.1))?, enc(&cx.r.vec(e * inter * d, -0.1, 0.1))?, enc(&cx.r.vec(e * d * inter, -0.1, 0.1))?);
        let (gw, uw) = (dec(&gb, e * inter * d)?, dec(&ub, e * inter * d)?);
        // h[t, slot, i] on the host (f32) from the tokens' rows `x`, slots in expert order
        let host_h = |x: &[f32]| {
            let mut h = vec![0f32; t * top_k * inter];
            for ti in 0..t {
                let chosen: Vec<usize> = (0..e).filter(|&ei| route[ti * e + ei] != 0.0).collect();
                for (s, &ei) in chosen.iter().enumerate() {
                    for i in 0..inter {
                        let row = (ei * inter + i) * d;
                        let xr = &x[ti * d..(ti + 1) * d];
                        let g: f32 = gw[row..row + d].iter().zip(xr).map(|(a, b)| a * b).sum();
                        let u: f32 = uw[row..row + d].iter().zip(xr).map(|(a, b)| a * b).sum();
                        h[(ti * top_k + s) * inter + i] = g / (1.0 + (-g).exp()) * u;
                    }
                }
            }
            h
        };
        let h = host_h(&x);
        let src = format!(
            "graph \"k\" {{\n  %x = input : f32[{t}, {d}]\n  %r = input : f32[{t}, {e}]\n  %g = weight : {wdtype}[{e}, {inter}, {d}]\n  %u = weight : {wdtype}[{e}, {inter}, {d}]\n  %w = weight : {wdtype}[{e}, {d}, {inter}]\n  %y = moe_experts(%x, %r, %g, %u, %w) : f32[{t}, {d}]\n  output y = %y\n}}\n"
        );
        let ws: Weights =
            [("g", &gb, vec![e, inter, d]), ("u", &ub, vec![e, inter, d]), ("w", &db, vec![e, d, inter])].into_iter().map(|(n, b, sh)| (n.to_string(), (wdtype, sh, b.clone()))).collect();
        let want = reference(&src, vec![("x", Tensor::new(vec![t, d], x.clone())), ("r", Tensor::new(vec![t, e], route.clone()))], &ws)?;
        let (xa, ra) = (cx.data.push(&x), cx.data.push(&route));
        let (ga, ua, da) = (cx.data.push_u8(&gb), cx.data.push_u8(&ub), cx.data.push_u8(&db));
        let ha = cx.data.push(&h);
        let up = KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared: 0, shared_first: false };
        let ins = vec![xa, ra.clone(), ga.clone(), ua.clone()];
        cx.cases.push(case(format!("moe_gate_up T{t} D{d} I{inter} E{e} top{top_k} {wdtype}"), &up, grid(&up.launch(), inter), (t * top_k) as u32, ins, vec![inter as i64], ha.clone(), 1e-4));
        cx.specs.push(up);
        let up_mma = KernelSpec::MoeGateUpMma { d, inter, e, top_k, wdtype };
        if dsc_codegen::kernels::moe_fits(&up_mma).is_ok() {
            // (x in 16 bits, as the tensor-core kernel reads it: h from the rounded x)
            let x16: Vec<f32> = x.iter().map(|&v| dsc_ir::quant::round_to(wdtype, v)).collect();
            let h16 = host_h(&x16);
            let xb = cx.data.push_u8(&enc(&x16)?);
            let name = format!("moe_gate_up_mma T{t} D{d} I{inter} E{e} top{top_k} {wdtype}");
            let want = cx.data.push(&h16);
            cx.cases.push(case(name, &up_mma, grid(&up_mma.launch(), inter), e as u32, vec![xb, ra.clone(), ga, ua], vec![inter as i64, t as i64], want, 1e-4));
            cx.specs.push(up_mma);
            // the down projection's route-weighted partials [slot, T, D] (h in two 16-bit
            // halves in the kernel: f32-class products)
            let dw = dec(&db, e * d * inter)?;
            let mut p = vec![0f32; top_k * t * d];
            for ti in 0..t {
                let chosen: Vec<usize> = (0..e).filter(|&ei| route[ti * e + ei] != 0.0).collect();
                for (s, &ei) in chosen.iter().enumerate() {
                    let hr = &h[(ti * top_k + s) * inter..(ti * top_k + s + 1) * inter];
                    for n in 0..d {
                        let row = (ei * d + n) * inter;
                        let v: f32 = dw[row..row + inter].iter().zip(hr).map(|(a, b)| a * b).sum();
                        p[(s * t + ti) * d + n] = route[ti * e + ei] * v;
                    }
                }
            }
            let down_mma = KernelSpec::MoeDownMma { d, inter, e, top_k, wdtype };
            let want = cx.data.push(&p);
            let name = format!("moe_down_mma T{t} D{d} I{inter} E{e} top{top_k} {wdtype}");
            cx.cases.push(case(name, &down_mma, grid(&down_mma.launch(), d), e as u32, vec![ha.clone(), ra.clone(), da.clone()], vec![d as i64, t as i64], want, 1e-4));
            cx.specs.push(down_mma);
        }
        let down = KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual: false, shared: 0, shared_first: false };
        let expected = cx.data.push(&want);
        cx.cases.push(case(
            format!("moe_down T{t} D{d} I{inter} E{e} top{top_k} {wdtype}"),
            &down,
            grid(&down.launch(), d),
            t as u32,
            vec![ha.clone(), ra.clone(), da.clone()],
            vec![d as i64],
            expected,
            1e-4,
        ));
        cx.specs.push(down);
        // (with the residual added after the experts' sum)
        let res = cx.r.vec(t * d, -2.0, 2.0);
        let with: Vec<f32> = want.iter().zip(&res).map(|(a, b)| a + b).collect();
        let down = KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual: true, shared: 0, shared_first: false };
        let (resa, expected) = (cx.data.push(&res), cx.data.push(&with));
        cx.cases.push(case(format!("moe_down_res T{t} D{d} I{inter} E{e} top{top_k} {wdtype}"), &down, grid(&down.launch(), d), t as u32, vec![ha, ra, da, resa], vec![d as i64], expected, 1e-4));
        cx.specs.push(down);
    }
    // the one-token fusion's shared-expert slots (`schedule::fuse_moe_shared`): `shared` I-wide
    // chunks of the shared experts' [shared · I, D] gate/up and [D, shared · I] down after each
    // token's top_k routed slots, weight 1, summed after the routed ones, then the residual
    // (x is the RMSNorm of a row `xr` with weight `gw`, eps 1e-6: the gate/up once more with
    // the norm folded in, `NormMatMul`, reading xr and gw — the schedule's `moe-router` at one
    // row)
    // (and in both slot orders: the shared slots after the routed ones, or first — where the
    // attention prefetches their weights, `shared_first`)
    for (t, d, inter, e, top_k, shared, wdtype, first) in
        [(1usize, 256usize, 128usize, 16usize, 4usize, 2usize, DType::BF16, false), (1, 256, 128, 16, 4, 2, DType::BF16, true), (3, 512, 256, 8, 3, 1, DType::F16, false)]
    {
        let (xr, gw) = (cx.r.vec(t * d, -2.0, 2.0), cx.r.vec(d, 0.5, 1.5));
        let x = rms_rows(&xr, &gw, d, 1e-6);
        let mut route = vec![0f32; t * e];
        for ti in 0..t {
            for j in 0..top_k {
                route[ti * e + (j * 5 + 3 * ti) % e] = cx.r.vec(1, 0.1, 1.0)[0];
            }
        }
        let enc = |v: &[f32]| dsc_ir::quant::encode(wdtype, v).context("encode");
        let dec = |b: &[u8], n: usize| dsc_ir::quant::decode(wdtype, b, n).context("decode");
        let (ne, ns) = (e * inter * d, shared * inter * d);
        let bytes: Vec<Vec<u8>> = [ne, ne, ne, ns, ns, ns].iter().map(|&n| enc(&cx.r.vec(n, -0.1, 0.1))).collect::<anyhow::Result<_>>()?;
        let w: Vec<Vec<f32>> = bytes.iter().zip([ne, ne, ne, ns, ns, ns]).map(|(b, n)| dec(b, n)).collect::<anyhow::Result<_>>()?;
        let (slots, dot) = (top_k + shared, |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>());
        let mut h = vec![0f32; t * slots * inter];
        let mut y = vec![0f32; t * d];
        let res = cx.r.vec(t * d, -2.0, 2.0);
        for ti in 0..t {
            let xr = &x[ti * d..(ti + 1) * d];
            let chosen: Vec<usize> = (0..e).filter(|&ei| route[ti * e + ei] != 0.0).collect();
            // (slot s: routed expert chosen[s] or shared chunk s - top_k; first: shared chunk s
            // or routed expert chosen[s - shared])
            let rows = |s: usize| -> Option<(usize, bool)> {
                match (first, s < shared, s < top_k) {
                    (true, true, _) => Some((s, true)),
                    (true, false, _) => chosen.get(s - shared).map(|&ei| (ei, false)),
                    (false, _, true) => chosen.get(s).map(|&ei| (ei, false)),
                    (false, _, false) => Some((s - top_k, true)),
                }
            };
            for s in 0..slots {
                let Some((ex, sh)) = rows(s) else { continue };
                let (g, u) = if sh { (&w[3], &w[4]) } else { (&w[0], &w[1]) };
                for i in 0..inter {
                    let row = (ex * inter + i) * d;
                    let (gv, uv) = (dot(&g[row..row + d], xr), dot(&u[row..row + d], xr));
                    h[(ti * slots + s) * inter + i] = gv / (1.0 + (-gv).exp()) * uv;
                }
            }
            for n in 0..d {
                let mut acc = 0f32;
                // (the routed slots in expert order, then the shared ones)
                let order: Vec<usize> = if first { (shared..slots).chain(0..shared).collect() } else { (0..slots).collect() };
                for s in order {
                    let Some((ex, sh)) = rows(s) else { continue };
                    let hr = &h[(ti * slots + s) * inter..(ti * slots + s + 1) * inter];
                    acc += if sh {
                        let row = n * shared * inter + ex * inter;
                        dot(&w[5][row..row + inter], hr)
                    } else {
                        let row = (ex * d + n) * inter;
                        route[ti * e + ex] * dot(&w[2][row..row + inter], hr)
                    };
                }
                y[ti * d + n] = acc + res[ti * d + n];
            }
        }
        let (xa, ra) = (cx.data.push(&x), cx.data.push(&route));
        let wa: Vec<Array> = bytes.iter().map(|b| cx.data.push_u8(b)).collect();
        let up = KernelSpec::MoeGateUp { d, inter, e, top_k, wdtype, shared, shared_first: first };
        let ha = cx.data.push(&h);
        let ins = vec![xa, ra.clone(), wa[0].clone(), wa[1].clone(), wa[3].clone(), wa[4].clone()];
        cx.cases.push(case(
            format!("moe_gate_up_shared T{t} D{d} I{inter} E{e} top{top_k}+{shared}{} {wdtype}", if first { " first" } else { "" }),
            &up,
            grid(&up.launch(), inter),
            (t * slots) as u32,
            ins.clone(),
            vec![inter as i64],
            ha.clone(),
            1e-4,
        ));
        let normed = KernelSpec::NormMatMul { inner: Box::new(up.clone()), eps_bits: 1e-6f32.to_bits() };
        let mut nins = ins;
        nins[0] = cx.data.push(&xr);
        nins.insert(1, cx.data.push(&gw));
        let name = format!("rms moe_gate_up_shared T{t} D{d} I{inter} E{e} top{top_k}+{shared}{} {wdtype}", if first { " first" } else { "" });
        cx.cases.push(case(name, &normed, grid(&normed.launch(), inter), (t * slots) as u32, nins, vec![inter as i64], ha.clone(), 1e-4));
        cx.specs.push(normed);
        cx.specs.push(up);
        let down = KernelSpec::MoeDown { d, inter, e, top_k, wdtype, residual: true, shared, shared_first: first };
        let (resa, want) = (cx.data.push(&res), cx.data.push(&y));
        let ins = vec![ha, ra, wa[2].clone(), wa[5].clone(), resa];
        cx.cases.push(case(
            format!("moe_down_shared T{t} D{d} I{inter} E{e} top{top_k}+{shared}{} {wdtype}", if first { " first" } else { "" }),
            &down,
            grid(&down.launch(), d),
            t as u32,
            ins,
            vec![d as i64],
            want,
            1e-4,
        ));
        cx.specs.push(down);
    }
    // the partials' sum: token 2 chose one expert fewer (a disabled one), its last slot NaN
    // — never read
    for (t, d, e, top_k) in [(7usize, 2048usize, 64usize, 6usize), (5, 36, 10, 3)] {
        let mut route = vec![0f32; t * e];
        let mut p = cx.r.vec(top_k * t * d, -1.0, 1.0);
        for ti in 0..t {
            let k = if ti == 2 { top_k - 1 } else { top_k };
            for j in 0..k {
                route[ti * e + (j * 7 + ti) % e] = 0.5;
            }
            if k < top_k {
                for n in 0..d {
                    p[((top_k - 1) * t + ti) * d + n] = f32::NAN;
                }
            }
        }
        let y: Vec<f32> = (0..t * d)
            .map(|i| {
                let (ti, n) = (i / d, i % d);
                let k = (0..e).filter(|&ei| route[ti * e + ei] != 0.0).count();
                (0..k).map(|s| p[(s * t + ti) * d + n]).sum()
            })
            .collect();
        let spec = KernelSpec::MoeCombine { d, e, top_k, residual: false };
        let (pa, ra, want) = (cx.data.push(&p), cx.data.push(&route), cx.data.push(&y));
        cx.cases.push(case(format!("moe_combine T{t} D{d} E{e} top{top_k}"), &spec, grid(&spec.launch(), t), 1, vec![pa.clone(), ra.clone()], vec![t as i64], want, 1e-6));
        cx.specs.push(spec);
        let res = cx.r.vec(t * d, -2.0, 2.0);
        let with: Vec<f32> = y.iter().zip(&res).map(|(a, b)| a + b).collect();
        let spec = KernelSpec::MoeCombine { d, e, top_k, residual: true };
        let (resa, want) = (cx.data.push(&res), cx.data.push(&with));
        cx.cases.push(case(format!("moe_combine_res T{t} D{d} E{e} top{top_k}"), &spec, grid(&spec.launch(), t), 1, vec![pa, ra, resa], vec![t as i64], want, 1e-6));
        cx.specs.push(spec);
    }
    Ok(())
}

/// Each `d`-value row of `x` RMS-normalized with weight `g` (the CPU executor's rms_norm: x ·
/// (1 / sqrt(mean(x²) + eps)) · g).
fn rms_rows(x: &[f32], g: &[f32], d: usize, eps: f32) -> Vec<f32> {
    x.chunks(d)
        .flat_map(|r| {
            let inv = 1.0 / (r.iter().map(|v| v * v).sum::<f32>() / d as f32 + eps).sqrt();
            r.iter().zip(g).map(move |(v, w)| v * inv * w)
        })
        .collect()
}
