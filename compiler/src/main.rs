//! `dsc`: compile model.toml to a plan; dump IR; inspect and run plans.

use anyhow::{bail, Context};
use clap::{Parser, Subcommand, ValueEnum};
use dsc_compiler::STAGES;
use dsc_runtime::cli;
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(name = "dsc", version, about = "Ahead-of-time compiler and runtime for LLM inference")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum DumpFormat {
    Text,
    Dot,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compile a model.toml into a plan (no GPU needed)
    Compile {
        model: PathBuf,
        /// output plan (default: <model name>.plan); not written when only dumping
        #[arg(short, long)]
        output: Option<PathBuf>,
        /// print one stage's IR to stdout instead of writing a plan: graph, egraph, optimized (= fused), schedule (or schedule@REWRITE), mlir, llvm, ptx, plan
        #[arg(long)]
        dump_ir: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        dump_format: DumpFormat,
        /// write every stage's dump (text and DOT) into this folder, and the plan too
        #[arg(long)]
        dump_dir: Option<PathBuf>,
        /// reference checkpoint weights by path + sha256 instead of embedding them
        #[arg(long)]
        reference_weights: bool,
        /// tensor-parallel ranks (overrides model.toml's [parallel] tp)
        #[arg(long)]
        tp: Option<usize>,
        /// skip the equality-saturation optimizer (fusions), e.g. to compare with and without
        #[arg(long)]
        no_optimize: bool,
        /// the optimizer runs by default; accepted so older scripts keep working
        #[arg(long, hide = true)]
        optimize: bool,
        /// turn an optimizer rule on or off: NAME=on|off (repeatable; rules whose kernels are
        /// not yet checked on the GPU, e.g. rope-cache-write, start off)
        #[arg(long = "rule", value_name = "NAME=on|off")]
        rules: Vec<String>,
        /// sign the plan with this ed25519 key (a `dsc keygen` .key file); `dsc serve
        /// --trusted-key` then accepts it
        #[arg(long, value_name = "KEY")]
        sign: Option<PathBuf>,
        /// weight format for matrices, over model.toml's `precision.weights`: int8[-gN],
        /// int4[-sym|-asym][-gN] (groups of N, default 128), q8_0, q4_0, q4_1, bf16, f16, f32,
        /// stored; Q/K/V, lm_head, router and embeddings stay stored unless `[precision.layers]`
        /// names them
        #[arg(long, value_name = "FORMAT")]
        quant: Option<String>,
        /// `awq`: activation-aware scale search before integer rounding (over
        /// `precision.calibration`); `none`: round to nearest
        #[arg(long, value_name = "none|awq")]
        calibration: Option<String>,
        /// one layer type's format, over `[precision.layers]` (repeatable): KIND=FORMAT with
        /// KIND one of attn_qkv, attn_o, mlp, experts, router, lm_head, embeddings
        #[arg(long = "quant-layer", value_name = "KIND=FORMAT")]
        quant_layers: Vec<String>,
        /// 8-bit activations for the matmuls whose weights the policy quantizes (W8A8, W4A8),
        /// over `precision.act_quant`: none, fp8 (e4m3, a scale per token), fp8-gN (per N
        /// values of a token, e.g. fp8-g128), int8, int8-gN. On the GPU: fp8-g128 (with fp8 weights
        /// the FP8 tensor-core GEMM on Hopper); the others CPU executor only
        #[arg(long = "act-quant", value_name = "none|fp8[-gN]|int8[-gN]")]
        act_quant: Option<String>,
        /// N:M structured sparsity for `precision.sparse_layers` (default attn_o and mlp), over
        /// `precision.sparsity`: none, 2:4 (stored compressed: sp24_bf16), 4:8. CPU executor
        /// only for now
        #[arg(long, value_name = "none|2:4|4:8")]
        sparsity: Option<String>,
        /// how pruned values are chosen, over `precision.sparsity_method`: magnitude, or wanda
        /// (|W| times its input feature's norm over the calibration text)
        #[arg(long = "sparsity-method", value_name = "magnitude|wanda")]
        sparsity_method: Option<String>,
    },
    /// Make an ed25519 key pair for signing plans: NAME.key (secret, mode 0600) and NAME.pub
    Keygen {
        /// path prefix of the two files
        name: PathBuf,
    },
    /// Print a stage's IR for a model.toml (same as `compile --dump-ir`)
    DumpIr {
        model: PathBuf,
        #[arg(long, default_value = "graph")]
        stage: String,
        #[arg(long, value_enum, default_value = "text")]
        format: DumpFormat,
    },
    /// Write a kernel-check bundle: every generated kernel as PTX, random inputs, and the CPU
    /// reference executor's outputs (run it with `dsc-runtime gpu-check DIR`)
    GpuBundle {
        #[arg(long, default_value = ".gpu/check")]
        dir: PathBuf,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// keep only the cases whose kernel name contains one of these (comma-separated), e.g.
        /// `--only flash_attention,paged_attention`: a focused check that fits one device call
        /// beside a plan
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
    },
    /// Print the cost model of one step per kernel class: launches, bytes, FLOPs and the H200
    /// roofline time (bytes at 4.62 TB/s or FLOPs at the tensor-core rate, + 2.5 us a launch)
    Cost {
        model: PathBuf,
        /// tokens in the step (1 = decode)
        #[arg(long, default_value_t = 1)]
        tokens: usize,
        /// cached positions each token attends to
        #[arg(long, default_value_t = 1024)]
        context: usize,
        #[arg(long)]
        tp: Option<usize>,
    },
    /// Generate text from a plan
    Run(cli::RunArgs),
    /// Perplexity of a plan on a text file (windows of the plan's context, each from an empty cache)
    Ppl(dsc_runtime::ppl::PplArgs),
    /// Print what a plan holds
    Inspect(cli::InspectArgs),
    /// Prefill and decode tokens/s of a plan on this CPU (the compiled kernels, or
    /// `--reference`); bench/cpu.sh runs it beside llama.cpp
    BenchCpu(cli::BenchCpuArgs),
    /// The token ids a plan's tokenizer gives a text, as JSON
    Tokenize(cli::TokenizeArgs),
    /// Serve a plan over an OpenAI-compatible HTTP API
    Serve(cli::ServeArgs),
}

