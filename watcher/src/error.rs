use std::path::PathBuf;

/// Errors of the daemon's set-up; once it runs, problems with single files are logged
/// and never stop it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{key}: {reason}")]
    Config { key: String, reason: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot watch files: {0}")]
    Notify(#[from] notify::Error),
    #[error("stopping: {0}")]
    Stopping(String),
    #[error(transparent)]
    Store(#[from] memagent_store::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
