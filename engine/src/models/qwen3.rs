//! The `qwen3` architecture: Qwen3, with an RMSNorm over each head of the queries and
//! keys before the rotary positions, and no q/k/v biases.

use super::{Architecture, Config};
use crate::error::Result;
use crate::gguf::GgufFile;

pub(super) fn config(gguf: &GgufFile) -> Result<Config> {
    let mut config = Config::read_common(gguf, Architecture::Qwen3)?;
    // Rope on the two halves (NeoX style), as Qwen2.
    config.rope_interleaved = false;
    config.qk_norm = true;
    Ok(config)
}
