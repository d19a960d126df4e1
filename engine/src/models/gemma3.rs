//! The `gemma3` architecture: Gemma 3. Five of every six layers attend within a sliding
//! window and rotate with their own base (10,000 unless the file says otherwise); every
//! sixth attends globally. Per-head q/k RMSNorm, norms after attention and after the
//! feed-forward as well as before, a GELU-gated feed-forward, embeddings scaled by
//! sqrt(n_embd), rope on halves, and an output head tied to the embeddings.

use super::{Activation, Architecture, Config, SlidingWindow};
use crate::error::Result;
use crate::gguf::GgufFile;

pub(super) fn config(gguf: &GgufFile) -> Result<Config> {
    let mut config = Config::read_common(gguf, Architecture::Gemma3)?;
    config.rope_interleaved = false;
    config.qk_norm = true;
    config.post_norms = true;
    config.activation = Activation::GeluTanh;
    config.embed_scale = Some((config.n_embd as f32).sqrt());
    // As llama.cpp and Gemma's reference code: 27B (62 layers) scales queries by its
    // model width per head instead of the head size.
    if config.n_layer == 62 {
        config.attention_scale = Some(1.0 / ((config.n_embd / config.n_head) as f32).sqrt());
    }
    if let Some(factor) = gguf.opt_f32("gemma3.rope.scaling.factor")? {
        if factor > 0.0 {
            config.rope_freq_scale = 1.0 / factor;
        }
    }
    if let Some(cap) = gguf.opt_f32("gemma3.final_logit_softcapping")? {
        if cap != 0.0 {
            return Err(gguf.gguf_error(format!(
                "gemma3.final_logit_softcapping {cap}: soft-capped logits are not supported"
            )));
        }
    }
    if let Some(window) = gguf.opt_usize("gemma3.attention.sliding_window")? {
        if window > 0 {
            let pattern = gguf
                .opt_usize("gemma3.attention.sliding_window_pattern")
                .map_err(|_| {
                    gguf.gguf_error(
                        "gemma3.attention.sliding_window_pattern is not one number (a list \
                         per layer is not supported)"
                            .to_string(),
                    )
                })?
                .unwrap_or(6);
            let rope_theta = gguf
                .opt_f32("gemma3.rope.freq_base_swa")?
                .unwrap_or(10_000.0);
            config.sliding_window = Some(SlidingWindow {
                window,
                pattern,
                rope_theta,
            });
        }
    }
    Ok(config)
}
