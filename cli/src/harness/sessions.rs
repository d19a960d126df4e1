//! `memctl bench sessions`: multi-session chats with known answers, read the way a
//! watched chat log is (turns, memory steps, passages) and asked as `memctl query` asks.

use std::collections::BTreeMap;
use std::io::Write;

use anyhow::{bail, Context, Result};
use memagent_memory::{Mode, Query};
use memagent_store::{MemoryVersion, Store, GENERAL};
use memagent_tasks::{session_chat, session_correct, QuestionKind, SessionSample};
use serde_json::{json, Value};

use crate::cli::BenchSessionsArgs;
use crate::commands::streams::{local_answers, read_pending};
use crate::commands::ModelBackend;
use crate::settings::Settings;

/// The chat as a chat log's lines.
fn jsonl(sample: &SessionSample) -> String {
    sample
        .messages
        .iter()
        .map(|m| serde_json::to_string(m).expect("messages serialise") + "\n")
        .collect()
}

pub fn run(global: &Settings, args: &BenchSessionsArgs) -> Result<()> {
    for mode in &args.modes {
        if !matches!(mode.as_str(), "evidence" | "memory") {
            bail!("unknown mode `{mode}` in --modes; expected evidence or memory");
        }
    }
    let backend = ModelBackend::open(global, &args.run)?;
    let embedder = crate::commands::recall::load_embedder(global)?;
    let mut output = super::bench::open_output(args.output.as_deref())?;
    // (mode, kind) -> (right, asked)
    let mut tally: BTreeMap<(String, String), (usize, usize)> = BTreeMap::new();
    let root = std::env::temp_dir().join(format!("memctl-bench-sessions-{}", std::process::id()));
    for seed in 1..=args.samples {
        let sample = session_chat(seed, args.split, args.sessions);
        let dir = root.join(format!("seed{seed}"));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Store::open(&dir)?;
        let name = format!("chat-{seed}.jsonl");
        if let Some(dir) = &args.save_chats {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            std::fs::write(dir.join(&name), jsonl(&sample))
                .with_context(|| format!("cannot write {}", dir.join(&name).display()))?;
        }
        let parsed = memagent_watcher::parse_chat(jsonl(&sample).as_bytes(), 0);
        store.append_turns(
            "chat",
            parsed.text.as_bytes(),
            Some(&name),
            false,
            parsed.turns,
        )?;
        if !args.no_memory {
            read_pending(global, &store, &backend, "chat", |step| {
                tracing::info!("seed {seed}: {step}")
            })?;
        }
        let stream = store.require("chat")?;
        let memory = match store.latest(&stream, GENERAL)? {
            Some(v) => v,
            None => memagent_memory::empty_memory(),
        };
        let recall =
            memagent_recall::Recall::open(&memagent_memory::index_dir(&dir), embedder.clone())?;
        memagent_memory::sync_stream(&store, &recall, &stream, &mut |_| {})?;
        let questions: Vec<String> = sample
            .questions
            .iter()
            .map(|q| q.question.clone())
            .collect();
        for mode in &args.modes {
            let answers = answer(&store, &recall, &backend, mode, &memory, &questions)?;
            for (q, (answer, cited)) in sample.questions.iter().zip(answers) {
                let right = session_correct(q, &answer);
                let kind = format!("{:?}", q.kind).to_lowercase();
                let t = tally.entry((mode.clone(), kind.clone())).or_default();
                t.0 += usize::from(right);
                t.1 += 1;
                tracing::info!(
                    "seed {seed} {mode} {kind}: {} -> {answer:?} ({})",
                    q.question,
                    if right { "right" } else { "wrong" }
                );
                if let Some(out) = &mut output {
                    let row = json!({
                        "split": args.split, "seed": seed, "mode": mode, "kind": kind,
                        "question": q.question, "expected": q.expected, "stale": q.stale,
                        "answer": answer, "right": right, "memory_version": memory.version,
                        "cited": cited,
                    });
                    writeln!(out, "{row}")?;
                }
            }
        }
        drop(recall);
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&root);
    report(args, &tally)
}

/// Each question's answer in `mode`, with the passages it cited (their starts).
fn answer(
    store: &Store,
    recall: &memagent_recall::Recall,
    backend: &ModelBackend,
    mode: &str,
    memory: &MemoryVersion,
    questions: &[String],
) -> Result<Vec<(String, Vec<u64>)>> {
    let mode = match mode {
        "memory" if memory.version == 0 => {
            bail!("the memory mode needs the memory steps; leave out --no-memory")
        }
        "memory" => Mode::MemoryOnly,
        _ => Mode::default(),
    };
    let query = Query {
        stream: "chat".into(),
        questions: questions.to_vec(),
        at: None,
        mode,
        rerank: 0,
    };
    let plan = query.plan(store, Some(recall))?;
    let answers = local_answers(store, backend, &query, plan, &mut |_, _, _| {})?;
    Ok(answers
        .into_iter()
        .map(|a| {
            let cited = a.passages.iter().flatten().map(|e| e.hit.start).collect();
            (a.answer, cited)
        })
        .collect())
}

fn report(
    args: &BenchSessionsArgs,
    tally: &BTreeMap<(String, String), (usize, usize)>,
) -> Result<()> {
    let rows: Vec<Value> = tally
        .iter()
        .map(|((mode, kind), (right, asked))| {
            json!({"mode": mode, "kind": kind, "right": right, "asked": asked,
                   "accuracy": *right as f64 / (*asked).max(1) as f64})
        })
        .collect();
    if args.json {
        return crate::commands::print_json(&json!({
            "split": args.split, "samples": args.samples, "sessions": args.sessions,
            "memory_steps": !args.no_memory, "results": rows,
            "machine": memagent_engine::bench::machine(),
        }));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "machine: {}", memagent_engine::bench::machine())?;
    writeln!(
        out,
        "multi-session chats: {:?} split, {} chats of {} sessions{}",
        args.split,
        args.samples,
        args.sessions,
        if args.no_memory {
            ", no memory steps"
        } else {
            ""
        }
    )?;
    writeln!(
        out,
        "| mode | stated | changed | unknown (abstain) |\n|---|---|---|---|"
    )?;
    for mode in &args.modes {
        let cell = |kind: QuestionKind| {
            let key = (mode.clone(), format!("{kind:?}").to_lowercase());
            tally.get(&key).map_or("-".to_string(), |(r, n)| {
                format!("{:.0}% ({r}/{n})", 100.0 * *r as f64 / (*n).max(1) as f64)
            })
        };
        writeln!(
            out,
            "| {mode} | {} | {} | {} |",
            cell(QuestionKind::Stated),
            cell(QuestionKind::Changed),
            cell(QuestionKind::Unknown)
        )?;
    }
    Ok(())
}
