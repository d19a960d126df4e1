//! Synthetic long-context tasks for benchmarks: haystack filler measured in model tokens,
//! needles placed at a chosen depth, and the RULER task families with their scoring.
//! Everything is deterministic per seed.

mod haystack;
mod needle;
mod ruler;

pub use haystack::Haystack;
pub use needle::{single_needle, NeedleSample, CITIES};
pub use ruler::{
    compose, exact_match, f1, generate, normalize, recall_all, score, sub_em, Insert, QaItem,
    RulerSample, Score, Scoring, Sources, Task, ALL_TASKS,
};
