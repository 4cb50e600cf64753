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

/// Bounds on what a plan's tokenizer may hold (a plan from elsewhere is untrusted input).
pub const MAX_TOKENIZER_JSON_BYTES: usize = 64 << 20;
pub const MAX_VOCAB: usize = 4 << 20;
pub const MAX_CHAT_TEMPLATE_BYTES: usize = 256 << 10;
/// minijinja instructions one chat-template rendering may take (a template that loops forever
/// fails instead of hanging the request)
pub const TEMPLATE_FUEL: u64 = 20_000_000;

/// The environment chat templates render in, as HF's `apply_chat_template` builds it
/// (transformers' `_compile_jinja_template`): `trim_blocks` and `lstrip_blocks` on, loop
/// controls (`{% break %}`, `{% continue %}`), `raise_exception`, `strftime_now` and its own
/// `tojson` (Python's `json.dumps`: ", " and ": " separators, non-ASCII kept, no HTML escaping,
/// `indent`); Python's str / dict / list methods templates call (`.strip()`, `.split()`,
/// `.items()`, `.startswith()`, ...) by minijinja-contrib's pycompat. Fuel and recursion bounded.
pub fn chat_environment() -> minijinja::Environment<'static> {
    let mut env = minijinja::Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_recursion_limit(64);
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", |msg: String| -> std::result::Result<String, minijinja::Error> { Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg)) });
    env.add_function("strftime_now", |fmt: String| strftime_now(&fmt));
    env.add_filter("tojson", tojson);
    env
}

/// HF's `tojson`: `json.dumps(x, ensure_ascii=False, indent=indent)`.
fn tojson(v: minijinja::Value, kwargs: minijinja::value::Kwargs) -> std::result::Result<String, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    kwargs.assert_all_used()?;
    let j = serde_json::to_value(&v).map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    let mut out = vec![];
    let r = match indent {
        Some(n) => {
            let pad = vec![b' '; n];
            serde::Serialize::serialize(&j, &mut serde_json::Serializer::with_formatter(&mut out, serde_json::ser::PrettyFormatter::with_indent(&pad)))
        }
        None => serde::Serialize::serialize(&j, &mut serde_json::Serializer::with_formatter(&mut out, PyJson)),
    };
    r.map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("tojson: {e}")))?;
    Ok(String::from_utf8(out).expect("serde_json writes UTF-8"))
}

/// Python's `json.dumps` separators without indent: ", " between items, ": " after keys.
struct PyJson;

impl serde_json::ser::Formatter for PyJson {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, w: &mut W, first: bool) -> std::io::Result<()> {
        if first {
            Ok(())
        } else {
            w.write_all(b", ")
        }
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b": ")
    }
}

/// HF's `strftime_now(format)`: the current UTC time in strftime's format.
fn strftime_now(fmt: &str) -> std::result::Result<String, minijinja::Error> {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format_utc(secs, fmt)
}

