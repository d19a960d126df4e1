//! `memctl ingest`, `query`, `memory …` and `streams …`: persistent streams in the store.

use std::io::{IsTerminal, Read, Write};

use anyhow::{bail, Context, Result};
use memagent_memory::{
    Answer, Ingestor, Mode, Plan, Query, StepOutcome, EVIDENCE_TOKENS, PASSAGES_K,
};
use memagent_store::{Author, ExportRecord, MemoryVersion, Store, GENERAL};
use serde_json::{json, Value};

use super::db::Db;
use super::{print_json, ModelBackend};
use crate::cli::{IngestArgs, IngestFormat, MemoryCommand, QueryArgs, StreamsCommand};
use crate::settings::Settings;

fn open_store(global: &Settings, what: &str) -> Result<Store> {
    Db::open(global)?.local(what)
}

pub fn ingest(global: &Settings, args: &IngestArgs) -> Result<()> {
    let db = Db::open(global)?;
    let (text, source) = read_input(args)?;
    let (text, turns) = turns_of(args, text, source.as_deref())?;
    let store = match db {
        Db::Local(store) => store,
        // The daemon appends it and reads it into memory on its own schedule.
        Db::Daemon(client) => {
            let done = client.post(
                "/v1/append",
                &json!({"stream": args.stream, "text": text, "source": source, "force": args.force, "turns": turns}),
            )?;
            if args.json {
                return print_json(&done);
            }
            writeln!(
                std::io::stdout().lock(),
                "{}: appended {} bytes through the daemon, which reads them into memory",
                args.stream,
                done["appended_bytes"].as_u64().unwrap_or(0)
            )?;
            return Ok(());
        }
    };
    let appended = store.append_turns(
        &args.stream,
        text.as_bytes(),
        source.as_deref(),
        args.force,
        turns,
    )?;
    // Searchable at once, before any model work.
    super::recall::open_recall(global, &store)?;
    if appended.revision {
        tracing::warn!(
            "{} changed since it was last ingested; appended it whole as a new revision",
            source.as_deref().unwrap_or("the input")
        );
    }
    tracing::info!(
        "appended {} bytes to `{}` (log now {} bytes)",
        appended.bytes,
        args.stream,
        appended.log_len
    );
    let steps = match args.no_process {
        true => Vec::new(),
        false => read_with_progress(global, &store, args)?,
    };
    let stream = store.require(&args.stream)?;
    let cursor = store.cursor(&stream, GENERAL)?;
    if args.json {
        return print_json(&json!({
            "stream": args.stream,
            "appended_bytes": appended.bytes,
            "revision": appended.revision,
            "log_bytes": stream.log_len,
            "pending_bytes": stream.log_len - cursor.offset,
            "steps": steps.iter().map(|s| json!({
                "chunk": s.chunk.index, "tokens": s.chunk.tokens,
                "version": s.version.version, "memory_tokens": s.version.tokens,
                "cut": s.version.cut, "seconds": s.version.seconds,
            })).collect::<Vec<_>>(),
            "version": cursor.version,
        }));
    }
    writeln!(
        std::io::stdout().lock(),
        "{}: appended {} bytes; {} chunks read; memory v{}; {} bytes pending",
        args.stream,
        appended.bytes,
        steps.len(),
        cursor.version,
        stream.log_len - cursor.offset
    )?;
    Ok(())
}

/// The text to ingest (a file, or standard input for none or `-`) and the file's name.
fn read_input(args: &IngestArgs) -> Result<(String, Option<String>)> {
    Ok(match args.file.as_deref() {
        Some(path) if path.as_os_str() != "-" => {
            let text = super::read_document(Some(path))?;
            let name = std::fs::canonicalize(path)
                .unwrap_or_else(|_| path.to_path_buf())
                .display()
                .to_string();
            (text, Some(name))
        }
        _ => (super::read_document(None)?, None),
    })
}

