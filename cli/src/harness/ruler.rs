//! `memctl bench ruler`: RULER-style tasks against length, the memory loop against the
//! whole document in one prompt, saved sample by sample, with a report and plots.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::io::{BufRead, Write};
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use memagent_agent::{MemoryAgent, NO_MEMORY};
use memagent_memory::{Ingestor, GENERAL_ANSWER};
use memagent_store::{Store, StreamRecord, GENERAL};
use memagent_tasks::{generate_split, score, EvalSplit, QaItem, RulerSample, Sources, Task};
use serde::{Deserialize, Serialize};

use crate::cli::BenchRulerArgs;
use crate::settings::Settings;

/// One sample's result, as saved in `results.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub task: Task,
    pub length: usize,
    pub seed: u64,
    pub mode: String,
    pub model: String,
    pub chunk_tokens: usize,
    pub memory_tokens: usize,
    /// Tokens of the generated document.
    pub tokens: usize,
    pub question: String,
    pub expected: Vec<String>,
    /// The extracted answer; none where the mode could not run (direct past the context).
    pub answer: Option<String>,
    pub score: Option<f64>,
    pub f1: Option<f64>,
    pub exact: Option<f64>,
    /// Where the inserted sentences landed (token fraction).
    pub depths: Vec<f64>,
    pub steps: usize,
    /// Wall seconds; through the store, the steps' recorded seconds plus the answer's, so
    /// a sample resumed after a stop counts every step once.
    pub seconds: f64,
    /// The store stream the sample was read through (`--stream`).
    #[serde(default)]
    pub stream: Option<String>,
    /// Which split generated the sample.
    #[serde(default = "test_split")]
    pub split: EvalSplit,
}

fn test_split() -> EvalSplit {
    EvalSplit::Test
}

/// What makes a sample's result: task, length, seed, mode, model, chunk and memory
/// tokens, whether it read through the store, split.
type RecordKey = (
    Task,
    usize,
    u64,
    String,
    String,
    usize,
    usize,
    bool,
    EvalSplit,
);

impl Record {
    fn key(&self) -> RecordKey {
        (
            self.task,
            self.length,
            self.seed,
            self.mode.clone(),
            self.model.clone(),
            self.chunk_tokens,
            self.memory_tokens,
            self.stream.is_some(),
            self.split,
        )
    }
}

/// Results saved so far (a torn last line, from a run killed mid-write, is skipped).
fn load(path: &Path) -> Result<Vec<Record>> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(&line) {
            Ok(r) => out.push(r),
            Err(e) => tracing::warn!("{}:{}: skipped ({e})", path.display(), i + 1),
        }
    }
    Ok(out)
}

fn read_qa(path: &Path) -> Result<Vec<QaItem>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).with_context(|| {
                format!(
                    "{}:{}: not a QA item ({{\"question\", \"answers\", \"gold\", \"distractors\"}})",
                    path.display(),
                    i + 1
                )
            })
        })
        .collect()
}

