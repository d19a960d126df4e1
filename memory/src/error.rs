/// Errors of memory: the store's, the model's and the index's, each as it said it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error(transparent)]
    Store(#[from] memagent_store::Error),
    #[error("model: {0}")]
    Agent(#[from] memagent_agent::Error),
    /// A failure shared by every step of a batch, said once for each.
    #[error("model: {0}")]
    Model(String),
    #[error("{0}")]
    Recall(#[from] memagent_recall::Error),
    /// The stream has no memory version `at` (the latest: none yet).
    #[error("{}", no_memory(stream, *at))]
    NoMemory { stream: String, at: Option<u64> },
    #[error("invalid request: {0}")]
    InvalidRequest(String),
}

fn no_memory(stream: &str, at: Option<u64>) -> String {
    match at {
        Some(v) => format!("stream `{stream}` has no memory version {v}"),
        None => format!("stream `{stream}` has no memory yet"),
    }
}

impl From<memagent_engine::Error> for Error {
    fn from(e: memagent_engine::Error) -> Self {
        Self::Agent(e.into())
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
