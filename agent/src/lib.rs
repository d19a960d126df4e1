//! The memory agent (MemAgent): read a document chunk by chunk, rewrite a bounded memory
//! after each chunk, answer from the memory alone.
//!
//! It owns the loop and its protocol: chunking, the templates (byte-exact for the
//! published checkpoints), focus, hygiene, the line writer, and which answers an
//! adapter was trained for. The loop is independent of where tokens come from: a
//! [`Backend`] answers one user message (the local engine, or an OpenAI-compatible
//! server through [`OpenAiBackend`]), a [`TextTokenizer`] cuts the document. Each step
//! is exposed on its own ([`MemoryAgent::update`], [`MemoryAgent::answer`]) so that
//! callers which persist memories between steps can drive it chunk by chunk. It never
//! stores anything and never prints.
//!
//! ```no_run
//! use memagent_agent::{MemoryAgent, Profile};
//! use memagent_engine::{LoadOptions, LocalModel};
//!
//! let model = LocalModel::load("models/SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), &LoadOptions::default())?;
//! let agent = MemoryAgent::new(&model, model.tokenizer(), Profile::for_model(model.name(), Some(model.parameters())));
//! let run = agent.run("Ada prefers tea. Ravi lives in Graz.", "Where does Ravi live?", &mut |_| {})?;
//! println!("{}", run.final_answer.answer);
//! # Ok::<(), memagent_agent::Error>(())
//! ```

mod backend;
mod error;
pub mod focus;
pub mod hygiene;
pub mod lines;
mod protocol;
mod remote;

use std::time::Instant;

use serde::Serialize;

use memagent_engine::SamplingParams;
use memagent_engine::{DecodeStats, GenerateOptions, StopReason, DEFAULT_DRAFT_TOKENS};

pub use backend::{Backend, Completion, TextTokenizer, Timings};
pub use error::{Error, Result};
pub use memagent_engine::prefix::{KeptPrompt, ScoredPromptStats};
pub use protocol::{
    extract_answer, memory_text, FinalForm, Template, DIRECT_BOXED, DIRECT_EVAL, FINAL_BOXED,
    FINAL_EVAL, GENERAL_ANSWER, GENERAL_COMPACT, GENERAL_LINES, GENERAL_UPDATE, NO_MEMORY,
    PASSAGE_ANSWER, UPDATE,
};
pub use remote::{OpenAiBackend, RemoteOptions, RemoteTokenizer};

/// Tokens of chat wrapping (system prompt, role markers) assumed around a message when
/// the backend cannot count them (a remote server without the model's chat template).
pub const CHAT_WRAPPING_ALLOWANCE: usize = 64;

/// Tokens kept free in every budget: text around a chunk may merge differently with its
/// neighbours than the chunk alone.
pub const BUDGET_SLACK: usize = 8;

/// Most tokens the line writer generates per chunk: its new facts only.
pub const LINES_TOKENS: usize = 160;

/// How the general memory is written after each chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Writer {
    /// The model rewrites the whole memory (the MemAgent protocol).
    #[default]
    Rewrite,
    /// The model writes the chunk's new facts as lines; code merges them
    /// ([`lines::merge`]) and the model rewrites only to compact past M.
    Lines,
}

impl std::str::FromStr for Writer {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "rewrite" => Ok(Self::Rewrite),
            "lines" => Ok(Self::Lines),
            other => Err(Error::InvalidRequest(format!(
                "unknown memory writer `{other}`; use rewrite or lines"
            ))),
        }
    }
}

/// How question-mode steps read their chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Reading {
    /// The model reads the whole chunk (the MemAgent protocol).
    #[default]
    Whole,
    /// The model reads only the chunk's sentences that bear on the question, and a
    /// chunk with none leaves the memory as it was ([`focus`]).
    Focused,
}

impl std::str::FromStr for Reading {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "whole" => Ok(Self::Whole),
            "focused" => Ok(Self::Focused),
            other => Err(Error::InvalidRequest(format!(
                "unknown reading `{other}`; use whole or focused"
            ))),
        }
    }
}

/// Chunk size C, memory cap M and answer cap of the loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Profile {
    pub chunk_tokens: usize,
    pub memory_tokens: usize,
    pub answer_tokens: usize,
}

