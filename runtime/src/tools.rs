//! Tool calling in OpenAI's shape (`tools`, `tool_choice`, `tool_calls`), in the format the
//! model's template teaches it (`dsc serve --tool-call-parser`, vLLM's names):
//! - `hermes` (Hermes, Qwen2.5; the default): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
//! - `llama3_json` (Llama-3.1/3.2): the reply is the call itself, `{"name": ..., "parameters":
//!   {...}}` (or "arguments"), after an optional `<|python_tag|>`, several joined by `;`;
//! - `deepseek_v3` (DeepSeek-V3/R1): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME`
//!   then the arguments in a ```json fence, `<｜tool▁call▁end｜>` each, `<｜tool▁calls▁end｜>`.
//! The server turns them into `tool_calls`. The tools reach the model through the chat
//! template's `tools` variable; past calls in the history are rendered back in the same format.
//! `tool_choice` "required" or a named function constrains the output to such a call by a
//! grammar (structured output), so the call parses whatever the model (DeepSeek's markers are
//! tokens of their own: the grammar names them by id, `<[id]>`); "auto" lets the model choose;
//! "none" drops the tools.

use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const DS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";

/// The tool-call format of the served model (`--tool-call-parser`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Parser {
    #[default]
    Hermes,
    Llama3Json,
    DeepseekV3,
}

impl Parser {
    /// vLLM's parser name; None for an unknown one.
    pub fn parse(name: &str) -> Option<Parser> {
        match name {
            "hermes" => Some(Parser::Hermes),
            "llama3_json" => Some(Parser::Llama3Json),
            "deepseek_v3" => Some(Parser::DeepseekV3),
            _ => None,
        }
    }
    pub const NAMES: &'static str = "hermes, llama3_json, deepseek_v3";
}

#[derive(Clone, Debug, PartialEq)]
pub enum Choice {
    Auto,
    Required,
    Named(String),
}

/// A request's tools (None: no tools, or tool_choice none).
#[derive(Clone, Debug, PartialEq)]
pub struct Tools {
    /// the `tools` list as sent (type function)
    pub list: Vec<Value>,
    pub choice: Choice,
    pub parser: Parser,
}

/// The `tools` / `tool_choice` of a chat body; errors name the field.
pub fn parse(v: &Value, parser: Parser) -> Result<Option<Tools>, (String, &'static str)> {
    let list = match v.get("tools") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(a)) => a.clone(),
        Some(_) => return Err(("`tools` must be a list of functions".into(), "tools")),
    };
    for t in &list {
        let name = t.get("function").and_then(|f| f.get("name")).and_then(|n| n.as_str());
        if t.get("type").and_then(|x| x.as_str()) != Some("function") || name.is_none_or(|n| n.is_empty()) {
            return Err(("each tool must be {\"type\": \"function\", \"function\": {\"name\": ..., \"parameters\": {...}}}".into(), "tools"));
        }
    }
    let names: Vec<&str> = list.iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    let choice = match v.get("tool_choice") {
        None | Some(Value::Null) => Choice::Auto,
        Some(Value::String(s)) if s == "none" => return Ok(None),
        Some(Value::String(s)) if s == "auto" => Choice::Auto,
        Some(Value::String(s)) if s == "required" => Choice::Required,
        Some(c) => match c.get("function").and_then(|f| f.get("name")).and_then(|n| n.as_str()) {
            Some(n) if names.contains(&n) => Choice::Named(n.to_string()),
            Some(n) => return Err((format!("`tool_choice` names `{n}`, which is not one of the tools"), "tool_choice")),
            None => return Err(("`tool_choice` must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\": ...}}".into(), "tool_choice")),
        },
    };
    if list.is_empty() {
        return match choice {
            Choice::Auto => Ok(None),
            _ => Err(("`tool_choice` asks for a tool call and `tools` is empty".into(), "tool_choice")),
        };
    }
    Ok(Some(Tools { list, choice, parser }))
}

