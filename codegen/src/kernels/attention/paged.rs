//! Decode attention over the paged KV cache: a block per (token, head) with `warps` warps
//! taking `keys` keys per step (`PagedAttention`), grouped — a block per (token, KV head) over
//! its query heads — for batched decode, and split along the context into partial softmax
//! states merged by `AttentionCombine` for long contexts (`PagedAttentionSplit`). The one-token
//! fusions that wrap it (RoPE, cache writes, o projection, q/k/v) are `attention/qkv.rs`'s
//! wrappers but are written inside `emit_paged_attention`, which is one function (~750 lines)
//! for the same reason as the prefill attention's: one kernel's loop and its carried state.
//! Semantics: `dsc_ir::exec`'s `paged_attention`. This file also owns the family's symbols
//! and launch geometry (`paged_symbol`, `paged_launch`), the lowering of `paged_attention`
//! (`lower_paged_attention`: the one-pass step with its grouped and prefill alternatives) and
//! its lowering tests; ptxas runs over it in codegen/tests, and on the GPU the bundle's cases in
//! compiler/src/gpu_bundle/attention.rs.

use crate::kernels::*;
use crate::schedule::{attention_group_size, Large, NodeCx, Scalar, Step, ATTN_GROUP_MIN_BLOCKS};
use crate::CodegenError;

/// The lowering of `paged_attention`: the decode kernel (a block per token and head), with the
/// alternatives by rows — the grouped kernel for batched decode (a block per token and KV head),
/// the prefill kernel on the tensor cores (`flash`), its wgmma variant on sm_90a. The split
/// kernel for long contexts is a rewrite (`schedule::attention`, `split-attention`).
pub(crate) fn lower_paged_attention(cx: &NodeCx, args: Vec<String>, scale: f32) -> Result<Step, CodegenError> {
    let (ops, names, name, opts) = (cx.ops, cx.names, cx.name, cx.opts);
        let c = |t: &dsc_ir::TensorType, i: usize| t.shape[i].as_const();
        let (h, d) = (c(&ops[0].ty, 1), c(&ops[0].ty, 2));
        let (bs, kvh) = (c(&ops[1].ty, 1), c(&ops[1].ty, 2));
        let (Some(h), Some(d), Some(bs), Some(kvh)) = (h, d, bs, kvh) else {
            return Err(cx.err("paged attention needs constant heads, head dim and block size"));
        };
        let kv = crate::schedule::gpu_kv(name, ops[1].ty.dtype)?;
        let spec = KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps: opts.attn_warps, keys: opts.attn_keys, group: 1, kv };
        let mb = Scalar::Dim(names[5].clone(), 1);
        // (a block per (token, head): grid x = tokens, y = heads)
        let st = cx.step(spec, args, vec![Scalar::Rows(name.to_string()), mb.clone()], Scalar::Dim(name.to_string(), 0), Scalar::Const(h as i64));
        // prefill (more than 128 tokens: never a decode batch): FlashAttention tiles on
        // the tensor cores, a block per (64 tokens, head). (Rows here are tokens x heads.)
        let flash = (d % 16 == 0 && d <= 128 && opts.flash).then(|| Large {
            min_rows: 129 * h as i64,
            max_rows: None,
            args: None,
            kernel: KernelSpec::FlashAttention {
                h,
                kvh,
                d,
                bs,
                scale_bits: scale.to_bits(),
                kv,
                warps: if kv == DType::F32 || d % 32 != 0 { 4 } else { opts.flash_warps },
                mtiles: if kv == DType::F32 || d % 32 != 0 { 1 } else { opts.flash_mtiles },
            },
            scalars: vec![Scalar::Dim(name.to_string(), 0), mb],
            work: Scalar::Const(h as i64),
            grid_y: Scalar::Dim(name.to_string(), 0),
        });
        // batched decode (from as many tokens as give ATTN_GROUP_MIN_BLOCKS blocks, up
        // to the prefill kernel's rows): a block per (token, KV head) taking the KV
        // head's query heads, each K/V row read once for them, in fewer warps
        let gw = opts.attn_group_warps;
        let g = attention_group_size(h, kvh, d, gw);
        let max_rows = flash.as_ref().map(|f| f.min_rows - 1);
        let grouped = (g > 1 && opts.attn_group).then(|| Large {
            min_rows: (ATTN_GROUP_MIN_BLOCKS.div_ceil(h / g) * h) as i64,
            max_rows,
            args: None,
            kernel: KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits: scale.to_bits(), warps: gw, keys: opts.attn_group_keys.unwrap_or(opts.attn_keys), group: g, kv },
            scalars: st.scalars.clone(),
            work: Scalar::Dim(name.to_string(), 0),
            grid_y: Scalar::Const((h / g) as i64),
        });
        // (sm_90a, bf16 pools: the same tiles with both products on wgmma)
        let wg = flash.as_ref().filter(|f| opts.flash_wgmma && matches!(f.kernel, KernelSpec::FlashAttention { kv: DType::BF16, warps: 4, mtiles: 1, d: crate::kernels::FLASH_WG_D, .. })).map(
            |f| {
                // (K/V tiles by TMA: the pools' args become their tensor maps,
                // `{pool}@kvmap{rows}`, encoded by the runtime once per pool)
                let args = crate::kernels::flash_wg_tma_rows(bs).map(|rows| {
                    let mut a = f.args.clone().unwrap_or_else(|| st.args.clone());
                    for p in &mut a[1..3] {
                        *p = format!("{p}@kvmap{rows}");
                    }
                    a
                });
                Large { kernel: KernelSpec::FlashWgmma { inner: Box::new(f.kernel.clone()) }, args: args.or_else(|| f.args.clone()), ..f.clone() }
            },
        );
        Ok(Step { large: flash, few: grouped.into_iter().collect(), hopper: wg.into_iter().collect(), ..st })
}

/// The readable symbol of a `paged` kernel (`KernelSpec::symbol`).
pub(crate) fn paged_symbol(spec: &KernelSpec) -> String {
    match spec {
            KernelSpec::PagedAttention { h, kvh, d, bs, warps, keys, group, kv, .. } => {
                // (16 warps, 4 keys per step and a block per head, the defaults, keep the plain
                // name)
                format!(
                    "paged_attention_h{h}_kv{kvh}_d{d}_bs{bs}{}{}{}{}",
                    if *warps == 16 { String::new() } else { format!("_w{warps}") },
                    if *keys == ATTN_KEYS { String::new() } else { format!("_u{keys}") },
                    if *group == 1 { String::new() } else { format!("_g{group}") },
                    kv_suffix(*kv)
                )
            }
            KernelSpec::PagedAttentionSplit { h, kvh, d, bs, warps, keys, splits, min_keys, group, kv, .. } => {
                format!("paged_attention_split{splits}x{min_keys}_h{h}_kv{kvh}_d{d}_bs{bs}_w{warps}_u{keys}{}{}", if *group == 1 { String::new() } else { format!("_g{group}") }, kv_suffix(*kv))
            }
            KernelSpec::AttentionCombine { h, d, splits, min_keys } => format!("attention_combine_h{h}_d{d}_s{splits}x{min_keys}"),
        other => unreachable!("{other:?} is not a paged kernel (kernels::family)"),
    }
}

/// How the runtime launches a `paged` kernel (`KernelSpec::launch`).
pub(crate) fn paged_launch(spec: &KernelSpec) -> Launch {
    match spec {
            KernelSpec::PagedAttention { warps, .. } | KernelSpec::PagedAttentionSplit { warps, .. } => Launch::BlockPerRow { warps: *warps as u32 },
            KernelSpec::AttentionCombine { .. } => Launch::WarpPerRow { rows_per_block: 4 },
        other => unreachable!("{other:?} is not a paged kernel (kernels::family)"),
    }
}

/// Keys each warp of the decode attention kernel takes per loop step (the default of
/// [`crate::options::ScheduleOptions::attn_keys`]).
pub const ATTN_KEYS: usize = 4;

