//! The executor's paged attention: `o = softmax(scale · q·Kᵀ) V` per (token, head) over the
//! token's context rows, causal through the block table.
//!
//! Laid out for the vector units (this code runs the CPU backend's attention, not only the
//! oracle's): a sequence with several tokens in the step (prefill) has its keys transposed once
//! per KV head (`d` rows of the sequence's context), so that every query's scores are 64 rows
//! at a time of broadcast multiply-adds with no horizontal sums; a sequence with a token or
//! few (decode) dots the key rows in place, four rows at a time. The weighted sum of value
//! rows keeps 64 outputs in registers. The loops are compiled twice more, for AVX2 + FMA and
//! for AVX-512 (`target_feature`), and the widest the CPU has runs (the crate itself is built
//! for baseline x86-64). Every score and output sums in a fixed order, so the result does not
//! depend on the threads.

use super::{context_rows, Tensor};
use rayon::prelude::*;

/// a·b + c: two roundings on the baseline build, one (fused) in the FMA builds.
trait Madd {
    fn madd(a: f32, b: f32, c: f32) -> f32;
}
struct Plain;
impl Madd for Plain {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}
struct Fused;
impl Madd for Fused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

/// Rows (scores) or outputs a register block holds.
const RB: usize = 64;

/// `s[r] = scale · Σ_j q[j] · kt[j·ld + r]` for r in 0..n (kt: the keys transposed, `q.len()`
/// rows of `ld`).
#[inline(always)]
fn scores_transposed<M: Madd>(q: &[f32], kt: &[f32], ld: usize, n: usize, scale: f32, s: &mut [f32]) {
    let mut r0 = 0;
    while r0 < n {
        let w = (n - r0).min(RB);
        let mut acc = [0f32; RB];
        if w == RB {
            for (j, &qj) in q.iter().enumerate() {
                let k: &[f32; RB] = kt[j * ld + r0..j * ld + r0 + RB].try_into().unwrap();
                for i in 0..RB {
                    acc[i] = M::madd(qj, k[i], acc[i]);
                }
            }
        } else {
            for (j, &qj) in q.iter().enumerate() {
                let k = &kt[j * ld + r0..j * ld + r0 + w];
                for i in 0..w {
                    acc[i] = M::madd(qj, k[i], acc[i]);
                }
            }
        }
        for i in 0..w {
            s[r0 + i] = acc[i] * scale;
        }
        r0 += w;
    }
}

/// Σ a·b in 16 lanes (then pairwise).
#[inline(always)]
fn dot16<M: Madd>(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let mut tail = 0f32;
    for (p, q) in ca.remainder().iter().zip(cb.remainder()) {
        tail = M::madd(*p, *q, tail);
    }
    for (x, y) in ca.zip(cb) {
        for i in 0..16 {
            acc[i] = M::madd(x[i], y[i], acc[i]);
        }
    }
    let mut w = 8;
    while w > 0 {
        for i in 0..w {
            acc[i] += acc[i + w];
        }
        w /= 2;
    }
    acc[0] + tail
}

/// `s[r] = scale · q · K[offs[r]..]` (the key rows in place, `q.len()` values each).
#[inline(always)]
fn scores_rows<M: Madd>(q: &[f32], kc: &[f32], offs: &[usize], scale: f32, s: &mut [f32]) {
    let d = q.len();
    for (sr, &o) in s.iter_mut().zip(offs) {
        *sr = dot16::<M>(q, &kc[o..o + d]) * scale;
    }
}

/// Softmax of `s` in place (the max subtracted; each weight divided by the sum).
#[inline(always)]
fn softmax(s: &mut [f32]) {
    let m = s.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f32;
    for x in s.iter_mut() {
        *x = (*x - m).exp();
        sum += *x;
    }
    for x in s.iter_mut() {
        *x /= sum;
    }
}

