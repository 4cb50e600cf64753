//! The `dsc` binary as a user runs it: compile, dump, inspect, run (greedy, sampled, chat),
//! and clear failures.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn dsc(args: &[&str]) -> (bool, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_dsc")).args(args).current_dir(root()).output().unwrap();
    (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn compiled_plan(dir: &std::path::Path) -> String {
    assert!(root().join(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf").exists(), "run scripts/fetch-model.sh first");
    let plan = dir.join("smol.plan");
    let dumps = dir.join("dumps");
    let (ok, _, err) = dsc(&["compile", "models/smollm2-135m.toml", "-o", plan.to_str().unwrap(), "--dump-dir", dumps.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(err.contains("30 layers") && err.contains("wrote"), "{err}");
    for f in ["graph.txt", "graph.dot", "optimized.txt", "optimized.dot", "plan.txt"] {
        assert!(dumps.join(f).exists(), "dump {f} missing");
    }
    plan.to_str().unwrap().to_string()
}

#[test]
fn compile_inspect_and_run() {
    let d = tempfile::tempdir().unwrap();
    let plan = compiled_plan(d.path());
    let (ok, out, err) = dsc(&["inspect", &plan]);
    assert!(ok, "{err}");
    assert!(out.contains("smollm2-135m-instruct") && out.contains("q4_1: 210 tensors") && out.contains("chat template yes"), "{out}");
    // which kernel runs at which row count (Q4_1 layers and the Q8_0 lm_head: the
    // tensor-core batched GEMV dequantizing in registers for 2..=128 rows, x in f32 below 16
    // and its f16 copy from there, past them the warp-specialized pipelined matmul with its
    // producers dequantizing (the wgmma matmul for the merged q/k/v, whose 576 + 192 + 192
    // columns are not whole 128-column tiles); attention
    // steps of 129+ tokens (x 9 heads) run FlashAttention, and from 43 tokens (128 blocks of a
    // token and one of the 3 KV heads) up to there the grouped decode attention: the one-pass
    // attention has two steps per layer, short contexts and many rows at long ones; the
    // one-token fusions keep each fused GEMV's 2+-row kernels on its own step)
    assert!(
        out.contains(
            "kernel alternatives by step rows: few (any target, after hopper): matmul_few32 (2..=15 rows) on 151 steps, matmul_few32x16 (16..=128 rows) on 151 steps, paged_attention (387..=1160 rows) on 60 steps; hopper (sm_90a): matmul_wgmma64 (>= 129 rows) on 30 steps, matmul_pipe128s6o_a16 (>= 129 rows) on 121 steps"
        ) && out.contains("flash_attention (>= 1161 rows) on 60 steps"),
        "{out}"
    );

    // greedy: the f32 reference's continuation of "The capital of France is"
    let (ok, out, err) = dsc(&["run", &plan, "--prompt", "The capital of France is", "--max-tokens", "8", "--print-ids"]);
    assert!(ok, "{err}");
    assert!(out.starts_with(" Paris."), "{out}");
    assert!(out.contains("ids: [7042, 30, 198, 198, 504, 2988, 314, 42]"), "{out}");

    // sampling: a seed reproduces, another seed (very likely) differs
    let args = |seed: &'static str| vec!["run", &plan, "--prompt", "Once upon a time", "--max-tokens", "12", "--temperature", "0.9", "--top-p", "0.95", "--seed", seed, "--print-ids"];
    let a = dsc(&args("1"));
    let b = dsc(&args("1"));
    let c = dsc(&args("2"));
    assert!(a.0 && b.0 && c.0);
    assert_eq!(a.1, b.1);
    assert_ne!(a.1, c.1);

    // chat template applied
    let (ok, out, err) = dsc(&["run", &plan, "--prompt", "What is 2+2?", "--chat", "--max-tokens", "16"]);
    assert!(ok, "{err}");
    assert!(out.contains('4'), "chat answer: {out}");

    // a server asked for more steps per launch than it takes fails before it listens
    let (ok, _, err) = dsc(&["serve", &plan, "--backend", "cpu", "--multi-step", "17"]);
    assert!(!ok && err.contains("--multi-step 17"), "{err}");

    // perplexity on the shipped text: the first 160 tokens in windows of 64 (BOS-less: the
    // first token of each window is context only)
    let json = d.path().join("ppl.json");
    let (ok, out, err) = dsc(&["ppl", &plan, "data/coriolanus-act1.txt", "--max-tokens", "160", "--ctx", "64", "--json", json.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(out.contains("perplexity") && out.contains("over 157 tokens") && out.contains("3 window(s) of 64 tokens"), "{out}");
    let r: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let ppl = r["report"]["ppl"].as_f64().unwrap();
    // (a 135M instruct model on Shakespeare: far better than chance over 49,152 tokens, far from perfect)
    assert!((5.0..500.0).contains(&ppl), "{r}");
    // and its failures name what is wrong
    let (ok, _, err) = dsc(&["ppl", &plan, "no/such.txt"]);
    assert!(!ok && err.contains("no/such.txt"), "{err}");
    let (ok, _, err) = dsc(&["ppl", &plan, "data/coriolanus-act1.txt", "--ctx", "4096"]);
    assert!(!ok && err.contains("--ctx 4096") && err.contains("max_seq_len (2048)"), "{err}");
}

#[test]
fn dump_ir_prints_stages() {
    let (ok, out, err) = dsc(&["compile", "models/smollm2-135m.toml", "--dump-ir", "graph"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("graph \"smollm2-135m-instruct\" {"));
    let (ok, out, _) = dsc(&["dump-ir", "models/smollm2-135m.toml", "--stage", "optimized", "--format", "dot"]);
    assert!(ok && out.starts_with("digraph"));
    let (ok, _, err) = dsc(&["dump-ir", "models/smollm2-135m.toml", "--stage", "nonsense"]);
    assert!(!ok && err.contains("unknown stage `nonsense`"), "{err}");
    // the launch schedule: the rewrites that ran, then a line per step
    let (ok, out, err) = dsc(&["compile", "models/smollm2-135m.toml", "--dump-ir", "schedule"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("// the launch schedule: initial -> qkv-rope-cache -> "), "{}", &out[..200.min(out.len())]);
    assert!(out.contains("\nembed = gather_d576_q8_0(") && out.contains("    hopper rows "), "{}", &out[..400.min(out.len())]);
    let (ok, after, _) = dsc(&["dump-ir", "models/smollm2-135m.toml", "--stage", "schedule@split-k"]);
    assert!(ok && after.starts_with("// the launch schedule after `split-k`") && after != out);
    let (ok, _, err) = dsc(&["dump-ir", "models/smollm2-135m.toml", "--stage", "schedule@nonsense"]);
    assert!(!ok && err.contains("no such rewrite ran") && err.contains("split-k"), "{err}");
}

/// The code generator's options come from the DSC_* variables once, land in the plan and in
/// `dsc inspect`; non-default kernel options mark every symbol; a bad value names the variable.
#[test]
fn codegen_options_are_recorded_in_the_plan_and_bad_ones_refused() {
    let d = tempfile::tempdir().unwrap();
    let plan = d.path().join("o.plan");
    let run = |env: &[(&str, &str)], args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_dsc")).args(args).envs(env.iter().copied()).current_dir(root()).output().unwrap();
        (o.status.success(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let p = plan.to_str().unwrap();
    let (ok, _, err) = run(&[("DSC_FLASH_TREE", "0"), ("DSC_SPLIT_K", "0")], &["compile", "models/smollm2-shape-seeded.toml", "-o", p]);
    assert!(ok, "{err}");
    let (ok, out, err) = run(&[], &["inspect", p]);
    assert!(ok, "{err}");
    assert!(out.contains("flash_tree=false") && out.contains("split_k=null") && out.contains("norm_fusion=true"), "{out}");
    let (_, dump, _) = run(&[("DSC_FLASH_TREE", "0")], &["compile", "models/smollm2-shape-seeded.toml", "--dump-ir", "plan"]);
    let kernels: Vec<&str> = dump.lines().filter(|l| l.trim_start().starts_with("\"kernel\": \"")).collect();
    assert!(!kernels.is_empty() && kernels.iter().all(|l| l.contains("_x")), "{:?}", &kernels[..3.min(kernels.len())]);
    let (ok, _, err) = run(&[("DSC_TMA", "maybe")], &["compile", "models/smollm2-shape-seeded.toml", "-o", p]);
    assert!(!ok && err.contains("DSC_TMA=\"maybe\"") && err.contains("narrow"), "{err}");
}

#[test]
fn failures_are_clear() {
    let (ok, _, err) = dsc(&["run", "no/such.plan", "--prompt", "hi"]);
    assert!(!ok && err.contains("no/such.plan"), "{err}");
    let (ok, _, err) = dsc(&["compile", "no/such.toml"]);
    assert!(!ok && err.contains("no/such.toml"), "{err}");
    let d = tempfile::tempdir().unwrap();
    let plan = d.path().join("x.plan");
    std::fs::write(&plan, b"not a plan").unwrap();
    let (ok, _, err) = dsc(&["inspect", plan.to_str().unwrap()]);
    assert!(!ok && err.contains("not a dsc plan"), "{err}");
    let (ok, _, err) = dsc(&["run", plan.to_str().unwrap(), "--prompt", "hi", "--temperature", "-1"]);
    assert!(!ok && !err.contains("panicked"), "{err}");
}

#[test]
fn optimize_reports_and_dumps_the_egraph() {
    let (ok, out, err) = dsc(&["compile", "models/smollm2-135m.toml", "--optimize", "--dump-ir", "egraph"]);
    assert!(ok, "{err}");
    // every layer's SwiGLU: the original mul and the fused form, the fused one extracted
    assert_eq!(out.matches("= mul(").count(), 30, "{out:.2000}");
    assert_eq!(out.matches("*silu_mul(").count(), 30);
    assert!(out.contains("c37 blk.0.ffn_up.swiglu : f32[T, 1536]"), "{out:.2000}");
    assert!(err.contains("optimize: 2 iterations, stop: saturated") && err.contains("kernels 544 -> 334") && err.contains("64 launches per batch-1 decode step"), "{err}");
    let (ok, out, _) = dsc(&["compile", "models/smollm2-135m.toml", "--optimize", "--dump-ir", "fused"]);
    assert!(ok && out.contains("%blk.0.ffn_up.swiglu = silu_mul(%blk.0.ffn_gate, %blk.0.ffn_up)"), "{out:.3000}");
}

/// `dsc keygen` + `compile --sign`: a signed plan that `inspect` reads; and where no CUDA driver
/// is present, `--backend gpu` is a clear error, not a panic inside cudarc.
#[test]
fn signed_plans_and_the_missing_driver_error() {
    let d = tempfile::tempdir().unwrap();
    let key = d.path().join("k");
    let (ok, _, err) = dsc(&["keygen", key.to_str().unwrap()]);
    assert!(ok, "{err}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(key.with_extension("key")).unwrap().permissions().mode() & 0o777, 0o600, "the secret key is private");
    }
    let (ok, _, _) = dsc(&["keygen", key.to_str().unwrap()]);
    assert!(!ok, "keygen never overwrites a key");
    let plan = d.path().join("s.plan");
    let (ok, _, err) = dsc(&["compile", "models/smollm2-135m.toml", "-o", plan.to_str().unwrap(), "--sign", key.with_extension("key").to_str().unwrap()]);
    assert!(ok, "{err}");
    let (ok, out, err) = dsc(&["inspect", plan.to_str().unwrap()]);
    assert!(ok && out.contains("signed by"), "{out}{err}");
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    assert!(out.contains(public.trim()), "inspect names the signing key: {out}");
    if dsc_runtime::gpu::cuda_available().is_err() {
        let (ok, _, err) = dsc(&["run", plan.to_str().unwrap(), "--backend", "gpu", "--prompt", "hi"]);
        assert!(!ok && err.contains("no CUDA driver") && !err.contains("panicked"), "{err}");
    }
}
