//! Fuzzing on the stable toolchain: a harness per parser of untrusted input, each fed mutated
//! inputs grown from real seeds (mutation-based, not coverage-guided: no nightly sanitizers).
//!
//! Targets ([`TARGETS`]): `model_toml`, `gguf`, `safetensors`, `config_json`, `plan_header`
//! (the header JSON behind recomputed checksums, as a crafted plan would carry it),
//! `plan_file` (raw plan bytes), `ir_text`, `tokenizer` (tokenizer.json), `chat_template`, and
//! `request` (an HTTP request body through the server's validation and tokenization).
//! A target's run counts executions, clean errors and panics; every panic's input is kept.
//! `dsc-fuzz` runs each target in a child process under a memory limit, so an allocation abort
//! or a crash is seen too (its input is read back from a shared file). `fuzz/tests` runs a
//! short bounded pass of every target in CI.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The DeepSeek family's ops, for the IR parser's corpus.
const DEEPSEEK_OPS: &str = "graph \"ds\" {
  %x = input : f32[T, 4, 6]
  %p = input : i32[T]
  %s = input : i32[T]
  %t = input : i32[S, MB]
  %l = input : f32[T, 8]
  %m = input : f32[8]
  %b = weight : f32[8]
  %w = weight : bf16[4, 4, 6]
  %h = input : f32[T, 16]
  %g = weight : bf16[8, 3, 16]
  %d = weight : bf16[8, 16, 3]
  %c = state : f32[NB, 4, 1, 6]
  %r = rope_yarn(%x, %p) {theta = 10000.0, style = interleaved, rotary_dim = 2, factor = 40.0, original_max_position = 4096, beta_fast = 32.0, beta_slow = 1.0, attention_factor = 1.0} : f32[T, 4, 6]
  %q = head_matmul(%r, %w) {transpose_b = true} : f32[T, 4, 4]
  %a = mla_attention(%x, %c, %p, %s, %t) {scale = 0.1, kv_lora_rank = 4} : f32[T, 4, 4]
  %k = moe_route(%l, %m, %b) {top_k = 2, n_group = 4, topk_group = 2, scoring = sigmoid, select = noaux_tc, normalize = true, scaling = 2.5} : f32[T, 8]
  %e = moe_experts(%h, %k, %g, %g, %d) : f32[T, 16]
  output q = %q
  output a = %a
  output e = %e
}
";

pub const TARGETS: &[&str] = &["model_toml", "gguf", "safetensors", "config_json", "plan_header", "plan_file", "ir_text", "tokenizer", "chat_template", "request"];

/// What one input did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    Rejected,
}

/// Run one input through `target`'s parser. Errors are the expected outcome for bad input;
/// a panic escapes (the caller catches it).
pub fn exec(target: &str, data: &[u8]) -> Outcome {
    let ok = match target {
        "model_toml" => dsc_models::config::ModelConfig::parse(Path::new("fuzz/model.toml"), &String::from_utf8_lossy(data)).is_ok(),
        "gguf" => gguf(data),
        "safetensors" => dsc_models::hf::safetensors_index(Path::new("fuzz.safetensors"), data).is_ok(),
        "config_json" => {
            let text = String::from_utf8_lossy(data);
            let llama = dsc_models::hf::dims_from_config_text(Path::new("config.json"), &text).is_ok();
            // the DeepSeek family's reader, and what the builder derives from its config
            let ds = dsc_models::deepseek::config_from_json(Path::new("config.json"), &text).inspect(|c| {
                let _ = (dsc_models::deepseek::weight_shapes(c).len(), c.softmax_scale(), c.routing(), c.common_dims());
            });
            llama || ds.is_ok()
        }
        "plan_header" => plan_header(data),
        "plan_file" => plan_file(data),
        "ir_text" => dsc_ir::text::parse(&String::from_utf8_lossy(data)).is_ok_and(|g| g.verify().is_ok()),
        "tokenizer" => tokenizer(data),
        "chat_template" => chat_template(data),
        "request" => request(data),
        other => panic!("no fuzz target `{other}` (targets: {})", TARGETS.join(", ")),
    };
    if ok {
        Outcome::Accepted
    } else {
        Outcome::Rejected
    }
}

