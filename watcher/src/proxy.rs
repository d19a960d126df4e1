//! The OpenAI-compatible proxy that remembers (`[proxy]` in the configuration file):
//! `POST /v1/chat/completions` and `GET /v1/models` on a TCP address of their own, with
//! the clients' API key as the bearer token.
//!
//! Each request names its stream: the path (`/streams/NAME/v1/chat/completions`, so a
//! client's base URL carries it), the `X-Memagent-Stream` header, or the body's `user`
//! field. The stream's latest memory, and the passages of everything the stream stored
//! that best match the request's latest user message (about [`EVIDENCE_CHARS`]
//! characters of them), go into the request as a first system message;
//! the request goes on to the upstream server (or, without one, the daemon's model
//! answers); the reply comes back unchanged, server-sent events passed through as they
//! arrive; then the request's new turns (those after its last assistant message, system
//! messages aside) and the reply are appended to the stream as chat turns, which the
//! daemon reads into memory like any other content. Upstream errors pass through with
//! their status and body, and append nothing.

use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use memagent_agent::Completion;
use memagent_engine::{Message, StopReason};
use memagent_memory::Evidence;
use memagent_recall::Recall;
use memagent_store::{MemoryVersion, Store, GENERAL};
use serde_json::{json, Value};
use tokio::sync::{mpsc, oneshot};

use crate::engine::EngineHandle;
use crate::files::Arrival;

/// The header that names a request's stream.
pub const STREAM_HEADER: &str = "x-memagent-stream";

/// Characters of passages the system message may hold (about 512 tokens).
pub const EVIDENCE_CHARS: usize = 2048;
/// Passages searched for a request's latest user message.
const EVIDENCE_K: usize = 8;

/// Reply cap of the daemon's own model when a request sets none.
const DEFAULT_MAX_TOKENS: u64 = 256;

#[derive(Clone)]
pub(crate) struct ProxyState {
    pub store: Arc<Store>,
    pub recall: Arc<Recall>,
    pub engine: EngineHandle,
    pub arrivals: tokio::sync::mpsc::UnboundedSender<Arrival>,
    /// The upstream's base URL, without a trailing slash.
    pub upstream: Option<Arc<str>>,
    pub upstream_key: Option<Arc<str>>,
    /// The daemon's model, for `/v1/models` without an upstream.
    pub model: Arc<str>,
    /// Passages ranked again by the model's likelihood of the message (0: none).
    pub rerank: usize,
    pub http: ureq::Agent,
}

impl ProxyState {
    pub fn new(
        store: Arc<Store>,
        recall: Arc<Recall>,
        engine: EngineHandle,
        arrivals: tokio::sync::mpsc::UnboundedSender<Arrival>,
        options: &crate::ProxyOptions,
        model: &str,
    ) -> Self {
        let http = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            // An upstream that accepts and never answers is given up on (a 502).
            .timeout_recv_response(Some(Duration::from_secs(600)))
            .build()
            .into();
        Self {
            store,
            recall,
            engine,
            arrivals,
            upstream: options
                .upstream
                .as_deref()
                .map(|u| Arc::from(u.trim_end_matches('/'))),
            upstream_key: options.upstream_key.as_deref().map(Arc::from),
            model: Arc::from(model),
            rerank: options.rerank,
            http,
        }
    }
}

pub(crate) fn router(state: ProxyState, token: Arc<str>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/streams/{stream}/v1/chat/completions", post(chat_in_path))
        .route("/v1/models", get(models))
        .route("/streams/{stream}/v1/models", get(models))
        .layer(axum::middleware::from_fn_with_state(token, require_token))
        .with_state(state)
}

/// An error as OpenAI's API shapes them.
fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let kind = match status {
        StatusCode::BAD_REQUEST => "invalid_request_error",
        StatusCode::UNAUTHORIZED => "authentication_error",
        StatusCode::BAD_GATEWAY => "upstream_error",
        _ => "server_error",
    };
    let body = json!({"error": {"message": message.into(), "type": kind, "code": null}});
    (status, Json(body)).into_response()
}

