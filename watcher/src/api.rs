//! The local API: HTTP/JSON over the Unix socket in the data directory (and, when
//! configured, over TCP with a bearer token). `memctl` uses it while the daemon holds the
//! database.
//!
//! | request | answer |
//! |---|---|
//! | `GET /v1/status` | the daemon, the model, its resident memory, the passages read ahead, and per stream pending work, lag, throughput |
//! | `GET /v1/streams` | the streams (as `memctl streams list --json`) |
//! | `DELETE /v1/streams?stream=S` | removes a stream |
//! | `POST /v1/append` `{stream, text, source?, force?}` | commit 1; the daemon reads it in |
//! | `GET /v1/memory?stream=S[&at=V][&sources=true]` | a memory version (with each line's source) |
//! | `GET /v1/history?stream=S` | every memory version |
//! | `GET /v1/answers?stream=S` | the standing questions' answers, by version |
//! | `POST /v1/memory` `{stream, version}` | adds a version written by a person |
//! | `POST /v1/query` `{stream, question, at?, deep?, rerank?}` | an answer from the memory |
//! | `POST /v1/query` `{stream, questions: [..], at?, deep?}` | `{stream, answers: [..]}`, decoded as one batch |
//! | `POST /v1/search` `{stream? \| streams? \| all?, text, k?}` | `{text, passages: [..]}`: passages with provenance and scores |
//!
//! A query answers from the memory beside the passages a search finds for each question
//! (`evidence_tokens` of them at most, from `k` found; `passages` in the answer), unless
//! it asks for `memory_only` (the memory alone) or `deep`.
//!
//! Errors are `{"error": "…"}` with status 400, 404, 413, 415 or 500, including the
//! framework's own rejections (malformed JSON, a missing field, a body over the limit:
//! 413 with `limit_bytes`, [`BODY_LIMIT`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use memagent_memory::{Answer, Mode, PASSAGES_K};
use memagent_recall::Recall;
use memagent_store::{MemoryVersion, Store, GENERAL};
use serde::Deserialize;
use serde_json::{json, Value};

use crate::engine::EngineHandle;
use crate::files::Arrival;
use crate::stats::Stats;

/// Facts about the running daemon for `status`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct DaemonInfo {
    pub pid: u32,
    pub version: String,
    pub model: String,
    pub chunk_tokens: usize,
    pub memory_tokens: usize,
    pub data_dir: String,
    pub idle_seconds: f64,
    pub watches: usize,
}

#[derive(Clone)]
pub(crate) struct AppState {
    pub store: Arc<Store>,
    pub engine: EngineHandle,
    pub stats: Arc<Mutex<Stats>>,
    pub info: Arc<DaemonInfo>,
    /// Tells the scheduler about content appended through the API.
    pub arrivals: tokio::sync::mpsc::UnboundedSender<Arrival>,
    /// The passage index (the indexer thread keeps it caught up).
    pub recall: Arc<Recall>,
    /// How long a write may take before it is reported as failed.
    pub write_timeout: std::time::Duration,
    /// Whether the engine reads new passages ahead ([`crate::DaemonOptions::read_ahead`]).
    pub read_ahead: bool,
    /// Passages a query that does not say ranks again ([`crate::DaemonOptions::rerank`]).
    pub rerank: usize,
}

/// Bytes a request body may hold.
pub const BODY_LIMIT: usize = 16 * 1024 * 1024;

pub(crate) struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(json!({ "error": self.1 }))).into_response()
    }
}

