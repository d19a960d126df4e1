//! The embedded database, the default: sled in the data directory's `db/`, each content
//! log in a file of its own beside it (`logs/`, see [`crate::logs`]). Records are
//! postcard behind a format byte; keys are big-endian.

use std::fs::File;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use sled::transaction::{ConflictableTransactionError, TransactionError};
use sled::{Transactional, Tree};

use crate::backend::Backend;
use crate::codec::{self, decode, encode, key1, key2, key3, key_parts, show_key};
use crate::records::{
    ChunkRecord, Cursor, FileRecord, Lease, MemoryVersion, QuestionRecord, SegmentRecord,
    SourceRecord, StandingAnswer, StreamRecord, GENERAL,
};
use crate::{logs, now, space, Appended, Error, ExportRecord, Result, Space};

/// The embedded database: sled in `db/`, content logs in `logs/`. One process at a time:
/// the lock is held until drop.
pub(crate) struct SledStore {
    db: sled::Db,
    path: PathBuf,
    _lock: File,
    streams: Tree,
    stream_names: Tree,
    log: Tree,
    sources: Tree,
    chunks: Tree,
    versions: Tree,
    cursors: Tree,
    questions: Tree,
    files: Tree,
    answers: Tree,
    segments: Tree,
    logs: logs::Logs,
    space: space::Guard,
}

impl SledStore {
    /// Opens (or creates) the database in `dir`, upgrading its schema if it is older.
    pub(crate) fn open(dir: &Path) -> Result<Self> {
        let io = |source| Error::Io {
            path: dir.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let lock = crate::lock_dir(dir)?;
        let db = sled::Config::new().path(dir.join("db")).open()?;
        memagent_migrations::migrate(&db)?;
        let store = Self {
            streams: db.open_tree("streams")?,
            stream_names: db.open_tree("stream_names")?,
            log: db.open_tree("log")?,
            sources: db.open_tree("sources")?,
            chunks: db.open_tree("chunks")?,
            versions: db.open_tree("versions")?,
            cursors: db.open_tree("cursors")?,
            questions: db.open_tree("questions")?,
            files: db.open_tree("files")?,
            answers: db.open_tree("answers")?,
            segments: db.open_tree("segments")?,
            path: dir.to_path_buf(),
            logs: logs::Logs::open(&dir.join("logs"))?,
            space: space::Guard::new(dir),
            _lock: lock,
            db,
        };
        store.settle_logs()?;
        Ok(store)
    }

    /// Brings the content logs to their files: text stored in the database by an older
    /// memctl is moved out (record by record, then removed from the database), each file
    /// is cut back to its stream's committed length, and files of no stream are deleted.
    fn settle_logs(&self) -> Result<()> {
        // A stream record that does not decode is left for the reads that name it.
        let mut streams = Vec::new();
        for item in self.streams.iter() {
            let (key, value) = item?;
            if let Ok(stream) = decode::<StreamRecord>("streams", &key, &value) {
                streams.push(stream);
            }
        }
        for stream in &streams {
            let prefix = key1(stream.id);
            if self.log.scan_prefix(prefix).next().is_none() {
                continue;
            }
            for item in self.log.scan_prefix(prefix) {
                let (key, value) = item?;
                let (at, body) = log_record(&key, &value)?;
                let end = (at + body.len() as u64).min(stream.log_len);
                if at < end {
                    self.logs
                        .write(stream.id, at, &body[..(end - at) as usize])?;
                }
            }
            for key in self.log.scan_prefix(prefix).keys() {
                self.log.remove(key?)?;
            }
            self.db.flush()?;
        }
        // Files of removed streams (a removal stopped before its file went); none is
        // deleted while a stream's id cannot be read.
        let ids: Result<std::collections::HashSet<u64>> = self
            .stream_names
            .iter()
            .keys()
            .map(|key| Ok(key_parts::<1>("stream_names", &key?)?[0]))
            .collect();
        if let Ok(ids) = ids {
            for id in self.logs.ids()? {
                if !ids.contains(&id) {
                    self.logs.remove(id)?;
                }
            }
        }
        for stream in &streams {
            self.logs.cut(stream.id, stream.log_len)?;
        }
        Ok(())
    }
}

impl Backend for SledStore {
    fn shared(&self) -> bool {
        false
    }