async fn require_token(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    if !crate::api::bearer_matches(request.headers(), &token) {
        return error(
            StatusCode::UNAUTHORIZED,
            "missing or wrong API key: give the proxy's token (proxy.token or \
             $MEMAGENT_PROXY_TOKEN) as the client's API key",
        );
    }
    next.run(request).await
}

async fn chat(State(state): State<ProxyState>, headers: HeaderMap, body: Bytes) -> Response {
    handle(state, None, &headers, &body).await
}

async fn chat_in_path(
    State(state): State<ProxyState>,
    Path(stream): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(state, Some(stream), &headers, &body).await
}

async fn handle(
    state: ProxyState,
    in_path: Option<String>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let mut request: Value = match serde_json::from_slice(body) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "the body must be a JSON object: an OpenAI chat completion request",
            )
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the body is not JSON ({e})"),
            )
        }
    };
    let named = in_path
        .or_else(|| {
            headers
                .get(STREAM_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        })
        .or_else(|| request["user"].as_str().map(str::to_string))
        .filter(|s| !s.trim().is_empty());
    let Some(stream) = named else {
        return error(
            StatusCode::BAD_REQUEST,
            "no memory stream named: give the conversation's stream as the `user` field, the \
             X-Memagent-Stream header, or in the path (/streams/NAME/v1/chat/completions)",
        );
    };
    if let Err(e) = Store::check_name(&stream) {
        return error(StatusCode::BAD_REQUEST, e.to_string());
    }
    let turns = match request["messages"].as_array() {
        Some(messages) => match new_turns(messages) {
            Ok(turns) => turns,
            Err(reason) => return error(StatusCode::BAD_REQUEST, reason),
        },
        None => {
            return error(
                StatusCode::BAD_REQUEST,
                "`messages` must be a list of chat messages",
            )
        }
    };
    let memory = match latest_memory(&state.store, &stream) {
        Ok(memory) => memory,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    let passages = match last_user_text(&request) {
        Some(text) => {
            let (store, recall, name) = (state.store.clone(), state.recall.clone(), stream.clone());
            let k = EVIDENCE_K.max(state.rerank);
            let asked = text.clone();
            let found = tokio::task::spawn_blocking(move || {
                if store.stream(&name)?.is_none() {
                    return Ok(Vec::new());
                }
                memagent_memory::search(&store, &recall, Some(&[&name]), &asked, k)
            })
            .await;
            match found {
                Ok(Ok(found)) => {
                    let mut found = ranked_again(&state, &stream, text, found).await;
                    found.truncate(EVIDENCE_K);
                    within_chars(found, EVIDENCE_CHARS)
                }
                Ok(Err(e)) => {
                    tracing::warn!("proxy: search of `{stream}` failed: {e}");
                    Vec::new()
                }
                Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
            }
        }
        None => Vec::new(),
    };
    if memory.is_some() || !passages.is_empty() {
        if let Some(messages) = request["messages"].as_array_mut() {
            let content = memory_message(&stream, memory.as_ref(), &passages);
            messages.insert(0, json!({"role": "system", "content": content}));
        }
    }
    let job = Job {
        state,
        stream,
        turns,
    };
    match job.state.upstream.clone() {
        Some(upstream) => job.forward(&upstream, request).await,
        None => job.answer_locally(request).await,
    }
}

/// The system message that carries a stream's memory and the passages found for the
/// request (either may be absent).
pub fn memory_message(
    stream: &str,
    memory: Option<&MemoryVersion>,
    passages: &[Evidence],
) -> String {
    let mut out = String::new();
    if let Some(memory) = memory {
        out.push_str(&format!(
            "Long-term memory of earlier conversations with this user (memagent stream \
             `{stream}`, version {}). A small model wrote it from what was said before: it \
             may be incomplete or out of date, and what the user says now takes \
             precedence.\n\n{}",
            memory.version,
            memory.text.trim()
        ));
    }
    if !passages.is_empty() {
        if !out.is_empty() {
            out.push_str("\n\n");
        }
        out.push_str(&format!(
            "Passages from earlier conversations with this user (memagent stream `{stream}`) \
             that may bear on the latest message, oldest first:"
        ));
        for (i, p) in passages.iter().enumerate() {
            out.push_str(&format!("\n[{}] {}", i + 1, p.hit.shown().trim()));
        }
    }
    out
}

/// `found` with its best `state.rerank` ranked again by the model's likelihood of
/// `text`, or in the search's order when none are to be or the model cannot (a remote
/// backend: said in the log).
async fn ranked_again(
    state: &ProxyState,
    stream: &str,
    text: String,
    found: Vec<Evidence>,
) -> Vec<Evidence> {
    if state.rerank == 0 || found.len() < 2 {
        return found;
    }
    match state.engine.rerank(text, found.clone(), state.rerank).await {
        Ok(ranked) => ranked,
        Err(e) => {
            tracing::warn!("proxy: passages of `{stream}` kept in the search's order: {e}");
            found
        }
    }
}

/// The text of the request's last user message.
fn last_user_text(request: &Value) -> Option<String> {
    let messages = request["messages"].as_array()?;
    let last = messages.iter().rev().find(|m| m["role"] == "user")?;
    Some(content_text(&last["content"])).filter(|t| !t.trim().is_empty())
}

/// The best passages whose texts fit in `budget` characters, in log order.
fn within_chars(found: Vec<Evidence>, budget: usize) -> Vec<Evidence> {
    let mut used = 0;
    let mut kept: Vec<Evidence> = found
        .into_iter()
        .filter(|e| {
            let n = e.hit.shown().trim().len();
            let fits = used + n <= budget;
            if fits {
                used += n;
            }
            fits
        })
        .collect();
    kept.sort_by_key(|e| e.hit.start);
    kept
}

fn latest_memory(store: &Store, stream: &str) -> memagent_store::Result<Option<MemoryVersion>> {
    let Some(record) = store.stream(stream)? else {
        return Ok(None);
    };
    Ok(store
        .latest(&record, GENERAL)?
        .filter(|v| !v.text.trim().is_empty()))
}

/// The messages after the conversation's last assistant message (system and developer
/// messages aside), as chat turns, one line each.
fn new_turns(messages: &[Value]) -> Result<String, String> {
    let role = |m: &Value| m["role"].as_str().unwrap_or_default().to_string();
    let start = messages
        .iter()
        .rposition(|m| role(m) == "assistant")
        .map_or(0, |i| i + 1);
    let mut text = String::new();
    for (i, message) in messages.iter().enumerate().skip(start) {
        if matches!(role(message).as_str(), "system" | "developer") {
            continue;
        }
        let line =
            crate::chat::render_message(message).map_err(|e| format!("messages[{i}]: {e}"))?;
        text.push_str(&line);
        text.push('\n');
    }
    Ok(text)
}

/// The text of a chat message's `content`: a string, or its text parts.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.as_str().or_else(|| p["text"].as_str()))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The assistant's text in an upstream reply: a chat completion, or its stream of
/// server-sent events.
fn reply_text(body: &[u8], event_stream: bool) -> Option<String> {
    if !event_stream {
        let reply: Value = serde_json::from_slice(body).ok()?;
        return Some(content_text(&reply["choices"][0]["message"]["content"]));
    }
    let mut text = String::new();
    for line in std::str::from_utf8(body).ok()?.lines() {
        let Some(data) = line.strip_prefix("data:").map(str::trim) else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        if let Ok(event) = serde_json::from_str::<Value>(data) {
            if let Some(piece) = event["choices"][0]["delta"]["content"].as_str() {
                text.push_str(piece);
            }
        }
    }
    Some(text)
}

/// One request on its way: where its turns go once the reply is known.
struct Job {
    state: ProxyState,
    stream: String,
    /// The request's new turns, rendered.
    turns: String,
}

impl Job {
    /// Appends the turns and the reply to the stream; the scheduler reads them in.
    fn remember(&self, reply: &str) {
        let mut text = self.turns.clone();
        if !reply.trim().is_empty() {
            if let Ok(line) =
                crate::chat::render_message(&json!({"role": "assistant", "content": reply}))
            {
                text.push_str(&line);
                text.push('\n');
            }
        }
        if text.is_empty() {
            return;
        }
        match self
            .state
            .store
            .append_with(&self.stream, text.as_bytes(), None, false)
        {
            Ok(appended) if appended.bytes > 0 => {
                let _ = self.state.arrivals.send(Arrival {
                    stream: self.stream.clone(),
                    log_len: appended.log_len,
                    at: Instant::now(),
                });
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(
                "proxy: the conversation turn was not appended to `{}`: {e}",
                self.stream
            ),
        }
    }

    /// Sends the request upstream and passes its reply through as it arrives.
    async fn forward(self, upstream: &str, request: Value) -> Response {
        let url = format!("{upstream}/chat/completions");
        let body = request.to_string().into_bytes();
        let (head_tx, head_rx) = oneshot::channel();
        let (chunk_tx, chunk_rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(64);
        tokio::task::spawn_blocking(move || {
            let mut call = self
                .state
                .http
                .post(&url)
                .header("content-type", "application/json");
            if let Some(key) = &self.state.upstream_key {
                call = call.header("authorization", format!("Bearer {key}"));
            }
            let response = match call.send(&body[..]) {
                Ok(response) => response,
                Err(e) => {
                    let _ = head_tx.send(Err(format!("the upstream {url} cannot be reached: {e}")));
                    return;
                }
            };
            let status = response.status();
            let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
            let event_stream = content_type
                .as_ref()
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.contains("text/event-stream"));
            if head_tx.send(Ok((status, content_type))).is_err() {
                return;
            }
            let mut reader = response.into_body().into_reader();
            let mut whole = Vec::new();
            let mut buffer = vec![0u8; 16 * 1024];
            loop {
                match reader.read(&mut buffer) {
                    Ok(0) => break,
                    Ok(n) => {
                        whole.extend_from_slice(&buffer[..n]);
                        let piece = Bytes::copy_from_slice(&buffer[..n]);
                        if chunk_tx.blocking_send(Ok(piece)).is_err() {
                            // The client left: the reply it did not get is not remembered.
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!("proxy: reading the reply of {url} failed: {e}");
                        let _ = chunk_tx.blocking_send(Err(e));
                        return;
                    }
                }
            }
            drop(chunk_tx);
            if status.is_success() {
                match reply_text(&whole, event_stream) {
                    Some(reply) => self.remember(&reply),
                    None => tracing::warn!(
                        "proxy: the reply of {url} is not a chat completion; the turn is not \
                         remembered"
                    ),
                }
            }
        });
        let (status, content_type) = match head_rx.await {
            Ok(Ok(head)) => head,
            Ok(Err(message)) => return error(StatusCode::BAD_GATEWAY, message),
            Err(_) => {
                return error(
                    StatusCode::BAD_GATEWAY,
                    "the upstream call ended before it answered",
                )
            }
        };
        let chunks = futures_util::stream::unfold(chunk_rx, |mut rx| async move {
            rx.recv().await.map(|chunk| (chunk, rx))
        });
        let mut response = Response::new(Body::from_stream(chunks));
        *response.status_mut() = status;
        if let Some(value) = content_type {
            response.headers_mut().insert(header::CONTENT_TYPE, value);
        }
        response
    }

    /// Answers with the daemon's model: a chat completion, or the same as server-sent
    /// events (one content event, then the finish).
    async fn answer_locally(self, request: Value) -> Response {
        let messages: Vec<Message> = request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| Message {
                role: m["role"].as_str().unwrap_or("user").to_string(),
                content: content_text(&m["content"]),
            })
            .collect();
        let max_tokens = request["max_completion_tokens"]
            .as_u64()
            .or_else(|| request["max_tokens"].as_u64())
            .unwrap_or(DEFAULT_MAX_TOKENS)
            .clamp(1, 4096) as usize;
        let completion = match self.state.engine.chat(messages, max_tokens).await {
            Ok(completion) => completion,
            Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e),
        };
        let streaming = request["stream"].as_bool().unwrap_or(false);
        let reply = local_reply(&self.state.model, &completion, streaming);
        // The reply goes back whether or not the store takes the turn (a full disk, a
        // store that hangs): `remember` says when it does not.
        let text = completion.text;
        tokio::task::spawn_blocking(move || self.remember(&text));
        reply
    }
}

/// The daemon model's reply in OpenAI's shape.
fn local_reply(model: &str, completion: &Completion, streaming: bool) -> Response {
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let id = format!("chatcmpl-memagent-{created}");
    let finish = match completion.stop_reason {
        StopReason::MaxTokens => "length",
        _ => "stop",
    };
    if !streaming {
        return Json(json!({
            "id": id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": completion.text},
                "finish_reason": finish,
            }],
            "usage": {
                "prompt_tokens": completion.prompt_tokens,
                "completion_tokens": completion.completion_tokens,
                "total_tokens": completion.prompt_tokens + completion.completion_tokens,
            },
        }))
        .into_response();
    }
    let event = |choice: Value| {
        let chunk = json!({
            "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [choice],
        });
        format!("data: {chunk}\n\n")
    };
    let body = [
        event(json!({"index": 0, "delta": {"role": "assistant", "content": completion.text}, "finish_reason": null})),
        event(json!({"index": 0, "delta": {}, "finish_reason": finish})),
        "data: [DONE]\n\n".to_string(),
    ]
    .concat();
    ([(header::CONTENT_TYPE, "text/event-stream")], body).into_response()
}

