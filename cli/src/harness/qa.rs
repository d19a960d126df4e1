//! `memctl bench qa`: question answering over real conversations. Each conversation
//! becomes a stream of its own database (its turns as a chat log: the speaker as the
//! name, the turn's time as the timestamp), read into memory as `memctl ingest` reads,
//! and each question is asked as `memctl query` asks, one at a time. Scored as LoCoMo
//! publishes (token F1 over Porter stems, per category; retrieval as the share of the
//! evidence turns among the turns read); saved question by question, so a stopped run
//! resumes where it was.

use std::collections::{BTreeMap, HashSet};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use memagent_memory::{abstains, Mode, Plan, Query};
use memagent_recall::Recall;
use memagent_store::Store;
use memagent_tasks::{
    holds_gold_words, load_conversations, locomo_score, says_not_mentioned, Category, Conversation,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

use super::ruler::mean;
use crate::cli::BenchQaArgs;
use crate::commands::streams::{local_answers, read_pending};
use crate::commands::ModelBackend;
use crate::settings::Settings;

/// The stream each conversation's database holds it in.
const STREAM: &str = "conversation";
/// The search mode's depths.
const DEPTHS: [usize; 3] = [1, 5, 10];

/// One question's result in one mode.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Record {
    conversation: String,
    /// The question's index in its conversation.
    index: usize,
    mode: String,
    category: String,
    question: String,
    gold: Option<String>,
    answer: String,
    /// LoCoMo's score (token F1; adversarial: 1 when the answer says "not mentioned").
    score: f64,
    /// The answer holds every word of the gold answer.
    all_words: bool,
    /// The answer says the conversation does not tell (its own words or LoCoMo's).
    abstained: bool,
    evidence: Vec<String>,
    /// The turns of the passages the answer read (search mode: of the 10 found).
    turns_read: Vec<String>,
    /// Share of the evidence turns among those read; `None` without evidence turns.
    evidence_recall: Option<f64>,
    /// The turns of the sentences the answer's prompts showed the model (each passage
    /// read is cut to the sentences bearing on the question), and the evidence's share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    turns_shown: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    shown_recall: Option<f64>,
    /// The turns of the passages the answer cites, and the turns it cites in them (a
    /// chat answer cites the turn it reads from).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    passages_cited: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    turns_cited: Vec<String>,
    /// Search mode: the share at 1, 5 and 10 passages.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    recall_at: Vec<f64>,
    /// Search mode: the passages found, in the search's order (before ranking again),
    /// so that measures of another depth or order need no second run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    found: Vec<Found>,
    seconds: f64,
    model_calls: usize,
}

/// A passage the search found for a question.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Found {
    /// The turns it holds.
    turns: Vec<String>,
    /// Its fused score.
    score: f64,
    /// Ranked again (`--rerank`): the model's mean log-probability of the question after it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    likelihood: Option<f64>,
}

/// Where each turn of a conversation lies in its stream's log.
struct Layout {
    /// (offset, turn id), in log order.
    turns: Vec<(u64, String)>,
    len: u64,
}

impl Layout {
    /// Whether a turn of the conversation has the id `id`.
    fn holds(&self, id: &str) -> bool {
        self.turns.iter().any(|(_, t)| t == id)
    }

    /// The ids of the turns overlapping bytes `[start, end)`.
    fn turns_in(&self, start: u64, end: u64) -> Vec<String> {
        (0..self.turns.len())
            .filter(|&i| {
                let from = self.turns[i].0;
                let to = self.turns.get(i + 1).map_or(self.len, |t| t.0);
                from < end && to > start
            })
            .map(|i| self.turns[i].1.clone())
            .collect()
    }
}

/// Whether the memory steps run: a mode answering reads the memory, unless
/// `--no-memory`; search alone does not.
fn memory_steps(args: &BenchQaArgs) -> bool {
    !args.no_memory && args.modes.iter().any(|m| m != "search")
}

/// Share of `evidence` among `read`; `None` when there is no evidence turn.
fn recall_of(evidence: &[String], read: &[String]) -> Option<f64> {
    (!evidence.is_empty()).then(|| {
        evidence.iter().filter(|e| read.contains(e)).count() as f64 / evidence.len() as f64
    })
}