impl Profile {
    /// The paper's settings: C = 5000, M = 1024, answers up to 1024 tokens.
    pub const PAPER: Profile = Profile {
        chunk_tokens: 5000,
        memory_tokens: 1024,
        answer_tokens: 1024,
    };

    /// Small models (under a billion parameters, such as the default SmolLM2-135M): a
    /// needle survives ~800-token chunks 3/3 and ~4,000-token chunks 0/4 there.
    pub const SMALL: Profile = Profile {
        chunk_tokens: 1024,
        memory_tokens: 256,
        answer_tokens: 256,
    };

    /// The default profile of a model, from its parameter count when known, else its name.
    pub fn for_model(name: &str, parameters: Option<usize>) -> Profile {
        let small = match parameters {
            Some(n) => n < 1_000_000_000,
            None => name.to_lowercase().contains("smollm"),
        };
        if small {
            Self::SMALL
        } else {
            Self::PAPER
        }
    }
}

/// One chunk of a document: `tokens` model tokens, decoded back to text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub text: String,
    pub tokens: usize,
}

/// Cuts `text` into chunks of at most `chunk_tokens` tokens.
pub fn chunk_text(
    tokenizer: &dyn TextTokenizer,
    text: &str,
    chunk_tokens: usize,
) -> Result<Vec<Chunk>> {
    if chunk_tokens == 0 {
        return Err(Error::InvalidRequest(
            "the chunk size must be at least one token".to_string(),
        ));
    }
    let ids = tokenizer.encode(text)?;
    ids.chunks(chunk_tokens)
        .map(|ids| {
            Ok(Chunk {
                text: tokenizer.decode(ids)?,
                tokens: ids.len(),
            })
        })
        .collect()
}

/// What one memory-update step produced.
#[derive(Debug, Clone, Serialize)]
pub struct StepReport {
    /// 1-based number of the chunk this step read.
    pub index: usize,
    pub chunk_tokens: usize,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Tokens of the new memory (after any cut).
    pub memory_tokens: usize,
    /// The memory reached the cap M: the reply hit the token limit, or was cut to M tokens.
    pub cut: bool,
    /// Why the reply ended (end of turn, token limit, or a loop that was stopped).
    pub stop_reason: StopReason,
    pub seconds: f64,
    pub memory: String,
    /// What memory hygiene changed (repeated lines dropped, or the previous memory kept
    /// because the reply was empty or echoed the instructions); absent when nothing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repaired: Option<String>,
    /// What a focused step read of its chunk ([`Reading::Focused`]); absent when the
    /// whole chunk was read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub focus: Option<String>,
    /// Decode passes and speculative drafting of the reply (local models only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decoding: Option<DecodeStats>,
    /// Prompt and generation time of the reply, when the backend knows them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// The answer of a final (or direct) step.
#[derive(Debug, Clone, Serialize)]
pub struct AnswerReport {
    /// The model's whole reply.
    pub reply: String,
    /// The answer extracted from it (`\boxed{}`, "the answer is", else the reply).
    pub answer: String,
    pub template: Template,
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub stop_reason: StopReason,
    pub seconds: f64,
    /// Prompt and generation time of the reply, when the backend knows them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
}

/// A whole run of the loop over one document.
#[derive(Debug, Clone, Serialize)]
pub struct AgentRun {
    pub question: String,
    pub model: String,
    pub profile: Profile,
    pub update_template: Template,
    pub input_tokens: usize,
    pub steps: Vec<StepReport>,
    pub final_answer: AnswerReport,
    pub seconds: f64,
}

/// Token budget of one question under a profile, checked before the first step.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Budget {
    pub context: Option<usize>,
    pub question_tokens: usize,
    /// Prompt tokens of an update step without question, memory and chunk.
    pub update_template_tokens: usize,
    pub final_template_tokens: usize,
    /// Largest prompt + reply of an update step.
    pub update_total: usize,
    /// Largest prompt + reply of the final step.
    pub final_total: usize,
}

/// What a run reports while it works, for progress displays.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'r> {
    /// The document was cut: `chunks` steps of `input_tokens` tokens in all will follow.
    Started { chunks: usize, input_tokens: usize },
    /// One memory-update step finished (of `chunks`).
    Step { step: &'r StepReport, chunks: usize },
    /// Every chunk was read; the final answer is being written.
    Answering,
}

