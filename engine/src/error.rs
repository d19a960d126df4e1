use std::path::PathBuf;

/// Errors of the engine: model files, tokenizer, templates and generation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot read model file {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid GGUF file {path}: {message}")]
    Gguf { path: PathBuf, message: String },
    #[error("{path}: metadata key `{key}` {problem}")]
    Metadata {
        path: PathBuf,
        key: String,
        problem: String,
    },
    #[error("unsupported model architecture `{0}`; supported: llama, qwen2, qwen3, phi3, gemma3")]
    UnsupportedArchitecture(String),
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
    #[error(
        "prompt does not fit the model's context: {prompt} prompt tokens + {max_new} new tokens \
         = {total} > {context} (over by {over}); shorten the prompt or lower --max-tokens"
    )]
    ContextOverflow {
        prompt: usize,
        max_new: usize,
        total: usize,
        context: usize,
        over: usize,
    },
    #[error("device `{0}` is not available: this binary was built without the `{0}` feature; rebuild with `cargo build --release --features {0}`")]
    DeviceNotBuilt(String),
    #[error("unknown device `{0}`; expected cpu, cuda or metal")]
    UnknownDevice(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("token budget: {0}")]
    Budget(String),
    #[error("adapter {path}: {message}")]
    Adapter { path: PathBuf, message: String },
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
