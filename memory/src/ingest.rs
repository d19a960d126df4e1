//! Feeding a stream's pending content through the memory loop, one committed step at a
//! time (the store's commit 2), deep queries' own chains, and answers from the memory.

use std::time::Instant;

use memagent_agent::{
    AnswerReport, Chunk, MemoryAgent, Template, Writer, GENERAL_LINES, NO_MEMORY, UPDATE,
};
use memagent_recall::Embedder;
use sha2::{Digest, Sha256};

use memagent_store::{
    Author, ChunkRecord, Cursor, Error as StoreError, Lease, MemoryVersion, Store, StreamRecord,
    GENERAL,
};

use crate::{now, Error, Result};

pub use memagent_agent::{GENERAL_ANSWER, GENERAL_UPDATE};

/// Tokens decoded past the chunk's end before a window that stops short of the log's end
/// is trusted.
const WINDOW_MARGIN_TOKENS: usize = 16;

/// A stream's next chunk, read from the log and cut, for a memory step.
pub struct Pending {
    pub stream: StreamRecord,
    /// The general memory's cursor the chunk was read at.
    pub cursor: Cursor,
    pub chunk: ChunkRecord,
    pub text: String,
}

/// One committed step.
#[derive(Debug, Clone)]
pub struct StepOutcome {
    pub chunk: ChunkRecord,
    pub version: MemoryVersion,
}

impl std::fmt::Display for StepOutcome {
    /// `chunk 3 (1024 tokens) -> memory v4 (212 tokens) in 5.1s`, as logs say it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "chunk {} ({} tokens) -> memory v{} ({} tokens{}) in {:.1}s",
            self.chunk.index,
            self.chunk.tokens,
            self.version.version,
            self.version.tokens,
            if self.version.cut { ", cut" } else { "" },
            self.version.seconds
        )
    }
}

/// Drives the general memory of streams with one agent.
pub struct Ingestor<'a> {
    store: &'a Store,
    agent: &'a MemoryAgent<'a>,
    model: String,
    model_sha256: String,
    writer: Writer,
    embedder: Option<&'a Embedder>,
}

impl<'a> Ingestor<'a> {
    pub fn new(
        store: &'a Store,
        agent: &'a MemoryAgent<'a>,
        model: impl Into<String>,
        model_sha256: impl Into<String>,
    ) -> Self {
        Self {
            store,
            agent,
            model: model.into(),
            model_sha256: model_sha256.into(),
            writer: Writer::default(),
            embedder: None,
        }
    }

    /// The agent whose model reads and answers.
    pub fn agent(&self) -> &'a MemoryAgent<'a> {
        self.agent
    }

    /// Writes the general memory with `writer`; the line writer compares lines with
    /// `embedder`'s sentence vectors when given (words alone otherwise).
    pub fn with_writer(mut self, writer: Writer, embedder: Option<&'a Embedder>) -> Self {
        self.writer = writer;
        self.embedder = embedder;
        self
    }

    /// The next chunk after `cursor`: up to C tokens of the log, cut where the decoded
    /// tokens end, so chunks are exact byte ranges of the log. `None` when nothing is
    /// pending.
    pub fn next_chunk(
        &self,
        stream: &StreamRecord,
        cursor: &Cursor,
    ) -> Result<Option<(ChunkRecord, String)>> {
        let c = self.agent.profile.chunk_tokens;
        let tokenizer = self.agent.tokenizer();
        let mut window = (c as u64).saturating_mul(16).max(4096);
        loop {
            let end = cursor.offset.saturating_add(window).min(stream.log_len);
            if end <= cursor.offset {
                return Ok(None);
            }
            let bytes = self.store.read_log(stream, cursor.offset, end)?;
            let text = match std::str::from_utf8(&bytes) {
                Ok(t) => t,
                // A window may end inside a character; the log itself is UTF-8.
                Err(e) if e.error_len().is_none() => {
                    std::str::from_utf8(&bytes[..e.valid_up_to()]).expect("valid prefix")
                }
                Err(e) => {
                    return Err(StoreError::Corrupt {
                        tree: "log",
                        key: format!("{}/{}", stream.id, cursor.offset + e.valid_up_to() as u64),
                        reason: "content log is not UTF-8".to_string(),
                    }
                    .into())
                }
            };
            let ids = tokenizer.encode(text).map_err(Error::from)?;
            let whole = end == stream.log_len;
            // A window may end inside a word, which changes its last tokens: keep a margin
            // of whole tokens beyond the chunk unless the window reaches the log's end.
            if ids.len() <= c + WINDOW_MARGIN_TOKENS && !whole {
                window *= 2;
                continue;
            }
            // Tokens that decode to an exact prefix of the text (a cut inside a
            // multi-byte character does not).
            let mut take = ids.len().min(c);
            let piece = loop {
                let piece = tokenizer.decode(&ids[..take]).map_err(Error::from)?;
                if text.starts_with(&piece) && (take == ids.len() || !piece.is_empty()) {
                    break piece;
                }
                take -= 1;
                if take == 0 {
                    return Err(StoreError::Corrupt {
                        tree: "log",
                        key: format!("{}/{}", stream.id, cursor.offset),
                        reason: "no token boundary found in the pending text".to_string(),
                    }
                    .into());
                }
            };
            let piece = if take == ids.len() && whole {
                text.to_string()
            } else {
                piece
            };
            let record = ChunkRecord {
                index: cursor.next_chunk,
                start: cursor.offset,
                end: cursor.offset + piece.len() as u64,
                tokens: take as u32,
                sha256: Sha256::digest(piece.as_bytes()).into(),
            };
            return Ok(Some((record, piece)));
        }
    }