fn stage_text(c: &dsc_compiler::Compiled, stage: &str, fmt: DumpFormat) -> anyhow::Result<String> {
    let g = match stage {
        "graph" => &c.model.graph,
        "optimized" | "fused" => &c.graph,
        "egraph" => {
            if fmt == DumpFormat::Dot {
                bail!("stage `egraph` has no DOT form");
            }
            return Ok(c.reports.iter().find_map(|r| r.dump.clone()).unwrap_or_else(|| "// no e-graph: the optimizer did not run (--no-optimize)\n".into()));
        }
        "plan" => {
            if fmt == DumpFormat::Dot {
                bail!("stage `plan` has no DOT form");
            }
            let mut h = dsc_compiler::plan_header(c)?;
            h.graph = "<see --dump-ir=optimized>".into();
            if let Some(g) = h.gpu.as_mut() {
                for p in g.ptx.values_mut() {
                    *p = format!("<{} bytes of PTX: see --dump-ir=ptx>", p.len());
                }
            }
            if let Some(t) = h.tokenizer.as_mut() {
                t.json = format!("<{} bytes of tokenizer.json>", t.json.len());
            }
            return Ok(serde_json::to_string_pretty(&h)? + "\n");
        }
        s if s == "schedule" || s.starts_with("schedule@") => {
            if fmt == DumpFormat::Dot {
                bail!("stage `schedule` has no DOT form");
            }
            let Some((last, text)) = c.schedule.last() else {
                return Ok(format!("// no GPU program: {}\n", c.gpu_skipped.as_deref().unwrap_or("?")));
            };
            let ran: Vec<&str> = c.schedule.iter().map(|(n, _)| n.as_str()).collect();
            return match s.strip_prefix("schedule@") {
                None => Ok(format!("// the launch schedule: {} (after {}); --dump-ir=schedule@NAME for the one after NAME\n{text}", ran.join(" -> "), last)),
                Some(name) => match c.schedule.iter().find(|(n, _)| n == name) {
                    Some((_, t)) => Ok(format!("// the launch schedule after `{name}` (of {})\n{t}", ran.join(" -> "))),
                    None => bail!("--dump-ir=schedule@{name}: no such rewrite ran; these did: {}", ran.join(", ")),
                },
            };
        }
        "mlir" | "llvm" | "ptx" => {
            if fmt == DumpFormat::Dot {
                bail!("stage `{stage}` has no DOT form");
            }
            let Some(k) = &c.kernels else {
                return Ok(format!("// no GPU program: {}\n", c.gpu_skipped.as_deref().unwrap_or("?")));
            };
            return Ok(match stage {
                "mlir" => format!("// generated\n{}\n// after the pass pipeline ({})\n{}\n", k.mlir, dsc_codegen::pipeline::PASS_PIPELINE, k.lowered),
                "llvm" => k.llvm.clone(),
                _ => k.ptx.iter().map(|(t, p)| format!("// ===== {} =====\n{p}", t.name())).collect(),
            });
        }
        other => bail!("unknown stage `{other}`; stages: {}", STAGES.join(", ")),
    };
    Ok(match fmt {
        DumpFormat::Text => dsc_ir::text::print(g),
        DumpFormat::Dot => dsc_ir::dot::to_dot(g),
    })
}