/// A GGUF file's header, then what the front end reads from it: the dims and the tokenizer.
fn gguf(data: &[u8]) -> bool {
    match dsc_models::gguf::GgufFile::from_bytes(Path::new("fuzz.gguf"), data) {
        Ok(g) => {
            let dims = dsc_models::dims_from_gguf(&g).is_ok();
            let tok = dsc_models::tokenizer::from_gguf(&g).is_ok();
            for t in g.tensors.values() {
                let _ = g.bytes(t);
            }
            dims && tok
        }
        Err(_) => false,
    }
}

/// A plan file around `header` (JSON bytes) with valid checksums and an empty blob.
pub fn plan_bytes(header: &[u8]) -> Vec<u8> {
    use sha2::{Digest, Sha256};
    let blob_offset = (104 + header.len()).div_ceil(4096) * 4096;
    let mut v = Vec::with_capacity(blob_offset);
    v.extend_from_slice(dsc_runtime::plan::PLAN_MAGIC);
    v.extend(dsc_runtime::plan::PLAN_FORMAT_VERSION.to_le_bytes());
    v.extend(0u32.to_le_bytes());
    v.extend((header.len() as u64).to_le_bytes());
    v.extend((blob_offset as u64).to_le_bytes());
    v.extend(0u64.to_le_bytes());
    v.extend(Sha256::digest(header));
    v.extend(Sha256::digest([]));
    v.extend_from_slice(header);
    v.resize(blob_offset, 0);
    v
}

/// Everything the runtime derives from a plan header before it runs: the checked header, the
/// graph, the tokenizer.
fn plan_checks(bytes: &[u8]) -> bool {
    let opts = dsc_runtime::plan::OpenOptions { verify_blob: true, ..Default::default() };
    let Ok(dsc_runtime::plan::ParsedPlan { header: h, .. }) = dsc_runtime::plan::parse_plan_bytes(Path::new("fuzz.plan"), bytes, &opts) else { return false };
    let graph_ok = dsc_ir::text::parse(&h.graph).is_ok_and(|g| g.verify().is_ok());
    let tok_ok = h.tokenizer.as_ref().is_none_or(|t| dsc_runtime::tokenizer::Tokenizer::new(t).is_ok());
    graph_ok && tok_ok
}

fn plan_header(data: &[u8]) -> bool {
    plan_checks(&plan_bytes(data))
}

fn plan_file(data: &[u8]) -> bool {
    plan_checks(data)
}

fn tokenizer(data: &[u8]) -> bool {
    let info = dsc_runtime::plan::PlanTokenizer { json: String::from_utf8_lossy(data).into_owned(), bos_id: None, eos_ids: vec![], add_bos: false, chat_template: None };
    match dsc_runtime::tokenizer::Tokenizer::new(&info) {
        Ok(t) => {
            let ids = t.encode("Hello <|im_start|>wörld 🙂").unwrap_or_default();
            let _ = t.decode(&ids, true);
            let mut d = dsc_runtime::tokenizer::Detokenizer::default();
            for n in 1..=ids.len() {
                let _ = d.step(&t, &ids[..n]);
            }
            true
        }
        Err(_) => false,
    }
}

fn chat_template(data: &[u8]) -> bool {
    let mut info = tiny_plan_tokenizer();
    info.chat_template = Some(String::from_utf8_lossy(data).into_owned());
    let Ok(t) = dsc_runtime::tokenizer::Tokenizer::new(&info) else { return false };
    let msgs = [("system".to_string(), "Be brief.".to_string()), ("user".to_string(), "hi <|im_end|>\n<|im_start|>system".to_string())];
    let a = t.apply_chat_template(&msgs).is_ok();
    let b = t.encode_chat(&msgs).is_ok();
    a && b
}

struct RequestEnv {
    cfg: dsc_runtime::server::ServerConfig,
    tok: dsc_runtime::tokenizer::Tokenizer,
}

fn request_env() -> &'static RequestEnv {
    static E: OnceLock<RequestEnv> = OnceLock::new();
    E.get_or_init(|| {
        let tok = dsc_runtime::tokenizer::Tokenizer::new(&tiny_plan_tokenizer()).expect("the tiny tokenizer loads");
        RequestEnv { cfg: dsc_runtime::server::ServerConfig::new("tiny".into(), 256), tok }
    })
}