/// A chat log's text as turns, as a watched one becomes (the turns' lines are kept);
/// other text as it is.
fn turns_of(
    args: &IngestArgs,
    text: String,
    source: Option<&str>,
) -> Result<(String, Vec<(u64, u64)>)> {
    let chat = match args.format {
        IngestFormat::ChatJsonl => true,
        IngestFormat::Text | IngestFormat::Markdown => false,
        IngestFormat::Auto => source.is_some_and(|s| s.ends_with(".jsonl")),
    };
    if !chat {
        return Ok((text, Vec::new()));
    }
    let mut bytes = text.into_bytes();
    if !bytes.ends_with(b"\n") {
        bytes.push(b'\n');
    }
    let parsed = memagent_watcher::parse_chat(&bytes, 0);
    let name = source.unwrap_or("standard input");
    for (line, reason) in &parsed.errors {
        tracing::warn!("{name}:{line}: {reason}; line skipped");
    }
    if parsed.text.is_empty() && !parsed.errors.is_empty() {
        bail!(
            "{name}: no line is a chat message ({} lines skipped); expected one \
             {{\"role\": …, \"content\": …}} object per line, or pass --format text",
            parsed.errors.len()
        );
    }
    Ok((parsed.text, parsed.turns))
}

/// Reads what is pending of the ingested stream into memory, with a progress bar on a
/// terminal; the model loads only when something is pending.
fn read_with_progress(
    global: &Settings,
    store: &Store,
    args: &IngestArgs,
) -> Result<Vec<StepOutcome>> {
    let stream = store.require(&args.stream)?;
    let start = store.cursor(&stream, GENERAL)?.offset;
    if stream.log_len <= start {
        return Ok(Vec::new());
    }
    let backend = ModelBackend::open(global, &args.run)?;
    let bar = super::progress_bar(
        !global.quiet && !args.json && std::io::stderr().is_terminal(),
        "{spinner} [{bar:30}] {bytes}/{total_bytes} {msg} · ETA {eta}",
    );
    if let Some(bar) = &bar {
        bar.set_length(stream.log_len - start);
    }
    let steps = read_pending(global, store, &backend, &args.stream, |step| {
        if let Some(bar) = &bar {
            bar.set_position(step.chunk.end - start);
            bar.set_message(format!("memory v{}", step.version.version));
        }
        tracing::info!("{step}");
    })?;
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    Ok(steps)
}

/// Reads every pending chunk of `stream` into its general memory, each step committed
/// on its own; `on_step` sees each as it is committed.
pub fn read_pending(
    global: &Settings,
    store: &Store,
    backend: &ModelBackend,
    stream: &str,
    mut on_step: impl FnMut(&StepOutcome),
) -> Result<Vec<StepOutcome>> {
    let (model, sha) = backend.identity()?;
    let writer = backend.writer();
    let embedder = backend.writer_embedder(global)?;
    backend.with_agent(|agent| {
        let ingestor =
            Ingestor::new(store, agent, model, sha).with_writer(writer, embedder.as_deref());
        let mut steps = Vec::new();
        while let Some(step) = ingestor.step(stream)? {
            on_step(&step);
            steps.push(step);
        }
        Ok(steps)
    })
}

pub fn query(global: &Settings, args: &QueryArgs) -> Result<()> {
    // As the daemon's API answers an empty question.
    if let Some(i) = args.questions.iter().position(|q| q.trim().is_empty()) {
        match args.questions.len() {
            1 => bail!("the question is empty"),
            _ => bail!("question {} is empty", i + 1),
        }
    }
    let query = Query {
        stream: args.stream.clone(),
        questions: args.questions.clone(),
        at: args.at,
        mode: Mode::from_flags(
            args.deep,
            args.memory_only,
            args.passages,
            args.evidence_tokens,
        ),
        rerank: match args.rerank {
            Some(n) => n,
            None => global.config()?.query.rerank.unwrap_or(0),
        },
    };
    let answers = match Db::open(global)? {
        Db::Daemon(client) => daemon_answers(&client, &query)?,
        Db::Local(store) => {
            // A missing stream is told before the index catches up, and a missing
            // version before the model loads.
            store.require(&query.stream)?;
            let recall = match query.mode.searches() {
                true => Some(super::recall::open_recall(global, &store)?),
                false => None,
            };
            let plan = query
                .plan(&store, recall.as_ref())
                .map_err(super::db::memory_error)?;
            let backend = ModelBackend::open(global, &args.run)?;
            let bar = super::progress_bar(
                args.deep && !global.quiet && !args.json && std::io::stderr().is_terminal(),
                "{spinner} chunk {pos}/{len} [{bar:30}] ETA {eta}",
            );
            // Chains read side by side: the bar follows the one furthest behind.
            let mut done = vec![u64::MAX; args.questions.len()];
            let answers = local_answers(&store, &backend, &query, plan, &mut |i, step, total| {
                done[i] = step.chunk.index + 1;
                if let Some(bar) = &bar {
                    bar.set_length(total as u64);
                    bar.set_position(done.iter().copied().min().unwrap_or(0));
                }
            })?;
            if let Some(bar) = bar {
                bar.finish_and_clear();
            }
            answers
        }
    };
    if args.json {
        return print_query_json(&query.stream, &answers);
    }
    let texts: Vec<String> = answers.iter().map(cited_answer).collect();
    print_answers(&args.questions, &texts)
}