/// What [`emit_paged_attention`] takes (`split`: the split pass; `rope`: the one-token kernel
/// with RoPE and the cache writes): D a multiple of 32, H of KVH, 1..=32 warps of 1..=8 keys,
/// groups within a KV head's query heads, f32 or bf16 pools; RoPE with a thread per head-dim
/// element; the o projection (`o.attn_o`) and q/k/v computed inside (`o.qkv_in`) on the
/// one-token RoPE kernel of a head per block, the latter's rows and K within its warps.
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention_fits(h: usize, kvh: usize, d: usize, warps: usize, keys: usize, group: usize, kv: DType, split: bool, rope: bool, o: Outer) -> Result<(), String> {
    if rope && (split || 32 * warps < d || d % 2 != 0) {
        return Err(format!("the decode attention takes RoPE and the cache writes in with one pass and a thread per head-dim element (D {d}, {warps} warps)"));
    }
    if d % 32 != 0 || kvh == 0 || h % kvh != 0 {
        return Err(format!("paged attention needs D a multiple of 32 and H a multiple of KVH (D {d}, H {h}, KVH {kvh})"));
    }
    if !(1..=32).contains(&warps) {
        return Err(format!("paged attention takes 1..=32 warps per block, not {warps}"));
    }
    if !(1..=8).contains(&keys) {
        return Err(format!("paged attention takes 1..=8 keys per warp step, not {keys}"));
    }
    if group == 0 || (h / kvh) % group != 0 {
        return Err(format!("paged attention takes groups of query heads within one KV head's (H {h}, KVH {kvh}), not {group}"));
    }
    kv_fits(kv)?;
    if o.attn_o && (!rope || split || group != 1 || h / kvh < 1) {
        return Err("the o projection folds into the one-token RoPE attention of a head per block".into());
    }
    if let Some((k, c)) = o.qkv_in {
        if !(o.attn_o_red && group == 1 && rope) || k % 8 != 0 || c == 0 || d % c != 0 || (3 * d / c).div_ceil(warps) * c > 32 || k / 4 > 32 * warps {
            return Err(format!("the attention computes q, k and v itself in the one-token RoPE attention with the o projection added, a head per block, D / {c} elements per block, at most 32 rows times blocks per warp, K a multiple of 8 (K {k}, D {d}, {warps} warps)"));
        }
    }
    Ok(())
}

