//! `memctl mcp`: memagent as a Model Context Protocol server over stdio, for desktop
//! assistants and coding agents.
//!
//! Tools: `remember`, `recall`, `search`, `memory`, `history`, `streams`; each stream's latest
//! memory is a resource (`memagent://streams/NAME/memory`, NAME percent-encoded). Each
//! call opens the data directory as memctl's commands do: through the daemon's socket
//! while a daemon holds the database, else the database itself for the call's length
//! only, so that memctl and a daemon started later can use it between calls. The local
//! model is loaded on the first call that needs it and kept. A failed call is a tool
//! error with memctl's message; a call with missing or mistyped arguments is refused as
//! invalid parameters.

use std::sync::{Arc, Mutex, MutexGuard};

use anyhow::{anyhow, bail, Context, Result};
use memagent_memory::{Evidence, Mode, EVIDENCE_TOKENS, PASSAGES_K};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CallToolResult, ContentBlock, Implementation, ListResourceTemplatesResult, ListResourcesResult,
    PaginatedRequestParams, ReadResourceRequestParams, ReadResourceResponse, ReadResourceResult,
    Resource, ResourceContents, ResourceTemplate, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{tool, tool_handler, tool_router, ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde::Deserialize;
use serde_json::{json, Value};

use super::client::query_escape;
use super::db::Db;
use super::streams::{daemon_answers, local_answers, read_pending};
use super::ModelBackend;
use crate::cli::{LoopArgs, McpArgs};
use crate::settings::Settings;

const URI_PREFIX: &str = "memagent://streams/";
const URI_SUFFIX: &str = "/memory";

pub fn run(global: &Settings, args: &McpArgs) -> Result<()> {
    let server = MemoryServer::new(global.clone(), args.run.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let service = match server.serve(rmcp::transport::stdio()).await {
            Ok(service) => service,
            // A client that leaves before the handshake ends the server like any other.
            Err(rmcp::service::ServerInitializeError::ConnectionClosed(_)) => {
                tracing::info!("standard input closed before the MCP handshake");
                return Ok(());
            }
            Err(e) => bail!("the MCP session did not start: {e}"),
        };
        tracing::info!("MCP server ready on standard input and output");
        service
            .waiting()
            .await
            .map_err(|e| anyhow!("the MCP session failed: {e}"))?;
        Ok::<_, anyhow::Error>(())
    })?;
    // A call still running on a blocking thread is not waited for: its client is gone.
    runtime.shutdown_background();
    Ok(())
}

#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct Turn {
    /// Who spoke: user, assistant, system, tool, or a name
    role: String,
    /// What was said
    content: String,
    /// The speaker's name, when the role is shared
    #[serde(default)]
    name: Option<String>,
}

#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct RememberParams {
    /// The stream to append to (any name up to 128 characters); created on first use
    stream: String,
    /// Plain text to remember (give this or `turns`)
    #[serde(default)]
    text: Option<String>,
    /// Chat turns to remember, oldest first, stored as `role (name): content` lines
    #[serde(default)]
    turns: Option<Vec<Turn>>,
}

#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct RecallParams {
    /// The stream to answer from
    stream: String,
    /// The question
    question: String,
    /// Read the stream's stored text again with this question (slower, linear in the
    /// stream's length; finds what the general memory dropped)
    #[serde(default)]
    deep: bool,
    /// Answer from this memory version instead of the latest (not with `deep`)
    #[serde(default)]
    version: Option<u64>,
    /// Answer from the memory alone, without searching the stored text
    #[serde(default)]
    memory_only: bool,
    /// Rank the best this many passages found again by the model's likelihood of the
    /// question before the answer reads them (slower: one prefill of each passage;
    /// at most 200); 0 keeps the search's order; absent: the configuration's
    /// `[query] rerank`, else 0
    #[serde(default)]
    rerank: Option<usize>,
}

#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct SearchParams {
    /// The stream to search; leave out to search every stream
    #[serde(default)]
    stream: Option<String>,
    /// Words, or a question or phrase with the same meaning
    text: String,
    /// Passages to return (default 5)
    #[serde(default)]
    k: Option<usize>,
}

#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct MemoryParams {
    /// The stream
    stream: String,
    /// A memory version instead of the latest
    #[serde(default)]
    version: Option<u64>,
}

#[derive(Debug, Deserialize, rmcp::schemars::JsonSchema)]
#[schemars(crate = "rmcp::schemars")]
struct StreamParams {
    /// The stream
    stream: String,
}

/// What every call shares: the settings, and the local model once loaded.
struct Shared {
    global: Settings,
    run: LoopArgs,
    model: Mutex<Option<ModelBackend>>,
}

