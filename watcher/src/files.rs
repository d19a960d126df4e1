//! Watched files: walking the watches, telling appends from rewrites, renames and
//! deletions, and appending what is new to the streams (commit 1).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use memagent_store::{FileRecord, Store};
use sha2::{Digest, Sha256};
use tokio::sync::mpsc::UnboundedSender;

use crate::chat;
use crate::config::{Watch, WatchFormat};

/// New content in a stream's log, for the scheduler.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub stream: String,
    /// The log's length after the append.
    pub log_len: u64,
    pub at: Instant,
}

/// Bytes looked at for a NUL that marks a binary file.
const BINARY_PROBE: usize = 8192;

/// What was seen of a path the last time, to skip files that did not change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    dev: u64,
    ino: u64,
    len: u64,
    mtime_ns: i128,
}

impl Seen {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// The files of every watch and how far each was read.
pub(crate) struct Tracker {
    store: Arc<Store>,
    pub watches: Vec<Watch>,
    files: HashMap<String, FileRecord>,
    seen: HashMap<PathBuf, Seen>,
    /// The last problem logged per path, so that rescans do not repeat it.
    problems: HashMap<PathBuf, String>,
    arrivals: UnboundedSender<Arrival>,
}

impl Tracker {
    pub fn new(
        store: Arc<Store>,
        watches: Vec<Watch>,
        arrivals: UnboundedSender<Arrival>,
    ) -> memagent_store::Result<Self> {
        let files = store
            .files()?
            .into_iter()
            .map(|f| (f.path.clone(), f))
            .collect();
        Ok(Self {
            store,
            watches,
            files,
            seen: HashMap::new(),
            problems: HashMap::new(),
            arrivals,
        })
    }

    pub fn tracked(&self) -> usize {
        self.files.len()
    }

    /// Reads everything that changed under every watch (start-up and periodic rescans).
    pub fn scan(&mut self) {
        for i in 0..self.watches.len() {
            let root = self.watches[i].config.path.clone();
            match std::fs::metadata(&root) {
                Ok(meta) if meta.is_dir() => self.walk(&root, i),
                Ok(_) => self.sync_path(&root),
                Err(e) => self.problem(&root, format!("cannot watch it: {e}")),
            }
        }
    }

    fn walk(&mut self, dir: &Path, watch: usize) {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => return self.problem(dir, format!("cannot list the folder: {e}")),
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() {
                if self.watches[watch].config.recursive
                    && !entry.file_name().to_string_lossy().starts_with('.')
                {
                    self.walk(&path, watch);
                }
            } else if kind.is_symlink() {
                match std::fs::metadata(&path) {
                    Err(e) => self.problem(&path, format!("cannot read it: {e}")),
                    Ok(meta) if meta.is_dir() => {
                        tracing::debug!("{}: a link to a folder; not followed", path.display())
                    }
                    Ok(_) => self.sync_path(&path),
                }
            } else {
                self.sync_path(&path);
            }
        }
    }

