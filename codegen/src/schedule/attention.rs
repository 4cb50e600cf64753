//! Schedule rewrites around the attention: the fused q/k/v RoPE + cache write, the split
//! decode attention for long contexts, and the one-token fusions (RoPE and the cache writes,
//! the o projection, the q/k/v GEMV inside the decode attention), the L2 prefetch after it.

use crate::schedule::*;

/// The q/k/v GEMV folded into the one-token attention with the o projection added
/// ([`fuse_attention_o_red`]; `KernelSpec::QkvAttentionO`): where that attention's q, k and v
/// are the three parts of a merged bias-less bf16 or Q4_1 GEMV with the norm prologue (which zeroes the
/// attention's accumulators, `ZeroFill`), and the one-row kernel before that GEMV is the
/// previous layer's fused MLP writing the GEMV's x, the attention's one-row kernel reads x, g
/// and the three weights instead (each head's blocks a cluster on sm_90a), the MLP zeroes the
/// accumulators (`ZeroFill` over `SwiGluDown`), and the GEMV runs from two rows — and at one
/// row only at the contexts past the fused attention's (the split attention's, where the o
/// GEMV writes both accumulators), without the zero fill. A launch fewer per layer at batch 1
/// from the second layer on (the first layer's GEMV follows the embedding gather; under
/// DSC_QKV_ATTN_L0=1 the gather zeroes the accumulators too, `ZeroFill` over `Gather`, and the
/// first layer is fused as well — measured slower).
pub(crate) fn fuse_qkv_attention(mut steps: Vec<Step>) -> Vec<Step> {
    // (the element offset of a view of a merged matmul's output, through plain aliases)
    let offset_of = |steps: &[Step], name: &str, root: &str| -> Option<i64> {
        let mut n = name.to_string();
        for _ in 0..8 {
            let s = steps.iter().find(|s| s.node == n && s.alias_of.is_some())?;
            let of = s.alias_of.clone()?;
            match &s.alias_offset {
                Some(Scalar::RowsTimes(r, off)) if of == root && r == root => return Some(*off),
                Some(_) => return None,
                None => n = of,
            }
        }
        None
    };
    let mut i = 0;
    while i < steps.len() {
        let Some(KernelSpec::AttentionO { inner, red: true, splits, .. }) = &steps[i].kernel else {
            i += 1;
            continue;
        };
        let KernelSpec::RopeAttention { inner: att, .. } = inner.as_ref() else {
            i += 1;
            continue;
        };
        let KernelSpec::PagedAttention { h, kvh, d, .. } = *att.as_ref() else {
            i += 1;
            continue;
        };
        let splits = *splits;
        // the zero-filling q/k/v GEMV and the fused MLP before it
        let Some(z) = steps[..i].iter().rposition(|s| matches!(s.kernel, Some(KernelSpec::ZeroFill { .. }))) else {
            i += 1;
            continue;
        };
        let Some(KernelSpec::ZeroFill { inner: zi, len }) = steps[z].kernel.clone() else { unreachable!("matched") };
        let KernelSpec::NormMatMul { inner: mm, eps_bits } = zi.as_ref() else {
            i += 1;
            continue;
        };
        let KernelSpec::MatMulParts { inner: core, parts } = mm.as_ref() else {
            i += 1;
            continue;
        };
        let KernelSpec::MatMul { k, wdtype: wdtype @ (DType::BF16 | DType::Q4_1), bias: false, residual: false, .. } = **core else {
            i += 1;
            continue;
        };
        // (the GEMV's args: the two accumulators, x, g, the parts' weights, its output)
        if parts.len() != 3 || steps[z].args.len() != 8 || steps[i].args.len() != 13 || !unbounded(&steps[z]) {
            i += 1;
            continue;
        }
        let (x, g, out) = (steps[z].args[2].clone(), steps[z].args[3].clone(), steps[z].args[7].clone());
        // q, k and v: which part each view starts at
        let starts: Vec<i64> = parts
            .iter()
            .scan(0i64, |a, &p| {
                let s = *a;
                *a += p as i64;
                Some(s)
            })
            .collect();
        let part = |v: &str, width: usize| -> Option<usize> {
            let off = offset_of(&steps, v, &out)?;
            (0..3).find(|&j| starts[j] == off && parts[j] == width)
        };
        let (Some(pq), Some(pk), Some(pv)) = (part(&steps[i].args[0], h * d), part(&steps[i].args[1], kvh * d), part(&steps[i].args[2], kvh * d)) else {
            i += 1;
            continue;
        };
        let Some(p) = steps[..z].iter().rposition(|s| s.kernel.is_some() && s.min_rows.is_none()) else {
            i += 1;
            continue;
        };
        // (the kernel zeroing the accumulators has a thread for each of their `len` floats:
        // the fused MLP's. (Not the first layer's embedding gather, a thread per element of x:
        // measured slower, SmolLM2 b1 0.255 -> 0.258 ms, as there the fused kernel's 36 blocks
        // load their W_q/W_k/W_v rows from DRAM with no MLP before them to hide it, where the
        // GEMV spreads them over all SMs.)
        let mlp_fits = match &steps[p].kernel {
            Some(KernelSpec::SwiGluDown { f, fb, fpw, .. }) => (f / fb) * 32 * (fb / fpw) >= len,
            _ => false,
        };
        if !mlp_fits || steps[p].node != x || steps[p].args.last() != Some(&x) {
            i += 1;
            continue;
        }
        let fused = KernelSpec::QkvAttentionO { inner: Box::new(steps[i].kernel.clone().expect("matched")), k, eps_bits: *eps_bits, cluster: splits, wdtype };
        if crate::kernels::fits(&fused).is_err() {
            i += 1;
            continue;
        }
        // the MLP zeroes the accumulators
        let (acc_out, acc_y) = (steps[z].args[0].clone(), steps[z].args[1].clone());
        let ps = &mut steps[p];
        let old = ps.keep_alternative_args();
        ps.kernel = ps.kernel.take().map(|k| KernelSpec::ZeroFill { inner: Box::new(k), len });
        ps.args = [acc_out, acc_y].into_iter().chain(old).collect();
        // the attention computes q, k and v
        let zargs = steps[z].args.clone();
        let a = &mut steps[i];
        let max_context = a.max_context;
        let old = a.keep_alternative_args();
        a.kernel = Some(fused);
        a.args = [x, g, zargs[4 + pq].clone(), zargs[4 + pk].clone(), zargs[4 + pv].clone()].into_iter().chain(old[3..].iter().cloned()).collect();
        // the GEMV: from two rows, and at one row past the fused attention's contexts (plain)
        let zs = steps[z].clone();
        steps[z] = Step { min_rows: Some(2), ..zs.clone() };
        if let Some(mc) = max_context {
            let plain =
                Step { kernel: Some((*zi).clone()), args: zargs[2..].to_vec(), max_rows: Some(1), min_context: Some(mc + 1), large: None, hopper: vec![], hopper_small: None, few: vec![], ..zs };
            steps.insert(z + 1, plain);
            i += 1;
        }
        i += 1;
    }
    steps
}