pub fn run(global: &Settings, args: &BenchQaArgs) -> Result<()> {
    for c in &args.categories {
        if !Category::ALL.iter().any(|k| k.name() == c) {
            bail!(
                "unknown category `{c}` in --categories; expected single-hop, multi-hop, \
                 temporal, open-domain or adversarial"
            );
        }
    }
    for what in &args.without {
        if !matches!(what.as_str(), "dates") {
            bail!("unknown ablation `{what}` in --without; expected dates");
        }
    }
    for mode in &args.modes {
        if !matches!(mode.as_str(), "evidence" | "memory" | "search" | "direct") {
            bail!("unknown mode `{mode}` in --modes; expected evidence, memory, search or direct");
        }
    }
    if args.no_memory && args.modes.iter().any(|m| m == "memory") {
        bail!("the memory mode needs the memory steps; leave out --no-memory");
    }
    let mut conversations = load_conversations(&args.data)?;
    if !args.conversations.is_empty() {
        for id in &args.conversations {
            if !conversations.iter().any(|c| &c.id == id) {
                bail!("{}: no conversation `{id}`", args.data.display());
            }
        }
        conversations.retain(|c| args.conversations.contains(&c.id));
    }
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let saved_path = args.out.join("results.jsonl");
    if args.fresh {
        let _ = std::fs::remove_file(&saved_path);
    }
    let mut records = load(&saved_path)?;
    let done: HashSet<(String, usize, String)> = records
        .iter()
        .map(|r| (r.conversation.clone(), r.index, r.mode.clone()))
        .collect();
    let mut saved = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&saved_path)
        .with_context(|| format!("cannot write {}", saved_path.display()))?;
    let needs_model = args.rerank > 0 || args.modes.iter().any(|m| m != "search");
    let backend = match needs_model {
        true => Some(ModelBackend::open(global, &args.run)?),
        false => None,
    };
    let embedder = crate::commands::recall::load_embedder(global)?;
    // The questions this run asks: every Nth of each conversation, of the categories named.
    let asks = |index: usize, category: Category| {
        (index as u64).is_multiple_of(args.every)
            && (args.categories.is_empty() || args.categories.iter().any(|c| c == category.name()))
    };
    let (mut asked, mut resumed) = (0usize, 0usize);
    // Passages read ahead, and their seconds (apart from the questions').
    let (mut read_ahead, mut read_ahead_seconds) = (0usize, 0.0f64);
    for conv in &conversations {
        let dir = args.out.join("stores").join(&conv.id);
        let store = Store::open(&dir)?;
        let layout = ingest(&store, conv)?;
        if let (true, Some(backend)) = (memory_steps(args), &backend) {
            let started = Instant::now();
            let steps = read_pending(global, &store, backend, STREAM, |step| {
                tracing::info!("{}: {step}", conv.id)
            })?;
            if !steps.is_empty() {
                tracing::info!(
                    "{}: {} memory steps in {:.0}s",
                    conv.id,
                    steps.len(),
                    started.elapsed().as_secs_f64()
                );
            }
        }
        for (index, q) in conv.questions.iter().enumerate() {
            if !asks(index, q.category) {
                continue;
            }
            for id in q.evidence.iter().filter(|e| !layout.holds(e)) {
                tracing::warn!(
                    "{} #{index}: evidence `{id}` names no turn of the conversation; left \
                     out of the evidence measures",
                    conv.id
                );
            }
        }
        let recall = Recall::open(&memagent_memory::index_dir(&dir), embedder.clone())?;
        memagent_memory::sync_stream(&store, &recall, &store.require(STREAM)?, &mut |_| {})?;
        let left = (0..conv.questions.len()).any(|i| {
            args.modes
                .iter()
                .any(|m| !done.contains(&(conv.id.clone(), i, m.clone())))
        });
        if let (true, true, Some(backend)) = (args.read_ahead, left, &backend) {
            let started = Instant::now();
            let hits = recall.latest_passages(store.require(STREAM)?.id, usize::MAX)?;
            let read = backend.with_agent(|agent| {
                let mut ahead = memagent_memory::ReadAhead::default();
                ahead.plan(hits.iter().map(|h| h.text.as_str()));
                while !ahead.is_idle() {
                    ahead.step(agent.backend())?;
                }
                Ok(ahead.read())
            })?;
            let seconds = started.elapsed().as_secs_f64();
            tracing::info!("{}: {read} passages read ahead in {seconds:.1}s", conv.id);
            read_ahead += read;
            read_ahead_seconds += seconds;
        }
        for index in 0..conv.questions.len() {
            if !asks(index, conv.questions[index].category) {
                continue;
            }
            for mode in &args.modes {
                if done.contains(&(conv.id.clone(), index, mode.clone())) {
                    resumed += 1;
                    continue;
                }
                let asking = Asking {
                    store: &store,
                    recall: &recall,
                    backend: backend.as_ref(),
                    layout: &layout,
                    args,
                };
                let record = asking.ask(conv, index, mode)?;
                tracing::info!(
                    "{} #{index} {mode} {}: {:?} -> {:?} (gold {:?}, score {:.2})",
                    conv.id,
                    record.category,
                    record.question,
                    record.answer,
                    record.gold,
                    record.score
                );
                writeln!(saved, "{}", serde_json::to_string(&record)?)?;
                saved.flush()?;
                records.push(record);
                asked += 1;
            }
        }
    }
    tracing::info!("{asked} questions asked, {resumed} resumed");
    records.retain(|r| {
        (args.categories.is_empty() || args.categories.contains(&r.category))
            && args.modes.contains(&r.mode)
            && conversations
                .iter()
                .any(|c| c.id == r.conversation && (r.index as u64).is_multiple_of(args.every))
    });
    report(args, &records, (read_ahead, read_ahead_seconds))
}

