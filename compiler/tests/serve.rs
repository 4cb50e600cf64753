//! `dsc serve` end to end on the CPU backend, driven by real clients: the official `openai`
//! Python client against the real SmolLM2 (tests/serve/openai_client.py), and 64 concurrent
//! streaming clients against a tiny seeded model with SmolLM2's tokenizer
//! (tests/serve/load.py); then a graceful shutdown.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn dsc(args: &[&str]) {
    let o = Command::new(env!("CARGO_BIN_EXE_dsc")).args(args).current_dir(root()).output().unwrap();
    assert!(o.status.success(), "dsc {args:?}: {}", String::from_utf8_lossy(&o.stderr));
}

/// A running `dsc serve`; killed (SIGKILL) if a test fails before its graceful stop.
struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

fn serve(plan: &Path, extra: &[&str]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dsc"))
        .args(["serve", plan.to_str().unwrap(), "--backend", "cpu", "--port", "0", "--api-key", "test-key"])
        .args(extra)
        .current_dir(root())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // the server prints its address once listening
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    let base = loop {
        line.clear();
        assert!(err.read_line(&mut line).unwrap() > 0, "dsc serve exited before listening");
        if let Some(i) = line.find("http://") {
            break line[i..].split_whitespace().next().unwrap().to_string();
        }
    };
    // keep draining stderr so the server never blocks on a full pipe
    std::thread::spawn(move || for _ in err.lines() {});
    Server { child, base }
}

fn python(script: &str, args: &[&str]) -> String {
    let o = Command::new("python3").arg(root().join("tests/serve").join(script)).args(args).output().unwrap();
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{script} failed (the openai client comes from scripts/setup.sh):\n{out}");
    out
}

/// SIGTERM, then the server must drain and exit 0.
fn stop(mut s: Server) {
    let ok = Command::new("kill").args(["-TERM", &s.child.id().to_string()]).status().unwrap().success();
    assert!(ok);
    let status = s.child.wait().unwrap();
    assert!(status.success(), "dsc serve exited with {status} after SIGTERM");
}

