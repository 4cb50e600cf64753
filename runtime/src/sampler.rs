//! Token sampling from logits: greedy, temperature, top-k, top-p, with a seeded RNG so a
//! seed reproduces a run exactly.

use crate::error::{Result, RuntimeError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy
    pub temperature: f32,
    /// 0 = off
    pub top_k: usize,
    /// 1.0 = off
    pub top_p: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, seed: 0 }
    }
}

impl SamplingParams {
    pub fn validate(&self) -> Result<()> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(RuntimeError::Request(format!("temperature must be >= 0, got {}", self.temperature)));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(RuntimeError::Request(format!("top_p must be in (0, 1], got {}", self.top_p)));
        }
        Ok(())
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

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Self> {
        params.validate()?;
        let rng = StdRng::seed_from_u64(params.seed);
        Ok(Sampler { params, rng })
    }

    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let p = &self.params;
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
            let s: f32 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= s);
        }
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
        let p = SamplingParams { temperature: 1.0, top_k: 0, top_p: 0.9, seed: 7 };
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
        let p = SamplingParams { temperature: 1.0, top_k: 0, top_p: 1e-6, seed: 1 };
        let mut s = Sampler::new(p).unwrap();
        assert!((0..20).all(|_| s.sample(&logits) == argmax(&logits) as u32));
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(Sampler::new(SamplingParams { temperature: -1.0, ..Default::default() }).is_err());
        assert!(Sampler::new(SamplingParams { top_p: 0.0, ..Default::default() }).is_err());
        assert!(Sampler::new(SamplingParams { temperature: f32::NAN, ..Default::default() }).is_err());
    }
}