/// Appends the conversation as a chat log to a new stream (a stream already holding it,
/// from an earlier run, is kept), and says where each turn lies.
fn ingest(store: &Store, conv: &Conversation) -> Result<Layout> {
    let lines: String = conv
        .turns
        .iter()
        .map(|t| t.chat_message().to_string() + "\n")
        .collect();
    let parsed = memagent_watcher::parse_chat(lines.as_bytes(), 0);
    if let Some((line, reason)) = parsed.errors.first() {
        bail!("{}: turn {line} cannot be rendered: {reason}", conv.id);
    }
    let layout = Layout {
        turns: parsed
            .turns
            .iter()
            .map(|&(offset, line)| (offset, conv.turns[line as usize - 1].id.clone()))
            .collect(),
        len: parsed.text.len() as u64,
    };
    match store.stream(STREAM)? {
        Some(s) if s.log_len == layout.len => {}
        Some(s) => bail!(
            "{}: the stream holds {} bytes, not the {} of this conversation; remove the \
             folder or use another --out",
            conv.id,
            s.log_len,
            layout.len
        ),
        None => {
            store.append_turns(
                STREAM,
                parsed.text.as_bytes(),
                Some(&format!("{}.jsonl", conv.id)),
                false,
                parsed.turns,
            )?;
        }
    }
    Ok(layout)
}

struct Asking<'a> {
    store: &'a Store,
    recall: &'a Recall,
    backend: Option<&'a ModelBackend>,
    layout: &'a Layout,
    args: &'a BenchQaArgs,
}

