use std::path::PathBuf;

/// Errors of task and training-data generation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error(transparent)]
    Engine(#[from] memagent_engine::Error),
    #[error(transparent)]
    Agent(#[from] memagent_agent::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