    /// Handles a change at `path`: a file is read if a watch takes it; a new folder is
    /// walked.
    pub fn sync_path(&mut self, path: &Path) {
        let Some((index, stream)) = self
            .watches
            .iter()
            .enumerate()
            .find_map(|(i, w)| w.stream_for(path).map(|s| (i, s)))
        else {
            return;
        };
        if std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
            if self.watches[index].config.recursive {
                self.walk(path, index);
            }
            return;
        }
        let format = self.watches[index].config.format.resolve(path);
        match self.sync_file(path, &stream, format) {
            Ok(()) => {
                self.problems.remove(path);
            }
            Err(reason) => self.problem(path, reason),
        }
    }

    /// Logs a problem with a path once (until it changes).
    fn problem(&mut self, path: &Path, reason: String) {
        if self.problems.get(path) != Some(&reason) {
            tracing::warn!("{}: {reason}", path.display());
            self.problems.insert(path.to_path_buf(), reason);
        }
    }

    fn sync_file(&mut self, path: &Path, stream: &str, format: WatchFormat) -> Result<(), String> {
        let Some(key) = path.to_str().map(str::to_string) else {
            return Err("the path is not UTF-8; skipped".into());
        };
        let Some((mut seen, file)) = self.open_changed(path, &key)? else {
            return Ok(());
        };
        let unreadable = |e: std::io::Error| format!("cannot read it: {e}");
        let (known, mut renamed_from) = self.known_record(&key, &seen, &file);
        let (resume, mut hasher, newlines) =
            Resume::of(&key, known.as_ref(), &file).map_err(unreadable)?;
        let stream = known
            .as_ref()
            .map_or(stream.to_string(), |r| r.stream.clone());
        // Where the new text starts in the file, for the passages' provenance.
        let mut first_line = match format {
            WatchFormat::ChatJsonl => resume.lines + 1,
            _ => newlines + 1,
        };
        let mut current = known;
        let (mut start, mut lines) = (resume.start, resume.lines);
        let mut want = READ_PIECE;
        loop {
            let bytes = read_piece(&file, start, want).map_err(unreadable)?;
            let at_end = bytes.len() < want;
            let new = decode_new(&key, format, &bytes, start, lines);
            if new.consumed == 0 && !at_end {
                // One line longer than a piece: read on until it ends.
                want = want.saturating_mul(2);
                continue;
            }
            let (text, turns) = match resume.revised && start == 0 {
                true => revision_noted(path, &key, resume.revisions, new.text, new.turns),
                false => (new.text, new.turns),
            };
            let consumed = &bytes[..new.consumed];
            hasher.update(consumed);
            let record = FileRecord {
                path: key.clone(),
                stream: stream.clone(),
                dev: seen.dev,
                ino: seen.ino,
                offset: (start + new.consumed) as u64,
                sha256: hasher.clone().finalize().into(),
                lines: lines + new.lines,
                revisions: resume.revisions,
            };
            if current.as_ref() != Some(&record) {
                let segment = memagent_store::SegmentRecord {
                    source: key.clone(),
                    first_line,
                    turns,
                };
                self.store_read(&key, &record, &text, renamed_from.take(), &segment)?;
                if text.len() as u64 >= crate::BIG_WORK {
                    crate::give_back_freed_memory();
                }
                current = Some(record);
            }
            first_line += match format {
                WatchFormat::ChatJsonl => new.lines,
                _ => newline_count(consumed),
            };
            lines += new.lines;
            // What was read may be newer than the metadata: remember how far it went.
            seen.len = (start + bytes.len()) as u64;
            start += new.consumed;
            if at_end || new.consumed == 0 {
                break;
            }
            want = READ_PIECE;
        }
        self.seen.insert(path.to_path_buf(), seen);
        Ok(())
    }

    /// The open file when it changed since it was last seen (`None`: unchanged, gone,
    /// or not a regular file); an error says why a file that is there cannot be read.
    fn open_changed(
        &mut self,
        path: &Path,
        key: &str,
    ) -> Result<Option<(Seen, std::fs::File)>, String> {
        let meta = match std::fs::metadata(path) {
            Ok(meta) => meta,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if self.files.contains_key(key) {
                    if self.seen.remove(path).is_some() {
                        tracing::info!("{key}: removed; what was read from it stays in memory");
                    }
                } else {
                    tracing::info!("{key}: gone before it could be read");
                }
                return Ok(None);
            }
            Err(e) => return Err(format!("cannot read it: {e}")),
        };
        if !meta.is_file() {
            return Ok(None);
        }
        // Honoured even where the daemon could read it anyway (as root).
        if meta.mode() & 0o444 == 0 {
            return Err(format!(
                "no read permission (mode {:03o}); skipped until it has one",
                meta.mode() & 0o777
            ));
        }
        let seen = Seen::of(&meta);
        if self.seen.get(path) == Some(&seen) {
            return Ok(None);
        }
        let file = match std::fs::File::open(path) {
            Ok(file) => file,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::info!("{key}: removed while being read");
                return Ok(None);
            }
            Err(e) => return Err(format!("cannot read it: {e}")),
        };
        let head =
            read_piece(&file, 0, BINARY_PROBE).map_err(|e| format!("cannot read it: {e}"))?;
        if let Some(at) = head.iter().position(|&b| b == 0) {
            self.seen.insert(path.to_path_buf(), seen);
            return Err(format!(
                "a binary file (a NUL byte at offset {at}); skipped"
            ));
        }
        Ok(Some((seen, file)))
    }

    /// The file's record: by path, else a known file with the same identity that is no
    /// longer where it was and still begins with what was read from it (a rename, whose
    /// old path comes second; a file deleted, then another created on its freed inode,
    /// is a new file).
    fn known_record(
        &self,
        key: &str,
        seen: &Seen,
        file: &std::fs::File,
    ) -> (Option<FileRecord>, Option<String>) {
        if let Some(record) = self.files.get(key) {
            return (Some(record.clone()), None);
        }
        let renamed = self
            .files
            .values()
            .find(|r| {
                r.dev == seen.dev
                    && r.ino == seen.ino
                    && std::fs::metadata(&r.path)
                        .map_or(true, |m| m.dev() != r.dev || m.ino() != r.ino)
                    && prefix_state(file, r.offset).is_ok_and(|state| {
                        state.is_some_and(|(hasher, _)| hasher.finalize().as_slice() == r.sha256)
                    })
            })
            .cloned();
        let from = renamed.as_ref().map(|record| {
            tracing::info!(
                "{key}: renamed from {}; read on from where it was",
                record.path
            );
            record.path.clone()
        });
        (renamed, from)
    }

    /// Appends what was read to the file's stream with its record (commit 1), tells the
    /// scheduler, and remembers the record under its path.
    fn store_read(
        &mut self,
        key: &str,
        record: &FileRecord,
        text: &str,
        renamed_from: Option<String>,
        segment: &memagent_store::SegmentRecord,
    ) -> Result<(), String> {
        let appended = self
            .store
            .append_file(text.as_bytes(), record, renamed_from.as_deref(), segment)
            .map_err(|e| format!("cannot store what was read: {e}"))?;
        if appended.bytes > 0 {
            tracing::debug!(
                "{key}: {} new bytes into `{}` (log {} bytes)",
                appended.bytes,
                record.stream,
                appended.log_len
            );
            let _ = self.arrivals.send(Arrival {
                stream: record.stream.clone(),
                log_len: appended.log_len,
                at: Instant::now(),
            });
        }
        if let Some(old) = &renamed_from {
            self.files.remove(old);
        }
        self.files.insert(key.to_string(), record.clone());
        Ok(())
    }
}