pub fn run(global: &Settings, args: &BenchRulerArgs) -> Result<()> {
    let tasks: Vec<Task> = args
        .tasks
        .iter()
        .map(|t| t.parse::<Task>())
        .collect::<Result<_, _>>()?;
    check_modes(args)?;
    if args.samples == 0 || args.lengths.is_empty() || tasks.is_empty() {
        bail!("nothing to run: --tasks, --lengths and --samples must be non-empty");
    }
    let (qa, haystack, searcher) = inputs(global, args, &tasks)?;
    let (records, done, file) = open_results(args)?;

    // The database is opened before the model: a daemon holding it is reported at once.
    let store = match &args.stream {
        Some(_) => Some(crate::commands::db::Db::open(global)?.local("bench ruler --stream")?),
        None => None,
    };
    let backend = crate::commands::ModelBackend::open(global, &args.run)?;
    let (model, model_sha256) = backend.identity()?;
    let profile = backend.profile();
    let mut saved = Saved {
        file,
        records,
        total: tasks.len() * args.lengths.len() * args.samples * args.modes.len(),
        skipped: 0,
        ran: 0,
        started: Instant::now(),
    };
    backend.with_agent(|agent| {
        let stored = match (&store, &args.stream) {
            (Some(store), Some(prefix)) => Some(Stored {
                store,
                ingestor: Ingestor::new(store, agent, model.clone(), model_sha256.clone()),
                model: &model,
                prefix,
                fresh: args.fresh,
            }),
            _ => None,
        };
        let sources = Sources {
            haystack: &haystack,
            tokenizer: agent.tokenizer(),
            qa: &qa,
        };
        // Streams whose documents were read in this run (`--fresh` starts each over once).
        let mut ingested = HashSet::new();
        for &length in &args.lengths {
            for &task in &tasks {
                // A sample's modes share its document, and `memory` and `evidence` its loop.
                let mut samples: BTreeMap<u64, RulerSample> = BTreeMap::new();
                let mut loops: BTreeMap<u64, Loop> = BTreeMap::new();
                for mode in &args.modes {
                    let mut pending = Vec::new();
                    for i in 0..args.samples {
                        let blank = Record {
                            seed: args.task_seed + i as u64,
                            ..blank_record(args, task, length, mode, &model, &profile)
                        };
                        let blank = Record {
                            stream: match (&stored, mode.as_str()) {
                                (Some(s), "memory" | "general") => Some(s.name(&blank)),
                                _ => None,
                            },
                            ..blank
                        };
                        if done.contains(&blank.key()) {
                            saved.skipped += 1;
                        } else {
                            pending.push(blank);
                        }
                    }
                    // Samples of a mode go `--batch` at a time (the direct mode one by one).
                    for group in pending.chunks(usize::from(args.batch)) {
                        for blank in group {
                            if let std::collections::btree_map::Entry::Vacant(slot) =
                                samples.entry(blank.seed)
                            {
                                slot.insert(generate_split(
                                    &sources, task, length, blank.seed, args.split,
                                )?);
                            }
                        }
                        let group: Vec<(&RulerSample, Record)> = group
                            .iter()
                            .map(|blank| (&samples[&blank.seed], blank.clone()))
                            .collect();
                        let finished = match &stored {
                            Some(stored) if mode != "direct" => {
                                stored.run(agent, group, &mut ingested)?
                            }
                            _ => run_group(agent, group, &searcher, &mut loops)?,
                        };
                        for record in finished {
                            saved.keep(record)?;
                        }
                    }
                }
            }
        }
        Ok(())
    })?;
    let Saved {
        records,
        ran,
        skipped,
        ..
    } = saved;
    if skipped > 0 {
        eprintln!("{skipped} samples were done already (results.jsonl); --fresh starts over");
    }
    // The report covers this run's tasks, lengths, modes and profile.
    let report = reported(records, args, &tasks, &model, &profile);
    let source = format!("{} ({} split)", haystack.source(), args.split);
    write_report(&args.out, &report, &model, &profile, &source)?;
    println!(
        "{ran} samples run, {skipped} resumed; report in {}",
        args.out.join("report.md").display()
    );
    print!("{}", std::fs::read_to_string(args.out.join("report.md"))?);
    Ok(())
}

/// The results of a run as they come: appended to results.jsonl at once, and counted.
struct Saved {
    file: std::fs::File,
    records: Vec<Record>,
    total: usize,
    skipped: usize,
    ran: usize,
    started: Instant,
}

