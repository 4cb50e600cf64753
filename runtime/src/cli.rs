//! `run` and `inspect`: the commands both binaries offer.

use crate::engine::CpuBackend;
use crate::generate::{generate, GenerateOptions};
use crate::options::RuntimeOptions;
use crate::plan::Plan;
use crate::sampler::SamplingParams;
use crate::tokenizer::Tokenizer;
use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use std::io::Write;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum BackendKind {
    /// the plan's compiled CPU kernels (x86-64, the weights as stored) under the executor;
    /// the reference executor where the plan has none this CPU runs
    Cpu,
    /// the CPU reference executor alone (f32 weights): the oracle the kernels are checked against
    Reference,
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

pub fn run(a: &RunArgs, ro: &RuntimeOptions) -> anyhow::Result<()> {
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
        sampling: SamplingParams { temperature: a.temperature, top_k: a.top_k, top_p: a.top_p, seed: a.seed, ..Default::default() },
        stop_ids: tok.as_ref().map(|t| t.info.eos_ids.clone()).unwrap_or_default(),
    };
    let kv = prompt_ids.len() + a.max_tokens;
    if plan.header.tensor_parallel > 1 {
        // one thread per rank; this thread drives generation through rank 0
        let go = |r: &mut crate::tp::Ranks| generate_and_print(r, a, tok.as_ref(), &prompt_ids, &opts).map_err(|e| crate::RuntimeError::Request(format!("{e:#}")));
        return Ok(match a.backend {
            BackendKind::Cpu | BackendKind::Reference => crate::tp::cpu(&graph, &plan, kv, go)?,
            // (`RuntimeOptions::tp_local`: every rank on GPU 0, a check of the partition on one GPU)
            BackendKind::Gpu => crate::tp::gpu(&graph, &plan, kv, crate::tp::GpuMode::of(ro), ro, go)?,
        });
    }
    match a.backend {
        BackendKind::Cpu | BackendKind::Reference => generate_and_print(&mut CpuBackend::of_kind(&graph, &plan, kv, a.backend == BackendKind::Reference)?, a, tok.as_ref(), &prompt_ids, &opts),
        BackendKind::Gpu => generate_and_print(&mut crate::gpu::GpuBackend::new(&graph, &plan, kv, ro)?, a, tok.as_ref(), &prompt_ids, &opts),
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
pub struct TokenizeArgs {
    /// the compiled plan (its embedded tokenizer)
    pub plan: PathBuf,
    /// the text (tokenized as-is, special tokens recognized)
    #[arg(long, conflicts_with = "file", required_unless_present = "file")]
    pub text: Option<String>,
    /// a UTF-8 text file instead of --text
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// only the first this many characters of the text
    #[arg(long)]
    pub chars: Option<usize>,
}

/// Prints `{"tokens": N, "ids": [...]}`: the ids the plan's tokenizer gives the text (how a
/// reference made by another implementation gets the very prompt ids dsc will run).
pub fn tokenize(a: &TokenizeArgs) -> anyhow::Result<()> {
    let plan = Plan::open(&a.plan)?;
    let tok = Tokenizer::new(plan.header.tokenizer.as_ref().with_context(|| format!("{}: the plan has no tokenizer", a.plan.display()))?)?;
    let text = match (&a.text, &a.file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => std::fs::read_to_string(f).with_context(|| format!("{}: not readable as UTF-8 text", f.display()))?,
        (None, None) => bail!("give --text or --file"),
    };
    let text: String = match a.chars {
        Some(n) => text.chars().take(n).collect(),
        None => text,
    };
    let ids = tok.encode(&text)?;
    println!("{}", serde_json::json!({ "tokens": ids.len(), "ids": ids }));
    Ok(())
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    pub plan: PathBuf,
    /// also print the whole graph
    #[arg(long)]
    pub graph: bool,
}

/// The code generator's options a plan records (`dsc_codegen::CodegenOptions`), each section as
/// `name=value` pairs in name order, wrapped.
fn print_codegen_options(o: Option<&serde_json::Value>) {
    let Some(o) = o.and_then(|o| o.as_object()) else {
        println!("  codegen options: not recorded (a plan from before they were)");
        return;
    };
    for (section, fields) in o {
        let Some(fields) = fields.as_object() else { continue };
        let mut line = format!("  codegen {section}:");
        for (k, v) in fields {
            let item = format!(" {k}={v}");
            if line.len() + item.len() > 100 {
                println!("{line}");
                line = "   ".to_string();
            }
            line.push_str(&item);
        }
        println!("{line}");
    }
}

pub fn inspect(a: &InspectArgs) -> anyhow::Result<()> {
    let plan = Plan::open(&a.plan)?;
    let h = &plan.header;
    println!("plan {} (format v{}, by {})", a.plan.display(), h.format_version, h.created_by);
    match &plan.signer {
        Some(k) => println!("  signed by {} (ed25519; the signature verified)", crate::plan::hex(k)),
        None => println!("  not signed"),
    }
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
    if let Some(p) = &h.weights.precision {
        println!("  {p}");
    }
    match &h.gpu {
        Some(g) => {
            let kernels: std::collections::BTreeSet<&String> =
                g.steps.iter().flat_map(|s| s.kernel.iter().chain(s.few.iter().chain(&s.hopper).chain(&s.hopper_small).chain(&s.large).map(|l| &l.kernel))).collect();
            let sizes: Vec<String> = g.ptx.iter().map(|(t, p)| format!("{t} {:.1} KB", p.len() as f64 / 1e3)).collect();
            println!(
                "gpu: {} kernels, {} launches per batch-1 decode step ({} with more rows; {} from a {}-key context), {} buffers in the memory plan, PTX {}",
                kernels.len(),
                g.launches(1),
                g.launches(i64::MAX),
                g.launches_at(1, g.context_bounds().last().copied().unwrap_or(1)),
                g.context_bounds().last().copied().unwrap_or(1),
                g.buffers.len(),
                sizes.join(", ")
            );
            print_codegen_options(g.codegen_options.as_ref());
            // which kernel a matmul step runs, by its row count (GpuStep::alternative)
            let range = |l: &crate::plan::GpuLarge| match l.max_rows {
                Some(m) => format!("{}..={m} rows", l.min_rows),
                None => format!(">= {} rows", l.min_rows),
            };
            let mut by_role: Vec<String> = vec![];
            for (role, pick) in [("few", 0usize), ("hopper", 1), ("hopper_small", 2), ("large", 3)] {
                let what = match role {
                    "few" => "any target, after hopper",
                    "hopper" | "hopper_small" => "sm_90a",
                    _ => "any target, after hopper",
                };
                // kernel families (the symbol before its shape: `_k<K>` or `_h<H>`), in order
                let mut fams: Vec<(String, String, usize)> = vec![];
                for l in g.steps.iter().flat_map(|s| match pick {
                    0 => s.few.iter().collect::<Vec<_>>(),
                    1 => s.hopper.iter().collect(),
                    2 => s.hopper_small.iter().collect(),
                    _ => s.large.iter().collect(),
                }) {
                    let cut = [l.kernel.find("_k"), l.kernel.find("_h")].into_iter().flatten().min().unwrap_or(l.kernel.len());
                    let fam = l.kernel[..cut].to_string();
                    match fams.iter_mut().find(|(f, r, _)| *f == fam && *r == range(l)) {
                        Some(e) => e.2 += 1,
                        None => fams.push((fam, range(l), 1)),
                    }
                }
                if !fams.is_empty() {
                    let list: Vec<String> = fams.iter().map(|(f, r, n)| format!("{f} ({r}) on {n} steps")).collect();
                    by_role.push(format!("{role} ({what}): {}", list.join(", ")));
                }
            }
            if !by_role.is_empty() {
                println!("  kernel alternatives by step rows: {}", by_role.join("; "));
            }
        }
        None => println!("gpu: none (CPU backend only)"),
    }
    match &h.cpu {
        Some(c) => {
            let libs: Vec<String> = c.libraries.iter().map(|(t, b)| format!("{t} ({} KB)", b.len() * 3 / 4 / 1024)).collect();
            let runs = crate::plan::CPU_TARGETS.iter().rev().find(|t| c.libraries.contains_key(**t) && crate::cpu_kernels::cpu_runs(t));
            println!("cpu: compiled matmul kernels for {} weights; libraries {}; this CPU runs {}", c.matmul_dtypes.join(", "), libs.join(", "), runs.map_or("none of them", |t| t));
        }
        None => println!("cpu: no compiled kernels (the reference executor)"),
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

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// the compiled plan
    pub plan: PathBuf,
    /// default: the GPU where a CUDA driver and a device are there, else the CPU (said at start)
    #[arg(long, value_enum)]
    pub backend: Option<BackendKind>,
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// require `Authorization: Bearer <key>` (also read from DSC_API_KEY)
    #[arg(long, env = "DSC_API_KEY", hide_env_values = true, conflicts_with = "api_key_file")]
    pub api_key: Option<String>,
    /// read the API key from this file (its first line; e.g. a mounted Kubernetes secret)
    #[arg(long)]
    pub api_key_file: Option<PathBuf>,
    /// accept only plans signed by this ed25519 public key (a `dsc keygen` .pub file; repeatable)
    #[arg(long)]
    pub trusted_key: Vec<PathBuf>,
    /// directory of the checkpoint files a plan references (default: the plan's directory)
    #[arg(long)]
    pub weights_dir: Option<PathBuf>,
    /// requests accepted and not finished (queued or running) past which new ones get 503
    /// with Retry-After
    #[arg(long, default_value_t = 1024)]
    pub max_pending: usize,
    /// open connections past which a new one gets 503 and is closed
    #[arg(long, default_value_t = 1024)]
    pub max_connections: usize,
    /// seconds a request's head may take to arrive (also the idle limit between requests of a
    /// kept-alive connection)
    #[arg(long, default_value_t = 10.0)]
    pub header_timeout_secs: f64,
    /// seconds a request's body may take to arrive
    #[arg(long, default_value_t = 30.0)]
    pub body_timeout_secs: f64,
    /// an engine step running longer than this and 10x the slowest step seen reports the engine
    /// unhealthy (/health 503; dsc_engine_stalls_total)
    #[arg(long, default_value_t = 30.0)]
    pub step_timeout_secs: f64,
    /// special tokens written in chat message text act as special tokens (default: plain text)
    #[arg(long)]
    pub allow_special_tokens_in_content: bool,
    /// exit (status 70) once the engine has been unhealthy this long, so a process supervisor
    /// (systemd, docker --restart) restarts it as a failing liveness probe makes Kubernetes do;
    /// 0: never
    #[arg(long, default_value_t = 60.0)]
    pub exit_unhealthy_secs: f64,
    /// the model name clients use (default: the plan's)
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// cap on the KV pool in tokens (default: GPU: sized from free memory; CPU: max_batch x max_seq_len, at most 65536)
    #[arg(long)]
    pub kv_tokens: Option<usize>,
    /// share of free GPU memory the KV pool may take (vLLM's name: --gpu-memory-utilization)
    #[arg(long, visible_alias = "gpu-memory-utilization", default_value_t = 0.8)]
    pub gpu_memory_fraction: f64,
    /// tokens per engine step (prefill chunks + decodes; vLLM's name: --max-num-batched-tokens)
    #[arg(long, visible_alias = "max-num-batched-tokens", default_value_t = 512)]
    pub max_step_tokens: usize,
    /// sequences per step (default: the plan's max_batch; vLLM's name: --max-num-seqs)
    #[arg(long, visible_alias = "max-num-seqs")]
    pub max_seqs: Option<usize>,
    /// the longest sequence (prompt + completion) served, up to the plan's max_seq_len
    /// (default: the plan's)
    #[arg(long)]
    pub max_model_len: Option<usize>,
    #[arg(long, default_value_t = 1 << 20)]
    pub max_body_bytes: usize,
    #[arg(long, default_value_t = 8)]
    pub max_n: usize,
    /// turn off prefix caching (vLLM's name: --no-enable-prefix-caching)
    #[arg(long, visible_alias = "no-enable-prefix-caching", conflicts_with = "enable_prefix_caching")]
    pub no_prefix_caching: bool,
    /// prefix caching (on by default; vLLM's flag, accepted)
    #[arg(long)]
    pub enable_prefix_caching: bool,
    /// run greedy decode steps synchronously (no pipelining of the host's work under the
    /// device's; also DSC_NO_PIPELINE=1)
    #[arg(long)]
    pub no_pipeline: bool,
    /// greedy decode steps launched at once for steps of up to 4 sequences (GPU: k steps as
    /// one CUDA graph, each fed the previous one's token on the device); 1: one at a time
    /// (default 4, or DSC_MULTI_STEP)
    #[arg(long)]
    pub multi_step: Option<usize>,
    /// token-bucket limit on admitted prompt tokens of a class: CLASS=TOKENS_PER_S[:BURST],
    /// e.g. low=2000:8000 (repeatable)
    #[arg(long)]
    pub rate: Vec<String>,
    /// a request waiting longer than this is admitted before any other (seconds)
    #[arg(long, default_value_t = 10.0)]
    pub starvation_secs: f64,
    /// a request still queued after this long fails with a 408 timeout error (seconds)
    #[arg(long, default_value_t = 600.0)]
    pub queue_timeout_secs: f64,
    /// MoE plans: start with routed expert E of layer L disabled (expert failover; the router
    /// renormalizes over the rest): LAYER:EXPERT, repeatable. `POST /admin/experts` changes it
    /// at run time
    #[arg(long, value_name = "LAYER:EXPERT")]
    pub disable_expert: Vec<String>,
    /// split chat output into `reasoning_content` and `content` (vLLM's flag): deepseek_r1
    /// (DeepSeek-R1's `<think>` ... `</think>`)
    #[arg(long, value_name = "deepseek_r1")]
    pub reasoning_parser: Option<String>,
    /// the model's tool-call format (vLLM's flag): hermes (Hermes, Qwen2.5; default),
    /// llama3_json (Llama-3.1/3.2), deepseek_v3 (DeepSeek-V3/R1's tool-call tokens)
    #[arg(long, value_name = "hermes|llama3_json|deepseek_v3")]
    pub tool_call_parser: Option<String>,
}

/// `--disable-expert LAYER:EXPERT` values.
pub fn parse_experts(v: &[String]) -> anyhow::Result<Vec<(usize, usize)>> {
    v.iter()
        .map(|s| {
            let (l, e) = s.split_once(':').with_context(|| format!("--disable-expert {s}: expected LAYER:EXPERT"))?;
            let n = |x: &str| x.trim().parse::<usize>().with_context(|| format!("--disable-expert {s}: `{x}` is not a number"));
            Ok((n(l)?, n(e)?))
        })
        .collect()
}

fn parse_rates(rates: &[String]) -> anyhow::Result<[Option<(f64, f64)>; 3]> {
    let mut out = [None, None, None];
    for r in rates {
        let (class, spec) = r.split_once('=').with_context(|| format!("--rate {r}: expected CLASS=TOKENS_PER_S[:BURST]"))?;
        let p = crate::scheduler::Priority::parse(class).with_context(|| format!("--rate {r}: class must be high, normal or low"))?;
        let num = |x: &str| x.parse::<f64>().with_context(|| format!("--rate {r}: `{x}` is not a number"));
        let (rate, burst) = match spec.split_once(':') {
            Some((a, b)) => (num(a)?, num(b)?),
            None => {
                let a = num(spec)?;
                (a, a)
            }
        };
        if !(rate > 0.0 && burst > 0.0) {
            bail!("--rate {r}: rate and burst must be positive");
        }
        out[p as usize] = Some((rate, burst));
    }
    Ok(out)
}

/// `serve`: the OpenAI-compatible server (see `server.rs`).
pub fn serve(a: &ServeArgs, ro: &RuntimeOptions) -> anyhow::Result<()> {
    let secs = |what: &str, v: f64| -> anyhow::Result<std::time::Duration> {
        anyhow::ensure!(v.is_finite() && v > 0.0 && v < 1e7, "--{what} {v}: a positive number of seconds");
        Ok(std::time::Duration::from_secs_f64(v))
    };
    let (header_timeout, body_timeout, step_timeout) =
        (secs("header-timeout-secs", a.header_timeout_secs)?, secs("body-timeout-secs", a.body_timeout_secs)?, secs("step-timeout-secs", a.step_timeout_secs)?);
    let (starvation, queue_timeout) = (secs("starvation-secs", a.starvation_secs)?, secs("queue-timeout-secs", a.queue_timeout_secs)?);
    anyhow::ensure!(a.max_pending >= 1 && a.max_connections >= 1, "--max-pending and --max-connections must be at least 1");
    let api_key = match &a.api_key_file {
        Some(f) => {
            let text = std::fs::read_to_string(f).with_context(|| format!("--api-key-file {}", f.display()))?;
            let k = text.lines().next().unwrap_or("").trim().to_string();
            anyhow::ensure!(!k.is_empty(), "--api-key-file {}: the file is empty", f.display());
            Some(k)
        }
        None => match &a.api_key {
            Some(k) if k.trim().is_empty() => bail!("--api-key / DSC_API_KEY is empty: give a key, or leave it unset to serve without one"),
            k => k.clone(),
        },
    };
    anyhow::ensure!(a.exit_unhealthy_secs.is_finite() && a.exit_unhealthy_secs >= 0.0, "--exit-unhealthy-secs {}: a number of seconds (0: never)", a.exit_unhealthy_secs);
    let trusted_keys = a.trusted_key.iter().map(|k| crate::plan::read_key_file(k)).collect::<crate::Result<Vec<_>>>()?;
    let open = crate::plan::OpenOptions { verify_blob: true, weights_dir: a.weights_dir.clone(), trusted_keys };
    let backend = match a.backend {
        Some(b) => {
            if b == BackendKind::Gpu {
                crate::gpu::cuda_available().map_err(|e| anyhow::anyhow!("--backend gpu: {e}; use --backend cpu"))?;
            }
            b
        }
        None => match crate::gpu::cuda_available() {
            Ok(_) => BackendKind::Gpu,
            Err(why) => {
                eprintln!("dsc serve: running on the CPU backend ({why})");
                BackendKind::Cpu
            }
        },
    };
    // read the header here for validation and limits; the engine thread opens its own copy
    let plan = Plan::open_with(&a.plan, &open)?;
    if plan.signer.is_none() {
        eprintln!("dsc serve: {} is not signed (a plan carries the kernels the GPU runs: `dsc compile --sign` and `--trusted-key` accept only yours)", a.plan.display());
    }
    anyhow::ensure!(backend != BackendKind::Gpu || plan.header.gpu.is_some(), "{}: the plan has no GPU program; use --backend cpu", a.plan.display());
    let tp = plan.header.tensor_parallel;
    let m = &plan.header.model;
    let tok = plan.header.tokenizer.as_ref().map(Tokenizer::new).transpose()?.map(std::sync::Arc::new);
    let max_seqs = a.max_seqs.unwrap_or(m.max_batch).max(1);
    let max_len = match a.max_model_len {
        None => m.max_seq_len,
        Some(l) if (1..=m.max_seq_len).contains(&l) => l,
        Some(l) => bail!("--max-model-len {l}: the plan serves 1 to {} tokens a sequence (its limits.max_seq_len)", m.max_seq_len),
    };
    let kv_tokens = match (backend, a.kv_tokens) {
        (BackendKind::Cpu | BackendKind::Reference, k) => k.unwrap_or((m.max_batch * m.max_seq_len).min(65536)),
        (BackendKind::Gpu, k) => {
            let per_token = kv_bytes_per_token(&plan)?;
            let ctx = cudarc::driver::CudaContext::new(0).map_err(|e| anyhow::anyhow!("opening CUDA device 0: {e:?}"))?;
            let (free, _) = cudarc::driver::result::mem_get_info().map_err(|e| anyhow::anyhow!("reading free GPU memory: {e:?}"))?;
            drop(ctx);
            // weights are not resident yet: leave them (and activations) their room
            let budget = (free as f64 * a.gpu_memory_fraction) as usize;
            let avail = budget.saturating_sub(plan.header.weights.total_bytes as usize + (1 << 30));
            let fit = avail / per_token.max(1);
            let t = k.map_or(fit, |k| k.min(fit));
            eprintln!("KV pool: {t} tokens ({:.1} GB of {:.1} GB free)", (t * per_token) as f64 / 1e9, free as f64 / 1e9);
            t
        }
    };
    anyhow::ensure!(kv_tokens >= m.kv_block_size, "the KV pool would hold no block ({kv_tokens} tokens)");
    let multi_step = a.multi_step.unwrap_or(ro.multi_step);
    anyhow::ensure!((1..=16).contains(&multi_step), "--multi-step {multi_step}: 1 to 16 steps per launch");
    let ro = RuntimeOptions { multi_step, ..ro.clone() };
    for d in ro.differences() {
        eprintln!("runtime option: {d}");
    }
    let cfg = crate::scheduler::SchedulerConfig {
        max_step_tokens: a.max_step_tokens.max(1),
        max_seqs,
        max_seq_len: max_len,
        prefix_caching: !a.no_prefix_caching,
        rate: parse_rates(&a.rate)?,
        starvation,
        queue_timeout,
        pipeline: !a.no_pipeline && ro.pipeline,
        multi_step,
        kv_first_block: ro.measure.kv_first_block,
        watchdog: crate::health::Watchdog { floor: step_timeout, factor: 10.0 },
    };
    let disable = parse_experts(&a.disable_expert)?;
    let metrics = std::sync::Arc::new(crate::metrics::Metrics::new());
    let path = a.plan.clone();
    let (engine, join) = crate::scheduler::spawn(
        move |lp: crate::scheduler::EngineLoop| -> crate::Result<()> {
            // (the blob was hashed above)
            let plan = Plan::open_with(&path, &crate::plan::OpenOptions { verify_blob: false, ..open })?;
            let graph = plan.graph()?;
            // tensor-parallel plans: one thread per rank, the scheduler stays on this one
            match (backend, tp > 1) {
                (BackendKind::Cpu | BackendKind::Reference, false) => lp.run(CpuBackend::of_kind(&graph, &plan, kv_tokens, backend == BackendKind::Reference)?),
                (BackendKind::Gpu, false) => lp.run(crate::gpu::GpuBackend::new(&graph, &plan, kv_tokens, &ro)?),
                (BackendKind::Cpu | BackendKind::Reference, true) => crate::tp::cpu(&graph, &plan, kv_tokens, |r| lp.run(r)),
                (BackendKind::Gpu, true) => crate::tp::gpu(&graph, &plan, kv_tokens, crate::tp::GpuMode::of(&ro), &ro, |r| lp.run(r)),
            }
        },
        cfg,
        tok.clone(),
        metrics,
    )?;
    for &(l, e) in &disable {
        if let Err(err) = engine.set_expert(l, e, false) {
            engine.shutdown();
            let _ = join.join();
            bail!("--disable-expert {l}:{e}: {err}");
        }
    }
    let scfg = crate::server::ServerConfig {
        api_key,
        max_body_bytes: a.max_body_bytes,
        max_n: a.max_n,
        max_pending: a.max_pending,
        allow_special_in_content: a.allow_special_tokens_in_content,
        reasoning: match a.reasoning_parser.as_deref() {
            None => None,
            Some(p) => Some(crate::reasoning::ReasoningParser::parse(p).with_context(|| format!("--reasoning-parser {p}: the parsers are deepseek_r1"))?),
        },
        tool_parser: match a.tool_call_parser.as_deref() {
            None => Default::default(),
            Some(p) => crate::tools::Parser::parse(p).with_context(|| format!("--tool-call-parser {p}: the parsers are {}", crate::tools::Parser::NAMES))?,
        },
        http: crate::server::HttpLimits { header_timeout, body_timeout, max_connections: a.max_connections },
        ..crate::server::ServerConfig::new(a.served_model_name.clone().unwrap_or_else(|| m.name.clone()), max_len)
    };
    let state = crate::server::AppState::new(scfg, engine, tok);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let addr = format!("{}:{}", a.host, a.port);
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(&addr).await.with_context(|| format!("binding {addr}"))?;
        eprintln!("dsc serve: {} on http://{} ({:?} backend, KV pool {kv_tokens} tokens)", state.cfg.model_name, listener.local_addr()?, backend);
        if a.exit_unhealthy_secs > 0.0 {
            let engine = state.engine.clone();
            let after = std::time::Duration::from_secs_f64(a.exit_unhealthy_secs);
            tokio::spawn(async move {
                let why = crate::server::unhealthy_for(&engine, after).await;
                eprintln!("dsc serve: the engine has been unhealthy for {:.0} s ({why}): exiting for a restart", after.as_secs_f64());
                std::process::exit(70);
            });
        }
        crate::server::serve(state, listener).await?;
        anyhow::Ok(())
    })?;
    join.join().map_err(|_| anyhow::anyhow!("the engine thread panicked"))?;
    eprintln!("dsc serve: stopped");
    Ok(())
}

/// KV bytes per token over every layer's pools (rows of the pools' type: f32 or bf16).
fn kv_bytes_per_token(plan: &Plan) -> anyhow::Result<usize> {
    let g = plan.graph()?;
    crate::engine::kv_pools(&g).map(|(n, row)| n.ty.dtype.bytes_for(row).ok_or_else(|| anyhow::anyhow!("state {}: {} pools have no byte size", n.name, n.ty.dtype))).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_limits_parse_and_bad_ones_are_named() {
        let r = parse_rates(&["low=2000:8000".into(), "high=500".into()]).unwrap();
        assert_eq!(r, [Some((500.0, 500.0)), None, Some((2000.0, 8000.0))]);
        for bad in ["low", "urgent=10", "low=-1", "low=abc", "normal=5:0"] {
            let e = parse_rates(&[bad.to_string()]).unwrap_err().to_string();
            assert!(e.contains(&format!("--rate {bad}")), "{bad}: {e}");
        }
    }
}

#[derive(Debug, Args)]
pub struct BenchCpuArgs {
    /// the compiled plan
    pub plan: PathBuf,
    /// prompt tokens prefilled in one step (median of 3)
    #[arg(long, default_value_t = 500)]
    pub prefill: usize,
    /// greedy tokens decoded one step each, after a 16-token prompt
    #[arg(long, default_value_t = 128)]
    pub decode: usize,
    /// worker threads of the CPU kernels (0: one per core)
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// time the reference executor (`--backend reference`) instead of the compiled kernels
    #[arg(long)]
    pub reference: bool,
    /// the x86-64 level whose library runs (x86-64-v3, x86-64-v4, x86-64-v4-amx; default: the highest this
    /// CPU runs)
    #[arg(long)]
    pub target: Option<String>,
    /// also write the result here as JSON
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The token ids both benchmarks feed (bench/cpu_peer.py feeds llama.cpp the same): spread over
/// the vocabulary, fixed.
pub fn bench_ids(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919) % vocab.saturating_sub(1000).max(1) + 500.min(vocab - 1)) as u32).collect()
}