    /// Reads the next pending chunk into the general memory and commits the step.
    pub fn step(&self, stream: &str) -> Result<Option<StepOutcome>> {
        self.step_many(&[stream])
            .pop()
            .expect("one outcome per stream")
    }

    /// Reads the next pending chunk of each of several streams into its general memory,
    /// the model steps decoded as one batch, and commits each step on its own: one
    /// outcome per stream, in order. A stream whose step cannot be prepared or committed
    /// gets its error; the others go on.
    pub fn step_many(&self, streams: &[&str]) -> Vec<Result<Option<StepOutcome>>> {
        let unleased: Vec<(&str, Option<&Lease>)> = streams.iter().map(|s| (*s, None)).collect();
        self.step_many_leased(&unleased)
    }

    /// The next chunk of `name`'s general memory, read and cut: `None` when nothing is
    /// pending (or no stream has that name).
    pub fn pending(&self, name: &str) -> Result<Option<Pending>> {
        match self.store.stream(name)? {
            Some(stream) => self.pending_of(stream),
            None => Ok(None),
        }
    }

    /// [`Ingestor::pending`] of a stream already read.
    fn pending_of(&self, stream: StreamRecord) -> Result<Option<Pending>> {
        let cursor = self.store.cursor(&stream, GENERAL)?;
        Ok(self
            .next_chunk(&stream, &cursor)?
            .map(|(chunk, text)| Pending {
                stream,
                cursor,
                chunk,
                text,
            }))
    }

    /// [`Ingestor::step_many`] for a daemon that shares its database: each stream's step
    /// is committed under its lease ([`memagent_store::Store::commit_step_under`]), and
    /// refused when the lease was lost meanwhile.
    pub fn step_many_leased(
        &self,
        streams: &[(&str, Option<&Lease>)],
    ) -> Vec<Result<Option<StepOutcome>>> {
        let pending = streams
            .iter()
            .map(|(name, lease)| {
                let read = self
                    .store
                    .require(name)
                    .map_err(Error::from)
                    .and_then(|stream| self.pending_of(stream));
                (read, *lease)
            })
            .collect();
        self.step_pending(pending)
    }