impl From<memagent_store::Error> for ApiError {
    fn from(e: memagent_store::Error) -> Self {
        let status = match e {
            memagent_store::Error::NoStream(_) | memagent_store::Error::NoVersion { .. } => {
                StatusCode::NOT_FOUND
            }
            memagent_store::Error::BadName(_) => StatusCode::BAD_REQUEST,
            memagent_store::Error::NoSpace { .. } => StatusCode::INSUFFICIENT_STORAGE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self(status, e.to_string())
    }
}

impl From<memagent_memory::Error> for ApiError {
    fn from(e: memagent_memory::Error) -> Self {
        match e {
            memagent_memory::Error::Store(e) => e.into(),
            memagent_memory::Error::NoMemory { at: None, .. } => Self(
                StatusCode::NOT_FOUND,
                format!("{e}; the daemon reads it as content arrives"),
            ),
            memagent_memory::Error::NoMemory { .. } => Self(StatusCode::NOT_FOUND, e.to_string()),
            _ => Self(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }
}

fn engine_error(e: String) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e)
}

type ApiResult<T = Json<Value>> = Result<T, ApiError>;

/// Runs `call` (which uses the store) off the async workers, within the daemon's write
/// deadline: a store that hangs (a write stuck on a full or failing disk) then holds up
/// one blocking thread, never the workers that serve everything else. A call still
/// running at the deadline is answered 503, not acknowledged, and the store reported
/// degraded (`daemon status`) until a write finishes again.
pub(crate) async fn store_call<T: Send + 'static>(
    state: &AppState,
    what: String,
    call: impl FnOnce(&AppState) -> ApiResult<T> + Send + 'static,
) -> ApiResult<T> {
    let task = {
        let state = state.clone();
        tokio::task::spawn_blocking(move || call(&state))
    };
    match tokio::time::timeout(state.write_timeout, task).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => Err(engine_error(e.to_string())),
        Err(_) => {
            let why = format!(
                "{what} did not finish within {:.0} s",
                state.write_timeout.as_secs_f64()
            );
            tracing::error!("store degraded: {why}");
            state.stats.lock().expect("stats").degraded = Some(why.clone());
            Err(ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "{why}; it is not acknowledged. The data directory's disk may be full \
                     or failing: see `memctl daemon status`"
                ),
            ))
        }
    }
}

/// [`store_call`] for a write: one that finishes clears the degraded state.
pub(crate) async fn write<T: Send + 'static>(
    state: &AppState,
    what: String,
    write: impl FnOnce(&Store) -> memagent_store::Result<T> + Send + 'static,
) -> ApiResult<T> {
    let done = store_call(state, what, move |state| Ok(write(&state.store)?)).await?;
    state.stats.lock().expect("stats").degraded = None;
    Ok(done)
}

pub(crate) fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/status", get(status))
        .route("/v1/ping", get(ping))
        .route("/v1/streams", get(streams).delete(remove_stream))
        .route("/v1/append", post(append))
        .route("/v1/memory", get(memory).post(add_memory))
        .route("/v1/history", get(history))
        .route("/v1/answers", get(answers))
        .route("/v1/query", post(query))
        .route("/v1/search", post(search))
        .fallback(|| async {
            ApiError(
                StatusCode::NOT_FOUND,
                "no such endpoint; the API's endpoints are listed in docs/daemon.md".into(),
            )
        })
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .layer(axum::middleware::map_response(json_errors))
        .with_state(state)
}

/// Every error as `{"error": "…"}`: the framework's own rejections (a malformed body, a
/// missing field, a body over the limit) come as plain text, and are rewritten here
/// with what to do.
pub(crate) async fn json_errors(response: Response) -> Response {
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), 64 * 1024)
        .await
        .unwrap_or_default();
    let text = String::from_utf8_lossy(&body).trim().to_string();
    let message = match status {
        StatusCode::PAYLOAD_TOO_LARGE => format!(
            "the request body is over the limit of {BODY_LIMIT} bytes; send the text in \
             smaller pieces"
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => {
            "the body must be JSON, sent with `Content-Type: application/json`".to_string()
        }
        StatusCode::NOT_FOUND if text.is_empty() => {
            "no such endpoint; see GET /v1/status and the API's documentation".to_string()
        }
        StatusCode::METHOD_NOT_ALLOWED => "this endpoint does not take that method".to_string(),
        _ if text.contains("length limit exceeded") => format!(
            "the request body is over the limit of {BODY_LIMIT} bytes; send the text in \
             smaller pieces"
        ),
        _ if text.is_empty() => status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_lowercase(),
        _ => text,
    };
    let status = if message.contains("over the limit") {
        StatusCode::PAYLOAD_TOO_LARGE
    } else {
        status
    };
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        let body = json!({ "error": message, "limit_bytes": BODY_LIMIT });
        return (status, Json(body)).into_response();
    }
    ApiError(status, message).into_response()
}