/// The memory agent over one backend and tokenizer.
pub struct MemoryAgent<'a> {
    backend: &'a dyn Backend,
    tokenizer: &'a dyn TextTokenizer,
    pub profile: Profile,
    pub final_form: FinalForm,
    pub sampling: SamplingParams,
    /// Stop a reply that loops (its last this many tokens repeat earlier ones): small
    /// models fall into such loops under greedy decoding and would otherwise fill the
    /// memory cap with copies. Backends that cannot stop early ignore it.
    pub repeat_guard: Option<usize>,
    /// Most tokens drafted per forward pass by prompt lookup (greedy local decoding);
    /// 0 decodes one token per pass. The output is the same either way.
    pub draft_tokens: usize,
    /// Replies never end at an end-of-turn token: each runs to its cap unless the repeat
    /// guard stops it (fixed-length benchmarks; memories written so are not useful).
    pub ignore_eos: bool,
    /// How question-mode steps of [`MemoryAgent::run`] read their chunk.
    pub reading: Reading,
}

/// Whether an adapter learned the answers of `template`. `memctl train` teaches every
/// memory step and the memory-only final answers ([`FINAL_BOXED`] in question mode,
/// [`GENERAL_ANSWER`] in general mode), and answers from passages ([`PASSAGE_ANSWER`])
/// when its data had an evidence share; never direct answers, the other final form or
/// chats. Answers of the other templates, and chats, run with the base model.
pub fn trained_for(manifest: &memagent_engine::AdapterManifest, template: Template) -> bool {
    if template.id == PASSAGE_ANSWER.id {
        return manifest.evidence_share().is_some_and(|s| s > 0.0);
    }
    [FINAL_BOXED.id, GENERAL_ANSWER.id].contains(&template.id)
}

/// `template` filled with each of `items` (question, memory, chunk), each question checked.
fn filled(template: Template, items: &[(&str, &str, &str)]) -> Result<Vec<String>> {
    items
        .iter()
        .map(|(question, memory, chunk)| {
            check_question(question)?;
            Ok(template.fill(question, memory, chunk))
        })
        .collect()
}

/// The memory writer the model's adapter was trained to write with, when it says.
pub fn adapter_writer(model: &memagent_engine::LocalModel) -> Option<Writer> {
    model.adapter_manifest()?.writer()?.parse().ok()
}

/// Default span of [`MemoryAgent::repeat_guard`], in tokens.
pub const REPEAT_GUARD_TOKENS: usize = 16;

impl<'a> MemoryAgent<'a> {
    pub fn new(
        backend: &'a dyn Backend,
        tokenizer: &'a dyn TextTokenizer,
        profile: Profile,
    ) -> Self {
        Self {
            backend,
            tokenizer,
            profile,
            final_form: FinalForm::default(),
            sampling: SamplingParams::default(),
            repeat_guard: Some(REPEAT_GUARD_TOKENS),
            draft_tokens: DEFAULT_DRAFT_TOKENS,
            ignore_eos: false,
            reading: Reading::default(),
        }
    }