impl Saved {
    /// Says how the sample went, and keeps its record.
    fn keep(&mut self, record: Record) -> Result<()> {
        self.ran += 1;
        eprintln!(
            "[{}/{}] {} {} seed {} {}: {} ({:.1}s; {:.0}s so far)",
            self.skipped + self.ran,
            self.total,
            record.task,
            record.length,
            record.seed,
            record.mode,
            record
                .score
                .map_or("n/a".to_string(), |s| format!("{:.0}%", s * 100.0)),
            record.seconds,
            self.started.elapsed().as_secs_f64()
        );
        serde_json::to_writer(&mut self.file, &record)?;
        writeln!(self.file)?;
        self.file.flush()?;
        self.records.push(record);
        Ok(())
    }
}

/// Every mode of `--modes` is known and fits `--stream` (given or not).
fn check_modes(args: &BenchRulerArgs) -> Result<()> {
    for mode in &args.modes {
        match mode.as_str() {
            "memory" | "direct" => {}
            "evidence" | "passages" if args.stream.is_some() => bail!(
                "the {mode} mode reads documents without the store: leave out --stream"
            ),
            "evidence" | "passages" => {}
            "general" if args.stream.is_none() => bail!(
                "the general mode reads samples into a stream's general memory: give --stream NAME"
            ),
            "general" => {}
            _ => bail!(
                "unknown mode `{mode}` in --modes; expected memory, evidence, passages, direct or general"
            ),
        }
    }
    Ok(())
}

/// The run's inputs: the qa items (for the qa task), the filler, and how the evidence
/// modes search.
fn inputs(
    global: &Settings,
    args: &BenchRulerArgs,
    tasks: &[Task],
) -> Result<(Vec<QaItem>, memagent_tasks::Haystack, Searcher)> {
    let qa = match &args.qa {
        Some(path) => read_qa(path)?,
        None if tasks.contains(&Task::Qa) => {
            bail!(
                "the qa task needs --qa FILE (JSON Lines of question, answers, gold, distractors)"
            )
        }
        None => Vec::new(),
    };
    let haystack = match (args.split, &args.haystack) {
        (EvalSplit::Validation, None) => memagent_tasks::training::validation_filler()?,
        (_, dir) => super::bench::haystack(dir.as_deref())?,
    };
    if args.passages == 0 {
        bail!("-k must be at least 1");
    }
    let searcher = Searcher {
        embedder: match args
            .modes
            .iter()
            .any(|m| m == "evidence" || m == "passages")
        {
            true => crate::commands::recall::load_embedder(global)?,
            false => None,
        },
        k: args.passages,
        budget: args.evidence_tokens,
    };
    Ok((qa, haystack, searcher))
}

/// The results so far (`--out`/results.jsonl, emptied by `--fresh`), the keys of those
/// done, and the file opened to append new ones.
fn open_results(args: &BenchRulerArgs) -> Result<(Vec<Record>, HashSet<RecordKey>, std::fs::File)> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let saved_path = args.out.join("results.jsonl");
    if args.fresh {
        let _ = std::fs::remove_file(&saved_path);
    }
    let records = load(&saved_path)?;
    let done: HashSet<_> = records.iter().map(Record::key).collect();
    let saved = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&saved_path)
        .with_context(|| format!("cannot write {}", saved_path.display()))?;

    Ok((records, done, saved))
}

/// A sample's record before it runs (its seed set by the caller).
fn blank_record(
    args: &BenchRulerArgs,
    task: Task,
    length: usize,
    mode: &str,
    model: &str,
    profile: &memagent_agent::Profile,
) -> Record {
    Record {
        task,
        length,
        seed: args.task_seed,
        mode: mode.to_string(),
        model: model.to_string(),
        chunk_tokens: profile.chunk_tokens,
        memory_tokens: profile.memory_tokens,
        tokens: 0,
        question: String::new(),
        expected: Vec::new(),
        answer: None,
        score: None,
        f1: None,
        exact: None,
        depths: Vec::new(),
        steps: 0,
        seconds: 0.0,
        stream: None,
        split: args.split,
    }
}