/// The decode attention ([`KernelSpec::PagedAttention`]; with `split` = (S, min keys), the
/// [`KernelSpec::PagedAttentionSplit`] pass: block (token, head group, s) takes split s of the
/// rows' context and writes their partial softmax states to `%out` instead of the output).
#[allow(clippy::too_many_arguments)]
pub(crate) fn emit_paged_attention(
    b: &mut Body,
    h: usize,
    kvh: usize,
    d: usize,
    bs: usize,
    scale_bits: u32,
    warps: usize,
    keys: usize,
    group: usize,
    kv: DType,
    split: Option<(usize, usize)>,
    rope: Option<(u32, bool)>,
) -> Result<String, String> {
    paged_attention_fits(h, kvh, d, warps, keys, group, kv, split.is_some(), rope.is_some(), b.outer())?;
    let nk = keys;
    let per = d / 32;
    let rep = group;
    // one block per (token, group of `rep` query heads of one KV head) — grid x = tokens, y =
    // H / rep (x the split's parts) —: each K/V row is loaded once for the group (GQA). The
    // block's warps split the context (split-KV) and combine their partial softmax states
    // through shared memory, warp g % WARPS merging head g of the group.
    #[allow(non_snake_case)]
    let WARPS: usize = warps;
    let stride = d + 2;
    // (the o projection folded in: the head's output (D floats) and the last-block flag past
    // the partial states)
    let attn_o = b.attn_o;
    // (bf16 pools, the one-pass kernels of a block per head: the next warp step's K/V rows are
    // loaded before this step's math, carried through the loop as raw 16-bit vectors. On: 8B
    // b1 3.836 -> 3.796 ms, SmolLM2 shape b1 -0.8%, b32 -1.6%; not for the grouped kernels:
    // their extra registers cost the SmolLM2 shape's b128 a wave (52.4k -> 46.8k tok/s) for
    // +0.8% on the 8B's b128 (bench/results/fusion-2026-11-30-session12.json);
    // `KernelOptions::attn_pipeline`)
    let pipelined = kv == DType::BF16 && per <= 8 && split.is_none() && group == 1 && bs % nk == 0 && b.o.attn_pipeline;
    // (rope (a one-token step), PDL, the pipelined one-pass kernel: the first warp step's K/V
    // rows — earlier positions, written by earlier steps, not by the kernel before — go out
    // before griddepcontrol.wait; a warp whose first step reaches this token's own position
    // loads it again after the cache write below (`short`: takes
    // that position's rows from shared memory). Head dims up to 64: SmolLM2 shape b1 0.377 ->
    // 0.365 ms per step, where the 8B shape's D = 128 kernel lost 0.5% (3.803 -> 3.821 ms;
    // bench/results/attn-early-2026-11-30.json); `KernelOptions::attn_early`)
    let early_d = match b.o.attn_early {
        crate::options::AttnEarly::Off => false,
        crate::options::AttnEarly::All => true,
        crate::options::AttnEarly::UpTo64 => d <= 64,
    };
    let early = pipelined && rope.is_some() && split.is_none() && b.pdl && !b.waited && early_d;
    let o_at = WARPS * rep * stride;
    // (the one-token RoPE kernel, pipelined, first K/V rows before the wait: this token's
    // rotated K row and its V row past the o projection's slots, as f32, for the warp whose
    // first step holds this position — it takes them from here instead of reloading its rows
    // from the pool after the cache write: one L2 round trip fewer on the kernel's path;
    // `KernelOptions::attn_short`)
    let short = b.o.attn_short;
    let new_at = o_at + if attn_o.is_some() { d + 1 } else { 0 };
    // (QkvAttentionO: x and g of the token's row, then the head's q, k and v, past the rest)
    let qkv_in = b.qkv_in;
    let xs_at = new_at + if short && early { 2 * d } else { 0 };
    let (gs_at, qkv_at) = match qkv_in {
        Some((k, _, _)) => (xs_at + k, xs_at + 2 * k),
        None => (xs_at, xs_at),
    };
    // (QkvAttentionO in clusters: the cluster's blocks split the context's keys, and each
    // block's partial softmax state (m, l, acc[D]) goes to every block of the cluster, at
    // parts_at + rank·(D + 2); `KernelOptions::qkv_attn_key_split`)
    let key_split = qkv_in.map(|(_, _, c)| c).filter(|&c| c > 1 && pipelined && split.is_none() && b.o.qkv_attn_key_split);
    let parts_at = qkv_at + if qkv_in.is_some() { 3 * d } else { 0 };
    let smt = format!("memref<{}xf32, #gpu.address_space<workgroup>>", parts_at + key_split.map_or(0, |c| c * (d + 2)));
    b.workgroup = Some(format!("%sm : {smt}"));
    let bid = b.op("gpu.block_id x");
    let t = b.idx64(&bid);
    let by = b.op("gpu.block_id y");
    let by = b.idx64(&by);
    let tid = b.op("gpu.thread_id x");
    let (lane_i, warp_i) = b.lane_warp(&tid);
    let lane = b.idx64(&lane_i);
    let hh = b.ci64(h as i64);
    let row0 = b.op(&format!("arith.muli {t}, {hh} : i64"));
    let ok = b.op(&format!("arith.cmpi slt, {row0}, %n : i64"));
    b.line(&format!("scf.if {ok} {{"));
    // (the split: block y = hg · S + s; the o projection's row parts: block y = hg · P + part)
    let osplits = if attn_o.is_some() { b.attn_o_splits } else { 1 };
    let (by, opart) = if osplits > 1 {
        let cp = b.ci64(osplits as i64);
        (b.op(&format!("arith.divui {by}, {cp} : i64")), Some(b.op(&format!("arith.remui {by}, {cp} : i64"))))
    } else {
        (by, None)
    };
    let (hg, sy) = match split {
        None => (by.clone(), None),
        Some((ns, _)) => {
            let cns = b.ci64(ns as i64);
            (b.op(&format!("arith.divui {by}, {cns} : i64")), Some(b.op(&format!("arith.remui {by}, {cns} : i64"))))
        }
    };
    let p = b.load_i32_as_i64("%pos", &t);
    let sq = b.load_i32_as_i64("%seq", &t);
    let dd = b.ci64(d as i64);
    let crep = b.ci64(rep as i64);
    let head0 = b.op(&format!("arith.muli {hg}, {crep} : i64"));
    let cgqa = b.ci64((h / kvh) as i64);
    let kh = b.op(&format!("arith.divui {head0}, {cgqa} : i64"));
    // (QkvAttentionO, before the wait: the warp's rows of W_q, W_k and W_v into L2 and g into
    // shared memory)
    let qkv_pre = match qkv_in {
        Some((k, _, c)) => Some(qkv_prologue(b, k, d, c, WARPS, &head0, &kh, opart.as_deref(), &tid, &warp_i, &lane_i, gs_at, &smt)),
        None => None,
    };
    // the lane's head-dim elements: 32e + lane from an f32 pool (a warp's loads take 128
    // consecutive bytes), lane·per + e from a 16-bit one (one vector load of `per` each)
    let wide = kv == DType::F32;
    let eoff: Vec<String> = (0..per)
        .map(|e| {
            if wide {
                let ce = b.ci64(32 * e as i64);
                b.op(&format!("arith.addi {lane}, {ce} : i64"))
            } else {
                let cp = b.ci64(per as i64);
                let l = b.op(&format!("arith.muli {lane}, {cp} : i64"));
                let ce = b.ci64(e as i64);
                b.op(&format!("arith.addi {l}, {ce} : i64"))
            }
        })
        .collect();
    // key `ju`'s element offset in the pools from `p0`, key `j0`'s, in the same cache block
    let in_block = |b: &mut Body, p0: &str, j0: &str, ju: &str| -> String {
        let krow = b.ci64((kvh * d) as i64);
        let du = b.op(&format!("arith.subi {ju}, {j0} : i64"));
        let o = b.op(&format!("arith.muli {du}, {krow} : i64"));
        b.op(&format!("arith.addi {p0}, {o} : i64"))
    };
    // the raw K and V vectors of the warp step from key `jb` (i64; keys past the context load
    // its last key's row)
    let raw_step = |b: &mut Body, jb: &str, hi: &str| -> Vec<String> {
        let c1 = b.ci64(1);
        let cl = b.op(&format!("arith.subi {hi}, {c1} : i64"));
        let cbs = b.ci64(bs as i64);
        let trow = b.op(&format!("arith.muli {sq}, %mb : i64"));
        let ckvh = b.ci64(kvh as i64);
        let j0 = b.op(&format!("arith.minsi {jb}, {cl} : i64"));
        let p0 = b.paged_key_offset(&j0, &trow, &kh, &cbs, &ckvh, &dd);
        let mut out = vec![];
        for u in 0..nk {
            let cu = b.ci64(u as i64);
            let ju = b.op(&format!("arith.addi {jb}, {cu} : i64"));
            let ju = b.op(&format!("arith.minsi {ju}, {cl} : i64"));
            let kb = in_block(b, &p0, &j0, &ju);
            let o = b.op(&format!("arith.addi {kb}, {} : i64", eoff[0]));
            let c2 = b.ci64(2);
            let by = b.op(&format!("arith.muli {o}, {c2} : i64"));
            for pool in ["%kc", "%vc"] {
                out.push(b.load_vector(pool, &by, per, "i16", 2 * per));
            }
        }
        out
    };
    // (the o projection: this thread's rows j = tid + 32·WARPS·r of W_o's D columns of head
    // h = head0, D/8 16-byte loads each, before the wait where the kernel has one ahead)
    let nthreads = 32 * WARPS;
    let o_rows: Vec<(String, String, Vec<String>, String)> = match attn_o {
        Some(nn) => {
            let tid64 = b.idx64(&tid);
            let hd = b.ci64((h * d) as i64);
            let hoff = b.op(&format!("arith.muli {head0}, {dd} : i64"));
            // (this block's rows: all N, or part `opart` of N / splits)
            let np = nn / osplits;
            let cnp = b.ci64(np as i64);
            let jbase = match &opart {
                Some(op) => b.op(&format!("arith.muli {op}, {cnp} : i64")),
                None => b.ci64(0),
            };
            let clocal = b.ci64(np as i64 - 1);
            let clast = b.ci64(nn as i64 - 1);
            (0..np.div_ceil(nthreads))
                .map(|r| {
                    let cr = b.ci64((r * nthreads) as i64);
                    let jl = b.op(&format!("arith.addi {tid64}, {cr} : i64"));
                    let valid = b.op(&format!("arith.cmpi sle, {jl}, {clocal} : i64"));
                    let j = b.op(&format!("arith.addi {jbase}, {jl} : i64"));
                    let jc = b.op(&format!("arith.minsi {j}, {clast} : i64"));
                    let e0 = b.op(&format!("arith.muli {jc}, {hd} : i64"));
                    let e0 = b.op(&format!("arith.addi {e0}, {hoff} : i64"));
                    // (round 0 only: a second round's rows load in `o_projection`, so 512
                    // threads keep to 128 registers)
                    let vs = if r == 0 { o_row_load(b, &e0, d) } else { vec![] };
                    (j, valid, vs, e0)
                })
                .collect()
        }
        None => vec![],
    };
    // (key_split: this block's keys [klo, khi) — the context in `c` chunks of whole warp steps,
    // block r of the cluster taking chunk r)
    let key_range = match (key_split, &opart) {
        (Some(c), Some(r)) => {
            let c1 = b.ci64(1);
            let ctxk = b.op(&format!("arith.addi {p}, {c1} : i64"));
            let cm1 = b.ci64((c * nk) as i64 - 1);
            let cdiv = b.ci64((c * nk) as i64);
            let steps = b.op(&format!("arith.addi {ctxk}, {cm1} : i64"));
            let steps = b.op(&format!("arith.divui {steps}, {cdiv} : i64"));
            let cnk = b.ci64(nk as i64);
            let chunk = b.op(&format!("arith.muli {steps}, {cnk} : i64"));
            let klo = b.op(&format!("arith.muli {r}, {chunk} : i64"));
            let khi = b.op(&format!("arith.addi {klo}, {chunk} : i64"));
            let khi = b.op(&format!("arith.minsi {khi}, {ctxk} : i64"));
            Some((klo, khi))
        }
        _ => None,
    };
    let early_first = if early {
        let c1e = b.ci64(1);
        let ctx_e = b.op(&format!("arith.addi {p}, {c1e} : i64"));
        let w64 = b.idx64(&warp_i);
        let cnk = b.ci64(nk as i64);
        let js = b.op(&format!("arith.muli {w64}, {cnk} : i64"));
        let js = match &key_range {
            Some((klo, _)) => b.op(&format!("arith.addi {js}, {klo} : i64")),
            None => js,
        };
        let pre = raw_step(b, &js, &ctx_e);
        b.wait_for_previous();
        Some((js, pre))
    } else {
        None
    };
    // the group's rows (token, head) and their q (pre-scaled), lane's elements 32e + lane
    // (short: loaded and rotated before the cache write below, their L2 round trip beside the
    // K/V rows' instead of after the block barrier)
    let q_rows = |b: &mut Body| -> (Vec<String>, Vec<Vec<String>>) {
        let grow0 = b.op(&format!("arith.addi {row0}, {head0} : i64"));
        let rows: Vec<String> = (0..rep)
            .map(|g| {
                let cg = b.ci64(g as i64);
                b.op(&format!("arith.addi {grow0}, {cg} : i64"))
            })
            .collect();
        let scale = b.cf32(f32::from_bits(scale_bits));
        let mut qv = vec![];
        for row in &rows {
            let qbase = b.op(&format!("arith.muli {row}, {dd} : i64"));
            let mut qg = vec![];
            for eo in &eoff {
                let q = match rope {
                    // (computed above, in shared memory: the head's q at qkv_at)
                    Some((theta_bits, interleaved)) if qkv_in.is_some() => {
                        let c0 = b.ci64(0);
                        b.rope_elem_src(&Src::Shared(&smt, qkv_at), &c0, eo, &p, d, theta_bits, interleaved)
                    }
                    Some((theta_bits, interleaved)) => b.rope_elem("%xq", &qbase, eo, &p, d, theta_bits, interleaved),
                    None => {
                        let o = b.op(&format!("arith.addi {qbase}, {eo} : i64"));
                        b.load("%q", &o)
                    }
                };
                qg.push(b.op(&format!("arith.mulf {q}, {scale} : f32")));
            }
            qv.push(qg);
        }
        (rows, qv)
    };
    if let (Some((k, eps, c)), Some(rows)) = (qkv_in, &qkv_pre) {
        if b.pdl && !b.waited {
            b.wait_for_previous();
        }
        qkv_compute(b, k, eps, c, &t, rows, &tid, &lane_i, xs_at, gs_at, qkv_at, &smt);
    }
    let early_q = (short && rope.is_some()).then(|| q_rows(b));
    // (rope: this token's K row of KV head kh rotated and its V row into the pools at slot[t]
    // first — every block of the KV head writes the same values —, visible to the block after
    // the barrier; a one-token step only: no other token of the step reads them)
    if let Some((theta_bits, interleaved)) = rope {
        let tid64 = b.idx64(&tid);
        let slot = b.load_i32_as_i64("%slots", &t);
        let ckvh = b.ci64(kvh as i64);
        let cd = b.ci64(d as i64);
        let xb = b.op(&format!("arith.muli {t}, {ckvh} : i64"));
        let xb = b.op(&format!("arith.addi {xb}, {kh} : i64"));
        let xb = b.op(&format!("arith.muli {xb}, {cd} : i64"));
        let cb = b.op(&format!("arith.muli {slot}, {ckvh} : i64"));
        let cb = b.op(&format!("arith.addi {cb}, {kh} : i64"));
        let cb = b.op(&format!("arith.muli {cb}, {cd} : i64"));
        let mine = b.op(&format!("arith.cmpi slt, {tid64}, {cd} : i64"));
        b.line(&format!("scf.if {mine} {{"));
        // (QkvAttentionO: k and v from shared memory, at qkv_at + D and + 2·D)
        let (ksrc, vsrc, kvb) = match qkv_in {
            Some(_) => (Src::Shared(&smt, qkv_at + d), Src::Shared(&smt, qkv_at + 2 * d), b.ci64(0)),
            None => (Src::Global("%xk"), Src::Global("%xv"), xb.clone()),
        };
        let y = b.rope_elem_src(&ksrc, &kvb, &tid64, &p, d, theta_bits, interleaved);
        let dst = b.op(&format!("arith.addi {cb}, {tid64} : i64"));
        let src = b.op(&format!("arith.addi {kvb}, {tid64} : i64"));
        // (short: V loaded before K is stored — the pools may alias x for all the compiler
        // knows, so a load after the store waits for it: two L2 round trips in a row)
        let v_first = short.then(|| b.load_src(&vsrc, &src));
        b.store_kv(&y, "%kc", &dst, kv)?;
        let v = match v_first {
            Some(v) => v,
            None => b.load_src(&vsrc, &src),
        };
        b.store_kv(&v, "%vc", &dst, kv)?;
        if short && early {
            // (and into shared memory, for the warp whose first step holds this position)
            for (val, at) in [(&y, new_at), (&v, new_at + d)] {
                let ca = b.op(&format!("arith.constant {at} : index"));
                let i = b.op(&format!("arith.addi {ca}, {tid} : index"));
                b.line(&format!("memref.store {val}, %sm[{i}] : {smt}"));
            }
        }
        b.line("}");
        b.line("gpu.barrier");
    }
    let (rows, qv) = match early_q {
        Some(q) => q,
        None => q_rows(b),
    };
    let c1 = b.ci64(1);
    let ctx = b.op(&format!("arith.addi {p}, {c1} : i64"));
    // the keys [lo, hi) this block takes: all of the context, or with `split` its part s
    // of the se = min(ceil(ctx / min keys), S) parts of ceil(ctx / se) keys; blocks past se
    // do nothing
    let (lo, hi, part) = match (split, &sy) {
        (Some((ns, min_keys)), Some(sy)) => {
            let (se, chunk) = split_extent(b, &ctx, ns, min_keys);
            let lo = b.op(&format!("arith.muli {sy}, {chunk} : i64"));
            let hi = b.op(&format!("arith.addi {lo}, {chunk} : i64"));
            let hi = b.op(&format!("arith.minsi {hi}, {ctx} : i64"));
            let active = b.op(&format!("arith.cmpi slt, {sy}, {se} : i64"));
            b.line(&format!("scf.if {active} {{"));
            (lo, hi, Some((sy.clone(), ns)))
        }
        _ => match &key_range {
            Some((klo, khi)) => (klo.clone(), khi.clone(), None),
            None => (b.ci64(0), ctx.clone(), None),
        },
    };
    let ctxi = b.op(&format!("arith.index_cast {hi} : i64 to index"));
    let wstep = b.op(&format!("arith.constant {WARPS} : index"));
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let zero = b.cf32(0.0);
    let res = b.v();
    let j = b.v();
    // running state per head g: m, l, acc[per] at g·(per + 2)
    let st = per + 2;
    let state: Vec<String> = (0..rep * st).map(|_| b.v()).collect();
    let iter: Vec<String> = state.iter().enumerate().map(|(i, s)| format!("{s} = {}", if i % st == 0 { &ninf } else { &zero })).collect();
    let tys = vec!["f32"; rep * st].join(", ");
    // warp w takes keys nk·w .. nk·w + nk - 1, then the same WARPS·nk further on; the
    // first key of a step is always inside the context (the loop bound), the others
    // past it load the last key's row and count as -inf
    let cnk = b.op(&format!("arith.constant {nk} : index"));
    let jstart = b.op(&format!("arith.muli {warp_i}, {cnk} : index"));
    let loi = b.op(&format!("arith.index_cast {lo} : i64 to index"));
    let jstart = b.op(&format!("arith.addi {jstart}, {loi} : index"));
    let wstep = b.op(&format!("arith.muli {wstep}, {cnk} : index"));
    let vty = format!("vector<{per}xi16>");
    let (iter, tys, raw_args) = if pipelined {
        let js = b.idx64(&jstart);
        let first = match &early_first {
            Some((js_e, pre)) => {
                // (loaded before the wait: again where the warp's first step reaches key p)
                let cl = b.ci64(nk as i64 - 1);
                let last = b.op(&format!("arith.addi {js_e}, {cl} : i64"));
                let mut stale = b.op(&format!("arith.cmpi sge, {last}, {p} : i64"));
                if short {
                    // (only the warp whose first step holds key p: warps past it run no step)
                    let from = b.op(&format!("arith.cmpi sle, {js_e}, {p} : i64"));
                    stale = b.op(&format!("arith.andi {stale}, {from} : i1"));
                }
                let r = b.v();
                let vty1 = format!("vector<{per}xi16>");
                let vtys = vec![vty1.clone(); pre.len()].join(", ");
                b.line(&format!("{r}:{} = scf.if {stale} -> ({vtys}) {{", pre.len()));
                let again = if short {
                    // key p's rows from shared memory (as the pool holds them: bf16 of the
                    // f32 the cache write stored), the step's other keys as loaded before
                    let mut fresh = vec![];
                    for at in [new_at, new_at + d] {
                        let elems: Vec<String> = eoff
                            .iter()
                            .map(|eo| {
                                let ca = b.ci64(at as i64);
                                let i = b.op(&format!("arith.addi {ca}, {eo} : i64"));
                                let i = b.op(&format!("arith.index_cast {i} : i64 to index"));
                                let x = b.op(&format!("memref.load %sm[{i}] : {smt}"));
                                b.op(&format!("llvm.inline_asm \"cvt.rn.bf16.f32 $0, $1;\", \"=h,f\" {x} : (f32) -> i16"))
                            })
                            .collect();
                        fresh.push(b.vector(&elems, "i16"));
                    }
                    let mut out = vec![];
                    for u in 0..nk {
                        let cu = b.ci64(u as i64);
                        let ju = b.op(&format!("arith.addi {js_e}, {cu} : i64"));
                        let here = b.op(&format!("arith.cmpi eq, {ju}, {p} : i64"));
                        for kvi in 0..2 {
                            out.push(b.op(&format!("arith.select {here}, {}, {} : {vty1}", fresh[kvi], pre[2 * u + kvi])));
                        }
                    }
                    out
                } else {
                    raw_step(b, &js, &hi)
                };
                b.line(&format!("scf.yield {} : {vtys}", again.join(", ")));
                b.line("} else {");
                b.line(&format!("scf.yield {} : {vtys}", pre.join(", ")));
                b.line("}");
                (0..pre.len()).map(|i| format!("{r}#{i}")).collect()
            }
            None => raw_step(b, &js, &hi),
        };
        let args: Vec<String> = (0..first.len()).map(|_| b.v()).collect();
        let mut iter = iter;
        iter.extend(args.iter().zip(&first).map(|(a, f)| format!("{a} = {f}")));
        let tys = format!("{tys}{}", format!(", {vty}").repeat(first.len()));
        (iter, tys, args)
    } else {
        (iter, tys, vec![])
    };
    let nres = rep * st + raw_args.len();
    b.line(&format!("{res}:{nres} = scf.for {j} = {jstart} to {ctxi} step {wstep} iter_args({}) -> ({tys}) {{", iter.join(", ")));
    let j64 = b.idx64(&j);
    // (pipelined: the next step's loads go out first)
    let next_raw = if pipelined {
        let ws64 = b.idx64(&wstep);
        let jn = b.op(&format!("arith.addi {j64}, {ws64} : i64"));
        raw_step(b, &jn, &hi)
    } else {
        vec![]
    };
    let cbs = b.ci64(bs as i64);
    let trow = b.op(&format!("arith.muli {sq}, %mb : i64"));
    let ckvh = b.ci64(kvh as i64);
    let clast = b.op(&format!("arith.subi {hi}, {c1} : i64"));
    // (a warp step's keys j .. j + nk - 1 lie in one cache block when j is a multiple of nk
    // — the one-pass kernel's, from key 0 — and nk divides the block size: one block-table
    // lookup per step, the keys' rows kvh·d elements apart; `KernelOptions::attn_one_lookup`)
    let one_lookup = !pipelined && split.is_none() && bs % nk == 0 && b.o.attn_one_lookup;
    let page0 = one_lookup.then(|| b.paged_key_offset(&j64, &trow, &kh, &cbs, &ckvh, &dd));
    // every key's K and V rows first (nk·2·per loads in flight), then the math
    let mut kvrows: Vec<(Vec<String>, Vec<String>, Option<String>)> = vec![];
    for u in 0..nk {
        let cu = b.ci64(u as i64);
        let ju = b.op(&format!("arith.addi {j64}, {cu} : i64"));
        let valid = (u > 0).then(|| b.op(&format!("arith.cmpi slt, {ju}, {hi} : i64")));
        if pipelined {
            // (this step's rows, loaded one step ahead)
            let mut widen = |r: &str| -> Vec<String> {
                (0..per)
                    .map(|e| {
                        let h = b.element(r, e, per, "i16");
                        b.bf16_to_f32(&h)
                    })
                    .collect()
            };
            let (ks, vs) = (widen(&raw_args[2 * u]), widen(&raw_args[2 * u + 1]));
            kvrows.push((ks, vs, valid));
            continue;
        }
        let ju = if u > 0 { b.op(&format!("arith.minsi {ju}, {clast} : i64")) } else { ju };
        let kbase = match &page0 {
            Some(p0) => in_block(b, p0, &j64, &ju),
            None => b.paged_key_offset(&ju, &trow, &kh, &cbs, &ckvh, &dd),
        };
        let (mut ks, mut vs) = (vec![], vec![]);
        if wide {
            for eo in &eoff {
                let o = b.op(&format!("arith.addi {kbase}, {eo} : i64"));
                ks.push(b.load("%kc", &o));
                vs.push(b.load("%vc", &o));
            }
        } else {
            let o = b.op(&format!("arith.addi {kbase}, {} : i64", eoff[0]));
            ks = b.load_kv("%kc", &o, per, kv)?;
            vs = b.load_kv("%vc", &o, per, kv)?;
        }
        kvrows.push((ks, vs, valid));
    }
    // per head: scores (the warp sums of every head's and key's dot products at once), the
    // running max over them, one rescale per step
    let mut dots = vec![];
    for qg in &qv {
        for (ks, _, _) in &kvrows {
            let mut dot = zero.clone();
            for (qe, k) in qg.iter().zip(ks) {
                dot = b.op(&format!("llvm.intr.fma({qe}, {k}, {dot}) : (f32, f32, f32) -> f32"));
            }
            dots.push(dot);
        }
    }
    // ([`Body::warp_sums`]: 32 shuffles instead of 80 for 4 heads x 4 keys)
    let sums = if b.o.attn_transposed_sums {
        let lane32 = b.op(&format!("arith.index_cast {lane_i} : index to i32"));
        b.warp_sums(&dots, &lane32)
    } else {
        dots.iter().map(|d| b.warp_sum(d)).collect()
    };
    let mut outs = vec![];
    for (g, _) in qv.iter().enumerate() {
        let (m, l) = (&state[g * st], &state[g * st + 1]);
        let accs = &state[g * st + 2..(g + 1) * st];
        let mut ss = vec![];
        for (u, (_, _, valid)) in kvrows.iter().enumerate() {
            let s = sums[g * kvrows.len() + u].clone();
            ss.push(match valid {
                Some(v) => b.op(&format!("arith.select {v}, {s}, {ninf} : f32")),
                None => s,
            });
        }
        let mut mn = m.clone();
        for s in &ss {
            mn = b.op(&format!("arith.maximumf {mn}, {s} : f32"));
        }
        let d1 = b.op(&format!("arith.subf {m}, {mn} : f32"));
        let corr = b.exp(&d1);
        let mut l2 = b.op(&format!("arith.mulf {l}, {corr} : f32"));
        let mut outs_acc: Vec<String> = accs.iter().map(|a| b.op(&format!("arith.mulf {a}, {corr} : f32"))).collect();
        for (s, (_, vs, _)) in ss.iter().zip(&kvrows) {
            let d2 = b.op(&format!("arith.subf {s}, {mn} : f32"));
            let pe = b.exp(&d2);
            l2 = b.op(&format!("arith.addf {l2}, {pe} : f32"));
            for (a, v) in outs_acc.iter_mut().zip(vs) {
                *a = b.op(&format!("llvm.intr.fma({pe}, {v}, {a}) : (f32, f32, f32) -> f32"));
            }
        }
        outs.push(mn);
        outs.push(l2);
        outs.extend(outs_acc);
    }
    outs.extend(next_raw);
    b.line(&format!("scf.yield {} : {tys}", outs.join(", ")));
    b.line("}");
    // partial states to shared memory: head g of warp w at (w·rep + g)·stride: m, l, then
    // acc at +2+lane+32e
    let crepi = b.op(&format!("arith.constant {rep} : index"));
    let cst = b.op(&format!("arith.constant {stride} : index"));
    let wrow = b.op(&format!("arith.muli {warp_i}, {crepi} : index"));
    for g in 0..rep {
        let cg = b.op(&format!("arith.constant {g} : index"));
        let slot = b.op(&format!("arith.addi {wrow}, {cg} : index"));
        let wb = b.op(&format!("arith.muli {slot}, {cst} : index"));
        let c1i = b.op("arith.constant 1 : index");
        let c2i = b.op("arith.constant 2 : index");
        let wb1 = b.op(&format!("arith.addi {wb}, {c1i} : index"));
        let wb2 = b.op(&format!("arith.addi {wb}, {c2i} : index"));
        let wbl = b.op(&format!("arith.addi {wb2}, {lane_i} : index"));
        b.line(&format!("memref.store {res}#{}, %sm[{wb}] : {smt}", g * st));
        b.line(&format!("memref.store {res}#{}, %sm[{wb1}] : {smt}", g * st + 1));
        for e in 0..per {
            let ce = b.op(&format!("arith.constant {} : index", 32 * e));
            let i = b.op(&format!("arith.addi {wbl}, {ce} : index"));
            b.line(&format!("memref.store {res}#{}, %sm[{i}] : {smt}", g * st + 2 + e));
        }
    }
    b.line("gpu.barrier");
    // head g merged by warp g % WARPS
    for (g, row) in rows.iter().enumerate() {
        let cw = b.op(&format!("arith.constant {} : index", g % WARPS));
        let mine = b.op(&format!("arith.cmpi eq, {warp_i}, {cw} : index"));
        b.line(&format!("scf.if {mine} {{"));
        let ms: Vec<String> = (0..WARPS)
            .map(|w| {
                let i = b.op(&format!("arith.constant {} : index", (w * rep + g) * stride));
                b.op(&format!("memref.load %sm[{i}] : {smt}"))
            })
            .collect();
        let mut mx = ms[0].clone();
        for m_w in &ms[1..] {
            mx = b.op(&format!("arith.maximumf {mx}, {m_w} : f32"));
        }
        let mut lsum = zero.clone();
        let mut wts = vec![];
        for (w, m_w) in ms.iter().enumerate() {
            let dm = b.op(&format!("arith.subf {m_w}, {mx} : f32"));
            let f = b.exp(&dm);
            let i = b.op(&format!("arith.constant {} : index", (w * rep + g) * stride + 1));
            let l_w = b.op(&format!("memref.load %sm[{i}] : {smt}"));
            lsum = b.op(&format!("llvm.intr.fma({l_w}, {f}, {lsum}) : (f32, f32, f32) -> f32"));
            wts.push(f);
        }
        let qbase = b.op(&format!("arith.muli {row}, {dd} : i64"));
        for e in 0..per {
            let mut acc = zero.clone();
            for (w, f) in wts.iter().enumerate() {
                let base = b.op(&format!("arith.constant {} : index", (w * rep + g) * stride + 2 + 32 * e));
                let i = b.op(&format!("arith.addi {base}, {lane_i} : index"));
                let a_w = b.op(&format!("memref.load %sm[{i}] : {smt}"));
                acc = b.op(&format!("llvm.intr.fma({a_w}, {f}, {acc}) : (f32, f32, f32) -> f32"));
            }
            let ce = &eoff[e];
            match &part {
                None if key_split.is_some() => {
                    // (this block's partial state into every block of the cluster: acc not
                    // divided by l; lane 0 also m and l)
                    let c = key_split.expect("matched");
                    let r = opart.clone().expect("a cluster's blocks are the o projection's parts");
                    let cst2 = b.ci64((d + 2) as i64);
                    let mine_at = b.op(&format!("arith.muli {r}, {cst2} : i64"));
                    let cpa = b.ci64(parts_at as i64);
                    let mine_at = b.op(&format!("arith.addi {mine_at}, {cpa} : i64"));
                    let c2 = b.ci64(2);
                    let at = b.op(&format!("arith.addi {mine_at}, {c2} : i64"));
                    let at = b.op(&format!("arith.addi {at}, {ce} : i64"));
                    for dst in 0..c {
                        let cd = b.ci64(dst as i64);
                        st_cluster(b, &smt, &at, &cd, &acc);
                    }
                    if e == 0 {
                        let c0 = b.op("arith.constant 0 : index");
                        let first = b.op(&format!("arith.cmpi eq, {lane_i}, {c0} : index"));
                        b.line(&format!("scf.if {first} {{"));
                        let c1m = b.ci64(1);
                        let at1 = b.op(&format!("arith.addi {mine_at}, {c1m} : i64"));
                        for dst in 0..c {
                            let cd = b.ci64(dst as i64);
                            st_cluster(b, &smt, &mine_at, &cd, &mx);
                            st_cluster(b, &smt, &at1, &cd, &lsum);
                        }
                        b.line("}");
                    }
                }
                None if attn_o.is_some() => {
                    // (the head's output to shared memory, for the o projection below)
                    let y = b.op(&format!("arith.divf {acc}, {lsum} : f32"));
                    let cb = b.ci64(o_at as i64);
                    let i = b.op(&format!("arith.addi {cb}, {ce} : i64"));
                    let i = b.op(&format!("arith.index_cast {i} : i64 to index"));
                    b.line(&format!("memref.store {y}, %sm[{i}] : {smt}"));
                }
                None => {
                    let o = b.op(&format!("arith.addi {qbase}, {ce} : i64"));
                    let y = b.op(&format!("arith.divf {acc}, {lsum} : f32"));
                    b.store(&y, "%out", &o);
                }
                Some((sy, ns)) => {
                    // partial state of (row, s) at ((row·S + s)·(D + 2)): m, l, acc[D] (not
                    // divided by l)
                    let cns = b.ci64(*ns as i64);
                    let slot = b.op(&format!("arith.muli {row}, {cns} : i64"));
                    let slot = b.op(&format!("arith.addi {slot}, {sy} : i64"));
                    let cst = b.ci64(stride as i64);
                    let pb = b.op(&format!("arith.muli {slot}, {cst} : i64"));
                    if e == 0 {
                        b.store(&mx, "%out", &pb);
                        let pb1 = b.op(&format!("arith.addi {pb}, {c1} : i64"));
                        b.store(&lsum, "%out", &pb1);
                    }
                    let c2 = b.ci64(2);
                    let o = b.op(&format!("arith.addi {pb}, {c2} : i64"));
                    let o = b.op(&format!("arith.addi {o}, {ce} : i64"));
                    b.store(&acc, "%out", &o);
                }
            }
        }
        b.line("}");
    }
    if let Some(c) = key_split {
        // every block's state in, then thread e < D: the head's output element e from the c
        // partial states (their max, each scaled by exp(m_r - max)), for the o projection
        b.cluster_barrier();
        let tid64 = b.idx64(&tid);
        let cd = b.ci64(d as i64);
        let mine = b.op(&format!("arith.cmpi slt, {tid64}, {cd} : i64"));
        b.line(&format!("scf.if {mine} {{"));
        let read = |b: &mut Body, at: usize, off: Option<&str>| -> String {
            let ca = b.ci64(at as i64);
            let j = match off {
                Some(o) => b.op(&format!("arith.addi {ca}, {o} : i64")),
                None => ca,
            };
            let j = b.op(&format!("arith.index_cast {j} : i64 to index"));
            b.op(&format!("memref.load %sm[{j}] : {smt}"))
        };
        let ms: Vec<String> = (0..c).map(|r| read(b, parts_at + r * (d + 2), None)).collect();
        let mut mx = ms[0].clone();
        for m in &ms[1..] {
            mx = b.op(&format!("arith.maximumf {mx}, {m} : f32"));
        }
        let zero = b.cf32(0.0);
        let (mut num, mut den) = (zero.clone(), zero);
        // (a block past the context's last chunk has no keys: m = -inf and its l and acc are
        // not numbers — left out)
        let ninf = b.op("arith.constant 0xFF800000 : f32");
        for (r, m) in ms.iter().enumerate() {
            let dm = b.op(&format!("arith.subf {m}, {mx} : f32"));
            let w = b.exp(&dm);
            let l = read(b, parts_at + r * (d + 2) + 1, None);
            let a = read(b, parts_at + r * (d + 2) + 2, Some(&tid64));
            let empty = b.op(&format!("arith.cmpf oeq, {m}, {ninf} : f32"));
            let den2 = b.op(&format!("llvm.intr.fma({l}, {w}, {den}) : (f32, f32, f32) -> f32"));
            let num2 = b.op(&format!("llvm.intr.fma({a}, {w}, {num}) : (f32, f32, f32) -> f32"));
            den = b.op(&format!("arith.select {empty}, {den}, {den2} : f32"));
            num = b.op(&format!("arith.select {empty}, {num}, {num2} : f32"));
        }
        let y = b.op(&format!("arith.divf {num}, {den} : f32"));
        let cb = b.ci64(o_at as i64);
        let i = b.op(&format!("arith.addi {cb}, {tid64} : i64"));
        let i = b.op(&format!("arith.index_cast {i} : i64 to index"));
        b.line(&format!("memref.store {y}, %sm[{i}] : {smt}"));
        b.line("}");
    }
    if let Some(nn) = attn_o {
        o_projection(b, nn, h, d, &t, &head0, &tid, &o_rows, o_at, &smt)?;
    }
    if part.is_some() {
        b.line("}");
    }
    b.line("}");
    if attn_o.is_some() && b.attn_o_red {
        return Ok("%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %wo: !llvm.ptr<1>, %res: !llvm.ptr<1>, %out2: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64".into());
    }
    if attn_o.is_some() {
        return Ok("%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %wo: !llvm.ptr<1>, %res: !llvm.ptr<1>, %parts: !llvm.ptr<1>, %sync: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64".into());
    }
    Ok(if rope.is_some() {
        "%xq: !llvm.ptr<1>, %xk: !llvm.ptr<1>, %xv: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %slots: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64"
    } else {
        "%q: !llvm.ptr<1>, %kc: !llvm.ptr<1>, %vc: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %seq: !llvm.ptr<1>, %table: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64, %mb: i64"
    }
    .into())
}

