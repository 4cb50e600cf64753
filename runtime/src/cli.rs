//! `run` and `inspect`: the commands both binaries offer.

use crate::engine::CpuBackend;
use crate::generate::{generate, GenerateOptions};
use crate::plan::Plan;
use crate::sampler::SamplingParams;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum BackendKind {
    /// the CPU reference executor (f32)
    Cpu,
    /// the plan's generated kernels on CUDA device 0
    Gpu,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// the compiled plan
    pub plan: PathBuf,
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: BackendKind,
    /// prompt text (tokenized as-is, special tokens recognized)
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// prompt as comma-separated token ids (for plans without a tokenizer)
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// wrap the prompt in the model's chat template as a user message
    #[arg(long)]
    pub chat: bool,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// 0 = greedy
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// 0 = off
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// print the generated token ids after the text
    #[arg(long)]
    pub print_ids: bool,
}

pub fn run(a: &RunArgs) -> anyhow::Result<()> {
    let plan = Plan::open(&a.plan)?;
    let graph = plan.graph()?;
    let tok = plan.header.tokenizer.as_ref().map(Tokenizer::new).transpose()?;
    let prompt_ids: Vec<u32> = match (&a.prompt, &a.prompt_ids) {
        (Some(p), _) => {
            let tok = tok.as_ref().context("this plan has no tokenizer: pass --prompt-ids")?;
            let text = if a.chat { tok.apply_chat_template(&[("user".into(), p.clone())])? } else { p.clone() };
            tok.encode(&text)?
        }
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty");
    }
    let max_seq = plan.header.model.max_seq_len;
    if prompt_ids.len() + a.max_tokens > max_seq {
        bail!("prompt ({} tokens) + max_tokens ({}) exceeds the plan's max_seq_len ({max_seq})", prompt_ids.len(), a.max_tokens);
    }
    let opts = GenerateOptions {
        max_tokens: a.max_tokens,
        sampling: SamplingParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed },
        stop_ids: tok.as_ref().map(|t| t.info.eos_ids.clone()).unwrap_or_default(),
    };
    let kv = prompt_ids.len() + a.max_tokens;
    if plan.header.tensor_parallel > 1 {
        // one thread per rank; this thread drives generation through rank 0
        let go = |r: &mut crate::tp::Ranks| generate_and_print(r, a, tok.as_ref(), &prompt_ids, &opts).map_err(|e| crate::RuntimeError::Request(format!("{e:#}")));
        return Ok(match a.backend {
            BackendKind::Cpu => crate::tp::cpu(&graph, &plan, kv, go)?,
            // DSC_TP_LOCAL=1: every rank on GPU 0 (a check of the partition on one GPU)
            BackendKind::Gpu => crate::tp::gpu(&graph, &plan, kv, if std::env::var_os("DSC_TP_LOCAL").is_some() { crate::tp::GpuMode::Local } else { crate::tp::GpuMode::Nccl }, go)?,
        });
    }
    match a.backend {
        BackendKind::Cpu => generate_and_print(&mut CpuBackend::new(&graph, &plan, kv)?, a, tok.as_ref(), &prompt_ids, &opts),
        BackendKind::Gpu => generate_and_print(&mut crate::gpu::GpuBackend::new(&graph, &plan, kv)?, a, tok.as_ref(), &prompt_ids, &opts),
    }
}

fn generate_and_print<B: crate::engine::Backend + ?Sized>(backend: &mut B, a: &RunArgs, tok: Option<&Tokenizer>, prompt_ids: &[u32], opts: &GenerateOptions) -> anyhow::Result<()> {
    let start = std::time::Instant::now();
    let mut out = std::io::stdout().lock();
    let mut printed = String::new();
    let mut ids = vec![];
    let gen = generate(backend, prompt_ids, opts, |t| {
        ids.push(t);
        if let Some(tok) = tok {
            if let Ok(text) = tok.decode(&ids, true) {
                if text.len() > printed.len() && text.starts_with(&printed) {
                    let _ = write!(out, "{}", &text[printed.len()..]);
                    let _ = out.flush();
                    printed = text;
                }
            }
        }
    })?;
    let dt = start.elapsed().as_secs_f64();
    writeln!(out)?;
    if a.print_ids || tok.is_none() {
        writeln!(out, "ids: {:?}", gen.ids)?;
    }
    eprintln!("[{} prompt tokens, {} generated in {:.2} s, {:.1} tok/s, backend {:?}]", prompt_ids.len(), gen.ids.len(), dt, gen.ids.len() as f64 / dt, a.backend);
    Ok(())
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    pub plan: PathBuf,
    /// also print the whole graph
    #[arg(long)]
    pub graph: bool,
}

