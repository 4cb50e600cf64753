//! `dsc serve`: an OpenAI-compatible HTTP server over the engine (axum on tokio).
//!
//! Endpoints: `POST /v1/completions`, `POST /v1/chat/completions` (both with `stream: true`
//! over server-sent events), `GET /v1/models` (with vLLM's `max_model_len`), `GET
//! /v1/models/{id}`, vLLM's `POST /tokenize`, `POST /detokenize` and `GET /version`, `GET /health` (liveness: the engine can serve —
//! its thread runs, it has not given up after failed steps, no step is stalled past the
//! watchdog; [`crate::health`]), `GET /ready` (readiness: that, and loaded and not draining),
//! `GET /metrics` (Prometheus).
//!
//! Errors use OpenAI's shape `{"error": {"message", "type", "param", "code"}}`: 400
//! `invalid_request_error` for bad requests, 401, 404, 405, 408 `timeout` (the request's own
//! `timeout` or the body read), 413, 500 `server_error` (the engine failed this request; it goes
//! on), 503 `overloaded` with `Retry-After` (queue or connection cap full, engine unavailable,
//! draining). `finish_reason` is only `stop` or `length`; a request that fails after tokens were
//! streamed ends with an error event (`data: {"error": ...}`) then `[DONE]`.
//! Extensions: `priority` ("high" | "normal" | "low", or the `x-priority` header), `timeout`
//! (seconds until the request is ended with a 408 error), `min_p`, `top_k`,
//! `repetition_penalty`, `stop_token_ids`, `ignore_eos`. `logit_bias` is honoured; `best_of`
//! (other than n), `echo`, `suffix`, `functions` (and `tools` on completions) are refused with
//! a 400 naming the field (not implemented), never ignored. Chat `tools` / `tool_choice`:
//! `crate::tools` (Hermes-format calls, held to a valid call by grammar when required or named).
//! `response_format` json_object / json_schema and `guided_regex` constrain the output
//! (`crate::structured`).
//! With `--reasoning-parser deepseek_r1` chat output is split into `reasoning_content` and
//! `content` at `</think>` (`crate::reasoning`), in whole responses and stream deltas alike.
//!
//! Connections ([`serve`]): HTTP/1.1 by hyper with a header-read timeout that also bounds the
//! idle wait between requests on a kept-alive connection, a body-read timeout (tower-http), and a
//! connection cap (past it a connection gets 503 + Retry-After and is closed).
//! Shutdown (SIGINT/SIGTERM) stops accepting, reports not-ready, and drains running requests.

use crate::metrics::Metrics;
use crate::sampler::SamplingParams;
use crate::scheduler::{EngineHandle, Event, GenRequest, Priority};
use crate::scheduler::{FailKind, Failure};
use crate::tokenizer::{ChatTurn, Tokenizer};
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
    /// requests accepted but not finished (queued or running) before new ones get 503
    pub max_pending: usize,
    /// let special tokens written in user text act as special tokens (off: they are text)
    pub allow_special_in_content: bool,
    /// chat output split into `reasoning_content` and `content` (`--reasoning-parser`)
    pub reasoning: Option<crate::reasoning::ReasoningParser>,
    /// the served model's tool-call format (`--tool-call-parser`)
    pub tool_parser: crate::tools::Parser,
    /// HTTP limits ([`serve`])
    pub http: HttpLimits,
}

/// Connection-level limits of [`serve`].
#[derive(Clone, Copy, Debug)]
pub struct HttpLimits {
    /// a request's head must arrive within this (also the idle limit between requests)
    pub header_timeout: Duration,
    /// a request's body must arrive within this
    pub body_timeout: Duration,
    /// connections open at once; past it a new one gets 503 and is closed
    pub max_connections: usize,
}

impl Default for HttpLimits {
    fn default() -> Self {
        HttpLimits { header_timeout: Duration::from_secs(10), body_timeout: Duration::from_secs(30), max_connections: 1024 }
    }
}

impl ServerConfig {
    /// Defaults for everything but the model's name and context.
    pub fn new(model_name: String, max_seq_len: usize) -> Self {
        ServerConfig {
            model_name,
            api_key: None,
            max_body_bytes: 1 << 20,
            max_seq_len,
            default_max_tokens: 16,
            max_n: 8,
            max_pending: 1024,
            allow_special_in_content: false,
            reasoning: None,
            tool_parser: Default::default(),
            http: HttpLimits::default(),
        }
    }
}

pub struct AppState {
    pub cfg: ServerConfig,
    pub engine: EngineHandle,
    pub tok: Option<Arc<Tokenizer>>,
    pub metrics: Arc<Metrics>,
    pub ready: AtomicBool,
    next_id: AtomicU64,
    /// requests handed to the engine and not yet finished
    pending: Arc<std::sync::atomic::AtomicUsize>,
    /// structured output's token trie and grammar compiler, built at the first request that asks
    grammars: std::sync::OnceLock<Result<crate::structured::Grammars, String>>,
}

impl AppState {
    pub fn new(cfg: ServerConfig, engine: EngineHandle, tok: Option<Arc<Tokenizer>>) -> Arc<Self> {
        let metrics = engine.metrics.clone();
        Arc::new(AppState { cfg, engine, tok, metrics, ready: AtomicBool::new(true), next_id: AtomicU64::new(0), pending: Default::default(), grammars: Default::default() })
    }

    /// The grammar constraint a request body asks for (`response_format`, `guided_regex`).
    fn constraint(&self, v: &Value) -> Result<Option<crate::structured::Constraint>, ApiError> {
        let Some(f) = crate::structured::format_of(v).map_err(|(m, p)| ApiError::bad(m, Some(p)))? else { return Ok(None) };
        let param = if matches!(f, crate::structured::Format::Regex(_)) { "guided_regex" } else { "response_format" };
        self.grammar(&f, param).map(Some)
    }