    /// The tokenizer that cuts documents.
    pub fn tokenizer(&self) -> &'a dyn TextTokenizer {
        self.tokenizer
    }

    /// The backend the agent's replies come from.
    pub fn backend(&self) -> &'a dyn Backend {
        self.backend
    }

    fn prompt_tokens(&self, message: &str) -> Result<usize> {
        match self.backend.chat_prompt_tokens(message)? {
            Some(n) => Ok(n),
            None => Ok(self.tokenizer.encode(message)?.len() + CHAT_WRAPPING_ALLOWANCE),
        }
    }

    fn options(&self, max_new_tokens: usize) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens,
            sampling: self.sampling,
            stop_on_repeat: self.repeat_guard,
            stop_on_repeated_line: self.repeat_guard.is_some(),
            draft_tokens: self.draft_tokens,
            ignore_eos: self.ignore_eos,
            ..GenerateOptions::default()
        }
    }

    /// The model's reply to a conversation, up to `max_tokens` tokens, with the loop's
    /// sampling and repetition stops (memagent's proxy answers so without an upstream).
    /// The base model answers: an adapter learned memory steps, not conversations.
    pub fn chat(
        &self,
        messages: &[memagent_engine::Message],
        max_tokens: usize,
    ) -> Result<Completion> {
        let options = GenerateOptions {
            weights: memagent_engine::Weights::Base,
            ..self.options(max_tokens)
        };
        self.backend.chat(messages, &options)
    }

    /// Checks that every step of a run fits the model's context; the error suggests the
    /// largest chunk size that would.
    pub fn budget(&self, question: &str) -> Result<Budget> {
        let Profile {
            chunk_tokens,
            memory_tokens,
            answer_tokens,
        } = self.profile;
        if chunk_tokens == 0 || memory_tokens == 0 || answer_tokens == 0 {
            return Err(Error::InvalidRequest(format!(
                "chunk size, memory cap and answer cap must be at least one token \
                 (got {chunk_tokens}, {memory_tokens}, {answer_tokens})"
            )));
        }
        let question_tokens = self.tokenizer.encode(question)?.len();
        let update_template_tokens = self.prompt_tokens(&UPDATE.fill("", "", ""))?;
        let final_template = self.final_form.final_template();
        let final_template_tokens = self.prompt_tokens(&final_template.fill("", "", ""))?;
        // Prompt: template + question + memory (≤ M) + chunk (≤ C); reply ≤ M.
        let update_fixed =
            update_template_tokens + question_tokens + 2 * memory_tokens + BUDGET_SLACK;
        let update_total = update_fixed + chunk_tokens;
        let final_total =
            final_template_tokens + question_tokens + memory_tokens + answer_tokens + BUDGET_SLACK;
        let context = self.backend.context_length();
        if let Some(context) = context {
            if update_total > context {
                let largest = context.saturating_sub(update_fixed);
                let hint = if largest > 0 {
                    format!(
                        "use a chunk size of at most {largest} tokens (--chunk-tokens {largest})"
                    )
                } else {
                    "lower the memory cap (--memory-tokens) or shorten the question".to_string()
                };
                return Err(Error::Budget(format!(
                    "an update step needs up to {update_total} tokens (chunk {chunk_tokens} + \
                     memory {memory_tokens} + reply {memory_tokens} + template \
                     {update_template_tokens} + question {question_tokens} + slack \
                     {BUDGET_SLACK}) but the model's context is {context}; {hint}"
                )));
            }
            if final_total > context {
                return Err(Error::Budget(format!(
                    "the final step needs up to {final_total} tokens (memory {memory_tokens} + \
                     answer {answer_tokens} + template {final_template_tokens} + question \
                     {question_tokens} + slack {BUDGET_SLACK}) but the model's context is \
                     {context}; lower --memory-tokens or --answer-tokens"
                )));
            }
        }
        Ok(Budget {
            context,
            question_tokens,
            update_template_tokens,
            final_template_tokens,
            update_total,
            final_total,
        })
    }

    /// One update step: the new memory after reading `chunk` with `memory` in mind.
    pub fn update(&self, question: &str, memory: &str, chunk: &Chunk) -> Result<StepReport> {
        self.update_with(UPDATE, question, memory, chunk)
    }

    /// An update step with another template (such as a query-agnostic one).
    pub fn update_with(
        &self,
        template: Template,
        question: &str,
        memory: &str,
        chunk: &Chunk,
    ) -> Result<StepReport> {
        let mut reports = self.update_many(template, &[(question, memory, chunk)])?;
        Ok(reports.pop().expect("one report per step"))
    }

    /// Update steps of several independent memories (other streams, other questions)
    /// at once: `(question, memory, chunk)` each, with `template`. The local model
    /// decodes them as one batch; each gets the report it would get alone.
    pub fn update_many(
        &self,
        template: Template,
        steps: &[(&str, &str, &Chunk)],
    ) -> Result<Vec<StepReport>> {
        if steps.is_empty() {
            return Ok(Vec::new());
        }
        let messages: Vec<String> = steps
            .iter()
            .map(|(question, memory, chunk)| template.fill(question, memory, &chunk.text))
            .collect();
        let replies = self
            .backend
            .complete_batch(&messages, &self.options(self.profile.memory_tokens))?;
        steps
            .iter()
            .zip(replies)
            .map(|((_, memory, chunk), reply)| {
                let seconds = reply.seconds;
                self.finish_update(template, memory, chunk, reply, seconds)
            })
            .collect()
    }

    /// Line-writer steps of several independent general memories, `(memory, chunk)`
    /// each: the model writes each chunk's new facts (decoded as one batch), code merges
    /// them ([`lines::merge`], comparing lines with `embed` when given), and a memory that
    /// passes M is compacted by the model, then cut at M if it still passes.
    pub fn update_lines_many(
        &self,
        steps: &[(&str, &Chunk)],
        embed: Option<lines::Embed<'_>>,
    ) -> Result<Vec<StepReport>> {
        let messages: Vec<String> = steps
            .iter()
            .map(|(memory, chunk)| GENERAL_LINES.fill("", memory, &chunk.text))
            .collect();
        let budget = self.profile.memory_tokens.clamp(1, LINES_TOKENS);
        let replies = self
            .backend
            .complete_batch(&messages, &self.options(budget))?;
        let mut reports = Vec::with_capacity(steps.len());
        for ((memory, chunk), reply) in steps.iter().zip(replies) {
            let (facts, dropped) = lines::new_lines(memory_text(&reply.text), GENERAL_LINES);
            let (merged, mut merge) = lines::merge(memory, &facts, embed)?;
            merge.dropped = dropped;
            let mut notes: Vec<String> = merge.note().into_iter().collect();
            let mut report = StepReport {
                index: 0,
                chunk_tokens: chunk.tokens,
                prompt_tokens: reply.prompt_tokens,
                completion_tokens: reply.completion_tokens,
                memory_tokens: 0,
                cut: false,
                stop_reason: reply.stop_reason,
                seconds: reply.seconds,
                memory: merged,
                repaired: None,
                focus: None,
                decoding: reply.decoding,
                timings: reply.timings,
            };
            let mut ids = self.tokenizer.encode(&report.memory)?;
            if ids.len() > self.profile.memory_tokens {
                let merged = std::mem::take(&mut report.memory);
                let compact = self.backend.complete(
                    &GENERAL_COMPACT.fill("", &merged, ""),
                    &self.options(self.profile.memory_tokens),
                )?;
                report.prompt_tokens += compact.prompt_tokens;
                report.completion_tokens += compact.completion_tokens;
                report.seconds += compact.seconds;
                let (text, repaired) =
                    hygiene::clean(memory_text(&compact.text), &merged, GENERAL_COMPACT);
                notes.push(format!(
                    "compacted {} tokens{}",
                    ids.len(),
                    repaired.map_or(String::new(), |r| format!(" ({r})"))
                ));
                report.memory = text;
                ids = self.tokenizer.encode(&report.memory)?;
                if ids.len() > self.profile.memory_tokens {
                    ids.truncate(self.profile.memory_tokens);
                    let cut = self.tokenizer.decode(&ids)?;
                    report.cut = true;
                    report.memory = match hygiene::drop_unfinished(&cut) {
                        Some(kept) => kept,
                        None => memory.to_string(),
                    };
                    notes.push("cut at M tokens".to_string());
                    ids = self.tokenizer.encode(&report.memory)?;
                }
            }
            report.memory_tokens = ids.len();
            report.repaired = (!notes.is_empty()).then(|| notes.join("; "));
            reports.push(report);
        }
        Ok(reports)
    }

    /// A step's report from the model's reply: memory hygiene, then the cut to M tokens.
    fn finish_update(
        &self,
        template: Template,
        memory: &str,
        chunk: &Chunk,
        reply: Completion,
        seconds: f64,
    ) -> Result<StepReport> {
        let previous = memory;
        let (mut memory, mut repaired) = hygiene::clean(memory_text(&reply.text), memory, template);
        let mut ids = self.tokenizer.encode(&memory)?;
        let mut cut = reply.stop_reason == StopReason::MaxTokens;
        if ids.len() > self.profile.memory_tokens {
            ids.truncate(self.profile.memory_tokens);
            memory = self.tokenizer.decode(&ids)?;
            cut = true;
        }
        if cut && memory != previous {
            // The last line stopped at M tokens, often mid-word: it goes.
            let (kept, note) = match hygiene::drop_unfinished(&memory) {
                Some(kept) if kept == memory => (kept, None),
                Some(kept) => (kept, Some("dropped the line cut at M tokens")),
                None => (
                    previous.to_string(),
                    Some("nothing finished before the cut at M tokens: kept the previous memory"),
                ),
            };
            if let Some(note) = note {
                repaired = Some(match repaired {
                    Some(r) => format!("{r}; {note}"),
                    None => note.to_string(),
                });
                memory = kept;
                ids = self.tokenizer.encode(&memory)?;
            }
        }
        Ok(StepReport {
            index: 0,
            chunk_tokens: chunk.tokens,
            prompt_tokens: reply.prompt_tokens,
            completion_tokens: reply.completion_tokens,
            memory_tokens: ids.len(),
            cut,
            stop_reason: reply.stop_reason,
            seconds,
            memory,
            repaired,
            focus: None,
            decoding: reply.decoding,
            timings: reply.timings,
        })
    }

    /// Adds back to a focused step's memory the sentences read so far whose facts the
    /// model's rewrite lost ([`focus::restore`]), within M.
    fn restore_lost(&self, step: &mut StepReport, read: &[String], question: &str) -> Result<()> {
        let cap = self.profile.memory_tokens;
        let mut failed = None;
        let mut fits = |memory: &str| match self.tokenizer.encode(memory) {
            Ok(ids) => ids.len() <= cap,
            Err(e) => {
                failed = Some(e);
                false
            }
        };
        // The first memory starts from nothing rather than from "No previous memory".
        let written = if step.memory.trim() == NO_MEMORY.trim() {
            ""
        } else {
            step.memory.as_str()
        };
        let (memory, added) = focus::restore(written, read, question, &mut fits);
        if let Some(e) = failed {
            return Err(e);
        }
        if added > 0 {
            step.memory_tokens = self.tokenizer.encode(&memory)?.len();
            step.memory = memory;
            let note = format!(
                "added back {added} sentence{} read whose facts the rewrite lost",
                if added == 1 { "" } else { "s" }
            );
            step.repaired = Some(match step.repaired.take() {
                Some(r) => format!("{r}; {note}"),
                None => note,
            });
        }
        Ok(())
    }

    /// The report of a step whose chunk held nothing to read: the memory stays.
    fn unread_step(&self, memory: &str, chunk: &Chunk) -> Result<StepReport> {
        Ok(StepReport {
            index: 0,
            chunk_tokens: chunk.tokens,
            prompt_tokens: 0,
            completion_tokens: 0,
            memory_tokens: self.tokenizer.encode(memory)?.len(),
            cut: false,
            stop_reason: StopReason::EndOfTurn,
            seconds: 0.0,
            memory: memory.to_string(),
            repaired: None,
            focus: None,
            decoding: None,
            timings: None,
        })
    }

    /// The final step: the answer to `question` from `memory` alone.
    pub fn answer(&self, question: &str, memory: &str) -> Result<AnswerReport> {
        let template = self.final_form.final_template();
        self.answer_with(template, &template.fill(question, memory, ""))
    }

    /// A final step with another template.
    pub fn answer_from(
        &self,
        template: Template,
        question: &str,
        memory: &str,
    ) -> Result<AnswerReport> {
        check_question(question)?;
        self.answer_with(template, &template.fill(question, memory, ""))
    }

    /// Final steps of several memories at once, `(question, memory)` each, with
    /// `template` (the MemAgent final template when `None`). The local model decodes them
    /// as one batch; each gets the answer it would get alone.
    pub fn answer_many(
        &self,
        template: Option<Template>,
        items: &[(&str, &str)],
    ) -> Result<Vec<AnswerReport>> {
        let template = template.unwrap_or_else(|| self.final_form.final_template());
        let mut messages = Vec::with_capacity(items.len());
        for (question, memory) in items {
            check_question(question)?;
            messages.push(template.fill(question, memory, ""));
        }
        self.answer_batch(template, &messages)
    }

    /// Answers with `template` filled with each `(question, memory, chunk)`, decoded as
    /// one batch.
    pub fn answer_filled(
        &self,
        template: Template,
        items: &[(&str, &str, &str)],
    ) -> Result<Vec<AnswerReport>> {
        self.answer_batch(template, &filled(template, items)?)
    }

    /// [`Self::answer_filled`] with the base model's weights, whatever the template's
    /// would be: a reader's misreading asked again.
    pub fn answer_filled_by_base(
        &self,
        template: Template,
        items: &[(&str, &str, &str)],
    ) -> Result<Vec<AnswerReport>> {
        self.answer_batch_with(
            template,
            &filled(template, items)?,
            memagent_engine::Weights::Base,
        )
    }

    /// Whether answers with `template` run with the model's reader.
    pub fn reads_with_reader(&self, template: Template) -> bool {
        self.backend.answer_weights(template) == memagent_engine::Weights::Reader
    }

    fn answer_with(&self, template: Template, message: &str) -> Result<AnswerReport> {
        let mut reports =
            self.answer_batch(template, std::slice::from_ref(&message.to_string()))?;
        Ok(reports.pop().expect("one answer per message"))
    }

    /// Answers run with the model's adapter only for a template it learned (the
    /// memory-only final answers it was trained on), and answers from passages with its
    /// reader when one is loaded; others run the base model, which an adapter trained to
    /// write memories would only make worse at them.
    fn answer_batch(&self, template: Template, messages: &[String]) -> Result<Vec<AnswerReport>> {
        self.answer_batch_with(template, messages, self.backend.answer_weights(template))
    }

    fn answer_batch_with(
        &self,
        template: Template,
        messages: &[String],
        weights: memagent_engine::Weights,
    ) -> Result<Vec<AnswerReport>> {
        let options = GenerateOptions {
            weights,
            ..self.options(self.profile.answer_tokens)
        };
        let replies = self.backend.complete_batch(messages, &options)?;
        Ok(replies
            .into_iter()
            .map(|reply| AnswerReport {
                answer: extract_answer(&reply.text),
                reply: reply.text,
                template,
                prompt_tokens: reply.prompt_tokens,
                completion_tokens: reply.completion_tokens,
                stop_reason: reply.stop_reason,
                seconds: reply.seconds,
                timings: reply.timings,
            })
            .collect())
    }

    /// The whole workflow over `document`; `on_progress` sees each step as it finishes.
    pub fn run(
        &self,
        document: &str,
        question: &str,
        on_progress: &mut dyn FnMut(Progress<'_>),
    ) -> Result<AgentRun> {
        let mut runs = self.run_many(&[(document, question)], &mut |_, p| on_progress(p))?;
        Ok(runs.pop().expect("one run per document"))
    }

    /// Each job's document cut into chunks, with its input tokens; each question checked
    /// against the budget first.
    fn cut_documents(
        &self,
        jobs: &[(&str, &str)],
        on_progress: &mut dyn FnMut(usize, Progress<'_>),
    ) -> Result<Vec<(Vec<Chunk>, usize)>> {
        let mut documents = Vec::with_capacity(jobs.len());
        for (i, (document, question)) in jobs.iter().enumerate() {
            check_question(question)?;
            self.budget(question)?;
            let chunks = chunk_text(self.tokenizer, document, self.profile.chunk_tokens)?;
            if chunks.is_empty() {
                return Err(Error::InvalidRequest(
                    "the document is empty: there is nothing to read".to_string(),
                ));
            }
            let input_tokens = chunks.iter().map(|c| c.tokens).sum();
            on_progress(
                i,
                Progress::Started {
                    chunks: chunks.len(),
                    input_tokens,
                },
            );
            documents.push((chunks, input_tokens));
        }
        Ok(documents)
    }

    /// The whole workflow over several `(document, question)` pairs at once: step `i` of
    /// every pair that has an `i`-th chunk is decoded in one batch, then the answers are.
    /// Each run is what it would be alone; `on_progress` sees the pair's index with each
    /// event, and every run's `seconds` is the whole batch's.
    pub fn run_many(
        &self,
        jobs: &[(&str, &str)],
        on_progress: &mut dyn FnMut(usize, Progress<'_>),
    ) -> Result<Vec<AgentRun>> {
        let start = Instant::now();
        let documents = self.cut_documents(jobs, on_progress)?;
        let mut memories = vec![NO_MEMORY.to_string(); jobs.len()];
        let mut steps: Vec<Vec<StepReport>> = documents
            .iter()
            .map(|(chunks, _)| Vec::with_capacity(chunks.len()))
            .collect();
        let mut focus: Vec<focus::Focus> = match self.reading {
            Reading::Whole => Vec::new(),
            Reading::Focused => jobs.iter().map(|(_, q)| focus::Focus::new(q)).collect(),
        };
        let rounds = documents.iter().map(|(c, _)| c.len()).max().unwrap_or(0);
        for round in 0..rounds {
            let active: Vec<usize> = (0..jobs.len())
                .filter(|&i| round < documents[i].0.len())
                .collect();
            // What each active job reads this round: its chunk, or (focused) the
            // sentences bearing on its question, if any.
            let read: Vec<(Option<Chunk>, Option<focus::Focused>)> = active
                .iter()
                .map(|&i| {
                    let chunk = &documents[i].0[round];
                    match focus.get_mut(i) {
                        None => (Some(chunk.clone()), None),
                        Some(focus) => {
                            let focused = focus.read(&chunk.text);
                            let chunk = focused.text().map(|text| Chunk {
                                text,
                                tokens: chunk.tokens,
                            });
                            (chunk, Some(focused))
                        }
                    }
                })
                .collect();
            let inputs: Vec<(&str, &str, &Chunk)> = active
                .iter()
                .zip(&read)
                .filter_map(|(&i, (chunk, _))| {
                    chunk.as_ref().map(|c| (jobs[i].1, memories[i].as_str(), c))
                })
                .collect();
            let mut updated = self.update_many(UPDATE, &inputs)?.into_iter();
            for (&i, (chunk, focused)) in active.iter().zip(read) {
                let mut step = match chunk {
                    Some(_) => updated.next().expect("one report per chunk read"),
                    None => self.unread_step(&memories[i], &documents[i].0[round])?,
                };
                if let Some(focused) = focused {
                    self.restore_lost(&mut step, focus[i].read_so_far(), jobs[i].1)?;
                    step.focus = Some(focused.note());
                }
                step.index = round + 1;
                tracing::debug!(
                    step = step.index,
                    memory_tokens = step.memory_tokens,
                    cut = step.cut,
                    "memory updated in {:.2}s",
                    step.seconds
                );
                let chunks = documents[i].0.len();
                on_progress(
                    i,
                    Progress::Step {
                        step: &step,
                        chunks,
                    },
                );
                memories[i].clone_from(&step.memory);
                steps[i].push(step);
            }
        }
        for i in 0..jobs.len() {
            on_progress(i, Progress::Answering);
        }
        let items: Vec<(&str, &str)> = jobs
            .iter()
            .zip(&memories)
            .map(|((_, question), memory)| (*question, memory.as_str()))
            .collect();
        let answers = self.answer_many(None, &items)?;
        let seconds = start.elapsed().as_secs_f64();
        Ok(jobs
            .iter()
            .zip(documents)
            .zip(steps.into_iter().zip(answers))
            .map(
                |(((_, question), (_, input_tokens)), (steps, final_answer))| AgentRun {
                    question: question.to_string(),
                    model: self.backend.model_name(),
                    profile: self.profile,
                    update_template: UPDATE,
                    input_tokens,
                    steps,
                    final_answer,
                    seconds,
                },
            )
            .collect())
    }

    /// The baseline: the whole document in one prompt, when it fits the context.
    pub fn direct(&self, document: &str, question: &str) -> Result<AnswerReport> {
        check_question(question)?;
        if document.trim().is_empty() {
            return Err(Error::InvalidRequest(
                "the document is empty: there is nothing to read".to_string(),
            ));
        }
        let template = self.final_form.direct_template();
        let message = template.fill(question, "", document);
        if let Some(context) = self.backend.context_length() {
            let prompt = self.prompt_tokens(&message)?;
            let total = prompt + self.profile.answer_tokens;
            if total > context {
                return Err(Error::Budget(format!(
                    "the document does not fit the model's context for a direct answer: \
                     {prompt} prompt tokens + {} answer tokens = {total} > {context} \
                     (over by {}); drop --direct to read it with the memory loop",
                    self.profile.answer_tokens,
                    total - context
                )));
            }
        }
        self.answer_with(template, &message)
    }
}

fn check_question(question: &str) -> Result<()> {
    if question.trim().is_empty() {
        return Err(Error::InvalidRequest(
            "the question is empty; ask something about the document".to_string(),
        ));
    }
    Ok(())
}
