//! The engine's decoding on the loop's own prompts, on the real default model: batches,
//! shared prefixes, drafted tokens and adapters give the tokens of one plain decoding.

mod adapter;
mod batch;
mod prefix;
mod speculative;
#[allow(dead_code)]
#[path = "../../../engine/tests/model/support.rs"]
mod support;