/// `o[j] = Σ_r w[r] · V[offs[r] + j]` for j in 0..o.len().
#[inline(always)]
fn weighted_rows<M: Madd>(w: &[f32], vc: &[f32], offs: &[usize], o: &mut [f32]) {
    let d = o.len();
    let mut j0 = 0;
    while j0 < d {
        let n = (d - j0).min(RB);
        let mut acc = [0f32; RB];
        for (&wr, &off) in w.iter().zip(offs) {
            if n == RB {
                let v: &[f32; RB] = vc[off + j0..off + j0 + RB].try_into().unwrap();
                for i in 0..RB {
                    acc[i] = M::madd(wr, v[i], acc[i]);
                }
            } else {
                let v = &vc[off + j0..off + j0 + n];
                for i in 0..n {
                    acc[i] = M::madd(wr, v[i], acc[i]);
                }
            }
        }
        o[j0..j0 + n].copy_from_slice(&acc[..n]);
        j0 += n;
    }
}

/// One token's heads: `o` holds its h·d outputs.
struct Token<'a> {
    q: &'a [f32],
    /// context rows it attends to (a prefix of its sequence's)
    n: usize,
    seq: &'a Seq,
}

/// A sequence of the step: its context rows' element offsets per KV head and, where several of
/// its tokens share them, its keys transposed per KV head (`d` rows of `rows`).
struct Seq {
    offs: Vec<Vec<usize>>,
    kt: Option<Vec<Vec<f32>>>,
    rows: usize,
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend<M: Madd>(tok: &Token, kc: &[f32], vc: &[f32], hi: usize, rep: usize, d: usize, scale: f32, s: &mut Vec<f32>, o: &mut [f32]) {
    let kh = hi / rep;
    let q = &tok.q[hi * d..(hi + 1) * d];
    s.clear();
    s.resize(tok.n, 0.0);
    let offs = &tok.seq.offs[kh][..tok.n];
    match &tok.seq.kt {
        Some(kt) => scores_transposed::<M>(q, &kt[kh], tok.seq.rows, tok.n, scale, s),
        None => scores_rows::<M>(q, kc, offs, scale, s),
    }
    softmax(s);
    weighted_rows::<M>(s, vc, offs, o);
}

/// The per-(token, head) work in the widest build the CPU runs (`plain`: the baseline one).
#[allow(clippy::too_many_arguments)]
fn attend_dispatch(tok: &Token, kc: &[f32], vc: &[f32], hi: usize, rep: usize, d: usize, scale: f32, s: &mut Vec<f32>, o: &mut [f32], plain: bool) {
    #[cfg(target_arch = "x86_64")]
    if !plain {
        #[target_feature(enable = "avx512f,avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn avx512(tok: &Token, kc: &[f32], vc: &[f32], hi: usize, rep: usize, d: usize, scale: f32, s: &mut Vec<f32>, o: &mut [f32]) {
            attend::<Fused>(tok, kc, vc, hi, rep, d, scale, s, o)
        }
        #[target_feature(enable = "avx2,fma")]
        #[allow(clippy::too_many_arguments)]
        unsafe fn avx2(tok: &Token, kc: &[f32], vc: &[f32], hi: usize, rep: usize, d: usize, scale: f32, s: &mut Vec<f32>, o: &mut [f32]) {
            attend::<Fused>(tok, kc, vc, hi, rep, d, scale, s, o)
        }
        if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has the features the function is built for (checked above).
            return unsafe { avx512(tok, kc, vc, hi, rep, d, scale, s, o) };
        }
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            // SAFETY: as above.
            return unsafe { avx2(tok, kc, vc, hi, rep, d, scale, s, o) };
        }
    }
    attend::<Plain>(tok, kc, vc, hi, rep, d, scale, s, o)
}

/// Tokens of a sequence in one step from which its keys are transposed (fewer dot the rows in
/// place: the transpose would cost as much as their scores).
const TRANSPOSE_FROM: usize = 4;