impl Asking<'_> {
    fn without(&self, what: &str) -> bool {
        self.args.without.iter().any(|w| w == what)
    }

    fn ask(&self, conv: &Conversation, index: usize, mode: &str) -> Result<Record> {
        let q = &conv.questions[index];
        let evidence: Vec<String> = q
            .evidence
            .iter()
            .filter(|e| self.layout.holds(e))
            .cloned()
            .collect();
        let mut record = Record {
            conversation: conv.id.clone(),
            index,
            mode: mode.to_string(),
            category: q.category.name().to_string(),
            question: q.question.clone(),
            gold: q.answer.clone(),
            answer: String::new(),
            score: 0.0,
            all_words: false,
            abstained: false,
            evidence,
            turns_read: Vec::new(),
            evidence_recall: None,
            turns_shown: Vec::new(),
            shown_recall: None,
            passages_cited: Vec::new(),
            turns_cited: Vec::new(),
            recall_at: Vec::new(),
            found: Vec::new(),
            seconds: 0.0,
            model_calls: 0,
        };
        let started = Instant::now();
        if mode == "search" {
            let deepest = DEPTHS[DEPTHS.len() - 1];
            let mut found = memagent_memory::search(
                self.store,
                self.recall,
                Some(&[STREAM]),
                &q.question,
                deepest.max(self.args.passages).max(self.args.rerank),
            )?;
            let order: Vec<(u64, u64)> = found.iter().map(|e| (e.hit.start, e.hit.end)).collect();
            if let (n @ 1.., Some(backend)) = (self.args.rerank, self.backend) {
                found = backend.with_agent(|agent| {
                    Ok(memagent_memory::rerank(
                        agent.backend(),
                        &q.question,
                        found,
                        n,
                    )?)
                })?;
            }
            // A question without an evidence turn in its chat has nothing to find: it
            // is left out of the search's measures, as of the evidence read.
            for depth in DEPTHS {
                let read: Vec<String> = found
                    .iter()
                    .take(depth)
                    .flat_map(|e| self.layout.turns_in(e.hit.start, e.hit.end))
                    .collect();
                record.recall_at.extend(recall_of(&record.evidence, &read));
                record.turns_read = read;
            }
            record.evidence_recall = recall_of(&record.evidence, &record.turns_read);
            record.seconds = started.elapsed().as_secs_f64();
            record.found = order
                .into_iter()
                .filter_map(|span| found.iter().find(|e| (e.hit.start, e.hit.end) == span))
                .map(|e| Found {
                    turns: self.layout.turns_in(e.hit.start, e.hit.end),
                    score: e.hit.score,
                    likelihood: e.likelihood,
                })
                .collect();
            return Ok(record);
        }
        let backend = self.backend.ok_or_else(|| anyhow!("no model"))?;
        if mode == "direct" {
            let stream = self.store.require(STREAM)?;
            let log = self.store.read_log(&stream, 0, stream.log_len)?;
            let text = String::from_utf8_lossy(&log);
            let (start, report) =
                backend.with_agent(|agent| direct_tail(agent, &text, &q.question))?;
            record.seconds = started.elapsed().as_secs_f64();
            record.model_calls = 1;
            record.turns_read = self.layout.turns_in(start as u64, stream.log_len);
            record.evidence_recall = recall_of(&record.evidence, &record.turns_read);
            record.answer = report.answer.trim().to_string();
            record.score = locomo_score(q, &record.answer);
            record.all_words = holds_gold_words(q, &record.answer);
            record.abstained = abstains(&record.answer) || says_not_mentioned(&record.answer);
            return Ok(record);
        }
        let query = Query {
            stream: STREAM.into(),
            questions: vec![q.question.clone()],
            at: None,
            mode: match mode {
                "memory" => Mode::MemoryOnly,
                _ => Mode::Evidence {
                    k: self.args.passages,
                    tokens: self.args.evidence_tokens,
                },
            },
            rerank: self.args.rerank,
        };
        let mut plan = query.plan(self.store, Some(self.recall))?;
        if let (true, Plan::Evidence { found, .. }) = (self.without("dates"), &mut plan) {
            for e in found.iter_mut().flatten() {
                e.hit.dated = None;
            }
        }
        let answer = local_answers(self.store, backend, &query, plan, &mut |_, _, _| {})?
            .pop()
            .ok_or_else(|| anyhow!("no answer"))?;
        record.seconds = started.elapsed().as_secs_f64();
        record.model_calls = answer.model_calls.unwrap_or(1);
        record.turns_read = answer
            .passages
            .iter()
            .flatten()
            .flat_map(|e| self.layout.turns_in(e.hit.start, e.hit.end))
            .collect();
        if mode != "memory" {
            record.evidence_recall = recall_of(&record.evidence, &record.turns_read);
            let mut shown: Vec<String> = Vec::new();
            for e in answer.passages.iter().flatten() {
                for (start, end) in memagent_memory::shown_ranges(e, &q.question) {
                    for turn in self.layout.turns_in(start, end) {
                        if !shown.contains(&turn) {
                            shown.push(turn);
                        }
                    }
                }
            }
            record.shown_recall = recall_of(&record.evidence, &shown);
            record.turns_shown = shown;
            for e in answer.passages.iter().flatten().filter(|e| e.cited) {
                record
                    .passages_cited
                    .extend(self.layout.turns_in(e.hit.start, e.hit.end));
                if let Some(t) = &e.turn {
                    record
                        .turns_cited
                        .extend(self.layout.turns_in(t.start, t.end));
                }
            }
        }
        record.answer = answer.text().trim().to_string();
        record.score = locomo_score(q, &record.answer);
        record.all_words = holds_gold_words(q, &record.answer);
        record.abstained = abstains(&record.answer) || says_not_mentioned(&record.answer);
        Ok(record)
    }
}

