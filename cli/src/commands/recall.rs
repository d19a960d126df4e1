//! `memctl search` and `memctl index …`: the passage index beside the memory.

use std::io::{IsTerminal, Write};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use memagent_memory::Evidence;
use memagent_recall::{Embedder, Recall};
use memagent_store::Store;
use serde_json::json;

use super::db::Db;
use super::print_json;
use crate::cli::{IndexCommand, SearchArgs};
use crate::settings::Settings;

/// The embedder the settings name, loaded (without token states when the configuration
/// says `late_interaction = false`); `None` with `--embedder none`.
pub fn load_embedder(global: &Settings) -> Result<Option<Arc<Embedder>>> {
    match global.embedder_dir()? {
        None => Ok(None),
        Some(dir) => {
            let mut embedder = Embedder::load(&dir)
                .with_context(|| format!("cannot load the embedder in {}", dir.display()))?;
            if global.config()?.late_interaction == Some(false) {
                embedder = embedder.without_token_states();
            }
            tracing::debug!("embedder {}", dir.display());
            Ok(Some(Arc::new(embedder)))
        }
    }
}

/// The data directory's passage index, caught up with every stream's log.
pub fn open_recall(global: &Settings, store: &Store) -> Result<Recall> {
    let recall = open_recall_only(global, store)?;
    catch_up(store, &recall)?;
    Ok(recall)
}

/// The passage index, as it is on disk.
pub fn open_recall_only(global: &Settings, store: &Store) -> Result<Recall> {
    let embedder = load_embedder(global)?;
    Ok(Recall::open(
        &memagent_memory::index_dir(store.path()),
        embedder,
    )?)
}

/// Indexes whatever the logs hold past what the index has read (new text, a database
/// from before the index, an import), saying so when it is much.
pub fn catch_up(store: &Store, recall: &Recall) -> Result<()> {
    for (stream, report) in memagent_memory::sync_all(store, recall)? {
        tracing::info!(
            "search index: read {} bytes of `{stream}` into {} passages in {:.1}s",
            report.bytes,
            report.passages,
            report.seconds
        );
    }
    Ok(())
}

