//! The memagent store: streams, their append-only content logs, the chunks each memory
//! chain consumed, every memory version and each chain's cursor. Kept in the embedded
//! sled database by default ([`Store::open`]), or in PostgreSQL ([`Store::connect`]),
//! behind one [`Backend`] trait: the rest of memagent sees the same [`Store`].
//!
//! Ingestion commits twice per step and the two never disagree: new content is appended
//! and made durable before any model work ([`Store::append`]); then memory version n,
//! the chunk it consumed and the advanced cursor are committed in one transaction
//! ([`Store::commit_step`]). A restart resumes at the first unconsumed chunk. The store
//! only stores: it never runs a model, never searches and never prints; the names of
//! models and templates it keeps are plain text to it.
//!
//! ```no_run
//! use memagent_store::Store;
//!
//! let store = Store::open("/tmp/memagent-data".as_ref())?;
//! store.append("notes", b"Ada prefers tea.\n", None)?;
//! println!("{:?}", store.stream("notes")?);
//! # Ok::<(), memagent_store::Error>(())
//! ```

mod backend;
mod codec;
mod embedded;
mod error;
mod logs;
pub mod postgres;
mod records;
mod space;
mod transfer;

use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};

pub use backend::Backend;
pub use codec::show_key;
pub use error::{Error, Result};
pub use records::{
    Author, ChunkRecord, Cursor, FileRecord, Lease, MemoryVersion, QuestionRecord, SegmentRecord,
    SourceRecord, StandingAnswer, StreamRecord, GENERAL,
};
pub use space::{Space, DEFAULT_RESERVE};
pub use transfer::{ExportRecord, EXPORT_FORMAT};

/// What an append did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// Bytes added to the log (0 when the source had nothing new).
    pub bytes: u64,
    /// The source was appended whole again (it was rewritten, or forced).
    pub revision: bool,
    pub log_len: u64,
}

/// What changed in the streams' logs after a change number (see [`Store::changes`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Changes {
    /// The streams whose log was written after the number, by name.
    pub streams: Vec<StreamRecord>,
    /// Ids of the streams removed after it.
    pub removed: Vec<u64>,
    /// The latest change number read: where the next call starts.
    pub through: u64,
}

/// An open store: the embedded database in a data directory, or a PostgreSQL database
/// with the data directory for what each daemon derives locally.
pub struct Store {
    backend: Box<dyn Backend>,
    path: PathBuf,
}

