//! The one place a question is answered. A [`Query`] names a stream, its questions and a
//! [`Mode`]; [`Query::plan`] reads what the answers need from the store and the index
//! (no model), and [`Query::answer`] runs the model over that plan. The CLI does both in
//! one process; the daemon plans on a blocking thread and answers on the model's thread.

use memagent_agent::{extract_answer, AnswerReport, Template};
use memagent_recall::Recall;
use memagent_store::{Author, MemoryVersion, Store, StreamRecord, GENERAL};
use serde::{Deserialize, Serialize};

use crate::answer::answer_with_evidence;
use crate::ingest::{general_answers, DeepAnswer, Ingestor, StepOutcome};
use crate::search::{rerank, search, Evidence, EVIDENCE_TOKENS};
use crate::{Error, Result};

/// Passages searched per question when a query names no `k`.
pub const PASSAGES_K: usize = 8;

/// Passages searched for `question` when `k` are asked for: a question asking when
/// searches [`WHEN_SCALE`](crate::answer::WHEN_SCALE) times as many (code reads its
/// date from all of them); one asking for every value
/// [`LIST_SCALE`](crate::answer::LIST_SCALE) times as many, as it reads that many times
/// the tokens of passages.
pub fn passages_searched(question: &str, k: usize) -> usize {
    if crate::answer::asks_when(question) {
        k * crate::answer::WHEN_SCALE
    } else if crate::answer::asks_for_all(question) {
        k * crate::answer::LIST_SCALE
    } else {
        k
    }
}

/// How a question is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// From the memory beside the passages found for the question: the best that fit
    /// in `tokens` of the `k` searched go in its prompt, and the answer cites them.
    Evidence { k: usize, tokens: usize },
    /// From the memory alone (the MemAgent protocol's answer).
    MemoryOnly,
    /// By reading the stored chunks again with the question (its own memory chain, the
    /// exact MemAgent protocol), then answering from that memory.
    Deep,
}

impl Default for Mode {
    fn default() -> Self {
        Self::Evidence {
            k: PASSAGES_K,
            tokens: EVIDENCE_TOKENS,
        }
    }
}

impl Mode {
    /// The mode users' flags ask for: `deep` over `memory_only` over evidence.
    pub fn from_flags(deep: bool, memory_only: bool, k: usize, tokens: usize) -> Self {
        match (deep, memory_only) {
            (true, _) => Self::Deep,
            (false, true) => Self::MemoryOnly,
            (false, false) => Self::Evidence { k, tokens },
        }
    }

    /// Whether answers read the passage index.
    pub fn searches(&self) -> bool {
        matches!(self, Self::Evidence { .. })
    }
}

/// Questions to one stream.
#[derive(Debug, Clone)]
pub struct Query {
    pub stream: String,
    pub questions: Vec<String>,
    /// A memory version instead of the latest (not with [`Mode::Deep`]).
    pub at: Option<u64>,
    pub mode: Mode,
    /// With [`Mode::Evidence`]: the best this many passages found for each question
    /// are ranked again by the model's likelihood of the question ([`rerank`]) before
    /// the answer reads them; 0 keeps the search's order.
    pub rerank: usize,
}

/// What the answers need, read before the model runs.
#[derive(Debug)]
pub enum Plan {
    Evidence {
        memory: Box<MemoryVersion>,
        /// The passages found for each question, best first.
        found: Vec<Vec<Evidence>>,
        tokens: usize,
    },
    MemoryOnly {
        memory: Box<MemoryVersion>,
    },
    Deep,
}

/// A template's identity, as an answer records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateId {
    pub id: String,
    pub version: u32,
}

impl From<Template> for TemplateId {
    fn from(t: Template) -> Self {
        Self {
            id: t.id.to_string(),
            version: t.version,
        }
    }
}

/// How a deep query read the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeepRead {
    /// The question's memory chain.
    pub chain: u64,
    /// Chunks read this time.
    pub chunks_read: usize,
}

/// An answer, as `memctl query --json` and the daemon's `/v1/query` give it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Answer {
    pub stream: String,
    pub question: String,
    /// The memory version answered from (0: the stream's memory has read nothing yet).
    pub version: u64,
    /// The model's reply.
    pub answer: String,
    /// The answer drawn from the reply (a deep query's boxed form; else the reply).
    pub extracted: String,
    pub template: TemplateId,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_tokens: Option<usize>,
    pub seconds: f64,
    /// The passages its prompt held, oldest first, each with what it alone answered
    /// and whether the answer cites it (evidence answers only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passages: Option<Vec<Evidence>>,
    /// Prompts the model answered for it (evidence answers; 0 when answered without
    /// the model).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_calls: Option<usize>,
    /// Deep answers only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub deep: bool,
    #[serde(default, skip_serializing_if = "Option::is_none", flatten)]
    pub read: Option<DeepRead>,
}

impl Answer {
    /// An answer from memory version `version`.
    pub fn from_memory(stream: &str, version: u64, question: &str, report: &AnswerReport) -> Self {
        Self {
            stream: stream.to_string(),
            question: question.to_string(),
            version,
            answer: report.reply.clone(),
            extracted: extract_answer(&report.reply),
            template: report.template.into(),
            prompt_tokens: Some(report.prompt_tokens),
            completion_tokens: Some(report.completion_tokens),
            seconds: report.seconds,
            passages: None,
            model_calls: Some(1),
            deep: false,
            read: None,
        }
    }