impl Shared {
    /// The local model, loaded on first use.
    fn model(&self) -> Result<MutexGuard<'_, Option<ModelBackend>>> {
        // A call that panicked while holding it leaves a usable model.
        let mut guard = self.model.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            *guard = Some(ModelBackend::open(&self.global, &self.run)?);
        }
        Ok(guard)
    }

    fn remember(&self, p: RememberParams) -> Result<(String, Value)> {
        let text = match (p.text, p.turns) {
            (Some(_), Some(_)) => bail!("give `text` or `turns`, not both"),
            (None, None) => {
                bail!("nothing to remember: give `text` (plain text) or `turns` (chat messages)")
            }
            (Some(text), None) => text,
            (None, Some(turns)) => render_turns(&turns)?,
        };
        if text.trim().is_empty() {
            bail!("nothing to remember: the text is empty");
        }
        let store = match Db::open(&self.global)? {
            Db::Daemon(client) => {
                let mut done = client.post(
                    "/v1/append",
                    &json!({"stream": p.stream, "text": text, "force": false}),
                )?;
                done["through_daemon"] = json!(true);
                let said = format!(
                    "appended {} bytes to `{}`; the daemon reads them into memory",
                    done["appended_bytes"].as_u64().unwrap_or(0),
                    p.stream
                );
                return Ok((said, done));
            }
            Db::Local(store) => store,
        };
        let appended = store.append_with(&p.stream, text.as_bytes(), None, false)?;
        let guard = self.model()?;
        let backend = guard.as_ref().expect("loaded above");
        let steps = read_pending(&self.global, &store, backend, &p.stream, |step| {
            tracing::info!("{step}");
        })?;
        let version = steps.last().map(|s| s.version.version);
        let said = format!(
            "appended {} bytes to `{}`; read {} chunk(s) into memory{}",
            appended.bytes,
            p.stream,
            steps.len(),
            version.map_or(String::new(), |v| format!(", now version {v}"))
        );
        Ok((
            said,
            json!({
                "stream": p.stream,
                "appended_bytes": appended.bytes,
                "log_bytes": appended.log_len,
                "chunks_read": steps.len(),
                "version": version,
                "through_daemon": false,
            }),
        ))
    }

    fn recall(&self, p: RecallParams) -> Result<(String, Value)> {
        if p.deep && p.version.is_some() {
            bail!("`deep` reads the stored text again and answers from its own memory; leave out `version`");
        }
        let rerank = match p.rerank {
            Some(n) => n,
            None => self.global.config()?.query.rerank.unwrap_or(0),
        };
        if let Some(e) = memagent_memory::rerank_field_error(rerank) {
            bail!(e);
        }
        let query = memagent_memory::Query {
            stream: p.stream.clone(),
            questions: vec![p.question],
            at: p.version,
            mode: Mode::from_flags(p.deep, p.memory_only, PASSAGES_K, EVIDENCE_TOKENS),
            rerank,
        };
        let answer = match Db::open(&self.global)? {
            Db::Daemon(client) => daemon_answers(&client, &query)?,
            Db::Local(store) => {
                let recall = match query.mode.searches() {
                    true => Some(super::recall::open_recall(&self.global, &store)?),
                    false => None,
                };
                let plan = query
                    .plan(&store, recall.as_ref())
                    .map_err(super::db::memory_error)?;
                let guard = self.model()?;
                let backend = guard.as_ref().expect("loaded above");
                local_answers(&store, backend, &query, plan, &mut |_, _, _| {})?
            }
        }
        .pop()
        .context("no answer came back")?;
        let mut said = answer.text().trim().to_string();
        let cited: Vec<&Evidence> = answer
            .passages
            .iter()
            .flatten()
            .filter(|p| p.cited)
            .collect();
        if !cited.is_empty() {
            said.push_str("\n\nFrom:");
            for (i, p) in cited.iter().enumerate() {
                said.push_str(&format!(
                    "\n[{}] {}: {}",
                    i + 1,
                    super::recall::provenance(p),
                    p.hit.shown().trim()
                ));
            }
        }
        Ok((said, serde_json::to_value(&answer)?))
    }

    fn search(&self, p: SearchParams) -> Result<(String, Value)> {
        let k = p.k.unwrap_or(5);
        let passages =
            super::recall::search_passages(&self.global, p.stream.as_deref(), &p.text, k)?;
        let said = match passages.is_empty() {
            true => "no passage found".to_string(),
            false => passages
                .iter()
                .enumerate()
                .map(|(i, p)| {
                    format!(
                        "[{}] {}\n{}",
                        i + 1,
                        super::recall::provenance(p),
                        p.hit.shown().trim()
                    )
                })
                .collect::<Vec<_>>()
                .join("\n\n"),
        };
        Ok((said, json!({"text": p.text, "passages": passages})))
    }

    fn memory(&self, p: MemoryParams) -> Result<(String, Value)> {
        let version = Db::open(&self.global)?.version_at(&p.stream, p.version)?;
        let mut value = serde_json::to_value(&version)?;
        value["stream"] = json!(p.stream);
        Ok((version.text, value))
    }

    fn history(&self, p: StreamParams) -> Result<(String, Value)> {
        let versions = Db::open(&self.global)?.versions(&p.stream)?;
        let rows: Vec<Value> = versions
            .iter()
            .map(|v| {
                json!({
                    "version": v.version,
                    "parent": v.parent,
                    "time": memagent_watcher::utc(v.created as i64),
                    "created": v.created,
                    "chunk": v.chunk,
                    "author": v.author,
                    "tokens": v.tokens,
                    "cut": v.cut,
                    "first_line": v.text.lines().next().unwrap_or(""),
                })
            })
            .collect();
        let value = json!({"stream": p.stream, "versions": rows});
        Ok((serde_json::to_string_pretty(&value)?, value))
    }

    fn streams(&self) -> Result<(String, Value)> {
        let rows = Db::open(&self.global)?.stream_rows()?;
        let value = json!({ "streams": rows });
        Ok((serde_json::to_string_pretty(&value)?, value))
    }

    fn resources(&self) -> Result<Vec<Resource>> {
        let rows = Db::open(&self.global)?.stream_rows()?;
        Ok(rows
            .iter()
            .filter_map(|row| row["stream"].as_str())
            .map(|name| {
                Resource::new(memory_uri(name), format!("{name} memory"))
                    .with_description(format!("The latest memory of stream `{name}`"))
                    .with_mime_type("text/plain")
            })
            .collect())
    }

    fn read(&self, uri: &str) -> Result<String, ErrorData> {
        let stream = stream_of_uri(uri).ok_or_else(|| {
            ErrorData::resource_not_found(
                format!("{uri} is not a memagent resource; they are {URI_PREFIX}NAME{URI_SUFFIX}"),
                None,
            )
        })?;
        let db = Db::open(&self.global).map_err(|e| internal(&e))?;
        let version = db
            .version_at(&stream, None)
            .map_err(|e| ErrorData::resource_not_found(super::error_text(&e), None))?;
        Ok(version.text)
    }
}

