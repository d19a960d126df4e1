use std::path::PathBuf;

/// Errors of recall. Each names the index folder, stream or file it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("search index {path}: {source}")]
    Index {
        path: PathBuf,
        #[source]
        source: tantivy::TantivyError,
    },
    #[error("search index {path} is in use by another process; stop it (a daemon?) or wait")]
    InUse { path: PathBuf },
    #[error("search index {path}: its state is unreadable ({reason}); run `memctl index rebuild`")]
    State { path: PathBuf, reason: String },
    #[error("search index {path} was made {reason}")]
    Stale { path: PathBuf, reason: String },
    #[error("reading stream `{stream}` at byte {offset}: {reason}")]
    Read {
        stream: String,
        offset: u64,
        reason: String,
    },
    #[error("embedder: {0}")]
    Embedder(String),
}

impl From<candle_core::Error> for Error {
    fn from(e: candle_core::Error) -> Self {
        Error::Embedder(e.to_string())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