impl Tools {
    /// The grammar (Lark, for llguidance) a required or named call is held to: one call in the
    /// parser's format whose JSON names a tool and gives arguments valid under its parameters.
    /// `token_id` gives the id of a marker that is one token of the model's vocabulary (DeepSeek's
    /// `<｜tool▁calls▁begin｜>` and the rest); Err names a marker the tokenizer does not have.
    pub fn grammar(&self, token_id: &dyn Fn(&str) -> Option<u32>) -> Result<Option<String>, String> {
        // (the tools a call may name: the named one, or any)
        let tools: Vec<&Value> = match &self.choice {
            Choice::Auto => return Ok(None),
            Choice::Named(n) => self.list.iter().filter(|t| t["function"]["name"] == json!(n)).collect(),
            Choice::Required => self.list.iter().collect(),
        };
        let params = |t: &Value| t["function"].get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object"}));
        if self.parser == Parser::DeepseekV3 {
            let id = |m: &str| token_id(m).map(|i| format!("<[{i}]>")).ok_or_else(|| format!("the model's tokenizer has no token {m}, which the deepseek_v3 tool-call format needs"));
            let (begin, end, call, call_end, sep) = (id(DS_BEGIN)?, id(DS_END)?, id(DS_CALL)?, id(DS_CALL_END)?, id(DS_SEP)?);
            // (one call per tool, its name fixed and its arguments under its parameters)
            let mut g = format!("start: {begin} {call} \"function\" {sep} call {call_end} {end}\ncall: {}\n", (0..tools.len()).map(|i| format!("c{i}")).collect::<Vec<_>>().join(" | "));
            for (i, t) in tools.iter().enumerate() {
                g += &format!("c{i}: {} \"\\n```json\\n\" a{i} \"\\n```\"\na{i}: %json {}\n", serde_json::to_string(&t["function"]["name"]).expect("a string"), params(t));
            }
            return Ok(Some(g));
        }
        // (Llama-3 names the arguments "parameters")
        let key = if self.parser == Parser::Llama3Json { "parameters" } else { "arguments" };
        let call = |t: &&Value| json!({"type": "object", "properties": {"name": {"const": t["function"]["name"]}, key: params(t)}, "required": ["name", key], "additionalProperties": false});
        let schema = match &self.choice {
            Choice::Named(_) => call(&tools[0]),
            _ => json!({"anyOf": tools.iter().map(call).collect::<Vec<_>>()}),
        };
        Ok(Some(match self.parser {
            Parser::Llama3Json => format!("start: call\ncall: %json {schema}\n"),
            _ => format!("start: \"{OPEN}\\n\" call \"\\n{CLOSE}\"\ncall: %json {schema}\n"),
        }))
    }
}

/// The text of past calls, as the model writes them (an assistant message's `tool_calls` in the
/// history).
/// A call's `arguments` as a JSON value: OpenAI sends them as a JSON string (one that does not
/// parse stays a string); a client sending an object is taken as it is.
pub fn call_arguments(function: &Value) -> Value {
    match &function["arguments"] {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
        other => other.clone(),
    }
}

pub fn render_calls(parser: Parser, calls: &[Value]) -> String {
    let each: Vec<String> = calls
        .iter()
        .map(|c| {
            let f = &c["function"];
            let args = call_arguments(f);
            match parser {
                Parser::Hermes => format!("{OPEN}\n{}\n{CLOSE}", json!({"name": f["name"], "arguments": args})),
                Parser::Llama3Json => json!({"name": f["name"], "parameters": args}).to_string(),
                Parser::DeepseekV3 => format!("{DS_CALL}function{DS_SEP}{}\n```json\n{args}\n```{DS_CALL_END}", f["name"].as_str().unwrap_or_default()),
            }
        })
        .collect();
    match parser {
        Parser::Hermes => each.join("\n"),
        Parser::Llama3Json => each.join("; "),
        Parser::DeepseekV3 => format!("{DS_BEGIN}{}{DS_END}", each.concat()),
    }
}