pub fn inspect(a: &InspectArgs) -> anyhow::Result<()> {
    let plan = Plan::open(&a.plan)?;
    let h = &plan.header;
    println!("plan {} (format v{}, by {})", a.plan.display(), h.format_version, h.created_by);
    println!("model: {} ({})", h.model.name, h.model.architecture);
    println!("  dims: {}", h.model.dims);
    println!("  limits: max_seq_len {}, kv_block_size {}, max_batch {}", h.model.max_seq_len, h.model.kv_block_size, h.model.max_batch);
    println!("  precision: activations {}, kv cache {}", h.model.activations, h.model.kv_cache);
    println!("targets: {}", h.targets.join(", "));
    let g = plan.graph()?;
    let hist: Vec<String> = g.op_histogram().iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!("graph: {} nodes ({})", g.node_count(), hist.join(", "));
    let mut by_dtype = std::collections::BTreeMap::<&str, (usize, u64)>::new();
    for t in &h.weights.tensors {
        let e = by_dtype.entry(t.dtype.as_str()).or_default();
        e.0 += 1;
        e.1 += t.nbytes;
    }
    let d: Vec<String> = by_dtype.iter().map(|(k, (n, b))| format!("{k}: {n} tensors, {:.1} MB", *b as f64 / 1e6)).collect();
    let seeded: u64 = h.weights.tensors.iter().filter(|t| t.seeded.is_some()).map(|t| t.nbytes).sum();
    let referenced: u64 = h.weights.tensors.iter().filter(|t| t.file.is_some()).map(|t| t.nbytes).sum();
    let how = if referenced > 0 {
        format!("{:.1} MB read from {} checkpoint file(s): {}", referenced as f64 / 1e6, h.weights.files.len(), h.weights.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>().join(", "))
    } else if seeded == 0 {
        "embedded".to_string()
    } else if seeded == h.weights.total_bytes {
        "generated from a seed where used".to_string()
    } else {
        format!("{:.1} MB of them seeded", seeded as f64 / 1e6)
    };
    println!("weights: {} tensors, {:.1} MB, {how} ({})", h.weights.tensors.len(), h.weights.total_bytes as f64 / 1e6, d.join("; "));
    println!("  source: {}{}", h.weights.source, h.weights.source_sha256.as_ref().map(|s| format!(" (sha256 {s})")).unwrap_or_default());
    match &h.gpu {
        Some(g) => {
            let kernels: std::collections::BTreeSet<_> = g.steps.iter().flat_map(|s| s.kernel.iter().chain(s.large.as_ref().map(|l| &l.kernel))).collect();
            let launches = g.steps.iter().filter(|s| s.kernel.is_some()).count();
            let sizes: Vec<String> = g.ptx.iter().map(|(t, p)| format!("{t} {:.1} KB", p.len() as f64 / 1e3)).collect();
            println!("gpu: {} kernels, {launches} launches per step, {} buffers in the memory plan, PTX {}", kernels.len(), g.buffers.len(), sizes.join(", "));
        }
        None => println!("gpu: none (CPU backend only)"),
    }
    match &h.tokenizer {
        Some(t) => println!("tokenizer: embedded, bos {:?}, eos {:?}, chat template {}", t.bos_id, t.eos_ids, if t.chat_template.is_some() { "yes" } else { "no" }),
        None => println!("tokenizer: none"),
    }
    if a.graph {
        print!("{}", h.graph);
    }
    Ok(())
}
