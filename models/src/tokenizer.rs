//! Tokenizers: read `tokenizer.json`, or rebuild one from GGUF metadata (byte-level BPE,
//! `tokenizer.ggml.model = "gpt2"`; SentencePiece BPE, `"llama"`). Either way the result is an HF `tokenizer.json`
//! string: the plan stores it and the runtime loads it with the `tokenizers` crate.

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use serde_json::{json, Value};
use std::path::Path;
use std::str::FromStr;

/// What the runtime needs to tokenize, detokenize and apply the chat template.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct TokenizerInfo {
    /// HF tokenizer.json
    pub json: String,
    pub bos_id: Option<u32>,
    pub eos_ids: Vec<u32>,
    pub add_bos: bool,
    pub chat_template: Option<String>,
}

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const DEEPSEEK3_SPLIT: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

fn byte_level(use_regex: bool) -> Value {
    json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex})
}

fn split(pattern: &str) -> Value {
    json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false})
}

/// The pre-tokenizer llama.cpp uses for each `tokenizer.ggml.pre` value (the same as the
/// model's HF tokenizer.json).
fn pre_tokenizer(pre: &str) -> Option<Value> {
    Some(match pre {
        "default" | "gpt2" | "gpt-2" => byte_level(true),
        "smollm" | "starcoder" => {
            json!({"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": true}, byte_level(true)]})
        }
        "llama-bpe" | "llama3" | "smaug-bpe" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3_SPLIT), byte_level(false)]})
        }
        "qwen2" | "deepseek-r1-qwen" => {
            json!({"type": "Sequence", "pretokenizers": [split(QWEN2_SPLIT), byte_level(false)]})
        }
        // (DeepSeek-V3/R1: digits in threes, CJK kana/ideograph runs, then words and punctuation)
        "deepseek-v3" => {
            json!({"type": "Sequence", "pretokenizers": [split(r"\p{N}{1,3}"), split("[一-龥぀-ゟ゠-ヿ]+"), split(DEEPSEEK3_SPLIT), byte_level(false)]})
        }
        _ => return None,
    })
}

pub fn from_gguf(g: &GgufFile) -> Result<TokenizerInfo> {
    let terr = |msg: String| ModelError::Tokenizer { path: g.path.clone(), msg };
    let model = g.str("tokenizer.ggml.model").map_err(|e| terr(e.to_string()))?;
    let tok = match model {
        "gpt2" => gpt2_json(g)?,
        "llama" => sentencepiece_json(g)?,
        other => {
            return Err(terr(format!("GGUF tokenizer model `{other}` is not supported (byte-level BPE `gpt2` and SentencePiece BPE `llama` are); set [tokenizer] path to the model's tokenizer.json")))
        }
    };
    let json = serde_json::to_string(&tok).map_err(|e| terr(e.to_string()))?;
    check_loads(&json, &g.path)?;
    let id = |k: &str| g.get(k).and_then(|v| v.as_u64()).map(|v| v as u32);
    let mut eos_ids: Vec<u32> = id("tokenizer.ggml.eos_token_id").into_iter().collect();
    if let Some(e) = id("tokenizer.ggml.eot_token_id") {
        if !eos_ids.contains(&e) {
            eos_ids.push(e);
        }
    }
    Ok(TokenizerInfo {
        json,
        bos_id: id("tokenizer.ggml.bos_token_id"),
        eos_ids,
        add_bos: g.get("tokenizer.ggml.add_bos_token").and_then(|v| v.as_bool()).unwrap_or(false),
        chat_template: g.get("tokenizer.chat_template").and_then(|v| v.as_str()).map(String::from),
    })
}

/// A tokenizer.json `added_tokens` entry: token `id` matched whole before normalization.
fn added_token(id: usize, content: &str, special: bool) -> Value {
    json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": special})
}