/// Split a completion into its content (None when only calls) and its `tool_calls` (OpenAI's
/// shape, ids `call_{id}_{k}`). A block that is not a JSON call stays in the content.
pub fn extract(parser: Parser, text: &str, id: &str) -> (Option<String>, Vec<Value>) {
    match parser {
        Parser::Hermes => extract_hermes(text, id),
        Parser::Llama3Json => extract_llama3(text, id),
        Parser::DeepseekV3 => extract_deepseek(text, id),
    }
}

/// One call in OpenAI's shape.
fn call_value(id: &str, k: usize, name: &Value, args: &Value) -> Value {
    let args = if args.is_null() { json!({}) } else { args.clone() };
    json!({"id": format!("call_{id}_{k}"), "type": "function", "function": {"name": name, "arguments": args.to_string()}})
}

/// Llama-3: the whole reply (after an optional `<|python_tag|>`) is one JSON call or several
/// joined by `;`, each {"name", "parameters" | "arguments"}; anything else is content.
fn extract_llama3(text: &str, id: &str) -> (Option<String>, Vec<Value>) {
    let body = text.trim_start();
    let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body).trim();
    // (JSON values one at a time, `;` between them: a `;` inside a string stays there)
    let pieces = || -> Option<Vec<Value>> {
        let (mut out, mut rest) = (vec![], body);
        loop {
            let mut de = serde_json::Deserializer::from_str(rest).into_iter::<Value>();
            let c = de.next()?.ok()?;
            let args = if c["parameters"].is_null() { &c["arguments"] } else { &c["parameters"] };
            if !c["name"].is_string() || !(args.is_object() || args.is_null()) {
                return None;
            }
            out.push(call_value(id, out.len(), &c["name"], args));
            rest = rest[de.byte_offset()..].trim_start();
            if rest.is_empty() {
                return Some(out);
            }
            rest = rest.strip_prefix(';')?.trim_start();
        }
    };
    match pieces() {
        Some(calls) if !body.is_empty() => (None, calls),
        _ => (Some(text.to_string()), vec![]),
    }
}

/// DeepSeek-V3: the content before `<｜tool▁calls▁begin｜>`, then each
/// `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\nARGS\n```<｜tool▁call▁end｜>`.
fn extract_deepseek(text: &str, id: &str) -> (Option<String>, Vec<Value>) {
    let Some(i) = text.find(DS_BEGIN) else { return (Some(text.to_string()), vec![]) };
    let (content, mut rest) = (&text[..i], &text[i + DS_BEGIN.len()..]);
    let mut calls = vec![];
    while let Some(j) = rest.find(DS_CALL) {
        let after = &rest[j + DS_CALL.len()..];
        let Some(e) = after.find(DS_CALL_END) else { break };
        let one = &after[..e];
        let parsed = one.split_once(DS_SEP).and_then(|(_, r)| {
            let (name, args) = r.split_once('\n')?;
            let args = args.trim().strip_prefix("```json").unwrap_or(args.trim()).trim_end().strip_suffix("```").unwrap_or(args.trim()).trim();
            Some((name.trim().to_string(), serde_json::from_str::<Value>(args).ok()?))
        });
        match parsed {
            Some((name, args)) => calls.push(call_value(id, calls.len(), &json!(name), &args)),
            None => return (Some(text.to_string()), vec![]),
        }
        rest = &after[e + DS_CALL_END.len()..];
    }
    if calls.is_empty() {
        return (Some(text.to_string()), vec![]);
    }
    (Some(content.to_string()).filter(|c| !c.trim().is_empty()), calls)
}

/// Hermes: each `<tool_call>` block that holds a JSON call; others stay in the content.
fn extract_hermes(text: &str, id: &str) -> (Option<String>, Vec<Value>) {
    let (mut content, mut calls, mut rest) = (String::new(), vec![], text);
    while let Some(i) = rest.find(OPEN) {
        let after = &rest[i + OPEN.len()..];
        let Some(j) = after.find(CLOSE) else { break };
        let call: Option<Value> = serde_json::from_str::<Value>(after[..j].trim()).ok().filter(|c| c["name"].is_string());
        match call {
            Some(c) => {
                content.push_str(&rest[..i]);
                calls.push(call_value(id, calls.len(), &c["name"], &c["arguments"]));
            }
            None => content.push_str(&rest[..i + OPEN.len() + j + CLOSE.len()]),
        }
        rest = &after[j + CLOSE.len()..];
    }
    content.push_str(rest);
    let content = Some(content).filter(|c| !c.trim().is_empty() || calls.is_empty());
    (content, calls)
}

