//! Token sampling from logits: greedy, temperature, top-k, top-p, min-p, repetition /
//! frequency / presence penalties, with a seeded RNG so a seed reproduces a run exactly;
//! log-probabilities of the chosen token and the top alternatives.
//!
//! Order (as in vLLM / HF): penalties on the raw logits, then temperature, then top-k,
//! top-p and min-p on the resulting distribution. Greedy (temperature 0) takes the argmax of
//! the penalized logits.

use crate::error::{Result, RuntimeError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy
    pub temperature: f32,
    /// 0 = off
    pub top_k: usize,
    /// 1.0 = off
    pub top_p: f32,
    /// 0 = off: drop tokens whose probability is below min_p x the top token's
    pub min_p: f32,
    /// 1.0 = off: logits of tokens already in the prompt or output are divided by it (if
    /// positive) or multiplied by it (if negative) (CTRL, Keskar et al. 2019)
    pub repetition_penalty: f32,
    /// 0 = off: subtract count x frequency_penalty for each generated occurrence (OpenAI)
    pub frequency_penalty: f32,
    /// 0 = off: subtract presence_penalty once for any generated token (OpenAI)
    pub presence_penalty: f32,
    pub seed: u64,
    /// added to the logits of these tokens before anything else (OpenAI's `logit_bias`,
    /// each in [-100, 100]; -100 bans a token, 100 all but forces it)
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0, repetition_penalty: 1.0, frequency_penalty: 0.0, presence_penalty: 0.0, seed: 0, logit_bias: vec![] }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(RuntimeError::Request(m));
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return bad(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return bad(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(format!("repetition_penalty must be > 0, got {}", self.repetition_penalty));
        }
        for (n, v) in [("frequency_penalty", self.frequency_penalty), ("presence_penalty", self.presence_penalty)] {
            if !(-2.0..=2.0).contains(&v) {
                return bad(format!("{n} must be in [-2, 2], got {v}"));
            }
        }
        if let Some((t, b)) = self.logit_bias.iter().find(|(_, b)| !(-100.0..=100.0).contains(b)) {
            return bad(format!("logit_bias of token {t} must be in [-100, 100], got {b}"));
        }
        Ok(())
    }

    fn penalized(&self) -> bool {
        self.repetition_penalty != 1.0 || self.frequency_penalty != 0.0 || self.presence_penalty != 0.0 || !self.logit_bias.is_empty()
    }
}

pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
}

/// Index of the largest logit (lowest index on ties).
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best
}

