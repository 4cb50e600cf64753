//! Tokenize, detokenize and apply the chat template, from what the plan carries.

use crate::error::{Result, RuntimeError};
use crate::plan::PlanTokenizer;
use std::str::FromStr;

/// Incremental detokenization of a growing token sequence (the prefix/read-offset scheme of
/// vLLM and TGI): each step decodes only a short window — the tokens from `prefix` on, against
/// the same window up to `read` — so a stream costs O(window) per token instead of re-decoding
/// everything generated (O(n) per token, O(n²) per stream). Decoding from a token boundary a
/// few tokens back keeps what tokenizers do at the start of a text (a dropped leading space)
/// out of the delta, and a window ending in an incomplete UTF-8 character (U+FFFD) waits for
/// the next token. The concatenated deltas plus [`Detokenizer::flush`] equal the full decode
/// (tested on the SmolLM2 tokenizer over real text and random ids).
#[derive(Clone, Debug, Default)]
pub struct Detokenizer {
    prefix: usize,
    read: usize,
}

impl Detokenizer {
    /// The text the newest ids add (`ids`: every id so far; the new ones at the end). Empty
    /// while the window ends inside a character.
    pub fn step(&mut self, tk: &Tokenizer, ids: &[u32]) -> String {
        self.advance(tk, ids, false)
    }

    /// The text the newest ids add, and whatever was still held back: the end of the stream
    /// (an incomplete character decodes as U+FFFD, as the full decode would).
    pub fn flush(&mut self, tk: &Tokenizer, ids: &[u32]) -> String {
        self.advance(tk, ids, true)
    }

    fn advance(&mut self, tk: &Tokenizer, ids: &[u32], last: bool) -> String {
        let before = tk.decode_or_empty(&ids[self.prefix..self.read]);
        let now = tk.decode_or_empty(&ids[self.prefix..]);
        let grew = now.len() > before.len() && now.is_char_boundary(before.len()) && now.starts_with(&before);
        if last {
            self.prefix = ids.len();
            self.read = ids.len();
        } else if grew && !now.ends_with('\u{FFFD}') {
            self.prefix = self.read;
            self.read = ids.len();
        } else {
            return String::new();
        }
        if grew {
            now[before.len()..].to_string()
        } else {
            String::new()
        }
    }
}

pub struct Tokenizer {
    tk: tokenizers::Tokenizer,
    pub info: PlanTokenizer,
}

impl Tokenizer {
    pub fn new(info: &PlanTokenizer) -> Result<Self> {
        let tk = tokenizers::Tokenizer::from_str(&info.json).map_err(|e| RuntimeError::Tokenizer(e.to_string()))?;
        Ok(Tokenizer { tk, info: info.clone() })
    }

    /// Token ids of `text` as-is (special tokens such as `<|im_start|>` recognized), with the
    /// BOS token first when the model asks for it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.tk.encode(text, false).map_err(|e| RuntimeError::Tokenizer(e.to_string()))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.info.add_bos {
            if let Some(b) = self.info.bos_id {
                ids.push(b);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        self.tk.decode(ids, skip_special).map_err(|e| RuntimeError::Tokenizer(e.to_string()))
    }

    /// Decode, or nothing when the ids do not decode (a partial text is better than none for
    /// a stream already under way).
    fn decode_or_empty(&self, ids: &[u32]) -> String {
        self.decode(ids, true).unwrap_or_default()
    }

    pub fn vocab_size(&self) -> usize {
        self.tk.get_vocab_size(true)
    }

    pub fn token_to_id(&self, s: &str) -> Option<u32> {
        self.tk.token_to_id(s)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.tk.id_to_token(id)
    }

    pub fn is_eos(&self, id: u32) -> bool {
        self.info.eos_ids.contains(&id)
    }

    /// Render the model's chat template over `messages` (role, content), with the
    /// generation prompt appended.
    pub fn apply_chat_template(&self, messages: &[(String, String)]) -> Result<String> {
        let tpl = self.info.chat_template.as_deref().ok_or_else(|| RuntimeError::Template("the model has no chat template".into()))?;
        let mut env = minijinja::Environment::new();
        env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> { Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg)) });
        env.add_template("chat", tpl).map_err(|e| RuntimeError::Template(e.to_string()))?;
        let msgs: Vec<_> = messages.iter().map(|(r, c)| minijinja::context! { role => r, content => c }).collect();
        let tok = |id: Option<u32>| id.and_then(|i| self.tk.id_to_token(i)).unwrap_or_default();
        env.get_template("chat")
            .and_then(|t| {
                t.render(minijinja::context! {
                    messages => msgs,
                    add_generation_prompt => true,
                    bos_token => tok(self.info.bos_id),
                    eos_token => tok(self.info.eos_ids.first().copied()),
                })
            })
            .map_err(|e| RuntimeError::Template(e.to_string()))
    }
}