/// The best `k` passages of one document for `question`, through a passage index of
/// its own in a temporary folder (removed after).
pub fn document_evidence(
    embedder: Option<Arc<Embedder>>,
    document: &str,
    question: &str,
    k: usize,
) -> Result<Vec<Evidence>> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("memctl-ask-{}-{n}", std::process::id()));
    let found = (|| -> Result<Vec<Evidence>> {
        let recall = Recall::open(&dir, embedder)?;
        index_text(&recall, "document", document, &mut |_| {})?;
        let hits = recall.search(&memagent_recall::SearchRequest {
            text: question,
            streams: None,
            k,
        })?;
        Ok(hits
            .into_iter()
            .map(|hit| Evidence::found(hit, None))
            .collect())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    found
}

/// Indexes `text` as the log of a stream of its own (id 1, named `name`) in `recall`.
pub(crate) fn index_text(
    recall: &Recall,
    name: &str,
    text: &str,
    on_progress: &mut dyn FnMut(u64),
) -> Result<memagent_recall::SyncReport> {
    let bytes = text.as_bytes();
    let read = |from: u64, to: u64| Ok(bytes[from as usize..to as usize].to_vec());
    let origin = |_| memagent_recall::Origin::default();
    let log = memagent_recall::LogSource {
        id: 1,
        name,
        len: bytes.len() as u64,
        read: &read,
        origin: &origin,
    };
    Ok(recall.sync(&log, on_progress)?)
}

pub fn search(global: &Settings, args: &SearchArgs) -> Result<()> {
    let (stream, text) = match (args.all, args.args.as_slice()) {
        (false, [stream, text]) => (Some(stream.as_str()), text.as_str()),
        (true, [text]) => (None, text.as_str()),
        (false, [_]) => bail!("give the stream and the text to search for, or --all and the text"),
        (true, _) => bail!("with --all, give only the text to search for"),
        _ => bail!("give the stream and the text to search for"),
    };
    if args.k == 0 {
        bail!("-k must be at least 1");
    }
    let results = match args.rerank {
        0 => search_passages(global, stream, text, args.k)?,
        n => {
            let found = search_passages(global, stream, text, args.k.max(n))?;
            let model = super::load_model(global)?;
            let mut ranked = memagent_memory::rerank(&model, text, found, n)?;
            ranked.truncate(args.k);
            ranked
        }
    };
    if args.json {
        return print_json(&json!({"text": text, "passages": results}));
    }
    let mut out = std::io::stdout().lock();
    if results.is_empty() {
        writeln!(out, "no passage found")?;
    }
    for (i, p) in results.iter().enumerate() {
        writeln!(out, "[{}] {}", i + 1, provenance(p))?;
        for line in p.hit.shown().trim().lines() {
            writeln!(out, "    {line}")?;
        }
    }
    Ok(())
}

/// The `k` passages found for `text` in `stream` (every stream: `None`), through the
/// daemon when it runs.
pub fn search_passages(
    global: &Settings,
    stream: Option<&str>,
    text: &str,
    k: usize,
) -> Result<Vec<Evidence>> {
    match Db::open(global)? {
        Db::Daemon(client) => {
            let body = match stream {
                Some(s) => json!({"stream": s, "text": text, "k": k}),
                None => json!({"all": true, "text": text, "k": k}),
            };
            let mut reply = client.post("/v1/search", &body)?;
            Ok(serde_json::from_value(reply["passages"].take())?)
        }
        Db::Local(store) => {
            let recall = open_recall(global, &store)?;
            let streams: Option<Vec<&str>> = stream.map(|s| vec![s]);
            Ok(memagent_memory::search(
                &store,
                &recall,
                streams.as_deref(),
                text,
                k,
            )?)
        }
    }
}

/// An answer's text, then a line for each of `passages` that it cites: "from
/// notes.md:3 (time)".
pub fn with_citations(answer: &str, passages: &[Evidence]) -> String {
    let mut text = answer.trim().to_string();
    for p in passages.iter().filter(|p| p.cited) {
        text.push_str(&format!("\n  from {}", citation(p)));
    }
    text
}

/// Where a cited passage is, short: its file and line (or its stream's bytes), and the
/// chat turn's time when it has one; the turn the answer comes from when it cites one.
pub fn citation(p: &Evidence) -> String {
    let h = &p.hit;
    let (line, time, bytes) = match &p.turn {
        Some(t) => (t.line, &t.time, (t.start, t.end)),
        None => (h.line, &h.time, (h.start, h.end)),
    };
    let mut at = match (&h.source, line) {
        (Some(source), Some(line)) => format!("{source}:{line}"),
        (Some(source), None) => source.clone(),
        _ => format!("{} bytes {}..{}", h.stream, bytes.0, bytes.1),
    };
    if let Some(time) = time {
        at.push_str(&format!(" ({time})"));
    }
    at
}

/// `stream bytes a..b · file:line · memory vN · score`, as a result's header.
pub fn provenance(p: &Evidence) -> String {
    let h = &p.hit;
    let mut parts = vec![format!("{} bytes {}..{}", h.stream, h.start, h.end)];
    if let Some(source) = &h.source {
        match h.line {
            Some(line) => parts.push(format!("{source}:{line}")),
            None => parts.push(source.clone()),
        }
    }
    if let Some(t) = &p.turn {
        parts.push(match t.line {
            Some(line) => format!("the answer's turn: line {line}"),
            None => format!("the answer's turn: bytes {}..{}", t.start, t.end),
        });
    }
    if let Some(v) = p.version {
        parts.push(format!("memory v{v}"));
    }
    parts.push(format!("score {:.4}", h.score));
    parts.join(" · ")
}

pub fn index(global: &Settings, command: &IndexCommand) -> Result<()> {
    let store = Db::open(global)?.local("memctl index")?;
    let recall = open_recall_only(global, &store)?;
    match command {
        IndexCommand::Rebuild { stream, json } => {
            let streams = match stream {
                Some(name) => vec![store.require(name)?],
                None => store.streams()?,
            };
            match stream {
                Some(_) => {
                    for s in &streams {
                        recall.reset(Some(s.id))?;
                    }
                }
                None => recall.reset(None)?,
            }
            let bar = super::progress_bar(
                !global.quiet && !json && std::io::stderr().is_terminal(),
                "{spinner} {msg} [{bar:30}] {bytes}/{total_bytes} · ETA {eta}",
            );
            let mut rows = Vec::new();
            for s in &streams {
                if let Some(bar) = &bar {
                    bar.set_length(s.log_len);
                    bar.set_position(0);
                    bar.set_message(s.name.clone());
                }
                let report = memagent_memory::sync_stream(&store, &recall, s, &mut |at| {
                    if let Some(bar) = &bar {
                        bar.set_position(at);
                    }
                })?;
                rows.push(json!({
                    "stream": s.name,
                    "bytes": report.bytes,
                    "passages": report.passages,
                    "embedded_tokens": report.embed.tokens,
                    "seconds": report.seconds,
                }));
            }
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            if *json {
                return print_json(&json!({"rebuilt": rows}));
            }
            let mut out = std::io::stdout().lock();
            for r in rows {
                writeln!(
                    out,
                    "{}: {} bytes into {} passages in {:.1}s",
                    r["stream"].as_str().unwrap_or_default(),
                    r["bytes"],
                    r["passages"],
                    r["seconds"].as_f64().unwrap_or(0.0)
                )?;
            }
            Ok(())
        }
        IndexCommand::Status { json } => {
            let mut rows = Vec::new();
            for s in store.streams()? {
                rows.push(json!({
                    "stream": s.name,
                    "log_bytes": s.log_len,
                    "indexed_bytes": recall.stream_state(s.id).len,
                    "index_lag_bytes": memagent_memory::index_lag(&recall, &s),
                    "passages": recall.count(Some(s.id))?,
                }));
            }
            let summary = json!({
                "path": recall.path(),
                "embedder": recall.embedder().map(|e| e.name().to_string()),
                "size_bytes": recall.size_on_disk(),
                "streams": rows,
            });
            if *json {
                return print_json(&summary);
            }
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "{} ({} bytes; embedder: {})",
                recall.path().display(),
                summary["size_bytes"],
                summary["embedder"].as_str().unwrap_or("none")
            )?;
            for r in summary["streams"].as_array().into_iter().flatten() {
                writeln!(
                    out,
                    "{}: {} passages; {} of {} bytes indexed",
                    r["stream"].as_str().unwrap_or_default(),
                    r["passages"],
                    r["indexed_bytes"],
                    r["log_bytes"]
                )?;
            }
            Ok(())
        }
    }
}
