//! `dsc serve`: an OpenAI-compatible HTTP server over the engine (axum on tokio).
//!
//! Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both with `stream: true`
//! over server-sent events), `GET /v1/models`, `GET /health` (liveness: the engine thread is
//! alive), `GET /ready` (readiness: loaded and not draining), `GET /metrics` (Prometheus).
//! Errors use OpenAI's shape `{"error": {"message", "type", "param", "code"}}` with 4xx codes
//! for bad requests. Extensions: `priority` ("high" | "normal" | "low", or the `x-priority`
//! header), `timeout` (seconds until the request is ended with finish reason `timeout`),
//! `min_p`, `top_k`, `repetition_penalty`, `stop_token_ids`.
//! Shutdown (SIGINT/SIGTERM) stops accepting, reports not-ready, and drains running requests.

use crate::metrics::Metrics;
use crate::sampler::SamplingParams;
use crate::scheduler::{EngineHandle, Event, GenRequest, Priority};
use crate::tokenizer::Tokenizer;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver};

pub struct ServerConfig {
    pub model_name: String,
    pub api_key: Option<String>,
    /// largest request body in bytes
    pub max_body_bytes: usize,
    /// the plan's context length
    pub max_seq_len: usize,
    /// default max_tokens for completions without one (OpenAI: 16)
    pub default_max_tokens: usize,
    /// largest `n`
    pub max_n: usize,
}

pub struct AppState {
    pub cfg: ServerConfig,
    pub engine: EngineHandle,
    pub tok: Option<Arc<Tokenizer>>,
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    next_id: AtomicU64,
}

impl AppState {
    pub fn new(cfg: ServerConfig, engine: EngineHandle, tok: Option<Arc<Tokenizer>>) -> Arc<Self> {
        let metrics = engine.metrics.clone();
        Arc::new(AppState { cfg, engine, tok, metrics, ready: AtomicBool::new(true), next_id: AtomicU64::new(0) })
    }
}

/// An OpenAI-style error response.
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl ApiError {
    fn bad(message: impl Into<String>, param: Option<&'static str>) -> Self {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), kind: "invalid_request_error", param, code: None }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}))).into_response()
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .fallback(|| async { ApiError { status: StatusCode::NOT_FOUND, message: "no such endpoint".into(), kind: "invalid_request_error", param: None, code: Some("not_found") } })
        // bodies are read (and limited) by the handlers themselves, for OpenAI-style errors
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    if s.engine.alive() {
        (StatusCode::OK, Json(json!({"status": "ok"}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "engine stopped"}))).into_response()
    }
}

async fn ready(State(s): State<Arc<AppState>>) -> Response {
    if s.ready.load(Ordering::SeqCst) && s.engine.alive() {
        (StatusCode::OK, Json(json!({"status": "ready"}))).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "not ready"}))).into_response()
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    crate::nvml::sample(&s.metrics);
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode()).into_response()
}

async fn models(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = auth(&s, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [{"id": s.cfg.model_name, "object": "model", "created": 0, "owned_by": "dsc"}]})).into_response()
}

fn auth(s: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &s.cfg.api_key else { return Ok(()) };
    let given = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    if given == Some(key.as_str()) {
        Ok(())
    } else {
        s.metrics.error("auth");
        Err(ApiError { status: StatusCode::UNAUTHORIZED, message: "Incorrect API key provided.".into(), kind: "invalid_request_error", param: None, code: Some("invalid_api_key") })
    }
}