/// The one-token RoPE attention of a head per block at step `i`, if it is one: its heads,
/// H·D, and the names its output goes by (itself and the views of it).
pub(crate) fn one_token_attention(steps: &[Step], i: usize) -> Option<(usize, usize, Vec<String>)> {
    let Some(KernelSpec::RopeAttention { inner, .. }) = &steps[i].kernel else { return None };
    let KernelSpec::PagedAttention { h, d, group: 1, .. } = inner.as_ref() else { return None };
    let a = steps[i].node.as_str();
    let views = std::iter::once(a.to_string()).chain(steps.iter().filter(|s| s.alias_of.as_deref() == Some(a) && s.alias_offset.is_none()).map(|s| s.node.clone())).collect();
    Some((*h, h * d, views))
}

/// Whether a step launches for every row count and context (no bounds).
pub(crate) fn unbounded(s: &Step) -> bool {
    s.min_rows.is_none() && s.max_rows.is_none() && s.min_context.is_none() && s.max_context.is_none()
}

/// Blocks per head of the one-token attention with the o projection added in
/// ([`fuse_attention_o_red`]), each taking 1/ATTN_O_SPLITS of W_o's rows.
pub const ATTN_O_SPLITS: usize = 4;

/// Most bytes of W_o one block of the fused one-token attention reads ([`fuse_attention_o`]).
pub const ATTN_O_MAX_BYTES: usize = 128 << 10;