/// Where reading a file resumes: after what was read before when the file still begins
/// with it, else from the start as a new revision.
struct Resume {
    start: usize,
    /// Lines read before `start`.
    lines: u64,
    revisions: u32,
    /// The file was truncated or rewritten since it was read.
    revised: bool,
}

impl Resume {
    /// Where to resume in `file`, with the hash state and the newlines of the bytes
    /// before that point (read in bounded pieces: a big file is never held whole).
    fn of(
        key: &str,
        known: Option<&FileRecord>,
        file: &std::fs::File,
    ) -> std::io::Result<(Self, Sha256, u64)> {
        let Some(r) = known else {
            return Ok((Self::whole(0, false), Sha256::new(), 0));
        };
        let prefix = prefix_state(file, r.offset)?;
        let truncated = prefix.is_none();
        if let Some((hasher, newlines)) = prefix {
            if hasher.clone().finalize().as_slice() == r.sha256 {
                let resume = Self {
                    start: r.offset as usize,
                    lines: r.lines,
                    revisions: r.revisions,
                    revised: false,
                };
                return Ok((resume, hasher, newlines));
            }
        }
        let how = if truncated { "truncated" } else { "rewritten" };
        tracing::warn!(
            "{key}: {how} since it was read; reading it whole as revision {}",
            r.revisions + 1
        );
        Ok((Self::whole(r.revisions + 1, true), Sha256::new(), 0))
    }

    /// Reading from the start.
    fn whole(revisions: u32, revised: bool) -> Self {
        Self {
            start: 0,
            lines: 0,
            revisions,
            revised,
        }
    }
}

/// Bytes of a file read and appended at a time: a big file goes in as several appends,
/// each recording how far the file was read, so memory stays bounded by this and not
/// by the file's size.
const READ_PIECE: usize = 8 << 20;

/// Up to `len` bytes of `file` from `at` (fewer only at the end of the file).
fn read_piece(file: &std::fs::File, at: usize, len: usize) -> std::io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut reader = file;
    reader.seek(SeekFrom::Start(at as u64))?;
    let mut bytes = Vec::new();
    reader.take(len as u64).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The SHA-256 state and the newline count of the first `len` bytes of `file`, read in