fn summary(c: &dsc_compiler::Compiled) -> String {
    let h = c.graph.op_histogram();
    let per_layer = c.model.dims.layers.max(1);
    let compute: usize = h.iter().filter(|(k, _)| !matches!(**k, "input" | "weight" | "state")).map(|(_, v)| v).sum();
    let passes: Vec<String> = c.reports.iter().map(|r| format!("{}: {}", r.pass, r.note)).collect();
    let gpu = match &c.gpu {
        Some(g) => {
            let (one, more) = (g.launches(1), g.launches(i64::MAX));
            let kernels: std::collections::BTreeSet<_> = g.steps.iter().flat_map(|s| s.kernel.iter().chain(s.large.as_ref().map(|l| &l.kernel))).collect();
            // (the schedule of the longest context class: the split decode attention)
            let long = match g.context_bounds().last() {
                Some(&c) => format!(", {} from a {c}-key context", g.launches_at(1, c)),
                None => String::new(),
            };
            format!("GPU: {} distinct kernels, {one} launches per batch-1 decode step ({} per layer), {more} with more rows{long}", kernels.len(), one / per_layer)
        }
        None => format!("GPU: none ({})", c.gpu_skipped.as_deref().unwrap_or("?")),
    };
    // the cost model's view of one decode token at a 1024-token context
    let costs = dsc_compiler::cost::step_cost(&c.graph, c.gpu.as_ref(), 1, 1024);
    let t = dsc_compiler::cost::total(&costs);
    let gpu = format!("{gpu}; cost model, decode token at context 1024: {:.1} MB moved, {:.2} GFLOP, roofline {:.2} ms", t.bytes / 1e6, t.flops / 1e9, t.roofline_s(false) * 1e3);
    let precision = c.model.precision.as_ref().map(|p| format!("\n{p}")).unwrap_or_default();
    format!(
        "{}: {} layers, {} nodes ({} ops, ~{} per layer), weights {:.1} MB; passes: {}; {gpu}{precision}",
        c.model.config.toml.model.name,
        c.model.dims.layers,
        c.graph.node_count(),
        compute,
        compute / per_layer,
        c.model.weights.total_bytes() as f64 / 1e6,
        passes.join("; ")
    )
}

#[allow(clippy::too_many_arguments)]
fn do_compile(
    model: &Path,
    output: Option<PathBuf>,
    dump_ir: Option<String>,
    fmt: DumpFormat,
    dump_dir: Option<PathBuf>,
    reference: bool,
    tp: Option<usize>,
    optimize: bool,
    rules: &[(String, bool)],
    key: Option<&ed25519_dalek::SigningKey>,
    precision: dsc_models::PrecisionOverride,
) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let codegen = dsc_compiler::codegen_options_from_env()?;
    let c = dsc_compiler::compile_full(model, &dsc_compiler::CompileOptions { tp, optimize, rules: rules.to_vec(), codegen, precision, cc: std::env::var("CC").unwrap_or_else(|_| "cc".into()) })?;
    if let Some(stage) = dump_ir {
        print!("{}", stage_text(&c, &stage, fmt)?);
        if output.is_none() && dump_dir.is_none() {
            eprintln!("{}", summary(&c));
            return Ok(());
        }
    }
    if let Some(dir) = &dump_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        for s in STAGES {
            std::fs::write(dir.join(format!("{s}.txt")), stage_text(&c, s, DumpFormat::Text)?)?;
            if matches!(*s, "graph" | "optimized") {
                std::fs::write(dir.join(format!("{s}.dot")), stage_text(&c, s, DumpFormat::Dot)?)?;
            }
        }
    }
    let out = output.unwrap_or_else(|| PathBuf::from(format!("{}.plan", c.model.config.toml.model.name)));
    dsc_compiler::write_signed(&c, &out, reference, key)?;
    eprintln!("{}", summary(&c));
    eprintln!("wrote {} ({:.1} MB) in {:.2} s", out.display(), std::fs::metadata(&out).map(|m| m.len()).unwrap_or(0) as f64 / 1e6, t0.elapsed().as_secs_f64());
    Ok(())
}

