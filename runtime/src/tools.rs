//! Tool calling in OpenAI's shape (`tools`, `tool_choice`, `tool_calls`), in the Hermes/Qwen
//! format: the model writes `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, which the
//! server turns into `tool_calls` (vLLM's `hermes` parser; `--tool-call-parser hermes`). The
//! tools reach the model through the chat template's `tools` variable; past calls in the
//! history are rendered back in the same format. `tool_choice` "required" or a named function
//! constrains the output to such a call by a grammar (structured output), so the call parses
//! whatever the model; "auto" lets the model choose; "none" drops the tools.

use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

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
}

/// The `tools` / `tool_choice` of a chat body; errors name the field.
pub fn parse(v: &Value) -> Result<Option<Tools>, (String, &'static str)> {
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
    Ok(Some(Tools { list, choice }))
}

impl Tools {
    /// The grammar (Lark, for llguidance) a required or named call is held to: one
    /// `<tool_call>` whose JSON names a tool and gives arguments valid under its parameters.
    pub fn grammar(&self) -> Option<String> {
        let call = |t: &Value| {
            let f = &t["function"];
            let params = f.get("parameters").filter(|p| p.is_object()).cloned().unwrap_or_else(|| json!({"type": "object"}));
            json!({"type": "object", "properties": {"name": {"const": f["name"]}, "arguments": params}, "required": ["name", "arguments"], "additionalProperties": false})
        };
        let schema = match &self.choice {
            Choice::Auto => return None,
            Choice::Named(n) => call(self.list.iter().find(|t| t["function"]["name"] == json!(n)).expect("checked in parse")),
            Choice::Required => json!({"anyOf": self.list.iter().map(call).collect::<Vec<_>>()}),
        };
        Some(format!("start: \"{OPEN}\\n\" call \"\\n{CLOSE}\"\ncall: %json {schema}\n"))
    }
}

/// The text of past calls, as the model writes them (an assistant message's `tool_calls` in the
/// history).
pub fn render_calls(calls: &[Value]) -> String {
    calls
        .iter()
        .map(|c| {
            let f = &c["function"];
            // (arguments come as a JSON string; a client sending an object is taken as it is)
            let args = match &f["arguments"] {
                Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.clone())),
                other => other.clone(),
            };
            format!("{OPEN}\n{}\n{CLOSE}", json!({"name": f["name"], "arguments": args}))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Split a completion into its content (None when only calls) and its `tool_calls` (OpenAI's
/// shape, ids `call_{id}_{k}`). A block that is not a JSON call stays in the content.
pub fn extract(text: &str, id: &str) -> (Option<String>, Vec<Value>) {
    let (mut content, mut calls, mut rest) = (String::new(), vec![], text);
    while let Some(i) = rest.find(OPEN) {
        let after = &rest[i + OPEN.len()..];
        let Some(j) = after.find(CLOSE) else { break };
        let call: Option<Value> = serde_json::from_str::<Value>(after[..j].trim()).ok().filter(|c| c["name"].is_string());
        match call {
            Some(c) => {
                content.push_str(&rest[..i]);
                let args = if c["arguments"].is_null() { json!({}) } else { c["arguments"].clone() };
                calls.push(json!({"id": format!("call_{id}_{}", calls.len()), "type": "function", "function": {"name": c["name"], "arguments": args.to_string()}}));
            }
            None => content.push_str(&rest[..i + OPEN.len() + j + CLOSE.len()]),
        }
        rest = &after[j + CLOSE.len()..];
    }
    content.push_str(rest);
    let content = Some(content).filter(|c| !c.trim().is_empty() || calls.is_empty());
    (content, calls)
}

/// Streaming with tools: text goes out as content until a `<tool_call>` may be starting; from
/// there it is held and, at the end, parsed ([`extract`]) into the calls.
#[derive(Debug, Default)]
pub struct ToolStream {
    held: String,
    in_call: bool,
}

impl ToolStream {
    /// The content a delta adds now.
    pub fn feed(&mut self, delta: &str) -> String {
        self.held.push_str(delta);
        if self.in_call {
            return String::new();
        }
        if let Some(i) = self.held.find(OPEN) {
            self.in_call = true;
            let out = self.held[..i].to_string();
            self.held.drain(..i);
            return out;
        }
        let keep = crate::stop::partial_suffix(&self.held, OPEN);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        out
    }

    /// At the end: (the rest of the content, the calls).
    pub fn finish(&mut self, id: &str) -> (String, Vec<Value>) {
        let (c, calls) = extract(&std::mem::take(&mut self.held), id);
        (c.unwrap_or_default(), calls)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(choice: Value) -> Value {
        json!({"tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "now"}}], "tool_choice": choice})
    }

    #[test]
    fn choices_parse_and_bad_ones_name_the_field() {
        assert_eq!(parse(&body(json!("auto"))).unwrap().unwrap().choice, Choice::Auto);
        assert_eq!(parse(&body(json!("none"))).unwrap(), None);
        assert_eq!(parse(&body(json!({"type": "function", "function": {"name": "now"}}))).unwrap().unwrap().choice, Choice::Named("now".into()));
        assert_eq!(parse(&body(json!({"type": "function", "function": {"name": "fly"}}))).unwrap_err().1, "tool_choice");
        assert_eq!(parse(&json!({"tools": [{"type": "function"}]})).unwrap_err().1, "tools");
        assert_eq!(parse(&json!({"tool_choice": "required"})).unwrap_err().1, "tool_choice");
        assert_eq!(parse(&json!({})).unwrap(), None);
        let g = parse(&body(json!("required"))).unwrap().unwrap().grammar().unwrap();
        assert!(g.starts_with("start: \"<tool_call>\\n\" call") && g.contains("anyOf") && g.contains("\"const\":\"now\""), "{g}");
        assert_eq!(parse(&body(json!("auto"))).unwrap().unwrap().grammar(), None);
    }

    #[test]
    fn calls_extract_whole_and_streamed() {
        let text =
            "Let me check.<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\"}</tool_call><tool_call>not json</tool_call>";
        let (c, calls) = extract(text, "7");
        assert_eq!(c.as_deref(), Some("Let me check.\n<tool_call>not json</tool_call>"));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0], json!({"id": "call_7_0", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}));
        assert_eq!(calls[1]["function"]["arguments"], json!("{}"));
        assert_eq!(extract("<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>", "1").0, None, "only a call: no content");
        assert_eq!(extract("plain", "1"), (Some("plain".into()), vec![]));
        // streamed at every cut: the content before the call goes out, the call at the end
        for i in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let mut s = ToolStream::default();
            let mut out = s.feed(&text[..i]);
            out.push_str(&s.feed(&text[i..]));
            let (rest, calls) = s.finish("7");
            out.push_str(&rest);
            assert_eq!((out.as_str(), calls.len()), ("Let me check.\n<tool_call>not json</tool_call>", 2), "cut at {i}");
        }
        // past calls render back in the model's format
        let h = render_calls(&[json!({"id": "c", "type": "function", "function": {"name": "now", "arguments": "{}"}})]);
        assert_eq!(h, "<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>", "name first (serde_json keeps insertion order: llguidance turns on preserve_order)");
    }
}