    /// A constraint for `f`; errors name `param`.
    fn grammar(&self, f: &crate::structured::Format, param: &'static str) -> Result<crate::structured::Constraint, ApiError> {
        tokenizer(self.tok.as_deref())?;
        let tok = self.tok.clone().expect("checked");
        let g = self.grammars.get_or_init(|| crate::structured::Grammars::new(tok));
        let g = g.as_ref().map_err(|e| ApiError::bad(format!("structured output is not available for this model: {e}"), Some(param)))?;
        g.constraint(f).map_err(|e| ApiError::bad(format!("`{param}`: {e}"), Some(param)))
    }
}

/// One request counted in [`AppState::pending`] until dropped (the response, or its stream,
/// is done).
struct PendingGuard(Arc<std::sync::atomic::AtomicUsize>);

impl Drop for PendingGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
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

    fn unavailable(message: impl Into<String>) -> Self {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: message.into(), kind: "server_error", param: None, code: Some("overloaded") }
    }

    /// What a failed request answers (before any token was sent).
    fn from_failure(f: &Failure) -> Self {
        let (status, kind, code) = match f.kind {
            FailKind::BadRequest => (StatusCode::BAD_REQUEST, "invalid_request_error", None),
            FailKind::Timeout => (StatusCode::REQUEST_TIMEOUT, "timeout", Some("timeout")),
            FailKind::Server => (StatusCode::INTERNAL_SERVER_ERROR, "server_error", Some("internal_error")),
            FailKind::Unavailable => (StatusCode::SERVICE_UNAVAILABLE, "server_error", Some("overloaded")),
        };
        ApiError { status, message: f.message.clone(), kind, param: None, code }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// The engine dropped a request without ending it (it stopped).
    fn engine_gone() -> Self {
        ApiError::from_failure(&Failure::new(FailKind::Server, "the engine stopped before the request finished"))
    }

    fn body(&self) -> Value {
        json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let retry = self.status == StatusCode::SERVICE_UNAVAILABLE || self.status == StatusCode::TOO_MANY_REQUESTS;
        let mut r = (self.status, Json(self.body())).into_response();
        if retry {
            r.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model_by_id))
        .route("/version", get(version))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/health", get(health))
        .route("/ready", get(ready))
        .route("/metrics", get(metrics))
        .route("/admin/experts", get(admin_experts_get).post(admin_experts_set))
        .fallback(|| async { ApiError { status: StatusCode::NOT_FOUND, message: "no such endpoint".into(), kind: "invalid_request_error", param: None, code: Some("not_found") } })
        .method_not_allowed_fallback(|| async {
            ApiError { status: StatusCode::METHOD_NOT_ALLOWED, message: "this endpoint does not take that method".into(), kind: "invalid_request_error", param: None, code: Some("method_not_allowed") }
        })
        // bodies are read (and limited) by the handlers themselves, for OpenAI-style errors
        .layer(axum::extract::DefaultBodyLimit::disable())
        .with_state(state)
}

async fn health(State(s): State<Arc<AppState>>) -> Response {
    match s.engine.status() {
        Ok(()) => (StatusCode::OK, Json(json!({"status": "ok"}))).into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "unhealthy", "reason": why}))).into_response(),
    }
}

async fn ready(State(s): State<Arc<AppState>>) -> Response {
    let status = s.engine.status();
    if s.ready.load(Ordering::SeqCst) && status.is_ok() {
        (StatusCode::OK, Json(json!({"status": "ready"}))).into_response()
    } else {
        let reason = status.err().unwrap_or_else(|| "draining".into());
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "not ready", "reason": reason}))).into_response()
    }
}