fn keygen(name: &std::path::Path) -> anyhow::Result<()> {
    use rand::RngCore;
    let mut seed = [0u8; 32];
    // (ThreadRng: a CSPRNG seeded from the OS)
    rand::rng().fill_bytes(&mut seed);
    let sk = ed25519_dalek::SigningKey::from_bytes(&seed);
    let (key, public) = (name.with_extension("key"), name.with_extension("pub"));
    anyhow::ensure!(!key.exists(), "{} exists: not overwriting a key", key.display());
    {
        use std::io::Write;
        let mut o = std::fs::OpenOptions::new();
        o.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut o, 0o600);
        let mut f = o.open(&key).with_context(|| key.display().to_string())?;
        writeln!(f, "{}", dsc_runtime::plan::hex(&seed))?;
    }
    std::fs::write(&public, format!("{}\n", dsc_runtime::plan::hex(sk.verifying_key().as_bytes()))).with_context(|| public.display().to_string())?;
    eprintln!("wrote {} (secret) and {} (public: give it to `dsc serve --trusted-key`)", key.display(), public.display());
    Ok(())
}

/// The run-time knobs (`dsc run` / `dsc serve`), read from the environment once.
fn runtime_options() -> anyhow::Result<dsc_runtime::options::RuntimeOptions> {
    dsc_runtime::options::RuntimeOptions::from_env().map_err(anyhow::Error::msg)
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    match Cli::parse().cmd {
        Cmd::Keygen { name } => keygen(&name),
        Cmd::Compile {
            model,
            output,
            dump_ir,
            dump_format,
            dump_dir,
            reference_weights,
            tp,
            no_optimize,
            optimize: _,
            rules,
            sign,
            quant,
            calibration,
            quant_layers,
            act_quant,
            sparsity,
            sparsity_method,
        } => {
            let rules = rules
                .iter()
                .map(|r| match r.split_once('=') {
                    Some((n, "on")) => Ok((n.to_string(), true)),
                    Some((n, "off")) => Ok((n.to_string(), false)),
                    _ => Err(anyhow::anyhow!("--rule {r}: expected NAME=on or NAME=off")),
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            let key = sign.map(|k| dsc_runtime::plan::read_key_file(&k).map(|b| ed25519_dalek::SigningKey::from_bytes(&b))).transpose()?;
            let layers = quant_layers
                .iter()
                .map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).ok_or_else(|| anyhow::anyhow!("--quant-layer {l}: expected KIND=FORMAT")))
                .collect::<anyhow::Result<Vec<_>>>()?;
            let precision = dsc_models::PrecisionOverride { weights: quant, calibration, layers, act_quant, sparsity, sparsity_method };
            do_compile(&model, output, dump_ir, dump_format, dump_dir, reference_weights, tp, !no_optimize, &rules, key.as_ref(), precision)
        }
        Cmd::DumpIr { model, stage, format } => {
            let c = dsc_compiler::compile_full(&model, &dsc_compiler::CompileOptions { codegen: dsc_compiler::codegen_options_from_env()?, ..Default::default() })?;
            print!("{}", stage_text(&c, &stage, format)?);
            Ok(())
        }
        Cmd::GpuBundle { dir, seed, only } => {
            let n = dsc_compiler::gpu_bundle::write_bundle_only(&dir, seed, &only, &dsc_compiler::codegen_options_from_env()?)?;
            eprintln!("wrote {n} kernel checks to {}", dir.display());
            Ok(())
        }
        Cmd::Cost { model, tokens, context, tp } => {
            let c = dsc_compiler::compile_full(&model, &dsc_compiler::CompileOptions { tp, codegen: dsc_compiler::codegen_options_from_env()?, ..Default::default() })?;
            let costs = dsc_compiler::cost::step_cost(&c.graph, c.gpu.as_ref(), tokens, context);
            println!("{:<34} {:>8} {:>12} {:>12} {:>12}", "kernel class", "launches", "MB", "GFLOP", "roofline us");
            for (k, m) in &costs {
                println!("{k:<34} {:>8} {:>12.2} {:>12.3} {:>12.1}", m.launches, m.bytes / 1e6, m.flops / 1e9, m.roofline_s(tokens > 1) * 1e6);
            }
            let t = dsc_compiler::cost::total(&costs);
            println!("{:<34} {:>8} {:>12.2} {:>12.3} {:>12.1}", "total", t.launches, t.bytes / 1e6, t.flops / 1e9, t.roofline_s(tokens > 1) * 1e6);
            Ok(())
        }
        Cmd::Run(a) => cli::run(&a, &runtime_options()?),
        Cmd::Ppl(a) => dsc_runtime::ppl::run(&a, &runtime_options()?).map(|_| ()),
        Cmd::Inspect(a) => cli::inspect(&a),
        Cmd::BenchCpu(a) => cli::bench_cpu(&a).map(|_| ()),
        Cmd::Tokenize(a) => cli::tokenize(&a),
        Cmd::Serve(a) => cli::serve(&a, &runtime_options()?),
    }
}