/// `bench-cpu`: prefill and decode tokens/s of a plan on this CPU, one sequence.
pub fn bench_cpu(a: &BenchCpuArgs) -> anyhow::Result<serde_json::Value> {
    use crate::engine::{Backend, Session};
    let plan = Plan::open(&a.plan)?;
    let graph = plan.graph()?;
    let kv = (a.prefill.max(16 + a.decode) + 16).min(plan.header.model.max_seq_len);
    anyhow::ensure!(a.prefill + 1 <= plan.header.model.max_seq_len && 16 + a.decode <= plan.header.model.max_seq_len, "--prefill/--decode beyond the plan's max_seq_len");
    let (mut backend, target, threads) = if a.reference {
        (CpuBackend::new(&graph, &plan, kv)?, "reference executor".to_string(), 1)
    } else {
        let k = crate::cpu_kernels::CpuKernels::load_target(&plan, a.threads, a.target.as_deref())?;
        let (t, n) = (k.target().to_string(), k.threads());
        (CpuBackend::with_kernels(&graph, &plan, kv, std::sync::Arc::new(k))?, t, n)
    };
    let vocab = {
        let mut s = Session::new(&mut backend);
        s.feed(&[1], false)?[0].len()
    };
    let argmax = |l: &[f32]| l.iter().enumerate().fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| if v > b.1 { (i, v) } else { b }).0 as u32;
    let mut prefill_s = vec![];
    for _ in 0..3 {
        let ids = bench_ids(a.prefill, vocab);
        let mut s = Session::new(&mut backend);
        let t0 = std::time::Instant::now();
        s.feed(&ids, false)?;
        prefill_s.push(t0.elapsed().as_secs_f64());
    }
    prefill_s.sort_by(f64::total_cmp);
    let prefill = prefill_s[1];
    let mut s = Session::new(&mut backend);
    let mut last = argmax(&s.feed(&bench_ids(16, vocab), false)?[0]);
    let t0 = std::time::Instant::now();
    for _ in 0..a.decode {
        last = argmax(&s.feed(&[last], false)?[0]);
    }
    let decode = t0.elapsed().as_secs_f64();
    let _ = backend.kv_geometry();
    let r = serde_json::json!({
        "plan": a.plan.display().to_string(),
        "backend": if a.reference { "reference" } else { "cpu" },
        "target": target,
        "threads": threads,
        "prefill_tokens": a.prefill,
        "prefill_tokens_per_s": a.prefill as f64 / prefill,
        "decode_tokens": a.decode,
        "decode_tokens_per_s": a.decode as f64 / decode,
        "decode_ms_per_token": decode * 1e3 / a.decode as f64,
    });
    println!("{}", serde_json::to_string_pretty(&r)?);
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&r)?).with_context(|| p.display().to_string())?;
    }
    Ok(r)
}