    fn location(&self) -> String {
        self.path.display().to_string()
    }

    /// Bytes the database takes on disk.
    fn size_on_disk(&self) -> Result<u64> {
        Ok(self.db.size_on_disk()? + self.logs.size())
    }

    /// Free space on the data directory's filesystem against the reserve writes keep.
    fn space(&self) -> Result<Space> {
        self.space.measure()
    }

    /// Bytes of free space every write leaves on the data directory's filesystem
    /// ([`DEFAULT_RESERVE`] unless set): a write that would leave less is refused with
    /// [`Error::NoSpace`] before anything is written, so the database never meets a
    /// full disk in the middle of a commit. Reads and [`Store::remove_stream`] are never
    /// refused.
    fn set_reserve(&self, bytes: u64) {
        self.space.set_reserve(bytes);
    }

    /// Ok when a write of about `bytes` would leave the reserve free, else
    /// [`Error::NoSpace`]: for work that ends in a write (a memory step) to be refused
    /// before it starts.
    fn make_room(&self, bytes: u64) -> Result<()> {
        self.space.make_room(bytes)
    }

    fn flush(&self) -> Result<()> {
        self.db.flush()?;
        Ok(())
    }

    fn stream(&self, name: &str) -> Result<Option<StreamRecord>> {
        self.streams
            .get(name.as_bytes())?
            .map(|v| decode("streams", name.as_bytes(), &v))
            .transpose()
    }

    fn streams(&self) -> Result<Vec<StreamRecord>> {
        decode_all("streams", self.streams.iter())
    }

    /// The stream, created empty if it does not exist.
    fn create_stream(&self, name: &str) -> Result<StreamRecord> {
        if let Some(s) = self.stream(name)? {
            return Ok(s);
        }
        self.space.make_room(name.len() as u64)?;
        let record = StreamRecord {
            id: self.db.generate_id()? + 1,
            name: name.to_string(),
            created: now(),
            log_len: 0,
        };
        self.streams.insert(name.as_bytes(), encode(&record))?;
        self.stream_names.insert(key1(record.id), name.as_bytes())?;
        self.db.flush()?;
        Ok(record)
    }

    /// Deletes a stream with its log, chunks, memories and cursors.
    fn remove_stream(&self, name: &str) -> Result<()> {
        let _turn = self.logs.appending();
        let stream = self
            .stream(name)?
            .ok_or_else(|| Error::NoStream(name.to_string()))?;
        let prefix = key1(stream.id);
        for tree in [
            &self.log,
            &self.sources,
            &self.chunks,
            &self.versions,
            &self.cursors,
            &self.questions,
            &self.answers,
            &self.segments,
        ] {
            for key in tree.scan_prefix(prefix).keys() {
                tree.remove(key?)?;
            }
        }
        for file in self.files()? {
            if file.stream == name {
                self.files.remove(file.path.as_bytes())?;
            }
        }
        self.stream_names.remove(prefix)?;
        self.streams.remove(name.as_bytes())?;
        self.db.flush()?;
        self.logs.remove(stream.id)
    }

