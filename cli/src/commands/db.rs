//! The database, opened directly, or through the daemon that holds it.

use anyhow::{bail, Result};
use memagent_store::{MemoryVersion, Store, GENERAL};
use serde_json::{json, Value};

use super::client::{query_escape, DaemonClient};
use crate::settings::Settings;

pub enum Db {
    Local(Store),
    Daemon(DaemonClient),
}

impl Db {
    /// Opens the data directory's database; when a daemon holds it, talks to the daemon.
    pub fn open(global: &Settings) -> Result<Self> {
        let dir = global.data_dir()?;
        tracing::debug!("data directory {}", dir.display());
        match global.open_store() {
            Ok(store) => Ok(Self::Local(store)),
            Err(e) if matches!(e.downcast_ref(), Some(memagent_store::Error::InUse { .. })) => {
                match DaemonClient::connect(&dir) {
                    Some(client) => {
                        tracing::debug!(
                            "the daemon holds the database; using {}",
                            client.socket().display()
                        );
                        Ok(Self::Daemon(client))
                    }
                    None => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// The store itself, for commands the daemon does not serve.
    pub fn local(self, what: &str) -> Result<Store> {
        match self {
            Self::Local(store) => Ok(store),
            Self::Daemon(client) => bail!(
                "{what} needs the database to itself, and the daemon ({}) holds it; \
                 stop the daemon first",
                client.socket().display()
            ),
        }
    }

    pub fn stream_rows(&self) -> Result<Vec<Value>> {
        match self {
            Self::Local(store) => Ok(memagent_watcher::stream_rows(store)?),
            Self::Daemon(client) => Ok(serde_json::from_value(client.get("/v1/streams")?)?),
        }
    }

    pub fn remove_stream(&self, stream: &str) -> Result<()> {
        match self {
            Self::Local(store) => {
                let id = store.require(stream)?.id;
                store.remove_stream(stream)?;
                // Its passages go too (no embedder needed to delete).
                memagent_recall::Recall::open(&memagent_memory::index_dir(store.path()), None)?
                    .reset(Some(id))?;
            }
            Self::Daemon(client) => {
                client.delete(&format!("/v1/streams?stream={}", query_escape(stream)))?;
            }
        }
        Ok(())
    }

    /// A memory version (the latest without `at`), or an error that says what to do.
    pub fn version_at(&self, stream: &str, at: Option<u64>) -> Result<MemoryVersion> {
        let store = match self {
            Self::Local(store) => store,
            Self::Daemon(client) => {
                let mut path = format!("/v1/memory?stream={}", query_escape(stream));
                if let Some(v) = at {
                    path.push_str(&format!("&at={v}"));
                }
                return Ok(serde_json::from_value(client.get(&path)?)?);
            }
        };
        version_at(store, stream, at)
    }

    /// A memory version as JSON with each line's source under `sources`
    /// ([`memagent_memory::line_sources`]); `recall` opens the passage index when the
    /// database is local.
    pub fn version_with_sources(
        &self,
        stream: &str,
        at: Option<u64>,
        recall: impl FnOnce(&Store) -> Result<memagent_recall::Recall>,
    ) -> Result<Value> {
        match self {
            Self::Local(store) => {
                let v = version_at(store, stream, at)?;
                let recall = recall(store)?;
                let sources =
                    memagent_memory::line_sources(store, &recall, &store.require(stream)?, &v)?;
                let mut body = serde_json::to_value(&v)?;
                body["sources"] = serde_json::to_value(sources)?;
                Ok(body)
            }
            Self::Daemon(client) => {
                let mut path = format!("/v1/memory?stream={}&sources=true", query_escape(stream));
                if let Some(v) = at {
                    path.push_str(&format!("&at={v}"));
                }
                client.get(&path)
            }
        }
    }

    pub fn versions(&self, stream: &str) -> Result<Vec<MemoryVersion>> {
        match self {
            Self::Local(store) => Ok(store.versions(&store.require(stream)?, GENERAL)?),
            Self::Daemon(client) => Ok(serde_json::from_value(
                client.get(&format!("/v1/history?stream={}", query_escape(stream)))?,
            )?),
        }
    }

    /// Adds a version (an edit or a rollback); it gets the next number.
    pub fn add_version(&self, stream: &str, version: MemoryVersion) -> Result<MemoryVersion> {
        match self {
            Self::Local(store) => {
                Ok(store.add_version(&store.require(stream)?, GENERAL, version)?)
            }
            Self::Daemon(client) => Ok(serde_json::from_value(client.post(
                "/v1/memory",
                &json!({ "stream": stream, "version": version }),
            )?)?),
        }
    }
}

/// A memory version of a stream in `store` (the latest without `at`), or an error that
/// says what to do.
pub fn version_at(store: &Store, stream: &str, at: Option<u64>) -> Result<MemoryVersion> {
    memagent_memory::version_at(store, stream, at).map_err(memory_error)
}

/// `memory`'s error, with what to do where the user can do something.
pub fn memory_error(e: memagent_memory::Error) -> anyhow::Error {
    match e {
        memagent_memory::Error::NoMemory {
            stream,
            at: Some(v),
        } => anyhow::anyhow!(
            "stream `{stream}` has no memory version {v}; `memctl memory history {stream}` lists them"
        ),
        memagent_memory::Error::NoMemory { stream, at: None } => anyhow::anyhow!(
            "stream `{stream}` has no memory yet; run `memctl ingest {stream}` to read its content"
        ),
        e => e.into(),
    }
}