/// Log-probability of `token` and of the `top` most likely tokens (most likely first), under
/// the model's distribution (softmax of the raw logits, as OpenAI reports them).
pub fn logprobs(logits: &[f32], token: u32, top: usize) -> (f32, Vec<(u32, f32)>) {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let lse = m + logits.iter().map(|&x| ((x - m) as f64).exp()).sum::<f64>().ln() as f32;
    let lp = |i: usize| logits[i] - lse;
    let mut best: Vec<usize> = vec![];
    if top > 0 {
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        let k = top.min(idx.len());
        idx.select_nth_unstable_by(k - 1, |&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        idx.truncate(k);
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        best = idx;
    }
    (lp(token as usize), best.into_iter().map(|i| (i as u32, lp(i))).collect())
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = StdRng::seed_from_u64(params.seed);
        Ok(Sampler { params, rng })
    }

    /// Sample with no history (penalties have nothing to act on).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.sample_with(logits, &[], &[])
    }

    /// Sample the next token; `prompt` and `output` are the sequence so far (for penalties).
    pub fn sample_with(&mut self, logits: &[f32], prompt: &[u32], output: &[u32]) -> u32 {
        let p = self.params.clone();
        let adjusted;
        let logits = if p.penalized() {
            let mut l = logits.to_vec();
            for &(t, b) in &p.logit_bias {
                if let Some(x) = l.get_mut(t as usize) {
                    *x += b;
                }
            }
            let mut counts: HashMap<u32, usize> = HashMap::new();
            for &t in output {
                *counts.entry(t).or_default() += 1;
            }
            if p.repetition_penalty != 1.0 {
                let mut seen: Vec<u32> = prompt.iter().chain(output).copied().collect();
                seen.sort_unstable();
                seen.dedup();
                for t in seen {
                    if let Some(x) = l.get_mut(t as usize) {
                        *x = if *x > 0.0 { *x / p.repetition_penalty } else { *x * p.repetition_penalty };
                    }
                }
            }
            for (&t, &c) in &counts {
                if let Some(x) = l.get_mut(t as usize) {
                    *x -= c as f32 * p.frequency_penalty + p.presence_penalty;
                }
            }
            adjusted = l;
            &adjusted[..]
        } else {
            logits
        };
        if p.temperature == 0.0 || p.top_k == 1 {
            return argmax(logits) as u32;
        }
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if p.top_k > 0 {
            idx.truncate(p.top_k);
        }
        let m = logits[idx[0]];
        let mut probs: Vec<f32> = idx.iter().map(|&i| ((logits[i] - m) / p.temperature).exp()).collect();
        let sum: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, &x) in probs.iter().enumerate() {
                acc += x;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
        }
        if p.min_p > 0.0 {
            // probs are sorted: keep the prefix at or above min_p x the top probability
            let floor = probs[0] * p.min_p;
            let keep = probs.iter().take_while(|&&x| x >= floor).count().max(1);
            probs.truncate(keep);
        }
        let s: f32 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= s);
        let r: f32 = self.rng.random();
        let mut acc = 0.0;
        for (i, &x) in probs.iter().enumerate() {
            acc += x;
            if r < acc {
                return idx[i] as u32;
            }
        }
        idx[probs.len() - 1] as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_the_max_and_top_k_1_is_greedy() {
        let logits = [0.1, 3.0, -1.0, 2.9];
        assert_eq!(Sampler::new(SamplingParams::default()).unwrap().sample(&logits), 1);
        let p = SamplingParams { temperature: 5.0, top_k: 1, ..Default::default() };
        assert_eq!(Sampler::new(p).unwrap().sample(&logits), 1);
    }

    #[test]
    fn seed_reproduces_and_top_p_restricts() {
        let logits: Vec<f32> = (0..50).map(|i| (i as f32 * 0.37).sin() * 2.0).collect();
        let p = SamplingParams { temperature: 1.0, top_p: 0.9, seed: 7, ..Default::default() };
        let a: Vec<u32> = {
            let mut s = Sampler::new(p.clone()).unwrap();
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(p).unwrap();
            (0..100).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        let distinct: std::collections::BTreeSet<_> = a.iter().collect();
        assert!(distinct.len() > 3, "sampling should vary: {distinct:?}");
        // a tiny top_p keeps only the argmax
        let p = SamplingParams { temperature: 1.0, top_p: 1e-6, seed: 1, ..Default::default() };
        let mut s = Sampler::new(p).unwrap();
        assert!((0..20).all(|_| s.sample(&logits) == argmax(&logits) as u32));
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(Sampler::new(SamplingParams { logit_bias: vec![(3, 101.0)], ..Default::default() }).is_err());
        assert!(Sampler::new(SamplingParams { temperature: -1.0, ..Default::default() }).is_err());
        assert!(Sampler::new(SamplingParams { top_p: 0.0, ..Default::default() }).is_err());
        assert!(Sampler::new(SamplingParams { temperature: f32::NAN, ..Default::default() }).is_err());
    }

    #[test]
    fn penalties_min_p_and_logprobs() {
        let logits = vec![2.0f32, 1.9, -1.0, 0.5];
        // repetition penalty pushes the repeated top token below the runner-up
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 1.2, ..Default::default() }).unwrap();
        assert_eq!(s.sample_with(&logits, &[0], &[]), 1);
        // frequency: two occurrences of token 1 cost 2 x 0.5; presence another 0.5 each
        let mut s = Sampler::new(SamplingParams { frequency_penalty: 0.5, ..Default::default() }).unwrap();
        assert_eq!(s.sample_with(&logits, &[], &[0, 0]), 1);
        let mut s = Sampler::new(SamplingParams { presence_penalty: 0.2, ..Default::default() }).unwrap();
        assert_eq!(s.sample_with(&logits, &[], &[0]), 1);
        // logit_bias: -100 bans the top token, +3 lifts the smallest past it; out-of-range ids
        // are no-ops
        let mut s = Sampler::new(SamplingParams { logit_bias: vec![(0, -100.0), (99, 5.0)], ..Default::default() }).unwrap();
        assert_eq!(s.sample(&logits), 1);
        let mut s = Sampler::new(SamplingParams { logit_bias: vec![(2, 3.5)], ..Default::default() }).unwrap();
        assert_eq!(s.sample(&logits), 2);
        // min_p = 0.9 keeps only tokens within 10% of the top probability: 0 and 1 (e^-0.1 = 0.905)
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, min_p: 0.9, seed: 3, ..Default::default() }).unwrap();
        let picks: std::collections::BTreeSet<u32> = (0..200).map(|_| s.sample(&logits)).collect();
        assert_eq!(picks, [0u32, 1].into_iter().collect());
        let (lp, top) = logprobs(&logits, 3, 2);
        let z: f32 = logits.iter().map(|x| x.exp()).sum();
        assert!((lp - (0.5f32.exp() / z).ln()).abs() < 1e-5);
        assert_eq!(top.iter().map(|t| t.0).collect::<Vec<_>>(), vec![0, 1]);
        for bad in
            [SamplingParams { min_p: 1.5, ..Default::default() }, SamplingParams { repetition_penalty: 0.0, ..Default::default() }, SamplingParams { frequency_penalty: 3.0, ..Default::default() }]
        {
            assert!(Sampler::new(bad).is_err());
        }
    }
}