/// Chat turns as the lines a chat log's messages become.
fn render_turns(turns: &[Turn]) -> Result<String> {
    let mut text = String::new();
    for (i, turn) in turns.iter().enumerate() {
        let message = json!({"role": turn.role, "content": turn.content, "name": turn.name});
        let line = memagent_watcher::render_message(&message)
            .map_err(|reason| anyhow!("turns[{i}]: {reason}"))?;
        text.push_str(&line);
        text.push('\n');
    }
    Ok(text)
}

fn memory_uri(stream: &str) -> String {
    format!("{URI_PREFIX}{}{URI_SUFFIX}", query_escape(stream))
}

/// The stream a memory resource's URI names.
fn stream_of_uri(uri: &str) -> Option<String> {
    let name = uri.strip_prefix(URI_PREFIX)?.strip_suffix(URI_SUFFIX)?;
    let bytes = name.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok().filter(|s| !s.is_empty())
}

fn internal(e: &anyhow::Error) -> ErrorData {
    ErrorData::internal_error(super::error_text(e), None)
}

/// A call's outcome as a tool result: its text, with the JSON beside it; or its error
/// message as a tool error.
fn outcome(result: Result<(String, Value)>) -> CallToolResult {
    match result {
        Ok((text, value)) => {
            let mut done = CallToolResult::success(vec![ContentBlock::text(text)]);
            done.structured_content = Some(value);
            done
        }
        Err(e) => CallToolResult::error(vec![ContentBlock::text(super::error_text(&e))]),
    }
}

#[derive(Clone)]
pub struct MemoryServer {
    shared: Arc<Shared>,
    tool_router: ToolRouter<Self>,
}

impl MemoryServer {
    fn new(global: Settings, run: LoopArgs) -> Self {
        Self {
            shared: Arc::new(Shared {
                global,
                run,
                model: Mutex::new(None),
            }),
            tool_router: Self::tool_router(),
        }
    }

