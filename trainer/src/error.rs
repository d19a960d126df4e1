use std::path::PathBuf;

/// Errors of training: configuration, data, checkpoints and the model.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("training configuration: {0}")]
    Config(String),
    #[error("checkpoint {path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
    #[error(transparent)]
    Engine(#[from] memagent_engine::Error),
    #[error(transparent)]
    Agent(#[from] memagent_agent::Error),
    #[error(transparent)]
    Tasks(#[from] memagent_tasks::Error),
    #[error(transparent)]
    Candle(#[from] candle_core::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |source| Error::Io {
        path: path.to_path_buf(),
        source,
    }
}