    /// Memory steps of chunks already read ([`Ingestor::pending`]), each committed under
    /// its lease where it has one: one outcome per entry, in order (a chunk read in error
    /// keeps its error; none pending, `None`).
    pub fn step_pending(
        &self,
        streams: Vec<(Result<Option<Pending>>, Option<&Lease>)>,
    ) -> Vec<Result<Option<StepOutcome>>> {
        struct Ready {
            stream: StreamRecord,
            cursor: Cursor,
            chunk: ChunkRecord,
            text: String,
            previous: String,
        }
        let prepare = |pending: Pending| -> Result<Ready> {
            let Pending {
                stream,
                cursor,
                chunk,
                text,
            } = pending;
            let previous = match cursor.version {
                0 => NO_MEMORY.to_string(),
                n => {
                    self.store
                        .version(&stream, GENERAL, n)?
                        .ok_or(StoreError::NoVersion {
                            stream: stream.name.clone(),
                            version: n,
                        })?
                        .text
                }
            };
            // Refused before the model reads, when its commit would be.
            self.store.make_room((text.len() + previous.len()) as u64)?;
            Ok(Ready {
                stream,
                cursor,
                chunk,
                text,
                previous,
            })
        };
        let leases: Vec<Option<&Lease>> = streams.iter().map(|(_, lease)| *lease).collect();
        let mut outcomes: Vec<Result<Option<StepOutcome>>> = Vec::with_capacity(streams.len());
        let mut ready = Vec::new();
        for (i, (read, _)) in streams.into_iter().enumerate() {
            match read.and_then(|pending| pending.map(prepare).transpose()) {
                Ok(Some(step)) => {
                    ready.push((i, step));
                    outcomes.push(Ok(None));
                }
                other => outcomes.push(other.map(|_| None)),
            }
        }
        if ready.is_empty() {
            return outcomes;
        }
        let started = Instant::now();
        let chunks: Vec<Chunk> = ready
            .iter()
            .map(|(_, r)| Chunk {
                text: r.text.clone(),
                tokens: r.chunk.tokens as usize,
            })
            .collect();
        let inputs: Vec<(&str, &str, &Chunk)> = ready
            .iter()
            .zip(&chunks)
            .map(|((_, r), chunk)| ("", r.previous.as_str(), chunk))
            .collect();
        let embed = |texts: &[&str]| -> memagent_agent::Result<Vec<Vec<f32>>> {
            let embedder = self.embedder.expect("called only with an embedder");
            embedder
                .embed(texts)
                .map_err(|e| memagent_agent::Error::InvalidRequest(format!("embedder: {e}")))
        };
        let (template, result) = match self.writer {
            Writer::Rewrite => (
                GENERAL_UPDATE,
                self.agent.update_many(GENERAL_UPDATE, &inputs),
            ),
            Writer::Lines => {
                let steps: Vec<(&str, &Chunk)> = inputs.iter().map(|(_, m, c)| (*m, *c)).collect();
                let embed = self
                    .embedder
                    .map(|_| &embed as memagent_agent::lines::Embed<'_>);
                (GENERAL_LINES, self.agent.update_lines_many(&steps, embed))
            }
        };
        let reports = match result {
            Ok(reports) => reports,
            Err(e) => {
                let message = e.to_string();
                for (i, _) in &ready {
                    outcomes[*i] = Err(Error::Model(message.clone()));
                }
                return outcomes;
            }
        };
        for ((i, r), report) in ready.iter().zip(reports) {
            // Alone, the step's whole time; in a batch, its own prefill and decoding.
            let seconds = if ready.len() == 1 {
                started.elapsed().as_secs_f64()
            } else {
                report.seconds
            };
            if let Some(repaired) = &report.repaired {
                tracing::info!("{} chunk {}: {repaired}", r.stream.name, r.chunk.index);
            }
            let version = self.model_version(&r.cursor, &r.chunk, &report, template, seconds);
            let next = Cursor {
                next_chunk: r.chunk.index + 1,
                offset: r.chunk.end,
                version: version.version,
            };
            let committed = match leases[*i] {
                Some(lease) => self
                    .store
                    .commit_step_under(lease, &r.stream, GENERAL, &r.chunk, &version, &next),
                None => self
                    .store
                    .commit_step(&r.stream, GENERAL, &r.chunk, &version, &next),
            };
            outcomes[*i] = committed
                .map(|()| {
                    Some(StepOutcome {
                        chunk: r.chunk.clone(),
                        version,
                    })
                })
                .map_err(Error::from);
        }
        outcomes
    }
}

impl Ingestor<'_> {
    /// A deep query: replays the stream's stored chunks with `question` through the exact
    /// MemAgent update, continuing the question's own chain (so only chunks that arrived
    /// since the last time are read), then answers from its memory with the MemAgent final
    /// template.
    pub fn deep(
        &self,
        stream: &str,
        question: &str,
        on_step: &mut dyn FnMut(&StepOutcome, usize),
    ) -> Result<DeepAnswer> {
        let mut answers = self.deep_many(&[(stream, question)], &mut |_, step, total| {
            on_step(step, total)
        })?;
        Ok(answers.pop().expect("one answer per query"))
    }

