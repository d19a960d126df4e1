//! The `llama` architecture: Llama 2/3, SmolLM and their GGUF conversions.

use super::{Architecture, Config};
use crate::error::Result;
use crate::gguf::GgufFile;

pub(super) fn config(gguf: &GgufFile) -> Result<Config> {
    let mut config = Config::read_common(gguf, Architecture::Llama)?;
    // llama.cpp's converter permutes q/k so that rope acts on adjacent pairs.
    config.rope_interleaved = true;
    Ok(config)
}
