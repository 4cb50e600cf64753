//! Schedule rewrites of the matmuls: split-K for batched decode of few column tiles and the
//! folds of its reduce into the RoPE and the RMSNorm after it, the 16-bit copies of x for the
//! tensor-core kernels, the SwiGLU epilogue, the TMA and warp-specialized variants.

use crate::schedule::*;

/// The pipelined wgmma matmul alternatives (also inside split-K, merged parts or an
/// activation epilogue) that `which` takes load their W tiles by TMA (`KernelSpec::Tma`):
/// their weight args become their tensor maps, `{w}@tmap{bn}` (the runtime encodes one per
/// weight and tile height).
pub(crate) fn tma_wrap(mut steps: Vec<Step>, which: Tma, ws: bool, ws64: bool) -> Vec<Step> {
    for s in &mut steps {
        let step_args = s.args.clone();
        // (ws64: a 64-row alternative that also takes fewer than WS64_MIN_ROWS rows splits in
        // two at that row count — below it stays as it is, measured faster there — so the
        // rows its alternatives cover, and the first fit, are unchanged)
        if ws64 {
            let mut split = Vec::with_capacity(s.hopper.len());
            for h in s.hopper.drain(..) {
                let m64 = matches!(h.kernel.pipe_core(), KernelSpec::MatMulPipe { bm: 64, .. });
                if m64 && h.min_rows < WS64_MIN_ROWS && h.max_rows.is_none_or(|m| m >= WS64_MIN_ROWS) {
                    split.push(Large { max_rows: Some(WS64_MIN_ROWS - 1), ..h.clone() });
                    split.push(Large { min_rows: WS64_MIN_ROWS, ..h });
                } else {
                    split.push(h);
                }
            }
            s.hopper = split;
        }
        for h in &mut s.hopper {
            let (core, parts) = h.kernel.matmul_core();
            // (warp-specialized: the 128-row tiles, x in 16 bits, unsplit, and with `ws64` the
            // 64-row batched-decode tiles, split-K ones included; x's tensor map too. The
            // SwiGLU epilogue's tile takes wn/2 gate rows and wn/2 up rows per warpgroup)
            let swiglu = matches!(h.kernel, KernelSpec::SwiGluPipe { .. });
            if let KernelSpec::MatMulPipe { bn, bm, a16: true, stages, .. } = *h.kernel.pipe_core() {
                let on = if bm == crate::kernels::PIPE_BM { ws && !matches!(h.kernel, KernelSpec::SplitK { .. }) } else { ws64 && h.min_rows >= WS64_MIN_ROWS };
                if on && stages * 16 <= crate::kernels::TMA_MBAR_BYTES {
                    let wn = if bm == 64 { bn / 2 } else { bn };
                    let (weights, box_rows) = if swiglu { (2, wn / 2) } else { (parts.map_or(1, |p| p.len()), bn) };
                    let mut args = h.args.clone().unwrap_or_else(|| step_args.clone());
                    args[0] = format!("{}@xmap{bm}", args[0]);
                    // (quantized weights: the producer reads them as stored, no tensor map)
                    let deq = !matches!(h.kernel.pipe_core(), KernelSpec::MatMulPipe { wdtype: DType::BF16 | DType::F16, .. });
                    for w in args[1..1 + weights].iter_mut().filter(|_| !deq) {
                        *w = format!("{w}@tmap{box_rows}");
                    }
                    h.args = Some(args);
                    h.kernel = KernelSpec::Ws { inner: Box::new(h.kernel.clone()) };
                    continue;
                }
            }
            // (`takes_tma` is false under Tma::Off)
            if !takes_tma(&h.kernel, which) {
                continue;
            }
            let KernelSpec::MatMulPipe { bn, .. } = *core else { continue };
            let weights = parts.map_or(1, |p| p.len());
            let mut args = h.args.clone().unwrap_or_else(|| step_args.clone());
            for w in &mut args[1..1 + weights] {
                *w = format!("{w}@tmap{bn}");
            }
            h.args = Some(args);
            h.kernel = KernelSpec::Tma { inner: Box::new(h.kernel.clone()) };
        }
    }
    steps
}