/// The direct baseline: as much of the conversation's end as fits the model's context,
/// from a turn's start, in one prompt with the question. Returns where the text read
/// starts, and the answer.
fn direct_tail(
    agent: &memagent_agent::MemoryAgent<'_>,
    text: &str,
    question: &str,
) -> Result<(usize, memagent_agent::AnswerReport)> {
    let mut start = 0;
    loop {
        match agent.direct(&text[start..], question) {
            Ok(report) => return Ok((start, report)),
            Err(memagent_agent::Error::Budget(_)) if start < text.len() => {
                // Drop an eighth of what is left, to the next line's start.
                let cut = text.floor_char_boundary(start + (text.len() - start) / 8);
                start = text[cut..].find('\n').map_or(text.len(), |i| cut + i + 1);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn load(path: &Path) -> Result<Vec<Record>> {
    let Ok(text) = std::fs::read_to_string(path) else {
        return Ok(Vec::new());
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| {
                format!(
                    "{}:{}: not a result line; remove the file or pass --fresh",
                    path.display(),
                    i + 1
                )
            })
        })
        .collect()
}

/// The summary of one mode's records over one group of them.
fn summary(records: &[&Record]) -> serde_json::Value {
    let answerable: Vec<&&Record> = records
        .iter()
        .filter(|r| r.category != Category::Adversarial.name())
        .collect();
    let adversarial: Vec<&&Record> = records
        .iter()
        .filter(|r| r.category == Category::Adversarial.name())
        .collect();
    let share = |rs: &[&&Record], f: &dyn Fn(&Record) -> bool| {
        mean(rs.iter().map(|r| f64::from(u8::from(f(r)))))
    };
    let citing: Vec<&&Record> = answerable
        .iter()
        .copied()
        .filter(|r| !r.passages_cited.is_empty() && !r.evidence.is_empty())
        .collect();
    // The search's measures count the questions with an evidence turn in their chat.
    let searched: Vec<&&Record> = answerable
        .iter()
        .copied()
        .filter(|r| !r.recall_at.is_empty())
        .collect();
    json!({
        "questions": records.len(),
        "f1": mean(records.iter().map(|r| r.score)),
        "f1_answerable": mean(answerable.iter().map(|r| r.score)),
        "all_gold_words": share(&answerable, &|r| r.all_words),
        "adversarial_not_mentioned": share(&adversarial, &|r| says_not_mentioned(&r.answer)),
        "adversarial_abstained": share(&adversarial, &|r| r.abstained),
        "false_not_known": share(&answerable, &|r| r.abstained),
        "evidence_recall": mean(answerable.iter().filter_map(|r| r.evidence_recall)),
        "evidence_shown": mean(answerable.iter().filter_map(|r| r.shown_recall)),
        // Of the answers citing a passage, those whose passages (turns) cited hold an
        // evidence turn.
        "cited_passage_evidence": share(&citing, &|r| r.passages_cited.iter().any(|t| r.evidence.contains(t))),
        "cited_turn_evidence": share(&citing, &|r| r.turns_cited.iter().any(|t| r.evidence.contains(t))),
        "citing": citing.len(),
        "with_evidence": searched.len(),
        "recall_at": DEPTHS.iter().enumerate().map(|(i, d)| {
            json!({"passages": d, "recall": mean(searched.iter().filter_map(|r| r.recall_at.get(i).copied())),
                   "any": share(&searched, &|r| r.recall_at.get(i).is_some_and(|&x| x > 0.0)),
                   "all": share(&searched, &|r| r.recall_at.get(i).is_some_and(|&x| x >= 1.0))})
        }).collect::<Vec<_>>(),
        "seconds_per_question": mean(records.iter().map(|r| r.seconds)),
        "model_calls_per_question": mean(records.iter().map(|r| r.model_calls as f64)),
    })
}

/// `read_ahead`: passages read ahead in this run and their seconds.
fn report(args: &BenchQaArgs, records: &[Record], read_ahead: (usize, f64)) -> Result<()> {
    let mut results = BTreeMap::new();
    for mode in &args.modes {
        let of_mode: Vec<&Record> = records.iter().filter(|r| &r.mode == mode).collect();
        let mut by_category = serde_json::Map::new();
        for c in Category::ALL {
            let rs: Vec<&Record> = of_mode
                .iter()
                .copied()
                .filter(|r| r.category == c.name())
                .collect();
            if !rs.is_empty() {
                by_category.insert(c.name().to_string(), summary(&rs));
            }
        }
        results.insert(
            mode.clone(),
            json!({"overall": summary(&of_mode), "categories": by_category}),
        );
    }
    let value = json!({
        "data": args.data.display().to_string(),
        "every": args.every,
        "memory_steps": memory_steps(args),
        "passages": args.passages,
        "evidence_tokens": args.evidence_tokens,
        "rerank": args.rerank,
        "read_ahead": args.read_ahead.then(|| json!({
            "passages": read_ahead.0,
            "seconds": read_ahead.1,
        })),
        "without": args.without,
        "cpu": memagent_engine::bench::cpu_name(),
        "machine": memagent_engine::bench::machine(),
        "results": results,
    });
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&value)? + "\n",
    )?;
    let md = markdown(args, &value);
    std::fs::write(args.out.join("report.md"), &md)?;
    plot(&args.out.join("f1.svg"), &value, &args.modes)?;
    if args.json {
        return crate::commands::print_json(&value);
    }
    write!(std::io::stdout().lock(), "{md}")?;
    Ok(())
}

