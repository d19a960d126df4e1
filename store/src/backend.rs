//! What a database behind [`crate::Store`] provides: the embedded sled database
//! ([`crate::embedded`]) or PostgreSQL ([`crate::postgres`]). Every method keeps the
//! store's guarantees: an append is durable before it returns, a memory step's version,
//! chunk and cursor are committed together, and a failed write leaves nothing half done.

use crate::records::{
    ChunkRecord, Cursor, FileRecord, Lease, MemoryVersion, QuestionRecord, SegmentRecord,
    SourceRecord, StandingAnswer, StreamRecord,
};
use crate::{Appended, Changes, ExportRecord, Result, Space};

/// A database the store keeps its records in.
pub trait Backend: Send + Sync {
    /// Where the records are, for messages: a directory or a server.
    fn location(&self) -> String;
    /// Whether other processes may share the records (and leases matter).
    fn shared(&self) -> bool;
    /// Bytes the records take where the backend can tell (0 where it cannot).
    fn size_on_disk(&self) -> Result<u64>;
    /// Free space on the local data directory against the reserve writes keep.
    fn space(&self) -> Result<Space>;
    fn set_reserve(&self, bytes: u64);
    /// Ok when a write of about `bytes` would leave the reserve free.
    fn make_room(&self, bytes: u64) -> Result<()>;
    fn flush(&self) -> Result<()>;

    fn stream(&self, name: &str) -> Result<Option<StreamRecord>>;
    fn streams(&self) -> Result<Vec<StreamRecord>>;
    /// The streams with text their general memory has not read, with where that memory
    /// has read to, by name.
    fn unread(&self) -> Result<Vec<(StreamRecord, u64)>> {
        let mut unread = Vec::new();
        for stream in self.streams()? {
            let offset = self.cursor(&stream, crate::GENERAL)?.offset;
            if offset < stream.log_len {
                unread.push((stream, offset));
            }
        }
        Ok(unread)
    }
    /// The latest change number (see [`crate::Store::change_mark`]); `None` by default:
    /// no change feed.
    fn change_mark(&self) -> Result<Option<u64>> {
        Ok(None)
    }
    /// What changed after change number `after` (see [`crate::Store::changes`]).
    fn changes(&self, _after: u64) -> Result<Option<Changes>> {
        Ok(None)
    }
    /// The stream, created empty if it does not exist (the name is already checked).
    fn create_stream(&self, name: &str) -> Result<StreamRecord>;
    /// Deletes a stream with every record it has; `Error::NoStream` when none is named so.
    fn remove_stream(&self, name: &str) -> Result<()>;

    /// Commit 1 (see [`crate::Store::append_turns`]).
    fn append_turns(
        &self,
        stream: &str,
        bytes: &[u8],
        source: Option<&str>,
        force: bool,
        turns: Vec<(u64, u64)>,
    ) -> Result<Appended>;
    /// Commit 1 for a watched file (see [`crate::Store::append_file`]).
    fn append_file(
        &self,
        text: &[u8],
        file: &FileRecord,
        renamed_from: Option<&str>,
        segment: &SegmentRecord,
    ) -> Result<Appended>;
    fn segment_at(
        &self,
        stream: &StreamRecord,
        offset: u64,
    ) -> Result<Option<(u64, SegmentRecord)>>;
    fn files(&self) -> Result<Vec<FileRecord>>;
    /// Bytes `[from, to)` of a stream's log, `to` at most its committed length.
    fn read_log(&self, stream: &StreamRecord, from: u64, to: u64) -> Result<Vec<u8>>;

    fn cursor(&self, stream: &StreamRecord, chain: u64) -> Result<Cursor>;
    /// Commit 2 (see [`crate::Store::commit_step`]); under `lease`, refused with
    /// `Error::Fenced` unless the lease is still its owner's, unexpired, at its epoch.
    fn commit_step(
        &self,
        stream: &StreamRecord,
        chain: u64,
        chunk: &ChunkRecord,
        version: &MemoryVersion,
        cursor: &Cursor,
        lease: Option<&Lease>,
    ) -> Result<()>;

    /// Leases for `owner` on up to `max` streams with text their general memory has not
    /// read, free or expired, each for `ttl_ms` (see [`crate::Store::take_leases`]).
    fn take_leases(
        &self,
        owner: &str,
        max: usize,
        ttl_ms: u64,
        fresh_bytes: u64,
    ) -> Result<Vec<Lease>>;
    /// Each of `leases` again for `ttl_ms` more where it is still its owner's at its
    /// epoch, in one statement: those renewed.
    fn renew_leases(&self, leases: &[Lease], ttl_ms: u64) -> Result<Vec<Lease>>;
    /// Gives the lease up (nothing when it is no longer its owner's).
    fn release_lease(&self, lease: &Lease) -> Result<()>;
    /// Every lease, with the database's clock now (ms), for status.
    fn leases(&self) -> Result<(Vec<Lease>, u64)>;
    /// A version that consumed no chunk, numbered after the chain's latest.
    fn add_version(
        &self,
        stream: &StreamRecord,
        chain: u64,
        version: MemoryVersion,
    ) -> Result<MemoryVersion>;
    fn version(
        &self,
        stream: &StreamRecord,
        chain: u64,
        version: u64,
    ) -> Result<Option<MemoryVersion>>;
    /// Every version of a chain, oldest first; an unreadable one is an error.
    fn versions(&self, stream: &StreamRecord, chain: u64) -> Result<Vec<MemoryVersion>>;
    /// Versions of a chain from `first` on, oldest first, read lazily (an unreadable
    /// one is skipped).
    fn versions_from<'a>(
        &'a self,
        stream: &StreamRecord,
        chain: u64,
        first: u64,
    ) -> Result<Box<dyn Iterator<Item = MemoryVersion> + 'a>>;
    fn chunk(&self, stream: &StreamRecord, index: u64) -> Result<Option<ChunkRecord>>;
    fn chunks(&self, stream: &StreamRecord) -> Result<Vec<ChunkRecord>>;

    fn question_chain(&self, stream: &StreamRecord, question: &str) -> Result<QuestionRecord>;
    fn add_answer(&self, stream: &StreamRecord, answer: &StandingAnswer) -> Result<()>;
    fn answers(&self, stream: &StreamRecord) -> Result<Vec<StandingAnswer>>;
    fn questions(&self, stream: &StreamRecord) -> Result<Vec<QuestionRecord>>;

    /// What an export needs beyond the above: sources, every version with its chain,
    /// every cursor with its chain, every log piece's provenance with its offset.
    fn sources(&self, stream: &StreamRecord) -> Result<Vec<SourceRecord>>;
    fn all_versions(&self, stream: &StreamRecord) -> Result<Vec<(u64, MemoryVersion)>>;
    fn cursors(&self, stream: &StreamRecord) -> Result<Vec<(u64, Cursor)>>;
    fn segments(&self, stream: &StreamRecord) -> Result<Vec<(u64, SegmentRecord)>>;
    /// Writes an export's records (checked: the log's pieces follow each other, each
    /// answer after its question) into `stream`, just created and empty, and records
    /// its length and creation time.
    fn restore(
        &self,
        stream: &StreamRecord,
        created: u64,
        records: &[ExportRecord],
    ) -> Result<StreamRecord>;

    /// Overwrites one raw record, for tests of corruption handling (sled only).
    fn raw_insert(&self, tree: &str, key: &[u8], value: &[u8]) -> Result<()>;
}
