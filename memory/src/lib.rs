//! What a user means by memory: a stream's content read into a bounded memory, and
//! questions answered from that memory beside the passages found for them, with the
//! passages cited.
//!
//! It owns the answer path and nothing else: ingesting a stream's pending text through
//! the agent and committing each step ([`Ingestor`]), feeding and asking the passage
//! index ([`sync_all`], [`search`]), and answering a [`Query`] in one of three
//! [`Mode`]s (evidence, memory-only, deep) as typed [`Answer`]s. Persistence is the
//! store's, inference the agent's and the engine's, the index recall's. It never prints
//! and never serves HTTP: the CLI and the daemon call it and present what it returns.
//!
//! ```no_run
//! use memagent_memory::{Mode, Query};
//!
//! # fn run(store: &memagent_store::Store, recall: &memagent_recall::Recall,
//! #        ingestor: &memagent_memory::Ingestor<'_>) -> memagent_memory::Result<()> {
//! let query = Query {
//!     stream: "notes".into(),
//!     questions: vec!["What does Ada drink?".into()],
//!     at: None,
//!     mode: Mode::default(),
//!     rerank: 0,
//! };
//! let plan = query.plan(store, Some(recall))?;
//! for answer in query.answer(plan, ingestor, &mut |_, _, _| {})? {
//!     println!("{}", answer.text());
//! }
//! # Ok(())
//! # }
//! ```

mod answer;
mod error;
mod ingest;
mod query;
mod search;
mod sources;

pub use answer::{abstains, answer_with_evidence, Answered};
pub use error::{Error, Result};
pub use ingest::{
    general_answers, DeepAnswer, Ingestor, Pending, StepOutcome, GENERAL_ANSWER, GENERAL_UPDATE,
};
pub use query::{
    empty_memory, passages_searched, version_at, Answer, DeepRead, Mode, Plan, Query, TemplateId,
    PASSAGES_K,
};
pub use search::{
    evidence_passages, index_lag, rerank, rerank_field_error, search, shown_ranges, sync_all,
    sync_changes, sync_stream, unlabelled, unmentioned, CitedTurn, Evidence, ReadAhead,
    EVIDENCE_TOKENS, MEANING_ONLY_SIMILARITY, NOTE_LINES, RERANK_MAX, RERANK_PROMPT,
};
pub use sources::{line_sources, LineSource};

/// The passage index of the database in `data_dir`: derived from its logs, rebuilt
/// from them at will.
pub fn index_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    data_dir.join("index")
}

/// Seconds since the Unix epoch, as records keep time.
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