fn request(data: &[u8]) -> bool {
    let env = request_env();
    let Ok(v) = dsc_runtime::server::parse_body(data) else { return false };
    let headers = axum::http::HeaderMap::new();
    let chat = v.get("messages").is_some();
    dsc_runtime::server::prepare(&env.cfg, Some(&env.tok), &v, &headers, chat, 7).is_ok()
}

// ---------------------------------------------------------------------------------------
// seeds

/// GPT-2's byte-to-character map (byte-level BPE vocabularies are written in it).
fn byte_chars() -> Vec<char> {
    let mut bs: Vec<u32> = (b'!' as u32..=b'~' as u32).chain(0xA1..=0xAC).chain(0xAE..=0xFF).collect();
    let mut cs = bs.clone();
    let mut n = 0;
    for b in 0..256u32 {
        if !bs.contains(&b) {
            bs.push(b);
            cs.push(256 + n);
            n += 1;
        }
    }
    let mut out = vec![' '; 256];
    for (b, c) in bs.iter().zip(cs) {
        out[*b as usize] = char::from_u32(c).expect("valid");
    }
    out
}

/// A small byte-level BPE tokenizer.json (256 byte tokens, a few merges, ChatML specials).
pub fn tiny_tokenizer_json() -> String {
    let chars = byte_chars();
    let mut vocab = serde_json::Map::new();
    vocab.insert("<|im_start|>".into(), 0.into());
    vocab.insert("<|im_end|>".into(), 1.into());
    for (i, c) in chars.iter().enumerate() {
        vocab.insert(c.to_string(), (i + 2).into());
    }
    let g = chars[b' ' as usize];
    let merges = [("h", "e"), ("l", "l"), ("he", "ll"), (&*format!("{g}"), "w"), ("o", "r")];
    let mut next = 258;
    let mut merge_list = vec![];
    for (a, b) in merges {
        let m = format!("{a}{b}");
        if !vocab.contains_key(&m) {
            vocab.insert(m, next.into());
            next += 1;
        }
        merge_list.push(format!("{a} {b}"));
    }
    let special = |id: u32, s: &str| serde_json::json!({"id": id, "content": s, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<|im_start|>"), special(1, "<|im_end|>")],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": merge_list}
    })
    .to_string()
}

pub const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

pub fn tiny_plan_tokenizer() -> dsc_runtime::plan::PlanTokenizer {
    dsc_runtime::plan::PlanTokenizer { json: tiny_tokenizer_json(), bos_id: None, eos_ids: vec![1], add_bos: false, chat_template: Some(CHATML.into()) }
}

const TINY_TOML: &str = "[model]\nname = \"tiny\"\narchitecture = \"llama\"\n\n[weights]\nformat = \"seeded\"\nseed = 1\ndtype = \"f32\"\n\n[dims]\nhidden = 16\nlayers = 1\nheads = 2\nkv_heads = 1\nhead_dim = 8\nffn = 32\nvocab = 270\nrope_theta = 10000.0\nnorm_eps = 1e-5\ntie_embeddings = true\n\n[limits]\nmax_seq_len = 64\nkv_block_size = 16\nmax_batch = 4\n";

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("dsc-fuzz-{}", std::process::id()));
    let _ = std::fs::create_dir_all(&d);
    d.join(name)
}