    /// [`Store::append_with`] for text rendered from a source whose lines are not the
    /// text's (a chat log): `turns` gives, for each turn, its offset in the new text and
    /// its line in the source, recorded as the text's provenance.
    fn append_turns(
        &self,
        stream: &str,
        bytes: &[u8],
        source: Option<&str>,
        force: bool,
        turns: Vec<(u64, u64)>,
    ) -> Result<Appended> {
        let _turn = self.logs.appending();
        let record = self.create_stream(stream)?;
        let source_key = source.map(|name| source_key(record.id, name));
        let previous: Option<SourceRecord> = match &source_key {
            Some(key) => self
                .sources
                .get(key)?
                .map(|v| decode("sources", key, &v))
                .transpose()?,
            None => None,
        };
        let plan = crate::plan_append(bytes, source, previous.as_ref(), force, turns);
        if plan.unchanged {
            return Ok(Appended {
                bytes: 0,
                revision: plan.revision,
                log_len: record.log_len,
            });
        }
        let (new, revision, source_record) = (plan.new, plan.revision, plan.source);
        let mut updated = record.clone();
        updated.log_len += new.len() as u64;
        let segment = plan.segment.as_ref().map(encode);
        self.space
            .make_room(new.len() as u64 + segment.as_ref().map_or(0, |s| s.len() as u64))?;
        self.logs.write(record.id, record.log_len, new)?;
        let outcome: std::result::Result<(), TransactionError<Error>> =
            (&self.streams, &self.sources, &self.segments).transaction(
                |(streams, sources, segments)| {
                    if let Some(segment) = &segment {
                        segments.insert(&key2(record.id, record.log_len), segment.as_slice())?;
                    }
                    streams.insert(stream.as_bytes(), encode(&updated))?;
                    if let (Some(key), Some(src)) = (&source_key, &source_record) {
                        sources.insert(key.as_slice(), encode(src))?;
                    }
                    Ok::<(), ConflictableTransactionError<Error>>(())
                },
            );
        transaction_result(outcome)?;
        self.db.flush()?;
        Ok(Appended {
            bytes: new.len() as u64,
            revision,
            log_len: updated.log_len,
        })
    }

    /// Commit 1 for a watched file: appends `text` to the log of `file.stream` and
    /// records how far the file was read, in one transaction, then flushes. A rename
    /// (`renamed_from`) moves the file's record to its new path in the same transaction;
    /// `segment` says where in the file the text starts.
    fn append_file(
        &self,
        text: &[u8],
        file: &FileRecord,
        renamed_from: Option<&str>,
        segment: &SegmentRecord,
    ) -> Result<Appended> {
        let _turn = self.logs.appending();
        let record = self.create_stream(&file.stream)?;
        let mut updated = record.clone();
        updated.log_len += text.len() as u64;
        let segment = encode(segment);
        self.space
            .make_room(text.len() as u64 + segment.len() as u64)?;
        self.logs.write(record.id, record.log_len, text)?;
        let outcome: std::result::Result<(), TransactionError<Error>> =
            (&self.streams, &self.files, &self.segments).transaction(
                |(streams, files, segments)| {
                    if !text.is_empty() {
                        segments.insert(&key2(record.id, record.log_len), segment.as_slice())?;
                        streams.insert(file.stream.as_bytes(), encode(&updated))?;
                    }
                    if let Some(old) = renamed_from.filter(|old| *old != file.path) {
                        files.remove(old.as_bytes())?;
                    }
                    files.insert(file.path.as_bytes(), encode(file))?;
                    Ok::<(), ConflictableTransactionError<Error>>(())
                },
            );
        transaction_result(outcome)?;
        self.db.flush()?;
        Ok(Appended {
            bytes: text.len() as u64,
            revision: false,
            log_len: updated.log_len,
        })
    }

    /// The provenance record of the log piece holding byte `offset` of a stream, with
    /// the offset where that piece starts; `None` for text appended without a source.
    fn segment_at(
        &self,
        stream: &StreamRecord,
        offset: u64,
    ) -> Result<Option<(u64, SegmentRecord)>> {
        let Some(item) = self
            .segments
            .range(key2(stream.id, 0)..=key2(stream.id, offset))
            .next_back()
        else {
            return Ok(None);
        };
        let (key, value) = item?;
        let [_, at] = key_parts("segments", &key)?;
        Ok(Some((at, decode("segments", &key, &value)?)))
    }

    /// Every watched file the database knows, by path.
    fn files(&self) -> Result<Vec<FileRecord>> {
        decode_all("files", self.files.iter())
    }

