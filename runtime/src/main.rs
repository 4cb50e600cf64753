//! `dsc-runtime`: the runtime-only binary (no LLVM/MLIR). Runs and inspects compiled plans.

use clap::{Parser, Subcommand};
use dsc_runtime::cli;

#[derive(Parser)]
#[command(name = "dsc-runtime", version, about = "Run compiled dsc plans (runtime only; compile with `dsc compile`)")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Generate text from a prompt
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
    /// Write a plan's weights as DIR/model.safetensors under the HF checkpoint's names (seeded
    /// weights generated; DeepSeek's stacked experts and split kv_b_proj undone), for HF
    /// transformers to load the very weights the plan runs on
    ExportWeights {
        plan: std::path::PathBuf,
        #[arg(short, long)]
        out: std::path::PathBuf,
    },
    /// Teacher-forced logits of token ids (every position) on the CPU executor or the GPU, as
    /// JSON {"ids": [...], "logits": [[...], ...]}: dsc's side of a comparison with another
    /// implementation (scripts/gpu-deepseek-hf.sh: HF transformers)
    Logits {
        plan: std::path::PathBuf,
        /// comma-separated token ids
        #[arg(long)]
        ids: String,
        /// cpu (the f32 reference executor) or gpu
        #[arg(long, default_value = "cpu")]
        backend: String,
        #[arg(short, long)]
        out: std::path::PathBuf,
    },
    /// Run a model plan on the GPU beside the CPU executor along the reference continuations
    /// (../shared/reference/*-numpy-*.json) and report agreement
    GpuE2e {
        plan: std::path::PathBuf,
        reference: std::path::PathBuf,
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Greedy-decode a plan on the GPU for N steps from a seeded prompt, timing each step;
    /// check the first steps against the CPU executor
    GpuDecode {
        plan: std::path::PathBuf,
        #[arg(long, default_value_t = 16)]
        prompt_len: usize,
        #[arg(long, default_value_t = 128)]
        steps: usize,
        #[arg(long, default_value_t = 0)]
        cpu_check_steps: usize,
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Two plans of one model (e.g. with and without a fusion) on GPU 0: the same batched greedy
    /// requests through the serving engine, token streams compared; fails unless at least
    /// `--min-equal` of the `--seqs` streams are equal.
    ComparePlans {
        a: std::path::PathBuf,
        b: std::path::PathBuf,
        #[arg(long, default_value_t = 32)]
        seqs: usize,
        #[arg(long, default_value_t = 32)]
        prompt_len: usize,
        #[arg(long, default_value_t = 24)]
        new_tokens: usize,
        #[arg(long)]
        min_equal: Option<usize>,
    },
    /// Decode a whole-model plan on GPU 0, then tensor-parallel plans of the same model
    /// teacher-forced along its greedy continuation: logits compared at every position, decode
    /// timed. `--nccl P` runs rank r of P on GPU r; `--local P` runs every rank on GPU 0 with
    /// the all-reduces done by local copies.
    GpuTp {
        base: std::path::PathBuf,
        #[arg(long)]
        nccl: Vec<std::path::PathBuf>,
        #[arg(long)]
        local: Vec<std::path::PathBuf>,
        #[arg(long, default_value_t = 16)]
        prompt_len: usize,
        #[arg(long, default_value_t = 128)]
        steps: usize,
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Benchmark a plan on GPU 0: decode tokens/s at each batch size (through the serving
    /// engine) and prefill tokens/s at each length; JSON for bench/run.sh
    Bench {
        plan: std::path::PathBuf,
        #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
        batches: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "512,4096")]
        prefill: Vec<usize>,
        #[arg(long, default_value_t = 32)]
        prompt_len: usize,
        #[arg(long, default_value_t = 128)]
        new_tokens: usize,
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// TFLOP/s (and weight TB/s) of the plan's matmul kernels at each row count, the kernel
    /// the runtime picks for it (batched-decode GEMV, tensor-core prefill matmul; inputs
    /// generated on the device), one per weight shape
    BenchGemm {
        plan: std::path::PathBuf,
        #[arg(long, value_delimiter = ',', default_value = "512,4096")]
        m: Vec<usize>,
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// The plan's paged attention kernel alone: causal prefill of T tokens and one decode
    /// token at each context length (inputs generated on the device)
    BenchAttention {
        plan: std::path::PathBuf,
        #[arg(long, value_delimiter = ',', default_value = "512,4096")]
        prefill: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "1024,8192")]
        decode_context: Vec<usize>,
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
    /// Run a kernel-check bundle (from `dsc gpu-bundle`) on GPU 0 and compare with the CPU
    /// reference outputs it carries
    GpuCheck {
        bundle: std::path::PathBuf,
        #[arg(long, default_value = "sm_90a")]
        target: String,
        /// write the results as JSON here
        #[arg(long)]
        json: Option<std::path::PathBuf>,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_writer(std::io::stderr).init();
    // (the run-time knobs: read from the environment once, here)
    let ro = dsc_runtime::options::RuntimeOptions::from_env().map_err(anyhow::Error::msg)?;
    let ro = &ro;
    match Cli::parse().cmd {
        Cmd::Run(a) => cli::run(&a, ro),
        Cmd::Ppl(a) => dsc_runtime::ppl::run(&a, ro).map(|_| ()),
        Cmd::Inspect(a) => cli::inspect(&a),
        Cmd::BenchCpu(a) => cli::bench_cpu(&a).map(|_| ()),
        Cmd::Tokenize(a) => cli::tokenize(&a),
        Cmd::Serve(a) => cli::serve(&a, ro),
        Cmd::Logits { plan, ids, backend, out } => {
            let ids: Vec<u32> = ids.split(',').map(|s| anyhow::Context::with_context(s.trim().parse::<u32>(), || format!("--ids: `{s}` is not a token id"))).collect::<anyhow::Result<_>>()?;
            anyhow::ensure!(!ids.is_empty(), "--ids: no token ids");
            let p = dsc_runtime::plan::Plan::open(&plan)?;
            let graph = p.graph()?;
            let kv = ids.len().next_power_of_two().max(16);
            let t0 = std::time::Instant::now();
            let logits = match backend.as_str() {
                "cpu" => dsc_runtime::engine::Session::new(&mut dsc_runtime::engine::CpuBackend::new(&graph, &p, kv)?).feed(&ids, true)?,
                "gpu" => dsc_runtime::engine::Session::new(&mut dsc_runtime::gpu::GpuBackend::new(&graph, &p, kv, ro)?).feed(&ids, true)?,
                other => anyhow::bail!("--backend: `{other}` is not cpu or gpu"),
            };
            std::fs::write(&out, serde_json::to_string(&serde_json::json!({"ids": ids, "logits": logits}))?)?;
            println!("wrote {} ({} positions, {:.1} s)", out.display(), logits.len(), t0.elapsed().as_secs_f64());
            Ok(())
        }
        Cmd::ExportWeights { plan, out } => {
            let p = dsc_runtime::plan::Plan::open(&plan)?;
            dsc_runtime::export::export_hf(&p, &out)?;
            println!("wrote {}", out.join("model.safetensors").display());
            Ok(())
        }
        Cmd::GpuE2e { plan, reference, json } => {
            let r = dsc_runtime::gpu_e2e::run(&plan, &reference, ro)?;
            println!("{:<8} {:>5} {:>10} {:>10} {:>9} {:>12} {:>8} {:>10}  result", "prompt", "pos", "max relL2", "mean", "argmax≠", "greedy agree", "margin", "ms/token");
            for p in &r {
                let agree = p.first_difference.map(|i| format!("{i} of {}", p.reference_ids.len())).unwrap_or_else(|| format!("all {}", p.reference_ids.len()));
                println!(
                    "{:<8} {:>5} {:>10.2e} {:>10.2e} {:>4}/{:<4} {:>12} {:>8} {:>10.2}  {}",
                    p.name,
                    p.positions,
                    p.max_rel_l2,
                    p.mean_rel_l2,
                    p.argmax_mismatches,
                    p.argmax_checked,
                    agree,
                    p.reference_margin_there.map(|m| format!("{m:.3}")).unwrap_or("-".into()),
                    p.gpu_decode_ms_per_token,
                    if p.pass { "ok" } else { "FAIL" }
                );
            }
            if let Some(j) = json {
                std::fs::write(&j, serde_json::to_string_pretty(&r)?)?;
            }
            let failed = r.iter().filter(|p| !p.pass).count();
            println!("{} passed, {} failed", r.len() - failed, failed);
            anyhow::ensure!(failed == 0, "{failed} prompts failed the GPU check");
            Ok(())
        }
        Cmd::GpuDecode { plan, prompt_len, steps, cpu_check_steps, json } => {
            let r = dsc_runtime::gpu_decode::run(&plan, prompt_len, steps, cpu_check_steps, ro)?;
            println!(
                "{}: prompt {} tokens, prefill {:.1} ms; {} decode steps: median {:.2} ms ({:.1} tok/s), p90 {:.2} ms; logits finite: {}",
                r.model, r.prompt_len, r.prefill_ms, r.steps, r.decode_ms_median, r.tokens_per_s, r.decode_ms_p90, r.all_logits_finite
            );
            for (i, (e, a)) in r.cpu_rel_l2.iter().zip(&r.cpu_argmax_equal).enumerate() {
                println!("  position {i}: GPU vs CPU relative L2 {e:.2e}, argmax equal {a}");
            }
            if let Some(j) = json {
                std::fs::write(&j, serde_json::to_string_pretty(&r)?)?;
            }
            anyhow::ensure!(r.all_logits_finite, "non-finite logits");
            anyhow::ensure!(r.cpu_rel_l2.iter().all(|e| *e <= 2e-2), "GPU logits differ from the CPU executor");
            // the serving engine's pipelined greedy decode against its synchronous one
            let equal = dsc_runtime::bench::pipeline_check(&plan, 4, prompt_len, 24, ro)?;
            println!("pipelined engine decode (4 sequences, 21-24 tokens): token streams equal to synchronous: {equal}");
            anyhow::ensure!(equal, "pipelined decode differs from synchronous decode");
            Ok(())
        }
        Cmd::ComparePlans { a, b, seqs, prompt_len, new_tokens, min_equal } => {
            let (equal, differ) = dsc_runtime::bench::compare_plans(&a, &b, seqs, prompt_len, new_tokens, ro)?;
            println!("{} vs {}: {equal} of {seqs} greedy streams equal ({new_tokens} tokens); unequal (sequence, first differing token): {differ:?}", a.display(), b.display());
            anyhow::ensure!(equal >= min_equal.unwrap_or(seqs), "only {equal} of {seqs} streams equal");
            Ok(())
        }
        Cmd::GpuTp { base, nccl, local, prompt_len, steps, json } => {
            use dsc_runtime::tp::GpuMode;
            let others: Vec<_> = local.into_iter().map(|p| (p, GpuMode::Local)).chain(nccl.into_iter().map(|p| (p, GpuMode::Nccl))).collect();
            let r = dsc_runtime::gpu_tp::run(&base, &others, prompt_len, steps, ro)?;
            println!("{:<36} {:>3} {:>7} {:>10} {:>9} {:>10} {:>9} {:>8}", "plan", "tp", "mode", "ms/token", "tok/s", "max relL2", "argmax≠", "bitwise");
            for x in &r {
                println!(
                    "{:<36} {:>3} {:>7} {:>10.3} {:>9.1} {:>10.2e} {:>4}/{:<4} {:>8}",
                    x.plan, x.tensor_parallel, x.mode, x.decode_ms_median, x.tokens_per_s, x.max_rel_l2, x.argmax_mismatches, x.positions, x.bitwise_equal
                );
            }
            if let Some(j) = json {
                std::fs::write(&j, serde_json::to_string_pretty(&r)?)?;
            }
            for x in r.iter().filter(|x| !x.mismatches.is_empty()) {
                println!("  {} ({}): argmax differs at (position, whole-model top-2 margin) {:?}", x.plan, x.mode, x.mismatches);
            }
            if let Some(x) = r.get(1) {
                let show: Vec<String> = x.rel_l2.iter().take(8).map(|e| format!("{e:.1e}")).collect();
                println!("  relative L2 along the sequence ({}, {}): {} ...", x.plan, x.mode, show.join(" "));
            }
            // the same bounds as GPU vs CPU (issue 3): partial sums in another order, and the
            // tensor-core prefill rounds activations to bf16; near-ties may flip
            let bad: Vec<_> = r.iter().filter(|x| x.max_rel_l2 > 2e-2 || x.mismatches.iter().any(|&(_, m)| m > 0.25)).map(|x| x.plan.clone()).collect();
            anyhow::ensure!(bad.is_empty(), "tensor-parallel plans disagree with the whole model: {bad:?}");
            Ok(())
        }
        Cmd::Bench { plan, batches, prefill, prompt_len, new_tokens, json } => {
            let d = dsc_runtime::bench::decode(&plan, &batches, prompt_len, new_tokens, ro)?;
            let p = dsc_runtime::bench::prefill(&plan, &prefill, ro)?;
            for x in &d {
                println!("{} decode batch {:>4}: {:>9.1} tok/s  {:>8.2} ms/step", x.model, x.batch, x.decode_tokens_per_s, x.ms_per_step);
            }
            for x in &p {
                println!("{} prefill {:>5} tokens: {:>9.1} tok/s  {:>8.1} ms", x.model, x.tokens, x.tokens_per_s, x.ms);
            }
            if let Some(j) = json {
                std::fs::write(&j, serde_json::to_string_pretty(&serde_json::json!({"decode": d, "prefill": p}))?)?;
            }
            Ok(())
        }
        Cmd::BenchGemm { plan, m, json } => {
            let r = dsc_runtime::bench::gemm(&plan, &m)?;
            for x in &r {
                println!("{:<48} {:>6} x {:>6} x {:>6}: {:>10.1} us {:>8.1} TFLOP/s {:>6.2} TB/s of weights", x.kernel, x.m, x.n, x.k, x.us, x.tflop_s, x.weight_tb_s);
            }
            if let Some(j) = json {
                std::fs::write(&j, serde_json::to_string_pretty(&r)?)?;
            }
            Ok(())
        }
        Cmd::BenchAttention { plan, prefill, decode_context, json } => {
            let r = dsc_runtime::bench::attention(&plan, &prefill, &decode_context)?;
            for x in &r {
                println!("{:<8} T {:>6} context {:>6}: {:>10.1} us {:>8.2} TFLOP/s {:>8.0} GB/s of K/V", x.kind, x.tokens, x.context, x.us, x.tflop_s, x.kv_gb_s);
            }
            if let Some(j) = json {
                std::fs::write(&j, serde_json::to_string_pretty(&r)?)?;
            }
            Ok(())
        }
        Cmd::GpuCheck { bundle, target, json } => {
            let r = dsc_runtime::gpu_check::run(&bundle, &target)?;
            println!("{:<28} {:<22} {:>9} {:>10} {:>6} {:>9}  result", "case", "kernel", "elements", "rel err", "tol", "us");
            for c in &r {
                println!("{:<28} {:<22} {:>9} {:>10.2e} {:>6.0e} {:>9.1}  {}", c.name, c.kernel, c.elements, c.rel_err, c.tol, c.median_us, if c.pass { "ok" } else { "FAIL" });
            }
            if let Some(j) = json {
                std::fs::write(&j, serde_json::to_string_pretty(&r)?)?;
            }
            let failed = r.iter().filter(|c| !c.pass).count();
            println!("{} passed, {} failed", r.len() - failed, failed);
            anyhow::ensure!(failed == 0, "{failed} kernel checks failed");
            Ok(())
        }
    }
}