/// The records this run reports: its tasks, lengths, modes, seeds, model, profile,
/// store use and split.
fn reported(
    records: Vec<Record>,
    args: &BenchRulerArgs,
    tasks: &[Task],
    model: &str,
    profile: &memagent_agent::Profile,
) -> Vec<Record> {
    let wanted: BTreeSet<_> = tasks.iter().copied().collect();
    records
        .into_iter()
        .filter(|r| {
            wanted.contains(&r.task)
                && args.lengths.contains(&r.length)
                && args.modes.contains(&r.mode)
                && r.seed >= args.task_seed
                && r.seed < args.task_seed + args.samples as u64
                && r.model == model
                && r.chunk_tokens == profile.chunk_tokens
                && r.memory_tokens == profile.memory_tokens
                && (r.mode == "direct" || r.stream.is_some() == args.stream.is_some())
                && r.split == args.split
        })
        .collect()
}

/// How the evidence modes search a document.
struct Searcher {
    embedder: Option<std::sync::Arc<memagent_recall::Embedder>>,
    k: usize,
    budget: usize,
}

/// A sample's memory loop, shared by the `memory` and `evidence` modes.
struct Loop {
    memory: String,
    answer: String,
    steps: usize,
    seconds: f64,
}

/// Samples of one mode without the store: the memory loop over all of them as one batch
/// (each sample's seconds are its share of the batch's time, by tokens; a loop run for
/// one of `memory` and `evidence` serves the other), then the answer: from the memory
/// (`memory`), from the memory beside the document's passages (`evidence`), from the
/// passages alone (`passages`), or from the whole document in one prompt (`direct`, one
/// by one).
fn run_group(
    agent: &MemoryAgent<'_>,
    group: Vec<(&RulerSample, Record)>,
    searcher: &Searcher,
    loops: &mut BTreeMap<u64, Loop>,
) -> Result<Vec<Record>> {
    let Some(mode) = group.first().map(|(_, r)| r.mode.clone()) else {
        return Ok(Vec::new());
    };
    if mode == "memory" || mode == "evidence" {
        let todo: Vec<&(&RulerSample, Record)> = group
            .iter()
            .filter(|(s, _)| !loops.contains_key(&s.seed))
            .collect();
        if !todo.is_empty() {
            let started = Instant::now();
            let jobs: Vec<(&str, &str)> = todo
                .iter()
                .map(|(s, _)| (s.document.as_str(), s.question.as_str()))
                .collect();
            let runs = agent.run_many(&jobs, &mut |_, _| {})?;
            let seconds = started.elapsed().as_secs_f64();
            let tokens: usize = runs.iter().map(|r| r.input_tokens).sum();
            for ((sample, _), run) in todo.into_iter().zip(runs) {
                let share = seconds * run.input_tokens as f64 / tokens.max(1) as f64;
                loops.insert(
                    sample.seed,
                    Loop {
                        memory: run
                            .steps
                            .last()
                            .map_or(NO_MEMORY.to_string(), |s| s.memory.clone()),
                        // The final answer's own time is in the loop's.
                        seconds: share,
                        steps: run.steps.len(),
                        answer: run.final_answer.answer,
                    },
                );
            }
        }
    }
    if mode == "memory" {
        return Ok(group
            .into_iter()
            .map(|(sample, mut record)| {
                let run = &loops[&sample.seed];
                record.steps = run.steps;
                record.seconds = run.seconds;
                let answer = run.answer.clone();
                scored(sample, record, Some(answer))
            })
            .collect());
    }
    if mode == "evidence" || mode == "passages" {
        let mut out = Vec::with_capacity(group.len());
        for (sample, mut record) in group {
            let started = Instant::now();
            let found = crate::commands::recall::document_evidence(
                searcher.embedder.clone(),
                &sample.document,
                &sample.question,
                searcher.k,
            )?;
            let memory = match mode.as_str() {
                "evidence" => {
                    let run = &loops[&sample.seed];
                    record.steps = run.steps;
                    record.seconds = run.seconds;
                    run.memory.clone()
                }
                _ => NO_MEMORY.to_string(),
            };
            let memory = memagent_store::MemoryVersion {
                text: memory,
                ..memagent_memory::empty_memory()
            };
            let question = [sample.question.clone()];
            let answered = memagent_memory::answer_with_evidence(
                agent,
                &memory,
                &question,
                vec![found],
                searcher.budget,
            )?;
            record.seconds += started.elapsed().as_secs_f64();
            let answer = answered.into_iter().next().map(|a| a.report.answer);
            out.push(scored(sample, record, answer));
        }
        return Ok(out);
    }
    let mut out = Vec::with_capacity(group.len());
    for (sample, mut record) in group {
        let started = Instant::now();
        let answer = match agent.direct(&sample.document, &sample.question) {
            Ok(report) => Some(report.answer),
            Err(memagent_agent::Error::Budget(reason)) => {
                tracing::debug!("direct n/a: {reason}");
                None
            }
            Err(e) => return Err(e.into()),
        };
        record.seconds = started.elapsed().as_secs_f64();
        out.push(scored(sample, record, answer));
    }
    Ok(out)
}