    /// Bytes `[from, to)` of a stream's content log (up to its committed length).
    fn read_log(&self, stream: &StreamRecord, from: u64, to: u64) -> Result<Vec<u8>> {
        self.logs.read(stream.id, from, to.min(stream.log_len))
    }

    fn cursor(&self, stream: &StreamRecord, chain: u64) -> Result<Cursor> {
        let key = key2(stream.id, chain);
        Ok(self
            .cursors
            .get(key)?
            .map(|v| decode("cursors", &key, &v))
            .transpose()?
            .unwrap_or_default())
    }

    /// Commit 2: memory version `version.version`, the chunk it consumed and the advanced
    /// cursor, in one transaction, then flushed.
    fn commit_step(
        &self,
        stream: &StreamRecord,
        chain: u64,
        chunk: &ChunkRecord,
        version: &MemoryVersion,
        cursor: &Cursor,
        // One process holds the database (its lock file): its leases never end.
        _lease: Option<&Lease>,
    ) -> Result<()> {
        self.space
            .make_room(version.text.len() as u64 + std::mem::size_of_val(chunk) as u64)?;
        let outcome: std::result::Result<(), TransactionError<Error>> =
            (&self.chunks, &self.versions, &self.cursors).transaction(
                |(chunks, versions, cursors)| {
                    // Chunks are shared by all chains of a stream: the general chain
                    // defines them, question chains replay them.
                    if chain == GENERAL {
                        chunks.insert(&key2(stream.id, chunk.index), encode(chunk))?;
                    }
                    versions.insert(&key3(stream.id, chain, version.version), encode(version))?;
                    cursors.insert(&key2(stream.id, chain), encode(cursor))?;
                    Ok::<(), ConflictableTransactionError<Error>>(())
                },
            );
        transaction_result(outcome)?;
        self.db.flush()?;
        Ok(())
    }

    /// Adds a version that consumed no chunk (an edit or a rollback); the cursor keeps its
    /// place and records the new latest version.
    fn add_version(
        &self,
        stream: &StreamRecord,
        chain: u64,
        mut version: MemoryVersion,
    ) -> Result<MemoryVersion> {
        self.space.make_room(version.text.len() as u64)?;
        let mut cursor = self.cursor(stream, chain)?;
        version.version = cursor.version + 1;
        version.parent = (cursor.version > 0).then_some(cursor.version);
        cursor.version = version.version;
        let outcome: std::result::Result<(), TransactionError<Error>> =
            (&self.versions, &self.cursors).transaction(|(versions, cursors)| {
                versions.insert(&key3(stream.id, chain, version.version), encode(&version))?;
                cursors.insert(&key2(stream.id, chain), encode(&cursor))?;
                Ok::<(), ConflictableTransactionError<Error>>(())
            });
        transaction_result(outcome)?;
        self.db.flush()?;
        Ok(version)
    }

    fn version(
        &self,
        stream: &StreamRecord,
        chain: u64,
        version: u64,
    ) -> Result<Option<MemoryVersion>> {
        let key = key3(stream.id, chain, version);
        self.versions
            .get(key)?
            .map(|v| decode("versions", &key, &v))
            .transpose()
    }

    /// Chunk `index` of a stream.
    fn chunk(&self, stream: &StreamRecord, index: u64) -> Result<Option<ChunkRecord>> {
        let key = key2(stream.id, index);
        self.chunks
            .get(key)?
            .map(|v| decode("chunks", &key, &v))
            .transpose()
    }

    /// Versions of a chain from `first` on, oldest first, read lazily.
    fn versions(&self, stream: &StreamRecord, chain: u64) -> Result<Vec<MemoryVersion>> {
        decode_all(
            "versions",
            self.versions.scan_prefix(key2(stream.id, chain)),
        )
    }

