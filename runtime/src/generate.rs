//! Text generation for one sequence: prefill the prompt in one step, then decode token by
//! token until EOS or the token limit.

use crate::engine::{Backend, Session};
use crate::error::Result;
use crate::sampler::{Sampler, SamplingParams};

#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// stop after any of these ids (the EOS id is emitted, then generation stops)
    pub stop_ids: Vec<u32>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    pub ids: Vec<u32>,
    /// top-1 minus top-2 logit before each generated token
    pub margins: Vec<f32>,
    /// logits after the prompt
    pub first_logits: Vec<f32>,
}

pub fn top2_margin(logits: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &v in logits {
        if v > a {
            b = a;
            a = v;
        } else if v > b {
            b = v;
        }
    }
    a - b
}

pub fn generate<B: Backend + ?Sized>(backend: &mut B, prompt: &[u32], opts: &GenerateOptions, mut on_token: impl FnMut(u32)) -> Result<Generation> {
    let mut sampler = Sampler::new(opts.sampling.clone())?;
    let mut s = Session::new(backend);
    let mut logits = s.feed(prompt, false)?.pop().expect("one logits row");
    let first_logits = logits.clone();
    let mut ids = vec![];
    let mut margins = vec![];
    while ids.len() < opts.max_tokens {
        margins.push(top2_margin(&logits));
        let t = sampler.sample(&logits);
        ids.push(t);
        on_token(t);
        if opts.stop_ids.contains(&t) || ids.len() == opts.max_tokens {
            break;
        }
        logits = s.feed(&[t], false)?.pop().expect("one logits row");
    }
    Ok(Generation { ids, margins, first_logits })
}