/// The o projection folded into the one-token RoPE attention (`KernelSpec::AttentionO`, sm_90a
/// and sm_80 alike): where a `RopeAttention` step (a head per block, one token) feeds, through
/// views, a bias-less bf16 or Q4_1 matmul with a residual whose K is H·D, the attention step takes the
/// matmul's weight, residual and output, plus `{y}@splitk{H}` (the heads' partial sums,
/// [H, T, N], declared by a kernel-less step before it) and `{y}@sync` (a counter per token,
/// resident, zeroed once by the runtime), and the matmul's step keeps the other cases: two or
/// more tokens, and one token at the contexts the split attention takes (past the fused step's
/// `max_context`). A launch fewer per layer at batch 1.
pub(crate) fn fuse_attention_o(mut steps: Vec<Step>) -> Vec<Step> {
    let mut i = 0;
    while i < steps.len() {
        let Some((h, hd, views)) = one_token_attention(&steps, i) else {
            i += 1;
            continue;
        };
        let o = steps.iter().position(|s| {
            matches!(s.kernel, Some(KernelSpec::MatMul { k, residual: true, bias: false, wdtype: DType::BF16 | DType::Q4_1, .. }) if k == hd)
                && s.args.len() == 4
                && views.contains(&s.args[0])
                && unbounded(s)
        });
        let Some(o) = o.filter(|&o| o > i) else {
            i += 1;
            continue;
        };
        let Some(KernelSpec::MatMul { n, wdtype, .. }) = steps[o].kernel else { unreachable!("matched") };
        // (each block reads its head's columns of W_o: small models only — the 8B shape's
        // would be 1 MB per block on 32 SMs, where its o GEMV streams on all of them)
        if n * (hd / h) * 2 > ATTN_O_MAX_BYTES {
            i += 1;
            continue;
        }
        let om = steps[o].clone();
        let (w, res, y) = (om.args[1].clone(), om.args[2].clone(), om.args[3].clone());
        let parts = format!("{y}@splitk{h}");
        let fused = &mut steps[i];
        let max_context = fused.max_context;
        let inner = fused.kernel.take().expect("matched");
        fused.kernel = Some(KernelSpec::AttentionO { inner: Box::new(inner), n, red: false, splits: 1, wdtype });
        fused.args.truncate(9);
        fused.args.extend([w, res, parts.clone(), format!("{y}@sync"), y.clone()]);
        // (the matmul for two or more tokens, and for one at the split attention's contexts)
        steps[o] = Step { min_rows: Some(2), ..om.clone() };
        if let Some(mc) = max_context {
            steps.insert(o + 1, Step { max_rows: Some(1), min_context: Some(mc + 1), ..om });
        }
        steps.insert(i, Step::new(&parts));
        i += 2;
    }
    steps
}

