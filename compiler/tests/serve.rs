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