pub(super) fn paged_attention(q: &Tensor, kc: &Tensor, vc: &Tensor, pos: &Tensor, seq: &Tensor, table: &Tensor, scale: f32) -> Result<Tensor, String> {
    paged_attention_in(q, kc, vc, pos, seq, table, scale, false)
}

#[allow(clippy::too_many_arguments)]
fn paged_attention_in(q: &Tensor, kc: &Tensor, vc: &Tensor, pos: &Tensor, seq: &Tensor, table: &Tensor, scale: f32, plain: bool) -> Result<Tensor, String> {
    let (t, h, d) = (q.shape[0], q.shape[1], q.shape[2]);
    let (nb, bs, kvh) = (kc.shape[0], kc.shape[1], kc.shape[2]);
    let (s, mb) = (table.shape[0], table.shape[1]);
    let rep = (h / kvh.max(1)).max(1);
    // the step's sequences: each one's rows are those of its furthest token (every other
    // token of it attends to a prefix of them)
    let mut last: Vec<(usize, usize)> = vec![]; // (sequence, its token with the highest position)
    let mut count = vec![0usize; s];
    let mut index = Vec::with_capacity(t); // each token's entry of `last`
    for ti in 0..t {
        let sq = seq.data[ti];
        if sq < 0.0 || sq as usize >= s {
            return Err(format!("token {ti}: sequence {sq} out of range (S = {s})"));
        }
        let sq = sq as usize;
        count[sq] += 1;
        match last.iter().position(|(x, _)| *x == sq) {
            Some(e) => {
                if pos.data[ti] > pos.data[last[e].1] {
                    last[e].1 = ti
                }
                index.push(e);
            }
            None => {
                index.push(last.len());
                last.push((sq, ti));
            }
        }
    }
    let seqs: Vec<Seq> = last
        .par_iter()
        .map(|&(sq, ti)| -> Result<Seq, String> {
            let rows = context_rows(ti, pos, seq, table, nb, bs, s, mb)?;
            let offs: Vec<Vec<usize>> = (0..kvh).map(|kh| rows.iter().map(|&r| (r * kvh + kh) * d).collect()).collect();
            let kt = (count[sq] >= TRANSPOSE_FROM).then(|| {
                offs.iter()
                    .map(|o| {
                        let mut kt = vec![0f32; d * rows.len()];
                        for (r, &off) in o.iter().enumerate() {
                            for (j, &k) in kc.data[off..off + d].iter().enumerate() {
                                kt[j * rows.len() + r] = k;
                            }
                        }
                        kt
                    })
                    .collect()
            });
            Ok(Seq { offs, kt, rows: rows.len() })
        })
        .collect::<Result<_, _>>()?;
    let tokens: Vec<Token> = (0..t)
        .map(|ti| {
            let sq = &seqs[index[ti]];
            let n = pos.data[ti] as usize + 1;
            if pos.data[ti] < 0.0 || n > sq.rows {
                return Err(format!("token {ti}: position {} out of range", pos.data[ti]));
            }
            Ok(Token { q: &q.data[ti * h * d..(ti + 1) * h * d], n, seq: sq })
        })
        .collect::<Result<_, _>>()?;
    let mut out = vec![0f32; t * h * d];
    // (in parallel — on the CPU kernels' pool inside their step, else rayon's global one —
    // over tokens, or over heads for a few tokens (decode))
    if t >= 4 {
        out.par_chunks_mut((h * d).max(1)).zip(&tokens).for_each_init(Vec::new, |sc, (out_t, tok)| {
            for (hi, o) in out_t.chunks_mut(d.max(1)).enumerate() {
                attend_dispatch(tok, &kc.data, &vc.data, hi, rep, d, scale, sc, o, plain);
            }
        });
    } else {
        out.par_chunks_mut(d.max(1)).enumerate().for_each_init(Vec::new, |sc, (th, o)| attend_dispatch(&tokens[th / h], &kc.data, &vc.data, th % h, rep, d, scale, sc, o, plain));
    }
    Ok(Tensor::new(q.shape.clone(), out))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// softmax(scale · q·Kᵀ) V in f64, one (token, head) at a time, rows through the table.
    #[allow(clippy::too_many_arguments)]
    fn naive(q: &Tensor, kc: &Tensor, vc: &Tensor, pos: &[i32], seq: &[i32], table: &[i32], mb: usize, scale: f32) -> Vec<f32> {
        let (t, h, d) = (q.shape[0], q.shape[1], q.shape[2]);
        let (bs, kvh) = (kc.shape[1], kc.shape[2]);
        let mut out = vec![];
        for ti in 0..t {
            for hi in 0..h {
                let kh = hi / (h / kvh);
                let rows: Vec<usize> = (0..=pos[ti] as usize).map(|j| table[seq[ti] as usize * mb + j / bs] as usize * bs + j % bs).collect();
                let qv = &q.data[(ti * h + hi) * d..][..d];
                let sc: Vec<f64> = rows.iter().map(|&r| qv.iter().zip(&kc.data[(r * kvh + kh) * d..][..d]).map(|(a, b)| *a as f64 * *b as f64).sum::<f64>() * scale as f64).collect();
                let m = sc.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for j in 0..d {
                    out.push((rows.iter().zip(&e).map(|(&r, w)| w / z * vc.data[(r * kvh + kh) * d + j] as f64).sum::<f64>()) as f32);
                }
            }
        }
        out
    }

    /// Two sequences in one step through scattered blocks: one of 6 tokens at positions
    /// 70..76 (its keys transposed; a full 64-row block of scores and a tail), one of a token
    /// (its rows dotted in place); GQA 3 heads a KV head; d = 80 (a 64-output block and a tail).
    /// The vector builds and the baseline one against the f64 computation.
    #[test]
    fn both_paths_and_every_build_match_an_f64_attention() {
        let (h, kvh, d, bs, nb, mb) = (6usize, 2usize, 80usize, 16usize, 12usize, 5usize);
        let mut seed = 3u32;
        let mut rnd = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
                    (seed >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0
                })
                .collect()
        };
        let pos: Vec<i32> = vec![70, 71, 72, 73, 74, 75, 3];
        let seq: Vec<i32> = vec![0, 0, 0, 0, 0, 0, 1];
        let t = pos.len();
        let table: Vec<i32> = vec![7, 2, 9, 0, 4, 11, 5, 1, 3, 6];
        let q = Tensor::new(vec![t, h, d], rnd(t * h * d));
        let kc = Tensor::new(vec![nb, bs, kvh, d], rnd(nb * bs * kvh * d));
        let vc = Tensor::new(vec![nb, bs, kvh, d], rnd(nb * bs * kvh * d));
        let f = |v: &[i32], shape: Vec<usize>| Tensor::new(shape, v.iter().map(|&x| x as f32).collect());
        let (pt, st, tt) = (f(&pos, vec![t]), f(&seq, vec![t]), f(&table, vec![2, mb]));
        let want = naive(&q, &kc, &vc, &pos, &seq, &table, mb, 0.3);
        for plain in [false, true] {
            let got = paged_attention_in(&q, &kc, &vc, &pt, &st, &tt, 0.3, plain).unwrap();
            let e = got.data.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
            assert!(e < 1e-5, "plain={plain}: max |error| {e}");
        }
        // a token past its sequence's blocks is an error, not a panic
        let bad = f(&[90], vec![1]);
        let e = paged_attention(&Tensor::new(vec![1, h, d], rnd(h * d)), &kc, &vc, &bad, &f(&[0], vec![1]), &tt, 0.3).unwrap_err();
        assert!(e.contains("position 90"), "{e}");
    }
}