/// The o projection folded into the one-token RoPE attention where the fused MLP follows
/// ([`fuse_swiglu_down`]; `KernelSpec::AttentionO` with `red`): the o step's one-row kernel
/// (`MatMulCopy`, writing the residual stream x and the MLP's accumulator y) is replaced by
/// the attention's blocks adding their heads' parts (head 0: + the residual) into both, which
/// the one-row q/k/v GEMV before it zeroes (`ZeroFill`). The o step keeps two rows and more,
/// and one row at the contexts the split attention takes (past the fused step's
/// `max_context`), where it writes both as before. A launch fewer per layer at batch 1.
pub(crate) fn fuse_attention_o_red(mut steps: Vec<Step>, splits_per_head: usize) -> Vec<Step> {
    let mut i = 0;
    while i < steps.len() {
        let Some((h, hd, views)) = one_token_attention(&steps, i) else {
            i += 1;
            continue;
        };
        let o = steps.iter().position(|s| {
            matches!(&s.kernel, Some(KernelSpec::MatMulCopy { inner }) if matches!(inner.as_ref(), KernelSpec::MatMul { k, residual: true, bias: false, wdtype: DType::BF16 | DType::Q4_1, .. } if *k == hd))
                && s.args.len() == 5
                && views.contains(&s.args[0])
                && unbounded(s)
        });
        // the q/k/v GEMV with the norm prologue before the attention zeroes the accumulators:
        // a grid of at least N threads in every part
        let z = steps[..i].iter().rposition(|s| s.kernel.is_some() && s.min_rows.is_none() && s.max_rows.is_none());
        let (Some(o), Some(z)) = (o.filter(|&o| o > i), z) else {
            i += 1;
            continue;
        };
        let Some(KernelSpec::MatMulCopy { inner }) = &steps[o].kernel else { unreachable!("matched") };
        let KernelSpec::MatMul { n, wdtype, .. } = **inner else { unreachable!("matched") };
        let threads = |k: &KernelSpec| -> Option<usize> {
            let KernelSpec::NormMatMul { inner, .. } = k else { return None };
            let (core, parts) = inner.matmul_core();
            let KernelSpec::MatMul { n: cn, .. } = core else { return None };
            let per = crate::kernels::columns_per_block_of(core)?;
            let narrowest = parts.map_or(*cn, |p| p.iter().copied().min().unwrap_or(0));
            Some(narrowest.div_ceil(per) * 32 * crate::kernels::GEMV_WARPS)
        };
        if n * (hd / h) * 2 > ATTN_O_MAX_BYTES || steps[z].kernel.as_ref().and_then(threads).is_none_or(|t| t < n) {
            i += 1;
            continue;
        }
        // (the projection's rows over `splits` blocks per head, where they divide evenly)
        let splits = splits_per_head;
        let Scalar::Const(gy) = steps[i].grid_y else {
            i += 1;
            continue;
        };
        let splits = if n % splits == 0 { splits } else { 1 };
        let om = steps[o].clone();
        let (wo, res, y, x) = (om.args[1].clone(), om.args[2].clone(), om.args[3].clone(), om.args[4].clone());
        let fused = &mut steps[i];
        let max_context = fused.max_context;
        let att = fused.kernel.take().expect("matched");
        fused.kernel = Some(KernelSpec::AttentionO { inner: Box::new(att), n, red: true, splits, wdtype });
        fused.grid_y = Scalar::Const(gy * splits as i64);
        fused.args.truncate(9);
        fused.args.extend([wo, res, y.clone(), x.clone()]);
        let zs = &mut steps[z];
        let old = zs.keep_alternative_args();
        zs.kernel = zs.kernel.take().map(|k| KernelSpec::ZeroFill { inner: Box::new(k), len: n });
        zs.args = [x, y].into_iter().chain(old).collect();
        steps[o] = Step { min_rows: Some(2), ..om.clone() };
        if let Some(mc) = max_context {
            steps.insert(o + 1, Step { max_rows: Some(1), min_context: Some(mc + 1), ..om });
        }
        i += 1;
    }
    steps
}

/// Most weight bytes the decode attention prefetches into L2 for the matmul after it (the
/// H200's L2 is 50 MB; the 8B shape's o projection is 33.5 MB).
pub const ATTN_PREFETCH_MAX_BYTES: usize = 40 << 20;