    /// Deep queries of several `(stream, question)` pairs at once (several questions of
    /// one stream, or samples in several streams): each round reads the next chunk of
    /// every chain that has one, decoded as one batch, and commits each step on its own;
    /// then the answers are decoded as one batch. Each chain ends exactly as it would
    /// alone. `on_step` sees the pair's index (a pair asked twice is read once, under its
    /// first index), the step, and the chain's chunk count. One answer per pair, in order.
    pub fn deep_many(
        &self,
        queries: &[(&str, &str)],
        on_step: &mut dyn FnMut(usize, &StepOutcome, usize),
    ) -> Result<Vec<DeepAnswer>> {
        struct Chain {
            first: usize,
            question: String,
            stream: StreamRecord,
            chain: u64,
            chunks: Vec<ChunkRecord>,
            cursor: Cursor,
            memory: String,
            steps: usize,
        }
        let mut chains: Vec<Chain> = Vec::new();
        let mut slots = Vec::with_capacity(queries.len());
        for (i, &(name, question)) in queries.iter().enumerate() {
            if let Some(k) = chains
                .iter()
                .position(|c| c.stream.name == name && c.question == question)
            {
                slots.push(k);
                continue;
            }
            let stream = self.store.require(name)?;
            let record = self.store.question_chain(&stream, question)?;
            let memory = match self.store.latest(&stream, record.chain)? {
                Some(v) => v.text,
                None => NO_MEMORY.to_string(),
            };
            slots.push(chains.len());
            chains.push(Chain {
                first: i,
                question: question.to_string(),
                chunks: self.store.chunks(&stream)?,
                cursor: self.store.cursor(&stream, record.chain)?,
                chain: record.chain,
                stream,
                memory,
                steps: 0,
            });
        }
        loop {
            let mut ready = Vec::new();
            for (k, c) in chains.iter().enumerate() {
                let Some(chunk) = c.chunks.get(c.cursor.next_chunk as usize) else {
                    continue;
                };
                let bytes = self.store.read_log(&c.stream, chunk.start, chunk.end)?;
                let text = String::from_utf8(bytes).map_err(|e| StoreError::Corrupt {
                    tree: "log",
                    key: format!("{}/{}", c.stream.id, chunk.start),
                    reason: format!("chunk {} is not UTF-8: {e}", chunk.index),
                })?;
                let input = Chunk {
                    text,
                    tokens: chunk.tokens as usize,
                };
                ready.push((k, chunk.clone(), input));
            }
            if ready.is_empty() {
                break;
            }
            let started = Instant::now();
            let inputs: Vec<(&str, &str, &Chunk)> = ready
                .iter()
                .map(|(k, _, input)| {
                    let c = &chains[*k];
                    (c.question.as_str(), c.memory.as_str(), input)
                })
                .collect();
            let reports = self
                .agent
                .update_many(UPDATE, &inputs)
                .map_err(Error::from)?;
            let alone = ready.len() == 1;
            for ((k, chunk, _), report) in ready.into_iter().zip(reports) {
                // Alone, the step's whole time; in a batch, its own prefill and decoding.
                let seconds = if alone {
                    started.elapsed().as_secs_f64()
                } else {
                    report.seconds
                };
                let c = &mut chains[k];
                let version = self.model_version(&c.cursor, &chunk, &report, UPDATE, seconds);
                let cursor = Cursor {
                    next_chunk: chunk.index + 1,
                    offset: chunk.end,
                    version: version.version,
                };
                self.store
                    .commit_step(&c.stream, c.chain, &chunk, &version, &cursor)?;
                c.cursor = cursor;
                c.memory.clone_from(&version.text);
                c.steps += 1;
                on_step(c.first, &StepOutcome { chunk, version }, c.chunks.len());
            }
        }
        let items: Vec<(&str, &str)> = chains
            .iter()
            .map(|c| (c.question.as_str(), c.memory.as_str()))
            .collect();
        let answers = self.agent.answer_many(None, &items).map_err(Error::from)?;
        let answers: Vec<DeepAnswer> = chains
            .iter()
            .zip(answers)
            .map(|(c, answer)| DeepAnswer {
                chain: c.chain,
                version: c.cursor.version,
                steps: c.steps,
                answer,
            })
            .collect();
        Ok(slots.into_iter().map(|k| answers[k].clone()).collect())
    }

    fn model_version(
        &self,
        cursor: &Cursor,
        chunk: &ChunkRecord,
        report: &memagent_agent::StepReport,
        template: Template,
        seconds: f64,
    ) -> MemoryVersion {
        MemoryVersion {
            version: cursor.version + 1,
            parent: (cursor.version > 0).then_some(cursor.version),
            text: report.memory.clone(),
            tokens: report.memory_tokens as u32,
            chunk: Some(chunk.index),
            model: self.model.clone(),
            model_sha256: self.model_sha256.clone(),
            template_id: template.id.to_string(),
            template_version: template.version,
            created: now(),
            prompt_tokens: report.prompt_tokens as u32,
            completion_tokens: report.completion_tokens as u32,
            seconds,
            cut: report.cut,
            author: Author::Model,
        }
    }
}

/// The result of a deep query.
#[derive(Debug, Clone)]
pub struct DeepAnswer {
    /// The question's memory chain.
    pub chain: u64,
    /// Its latest memory version.
    pub version: u64,
    /// Chunks read this time.
    pub steps: usize,
    pub answer: AnswerReport,
}

/// Answers several questions from one stored memory, decoded as one batch.
pub fn general_answers(
    agent: &MemoryAgent<'_>,
    memory: &MemoryVersion,
    questions: &[&str],
) -> Result<Vec<AnswerReport>> {
    let items: Vec<(&str, &str)> = questions
        .iter()
        .map(|q| (*q, memory.text.as_str()))
        .collect();
    agent
        .answer_many(Some(GENERAL_ANSWER), &items)
        .map_err(Error::from)
}