async fn read_json(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    auth(s, headers)?;
    if !s.ready.load(Ordering::SeqCst) {
        return Err(ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: "the server is shutting down".into(), kind: "server_error", param: None, code: None });
    }
    let bytes = read_limited(body, s.cfg.max_body_bytes).await.map_err(|_| {
        s.metrics.error("too_large");
        ApiError {
            status: StatusCode::PAYLOAD_TOO_LARGE,
            message: format!("request body exceeds {} bytes", s.cfg.max_body_bytes),
            kind: "invalid_request_error",
            param: None,
            code: Some("request_too_large"),
        }
    })?;
    let v: Value = serde_json::from_slice(&bytes).map_err(|e| {
        s.metrics.error("bad_json");
        ApiError::bad(format!("malformed JSON body: {e}"), None)
    })?;
    if !v.is_object() {
        return Err(ApiError::bad("the body must be a JSON object", None));
    }
    Ok(v)
}

/// Bytes of an oversized body the server still reads (and drops) before it answers 413: a
/// client that sends the body whole then reads the answer, where an early answer and close
/// would reset its upload (seen as a broken pipe instead of the 413).
const DRAIN_MAX_BYTES: usize = 64 << 20;

/// The body, if it is at most `max` bytes; past that its bytes are read and dropped (up to
/// [`DRAIN_MAX_BYTES`] more) and the result is an error, as it is for a broken body.
async fn read_limited(body: Body, max: usize) -> Result<Vec<u8>, ()> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let (mut buf, mut total) = (Vec::new(), 0usize);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| ())?;
        total = total.saturating_add(chunk.len());
        if total <= max {
            buf.extend_from_slice(&chunk);
        } else if total > max.saturating_add(DRAIN_MAX_BYTES) {
            return Err(());
        }
    }
    if total > max {
        Err(())
    } else {
        Ok(buf)
    }
}

/// The parts of a request both endpoints share.
struct Common {
    prompt: Vec<u32>,
    sampling: SamplingParams,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    stop_strings: Vec<String>,
    logprobs: Option<usize>,
    n: usize,
    stream: bool,
    priority: Priority,
    deadline: Option<Instant>,
    include_usage: bool,
}

fn num(v: &Value, key: &'static str) -> Result<Option<f64>, ApiError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(x) => x.as_f64().map(Some).ok_or_else(|| ApiError::bad(format!("`{key}` must be a number"), Some(key))),
    }
}

fn uint(v: &Value, key: &'static str) -> Result<Option<usize>, ApiError> {
    match num(v, key)? {
        None => Ok(None),
        Some(x) if x >= 0.0 && x.fract() == 0.0 && x < 1e9 => Ok(Some(x as usize)),
        Some(x) => Err(ApiError::bad(format!("`{key}` must be a non-negative integer, got {x}"), Some(key))),
    }
}

