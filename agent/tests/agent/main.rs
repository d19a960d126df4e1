//! Tests of the memory-agent loop: the protocol's exact bytes, the loop on the real
//! default model, the remote backend against a loopback server, and bad requests.

mod errors;
mod protocol;
mod remote;
#[allow(dead_code)]
#[path = "../../../engine/tests/model/support.rs"]
mod support;
