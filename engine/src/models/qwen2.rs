//! The `qwen2` architecture: Qwen2 and Qwen2.5, the base of the RL-MemoryAgent checkpoints.

use super::{Architecture, Config};
use crate::error::Result;
use crate::gguf::GgufFile;

pub(super) fn config(gguf: &GgufFile) -> Result<Config> {
    let mut config = Config::read_common(gguf, Architecture::Qwen2)?;
    // Qwen2 keeps the Hugging Face layout: rope on the two halves (NeoX style).
    config.rope_interleaved = false;
    config.qkv_bias = true;
    Ok(config)
}