/// Whether `headers` carry `Authorization: Bearer <token>`.
pub(crate) fn bearer_matches(headers: &axum::http::HeaderMap, token: &str) -> bool {
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    // Compared without an early exit, so that timing says nothing of the token.
    given.is_some_and(|g| {
        g.len() == token.len()
            && g.bytes()
                .zip(token.bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
    })
}

/// Requires `Authorization: Bearer <token>` (the TCP listener).
pub(crate) async fn require_token(
    State(token): State<Arc<str>>,
    request: Request,
    next: Next,
) -> Response {
    if !bearer_matches(request.headers(), &token) {
        return ApiError(
            StatusCode::UNAUTHORIZED,
            "missing or wrong bearer token".into(),
        )
        .into_response();
    }
    next.run(request).await
}

/// One row per stream: size, chunks read, latest version and pending bytes; in a
/// database shared by daemons, the lease on its memory steps (which daemon, its epoch,
/// the milliseconds it has left), `null` when none holds one.
pub fn stream_rows(store: &Store) -> memagent_store::Result<Vec<Value>> {
    let (leases, now) = match store.is_shared() {
        true => store.leases()?,
        false => (Vec::new(), 0),
    };
    let mut rows = Vec::new();
    for s in store.streams()? {
        let cursor = store.cursor(&s, GENERAL)?;
        let mut row = json!({
            "stream": s.name,
            "log_bytes": s.log_len,
            "pending_bytes": s.log_len - cursor.offset,
            "chunks": cursor.next_chunk,
            "version": cursor.version,
        });
        if store.is_shared() {
            row["lease"] = leases
                .iter()
                .find(|l| l.stream == s.id && l.expires_ms >= now)
                .map_or(
                    Value::Null,
                    |l| json!({"owner": l.owner, "epoch": l.epoch, "ms_left": l.expires_ms - now}),
                );
        }
        rows.push(row);
    }
    Ok(rows)
}

/// The daemon's state; it answers even when the store does not (the streams are then
/// left out and `store` says why).
async fn status(State(state): State<AppState>) -> ApiResult {
    let rows = store_call(&state, "reading the streams".into(), |state| {
        let mut rows = stream_rows(&state.store)?;
        let records: HashMap<String, _> = state
            .store
            .streams()?
            .into_iter()
            .map(|r| (r.name.clone(), r))
            .collect();
        for row in &mut rows {
            let Some(record) = row["stream"].as_str().and_then(|name| records.get(name)) else {
                continue;
            };
            row["indexed_bytes"] = state.recall.stream_state(record.id).len.into();
            row["index_lag_bytes"] = memagent_memory::index_lag(&state.recall, record).into();
        }
        Ok(rows)
    })
    .await;
    Ok(Json(status_of(&state, rows)))
}

fn status_of(state: &AppState, rows: ApiResult<Vec<Value>>) -> Value {
    let (mut rows, unread) = match rows {
        Ok(rows) => (rows, None),
        Err(ApiError(_, why)) => (Vec::new(), Some(why)),
    };
    let stats = state.stats.lock().expect("stats");
    for row in &mut rows {
        let name = row["stream"].as_str().unwrap_or_default().to_string();
        let s = stats.streams.get(&name);
        let extra = json!({
            "pending_tokens": s.and_then(|s| s.pending_tokens),
            "lag_seconds": s.map_or(0.0, |s| s.lag()),
            "lag_p50_seconds": s.and_then(|s| s.lag_percentile(50.0)),
            "lag_p90_seconds": s.and_then(|s| s.lag_percentile(90.0)),
            "steps": s.map_or(0, |s| s.steps),
            "tokens_read": s.map_or(0, |s| s.tokens),
            "tokens_per_second": s.filter(|s| s.seconds > 0.0).map(|s| s.tokens as f64 / s.seconds),
            "last_update": s.and_then(|s| s.last_update),
            "last_error": s.and_then(|s| s.last_error.clone()),
        });
        if let (Value::Object(row), Value::Object(extra)) = (row, extra) {
            row.extend(extra);
        }
    }
    let (rss, peak_rss) = crate::stats::resident_memory();
    let space = state.store.space().ok();
    let store_state = match (&stats.degraded, space, unread) {
        (Some(why), _, _) => format!("degraded: {why}"),
        (None, _, Some(why)) => format!("degraded: {why}"),
        (None, Some(space), None) if space.refusing => {
            "refusing writes: too little free space".into()
        }
        _ => "ok".into(),
    };
    let ahead = state.engine.read_ahead_status();
    let count = |n: &std::sync::atomic::AtomicUsize| n.load(std::sync::atomic::Ordering::Relaxed);
    json!({
        "store": store_state,
        "space": space,
        "daemon": *state.info,
        "read_ahead": {
            "on": state.read_ahead,
            "passages_read": count(&ahead.read),
            "pending": count(&ahead.pending),
            "kept_prompts": count(&ahead.kept),
            "kept_bytes": count(&ahead.kept_bytes),
        },
        "uptime_seconds": stats.started.elapsed().as_secs_f64(),
        "files": stats.files,
        "scans": stats.scans,
        "busy": stats.busy,
        "rss_bytes": rss,
        "peak_rss_bytes": peak_rss,
        "streams": rows,
    })
}

/// Whether the daemon answers, without touching the store.
async fn ping(State(state): State<AppState>) -> Json<Value> {
    Json(json!({"pid": state.info.pid, "version": state.info.version}))
}

async fn streams(State(state): State<AppState>) -> ApiResult {
    store_call(&state, "listing the streams".into(), |state| {
        Ok(Json(Value::Array(stream_rows(&state.store)?)))
    })
    .await
}

#[derive(Deserialize)]
struct StreamParam {
    stream: String,
    at: Option<u64>,
    /// `GET /v1/memory`: add each line's source (`memagent_memory::line_sources`).
    #[serde(default)]
    sources: bool,
}

async fn remove_stream(State(state): State<AppState>, Query(p): Query<StreamParam>) -> ApiResult {
    let name = p.stream.clone();
    let id = write(&state, format!("removing `{name}`"), move |store| {
        let id = store.require(&name)?.id;
        store.remove_stream(&name)?;
        Ok(id)
    })
    .await?;
    state
        .recall
        .reset(Some(id))
        .map_err(|e| ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(Json(json!({ "removed": p.stream })))
}

#[derive(Deserialize)]
struct AppendBody {
    stream: String,
    text: String,
    source: Option<String>,
    #[serde(default)]
    force: bool,
    /// Each chat turn's offset in `text` with its line in `source`.
    #[serde(default)]
    turns: Vec<(u64, u64)>,
}

async fn append(State(state): State<AppState>, Json(body): Json<AppendBody>) -> ApiResult {
    let stream = body.stream.clone();
    let appended = write(&state, format!("the append to `{stream}`"), move |store| {
        store.append_turns(
            &body.stream,
            body.text.as_bytes(),
            body.source.as_deref(),
            body.force,
            body.turns,
        )
    })
    .await?;
    if appended.bytes > 0 {
        let _ = state.arrivals.send(Arrival {
            stream: stream.clone(),
            log_len: appended.log_len,
            at: std::time::Instant::now(),
        });
    }
    Ok(Json(json!({
        "stream": stream,
        "appended_bytes": appended.bytes,
        "revision": appended.revision,
        "log_bytes": appended.log_len,
    })))
}

fn version_at(store: &Store, stream: &str, at: Option<u64>) -> ApiResult<MemoryVersion> {
    Ok(memagent_memory::version_at(store, stream, at)?)
}

async fn memory(State(state): State<AppState>, Query(p): Query<StreamParam>) -> ApiResult {
    let what = format!("reading the memory of `{}`", p.stream);
    store_call(&state, what, move |state| {
        let v = version_at(&state.store, &p.stream, p.at)?;
        let mut body = serde_json::to_value(&v).unwrap_or_default();
        if p.sources {
            let record = state.store.require(&p.stream)?;
            let sources = memagent_memory::line_sources(&state.store, &state.recall, &record, &v)?;
            body["sources"] = serde_json::to_value(sources).unwrap_or_default();
        }
        Ok(Json(body))
    })
    .await
}

async fn history(State(state): State<AppState>, Query(p): Query<StreamParam>) -> ApiResult {
    let what = format!("reading the history of `{}`", p.stream);
    store_call(&state, what, move |state| {
        let record = state.store.require(&p.stream)?;
        let versions = state.store.versions(&record, GENERAL)?;
        Ok(Json(serde_json::to_value(versions).unwrap_or_default()))
    })
    .await
}

async fn answers(State(state): State<AppState>, Query(p): Query<StreamParam>) -> ApiResult {
    let what = format!("reading the answers of `{}`", p.stream);
    store_call(&state, what, move |state| {
        let record = state.store.require(&p.stream)?;
        let answers = state.store.answers(&record)?;
        Ok(Json(serde_json::to_value(answers).unwrap_or_default()))
    })
    .await
}

#[derive(Deserialize)]
struct NewVersion {
    stream: String,
    version: MemoryVersion,
}

async fn add_memory(State(state): State<AppState>, Json(body): Json<NewVersion>) -> ApiResult {
    let what = format!("the new memory version of `{}`", body.stream);
    let v = write(&state, what, move |store| {
        let record = store.require(&body.stream)?;
        store.add_version(&record, GENERAL, body.version)
    })
    .await?;
    Ok(Json(serde_json::to_value(v).unwrap_or_default()))
}

#[derive(Deserialize)]
struct QueryBody {
    stream: String,
    question: Option<String>,
    questions: Option<Vec<String>>,
    at: Option<u64>,
    #[serde(default)]
    deep: bool,
    #[serde(default)]
    memory_only: bool,
    #[serde(default = "default_evidence_tokens")]
    evidence_tokens: usize,
    #[serde(default = "default_k")]
    k: usize,
    /// The best this many passages found ranked again by the model's likelihood of the
    /// question (`memctl query --rerank`), at most `RERANK_MAX`; 0 keeps the search's
    /// order; absent: the daemon's default ([`crate::DaemonOptions::rerank`]).
    rerank: Option<usize>,
}

fn default_evidence_tokens() -> usize {
    memagent_memory::EVIDENCE_TOKENS
}

fn default_k() -> usize {
    PASSAGES_K
}

/// Passages returned when a search names no `k`.
const SEARCH_K: usize = 5;

async fn query(State(state): State<AppState>, Json(body): Json<QueryBody>) -> ApiResult {
    let bad = |message: &str| Err(ApiError(StatusCode::BAD_REQUEST, message.into()));
    let (questions, several) = match (body.question, body.questions) {
        (Some(q), None) => (vec![q], false),
        (None, Some(qs)) if !qs.is_empty() => (qs, true),
        (None, Some(_)) => return bad("`questions` is empty; give at least one question"),
        (None, None) => return bad("give `question` (a string) or `questions` (a list)"),
        (Some(_), Some(_)) => return bad("give `question` or `questions`, not both"),
    };
    if let Some(i) = questions.iter().position(|q| q.trim().is_empty()) {
        return match several {
            true => bad(&format!("question {} is empty", i + 1)),
            false => bad("the question is empty"),
        };
    }
    let rerank = body.rerank.unwrap_or(state.rerank);
    if let Some(e) = memagent_memory::rerank_field_error(rerank) {
        return bad(&e);
    }
    let query = memagent_memory::Query {
        stream: body.stream.clone(),
        questions,
        at: body.at,
        mode: Mode::from_flags(body.deep, body.memory_only, body.k, body.evidence_tokens),
        rerank,
    };
    let what = format!("finding what `{}` holds for the question", body.stream);
    let (query, plan) = store_call(&state, what, move |state| {
        let plan = query.plan(&state.store, Some(&state.recall));
        Ok((query, plan))
    })
    .await?;
    let answers: Vec<Answer> = state
        .engine
        .query(query, plan?)
        .await
        .map_err(engine_error)?;
    let answers: Vec<Value> = answers
        .iter()
        .map(|a| serde_json::to_value(a).unwrap_or_default())
        .collect();
    match several {
        true => Ok(Json(json!({"stream": body.stream, "answers": answers}))),
        false => Ok(Json(answers.into_iter().next().unwrap_or_default())),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SearchBody {
    stream: Option<String>,
    streams: Option<Vec<String>>,
    #[serde(default)]
    all: bool,
    text: String,
    k: Option<usize>,
}

async fn search(State(state): State<AppState>, Json(body): Json<SearchBody>) -> ApiResult {
    let bad = |message: &str| Err(ApiError(StatusCode::BAD_REQUEST, message.into()));
    let streams: Option<Vec<String>> = match (body.stream, body.streams, body.all) {
        (Some(s), None, false) => Some(vec![s]),
        (None, Some(s), false) if !s.is_empty() => Some(s),
        (None, None, true) => None,
        (None, Some(_), false) => return bad("`streams` is empty; name at least one stream"),
        (None, None, false) => {
            return bad("give `stream` (a name), `streams` (a list) or `all: true`")
        }
        _ => return bad("give only one of `stream`, `streams` and `all`"),
    };
    if body.text.trim().is_empty() {
        return bad("`text` is empty; give the words or question to search for");
    }
    let k = body.k.unwrap_or(SEARCH_K);
    if k == 0 || k > 1000 {
        return bad("`k` must be between 1 and 1000");
    }
    let text = body.text.clone();
    let found = store_call(&state, "the search".into(), move |state| {
        let names: Option<Vec<&str>> = streams
            .as_ref()
            .map(|s| s.iter().map(String::as_str).collect());
        Ok(memagent_memory::search(
            &state.store,
            &state.recall,
            names.as_deref(),
            &text,
            k,
        )?)
    })
    .await?;
    Ok(Json(json!({"text": body.text, "passages": found})))
}