/// The decode attention steps (one-pass and grouped; not the prefill attention) prefetch into
/// L2 the weight of the first later step reading one (the output projection), where that
/// weight is larger than its own GEMV prefetches ([`crate::kernels::GEMV_PREFETCH_MAX_BYTES`])
/// and at most [`ATTN_PREFETCH_MAX_BYTES`]: `KernelSpec::PrefetchL2`, the weight as the first
/// arg and its bytes as the last scalar (the prefill alternative keeps the old args).
pub(crate) fn prefetch_after_attention(mut steps: Vec<Step>, g: &Graph) -> Vec<Step> {
    for i in 0..steps.len() {
        if !matches!(steps[i].kernel, Some(KernelSpec::PagedAttention { .. })) {
            continue;
        }
        let next = steps[i + 1..].iter().find_map(|s| {
            let ws: Vec<(String, usize)> = s.args.iter().filter_map(|a| plain_weight_bytes(g, a).map(|b| (a.clone(), b))).collect();
            (!ws.is_empty()).then_some(ws)
        });
        let Some([(w, bytes)]) = next.as_deref() else { continue };
        if *bytes <= crate::kernels::GEMV_PREFETCH_MAX_BYTES || *bytes > ATTN_PREFETCH_MAX_BYTES {
            continue;
        }
        let s = &mut steps[i];
        let original = s.args.clone();
        let wrap = |k: &KernelSpec| KernelSpec::PrefetchL2 { inner: Box::new(k.clone()) };
        s.kernel = s.kernel.as_ref().map(wrap);
        s.args.insert(0, w.clone());
        s.scalars.push(Scalar::Const(*bytes as i64));
        for l in &mut s.few {
            l.kernel = wrap(&l.kernel);
            l.scalars.push(Scalar::Const(*bytes as i64));
        }
        if let Some(l) = &mut s.large {
            l.args.get_or_insert(original);
        }
    }
    steps
}

/// Parts the split decode attention cuts a context into, at most, and the fewest keys per part.
pub const ATTN_SPLITS: usize = 16;
pub const ATTN_SPLIT_MIN_KEYS: usize = 256;

/// Steps whose longest context has at least this many keys run the split decode attention
/// (the one-pass kernel below). Measured on the H200 (8B shape, one token, per layer): 256
/// keys 11.4 µs one-pass vs 13.2 split, 1k 21.1 vs 15.9, 8k 143 vs 41
/// (bench/results/split-kv-2026-11-30.json). `ScheduleOptions::split_kv_from` overrides.
pub const ATTN_SPLIT_FROM_KEYS: i64 = 512;

/// ... and at most this many rows (tokens x heads): measured at a 2k context, the split
/// path at 8B batch 8 (256 rows) and 32 was 4-7% slower than the one-pass kernel (its idle
/// parts' blocks), at SmolLM2 batch 8 (72 rows) 44% faster.
pub const ATTN_SPLIT_ROWS: i64 = (crate::kernels::ATTN_SPLIT_BLOCKS / 4) as i64;

/// Long-context decode attention over more of the GPU: beside each decode attention step
/// (kept for contexts under [`ATTN_SPLIT_FROM_KEYS`] keys: `max_context`), two steps for longer
/// ones (`min_context`): `{node}@split{S}` (`PagedAttentionSplit`: a block per (token, head,
/// part) writing partial softmax states into that buffer, `S` = [`ATTN_SPLITS`] parts of at
/// least [`ATTN_SPLIT_MIN_KEYS`] keys) and `{node}` itself (`AttentionCombine`, up to the
/// prefill attention's rows: that writes the output itself). One block per (token, head) uses
/// 32 of the 132 SMs at batch 1 (8B shape), whatever the context; split 16 ways an 8k context
/// keeps them all busy, while at short contexts the second launch and the idle parts' blocks
/// cost more than they win.
pub(crate) fn split_attention(steps: Vec<Step>, attn_group: bool, from: i64) -> Vec<Step> {
    let mut out = Vec::with_capacity(steps.len());
    for s in steps {
        let Some(KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits, warps, keys, kv, .. }) = s.kernel.clone() else {
            out.push(s);
            continue;
        };
        let (ns, mk) = (ATTN_SPLITS, ATTN_SPLIT_MIN_KEYS);
        let part = format!("{}@split{ns}", s.node);
        let original = s.args.clone();
        // (the split passes up to ATTN_SPLIT_ROWS rows — below the prefill attention's —, the
        // one-pass kernel above them at long contexts: a second copy of its step)
        let max_rows = ATTN_SPLIT_ROWS.min(s.large.as_ref().map_or(i64::MAX, |l| l.min_rows - 1));
        out.push(Step { max_context: Some(from - 1), ..s.clone() });
        out.push(Step { min_context: Some(from), min_rows: Some(max_rows + 1), ..s.clone() });
        let mut first = Step { min_context: Some(from), max_rows: Some(max_rows), large: None, hopper: vec![], ..s.clone() };
        first.node = part.clone();
        // (grouped where its head groups alone give ATTN_GROUP_MIN_BLOCKS blocks at a full
        // split)
        let g = attention_group_size(h, kvh, d, warps);
        let group = if attn_group && h / g * ns >= ATTN_GROUP_MIN_BLOCKS { g } else { 1 };
        first.kernel = Some(KernelSpec::PagedAttentionSplit { h, kvh, d, bs, scale_bits, warps, keys, splits: ns, min_keys: mk, group, kv });
        if let Some(last) = first.args.last_mut() {
            *last = part.clone();
        }
        first.grid_y = Scalar::Const((h / group * ns) as i64);
        first.few = vec![];
        let rows = Scalar::Rows(s.node.clone());
        let combine = Step {
            kernel: Some(KernelSpec::AttentionCombine { h, d, splits: ns, min_keys: mk }),
            args: vec![part, original[3].clone(), s.node.clone()],
            scalars: vec![rows.clone()],
            work: rows,
            max_rows: Some(max_rows),
            min_context: Some(from),
            ..Step::new(&s.node)
        };
        out.push(first);
        out.push(combine);
    }
    out
}

