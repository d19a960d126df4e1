//! Synthetic tasks shared by `memctl bench` and the trainer: haystack filler measured in
//! model tokens, needles placed at a chosen depth, the RULER task families with their
//! scoring, and memory-agent training trajectories whose ideal memory after every chunk
//! is known because the generator planted the facts. Everything is deterministic per
//! seed. This crate generates and scores; it never runs a model.
//!
//! ```no_run
//! use memagent_engine::Tokenizer;
//! use memagent_tasks::{generate, Haystack, Sources, Task};
//!
//! let tokenizer = Tokenizer::from_file("tokenizer.json".as_ref())?;
//! let haystack = Haystack::noise();
//! let sources = Sources { haystack: &haystack, tokenizer: &tokenizer, qa: &[] };
//! let sample = generate(&sources, Task::NiahSingle, 2048, 1)?;
//! println!("{} -> {:?}", sample.question, sample.expected);
//! # Ok::<(), memagent_tasks::Error>(())
//! ```

mod conversations;
mod error;

mod haystack;
mod needle;
mod ruler;
mod sessions;
mod split;
pub mod training;

pub use conversations::{
    answer_words, holds_gold_words, load_conversations, locomo_score, locomo_time,
    says_not_mentioned, token_f1, Category, Conversation, Question as ConversationQuestion,
    Turn as ConversationTurn,
};
pub use error::{Error, Result};
pub use haystack::Haystack;
pub use needle::{single_needle, NeedleSample};
pub use ruler::{
    compose, exact_match, f1, generate, generate_split, normalize, recall_all, score, sub_em,
    Insert, QaItem, RulerSample, Score, Scoring, Sources, Task, ALL_TASKS, CITIES,
};
pub use sessions::{
    session_chat, session_correct, Message as SessionMessage, QuestionKind, SessionQuestion,
    SessionSample,
};
pub use split::EvalSplit;