/// The daemon's answers to `query` (`/v1/query`), one per question.
pub fn daemon_answers(client: &super::client::DaemonClient, query: &Query) -> Result<Vec<Answer>> {
    let (k, tokens) = match query.mode {
        Mode::Evidence { k, tokens } => (k, tokens),
        _ => (PASSAGES_K, EVIDENCE_TOKENS),
    };
    let mut body = json!({
        "stream": query.stream, "at": query.at,
        "deep": query.mode == Mode::Deep,
        "memory_only": !query.mode.searches(),
        "evidence_tokens": tokens,
        "k": k,
        "rerank": query.rerank,
    });
    if let [question] = query.questions.as_slice() {
        body["question"] = json!(question);
        return Ok(vec![serde_json::from_value(
            client.post("/v1/query", &body)?,
        )?]);
    }
    body["questions"] = json!(query.questions);
    let mut reply = client.post("/v1/query", &body)?;
    Ok(serde_json::from_value(reply["answers"].take())?)
}

/// Answers `query` from its `plan` ([`Query::plan`]) with `backend`'s model;
/// `on_deep_step` sees each step of a deep query's chains: question index, step, chunks
/// in all.
pub fn local_answers(
    store: &Store,
    backend: &ModelBackend,
    query: &Query,
    plan: Plan,
    on_deep_step: &mut dyn FnMut(usize, &StepOutcome, usize),
) -> Result<Vec<Answer>> {
    // Only a deep query commits memory versions, which record the model's identity.
    let (model, sha) = match plan {
        Plan::Deep => backend.identity()?,
        _ => Default::default(),
    };
    backend.with_agent(|agent| {
        let ingestor = Ingestor::new(store, agent, model, sha);
        Ok(query.answer(plan, &ingestor, on_deep_step)?)
    })
}

/// An answer's text, then a line for each passage it cites.
fn cited_answer(answer: &Answer) -> String {
    let passages = answer.passages.as_deref().unwrap_or_default();
    super::recall::with_citations(answer.text(), passages)
}

/// One question's answer alone; several, each under its question.
fn print_answers(questions: &[String], answers: &[String]) -> Result<()> {
    let mut out = std::io::stdout().lock();
    if let [answer] = answers {
        writeln!(out, "{}", answer.trim())?;
        return Ok(());
    }
    for (i, (question, answer)) in questions.iter().zip(answers).enumerate() {
        if i > 0 {
            writeln!(out)?;
        }
        writeln!(out, "Q: {}\n{}", question.trim(), answer.trim())?;
    }
    Ok(())
}

/// One question's JSON object alone; several as `{stream, answers: [..]}`, as the API.
fn print_query_json(stream: &str, answers: &[Answer]) -> Result<()> {
    if let [answer] = answers {
        return print_json(&serde_json::to_value(answer)?);
    }
    print_json(&json!({"stream": stream, "answers": answers}))
}

fn version_json(v: &MemoryVersion) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or_default()
}

/// Each line of a memory, then where it came from and the passage that says it.
fn print_sources(out: &mut impl Write, v: &Value) -> Result<()> {
    let sources = v["sources"].as_array().cloned().unwrap_or_default();
    if sources.is_empty() {
        writeln!(out, "{}", v["text"].as_str().unwrap_or_default())?;
    }
    for s in &sources {
        writeln!(out, "{}", s["line"].as_str().unwrap_or_default())?;
        let mut from = vec![format!("memory v{}", s["version"])];
        match s["chunk"].as_u64() {
            Some(c) => from.push(format!("chunk {c} (bytes {}..{})", s["start"], s["end"])),
            None => from.push("written by a person".to_string()),
        }
        let p = &s["passage"];
        if p.is_object() {
            if let Some(source) = p["source"].as_str() {
                from.push(match s["quote_line"].as_u64().or(p["line"].as_u64()) {
                    Some(line) => format!("{source}:{line}"),
                    None => source.to_string(),
                });
            }
            from.push(format!("passage bytes {}..{}", p["start"], p["end"]));
        }
        writeln!(out, "    <- {}", from.join(" · "))?;
        if let Some(text) = s["quote"].as_str() {
            let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
            let shown: String = text.chars().take(160).collect();
            let more = if text.chars().count() > 160 {
                "…"
            } else {
                ""
            };
            writeln!(out, "       \"{shown}{more}\"")?;
        }
    }
    Ok(())
}