fn common(s: &AppState, v: &Value, headers: &HeaderMap, prompt: Vec<u32>, chat: bool) -> Result<Common, ApiError> {
    let model = v.get("model").and_then(|m| m.as_str()).ok_or_else(|| ApiError::bad("`model` is required", Some("model")))?;
    if model != s.cfg.model_name {
        return Err(ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!("The model `{model}` does not exist (this server serves `{}`)", s.cfg.model_name),
            kind: "invalid_request_error",
            param: Some("model"),
            code: Some("model_not_found"),
        });
    }
    if prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty", Some("prompt")));
    }
    let ctx = s.cfg.max_seq_len;
    let max_key = if chat && v.get("max_completion_tokens").is_some() { "max_completion_tokens" } else { "max_tokens" };
    let max_tokens = match uint(v, max_key)? {
        Some(0) => return Err(ApiError::bad(format!("`{max_key}` must be at least 1"), Some("max_tokens"))),
        Some(m) => m,
        None if chat => ctx.saturating_sub(prompt.len()),
        None => s.cfg.default_max_tokens.min(ctx.saturating_sub(prompt.len())),
    };
    if prompt.len() >= ctx || prompt.len() + max_tokens > ctx {
        return Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            message: format!(
                "This model's maximum context length is {ctx} tokens. However, you requested {} tokens ({} in the prompt, {max_tokens} for the completion).",
                prompt.len() + max_tokens,
                prompt.len()
            ),
            kind: "invalid_request_error",
            param: Some("messages"),
            code: Some("context_length_exceeded"),
        });
    }
    let mut sp = SamplingParams::default();
    if let Some(t) = num(v, "temperature")? {
        if !(0.0..=2.0).contains(&t) {
            return Err(ApiError::bad(format!("`temperature` must be in [0, 2], got {t}"), Some("temperature")));
        }
        sp.temperature = t as f32;
    } else {
        // OpenAI's default temperature is 1
        sp.temperature = 1.0;
    }
    if let Some(p) = num(v, "top_p")? {
        sp.top_p = p as f32;
    }
    if let Some(k) = uint(v, "top_k")? {
        sp.top_k = k;
    }
    if let Some(p) = num(v, "min_p")? {
        sp.min_p = p as f32;
    }
    if let Some(p) = num(v, "repetition_penalty")? {
        sp.repetition_penalty = p as f32;
    }
    if let Some(p) = num(v, "frequency_penalty")? {
        sp.frequency_penalty = p as f32;
    }
    if let Some(p) = num(v, "presence_penalty")? {
        sp.presence_penalty = p as f32;
    }
    sp.seed = match v.get("seed") {
        None | Some(Value::Null) => s.next_id.load(Ordering::Relaxed).wrapping_mul(0x9E37_79B9),
        Some(x) => x.as_i64().ok_or_else(|| ApiError::bad("`seed` must be an integer", Some("seed")))? as u64,
    };
    sp.validate().map_err(|e| ApiError::bad(e.to_string().trim_start_matches("request: ").to_string(), None))?;
    let n = uint(v, "n")?.unwrap_or(1);
    if n == 0 || n > s.cfg.max_n {
        return Err(ApiError::bad(format!("`n` must be in 1..={}", s.cfg.max_n), Some("n")));
    }
    let stop_strings: Vec<String> = match v.get("stop") {
        None | Some(Value::Null) => vec![],
        Some(Value::String(x)) => vec![x.clone()],
        Some(Value::Array(a)) if a.len() <= 4 && a.iter().all(|x| x.is_string()) => a.iter().filter_map(|x| x.as_str().map(String::from)).filter(|x| !x.is_empty()).collect(),
        Some(_) => return Err(ApiError::bad("`stop` must be a string or a list of up to 4 strings", Some("stop"))),
    };
    let mut stop_ids: Vec<u32> = s.tok.as_ref().map(|t| t.info.eos_ids.clone()).unwrap_or_default();
    if v.get("ignore_eos").and_then(|x| x.as_bool()) == Some(true) {
        stop_ids.clear();
    }
    if let Some(a) = v.get("stop_token_ids").and_then(|x| x.as_array()) {
        for x in a {
            stop_ids.push(x.as_u64().ok_or_else(|| ApiError::bad("`stop_token_ids` must be token ids", Some("stop_token_ids")))? as u32);
        }
    }
    let logprobs = if chat {
        match v.get("logprobs").and_then(|x| x.as_bool()) {
            Some(true) => Some(uint(v, "top_logprobs")?.unwrap_or(0).min(20)),
            _ => None,
        }
    } else {
        uint(v, "logprobs")?.map(|k| k.min(20))
    };
    let priority = match v.get("priority").and_then(|x| x.as_str()).or_else(|| headers.get("x-priority").and_then(|h| h.to_str().ok())) {
        None => Priority::Normal,
        Some(p) => Priority::parse(p).ok_or_else(|| ApiError::bad(format!("`priority` must be high, normal or low, got `{p}`"), Some("priority")))?,
    };
    let deadline = match num(v, "timeout")? {
        Some(t) if t > 0.0 && t < 1e6 => Some(Instant::now() + Duration::from_secs_f64(t)),
        Some(t) => return Err(ApiError::bad(format!("`timeout` must be a positive number of seconds, got {t}"), Some("timeout"))),
        None => None,
    };
    let stream = v.get("stream").and_then(|x| x.as_bool()).unwrap_or(false);
    let include_usage = v.get("stream_options").and_then(|o| o.get("include_usage")).and_then(|x| x.as_bool()).unwrap_or(false);
    Ok(Common { prompt, sampling: sp, max_tokens, stop_ids, stop_strings, logprobs, n, stream, priority, deadline, include_usage })
}