    /// A deep query's answer.
    pub fn from_deep(stream: &str, question: &str, deep: &DeepAnswer) -> Self {
        Self {
            stream: stream.to_string(),
            question: question.to_string(),
            version: deep.version,
            answer: deep.answer.reply.clone(),
            extracted: deep.answer.answer.clone(),
            template: deep.answer.template.into(),
            prompt_tokens: None,
            completion_tokens: None,
            seconds: deep.answer.seconds,
            passages: None,
            model_calls: None,
            deep: true,
            read: Some(DeepRead {
                chain: deep.chain,
                chunks_read: deep.steps,
            }),
        }
    }

    /// The text a person reads: a deep query's extracted answer, else the reply.
    pub fn text(&self) -> &str {
        match self.deep {
            true => &self.extracted,
            false => &self.answer,
        }
    }
}

impl Query {
    /// Reads what answering needs: the memory version (an empty one, version 0, for a
    /// stream the memory has not read yet when the passages can answer) and the passages
    /// found for each question. `recall` is needed by [`Mode::Evidence`] only.
    pub fn plan(&self, store: &Store, recall: Option<&Recall>) -> Result<Plan> {
        let record = store.require(&self.stream)?;
        match self.mode {
            Mode::Deep => Ok(Plan::Deep),
            Mode::MemoryOnly => Ok(Plan::MemoryOnly {
                memory: Box::new(version_of(store, &record, self.at)?),
            }),
            Mode::Evidence { k, tokens } => {
                let memory = match (self.at, store.latest(&record, GENERAL)?) {
                    (None, None) => empty_memory(),
                    (None, Some(latest)) => latest,
                    (Some(_), _) => version_of(store, &record, self.at)?,
                };
                let recall = recall.ok_or_else(|| {
                    Error::InvalidRequest("answers from passages need the passage index".into())
                })?;
                let found = self
                    .questions
                    .iter()
                    .map(|q| {
                        let k = passages_searched(q, k).max(self.rerank);
                        search(store, recall, Some(&[self.stream.as_str()]), q, k)
                    })
                    .collect::<Result<Vec<_>>>()?;
                Ok(Plan::Evidence {
                    memory: Box::new(memory),
                    found,
                    tokens,
                })
            }
        }
    }

    /// Answers every question of the plan with `ingestor`'s model, decoded as one
    /// batch; a deep query commits its chains' steps through `ingestor` and
    /// `on_deep_step` sees each (question index, step, chunks in all). One answer per
    /// question, in order.
    pub fn answer(
        &self,
        plan: Plan,
        ingestor: &Ingestor<'_>,
        on_deep_step: &mut dyn FnMut(usize, &StepOutcome, usize),
    ) -> Result<Vec<Answer>> {
        let stream = self.stream.as_str();
        let agent = ingestor.agent();
        match plan {
            Plan::Evidence {
                memory,
                found,
                tokens,
            } => {
                let found = match (self.rerank, self.mode) {
                    (0, _) | (_, Mode::MemoryOnly | Mode::Deep) => found,
                    (n, Mode::Evidence { k, .. }) => self
                        .questions
                        .iter()
                        .zip(found)
                        .map(|(q, found)| {
                            let mut ranked = rerank(agent.backend(), q, found, n)?;
                            ranked.truncate(passages_searched(q, k));
                            Ok(ranked)
                        })
                        .collect::<Result<Vec<_>>>()?,
                };
                let answered =
                    answer_with_evidence(agent, &memory, &self.questions, found, tokens)?;
                Ok(self
                    .questions
                    .iter()
                    .zip(answered)
                    .map(|(q, answered)| Answer {
                        passages: Some(answered.passages),
                        model_calls: Some(answered.calls),
                        ..Answer::from_memory(stream, memory.version, q, &answered.report)
                    })
                    .collect())
            }
            Plan::MemoryOnly { memory } => {
                let questions: Vec<&str> = self.questions.iter().map(String::as_str).collect();
                let reports = general_answers(agent, &memory, &questions)?;
                Ok(questions
                    .iter()
                    .zip(&reports)
                    .map(|(q, r)| Answer::from_memory(stream, memory.version, q, r))
                    .collect())
            }
            Plan::Deep => {
                let queries: Vec<(&str, &str)> = self
                    .questions
                    .iter()
                    .map(|q| (stream, q.as_str()))
                    .collect();
                let deep = ingestor.deep_many(&queries, on_deep_step)?;
                Ok(self
                    .questions
                    .iter()
                    .zip(&deep)
                    .map(|(question, d)| {
                        tracing::info!(
                            "question chain {} ({question}): read {} new chunks, memory v{}",
                            d.chain,
                            d.steps,
                            d.version
                        );
                        Answer::from_deep(stream, question, d)
                    })
                    .collect())
            }
        }
    }
}

/// A memory version of a stream (the latest without `at`); [`Error::NoMemory`] when
/// there is none.
pub fn version_at(store: &Store, stream: &str, at: Option<u64>) -> Result<MemoryVersion> {
    version_of(store, &store.require(stream)?, at)
}

fn version_of(store: &Store, stream: &StreamRecord, at: Option<u64>) -> Result<MemoryVersion> {
    let found = match at {
        Some(v) => store.version(stream, GENERAL, v)?,
        None => store.latest(stream, GENERAL)?,
    };
    found.ok_or_else(|| Error::NoMemory {
        stream: stream.name.clone(),
        at,
    })
}

/// The memory a stream has before its first step: empty, version 0 (its passages can
/// already be searched).
pub fn empty_memory() -> MemoryVersion {
    MemoryVersion {
        version: 0,
        parent: None,
        text: "(none yet)".into(),
        tokens: 0,
        chunk: None,
        model: String::new(),
        model_sha256: String::new(),
        template_id: String::new(),
        template_version: 0,
        created: 0,
        prompt_tokens: 0,
        completion_tokens: 0,
        seconds: 0.0,
        cut: false,
        author: Author::Model,
    }
}
