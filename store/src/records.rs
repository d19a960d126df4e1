//! The records of the database (see `docs/storage.md` for the layout).

use serde::{Deserialize, Serialize};

/// Chain of the general (query-agnostic) memory of a stream.
pub const GENERAL: u64 = 0;

/// A stream: an append-only log of text and the memories built from it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StreamRecord {
    pub id: u64,
    pub name: String,
    /// Seconds since the Unix epoch.
    pub created: u64,
    /// Bytes in the content log.
    pub log_len: u64,
}

/// What was taken from one source (a file, or standard input), so that ingesting it
/// again appends only what is new.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceRecord {
    pub name: String,
    /// Bytes of the source appended so far.
    pub bytes: u64,
    /// sha256 of those bytes.
    pub sha256: [u8; 32],
    /// Times the source was appended whole again (rewritten, or `--force`).
    pub revisions: u32,
}

/// A chunk of the content log, as consumed by a memory chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkRecord {
    pub index: u64,
    /// Byte range of the content log.
    pub start: u64,
    pub end: u64,
    pub tokens: u32,
    pub sha256: [u8; 32],
}

/// Who wrote a memory version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Author {
    Model,
    Person { name: String },
}

/// One state of a memory: version n of a chain.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MemoryVersion {
    pub version: u64,
    pub parent: Option<u64>,
    pub text: String,
    pub tokens: u32,
    /// The chunk this version consumed (none for edits and rollbacks).
    pub chunk: Option<u64>,
    pub model: String,
    pub model_sha256: String,
    pub template_id: String,
    pub template_version: u32,
    /// Seconds since the Unix epoch.
    pub created: u64,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub seconds: f64,
    /// The memory reached the cap M and was cut there.
    pub cut: bool,
    pub author: Author,
}

/// How far a memory chain has read its stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Cursor {
    /// Index of the next chunk to consume.
    pub next_chunk: u64,
    /// Byte offset in the content log where the next chunk starts.
    pub offset: u64,
    /// Latest memory version of the chain (0 = none yet).
    pub version: u64,
}

/// A question with its own memory chain (a deep query), so that asking it again reads
/// only chunks that arrived since.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QuestionRecord {
    pub chain: u64,
    pub question: String,
}

/// The answer to a standing question (`ask` in a watch) from one memory version.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StandingAnswer {
    pub question: String,
    /// The memory version it was answered from.
    pub version: u64,
    /// The model's reply.
    pub answer: String,
    /// Unix seconds.
    pub created: u64,
    pub seconds: f64,
}

/// A file the daemon watches: how far it was read and how to recognise it again.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FileRecord {
    /// The file's path when it was last read.
    pub path: String,
    /// The stream its content goes to.
    pub stream: String,
    /// Identity: device and inode numbers (a rename keeps them).
    pub dev: u64,
    pub ino: u64,
    /// Bytes of the file taken so far (a chat log: up to its last complete line).
    pub offset: u64,
    /// sha256 of those bytes, to tell an append from a rewrite.
    pub sha256: [u8; 32],
    /// Lines taken so far (chat logs), for line numbers in messages.
    pub lines: u64,
    /// Times the file was rewritten and taken whole again.
    pub revisions: u32,
}

/// Where a piece of a stream's log came from: the appended bytes at this record's key
/// start at line `first_line` of `source`. Chat logs rendered as turns list each turn's
/// offset in the piece with its line (`turns`); otherwise lines are counted in the log.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct SegmentRecord {
    pub source: String,
    pub first_line: u64,
    pub turns: Vec<(u64, u64)>,
}

/// A daemon's lease on a stream's memory steps (see [`crate::Store::take_leases`]):
/// `owner` alone commits steps of `stream` until `expires_ms` (the database's clock),
/// and only while `epoch` is the lease's latest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    pub stream: u64,
    pub owner: String,
    pub epoch: u64,
    pub expires_ms: u64,
}