fn pct(v: &serde_json::Value) -> String {
    v.as_f64()
        .map_or("-".into(), |x| format!("{:.0}%", 100.0 * x))
}

fn num(v: &serde_json::Value, digits: usize) -> String {
    v.as_f64().map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn markdown(args: &BenchQaArgs, value: &serde_json::Value) -> String {
    let mut md = format!(
        "# Question answering over conversations\n\n{} · every {} question(s) · {} · k {} · {} evidence tokens{}\n\nmachine: {}\n",
        args.data.display(),
        args.every,
        if memory_steps(args) { "memory steps" } else { "no memory steps" },
        args.passages,
        args.evidence_tokens,
        match (args.rerank, &value["read_ahead"]) {
            (0, _) => String::new(),
            (n, ahead) if ahead.is_object() => format!(
                " · the best {n} ranked again by the question's likelihood · {} passages read \
                 ahead in {:.0} s, apart from the questions",
                ahead["passages"],
                ahead["seconds"].as_f64().unwrap_or(0.0)
            ),
            (n, _) => format!(" · the best {n} ranked again by the question's likelihood"),
        },
        memagent_engine::bench::machine(),
    );
    for mode in &args.modes {
        let r = &value["results"][mode];
        md.push_str(&format!("\n## {mode}\n\n"));
        if mode == "search" {
            md.push_str("| category | n | with evidence | recall@1 | recall@5 | any@5 | recall@10 | all@10 |\n|---|---:|---:|---:|---:|---:|---:|---:|\n");
            let mut row = |name: &str, s: &serde_json::Value| {
                let at = |i: usize, key: &str| pct(&s["recall_at"][i][key]);
                md.push_str(&format!(
                    "| {name} | {} | {} | {} | {} | {} | {} | {} |\n",
                    s["questions"],
                    s["with_evidence"],
                    at(0, "recall"),
                    at(1, "recall"),
                    at(1, "any"),
                    at(2, "recall"),
                    at(2, "all")
                ));
            };
            for c in Category::ALL {
                if let Some(s) = r["categories"].get(c.name()) {
                    row(c.name(), s);
                }
            }
            row("overall", &r["overall"]);
            continue;
        }
        md.push_str("| category | n | F1 | all gold words | evidence recall | evidence shown | abstained | s/question | model calls |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        let mut row = |name: &str, s: &serde_json::Value| {
            md.push_str(&format!(
                "| {name} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                s["questions"],
                num(&s["f1"], 3),
                pct(&s["all_gold_words"]),
                pct(&s["evidence_recall"]),
                pct(&s["evidence_shown"]),
                match name {
                    "adversarial" => pct(&s["adversarial_abstained"]),
                    _ => pct(&s["false_not_known"]),
                },
                num(&s["seconds_per_question"], 2),
                num(&s["model_calls_per_question"], 1),
            ));
        };
        for c in Category::ALL {
            if let Some(s) = r["categories"].get(c.name()) {
                row(c.name(), s);
            }
        }
        row("overall", &r["overall"]);
        let o = &r["overall"];
        md.push_str(&format!(
            "\nF1 of answerable questions {}; adversarial answered \"not mentioned\" {} (abstained {}); false \"not known\" on answerable {}.\n",
            num(&o["f1_answerable"], 3),
            pct(&o["adversarial_not_mentioned"]),
            pct(&o["adversarial_abstained"]),
            pct(&o["false_not_known"]),
        ));
        if o["citing"].as_u64().unwrap_or(0) > 0 {
            md.push_str(&format!(
                "Of {} answers citing a passage, the passages cited hold an evidence turn for {}, the turns cited for {}.\n",
                o["citing"],
                pct(&o["cited_passage_evidence"]),
                pct(&o["cited_turn_evidence"]),
            ));
        }
    }
    md.push_str("\nPlot: f1.svg (F1 per category and mode; search mode: recall at 5).\n");
    md
}

/// F1 per category, a bar per mode (the search mode's evidence recall at 5 passages).
fn plot(path: &Path, value: &serde_json::Value, modes: &[String]) -> Result<()> {
    use plotters::prelude::*;
    let fail = |e: &dyn std::fmt::Display| anyhow!("cannot draw {}: {e}", path.display());
    let root = SVGBackend::new(path, (900, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let names: Vec<&str> = Category::ALL.iter().map(|c| c.name()).collect();
    let mut chart = ChartBuilder::on(&root)
        .caption("Conversations: score per category", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..names.len() as f64, 0f64..1.05f64)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(names.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let i = (*x - 0.5).round();
            match (
                i >= 0.0 && (*x - 0.5 - i).abs() < 0.01,
                names.get(i as usize),
            ) {
                (true, Some(n)) => n.to_string(),
                _ => String::new(),
            }
        })
        .y_desc("F1 (search: recall at 5)")
        .draw()
        .map_err(|e| fail(&e))?;
    let width = 0.8 / modes.len().max(1) as f64;
    for (m, mode) in modes.iter().enumerate() {
        let color = Palette99::pick(m).to_rgba();
        let bars: Vec<Rectangle<(f64, f64)>> = names
            .iter()
            .enumerate()
            .filter_map(|(i, name)| {
                let s = &value["results"][mode]["categories"][*name];
                let y = match mode.as_str() {
                    "search" => s["recall_at"][1]["recall"].as_f64(),
                    _ => s["f1"].as_f64(),
                }?;
                let x = i as f64 + 0.1 + m as f64 * width;
                Some(Rectangle::new([(x, 0.0), (x + width, y)], color.filled()))
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(|e| fail(&e))?
            .label(mode.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_passage_reads_the_turns_it_overlaps() {
        let layout = Layout {
            turns: vec![(0, "D1:1".into()), (30, "D1:2".into()), (70, "D1:3".into())],
            len: 100,
        };
        assert_eq!(layout.turns_in(0, 30), ["D1:1"]);
        assert_eq!(layout.turns_in(10, 71), ["D1:1", "D1:2", "D1:3"]);
        assert_eq!(layout.turns_in(70, 100), ["D1:3"]);
        let ev = ["D1:2".to_string(), "D1:3".to_string()];
        assert_eq!(recall_of(&ev, &layout.turns_in(30, 70)), Some(0.5));
        assert_eq!(recall_of(&[], &layout.turns_in(30, 70)), None);
    }
}