/// The sample's fields of the record, and the answer's score.
fn scored(sample: &RulerSample, mut record: Record, answer: Option<String>) -> Record {
    record.tokens = sample.tokens;
    record.question = sample.question.clone();
    record.expected = sample.expected.clone();
    record.depths = sample.inserts.iter().map(|i| i.depth).collect();
    if let Some(answer) = &answer {
        let s = score(sample.task, answer, &sample.expected);
        record.score = Some(s.score);
        record.f1 = s.f1;
        record.exact = s.exact;
    }
    record.answer = answer;
    record
}

/// Samples read through the store (`--stream`).
struct Stored<'a> {
    store: &'a Store,
    ingestor: Ingestor<'a>,
    model: &'a str,
    prefix: &'a str,
    fresh: bool,
}

impl Stored<'_> {
    /// The sample's stream: one per task, length, seed and profile, shared by its modes.
    fn name(&self, r: &Record) -> String {
        format!(
            "{}/{}/{}/seed{}/C{}-M{}",
            self.prefix, r.task, r.length, r.seed, r.chunk_tokens, r.memory_tokens
        )
    }

    /// Appends the sample's document to its stream (read into the general memory by
    /// [`Self::read`]). A stream left by a stopped run with the same document and model
    /// continues at its cursor; one holding anything else (or `--fresh`) starts over.
    fn prepare(&self, name: &str, sample: &RulerSample) -> Result<()> {
        if let Some(stream) = self.store.stream(name)? {
            let reason = if self.fresh {
                Some("--fresh")
            } else if self.store.read_log(&stream, 0, stream.log_len)? != sample.document.as_bytes()
            {
                Some("it holds another document")
            } else if self.other_model(&stream)? {
                Some("another model wrote its memory")
            } else {
                None
            };
            if let Some(reason) = reason {
                eprintln!("stream `{name}` starts over ({reason})");
                self.store.remove_stream(name)?;
            }
        }
        let stream = match self.store.stream(name)? {
            Some(stream) => stream,
            None => {
                self.store.append(name, sample.document.as_bytes(), None)?;
                self.store.require(name)?
            }
        };
        let cursor = self.store.cursor(&stream, GENERAL)?;
        if cursor.next_chunk > 0 && cursor.offset < stream.log_len {
            eprintln!(
                "stream `{name}` resumes at chunk {} ({} of {} bytes read)",
                cursor.next_chunk, cursor.offset, stream.log_len
            );
        }
        Ok(())
    }

    /// Reads the streams' pending chunks into their general memories, a step of each
    /// stream at a time decoded as one batch, each step committed.
    fn read(&self, names: &[&str]) -> Result<()> {
        let mut active = names.to_vec();
        while !active.is_empty() {
            let outcomes = self.ingestor.step_many(&active);
            let mut still = Vec::with_capacity(active.len());
            for (name, outcome) in active.into_iter().zip(outcomes) {
                if let Some(step) = outcome? {
                    tracing::info!("{name} general: {step}");
                    still.push(name);
                }
            }
            active = still;
        }
        Ok(())
    }

    fn other_model(&self, stream: &StreamRecord) -> Result<bool> {
        let mut chains = vec![GENERAL];
        chains.extend(self.store.questions(stream)?.iter().map(|q| q.chain));
        for chain in chains {
            if self
                .store
                .versions(stream, chain)?
                .iter()
                .any(|v| v.model != self.model)
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Samples of one mode through their streams, read side by side: each document into
    /// its general memory (unless this run did already), then `memory`: the question
    /// chains over the streams' chunks (continuing where a stopped run left them),
    /// answered with the MemAgent template; `general`: the general memories' latest
    /// versions, answered as `memctl query` answers.
    fn run(
        &self,
        agent: &MemoryAgent<'_>,
        group: Vec<(&RulerSample, Record)>,
        ingested: &mut HashSet<String>,
    ) -> Result<Vec<Record>> {
        let names: Vec<String> = group
            .iter()
            .map(|(_, r)| r.stream.clone().expect("a stored record names its stream"))
            .collect();
        let mut unread = Vec::new();
        for ((sample, _), name) in group.iter().zip(&names) {
            if ingested.insert(name.clone()) {
                self.prepare(name, sample)?;
                unread.push(name.as_str());
            }
        }
        self.read(&unread)?;
        let memory_mode = group[0].1.mode == "memory";
        let (chains, reports) = if memory_mode {
            let queries: Vec<(&str, &str)> = group
                .iter()
                .zip(&names)
                .map(|((sample, _), name)| (name.as_str(), sample.question.as_str()))
                .collect();
            let deep = self.ingestor.deep_many(&queries, &mut |i, step, _| {
                tracing::info!("{} question: {step}", queries[i].0);
            })?;
            deep.into_iter().map(|d| (d.chain, d.answer)).unzip()
        } else {
            let mut latest = Vec::with_capacity(names.len());
            for name in &names {
                let stream = self.store.require(name)?;
                let memory = self
                    .store
                    .latest(&stream, GENERAL)?
                    .ok_or_else(|| anyhow!("stream `{name}` has no general memory"))?;
                latest.push(memory.text);
            }
            let items: Vec<(&str, &str)> = group
                .iter()
                .zip(&latest)
                .map(|((sample, _), memory)| (sample.question.as_str(), memory.as_str()))
                .collect();
            let reports = agent.answer_many(Some(GENERAL_ANSWER), &items)?;
            (vec![GENERAL; names.len()], reports)
        };
        let mut out = Vec::with_capacity(group.len());
        for (((sample, mut record), name), (chain, report)) in group
            .into_iter()
            .zip(&names)
            .zip(chains.into_iter().zip(reports))
        {
            let versions = self.store.versions(&self.store.require(name)?, chain)?;
            record.steps = versions.len();
            record.seconds = versions.iter().map(|v| v.seconds).sum::<f64>() + report.seconds;
            out.push(scored(sample, record, Some(report.answer)));
        }
        Ok(out)
    }
}

pub(super) fn mean(values: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = values.fold((0.0, 0usize), |(s, n), v| (s + v, n + 1));
    (n > 0).then(|| sum / n as f64)
}

/// Least squares y = a + b·x with its R².
fn linear_fit(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    if points.len() < 2 {
        return None;
    }
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx == 0.0 {
        return None;
    }
    let b = sxy / sxx;
    let a = my - b * mx;
    let ss_tot: f64 = points.iter().map(|p| (p.1 - my).powi(2)).sum();
    let ss_res: f64 = points.iter().map(|p| (p.1 - a - b * p.0).powi(2)).sum();
    let r2 = if ss_tot == 0.0 {
        1.0
    } else {
        1.0 - ss_res / ss_tot
    };
    Some((a, b, r2))
}

fn write_report(
    out: &Path,
    records: &[Record],
    model: &str,
    profile: &memagent_agent::Profile,
    haystack: &str,
) -> Result<()> {
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(&serde_json::json!({
            "model": model,
            "profile": profile,
            "haystack": haystack,
            "machine": memagent_engine::bench::machine(),
            "results": records,
        }))?,
    )?;
    let lengths: BTreeSet<usize> = records.iter().map(|r| r.length).collect();
    let tasks: BTreeSet<Task> = records.iter().map(|r| r.task).collect();
    let modes: BTreeSet<&str> = records.iter().map(|r| r.mode.as_str()).collect();
    let cell = |rs: Vec<&Record>| -> String {
        let scored: Vec<f64> = rs.iter().filter_map(|r| r.score).collect();
        match mean(scored.iter().copied()) {
            Some(m) => format!("{:.0}% ({})", m * 100.0, scored.len()),
            None if rs.is_empty() => "-".into(),
            None => "n/a".into(),
        }
    };
    let mut md = String::new();
    md.push_str(&format!(
        "# RULER-style evaluation\n\nmodel: {model}; profile C={} M={} answer={}; haystack: {haystack}\n\nmachine: {}\n\n\
         Scores: needles, variable tracking and word extraction by the recall of every \
         expected value; QA by sub_em. \"n/a\": the mode cannot run at that length (direct \
         past the model's context).\n\n",
        profile.chunk_tokens,
        profile.memory_tokens,
        profile.answer_tokens,
        memagent_engine::bench::machine()
    ));
    let header: String = lengths.iter().map(|l| format!(" {l} |")).collect();
    let rule: String = lengths.iter().map(|_| "---:|").collect();
    md.push_str(&format!("| task | mode |{header}\n|---|---|{rule}\n"));
    for task in &tasks {
        for mode in &modes {
            let row: String = lengths
                .iter()
                .map(|l| {
                    let rs = records
                        .iter()
                        .filter(|r| r.task == *task && r.mode == *mode && r.length == *l)
                        .collect();
                    format!(" {} |", cell(rs))
                })
                .collect();
            md.push_str(&format!("| {task} | {mode} |{row}\n"));
        }
    }
    for mode in &modes {
        let row: String = lengths
            .iter()
            .map(|l| {
                let rs: Vec<&Record> = records
                    .iter()
                    .filter(|r| r.mode == *mode && r.length == *l && r.score.is_some())
                    .collect();
                match mean(
                    rs.iter()
                        .map(|r| r.seconds / (r.tokens.max(1) as f64 / 1000.0)),
                ) {
                    Some(s) => format!(" {s:.2} |"),
                    None => " n/a |".into(),
                }
            })
            .collect();
        md.push_str(&format!("| s / 1K tokens | {mode} |{row}\n"));
    }
    let mut fits = Vec::new();
    for mode in &modes {
        let points: Vec<(f64, f64)> = records
            .iter()
            .filter(|r| r.mode == *mode && r.score.is_some())
            .map(|r| (r.tokens as f64, r.seconds))
            .collect();
        if let Some((a, b, r2)) = linear_fit(&points) {
            md.push_str(&format!(
                "\n{mode}: seconds = {a:.2} + {:.3} × (1K tokens), R² = {r2:.4} over {} samples",
                b * 1000.0,
                points.len()
            ));
            fits.push((mode.to_string(), points, (a, b, r2)));
        }
    }
    md.push_str("\n\nPlots: accuracy.svg (accuracy against length), seconds.svg (seconds against length, with the linear fit).\n");
    std::fs::write(out.join("report.md"), md)?;
    plot_accuracy(&out.join("accuracy.svg"), records, &lengths, &tasks, &modes)?;
    plot_seconds(&out.join("seconds.svg"), &fits)?;
    Ok(())
}

