//! Perplexity of a plan on a text (`dsc ppl PLAN TEXT`, `dsc-runtime ppl`): how well the model
//! as compiled — its weight formats, its kernels — predicts real text, the number that says
//! what a quantization cost (docs/quantization.md).
//!
//! The text is tokenized as-is and cut into consecutive windows of `ctx` tokens (default: the
//! plan's max_seq_len), each evaluated on its own from an empty KV cache, as llama.cpp's
//! `perplexity` does: with a BOS token (where the model asks for one) the window is BOS and the
//! next ctx − 1 text tokens, every text token scored; without, the first token of a window is
//! context only. Each window is fed in chunks of [`CHUNK`] tokens (logits of every position;
//! one chunk's logits in memory at a time); a token's negative log-likelihood is
//! logsumexp(logits) − logit(token) in f64. ppl = exp(mean NLL over the scored tokens).

use crate::engine::{Backend, Session};
use crate::plan::Plan;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context};
use std::path::PathBuf;

/// Tokens fed per step within a window.
pub const CHUNK: usize = 256;

#[derive(clap::Args, Debug)]
pub struct PplArgs {
    /// the compiled plan
    pub plan: PathBuf,
    /// a UTF-8 text file (e.g. data/coriolanus-act1.txt)
    pub text: PathBuf,
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: crate::cli::BackendKind,
    /// tokens per window (default: the plan's max_seq_len)
    #[arg(long)]
    pub ctx: Option<usize>,
    /// score at most this many tokens of the text (its beginning)
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// also write the result as JSON here
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// What [`perplexity`] measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PplReport {
    pub text_tokens: usize,
    pub scored_tokens: usize,
    pub windows: usize,
    pub ctx: usize,
    pub mean_nll: f64,
    pub ppl: f64,
}

/// −log softmax(logits)[token], in f64.
pub fn nll(logits: &[f32], token: u32) -> f64 {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b)) as f64;
    let lse = m + logits.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln();
    lse - logits[token as usize] as f64
}

/// The perplexity of `ids` (the text's tokens) in windows of `ctx` tokens, each after `bos`
/// where given (see the module header).
pub fn perplexity<B: Backend + ?Sized>(backend: &mut B, ids: &[u32], ctx: usize, bos: Option<u32>) -> anyhow::Result<PplReport> {
    let text_per_window = ctx - usize::from(bos.is_some());
    if ctx < 2 || text_per_window == 0 {
        bail!("--ctx {ctx}: a window needs at least 2 tokens");
    }
    let (mut sum, mut scored, mut windows) = (0f64, 0usize, 0usize);
    for part in ids.chunks(text_per_window) {
        let window: Vec<u32> = bos.into_iter().chain(part.iter().copied()).collect();
        if window.len() < 2 {
            continue;
        }
        let mut s = Session::new(backend);
        let mut at = 0;
        while at < window.len() - 1 {
            // (positions at..end predict tokens at+1..=end)
            let end = (at + CHUNK).min(window.len() - 1);
            let logits = s.feed(&window[at..end], true).with_context(|| format!("window {windows}, tokens {at}..{end}"))?;
            for (i, row) in logits.iter().enumerate() {
                let next = window[at + i + 1];
                anyhow::ensure!((next as usize) < row.len(), "token id {next} is outside the plan's vocabulary of {}", row.len());
                let v = nll(row, next);
                anyhow::ensure!(v.is_finite(), "window {windows}, position {}: the logits are not finite", at + i);
                sum += v;
                scored += 1;
            }
            at = end;
        }
        windows += 1;
    }
    if scored == 0 {
        bail!("nothing to score: the text has {} tokens", ids.len());
    }
    let mean_nll = sum / scored as f64;
    Ok(PplReport { text_tokens: ids.len(), scored_tokens: scored, windows, ctx, mean_nll, ppl: mean_nll.exp() })
}

/// `dsc ppl`: tokenize the text with the plan's tokenizer and print its perplexity.
pub fn run(a: &PplArgs, ro: &crate::options::RuntimeOptions) -> anyhow::Result<PplReport> {
    let plan = Plan::open(&a.plan)?;
    let graph = plan.graph()?;
    let tok = plan.header.tokenizer.as_ref().map(Tokenizer::new).transpose()?.context("this plan has no tokenizer")?;
    let text = std::fs::read_to_string(&a.text).with_context(|| format!("reading {}", a.text.display()))?;
    let mut ids = tok.encode(&text).with_context(|| format!("tokenizing {}", a.text.display()))?;
    // (BOS opens each window where the model asks for it, as its encoder puts it first: the
    // window's, not the text's)
    let bos = tok.info.bos_id.filter(|_| tok.info.add_bos);
    if bos.is_some() && ids.first().copied() == bos {
        ids.remove(0);
    }
    if let Some(n) = a.max_tokens {
        ids.truncate(n);
    }
    let max_seq = plan.header.model.max_seq_len;
    let ctx = a.ctx.unwrap_or(max_seq);
    if ctx > max_seq {
        bail!("--ctx {ctx} exceeds the plan's max_seq_len ({max_seq})");
    }
    if plan.header.tensor_parallel > 1 {
        bail!("dsc ppl runs single-rank plans (this one has tensor_parallel = {})", plan.header.tensor_parallel);
    }
    let t0 = std::time::Instant::now();
    let r = match a.backend {
        b @ (crate::cli::BackendKind::Cpu | crate::cli::BackendKind::Reference) => {
            perplexity(&mut crate::engine::CpuBackend::of_kind(&graph, &plan, ctx, b == crate::cli::BackendKind::Reference)?, &ids, ctx, bos)?
        }
        crate::cli::BackendKind::Gpu => perplexity(&mut crate::gpu::GpuBackend::new(&graph, &plan, ctx, ro)?, &ids, ctx, bos)?,
    };
    println!(
        "{}: perplexity {:.4} (mean NLL {:.5}) over {} tokens of {} in {} window(s) of {} tokens, {:?} backend, {:.1} s",
        plan.header.model.name,
        r.ppl,
        r.mean_nll,
        r.scored_tokens,
        a.text.display(),
        r.windows,
        r.ctx,
        a.backend,
        t0.elapsed().as_secs_f64()
    );
    if let Some(j) = &a.json {
        let v = serde_json::json!({"plan": a.plan, "text": a.text, "backend": format!("{:?}", a.backend), "report": r, "seconds": t0.elapsed().as_secs_f64()});
        std::fs::write(j, serde_json::to_string_pretty(&v)?).with_context(|| format!("writing {}", j.display()))?;
    }
    Ok(r)
}