/// The split decode attention cuts a row's context into at most max(1, this / rows) parts
/// (rows = tokens x heads of the step): enough blocks to fill the H200 (4 blocks of 16 warps
/// on each of 132 SMs), no more. Measured at a 4k context (8B shape): 16 parts at batch 1
/// 141 -> 212 tok/s, but at batch 8 (256 rows) 787 -> 749.
pub const ATTN_SPLIT_BLOCKS: usize = 512;

/// The parts a split decode attention row takes ([`split_extent`]), on the host.
pub fn split_parts(ctx: usize, rows: usize, ns: usize, min_keys: usize) -> usize {
    ctx.div_ceil(min_keys).min(ns).min((ATTN_SPLIT_BLOCKS / rows.max(1)).max(1))
}

/// (se, chunk) of a split decode attention row whose context is `ctx` keys (i64 values), in a
/// step of `%n` rows: se = min(ceil(ctx / min_keys), S, max(1, [`ATTN_SPLIT_BLOCKS`] / n))
/// parts of chunk = ceil(ctx / se) keys (every part non-empty while min_keys > S + 1, which
/// the lowering keeps).
pub(crate) fn split_extent(b: &mut Body, ctx: &str, ns: usize, min_keys: usize) -> (String, String) {
    let cmk = b.ci64(min_keys as i64);
    let cmk1 = b.ci64(min_keys as i64 - 1);
    let se = b.op(&format!("arith.addi {ctx}, {cmk1} : i64"));
    let se = b.op(&format!("arith.divui {se}, {cmk} : i64"));
    let cns = b.ci64(ns as i64);
    let se = b.op(&format!("arith.minsi {se}, {cns} : i64"));
    let cb = b.ci64(ATTN_SPLIT_BLOCKS as i64);
    let c1 = b.ci64(1);
    let nn = b.op(&format!("arith.maxsi %n, {c1} : i64"));
    let cap = b.op(&format!("arith.divui {cb}, {nn} : i64"));
    let cap = b.op(&format!("arith.maxsi {cap}, {c1} : i64"));
    let se = b.op(&format!("arith.minsi {se}, {cap} : i64"));
    let c1 = b.ci64(1);
    let se1 = b.op(&format!("arith.subi {se}, {c1} : i64"));
    let chunk = b.op(&format!("arith.addi {ctx}, {se1} : i64"));
    let chunk = b.op(&format!("arith.divui {chunk}, {se} : i64"));
    (se, chunk)
}

