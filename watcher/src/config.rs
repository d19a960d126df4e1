//! What the daemon watches (`[[watch]]` in the configuration file) and how it runs.

use std::path::{Path, PathBuf};
use std::time::Duration;

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// How a watched file's bytes become text.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WatchFormat {
    /// From the extension: `.jsonl` is chat-jsonl, `.md` markdown, else text.
    #[default]
    Auto,
    Text,
    Markdown,
    /// One OpenAI-style message (`{"role": …, "content": …}`) per line.
    ChatJsonl,
}

impl WatchFormat {
    /// The format of the file at `path`: `Auto` resolved by extension.
    pub fn resolve(self, path: &Path) -> Self {
        if self != Self::Auto {
            return self;
        }
        match path.extension().and_then(|e| e.to_str()) {
            Some(e) if e.eq_ignore_ascii_case("jsonl") => Self::ChatJsonl,
            Some(e) if e.eq_ignore_ascii_case("md") || e.eq_ignore_ascii_case("markdown") => {
                Self::Markdown
            }
            _ => Self::Text,
        }
    }
}

/// One `[[watch]]` entry: a file or folder the daemon feeds into streams.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct WatchConfig {
    /// An absolute path to a file or a folder.
    pub path: PathBuf,
    /// The stream everything goes to; without it, one stream per file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<String>,
    #[serde(default)]
    pub format: WatchFormat,
    /// Glob patterns (relative to `path`) of files to take; empty takes all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Glob patterns of files to leave out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Descend into subfolders.
    #[serde(default = "yes")]
    pub recursive: bool,
    /// Standing questions: answered from each new memory version of this watch's streams
    /// and stored with the version.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ask: Vec<String>,
}

fn yes() -> bool {
    true
}

/// Checks `[[watch]]` entries; errors name the key (`watch[1].stream`).
pub fn validate_watches(watches: &[WatchConfig]) -> Result<()> {
    let bad = |key: String, reason: String| Error::Config { key, reason };
    for (i, watch) in watches.iter().enumerate() {
        if !watch.path.is_absolute() {
            return Err(bad(
                format!("watch[{i}].path"),
                format!("`{}` must be an absolute path", watch.path.display()),
            ));
        }
        if let Some(stream) = &watch.stream {
            if stream.is_empty() || stream.chars().any(char::is_control) {
                return Err(bad(
                    format!("watch[{i}].stream"),
                    format!("`{stream}` is not a valid stream name"),
                ));
            }
        }
        for (key, globs) in [("include", &watch.include), ("exclude", &watch.exclude)] {
            for (j, glob) in globs.iter().enumerate() {
                if let Err(e) = Glob::new(glob) {
                    return Err(bad(
                        format!("watch[{i}].{key}[{j}]"),
                        format!("`{glob}` is not a glob: {e}"),
                    ));
                }
            }
        }
        for (j, question) in watch.ask.iter().enumerate() {
            if question.trim().is_empty() {
                return Err(bad(
                    format!("watch[{i}].ask[{j}]"),
                    "a standing question cannot be empty".to_string(),
                ));
            }
        }
        if let Some(first) = watches[..i].iter().position(|w| w.path == watch.path) {
            return Err(bad(
                format!("watch[{i}].path"),
                format!(
                    "`{}` is watched already by watch[{first}]",
                    watch.path.display()
                ),
            ));
        }
    }
    Ok(())
}

/// A watch with its globs compiled.
#[derive(Debug, Clone)]
pub(crate) struct Watch {
    pub config: WatchConfig,
    include: Option<GlobSet>,
    exclude: GlobSet,
}

fn globset(globs: &[String]) -> Result<GlobSet> {
    let mut builder = GlobSetBuilder::new();
    for glob in globs {
        builder.add(Glob::new(glob).map_err(|e| Error::Config {
            key: "watch".into(),
            reason: format!("`{glob}`: {e}"),
        })?);
    }
    builder.build().map_err(|e| Error::Config {
        key: "watch".into(),
        reason: e.to_string(),
    })
}

impl Watch {
    pub fn new(config: WatchConfig) -> Result<Self> {
        Ok(Self {
            include: if config.include.is_empty() {
                None
            } else {
                Some(globset(&config.include)?)
            },
            exclude: globset(&config.exclude)?,
            config,
        })
    }

