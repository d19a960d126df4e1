//! Tests of the local engine on the real default model (fetched by `scripts/test`) and on
//! tiny GGUF files written by the tests themselves.

mod conformance;
mod generation;
mod likelihood;
mod loader;
mod prefill;
mod support;
mod tuning;
