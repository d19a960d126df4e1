use std::path::PathBuf;

/// Errors of the store. Each names the stream, tree, key or version it is about.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("database {path} is in use by process {pid}; stop it or wait for it to finish")]
    InUse { path: PathBuf, pid: String },
    #[error("cannot use the data directory {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("corrupt record {tree}/{key}: {reason}")]
    Corrupt {
        tree: &'static str,
        key: String,
        reason: String,
    },
    #[error(
        "record {tree}/{key} has format version {version}, unknown to this memctl; \
         upgrade memagent"
    )]
    UnknownFormat {
        tree: &'static str,
        key: String,
        version: u8,
    },
    #[error("no stream named `{0}`; `memctl streams list` shows the streams")]
    NoStream(String),
    #[error("stream `{stream}` has no memory version {version}")]
    NoVersion { stream: String, version: u64 },
    #[error("invalid stream name `{0}`: use 1-128 characters, no control characters")]
    BadName(String),
    #[error(
        "no space to store {write} in {path}: {available} available, {reserve} kept free; \
         nothing was stored. Free space on that filesystem (`memctl streams rm` gives \
         back a stream's text) or lower `reserve_mb` in the config file"
    )]
    NoSpace {
        path: PathBuf,
        available: String,
        reserve: String,
        write: String,
    },
    #[error("import: {0}")]
    Import(String),
    #[error(transparent)]
    Schema(#[from] memagent_migrations::Error),
    #[error("database: {0}")]
    Disk(std::io::Error),
    #[error("database: {0}")]
    Sled(sled::Error),
    /// A memory step's commit under a lease that is no longer its owner's: it expired,
    /// or another daemon took the stream over. Nothing was written.
    #[error(
        "stream {stream}: the lease of `{owner}` (epoch {epoch}) expired or was taken \
         over; the step was not committed"
    )]
    Fenced {
        stream: u64,
        owner: String,
        epoch: u64,
    },
    /// PostgreSQL could not be reached or configured (the message names the server).
    #[error("PostgreSQL: {0}")]
    Database(String),
    #[error("PostgreSQL: {0}")]
    Postgres(#[from] tokio_postgres::Error),
}

impl From<sled::Error> for Error {
    fn from(e: sled::Error) -> Self {
        match e {
            // "No space left on device (os error 28)", not sled's debug form.
            sled::Error::Io(e) => Self::Disk(e),
            e => Self::Sled(e),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