fn plot_accuracy(
    path: &Path,
    records: &[Record],
    lengths: &BTreeSet<usize>,
    tasks: &BTreeSet<Task>,
    modes: &BTreeSet<&str>,
) -> Result<()> {
    use plotters::prelude::*;
    let fail = |e: &dyn std::fmt::Display| anyhow!("cannot draw {}: {e}", path.display());
    let (lo, hi) = (
        *lengths.first().unwrap_or(&1) as f64,
        *lengths.last().unwrap_or(&2) as f64,
    );
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Accuracy against document length", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d((lo * 0.8..hi * 1.25).log_scale(), 0f64..105f64)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("document length (tokens)")
        .y_desc("accuracy (%)")
        .x_label_formatter(&|x| format!("{}K", (*x / 1024.0).round()))
        .draw()
        .map_err(|e| fail(&e))?;
    let mut series: BTreeMap<(String, String), Vec<(f64, f64)>> = BTreeMap::new();
    for task in tasks {
        for mode in modes {
            for &l in lengths {
                let scores = records
                    .iter()
                    .filter(|r| r.task == *task && r.mode == *mode && r.length == l)
                    .filter_map(|r| r.score);
                if let Some(m) = mean(scores) {
                    series
                        .entry((task.to_string(), mode.to_string()))
                        .or_default()
                        .push((l as f64, m * 100.0));
                }
            }
        }
    }
    for (i, ((task, mode), points)) in series.into_iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        let style = if mode == "memory" {
            color.stroke_width(3)
        } else {
            color.stroke_width(1)
        };
        chart
            .draw_series(LineSeries::new(points.clone(), style))
            .map_err(|e| fail(&e))?
            .label(format!("{task} ({mode})"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart
            .draw_series(
                points
                    .into_iter()
                    .map(|p| Circle::new(p, 4, color.filled())),
            )
            .map_err(|e| fail(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

type Fit = (String, Vec<(f64, f64)>, (f64, f64, f64));

fn plot_seconds(path: &Path, fits: &[Fit]) -> Result<()> {
    use plotters::prelude::*;
    let fail = |e: &dyn std::fmt::Display| anyhow!("cannot draw {}: {e}", path.display());
    let max_x = fits
        .iter()
        .flat_map(|f| f.1.iter().map(|p| p.0))
        .fold(1.0, f64::max);
    let max_y = fits
        .iter()
        .flat_map(|f| f.1.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("Seconds against document length", ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..max_x * 1.05, 0f64..max_y * 1.1)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("document length (tokens)")
        .y_desc("seconds per sample")
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, (mode, points, (a, b, r2))) in fits.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(points.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(|e| fail(&e))?;
        let x1 = points.iter().map(|p| p.0).fold(0.0, f64::max);
        chart
            .draw_series(LineSeries::new(
                [(0.0, *a), (x1, a + b * x1)],
                color.stroke_width(2),
            ))
            .map_err(|e| fail(&e))?
            .label(format!(
                "{mode}: {a:.1} s + {:.2} s per 1K tokens (R² = {r2:.3})",
                b * 1000.0
            ))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::linear_fit;

    #[test]
    fn linear_fit_of_a_line_and_of_noise() {
        let (a, b, r2) = linear_fit(&[(0.0, 1.0), (1.0, 3.0), (2.0, 5.0)]).unwrap();
        assert!((a - 1.0).abs() < 1e-9 && (b - 2.0).abs() < 1e-9 && (r2 - 1.0).abs() < 1e-9);
        let (_, _, r2) = linear_fit(&[(0.0, 1.0), (1.0, 0.0), (2.0, 1.0), (3.0, 0.0)]).unwrap();
        assert!(r2 < 0.3, "{r2}");
        assert!(linear_fit(&[(1.0, 1.0)]).is_none());
    }
}