/// The models: the upstream's list as it gives it, else the daemon's model.
async fn models(State(state): State<ProxyState>) -> Response {
    let Some(upstream) = state.upstream.clone() else {
        return Json(json!({
            "object": "list",
            "data": [{"id": &*state.model, "object": "model", "created": 0, "owned_by": "memagent"}],
        }))
        .into_response();
    };
    let url = format!("{upstream}/models");
    let fetched = tokio::task::spawn_blocking(move || {
        let mut call = state.http.get(&url);
        if let Some(key) = &state.upstream_key {
            call = call.header("authorization", format!("Bearer {key}"));
        }
        let mut response = call
            .call()
            .map_err(|e| format!("the upstream {url} cannot be reached: {e}"))?;
        let status = response.status();
        let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
        let body = response
            .body_mut()
            .read_to_vec()
            .map_err(|e| format!("reading the reply of {url} failed: {e}"))?;
        Ok::<_, String>((status, content_type, body))
    })
    .await;
    match fetched {
        Ok(Ok((status, content_type, body))) => {
            let mut response = Response::new(Body::from(body));
            *response.status_mut() = status;
            if let Some(value) = content_type {
                response.headers_mut().insert(header::CONTENT_TYPE, value);
            }
            response
        }
        Ok(Err(message)) => error(StatusCode::BAD_GATEWAY, message),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::{new_turns, reply_text};
    use serde_json::json;

    #[test]
    fn new_turns_are_those_after_the_last_reply() {
        let messages = [
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": "Hi"}),
            json!({"role": "assistant", "content": "Hello"}),
            json!({"role": "user", "content": "I moved to Porto.", "name": "Ana"}),
            json!({"role": "system", "content": "Tools follow."}),
        ];
        assert_eq!(
            new_turns(&messages).unwrap(),
            "user (Ana): I moved to Porto.\n"
        );
        assert_eq!(new_turns(&messages[..2]).unwrap(), "user: Hi\n");
        let bad = [json!({"role": "user"})];
        assert!(new_turns(&bad).unwrap_err().starts_with("messages[0]: "));
    }

    #[test]
    fn replies_are_read_from_completions_and_events() {
        let whole = json!({"choices": [{"message": {"content": "Porto."}}]}).to_string();
        assert_eq!(
            reply_text(whole.as_bytes(), false).as_deref(),
            Some("Porto.")
        );
        let events = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"Por\"}}]}\n\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"to.\"}}]}\n\n\
                      data: [DONE]\n\n";
        assert_eq!(
            reply_text(events.as_bytes(), true).as_deref(),
            Some("Porto.")
        );
    }
}