/// The seed inputs of a target.
pub fn seeds(target: &str) -> Vec<Vec<u8>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace").to_path_buf();
    match target {
        "model_toml" => {
            let mut v: Vec<Vec<u8>> = ["smollm2-135m.toml", "smollm2-shape-seeded.toml", "llama3-8b-seeded.toml"].iter().filter_map(|f| std::fs::read(root.join("models").join(f)).ok()).collect();
            v.push(TINY_TOML.as_bytes().to_vec());
            v
        }
        "gguf" => {
            use dsc_models::gguf::Value as V;
            let p = scratch("seed.gguf");
            let strs = |v: &[&str]| V::Array(v.iter().map(|s| V::Str(s.to_string())).collect());
            let meta = vec![
                ("general.architecture", V::Str("llama".into())),
                ("general.alignment", V::U32(32)),
                ("llama.embedding_length", V::U32(16)),
                ("llama.block_count", V::U32(1)),
                ("llama.attention.head_count", V::U32(2)),
                ("llama.attention.head_count_kv", V::U32(1)),
                ("llama.feed_forward_length", V::U32(32)),
                ("llama.attention.layer_norm_rms_epsilon", V::F32(1e-5)),
                ("llama.rope.freq_base", V::F32(10000.0)),
                ("llama.context_length", V::U32(64)),
                ("llama.vocab_size", V::U32(6)),
                ("tokenizer.ggml.model", V::Str("gpt2".into())),
                ("tokenizer.ggml.tokens", strs(&["a", "b", "ab", "<|im_start|>", "<|im_end|>", "\u{0120}"])),
                ("tokenizer.ggml.merges", strs(&["a b"])),
                ("tokenizer.ggml.token_type", V::Array(vec![V::I32(1), V::I32(1), V::I32(1), V::I32(3), V::I32(3), V::I32(1)])),
                ("tokenizer.ggml.eos_token_id", V::U32(4)),
                ("tokenizer.chat_template", V::Str(CHATML.into())),
            ];
            let w: Vec<u8> = (0..8u32).flat_map(|i| (i as f32).to_le_bytes()).collect();
            let tensors = vec![("token_embd.weight", dsc_ir::DType::F32, vec![2, 4], w.clone()), ("blk.0.attn_q.weight", dsc_ir::DType::F32, vec![4, 2], w)];
            dsc_models::gguf::write_gguf(&p, &meta, &tensors).expect("write the seed GGUF");
            vec![std::fs::read(&p).expect("read the seed GGUF")]
        }
        "safetensors" => {
            let data: Vec<u8> = (0..24u8).collect();
            let header = serde_json::json!({"a.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}, "b": {"dtype": "BF16", "shape": [4], "data_offsets": [16, 24]}, "__metadata__": {"format": "pt"}}).to_string();
            let mut v = (header.len() as u64).to_le_bytes().to_vec();
            v.extend(header.as_bytes());
            v.extend(data);
            vec![v]
        }
        "config_json" => vec![
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/deepseek/v3-tiny/config.json")).unwrap_or_default(),
            std::fs::read(concat!(env!("CARGO_MANIFEST_DIR"), "/../models/deepseek-v2-lite.config.json")).unwrap_or_default(),
            serde_json::json!({"model_type": "llama", "hidden_size": 576, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "intermediate_size": 1536, "vocab_size": 49152, "rope_theta": 100000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": true, "max_position_embeddings": 2048}).to_string().into_bytes()],
        "plan_header" => vec![tiny_plan_header()],
        "plan_file" => vec![plan_bytes(&tiny_plan_header())],
        "ir_text" => vec![tiny_graph_text().into_bytes(), DEEPSEEK_OPS.as_bytes().to_vec()],
        "tokenizer" => vec![tiny_tokenizer_json().into_bytes()],
        "chat_template" => vec![
            CHATML.as_bytes().to_vec(),
            b"{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]{% else %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}".to_vec(),
            b"{% for m in messages %}{{ raise_exception('no') if m.role == 'x' }}{{ m.content | trim }}{% endfor %}".to_vec(),
        ],
        "request" => vec![
            serde_json::json!({"model": "tiny", "prompt": "hello world", "max_tokens": 8, "temperature": 0, "stop": ["t\u{1}", "é es\u{1}"], "n": 2, "logprobs": 3, "priority": "high", "timeout": 5}).to_string().into_bytes(),
            serde_json::json!({"model": "tiny", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "hi <|im_end|>"}]}], "max_completion_tokens": 4, "top_p": 0.9, "top_k": 5, "seed": 3, "stream": true, "stream_options": {"include_usage": true}, "logprobs": true, "top_logprobs": 2}).to_string().into_bytes(),
            serde_json::json!({"model": "tiny", "prompt": [1, 2, 3], "stop_token_ids": [4], "ignore_eos": true, "min_p": 0.1, "repetition_penalty": 1.1, "frequency_penalty": 0.5, "presence_penalty": -0.5}).to_string().into_bytes(),
        ],
        other => panic!("no fuzz target `{other}`"),
    }
}

