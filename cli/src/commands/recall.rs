//! `memctl search` and `memctl index …`: the passage index beside the memory.

use std::io::{IsTerminal, Write};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use memagent_store::{Embedder, Evidence, Recall, Store};
use serde_json::{json, Value};

use super::db::Db;
use super::print_json;
use crate::cli::{GlobalArgs, IndexCommand, SearchArgs};
use crate::settings;

/// The embedder the settings name, loaded; `None` with `--embedder none`.
pub fn load_embedder(global: &GlobalArgs) -> Result<Option<Arc<Embedder>>> {
    match settings::embedder_dir(global)? {
        None => Ok(None),
        Some(dir) => {
            let embedder = Embedder::load(&dir)
                .with_context(|| format!("cannot load the embedder in {}", dir.display()))?;
            tracing::debug!("embedder {}", dir.display());
            Ok(Some(Arc::new(embedder)))
        }
    }
}

/// The data directory's passage index, caught up with every stream's log.
pub fn open_recall(global: &GlobalArgs, store: &Store) -> Result<Recall> {
    let recall = open_recall_only(global, store)?;
    catch_up(store, &recall)?;
    Ok(recall)
}

/// The passage index, as it is on disk.
pub fn open_recall_only(global: &GlobalArgs, store: &Store) -> Result<Recall> {
    let embedder = load_embedder(global)?;
    Ok(Recall::open(&store.path().join("index"), embedder)?)
}

/// Indexes whatever the logs hold past what the index has read (new text, a database
/// from before the index, an import), saying so when it is much.
pub fn catch_up(store: &Store, recall: &Recall) -> Result<()> {
    for (stream, report) in memagent_store::sync_all(store, recall)? {
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
        let bytes = document.as_bytes();
        let read = |from: u64, to: u64| Ok(bytes[from as usize..to as usize].to_vec());
        let origin = |_| memagent_recall::Origin::default();
        let log = memagent_recall::LogSource {
            id: 1,
            name: "document",
            len: bytes.len() as u64,
            read: &read,
            origin: &origin,
        };
        recall.sync(&log, &mut |_| {})?;
        let hits = recall.search(&memagent_recall::SearchRequest {
            text: question,
            streams: None,
            k,
        })?;
        Ok(hits
            .into_iter()
            .map(|hit| Evidence { hit, version: None })
            .collect())
    })();
    let _ = std::fs::remove_dir_all(&dir);
    found
}

pub fn search(global: &GlobalArgs, args: &SearchArgs) -> Result<()> {
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
    let results: Vec<Value> = match Db::open(global)? {
        Db::Daemon(client) => {
            let body = match stream {
                Some(s) => json!({"stream": s, "text": text, "k": args.k}),
                None => json!({"all": true, "text": text, "k": args.k}),
            };
            let reply = client.post("/v1/search", &body)?;
            reply["passages"].as_array().cloned().unwrap_or_default()
        }
        Db::Local(store) => {
            let recall = open_recall(global, &store)?;
            let streams: Option<Vec<&str>> = stream.map(|s| vec![s]);
            let found = memagent_store::search(&store, &recall, streams.as_deref(), text, args.k)?;
            found
                .iter()
                .map(|e| serde_json::to_value(e).unwrap_or_default())
                .collect()
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
        for line in p["text"].as_str().unwrap_or_default().trim().lines() {
            writeln!(out, "    {line}")?;
        }
    }
    Ok(())
}

/// `stream bytes a..b · file:line · memory vN · score`, as a result's header.
pub fn provenance(p: &Value) -> String {
    let mut parts = vec![format!(
        "{} bytes {}..{}",
        p["stream"].as_str().unwrap_or_default(),
        p["start"],
        p["end"]
    )];
    if let Some(source) = p["source"].as_str() {
        match p["line"].as_u64() {
            Some(line) => parts.push(format!("{source}:{line}")),
            None => parts.push(source.to_string()),
        }
    }
    if let Some(v) = p["version"].as_u64() {
        parts.push(format!("memory v{v}"));
    }
    parts.push(format!("score {:.4}", p["score"].as_f64().unwrap_or(0.0)));
    parts.join(" · ")
}

pub fn index(global: &GlobalArgs, command: &IndexCommand) -> Result<()> {
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
                let report = memagent_store::sync_stream(&store, &recall, s, &mut |at| {
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
                    "index_lag_bytes": memagent_store::index_lag(&recall, &s),
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