/// The second pass of the split decode attention ([`KernelSpec::AttentionCombine`]): one warp
/// per (token, head) row merges the row's se partial softmax states (m, l, acc) into the
/// output, out = Σ acc_s e^(m_s − M) / Σ l_s e^(m_s − M) with M = max m_s.
pub(crate) fn emit_attention_combine(b: &mut Body, h: usize, d: usize, ns: usize, min_keys: usize) -> Result<String, String> {
    attention_combine_fits(h, d, ns, min_keys)?;
    let per = d / 32;
    let stride = (d + 2) as i64;
    let (row, lane) = b.open_guarded_warp_row();
    let hh = b.ci64(h as i64);
    let t = b.op(&format!("arith.divui {row}, {hh} : i64"));
    let p = b.load_i32_as_i64("%pos", &t);
    let c1 = b.ci64(1);
    let ctx = b.op(&format!("arith.addi {p}, {c1} : i64"));
    let (se, _) = split_extent(b, &ctx, ns, min_keys);
    let ninf = b.op("arith.constant 0xFF800000 : f32");
    let zero = b.cf32(0.0);
    let cns = b.ci64(ns as i64);
    let slot0 = b.op(&format!("arith.muli {row}, {cns} : i64"));
    // (parts past se were not written: their values are replaced before any arithmetic)
    let mut parts = vec![];
    for sidx in 0..ns {
        let cs = b.ci64(sidx as i64);
        let live = b.op(&format!("arith.cmpi slt, {cs}, {se} : i64"));
        let slot = b.op(&format!("arith.addi {slot0}, {cs} : i64"));
        let cst = b.ci64(stride);
        let pb = b.op(&format!("arith.muli {slot}, {cst} : i64"));
        let m = b.load("%part", &pb);
        let m = b.op(&format!("arith.select {live}, {m}, {ninf} : f32"));
        let pb1 = b.op(&format!("arith.addi {pb}, {c1} : i64"));
        let l = b.load("%part", &pb1);
        let l = b.op(&format!("arith.select {live}, {l}, {zero} : f32"));
        let mut accs = vec![];
        for e in 0..per {
            let co = b.ci64(2 + 32 * e as i64);
            let o = b.op(&format!("arith.addi {pb}, {co} : i64"));
            let o = b.op(&format!("arith.addi {o}, {lane} : i64"));
            let a = b.load("%part", &o);
            accs.push(b.op(&format!("arith.select {live}, {a}, {zero} : f32")));
        }
        parts.push((m, l, accs));
    }
    let mut mx = parts[0].0.clone();
    for (m, _, _) in &parts[1..] {
        mx = b.op(&format!("arith.maximumf {mx}, {m} : f32"));
    }
    let mut lsum = zero.clone();
    let mut out = vec![zero.clone(); per];
    for (m, l, accs) in &parts {
        let dm = b.op(&format!("arith.subf {m}, {mx} : f32"));
        let w = b.exp(&dm);
        lsum = b.op(&format!("llvm.intr.fma({l}, {w}, {lsum}) : (f32, f32, f32) -> f32"));
        for (o, a) in out.iter_mut().zip(accs) {
            *o = b.op(&format!("llvm.intr.fma({a}, {w}, {o}) : (f32, f32, f32) -> f32"));
        }
    }
    let dd = b.ci64(d as i64);
    let ob = b.op(&format!("arith.muli {row}, {dd} : i64"));
    for (e, o) in out.iter().enumerate() {
        let ce = b.ci64(32 * e as i64);
        let at = b.op(&format!("arith.addi {ob}, {ce} : i64"));
        let at = b.op(&format!("arith.addi {at}, {lane} : i64"));
        let y = b.op(&format!("arith.divf {o}, {lsum} : f32"));
        b.store(&y, "%out", &at);
    }
    b.line("}");
    Ok("%part: !llvm.ptr<1>, %pos: !llvm.ptr<1>, %out: !llvm.ptr<1>, %n: i64".into())
}