    fn versions_from<'a>(
        &'a self,
        stream: &StreamRecord,
        chain: u64,
        first: u64,
    ) -> Result<Box<dyn Iterator<Item = MemoryVersion> + 'a>> {
        let range = self
            .versions
            .range(key3(stream.id, chain, first)..key3(stream.id, chain + 1, 0));
        Ok(Box::new(range.filter_map(|item| {
            let (k, v) = item.ok()?;
            decode("versions", &k, &v).ok()
        })))
    }

    /// Every chunk of a stream, in order.
    fn chunks(&self, stream: &StreamRecord) -> Result<Vec<ChunkRecord>> {
        decode_all("chunks", self.chunks.scan_prefix(key1(stream.id)))
    }

    /// The memory chain of `question` on a stream, registered on first use.
    fn question_chain(&self, stream: &StreamRecord, question: &str) -> Result<QuestionRecord> {
        let key = source_key(stream.id, question);
        if let Some(v) = self.questions.get(&key)? {
            return decode("questions", &key, &v);
        }
        self.space.make_room(question.len() as u64)?;
        let chain = self.questions.scan_prefix(key1(stream.id)).count() as u64 + 1;
        let record = QuestionRecord {
            chain,
            question: question.to_string(),
        };
        self.questions.insert(key, encode(&record))?;
        self.db.flush()?;
        Ok(record)
    }

    /// Stores the answer to a standing question from one memory version (again for the
    /// same question and version replaces it).
    fn add_answer(&self, stream: &StreamRecord, answer: &StandingAnswer) -> Result<()> {
        let chain = self.question_chain(stream, &answer.question)?.chain;
        let key = key3(stream.id, answer.version, chain);
        self.space.make_room(answer.answer.len() as u64)?;
        self.answers.insert(key, encode(answer))?;
        self.db.flush()?;
        Ok(())
    }

    /// A stream's standing answers, by memory version, then by question.
    fn answers(&self, stream: &StreamRecord) -> Result<Vec<StandingAnswer>> {
        decode_all("answers", self.answers.scan_prefix(key1(stream.id)))
    }

    /// The questions of a stream with their chains.
    fn questions(&self, stream: &StreamRecord) -> Result<Vec<QuestionRecord>> {
        decode_all("questions", self.questions.scan_prefix(key1(stream.id)))
    }

    fn sources(&self, stream: &StreamRecord) -> Result<Vec<SourceRecord>> {
        decode_all("sources", self.sources.scan_prefix(key1(stream.id)))
    }

    fn all_versions(&self, stream: &StreamRecord) -> Result<Vec<(u64, MemoryVersion)>> {
        let mut out = Vec::new();
        for item in self.versions.scan_prefix(key1(stream.id)) {
            let (k, v) = item?;
            let [_, chain, _] = key_parts("versions", &k)?;
            out.push((chain, decode("versions", &k, &v)?));
        }
        Ok(out)
    }

    fn cursors(&self, stream: &StreamRecord) -> Result<Vec<(u64, Cursor)>> {
        let mut out = Vec::new();
        for item in self.cursors.scan_prefix(key1(stream.id)) {
            let (k, v) = item?;
            out.push((
                key_parts::<2>("cursors", &k)?[1],
                decode("cursors", &k, &v)?,
            ));
        }
        Ok(out)
    }

    fn segments(&self, stream: &StreamRecord) -> Result<Vec<(u64, SegmentRecord)>> {
        let mut out = Vec::new();
        for item in self.segments.scan_prefix(key1(stream.id)) {
            let (k, v) = item?;
            out.push((
                key_parts::<2>("segments", &k)?[1],
                decode("segments", &k, &v)?,
            ));
        }
        Ok(out)
    }

    fn restore(
        &self,
        stream: &StreamRecord,
        created: u64,
        records: &[ExportRecord],
    ) -> Result<StreamRecord> {
        let _turn = self.logs.appending();
        let mut log_len = 0u64;
        for record in records {
            match record {
                ExportRecord::Stream { .. } => {}
                ExportRecord::Log { offset, text } => {
                    self.logs.write(stream.id, *offset, text.as_bytes())?;
                    log_len = offset + text.len() as u64;
                }
                ExportRecord::Source(source) => {
                    self.sources
                        .insert(source_key(stream.id, &source.name), encode(source))?;
                }
                ExportRecord::Chunk(chunk) => {
                    self.chunks
                        .insert(key2(stream.id, chunk.index), encode(chunk))?;
                }
                ExportRecord::Version { chain, version } => {
                    self.versions
                        .insert(key3(stream.id, *chain, version.version), encode(version))?;
                }
                ExportRecord::Cursor { chain, cursor } => {
                    self.cursors
                        .insert(key2(stream.id, *chain), encode(cursor))?;
                }
                ExportRecord::Segment { offset, segment } => {
                    self.segments
                        .insert(key2(stream.id, *offset), encode(segment))?;
                }
                ExportRecord::Question(question) => {
                    self.questions
                        .insert(source_key(stream.id, &question.question), encode(question))?;
                }
                ExportRecord::Answer(answer) => {
                    let chain = crate::transfer::chain_of(records, &answer.question)?;
                    self.answers
                        .insert(key3(stream.id, answer.version, chain), encode(answer))?;
                }
            }
        }
        let record = StreamRecord {
            id: stream.id,
            name: stream.name.clone(),
            created,
            log_len,
        };
        self.streams
            .insert(stream.name.as_bytes(), encode(&record))?;
        self.flush()?;
        Ok(record)
    }

    fn take_leases(
        &self,
        owner: &str,
        max: usize,
        _ttl_ms: u64,
        _fresh_bytes: u64,
    ) -> Result<Vec<Lease>> {
        let mut out = Vec::new();
        for stream in self.streams()? {
            if out.len() == max {
                break;
            }
            if self.cursor(&stream, GENERAL)?.offset < stream.log_len {
                out.push(Lease {
                    stream: stream.id,
                    owner: owner.to_string(),
                    epoch: 0,
                    expires_ms: u64::MAX,
                });
            }
        }
        Ok(out)
    }

    fn renew_leases(&self, leases: &[Lease], _ttl_ms: u64) -> Result<Vec<Lease>> {
        Ok(leases.to_vec())
    }

    fn release_lease(&self, _lease: &Lease) -> Result<()> {
        Ok(())
    }

    fn leases(&self) -> Result<(Vec<Lease>, u64)> {
        Ok((Vec::new(), crate::now() * 1000))
    }

    fn raw_insert(&self, tree: &str, key: &[u8], value: &[u8]) -> Result<()> {
        self.db.open_tree(tree)?.insert(key, value)?;
        self.db.flush()?;
        Ok(())
    }
}