/// Streaming with tools: text goes out as content until a call may be starting (hermes: a
/// `<tool_call>`, deepseek_v3: `<｜tool▁calls▁begin｜>`; llama3_json: a reply whose first
/// non-space text is `{` or `<|python_tag|>`); from there it is held and, at the end, parsed
/// ([`extract`]) into the calls.
#[derive(Debug, Default)]
pub struct ToolStream {
    parser: Parser,
    held: String,
    in_call: bool,
    /// (llama3_json) the reply's start was seen to be plain content
    content: bool,
}

impl ToolStream {
    pub fn new(parser: Parser) -> ToolStream {
        ToolStream { parser, ..Default::default() }
    }

    /// The content a delta adds now.
    pub fn feed(&mut self, delta: &str) -> String {
        self.held.push_str(delta);
        if self.in_call {
            return String::new();
        }
        let open = match self.parser {
            Parser::Hermes => OPEN,
            Parser::DeepseekV3 => DS_BEGIN,
            Parser::Llama3Json => {
                if self.content {
                    return std::mem::take(&mut self.held);
                }
                let t = self.held.trim_start();
                if t.is_empty() || (PYTHON_TAG.starts_with(t) && t.len() < PYTHON_TAG.len()) {
                    return String::new();
                }
                if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                    self.in_call = true;
                    return String::new();
                }
                self.content = true;
                return std::mem::take(&mut self.held);
            }
        };
        if let Some(i) = self.held.find(open) {
            self.in_call = true;
            let out = self.held[..i].to_string();
            self.held.drain(..i);
            return out;
        }
        let keep = crate::stop::partial_suffix(&self.held, open);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        out
    }

    /// At the end: (the rest of the content, the calls).
    pub fn finish(&mut self, id: &str) -> (String, Vec<Value>) {
        let (c, calls) = extract(self.parser, &std::mem::take(&mut self.held), id);
        (c.unwrap_or_default(), calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_h(v: &Value) -> Result<Option<Tools>, (String, &'static str)> {
        parse(v, Parser::Hermes)
    }

    fn body(choice: Value) -> Value {
        json!({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "now"}}], "tool_choice": choice})
    }

    #[test]
    fn choices_parse_and_bad_ones_name_the_field() {
        assert_eq!(parse_h(&body(json!("auto"))).unwrap().unwrap().choice, Choice::Auto);
        assert_eq!(parse_h(&body(json!("none"))).unwrap(), None);
        assert_eq!(parse_h(&body(json!({"type": "function", "function": {"name": "now"}}))).unwrap().unwrap().choice, Choice::Named("now".into()));
        assert_eq!(parse_h(&body(json!({"type": "function", "function": {"name": "fly"}}))).unwrap_err().1, "tool_choice");
        assert_eq!(parse_h(&json!({"tools": [{"type": "function"}]})).unwrap_err().1, "tools");
        assert_eq!(parse_h(&json!({"tool_choice": "required"})).unwrap_err().1, "tool_choice");
        assert_eq!(parse_h(&json!({})).unwrap(), None);
        let g = parse_h(&body(json!("required"))).unwrap().unwrap().grammar(&|_| None).unwrap().unwrap();
        assert!(g.starts_with("start: \"<tool_call>\\n\" call") && g.contains("anyOf") && g.contains("\"const\":\"now\""), "{g}");
        assert_eq!(parse_h(&body(json!("auto"))).unwrap().unwrap().grammar(&|_| None).unwrap(), None);
    }

    #[test]
    fn calls_extract_whole_and_streamed() {
        let text =
            "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call><tool_call>not json</tool_call>";
        let (c, calls) = extract(Parser::Hermes, text, "7");
        assert_eq!(c.as_deref(), Some("Let me check.\n<tool_call>not json</tool_call>"));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0], json!({"id": "call_7_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}));
        assert_eq!(calls[1]["function"]["arguments"], json!("{}"));
        assert_eq!(extract(Parser::Hermes, "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>", "1").0, None, "only a call: no content");
        assert_eq!(extract(Parser::Hermes, "plain", "1"), (Some("plain".into()), vec![]));
        // streamed at every cut: the content before the call goes out, the call at the end
        for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let mut s = ToolStream::new(Parser::Hermes);
            let mut out = s.feed(&text[..i]);
            out.push_str(&s.feed(&text[i..]));
            let (rest, calls) = s.finish("7");
            out.push_str(&rest);
            assert_eq!((out.as_str(), calls.len()), ("Let me check.\n<tool_call>not json</tool_call>", 2), "cut at {i}");
        }
        // past calls render back in the model's format
        let h = render_calls(Parser::Hermes, &[json!({"id": "c", "type": "function", "function": {"name": "now", "arguments": "{}"}})]);
        assert_eq!(h, "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>", "name first (serde_json keeps insertion order: llguidance turns on preserve_order)");
    }

    /// Text split into content and calls, whole and streamed at every cut (the same either way).
    fn both_ways(parser: Parser, text: &str) -> (String, Vec<Value>) {
        let (c, calls) = extract(parser, text, "9");
        let whole = (c.unwrap_or_default(), calls);
        for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let mut s = ToolStream::new(parser);
            let mut out = s.feed(&text[..i]);
            out.push_str(&s.feed(&text[i..]));
            let (rest, calls) = s.finish("9");
            out.push_str(&rest);
            assert_eq!((&out, &calls), (&whole.0, &whole.1), "{parser:?} cut at {i} of {text:?}");
        }
        whole
    }

    #[test]
    fn llama3_json_calls_parse_render_and_stream() {
        let p = Parser::Llama3Json;
        let (c, calls) = both_ways(p, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris; France\"}}; {\"name\": \"now\", \"parameters\": {}}");
        assert_eq!(c, "");
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["function"], json!({"name": "get_weather", "arguments": "{\"city\":\"Paris; France\"}"}));
        assert_eq!(calls[1]["id"], json!("call_9_1"));
        let (c, calls) = both_ways(p, "  {\"name\": \"now\", \"arguments\": {}}");
        assert_eq!((c.as_str(), calls.len()), ("", 1), "arguments accepted for parameters, leading space");
        // prose, or a JSON object that is not a call: all content
        assert_eq!(both_ways(p, "It is sunny {really}."), ("It is sunny {really}.".to_string(), vec![]));
        assert_eq!(both_ways(p, "{\"city\": \"Paris\"}").1, Vec::<Value>::new());
        assert_eq!(both_ways(p, "{\"name\": \"now\"} and more").1, Vec::<Value>::new());
        // past calls as the model writes them; they parse back
        let past = [json!({"function": {"name": "now", "arguments": "{}"}}), json!({"function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}})];
        let r = render_calls(p, &past);
        assert_eq!(r, "{\"name\":\"now\",\"parameters\":{}}; {\"name\":\"get_weather\",\"parameters\":{\"city\":\"Oslo\"}}");
        assert_eq!(extract(p, &r, "1").1.len(), 2);
        // required: the grammar is the bare call with "parameters"
        let g = parse(&body(json!("required")), p).unwrap().unwrap().grammar(&|_| None).unwrap().unwrap();
        assert!(g.starts_with("start: call\ncall: %json") && g.contains("\"parameters\"") && !g.contains("tool_call"), "{g}");
    }

    #[test]
    fn deepseek_v3_calls_parse_render_and_stream() {
        let p = Parser::DeepseekV3;
        let text = "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let (c, calls) = both_ways(p, text);
        assert_eq!(c, "Checking.");
        assert_eq!(calls.iter().map(|c| c["function"]["name"].as_str().unwrap()).collect::<Vec<_>>(), ["get_weather", "now"]);
        assert_eq!(calls[0]["function"]["arguments"], json!("{\"city\":\"Paris\"}"));
        assert_eq!(both_ways(p, "no calls here").1, Vec::<Value>::new());
        // a broken call leaves everything as content
        assert_eq!(both_ways(p, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{oops\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>").1, Vec::<Value>::new());
        let past = [json!({"function": {"name": "get_weather", "arguments": "{\"city\":\"Oslo\"}"}})];
        let r = render_calls(p, &past);
        assert_eq!(r, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\":\"Oslo\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
        assert_eq!(extract(p, &r, "1").1[0]["function"]["name"], json!("get_weather"));
        // required / named: a grammar naming the markers by token id; a tokenizer without them
        // is an error naming the marker
        let ids = |m: &str| [DS_BEGIN, DS_END, DS_CALL, DS_CALL_END, DS_SEP].iter().position(|x| *x == m).map(|i| 900 + i as u32);
        let g = parse(&body(json!("required")), p).unwrap().unwrap().grammar(&ids).unwrap().unwrap();
        assert!(g.starts_with("start: <[900]> <[902]> \"function\" <[904]> call <[903]> <[901]>") && g.contains("%json"), "{g}");
        let e = parse(&body(json!("required")), p).unwrap().unwrap().grammar(&|_| None).unwrap_err();
        assert!(e.contains(DS_BEGIN), "{e}");
        assert!(parse(&body(json!("auto")), p).unwrap().is_some());
        assert_eq!(Parser::parse("deepseek_v3"), Some(p));
        assert_eq!(Parser::parse("mistral"), None);
    }

    /// The deepseek_v3 grammar compiles against a tokenizer that has the markers as tokens of
    /// their own, allows only the opening marker first, and accepts a whole valid call token
    /// by token (markers by id, the rest as text).
    #[test]
    fn deepseek_v3_required_call_is_held_to_the_grammar() {
        use crate::structured::{Format, Grammars};
        // a byte-level BPE of single bytes, the markers and an eos as special added tokens
        let markers = [DS_BEGIN, DS_END, DS_CALL, DS_CALL_END, DS_SEP, "<eos>"];
        let tok = std::sync::Arc::new(crate::tokenizer::byte_level_for_tests(&markers, None, vec![261], None));
        let grammars = Grammars::new(tok.clone()).unwrap();
        let tools = parse(&body(json!({"type": "function", "function": {"name": "get_weather"}})), Parser::DeepseekV3).unwrap().unwrap();
        let g = tools.grammar(&|m| tok.token_to_id(m)).unwrap().unwrap();
        let mut c = grammars.constraint(&Format::Lark(g.clone())).unwrap_or_else(|e| panic!("{e}\n{g}"));
        // first: only the opening marker
        let mut logits = vec![0f32; 262];
        c.mask(&mut logits).unwrap();
        let allowed: Vec<usize> = (0..262).filter(|&i| logits[i] == 0.0).collect();
        assert_eq!(allowed, vec![256], "only {DS_BEGIN} may open the reply");
        // a whole call, token by token
        let text = |s: &str| tok.encode_text(s).unwrap();
        let mut ids = vec![256, 258];
        ids.extend(text("function"));
        ids.push(260);
        ids.extend(text("get_weather\n```json\n{\"city\": \"Oslo\"}\n```"));
        ids.extend([259, 257]);
        for t in ids {
            c.consume(t).unwrap_or_else(|e| panic!("token {t}: {e}"));
        }
        assert!(
            c.done() || {
                let mut l = vec![0f32; 262];
                c.mask(&mut l).unwrap();
                l[261] == 0.0
            },
            "the call is complete"
        );
        // the named tool's name is fixed: another tool's name is refused
        let mut c = grammars.constraint(&Format::Lark(g)).unwrap();
        for t in [256, 258].into_iter().chain(text("function")).chain([260]).chain(text("no")) {
            if c.consume(t).is_err() {
                return;
            }
        }
        panic!("a call of `now` passed the grammar of a call named get_weather");
    }
}