/// What [`emit_attention_combine`] takes: D a multiple of 32, 1..=32 splits, more keys than
/// splits + 1.
fn attention_combine_fits(h: usize, d: usize, ns: usize, min_keys: usize) -> Result<(), String> {
    if d % 32 != 0 || h == 0 || !(1..=32).contains(&ns) || min_keys <= ns + 1 {
        return Err(format!("attention combine needs D a multiple of 32, 1..=32 splits and min keys > splits + 1 (D {d}, S {ns}, min keys {min_keys})"));
    }
    Ok(())
}

/// Whether a decode attention kernel generates ([`fits`]).
pub(crate) fn paged_fits(spec: &KernelSpec, o: Outer) -> Result<(), String> {
    match spec {
        KernelSpec::PagedAttention { h, kvh, d, warps, keys, group, kv, .. } => paged_attention_fits(*h, *kvh, *d, *warps, *keys, *group, *kv, false, false, o),
        KernelSpec::PagedAttentionSplit { h, kvh, d, warps, keys, group, kv, .. } => paged_attention_fits(*h, *kvh, *d, *warps, *keys, *group, *kv, true, false, o),
        KernelSpec::AttentionCombine { h, d, splits, min_keys } => attention_combine_fits(*h, *d, *splits, *min_keys),
        other => Err(format!("`{}` is not one of the decode attention kernels", other.symbol())),
    }
}