/// RoPE and the cache writes inside the decode attention for one-token steps: where a
/// `QkvRopeCache` step (rope(q), rope_cache_write(k), cache_write(v) of a merged Q/K/V
/// matmul) feeds a one-pass `PagedAttention` of a block per (token, head), the attention step
/// is split in two — for one token (rows = H) a `RopeAttention` kernel reading q, k and v
/// before RoPE and writing the token's K/V rows itself, for more the original — and the
/// `QkvRopeCache` launch moves to a step of its own on the rotated q's node (rows T·H) from
/// two tokens on, and for one token where the split attention takes the context (from
/// `split_from` keys: its passes read the pools the kernel would have written). One token
/// only: with more, a token may attend to another's row of the same step.
pub(crate) fn fuse_rope_attention(mut steps: Vec<Step>, split_from: Option<i64>) -> Vec<Step> {
    let hosts: Vec<usize> = steps.iter().enumerate().filter(|(_, s)| matches!(s.kernel, Some(KernelSpec::QkvRopeCache { .. }))).map(|(i, _)| i).collect();
    // (indices shift as steps are inserted: from the last host back)
    for &i in hosts.iter().rev() {
        let Some(KernelSpec::QkvRopeCache { h, theta_bits, interleaved, .. }) = steps[i].kernel.clone() else { continue };
        let qkv = steps[i].clone();
        let Some(rq) = qkv.args.get(7).cloned() else { continue };
        let Some(a) =
            steps.iter().position(|s| s.args.first() == Some(&rq) && s.min_context.is_none() && s.min_rows.is_none() && matches!(s.kernel, Some(KernelSpec::PagedAttention { group: 1, .. })))
        else {
            continue;
        };
        if a < i {
            continue;
        }
        let att = steps[a].clone();
        let one = h as i64;
        let fused = Step {
            kernel: Some(KernelSpec::RopeAttention { inner: Box::new(att.kernel.clone().expect("matched")), theta_bits, interleaved }),
            args: vec![
                qkv.args[0].clone(),
                qkv.args[1].clone(),
                qkv.args[2].clone(),
                att.args[3].clone(),
                qkv.args[4].clone(),
                att.args[1].clone(),
                att.args[2].clone(),
                att.args[4].clone(),
                att.args[5].clone(),
                att.args[6].clone(),
            ],
            max_rows: Some(one),
            large: None,
            few: vec![],
            hopper: vec![],
            hopper_small: None,
            ..att.clone()
        };
        steps[a] = Step { min_rows: Some(one + 1), ..att };
        steps.insert(a, fused);
        let write = Step { node: rq.clone(), min_rows: Some(one + 1), alias_of: None, alias_offset: None, ..qkv.clone() };
        let mut moved = vec![write.clone()];
        if let Some(from) = split_from {
            moved.push(Step { min_rows: None, max_rows: Some(one), min_context: Some(from), ..write });
        }
        steps[i].kernel = None;
        steps[i].args = vec![];
        steps[i].scalars = vec![];
        for (k, m) in moved.into_iter().enumerate() {
            steps.insert(i + 1 + k, m);
        }
    }
    steps
}