/// strftime of `secs` since the epoch (UTC) for [`strftime_now`] (chrono's strftime); a
/// directive it does not know is an error naming the format.
fn format_utc(secs: u64, fmt: &str) -> std::result::Result<String, minijinja::Error> {
    use std::fmt::Write;
    let bad = || minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("strftime_now: `{fmt}` is not a strftime format"));
    let t = chrono::DateTime::from_timestamp(secs as i64, 0).ok_or_else(bad)?;
    let mut out = String::new();
    write!(out, "{}", t.format(fmt)).map_err(|_| bad())?;
    Ok(out)
}
/// bytes a rendered chat prompt may have
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// GPT-2's bytes_to_unicode: the character byte-level BPE vocabularies write for each byte
/// (index = byte): printable bytes stand for themselves, the rest for 256 + their rank.
pub fn byte_level_chars() -> Vec<char> {
    let mut next = 0u32;
    (0u32..256)
        .map(|b| {
            let printable = (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
            let c = if printable {
                b
            } else {
                next += 1;
                255 + next
            };
            char::from_u32(c).expect("a valid char")
        })
        .collect()
}

/// A chat turn as the template sees it (OpenAI's message fields, as HF's `apply_chat_template`
/// passes them): `role`; `content`, none for an assistant turn of tool calls only; an
/// assistant's past `tool_calls` (OpenAI's list); a tool result's `tool_call_id` and `name`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ChatTurn {
    pub role: String,
    pub content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

fn turns(messages: &[(String, String)]) -> Vec<ChatTurn> {
    messages.iter().map(|(r, c)| ChatTurn { role: r.clone(), content: Some(c.clone()), ..Default::default() }).collect()
}

/// How the chat template takes an assistant's past tool calls: whether it reads `tool_calls`,
/// and whether it writes their `arguments` with `tojson` (so wants them as objects, as
/// transformers' templates do). Read once from the template's text.
#[derive(Clone, Copy, Debug, Default)]
pub struct TemplateToolCalls {
    pub structured: bool,
    pub arguments_as_json: bool,
}

impl TemplateToolCalls {
    fn of(template: &str) -> Self {
        let squeezed: String = template.chars().filter(|c| !c.is_whitespace()).collect();
        TemplateToolCalls { structured: template.contains("tool_calls"), arguments_as_json: squeezed.contains("arguments|tojson") }
    }
}

pub struct Tokenizer {
    tk: tokenizers::Tokenizer,
    /// the same, with special tokens encoded as plain text (for message content)
    plain: tokenizers::Tokenizer,
    /// special tokens' texts, longest first
    specials: Vec<(String, u32)>,
    pub info: PlanTokenizer,
    pub template_tool_calls: TemplateToolCalls,
}

impl Tokenizer {
    pub fn new(info: &PlanTokenizer) -> Result<Self> {
        let err = |m: String| RuntimeError::Tokenizer(m);
        if info.json.len() > MAX_TOKENIZER_JSON_BYTES {
            return Err(err(format!("tokenizer.json is {} bytes, over the {MAX_TOKENIZER_JSON_BYTES}-byte limit", info.json.len())));
        }
        if info.chat_template.as_ref().is_some_and(|t| t.len() > MAX_CHAT_TEMPLATE_BYTES) {
            return Err(RuntimeError::Template(format!("the chat template is over the {MAX_CHAT_TEMPLATE_BYTES}-byte limit")));
        }
        // (the tokenizers crate can panic on malformed models it accepted: a crafted plan's
        // tokenizer is an error here, not a crash)
        let tk = std::panic::catch_unwind(|| tokenizers::Tokenizer::from_str(&info.json))
            .map_err(|_| err("tokenizer.json: the tokenizer library failed on it (malformed)".into()))?
            .map_err(|e| err(e.to_string()))?;
        let vocab = tk.get_vocab_size(true);
        if vocab == 0 || vocab > MAX_VOCAB {
            return Err(err(format!("the tokenizer's vocabulary has {vocab} tokens (1 to {MAX_VOCAB} allowed)")));
        }
        for id in info.bos_id.iter().chain(&info.eos_ids) {
            if *id as usize >= vocab {
                return Err(err(format!("special token id {id} is outside the tokenizer's vocabulary ({vocab})")));
            }
        }
        let mut plain = tk.clone();
        plain.set_encode_special_tokens(true);
        let mut specials: Vec<(String, u32)> = tk.get_added_tokens_decoder().into_iter().filter(|(_, t)| t.special && !t.content.is_empty()).map(|(id, t)| (t.content, id)).collect();
        specials.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        let template_tool_calls = info.chat_template.as_deref().map(TemplateToolCalls::of).unwrap_or_default();
        Ok(Tokenizer { tk, plain, specials, info: info.clone(), template_tool_calls })
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

    /// Token ids of `text` with special-token text left as text, no BOS.
    pub fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        self.encode_plain(text)
    }

    /// Every token's bytes, by id (structured output's token trie): byte-level BPE tokens
    /// (GPT-2's byte-to-character map: SmolLM2, Llama-3, Qwen) mapped back to their bytes,
    /// SentencePiece byte tokens `<0xNN>` as that byte and `▁` as a space, special tokens as
    /// 0xFF then their text (the trie's marker: never produced by text), ids without a token
    /// empty.
    pub fn token_bytes(&self) -> Vec<Vec<u8>> {
        let byte_level = self.info.json.contains("\"ByteLevel\"");
        let map: std::collections::HashMap<char, u8> = byte_level_chars().into_iter().zip(0u8..=255).collect();
        let special: std::collections::HashMap<u32, &str> = self.specials.iter().map(|(t, id)| (*id, t.as_str())).collect();
        (0..self.vocab_size() as u32)
            .map(|id| {
                if let Some(t) = special.get(&id) {
                    return [&[0xFFu8][..], t.as_bytes()].concat();
                }
                let Some(t) = self.tk.id_to_token(id) else { return vec![] };
                if byte_level {
                    if let Some(b) = t.chars().map(|c| map.get(&c).copied()).collect::<Option<Vec<u8>>>() {
                        return b;
                    }
                }
                if t.len() == 6 && t.starts_with("<0x") && t.ends_with('>') {
                    if let Ok(b) = u8::from_str_radix(&t[3..5], 16) {
                        return vec![b];
                    }
                }
                t.replace('\u{2581}', " ").into_bytes()
            })
            .collect()
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
    /// generation prompt appended (under [`TEMPLATE_FUEL`] and [`MAX_RENDERED_BYTES`]).
    pub fn apply_chat_template(&self, messages: &[(String, String)]) -> Result<String> {
        self.render_chat(messages, None)
    }

    /// [`Tokenizer::apply_chat_template`] with the request's `tools` (OpenAI's list) in the
    /// template's `tools` variable, as HF's `apply_chat_template(tools=...)` passes them.
    pub fn render_chat(&self, messages: &[(String, String)], tools: Option<&serde_json::Value>) -> Result<String> {
        self.render_turns(&turns(messages), tools, None)
    }

    /// The chat template rendered over `turns` (their structured fields as HF passes them), with
    /// `tools` and the request's `chat_template_kwargs` (`kwargs`: further template variables,
    /// e.g. Llama's `date_string`; they may not replace the ones set here).
    pub fn render_turns(&self, turns: &[ChatTurn], tools: Option<&serde_json::Value>, kwargs: Option<&serde_json::Map<String, serde_json::Value>>) -> Result<String> {
        let tpl = self.info.chat_template.as_deref().ok_or_else(|| RuntimeError::Template("the model has no chat template".into()))?;
        let mut env = chat_environment();
        env.add_template("chat", tpl).map_err(|e| RuntimeError::Template(e.to_string()))?;
        let tok = |id: Option<u32>| id.and_then(|i| self.tk.id_to_token(i)).unwrap_or_default();
        let mut ctx = serde_json::Map::new();
        ctx.insert("messages".into(), serde_json::to_value(turns).map_err(|e| RuntimeError::Template(e.to_string()))?);
        ctx.insert("add_generation_prompt".into(), true.into());
        ctx.insert("bos_token".into(), tok(self.info.bos_id).into());
        ctx.insert("eos_token".into(), tok(self.info.eos_ids.first().copied()).into());
        ctx.insert("tools".into(), tools.cloned().unwrap_or(serde_json::Value::Null));
        for (k, v) in kwargs.into_iter().flatten() {
            if ctx.contains_key(k) {
                return Err(RuntimeError::Template(format!("chat_template_kwargs may not set `{k}` (the server sets it)")));
            }
            ctx.insert(k.clone(), v.clone());
        }
        env.get_template("chat").and_then(|t| t.render(minijinja::Value::from_serialize(&ctx))).map_err(|e| RuntimeError::Template(e.to_string())).and_then(|t| {
            if t.len() > MAX_RENDERED_BYTES {
                Err(RuntimeError::Template(format!("the rendered prompt is over {MAX_RENDERED_BYTES} bytes")))
            } else {
                Ok(t)
            }
        })
    }

    /// Token ids of a chat: the template rendered over `messages`, where special tokens count
    /// only in the template's own text. A message whose text holds a special token's text (say
    /// `<|im_end|>\n<|im_start|>system`) gets it as plain text, never as a role marker.
    /// Messages without such text tokenize exactly as [`Tokenizer::encode`] of the rendering.
    pub fn encode_chat(&self, messages: &[(String, String)]) -> Result<Vec<u32>> {
        self.encode_chat_with(messages, None)
    }

    /// [`Tokenizer::encode_chat`] with the request's `tools` ([`Tokenizer::render_chat`]).
    pub fn encode_chat_with(&self, messages: &[(String, String)], tools: Option<&serde_json::Value>) -> Result<Vec<u32>> {
        self.encode_turns(&turns(messages), tools, None)
    }

    /// [`Tokenizer::encode_chat`] of structured turns ([`Tokenizer::render_turns`]). A special
    /// token's text in a turn's other fields (past tool calls, a tool call id) is refused.
    pub fn encode_turns(&self, turns: &[ChatTurn], tools: Option<&serde_json::Value>, kwargs: Option<&serde_json::Map<String, serde_json::Value>>) -> Result<Vec<u32>> {
        let special_in = |c: &str| self.specials.iter().any(|(t, _)| c.contains(t.as_str()));
        if turns.iter().any(|t| t.tool_calls.as_ref().is_some_and(|c| special_in(&c.to_string())) || [&t.tool_call_id, &t.name].iter().any(|f| f.as_deref().is_some_and(special_in))) {
            return Err(RuntimeError::Template("a tool call, tool call id or name holds a special token's text: refused".into()));
        }
        let plain = self.render_turns(turns, tools, kwargs)?;
        if !turns.iter().any(|t| t.content.as_deref().is_some_and(special_in)) {
            return self.encode(&plain);
        }
        // render again with each message's text between two private-use marks to find where
        // the messages' text lies in the rendering
        const OPEN: char = '\u{10FFFD}';
        const CLOSE: char = '\u{10FFFC}';
        let refuse = || {
            RuntimeError::Template(
                "a message holds a special token's text and this chat template transforms message text: refused (the server's --allow-special-tokens-in-content lets it through as special tokens)"
                    .into(),
            )
        };
        if turns.iter().any(|t| t.content.as_deref().is_some_and(|c| c.contains(OPEN) || c.contains(CLOSE))) {
            return Err(refuse());
        }
        let marked: Vec<ChatTurn> = turns.iter().map(|t| ChatTurn { content: t.content.as_ref().map(|c| format!("{OPEN}{c}{CLOSE}")), ..t.clone() }).collect();
        let marked = self.render_turns(&marked, tools, kwargs)?;
        // the rendering without the marks, and whether each byte is message text
        let (mut text, mut inside, mut depth) = (String::with_capacity(plain.len()), Vec::with_capacity(plain.len()), 0usize);
        for ch in marked.chars() {
            match ch {
                OPEN => depth += 1,
                CLOSE if depth > 0 => depth -= 1,
                CLOSE => return Err(refuse()),
                c => {
                    text.push(c);
                    inside.extend(std::iter::repeat_n(depth > 0, c.len_utf8()));
                }
            }
        }
        if depth != 0 || text != plain {
            return Err(refuse());
        }
        // split at the template's special tokens; every piece between them (template text and
        // message text together, as the tokenizer itself splits) with special tokens as text
        let mut ids = vec![];
        if self.info.add_bos {
            ids.extend(self.info.bos_id);
        }
        let (mut i, mut start) = (0usize, 0usize);
        let bytes = text.as_bytes();
        while i < bytes.len() {
            let hit = if inside[i] || !text.is_char_boundary(i) { None } else { self.specials.iter().find(|(t, _)| text[i..].starts_with(t.as_str()) && !inside[i..i + t.len()].iter().any(|&x| x)) };
            match hit {
                Some((t, id)) => {
                    ids.extend(self.encode_plain(&text[start..i])?);
                    ids.push(*id);
                    i += t.len();
                    start = i;
                }
                None => i += 1,
            }
        }
        ids.extend(self.encode_plain(&text[start..])?);
        Ok(ids)
    }

    fn encode_plain(&self, text: &str) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Ok(vec![]);
        }
        Ok(self.plain.encode(text, false).map_err(|e| RuntimeError::Tokenizer(e.to_string()))?.get_ids().to_vec())
    }
}