/// The decode attention kernels' bodies: [`emit_into`] for their specs; returns the parameter list.
pub(crate) fn paged_kernel(b: &mut Body, spec: &KernelSpec) -> Result<String, String> {
    Ok(match spec {
        KernelSpec::PagedAttention { h, kvh, d, bs, scale_bits, warps, keys, group, kv } => emit_paged_attention(b, *h, *kvh, *d, *bs, *scale_bits, *warps, *keys, *group, *kv, None, None)?,
        KernelSpec::PagedAttentionSplit { h, kvh, d, bs, scale_bits, warps, keys, splits, min_keys, group, kv } => {
            emit_paged_attention(b, *h, *kvh, *d, *bs, *scale_bits, *warps, *keys, *group, *kv, Some((*splits, *min_keys)), None)?
        }
        KernelSpec::AttentionCombine { h, d, splits, min_keys } => emit_attention_combine(b, *h, *d, *splits, *min_keys)?,
        other => return Err(format!("`{}` is not one of the decode attention kernels", other.symbol())),
    })
}

#[cfg(test)]
mod tests {
    //! paged_attention's lowering: the kernels and alternatives a graph's attention gets.
    use super::*;
    use crate::schedule::*;
    use crate::ScheduleOptions;
    use dsc_ir::text;

    /// the production options without the warp-specialized matmuls and the norm fusion
    fn no_ws() -> ScheduleOptions {
        ScheduleOptions { ws: false, ws64: false, norm_fusion: false, ..Default::default() }
    }

    #[test]
    fn bf16_kv_pools_lower_to_the_16_bit_kernels_and_f16_ones_are_refused() {
        let src = |kv: &str| {
            format!("graph \"t\" {{\n  %q = input : f32[T, 32, 128]\n  %k = input : f32[T, 8, 128]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %slots = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : {kv}[NB, 16, 8, 128]\n  %vc = state : {kv}[NB, 16, 8, 128]\n  %kw = cache_write(%kc, %k, %slots) : {kv}[NB, 16, 8, 128]\n  %vw = cache_write(%vc, %k, %slots) : {kv}[NB, 16, 8, 128]\n  %o = paged_attention(%q, %kw, %vw, %pos, %seq, %table) {{scale = 0.088}} : f32[T, 32, 128]\n  output o = %o\n}}\n")
        };
        let steps = lower_opts(&text::parse(&src("bf16")).unwrap(), no_ws()).unwrap();
        let kernels: Vec<&KernelSpec> = steps.iter().flat_map(|s| s.kernel.iter().chain(s.large.iter().map(|l| &l.kernel)).chain(s.few.iter().map(|l| &l.kernel))).collect();
        let attn = kernels.iter().filter(|k| matches!(k, KernelSpec::PagedAttention { .. } | KernelSpec::PagedAttentionSplit { .. } | KernelSpec::FlashAttention { .. })).count();
        assert!(attn >= 3, "{kernels:?}");
        for k in &kernels {
            match k {
                KernelSpec::CacheWrite { kv, .. } | KernelSpec::PagedAttention { kv, .. } | KernelSpec::PagedAttentionSplit { kv, .. } | KernelSpec::FlashAttention { kv, .. } => {
                    assert_eq!(*kv, DType::BF16, "{k:?}");
                    assert!(k.symbol().ends_with("_kvbf16"), "{}", k.symbol());
                }
                _ => {}
            }
        }
        let e = lower_opts(&text::parse(&src("f16")).unwrap(), no_ws()).unwrap_err().to_string();
        assert!(e.contains("kw") && e.contains("f16 KV caches"), "{e}");
    }

