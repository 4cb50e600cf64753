//! Tokenize, detokenize and apply the chat template, from what the plan carries.

use crate::error::{Result, RuntimeError};
use crate::plan::PlanTokenizer;
use std::str::FromStr;

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