    /// Runs `f` off the async threads (the model and the database block).
    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Shared) -> T + Send + 'static,
    ) -> Result<T, ErrorData> {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&shared))
            .await
            .map_err(|e| ErrorData::internal_error(format!("the call failed: {e}"), None))
    }
}

#[tool_router]
impl MemoryServer {
    #[tool(
        description = "Remember text or chat turns: append them to a stream (created on \
        first use) and read them into the stream's memory. Give `text`, or `turns` as \
        [{role, content, name?}]. Returns the new memory version."
    )]
    async fn remember(
        &self,
        Parameters(p): Parameters<RememberParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.blocking(|s| outcome(s.remember(p))).await
    }

    #[tool(
        description = "Answer a question from a stream's memory and the passages a search \
        of everything the stream stored finds for it (one model call however long the \
        stream); the answer lists the passages it used, with where they came from. \
        `memory_only: true` answers from the memory alone; `deep: true` reads the stream's \
        stored text again with the question; `version` answers from an older memory; \
        `rerank: N` ranks the best N passages found again by the question's likelihood \
        (better passages first, about 0.3 s a passage)."
    )]
    async fn recall(
        &self,
        Parameters(p): Parameters<RecallParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.blocking(|s| outcome(s.recall(p))).await
    }

    #[tool(
        description = "Search everything a stream (or every stream) stored: the passages \
        that best match the text by words and by meaning, each with its stream, byte \
        range, source file and line, time and score."
    )]
    async fn search(
        &self,
        Parameters(p): Parameters<SearchParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.blocking(|s| outcome(s.search(p))).await
    }

    #[tool(
        description = "A stream's memory text: the latest, or the version given. The memory \
        is what the model kept of everything the stream received, and may be incomplete."
    )]
    async fn memory(
        &self,
        Parameters(p): Parameters<MemoryParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.blocking(|s| outcome(s.memory(p))).await
    }

    #[tool(
        description = "A stream's memory versions, oldest first: version, time, the chunk \
        it read, author (the model or a person), size in tokens and first line."
    )]
    async fn history(
        &self,
        Parameters(p): Parameters<StreamParams>,
    ) -> Result<CallToolResult, ErrorData> {
        self.blocking(|s| outcome(s.history(p))).await
    }

    #[tool(
        description = "The streams: name, bytes stored, chunks read, memory version and \
        bytes not yet read."
    )]
    async fn streams(&self) -> Result<CallToolResult, ErrorData> {
        self.blocking(|s| outcome(s.streams())).await
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for MemoryServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_resources()
                .build(),
        )
        .with_server_info(Implementation::new("memagent", env!("CARGO_PKG_VERSION")))
        .with_instructions(
            "Long-term memory. `remember` what should outlast this conversation (facts, \
             decisions, chat turns) in a named stream; `recall` answers questions from a \
             stream's memory; `memory` shows what is kept. Memories are written by a \
             small model and may be incomplete: `recall` with `deep: true` reads the \
             stored text again.",
        )
    }

    async fn list_resources(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourcesResult, ErrorData> {
        let resources = self
            .blocking(|s| s.resources())
            .await?
            .map_err(|e| internal(&e))?;
        Ok(ListResourcesResult::with_all_items(resources).with_ttl_ms(0))
    }

    async fn list_resource_templates(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListResourceTemplatesResult, ErrorData> {
        let template = ResourceTemplate::new(
            format!("{URI_PREFIX}{{stream}}{URI_SUFFIX}"),
            "stream memory",
        )
        .with_description("The latest memory of a stream")
        .with_mime_type("text/plain");
        Ok(ListResourceTemplatesResult::with_all_items(vec![template]))
    }

    async fn read_resource(
        &self,
        request: ReadResourceRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<ReadResourceResponse, ErrorData> {
        let uri = request.uri.clone();
        let text = self.blocking(move |s| s.read(&uri)).await??;
        let contents = ResourceContents::text(text, request.uri).with_mime_type("text/plain");
        Ok(ReadResourceResult::new(vec![contents])
            .with_ttl_ms(0)
            .into())
    }
}

#[cfg(test)]
mod tests {
    use super::{memory_uri, stream_of_uri};

    #[test]
    fn resource_uris_carry_any_stream_name() {
        for name in ["notes", "chat-2.jsonl", "/home/a b/notes.md", "café%20"] {
            assert_eq!(stream_of_uri(&memory_uri(name)).as_deref(), Some(name));
        }
        assert_eq!(stream_of_uri("memagent://streams//memory"), None);
        assert_eq!(stream_of_uri("file:///etc/passwd"), None);
        assert_eq!(stream_of_uri("memagent://streams/%zz/memory"), None);
    }
}