    #[test]
    fn grouped_attention_takes_what_fits_a_lane_and_shared_memory() {
        // the 8B shape, SmolLM2's, Llama-3-70B's (64 heads over 8), head dim 256, MHA
        assert_eq!(attention_group_size(32, 8, 128, ATTN_GROUP_WARPS), 4);
        assert_eq!(attention_group_size(9, 3, 64, ATTN_GROUP_WARPS), 3);
        assert_eq!(attention_group_size(64, 8, 128, 16), 4);
        assert_eq!(attention_group_size(16, 4, 256, 16), 2);
        assert_eq!(attention_group_size(32, 32, 128, 16), 1);
        // 70B-like: the batched alternative in groups of 4, grid y = 16 head groups
        let src = "graph \"t\" {\n  %q = input : f32[T, 64, 128]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : f32[NB, 16, 8, 128]\n  %vc = state : f32[NB, 16, 8, 128]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {scale = 0.088} : f32[T, 64, 128]\n  output o = %o\n}\n";
        let steps = lower_opts(&text::parse(src).unwrap(), no_ws()).unwrap();
        let one = steps.iter().find(|s| s.node == "o" && s.kernel.is_some()).unwrap();
        let [g] = &one.few[..] else { panic!("{:?}", one.few) };
        assert!(matches!(g.kernel, KernelSpec::PagedAttention { group: 4, .. }), "{:?}", g.kernel);
        assert_eq!((g.grid_y.clone(), g.min_rows), (Scalar::Const(16), 8 * 64));
        let split = steps.iter().find(|s| matches!(s.kernel, Some(KernelSpec::PagedAttentionSplit { .. }))).unwrap();
        assert!(matches!(split.kernel, Some(KernelSpec::PagedAttentionSplit { group: 4, .. })), "{:?}", split.kernel);
        assert_eq!(split.grid_y, Scalar::Const(16 * ATTN_SPLITS as i64));
    }

    #[test]
    fn split_kv_makes_decode_attention_two_steps_and_leaves_prefill_to_flash() {
        let src = "graph \"t\" {\n  %q = input : f32[T, 8, 64]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : f32[NB, 16, 2, 64]\n  %vc = state : f32[NB, 16, 2, 64]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {scale = 0.125} : f32[T, 8, 64]\n  output o = %o\n}\n";
        let g = text::parse(src).unwrap();
        let plain = lower_opts(&g, ScheduleOptions { split_kv: false, ..no_ws() }).unwrap();
        assert!(plain.iter().all(|s| !matches!(s.kernel, Some(KernelSpec::PagedAttentionSplit { .. }))));
        let steps = lower_opts(&g, ScheduleOptions { split_kv: true, ..no_ws() }).unwrap();
        let part = format!("o@split{ATTN_SPLITS}");
        let i = steps.iter().position(|s| s.node == part).expect("the first pass");
        let (one, wide, first, merge) = (&steps[i - 2], &steps[i - 1], &steps[i], &steps[i + 1]);
        // the one-pass kernel stays for shorter contexts, and for more rows than the split
        // takes (with the prefill attention); the two passes take long contexts of few rows
        assert_eq!((one.node.as_str(), wide.node.as_str()), ("o", "o"));
        assert!(matches!(one.kernel, Some(KernelSpec::PagedAttention { .. })) && one.kernel == wide.kernel);
        assert_eq!((one.min_context, one.max_context, one.min_rows), (None, Some(ATTN_SPLIT_FROM_KEYS - 1), None));
        assert_eq!((wide.min_context, wide.max_context, wide.min_rows), (Some(ATTN_SPLIT_FROM_KEYS), None, Some(ATTN_SPLIT_ROWS + 1)));
        assert!(one.large.is_some() && wide.large.is_some() && first.large.is_none());
        assert_eq!((first.min_context, merge.min_context), (Some(ATTN_SPLIT_FROM_KEYS), Some(ATTN_SPLIT_FROM_KEYS)));
        assert_eq!((first.max_context, merge.max_context), (None, None));
        assert_eq!((first.max_rows, merge.max_rows), (Some(ATTN_SPLIT_ROWS), Some(ATTN_SPLIT_ROWS)));
        assert!(matches!(first.kernel, Some(KernelSpec::PagedAttentionSplit { splits: ATTN_SPLITS, min_keys: ATTN_SPLIT_MIN_KEYS, .. })), "{:?}", first.kernel);
        assert_eq!(first.args.last(), Some(&part));
        // (a block per (token, head, part): 8 heads, 2 KV heads — too few to group)
        assert_eq!(first.grid_y, Scalar::Const(8 * ATTN_SPLITS as i64));
        assert_eq!((one.work.clone(), one.grid_y.clone()), (Scalar::Dim("o".into(), 0), Scalar::Const(8)));
        // batched decode: a block per (token, KV head) from ATTN_GROUP_MIN_BLOCKS of them, up
        // to the prefill attention's rows; the split pass has none
        let [g] = &one.few[..] else { panic!("{:?}", one.few) };
        assert!(matches!(g.kernel, KernelSpec::PagedAttention { group: 4, warps: ATTN_GROUP_WARPS, .. }), "{:?}", g.kernel);
        assert_eq!((g.min_rows, g.max_rows), ((ATTN_GROUP_MIN_BLOCKS / 2 * 8) as i64, Some(one.large.as_ref().unwrap().min_rows - 1)));
        assert_eq!((g.work.clone(), g.grid_y.clone()), (Scalar::Dim("o".into(), 0), Scalar::Const(2)));
        assert!(first.few.is_empty() && wide.few == one.few);
        // prefill: FlashAttention (the one-pass steps' alternative) writes o itself
        assert!(wide.large.as_ref().unwrap().min_rows > ATTN_SPLIT_ROWS);
        assert_eq!(merge.node, "o");
        assert!(matches!(merge.kernel, Some(KernelSpec::AttentionCombine { h: 8, d: 64, .. })));
        assert_eq!(merge.args, [part.as_str(), "pos", "o"]);
    }

    #[test]
    fn the_prefill_attention_on_bf16_pools_has_a_wgmma_alternative_for_d_128() {
        let src = |d: usize| {
            format!("graph \"t\" {{\n  %q = input : f32[T, 8, {d}]\n  %pos = input : i32[T]\n  %seq = input : i32[T]\n  %table = input : i32[S, MB]\n  %kc = state : bf16[NB, 16, 2, {d}]\n  %vc = state : bf16[NB, 16, 2, {d}]\n  %o = paged_attention(%q, %kc, %vc, %pos, %seq, %table) {{scale = 0.125}} : f32[T, 8, {d}]\n  output o = %o\n}}\n")
        };
        let attn = |d: usize, opts: ScheduleOptions| {
            let steps = lower_opts(&text::parse(&src(d)).unwrap(), opts).unwrap();
            steps.into_iter().find(|s| s.node == "o" && s.large.is_some()).unwrap()
        };
        let s = attn(128, ScheduleOptions::default());
        let large = s.large.as_ref().unwrap();
        let [wg] = &s.hopper[..] else { panic!("{:?}", s.hopper) };
        assert!(matches!(&wg.kernel, KernelSpec::FlashWgmma { inner } if **inner == large.kernel), "{:?}", wg.kernel);
        assert_eq!((wg.min_rows, wg.max_rows, &wg.scalars, &wg.grid_y), (large.min_rows, large.max_rows, &large.scalars, &large.grid_y));
        // (its K/V tiles by TMA: the pools passed as their tensor maps, boxes of a 16-position
        // cache block; the other args as the step's)
        let args = wg.args.as_ref().expect("the TMA kernel's args");
        assert_eq!(args[1..3], ["kc@kvmap16", "vc@kvmap16"]);
        assert_eq!((&args[..1], &args[3..]), (&s.args[..1], &s.args[3..]));
        assert!(wg.kernel.symbol().ends_with("_wgt"), "{}", wg.kernel.symbol());
        // not for D 64 (failed the kernel check), nor when off
        assert!(attn(64, ScheduleOptions::default()).hopper.is_empty());
        assert!(attn(128, ScheduleOptions { flash_wgmma: false, ..ScheduleOptions::default() }).hopper.is_empty());
    }
}