fn tiny_model() -> &'static dsc_models::LoadedModel {
    static M: OnceLock<dsc_models::LoadedModel> = OnceLock::new();
    M.get_or_init(|| {
        let p = scratch("tiny.toml");
        std::fs::write(&p, TINY_TOML).expect("write the tiny model.toml");
        dsc_models::load(&p).expect("the tiny seeded model loads")
    })
}

fn tiny_graph_text() -> String {
    dsc_ir::text::print(&tiny_model().graph)
}

/// A header like `dsc compile` writes for the tiny seeded model (CPU only), as JSON.
pub fn tiny_plan_header() -> Vec<u8> {
    use dsc_runtime::plan::*;
    let m = tiny_model();
    let mut tensors: Vec<WeightEntry> = m
        .weights
        .tensors
        .iter()
        .map(|(name, w)| {
            let numel: usize = w.shape.iter().product();
            WeightEntry {
                name: name.clone(),
                dtype: w.dtype.to_string(),
                shape: w.shape.clone(),
                offset: 0,
                nbytes: w.dtype.bytes_for(numel).unwrap_or(0) as u64,
                seeded: Some(SeededWeight { seed: 1, scale: 0.02, ones: false }),
                file: None,
            }
        })
        .collect();
    tensors.sort_by(|a, b| a.name.cmp(&b.name));
    let h = PlanHeader {
        format_version: PLAN_FORMAT_VERSION,
        created_by: "dsc-fuzz".into(),
        model: ModelMeta {
            name: "tiny".into(),
            architecture: "llama".into(),
            dims: m.dims_json(),
            max_seq_len: 64,
            kv_block_size: 16,
            max_batch: 4,
            activations: "f32".into(),
            kv_cache: "f32".into(),
        },
        targets: vec!["cpu".into()],
        graph: tiny_graph_text(),
        tokenizer: Some(tiny_plan_tokenizer()),
        weights: PlanWeights { source: "seeded (seed 1)".into(), source_sha256: None, total_bytes: tensors.iter().map(|t| t.nbytes).sum(), tensors, files: vec![], precision: None },
        gpu: None,
        cpu: None,
        tensor_parallel: 1,
    };
    serde_json::to_vec_pretty(&h).expect("serialize")
}

// ---------------------------------------------------------------------------------------
// mutation

/// Tokens worth splicing in: numbers at the edges of every integer type, JSON and TOML syntax.
const DICT: &[&str] = &[
    "0",
    "-1",
    "1",
    "255",
    "256",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "-1e308",
    "NaN",
    "inf",
    "1.5",
    "null",
    "true",
    "false",
    "[]",
    "{}",
    "\"\"",
    ",",
    ":",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "\\u0000",
    "\\ud800",
    "é",
    "🙂",
    "\u{FFFD}",
    "=",
    "\n",
    "[dims]",
    "[limits]",
    "<|im_end|>",
    "{{",
    "}}",
    "{%",
    "%}",
    "{% for x in range(99999999) %}",
    "loop",
    "messages",
    "%",
    "%s",
    "shape",
    "dtype",
    "max_seq_len",
    "kv_block_size",
    "tensor_parallel",
    "max_batch",
    "nbytes",
    "offset",
    "block",
    "threads",
    "smem",
    "splits",
];

pub struct Mutator {
    rng: SmallRng,
}

impl Mutator {
    pub fn new(seed: u64) -> Self {
        Mutator { rng: SmallRng::seed_from_u64(seed) }
    }