fn tokenizer(s: &AppState) -> Result<&Tokenizer, ApiError> {
    s.tok.as_deref().ok_or_else(|| ApiError::bad("this model has no tokenizer: send the prompt as token ids", Some("prompt")))
}

async fn completions(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let v = match read_json(&s, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let prompt = match v.get("prompt") {
        Some(Value::String(t)) => tokenizer(&s).and_then(|tk| tk.encode(t).map_err(|e| ApiError::bad(e.to_string(), Some("prompt")))),
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
            tokenizer(&s).and_then(|tk| tk.encode(a[0].as_str().unwrap_or_default()).map_err(|e| ApiError::bad(e.to_string(), Some("prompt"))))
        }
        Some(Value::Array(a)) if a.iter().all(|x| x.is_u64()) => Ok(a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect()),
        _ => Err(ApiError::bad("`prompt` must be a string or a list of token ids (one prompt per request)", Some("prompt"))),
    };
    let prompt = match prompt {
        Ok(p) => p,
        Err(e) => return e.into_response(),
    };
    if let Some(vocab) = s.tok.as_ref().map(|t| t.vocab_size()) {
        if prompt.iter().any(|&t| t as usize >= vocab) {
            return ApiError::bad(format!("a prompt token id is outside the vocabulary ({vocab})"), Some("prompt")).into_response();
        }
    }
    match common(&s, &v, &headers, prompt, false) {
        Ok(c) => run(s, c, false).await,
        Err(e) => {
            s.metrics.error(e.code.unwrap_or("invalid_request"));
            e.into_response()
        }
    }
}