/// Whether [`tma_wrap`] under `which` gives the matmul alternative `kernel` TMA loads.
pub(crate) fn takes_tma(kernel: &KernelSpec, which: Tma) -> bool {
    let (core, _) = kernel.matmul_core();
    match *core {
        KernelSpec::MatMulPipe { bn, bm, .. } => match which {
            Tma::Off => false,
            Tma::Narrow => bm == crate::kernels::PIPE_BM && bn <= 128,
            Tma::All => true,
        },
        _ => false,
    }
}

/// The SwiGLU into the gate/up matmul: where a `SiluMulHalf` step (h = silu(gate) · up and
/// its 16-bit copy) reads the two parts of a merged matmul, that matmul's pipelined `hopper`
/// alternatives (unsplit, two equal parts, no bias; with [`SwiGluFusion::Batched`] only the
/// first in 64-row tiles, with `All` every one) become `SwiGluPipe` writing h and the copy
/// themselves, and the silu_mul step skips, on Hopper, exactly the rows whose first-fitting
/// Hopper alternative is a fused one (`hopper_skip`; that set must be one interval, else only
/// the batched tile is fused). One launch fewer per layer, and the matmul writes F 16-bit + F
/// f32 values per row instead of 2F f32.
pub(crate) fn fuse_swiglu_pipe(mut steps: Vec<Step>, mode: SwiGluFusion, tma: Tma, ws: bool) -> Vec<Step> {
    for i in 0..steps.len() {
        let Some(KernelSpec::SiluMulHalf { .. }) = steps[i].kernel else { continue };
        let [gate, up, h, hh] = steps[i].args.as_slice() else { continue };
        let part_of = |name: &str| steps[..i].iter().find(|s| s.node == name).and_then(|s| Some((s.alias_of.clone()?, s.alias_offset.clone())));
        let (Some((mg, og)), Some((mu, ou))) = (part_of(gate), part_of(up)) else { continue };
        if mg != mu {
            continue;
        }
        let Some(j) = steps[..i].iter().position(|s| s.node == mg) else { continue };
        let (h, hh) = (h.clone(), hh.clone());
        let step_args = steps[j].args.clone();
        // (gate the first part at offset 0, up the second at F)
        let at = |o: &Option<Scalar>, c: i64| matches!(o, Some(Scalar::RowsTimes(m, k)) if *m == mg && *k == c);
        let fusable = |l: &Large| -> Option<(Box<KernelSpec>, usize)> {
            let KernelSpec::MatMulParts { inner, parts } = &l.kernel else { return None };
            let KernelSpec::MatMulPipe { n, bias: false, residual: false, bn, bm, .. } = *inner.as_ref() else { return None };
            let f = n / 2;
            let ok = parts.as_slice() == [f, f] && crate::kernels::swiglu_pipe_fits(n, bn, bm) && at(&og, 0) && at(&ou, f as i64) && l.args.as_ref().unwrap_or(&step_args).len() == 4;
            ok.then(|| (inner.clone(), f))
        };
        let is_m64 = |l: &Large| matches!(&l.kernel, KernelSpec::MatMulParts { inner, .. } if matches!(inner.as_ref(), KernelSpec::MatMulPipe { bm: 64, .. }));
        let hopper = &steps[j].hopper;
        let batched: Vec<usize> = hopper.iter().position(is_m64).filter(|&k| fusable(&hopper[k]).is_some()).into_iter().collect();
        // (not the alternatives `tma_wrap` gives TMA loads, unless warp-specialized: the
        // SwiGLU kernel's only TMA path is that one, and on the SmolLM2 shape's b128 tile, 24
        // blocks, the fused kernel without TMA lost 20% end to end to the unfused one with
        // it — bench/results/swiglu-all-2026-11-30.json)
        let ws_tile = |l: &Large| ws && matches!(l.kernel.matmul_core().0, KernelSpec::MatMulPipe { bm: crate::kernels::PIPE_BM, a16: true, .. });
        let all: Vec<usize> = (0..hopper.len()).filter(|&k| fusable(&hopper[k]).is_some() && (!takes_tma(&hopper[k].kernel, tma) || ws_tile(&hopper[k]))).collect();
        let chosen = match mode {
            SwiGluFusion::Off => continue,
            SwiGluFusion::Batched => batched,
            SwiGluFusion::All => match fused_rows(hopper, &all) {
                Some(_) => all,
                None => batched,
            },
        };
        let Some(range) = fused_rows(hopper, &chosen) else { continue };
        for k in chosen {
            let alt = &mut steps[j].hopper[k];
            let Some((inner, f)) = fusable(alt) else { continue };
            let mut args = alt.args.clone().unwrap_or_else(|| step_args.clone());
            args.truncate(3);
            args.extend([h.clone(), hh.clone()]);
            alt.kernel = KernelSpec::SwiGluPipe { inner };
            alt.scalars = vec![Scalar::Rows(h.clone()), Scalar::Const(f as i64)];
            alt.args = Some(args);
        }
        steps[i].hopper_skip = Some(range);
    }
    steps
}