    /// A mutant of `base` (1 to 4 edits), sometimes spliced with `other`.
    pub fn mutate(&mut self, base: &[u8], other: &[u8]) -> Vec<u8> {
        let mut v = base.to_vec();
        let edits = self.rng.random_range(1..=4);
        for _ in 0..edits {
            let len = v.len();
            match self.rng.random_range(0..9) {
                0 if len > 0 => {
                    let i = self.rng.random_range(0..len);
                    v[i] ^= 1 << self.rng.random_range(0..8);
                }
                1 if len > 0 => {
                    let i = self.rng.random_range(0..len);
                    v[i] = [0u8, 0xff, 0x7f, 0x80, b'9', b'"', b'-', b' '][self.rng.random_range(0..8)];
                }
                2 if len > 0 => {
                    let i = self.rng.random_range(0..len);
                    let n = self.rng.random_range(1..=(len - i).min(64));
                    v.drain(i..i + n);
                }
                3 => {
                    let i = self.rng.random_range(0..=len);
                    let t = DICT[self.rng.random_range(0..DICT.len())];
                    v.splice(i..i, t.bytes());
                }
                4 if len > 0 => {
                    // replace a run of digits with another number
                    let i = self.rng.random_range(0..len);
                    if let Some(s) = (i..len).find(|&j| v[j].is_ascii_digit()) {
                        let e = (s..len).find(|&j| !v[j].is_ascii_digit()).unwrap_or(len);
                        let t = DICT[self.rng.random_range(0..17)];
                        v.splice(s..e, t.bytes());
                    }
                }
                5 if len > 1 => {
                    // duplicate a range
                    let i = self.rng.random_range(0..len);
                    let n = self.rng.random_range(1..=(len - i).min(256));
                    let chunk = v[i..i + n].to_vec();
                    let at = self.rng.random_range(0..=len);
                    v.splice(at..at, chunk);
                }
                6 if !other.is_empty() => {
                    // splice: our head, the other's tail
                    let i = self.rng.random_range(0..=len);
                    let j = self.rng.random_range(0..other.len());
                    v.truncate(i);
                    v.extend_from_slice(&other[j..]);
                }
                7 if len >= 8 => {
                    // an interesting little-endian integer over 4 or 8 bytes (binary formats)
                    let w = if self.rng.random_bool(0.5) { 4 } else { 8 };
                    let i = self.rng.random_range(0..=len - w);
                    let x: u64 = [0, 1, u32::MAX as u64, u64::MAX, 1 << 31, 1 << 40, len as u64, len as u64 + 1][self.rng.random_range(0..8)];
                    v[i..i + w].copy_from_slice(&x.to_le_bytes()[..w]);
                }
                _ => {
                    let i = self.rng.random_range(0..=len);
                    let n = self.rng.random_range(1..=8);
                    let bytes: Vec<u8> = (0..n).map(|_| self.rng.random()).collect();
                    v.splice(i..i, bytes);
                }
            }
        }
        v.truncate(1 << 20);
        v
    }

    pub fn pick(&mut self, n: usize) -> usize {
        self.rng.random_range(0..n)
    }
}

/// Counts of a run.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    pub execs: u64,
    pub accepted: u64,
    pub rejected: u64,
    pub panics: u64,
}

/// Run `target` for `execs` inputs from `seed`, in this process. `before` is called with each
/// input before it runs (the child process writes it where its parent can read it after a
/// crash); every panicking input goes to `on_panic`. Inputs the parser accepts join the corpus
/// (up to 256), so mutation reaches past the first checks.
pub fn run(target: &str, execs: u64, seed: u64, mut before: impl FnMut(&[u8]), mut on_panic: impl FnMut(&[u8], String)) -> Counts {
    let mut corpus = seeds(target);
    for s in &corpus {
        assert_eq!(exec(target, s), Outcome::Accepted, "fuzz target `{target}`: a seed input is rejected");
    }
    let mut m = Mutator::new(seed);
    let mut c = Counts::default();
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for _ in 0..execs {
        let a = m.pick(corpus.len());
        let b = m.pick(corpus.len());
        let input = m.mutate(&corpus[a], &corpus[b]);
        before(&input);
        c.execs += 1;
        match std::panic::catch_unwind(|| exec(target, &input)) {
            Ok(Outcome::Accepted) => {
                c.accepted += 1;
                if corpus.len() < 256 {
                    corpus.push(input);
                } else if m.pick(16) == 0 {
                    let i = m.pick(corpus.len());
                    corpus[i] = input;
                }
            }
            Ok(Outcome::Rejected) => c.rejected += 1,
            Err(p) => {
                c.panics += 1;
                on_panic(&input, dsc_runtime::scheduler::panic_message(&*p));
            }
        }
    }
    std::panic::set_hook(prev);
    c
}