/// A byte-level BPE tokenizer (`tokenizer.ggml.model` = `gpt2`) as a tokenizer.json value.
fn gpt2_json(g: &GgufFile) -> Result<Value> {
    let terr = |msg: String| ModelError::Tokenizer { path: g.path.clone(), msg };
    let pre = g.get("tokenizer.ggml.pre").and_then(|v| v.as_str()).unwrap_or("default");
    let pre_tok = pre_tokenizer(pre).ok_or_else(|| terr(format!("GGUF pre-tokenizer `{pre}` is not supported; set [tokenizer] path to the model's tokenizer.json")))?;
    let tokens = g.str_array("tokenizer.ggml.tokens").map_err(|e| terr(e.to_string()))?;
    let merges = g.str_array("tokenizer.ggml.merges").map_err(|e| terr(e.to_string()))?;
    let types = g.u64_array("tokenizer.ggml.token_type").ok();
    let mut vocab = serde_json::Map::new();
    let mut added = vec![];
    for (i, t) in tokens.iter().enumerate() {
        vocab.insert(t.to_string(), json!(i));
        // 3 = control, 4 = user-defined: matched as whole tokens before BPE
        if let Some(ty) = types.as_ref().and_then(|v| v.get(i)) {
            if *ty == 3 || *ty == 4 {
                added.push(added_token(i, t, *ty == 3));
            }
        }
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre_tok,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
            "vocab": vocab, "merges": merges,
        }
    }))
}

/// A SentencePiece BPE tokenizer (`tokenizer.ggml.model` = `llama`: Llama-2, Mistral,
/// TinyLlama GGUFs) as a tokenizer.json value, built as transformers converts a SentencePiece
/// model so that it encodes as `SentencePieceProcessor.encode` does: the merges of the normal
/// pieces (token type 1) ranked by their scores (`tokenizer.ggml.scores`, ties by id), unknown
/// text as `<0xNN>` byte pieces where the vocabulary has them (type 6), spaces escaped to `▁`
/// and the dummy prefix (`tokenizer.ggml.add_space_prefix`, default true) before the text and
/// every piece between control tokens; user-defined pieces (type 4) emitted whole. Control tokens
/// (type 3: `<s>`, `</s>`) are special added tokens, as in HF's Llama tokenizers, so a chat
/// template's `<s>` is the bos id. (GGUF does not carry SentencePiece's normalizer spec:
/// identity normalization and no extra-whitespace removal are assumed, as llama.cpp does.)
fn sentencepiece_json(g: &GgufFile) -> Result<Value> {
    let terr = |msg: String| ModelError::Tokenizer { path: g.path.clone(), msg };
    let tokens = g.str_array("tokenizer.ggml.tokens").map_err(|e| terr(e.to_string()))?;
    let scores: Vec<f64> = match g.get("tokenizer.ggml.scores") {
        Some(crate::gguf::Value::Array(v)) => v.iter().map(|x| x.as_f64().ok_or_else(|| terr("tokenizer.ggml.scores holds a non-number".into()))).collect::<Result<_>>()?,
        _ => return Err(terr("metadata key `tokenizer.ggml.scores` is missing: a SentencePiece (`llama`) tokenizer ranks its merges by the piece scores".into())),
    };
    let types = g.u64_array("tokenizer.ggml.token_type").map_err(|e| terr(e.to_string()))?;
    if scores.len() != tokens.len() || types.len() != tokens.len() {
        return Err(terr(format!("{} tokens, {} scores and {} token types: they must agree", tokens.len(), scores.len(), types.len())));
    }
    let prefix = g.get("tokenizer.ggml.add_space_prefix").and_then(|v| v.as_bool()).unwrap_or(true);
    let unk_id = g.get("tokenizer.ggml.unknown_token_id").and_then(|v| v.as_u64()).map(|v| v as usize).or_else(|| types.iter().position(|&t| t == 2));
    let unk = unk_id.and_then(|i| tokens.get(i)).map(|s| s.to_string());
    let mut vocab = serde_json::Map::new();
    let mut normal: std::collections::HashMap<&str, (f64, usize)> = Default::default();
    let mut added = vec![];
    let mut user_defined = vec![];
    for (i, (t, ty)) in tokens.iter().zip(&types).enumerate() {
        vocab.insert(t.to_string(), json!(i));
        match ty {
            1 => {
                normal.insert(t, (scores[i], i));
            }
            // (control tokens match before normalization, as HF's Llama tokenizers have them;
            // user-defined ones are isolated after it, as SentencePiece does — no dummy prefix
            // after them)
            3 => added.push(added_token(i, t, true)),
            4 => user_defined.push(regex_escape(t)),
            _ => {}
        }
    }
    // the merges: every split of a normal piece into two normal pieces, best score first
    let mut ranked: Vec<(f64, usize, &str, &str)> = vec![];
    for (t, &(score, id)) in &normal {
        for (at, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(at);
            if normal.contains_key(l) && normal.contains_key(r) {
                ranked.push((-score, id, l, r));
            }
        }
    }
    ranked.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(b.2)));
    let merges: Vec<Value> = ranked.iter().map(|(_, _, l, r)| json!([l, r])).collect();
    let byte_fallback = types.contains(&6);
    let mut normalizers = vec![json!({"type": "Replace", "pattern": {"String": " "}, "content": "▁"})];
    let mut pre = vec![];
    if prefix {
        normalizers.push(json!({"type": "Replace", "pattern": {"Regex": "\\A▁"}, "content": "▁▁"}));
        pre.push(json!({"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": false}));
    }
    user_defined.sort_by_key(|s| std::cmp::Reverse(s.len()));
    if !user_defined.is_empty() {
        pre.push(json!({"type": "Split", "pattern": {"Regex": user_defined.join("|")}, "behavior": "Isolated", "invert": false}));
    }
    let mut decoders = vec![json!({"type": "Replace", "pattern": {"String": "▁"}, "content": " "})];
    if byte_fallback {
        decoders.push(json!({"type": "ByteFallback"}));
    }
    if prefix {
        decoders.push(json!({"type": "Fuse"}));
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    } else if byte_fallback {
        decoders.push(json!({"type": "Fuse"}));
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": normalizers},
        "pre_tokenizer": if pre.is_empty() { Value::Null } else { json!({"type": "Sequence", "pretokenizers": pre}) },
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": byte_fallback, "ignore_merges": !user_defined.is_empty(),
            "vocab": vocab, "merges": merges,
        }
    }))
}

