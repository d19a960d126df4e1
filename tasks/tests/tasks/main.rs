//! Task generation on the real tokenizer, and the loop on the real default model over a
//! generated needle document.

mod needle;
mod ruler;
#[allow(dead_code)]
#[path = "../../../engine/tests/model/support.rs"]
mod support;
mod training;
