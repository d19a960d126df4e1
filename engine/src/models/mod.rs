//! Decoder-only transformers loaded from GGUF: the shared block code lives in
//! `transformer`, each architecture has a file that reads its configuration; the
//! products, attention and norms they run are [`crate::kernels`]'.

mod gemma3;
mod llama;
mod phi3;
mod qwen2;
mod qwen3;
mod transformer;

pub use crate::kernels::{PrefillWeights, WeightPlan};
pub use transformer::{rope_tables, KvCache, Transformer, PREFILL_CHUNK};

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

/// The architectures this engine runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3, SmolLM, and other `llama` GGUF files.
    Llama,
    /// Qwen2 and Qwen2.5 (and so the RL-MemoryAgent checkpoints).
    Qwen2,
    /// Qwen3: Qwen2's layout with per-head q/k RMSNorm and no q/k/v biases.
    Qwen3,
    /// Phi-3 and Phi-3.5: fused q/k/v and gate/up projections.
    Phi3,
    /// Gemma 3: sliding-window and global layers, norms after attention and the
    /// feed-forward too, a GELU-gated feed-forward, scaled embeddings.
    Gemma3,
}

impl Architecture {
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        match gguf.string("general.architecture")? {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            "phi3" => Ok(Self::Phi3),
            "gemma3" => Ok(Self::Gemma3),
            other => Err(Error::UnsupportedArchitecture(other.to_string())),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Phi3 => "phi3",
            Self::Gemma3 => "gemma3",
        }
    }
}

/// Hyper-parameters of a model, read from GGUF metadata.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub architecture: Architecture,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_kv_head: usize,
    pub head_dim: usize,
    pub n_ff: usize,
    pub vocab_size: usize,
    pub context_length: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    /// Rotary embedding on adjacent pairs (llama.cpp's "normal" rope, used for `llama`
    /// files whose q/k weights were permuted at conversion) rather than on halves (NeoX).
    pub rope_interleaved: bool,
    /// q, k and v projections carry a bias (Qwen2).
    pub qkv_bias: bool,
    /// Each head of the queries and keys is RMS-normalised (its own weights,
    /// `attn_q_norm`/`attn_k_norm`) before the rotary positions (Qwen3).
    pub qk_norm: bool,
    /// Positions are multiplied by this in the rotary angles of global layers (1 / the
    /// linear `rope.scaling.factor`).
    pub rope_freq_scale: f32,
    /// Token embeddings are multiplied by this on the way in (Gemma: sqrt(n_embd)).
    pub embed_scale: Option<f32>,
    /// An RMSNorm on the attention output and on the feed-forward output, each before
    /// its residual add (`post_attention_norm`, `post_ffw_norm`; Gemma).
    pub post_norms: bool,
    /// The gated feed-forward's activation.
    pub activation: Activation,
    /// Scale of the attention scores when it is not 1/sqrt(head_dim) (Gemma 3 27B).
    pub attention_scale: Option<f32>,
    /// Layers that attend only to the latest positions, with their own rotary base.
    pub sliding_window: Option<SlidingWindow>,
}

/// The gated feed-forward's activation, applied to the gate before it multiplies up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SiLU (SwiGLU): llama, qwen, phi.
    Silu,
    /// GELU in its tanh form (GeGLU): Gemma.
    GeluTanh,
}

/// Sliding-window attention on some layers (Gemma 3: five of every six).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SlidingWindow {
    /// A query sees the keys of this many positions, its own included.
    pub window: usize,
    /// Every `pattern`-th layer (the last of each group) attends globally.
    pub pattern: usize,
    /// Rotary base of the windowed layers.
    pub rope_theta: f32,
}

impl Config {
    /// Whether layer `layer` attends within the sliding window, and its size.
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.sliding_window
            .filter(|w| w.pattern == 0 || layer % w.pattern < w.pattern - 1)
            .map(|w| w.window)
    }
}

impl Config {
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let config = match Architecture::from_gguf(gguf)? {
            Architecture::Llama => llama::config(gguf)?,
            Architecture::Qwen2 => qwen2::config(gguf)?,
            Architecture::Qwen3 => qwen3::config(gguf)?,
            Architecture::Phi3 => phi3::config(gguf)?,
            Architecture::Gemma3 => gemma3::config(gguf)?,
        };
        config.validate(gguf)?;
        Ok(config)
    }

    /// Reads the keys every llama-like architecture stores under its own prefix.
    fn read_common(gguf: &GgufFile, architecture: Architecture) -> Result<Self> {
        let p = architecture.name();
        let n_embd = gguf.usize(&format!("{p}.embedding_length"))?;
        let n_head = gguf.usize(&format!("{p}.attention.head_count"))?;
        let n_kv_head = gguf
            .opt_usize(&format!("{p}.attention.head_count_kv"))?
            .unwrap_or(n_head);
        let head_dim = match gguf.opt_usize(&format!("{p}.attention.key_length"))? {
            Some(d) => d,
            None if n_head > 0 => n_embd / n_head,
            None => 0,
        };
        let vocab_size = match gguf.opt_usize(&format!("{p}.vocab_size"))? {
            Some(v) => v,
            None => gguf.string_array("tokenizer.ggml.tokens")?.len(),
        };
        Ok(Self {
            architecture,
            n_layer: gguf.usize(&format!("{p}.block_count"))?,
            n_embd,
            n_head,
            n_kv_head,
            head_dim,
            n_ff: gguf.usize(&format!("{p}.feed_forward_length"))?,
            vocab_size,
            context_length: gguf.usize(&format!("{p}.context_length"))?,
            rope_theta: gguf
                .opt_f32(&format!("{p}.rope.freq_base"))?
                .unwrap_or(10_000.0),
            rms_eps: gguf.f32(&format!("{p}.attention.layer_norm_rms_epsilon"))?,
            rope_interleaved: false,
            qkv_bias: false,
            qk_norm: false,
            rope_freq_scale: 1.0,
            embed_scale: None,
            post_norms: false,
            activation: Activation::Silu,
            attention_scale: None,
            sliding_window: None,
        })
    }

    fn validate(&self, gguf: &GgufFile) -> Result<()> {
        let bad = |what: String| Err(gguf.gguf_error(what));
        if self.n_layer == 0 || self.n_embd == 0 || self.n_head == 0 || self.n_kv_head == 0 {
            return bad(format!("model dimensions must be non-zero: {self:?}"));
        }
        if !self.n_head.is_multiple_of(self.n_kv_head) {
            return bad(format!(
                "head_count {} is not a multiple of head_count_kv {}",
                self.n_head, self.n_kv_head
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head dimension {} must be even and non-zero",
                self.head_dim
            ));
        }
        if self.context_length == 0 {
            return bad("context_length must be non-zero".to_string());
        }
        Ok(())
    }
}