pub(crate) fn fuse_qkv_rope_cache(g: &Graph, steps: &mut [Step]) {
    use dsc_ir::NodeId;
    let at: std::collections::HashMap<String, usize> = steps.iter().enumerate().map(|(i, s)| (s.node.clone(), i)).collect();
    // the one user of `id` through reshapes, and the reshape chain's last node
    let through = |id: NodeId| -> Option<(NodeId, NodeId)> {
        let mut cur = id;
        loop {
            let users = g.users(cur);
            if users.len() != 1 || g.outputs.iter().any(|(_, o)| *o == cur) {
                return None;
            }
            let u = users[0];
            if matches!(g.node(u).op, Op::Reshape) {
                cur = u;
            } else {
                return Some((cur, u));
            }
        }
    };
    for cat in g.node_ids().filter(|&n| matches!(g.node(n).op, Op::MatMulCat)) {
        let slices = g.users(cat);
        if slices.len() != 3 {
            continue;
        }
        let (mut q, mut k, mut v) = (None, None, None);
        for &s in &slices {
            let Some((x, u)) = through(s) else { continue };
            match g.node(u).op {
                Op::Rope { .. } if g.operands(u)[0] == x => q = Some((x, u)),
                Op::RopeCacheWrite { .. } if g.operands(u)[1] == x => k = Some((x, u)),
                Op::CacheWrite if g.operands(u)[1] == x => v = Some((x, u)),
                _ => {}
            }
        }
        let (Some((xq, rq)), Some((xk, rk)), Some((xv, wv))) = (q, k, v) else { continue };
        let (Op::Rope { theta, style, rotary_dim }, Op::RopeCacheWrite { theta: tk, style: sk, rotary_dim: dk }) = (&g.node(rq).op, &g.node(rk).op) else { continue };
        let (qo, ko, vo) = (g.operands(rq), g.operands(rk), g.operands(wv));
        // same positions for both ropes, same slots for both writes, one rotation
        if qo[1] != ko[3] || ko[2] != vo[2] || theta != tk || style != sk || rotary_dim != dk {
            continue;
        }
        let dims = |id: NodeId| -> Option<(usize, usize)> {
            let t = &g.node(id).ty;
            (t.rank() == 3).then_some((t.shape[1].as_const()?, t.shape[2].as_const()?))
        };
        let (Some((h, d)), Some((kvh, dk2)), Some((kvh2, dv))) = (dims(xq), dims(xk), dims(xv)) else { continue };
        if d != dk2 || d != dv || kvh != kvh2 || *rotary_dim != d || d % 2 != 0 {
            continue;
        }
        // (both pools of one type)
        let kv = g.node(rk).ty.dtype;
        if g.node(wv).ty.dtype != kv {
            continue;
        }
        let name = |id: NodeId| g.node(id).name.clone();
        let (Some(&iq), Some(&ik), Some(&iv)) = (at.get(&name(rq)), at.get(&name(rk)), at.get(&name(wv))) else { continue };
        let host = iq.max(ik).max(iv);
        let kc = steps[ik].args[3].clone();
        let vc = steps[iv].args[2].clone();
        for i in [iq, ik, iv] {
            steps[i].kernel = None;
        }
        let h_ = &mut steps[host];
        h_.kernel = Some(KernelSpec::QkvRopeCache { h, kvh, d, theta_bits: theta.to_bits(), interleaved: *style == RopeStyle::Interleaved, kv });
        h_.args = vec![name(xq), name(xk), name(xv), name(qo[1]), name(ko[2]), kc, vc, name(rq)];
        h_.scalars = vec![Scalar::HalfNumel(name(cat)), Scalar::HalfNumel(name(xq)), Scalar::HalfNumel(name(xk))];
        h_.work = Scalar::HalfNumel(name(cat));
        h_.grid_y = Scalar::Const(1);
    }
}
