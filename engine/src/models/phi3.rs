//! The `phi3` architecture: Phi-3 and Phi-3.5 (mini, medium): q, k and v in one fused
//! projection (`attn_qkv`), gate and up in one (`ffn_up`, gate first), rope on halves.

use super::{Architecture, Config};
use crate::error::Result;
use crate::gguf::GgufFile;

pub(super) fn config(gguf: &GgufFile) -> Result<Config> {
    let mut config = Config::read_common(gguf, Architecture::Phi3)?;
    config.rope_interleaved = false;
    if let Some(rotated) = gguf.opt_usize("phi3.rope.dimension_count")? {
        if rotated != config.head_dim {
            return Err(gguf.gguf_error(format!(
                "phi3.rope.dimension_count {rotated} rotates part of each head of \
                 {}; partial rotary embeddings are not supported",
                config.head_dim
            )));
        }
    }
    // The 128K variants scale rope per frequency (LongRoPE factors): not supported.
    if gguf.has_tensor("rope_factors_long.weight") || gguf.has_tensor("rope_factors_short.weight") {
        return Err(gguf.gguf_error(
            "LongRoPE frequency factors (the 128K-context Phi-3 variants) are not supported; \
             use a 4K-context file"
                .to_string(),
        ));
    }
    // Attention within a sliding window: up to the window it equals full attention, so
    // the context stops there.
    if let Some(window) = gguf.opt_usize("phi3.attention.sliding_window")? {
        if window > 0 && window < config.context_length {
            tracing::info!(
                "phi3 attends within a window of {window} tokens: context limited to it"
            );
            config.context_length = window;
        }
    }
    Ok(config)
}