/// `s` with the regex metacharacters escaped (a user-defined piece as a literal pattern).
fn regex_escape(s: &str) -> String {
    s.chars().fold(String::new(), |mut o, c| {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            o.push('\\');
        }
        o.push(c);
        o
    })
}

/// Load an HF `tokenizer.json`, with ids and the chat template from the
/// `tokenizer_config.json` beside it when present, and the end-of-sequence ids of the
/// `generation_config.json` beside it (HF's `eos_token_id`, one id or a list: Llama-3.1's ends
/// a turn on any of three) after the tokenizer's own.
pub fn from_json_file(path: &Path) -> Result<TokenizerInfo> {
    let json = std::fs::read_to_string(path).map_err(crate::error::io(path))?;
    check_loads(&json, path)?;
    let tk = tokenizers::Tokenizer::from_str(&json).map_err(|e| ModelError::Tokenizer { path: path.into(), msg: e.to_string() })?;
    let cfg_path = path.with_file_name("tokenizer_config.json");
    let cfg: Value = match std::fs::read_to_string(&cfg_path) {
        Ok(s) => serde_json::from_str(&s).map_err(|e| ModelError::Tokenizer { path: cfg_path.clone(), msg: e.to_string() })?,
        Err(_) => Value::Null,
    };
    let tok_id = |key: &str| -> Option<u32> {
        let v = &cfg[key];
        let s = v.as_str().or_else(|| v["content"].as_str())?;
        tk.token_to_id(s)
    };
    let mut eos_ids: Vec<u32> = tok_id("eos_token").into_iter().collect();
    let gen_path = path.with_file_name("generation_config.json");
    if let Ok(text) = std::fs::read_to_string(&gen_path) {
        let bad = |msg: String| ModelError::Tokenizer { path: gen_path.clone(), msg };
        let g: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let ids: Vec<&Value> = match &g["eos_token_id"] {
            Value::Null => vec![],
            Value::Array(a) => a.iter().collect(),
            v => vec![v],
        };
        let vocab = tk.get_vocab_size(true);
        for v in ids {
            let id = v.as_u64().filter(|&i| (i as usize) < vocab).ok_or_else(|| bad(format!("`eos_token_id` {v} is not a token id of the tokenizer (vocabulary {vocab})")))? as u32;
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
    }
    Ok(TokenizerInfo { json, bos_id: tok_id("bos_token"), eos_ids, add_bos: cfg["add_bos_token"].as_bool().unwrap_or(false), chat_template: cfg["chat_template"].as_str().map(String::from) })
}

fn check_loads(json: &str, path: &Path) -> Result<()> {
    tokenizers::Tokenizer::from_str(json).map(|_| ()).map_err(|e| ModelError::Tokenizer { path: path.into(), msg: format!("does not load: {e}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pieces a GGUF `tokenizer.ggml.pre` value's pre-tokenizer cuts `text` into (byte-level
    /// characters mapped back to text).
    fn pieces(pre: &str, text: &str) -> Vec<String> {
        use tokenizers::PreTokenizer;
        let p: tokenizers::PreTokenizerWrapper = serde_json::from_value(pre_tokenizer(pre).expect("known")).unwrap();
        let mut s = tokenizers::PreTokenizedString::from(text);
        p.pre_tokenize(&mut s).unwrap();
        s.get_splits(tokenizers::OffsetReferential::Original, tokenizers::OffsetType::Byte).into_iter().map(|(_, (a, b), _)| text[a..b].to_string()).collect()
    }

    /// DeepSeek-V3/R1's pre-tokenizer (`deepseek-v3`, llama.cpp's regexes): digits in threes,
    /// kana/ideograph runs apart, words with a leading space or punctuation mark, punctuation
    /// runs, newlines.
    #[test]
    fn deepseek_v3_pre_tokenizer_cuts_as_llama_cpp_does() {
        assert_eq!(pieces("deepseek-v3", "1234567 Hello, world!"), ["123", "456", "7", " Hello", ",", " world", "!"]);
        assert_eq!(pieces("deepseek-v3", "日本語です.ok\n\nx"), ["日本語です", ".ok", "\n\n", "x"]);
        assert!(pre_tokenizer("deepseek-llm").is_none(), "V2's regexes are not in yet: an error naming the pre-tokenizer, not a wrong split");
    }

    #[test]
    fn generation_config_adds_its_end_of_sequence_ids() {
        let d = tempfile::tempdir().unwrap();
        let vocab: serde_json::Map<String, Value> = ["<unk>", "<s>", "</s>", "<|eot|>", "<|eom|>", "a", "b"].iter().enumerate().map(|(i, w)| (w.to_string(), i.into())).collect();
        let tk = serde_json::json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [], "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"}, "post_processor": null, "decoder": null, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}});
        let p = d.path().join("tokenizer.json");
        std::fs::write(&p, tk.to_string()).unwrap();
        std::fs::write(d.path().join("tokenizer_config.json"), r#"{"eos_token": "</s>", "bos_token": "<s>"}"#).unwrap();
        assert_eq!(from_json_file(&p).unwrap().eos_ids, vec![2]);
        std::fs::write(d.path().join("generation_config.json"), r#"{"bos_token_id": 1, "eos_token_id": [2, 3, 4]}"#).unwrap();
        assert_eq!(from_json_file(&p).unwrap().eos_ids, vec![2, 3, 4]);
        std::fs::write(d.path().join("generation_config.json"), r#"{"eos_token_id": 4}"#).unwrap();
        assert_eq!(from_json_file(&p).unwrap().eos_ids, vec![2, 4]);
        std::fs::write(d.path().join("generation_config.json"), r#"{"eos_token_id": [2, 900]}"#).unwrap();
        let e = from_json_file(&p).unwrap_err().to_string();
        assert!(e.contains("generation_config.json") && e.contains("900"), "{e}");
    }
}
