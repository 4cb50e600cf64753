//! Structured output by constrained decoding (OpenAI's `response_format`: `json_object`,
//! `json_schema`; and `guided_regex`, vLLM's extension): before each sampled token the logits of
//! every token the grammar does not allow next are set to -inf, and the chosen token advances
//! the grammar. The grammars and masks are llguidance's (the library vLLM and SGLang use), over
//! a token trie built once from the plan's tokenizer ([`Grammars`]). A constrained sequence
//! samples from the logits on the host (it leaves the on-device greedy path); it ends when the
//! grammar is complete or the model ends it where the grammar allows (EOS).

use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;

/// What a request constrains its output to.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// any JSON object (OpenAI's `json_object`)
    JsonObject,
    /// a JSON value valid under this schema (OpenAI's `json_schema`)
    JsonSchema(Value),
    /// text matching this regular expression (vLLM's `guided_regex`)
    Regex(String),
    /// a Lark grammar (llguidance's dialect; a required tool call's, `crate::tools`)
    Lark(String),
}

/// The token trie and grammar compiler of one tokenizer (built once per server).
pub struct Grammars {
    factory: ParserFactory,
}

/// The tokenizer as llguidance sees it: every token's bytes (special tokens as the marker byte
/// 0xFF then their text, so no grammar produces them by accident) and tokenization of bytes.
struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.tok.encode_text(&String::from_utf8_lossy(s)).unwrap_or_default()
    }
}

impl Grammars {
    pub fn new(tok: Arc<Tokenizer>) -> Result<Self, String> {
        let eos = *tok.info.eos_ids.first().ok_or("the model's tokenizer has no end-of-sequence token, which a grammar needs to end on")?;
        let words = tok.token_bytes();
        let info = TokRxInfo { vocab_size: words.len() as u32, tok_eos: eos, tok_bos: tok.info.bos_id, tok_pad: None, tok_unk: None, tok_end_of_turn: None };
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Env { trie, tok });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("building the grammar compiler: {e}"))?;
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// A fresh constraint for `format`; an error says what is wrong with the schema or regex.
    pub fn constraint(&self, format: &Format) -> Result<Constraint, String> {
        let g = match format {
            Format::JsonObject => TopLevelGrammar::from_json_schema(serde_json::json!({"type": "object"})),
            Format::JsonSchema(s) => TopLevelGrammar::from_json_schema(s.clone()),
            Format::Regex(r) => TopLevelGrammar::from_regex(r),
            Format::Lark(g) => TopLevelGrammar::from_lark(g.clone()),
        };
        let parser = self.factory.create_parser(g).map_err(|e| e.to_string())?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(e);
        }
        Ok(Constraint { m })
    }
}

/// One sequence's grammar state.
pub struct Constraint {
    m: Matcher,
}

impl Constraint {
    /// An independent copy in the same state (the choices of an n > 1 request).
    pub fn fork(&self) -> Constraint {
        Constraint { m: self.m.deep_clone() }
    }

    /// Set the logits of the tokens the grammar does not allow next to -inf.
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let allowed = self.m.compute_mask_or_eos().map_err(|e| format!("structured output: {e}"))?;
        if allowed.num_set() == 0 {
            return Err("structured output: the grammar allows no token here".into());
        }
        // (logits past the tokenizer's vocabulary, a padded embedding's, are never allowed)
        for (i, l) in logits.iter_mut().enumerate() {
            if i >= allowed.len() || !allowed.is_allowed(i as TokenId) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advance past the sampled token.
    pub fn consume(&mut self, t: u32) -> Result<(), String> {
        self.m.consume_token(t).map_err(|e| format!("structured output: {e}"))
    }

    /// The grammar is complete: nothing more may follow.
    pub fn done(&self) -> bool {
        self.m.is_stopped()
    }
}

/// The `response_format` (or `guided_regex`) of a request body; None for text. Errors name the
/// field.
pub fn format_of(v: &Value) -> Result<Option<Format>, (String, &'static str)> {
    if let Some(r) = v.get("guided_regex").filter(|x| !x.is_null()) {
        let r = r.as_str().ok_or(("`guided_regex` must be a string".to_string(), "guided_regex"))?;
        return Ok(Some(Format::Regex(r.to_string())));
    }
    let Some(f) = v.get("response_format").filter(|f| !f.is_null()) else { return Ok(None) };
    let bad = |m: &str| (m.to_string(), "response_format");
    match f.get("type").and_then(|t| t.as_str()) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Format::JsonObject)),
        Some("json_schema") => {
            let s = f.get("json_schema").and_then(|j| j.get("schema")).ok_or_else(|| bad("`response_format.json_schema.schema` is required for type json_schema"))?;
            if !s.is_object() && !s.is_boolean() {
                return Err(bad("`response_format.json_schema.schema` must be a JSON schema (an object)"));
            }
            Ok(Some(Format::JsonSchema(s.clone())))
        }
        _ => Err(bad("`response_format.type` must be text, json_object or json_schema")),
    }
}