async fn chat(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let v = match read_json(&s, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let tk = match tokenizer(&s) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let Some(msgs) = v.get("messages").and_then(|m| m.as_array()).filter(|m| !m.is_empty()) else {
        return ApiError::bad("`messages` must be a non-empty list", Some("messages")).into_response();
    };
    let mut conv = vec![];
    for m in msgs {
        let role = m.get("role").and_then(|r| r.as_str());
        let content = match m.get("content") {
            Some(Value::String(c)) => Some(c.clone()),
            // content parts: the text ones
            Some(Value::Array(parts)) => Some(parts.iter().filter_map(|p| p.get("text").and_then(|t| t.as_str())).collect::<Vec<_>>().join("")),
            _ => None,
        };
        match (role, content) {
            (Some(r @ ("system" | "user" | "assistant" | "developer")), Some(c)) => conv.push((if r == "developer" { "system".into() } else { r.to_string() }, c)),
            _ => return ApiError::bad("each message needs a `role` (system, user, assistant) and text `content`", Some("messages")).into_response(),
        }
    }
    let prompt = match tk.apply_chat_template(&conv).and_then(|t| tk.encode(&t)) {
        Ok(p) => p,
        Err(e) => return ApiError::bad(e.to_string(), Some("messages")).into_response(),
    };
    match common(&s, &v, &headers, prompt, true) {
        Ok(c) => run(s, c, true).await,
        Err(e) => {
            s.metrics.error(e.code.unwrap_or("invalid_request"));
            e.into_response()
        }
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn logprob_json(s: &AppState, chat: bool, id: u32, lp: &(f32, Vec<(u32, f32)>)) -> Value {
    let name = |t: u32| s.tok.as_ref().and_then(|tk| tk.decode(&[t], false).ok()).unwrap_or_else(|| t.to_string());
    if chat {
        json!({"token": name(id), "logprob": lp.0, "bytes": name(id).into_bytes(), "top_logprobs": lp.1.iter().map(|(t, l)| json!({"token": name(*t), "logprob": l, "bytes": name(*t).into_bytes()})).collect::<Vec<_>>()})
    } else {
        json!({"token": name(id), "logprob": lp.0, "top": lp.1.iter().map(|(t, l)| (name(*t), json!(l))).collect::<serde_json::Map<String, Value>>()})
    }
}

async fn run(s: Arc<AppState>, c: Common, chat: bool) -> Response {
    let (tx, rx) = unbounded_channel();
    let seq = s.next_id.fetch_add(1, Ordering::Relaxed);
    let id = if chat { format!("chatcmpl-{seq}") } else { format!("cmpl-{seq}") };
    let req = GenRequest {
        prompt: c.prompt,
        sampling: c.sampling,
        max_tokens: c.max_tokens,
        stop_ids: c.stop_ids,
        stop_strings: c.stop_strings,
        logprobs: c.logprobs,
        n: c.n,
        priority: c.priority,
        deadline: c.deadline,
        events: tx,
    };
    if let Err(e) = s.engine.submit(req) {
        return ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: e.to_string(), kind: "server_error", param: None, code: None }.into_response();
    }
    if c.stream {
        stream(s, rx, id, chat, c.n, c.include_usage).into_response()
    } else {
        collect(s, rx, id, chat, c.n).await
    }
}

struct Choice {
    text: String,
    reason: Option<String>,
    lps: Vec<Value>,
}

async fn collect(s: Arc<AppState>, mut rx: UnboundedReceiver<Event>, id: String, chat: bool, n: usize) -> Response {
    let mut ch: Vec<Choice> = (0..n).map(|_| Choice { text: String::new(), reason: None, lps: vec![] }).collect();
    let (mut prompt_tokens, mut completion, mut cached) = (0, 0, 0);
    while let Some(e) = rx.recv().await {
        match e {
            Event::Token { choice, id: t, text, logprob } => {
                ch[choice].text.push_str(&text);
                if let Some(lp) = &logprob {
                    ch[choice].lps.push(logprob_json(&s, chat, t, lp));
                }
            }
            Event::Done { choice, reason, text, prompt_tokens: p, completion_tokens, cached_tokens } => {
                ch[choice].text.push_str(&text);
                ch[choice].reason = Some(reason);
                prompt_tokens = p;
                completion += completion_tokens;
                cached = cached_tokens;
                if ch.iter().all(|c| c.reason.is_some()) {
                    break;
                }
            }
            Event::Error(m) => return ApiError::bad(m, None).into_response(),
        }
    }
    let choices: Vec<Value> = ch
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let reason = c.reason.unwrap_or_else(|| "error".into());
            if chat {
                json!({"index": i, "message": {"role": "assistant", "content": c.text}, "logprobs": if c.lps.is_empty() { Value::Null } else { json!({"content": c.lps}) }, "finish_reason": reason})
            } else {
                let lp = if c.lps.is_empty() {
                    Value::Null
                } else {
                    json!({"tokens": c.lps.iter().map(|l| l["token"].clone()).collect::<Vec<_>>(), "token_logprobs": c.lps.iter().map(|l| l["logprob"].clone()).collect::<Vec<_>>(), "top_logprobs": c.lps.iter().map(|l| l["top"].clone()).collect::<Vec<_>>()})
                };
                json!({"index": i, "text": c.text, "logprobs": lp, "finish_reason": reason})
            }
        })
        .collect();
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion, "prompt_tokens_details": {"cached_tokens": cached}});
    Json(json!({"id": id, "object": if chat { "chat.completion" } else { "text_completion" }, "created": now_secs(), "model": s.cfg.model_name, "choices": choices, "usage": usage})).into_response()
}

