//! Synthetic long-context tasks for benchmarks: haystack filler measured in model tokens,
//! and needles placed at a chosen depth. Everything is deterministic per seed.

mod haystack;
mod needle;

pub use haystack::Haystack;
pub use needle::{single_needle, NeedleSample, CITIES};