/// Takes the data directory's lock file, writing our process id into it; a held lock
/// is an error naming the process that holds it. One process uses a data directory at a
/// time, whichever the backend: its search index and socket are that process's.
pub(crate) fn lock_dir(dir: &Path) -> Result<File> {
    let path = dir.join("lock");
    let io = |source| Error::Io {
        path: path.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(io)?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            return Err(Error::InUse {
                path: dir.to_path_buf(),
                pid: if pid.is_empty() {
                    "unknown".into()
                } else {
                    pid.into()
                },
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(io(e)),
    }
    file.set_len(0).map_err(io)?;
    file.rewind().map_err(io)?;
    write!(file, "{}", std::process::id()).map_err(io)?;
    file.sync_all().map_err(io)?;
    Ok(file)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

impl Store {
    /// Opens (or creates) the embedded database in `dir`, upgrading its schema if it is
    /// older. One process at a time: a second open is an error naming the first.
    pub fn open(dir: &Path) -> Result<Self> {
        Ok(Self {
            backend: Box::new(embedded::SledStore::open(dir)?),
            path: dir.to_path_buf(),
        })
    }

    /// Opens the store `database` names: a `postgres://` or `postgresql://` URL (see
    /// [`postgres`]), else the embedded database in `dir`. `dir` is the data directory
    /// either way (the search index and the daemon's files live there).
    pub fn open_with(dir: &Path, database: Option<&str>) -> Result<Self> {
        match database {
            Some(url) => Self::connect(url, dir),
            None => Self::open(dir),
        }
    }

    /// Connects to PostgreSQL at `url`, applying the schema's migrations, with `dir` as
    /// the local data directory.
    pub fn connect(url: &str, dir: &Path) -> Result<Self> {
        Ok(Self {
            backend: Box::new(postgres::PgStore::connect(url, dir)?),
            path: dir.to_path_buf(),
        })
    }

    /// The local data directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the records are: the data directory, or the PostgreSQL server.
    pub fn location(&self) -> String {
        self.backend.location()
    }

    /// Whether other processes may share the records: PostgreSQL. Daemons sharing them
    /// step a stream only under its lease.
    pub fn is_shared(&self) -> bool {
        self.backend.shared()
    }

    /// Bytes the database takes on disk.
    pub fn size_on_disk(&self) -> Result<u64> {
        self.backend.size_on_disk()
    }

    /// Free space on the data directory's filesystem against the reserve writes keep.
    pub fn space(&self) -> Result<Space> {
        self.backend.space()
    }

    /// Bytes of free space every write leaves on the data directory's filesystem
    /// ([`DEFAULT_RESERVE`] unless set): a write that would leave less is refused with
    /// [`Error::NoSpace`] before anything is written, so the database never meets a
    /// full disk in the middle of a commit. Reads and [`Store::remove_stream`] are never
    /// refused.
    pub fn set_reserve(&self, bytes: u64) {
        self.backend.set_reserve(bytes);
    }

    /// Ok when a write of about `bytes` would leave the reserve free, else
    /// [`Error::NoSpace`]: for work that ends in a write (a memory step) to be refused
    /// before it starts.
    pub fn make_room(&self, bytes: u64) -> Result<()> {
        self.backend.make_room(bytes)
    }

    pub fn flush(&self) -> Result<()> {
        self.backend.flush()
    }

    pub fn stream(&self, name: &str) -> Result<Option<StreamRecord>> {
        self.backend.stream(name)
    }

    /// The stream, or an error naming it.
    pub fn require(&self, name: &str) -> Result<StreamRecord> {
        self.stream(name)?
            .ok_or_else(|| Error::NoStream(name.to_string()))
    }

    pub fn streams(&self) -> Result<Vec<StreamRecord>> {
        self.backend.streams()
    }

    /// The streams with text their general memory has not read, with the offset that
    /// memory has read to, by name (one query on PostgreSQL, whatever the number of
    /// streams).
    pub fn unread(&self) -> Result<Vec<(StreamRecord, u64)>> {
        self.backend.unread()
    }

    /// The number of the latest change to any stream's log (an append, an import, a
    /// removal), where a change feed starts; `None` where the database keeps no such
    /// numbers (the embedded one: one process writes it, and knows what it wrote).
    pub fn change_mark(&self) -> Result<Option<u64>> {
        self.backend.change_mark()
    }

    /// The streams written and removed after change number `after` (one indexed query
    /// each, however many streams are stored); `None` where the database keeps no
    /// change numbers. A write numbered before another can commit after it: a caller
    /// that must see every write reads every stream now and then.
    pub fn changes(&self, after: u64) -> Result<Option<Changes>> {
        self.backend.changes(after)
    }

    /// Whether `name` can name a stream: 1 to 128 characters, none a control character.
    pub fn check_name(name: &str) -> Result<()> {
        if name.is_empty() || name.chars().count() > 128 || name.chars().any(char::is_control) {
            return Err(Error::BadName(name.to_string()));
        }
        Ok(())
    }

    /// The stream, created empty if it does not exist.
    pub fn create_stream(&self, name: &str) -> Result<StreamRecord> {
        Self::check_name(name)?;
        self.backend.create_stream(name)
    }

    /// Deletes a stream with its log, chunks, memories and cursors.
    pub fn remove_stream(&self, name: &str) -> Result<()> {
        self.backend.remove_stream(name)
    }

    /// Commit 1: appends `bytes` to the stream's log (creating the stream), durably.
    ///
    /// With a `source` name, the source's whole current content is `bytes`: only what
    /// follows the part appended before is added, when that part is unchanged (same
    /// sha256); a changed source is appended whole as a new revision. `force` appends it
    /// whole regardless.
    pub fn append(&self, stream: &str, bytes: &[u8], source: Option<&str>) -> Result<Appended> {
        self.append_with(stream, bytes, source, false)
    }

    pub fn append_with(
        &self,
        stream: &str,
        bytes: &[u8],
        source: Option<&str>,
        force: bool,
    ) -> Result<Appended> {
        self.append_turns(stream, bytes, source, force, Vec::new())
    }

    /// [`Store::append_with`] for text rendered from a source whose lines are not the
    /// text's (a chat log): `turns` gives, for each turn, its offset in the new text and
    /// its line in the source, recorded as the text's provenance.
    pub fn append_turns(
        &self,
        stream: &str,
        bytes: &[u8],
        source: Option<&str>,
        force: bool,
        turns: Vec<(u64, u64)>,
    ) -> Result<Appended> {
        Self::check_name(stream)?;
        self.backend
            .append_turns(stream, bytes, source, force, turns)
    }

    /// Commit 1 for a watched file: appends `text` to the log of `file.stream` and
    /// records how far the file was read, in one transaction. A rename (`renamed_from`)
    /// moves the file's record to its new path in the same transaction; `segment` says
    /// where in the file the text starts.
    pub fn append_file(
        &self,
        text: &[u8],
        file: &FileRecord,
        renamed_from: Option<&str>,
        segment: &SegmentRecord,
    ) -> Result<Appended> {
        Self::check_name(&file.stream)?;
        self.backend.append_file(text, file, renamed_from, segment)
    }

    /// The provenance record of the log piece holding byte `offset` of a stream, with
    /// the offset where that piece starts; `None` for text appended without a source.
    pub fn segment_at(
        &self,
        stream: &StreamRecord,
        offset: u64,
    ) -> Result<Option<(u64, SegmentRecord)>> {
        self.backend.segment_at(stream, offset)
    }

    /// Every watched file the database knows, by path.
    pub fn files(&self) -> Result<Vec<FileRecord>> {
        self.backend.files()
    }

    /// Bytes `[from, to)` of a stream's content log (up to its committed length).
    pub fn read_log(&self, stream: &StreamRecord, from: u64, to: u64) -> Result<Vec<u8>> {
        self.backend.read_log(stream, from, to.min(stream.log_len))
    }

    pub fn cursor(&self, stream: &StreamRecord, chain: u64) -> Result<Cursor> {
        self.backend.cursor(stream, chain)
    }

    /// Commit 2: memory version `version.version`, the chunk it consumed and the advanced
    /// cursor, in one transaction.
    pub fn commit_step(
        &self,
        stream: &StreamRecord,
        chain: u64,
        chunk: &ChunkRecord,
        version: &MemoryVersion,
        cursor: &Cursor,
    ) -> Result<()> {
        self.backend
            .commit_step(stream, chain, chunk, version, cursor, None)
    }

    /// [`Store::commit_step`] under `lease`: refused with [`Error::Fenced`], writing
    /// nothing, unless the lease is still its owner's, unexpired and at its epoch when the
    /// transaction commits. A daemon paused past its lease cannot write a stale version.
    pub fn commit_step_under(
        &self,
        lease: &Lease,
        stream: &StreamRecord,
        chain: u64,
        chunk: &ChunkRecord,
        version: &MemoryVersion,
        cursor: &Cursor,
    ) -> Result<()> {
        self.backend
            .commit_step(stream, chain, chunk, version, cursor, Some(lease))
    }

    /// Leases for `owner` (a daemon's name) on up to `max` streams whose general memory
    /// has text left to read and whose lease is free or expired, each for `ttl_ms`: the
    /// streams a daemon may step. Daemons sharing a database take different streams
    /// (rows another is taking are skipped, not waited for); taking an expired lease
    /// raises its epoch, which fences the old owner's commits. The embedded database has
    /// one process, whose leases never end.
    ///
    /// New text goes ahead of backlog across daemons as it does in one: streams with at
    /// most `fresh_bytes` unread (a conversation's next turns) are leased before streams
    /// with more (a folder of old notes); within each, the stream held least recently
    /// first, so backlogs take turns.
    pub fn take_leases(
        &self,
        owner: &str,
        max: usize,
        ttl_ms: u64,
        fresh_bytes: u64,
    ) -> Result<Vec<Lease>> {
        self.backend.take_leases(owner, max, ttl_ms, fresh_bytes)
    }

    /// Renews a lease for `ttl_ms` from now; `None` when it is lost (expired and taken,
    /// or released).
    pub fn renew_lease(&self, lease: &Lease, ttl_ms: u64) -> Result<Option<Lease>> {
        Ok(self
            .renew_leases(std::slice::from_ref(lease), ttl_ms)?
            .pop())
    }

    /// Renews `leases` for `ttl_ms` from now, in one statement: those still held,
    /// renewed, by stream id (a lost one is left out).
    pub fn renew_leases(&self, leases: &[Lease], ttl_ms: u64) -> Result<Vec<Lease>> {
        match leases.is_empty() {
            true => Ok(Vec::new()),
            false => self.backend.renew_leases(leases, ttl_ms),
        }
    }

    /// Gives a lease up, so that another daemon may take the stream at once.
    pub fn release_lease(&self, lease: &Lease) -> Result<()> {
        self.backend.release_lease(lease)
    }

    /// Every lease, and the database's clock (ms since 1970) to judge them by.
    pub fn leases(&self) -> Result<(Vec<Lease>, u64)> {
        self.backend.leases()
    }

    /// Adds a version that consumed no chunk (an edit or a rollback); the cursor keeps its
    /// place and records the new latest version.
    pub fn add_version(
        &self,
        stream: &StreamRecord,
        chain: u64,
        version: MemoryVersion,
    ) -> Result<MemoryVersion> {
        self.backend.add_version(stream, chain, version)
    }

    pub fn version(
        &self,
        stream: &StreamRecord,
        chain: u64,
        version: u64,
    ) -> Result<Option<MemoryVersion>> {
        self.backend.version(stream, chain, version)
    }

    /// The latest version of a chain, if any.
    pub fn latest(&self, stream: &StreamRecord, chain: u64) -> Result<Option<MemoryVersion>> {
        match self.cursor(stream, chain)?.version {
            0 => Ok(None),
            n => self.version(stream, chain, n),
        }
    }

    /// Every version of a chain, oldest first.
    pub fn versions(&self, stream: &StreamRecord, chain: u64) -> Result<Vec<MemoryVersion>> {
        self.backend.versions(stream, chain)
    }

    /// Chunk `index` of a stream.
    pub fn chunk(&self, stream: &StreamRecord, index: u64) -> Result<Option<ChunkRecord>> {
        self.backend.chunk(stream, index)
    }

    /// Versions of a chain from `first` on, oldest first, read lazily.
    pub fn versions_from(
        &self,
        stream: &StreamRecord,
        chain: u64,
        first: u64,
    ) -> Result<impl Iterator<Item = MemoryVersion> + '_> {
        self.backend.versions_from(stream, chain, first)
    }

    /// Every chunk of a stream, in order.
    pub fn chunks(&self, stream: &StreamRecord) -> Result<Vec<ChunkRecord>> {
        self.backend.chunks(stream)
    }

    /// The memory chain of `question` on a stream, registered on first use.
    pub fn question_chain(&self, stream: &StreamRecord, question: &str) -> Result<QuestionRecord> {
        self.backend.question_chain(stream, question)
    }

    /// Stores the answer to a standing question from one memory version (again for the
    /// same question and version replaces it).
    pub fn add_answer(&self, stream: &StreamRecord, answer: &StandingAnswer) -> Result<()> {
        self.backend.add_answer(stream, answer)
    }

    /// A stream's standing answers, by memory version, then by question.
    pub fn answers(&self, stream: &StreamRecord) -> Result<Vec<StandingAnswer>> {
        self.backend.answers(stream)
    }

    /// The questions of a stream with their chains.
    pub fn questions(&self, stream: &StreamRecord) -> Result<Vec<QuestionRecord>> {
        self.backend.questions(stream)
    }

    /// Raw access for tests of corruption handling: overwrites one record's bytes.
    #[doc(hidden)]
    pub fn raw_insert(&self, tree: &str, key: &[u8], value: &[u8]) -> Result<()> {
        self.backend.raw_insert(tree, key, value)
    }

    /// The general memory version whose step read byte `offset` of the stream's log.
    pub fn version_reading(&self, stream: &StreamRecord, offset: u64) -> Result<Option<u64>> {
        let cursor = self.cursor(stream, GENERAL)?;
        if offset >= cursor.offset {
            return Ok(None);
        }
        // The chunk holding the offset: chunks are consecutive byte ranges.
        let (mut lo, mut hi) = (0, cursor.next_chunk);
        while lo < hi {
            let mid = (lo + hi) / 2;
            match self.chunk(stream, mid)? {
                Some(c) if c.end <= offset => lo = mid + 1,
                _ => hi = mid,
            }
        }
        for v in self.versions_from(stream, GENERAL, lo + 1)? {
            if v.chunk == Some(lo) {
                return Ok(Some(v.version));
            }
        }
        Ok(None)
    }
}

/// What an append of a source's current content adds, from what was appended of it
/// before (see [`Store::append_turns`]).
pub(crate) struct Plan<'b> {
    /// The bytes to add to the log.
    pub new: &'b [u8],
    /// The source is appended whole again.
    pub revision: bool,
    /// The source's record after the append.
    pub source: Option<SourceRecord>,
    /// Where the new bytes came from; `None` when there are none.
    pub segment: Option<SegmentRecord>,
    /// Nothing to write: no new bytes and the same source record.
    pub unchanged: bool,
}

pub(crate) fn plan_append<'b>(
    bytes: &'b [u8],
    source: Option<&str>,
    previous: Option<&SourceRecord>,
    force: bool,
    turns: Vec<(u64, u64)>,
) -> Plan<'b> {
    let (new, revision) = match previous {
        Some(prev) if !force => {
            let seen = prev.bytes as usize;
            let unchanged =
                bytes.len() >= seen && Sha256::digest(&bytes[..seen]).as_slice() == prev.sha256;
            if unchanged {
                (&bytes[seen..], false)
            } else {
                (bytes, true)
            }
        }
        Some(_) => (bytes, true),
        None => (bytes, false),
    };
    let source_record = source.map(|name| SourceRecord {
        name: name.to_string(),
        bytes: bytes.len() as u64,
        sha256: Sha256::digest(bytes).into(),
        revisions: previous.map_or(0, |p| p.revisions) + u32::from(revision),
    });
    let unchanged = new.is_empty() && source_record.as_ref() == previous;
    // Text without a source gets an empty record, so that it is not taken for the
    // continuation of the piece before it.
    let segment = (!new.is_empty()).then(|| {
        let seen = bytes.len() - new.len();
        let newlines = bytes[..seen].iter().filter(|&&b| b == b'\n').count() as u64;
        SegmentRecord {
            source: source.unwrap_or_default().to_string(),
            first_line: newlines + 1,
            turns,
        }
    });
    Plan {
        new,
        revision,
        source: source_record,
        segment,
        unchanged,
    }
}

/// The most bytes one record of an export's log holds: a longer log is exported as
/// several records, each readable alone.
pub const LOG_PIECE: usize = 1 << 20;

/// `bytes` in pieces of at most [`LOG_PIECE`] bytes, each with its offset, cut before a
/// character's first byte (a log is UTF-8, and each piece stays readable alone).
fn log_pieces(bytes: &[u8]) -> impl Iterator<Item = (u64, &[u8])> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at >= bytes.len() {
            return None;
        }
        let mut end = (at + LOG_PIECE).min(bytes.len());
        // Back over continuation bytes (at most three in UTF-8) to a character's start.
        let mut back = end;
        while back < bytes.len() && back > at && end - back < 4 && bytes[back] & 0xC0 == 0x80 {
            back -= 1;
        }
        if back < bytes.len() && back > at && bytes[back] & 0xC0 != 0x80 {
            end = back;
        }
        let piece = (at as u64, &bytes[at..end]);
        at = end;
        Some(piece)
    })
}