fn stream(s: Arc<AppState>, rx: UnboundedReceiver<Event>, id: String, chat: bool, n: usize, include_usage: bool) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    struct St {
        rx: UnboundedReceiver<Event>,
        s: Arc<AppState>,
        id: String,
        chat: bool,
        n: usize,
        started: Vec<bool>,
        done: usize,
        completion: usize,
        prompt_tokens: usize,
        finished: bool,
        include_usage: bool,
        pending: std::collections::VecDeque<String>,
    }
    let created = now_secs();
    let st = St { rx, s, id, chat, n, started: vec![false; n], done: 0, completion: 0, prompt_tokens: 0, finished: false, include_usage, pending: Default::default() };
    let chunk = move |st: &St, choice: usize, text: &str, reason: Option<&str>, lp: Option<Value>, role: bool| -> String {
        let c = if st.chat {
            let mut delta = serde_json::Map::new();
            if role {
                delta.insert("role".into(), json!("assistant"));
            }
            if !text.is_empty() || reason.is_none() {
                delta.insert("content".into(), json!(text));
            }
            json!({"index": choice, "delta": delta, "logprobs": lp.map(|l| json!({"content": [l]})), "finish_reason": reason})
        } else {
            json!({"index": choice, "text": text, "logprobs": lp, "finish_reason": reason})
        };
        json!({"id": st.id, "object": if st.chat { "chat.completion.chunk" } else { "text_completion" }, "created": created, "model": st.s.cfg.model_name, "choices": [c]}).to_string()
    };
    let events = futures_util::stream::unfold(st, move |mut st| async move {
        loop {
            if let Some(p) = st.pending.pop_front() {
                return Some((Ok(SseEvent::default().data(p)), st));
            }
            if st.finished {
                return None;
            }
            match st.rx.recv().await {
                Some(Event::Token { choice, id: t, text, logprob }) => {
                    let role = !st.started[choice];
                    st.started[choice] = true;
                    let lp = logprob.as_ref().map(|l| logprob_json(&st.s, st.chat, t, l));
                    if !text.is_empty() || role || lp.is_some() {
                        let c = chunk(&st, choice, &text, None, lp, role);
                        st.pending.push_back(c);
                    }
                }
                Some(Event::Done { choice, reason, text, prompt_tokens, completion_tokens, .. }) => {
                    st.done += 1;
                    st.completion += completion_tokens;
                    st.prompt_tokens = prompt_tokens;
                    let role = !st.started[choice];
                    st.started[choice] = true;
                    let c = chunk(&st, choice, &text, Some(&reason), None, role);
                    st.pending.push_back(c);
                    if st.done == st.n {
                        if st.include_usage {
                            let u = json!({"id": st.id, "object": if st.chat { "chat.completion.chunk" } else { "text_completion" }, "created": created, "model": st.s.cfg.model_name, "choices": [], "usage": {"prompt_tokens": st.prompt_tokens, "completion_tokens": st.completion, "total_tokens": st.prompt_tokens + st.completion}});
                            st.pending.push_back(u.to_string());
                        }
                        st.pending.push_back("[DONE]".into());
                        st.finished = true;
                    }
                }
                Some(Event::Error(m)) => {
                    st.pending.push_back(json!({"error": {"message": m, "type": "invalid_request_error", "param": Value::Null, "code": Value::Null}}).to_string());
                    st.pending.push_back("[DONE]".into());
                    st.finished = true;
                }
                None => return None,
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// Serve until SIGINT/SIGTERM, then drain: not ready, stop accepting, let running requests
/// finish, stop the engine.
pub async fn serve(state: Arc<AppState>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let app = router(state.clone());
    let st = state.clone();
    let shutdown = async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        #[cfg(not(unix))]
        let term = std::future::pending::<()>();
        tokio::select! {
            _ = ctrl_c => {},
            _ = term => {},
        }
        tracing::info!(target: "dsc::serve", "shutting down: draining running requests");
        st.ready.store(false, Ordering::SeqCst);
    };
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await?;
    state.engine.shutdown();
    Ok(())
}