async fn metrics(State(s): State<Arc<AppState>>) -> Response {
    crate::nvml::sample(&s.metrics);
    ([("content-type", "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode()).into_response()
}

/// The admin endpoints act on the whole engine: they need an API key configured and given.
fn admin_auth(s: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    if s.cfg.api_key.is_none() {
        s.metrics.error("auth");
        return Err(ApiError {
            status: StatusCode::FORBIDDEN,
            message: "the admin endpoints need the server to run with --api-key".into(),
            kind: "invalid_request_error",
            param: None,
            code: Some("admin_disabled"),
        });
    }
    auth(s, headers)
}

/// The engine's answer to a failover command, off the async runtime (it waits for a step).
async fn set_expert(s: &AppState, layer: usize, expert: usize, enabled: bool) -> Result<Vec<(usize, usize)>, ApiError> {
    let engine = s.engine.clone();
    tokio::task::spawn_blocking(move || engine.set_expert(layer, expert, enabled)).await.map_err(|_| ApiError::engine_gone())?.map_err(|e| ApiError::bad(e.to_string(), None))
}

fn experts_body(disabled: &[(usize, usize)]) -> Value {
    json!({"object": "experts", "disabled": disabled.iter().map(|(l, e)| json!({"layer": l, "expert": e})).collect::<Vec<_>>()})
}

/// `GET /admin/experts`: the routed experts disabled now.
async fn admin_experts_get(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = admin_auth(&s, &headers) {
        return e.into_response();
    }
    let engine = s.engine.clone();
    match tokio::task::spawn_blocking(move || engine.disabled_experts()).await {
        Ok(Ok(d)) => Json(experts_body(&d)).into_response(),
        Ok(Err(e)) => ApiError::bad(e.to_string(), None).into_response(),
        Err(_) => ApiError::engine_gone().into_response(),
    }
}

/// `POST /admin/experts` `{"layer": L, "expert": E, "enabled": false}`: expert failover (the
/// router masks a disabled expert and renormalizes over the rest; requests in flight go on).
async fn admin_experts_set(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    if let Err(e) = admin_auth(&s, &headers) {
        return e.into_response();
    }
    let v = match read_json(&s, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let field = |k: &'static str| v[k].as_u64().map(|x| x as usize).ok_or_else(|| ApiError::bad(format!("`{k}` must be a non-negative integer"), Some(k)));
    let (layer, expert) = match (field("layer"), field("expert")) {
        (Ok(l), Ok(e)) => (l, e),
        (Err(e), _) | (_, Err(e)) => return e.into_response(),
    };
    let Some(enabled) = v["enabled"].as_bool() else { return ApiError::bad("`enabled` must be true or false", Some("enabled")).into_response() };
    match set_expert(&s, layer, expert, enabled).await {
        Ok(d) => Json(experts_body(&d)).into_response(),
        Err(e) => e.into_response(),
    }
}

/// The served model as `/v1/models` lists it (vLLM's fields: `root`, `max_model_len`).
fn model_card(s: &AppState) -> Value {
    json!({"id": s.cfg.model_name, "object": "model", "created": 0, "owned_by": "dsc", "root": s.cfg.model_name, "max_model_len": s.cfg.max_seq_len})
}

async fn models(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = auth(&s, &headers) {
        return e.into_response();
    }
    Json(json!({"object": "list", "data": [model_card(&s)]})).into_response()
}

async fn model_by_id(State(s): State<Arc<AppState>>, headers: HeaderMap, axum::extract::Path(id): axum::extract::Path<String>) -> Response {
    if let Err(e) = auth(&s, &headers) {
        return e.into_response();
    }
    if id != s.cfg.model_name {
        return model_not_found(&id, &s.cfg.model_name).into_response();
    }
    Json(model_card(&s)).into_response()
}

/// A `model` field where it is optional (/tokenize, /detokenize): if given, this server's.
fn optional_model(v: &Value, cfg: &ServerConfig) -> Result<(), ApiError> {
    match v.get("model").and_then(|m| m.as_str()) {
        Some(m) if m != cfg.model_name => Err(model_not_found(m, &cfg.model_name)),
        _ => Ok(()),
    }
}

fn model_not_found(model: &str, served: &str) -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        message: format!("The model `{model}` does not exist (this server serves `{served}`)"),
        kind: "invalid_request_error",
        param: Some("model"),
        code: Some("model_not_found"),
    }
}

/// `GET /version` (vLLM's): dsc's version.
async fn version() -> Response {
    Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

/// `POST /tokenize` (vLLM's): `{"prompt": text}` (with `add_special_tokens`, default true) or
/// `{"messages": [...]}` through the chat template -> `{"tokens", "count", "max_model_len"}`.
async fn tokenize(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let v = match read_json(&s, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let st = s.clone();
    let r = tokio::task::spawn_blocking(move || -> Result<Vec<u32>, ApiError> {
        optional_model(&v, &st.cfg)?;
        let tk = tokenizer(st.tok.as_deref())?;
        if v.get("messages").is_some() {
            return chat_prompt(&st.cfg, st.tok.as_deref(), &v, v.get("tools").filter(|t| t.is_array()));
        }
        let text = v.get("prompt").and_then(|p| p.as_str()).ok_or_else(|| ApiError::bad("`prompt` (a string) or `messages` is required", Some("prompt")))?;
        let special = match v.get("add_special_tokens") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(ApiError::bad("`add_special_tokens` must be true or false", Some("add_special_tokens"))),
        };
        // (add_special_tokens: the BOS the model asks for, as vLLM's flag means)
        let mut ids = tk.encode(text).map_err(|e| ApiError::bad(e.to_string(), Some("prompt")))?;
        if !special && tk.info.add_bos && tk.info.bos_id.is_some() && ids.first() == tk.info.bos_id.as_ref() {
            ids.remove(0);
        }
        Ok(ids)
    })
    .await;
    match r {
        Ok(Ok(t)) => Json(json!({"count": t.len(), "max_model_len": s.cfg.max_seq_len, "tokens": t})).into_response(),
        Ok(Err(e)) => e.into_response(),
        Err(e) => ApiError::from_failure(&Failure::new(FailKind::Server, format!("internal error while tokenizing: {e}"))).into_response(),
    }
}

/// `POST /detokenize` (vLLM's): `{"tokens": [ids]}` -> `{"prompt": text}`.
async fn detokenize(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    let v = match read_json(&s, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let r = (|| -> Result<String, ApiError> {
        optional_model(&v, &s.cfg)?;
        let tk = tokenizer(s.tok.as_deref())?;
        let bad = || ApiError::bad(format!("`tokens` must be a list of token ids below the vocabulary size ({})", tk.vocab_size()), Some("tokens"));
        let ids = v.get("tokens").and_then(|t| t.as_array()).ok_or_else(bad)?;
        let ids: Vec<u32> = ids.iter().map(|x| x.as_u64().filter(|&t| (t as usize) < tk.vocab_size()).map(|t| t as u32).ok_or_else(bad)).collect::<Result<_, _>>()?;
        tk.decode(&ids, false).map_err(|e| ApiError::bad(e.to_string(), Some("tokens")))
    })();
    match r {
        Ok(t) => Json(json!({"prompt": t})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `Authorization: Bearer <key>` (the scheme case-insensitive), compared in constant time.
pub fn key_matches(header: Option<&[u8]>, key: &str) -> bool {
    use subtle::ConstantTimeEq;
    let Some(h) = header else { return false };
    let Some(sp) = h.iter().position(|&b| b == b' ') else { return false };
    let (scheme, rest) = (&h[..sp], &h[sp + 1..]);
    let given = rest.trim_ascii();
    // (ct_eq on slices of different lengths is false, at once: the length is not secret)
    scheme.eq_ignore_ascii_case(b"bearer") && bool::from(given.ct_eq(key.as_bytes()))
}

fn auth(s: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &s.cfg.api_key else { return Ok(()) };
    if key_matches(headers.get("authorization").map(|v| v.as_bytes()), key) {
        Ok(())
    } else {
        s.metrics.error("auth");
        Err(ApiError { status: StatusCode::UNAUTHORIZED, message: "Incorrect API key provided.".into(), kind: "invalid_request_error", param: None, code: Some("invalid_api_key") })
    }
}

async fn read_json(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Value, ApiError> {
    auth(s, headers)?;
    if !s.ready.load(Ordering::SeqCst) {
        return Err(ApiError::unavailable("the server is shutting down"));
    }
    let bytes = read_limited(body, s.cfg.max_body_bytes).await.map_err(|e| match e {
        BodyError::TooLarge => {
            s.metrics.error("too_large");
            ApiError {
                status: StatusCode::PAYLOAD_TOO_LARGE,
                message: format!("request body exceeds {} bytes", s.cfg.max_body_bytes),
                kind: "invalid_request_error",
                param: None,
                code: Some("request_too_large"),
            }
        }
        BodyError::Broken(why) => {
            s.metrics.error("body_read");
            ApiError { status: StatusCode::REQUEST_TIMEOUT, message: format!("reading the request body failed: {why}"), kind: "invalid_request_error", param: None, code: Some("timeout") }
        }
    })?;
    parse_body(&bytes).inspect_err(|_| s.metrics.error("bad_json"))
}

/// The request body as a JSON object.
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(|e| ApiError::bad(format!("malformed JSON body: {e}"), None))?;
    if !v.is_object() {
        return Err(ApiError::bad("the body must be a JSON object", None));
    }
    Ok(v)
}

enum BodyError {
    TooLarge,
    /// the body stream failed: the client went away, or the body timeout passed
    Broken(String),
}

/// Bytes of an oversized body the server still reads (and drops) before it answers 413: a
/// client that sends the body whole then reads the answer, where an early answer and close
/// would reset its upload (seen as a broken pipe instead of the 413).
const DRAIN_MAX_BYTES: usize = 64 << 20;

/// The body, if it is at most `max` bytes; past that its bytes are read and dropped (up to
/// [`DRAIN_MAX_BYTES`] more) and the result is an error, as it is for a broken body.
async fn read_limited(body: Body, max: usize) -> Result<Vec<u8>, BodyError> {
    use futures_util::StreamExt;
    let mut stream = body.into_data_stream();
    let (mut buf, mut total) = (Vec::new(), 0usize);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| BodyError::Broken(e.to_string()))?;
        total = total.saturating_add(chunk.len());
        if total <= max {
            buf.extend_from_slice(&chunk);
        } else if total > max.saturating_add(DRAIN_MAX_BYTES) {
            return Err(BodyError::TooLarge);
        }
    }
    if total > max {
        Err(BodyError::TooLarge)
    } else {
        Ok(buf)
    }
}

/// The parts of a request both endpoints share.
pub struct Common {
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
    constraint: Option<crate::structured::Constraint>,
    /// chat with tools: output parsed into `tool_calls`
    tools: Option<crate::tools::Tools>,
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

fn common(cfg: &ServerConfig, tok: Option<&Tokenizer>, v: &Value, headers: &HeaderMap, prompt: Vec<u32>, chat: bool, seed: u64) -> Result<Common, ApiError> {
    let model = v.get("model").and_then(|m| m.as_str()).ok_or_else(|| ApiError::bad("`model` is required", Some("model")))?;
    if model != cfg.model_name {
        return Err(model_not_found(model, &cfg.model_name));
    }
    unsupported(v, chat)?;
    if prompt.is_empty() {
        return Err(ApiError::bad("the prompt is empty", Some("prompt")));
    }
    let ctx = cfg.max_seq_len;
    let max_key = if chat && v.get("max_completion_tokens").is_some() { "max_completion_tokens" } else { "max_tokens" };
    let max_tokens = match uint(v, max_key)? {
        Some(0) => return Err(ApiError::bad(format!("`{max_key}` must be at least 1"), Some("max_tokens"))),
        Some(m) => m,
        None if chat => ctx.saturating_sub(prompt.len()),
        None => cfg.default_max_tokens.min(ctx.saturating_sub(prompt.len())),
    };
    if prompt.len() >= ctx || prompt.len().saturating_add(max_tokens) > ctx {
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
    if let Some(b) = v.get("logit_bias").filter(|b| !b.is_null()) {
        let bad = |m: String| ApiError::bad(m, Some("logit_bias"));
        let map = b.as_object().ok_or_else(|| bad("`logit_bias` must map token ids to numbers in [-100, 100]".into()))?;
        if map.len() > 300 {
            return Err(bad(format!("`logit_bias` takes at most 300 tokens, got {}", map.len())));
        }
        let vocab = tok.map(|t| t.vocab_size()).unwrap_or(usize::MAX);
        for (k, x) in map {
            let t = k.parse::<u32>().ok().filter(|&t| (t as usize) < vocab).ok_or_else(|| bad(format!("`logit_bias` key `{k}` is not a token id below the vocabulary size")))?;
            let b = x.as_f64().filter(|b| (-100.0..=100.0).contains(b)).ok_or_else(|| bad(format!("`logit_bias` of `{k}` must be a number in [-100, 100], got {x}")))?;
            sp.logit_bias.push((t, b as f32));
        }
    }
    sp.seed = match v.get("seed") {
        None | Some(Value::Null) => seed,
        Some(x) => x.as_i64().ok_or_else(|| ApiError::bad("`seed` must be an integer", Some("seed")))? as u64,
    };
    sp.validate().map_err(|e| ApiError::bad(e.to_string().trim_start_matches("request: ").to_string(), None))?;
    let n = uint(v, "n")?.unwrap_or(1);
    if n == 0 || n > cfg.max_n {
        return Err(ApiError::bad(format!("`n` must be in 1..={}", cfg.max_n), Some("n")));
    }
    let stop_strings: Vec<String> = match v.get("stop") {
        None | Some(Value::Null) => vec![],
        Some(Value::String(x)) => vec![x.clone()],
        Some(Value::Array(a)) if a.len() <= 4 && a.iter().all(|x| x.is_string()) => a.iter().filter_map(|x| x.as_str().map(String::from)).filter(|x| !x.is_empty()).collect(),
        Some(_) => return Err(ApiError::bad("`stop` must be a string or a list of up to 4 strings", Some("stop"))),
    };
    let mut stop_ids: Vec<u32> = tok.map(|t| t.info.eos_ids.clone()).unwrap_or_default();
    if v.get("ignore_eos").and_then(|x| x.as_bool()) == Some(true) {
        stop_ids.clear();
    }
    if let Some(a) = v.get("stop_token_ids").and_then(|x| x.as_array()) {
        if a.len() > 64 {
            return Err(ApiError::bad("`stop_token_ids` takes at most 64 ids", Some("stop_token_ids")));
        }
        for x in a {
            let t = x.as_u64().filter(|&t| t <= u32::MAX as u64).ok_or_else(|| ApiError::bad("`stop_token_ids` must be token ids", Some("stop_token_ids")))?;
            stop_ids.push(t as u32);
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
    Ok(Common { prompt, sampling: sp, max_tokens, stop_ids, stop_strings, logprobs, n, stream, priority, deadline, include_usage, constraint: None, tools: None })
}

/// Fields dsc does not implement yet are refused with a 400 naming them, never ignored: a
/// client asking for tools, more candidates than it gets back, the prompt echoed or a suffix
/// would otherwise get an answer that silently is not what it asked for.
fn unsupported(v: &Value, chat: bool) -> Result<(), ApiError> {
    let set = |k: &str| v.get(k).is_some_and(|x| !x.is_null());
    let no = |k: &'static str, why: &str| Err(ApiError::bad(format!("`{k}` is not supported yet{why}"), Some(k)));
    if set("best_of") && v.get("best_of") != v.get("n").filter(|n| !n.is_null()).or(Some(&json!(1))) {
        return no("best_of", " (more candidates than returned); omit it or set it to n");
    }
    if set("echo") && v.get("echo") != Some(&json!(false)) {
        return no("echo", "");
    }
    if set("suffix") {
        return no("suffix", "");
    }
    let tools_empty = v.get("tools").is_none_or(|t| t.is_null() || t.as_array().is_some_and(|a| a.is_empty()));
    if !chat && !tools_empty {
        return no("tools", " on /v1/completions (use /v1/chat/completions)");
    }
    if set("functions") || set("function_call") {
        return no(if set("functions") { "functions" } else { "function_call" }, " (tool calling)");
    }
    Ok(())
}

fn tokenizer(tok: Option<&Tokenizer>) -> Result<&Tokenizer, ApiError> {
    tok.ok_or_else(|| ApiError::bad("this model has no tokenizer: send the prompt as token ids", Some("prompt")))
}

/// A `/v1/completions` body's prompt as token ids.
fn completion_prompt(tok: Option<&Tokenizer>, v: &Value) -> Result<Vec<u32>, ApiError> {
    let prompt = match v.get("prompt") {
        Some(Value::String(t)) => tokenizer(tok)?.encode(t).map_err(|e| ApiError::bad(e.to_string(), Some("prompt")))?,
        Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => tokenizer(tok)?.encode(a[0].as_str().unwrap_or_default()).map_err(|e| ApiError::bad(e.to_string(), Some("prompt")))?,
        Some(Value::Array(a)) if a.iter().all(|x| x.as_u64().is_some_and(|t| t <= u32::MAX as u64)) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => return Err(ApiError::bad("`prompt` must be a string or a list of token ids (one prompt per request)", Some("prompt"))),
    };
    if let Some(vocab) = tok.map(|t| t.vocab_size()) {
        if prompt.iter().any(|&t| t as usize >= vocab) {
            return Err(ApiError::bad(format!("a prompt token id is outside the vocabulary ({vocab})"), Some("prompt")));
        }
    }
    Ok(prompt)
}

/// A `/v1/chat/completions` body's messages through the chat template, as token ids: the
/// template's own text carries special tokens, the messages' text does not (unless the server
/// allows it: `--allow-special-tokens-in-content`).
fn chat_prompt(cfg: &ServerConfig, tok: Option<&Tokenizer>, v: &Value, tools: Option<&Value>) -> Result<Vec<u32>, ApiError> {
    let tk = tokenizer(tok)?;
    let (turns, kwargs) = chat_turns(cfg, tk, v)?;
    let r = if cfg.allow_special_in_content { tk.render_turns(&turns, tools, kwargs.as_ref()).and_then(|t| tk.encode(&t)) } else { tk.encode_turns(&turns, tools, kwargs.as_ref()) };
    r.map_err(|e| ApiError::bad(e.to_string(), Some("messages")))
}

/// A request's `chat_template_kwargs`: further variables for the chat template.
type TemplateKwargs = serde_json::Map<String, Value>;

/// A chat request's `messages` as template turns, and its `chat_template_kwargs`. Past tool
/// calls go to the template as structured `tool_calls` where it reads them (their `arguments`
/// parsed from OpenAI's JSON string where the template writes them with `tojson`, as
/// transformers' templates expect), else into the turn's text in the format the model writes
/// them.
fn chat_turns(cfg: &ServerConfig, tk: &Tokenizer, v: &Value) -> Result<(Vec<ChatTurn>, Option<TemplateKwargs>), ApiError> {
    let Some(msgs) = v.get("messages").and_then(|m| m.as_array()).filter(|m| !m.is_empty()) else {
        return Err(ApiError::bad("`messages` must be a non-empty list", Some("messages")));
    };
    let kwargs = match v.get("chat_template_kwargs") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => Some(m.clone()),
        Some(_) => return Err(ApiError::bad("`chat_template_kwargs` must be an object", Some("chat_template_kwargs"))),
    };
    let form = tk.template_tool_calls;
    let mut turns = vec![];
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(|r| r.as_str());
        let content = match m.get("content") {
            Some(Value::String(c)) => Some(c.clone()),
            // content parts: the text ones
            Some(Value::Array(parts)) => Some(parts.iter().filter_map(|p| p.get("text").and_then(|t| t.as_str())).collect::<Vec<_>>().join("")),
            _ => None,
        };
        let text = |k: &str| -> Result<Option<String>, ApiError> {
            match m.get(k) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                Some(_) => Err(ApiError::bad(format!("messages[{i}].{k} must be a string"), Some("messages"))),
            }
        };
        let calls = m.get("tool_calls").and_then(|c| c.as_array()).filter(|c| !c.is_empty());
        let mut turn = ChatTurn { role: role.unwrap_or_default().to_string(), content, tool_call_id: text("tool_call_id")?, name: text("name")?, tool_calls: None };
        match (role, calls) {
            (Some("assistant"), Some(calls)) if form.structured => {
                let calls: Vec<Value> = calls
                    .iter()
                    .map(|c| {
                        let mut c = c.clone();
                        if form.arguments_as_json && c.pointer("/function/arguments").is_some() {
                            c["function"]["arguments"] = crate::tools::call_arguments(&c["function"]);
                        }
                        c
                    })
                    .collect();
                turn.tool_calls = Some(Value::Array(calls));
            }
            (Some("assistant"), Some(calls)) => {
                turn.content = Some([turn.content.unwrap_or_default(), crate::tools::render_calls(cfg.tool_parser, calls)].into_iter().filter(|x| !x.is_empty()).collect::<Vec<_>>().join("\n"));
            }
            _ => {}
        }
        match (role, &turn.content, &turn.tool_calls) {
            (Some("developer"), Some(_), _) => turn.role = "system".into(),
            (Some("system" | "user" | "assistant" | "tool"), Some(_), _) | (Some("assistant"), None, Some(_)) => {}
            _ => return Err(ApiError::bad("each message needs a `role` (system, user, assistant, tool) and text `content` (an assistant's may be `tool_calls`)", Some("messages"))),
        }
        turns.push(turn);
    }
    Ok((turns, kwargs))
}

/// A request body checked and turned into what the engine runs (everything but the channel):
/// the prompt tokenized, every field validated. `seed`: the seed where the body gives none.
pub fn prepare(cfg: &ServerConfig, tok: Option<&Tokenizer>, v: &Value, headers: &HeaderMap, chat: bool, seed: u64) -> Result<Common, ApiError> {
    let tools = if chat { crate::tools::parse(v, cfg.tool_parser).map_err(|(m, p)| ApiError::bad(m, Some(p)))? } else { None };
    let list = tools.as_ref().map(|t| Value::Array(t.list.clone()));
    let prompt = if chat { chat_prompt(cfg, tok, v, list.as_ref())? } else { completion_prompt(tok, v)? };
    let mut c = common(cfg, tok, v, headers, prompt, chat, seed)?;
    c.tools = tools;
    Ok(c)
}

async fn completions(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    handle(s, headers, body, false).await
}

async fn chat(State(s): State<Arc<AppState>>, headers: HeaderMap, body: Body) -> Response {
    handle(s, headers, body, true).await
}

async fn handle(s: Arc<AppState>, headers: HeaderMap, body: Body, chat: bool) -> Response {
    let v = match read_json(&s, &headers, body).await {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let seed = s.next_id.load(Ordering::Relaxed).wrapping_mul(0x9E37_79B9);
    // (tokenizing and rendering the template are CPU work: off the async workers)
    let st = s.clone();
    let prepared = tokio::task::spawn_blocking(move || {
        let mut c = prepare(&st.cfg, st.tok.as_deref(), &v, &headers, chat, seed)?;
        let token_id = |m: &str| st.tok.as_ref().and_then(|t| t.token_to_id(m));
        let grammar = c.tools.as_ref().map(|t| t.grammar(&token_id)).transpose().map_err(|e| ApiError::bad(e, Some("tool_choice")))?.flatten();
        c.constraint = match grammar {
            // (a required or named tool call: the call's grammar)
            Some(_) if crate::structured::format_of(&v).ok().flatten().is_some() => {
                return Err(ApiError::bad("a required tool call and `response_format` / `guided_regex` cannot both hold", Some("tool_choice")))
            }
            Some(g) => Some(st.grammar(&crate::structured::Format::Lark(g), "tool_choice")?),
            None => st.constraint(&v)?,
        };
        Ok::<_, ApiError>(c)
    })
    .await;
    match prepared {
        Ok(Ok(c)) => run(s, c, chat).await,
        Ok(Err(e)) => {
            s.metrics.error(e.code.unwrap_or("invalid_request"));
            e.into_response()
        }
        Err(e) => {
            s.metrics.error("internal");
            ApiError::from_failure(&Failure::new(FailKind::Server, format!("internal error while reading the request: {e}"))).into_response()
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
        constraint: c.constraint,
    };
    // the bounded queue: past `max_pending` requests accepted and not finished, 503
    let n = s.pending.fetch_add(1, Ordering::SeqCst);
    let guard = PendingGuard(s.pending.clone());
    if n >= s.cfg.max_pending {
        s.metrics.refused("queue");
        return ApiError::unavailable(format!("the server is overloaded ({} requests pending): retry later", s.cfg.max_pending)).into_response();
    }
    if let Err(e) = s.engine.submit(req) {
        s.metrics.error("engine_unavailable");
        return ApiError::unavailable(e.to_string()).into_response();
    }
    if c.stream {
        stream(s, rx, id, chat, c.n, c.include_usage, c.tools.is_some(), guard).into_response()
    } else {
        let r = collect(s, rx, id, chat, c.n, c.tools.is_some()).await;
        drop(guard);
        r
    }
}

struct Choice {
    text: String,
    reason: Option<String>,
    lps: Vec<Value>,
}

async fn collect(s: Arc<AppState>, mut rx: UnboundedReceiver<Event>, id: String, chat: bool, n: usize, tools: bool) -> Response {
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
            Event::Error(f) => return ApiError::from_failure(&f).into_response(),
        }
    }
    if ch.iter().any(|c| c.reason.is_none()) {
        // the engine dropped the request without ending it (it stopped)
        return ApiError::engine_gone().into_response();
    }
    let choices: Vec<Value> = ch
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let reason = c.reason.unwrap_or_default();
            if chat {
                let (r, content) = match s.cfg.reasoning {
                    Some(_) => crate::reasoning::split(&c.text),
                    None => (None, Some(c.text.clone())),
                };
                let mut msg = json!({"role": "assistant", "content": content});
                if s.cfg.reasoning.is_some() {
                    msg["reasoning_content"] = json!(r);
                }
                let mut reason = reason;
                if tools {
                    let (content, calls) = crate::tools::extract(s.cfg.tool_parser, content.as_deref().unwrap_or_default(), &format!("{id}_{i}"));
                    msg["content"] = json!(content);
                    if !calls.is_empty() {
                        msg["tool_calls"] = json!(calls);
                        reason = "tool_calls".into();
                    }
                }
                json!({"index": i, "message": msg, "logprobs": if c.lps.is_empty() { Value::Null } else { json!({"content": c.lps}) }, "finish_reason": reason})
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

#[allow(clippy::too_many_arguments)]
fn stream(
    s: Arc<AppState>,
    rx: UnboundedReceiver<Event>,
    id: String,
    chat: bool,
    n: usize,
    include_usage: bool,
    tools: bool,
    guard: PendingGuard,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, std::convert::Infallible>>> {
    struct St {
        _guard: PendingGuard,
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
        /// per choice, with `--reasoning-parser` (chat)
        split: Option<Vec<crate::reasoning::ReasoningSplit>>,
        /// per choice, with tools (chat)
        calls: Option<Vec<crate::tools::ToolStream>>,
    }
    let created = now_secs();
    let split = (chat && s.cfg.reasoning.is_some()).then(|| (0..n).map(|_| Default::default()).collect());
    let calls = (chat && tools).then(|| (0..n).map(|_| crate::tools::ToolStream::new(s.cfg.tool_parser)).collect());
    let st = St { _guard: guard, rx, s, id, chat, n, started: vec![false; n], done: 0, completion: 0, prompt_tokens: 0, finished: false, include_usage, pending: Default::default(), split, calls };
    // (`reasoning`: the delta's reasoning_content, with --reasoning-parser)
    let chunk = move |st: &St, choice: usize, reasoning: &str, text: &str, reason: Option<&str>, lp: Option<Value>, role: bool| -> String {
        let c = if st.chat {
            let mut delta = serde_json::Map::new();
            if role {
                delta.insert("role".into(), json!("assistant"));
            }
            if !reasoning.is_empty() {
                delta.insert("reasoning_content".into(), json!(reasoning));
            }
            if !text.is_empty() || (reason.is_none() && reasoning.is_empty()) {
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
                    let (r, text) = match &mut st.split {
                        Some(sp) => sp[choice].feed(&text),
                        None => (String::new(), text),
                    };
                    let text = match &mut st.calls {
                        Some(cs) => cs[choice].feed(&text),
                        None => text,
                    };
                    if !text.is_empty() || !r.is_empty() || role || lp.is_some() {
                        let c = chunk(&st, choice, &r, &text, None, lp, role);
                        st.pending.push_back(c);
                    }
                }
                Some(Event::Done { choice, reason, text, prompt_tokens, completion_tokens, .. }) => {
                    st.done += 1;
                    st.completion += completion_tokens;
                    st.prompt_tokens = prompt_tokens;
                    let role = !st.started[choice];
                    st.started[choice] = true;
                    let (r, text) = match &mut st.split {
                        Some(sp) => {
                            let (r1, c1) = sp[choice].feed(&text);
                            let (r2, c2) = sp[choice].finish();
                            (r1 + &r2, c1 + &c2)
                        }
                        None => (String::new(), text),
                    };
                    // (tools: the held text parsed; calls go out as one delta before the end)
                    let mut role = role;
                    let (text, reason) = match &mut st.calls {
                        Some(cs) => {
                            let mut t = cs[choice].feed(&text);
                            let (rest, calls) = cs[choice].finish(&format!("{}_{choice}", st.id));
                            t.push_str(&rest);
                            if calls.is_empty() {
                                (t, reason)
                            } else {
                                let calls: Vec<Value> = calls
                                    .into_iter()
                                    .enumerate()
                                    .map(|(k, mut c)| {
                                        c["index"] = json!(k);
                                        c
                                    })
                                    .collect();
                                if !t.is_empty() {
                                    st.pending.push_back(chunk(&st, choice, "", &t, None, None, role));
                                }
                                let mut delta = json!({"tool_calls": calls});
                                if role && t.is_empty() {
                                    delta["role"] = json!("assistant");
                                }
                                let c = json!({"index": choice, "delta": delta, "logprobs": Value::Null, "finish_reason": Value::Null});
                                st.pending.push_back(json!({"id": st.id, "object": "chat.completion.chunk", "created": created, "model": st.s.cfg.model_name, "choices": [c]}).to_string());
                                role = false;
                                (String::new(), "tool_calls".to_string())
                            }
                        }
                        None => (text, reason),
                    };
                    let c = chunk(&st, choice, &r, &text, Some(&reason), None, role);
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
                Some(Event::Error(f)) => {
                    st.pending.push_back(ApiError::from_failure(&f).body().to_string());
                    st.pending.push_back("[DONE]".into());
                    st.finished = true;
                }
                None => {
                    // the engine dropped the request without ending it (it stopped)
                    st.pending.push_back(ApiError::engine_gone().body().to_string());
                    st.pending.push_back("[DONE]".into());
                    st.finished = true;
                }
            }
        }
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

/// Resolves once the engine has been unhealthy for `after` without a break (polled every
/// 100 ms), with the last reason: `dsc serve --exit-unhealthy-secs` then exits the process.
pub async fn unhealthy_for(engine: &EngineHandle, after: Duration) -> String {
    let mut since: Option<Instant> = None;
    loop {
        match engine.status() {
            Ok(()) => since = None,
            Err(why) => {
                let t = *since.get_or_insert_with(Instant::now);
                if t.elapsed() >= after {
                    return why;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Serve until SIGINT/SIGTERM, then drain: not ready, stop accepting, let running requests
/// finish, stop the engine.
pub async fn serve(state: Arc<AppState>, listener: tokio::net::TcpListener) -> std::io::Result<()> {
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
    serve_until(state.clone(), listener, shutdown).await?;
    state.engine.shutdown();
    Ok(())
}

/// The accept loop of [`serve`], until `shutdown` resolves; then it waits for the open
/// connections' requests to finish. Each connection is HTTP/1.1 (hyper) with the header-read
/// timeout (from accept, and again while idle between requests), the body timeout
/// (tower-http's `RequestBodyTimeoutLayer`), and at most `max_connections` at once.
pub async fn serve_until(state: Arc<AppState>, listener: tokio::net::TcpListener, shutdown: impl std::future::Future<Output = ()>) -> std::io::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let lim = state.cfg.http;
    let app = router(state.clone()).layer(tower_http::timeout::RequestBodyTimeoutLayer::new(lim.body_timeout));
    let conns = Arc::new(tokio::sync::Semaphore::new(lim.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(lim.header_timeout).keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        let (stream, _peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // (out of file descriptors and the like: back off, keep serving)
                    tracing::warn!(target: "dsc::serve", "accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = conns.clone().try_acquire_owned() else {
            state.metrics.refused("connections");
            tokio::spawn(refuse(stream));
            continue;
        };
        let svc = hyper_util::service::TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn);
        tokio::spawn(async move {
            let _ = conn.await;
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

/// A connection past the cap: a 503 with Retry-After, then closed (within a second whatever
/// the client does).
async fn refuse(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let body = ApiError::unavailable("the server is at its connection limit: retry later").body().to_string();
    let resp = format!("HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = stream.write_all(resp.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_keys_match_in_any_scheme_case_and_only_whole() {
        let k = "s3cret";
        for ok in ["Bearer s3cret", "bearer s3cret", "BEARER s3cret", "Bearer  s3cret "] {
            assert!(key_matches(Some(ok.as_bytes()), k), "{ok}");
        }
        for bad in ["Bearer s3cre", "Bearer s3cretx", "Basic s3cret", "s3cret", "Bearer", "", "Bearers3cret"] {
            assert!(!key_matches(Some(bad.as_bytes()), k), "{bad}");
        }
        assert!(!key_matches(None, k));
    }

    #[test]
    fn failures_answer_with_openai_codes() {
        let cases = [
            (FailKind::BadRequest, StatusCode::BAD_REQUEST, "invalid_request_error"),
            (FailKind::Timeout, StatusCode::REQUEST_TIMEOUT, "timeout"),
            (FailKind::Server, StatusCode::INTERNAL_SERVER_ERROR, "server_error"),
            (FailKind::Unavailable, StatusCode::SERVICE_UNAVAILABLE, "server_error"),
        ];
        for (kind, status, ty) in cases {
            let e = ApiError::from_failure(&Failure::new(kind, "m"));
            assert_eq!((e.status(), e.body()["error"]["type"].as_str()), (status, Some(ty)), "{kind:?}");
            let r = e.into_response();
            // overload answers say when to come back
            assert_eq!(r.headers().contains_key("retry-after"), status == StatusCode::SERVICE_UNAVAILABLE);
        }
    }
}

#[cfg(test)]
mod template_tests {
    use super::*;
    use serde_json::json;

    /// A byte-level tokenizer whose special tokens are `specials` (bos first, eos second), with
    /// the chat template `tpl`.
    fn tokenizer_with(tpl: &str, specials: &[&str]) -> Tokenizer {
        crate::tokenizer::byte_level_for_tests(specials, Some(256), vec![257], Some(tpl.into()))
    }

    /// The official templates' cases (tests/fixtures/chat/official/expected.json, rendered by
    /// transformers) sent as an OpenAI client sends them — past calls' `arguments` as JSON
    /// strings, Llama's pinned date through `chat_template_kwargs` — render as transformers
    /// rendered them: the past calls reach the template as structured `tool_calls`.
    #[test]
    fn api_messages_with_past_tool_calls_render_as_transformers_renders_them() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat/official");
        let expected: serde_json::Map<String, Value> = serde_json::from_str(&std::fs::read_to_string(dir.join("expected.json")).unwrap()).unwrap();
        let cfg = ServerConfig::new("m".into(), 4096);
        let mut with_calls = 0;
        for (name, rows) in &expected {
            let tpl = std::fs::read_to_string(dir.join(name)).unwrap();
            for r in rows.as_array().unwrap() {
                let ctx = &r["context"];
                let tk = tokenizer_with(&tpl, &[ctx["bos_token"].as_str().unwrap(), ctx["eos_token"].as_str().unwrap()]);
                // (the server always asks for the generation prompt; tool results as objects are
                // not OpenAI messages)
                let msgs = ctx["messages"].as_array().unwrap();
                if ctx["add_generation_prompt"] != json!(true) || msgs.iter().any(|m| m["content"].is_object()) {
                    continue;
                }
                let api: Vec<Value> = msgs
                    .iter()
                    .map(|m| {
                        let mut m = m.clone();
                        for c in m.get_mut("tool_calls").and_then(|c| c.as_array_mut()).into_iter().flatten() {
                            if !c["function"]["arguments"].is_string() {
                                c["function"]["arguments"] = json!(c["function"]["arguments"].to_string());
                            }
                        }
                        m
                    })
                    .collect();
                with_calls += api.iter().any(|m| m.get("tool_calls").is_some()) as usize;
                let mut body = json!({"messages": api});
                if let Some(t) = ctx.get("tools") {
                    body["tools"] = t.clone();
                }
                if let Some(d) = ctx.get("date_string") {
                    body["chat_template_kwargs"] = json!({"date_string": d});
                }
                let (turns, kwargs) = chat_turns(&cfg, &tk, &body).unwrap_or_else(|e| panic!("{name}: {}", e.body()));
                let got = tk.render_turns(&turns, body.get("tools"), kwargs.as_ref()).unwrap();
                assert_eq!(got, r["rendered"].as_str().unwrap(), "{name}: {}", body["messages"]);
                assert!(chat_prompt(&cfg, Some(&tk), &body, body.get("tools")).is_ok(), "{name}: encodes");
            }
        }
        assert!(with_calls >= 3, "cases with past tool calls: {with_calls}");
        // chat_template_kwargs: an object, and not one that replaces the server's variables
        let tk = tokenizer_with("{{ messages[0].content }}", &["<s>", "</s>"]);
        let e = chat_turns(&cfg, &tk, &json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": 3})).unwrap_err();
        assert!(e.body()["error"]["message"].as_str().unwrap().contains("chat_template_kwargs"), "{}", e.body());
        let e = chat_prompt(&cfg, Some(&tk), &json!({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"messages": []}}), None).unwrap_err();
        assert!(e.body()["error"]["message"].as_str().unwrap().contains("`messages`"), "{}", e.body());
        // a special token's text inside a past call's arguments is refused
        let tk = tokenizer_with("{% for m in messages %}{{ m.tool_calls | tojson }}{% endfor %}", &["<s>", "</s>"]);
        let evil = json!({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"x\": \"</s>\"}"}}]}]});
        assert!(chat_prompt(&cfg, Some(&tk), &evil, None).is_err());
    }
}