/// Key of a source record: stream id, then the sha256 of the source's name.
fn source_key(stream: u64, name: &str) -> Vec<u8> {
    let mut key = key1(stream).to_vec();
    key.extend_from_slice(&Sha256::digest(name.as_bytes()));
    key
}

/// Decodes every record an iteration of `tree` yields.
fn decode_all<T: serde::de::DeserializeOwned>(
    tree: &'static str,
    iter: sled::Iter,
) -> Result<Vec<T>> {
    iter.map(|item| {
        let (k, v) = item?;
        decode(tree, &k, &v)
    })
    .collect()
}

fn transaction_result(outcome: std::result::Result<(), TransactionError<Error>>) -> Result<()> {
    match outcome {
        Ok(()) => Ok(()),
        Err(TransactionError::Abort(e)) => Err(e),
        Err(TransactionError::Storage(e)) => Err(e.into()),
    }
}

/// The offset and text of a content log record kept in the database by an older memctl
/// (format byte, then the text).
fn log_record<'v>(key: &[u8], value: &'v [u8]) -> Result<(u64, &'v [u8])> {
    let [_, at] = key_parts("log", key)?;
    match value.split_first() {
        Some((&codec::FORMAT, body)) => Ok((at, body)),
        Some((&v, _)) => Err(Error::UnknownFormat {
            tree: "log",
            key: show_key(key),
            version: v,
        }),
        None => Err(Error::Corrupt {
            tree: "log",
            key: show_key(key),
            reason: "empty value".to_string(),
        }),
    }
}