pub fn memory(global: &Settings, command: &MemoryCommand) -> Result<()> {
    let db = Db::open(global)?;
    let mut out = std::io::stdout().lock();
    match command {
        MemoryCommand::Show {
            stream,
            at,
            sources: true,
            json,
        } => {
            let v = db.version_with_sources(stream, *at, |store| {
                super::recall::open_recall(global, store)
            })?;
            if *json {
                return print_json(&v);
            }
            print_sources(&mut out, &v)?;
        }
        MemoryCommand::Show {
            stream, at, json, ..
        } => {
            let v = db.version_at(stream, *at)?;
            if *json {
                return print_json(&version_json(&v));
            }
            writeln!(out, "{}", v.text)?;
        }
        MemoryCommand::History { stream, json } => {
            let versions = db.versions(stream)?;
            if *json {
                return print_json(&versions);
            }
            writeln!(
                out,
                "{:>7} {:>7} {:>6} {:>7}  {:<10} {:<26} text",
                "version", "parent", "chunk", "tokens", "author", "template"
            )?;
            for v in &versions {
                let author = match &v.author {
                    Author::Model => "model".to_string(),
                    Author::Person { name } => name.clone(),
                };
                let first_line = v.text.lines().next().unwrap_or("");
                let preview: String = first_line.chars().take(48).collect();
                writeln!(
                    out,
                    "{:>7} {:>7} {:>6} {:>7}  {:<10} {:<26} {}{}",
                    v.version,
                    v.parent.map_or("-".into(), |p| p.to_string()),
                    v.chunk.map_or("-".into(), |c| c.to_string()),
                    format!("{}{}", v.tokens, if v.cut { "*" } else { "" }),
                    author,
                    format!("{} v{}", v.template_id, v.template_version),
                    preview,
                    if first_line.chars().count() > 48 {
                        "…"
                    } else {
                        ""
                    }
                )?;
            }
        }
        MemoryCommand::Diff { stream, from, to } => {
            let to_v = db.version_at(stream, *to)?;
            let from_v = match from {
                Some(f) => db.version_at(stream, Some(*f))?,
                None => match to_v.parent {
                    Some(p) => db.version_at(stream, Some(p))?,
                    None => bail!("version {} has no parent; name two versions", to_v.version),
                },
            };
            let diff = similar::TextDiff::from_lines(&from_v.text, &to_v.text);
            write!(
                out,
                "{}",
                diff.unified_diff().header(
                    &format!("v{}", from_v.version),
                    &format!("v{}", to_v.version)
                )
            )?;
        }
        MemoryCommand::Edit { stream } => {
            let current = db.versions(stream)?.pop();
            let text = edited_text(current.as_ref().map_or("", |v| v.text.as_str()))?;
            let v = db.add_version(stream, person_version(current.as_ref(), text))?;
            writeln!(
                out,
                "{stream}: memory v{} written by {}",
                v.version,
                person()
            )?;
        }
        MemoryCommand::Rollback { stream, version } => {
            let old = db.version_at(stream, Some(*version))?;
            let mut new = person_version(Some(&old), old.text.clone());
            new.tokens = old.tokens;
            let v = db.add_version(stream, new)?;
            writeln!(out, "{stream}: memory v{} = v{version}", v.version)?;
        }
    }
    Ok(())
}

fn person() -> String {
    std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "person".to_string())
}

/// A version written by a person, from `text`, inheriting the model fields of `like`.
fn person_version(like: Option<&MemoryVersion>, text: String) -> MemoryVersion {
    MemoryVersion {
        version: 0,
        parent: None,
        tokens: like.map_or(0, |v| v.tokens),
        text,
        chunk: None,
        model: like.map(|v| v.model.clone()).unwrap_or_default(),
        model_sha256: like.map(|v| v.model_sha256.clone()).unwrap_or_default(),
        template_id: like.map(|v| v.template_id.clone()).unwrap_or_default(),
        template_version: like.map_or(0, |v| v.template_version),
        created: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        prompt_tokens: 0,
        completion_tokens: 0,
        seconds: 0.0,
        cut: false,
        author: Author::Person { name: person() },
    }
}