    /// The stream for the file at `path`, when this watch takes it.
    pub fn stream_for(&self, path: &Path) -> Option<String> {
        let root = &self.config.path;
        let rel = if path == root {
            Path::new(path.file_name()?)
        } else {
            path.strip_prefix(root).ok()?
        };
        if !self.config.recursive && rel.components().count() > 1 {
            return None;
        }
        // Hidden files and editors' temporary files: an atomic save renames them over
        // the real file, which is then read.
        let name = rel.file_name()?.to_str()?;
        let temporary = name.ends_with('~')
            || name.ends_with(".swp")
            || name.ends_with(".tmp")
            || name.ends_with(".part");
        if temporary
            || rel
                .components()
                .any(|c| c.as_os_str().to_str().is_none_or(|s| s.starts_with('.')))
        {
            return None;
        }
        if self.include.as_ref().is_some_and(|set| !set.is_match(rel)) || self.exclude.is_match(rel)
        {
            return None;
        }
        Some(match &self.config.stream {
            Some(stream) => stream.clone(),
            None => rel.to_string_lossy().into_owned(),
        })
    }
}

/// How the daemon runs.
#[derive(Debug, Clone)]
pub struct DaemonOptions {
    pub watches: Vec<WatchConfig>,
    /// A stream with a partial chunk pending is read after this long without new content.
    pub idle: Duration,
    /// Full rescans of every watch, as a safety net for lost events.
    pub rescan: Duration,
    /// Events for a path are handled once it has been quiet this long.
    pub settle: Duration,
    /// An optional TCP listener (loopback unless configured otherwise) with its token.
    pub tcp: Option<TcpOptions>,
    /// The OpenAI-compatible proxy that remembers, when configured.
    pub proxy: Option<ProxyOptions>,
    /// A write to the store through the API or the proxy that has not finished after
    /// this long is reported as failed (not acknowledged), and the store as degraded.
    pub write_timeout: Duration,
    /// After SIGTERM or SIGINT the daemon exits within this long, whatever the store is
    /// doing; a second signal exits at once.
    pub stop_timeout: Duration,
    /// This daemon's name in the leases of a database shared with other daemons.
    pub name: String,
    /// How long a stream's lease lasts unless renewed (a shared database): a daemon
    /// that dies leaves its streams to the others after this long.
    pub lease: Duration,
    /// Whether the model reads a stream's newest passages ahead while idle, once they are
    /// indexed, so that requests ranking passages again find them read.
    pub read_ahead: bool,
    /// Passages a `/v1/query` that does not say ranks again ([`memagent_memory::rerank`]).
    pub rerank: usize,
}

#[derive(Debug, Clone)]
pub struct ProxyOptions {
    pub addr: std::net::SocketAddr,
    /// Requests must carry `Authorization: Bearer <token>` (the OpenAI clients' API key).
    pub token: String,
    /// The OpenAI-compatible server requests go on to (its base URL, e.g.
    /// `http://localhost:8000/v1`); without one the daemon's own model answers.
    pub upstream: Option<String>,
    /// The key sent to the upstream as its bearer token.
    pub upstream_key: Option<String>,
    /// The best this many passages found for a request's latest user message are ranked
    /// again by the daemon model's likelihood of it ([`memagent_memory::rerank`]) before
    /// the best go in; 0 keeps the search's order.
    pub rerank: usize,
}

#[derive(Debug, Clone)]
pub struct TcpOptions {
    pub addr: std::net::SocketAddr,
    /// Requests must carry `Authorization: Bearer <token>`.
    pub token: String,
}

impl Default for DaemonOptions {
    fn default() -> Self {
        Self {
            watches: Vec::new(),
            idle: Duration::from_secs(30),
            rescan: Duration::from_secs(60),
            settle: Duration::from_millis(200),
            proxy: None,
            tcp: None,
            write_timeout: Duration::from_secs(30),
            stop_timeout: Duration::from_secs(10),
            name: default_name(),
            lease: Duration::from_secs(30),
            read_ahead: false,
            rerank: 0,
        }
    }
}

/// A daemon's default name in leases: its machine's host name and its process id.
pub fn default_name() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string());
    format!("{host}:{}", std::process::id())
}

/// The daemon's socket in a data directory.
pub fn socket_path(data_dir: &Path) -> PathBuf {
    data_dir.join("memagent.sock")
}