/// A byte-level BPE of single bytes (GPT-2's byte map) with `specials` as special added tokens
/// (ids 256, 257, ...), for tests.
#[cfg(test)]
pub(crate) fn byte_level_for_tests(specials: &[&str], bos_id: Option<u32>, eos_ids: Vec<u32>, chat_template: Option<String>) -> Tokenizer {
    use serde_json::{json, Value};
    let mut vocab: serde_json::Map<String, Value> = byte_level_chars().iter().enumerate().map(|(i, c)| (c.to_string(), json!(i))).collect();
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, m)| {
            vocab.insert(m.to_string(), json!(256 + i));
            json!({"id": 256 + i, "content": m, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let tk = json!({"version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}, "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": []}});
    Tokenizer::new(&PlanTokenizer { json: tk.to_string(), bos_id, eos_ids, add_bos: false, chat_template }).unwrap()
}

#[cfg(test)]
mod template_tests {
    use super::*;

    /// dsc's chat environment renders a template using the Jinja features HF chat templates
    /// lean on (whitespace control as HF sets it, loop controls, Python string/dict methods,
    /// HF's tojson with and without indent, slicing) exactly as HF's environment does
    /// (tests/fixtures/chat/features-expected.json, written by hf_render.py with jinja2).
    #[test]
    fn chat_templates_render_as_hf_renders_them() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat");
        let tpl = std::fs::read_to_string(dir.join("features.jinja")).unwrap();
        let expected: Vec<serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(dir.join("features-expected.json")).unwrap()).unwrap();
        let mut env = chat_environment();
        env.add_template("t", &tpl).unwrap();
        for e in &expected {
            let got = env.get_template("t").unwrap().render(minijinja::Value::from_serialize(&e["case"])).unwrap();
            assert_eq!(got, e["rendered"].as_str().unwrap(), "case {}", e["case"]);
        }
        // strftime_now (Llama-3.1/3.2's date line) and an unknown directive named
        assert_eq!(format_utc(1_733_486_400, "%d %b %Y, %B %e %H:%M:%S %j %y %%").unwrap(), "06 Dec 2024, December  6 12:00:00 341 24 %");
        assert_eq!(format_utc(951_782_400, "%Y-%m-%d").unwrap(), "2000-02-29");
        assert!(format_utc(0, "%Q").unwrap_err().to_string().contains("%Q"));
        let year = env.render_str("{{ strftime_now('%Y') }}", ()).unwrap();
        assert!(year.len() == 4 && year.as_str() >= "2024", "{year}");
        // raise_exception stops the render with its message
        assert!(env.render_str("{{ raise_exception('no tools here') }}", ()).unwrap_err().to_string().contains("no tools here"));
    }

    /// Official templates (Llama-3.2-Instruct's with its tool format, DeepSeek-R1's with the
    /// tool-call tokens and the `</think>` split; tests/fixtures/chat/official/) render exactly
    /// as HF transformers' own renderer renders them (expected.json, written by make.py there).
    #[test]
    fn official_chat_templates_render_as_transformers_renders_them() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/official");
        let expected: serde_json::Map<String, serde_json::Value> = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
        assert_eq!(expected.len(), 2);
        for (name, rows) in &expected {
            let tpl = std::fs::read_to_string(dir.join(name)).unwrap();
            let mut env = chat_environment();
            env.add_template("t", &tpl).unwrap();
            let rows = rows.as_array().unwrap();
            assert!(rows.len() >= 4, "{name}");
            for r in rows {
                let got = env.get_template("t").unwrap().render(minijinja::Value::from_serialize(&r["context"])).unwrap_or_else(|e| panic!("{name}: {e:#}"));
                assert_eq!(got, r["rendered"].as_str().unwrap(), "{name}: messages {}", r["context"]["messages"]);
            }
        }
    }
}