/// pieces; `None` when the file is shorter.
fn prefix_state(file: &std::fs::File, len: u64) -> std::io::Result<Option<(Sha256, u64)>> {
    let (mut hasher, mut newlines, mut at) = (Sha256::new(), 0, 0u64);
    while at < len {
        let want = (len - at).min(READ_PIECE as u64) as usize;
        let bytes = read_piece(file, at as usize, want)?;
        hasher.update(&bytes);
        newlines += newline_count(&bytes);
        if bytes.len() < want {
            return Ok(None);
        }
        at += want as u64;
    }
    Ok(Some((hasher, newlines)))
}

fn newline_count(bytes: &[u8]) -> u64 {
    bytes.iter().filter(|&&b| b == b'\n').count() as u64
}

/// The new bytes of a file as text to append.
struct NewText {
    text: String,
    /// Bytes of the file consumed (a partial last line or character waits).
    consumed: usize,
    /// Lines consumed (chat logs).
    lines: u64,
    /// Each chat turn's offset in `text` with its line number in the file.
    turns: Vec<(u64, u64)>,
}

/// `new` (the file's bytes from byte `start`, after `lines` lines) decoded: a chat log's
/// complete lines as turns, other text up to its last complete character (invalid UTF-8
/// replaced, with a warning naming the byte).
fn decode_new(key: &str, format: WatchFormat, new: &[u8], start: usize, lines: u64) -> NewText {
    if format == WatchFormat::ChatJsonl {
        let parsed = chat::parse(new, lines);
        for (line, reason) in &parsed.errors {
            tracing::warn!("{key}:{line}: {reason}; line skipped");
        }
        return NewText {
            text: parsed.text,
            consumed: parsed.consumed,
            lines: parsed.lines,
            turns: parsed.turns,
        };
    }
    let take = complete_utf8_len(new);
    let text = match std::str::from_utf8(&new[..take]) {
        Ok(text) => text.to_string(),
        Err(e) => {
            tracing::warn!(
                "{key}: invalid UTF-8 at byte {}; decoded with U+FFFD in its place",
                start + e.valid_up_to()
            );
            String::from_utf8_lossy(&new[..take]).into_owned()
        }
    };
    NewText {
        text,
        consumed: take,
        lines: 0,
        turns: Vec::new(),
    }
}

/// `text` of a rewritten file behind a note that says so, with its turns' offsets moved
/// past the note.
fn revision_noted(
    path: &Path,
    key: &str,
    revisions: u32,
    text: String,
    mut turns: Vec<(u64, u64)>,
) -> (String, Vec<(u64, u64)>) {
    let name = path
        .file_name()
        .map_or(key.to_string(), |n| n.to_string_lossy().into());
    let note = format!("\n[{name} was rewritten; revision {revisions} follows]\n");
    for turn in &mut turns {
        turn.0 += note.len() as u64;
    }
    (format!("{note}{text}"), turns)
}

/// Length of `bytes` without a trailing UTF-8 sequence that is not complete yet (a
/// writer may be in the middle of a character).
fn complete_utf8_len(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(3) {
        let b = bytes[len - back];
        if b & 0xC0 == 0x80 {
            continue; // a continuation byte: look further back for the leading one
        }
        let need = match b {
            0xC0..=0xDF => 2,
            0xE0..=0xEF => 3,
            0xF0..=0xF7 => 4,
            _ => 1,
        };
        return if need > back { len - back } else { len };
    }
    len
}

#[cfg(test)]
mod tests {
    use super::complete_utf8_len;

    #[test]
    fn an_incomplete_last_character_waits() {
        let text = "café €".as_bytes();
        assert_eq!(complete_utf8_len(text), text.len());
        assert_eq!(complete_utf8_len(&text[..text.len() - 1]), text.len() - 3);
        assert_eq!(complete_utf8_len(&text[..text.len() - 2]), text.len() - 3);
        assert_eq!(complete_utf8_len(b"abc"), 3);
        assert_eq!(complete_utf8_len(b""), 0);
        // Invalid bytes are not held back: they are decoded lossily.
        assert_eq!(complete_utf8_len(b"a\xff"), 2);
    }
}