/// The new memory text: from $EDITOR on a terminal, else from standard input.
fn edited_text(current: &str) -> Result<String> {
    if !std::io::stdin().is_terminal() {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("cannot read the new memory from standard input")?;
        return Ok(text);
    }
    let editor = std::env::var("VISUAL")
        .or_else(|_| std::env::var("EDITOR"))
        .unwrap_or_else(|_| "vi".to_string());
    let path = std::env::temp_dir().join(format!("memagent-memory-{}.txt", std::process::id()));
    std::fs::write(&path, current)?;
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{editor} \"$1\""))
        .arg("sh")
        .arg(&path)
        .status()
        .with_context(|| format!("cannot start the editor `{editor}`"))?;
    if !status.success() {
        bail!("the editor `{editor}` failed ({status}); the memory is unchanged");
    }
    let text = std::fs::read_to_string(&path)?;
    let _ = std::fs::remove_file(&path);
    Ok(text)
}

pub fn streams(global: &Settings, command: &StreamsCommand) -> Result<()> {
    let db = Db::open(global)?;
    match command {
        StreamsCommand::List { json } => {
            let rows = db.stream_rows()?;
            if *json {
                return print_json(&rows);
            }
            let mut out = std::io::stdout().lock();
            writeln!(
                out,
                "{:<24} {:>12} {:>8} {:>8} {:>12}",
                "stream", "bytes", "chunks", "version", "pending"
            )?;
            for r in rows {
                writeln!(
                    out,
                    "{:<24} {:>12} {:>8} {:>8} {:>12}",
                    r["stream"].as_str().unwrap_or(""),
                    r["log_bytes"].as_u64().unwrap_or(0),
                    r["chunks"].as_u64().unwrap_or(0),
                    r["version"].as_u64().unwrap_or(0),
                    r["pending_bytes"].as_u64().unwrap_or(0)
                )?;
            }
        }
        StreamsCommand::Rm { stream } => {
            db.remove_stream(stream)?;
            writeln!(std::io::stdout().lock(), "removed stream `{stream}`")?;
        }
    }
    Ok(())
}

pub fn export(global: &Settings, stream: &str) -> Result<()> {
    let store = open_store(global, "export")?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for record in store.export(stream)? {
        serde_json::to_writer(&mut out, &record)?;
        writeln!(out)?;
    }
    out.flush()?;
    Ok(())
}

pub fn import(
    global: &Settings,
    file: Option<&std::path::Path>,
    rename: Option<&str>,
) -> Result<()> {
    let file = file.filter(|p| p.as_os_str() != "-");
    let name = file.map_or("standard input".to_string(), |p| p.display().to_string());
    let text = super::read_document(file)?;
    let mut records = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record: ExportRecord = serde_json::from_str(line)
            .with_context(|| format!("{name}, line {}: not a memagent export record", i + 1))?;
        records.push(record);
    }
    let store = open_store(global, "import")?;
    let stream = store.import(&records, rename)?;
    writeln!(
        std::io::stdout().lock(),
        "imported stream `{}` ({} bytes, {} records)",
        stream.name,
        stream.log_len,
        records.len()
    )?;
    Ok(())
}

pub fn answers(global: &Settings, stream: &str, json: bool) -> Result<()> {
    let answers: Vec<memagent_store::StandingAnswer> = match Db::open(global)? {
        Db::Local(store) => store.answers(&store.require(stream)?)?,
        Db::Daemon(client) => serde_json::from_value(client.get(&format!(
            "/v1/answers?stream={}",
            super::client::query_escape(stream)
        ))?)?,
    };
    if json {
        return print_json(&answers);
    }
    let mut out = std::io::stdout().lock();
    if answers.is_empty() {
        writeln!(
            out,
            "`{stream}` has no standing answers; add questions with `memctl watch add PATH --ask QUESTION`"
        )?;
    }
    for a in &answers {
        writeln!(
            out,
            "v{} {} · {}\n  {}",
            a.version,
            memagent_watcher::utc(a.created as i64),
            a.question.trim(),
            a.answer.trim().replace('\n', "\n  ")
        )?;
    }
    Ok(())
}