#[test]
fn openai_client_completes_chats_and_streams_against_smollm2() {
    assert!(root().join(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf").exists(), "run scripts/fetch-model.sh first");
    let d = tempfile::tempdir().unwrap();
    let plan = d.path().join("smol.plan");
    dsc(&["compile", "models/smollm2-135m.toml", "-o", plan.to_str().unwrap()]);
    let s = serve(&plan, &[]);
    let out = python("openai_client.py", &[&s.base, "smollm2-135m-instruct", "test-key"]);
    assert!(out.contains("checks passed"), "{out}");
    let out = python("tools.py", &[&s.base, "smollm2-135m-instruct", "test-key"]);
    assert!(out.contains("tools: 9 checks passed"), "{out}");
    stop(s);
    // (the same checks in Llama-3's format: bare {"name", "parameters"} calls, by grammar)
    let s = serve(&plan, &["--tool-call-parser", "llama3_json"]);
    let out = python("tools.py", &[&s.base, "smollm2-135m-instruct", "test-key"]);
    assert!(out.contains("tools: 9 checks passed"), "llama3_json: {out}");
    stop(s);
    let s = serve(&plan, &["--reasoning-parser", "deepseek_r1"]);
    let out = python("reasoning.py", &[&s.base, "smollm2-135m-instruct", "test-key"]);
    assert!(out.contains("3 checks passed"), "{out}");
    stop(s);
}

/// A tiny seeded model with SmolLM2's tokenizer (from its plan), compiled into `d`.
fn tiny_plan(d: &Path) -> PathBuf {
    assert!(root().join(".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf").exists(), "run scripts/fetch-model.sh first");
    let smol = d.join("smol.plan");
    dsc(&["compile", "models/smollm2-135m.toml", "-o", smol.to_str().unwrap()]);
    let p = dsc_runtime::plan::Plan::open(&smol).unwrap();
    let t = p.header.tokenizer.as_ref().unwrap();
    std::fs::write(d.join("tokenizer.json"), &t.json).unwrap();
    let eos = *t.eos_ids.first().unwrap();
    let tk = dsc_runtime::tokenizer::Tokenizer::new(t).unwrap();
    let cfg = serde_json::json!({"eos_token": tk.id_to_token(eos).unwrap(), "add_bos_token": false});
    std::fs::write(d.join("tokenizer_config.json"), cfg.to_string()).unwrap();
    let toml = d.join("tiny.toml");
    std::fs::write(
        &toml,
        "[model]\nname = \"tiny-seeded\"\narchitecture = \"llama\"\n\n[weights]\nformat = \"seeded\"\nseed = 3\ndtype = \"f32\"\n\n\
         [dims]\nhidden = 64\nlayers = 2\nheads = 4\nkv_heads = 2\nhead_dim = 16\nffn = 128\nvocab = 49152\nrope_theta = 10000.0\nnorm_eps = 1e-5\ntie_embeddings = true\n\n\
         [limits]\nmax_seq_len = 256\nkv_block_size = 16\nmax_batch = 64\n\n[tokenizer]\npath = \"tokenizer.json\"\n",
    )
    .unwrap();
    let plan = d.join("tiny.plan");
    dsc(&["compile", toml.to_str().unwrap(), "-o", plan.to_str().unwrap()]);
    plan
}

#[test]
fn sixty_four_concurrent_streams_match_solo_runs() {
    let d = tempfile::tempdir().unwrap();
    let plan = tiny_plan(d.path());
    // a pool smaller than 64 x 48 tokens: the load also exercises preemption
    let s = serve(&plan, &["--kv-tokens", "1600", "--max-step-tokens", "256"]);
    let json = d.path().join("load.json");
    let out = python("load.py", &[&s.base, "tiny-seeded", "test-key", "--clients", "64", "--max-tokens", "24", "--json", json.to_str().unwrap()]);
    assert!(out.contains("64 concurrent streams complete, 64 equal to solo runs"), "{out}");
    stop(s);
}

/// The serving benchmark (bench/serve.py) against the tiny plan served with vLLM's flag names:
/// Poisson arrivals with a priority mix, every request generating exactly its tokens, the
/// report's counts and percentiles consistent; a request past `--max-model-len` fails the run
/// with the server's error, and a `--max-model-len` past the plan's stops `dsc serve`.
#[test]
fn serving_benchmark_reports_what_it_measured() {
    let d = tempfile::tempdir().unwrap();
    let plan = tiny_plan(d.path());
    // (vLLM's flag names; the context cut to 128 of the plan's 256)
    let s = serve(&plan, &["--max-num-seqs", "16", "--max-num-batched-tokens", "256", "--gpu-memory-utilization", "0.5", "--enable-prefix-caching", "--max-model-len", "128"]);
    let json = d.path().join("serve.json");
    let bench = |extra: &[&str]| {
        Command::new("python3").arg(root().join("bench/serve.py")).args(["--base", &s.base, "--model", "tiny-seeded", "--api-key", "test-key", "--vocab", "49152"]).args(extra).output().unwrap()
    };
    let o = bench(&[
        "--num-prompts",
        "24",
        "--input-len",
        "24",
        "--output-len",
        "8",
        "--sweep",
        "200,inf",
        "--max-concurrency",
        "16",
        "--priority-mix",
        "high=0.25,normal=0.5,low=0.25",
        "--goodput",
        "ttft=60000,tpot=60000",
        "--json",
        json.to_str().unwrap(),
    ]);
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(o.status.success(), "{out}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{out}");
    for r in runs {
        assert_eq!((r["completed"].as_u64(), r["failed"].as_u64()), (Some(24), Some(0)), "{r}");
        assert_eq!((r["input_tokens"].as_u64(), r["output_tokens"].as_u64()), (Some(24 * 24), Some(24 * 8)), "ignore_eos: exactly the tokens asked for");
        for k in ["ttft_s", "tpot_s", "itl_s", "e2e_s"] {
            let p = |q: &str| r[k][q].as_f64().unwrap();
            assert!(0.0 < p("p50") && p("p50") <= p("p90") && p("p90") <= p("p99"), "{k}: {}", r[k]);
        }
        assert!(r["ttft_s"]["p99"].as_f64() <= r["e2e_s"]["p99"].as_f64(), "{r}");
        let by: u64 = ["high", "normal", "low"].iter().map(|p| r["by_priority"][p]["completed"].as_u64().unwrap()).sum();
        assert_eq!(by, 24);
        assert_eq!(r["goodput"]["share"].as_f64(), Some(1.0), "a 60 s SLO holds");
        let wall = r["wall_s"].as_f64().unwrap();
        assert!((r["output_tok_s"].as_f64().unwrap() * wall - 192.0).abs() < 1e-6);
    }
    // a prompt past the 128-token context: the run fails and says why
    let o = bench(&["--num-prompts", "2", "--input-len", "130", "--output-len", "4"]);
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    assert!(!o.status.success() && out.contains("FAILED: 2 requests failed") && out.contains("maximum context length is 128 tokens"), "{out}");
    stop(s);
    // a context past the plan's is refused at start
    let o = Command::new(env!("CARGO_BIN_EXE_dsc")).args(["serve", plan.to_str().unwrap(), "--backend", "cpu", "--port", "0", "--max-model-len", "4096"]).current_dir(root()).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("--max-model-len 4096") && err.contains("1 to 256"), "{err}");
}

/// Stalled heads and bodies closed by the timeouts with /health answering within 1 s
/// throughout, idle keep-alive closed, the connection cap and the bounded queue answering 503
/// with Retry-After, 405/408 in OpenAI's shape, the bearer scheme case-insensitive, and the
/// stop-string request of issue 30 (tests/serve/hostile.py).
#[test]
fn hostile_clients_are_bounded_and_health_stays_responsive() {
    let d = tempfile::tempdir().unwrap();
    let plan = tiny_plan(d.path());
    let s = serve(&plan, &["--header-timeout-secs", "1", "--body-timeout-secs", "2", "--max-connections", "48", "--max-pending", "1"]);
    let out = python("hostile.py", &[&s.base, "tiny-seeded", "test-key"]);
    assert!(out.contains("checks passed"), "{out}");
    eprintln!("{out}");
    stop(s);
}

/// A word-level tokenizer for the 512-token DeepSeek fixtures: a few words the load test's
/// prompts use, then `t<N>`; decoding joins tokens with spaces.
fn word_tokenizer(d: &Path) -> (PathBuf, Vec<String>) {
    let mut vocab: Vec<String> = ["<s>", "</s>", "[UNK]", "Story", "the", "and", "met", "by"].iter().map(|s| s.to_string()).collect();
    vocab.extend((0..8).map(|i| format!("{i}:")));
    vocab.extend("river stone light quiet paper garden engine window silver morning cloud music".split(' ').map(String::from));
    let n = vocab.len();
    vocab.extend((n..512).map(|i| format!("t{i}")));
    let map: serde_json::Map<String, serde_json::Value> = vocab.iter().enumerate().map(|(i, w)| (w.clone(), i.into())).collect();
    let tk = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [{"id": 1, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null,
        "model": {"type": "WordLevel", "vocab": map, "unk_token": "[UNK]"}
    });
    let p = d.join("tokenizer.json");
    std::fs::write(&p, tk.to_string()).unwrap();
    std::fs::write(d.join("tokenizer_config.json"), r#"{"eos_token": "</s>", "add_bos_token": false}"#).unwrap();
    (p, vocab)
}

/// The DeepSeek-V3 tiny fixture (MLA + MoE) served on the CPU: expert failover at start
/// (`--disable-expert`) and at run time (`POST /admin/experts`) routes exactly as the CPU
/// executor with the same mask predicts; then 64 concurrent streams complete, each equal to
/// its solo run, and the KV pool is empty after.
#[test]
fn deepseek_plan_serves_with_expert_failover_and_64_streams() {
    use dsc_runtime::engine::{Backend, CpuBackend};
    let d = tempfile::tempdir().unwrap();
    let (tok, vocab) = word_tokenizer(d.path());
    let toml = d.path().join("ds.toml");
    let weights = root().join("tests/fixtures/deepseek/v3-tiny");
    std::fs::write(
        &toml,
        format!(
            "[model]\nname = \"ds-v3-tiny\"\narchitecture = \"deepseek\"\n\n[weights]\nformat = \"safetensors\"\npath = \"{}\"\n\n[limits]\nmax_seq_len = 128\nkv_block_size = 4\nmax_batch = 64\n\n[tokenizer]\npath = \"{}\"\n",
            weights.display(),
            tok.display()
        ),
    )
    .unwrap();
    let plan_path = d.path().join("ds.plan");
    dsc(&["compile", toml.to_str().unwrap(), "-o", plan_path.to_str().unwrap()]);
    // the expected continuations, from the CPU backend the server runs (`--backend cpu`: the
    // plan's compiled kernels where it has them): unmasked, and with the expert disabled that
    // changes this prompt's continuation
    let prompt = "Story 3: the river and the cloud met by the engine and";
    let ids: Vec<u32> = prompt.split(' ').map(|w| vocab.iter().position(|v| v == w).unwrap() as u32).collect();
    let plan = dsc_runtime::plan::Plan::open(&plan_path).unwrap();
    let graph = plan.graph().unwrap();
    let mut be = CpuBackend::of_kind(&graph, &plan, 256, false).unwrap();
    let run = |be: &mut CpuBackend| {
        let opts = dsc_runtime::generate::GenerateOptions { max_tokens: 12, sampling: Default::default(), stop_ids: vec![] };
        dsc_runtime::generate::generate(be, &ids, &opts, |_| {}).unwrap().ids.iter().map(|&i| vocab[i as usize].clone()).collect::<Vec<_>>().join(" ")
    };
    let base = run(&mut be);
    let (layer, expert, masked) = (0..8)
        .find_map(|e| {
            be.set_expert(1, e, false).unwrap();
            let m = run(&mut be);
            be.set_expert(1, e, true).unwrap();
            (m != base).then_some((1usize, e, m))
        })
        .expect("some expert of layer 1 changes the continuation");
    drop(be);
    // a pool smaller than 64 streams need: the load also preempts (and the prefix cache hits)
    let s = serve(&plan_path, &["--disable-expert", &format!("{layer}:{expert}"), "--kv-tokens", "800", "--max-step-tokens", "256"]);
    let out = python("failover.py", &[&s.base, "ds-v3-tiny", "test-key", &layer.to_string(), &expert.to_string(), prompt, "12"]);
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    eprintln!("failover through the server: {v}\nexpected: base `{base}`, expert {expert} of layer {layer} disabled `{masked}`");
    let words = |x: &serde_json::Value| x.as_str().unwrap().split_whitespace().collect::<Vec<_>>().join(" ");
    let listed = serde_json::json!({"object": "experts", "disabled": [{"layer": layer, "expert": expert}]});
    assert_eq!(v["unauthorized"], 401, "{v}");
    assert_eq!(v["at_start"], serde_json::json!([200, listed]), "{v}");
    assert_eq!(words(&v["masked"]), masked, "--disable-expert: as the CPU executor predicts");
    assert_eq!(v["enable"], serde_json::json!([200, {"object": "experts", "disabled": []}]), "{v}");
    assert_eq!(words(&v["restored"]), base, "re-enabled");
    assert_eq!(v["disable"], serde_json::json!([200, listed]), "{v}");
    assert_eq!(words(&v["masked_again"]), masked, "disabled at run time");
    assert_eq!(v["bad_layer"][0], 400, "{v}");
    assert!(v["bad_layer"][1].as_str().unwrap().contains("layer 0 has no routed experts"), "{v}");
    assert_eq!(v["bad_body"], 400, "{v}");
    let metrics: Vec<&str> = v["metrics"].as_array().unwrap().iter().map(|m| m.as_str().unwrap()).collect();
    let metric = |name: &str| metrics.iter().find(|l| l.starts_with(name)).and_then(|l| l.rsplit(' ').next()).and_then(|x| x.parse::<f64>().ok()).unwrap_or_else(|| panic!("{name} in {metrics:?}"));
    assert_eq!(metric("dsc_moe_disabled_experts"), 1.0);
    assert!(metric("dsc_moe_masked_selections_total") > 0.0, "{metrics:?}");
    assert!(metric("dsc_moe_load_imbalance{layer=\"1\"}") >= 1.0, "{metrics:?}");
    assert!(metric(&format!("dsc_moe_expert_tokens_total{{layer=\"2\",expert=")) > 0.0, "{metrics:?}");
    // serving goes on at load, the expert still disabled
    let json = d.path().join("load.json");
    let out = python("load.py", &[&s.base, "ds-v3-tiny", "test-key", "--clients", "64", "--max-tokens", "16", "--json", json.to_str().unwrap()]);
    assert!(out.contains("64 concurrent streams complete, 64 equal to solo runs"), "{out}");
    let load: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    eprintln!("load on the DeepSeek-V3 tiny plan: {load}");
    assert!(load["preemptions"].as_f64().unwrap() > 0.0 && load["prefix_cache_hit_tokens"].as_f64().unwrap() > 0.0, "{load}");
    stop(s);
}
