/// Errors of the memory agent: requests it cannot serve, budgets that do not fit, the
/// remote backend, and the local model underneath.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("token budget: {0}")]
    Budget(String),
    #[error("remote backend: {0}")]
    Remote(String),
    #[error("remote backend: {url} answered {status}: {message}")]
    RemoteStatus {
        url: String,
        status: u16,
        message: String,
    },
    #[error(transparent)]
    Engine(#[from] memagent_engine::Error),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