/// The rows (one interval, inclusive) whose first-fitting alternative of `alts` — as the
/// runtime picks among a step's `hopper` list — is one of `chosen`; None when there are none
/// or they are not one interval.
pub(crate) fn fused_rows(alts: &[Large], chosen: &[usize]) -> Option<(i64, i64)> {
    let hi_of = |l: &Large| l.max_rows.unwrap_or(i64::MAX);
    // (the first fit is the same between consecutive boundaries)
    let mut points: Vec<i64> = alts.iter().flat_map(|l| [l.min_rows, hi_of(l).saturating_add(1)]).chain([1]).collect();
    points.sort_unstable();
    points.dedup();
    let mut spans: Vec<(i64, i64)> = vec![];
    for (w, &p) in points.iter().enumerate() {
        let end = points.get(w + 1).map_or(i64::MAX, |&q| q - 1);
        let pick = alts.iter().position(|l| p >= l.min_rows && p <= hi_of(l));
        if pick.is_some_and(|k| chosen.contains(&k)) {
            match spans.last_mut() {
                Some(last) if last.1.saturating_add(1) >= p => last.1 = end,
                _ => spans.push((p, end)),
            }
        }
    }
    match spans.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// The split-K reduce of a merged Q/K/V matmul (no
/// residual) folded into the `QkvRopeCache` step that reads the three parts: that step gets a
/// `hopper` alternative for the reduce's rows (in its own rows: tokens x H) reading the
/// partial sums (`QkvRopeSplitK`: q, k, v summed over the slices on load) and the reduce step
/// goes. Only where nothing else reads the merged node or a view of it.
pub(crate) fn fold_splitk_reduce_rope(mut steps: Vec<Step>) -> Vec<Step> {
    let mut i = 0;
    while i < steps.len() {
        let Some(KernelSpec::SplitKReduce { splits, residual: false }) = steps[i].kernel else {
            i += 1;
            continue;
        };
        let merged = steps[i].node.clone();
        let parts = steps[i].args.first().cloned().unwrap_or_default();
        // every view of the merged node, with its element offset in it
        let mut views: Vec<(String, Option<Scalar>)> = vec![(merged.clone(), None)];
        for s in &steps {
            if let Some(of) = &s.alias_of {
                if let Some(k) = views.iter().position(|(v, _)| v == of) {
                    let off = match (&views[k].1, &s.alias_offset) {
                        (None, o) => o.clone(),
                        (o, None) => o.clone(),
                        (Some(_), Some(_)) => continue,
                    };
                    views.push((s.node.clone(), off));
                }
            }
        }
        let offset = |a: &str| views.iter().find(|(v, _)| v == a).map(|(_, o)| o.clone().unwrap_or(Scalar::Const(0)));
        let reads_view = |s: &Step| s.buffers().any(|a| views.iter().any(|(v, _)| v == a));
        let (lo, hi) = (steps[i].min_rows.unwrap_or(1), steps[i].max_rows);
        // (the matmul writing the node names it too; the one-token steps — the decode attention
        // taking RoPE in, and the RoPE kernel where the split attention takes one token — read
        // q, k and v too, but never in the reduce's rows: rows there are tokens x H)
        let one_token_only = |s: &Step| {
            let h = match &s.kernel {
                Some(KernelSpec::RopeAttention { inner, .. }) => match inner.as_ref() {
                    KernelSpec::PagedAttention { h, .. } => *h as i64,
                    _ => return false,
                },
                Some(KernelSpec::QkvRopeCache { h, .. }) => *h as i64,
                _ => return false,
            };
            s.max_rows.is_some_and(|m| m < lo * h)
        };
        let readers: Vec<usize> = (0..steps.len()).filter(|&k| k != i && steps[k].node != merged && steps[k].kernel.is_some() && !one_token_only(&steps[k]) && reads_view(&steps[k])).collect();
        let [r] = readers[..] else {
            i += 1;
            continue;
        };
        let Some(rope @ KernelSpec::QkvRopeCache { h, .. }) = steps[r].kernel.clone() else {
            i += 1;
            continue;
        };
        let (Some(oq), Some(ok), Some(ov)) = (offset(&steps[r].args[0]), offset(&steps[r].args[1]), offset(&steps[r].args[2])) else {
            i += 1;
            continue;
        };
        if steps[r].args.len() != 8 || steps[r].alternatives().next().is_some() {
            i += 1;
            continue;
        }
        let mut args = vec![parts];
        args.extend(steps[r].args[3..].iter().cloned());
        let mut scalars = steps[r].scalars.clone();
        scalars.extend([Scalar::Numel(merged), oq, ok, ov]);
        let kernel = KernelSpec::QkvRopeSplitK { inner: Box::new(rope), splits };
        // (the rope step's rows are tokens x H)
        let hh = h as i64;
        let (work, grid_y) = (steps[r].work.clone(), steps[r].grid_y.clone());
        steps[r].hopper.push(Large { min_rows: lo * hh, max_rows: hi.map(|m| m * hh), args: Some(args), kernel, scalars, work, grid_y });
        steps.remove(i);
    }
    steps
}

/// (on; DSC_SPLITK_NORM=0 off, see [`lower_opts`]) A split-K reduce step whose
/// output's next reader is an RMSNorm (the 8B shape's o and down projections: the residual
/// stream, normalized for the next matmul) is folded into that norm: the norm step gets a `hopper` alternative for the reduce's rows that sums the parts
/// (+ the residual), writes the node, and normalizes it (`SplitKReduceNorm`; one launch
/// instead of two). Steps between them must not read the node.
pub(crate) fn fold_splitk_reduce_norm(mut steps: Vec<Step>, cluster_want: Option<usize>) -> Vec<Step> {
    let reads = |s: &Step, y: &str| s.buffers().any(|a| a == y);
    let mut i = 0;
    while i < steps.len() {
        let Some(KernelSpec::SplitKReduce { splits, residual }) = steps[i].kernel else {
            i += 1;
            continue;
        };
        let r = &steps[i];
        let y = r.node.clone();
        let Some(j) = (i + 1..steps.len()).find(|&j| reads(&steps[j], &y)) else {
            i += 1;
            continue;
        };
        let n = &steps[j];
        let (d, eps_bits, half) = match n.kernel {
            Some(KernelSpec::RmsNorm { d, eps_bits }) => (d, eps_bits, None),
            Some(KernelSpec::RmsNormHalf { d, eps_bits, f16 }) => (d, eps_bits, Some(f16)),
            _ => {
                i += 1;
                continue;
            }
        };
        // (the norm over this node as its input, no alternatives of its own, a row a multiple of
        // 4 floats: args x, g, xn[, xh])
        if d % 4 != 0 || n.args.first() != Some(&y) || n.alias_of.is_some() || !n.hopper.is_empty() || n.args.len() != 3 + usize::from(half.is_some()) {
            i += 1;
            continue;
        }
        let mut args = r.args.clone();
        args.extend(n.args[1..].iter().cloned());
        // (on sm_90a, where this alternative runs, a cluster of blocks per row: grid y = the
        // cluster)
        let cluster = crate::kernels::splitk_norm_cluster(d, cluster_want);
        let alt = Large {
            min_rows: r.min_rows.unwrap_or(1),
            max_rows: r.max_rows,
            args: Some(args),
            kernel: KernelSpec::SplitKReduceNorm { splits, residual, d, eps_bits, half, cluster },
            scalars: n.scalars.clone(),
            work: n.work.clone(),
            grid_y: if cluster > 1 { Scalar::Const(cluster as i64) } else { n.grid_y.clone() },
        };
        steps[j].hopper.push(alt);
        steps.remove(i);
    }
    steps
}

/// Most K parts of [`split_k`] by default: measured on the H200 (bench/results/split-k-2026-11-30.json,
/// 8B shape, same call): b16 2,216 -> 2,501 tok/s, b32 4,087 -> 4,866, b64 7,402 -> 8,314;
/// o at 32 rows 21.7 -> 14.7 us, down 65.7 -> 39.1 us (both passes).
pub const SPLIT_K_PARTS: usize = 4;

/// SMs the split-K grid is sized for (H100 SXM / H200: 132): the 64-row tiles of a split-K
/// matmul (one block per SM: ~200 KB of shared memory) times its parts stay within one wave.
pub const SPLIT_K_SMS: usize = crate::kernels::TARGET_SMS;

/// K parts of a split-K matmul of `tiles` column tiles of `bn` over `ksteps` 64-wide K steps:
/// the most, up to `max_parts`, that divide the K steps and bn and keep tiles x parts within
/// [`SPLIT_K_SMS`] (the 8B shape: o/down 32 tiles -> 4, q/k/v 48 -> 2); None below 2.
pub fn split_k_parts(tiles: usize, ksteps: usize, bn: usize, max_parts: usize) -> Option<usize> {
    (2..=max_parts).rev().find(|&s| tiles * s <= SPLIT_K_SMS && ksteps % s == 0 && bn % s == 0)
}

/// Rows from which [`split_k`] takes a matmul ...
pub const SPLIT_K_MIN_ROWS: i64 = 16;
/// ... up to these (past its 64-row tiles' own range, 64 rows: at 128 rows (8B shape, H200)
/// the 64-row split-K tiles take down 94 -> 70 us per call, q/k/v 53 -> 35, o 42 -> 27, where
/// the 128-row tiles run 32-48 blocks; bench/results/splitk128-2026-11-30.json).
pub const SPLIT_K_MAX_ROWS: i64 = 128;
/// ... where its 64-row pipelined tiles number fewer than this (N = 4096 at bn 128: 32 tiles
/// on 132 SMs; its K parts multiply the blocks).
pub const SPLIT_K_MAX_TILES: usize = 64;

/// Split-K for batched decode (on by default, [`SPLIT_K_PARTS`]; DSC_SPLIT_K=S at compile
/// time, 0 off): a plain matmul whose 64-row pipelined alternative has fewer than
/// [`SPLIT_K_MAX_TILES`] column tiles (the 8B shape's o and down projections: 32 tiles, a
/// quarter of the SMs; today they run the batched GEMV at 1.4-1.7 TB/s from 16 to 47 rows)
/// gets, first in its `hopper` list for [`SPLIT_K_MIN_ROWS`] up to that alternative's last
/// row or [`SPLIT_K_MAX_ROWS`], `SplitK` over the same tile writing `{node}@splitk{S}` ([S, M, N] f32 partial sums,
/// declared by a kernel-less step before it), and after it a `SplitKReduce` step writing the
/// node (+ the residual) for the same rows, `hopper_only` like the alternative.
pub(crate) fn split_k(steps: Vec<Step>, max_parts: usize) -> Vec<Step> {
    let mut out = Vec::with_capacity(steps.len());
    for mut s in steps {
        // (the 64-row tile, the same kernel without the residual: the reduce pass adds it; a
        // merged matmul's (q/k/v) with its parts, whole tiles each)
        let pipe = s.hopper.iter().find_map(|h| {
            let (p, parts) = match &h.kernel {
                KernelSpec::MatMulParts { inner, parts } => (inner.as_ref(), Some(parts)),
                k => (k, None),
            };
            match *p {
                KernelSpec::MatMulPipe { k, n, wdtype, bias: false, bn, stages, overlap, a16, bm: 64, .. }
                    if n / bn < SPLIT_K_MAX_TILES && n % bn == 0 && parts.is_none_or(|ps| ps.iter().all(|q| q % bn == 0)) =>
                {
                    let sk = split_k_parts(n / bn, k / 64, bn, max_parts)?;
                    let pipe = KernelSpec::MatMulPipe { k, n, wdtype, bias: false, residual: false, bn, stages, overlap, a16, bm: 64 };
                    let inner = match parts {
                        Some(ps) => KernelSpec::MatMulParts { inner: Box::new(pipe), parts: ps.clone() },
                        None => pipe,
                    };
                    Some((h.clone(), h.max_rows, inner, sk))
                }
                _ => None,
            }
        });
        let residual = match &s.kernel {
            Some(KernelSpec::MatMul { residual, .. }) => *residual,
            Some(KernelSpec::MatMulParts { inner, .. }) if matches!(inner.as_ref(), KernelSpec::MatMul { .. }) => false,
            _ => {
                out.push(s);
                continue;
            }
        };
        let Some((pipe, Some(hi), inner, sk)) = pipe else {
            out.push(s);
            continue;
        };
        // (up to SPLIT_K_MAX_ROWS rows, past the 64-row alternative's own range: two row tiles
        // of K parts beat one 128-row tile per column tile there)
        let hi = hi.max(SPLIT_K_MAX_ROWS);
        let parts = format!("{}@splitk{sk}", s.node);
        // (x and W as the alternative reads them: its own args where a fusion gave it some)
        let own = pipe.args.clone().unwrap_or_else(|| s.args.clone());
        let y = s.node.clone();
        // (x and the weights — one, or a merged matmul's parts — then the partial sums; the
        // residual goes to the reduce pass)
        let mut first = own[..own.len() - 1 - usize::from(residual)].to_vec();
        first.push(parts.clone());
        let lo = SPLIT_K_MIN_ROWS.min(hi);
        s.hopper.insert(0, Large { min_rows: lo, max_rows: Some(hi), args: Some(first), kernel: KernelSpec::SplitK { inner: Box::new(inner), splits: sk }, ..pipe });
        let mut args = vec![parts.clone()];
        if residual {
            args.push(own[own.len() - 2].clone());
        }
        args.push(y.clone());
        let reduce = Step {
            kernel: Some(KernelSpec::SplitKReduce { splits: sk, residual }),
            args,
            scalars: vec![Scalar::Numel(y.clone())],
            work: Scalar::Numel(y.clone()),
            min_rows: Some(lo),
            max_rows: Some(hi),
            hopper_only: true,
            ..Step::new(&y)
        };
        out.push(Step::new(&parts));
        out.push(s);
        out.push(reduce);
    }
    out
}

/// The pipelined matmuls that take x in 16 bits (`MatMulPipe { a16 }`) read it from a buffer
/// `{x}@bf16` (`@f16`) that a `ToHalf` step writes just before the first of them (steps of
/// 128+ rows only, like the matmuls: decode never runs it). The buffer is the graph node's
/// shape in 16-bit elements (the runtime sizes `@` buffers from their base node).
///
/// With `norm_half`, an x that an RMSNorm step writes gets its copy from that step instead
/// (`RmsNormHalf`: norm + quantize, no cast launch; the copy's buffer is declared by a
/// kernel-less step).
pub(crate) fn insert_half_casts(steps: Vec<Step>, norm_half: bool, silu_half: bool) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::with_capacity(steps.len());
    // cast buffer -> its cast step's index in `out` (None: an RMSNorm writes it)
    let mut made: std::collections::HashMap<String, Option<usize>> = std::collections::HashMap::new();
    for mut s in steps {
        let step_args = s.args.clone();
        for h in s.hopper.iter_mut().chain(s.few.iter_mut()) {
            // (x as this alternative reads it: its own args where a fusion gave it some)
            let x = h.args.as_ref().unwrap_or(&step_args).first().cloned().unwrap_or_default();
            // (through the wrappers: split-K over a merged matmul is two deep)
            let inner = h.kernel.matmul_core().0;
            let (k, wdtype) = match inner {
                KernelSpec::MatMulPipe { k, wdtype, a16: true, .. } | KernelSpec::MatMulFewX16 { k, wdtype, .. } | KernelSpec::MoeGateUpMma { d: k, wdtype, .. } => (*k, *wdtype),
                _ => continue,
            };
            let f16 = crate::kernels::tensor_core_f16(wdtype);
            let half = format!("{x}@{}", if f16 { "f16" } else { "bf16" });
            // (for a new copy: the RMSNorm — or silu_mul — step writing x, where it can write the
            // copy too)
            let norm = || {
                norm_half
                    .then(|| {
                        out.iter().position(|p| {
                            p.node == x
                                && p.alias_of.is_none()
                                && ((p.args.len() == 3
                                    && (matches!(p.kernel, Some(KernelSpec::RmsNorm { d, .. }) if d % 4 == 0)
                                        || (silu_half && p.kernel == Some(KernelSpec::Binary(BinaryOpKey(dsc_ir::BinaryOp::SiluMul))))))
                                    || (p.args.len() == 4 && matches!(p.kernel, Some(KernelSpec::LayerNorm { half: None, .. }))))
                        })
                    })
                    .flatten()
            };
            match made.get(&half) {
                // (one cast serves every alternative reading it: it runs from the fewest rows)
                Some(&Some(i)) => out[i].min_rows = out[i].min_rows.min(Some(h.min_rows)),
                Some(None) => {}
                None => match norm() {
                    Some(i) => {
                        out[i].kernel = match out[i].kernel.take() {
                            Some(KernelSpec::RmsNorm { d, eps_bits }) => Some(KernelSpec::RmsNormHalf { d, eps_bits, f16 }),
                            Some(KernelSpec::LayerNorm { d, eps_bits, half: None }) => Some(KernelSpec::LayerNorm { d, eps_bits, half: Some(f16) }),
                            Some(KernelSpec::Binary(_)) => Some(KernelSpec::SiluMulHalf { f16 }),
                            other => other,
                        };
                        out[i].args.push(half.clone());
                        made.insert(half.clone(), None);
                        out.push(Step::new(&half));
                    }
                    None => {
                        let units = Scalar::RowsTimes(x.clone(), (k / 8) as i64);
                        made.insert(half.clone(), Some(out.len()));
                        out.push(Step {
                            kernel: Some(KernelSpec::ToHalf { f16 }),
                            args: vec![x.clone(), half.clone()],
                            scalars: vec![units.clone()],
                            work: units,
                            min_rows: Some(h.min_rows),
                            ..Step::new(&half)
                        });
                    }
                },
            }
            // (the alternative's own args where it has them: a fused default kernel may
            // write another buffer)
            let mut args = h.args.clone().unwrap_or_else(|| step_args.clone());
            args[0] = half;
            h.args = Some(args);
        }
        out.push(s);
    }
    out
}
